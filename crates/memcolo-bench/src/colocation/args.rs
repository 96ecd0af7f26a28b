//! The modes, options and settings of `memcolo bench colocation` (and of
//! `memcolo bench reclaim`, which shares them).

use std::path::PathBuf;
use std::time::Duration;

use crate::be::BeSplit;
use crate::error::{BenchError, Result};
use crate::harness::default_out_dir;
use crate::lc::LcKind;
use crate::size::{format_bytes, parse_bytes_arg};

/// What manages the node's memory in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Mode {
    /// The kernel alone: cgroup limit, reclaim and swap, nothing else.
    Kernel,
    /// The kernel alone with raised watermarks (`vm.watermark_scale_factor` = 1000,
    /// `vm.min_free_kbytes` = 2 % of RAM; restored after the run). Host-level kswapd
    /// watermarks: they do not apply to a memory cgroup's limit.
    Watermarks,
    /// A re-implementation of Senpai (TMO, ASPLOS'22) squeezing the BE group's limit
    /// to a PSI memory-stall target ([`crate::peers::senpai`]).
    Senpai,
    /// A re-implementation of Koordinator's BE memory eviction: kill BE jobs above
    /// 70 % node usage ([`crate::peers::koordinator`]).
    Koordinator,
    /// The kernel alone with the node's limit raised above the level's BE demand
    /// (+ 512 MiB): the same LC service, BE jobs and CPU load, no memory pressure. The
    /// reference "p99 with the same BE CPU load and no memory pressure".
    NoPressure,
    /// Only libmemcolo: the LC service under the allocator with the Hermes
    /// reservation (`MEMCOLO_CLASS=lc`), no agent.
    Alloc,
    /// Only Hermes's BE file-cache advice in the agent (reclaim, tiering and M3 kills
    /// off).
    Advice,
    /// Only M3 in the agent: signals to the elastic tenant, kills of BE above `top`
    /// (advice, reclaim and tiering off).
    M3,
    /// Only Hermit's adaptive asynchronous reclaim in the agent (advice, tiering and
    /// M3 kills off).
    Reclaim,
    /// Asynchronous reclaim in the kswapd / Fastswap design: one worker that starts at
    /// a fixed mark (advice, tiering and M3 kills off).
    Fixed,
    /// `memcolo agent` with its defaults (M3, Hermes advice, Hermit reclaim, the tier
    /// service), the LC service under its own allocator.
    Agent,
    /// The whole of memcolo, as an operator deploys it: the agent with its defaults and
    /// the LC service started with `memcolo run --class lc` under libmemcolo.
    Full,
}

/// What a mode stands for in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeKind {
    /// The kernel alone.
    Baseline,
    /// Another system's documented controller.
    Peer,
    /// A reference run that is not a contender (no memory pressure).
    Reference,
    /// One of memcolo's mechanisms alone.
    Ablation,
    /// memcolo as deployed.
    Memcolo,
}

impl ModeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ModeKind::Baseline => "baseline",
            ModeKind::Peer => "peer",
            ModeKind::Reference => "reference",
            ModeKind::Ablation => "ablation",
            ModeKind::Memcolo => "memcolo",
        }
    }
}

impl Mode {
    /// Every mode, in the order of reports.
    pub const ALL: [Mode; 12] = [
        Mode::Kernel,
        Mode::Watermarks,
        Mode::Senpai,
        Mode::Koordinator,
        Mode::NoPressure,
        Mode::Alloc,
        Mode::Advice,
        Mode::M3,
        Mode::Reclaim,
        Mode::Fixed,
        Mode::Agent,
        Mode::Full,
    ];

