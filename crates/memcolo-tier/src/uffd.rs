//! A thin, typed wrapper of userfaultfd(2) (`ioctl_userfaultfd(2)`): the descriptor,
//! the API handshake, registration of a range in MISSING and write-protect (WP)
//! modes, and the range ioctls memcolo's tier manager uses: `UFFDIO_COPY`,
//! `UFFDIO_ZEROPAGE`, `UFFDIO_WRITEPROTECT`, `UFFDIO_WAKE`.
//!
//! The structures and ioctl numbers are those of `<linux/userfaultfd.h>` (the `libc`
//! crate does not carry them, and the `userfaultfd` crate needs libclang to build).
//! Every call returns the kernel's `errno` as an [`io::Error`]; the `ioctl_userfaultfd`
//! manual page lists them (`EEXIST` from a copy means the page was already mapped,
//! `EAGAIN` that the mm changed under the call, `ENOENT`/`ESRCH` that the process
//! owning the region is gone).
//!
//! Permission: a userfaultfd that also handles faults taken in kernel mode (a
//! `read(2)` into the region, which memcolo must serve too) needs `CAP_SYS_PTRACE`
//! unless `/proc/sys/vm/unprivileged_userfaultfd` is 1; [`check_permission`] says
//! which applies.

use memcolo_linux::procfs::ProcFs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

const UFFD_API: u64 = 0xAA;

const fn iowr(nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | (0xAA << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    (2 << 30) | (size << 16) | (0xAA << 8) | nr
}

const UFFDIO_API: u64 = iowr(0x3F, 24);
const UFFDIO_REGISTER: u64 = iowr(0x00, 32);
const UFFDIO_UNREGISTER: u64 = ior(0x01, 16);
const UFFDIO_WAKE: u64 = ior(0x02, 16);
const UFFDIO_COPY: u64 = iowr(0x03, 40);
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, 32);
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, 24);

/// `UFFD_FEATURE_*` bits of the API handshake.
pub mod features {
    /// Write-protect faults are reported with `UFFD_PAGEFAULT_FLAG_WP`.
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    /// Fork events (the child gets its own userfaultfd).
    pub const EVENT_FORK: u64 = 1 << 1;
    /// `mremap` events.
    pub const EVENT_REMAP: u64 = 1 << 2;
    /// `madvise(MADV_DONTNEED/MADV_REMOVE)` events.
    pub const EVENT_REMOVE: u64 = 1 << 3;
    /// MISSING mode on shmem (memfd) mappings.
    pub const MISSING_SHMEM: u64 = 1 << 5;
    /// `munmap` events.
    pub const EVENT_UNMAP: u64 = 1 << 6;
    /// Fault messages carry the faulting thread's id.
    pub const THREAD_ID: u64 = 1 << 8;
    /// WP mode on shmem and hugetlbfs mappings.
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
}

/// Registration modes.
pub mod mode {
    /// Report faults on pages that are not mapped.
    pub const MISSING: u64 = 1 << 0;
    /// Report writes to write-protected pages.
    pub const WP: u64 = 1 << 1;
}

const COPY_MODE_WP: u64 = 1 << 1;
const WP_MODE_WP: u64 = 1 << 0;
const WP_MODE_DONTWAKE: u64 = 1 << 1;

/// `_UFFDIO_*` bits of the ioctls a registration supports.
pub mod ioctls {
    /// `UFFDIO_WAKE`.
    pub const WAKE: u64 = 1 << 0x02;
    /// `UFFDIO_COPY`.
    pub const COPY: u64 = 1 << 0x03;
    /// `UFFDIO_ZEROPAGE`.
    pub const ZEROPAGE: u64 = 1 << 0x04;
    /// `UFFDIO_WRITEPROTECT`.
    pub const WRITEPROTECT: u64 = 1 << 0x06;
}

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;
const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

