//! Rules of the tier's executor: the decisions that MaxMem's state machine
//! ([`crate::maxmem`]) leaves to the code that samples pages and serves faults
//! (memcolo-tier's manager and sampler, the agent's tier service), written as pure
//! functions of plain values.
//!
//! - [`sample_size`] and [`pages_for_fmmr_error`]: how many resident pages to sample
//!   per 50 ms window, from a target of hits and the standard error wanted of the
//!   epoch's measured FMMR. MaxMem samples loads with PEBS at a fixed period (§3.2,
//!   "FMMR sampling": 1 load in 100); without hardware counters memcolo samples page
//!   touches, and sizes the sample so that the FMMR MaxMem's T1 rule (§3.1) takes in
//!   is as precise as asked for and no more.
//! - [`is_short_refault`]: which slow faults count as hotness samples for sure (a
//!   rule of ours, on Linux's refault distance of `mm/workingset.c`), feeding MaxMem's
//!   hotness bins (§3.2, "Hotness bins").
//! - [`tier_thread_sched`]: how the threads serving a process's regions are scheduled,
//!   from its target `t_miss` (a rule of ours: MaxMem's central manager serves every
//!   process's faults alike, §4).

/// Hits an epoch's sample is sized for at least while the process has slow
/// accesses (see [`pages_for_fmmr_error`]).
pub const MIN_EPOCH_HITS: f64 = 20.0;

/// Pages to sample per window so that an epoch's measured FMMR has about the
/// standard error `target_error` (absolute, in FMMR units), from the recent past:
/// the FMMR `x` (`None` while unknown), the share `p` of sampled pages hit (`None`
/// before any sample) and the windows per epoch `windows`. Clamped to
/// `[min_pages, max_pages]` (`max_pages` wins).
///
/// An epoch's FMMR is `x = a_slow / (a_slow + a_fast)`, `a_slow` exact and
/// `a_fast` the sum of the windows' `Ĥ`. To first order, `SE(x) = x(1 − x) ·
/// SE(â_fast)/a_fast`, and with `K` pages sampled over the epoch's windows the
/// relative standard error of `â_fast` is `sqrt((1 − p)/(K·p))` (the
/// hypergeometric error of the sampler's `Ĥ = h·R/k`, `memcolo_tier::sampler`, the
/// finite-population factor taken as 1). So
/// `K = (x(1 − x))² (1 − p) / (p · target_error²)`, spread over the windows. The
/// factor `x(1 − x)` is taken as 1/4 (its largest) once `x ≥ 1/2`; `p` is floored
/// at 0.01. The formula fails for small `K`: an epoch whose sample happens to hold
/// no hit measures `a_fast = 0`, hence `x = 1` if it had any slow access, and the
/// policy would see a needy process. So while `x > 0`, `K` is at least
/// [`MIN_EPOCH_HITS`]`/p` (such an epoch then has probability about
/// `e^-MIN_EPOCH_HITS`). A process whose accesses all hit fast memory (`x = 0`)
/// needs no precision at all: `a_miss` is 0 whatever `a_fast` is (and 0 outright
/// if the sample saw nothing either), so it gets `min_pages`. An unknown `x` or
/// `p` gets `max_pages`.
///
/// Examples (`target_error = 0.01`, 20 windows): `x = 0.3, p = 0.5` needs
/// `K = 441`, 23 pages per window; `x = 0.1, p = 0.85` needs `K = 15` for the
/// error but 24 for the hits, 2 pages per window; `x = 0` needs none.
pub fn pages_for_fmmr_error(
    x: Option<f64>,
    p: Option<f64>,
    windows: u32,
    target_error: f64,
    min_pages: usize,
    max_pages: usize,
) -> usize {
    let min_pages = min_pages.min(max_pages);
    let (Some(x), Some(p)) = (x, p) else {
        return max_pages;
    };
    if target_error.is_nan() || target_error <= 0.0 {
        return max_pages;
    }
    let x = x.clamp(0.0, 1.0);
    let g = if x >= 0.5 { 0.25 } else { x * (1.0 - x) };
    let p = p.clamp(0.01, 1.0);
    let mut per_epoch = g * g * (1.0 - p) / (p * target_error * target_error);
    if x > 0.0 {
        per_epoch = per_epoch.max(MIN_EPOCH_HITS / p);
    }
    let per_window = (per_epoch / windows.max(1) as f64).ceil();
    if per_window >= max_pages as f64 {
        max_pages
    } else {
        (per_window as usize).clamp(min_pages, max_pages)
    }
}

