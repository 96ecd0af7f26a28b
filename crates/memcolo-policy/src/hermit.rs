//! Feedback-directed asynchronous reclaim (Hermit, NSDI'23, "adaptive reclaim
//! scheduling"), as a pure state machine.
//!
//! The kernel reclaims either on the allocating thread (direct reclaim) or too late
//! (kswapd wakes at watermarks of about 1 % of a zone; a memory cgroup has no
//! background reclaim at all on cgroup v1). Hermit reclaims *asynchronously, early
//! enough and with just enough threads*, steered by feedback. [`ReclaimScheduler`]
//! decides, once per tick (the agent ticks every 20 ms by default; Hermit's kernel
//! code every 1 ms):
//!
//! - **when** to reclaim: two marks on the scope's free headroom (limit − usage).
//!   The *high* mark is the headroom that the fastest recent allocation burst would
//!   eat while one batch is being reclaimed:
//!   `high = max(min_high, burst_rate × (batch_time + tick))` (at most a quarter of
//!   the limit), where `burst_rate` is a fast-attack, slow-decay envelope of the
//!   allocation rate and `batch_time` is the measured time one worker takes to
//!   reclaim one batch. The *low* mark, where reclaim starts, is `k × high`, but the
//!   proactive band above the high mark never takes more than `max_low_ratio` of the
//!   limit: `low = max(high, min(k × high, max_low_ratio × limit))`. The high mark
//!   is what keeps allocations off the direct-reclaim path and is never cut by that
//!   ratio; the band only buys reaction time and costs every BE job page cache (a
//!   file streamer's throughput fell to a third with a band of 10 % of the node). As in
//!   Hermit, `k` starts at `low_multiplier_min`, grows by `low_growth` every
//!   `adapt_period` while page turnaround does not fall, up to `low_multiplier_max`
//!   (Hermit's 16), and resets when it falls.
//! - **how many** workers: none while headroom ≥ low; one between high and low;
//!   below high, enough to cover the allocation rate plus the deficit below high
//!   within `close_time`, at each worker's measured throughput:
//!   `n = ⌈(alloc_rate + (high − headroom) / close_time) / worker_rate⌉`, capped by
//!   the CPU budget `max_workers` (the agent derives it from the CPUs no LC process
//!   runs on).
//! - **backing off**: page turnaround — how long an evicted page stays out before it
//!   refaults (Hermit's slides, "Hermit's Adaptive Reclaim Scheduling": "Page
//!   Turnaround (PT): how long a swapped-out page remains untouched") — is taken from
//!   a *sample of the pages reclaim evicted recently* ([`SampledTurnaround`]: a
//!   quantile, by default the median, of their eviction→refault times, pages not back
//!   yet counted as such). While fewer than `min_turnaround_samples` sampled
//!   evictions back it (or no sampler runs), it falls back to a mean by Little's law
//!   on the swapped population, `swapped_bytes / swap_in_rate` (a page leaves swap
//!   only by refaulting, so the mean residence time is the population over the exit
//!   rate). The mean is a poor thrash signal: pages evicted long ago that never come
//!   back dominate it (594 s in the agent's reclaim end-to-end test while the sampled
//!   median was 0.6–0.9 s), so it is the fallback only. When the turnaround shortens to below `turnaround_drop_ratio` of
//!   the previous period's (same source), or below `thrash_turnaround`, reclaim is
//!   evicting pages that are still in use: the scheduler backs off to reclaiming only
//!   what keeps the high mark (no proactive band) for `backoff_periods` periods, and
//!   `k` resets. It never backs off below the high mark: once headroom is that low
//!   the kernel would reclaim anyway, on the allocating thread of whichever process
//!   faults next — an LC one included.
//!
//! - **not churning**: the mean refault distance — bytes evicted between a page's
//!   eviction and its refault — is about the swapped population (Little's law again:
//!   in steady state pages leave swap as fast as they enter it, so a page that comes
//!   back has seen `swapped_bytes` evicted after it). While pages refault and that
//!   distance is below `churn_ratio × low`, the pages held out would have fit in the
//!   free headroom the proactive band keeps: the band itself causes the refaults it
//!   then has to absorb (Hermit's "reclaim too early: memory underutilization"). The
//!   low mark is then capped at `max(high, swapped / churn_ratio)`, which shrinks it
//!   towards the high mark as long as the churn lasts, and the high mark is sized by
//!   the burst envelope of allocation net of swap-ins (refaults of pages the marks
//!   keep out are no demand to make room for, and counting them would keep the churn
//!   going). A job whose working set does not fit keeps far more than the headroom
//!   in swap and keeps its band and its high mark.
//!
//! Hermit also caps workers by "swap intensity" (swap-in rate ÷ swap-out rate). That
//! ratio measures how much of the reclaim comes back, which the turnaround feedback
//! above already acts on; the cap here is the CPU budget, so that reclaim never takes
//! a core an LC thread runs on.
//!
//! - **how often** to look (memcolo's, for the agent's own cost): the controller
//!   samples the scope every `tick` while reclaim is engaged, and every `idle_tick`
//!   only while no worker is wanted and the headroom above the low mark covers
//!   [`IDLE_MARGIN_FACTOR`] times what one `idle_tick` of the burst envelope — or of
//!   a worker's measured throughput, whichever is faster: a burst after a quiet spell
//!   has no envelope yet — would allocate ([`ReclaimDecision::next_tick`]): a burst
//!   cannot reach the low mark before the next look. An idle node is then sensed 5 times a second instead of
//!   50 (`bench agent-cost`: the 20 ms tick was most of the agent's CPU). The high
//!   mark's `tick` term is the engaged tick, not the idle gap.
//!
//! Safety stops: no reclaim while swap is nearly full (free below
//! `swap_stop_free_ratio` of the total, so memcolo never pushes the node into the
//! OOM killer) or when the mechanisms report nothing left to reclaim.
//!
//! Units: bytes, bytes per second, and [`Duration`] for times. The caller passes
//! counters as deltas since its previous observation.

use crate::error::PolicyError;
use crate::types::Class;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Tunables of [`ReclaimScheduler`]. Defaults in [`ReclaimConfig::default`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReclaimConfig {
    /// Most concurrent reclaim workers: the CPU budget. At least 1.
    pub max_workers: u32,
    /// Bytes one worker reclaims per batch (one `process_madvise` call over many
    /// ranges, or one cgroup reclaim request) at low allocation rates: the floor of
    /// [`ReclaimDecision::batch_bytes`]. Default 16 MiB.
    pub batch_bytes: u64,
    /// Ceiling of [`ReclaimDecision::batch_bytes`], bytes; `batch_bytes` or less keeps
    /// every batch at `batch_bytes`. Default 64 MiB.
    pub max_batch_bytes: u64,
    /// A worker's batch covers the allocation of this long (smoothed allocation rate ×
    /// `batch_period`, between `batch_bytes` and `max_batch_bytes`), and a worker
    /// that starts reclaims at least that much: fewer, larger batches while
    /// allocation streams. Default 100 ms.
    pub batch_period: Duration,
    /// Floor of the high mark in bytes. Default 32 MiB (Hermit: workers × 128 pages
    /// of headroom; larger here because the agent ticks at 20 ms, not 1 ms).
    pub min_high_bytes: u64,
    /// Initial and reset value of `k` in `low = k × high`. Default 2.
    pub low_multiplier_min: f64,
    /// Largest `k`. Default 16 (Hermit).
    pub low_multiplier_max: f64,
    /// Factor by which `k` grows each `adapt_period` while turnaround does not fall.
    /// Default 1.25.
    pub low_growth: f64,
    /// The low mark never exceeds this share of the scope's limit (or the high mark,
    /// when that is larger), so that proactive reclaim cannot leave much of the node
    /// idle. Default 0.02.
    pub max_low_ratio: f64,
    /// Half-life of the allocation-rate average and of the burst envelope's decay.
    /// Default 1 s.
    pub rate_half_life: Duration,
    /// Time within which workers should close a deficit below the high mark. Default
    /// 200 ms.
    pub close_time: Duration,
    /// A turnaround below this means thrashing whatever its trend. Default 1 s.
    pub thrash_turnaround: Duration,
    /// Turnaround is "shortening" when it falls below this share of the previous
    /// period's. Default 0.5.
    pub turnaround_drop_ratio: f64,
    /// How often `k` and the back-off adapt. Default 1 s.
    pub adapt_period: Duration,
    /// Periods the scheduler stays backed off after turnaround fell. Default 3.
    pub backoff_periods: u32,
    /// Sampled evictions ([`SampledTurnaround::pages`]) needed before the sampled
    /// turnaround steers the back-off; with fewer, the Little's-law mean does.
    /// Default 16.
    pub min_turnaround_samples: u32,
    /// While pages refault, the low mark is at most `max(high, swapped / churn_ratio)`:
    /// proactive headroom must stay well below the mean refault distance. Default 2.
    pub churn_ratio: f64,
    /// Stop reclaiming while free swap is below this share of total swap. Default 0.05.
    pub swap_stop_free_ratio: f64,
    /// Worker throughput assumed before the first measurement, bytes/s. Default
    /// 256 MiB/s.
    pub initial_worker_rate: f64,
    /// The kswapd / Fastswap design instead of feedback, for comparison: one worker
    /// whenever headroom is below this fixed low mark (bytes), no adaptation, no
    /// back-off. `None` (default): Hermit's adaptive scheduling.
    pub fixed_low_bytes: Option<u64>,
    /// The controller's tick while reclaim is engaged (see
    /// [`ReclaimDecision::next_tick`]); the `tick` of the high mark. Default 20 ms.
    #[serde(default = "ReclaimConfig::default_tick")]
    pub tick: Duration,
    /// The controller's tick while idle with margin ([`ReclaimDecision::next_tick`]);
    /// at least `tick`. Default 200 ms.
    #[serde(default = "ReclaimConfig::default_idle_tick")]
    pub idle_tick: Duration,
}

/// An idle tick is taken only while the headroom above the low mark covers this many
/// times the burst envelope's allocation over one idle tick.
pub const IDLE_MARGIN_FACTOR: f64 = 2.0;

impl Default for ReclaimConfig {
    fn default() -> Self {
        ReclaimConfig {
            max_workers: 1,
            batch_bytes: 16 << 20,
            max_batch_bytes: 64 << 20,
            batch_period: Duration::from_millis(100),
            min_high_bytes: 32 << 20,
            low_multiplier_min: 2.0,
            low_multiplier_max: 16.0,
            low_growth: 1.25,
            max_low_ratio: 0.02,
            rate_half_life: Duration::from_secs(1),
            close_time: Duration::from_millis(200),
            thrash_turnaround: Duration::from_secs(1),
            turnaround_drop_ratio: 0.5,
            adapt_period: Duration::from_secs(1),
            backoff_periods: 3,
            min_turnaround_samples: 16,
            churn_ratio: 2.0,
            swap_stop_free_ratio: 0.05,
            initial_worker_rate: 256.0 * (1 << 20) as f64,
            fixed_low_bytes: None,
            tick: Self::default_tick(),
            idle_tick: Self::default_idle_tick(),
        }
    }
}

impl ReclaimConfig {
    /// Default [`ReclaimConfig::tick`]: 20 ms.
    pub const DEFAULT_TICK: Duration = Duration::from_millis(20);
    /// Default [`ReclaimConfig::idle_tick`]: 200 ms.
    pub const DEFAULT_IDLE_TICK: Duration = Duration::from_millis(200);

    fn default_tick() -> Duration {
        Self::DEFAULT_TICK
    }

    fn default_idle_tick() -> Duration {
        Self::DEFAULT_IDLE_TICK
    }

    /// Checks ranges. Errors: [`PolicyError::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<(), PolicyError> {
        fn bad(field: &'static str, value: impl ToString, reason: &'static str) -> PolicyError {
            PolicyError::InvalidConfig {
                field,
                value: value.to_string(),
                reason,
            }
        }
        if self.max_workers == 0 {
            return Err(bad("max_workers", 0, "must be at least 1"));
        }
        if self.tick.is_zero() {
            return Err(bad("tick", format!("{:?}", self.tick), "must be positive"));
        }
        if self.idle_tick < self.tick {
            return Err(bad(
                "idle_tick",
                format!("{:?}", self.idle_tick),
                "must be at least tick",
            ));
        }
        if self.batch_bytes == 0 {
            return Err(bad("batch_bytes", 0, "must be positive"));
        }
        if self.low_multiplier_min.is_nan() || self.low_multiplier_min < 1.0 {
            return Err(bad(
                "low_multiplier_min",
                self.low_multiplier_min,
                "must be >= 1",
            ));
        }
        if self.low_multiplier_max.is_nan()
            || self.low_multiplier_max < self.low_multiplier_min
            || !self.low_multiplier_max.is_finite()
        {
            return Err(bad(
                "low_multiplier_max",
                self.low_multiplier_max,
                "must be finite and >= low_multiplier_min",
            ));
        }
        if !(self.low_growth >= 1.0 && self.low_growth.is_finite()) {
            return Err(bad(
                "low_growth",
                self.low_growth,
                "must be finite and >= 1",
            ));
        }
        if !(self.max_low_ratio > 0.0 && self.max_low_ratio < 1.0) {
            return Err(bad(
                "max_low_ratio",
                self.max_low_ratio,
                "must be in (0, 1)",
            ));
        }
        if !(self.churn_ratio >= 1.0 && self.churn_ratio.is_finite()) {
            return Err(bad(
                "churn_ratio",
                self.churn_ratio,
                "must be finite and >= 1",
            ));
        }
        if !(self.turnaround_drop_ratio > 0.0 && self.turnaround_drop_ratio < 1.0) {
            return Err(bad(
                "turnaround_drop_ratio",
                self.turnaround_drop_ratio,
                "must be in (0, 1)",
            ));
        }
        if !(0.0..1.0).contains(&self.swap_stop_free_ratio) {
            return Err(bad(
                "swap_stop_free_ratio",
                self.swap_stop_free_ratio,
                "must be in [0, 1)",
            ));
        }
        for (field, d) in [
            ("rate_half_life", self.rate_half_life),
            ("close_time", self.close_time),
            ("adapt_period", self.adapt_period),
            ("batch_period", self.batch_period),
        ] {
            if d.is_zero() {
                return Err(bad(field, "0", "must be positive"));
            }
        }
        if !(self.initial_worker_rate > 0.0 && self.initial_worker_rate.is_finite()) {
            return Err(bad(
                "initial_worker_rate",
                self.initial_worker_rate,
                "must be positive and finite",
            ));
        }
        Ok(())
    }
}

