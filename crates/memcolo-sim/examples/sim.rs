//! `memcolo sim` without building the agent: the same arguments and output, e.g.
//! `cargo run --release -p memcolo-sim --example sim -- scale` (the scale benchmark
//! of `bench/sim/README.md`).

use clap::Parser;

#[derive(Parser)]
#[command(name = "sim")]
struct Cli {
    #[command(flatten)]
    args: memcolo_sim::SimArgs,
}

fn main() -> anyhow::Result<()> {
    memcolo_sim::run(&Cli::parse().args)
}
