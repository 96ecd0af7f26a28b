//! Process identity that a tenant cannot forge, reuse or swap.
//!
//! A pid is only a number: the process it names can exit and the kernel can give the
//! number to another process (of another user, root included) at any time. Every
//! action memcolo takes on a process — a signal, a kill, `pidfd_getfd`,
//! `process_madvise` — therefore goes through a [`ProvenProcess`]: a pidfd together
//! with the start time and credentials that were read *while the pidfd was known to
//! refer to that very process*.
//!
//! The proof, for a pidfd `fd` of pid `P`:
//! 1. read `/proc/P/stat` (start time) and `/proc/P/status` (uids, gids, capabilities);
//! 2. then check that `fd`'s process has not exited (`poll(POLLIN)` on the pidfd).
//!
//! A pid is freed only when its process is reaped, after it exited; so if the process
//! behind `fd` is still alive after step 1, the files read in step 1 were its own.
//!
//! A socket peer ([`ProvenProcess::from_peer`]) is the process that called
//! `connect(2)`: with `SO_PEERPIDFD` (Linux 6.5) the kernel hands over a pidfd of it.
//! Without it, `pidfd_open` of the `SO_PEERCRED` pid is accepted only if that process
//! started no later than the connection was accepted. Either way the peer must still
//! be alive and still hold the effective uid and gid it connected with: a peer that
//! connected, forked and exited, leaving a child to speak on the socket, is refused,
//! as is a peer that exec'd a set-user-ID program since.
//!
//! [`ProvenProcess::verify`] repeats the proof before each action and reports a change
//! of credentials (an exec of a set-user-ID, set-group-ID or file-capability program,
//! or `setuid(2)`), which ends a registration.

use crate::error::{Error, Result};
use crate::pidfd::{pidfd_exited, pidfd_open, pidfd_send_signal};
use crate::procfs::{PidStatus, ProcFs};
use memcolo_policy::types::Pid;
use serde::{Deserialize, Serialize};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// The credentials of a process (`/proc/PID/status`), compared whole: any change is a
/// change of identity for memcolo.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    /// Real, effective, saved and filesystem user ids.
    pub uids: [u32; 4],
    /// Real, effective, saved and filesystem group ids.
    pub gids: [u32; 4],
    /// Permitted capabilities.
    pub cap_prm: u64,
    /// Effective capabilities.
    pub cap_eff: u64,
}

impl Credentials {
    /// The credentials in a parsed `/proc/PID/status`.
    pub fn of(status: &PidStatus) -> Self {
        Credentials {
            uids: status.uids,
            gids: status.gids,
            cap_prm: status.cap_prm,
            cap_eff: status.cap_eff,
        }
    }

    /// Real user id.
    pub fn ruid(&self) -> u32 {
        self.uids[0]
    }

    /// Effective user id.
    pub fn euid(&self) -> u32 {
        self.uids[1]
    }

    /// Effective group id.
    pub fn egid(&self) -> u32 {
        self.gids[1]
    }

    /// True when every user id (real, effective, saved, filesystem) is `uid`: the
    /// process can do nothing that user could not.
    pub fn all_uids_are(&self, uid: u32) -> bool {
        self.uids.iter().all(|u| *u == uid)
    }
}

/// Why a process is no longer the one that was proved.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The process exited (it may be a zombie, or reaped and its pid reused).
    #[error("process {pid} exited")]
    Exited { pid: Pid },
    /// The process runs with other credentials than when it was proved.
    #[error(
        "process {pid} changed credentials (uids {was:?} -> {now:?}, gids {was_g:?} -> {now_g:?})"
    )]
    CredentialsChanged {
        pid: Pid,
        was: [u32; 4],
        now: [u32; 4],
        was_g: [u32; 4],
        now_g: [u32; 4],
    },
    /// The process is not the one expected (another start time, another owner).
    #[error("process {pid} is not the expected one: {why}")]
    Mismatch { pid: Pid, why: String },
    /// Reading the process or its pidfd failed.
    #[error(transparent)]
    Os(#[from] Error),
}

impl IdentityError {
    /// True when the process is simply gone (exited, or its /proc entry vanished).
    pub fn is_gone(&self) -> bool {
        match self {
            IdentityError::Exited { .. } => true,
            IdentityError::Os(e) => e.is_not_found(),
            _ => false,
        }
    }
}

