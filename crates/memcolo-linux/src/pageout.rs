//! Page-out mechanisms: the ways memcolo makes the kernel reclaim a chosen process's
//! or cgroup's pages now, rather than under pressure (see "Terms" in
//! `docs/architecture.md` for reclaim vs page-out vs release).
//!
//! A process's memory is paged out with `process_madvise(2)` (Linux 5.10+):
//! `MADV_COLD` moves its pages to the inactive LRU (reclaimed first under pressure),
//! `MADV_PAGEOUT` reclaims them now (anonymous pages go to swap, clean file pages are
//! dropped, dirty ones written back). A cgroup's memory is paged out by
//! [`reclaim_cgroup`] (v2 `memory.reclaim`, v1 a limit step).
//!
//! This is the actuator behind memcolo's asynchronous, feedback-directed reclaim
//! (Hermit, NSDI'23: reclaim off the application's critical path) and M3's
//! reclamation of best-effort memory (M3 §5). The caller needs `PTRACE_MODE_READ` on
//! the target and `CAP_SYS_NICE`; file pages are only paged out when the caller owns
//! the file or may write it; pages shared with other processes are skipped by the
//! kernel.
//!
//! [`drop_file_cache`] and [`reclaim_cgroup_file_first`] reclaim a BE job's clean page
//! cache before anything else, lowest file offset first (see there for why that order
//! keeps a looping scan's hits where the kernel's LRU loses all of them).
//!
//! # Acting only on the process meant
//!
//! The agent runs as root and a tenant picks when its processes exit, so a pid is
//! never enough to act on: every action here goes through a [`ProvenProcess`] (a
//! pidfd proved to be the registered process, with its start time and credentials),
//! re-verified just before each batch ([`PageoutCursor::pageout`],
//! [`reclaim_process`]). A process that exited, or now holds other credentials (a
//! set-user-ID exec), fails the batch: not found (`ESRCH`) or refused (`EPERM`).
//! `/proc/PID/maps` and `stat` are read by pid, then the pidfd is checked still alive,
//! which proves they were that process's. Files are reached only through
//! [`ProcessFiles`] (`pidfd_getfd(2)`, no path is opened, and only regular files the
//! process's own uid owns), so a FIFO swapped over a descriptor is never opened and a
//! root-owned file a BE job holds keeps its page cache.

use crate::cgroup::{CgroupVersion, Limit, MemoryCgroup};
use crate::error::{Error, Result};
use crate::filecache::{CachedFile, ExpectedProcess, ProcessFiles};
use crate::identity::ProvenProcess;
use crate::pidfd::pidfd_exited;
use crate::procfs::{MapsEntry, ProcFs};
use memcolo_policy::types::Pid;
use serde::Serialize;
use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::sync::Arc;

/// The advice given to the target's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum ReclaimAdvice {
    /// `MADV_COLD`: deactivate (cheap, reversible, nothing is freed right away).
    Cold,
    /// `MADV_PAGEOUT`: reclaim now.
    Pageout,
}

impl ReclaimAdvice {
    fn raw(self) -> i32 {
        match self {
            ReclaimAdvice::Cold => libc::MADV_COLD,
            ReclaimAdvice::Pageout => libc::MADV_PAGEOUT,
        }
    }
}

/// Which virtual memory areas to advise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum VmaKind {
    /// Anonymous memory (heap, stacks, anonymous mappings): needs swap to be paged out.
    Anon,
    /// File-backed and shmem mappings. Private file mappings also hold anonymous
    /// copy-on-write pages (a library's written data): with swap on, `MADV_PAGEOUT`
    /// swaps those out too.
    File,
    /// Both.
    All,
}

/// What [`reclaim_process`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReclaimReport {
    /// VMAs selected.
    pub vmas: usize,
    /// Bytes of address space advised (not the bytes freed: measure RSS for that).
    pub advised_bytes: u64,
    /// VMAs the kernel refused (`EINVAL` for locked, huge-TLB or `VM_PFNMAP` areas;
    /// `ENOMEM` for areas unmapped meanwhile).
    pub skipped_vmas: usize,
}

