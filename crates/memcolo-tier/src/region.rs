//! Managed regions: the memory a tier manager fills and evicts, and how it reaches it.
//!
//! The tier manager resolves faults through the region's userfaultfd, which works
//! from any process. Reading a page out and dropping it from memory depend on how the
//! region is backed, behind [`RegionMemory`]:
//!
//! - [`LocalAnon`]: private anonymous memory of the manager's own process (a manager
//!   thread beside the application's threads). A page is read through its address and
//!   dropped with `madvise(MADV_DONTNEED)`.
//! - [`SharedFile`]: a memfd mapped `MAP_SHARED` by the application and reached by the
//!   manager through the descriptor, in another process (the agent, which received the
//!   memfd and the userfaultfd over `SCM_RIGHTS`). A page is read with `pread` (not
//!   through a mapping of the manager's: see [`SharedFile`]) and dropped with
//!   `fallocate(FALLOC_FL_PUNCH_HOLE)`, which unmaps it from the application;
//!   `madvise` cannot reach another process's mappings.
//!
//! Either way the page is write-protected through the userfaultfd while it is read
//! and dropped, so no write is lost in between (MaxMem §3.3).
//!
//! [`AnonRegion`] and [`MemfdRegion`] create such regions in this process (for
//! in-process management and for tests).

use memcolo_linux::procfs::ProcFs;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// The page size of managed regions: the base page, 4 KiB.
pub const PAGE: usize = 4096;

/// How a tier manager reads and drops the pages of one region.
pub trait RegionMemory: Send + Sync {
    /// A short name for logs (`anon`, `memfd`).
    fn kind(&self) -> &'static str;
    /// Start of the region in the process its userfaultfd belongs to (page aligned).
    fn base(&self) -> u64;
    /// Pages in the region.
    fn pages(&self) -> usize;
    /// Copies page `index` into `out` (`PAGE` bytes). The caller guarantees the page is
    /// mapped and write-protected (or the process is stopped), so nothing writes it
    /// meanwhile.
    ///
    /// # Errors
    /// The system call's error for backings that read through one.
    fn read_page(&self, index: usize, out: &mut [u8]) -> io::Result<()>;
    /// Drops pages `[first, first + count)` from memory, so that the next access to
    /// each faults as missing.
    ///
    /// # Errors
    /// `madvise(2)` or `fallocate(2)`'s error.
    fn drop_pages(&self, first: usize, count: usize) -> io::Result<()>;
    /// Drops each run `(first, count)` of `runs` as [`RegionMemory::drop_pages`]
    /// does, in as few system calls (each one a TLB shootdown) as the backing
    /// allows; runs are dropped in order. The default drops them one by one.
    ///
    /// # Errors
    /// The runs dropped before the failure, from the first (none after it was), and
    /// the error.
    fn drop_page_runs(&self, runs: &[(usize, usize)]) -> Result<(), (usize, io::Error)> {
        for (k, &(first, count)) in runs.iter().enumerate() {
            self.drop_pages(first, count).map_err(|e| (k, e))?;
        }
        Ok(())
    }
    /// Whether [`RegionMemory::drop_pages`] raises a `UFFD_EVENT_REMOVE` on a
    /// userfaultfd that asked for remove events (`madvise` does, `fallocate` does
    /// not).
    fn drop_raises_remove_event(&self) -> bool;
    /// Whether [`RegionMemory::drop_pages`] also clears the userfaultfd write
    /// protection of the pages it drops, so that waking the threads that wait on them
    /// is enough afterwards. True for private anonymous memory: zapping an anonymous
    /// page table entry drops everything, the write-protect bit included (no
    /// marker is left, unlike shmem's). Default false: the caller unprotects.
    fn drop_clears_write_protect(&self) -> bool {
        false
    }
    /// The runs `(first, count)` of pages that hold data now, in order: what a
    /// manager starting on a region that was handed over before (the agent
    /// restarted, and the process handed its region to the new one) finds resident.
    /// The default finds none, which is right for a region created for the manager
    /// (all of it still to be touched).
    ///
    /// # Errors
    /// The system call's error for backings that look.
    fn present_runs(&self) -> io::Result<Vec<(usize, usize)>> {
        Ok(Vec::new())
    }
}