/// A process proved to be a given one: its pidfd, pid, start time and credentials.
#[derive(Debug)]
pub struct ProvenProcess {
    pub(crate) pidfd: OwnedFd,
    pub(crate) pid: Pid,
    pub(crate) starttime_ticks: u64,
    pub(crate) creds: Credentials,
}

impl ProvenProcess {
    /// Opens `pid` and proves its identity. With `expect_start`, the process must have
    /// that start time (clock ticks since boot, `/proc/PID/stat` field 22) — the way to
    /// find again a process known from an earlier read. Errors: the process is gone,
    /// has another start time, or /proc cannot be read.
    pub fn open(
        procfs: &ProcFs,
        pid: Pid,
        expect_start: Option<u64>,
    ) -> std::result::Result<Self, IdentityError> {
        let pidfd = pidfd_open(pid)?;
        let p = Self::prove(procfs, pidfd, pid)?;
        if let Some(start) = expect_start {
            if p.starttime_ticks != start {
                return Err(IdentityError::Mismatch {
                    pid,
                    why: format!(
                        "started at tick {} instead of {start} (pid reused)",
                        p.starttime_ticks
                    ),
                });
            }
        }
        Ok(p)
    }

    /// Proves the process at the other end of a connected Unix socket: the one that
    /// called `connect(2)`. `accepted_at_ticks` is when the connection was accepted,
    /// in clock ticks since boot (bounds the start time when `SO_PEERPIDFD` is
    /// missing). Errors: the peer exited, or no longer has the effective uid/gid it
    /// connected with (`SO_PEERCRED`), or cannot be read.
    pub fn from_peer(
        procfs: &ProcFs,
        sock: BorrowedFd<'_>,
        accepted_at_ticks: u64,
    ) -> std::result::Result<Self, IdentityError> {
        let cred = peer_cred(sock)?;
        let pid = cred.pid as Pid;
        if pid <= 0 {
            return Err(IdentityError::Mismatch {
                pid,
                why: "the peer's pid is not visible in the agent's pid namespace".into(),
            });
        }
        let p = match peer_pidfd(sock)? {
            Some(fd) => {
                let fd_pid = pidfd_pid(fd.as_fd())?;
                if fd_pid != pid {
                    // -1: exited; 0: another pid namespace; else a mismatch.
                    return Err(if fd_pid < 0 {
                        IdentityError::Exited { pid }
                    } else {
                        IdentityError::Mismatch {
                            pid,
                            why: format!("SO_PEERPIDFD names pid {fd_pid}"),
                        }
                    });
                }
                Self::prove(procfs, fd, pid)?
            }
            None => {
                let p = Self::prove(procfs, pidfd_open(pid)?, pid)?;
                if p.starttime_ticks > accepted_at_ticks {
                    return Err(IdentityError::Mismatch {
                        pid,
                        why: format!(
                            "started at tick {}, after the connection (tick {accepted_at_ticks}): pid reused",
                            p.starttime_ticks
                        ),
                    });
                }
                p
            }
        };
        if p.creds.euid() != cred.uid || p.creds.egid() != cred.gid {
            return Err(IdentityError::CredentialsChanged {
                pid,
                was: [cred.uid; 4],
                now: p.creds.uids,
                was_g: [cred.gid; 4],
                now_g: p.creds.gids,
            });
        }
        Ok(p)
    }

    /// Restores a process known from saved state: same pid, start time and
    /// credentials, or an error.
    pub fn reopen(
        procfs: &ProcFs,
        pid: Pid,
        starttime_ticks: u64,
        creds: &Credentials,
    ) -> std::result::Result<Self, IdentityError> {
        let p = Self::open(procfs, pid, Some(starttime_ticks))?;
        p.same_creds(creds)?;
        Ok(p)
    }

    fn prove(
        procfs: &ProcFs,
        pidfd: OwnedFd,
        pid: Pid,
    ) -> std::result::Result<Self, IdentityError> {
        let stat = procfs.read_pid_stat(pid)?;
        let status = procfs.read_pid_status(pid)?;
        if pidfd_exited(pidfd.as_fd())? {
            return Err(IdentityError::Exited { pid });
        }
        Ok(ProvenProcess {
            pidfd,
            pid,
            starttime_ticks: stat.starttime_ticks,
            creds: Credentials::of(&status),
        })
    }

    pub(crate) fn same_creds(&self, want: &Credentials) -> std::result::Result<(), IdentityError> {
        if self.creds != *want {
            return Err(IdentityError::CredentialsChanged {
                pid: self.pid,
                was: want.uids,
                now: self.creds.uids,
                was_g: want.gids,
                now_g: self.creds.gids,
            });
        }
        Ok(())
    }