/// Largest iovec count per call (`UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// Pseudo-VMAs that cannot take LRU advice.
fn is_special(vma: &MapsEntry) -> bool {
    matches!(
        vma.path.as_deref(),
        Some(
            "[vdso]"
                | "[vvar]"
                | "[vvar_vclock]"
                | "[vsyscall]"
                | "[uprobes]"
                | "[sigpage]"
                | "[vectors]"
        )
    )
}

fn selected(vma: &MapsEntry, kind: VmaKind) -> bool {
    if is_special(vma) || vma.start >= vma.end {
        return false;
    }
    match kind {
        VmaKind::Anon => !vma.is_file_backed(),
        VmaKind::File => vma.is_file_backed(),
        VmaKind::All => true,
    }
}

/// `process_madvise(pidfd, iov, n, advice, 0)` over `ranges` (byte addresses in the
/// target), batched by `UIO_MAXIOV`. A range the kernel refuses (`EINVAL`, `ENOMEM`)
/// is skipped and counted; other errors end the call. Returns
/// `(advised_bytes, skipped_ranges)`.
pub fn process_madvise(
    pidfd: BorrowedFd<'_>,
    ranges: &[Range<u64>],
    advice: ReclaimAdvice,
) -> Result<(u64, usize)> {
    let mut advised = 0u64;
    let mut skipped = 0usize;
    // (base, len) of what is left to advise.
    let mut todo: Vec<(u64, u64)> = ranges
        .iter()
        .filter(|r| r.end > r.start)
        .map(|r| (r.start, r.end - r.start))
        .collect();
    let mut first = 0;
    while first < todo.len() {
        let batch = &todo[first..todo.len().min(first + IOV_MAX)];
        let iov: Vec<libc::iovec> = batch
            .iter()
            .map(|&(base, len)| libc::iovec {
                iov_base: base as usize as *mut libc::c_void,
                iov_len: len as usize,
            })
            .collect();
        // SAFETY: iov points to `iov.len()` valid iovecs; the addresses are in the
        // target process, which the kernel checks; nothing in this process is touched.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd.as_raw_fd(),
                iov.as_ptr(),
                iov.len(),
                advice.raw(),
                0u32,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // The first range of the batch was refused: skip it.
                Some(libc::EINVAL) | Some(libc::ENOMEM) => {
                    skipped += 1;
                    first += 1;
                    continue;
                }
                Some(libc::EINTR) => continue,
                _ => {
                    return Err(Error::Syscall {
                        call: format!("process_madvise({advice:?})"),
                        source: e,
                    })
                }
            }
        }
        // Partial progress: advance over the bytes done.
        let mut done = rc as u64;
        advised += done;
        while done > 0 && first < todo.len() {
            let (base, len) = todo[first];
            if done >= len {
                done -= len;
                first += 1;
            } else {
                todo[first] = (base + done, len - done);
                done = 0;
            }
        }
    }
    Ok((advised, skipped))
}

/// Re-verifies `p` ([`ProvenProcess::verify`]: alive, same credentials as proved).
/// Errors: not found when it exited, `EPERM` when its credentials changed.
fn verify(procfs: &ProcFs, p: &ProvenProcess) -> Result<()> {
    p.verify(procfs).map_err(ProvenProcess::into_error)
}

/// `p`'s VMAs of `kind`, read by pid from `procfs` and proved to be its own (its pidfd
/// still alive after the read). Errors: not found when it exited.
fn vmas_of(procfs: &ProcFs, p: &ProvenProcess, kind: VmaKind) -> Result<Vec<Range<u64>>> {
    let vmas = procfs
        .read_pid_maps(p.pid())?
        .into_iter()
        .filter(|v| selected(v, kind))
        .map(|v| v.start..v.end)
        .collect();
    still_alive(p)?;
    Ok(vmas)
}

