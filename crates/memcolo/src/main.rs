//! `memcolo`: the command-line front end — the agent daemon, its clients (`status`,
//! `top`, `register`, `unregister`, `run`, `alloc-stats`), the benchmarks (`bench`) and
//! the memory server of far-memory tiers (`memserver`).

mod alloc_stats;
mod client;
mod doctor;
mod memserver;
mod run;
mod status;
mod tier;
mod top;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use memcolo_agent::config::AgentConfig;
use memcolo_policy::Class;
use memcolo_proto::{NotifyMode, Reply, Request};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "memcolo",
    version,
    about = "Keeps latency-critical services fast beside batch jobs under memory pressure"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Where clients find the agent.
#[derive(clap::Args, Debug, Clone)]
struct SocketArg {
    /// The agent's Unix socket.
    #[arg(long, env = "MEMCOLO_SOCKET", default_value = memcolo_proto::DEFAULT_SOCKET)]
    socket: PathBuf,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the node agent (as root): M3 monitor, Hermes file-cache advice, Hermit
    /// reclaim, MaxMem tiering, registry, metrics.
    ///
    /// memcolo's five mechanisms, and their defaults:
    ///
    ///   M3 monitor (always on): adapts low/high thresholds below a top of memory,
    ///   notifies elastic and BE processes to give memory back, kills BE processes
    ///   as the last resort ([m3]). The agent's core.
    ///
    ///   Hermes file-cache advice (on; --no-advice, [hermes] enabled): drops BE
    ///   processes' page cache, largest file first, once used memory passes adv_thr.
    ///
    ///   Hermit reclaim (on; --no-reclaim, [reclaim] enabled): worker threads reclaim
    ///   BE memory ahead of demand so that LC processes never reclaim on their own
    ///   allocation path.
    ///
    ///   MaxMem tiering (on; --no-tier, [tier] enabled): serves tier.sock next to the
    ///   agent's socket and keeps each tiered process's fast-memory miss ratio at its
    ///   target over a slow tier. Only processes that hand it their memory (libmemcolo
    ///   with MEMCOLO_TIER=1) are tiered; idle it costs a socket and two sleeping
    ///   threads.
    ///
    ///   Allocator (libmemcolo: Hermes' reservation and pre-faulting for LC processes,
    ///   TCMalloc's adaptive subrelease): runs inside each process started with
    ///   `memcolo run` or LD_PRELOAD=libmemcolo.so; not a switch of the agent's.
    ///
    /// Settings come from the defaults, then the file (/etc/memcolo/agent.toml, or
    /// --config), then these flags. --print-config shows the result; every field is
    /// described in /etc/memcolo/agent.toml.example (dist/agent.toml) and README.md.
    Agent(AgentArgs),
    /// Show the agent's state: memory, thresholds, zone and registered processes.
    Status {
        #[command(flatten)]
        socket: SocketArg,
        /// Print the raw JSON state.
        #[arg(long)]
        json: bool,
    },
    /// A refreshing terminal view of the agent's state (q to quit).
    Top {
        #[command(flatten)]
        socket: SocketArg,
        /// Refresh interval in milliseconds.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
    },
    /// Register a running process with a class.
    Register {
        #[command(flatten)]
        socket: SocketArg,
        /// The process (root may name any pid; others only themselves).
        #[arg(long)]
        pid: i32,
        /// lc, be or elastic.
        #[arg(long)]
        class: Class,
        /// A name for status and metrics (default: the process's comm).
        #[arg(long)]
        name: Option<String>,
        /// Expected reclamation on a high signal, in bytes (M3 §5.1).
        #[arg(long)]
        expected_reclaim_bytes: Option<u64>,
        /// How to notify it: `signal` (SIGRTMIN+1/2/3 for low/high/top) or `none`.
        #[arg(long, default_value = "none", value_parser = parse_notify)]
        notify: NotifyMode,
    },
    /// Remove a registration.
    Unregister {
        #[command(flatten)]
        socket: SocketArg,
        #[arg(long)]
        pid: i32,
    },
    /// Start a command registered with a class, optionally in a child cgroup of the agent's scope.
    Run(run::RunArgs),
    /// Allocator telemetry of a registered process running libmemcolo: huge page coverage,
    /// realized fragmentation, skipped subreleases, reservation hits and misses, releases.
    AllocStats(alloc_stats::AllocStatsArgs),
    /// Benchmarks on real services; raw results under bench/out/<experiment>/<date>-<host>/.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Serve pages of far-memory tiers over TCP (the slow tier of MaxMem tiering): an
    /// LZ4 compressed store with checksummed pages, in memory only.
    Memserver(memserver::MemserverArgs),
    /// MaxMem tiering: status of tiered processes, and their target fast-memory miss
    /// ratio changed live.
    Tier(tier::TierArgs),
    /// Check this node before the agent runs: cgroups, PSI, swap, userfaultfd,
    /// process_madvise, pidfds, THP, cachestat, MADV_COLLAPSE, and whether each
    /// mechanism can run (exit 1 when one that is on cannot).
    Doctor(doctor::DoctorArgs),
    /// Simulate a node (no root, no cgroups): the agent's M3, Hermes and Hermit policy
    /// code over a modelled node at any size; prints a summary table, --out writes
    /// report.json and report.csv (docs/sim.md).
    Sim(memcolo_sim::SimArgs),
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// memcolo's main job: Redis or memcached (LC) under an open-loop load beside batch jobs
    /// and an elastic cache (BE) at 0-150 % memory pressure, under the kernel alone, peers'
    /// controllers (Senpai, Koordinator; re-implemented), each mechanism alone and the whole
    /// of memcolo, repeated, with a report of medians and spreads (Hermes §5.1, §5.3).
    Colocation(Box<memcolo_bench::colocation::ColocationArgs>),
    /// Asynchronous reclaim (Hermit): the colocation bench with the kernel alone, raised
    /// watermarks, one fixed-mark worker and memcolo's adaptive reclaim (default modes
    /// kernel,watermarks,fixed,reclaim; levels 0,100,125,150; results in .../reclaim).
    Reclaim(Box<memcolo_bench::colocation::ColocationArgs>),
    /// The agent's own CPU and RSS with many registered processes.
    AgentCost(memcolo_bench::agent_cost::AgentCostArgs),
}

