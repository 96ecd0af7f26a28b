//! Access sampling without PEBS: the estimator of fast-tier accesses.
//!
//! MaxMem counts accesses to each tier with PEBS samples of loads (§3.2). This
//! machine has no hardware counters, so memcolo measures in *page touches per
//! sampling window*:
//!
//! - **Slow tier, exact.** A page in the slow tier is not mapped: its first access in
//!   a window faults, and the fault brings it in. Every such fault is counted
//!   (`a_slow`), and it is one page touch.
//! - **Fast tier, sampled.** At the start of a window, `k` resident pages are chosen
//!   uniformly at random (without replacement) among the `R` resident ones; each is
//!   write-protected, copied aside, dropped from the page table, and unprotected, so
//!   its next access, read or write, faults. A sampled page that faults before the
//!   window ends is a *hit*; it is put back from the copy at once. At the end of the
//!   window the others are put back silently. With `h` hits, the estimate of resident
//!   pages touched in the window is `Ĥ = h·R/k` (`a_fast`).
//!
//! Both counts are in the same unit, distinct pages touched per window, so
//! `a_miss = a_slow / (a_slow + a_fast)` is the fraction of page touches that missed
//! fast memory. It weighs a page touched once and a page touched a thousand times in
//! a window alike: it is a miss ratio over page touches, not over loads, and shorter
//! windows bring it closer to the per-load ratio PEBS would give. (A slow page that
//! faults in is resident for the rest of the window, so it is counted once, like a
//! fast page.)
//!
//! **Error.** `h` is hypergeometric: `Ĥ` is unbiased for the true count `H` of
//! resident pages touched in the window, with relative standard error
//! `sqrt((1 − p)/(k·p) · (R − k)/(R − 1))` where `p = H/R`
//! ([`WindowEstimate::relative_std_error`]). With `k = 64` and `p = 0.3` that is 19 %
//! per window, and 4.3 % over the 20 windows of a 1 s epoch of 50 ms windows. A page
//! that is touched between the window's sampling and its drop is missed (the drop
//! comes a few microseconds after the choice), and hits take one extra fault each:
//! `k` faults per window at most. The error depends on the hits `k·p`, the cost too
//! (each hit is a fault of the touching thread, 20–50 µs on a VM: 64 pages per 50 ms
//! window cost GUPS 5–10 % of its throughput here, 16 pages about 1 %), so the
//! manager sizes `k` for about 16 hits per window from the hit share of past windows
//! (`TierConfig::sample_target_hits`): with `p = 0.85` that is `k = 19` and 9 % per
//! window, 2 % per 1 s epoch; a sparse workload gets up to 64 pages.
//!
//! **Per-page samples (hotness bins).** MaxMem bins pages by their share of PEBS
//! samples, which every page gets in proportion to its accesses whatever its tier.
//! Here a slow page is seen on every touch (its fault) and a resident page only when
//! it is among the window's `k` of `R` sampled: counting both as they come would rank
//! a page that faults once above a resident page touched in every window, and make
//! the hottest resident pages the first victims. So a slow fault enters the per-page
//! samples only with probability `k/R` (the window's), like a resident page's touch:
//! a page's count then estimates `k/R` × the windows it was touched in, in either
//! tier. The count of slow touches behind `a_miss` stays exact.

/// One sampling window's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowEstimate {
    /// Resident pages when the sample was taken (`R`).
    pub resident: u64,
    /// Pages sampled (`k`).
    pub sampled: u64,
    /// Sampled pages touched before the window ended (`h`).
    pub hits: u64,
}

impl WindowEstimate {
    /// `Ĥ = h·R/k`: resident pages touched in the window (0 without a sample).
    pub fn estimate(&self) -> f64 {
        if self.sampled == 0 {
            0.0
        } else {
            self.hits as f64 * self.resident as f64 / self.sampled as f64
        }
    }

    /// The relative standard error of [`WindowEstimate::estimate`],
    /// `sqrt((1 − p)/(k·p) · (R − k)/(R − 1))`, with `p` taken as `h/k`; `None`
    /// without hits (the error of an estimate of 0 is not relative).
    pub fn relative_std_error(&self) -> Option<f64> {
        if self.hits == 0 || self.sampled == 0 {
            return None;
        }
        let k = self.sampled as f64;
        let r = self.resident as f64;
        let p = self.hits as f64 / k;
        let fpc = if r > 1.0 { (r - k) / (r - 1.0) } else { 0.0 };
        Some(((1.0 - p) / (k * p) * fpc.max(0.0)).sqrt())
    }
}

/// SplitMix64, the sampler's random source: fast, and seeded so tests are exact.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// Chooses up to `k` distinct items uniformly at random from `candidates`
/// (Floyd's algorithm over indices, `O(k)` draws).
pub fn choose<T: Copy + Ord>(rng: &mut Rng, candidates: &[T], k: usize) -> Vec<T> {
    let n = candidates.len();
    let k = k.min(n);
    let mut picked = std::collections::BTreeSet::new();
    for j in (n - k)..n {
        let t = rng.below(j as u64 + 1) as usize;
        if !picked.insert(t) {
            picked.insert(j);
        }
    }
    picked.into_iter().map(|i| candidates[i]).collect()
}

