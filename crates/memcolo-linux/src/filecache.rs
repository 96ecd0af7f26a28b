//! Page-cache residency of files, and dropping it; and the files of a process whose
//! page cache the agent may drop.
//!
//! Hermes (Middleware'21, §3.3) frees memory for latency-critical services by advising
//! the kernel to drop best-effort jobs' file cache, largest file first
//! (`posix_fadvise(POSIX_FADV_DONTNEED)`). [`resident_bytes`] measures how much of a file
//! is cached: with `cachestat(2)` (Linux 6.5+), else with `mmap` + `mincore(2)`.
//!
//! # Reaching a tenant's files without its paths
//!
//! The agent runs as root; a BE tenant controls the paths its files have (it can
//! rename, swap in a FIFO or a symlink, or bind-mount over them in its own user and
//! mount namespaces). So nothing here opens a path on a tenant's behalf.
//! [`ProcessFiles::open`] first proves a pid is the process the agent expects
//! (`pidfd_open(2)`, then `/proc/PID/stat` start time and `/proc/PID/status` uids read
//! through a `/proc/PID` directory fd, then the pidfd checked still alive, which proves
//! the reads were that process's). [`ProcessFiles::owned_files`] then reaches:
//!
//! - open files with `pidfd_getfd(2)` (Linux 5.6+): a duplicate of the process's own
//!   open file description, so nothing is opened at all (no FIFO open, no device
//!   driver's `open`);
//! - mapped files through `/proc/PID/map_files/<start>-<end>`: magic links (following
//!   them needs `CAP_SYS_ADMIN`) to exactly the mapped file, with no path walk, opened
//!   `O_PATH` (no `open` method runs), checked with `fstat`, and only then, when they
//!   are regular files, reopened for reading through `/proc/self/fd/N`.
//!
//! Only regular files whose owner is the process's uid are kept: a BE job may have a
//! root-owned shared library or another user's database open, and must not be able to
//! have the agent evict those for it. [`ProcessFiles::file_ids`] lists the identities
//! of every file a process holds (for the LC processes' files that are never advised)
//! with `fstatat` through the same magic links, without opening anything.
//!
//! Any of these calls can block on a file system that does not answer (FUSE); callers
//! run them off their main loop.

use crate::error::{Error, Result};
use crate::identity::{IdentityError, ProvenProcess};
use crate::pidfd;
use crate::procfs::ProcFs;
use memcolo_policy::types::Pid;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};
use serde::Serialize;
use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A file's identity: `(st_dev, st_ino)`.
pub type FileId = (u64, u64);

/// `cachestat(2)`'s syscall number; the same on every architecture (asm-generic table).
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct RawCachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// The page-cache state of a whole file from `cachestat(2)`, in pages of
/// [`ProcFs::page_size`] bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStat {
    /// Pages in the page cache.
    pub cache_pages: u64,
    /// Cached pages that are dirty (not written back yet; DONTNEED cannot drop them).
    pub dirty_pages: u64,
    /// Pages under writeback.
    pub writeback_pages: u64,
    /// Pages evicted from the cache (shadow entries remain).
    pub evicted_pages: u64,
    /// Evicted pages that would have been in the working set (a refault now would be
    /// a working-set refault).
    pub recently_evicted_pages: u64,
}

fn open(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| Error::io(path, e))
}

/// `cachestat(2)` on the whole of `path`. Errors: [`Error::Unsupported`] when the kernel
/// has no `cachestat` (`ENOSYS`, before Linux 6.5).
pub fn cache_stat(path: &Path) -> Result<CacheStat> {
    let file = open(path)?;
    cachestat_fd(&file, path)
}

fn cachestat_fd(file: &File, path: &Path) -> Result<CacheStat> {
    cachestat_range(file, path, 0, 0) // len 0: to the end of the file
}

/// `cachestat(2)` on bytes `[off, off + len)` of `file` (`len` 0: to the end of the
/// file); `path` names the file in errors. Errors: [`Error::Unsupported`] on `ENOSYS`
/// (before Linux 6.5), [`Error::Io`] otherwise.
pub(crate) fn cachestat_range(file: &File, path: &Path, off: u64, len: u64) -> Result<CacheStat> {
    let range = CachestatRange { off, len };
    let mut cs = RawCachestat::default();
    // SAFETY: both pointers refer to live, correctly laid-out structs.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut cs as *mut RawCachestat,
            0,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            return Err(Error::Unsupported {
                what: "cachestat(2) (Linux 6.5+)".into(),
            });
        }
        return Err(Error::io(path, e));
    }
    Ok(CacheStat {
        cache_pages: cs.nr_cache,
        dirty_pages: cs.nr_dirty,
        writeback_pages: cs.nr_writeback,
        evicted_pages: cs.nr_evicted,
        recently_evicted_pages: cs.nr_recently_evicted,
    })
}

