//! The node model: discrete time at a fixed step, memory in bytes, processes that
//! allocate, touch and stream, a kernel that reclaims on the allocating thread, and
//! memcolo's agent driving the policy crate's own state machines.
//!
//! # What is modelled (per step of `step` seconds)
//! - **Memory**: `total` bytes of RAM and `swap` bytes of far tier (zram). Each process
//!   holds anonymous memory resident (`anon`) or swapped (`swapped`), and page cache
//!   (`file`). `free = total - Σ(anon + file)` never goes below 0 and `Σ swapped <=
//!   swap` (checked by [`Node::check`]).
//! - **Allocation** (a process growing, a page cache miss, a swap-in): taken from free
//!   memory; when free memory is short the kernel reclaims on the allocating thread
//!   (direct reclaim): page cache only while there is plenty of it (the kernel's
//!   cache-trim mode), else page cache and anonymous memory into swap in the
//!   proportion `vm.swappiness` sets, the anonymous share spread over the processes in
//!   proportion to their resident anonymous bytes (a latency-critical process's
//!   weighted by [`Calibration::lc_lru_weight`]). The
//!   allocating process is charged the reclaim time ([`Calibration::file_reclaim_us`],
//!   [`Calibration::anon_reclaim_us`], × [`Calibration::direct_reclaim_factor`]).
//!   When nothing can be reclaimed the kernel's OOM killer takes the process with the
//!   most memory (resident + swapped).
//! - **Access**: a process touching its working set faults its swapped share back
//!   ([`Calibration::swapin_us`] per page, an allocation like any other).
//! - **memcolo** (when on): every step Hermit's [`ReclaimScheduler`] decides the
//!   asynchronous reclaim workers, which reclaim batch processes' page cache then
//!   anonymous memory; every poll (1 s) M3's [`Monitor`] gets the working set and the
//!   registered processes and its signals and kills are carried out, and Hermes'
//!   [`plan_advice`] drops batch files' page cache. These are the agent's calls
//!   (`memcolo_agent::core`), with the model's figures as the observations.
//!
//! Latency of a latency-critical (LC) process: each request costs
//! a log-normal service time ([`Calibration::lc_service_us`] median,
//! [`Calibration::lc_service_p90_us`] p90), plus, for a share of requests, an
//! exponential delay of the service's own ([`Calibration::lc_tail_share`]) and one of
//! the batch jobs' interference, whose share grows with their resident memory
//! ([`Calibration::be_interference_share`]), plus its own swap-ins, plus the wait
//! behind the process's stalls (its direct reclaim and the swap-ins of earlier
//! requests) and its backlog when the stalls exceed the step. A fixed number of requests per step is
//! sampled, each weighted by the requests it stands for.

use crate::calib::Calibration;
use memcolo_policy::hermes::{plan_advice, AdviceConfig, FileCache};
use memcolo_policy::hermit::{ReclaimConfig, ReclaimObservation, ReclaimScheduler};
use memcolo_policy::m3::{Action, M3Config, Monitor, ProcView};
use memcolo_policy::{Class, Level, Pid};
use memcolo_sdk::gate::AllowRateGate;
use rand_xoshiro::rand_core::{Rng as _, SeedableRng};
use rand_xoshiro::SplitMix64;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

mod latency;
use latency::weighted_quantile;

/// Requests of an LC process sampled per step for its latency distribution, by
/// default ([`NodeConfig::lc_samples_per_step`]).
pub const LC_SAMPLES_PER_STEP: usize = 16;

/// What a process does.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Workload {
    /// A latency-critical service: holds `ws_bytes` of anonymous memory (allocated at
    /// `grow_bytes_per_s` from its start) and serves `rate` requests per second, each
    /// touching [`Calibration::lc_pages_per_request`] random pages of it.
    Lc {
        ws_bytes: u64,
        grow_bytes_per_s: f64,
        rate: f64,
    },
    /// A batch job holding `size_bytes` of anonymous memory (allocated at
    /// `grow_bytes_per_s`), touching `touch_bytes_per_s` of it at random; progress is
    /// the touches done.
    BeAnon {
        size_bytes: u64,
        grow_bytes_per_s: f64,
        touch_bytes_per_s: f64,
    },
    /// A batch job reading a file of `file_bytes` at random at up to
    /// `read_bytes_per_s`; a read hits when the page is cached, else goes to disk and
    /// adds page cache; progress is the bytes read.
    BeFile {
        file_bytes: u64,
        read_bytes_per_s: f64,
    },
    /// An elastic application (M3 §4) modelled by the SDK's behaviour: a cache that
    /// wants `want_bytes` (of which `floor_bytes` is not reclaimable), grows at
    /// `grow_bytes_per_s` through the SDK's allow-rate gate (M3 §4.2), gives back one
    /// layer of `layer_bytes` on a low notification and the asked target (in layers)
    /// on high and top. Its work runs at `1 / (1 + miss_penalty × (1 - rss/want))` of
    /// its full speed; it exits once `work_s` seconds of full-speed work are done.
    Elastic {
        want_bytes: u64,
        floor_bytes: u64,
        grow_bytes_per_s: f64,
        layer_bytes: u64,
        miss_penalty: f64,
        work_s: f64,
        #[serde(default = "default_num_epochs")]
        num_epochs: u32,
    },
}

fn default_num_epochs() -> u32 {
    memcolo_sdk::gate::DEFAULT_NUM_EPOCHS
}

impl Workload {
    /// The class the process registers with.
    pub fn class(&self) -> Class {
        match self {
            Workload::Lc { .. } => Class::Lc,
            Workload::BeAnon { .. } | Workload::BeFile { .. } => Class::Be,
            Workload::Elastic { .. } => Class::Elastic,
        }
    }
}

