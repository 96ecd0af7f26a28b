//! `memcolo bench colocation`: Redis (LC) beside real batch jobs (BE) in a scratch
//! memory cgroup node, at the memory pressure levels of Hermes §5.1, with the kernel
//! alone and with the memcolo agent; the query latency, SLO violation (Hermes §5.3),
//! throughput and BE work of each run.
//!
//! One run per (level, mode), each from the same state: fresh `lc/` and `be/` groups,
//! a fresh `redis-server` preloaded with the dataset, no page cache charged to the
//! node. Phases: start (agent, Redis, preload, BE jobs), warm-up (BE jobs fill their
//! demand, the load runs and is discarded), measured phase (open-loop load recorded,
//! node usage, swap, BE reads and Redis major faults sampled), teardown. See
//! `bench/colocation/README.md` for the method and [`crate::report`] for the outputs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use memcolo_proto::Class;

use crate::agent::{count_kills, AgentProcess, AgentSpec};
use crate::be::{be_demand, ensure_data_file, BeDemand, BeJobs, BeSplit};
use crate::cgroup::{read_procs, ScratchNode};
use crate::error::{BenchError, Result};
use crate::lc::{preload, LcKind, LcServer};
use crate::loadgen::{run_open_loop, value_pool, LoadSpec};
use crate::process::{self, Placement};
use crate::progress::{self, BeJob, SoloKey, SoloRecord};
use crate::report::{self, ReportContext, RunOutcome, RunRecord};
use crate::size::{format_bytes, parse_bytes_arg};
use crate::zram::ZramSwap;

/// With or without the memcolo agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// The kernel alone: cgroup limit, reclaim and swap, no agent.
    Kernel,
    /// `memcolo agent` with its defaults managing the node (every mechanism that is on
    /// by default: M3, Hermes advice, Hermit reclaim, the tier service), Redis
    /// registered as LC, the jobs as BE.
    Agent,
    /// The kernel alone with raised watermarks (`vm.watermark_scale_factor` = 1000,
    /// `vm.min_free_kbytes` = 2 % of RAM; restored after the run). Host-level kswapd
    /// watermarks: they do not apply to a memory cgroup's limit.
    Watermarks,
    /// `memcolo agent` with asynchronous reclaim in the kswapd / Fastswap design: one
    /// worker that starts at a fixed mark (M3 kills and Hermes advice off).
    Fixed,
    /// `memcolo agent` with Hermit's adaptive asynchronous reclaim (M3 kills and
    /// Hermes advice off, so the comparison isolates reclaim).
    Reclaim,
    /// The kernel alone with the node's limit raised above the level's BE demand
    /// (+ the node's own memory + 512 MiB, as the BE solo runs): the same LC service,
    /// the same BE jobs and BE CPU load as the level's other modes, but no memory
    /// pressure (no reclaim, no swap). The reference "p99 with the same BE CPU load and
    /// no memory pressure": what of a level's tail is the CPU share of the machine.
    NoPressure,
}

impl Mode {
    /// The mode's name in results.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Agent => "agent",
            Mode::Watermarks => "watermarks",
            Mode::Fixed => "fixed",
            Mode::Reclaim => "reclaim",
            Mode::NoPressure => "no-pressure",
        }
    }

    /// Whether the run starts `memcolo agent`.
    pub fn uses_agent(self) -> bool {
        matches!(self, Mode::Agent | Mode::Fixed | Mode::Reclaim)
    }

    /// The agent configuration (TOML) of the mode, beyond the command line.
    pub(crate) fn agent_config(self, node_bytes: u64, extra: &[String]) -> Option<String> {
        let mut base =
            "[hermes]\nenabled = false\n[m3]\nkill_after_s = 86400\n[reclaim]\nenabled = true\n"
                .to_string();
        for line in extra {
            base.push_str(line);
            base.push('\n');
        }
        match self {
            Mode::Reclaim => Some(base),
            Mode::Fixed => Some(format!(
                "{base}max_workers = 1\nfixed_low_bytes = {}\n",
                (node_bytes / 100).max(32 << 20)
            )),
            _ => None,
        }
    }
}

/// Sets sysctls for a run and restores them on drop.
struct SysctlGuard(Vec<(PathBuf, String)>);

impl SysctlGuard {
    fn set(values: &[(&str, String)]) -> Result<SysctlGuard> {
        let mut g = SysctlGuard(Vec::new());
        for (name, v) in values {
            let path = PathBuf::from("/proc/sys").join(name.replace('.', "/"));
            let old = std::fs::read_to_string(&path)
                .map_err(|e| BenchError::io(&path, e))?
                .trim()
                .to_string();
            std::fs::write(&path, v).map_err(|e| BenchError::io(&path, e))?;
            g.0.push((path, old));
        }
        Ok(g)
    }
}

impl Drop for SysctlGuard {
    fn drop(&mut self) {
        for (p, old) in self.0.drain(..).rev() {
            if let Err(e) = std::fs::write(&p, &old) {
                eprintln!("warning: cannot restore {} to {old}: {e}", p.display());
            }
        }
    }
}

/// Options of `memcolo bench colocation`.
#[derive(clap::Args, Debug, Clone)]
pub struct ColocationArgs {
    /// Short sweep (all levels and modes in under 3 minutes): 2 GiB node, 4 s warm-up,
    /// 6 s measured, 2000 req/s, 50k keys; explicit options still win.
    #[arg(long)]
    pub quick: bool,
    /// Memory pressure levels, percent: BE memory demand / node memory (Hermes §5.1).
    #[arg(long, value_delimiter = ',', default_value = "0,50,75,100,125,150")]
    pub levels: Vec<u32>,
    /// Modes to run at each level.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "kernel,agent"
    )]
    pub modes: Vec<Mode>,
    /// Node memory: memory.limit_in_bytes of the scratch cgroup [default: 4GiB; 2GiB with --quick].
    #[arg(long, value_parser = parse_bytes_arg, value_name = "SIZE")]
    pub node_mem: Option<u64>,
    /// Measured phase per run, seconds [default: 60; 6 with --quick].
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Warm-up per run, seconds (BE jobs fill their memory; load is not recorded) [default: 20; 4 with --quick].
    #[arg(long)]
    pub warmup_s: Option<u64>,
    /// Request rate of the open-loop load generator, requests/s [default: 4000; 2000 with --quick].
    #[arg(long)]
    pub rate: Option<f64>,
    /// Keys preloaded into Redis [default: 300000; 50000 with --quick].
    #[arg(long)]
    pub keys: Option<u64>,
    /// Value size of preloaded keys and SETs, bytes.
    #[arg(long, default_value_t = 1024)]
    pub value_bytes: usize,
    /// Fraction of requests that SET a new key (Redis allocates); the rest GET a random key.
    #[arg(long, default_value_t = 0.5)]
    pub set_ratio: f64,
    /// Connections from the load generator to Redis (requests are multiplexed on them).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// A request unanswered after this many ms is an error (its latency still counts).
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Split of BE demand between the file streamer and the anonymous holder, FILE:ANON.
    #[arg(long, default_value = "2:1")]
    pub be_split: BeSplit,
    /// SLO in µs; default: p90 of the 0 % kernel-alone run (Hermes §5.3).
    #[arg(long)]
    pub slo_us: Option<u64>,
    /// Output directory [default: bench/results/<YYYY-MM-DD>-<hostname>/colocation].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Record a failed run and go on with the next one instead of stopping.
    #[arg(long)]
    pub keep_going: bool,
    /// Directory on a real disk (not tmpfs) for the streamer's data file, kept for reuse.
    #[arg(long, default_value = "/var/tmp/memcolo-bench")]
    pub data_dir: PathBuf,
    /// Delete the data file at the end instead of keeping it for the next run.
    #[arg(long)]
    pub remove_data: bool,
    /// Size of the zram swap device set up for the bench.
    #[arg(long, value_parser = parse_bytes_arg, default_value = "8GiB", value_name = "SIZE")]
    pub zram_size: u64,
    /// Do not set up zram swap (anonymous BE memory then cannot be reclaimed).
    #[arg(long)]
    pub no_zram: bool,
    /// Do not pin Redis and the BE jobs to separate CPUs (Hermes §5.1 pins them).
    #[arg(long)]
    pub no_pin: bool,
    /// The redis-server binary.
    #[arg(long, default_value = "redis-server")]
    pub redis_server: PathBuf,
    /// The LC service: Redis, or memcached (text protocol, same open-loop GET/SET mix).
    #[arg(long, value_enum, default_value = "redis")]
    pub lc: LcKind,
    /// The memcached binary.
    #[arg(long, default_value = "memcached")]
    pub memcached: PathBuf,
    /// Extra argument for `memcolo agent` (repeat for several, e.g. --agent-arg=--adv-thr-ratio --agent-arg=0.9).
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
    /// Skip the PNG plots.
    #[arg(long)]
    pub no_plot: bool,
    /// Extra `key = value` line for the agent's `[reclaim]` section in the fixed and
    /// reclaim modes (repeat for several), e.g. `--reclaim-set "nice = 0"`.
    #[arg(long = "reclaim-set")]
    pub reclaim_set: Vec<String>,
    /// Hermit's batch experiment instead of the LC sweep: a k-means job alone in the
    /// node, whose memory is each level's share of the job's working set (levels then
    /// mean local memory, default 100,70,50 %; modes default kernel,fixed,reclaim).
    /// See `bench/reclaim/README.md`.
    #[arg(long)]
    pub batch: bool,
    /// Bytes of k-means points, the batch job's data [default: 1GiB].
    #[arg(long, value_parser = parse_bytes_arg, value_name = "SIZE")]
    pub batch_bytes: Option<u64>,
    /// k-means iterations of the batch job [default: 8; 5 with --quick].
    #[arg(long)]
    pub batch_iters: Option<u32>,
    /// Runs of each (level, mode) in the batch experiment, interleaved [default: 3; 2 with --quick].
    #[arg(long)]
    pub repeats: Option<u32>,
    /// Solo baselines of the BE jobs (each alone on the BE CPUs, no memory pressure),
    /// the denominators of BE progress: rows matching this sweep's demand, phases and
    /// CPUs are reused, missing ones are run first and appended [default: <out>/solo.csv].
    #[arg(long, value_name = "FILE")]
    pub solo_csv: Option<PathBuf>,
    /// Run no solo baselines (BE progress columns stay empty unless `--solo-csv` has them).
    #[arg(long)]
    pub no_solo: bool,
    /// Solo runs per BE job and level; the solo rate is their median. Runs already in
    /// the solo file count.
    #[arg(long, default_value_t = 1)]
    pub solo_repeats: u32,
    /// Run the solo baselines of the sweep's levels and nothing else.
    #[arg(long, conflicts_with = "no_solo")]
    pub solo_only: bool,
}

