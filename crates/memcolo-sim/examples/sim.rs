//! `memcolo sim` without building the agent: the same arguments and output, e.g.
//! `cargo run --release -p memcolo-sim --example sim -- scale` (the scale benchmark
//! of `bench/sim/README.md`).

fn main() -> anyhow::Result<()> {
    let args = memcolo_sim::parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
    memcolo_sim::run(&args)
}