/// A process to start at `start_s`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcSpec {
    /// Name in the report (several processes may share one).
    pub name: String,
    /// Start time, seconds of simulated time.
    pub start_s: f64,
    /// What it does; its class follows ([`Workload::class`]).
    pub workload: Workload,
    /// Hard cap on the process's resident + swapped anonymous bytes (a static
    /// partition), if any.
    #[serde(default)]
    pub cap_bytes: Option<u64>,
    /// The process exits at this time, seconds of simulated time (a batch job's end in
    /// a fleet's day), if ever; it counts as finished, not killed.
    #[serde(default)]
    pub stop_s: Option<f64>,
}

/// Per-process results, over the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcStats {
    /// [`ProcSpec::name`].
    pub name: String,
    /// `lc`, `be` or `elastic`.
    pub class: String,
    /// Time stalled in direct reclaim, seconds.
    pub direct_reclaim_s: f64,
    /// Time stalled in swap-ins and page-cache misses, seconds.
    pub fault_s: f64,
    /// Bytes swapped in.
    pub swapin_bytes: u64,
    /// Progress: requests (LC), bytes touched (BE anon), bytes read (BE file), work
    /// seconds (elastic).
    pub progress: f64,
    /// When an elastic job finished, seconds since the run's start.
    pub finished_s: Option<f64>,
    /// Notifications received, by level (low, high, top).
    pub notifications: [u64; 3],
    /// Killed by M3's kill rule (R5).
    pub killed_by_m3: bool,
    /// Killed by the model's OOM killer.
    pub killed_by_oom: bool,
    /// Largest resident bytes (anon + file).
    pub peak_resident_bytes: u64,
}

struct Proc {
    pid: Pid,
    spec: ProcSpec,
    started: bool,
    alive: bool,
    started_at: Duration,
    anon: u64,
    swapped: u64,
    file: u64,
    /// LC: seconds of queued work carried into the next step.
    backlog_s: f64,
    /// Time this process was stalled in this step, seconds (direct reclaim).
    step_stall_s: f64,
    gate: Option<AllowRateGate>,
    /// Later phases, `(at_s, workload)` in time order ([`Node::add_phase`]).
    phases: std::collections::VecDeque<(f64, Workload)>,
    stats: ProcStats,
}

impl Proc {
    fn resident(&self) -> u64 {
        self.anon + self.file
    }
}

/// How the node is managed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The kernel alone: direct reclaim and the OOM killer.
    Kernel,
    /// memcolo's agent: M3 monitor, Hermes advice, Hermit reclaim.
    Memcolo,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Memcolo => "memcolo",
        }
    }
}

/// The node's configuration.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// RAM, bytes.
    pub total_bytes: u64,
    /// Swap (far tier), bytes; 0 for none.
    pub swap_bytes: u64,
    /// Length of one step of simulated time.
    pub step: Duration,
    /// Seed of the model's random draws (LC request arrivals, faults, service times).
    pub seed: u64,
    /// Kernel alone or memcolo.
    pub mode: Mode,
    /// The model's constants.
    pub calib: Calibration,
    /// M3's poll period.
    pub poll: Duration,
    /// LC latency above this counts as an SLO violation, µs.
    pub slo_us: f64,
    /// Hermit's reclaim workers (the CPU budget).
    pub reclaim_workers: u32,
    /// LC latency is recorded from this time on (a warm-up before it is not).
    pub measure_from: Duration,
    /// Requests of each LC process sampled per step (each sample weighted by the
    /// requests it stands for); at least the requests of a step, every request is
    /// sampled. [`LC_SAMPLES_PER_STEP`] unless a run needs its far tail (p99.9).
    pub lc_samples_per_step: usize,
}

/// A weighted latency sample, µs.
#[derive(Clone, Copy, Debug)]
struct Sample {
    us: f64,
    weight: f64,
}

/// Latency figures of the LC processes over the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LatencyStats {
    /// LC requests served in the measured part of the run.
    pub requests: f64,
    /// Latency percentiles, µs (from the sampled requests, each weighted by the
    /// requests it stands for).
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// Share of requests slower than the SLO.
    pub slo_violation_ratio: f64,
    /// Share of seconds whose p99 exceeded the SLO.
    pub slo_violation_seconds_ratio: f64,
}

/// Node-wide results of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NodeStats {
    /// `kernel` or `memcolo`.
    pub mode: String,
    /// Simulated seconds run.
    pub simulated_s: f64,
    /// Mean of (anon + file resident) / total over the steps of the measured part of
    /// the run (from [`NodeConfig::measure_from`]), as the bench's `node_util`.
    pub utilisation: f64,
    /// Latency of every LC process's requests together.
    pub lc: LatencyStats,
    /// Kills by M3's rule R5 and by the OOM killer.
    pub m3_kills: u64,
    pub oom_kills: u64,
    /// M3 notifications sent: low, high, top.
    pub signals: [u64; 3],
    /// Bytes Hermit's workers reclaimed, Hermes' advice dropped, and the kernel's direct
    /// reclaim freed.
    pub hermit_reclaimed_bytes: u64,
    pub hermes_dropped_bytes: u64,
    pub direct_reclaimed_bytes: u64,
    /// Bytes swapped in, all processes.
    pub swapin_bytes: u64,
    /// Largest swap use seen, bytes.
    pub peak_swapped_bytes: u64,
    /// Per process, in [`ProcSpec`] order.
    pub procs: Vec<ProcStats>,
}

