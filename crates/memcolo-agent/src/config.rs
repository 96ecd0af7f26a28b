//! The agent's configuration: an optional TOML file (`/etc/memcolo/agent.toml` by
//! default) whose every field has a default, so `memcolo agent` runs with none.
//!
//! A missing default file means defaults; a file the operator named that is missing
//! or malformed is an error that names the path. Command-line flags are applied on
//! top of the file by the binary.

use memcolo_policy::hermes::AdviceConfig;
use memcolo_policy::m3::{M3Config, SortOrder};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The default configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/memcolo/agent.toml";

/// Errors of loading a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// The whole agent configuration (`agent.toml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// What the agent treats as the node: `"host"` (`/proc/meminfo`) or
    /// `"cgroup:PATH"` (a memory cgroup subtree; its limit is the node's memory).
    /// Default `"host"`.
    pub scope: String,
    /// Unix socket clients connect to. Default `/run/memcolo/agent.sock`.
    pub socket: PathBuf,
    /// Where the registry and monitor state survive restarts. Default `/var/lib/memcolo`.
    pub state_dir: PathBuf,
    /// Prometheus text exposition address (`GET /metrics`), or `"off"`.
    /// Default `127.0.0.1:9464`.
    pub metrics_addr: String,
    /// JSON-lines event log: a path, `"-"` for stderr, or `"off"`. Default `"off"`
    /// (events still go to the tracing log at info level).
    pub event_log: String,
    /// Poll interval in milliseconds. Default 1000 (M3 §6 polls once a second).
    pub poll_ms: u64,
    /// Root of procfs. Default `/proc` (tests point it elsewhere).
    pub procfs: PathBuf,
    /// Keep the agent's own work (polls, page-cache advice) off the CPUs that LC
    /// processes are confined to (their `sched_getaffinity` masks), when other CPUs
    /// remain. Default true; a no-op when LC processes may run anywhere.
    pub avoid_lc_cpus: bool,
    pub m3: M3Section,
    pub hermes: HermesSection,
    pub events: EventsSection,
    pub reclaim: ReclaimSection,
    pub tier: crate::tier::TierSection,
    pub limits: LimitsSection,
    pub kubernetes: KubernetesSection,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            scope: "host".into(),
            socket: PathBuf::from(memcolo_proto::DEFAULT_SOCKET),
            state_dir: PathBuf::from("/var/lib/memcolo"),
            metrics_addr: "127.0.0.1:9464".into(),
            event_log: "off".into(),
            poll_ms: M3Config::DEFAULT_POLL_INTERVAL.as_millis() as u64,
            procfs: PathBuf::from(memcolo_linux::procfs::PROC_ROOT),
            avoid_lc_cpus: true,
            m3: M3Section::default(),
            hermes: HermesSection::default(),
            events: EventsSection::default(),
            reclaim: ReclaimSection::default(),
            tier: crate::tier::TierSection::default(),
            limits: LimitsSection::default(),
            kubernetes: KubernetesSection::default(),
        }
    }
}

/// `[kubernetes]`: the agent on a Kubernetes node (`--kubernetes`). Its scope is then
/// the kubelet's `kubepods` cgroup, its processes are the node's pods, found in that
/// cgroup tree and classed by their `memcolo.io/class` annotation or their QoS class
/// ([`memcolo_policy::kubernetes`]), and a BE pod picked by M3's kill rule is evicted
/// through the API server's Eviction API (`policy/v1`) rather than killed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesSection {
    /// Kubernetes mode. Default false (`--kubernetes` sets it).
    pub enabled: bool,
    /// This node's name (`metadata.name` of its Node; the pod watch's
    /// `spec.nodeName`). Unset by default: `--node-name`, else the `NODE_NAME`
    /// environment variable (the DaemonSet sets it from `spec.nodeName`).
    pub node_name: Option<String>,
    /// The kubelet's `kubepods` group, relative to the cgroup v1 memory mount, else to
    /// the cgroup2 mount: `kubepods` (cgroupfs driver) or `kubepods.slice` (systemd
    /// driver). Unset by default: the first of those two that exists.
    pub kubepods_cgroup: Option<String>,
    /// The class of a Burstable pod without a `memcolo.io/class` annotation: `lc` or
    /// `be`. Default `lc` (why: [`memcolo_policy::kubernetes`]).
    pub burstable_class: memcolo_policy::Class,
    /// Namespaces whose pods may ask, with the `memcolo.io/class` annotation, for more
    /// protection than their QoS class gives (a BestEffort pod calling itself `lc` or
    /// `elastic`); `*` for every namespace. Default empty: anywhere, the annotation is
    /// obeyed only where it asks for less ([`memcolo_policy::kubernetes`]).
    pub trusted_namespaces: Vec<String>,
    /// Grace period of an eviction, seconds. Unset by default: each pod's own
    /// `terminationGracePeriodSeconds`.
    pub eviction_grace_period_s: Option<u64>,
    /// The node's memory signals (the `memcolo.io/memory` annotation, the
    /// `kubernetes.io/batch-memory` extended resource) are published at most this
    /// often, seconds. Default 10.
    pub publish_interval_s: u64,
}

