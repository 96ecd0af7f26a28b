//! Pages copied aside and dropped (MaxMem §3.1's sampling of resident pages, on
//! far memory), for two ends: a sampling window ([`crate::sampler`]: a touch of a
//! sampled page is a sample hit) and probation (a next victim under test: see the
//! manager's documentation, "Probation"). Both go through [`Inner::stash_out`]:
//! protect, copy aside, drop, unprotect. Also the accesses an epoch gathers, and the
//! sizing of the next window's sample from the past ones.

#[cfg(doc)]
use super::TierConfig;
use super::{lock, Inner, PageEvent, PageState};
use crate::region::{runs, PAGE};
use crate::sampler::{choose, choose_by_rejection, WindowEstimate};
use memcolo_policy::tiering::{self, SampleHistory};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;

/// What a region's accesses tell, under one lock: the current epoch's, and the
/// recent past of its sampling.
#[derive(Default)]
pub(super) struct Accesses {
    pub(super) epoch: Epoch,
    pub(super) sizing: Sizing,
}

/// The recent past of a region's sampling, for sizing the next window's sample
/// ([`SampleHistory`], the policy's moving sums), and the windows closed since the
/// last epoch was taken.
#[derive(Default)]
pub(super) struct Sizing {
    pub(super) history: SampleHistory,
    /// Windows closed since the last epoch was taken.
    pub(super) windows: u32,
}

/// The open sampling window.
pub(super) struct Window {
    pub(super) sampled: Vec<usize>,
    pub(super) resident: u64,
    /// Touches of sampled pages seen (one per page per slot when re-armed).
    pub(super) hits: u64,
    /// Distinct sampled pages touched.
    pub(super) touched: HashSet<usize>,
    /// Hit pages are re-armed at slot boundaries.
    pub(super) rearm: bool,
    /// Pages re-armed so far in this window.
    pub(super) rearmed: u64,
}

/// The accesses of the current epoch (see [`super::EpochAccesses`]).
#[derive(Default)]
pub(super) struct Epoch {
    pub(super) fast: f64,
    pub(super) slow: u64,
    pub(super) pages: BTreeMap<usize, u32>,
}

/// Runs of sampled pages handled together: protected one by one, then dropped in one
/// call. Larger groups save TLB shootdowns (one drop per group instead of one per
/// run) but keep a thread that touches one of their pages waiting longer (the
/// group's protections, a few µs each, and its drop).
const SAMPLE_GROUP: usize = 8;

/// What pages copied aside and dropped are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stash {
    /// A sampling window: put back at its end if untouched.
    Sample,
    /// Probation: evicted from the copy if untouched.
    Probation,
}

impl Stash {
    /// The states a page goes through before it is stashed: being copied, being
    /// dropped.
    fn states(self) -> (PageState, PageState) {
        match self {
            Stash::Sample => (PageState::SampleDrop, PageState::SampleDropping),
            Stash::Probation => (PageState::ProbeDrop, PageState::ProbeDropping),
        }
    }

    fn what(self) -> &'static str {
        match self {
            Stash::Sample => "sampling",
            Stash::Probation => "probation",
        }
    }
}

impl Inner {
    /// Tops probation up (see [`TierConfig::probation_pages`]): the placement's next
    /// victims that are mapped are unmapped, their contents kept here. Called by the
    /// eviction workers after each batch, so a region that never evicts has none.
    pub(super) fn refill_probation(&self) {
        let most = self.cfg.probation_pages;
        if most == 0 || !self.cfg.sample_drop {
            return;
        }
        let (held, want) = {
            let t = lock(&self.table);
            let held = t.probation as usize;
            (held, tiering::probation_room(most, t.resident, held))
        };
        if want == 0 {
            return;
        }
        // The next victims start with the pages on probation already (coldest first).
        let next = lock(&self.placement).next_victims(held + want + 16);
        let chosen: Vec<usize> = {
            let mut t = lock(&self.table);
            let mut chosen: Vec<usize> = next
                .into_iter()
                .filter(|&p| p < self.pages && t.st[p] == PageState::Resident)
                .take(want)
                .collect();
            chosen.sort_unstable();
            for &p in &chosen {
                t.apply(p, PageEvent::Probe);
            }
            chosen
        };
        if chosen.is_empty() {
            return;
        }
        let failed = self.stash_out(&chosen, Stash::Probation);
        self.n
            .probation_entries
            .fetch_add((chosen.len() - failed.len()) as u64, Ordering::Relaxed);
    }

