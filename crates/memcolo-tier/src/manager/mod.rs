//! The tier manager of one managed region (MaxMem §3.3, on far memory): a fault
//! thread that fills pages, eviction workers that move cold pages to the slow tier
//! in batches, and the access sampler of [`crate::sampler`].
//!
//! Each page of the region is in one of the states of [`crate::page_state`], and
//! moves between them only through its transition table (`Table::apply`).
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
//!
//! # Files
//!
//! - this file: the manager's public face ([`TierManager`], [`Placement`]), the page
//!   table and the shared state of the threads (`Inner`);
//! - `config`: [`TierConfig`]; `stats`: [`ManagerStats`] and the counters;
//! - `fault`: the fault thread (faults, prefetches);
//! - `evict`: the eviction queue and workers, and storing from probation;
//! - `stash`: sampling windows and probation (pages copied aside and dropped);
//! - `free`: application frees and the slow-tier copies they leave behind;
//! - `recovery`: taking a region over (adopted, recovered) and giving it back at
//!   shutdown;
//! - `sched`: the scheduling of the manager's threads.
//!
//! # Locks
//!
//! `Inner` holds its mutable state under a few mutexes, taken in this order and
//! never the other way round: the page table (`table`), then the placement
//! (`placement`), then any of the leaf locks (`accesses`, `rng`, `copies`, `errors`,
//! `own_drops`, `worker_tids`), of which a thread holds at most one at a time. The
//! eviction queue (`queue`, with its condition variables) is taken alone. No lock is
//! held across a slow-tier store or load; userfaultfd calls and shadow updates are
//! made under at most the table lock, or (the shadow's taint and journal) under
//! `copies`. (There were fourteen locks; those that were never held together are
//! merged: the epoch's accesses and the sample sizing into `accesses`, the fatal and
//! last errors and their rate limit into `errors`, the stale, pending and deferred
//! copies into `copies`.)

mod config;
mod evict;
mod fault;
mod free;
mod recovery;
mod sched;
mod stash;
mod stats;

pub use config::TierConfig;
pub use stats::ManagerStats;

use crate::page_state::{transition, PageEvent, PageState};
use crate::region::{RegionMemory, PAGE};
use crate::sampler::{Rng, WindowEstimate};
use crate::shadow::Shadow;
use crate::uffd::Uffd;
use crate::{PageKey, SlowTier, TierError};
use evict::Queue;
use free::Copies;
use memcolo_policy::tiering;
use stash::{Accesses, Window};
use stats::Counters;
use std::collections::HashMap;
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

/// The page table of a region: each page's state (moved only by [`Table::apply`]),
/// the gauges that follow from the states, and the copies held in local memory.
struct Table {
    st: Vec<PageState>,
    /// The CRC-32 of each stored page, taken when it was stored; `None` for a page
    /// recovered from the slow tier after an agent died (its backend's checksum
    /// still guards it).
    crc: Vec<Option<u32>>,
    /// Pages held in local memory (mapped, sampled, or on probation:
    /// [`PageState::held_locally`]).
    resident: u64,
    /// Pages counted in the slow tier ([`PageState::in_slow_tier`]).
    stored: u64,
    /// Pages on probation ([`PageState::on_probation`]): held in local memory but
    /// out of the sampler's reach.
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
    /// A table of `pages` untouched pages.
    fn new(pages: usize) -> Self {
        Table {
            st: vec![PageState::Untouched; pages],
            crc: vec![None; pages],
            evicted_at: vec![0; pages],
            evict_seq: 0,
            resident: 0,
            stored: 0,
            probation: 0,
            expiring_waiters: Vec::new(),
            stash: HashMap::new(),
            window: None,
        }
    }

    /// Moves page `p` on `event` by the transition table of [`crate::page_state`]
    /// and updates the gauges (`resident`, `stored`, `probation`) to match; returns
    /// the page's new state. A move the table does not list is a defect of the
    /// manager: it fails a debug assertion, and in a release build is logged and
    /// leaves the page as it was.
    fn apply(&mut self, p: usize, event: PageEvent) -> PageState {
        let from = self.st[p];
        let to = match transition(from, event) {
            Ok(to) => to,
            Err(e) => {
                debug_assert!(false, "page {p}: {e}");
                tracing::error!(page = p, error = %e, "tier: page table");
                return from;
            }
        };
        self.st[p] = to;
        let gauge = |g: &mut u64, was: bool, is: bool| match (was, is) {
            (false, true) => *g += 1,
            (true, false) => *g -= 1,
            _ => {}
        };
        gauge(&mut self.resident, from.held_locally(), to.held_locally());
        gauge(&mut self.stored, from.in_slow_tier(), to.in_slow_tier());
        gauge(&mut self.probation, from.on_probation(), to.on_probation());
        to
    }

    /// Moves page `p` on `event` if it is in state `from` (see [`Table::apply`]);
    /// whether it was.
    fn apply_if(&mut self, p: usize, from: PageState, event: PageEvent) -> bool {
        if self.st[p] != from {
            return false;
        }
        self.apply(p, event);
        true
    }

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

/// What a region's threads share. For the order its locks are taken in, see the
/// module documentation, "Locks".
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
    /// The epoch's accesses, and what past windows tell about the next one's sample
    /// size.
    accesses: Mutex<Accesses>,
    rng: Mutex<Rng>,
    /// The manager's own drops whose remove event is still to come (address ranges).
    own_drops: Mutex<Vec<(u64, u64)>>,
    /// Probability (f64 bits) that a slow fault enters the per-page samples: the
    /// current window's k/R.
    slow_sample_p: AtomicU64,
    /// Slow faults since the current window opened.
    window_slow: AtomicU64,
    stop: AtomicBool,
    /// Stops the fault thread, once the eviction workers have stopped (a drop of
    /// theirs may wait for the fault thread to read its remove event).
    stop_faults: AtomicBool,
    wake_fd: OwnedFd,
    /// Why the process must be stopped, the last non-fatal error, and the rate limit
    /// of their warnings.
    errors: Mutex<Errors>,
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
    /// Slow-tier copies that outlive their page's move (see [`free::Copies`]).
    copies: Mutex<Copies>,
}

