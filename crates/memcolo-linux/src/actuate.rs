//! Actuators: every side effect the agent has on other processes, behind a trait so
//! that the agent's tests record calls instead of signalling or killing (the oomd
//! habit).
//!
//! - `signal`: M3's low/high notifications to elastic applications (M3 §4, §5.2) may be
//!   delivered as signals.
//! - `kill`: M3's last resort above the top of memory (M3 §5.1).
//! - `drop_file_cache`: Hermes' advice to drop a best-effort job's file cache
//!   (Hermes §3.3), on a [`CachedFile`] the agent reached without a path walk (never
//!   on a path a tenant controls: see [`crate::filecache`]).
//! - `reclaim_process`: `process_madvise(MADV_COLD|MADV_PAGEOUT)` on a process's
//!   memory (Hermit's asynchronous reclaim; M3 §5 reclaiming best-effort memory).

use crate::error::{Error, Result};
use crate::filecache::CachedFile;
use crate::identity::ProvenProcess;
use crate::pageout::{self, ReclaimAdvice, VmaKind};
use crate::pidfd;
use crate::procfs::ProcFs;
use memcolo_policy::types::Pid;
use std::path::PathBuf;

/// One side effect, as recorded by [`RecordingActuator`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActuatorCall {
    Signal {
        pid: Pid,
        sig: i32,
    },
    Kill {
        pid: Pid,
        reason: String,
    },
    /// The file's descriptive path (not opened) and identity.
    DropFileCache {
        path: PathBuf,
        dev: u64,
        ino: u64,
    },
    ReclaimProcess {
        pid: Pid,
        advice: ReclaimAdvice,
        kind: VmaKind,
    },
}

/// The side effects the agent may have.
pub trait Actuator: Send {
    /// Sends signal `sig` to process `p` through its pidfd. The caller re-verified
    /// `p` ([`crate::identity::Prover::verify`]) just before.
    fn signal(&mut self, p: &ProvenProcess, sig: i32) -> Result<()>;
    /// Kills process `p` with `SIGKILL` through its pidfd; `reason` is logged. The
    /// caller re-verified `p` just before.
    fn kill(&mut self, p: &ProvenProcess, reason: &str) -> Result<()>;
    /// Drops the clean page cache of `file` (`posix_fadvise(POSIX_FADV_DONTNEED)` on
    /// the agent's own descriptor of it); returns the bytes dropped (resident before
    /// minus resident after, 0 if it grew meanwhile). May block as long as the file's
    /// file system does: call it off the main loop.
    fn drop_file_cache(&mut self, file: &CachedFile) -> Result<u64>;
    /// Advises process `p`'s memory of `kind` with `advice` (`process_madvise(2)`
    /// through its pidfd, after re-verifying it); returns the bytes of address space
    /// advised. The default refuses with [`Error::Unsupported`].
    fn reclaim_process(
        &mut self,
        p: &ProvenProcess,
        advice: ReclaimAdvice,
        kind: VmaKind,
    ) -> Result<u64> {
        let _ = (advice, kind);
        Err(Error::Unsupported {
            what: format!("process reclaim of pid {} by this actuator", p.pid()),
        })
    }
}

/// The real actuator: signals only through the pidfd of a proven process, so a
/// recycled pid is never hit (there is no fallback to `kill(2)`).
#[derive(Clone, Copy, Debug, Default)]
pub struct LinuxActuator;

impl Actuator for LinuxActuator {
    fn signal(&mut self, p: &ProvenProcess, sig: i32) -> Result<()> {
        tracing::debug!(pid = p.pid(), sig, "signal");
        pidfd::pidfd_send_signal(p.pidfd(), sig)
    }

    fn kill(&mut self, p: &ProvenProcess, reason: &str) -> Result<()> {
        tracing::warn!(pid = p.pid(), reason, "killing process");
        pidfd::pidfd_send_signal(p.pidfd(), libc::SIGKILL)
    }

    fn drop_file_cache(&mut self, file: &CachedFile) -> Result<u64> {
        let before = file.resident_bytes()?;
        file.fadvise_dontneed()?;
        let after = file.resident_bytes()?;
        let dropped = before.saturating_sub(after);
        tracing::debug!(path = %file.path().display(), ?file, before, after, dropped, "dropped file cache");
        Ok(dropped)
    }

