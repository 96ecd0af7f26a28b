//! One managed process's pages: their tiers, lazily cooled sample counts and hotness
//! bins (MaxMem §3.2, rule T6), and the process's targets and allocation.

use super::types::*;
use crate::types::Pid;
use std::collections::{BTreeSet, HashMap, VecDeque};

/// A page's tier and its lazily cooled sample count.
#[derive(Clone, Copy, Debug)]
pub(super) struct PageRec {
    pub(super) tier: Tier,
    /// Sample count as of cooling generation `gen`.
    pub(super) count: u64,
    pub(super) gen: u64,
    /// When the page last entered its bin list (sampled, moved, or new): the order
    /// within a bin, oldest first (rule T6).
    pub(super) stamp: u64,
}

/// One managed process.
#[derive(Clone, Debug)]
pub(super) struct Proc {
    pub(super) arrival: u64,
    pub(super) t_miss: f64,
    pub(super) a_miss: f64,
    pub(super) measured: bool,
    /// The newest epoch's measured miss ratio `x` (rule T1; 0 for an epoch without
    /// accesses), and the one before: rule T3a's distance and hold.
    pub(super) x: Option<f64>,
    pub(super) prev_x: Option<f64>,
    pub(super) need: Need,
    pub(super) infeasible: bool,
    /// Gave memory away since it was last needy.
    pub(super) gave: bool,
    /// Turned needy after giving memory away (rule T4).
    pub(super) relapsed: bool,
    pub(super) alloc: u64,
    /// Pages per tier.
    pub(super) n: [u64; 2],
    pub(super) pages: HashMap<PageId, PageRec>,
    /// `bins[k][tier]`: pages of bin `k` (0 coldest) in that tier, as
    /// `(stamp, page)`: in the order they entered the list, like the paper's
    /// linked lists.
    pub(super) bins: VecDeque<[BTreeSet<(u64, PageId)>; 2]>,
    /// The next stamp.
    pub(super) clock: u64,
    /// Cooling generation: a count stored at generation `g` is worth
    /// `count >> (gen − g)` now.
    pub(super) gen: u64,
    pub(super) coolings: u64,
    pub(super) cooled_epoch: Option<u64>,
    pub(super) cool_pending: bool,
    /// Pages whose count is at the cooling threshold (kept in the hottest bin).
    pub(super) saturated: BTreeSet<PageId>,
    pub(super) alloc_change: i64,
}

/// The bin of a sample count (rule T6).
pub(super) fn bin_of(count: u64, bins: usize) -> usize {
    if count == 0 {
        0
    } else {
        ((64 - count.leading_zeros()) as usize).min(bins - 1)
    }
}

impl Proc {
    pub(super) fn new(arrival: u64, t_miss: f64, bins: usize) -> Self {
        Proc {
            arrival,
            t_miss,
            a_miss: 0.0,
            measured: false,
            x: None,
            prev_x: None,
            need: Need::Met,
            infeasible: false,
            gave: false,
            relapsed: false,
            alloc: 0,
            n: [0, 0],
            pages: HashMap::new(),
            bins: (0..bins).map(|_| Default::default()).collect(),
            clock: 0,
            gen: 0,
            coolings: 0,
            cooled_epoch: None,
            cool_pending: false,
            saturated: BTreeSet::new(),
            alloc_change: 0,
        }
    }

    pub(super) fn eff(&self, rec: &PageRec) -> u64 {
        let shift = self.gen - rec.gen;
        if shift >= 64 {
            0
        } else {
            rec.count >> shift
        }
    }

    pub(super) fn bin_of_page(&self, page: PageId) -> Option<usize> {
        let rec = self.pages.get(&page)?;
        Some(bin_of(self.eff(rec), self.bins.len()))
    }

    pub(super) fn fast(&self) -> u64 {
        self.n[FAST]
    }

    pub(super) fn slow(&self) -> u64 {
        self.n[SLOW]
    }

    pub(super) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    pub(super) fn insert(&mut self, page: PageId, tier: Tier) {
        let stamp = self.tick();
        let rec = PageRec {
            tier,
            count: 0,
            gen: self.gen,
            stamp,
        };
        self.pages.insert(page, rec);
        self.bins[0][tier.idx()].insert((stamp, page));
        self.n[tier.idx()] += 1;
    }