#[repr(C)]
struct ApiArg {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
struct RegisterArg {
    range: Range,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct CopyArg {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct ZeropageArg {
    range: Range,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
struct WriteProtectArg {
    range: Range,
    mode: u64,
}

/// One message read from a userfaultfd (`struct uffd_msg`, 32 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A thread faulted at `address` (page aligned unless the exact-address feature
    /// was asked for).
    PageFault {
        /// Faulting address.
        address: u64,
        /// The access was a write.
        write: bool,
        /// The fault is a write to a write-protected page (else: a missing page).
        wp: bool,
    },
    /// The process forked; `uffd` is the child's new userfaultfd (already installed
    /// in the reader's descriptor table).
    Fork {
        /// The child's descriptor.
        uffd: RawFd,
    },
    /// `mremap` moved `len` bytes from `from` to `to`.
    Remap {
        /// Old start.
        from: u64,
        /// New start.
        to: u64,
        /// Length, bytes.
        len: u64,
    },
    /// `madvise(MADV_DONTNEED/REMOVE)` dropped `[start, end)`.
    Remove {
        /// Start address.
        start: u64,
        /// End address (exclusive).
        end: u64,
    },
    /// `munmap` removed `[start, end)`.
    Unmap {
        /// Start address.
        start: u64,
        /// End address (exclusive).
        end: u64,
    },
    /// An event this wrapper does not know.
    Unknown {
        /// The event code.
        event: u8,
    },
}

fn parse(msg: &[u8; 32]) -> Event {
    let u64_at = |i: usize| u64::from_ne_bytes(msg[i..i + 8].try_into().expect("8 bytes"));
    match msg[0] {
        EVENT_PAGEFAULT => {
            let flags = u64_at(8);
            Event::PageFault {
                address: u64_at(16),
                write: flags & PAGEFAULT_FLAG_WRITE != 0,
                wp: flags & PAGEFAULT_FLAG_WP != 0,
            }
        }
        EVENT_FORK => Event::Fork {
            uffd: u32::from_ne_bytes(msg[8..12].try_into().expect("4 bytes")) as RawFd,
        },
        EVENT_REMAP => Event::Remap {
            from: u64_at(8),
            to: u64_at(16),
            len: u64_at(24),
        },
        EVENT_REMOVE => Event::Remove {
            start: u64_at(8),
            end: u64_at(16),
        },
        EVENT_UNMAP => Event::Unmap {
            start: u64_at(8),
            end: u64_at(16),
        },
        event => Event::Unknown { event },
    }
}

/// The features a userfaultfd's handshake granted, from its `/proc/PID/fdinfo`
/// (`API:\t<api>:<features>:<ioctls>`, hexadecimal, `userfaultfd_show_fdinfo` in
/// `fs/userfaultfd.c`; 0 before the handshake). `None` without that line.
fn parse_fdinfo_features(fdinfo: &str) -> Option<u64> {
    let api = fdinfo.lines().find_map(|l| l.strip_prefix("API:"))?;
    let mut it = api.trim().split(':');
    let version = u64::from_str_radix(it.next()?, 16).ok()?;
    let features = u64::from_str_radix(it.next()?, 16).ok()?;
    (version == UFFD_API).then_some(features)
}

/// Whether this process may create a userfaultfd that handles kernel-mode faults:
/// `Ok` when it runs as root (`CAP_SYS_PTRACE`) or
/// `/proc/sys/vm/unprivileged_userfaultfd` is 1; otherwise the reason.
pub fn check_permission() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        return Ok(());
    }
    match ProcFs::root().read_sysctl("vm.unprivileged_userfaultfd") {
        Ok(s) if s == "1" => Ok(()),
        Ok(s) => Err(format!(
            "userfaultfd needs root (euid is {euid}) or vm.unprivileged_userfaultfd = 1 (it is {s})"
        )),
        Err(e) => Err(format!("userfaultfd needs root (euid is {euid}); {e}")),
    }
}

/// A userfaultfd after the API handshake.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    features: u64,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Uffd {
    /// Creates a non-blocking, close-on-exec userfaultfd of this process and does the
    /// API handshake asking for `features` ([`features`]).
    ///
    /// # Errors
    /// `EPERM` without the permission of [`check_permission`]; `EINVAL` if the kernel
    /// lacks a feature asked for.
    pub fn open(features: u64) -> io::Result<Self> {
        // SAFETY: the userfaultfd syscall takes one int of flags and returns a new fd.
        let fd =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Self::handshake(fd, features)
    }