/// The simulated node.
pub struct Node {
    cfg: NodeConfig,
    now: Duration,
    epoch: Instant,
    rng: SplitMix64,
    procs: Vec<Proc>,
    monitor: Monitor,
    scheduler: ReclaimScheduler,
    advice: AdviceConfig,
    next_poll: Duration,
    // Hermit's counters since its previous observation.
    reclaimed_since: u64,
    removed_since: u64,
    swapin_since: u64,
    limit_failures_since: u64,
    worker_busy_since: Duration,
    /// Page-cache refaults since the kernel's previous direct reclaim (misses of file
    /// pages read before: the workingset detection of mm/workingset.c).
    file_refaults_since_reclaim: u64,
    // Run statistics.
    util_sum: f64,
    steps: u64,
    samples: Vec<Sample>,
    second_samples: Vec<Sample>,
    seconds: u64,
    slow_seconds: u64,
    stats: NodeStats,
}

impl Node {
    /// A node running `procs` (started at their `start_s`).
    pub fn new(cfg: NodeConfig, procs: Vec<ProcSpec>) -> anyhow::Result<Node> {
        cfg.calib.validate()?;
        anyhow::ensure!(cfg.total_bytes > 0, "node memory must be positive");
        anyhow::ensure!(!cfg.step.is_zero(), "step must be positive");
        let top = cfg.total_bytes / 64 * 62;
        let monitor = Monitor::try_new(M3Config::with_top(top))?;
        let scheduler = ReclaimScheduler::new(ReclaimConfig {
            max_workers: cfg.reclaim_workers.max(1),
            initial_worker_rate: cfg.calib.anon_worker_bytes_per_s(),
            tick: cfg.step,
            idle_tick: cfg.step,
            ..ReclaimConfig::default()
        })?;
        let advice = AdviceConfig::with_adv_thr(
            (cfg.total_bytes as f64 * AdviceConfig::DEFAULT_ADV_THR_RATIO) as u64,
        );
        let procs = procs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| {
                let gate = match &spec.workload {
                    Workload::Elastic { num_epochs, .. } => Some(AllowRateGate::new(*num_epochs)),
                    _ => None,
                };
                Proc {
                    pid: 1000 + i as Pid,
                    stats: ProcStats {
                        name: spec.name.clone(),
                        class: spec.workload.class().as_str().to_string(),
                        ..Default::default()
                    },
                    spec,
                    started: false,
                    alive: false,
                    started_at: Duration::ZERO,
                    anon: 0,
                    swapped: 0,
                    file: 0,
                    backlog_s: 0.0,
                    step_stall_s: 0.0,
                    gate,
                    phases: Default::default(),
                }
            })
            .collect();
        Ok(Node {
            rng: SplitMix64::seed_from_u64(cfg.seed),
            stats: NodeStats {
                mode: cfg.mode.as_str().to_string(),
                ..Default::default()
            },
            cfg,
            now: Duration::ZERO,
            epoch: Instant::now(),
            procs,
            monitor,
            scheduler,
            advice,
            next_poll: Duration::ZERO,
            reclaimed_since: 0,
            removed_since: 0,
            swapin_since: 0,
            limit_failures_since: 0,
            worker_busy_since: Duration::ZERO,
            file_refaults_since_reclaim: 0,
            util_sum: 0.0,
            steps: 0,
            samples: Vec::new(),
            second_samples: Vec::new(),
            seconds: 0,
            slow_seconds: 0,
        })
    }

    /// From `at_s` (seconds of simulated time) on, process `index` (in [`ProcSpec`]
    /// order) does `workload` instead: a phase of a process whose rates change. Its
    /// memory is carried over; what it holds above the phase's size (`ws_bytes`,
    /// `size_bytes`, `want_bytes`, `file_bytes`) is freed at the change, as a job
    /// that drops data does. Phases are added in time order.
    ///
    /// # Errors
    /// An index out of range, a phase of another class than the process's, a time
    /// before the process's start or before its previous phase, or not finite.
    pub fn add_phase(&mut self, index: usize, at_s: f64, workload: Workload) -> anyhow::Result<()> {
        let p = self
            .procs
            .get_mut(index)
            .ok_or_else(|| anyhow::anyhow!("no process {index}"))?;
        anyhow::ensure!(
            workload.class() == p.spec.workload.class(),
            "process `{}`: a phase of class {} after class {}",
            p.spec.name,
            workload.class().as_str(),
            p.spec.workload.class().as_str()
        );
        let after = p.phases.back().map_or(p.spec.start_s, |ph| ph.0);
        anyhow::ensure!(
            at_s.is_finite() && at_s >= after,
            "process `{}`: phase at {at_s} s is before {after} s",
            p.spec.name
        );
        p.phases.push_back((at_s, workload));
        Ok(())
    }

    /// Switches the processes whose next phase is due at `now_s`.
    fn advance_phases(&mut self, now_s: f64) {
        for i in 0..self.procs.len() {
            while self.procs[i].phases.front().is_some_and(|ph| ph.0 <= now_s) {
                let (_, w) = self.procs[i].phases.pop_front().expect("checked");
                let size = match &w {
                    Workload::Lc { ws_bytes, .. } => *ws_bytes,
                    Workload::BeAnon { size_bytes, .. } => *size_bytes,
                    Workload::Elastic { want_bytes, .. } => *want_bytes,
                    Workload::BeFile { file_bytes, .. } => *file_bytes,
                };
                let p = &mut self.procs[i];
                if matches!(w, Workload::BeFile { .. }) {
                    p.file = p.file.min(size);
                } else {
                    // Swapped pages go first (the cold ones), then resident.
                    let over = (p.anon + p.swapped).saturating_sub(size);
                    let from_swap = over.min(p.swapped);
                    p.swapped -= from_swap;
                    p.anon -= over - from_swap;
                    self.removed_since += over - from_swap;
                }
                self.procs[i].spec.workload = w;
            }
        }
    }

    /// Simulated time since the start.
    pub fn now(&self) -> Duration {
        self.now
    }

    fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Resident bytes of every process (anon + file).
    pub fn used_bytes(&self) -> u64 {
        self.procs.iter().map(Proc::resident).sum()
    }

    /// Bytes in swap.
    pub fn swapped_bytes(&self) -> u64 {
        self.procs.iter().map(|p| p.swapped).sum()
    }

    /// Free RAM, bytes.
    pub fn free_bytes(&self) -> u64 {
        self.cfg.total_bytes.saturating_sub(self.used_bytes())
    }

    /// The working set M3 polls: MemTotal − MemAvailable on the host
    /// (`memcolo_linux::scope`), i.e. memory that cannot be dropped: anonymous
    /// memory (page cache is available).
    pub fn working_set_bytes(&self) -> u64 {
        self.procs.iter().map(|p| p.anon).sum()
    }

    /// Resident anonymous bytes of the process named `name` (0 if none).
    pub fn rss_of(&self, name: &str) -> u64 {
        self.procs
            .iter()
            .filter(|p| p.spec.name == name && p.alive)
            .map(Proc::resident)
            .sum()
    }

    /// The statistics so far of the process named `name`.
    pub fn proc_stats(&self, name: &str) -> Option<&ProcStats> {
        self.procs
            .iter()
            .find(|p| p.spec.name == name)
            .map(|p| &p.stats)
    }

    /// Every process's anonymous footprint now, bytes (resident + swapped; 0 before it
    /// starts and once it has stopped or was killed), in the order of the `procs` given
    /// to [`Node::new`]: the demand its allocator's heap holds ([`crate::heap`]).
    pub fn anon_footprints(&self) -> impl Iterator<Item = u64> + '_ {
        self.procs
            .iter()
            .map(|p| if p.alive { p.anon + p.swapped } else { 0 })
    }

    /// Conservation: resident memory never exceeds RAM and swap never exceeds the far
    /// tier.
    pub fn check(&self) -> Result<(), String> {
        let used = self.used_bytes();
        if used > self.cfg.total_bytes {
            return Err(format!("resident {used} > total {}", self.cfg.total_bytes));
        }
        let sw = self.swapped_bytes();
        if sw > self.cfg.swap_bytes {
            return Err(format!("swapped {sw} > swap {}", self.cfg.swap_bytes));
        }
        Ok(())
    }

    fn page_round(&self, bytes: f64) -> u64 {
        let pg = self.cfg.calib.page_bytes;
        (bytes.max(0.0) as u64) / pg * pg
    }

    /// Direct reclaim of at least `need` bytes on behalf of process `who`; returns the
    /// bytes freed. Page cache first, then anonymous memory into swap.
    fn kernel_reclaim(&mut self, who: usize, need: u64) -> u64 {
        let c = &self.cfg.calib;
        let pg = c.page_bytes;
        let need = need + c.reclaim_cluster_pages * pg;
        // Split between the file and the anonymous LRU by swappiness (anon : file =
        // swappiness : 200 - swappiness, as `get_scan_count` in mm/vmscan.c weighs
        // them at equal refault cost); a list that is short leaves its share to the
        // other one.
        let file_total: u64 = self.procs.iter().map(|p| p.file).sum();
        let swap_free = self.cfg.swap_bytes.saturating_sub(self.swapped_bytes());
        let anon_total: u64 = self.procs.iter().map(|p| p.anon).sum();
        let anon_room = swap_free.min(anon_total);
        // Cache-trim mode (`prepare_scan_control` and `get_scan_count` in mm/vmscan.c):
        // while inactive page cache is plentiful (at least `need`, and not below
        // 2^DEF_PRIORITY pages, the first pass's `file >> priority`) and not
        // thrashing (no file refault since the previous reclaim, which sets
        // `DEACTIVATE_FILE`), the kernel scans the file list only.
        let thrashing = std::mem::take(&mut self.file_refaults_since_reclaim) > 0;
        let cache_trim = !thrashing && file_total >= need && file_total >> 12 >= pg;
        let anon_share = if cache_trim {
            0.0
        } else {
            (c.swappiness / 200.0).clamp(0.0, 1.0)
        };
        let mut anon_want = ((need as f64 * anon_share) as u64).min(anon_room);
        let file_want = (need - anon_want).min(file_total);
        anon_want = (need - file_want).min(anon_room);
        let mut freed_file = 0u64;
        if file_want > 0 {
            let mut left = file_want;
            for p in self.procs.iter_mut() {
                let share =
                    ((p.file as u128 * file_want as u128).div_ceil(file_total as u128)) as u64;
                let t = share.min(p.file).min(left);
                p.file -= t;
                left -= t;
                freed_file += t;
            }
        }
        let mut freed_anon = 0u64;
        if anon_want > 0 {
            let lc_w = c.lc_lru_weight;
            let weights: Vec<f64> = self
                .procs
                .iter()
                .map(|p| {
                    let w = if p.spec.workload.class() == Class::Lc {
                        lc_w
                    } else {
                        1.0
                    };
                    p.anon as f64 * w
                })
                .collect();
            let wsum: f64 = weights.iter().sum();
            if wsum > 0.0 {
                let mut left = anon_want;
                for (p, w) in self.procs.iter_mut().zip(&weights) {
                    let share = ((anon_want as f64 * w / wsum).ceil() as u64)
                        .min(p.anon)
                        .min(left);
                    p.anon -= share;
                    p.swapped += share;
                    left -= share;
                    freed_anon += share;
                }
            }
        }
        let cost_s = (freed_file as f64 / pg as f64 * c.file_reclaim_us
            + freed_anon as f64 / pg as f64 * c.anon_reclaim_us)
            * (1.0 + c.direct_reclaim_factor)
            * 1e-6;
        let p = &mut self.procs[who];
        p.stats.direct_reclaim_s += cost_s;
        p.step_stall_s += cost_s;
        self.stats.direct_reclaimed_bytes += freed_file + freed_anon;
        self.limit_failures_since += 1;
        freed_file + freed_anon
    }

    /// The OOM killer: the process with the most memory goes.
    fn oom_kill(&mut self) {
        if let Some(i) = (0..self.procs.len())
            .filter(|&i| self.procs[i].alive)
            .max_by_key(|&i| {
                (
                    self.procs[i].resident() + self.procs[i].swapped,
                    std::cmp::Reverse(i),
                )
            })
        {
            self.procs[i].stats.killed_by_oom = true;
            self.stats.oom_kills += 1;
            self.exit(i);
        }
    }

    fn exit(&mut self, i: usize) {
        let p = &mut self.procs[i];
        p.alive = false;
        p.anon = 0;
        p.swapped = 0;
        p.file = 0;
        let pid = p.pid;
        self.monitor.forget(pid);
    }

    /// Makes `bytes` free for process `who`, reclaiming on its thread if needed.
    /// Returns false when the memory could not be found (the OOM killer ran).
    fn make_room(&mut self, who: usize, bytes: u64) -> bool {
        for _ in 0..4 {
            let free = self.free_bytes();
            if free >= bytes {
                return true;
            }
            let freed = self.kernel_reclaim(who, bytes - free);
            if freed == 0 {
                break;
            }
        }
        if self.free_bytes() >= bytes {
            return true;
        }
        self.oom_kill();
        self.procs[who].alive && self.free_bytes() >= bytes
    }

    fn alloc_anon(&mut self, who: usize, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        if !self.make_room(who, bytes) {
            return false;
        }
        self.procs[who].anon += bytes;
        true
    }

    /// Swaps in `bytes` of process `who`'s swapped memory; returns the time it cost.
    fn swap_in(&mut self, who: usize, bytes: u64) -> f64 {
        let bytes = bytes.min(self.procs[who].swapped);
        if bytes == 0 || !self.make_room(who, bytes) {
            return 0.0;
        }
        let p = &mut self.procs[who];
        let bytes = bytes.min(p.swapped);
        p.swapped -= bytes;
        p.anon += bytes;
        p.stats.swapin_bytes += bytes;
        self.stats.swapin_bytes += bytes;
        self.swapin_since += bytes;
        let t = bytes as f64 / self.cfg.calib.page_bytes as f64 * self.cfg.calib.swapin_us * 1e-6;
        p.stats.fault_s += t;
        t
    }

    /// Runs until `duration` of simulated time has passed.
    pub fn run(&mut self, duration: Duration) {
        while self.now < duration {
            self.step();
        }
    }

    /// One step of the model.
    pub fn step(&mut self) {
        let dt = self.cfg.step.as_secs_f64();
        let now_s = self.now.as_secs_f64();
        for p in self.procs.iter_mut() {
            p.step_stall_s = 0.0;
            if !p.started && p.spec.start_s <= now_s {
                p.started = true;
                p.alive = true;
                p.started_at = self.now;
            }
        }
        for i in 0..self.procs.len() {
            let p = &mut self.procs[i];
            if p.alive && p.spec.stop_s.is_some_and(|t| t <= now_s) {
                p.stats.finished_s = Some(now_s);
                self.exit(i);
            }
        }
        self.advance_phases(now_s);
        for i in 0..self.procs.len() {
            if self.procs[i].alive {
                self.run_proc(i, dt);
            }
        }
        if self.cfg.mode == Mode::Memcolo {
            self.hermit(dt);
            if self.now >= self.next_poll {
                self.next_poll = self.now + self.cfg.poll;
                self.m3_poll();
                self.hermes();
            }
        }
        if self.now >= self.cfg.measure_from {
            self.steps += 1;
            self.util_sum += self.used_bytes() as f64 / self.cfg.total_bytes as f64;
        }
        self.now += self.cfg.step;
        self.stats.peak_swapped_bytes = self.stats.peak_swapped_bytes.max(self.swapped_bytes());
        for p in self.procs.iter_mut() {
            p.stats.peak_resident_bytes = p.stats.peak_resident_bytes.max(p.resident());
        }
        if self.now.as_secs() > self.seconds {
            self.seconds = self.now.as_secs();
            if !self.second_samples.is_empty() {
                let p99 = weighted_quantile(&mut self.second_samples, 0.99);
                if p99 > self.cfg.slo_us {
                    self.slow_seconds += 1;
                }
                self.stats.lc.slo_violation_seconds_ratio += 1.0;
                self.second_samples.clear();
            }
        }
    }

    fn run_proc(&mut self, i: usize, dt: f64) {
        let c = self.cfg.calib.clone();
        let pg = c.page_bytes as f64;
        let workload = self.procs[i].spec.workload.clone();
        let cap = self.procs[i].spec.cap_bytes.unwrap_or(u64::MAX);
        match workload {
            Workload::Lc {
                ws_bytes,
                grow_bytes_per_s,
                rate,
            } => {
                let held = self.procs[i].anon + self.procs[i].swapped;
                let grow = self
                    .page_round(grow_bytes_per_s * dt)
                    .min(ws_bytes.saturating_sub(held));
                if !self.alloc_anon(i, grow) {
                    return;
                }
                let (anon, swapped) = (self.procs[i].anon, self.procs[i].swapped);
                let frac = if anon + swapped == 0 {
                    0.0
                } else {
                    swapped as f64 / (anon + swapped) as f64
                };
                let n = rate * dt;
                let pages = n * c.lc_pages_per_request;
                let faults = pages * frac;
                let fault_s = self.swap_in(i, (faults * pg) as u64);
                if !self.procs[i].alive {
                    return;
                }
                self.procs[i].stats.progress += n;
                self.lc_latency(i, n, dt, frac, fault_s);
            }
            Workload::BeAnon {
                size_bytes,
                grow_bytes_per_s,
                touch_bytes_per_s,
            } => {
                let held = self.procs[i].anon + self.procs[i].swapped;
                let grow = self
                    .page_round(grow_bytes_per_s * dt)
                    .min(size_bytes.min(cap).saturating_sub(held));
                let before = self.procs[i].step_stall_s;
                if !self.alloc_anon(i, grow) {
                    return;
                }
                // Touches within the time left after this step's stalls.
                let (anon, swapped) = (self.procs[i].anon, self.procs[i].swapped);
                let frac = if anon + swapped == 0 {
                    0.0
                } else {
                    swapped as f64 / (anon + swapped) as f64
                };
                let mut left = (dt - (self.procs[i].step_stall_s - before)).max(0.0);
                let touch_full = touch_bytes_per_s * left;
                // Each touched swapped page costs a swap-in: the touch rate falls.
                let per_byte_s = 1.0 / touch_bytes_per_s.max(1.0) + frac * c.swapin_us * 1e-6 / pg;
                let touched = (left / per_byte_s).min(touch_full);
                let t = self.swap_in(i, (touched * frac) as u64);
                left -= t;
                if self.procs[i].alive && left > 0.0 {
                    self.procs[i].stats.progress += touched;
                }
            }
            Workload::BeFile {
                file_bytes,
                read_bytes_per_s,
            } => {
                let hit = if file_bytes == 0 {
                    1.0
                } else {
                    (self.procs[i].file as f64 / file_bytes as f64).min(1.0)
                };
                // Reads are bounded by the CPU (read_bytes_per_s) and by the disk for
                // the missing share.
                let miss_share = 1.0 - hit;
                let time_per_byte =
                    1.0 / read_bytes_per_s.max(1.0) + miss_share / c.disk_bytes_per_s;
                let read = dt / time_per_byte;
                let miss = self
                    .page_round(read * miss_share)
                    .min(file_bytes.saturating_sub(self.procs[i].file));
                if miss > 0 {
                    // Once the whole file has been read, a miss is a page read before
                    // and evicted since: a refault.
                    if self.procs[i].stats.progress >= file_bytes as f64 {
                        self.file_refaults_since_reclaim += miss;
                    }
                    if !self.make_room(i, miss) {
                        return;
                    }
                    self.procs[i].file += miss;
                    self.procs[i].stats.fault_s += miss as f64 / c.disk_bytes_per_s;
                }
                self.procs[i].stats.progress += read;
            }
            Workload::Elastic {
                want_bytes,
                grow_bytes_per_s,
                miss_penalty,
                work_s,
                ..
            } => {
                let want = want_bytes.min(cap);
                let rss = self.procs[i].anon + self.procs[i].swapped;
                let grow = self
                    .page_round(grow_bytes_per_s * dt)
                    .min(want.saturating_sub(rss));
                if grow > 0 {
                    // The SDK's gate decides allocation by allocation (chunks of at
                    // least 1 MiB, at most 64 per step); a refused one evicts first, so
                    // the cache replaces data instead of growing.
                    let chunk = (grow / 64).max(1 << 20).min(grow);
                    let chunks = grow / chunk;
                    let at = self.epoch + self.now;
                    let gate = self.procs[i]
                        .gate
                        .as_ref()
                        .expect("elastic process has a gate");
                    let admitted = (0..chunks).filter(|_| gate.admit_at(at)).count() as u64;
                    if !self.alloc_anon(i, admitted * chunk) {
                        return;
                    }
                }
                let p = &self.procs[i];
                let share = ((p.anon + p.swapped) as f64 / want_bytes.max(1) as f64).min(1.0);
                let speed = 1.0 / (1.0 + miss_penalty * (1.0 - share));
                let stalled = p.step_stall_s;
                let done = speed * (dt - stalled).max(0.0);
                let p = &mut self.procs[i];
                p.stats.progress += done;
                if p.stats.progress >= work_s {
                    p.stats.finished_s = Some(self.now.as_secs_f64() + dt);
                    self.exit(i);
                }
            }
        }
    }

    /// Hermit: one scheduler step with this step's observations; the workers reclaim
    /// batch processes' page cache, then their anonymous memory into swap.
    fn hermit(&mut self, dt: f64) {
        let swapped = self.swapped_bytes();
        let reclaimable: u64 = self
            .procs
            .iter()
            .filter(|p| p.alive && p.spec.workload.class() != Class::Lc)
            .map(|p| {
                p.file
                    + if p.spec.workload.class() == Class::Be {
                        p.anon
                    } else {
                        0
                    }
            })
            .sum();
        let obs = ReclaimObservation {
            limit_bytes: self.cfg.total_bytes,
            used_bytes: self.used_bytes(),
            reclaimed_bytes: std::mem::take(&mut self.reclaimed_since),
            charged_bytes: None,
            inflight_bytes: 0,
            removed_bytes: std::mem::take(&mut self.removed_since),
            limit_failures: std::mem::take(&mut self.limit_failures_since),
            worker_busy: std::mem::take(&mut self.worker_busy_since),
            swapin_bytes: std::mem::take(&mut self.swapin_since),
            swapped_bytes: swapped,
            swap_total_bytes: self.cfg.swap_bytes,
            swap_free_bytes: self.cfg.swap_bytes.saturating_sub(swapped),
            reclaimable_bytes: reclaimable,
            sampled_turnaround: None,
        };
        let d = self.scheduler.step(self.now, &obs);
        if d.workers == 0 || d.target_bytes == 0 {
            return;
        }
        let c = &self.cfg.calib;
        let pg = c.page_bytes as f64;
        let mut budget_s = d.workers as f64 * dt;
        let mut left = d.target_bytes;
        let mut reclaimed = 0u64;
        // Page cache of batch processes first (cheap, and clean), largest first.
        let mut order: Vec<usize> = (0..self.procs.len())
            .filter(|&i| self.procs[i].alive && self.procs[i].spec.workload.class() == Class::Be)
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.procs[i].file));
        for &i in &order {
            let by_time = (budget_s / (c.file_reclaim_us * 1e-6) * pg) as u64;
            let t = self.procs[i].file.min(left).min(by_time);
            self.procs[i].file -= t;
            left -= t;
            reclaimed += t;
            budget_s -= t as f64 / pg * c.file_reclaim_us * 1e-6;
        }
        let mut swap_free = self.cfg.swap_bytes.saturating_sub(self.swapped_bytes());
        order.sort_by_key(|&i| std::cmp::Reverse(self.procs[i].anon));
        for &i in &order {
            let by_time = (budget_s.max(0.0) / (c.anon_reclaim_us * 1e-6) * pg) as u64;
            let t = self.procs[i].anon.min(left).min(by_time).min(swap_free);
            self.procs[i].anon -= t;
            self.procs[i].swapped += t;
            swap_free -= t;
            left -= t;
            reclaimed += t;
            budget_s -= t as f64 / pg * c.anon_reclaim_us * 1e-6;
        }
        self.reclaimed_since += reclaimed;
        self.stats.hermit_reclaimed_bytes += reclaimed;
        self.worker_busy_since +=
            Duration::from_secs_f64((d.workers as f64 * dt - budget_s).max(0.0));
    }

    /// M3: one poll of the monitor; signals go to elastic processes (the SDK's
    /// handlers), kills to batch processes.
    fn m3_poll(&mut self) {
        let views: Vec<ProcView> = self
            .procs
            .iter()
            .filter(|p| p.alive)
            .map(|p| ProcView {
                pid: p.pid,
                class: p.spec.workload.class(),
                started_at: p.started_at,
                // RSS as /proc/PID/stat counts it: anonymous memory; page cache
                // filled by read(2) is not mapped, so not in RSS.
                rss_bytes: p.anon,
                notifiable: matches!(p.spec.workload, Workload::Elastic { .. }),
                expected_reclaim_bytes: match p.spec.workload {
                    Workload::Elastic { layer_bytes, .. } => Some(layer_bytes),
                    _ => None,
                },
            })
            .collect();
        let actions = self
            .monitor
            .step(self.now, self.working_set_bytes(), &views);
        for a in actions {
            let Some(i) = self.procs.iter().position(|p| p.pid == a.pid() && p.alive) else {
                continue;
            };
            match a {
                Action::Kill { .. } => {
                    self.procs[i].stats.killed_by_m3 = true;
                    self.stats.m3_kills += 1;
                    self.exit(i);
                }
                Action::Signal {
                    level,
                    target_bytes,
                    ..
                } => self.elastic_handle(i, level, target_bytes),
            }
        }
    }

    /// The SDK's handling of a notification by an elastic process: the gate is fed on
    /// high and top (rate 0 at receipt, epoch = handling time), one layer goes on low,
    /// the target rounded up to layers on high and top; the answer goes back to M3.
    fn elastic_handle(&mut self, i: usize, level: Level, target_bytes: u64) {
        let Workload::Elastic {
            floor_bytes,
            layer_bytes,
            ..
        } = self.procs[i].spec.workload
        else {
            return;
        };
        let idx = match level {
            Level::Low => 0,
            Level::High => 1,
            Level::Top => 2,
        };
        self.procs[i].stats.notifications[idx] += 1;
        self.stats.signals[idx] += 1;
        let handled = self.now + Duration::from_secs_f64(self.cfg.calib.elastic_handle_us * 1e-6);
        let p = &mut self.procs[i];
        let held = p.anon + p.swapped;
        let reclaimable = held.saturating_sub(floor_bytes);
        let layer = layer_bytes.max(1);
        let ask = match level {
            Level::Low => layer,
            Level::High | Level::Top => target_bytes.div_ceil(layer) * layer,
        };
        let give = ask.min(reclaimable);
        // Freed memory: swapped pages first (they are the cold ones), then resident.
        let from_swap = give.min(p.swapped);
        p.swapped -= from_swap;
        p.anon -= give - from_swap;
        self.removed_since += give - from_swap;
        if level != Level::Low {
            let gate = p.gate.as_ref().expect("elastic process has a gate");
            gate.signal_received(self.epoch + self.now);
            gate.signal_handled(self.epoch + handled);
        }
        let pid = p.pid;
        self.monitor.record_reclaim(pid, Some(level), give, handled);
    }

    /// Hermes: drop batch files' page cache above `adv_thr`, largest first.
    fn hermes(&mut self) {
        let files: Vec<FileCache> = self
            .procs
            .iter()
            .filter(|p| p.alive && p.spec.workload.class() == Class::Be && p.file > 0)
            .map(|p| FileCache {
                dev: 0,
                ino: p.pid as u64,
                path: p.spec.name.clone(),
                resident_bytes: p.file,
                held_by_lc: false,
            })
            .collect();
        for a in plan_advice(&self.advice, self.used_bytes(), &files) {
            if let Some(p) = self.procs.iter_mut().find(|p| p.pid as u64 == a.ino) {
                self.stats.hermes_dropped_bytes += p.file;
                self.removed_since += p.file;
                p.file = 0;
            }
        }
    }

    /// The run's results.
    pub fn finish(mut self) -> NodeStats {
        if !self.second_samples.is_empty() {
            let p99 = weighted_quantile(&mut self.second_samples, 0.99);
            if p99 > self.cfg.slo_us {
                self.slow_seconds += 1;
            }
            self.stats.lc.slo_violation_seconds_ratio += 1.0;
        }
        let secs = self.stats.lc.slo_violation_seconds_ratio;
        self.stats.lc.slo_violation_seconds_ratio = if secs > 0.0 {
            self.slow_seconds as f64 / secs
        } else {
            0.0
        };
        let total_w: f64 = self.samples.iter().map(|s| s.weight).sum();
        let slow_w: f64 = self
            .samples
            .iter()
            .filter(|s| s.us > self.cfg.slo_us)
            .map(|s| s.weight)
            .sum();
        self.stats.lc.slo_violation_ratio = if total_w > 0.0 {
            slow_w / total_w + 0.0
        } else {
            0.0
        };
        self.stats.lc.p50_us = weighted_quantile(&mut self.samples, 0.50);
        self.stats.lc.p99_us = weighted_quantile(&mut self.samples, 0.99);
        self.stats.lc.p999_us = weighted_quantile(&mut self.samples, 0.999);
        self.stats.simulated_s = self.now.as_secs_f64();
        self.stats.utilisation = if self.steps > 0 {
            self.util_sum / self.steps as f64
        } else {
            0.0
        };
        self.stats.procs = self.procs.into_iter().map(|p| p.stats).collect();
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn node(mode: Mode) -> Node {
        let procs = vec![
            ProcSpec {
                name: "anon".into(),
                start_s: 0.0,
                cap_bytes: None,
                stop_s: None,
                workload: Workload::BeAnon {
                    size_bytes: 600 * MIB,
                    grow_bytes_per_s: 6000.0 * MIB as f64,
                    touch_bytes_per_s: 1.0,
                },
            },
            ProcSpec {
                name: "file".into(),
                start_s: 0.0,
                cap_bytes: None,
                stop_s: None,
                workload: Workload::BeFile {
                    file_bytes: 400 * MIB,
                    read_bytes_per_s: 1e12,
                },
            },
        ];
        let cfg = NodeConfig {
            total_bytes: 1024 * MIB,
            swap_bytes: 512 * MIB,
            step: Duration::from_millis(100),
            seed: 1,
            mode,
            calib: Calibration {
                disk_bytes_per_s: 1e12,
                ..Calibration::default()
            },
            poll: Duration::from_secs(1),
            slo_us: 1e4,
            reclaim_workers: 1,
            measure_from: Duration::ZERO,
            lc_samples_per_step: LC_SAMPLES_PER_STEP,
        };
        Node::new(cfg, procs).unwrap()
    }

    #[test]
    fn direct_reclaim_frees_what_it_reports_and_charges_the_allocator() {
        let mut n = node(Mode::Kernel);
        n.step();
        assert_eq!(n.rss_of("anon"), 600 * MIB);
        assert_eq!(n.rss_of("file"), 400 * MIB);
        let free0 = n.free_bytes();
        let swapped0 = n.swapped_bytes();
        let freed = n.kernel_reclaim(0, 100 * MIB);
        assert!(freed >= 100 * MIB, "{freed}");
        assert_eq!(n.free_bytes(), free0 + freed);
        // 400 MiB of page cache and no refault: cache-trim mode takes page cache only.
        assert_eq!(n.swapped_bytes(), swapped0, "cache-trim mode swaps nothing");
        assert!(n.procs[0].stats.direct_reclaim_s > 0.0);
        assert_eq!(n.procs[1].stats.direct_reclaim_s, 0.0);
        // Less page cache than the shortfall: swappiness 60 takes both lists, and the
        // anonymous pages went to swap, none were lost.
        let free0 = n.free_bytes();
        let freed = n.kernel_reclaim(0, 400 * MIB);
        assert!(freed >= 400 * MIB, "{freed}");
        assert_eq!(n.free_bytes(), free0 + freed);
        let to_swap = n.swapped_bytes() - swapped0;
        assert!(to_swap > 0 && to_swap < freed, "{to_swap} of {freed}");
    }

    #[test]
    fn hermit_workers_reclaim_batch_memory_ahead_of_demand() {
        let mut n = node(Mode::Memcolo);
        for _ in 0..20 {
            n.step();
            n.check().unwrap();
        }
        // The workers took batch memory so that headroom stays above the high mark
        // (Hermit's `min_high_bytes`, 32 MiB), and what they took left RAM.
        assert!(n.stats.hermit_reclaimed_bytes > 0);
        assert!(n.free_bytes() >= 32 * MIB, "{}", n.free_bytes());
        let before = n.used_bytes() + n.swapped_bytes();
        let swapped = n.swapped_bytes();
        let reclaimed = n.stats.hermit_reclaimed_bytes;
        n.hermit(0.1);
        let took = n.stats.hermit_reclaimed_bytes - reclaimed;
        let to_swap = n.swapped_bytes() - swapped;
        assert_eq!(n.used_bytes() + n.swapped_bytes() + took - to_swap, before);
    }
}
