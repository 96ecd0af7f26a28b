//! A region's *shadow*: what a tier manager keeps outside its own process so that a
//! new agent can take a region over after the agent that managed it died (a crash, a
//! `SIGKILL`, an OOM kill), with nothing lost and nothing read back stale.
//!
//! The process owns the shadow (libmemcolo creates it beside the region's memfd and
//! hands both to the agent in `tier_register`; docs/protocol.md §11): a second memfd of
//! the region's length plus one control page.
//!
//! - **Stash copies.** A page the sampler or probation unmaps (manager states
//!   sampled, probation) has its only copy outside the region's memfd: the manager
//!   writes that copy at the page's offset in the shadow *before* it punches the
//!   page out of the region, and punches the shadow's copy only once the page is held
//!   elsewhere again (mapped back, stored in the slow tier, or freed).
//! - **Remove journal** (the control page, at offset `pages × PAGE`). An application's
//!   `madvise(MADV_DONTNEED)` reaches the agent as a `UFFD_EVENT_REMOVE` that the
//!   kernel counts as handled once it is *read*; an agent that died after reading it
//!   and before dropping the slow-tier copies of those pages would leave copies that a
//!   new agent must not bring back. libmemcolo writes each range to a journal slot
//!   before its `madvise`; the manager clears the slot once the range's copies are
//!   dropped; a new agent applies the slots still pending.
//!
//! Control page layout (little-endian, as the process writes it):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `MCSHADW1` |
//! | 8..16 | slots (≤ [`MAX_SLOTS`]) |
//! | 16..24 | tainted (written by the agent): nonzero while the slow tier may hold a copy of a freed page that the manager could not drop yet; a region so marked is not recovered |
//! | 64 + 32·k .. | slot k: state (u64: 0 free, 1 being written, 2 pending), first byte, end byte (region offsets, u64), reserved |
//!
//! A slot moves 0 → 1 (the process claims it with compare-and-swap) → 2 (range
//! written, then the state with release order) → 0 (the agent, once the range's
//! copies are dropped).

use crate::region::{RegionMemory, SharedFile, PAGE};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// The control page's magic.
pub const MAGIC: [u8; 8] = *b"MCSHADW1";
/// Most journal slots a control page holds.
pub const MAX_SLOTS: usize = 64;
/// Offset of slot 0 in the control page, bytes.
const SLOT0: usize = 64;
/// Bytes per slot.
const SLOT_BYTES: usize = 32;

const FREE: u64 = 0;
const PENDING: u64 = 2;

/// A region's shadow (see the module documentation).
#[derive(Debug)]
pub struct Shadow {
    file: SharedFile,
    /// The control page, mapped shared.
    control: *mut u8,
    slots: usize,
}

// SAFETY: the control page is only reached through atomics (slot states) and reads of
// words the process wrote before it published them with release order.
unsafe impl Send for Shadow {}
// SAFETY: as above.
unsafe impl Sync for Shadow {}