fn parse_notify(s: &str) -> Result<NotifyMode, String> {
    match s {
        "signal" => Ok(NotifyMode::Signal),
        "none" => Ok(NotifyMode::None),
        "socket" => Err("`socket` needs a process that speaks the protocol (use an SDK)".into()),
        o => Err(format!("unknown notify mode `{o}` (signal or none)")),
    }
}

#[derive(clap::Args, Debug)]
struct AgentArgs {
    /// TOML configuration (default /etc/memcolo/agent.toml if it exists).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The node: `host`, or `cgroup:PATH` (a memory cgroup; absolute or relative to the memory mount).
    #[arg(long)]
    scope: Option<String>,
    /// The Unix socket to serve.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Where the registry survives restarts.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Prometheus address (`GET /metrics`), or `off`.
    #[arg(long)]
    metrics_addr: Option<String>,
    /// JSON-lines event log: a file, `-` for stderr, or `off`.
    #[arg(long)]
    event_log: Option<String>,
    /// Poll interval in milliseconds.
    #[arg(long)]
    poll_ms: Option<u64>,
    /// Hermes adv_thr as a share of the scope's memory (0..1].
    #[arg(long)]
    adv_thr_ratio: Option<f64>,
    /// Seconds above the top of memory before BE processes are killed.
    #[arg(long)]
    kill_after_s: Option<u64>,
    /// Run Hermes file-cache advice (default on; `[hermes] enabled`).
    #[arg(long, overrides_with = "no_advice")]
    advice: bool,
    /// Do not run Hermes file-cache advice.
    #[arg(long, overrides_with = "advice")]
    no_advice: bool,
    /// Run Hermit asynchronous reclaim (default on; `[reclaim] enabled`).
    #[arg(long, overrides_with = "no_reclaim")]
    reclaim: bool,
    /// Do not run Hermit asynchronous reclaim.
    #[arg(long, overrides_with = "reclaim")]
    no_reclaim: bool,
    /// Run MaxMem tiering for the processes that ask for it (default on; `[tier] enabled`).
    #[arg(long, overrides_with = "no_tier")]
    tier: bool,
    /// Do not run MaxMem tiering (no tier.sock).
    #[arg(long, overrides_with = "tier")]
    no_tier: bool,
    /// Kubernetes mode (`[kubernetes] enabled`): the scope is the kubelet's kubepods
    /// cgroup and the node's pods are managed (README, "memcolo on Kubernetes").
    #[arg(long)]
    kubernetes: bool,
    /// This node's name in Kubernetes mode (`[kubernetes] node_name`).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

/// A `--x` / `--no-x` pair (the last given wins): `None` when neither was given.
fn switch(on: bool, off: bool) -> Option<bool> {
    match (on, off) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    }
}