/// What the caller measured since its previous observation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReclaimObservation {
    /// The scope's memory limit (cgroup hard limit, or MemTotal on the host), bytes.
    pub limit_bytes: u64,
    /// Memory charged to the scope now, page cache included (cgroup usage, or
    /// MemTotal − MemFree on the host), bytes.
    pub used_bytes: u64,
    /// Bytes memcolo's workers reclaimed since the previous observation.
    pub reclaimed_bytes: u64,
    /// Bytes charged to the scope since the previous observation (gross allocation,
    /// refaults included: cgroup v1 `total_pgpgin` × the page size), when the scope
    /// counts them. `None`: the allocation rate is estimated as usage growth plus
    /// `reclaimed_bytes` (which arrives in lumps at the end of each batch) plus
    /// `removed_bytes`.
    ///
    /// v1 counts one charge *event* per folio whatever its size ("pagein of a big
    /// page is an event"), so with large page-cache folios or THP these bytes
    /// undercount (by 100x and more for a file streamer on Linux 6.18). The scheduler
    /// therefore takes them for the *timing* of allocation and scales them to bytes
    /// by the median, over the last five blocks of at least 1 s and 16 charge events,
    /// of each block's gross allocation by usage (usage growth + `reclaimed_bytes` +
    /// `removed_bytes`) over its charges (at least 1, at most 512: 2 MiB folios
    /// counted as 4 KiB pages). Per-block ratios and a median, not one average: a
    /// burst of 4 KiB events (a process starting) beside a streamer of 2 MiB folios
    /// must not drag the scale of the next seconds down. A block in which charges hit
    /// the limit (`limit_failures`) understates allocation (the kernel reclaimed
    /// what usage does not show) and only counts when it raises the scale.
    ///
    /// One scale cannot fit a mix that changes: a streamer whose readahead restarts
    /// with small folios (after its cache was dropped) charges hundreds of events a
    /// second that a scale of 512 would read as GB/s. So an observation's scaled
    /// charges are capped by what usage can show: usage growth + `reclaimed_bytes` +
    /// `removed_bytes` + the reclaim in flight at either end of the interval
    /// (`inflight_bytes`) + 4 MiB (the two counters are not read at one instant) +
    /// 2 MiB per limit failure (the kernel reclaims about the failed charge, at most
    /// a 2 MiB folio, before it retries), and never below the unscaled charges.
    pub charged_bytes: Option<u64>,
    /// Bytes the workers were asked to reclaim and have not reported yet (their
    /// batches in flight): usage may have fallen by up to this much more than
    /// `reclaimed_bytes` shows.
    pub inflight_bytes: u64,
    /// Bytes that memcolo took out of the scope since the previous observation by
    /// other means than the reclaim workers (page cache dropped on Hermes advice,
    /// memory that elastic processes reported freeing): allocation is usage growth
    /// plus `reclaimed_bytes` plus these.
    pub removed_bytes: u64,
    /// Charges that hit the scope's limit since the previous observation (v1
    /// `memory.failcnt`, v2 `memory.events` `max`): the kernel then reclaimed on the
    /// allocating thread, which usage growth does not show.
    pub limit_failures: u64,
    /// Time memcolo's workers spent reclaiming since the previous observation, summed
    /// over workers.
    pub worker_busy: Duration,
    /// Bytes swapped in (refaulted anonymous pages) since the previous observation.
    pub swapin_bytes: u64,
    /// Bytes in swap now that belong to the scope.
    pub swapped_bytes: u64,
    /// Total swap on the node, bytes (0: no swap).
    pub swap_total_bytes: u64,
    /// Free swap on the node, bytes.
    pub swap_free_bytes: u64,
    /// Bytes the mechanisms may still reclaim (resident memory of the targets).
    pub reclaimable_bytes: u64,
    /// Page turnaround measured on a sample of the pages reclaim evicted recently;
    /// `None` when nothing is sampled (the Little's-law mean steers then).
    pub sampled_turnaround: Option<SampledTurnaround>,
}

/// Page turnaround — the time from a page's eviction to its refault (Hermit's
/// slides, "Page Turnaround (PT): how long a swapped-out page remains untouched") —
/// measured on a sample of the pages reclaim evicted recently (the agent's sampler
/// follows each sampled page from the end of the batch that evicted it to the first
/// look that finds it present again).
///
/// `turnaround_s` is one quantile (the agent passes the median) of the sampled
/// evictions' turnaround, in seconds, by the product-limit (Kaplan–Meier) estimate:
/// a page not back yet counts as "out for at least its age so far", never as a
/// refault, and a page freed by its process as out until it was last seen. When the
/// quantile lies beyond every age seen (more than that share of the sample is still
/// out), `at_least` is set and `turnaround_s` is the largest age seen: a lower bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SampledTurnaround {
    /// The quantile, seconds; a lower bound when `at_least`.
    pub turnaround_s: f64,
    /// The quantile is past every age seen: `turnaround_s` is only a lower bound.
    pub at_least: bool,
    /// Sampled evictions the estimate rests on: refaulted, still out, censored at
    /// the sampler's horizon, or freed.
    pub pages: u32,
}

/// Where the turnaround that steers the back-off came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnaroundSource {
    /// Nothing refaults (and nothing sampled): infinite.
    #[default]
    None,
    /// [`SampledTurnaround`] with at least `min_turnaround_samples` pages.
    Sampled,
    /// Little's law on the swapped population: `swapped_bytes / swap-in rate`.
    Mean,
}

impl TurnaroundSource {
    /// The snake_case name used in status and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnaroundSource::None => "none",
            TurnaroundSource::Sampled => "sampled",
            TurnaroundSource::Mean => "mean",
        }
    }
}

/// Why the scheduler chose its worker count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReclaimState {
    /// Headroom at or above the low mark.
    Idle,
    /// Headroom between the high and the low mark: one worker, proactively.
    Proactive,
    /// Headroom below the high mark: as many workers as the deficit needs.
    Urgent,
    /// Turnaround fell recently: only the high mark is kept.
    BackingOff,
    /// Free swap below the stop ratio: nothing is reclaimed.
    SwapFull,
    /// The mechanisms have nothing left to reclaim.
    NothingToReclaim,
}

impl ReclaimState {
    /// The snake_case name used in status and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ReclaimState::Idle => "idle",
            ReclaimState::Proactive => "proactive",
            ReclaimState::Urgent => "urgent",
            ReclaimState::BackingOff => "backing_off",
            ReclaimState::SwapFull => "swap_full",
            ReclaimState::NothingToReclaim => "nothing_to_reclaim",
        }
    }
}