/// [`ColocationArgs`] with defaults applied and checked.
#[derive(Clone, Debug)]
pub struct Settings {
    pub levels: Vec<u32>,
    pub modes: Vec<Mode>,
    pub node_bytes: u64,
    pub warmup: Duration,
    pub duration: Duration,
    pub rate_per_s: f64,
    pub keys: u64,
    pub value_bytes: usize,
    pub set_ratio: f64,
    pub connections: usize,
    pub timeout: Duration,
    pub split: BeSplit,
    pub out: PathBuf,
}

/// The default output directory: `bench/results/<YYYY-MM-DD>-<hostname>/<name>`.
pub fn default_out_dir(name: &str) -> PathBuf {
    let date = chrono::Utc::now().format("%Y-%m-%d").to_string();
    PathBuf::from("bench/results")
        .join(format!("{date}-{}", hostname()))
        .join(name)
}

/// The machine's hostname.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

impl Settings {
    /// Applies the quick or full defaults and checks ranges.
    pub fn resolve(a: &ColocationArgs) -> Result<Self> {
        let q = a.quick;
        let s = Settings {
            levels: a.levels.clone(),
            modes: a.modes.clone(),
            node_bytes: a.node_mem.unwrap_or(if q { 2 << 30 } else { 4 << 30 }),
            warmup: Duration::from_secs(a.warmup_s.unwrap_or(if q { 4 } else { 20 })),
            duration: Duration::from_secs(a.duration_s.unwrap_or(if q { 6 } else { 60 })),
            rate_per_s: a.rate.unwrap_or(if q { 2000.0 } else { 4000.0 }),
            keys: a.keys.unwrap_or(if q { 50_000 } else { 300_000 }),
            value_bytes: a.value_bytes,
            set_ratio: a.set_ratio,
            connections: a.connections,
            timeout: Duration::from_millis(a.timeout_ms),
            split: a.be_split,
            out: a
                .out
                .clone()
                .unwrap_or_else(|| default_out_dir("colocation")),
        };
        let bad = |m: String| Err(BenchError::Invalid(m));
        if s.levels.is_empty() || s.modes.is_empty() {
            return bad("--levels and --modes need at least one value".into());
        }
        if let Some(l) = s.levels.iter().find(|&&l| l > 400) {
            return bad(format!("level {l} % is above 400 %"));
        }
        if s.node_bytes < (256 << 20) {
            return bad("--node-mem must be at least 256MiB".into());
        }
        if !(s.rate_per_s.is_finite() && s.rate_per_s > 0.0 && s.rate_per_s <= 200_000.0) {
            return bad("--rate must be in (0, 200000] requests/s".into());
        }
        if !(0.0..=1.0).contains(&s.set_ratio) {
            return bad("--set-ratio must be in [0, 1]".into());
        }
        if s.duration.is_zero() {
            return bad("--duration-s must be at least 1".into());
        }
        if s.keys == 0 || s.value_bytes == 0 || s.value_bytes > (64 << 20) {
            return bad("--keys must be positive and --value-bytes in 1..=64MiB".into());
        }
        if s.connections == 0 || s.connections > 256 {
            return bad("--connections must be in 1..=256".into());
        }
        // Redis must fit in the node next to BE at 0 %, with room for its growth.
        let growth = (s.rate_per_s * s.set_ratio * (s.warmup + s.duration).as_secs_f64()) as u64;
        let dataset = (s.keys + growth) * (s.value_bytes as u64 + 100);
        if dataset > s.node_bytes / 2 {
            return bad(format!(
                "Redis dataset (~{} with the SETs of a run) is over half the node ({}); lower --keys/--rate or raise --node-mem",
                format_bytes(dataset),
                format_bytes(s.node_bytes)
            ));
        }
        Ok(s)
    }
}

/// Prints one progress line with the time since the sweep started.
/// CLOCK_MONOTONIC now, seconds (the clock of `perf record -k mono`).
fn monotonic_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

pub(crate) fn progress(t0: Instant, msg: &str) {
    eprintln!("[{:>7.1}s] {msg}", t0.elapsed().as_secs_f64());
}

/// Shared state of a sweep.
struct Sweep<'a> {
    s: &'a Settings,
    args: &'a ColocationArgs,
    exe: &'a Path,
    rt: tokio::runtime::Runtime,
    node: ScratchNode,
    zram: Option<ZramSwap>,
    data_file: PathBuf,
    work_dir: PathBuf,
    log_dir: PathBuf,
    lc_cpus: Option<Vec<usize>>,
    be_cpus: Option<Vec<usize>>,
    pool: Arc<Vec<u8>>,
    t0: Instant,
}