/// Contiguous runs `(first, count)` of sorted page indices, as
/// [`RegionMemory::drop_page_runs`] takes them and [`RegionMemory::present_runs`]
/// gives them.
pub fn runs(sorted: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &p in sorted {
        match out.last_mut() {
            Some((first, count)) if *first + *count == p => *count += 1,
            _ => out.push((p, 1)),
        }
    }
    out
}

fn mmap(len: usize, prot: i32, flags: i32, fd: i32) -> io::Result<usize> {
    // SAFETY: asking the kernel for a new mapping; no existing memory is touched.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p as usize)
    }
}

/// Private anonymous memory of this process (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct LocalAnon {
    base: usize,
    pages: usize,
}

impl LocalAnon {
    /// The pages `[base, base + pages × PAGE)` of this process, which must stay mapped
    /// while a manager uses them.
    pub fn new(base: usize, pages: usize) -> Self {
        LocalAnon { base, pages }
    }
}

impl RegionMemory for LocalAnon {
    fn kind(&self) -> &'static str {
        "anon"
    }
    fn base(&self) -> u64 {
        self.base as u64
    }
    fn pages(&self) -> usize {
        self.pages
    }
    fn read_page(&self, index: usize, out: &mut [u8]) -> io::Result<()> {
        assert!(index < self.pages && out.len() == PAGE);
        // SAFETY: the page is mapped (caller's guarantee) and inside the region; no
        // thread writes it while it is write-protected.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.base + index * PAGE) as *const u8,
                out.as_mut_ptr(),
                PAGE,
            )
        };
        Ok(())
    }
    fn drop_pages(&self, first: usize, count: usize) -> io::Result<()> {
        assert!(first + count <= self.pages);
        // SAFETY: dropping pages of the region; their content was saved by the caller.
        let r = unsafe {
            libc::madvise(
                (self.base + first * PAGE) as *mut libc::c_void,
                count * PAGE,
                libc::MADV_DONTNEED,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
    /// One `process_madvise(2)` of `MADV_DONTNEED` over up to 1024 runs
    /// (`UIO_MAXIOV`) on this process (`PIDFD_SELF_THREAD_GROUP`): the kernel
    /// flushes the TLB once per call where one `madvise` per run flushes once per run
    /// (on Linux 6.18, 256 scattered pages cost 0–4 shootdowns of another vCPU
    /// running the process instead of 65–80). Where the kernel refuses (older
    /// kernels: no `PIDFD_SELF`, or no `MADV_DONTNEED` through `process_madvise`), one
    /// `madvise` per run.
    fn drop_page_runs(&self, runs: &[(usize, usize)]) -> Result<(), (usize, io::Error)> {
        const PIDFD_SELF_THREAD_GROUP: libc::c_int = -10001;
        const UIO_MAXIOV: usize = 1024;
        let mut done = 0;
        while done < runs.len() {
            let chunk = &runs[done..(done + UIO_MAXIOV).min(runs.len())];
            let iov: Vec<libc::iovec> = chunk
                .iter()
                .map(|&(first, count)| {
                    assert!(first + count <= self.pages);
                    libc::iovec {
                        iov_base: (self.base + first * PAGE) as *mut libc::c_void,
                        iov_len: count * PAGE,
                    }
                })
                .collect();
            // SAFETY: dropping runs of the region; their content was saved by the
            // caller. The kernel only reads the iovec array.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    PIDFD_SELF_THREAD_GROUP,
                    iov.as_ptr(),
                    iov.len(),
                    libc::MADV_DONTNEED,
                    0u32,
                )
            };
            if r < 0 {
                // Not supported here (or failed at the first run): run by run.
                for (k, &(first, count)) in runs.iter().enumerate().skip(done) {
                    self.drop_pages(first, count).map_err(|e| (k, e))?;
                }
                return Ok(());
            }
            // Runs are advised in order; a short count stopped at an error.
            let mut bytes = r as usize;
            let mut whole = 0;
            for &(_, count) in chunk {
                if bytes < count * PAGE {
                    break;
                }
                bytes -= count * PAGE;
                whole += 1;
            }
            done += whole;
            if whole < chunk.len() {
                let (first, count) = runs[done];
                self.drop_pages(first, count).map_err(|e| (done, e))?;
                done += 1;
            }
        }
        Ok(())
    }
    fn drop_raises_remove_event(&self) -> bool {
        true
    }
    fn drop_clears_write_protect(&self) -> bool {
        true
    }
}