    fn reclaim_process(
        &mut self,
        p: &ProvenProcess,
        advice: ReclaimAdvice,
        kind: VmaKind,
    ) -> Result<u64> {
        let report = pageout::reclaim_process(&ProcFs::root(), p, advice, kind)?;
        tracing::debug!(pid = p.pid(), ?advice, ?kind, ?report, "process reclaim");
        Ok(report.advised_bytes)
    }
}

/// Records every call and acts on nothing; for tests. `drop_file_cache` answers
/// `drop_result_bytes`, `reclaim_process` `reclaim_result_bytes`.
#[derive(Clone, Debug, Default)]
pub struct RecordingActuator {
    pub calls: Vec<ActuatorCall>,
    pub drop_result_bytes: u64,
    /// What `reclaim_process` answers.
    pub reclaim_result_bytes: u64,
}

impl Actuator for RecordingActuator {
    fn signal(&mut self, p: &ProvenProcess, sig: i32) -> Result<()> {
        self.calls.push(ActuatorCall::Signal { pid: p.pid(), sig });
        Ok(())
    }

    fn kill(&mut self, p: &ProvenProcess, reason: &str) -> Result<()> {
        self.calls.push(ActuatorCall::Kill {
            pid: p.pid(),
            reason: reason.to_string(),
        });
        Ok(())
    }

    fn drop_file_cache(&mut self, file: &CachedFile) -> Result<u64> {
        let (dev, ino) = file.id();
        self.calls.push(ActuatorCall::DropFileCache {
            path: file.path().to_path_buf(),
            dev,
            ino,
        });
        Ok(self.drop_result_bytes)
    }

    fn reclaim_process(
        &mut self,
        p: &ProvenProcess,
        advice: ReclaimAdvice,
        kind: VmaKind,
    ) -> Result<u64> {
        self.calls.push(ActuatorCall::ReclaimProcess {
            pid: p.pid(),
            advice,
            kind,
        });
        Ok(self.reclaim_result_bytes)
    }
}

impl<A: Actuator + ?Sized> Actuator for Box<A> {
    fn signal(&mut self, p: &ProvenProcess, sig: i32) -> Result<()> {
        (**self).signal(p, sig)
    }
    fn kill(&mut self, p: &ProvenProcess, reason: &str) -> Result<()> {
        (**self).kill(p, reason)
    }
    fn drop_file_cache(&mut self, file: &CachedFile) -> Result<u64> {
        (**self).drop_file_cache(file)
    }
    fn reclaim_process(
        &mut self,
        p: &ProvenProcess,
        advice: ReclaimAdvice,
        kind: VmaKind,
    ) -> Result<u64> {
        (**self).reclaim_process(p, advice, kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Prover;

    fn me() -> ProvenProcess {
        crate::identity::LinuxProver::root()
            .open(std::process::id() as Pid, None)
            .unwrap()
    }

    #[test]
    fn recording_actuator_records_in_order() {
        let mut a = RecordingActuator {
            drop_result_bytes: 4096,
            ..Default::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let x = dir.path().join("x");
        std::fs::write(&x, b"data").unwrap();
        let file = CachedFile::from_file(std::fs::File::open(&x).unwrap(), &x).unwrap();
        let (dev, ino) = file.id();
        let p = me();
        a.signal(&p, 0).unwrap();
        assert_eq!(a.drop_file_cache(&file).unwrap(), 4096);
        a.kill(&p, "above top").unwrap();
        a.reclaim_process(&p, ReclaimAdvice::Pageout, VmaKind::File)
            .unwrap();
        assert_eq!(
            a.calls,
            vec![
                ActuatorCall::Signal {
                    pid: p.pid(),
                    sig: 0
                },
                ActuatorCall::DropFileCache { path: x, dev, ino },
                ActuatorCall::Kill {
                    pid: p.pid(),
                    reason: "above top".into()
                },
                ActuatorCall::ReclaimProcess {
                    pid: p.pid(),
                    advice: ReclaimAdvice::Pageout,
                    kind: VmaKind::File
                },
            ]
        );
    }

    #[test]
    fn linux_actuator_signals_through_the_pidfd() {
        // Signal 0 checks deliverability only.
        LinuxActuator.signal(&me(), 0).unwrap();
    }
}