/// The recent past of a region's sampling that [`sample_size`] sizes the next
/// window's sample from: moving sums ([`SampleHistory::push_window`]) of the
/// pages sampled, the distinct sampled pages hit, the slow faults and the estimated
/// fast touches (`Ĥ`) per window; and the windows of the last epoch (0 before the
/// first).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SampleHistory {
    /// Pages sampled.
    pub sampled: f64,
    /// Distinct sampled pages touched.
    pub hits: f64,
    /// Slow faults (`a_slow`, exact).
    pub slow: f64,
    /// Estimated fast touches (`a_fast`).
    pub fast: f64,
    /// Windows of the last epoch; 0 before the first.
    pub windows_per_epoch: u32,
}

impl SampleHistory {
    /// Weight of the past per window in the moving sums (3/4).
    pub const DECAY: f64 = 0.75;

    /// Adds a closed window to the moving sums: `sampled` pages sampled, `pages_hit`
    /// distinct sampled pages touched (the hit share sizes the sample: distinct
    /// pages, at most 1), `slow` slow faults and `fast` estimated fast touches
    /// (`Ĥ`); older windows weigh [`SampleHistory::DECAY`] less each. Leaves
    /// `windows_per_epoch` alone.
    pub fn push_window(&mut self, sampled: u64, pages_hit: u64, slow: u64, fast: f64) {
        let d = Self::DECAY;
        self.sampled = d * self.sampled + sampled as f64;
        self.hits = d * self.hits + pages_hit as f64;
        self.slow = d * self.slow + slow as f64;
        self.fast = d * self.fast + fast;
    }
}

/// The probability that a resident page was sampled in a window that sampled
/// `sampled` of `resident` pages (`k/R`, at most 1; 1 with no resident page): the
/// probability with which a slow fault enters the per-page samples, so that the
/// hotness bins (MaxMem §3.2) weigh both tiers alike.
pub fn sample_probability(sampled: u64, resident: u64) -> f64 {
    if resident > 0 {
        (sampled as f64 / resident as f64).min(1.0)
    } else {
        1.0
    }
}

/// Pages to put on probation now: up to `most` pages on probation in all, never
/// more than an eighth of the `resident` pages, of which `held` already are. Rule
/// of ours (probation is not in MaxMem): the cap keeps the faults that probation
/// costs hot pages a small share of the region.
pub fn probation_room(most: usize, resident: u64, held: usize) -> usize {
    most.min((resident / 8) as usize).saturating_sub(held)
}

/// Pages to sample in the next window, at most `max_pages`.
///
/// With `target_hits` 0, always `max_pages`. Otherwise the sample aims at
/// `target_hits` hits a window at the recent hit share `p = hits / sampled` (1 while
/// nothing was sampled, floored at 0.01): `ceil(target_hits / p)`. With
/// `fmmr_error` not positive (or NaN) that is the size, at least 8 pages (or
/// `max_pages` if fewer). Otherwise that size is only a cap, and
/// [`pages_for_fmmr_error`] sizes the sample for the epoch FMMR's standard error
/// `fmmr_error`, with the recent FMMR `x = slow / (slow + fast)` (unknown before
/// anything was seen; 0 for a region sampled without a hit or a slow fault, which is
/// idle) and a floor of 1 page.
pub fn sample_size(
    max_pages: usize,
    target_hits: usize,
    fmmr_error: f64,
    h: &SampleHistory,
) -> usize {
    let max = max_pages;
    let target = target_hits as f64;
    if target == 0.0 {
        return max;
    }
    let p = (h.sampled > 0.0).then(|| h.hits / h.sampled);
    let for_target = (target / p.unwrap_or(1.0).max(0.01)).ceil();
    let eps = fmmr_error;
    if eps.is_nan() || eps <= 0.0 {
        return (for_target.min(max as f64) as usize).clamp(8.min(max), max);
    }
    let cap = (for_target.min(max as f64) as usize).clamp(1.min(max), max);
    let x = if h.slow > 0.0 || h.fast > 0.0 {
        Some(h.slow / (h.slow + h.fast))
    } else {
        (h.sampled > 0.0).then_some(0.0)
    };
    pages_for_fmmr_error(x, p, h.windows_per_epoch.max(1), eps, 1, cap)
}

