//! `memcolo bench agent-cost`: what the agent itself costs while it manages many
//! processes.
//!
//! The agent is started on a scratch cgroup node; N small real processes (each a shell
//! holding a 1 MiB string while it waits) are spread over `be/`, `elastic/` and `lc/`
//! child groups and registered with those classes. Every second the agent's CPU time
//! (`utime + stime` of `/proc/<pid>/stat`, all threads) and memory (`VmRSS`, `VmHWM`)
//! are sampled; the result is CPU % of one core over the duration and RSS in MiB,
//! against the targets of ≤ 1 % CPU and ≤ 20 MiB (Hermes §5.5 reports 2.4 % CPU and
//! ~2 MB for its monitor daemon).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use memcolo_proto::Class;

use crate::agent::{AgentProcess, AgentSpec};
use crate::cgroup::ScratchNode;
use crate::colocation::{default_out_dir, hostname};
use crate::process::{self, spawn, ChildGuard, Placement};
use crate::report::write_file;

/// CPU target: percent of one core.
pub const TARGET_CPU_PCT: f64 = 1.0;
/// RSS target, MiB.
pub const TARGET_RSS_MIB: f64 = 20.0;

/// Options of `memcolo bench agent-cost`.
#[derive(clap::Args, Debug, Clone)]
pub struct AgentCostArgs {
    /// Number of registered processes (classes be, elastic, lc in turn).
    #[arg(long, default_value_t = 100)]
    pub procs: usize,
    /// Sampling duration, seconds (after all processes are registered).
    #[arg(long, default_value_t = 60)]
    pub duration_s: u64,
    /// Memory limit of the scratch node the agent manages.
    #[arg(long, value_parser = crate::size::parse_bytes_arg, default_value = "4GiB", value_name = "SIZE")]
    pub node_mem: u64,
    /// Output directory [default: bench/results/<YYYY-MM-DD>-<hostname>/agent-cost].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Extra argument for `memcolo agent` (repeatable).
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
}

/// One sample of the agent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostSample {
    /// Seconds since sampling started.
    pub t_s: f64,
    /// Cumulative CPU time, clock ticks.
    pub cpu_ticks: u64,
    pub rss_kib: u64,
    pub hwm_kib: u64,
}

/// Summary of a sampling run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostSummary {
    /// CPU time over wall time, percent of one core.
    pub cpu_pct: f64,
    pub rss_mean_mib: f64,
    pub rss_max_mib: f64,
    /// VmHWM at the end (the peak over the agent's life, start-up included).
    pub hwm_mib: f64,
}

/// Summarises samples (at least two, in time order); `ticks_per_s` from
/// `sysconf(_SC_CLK_TCK)`.
pub fn summarize(samples: &[CostSample], ticks_per_s: u64) -> Option<CostSummary> {
    let (first, last) = (samples.first()?, samples.last()?);
    let wall = last.t_s - first.t_s;
    if samples.len() < 2 || wall <= 0.0 {
        return None;
    }
    let cpu_s = last.cpu_ticks.saturating_sub(first.cpu_ticks) as f64 / ticks_per_s as f64;
    let mib = |kib: u64| kib as f64 / 1024.0;
    Some(CostSummary {
        cpu_pct: cpu_s / wall * 100.0,
        rss_mean_mib: samples.iter().map(|s| mib(s.rss_kib)).sum::<f64>() / samples.len() as f64,
        rss_max_mib: samples.iter().map(|s| mib(s.rss_kib)).fold(0.0, f64::max),
        hwm_mib: mib(last.hwm_kib),
    })
}

/// The class of process `i` of the mix.
pub fn class_of(i: usize) -> Class {
    match i % 3 {
        0 => Class::Be,
        1 => Class::Elastic,
        _ => Class::Lc,
    }
}

