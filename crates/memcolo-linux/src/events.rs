//! Kernel memory-pressure event sources, each a file descriptor the agent polls
//! (e.g. with tokio's `AsyncFd`) instead of sampling on a tick.
//!
//! - cgroup v1 `memory.pressure_level` notifications (Documentation/admin-guide/
//!   cgroup-v1/memory.rst, "Memory Pressure"): an eventfd that becomes readable
//!   (`POLLIN`) each time vmpressure reports the level; read 8 bytes to reset it.
//! - PSI triggers (Documentation/accounting/psi.rst, "Monitoring for pressure
//!   thresholds"): a PSI file kept open after writing `some|full <stall_us> <window_us>`;
//!   it reports `POLLPRI` when the stall time within a window exceeds the threshold, at
//!   most once per window. `POLLERR` means the trigger's group was removed.

use crate::cgroup::{CgroupVersion, MemoryCgroup};
use crate::error::{Error, Result};
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Smallest PSI trigger window the kernel accepts, in microseconds (500 ms).
pub const PSI_WINDOW_MIN_US: u64 = 500_000;
/// Largest PSI trigger window the kernel accepts, in microseconds (10 s).
pub const PSI_WINDOW_MAX_US: u64 = 10_000_000;
/// Unprivileged PSI triggers (no `CAP_SYS_RESOURCE`) must use a window that is a
/// multiple of this, in microseconds (2 s; Linux 6.5+).
pub const PSI_UNPRIVILEGED_WINDOW_US: u64 = 2_000_000;

/// Registers a v1 `memory.pressure_level` notification on `cg`.
///
/// `level` is `low`, `medium` or `critical`; `mode` is `default` (this group and its
/// ancestors' listeners, the event propagates up until handled), `hierarchy` (always
/// propagate) or `local` (only pressure in this very group). Returns a non-blocking,
/// close-on-exec eventfd; it is readable when the event fired; [`read_eventfd`] resets
/// it. Closing it unregisters the notification.
///
/// Errors: [`Error::Unsupported`] on cgroup v2 (use [`psi_trigger`] on
/// `memory.pressure`); [`Error::InvalidArgument`] for an unknown level or mode.
pub fn v1_pressure_level_eventfd(cg: &MemoryCgroup, level: &str, mode: &str) -> Result<OwnedFd> {
    if cg.version() != CgroupVersion::V1 {
        return Err(Error::Unsupported {
            what: format!(
                "memory.pressure_level needs cgroup v1; {} is v2 (use a PSI trigger)",
                cg.path().display()
            ),
        });
    }
    if !["low", "medium", "critical"].contains(&level) {
        return Err(Error::InvalidArgument {
            what: format!("pressure level `{level}` (expected low, medium or critical)"),
        });
    }
    if !["default", "hierarchy", "local"].contains(&mode) {
        return Err(Error::InvalidArgument {
            what: format!("pressure mode `{mode}` (expected default, hierarchy or local)"),
        });
    }
    // SAFETY: eventfd takes no pointers; a non-negative return is a new fd we own.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(Error::last_os_error("eventfd"));
    }
    // SAFETY: `raw` is a freshly created descriptor owned by nobody else.
    let efd = unsafe { OwnedFd::from_raw_fd(raw) };
    let level_path = cg.path().join("memory.pressure_level");
    let level_file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&level_path)
        .map_err(|e| Error::io(&level_path, e))?;
    // "default" is written without a mode so that kernels before 4.5 accept it.
    let line = if mode == "default" {
        format!("{} {} {}", efd.as_raw_fd(), level_file.as_raw_fd(), level)
    } else {
        format!(
            "{} {} {},{}",
            efd.as_raw_fd(),
            level_file.as_raw_fd(),
            level,
            mode
        )
    };
    let control = cg.path().join("cgroup.event_control");
    std::fs::write(&control, line).map_err(|e| Error::io(&control, e))?;
    // The registration holds its own references; memory.pressure_level may be closed.
    Ok(efd)
}

