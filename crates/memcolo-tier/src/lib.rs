//! memcolo's far-memory tier: the slow tier of MaxMem-style tiered memory (MaxMem
//! §3.3) built on machines without CXL or PMEM, where local DRAM is the fast tier and
//! pages that leave it are kept elsewhere.
//!
//! Every slow-tier backend implements [`SlowTier`]:
//! - [`compressed::CompressedStore`]: pages compressed with LZ4 in this process's
//!   memory (like zram, but per managed region and with checksums);
//! - [`remote::RemoteTier`]: pages kept by a memory server over TCP
//!   ([`memserver::MemServer`], `memcolo memserver`), which can run on another
//!   machine: real disaggregated memory.
//!
//! Guarantees shared by every backend:
//! - **confirmed stores**: [`SlowTier::store`] returns `Ok` only once the backend holds
//!   the page (inserted in the store; acknowledged by the server after it verified the
//!   checksum). The caller may drop its local copy only then.
//! - **checksummed pages**: every page carries a CRC-32 taken by the writer and
//!   verified on every load; a mismatch is [`TierError::Corrupt`], never data.
//! - **no silent zeros**: a load that cannot return the stored bytes returns an error
//!   ([`TierError`]); a remote backend retries within a documented bound first.
//!
//! The tier manager ([`manager::TierManager`]) moves the pages of a managed region
//! between local memory and a slow tier through userfaultfd ([`uffd`]): it resolves
//! missing faults from the slow tier, evicts cold pages in batches under write
//! protection, and samples resident pages to estimate fast-tier accesses without PEBS
//! ([`sampler`]). The MaxMem policy ([`memcolo_policy::maxmem`]) decides which pages
//! go where ([`placement`]).
//!
//! Modules:
//! - [`error`]: the error type, [`TierError`].
//! - [`compressed`]: the compressed in-memory store.
//! - [`remote`]: the memory-server client.
//! - [`memserver`]: the memory server.
//! - [`wire`]: the memory server's wire protocol (documentation of the frames).
//! - [`channel`]: the memory server's handshake (mutual authentication with a
//!   shared secret) and sealed records.
//! - [`uffd`]: userfaultfd(2) ioctls.
//! - [`region`]: managed regions and how a manager reads and drops their pages.
//! - [`page_state`]: the states of a managed page and their transition table.
//! - [`manager`]: the tier manager of one region.
//! - [`sampler`]: the fast-tier access estimator.
//! - [`shadow`]: what a region keeps outside the agent so that a new agent can take it
//!   over after a crash.
//! - [`placement`]: the MaxMem policy as a manager's placement.
//! - [`node`]: regions of several processes sharing one fast tier; the epoch loop.
//! - [`numa`]: the NUMA backend (CPU-less memory nodes, `move_pages`), tested with fakes.

pub mod channel;
pub mod compressed;
pub mod error;
pub mod manager;
pub mod memserver;
pub mod node;
pub mod numa;
pub mod page_state;
pub mod placement;
pub mod region;
pub mod remote;
pub mod sampler;
pub mod shadow;
pub mod uffd;
pub mod wire;

pub use error::TierError;

use std::fmt;

/// A page in the slow tier: the managed region it belongs to (an id chosen by the
/// tier manager, unique among the regions sharing a backend) and its index in the
/// region (offset / page size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageKey {
    /// Region id.
    pub region: u64,
    /// Page index within the region.
    pub page: u64,
}

impl PageKey {
    /// The key of page `page` of region `region`.
    pub fn new(region: u64, page: u64) -> Self {
        PageKey { region, page }
    }
}

impl fmt::Display for PageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "region {} page {}", self.region, self.page)
    }
}

/// Counters of a slow tier since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Pages held now.
    pub pages: u64,
    /// Bytes the held pages occupy in the backend (compressed size plus per-page
    /// overhead for the compressed store), bytes.
    pub stored_bytes: u64,
    /// Pages stored (confirmed).
    pub stores: u64,
    /// Pages loaded (checksum verified).
    pub loads: u64,
    /// Loads refused because the checksum did not match.
    pub corrupt: u64,
    /// Requests retried after a network failure (remote backends).
    pub retries: u64,
}

