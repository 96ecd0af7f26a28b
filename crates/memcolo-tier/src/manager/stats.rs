//! What a tier manager counts: [`ManagerStats`], read by
//! [`TierManager::stats`] from the counters the threads bump ([`Counters`]), the
//! page table's gauges and the threads' schedstat.

#[cfg(doc)]
use super::TierConfig;
use super::{lock, TierManager};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of a tier manager since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagerStats {
    /// Pages mapped now (sampled pages included).
    pub resident_pages: u64,
    /// Pages in the slow tier now.
    pub stored_pages: u64,
    /// Missing faults on untouched pages (zero fill).
    pub zero_faults: u64,
    /// Missing faults on stored pages (slow-tier accesses).
    pub slow_faults: u64,
    /// Missing faults on sampled pages (sample hits).
    pub sample_hits: u64,
    /// Write-protect faults.
    pub wp_faults: u64,
    /// Missing faults on pages already mapped or being loaded.
    pub spurious_faults: u64,
    /// Pages evicted (stored, then dropped).
    pub evictions: u64,
    /// Eviction batches run.
    pub evict_batches: u64,
    /// Pages whose eviction failed (still resident).
    pub evict_failures: u64,
    /// Pages brought in ahead of a fault.
    pub prefetches: u64,
    /// Sampling windows completed.
    pub sample_windows: u64,
    /// Pages lost (the process must be stopped).
    pub lost_pages: u64,
    /// Pages the application freed (`MADV_DONTNEED`).
    pub freed_pages: u64,
    /// Pages that already held data when management began (a region handed over
    /// again, e.g. to an agent that restarted), taken as resident and placed as if
    /// each had just faulted in.
    pub adopted_pages: u64,
    /// Pages found in the slow tier when the region was recovered after its agent
    /// died ([`TierManager::recover`]).
    pub recovered_stored_pages: u64,
    /// Pages on probation now (unmapped next victims kept in local memory; counted
    /// in `resident_pages`).
    pub probation_pages: u64,
    /// Pages put on probation.
    pub probation_entries: u64,
    /// Missing faults on pages on probation (probation hits: fast accesses).
    pub probation_hits: u64,
    /// Pages evicted from their copies: on probation (untouched until evicted), or
    /// sampled when named as victims (counted in `evictions`).
    pub probation_evictions: u64,
    /// Slow faults that were refaults at a short distance and so counted as hotness
    /// samples for sure ([`TierConfig::refault_samples`]).
    pub refault_samples: u64,
    /// Time the fault thread spent serving slow faults (load, check, map), ns.
    pub slow_fault_ns: u64,
    /// Time the fault thread spent reporting faults to the placement (taking its lock
    /// and the policy's answer), ns: a fault path that waits for a lock shows here.
    pub placement_ns: u64,
    /// The longest single report to the placement, ns.
    pub placement_max_ns: u64,
    /// Of `slow_fault_ns`: loading the page from the slow tier and checking its
    /// CRC-32 (for the compressed store: the shard lookup and LZ4 decompression), ns.
    pub slow_load_ns: u64,
    /// Of `slow_fault_ns`: mapping the page (`UFFDIO_COPY`, which wakes the faulting
    /// thread), ns.
    pub slow_map_ns: u64,
    /// Of `slow_fault_ns`: dropping the slow tier's copy of the page, ns.
    pub slow_drop_ns: u64,
    /// Time the fault thread waited for a CPU while runnable (its `schedstat`
    /// run delay), ns: what a fault waits before the thread even reads it.
    pub fault_thread_wait_ns: u64,
    /// CPU time of the fault thread (its `schedstat` run time), ns: with
    /// `slow_fault_ns` (wall time) it tells a fault's work from its preemption.
    pub fault_thread_cpu_ns: u64,
    /// CPU time of the eviction workers together (`schedstat` run time), ns.
    pub evict_threads_cpu_ns: u64,
    /// Time the eviction workers waited for a CPU while runnable, ns.
    pub evict_threads_wait_ns: u64,
    /// Whether the fault thread runs as latency-critical
    /// ([`TierManager::set_latency_critical`]).
    pub latency_critical: bool,
}

/// The counters the manager's threads bump, lock-free.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) zero_faults: AtomicU64,
    pub(super) slow_faults: AtomicU64,
    pub(super) sample_hits: AtomicU64,
    pub(super) wp_faults: AtomicU64,
    pub(super) spurious: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) evict_batches: AtomicU64,
    pub(super) evict_failures: AtomicU64,
    pub(super) prefetches: AtomicU64,
    pub(super) sample_windows: AtomicU64,
    pub(super) lost: AtomicU64,
    pub(super) freed: AtomicU64,
    pub(super) adopted: AtomicU64,
    pub(super) recovered_stored: AtomicU64,
    pub(super) probation_entries: AtomicU64,
    pub(super) probation_hits: AtomicU64,
    pub(super) probation_evictions: AtomicU64,
    pub(super) refault_samples: AtomicU64,
    pub(super) slow_fault_ns: AtomicU64,
    pub(super) slow_load_ns: AtomicU64,
    pub(super) slow_map_ns: AtomicU64,
    pub(super) slow_drop_ns: AtomicU64,
    pub(super) placement_ns: AtomicU64,
    pub(super) placement_max_ns: AtomicU64,
}

impl TierManager {
    /// Counters since start.
    pub fn stats(&self) -> ManagerStats {
        // (Read before the table lock: each is a file read.)
        let fault_sched = self.inner.fault_thread_schedstat();
        let evict_sched = self.inner.evict_threads_schedstat();
        let t = lock(&self.inner.table);
        let n = &self.inner.n;
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ManagerStats {
            resident_pages: t.resident,
            stored_pages: t.stored,
            zero_faults: g(&n.zero_faults),
            slow_faults: n.slow_faults.load(Ordering::Acquire),
            sample_hits: g(&n.sample_hits),
            wp_faults: g(&n.wp_faults),
            spurious_faults: g(&n.spurious),
            evictions: g(&n.evictions),
            evict_batches: g(&n.evict_batches),
            evict_failures: g(&n.evict_failures),
            prefetches: g(&n.prefetches),
            sample_windows: g(&n.sample_windows),
            lost_pages: g(&n.lost),
            freed_pages: g(&n.freed),
            adopted_pages: g(&n.adopted),
            recovered_stored_pages: g(&n.recovered_stored),
            probation_pages: t.probation,
            probation_entries: g(&n.probation_entries),
            probation_hits: g(&n.probation_hits),
            probation_evictions: g(&n.probation_evictions),
            refault_samples: g(&n.refault_samples),
            slow_fault_ns: g(&n.slow_fault_ns),
            slow_load_ns: g(&n.slow_load_ns),
            slow_map_ns: g(&n.slow_map_ns),
            slow_drop_ns: g(&n.slow_drop_ns),
            placement_ns: g(&n.placement_ns),
            placement_max_ns: g(&n.placement_max_ns),
            fault_thread_wait_ns: fault_sched.1,
            fault_thread_cpu_ns: fault_sched.0,
            evict_threads_cpu_ns: evict_sched.0,
            evict_threads_wait_ns: evict_sched.1,
            latency_critical: self.inner.latency_critical.load(Ordering::Relaxed),
        }
    }
}
