//! A registered process's notification and reclaim ledger over a sliding window, and
//! the unmatched-reclaim rule (rule R10 of [`crate::m3`]).
//!
//! The ledger keeps, per whole second of the last [`WINDOW`] (60 s), the
//! notifications sent to the process by [`Level`], the bytes it reported reclaimed
//! (`reclaimed` reports, answers or not), and how far its resident set (RSS, the
//! caller's figure: memcolo uses the RSS of the process and its descendants) fell
//! between consecutive observations. At most 61 buckets are kept whatever a client
//! sends, so its size is bounded.
//!
//! **Rates** ([`Ledger::rates`]) are over the trailing [`WINDOW`]: notifications per
//! minute are the notifications sent in the last 60 s, by level; the reclaim rate is
//! the bytes reported in the last 60 s divided by 60 s. A process registered for less
//! than 60 s has had fewer seconds to earn them (no extrapolation).
//!
//! **R10 — unmatched reclaim** (memcolo's). A process that reports reclamation its
//! resident set does not show — it evicts, regrows and evicts again, or its reports
//! are not true — makes M3's expected reclamation (R3b) and the operator's view
//! wrong. At each RSS observation, with `reported` = bytes reported in the window and
//! `fell` = the sum of the RSS falls between consecutive observations in the window,
//! the process is *unmatched* when `reported >= `[`UNMATCHED_MIN_REPORTED_BYTES`]
//! (64 MiB) and `fell < reported / 4` ([`UNMATCHED_MATCH_DIVISOR`]). A report is
//! judged from the second observation after it arrives, so that the fall it caused
//! (seen by the first or, for a process that answers before it frees, the second
//! observation) is in the window with it. An episode
//! begins when the condition first holds ([`Ledger::observe_rss`] returns it once) and
//! ends once it has not held at any observation for a whole [`WINDOW`]: a process at
//! the boundary starts at most one episode per minute. Falls are summed rather than
//! taken between the window's ends, so a process that gives memory back and later
//! grows again (the allow-rate gate opened) is matched; one that evicts and regrows
//! between two polls is not.

use crate::types::Level;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;

/// The sliding window of rates and of rule R10 (60 s).
pub const WINDOW: Duration = Duration::from_secs(60);

/// R10: reports below this many bytes in the window are never unmatched (64 MiB).
pub const UNMATCHED_MIN_REPORTED_BYTES: u64 = 64 << 20;

/// R10: reported reclaim is matched when the RSS fell by at least `reported / this`.
pub const UNMATCHED_MATCH_DIVISOR: u64 = 4;

/// Notification counts by level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LevelCounts {
    pub low: u64,
    pub high: u64,
    pub top: u64,
}

impl LevelCounts {
    /// Adds one notification of `level`.
    pub fn add(&mut self, level: Level) {
        match level {
            Level::Low => self.low += 1,
            Level::High => self.high += 1,
            Level::Top => self.top += 1,
        }
    }

    /// All levels together.
    pub fn total(&self) -> u64 {
        self.low + self.high + self.top
    }
}

/// A process's rates over the trailing [`WINDOW`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Notifications sent in the last 60 s, by level: per minute.
    pub notifications_per_min: LevelCounts,
    /// Bytes reported reclaimed in the last 60 s, divided by 60 s: bytes per second.
    pub reclaim_bytes_per_s: f64,
    /// Bytes reported reclaimed in the window (R10's `reported`, pending reports
    /// included).
    pub reported_bytes: u64,
    /// Sum of the RSS falls between consecutive observations in the window, bytes
    /// (R10's `fell`).
    pub rss_fell_bytes: u64,
}

/// The start of an unmatched-reclaim episode (R10), with its figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unmatched {
    /// Bytes reported reclaimed in the window.
    pub reported_bytes: u64,
    /// Sum of the RSS falls in the window, bytes.
    pub rss_fell_bytes: u64,
}

/// One whole second of the window.
#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    second: u64,
    notified: LevelCounts,
    reported: u64,
    fell: u64,
}