    pub(super) fn remove(&mut self, page: PageId) -> Option<Tier> {
        let rec = self.pages.remove(&page)?;
        let b = bin_of(self.eff(&rec), self.bins.len());
        self.bins[b][rec.tier.idx()].remove(&(rec.stamp, page));
        self.saturated.remove(&page);
        self.n[rec.tier.idx()] -= 1;
        Some(rec.tier)
    }

    /// Moves `page` to tier `to`, at the end of its bin's list there.
    pub(super) fn move_to(&mut self, page: PageId, to: Tier) {
        let b = self.bin_of_page(page).expect("move of an unknown page");
        let stamp = self.tick();
        let rec = self.pages.get_mut(&page).expect("move of an unknown page");
        let from = rec.tier;
        if from == to {
            return;
        }
        let old = rec.stamp;
        rec.tier = to;
        rec.stamp = stamp;
        self.bins[b][from.idx()].remove(&(old, page));
        self.bins[b][to.idx()].insert((stamp, page));
        self.n[from.idx()] -= 1;
        self.n[to.idx()] += 1;
    }

    /// Moves `page` to the end of its bin's list in its tier (a second chance).
    pub(super) fn requeue(&mut self, page: PageId) -> bool {
        let Some(b) = self.bin_of_page(page) else {
            return false;
        };
        let stamp = self.tick();
        let rec = self.pages.get_mut(&page).expect("known page");
        let (old, tier) = (rec.stamp, rec.tier.idx());
        rec.stamp = stamp;
        self.bins[b][tier].remove(&(old, page));
        self.bins[b][tier].insert((stamp, page));
        true
    }

    /// Halves every count: shifts the bin lists one bin colder (bins 0 and 1 merge)
    /// and puts the saturated pages back in the hottest bin (rule T6).
    pub(super) fn cool(&mut self, epoch: u64) {
        let nb = self.bins.len();
        let [mut f0, mut s0] = self.bins.pop_front().expect("bins");
        {
            let front = self.bins.front_mut().expect("bins");
            for (old, new) in [(&mut f0, FAST), (&mut s0, SLOW)] {
                let dst = &mut front[new];
                if old.len() > dst.len() {
                    std::mem::swap(old, dst);
                }
                dst.extend(std::mem::take(old));
            }
        }
        self.bins.push_back(Default::default());
        self.gen += 1;
        for page in std::mem::take(&mut self.saturated) {
            let rec = self.pages[&page];
            let tier = rec.tier.idx();
            self.bins[nb - 2][tier].remove(&(rec.stamp, page));
            self.bins[nb - 1][tier].insert((rec.stamp, page));
        }
        self.coolings += 1;
        self.cooled_epoch = Some(epoch);
        self.cool_pending = false;
    }

    /// Adds `n` samples to `page` (rule T6); unknown pages are ignored.
    pub(super) fn add_samples(&mut self, page: PageId, n: u32, epoch: u64, threshold: u64) {
        let Some(rec) = self.pages.get(&page).copied() else {
            return;
        };
        if n == 0 {
            return;
        }
        let nb = self.bins.len();
        let tier = rec.tier.idx();
        let mut c = self.eff(&rec);
        self.bins[bin_of(c, nb)][tier].remove(&(rec.stamp, page));
        self.saturated.remove(&page);
        // Sampled just now: the end of its bin's list.
        let stamp = self.tick();
        let rec = PageRec { stamp, ..rec };
        let mut n = n as u64;
        let mut saturate = false;
        if c + n >= threshold {
            n -= threshold - c;
            if self.cooled_epoch != Some(epoch) {
                // The page reaches the threshold: it is put there, then everything
                // cools, leaving it alone in the hottest bin at threshold / 2.
                self.pages.insert(
                    page,
                    PageRec {
                        count: threshold,
                        gen: self.gen,
                        ..rec
                    },
                );
                self.bins[nb - 1][tier].insert((stamp, page));
                self.saturated.insert(page);
                self.cool(epoch);
                self.bins[nb - 1][tier].remove(&(stamp, page));
                c = threshold / 2 + n;
                if c >= threshold {
                    c = threshold;
                    saturate = true;
                }
            } else {
                c = threshold;
                saturate = true;
            }
        } else {
            c += n;
        }
        self.pages.insert(
            page,
            PageRec {
                count: c,
                gen: self.gen,
                ..rec
            },
        );
        self.bins[bin_of(c, nb)][tier].insert((stamp, page));
        if saturate {
            self.saturated.insert(page);
            self.cool_pending = true;
        }
    }