/// `p`'s RSS in bytes, read by pid and proved its own like [`vmas_of`].
fn rss_of(procfs: &ProcFs, p: &ProvenProcess) -> Result<u64> {
    let rss = procfs.read_pid_stat(p.pid())?.rss_pages * ProcFs::page_size();
    still_alive(p)?;
    Ok(rss)
}

fn still_alive(p: &ProvenProcess) -> Result<()> {
    if pidfd_exited(p.pidfd())? {
        return Err(Error::Syscall {
            call: format!("pid {}: exited", p.pid()),
            source: io::Error::from_raw_os_error(libc::ESRCH),
        });
    }
    Ok(())
}

/// Advises every VMA of `kind` of process `p` (read from `procfs`'s maps) with
/// `advice`, through its pidfd, after re-verifying it. Errors: not found when the
/// process has exited; `EPERM` when its credentials changed since the proof, or
/// without `CAP_SYS_NICE`/ptrace access; `ENOSYS` before Linux 5.10.
pub fn reclaim_process(
    procfs: &ProcFs,
    p: &ProvenProcess,
    advice: ReclaimAdvice,
    kind: VmaKind,
) -> Result<ReclaimReport> {
    verify(procfs, p)?;
    let vmas = vmas_of(procfs, p, kind)?;
    let (advised_bytes, skipped_vmas) = process_madvise(p.pidfd(), &vmas, advice)?;
    Ok(ReclaimReport {
        vmas: vmas.len(),
        advised_bytes,
        skipped_vmas,
    })
}

/// What one reclaim batch achieved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BatchOutcome {
    /// Bytes of memory taken from the target during the batch. A process: its RSS
    /// before minus after (0 when it grew meanwhile). A cgroup: the larger of its usage
    /// drop and what the kernel took from it meanwhile (v2 `pgsteal`, v1
    /// `total_pgpgout`: pages uncharged, frees by the group's own processes included),
    /// so that a group that keeps allocating while it is reclaimed — a batch job
    /// refaulting what the batch swaps out — is not credited with only the net drop.
    pub reclaimed_bytes: u64,
    /// Bytes of address space advised (`process_madvise`) or requested (cgroup).
    pub requested_bytes: u64,
}

/// Reclaims about `bytes` from memory cgroup `cg` on the calling thread, choosing
/// pages by the kernel's own LRU of that group (so its coldest pages go first):
///
/// - cgroup v2: `memory.reclaim` (Linux 5.19+).
/// - cgroup v1, which has no such file: lowers `memory.limit_in_bytes` to
///   usage − `bytes`, which makes the kernel reclaim the difference from the group on
///   this thread, then restores the previous limit. While the limit is lowered the
///   group's own allocations reclaim from the group too (never from anyone else).
///   The kernel answers `EBUSY` when it cannot get below the lowered limit; that is
///   not an error here: whatever it reclaimed is reported.
///
/// Errors: the group vanished (not found); the previous limit could not be restored
/// ([`Error::Io`] naming `memory.limit_in_bytes`: the caller must retry the restore,
/// the group is left throttled until then).
pub fn reclaim_cgroup(cg: &MemoryCgroup, bytes: u64) -> Result<BatchOutcome> {
    let before = cg.read_usage_bytes()?;
    let taken_before = taken_pages(cg);
    match cg.version() {
        CgroupVersion::V2 => match cg.reclaim(bytes) {
            Ok(()) => {}
            // EAGAIN: reclaimed less than asked.
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
            Err(e) => return Err(e),
        },
        CgroupVersion::V1 => {
            let previous = cg.read_limit()?;
            let lowered = before.saturating_sub(bytes).max(PAGE);
            let stepped = cg.write_limit(Limit::Bytes(lowered));
            let restored = cg.write_limit(previous);
            match stepped {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => {
                    restored?;
                    return Err(e);
                }
            }
            restored?;
        }
    }
    let after = cg.read_usage_bytes()?;
    let taken = match (taken_before, taken_pages(cg)) {
        (Some(a), Some(b)) => b.saturating_sub(a) * PAGE,
        _ => 0,
    };
    Ok(BatchOutcome {
        reclaimed_bytes: before.saturating_sub(after).max(taken),
        requested_bytes: bytes,
    })
}