/// One decision of [`ReclaimScheduler::step`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReclaimDecision {
    /// Workers that should be reclaiming until the next tick.
    pub workers: u32,
    /// When the controller should observe again: [`ReclaimConfig::idle_tick`] while
    /// no worker is wanted and the headroom above the low mark covers
    /// [`IDLE_MARGIN_FACTOR`] × max(burst envelope, worker throughput) × `idle_tick`
    /// (or nothing can be reclaimed), else [`ReclaimConfig::tick`].
    pub next_tick: Duration,
    /// Bytes to reclaim: back to the low mark, and while allocation streams at least
    /// the allocation of one batch period (see [`ReclaimConfig::batch_period`];
    /// not while backing off); at most the reclaimable bytes; 0 when idle.
    pub target_bytes: u64,
    /// Bytes one worker should reclaim per batch: the smoothed allocation rate ×
    /// `batch_period`, between `batch_bytes` and `max_batch_bytes`
    /// (`batch_bytes` in the fixed-mark design).
    pub batch_bytes: u64,
    /// Free headroom, bytes.
    pub headroom_bytes: u64,
    /// Reclaim starts below this headroom, bytes.
    pub low_mark_bytes: u64,
    /// Below this headroom reclaim is urgent, bytes.
    pub high_mark_bytes: u64,
    /// Current `k` in `low = k × high`.
    pub low_multiplier: f64,
    /// Smoothed allocation rate, bytes/s.
    pub alloc_rate: f64,
    /// Burst envelope of the allocation rate, bytes/s.
    pub burst_rate: f64,
    /// Bytes per 4 KiB of `charged_bytes` (see [`ReclaimObservation::charged_bytes`];
    /// 1 until calibrated).
    pub charge_scale: f64,
    /// Measured throughput of one worker, bytes/s.
    pub worker_rate: f64,
    /// The page turnaround that steers the back-off, seconds (see
    /// `turnaround_source`; a lower bound when `turnaround_at_least`); `None` while
    /// nothing refaults (infinite).
    pub turnaround_s: Option<f64>,
    /// Where `turnaround_s` came from.
    pub turnaround_source: TurnaroundSource,
    /// `turnaround_s` is a sampled lower bound (see [`SampledTurnaround::at_least`]).
    pub turnaround_at_least: bool,
    /// Mean page turnaround by Little's law, `swapped_bytes / swap-in rate`, seconds;
    /// `None` while nothing refaults.
    pub mean_turnaround_s: Option<f64>,
    /// Estimated mean refault distance in bytes (the swapped population); `None`
    /// while nothing refaults.
    pub refault_distance_bytes: Option<u64>,
    /// Whether the low mark is capped because the proactive band churns.
    pub churn_capped: bool,
    /// Whether the scheduler is backed off (turnaround fell; band cut to one batch
    /// above the high mark) for this tick, [`ReclaimConfig::fixed_low_bytes`] aside.
    pub backing_off: bool,
    /// Adapt periods in which turnaround fell (each starts or renews a back-off of
    /// `backoff_periods`) since the scheduler started.
    pub backoffs: u64,
    pub state: ReclaimState,
}

/// Hermit's reclaim scheduler; see the module documentation.
#[derive(Clone, Debug)]
pub struct ReclaimScheduler {
    cfg: ReclaimConfig,
    /// Time, usage and reclaim in flight at the previous observation.
    last: Option<(Duration, u64, u64)>,
    alloc_rate: f64,
    burst_rate: f64,
    /// Burst envelope of allocation net of refaults (swap-ins): new memory only.
    burst_new_rate: f64,
    /// The scale from charge events to bytes.
    charges: ChargeCalibration,
    worker_rate: f64,
    swapin_rate: f64,
    k: f64,
    period_start: Option<Duration>,
    /// The previous period's turnaround, its source and whether it was a lower bound.
    prev_turnaround: Option<(f64, TurnaroundSource, bool)>,
    backoff_left: u32,
    /// The previous decision asked for an idle tick: the gap since is not a tick of
    /// the high mark.
    idle_planned: bool,
    /// Adapt periods in which turnaround fell, since start.
    backoffs: u64,
}

/// A calibration block of charges against usage: closes after this long with at
/// least `MIN_BLOCK_CHARGES` charge events in it.
const CHARGE_BLOCK: Duration = Duration::from_secs(1);
/// Charge events (of 4 KiB) a block needs before it closes.
const MIN_BLOCK_CHARGES: u64 = 16;
/// A block that has not gathered its charges after this long is dropped.
const MAX_BLOCK: Duration = Duration::from_secs(10);
/// The scale is the median ratio of this many last blocks.
const CHARGE_BLOCKS: usize = 5;
/// Scaled charges may exceed what usage shows by this much (usage and the charge
/// counter are read one after the other), bytes.
const USAGE_SLACK_BYTES: f64 = 4.0 * 1024.0 * 1024.0;
/// What the kernel may have reclaimed, unseen, per charge that hit the limit, bytes:
/// it reclaims about the failed charge (`max(charge, 32 pages)`), at most a 2 MiB
/// folio.
const KERNEL_RECLAIM_PER_FAILURE_BYTES: f64 = 2.0 * 1024.0 * 1024.0;
/// Largest scale of charged bytes: a 2 MiB folio counted as one 4 KiB page.
const MAX_CHARGE_SCALE: f64 = 512.0;

/// The scale from charge events to bytes, see [`ReclaimObservation::charged_bytes`].
#[derive(Clone, Debug)]
struct ChargeCalibration {
    /// The block being filled: charged bytes (4 KiB per event), gross bytes by
    /// usage, limit failures, length.
    charged: u64,
    gross: f64,
    failures: u64,
    len: Duration,
    /// Ratios of the last blocks (at most `CHARGE_BLOCKS`), oldest first.
    ratios: std::collections::VecDeque<f64>,
    scale: f64,
}

impl Default for ChargeCalibration {
    fn default() -> Self {
        ChargeCalibration {
            charged: 0,
            gross: 0.0,
            failures: 0,
            len: Duration::ZERO,
            ratios: std::collections::VecDeque::new(),
            scale: 1.0,
        }
    }
}

impl ChargeCalibration {
    /// Adds one observation's charges (bytes at 4 KiB per event), gross allocation by
    /// usage (bytes) and limit failures over `dt` to the block; when the block is
    /// complete, takes its ratio and sets the scale to the upper median of the last
    /// `CHARGE_BLOCKS` ratios.
    fn add(&mut self, charged: u64, gross: f64, failures: u64, dt: Duration) {
        self.charged += charged;
        self.gross += gross;
        self.failures += failures;
        self.len += dt;
        let enough = self.charged >= MIN_BLOCK_CHARGES * 4096;
        if self.len < CHARGE_BLOCK || (!enough && self.len < MAX_BLOCK) {
            return;
        }
        let (charged, gross, failures) = (self.charged, self.gross, self.failures);
        (self.charged, self.gross, self.failures, self.len) = (0, 0.0, 0, Duration::ZERO);
        if !enough || gross <= 0.0 {
            return;
        }
        let ratio = (gross / charged as f64).clamp(1.0, MAX_CHARGE_SCALE);
        // At the limit the kernel's own reclaim hides allocation: only a lower bound.
        if failures > 0 && ratio <= self.scale {
            return;
        }
        if self.ratios.len() == CHARGE_BLOCKS {
            self.ratios.pop_front();
        }
        self.ratios.push_back(ratio);
        let mut sorted: Vec<f64> = self.ratios.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        self.scale = sorted[sorted.len() / 2];
    }
}

/// Weight of a new sample in an exponential average with half-life `half` after `dt`.
fn ewma_weight(dt: Duration, half: Duration) -> f64 {
    1.0 - (-dt.as_secs_f64() / half.as_secs_f64() * std::f64::consts::LN_2).exp()
}