/// Whether a page faulting in from the slow tier now is a *refault at a short
/// distance*: it was stored at eviction number `evicted_at` (0: never evicted) of its
/// region, which has made `evict_seq` evictions so far (both counters wrap, skipping
/// 0) and holds `resident` pages in fast memory. Short means fewer pages were evicted
/// since than the region holds resident, so the page would still be resident had
/// the region twice its fast memory: the test by which Linux's `mm/workingset.c`
/// activates a refaulting page. Such a fault counts as a hotness sample for sure,
/// not at the sampler's `k/R` (MaxMem's bins, §3.2, learn a hot page at its first
/// refault instead of as the sampler happens on it).
pub fn is_short_refault(evicted_at: u32, evict_seq: u32, resident: u64) -> bool {
    evicted_at != 0 && u64::from(evict_seq.wrapping_sub(evicted_at)) <= resident
}

/// How the threads that serve one process's tiered regions are scheduled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierThreadSched {
    /// The fault thread runs `SCHED_FIFO` (priority 1).
    pub fault_fifo: bool,
    /// Nice value of the fault and eviction threads (-20..=19).
    pub nice: i32,
    /// The fault and eviction threads run `SCHED_IDLE`.
    pub idle: bool,
}

/// The scheduling of the tier threads of a process with target `t_miss` (`None`: not
/// registered). A latency-critical process (`t_miss < 1`) has its fault thread run
/// `SCHED_FIFO` when `lc_fault_priority`, so that its faults do not wait for a CPU
/// behind a thrashing best-effort process's tier threads. A best-effort process's
/// (`t_miss >= 1`) fault and eviction threads run at nice `be_thread_nice` and, with
/// `be_thread_idle`, `SCHED_IDLE`. Anything else runs at nice 0, `SCHED_OTHER`.
/// Rules of ours: MaxMem's central manager serves all faults alike (§4).
pub fn tier_thread_sched(
    t_miss: Option<f64>,
    lc_fault_priority: bool,
    be_thread_nice: i32,
    be_thread_idle: bool,
) -> TierThreadSched {
    let be = t_miss.is_some_and(|t| t >= 1.0);
    TierThreadSched {
        fault_fifo: lc_fault_priority && t_miss.is_some_and(|t| t < 1.0),
        nice: if be { be_thread_nice } else { 0 },
        idle: be_thread_idle && be,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_for_fmmr_error_by_hand() {
        // x = 0.1, p = 0.85, ε = 0.01: K = (0.09)²·0.15/(0.85·1e-4) = 14.29, but at
        // least 20/0.85 = 23.5 for the hits; over 20 windows: 1.18 → 2 pages.
        assert_eq!(
            pages_for_fmmr_error(Some(0.1), Some(0.85), 20, 0.01, 1, 64),
            2
        );
        // x = 0.3, p = 0.5: K = (0.21)²·0.5/(0.5·1e-4) = 441 → 22.05 → 23 pages.
        assert_eq!(
            pages_for_fmmr_error(Some(0.3), Some(0.5), 20, 0.01, 1, 64),
            23
        );
        // x ≥ 1/2 counts as 1/2: x = 0.9, p = 0.5: K = 0.0625·0.5/(0.5e-4) = 625
        // → 32 pages.
        assert_eq!(
            pages_for_fmmr_error(Some(0.9), Some(0.5), 20, 0.01, 1, 64),
            32
        );
        // All in fast memory: the floor. Unknown: the most.
        assert_eq!(
            pages_for_fmmr_error(Some(0.0), Some(0.85), 20, 0.01, 1, 64),
            1
        );
        assert_eq!(pages_for_fmmr_error(None, Some(0.85), 20, 0.01, 1, 64), 64);
        assert_eq!(pages_for_fmmr_error(Some(0.2), None, 20, 0.01, 1, 64), 64);
        // Sparse hits (p floored at 0.01) and a tight target: capped.
        assert_eq!(
            pages_for_fmmr_error(Some(0.4), Some(0.0), 20, 0.01, 1, 64),
            64
        );
        // No sampling at all (max 0) wins over the floor.
        assert_eq!(
            pages_for_fmmr_error(Some(0.4), Some(0.5), 20, 0.01, 1, 0),
            0
        );
        // One window per epoch: the whole K in it (x = 0.3, p = 0.9: K = 0.0441·0.1
        // /(0.9·1e-4) = 49, the hits need 22.2).
        assert_eq!(
            pages_for_fmmr_error(Some(0.3), Some(0.9), 1, 0.01, 1, 64),
            49
        );
    }

    #[test]
    fn sample_history_decays_by_three_quarters_a_window() {
        let mut h = SampleHistory {
            windows_per_epoch: 7,
            ..SampleHistory::default()
        };
        h.push_window(40, 10, 4, 20.0);
        h.push_window(40, 10, 4, 20.0);
        assert_eq!(h.sampled, 70.0);
        assert_eq!(h.hits, 17.5);
        assert_eq!(h.slow, 7.0);
        assert_eq!(h.fast, 35.0);
        assert_eq!(h.windows_per_epoch, 7);
    }

    #[test]
    fn sample_probability_is_k_over_r_capped_at_one() {
        assert_eq!(sample_probability(16, 64), 0.25);
        assert_eq!(sample_probability(64, 16), 1.0);
        assert_eq!(sample_probability(0, 0), 1.0);
        assert_eq!(sample_probability(3, 0), 1.0);
    }

    #[test]
    fn probation_holds_at_most_an_eighth_of_the_resident_pages() {
        assert_eq!(probation_room(128, 8000, 0), 128);
        assert_eq!(probation_room(128, 8000, 100), 28);
        assert_eq!(probation_room(128, 800, 0), 100);
        assert_eq!(probation_room(128, 800, 120), 0);
        assert_eq!(probation_room(128, 7, 0), 0);
        assert_eq!(probation_room(0, 8000, 0), 0);
    }

    #[test]
    fn sample_size_aims_at_the_hits_then_at_the_error() {
        let none = SampleHistory::default();
        // No target: the most; nothing seen yet: the hits at p = 1, floor 8.
        assert_eq!(sample_size(64, 0, 0.01, &none), 64);
        assert_eq!(sample_size(64, 4, 0.0, &none), 8);
        assert_eq!(sample_size(4, 4, 0.0, &none), 4);
        // p = 0.25: 16 for 4 hits; without an error target that is the size.
        let h = SampleHistory {
            sampled: 40.0,
            hits: 10.0,
            slow: 3.0,
            fast: 27.0,
            windows_per_epoch: 20,
        };
        assert_eq!(sample_size(64, 4, 0.0, &h), 16);
        // With one: x = 0.1, p = 0.25: K = 0.0081·0.75/(0.25·1e-4) = 243, the hits
        // need 80; over 20 windows 12.15 → 13, under the cap of 16.
        assert_eq!(sample_size(64, 4, 0.01, &h), 13);
        // A tighter error is capped by the hits' size.
        assert_eq!(sample_size(64, 4, 0.001, &h), 16);
        // Sampled but idle (no hit, no slow fault): x = 0, the floor.
        let idle = SampleHistory {
            sampled: 40.0,
            ..SampleHistory::default()
        };
        assert_eq!(sample_size(64, 4, 0.01, &idle), 1);
        // Nothing sampled but slow faults seen: p unknown, the cap.
        let slow_only = SampleHistory {
            slow: 5.0,
            ..SampleHistory::default()
        };
        assert_eq!(sample_size(64, 4, 0.01, &slow_only), 4);
        // No sampling at all.
        assert_eq!(sample_size(0, 4, 0.01, &h), 0);
    }

    #[test]
    fn short_refaults_are_within_the_resident_pages() {
        // Never evicted.
        assert!(!is_short_refault(0, 100, 1000));
        // Evicted 10 evictions ago, 10 or more resident: short.
        assert!(is_short_refault(90, 100, 10));
        assert!(is_short_refault(90, 100, 11));
        assert!(!is_short_refault(90, 100, 9));
        // Across the counter's wrap (which skips 0): 5 evictions ago.
        assert!(is_short_refault(u32::MAX - 2, 2, 5));
        assert!(!is_short_refault(u32::MAX - 2, 2, 4));
    }

    #[test]
    fn tier_threads_by_target() {
        let lc = tier_thread_sched(Some(0.1), true, 19, true);
        assert_eq!(
            lc,
            TierThreadSched {
                fault_fifo: true,
                nice: 0,
                idle: false
            }
        );
        assert!(!tier_thread_sched(Some(0.1), false, 19, true).fault_fifo);
        let be = tier_thread_sched(Some(1.0), true, 19, true);
        assert_eq!(
            be,
            TierThreadSched {
                fault_fifo: false,
                nice: 19,
                idle: true
            }
        );
        assert!(!tier_thread_sched(Some(1.0), true, 19, false).idle);
        assert_eq!(tier_thread_sched(Some(1.0), true, 0, false).nice, 0);
        assert!(!tier_thread_sched(Some(0.999), true, 19, true).idle);
        // Not registered: the defaults.
        assert_eq!(
            tier_thread_sched(None, true, 19, true),
            TierThreadSched::default()
        );
    }
}
