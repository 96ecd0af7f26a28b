//! `memcolo bench agent-cost`: what the agent itself costs while it manages many
//! processes.
//!
//! The agent is started on a scratch cgroup node; N small real processes (each a shell
//! holding a 1 MiB string while it waits) are spread over `be/`, `elastic/` and `lc/`
//! child groups and registered with those classes. Every second the agent's CPU time
//! (`utime + stime` of `/proc/<pid>/stat`, all threads) and memory (`VmRSS`, `VmHWM`)
//! are sampled; the result is CPU % of one core over the duration and RSS in MiB,
//! against the targets of ≤ 1 % CPU and ≤ 20 MiB (Hermes §5.5 reports 2.4 % CPU and
//! ~2 MB for its monitor daemon). By default every mechanism of the agent is on
//! (`--mechanisms all`: the targets are for that case) and the run is repeated
//! (`--reps`, 3) with a fresh agent each time; the report gives the median and the
//! spread, and each thread's share, so a cost can be told to a loop.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use memcolo_proto::Class;

use crate::agent::{AgentProcess, AgentSpec};
use crate::cgroup::ScratchNode;
use crate::harness::{default_out_dir, hostname};
use crate::process::{self, spawn, ChildGuard, ChildPlacement};
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
    /// Output directory [default: bench/out/agent-cost/<YYYY-MM-DD>-<hostname>].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Which mechanisms the agent runs: `all` (default; the target is for every
    /// mechanism on) or `default` (the agent's defaults).
    #[arg(long, value_enum, default_value = "all")]
    pub mechanisms: Mechanisms,
    /// Repetitions, each with a fresh agent and fresh processes (the table gives the
    /// median and the spread).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
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

/// Which of the agent's mechanisms a run switches on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanisms {
    /// The agent's defaults (no configuration file).
    Default,
    /// Every mechanism of the agent: M3 monitor, Hermes advice, Hermit reclaim and the
    /// MaxMem tier service (`[reclaim] enabled = true`, `[tier] enabled = true`).
    All,
}

impl Mechanisms {
    /// The configuration file a run passes with `--config`, if any.
    fn config(self) -> Option<&'static str> {
        match self {
            Mechanisms::Default => None,
            Mechanisms::All => Some("[reclaim]\nenabled = true\n\n[tier]\nenabled = true\n"),
        }
    }
}

/// CPU time of one of the agent's threads over the sampling window.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadCost {
    /// The thread's name (`comm`).
    pub name: String,
    /// Percent of one core over the window.
    pub cpu_pct: f64,
}

/// Cumulative CPU ticks (utime + stime) per thread name of process `pid`, threads of
/// the same name summed.
fn thread_ticks(pid: i32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        if let Some((name, ticks)) = parse_task_stat(&text) {
            *out.entry(name).or_insert(0) += ticks;
        }
    }
    out
}

/// `comm` and utime + stime (ticks) of a `/proc/PID/task/TID/stat` line.
pub fn parse_task_stat(text: &str) -> Option<(String, u64)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?.to_string();
    let f: Vec<&str> = text.get(close + 2..)?.split_whitespace().collect();
    // After the comm: state is field 3, utime 14 and stime 15 (1-based, proc(5)).
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

/// One repetition's outcome.
struct RepOutcome {
    summary: CostSummary,
    threads: Vec<ThreadCost>,
    samples: Vec<CostSample>,
    /// The machine's 1-minute load average at the end of the window, and the share of
    /// all CPUs' time stolen by the host during it, percent: how disturbed the run was
    /// (the agent's CPU time is its own, but a busy machine makes each of its system
    /// calls dearer).
    load_1m: Option<f64>,
    steal_pct: Option<f64>,
}

