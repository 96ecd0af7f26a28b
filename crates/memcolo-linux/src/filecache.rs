//! Page-cache residency of files, and dropping it.
//!
//! Hermes (Middleware'21, §3.3) frees memory for latency-critical services by advising
//! the kernel to drop best-effort jobs' file cache, largest file first
//! (`posix_fadvise(POSIX_FADV_DONTNEED)`). [`resident_bytes`] measures how much of a file
//! is cached: with `cachestat(2)` (Linux 6.5+), else with `mmap` + `mincore(2)`.

use crate::error::{Error, Result};
use crate::procfs::ProcFs;
use serde::Serialize;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

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
/// Uses `cachestat(2)`; on `ENOSYS` falls back to a shared read-only mapping and
/// `mincore(2)` (which, since Linux 5.0, only reports page-cache state of files the
/// caller owns or could open for writing).
pub fn resident_bytes(path: &Path) -> Result<u64> {
    let file = open(path)?;
    let size = file.metadata().map_err(|e| Error::io(path, e))?.size();
    if size == 0 {
        return Ok(0);
    }
    let page = ProcFs::page_size();
    match cachestat_fd(&file, path) {
        Ok(cs) => return Ok(cs.cache_pages * page),
        Err(Error::Unsupported { .. }) => {}
        Err(e) => return Err(e),
    }
    mincore_resident_bytes(&file, path, size, page)
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
/// call is advice and reports no count (measure with [`resident_bytes`]).
pub fn fadvise_dontneed(path: &Path) -> Result<()> {
    let file = open(path)?;
    // SAFETY: an open fd; offset 0, len 0 = the whole file.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        // posix_fadvise returns the error number instead of setting errno.
        return Err(Error::io(path, io::Error::from_raw_os_error(rc)));
    }
    Ok(())
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
