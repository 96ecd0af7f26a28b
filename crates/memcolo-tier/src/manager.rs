//! The tier manager of one managed region (MaxMem §3.3, on far memory): a fault
//! thread that fills pages, eviction workers that move cold pages to the slow tier
//! in batches, and the access sampler of [`crate::sampler`].
//!
//! # Page states
//!
//! | state | mapped | content |
//! |---|---|---|
//! | untouched | no | never written: zeros |
//! | resident | yes | the page |
//! | evicting | yes, write-protected | being stored |
//! | dropping | being dropped, write-protected | stored, confirmed |
//! | stored | no | the slow tier (with a CRC-32 kept here too) |
//! | loading | no | the slow tier, being brought in |
//! | sample-drop | yes, write-protected | being copied aside for sampling |
//! | sample-dropping | being dropped, write-protected | copied aside |
//! | sampled | no | a copy here (the sampler's stash) |
//! | probe-drop | yes, write-protected | being copied aside for probation |
//! | probe-dropping | being dropped, write-protected | copied aside |
//! | probation | no | a copy here (a next victim under test) |
//! | expiring | no | being stored from its probation copy |
//! | freeing | no | freed by the application mid-move: faults wait for the mover |
//! | lost | no | gone: the slow tier failed; the process must be stopped |
//!
//! # Faults (the fault thread)
//!
//! A missing fault on an untouched page maps zero pages (`UFFDIO_ZEROPAGE`, with
//! [`TierConfig::zero_fill_ahead`] untouched pages after it in one call); on a stored
//! page it loads the page from the slow tier, checks the CRC-32 kept when it was
//! stored, and maps it (`UFFDIO_COPY`), counting one slow access; on a sampled page it
//! maps the stashed copy and counts a sample hit. The slow-tier copy of a page
//! brought back is dropped before the page can be evicted again. A load that fails (the memory server
//! stayed unreachable past its retry bound, the page is corrupt or missing) marks the
//! page lost and the manager fatal ([`TierManager::fatal`]): the faulting thread is
//! never woken, so it never sees zeros or stale bytes, and the owner must stop the
//! process with the reason given. A missing fault on a page believed mapped (the
//! application dropped it itself) maps a zero page, as the kernel would. A missing
//! fault on a page being dropped is left waiting, like a write-protect fault on a
//! page being evicted or sampled: the worker wakes it when it unprotects, after the
//! drop, and the retry finds the page stored (MaxMem §3.3). Any other write-protect
//! fault is a stale protection and is lifted at once. (A page is marked stored only
//! once it is really gone from memory: a stale fault message for a page still mapped
//! must never be served from the slow tier and the copy dropped.) While a remove
//! event is unread the kernel refuses map and protect ioctls with `EAGAIN`; the fault
//! thread then wakes the faulting thread, which retries once the event is handled,
//! and the workers retry briefly.
//!
//! # Eviction (the workers)
//!
//! Victims are queued ([`TierManager::evict`], and by the [`Placement`] on every
//! fault that has no room), so faults never wait for eviction. A worker takes up to
//! [`TierConfig::evict_batch`] queued pages (waiting up to [`TierConfig::evict_linger`]
//! for a short batch to fill) and, for contiguous runs of them:
//! write-protects → copies the pages out → stores them in the slow tier in one batch
//! and waits for the confirmation → marks them stored → drops them from memory
//! (every run in one `process_madvise` on anonymous memory of this process: one TLB
//! shootdown per batch instead of one per run) → unprotects and wakes any writer
//! that faulted meanwhile (it retries and faults the page back in; where the drop
//! cleared the protection with the page, as on anonymous memory, only the wake is
//! needed, which saves a TLB shootdown). A page leaves local memory only after the
//! slow tier confirmed it; a failed store unprotects the pages and leaves them
//! resident, and so does a failed drop for the runs it did not reach.
//!
//! # Probation: a second chance for the next victims
//!
//! Without PEBS a resident page is seen used only when the sampler picks it (a few
//! pages per window, [`crate::sampler`]), so the placement's demand victims (MaxMem's
//! coldest fast pages, first in first out within a bin) are chosen close to first in,
//! first out: hot pages keep being evicted and faulted back (a KV store at 36 MiB of
//! fast memory faulted on 14 % of its requests, against 7.2 % with its hot set in
//! fast memory; `bench/tiering/RESULTS.md`, section earlier/kv). Probation tests the victims
//! before they go. Once the region has had to evict, each eviction worker, after
//! each batch, keeps up to [`TierConfig::probation_pages`] of the placement's next
//! victims ([`Placement::next_victims`]) unmapped, their contents copied here by the
//! sampler's protect–copy–drop: they stay in local memory, and the policy still
//! counts them as fast. A touch is a missing fault served from the copy (a
//! *probation hit*): it counts as a fast access and as a hotness sample of the page
//! (which leaves the coldest bin at the next epoch), and the page gets a second
//! chance at once ([`Placement::second_chance`]: the policy moves it behind every
//! other page of its bin). A victim still untouched when the policy evicts it is
//! stored from its copy, with no further protect or drop; a fault on it meanwhile
//! waits for the store and then faults it in. Only pages about to be evicted are
//! tested, so the faults this costs hot pages are bounded by the eviction rate, and
//! a region that fits its fast memory never evicts and has none on probation. A page
//! stays on probation for about `probation_pages` / evictions per second. Pages on
//! probation are outside the sampler's frame (its `R`): their touches are counted
//! exactly, as hits.
//!
//! # Refaults: hot pages found by their eviction
//!
//! The sampler sees at most [`TierConfig::sample_pages`] resident pages a window,
//! about 1,300 a second, so a process that has just been given fast memory (on
//! arrival, or after its target was lowered) fills it on demand with hot and cold
//! pages alike, and its hot pages reach a bin above the coldest only as the sampler
//! happens on them: the KV store of `bench/tiering`, given ~10,000 pages, took 5–8
//! epochs for its measured miss ratio to settle after its allotment stopped
//! growing, evicting hot pages first in first out all the while. An evicted page
//! that faults back soon says more: with [`TierConfig::refault_samples`] every
//! page stored is stamped with the region's running count of evictions, and a slow
//! fault on a page evicted fewer evictions ago than the region has resident pages
//! (its *refault distance*: it would still be resident in twice the fast memory;
//! Linux's `mm/workingset.c` activates a refaulting page by the same test) counts
//! as a hotness sample for sure, not at the sampler's `k/R`. A hot page then leaves
//! the coldest bin at its first refault, and demand victims come from the pages
//! touched once. A page that is cold (touched less often than the region's
//! evictions cycle through its resident pages) refaults at a long distance and is
//! sampled at `k/R` as before. The exact count of slow accesses (`a_slow`) is
//! unchanged: only the per-page hotness samples (MaxMem §3.2's bins) differ.
//!
//! Measured (`bench/tiering/RESULTS.md`, section earlier/kv-refault-dev, 2 paired runs at the KV
//! bench's 4 MiB cap): the store met its target on arrival in 14 and 14 epochs
//! against 16 and 18, and held 31.5–31.9 MiB against 34.7–37.0, but served 12 %
//! fewer requests (0.081–0.089 slow faults per request against 0.072–0.074): its
//! placement settles sooner, so at the same t_miss MaxMem stops giving it memory
//! sooner. Off by default, so the trade is the operator's.
//!
//! # Application frees
//!
//! With [`TierConfig::track_remove`] (needs the `EVENT_REMOVE` feature on the
//! userfaultfd), an `madvise(MADV_DONTNEED)` by the application makes the pages
//! untouched again (they read as zeros, as the kernel promises) and drops their
//! slow-tier copies; the manager's own drops are told apart.
//!
//! # Shutdown
//!
//! [`TierManager::stop`] brings every stored and sampled page back and unregisters
//! the region. If a page cannot be brought back, the userfaultfd is left open and
//! registered, so the process blocks on that page instead of reading zeros.

use crate::region::{runs, RegionMemory, PAGE};
use crate::sampler::{choose, choose_by_rejection, Rng, WindowEstimate};
use crate::shadow::Shadow;
use crate::uffd::{Event, Uffd};
use crate::{checksum, PageKey, SlowTier, TierError};
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::tiering::{self, SampleHistory};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where the policy places pages; the manager asks it on every fault.
pub trait Placement: Send {
    /// Region page `page` was just mapped by a fault. Returns a region page to evict
    /// in exchange, if the process has no fast memory left for it.
    fn fault_in(&mut self, page: usize) -> Option<usize>;
    /// An eviction asked for `page` did not happen; it is still resident.
    fn evict_failed(&mut self, page: usize);
    /// The application freed `page`.
    fn freed(&mut self, page: usize);
    /// Up to `n` region pages that would be chosen as victims next (the policy's
    /// coldest fast pages), coldest first, for the manager to put on probation
    /// before they are evicted ([`TierConfig::probation_pages`]). The default names
    /// none, so a placement that does not know turns probation off.
    fn next_victims(&mut self, _n: usize) -> Vec<usize> {
        Vec::new()
    }
    /// `page` was touched while on probation: a second chance (the policy moves it
    /// behind every other page of its bin). The default does nothing.
    fn second_chance(&mut self, _page: usize) {}
    /// `page` was found in the slow tier when the region was recovered after its
    /// manager died ([`TierManager::recover`]): the policy counts it as slow. The
    /// default does nothing.
    fn found_slow(&mut self, _page: usize) {}
}

/// A placement that never asks for evictions (the owner evicts explicitly).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPlacement;

impl Placement for NoPlacement {
    fn fault_in(&mut self, _page: usize) -> Option<usize> {
        None
    }
    fn evict_failed(&mut self, _page: usize) {}
    fn freed(&mut self, _page: usize) {}
}

/// Settings of one tier manager.
#[derive(Clone, Debug, PartialEq)]
pub struct TierConfig {
    /// The region's id in the slow tier ([`PageKey::region`]); unique per backend.
    pub region_id: u64,
    /// Pages per eviction batch (64).
    pub evict_batch: usize,
    /// How long a worker holding fewer than [`TierConfig::evict_batch`] queued pages
    /// waits for more before it starts (500 µs; zero: start at once). Faults never
    /// wait for it: a victim stays resident a little longer.
    pub evict_linger: std::time::Duration,
    /// Eviction worker threads (1).
    pub evict_workers: usize,
    /// Untouched pages zero-filled per missing fault, the faulting one included (1).
    pub zero_fill_ahead: usize,
    /// Most resident pages sampled per window (64).
    pub sample_pages: usize,
    /// The most sample hits aimed at per window (16; 0: always sample
    /// `sample_pages`, whatever [`TierConfig::sample_fmmr_error`] says). Each hit
    /// costs the touching thread a fault (a wait of 40–70 µs on this VM), and the
    /// estimate's error depends on the hits, not on the pages sampled: the manager
    /// samples at most `clamp(⌈target / p̂⌉, 1, sample_pages)` pages, `p̂` being the
    /// share of sampled pages hit in past windows (moving sums, weight 3/4 per
    /// window). Choices use past windows only, so each window's estimate stays
    /// unbiased.
    pub sample_target_hits: usize,
    /// The standard error of an epoch's measured FMMR that the sample is sized for
    /// (0.01; 0: always aim at [`TierConfig::sample_target_hits`], with at least 8
    /// pages). Within that cap, a window samples the pages that
    /// [`crate::sampler::pages_for_fmmr_error`] asks for, from the region's recent
    /// FMMR and hit share and the windows of the last epoch, and at least one: a
    /// region whose accesses all hit fast memory needs no precision (its a_miss is 0
    /// whatever a_fast is), one with slow accesses gets enough pages for about 20
    /// hits per epoch at least, more as its FMMR nears 1/2.
    pub sample_fmmr_error: f64,
    /// Re-arm sampled pages within a window (true), so that a page touched in
    /// several of the window's slots counts once per slot: the estimate of fast
    /// accesses then counts touches per slot ([`TierManager::sample_rearm`], called
    /// by the node at each slot boundary) instead of distinct pages per window. Only
    /// while the region has slow accesses: with none its FMMR is 0 whatever the
    /// fast count is, and re-arming would cost faults for nothing. See
    /// `crate::sampler`, "Accesses, not pages".
    pub sample_rearm: bool,
    /// Seed of the sampler's random choices.
    pub seed: u64,
    /// Drop the sampled pages (true). False is a diagnostic: the chosen pages are
    /// write-protected and unprotected one by one and left mapped, which costs the
    /// TLB shootdowns of sampling without its faults; the windows estimate nothing.
    pub sample_drop: bool,
    /// Handle `UFFD_EVENT_REMOVE` (the userfaultfd must have the feature).
    pub track_remove: bool,
    /// Most pages on probation (128; 0: none), and never more than an eighth of the
    /// resident pages. Once the region has had to evict, the placement's next
    /// victims ([`Placement::next_victims`]) are unmapped ahead of time with their
    /// contents kept in local memory: a touch meanwhile is a fault served from that
    /// copy (a *probation hit*, no slow-tier access) that gives the page a second
    /// chance ([`Placement::second_chance`]) and a hotness sample, and a victim still
    /// untouched when it is evicted goes to the slow tier from the copy, without
    /// another protect or drop. Only pages that are about to be evicted are tested,
    /// so the faults this costs are bounded by the eviction rate; a region that fits
    /// its fast memory never evicts and has none. See the module documentation.
    pub probation_pages: usize,
    /// Count a slow fault as a hotness sample for sure when it is a *refault* at a
    /// short distance (true): the page was evicted fewer evictions ago than the
    /// region has resident pages, so it would still be resident had the region's
    /// fast memory been twice as large (the refault distance of Linux's
    /// `mm/workingset.c`, which Hermit also steers by). Other slow faults enter the
    /// samples with the sampler's `k/R` as before. See the module documentation,
    /// "Refaults: hot pages found by their eviction". False (the default): every
    /// slow fault is sampled at `k/R`.
    pub refault_samples: bool,
}

