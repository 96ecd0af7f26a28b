//! GUPS with a skewed access pattern (MaxMem §5.1.1), unmanaged or under memcolo's
//! userfaultfd tier manager with the MaxMem policy.
//!
//! The table is one anonymous mapping of `--footprint-mib` MiB of 8-byte words,
//! split into three disjoint sets whose sizes are in the ratio 1:2:4 (hot, warm,
//! rest); each update picks a set with probability 60 % / 30 % / 10 %
//! (`--hot-pct`, `--warm-pct`), a uniformly random word in it, and does a
//! read-modify-write (`table[i] ^= r`), as HPCC RandomAccess. Threads update the
//! shared table without locks (GUPS tolerates lost updates; the words are atomics
//! with relaxed loads and stores, which are plain moves on x86-64).
//!
//! A run has three phases: `init` writes every word once (`table[i] = i`, the
//! first touch of every page), `warmup` updates for `--warmup-s` seconds (the
//! policy learns the hot set), `measure` updates for `--measure-s` seconds. The
//! throughput of the run is the updates of the measure phase divided by its length,
//! in million updates per second (MUPS).
//!
//! `--manage maxmem` registers the mapping with a userfaultfd handled by a tier
//! manager in this process (a fault thread, an eviction worker, the sampler), placed
//! by the MaxMem policy with `--fast-mib` of fast memory and a slow tier of LZ4
//! compressed pages (or a memory server, `--slow remote:HOST:PORT`), driven by a
//! policy thread (windows of `--window-ms`, epochs of `--epoch-ms`). This is the
//! same manager and policy code the agent runs for other processes; in-process it
//! measures the cost of management without the agent's socket.
//!
//! Output: one JSON object on stdout (the summary); with `--timeline PATH`, a CSV of
//! one row per second (phase, MUPS, and for managed runs a_miss, allocation and the
//! manager's counters).

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use memcolo_policy::maxmem::MaxMemConfig;
use memcolo_tier::channel::Auth;
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::manager::{TierConfig, TierManager};
use memcolo_tier::node::{NodeTiming, TierNode};
use memcolo_tier::region::{AnonRegion, PAGE};
use memcolo_tier::remote::{RemoteConfig, RemoteTier};
use memcolo_tier::uffd::{self, features, mode, Uffd};
use memcolo_tier::SlowTier;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Manage {
    /// Plain anonymous memory; the kernel alone.
    Off,
    /// The userfaultfd tier manager with the MaxMem policy, in this process.
    Maxmem,
}

