//! A region's hand-overs: taking it over when management begins (the pages its
//! backing holds are adopted as resident), recovering it after its manager died
//! (from the backing, the shadow and the durable slow tier, [`crate::shadow`]), and
//! giving it back at shutdown (every page mapped again from the slow tier or its
//! stash copy). See the manager's documentation, "Shutdown", and
//! [`super::TierManager::recover`].

#[cfg(doc)]
use super::TierManager;
use super::{is_eagain, lock, Inner, PageEvent, PageState};
#[cfg(doc)]
use crate::region::RegionMemory;
use crate::region::PAGE;
use crate::uffd::Event;
use std::io;
use std::sync::atomic::Ordering;

impl Inner {
    /// Takes the pages that already hold data ([`RegionMemory::present_runs`]) as
    /// resident, before any thread of the manager runs: each is placed as if it had
    /// just faulted in, and the victims the placement names for them are queued for
    /// eviction (the workers start next). A region created for the manager has none;
    /// one handed over again (the agent restarted, and the process gave its region to
    /// the new agent) has every page it held, the previous agent having brought the
    /// slow ones back before it let go. Untouched pages (holes) still fault as
    /// missing and read as zeros.
    ///
    /// # Errors
    /// The backing's error while looking (the region is not taken).
    pub(super) fn adopt(&self) -> io::Result<()> {
        let runs = self.mem.present_runs()?;
        if runs.is_empty() {
            return Ok(());
        }
        let mut victims = Vec::new();
        let mut adopted = 0u64;
        {
            let mut t = lock(&self.table);
            let mut pl = lock(&self.placement);
            for (first, count) in runs {
                for p in first..(first + count).min(self.pages) {
                    if t.st[p] != PageState::Untouched {
                        continue;
                    }
                    t.apply(p, PageEvent::Adopt);
                    adopted += 1;
                    if let Some(v) = pl.fault_in(p) {
                        victims.push(v);
                    }
                }
            }
        }
        self.n.adopted.fetch_add(adopted, Ordering::Relaxed);
        tracing::info!(
            region = self.cfg.region_id,
            pages = adopted,
            victims = victims.len(),
            "tier: region taken over with pages in local memory"
        );
        self.enqueue(&victims);
        Ok(())
    }

