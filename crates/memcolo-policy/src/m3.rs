//! The M3 node monitor (M3, EuroSys'21 §5 and §6), as a pure state machine.
//!
//! The monitor is configured with a *top* of memory (the bytes applications may use)
//! and two thresholds below it that partition usage into zones: green, yellow, red
//! and above top. Every poll the caller hands [`Monitor::step`] the node's used bytes
//! (its working set) and the registered processes; the monitor answers with
//! [`Action`]s for the caller to carry out. No clock is read: `now` is a
//! [`Duration`] since an arbitrary epoch, the same epoch as [`ProcView::started_at`].
//!
//! # Rules
//!
//! **R1 — zones** (M3 §5, Figure 4). A threshold is *passed* when usage is strictly
//! above it ("when it sees memory past a threshold, it sends a signal"):
//!
//! | zone | usage |
//! |---|---|
//! | green | `used <= low` |
//! | yellow | `low < used <= high` |
//! | red | `high < used <= top` |
//! | above top | `top < used` |
//!
//! With this choice every signal carries a positive target: Algorithm 1's
//! `target = used - high` (line 5) is `> 0` exactly in red and above, so its
//! `if target <= 0 return` (line 6) never fires in the red zone.
//!
//! **R2 — low signal** (M3 §3). In yellow or worse every notifiable process, of any
//! class, is signalled [`Level::Low`] with `target_bytes = used - low`, unless it gets
//! a higher level in the same poll (a process receives at most one signal per poll,
//! the highest that applies).
//!
//! **R3 — high signal, Algorithm 1** (M3 §5.1). In red, notifiable processes are
//! sorted by [`M3Config::sort_order`] and walked in order; each is signalled
//! [`Level::High`] and its expected reclamation ([`Monitor::expected_reclaim_bytes`])
//! added to `expected`, until `expected >= used - high`. A process whose expected
//! reclamation is 0 is still signalled when its turn comes (the loop stops only on
//! `expected >= target`, as in the paper). Each signalled process's `target_bytes`
//! is the overshoot still uncovered when it is picked: `(used - high) - expected`.
//!
//! **R3b — expected reclamation** (M3 §5.1). A process's expected reclamation is the
//! mean of its last [`M3Config::reclaim_history`] answers to [`Level::High`] and
//! [`Level::Top`] signals, else what it declared at registration. Answers to
//! [`Level::Low`] signals do not count: Algorithm 1 adds the figure up for high
//! signals, and a low signal asks for light-weight reclamation by design (§4.2: Spark
//! answers it with a young collection of the JVM, which may give back nothing).
//! Mixing them in made the expectation of such a process fall towards 0, so that
//! Algorithm 1 signalled every process in every red poll instead of enough of them.
//!
//! **R3c — equal-share floor** (memcolo's, off unless [`M3Config::fair_share`]). With
//! `n` notifiable processes, those whose RSS is below `top / n` go to the end of
//! Algorithm 1's walk (keeping the sort order within each group), so they are
//! signalled only when the others are not expected to cover the overshoot. With
//! `newest_first` a job that arrives last into a full node is otherwise the first one
//! signalled at every red poll, its allow-rate gate stays shut and it never grows
//! (bench/m3: the Go cache arriving 30 s into a full node ran 76 s against 35 s with a
//! static 1 GiB). The paper's order favours older jobs on purpose (§5.1: "favors
//! batch jobs"), so this is a policy choice, not a fix.
//!
//! **R4 — top** (M3 §5.1, last paragraph). Above top every notifiable process is
//! signalled [`Level::Top`] with `target_bytes = used - high` (the paper signals *all*
//! processes "in hopes of reclaiming all possible memory"; the target is the node's
//! whole red-zone overshoot).
//!
//! **R5 — kill** (M3 §5.1, last paragraph). A kill timer starts at the first poll
//! above top and resets at the first poll at or below top. Once the timer has run for
//! at least [`M3Config::kill_after`], Algorithm 1 runs again over the
//! [`Class::Be`] processes only (notifiable or not), in the same sort order, with each
//! process's RSS as its expected reclamation, until the RSS sum covers `used - top`;
//! each picked process gets an [`Action::Kill`] whose reason names the rule, the
//! usage, the top and how long usage has been above top. [`Class::Lc`] and
//! [`Class::Elastic`] processes are never killed. A killed process that still shows in
//! the next poll (it is still exiting) is not killed again, and its RSS still counts
//! as expected, so a new kill happens only when a poll shows that the processes
//! already killed are not enough. Killed processes get no `Top` signal.
//!
//! **R6 — adaptive thresholds** (M3 §5.2). A sliding window keeps the zone and usage of the
//! last [`M3Config::window_samples`] polls. With `a:b` = [`M3Config::ratio_target`]:
//! - low: `ratio_red = T_red : T_green_or_yellow` (red counts above top too). Low is
//!   lowered by one step only when this poll is above high *and* `ratio_red > a:b`
//!   *and* some poll of the window had usage at or below low (the floor below);
//!   raised by one step only when this poll is above low *and* `ratio_red < a:b`.
//! - Floor of the low threshold (memcolo's, not in the paper): lowering low makes
//!   low signals start earlier, i.e. at polls whose usage lay between the new and the
//!   old low. Once every poll of the window was above low, every one of them already
//!   sent low signals, so a further step changes no signal; it only leaves low far
//!   below usage once pressure is gone, to climb back one step per poll while every
//!   process gets a low signal at every poll. With §6's values (window 32, ratio
//!   1:32, a step of 2 % of top) the paper's rule alone lowers low by a step at every
//!   poll of a stay in red, 64 % of top in 32 polls. So low is
//!   lowered only while the window still holds a poll at or below it, which leaves
//!   it just under the lowest usage of the last `window_samples` polls.
//! - high: `ratio_top = T_above_top : T_below_top`, the same rule one level up:
//!   lowered only when above top and `ratio_top > a:b`; raised only when above high
//!   and `ratio_top < a:b`.
//! - A ratio equal to the target moves nothing; in green nothing moves (the paper's
//!   "M3 does not adjust thresholds when the system is operating in the green or
//!   yellow zone" applies to the high threshold, whose rules need red; the low
//!   threshold may rise in yellow, as §5.2's rule for it states).
//! - Each threshold moves at most one [`M3Config::step_bytes`] per poll, after the
//!   poll's actions were decided with the thresholds in force when it began.
//! - Invariant `step <= low`, `low + step <= high`, `high + step <= top` is kept by
//!   clamping every move: low never goes below one step, high never rises above
//!   `top - step`, and the two stay at least one step apart (a minimum yellow and red
//!   zone of one step, so both signals stay distinct). A move that the clamp would
//!   turn into a move in the wrong direction is skipped, so a configuration that
//!   starts tighter than this is never made tighter; `low <= high <= top` always holds
//!   ([`Monitor::set_top`] rescales thresholds and step together, rounding down, so a
//!   gap may end up a byte short of a step).
//!
//! **R7 — resignal suppression** (memcolo's refinement, not in the paper). A process
//! that has an unanswered signal of a level `>=` the new one, sent less than
//! [`M3Config::resignal_after`] ago, is not signalled again: it is still reclaiming.
//! In Algorithm 1 (R3) its expected reclamation still counts toward `expected`, since
//! that reclamation is in flight. [`Monitor::record_reclaim`] (the process answered)
//! clears the outstanding signal, so the next poll may signal it again.
//!
//! **R8 — one notification of a level per poll period** (memcolo's). Event-triggered
//! polls run between the ticks (a pressure event, a threshold crossed): each of them
//! would re-send the low signal that a process answered a moment ago, and an elastic
//! application that evicts, regrows and evicts again is flooded (1,109 low
//! notifications in 67 s were seen). A process is sent a level at most once per
//! [`M3Config::min_signal_interval`] (the agent's poll period), answered or not; in
//! Algorithm 1 it still counts as picked, as under R7.
//!
//! **R9 — low waits until the last answer has had time to act** (memcolo's). An answer
//! (a `reclaimed` report that clears an outstanding notification, R7) says the process
//! acted; whether that was enough shows only once its reclamation has taken effect. A
//! process's *epoch* is how long it takes to answer: the longest of its last
//! [`EPOCH_SAMPLES`] answer times (notification sent → answer received), clamped to
//! [`M3Config::min_signal_interval`, [`MAX_EPOCH`]]. After an answer at `t`, the
//! process is sent no [`Level::Low`] before `t + epoch`; the first poll from then on
//! sends it only if usage is still above low (that poll's zone decides, as always).
//! [`Level::High`] and [`Level::Top`] are not held back (R7 and R8 bound them; red and
//! above top need answers sooner). The longest rather than the mean answer time: a
//! process whose answers vary is given the time of its slowest recent one, erring
//! towards fewer notifications, and forgets a slow answer after [`EPOCH_SAMPLES`]
//! quicker ones. The lower bound makes "time to act" at least one poll period, so a
//! process that answers at once is asked again only after a poll has seen the
//! effect; the upper bound keeps a process that once took minutes from going
//! unasked for minutes. A report that answers nothing (no outstanding notification)
//! is not an answer here. Before its first answer a process is held back by R7 and
//! R8 only.
//!
//! **R10 — unmatched reclaim** (memcolo's; in [`crate::ledger`], which the caller
//! feeds with every notification, report and RSS observation). An elastic process
//! whose reported reclamation over the last minute (at least 64 MiB) is not matched
//! by falls of its RSS (at least a quarter of it) is flagged: its reports are not what
//! its memory shows. The monitor's decisions do not change; the caller reports it.
//!
//! Ties in every sort order are broken by ascending pid, so the output is a
//! deterministic function of the input.
//!
//! Cost: one poll sorts the processes once, `O(n log n)` for `n` processes, plus
//! `O(window_samples)` for the ratios; no allocation grows with time except the
//! per-pid reclamation history, which [`Monitor::forget`] drops.

use crate::error::PolicyError;
use crate::types::{Class, Level, Pid};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How many of a process's latest answer times its epoch is the longest of (R9).
pub const EPOCH_SAMPLES: usize = 4;

