//! The eviction pipeline (MaxMem §3.3, on far memory): the queue of victims and the
//! workers that take batches from it. A worker write-protects a batch's runs,
//! copies the pages out, stores them in the slow tier and waits for the
//! confirmation, drops them from memory (one call per batch where the memory
//! allows), then unprotects and wakes the writers that waited; pages on probation
//! (or sampled) are stored from their stash copies instead. See the manager's
//! documentation, "Eviction".

use super::{is_eagain, lock, Inner, PageEvent, PageState};
#[cfg(doc)]
use crate::region::RegionMemory;
use crate::region::{runs, PAGE};
use crate::{checksum, PageKey};
use memcolo_linux::sched::gettid;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;

/// The eviction queue: victims waiting for a worker, and the tickets of
/// [`super::TierManager::evict`].
pub(super) struct Queue {
    pub(super) pages: VecDeque<usize>,
    /// Batches being handled by a worker.
    pub(super) in_flight: usize,
    /// Pages ever queued, and ever taken into a batch (tickets count these).
    pub(super) queued: u64,
    pub(super) drained: u64,
    /// Ticket of the first page of each batch in flight.
    pub(super) batch_starts: Vec<u64>,
}

impl Queue {
    /// An empty queue.
    pub(super) fn new() -> Self {
        Queue {
            pages: VecDeque::new(),
            in_flight: 0,
            queued: 0,
            drained: 0,
            batch_starts: Vec::new(),
        }
    }

    /// Every page queued before this ticket has been handled.
    pub(super) fn done_below(&self) -> u64 {
        self.batch_starts
            .iter()
            .copied()
            .min()
            .unwrap_or(self.drained)
    }
}

/// Runs a userfaultfd range ioctl from a thread other than the fault thread,
/// retrying while the kernel answers `EAGAIN`: a non-cooperative event (a remove)
/// is pending and the fault thread has not read it yet. Gives up after about 1 s.
fn retry_eagain<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut tries = 0;
    loop {
        match op() {
            Err(e) if is_eagain(&e) && tries < 10_000 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            r => return r,
        }
    }
}