/// A memfd-backed region, reached through the memfd's descriptor (see the module
/// documentation).
///
/// The manager does not map the memfd: a page read through a mapping of its own would
/// take a page table entry in the manager's process, and the hole punched when the
/// page is evicted would then zap it there too, a TLB shootdown on every CPU running
/// the manager's threads. The agent serves every region, so one region's evictions
/// would interrupt the other regions' fault threads; read with `pread` the page stays
/// unmapped here. (A KV store beside a thrashing GUPS in one agent waited about 2×
/// longer per fault than with a manager in its own process; with `pread` one pair of
/// runs came out level and another did not, so that gap is not explained yet:
/// `bench/tiering/RESULTS.md`, sections kv and earlier/kv-*.)
#[derive(Debug)]
pub struct SharedFile {
    fd: OwnedFd,
    base: u64,
    pages: usize,
}

impl SharedFile {
    /// The memfd `fd` (`pages` pages long); `base` is where the application mapped it
    /// (the address its userfaultfd registered).
    ///
    /// # Errors
    /// `fstat(2)`'s error, or `InvalidInput` if the memfd is shorter than `pages`.
    pub fn new(fd: OwnedFd, base: u64, pages: usize) -> io::Result<Self> {
        // SAFETY: fstat into a zeroed struct of the right type.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a valid pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if (st.st_size as u64) < (pages * PAGE) as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("memfd of {} bytes, region of {pages} pages", st.st_size),
            ));
        }
        Ok(SharedFile { fd, base, pages })
    }

    /// The memfd.
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The memfd, giving the region up.
    pub(crate) fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

impl RegionMemory for SharedFile {
    fn kind(&self) -> &'static str {
        "memfd"
    }
    fn base(&self) -> u64 {
        self.base
    }
    fn pages(&self) -> usize {
        self.pages
    }
    fn read_page(&self, index: usize, out: &mut [u8]) -> io::Result<()> {
        assert!(index < self.pages && out.len() == PAGE);
        // From the page cache (the page is mapped in the application, caller's
        // guarantee, and write-protected meanwhile); see the type's documentation.
        let mut done = 0;
        while done < PAGE {
            // SAFETY: reading into the caller's buffer, within its length.
            let n = unsafe {
                libc::pread(
                    self.fd.as_raw_fd(),
                    out[done..].as_mut_ptr().cast(),
                    PAGE - done,
                    (index * PAGE + done) as libc::off_t,
                )
            };
            match n {
                n if n > 0 => done += n as usize,
                0 => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }
    fn drop_pages(&self, first: usize, count: usize) -> io::Result<()> {
        assert!(first + count <= self.pages);
        // SAFETY: punching a hole in our memfd; the content was saved by the caller.
        let r = unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (first * PAGE) as i64,
                (count * PAGE) as i64,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
    fn drop_raises_remove_event(&self) -> bool {
        false
    }
    /// The memfd's data runs (`lseek(2)` with `SEEK_DATA` and `SEEK_HOLE`): pages
    /// that were written and not punched out. A hole reads as zeros, and the next
    /// access to it faults as missing.
    fn present_runs(&self) -> io::Result<Vec<(usize, usize)>> {
        let end = (self.pages * PAGE) as libc::off_t;
        let seek = |from: libc::off_t, whence: libc::c_int| -> io::Result<Option<libc::off_t>> {
            // SAFETY: lseek on our own descriptor.
            let r = unsafe { libc::lseek(self.fd.as_raw_fd(), from, whence) };
            if r >= 0 {
                return Ok(Some(r));
            }
            let e = io::Error::last_os_error();
            // ENXIO: no data at or after `from`.
            if e.raw_os_error() == Some(libc::ENXIO) {
                Ok(None)
            } else {
                Err(e)
            }
        };
        let mut runs = Vec::new();
        let mut at: libc::off_t = 0;
        while at < end {
            let Some(data) = seek(at, libc::SEEK_DATA)? else {
                break;
            };
            if data >= end {
                break;
            }
            let hole = seek(data, libc::SEEK_HOLE)?.unwrap_or(end).min(end);
            // Whole pages: a run starts at the page holding its first byte and ends
            // with the page holding its last.
            let first = data as usize / PAGE;
            let last = (hole as usize).div_ceil(PAGE);
            match runs.last_mut() {
                Some((f, n)) if *f + *n >= first => *n = last.max(*f + *n) - *f,
                _ => runs.push((first, last - first)),
            }
            at = hole.max(data + 1);
        }
        Ok(runs)
    }
}

/// What identifies a memfd: its device and inode (as `/proc/PID/maps` shows them) and
/// its size, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemfdId {
    /// Device major number.
    pub major: u32,
    /// Device minor number.
    pub minor: u32,
    /// Inode number.
    pub inode: u64,
    /// `st_size`, bytes.
    pub size: u64,
}

/// Checks that `fd`, from anyone, is a memfd (`memfd_create(2)`: its name in
/// `/proc/self/fd/N` starts with `/memfd:`, it is a regular file, and `F_GET_SEALS`
/// works on it, as on tmpfs and hugetlbfs files only) and identifies it.
///
/// # Errors
/// `InvalidInput` naming what the descriptor is instead; `fstat(2)` or
/// `/proc/self`'s error.
pub fn check_memfd(fd: BorrowedFd<'_>) -> io::Result<MemfdId> {
    let n = fd.as_raw_fd();
    let target = ProcFs::root().read_self_fd_link(n)?;
    let target = target.to_string_lossy();
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    if !target.starts_with("/memfd:") {
        return Err(bad(format!("not a memfd but {target}")));
    }
    // SAFETY: fstat into a zeroed struct of the right type, on a valid descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(n, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(bad(format!("{target} is not a regular file")));
    }
    // SAFETY: F_GET_SEALS only reads the file's seals.
    if unsafe { libc::fcntl(n, libc::F_GET_SEALS) } < 0 {
        return Err(bad(format!("{target} takes no seals: not a memfd")));
    }
    Ok(MemfdId {
        major: libc::major(st.st_dev),
        minor: libc::minor(st.st_dev),
        inode: st.st_ino,
        size: st.st_size as u64,
    })
}