/// The longest epoch (R9): a process is asked again at the latest this long after its
/// last answer while usage stays above low (30 s).
pub const MAX_EPOCH: Duration = Duration::from_secs(30);

/// The order in which Algorithm 1 (M3 §5.1) walks the processes; the first ones are
/// signalled (or, above top for too long, killed) first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SortOrder {
    /// Newest to oldest by start time (favours long batch jobs; the paper's choice in
    /// its evaluation).
    #[default]
    NewestFirst,
    /// Oldest to newest by start time (favours interactive jobs).
    OldestFirst,
    /// Largest resident set (RSS) first.
    LargestRss,
    /// Largest expected reclamation first ([`Monitor::expected_reclaim_bytes`]).
    LargestExpectedReclaim,
}

impl SortOrder {
    /// The snake_case name used in configuration files and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            SortOrder::NewestFirst => "newest_first",
            SortOrder::OldestFirst => "oldest_first",
            SortOrder::LargestRss => "largest_rss",
            SortOrder::LargestExpectedReclaim => "largest_expected_reclaim",
        }
    }
}

impl fmt::Display for SortOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for SortOrder {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "newest_first" => Ok(SortOrder::NewestFirst),
            "oldest_first" => Ok(SortOrder::OldestFirst),
            "largest_rss" => Ok(SortOrder::LargestRss),
            "largest_expected_reclaim" => Ok(SortOrder::LargestExpectedReclaim),
            other => Err(format!(
                "unknown sort order `{other}` (expected newest_first, oldest_first, \
                 largest_rss or largest_expected_reclaim)"
            )),
        }
    }
}

/// Configuration of the M3 monitor (M3 §6 gives the paper's values).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct M3Config {
    /// The top of memory: bytes the applications may use (62 GB of 64 GB in §6).
    pub top_bytes: u64,
    /// Initial low threshold, bytes (50 GB in §6).
    pub low_bytes: u64,
    /// Initial high threshold, bytes (55 GB in §6).
    pub high_bytes: u64,
    /// Sliding window, in polls, over which time-in-red ratios are computed (32).
    pub window_samples: usize,
    /// Target `T_red : T_green_or_yellow` for the low threshold and
    /// `T_above_top : T_below_top` for the high one, as `(numerator, denominator)`;
    /// `(1, 32)` in §6.
    pub ratio_target: (u32, u32),
    /// How far a threshold moves per adaptation, bytes (2 % of top in §6). The
    /// adaptation keeps thresholds at least one step apart (rule R6), so a step of
    /// `top_bytes` or more keeps the thresholds static (the baseline of M3 §7.4).
    pub step_bytes: u64,
    /// Order of Algorithm 1.
    pub sort_order: SortOrder,
    /// Above top for this long: kill BE processes (R5). 30 s by default.
    pub kill_after: Duration,
    /// Expected reclamation of a process (bytes it frees itself when notified) = mean
    /// of its last this many `reclaimed` answers (5).
    pub reclaim_history: usize,
    /// A process with an unanswered signal of the same or a higher level younger than
    /// this is not signalled again (R7). 5 s by default.
    pub resignal_after: Duration,
    /// A process is sent one level at most once per this interval, answered or not
    /// (R8): the poll period, so that event-triggered polls between two ticks do not
    /// repeat a notification. 1 s by default (M3 §6 polls once a second).
    #[serde(default = "M3Config::default_min_signal_interval")]
    pub min_signal_interval: Duration,
    /// Rule R3c: Algorithm 1 walks the processes that hold at least an equal share of
    /// the top first, and those below it after them (each group in `sort_order`).
    /// Off by default (the paper's Algorithm 1).
    #[serde(default)]
    pub fair_share: bool,
}

/// `value * num / den` without overflow, rounded down (`den > 0`).
fn mul_div(value: u64, num: u64, den: u64) -> u64 {
    ((value as u128 * num as u128) / den as u128).min(u64::MAX as u128) as u64
}

impl M3Config {
    /// Default sliding window, polls (M3 §6).
    pub const DEFAULT_WINDOW_SAMPLES: usize = 32;
    /// Default ratio target (M3 §6).
    pub const DEFAULT_RATIO_TARGET: (u32, u32) = (1, 32);
    /// Default kill delay above top.
    pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(30);
    /// Default number of reclamation reports averaged (M3 §5.1: "the last five signals").
    pub const DEFAULT_RECLAIM_HISTORY: usize = 5;
    /// Default resignal suppression.
    pub const DEFAULT_RESIGNAL_AFTER: Duration = Duration::from_secs(5);
    /// Default poll period: M3 §6 polls memory once a second.
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
    /// Default shortest interval between two signals of one level to one process:
    /// the poll period (rule R8).
    pub const DEFAULT_MIN_SIGNAL_INTERVAL: Duration = Self::DEFAULT_POLL_INTERVAL;
    /// Default top of memory as a share of the node's memory, `(num, den)`: 62 of
    /// 64 GB (M3 §6).
    pub const DEFAULT_TOP_OF_MEMORY: (u64, u64) = (62, 64);
    /// Default initial low threshold as a share of the top, `(num, den)`: 50 of
    /// 62 GB (M3 §6).
    pub const DEFAULT_LOW_OF_TOP: (u64, u64) = (50, 62);
    /// Default initial high threshold as a share of the top, `(num, den)`: 55 of
    /// 62 GB (M3 §6).
    pub const DEFAULT_HIGH_OF_TOP: (u64, u64) = (55, 62);
    /// Default threshold step as a share of the top, `(num, den)`: 2 % (M3 §6).
    pub const DEFAULT_STEP_OF_TOP: (u64, u64) = (2, 100);

    fn default_min_signal_interval() -> Duration {
        Self::DEFAULT_MIN_SIGNAL_INTERVAL
    }

    /// The paper's configuration scaled to `top_bytes`: low = top × 50/62, high =
    /// top × 55/62 (the 50/55/62 GB of §6), step = 2 % of top (at least 1 byte), a
    /// window of 32 polls, ratio 1:32, newest first, kill after 30 s, expected
    /// reclamation over the last 5 reports, resignal after 5 s.
    pub fn with_top(top_bytes: u64) -> Self {
        M3Config {
            top_bytes,
            low_bytes: mul_div(
                top_bytes,
                Self::DEFAULT_LOW_OF_TOP.0,
                Self::DEFAULT_LOW_OF_TOP.1,
            ),
            high_bytes: mul_div(
                top_bytes,
                Self::DEFAULT_HIGH_OF_TOP.0,
                Self::DEFAULT_HIGH_OF_TOP.1,
            ),
            window_samples: Self::DEFAULT_WINDOW_SAMPLES,
            ratio_target: Self::DEFAULT_RATIO_TARGET,
            step_bytes: mul_div(
                top_bytes,
                Self::DEFAULT_STEP_OF_TOP.0,
                Self::DEFAULT_STEP_OF_TOP.1,
            )
            .max(1),
            sort_order: SortOrder::default(),
            kill_after: Self::DEFAULT_KILL_AFTER,
            reclaim_history: Self::DEFAULT_RECLAIM_HISTORY,
            resignal_after: Self::DEFAULT_RESIGNAL_AFTER,
            min_signal_interval: Self::DEFAULT_MIN_SIGNAL_INTERVAL,
            fair_share: false,
        }
    }

    /// Checks the configuration: `top_bytes > 0`, `low_bytes <= high_bytes <=
    /// top_bytes`, `step_bytes > 0`, `window_samples > 0`, a ratio target with a
    /// non-zero denominator, `reclaim_history > 0`.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |field: &'static str, value: String, reason: &'static str| {
            Err(PolicyError::InvalidConfig {
                field,
                value,
                reason,
            })
        };
        if self.top_bytes == 0 {
            return bad("top_bytes", "0".into(), "the top of memory must be > 0");
        }
        if self.high_bytes > self.top_bytes {
            return bad(
                "high_bytes",
                self.high_bytes.to_string(),
                "the high threshold must be <= top_bytes",
            );
        }
        if self.low_bytes > self.high_bytes {
            return bad(
                "low_bytes",
                self.low_bytes.to_string(),
                "the low threshold must be <= high_bytes",
            );
        }
        if self.step_bytes == 0 {
            return bad("step_bytes", "0".into(), "the threshold step must be > 0");
        }
        if self.window_samples == 0 {
            return bad(
                "window_samples",
                "0".into(),
                "the window must hold >= 1 poll",
            );
        }
        if self.ratio_target.1 == 0 {
            return bad(
                "ratio_target",
                format!("{}:{}", self.ratio_target.0, self.ratio_target.1),
                "the ratio's denominator must be > 0",
            );
        }
        if self.reclaim_history == 0 {
            return bad(
                "reclaim_history",
                "0".into(),
                "expected reclamation needs >= 1 report",
            );
        }
        Ok(())
    }
}

/// One registered process as the monitor sees it in a poll.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcView {
    /// Process id.
    pub pid: Pid,
    /// Registered class.
    pub class: Class,
    /// Start time, same epoch as the `now` given to [`Monitor::step`]; with `pid` it
    /// identifies the process across pid reuse.
    pub started_at: Duration,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Whether the process handles M3 signals (it registered a handler).
    pub notifiable: bool,
    /// Expected reclamation per signal declared at registration, bytes; used until
    /// the process has reported a reclamation.
    pub expected_reclaim_bytes: Option<u64>,
}

/// Where usage stands against the thresholds (rule R1 in the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Zone {
    /// `used <= low`.
    Green,
    /// `low < used <= high`.
    Yellow,
    /// `high < used <= top`.
    Red,
    /// `top < used`.
    AboveTop,
}

impl Zone {
    /// The snake_case name used in logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Zone::Green => "green",
            Zone::Yellow => "yellow",
            Zone::Red => "red",
            Zone::AboveTop => "above_top",
        }
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// The thresholds in force, bytes; `low_bytes <= high_bytes <= top_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Thresholds {
    /// Low threshold: above it, `Low` signals.
    pub low_bytes: u64,
    /// High threshold: above it, `High` signals (Algorithm 1).
    pub high_bytes: u64,
    /// Top of memory: above it, `Top` signals and, after a while, kills.
    pub top_bytes: u64,
}