/// One process's ledger. `now` is a [`Duration`] since the caller's epoch, never
/// decreasing from call to call (an earlier `now` is treated as the latest one seen).
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    buckets: VecDeque<Bucket>,
    /// Reports since the last RSS observation (R10 judges them from the next one).
    pending_reported: u64,
    last_rss: Option<u64>,
    latest: Duration,
    /// When the current unmatched episode began.
    unmatched_since: Option<Duration>,
    /// While in an episode, since when the condition has not held.
    clear_since: Option<Duration>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// A notification of `level` was sent at `now`.
    pub fn notified(&mut self, now: Duration, level: Level) {
        self.bucket(now).notified.add(level);
    }

    /// The process reported `bytes` reclaimed at `now`.
    pub fn reported(&mut self, now: Duration, bytes: u64) {
        self.advance(now);
        self.pending_reported = self.pending_reported.saturating_add(bytes);
    }

    /// A poll at `now` saw the process's RSS at `rss_bytes`; applies rule R10 and
    /// returns the figures when an unmatched episode begins now.
    pub fn observe_rss(&mut self, now: Duration, rss_bytes: u64) -> Option<Unmatched> {
        let fell = self
            .last_rss
            .map(|prev| prev.saturating_sub(rss_bytes))
            .unwrap_or(0);
        self.last_rss = Some(rss_bytes);
        let b = self.bucket(now);
        b.fell = b.fell.saturating_add(fell);
        let (reported, fell) = self.window_sums();
        let now = self.latest;
        let holds =
            reported >= UNMATCHED_MIN_REPORTED_BYTES && fell < reported / UNMATCHED_MATCH_DIVISOR;
        let pending = std::mem::take(&mut self.pending_reported);
        let b = self.bucket(now);
        b.reported = b.reported.saturating_add(pending);
        match (self.unmatched_since, holds) {
            (None, true) => {
                self.unmatched_since = Some(now);
                self.clear_since = None;
                Some(Unmatched {
                    reported_bytes: reported,
                    rss_fell_bytes: fell,
                })
            }
            (Some(_), true) => {
                self.clear_since = None;
                None
            }
            (Some(_), false) => {
                let since = *self.clear_since.get_or_insert(now);
                if now.saturating_sub(since) >= WINDOW {
                    self.unmatched_since = None;
                    self.clear_since = None;
                }
                None
            }
            (None, false) => None,
        }
    }

    /// Whether an unmatched-reclaim episode (R10) is under way.
    pub fn unmatched(&self) -> bool {
        self.unmatched_since.is_some()
    }

    /// The rates over the trailing [`WINDOW`] at `now`.
    pub fn rates(&self, now: Duration) -> Rates {
        let now = now.max(self.latest);
        let first = window_first_second(now);
        let mut r = Rates::default();
        for b in self.buckets.iter().filter(|b| b.second >= first) {
            r.notifications_per_min.low += b.notified.low;
            r.notifications_per_min.high += b.notified.high;
            r.notifications_per_min.top += b.notified.top;
            r.reported_bytes = r.reported_bytes.saturating_add(b.reported);
            r.rss_fell_bytes = r.rss_fell_bytes.saturating_add(b.fell);
        }
        r.reported_bytes = r.reported_bytes.saturating_add(self.pending_reported);
        r.reclaim_bytes_per_s = r.reported_bytes as f64 / WINDOW.as_secs_f64();
        r
    }

    /// Reported bytes (judged ones only) and RSS falls in the window.
    fn window_sums(&self) -> (u64, u64) {
        let first = window_first_second(self.latest);
        self.buckets
            .iter()
            .filter(|b| b.second >= first)
            .fold((0u64, 0u64), |(r, f), b| {
                (r.saturating_add(b.reported), f.saturating_add(b.fell))
            })
    }

    /// Moves the clock to `now` (never back) and drops buckets that left the window.
    fn advance(&mut self, now: Duration) {
        self.latest = self.latest.max(now);
        let first = window_first_second(self.latest);
        while self.buckets.front().is_some_and(|b| b.second < first) {
            self.buckets.pop_front();
        }
    }

    /// The bucket of `now`'s second (of the latest time seen, if `now` is earlier).
    fn bucket(&mut self, now: Duration) -> &mut Bucket {
        self.advance(now);
        let second = self.latest.as_secs();
        if self.buckets.back().is_none_or(|b| b.second != second) {
            self.buckets.push_back(Bucket {
                second,
                ..Bucket::default()
            });
        }
        self.buckets.back_mut().expect("just pushed")
    }
}