    /// Wraps a userfaultfd received from another process (`SCM_RIGHTS`), on which
    /// that process already did the API handshake asking for `features`. Trusts the
    /// sender: see [`Uffd::from_untrusted_fd`] for a descriptor from a tenant.
    pub fn from_fd(fd: OwnedFd, features: u64) -> Self {
        Uffd { fd, features }
    }

    /// [`Uffd::from_fd`] for a descriptor that anyone may have sent: it must be a
    /// userfaultfd (its anonymous inode is `[userfaultfd]`, `/proc/self/fd/N`) whose
    /// API handshake granted every feature of `features` (`API:` line of
    /// `/proc/self/fdinfo/N`; none before the handshake).
    ///
    /// # Errors
    /// `InvalidInput` naming what the descriptor is instead (another file, a
    /// userfaultfd without the handshake or without a feature); the error of reading
    /// `/proc/self`.
    pub fn from_untrusted_fd(fd: OwnedFd, features: u64) -> io::Result<Self> {
        let n = fd.as_raw_fd();
        let procfs = ProcFs::root();
        let target = procfs.read_self_fd_link(n)?;
        let target = target.to_string_lossy();
        if target != "anon_inode:[userfaultfd]" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a userfaultfd but {target}"),
            ));
        }
        let info = procfs.read_self_fdinfo(n)?;
        let granted = parse_fdinfo_features(&info).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "a userfaultfd whose fdinfo has no API line",
            )
        })?;
        if granted & features != features {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a userfaultfd without features {:#x} (granted {granted:#x})",
                    features & !granted
                ),
            ));
        }
        Ok(Uffd {
            fd,
            features: granted,
        })
    }

    /// Does the API handshake on a fresh userfaultfd.
    ///
    /// # Errors
    /// `EINVAL` for features the kernel lacks or a descriptor that already did it.
    pub fn handshake(fd: OwnedFd, features: u64) -> io::Result<Self> {
        let mut arg = ApiArg {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes a struct uffdio_api, which ApiArg mirrors.
        cvt(unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut arg) })?;
        Ok(Uffd {
            fd,
            features: arg.features,
        })
    }

    /// The features granted by the handshake.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Registers `[start, start + len)` (page aligned) in `modes` ([`mode`]); returns
    /// the supported range ioctls ([`ioctls`]).
    ///
    /// # Errors
    /// `EINVAL` for an unaligned range or a mapping type the modes do not support,
    /// `EBUSY` if another userfaultfd registered part of it.
    pub fn register(&self, start: u64, len: u64, modes: u64) -> io::Result<u64> {
        let mut arg = RegisterArg {
            range: Range { start, len },
            mode: modes,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes a struct uffdio_register.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER as _, &mut arg) })?;
        Ok(arg.ioctls)
    }

    /// Unregisters `[start, start + len)`; faults in it are then handled by the kernel
    /// alone (missing anonymous pages read as zeros).
    ///
    /// # Errors
    /// `EINVAL` for an unaligned range.
    pub fn unregister(&self, start: u64, len: u64) -> io::Result<()> {
        let arg = Range { start, len };
        // SAFETY: UFFDIO_UNREGISTER reads a struct uffdio_range.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_UNREGISTER as _, &arg) })?;
        Ok(())
    }

    /// Maps a copy of `src` at `dst` (page aligned, `src.len()` a multiple of the
    /// page size) in the registered process and wakes threads waiting on that range.
    /// With `wp`, the new pages are write-protected. Returns the bytes copied.
    ///
    /// # Errors
    /// `EEXIST` if a page was mapped already, `EAGAIN` if the mm changed (retry),
    /// `ENOENT`/`ESRCH` if the process is exiting.
    pub fn copy(&self, dst: u64, src: &[u8], wp: bool) -> io::Result<u64> {
        let mut arg = CopyArg {
            dst,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode: if wp { COPY_MODE_WP } else { 0 },
            copy: 0,
        };
        // SAFETY: UFFDIO_COPY reads `len` bytes at `src` (a live slice) and writes the
        // struct; `dst` is in the registered process, not ours.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_COPY as _, &mut arg) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(arg.copy as u64)
    }

    /// Maps zero pages at `[start, start + len)` and wakes waiting threads. Returns
    /// the bytes mapped.
    ///
    /// # Errors
    /// As [`Uffd::copy`].
    pub fn zeropage(&self, start: u64, len: u64) -> io::Result<u64> {
        let mut arg = ZeropageArg {
            range: Range { start, len },
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: UFFDIO_ZEROPAGE reads and writes a struct uffdio_zeropage.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_ZEROPAGE as _, &mut arg) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(arg.zeropage as u64)
    }

    /// Write-protects (`protect`) or unprotects `[start, start + len)`. Unprotecting
    /// wakes threads blocked on write-protect faults in the range unless `dontwake`.
    ///
    /// # Errors
    /// `EINVAL` if the range is not registered in WP mode or for `protect` with
    /// `dontwake` (the kernel refuses the pair), `ENOENT` if the process is exiting.
    pub fn writeprotect(
        &self,
        start: u64,
        len: u64,
        protect: bool,
        dontwake: bool,
    ) -> io::Result<()> {
        let mut mode = if protect { WP_MODE_WP } else { 0 };
        if dontwake {
            mode |= WP_MODE_DONTWAKE;
        }
        let arg = WriteProtectArg {
            range: Range { start, len },
            mode,
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads a struct uffdio_writeprotect.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WRITEPROTECT as _, &arg) })?;
        Ok(())
    }

    /// Wakes threads waiting on faults in `[start, start + len)` without mapping
    /// anything (they retry the access).
    ///
    /// # Errors
    /// `EINVAL` for an unaligned range.
    pub fn wake(&self, start: u64, len: u64) -> io::Result<()> {
        let arg = Range { start, len };
        // SAFETY: UFFDIO_WAKE reads a struct uffdio_range.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WAKE as _, &arg) })?;
        Ok(())
    }

    /// Reads the messages waiting, without blocking (at most 64).
    ///
    /// # Errors
    /// The read's error other than `EAGAIN` (which yields an empty list).
    pub fn read_events(&self) -> io::Result<Vec<Event>> {
        let mut buf = [0u8; 32 * 64];
        // SAFETY: reading into a live buffer of the given length.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(Vec::new());
            }
            return Err(e);
        }
        Ok(buf[..n as usize]
            .chunks_exact(32)
            .map(|c| parse(c.try_into().expect("32 bytes")))
            .collect())
    }

    /// Waits up to `timeout_ms` (−1: forever) until a message is waiting or `wake_fd`
    /// (an eventfd, say) is readable. Returns `(uffd readable, wake_fd readable)`.
    ///
    /// # Errors
    /// poll(2)'s error other than `EINTR` (which yields `(false, false)`).
    pub fn poll(
        &self,
        wake_fd: Option<BorrowedFd<'_>>,
        timeout_ms: i32,
    ) -> io::Result<(bool, bool)> {
        let mut fds = [
            libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake_fd.map_or(-1, |f| f.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: polling two live pollfd structs.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok((false, false));
            }
            return Err(e);
        }
        Ok((fds[0].revents != 0, fds[1].revents != 0))
    }
}

