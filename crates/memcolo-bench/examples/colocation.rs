//! Stand-alone driver of the benchmarks, for use before or without the `memcolo`
//! binary: `cargo run --release -p memcolo-bench --example colocation -- colocation --quick --modes kernel`.
//! `--memcolo PATH` names the `memcolo` binary used for `memcolo agent`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use memcolo_bench::{agent_cost, colocation};

#[derive(Parser)]
struct Cli {
    /// The `memcolo` binary (for `memcolo agent`).
    #[arg(long, default_value = "target/release/memcolo", global = true)]
    memcolo: PathBuf,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Redis (LC) beside batch jobs (BE), kernel alone vs agent.
    Colocation(Box<colocation::ColocationArgs>),
    /// CPU and RSS of the agent with many registered processes.
    AgentCost(agent_cost::AgentCostArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match &cli.bench {
        Bench::Colocation(a) => colocation::run(a, &cli.memcolo),
        Bench::AgentCost(a) => agent_cost::run(a, &cli.memcolo),
    }
}