impl Default for KubernetesSection {
    fn default() -> Self {
        KubernetesSection {
            enabled: false,
            node_name: None,
            kubepods_cgroup: None,
            burstable_class: memcolo_policy::Class::Lc,
            trusted_namespaces: Vec::new(),
            eviction_grace_period_s: None,
            publish_interval_s: 10,
        }
    }
}

impl KubernetesSection {
    /// The scope of Kubernetes mode: `cgroup:<kubepods_cgroup>`, or, unset, the first
    /// of `kubepods` and `kubepods.slice` for which `exists` (given the scope spec)
    /// holds. `None` when neither exists.
    pub fn scope(&self, exists: impl Fn(&str) -> bool) -> Option<String> {
        match &self.kubepods_cgroup {
            Some(c) => Some(format!("cgroup:{c}")),
            None => ["kubepods", "kubepods.slice"]
                .iter()
                .map(|c| format!("cgroup:{c}"))
                .find(|s| exists(s)),
        }
    }
}

/// `[limits]`: what one local user may hold of the agent's socket, so that no tenant
/// can exhaust it for the others or for root (docs/security.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsSection {
    /// Connections served at once, all users together. Default 1024.
    pub connections: usize,
    /// Of `connections`, how many only root may take. Default 64.
    pub root_reserved_connections: usize,
    /// Connections one non-root user may hold at once. Default 64.
    pub connections_per_uid: usize,
    /// Processes one non-root user may have registered at once. Default 1024.
    pub registrations_per_uid: usize,
    /// Child cgroups (`memcolo run --cgroup`) one non-root user may have. Default 16.
    pub cgroups_per_uid: usize,
    /// A connection whose reply or notification cannot be written for this long (the
    /// client does not read) is closed. Default 10000 ms.
    pub write_timeout_ms: u64,
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            connections: 1024,
            root_reserved_connections: 64,
            connections_per_uid: 64,
            registrations_per_uid: 1024,
            cgroups_per_uid: 16,
            write_timeout_ms: 10_000,
        }
    }
}

/// `[m3]`: the M3 node monitor (M3 §5, §6).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct M3Section {
    /// The top of memory in bytes. Default: the scope's memory minus `top_margin_ratio`.
    pub top_bytes: Option<u64>,
    /// Share of the scope's memory kept below the top when `top_bytes` is unset.
    /// Default 0.03125 (2 GiB of 64 GiB, as M3 §6's 62 of 64 GB).
    pub top_margin_ratio: f64,
    /// Initial low threshold in bytes. Default top × 50/62 (M3 §6).
    pub low_bytes: Option<u64>,
    /// Initial high threshold in bytes. Default top × 55/62 (M3 §6).
    pub high_bytes: Option<u64>,
    /// Samples in the time-in-red sliding window. Default 32 (M3 §6).
    pub window_samples: usize,
    /// Target ratio T_red : T_green_or_yellow as `[red, other]`. Default `[1, 32]`.
    pub ratio_target: [u32; 2],
    /// Threshold step as a share of top. Default 0.02 (M3 §6).
    pub step_ratio: f64,
    /// Algorithm 1 order: `newest_first` (default), `oldest_first`, `largest_rss`,
    /// `largest_expected_reclaim`.
    pub sort_order: SortOrder,
    /// Seconds above top before BE processes are killed. Default 30.
    pub kill_after_s: u64,
    /// `reclaimed` answers averaged into a process's expected reclamation, the bytes
    /// it is expected to free itself when notified (M3 §5.1; not the agent's page-out).
    /// Default 5.
    pub reclaim_history: usize,
    /// Seconds before a process with an unanswered notification is notified again
    /// at the same level. Default 5.
    pub resignal_after_s: u64,
    /// Algorithm 1 walks processes holding less than an equal share of top last
    /// (rule R3c of `memcolo_policy::m3`). Default false (the paper's Algorithm 1).
    pub fair_share: bool,
    /// On a cgroup v2 scope, entering the red zone (at or above high) sets `memory.high`
    /// of each memory cgroup that holds only BE processes to its usage, so the kernel
    /// throttles the job and reclaims from it instead of from the node; back at or
    /// below low the previous `memory.high` is restored (Senpai; KEP-2570's memory
    /// throttling). Notifications and the kill above top still apply. No effect on
    /// v1, which has no `memory.high`. Default true (bench/v2qos).
    pub be_memory_high: bool,
}

impl Default for M3Section {
    /// The monitor's own defaults ([`M3Config::with_top`]); the agent adds only the
    /// scaling to the scope's memory.
    fn default() -> Self {
        let (top, memory) = M3Config::DEFAULT_TOP_OF_MEMORY;
        let (step, of_top) = M3Config::DEFAULT_STEP_OF_TOP;
        let (red, other) = M3Config::DEFAULT_RATIO_TARGET;
        let paper = M3Config::with_top(0);
        M3Section {
            top_bytes: None,
            top_margin_ratio: (memory - top) as f64 / memory as f64,
            low_bytes: None,
            high_bytes: None,
            window_samples: M3Config::DEFAULT_WINDOW_SAMPLES,
            ratio_target: [red, other],
            step_ratio: step as f64 / of_top as f64,
            sort_order: paper.sort_order,
            kill_after_s: M3Config::DEFAULT_KILL_AFTER.as_secs(),
            reclaim_history: M3Config::DEFAULT_RECLAIM_HISTORY,
            resignal_after_s: M3Config::DEFAULT_RESIGNAL_AFTER.as_secs(),
            fair_share: paper.fair_share,
            be_memory_high: true,
        }
    }
}

