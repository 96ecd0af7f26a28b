//! Each simulated process's allocator heap in huge pages, with libmemcolo's own
//! adaptive subrelease decisions ([`crate::subrelease`], the allocator's C file)
//! deciding what is returned to the OS, for the fleet's huge page coverage and
//! realized fragmentation (TCMalloc-AS, Maas et al. ISMM'21 §5).
//!
//! The heap ([`PageHeap`]) counts 4 KiB pages on 2 MiB huge pages ([`HUGE_PAGE_PAGES`])
//! in two kinds:
//! - **intact** huge pages: never subreleased since they were last mapped whole, so
//!   backed by one huge page (THP);
//! - **broken** huge pages: some of their free pages were subreleased
//!   (`MADV_DONTNEED`), so the kernel backs the rest with 4 KiB pages; a broken huge
//!   page is whole again only once it is empty and released whole.
//!
//! **Huge page coverage** is ISMM'21 §5's (and libmemcolo's `hugepage_coverage`,
//! `alloc/include/memcolo.h`): the share of used (allocated) memory that lies on
//! intact huge pages, here time-weighted over the run (Σ intact used pages over the
//! seconds / Σ used pages). **Realized fragmentation** is §3.2's: the least
//! free-but-mapped memory over the last `T_schedule`, as the subrelease unit reports
//! it, sampled every minute and given as a share of the used memory at the samples.
//!
//! The model, and what is assumed (no fleet profile is at hand to fit it):
//! - **Demand.** A process's heap holds its anonymous footprint in the node model
//!   ([`crate::Node::anon_footprints`]) at its peaks and `1 − a` of it in troughs: a
//!   two-state churn (peak/trough) with exponential durations, per process a
//!   trough depth `a` and mean peak and trough durations drawn from [`Churn`]'s
//!   ranges. The heap observes the node model and does not feed back into it (the
//!   node's memory is the footprint, i.e. the heap's peak).
//! - **Allocation** fills free pages of intact huge pages first, then the backed then
//!   the released free pages of broken ones (refaulted as 4 KiB pages: they stay
//!   broken), then maps new intact huge pages (TCMalloc's `HugePageFiller` prefers
//!   pages that were not released and maps a new huge page only when none fits).
//! - **Frees** are spread over the huge pages in proportion to their used pages (a
//!   non-moving allocator: freed objects are scattered); a kind whose used pages reach
//!   0 is released whole. Broken huge pages drain as their objects die and new ones
//!   go to the fullest pages: a share [`Churn::heal_per_s`] of them empties each
//!   second, its used pages allocated again as above, and is released whole.
//! - **Release.** Once a second the subrelease unit gives the page budget
//!   ([`Subrelease::release_budget`]: the rate, capped under the peak demand of Δ);
//!   it is taken from the backed free pages of broken huge pages first (no coverage
//!   lost), then by breaking intact huge pages, the sparsest first: each holds
//!   [`Churn::free_share_released`] of a huge page free (a trough's frees concentrate
//!   on the huge pages its peak filled), or the intact average if that is more.

use crate::subrelease::{Settings, Stats, Subrelease};
use rand_xoshiro::rand_core::{Rng as _, SeedableRng};
use rand_xoshiro::SplitMix64;
use serde::{Deserialize, Serialize};

/// Pages of 4 KiB per 2 MiB huge page.
pub const HUGE_PAGE_PAGES: u64 = 512;

/// Bytes per page.
pub const PAGE_BYTES: u64 = crate::subrelease::PAGE_BYTES;

/// `a * b / c` without overflow (c > 0).
fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    (u128::from(a) * u128::from(b) / u128::from(c)) as u64
}

/// One heap's pages on huge pages (module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageHeap {
    /// Intact huge pages and the used pages on them.
    pub intact_hp: u64,
    pub intact_used: u64,
    /// Broken huge pages, the used pages on them and their released (unbacked) pages.
    pub broken_hp: u64,
    pub broken_used: u64,
    pub broken_released: u64,
    /// Pages subreleased so far.
    pub subreleased_pages: u64,
    /// Huge pages broken so far.
    pub broken_total: u64,
}

impl PageHeap {
    /// Used (allocated) pages.
    pub fn used(&self) -> u64 {
        self.intact_used + self.broken_used
    }