/// Pages the kernel has taken from `cg` so far: v2 `pgsteal` (reclaimed), v1
/// `total_pgpgout` (uncharged: reclaimed or freed; v1 has no reclaim counter).
/// `None` when the file or the field is missing.
fn taken_pages(cg: &MemoryCgroup) -> Option<u64> {
    let stat = cg.read_memory_stat().ok()?;
    let key = match cg.version() {
        CgroupVersion::V1 => "total_pgpgout",
        CgroupVersion::V2 => "pgsteal",
    };
    stat.raw.get(key).copied()
}

const PAGE: u64 = 4096;

/// A file's identity: `(st_dev, st_ino)` (defined with the open-file readers).
pub use crate::filecache::FileId;

/// What [`drop_file_cache`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FileDropReport {
    /// Bytes of page cache dropped, measured with `cachestat(2)` before and after each
    /// advice (not the advised range).
    pub dropped_bytes: u64,
    /// Files advised.
    pub files: usize,
    /// Clean, unprotected page cache of the processes' files before the drop, bytes.
    pub droppable_bytes: u64,
}

/// Pages of `[off, off + len)` of `file` in the page cache, and how many of them are
/// clean (neither dirty nor under writeback), from `cachestat(2)` (Linux 6.5+;
/// `len` 0: to the end of the file). Errors: [`Error::Unsupported`] on `ENOSYS`.
fn cachestat_range(file: &File, path: &Path, off: u64, len: u64) -> Result<(u64, u64)> {
    let cs = crate::filecache::cachestat_range(file, path, off, len)?;
    let clean = cs
        .cache_pages
        .saturating_sub(cs.dirty_pages)
        .saturating_sub(cs.writeback_pages);
    Ok((cs.cache_pages, clean))
}

/// One regular file of the processes, on the agent's own descriptor.
struct OpenCached {
    file: CachedFile,
    size: u64,
    clean_bytes: u64,
}

/// Regular files owned by their process's uid that `procs` hold open
/// ([`ProcessFiles::owned_open_files`]: `pidfd_getfd(2)`, nothing opened by path;
/// mapped pages cannot be dropped by advice), deduplicated by identity, without
/// `protected` ones, empty ones and memory-backed ones. A process that exited or
/// cannot be read is skipped.
fn open_files(procs: &[ProcessFiles], protected: &HashSet<FileId>) -> Vec<OpenCached> {
    let mut seen: HashSet<FileId> = HashSet::new();
    let mut out = Vec::new();
    for p in procs {
        let Ok((files, _)) = p.owned_open_files() else {
            continue;
        };
        for file in files {
            let id = file.id();
            if file.size_bytes() == 0 || protected.contains(&id) || !seen.insert(id) {
                continue;
            }
            out.push(OpenCached {
                size: file.size_bytes(),
                file,
                clean_bytes: 0,
            });
        }
    }
    out
}

/// Windows `cachestat(2)` looks at while finding how far to advise: a coarse one to
/// skip what is not cached, a fine one to stop near the amount wanted.
const COARSE_WINDOW: u64 = 64 << 20;
const FINE_WINDOW: u64 = 1 << 20;