    pub(super) fn sample_begin(&self) -> Vec<usize> {
        if lock(&self.table).window.is_some() {
            self.sample_end();
        }
        // Choose, and open the window at once: a hit may come as soon as the first
        // run is dropped.
        let (chosen, resident) = {
            let mut t = lock(&self.table);
            let k = self.sample_size();
            let mut rng = lock(&self.rng);
            // Mostly resident (the common case): draw, never list every page.
            let drawn = if t.resident as usize * 4 >= self.pages {
                choose_by_rejection(&mut rng, self.pages, k, 64 * k + 1024, |p| {
                    t.st[p] == PageState::Resident
                })
            } else {
                None
            };
            let chosen = drawn.unwrap_or_else(|| {
                let resident_pages: Vec<usize> = (0..self.pages)
                    .filter(|&p| t.st[p] == PageState::Resident)
                    .collect();
                choose(&mut rng, &resident_pages, k)
            });
            drop(rng);
            if !self.cfg.sample_drop {
                drop(t);
                for run in runs(&chosen) {
                    let _ = self.protect_runs(&[run], true);
                    let _ = self.protect_runs(&[run], false);
                }
                return Vec::new();
            }
            for &p in &chosen {
                t.apply(p, PageEvent::Sample);
            }
            // The sample frame: resident pages the sampler can draw (pages on
            // probation are not; their touches are counted exactly as hits).
            let resident = t.resident - t.probation;
            // Re-arm only while the region has slow accesses (see
            // `TierConfig::sample_rearm`).
            let rearm = self.cfg.sample_rearm && lock(&self.accesses).sizing.history.slow > 0.0;
            t.window = Some(Window {
                sampled: chosen.clone(),
                resident,
                hits: 0,
                touched: HashSet::new(),
                rearm,
                rearmed: 0,
            });
            (chosen, resident)
        };
        let failed = self.stash_out(&chosen, Stash::Sample);
        let sampled: Vec<usize> = if failed.is_empty() {
            chosen
        } else {
            chosen.into_iter().filter(|p| !failed.contains(p)).collect()
        };
        if let Some(w) = lock(&self.table).window.as_mut() {
            w.sampled.clone_from(&sampled);
        }
        let p = tiering::sample_probability(sampled.len() as u64, resident);
        self.slow_sample_p.store(p.to_bits(), Ordering::Relaxed);
        sampled
    }

    /// Copies `chosen` (sorted pages the caller moved to the first state of `kind`)
    /// aside and drops them from memory, in groups of up to [`SAMPLE_GROUP`] runs:
    /// protect each run, copy its pages aside, drop the group's runs in one call (one
    /// TLB shootdown where the memory allows it, instead of one per run), then lift
    /// the protection (or, where the drop cleared it, just wake the writers that
    /// waited). A thread touching one of the pages waits for its group only. The
    /// pages end sampled or on probation, their copies in the stash; returns the
    /// pages that could not be (left resident).
    pub(super) fn stash_out(&self, chosen: &[usize], kind: Stash) -> Vec<usize> {
        let (drop_st, dropping_st) = kind.states();
        let wp_cleared = self.mem.drop_clears_write_protect();
        let mut failed: Vec<usize> = Vec::new();
        let revert = |rs: &[(usize, usize)], failed: &mut Vec<usize>, why: String| {
            let mut t = lock(&self.table);
            for &(first, count) in rs {
                for p in first..first + count {
                    if t.st[p] == drop_st || t.st[p] == dropping_st {
                        if t.stash.remove(&p).is_some() {
                            self.shadow_forget(p);
                        }
                        t.apply(p, PageEvent::MoveFailed);
                    }
                    failed.push(p);
                }
            }
            drop(t);
            let _ = self.protect_runs(rs, false);
            self.note_error(format!("{}: {why}", kind.what()));
        };
        let all_runs = runs(chosen);
        for group in all_runs.chunks(SAMPLE_GROUP) {
            let mut ready: Vec<(usize, usize)> = Vec::with_capacity(group.len());
            let mut copies: Vec<(usize, Box<[u8]>)> = Vec::new();
            for &run in group {
                if let Err(e) = self.protect_runs(&[run], true) {
                    revert(
                        &[run],
                        &mut failed,
                        format!("write-protecting page {}: {e}", run.0),
                    );
                    continue;
                }
                let mut mine = Vec::with_capacity(run.1);
                let mut read_ok = true;
                for p in run.0..run.0 + run.1 {
                    let mut b = vec![0u8; PAGE].into_boxed_slice();
                    if let Err(e) = self.mem.read_page(p, &mut b) {
                        revert(&[run], &mut failed, format!("reading page {p}: {e}"));
                        read_ok = false;
                        break;
                    }
                    // The copy outlives this agent before the page leaves the region.
                    if let Err(e) = self.shadow_write(p, &b) {
                        for &(q, _) in &mine {
                            self.shadow_forget(q);
                        }
                        revert(&[run], &mut failed, format!("shadowing page {p}: {e}"));
                        read_ok = false;
                        break;
                    }
                    mine.push((p, b));
                }
                if read_ok {
                    ready.push(run);
                    copies.extend(mine);
                }
            }
            if ready.is_empty() {
                continue;
            }
            {
                let mut t = lock(&self.table);
                for (p, b) in copies {
                    if t.st[p] == drop_st {
                        t.stash.insert(p, b);
                        t.apply(p, PageEvent::Copied);
                    } else {
                        // Freed meanwhile (its remove event came after the shadow
                        // write): the copy must not outlive it.
                        self.shadow_forget(p);
                    }
                }
            }
            let done = match self.drop_runs(&ready) {
                Ok(()) => ready.len(),
                Err((done, e)) => {
                    // Still mapped: nothing to sample or test there.
                    revert(
                        &ready[done..],
                        &mut failed,
                        format!("dropping page {}: {e}", ready[done].0),
                    );
                    done
                }
            };
            let dropped = &ready[..done];
            {
                let mut t = lock(&self.table);
                for &(first, count) in dropped {
                    for p in first..first + count {
                        t.apply_if(p, dropping_st, PageEvent::Dropped);
                    }
                }
            }
            if wp_cleared {
                for &(first, count) in dropped {
                    let _ = self.uffd.wake(self.addr(first), (count * PAGE) as u64);
                }
            } else {
                let _ = self.protect_runs(dropped, false);
            }
        }
        // Pages the application freed meanwhile: their faults waited for the drop.
        self.finish_freed(chosen, false);
        failed
    }

