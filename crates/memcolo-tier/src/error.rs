//! The error type of the slow tier.
//!
//! Every variant names what failed: the page ([`PageKey`]) for data errors, the
//! server's address for network errors. A page is never answered with zeros or stale
//! bytes: a load either fills the caller's buffer with the bytes that were stored,
//! checksum verified, or returns one of these errors.

use crate::PageKey;
use std::io;

/// Everything that can go wrong storing or loading a page in the slow tier.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// The page was never stored, or was removed.
    #[error("{key}: not in the slow tier")]
    NotFound {
        /// The page.
        key: PageKey,
    },
    /// The page's bytes do not match the CRC-32 checksum taken when it was stored:
    /// it was corrupted at rest or in transit and must not be used.
    #[error("{key}: checksum mismatch (stored {expected:#010x}, read {actual:#010x}): the page is corrupt")]
    Corrupt {
        /// The page.
        key: PageKey,
        /// Checksum taken when the page was stored.
        expected: u32,
        /// Checksum of the bytes read back.
        actual: u32,
    },
    /// A page of the wrong length was handed to the tier (its pages are all
    /// `expected` bytes).
    #[error("{key}: page of {got} bytes, the tier stores pages of {expected} bytes")]
    WrongSize {
        /// The page.
        key: PageKey,
        /// The tier's page size, bytes.
        expected: usize,
        /// The length given, bytes.
        got: usize,
    },
    /// The tier has no room for the page; nothing was stored.
    #[error("slow tier full: {used_bytes} of {capacity_bytes} bytes used")]
    Full {
        /// The tier's capacity, bytes.
        capacity_bytes: u64,
        /// Bytes in use when the store was refused.
        used_bytes: u64,
    },
    /// The memory server could not be reached, or kept failing, within the retry
    /// bound: the request was given up.
    #[error(
        "memory server {addr} unreachable: gave up after {attempts} attempts over {elapsed_ms} ms: {source}"
    )]
    Unreachable {
        /// The server's address.
        addr: String,
        /// Attempts made.
        attempts: u32,
        /// Time spent from the first attempt to giving up, ms.
        elapsed_ms: u64,
        /// The last failure.
        #[source]
        source: io::Error,
    },
    /// The memory server answered something that does not follow the protocol
    /// (wrong magic, version, request id or page size).
    #[error("memory server {addr}: protocol error: {reason}")]
    Protocol {
        /// The server's address.
        addr: String,
        /// What was wrong.
        reason: String,
    },
    /// The memory server and this client did not authenticate each other (a
    /// different secret, one side without authentication, a peer that is not a
    /// memory server of this protocol); retrying cannot help.
    #[error("memory server {addr}: authentication failed: {reason}")]
    Auth {
        /// The server's address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The memory server refused a request for a reason of its own.
    #[error("memory server {addr}: {message}")]
    Server {
        /// The server's address.
        addr: String,
        /// The server's message.
        message: String,
    },
}

impl TierError {
    /// Whether the error says something about one page only (missing, corrupt, of
    /// the wrong size) rather than about the tier as a whole.
    pub fn is_page_error(&self) -> bool {
        matches!(
            self,
            TierError::NotFound { .. } | TierError::Corrupt { .. } | TierError::WrongSize { .. }
        )
    }
}