/// Runs the measurement; `memcolo_exe` is the `memcolo` binary.
pub fn run(args: &AgentCostArgs, memcolo_exe: &Path) -> anyhow::Result<()> {
    if args.procs == 0 || args.procs > 10_000 || args.duration_s == 0 {
        bail!("--procs must be in 1..=10000 and --duration-s at least 1");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("memcolo bench agent-cost needs root (cgroups, registering other pids)");
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| default_out_dir("agent-cost"));
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
    let _stop = crate::signal::StopGuard::install()?;
    let t0 = Instant::now();
    let say = |m: &str| eprintln!("[{:>7.1}s] {m}", t0.elapsed().as_secs_f64());
    let work = tempfile::Builder::new()
        .prefix("memcolo-agent-cost-")
        .tempdir()
        .context("create work directory")?;
    let mut node = ScratchNode::create_below_self("memcolo-agent-cost", args.node_mem)?;
    let groups: Vec<(Class, PathBuf)> = [Class::Be, Class::Elastic, Class::Lc]
        .into_iter()
        .map(|c| Ok((c, node.create_child(c.as_str())?)))
        .collect::<crate::error::Result<_>>()?;
    let event_log = out.join("events.jsonl");
    let agent_log = out.join("agent.log");
    let spec = AgentSpec {
        exe: memcolo_exe,
        scope_cgroup: node.path(),
        work_dir: work.path(),
        event_log: &event_log,
        log: &agent_log,
        extra_args: &args.agent_args,
    };
    let mut agent = AgentProcess::start(&spec, &Placement::default(), Duration::from_secs(15))?;
    say(&format!(
        "agent pid {} on {}",
        agent.pid(),
        node.path().display()
    ));

    let mut children: Vec<ChildGuard> = Vec::with_capacity(args.procs);
    for i in 0..args.procs {
        crate::signal::check()?;
        let class = class_of(i);
        let group = &groups.iter().find(|(c, _)| *c == class).expect("group").1;
        let mut cmd = Command::new("sh");
        // A real process holding 1 MiB of heap (the string) while it sleeps.
        cmd.arg("-c")
            .arg("v=$(head -c 1048576 /dev/zero | tr '\\0' x); sleep 100000; echo ${#v}")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = spawn(
            &mut cmd,
            "holder",
            &Placement {
                cgroup: Some(group),
                cpus: None,
            },
        )?;
        agent
            .register(child.pid(), class, &format!("holder-{i}"))
            .with_context(|| format!("register holder {i}"))?;
        children.push(child);
    }
    say(&format!(
        "{} processes registered; sampling {} s",
        args.procs, args.duration_s
    ));

    let ticks = process::clock_ticks_per_s();
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut next = start;
    loop {
        agent.check_alive()?;
        let st = process::read_stat(agent.pid())?;
        let mem = process::read_status_mem(agent.pid())?;
        samples.push(CostSample {
            t_s: start.elapsed().as_secs_f64(),
            cpu_ticks: st.cpu_ticks,
            rss_kib: mem.rss_kib,
            hwm_kib: mem.hwm_kib,
        });
        if start.elapsed() >= Duration::from_secs(args.duration_s) {
            break;
        }
        next += Duration::from_secs(1);
        crate::signal::sleep(next.saturating_duration_since(Instant::now()))?;
    }
    let sum = summarize(&samples, ticks).context("too few samples")?;
    agent.stop(Duration::from_secs(10))?;
    drop(children);
    drop(node);
    drop(work);

    let mut csv = String::from("t_s,cpu_ticks,rss_kib,hwm_kib\n");
    for s in &samples {
        let _ = writeln!(
            csv,
            "{:.3},{},{},{}",
            s.t_s, s.cpu_ticks, s.rss_kib, s.hwm_kib
        );
    }
    write_file(&out, "samples.csv", &csv)?;
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let cpu_ok = sum.cpu_pct <= TARGET_CPU_PCT;
    let rss_ok = sum.rss_max_mib <= TARGET_RSS_MIB;
    write_file(
        &out,
        "summary.csv",
        &format!(
            "procs,duration_s,cpu_pct,rss_mean_mib,rss_max_mib,hwm_mib,target_cpu_pct,target_rss_mib\n{},{},{:.3},{:.2},{:.2},{:.2},{},{}\n",
            args.procs, args.duration_s, sum.cpu_pct, sum.rss_mean_mib, sum.rss_max_mib, sum.hwm_mib, TARGET_CPU_PCT, TARGET_RSS_MIB
        ),
    )?;
    let table = format!(
        "| metric | value | target | |\n|---|---:|---:|---|\n| CPU, % of one core | {:.3} | ≤ {TARGET_CPU_PCT} | {} |\n| RSS max, MiB | {:.2} | ≤ {TARGET_RSS_MIB} | {} |\n| RSS mean, MiB | {:.2} | | |\n| VmHWM, MiB | {:.2} | | |\n",
        sum.cpu_pct,
        verdict(cpu_ok),
        sum.rss_max_mib,
        verdict(rss_ok),
        sum.rss_mean_mib,
        sum.hwm_mib
    );
    let md = format!(
        "# Agent cost\n\n{} on `{}`, {} CPUs. Command: `{}`\n\n`memcolo agent` managing a scratch cgroup node with {} registered processes \
         (classes be, elastic, lc in turn; each a shell holding 1 MiB), default poll interval, sampled every 1 s for {} s: \
         CPU = (utime+stime) / wall time; RSS from /proc/<pid>/status.\n\n{table}\nRaw: `samples.csv`, `summary.csv`, `agent.log`, `events.jsonl`.\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        hostname(),
        process::online_cpus(),
        std::env::args().collect::<Vec<_>>().join(" "),
        args.procs,
        args.duration_s,
    );
    write_file(&out, "report.md", &md)?;
    println!("{table}");
    say(&format!("results in {}", out.display()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_percent_and_rss() {
        let s = [
            CostSample {
                t_s: 0.0,
                cpu_ticks: 1000,
                rss_kib: 8192,
                hwm_kib: 9000,
            },
            CostSample {
                t_s: 50.0,
                cpu_ticks: 1020,
                rss_kib: 10240,
                hwm_kib: 10240,
            },
            CostSample {
                t_s: 100.0,
                cpu_ticks: 1050,
                rss_kib: 9216,
                hwm_kib: 10240,
            },
        ];
        let sum = summarize(&s, 100).unwrap();
        // 50 ticks = 0.5 s over 100 s.
        assert!((sum.cpu_pct - 0.5).abs() < 1e-9);
        assert!((sum.rss_max_mib - 10.0).abs() < 1e-9);
        assert!((sum.rss_mean_mib - 9.0).abs() < 1e-9);
        assert!((sum.hwm_mib - 10.0).abs() < 1e-9);
        assert_eq!(summarize(&s[..1], 100), None);
    }

    #[test]
    fn class_mix_is_even() {
        let n = 99;
        let count = |c| (0..n).filter(|&i| class_of(i) == c).count();
        assert_eq!(count(Class::Be), 33);
        assert_eq!(count(Class::Elastic), 33);
        assert_eq!(count(Class::Lc), 33);
    }
}