/// Bytes of `path` resident in the page cache (a multiple of the page size, at most the
/// file size rounded up to a page). An empty file gives 0.
///
/// Opens `path` as the caller: for the caller's own files only; the agent reaches a
/// tenant's files through [`ProcessFiles`] instead.
///
/// Uses `cachestat(2)`; on `ENOSYS` falls back to a shared read-only mapping and
/// `mincore(2)` (which, since Linux 5.0, only reports page-cache state of files the
/// caller owns or could open for writing).
pub fn resident_bytes(path: &Path) -> Result<u64> {
    let file = open(path)?;
    let size = file.metadata().map_err(|e| Error::io(path, e))?.size();
    resident_bytes_of(&file, path, size)
}

fn resident_bytes_of(file: &File, path: &Path, size: u64) -> Result<u64> {
    if size == 0 {
        return Ok(0);
    }
    let page = ProcFs::page_size();
    match cachestat_fd(file, path) {
        Ok(cs) => return Ok(cs.cache_pages * page),
        Err(Error::Unsupported { .. }) => {}
        Err(e) => return Err(e),
    }
    mincore_resident_bytes(file, path, size, page)
}

fn mincore_resident_bytes(file: &File, path: &Path, size: u64, page: u64) -> Result<u64> {
    let len = usize::try_from(size).map_err(|_| Error::Unsupported {
        what: format!("mapping a file of {size} bytes"),
    })?;
    // SAFETY: a fresh shared read-only mapping of an open file; unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(Error::io(path, io::Error::last_os_error()));
    }
    let pages = len.div_ceil(page as usize);
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` has one byte per page of the mapping.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmapping exactly what we mapped.
    unsafe { libc::munmap(addr, len) };
    if rc < 0 {
        return Err(Error::io(path, err));
    }
    Ok(vec.iter().filter(|b| *b & 1 != 0).count() as u64 * page)
}

/// Asks the kernel to drop `path`'s clean page cache:
/// `posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`. Dirty and mapped pages stay; the
/// call is advice and reports no count (measure with [`resident_bytes`]). Opens
/// `path` as the caller, like [`resident_bytes`].
pub fn fadvise_dontneed(path: &Path) -> Result<()> {
    let file = open(path)?;
    fadvise_dontneed_fd(&file, path)
}

fn fadvise_dontneed_fd(file: &File, path: &Path) -> Result<()> {
    // SAFETY: an open fd; offset 0, len 0 = the whole file.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        // posix_fadvise returns the error number instead of setting errno.
        return Err(Error::io(path, io::Error::from_raw_os_error(rc)));
    }
    Ok(())
}

/// A regular file a process holds open or has mapped, reached without a path walk
/// (see the module docs): the agent's own descriptor of it, its identity and a
/// descriptive path.
#[derive(Debug)]
pub struct CachedFile {
    pub(crate) file: File,
    id: FileId,
    size_bytes: u64,
    path: PathBuf,
}

impl CachedFile {
    /// Wraps a regular file the caller opened itself; `path` names it in logs.
    /// Errors: [`Error::InvalidArgument`] when `file` is not a regular file.
    pub fn from_file(file: File, path: impl Into<PathBuf>) -> Result<CachedFile> {
        let path = path.into();
        let st = nix::sys::stat::fstat(file.as_raw_fd())
            .map_err(|e| Error::io(&path, io::Error::from(e)))?;
        if !is_regular(&st) {
            return Err(Error::InvalidArgument {
                what: format!("{} is not a regular file", path.display()),
            });
        }
        Ok(CachedFile {
            file,
            id: (st.st_dev, st.st_ino),
            size_bytes: st.st_size.max(0) as u64,
            path,
        })
    }

    /// `(st_dev, st_ino)` from `fstat` on the agent's descriptor.
    pub fn id(&self) -> FileId {
        self.id
    }

    /// A path for logs only: the `readlink` of the magic link the file was reached
    /// through, as the kernel printed it then (the tenant may have renamed it since;
    /// never opened).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// File size in bytes, when it was reached.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Bytes of the file resident in the page cache, like [`resident_bytes`], on the
    /// agent's descriptor (`cachestat(2)`, else `mincore(2)`, which needs the
    /// descriptor open for reading).
    pub fn resident_bytes(&self) -> Result<u64> {
        resident_bytes_of(&self.file, &self.path, self.size_bytes)
    }

    /// Bytes of the file's page cache that advice can drop: resident pages neither
    /// dirty nor under writeback (`cachestat(2)`); on kernels without `cachestat`,
    /// [`CachedFile::resident_bytes`].
    pub fn clean_bytes(&self) -> Result<u64> {
        if self.size_bytes == 0 {
            return Ok(0);
        }
        match cachestat_fd(&self.file, &self.path) {
            Ok(cs) => Ok(cs
                .cache_pages
                .saturating_sub(cs.dirty_pages)
                .saturating_sub(cs.writeback_pages)
                * ProcFs::page_size()),
            Err(Error::Unsupported { .. }) => self.resident_bytes(),
            Err(e) => Err(e),
        }
    }

    /// `posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)` on the agent's descriptor.
    pub fn fadvise_dontneed(&self) -> Result<()> {
        fadvise_dontneed_fd(&self.file, &self.path)
    }
}

/// Whether `file` lives on tmpfs (shared memory and memfd included), ramfs or
/// hugetlbfs (`fstatfs(2)` magic numbers, linux/magic.h); true when `fstatfs` fails.
fn is_memory_backed(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    let mut sfs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: an open descriptor and a buffer of the right type.
    if unsafe { libc::fstatfs(file.as_raw_fd(), sfs.as_mut_ptr()) } != 0 {
        return true;
    }
    // SAFETY: fstatfs succeeded and filled the buffer.
    // `f_type` is `__fsword_t`: i64 on x86_64, narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let f_type = unsafe { sfs.assume_init() }.f_type as i64;
    [TMPFS_MAGIC, RAMFS_MAGIC, HUGETLBFS_MAGIC].contains(&f_type)
}

fn is_regular(st: &libc::stat) -> bool {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG
}

/// What the agent expects of a process before it touches the process's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ExpectedProcess {
    /// Process id (a thread-group leader).
    pub pid: Pid,
    /// Start time in clock ticks after boot (`/proc/PID/stat` field 22): the one
    /// recorded at registration for a registered process, the one the same poll saw
    /// for a descendant.
    pub starttime_ticks: u64,
    /// The uid the process must run as; `None`: any, as long as its real, effective,
    /// saved and filesystem uids are one uid.
    pub uid: Option<u32>,
}

/// Which files [`ProcessFiles::owned_files`] left out, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SkippedFiles {
    /// Not regular files (sockets, pipes, FIFOs, devices, directories...).
    pub not_regular: u64,
    /// Regular files owned by another uid than the process's (rule: a job may only
    /// have its own files advised).
    pub foreign: u64,
    /// Files of memory-backed file systems (tmpfs, shared memory, memfd, ramfs,
    /// hugetlbfs): their page cache is the file's only copy, advice cannot drop it.
    pub memory_backed: u64,
    /// Descriptors or mappings that went away, or could not be duplicated or reopened.
    pub vanished: u64,
}

/// The files of a process whose identity was proven (see [`ProcessFiles::open`]): its
/// [`ProvenProcess`] (pidfd, start time, credentials) and a `/proc/PID` directory
/// descriptor bound to that same process (a later process reusing the pid is not
/// reached through either).
#[derive(Debug)]
pub struct ProcessFiles {
    proc_: ProvenProcess,
    dir: OwnedFd,
}

impl ProcessFiles {
    /// Proves that `want.pid` is the process expected ([`ProcessFiles::open`] with
    /// its start time), that its real, effective, saved and filesystem uids are one
    /// uid (and `want.uid` if given), then opens `<procfs>/PID` as a directory and
    /// checks the pidfd is still alive: the directory descriptor then provably
    /// belongs to that process too.
    ///
    /// Errors: an error for which [`Error::is_not_found`] is true when there is no such
    /// process, it exited, or another process has the pid now (start time differs);
    /// `EPERM` ([`Error::Syscall`]) when its uids are not one uid or not `want.uid`;
    /// [`Error::Parse`] for a malformed file.
    pub fn open(procfs: &ProcFs, want: ExpectedProcess) -> Result<ProcessFiles> {
        let pid = want.pid;
        let gone = |why: String| Error::Syscall {
            call: format!("pid {pid}: {why}"),
            source: io::Error::from_raw_os_error(libc::ESRCH),
        };
        let proc_ = match ProvenProcess::open(procfs, pid, Some(want.starttime_ticks)) {
            Ok(p) => p,
            Err(IdentityError::Os(e)) => return Err(e),
            Err(e) => return Err(gone(e.to_string())),
        };
        Self::of_proven(procfs, proc_, want.uid)
    }

    /// The files of a process already proven (a registered process's pidfd, say):
    /// its real, effective, saved and filesystem uids must be one uid (and `uid` if
    /// given), checked on the credentials of the proof. Errors as
    /// [`ProcessFiles::open`].
    pub fn of_proven(
        procfs: &ProcFs,
        proc_: ProvenProcess,
        uid: Option<u32>,
    ) -> Result<ProcessFiles> {
        let pid = proc_.pid();
        let want_uid = uid;
        let uids = proc_.credentials().uids;
        let uid = uids[0];
        if !proc_.credentials().all_uids_are(uid) || want_uid.is_some_and(|w| w != uid) {
            return Err(Error::Syscall {
                call: format!(
                    "pid {pid}: uids {uids:?}, expected one uid{}",
                    want_uid.map(|u| format!(" = {u}")).unwrap_or_default()
                ),
                source: io::Error::from_raw_os_error(libc::EPERM),
            });
        }
        let dir_path = procfs.path().join(pid.to_string());
        let dir = openat(
            None,
            &dir_path,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        )?;
        let files = ProcessFiles { proc_, dir };
        files.still_alive()?;
        Ok(files)
    }

    /// The process id.
    pub fn pid(&self) -> Pid {
        self.proc_.pid()
    }

    /// The uid it runs as (real = effective = saved = filesystem).
    pub fn uid(&self) -> u32 {
        self.proc_.credentials().ruid()
    }

    fn subdir(&self, name: &str) -> Result<(nix::dir::Dir, PathBuf)> {
        let path = PathBuf::from(format!("/proc/{}/{name}", self.proc_.pid()));
        let fd = openat(
            Some(self.dir.as_raw_fd()),
            Path::new(name),
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        )
        .map_err(|e| relabel(e, &path))?;
        let raw = fd_into_raw(fd);
        let dir = nix::dir::Dir::from_fd(raw).map_err(|e| {
            // SAFETY: from_fd failed, so `raw` is still ours to close.
            unsafe { libc::close(raw) };
            Error::io(&path, io::Error::from(e))
        })?;
        Ok((dir, path))
    }

    /// Names in `/proc/PID/<name>/` (`fd` or `map_files`), without `.` and `..`.
    fn entries(&self, name: &str) -> Result<(nix::dir::Dir, Vec<String>, PathBuf)> {
        let (mut dir, path) = self.subdir(name)?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(|e| Error::io(&path, io::Error::from(e)))?;
            let n = entry.file_name().to_string_lossy();
            if n != "." && n != ".." {
                names.push(n.into_owned());
            }
        }
        Ok((dir, names, path))
    }

    /// The identities `(st_dev, st_ino)` of every file the process holds open or has
    /// mapped, from `fstatat` through `/proc/PID/fd/N` and `/proc/PID/map_files/*`
    /// (nothing is opened; a FIFO does not block). Descriptors and mappings that go
    /// away meanwhile are left out. Errors: the process exited (not found), or a
    /// directory cannot be read (`EACCES` without `CAP_SYS_PTRACE`/`CAP_SYS_ADMIN`).
    pub fn file_ids(&self) -> Result<HashSet<FileId>> {
        let mut ids = HashSet::new();
        for sub in ["fd", "map_files"] {
            let (dir, names, _) = self.entries(sub)?;
            for n in names {
                if let Ok(st) =
                    nix::sys::stat::fstatat(Some(dir.as_raw_fd()), n.as_str(), AtFlags::empty())
                {
                    ids.insert((st.st_dev, st.st_ino));
                }
            }
        }
        self.still_alive()?;
        Ok(ids)
    }

    /// The regular files owned by the process's uid that it holds open
    /// (`pidfd_getfd(2)`) or has mapped (`/proc/PID/map_files`, opened `O_PATH`, then
    /// reopened read-only through `/proc/self/fd` once `fstat` says it is a regular
    /// file), one per `(st_dev, st_ino)`, with counts of what was left out.
    ///
    /// Errors: the process exited (not found); a directory cannot be read; `EPERM`
    /// from `pidfd_getfd` without `CAP_SYS_PTRACE`.
    pub fn owned_files(&self) -> Result<(Vec<CachedFile>, SkippedFiles)> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut skipped = SkippedFiles::default();
        self.open_ones(&mut seen, &mut out, &mut skipped)?;
        self.mapped_ones(&mut seen, &mut out, &mut skipped)?;
        self.still_alive()?;
        Ok((out, skipped))
    }

    /// [`ProcessFiles::owned_files`] without the mapped files: only those the process
    /// holds open (`pidfd_getfd(2)`). For callers whose advice cannot drop mapped
    /// pages anyway (`POSIX_FADV_DONTNEED` skips them). Errors as `owned_files`.
    pub fn owned_open_files(&self) -> Result<(Vec<CachedFile>, SkippedFiles)> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut skipped = SkippedFiles::default();
        self.open_ones(&mut seen, &mut out, &mut skipped)?;
        self.still_alive()?;
        Ok((out, skipped))
    }

    /// The process's proof: pidfd, start time, credentials.
    pub fn process(&self) -> &ProvenProcess {
        &self.proc_
    }

    fn open_ones(
        &self,
        seen: &mut HashSet<FileId>,
        out: &mut Vec<CachedFile>,
        skipped: &mut SkippedFiles,
    ) -> Result<()> {
        let (fd_dir, names, fd_path) = self.entries("fd")?;
        for n in names {
            let Ok(target_fd) = n.parse::<i32>() else {
                continue;
            };
            // A first look without touching the file: most descriptors are sockets
            // and pipes, which are never duplicated.
            match nix::sys::stat::fstatat(Some(fd_dir.as_raw_fd()), n.as_str(), AtFlags::empty()) {
                Ok(st) if !is_regular(&st) => {
                    skipped.not_regular += 1;
                    continue;
                }
                Ok(st) if st.st_uid != self.uid() => {
                    skipped.foreign += 1;
                    continue;
                }
                Ok(st) if seen.contains(&(st.st_dev, st.st_ino)) => continue,
                Ok(_) => {}
                Err(_) => {
                    skipped.vanished += 1;
                    continue;
                }
            }
            let file = match pidfd_getfd(self.proc_.pidfd(), target_fd) {
                Ok(f) => f,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Err(e),
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => return Err(e),
                Err(_) => {
                    skipped.vanished += 1; // closed meanwhile (EBADF)
                    continue;
                }
            };
            let path = readlink_at(&fd_dir, &n, &fd_path);
            self.keep(file, path, seen, out, skipped);
        }
        Ok(())
    }

    fn mapped_ones(
        &self,
        seen: &mut HashSet<FileId>,
        out: &mut Vec<CachedFile>,
        skipped: &mut SkippedFiles,
    ) -> Result<()> {
        let (map_dir, names, _) = self.entries("map_files")?;
        for n in names {
            let opath = match openat(
                Some(map_dir.as_raw_fd()),
                Path::new(&n),
                OFlag::O_PATH | OFlag::O_CLOEXEC,
            ) {
                Ok(f) => f,
                Err(_) => {
                    skipped.vanished += 1;
                    continue;
                }
            };
            let st = match nix::sys::stat::fstat(opath.as_raw_fd()) {
                Ok(st) => st,
                Err(_) => {
                    skipped.vanished += 1;
                    continue;
                }
            };
            if !is_regular(&st) {
                skipped.not_regular += 1;
                continue;
            }
            if st.st_uid != self.uid() {
                skipped.foreign += 1;
                continue;
            }
            if seen.contains(&(st.st_dev, st.st_ino)) {
                continue;
            }
            // A regular file (an inode never changes type): reopening it cannot block
            // like a FIFO or run a device driver's open.
            let reopened = openat(
                None,
                Path::new(&format!("/proc/self/fd/{}", opath.as_raw_fd())),
                OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK,
            );
            let file = match reopened {
                Ok(f) => File::from(f),
                Err(_) => {
                    skipped.vanished += 1;
                    continue;
                }
            };
            let path = readlink_at(&map_dir, &n, Path::new("map_files"));
            self.keep(file, path, seen, out, skipped);
        }
        Ok(())
    }

    /// Keeps `file` if `fstat` on it says: a regular file owned by the process's uid,
    /// not seen yet, and `fstatfs`: not on a memory-backed file system.
    fn keep(
        &self,
        file: File,
        path: PathBuf,
        seen: &mut HashSet<FileId>,
        out: &mut Vec<CachedFile>,
        skipped: &mut SkippedFiles,
    ) {
        let Ok(st) = nix::sys::stat::fstat(file.as_raw_fd()) else {
            skipped.vanished += 1;
            return;
        };
        if !is_regular(&st) {
            skipped.not_regular += 1;
        } else if st.st_uid != self.uid() {
            skipped.foreign += 1;
        } else if is_memory_backed(&file) {
            skipped.memory_backed += 1;
        } else if seen.insert((st.st_dev, st.st_ino)) {
            out.push(CachedFile {
                file,
                id: (st.st_dev, st.st_ino),
                size_bytes: st.st_size.max(0) as u64,
                path,
            });
        }
    }

    fn still_alive(&self) -> Result<()> {
        if pidfd::pidfd_exited(self.proc_.pidfd())? {
            return Err(Error::Syscall {
                call: format!("pid {}: exited", self.proc_.pid()),
                source: io::Error::from_raw_os_error(libc::ESRCH),
            });
        }
        Ok(())
    }
}

/// `pidfd_getfd(2)` (Linux 5.6+): a close-on-exec duplicate, in this process, of
/// descriptor `target_fd` of the process behind `pidfd`. Needs
/// `PTRACE_MODE_ATTACH_REALCREDS` over it (`CAP_SYS_PTRACE`). Errors: `EBADF` when it
/// has no such descriptor, `ESRCH` when it exited, `EPERM` without permission.
fn pidfd_getfd(pidfd: std::os::fd::BorrowedFd<'_>, target_fd: i32) -> Result<File> {
    // SAFETY: the syscall takes two descriptors numbers and flags, no pointers.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target_fd, 0) };
    if raw < 0 {
        return Err(Error::last_os_error(format!("pidfd_getfd(fd {target_fd})")));
    }
    // SAFETY: a non-negative return is a new descriptor that we own.
    Ok(unsafe { File::from_raw_fd(raw as RawFd) })
}

fn openat(dir: Option<RawFd>, path: &Path, flags: OFlag) -> Result<OwnedFd> {
    let raw = nix::fcntl::openat(dir, path, flags, Mode::empty())
        .map_err(|e| Error::io(path, io::Error::from(e)))?;
    // SAFETY: a successful openat returns a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn fd_into_raw(fd: OwnedFd) -> RawFd {
    use std::os::fd::IntoRawFd;
    fd.into_raw_fd()
}

fn relabel(e: Error, path: &Path) -> Error {
    match e {
        Error::Io { source, .. } => Error::io(path, source),
        other => other,
    }
}

fn readlink_at(dir: &nix::dir::Dir, name: &str, dir_path: &Path) -> PathBuf {
    nix::fcntl::readlinkat(Some(dir.as_raw_fd()), name)
        .map(PathBuf::from)
        .unwrap_or_else(|_| dir_path.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_zero_and_missing_file_names_path() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(resident_bytes(&empty).unwrap(), 0);
        let missing = dir.path().join("missing");
        let e = resident_bytes(&missing).unwrap_err();
        assert!(e.is_not_found());
        assert!(e.to_string().contains("missing"));
        assert!(fadvise_dontneed(&missing).unwrap_err().is_not_found());
    }

    #[test]
    fn mincore_fallback_sees_a_freshly_written_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![7u8; 3 * 4096 + 10]).unwrap();
        let file = File::open(&p).unwrap();
        let page = ProcFs::page_size();
        let size = file.metadata().unwrap().size();
        let bytes = mincore_resident_bytes(&file, &p, size, page).unwrap();
        // Just written: every page is in the cache (tmpfs or disk alike).
        assert_eq!(bytes, 4 * page);
    }
}