    /// The mode's name in results.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Watermarks => "watermarks",
            Mode::Senpai => "senpai",
            Mode::Koordinator => "koordinator",
            Mode::NoPressure => "no-pressure",
            Mode::Alloc => "alloc",
            Mode::Advice => "advice",
            Mode::M3 => "m3",
            Mode::Reclaim => "reclaim",
            Mode::Fixed => "fixed",
            Mode::Agent => "agent",
            Mode::Full => "full",
        }
    }

    pub fn kind(self) -> ModeKind {
        match self {
            // The kernel, configured: a baseline, not a re-implemented controller.
            Mode::Kernel | Mode::Watermarks => ModeKind::Baseline,
            Mode::Senpai | Mode::Koordinator => ModeKind::Peer,
            Mode::NoPressure => ModeKind::Reference,
            Mode::Alloc | Mode::Advice | Mode::M3 | Mode::Reclaim | Mode::Fixed | Mode::Agent => {
                ModeKind::Ablation
            }
            Mode::Full => ModeKind::Memcolo,
        }
    }

    /// A short label for tables and plots.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel alone",
            Mode::Watermarks => "kernel, raised watermarks",
            Mode::Senpai => "Senpai-style",
            Mode::Koordinator => "Koordinator-style BE eviction",
            Mode::NoPressure => "no memory pressure (reference)",
            Mode::Alloc => "libmemcolo only",
            Mode::Advice => "Hermes advice only",
            Mode::M3 => "M3 only",
            Mode::Reclaim => "Hermit reclaim only",
            Mode::Fixed => "kswapd-style reclaim (fixed mark)",
            Mode::Agent => "agent defaults, LC on its own allocator",
            Mode::Full => "memcolo, whole",
        }
    }

    /// The settings the mode runs with, for the report.
    pub fn settings(self) -> String {
        match self {
            Mode::Kernel => "cgroup limit, kernel reclaim, zram swap".into(),
            Mode::Watermarks => {
                "vm.watermark_scale_factor=1000, vm.min_free_kbytes=2 % of RAM".into()
            }
            Mode::Senpai => {
                let c = crate::peers::senpai::SenpaiConfig::default();
                format!(
                    "on be/: pressure {} µs per {} s interval, max probe {}, max backoff {}, coeff probe {}, coeff backoff {}, size {}..{}; v1 memory.limit_in_bytes in place of memory.high",
                    c.pressure_us,
                    c.interval_ticks,
                    c.max_probe,
                    c.max_backoff,
                    c.coeff_probe,
                    c.coeff_backoff,
                    format_bytes(c.min_size_bytes),
                    format_bytes(c.max_size_bytes)
                )
            }
            Mode::Koordinator => {
                let c = crate::peers::koordinator::KoordinatorConfig::default();
                format!(
                    "memoryEvictThresholdPercent {}, lower {} %, every {} s, cool time {} s; BE jobs by priority, then largest",
                    c.threshold_pct,
                    c.lower_pct,
                    c.interval.as_secs(),
                    c.cool_time.as_secs()
                )
            }
            Mode::NoPressure => "node limit raised above the BE demand + 512 MiB".into(),
            Mode::Alloc => "LD_PRELOAD=libmemcolo.so MEMCOLO_CLASS=lc, no agent".into(),
            Mode::Advice => "memcolo agent --no-reclaim --no-tier, [m3] kill_after_s=86400".into(),
            Mode::M3 => "memcolo agent --no-advice --no-reclaim --no-tier".into(),
            Mode::Reclaim => {
                "memcolo agent --no-tier, [hermes] enabled=false, [m3] kill_after_s=86400".into()
            }
            Mode::Fixed => {
                "as reclaim, [reclaim] max_workers=1, fixed_low_bytes=1 % of the node".into()
            }
            Mode::Agent => "memcolo agent (defaults)".into(),
            Mode::Full => {
                "memcolo agent (defaults); LC: memcolo run --class lc with LD_PRELOAD=libmemcolo.so"
                    .into()
            }
        }
    }

    /// Where the algorithm comes from.
    pub fn source(self) -> &'static str {
        match self {
            Mode::Kernel | Mode::NoPressure => "",
            Mode::Watermarks => "Documentation/admin-guide/sysctl/vm.rst",
            Mode::Senpai => "Weiner et al., TMO, ASPLOS'22 §3.3; facebookincubator/senpai senpai.py",
            Mode::Koordinator => "koordinator-sh/koordinator koordlet qosmanager memoryevict; NodeSLO resourceUsedThresholdWithBE",
            Mode::Alloc => "Hermes (Middleware'21) §3.2; TCMalloc adaptive subrelease (ISMM'21)",
            Mode::Advice => "Hermes (Middleware'21) §3.3",
            Mode::M3 => "M3 (EuroSys'21) §4",
            Mode::Reclaim => "Hermit (NSDI'23) §4",
            Mode::Fixed => "Fastswap (EuroSys'20); kswapd",
            Mode::Agent | Mode::Full => "docs/architecture.md",
        }
    }

    /// Whether the run starts `memcolo agent`.
    pub fn uses_agent(self) -> bool {
        matches!(
            self,
            Mode::Advice | Mode::M3 | Mode::Reclaim | Mode::Fixed | Mode::Agent | Mode::Full
        )
    }

    /// Whether the LC service runs under libmemcolo.
    pub fn lc_under_libmemcolo(self) -> bool {
        matches!(self, Mode::Alloc | Mode::Full)
    }

    /// The agent's command-line switches of the mode.
    pub fn agent_flags(self) -> &'static [&'static str] {
        match self {
            Mode::Advice => &["--no-reclaim", "--no-tier"],
            Mode::M3 => &["--no-advice", "--no-reclaim", "--no-tier"],
            Mode::Reclaim | Mode::Fixed => &["--no-tier"],
            _ => &[],
        }
    }

    /// The agent's arguments in a run of this mode: the user's `--agent-arg`s, the
    /// mode's switches and, if the mode has one, `--config` with its configuration
    /// written to `<work_dir>/agent-<tag>.toml`.
    pub(crate) fn agent_args(
        self,
        node_bytes: u64,
        args: &ColocationArgs,
        work_dir: &std::path::Path,
        tag: &str,
    ) -> Result<Vec<String>> {
        let mut extra = args.agent_args.clone();
        extra.extend(self.agent_flags().iter().map(|f| f.to_string()));
        if let Some(toml) = self.agent_config(node_bytes, &args.reclaim_set) {
            let path = work_dir.join(format!("agent-{tag}.toml"));
            std::fs::write(&path, toml).map_err(|e| BenchError::io(&path, e))?;
            extra.push("--config".into());
            extra.push(path.display().to_string());
        }
        Ok(extra)
    }

    /// The agent configuration (TOML) of the mode, beyond its switches; `extra` lines
    /// go into the `[reclaim]` section of the reclaim modes.
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
            Mode::Advice => Some("[m3]\nkill_after_s = 86400\n".into()),
            _ => None,
        }
    }
}