/// `[hermes]`: proactive file-cache advice for BE processes (Hermes §3.3).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HermesSection {
    /// Turn the advice on or off. Default on.
    pub enabled: bool,
    /// `adv_thr` in bytes of used memory (page cache included). Default: unset, so
    /// `adv_thr_ratio` of the scope's memory applies.
    pub adv_thr_bytes: Option<u64>,
    /// `adv_thr` as a share of the scope's memory. Default 0.85.
    pub adv_thr_ratio: f64,
    /// Files with less page cache than this are left alone. Default 1 MiB.
    pub min_resident_bytes: u64,
}

impl Default for HermesSection {
    fn default() -> Self {
        HermesSection {
            enabled: true,
            adv_thr_bytes: None,
            adv_thr_ratio: AdviceConfig::DEFAULT_ADV_THR_RATIO,
            min_resident_bytes: AdviceConfig::DEFAULT_MIN_RESIDENT_BYTES,
        }
    }
}

/// `[events]`: kernel pressure events that trigger a poll between ticks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventsSection {
    /// cgroup v1 `memory.pressure_level` eventfd at this level (`low`, `medium`,
    /// `critical`), or `"off"`. Default `"low"`: the kernel signals reclaim activity.
    pub v1_pressure_level: String,
    /// PSI trigger on memory `some` stall: microseconds of stall per window, or 0 for
    /// off. Default 100 000 (100 ms per 2 s window).
    pub psi_stall_us: u64,
    /// PSI trigger window in microseconds (the kernel takes 500 ms..10 s; unprivileged
    /// triggers need multiples of 2 s). Default 2 000 000.
    pub psi_window_us: u64,
    /// Shortest gap between two event-triggered polls, in milliseconds. Default 100.
    pub min_gap_ms: u64,
    /// cgroup v1 scope: register memory usage thresholds (`cgroup.event_control`) at
    /// every M3 threshold step (`m3.step_ratio` of top) from the initial low threshold
    /// up to the scope's limit, so that usage crossing one of them triggers a poll at
    /// once rather than at the next tick: between ticks a job can grow by more than
    /// the margin between the top and the limit. Default true.
    pub v1_usage_thresholds: bool,
}

impl Default for EventsSection {
    fn default() -> Self {
        EventsSection {
            v1_pressure_level: "low".into(),
            psi_stall_us: 100_000,
            psi_window_us: 2_000_000,
            min_gap_ms: 100,
            v1_usage_thresholds: true,
        }
    }
}