    /// Repeats the proof now: the process is alive and holds the credentials it was
    /// proved with. Call before every action.
    pub fn verify(&self, procfs: &ProcFs) -> std::result::Result<(), IdentityError> {
        let status = procfs.read_pid_status(self.pid)?;
        if pidfd_exited(self.pidfd.as_fd())? {
            return Err(IdentityError::Exited { pid: self.pid });
        }
        self.same_creds(&Credentials::of(&status))
    }

    /// The pid namespace the process is in ([`ProcFs::pid_namespace`]), read and then
    /// proved to be the proven process's ([`verify`](Self::verify) after the read).
    pub fn pid_namespace(&self, procfs: &ProcFs) -> std::result::Result<u64, IdentityError> {
        let ns = procfs.pid_namespace(self.pid)?;
        self.verify(procfs)?;
        Ok(ns)
    }

    /// The process's id in its own pid namespace (the last `NSpid` entry), read and
    /// then proved to be the proven process's.
    pub fn pid_in_own_namespace(&self, procfs: &ProcFs) -> std::result::Result<Pid, IdentityError> {
        let status = procfs.read_pid_status(self.pid)?;
        self.verify(procfs)?;
        Ok(status.nspid.last().copied().unwrap_or(self.pid))
    }

    /// [`verify`](Self::verify), then sends `sig` through the pidfd (never by pid).
    pub fn signal(&self, procfs: &ProcFs, sig: i32) -> std::result::Result<(), IdentityError> {
        self.verify(procfs)?;
        pidfd_send_signal(self.pidfd.as_fd(), sig).map_err(IdentityError::Os)
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Start time, clock ticks since boot.
    pub fn starttime_ticks(&self) -> u64 {
        self.starttime_ticks
    }

    pub fn credentials(&self) -> &Credentials {
        &self.creds
    }

    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// A second proof of the same process: a duplicate of the pidfd with the same
    /// start time and credentials (for a worker that needs its own).
    pub fn try_clone(&self) -> Result<ProvenProcess> {
        Ok(ProvenProcess {
            pidfd: self.dup_pidfd()?,
            pid: self.pid,
            starttime_ticks: self.starttime_ticks,
            creds: self.creds,
        })
    }

    /// Converts an identity failure into the crate's error for callers that report
    /// one: gone (exited) is `ESRCH` (not found), another start time or other
    /// credentials `EPERM` (refused).
    pub fn into_error(e: IdentityError) -> Error {
        match e {
            IdentityError::Os(e) => e,
            IdentityError::Exited { pid } => Error::Syscall {
                call: format!("pid {pid}: exited"),
                source: io::Error::from_raw_os_error(libc::ESRCH),
            },
            other => Error::Syscall {
                call: other.to_string(),
                source: io::Error::from_raw_os_error(libc::EPERM),
            },
        }
    }

    /// A second descriptor of the same pidfd (for an exit watcher).
    pub fn dup_pidfd(&self) -> Result<OwnedFd> {
        self.pidfd.try_clone().map_err(|source| Error::Syscall {
            call: "dup(pidfd)".into(),
            source,
        })
    }
}

/// Finds and re-checks processes: the agent's real one ([`LinuxProver`]) or a fake
/// over a fake procfs tree for tests ([`crate::fake::FakeProver`]).
pub trait Prover: Send {
    /// [`ProvenProcess::open`].
    fn open(
        &self,
        pid: Pid,
        expect_start: Option<u64>,
    ) -> std::result::Result<ProvenProcess, IdentityError>;
    /// [`ProvenProcess::verify`].
    fn verify(&self, p: &ProvenProcess) -> std::result::Result<(), IdentityError>;
}

/// The real [`Prover`]: pidfds of real processes, read through `procfs`.
#[derive(Clone, Debug)]
pub struct LinuxProver {
    pub procfs: ProcFs,
}

impl LinuxProver {
    /// Over the real `/proc`.
    pub fn root() -> Self {
        LinuxProver {
            procfs: ProcFs::root(),
        }
    }
}

impl Prover for LinuxProver {
    fn open(
        &self,
        pid: Pid,
        expect_start: Option<u64>,
    ) -> std::result::Result<ProvenProcess, IdentityError> {
        ProvenProcess::open(&self.procfs, pid, expect_start)
    }
    fn verify(&self, p: &ProvenProcess) -> std::result::Result<(), IdentityError> {
        p.verify(&self.procfs)
    }
}

/// Now, in clock ticks since boot (`CLOCK_BOOTTIME`, the clock of `/proc/PID/stat`'s
/// start time), rounded up: the `accepted_at_ticks` of [`ProvenProcess::from_peer`]
/// for a connection accepted just before.
pub fn ticks_since_boot() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("CLOCK_BOOTTIME is always available on Linux");
    let tps = ProcFs::clock_ticks_per_sec();
    ts.tv_sec() as u64 * tps + ts.tv_nsec() as u64 * tps / 1_000_000_000 + 1
}