/// Options of `memcolo bench colocation` and `memcolo bench reclaim`.
#[derive(clap::Args, Debug, Clone)]
pub struct ColocationArgs {
    /// Short sweep: 2 GiB node, levels 0,50,100,125,150, 4 s warm-up, 6 s measured,
    /// 2 repeats, 2000 req/s, 50k keys; explicit options still win. It prints its
    /// estimated time at the start and an ETA after every run.
    #[arg(long)]
    pub quick: bool,
    /// Memory pressure levels, percent: BE memory demand / node memory (Hermes §5.1)
    /// [default: 0,50,75,100,125,150; 0,50,100,125,150 with --quick].
    #[arg(long, value_delimiter = ',')]
    pub levels: Option<Vec<u32>>,
    /// Modes to run at each level [default: kernel, watermarks, senpai, koordinator,
    /// alloc, advice, m3, reclaim, full].
    #[arg(long, value_delimiter = ',', value_enum)]
    pub modes: Option<Vec<Mode>>,
    /// Full runs of every (level, mode) cell, interleaved across modes and levels
    /// [default: 3; 2 with --quick].
    #[arg(long)]
    pub repeats: Option<u32>,
    /// Attempts per run: a run whose LC CPUs saw foreign load or host steal above the
    /// thresholds is rejected and run again, up to this many times; then the least
    /// disturbed attempt is kept and marked.
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    /// Reject a run when other work took more than this share of the LC CPUs, percent.
    #[arg(long, default_value_t = 5.0)]
    pub reject_foreign_pct: f64,
    /// Reject a run when host steal on the LC CPUs exceeded this share, percent.
    #[arg(long, default_value_t = 2.0)]
    pub reject_steal_pct: f64,
    /// Node memory: memory.limit_in_bytes of the scratch cgroup [default: 4GiB; 2GiB with --quick].
    #[arg(long, value_parser = parse_bytes_arg, value_name = "SIZE")]
    pub node_mem: Option<u64>,
    /// Measured phase per run, seconds [default: 30; 6 with --quick].
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Warm-up per run, seconds (BE jobs fill their memory; load is not recorded) [default: 10; 4 with --quick].
    #[arg(long)]
    pub warmup_s: Option<u64>,
    /// Request rate of the open-loop load generator, requests/s [default: 4000; 2000 with --quick].
    #[arg(long)]
    pub rate: Option<f64>,
    /// Keys preloaded into the LC service [default: 300000; 50000 with --quick].
    #[arg(long)]
    pub keys: Option<u64>,
    /// Value size of preloaded keys and SETs, bytes.
    #[arg(long, default_value_t = 1024)]
    pub value_bytes: usize,
    /// Fraction of requests that SET a new key (the service allocates); the rest GET a random key.
    #[arg(long, default_value_t = 0.5)]
    pub set_ratio: f64,
    /// Connections from the load generator to the service (requests are multiplexed on them).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// A request unanswered after this many ms is an error (its latency still counts).
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Split of BE demand between the file streamer, the anonymous holder and the
    /// elastic cache, FILE:ANON[:ELASTIC].
    #[arg(long, default_value = "2:1:1")]
    pub be_split: BeSplit,
    /// SLO in µs; default: the median over the 0 % kernel-alone runs of their p90
    /// (Hermes §5.3).
    #[arg(long)]
    pub slo_us: Option<u64>,
    /// Output directory for raw results [default: bench/out/colocation/<YYYY-MM-DD>-<hostname>].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Record a failed run and go on with the next one instead of stopping.
    #[arg(long)]
    pub keep_going: bool,
    /// Directory on a real disk (not tmpfs) for the streamer's data file.
    #[arg(long, default_value = "/var/tmp/memcolo-bench")]
    pub data_dir: PathBuf,
    /// Keep the streamer's data file (and its directory) for the next run instead of
    /// removing it at the end.
    #[arg(long)]
    pub keep_data: bool,
    /// Size of the zram swap device set up for the bench.
    #[arg(long, value_parser = parse_bytes_arg, default_value = "8GiB", value_name = "SIZE")]
    pub zram_size: u64,
    /// Do not set up zram swap (anonymous BE memory then cannot be reclaimed).
    #[arg(long)]
    pub no_zram: bool,
    /// Do not pin the LC service and the BE jobs to separate CPUs (Hermes §5.1 pins them).
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
    /// libmemcolo for the alloc and full modes [default: ../lib/libmemcolo.so next to
    /// the memcolo binary, else alloc/build/libmemcolo.so].
    #[arg(long, value_name = "PATH")]
    pub libmemcolo: Option<PathBuf>,
    /// Extra `KEY=VALUE` environment of the LC service in the modes that run it under
    /// libmemcolo (alloc, full), e.g. `--lc-env MEMCOLO_THP=0` (repeat for several;
    /// libmemcolo's options are in alloc/README.md).
    #[arg(long = "lc-env", value_parser = parse_env_pair, value_name = "KEY=VALUE")]
    pub lc_env: Vec<(String, String)>,
    /// The elastic cache job (`gocache` of bench/m3) [default: memcolo-gocache next to
    /// the memcolo binary].
    #[arg(long, value_name = "PATH")]
    pub elastic_cache: Option<PathBuf>,
    /// Extra argument for `memcolo agent` (repeat for several, e.g. --agent-arg=--adv-thr-ratio --agent-arg=0.9).
    #[arg(long = "agent-arg", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
    /// Skip the report (report.md and plots): raw results only.
    #[arg(long)]
    pub no_report: bool,
    /// Extra `key = value` line for the agent's `[reclaim]` section in the fixed and
    /// reclaim modes (repeat for several), e.g. `--reclaim-set "nice = 0"`.
    #[arg(long = "reclaim-set")]
    pub reclaim_set: Vec<String>,
    /// Hermit's batch experiment instead of the LC sweep (`memcolo bench reclaim`
    /// only): a k-means job alone in the node, whose memory is each level's share of
    /// the job's working set (levels then mean local memory, default 100,70,50 %;
    /// modes default kernel,fixed,reclaim). See `bench/reclaim/README.md`.
    #[arg(long)]
    pub batch: bool,
    /// Bytes of k-means points, the batch job's data [default: 1GiB].
    #[arg(long, value_parser = parse_bytes_arg, value_name = "SIZE")]
    pub batch_bytes: Option<u64>,
    /// k-means iterations of the batch job [default: 8; 5 with --quick].
    #[arg(long)]
    pub batch_iters: Option<u32>,
    /// Also run solo baselines of the BE streamer and holder (each alone on the BE
    /// CPUs, no memory pressure; one run per job and level before the sweep), for BE
    /// progress against running alone; BE progress against the kernel alone needs none.
    #[arg(long)]
    pub solo: bool,
    /// The solo baselines' file: rows matching this sweep's demand, phases and CPUs are
    /// reused, missing ones are run and appended [default: <out>/solo.csv].
    #[arg(long, value_name = "FILE")]
    pub solo_csv: Option<PathBuf>,
    /// Solo runs per BE job and level; the solo rate is their median. Runs already in
    /// the solo file count.
    #[arg(long, default_value_t = 1)]
    pub solo_repeats: u32,
    /// Run the solo baselines of the sweep's levels and nothing else.
    #[arg(long)]
    pub solo_only: bool,
}

