//! The fault thread (MaxMem §3.3, on far memory): it reads the region's
//! userfaultfd and serves each fault by the page's state (zero fill, load from the
//! slow tier, map a stash copy), counts the accesses the faults reveal, and tells
//! the placement of every page mapped. Prefetches (MaxMem's promotions) load pages
//! the same way from the caller's thread. See the manager's documentation,
//! "Faults".

use super::{is_eagain, lock, Inner, PageEvent, PageState, Table};
use crate::region::PAGE;
use crate::uffd::Event;
use crate::{checksum, TierError};
use memcolo_linux::sched::gettid;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Instant;

impl Inner {
    pub(super) fn fault_loop(&self) {
        self.fault_tid.store(gettid(), Ordering::SeqCst);
        if self.latency_critical.load(Ordering::SeqCst) {
            if let Err(e) = self.apply_priority(true) {
                self.note_error(format!("fault thread priority: {e}"));
            }
        } else {
            self.apply_own_nice();
        }
        let mut buf = vec![0u8; PAGE];
        while !self.stop_faults.load(Ordering::Acquire) {
            match self.uffd.poll(Some(self.wake_fd.as_fd()), 500) {
                Ok((true, _)) => {}
                Ok(_) => continue,
                Err(e) => {
                    self.set_fatal(format!("poll on the userfaultfd failed: {e}"));
                    return;
                }
            }
            let events = match self.uffd.read_events() {
                Ok(v) => v,
                Err(e) => {
                    self.set_fatal(format!("reading the userfaultfd failed: {e}"));
                    return;
                }
            };
            for ev in events {
                match ev {
                    Event::PageFault { address, write, wp } => {
                        self.on_fault(address, write, wp, &mut buf)
                    }
                    Event::Remove { start, end } if self.cfg.track_remove => {
                        self.on_remove(start, end)
                    }
                    other => tracing::debug!(?other, "tier: event ignored"),
                }
            }
        }
    }

