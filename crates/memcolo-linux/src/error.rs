//! The error type of the Linux layer.
//!
//! Every variant that comes from a file carries the offending path, so a log line names
//! the exact procfs or cgroupfs file that was missing or malformed. A process or cgroup
//! that vanishes between listing and reading is ordinary on a live system:
//! [`Error::is_not_found`] lets callers skip it.

use std::io;
use std::path::PathBuf;

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong while reading kernel state or acting on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file under procfs, cgroupfs or a regular filesystem could not be opened, read
    /// or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A kernel file was read but its text did not have the documented format.
    #[error("{}: cannot parse: {msg}", path.display())]
    Parse { path: PathBuf, msg: String },
    /// The kernel or the cgroup version in use does not offer this interface
    /// (for example `memory.reclaim` on cgroup v1).
    #[error("unsupported: {what}")]
    Unsupported { what: String },
    /// A caller passed a value the interface cannot accept (a cgroup name with `/`,
    /// a PSI window outside 500 ms..10 s, an unknown pressure level...).
    #[error("invalid argument: {what}")]
    InvalidArgument { what: String },
    /// A system call that does not work on a path failed (`pidfd_open`, `kill`,
    /// `eventfd`...).
    #[error("{call}: {source}")]
    Syscall {
        call: String,
        #[source]
        source: io::Error,
    },
    /// `rmdir` of a cgroup failed because it still holds processes or child groups.
    #[error("{}: cgroup is busy: it still has {procs} process(es) or {children} child group(s)", path.display())]
    CgroupBusy {
        path: PathBuf,
        procs: usize,
        children: usize,
    },
}

impl Error {
    /// Builds [`Error::Io`].
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// Builds [`Error::Parse`].
    pub fn parse(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Parse {
            path: path.into(),
            msg: msg.into(),
        }
    }

    /// Builds [`Error::Syscall`] from `errno`.
    pub fn last_os_error(call: impl Into<String>) -> Self {
        Error::Syscall {
            call: call.into(),
            source: io::Error::last_os_error(),
        }
    }

    /// True when the error means "the process or cgroup is gone" (`ENOENT` or `ESRCH`):
    /// a pid that exited or a cgroup that was removed between listing and reading.
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::Io { source, .. } | Error::Syscall { source, .. } => {
                source.kind() == io::ErrorKind::NotFound
                    || source.raw_os_error() == Some(libc::ESRCH)
                    || source.raw_os_error() == Some(libc::ENOENT)
            }
            _ => false,
        }
    }

    /// The `errno` behind an I/O or system-call error, if any.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } | Error::Syscall { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// For callers whose interface speaks `io::Error`: keeps the kind of the underlying
/// error and the message, which names the file.
impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        let kind = match &e {
            Error::Io { source, .. } | Error::Syscall { source, .. } => source.kind(),
            Error::Parse { .. } => io::ErrorKind::InvalidData,
            Error::Unsupported { .. } => io::ErrorKind::Unsupported,
            Error::InvalidArgument { .. } => io::ErrorKind::InvalidInput,
            Error::CgroupBusy { .. } => io::ErrorKind::ResourceBusy,
        };
        io::Error::new(kind, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn into_io_error_keeps_the_kind_and_the_path() {
        let e = Error::io("/proc/1/stat", io::Error::from_raw_os_error(libc::ENOENT));
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::NotFound);
        assert!(io.to_string().contains("/proc/1/stat"), "{io}");
        let io: io::Error = Error::parse("/proc/1/stat", "bad").into();
        assert_eq!(io.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn not_found_covers_enoent_and_esrch_only() {
        let enoent = Error::io("/proc/1/stat", io::Error::from_raw_os_error(libc::ENOENT));
        let esrch = Error::io("/proc/1/stat", io::Error::from_raw_os_error(libc::ESRCH));
        let sys = Error::Syscall {
            call: "pidfd_open(7)".into(),
            source: io::Error::from_raw_os_error(libc::ESRCH),
        };
        let eacces = Error::io("/proc/1/fd", io::Error::from_raw_os_error(libc::EACCES));
        let parse = Error::parse("/proc/1/stat", "bad");
        assert!(enoent.is_not_found());
        assert!(esrch.is_not_found());
        assert!(sys.is_not_found());
        assert!(!eacces.is_not_found());
        assert!(!parse.is_not_found());
    }

    #[test]
    fn messages_name_the_path() {
        let e = Error::parse("/proc/meminfo", "missing MemTotal");
        assert_eq!(
            e.to_string(),
            "/proc/meminfo: cannot parse: missing MemTotal"
        );
        let e = Error::CgroupBusy {
            path: "/sys/fs/cgroup/memory/x".into(),
            procs: 2,
            children: 0,
        };
        assert!(e.to_string().contains("/sys/fs/cgroup/memory/x"));
        assert!(e.to_string().contains("2 process"));
    }
}