/// Parses `KEY=VALUE` (a non-empty key of letters, digits and `_`).
fn parse_env_pair(s: &str) -> std::result::Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("{k:?} is not an environment variable name"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// The colocation sweep's default modes.
pub const DEFAULT_MODES: [Mode; 9] = [
    Mode::Kernel,
    Mode::Watermarks,
    Mode::Senpai,
    Mode::Koordinator,
    Mode::Alloc,
    Mode::Advice,
    Mode::M3,
    Mode::Reclaim,
    Mode::Full,
];

/// [`ColocationArgs`] with defaults applied and checked.
#[derive(Clone, Debug)]
pub struct Settings {
    pub levels: Vec<u32>,
    pub modes: Vec<Mode>,
    pub repeats: u32,
    pub max_attempts: u32,
    pub reject_foreign_pct: f64,
    pub reject_steal_pct: f64,
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

impl Settings {
    /// Applies the quick or full defaults and checks ranges.
    pub fn resolve(a: &ColocationArgs) -> Result<Self> {
        let q = a.quick;
        let s = Settings {
            levels: a.levels.clone().unwrap_or_else(|| {
                if q {
                    vec![0, 50, 100, 125, 150]
                } else {
                    vec![0, 50, 75, 100, 125, 150]
                }
            }),
            modes: a.modes.clone().unwrap_or_else(|| DEFAULT_MODES.to_vec()),
            repeats: a.repeats.unwrap_or(if q { 2 } else { 3 }),
            max_attempts: a.max_attempts,
            reject_foreign_pct: a.reject_foreign_pct,
            reject_steal_pct: a.reject_steal_pct,
            node_bytes: a.node_mem.unwrap_or(if q { 2 << 30 } else { 4 << 30 }),
            warmup: Duration::from_secs(a.warmup_s.unwrap_or(if q { 4 } else { 10 })),
            duration: Duration::from_secs(a.duration_s.unwrap_or(if q { 6 } else { 30 })),
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
        if s.repeats == 0 || s.repeats > 100 {
            return bad("--repeats must be in 1..=100".into());
        }
        if s.max_attempts == 0 || s.max_attempts > 10 {
            return bad("--max-attempts must be in 1..=10".into());
        }
        for (name, v) in [
            ("--reject-foreign-pct", s.reject_foreign_pct),
            ("--reject-steal-pct", s.reject_steal_pct),
        ] {
            if !(v.is_finite() && (0.0..=100.0).contains(&v)) {
                return bad(format!("{name} must be in [0, 100]"));
            }
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
        // The LC service must fit in the node next to BE at 0 %, with room for its growth.
        let growth = (s.rate_per_s * s.set_ratio * (s.warmup + s.duration).as_secs_f64()) as u64;
        let dataset = (s.keys + growth) * (s.value_bytes as u64 + 100);
        if dataset > s.node_bytes / 2 {
            return bad(format!(
                "the LC dataset (~{} with the SETs of a run) is over half the node ({}); lower --keys/--rate or raise --node-mem",
                format_bytes(dataset),
                format_bytes(s.node_bytes)
            ));
        }
        Ok(s)
    }
}