#[derive(Parser, Debug)]
#[command(
    name = "gups",
    about = "GUPS with a hot/warm/rest skew (MaxMem §5.1.1), unmanaged or under memcolo's tier manager"
)]
struct Args {
    /// Table size, MiB.
    #[arg(long, default_value_t = 1024)]
    footprint_mib: u64,
    /// Updating threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Seconds of updates before the measurement.
    #[arg(long, default_value_t = 10.0)]
    warmup_s: f64,
    /// Seconds of measured updates.
    #[arg(long, default_value_t = 20.0)]
    measure_s: f64,
    /// Share of updates to the hot set (1/7 of the table), percent.
    #[arg(long, default_value_t = 60)]
    hot_pct: u32,
    /// Share of updates to the warm set (2/7 of the table), percent; the rest (4/7)
    /// gets what is left.
    #[arg(long, default_value_t = 30)]
    warm_pct: u32,
    /// Size of the hot set, percent of the table (default 1/7: sizes 1:2:4).
    #[arg(long, default_value_t = 100.0 / 7.0)]
    hot_size_pct: f64,
    /// Size of the warm set, percent of the table (default 2/7); the rest is the rest.
    #[arg(long, default_value_t = 200.0 / 7.0)]
    warm_size_pct: f64,
    /// Seconds after the end of `init` at which the hot set grows (MaxMem §5.1.2's
    /// changing access pattern), taking from the warm set, then the rest.
    #[arg(long)]
    grow_hot_at_s: Option<f64>,
    /// Factor the hot set grows by.
    #[arg(long, default_value_t = 1.5)]
    grow_hot_by: f64,
    /// Management of the table.
    #[arg(long, value_enum, default_value_t = Manage::Off)]
    manage: Manage,
    /// Fast memory for the table (managed runs), MiB; default: the footprint.
    #[arg(long)]
    fast_mib: Option<u64>,
    /// Target fast-memory miss ratio (managed runs).
    #[arg(long, default_value_t = 0.1)]
    t_miss: f64,
    /// Slow tier: `compressed` (LZ4 in this process) or `remote:HOST:PORT` (a
    /// `memcolo memserver`).
    #[arg(long, default_value = "compressed")]
    slow: String,
    /// With `--slow remote:`: the file of the secret shared with the memory server
    /// (its `--secret-file`).
    #[arg(long, value_name = "PATH", conflicts_with = "slow_insecure_no_auth")]
    slow_secret_file: Option<PathBuf>,
    /// With `--slow remote:` and no secret: a memory server started with
    /// `--insecure-no-auth` (tests on loopback only).
    #[arg(long)]
    slow_insecure_no_auth: bool,
    /// Policy migrations per epoch, MiB (MaxMem §3.1: 4 GB per epoch for 192 GB
    /// of DRAM; the default keeps about that share of a 1 GiB table).
    #[arg(long, default_value_t = 64)]
    migration_cap_mib: u64,
    /// Sampling window, ms.
    #[arg(long, default_value_t = 50)]
    window_ms: u64,
    /// Windows per policy epoch.
    #[arg(long, default_value_t = 20)]
    windows_per_epoch: u32,
    /// Slots per window: touched sampled pages are re-armed at each slot boundary
    /// while the region has slow accesses (1: never).
    #[arg(long, default_value_t = 5)]
    slots_per_window: u32,
    /// Most resident pages sampled per window.
    #[arg(long, default_value_t = 64)]
    sample_pages: usize,
    /// The most sample hits aimed at per window (0: always `--sample-pages`).
    #[arg(long, default_value_t = 16)]
    sample_target_hits: usize,
    /// Standard error of an epoch's FMMR the sample is sized for (0: always aim at
    /// `--sample-target-hits`).
    #[arg(long, default_value_t = 0.01)]
    sample_fmmr_error: f64,
    /// Diagnostic: write-protect and unprotect the sampled pages without dropping
    /// them (the shootdowns of sampling without its faults; a_fast stays 0).
    #[arg(long)]
    sample_no_drop: bool,
    /// Most pages on probation (the next victims, tested before they are evicted;
    /// 0: none), as the agent's `tier.probation_pages`.
    #[arg(long, default_value_t = 128)]
    probation_pages: usize,
    /// Untouched pages zero-filled per first-touch fault.
    #[arg(long, default_value_t = 64)]
    zero_fill_ahead: usize,
    /// Eviction worker threads.
    #[arg(long, default_value_t = 1)]
    evict_workers: usize,
    /// Seed of the update streams.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Per-second CSV.
    #[arg(long)]
    timeline: Option<std::path::PathBuf>,
    /// After the run, replay the same updates (XOR undoes them, as HPCC
    /// RandomAccess verifies) and count the words that are not back at their initial
    /// value: any lost or wrong page shows. Needs `--threads 1`.
    #[arg(long)]
    verify: bool,
    /// A label copied into the summary.
    #[arg(long, default_value = "")]
    label: String,
}

/// The three sets, in words: `[0, hot)`, `[hot, hot + warm)`, `[hot + warm, words)`.
#[derive(Clone, Copy, Debug)]
struct Sets {
    hot: u64,
    warm: u64,
    rest: u64,
    /// Thresholds on a 16-bit draw: below `t_hot` → hot, below `t_warm` → warm.
    t_hot: u32,
    t_warm: u32,
}

impl Sets {
    fn new(words: u64, hot_size_pct: f64, warm_size_pct: f64, hot_pct: u32, warm_pct: u32) -> Self {
        let hot = ((words as f64 * hot_size_pct / 100.0) as u64).clamp(1, words);
        let warm = ((words as f64 * warm_size_pct / 100.0) as u64).min(words - hot);
        Sets {
            hot,
            warm,
            rest: words - hot - warm,
            t_hot: hot_pct * 65536 / 100,
            t_warm: (hot_pct + warm_pct) * 65536 / 100,
        }
    }