/// `SO_PEERCRED` of a connected Unix socket.
pub fn peer_cred(sock: BorrowedFd<'_>) -> Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(Error::last_os_error("getsockopt(SO_PEERCRED)"));
    }
    Ok(cred)
}

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that connected. `None` when the
/// kernel does not have it.
pub fn peer_pidfd(sock: BorrowedFd<'_>) -> Result<Option<OwnedFd>> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: fd and len are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOPROTOOPT) | Some(libc::EINVAL) => Ok(None),
            // ESRCH: the peer was reaped before we asked.
            _ => Err(Error::Syscall {
                call: "getsockopt(SO_PEERPIDFD)".into(),
                source: e,
            }),
        };
    }
    // SAFETY: the kernel returned a new descriptor that we own.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The pid a pidfd refers to, from `/proc/self/fdinfo/FD` (`Pid:`): -1 once the
/// process exited, 0 when it is outside our pid namespace.
pub fn pidfd_pid(fd: BorrowedFd<'_>) -> Result<Pid> {
    let path = format!("/proc/self/fdinfo/{}", fd.as_raw_fd());
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse::<Pid>().ok())
        .ok_or_else(|| Error::parse(&path, "no Pid: line (not a pidfd?)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn ticks_now() -> u64 {
        ticks_since_boot()
    }

    #[test]
    fn a_socket_peer_in_this_process_is_proved() {
        let (a, _b) = UnixStream::pair().unwrap();
        let p = ProvenProcess::from_peer(&ProcFs::root(), a.as_fd(), ticks_now()).unwrap();
        assert_eq!(p.pid(), std::process::id() as Pid);
        p.verify(&ProcFs::root()).unwrap();
        assert_eq!(p.credentials().euid(), nix::unistd::geteuid().as_raw());
    }

    #[test]
    fn an_exited_process_is_refused_and_its_pidfd_says_so() {
        // A process that lives until the test ends it (`true` could exit before the
        // proof, which is then refused: right, but not this test).
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let pid = child.id() as Pid;
        let p = ProvenProcess::open(&ProcFs::root(), pid, None).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let e = p.verify(&ProcFs::root()).unwrap_err();
        assert!(e.is_gone(), "{e}");
        assert_eq!(pidfd_pid(p.pidfd()).unwrap(), -1);
        assert!(ProvenProcess::open(&ProcFs::root(), pid, None).is_err());
    }

    #[test]
    fn a_wrong_start_time_is_a_reused_pid() {
        let me = std::process::id() as Pid;
        let p = ProvenProcess::open(&ProcFs::root(), me, None).unwrap();
        let e =
            ProvenProcess::open(&ProcFs::root(), me, Some(p.starttime_ticks() + 1)).unwrap_err();
        assert!(matches!(e, IdentityError::Mismatch { .. }), "{e}");
        let mut other = *p.credentials();
        other.uids[1] ^= 1;
        let e =
            ProvenProcess::reopen(&ProcFs::root(), me, p.starttime_ticks(), &other).unwrap_err();
        assert!(matches!(e, IdentityError::CredentialsChanged { .. }), "{e}");
    }

    #[test]
    fn status_credentials_parse_all_four_ids_and_capabilities() {
        let s = crate::procfs::parse_pid_status(
            "Name:\tx\nUid:\t1\t2\t3\t4\nGid:\t5\t6\t7\t8\nCapPrm:\t000001ffffffffff\nCapEff:\t0000000000000000\n",
            std::path::Path::new("status"),
        )
        .unwrap();
        let c = Credentials::of(&s);
        assert_eq!(c.uids, [1, 2, 3, 4]);
        assert_eq!(c.gids, [5, 6, 7, 8]);
        assert_eq!(c.cap_prm, 0x1ff_ffff_ffff);
        assert_eq!(c.cap_eff, 0);
        assert_eq!((c.ruid(), c.euid(), c.egid()), (1, 2, 6));
    }
}