impl Inner {
    pub(super) fn evict_loop(&self) {
        lock(&self.worker_tids).push(gettid());
        self.apply_own_nice();
        let batch_max = self.cfg.evict_batch.max(1);
        loop {
            let (start, batch): (u64, Vec<usize>) = {
                let mut q = lock(&self.queue);
                while q.pages.is_empty() && !self.stop.load(Ordering::Acquire) {
                    q = self.queue_cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                // A short batch waits up to the linger for more victims: one protect,
                // drop (and TLB shootdown) and store round trip serves them all.
                if !self.cfg.evict_linger.is_zero() && q.pages.len() < batch_max {
                    let deadline = std::time::Instant::now() + self.cfg.evict_linger;
                    while q.pages.len() < batch_max && !self.stop.load(Ordering::Acquire) {
                        let now = std::time::Instant::now();
                        if now >= deadline {
                            break;
                        }
                        q = self
                            .queue_cv
                            .wait_timeout(q, deadline - now)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
                if self.stop.load(Ordering::Acquire) {
                    q.pages.clear();
                    q.drained = q.queued;
                    self.idle_cv.notify_all();
                    return;
                }
                let n = q.pages.len().min(batch_max);
                q.in_flight += 1;
                let start = q.drained;
                q.drained += n as u64;
                q.batch_starts.push(start);
                (start, q.pages.drain(..n).collect())
            };
            self.evict_batch(batch);
            self.retry_pending_drops();
            self.refill_probation();
            let mut q = lock(&self.queue);
            q.in_flight -= 1;
            if let Some(k) = q.batch_starts.iter().position(|&b| b == start) {
                q.batch_starts.swap_remove(k);
            }
            self.idle_cv.notify_all();
        }
    }

    /// Protects, unprotects (and wakes) every run.
    pub(super) fn protect_runs(&self, rs: &[(usize, usize)], protect: bool) -> io::Result<()> {
        for &(first, count) in rs {
            let (addr, len) = (self.addr(first), (count * PAGE) as u64);
            retry_eagain(|| self.uffd.writeprotect(addr, len, protect, false))?;
        }
        Ok(())
    }

    /// Drops every run, in as few calls (TLB shootdowns) as the region's memory
    /// allows ([`RegionMemory::drop_page_runs`]), telling the remove-event handler
    /// which drops are ours (it consumes the record when the event arrives).
    ///
    /// # Errors
    /// The runs dropped before the failure (from the first) and the error.
    pub(super) fn drop_runs(&self, rs: &[(usize, usize)]) -> Result<(), (usize, io::Error)> {
        let tracked = self.cfg.track_remove && self.mem.drop_raises_remove_event();
        let span = |&(first, count): &(usize, usize)| (self.addr(first), self.addr(first + count));
        if tracked {
            lock(&self.own_drops).extend(rs.iter().map(span));
        }
        let r = self.mem.drop_page_runs(rs);
        if let (true, Err((done, _))) = (tracked, &r) {
            // The runs not dropped raise no event: forget their records.
            let mut own = lock(&self.own_drops);
            for s in rs[*done..].iter().map(span) {
                if let Some(k) = own.iter().position(|&x| x == s) {
                    own.swap_remove(k);
                }
            }
        }
        r
    }

    pub(super) fn evict_batch(&self, mut pages: Vec<usize>) {
        pages.sort_unstable();
        pages.dedup();
        // 1. Claim the pages that are resident, and the pages on probation (stored
        //    from their copies); tell the placement about the others that it
        //    believes will leave but cannot.
        let mut claimed = Vec::with_capacity(pages.len());
        let mut expiring = Vec::new();
        let mut refused = Vec::new();
        {
            let mut t = lock(&self.table);
            for p in pages {
                match t.st[p] {
                    PageState::Resident => {
                        t.apply(p, PageEvent::Evict);
                        claimed.push(p);
                    }
                    // Unmapped already, their contents in the stash: stored from there. (A
                    // sampled victim refused instead was put back in fast memory above
                    // the allocation, and the epoch demotes at most R such pages: a GUPS
                    // thrashing beside a KV store held 36 MiB with 7 MiB allotted.)
                    PageState::Probation | PageState::Sampled => {
                        let data = t.stash.remove(&p).expect("stashed page");
                        t.apply(p, PageEvent::Evict);
                        expiring.push((p, data));
                    }
                    PageState::SampleDrop
                    | PageState::SampleDropping
                    | PageState::ProbeDrop
                    | PageState::ProbeDropping
                    | PageState::Loading => refused.push(p),
                    // Leaving already (queued twice), gone, or freed.
                    PageState::Evicting
                    | PageState::Dropping
                    | PageState::Expiring
                    | PageState::Untouched
                    | PageState::Stored
                    | PageState::Freeing
                    | PageState::Lost => {}
                }
            }
        }
        if !refused.is_empty() {
            let mut pl = lock(&self.placement);
            for &p in &refused {
                pl.evict_failed(p);
            }
        }
        if !expiring.is_empty() {
            self.n.evict_batches.fetch_add(1, Ordering::Relaxed);
            self.expire(expiring);
        }
        if claimed.is_empty() {
            return;
        }
        self.evict_claimed(&claimed);
        // Pages the application freed meanwhile lose the copy just stored.
        self.finish_freed(&claimed, true);
    }

    /// Steps 2–7 of [`Inner::evict_batch`] for the pages it claimed (sorted).
    pub(super) fn evict_claimed(&self, claimed: &[usize]) {
        self.n.evict_batches.fetch_add(1, Ordering::Relaxed);
        let rs = runs(claimed);
        let fail = |why: String, unprotect: bool| {
            if unprotect {
                let _ = self.protect_runs(&rs, false);
            }
            let mut t = lock(&self.table);
            for &p in claimed {
                t.apply_if(p, PageState::Evicting, PageEvent::MoveFailed);
            }
            drop(t);
            self.n
                .evict_failures
                .fetch_add(claimed.len() as u64, Ordering::Relaxed);
            let mut pl = lock(&self.placement);
            for &p in claimed {
                pl.evict_failed(p);
            }
            drop(pl);
            self.note_error(why);
        };
        // 2. Write-protect: writers now wait for us.
        if let Err(e) = self.protect_runs(&rs, true) {
            fail(
                format!("write-protecting {} pages: {e}", claimed.len()),
                true,
            );
            return;
        }
        // 3. Copy out.
        let mut data = vec![0u8; claimed.len() * PAGE];
        for (k, &p) in claimed.iter().enumerate() {
            if let Err(e) = self.mem.read_page(p, &mut data[k * PAGE..(k + 1) * PAGE]) {
                fail(format!("reading page {p}: {e}"), true);
                return;
            }
        }
        // 4. Store, and wait for the slow tier's confirmation.
        let batch: Vec<(PageKey, &[u8])> = claimed
            .iter()
            .enumerate()
            .map(|(k, &p)| (self.key(p), &data[k * PAGE..(k + 1) * PAGE]))
            .collect();
        if let Err(e) = self.tier.store_batch(&batch) {
            // Some may be held all the same (a remote batch cut short).
            self.note_stale(claimed);
            fail(format!("storing {} pages: {e}", claimed.len()), true);
            return;
        }
        // 5. Confirmed: the slow tier holds them. (Pages the application freed
        //    meanwhile wait, faults included, for the caller to drop their copy.)
        {
            let mut t = lock(&self.table);
            for (k, &p) in claimed.iter().enumerate() {
                if t.apply_if(p, PageState::Evicting, PageEvent::StoreConfirmed) {
                    t.crc[p] = Some(checksum(&data[k * PAGE..(k + 1) * PAGE]));
                }
            }
        }
        self.forget_stale(claimed);
        // 6. Drop from memory, every run in one call where the memory allows (one
        //    TLB shootdown); only then are they stored. Runs a failed drop did not
        //    reach are still mapped: they stay resident (the copy is harmless).
        let dropped = self.drop_runs(&rs);
        let done = match &dropped {
            Ok(()) => rs.len(),
            Err((done, _)) => *done,
        };
        let (gone, kept) = rs.split_at(done);
        let mut evicted = 0u64;
        let mut reverted = Vec::new();
        {
            let mut t = lock(&self.table);
            for &(first, count) in gone {
                for p in first..first + count {
                    if t.apply_if(p, PageState::Dropping, PageEvent::Dropped) {
                        t.stamp_eviction(p);
                        evicted += 1;
                    }
                }
            }
            for &(first, count) in kept {
                for p in first..first + count {
                    if t.apply_if(p, PageState::Dropping, PageEvent::MoveFailed) {
                        reverted.push(p);
                    }
                }
            }
        }
        // Still mapped, and stored too: the stored copy is harmless while the page is
        // mapped, and dropped if the application frees the page.
        self.note_stale(&reverted);
        if let Err((_, e)) = &dropped {
            let _ = self.protect_runs(kept, false);
            self.n
                .evict_failures
                .fetch_add(reverted.len() as u64, Ordering::Relaxed);
            let mut pl = lock(&self.placement);
            for &p in &reverted {
                pl.evict_failed(p);
            }
            drop(pl);
            self.note_error(format!("dropping evicted pages: {e}"));
        }
        // 7. Unprotect and wake writers, and faults left waiting on the drop: they
        //    find the pages stored and fault them back in. Where the drop cleared the
        //    protection with the page (anonymous memory), waking is enough and costs
        //    no TLB shootdown.
        if self.mem.drop_clears_write_protect() {
            for &(first, count) in gone {
                let _ = self.uffd.wake(self.addr(first), (count * PAGE) as u64);
            }
        } else if let Err(e) = self.protect_runs(gone, false) {
            self.note_error(format!("unprotecting evicted pages: {e}"));
        }
        self.n.evictions.fetch_add(evicted, Ordering::Relaxed);
    }

    /// Stores pages evicted from probation (or sampled) from their copies (no
    /// protect or drop: they are unmapped already), then wakes the faults that waited
    /// for them. A failed store puts them on probation (still in local memory).
    pub(super) fn expire(&self, pages: Vec<(usize, Box<[u8]>)>) {
        let batch: Vec<(PageKey, &[u8])> =
            pages.iter().map(|(p, d)| (self.key(*p), &d[..])).collect();
        let stored = self.tier.store_batch(&batch);
        drop(batch);
        let mut evicted = 0u64;
        let mut failed = Vec::new();
        let mut freed = Vec::new();
        let mut stored_pages = Vec::new();
        let waiters = {
            let mut t = lock(&self.table);
            for (p, data) in pages {
                if t.st[p] != PageState::Expiring {
                    // Freed meanwhile (freeing: its faults wait): the copy just
                    // stored is dropped below, so that it cannot outlive the page.
                    freed.push(p);
                    continue;
                }
                if stored.is_ok() {
                    stored_pages.push(p);
                    t.crc[p] = Some(checksum(&data));
                    t.apply(p, PageEvent::StoreConfirmed);
                    t.stamp_eviction(p);
                    evicted += 1;
                } else {
                    t.stash.insert(p, data);
                    t.apply(p, PageEvent::MoveFailed);
                    failed.push(p);
                }
            }
            std::mem::take(&mut t.expiring_waiters)
        };
        if stored.is_ok() {
            self.forget_stale(&stored_pages);
        } else {
            self.note_stale(&failed);
        }
        // (A failed batch may have stored some all the same: drop theirs either way.)
        self.finish_freed(&freed, true);
        // Stored: their shadow copies are not needed any more. (Freed ones had theirs
        // dropped by the remove event.)
        for &p in &stored_pages {
            self.shadow_forget(p);
        }
        for p in waiters {
            let _ = self.uffd.wake(self.addr(p), PAGE as u64);
        }
        self.n.evictions.fetch_add(evicted, Ordering::Relaxed);
        self.n
            .probation_evictions
            .fetch_add(evicted, Ordering::Relaxed);
        if let Err(e) = stored {
            self.n
                .evict_failures
                .fetch_add(failed.len() as u64, Ordering::Relaxed);
            let mut pl = lock(&self.placement);
            for &p in &failed {
                pl.evict_failed(p);
            }
            drop(pl);
            self.note_error(format!(
                "storing {} pages from probation: {e}",
                failed.len()
            ));
        }
    }
}