    /// The sets after the hot set grew by `factor` (from the warm set, then the rest).
    fn grown(&self, factor: f64) -> Sets {
        let words = self.hot + self.warm + self.rest;
        let hot = ((self.hot as f64 * factor) as u64).clamp(1, words);
        let from_warm = (hot - self.hot.min(hot)).min(self.warm);
        Sets {
            hot,
            warm: self.warm - from_warm,
            rest: words - hot - (self.warm - from_warm),
            ..*self
        }
    }

    /// The word an update with random bits `x` touches.
    #[inline(always)]
    fn pick(&self, x: u64) -> u64 {
        let u = ((x >> 48) & 0xFFFF) as u32;
        let low = x & 0xFFFF_FFFF;
        let (start, len) = if u < self.t_hot {
            (0, self.hot)
        } else if u < self.t_warm {
            (self.hot, self.warm)
        } else {
            (self.hot + self.warm, self.rest)
        };
        start + ((low * len) >> 32)
    }
}

const PHASE_INIT: u8 = 0;
const PHASE_WARMUP: u8 = 1;
const PHASE_MEASURE: u8 = 2;
const PHASE_DONE: u8 = 3;

fn phase_name(p: u8) -> &'static str {
    match p {
        PHASE_INIT => "init",
        PHASE_WARMUP => "warmup",
        PHASE_MEASURE => "measure",
        _ => "done",
    }
}

/// The update stream of one thread: xorshift64* seeded from `seed`.
struct Stream(u64);