impl Shadow {
    /// The shadow memfd `fd` of a region of `pages` pages: at least `(pages + 1) ×
    /// PAGE` bytes long, sealed against shrinking (`F_SEAL_SHRINK`: the agent maps its
    /// control page, and a process that could shrink the memfd under that mapping
    /// would make the agent take `SIGBUS`), its control page initialized by the
    /// process (magic and slot count).
    ///
    /// # Errors
    /// `InvalidInput` if the memfd is not sealed against shrinking, is too short, or
    /// its control page has no magic or too many slots; `mmap(2)`'s or `fstat(2)`'s
    /// error.
    pub fn new(fd: OwnedFd, pages: usize) -> io::Result<Self> {
        // SAFETY: F_GET_SEALS takes no argument.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the shadow memfd is not sealed against shrinking (F_SEAL_SHRINK)",
            ));
        }
        let file = SharedFile::new(fd, 0, pages + 1)?;
        // SAFETY: mapping one page of the memfd, which is long enough (checked above).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.fd().as_raw_fd(),
                (pages * PAGE) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut shadow = Shadow {
            file: SharedFile::new(file.into_fd(), 0, pages)?,
            control: p.cast(),
            slots: 0,
        };
        // SAFETY: the control page is mapped and PAGE bytes long.
        let head = unsafe { std::slice::from_raw_parts(shadow.control, 16) };
        if head[..8] != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "shadow control page has no MCSHADW1 magic",
            ));
        }
        let slots = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes")) as usize;
        if slots > MAX_SLOTS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("shadow journal of {slots} slots (at most {MAX_SLOTS})"),
            ));
        }
        shadow.slots = slots;
        Ok(shadow)
    }

    /// Writes the control page of a new shadow of a region of `pages` pages into
    /// `fd` (sized `(pages + 1) × PAGE`), as libmemcolo does; for tests and
    /// in-process regions.
    ///
    /// # Errors
    /// `ftruncate(2)`'s, `pwrite(2)`'s or `fcntl(F_ADD_SEALS)`'s error (the memfd
    /// must be created with `MFD_ALLOW_SEALING`).
    pub fn init(fd: &OwnedFd, pages: usize) -> io::Result<()> {
        // SAFETY: resizing our own descriptor's file.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), ((pages + 1) * PAGE) as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut head = [0u8; 16];
        head[..8].copy_from_slice(&MAGIC);
        head[8..].copy_from_slice(&(MAX_SLOTS as u64).to_le_bytes());
        pwrite_all(fd, &head, pages * PAGE)?;
        // SAFETY: adding a seal to our own memfd.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn slot(&self, k: usize) -> (&AtomicU64, u64, u64) {
        assert!(k < self.slots);
        let at = SLOT0 + k * SLOT_BYTES;
        // SAFETY: within the mapped control page; 8-byte aligned (page + 64 + 32k).
        unsafe {
            let base = self.control.add(at);
            let state = &*(base as *const AtomicU64);
            let start = std::ptr::read_volatile(base.add(8) as *const u64);
            let end = std::ptr::read_volatile(base.add(16) as *const u64);
            (state, u64::from_le(start), u64::from_le(end))
        }
    }

    /// The ranges `[first byte, end byte)` (region offsets) of the journal's pending
    /// slots, with their slot numbers.
    pub fn pending_removes(&self) -> Vec<(usize, u64, u64)> {
        (0..self.slots)
            .filter_map(|k| {
                let (state, _, _) = self.slot(k);
                if state.load(Ordering::Acquire) != PENDING {
                    return None;
                }
                let (_, s, e) = self.slot(k);
                Some((k, s, e))
            })
            .collect()
    }

    /// Clears pending slot `k` (its range's copies are dropped).
    pub fn clear_slot(&self, k: usize) {
        let (state, _, _) = self.slot(k);
        let _ = state.compare_exchange(PENDING, FREE, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// The manager has handled the remove event of `[start, end)` (region offsets).
    /// The kernel raises one event per VMA an `madvise` spans, in address order, and
    /// none for the parts not mapped; so, first found: a pending slot of exactly that
    /// range is cleared; one the event starts and covers to its end is cleared; one
    /// the event starts in (at or after the slot's start: what lies before was
    /// handled or not mapped) keeps only the rest of its range.
    pub fn clear_remove(&self, start: u64, end: u64) {
        let pending: Vec<(usize, u64, u64)> = self.pending_removes();
        let exact = pending.iter().find(|&&(_, s, e)| s == start && e == end);
        let covered = || pending.iter().find(|&&(_, s, e)| s == start && e <= end);
        let within = || {
            pending
                .iter()
                .find(|&&(_, s, e)| s <= start && start < e && e <= end)
        };
        if let Some(&(k, _, _)) = exact.or_else(covered).or_else(within) {
            self.clear_slot(k);
        } else if let Some(&(k, _, _)) = pending.iter().find(|&&(_, s, e)| s <= start && end < e) {
            let at = SLOT0 + k * SLOT_BYTES + 8;
            // SAFETY: within the mapped control page, 8-byte aligned; a pending slot's
            // range is the agent's to change (the process writes only free slots).
            unsafe {
                (*(self.control.add(at) as *const AtomicU64)).store(end.to_le(), Ordering::Release);
            }
        }
    }

    fn taint_word(&self) -> &AtomicU64 {
        // SAFETY: bytes 16..24 of the mapped control page, 8-byte aligned.
        unsafe { &*(self.control.add(16) as *const AtomicU64) }
    }

    /// Marks (or clears) the region as holding a slow-tier copy of a freed page that
    /// could not be dropped yet: a recovery would take it for the page.
    pub fn set_tainted(&self, on: bool) {
        self.taint_word().store(u64::from(on), Ordering::Release);
    }

    /// Whether the region is marked by [`Shadow::set_tainted`].
    pub fn tainted(&self) -> bool {
        self.taint_word().load(Ordering::Acquire) != 0
    }

    /// Writes the copy of page `index` (`PAGE` bytes).
    ///
    /// # Errors
    /// `pwrite(2)`'s error (`ENOSPC` when the memory cgroup or tmpfs is full).
    pub fn write_page(&self, index: usize, data: &[u8]) -> io::Result<()> {
        assert!(index < self.file.pages() && data.len() == PAGE);
        pwrite_all(self.file.fd(), data, index * PAGE)
    }

    /// Reads the copy of page `index` into `out` (`PAGE` bytes; zeros where none).
    ///
    /// # Errors
    /// `pread(2)`'s error.
    pub fn read_page(&self, index: usize, out: &mut [u8]) -> io::Result<()> {
        self.file.read_page(index, out)
    }

    /// Punches the copy of page `index` out.
    ///
    /// # Errors
    /// `fallocate(2)`'s error.
    pub fn forget(&self, index: usize) -> io::Result<()> {
        self.file.drop_pages(index, 1)
    }

    /// The runs `(first, count)` of pages that have a copy, in order.
    ///
    /// # Errors
    /// `lseek(2)`'s error.
    pub fn present_runs(&self) -> io::Result<Vec<(usize, usize)>> {
        self.file.present_runs()
    }
}

impl Drop for Shadow {
    fn drop(&mut self) {
        // SAFETY: unmapping the control page mapped in `new`.
        unsafe {
            libc::munmap(self.control.cast(), PAGE);
        }
    }
}

fn pwrite_all(fd: &OwnedFd, data: &[u8], offset: usize) -> io::Result<()> {
    let mut done = 0;
    while done < data.len() {
        // SAFETY: writing from the caller's buffer, within its length.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                data[done..].as_ptr().cast(),
                data.len() - done,
                (offset + done) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        } else {
            done += n as usize;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    fn memfd() -> OwnedFd {
        // SAFETY: creating a new memfd.
        let fd = unsafe {
            libc::memfd_create(
                c"shadow-test".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: a new descriptor nothing else owns.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    fn dup(fd: &OwnedFd) -> OwnedFd {
        fd.try_clone().expect("dup")
    }

    #[test]
    fn copies_are_written_found_and_forgotten() {
        let fd = memfd();
        Shadow::init(&fd, 16).unwrap();
        let s = Shadow::new(dup(&fd), 16).unwrap();
        let page = vec![7u8; PAGE];
        s.write_page(3, &page).unwrap();
        s.write_page(4, &page).unwrap();
        s.write_page(9, &page).unwrap();
        assert_eq!(s.present_runs().unwrap(), vec![(3, 2), (9, 1)]);
        let mut out = vec![0u8; PAGE];
        s.read_page(4, &mut out).unwrap();
        assert_eq!(out, page);
        s.forget(4).unwrap();
        assert_eq!(s.present_runs().unwrap(), vec![(3, 1), (9, 1)]);
        // A second agent opening the same shadow sees the same copies.
        let again = Shadow::new(dup(&fd), 16).unwrap();
        assert_eq!(again.present_runs().unwrap(), vec![(3, 1), (9, 1)]);
    }

    #[test]
    fn journal_slots_written_by_the_process_are_found_and_cleared() {
        let fd = memfd();
        Shadow::init(&fd, 8).unwrap();
        // The process's side (libmemcolo, in C): state 1, range, state 2.
        let write_slot = |k: usize, s: u64, e: u64, state: u64| {
            let mut b = [0u8; 24];
            b[..8].copy_from_slice(&state.to_le_bytes());
            b[8..16].copy_from_slice(&s.to_le_bytes());
            b[16..24].copy_from_slice(&e.to_le_bytes());
            pwrite_all(&fd, &b, 8 * PAGE + SLOT0 + k * SLOT_BYTES).unwrap();
        };
        write_slot(0, 0, 8192, 2);
        write_slot(5, 4096, 12288, 2);
        write_slot(7, 0, 4096, 1); // still being written: not pending
        let s = Shadow::new(dup(&fd), 8).unwrap();
        assert_eq!(s.pending_removes(), vec![(0, 0, 8192), (5, 4096, 12288)]);
        s.clear_remove(4096, 12288);
        assert_eq!(s.pending_removes(), vec![(0, 0, 8192)]);
        // An event of no pending slot's range changes nothing.
        s.clear_remove(12288, 16384);
        assert_eq!(s.pending_removes(), vec![(0, 0, 8192)]);
        // A range removed in two VMAs' events: the first leaves the rest pending.
        s.clear_remove(0, 4096);
        assert_eq!(s.pending_removes(), vec![(0, 4096, 8192)]);
        s.clear_remove(4096, 8192);
        assert!(s.pending_removes().is_empty());
        // An event over more than the slot (whole pages of a shorter range) clears it.
        write_slot(3, 8192, 10000, 2);
        s.clear_remove(8192, 12288);
        assert!(s.pending_removes().is_empty());
        // A range with an unmapped hole: no event for the hole; the next piece's
        // event starts past it and finishes the slot.
        write_slot(4, 0, 5 * 4096, 2);
        s.clear_remove(0, 4096);
        assert_eq!(s.pending_removes(), vec![(4, 4096, 5 * 4096)]);
        s.clear_remove(3 * 4096, 5 * 4096);
        assert!(s.pending_removes().is_empty());
        // Two frees of the same start: each event clears its own slot.
        write_slot(1, 0, 4096, 2);
        write_slot(2, 0, 8192, 2);
        s.clear_remove(0, 8192);
        assert_eq!(s.pending_removes(), vec![(1, 0, 4096)]);
        s.clear_remove(0, 4096);
        assert!(s.pending_removes().is_empty());
    }

    #[test]
    fn a_shadow_without_its_control_page_is_refused() {
        let fd = memfd();
        // SAFETY: resizing our own memfd.
        assert_eq!(
            unsafe { libc::ftruncate(fd.as_raw_fd(), (9 * PAGE) as i64) },
            0
        );
        let e = Shadow::new(dup(&fd), 8).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let short = memfd();
        assert!(Shadow::new(short, 8).is_err());
    }

    /// The agent maps a shadow's control page: a process that could shrink the memfd
    /// under that mapping would crash the agent with SIGBUS at its next journal read.
    #[test]
    fn a_shadow_its_process_could_shrink_is_refused_and_a_sealed_one_cannot_shrink() {
        let fd = memfd();
        // A control page written as the process would, but no seal.
        // SAFETY: resizing our own memfd.
        assert_eq!(
            unsafe { libc::ftruncate(fd.as_raw_fd(), (9 * PAGE) as i64) },
            0
        );
        let mut head = [0u8; 16];
        head[..8].copy_from_slice(&MAGIC);
        head[8..].copy_from_slice(&(MAX_SLOTS as u64).to_le_bytes());
        pwrite_all(&fd, &head, 8 * PAGE).unwrap();
        let e = Shadow::new(dup(&fd), 8).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("F_SEAL_SHRINK"), "{e}");
        // Sealed as init does: accepted, and the process can no longer shrink it.
        let sealed = memfd();
        Shadow::init(&sealed, 8).unwrap();
        let s = Shadow::new(dup(&sealed), 8).unwrap();
        // SAFETY: trying to shrink our own memfd.
        assert_ne!(unsafe { libc::ftruncate(sealed.as_raw_fd(), 0) }, 0);
        assert!(s.pending_removes().is_empty());
    }
}