    /// Pages of `tier`, hottest first (bins descending; within a bin, the latest to
    /// enter it first), from bin `min_bin` up.
    pub(super) fn hottest(
        &self,
        tier: usize,
        min_bin: usize,
    ) -> impl Iterator<Item = (usize, PageId)> + '_ {
        (min_bin..self.bins.len())
            .rev()
            .flat_map(move |b| self.bins[b][tier].iter().rev().map(move |&(_, p)| (b, p)))
    }

    /// Pages of `tier`, coldest first (bins ascending; within a bin, the earliest to
    /// enter it first).
    pub(super) fn coldest(&self, tier: usize) -> impl Iterator<Item = (usize, PageId)> + '_ {
        (0..self.bins.len()).flat_map(move |b| self.bins[b][tier].iter().map(move |&(_, p)| (b, p)))
    }

    /// Slow pages worth promoting (sampled: bin >= 1).
    pub(super) fn hot_slow(&self) -> u64 {
        (1..self.bins.len())
            .map(|b| self.bins[b][SLOW].len() as u64)
            .sum()
    }

    pub(super) fn update_miss(&mut self, fast: u64, slow: u64, lambda: f64) {
        let total = fast as u128 + slow as u128;
        self.prev_x = self.x;
        if total == 0 {
            self.a_miss = 0.0;
            self.x = Some(0.0);
        } else {
            let x = slow as f64 / total as f64;
            self.x = Some(x);
            self.a_miss = if self.measured {
                lambda * x + (1.0 - lambda) * self.a_miss
            } else {
                x
            };
        }
        self.a_miss = self.a_miss.clamp(0.0, 1.0);
        self.measured = true;
        self.need = if self.a_miss > self.t_miss {
            Need::Needy
        } else if self.a_miss < self.t_miss {
            Need::Surplus
        } else {
            Need::Met
        };
    }

    /// Rule T3a's hold: the newest measured miss ratio already meets the target, or
    /// is within twice the target and still converging on it, so the EWMA follows
    /// (and the placement settles) without more fast memory.
    pub(super) fn held(&self) -> bool {
        match self.x {
            Some(x) if x <= self.t_miss => true,
            Some(x) => x < 2.0 * self.t_miss && self.converging(),
            None => false,
        }
    }

    /// Rule T3a: the newest measured miss ratio fell in the last epoch by at least a
    /// third of its remaining distance to the target (at that rate it meets the
    /// target within three epochs).
    pub(super) fn converging(&self) -> bool {
        match (self.x, self.prev_x) {
            (Some(x), Some(px)) => x < px && 3.0 * (px - x) >= x - self.t_miss,
            _ => false,
        }
    }

    /// Rule T3a's distance measure: the newest measured miss ratio where it is below
    /// the EWMA (which lags it), else the EWMA.
    pub(super) fn step_miss(&self) -> f64 {
        self.x.map_or(self.a_miss, |x| x.min(self.a_miss))
    }

    pub(super) fn status(&self, pid: Pid) -> ProcStatus {
        ProcStatus {
            pid,
            arrival: self.arrival,
            t_miss: self.t_miss,
            a_miss: self.a_miss,
            need: self.need,
            infeasible: self.infeasible,
            alloc_pages: self.alloc,
            fast_pages: self.fast(),
            slow_pages: self.slow(),
            alloc_change_pages: self.alloc_change,
            coolings: self.coolings,
            bins: self
                .bins
                .iter()
                .map(|b| BinCount {
                    fast: b[FAST].len() as u64,
                    slow: b[SLOW].len() as u64,
                })
                .collect(),
        }
    }
}