impl ReclaimScheduler {
    /// A scheduler with `cfg`. Errors: as [`ReclaimConfig::validate`].
    pub fn new(cfg: ReclaimConfig) -> Result<Self, PolicyError> {
        cfg.validate()?;
        Ok(ReclaimScheduler {
            worker_rate: cfg.initial_worker_rate,
            k: cfg.low_multiplier_min,
            cfg,
            last: None,
            alloc_rate: 0.0,
            burst_rate: 0.0,
            burst_new_rate: 0.0,
            charges: ChargeCalibration::default(),
            swapin_rate: 0.0,
            period_start: None,
            prev_turnaround: None,
            backoff_left: 0,
            idle_planned: false,
            backoffs: 0,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &ReclaimConfig {
        &self.cfg
    }

    /// Feeds one observation taken at `now` (a monotonic time since any fixed epoch;
    /// it must not go backwards — an earlier `now` is treated as no time passing) and
    /// returns the decision for the next tick.
    pub fn step(&mut self, now: Duration, obs: &ReclaimObservation) -> ReclaimDecision {
        let cfg = &self.cfg;
        let dt = match self.last {
            Some((t, _, _)) => now.saturating_sub(t),
            None => Duration::ZERO,
        };
        // Gross allocation: what was charged, else usage growth plus what we took away
        // meanwhile.
        if let Some((_, prev_used, prev_inflight)) = self.last {
            if !dt.is_zero() {
                let by_usage = obs.used_bytes as f64 - prev_used as f64
                    + obs.reclaimed_bytes as f64
                    + obs.removed_bytes as f64;
                let growth = match obs.charged_bytes {
                    Some(c) => {
                        // The charges keep the timing; blocks of usage give their size.
                        self.charges.add(c, by_usage, obs.limit_failures, dt);
                        let scaled = c as f64 * self.charges.scale;
                        let shown = by_usage
                            + (prev_inflight + obs.inflight_bytes) as f64
                            + USAGE_SLACK_BYTES
                            + obs.limit_failures as f64 * KERNEL_RECLAIM_PER_FAILURE_BYTES;
                        scaled.min(shown.max(c as f64))
                    }
                    None => by_usage,
                };
                let inst = (growth / dt.as_secs_f64()).max(0.0);
                let w = ewma_weight(dt, cfg.rate_half_life);
                self.alloc_rate += w * (inst - self.alloc_rate);
                // Fast attack, decay with the same half-life.
                self.burst_rate = inst.max(self.burst_rate * (1.0 - w));
                let swapin = obs.swapin_bytes as f64 / dt.as_secs_f64();
                let new = (inst - swapin).max(0.0);
                self.burst_new_rate = new.max(self.burst_new_rate * (1.0 - w));
                self.swapin_rate += w * (swapin - self.swapin_rate);
            }
        }
        if !obs.worker_busy.is_zero() && obs.reclaimed_bytes > 0 {
            let inst = obs.reclaimed_bytes as f64 / obs.worker_busy.as_secs_f64();
            // Weighted by the busy time measured, so a long batch counts more.
            let w = ewma_weight(obs.worker_busy, cfg.rate_half_life);
            self.worker_rate += w * (inst - self.worker_rate);
        }
        self.last = Some((now, obs.used_bytes, obs.inflight_bytes));

        // Page turnaround: sampled when enough recent evictions back it, else the mean
        // by Little's law on the swapped population.
        let mean_turnaround = if self.swapin_rate > 4096.0 {
            Some(obs.swapped_bytes as f64 / self.swapin_rate)
        } else {
            None
        };
        let sampled = obs.sampled_turnaround.filter(|s| {
            s.pages >= cfg.min_turnaround_samples.max(1)
                && s.turnaround_s.is_finite()
                && s.turnaround_s >= 0.0
        });
        let (turnaround, source, at_least) = match (sampled, mean_turnaround) {
            (Some(s), _) => (Some(s.turnaround_s), TurnaroundSource::Sampled, s.at_least),
            (None, Some(m)) => (Some(m), TurnaroundSource::Mean, false),
            (None, None) => (None, TurnaroundSource::None, false),
        };
        // Adapt k and the back-off once per period.
        match self.period_start {
            None => self.period_start = Some(now),
            Some(start) if now.saturating_sub(start) >= cfg.adapt_period => {
                self.period_start = Some(now);
                let thrash = cfg.thrash_turnaround.as_secs_f64();
                // A lower bound never shows a fall; a previous lower bound is compared
                // as it is (the fall from the true value was larger); two sources are
                // never compared.
                let fell = match (turnaround, self.prev_turnaround) {
                    (Some(_), _) if at_least => false,
                    (Some(t), _) if t < thrash => true,
                    (Some(t), Some((p, src, _))) if src == source => {
                        t < cfg.turnaround_drop_ratio * p
                    }
                    _ => false,
                };
                if fell {
                    self.k = cfg.low_multiplier_min;
                    self.backoff_left = cfg.backoff_periods;
                    self.backoffs += 1;
                } else {
                    self.k = (self.k * cfg.low_growth).min(cfg.low_multiplier_max);
                    self.backoff_left = self.backoff_left.saturating_sub(1);
                }
                self.prev_turnaround = turnaround.map(|t| (t, source, at_least));
            }
            Some(_) => {}
        }

        let batch_time = cfg.batch_bytes as f64 / self.worker_rate;
        // The high mark covers allocation over one engaged tick; after an idle tick the
        // gap was long only because the margin was (see `next_tick`).
        let tick = if self.idle_planned {
            cfg.tick.as_secs_f64()
        } else {
            dt.as_secs_f64()
        };
        let limit = obs.limit_bytes as f64;
        let max_low = cfg.max_low_ratio * limit;
        let high_for = |burst: f64| {
            (burst * (batch_time + tick))
                .max(cfg.min_high_bytes as f64)
                .min(limit / 4.0)
        };
        let backing_off_now = self.backoff_left > 0;
        let k = self.k;
        let low_for = |high: f64| {
            let band = if backing_off_now {
                // Backing off: only the high mark and one batch above it.
                high + (cfg.batch_bytes as f64).min(high)
            } else {
                k * high
            };
            band.min(max_low.max(high)).max(high)
        };
        let mut high = high_for(self.burst_rate);
        let mut low = low_for(high);
        let mut backing_off = backing_off_now;
        let distance = mean_turnaround.map(|_| obs.swapped_bytes as f64);
        let mut churn_capped = false;
        if let Some(d) = distance {
            if d < cfg.churn_ratio * low {
                // The refaults are of pages the marks themselves keep out: they are no
                // demand to make room for. Size the high mark by new memory only.
                high = high_for(self.burst_new_rate);
                let uncapped = low_for(high);
                let cap = (d / cfg.churn_ratio).max(high);
                churn_capped = cap < uncapped;
                low = uncapped.min(cap);
            }
        }
        if let Some(fixed) = cfg.fixed_low_bytes {
            // kswapd-like: a constant mark, one worker, reclaim back up to the mark.
            high = fixed as f64;
            low = fixed as f64;
            backing_off = false;
            churn_capped = false;
        }
        let headroom = obs.limit_bytes.saturating_sub(obs.used_bytes);
        let h = headroom as f64;

        let swap_full = obs.swap_total_bytes > 0
            && (obs.swap_free_bytes as f64)
                < cfg.swap_stop_free_ratio * obs.swap_total_bytes as f64;
        let (state, workers) = if swap_full {
            (ReclaimState::SwapFull, 0)
        } else if obs.reclaimable_bytes == 0 {
            (ReclaimState::NothingToReclaim, 0)
        } else if h >= low {
            (ReclaimState::Idle, 0)
        } else if h >= high {
            let s = if backing_off {
                ReclaimState::BackingOff
            } else {
                ReclaimState::Proactive
            };
            (s, 1)
        } else {
            let need = self.alloc_rate.max(0.0) + (high - h) / cfg.close_time.as_secs_f64();
            let n = (need / self.worker_rate).ceil().max(1.0);
            let n = if cfg.fixed_low_bytes.is_some() {
                1
            } else {
                n as u32
            };
            (ReclaimState::Urgent, n.min(cfg.max_workers))
        };
        // Fewer, larger batches while allocation streams: a worker's batch pays a fixed
        // cost (finding the group's cached file ranges, reading its processes, the
        // turnaround watch, the limit step's journal) that dwarfed the reclaim itself
        // in the 150 % runs (bench/reclaim/RESULTS.md, 2026-11-26-vm/reclaim-attribution), so a
        // stream of 16 MiB batches spent most of the workers' CPU, which is the BE
        // CPU's, on bookkeeping. A worker that starts takes the allocation of one
        // batch period in one go, above the low mark if need be (hysteresis), except
        // while backing off, when reclaim is what hurts.
        let period_alloc = self.alloc_rate.max(0.0) * cfg.batch_period.as_secs_f64();
        let batch_bytes = if cfg.fixed_low_bytes.is_some() {
            cfg.batch_bytes
        } else {
            (period_alloc as u64).clamp(cfg.batch_bytes, cfg.max_batch_bytes.max(cfg.batch_bytes))
        };
        let target_bytes = if workers == 0 {
            0
        } else {
            let to_low = (low - h).max(0.0);
            let streams = period_alloc > cfg.batch_bytes as f64;
            let ahead = if !streams || backing_off || cfg.fixed_low_bytes.is_some() {
                0.0
            } else {
                // One whole batch: while allocation streams, `batch_bytes` is the
                // period's allocation (capped at `max_batch_bytes`).
                batch_bytes as f64
            };
            (to_low.max(ahead) as u64).min(obs.reclaimable_bytes)
        };
        let margin = h - low;
        let idle_ok = workers == 0
            && (state != ReclaimState::Idle
                || margin
                    >= IDLE_MARGIN_FACTOR
                        * self
                            .burst_rate
                            .max(self.alloc_rate)
                            .max(self.worker_rate)
                            .max(0.0)
                        * cfg.idle_tick.as_secs_f64());
        let next_tick = if idle_ok { cfg.idle_tick } else { cfg.tick };
        self.idle_planned = idle_ok;
        ReclaimDecision {
            workers,
            next_tick,
            target_bytes,
            batch_bytes,
            headroom_bytes: headroom,
            low_mark_bytes: low as u64,
            high_mark_bytes: high as u64,
            low_multiplier: self.k,
            alloc_rate: self.alloc_rate,
            burst_rate: self.burst_rate,
            charge_scale: self.charges.scale,
            worker_rate: self.worker_rate,
            turnaround_s: turnaround,
            turnaround_source: source,
            turnaround_at_least: at_least,
            mean_turnaround_s: mean_turnaround,
            refault_distance_bytes: distance.map(|d| d as u64),
            churn_capped,
            backing_off,
            backoffs: self.backoffs,
            state,
        }
    }
}

/// Where the workers run: `cpus` (`None`: anywhere) at nice `nice`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerPlacement {
    pub cpus: Option<Vec<usize>>,
    pub nice: i32,
}

/// The reclaim workers' placement (memcolo's; Hermit's "how many cores" leaves
/// *which* cores to the system). CPUs: the agent's own (off the LC processes' CPUs) when
/// the core confined it; with no LC process at all, the CPUs the reclaim targets are
/// not confined to (a BE job pinned to some CPUs is the one whose faults the workers
/// unblock: reclaiming beside it on its own CPU would only take its time), when there
/// are any; else anywhere. Nice: the configured value, else 0 when the workers cannot
/// meet an LC thread (confined off LC CPUs, or no LC process registered) and 10 when
/// they may share a CPU with one.
pub fn worker_placement(
    configured_nice: Option<i32>,
    agent_cpus: &Option<Vec<usize>>,
    lc_present: bool,
    target_cpus: &BTreeSet<usize>,
    online: usize,
) -> WorkerPlacement {
    let cpus = match agent_cpus {
        Some(c) => Some(c.clone()),
        None if !lc_present && !target_cpus.is_empty() => {
            let free: Vec<usize> = (0..online).filter(|c| !target_cpus.contains(c)).collect();
            (!free.is_empty()).then_some(free)
        }
        None => None,
    };
    let nice = configured_nice.unwrap_or(if cpus.is_some() || !lc_present { 0 } else { 10 });
    WorkerPlacement { cpus, nice }
}

/// Which registered processes and memory cgroups asynchronous reclaim may take memory
/// from (memcolo's; Hermit reclaims for the node without classes). The settings are
/// `reclaim.include_elastic` and `reclaim.allow_lc`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetRules {
    /// Elastic processes are targets too (they also give memory back when notified).
    pub include_elastic: bool,
    /// LC processes, and groups holding one, may be reclaimed (tests and experiments).
    pub allow_lc: bool,
}

impl TargetRules {
    /// Whether a registered process of `class` is a reclaim target. `in_lc_tree`: it
    /// is also a process of a registered LC process's tree (a BE job started under an
    /// LC service), which is spared unless LC is allowed.
    pub fn eligible(&self, class: Class, in_lc_tree: bool) -> bool {
        let by_class = match class {
            Class::Be => true,
            Class::Elastic => self.include_elastic,
            Class::Lc => self.allow_lc,
        };
        by_class && (self.allow_lc || !in_lc_tree)
    }

    /// The order targets are taken in, lowest first: BE, then elastic, then LC.
    pub fn rank(class: Class) -> u8 {
        match class {
            Class::Be => 0,
            Class::Elastic => 1,
            Class::Lc => 2,
        }
    }

