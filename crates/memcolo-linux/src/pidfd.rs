//! Process file descriptors (`pidfd_open(2)`, `pidfd_send_signal(2)`, Linux 5.3+).
//!
//! A pidfd names one process for good: signalling through it cannot hit a recycled pid,
//! and it becomes readable (`POLLIN`) when the process exits, so the agent learns of a
//! registered process's exit without polling `/proc`.

use crate::error::{Error, Result};
use memcolo_policy::types::Pid;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Opens a pidfd for `pid` (close-on-exec). Errors: `ESRCH` (see
/// [`Error::is_not_found`]) when no such process exists; `ENOSYS` before Linux 5.3.
pub fn pidfd_open(pid: Pid) -> Result<OwnedFd> {
    if pid <= 0 {
        return Err(Error::InvalidArgument {
            what: format!("pid {pid}"),
        });
    }
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        return Err(Error::last_os_error(format!("pidfd_open({pid})")));
    }
    // SAFETY: a non-negative return is a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw as i32) })
}

/// Sends signal `sig` to the process behind `fd`. Errors: `ESRCH` when it has exited
/// (and been reaped), `EPERM` without permission, `EINVAL` for a bad signal.
pub fn pidfd_send_signal(fd: BorrowedFd<'_>, sig: i32) -> Result<()> {
    // SAFETY: a null siginfo is allowed (the kernel fills a kill()-like one).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(Error::last_os_error(format!(
            "pidfd_send_signal(sig {sig})"
        )));
    }
    Ok(())
}

/// Whether the process behind `fd` has exited (the pidfd is readable), without waiting.
pub fn pidfd_exited(fd: BorrowedFd<'_>) -> Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    if n < 0 {
        return Err(Error::Syscall {
            call: "poll(pidfd)".into(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(n > 0 && pfd.revents & libc::POLLIN != 0)
}
