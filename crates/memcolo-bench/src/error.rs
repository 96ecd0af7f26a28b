//! The error type of the benchmark library's building blocks.
//!
//! The entry points ([`crate::colocation::run`], [`crate::agent_cost::run`]) return
//! `anyhow::Result` because they are called straight from the `memcolo` binary; the
//! modules below them return [`BenchError`], which names the offending path or value.

use std::path::PathBuf;

/// What went wrong in a benchmark building block.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A file or cgroup operation failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A kernel or tool file had content that could not be parsed.
    #[error("{path}: cannot parse: {msg}")]
    Parse { path: PathBuf, msg: String },
    /// A size argument such as `4GiB` was not understood.
    #[error("invalid size {0:?}: expected a number with an optional unit B, KiB, MiB, GiB, TiB (or K, M, G, T)")]
    BadSize(String),
    /// A ratio argument such as `2:1` was not understood.
    #[error(
        "invalid split {0:?}: expected FILE:ANON with non-negative integers, not both 0 (e.g. 2:1)"
    )]
    BadSplit(String),
    /// A setting is out of its range.
    #[error("invalid setting: {0}")]
    Invalid(String),
    /// A child process could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// A child process or the agent misbehaved (exited early, bad reply...).
    #[error("{0}")]
    Process(String),
    /// Redis answered with an error or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// SIGINT or SIGTERM arrived; the benchmark is cleaning up.
    #[error("interrupted")]
    Interrupted,
}

impl BenchError {
    /// An [`BenchError::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.into(),
            source,
        }
    }
}

/// The result type of the building blocks.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