    /// Free pages of intact huge pages (all backed).
    fn intact_free(&self) -> u64 {
        self.intact_hp * HUGE_PAGE_PAGES - self.intact_used
    }

    /// Backed free pages of broken huge pages.
    fn broken_free(&self) -> u64 {
        self.broken_hp * HUGE_PAGE_PAGES - self.broken_used - self.broken_released
    }

    /// Free but mapped (backed) pages: what a release can return.
    pub fn free_backed(&self) -> u64 {
        self.intact_free() + self.broken_free()
    }

    /// Share of used pages on intact huge pages (1 when nothing is used).
    pub fn coverage(&self) -> f64 {
        let u = self.used();
        if u == 0 {
            1.0
        } else {
            self.intact_used as f64 / u as f64
        }
    }

    fn allocate(&mut self, mut d: u64) {
        let x = d.min(self.intact_free());
        self.intact_used += x;
        d -= x;
        let x = d.min(self.broken_free());
        self.broken_used += x;
        d -= x;
        let x = d.min(self.broken_released);
        self.broken_released -= x;
        self.broken_used += x;
        d -= x;
        if d > 0 {
            self.intact_hp += d.div_ceil(HUGE_PAGE_PAGES);
            self.intact_used += d;
        }
    }

    fn drop_empty(&mut self) {
        if self.broken_used == 0 {
            self.broken_hp = 0;
            self.broken_released = 0;
        }
        if self.intact_used == 0 {
            self.intact_hp = 0;
        }
    }

    /// Brings the used pages to `target`: allocations or scattered frees (module docs).
    pub fn set_used(&mut self, target: u64) {
        let used = self.used();
        if target >= used {
            self.allocate(target - used);
            return;
        }
        let d = used - target;
        let from_broken = mul_div(d, self.broken_used, used).min(self.broken_used);
        let from_intact = (d - from_broken).min(self.intact_used);
        self.broken_used -= from_broken;
        self.intact_used -= from_intact;
        let rest = d - from_broken - from_intact;
        self.broken_used -= rest.min(self.broken_used);
        self.drop_empty();
    }

    /// Empties `h` broken huge pages (their objects died and were allocated again
    /// elsewhere) and releases them whole.
    pub fn heal(&mut self, h: u64) {
        let h = h.min(self.broken_hp);
        if h == 0 {
            return;
        }
        let r = self.broken_hp - h;
        let keep_used = (mul_div(self.broken_used, r, self.broken_hp)).min(r * HUGE_PAGE_PAGES);
        let keep_rel =
            mul_div(self.broken_released, r, self.broken_hp).min(r * HUGE_PAGE_PAGES - keep_used);
        let moved = self.broken_used - keep_used;
        self.broken_hp = r;
        self.broken_used = keep_used;
        self.broken_released = keep_rel;
        self.allocate(moved);
        self.drop_empty();
    }

    /// Subreleases up to `pages` free pages, breaking intact huge pages that hold
    /// `free_per_hp` free pages each (at least the intact average, at most all of
    /// them); returns the pages released.
    pub fn release(&mut self, pages: u64, free_per_hp: u64) -> u64 {
        let mut rem = pages;
        let x = rem.min(self.broken_free());
        self.broken_released += x;
        rem -= x;
        let fi = self.intact_free();
        if rem > 0 && fi > 0 {
            if self.intact_used == 0 {
                // empty huge pages go whole: nothing breaks
                let h = rem.div_ceil(HUGE_PAGE_PAGES).min(self.intact_hp);
                self.intact_hp -= h;
                rem -= rem.min(h * HUGE_PAGE_PAGES);
            } else {
                let per = (fi as f64 / self.intact_hp as f64)
                    .max(free_per_hp.min(fi) as f64)
                    .min(HUGE_PAGE_PAGES as f64);
                let h = ((rem as f64 / per).ceil() as u64).clamp(1, self.intact_hp);
                let r = self.intact_hp - h;
                let mut moved_used = self.intact_used
                    - mul_div(self.intact_used, r, self.intact_hp).min(r * HUGE_PAGE_PAGES);
                moved_used = moved_used.min(h * HUGE_PAGE_PAGES);
                let moved_free = h * HUGE_PAGE_PAGES - moved_used;
                self.intact_hp -= h;
                self.intact_used -= moved_used;
                self.broken_hp += h;
                self.broken_used += moved_used;
                let x = rem.min(moved_free);
                self.broken_released += x;
                rem -= x;
                self.broken_total += h;
            }
        }
        let done = pages - rem;
        self.subreleased_pages += done;
        done
    }
}