/// `[reclaim]`: feedback-directed asynchronous reclaim of BE memory (Hermit, NSDI'23),
/// so that the scope keeps free headroom and LC processes never reclaim on their
/// own allocation path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReclaimSection {
    /// Run the reclaim scheduler and its workers. Default true (README, "Why reclaim
    /// is on by default").
    pub enabled: bool,
    /// Scheduler tick while reclaim is engaged, milliseconds (the high mark covers
    /// the allocation of one). Default 20.
    pub tick_ms: u64,
    /// Scheduler tick while idle with margin, milliseconds (at least `tick_ms`): no
    /// worker is wanted and the headroom above the low mark covers twice the burst
    /// allocation of one idle tick (`memcolo_policy::hermit::ReclaimDecision::next_tick`).
    /// Default 200.
    pub idle_tick_ms: u64,
    /// CPU budget in workers. Default: the number of CPUs no LC process is confined
    /// to (at least 1), so reclaim never takes an LC core.
    pub max_workers: Option<u32>,
    /// Bytes one worker reclaims per batch at low allocation rates. Default 16 MiB.
    pub batch_bytes: u64,
    /// Largest batch while allocation streams (a batch covers `batch_period_ms` of
    /// the allocation rate; `memcolo_policy::hermit::ReclaimConfig::max_batch_bytes`);
    /// `batch_bytes` keeps every batch at `batch_bytes`. Default 64 MiB.
    pub max_batch_bytes: u64,
    /// Allocation a batch covers, milliseconds (1..=10000). Default 100.
    pub batch_period_ms: u64,
    /// Floor of the high mark in bytes. Default 32 MiB.
    pub min_high_bytes: u64,
    /// Ceiling of the proactive band (low mark) as a share of the scope's memory;
    /// the high mark is never cut by it. Default 0.02.
    pub max_low_ratio: f64,
    /// Stop while free swap is below this share of total swap. Default 0.05.
    pub swap_stop_free_ratio: f64,
    /// Nice value of the worker threads (0..=19). Default: 0 while the agent is
    /// confined off the LC processes' CPUs (reclaim then competes only with BE work,
    /// which causes the pressure and must not starve it) or no LC process is
    /// registered, 10 otherwise (LC threads may share the CPU: reclaim yields to them).
    pub nice: Option<i32>,
    /// `auto` (a target's own memory cgroup when it holds no LC process, else
    /// `process_madvise` on the process), `cgroup` or `process`. Default `auto`.
    pub mechanism: String,
    /// Drop a target's clean page cache before anything else, lowest file offset
    /// first (files an LC process holds excepted), and ask the kernel's LRU (v1 limit
    /// step, `memory.reclaim`, pageout) only for the rest. Default true.
    pub file_first: bool,
    /// Reclaim elastic processes' memory too (after BE). Default false.
    pub include_elastic: bool,
    /// Allow reclaiming LC processes' memory. Default false: never.
    pub allow_lc: bool,
    /// Extra BE memory cgroups (absolute paths) to reclaim from without registering
    /// their processes.
    pub cgroups: Vec<PathBuf>,
    /// Replace the adaptive marks by one fixed low mark (bytes) and a single worker:
    /// the kswapd / Fastswap design, for comparison. Default unset.
    pub fixed_low_bytes: Option<u64>,
    /// Evicted pages the page-turnaround sampler follows at once (eviction by a
    /// batch to refault, read from `/proc/PID/pagemap`); 0 turns sampling off.
    /// Default 512.
    pub turnaround_samples: usize,
    /// How often the sampler reads the followed pages, milliseconds. Default 500.
    pub turnaround_poll_ms: u64,
    /// A sampled page still out after this many seconds is censored (1..=3600).
    /// Default 120.
    pub turnaround_horizon_s: u64,
    /// Back-off (Hermit's slides, "Hermit's Adaptive Reclaim Scheduling": page
    /// turnaround; `memcolo_policy::hermit`): a page turnaround below this many
    /// milliseconds means thrashing whatever its trend (0: only a fall counts).
    /// Below the horizon when sampling is on. Default 1000.
    pub thrash_turnaround_ms: u64,
    /// Back-off: turnaround "falls" when it is below this share of the previous
    /// adapt period's (same source), in (0, 1). Default 0.5.
    pub turnaround_drop_ratio: f64,
    /// Back-off: adapt periods (`adapt_period_ms`) the scheduler stays backed off
    /// after a fall, 0..=3600 (0: never back off). Default 3.
    pub backoff_periods: u32,
    /// How often the low multiplier `k` and the back-off adapt, milliseconds,
    /// 1..=60000. Default 1000.
    pub adapt_period_ms: u64,
    /// Sampled evictions of the last 10 s needed before their median turnaround
    /// steers the back-off (fewer: the Little's-law mean does); 1..=`turnaround_samples`
    /// when sampling is on. Default 16.
    pub min_turnaround_samples: u32,
}

impl Default for ReclaimSection {
    fn default() -> Self {
        let p = memcolo_policy::hermit::ReclaimConfig::default();
        let sampler = TurnaroundConfig::default();
        ReclaimSection {
            enabled: true,
            tick_ms: p.tick.as_millis() as u64,
            idle_tick_ms: p.idle_tick.as_millis() as u64,
            max_workers: None,
            batch_bytes: p.batch_bytes,
            max_batch_bytes: p.max_batch_bytes,
            batch_period_ms: p.batch_period.as_millis() as u64,
            min_high_bytes: p.min_high_bytes,
            max_low_ratio: p.max_low_ratio,
            swap_stop_free_ratio: p.swap_stop_free_ratio,
            nice: None,
            mechanism: "auto".into(),
            file_first: true,
            include_elastic: false,
            allow_lc: false,
            cgroups: Vec::new(),
            fixed_low_bytes: None,
            turnaround_samples: sampler.capacity,
            turnaround_poll_ms: sampler.poll.as_millis() as u64,
            turnaround_horizon_s: sampler.horizon.as_secs(),
            thrash_turnaround_ms: p.thrash_turnaround.as_millis() as u64,
            turnaround_drop_ratio: p.turnaround_drop_ratio,
            backoff_periods: p.backoff_periods,
            adapt_period_ms: p.adapt_period.as_millis() as u64,
            min_turnaround_samples: p.min_turnaround_samples,
        }
    }
}

impl ReclaimSection {
    /// The scheduler's configuration with a CPU budget of `workers`.
    pub fn scheduler_config(&self, workers: u32) -> memcolo_policy::hermit::ReclaimConfig {
        memcolo_policy::hermit::ReclaimConfig {
            max_workers: workers.max(1),
            batch_bytes: self.batch_bytes,
            max_batch_bytes: self.max_batch_bytes,
            batch_period: Duration::from_millis(self.batch_period_ms),
            min_high_bytes: self.min_high_bytes,
            max_low_ratio: self.max_low_ratio,
            swap_stop_free_ratio: self.swap_stop_free_ratio,
            fixed_low_bytes: self.fixed_low_bytes,
            thrash_turnaround: Duration::from_millis(self.thrash_turnaround_ms),
            turnaround_drop_ratio: self.turnaround_drop_ratio,
            backoff_periods: self.backoff_periods,
            adapt_period: Duration::from_millis(self.adapt_period_ms),
            min_turnaround_samples: self.min_turnaround_samples,
            tick: Duration::from_millis(self.tick_ms),
            idle_tick: Duration::from_millis(self.idle_tick_ms),
            ..Default::default()
        }
    }
}