/// Runs the sweep described by `args`; `memcolo_exe` is the `memcolo` binary that
/// provides `memcolo agent`. Needs root, cgroup v1 memory, redis-server, fio and
/// stress-ng. Everything it creates is removed on every exit path (Ctrl-C included),
/// except the results and the reusable data file.
pub fn run(args: &ColocationArgs, memcolo_exe: &Path) -> anyhow::Result<()> {
    if args.batch {
        bail!("--batch is an experiment of `memcolo bench reclaim`");
    }
    let s = Settings::resolve(args)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("memcolo bench colocation needs root (cgroups, zram swap)");
    }
    let lc_exe = match args.lc {
        LcKind::Redis => &args.redis_server,
        LcKind::Memcached => &args.memcached,
    };
    let mut tools: Vec<&Path> = vec![
        lc_exe,
        Path::new("fio"),
        Path::new("stress-ng"),
        Path::new("dd"),
    ];
    if s.modes.iter().any(|m| m.uses_agent()) {
        tools.push(memcolo_exe);
    }
    for t in tools {
        which(t).with_context(|| format!("{} is needed", t.display()))?;
    }
    let _stop = crate::signal::StopGuard::install()?;
    let t0 = Instant::now();
    std::fs::create_dir_all(&s.out).with_context(|| format!("create {}", s.out.display()))?;
    let log_dir = s.out.join("logs");
    std::fs::create_dir_all(&log_dir).with_context(|| format!("create {}", log_dir.display()))?;
    let work = tempfile::Builder::new()
        .prefix("memcolo-bench-")
        .tempdir()
        .context("create work directory")?;

    // zram first, so that it is torn down last (after every process is gone).
    let zram = if args.no_zram {
        eprintln!("warning: --no-zram: anonymous BE memory cannot be swapped out");
        None
    } else {
        match ZramSwap::setup("zram0", args.zram_size, 100)? {
            Ok(z) => {
                progress(
                    t0,
                    &format!("zram swap on /dev/zram0 ({})", format_bytes(args.zram_size)),
                );
                Some(z)
            }
            Err(why) => {
                eprintln!("warning: no zram swap: {why}");
                None
            }
        }
    };
    let mut node = ScratchNode::create_below_self("memcolo-bench", s.node_bytes)?;
    progress(
        t0,
        &format!(
            "node {} with limit {}",
            node.path().display(),
            format_bytes(s.node_bytes)
        ),
    );

    let max_file = s
        .levels
        .iter()
        .map(|&l| be_demand(l, s.node_bytes, s.split).file_bytes)
        .max()
        .unwrap_or(0);
    let data_file = {
        let prep = node.create_child("prep")?;
        let (p, written) = ensure_data_file(
            &args.data_dir,
            max_file.max(1 << 20),
            &Placement {
                cgroup: Some(&prep),
                cpus: None,
            },
        )?;
        node.remove_child("prep")?;
        progress(
            t0,
            &format!(
                "data file {} ({}{})",
                p.display(),
                format_bytes(std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0)),
                if written { ", written" } else { ", reused" }
            ),
        );
        p
    };
    let _data_guard = RemoveOnDrop(args.remove_data.then(|| data_file.clone()));

    let cpus = process::online_cpus();
    let (lc_cpus, be_cpus) = if !args.no_pin && cpus >= 2 {
        (Some(vec![0]), Some((1..cpus).collect::<Vec<_>>()))
    } else {
        (None, None)
    };
    // The load generator is the LC service's client: it runs on the LC CPUs, so that a
    // request and its answer do not cross to a BE CPU (and, in a VM, do not wait for a
    // halted vCPU to be woken). Threads created from here on inherit the mask.
    let _affinity = match &lc_cpus {
        Some(c) => Some(process::AffinityGuard::pin_current_thread(c)?),
        None => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let mut sweep = Sweep {
        s: &s,
        args,
        exe: memcolo_exe,
        rt,
        node,
        zram,
        data_file,
        work_dir: work.path().to_path_buf(),
        log_dir,
        lc_cpus,
        be_cpus,
        pool: Arc::new(value_pool(s.value_bytes, 0x5eed)),
        t0,
    };

    let solo_path = args
        .solo_csv
        .clone()
        .unwrap_or_else(|| s.out.join("solo.csv"));
    let mut solo = progress::read_solo_csv(&solo_path)?;
    let mut failure: Option<anyhow::Error> = None;
    if !args.no_solo {
        if let Err(e) = sweep.solo_baselines(&mut solo, &solo_path) {
            match e {
                BenchError::Interrupted => failure = Some(anyhow::anyhow!("interrupted")),
                e if !args.keep_going => failure = Some(anyhow::Error::new(e)),
                e => progress(t0, &format!("solo baselines: FAILED: {e}")),
            }
        }
    }

    let mut outcomes: Vec<RunOutcome> = Vec::new();
    // A failed or interrupted solo phase leaves no run to do.
    let levels: &[u32] = if failure.is_none() && !args.solo_only {
        &s.levels
    } else {
        &[]
    };
    'sweep: for &level in levels {
        for &mode in &s.modes {
            let label = format!("{level}% {}", mode.as_str());
            match sweep.run_one(level, mode) {
                Ok(mut o) => {
                    let d = be_demand(level, s.node_bytes, s.split);
                    let rate = |job| solo_rate_for(&solo, &s, &sweep.be_cpus, level, job);
                    progress::fill_progress(
                        &mut o.record,
                        d.file_bytes > 0,
                        d.anon_bytes > 0,
                        rate(BeJob::File),
                        rate(BeJob::Anon),
                    );
                    progress(
                        t0,
                        &format!(
                            "{label}: done: p50 {} µs, p90 {} µs, p99 {} µs, max {} µs, {:.0} req/s, node util {:.1}%",
                            o.record.p50_us,
                            o.record.p90_us,
                            o.record.p99_us,
                            o.record.max_us,
                            o.record.throughput_rps,
                            o.record.node_util * 100.0
                        ),
                    );
                    outcomes.push(o);
                }
                Err(BenchError::Interrupted) => {
                    progress(t0, &format!("{label}: interrupted; cleaning up"));
                    failure = Some(anyhow::anyhow!("interrupted"));
                    break 'sweep;
                }
                Err(e) => {
                    progress(t0, &format!("{label}: FAILED: {e}"));
                    outcomes.push(RunOutcome {
                        record: RunRecord {
                            level_pct: level,
                            mode: mode.as_str().into(),
                            status: format!("failed: {e}"),
                            node_bytes: s.node_bytes,
                            ..Default::default()
                        },
                        hist_us: None,
                    });
                    if !args.keep_going {
                        failure = Some(anyhow::Error::new(e).context(format!("run {label}")));
                        break 'sweep;
                    }
                }
            }
        }
    }

    // Results first (also partial ones), then the teardown by Drop. A solo-only
    // invocation leaves the directory's runs and report as they were.
    let written = if args.solo_only {
        progress(t0, &format!("solo baselines in {}", solo_path.display()));
        Ok(())
    } else {
        write_results(&s, args, &mut outcomes, t0)
    };
    drop(sweep);
    drop(work);
    progress(t0, "cleaned up (processes, cgroups, zram)");
    written?;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `memcolo bench reclaim`: [`run`] with the asynchronous-reclaim comparison as the
/// defaults (modes kernel, watermarks, fixed, reclaim; levels 0, 100, 125, 150 %;
/// output `bench/results/<date>-<host>/reclaim`). Options given explicitly win.
pub fn run_reclaim(args: &ColocationArgs, memcolo_exe: &Path) -> anyhow::Result<()> {
    if args.batch {
        return crate::batch::run(args, memcolo_exe);
    }
    let mut a = args.clone();
    if a.modes == [Mode::Kernel, Mode::Agent] {
        a.modes = vec![Mode::Kernel, Mode::Watermarks, Mode::Fixed, Mode::Reclaim];
    }
    if a.levels == [0, 50, 75, 100, 125, 150] {
        a.levels = vec![0, 100, 125, 150];
    }
    if a.out.is_none() {
        a.out = Some(default_out_dir(match a.lc {
            LcKind::Redis => "reclaim",
            LcKind::Memcached => "reclaim-memcached",
        }));
    }
    run(&a, memcolo_exe)
}

pub(crate) fn which(p: &Path) -> anyhow::Result<()> {
    if p.components().count() > 1 {
        if p.exists() {
            return Ok(());
        }
        bail!("{} does not exist", p.display());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join(p).is_file()) {
        Ok(())
    } else {
        bail!("{} not found in PATH", p.display())
    }
}

struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Removes a run's `lc/` and `be/` groups (killing what is left, dropping their page
/// cache), drops the page cache they leave charged to the node and, for a run that
/// raised the node's limit ([`Mode::NoPressure`]), puts the limit back.
struct RunGroups<'a> {
    node: &'a mut ScratchNode,
    restore_limit: Option<u64>,
}

impl Drop for RunGroups<'_> {
    fn drop(&mut self) {
        for c in ["be", "lc"] {
            if let Err(e) = self.node.remove_child(c) {
                eprintln!("warning: {e}");
            }
        }
        if let Err(e) = self.node.force_empty() {
            eprintln!("warning: {e}");
        }
        if let Some(limit) = self.restore_limit {
            if let Err(e) = self.node.set_limit(limit) {
                eprintln!("warning: cannot restore the node's limit: {e}");
            }
        }
    }
}

/// The node's limit for a run of `mode` at `level`: the node's memory, or for
/// [`Mode::NoPressure`] that plus the level's BE demand and 512 MiB (room for the
/// LC service's growth and the jobs' own overhead), so nothing is reclaimed.
fn run_limit_bytes(mode: Mode, level: u32, s: &Settings) -> u64 {
    match mode {
        Mode::NoPressure => {
            s.node_bytes + be_demand(level, s.node_bytes, s.split).total_bytes() + (512 << 20)
        }
        _ => s.node_bytes,
    }
}