/// The heaps' demand churn and the draining of broken huge pages (module docs); all
/// assumed. Per process, each `[lo, hi]` pair is the range of a uniform draw.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Churn {
    /// Trough depth, share of the footprint.
    pub trough_depth: [f64; 2],
    /// Mean peak duration, seconds.
    pub peak_s: [f64; 2],
    /// Mean trough duration, seconds.
    pub trough_s: [f64; 2],
    /// Share of broken huge pages emptied per second.
    pub heal_per_s: f64,
    /// Free pages on the intact huge pages a release breaks, share of a huge page:
    /// a trough's frees are not spread evenly but concentrate on the huge pages its
    /// peak filled, and the release takes the sparsest first (TCMalloc's
    /// `HugePageFiller`); the intact average when that is more.
    pub free_share_released: f64,
}

impl Default for Churn {
    fn default() -> Self {
        Churn {
            trough_depth: [0.05, 0.30],
            peak_s: [5.0, 60.0],
            trough_s: [10.0, 300.0],
            heal_per_s: 1.0 / 3600.0,
            free_share_released: 0.5,
        }
    }
}

/// One process's heap: the pages, the subrelease decisions and the churn state.
pub struct ProcHeap {
    pub heap: PageHeap,
    pub sr: Subrelease,
    rng: SplitMix64,
    depth: f64,
    peak_s: f64,
    trough_s: f64,
    in_peak: bool,
    heal_carry: f64,
}

impl ProcHeap {
    /// A heap drawing its churn from `churn` with `seed`.
    pub fn new(settings: Settings, churn: &Churn, seed: u64) -> ProcHeap {
        let mut rng = SplitMix64::seed_from_u64(seed);
        let mut draw = |r: [f64; 2]| {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            r[0] + (r[1] - r[0]) * u
        };
        let depth = draw(churn.trough_depth);
        let peak_s = draw(churn.peak_s).max(1.0);
        let trough_s = draw(churn.trough_s).max(1.0);
        ProcHeap {
            heap: PageHeap::default(),
            sr: Subrelease::new(settings),
            rng,
            depth,
            peak_s,
            trough_s,
            in_peak: true,
            heal_carry: 0.0,
        }
    }

    fn unit(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// One second at `now_ms` with the process's footprint `footprint_bytes`: churn,
    /// draining, the demand recorded, then the periodic release decision carried out.
    pub fn tick(&mut self, now_ms: u64, footprint_bytes: u64, churn: &Churn) {
        let mean = if self.in_peak {
            self.peak_s
        } else {
            self.trough_s
        };
        if self.unit() < 1.0 / mean {
            self.in_peak = !self.in_peak;
        }
        let pages = footprint_bytes / PAGE_BYTES;
        let demand = if self.in_peak {
            pages
        } else {
            (pages as f64 * (1.0 - self.depth)) as u64
        };
        self.heal_carry += self.heap.broken_hp as f64 * churn.heal_per_s;
        let h = self.heal_carry.floor();
        self.heal_carry -= h;
        self.heap.heal(h as u64);
        self.heap.set_used(demand);
        let (u, f) = (self.heap.used() as usize, self.heap.free_backed() as usize);
        self.sr.record(now_ms, u, f);
        if let Some(p) = self.sr.release_budget(now_ms, u, f, 0) {
            if p > 0 {
                let per =
                    (churn.free_share_released.clamp(0.0, 1.0) * HUGE_PAGE_PAGES as f64) as u64;
                self.heap.release(p as u64, per);
            }
            self.sr
                .note(self.heap.used() as usize, self.heap.free_backed() as usize);
        }
    }

    /// The subrelease unit's figures now.
    pub fn stats(&mut self, now_ms: u64) -> Stats {
        let (u, f) = (self.heap.used() as usize, self.heap.free_backed() as usize);
        self.sr.stats(now_ms, u, f)
    }
}

/// A node's heap figures, summed over its processes and seconds (pages).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct HeapStats {
    /// Σ over seconds and heaps of used pages, and of those on intact huge pages.
    pub used_page_s: f64,
    pub intact_used_page_s: f64,
    /// Σ over seconds and heaps of free but mapped pages.
    pub free_page_s: f64,
    /// Σ over minute samples and heaps of realized fragmentation, and of used pages.
    pub rf_pages_sampled: f64,
    pub used_pages_sampled: f64,
    pub subreleased_pages: u64,
    pub hugepages_broken: u64,
    pub skipped_pages: u64,
    pub correct_pages: u64,
    pub incorrect_pages: u64,
}