/// Registers cgroup v1 memory thresholds on `cg` (Documentation/admin-guide/
/// cgroup-v1/memory.rst, "Memory thresholds"): one eventfd that becomes readable each
/// time `memory.usage_in_bytes` crosses any of `thresholds_bytes`, upwards or
/// downwards. A poller woken by it sees usage at a threshold when it crosses, instead
/// of up to a sampling period later. Returns a non-blocking, close-on-exec eventfd;
/// [`read_eventfd`] resets it; closing it unregisters every threshold.
///
/// Errors: [`Error::Unsupported`] on cgroup v2 (it has no usage thresholds);
/// [`Error::InvalidArgument`] for an empty list; [`Error::Io`] naming
/// `cgroup.event_control` when the kernel refuses a registration.
pub fn v1_usage_threshold_eventfd(cg: &MemoryCgroup, thresholds_bytes: &[u64]) -> Result<OwnedFd> {
    if cg.version() != CgroupVersion::V1 {
        return Err(Error::Unsupported {
            what: format!(
                "memory usage thresholds need cgroup v1; {} is v2",
                cg.path().display()
            ),
        });
    }
    if thresholds_bytes.is_empty() {
        return Err(Error::InvalidArgument {
            what: "no memory threshold to register".into(),
        });
    }
    // SAFETY: eventfd takes no pointers; a non-negative return is a new fd we own.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(Error::last_os_error("eventfd"));
    }
    // SAFETY: `raw` is a freshly created descriptor owned by nobody else.
    let efd = unsafe { OwnedFd::from_raw_fd(raw) };
    let usage_path = cg.path().join("memory.usage_in_bytes");
    let usage_file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&usage_path)
        .map_err(|e| Error::io(&usage_path, e))?;
    let control = cg.path().join("cgroup.event_control");
    for t in thresholds_bytes {
        let line = format!("{} {} {}", efd.as_raw_fd(), usage_file.as_raw_fd(), t);
        std::fs::write(&control, line).map_err(|e| Error::io(&control, e))?;
    }
    Ok(efd)
}

/// Reads and resets an eventfd: `Ok(Some(n))` with the number of events since the last
/// read, `Ok(None)` when none is pending.
pub fn read_eventfd(fd: BorrowedFd<'_>) -> Result<Option<u64>> {
    let mut buf = [0u8; 8];
    // SAFETY: buf is 8 writable bytes, the size eventfd reads require.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(Error::Syscall {
            call: "read(eventfd)".into(),
            source: e,
        });
    }
    if n != 8 {
        return Err(Error::Syscall {
            call: "read(eventfd)".into(),
            source: io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short read of {n} bytes"),
            ),
        });
    }
    Ok(Some(u64::from_ne_bytes(buf)))
}

/// Creates a PSI trigger on `path` (`/proc/pressure/memory` or a v2 group's
/// `memory.pressure`): fires (`POLLPRI`) when `some` (or, with `full`, `full`) stall
/// time exceeds `stall_us` within any `window_us`.
///
/// `window_us` must be within 500 ms..=10 s and `stall_us` within 1..=`window_us`.
/// Without `CAP_SYS_RESOURCE` in the opener's credentials (root without it counts as
/// unprivileged, as in many VMs and containers) the kernel (6.5+) only accepts windows
/// that are multiples of 2 s ([`PSI_UNPRIVILEGED_WINDOW_US`]): any other window is then
/// an [`Error::InvalidArgument`] that says so. A file that is not a PSI file is an
/// [`Error::Io`].
/// The returned fd is non-blocking and close-on-exec; closing it removes the trigger.
pub fn psi_trigger(path: &Path, full: bool, stall_us: u64, window_us: u64) -> Result<OwnedFd> {
    if !(PSI_WINDOW_MIN_US..=PSI_WINDOW_MAX_US).contains(&window_us) {
        return Err(Error::InvalidArgument {
            what: format!("PSI window {window_us} us (must be 500000..=10000000)"),
        });
    }
    if stall_us == 0 || stall_us > window_us {
        return Err(Error::InvalidArgument {
            what: format!("PSI stall {stall_us} us (must be 1..=window {window_us} us)"),
        });
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let kind = if full { "full" } else { "some" };
    let spec = format!("{kind} {stall_us} {window_us}\0");
    if let Err(e) = file.write_all(spec.as_bytes()) {
        // `%` rather than `is_multiple_of`: the workspace's MSRV is 1.80.
        #[allow(clippy::manual_is_multiple_of)]
        let unprivileged_window = window_us % PSI_UNPRIVILEGED_WINDOW_US != 0;
        if e.raw_os_error() == Some(libc::EINVAL) && unprivileged_window {
            return Err(Error::InvalidArgument {
                what: format!(
                    "{}: PSI window {window_us} us refused (EINVAL): without CAP_SYS_RESOURCE \
                     the window must be a multiple of 2 s",
                    path.display()
                ),
            });
        }
        return Err(Error::io(path, e));
    }
    Ok(OwnedFd::from(file))
}

/// `poll(2)` on one descriptor for `events`, retried when interrupted: the returned
/// events, `None` on timeout (`timeout_ms` negative: wait forever).
fn poll_one(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    timeout_ms: i32,
) -> Result<Option<libc::c_short>> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::Syscall {
                call: "poll".into(),
                source: e,
            });
        }
        return Ok((n > 0).then_some(pfd.revents));
    }
}