/// The BE CPUs as a solo key names them: `1`, `1-3`, `1,3`; `all` when not pinned.
fn cpus_label(cpus: &Option<Vec<usize>>) -> String {
    let Some(c) = cpus else {
        return "all".into();
    };
    let contiguous = c.windows(2).all(|w| w[1] == w[0] + 1);
    match (c.first(), c.last()) {
        (Some(a), Some(b)) if a == b => a.to_string(),
        (Some(a), Some(b)) if contiguous => format!("{a}-{b}"),
        _ => c
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// The demand of one BE job at `level`: its share of the level's demand, the other
/// job's share zero.
fn job_demand(level: u32, s: &Settings, job: BeJob) -> BeDemand {
    let d = be_demand(level, s.node_bytes, s.split);
    match job {
        BeJob::File => BeDemand { anon_bytes: 0, ..d },
        BeJob::Anon => BeDemand { file_bytes: 0, ..d },
    }
}

/// The solo key of `job` at `level` in this sweep.
fn solo_key(s: &Settings, be_cpus: &Option<Vec<usize>>, level: u32, job: BeJob) -> SoloKey {
    SoloKey {
        job,
        demand_bytes: job_demand(level, s, job).total_bytes(),
        warmup_s: s.warmup.as_secs(),
        duration_s: s.duration.as_secs(),
        be_cpus: cpus_label(be_cpus),
    }
}

/// The solo rate of `job` at `level` from `solo`, per minute.
fn solo_rate_for(
    solo: &[SoloRecord],
    s: &Settings,
    be_cpus: &Option<Vec<usize>>,
    level: u32,
    job: BeJob,
) -> Option<f64> {
    progress::solo_rate(solo, &solo_key(s, be_cpus, level, job))
}

/// Puts the node back after a solo run: removes `be/`, drops the page cache left
/// charged to the node and restores the node's limit.
struct SoloGroup<'a> {
    node: &'a mut ScratchNode,
    limit_bytes: u64,
}

impl Drop for SoloGroup<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.node.remove_child("be") {
            eprintln!("warning: {e}");
        }
        if let Err(e) = self.node.force_empty() {
            eprintln!("warning: {e}");
        }
        if let Err(e) = self.node.set_limit(self.limit_bytes) {
            eprintln!("warning: cannot restore the node's limit: {e}");
        }
    }
}

/// One reading of a BE process: which job it belongs to, its reads and CPU time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct BeProcSample {
    /// The file streamer (fio), else the anonymous holder.
    streamer: bool,
    /// `rchar`: bytes read, page-cache hits included.
    rchar: u64,
    /// `read_bytes`: bytes fetched from storage (page-cache misses).
    read_bytes: u64,
    /// utime + stime, clock ticks.
    cpu_ticks: u64,
}

impl BeProcSample {
    fn read(pid: i32) -> Option<BeProcSample> {
        let (rchar, read_bytes) = process::read_io(pid).ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        Some(BeProcSample {
            streamer: comm.trim() == "fio",
            rchar,
            read_bytes,
            cpu_ticks: process::read_stat(pid).ok()?.cpu_ticks,
        })
    }
}

/// What the BE processes did in the measured phase, summed per job.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct BeWorkSummary {
    /// Bytes the streamer read, hits included.
    file_read: u64,
    /// Bytes the streamer fetched from storage.
    file_fetched: u64,
    /// CPU seconds of the streamer and of the holder.
    file_cpu_s: f64,
    anon_cpu_s: f64,
}

fn summarize_be(procs: &HashMap<i32, (BeProcSample, BeProcSample)>) -> BeWorkSummary {
    let hz = process::clock_ticks_per_s().max(1) as f64;
    let mut w = BeWorkSummary::default();
    for (a, b) in procs.values() {
        let cpu = b.cpu_ticks.saturating_sub(a.cpu_ticks) as f64 / hz;
        if b.streamer {
            w.file_read += b.rchar.saturating_sub(a.rchar);
            w.file_fetched += b.read_bytes.saturating_sub(a.read_bytes);
            w.file_cpu_s += cpu;
        } else {
            w.anon_cpu_s += cpu;
        }
    }
    w
}

/// Samples taken during the measured phase.
#[derive(Default)]
struct Samples {
    n: u64,
    usage_sum: f64,
    usage_max: u64,
    swap_max: u64,
    /// pid -> (first, last) reading of each BE process.
    be_procs: HashMap<i32, (BeProcSample, BeProcSample)>,
    timeline: Vec<TimelineRow>,
}