fn agent(a: AgentArgs) -> Result<()> {
    let mut cfg = AgentConfig::load(a.config.as_deref())?;
    if let Some(v) = a.scope {
        cfg.scope = v;
    }
    if a.kubernetes {
        cfg.kubernetes.enabled = true;
    }
    if cfg.kubernetes.enabled {
        if let Some(v) = a.node_name {
            cfg.kubernetes.node_name = Some(v);
        }
    }
    if let Some(v) = a.socket {
        cfg.socket = v;
    }
    if let Some(v) = a.state_dir {
        cfg.state_dir = v;
    }
    if let Some(v) = a.metrics_addr {
        cfg.metrics_addr = v;
    }
    if let Some(v) = a.event_log {
        cfg.event_log = v;
    }
    if let Some(v) = a.poll_ms {
        cfg.poll_ms = v;
    }
    if let Some(v) = a.adv_thr_ratio {
        cfg.hermes.adv_thr_ratio = v;
    }
    if let Some(v) = a.kill_after_s {
        cfg.m3.kill_after_s = v;
    }
    if let Some(v) = switch(a.advice, a.no_advice) {
        cfg.hermes.enabled = v;
    }
    if let Some(v) = switch(a.reclaim, a.no_reclaim) {
        cfg.reclaim.enabled = v;
    }
    if let Some(v) = switch(a.tier, a.no_tier) {
        cfg.tier.enabled = v;
    }
    cfg.validate()?;
    if a.print_config {
        print!(
            "{}",
            toml::to_string_pretty(&cfg).context("config to TOML")?
        );
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(memcolo_agent::run(cfg))
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MEMCOLO_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour codes only for a person at a terminal, never in a log file or journal.
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Commands that print for a person or a pipeline end quietly when the reader goes
/// away (`memcolo status | head`), as other Unix tools do, instead of panicking on
/// the write; the daemons keep `SIGPIPE` ignored (a client closing its socket must
/// not kill them).
fn die_quietly_on_a_closed_pipe() {
    // SAFETY: restoring a signal's default disposition before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if matches!(
        cli.cmd,
        Cmd::Status { .. }
            | Cmd::Top { .. }
            | Cmd::Register { .. }
            | Cmd::Unregister { .. }
            | Cmd::AllocStats(_)
            | Cmd::Tier(_)
            | Cmd::Doctor(_)
    ) {
        die_quietly_on_a_closed_pipe();
    }
    init_tracing();
    let res = match cli.cmd {
        Cmd::Agent(a) => agent(a),
        Cmd::Status { socket, json } => status::status(&socket.socket, json),
        Cmd::Top {
            socket,
            interval_ms,
        } => top::top(&socket.socket, interval_ms),
        Cmd::Register {
            socket,
            pid,
            class,
            name,
            expected_reclaim_bytes,
            notify,
        } => client::Client::connect(&socket.socket).and_then(|mut c| {
            match c.call_ok(&Request::Register {
                pid: Some(pid),
                class,
                name,
                expected_reclaim_bytes,
                notify,
            })? {
                Reply::Registered { pid, class } => {
                    println!("registered pid {pid} as {class}");
                    Ok(())
                }
                r => anyhow::bail!("unexpected reply {r:?}"),
            }
        }),
        Cmd::Unregister { socket, pid } => {
            client::Client::connect(&socket.socket).and_then(|mut c| {
                c.call_ok(&Request::Unregister { pid: Some(pid) })?;
                println!("unregistered pid {pid}");
                Ok(())
            })
        }
        Cmd::Run(a) => return run::run(a),
        Cmd::Doctor(a) => return doctor::main(&a, error_chain),
        Cmd::AllocStats(a) => alloc_stats::run(&a),
        Cmd::Memserver(a) => memserver::run(&a),
        Cmd::Tier(a) => tier::run(&a),
        Cmd::Sim(a) => memcolo_sim::run(&a),
        Cmd::Bench(b) => {
            let exe = std::env::current_exe().expect("path of the running memcolo binary");
            match b {
                BenchCmd::Colocation(a) => memcolo_bench::colocation::run(&a, &exe),
                BenchCmd::Reclaim(a) => memcolo_bench::reclaim::run(&a, &exe),
                BenchCmd::AgentCost(a) => memcolo_bench::agent_cost::run(&a, &exe),
            }
        }
    };
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memcolo: {}", error_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes as one line, `outer: inner: ...`, leaving out a cause whose
/// text the line already holds (the Linux layer's errors print their source, and
/// anyhow's `{:#}` would print it again: `...(os error 2): No such file or directory
/// (os error 2)`).
fn error_chain(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_chain_names_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let inner = memcolo_linux::Error::io("/sys/fs/cgroup/x/memory.max", io);
        let e = anyhow::Error::new(inner).context("scope `cgroup:x`");
        let line = error_chain(&e);
        assert_eq!(line.matches("os error 2").count(), 1, "{line}");
        assert!(
            line.starts_with("scope `cgroup:x`: /sys/fs/cgroup/x/memory.max"),
            "{line}"
        );
    }
}