/// A region's errors (see [`TierManager::fatal`], [`TierManager::last_error`]).
#[derive(Debug, Default)]
struct Errors {
    fatal: Option<String>,
    last: Option<String>,
    /// Rate limit of the warnings for [`Inner::note_error`].
    log: ErrorLog,
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
            table: Mutex::new(Table::new(pages)),
            queue: Mutex::new(Queue::new()),
            queue_cv: Condvar::new(),
            idle_cv: Condvar::new(),
            placement: Mutex::new(placement),
            accesses: Mutex::new(Accesses::default()),
            rng: Mutex::new(Rng::new(cfg.seed)),
            own_drops: Mutex::new(Vec::new()),
            slow_sample_p: AtomicU64::new(1.0f64.to_bits()),
            window_slow: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            stop_faults: AtomicBool::new(false),
            wake_fd,
            errors: Mutex::new(Errors::default()),
            n: Counters::default(),
            fault_tid: AtomicI32::new(0),
            latency_critical: AtomicBool::new(false),
            worker_tids: Mutex::new(Vec::new()),
            nice: AtomicI32::new(0),
            idle: AtomicBool::new(false),
            discard_on_drop: AtomicBool::new(false),
            shadow,
            copies: Mutex::new(Copies::default()),
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
        let mut a = lock(&self.inner.accesses);
        a.sizing.history.windows_per_epoch = a.sizing.windows;
        a.sizing.windows = 0;
        let e = std::mem::take(&mut a.epoch);
        drop(a);
        EpochAccesses {
            fast: e.fast,
            slow: e.slow,
            pages: e.pages.into_iter().collect(),
        }
    }

    /// Why the process must be stopped, once a page could not be brought back.
    pub fn fatal(&self) -> Option<String> {
        lock(&self.inner.errors).fatal.clone()
    }

    /// The last non-fatal error (a failed eviction or prefetch), for logs.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.inner.errors).last.clone()
    }

    /// Pages in a transient state (evicting, dropping, loading, being sampled, lost),
    /// with their state, for diagnosing a stuck region.
    pub fn transient_pages(&self) -> Vec<(usize, String)> {
        let t = lock(&self.inner.table);
        t.st.iter()
            .enumerate()
            .filter(|(_, s)| s.is_transient())
            .map(|(i, s)| (i, format!("{s:?}")))
            .collect()
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
        lock(&self.errors).fatal.get_or_insert(why);
    }

    /// Records a failed step (kept as [`TierManager::last_error`]) and warns, at most
    /// once a second per region (see [`ErrorLog`]).
    fn note_error(&self, why: String) {
        let mut errors = lock(&self.errors);
        if let Some(suppressed) = errors.log.note(Instant::now()) {
            tracing::warn!(region = self.cfg.region_id, error = %why, suppressed, "tier");
        }
        errors.last = Some(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gauges_follow_the_moves_of_the_table() {
        use PageEvent as E;
        let mut t = Table::new(4);
        let gauges = |t: &Table| (t.resident, t.stored, t.probation);
        t.apply(0, E::ZeroFill);
        t.apply(1, E::Adopt);
        t.apply(2, E::ZeroFill);
        assert_eq!(gauges(&t), (3, 0, 0));
        // Evicted: stored once confirmed, still stored once dropped.
        t.apply(0, E::Evict);
        assert_eq!(t.apply(0, E::StoreConfirmed), PageState::Dropping);
        assert_eq!(gauges(&t), (2, 1, 0));
        t.apply(0, E::Dropped);
        assert_eq!(gauges(&t), (2, 1, 0));
        // On probation, then stored from its copy.
        t.apply(1, E::Probe);
        t.apply(1, E::Copied);
        t.apply(1, E::Dropped);
        assert_eq!(gauges(&t), (2, 1, 1));
        t.apply(1, E::Evict);
        t.apply(1, E::StoreConfirmed);
        assert_eq!(gauges(&t), (1, 2, 0));
        // Brought back, then freed; a lost page stays counted as stored.
        t.apply(0, E::LoadBegin);
        t.apply(0, E::LoadDone);
        assert_eq!(gauges(&t), (2, 1, 0));
        t.apply(2, E::Free);
        assert_eq!(gauges(&t), (1, 1, 0));
        t.apply(1, E::LoadBegin);
        t.apply(1, E::LoadLost);
        assert_eq!(gauges(&t), (1, 1, 0));
        assert!(t.apply_if(0, PageState::Resident, E::Sample));
        assert!(!t.apply_if(0, PageState::Resident, E::Sample));
        assert_eq!(t.st[0], PageState::SampleDrop);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "illegal page transition")]
    fn an_illegal_move_fails_a_debug_assertion() {
        let mut t = Table::new(1);
        // An untouched page was never stored: it cannot be loaded.
        t.apply(0, PageEvent::LoadBegin);
    }

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