impl Sweep<'_> {
    fn place<'b>(cgroup: &'b Path, cpus: &'b Option<Vec<usize>>) -> Placement<'b> {
        Placement {
            cgroup: Some(cgroup),
            cpus: cpus.as_deref(),
        }
    }

    /// Runs the solo baselines of every BE job of every level of the sweep until each
    /// has `--solo-repeats` successful runs in `solo` (one attempt per missing run;
    /// repetitions interleaved over the levels and jobs), appending each to `solo` and
    /// rewriting `path` after each run (so an interrupted sweep keeps what it measured).
    fn solo_baselines(&mut self, solo: &mut Vec<SoloRecord>, path: &Path) -> Result<()> {
        let s = self.s;
        let want = self.args.solo_repeats as usize;
        let mut todo: Vec<(u32, BeJob, SoloKey, usize)> = Vec::new();
        for &level in &s.levels {
            for job in [BeJob::File, BeJob::Anon] {
                let key = solo_key(s, &self.be_cpus, level, job);
                let have = progress::solo_rates(solo, &key).len();
                if key.demand_bytes > 0 && have < want {
                    todo.push((level, job, key, want - have));
                }
            }
        }
        for round in 0..want {
            for (level, job, key, missing) in &todo {
                if round >= *missing {
                    continue;
                }
                let rec = self.run_solo(*level, *job, key)?;
                progress(
                    self.t0,
                    &format!(
                        "solo {level}% {}: {} {}/min{}, {:.1} CPU s",
                        job.as_str(),
                        rec.rate_per_min
                            .map(|r| format!("{r:.0}"))
                            .unwrap_or_else(|| "-".into()),
                        match job {
                            BeJob::File => "MiB",
                            BeJob::Anon => "ops",
                        },
                        rec.file_hit_ratio
                            .map(|h| format!(", {:.0} % page-cache hits", h * 100.0))
                            .unwrap_or_default(),
                        rec.cpu_s
                    ),
                );
                solo.push(rec);
                progress::write_solo_csv(path, solo)?;
            }
        }
        Ok(())
    }

    /// One BE job alone in `be/` on the BE CPUs, the node's limit raised above the
    /// job's demand (no memory pressure), with the phases of a colocated run: the
    /// job starts, 300 ms, the warm-up, the measured phase sampled every 250 ms.
    fn run_solo(&mut self, level: u32, job: BeJob, key: &SoloKey) -> Result<SoloRecord> {
        let s = self.s;
        let tag = format!("solo-{level}-{}", job.as_str());
        crate::signal::check()?;
        let demand = job_demand(level, s, job);
        let limit = s.node_bytes.max(demand.total_bytes() + (512 << 20));
        progress(
            self.t0,
            &format!(
                "{tag}: {} alone, node limit {}",
                format_bytes(demand.total_bytes()),
                format_bytes(limit)
            ),
        );
        self.node.set_limit(limit)?;
        let be = match self.node.create_child("be") {
            Ok(b) => b,
            Err(e) => {
                let _ = self.node.set_limit(s.node_bytes);
                return Err(e);
            }
        };
        let group = SoloGroup {
            node: &mut self.node,
            limit_bytes: s.node_bytes,
        };
        let mut jobs = BeJobs::start(
            demand,
            &self.data_file,
            s.warmup + s.duration + Duration::from_secs(30),
            &Self::place(&be, &self.be_cpus),
            &self.log_dir,
            &tag,
        )?;
        crate::signal::sleep(Duration::from_millis(300) + s.warmup)?;
        let hits0 = group.node.limit_hits()?;
        let loadavg = process::loadavg_1m().unwrap_or(0.0);
        let cpu_before = process::read_cpu_times();
        let mut procs: HashMap<i32, (BeProcSample, BeProcSample)> = HashMap::new();
        let mut usage_max = 0u64;
        let start = Instant::now();
        loop {
            if let Ok(u) = group.node.usage_bytes() {
                usage_max = usage_max.max(u);
            }
            for pid in read_procs(&be).unwrap_or_default() {
                if let Some(r) = BeProcSample::read(pid) {
                    procs.entry(pid).or_insert((r, r)).1 = r;
                }
            }
            if start.elapsed() >= s.duration {
                break;
            }
            crate::signal::sleep(Duration::from_millis(250).min(s.duration - start.elapsed()))?;
        }
        let hits = group.node.limit_hits()?.saturating_sub(hits0);
        let cpu_busy_pct = match (cpu_before, process::read_cpu_times()) {
            (Some(a), Some(b)) if b.total > a.total => {
                (1.0 - (b.idle - a.idle) as f64 / (b.total - a.total) as f64) * 100.0
            }
            _ => 0.0,
        };
        let work = jobs.stop(Duration::ZERO)?;
        drop(group);
        let be_work = summarize_be(&procs);
        let measured_s = s.duration.as_secs_f64();
        let (rate, hit_ratio, cpu_s) = match job {
            BeJob::File => (
                (be_work.file_read > 0)
                    .then(|| be_work.file_read as f64 / (1u64 << 20) as f64 / measured_s * 60.0),
                (be_work.file_read > 0).then(|| {
                    1.0 - (be_work.file_fetched as f64 / be_work.file_read as f64).min(1.0)
                }),
                be_work.file_cpu_s,
            ),
            BeJob::Anon => (work.anon_ops_per_min, None, be_work.anon_cpu_s),
        };
        Ok(SoloRecord {
            job,
            level_pct: level,
            demand_bytes: key.demand_bytes,
            warmup_s: key.warmup_s,
            duration_s: key.duration_s,
            be_cpus: key.be_cpus.clone(),
            status: if rate.is_some() {
                "ok".into()
            } else {
                format!("failed: no {} rate", job.as_str())
            },
            limit_bytes: limit,
            rate_per_min: rate,
            file_hit_ratio: hit_ratio,
            cpu_s,
            node_usage_max_bytes: usage_max,
            node_limit_hits: hits,
            loadavg_1m: loadavg,
            cpu_busy_pct,
        })
    }

    fn run_one(&mut self, level: u32, mode: Mode) -> Result<RunOutcome> {
        let s = self.s;
        let t0 = self.t0;
        let label = format!("{level}% {}", mode.as_str());
        let tag = format!("{level}-{}", mode.as_str());
        crate::signal::check()?;
        progress(t0, &format!("{label}: start"));
        let oom_before = self.node.oom_kills().unwrap_or(0);
        let node_path = self.node.path().to_path_buf();
        let limit = run_limit_bytes(mode, level, s);
        if limit != s.node_bytes {
            progress(
                t0,
                &format!(
                    "{label}: node limit raised to {} (no memory pressure)",
                    format_bytes(limit)
                ),
            );
            self.node.set_limit(limit)?;
        }
        let restore_limit = (limit != s.node_bytes).then_some(s.node_bytes);
        let lc = match self.node.create_child("lc") {
            Ok(l) => l,
            Err(e) => {
                if let Some(l) = restore_limit {
                    let _ = self.node.set_limit(l);
                }
                return Err(e);
            }
        };
        let be = match self.node.create_child("be") {
            Ok(b) => b,
            Err(e) => {
                let _ = self.node.remove_child("lc");
                if let Some(l) = restore_limit {
                    let _ = self.node.set_limit(l);
                }
                return Err(e);
            }
        };
        let groups = RunGroups {
            node: &mut self.node,
            restore_limit,
        };

        let event_log = s.out.join(format!("events-{tag}.jsonl"));
        let mut agent = None;
        let _sysctl = if mode == Mode::Watermarks {
            let kib = mem_total_bytes() / 1024 / 50;
            Some(SysctlGuard::set(&[
                ("vm.watermark_scale_factor", "1000".to_string()),
                ("vm.min_free_kbytes", kib.to_string()),
            ])?)
        } else {
            None
        };
        if mode.uses_agent() {
            let _ = std::fs::remove_file(&event_log);
            let mut extra = self.args.agent_args.clone();
            if let Some(toml) = mode.agent_config(s.node_bytes, &self.args.reclaim_set) {
                let path = self.work_dir.join(format!("agent-{tag}.toml"));
                std::fs::write(&path, toml).map_err(|e| BenchError::io(&path, e))?;
                extra.push("--config".into());
                extra.push(path.display().to_string());
            }
            let spec = AgentSpec {
                exe: self.exe,
                scope_cgroup: &node_path,
                work_dir: &self.work_dir,
                event_log: &event_log,
                log: &self.log_dir.join(format!("agent-{tag}.log")),
                extra_args: &extra,
            };
            // All CPUs: the bench's own threads are pinned to the LC CPUs and a child
            // would inherit that.
            let all: Vec<usize> = (0..process::online_cpus()).collect();
            agent = Some(AgentProcess::start(
                &spec,
                &Placement {
                    cgroup: None,
                    cpus: Some(&all),
                },
                Duration::from_secs(15),
            )?);
            progress(t0, &format!("{label}: agent up"));
        }

        let lc_kind = self.args.lc;
        let mut redis = LcServer::start(
            lc_kind,
            match lc_kind {
                LcKind::Redis => &self.args.redis_server,
                LcKind::Memcached => &self.args.memcached,
            },
            &Self::place(&lc, &self.lc_cpus),
            &self.log_dir.join(format!("{}-{tag}.log", lc_kind.as_str())),
            (s.node_bytes / 2) >> 20,
        )?;
        let conns = self
            .rt
            .block_on(redis.connect(s.connections, Duration::from_secs(15)))?;
        {
            let mut c = conns[0].clone();
            self.rt
                .block_on(preload(&mut c, s.keys, s.value_bytes, &self.pool))?;
        }
        let mut next_key = s.keys;
        progress(
            t0,
            &format!(
                "{label}: {} pid {} preloaded with {} keys",
                lc_kind.as_str(),
                redis.pid(),
                s.keys
            ),
        );
        let mut registered: Vec<i32> = Vec::new();
        if let Some(a) = &agent {
            a.register(redis.pid(), Class::Lc, lc_kind.as_str())?;
            registered.push(redis.pid());
        }

        let demand: BeDemand = be_demand(level, s.node_bytes, s.split);
        // The jobs outlive the measured phase and are stopped after it: a job exiting
        // (freeing, swap slots released) must not fall into the last measured second.
        let mut jobs = BeJobs::start(
            demand,
            &self.data_file,
            s.warmup + s.duration + Duration::from_secs(30),
            &Self::place(&be, &self.be_cpus),
            &self.log_dir,
            &tag,
        )?;
        if demand.total_bytes() > 0 {
            progress(
                t0,
                &format!(
                    "{label}: BE jobs {:?} (file {}, anon {})",
                    jobs.leader_pids(),
                    format_bytes(demand.file_bytes),
                    format_bytes(demand.anon_bytes)
                ),
            );
        }
        let register_be = |agent: &Option<AgentProcess>, registered: &mut Vec<i32>| -> Result<()> {
            let Some(a) = agent else { return Ok(()) };
            for pid in read_procs(&be)? {
                if !registered.contains(&pid) {
                    // A worker may exit between the listing and the request.
                    if let Err(e) = a.register(pid, Class::Be, "be-job") {
                        eprintln!("warning: {e}");
                    }
                    registered.push(pid);
                }
            }
            Ok(())
        };
        crate::signal::sleep(Duration::from_millis(300))?;
        register_be(&agent, &mut registered)?;

        let base_spec = LoadSpec {
            rate_per_s: s.rate_per_s,
            duration: s.warmup,
            set_ratio: s.set_ratio,
            value_bytes: s.value_bytes,
            timeout: s.timeout,
            max_in_flight: 100_000,
            seed: level as u64 * 1000 + mode as u64,
        };
        if !s.warmup.is_zero() {
            progress(t0, &format!("{label}: warm-up {} s", s.warmup.as_secs()));
            run_open_loop(&self.rt, &conns, &base_spec, &mut next_key, &self.pool)?;
            redis.check_alive()?;
        }
        register_be(&agent, &mut registered)?;

        // CLOCK_MONOTONIC at the start of the measured phase: a `perf record -k mono`
        // trace (trace_run.sh) puts the latency CSV's second i at this + i.
        progress(
            t0,
            &format!(
                "{label}: measured {} s from CLOCK_MONOTONIC {:.6}",
                s.duration.as_secs(),
                monotonic_s()
            ),
        );
        let loadavg = process::loadavg_1m().unwrap_or(0.0);
        let cpu_before = process::read_cpu_times();
        let redis_pid = redis.pid();
        let stat_before = process::read_stat(redis_pid)?;
        let sched_before = process::read_schedstat(redis_pid).ok();
        let lc_cpus = &self.lc_cpus;
        let cpu_use_before = LcCpuUse::read(lc_cpus, redis_pid);
        let hits_before = groups.node.limit_hits().ok();
        let measure_spec = LoadSpec {
            duration: s.duration,
            seed: base_spec.seed + 1,
            ..base_spec
        };
        let sampling = AtomicBool::new(true);
        let agent_socket = agent.as_ref().map(|a| a.socket().to_path_buf());
        let node_ref: &ScratchNode = groups.node;
        let zram = &self.zram;
        let (load, samples) = std::thread::scope(|sc| {
            let sampler = sc.spawn(|| {
                let mut smp = Samples::default();
                let t_start = Instant::now();
                while sampling.load(Ordering::Relaxed) {
                    let mut row = TimelineRow {
                        t_s: t_start.elapsed().as_secs_f64(),
                        ..Default::default()
                    };
                    if let Ok(u) = node_ref.usage_bytes() {
                        smp.n += 1;
                        smp.usage_sum += u as f64;
                        smp.usage_max = smp.usage_max.max(u);
                        row.usage_bytes = u;
                        row.headroom_bytes = s.node_bytes.saturating_sub(u);
                    }
                    if let Some(z) = zram {
                        let used = z.used_bytes();
                        smp.swap_max = smp.swap_max.max(used);
                        row.swap_bytes = used;
                    }
                    if let Some(sock) = &agent_socket {
                        if let Ok(st) = crate::agent::status(sock) {
                            row.set_reclaim(&st);
                        }
                    }
                    row.node_limit_hits = match (hits_before, node_ref.limit_hits()) {
                        (Some(a), Ok(b)) => Some(b.saturating_sub(a)),
                        _ => None,
                    };
                    row.lc_major_faults = process::read_stat(redis_pid)
                        .ok()
                        .map(|st| st.major_faults.saturating_sub(stat_before.major_faults));
                    if let (Some((e0, w0)), Ok((e, w))) =
                        (sched_before, process::read_schedstat(redis_pid))
                    {
                        row.lc_run_delay_ms = Some(w.saturating_sub(w0) as f64 / 1e6);
                        row.lc_cpu_ms = Some(e.saturating_sub(e0) as f64 / 1e6);
                    }
                    if let (Some(a), Some(b)) = (cpu_use_before, LcCpuUse::read(lc_cpus, redis_pid))
                    {
                        let d = a.since(&b);
                        row.lc_cpus_busy_ms = Some(d.busy_ms);
                        row.lc_cpus_foreign_ms = Some(d.foreign_ms);
                        row.lc_cpus_steal_ms = Some(d.steal_ms);
                    }
                    smp.timeline.push(row);
                    for pid in read_procs(&be).unwrap_or_default() {
                        if let Some(r) = BeProcSample::read(pid) {
                            smp.be_procs.entry(pid).or_insert((r, r)).1 = r;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                smp
            });
            let load = run_open_loop(&self.rt, &conns, &measure_spec, &mut next_key, &self.pool);
            sampling.store(false, Ordering::Relaxed);
            (load, sampler.join().expect("sampler thread"))
        });
        let load = load?;
        let stat_after = process::read_stat(redis_pid).unwrap_or(stat_before);
        let node_limit_hits = match (hits_before, groups.node.limit_hits()) {
            (Some(a), Ok(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        let lc_cpu_delta = match (cpu_use_before, LcCpuUse::read(lc_cpus, redis_pid)) {
            (Some(a), Some(b)) => Some(a.since(&b)),
            _ => None,
        };
        let lc_cpu_ms = s.duration.as_secs_f64()
            * 1000.0
            * lc_cpus.as_ref().map_or(1, |c| c.len().max(1)) as f64;
        let lc_cpus_foreign_pct = lc_cpu_delta.map(|d| d.foreign_ms / lc_cpu_ms * 100.0);
        let lc_cpus_steal_ms = lc_cpu_delta.map(|d| d.steal_ms);
        let steal_free =
            lc_cpu_delta.map(|_| steal_free_latency(&samples.timeline, &load.per_sec_us));
        let lc_run_delay_ms = match (sched_before, process::read_schedstat(redis_pid)) {
            (Some((_, w0)), Ok((_, w))) => Some(w.saturating_sub(w0) as f64 / 1e6),
            _ => None,
        };
        let (steal_pct, cpu_busy_pct) = match (cpu_before, process::read_cpu_times()) {
            (Some(a), Some(b)) if b.total > a.total => {
                let d = (b.total - a.total) as f64;
                (
                    (b.steal - a.steal) as f64 / d * 100.0,
                    (1.0 - (b.idle - a.idle) as f64 / d) * 100.0,
                )
            }
            _ => (0.0, 0.0),
        };
        let redis_rss = process::read_status_mem(redis_pid)
            .map(|m| m.rss_kib * 1024)
            .unwrap_or(0);
        let redis_alive = redis.check_alive();

        let reclaim_totals = agent
            .as_ref()
            .and_then(|a| crate::agent::status(a.socket()).ok())
            .and_then(|st| {
                let r = &st["reclaim"];
                Some((
                    r["reclaimed_bytes_total"].as_u64()?,
                    r["cpu_seconds_total"].as_f64()?,
                ))
            });
        write_timelines(&s.out, &tag, &samples.timeline, &load.per_sec_us)?;
        progress(t0, &format!("{label}: teardown"));
        let work = jobs.stop(Duration::ZERO)?;
        let agent_kills = match agent.take() {
            Some(a) => {
                a.stop(Duration::from_secs(10))?;
                Some(
                    std::fs::read_to_string(&event_log)
                        .map(|t| count_kills(&t))
                        .unwrap_or(0),
                )
            }
            None => None,
        };
        let oom_after = groups.node.oom_kills().unwrap_or(oom_before);
        drop(conns);
        drop(redis);
        drop(groups);

        let measured_s = s.duration.as_secs_f64();
        let be = summarize_be(&samples.be_procs);
        let be_read = be.file_read;
        let mut record = RunRecord {
            level_pct: level,
            mode: mode.as_str().into(),
            status: match (&redis_alive, &load.first_error) {
                (Err(e), _) => format!("failed: {e}"),
                _ => "ok".into(),
            },
            node_bytes: s.node_bytes,
            be_file_bytes: demand.file_bytes,
            be_anon_bytes: demand.anon_bytes,
            requests: load.scheduled,
            requests_ok: load.ok,
            errors: load.errors,
            dropped: load.dropped,
            throughput_rps: load.throughput_rps(),
            be_file_mib_per_min: be_read as f64 / (1u64 << 20) as f64 / measured_s * 60.0,
            be_anon_ops_per_min: work.anon_ops_per_min,
            be_file_hit_ratio: (be.file_read > 0)
                .then(|| 1.0 - (be.file_fetched as f64 / be.file_read as f64).min(1.0)),
            be_file_cpu_s: be.file_cpu_s,
            be_anon_cpu_s: be.anon_cpu_s,
            node_util: if samples.n > 0 {
                samples.usage_sum / samples.n as f64 / s.node_bytes as f64
            } else {
                0.0
            },
            node_usage_max_bytes: samples.usage_max,
            swap_used_max_bytes: samples.swap_max,
            redis_major_faults: stat_after
                .major_faults
                .saturating_sub(stat_before.major_faults),
            redis_rss_bytes: redis_rss,
            oom_kills: oom_after.saturating_sub(oom_before),
            agent_kills,
            loadavg_1m: loadavg,
            steal_pct,
            cpu_busy_pct,
            reclaim_bytes: reclaim_totals.map(|t| t.0),
            reclaim_cpu_s: reclaim_totals.map(|t| t.1),
            reclaim_cpu_s_per_gib: reclaim_totals
                .filter(|t| t.0 > 0)
                .map(|t| t.1 / (t.0 as f64 / (1u64 << 30) as f64)),
            lc_service: lc_kind.as_str().into(),
            node_limit_hits,
            lc_run_delay_ms,
            lc_cpus_foreign_pct,
            lc_cpus_steal_ms,
            lc_steal_seconds: steal_free.as_ref().map(|f| f.steal_seconds),
            lc_measured_seconds: steal_free.as_ref().map(|f| f.seconds),
            p99_steal_free_us: steal_free.as_ref().and_then(|f| f.p99_us),
            steal_free_request_share: steal_free.as_ref().map(|f| f.request_share),
            ..Default::default()
        };
        if let Some(e) = &load.first_error {
            eprintln!(
                "warning: {label}: {} request errors, first: {e}",
                load.errors
            );
        }
        report::fill_latency(&mut record, &load.hist_us);
        Ok(RunOutcome {
            record,
            hist_us: Some(load.hist_us),
        })
    }
}

/// One 250 ms sample of the measured phase.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub(crate) struct TimelineRow {
    pub t_s: f64,
    pub usage_bytes: u64,
    pub headroom_bytes: u64,
    pub swap_bytes: u64,
    pub workers_desired: Option<u64>,
    pub workers_active: Option<u64>,
    pub low_mark_bytes: Option<u64>,
    pub high_mark_bytes: Option<u64>,
    pub reclaim_state: Option<String>,
    /// Charges that found the node at its limit since the phase began
    /// (`memory.failcnt`): each one reclaimed on the charging task's own thread.
    pub node_limit_hits: Option<u64>,
    /// The LC service's major faults since the phase began.
    pub lc_major_faults: Option<u64>,
    /// Time the LC service's main thread waited runnable for a CPU since the phase
    /// began (`/proc/<pid>/schedstat`), ms; and the CPU time it ran, ms.
    pub lc_run_delay_ms: Option<f64>,
    pub lc_cpu_ms: Option<f64>,
    /// Busy time of the LC CPUs since the phase began, ms, and the part of it that
    /// neither the LC service nor this bench (its load generator) ran: other work on
    /// the LC CPUs (the agent stays off them), see [`LcCpuUse`].
    pub lc_cpus_busy_ms: Option<f64>,
    pub lc_cpus_foreign_ms: Option<f64>,
    /// Host steal on the LC CPUs since the phase began, ms (`/proc/stat` `steal`,
    /// 10 ms ticks): time their vCPUs wanted to run while the host ran something else.
    pub lc_cpus_steal_ms: Option<f64>,
}

/// Counters from which the LC CPUs' busy time and its foreign part follow: the BE
/// CPUs are saturated by the BE jobs, so the scheduler balances every other runnable
/// task of the machine (builds, tests, kernel threads) onto the LC CPUs, where it
/// queues in front of the LC service. `/proc/stat` busy ticks of the LC CPUs minus
/// the LC service's and this process's CPU ticks, in ticks. A lower bound on the
/// foreign part: this process's threads are subtracted wherever they ran, and the load
/// generator's runtime threads run on the BE CPUs at times.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LcCpuUse {
    busy: u64,
    own: u64,
    steal: u64,
}

/// What the LC CPUs did between two [`LcCpuUse`] readings, ms.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LcCpuDelta {
    /// Busy (not idle, iowait or steal).
    pub busy_ms: f64,
    /// The busy part neither the LC service nor this bench ran (a lower bound).
    pub foreign_ms: f64,
    /// Host steal: the vCPU wanted to run and the host ran something else
    /// (`/proc/stat` `steal`, 10 ms ticks).
    pub steal_ms: f64,
}

impl LcCpuUse {
    pub(crate) fn read(lc_cpus: &Option<Vec<usize>>, lc_pid: i32) -> Option<LcCpuUse> {
        let (busy, steal) = process::read_cpus_busy_steal_ticks(lc_cpus.as_deref()?)?;
        let lc = process::read_stat(lc_pid).ok()?.cpu_ticks;
        let me = process::read_stat(std::process::id() as i32)
            .ok()?
            .cpu_ticks;
        Some(LcCpuUse {
            busy,
            own: lc + me,
            steal,
        })
    }

    /// What the LC CPUs did from `self` to `later`.
    pub(crate) fn since(&self, later: &LcCpuUse) -> LcCpuDelta {
        let ms = 1000.0 / process::clock_ticks_per_s().max(1) as f64;
        let busy = later.busy.saturating_sub(self.busy);
        let own = later.own.saturating_sub(self.own);
        LcCpuDelta {
            busy_ms: busy as f64 * ms,
            foreign_ms: busy.saturating_sub(own) as f64 * ms,
            steal_ms: later.steal.saturating_sub(self.steal) as f64 * ms,
        }
    }
}

/// The LC latency over the seconds of the measured phase in which the LC CPUs saw no
/// host steal, beside the verdict's figure over all requests (which stays the
/// verdict): it puts a number on how much of a tail the host's steal explains.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct StealFreeLatency {
    /// Seconds (by the requests' due time) with at least one steal tick on the LC CPUs.
    pub steal_seconds: u32,
    /// Seconds with requests.
    pub seconds: u32,
    /// p99 of the requests due in the seconds without steal, µs (`None`: none such).
    pub p99_us: Option<u64>,
    /// Their share of all requests.
    pub request_share: f64,
}

/// [`StealFreeLatency`] from the timeline's cumulative LC-CPU steal
/// (`rows[i].lc_cpus_steal_ms` at `rows[i].t_s`, both from the start of the measured
/// phase) and the per-second latency histograms (index = second of due time). Steal
/// that rose between two samples marks every second the interval touches; a second
/// past the last sample counts as stolen when the last interval had steal, and as
/// clean otherwise.
pub(crate) fn steal_free_latency(
    rows: &[TimelineRow],
    per_sec: &[hdrhistogram::Histogram<u64>],
) -> StealFreeLatency {
    let mut stolen = vec![false; per_sec.len()];
    let mut prev = (0.0f64, 0.0f64);
    for r in rows {
        let Some(steal) = r.lc_cpus_steal_ms else {
            continue;
        };
        if steal > prev.1 {
            let from = prev.0.max(0.0).floor() as usize;
            let to = r.t_s.max(0.0).floor() as usize;
            for s in stolen.iter_mut().take(to + 1).skip(from) {
                *s = true;
            }
        }
        prev = (r.t_s, steal);
    }
    let mut h = crate::loadgen::new_histogram();
    let (mut all, mut out) = (0u64, StealFreeLatency::default());
    for (sec, hs) in per_sec.iter().enumerate() {
        if hs.is_empty() {
            continue;
        }
        out.seconds += 1;
        all += hs.len();
        if stolen[sec] {
            out.steal_seconds += 1;
        } else {
            let _ = h.add(hs);
        }
    }
    out.p99_us = (!h.is_empty()).then(|| h.value_at_quantile(0.99));
    out.request_share = if all > 0 {
        h.len() as f64 / all as f64
    } else {
        0.0
    };
    out
}

impl TimelineRow {
    /// Fills the reclaim columns from the agent's `status` answer.
    pub(crate) fn set_reclaim(&mut self, status: &serde_json::Value) {
        let r = &status["reclaim"];
        self.workers_desired = r["workers_desired"].as_u64();
        self.workers_active = r["workers_active"].as_u64();
        self.low_mark_bytes = r["low_mark_bytes"].as_u64();
        self.high_mark_bytes = r["high_mark_bytes"].as_u64();
        self.reclaim_state = r["state"].as_str().map(String::from);
    }
}

/// `timeline-<tag>.csv`: node memory, reclaim workers and marks every 250 ms.
pub(crate) fn write_timeline(out: &Path, tag: &str, rows: &[TimelineRow]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)
            .map_err(|e| BenchError::Process(format!("timeline csv: {e}")))?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| BenchError::Process(format!("timeline csv: {e}")))?;
    let p = out.join(format!("timeline-{tag}.csv"));
    std::fs::write(&p, bytes).map_err(|e| BenchError::io(&p, e))
}

