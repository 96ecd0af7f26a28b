//! Errors of the policy core: a configuration, or a state restored from disk, that
//! breaks a policy's invariants. Policies never do I/O, so no error carries a path;
//! each carries the offending field and value instead.

use thiserror::Error;

/// Why a policy refused its input.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    /// A configuration field is out of range (e.g. a zero top of memory, a low
    /// threshold above the high one, an empty sliding window).
    #[error("invalid policy configuration: {field} = {value}: {reason}")]
    InvalidConfig {
        /// The field, named as in the configuration struct (e.g. `low_bytes`).
        field: &'static str,
        /// The value that was refused, as text.
        value: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// M3 thresholds (restored from a saved state, or handed in by the caller)
    /// that break `low_bytes <= high_bytes <= top_bytes` with `top_bytes > 0`.
    #[error(
        "invalid M3 thresholds: low_bytes={low_bytes} high_bytes={high_bytes} \
         top_bytes={top_bytes} (need low <= high <= top and top > 0)"
    )]
    InvalidThresholds {
        /// The refused low threshold, bytes.
        low_bytes: u64,
        /// The refused high threshold, bytes.
        high_bytes: u64,
        /// The refused top of memory, bytes.
        top_bytes: u64,
    },
    /// A process the policy does not manage (MaxMem: never registered, or exited).
    #[error("process {pid} is not managed by this policy")]
    UnknownProcess {
        /// The process id.
        pid: crate::types::Pid,
    },
    /// A process registered twice (MaxMem).
    #[error("process {pid} is already managed by this policy")]
    AlreadyManaged {
        /// The process id.
        pid: crate::types::Pid,
    },
    /// A page of a managed process that the policy does not know (MaxMem).
    #[error("page {page} of process {pid} is not managed by this policy")]
    UnknownPage {
        /// The process id.
        pid: crate::types::Pid,
        /// The page, in the caller's page units.
        page: u64,
    },
}