/// A slow tier: somewhere pages of a fixed size go when they leave local memory.
///
/// Implementations are shared between a fault thread and eviction workers, hence
/// `Send + Sync` and `&self` methods.
pub trait SlowTier: Send + Sync {
    /// A short name for logs and metrics labels (`compressed`, `remote`).
    fn name(&self) -> &'static str;

    /// The size of every page of this tier, bytes.
    fn page_bytes(&self) -> usize;

    /// Stores `data` (exactly [`SlowTier::page_bytes`] long) under `key`, replacing
    /// any previous version. Returns once the tier holds the page; on error nothing
    /// may be assumed stored.
    ///
    /// # Errors
    /// [`TierError::WrongSize`], [`TierError::Full`], and for remote backends
    /// [`TierError::Unreachable`], [`TierError::Protocol`], [`TierError::Server`].
    fn store(&self, key: PageKey, data: &[u8]) -> Result<(), TierError>;

    /// Stores several pages; `Ok` means all of them are held. On error, none may be
    /// assumed stored. Remote backends send the batch in one round trip.
    ///
    /// # Errors
    /// As [`SlowTier::store`].
    fn store_batch(&self, pages: &[(PageKey, &[u8])]) -> Result<(), TierError> {
        for (key, data) in pages {
            self.store(*key, data)?;
        }
        Ok(())
    }

    /// Loads the page stored under `key` into `out` (exactly
    /// [`SlowTier::page_bytes`] long), verifying its checksum. The page stays stored.
    ///
    /// # Errors
    /// [`TierError::NotFound`], [`TierError::Corrupt`], [`TierError::WrongSize`],
    /// and for remote backends the network errors of [`SlowTier::store`]. `out` is
    /// unspecified after an error and must not be used.
    fn load(&self, key: PageKey, out: &mut [u8]) -> Result<(), TierError>;

    /// Drops the page stored under `key`; returns whether there was one.
    ///
    /// # Errors
    /// Network errors of remote backends.
    fn remove(&self, key: PageKey) -> Result<bool, TierError>;

    /// Drops every page of `region`; returns how many there were.
    ///
    /// # Errors
    /// Network errors of remote backends.
    fn remove_region(&self, region: u64) -> Result<u64, TierError>;

    /// The indices of the pages stored for `region`, ascending, each once; empty if
    /// the tier holds nothing of `region`. This is how a restarted tier manager finds
    /// the pages its predecessor left in a [durable](SlowTier::durable) tier. Pages
    /// stored or removed while the listing runs may or may not be in it; every other
    /// page is.
    ///
    /// Cost: the compressed store scans every shard under its lock, one shard at a
    /// time (O(pages held) for any region); the remote tier sends one request per
    /// [`wire::LIST_MAX_PAGES`] indices (one for regions up to 2 GiB of 4 KiB pages),
    /// each retried within [`remote::RemoteConfig::retry_bound`].
    ///
    /// # Errors
    /// For remote backends the network errors of [`SlowTier::store`], and
    /// [`TierError::Protocol`] if the server's listing is not ascending or longer
    /// than asked.
    fn list_region(&self, region: u64) -> Result<Vec<u64>, TierError>;

    /// Whether the pages stored survive the death of the process holding this
    /// `SlowTier` (a crash of the agent), so that a process started after it can find
    /// them with [`SlowTier::list_region`] and load them. `false` for the compressed
    /// store (its pages live in this process's memory), `true` for the remote tier
    /// (they live in the memory server's process, which keeps a region's pages when
    /// the connections that stored them close; see [`memserver`]). Not durable
    /// against the death of the memory server itself.
    ///
    /// Default: `false`.
    fn durable(&self) -> bool {
        false
    }

    /// Which incarnation of a [durable](SlowTier::durable) tier holds the pages: a
    /// memory server draws a random id when it starts and answers it at every
    /// connection. A manager recovering a region compares it with the id the region
    /// was registered under, so that a restarted, empty server is not taken for one
    /// that lost nothing (its missing pages would read as zeros). 0 for tiers that
    /// are not durable, and before a remote tier first connected.
    fn instance(&self) -> u64 {
        0
    }

    /// Counters since creation.
    fn stats(&self) -> TierStats;
}

/// The checksum every page carries: CRC-32 (IEEE, hardware accelerated where the CPU
/// has it) of the page's bytes.
pub fn checksum(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}