impl TierConfig {
    /// Defaults for region `region_id`.
    pub fn new(region_id: u64) -> Self {
        TierConfig {
            region_id,
            evict_batch: 64,
            evict_linger: std::time::Duration::from_micros(500),
            evict_workers: 1,
            zero_fill_ahead: 1,
            sample_pages: 64,
            sample_target_hits: 16,
            sample_fmmr_error: 0.01,
            sample_rearm: true,
            seed: 0x5EED ^ region_id,
            sample_drop: true,
            track_remove: false,
            probation_pages: 128,
            refault_samples: false,
        }
    }
}

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

/// Accesses of one policy epoch, region pages numbered from 0.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EpochAccesses {
    /// Estimated fast-tier page touches (sum of the windows' `Ĥ`).
    pub fast: f64,
    /// Slow-tier page touches (faults on stored pages), exact.
    pub slow: u64,
    /// Samples per page: sample hits, and slow faults kept with the probability a
    /// resident page had of being sampled in the window (k/R; 1 before the first
    /// window), so a page's count estimates the same thing in either tier.
    pub pages: Vec<(usize, u32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Untouched,
    Resident,
    Evicting,
    Dropping,
    Stored,
    Loading,
    SampleDrop,
    SampleDropping,
    Sampled,
    ProbeDrop,
    ProbeDropping,
    Probation,
    Expiring,
    /// Freed by the application while a worker was moving it (storing, stashing,
    /// dropping, prefetching): faults on it wait until that worker has dropped
    /// whatever copy it made ([`Inner::finish_freed`]); only then is it untouched.
    Freeing,
    Lost,
}

/// The recent past of a region's sampling, for sizing the next window's sample:
/// moving sums (weight 3/4 per window) of the pages sampled, their hits, the slow
/// faults and the estimated fast touches per window; and the windows per epoch.
#[derive(Default)]
struct Sizing {
    sampled: f64,
    hits: f64,
    slow: f64,
    fast: f64,
    /// Windows closed since the last epoch was taken.
    windows: u32,
    /// Windows of the last epoch (0 before the first).
    windows_per_epoch: u32,
}

struct Window {
    sampled: Vec<usize>,
    resident: u64,
    /// Touches of sampled pages seen (one per page per slot when re-armed).
    hits: u64,
    /// Distinct sampled pages touched.
    touched: HashSet<usize>,
    /// Hit pages are re-armed at slot boundaries.
    rearm: bool,
    /// Pages re-armed so far in this window.
    rearmed: u64,
}

struct Table {
    st: Vec<St>,
    /// The CRC-32 of each stored page, taken when it was stored; `None` for a page
    /// recovered from the slow tier after an agent died (its backend's checksum
    /// still guards it).
    crc: Vec<Option<u32>>,
    /// Pages held in local memory (mapped, sampled, or on probation).
    resident: u64,
    stored: u64,
    /// Pages on probation (`ProbeDrop`, `ProbeDropping`, `Probation`, `Expiring`):
    /// held in local memory but out of the sampler's reach.
    probation: u64,
    /// Pages whose missing fault waits for their store from probation to finish.
    expiring_waiters: Vec<usize>,
    stash: HashMap<usize, Box<[u8]>>,
    window: Option<Window>,
    /// Per page, the region's eviction count (`evict_seq`) when the page was last
    /// stored; 0: never evicted. Wraps, as `evict_seq` does (skipping 0).
    evicted_at: Vec<u32>,
    /// Pages evicted so far, wrapping, never 0.
    evict_seq: u32,
}

impl Table {
    /// Records that page `p` was just stored (evicted).
    fn stamp_eviction(&mut self, p: usize) {
        self.evict_seq = self.evict_seq.wrapping_add(1).max(1);
        self.evicted_at[p] = self.evict_seq;
    }

    /// Whether page `p`, faulting in from the slow tier now, is a refault at a
    /// short distance: fewer pages were evicted since `p` was than the region now
    /// holds resident, so `p` would still be resident in twice the fast memory.
    fn short_refault(&self, p: usize) -> bool {
        tiering::is_short_refault(self.evicted_at[p], self.evict_seq, self.resident)
    }
}

#[derive(Default)]
struct Epoch {
    fast: f64,
    slow: u64,
    pages: BTreeMap<usize, u32>,
}

#[derive(Default)]
struct Counters {
    zero_faults: AtomicU64,
    slow_faults: AtomicU64,
    sample_hits: AtomicU64,
    wp_faults: AtomicU64,
    spurious: AtomicU64,
    evictions: AtomicU64,
    evict_batches: AtomicU64,
    evict_failures: AtomicU64,
    prefetches: AtomicU64,
    sample_windows: AtomicU64,
    lost: AtomicU64,
    freed: AtomicU64,
    adopted: AtomicU64,
    recovered_stored: AtomicU64,
    probation_entries: AtomicU64,
    probation_hits: AtomicU64,
    probation_evictions: AtomicU64,
    refault_samples: AtomicU64,
    slow_fault_ns: AtomicU64,
    slow_load_ns: AtomicU64,
    slow_map_ns: AtomicU64,
    slow_drop_ns: AtomicU64,
    placement_ns: AtomicU64,
    placement_max_ns: AtomicU64,
}

struct Queue {
    pages: VecDeque<usize>,
    in_flight: usize,
    /// Pages ever queued, and ever taken into a batch (tickets count these).
    queued: u64,
    drained: u64,
    /// Ticket of the first page of each batch in flight.
    batch_starts: Vec<u64>,
}

impl Queue {
    /// Every page queued before this ticket has been handled.
    fn done_below(&self) -> u64 {
        self.batch_starts
            .iter()
            .copied()
            .min()
            .unwrap_or(self.drained)
    }
}

struct Inner {
    uffd: Uffd,
    mem: Box<dyn RegionMemory>,
    tier: Arc<dyn SlowTier>,
    cfg: TierConfig,
    base: u64,
    pages: usize,
    table: Mutex<Table>,
    queue: Mutex<Queue>,
    queue_cv: Condvar,
    idle_cv: Condvar,
    placement: Mutex<Box<dyn Placement>>,
    epoch: Mutex<Epoch>,
    rng: Mutex<Rng>,
    own_drops: Mutex<Vec<(u64, u64)>>,
    /// Probability (f64 bits) that a slow fault enters the per-page samples: the
    /// current window's k/R.
    slow_sample_p: AtomicU64,
    /// What past windows tell about the next one's sample size.
    sizing: Mutex<Sizing>,
    /// Slow faults since the current window opened.
    window_slow: AtomicU64,
    stop: AtomicBool,
    /// Stops the fault thread, once the eviction workers have stopped (a drop of
    /// theirs may wait for the fault thread to read its remove event).
    stop_faults: AtomicBool,
    wake_fd: OwnedFd,
    fatal: Mutex<Option<String>>,
    last_error: Mutex<Option<String>>,
    /// Rate limit of the warnings for [`Inner::note_error`].
    error_log: Mutex<ErrorLog>,
    n: Counters,
    /// The fault thread's id (0 until it runs).
    fault_tid: AtomicI32,
    /// The fault thread runs `SCHED_FIFO` (see [`TierManager::set_latency_critical`]).
    latency_critical: AtomicBool,
    /// The eviction workers' thread ids (each adds its own when it starts).
    worker_tids: Mutex<Vec<i32>>,
    /// Nice value of the fault thread (when not latency-critical) and the eviction
    /// workers (see [`TierManager::set_nice`]).
    nice: AtomicI32,
    /// The same threads run `SCHED_IDLE` (see [`TierManager::set_idle`]).
    idle: AtomicBool,
    /// Set by [`TierManager::discard_when_dropped`]: the last reference discards the
    /// region instead of bringing its pages back.
    discard_on_drop: AtomicBool,
    /// The region's shadow, when the process gave one: stash copies written through,
    /// the remove journal (see [`crate::shadow`]).
    shadow: Option<Shadow>,
    /// Pages brought back whose slow-tier copy could not be dropped then: an
    /// application free of such a page drops the copy again, so that no agent taking
    /// the region over can mistake it for the page.
    stale_copies: Mutex<HashSet<usize>>,
    /// Journal ranges (region offsets) whose remove event freed pages still being
    /// moved: each slot is cleared once the last of its pages has no copy left.
    deferred_clears: Mutex<Vec<(u64, u64, HashSet<usize>)>>,
    /// Freed pages whose slow-tier copy could not be dropped (the tier failed): the
    /// shadow is marked tainted until they are, so no recovery takes the copies for
    /// the pages; retried after each eviction batch.
    pending_drops: Mutex<HashSet<usize>>,
}

/// `(run time, run delay)` in ns of thread `tid` of this process, from the first
/// two fields of `/proc/self/task/TID/schedstat` (time on a CPU, and time runnable
/// waiting for one); `(0, 0)` when unknown (`tid` 0, or the file unreadable).
fn thread_schedstat(tid: i32) -> (u64, u64) {
    if tid == 0 {
        return (0, 0);
    }
    match ProcFs::root().read_self_task_schedstat(tid) {
        Ok(s) => (s.run_ns, s.wait_ns),
        Err(_) => (0, 0),
    }
}

/// Puts thread `tid` in `SCHED_IDLE` (`idle`) or `SCHED_OTHER`, at nice value `nice`
/// (`setpriority(PRIO_PROCESS, tid, nice)`; kept but unused under `SCHED_IDLE`).
fn set_thread_sched(tid: i32, nice: i32, idle: bool) -> io::Result<()> {
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a valid sched_param for a thread id; plain syscalls.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: plain syscall on a thread id; no memory is passed.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Rate limit of a region's error warnings: at most one per [`ErrorLog::INTERVAL`],
/// each carrying how many were suppressed since the last. A process that exits under
/// its manager fails every userfaultfd and madvise call with `ESRCH` until its
/// connection closes and the region is discarded: hundreds of identical warnings per
/// region in the `bench/tiering` runs.
#[derive(Debug, Default)]
struct ErrorLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl ErrorLog {
    const INTERVAL: Duration = Duration::from_secs(1);

    /// Notes one error at `now`: `Some(suppressed since the last warning)` when this
    /// one should be logged, `None` when it is suppressed (and counted).
    fn note(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < Self::INTERVAL => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn is_eagain(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EAGAIN)
}

/// Runs a userfaultfd range ioctl from a thread other than the fault thread,
/// retrying while the kernel answers `EAGAIN`: a non-cooperative event (a remove)
/// is pending and the fault thread has not read it yet. Gives up after about 1 s.
fn retry_eagain<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut tries = 0;
    loop {
        match op() {
            Err(e) if is_eagain(&e) && tries < 10_000 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            r => return r,
        }
    }
}

/// Runs of sampled pages handled together: protected one by one, then dropped in one
/// call. Larger groups save TLB shootdowns (one drop per group instead of one per
/// run) but keep a thread that touches one of their pages waiting longer (the
/// group's protections, a few µs each, and its drop).
const SAMPLE_GROUP: usize = 8;

/// What pages copied aside and dropped are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stash {
    /// A sampling window: put back at its end if untouched.
    Sample,
    /// Probation: evicted from the copy if untouched.
    Probation,
}

impl Stash {
    /// The states a page goes through: being copied, being dropped, done.
    fn states(self) -> (St, St, St) {
        match self {
            Stash::Sample => (St::SampleDrop, St::SampleDropping, St::Sampled),
            Stash::Probation => (St::ProbeDrop, St::ProbeDropping, St::Probation),
        }
    }

    fn what(self) -> &'static str {
        match self {
            Stash::Sample => "sampling",
            Stash::Probation => "probation",
        }
    }
}