/// Whether `s` is a Kubernetes object name of the DNS subdomain kind (RFC 1123: at
/// most 253 characters, lowercase alphanumerics, `-` and `.`, alphanumeric at both
/// ends), as Node names are.
pub fn is_dns_subdomain(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 253
        && b.iter().all(|c| alnum(c) || *c == b'-' || *c == b'.')
        && alnum(&b[0])
        && alnum(&b[b.len() - 1])
}

/// Whether `s` is an RFC 1123 label, as Kubernetes namespace names are: 1–63
/// lowercase letters, digits and `-`, starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
}

impl AgentConfig {
    /// Loads `path`, or the default file when `path` is `None` (a missing default
    /// file means defaults).
    pub fn load(path: Option<&Path>) -> Result<AgentConfig, ConfigError> {
        let (path, named) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !named && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(AgentConfig::default())
            }
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        let cfg: AgentConfig =
            toml::from_str(&text).map_err(|source| ConfigError::Parse { path, source })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks ranges that serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.poll_ms == 0 {
            return bad("poll_ms must be at least 1".into());
        }
        let k = &self.kubernetes;
        if k.enabled {
            if self.scope != "host" {
                return bad(format!(
                    "scope `{}` and kubernetes.enabled: in Kubernetes mode the scope is the \
                     kubepods cgroup (set kubernetes.kubepods_cgroup instead)",
                    self.scope
                ));
            }
            if !matches!(
                k.burstable_class,
                memcolo_policy::Class::Lc | memcolo_policy::Class::Be
            ) {
                return bad("kubernetes.burstable_class must be lc or be".into());
            }
            if let Some(n) = k
                .trusted_namespaces
                .iter()
                .find(|n| *n != "*" && !is_dns_label(n))
            {
                return bad(format!(
                    "kubernetes.trusted_namespaces: `{}` is not a namespace name (an RFC 1123 label) nor `*`",
                    n.chars().take(64).collect::<String>()
                ));
            }
            if k.publish_interval_s == 0 {
                return bad("kubernetes.publish_interval_s must be at least 1".into());
            }
            match &k.node_name {
                Some(n) if !is_dns_subdomain(n) => {
                    return bad(format!(
                        "kubernetes.node_name `{n}` is not a DNS subdomain (RFC 1123)"
                    ))
                }
                _ => {}
            }
        }
        let l = &self.limits;
        if l.root_reserved_connections == 0 || l.root_reserved_connections >= l.connections {
            return bad(format!(
                "limits.root_reserved_connections {} must be at least 1 and below limits.connections {}",
                l.root_reserved_connections, l.connections
            ));
        }
        if l.connections_per_uid == 0 || l.registrations_per_uid == 0 || l.write_timeout_ms == 0 {
            return bad("limits.connections_per_uid, registrations_per_uid and write_timeout_ms must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.m3.top_margin_ratio) {
            return bad(format!(
                "m3.top_margin_ratio {} is not in [0, 1)",
                self.m3.top_margin_ratio
            ));
        }
        if !(self.m3.step_ratio > 0.0 && self.m3.step_ratio < 1.0) {
            return bad(format!(
                "m3.step_ratio {} is not in (0, 1)",
                self.m3.step_ratio
            ));
        }
        if self.m3.window_samples == 0 || self.m3.reclaim_history == 0 {
            return bad("m3.window_samples and m3.reclaim_history must be at least 1".into());
        }
        if self.m3.ratio_target[1] == 0 {
            return bad("m3.ratio_target's second number must be at least 1".into());
        }
        if let (Some(l), Some(h)) = (self.m3.low_bytes, self.m3.high_bytes) {
            if l > h {
                return bad(format!("m3.low_bytes {l} is above m3.high_bytes {h}"));
            }
        }
        if !(self.hermes.adv_thr_ratio > 0.0 && self.hermes.adv_thr_ratio <= 1.0) {
            return bad(format!(
                "hermes.adv_thr_ratio {} is not in (0, 1]",
                self.hermes.adv_thr_ratio
            ));
        }
        if !matches!(
            self.events.v1_pressure_level.as_str(),
            "off" | "low" | "medium" | "critical"
        ) {
            return bad(format!(
                "events.v1_pressure_level `{}` is not off, low, medium or critical",
                self.events.v1_pressure_level
            ));
        }
        let r = &self.reclaim;
        if r.tick_ms == 0 {
            return bad("reclaim.tick_ms must be at least 1".into());
        }
        if r.idle_tick_ms < r.tick_ms {
            return bad(format!(
                "reclaim.idle_tick_ms {} is below reclaim.tick_ms {}",
                r.idle_tick_ms, r.tick_ms
            ));
        }
        if let Some(n) = r.nice.filter(|n| !(0..=19).contains(n)) {
            return bad(format!("reclaim.nice {n} is not in 0..=19"));
        }
        if !matches!(r.mechanism.as_str(), "auto" | "cgroup" | "process") {
            return bad(format!(
                "reclaim.mechanism `{}` is not auto, cgroup or process",
                r.mechanism
            ));
        }
        if let Some(p) = r.cgroups.iter().find(|p| !p.is_absolute()) {
            return bad(format!(
                "reclaim.cgroups entry {} is not absolute",
                p.display()
            ));
        }
        if r.backoff_periods > 3600 {
            return bad(format!(
                "reclaim.backoff_periods {} is not in 0..=3600",
                r.backoff_periods
            ));
        }
        if !(1..=60_000).contains(&r.adapt_period_ms) {
            return bad(format!(
                "reclaim.adapt_period_ms {} is not in 1..=60000",
                r.adapt_period_ms
            ));
        }
        if !(1..=10_000).contains(&r.batch_period_ms) {
            return bad(format!(
                "reclaim.batch_period_ms {} is not in 1..=10000",
                r.batch_period_ms
            ));
        }
        if r.min_turnaround_samples == 0 {
            return bad("reclaim.min_turnaround_samples must be at least 1".into());
        }
        if r.turnaround_samples > 0 {
            if r.min_turnaround_samples as usize > r.turnaround_samples {
                return bad(format!(
                    "reclaim.min_turnaround_samples {} exceeds turnaround_samples {}: \
                     the sampled turnaround could never steer the back-off",
                    r.min_turnaround_samples, r.turnaround_samples
                ));
            }
            if r.thrash_turnaround_ms >= r.turnaround_horizon_s * 1000 {
                return bad(format!(
                    "reclaim.thrash_turnaround_ms {} is not below turnaround_horizon_s \
                     ({} s): every sampled turnaround would read as thrashing",
                    r.thrash_turnaround_ms, r.turnaround_horizon_s
                ));
            }
        }
        r.scheduler_config(r.max_workers.unwrap_or(1))
            .validate()
            .map_err(|e| ConfigError::Invalid(format!("reclaim: {e}")))?;
        if r.max_workers == Some(0) {
            return bad("reclaim.max_workers must be at least 1".into());
        }
        if r.turnaround_poll_ms == 0 {
            return bad("reclaim.turnaround_poll_ms must be at least 1".into());
        }
        if !(1..=3600).contains(&r.turnaround_horizon_s) {
            return bad(format!(
                "reclaim.turnaround_horizon_s {} is not in 1..=3600",
                r.turnaround_horizon_s
            ));
        }
        Ok(())
    }