    pub(super) fn sample_rearm(&self) -> bool {
        let chosen: Vec<usize> = {
            let mut t = lock(&self.table);
            let t = &mut *t;
            let Some(w) = t.window.as_mut() else {
                return false;
            };
            if !w.rearm {
                return false;
            }
            // Hit since armed, put back, and still plain resident (not evicted,
            // freed or put on probation meanwhile).
            let mut chosen: Vec<usize> = w
                .touched
                .iter()
                .copied()
                .filter(|&p| t.st[p] == PageState::Resident)
                .collect();
            chosen.sort_unstable();
            w.rearmed += chosen.len() as u64;
            for &p in &chosen {
                t.apply(p, PageEvent::Sample);
            }
            chosen
        };
        if !chosen.is_empty() {
            // A page that cannot be re-armed stays resident; its later touches in
            // the window are not seen (an undercount of that page only).
            self.stash_out(&chosen, Stash::Sample);
        }
        true
    }

    pub(super) fn sample_end(&self) -> WindowEstimate {
        let mut t = lock(&self.table);
        let Some(w) = t.window.take() else {
            return WindowEstimate::default();
        };
        for &p in &w.sampled {
            if t.st[p] != PageState::Sampled {
                continue;
            }
            let data = t.stash.remove(&p).expect("stashed sampled page");
            match self.uffd.copy(self.addr(p), &data, false) {
                Ok(_) => {
                    t.apply(p, PageEvent::MapCopy);
                    self.shadow_forget(p);
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    t.apply(p, PageEvent::MapCopy);
                    self.shadow_forget(p);
                }
                Err(e) => {
                    // Leave it sampled: its fault will put it back.
                    t.stash.insert(p, data);
                    tracing::debug!(page = p, error = %e, "tier: putting a sampled page back");
                }
            }
        }
        drop(t);
        let est = WindowEstimate {
            resident: w.resident,
            sampled: w.sampled.len() as u64,
            hits: w.hits,
            pages_hit: w.touched.len() as u64,
        };
        {
            let slow = self.window_slow.swap(0, Ordering::Relaxed);
            let mut a = lock(&self.accesses);
            a.epoch.fast += est.estimate();
            // The hit share sizes the sample: distinct pages, at most 1.
            a.sizing
                .history
                .push_window(est.sampled, est.pages_hit, slow, est.estimate());
            a.sizing.windows += 1;
        }
        self.n.sample_windows.fetch_add(1, Ordering::Relaxed);
        est
    }

    /// Pages to sample in the next window (see [`TierConfig::sample_target_hits`]
    /// and [`TierConfig::sample_fmmr_error`]).
    pub(super) fn sample_size(&self) -> usize {
        let a = lock(&self.accesses);
        tiering::sample_size(
            self.cfg.sample_pages,
            self.cfg.sample_target_hits,
            self.cfg.sample_fmmr_error,
            &a.sizing.history,
        )
    }
}