/// The first whole second inside the window ending at `now`: the window holds the
/// seconds `(now - 60 s, now]`, rounded to whole seconds (60 buckets).
fn window_first_second(now: Duration) -> u64 {
    (now.as_secs() + 1).saturating_sub(WINDOW.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn rates_count_the_trailing_minute() {
        let mut l = Ledger::new();
        for t in 0..120 {
            l.notified(s(t), Level::Low);
            if t % 10 == 0 {
                l.notified(s(t), Level::High);
            }
            l.reported(s(t), MIB);
            l.observe_rss(s(t), 100 * MIB);
        }
        let r = l.rates(s(119));
        assert_eq!(
            r.notifications_per_min,
            LevelCounts {
                low: 60,
                high: 6,
                top: 0
            }
        );
        assert_eq!(r.reported_bytes, 60 * MIB);
        assert!((r.reclaim_bytes_per_s - MIB as f64).abs() < 1.0);
        // Quiet for a minute: all rates fall to 0.
        assert_eq!(l.rates(s(180)), Rates::default());
        // Hostile floods stay within 61 buckets.
        for i in 0..100_000u64 {
            l.reported(s(200) + Duration::from_micros(i * 10), 1);
        }
        assert!(l.buckets.len() <= 61);
    }

    #[test]
    fn evict_regrow_between_polls_is_unmatched_once_per_episode() {
        // 8 MiB reported every second while the polled RSS stays at 500 MiB.
        let mut l = Ledger::new();
        let mut episodes = vec![];
        for t in 0..200 {
            l.reported(s(t), 8 * MIB);
            if let Some(u) = l.observe_rss(s(t), 500 * MIB) {
                episodes.push((t, u));
            }
        }
        // 64 MiB reported after 8 judged reports (each judged one poll late).
        assert_eq!(
            episodes,
            vec![(
                8,
                Unmatched {
                    reported_bytes: 64 * MIB,
                    rss_fell_bytes: 0
                }
            )]
        );
        assert!(l.unmatched());
        // The reports stop: the episode ends a window after the condition last held
        // (the reports leave the window by t = 260, and 60 s pass).
        for t in 200..400 {
            assert_eq!(l.observe_rss(s(t), 500 * MIB), None);
        }
        assert!(!l.unmatched());
    }

    #[test]
    fn reclaim_seen_in_rss_is_matched_even_when_it_regrows_later() {
        let mut l = Ledger::new();
        // Every 10 s it gives back 32 MiB (the next poll sees the fall) and grows
        // back over the following polls.
        let mut rss = 500 * MIB;
        for t in 0..300 {
            if t % 10 == 0 {
                l.reported(s(t), 32 * MIB);
                rss -= 32 * MIB;
            } else if rss < 500 * MIB {
                rss += 8 * MIB;
            }
            assert_eq!(l.observe_rss(s(t), rss), None, "t={t}");
        }
        assert!(!l.unmatched());
        // A quarter is enough: reported 256 MiB, fell 64 MiB.
        let mut l = Ledger::new();
        let mut rss = 1000 * MIB;
        l.observe_rss(s(0), rss);
        for t in 1..=8 {
            l.reported(s(t), 32 * MIB);
            rss -= 8 * MIB;
            assert_eq!(l.observe_rss(s(t), rss), None);
        }
        assert_eq!(l.observe_rss(s(9), rss), None);
        assert_eq!(l.rates(s(9)).reported_bytes, 256 * MIB);
        assert_eq!(l.rates(s(9)).rss_fell_bytes, 64 * MIB);
        // Below 64 MiB nothing is judged, however little the RSS fell.
        let mut l = Ledger::new();
        l.reported(s(0), 63 * MIB);
        l.observe_rss(s(0), 10 * MIB);
        assert_eq!(l.observe_rss(s(1), 10 * MIB), None);
    }

    #[test]
    fn a_report_is_judged_from_the_poll_after_it() {
        // The process answers, then the next poll sees the fall: matched.
        let mut l = Ledger::new();
        l.observe_rss(s(0), 500 * MIB);
        l.reported(s(1), 100 * MIB);
        assert_eq!(l.observe_rss(s(2), 500 * MIB), None);
        assert_eq!(l.observe_rss(s(3), 400 * MIB), None);
        assert!(!l.unmatched());
        // A lie: never seen.
        let mut l = Ledger::new();
        l.observe_rss(s(0), 500 * MIB);
        l.reported(s(1), 100 * MIB);
        assert_eq!(l.observe_rss(s(2), 500 * MIB), None);
        assert_eq!(
            l.observe_rss(s(3), 500 * MIB),
            Some(Unmatched {
                reported_bytes: 100 * MIB,
                rss_fell_bytes: 0
            })
        );
    }
}