impl AsFd for Uffd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_header() {
        // Values of the _IOWR/_IOR macros of <linux/userfaultfd.h> on x86-64.
        assert_eq!(UFFDIO_API, 0xC018_AA3F);
        assert_eq!(UFFDIO_REGISTER, 0xC020_AA00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010_AA01);
        assert_eq!(UFFDIO_WAKE, 0x8010_AA02);
        assert_eq!(UFFDIO_COPY, 0xC028_AA03);
        assert_eq!(UFFDIO_ZEROPAGE, 0xC020_AA04);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xC018_AA06);
        assert_eq!(std::mem::size_of::<CopyArg>(), 40);
        assert_eq!(std::mem::size_of::<RegisterArg>(), 32);
    }

    #[test]
    fn fdinfo_features_parse() {
        let done = "pos:\t0\nflags:\t02004002\nmnt_id:\t16\nino:\t1057\npending:\t0\ntotal:\t0\nAPI:\taa:1b1:c000000000000000\n";
        assert_eq!(parse_fdinfo_features(done), Some(0x1b1));
        let fresh = "pending:\t0\ntotal:\t0\nAPI:\taa:0:c000000000000000\n";
        assert_eq!(parse_fdinfo_features(fresh), Some(0));
        assert_eq!(parse_fdinfo_features("pos:\t0\n"), None);
    }

    #[test]
    fn an_untrusted_descriptor_must_be_a_userfaultfd() {
        let null = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let e = Uffd::from_untrusted_fd(null, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("/dev/null"), "{e}");
    }

    #[test]
    fn messages_parse() {
        let mut m = [0u8; 32];
        m[0] = EVENT_PAGEFAULT;
        m[8..16].copy_from_slice(&(PAGEFAULT_FLAG_WRITE | PAGEFAULT_FLAG_WP).to_ne_bytes());
        m[16..24].copy_from_slice(&0x7000u64.to_ne_bytes());
        assert_eq!(
            parse(&m),
            Event::PageFault {
                address: 0x7000,
                write: true,
                wp: true
            }
        );
        m[0] = EVENT_REMOVE;
        m[8..16].copy_from_slice(&0x1000u64.to_ne_bytes());
        m[16..24].copy_from_slice(&0x3000u64.to_ne_bytes());
        assert_eq!(
            parse(&m),
            Event::Remove {
                start: 0x1000,
                end: 0x3000
            }
        );
        m[0] = 0x77;
        assert_eq!(parse(&m), Event::Unknown { event: 0x77 });
    }

    #[test]
    fn handshake_and_register_anonymous_memory() {
        if let Err(why) = check_permission() {
            memcolo_testkit::cannot_run(
                "handshake_and_register_anonymous_memory",
                &why.to_string(),
            );
            return;
        }
        let u = Uffd::open(features::PAGEFAULT_FLAG_WP).unwrap();
        assert!(u.features() & features::PAGEFAULT_FLAG_WP != 0);
        let region = crate::region::AnonRegion::new(16).unwrap();
        let (p, len) = (region.as_ptr(), region.len());
        let ioc = u
            .register(p as u64, len as u64, mode::MISSING | mode::WP)
            .unwrap();
        for want in [
            ioctls::COPY,
            ioctls::ZEROPAGE,
            ioctls::WRITEPROTECT,
            ioctls::WAKE,
        ] {
            assert!(ioc & want != 0, "ioctls {ioc:#x} lack {want:#x}");
        }
        // Fill page 0 from here (no fault involved), then read it back.
        let src = vec![0x5Au8; 4096];
        assert_eq!(u.copy(p as u64, &src, false).unwrap(), 4096);
        // SAFETY: page 0 is now mapped.
        assert_eq!(unsafe { *(p as *const u8) }, 0x5A);
        let e = u.copy(p as u64, &src, false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        assert_eq!(u.zeropage(p as u64 + 4096, 4096).unwrap(), 4096);
        u.writeprotect(p as u64, 4096, true, false).unwrap();
        u.writeprotect(p as u64, 4096, false, false).unwrap();
        assert!(u.read_events().unwrap().is_empty());
        u.unregister(p as u64, len as u64).unwrap();
    }
}