/// Runs the measurement; `memcolo_exe` is the `memcolo` binary.
pub fn run(args: &AgentCostArgs, memcolo_exe: &Path) -> anyhow::Result<()> {
    if args.procs == 0 || args.procs > 10_000 || args.duration_s == 0 {
        bail!("--procs must be in 1..=10000 and --duration-s at least 1");
    }
    if args.reps == 0 || args.reps > 100 {
        bail!("--reps must be in 1..=100");
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
    let mut reps = Vec::new();
    for rep in 0..args.reps {
        let r = run_once(args, memcolo_exe, &out, rep, &say)?;
        say(&format!(
            "rep {}: CPU {:.3} % of a core, RSS max {:.2} MiB",
            rep + 1,
            r.summary.cpu_pct,
            r.summary.rss_max_mib
        ));
        reps.push(r);
    }

    let mut csv = String::from("rep,t_s,cpu_ticks,rss_kib,hwm_kib\n");
    for (i, r) in reps.iter().enumerate() {
        for s in &r.samples {
            let _ = writeln!(
                csv,
                "{},{:.3},{},{},{}",
                i + 1,
                s.t_s,
                s.cpu_ticks,
                s.rss_kib,
                s.hwm_kib
            );
        }
    }
    write_file(&out, "samples.csv", &csv)?;
    let mut sum_csv = String::from(
        "rep,procs,duration_s,mechanisms,cpu_pct,rss_mean_mib,rss_max_mib,hwm_mib,target_cpu_pct,target_rss_mib,load_1m,steal_pct\n",
    );
    for (i, r) in reps.iter().enumerate() {
        let s = &r.summary;
        let _ = writeln!(
            sum_csv,
            "{},{},{},{:?},{:.3},{:.2},{:.2},{:.2},{},{},{},{}",
            i + 1,
            args.procs,
            args.duration_s,
            args.mechanisms,
            s.cpu_pct,
            s.rss_mean_mib,
            s.rss_max_mib,
            s.hwm_mib,
            TARGET_CPU_PCT,
            TARGET_RSS_MIB,
            r.load_1m.map_or(String::new(), |l| format!("{l:.2}")),
            r.steal_pct.map_or(String::new(), |s| format!("{s:.2}")),
        );
    }
    write_file(&out, "summary.csv", &sum_csv)?;
    let mut thread_csv = String::from("rep,thread,cpu_pct\n");
    for (i, r) in reps.iter().enumerate() {
        for t in &r.threads {
            let _ = writeln!(thread_csv, "{},{},{:.3}", i + 1, t.name, t.cpu_pct);
        }
    }
    write_file(&out, "threads.csv", &thread_csv)?;

    let spread = |f: &dyn Fn(&CostSummary) -> f64| {
        let mut v: Vec<f64> = reps.iter().map(|r| f(&r.summary)).collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let (cpu_med, cpu_min, cpu_max) = spread(&|s| s.cpu_pct);
    let (rss_med, rss_min, rss_max) = spread(&|s| s.rss_max_mib);
    let (hwm_med, _, hwm_max) = spread(&|s| s.hwm_mib);
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let mut table = format!(
        "| metric ({} runs) | median | min | max | target | |\n|---|---:|---:|---:|---:|---|\n\
         | CPU, % of one core | {cpu_med:.3} | {cpu_min:.3} | {cpu_max:.3} | ≤ {TARGET_CPU_PCT} | {} |\n\
         | RSS max, MiB | {rss_med:.2} | {rss_min:.2} | {rss_max:.2} | ≤ {TARGET_RSS_MIB} | {} |\n\
         | VmHWM, MiB | {hwm_med:.2} | | {hwm_max:.2} | | |\n",
        reps.len(),
        verdict(cpu_max <= TARGET_CPU_PCT),
        verdict(rss_max <= TARGET_RSS_MIB),
    );
    table.push_str("\n| run | CPU, % of one core | RSS max, MiB | load (1 min) | steal, % |\n|---:|---:|---:|---:|---:|\n");
    for (i, r) in reps.iter().enumerate() {
        let _ = writeln!(
            table,
            "| {} | {:.3} | {:.2} | {} | {} |",
            i + 1,
            r.summary.cpu_pct,
            r.summary.rss_max_mib,
            r.load_1m.map_or("-".into(), |l| format!("{l:.2}")),
            r.steal_pct.map_or("-".into(), |s| format!("{s:.2}")),
        );
    }
    // Threads by their median share, for where the CPU goes.
    let mut names: Vec<&str> = reps
        .iter()
        .flat_map(|r| r.threads.iter().map(|t| t.name.as_str()))
        .collect();
    names.sort_unstable();
    names.dedup();
    table.push_str("\n| thread | CPU, % of one core (median) |\n|---|---:|\n");
    for n in names {
        let mut v: Vec<f64> = reps
            .iter()
            .map(|r| {
                r.threads
                    .iter()
                    .find(|t| t.name == n)
                    .map_or(0.0, |t| t.cpu_pct)
            })
            .collect();
        v.sort_by(f64::total_cmp);
        let _ = writeln!(table, "| `{n}` | {:.3} |", v[v.len() / 2]);
    }
    let mechanisms = match args.mechanisms {
        Mechanisms::Default => "the agent's defaults (no configuration file)",
        Mechanisms::All => {
            "every mechanism on (`[reclaim] enabled = true`, `[tier] enabled = true`: M3 monitor, \
             Hermes advice, Hermit reclaim, MaxMem tier service)"
        }
    };
    let md = format!(
        "# Agent cost\n\n{} on `{}`, {} CPUs. Command: `{}`\n\n`memcolo agent` managing a scratch cgroup node with {} registered processes \
         (classes be, elastic, lc in turn; each a shell holding 1 MiB), {mechanisms}, default poll interval, sampled every 1 s for {} s, \
         {} repetitions (a fresh agent and fresh processes each): CPU = (utime+stime) / wall time of all the agent's threads; RSS from \
         /proc/<pid>/status; per-thread CPU from /proc/<pid>/task/*/stat. A run with a 1-minute load above 1 or steal above 1 % \
         was disturbed by other work: the same work then costs more CPU time; repeat it on a quiet machine.\n\n{table}\nRaw: `samples.csv`, `summary.csv`, `threads.csv`, \
         `agent-<rep>.log`, `events-<rep>.jsonl`.\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        hostname(),
        process::online_cpus(),
        std::env::args().collect::<Vec<_>>().join(" "),
        args.procs,
        args.duration_s,
        args.reps,
    );
    write_file(&out, "report.md", &md)?;
    println!("{table}");
    say(&format!("results in {}", out.display()));
    Ok(())
}

/// One repetition: a fresh node, agent and processes.
fn run_once(
    args: &AgentCostArgs,
    memcolo_exe: &Path,
    out: &Path,
    rep: usize,
    say: &dyn Fn(&str),
) -> anyhow::Result<RepOutcome> {
    let work = tempfile::Builder::new()
        .prefix("memcolo-agent-cost-")
        .tempdir()
        .context("create work directory")?;
    let mut node = ScratchNode::create_below_self("memcolo-agent-cost", args.node_mem)?;
    let groups: Vec<(Class, PathBuf)> = [Class::Be, Class::Elastic, Class::Lc]
        .into_iter()
        .map(|c| Ok((c, node.create_child(c.as_str())?)))
        .collect::<crate::error::Result<_>>()?;
    let event_log = out.join(format!("events-{}.jsonl", rep + 1));
    let agent_log = out.join(format!("agent-{}.log", rep + 1));
    let mut extra = Vec::new();
    if let Some(toml) = args.mechanisms.config() {
        let p = work.path().join("agent.toml");
        std::fs::write(&p, toml).with_context(|| format!("write {}", p.display()))?;
        extra.push("--config".to_string());
        extra.push(p.display().to_string());
    }
    extra.extend(args.agent_args.iter().cloned());
    let spec = AgentSpec {
        exe: memcolo_exe,
        scope_cgroup: node.path(),
        work_dir: work.path(),
        event_log: &event_log,
        log: &agent_log,
        extra_args: &extra,
    };
    let mut agent =
        AgentProcess::start(&spec, &ChildPlacement::default(), Duration::from_secs(15))?;
    say(&format!(
        "rep {}: agent pid {} on {}",
        rep + 1,
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
            &ChildPlacement {
                cgroup: Some(group),
                cpus: None,
                psi_cgroup: None,
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
    let threads0 = thread_ticks(agent.pid());
    let all_cpus: Vec<usize> = (0..process::online_cpus()).collect();
    let steal0 = process::read_cpus_busy_steal_ticks(&all_cpus).map(|(_, s)| s);
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
    let wall = start.elapsed().as_secs_f64();
    let threads1 = thread_ticks(agent.pid());
    let steal_pct = match (steal0, process::read_cpus_busy_steal_ticks(&all_cpus)) {
        (Some(a), Some((_, b))) => Some(
            b.saturating_sub(a) as f64 / ticks as f64 / wall / all_cpus.len().max(1) as f64 * 100.0,
        ),
        _ => None,
    };
    let load_1m = process::loadavg_1m();
    let threads = threads1
        .iter()
        .map(|(name, t1)| ThreadCost {
            name: name.clone(),
            cpu_pct: t1.saturating_sub(threads0.get(name).copied().unwrap_or(0)) as f64
                / ticks as f64
                / wall
                * 100.0,
        })
        .collect();
    let summary = summarize(&samples, ticks).context("too few samples")?;
    agent.stop(Duration::from_secs(10))?;
    drop(children);
    drop(node);
    drop(work);
    Ok(RepOutcome {
        summary,
        threads,
        samples,
        load_1m,
        steal_pct,
    })
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
    fn task_stat_fields() {
        // comm with spaces and parentheses; utime 7, stime 3 (fields 14 and 15).
        let line = "42 (memcolo (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 3 0 1000";
        assert_eq!(parse_task_stat(line), Some(("memcolo (x) y".into(), 10)));
        assert_eq!(parse_task_stat("garbage"), None);
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