/// Checks, in a process's `/proc/PID/maps` text, that `[start, start + length)` is
/// covered by `MAP_SHARED` mappings of the file `id` with file offset `address -
/// start` throughout (the region's page `i` is the file's page `i`, as
/// [`SharedFile`] assumes), and that the file is that long.
///
/// # Errors
/// A message saying where the range and the mappings part.
pub fn check_mapping(maps: &str, start: u64, length: u64, id: &MemfdId) -> Result<(), String> {
    let end = start
        .checked_add(length)
        .ok_or_else(|| format!("{start:#x}+{length} wraps around"))?;
    if id.size < length {
        return Err(format!(
            "the memfd holds {} bytes, the region {length}",
            id.size
        ));
    }
    let mut at = start;
    for l in maps.lines() {
        if at >= end {
            break;
        }
        let f: Vec<&str> = l.split_whitespace().take(5).collect();
        let [range, perms, off, dev, ino] = f[..] else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if hi <= at || lo > at {
            if lo > at {
                break; // a hole at `at`
            }
            continue;
        }
        let same_file = dev
            .split_once(':')
            .and_then(|(ma, mi)| {
                Some((
                    u32::from_str_radix(ma, 16).ok()?,
                    u32::from_str_radix(mi, 16).ok()?,
                ))
            })
            .is_some_and(|d| d == (id.major, id.minor))
            && ino.parse::<u64>().ok() == Some(id.inode);
        let offset = u64::from_str_radix(off, 16).ok();
        if !same_file || !perms.ends_with('s') || offset.map(|o| o + (at - lo)) != Some(at - start)
        {
            return Err(format!(
                "{at:#x} is not a shared mapping of the memfd at offset {:#x}: {l}",
                at - start
            ));
        }
        at = hi;
    }
    if at < end {
        return Err(format!(
            "{at:#x} (in {start:#x}+{length}) is not a mapping of the memfd"
        ));
    }
    Ok(())
}

/// A private anonymous mapping owned by this process, to manage in-process. Unmapped
/// when dropped (after its manager has stopped).
#[derive(Debug)]
pub struct AnonRegion {
    base: usize,
    pages: usize,
}