/// [`write_timeline`] and `latency-<tag>.csv` (per-second p50/p99/p99.9/max of
/// requests due in that second).
fn write_timelines(
    out: &Path,
    tag: &str,
    rows: &[TimelineRow],
    per_sec: &[hdrhistogram::Histogram<u64>],
) -> Result<()> {
    write_timeline(out, tag, rows)?;
    let mut text = String::from("second,requests,p50_us,p99_us,p999_us,max_us\n");
    for (i, h) in per_sec.iter().enumerate() {
        if h.is_empty() {
            continue;
        }
        text.push_str(&format!(
            "{i},{},{},{},{},{}\n",
            h.len(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max()
        ));
    }
    let p = out.join(format!("latency-{tag}.csv"));
    std::fs::write(&p, text).map_err(|e| BenchError::io(&p, e))
}

fn write_results(
    s: &Settings,
    args: &ColocationArgs,
    outcomes: &mut [RunOutcome],
    t0: Instant,
) -> anyhow::Result<()> {
    let records: Vec<RunRecord> = outcomes.iter().map(|o| o.record.clone()).collect();
    let slo = report::choose_slo(&records, args.slo_us);
    if let Some((us, _)) = &slo {
        report::apply_slo(outcomes, *us);
    }
    let records: Vec<RunRecord> = outcomes.iter().map(|o| o.record.clone()).collect();
    report::write_file(&s.out, "runs.csv", &report::runs_csv(&records)?)?;
    report::write_file(
        &s.out,
        "percentiles.csv",
        &report::percentiles_csv(outcomes),
    )?;
    let mut notes = Vec::new();
    let plots = if args.no_plot || records.is_empty() {
        Vec::new()
    } else {
        match plot(&s.out) {
            Ok(p) => p,
            Err(e) => {
                let msg = format!("plots skipped: {e:#}");
                eprintln!("warning: {msg}");
                notes.push(msg);
                Vec::new()
            }
        }
    };
    let ctx = ReportContext {
        date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        host: hostname(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        cpus: process::online_cpus(),
        mem_total_bytes: mem_total_bytes(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        parameters: vec![
            ("levels (%)".into(), format!("{:?}", s.levels)),
            (
                "modes".into(),
                s.modes
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            ("node memory".into(), format_bytes(s.node_bytes)),
            ("BE split file:anon".into(), s.split.to_string()),
            (
                "warm-up / measured".into(),
                format!("{} s / {} s", s.warmup.as_secs(), s.duration.as_secs()),
            ),
            (
                "rate".into(),
                format!(
                    "{} req/s, open loop, {} connections",
                    s.rate_per_s, s.connections
                ),
            ),
            (
                "requests".into(),
                format!(
                    "{:.0} % SET of a new key, rest GET of a random key",
                    s.set_ratio * 100.0
                ),
            ),
            (
                "dataset".into(),
                format!(
                    "{}: {} keys × {} B values",
                    args.lc.as_str(),
                    s.keys,
                    s.value_bytes
                ),
            ),
            (
                "pinning".into(),
                if args.no_pin {
                    "none".into()
                } else {
                    format!("{} on CPU 0, BE jobs on the other CPUs", args.lc.as_str())
                },
            ),
            (
                "zram".into(),
                if args.no_zram {
                    "off".into()
                } else {
                    format_bytes(args.zram_size)
                },
            ),
        ],
        slo: slo.clone(),
        notes,
        plots,
    };
    report::write_file(&s.out, "report.md", &report::markdown(&ctx, &records))?;
    println!("{}", report::table(&records));
    print!("{}", report::be_progress_section(&records));
    match &slo {
        Some((us, src)) => println!("SLO {us} µs ({src})"),
        None => println!("SLO: none"),
    }
    progress(t0, &format!("results in {}", s.out.display()));
    Ok(())
}

pub(crate) fn mem_total_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|k| k * 1024)
        .unwrap_or(0)
}

/// The plot script, built in so the binary does not depend on the source tree.
const PLOT_PY: &str = include_str!("../../../bench/colocation/plot.py");

/// Runs the plot script on `out`; returns the PNG names it wrote.
fn plot(out: &Path) -> anyhow::Result<Vec<String>> {
    let script = out.join(".plot.py");
    std::fs::write(&script, PLOT_PY).with_context(|| format!("write {}", script.display()))?;
    let mut last_err = String::from("no python3 found");
    let mut result = None;
    for py in ["/usr/bin/python3", "python3"] {
        match Command::new(py).arg(&script).arg(out).output() {
            Ok(o) if o.status.success() => {
                result = Some(String::from_utf8_lossy(&o.stdout).to_string());
                break;
            }
            Ok(o) => last_err = format!("{py}: {}", String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => last_err = format!("{py}: {e}"),
        }
    }
    let _ = std::fs::remove_file(&script);
    let stdout = result.ok_or_else(|| anyhow::anyhow!(last_err))?;
    Ok(stdout
        .lines()
        .filter(|l| l.ends_with(".png"))
        .map(|l| l.trim().to_string())
        .collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: ColocationArgs,
    }

    /// Parses `argv` (without the program name) as `memcolo bench colocation|reclaim`
    /// arguments; shared with the batch experiment's tests.
    pub(crate) fn parse(argv: &[&str]) -> ColocationArgs {
        Cli::try_parse_from(std::iter::once("x").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn defaults_and_quick() {
        let full = Settings::resolve(&parse(&[])).unwrap();
        assert_eq!(full.levels, vec![0, 50, 75, 100, 125, 150]);
        assert_eq!(full.modes, vec![Mode::Kernel, Mode::Agent]);
        assert_eq!(full.node_bytes, 4 << 30);
        assert_eq!(full.duration, Duration::from_secs(60));
        let quick = Settings::resolve(&parse(&["--quick"])).unwrap();
        assert_eq!(quick.node_bytes, 2 << 30);
        assert_eq!(quick.duration, Duration::from_secs(6));
        // Explicit options win over --quick.
        let q =
            Settings::resolve(&parse(&["--quick", "--node-mem", "3GiB", "--rate", "500"])).unwrap();
        assert_eq!(q.node_bytes, 3 << 30);
        assert_eq!(q.rate_per_s, 500.0);
        let m = Settings::resolve(&parse(&["--modes", "kernel", "--levels", "0,100"])).unwrap();
        assert_eq!(m.modes, vec![Mode::Kernel]);
        assert_eq!(m.levels, vec![0, 100]);
    }

    #[test]
    fn no_pressure_raises_the_limit_above_the_level_demand_only() {
        let s = Settings::resolve(&parse(&[
            "--quick",
            "--modes",
            "kernel,reclaim,no-pressure",
        ]))
        .unwrap();
        assert_eq!(s.modes[2], Mode::NoPressure);
        assert_eq!(Mode::NoPressure.as_str(), "no-pressure");
        assert!(!Mode::NoPressure.uses_agent());
        let node = 2u64 << 30;
        // 100 %: BE demand ~ the node's memory (each job's share rounded down to MiB),
        // so the limit is about 2 x node + 512 MiB.
        let demand = be_demand(100, node, s.split).total_bytes();
        assert!(demand > node - (2 << 20) && demand <= node);
        assert_eq!(
            run_limit_bytes(Mode::NoPressure, 100, &s),
            node + demand + (512 << 20)
        );
        assert_eq!(run_limit_bytes(Mode::NoPressure, 0, &s), node + (512 << 20));
        for m in [Mode::Kernel, Mode::Reclaim, Mode::Fixed, Mode::Watermarks] {
            assert_eq!(run_limit_bytes(m, 150, &s), node);
        }
    }

    #[test]
    fn be_work_is_summed_per_job_with_hits_and_cpu() {
        let s = |streamer, rchar, read_bytes, cpu_ticks| BeProcSample {
            streamer,
            rchar,
            read_bytes,
            cpu_ticks,
        };
        let hz = process::clock_ticks_per_s() as f64;
        let procs: HashMap<i32, (BeProcSample, BeProcSample)> = [
            // fio's parent (reads nothing) and its job process.
            (10, (s(true, 5, 0, 1), s(true, 5, 0, 2))),
            (
                11,
                (s(true, 1000, 100, 10), s(true, 9000, 900, 10 + hz as u64)),
            ),
            // stress-ng's worker.
            (12, (s(false, 0, 0, 0), s(false, 0, 0, 3 * hz as u64))),
        ]
        .into();
        let w = summarize_be(&procs);
        assert_eq!((w.file_read, w.file_fetched), (8000, 800));
        assert!((w.file_cpu_s - (1.0 + 1.0 / hz)).abs() < 1e-9, "{w:?}");
        assert!((w.anon_cpu_s - 3.0).abs() < 1e-9, "{w:?}");
    }

    #[test]
    fn solo_keys_name_the_cpus_and_one_job_s_demand() {
        assert_eq!(cpus_label(&None), "all");
        assert_eq!(cpus_label(&Some(vec![1])), "1");
        assert_eq!(cpus_label(&Some(vec![1, 2, 3])), "1-3");
        assert_eq!(cpus_label(&Some(vec![1, 3])), "1,3");
        let s = Settings::resolve(&parse(&["--quick", "--duration-s", "15"])).unwrap();
        let k = solo_key(&s, &Some(vec![1]), 150, BeJob::File);
        // 150 % of 2 GiB split 2:1: the streamer's 2 GiB.
        assert_eq!(k.demand_bytes, 2 << 30);
        assert_eq!((k.warmup_s, k.duration_s, k.be_cpus.as_str()), (4, 15, "1"));
        assert_eq!(solo_key(&s, &None, 150, BeJob::Anon).demand_bytes, 1 << 30);
        assert_eq!(solo_key(&s, &None, 0, BeJob::Anon).demand_bytes, 0);
    }

    #[test]
    fn steal_free_latency_leaves_out_the_seconds_with_steal_only() {
        let row = |t_s: f64, steal: f64| TimelineRow {
            t_s,
            lc_cpus_steal_ms: Some(steal),
            ..Default::default()
        };
        // Steal rises in (1.75, 2.0] and in (3.9, 4.1]: seconds 1, 2, 3 and 4.
        let rows = [
            row(0.0, 0.0),
            row(1.75, 0.0),
            row(2.0, 10.0),
            row(3.9, 10.0),
            row(4.1, 20.0),
        ];
        let mut per_sec = Vec::new();
        for sec in 0..6u64 {
            let mut h = crate::loadgen::new_histogram();
            for i in 0..100u64 {
                // Stolen seconds carry a 50 ms tail in 10 % of their requests.
                let slow = (1..=4).contains(&sec) && i < 10;
                h.record(if slow { 50_000 } else { 100 + i }).unwrap();
            }
            per_sec.push(h);
        }
        per_sec.push(crate::loadgen::new_histogram()); // a second with no requests
        let f = steal_free_latency(&rows, &per_sec);
        assert_eq!(f.seconds, 6);
        assert_eq!(f.steal_seconds, 4);
        assert_eq!(f.request_share, 200.0 / 600.0);
        let p = f.p99_us.unwrap();
        assert!((198..=200).contains(&p), "{p}");
        // No steal at all: every request counts; no timeline: the same.
        let f = steal_free_latency(&[row(0.0, 0.0), row(5.0, 0.0)], &per_sec);
        assert_eq!((f.steal_seconds, f.request_share), (0, 1.0));
        assert_eq!(steal_free_latency(&[], &per_sec).steal_seconds, 0);
    }

    #[test]
    fn rejects_bad_settings() {
        for argv in [
            &["--rate", "0"][..],
            &["--set-ratio", "1.5"],
            &["--node-mem", "100MiB"],
            &["--levels", "500"],
            &["--keys", "10000000"],
            &["--duration-s", "0"],
        ] {
            assert!(
                Settings::resolve(&parse(argv)).is_err(),
                "{argv:?} accepted"
            );
        }
        assert!(Cli::try_parse_from(["x", "--node-mem", "lots"]).is_err());
        assert!(Cli::try_parse_from(["x", "--be-split", "0:0"]).is_err());
        assert!(Cli::try_parse_from(["x", "--modes", "magic"]).is_err());
    }
}