impl HeapStats {
    fn add_final(&mut self, h: &mut ProcHeap, now_ms: u64) {
        let s = h.stats(now_ms);
        self.subreleased_pages += h.heap.subreleased_pages;
        self.hugepages_broken += h.heap.broken_total;
        self.skipped_pages += s.skipped_pages;
        self.correct_pages += s.correct_pages;
        self.incorrect_pages += s.incorrect_pages;
    }

    /// Adds another node's figures.
    pub fn merge(&mut self, o: &HeapStats) {
        self.used_page_s += o.used_page_s;
        self.intact_used_page_s += o.intact_used_page_s;
        self.free_page_s += o.free_page_s;
        self.rf_pages_sampled += o.rf_pages_sampled;
        self.used_pages_sampled += o.used_pages_sampled;
        self.subreleased_pages += o.subreleased_pages;
        self.hugepages_broken += o.hugepages_broken;
        self.skipped_pages += o.skipped_pages;
        self.correct_pages += o.correct_pages;
        self.incorrect_pages += o.incorrect_pages;
    }

    /// Huge page coverage, time-weighted (module docs).
    pub fn coverage(&self) -> f64 {
        if self.used_page_s > 0.0 {
            self.intact_used_page_s / self.used_page_s
        } else {
            1.0
        }
    }

    /// Realized fragmentation over used memory at the minute samples.
    pub fn realized_fragmentation_ratio(&self) -> f64 {
        if self.used_pages_sampled > 0.0 {
            self.rf_pages_sampled / self.used_pages_sampled
        } else {
            0.0
        }
    }

    /// Free but mapped memory over used memory, time-weighted.
    pub fn free_ratio(&self) -> f64 {
        if self.used_page_s > 0.0 {
            self.free_page_s / self.used_page_s
        } else {
            0.0
        }
    }
}

/// The heaps of one node's processes (index = the process's index in the node).
pub struct NodeHeaps {
    settings: Settings,
    churn: Churn,
    seed: u64,
    heaps: Vec<Option<ProcHeap>>,
    stats: HeapStats,
    next_second_ms: u64,
}

impl NodeHeaps {
    /// Heaps for a node seeded `seed` (each process's churn from `seed` and its index,
    /// apart from the node model's own draws).
    pub fn new(settings: Settings, churn: Churn, seed: u64) -> NodeHeaps {
        NodeHeaps {
            settings,
            churn,
            seed,
            heaps: Vec::new(),
            stats: HeapStats::default(),
            next_second_ms: 0,
        }
    }

    /// Observes the node at `now_ms` (called after every step; acts once per simulated
    /// second): every process with a footprint has a heap, a process without one (not
    /// started, stopped, killed) has its heap's figures added and the heap dropped.
    pub fn observe(&mut self, now_ms: u64, footprints: impl Iterator<Item = u64>) {
        if now_ms < self.next_second_ms {
            return;
        }
        self.next_second_ms = now_ms - now_ms % 1000 + 1000;
        // epoch 0 starts at now_ms; the unit wants times above 0
        let t = now_ms + 1;
        let sample = (now_ms / 1000).is_multiple_of(60);
        for (i, fp) in footprints.enumerate() {
            if i >= self.heaps.len() {
                self.heaps.resize_with(i + 1, || None);
            }
            if fp < PAGE_BYTES {
                if let Some(mut h) = self.heaps[i].take() {
                    self.stats.add_final(&mut h, t);
                }
                continue;
            }
            let h = self.heaps[i].get_or_insert_with(|| {
                ProcHeap::new(
                    self.settings,
                    &self.churn,
                    self.seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                )
            });
            h.tick(t, fp, &self.churn);
            self.stats.used_page_s += h.heap.used() as f64;
            self.stats.intact_used_page_s += h.heap.intact_used as f64;
            self.stats.free_page_s += h.heap.free_backed() as f64;
            if sample {
                let s = h.stats(t);
                self.stats.rf_pages_sampled += s.realized_fragmentation_pages as f64;
                self.stats.used_pages_sampled += h.heap.used() as f64;
            }
        }
    }