    /// The poll interval.
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_ms)
    }

    /// The M3 monitor's configuration for a scope of `scope_bytes` of memory.
    pub fn m3_config(&self, scope_bytes: u64) -> memcolo_policy::m3::M3Config {
        let top = self
            .m3
            .top_bytes
            .unwrap_or((scope_bytes as f64 * (1.0 - self.m3.top_margin_ratio)) as u64);
        let mut c = memcolo_policy::m3::M3Config::with_top(top);
        if let Some(l) = self.m3.low_bytes {
            c.low_bytes = l.min(top);
        }
        if let Some(h) = self.m3.high_bytes {
            c.high_bytes = h.min(top);
        }
        c.window_samples = self.m3.window_samples;
        c.ratio_target = (self.m3.ratio_target[0], self.m3.ratio_target[1]);
        c.step_bytes = ((top as f64) * self.m3.step_ratio) as u64;
        c.sort_order = self.m3.sort_order;
        c.kill_after = Duration::from_secs(self.m3.kill_after_s);
        c.reclaim_history = self.m3.reclaim_history;
        c.resignal_after = Duration::from_secs(self.m3.resignal_after_s);
        // R8: event-triggered polls between two ticks repeat no notification.
        c.min_signal_interval = Duration::from_millis(self.poll_ms);
        c.fair_share = self.m3.fair_share;
        c
    }

    /// Hermes' `adv_thr` in bytes for a scope of `scope_bytes` of memory.
    pub fn adv_thr_bytes(&self, scope_bytes: u64) -> u64 {
        self.hermes
            .adv_thr_bytes
            .unwrap_or((scope_bytes as f64 * self.hermes.adv_thr_ratio) as u64)
    }
}

/// The settings of asynchronous reclaim's turnaround sampler
/// ([`crate::async_reclaim::turnaround`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TurnaroundConfig {
    /// Evicted pages followed at once, at most; more are turned away.
    pub capacity: usize,
    /// How often the followed pages' pagemap entries are read.
    pub poll: Duration,
    /// A page still out after this long is censored (at most 1 h).
    pub horizon: Duration,
    /// Quantiles cover the refaults and censorings of the last one to two windows.
    pub window: Duration,
    /// [`TurnaroundSampler::recent`] covers the pages evicted this long ago or less.
    pub recent: Duration,
    /// The quantile (0..1) that [`TurnaroundSampler::recent`] estimates.
    pub recent_quantile: f64,
}

