//! A small builder of fake procfs and cgroupfs trees for tests (the oomd
//! `makeDir`/`makeFile` habit): describe a tree as values, then write it below a
//! temporary directory and point a [`crate::procfs::ProcFs`] or
//! [`crate::cgroup::MemoryCgroup`] at it.
//!
//! ```
//! use memcolo_linux::fake::{dir, file};
//! let root = std::env::temp_dir().join(format!("memcolo-doc-{}", std::process::id()));
//! dir("cg", vec![file("memory.current", "4096\n"), file("memory.max", "max\n")])
//!     .create_in(&root)
//!     .unwrap();
//! assert_eq!(std::fs::read_to_string(root.join("cg/memory.current")).unwrap(), "4096\n");
//! std::fs::remove_dir_all(&root).unwrap();
//! ```

use std::io;
use std::path::{Path, PathBuf};

/// One node of a fake tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeEntry {
    /// A directory and its entries.
    Dir(String, Vec<FakeEntry>),
    /// A regular file and its contents.
    File(String, Vec<u8>),
    /// A symbolic link and its target (as `/proc/<pid>/fd/*` entries are).
    Symlink(String, PathBuf),
}

/// A directory entry.
pub fn dir(name: &str, entries: Vec<FakeEntry>) -> FakeEntry {
    FakeEntry::Dir(name.to_string(), entries)
}

/// A file entry with text (or bytes) contents.
pub fn file(name: &str, contents: impl AsRef<[u8]>) -> FakeEntry {
    FakeEntry::File(name.to_string(), contents.as_ref().to_vec())
}

/// A symlink entry.
pub fn symlink(name: &str, target: impl Into<PathBuf>) -> FakeEntry {
    FakeEntry::Symlink(name.to_string(), target.into())
}

impl FakeEntry {
    /// Creates this entry (recursively) inside `parent`, which is created if needed.
    /// Returns the path of the entry.
    pub fn create_in(&self, parent: &Path) -> io::Result<PathBuf> {
        std::fs::create_dir_all(parent)?;
        match self {
            FakeEntry::Dir(name, entries) => {
                let path = parent.join(name);
                std::fs::create_dir_all(&path)?;
                for e in entries {
                    e.create_in(&path)?;
                }
                Ok(path)
            }
            FakeEntry::File(name, contents) => {
                let path = parent.join(name);
                std::fs::write(&path, contents)?;
                Ok(path)
            }
            FakeEntry::Symlink(name, target) => {
                let path = parent.join(name);
                std::os::unix::fs::symlink(target, &path)?;
                Ok(path)
            }
        }
    }
}

/// Creates every entry of `entries` inside `root`.
pub fn create_tree(root: &Path, entries: &[FakeEntry]) -> io::Result<()> {
    for e in entries {
        e.create_in(root)?;
    }
    Ok(())
}

/// A [`Prover`](crate::identity::Prover) over a fake procfs tree, for tests of code
/// that acts on processes: a pid "exists" while `<root>/<pid>/stat` and `status` do,
/// its start time and credentials are read from them, and a removed directory reads as
/// an exited process. The pidfd it hands out is one of the calling process (never
/// used to act: tests pair it with a recording actuator).
#[derive(Clone, Debug)]
pub struct FakeProver {
    pub procfs: crate::procfs::ProcFs,
}

impl crate::identity::Prover for FakeProver {
    fn open(
        &self,
        pid: memcolo_policy::types::Pid,
        expect_start: Option<u64>,
    ) -> Result<crate::identity::ProvenProcess, crate::identity::IdentityError> {
        use crate::identity::{Credentials, IdentityError, ProvenProcess};
        let stat = self.procfs.read_pid_stat(pid)?;
        let status = self.procfs.read_pid_status(pid)?;
        if let Some(start) = expect_start {
            if stat.starttime_ticks != start {
                return Err(IdentityError::Mismatch {
                    pid,
                    why: format!(
                        "started at tick {} instead of {start}",
                        stat.starttime_ticks
                    ),
                });
            }
        }
        Ok(ProvenProcess {
            pidfd: crate::pidfd::pidfd_open(std::process::id() as memcolo_policy::types::Pid)?,
            pid,
            starttime_ticks: stat.starttime_ticks,
            creds: Credentials::of(&status),
        })
    }

    fn verify(
        &self,
        p: &crate::identity::ProvenProcess,
    ) -> Result<(), crate::identity::IdentityError> {
        use crate::identity::{Credentials, IdentityError};
        let (stat, status) = match (
            self.procfs.read_pid_stat(p.pid),
            self.procfs.read_pid_status(p.pid),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            _ => return Err(IdentityError::Exited { pid: p.pid }),
        };
        if stat.starttime_ticks != p.starttime_ticks {
            return Err(IdentityError::Exited { pid: p.pid });
        }
        p.same_creds(&Credentials::of(&status))
    }
}