    /// The figures, with the heaps still alive folded in at `now_ms`.
    pub fn finish(mut self, now_ms: u64) -> HeapStats {
        for h in std::mem::take(&mut self.heaps).iter_mut().flatten() {
            self.stats.add_final(h, now_ms + 1);
        }
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(h: &PageHeap) {
        assert!(h.intact_used <= h.intact_hp * HUGE_PAGE_PAGES, "{h:?}");
        assert!(
            h.broken_used + h.broken_released <= h.broken_hp * HUGE_PAGE_PAGES,
            "{h:?}"
        );
    }

    #[test]
    fn allocation_fills_intact_then_broken_then_maps() {
        let mut h = PageHeap::default();
        h.set_used(1000);
        assert_eq!((h.intact_hp, h.intact_used, h.free_backed()), (2, 1000, 24));
        h.set_used(500);
        assert_eq!(h.used(), 500);
        assert_eq!(h.free_backed(), 524);
        // releasing breaks intact huge pages: their used pages leave the coverage
        assert_eq!(h.release(300, 0), 300);
        check(&h);
        assert!(h.broken_hp >= 1 && h.coverage() < 1.0, "{h:?}");
        let broken_used = h.broken_used;
        // demand back: the released pages of broken huge pages are refaulted (still broken)
        h.set_used(1000);
        check(&h);
        assert!(h.broken_used > broken_used);
        assert_eq!(h.used(), 1000);
        // draining every broken huge page makes the heap whole again
        h.heal(h.broken_hp);
        check(&h);
        assert_eq!((h.broken_hp, h.coverage()), (0, 1.0));
        assert_eq!(h.used(), 1000);
        h.set_used(0);
        assert_eq!(
            h,
            PageHeap {
                subreleased_pages: 300,
                broken_total: h.broken_total,
                ..Default::default()
            }
        );
    }

    #[test]
    fn invariants_hold_under_random_operations() {
        let mut rng = SplitMix64::seed_from_u64(3);
        for _ in 0..200 {
            let mut h = PageHeap::default();
            for _ in 0..500 {
                let x = rng.next_u64();
                match x % 4 {
                    0 | 1 => h.set_used((x >> 8) % 100_000),
                    2 => {
                        let f = h.free_backed();
                        let got = h.release((x >> 8) % 5_000, (x >> 40) % 600);
                        assert!(got <= f, "{h:?}");
                    }
                    _ => h.heal((x >> 8) % (h.broken_hp + 2)),
                }
                check(&h);
            }
        }
    }

    /// The A/B's mechanism on one heap: short troughs under Δ = 60 s keep their huge
    /// pages intact; with Δ = 0 the release breaks them and demand comes back on
    /// broken pages.
    #[test]
    fn skip_subrelease_keeps_coverage_through_short_troughs() {
        let run = |delta: u64| {
            let mut h = ProcHeap::new(
                Settings {
                    skip_subrelease_s: delta,
                    release_rate_bytes: 64 << 20,
                    ..Settings::default()
                },
                &Churn::default(),
                1,
            );
            h.depth = 0.3;
            let mut cov = 0.0;
            for s in 0..3600u64 {
                // 30 s peaks and 20 s troughs, by hand
                h.in_peak = s % 50 < 30;
                h.peak_s = 1e12;
                h.trough_s = 1e12;
                h.tick(
                    1 + s * 1000,
                    1 << 30,
                    &Churn {
                        heal_per_s: 0.0,
                        ..Churn::default()
                    },
                );
                check(&h.heap);
                cov += h.heap.coverage();
            }
            (cov / 3600.0, h.stats(3_601_000))
        };
        let (c0, s0) = run(0);
        let (c60, s60) = run(60);
        assert!(c60 > 0.99, "Δ = 60 s coverage {c60}");
        assert!(c0 < 0.9, "Δ = 0 coverage {c0}");
        assert_eq!(s0.skipped_pages, 0);
        assert!(s60.skipped_pages > 0 && s60.correct_pages > 0);
        // the price: memory kept mapped in the troughs
        assert!(s60.realized_fragmentation_pages >= s0.realized_fragmentation_pages);
    }
}