impl Default for TurnaroundConfig {
    fn default() -> Self {
        TurnaroundConfig {
            capacity: 512,
            poll: Duration::from_millis(500),
            horizon: Duration::from_secs(120),
            window: Duration::from_secs(60),
            recent: Duration::from_secs(10),
            recent_quantile: 0.5,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn missing_default_file_means_defaults_but_named_file_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("none.toml");
        let err = AgentConfig::load(Some(&p)).unwrap_err();
        assert!(err.to_string().contains("none.toml"), "{err}");
    }

    #[test]
    fn kubernetes_section() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.toml");
        std::fs::write(
            &p,
            "[kubernetes]\nenabled = true\nnode_name = \"worker-1\"\nburstable_class = \"be\"\n",
        )
        .unwrap();
        let c = AgentConfig::load(Some(&p)).unwrap();
        assert!(c.kubernetes.enabled);
        assert_eq!(c.kubernetes.burstable_class, memcolo_policy::Class::Be);
        assert_eq!(c.kubernetes.publish_interval_s, 10);
        // The scope: the named group, else the first kubepods group that exists.
        assert_eq!(
            c.kubernetes.scope(|s| s == "cgroup:kubepods.slice"),
            Some("cgroup:kubepods.slice".into())
        );
        assert_eq!(c.kubernetes.scope(|_| false), None);
        let named = KubernetesSection {
            kubepods_cgroup: Some("kubelet.slice/kubelet-kubepods.slice".into()),
            ..Default::default()
        };
        assert_eq!(
            named.scope(|_| false),
            Some("cgroup:kubelet.slice/kubelet-kubepods.slice".into())
        );
        for bad in [
            "scope = \"cgroup:x\"\n[kubernetes]\nenabled = true\n",
            "[kubernetes]\nenabled = true\nburstable_class = \"elastic\"\n",
            "[kubernetes]\nenabled = true\nnode_name = \"Worker_1\"\n",
            "[kubernetes]\nenabled = true\npublish_interval_s = 0\n",
            "[kubernetes]\nenabled = true\ntrusted_namespaces = [\"prod\", \"a.b\"]\n",
            "[kubernetes]\nenabled = true\ntrusted_namespaces = \"prod\"\n",
            "[kubernetes]\nenabeld = true\n",
        ] {
            std::fs::write(&p, bad).unwrap();
            assert!(AgentConfig::load(Some(&p)).is_err(), "{bad}");
        }
        std::fs::write(
            &p,
            "[kubernetes]\nenabled = true\ntrusted_namespaces = [\"prod\", \"*\"]\n",
        )
        .unwrap();
        let c = AgentConfig::load(Some(&p)).unwrap();
        assert_eq!(c.kubernetes.trusted_namespaces, ["prod", "*"]);
        assert!(
            is_dns_label("kube-system") && !is_dns_label("a.b") && !is_dns_label(&"a".repeat(64))
        );
        assert!(is_dns_subdomain("ip-10-0-0-11.ec2.internal"));
        assert!(!is_dns_subdomain("-a") && !is_dns_subdomain("") && !is_dns_subdomain("a b"));
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.toml");
        let mut f = std::fs::File::create(&p).unwrap();
        writeln!(
            f,
            "poll_ms = 250\n[m3]\nkill_after_s = 10\nsort_order = \"largest_rss\""
        )
        .unwrap();
        let c = AgentConfig::load(Some(&p)).unwrap();
        assert_eq!(c.poll_ms, 250);
        assert_eq!(c.m3.kill_after_s, 10);
        assert_eq!(c.m3.sort_order, SortOrder::LargestRss);
        assert_eq!(c.m3.window_samples, 32);
        assert!(c.hermes.enabled);
    }