/// Drops up to about `bytes` (1 MiB granularity) of clean page cache of the regular
/// files that processes `procs` hold open and their own uid owns (see
/// [`ProcessFiles`]: a root-owned file a BE job holds is never advised), with `posix_fadvise(POSIX_FADV_DONTNEED)`:
/// the file with the most clean cache first (Hermes, Middleware'21 §3.3: largest file
/// first), and within a file **the lowest offsets first**. Files in `protected`
/// (those an LC process holds) are never advised; dirty, under-writeback and mapped
/// pages are not dropped (the kernel skips them).
///
/// Why clean page cache first: dropping it needs no swap I/O, no compression and no
/// TLB shootdown, and a BE job's file pages are usually use-once. Why lowest offset
/// first rather than least recently used: a batch job scans files sequentially,
/// often again and again (an input read every iteration). On a scan that loops over
/// a file larger than the cache, the LRU evicts exactly the pages the scan needs next
/// and every read misses; keeping a fixed part of the file (the high offsets) and
/// sacrificing another (the low ones) makes the kept part hit on every pass, which is
/// the best any policy can do for a loop (Belady: evict what is reused last). For a
/// use-once forward scan the lowest offsets are the oldest, already consumed pages.
/// (Measured in `bench/reclaim`: a file streamer looping over 1.33 GiB in a node that
/// keeps 1.25 GiB of it read everything from disk under the kernel's LRU.)
///
/// Returns what was dropped, measured with `cachestat(2)` around each advice.
/// Processes and files that vanish meanwhile are skipped. Errors:
/// [`Error::Unsupported`] before Linux 6.5 (no `cachestat`); an `fadvise` failure on
/// a file, naming it.
pub fn drop_file_cache(
    procs: &[ProcessFiles],
    bytes: u64,
    protected: &HashSet<FileId>,
) -> Result<FileDropReport> {
    let page = ProcFs::page_size();
    let mut files = open_files(procs, protected);
    let mut report = FileDropReport::default();
    for f in files.iter_mut() {
        f.clean_bytes = cachestat_range(&f.file.file, f.file.path(), 0, 0)?.1 * page;
        report.droppable_bytes += f.clean_bytes;
    }
    files.retain(|f| f.clean_bytes > 0);
    files.sort_by_key(|f| std::cmp::Reverse(f.clean_bytes));
    for f in &files {
        if report.dropped_bytes >= bytes {
            break;
        }
        let want = bytes - report.dropped_bytes;
        // [start, end): from the first cached window to where `want` clean bytes lie.
        let mut start: Option<u64> = None;
        let mut clean = 0u64;
        let mut off = 0u64;
        while off < f.size && clean < want {
            let (_, c) = cachestat_range(&f.file.file, f.file.path(), off, COARSE_WINDOW)?;
            let c = c * page;
            if c == 0 {
                off += COARSE_WINDOW;
                continue;
            }
            if clean + c <= want {
                start.get_or_insert(off);
                clean += c;
                off += COARSE_WINDOW;
                continue;
            }
            let end = (off + COARSE_WINDOW).min(f.size);
            while off < end && clean < want {
                let (_, c) = cachestat_range(&f.file.file, f.file.path(), off, FINE_WINDOW)?;
                if c > 0 {
                    start.get_or_insert(off);
                    clean += c * page;
                }
                off += FINE_WINDOW;
            }
        }
        let Some(start) = start else { continue };
        let end = off.min(f.size.next_multiple_of(page));
        let len = end - start;
        let (before, _) = cachestat_range(&f.file.file, f.file.path(), start, len)?;
        // SAFETY: an open fd; offsets within the file.
        let rc = unsafe {
            libc::posix_fadvise(
                f.file.file.as_raw_fd(),
                start as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        if rc != 0 {
            // posix_fadvise returns the error number instead of setting errno.
            return Err(Error::io(f.file.path(), io::Error::from_raw_os_error(rc)));
        }
        let (after, _) = cachestat_range(&f.file.file, f.file.path(), start, len)?;
        report.dropped_bytes += before.saturating_sub(after) * page;
        report.files += 1;
    }
    Ok(report)
}

/// [`reclaim_cgroup`] with the group's clean page cache first: drops up to `bytes`
/// of the page cache of files processes `procs` (the group's, proved: see
/// [`group_processes`]; the caller keeps only those it may act for) hold open and own
/// ([`drop_file_cache`], never files in `protected`), and asks the kernel's LRU of
/// the group (v1 limit step, v2 `memory.reclaim`) only for what is still missing.
/// The v1 limit step throttles every allocation of the group while it lasts; dropping
/// page cache does not. Before Linux 6.5 (no `cachestat`) it is [`reclaim_cgroup`].
///
/// Errors: as [`reclaim_cgroup`], and an `fadvise` failure naming the file.
pub fn reclaim_cgroup_file_first(
    cg: &MemoryCgroup,
    procs: &[ProcessFiles],
    bytes: u64,
    protected: &HashSet<FileId>,
) -> Result<BatchOutcome> {
    let dropped = match drop_file_cache(procs, bytes, protected) {
        Ok(r) => r.dropped_bytes,
        Err(Error::Unsupported { .. }) => 0,
        Err(e) => return Err(e),
    };
    // Within the advice's granularity of what was asked: no limit step for the crumbs.
    if dropped + FINE_WINDOW > bytes {
        return Ok(BatchOutcome {
            reclaimed_bytes: dropped,
            requested_bytes: bytes,
        });
    }
    let rest = reclaim_cgroup(cg, bytes - dropped)?;
    Ok(BatchOutcome {
        reclaimed_bytes: rest.reclaimed_bytes + dropped,
        requested_bytes: bytes,
    })
}

/// The processes of `cg` (its descendants' groups included), each proved
/// ([`ProcessFiles::open`] with the start time read just before: whichever process
/// holds the pid then, proved alive and with its real, effective, saved and
/// filesystem uids one uid). The caller decides whose files it may act on (by
/// [`ProvenProcess::credentials`] of [`ProcessFiles::process`]). Processes that exit
/// meanwhile or whose uids differ are left out. Errors: the group vanished.
pub fn group_processes(cg: &MemoryCgroup, procfs: &ProcFs) -> Result<Vec<ProcessFiles>> {
    let mut out = Vec::new();
    for pid in cg.read_procs_recursive()? {
        let Ok(st) = procfs.read_pid_stat(pid) else {
            continue;
        };
        let want = ExpectedProcess {
            pid,
            starttime_ticks: st.starttime_ticks,
            uid: None,
        };
        if let Ok(p) = ProcessFiles::open(procfs, want) {
            out.push(p);
        }
    }
    Ok(out)
}

/// A clock hand over one process's address space for batched `MADV_PAGEOUT`: each
/// [`PageoutCursor::pageout`] advises the ranges after the hand in one
/// `process_madvise` call over many ranges (the user-space analogue of Hermit's
/// batched unmap, TLB shootdown and swap I/O), and moves the hand on, wrapping at the
/// end. Without access bits from user space the hand cannot skip hot pages; use it
/// where no cgroup of the target's own is available ([`reclaim_cgroup`] lets the
/// kernel's LRU choose instead).
#[derive(Debug)]
pub struct PageoutCursor {
    proc_: Arc<ProvenProcess>,
    kind: VmaKind,
    hand: u64,
}

impl PageoutCursor {
    /// A hand at the lowest address of `proc_`, a process proved to be the target
    /// (every batch acts through its pidfd, never by pid).
    pub fn new(proc_: Arc<ProvenProcess>, kind: VmaKind) -> PageoutCursor {
        PageoutCursor {
            proc_,
            kind,
            hand: 0,
        }
    }

    /// The target's pid.
    pub fn pid(&self) -> Pid {
        self.proc_.pid()
    }

    /// The target.
    pub fn process(&self) -> &Arc<ProvenProcess> {
        &self.proc_
    }

    /// Pages out about `bytes` of the target's resident memory: advises up to `bytes`
    /// of address space per call from the hand on, until RSS fell by `bytes` or the
    /// hand went once around. The process is re-verified first
    /// ([`ProvenProcess::verify`]). Errors: the process exited (not found /
    /// `ESRCH`); `EPERM` when its credentials changed since the proof, or without
    /// `CAP_SYS_NICE` or ptrace access.
    pub fn pageout(&mut self, procfs: &ProcFs, bytes: u64) -> Result<BatchOutcome> {
        let p = self.proc_.clone();
        verify(procfs, &p)?;
        let start_rss = rss_of(procfs, &p)?;
        let vmas = vmas_of(procfs, &p, self.kind)?;
        let total: u64 = vmas.iter().map(|r| r.end - r.start).sum();
        let mut out = BatchOutcome::default();
        let mut scanned = 0u64;
        while scanned < total {
            let ranges = ranges_after(&vmas, self.hand, bytes.max(PAGE));
            let Some(last) = ranges.last() else { break };
            let next_hand = last.end;
            let len: u64 = ranges.iter().map(|r| r.end - r.start).sum();
            let (advised, _) = process_madvise(p.pidfd(), &ranges, ReclaimAdvice::Pageout)?;
            out.requested_bytes += advised;
            scanned += len;
            self.hand = next_hand;
            out.reclaimed_bytes = start_rss.saturating_sub(rss_of(procfs, &p)?);
            if out.reclaimed_bytes >= bytes {
                break;
            }
        }
        Ok(out)
    }
}

/// Up to `budget` bytes of `vmas` (sorted, disjoint) starting at the first address at
/// or after `hand`, wrapping to the lowest address; at most [`IOV_MAX`] ranges.
fn ranges_after(vmas: &[Range<u64>], hand: u64, budget: u64) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    if vmas.is_empty() {
        return out;
    }
    let first = vmas.iter().position(|v| v.end > hand).unwrap_or(0);
    let mut left = budget;
    for i in 0..vmas.len() {
        let v = &vmas[(first + i) % vmas.len()];
        let start = if i == 0 && hand > v.start && hand < v.end {
            hand
        } else {
            v.start
        };
        let len = (v.end - start).min(left);
        out.push(start..start + len);
        left -= len;
        if left == 0 || out.len() == IOV_MAX {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn selects_vmas_by_kind_and_skips_pseudo_areas() {
        let text = "\
00400000-00401000 r--p 00000000 fe:00 247702   /usr/bin/python3.11\n\
01000000-01100000 rw-p 00000000 00:00 0        [heap]\n\
7f0000000000-7f0000100000 rw-p 00000000 00:00 0 \n\
7f0000100000-7f0000200000 rw-s 00000000 00:01 44   /dev/zero (deleted)\n\
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0   [stack]\n\
7ffd00030000-7ffd00034000 r--p 00000000 00:00 0   [vvar]\n\
7ffd00034000-7ffd00036000 r-xp 00000000 00:00 0   [vdso]\n\
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0  [vsyscall]\n";
        let vmas = crate::procfs::parse_maps(text, Path::new("/proc/1/maps")).unwrap();
        assert_eq!(vmas.len(), 8);
        let pick = |k| {
            vmas.iter()
                .filter(|v| selected(v, k))
                .map(|v| v.start)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            pick(VmaKind::Anon),
            vec![0x0100_0000, 0x7f00_0000_0000, 0x7ffd_0000_0000]
        );
        assert_eq!(pick(VmaKind::File), vec![0x0040_0000, 0x7f00_0010_0000]);
        assert_eq!(pick(VmaKind::All).len(), 5);
    }

    #[test]
    fn the_clock_hand_takes_ranges_in_order_and_wraps() {
        let v = vec![0x1000..0x5000, 0x10000..0x12000, 0x20000..0x30000];
        // From the start: the first VMA whole, then part of the second.
        assert_eq!(
            ranges_after(&v, 0, 0x5000),
            vec![0x1000..0x5000, 0x10000..0x11000]
        );
        // From the middle of the second VMA.
        assert_eq!(
            ranges_after(&v, 0x11000, 0x3000),
            vec![0x11000..0x12000, 0x20000..0x22000]
        );
        // Past the last VMA: wraps to the lowest.
        assert_eq!(ranges_after(&v, 0x30000, 0x1000), vec![0x1000..0x2000]);
        // A budget larger than everything visits each VMA once, from the hand on.
        let all = ranges_after(&v, 0x2000, 1 << 40);
        assert_eq!(
            all,
            vec![0x2000..0x5000, 0x10000..0x12000, 0x20000..0x30000]
        );
        assert!(ranges_after(&[], 0, 4096).is_empty());
    }
}
