//! Pages the application frees (`MADV_DONTNEED`, seen as userfaultfd remove
//! events with [`super::TierConfig::track_remove`]), and the slow-tier copies that
//! outlive their page's move: stale copies of pages mapped again, and copies of
//! freed pages that could not be dropped. No copy may outlive its page where an
//! agent taking the region over ([`super::TierManager::recover`]) could take it for
//! the page. See the manager's documentation, "Application frees".

use super::{lock, Inner, PageEvent, PageState};
use crate::region::PAGE;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// Slow-tier copies that outlive their page's move, and the shadow journal slots
/// that wait for them.
#[derive(Debug, Default)]
pub(super) struct Copies {
    /// Pages brought back whose slow-tier copy could not be dropped then: an
    /// application free of such a page drops the copy again, so that no agent taking
    /// the region over can mistake it for the page.
    stale: HashSet<usize>,
    /// Freed pages whose slow-tier copy could not be dropped (the tier failed): the
    /// shadow is marked tainted until they are, so no recovery takes the copies for
    /// the pages; retried after each eviction batch.
    pending_drops: HashSet<usize>,
    /// Journal ranges (region offsets) whose remove event freed pages still being
    /// moved: each slot is cleared once the last of its pages has no copy left.
    deferred_clears: Vec<(u64, u64, HashSet<usize>)>,
}

impl Inner {
    pub(super) fn on_remove(&self, start: u64, end: u64) {
        {
            // Our own drop: consume its record (the kernel lets `madvise` return as
            // soon as the event is read, so the dropping worker cannot remove it).
            let mut own = lock(&self.own_drops);
            if let Some(k) = own.iter().position(|&(s, e)| s <= start && end <= e) {
                own.swap_remove(k);
                return;
            }
        }
        let lo = start.max(self.base);
        let hi = end.min(self.addr(self.pages));
        if lo >= hi {
            return;
        }
        let first = ((lo - self.base) as usize) / PAGE;
        let last = ((hi - self.base) as usize).div_ceil(PAGE);
        let mut dropped_stored = Vec::new();
        let mut freed = Vec::new();
        let mut unshadow = Vec::new();
        let mut in_flight = HashSet::new();
        {
            let mut t = lock(&self.table);
            for i in first..last {
                match t.st[i] {
                    PageState::Untouched | PageState::Lost | PageState::Freeing => continue,
                    PageState::Stored | PageState::Dropping => dropped_stored.push(i),
                    PageState::Sampled
                    | PageState::SampleDropping
                    | PageState::Probation
                    | PageState::ProbeDropping
                    | PageState::ProbeDrop
                    | PageState::Expiring => {
                        // (An expiring page's copy is the worker's; it drops the
                        // slow-tier copy when it finds the page freed.)
                        t.stash.remove(&i);
                        unshadow.push(i);
                    }
                    // (Its copy may be in the shadow already.)
                    PageState::SampleDrop => unshadow.push(i),
                    // (Loading: only a prefetch; a fault's load runs on this thread.)
                    PageState::Resident | PageState::Evicting | PageState::Loading => {}
                }
                // A page a worker is moving keeps faults waiting (freeing) until the
                // worker has dropped the copy it made.
                if t.apply(i, PageEvent::Free) == PageState::Freeing {
                    in_flight.insert(i);
                }
                freed.push(i);
            }
        }
        {
            // Mapped pages with a copy left in the slow tier lose it too.
            let mut c = lock(&self.copies);
            if !c.stale.is_empty() {
                for &i in &freed {
                    if c.stale.remove(&i) {
                        dropped_stored.push(i);
                    }
                }
            }
        }
        let mut undropped = Vec::new();
        for i in dropped_stored {
            if self.tier.remove(self.key(i)).is_err() {
                undropped.push(i);
            }
        }
        self.note_undropped(&undropped);
        for i in unshadow {
            self.shadow_forget(i);
        }
        // Every copy of the range is gone: its journal slot is done (see
        // `crate::shadow`). The fault thread handles faults and remove events in
        // order, so no copy of these pages was made since; pages a worker is still
        // moving clear it when the worker is done with them.
        if let Some(sh) = &self.shadow {
            let (s, e) = (
                start.saturating_sub(self.base),
                end.saturating_sub(self.base),
            );
            if in_flight.is_empty() {
                sh.clear_remove(s, e);
            } else {
                lock(&self.copies).deferred_clears.push((s, e, in_flight));
            }
        }
        self.n
            .freed
            .fetch_add(freed.len() as u64, Ordering::Relaxed);
        let mut pl = lock(&self.placement);
        for i in freed {
            pl.freed(i);
        }
    }