    /// Whether the memory cgroup at `group` may be reclaimed as a whole (the kernel's
    /// LRU of the group picks the pages: v2 `memory.reclaim`, v1 a limit step): it is
    /// strictly inside the scope (`scope`: the scope's group, `None` for the host)
    /// and, unless LC is allowed, no LC process's group (`lc_groups`) is it or below
    /// it. Paths are compared by components, as the cgroup file system names them.
    pub fn may_reclaim_group(
        &self,
        group: &Path,
        scope: Option<&Path>,
        lc_groups: &[PathBuf],
    ) -> bool {
        let inside = scope.is_none_or(|s| group.starts_with(s) && group != s);
        inside && (self.allow_lc || !lc_groups.iter().any(|l| l.starts_with(group)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn obs(used: u64) -> ReclaimObservation {
        ReclaimObservation {
            limit_bytes: 4 * GIB,
            used_bytes: used,
            reclaimable_bytes: 2 * GIB,
            swap_total_bytes: 8 * GIB,
            swap_free_bytes: 8 * GIB,
            ..Default::default()
        }
    }

    fn sched() -> ReclaimScheduler {
        ReclaimScheduler::new(ReclaimConfig {
            max_workers: 4,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn an_idle_node_is_looked_at_every_idle_tick_a_busy_one_every_tick() {
        let cfg = ReclaimConfig::default();
        // 3 GiB of headroom, nothing allocated: idle ticks.
        let mut s = sched();
        let mut t = ms(0);
        for _ in 0..10 {
            let d = s.step(t, &obs(GIB));
            assert_eq!(d.state, ReclaimState::Idle);
            assert_eq!(d.next_tick, cfg.idle_tick);
            t += d.next_tick;
        }
        // Allocation streaming at 2 GiB/s (400 MiB per idle tick): once the margin
        // above the low mark is less than IDLE_MARGIN_FACTOR idle ticks' worth of the
        // burst (800 MiB), the controller looks every tick, idle or not.
        let mut used = GIB;
        let mut busy = None;
        for _ in 0..10 {
            used += 400 * MIB;
            let d = s.step(t, &obs(used.min(3 * GIB + 512 * MIB)));
            t += d.next_tick;
            if d.next_tick == cfg.tick {
                busy = Some(d);
                break;
            }
        }
        let d = busy.expect("streaming allocation brings the tick back to 20 ms");
        let margin = d.headroom_bytes as f64 - d.low_mark_bytes as f64;
        let idle_allocation = IDLE_MARGIN_FACTOR * d.burst_rate * cfg.idle_tick.as_secs_f64();
        assert!(margin < idle_allocation || d.workers > 0);
        // Workers wanted: always the engaged tick.
        let mut s = sched();
        let near_limit = 4 * GIB - 8 * MIB;
        let d = s.step(ms(0), &obs(near_limit));
        let d2 = s.step(ms(0) + d.next_tick, &obs(near_limit));
        assert!(d2.workers > 0);
        assert_eq!(d2.next_tick, cfg.tick);
        // Nothing to reclaim: no point in looking often.
        let mut s = sched();
        let none = ReclaimObservation {
            reclaimable_bytes: 0,
            ..obs(near_limit)
        };
        assert_eq!(s.step(ms(0), &none).next_tick, cfg.idle_tick);
    }

    #[test]
    fn an_idle_gap_does_not_widen_the_high_mark() {
        // The same steady 100 MiB/s allocation seen every 20 ms and every 200 ms (the
        // idle tick): the high mark's tick term is the engaged tick in both.
        let run = |gap: u64| {
            let mut s = sched();
            let mut used = 512 * MIB;
            let mut last = None;
            for i in 0..40u64 {
                used += 100 * MIB * gap / 1000;
                last = Some(s.step(ms(gap * i), &obs(used)));
            }
            last.unwrap()
        };
        let fast = run(20);
        let slow = run(200);
        assert_eq!(slow.next_tick, ReclaimConfig::default().idle_tick);
        let rel = (slow.high_mark_bytes as f64 - fast.high_mark_bytes as f64).abs()
            / fast.high_mark_bytes as f64;
        assert!(
            rel < 0.05,
            "high mark {} after idle ticks against {} after ticks",
            slow.high_mark_bytes,
            fast.high_mark_bytes
        );
    }

    #[test]
    fn idle_tick_shorter_than_tick_is_refused() {
        let bad = ReclaimConfig {
            idle_tick: ms(10),
            ..Default::default()
        };
        assert!(ReclaimScheduler::new(bad).is_err());
    }

    #[test]
    fn idle_with_ample_headroom() {
        let mut s = sched();
        for i in 0..50 {
            let d = s.step(ms(20 * i), &obs(GIB));
            assert_eq!(d.workers, 0);
            assert_eq!(d.state, ReclaimState::Idle);
            assert_eq!(d.target_bytes, 0);
        }
    }

    #[test]
    fn marks_at_rest_are_the_floor_and_its_multiple() {
        let mut s = sched();
        let d = s.step(ms(0), &obs(GIB));
        // No allocation yet: high = min_high = 32 MiB, low = 2 × high.
        assert_eq!(d.high_mark_bytes, 32 * MIB);
        assert_eq!(d.low_mark_bytes, 64 * MIB);
    }

    #[test]
    fn proactive_band_gets_one_worker() {
        let mut s = sched();
        s.step(ms(0), &obs(4 * GIB - 50 * MIB));
        let d = s.step(ms(20), &obs(4 * GIB - 50 * MIB));
        // 50 MiB headroom: between high (32) and low (64).
        assert_eq!(d.state, ReclaimState::Proactive);
        assert_eq!(d.workers, 1);
        assert_eq!(d.target_bytes, d.low_mark_bytes - d.headroom_bytes);
    }

    #[test]
    fn urgent_deficit_scales_workers_with_rate_and_respects_budget() {
        let mut s = sched();
        // Allocation at 1 GiB/s for 0.5 s: 10 MiB... per 10 ms tick, from 3 GiB used.
        let mut used = 3 * GIB;
        let mut d = s.step(ms(0), &obs(used));
        for i in 1..=50 {
            used += 10 * MIB;
            d = s.step(ms(10 * i), &obs(used.min(4 * GIB)));
        }
        // Burst 1000 MiB/s × (16 MiB / 256 MiB/s + 10 ms) ≈ 72 MiB high mark.
        assert!(
            d.high_mark_bytes > 60 * MIB && d.high_mark_bytes < 90 * MIB,
            "{d:?}"
        );
        // Headroom is 3 GiB + 500 MiB used of 4 GiB: 524 MiB — still above low?
        // low = min(2 × high, 10 % of 4 GiB = 409.6 MiB): idle.
        assert_eq!(d.state, ReclaimState::Idle);
        // Now the headroom collapses to 8 MiB while allocating at 1 GiB/s.
        for i in 51..=60 {
            used = 4 * GIB - 8 * MIB;
            d = s.step(
                ms(10 * i),
                &ReclaimObservation {
                    reclaimed_bytes: 10 * MIB,
                    ..obs(used)
                },
            );
        }
        assert_eq!(d.state, ReclaimState::Urgent);
        // Needs ≈ alloc (≥ 0.5 GiB/s) + deficit / 0.2 s at 256 MiB/s per worker: > 2
        // workers, capped at the budget of 4.
        assert!(d.workers >= 2, "{d:?}");
        assert!(d.workers <= 4);
        let mut tight = ReclaimScheduler::new(ReclaimConfig {
            max_workers: 1,
            ..Default::default()
        })
        .unwrap();
        tight.step(ms(0), &obs(4 * GIB - 8 * MIB));
        let d = tight.step(ms(10), &obs(4 * GIB - MIB));
        assert_eq!(d.state, ReclaimState::Urgent);
        assert_eq!(d.workers, 1);
    }

    #[test]
    fn worker_rate_is_measured() {
        let mut s = sched();
        s.step(ms(0), &obs(GIB));
        // Workers reclaimed 64 MiB in 0.5 s of busy time: 128 MiB/s, usage unchanged.
        let mut d = s.step(
            ms(500),
            &ReclaimObservation {
                reclaimed_bytes: 64 * MIB,
                worker_busy: ms(500),
                ..obs(GIB)
            },
        );
        assert!(d.worker_rate < 256.0 * MIB as f64);
        for i in 2..40 {
            d = s.step(
                ms(500 * i),
                &ReclaimObservation {
                    reclaimed_bytes: 64 * MIB,
                    worker_busy: ms(500),
                    ..obs(GIB)
                },
            );
        }
        assert!(
            (d.worker_rate - 128.0 * MIB as f64).abs() < MIB as f64,
            "{d:?}"
        );
    }

    #[test]
    fn low_multiplier_grows_while_turnaround_holds_and_resets_when_it_falls() {
        // 70 MiB of headroom throughout, so usage itself never looks like a burst.
        const USED: u64 = 4 * GIB - 70 * MIB;
        let mut s = sched();
        // Nothing refaults: turnaround infinite, k grows 2 → 2.5 → ... ≤ 16.
        let mut d = s.step(ms(0), &obs(USED));
        for i in 1..=20 {
            d = s.step(Duration::from_secs(i), &obs(USED));
        }
        assert_eq!(d.low_multiplier, 16.0);
        // Low is capped at 10 % of the limit.
        assert!(d.low_mark_bytes as f64 <= 0.1 * (4 * GIB) as f64 + 1.0);
        // Turnaround: 1 GiB swapped, refaulting at 8 MiB/s ≈ 128 s.
        let mut t = 20;
        for _ in 0..10 {
            t += 1;
            d = s.step(
                Duration::from_secs(t),
                &ReclaimObservation {
                    swapin_bytes: 8 * MIB,
                    swapped_bytes: GIB,
                    ..obs(USED)
                },
            );
        }
        assert!(d.turnaround_s.unwrap() > 100.0);
        assert_eq!(d.low_multiplier, 16.0);
        // Thrash: swap-ins jump to 512 MiB/s with 1 GiB swapped: turnaround falls
        // to ~2 s and below half the previous period's → back off, k resets.
        let mut backed_off = false;
        for _ in 0..6 {
            t += 1;
            d = s.step(
                Duration::from_secs(t),
                &ReclaimObservation {
                    swapin_bytes: 512 * MIB,
                    swapped_bytes: GIB,
                    ..obs(USED)
                },
            );
            if d.low_multiplier == 2.0 {
                backed_off = true;
                // Only the high mark is kept: low = high + one batch, so 70 MiB of
                // headroom is now enough.
                assert_eq!(d.low_mark_bytes, d.high_mark_bytes + 16 * MIB);
                assert_eq!(d.state, ReclaimState::Idle, "{d:?}");
                // With 40 MiB of headroom, between the marks: one worker.
                t += 1;
                d = s.step(
                    Duration::from_secs(t),
                    &ReclaimObservation {
                        swapin_bytes: 512 * MIB,
                        swapped_bytes: GIB,
                        ..obs(4 * GIB - 40 * MIB)
                    },
                );
                assert_eq!(d.state, ReclaimState::BackingOff, "{d:?}");
                assert_eq!(d.workers, 1);
                break;
            }
        }
        assert!(backed_off, "{d:?}");
    }

    fn sampled(turnaround_s: f64, pages: u32) -> Option<SampledTurnaround> {
        Some(SampledTurnaround {
            turnaround_s,
            at_least: false,
            pages,
        })
    }

    /// 1 GiB in swap refaulting at 8 MiB/s, observed once a second: a Little's-law
    /// mean of 128 s.
    fn slow_mean(used: u64, sampled_turnaround: Option<SampledTurnaround>) -> ReclaimObservation {
        slow_mean_every(1000, used, sampled_turnaround)
    }

    /// As [`slow_mean`], observed every `tick_ms`.
    fn slow_mean_every(
        tick_ms: u64,
        used: u64,
        sampled_turnaround: Option<SampledTurnaround>,
    ) -> ReclaimObservation {
        ReclaimObservation {
            swapin_bytes: 8 * MIB * tick_ms / 1000,
            swapped_bytes: GIB,
            sampled_turnaround,
            ..obs(used)
        }
    }

    #[test]
    fn a_short_sampled_turnaround_backs_off_though_the_mean_is_long_and_recovers() {
        // 70 MiB of headroom: inside the proactive band once k has grown (low =
        // min(k × 32 MiB, 2 % of 4 GiB ≈ 82 MiB)).
        const USED: u64 = 4 * GIB - 70 * MIB;
        let mut s = sched();
        let mut d = s.step(ms(0), &obs(USED));
        for i in 1..=5 {
            d = s.step(Duration::from_secs(i), &obs(USED));
        }
        assert_eq!(d.state, ReclaimState::Proactive, "{d:?}");
        assert_eq!(d.workers, 1);
        assert!(d.low_multiplier > 2.0);
        // Old evictions sit in swap and rarely come back (mean 128 s), but half of
        // what reclaim evicted recently was back within 0.7 s: thrashing. One period
        // later the scheduler backs off.
        let mut t = 5_000;
        for _ in 0..50 {
            t += 20;
            d = s.step(ms(t), &slow_mean_every(20, USED, sampled(0.7, 64)));
        }
        assert_eq!(d.turnaround_source, TurnaroundSource::Sampled, "{d:?}");
        assert_eq!(d.turnaround_s, Some(0.7));
        assert!(d.mean_turnaround_s.unwrap() > 100.0, "{d:?}");
        assert_eq!(d.low_multiplier, 2.0, "{d:?}");
        assert!(d.backing_off && d.backoffs >= 1, "{d:?}");
        // Only the high mark and one batch above it are kept: 70 MiB is enough.
        assert_eq!(d.high_mark_bytes, 32 * MIB);
        assert_eq!(d.low_mark_bytes, 48 * MIB, "{d:?}");
        assert_eq!(
            (d.state, d.workers, d.target_bytes),
            (ReclaimState::Idle, 0, 0)
        );
        // Headroom drifts down to 40 MiB at 12.5 MiB/s (no burst to raise the high
        // mark): between the marks, one worker, backing off, up to the low mark only.
        let mut used = USED;
        while used < 4 * GIB - 40 * MIB {
            used += MIB / 4;
            t += 20;
            d = s.step(ms(t), &slow_mean_every(20, used, sampled(0.7, 64)));
        }
        assert_eq!((d.state, d.workers), (ReclaimState::BackingOff, 1), "{d:?}");
        assert_eq!(d.high_mark_bytes, 32 * MIB, "{d:?}");
        assert_eq!(d.target_bytes, 8 * MIB);
        // Below the high mark the deficit is closed whatever the turnaround: 32 MiB
        // allocated in one tick and a deficit to close in 0.2 s need 2 or more
        // workers at 256 MiB/s each.
        t += 20;
        d = s.step(
            ms(t),
            &slow_mean_every(20, 4 * GIB - 8 * MIB, sampled(0.7, 64)),
        );
        assert_eq!(d.state, ReclaimState::Urgent, "{d:?}");
        assert!(d.workers >= 2 && d.workers <= 4, "{d:?}");
        // Recovery: recent evictions now stay out 5 s. The back-off lasts its three
        // periods, k grows meanwhile, and then the band is back.
        let mut periods_backed_off = 0;
        let mut last_period = t / 1000;
        for _ in 0..300 {
            t += 20;
            d = s.step(ms(t), &slow_mean_every(20, USED, sampled(5.0, 64)));
            if t / 1000 != last_period {
                last_period = t / 1000;
                if d.low_mark_bytes == d.high_mark_bytes + 16 * MIB {
                    periods_backed_off += 1;
                }
            }
        }
        assert!(periods_backed_off <= 3, "{periods_backed_off}");
        assert!(!d.backing_off, "{d:?}");
        assert_eq!(d.turnaround_s, Some(5.0));
        assert!(d.low_multiplier > 4.0, "{d:?}");
        assert_eq!((d.state, d.workers), (ReclaimState::Proactive, 1), "{d:?}");
        assert!(d.low_mark_bytes > 80 * MIB, "{d:?}");
    }

    #[test]
    fn too_few_sampled_evictions_leave_the_back_off_to_the_mean() {
        const USED: u64 = 4 * GIB - 70 * MIB;
        let mut s = sched();
        let mut d = s.step(ms(0), &obs(USED));
        // 15 sampled pages (one short of the default 16) say 0.5 s: not trusted, the
        // 128 s mean steers, and k keeps growing.
        for i in 1..=8 {
            d = s.step(Duration::from_secs(i), &slow_mean(USED, sampled(0.5, 15)));
        }
        assert_eq!(d.turnaround_source, TurnaroundSource::Mean, "{d:?}");
        assert!(d.turnaround_s.unwrap() > 100.0);
        assert!(d.low_multiplier > 5.0, "{d:?}");
        assert_eq!(d.state, ReclaimState::Proactive);
        // The 16th page makes the sample count: back off.
        d = s.step(Duration::from_secs(9), &slow_mean(USED, sampled(0.5, 16)));
        assert_eq!(d.turnaround_source, TurnaroundSource::Sampled);
        assert_eq!(
            (d.low_multiplier, d.state),
            (2.0, ReclaimState::Idle),
            "{d:?}"
        );
        // No sampler and nothing refaulting: infinite, no source.
        let mut s = sched();
        s.step(ms(0), &obs(USED));
        let d = s.step(Duration::from_secs(1), &obs(USED));
        assert_eq!(
            (d.turnaround_s, d.turnaround_source),
            (None, TurnaroundSource::None)
        );
    }

    #[test]
    fn a_sampled_fall_backs_off_but_a_lower_bound_or_a_change_of_source_does_not() {
        const USED: u64 = 4 * GIB - 70 * MIB;
        let at_least = |t: f64| {
            Some(SampledTurnaround {
                turnaround_s: t,
                at_least: true,
                pages: 64,
            })
        };
        let backed_off = |d: &ReclaimDecision| d.low_mark_bytes == d.high_mark_bytes + 16 * MIB;
        let mut s = sched();
        let mut d = s.step(ms(0), &obs(USED));
        let mut t = 0;
        let mut period = |s: &mut ReclaimScheduler, o: ReclaimObservation| {
            t += 1;
            s.step(Duration::from_secs(t), &o)
        };
        // Every recent eviction is younger than 0.5 s and none is back: the median is
        // only known to exceed 0.5 s, which is no thrash.
        for _ in 0..4 {
            d = period(&mut s, slow_mean(USED, at_least(0.5)));
        }
        assert!(d.turnaround_at_least && !backed_off(&d), "{d:?}");
        // 8 s, then 3 s: below half the previous period's, a fall.
        d = period(&mut s, slow_mean(USED, sampled(8.0, 64)));
        assert!(!backed_off(&d), "{d:?}");
        d = period(&mut s, slow_mean(USED, sampled(3.0, 64)));
        assert!(backed_off(&d), "{d:?}");
        // Steady at 3 s: the back-off runs out after its periods.
        for _ in 0..3 {
            d = period(&mut s, slow_mean(USED, sampled(3.0, 64)));
        }
        assert!(!backed_off(&d), "{d:?}");
        // A lower bound of 9 s, then 4 s known: a fall (the true value fell more).
        d = period(&mut s, slow_mean(USED, at_least(9.0)));
        assert!(!backed_off(&d), "{d:?}");
        d = period(&mut s, slow_mean(USED, sampled(4.0, 64)));
        assert!(backed_off(&d), "{d:?}");
        for _ in 0..3 {
            d = period(&mut s, slow_mean(USED, sampled(4.0, 64)));
        }
        assert!(!backed_off(&d), "{d:?}");
        // The mean (128 s) then a sample of 20 s: different sources, not compared.
        d = period(&mut s, slow_mean(USED, None));
        assert_eq!(d.turnaround_source, TurnaroundSource::Mean);
        d = period(&mut s, slow_mean(USED, sampled(20.0, 64)));
        assert!(!backed_off(&d), "{d:?}");
        // A known value falling from a known one within the same source still counts.
        d = period(&mut s, slow_mean(USED, sampled(6.0, 64)));
        assert!(backed_off(&d), "{d:?}");
    }

    #[test]
    fn a_band_whose_evictions_would_fit_in_it_shrinks_to_the_high_mark() {
        // The job fits: what is in swap is only what the band evicted (≈ low), and it
        // refaults at 64 MiB/s. Each period the low mark is capped at swapped / 2.
        let wide = || {
            ReclaimScheduler::new(ReclaimConfig {
                max_workers: 4,
                max_low_ratio: 0.10,
                ..Default::default()
            })
            .unwrap()
        };
        let mut s = wide();
        let limit = 4 * GIB;
        let mut d = s.step(ms(0), &obs(limit - 300 * MIB));
        for i in 1..=20 {
            d = s.step(Duration::from_secs(i), &obs(limit - 300 * MIB));
        }
        let band = d.low_mark_bytes;
        assert!(band > 300 * MIB, "{d:?}");
        let mut swapped = band;
        for i in 21..=40 {
            d = s.step(
                Duration::from_secs(i),
                &ReclaimObservation {
                    // Workers evict what refaults: allocation is all refaults.
                    reclaimed_bytes: 64 * MIB,
                    swapin_bytes: 64 * MIB,
                    swapped_bytes: swapped,
                    ..obs(limit - 300 * MIB)
                },
            );
            // What stays out follows the band.
            swapped = d.low_mark_bytes;
        }
        assert_eq!(d.low_mark_bytes, d.high_mark_bytes, "{d:?}");
        // Refaults of what the marks keep out do not inflate the high mark.
        assert_eq!(d.high_mark_bytes, 32 * MIB, "{d:?}");
        assert_eq!(d.refault_distance_bytes, Some(swapped));

        // A job that does not fit keeps much more than the band in swap: no cap.
        let mut s = wide();
        s.step(ms(0), &obs(limit - 300 * MIB));
        for i in 1..=20 {
            d = s.step(
                Duration::from_secs(i),
                &ReclaimObservation {
                    swapin_bytes: 64 * MIB,
                    swapped_bytes: 2 * GIB,
                    ..obs(limit - 300 * MIB)
                },
            );
        }
        assert!(!d.churn_capped, "{d:?}");
        assert!(d.low_mark_bytes > 300 * MIB, "{d:?}");
    }

    #[test]
    fn charges_measure_allocation_without_the_lumps_of_batch_credit() {
        // 1 MiB charged per 20 ms tick (50 MiB/s) while a worker's 16 MiB batch is
        // credited in one tick every 10 (80 MiB/s), so usage falls by 30 MiB/s: the
        // burst envelope follows the charges, not the lumps.
        let mut s = sched();
        let mut used = 2 * GIB;
        let mut d = s.step(ms(0), &obs(used));
        for i in 1..=500u64 {
            used -= 30 * MIB / 50;
            d = s.step(
                ms(20 * i),
                &ReclaimObservation {
                    charged_bytes: Some(MIB),
                    reclaimed_bytes: if i % 10 == 0 { 16 * MIB } else { 0 },
                    ..obs(used)
                },
            );
        }
        // (The calibration against usage ripples by a few percent after each lump; a
        // lump itself would be 800 MiB/s.)
        let rate = 50.0 * MIB as f64;
        assert!((d.burst_rate - rate).abs() < 0.1 * rate, "{d:?}");
        assert!((d.alloc_rate - rate).abs() < 0.1 * rate, "{d:?}");
    }

    #[test]
    fn charges_counted_per_folio_are_scaled_to_the_bytes_usage_shows() {
        // A streamer allocating 64 MiB/s of page cache in 256 KiB folios: v1 counts
        // one event (4 KiB) per folio, 1/64 of the bytes. Usage shows the bytes; the
        // scale is set from the first 1 s block on, and 8 s in the 1 s average of the
        // rate has settled.
        let mut s = sched();
        let mut used = GIB;
        let mut d = s.step(ms(0), &obs(used));
        for i in 1..=400u64 {
            let bytes = 64 * MIB / 50;
            used += bytes;
            d = s.step(
                ms(20 * i),
                &ReclaimObservation {
                    charged_bytes: Some(bytes / 64),
                    ..obs(used)
                },
            );
        }
        let rate = 64.0 * MIB as f64;
        assert!((d.burst_rate - rate).abs() < 0.05 * rate, "{d:?}");
        assert!((d.alloc_rate - rate).abs() < 0.05 * rate, "{d:?}");
        // The timing still comes from the charges: a burst of 4x in one tick shows
        // in the envelope at once.
        used += 4 * 64 * MIB / 50;
        d = s.step(
            ms(20 * 401),
            &ReclaimObservation {
                charged_bytes: Some(4 * 64 * MIB / 50 / 64),
                ..obs(used)
            },
        );
        assert!(d.burst_rate > 3.0 * rate, "{d:?}");
        // Charges that overcount (usage below them) are never scaled down.
        let mut s = sched();
        let mut d = s.step(ms(0), &obs(GIB));
        for i in 1..=250u64 {
            d = s.step(
                ms(20 * i),
                &ReclaimObservation {
                    charged_bytes: Some(MIB),
                    ..obs(GIB)
                },
            );
        }
        assert!((d.alloc_rate - 50.0 * MIB as f64).abs() < 0.05 * 50.0 * MIB as f64);
    }

    /// A page-cache streamer at 100 MiB/s in 2 MiB folios, one charge event of 4 KiB
    /// per 20 ms tick, from `from` for `secs` seconds; `at_limit`: every tick has
    /// limit failures and the scope's usage is flat (only `reclaimed_per_tick` shows).
    fn stream(
        s: &mut ReclaimScheduler,
        from: u64,
        secs: u64,
        used: &mut u64,
        at_limit: bool,
        reclaimed_per_tick: u64,
        removed: impl Fn(u64) -> u64,
    ) -> ReclaimDecision {
        let mut d = None;
        for i in from * 50 + 1..=(from + secs) * 50 {
            let removed_now = removed(i);
            if !at_limit {
                *used += 2 * MIB;
                *used -= removed_now;
            }
            d = Some(s.step(
                ms(20 * i),
                &ReclaimObservation {
                    charged_bytes: Some(4096),
                    reclaimed_bytes: reclaimed_per_tick,
                    removed_bytes: removed_now,
                    limit_failures: u64::from(at_limit),
                    ..obs(*used)
                },
            ));
        }
        d.unwrap()
    }

    #[test]
    fn a_burst_of_small_charges_does_not_hold_down_the_scale_of_large_folios() {
        // The streamer starts: 1236 events of 4 KiB pages (its binary, its buffers)
        // while usage grows 43 MiB, then 2 MiB folios. The first block's ratio is
        // low; the median of the blocks is the folios' 512 from the second on.
        let mut s = sched();
        let mut used = GIB;
        s.step(ms(0), &obs(used));
        used += 43 * MIB;
        s.step(
            ms(20),
            &ReclaimObservation {
                charged_bytes: Some(1236 * 4096),
                ..obs(used)
            },
        );
        let d = stream(&mut s, 0, 6, &mut used, false, 0, |_| 0);
        let rate = 100.0 * MIB as f64;
        assert!((d.alloc_rate - rate).abs() < 0.1 * rate, "{d:?}");
        assert!((d.burst_rate - rate).abs() < 0.1 * rate, "{d:?}");
    }

    #[test]
    fn blocks_at_the_limit_never_lower_the_scale() {
        let rate = 100.0 * MIB as f64;
        // Calibrated to 2 MiB folios, then at the limit: usage flat, the workers
        // reclaim 10 MiB/s and the kernel the rest. The blocks' ratio (51) is only a
        // lower bound: the scale and the rate hold.
        let mut s = sched();
        let mut used = GIB;
        s.step(ms(0), &obs(used));
        stream(&mut s, 0, 6, &mut used, false, 0, |_| 0);
        let d = stream(&mut s, 6, 10, &mut used, true, 10 * MIB / 50, |_| 0);
        assert!((d.alloc_rate - rate).abs() < 0.1 * rate, "{d:?}");
        // The same blocks without failures are taken at their word.
        let mut s = sched();
        let mut used = GIB;
        s.step(ms(0), &obs(used));
        stream(&mut s, 0, 6, &mut used, false, 0, |_| 0);
        let mut at_limit_unseen = stream(&mut s, 6, 10, &mut used, false, 0, |_| 0);
        assert!(at_limit_unseen.alloc_rate > 0.9 * rate);
        for i in 16 * 50 + 1..=26 * 50 {
            at_limit_unseen = s.step(
                ms(20 * i),
                &ReclaimObservation {
                    charged_bytes: Some(4096),
                    reclaimed_bytes: 10 * MIB / 50,
                    ..obs(used)
                },
            );
        }
        assert!(
            at_limit_unseen.alloc_rate < 0.2 * rate,
            "{at_limit_unseen:?}"
        );
        // With no calibration before, blocks at the limit raise the scale to their
        // lower bound: 10 MiB/s shown over 100 MiB/s of folios counted as pages.
        let mut s = sched();
        let mut used = GIB;
        s.step(ms(0), &obs(used));
        let d = stream(&mut s, 0, 10, &mut used, true, 10 * MIB / 50, |_| 0);
        assert!((d.alloc_rate - 0.1 * rate).abs() < 0.02 * rate, "{d:?}");
    }

    #[test]
    fn small_folios_after_a_large_folio_calibration_count_no_more_than_usage_shows() {
        let rate = 100.0 * MIB as f64;
        // The streamer's cache was dropped and its readahead starts over in 16 KiB
        // folios: 128 events (2 MiB) in a tick, after 6 s calibrated to 2 MiB folios.
        // At 512 per event that would be 256 MiB in 20 ms. Returns the tick's burst
        // in MiB.
        let small_after_large = |o: ReclaimObservation| {
            let mut s = sched();
            let mut used = GIB;
            s.step(ms(0), &obs(used));
            let d = stream(&mut s, 0, 6, &mut used, false, 0, |_| 0);
            assert_eq!(d.charge_scale, 512.0);
            let d = s.step(
                ms(20 * 301),
                &ReclaimObservation {
                    charged_bytes: Some(128 * 4096),
                    used_bytes: used + 2 * MIB,
                    ..o
                },
            );
            assert!(d.alloc_rate < 2.0 * rate || o.limit_failures > 0, "{d:?}");
            d.burst_rate * 0.02 / MIB as f64
        };
        // Usage shows 2 MiB: 2 MiB + 4 MiB of slack at most.
        let b = small_after_large(obs(0));
        assert!((b - 6.0).abs() < 1e-6, "{b}");
        // A batch in flight may hide up to its bytes: it widens the bound.
        let b = small_after_large(ReclaimObservation {
            inflight_bytes: 16 * MIB,
            ..obs(0)
        });
        assert!((b - 22.0).abs() < 1e-6, "{b}");
        // So do charges that hit the limit (the kernel reclaimed unseen, up to 2 MiB
        // each): 2 MiB each, and with 200 of them the scaled charges stand.
        let b = small_after_large(ReclaimObservation {
            limit_failures: 2,
            ..obs(0)
        });
        assert!((b - 10.0).abs() < 1e-6, "{b}");
        let b = small_after_large(ReclaimObservation {
            limit_failures: 200,
            ..obs(0)
        });
        assert!((b - 256.0).abs() < 1e-6, "{b}");
    }

    #[test]
    fn memory_memcolo_removed_by_other_means_counts_as_allocation() {
        // The streamer, and every 0.5 s the core drops the 50 MiB of page cache it
        // read meanwhile on Hermes advice: usage stays flat, but the drops are
        // reported.
        let rate = 100.0 * MIB as f64;
        let drops = |i: u64| if i.is_multiple_of(25) { 50 * MIB } else { 0 };
        let mut s = sched();
        let mut used = GIB;
        s.step(ms(0), &obs(used));
        let d = stream(&mut s, 0, 20, &mut used, false, 0, drops);
        assert!((d.alloc_rate - rate).abs() < 0.1 * rate, "{d:?}");
        // Unreported, no block would show allocation, and the folios would stay
        // counted as 4 KiB pages.
        let mut s = sched();
        let mut used = GIB;
        s.step(ms(0), &obs(used));
        let mut d = d;
        for i in 1..=20 * 50u64 {
            used = used + 2 * MIB - drops(i);
            d = s.step(
                ms(20 * i),
                &ReclaimObservation {
                    charged_bytes: Some(4096),
                    ..obs(used)
                },
            );
        }
        assert!(d.alloc_rate < 0.01 * rate, "{d:?}");
        // Without charges (the host scope) they count the same way.
        let mut s = sched();
        let mut used = GIB;
        s.step(ms(0), &obs(used));
        for i in 1..=20 * 50u64 {
            used = used + 2 * MIB - drops(i);
            d = s.step(
                ms(20 * i),
                &ReclaimObservation {
                    removed_bytes: drops(i),
                    ..obs(used)
                },
            );
        }
        assert!((d.alloc_rate - rate).abs() < 0.1 * rate, "{d:?}");
    }

    #[test]
    fn backing_off_never_abandons_the_high_mark() {
        let mut s = sched();
        s.k = 2.0;
        s.backoff_left = 3;
        s.step(ms(0), &obs(GIB));
        let d = s.step(ms(20), &obs(4 * GIB - MIB));
        assert_eq!(d.state, ReclaimState::Urgent);
        assert!(d.workers >= 1);
    }

    #[test]
    fn swap_nearly_full_stops_reclaim() {
        let mut s = sched();
        s.step(ms(0), &obs(4 * GIB - MIB));
        let d = s.step(
            ms(20),
            &ReclaimObservation {
                swap_free_bytes: 100 * MIB,
                ..obs(4 * GIB - MIB)
            },
        );
        assert_eq!(d.state, ReclaimState::SwapFull);
        assert_eq!(d.workers, 0);
        // With no swap at all (file-only reclaim) there is no swap stop.
        let d = s.step(
            ms(40),
            &ReclaimObservation {
                swap_total_bytes: 0,
                swap_free_bytes: 0,
                ..obs(4 * GIB - MIB)
            },
        );
        assert_eq!(d.state, ReclaimState::Urgent);
    }

    #[test]
    fn nothing_to_reclaim_means_no_workers() {
        let mut s = sched();
        let d = s.step(
            ms(0),
            &ReclaimObservation {
                reclaimable_bytes: 0,
                ..obs(4 * GIB - MIB)
            },
        );
        assert_eq!(d.state, ReclaimState::NothingToReclaim);
        assert_eq!(d.workers, 0);
    }

    #[test]
    fn target_never_exceeds_what_is_reclaimable() {
        let mut s = sched();
        let d = s.step(
            ms(0),
            &ReclaimObservation {
                reclaimable_bytes: 5 * MIB,
                ..obs(4 * GIB - MIB)
            },
        );
        assert_eq!(d.target_bytes, 5 * MIB);
    }

    #[test]
    fn time_going_backwards_is_no_time() {
        let mut s = sched();
        s.step(ms(1000), &obs(GIB));
        let d = s.step(ms(500), &obs(2 * GIB));
        assert!(d.alloc_rate == 0.0 && d.burst_rate == 0.0);
    }

    #[test]
    fn invalid_configs_are_refused() {
        for cfg in [
            ReclaimConfig {
                max_workers: 0,
                ..Default::default()
            },
            ReclaimConfig {
                batch_bytes: 0,
                ..Default::default()
            },
            ReclaimConfig {
                low_multiplier_min: 0.5,
                ..Default::default()
            },
            ReclaimConfig {
                low_multiplier_max: 1.5,
                ..Default::default()
            },
            ReclaimConfig {
                max_low_ratio: 1.0,
                ..Default::default()
            },
            ReclaimConfig {
                turnaround_drop_ratio: 0.0,
                ..Default::default()
            },
            ReclaimConfig {
                swap_stop_free_ratio: 1.0,
                ..Default::default()
            },
            ReclaimConfig {
                close_time: Duration::ZERO,
                ..Default::default()
            },
            ReclaimConfig {
                initial_worker_rate: f64::NAN,
                ..Default::default()
            },
            ReclaimConfig {
                churn_ratio: 0.5,
                ..Default::default()
            },
            ReclaimConfig {
                batch_period: Duration::ZERO,
                ..Default::default()
            },
        ] {
            assert!(ReclaimScheduler::new(cfg).is_err());
        }
    }

    #[test]
    fn fixed_mark_baseline_uses_one_worker_at_a_constant_mark() {
        let mut s = ReclaimScheduler::new(ReclaimConfig {
            max_workers: 4,
            fixed_low_bytes: Some(64 * MIB),
            ..Default::default()
        })
        .unwrap();
        s.step(ms(0), &obs(3 * GIB));
        // A 1 GiB/s burst does not move the mark, and a deep deficit gets one worker.
        let d = s.step(ms(100), &obs(4 * GIB - MIB));
        assert_eq!((d.low_mark_bytes, d.high_mark_bytes), (64 * MIB, 64 * MIB));
        assert_eq!(d.workers, 1);
        assert_eq!(d.target_bytes, 63 * MIB);
        let d = s.step(ms(200), &obs(4 * GIB - 65 * MIB));
        assert_eq!(d.workers, 0);
        // The fixed design keeps its batch whatever the rate.
        assert_eq!(d.batch_bytes, 16 * MIB);
    }

    /// Usage held at `4 GiB - headroom` while workers report `rate_mib_s` reclaimed:
    /// allocation streams at that rate. Returns the last decision after 5 s of 20 ms
    /// ticks (the smoothed rate then within 4 % of the stream's).
    fn streaming(s: &mut ReclaimScheduler, headroom: u64, rate_mib_s: u64) -> ReclaimDecision {
        let mut d = s.step(ms(0), &obs(4 * GIB - headroom));
        for i in 1..=250 {
            d = s.step(
                ms(20 * i),
                &ReclaimObservation {
                    reclaimed_bytes: rate_mib_s * MIB / 50,
                    worker_busy: ms(2),
                    ..obs(4 * GIB - headroom)
                },
            );
        }
        d
    }

    #[test]
    fn a_stream_of_allocation_is_reclaimed_in_fewer_larger_batches() {
        // 1 GiB/s: a batch period (100 ms) allocates ~100 MiB, so batches are at the
        // ceiling (64 MiB) and a worker that starts takes a whole batch even where
        // the low mark is nearer.
        let mut s = sched();
        let d = streaming(&mut s, 60 * MIB, 1024);
        assert!(d.alloc_rate > 980.0 * MIB as f64, "{d:?}");
        assert_eq!(d.batch_bytes, 64 * MIB, "{d:?}");
        assert!(d.workers >= 1, "{d:?}");
        assert!(d.low_mark_bytes - d.headroom_bytes < 64 * MIB, "{d:?}");
        assert_eq!(d.target_bytes, 64 * MIB, "{d:?}");
        // 400 MiB/s: 40 MiB per period, between the floor and the ceiling.
        let mut s = sched();
        let d = streaming(&mut s, 60 * MIB, 400);
        assert!(
            d.batch_bytes > 36 * MIB && d.batch_bytes < 44 * MIB,
            "{d:?}"
        );
        assert!(d.target_bytes >= d.batch_bytes, "{d:?}");
        // A ceiling at the floor keeps every batch at batch_bytes.
        let mut s = ReclaimScheduler::new(ReclaimConfig {
            max_workers: 4,
            max_batch_bytes: 16 * MIB,
            ..Default::default()
        })
        .unwrap();
        let d = streaming(&mut s, 60 * MIB, 1024);
        assert_eq!(d.batch_bytes, 16 * MIB, "{d:?}");
        assert!(d.target_bytes >= 16 * MIB, "{d:?}");
    }

    #[test]
    fn slow_allocation_keeps_the_batch_floor_and_reclaims_only_to_the_low_mark() {
        // 50 MiB/s: 5 MiB per period, below the 16 MiB floor: no reclaim ahead.
        let mut s = sched();
        let d = streaming(&mut s, 50 * MIB, 50);
        assert_eq!(d.batch_bytes, 16 * MIB, "{d:?}");
        assert_eq!(d.state, ReclaimState::Proactive, "{d:?}");
        assert_eq!(d.target_bytes, d.low_mark_bytes - d.headroom_bytes, "{d:?}");
        // At rest nothing is reclaimed, whatever the batch.
        let d = s.step(ms(3000), &obs(GIB));
        assert_eq!((d.workers, d.target_bytes), (0, 0));
    }

    #[test]
    fn workers_yield_only_when_they_may_share_an_lc_cpu() {
        let none = BTreeSet::new();
        let cpu0: BTreeSet<usize> = [0].into();
        // Confined off the LC CPUs: there, and nice 0.
        let p = worker_placement(None, &Some(vec![1]), true, &cpu0, 2);
        assert_eq!(
            p,
            WorkerPlacement {
                cpus: Some(vec![1]),
                nice: 0
            }
        );
        // LC processes may run anywhere: anywhere, yielding to them.
        let p = worker_placement(None, &None, true, &cpu0, 2);
        assert_eq!(
            p,
            WorkerPlacement {
                cpus: None,
                nice: 10
            }
        );
        // The configured nice value wins.
        assert_eq!(
            worker_placement(Some(5), &Some(vec![1]), true, &none, 2).nice,
            5
        );
    }

    #[test]
    fn with_no_lc_workers_run_beside_the_jobs_they_serve_not_on_their_cpus() {
        let cpu0: BTreeSet<usize> = [0].into();
        // A BE job pinned to CPU 0 and no LC process: the workers take CPU 1 at nice 0.
        let p = worker_placement(None, &None, false, &cpu0, 2);
        assert_eq!(
            p,
            WorkerPlacement {
                cpus: Some(vec![1]),
                nice: 0
            }
        );
        // Jobs that may run on every CPU leave none to prefer: anywhere, still nice 0.
        let all: BTreeSet<usize> = [0, 1].into();
        assert_eq!(
            worker_placement(None, &None, false, &all, 2),
            WorkerPlacement {
                cpus: None,
                nice: 0
            }
        );
        assert_eq!(
            worker_placement(None, &None, false, &BTreeSet::new(), 4),
            WorkerPlacement {
                cpus: None,
                nice: 0
            }
        );
    }

    #[test]
    fn targets_are_be_then_elastic_then_lc_as_the_settings_allow() {
        let rules = |include_elastic, allow_lc| TargetRules {
            include_elastic,
            allow_lc,
        };
        // (include_elastic, allow_lc), class, in an LC process's tree → a target.
        let table = [
            ((false, false), Class::Be, false, true),
            ((false, false), Class::Elastic, false, false),
            ((false, false), Class::Lc, false, false),
            // A BE process inside an LC process's tree is spared.
            ((false, false), Class::Be, true, false),
            ((true, false), Class::Elastic, false, true),
            ((true, false), Class::Elastic, true, false),
            ((true, false), Class::Lc, false, false),
            ((true, true), Class::Lc, true, true),
            ((true, true), Class::Be, true, true),
        ];
        for ((e, l), class, in_lc, want) in table {
            assert_eq!(
                rules(e, l).eligible(class, in_lc),
                want,
                "{class:?} in LC tree {in_lc}, include_elastic {e}, allow_lc {l}"
            );
        }
        let mut classes = vec![Class::Lc, Class::Be, Class::Elastic, Class::Be];
        classes.sort_by_key(|c| TargetRules::rank(*c));
        assert_eq!(classes, [Class::Be, Class::Be, Class::Elastic, Class::Lc]);
    }

    #[test]
    fn a_group_is_reclaimed_whole_only_strictly_inside_the_scope_and_without_lc() {
        let rules = TargetRules::default();
        let scope = Path::new("/cg/node");
        let lc = vec![PathBuf::from("/cg/node/svc/lc")];
        // Inside the scope, no LC below: yes.
        assert!(rules.may_reclaim_group(Path::new("/cg/node/be"), Some(scope), &lc));
        // The scope itself, a group outside it, a sibling by name prefix only: no.
        assert!(!rules.may_reclaim_group(scope, Some(scope), &lc));
        assert!(!rules.may_reclaim_group(Path::new("/cg/other"), Some(scope), &lc));
        assert!(!rules.may_reclaim_group(Path::new("/cg/node2/be"), Some(scope), &lc));
        // A group holding an LC process, itself or in a child group: no.
        assert!(!rules.may_reclaim_group(Path::new("/cg/node/svc"), Some(scope), &lc));
        assert!(!rules.may_reclaim_group(Path::new("/cg/node/svc/lc"), Some(scope), &lc));
        // A group beside the LC one whose name extends it: yes.
        assert!(rules.may_reclaim_group(Path::new("/cg/node/svc/lc2"), Some(scope), &lc));
        // The host scope: any group without LC.
        assert!(rules.may_reclaim_group(Path::new("/cg/be"), None, &lc));
        // LC allowed: the LC group too, but never the scope itself.
        let all = TargetRules {
            include_elastic: true,
            allow_lc: true,
        };
        assert!(all.may_reclaim_group(Path::new("/cg/node/svc"), Some(scope), &lc));
        assert!(!all.may_reclaim_group(scope, Some(scope), &lc));
    }
}