/// The tier manager of one region; see the module documentation.
pub struct TierManager {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
    stopped: bool,
}

impl TierManager {
    /// Starts managing the region reached through `mem`, registered with `uffd` in
    /// MISSING and WP modes, with `tier` as its slow tier. The pages the backing
    /// already holds ([`RegionMemory::present_runs`]) start resident, placed as if
    /// each had just faulted in; the others start untouched.
    ///
    /// # Errors
    /// Creating the wake-up eventfd or a thread.
    pub fn start(
        uffd: Uffd,
        mem: Box<dyn RegionMemory>,
        tier: Arc<dyn SlowTier>,
        placement: Box<dyn Placement>,
        cfg: TierConfig,
    ) -> io::Result<Self> {
        Self::start_inner(uffd, mem, tier, placement, cfg, None, None)
    }

    /// As [`TierManager::start`], keeping the region's `shadow` up to date (stash
    /// copies written through, remove events cleared from its journal), so that a new
    /// agent can [`TierManager::recover`] the region if this one dies.
    ///
    /// # Errors
    /// As [`TierManager::start`].
    pub fn start_shadowed(
        uffd: Uffd,
        mem: Box<dyn RegionMemory>,
        tier: Arc<dyn SlowTier>,
        placement: Box<dyn Placement>,
        cfg: TierConfig,
        shadow: Shadow,
    ) -> io::Result<Self> {
        Self::start_inner(uffd, mem, tier, placement, cfg, Some(shadow), None)
    }