    pub(super) fn on_fault(&self, address: u64, _write: bool, wp: bool, buf: &mut [u8]) {
        let page_addr = address & !(PAGE as u64 - 1);
        if page_addr < self.base || page_addr >= self.addr(self.pages) {
            let _ = self.uffd.wake(page_addr, PAGE as u64);
            return;
        }
        let i = ((page_addr - self.base) as usize) / PAGE;
        if wp {
            self.n.wp_faults.fetch_add(1, Ordering::Relaxed);
            let st = lock(&self.table).st[i];
            if st.protected_by_worker() {
                return; // The worker unprotects and wakes it.
            }
            match self.uffd.writeprotect(page_addr, PAGE as u64, false, false) {
                Ok(()) => {}
                Err(e) if is_eagain(&e) => {
                    let _ = self.uffd.wake(page_addr, PAGE as u64);
                }
                Err(e) => self.note_error(format!("unprotecting page {i}: {e}")),
            }
            return;
        }
        let mut t = lock(&self.table);
        match t.st[i] {
            PageState::Untouched => {
                let mut end = i + 1;
                let limit = (i + self.cfg.zero_fill_ahead.max(1)).min(self.pages);
                while end < limit && t.st[end] == PageState::Untouched {
                    end += 1;
                }
                let len = ((end - i) * PAGE) as u64;
                match self.uffd.zeropage(page_addr, len) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                        let _ = self.uffd.wake(page_addr, len);
                    }
                    Err(e) if is_eagain(&e) => {
                        // A remove event is pending: retry the access after it.
                        drop(t);
                        let _ = self.uffd.wake(page_addr, PAGE as u64);
                        return;
                    }
                    Err(e) => {
                        drop(t);
                        self.note_error(format!("zero-filling page {i}: {e}"));
                        return;
                    }
                }
                for p in i..end {
                    t.apply(p, PageEvent::ZeroFill);
                }
                self.n.zero_faults.fetch_add(1, Ordering::Relaxed);
                drop(t);
                self.placed(i..end);
            }
            PageState::Stored => {
                t.apply(i, PageEvent::LoadBegin);
                let crc = t.crc[i];
                drop(t);
                let served_from = Instant::now();
                let loaded = self.load_checked(i, crc, buf);
                let load_ns = served_from.elapsed().as_nanos() as u64;
                match loaded {
                    Ok(()) => {
                        self.n.slow_load_ns.fetch_add(load_ns, Ordering::Relaxed);
                        let mut t = lock(&self.table);
                        if t.st[i] != PageState::Loading {
                            // Freed meanwhile: the retry zero-fills it.
                            drop(t);
                            let _ = self.uffd.wake(page_addr, PAGE as u64);
                            return;
                        }
                        let map_from = Instant::now();
                        let copied = self.uffd.copy(page_addr, buf, false);
                        self.n
                            .slow_map_ns
                            .fetch_add(map_from.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        if let Err(e) = copied {
                            if e.raw_os_error() != Some(libc::EEXIST) {
                                t.apply(i, PageEvent::LoadAborted);
                                drop(t);
                                if is_eagain(&e) {
                                    // A remove event is pending: retry after it.
                                    let _ = self.uffd.wake(page_addr, PAGE as u64);
                                } else {
                                    self.note_error(format!("mapping page {i}: {e}"));
                                }
                                return;
                            }
                        }
                        drop(t);
                        // The thread runs again; drop the slow-tier copy while the page
                        // is still `loading`, so no eviction can store it anew first.
                        let drop_from = Instant::now();
                        self.drop_copy(i);
                        self.n
                            .slow_drop_ns
                            .fetch_add(drop_from.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        let mut t = lock(&self.table);
                        let refault = self.cfg.refault_samples && t.short_refault(i);
                        t.apply_if(i, PageState::Loading, PageEvent::LoadDone);
                        drop(t);
                        // The sample first: a reader that sees the fault counted
                        // finds it in the epoch too.
                        if refault {
                            self.n.refault_samples.fetch_add(1, Ordering::Relaxed);
                        }
                        self.record_sample(i, true, refault);
                        self.n
                            .slow_fault_ns
                            .fetch_add(served_from.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        self.n.slow_faults.fetch_add(1, Ordering::Release);
                        self.placed(i..i + 1);
                    }
                    Err(e) => {
                        let mut t = lock(&self.table);
                        t.apply(i, PageEvent::LoadLost);
                        drop(t);
                        self.n.lost.fetch_add(1, Ordering::Relaxed);
                        self.set_fatal(format!(
                            "page {i} of region {} (address {page_addr:#x}) cannot be brought back from the {} tier: {e}",
                            self.cfg.region_id,
                            self.tier.name()
                        ));
                        // The faulting thread stays blocked: never zeros, never stale.
                    }
                }
            }
            PageState::Sampled => {
                let Some(mut t) = self.map_from_stash(t, i, page_addr, "sampled page") else {
                    return;
                };
                t.apply(i, PageEvent::MapCopy);
                if let Some(w) = t.window.as_mut() {
                    w.hits += 1;
                    w.touched.insert(i);
                }
                drop(t);
                self.n.sample_hits.fetch_add(1, Ordering::Relaxed);
                self.record_sample(i, false, false);
            }
            PageState::Probation => {
                // A probation hit: the next victim was touched, so it is not cold. Put
                // it back from its copy; the touch is a fast access, a hotness sample
                // and a second chance.
                let Some(mut t) = self.map_from_stash(t, i, page_addr, "page on probation") else {
                    return;
                };
                t.apply(i, PageEvent::MapCopy);
                drop(t);
                self.n.probation_hits.fetch_add(1, Ordering::Relaxed);
                {
                    let mut a = lock(&self.accesses);
                    let e = &mut a.epoch;
                    e.fast += 1.0;
                    *e.pages.entry(i).or_default() += 1;
                }
                lock(&self.placement).second_chance(i);
            }
            PageState::Expiring => {
                // Being stored from its probation copy: the worker wakes the thread
                // once the page is stored, and the retry faults it in.
                t.expiring_waiters.push(i);
                self.n.spurious.fetch_add(1, Ordering::Relaxed);
            }
            PageState::Resident
            | PageState::Evicting
            | PageState::SampleDrop
            | PageState::ProbeDrop => {
                // Believed mapped: either mapped since the fault was raised (the zero
                // fill finds it and just wakes), or dropped by the application itself,
                // which then reads zeros as the kernel promises.
                drop(t);
                self.n.spurious.fetch_add(1, Ordering::Relaxed);
                match self.uffd.zeropage(page_addr, PAGE as u64) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) || is_eagain(&e) => {
                        let _ = self.uffd.wake(page_addr, PAGE as u64);
                    }
                    Err(e) => self.note_error(format!("page {i}: {e}")),
                }
            }
            PageState::Loading
            | PageState::Dropping
            | PageState::SampleDropping
            | PageState::ProbeDropping
            | PageState::Freeing => {
                // A prefetch is bringing it in (its copy wakes the thread), or a
                // worker is dropping it (its unprotect wakes the thread, which then
                // finds it stored or sampled), or freed it mid-move (it wakes the
                // thread once its copy is gone, and the retry finds it untouched).
                self.n.spurious.fetch_add(1, Ordering::Relaxed);
            }
            PageState::Lost => {}
        }
    }

    /// Maps page `i` (at `page_addr`) back from its copy in the stash (a sampled
    /// page or one on probation), which wakes the faulting thread. On success the
    /// table guard comes back for the caller to mark the page resident. On failure
    /// the copy returns to the stash, the guard is released and the thread is woken
    /// to retry (`EAGAIN`: a remove event is pending) or the error is noted; `None`.
    pub(super) fn map_from_stash<'a>(
        &'a self,
        mut t: MutexGuard<'a, Table>,
        i: usize,
        page_addr: u64,
        what: &str,
    ) -> Option<MutexGuard<'a, Table>> {
        let data = t.stash.remove(&i).expect("a stashed page has its copy");
        match self.uffd.copy(page_addr, &data, false) {
            Ok(_) => {
                self.shadow_forget(i);
                Some(t)
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                self.shadow_forget(i);
                Some(t)
            }
            Err(e) => {
                t.stash.insert(i, data);
                drop(t);
                if is_eagain(&e) {
                    let _ = self.uffd.wake(page_addr, PAGE as u64);
                } else {
                    self.note_error(format!("restoring {what} {i}: {e}"));
                }
                None
            }
        }
    }

    pub(super) fn load_checked(
        &self,
        i: usize,
        crc: Option<u32>,
        buf: &mut [u8],
    ) -> Result<(), TierError> {
        self.tier.load(self.key(i), buf)?;
        let Some(crc) = crc else {
            return Ok(());
        };
        let actual = checksum(buf);
        if actual != crc {
            return Err(TierError::Corrupt {
                key: self.key(i),
                expected: crc,
                actual,
            });
        }
        Ok(())
    }

    pub(super) fn record_sample(&self, page: usize, slow: bool, refault: bool) {
        // A slow fault is a page touched in this window, known for sure; a resident
        // page's touch is only seen if the page was among the window's k of R
        // sampled. Slow faults enter the per-page samples with the same probability
        // k/R, so the hotness bins weigh both tiers alike (the count of slow
        // touches, `slow`, stays exact). A refault at a short distance is counted
        // for sure: it says the page belongs in fast memory, which a resident hot
        // page's rare samples take seconds to say (see "Refaults" in the module
        // documentation).
        let keep = !slow || refault || {
            let p = f64::from_bits(self.slow_sample_p.load(Ordering::Relaxed));
            p >= 1.0 || (lock(&self.rng).next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64) < p
        };
        if slow {
            self.window_slow.fetch_add(1, Ordering::Relaxed);
        }
        let mut a = lock(&self.accesses);
        let e = &mut a.epoch;
        if slow {
            e.slow += 1;
        }
        if keep {
            *e.pages.entry(page).or_default() += 1;
        }
    }

    /// Asks the placement about newly mapped pages and queues the victims.
    pub(super) fn placed(&self, pages: std::ops::Range<usize>) {
        let mut victims = Vec::new();
        let t0 = Instant::now();
        {
            let mut pl = lock(&self.placement);
            for p in pages {
                if let Some(v) = pl.fault_in(p) {
                    victims.push(v);
                }
            }
        }
        let ns = t0.elapsed().as_nanos() as u64;
        self.n.placement_ns.fetch_add(ns, Ordering::Relaxed);
        self.n.placement_max_ns.fetch_max(ns, Ordering::Relaxed);
        self.enqueue(&victims);
    }

    pub(super) fn prefetch_one(&self, i: usize, buf: &mut [u8]) -> Result<(), TierError> {
        let crc = {
            let mut t = lock(&self.table);
            if i >= self.pages || t.st[i] != PageState::Stored {
                return Ok(());
            }
            t.apply(i, PageEvent::LoadBegin);
            t.crc[i]
        };
        let r = self.load_checked(i, crc, buf);
        let mut t = lock(&self.table);
        if t.st[i] != PageState::Loading {
            // Freed meanwhile: its copy goes, then its faults may zero-fill it.
            drop(t);
            self.finish_freed(&[i], true);
            return Ok(());
        }
        if let Err(e) = r {
            t.apply(i, PageEvent::LoadAborted);
            drop(t);
            self.note_error(format!("prefetching page {i}: {e}"));
            return Err(e);
        }
        match self.uffd.copy(self.addr(i), buf, false) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => {
                // (`EAGAIN`: a remove event is pending; the page's fault brings it.)
                t.apply(i, PageEvent::LoadAborted);
                drop(t);
                self.note_error(format!("mapping prefetched page {i}: {e}"));
                return Ok(());
            }
        }
        drop(t);
        self.drop_copy(i);
        let mut t = lock(&self.table);
        t.apply_if(i, PageState::Loading, PageEvent::LoadDone);
        drop(t);
        self.finish_freed(&[i], false);
        self.n.prefetches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