impl AnonRegion {
    /// Maps `pages` pages of private anonymous memory (not populated).
    ///
    /// # Errors
    /// `mmap(2)`'s error.
    pub fn new(pages: usize) -> io::Result<Self> {
        let base = mmap(
            pages * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
        )?;
        Ok(AnonRegion { base, pages })
    }
    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base as *mut u8
    }
    /// Length, bytes.
    pub fn len(&self) -> usize {
        self.pages * PAGE
    }
    /// Whether the region has no pages.
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }
    /// Pages.
    pub fn pages(&self) -> usize {
        self.pages
    }
    /// How a manager in this process reaches it.
    pub fn memory(&self) -> LocalAnon {
        LocalAnon::new(self.base, self.pages)
    }
}

impl Drop for AnonRegion {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping this struct made.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len()) };
    }
}

/// A memfd mapped `MAP_SHARED` in this process, as libmemcolo backs a managed region
/// whose manager runs in another process. Unmapped when dropped.
#[derive(Debug)]
pub struct MemfdRegion {
    fd: OwnedFd,
    base: usize,
    pages: usize,
}

impl MemfdRegion {
    /// Creates a memfd of `pages` pages (not populated) and maps it read-write.
    ///
    /// # Errors
    /// `memfd_create(2)`, `ftruncate(2)` or `mmap(2)`'s error.
    pub fn new(pages: usize) -> io::Result<Self> {
        // SAFETY: creating a new memfd with a static name.
        let fd = unsafe { libc::memfd_create(c"memcolo-region".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sizing our new memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), (pages * PAGE) as i64) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let base = mmap(
            pages * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
        )?;
        Ok(MemfdRegion { fd, base, pages })
    }
    /// Start address of the application's mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base as *mut u8
    }
    /// Length, bytes.
    pub fn len(&self) -> usize {
        self.pages * PAGE
    }
    /// Whether the region has no pages.
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }
    /// Pages.
    pub fn pages(&self) -> usize {
        self.pages
    }
    /// A duplicate of the memfd, as would be sent to the manager.
    ///
    /// # Errors
    /// `dup(2)`'s error.
    pub fn dup_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }
}

impl Drop for MemfdRegion {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping this struct made.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    const ID: MemfdId = MemfdId {
        major: 0,
        minor: 1,
        inode: 1057,
        size: 0x4000,
    };

    #[test]
    fn a_range_must_be_the_memfd_mapped_shared_from_offset_zero() {
        let maps = "\
55d0-55e0 r-xp 00000000 08:01 99 /bin/x
7000-9000 rw-s 00000000 00:01 1057 /memfd:memcolo-tier (deleted)
9000-b000 rw-s 00002000 00:01 1057 /memfd:memcolo-tier (deleted)
c000-d000 rw-p 00000000 00:00 0
";
        assert_eq!(check_mapping(maps, 0x7000, 0x4000, &ID), Ok(()));
        assert_eq!(check_mapping(maps, 0x7000, 0x2000, &ID), Ok(()));
        // Past the mapping, a hole, a private mapping, another inode, a moved offset.
        assert!(check_mapping(maps, 0x7000, 0x5000, &ID).is_err());
        assert!(check_mapping(maps, 0x9000, 0x2000, &ID).is_err());
        assert!(check_mapping(maps, 0xc000, 0x1000, &ID).is_err());
        let other = MemfdId { inode: 1, ..ID };
        assert!(check_mapping(maps, 0x7000, 0x1000, &other).is_err());
        let private = maps.replace("rw-s 00000000", "rw-p 00000000");
        assert!(check_mapping(&private, 0x7000, 0x1000, &ID).is_err());
        // A memfd shorter than the region, and a range that wraps.
        let short = MemfdId { size: 0x1000, ..ID };
        assert!(check_mapping(maps, 0x7000, 0x2000, &short).is_err());
        assert!(check_mapping(maps, u64::MAX - 0xfff, 0x2000, &ID).is_err());
    }

    #[test]
    fn only_a_memfd_is_a_memfd() {
        let r = MemfdRegion::new(2).unwrap();
        let fd = r.dup_fd().unwrap();
        let id = check_memfd(fd.as_fd()).unwrap();
        assert_eq!(id.size, 2 * PAGE as u64);
        let f = tempfile_in_tmp();
        assert!(check_memfd(f.as_fd()).is_err());
        let null = std::fs::File::open("/dev/null").unwrap();
        let e = check_memfd(null.as_fd()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let p = std::env::temp_dir().join(format!("memcolo-region-test-{}", std::process::id()));
        let f = std::fs::File::create(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        f
    }
}