    #[test]
    fn unknown_or_bad_fields_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.toml");
        std::fs::write(&p, "pol_ms = 5\n").unwrap();
        let err = AgentConfig::load(Some(&p)).unwrap_err().to_string();
        assert!(err.contains("b.toml") && err.contains("pol_ms"), "{err}");
        std::fs::write(&p, "[hermes]\nadv_thr_ratio = 1.5\n").unwrap();
        assert!(AgentConfig::load(Some(&p)).is_err());
        std::fs::write(&p, "[events]\nv1_pressure_level = \"loud\"\n").unwrap();
        assert!(AgentConfig::load(Some(&p)).is_err());
    }

    #[test]
    fn reclaim_back_off_thresholds_reach_the_scheduler() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.toml");
        // Defaults are the scheduler's own.
        let d = AgentConfig::default().reclaim.scheduler_config(1);
        let policy = memcolo_policy::hermit::ReclaimConfig::default();
        assert_eq!(d.thrash_turnaround, policy.thrash_turnaround);
        assert_eq!(d.turnaround_drop_ratio, policy.turnaround_drop_ratio);
        assert_eq!(d.backoff_periods, policy.backoff_periods);
        assert_eq!(d.adapt_period, policy.adapt_period);
        assert_eq!(d.min_turnaround_samples, policy.min_turnaround_samples);
        std::fs::write(
            &p,
            "[reclaim]\nthrash_turnaround_ms = 2500\nturnaround_drop_ratio = 0.25\n\
             backoff_periods = 5\nadapt_period_ms = 500\nmin_turnaround_samples = 32\n",
        )
        .unwrap();
        let c = AgentConfig::load(Some(&p)).unwrap();
        let s = c.reclaim.scheduler_config(2);
        assert_eq!(s.thrash_turnaround, Duration::from_millis(2500));
        assert_eq!(s.turnaround_drop_ratio, 0.25);
        assert_eq!(s.backoff_periods, 5);
        assert_eq!(s.adapt_period, Duration::from_millis(500));
        assert_eq!(s.min_turnaround_samples, 32);
        // 0 turns each part off without being an error.
        std::fs::write(
            &p,
            "[reclaim]\nthrash_turnaround_ms = 0\nbackoff_periods = 0\n",
        )
        .unwrap();
        AgentConfig::load(Some(&p)).unwrap();
    }

    #[test]
    fn bad_reclaim_back_off_thresholds_are_refused_with_the_field_and_rule() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.toml");
        for (body, words) in [
            (
                "turnaround_drop_ratio = 1.0",
                &["turnaround_drop_ratio", "(0, 1)"][..],
            ),
            (
                "turnaround_drop_ratio = 0.0",
                &["turnaround_drop_ratio", "(0, 1)"],
            ),
            (
                "backoff_periods = 4000",
                &["backoff_periods 4000", "0..=3600"],
            ),
            ("adapt_period_ms = 0", &["adapt_period_ms 0", "1..=60000"]),
            ("adapt_period_ms = 60001", &["adapt_period_ms 60001"]),
            (
                "min_turnaround_samples = 0",
                &["min_turnaround_samples", "at least 1"],
            ),
            (
                "min_turnaround_samples = 600",
                &[
                    "min_turnaround_samples 600",
                    "turnaround_samples 512",
                    "never steer",
                ],
            ),
            (
                "thrash_turnaround_ms = 120000",
                &["thrash_turnaround_ms 120000", "120 s", "thrashing"],
            ),
            ("thrash_turnaround_ms = -1", &["thrash_turnaround_ms"]),
        ] {
            std::fs::write(&p, format!("[reclaim]\n{body}\n")).unwrap();
            let err = AgentConfig::load(Some(&p)).unwrap_err().to_string();
            for w in words {
                assert!(err.contains(w), "{body}: {err}");
            }
        }
        // Without sampling the sample-size and horizon rules do not apply.
        std::fs::write(
            &p,
            "[reclaim]\nturnaround_samples = 0\nmin_turnaround_samples = 600\n\
             thrash_turnaround_ms = 200000\n",
        )
        .unwrap();
        AgentConfig::load(Some(&p)).unwrap();
    }

    #[test]
    fn m3_section_defaults_are_the_monitors() {
        let c = AgentConfig::default();
        for gib in [2u64, 24, 64, 256] {
            let scope = gib << 30;
            let (top, of) = M3Config::DEFAULT_TOP_OF_MEMORY;
            let paper = M3Config::with_top(scope / of * top);
            assert_eq!(c.m3_config(scope), paper, "{gib} GiB");
        }
        assert_eq!(c.poll_interval(), M3Config::DEFAULT_POLL_INTERVAL);
    }

    #[test]
    fn hermes_section_defaults_are_the_advices() {
        let h = HermesSection::default();
        assert_eq!(h.adv_thr_ratio, AdviceConfig::DEFAULT_ADV_THR_RATIO);
        assert_eq!(
            h.min_resident_bytes,
            AdviceConfig::DEFAULT_MIN_RESIDENT_BYTES
        );
    }

    #[test]
    fn reclaim_section_defaults_are_the_schedulers_and_samplers() {
        let r = ReclaimSection::default();
        assert_eq!(
            r.scheduler_config(1),
            memcolo_policy::hermit::ReclaimConfig::default()
        );
        let t = TurnaroundConfig::default();
        assert_eq!(r.turnaround_samples, t.capacity);
        assert_eq!(Duration::from_millis(r.turnaround_poll_ms), t.poll);
        assert_eq!(Duration::from_secs(r.turnaround_horizon_s), t.horizon);
    }

    #[test]
    fn tier_section_defaults_are_the_tier_managers_and_nodes() {
        let t = crate::tier::TierSection::default();
        let m = memcolo_tier::manager::TierConfig::new(0);
        let n = memcolo_tier::node::NodeTiming::default();
        assert_eq!(Duration::from_millis(t.window_ms), n.window);
        assert_eq!(t.windows_per_epoch, n.windows_per_epoch);
        assert_eq!(t.slots_per_window, n.slots_per_window);
        assert_eq!(t.sample_pages, m.sample_pages);
        assert_eq!(t.sample_target_hits, m.sample_target_hits);
        assert_eq!(t.sample_fmmr_error, m.sample_fmmr_error);
        assert_eq!(t.evict_workers, m.evict_workers);
        assert_eq!(t.probation_pages, m.probation_pages);
        assert_eq!(t.refault_samples, m.refault_samples);
    }

    #[test]
    fn m3_defaults_follow_the_paper_proportions() {
        let c = AgentConfig::default();
        let gib = 1u64 << 30;
        let m = c.m3_config(64 * gib);
        assert_eq!(m.top_bytes, 62 * gib);
        assert_eq!(m.low_bytes, 50 * gib);
        assert_eq!(m.high_bytes, 55 * gib);
        assert_eq!(c.adv_thr_bytes(100), 85);
    }
}