impl Thresholds {
    /// The zone of `used_bytes` (rule R1).
    pub fn zone_of(&self, used_bytes: u64) -> Zone {
        if used_bytes > self.top_bytes {
            Zone::AboveTop
        } else if used_bytes > self.high_bytes {
            Zone::Red
        } else if used_bytes > self.low_bytes {
            Zone::Yellow
        } else {
            Zone::Green
        }
    }

    /// Checks `low <= high <= top` and `top > 0`.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.top_bytes == 0
            || self.high_bytes > self.top_bytes
            || self.low_bytes > self.high_bytes
        {
            return Err(PolicyError::InvalidThresholds {
                low_bytes: self.low_bytes,
                high_bytes: self.high_bytes,
                top_bytes: self.top_bytes,
            });
        }
        Ok(())
    }

    /// These thresholds rescaled in proportion to a new top (rounded down).
    fn rescaled(&self, top_bytes: u64) -> Thresholds {
        if self.top_bytes == 0 {
            return *self;
        }
        Thresholds {
            low_bytes: mul_div(self.low_bytes, top_bytes, self.top_bytes),
            high_bytes: mul_div(self.high_bytes, top_bytes, self.top_bytes),
            top_bytes,
        }
    }
}

/// What the caller must do after a poll.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send `pid` a memory-pressure signal of `level`, asking it to give back about
    /// `target_bytes` (rules R2–R4).
    Signal {
        pid: Pid,
        level: Level,
        target_bytes: u64,
    },
    /// Kill `pid` (a BE process; rule R5). `reason` names the rule and the figures.
    Kill { pid: Pid, reason: String },
}

impl Action {
    /// The process the action is for.
    pub fn pid(&self) -> Pid {
        match self {
            Action::Signal { pid, .. } | Action::Kill { pid, .. } => *pid,
        }
    }
}

/// What survives an agent restart: the adapted thresholds and each process's
/// reclamation reports (oldest first, bytes). The sliding window, the kill timer and
/// outstanding signals are not kept: after a restart they start afresh.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MonitorState {
    /// Thresholds in force when the state was taken; `None` keeps the configured ones.
    #[serde(default)]
    pub thresholds: Option<Thresholds>,
    /// Per-pid reclamation reports, oldest first, bytes.
    #[serde(default)]
    pub reclaim_history: BTreeMap<Pid, Vec<u64>>,
}

/// How the polls in the sliding window split (rule R6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowCounts {
    /// Polls in the window (at most [`M3Config::window_samples`]).
    pub samples: usize,
    /// Polls above the high threshold (red or above top): `T_red`.
    pub above_high: usize,
    /// Polls above the top: `T_above_top`.
    pub above_top: usize,
    /// Lowest usage of the polls in the window, bytes (0 for an empty window).
    #[serde(default)]
    pub min_used_bytes: u64,
}

/// A signal sent and not yet answered.
#[derive(Clone, Copy, Debug)]
struct Outstanding {
    level: Level,
    sent_at: Duration,
    started_at: Duration,
}

/// A process's answers (R9): when it last answered, and how long its latest answers
/// took, oldest first (at most [`EPOCH_SAMPLES`]).
#[derive(Clone, Debug)]
struct Answers {
    started_at: Duration,
    last_at: Duration,
    took: VecDeque<Duration>,
}

/// The M3 node monitor. See the module docs for the rules it applies.
#[derive(Clone, Debug)]
pub struct Monitor {
    cfg: M3Config,
    low_bytes: u64,
    high_bytes: u64,
    zone: Zone,
    /// Zone and usage (bytes) of each of the last `window_samples` polls, oldest first.
    window: VecDeque<(Zone, u64)>,
    /// When the current run above top began.
    above_top_since: Option<Duration>,
    outstanding: BTreeMap<Pid, Outstanding>,
    /// When each process was last sent each level (R8), with its start time.
    last_signal: BTreeMap<(Pid, Level), (Duration, Duration)>,
    /// Each process's answers (R9).
    answers: BTreeMap<Pid, Answers>,
    /// Processes already killed, by pid, with their start time.
    killed: BTreeMap<Pid, Duration>,
    /// Reclamation reports per pid, oldest first, at most `reclaim_history`.
    history: BTreeMap<Pid, VecDeque<u64>>,
}