    /// Pages of `pages` the application freed while this worker moved them
    /// ([`PageState::Freeing`]): the copy the move made is dropped (`slow`: from the slow
    /// tier too), then the page is untouched and its waiting faults are woken, and
    /// journal slots waiting for it are cleared.
    pub(super) fn finish_freed(&self, pages: &[usize], slow: bool) {
        let freeing: Vec<usize> = {
            let t = lock(&self.table);
            pages
                .iter()
                .copied()
                .filter(|&p| t.st[p] == PageState::Freeing)
                .collect()
        };
        if freeing.is_empty() {
            return;
        }
        for &p in &freeing {
            if slow {
                self.drop_copy(p);
            }
            self.shadow_forget(p);
        }
        {
            let mut t = lock(&self.table);
            for &p in &freeing {
                t.apply_if(p, PageState::Freeing, PageEvent::CopyGone);
            }
        }
        for &p in &freeing {
            let _ = self.uffd.wake(self.addr(p), PAGE as u64);
        }
        if let Some(sh) = &self.shadow {
            let mut c = lock(&self.copies);
            c.deferred_clears.retain_mut(|(s, e, left)| {
                for p in &freeing {
                    left.remove(p);
                }
                if left.is_empty() {
                    sh.clear_remove(*s, *e);
                }
                !left.is_empty()
            });
        }
    }

    /// Drops the slow-tier copy of a page just mapped (still `loading`).
    pub(super) fn drop_copy(&self, i: usize) {
        if let Err(e) = self.tier.remove(self.key(i)) {
            // While the page is mapped a stale copy costs slow-tier space only (the
            // next eviction overwrites it); it is dropped again if the application
            // frees the page.
            tracing::debug!(page = i, error = %e, "tier: dropping a slow-tier copy");
            self.note_stale(&[i]);
        }
    }

    /// Pages `pages`, mapped, may have a copy in the slow tier.
    pub(super) fn note_stale(&self, pages: &[usize]) {
        if !pages.is_empty() && self.tier.durable() {
            lock(&self.copies).stale.extend(pages.iter().copied());
        }
    }

    /// Pages `pages` were just stored: whatever copy they had is replaced.
    pub(super) fn forget_stale(&self, pages: &[usize]) {
        let mut c = lock(&self.copies);
        if !c.stale.is_empty() {
            for p in pages {
                c.stale.remove(p);
            }
        }
        if !c.pending_drops.is_empty() {
            for p in pages {
                c.pending_drops.remove(p);
            }
            if c.pending_drops.is_empty() {
                if let Some(sh) = &self.shadow {
                    sh.set_tainted(false);
                }
            }
        }
    }

    /// Freed pages `pages` keep a slow-tier copy that could not be dropped.
    pub(super) fn note_undropped(&self, pages: &[usize]) {
        if pages.is_empty() || !self.tier.durable() {
            return;
        }
        lock(&self.copies)
            .pending_drops
            .extend(pages.iter().copied());
        if let Some(sh) = &self.shadow {
            sh.set_tainted(true);
        }
        self.note_error(format!(
            "dropping the slow-tier copies of {} freed pages failed; retried after each eviction",
            pages.len()
        ));
    }

    /// Tries again to drop the copies of [`Copies::pending_drops`]. A page still
    /// untouched is held freeing meanwhile (its faults wait); one faulted in since
    /// keeps its copy as a stale one (dropped if it is freed again, replaced if
    /// it is stored).
    pub(super) fn retry_pending_drops(&self) {
        let pages: Vec<usize> = lock(&self.copies).pending_drops.iter().copied().collect();
        if pages.is_empty() {
            return;
        }
        let mut held = Vec::new();
        let mut mapped = Vec::new();
        {
            let mut t = lock(&self.table);
            for &p in &pages {
                match t.st[p] {
                    PageState::Untouched => {
                        t.apply(p, PageEvent::HoldForDrop);
                        held.push(p);
                    }
                    PageState::Resident => mapped.push(p),
                    _ => {}
                }
            }
        }
        let mut done: Vec<usize> = mapped.clone();
        for &p in &held {
            if self.tier.remove(self.key(p)).is_ok() {
                done.push(p);
            }
        }
        {
            let mut c = lock(&self.copies);
            c.stale.extend(mapped.iter().copied());
            for p in &done {
                c.pending_drops.remove(p);
            }
            if c.pending_drops.is_empty() {
                if let Some(sh) = &self.shadow {
                    sh.set_tainted(false);
                }
            }
        }
        self.finish_freed(&held, false);
    }
}