impl Stream {
    fn new(seed: u64) -> Self {
        Stream(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    #[inline(always)]
    fn next(&mut self) -> u64 {
        let x = &mut self.0;
        *x ^= *x >> 12;
        *x ^= *x << 25;
        *x ^= *x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Replays `n` updates of the stream of `seed` (undoing them) and counts the words
/// not equal to their index.
fn verify(table: &[AtomicU64], sets: Sets, seed: u64, n: u64) -> u64 {
    let mut s = Stream::new(seed);
    for _ in 0..n {
        let r = s.next();
        let w = &table[sets.pick(r) as usize];
        w.store(w.load(Ordering::Relaxed) ^ r, Ordering::Relaxed);
    }
    table
        .iter()
        .enumerate()
        .filter(|(i, w)| w.load(Ordering::Relaxed) != *i as u64)
        .count() as u64
}

/// One updating thread: updates in blocks of 4096, publishing its count after each.
/// Switches to `grown` once `grow` is set.
fn updater(
    table: &[AtomicU64],
    mut sets: Sets,
    grown: Sets,
    grow: &AtomicBool,
    seed: u64,
    count: &AtomicU64,
    phase: &AtomicU8,
) {
    let mut s = Stream::new(seed);
    let mut n = 0u64;
    while phase.load(Ordering::Relaxed) < PHASE_DONE {
        if grow.load(Ordering::Relaxed) {
            sets = grown;
        }
        for _ in 0..4096 {
            let r = s.next();
            let w = &table[sets.pick(r) as usize];
            w.store(w.load(Ordering::Relaxed) ^ r, Ordering::Relaxed);
        }
        n += 4096;
        count.store(n, Ordering::Relaxed);
    }
}

/// The latest epoch as the per-second timeline reports it.
#[derive(Clone, Copy, Default)]
struct EpochView {
    epoch: u64,
    a_miss: f64,
    alloc_pages: u64,
    fast_pages: u64,
    slow_pages: u64,
    migrations: u64,
    infeasible: bool,
}

struct Managed {
    node: Arc<TierNode>,
    pid: i32,
    first_page: u64,
    manager: Arc<TierManager>,
    tier: Arc<dyn SlowTier>,
    stop: Arc<AtomicBool>,
    driver: std::thread::JoinHandle<()>,
    view: Arc<Mutex<EpochView>>,
    epochs: Arc<Mutex<Vec<EpochView>>>,
}

fn slow_tier(args: &Args, footprint: u64) -> Result<Arc<dyn SlowTier>> {
    let spec = args.slow.as_str();
    if spec == "compressed" {
        return Ok(Arc::new(CompressedStore::new(
            PAGE,
            footprint * 2 + (64 << 20),
        )));
    }
    if let Some(addr) = spec.strip_prefix("remote:") {
        let auth = match &args.slow_secret_file {
            Some(path) => Auth::from_file(path)?,
            None if args.slow_insecure_no_auth => Auth::InsecureNoAuth,
            None => bail!("--slow {spec}: needs --slow-secret-file (or --slow-insecure-no-auth)"),
        };
        let t = RemoteTier::connect(RemoteConfig::new(addr, PAGE, auth))
            .with_context(|| format!("connecting to the memory server {addr}"))?;
        return Ok(Arc::new(t));
    }
    bail!("--slow: `compressed` or `remote:HOST:PORT`, not {spec:?}")
}

fn manage(region: &AnonRegion, args: &Args) -> Result<Managed> {
    uffd::check_permission().map_err(|why| anyhow::anyhow!("userfaultfd: {why}"))?;
    let footprint = region.len() as u64;
    let fast_pages = args
        .fast_mib
        .map_or(region.pages() as u64, |m| (m << 20) / PAGE as u64);
    let cap_pages = ((args.migration_cap_mib << 20) / PAGE as u64).max(2);
    let cfg = MaxMemConfig {
        migration_cap_pages: cap_pages,
        ..MaxMemConfig::with_capacity(fast_pages, PAGE as u64)
    };
    let node = Arc::new(TierNode::new(cfg)?);
    let pid = std::process::id() as i32;
    node.register(pid, args.t_miss)?;
    let base = region.as_ptr() as u64;
    let first = TierNode::first_page_of(base);
    let u = Uffd::open(features::PAGEFAULT_FLAG_WP).context("opening a userfaultfd")?;
    u.register(base, region.len() as u64, mode::MISSING | mode::WP)
        .context("registering the table")?;
    let tier = slow_tier(args, footprint)?;
    let tcfg = TierConfig {
        sample_pages: args.sample_pages,
        sample_target_hits: args.sample_target_hits,
        sample_drop: !args.sample_no_drop,
        sample_fmmr_error: args.sample_fmmr_error,
        zero_fill_ahead: args.zero_fill_ahead.max(1),
        evict_workers: args.evict_workers.max(1),
        probation_pages: args.probation_pages,
        ..TierConfig::new(1)
    };
    let placement = node.placement(pid, first);
    let manager = Arc::new(TierManager::start(
        u,
        Box::new(region.memory()),
        tier.clone(),
        Box::new(placement),
        tcfg,
    )?);
    node.attach(pid, first, manager.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let view = Arc::new(Mutex::new(EpochView::default()));
    let epochs = Arc::new(Mutex::new(Vec::new()));
    let timing = NodeTiming {
        window: Duration::from_millis(args.window_ms.max(1)),
        windows_per_epoch: args.windows_per_epoch.max(1),
        slots_per_window: args.slots_per_window.max(1),
    };
    let driver = {
        let (node, stop, view, epochs) = (node.clone(), stop.clone(), view.clone(), epochs.clone());
        std::thread::Builder::new()
            .name("gups-policy".into())
            .spawn(move || {
                node.run(timing, &stop, |out, applied| {
                    // A page that cannot come back: stop the process with the reason
                    // (the thread that touched it stays blocked; it never sees zeros).
                    if let Some((_, _, why)) = applied.fatal.first() {
                        eprintln!("gups: stopped: {why}");
                        std::process::exit(70);
                    }
                    let Some(p) = out.procs.iter().find(|p| p.pid == pid) else {
                        return;
                    };
                    let v = EpochView {
                        epoch: out.epoch,
                        a_miss: p.a_miss,
                        alloc_pages: p.alloc_pages,
                        fast_pages: p.fast_pages,
                        slow_pages: p.slow_pages,
                        migrations: out.migrations.len() as u64,
                        infeasible: p.infeasible,
                    };
                    *view.lock().unwrap() = v;
                    epochs.lock().unwrap().push(v);
                })
            })?
    };
    Ok(Managed {
        node,
        pid,
        first_page: first,
        manager,
        tier,
        stop,
        driver,
        view,
        epochs,
    })
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// System and per-thread counters read at the start and the end of the measure
/// phase, to tell what management costs the updating threads (diagnostics): TLB
/// shootdown, function-call and rescheduling IPIs (`/proc/interrupts`, all CPUs),
/// THP events and page faults (`/proc/vmstat`), steal time (`/proc/stat`), and for
/// each updating thread its CPU time, its wait for a CPU (`schedstat`), its context
/// switches (`status`) and minor faults (`stat`).
#[derive(Clone, Debug, Default)]
struct Probe {
    /// TLB shootdowns, function-call IPIs, rescheduling IPIs (sums over CPUs).
    irq: [u64; 3],
    /// `pgfault`, `thp_fault_alloc`, `thp_split_pmd`, `thp_collapse_alloc`.
    vmstat: [u64; 4],
    /// Steal time of all CPUs, USER_HZ ticks.
    steal_ticks: u64,
    /// Per updating thread: CPU ns, run-queue wait ns, voluntary and involuntary
    /// context switches, minor faults.
    threads: Vec<[u64; 5]>,
}

fn read_irq() -> [u64; 3] {
    let mut out = [0u64; 3];
    let Ok(s) = std::fs::read_to_string("/proc/interrupts") else {
        return out;
    };
    for line in s.lines() {
        let mut it = line.split_whitespace();
        let k = match it.next() {
            Some("TLB:") => 0,
            Some("CAL:") => 1,
            Some("RES:") => 2,
            _ => continue,
        };
        out[k] = it.map_while(|x| x.parse::<u64>().ok()).sum();
    }
    out
}

fn read_vmstat() -> [u64; 4] {
    let mut out = [0u64; 4];
    let Ok(s) = std::fs::read_to_string("/proc/vmstat") else {
        return out;
    };
    for line in s.lines() {
        let mut it = line.split_whitespace();
        let k = match it.next() {
            Some("pgfault") => 0,
            Some("thp_fault_alloc") => 1,
            Some("thp_split_pmd") => 2,
            Some("thp_collapse_alloc") => 3,
            _ => continue,
        };
        out[k] = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    }
    out
}

fn read_steal() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(8))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn read_thread(tid: i32) -> [u64; 5] {
    let dir = format!("/proc/self/task/{tid}");
    let mut out = [0u64; 5];
    if let Ok(s) = std::fs::read_to_string(format!("{dir}/schedstat")) {
        let v: Vec<u64> = s
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        out[0] = v.first().copied().unwrap_or(0);
        out[1] = v.get(1).copied().unwrap_or(0);
    }
    if let Ok(s) = std::fs::read_to_string(format!("{dir}/status")) {
        for line in s.lines() {
            if let Some(v) = line.strip_prefix("voluntary_ctxt_switches:") {
                out[2] = v.trim().parse().unwrap_or(0);
            } else if let Some(v) = line.strip_prefix("nonvoluntary_ctxt_switches:") {
                out[3] = v.trim().parse().unwrap_or(0);
            }
        }
    }
    if let Ok(s) = std::fs::read_to_string(format!("{dir}/stat")) {
        // Fields after the command's closing parenthesis; minflt is the 10th field.
        if let Some(rest) = s.rsplit_once(')').map(|x| x.1) {
            out[4] = rest
                .split_whitespace()
                .nth(7)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        }
    }
    out
}

impl Probe {
    fn read(tids: &[AtomicI32]) -> Self {
        Probe {
            irq: read_irq(),
            vmstat: read_vmstat(),
            steal_ticks: read_steal(),
            threads: tids
                .iter()
                .map(|t| read_thread(t.load(Ordering::Relaxed)))
                .collect(),
        }
    }

    /// The change from `self` to `end` over `secs` seconds, as JSON: rates per
    /// second, and the updating threads' time split (shares of the wall time,
    /// averaged over threads): on CPU, waiting for a CPU, and the rest (blocked:
    /// sleeping in a fault served by the manager, or preempted by the host).
    fn delta(&self, end: &Probe, secs: f64) -> serde_json::Value {
        let per_s = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs.max(1e-9);
        let n = self.threads.len().max(1) as f64;
        let sum = |k: usize| -> f64 {
            self.threads
                .iter()
                .zip(&end.threads)
                .map(|(a, b)| b[k].saturating_sub(a[k]) as f64)
                .sum::<f64>()
        };
        let cpu = sum(0) / 1e9 / n / secs;
        let delay = sum(1) / 1e9 / n / secs;
        json!({
            "tlb_shootdowns_per_s": per_s(self.irq[0], end.irq[0]),
            "call_ipis_per_s": per_s(self.irq[1], end.irq[1]),
            "resched_ipis_per_s": per_s(self.irq[2], end.irq[2]),
            "pgfault_per_s": per_s(self.vmstat[0], end.vmstat[0]),
            "thp_fault_alloc": end.vmstat[1].saturating_sub(self.vmstat[1]),
            "thp_split_pmd": end.vmstat[2].saturating_sub(self.vmstat[2]),
            "thp_collapse_alloc": end.vmstat[3].saturating_sub(self.vmstat[3]),
            "steal_pct": per_s(self.steal_ticks, end.steal_ticks),
            "updater_cpu_share": cpu,
            "updater_run_delay_share": delay,
            "updater_other_share": (1.0 - cpu - delay).max(0.0),
            "updater_vol_cs_per_s": sum(2) / n / secs,
            "updater_invol_cs_per_s": sum(3) / n / secs,
            "updater_minflt_per_s": sum(4) / n / secs,
        })
    }
}

/// The table's mapping in `/proc/self/smaps`: resident KiB, KiB in transparent huge
/// pages, and the kernel page size (KiB) of the mapping.
fn table_smaps(base: usize) -> serde_json::Value {
    let Ok(s) = std::fs::read_to_string("/proc/self/smaps") else {
        return json!(null);
    };
    let mut inside = false;
    let mut out = serde_json::Map::new();
    for line in s.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, _)) = first.split_once('-') {
            if !first.ends_with(':') {
                inside = usize::from_str_radix(a, 16).ok() == Some(base);
                continue;
            }
        }
        if !inside {
            continue;
        }
        for (key, name) in [
            ("Rss:", "rss_kib"),
            ("AnonHugePages:", "anon_huge_kib"),
            ("KernelPageSize:", "kernel_page_kib"),
            ("Referenced:", "referenced_kib"),
        ] {
            if let Some(v) = line.strip_prefix(key) {
                let kib: u64 = v
                    .split_whitespace()
                    .next()
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(0);
                out.insert(name.into(), json!(kib));
            }
        }
    }
    serde_json::Value::Object(out)
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.hot_pct + args.warm_pct > 100 {
        bail!("--hot-pct + --warm-pct must not pass 100");
    }
    if args.verify && (args.threads != 1 || args.grow_hot_at_s.is_some()) {
        bail!("--verify needs --threads 1 and no --grow-hot-at-s");
    }
    if !(args.hot_size_pct > 0.0
        && args.warm_size_pct >= 0.0
        && args.hot_size_pct + args.warm_size_pct <= 100.0)
    {
        bail!("--hot-size-pct and --warm-size-pct: positive, at most 100 together");
    }
    if args.footprint_mib == 0 || args.threads == 0 {
        bail!("--footprint-mib and --threads must be positive");
    }
    let pages = ((args.footprint_mib << 20) as usize).div_ceil(PAGE);
    let region = AnonRegion::new(pages).context("mapping the table")?;
    let managed = match args.manage {
        Manage::Off => None,
        Manage::Maxmem => Some(manage(&region, &args)?),
    };
    let words = (region.len() / 8) as u64;
    // SAFETY: the mapping is `words` 8-byte words, readable and writable, aligned to a
    // page, and lives until the end of main; AtomicU64 has the layout of u64.
    let table: &[AtomicU64] =
        unsafe { std::slice::from_raw_parts(region.as_ptr() as *const AtomicU64, words as usize) };
    let sets = Sets::new(
        words,
        args.hot_size_pct,
        args.warm_size_pct,
        args.hot_pct,
        args.warm_pct,
    );
    let grown = sets.grown(args.grow_hot_by);
    let grow = Arc::new(AtomicBool::new(false));

    let mut timeline = match &args.timeline {
        Some(p) => {
            let mut f =
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            writeln!(
                f,
                "t_s,phase,mups,epoch,a_miss,alloc_pages,fast_pages,slow_pages,migrations,infeasible,slow_faults,sample_hits,evictions,zero_faults"
            )?;
            Some(f)
        }
        None => None,
    };

    let start = Instant::now();
    // Init: first touch of every page, in order.
    let t_init = Instant::now();
    for (i, w) in table.iter().enumerate() {
        w.store(i as u64, Ordering::Relaxed);
    }
    let init_s = t_init.elapsed().as_secs_f64();

    let phase = Arc::new(AtomicU8::new(PHASE_WARMUP));
    let counts: Arc<Vec<AtomicU64>> =
        Arc::new((0..args.threads).map(|_| AtomicU64::new(0)).collect());
    let tids: Arc<Vec<AtomicI32>> =
        Arc::new((0..args.threads).map(|_| AtomicI32::new(0)).collect());
    let table_addr = table.as_ptr() as usize;
    let workers: Vec<_> = (0..args.threads)
        .map(|k| {
            let (phase, counts, grow, tids) =
                (phase.clone(), counts.clone(), grow.clone(), tids.clone());
            let seed = args.seed.wrapping_add(k as u64 * 7919);
            std::thread::Builder::new()
                .name(format!("gups-{k}"))
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    tids[k].store(unsafe { libc::gettid() }, Ordering::Relaxed);
                    // SAFETY: as above; the table outlives the threads (joined below).
                    let table = unsafe {
                        std::slice::from_raw_parts(table_addr as *const AtomicU64, words as usize)
                    };
                    updater(table, sets, grown, &grow, seed, &counts[k], &phase)
                })
        })
        .collect::<Result<_, _>>()?;
    let total = || {
        counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<u64>()
    };