impl Monitor {
    /// A monitor with `cfg`'s initial thresholds, in the green zone.
    ///
    /// # Panics
    /// If `cfg` fails [`M3Config::validate`]; use [`Monitor::try_new`] to get the
    /// error instead.
    pub fn new(cfg: M3Config) -> Self {
        match Self::try_new(cfg) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    /// A monitor with `cfg`'s initial thresholds, or why `cfg` is invalid.
    pub fn try_new(cfg: M3Config) -> Result<Self, PolicyError> {
        cfg.validate()?;
        Ok(Monitor {
            low_bytes: cfg.low_bytes,
            high_bytes: cfg.high_bytes,
            zone: Zone::Green,
            window: VecDeque::new(),
            above_top_since: None,
            outstanding: BTreeMap::new(),
            last_signal: BTreeMap::new(),
            answers: BTreeMap::new(),
            killed: BTreeMap::new(),
            history: BTreeMap::new(),
            cfg,
        })
    }

    /// The configuration; after [`Monitor::set_top`], with the rescaled top, initial
    /// thresholds and step.
    pub fn config(&self) -> &M3Config {
        &self.cfg
    }

    /// The thresholds in force for the next poll.
    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            low_bytes: self.low_bytes,
            high_bytes: self.high_bytes,
            top_bytes: self.cfg.top_bytes,
        }
    }

    /// The zone of the last poll ([`Zone::Green`] before the first).
    pub fn zone(&self) -> Zone {
        self.zone
    }

    /// How the polls of the sliding window split between zones.
    pub fn window_counts(&self) -> WindowCounts {
        WindowCounts {
            samples: self.window.len(),
            above_high: self.window.iter().filter(|(z, _)| *z >= Zone::Red).count(),
            above_top: self
                .window
                .iter()
                .filter(|(z, _)| *z == Zone::AboveTop)
                .count(),
            min_used_bytes: self.window.iter().map(|(_, u)| *u).min().unwrap_or(0),
        }
    }

    /// How long usage has been above top at `now` (`None` if the last poll was not).
    pub fn above_top_for(&self, now: Duration) -> Option<Duration> {
        self.above_top_since.map(|since| now.saturating_sub(since))
    }

    /// Expected reclamation of `p`, bytes: the mean of its last
    /// [`M3Config::reclaim_history`] reports (M3 §5.1), else the value it declared at
    /// registration, else 0.
    pub fn expected_reclaim_bytes(&self, p: &ProcView) -> u64 {
        match self.history.get(&p.pid) {
            Some(reports) if !reports.is_empty() => {
                let sum: u128 = reports.iter().map(|b| *b as u128).sum();
                (sum / reports.len() as u128) as u64
            }
            _ => p.expected_reclaim_bytes.unwrap_or(0),
        }
    }

    /// One poll at `now`: `used_bytes` is the node's working set, `procs` the
    /// registered processes (a pid listed twice counts once, the first entry wins).
    /// Returns the actions to carry out now: kills first, in Algorithm 1 order, then
    /// signals, high/top ones in Algorithm 1 order and low ones after them. Then adapts
    /// the thresholds for the next poll (rule R6).
    pub fn step(&mut self, now: Duration, used_bytes: u64, procs: &[ProcView]) -> Vec<Action> {
        let th = self.thresholds();
        let zone = th.zone_of(used_bytes);
        self.zone = zone;

        // Forget outstanding signals and kills of processes that are gone or whose pid
        // now names another process.
        let mut present: BTreeMap<Pid, Duration> = BTreeMap::new();
        for p in procs {
            present.entry(p.pid).or_insert(p.started_at);
        }
        self.outstanding
            .retain(|pid, o| present.get(pid) == Some(&o.started_at));
        self.last_signal
            .retain(|(pid, _), (_, started)| present.get(pid) == Some(started));
        self.answers
            .retain(|pid, a| present.get(pid) == Some(&a.started_at));
        self.killed
            .retain(|pid, started| present.get(pid) == Some(started));

        if zone == Zone::AboveTop {
            self.above_top_since.get_or_insert(now);
        } else {
            self.above_top_since = None;
        }

        let sorted = self.sorted(procs);
        let mut actions = Vec::new();
        match zone {
            Zone::Green => {}
            Zone::Yellow => {
                let target = used_bytes - th.low_bytes;
                self.signal_all(
                    now,
                    &sorted,
                    Level::Low,
                    target,
                    &BTreeSet::new(),
                    &mut actions,
                );
            }
            Zone::Red => {
                let high_target = used_bytes - th.high_bytes;
                let chosen = self.algorithm1_signal(now, &sorted, high_target, &mut actions);
                let low_target = used_bytes - th.low_bytes;
                self.signal_all(now, &sorted, Level::Low, low_target, &chosen, &mut actions);
            }
            Zone::AboveTop => {
                let killed = self.kill_round(now, used_bytes, &sorted, &mut actions);
                let target = used_bytes - th.high_bytes;
                self.signal_all(now, &sorted, Level::Top, target, &killed, &mut actions);
            }
        }

        self.window.push_back((zone, used_bytes));
        while self.window.len() > self.cfg.window_samples {
            self.window.pop_front();
        }
        self.adapt(zone);
        actions
    }

    /// A process answered a signal of `level`: it gave back `bytes` at `now`. The
    /// answer clears its outstanding signal (rule R7), unless that signal was sent
    /// after `now` (a report cannot answer a later signal). Only answers to
    /// [`Level::High`] and [`Level::Top`] feed its expected reclamation (rule R3b):
    /// Algorithm 1 adds that figure up for high signals, and a low signal asks for
    /// light-weight reclamation by design (M3 §4.2: a JVM answers it with a collection
    /// that may give back nothing). `level` `None` (an answer that names no
    /// notification) takes the level of the outstanding signal, and feeds the
    /// expectation when none is outstanding. An answer to the outstanding signal
    /// measures the process's epoch and holds its next low signal back (rule R9).
    pub fn record_reclaim(&mut self, pid: Pid, level: Option<Level>, bytes: u64, now: Duration) {
        let answered = self
            .outstanding
            .get(&pid)
            .filter(|o| o.sent_at <= now)
            .copied();
        if let Some(o) = answered {
            let a = self.answers.entry(pid).or_insert(Answers {
                started_at: o.started_at,
                last_at: now,
                took: VecDeque::new(),
            });
            if a.started_at != o.started_at {
                a.took.clear();
                a.started_at = o.started_at;
            }
            a.last_at = now;
            a.took.push_back(now - o.sent_at);
            while a.took.len() > EPOCH_SAMPLES {
                a.took.pop_front();
            }
        }
        let level = level.or(answered.map(|o| o.level));
        if level != Some(Level::Low) {
            let reports = self.history.entry(pid).or_default();
            reports.push_back(bytes);
            while reports.len() > self.cfg.reclaim_history {
                reports.pop_front();
            }
        }
        if answered.is_some() {
            self.outstanding.remove(&pid);
        }
    }

    /// The process is gone: drop its reclamation history, outstanding signal and kill
    /// record.
    pub fn forget(&mut self, pid: Pid) {
        self.history.remove(&pid);
        self.outstanding.remove(&pid);
        self.last_signal.retain(|(p, _), _| *p != pid);
        self.answers.remove(&pid);
        self.killed.remove(&pid);
    }

    /// `pid`'s epoch (rule R9): the longest of its last [`EPOCH_SAMPLES`] answer
    /// times, clamped to [`M3Config::min_signal_interval`, [`MAX_EPOCH`]]; `None`
    /// before its first answer.
    pub fn epoch(&self, pid: Pid) -> Option<Duration> {
        let a = self.answers.get(&pid)?;
        let longest = a.took.iter().max().copied().unwrap_or_default();
        let floor = self.cfg.min_signal_interval;
        Some(longest.max(floor).min(MAX_EPOCH.max(floor)))
    }

    /// The scope's memory changed: the top becomes `top_bytes`, and the current
    /// thresholds, the configured initial ones and the step are rescaled in the same
    /// proportion (rounded down; the step stays >= 1 byte). A top of 0 is refused and
    /// leaves the monitor unchanged ([`Monitor::try_set_top`] reports it).
    pub fn set_top(&mut self, top_bytes: u64) {
        let _ = self.try_set_top(top_bytes);
    }

    /// [`Monitor::set_top`], reporting a refused top of 0.
    pub fn try_set_top(&mut self, top_bytes: u64) -> Result<(), PolicyError> {
        if top_bytes == 0 {
            return Err(PolicyError::InvalidConfig {
                field: "top_bytes",
                value: "0".into(),
                reason: "the top of memory must be > 0",
            });
        }
        let old_top = self.cfg.top_bytes;
        if old_top == top_bytes {
            return Ok(());
        }
        let current = self.thresholds().rescaled(top_bytes);
        let initial = Thresholds {
            low_bytes: self.cfg.low_bytes,
            high_bytes: self.cfg.high_bytes,
            top_bytes: old_top,
        }
        .rescaled(top_bytes);
        self.cfg.step_bytes = mul_div(self.cfg.step_bytes, top_bytes, old_top).max(1);
        self.cfg.top_bytes = top_bytes;
        self.cfg.low_bytes = initial.low_bytes;
        self.cfg.high_bytes = initial.high_bytes;
        self.low_bytes = current.low_bytes;
        self.high_bytes = current.high_bytes;
        Ok(())
    }

    /// What must survive a restart: thresholds and reclamation reports.
    pub fn state(&self) -> MonitorState {
        MonitorState {
            thresholds: Some(self.thresholds()),
            reclaim_history: self
                .history
                .iter()
                .map(|(pid, r)| (*pid, r.iter().copied().collect()))
                .collect(),
        }
    }

    /// Restores a saved [`MonitorState`]. Thresholds saved for another top are
    /// rescaled to the configured top; invalid thresholds are ignored (the current
    /// ones stay; [`Monitor::try_restore`] reports them). Each history keeps its last
    /// [`M3Config::reclaim_history`] reports.
    pub fn restore(&mut self, state: MonitorState) {
        let _ = self.try_restore(state);
    }

    /// [`Monitor::restore`], reporting invalid thresholds (the reclamation history is
    /// restored either way).
    pub fn try_restore(&mut self, state: MonitorState) -> Result<(), PolicyError> {
        self.history = state
            .reclaim_history
            .into_iter()
            .filter(|(_, r)| !r.is_empty())
            .map(|(pid, r)| {
                let skip = r.len().saturating_sub(self.cfg.reclaim_history);
                (pid, r.into_iter().skip(skip).collect())
            })
            .collect();
        if let Some(t) = state.thresholds {
            t.validate()?;
            let t = t.rescaled(self.cfg.top_bytes);
            self.low_bytes = t.low_bytes;
            self.high_bytes = t.high_bytes;
        }
        Ok(())
    }

    /// `procs` deduplicated by pid and sorted by the configured order (ties: pid).
    fn sorted<'a>(&self, procs: &'a [ProcView]) -> Vec<&'a ProcView> {
        let mut seen = BTreeSet::new();
        let mut v: Vec<(u64, &ProcView)> = procs
            .iter()
            .filter(|p| seen.insert(p.pid))
            .map(|p| (self.expected_reclaim_bytes(p), p))
            .collect();
        match self.cfg.sort_order {
            SortOrder::NewestFirst => v.sort_by(|a, b| {
                b.1.started_at
                    .cmp(&a.1.started_at)
                    .then(a.1.pid.cmp(&b.1.pid))
            }),
            SortOrder::OldestFirst => v.sort_by(|a, b| {
                a.1.started_at
                    .cmp(&b.1.started_at)
                    .then(a.1.pid.cmp(&b.1.pid))
            }),
            SortOrder::LargestRss => v.sort_by(|a, b| {
                b.1.rss_bytes
                    .cmp(&a.1.rss_bytes)
                    .then(a.1.pid.cmp(&b.1.pid))
            }),
            SortOrder::LargestExpectedReclaim => {
                v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.pid.cmp(&b.1.pid)))
            }
        }
        v.into_iter().map(|(_, p)| p).collect()
    }

    /// Whether a new `level` signal to `p` is suppressed: by an outstanding one (R7),
    /// by one of the same level sent less than `min_signal_interval` ago (R8), or,
    /// for a low one, by an answer less than one epoch old (R9).
    fn suppressed(&self, p: &ProcView, level: Level, now: Duration) -> bool {
        if level == Level::Low {
            if let (Some(a), Some(epoch)) = (self.answers.get(&p.pid), self.epoch(p.pid)) {
                if a.started_at == p.started_at && now < a.last_at + epoch {
                    return true;
                }
            }
        }
        if let Some((sent_at, started_at)) = self.last_signal.get(&(p.pid, level)) {
            if *started_at == p.started_at
                && now.saturating_sub(*sent_at) < self.cfg.min_signal_interval
            {
                return true;
            }
        }
        match self.outstanding.get(&p.pid) {
            Some(o) => {
                o.started_at == p.started_at
                    && o.level >= level
                    && now.saturating_sub(o.sent_at) < self.cfg.resignal_after
            }
            None => false,
        }
    }

    /// Emits a signal unless suppressed; records it as outstanding.
    fn signal(
        &mut self,
        now: Duration,
        p: &ProcView,
        level: Level,
        target_bytes: u64,
        actions: &mut Vec<Action>,
    ) {
        if self.suppressed(p, level, now) {
            return;
        }
        self.outstanding.insert(
            p.pid,
            Outstanding {
                level,
                sent_at: now,
                started_at: p.started_at,
            },
        );
        self.last_signal.insert((p.pid, level), (now, p.started_at));
        actions.push(Action::Signal {
            pid: p.pid,
            level,
            target_bytes,
        });
    }

    /// Signals `level` to every notifiable process not in `except` (R2, R4).
    fn signal_all(
        &mut self,
        now: Duration,
        sorted: &[&ProcView],
        level: Level,
        target_bytes: u64,
        except: &BTreeSet<Pid>,
        actions: &mut Vec<Action>,
    ) {
        for p in sorted {
            if p.notifiable && !except.contains(&p.pid) {
                self.signal(now, p, level, target_bytes, actions);
            }
        }
    }

    /// Algorithm 1 (M3 §5.1) for the high signal; returns the pids it picked (signalled
    /// now, or left alone because a signal to them is still outstanding).
    fn algorithm1_signal(
        &mut self,
        now: Duration,
        sorted: &[&ProcView],
        target_bytes: u64,
        actions: &mut Vec<Action>,
    ) -> BTreeSet<Pid> {
        let mut order: Vec<&ProcView> = sorted.iter().copied().filter(|p| p.notifiable).collect();
        if self.cfg.fair_share && !order.is_empty() {
            // R3c: a stable partition, sort order kept within each group.
            let share = self.cfg.top_bytes / order.len() as u64;
            order.sort_by_key(|p| p.rss_bytes < share);
        }
        let mut picked = BTreeSet::new();
        let mut expected: u64 = 0;
        for p in order {
            if expected >= target_bytes {
                break;
            }
            self.signal(now, p, Level::High, target_bytes - expected, actions);
            picked.insert(p.pid);
            expected = expected.saturating_add(self.expected_reclaim_bytes(p));
        }
        picked
    }

    /// Rule R5: once above top for `kill_after`, Algorithm 1 over BE processes with
    /// RSS as expected reclamation. Returns the pids killed, now or in an earlier poll.
    fn kill_round(
        &mut self,
        now: Duration,
        used_bytes: u64,
        sorted: &[&ProcView],
        actions: &mut Vec<Action>,
    ) -> BTreeSet<Pid> {
        let mut killed: BTreeSet<Pid> = self.killed.keys().copied().collect();
        let Some(above_for) = self.above_top_for(now) else {
            return killed;
        };
        if above_for < self.cfg.kill_after {
            return killed;
        }
        let top = self.cfg.top_bytes;
        let target = used_bytes - top;
        let mut expected: u64 = 0;
        for p in sorted.iter().filter(|p| p.class == Class::Be) {
            if expected >= target {
                break;
            }
            if !self.killed.contains_key(&p.pid) {
                let reason = format!(
                    "m3 kill rule (M3 §5.1): used_bytes={used_bytes} above top_bytes={top} \
                     for {:.1} s (kill_after {:.1} s); best-effort process picked by \
                     Algorithm 1 ({}) with rss_bytes={} toward an overshoot of {} bytes \
                     ({} bytes already covered)",
                    above_for.as_secs_f64(),
                    self.cfg.kill_after.as_secs_f64(),
                    self.cfg.sort_order,
                    p.rss_bytes,
                    target,
                    expected,
                );
                actions.push(Action::Kill { pid: p.pid, reason });
                self.killed.insert(p.pid, p.started_at);
                self.outstanding.remove(&p.pid);
                killed.insert(p.pid);
            }
            expected = expected.saturating_add(p.rss_bytes);
        }
        killed
    }

    /// Rule R6: moves each threshold at most one step, by the window's ratios.
    fn adapt(&mut self, zone: Zone) {
        let counts = self.window_counts();
        let (num, den) = self.cfg.ratio_target;
        let step = self.cfg.step_bytes;
        let top = self.cfg.top_bytes;

        let red = counts.above_high as u64;
        let not_red = (counts.samples - counts.above_high) as u64;
        let red_cmp = compare_ratio(red, not_red, num as u64, den as u64);
        if zone >= Zone::Red
            && red_cmp == std::cmp::Ordering::Greater
            && counts.min_used_bytes <= self.low_bytes
        {
            let new_low = self.low_bytes.saturating_sub(step).max(step);
            if new_low < self.low_bytes {
                self.low_bytes = new_low;
            }
        } else if zone >= Zone::Yellow && red_cmp == std::cmp::Ordering::Less {
            let new_low = self
                .low_bytes
                .saturating_add(step)
                .min(self.high_bytes.saturating_sub(step));
            if new_low > self.low_bytes {
                self.low_bytes = new_low;
            }
        }

        let above = counts.above_top as u64;
        let below = (counts.samples - counts.above_top) as u64;
        let top_cmp = compare_ratio(above, below, num as u64, den as u64);
        if zone == Zone::AboveTop && top_cmp == std::cmp::Ordering::Greater {
            let new_high = self
                .high_bytes
                .saturating_sub(step)
                .max(self.low_bytes.saturating_add(step));
            if new_high < self.high_bytes {
                self.high_bytes = new_high;
            }
        } else if zone >= Zone::Red && top_cmp == std::cmp::Ordering::Less {
            let new_high = self
                .high_bytes
                .saturating_add(step)
                .min(top.saturating_sub(step));
            if new_high > self.high_bytes {
                self.high_bytes = new_high;
            }
        }
    }
}