/// Chooses `k` distinct indices of `0..n` uniformly at random among those for which
/// `keep` holds, by rejection: uniform draws from `0..n`, keeping each qualifying
/// index not drawn before, until `k` are kept. Cheap when most indices qualify (a
/// region mostly resident: `O(k·n/m)` draws for `m` qualifying indices) and it never
/// builds the list of candidates. Returns the indices in ascending order, or `None`
/// once `max_draws` draws did not find `k` (the caller then falls back to
/// [`choose`] over the list of candidates).
pub fn choose_by_rejection(
    rng: &mut Rng,
    n: usize,
    k: usize,
    max_draws: usize,
    keep: impl Fn(usize) -> bool,
) -> Option<Vec<usize>> {
    let mut picked = std::collections::BTreeSet::new();
    if k == 0 {
        return Some(Vec::new());
    }
    if n == 0 {
        return None;
    }
    for _ in 0..max_draws {
        let i = rng.below(n as u64) as usize;
        if keep(i) && picked.insert(i) && picked.len() == k {
            return Some(picked.into_iter().collect());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_and_error_by_hand() {
        // R = 1000 resident, k = 50 sampled, 15 hits: Ĥ = 15·1000/50 = 300.
        // p = 0.3: sqrt(0.7/(50·0.3) · 950/999) = sqrt(0.046667 · 0.950951) = 0.2107.
        let w = WindowEstimate {
            resident: 1000,
            sampled: 50,
            hits: 15,
        };
        assert_eq!(w.estimate(), 300.0);
        assert!((w.relative_std_error().unwrap() - 0.2107).abs() < 1e-3);
        // Sampling everything: exact, no error.
        let all = WindowEstimate {
            resident: 50,
            sampled: 50,
            hits: 20,
        };
        assert_eq!(all.estimate(), 20.0);
        assert_eq!(all.relative_std_error(), Some(0.0));
        assert_eq!(WindowEstimate::default().estimate(), 0.0);
        assert_eq!(WindowEstimate::default().relative_std_error(), None);
    }

    #[test]
    fn choose_is_uniform_and_distinct() {
        let mut rng = Rng::new(1);
        let items: Vec<u32> = (0..20).collect();
        let mut counts = [0u32; 20];
        for _ in 0..20_000 {
            let s = choose(&mut rng, &items, 5);
            assert_eq!(s.len(), 5);
            let set: std::collections::BTreeSet<_> = s.iter().collect();
            assert_eq!(set.len(), 5);
            for x in s {
                counts[x as usize] += 1;
            }
        }
        // Each item is chosen with probability 5/20: 5000 expected, sd ≈ 61.
        for c in counts {
            assert!((4700..5300).contains(&c), "{counts:?}");
        }
        assert_eq!(choose(&mut rng, &items, 50).len(), 20);
        assert!(choose(&mut rng, &Vec::<u32>::new(), 3).is_empty());
    }

    #[test]
    fn rejection_choice_is_uniform_over_qualifying_indices() {
        let mut rng = Rng::new(7);
        // Indices divisible by 3 do not qualify.
        let keep = |i: usize| !i.is_multiple_of(3);
        let mut counts = [0u32; 30];
        for _ in 0..20_000 {
            let s = choose_by_rejection(&mut rng, 30, 4, 10_000, keep).unwrap();
            assert_eq!(s.len(), 4);
            assert!(s.windows(2).all(|w| w[0] < w[1]), "ascending, distinct");
            for i in s {
                assert!(keep(i));
                counts[i] += 1;
            }
        }
        // 20 qualifying indices, 4 chosen: 4000 expected each, sd ≈ 57.
        for (i, &c) in counts.iter().enumerate() {
            if keep(i) {
                assert!((3750..4250).contains(&c), "{counts:?}");
            } else {
                assert_eq!(c, 0);
            }
        }
        // Too few qualifying indices for the draws allowed: the caller scans.
        assert_eq!(choose_by_rejection(&mut rng, 1000, 5, 50, |i| i == 3), None);
        assert_eq!(choose_by_rejection(&mut rng, 0, 5, 50, |_| true), None);
        assert_eq!(
            choose_by_rejection(&mut rng, 10, 0, 50, |_| true),
            Some(vec![])
        );
    }

    /// The estimator against known access patterns, drawn exactly as the manager
    /// draws its samples: `R` resident pages of which a known set `H` is touched in
    /// each window. Over many windows the mean of `Ĥ` matches `H` (unbiased) and its
    /// spread matches the documented standard error.
    #[test]
    fn estimator_is_unbiased_with_the_documented_error() {
        let mut rng = Rng::new(42);
        for (r, touched, k) in [
            (10_000usize, 3_000usize, 64usize),
            (2_000, 100, 64),
            (5_000, 4_500, 32),
        ] {
            let pages: Vec<usize> = (0..r).collect();
            let windows = 4000;
            let mut sum = 0.0;
            let mut sum_sq = 0.0;
            for _ in 0..windows {
                let sample = choose(&mut rng, &pages, k);
                // The touched set: pages 0..touched (which pages does not matter to a
                // uniform sample).
                let hits = sample.iter().filter(|&&p| p < touched).count() as u64;
                let e = WindowEstimate {
                    resident: r as u64,
                    sampled: k as u64,
                    hits,
                }
                .estimate();
                sum += e;
                sum_sq += e * e;
            }
            let mean = sum / windows as f64;
            let sd = (sum_sq / windows as f64 - mean * mean).sqrt();
            let h = touched as f64;
            let p = h / r as f64;
            let rse = ((1.0 - p) / (k as f64 * p) * (r - k) as f64 / (r - 1) as f64).sqrt();
            // Mean within 4 standard errors of the mean; spread within 10 % of theory.
            let se_mean = rse * h / (windows as f64).sqrt();
            assert!(
                (mean - h).abs() < 4.0 * se_mean,
                "R={r} H={touched}: mean {mean}"
            );
            assert!(
                (sd / h - rse).abs() < 0.1 * rse,
                "R={r} H={touched}: sd {sd}, rse {rse}"
            );
        }
    }
}