/// A `poll` error for events `revents` that report a failed source.
fn failed_source(what: &str, revents: libc::c_short) -> Error {
    Error::Syscall {
        call: "poll".into(),
        source: io::Error::other(format!("{what} (revents {revents:#x})")),
    }
}

const POLL_FAILED: libc::c_short = libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;

/// Waits up to `timeout_ms` (negative: forever) for `fd` to report an event
/// (`POLLIN` or `POLLPRI`). `Ok(true)` when it did, `Ok(false)` on timeout. Errors when
/// the kernel reports `POLLERR`/`POLLHUP`/`POLLNVAL` without data (a source that
/// failed). Interrupted waits are retried. For a PSI trigger use
/// [`wait_for_psi_event`].
pub fn wait_for_event(fd: BorrowedFd<'_>, timeout_ms: i32) -> Result<bool> {
    match poll_one(fd, libc::POLLIN | libc::POLLPRI, timeout_ms)? {
        None => Ok(false),
        Some(r) if r & POLL_FAILED != 0 && r & (libc::POLLIN | libc::POLLPRI) == 0 => {
            Err(failed_source("event source failed", r))
        }
        Some(_) => Ok(true),
    }
}

/// Waits up to `timeout_ms` (negative: forever) for a PSI trigger ([`psi_trigger`]) to
/// fire: `POLLPRI` only, because a pressure file always polls readable (the kernel's
/// `psi_trigger_poll` returns its default mask, `POLLIN` included, with or without an
/// event), so [`wait_for_event`] would return at once. `Ok(true)` when it fired,
/// `Ok(false)` on timeout. Errors: `POLLERR`, which the kernel reports (with `POLLPRI`)
/// once the trigger's cgroup is removed (kernfs, a deactivated file). Interrupted waits
/// are retried.
pub fn wait_for_psi_event(fd: BorrowedFd<'_>, timeout_ms: i32) -> Result<bool> {
    match poll_one(fd, libc::POLLPRI, timeout_ms)? {
        None => Ok(false),
        Some(r) if r & POLL_FAILED != 0 => {
            Err(failed_source("PSI trigger failed, its cgroup removed?", r))
        }
        Some(r) => Ok(r & libc::POLLPRI != 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_trigger_validates_arguments() {
        let p = Path::new("/proc/pressure/memory");
        for (stall, window) in [
            (100_000, 100_000),
            (100_000, 20_000_000),
            (0, 1_000_000),
            (2_000_000, 1_000_000),
        ] {
            let e = psi_trigger(p, false, stall, window).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument { .. }),
                "{stall} {window}: {e}"
            );
        }
    }

    #[test]
    fn eventfd_read_is_none_when_idle_and_counts_writes() {
        // SAFETY: plain eventfd creation.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(raw >= 0);
        // SAFETY: fresh fd.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        use std::os::fd::AsFd;
        assert_eq!(read_eventfd(fd.as_fd()).unwrap(), None);
        assert!(!wait_for_event(fd.as_fd(), 0).unwrap());
        let one = 3u64.to_ne_bytes();
        // SAFETY: 8 readable bytes.
        assert_eq!(unsafe { libc::write(raw, one.as_ptr().cast(), 8) }, 8);
        assert!(wait_for_event(fd.as_fd(), 0).unwrap());
        assert_eq!(read_eventfd(fd.as_fd()).unwrap(), Some(3));
        assert_eq!(read_eventfd(fd.as_fd()).unwrap(), None);
    }
}