    /// Takes over a region whose manager died (see [`TierManager::recover`]),
    /// before any thread of this manager runs. Per page, the first that holds it:
    /// a pending remove journal slot over a page the backing no longer holds
    /// (freed: its other copies are dropped); the backing (resident); the shadow
    /// (on probation, from the shadow's copy); the slow tier's listing (stored,
    /// checked by the backend's own checksum); else untouched. Copies a winner makes
    /// stale are dropped, and the journal's pending slots cleared.
    ///
    /// # Errors
    /// The backing's, the shadow's or the slow tier's error while looking.
    pub(super) fn recover(&self, instance: u64) -> io::Result<()> {
        let shadow = self
            .shadow
            .as_ref()
            .expect("recover is only called with a shadow");
        if shadow.tainted() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the slow tier may hold copies of freed pages that the dead manager could not drop (it had failed): they would read as the pages",
            ));
        }
        let n = self.pages;
        let marked = |runs: Vec<(usize, usize)>| {
            let mut v = vec![false; n];
            for (first, count) in runs {
                v[first.min(n)..(first + count).min(n)].fill(true);
            }
            v
        };
        let in_mem = marked(self.mem.present_runs()?);
        let in_shadow = marked(shadow.present_runs()?);
        let mut in_tier = vec![false; n];
        for p in self
            .tier
            .list_region(self.cfg.region_id)
            .map_err(|e| io::Error::other(format!("listing the slow tier: {e}")))?
        {
            if let Some(x) = in_tier.get_mut(p as usize) {
                *x = true;
            }
        }
        // After the listing: a restart of the tier before it would show here too.
        let now = self.tier.instance();
        if now != instance {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the {} tier restarted since the region was registered (instance {instance:#x}, now {now:#x}): the pages it held are gone",
                    self.tier.name()
                ),
            ));
        }
        let pending = shadow.pending_removes();
        let mut removed = vec![false; n];
        for &(_, s, e) in &pending {
            // (The process writes the slots: a range it wrote backwards frees nothing.)
            let first = (s / PAGE as u64).min(n as u64) as usize;
            let last = e.div_ceil(PAGE as u64).min(n as u64) as usize;
            if first < last {
                removed[first..last].fill(true);
            }
        }
        let mut victims = Vec::new();
        let (mut resident, mut probation, mut stored, mut freed) = (0u64, 0u64, 0u64, 0u64);
        let mut drop_tier = Vec::new();
        let mut drop_shadow = Vec::new();
        {
            let mut t = lock(&self.table);
            let mut pl = lock(&self.placement);
            let mut page = vec![0u8; PAGE];
            for p in 0..n {
                if in_mem[p] {
                    // The process's own copy is the newest (other copies are dropped
                    // only after it is made, and made only while it is protected).
                    t.apply(p, PageEvent::Adopt);
                    resident += 1;
                    if let Some(v) = pl.fault_in(p) {
                        victims.push(v);
                    }
                    if in_shadow[p] {
                        drop_shadow.push(p);
                    }
                    if in_tier[p] {
                        drop_tier.push(p);
                    }
                } else if removed[p] {
                    if in_shadow[p] {
                        drop_shadow.push(p);
                    }
                    if in_tier[p] {
                        drop_tier.push(p);
                        freed += 1;
                    }
                } else if in_shadow[p] {
                    // Sampled or on probation when the agent died; a slow-tier copy
                    // beside it is older (a stash copy is dropped only after the
                    // page is mapped or stored again).
                    shadow.read_page(p, &mut page)?;
                    t.stash.insert(p, page.clone().into_boxed_slice());
                    t.apply(p, PageEvent::RecoverStash);
                    probation += 1;
                    if let Some(v) = pl.fault_in(p) {
                        victims.push(v);
                    }
                    if in_tier[p] {
                        drop_tier.push(p);
                    }
                } else if in_tier[p] {
                    t.apply(p, PageEvent::RecoverStored);
                    t.crc[p] = None;
                    stored += 1;
                    pl.found_slow(p);
                }
            }
        }
        for p in drop_tier {
            self.drop_copy(p);
        }
        for p in drop_shadow {
            self.shadow_forget(p);
        }
        for (k, _, _) in pending.iter().copied() {
            shadow.clear_slot(k);
        }
        self.n
            .adopted
            .fetch_add(resident + probation, Ordering::Relaxed);
        self.n.recovered_stored.fetch_add(stored, Ordering::Relaxed);
        tracing::info!(
            region = self.cfg.region_id,
            resident,
            probation,
            stored,
            freed,
            journal = pending.len(),
            victims = victims.len(),
            "tier: region recovered after its agent died"
        );
        self.enqueue(&victims);
        Ok(())
    }

    /// A region registered anew (not recovered) has every page in its backing: what
    /// its shadow holds from an earlier manager (journal slots whose remove events
    /// no manager saw, copies) is stale, and would mislead a recovery later.
    ///
    /// # Errors
    /// The shadow's error while looking.
    pub(super) fn forget_shadow_state(&self) -> io::Result<()> {
        let Some(sh) = &self.shadow else {
            return Ok(());
        };
        sh.set_tainted(false);
        for (k, _, _) in sh.pending_removes() {
            sh.clear_slot(k);
        }
        for (first, count) in sh.present_runs()? {
            for p in first..(first + count).min(self.pages) {
                sh.forget(p)?;
            }
        }
        Ok(())
    }

    /// Writes the stash copy of page `p` to the shadow, if the region has one.
    pub(super) fn shadow_write(&self, p: usize, data: &[u8]) -> io::Result<()> {
        match &self.shadow {
            Some(sh) => sh.write_page(p, data),
            None => Ok(()),
        }
    }

    /// Punches the shadow's copy of page `p` (held elsewhere now, or freed).
    pub(super) fn shadow_forget(&self, p: usize) {
        if let Some(sh) = &self.shadow {
            if let Err(e) = sh.forget(p) {
                // A stale copy there would be taken for the page by an agent that
                // recovers the region: say so loudly.
                self.note_error(format!("dropping the shadow copy of page {p}: {e}"));
            }
        }
    }

    /// Reads pending events after the fault thread stopped: remove events are
    /// handled (a pending one makes every map ioctl fail with `EAGAIN`); faults are
    /// left waiting, for the copy of their page or the unregistration to wake them.
    pub(super) fn pump_events(&self) {
        if let Ok(events) = self.uffd.read_events() {
            for ev in events {
                if let Event::Remove { start, end } = ev {
                    if self.cfg.track_remove {
                        self.on_remove(start, end);
                    }
                }
            }
        }
    }

    /// Maps `data` at page `p` from the stopping thread, pumping events while the
    /// kernel answers `EAGAIN`.
    pub(super) fn restore_copy(&self, p: usize, data: &[u8]) -> io::Result<()> {
        for _ in 0..10_000 {
            match self.uffd.copy(self.addr(p), data, false) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => return Ok(()),
                Err(e) if is_eagain(&e) => {
                    self.pump_events();
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::from_raw_os_error(libc::EAGAIN))
    }

    pub(super) fn restore_all(&self) -> Result<(), String> {
        if let Some(why) = lock(&self.errors).fatal.clone() {
            return Err(why);
        }
        self.pump_events();
        let mut buf = vec![0u8; PAGE];
        for p in 0..self.pages {
            let st = lock(&self.table).st[p];
            match st {
                PageState::Sampled | PageState::Probation => {
                    let Some(data) = lock(&self.table).stash.remove(&p) else {
                        continue;
                    };
                    self.restore_copy(p, &data)
                        .map_err(|e| format!("putting page {p} back from its copy: {e}"))?;
                    self.shadow_forget(p);
                    let mut t = lock(&self.table);
                    t.apply_if(p, st, PageEvent::Restore);
                }
                PageState::Stored => {
                    let crc = lock(&self.table).crc[p];
                    self.load_checked(p, crc, &mut buf)
                        .map_err(|e| format!("bringing page {p} back: {e}"))?;
                    self.restore_copy(p, &buf)
                        .map_err(|e| format!("mapping page {p} back: {e}"))?;
                    let mut t = lock(&self.table);
                    t.apply_if(p, PageState::Stored, PageEvent::Restore);
                }
                PageState::Lost => return Err(format!("page {p} was lost")),
                _ => {}
            }
        }
        let _ = self.tier.remove_region(self.cfg.region_id);
        Ok(())
    }
}