    /// Takes over a region whose manager died (the agent crashed) from what
    /// outlives it: the pages its backing holds (resident), the stash copies in its
    /// `shadow` (back on probation), the pages the durable slow tier `tier` lists for
    /// [`TierConfig::region_id`] (stored), and the shadow's pending remove journal
    /// (those pages are freed, their copies dropped). Where several hold a page, the
    /// backing's copy wins over the shadow's, and the shadow's over the slow tier's
    /// (the order a page's copies are dropped in). Then every thread that waits on
    /// the region's userfaultfd (its fault read by the dead manager and never
    /// served) is woken, to fault again.
    ///
    /// `instance` is the tier's [`SlowTier::instance`] when the region was
    /// registered: a tier that answers another (a memory server restarted since,
    /// empty) lost the region's stored pages, which must not read as zeros.
    ///
    /// # Errors
    /// `InvalidInput` if `tier` is not durable ([`SlowTier::durable`]: the dead
    /// manager's pages died with it); `InvalidData` if its instance is not
    /// `instance`; the slow tier's listing error; the backing's or shadow's errors
    /// while looking; the errors of [`TierManager::start`].
    pub fn recover(
        uffd: Uffd,
        mem: Box<dyn RegionMemory>,
        tier: Arc<dyn SlowTier>,
        placement: Box<dyn Placement>,
        cfg: TierConfig,
        shadow: Shadow,
        instance: u64,
    ) -> io::Result<Self> {
        if !tier.durable() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the {} tier does not outlive its agent: nothing to recover",
                    tier.name()
                ),
            ));
        }
        Self::start_inner(
            uffd,
            mem,
            tier,
            placement,
            cfg,
            Some(shadow),
            Some(instance),
        )
    }

    /// Stops the threads and leaves everything as it is, as if the agent had died:
    /// pages stay stored, stashed, write-protected or waiting, the range stays
    /// registered. For tests of [`TierManager::recover`].
    pub fn abandon(mut self) {
        self.stopped = true;
        self.halt_threads();
    }

    fn start_inner(
        uffd: Uffd,
        mem: Box<dyn RegionMemory>,
        tier: Arc<dyn SlowTier>,
        placement: Box<dyn Placement>,
        cfg: TierConfig,
        shadow: Option<Shadow>,
        recover: Option<u64>,
    ) -> io::Result<Self> {
        assert_eq!(
            tier.page_bytes(),
            PAGE,
            "the slow tier must store {PAGE}-byte pages"
        );
        // SAFETY: creating a new eventfd.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        let wake_fd = unsafe { OwnedFd::from_raw_fd(efd) };
        let pages = mem.pages();
        let inner = Arc::new(Inner {
            base: mem.base(),
            pages,
            uffd,
            mem,
            tier,
            table: Mutex::new(Table {
                st: vec![St::Untouched; pages],
                crc: vec![None; pages],
                evicted_at: vec![0; pages],
                evict_seq: 0,
                resident: 0,
                stored: 0,
                probation: 0,
                expiring_waiters: Vec::new(),
                stash: HashMap::new(),
                window: None,
            }),
            queue: Mutex::new(Queue {
                pages: VecDeque::new(),
                in_flight: 0,
                queued: 0,
                drained: 0,
                batch_starts: Vec::new(),
            }),
            queue_cv: Condvar::new(),
            idle_cv: Condvar::new(),
            placement: Mutex::new(placement),
            epoch: Mutex::new(Epoch::default()),
            rng: Mutex::new(Rng::new(cfg.seed)),
            own_drops: Mutex::new(Vec::new()),
            slow_sample_p: AtomicU64::new(1.0f64.to_bits()),
            sizing: Mutex::new(Sizing::default()),
            window_slow: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            stop_faults: AtomicBool::new(false),
            wake_fd,
            fatal: Mutex::new(None),
            last_error: Mutex::new(None),
            error_log: Mutex::new(ErrorLog::default()),
            n: Counters::default(),
            fault_tid: AtomicI32::new(0),
            latency_critical: AtomicBool::new(false),
            worker_tids: Mutex::new(Vec::new()),
            nice: AtomicI32::new(0),
            idle: AtomicBool::new(false),
            discard_on_drop: AtomicBool::new(false),
            shadow,
            stale_copies: Mutex::new(HashSet::new()),
            deferred_clears: Mutex::new(Vec::new()),
            pending_drops: Mutex::new(HashSet::new()),
            cfg,
        });
        if let Some(instance) = recover {
            inner.recover(instance)?;
        } else {
            inner.forget_shadow_state()?;
            inner.adopt()?;
        }
        let mut threads = Vec::new();
        let i = inner.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("tier-fault-{}", inner.cfg.region_id))
                .spawn(move || i.fault_loop())?,
        );
        for w in 0..inner.cfg.evict_workers.max(1) {
            let i = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("tier-evict-{}-{w}", inner.cfg.region_id))
                    .spawn(move || i.evict_loop())?,
            );
        }
        if recover.is_some() {
            // Threads whose fault the dead manager read and never served wait on the
            // userfaultfd still; woken, they fault again and this manager serves them.
            if let Err(e) = inner.uffd.wake(inner.base, (inner.pages * PAGE) as u64) {
                tracing::warn!(error = %e, "tier: waking the recovered region's waiters");
            }
        }
        Ok(TierManager {
            inner,
            threads,
            stopped: false,
        })
    }

    /// Pages of the region.
    pub fn pages(&self) -> usize {
        self.inner.pages
    }

    /// Queues region pages for eviction (MaxMem demotions, or victims chosen by the
    /// owner); returns at once, with a ticket for [`TierManager::wait_evicted`].
    pub fn evict(&self, pages: &[usize]) -> u64 {
        self.inner.enqueue(pages)
    }

    /// Waits until every page queued before `ticket` (returned by
    /// [`TierManager::evict`]) has been handled (evicted, or refused), whatever was
    /// queued after it: unlike [`TierManager::wait_evictions`], a steady stream of
    /// fault victims cannot make it wait longer.
    pub fn wait_evicted(&self, ticket: u64) {
        let mut q = lock(&self.inner.queue);
        while q.done_below() < ticket && !self.inner.stop.load(Ordering::Acquire) {
            q = self
                .inner
                .idle_cv
                .wait(q)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Whether every page queued before `ticket` (from [`TierManager::evict`]) has
    /// been handled; never waits.
    pub fn evicted(&self, ticket: u64) -> bool {
        lock(&self.inner.queue).done_below() >= ticket
    }

    /// Waits until the eviction queue is empty and no batch is in flight.
    pub fn wait_evictions(&self) {
        let mut q = lock(&self.inner.queue);
        while !q.pages.is_empty() || q.in_flight > 0 {
            q = self
                .inner
                .idle_cv
                .wait(q)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Brings stored pages in ahead of their faults (MaxMem promotions). Pages not
    /// stored are skipped. A failed load leaves the page stored (its fault will try
    /// again); the pages that failed are returned with their errors, so the owner can
    /// tell the policy where they really are.
    pub fn prefetch(&self, pages: &[usize]) -> Vec<(usize, TierError)> {
        let mut failed = Vec::new();
        let mut buf = vec![0u8; PAGE];
        for &p in pages {
            if let Err(e) = self.inner.prefetch_one(p, &mut buf) {
                failed.push((p, e));
            }
        }
        failed
    }

    /// Starts a sampling window: samples up to [`TierConfig::sample_pages`] resident
    /// pages (see [`crate::sampler`]). Ends the previous window first if one is
    /// open. Returns the pages sampled.
    pub fn sample_begin(&self) -> Vec<usize> {
        self.inner.sample_begin()
    }

    /// Ends the sampling window: puts back the sampled pages that were not touched
    /// and adds the window's estimate to the epoch's fast accesses.
    pub fn sample_end(&self) -> WindowEstimate {
        self.inner.sample_end()
    }

    /// A slot boundary within the sampling window: re-arms the sampled pages that
    /// were touched since they were last armed (write-protected, copied aside and
    /// dropped again), so that their next touch in the window is seen too. A page
    /// thus counts once per slot it is touched in, not once per window (see
    /// `crate::sampler`, "Accesses, not pages"). Returns whether the window
    /// re-arms at all (false without a window, with
    /// [`TierConfig::sample_rearm`] off, or while the region has had no slow
    /// access: the caller then need not call before the window ends).
    pub fn sample_rearm(&self) -> bool {
        self.inner.sample_rearm()
    }

    /// Serves the region's faults first: the fault thread runs `SCHED_FIFO` at
    /// priority 1 (`on`, for a latency-critical process) or as an ordinary thread.
    /// Beside a best-effort process that thrashes, an ordinary fault thread waits
    /// for a CPU behind that process's own fault and eviction threads, and every
    /// slow access of the latency-critical process waits with it. A real-time fault
    /// thread preempts them on its wake-up; it runs only while serving faults of a
    /// process that waits for each (bounded by that process's fault rate, and by
    /// the kernel's real-time throttling).
    ///
    /// # Errors
    /// `sched_setscheduler(2)` failed (`EPERM` without `CAP_SYS_NICE`); the thread
    /// keeps its scheduling.
    pub fn set_latency_critical(&self, on: bool) -> io::Result<()> {
        let was = self.inner.latency_critical.swap(on, Ordering::SeqCst);
        if was == on {
            return Ok(());
        }
        let r = self.inner.apply_priority(on);
        if r.is_err() {
            self.inner.latency_critical.store(was, Ordering::Release);
        }
        r
    }

    /// Runs the region's fault thread (unless latency-critical, which takes
    /// precedence) and its eviction workers at `nice` (-20..=19; 0 is the default).
    ///
    /// The agent runs a best-effort process's threads at a high nice value so that,
    /// beside a thrashing best-effort process (GUPS's fault thread busy ~100 % at
    /// 20K+ faults/s), a latency-critical process's faulting thread, once its page is
    /// mapped, does not wait for its CPU behind them (`docs/design.md`, "Tiered
    /// memory (MaxMem)"; `bench/tiering/faultpath.py`).
    ///
    /// # Errors
    /// `setpriority(2)` failed for a thread (`EACCES` lowering nice without
    /// `CAP_SYS_NICE`); the threads set so far keep the new value.
    pub fn set_nice(&self, nice: i32) -> io::Result<()> {
        let nice = nice.clamp(-20, 19);
        if self.inner.nice.swap(nice, Ordering::SeqCst) == nice {
            return Ok(());
        }
        self.inner.apply_background()
    }

    /// Runs the region's fault thread (unless latency-critical, which takes
    /// precedence) and its eviction workers `SCHED_IDLE` (`on`) or back in
    /// `SCHED_OTHER` at the nice value of [`TierManager::set_nice`].
    ///
    /// With `tier.be_thread_idle` the agent runs a best-effort process's threads
    /// `SCHED_IDLE`, so that a latency-critical process and its faults win the CPU:
    /// a thread of any other policy waking on a CPU that runs a `SCHED_IDLE` thread
    /// preempts it at once, and the scheduler counts such a CPU as idle when it
    /// places the wake-up (`sched(7)`). Beside a thrashing GUPS the KV store gained
    /// nothing over nice 19 (`docs/design.md`, "Tiered memory (MaxMem)", "A
    /// best-effort process's tier threads run idle: measured, off").
    ///
    /// # Errors
    /// `sched_setscheduler(2)` failed for a thread (`EPERM` leaving `SCHED_IDLE`
    /// without `CAP_SYS_NICE`); the threads set so far keep the new policy.
    pub fn set_idle(&self, on: bool) -> io::Result<()> {
        if self.inner.idle.swap(on, Ordering::SeqCst) == on {
            return Ok(());
        }
        self.inner.apply_background()
    }

    /// Whether the fault thread runs as latency-critical
    /// ([`TierManager::set_latency_critical`]); no lock taken.
    pub fn is_latency_critical(&self) -> bool {
        self.inner.latency_critical.load(Ordering::Relaxed)
    }

    /// Whether the open sampling window re-arms its sample (see
    /// [`TierManager::sample_rearm`]).
    pub fn sample_rearming(&self) -> bool {
        lock(&self.inner.table)
            .window
            .as_ref()
            .is_some_and(|w| w.rearm)
    }

    /// The accesses since the last call (one policy epoch), and resets them.
    pub fn take_epoch(&self) -> EpochAccesses {
        {
            let mut z = lock(&self.inner.sizing);
            z.windows_per_epoch = z.windows;
            z.windows = 0;
        }
        let mut e = lock(&self.inner.epoch);
        let e = std::mem::take(&mut *e);
        EpochAccesses {
            fast: e.fast,
            slow: e.slow,
            pages: e.pages.into_iter().collect(),
        }
    }

    /// Why the process must be stopped, once a page could not be brought back.
    pub fn fatal(&self) -> Option<String> {
        lock(&self.inner.fatal).clone()
    }

    /// The last non-fatal error (a failed eviction or prefetch), for logs.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.inner.last_error).clone()
    }

    /// Pages in a transient state (evicting, dropping, loading, being sampled, lost),
    /// with their state, for diagnosing a stuck region.
    pub fn transient_pages(&self) -> Vec<(usize, String)> {
        let t = lock(&self.inner.table);
        t.st.iter()
            .enumerate()
            .filter(|(_, s)| {
                !matches!(
                    s,
                    St::Untouched | St::Resident | St::Stored | St::Sampled | St::Probation
                )
            })
            .map(|(i, s)| (i, format!("{s:?}")))
            .collect()
    }

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

    /// Stops the threads, brings every stored and sampled page back, and unregisters
    /// the region: the application then owns plain memory again.
    ///
    /// # Errors
    /// If a page could not be brought back (or the manager was fatal): the
    /// userfaultfd is then left open and registered, so the process blocks on the
    /// missing pages rather than reading zeros.
    pub fn stop(mut self) -> Result<(), String> {
        self.stop_inner()
    }

    /// Stops the threads and forgets the region without bringing its pages back: its
    /// slow-tier copies are dropped and the range is unregistered (errors ignored:
    /// the process may be gone). Only for a region that is being unmapped, or whose
    /// process exited: its stored contents are lost.
    pub fn discard(mut self) {
        self.discard_inner();
    }

    /// Makes the drop of this manager (the last reference to it, where it is shared)
    /// [`TierManager::discard`] the region rather than bring its pages back: for a
    /// region released while something else still held the manager.
    pub fn discard_when_dropped(&self) {
        self.inner.discard_on_drop.store(true, Ordering::Release);
    }

    fn discard_inner(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        self.halt_threads();
        let _ = self.inner.tier.remove_region(self.inner.cfg.region_id);
        let len = (self.inner.pages * PAGE) as u64;
        let _ = self.inner.uffd.unregister(self.inner.base, len);
    }

    fn halt_threads(&mut self) {
        // The eviction workers first: a batch in flight (its drops raise remove
        // events that the kernel waits to see read) finishes while the fault thread
        // still serves.
        self.inner.stop.store(true, Ordering::Release);
        self.inner.queue_cv.notify_all();
        let fault_thread = (!self.threads.is_empty()).then(|| self.threads.remove(0));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.inner.stop_faults.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd wakes the fault thread's poll.
        unsafe {
            libc::write(
                std::os::fd::AsRawFd::as_raw_fd(&self.inner.wake_fd),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
        if let Some(t) = fault_thread {
            let _ = t.join();
        }
    }

    fn stop_inner(&mut self) -> Result<(), String> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        self.halt_threads();
        let result = self.inner.restore_all();
        match &result {
            Ok(()) => {
                let len = (self.inner.pages * PAGE) as u64;
                if let Err(e) = self.inner.uffd.unregister(self.inner.base, len) {
                    tracing::warn!(error = %e, "tier: unregistering the region failed");
                }
            }
            Err(why) => {
                tracing::error!(reason = %why, "tier: pages could not be brought back; the region stays registered");
                // Keep the userfaultfd (and its registration) alive for the life of
                // the process.
                let fd = self.inner.uffd.as_fd().try_clone_to_owned();
                if let Ok(fd) = fd {
                    std::mem::forget(fd);
                }
            }
        }
        result
    }
}

impl Drop for TierManager {
    fn drop(&mut self) {
        if self.inner.discard_on_drop.load(Ordering::Acquire) {
            self.discard_inner();
        } else {
            let _ = self.stop_inner();
        }
    }
}

impl Inner {
    fn addr(&self, page: usize) -> u64 {
        self.base + (page * PAGE) as u64
    }

    fn key(&self, page: usize) -> PageKey {
        PageKey::new(self.cfg.region_id, page as u64)
    }

    /// Takes the pages that already hold data ([`RegionMemory::present_runs`]) as
    /// resident, before any thread of the manager runs: each is placed as if it had
    /// just faulted in, and the victims the placement names for them are queued for
    /// eviction (the workers start next). A region created for the manager has none;
    /// one handed over again (the agent restarted, and the process gave its region to
    /// the new agent) has every page it held, the previous agent having brought the
    /// slow ones back before it let go. Untouched pages (holes) still fault as
    /// missing and read as zeros.
    ///
    /// # Errors
    /// The backing's error while looking (the region is not taken).
    fn adopt(&self) -> io::Result<()> {
        let runs = self.mem.present_runs()?;
        if runs.is_empty() {
            return Ok(());
        }
        let mut victims = Vec::new();
        let mut adopted = 0u64;
        {
            let mut t = lock(&self.table);
            let mut pl = lock(&self.placement);
            for (first, count) in runs {
                for p in first..(first + count).min(self.pages) {
                    if t.st[p] != St::Untouched {
                        continue;
                    }
                    t.st[p] = St::Resident;
                    t.resident += 1;
                    adopted += 1;
                    if let Some(v) = pl.fault_in(p) {
                        victims.push(v);
                    }
                }
            }
        }
        self.n.adopted.fetch_add(adopted, Ordering::Relaxed);
        tracing::info!(
            region = self.cfg.region_id,
            pages = adopted,
            victims = victims.len(),
            "tier: region taken over with pages in local memory"
        );
        self.enqueue(&victims);
        Ok(())
    }

    /// Takes over a region whose manager died (see [`TierManager::recover`]),
    /// before any thread of this manager runs. Per page, the first that holds it:
    /// a pending remove journal slot over a page the backing no longer holds
    /// (freed: its other copies are dropped); the backing (resident); the shadow
    /// (on probation, from the shadow's copy); the slow tier's listing (stored,
    /// checked by the backend's own checksum); else untouched. Copies a winner makes
    /// stale are dropped, and the journal's pending slots cleared.
    ///
    /// # Errors
    /// The backing's, the shadow's or the slow tier's error while looking.
    fn recover(&self, instance: u64) -> io::Result<()> {
        let shadow = self
            .shadow
            .as_ref()
            .expect("recover is only called with a shadow");
        if shadow.tainted() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the slow tier may hold copies of freed pages that the dead manager could not drop (it had failed): they would read as the pages",
            ));
        }
        let n = self.pages;
        let marked = |runs: Vec<(usize, usize)>| {
            let mut v = vec![false; n];
            for (first, count) in runs {
                v[first.min(n)..(first + count).min(n)].fill(true);
            }
            v
        };
        let in_mem = marked(self.mem.present_runs()?);
        let in_shadow = marked(shadow.present_runs()?);
        let mut in_tier = vec![false; n];
        for p in self
            .tier
            .list_region(self.cfg.region_id)
            .map_err(|e| io::Error::other(format!("listing the slow tier: {e}")))?
        {
            if let Some(x) = in_tier.get_mut(p as usize) {
                *x = true;
            }
        }
        // After the listing: a restart of the tier before it would show here too.
        let now = self.tier.instance();
        if now != instance {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the {} tier restarted since the region was registered (instance {instance:#x}, now {now:#x}): the pages it held are gone",
                    self.tier.name()
                ),
            ));
        }
        let pending = shadow.pending_removes();
        let mut removed = vec![false; n];
        for &(_, s, e) in &pending {
            // (The process writes the slots: a range it wrote backwards frees nothing.)
            let first = (s / PAGE as u64).min(n as u64) as usize;
            let last = e.div_ceil(PAGE as u64).min(n as u64) as usize;
            if first < last {
                removed[first..last].fill(true);
            }
        }
        let mut victims = Vec::new();
        let (mut resident, mut probation, mut stored, mut freed) = (0u64, 0u64, 0u64, 0u64);
        let mut drop_tier = Vec::new();
        let mut drop_shadow = Vec::new();
        {
            let mut t = lock(&self.table);
            let mut pl = lock(&self.placement);
            let mut page = vec![0u8; PAGE];
            for p in 0..n {
                if in_mem[p] {
                    // The process's own copy is the newest (other copies are dropped
                    // only after it is made, and made only while it is protected).
                    t.st[p] = St::Resident;
                    resident += 1;
                    if let Some(v) = pl.fault_in(p) {
                        victims.push(v);
                    }
                    if in_shadow[p] {
                        drop_shadow.push(p);
                    }
                    if in_tier[p] {
                        drop_tier.push(p);
                    }
                } else if removed[p] {
                    if in_shadow[p] {
                        drop_shadow.push(p);
                    }
                    if in_tier[p] {
                        drop_tier.push(p);
                        freed += 1;
                    }
                } else if in_shadow[p] {
                    // Sampled or on probation when the agent died; a slow-tier copy
                    // beside it is older (a stash copy is dropped only after the
                    // page is mapped or stored again).
                    shadow.read_page(p, &mut page)?;
                    t.stash.insert(p, page.clone().into_boxed_slice());
                    t.st[p] = St::Probation;
                    t.probation += 1;
                    probation += 1;
                    if let Some(v) = pl.fault_in(p) {
                        victims.push(v);
                    }
                    if in_tier[p] {
                        drop_tier.push(p);
                    }
                } else if in_tier[p] {
                    t.st[p] = St::Stored;
                    t.crc[p] = None;
                    stored += 1;
                    pl.found_slow(p);
                }
            }
            t.resident = resident + probation;
            t.stored = stored;
        }
        for p in drop_tier {
            self.drop_copy(p);
        }
        for p in drop_shadow {
            self.shadow_forget(p);
        }
        for (k, _, _) in pending.iter().copied() {
            shadow.clear_slot(k);
        }
        self.n
            .adopted
            .fetch_add(resident + probation, Ordering::Relaxed);
        self.n.recovered_stored.fetch_add(stored, Ordering::Relaxed);
        tracing::info!(
            region = self.cfg.region_id,
            resident,
            probation,
            stored,
            freed,
            journal = pending.len(),
            victims = victims.len(),
            "tier: region recovered after its agent died"
        );
        self.enqueue(&victims);
        Ok(())
    }

    /// Pages of `pages` the application freed while this worker moved them
    /// ([`St::Freeing`]): the copy the move made is dropped (`slow`: from the slow
    /// tier too), then the page is untouched and its waiting faults are woken, and
    /// journal slots waiting for it are cleared.
    fn finish_freed(&self, pages: &[usize], slow: bool) {
        let freeing: Vec<usize> = {
            let t = lock(&self.table);
            pages
                .iter()
                .copied()
                .filter(|&p| t.st[p] == St::Freeing)
                .collect()
        };
        if freeing.is_empty() {
            return;
        }
        for &p in &freeing {
            if slow {
                self.drop_copy(p);
            }
            self.shadow_forget(p);
        }
        {
            let mut t = lock(&self.table);
            for &p in &freeing {
                if t.st[p] == St::Freeing {
                    t.st[p] = St::Untouched;
                }
            }
        }
        for &p in &freeing {
            let _ = self.uffd.wake(self.addr(p), PAGE as u64);
        }
        if let Some(sh) = &self.shadow {
            let mut d = lock(&self.deferred_clears);
            d.retain_mut(|(s, e, left)| {
                for p in &freeing {
                    left.remove(p);
                }
                if left.is_empty() {
                    sh.clear_remove(*s, *e);
                }
                !left.is_empty()
            });
        }
    }

    /// A region registered anew (not recovered) has every page in its backing: what
    /// its shadow holds from an earlier manager (journal slots whose remove events
    /// no manager saw, copies) is stale, and would mislead a recovery later.
    ///
    /// # Errors
    /// The shadow's error while looking.
    fn forget_shadow_state(&self) -> io::Result<()> {
        let Some(sh) = &self.shadow else {
            return Ok(());
        };
        sh.set_tainted(false);
        for (k, _, _) in sh.pending_removes() {
            sh.clear_slot(k);
        }
        for (first, count) in sh.present_runs()? {
            for p in first..(first + count).min(self.pages) {
                sh.forget(p)?;
            }
        }
        Ok(())
    }

    fn enqueue(&self, pages: &[usize]) -> u64 {
        let mut q = lock(&self.queue);
        let before = q.pages.len();
        q.pages
            .extend(pages.iter().copied().filter(|&p| p < self.pages));
        let added = (q.pages.len() - before) as u64;
        q.queued += added;
        let ticket = q.queued;
        drop(q);
        if added > 0 {
            self.queue_cv.notify_one();
        }
        ticket
    }

    fn set_fatal(&self, why: String) {
        tracing::error!(region = self.cfg.region_id, reason = %why, "tier: process must be stopped");
        lock(&self.fatal).get_or_insert(why);
    }

    /// Maps page `i` (at `page_addr`) back from its copy in the stash (a sampled
    /// page or one on probation), which wakes the faulting thread. On success the
    /// table guard comes back for the caller to mark the page resident. On failure
    /// the copy returns to the stash, the guard is released and the thread is woken
    /// to retry (`EAGAIN`: a remove event is pending) or the error is noted; `None`.
    fn map_from_stash<'a>(
        &'a self,
        mut t: MutexGuard<'a, Table>,
        i: usize,
        page_addr: u64,
        what: &str,
    ) -> Option<MutexGuard<'a, Table>> {
        let data = t.stash.remove(&i).expect("a stashed page has its copy");
        match self.uffd.copy(page_addr, &data, false) {
            Ok(_) => {
                self.shadow_forget(i);
                Some(t)
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                self.shadow_forget(i);
                Some(t)
            }
            Err(e) => {
                t.stash.insert(i, data);
                drop(t);
                if is_eagain(&e) {
                    let _ = self.uffd.wake(page_addr, PAGE as u64);
                } else {
                    self.note_error(format!("restoring {what} {i}: {e}"));
                }
                None
            }
        }
    }

    /// Puts the fault thread in `SCHED_FIFO` at priority 1 (`on`) or back in
    /// `SCHED_OTHER`; a no-op before the thread runs (it applies the flag itself).
    fn apply_priority(&self, on: bool) -> io::Result<()> {
        let tid = self.fault_tid.load(Ordering::SeqCst);
        if tid == 0 {
            return Ok(());
        }
        let (policy, prio) = if on {
            (libc::SCHED_FIFO, 1)
        } else {
            (libc::SCHED_OTHER, 0)
        };
        let param = libc::sched_param {
            sched_priority: prio,
        };
        // SAFETY: a valid sched_param for a thread of this process.
        if unsafe { libc::sched_setscheduler(tid, policy, &param) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if !on {
            set_thread_sched(
                tid,
                self.nice.load(Ordering::SeqCst),
                self.idle.load(Ordering::SeqCst),
            )?;
        }
        Ok(())
    }

    /// Applies the region's nice value and `SCHED_IDLE` flag to its eviction
    /// workers and, unless latency-critical, its fault thread.
    fn apply_background(&self) -> io::Result<()> {
        let (nice, idle) = (
            self.nice.load(Ordering::SeqCst),
            self.idle.load(Ordering::SeqCst),
        );
        let mut tids = lock(&self.worker_tids).clone();
        if !self.latency_critical.load(Ordering::SeqCst) {
            tids.push(self.fault_tid.load(Ordering::SeqCst));
        }
        for tid in tids.into_iter().filter(|&t| t != 0) {
            set_thread_sched(tid, nice, idle)?;
        }
        Ok(())
    }

    /// The fault thread's `(run time, run delay)` in ns (see [`thread_schedstat`]).
    fn fault_thread_schedstat(&self) -> (u64, u64) {
        thread_schedstat(self.fault_tid.load(Ordering::Acquire))
    }

    /// The eviction workers' `(run time, run delay)` in ns, summed.
    fn evict_threads_schedstat(&self) -> (u64, u64) {
        lock(&self.worker_tids)
            .iter()
            .map(|&t| thread_schedstat(t))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Records a failed step (kept as [`TierManager::last_error`]) and warns, at most
    /// once a second per region (see [`ErrorLog`]).
    fn note_error(&self, why: String) {
        if let Some(suppressed) = lock(&self.error_log).note(Instant::now()) {
            tracing::warn!(region = self.cfg.region_id, error = %why, suppressed, "tier");
        }
        *lock(&self.last_error) = Some(why);
    }

    fn record_sample(&self, page: usize, slow: bool, refault: bool) {
        // A slow fault is a page touched in this window, known for sure; a resident
        // page's touch is only seen if the page was among the window's k of R
        // sampled. Slow faults enter the per-page samples with the same probability
        // k/R, so the hotness bins weigh both tiers alike (the count of slow
        // touches, `slow`, stays exact). A refault at a short distance is counted
        // for sure: it says the page belongs in fast memory, which a resident hot
        // page's rare samples take seconds to say (see "Refaults" in the module
        // documentation).
        let keep = !slow || refault || {
            let p = f64::from_bits(self.slow_sample_p.load(Ordering::Relaxed));
            p >= 1.0 || (lock(&self.rng).next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64) < p
        };
        if slow {
            self.window_slow.fetch_add(1, Ordering::Relaxed);
        }
        let mut e = lock(&self.epoch);
        if slow {
            e.slow += 1;
        }
        if keep {
            *e.pages.entry(page).or_default() += 1;
        }
    }

    /// Asks the placement about newly mapped pages and queues the victims.
    fn placed(&self, pages: std::ops::Range<usize>) {
        let mut victims = Vec::new();
        let t0 = Instant::now();
        {
            let mut pl = lock(&self.placement);
            for p in pages {
                if let Some(v) = pl.fault_in(p) {
                    victims.push(v);
                }
            }
        }
        let ns = t0.elapsed().as_nanos() as u64;
        self.n.placement_ns.fetch_add(ns, Ordering::Relaxed);
        self.n.placement_max_ns.fetch_max(ns, Ordering::Relaxed);
        self.enqueue(&victims);
    }

    fn fault_loop(&self) {
        // SAFETY: gettid has no preconditions.
        self.fault_tid
            .store(unsafe { libc::gettid() }, Ordering::SeqCst);
        if self.latency_critical.load(Ordering::SeqCst) {
            if let Err(e) = self.apply_priority(true) {
                self.note_error(format!("fault thread priority: {e}"));
            }
        } else {
            self.apply_own_nice();
        }
        let mut buf = vec![0u8; PAGE];
        while !self.stop_faults.load(Ordering::Acquire) {
            match self.uffd.poll(Some(self.wake_fd.as_fd()), 500) {
                Ok((true, _)) => {}
                Ok(_) => continue,
                Err(e) => {
                    self.set_fatal(format!("poll on the userfaultfd failed: {e}"));
                    return;
                }
            }
            let events = match self.uffd.read_events() {
                Ok(v) => v,
                Err(e) => {
                    self.set_fatal(format!("reading the userfaultfd failed: {e}"));
                    return;
                }
            };
            for ev in events {
                match ev {
                    Event::PageFault { address, write, wp } => {
                        self.on_fault(address, write, wp, &mut buf)
                    }
                    Event::Remove { start, end } if self.cfg.track_remove => {
                        self.on_remove(start, end)
                    }
                    other => tracing::debug!(?other, "tier: event ignored"),
                }
            }
        }
    }

    fn on_fault(&self, address: u64, _write: bool, wp: bool, buf: &mut [u8]) {
        let page_addr = address & !(PAGE as u64 - 1);
        if page_addr < self.base || page_addr >= self.addr(self.pages) {
            let _ = self.uffd.wake(page_addr, PAGE as u64);
            return;
        }
        let i = ((page_addr - self.base) as usize) / PAGE;
        if wp {
            self.n.wp_faults.fetch_add(1, Ordering::Relaxed);
            let st = lock(&self.table).st[i];
            if matches!(
                st,
                St::Evicting
                    | St::Dropping
                    | St::SampleDrop
                    | St::SampleDropping
                    | St::ProbeDrop
                    | St::ProbeDropping
                    | St::Freeing
            ) {
                return; // The worker unprotects and wakes it.
            }
            match self.uffd.writeprotect(page_addr, PAGE as u64, false, false) {
                Ok(()) => {}
                Err(e) if is_eagain(&e) => {
                    let _ = self.uffd.wake(page_addr, PAGE as u64);
                }
                Err(e) => self.note_error(format!("unprotecting page {i}: {e}")),
            }
            return;
        }
        let mut t = lock(&self.table);
        match t.st[i] {
            St::Untouched => {
                let mut end = i + 1;
                let limit = (i + self.cfg.zero_fill_ahead.max(1)).min(self.pages);
                while end < limit && t.st[end] == St::Untouched {
                    end += 1;
                }
                let len = ((end - i) * PAGE) as u64;
                match self.uffd.zeropage(page_addr, len) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                        let _ = self.uffd.wake(page_addr, len);
                    }
                    Err(e) if is_eagain(&e) => {
                        // A remove event is pending: retry the access after it.
                        drop(t);
                        let _ = self.uffd.wake(page_addr, PAGE as u64);
                        return;
                    }
                    Err(e) => {
                        drop(t);
                        self.note_error(format!("zero-filling page {i}: {e}"));
                        return;
                    }
                }
                for s in &mut t.st[i..end] {
                    *s = St::Resident;
                }
                t.resident += (end - i) as u64;
                self.n.zero_faults.fetch_add(1, Ordering::Relaxed);
                drop(t);
                self.placed(i..end);
            }
            St::Stored => {
                t.st[i] = St::Loading;
                let crc = t.crc[i];
                drop(t);
                let served_from = Instant::now();
                let loaded = self.load_checked(i, crc, buf);
                let load_ns = served_from.elapsed().as_nanos() as u64;
                match loaded {
                    Ok(()) => {
                        self.n.slow_load_ns.fetch_add(load_ns, Ordering::Relaxed);
                        let mut t = lock(&self.table);
                        if t.st[i] != St::Loading {
                            // Freed meanwhile: the retry zero-fills it.
                            drop(t);
                            let _ = self.uffd.wake(page_addr, PAGE as u64);
                            return;
                        }
                        let map_from = Instant::now();
                        let copied = self.uffd.copy(page_addr, buf, false);
                        self.n
                            .slow_map_ns
                            .fetch_add(map_from.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        if let Err(e) = copied {
                            if e.raw_os_error() != Some(libc::EEXIST) {
                                t.st[i] = St::Stored;
                                drop(t);
                                if is_eagain(&e) {
                                    // A remove event is pending: retry after it.
                                    let _ = self.uffd.wake(page_addr, PAGE as u64);
                                } else {
                                    self.note_error(format!("mapping page {i}: {e}"));
                                }
                                return;
                            }
                        }
                        drop(t);
                        // The thread runs again; drop the slow-tier copy while the page
                        // is still `loading`, so no eviction can store it anew first.
                        let drop_from = Instant::now();
                        self.drop_copy(i);
                        self.n
                            .slow_drop_ns
                            .fetch_add(drop_from.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        let mut t = lock(&self.table);
                        let refault = self.cfg.refault_samples && t.short_refault(i);
                        if t.st[i] == St::Loading {
                            t.st[i] = St::Resident;
                            t.resident += 1;
                            t.stored -= 1;
                        }
                        drop(t);
                        // The sample first: a reader that sees the fault counted
                        // finds it in the epoch too.
                        if refault {
                            self.n.refault_samples.fetch_add(1, Ordering::Relaxed);
                        }
                        self.record_sample(i, true, refault);
                        self.n
                            .slow_fault_ns
                            .fetch_add(served_from.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        self.n.slow_faults.fetch_add(1, Ordering::Release);
                        self.placed(i..i + 1);
                    }
                    Err(e) => {
                        let mut t = lock(&self.table);
                        t.st[i] = St::Lost;
                        drop(t);
                        self.n.lost.fetch_add(1, Ordering::Relaxed);
                        self.set_fatal(format!(
                            "page {i} of region {} (address {page_addr:#x}) cannot be brought back from the {} tier: {e}",
                            self.cfg.region_id,
                            self.tier.name()
                        ));
                        // The faulting thread stays blocked: never zeros, never stale.
                    }
                }
            }
            St::Sampled => {
                let Some(mut t) = self.map_from_stash(t, i, page_addr, "sampled page") else {
                    return;
                };
                t.st[i] = St::Resident;
                if let Some(w) = t.window.as_mut() {
                    w.hits += 1;
                    w.touched.insert(i);
                }
                drop(t);
                self.n.sample_hits.fetch_add(1, Ordering::Relaxed);
                self.record_sample(i, false, false);
            }
            St::Probation => {
                // A probation hit: the next victim was touched, so it is not cold. Put
                // it back from its copy; the touch is a fast access, a hotness sample
                // and a second chance.
                let Some(mut t) = self.map_from_stash(t, i, page_addr, "page on probation") else {
                    return;
                };
                t.st[i] = St::Resident;
                t.probation -= 1;
                drop(t);
                self.n.probation_hits.fetch_add(1, Ordering::Relaxed);
                {
                    let mut e = lock(&self.epoch);
                    e.fast += 1.0;
                    *e.pages.entry(i).or_default() += 1;
                }
                lock(&self.placement).second_chance(i);
            }
            St::Expiring => {
                // Being stored from its probation copy: the worker wakes the thread
                // once the page is stored, and the retry faults it in.
                t.expiring_waiters.push(i);
                self.n.spurious.fetch_add(1, Ordering::Relaxed);
            }
            St::Resident | St::Evicting | St::SampleDrop | St::ProbeDrop => {
                // Believed mapped: either mapped since the fault was raised (the zero
                // fill finds it and just wakes), or dropped by the application itself,
                // which then reads zeros as the kernel promises.
                drop(t);
                self.n.spurious.fetch_add(1, Ordering::Relaxed);
                match self.uffd.zeropage(page_addr, PAGE as u64) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) || is_eagain(&e) => {
                        let _ = self.uffd.wake(page_addr, PAGE as u64);
                    }
                    Err(e) => self.note_error(format!("page {i}: {e}")),
                }
            }
            St::Loading | St::Dropping | St::SampleDropping | St::ProbeDropping | St::Freeing => {
                // A prefetch is bringing it in (its copy wakes the thread), or a
                // worker is dropping it (its unprotect wakes the thread, which then
                // finds it stored or sampled), or freed it mid-move (it wakes the
                // thread once its copy is gone, and the retry finds it untouched).
                self.n.spurious.fetch_add(1, Ordering::Relaxed);
            }
            St::Lost => {}
        }
    }

    /// Drops the slow-tier copy of a page just mapped (still `loading`).
    fn drop_copy(&self, i: usize) {
        if let Err(e) = self.tier.remove(self.key(i)) {
            // While the page is mapped a stale copy costs slow-tier space only (the
            // next eviction overwrites it); it is dropped again if the application
            // frees the page.
            tracing::debug!(page = i, error = %e, "tier: dropping a slow-tier copy");
            self.note_stale(&[i]);
        }
    }

    /// Pages `pages`, mapped, may have a copy in the slow tier.
    fn note_stale(&self, pages: &[usize]) {
        if !pages.is_empty() && self.tier.durable() {
            lock(&self.stale_copies).extend(pages.iter().copied());
        }
    }

    /// Pages `pages` were just stored: whatever copy they had is replaced.
    fn forget_stale(&self, pages: &[usize]) {
        let mut st = lock(&self.stale_copies);
        if !st.is_empty() {
            for p in pages {
                st.remove(p);
            }
        }
        drop(st);
        let mut pd = lock(&self.pending_drops);
        if !pd.is_empty() {
            for p in pages {
                pd.remove(p);
            }
            if pd.is_empty() {
                if let Some(sh) = &self.shadow {
                    sh.set_tainted(false);
                }
            }
        }
    }

    /// Freed pages `pages` keep a slow-tier copy that could not be dropped.
    fn note_undropped(&self, pages: &[usize]) {
        if pages.is_empty() || !self.tier.durable() {
            return;
        }
        lock(&self.pending_drops).extend(pages.iter().copied());
        if let Some(sh) = &self.shadow {
            sh.set_tainted(true);
        }
        self.note_error(format!(
            "dropping the slow-tier copies of {} freed pages failed; retried after each eviction",
            pages.len()
        ));
    }

    /// Tries again to drop the copies of [`Inner::pending_drops`]. A page still
    /// untouched is held freeing meanwhile (its faults wait); one faulted in since
    /// keeps its copy as a stale one (dropped if it is freed again, replaced if
    /// it is stored).
    fn retry_pending_drops(&self) {
        let pages: Vec<usize> = lock(&self.pending_drops).iter().copied().collect();
        if pages.is_empty() {
            return;
        }
        let mut held = Vec::new();
        let mut mapped = Vec::new();
        {
            let mut t = lock(&self.table);
            for &p in &pages {
                match t.st[p] {
                    St::Untouched => {
                        t.st[p] = St::Freeing;
                        held.push(p);
                    }
                    St::Resident => mapped.push(p),
                    _ => {}
                }
            }
        }
        let mut done: Vec<usize> = mapped.clone();
        for &p in &held {
            if self.tier.remove(self.key(p)).is_ok() {
                done.push(p);
            }
        }
        if !mapped.is_empty() {
            lock(&self.stale_copies).extend(mapped.iter().copied());
        }
        {
            let mut pd = lock(&self.pending_drops);
            for p in &done {
                pd.remove(p);
            }
            if pd.is_empty() {
                if let Some(sh) = &self.shadow {
                    sh.set_tainted(false);
                }
            }
        }
        self.finish_freed(&held, false);
    }

    /// Writes the stash copy of page `p` to the shadow, if the region has one.
    fn shadow_write(&self, p: usize, data: &[u8]) -> io::Result<()> {
        match &self.shadow {
            Some(sh) => sh.write_page(p, data),
            None => Ok(()),
        }
    }

    /// Punches the shadow's copy of page `p` (held elsewhere now, or freed).
    fn shadow_forget(&self, p: usize) {
        if let Some(sh) = &self.shadow {
            if let Err(e) = sh.forget(p) {
                // A stale copy there would be taken for the page by an agent that
                // recovers the region: say so loudly.
                self.note_error(format!("dropping the shadow copy of page {p}: {e}"));
            }
        }
    }

    fn load_checked(&self, i: usize, crc: Option<u32>, buf: &mut [u8]) -> Result<(), TierError> {
        self.tier.load(self.key(i), buf)?;
        let Some(crc) = crc else {
            return Ok(());
        };
        let actual = checksum(buf);
        if actual != crc {
            return Err(TierError::Corrupt {
                key: self.key(i),
                expected: crc,
                actual,
            });
        }
        Ok(())
    }

    fn on_remove(&self, start: u64, end: u64) {
        {
            // Our own drop: consume its record (the kernel lets `madvise` return as
            // soon as the event is read, so the dropping worker cannot remove it).
            let mut own = lock(&self.own_drops);
            if let Some(k) = own.iter().position(|&(s, e)| s <= start && end <= e) {
                own.swap_remove(k);
                return;
            }
        }
        let lo = start.max(self.base);
        let hi = end.min(self.addr(self.pages));
        if lo >= hi {
            return;
        }
        let first = ((lo - self.base) as usize) / PAGE;
        let last = ((hi - self.base) as usize).div_ceil(PAGE);
        let mut dropped_stored = Vec::new();
        let mut freed = Vec::new();
        let mut unshadow = Vec::new();
        let mut in_flight = HashSet::new();
        {
            let mut t = lock(&self.table);
            for i in first..last {
                let was = t.st[i];
                match was {
                    St::Untouched | St::Lost | St::Freeing => continue,
                    St::Stored | St::Dropping => {
                        t.stored -= 1;
                        dropped_stored.push(i);
                    }
                    St::Sampled | St::SampleDropping => {
                        t.stash.remove(&i);
                        t.resident -= 1;
                        unshadow.push(i);
                    }
                    St::Probation | St::ProbeDropping | St::ProbeDrop | St::Expiring => {
                        // (An expiring page's copy is the worker's; it drops the
                        // slow-tier copy when it finds the page freed.)
                        t.stash.remove(&i);
                        t.resident -= 1;
                        t.probation -= 1;
                        unshadow.push(i);
                    }
                    St::SampleDrop => {
                        // (Its copy may be in the shadow already.)
                        t.resident -= 1;
                        unshadow.push(i);
                    }
                    St::Resident | St::Evicting => t.resident -= 1,
                    // (Only a prefetch: a fault's load runs on this thread.)
                    St::Loading => t.stored -= 1,
                }
                // A page a worker is moving keeps faults waiting until the worker
                // has dropped the copy it made: a page faulted in and written
                // meanwhile would otherwise be punched by its drop, or its new
                // copy dropped.
                let moving = matches!(
                    was,
                    St::Evicting
                        | St::Dropping
                        | St::SampleDrop
                        | St::SampleDropping
                        | St::ProbeDrop
                        | St::ProbeDropping
                        | St::Expiring
                        | St::Loading
                );
                t.st[i] = if moving { St::Freeing } else { St::Untouched };
                if moving {
                    in_flight.insert(i);
                }
                freed.push(i);
            }
        }
        {
            // Mapped pages with a copy left in the slow tier lose it too.
            let mut st = lock(&self.stale_copies);
            if !st.is_empty() {
                for &i in &freed {
                    if st.remove(&i) {
                        dropped_stored.push(i);
                    }
                }
            }
        }
        let mut undropped = Vec::new();
        for i in dropped_stored {
            if self.tier.remove(self.key(i)).is_err() {
                undropped.push(i);
            }
        }
        self.note_undropped(&undropped);
        for i in unshadow {
            self.shadow_forget(i);
        }
        // Every copy of the range is gone: its journal slot is done (see
        // `crate::shadow`). The fault thread handles faults and remove events in
        // order, so no copy of these pages was made since; pages a worker is still
        // moving clear it when the worker is done with them.
        if let Some(sh) = &self.shadow {
            let (s, e) = (
                start.saturating_sub(self.base),
                end.saturating_sub(self.base),
            );
            if in_flight.is_empty() {
                sh.clear_remove(s, e);
            } else {
                lock(&self.deferred_clears).push((s, e, in_flight));
            }
        }
        self.n
            .freed
            .fetch_add(freed.len() as u64, Ordering::Relaxed);
        let mut pl = lock(&self.placement);
        for i in freed {
            pl.freed(i);
        }
    }

    fn prefetch_one(&self, i: usize, buf: &mut [u8]) -> Result<(), TierError> {
        let crc = {
            let mut t = lock(&self.table);
            if i >= self.pages || t.st[i] != St::Stored {
                return Ok(());
            }
            t.st[i] = St::Loading;
            t.crc[i]
        };
        let r = self.load_checked(i, crc, buf);
        let mut t = lock(&self.table);
        if t.st[i] != St::Loading {
            // Freed meanwhile: its copy goes, then its faults may zero-fill it.
            drop(t);
            self.finish_freed(&[i], true);
            return Ok(());
        }
        if let Err(e) = r {
            t.st[i] = St::Stored;
            drop(t);
            self.note_error(format!("prefetching page {i}: {e}"));
            return Err(e);
        }
        match self.uffd.copy(self.addr(i), buf, false) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => {
                // (`EAGAIN`: a remove event is pending; the page's fault brings it.)
                t.st[i] = St::Stored;
                drop(t);
                self.note_error(format!("mapping prefetched page {i}: {e}"));
                return Ok(());
            }
        }
        drop(t);
        self.drop_copy(i);
        let mut t = lock(&self.table);
        if t.st[i] == St::Loading {
            t.st[i] = St::Resident;
            t.resident += 1;
            t.stored -= 1;
        }
        drop(t);
        self.finish_freed(&[i], false);
        self.n.prefetches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The calling thread takes the region's nice value and `SCHED_IDLE` flag (a
    /// thread started after [`TierManager::set_nice`] or [`TierManager::set_idle`]).
    fn apply_own_nice(&self) {
        let nice = self.nice.load(Ordering::SeqCst);
        let idle = self.idle.load(Ordering::SeqCst);
        if nice != 0 || idle {
            // SAFETY: gettid has no preconditions.
            if let Err(e) = set_thread_sched(unsafe { libc::gettid() }, nice, idle) {
                self.note_error(format!("thread nice: {e}"));
            }
        }
    }

    fn evict_loop(&self) {
        // SAFETY: gettid has no preconditions.
        lock(&self.worker_tids).push(unsafe { libc::gettid() });
        self.apply_own_nice();
        let batch_max = self.cfg.evict_batch.max(1);
        loop {
            let (start, batch): (u64, Vec<usize>) = {
                let mut q = lock(&self.queue);
                while q.pages.is_empty() && !self.stop.load(Ordering::Acquire) {
                    q = self.queue_cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
                // A short batch waits up to the linger for more victims: one protect,
                // drop (and TLB shootdown) and store round trip serves them all.
                if !self.cfg.evict_linger.is_zero() && q.pages.len() < batch_max {
                    let deadline = std::time::Instant::now() + self.cfg.evict_linger;
                    while q.pages.len() < batch_max && !self.stop.load(Ordering::Acquire) {
                        let now = std::time::Instant::now();
                        if now >= deadline {
                            break;
                        }
                        q = self
                            .queue_cv
                            .wait_timeout(q, deadline - now)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
                if self.stop.load(Ordering::Acquire) {
                    q.pages.clear();
                    q.drained = q.queued;
                    self.idle_cv.notify_all();
                    return;
                }
                let n = q.pages.len().min(batch_max);
                q.in_flight += 1;
                let start = q.drained;
                q.drained += n as u64;
                q.batch_starts.push(start);
                (start, q.pages.drain(..n).collect())
            };
            self.evict_batch(batch);
            self.retry_pending_drops();
            self.refill_probation();
            let mut q = lock(&self.queue);
            q.in_flight -= 1;
            if let Some(k) = q.batch_starts.iter().position(|&b| b == start) {
                q.batch_starts.swap_remove(k);
            }
            self.idle_cv.notify_all();
        }
    }

    /// Protects, unprotects (and wakes) every run.
    fn protect_runs(&self, rs: &[(usize, usize)], protect: bool) -> io::Result<()> {
        for &(first, count) in rs {
            let (addr, len) = (self.addr(first), (count * PAGE) as u64);
            retry_eagain(|| self.uffd.writeprotect(addr, len, protect, false))?;
        }
        Ok(())
    }

    /// Drops every run, in as few calls (TLB shootdowns) as the region's memory
    /// allows ([`RegionMemory::drop_page_runs`]), telling the remove-event handler
    /// which drops are ours (it consumes the record when the event arrives).
    ///
    /// # Errors
    /// The runs dropped before the failure (from the first) and the error.
    fn drop_runs(&self, rs: &[(usize, usize)]) -> Result<(), (usize, io::Error)> {
        let tracked = self.cfg.track_remove && self.mem.drop_raises_remove_event();
        let span = |&(first, count): &(usize, usize)| (self.addr(first), self.addr(first + count));
        if tracked {
            lock(&self.own_drops).extend(rs.iter().map(span));
        }
        let r = self.mem.drop_page_runs(rs);
        if let (true, Err((done, _))) = (tracked, &r) {
            // The runs not dropped raise no event: forget their records.
            let mut own = lock(&self.own_drops);
            for s in rs[*done..].iter().map(span) {
                if let Some(k) = own.iter().position(|&x| x == s) {
                    own.swap_remove(k);
                }
            }
        }
        r
    }

    fn evict_batch(&self, mut pages: Vec<usize>) {
        pages.sort_unstable();
        pages.dedup();
        // 1. Claim the pages that are resident, and the pages on probation (stored
        //    from their copies); tell the placement about the others that it
        //    believes will leave but cannot.
        let mut claimed = Vec::with_capacity(pages.len());
        let mut expiring = Vec::new();
        let mut refused = Vec::new();
        {
            let mut t = lock(&self.table);
            for p in pages {
                match t.st[p] {
                    St::Resident => {
                        t.st[p] = St::Evicting;
                        claimed.push(p);
                    }
                    // Unmapped already, their contents in the stash: stored from there. (A
                    // sampled victim refused instead was put back in fast memory above
                    // the allocation, and the epoch demotes at most R such pages: a GUPS
                    // thrashing beside a KV store held 36 MiB with 7 MiB allotted.)
                    St::Probation | St::Sampled => {
                        let data = t.stash.remove(&p).expect("stashed page");
                        if t.st[p] == St::Sampled {
                            t.probation += 1;
                        }
                        t.st[p] = St::Expiring;
                        expiring.push((p, data));
                    }
                    St::SampleDrop
                    | St::SampleDropping
                    | St::ProbeDrop
                    | St::ProbeDropping
                    | St::Loading => refused.push(p),
                    // Leaving already (queued twice), gone, or freed.
                    St::Evicting
                    | St::Dropping
                    | St::Expiring
                    | St::Untouched
                    | St::Stored
                    | St::Freeing
                    | St::Lost => {}
                }
            }
        }
        if !refused.is_empty() {
            let mut pl = lock(&self.placement);
            for &p in &refused {
                pl.evict_failed(p);
            }
        }
        if !expiring.is_empty() {
            self.n.evict_batches.fetch_add(1, Ordering::Relaxed);
            self.expire(expiring);
        }
        if claimed.is_empty() {
            return;
        }
        self.evict_claimed(&claimed);
        // Pages the application freed meanwhile lose the copy just stored.
        self.finish_freed(&claimed, true);
    }

    /// Steps 2–7 of [`Inner::evict_batch`] for the pages it claimed (sorted).
    fn evict_claimed(&self, claimed: &[usize]) {
        self.n.evict_batches.fetch_add(1, Ordering::Relaxed);
        let rs = runs(claimed);
        let fail = |why: String, unprotect: bool| {
            if unprotect {
                let _ = self.protect_runs(&rs, false);
            }
            let mut t = lock(&self.table);
            for &p in claimed {
                if t.st[p] == St::Evicting {
                    t.st[p] = St::Resident;
                }
            }
            drop(t);
            self.n
                .evict_failures
                .fetch_add(claimed.len() as u64, Ordering::Relaxed);
            let mut pl = lock(&self.placement);
            for &p in claimed {
                pl.evict_failed(p);
            }
            drop(pl);
            self.note_error(why);
        };
        // 2. Write-protect: writers now wait for us.
        if let Err(e) = self.protect_runs(&rs, true) {
            fail(
                format!("write-protecting {} pages: {e}", claimed.len()),
                true,
            );
            return;
        }
        // 3. Copy out.
        let mut data = vec![0u8; claimed.len() * PAGE];
        for (k, &p) in claimed.iter().enumerate() {
            if let Err(e) = self.mem.read_page(p, &mut data[k * PAGE..(k + 1) * PAGE]) {
                fail(format!("reading page {p}: {e}"), true);
                return;
            }
        }
        // 4. Store, and wait for the slow tier's confirmation.
        let batch: Vec<(PageKey, &[u8])> = claimed
            .iter()
            .enumerate()
            .map(|(k, &p)| (self.key(p), &data[k * PAGE..(k + 1) * PAGE]))
            .collect();
        if let Err(e) = self.tier.store_batch(&batch) {
            // Some may be held all the same (a remote batch cut short).
            self.note_stale(claimed);
            fail(format!("storing {} pages: {e}", claimed.len()), true);
            return;
        }
        // 5. Confirmed: the slow tier holds them. (Pages the application freed
        //    meanwhile wait, faults included, for the caller to drop their copy.)
        {
            let mut t = lock(&self.table);
            for (k, &p) in claimed.iter().enumerate() {
                if t.st[p] == St::Evicting {
                    t.crc[p] = Some(checksum(&data[k * PAGE..(k + 1) * PAGE]));
                    t.st[p] = St::Dropping;
                    t.resident -= 1;
                    t.stored += 1;
                }
            }
        }
        self.forget_stale(claimed);
        // 6. Drop from memory, every run in one call where the memory allows (one
        //    TLB shootdown); only then are they stored. Runs a failed drop did not
        //    reach are still mapped: they stay resident (the copy is harmless).
        let dropped = self.drop_runs(&rs);
        let done = match &dropped {
            Ok(()) => rs.len(),
            Err((done, _)) => *done,
        };
        let (gone, kept) = rs.split_at(done);
        let mut evicted = 0u64;
        let mut reverted = Vec::new();
        {
            let mut t = lock(&self.table);
            for &(first, count) in gone {
                for p in first..first + count {
                    if t.st[p] == St::Dropping {
                        t.st[p] = St::Stored;
                        t.stamp_eviction(p);
                        evicted += 1;
                    }
                }
            }
            for &(first, count) in kept {
                for p in first..first + count {
                    if t.st[p] == St::Dropping {
                        t.st[p] = St::Resident;
                        t.resident += 1;
                        t.stored -= 1;
                        reverted.push(p);
                    }
                }
            }
        }
        // Still mapped, and stored too: the stored copy is harmless while the page is
        // mapped, and dropped if the application frees the page.
        self.note_stale(&reverted);
        if let Err((_, e)) = &dropped {
            let _ = self.protect_runs(kept, false);
            self.n
                .evict_failures
                .fetch_add(reverted.len() as u64, Ordering::Relaxed);
            let mut pl = lock(&self.placement);
            for &p in &reverted {
                pl.evict_failed(p);
            }
            drop(pl);
            self.note_error(format!("dropping evicted pages: {e}"));
        }
        // 7. Unprotect and wake writers, and faults left waiting on the drop: they
        //    find the pages stored and fault them back in. Where the drop cleared the
        //    protection with the page (anonymous memory), waking is enough and costs
        //    no TLB shootdown.
        if self.mem.drop_clears_write_protect() {
            for &(first, count) in gone {
                let _ = self.uffd.wake(self.addr(first), (count * PAGE) as u64);
            }
        } else if let Err(e) = self.protect_runs(gone, false) {
            self.note_error(format!("unprotecting evicted pages: {e}"));
        }
        self.n.evictions.fetch_add(evicted, Ordering::Relaxed);
    }

    /// Stores pages evicted from probation (or sampled) from their copies (no
    /// protect or drop: they are unmapped already), then wakes the faults that waited
    /// for them. A failed store puts them on probation (still in local memory).
    fn expire(&self, pages: Vec<(usize, Box<[u8]>)>) {
        let batch: Vec<(PageKey, &[u8])> =
            pages.iter().map(|(p, d)| (self.key(*p), &d[..])).collect();
        let stored = self.tier.store_batch(&batch);
        drop(batch);
        let mut evicted = 0u64;
        let mut failed = Vec::new();
        let mut freed = Vec::new();
        let mut stored_pages = Vec::new();
        let waiters = {
            let mut t = lock(&self.table);
            for (p, data) in pages {
                if t.st[p] != St::Expiring {
                    // Freed meanwhile (freeing: its faults wait): the copy just
                    // stored is dropped below, so that it cannot outlive the page.
                    freed.push(p);
                    continue;
                }
                if stored.is_ok() {
                    stored_pages.push(p);
                    t.crc[p] = Some(checksum(&data));
                    t.st[p] = St::Stored;
                    t.stamp_eviction(p);
                    t.resident -= 1;
                    t.probation -= 1;
                    t.stored += 1;
                    evicted += 1;
                } else {
                    t.stash.insert(p, data);
                    t.st[p] = St::Probation;
                    failed.push(p);
                }
            }
            std::mem::take(&mut t.expiring_waiters)
        };
        if stored.is_ok() {
            self.forget_stale(&stored_pages);
        } else {
            self.note_stale(&failed);
        }
        // (A failed batch may have stored some all the same: drop theirs either way.)
        self.finish_freed(&freed, true);
        // Stored: their shadow copies are not needed any more. (Freed ones had theirs
        // dropped by the remove event.)
        for &p in &stored_pages {
            self.shadow_forget(p);
        }
        for p in waiters {
            let _ = self.uffd.wake(self.addr(p), PAGE as u64);
        }
        self.n.evictions.fetch_add(evicted, Ordering::Relaxed);
        self.n
            .probation_evictions
            .fetch_add(evicted, Ordering::Relaxed);
        if let Err(e) = stored {
            self.n
                .evict_failures
                .fetch_add(failed.len() as u64, Ordering::Relaxed);
            let mut pl = lock(&self.placement);
            for &p in &failed {
                pl.evict_failed(p);
            }
            drop(pl);
            self.note_error(format!(
                "storing {} pages from probation: {e}",
                failed.len()
            ));
        }
    }

    /// Tops probation up (see [`TierConfig::probation_pages`]): the placement's next
    /// victims that are mapped are unmapped, their contents kept here. Called by the
    /// eviction workers after each batch, so a region that never evicts has none.
    fn refill_probation(&self) {
        let most = self.cfg.probation_pages;
        if most == 0 || !self.cfg.sample_drop {
            return;
        }
        let (held, want) = {
            let t = lock(&self.table);
            let cap = most.min((t.resident / 8) as usize);
            (
                t.probation as usize,
                cap.saturating_sub(t.probation as usize),
            )
        };
        if want == 0 {
            return;
        }
        // The next victims start with the pages on probation already (coldest first).
        let next = lock(&self.placement).next_victims(held + want + 16);
        let chosen: Vec<usize> = {
            let mut t = lock(&self.table);
            let mut chosen: Vec<usize> = next
                .into_iter()
                .filter(|&p| p < self.pages && t.st[p] == St::Resident)
                .take(want)
                .collect();
            chosen.sort_unstable();
            for &p in &chosen {
                t.st[p] = St::ProbeDrop;
            }
            t.probation += chosen.len() as u64;
            chosen
        };
        if chosen.is_empty() {
            return;
        }
        let failed = self.stash_out(&chosen, Stash::Probation);
        self.n
            .probation_entries
            .fetch_add((chosen.len() - failed.len()) as u64, Ordering::Relaxed);
    }

    fn sample_begin(&self) -> Vec<usize> {
        if lock(&self.table).window.is_some() {
            self.sample_end();
        }
        // Choose, and open the window at once: a hit may come as soon as the first
        // run is dropped.
        let (chosen, resident) = {
            let mut t = lock(&self.table);
            let k = self.sample_size();
            let mut rng = lock(&self.rng);
            // Mostly resident (the common case): draw, never list every page.
            let drawn = if t.resident as usize * 4 >= self.pages {
                choose_by_rejection(&mut rng, self.pages, k, 64 * k + 1024, |p| {
                    t.st[p] == St::Resident
                })
            } else {
                None
            };
            let chosen = drawn.unwrap_or_else(|| {
                let resident_pages: Vec<usize> = (0..self.pages)
                    .filter(|&p| t.st[p] == St::Resident)
                    .collect();
                choose(&mut rng, &resident_pages, k)
            });
            drop(rng);
            if !self.cfg.sample_drop {
                drop(t);
                for run in runs(&chosen) {
                    let _ = self.protect_runs(&[run], true);
                    let _ = self.protect_runs(&[run], false);
                }
                return Vec::new();
            }
            for &p in &chosen {
                t.st[p] = St::SampleDrop;
            }
            // The sample frame: resident pages the sampler can draw (pages on
            // probation are not; their touches are counted exactly as hits).
            let resident = t.resident - t.probation;
            // Re-arm only while the region has slow accesses (see
            // `TierConfig::sample_rearm`).
            let rearm = self.cfg.sample_rearm && lock(&self.sizing).slow > 0.0;
            t.window = Some(Window {
                sampled: chosen.clone(),
                resident,
                hits: 0,
                touched: HashSet::new(),
                rearm,
                rearmed: 0,
            });
            (chosen, resident)
        };
        let failed = self.stash_out(&chosen, Stash::Sample);
        let sampled: Vec<usize> = if failed.is_empty() {
            chosen
        } else {
            chosen.into_iter().filter(|p| !failed.contains(p)).collect()
        };
        if let Some(w) = lock(&self.table).window.as_mut() {
            w.sampled.clone_from(&sampled);
        }
        let p = if resident > 0 {
            (sampled.len() as f64 / resident as f64).min(1.0)
        } else {
            1.0
        };
        self.slow_sample_p.store(p.to_bits(), Ordering::Relaxed);
        sampled
    }

    /// Copies `chosen` (sorted pages the caller moved to the first state of `kind`)
    /// aside and drops them from memory, in groups of up to [`SAMPLE_GROUP`] runs:
    /// protect each run, copy its pages aside, drop the group's runs in one call (one
    /// TLB shootdown where the memory allows it, instead of one per run), then lift
    /// the protection (or, where the drop cleared it, just wake the writers that
    /// waited). A thread touching one of the pages waits for its group only. The
    /// pages end sampled or on probation, their copies in the stash; returns the
    /// pages that could not be (left resident).
    fn stash_out(&self, chosen: &[usize], kind: Stash) -> Vec<usize> {
        let (drop_st, dropping_st, done_st) = kind.states();
        let wp_cleared = self.mem.drop_clears_write_protect();
        let mut failed: Vec<usize> = Vec::new();
        let revert = |rs: &[(usize, usize)], failed: &mut Vec<usize>, why: String| {
            let mut t = lock(&self.table);
            for &(first, count) in rs {
                for p in first..first + count {
                    if t.st[p] == drop_st || t.st[p] == dropping_st {
                        if t.stash.remove(&p).is_some() {
                            self.shadow_forget(p);
                        }
                        t.st[p] = St::Resident;
                        if kind == Stash::Probation {
                            t.probation -= 1;
                        }
                    }
                    failed.push(p);
                }
            }
            drop(t);
            let _ = self.protect_runs(rs, false);
            self.note_error(format!("{}: {why}", kind.what()));
        };
        let all_runs = runs(chosen);
        for group in all_runs.chunks(SAMPLE_GROUP) {
            let mut ready: Vec<(usize, usize)> = Vec::with_capacity(group.len());
            let mut copies: Vec<(usize, Box<[u8]>)> = Vec::new();
            for &run in group {
                if let Err(e) = self.protect_runs(&[run], true) {
                    revert(
                        &[run],
                        &mut failed,
                        format!("write-protecting page {}: {e}", run.0),
                    );
                    continue;
                }
                let mut mine = Vec::with_capacity(run.1);
                let mut read_ok = true;
                for p in run.0..run.0 + run.1 {
                    let mut b = vec![0u8; PAGE].into_boxed_slice();
                    if let Err(e) = self.mem.read_page(p, &mut b) {
                        revert(&[run], &mut failed, format!("reading page {p}: {e}"));
                        read_ok = false;
                        break;
                    }
                    // The copy outlives this agent before the page leaves the region.
                    if let Err(e) = self.shadow_write(p, &b) {
                        for &(q, _) in &mine {
                            self.shadow_forget(q);
                        }
                        revert(&[run], &mut failed, format!("shadowing page {p}: {e}"));
                        read_ok = false;
                        break;
                    }
                    mine.push((p, b));
                }
                if read_ok {
                    ready.push(run);
                    copies.extend(mine);
                }
            }
            if ready.is_empty() {
                continue;
            }
            {
                let mut t = lock(&self.table);
                for (p, b) in copies {
                    if t.st[p] == drop_st {
                        t.stash.insert(p, b);
                        t.st[p] = dropping_st;
                    } else {
                        // Freed meanwhile (its remove event came after the shadow
                        // write): the copy must not outlive it.
                        self.shadow_forget(p);
                    }
                }
            }
            let done = match self.drop_runs(&ready) {
                Ok(()) => ready.len(),
                Err((done, e)) => {
                    // Still mapped: nothing to sample or test there.
                    revert(
                        &ready[done..],
                        &mut failed,
                        format!("dropping page {}: {e}", ready[done].0),
                    );
                    done
                }
            };
            let dropped = &ready[..done];
            {
                let mut t = lock(&self.table);
                for &(first, count) in dropped {
                    for p in first..first + count {
                        if t.st[p] == dropping_st {
                            t.st[p] = done_st;
                        }
                    }
                }
            }
            if wp_cleared {
                for &(first, count) in dropped {
                    let _ = self.uffd.wake(self.addr(first), (count * PAGE) as u64);
                }
            } else {
                let _ = self.protect_runs(dropped, false);
            }
        }
        // Pages the application freed meanwhile: their faults waited for the drop.
        self.finish_freed(chosen, false);
        failed
    }

    fn sample_rearm(&self) -> bool {
        let chosen: Vec<usize> = {
            let mut t = lock(&self.table);
            let t = &mut *t;
            let Some(w) = t.window.as_mut() else {
                return false;
            };
            if !w.rearm {
                return false;
            }
            // Hit since armed, put back, and still plain resident (not evicted,
            // freed or put on probation meanwhile).
            let mut chosen: Vec<usize> = w
                .touched
                .iter()
                .copied()
                .filter(|&p| t.st[p] == St::Resident)
                .collect();
            chosen.sort_unstable();
            for &p in &chosen {
                t.st[p] = St::SampleDrop;
            }
            w.rearmed += chosen.len() as u64;
            chosen
        };
        if !chosen.is_empty() {
            // A page that cannot be re-armed stays resident; its later touches in
            // the window are not seen (an undercount of that page only).
            self.stash_out(&chosen, Stash::Sample);
        }
        true
    }

    fn sample_end(&self) -> WindowEstimate {
        let mut t = lock(&self.table);
        let Some(w) = t.window.take() else {
            return WindowEstimate::default();
        };
        for &p in &w.sampled {
            if t.st[p] != St::Sampled {
                continue;
            }
            let data = t.stash.remove(&p).expect("stashed sampled page");
            match self.uffd.copy(self.addr(p), &data, false) {
                Ok(_) => {
                    t.st[p] = St::Resident;
                    self.shadow_forget(p);
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    t.st[p] = St::Resident;
                    self.shadow_forget(p);
                }
                Err(e) => {
                    // Leave it sampled: its fault will put it back.
                    t.stash.insert(p, data);
                    tracing::debug!(page = p, error = %e, "tier: putting a sampled page back");
                }
            }
        }
        drop(t);
        let est = WindowEstimate {
            resident: w.resident,
            sampled: w.sampled.len() as u64,
            hits: w.hits,
            pages_hit: w.touched.len() as u64,
        };
        lock(&self.epoch).fast += est.estimate();
        {
            let slow = self.window_slow.swap(0, Ordering::Relaxed);
            let mut z = lock(&self.sizing);
            z.sampled = 0.75 * z.sampled + est.sampled as f64;
            // The hit share sizes the sample: distinct pages, at most 1.
            z.hits = 0.75 * z.hits + est.pages_hit as f64;
            z.slow = 0.75 * z.slow + slow as f64;
            z.fast = 0.75 * z.fast + est.estimate();
            z.windows += 1;
        }
        self.n.sample_windows.fetch_add(1, Ordering::Relaxed);
        est
    }

    /// Pages to sample in the next window (see [`TierConfig::sample_target_hits`]
    /// and [`TierConfig::sample_fmmr_error`]).
    fn sample_size(&self) -> usize {
        let z = lock(&self.sizing);
        tiering::sample_size(
            self.cfg.sample_pages,
            self.cfg.sample_target_hits,
            self.cfg.sample_fmmr_error,
            &SampleHistory {
                sampled: z.sampled,
                hits: z.hits,
                slow: z.slow,
                fast: z.fast,
                windows_per_epoch: z.windows_per_epoch,
            },
        )
    }

    /// Reads pending events after the fault thread stopped: remove events are
    /// handled (a pending one makes every map ioctl fail with `EAGAIN`); faults are
    /// left waiting, for the copy of their page or the unregistration to wake them.
    fn pump_events(&self) {
        if let Ok(events) = self.uffd.read_events() {
            for ev in events {
                if let Event::Remove { start, end } = ev {
                    if self.cfg.track_remove {
                        self.on_remove(start, end);
                    }
                }
            }
        }
    }

    /// Maps `data` at page `p` from the stopping thread, pumping events while the
    /// kernel answers `EAGAIN`.
    fn restore_copy(&self, p: usize, data: &[u8]) -> io::Result<()> {
        for _ in 0..10_000 {
            match self.uffd.copy(self.addr(p), data, false) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => return Ok(()),
                Err(e) if is_eagain(&e) => {
                    self.pump_events();
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::from_raw_os_error(libc::EAGAIN))
    }

    fn restore_all(&self) -> Result<(), String> {
        if let Some(why) = lock(&self.fatal).clone() {
            return Err(why);
        }
        self.pump_events();
        let mut buf = vec![0u8; PAGE];
        for p in 0..self.pages {
            let st = lock(&self.table).st[p];
            match st {
                St::Sampled | St::Probation => {
                    let Some(data) = lock(&self.table).stash.remove(&p) else {
                        continue;
                    };
                    self.restore_copy(p, &data)
                        .map_err(|e| format!("putting page {p} back from its copy: {e}"))?;
                    self.shadow_forget(p);
                    let mut t = lock(&self.table);
                    if t.st[p] == st {
                        t.st[p] = St::Resident;
                        if st == St::Probation {
                            t.probation -= 1;
                        }
                    }
                }
                St::Stored => {
                    let crc = lock(&self.table).crc[p];
                    self.load_checked(p, crc, &mut buf)
                        .map_err(|e| format!("bringing page {p} back: {e}"))?;
                    self.restore_copy(p, &buf)
                        .map_err(|e| format!("mapping page {p} back: {e}"))?;
                    let mut t = lock(&self.table);
                    if t.st[p] == St::Stored {
                        t.st[p] = St::Resident;
                        t.stored -= 1;
                        t.resident += 1;
                    }
                }
                St::Lost => return Err(format!("page {p} was lost")),
                _ => {}
            }
        }
        let _ = self.tier.remove_region(self.cfg.region_id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_warnings_are_rate_limited_and_count_the_suppressed() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut log = ErrorLog::default();
        assert_eq!(log.note(t0), Some(0));
        assert_eq!(log.note(ms(1)), None);
        assert_eq!(log.note(ms(999)), None);
        // A second after the last warning: logged, with the two in between.
        assert_eq!(log.note(ms(1000)), Some(2));
        assert_eq!(log.note(ms(1500)), None);
        assert_eq!(log.note(ms(2000)), Some(1));
        // A quiet spell: the next one is logged at once, nothing suppressed.
        assert_eq!(log.note(ms(60_000)), Some(0));
    }
}