/// Compares the ratio `a : b` with `num : den` (`den > 0`); `a : 0` with `a > 0` is
/// infinite.
fn compare_ratio(a: u64, b: u64, num: u64, den: u64) -> std::cmp::Ordering {
    (a as u128 * den as u128).cmp(&(num as u128 * b as u128))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn proc_(
        pid: Pid,
        class: Class,
        started_s: u64,
        rss_bytes: u64,
        notifiable: bool,
        expected: Option<u64>,
    ) -> ProcView {
        ProcView {
            pid,
            class,
            started_at: secs(started_s),
            rss_bytes,
            notifiable,
            expected_reclaim_bytes: expected,
        }
    }

    /// top 1000, low 800, high 900, step 20, window 32, ratio 1:32.
    fn small_cfg() -> M3Config {
        M3Config {
            top_bytes: 1000,
            low_bytes: 800,
            high_bytes: 900,
            step_bytes: 20,
            ..M3Config::with_top(1000)
        }
    }

    /// [`small_cfg`] with static thresholds (a step of `top`, see
    /// [`M3Config::step_bytes`]), for tests of the signals alone.
    fn static_cfg() -> M3Config {
        M3Config {
            step_bytes: 1000,
            ..small_cfg()
        }
    }

    fn high(pid: Pid, target_bytes: u64) -> Action {
        Action::Signal {
            pid,
            level: Level::High,
            target_bytes,
        }
    }

    fn low(pid: Pid, target_bytes: u64) -> Action {
        Action::Signal {
            pid,
            level: Level::Low,
            target_bytes,
        }
    }

    fn top(pid: Pid, target_bytes: u64) -> Action {
        Action::Signal {
            pid,
            level: Level::Top,
            target_bytes,
        }
    }

    fn kills(actions: &[Action]) -> Vec<Pid> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Kill { pid, .. } => Some(*pid),
                _ => None,
            })
            .collect()
    }

    /// The handmade table of the Algorithm 1 tests.
    ///
    /// | pid | class   | started | rss | notifiable | expected |
    /// |-----|---------|---------|-----|------------|----------|
    /// | 1   | elastic | 10 s    | 300 | yes        | 40       |
    /// | 2   | elastic | 30 s    | 100 | yes        | 70       |
    /// | 3   | lc      | 20 s    | 350 | yes        | 0        |
    /// | 4   | be      | 40 s    | 50  | yes        | none (0) |
    /// | 5   | be      | 5 s     | 400 | no         | 30       |
    fn table() -> Vec<ProcView> {
        vec![
            proc_(1, Class::Elastic, 10, 300, true, Some(40)),
            proc_(2, Class::Elastic, 30, 100, true, Some(70)),
            proc_(3, Class::Lc, 20, 350, true, Some(0)),
            proc_(4, Class::Be, 40, 50, true, None),
            proc_(5, Class::Be, 5, 400, false, Some(30)),
        ]
    }

    /// used 960: red; Algorithm 1 target = 960 - 900 = 60; low target = 960 - 800 = 160.
    fn run_order(order: SortOrder) -> Vec<Action> {
        let mut m = Monitor::new(M3Config {
            sort_order: order,
            ..small_cfg()
        });
        let actions = m.step(secs(100), 960, &table());
        assert_eq!(m.zone(), Zone::Red);
        actions
    }

    #[test]
    fn algorithm1_newest_first() {
        // Order 4 (40 s), 2 (30 s), 3 (20 s), 1 (10 s); 5 is not notifiable.
        // 4: expected 0 < 60, signal with 60 left, expected += 0 -> 0
        // 2: 0 < 60, signal with 60 left, expected += 70 -> 70 >= 60: stop.
        // 3 and 1 get Low (target 160), in sort order.
        assert_eq!(
            run_order(SortOrder::NewestFirst),
            vec![high(4, 60), high(2, 60), low(3, 160), low(1, 160)]
        );
    }

    #[test]
    fn algorithm1_oldest_first() {
        // Order 1 (10 s), 3 (20 s), 2 (30 s), 4 (40 s).
        // 1: 60 left, expected -> 40; 3: 20 left, expected stays 40 (3 expects 0 but is
        // still signalled); 2: 20 left, expected -> 110 >= 60: stop. 4 gets Low.
        assert_eq!(
            run_order(SortOrder::OldestFirst),
            vec![high(1, 60), high(3, 20), high(2, 20), low(4, 160)]
        );
    }

    #[test]
    fn algorithm1_largest_rss() {
        // Order by RSS among all: 5 (400, not notifiable), 3 (350), 1 (300), 2 (100), 4 (50).
        // 3: 60 left, expected 0; 1: 60 left, expected 40; 2: 20 left, expected 110: stop.
        assert_eq!(
            run_order(SortOrder::LargestRss),
            vec![high(3, 60), high(1, 60), high(2, 20), low(4, 160)]
        );
    }

    #[test]
    fn algorithm1_largest_expected_reclaim() {
        // Order 2 (70), 1 (40), 5 (30, not notifiable), 3 (0), 4 (0; tie -> pid order).
        // 2: 60 left, expected 70 >= 60: stop. Others get Low in that order.
        assert_eq!(
            run_order(SortOrder::LargestExpectedReclaim),
            vec![high(2, 60), low(1, 160), low(3, 160), low(4, 160)]
        );
    }

    #[test]
    fn expected_reclaim_is_mean_of_last_reports() {
        let mut m = Monitor::new(M3Config {
            reclaim_history: 3,
            ..small_cfg()
        });
        let p = proc_(7, Class::Elastic, 0, 500, true, Some(99));
        // No report yet: the registration value.
        assert_eq!(m.expected_reclaim_bytes(&p), 99);
        let q = ProcView {
            expected_reclaim_bytes: None,
            ..p.clone()
        };
        m.forget(7);
        assert_eq!(m.expected_reclaim_bytes(&q), 0);
        // Reports 10, 20, 30, 40 with a history of 3: mean of 20, 30, 40 = 30.
        for b in [10, 20, 30, 40] {
            m.record_reclaim(7, None, b, secs(1));
        }
        assert_eq!(m.expected_reclaim_bytes(&p), 30);
        m.forget(7);
        assert_eq!(m.expected_reclaim_bytes(&p), 99);
    }

    #[test]
    fn reported_reclamation_reorders_algorithm1() {
        // Largest expected reclaim: after pid 3 reports 200 and 100 (mean 150), it is
        // first and covers the 60-byte overshoot alone.
        let mut m = Monitor::new(M3Config {
            sort_order: SortOrder::LargestExpectedReclaim,
            ..small_cfg()
        });
        m.record_reclaim(3, None, 200, secs(1));
        m.record_reclaim(3, None, 100, secs(2));
        let actions = m.step(secs(100), 960, &table());
        assert_eq!(actions[0], high(3, 60));
        assert_eq!(
            actions
                .iter()
                .filter(|a| matches!(
                    a,
                    Action::Signal {
                        level: Level::High,
                        ..
                    }
                ))
                .count(),
            1
        );
    }

    #[test]
    fn zone_boundaries() {
        let th = Thresholds {
            low_bytes: 800,
            high_bytes: 900,
            top_bytes: 1000,
        };
        assert_eq!(th.zone_of(0), Zone::Green);
        assert_eq!(th.zone_of(800), Zone::Green);
        assert_eq!(th.zone_of(801), Zone::Yellow);
        assert_eq!(th.zone_of(900), Zone::Yellow);
        assert_eq!(th.zone_of(901), Zone::Red);
        assert_eq!(th.zone_of(1000), Zone::Red);
        assert_eq!(th.zone_of(1001), Zone::AboveTop);
        assert_eq!(Zone::AboveTop.as_str(), "above_top");
    }

    #[test]
    fn yellow_signals_low_to_every_notifiable_process() {
        let mut m = Monitor::new(small_cfg());
        assert!(m.step(secs(100), 800, &table()).is_empty());
        assert_eq!(m.zone(), Zone::Green);
        // used 850: target 850 - 800 = 50 for everyone notifiable, newest first.
        let actions = m.step(secs(200), 850, &table());
        assert_eq!(m.zone(), Zone::Yellow);
        assert_eq!(
            actions,
            vec![low(4, 50), low(2, 50), low(3, 50), low(1, 50)]
        );
    }

    #[test]
    fn with_top_uses_the_papers_proportions() {
        const GB: u64 = 1_000_000_000;
        let cfg = M3Config::with_top(62 * GB);
        assert_eq!(cfg.low_bytes, 50 * GB);
        assert_eq!(cfg.high_bytes, 55 * GB);
        assert_eq!(cfg.step_bytes, 1_240_000_000);
        assert_eq!(cfg.window_samples, 32);
        assert_eq!(cfg.ratio_target, (1, 32));
        assert_eq!(cfg.reclaim_history, 5);
        assert_eq!(cfg.sort_order, SortOrder::NewestFirst);
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn invalid_configs_are_refused_with_the_field() {
        let field_of = |cfg: M3Config| match Monitor::try_new(cfg) {
            Err(PolicyError::InvalidConfig { field, .. }) => field,
            other => panic!("expected InvalidConfig, got {other:?}"),
        };
        assert_eq!(field_of(M3Config::with_top(0)), "top_bytes");
        assert_eq!(
            field_of(M3Config {
                low_bytes: 950,
                ..small_cfg()
            }),
            "low_bytes"
        );
        assert_eq!(
            field_of(M3Config {
                high_bytes: 1001,
                ..small_cfg()
            }),
            "high_bytes"
        );
        assert_eq!(
            field_of(M3Config {
                step_bytes: 0,
                ..small_cfg()
            }),
            "step_bytes"
        );
        assert_eq!(
            field_of(M3Config {
                window_samples: 0,
                ..small_cfg()
            }),
            "window_samples"
        );
        assert_eq!(
            field_of(M3Config {
                ratio_target: (1, 0),
                ..small_cfg()
            }),
            "ratio_target"
        );
        assert_eq!(
            field_of(M3Config {
                reclaim_history: 0,
                ..small_cfg()
            }),
            "reclaim_history"
        );
        let msg = Monitor::try_new(M3Config::with_top(0))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("top_bytes"), "{msg}");
    }

    #[test]
    #[should_panic(expected = "low_bytes")]
    fn new_panics_on_invalid_config() {
        Monitor::new(M3Config {
            low_bytes: 950,
            ..small_cfg()
        });
    }

    fn th(m: &Monitor) -> (u64, u64) {
        let t = m.thresholds();
        (t.low_bytes, t.high_bytes)
    }

    #[test]
    fn threshold_adaptation_sequence() {
        // top 1000, low 800, high 900, step 20, window of 4 polls, target ratio 1:3.
        let mut m = Monitor::new(M3Config {
            window_samples: 4,
            ratio_target: (1, 3),
            ..small_cfg()
        });
        let mut poll = |t: u64, used: u64| {
            m.step(secs(t), used, &[]);
            (m.zone(), th(&m))
        };
        // 700 green: window [G]; nothing adapts in green.
        assert_eq!(poll(1, 700), (Zone::Green, (800, 900)));
        // 830 yellow: [G Y]; red 0:2 < 1:3 and above low -> low +20.
        assert_eq!(poll(2, 830), (Zone::Yellow, (820, 900)));
        // 830 yellow (> 820): [G Y Y]; 0:3 < 1:3 -> low 840. High needs red: no move.
        assert_eq!(poll(3, 830), (Zone::Yellow, (840, 900)));
        // 950 red: [G Y Y R]; red 1:3 == target -> low stays; above top 0:4 < 1:3 and
        // above high -> high +20.
        assert_eq!(poll(4, 950), (Zone::Red, (840, 920)));
        // 950 red (> 920): [Y Y R R]; red 2:2 > 1:3, above high and the window's
        // lowest usage 830 <= 840 -> low -20; above top 0:4 < 1:3 -> high 940.
        assert_eq!(poll(5, 950), (Zone::Red, (820, 940)));
        // 1100 above top: [Y R R A]; red 3:1 > but every poll of the window was above
        // low 820 (lowest 830): the floor keeps low; top 1:3 == target -> high stays.
        assert_eq!(poll(6, 1100), (Zone::AboveTop, (820, 940)));
        // 1100 above top: [R R A A]; low floored again (lowest 950); top 2:2 > 1:3
        // and above top -> high 920.
        assert_eq!(poll(7, 1100), (Zone::AboveTop, (820, 920)));
        // 700 green: [R A A G]; nothing moves in green.
        assert_eq!(poll(8, 700), (Zone::Green, (820, 920)));
        // 930 red: [A A G R]; red 3:1 > and 700 <= 820 -> low 800; top 2:2 > but not
        // above top, and not < target: high stays.
        assert_eq!(poll(9, 930), (Zone::Red, (800, 920)));
        // 810 yellow (> 800): [A G R Y]; red 2:2 > target but only yellow: low stays.
        assert_eq!(poll(10, 810), (Zone::Yellow, (800, 920)));
    }

    #[test]
    fn low_threshold_stops_falling_once_usage_stays_above_it() {
        // top 1000, low 800, high 900, step 20, window of 8 polls. One green poll at
        // 700, then usage stays in red at 999 (high rises to top - step = 980 and
        // stops, so 999 stays red).
        let mut m = Monitor::new(M3Config {
            window_samples: 8,
            ..small_cfg()
        });
        m.step(secs(0), 700, &[]);
        let mut lows = vec![];
        for t in 1..=12 {
            m.step(secs(t), 999, &[]);
            lows.push(m.thresholds().low_bytes);
        }
        // Low falls a step per red poll while the window still holds the poll at 700
        // (700 <= low), the last step taking it to 680, just under it; then every poll
        // of the window is above low and it stays. The paper's rule alone went on to
        // 800 - 12 x 20 = 560, and on to one step with a longer stay in red.
        assert_eq!(
            lows,
            vec![780, 760, 740, 720, 700, 680, 680, 680, 680, 680, 680, 680]
        );
        assert_eq!(m.thresholds().high_bytes, 980);
        assert_eq!(m.window_counts().min_used_bytes, 999);
        // Pressure gone: 600 is green. With the paper's rule alone (low 560) it would
        // be yellow, and every process would get a low signal at every poll.
        m.step(secs(13), 600, &[]);
        assert_eq!(m.zone(), Zone::Green);
    }

    #[test]
    fn adaptation_is_clamped_to_keep_zones_apart() {
        // low 860, high 900, step 20: raising low stops at high - step = 880.
        let mut m = Monitor::new(M3Config {
            low_bytes: 860,
            ..small_cfg()
        });
        m.step(secs(1), 890, &[]);
        assert_eq!(th(&m), (880, 900));
        m.step(secs(2), 890, &[]);
        assert_eq!(th(&m), (880, 900));
        // In red with no time above top, high rises to top - step = 980 and stops.
        // Low stays: every poll of the window was above it (R6's floor).
        for t in 3..20 {
            m.step(secs(t), 999, &[]);
        }
        assert_eq!(m.thresholds().high_bytes, 980);
        assert_eq!(m.thresholds().low_bytes, 880);
        let mut m = Monitor::new(M3Config {
            low_bytes: 30,
            high_bytes: 100,
            ..small_cfg()
        });
        // One green poll at 10, then far above top.
        m.step(secs(0), 10, &[]);
        for t in 1..10 {
            m.step(secs(t), 5000, &[]);
        }
        // Above top: low floored at 20, high lowered to low + step = 40.
        assert_eq!(th(&m), (20, 40));
    }

    #[test]
    fn kill_only_be_after_kill_after_in_algorithm1_order() {
        // Static thresholds low 800, high 900, top 1000; kill after 30 s; newest first.
        // used 1200: overshoot above top 200; Top target 1200 - 900 = 300.
        let mut m = Monitor::new(static_cfg());
        let procs = vec![
            proc_(10, Class::Lc, 50, 500, true, None),
            proc_(11, Class::Elastic, 60, 400, true, None),
            proc_(12, Class::Be, 40, 100, true, None),
            proc_(13, Class::Be, 30, 150, false, None),
            proc_(14, Class::Be, 20, 300, true, None),
        ];
        // t = 100: above top, the timer starts: Top to the notifiable, newest first.
        let a = m.step(secs(100), 1200, &procs);
        assert_eq!(m.zone(), Zone::AboveTop);
        assert_eq!(
            a,
            vec![top(11, 300), top(10, 300), top(12, 300), top(14, 300)]
        );
        // t = 127: 27 s above top: Top again (the last is 27 s old), no kill.
        let a = m.step(secs(127), 1200, &procs);
        assert_eq!(
            a,
            vec![top(11, 300), top(10, 300), top(12, 300), top(14, 300)]
        );
        // t = 129: 29 s: no kill yet, and the Top signals of t = 127 are still
        // unanswered and younger than 5 s (R7): nothing at all.
        assert!(m.step(secs(129), 1200, &procs).is_empty());
        // t = 130: 30 s: kill BE newest first, RSS as expected: 12 (100), then 13 (150,
        // not notifiable but BE): 250 >= 200, stop. Never 10 (LC) or 11 (elastic).
        let a = m.step(secs(130), 1200, &procs);
        assert_eq!(kills(&a), vec![12, 13]);
        assert_eq!(
            a.len(),
            2,
            "Top signals of t = 127 still outstanding: {a:?}"
        );
        let Action::Kill { reason, .. } = &a[0] else {
            panic!("expected a kill first: {a:?}");
        };
        assert!(reason.contains("used_bytes=1200"), "{reason}");
        assert!(reason.contains("top_bytes=1000"), "{reason}");
        assert!(reason.contains("for 30.0 s"), "{reason}");
        assert!(reason.contains("Algorithm 1 (newest_first)"), "{reason}");
        // t = 131: 12 and 13 still listed (exiting): no new kill, their RSS still counts.
        assert!(kills(&m.step(secs(131), 1200, &procs)).is_empty());
        // t = 132: they are gone and usage is still 1150 > top: not enough, kill 14
        // (overshoot 150 <= 300). Killed processes get no Top; 11 and 10 do (their
        // last Top is 5 s old).
        m.forget(12);
        m.forget(13);
        let rest: Vec<ProcView> = procs
            .iter()
            .filter(|p| p.pid != 12 && p.pid != 13)
            .cloned()
            .collect();
        let a = m.step(secs(132), 1150, &rest);
        assert_eq!(kills(&a), vec![14]);
        assert_eq!(&a[1..], &[top(11, 250), top(10, 250)]);
        // Only LC and elastic left: above top for minutes, never a kill.
        let lc_only: Vec<ProcView> = rest.into_iter().filter(|p| p.pid != 14).collect();
        for t in 133..300 {
            let a = m.step(secs(t), 2000, &lc_only);
            assert!(kills(&a).is_empty());
        }
    }

    #[test]
    fn kill_timer_resets_below_top() {
        let mut m = Monitor::new(static_cfg());
        let procs = vec![proc_(12, Class::Be, 40, 100, false, None)];
        for t in 0..=20 {
            assert!(kills(&m.step(secs(t), 1100, &procs)).is_empty());
        }
        assert_eq!(m.above_top_for(secs(20)), Some(secs(20)));
        // Back at top (not above): the timer resets.
        m.step(secs(21), 1000, &procs);
        assert_eq!(m.above_top_for(secs(21)), None);
        for t in 22..52 {
            assert!(kills(&m.step(secs(t), 1100, &procs)).is_empty(), "t={t}");
        }
        assert_eq!(kills(&m.step(secs(52), 1100, &procs)), vec![12]);
    }

    #[test]
    fn kill_order_follows_sort_order() {
        // Largest RSS first: overshoot 1300 - 1000 = 300: 21 (250), then 23 (100): 350.
        let mut m = Monitor::new(M3Config {
            sort_order: SortOrder::LargestRss,
            kill_after: Duration::ZERO,
            ..small_cfg()
        });
        let procs = vec![
            proc_(20, Class::Be, 1, 50, false, None),
            proc_(21, Class::Be, 2, 250, false, None),
            proc_(22, Class::Lc, 3, 900, false, None),
            proc_(23, Class::Be, 4, 100, false, None),
        ];
        assert_eq!(kills(&m.step(secs(5), 1300, &procs)), vec![21, 23]);
    }

    #[test]
    fn resignal_suppression() {
        // One elastic process expecting 100; static thresholds; yellow at 850 (target 50).
        let mut m = Monitor::new(static_cfg());
        let p = vec![proc_(1, Class::Elastic, 0, 500, true, Some(100))];
        assert_eq!(m.step(secs(10), 850, &p), vec![low(1, 50)]);
        // Unanswered Low younger than 5 s: no new Low.
        assert!(m.step(secs(11), 850, &p).is_empty());
        assert!(m.step(secs(14), 850, &p).is_empty());
        // 5 s old: signalled again.
        assert_eq!(m.step(secs(15), 850, &p), vec![low(1, 50)]);
        // A higher level is not suppressed by a lower outstanding one: red at 950.
        assert_eq!(m.step(secs(16), 950, &p), vec![high(1, 50)]);
        // A lower level is suppressed by a higher outstanding one.
        assert!(m.step(secs(17), 850, &p).is_empty());
        // The process answers (2 s after the High): the outstanding signal is
        // cleared, and the next low waits one epoch (R9: 2 s) after the answer.
        m.record_reclaim(1, None, 80, secs(18));
        assert!(m.step(secs(19), 850, &p).is_empty());
        assert_eq!(m.step(secs(20), 850, &p), vec![low(1, 50)]);
        // A report dated before the signal does not answer it.
        m.record_reclaim(1, None, 80, secs(19));
        assert!(m.step(secs(21), 850, &p).is_empty());
        // The same pid now names a new process (another start time): not suppressed.
        let reborn = vec![proc_(1, Class::Elastic, 19, 500, true, Some(100))];
        assert_eq!(m.step(secs(22), 850, &reborn), vec![low(1, 50)]);
    }

    #[test]
    fn event_polls_between_ticks_send_a_level_once_per_poll_period() {
        // The storm: yellow, and an answer after every notification; event-triggered
        // polls every 100 ms.
        let mut m = Monitor::new(static_cfg());
        let p = vec![proc_(1, Class::Elastic, 0, 500, true, Some(100))];
        let ms = Duration::from_millis;
        let mut lows = 0;
        for i in 0..30u64 {
            let now = secs(10) + ms(100 * i);
            lows += m.step(now, 850, &p).len();
            m.record_reclaim(1, Some(Level::Low), 10, now);
        }
        // 3 s of polls: one low per second.
        assert_eq!(lows, 3);
        // A higher level is not held back by a recent lower one.
        assert_eq!(m.step(secs(13), 950, &p), vec![high(1, 50)]);
        // A new process behind the pid is not held back either.
        let reborn = vec![proc_(1, Class::Elastic, 12, 500, true, Some(100))];
        assert_eq!(m.step(secs(13) + ms(100), 850, &reborn), vec![low(1, 50)]);
    }

    #[test]
    fn low_repeats_only_after_the_answer_has_had_one_epoch_to_act() {
        // Static thresholds (low 800, high 900); polls every 100 ms, as when events
        // trigger them between ticks; min_signal_interval 1 s.
        let mut m = Monitor::new(static_cfg());
        let p = vec![proc_(1, Class::Elastic, 0, 500, true, Some(100))];
        let ms = Duration::from_millis;
        assert_eq!(m.epoch(1), None);
        // Yellow: low at t = 10 s; the process answers 3 s later. Its epoch is 3 s.
        assert_eq!(m.step(secs(10), 850, &p), vec![low(1, 50)]);
        m.record_reclaim(1, Some(Level::Low), 10, secs(13));
        assert_eq!(m.epoch(1), Some(secs(3)));
        // Still yellow: no low before 13 + 3 = 16 s, however many polls run.
        for i in 0..30u64 {
            assert!(m.step(secs(13) + ms(100 * i), 850, &p).is_empty(), "i={i}");
        }
        // At 16 s usage is back at low: nothing to send.
        assert!(m.step(secs(16), 800, &p).is_empty());
        // Above low again later: the answer has had its time; low at once.
        assert_eq!(m.step(secs(17), 850, &p), vec![low(1, 50)]);
        // A quick answer (0.2 s): the epoch is still the longest of the last four
        // answers (3 s); red is not held back by an answer.
        m.record_reclaim(1, Some(Level::Low), 10, secs(17) + ms(200));
        assert_eq!(m.epoch(1), Some(secs(3)));
        assert!(m.step(secs(20), 850, &p).is_empty());
        assert_eq!(m.step(secs(20) + ms(100), 950, &p), vec![high(1, 50)]);
        m.record_reclaim(1, Some(Level::High), 10, secs(20) + ms(100));
        // Three more answers within the floor: the 3 s answer is forgotten and the
        // epoch is the floor, one poll period (min_signal_interval, 1 s).
        for k in 0..3u64 {
            let t = secs(30 + 4 * k);
            assert_eq!(m.step(t, 850, &p), vec![low(1, 50)], "k={k}");
            m.record_reclaim(1, Some(Level::Low), 10, t);
        }
        assert_eq!(m.epoch(1), Some(secs(1)));
        assert!(m.step(secs(38) + ms(900), 850, &p).is_empty());
        assert_eq!(m.step(secs(39), 850, &p), vec![low(1, 50)]);
        // A very slow answer is capped at MAX_EPOCH.
        m.record_reclaim(1, Some(Level::Low), 10, secs(139));
        assert_eq!(m.epoch(1), Some(MAX_EPOCH));
        assert!(m.step(secs(139) + MAX_EPOCH - ms(100), 850, &p).is_empty());
        assert_eq!(m.step(secs(139) + MAX_EPOCH, 850, &p), vec![low(1, 50)]);
        // A report that answers nothing outstanding holds nothing back; a new
        // process behind the pid starts without an epoch.
        m.record_reclaim(1, Some(Level::Low), 10, secs(170));
        let reborn = vec![proc_(1, Class::Elastic, 171, 500, true, Some(100))];
        assert_eq!(m.step(secs(172), 850, &reborn), vec![low(1, 50)]);
        m.forget(1);
        assert_eq!(m.epoch(1), None);
        m.record_reclaim(1, None, 10, secs(173));
        assert_eq!(m.epoch(1), None);
        assert_eq!(m.step(secs(174), 850, &reborn), vec![low(1, 50)]);
    }

    #[test]
    fn suppressed_process_still_counts_in_algorithm1() {
        // Static thresholds; newest first: 2 (expects 100) then 1 (expects 100).
        // Red at 960: Algorithm 1 target 60, low target 160.
        let mut m = Monitor::new(static_cfg());
        let p = vec![
            proc_(1, Class::Elastic, 0, 500, true, Some(100)),
            proc_(2, Class::Elastic, 5, 500, true, Some(100)),
        ];
        assert_eq!(m.step(secs(10), 960, &p), vec![high(2, 60), low(1, 160)]);
        // One second later 2 is still reclaiming: its 100 bytes are in flight, so 1 is
        // not escalated to High, and its Low is still outstanding.
        assert!(m.step(secs(11), 960, &p).is_empty());
        // 2 answers with 10 bytes (mean of 10): 2 is signalled with 60 left, expected
        // 10 < 60, so 1 is escalated to High with 50 left.
        m.record_reclaim(2, None, 10, secs(12));
        assert_eq!(m.step(secs(13), 960, &p), vec![high(2, 60), high(1, 50)]);
    }

    #[test]
    fn low_answers_do_not_dilute_the_expected_reclamation() {
        // Two elastic processes that answer a low signal with a collection that gives
        // back nothing (a JVM) and a high signal with ~100 bytes. Static thresholds:
        // low 800, high 900; newest first: 2, then 1.
        let mut m = Monitor::new(static_cfg());
        let p = vec![
            proc_(1, Class::Elastic, 0, 500, true, Some(100)),
            proc_(2, Class::Elastic, 5, 500, true, Some(100)),
        ];
        // Yellow at 850: both get Low and answer 0.
        assert_eq!(m.step(secs(10), 850, &p), vec![low(2, 50), low(1, 50)]);
        m.record_reclaim(2, Some(Level::Low), 0, secs(10));
        m.record_reclaim(1, Some(Level::Low), 0, secs(10));
        // Red at 960 (Algorithm 1 target 60): 2 is expected to give back 100, so 2
        // alone gets High (1 gets Low). Before R3b, the low answer of 0 made 2's
        // expectation 0 and both were sent High.
        assert_eq!(m.step(secs(11), 960, &p), vec![high(2, 60), low(1, 160)]);
        m.record_reclaim(2, Some(Level::High), 120, secs(11));
        m.record_reclaim(1, Some(Level::Low), 0, secs(11));
        assert_eq!(m.expected_reclaim_bytes(&p[1]), 120);
        assert_eq!(m.expected_reclaim_bytes(&p[0]), 100);
        // An answer that names no notification takes the level of the outstanding one.
        assert_eq!(m.step(secs(12), 850, &p), vec![low(2, 50), low(1, 50)]);
        m.record_reclaim(2, None, 0, secs(12));
        m.record_reclaim(1, None, 0, secs(12));
        assert_eq!(m.expected_reclaim_bytes(&p[1]), 120);
        assert_eq!(m.expected_reclaim_bytes(&p[0]), 100);
        // Red again with the overshoot 2 is expected to cover: still 2 alone.
        assert_eq!(m.step(secs(13), 1000, &p), vec![high(2, 100), low(1, 200)]);
    }

    #[test]
    fn fair_share_walks_processes_below_an_equal_share_last() {
        // Static thresholds, top 1000; newest first. 1 and 2 arrived first and hold
        // 450 and 400; 3 arrived last and holds 100 (three notifiable: share 333).
        // Red at 960: target 60; each expects 100.
        let p = vec![
            proc_(1, Class::Elastic, 0, 450, true, Some(100)),
            proc_(2, Class::Elastic, 1, 400, true, Some(100)),
            proc_(3, Class::Elastic, 30, 100, true, Some(100)),
        ];
        // The paper's Algorithm 1: the newcomer 3 is signalled, red poll after red poll.
        let mut m = Monitor::new(static_cfg());
        assert_eq!(
            m.step(secs(40), 960, &p),
            vec![high(3, 60), low(2, 160), low(1, 160)]
        );
        // R3c: 3 holds less than 333, so the newest of those above it, 2, goes first.
        let mut m = Monitor::new(M3Config {
            fair_share: true,
            ..static_cfg()
        });
        assert_eq!(
            m.step(secs(40), 960, &p),
            vec![high(2, 60), low(3, 160), low(1, 160)]
        );
        // When the others are not expected to cover the overshoot, 3 is signalled too.
        m.record_reclaim(2, Some(Level::High), 10, secs(40));
        m.record_reclaim(3, Some(Level::Low), 0, secs(40));
        m.record_reclaim(1, Some(Level::Low), 0, secs(40));
        assert_eq!(
            m.step(secs(41), 1000, &p),
            vec![high(2, 100), high(1, 90), low(3, 200)]
        );
        m.record_reclaim(2, Some(Level::High), 10, secs(41));
        m.record_reclaim(1, Some(Level::High), 10, secs(41));
        assert_eq!(
            m.step(secs(42), 1000, &p),
            vec![high(2, 100), high(1, 90), high(3, 80)]
        );
    }

    #[test]
    fn adaptation_changes_the_targets_of_later_polls() {
        // With adaptation (step 20): a green poll at 700, then a red poll at 960: low
        // 800 -> 780 (ratio red 1:1 > 1:32, and 700 <= 800) and high 900 -> 920 (above
        // top 0:2 < 1:32, in red). The next poll at 960 has Algorithm 1 target
        // 960 - 920 = 40 and low target 180.
        let mut m = Monitor::new(small_cfg());
        let p = vec![proc_(1, Class::Elastic, 0, 500, true, Some(10))];
        assert!(m.step(secs(9), 700, &p).is_empty());
        assert_eq!(m.step(secs(10), 960, &p), vec![high(1, 60)]);
        assert_eq!(th(&m), (780, 920));
        m.record_reclaim(1, None, 10, secs(11));
        assert_eq!(m.step(secs(12), 960, &p), vec![high(1, 40)]);
        assert_eq!(th(&m), (760, 940));
    }

    #[test]
    fn not_notifiable_processes_get_no_signal() {
        let mut m = Monitor::new(small_cfg());
        let p = vec![proc_(1, Class::Elastic, 0, 500, false, Some(100))];
        assert!(m.step(secs(1), 850, &p).is_empty());
        assert!(m.step(secs(2), 960, &p).is_empty());
        assert!(m.step(secs(3), 1100, &p).is_empty());
    }

    #[test]
    fn restore_state_round_trip() {
        let mut m = Monitor::new(M3Config {
            window_samples: 4,
            ..small_cfg()
        });
        m.record_reclaim(3, None, 100, secs(1));
        m.record_reclaim(3, None, 300, secs(2));
        m.record_reclaim(9, None, 7, secs(3));
        m.step(secs(4), 850, &[]);
        m.step(secs(5), 850, &[]);
        let state = m.state();
        assert_eq!(
            state.thresholds,
            Some(Thresholds {
                low_bytes: 840,
                high_bytes: 900,
                top_bytes: 1000
            })
        );
        // Through JSON, as the agent saves it.
        let json = serde_json::to_string(&state).unwrap();
        let back: MonitorState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, state);

        let mut fresh = Monitor::new(M3Config {
            window_samples: 4,
            ..small_cfg()
        });
        fresh.restore(back);
        assert_eq!(fresh.state(), state);
        assert_eq!(fresh.thresholds(), m.thresholds());
        let p3 = proc_(3, Class::Elastic, 0, 0, true, None);
        assert_eq!(fresh.expected_reclaim_bytes(&p3), 200);

        // A default (empty) state keeps the configured thresholds.
        let mut other = Monitor::new(small_cfg());
        other.restore(MonitorState::default());
        assert_eq!(th(&other), (800, 900));
    }

    #[test]
    fn restore_rescales_and_refuses_bad_thresholds() {
        let mut m = Monitor::new(M3Config {
            reclaim_history: 2,
            ..small_cfg()
        });
        // Saved for a top of 2000: rescaled to 1000.
        let saved = MonitorState {
            thresholds: Some(Thresholds {
                low_bytes: 1500,
                high_bytes: 1700,
                top_bytes: 2000,
            }),
            reclaim_history: [(4, vec![1, 2, 3])].into_iter().collect(),
        };
        m.try_restore(saved).unwrap();
        assert_eq!(th(&m), (750, 850));
        // History trimmed to the last 2 reports: mean of 2 and 3 = 2.
        assert_eq!(
            m.expected_reclaim_bytes(&proc_(4, Class::Be, 0, 0, true, None)),
            2
        );
        let bad = MonitorState {
            thresholds: Some(Thresholds {
                low_bytes: 900,
                high_bytes: 800,
                top_bytes: 1000,
            }),
            reclaim_history: BTreeMap::new(),
        };
        assert!(matches!(
            m.try_restore(bad.clone()),
            Err(PolicyError::InvalidThresholds { .. })
        ));
        m.restore(bad);
        assert_eq!(th(&m), (750, 850));
    }

    #[test]
    fn set_top_rescales_proportionally() {
        const GB: u64 = 1_000_000_000;
        let mut m = Monitor::new(M3Config::with_top(62 * GB));
        m.set_top(31 * GB);
        assert_eq!(
            m.thresholds(),
            Thresholds {
                low_bytes: 25 * GB,
                high_bytes: 27_500_000_000,
                top_bytes: 31 * GB
            }
        );
        assert_eq!(m.config().top_bytes, 31 * GB);
        assert_eq!(m.config().low_bytes, 25 * GB);
        assert_eq!(m.config().step_bytes, 620_000_000);
        // Adapted thresholds are rescaled too: raise low once (yellow, no red), then
        // double the top.
        m.step(S, 26 * GB, &[]);
        assert_eq!(m.thresholds().low_bytes, 25_620_000_000);
        m.set_top(62 * GB);
        assert_eq!(m.thresholds().low_bytes, 51_240_000_000);
        assert_eq!(m.thresholds().high_bytes, 55 * GB);
        // A top of 0 is refused.
        assert!(m.try_set_top(0).is_err());
        m.set_top(0);
        assert_eq!(m.thresholds().top_bytes, 62 * GB);
    }

    #[test]
    fn duplicate_pids_count_once() {
        let mut m = Monitor::new(small_cfg());
        let p = vec![
            proc_(1, Class::Elastic, 0, 500, true, None),
            proc_(1, Class::Elastic, 0, 500, true, None),
        ];
        assert_eq!(m.step(secs(1), 850, &p), vec![low(1, 50)]);
    }

    #[test]
    fn sort_order_names_round_trip() {
        for o in [
            SortOrder::NewestFirst,
            SortOrder::OldestFirst,
            SortOrder::LargestRss,
            SortOrder::LargestExpectedReclaim,
        ] {
            assert_eq!(o.as_str().parse::<SortOrder>(), Ok(o));
            let json = serde_json::to_string(&o).unwrap();
            assert_eq!(json, format!("\"{}\"", o.as_str()));
        }
        assert!("biggest".parse::<SortOrder>().is_err());
    }
}