    let t_warm = Instant::now();
    let warmup = Duration::from_secs_f64(args.warmup_s);
    let measure = Duration::from_secs_f64(args.measure_s);
    let second = Duration::from_secs(1);
    let mut last = (t_warm, 0u64);
    let mut next_row = t_warm + second;
    let mut phase_end = t_warm + warmup;
    let mut measure_start: Option<(Instant, u64)> = None;
    let mut probe_start = Probe::default();
    let mut per_second: Vec<f64> = Vec::new();
    let mut grow_at = args
        .grow_hot_at_s
        .map(|s| t_warm + Duration::from_secs_f64(s));
    loop {
        let mut deadline = next_row.min(phase_end);
        if let Some(g) = grow_at {
            deadline = deadline.min(g);
        }
        let now = Instant::now();
        if deadline > now {
            std::thread::sleep(deadline - now);
        }
        if grow_at.is_some_and(|g| Instant::now() >= g) {
            grow.store(true, Ordering::Relaxed);
            grow_at = None;
        }
        let now = Instant::now();
        let n = total();
        let switch = now >= phase_end;
        if now >= next_row || switch {
            // A row per second, and a (shorter) row closing each phase, so the rows of
            // the measure phase cover exactly the measure phase.
            let cur_phase = phase.load(Ordering::Relaxed);
            let dt = now.duration_since(last.0).as_secs_f64();
            let row_mups = (n - last.1) as f64 / dt.max(1e-9) / 1e6;
            if cur_phase == PHASE_MEASURE && dt >= 0.5 {
                per_second.push(row_mups);
            }
            if let Some(f) = timeline.as_mut() {
                let v = managed
                    .as_ref()
                    .map(|m| *m.view.lock().unwrap())
                    .unwrap_or_default();
                let s = managed
                    .as_ref()
                    .map(|m| m.manager.stats())
                    .unwrap_or_default();
                writeln!(
                    f,
                    "{:.3},{},{:.4},{},{:.5},{},{},{},{},{},{},{},{},{}",
                    now.duration_since(start).as_secs_f64(),
                    phase_name(cur_phase),
                    row_mups,
                    v.epoch,
                    v.a_miss,
                    v.alloc_pages,
                    v.fast_pages,
                    v.slow_pages,
                    v.migrations,
                    v.infeasible as u8,
                    s.slow_faults,
                    s.sample_hits,
                    s.evictions,
                    s.zero_faults
                )?;
            }
            last = (now, n);
            next_row = now + second;
        }
        if switch {
            if measure_start.is_some() {
                break;
            }
            measure_start = Some((now, n));
            probe_start = Probe::read(&tids);
            phase_end = now + measure;
            phase.store(PHASE_MEASURE, Ordering::Relaxed);
        }
    }
    let end = Instant::now();
    let n_end = total();
    let probe_end = Probe::read(&tids);
    phase.store(PHASE_DONE, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let (t0, n0) = measure_start.expect("measured");
    let measured_s = end.duration_since(t0).as_secs_f64();
    let mups = (n_end - n0) as f64 / measured_s / 1e6;
    let probe = probe_start.delta(&probe_end, measured_s);
    // Throughput over the time the updaters did not wait for a CPU that another
    // task held: other work on the machine taken out, management's costs kept.
    let run_delay_s = probe["updater_run_delay_share"].as_f64().unwrap_or(0.0) * measured_s;
    let mups_excl_run_delay = (n_end - n0) as f64 / (measured_s - run_delay_s).max(1e-9) / 1e6;
    let verify_errors = args
        .verify
        .then(|| verify(table, sets, args.seed, counts[0].load(Ordering::Relaxed)));

    let mut summary = json!({
        "label": args.label,
        "manage": format!("{:?}", args.manage).to_lowercase(),
        "footprint_mib": args.footprint_mib,
        "threads": args.threads,
        "hot_pct": args.hot_pct,
        "warm_pct": args.warm_pct,
        "warmup_s": args.warmup_s,
        "measure_s": measured_s,
        "init_s": init_s,
        "mups": mups,
        "per_second_mups": per_second,
        "vm_hwm_kib": vm_hwm_kib(),
        "mups_excl_run_delay": mups_excl_run_delay,
        "probe": probe,
        "table_smaps": table_smaps(region.as_ptr() as usize),
    });
    if let Some(e) = verify_errors {
        summary["verify_errors"] = json!(e);
        summary["updates"] = json!(counts[0].load(Ordering::Relaxed));
    }
    if let Some(m) = managed {
        m.stop.store(true, Ordering::Release);
        let _ = m.driver.join();
        let s = m.manager.stats();
        let epochs = m.epochs.lock().unwrap().clone();
        let measured: Vec<&EpochView> = epochs
            .iter()
            .rev()
            .take((args.measure_s as usize).max(1))
            .collect();
        let mean_a_miss =
            measured.iter().map(|v| v.a_miss).sum::<f64>() / measured.len().max(1) as f64;
        let last = epochs.last().copied().unwrap_or_default();
        let ts = m.tier.stats();
        let o = summary.as_object_mut().expect("object");
        o.insert(
            "fast_mib".into(),
            json!(args.fast_mib.unwrap_or(args.footprint_mib)),
        );
        o.insert("t_miss".into(), json!(args.t_miss));
        o.insert("slow".into(), json!(m.tier.name()));
        o.insert("epochs".into(), json!(epochs.len()));
        o.insert("a_miss_mean_measure".into(), json!(mean_a_miss));
        o.insert("a_miss_last".into(), json!(last.a_miss));
        o.insert("fast_pages_last".into(), json!(last.fast_pages));
        o.insert("alloc_pages_last".into(), json!(last.alloc_pages));
        o.insert(
            "manager".into(),
            json!({
                "resident_pages": s.resident_pages, "stored_pages": s.stored_pages,
                "zero_faults": s.zero_faults, "slow_faults": s.slow_faults,
                "sample_hits": s.sample_hits, "wp_faults": s.wp_faults,
                "spurious_faults": s.spurious_faults, "evictions": s.evictions,
                "evict_batches": s.evict_batches, "evict_failures": s.evict_failures,
                "prefetches": s.prefetches, "sample_windows": s.sample_windows,
                "lost_pages": s.lost_pages, "probation_pages": s.probation_pages,
                "probation_hits": s.probation_hits,
                "probation_evictions": s.probation_evictions,
            }),
        );
        o.insert("slow_tier_stored_bytes".into(), json!(ts.stored_bytes));
        if let Some(why) = m.manager.fatal() {
            o.insert("fatal".into(), json!(why));
        }
        // The node's table holds the manager (and the manager's placement holds the
        // table): detach it to be its only owner.
        drop(m.node.detach(m.pid, m.first_page));
        drop(m.node);
        let manager = Arc::try_unwrap(m.manager)
            .map_err(|_| anyhow::anyhow!("the tier manager is still shared"))?;
        manager
            .stop()
            .map_err(|why| anyhow::anyhow!("stopping the tier manager: {why}"))?;
    }
    println!("{summary}");
    drop(region);
    Ok(())
}
