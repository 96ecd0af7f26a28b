//! A tier node: the managed regions of one or more processes sharing one fast tier
//! under the MaxMem policy (MaxMem §3.1–§3.3), and the loop that drives it.
//!
//! The node owns the policy ([`MaxMem`], behind a mutex shared with every region's
//! [`MaxMemPlacement`](crate::placement::MaxMemPlacement)) and a table of regions, each a [`TierManager`] of one
//! process. Policy page ids are a region's start address divided by [`PAGE`] plus the
//! page's index, so the regions of one process never collide, and a victim the
//! policy picks in another region of the same process is routed to that region's
//! manager.
//!
//! # Epochs and windows
//!
//! The fast-tier access estimator ([`crate::sampler`]) works in sampling windows;
//! the policy in epochs of several windows (MaxMem §3.1: 1 s). [`TierNode::window`]
//! closes every region's window and opens the next; [`TierNode::epoch`] closes the
//! windows, hands the epoch's accesses of every process to [`MaxMem::step`]
//! (`a_fast` = the windows' estimates, rounded; `a_slow` = the exact count of slow
//! faults; per-page samples = sample hits and slow faults), carries out the
//! migrations it returns and opens new windows. Migrations run in the policy's
//! order: every demotion is queued, and the promotions it makes room for are brought
//! in ([`TierManager::prefetch`]) at the first drain that finds those demotions done
//! (not the fault victims queued after them): the policy thread never waits for a
//! donor's eviction worker, which runs at nice 19 for a best-effort process; a
//! promotion that fails
//! (the slow tier could not load the page) is reported back to the policy, which
//! then counts the page in the slow tier again. [`TierNode::run`] repeats windows
//! and epochs on a clock until told to stop.
//!
//! # Locks
//!
//! No fault takes the policy's lock. Each region's placement
//! ([`QueuedPlacement`]) queues what its faults did on a lock-free queue of its own,
//! takes fast memory from atomic credits and victims from a per-region list
//! ([`Feed`]); [`TierNode::drain`] (every slot of [`TierNode::run`], 10 ms, and
//! before every epoch) applies the records to the policy in order, evicts the
//! victims the policy names where a region's list ran dry or was stale
//! ([`MaxMem::fault_in_after`]), and publishes fresh credits and lists. A
//! best-effort process's fault thread, at nice 19, thus never holds a lock that the
//! latency-critical process's fault thread or the sampler waits for.
//!
//! The sampler visits latency-critical regions first (window ends and starts, slot
//! re-arms), so a window of theirs never waits behind a best-effort region's table
//! lock, held by that region's fault thread while it maps a page.
//!
//! The region table is only held to copy it: managers are called without it.

use crate::manager::TierManager;
use crate::placement::{Feed, QueuedPlacement, Record};
use crate::region::PAGE;
use crate::TierError;
use crossbeam_channel::Receiver;
use memcolo_policy::maxmem::{EpochOutcome, MaxMem, MaxMemConfig, PageId, ProcSample, Tier};
use memcolo_policy::{Pid, PolicyError};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One managed region as the node knows it.
#[derive(Clone)]
struct Entry {
    pid: Pid,
    first_page: PageId,
    pages: usize,
    manager: Arc<TierManager>,
    /// What the region's faults did, for the policy ([`TierNode::drain`]).
    records: Receiver<Record>,
    /// The region's next victims.
    feed: Arc<Feed>,
}

impl Entry {
    fn holds(&self, pid: Pid, page: PageId) -> Option<usize> {
        if pid != self.pid {
            return None;
        }
        let i = page.checked_sub(self.first_page)?;
        (i < self.pages as u64).then_some(i as usize)
    }
}

type Table = Arc<Mutex<Vec<Entry>>>;

/// One process's accesses of an epoch: estimated fast, exact slow, per-page samples.
type Accesses = (f64, u64, Vec<(PageId, u32)>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Timing of [`TierNode::run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeTiming {
    /// Length of a sampling window (50 ms).
    pub window: Duration,
    /// Windows per policy epoch (20: an epoch of 1 s, MaxMem §3.1).
    pub windows_per_epoch: u32,
    /// Slots per window (5: 10 ms slots): while a region re-arms its sample
    /// ([`TierManager::sample_rearm`]), the sampled pages touched are re-armed at
    /// every slot boundary, so fast accesses are counted per slot, not per window.
    /// 1: no re-arming.
    pub slots_per_window: u32,
}

impl Default for NodeTiming {
    fn default() -> Self {
        NodeTiming {
            window: Duration::from_millis(50),
            windows_per_epoch: 20,
            slots_per_window: 5,
        }
    }
}

/// What one epoch did, besides the policy's own outcome.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EpochApplied {
    /// Demotions queued (pages).
    pub demoted: u64,
    /// Promotions brought in (pages; pages that were not in the slow tier any more
    /// are skipped and not counted).
    pub promoted: u64,
    /// Promotions whose load failed: `(pid, policy page, error)`.
    pub failed: Vec<(Pid, PageId, String)>,
    /// Migrations naming a page of no attached region (the region left meanwhile).
    pub unrouted: u64,
    /// Regions that turned fatal: `(pid, first policy page, reason)`.
    pub fatal: Vec<(Pid, PageId, String)>,
}

/// Promotions of one region: `(pid, first policy page, manager, region pages)`.
type Promotion = (Pid, PageId, Arc<TierManager>, Vec<usize>);
/// Promotions waiting for the demotions (manager, ticket) that make room for them.
type Deferred = (Vec<(Arc<TierManager>, u64)>, Vec<Promotion>);

/// A region's queue and feed between [`TierNode::placement`] and [`TierNode::attach`].
type Pending = HashMap<(Pid, PageId), (Receiver<Record>, Arc<Feed>)>;

/// Smallest and largest victim list a region is given (pages); in between, what its
/// probation reads ([`Feed::wanted`]) plus 256 plus four drains' worth of the victims
/// it took.
const FEED_MIN: usize = 256;
const FEED_MAX: usize = 4096;

/// Managed regions sharing one fast tier; see the module documentation.
pub struct TierNode {
    policy: Arc<Mutex<MaxMem>>,
    table: Table,
    pending: Mutex<Pending>,
    /// Each process's unfilled allocation, pages (credit its faults take).
    rooms: Mutex<HashMap<Pid, Arc<AtomicI64>>>,
    /// The free pool, pages (credit any fault takes).
    pool: Arc<AtomicI64>,
    /// Promotions waiting for their demotions ([`TierNode::epoch`]).
    deferred: Mutex<Vec<Deferred>>,
}

impl TierNode {
    /// A node whose fast tier and migration cap are given by `cfg`.
    ///
    /// # Errors
    /// [`PolicyError::InvalidConfig`] from [`MaxMemConfig::validate`].
    pub fn new(cfg: MaxMemConfig) -> Result<Self, PolicyError> {
        let free = cfg.fast_capacity_pages as i64;
        Ok(TierNode {
            policy: Arc::new(Mutex::new(MaxMem::try_new(cfg)?)),
            table: Arc::new(Mutex::new(Vec::new())),
            pending: Mutex::new(HashMap::new()),
            rooms: Mutex::new(HashMap::new()),
            pool: Arc::new(AtomicI64::new(free)),
            deferred: Mutex::new(Vec::new()),
        })
    }

    /// The policy, shared with the regions' placements.
    pub fn policy(&self) -> Arc<Mutex<MaxMem>> {
        self.policy.clone()
    }

    /// Locks the policy (for status and for reports), after applying the records
    /// queued so far ([`TierNode::drain`]).
    pub fn lock_policy(&self) -> MutexGuard<'_, MaxMem> {
        self.drain();
        lock(&self.policy)
    }

    /// Starts managing process `pid` with target FMMR `t_miss` (last in arrival
    /// order). A process must be registered before its first region is placed.
    ///
    /// # Errors
    /// As [`MaxMem::register`].
    pub fn register(&self, pid: Pid, t_miss: f64) -> Result<(), PolicyError> {
        lock(&self.policy).register(pid, t_miss)
    }

    /// Changes the target FMMR of `pid` from the next epoch on.
    ///
    /// # Errors
    /// As [`MaxMem::set_t_miss`].
    pub fn set_t_miss(&self, pid: Pid, t_miss: f64) -> Result<(), PolicyError> {
        lock(&self.policy).set_t_miss(pid, t_miss)
    }

    /// The policy page id of the first page of a region starting at address `base`.
    pub fn first_page_of(base: u64) -> PageId {
        base / PAGE as u64
    }

    /// The placement of a region of `pid` whose page `i` is policy page
    /// `first_page + i`, to hand to [`TierManager::start`] (then
    /// [`TierNode::attach`] the manager under the same `pid` and `first_page`). Its
    /// faults never take the policy's lock; see the module documentation.
    pub fn placement(&self, pid: Pid, first_page: PageId) -> QueuedPlacement {
        let (tx, rx) = crossbeam_channel::unbounded();
        let feed = Arc::new(Feed::default());
        lock(&self.pending).insert((pid, first_page), (rx, feed.clone()));
        let room = {
            let room = lock(&self.rooms)
                .entry(pid)
                .or_insert_with(|| Arc::new(AtomicI64::new(0)))
                .clone();
            room.store(lock(&self.policy).room_pages(pid) as i64, Ordering::Release);
            room
        };
        QueuedPlacement::new(tx, room, self.pool.clone(), feed)
    }

    /// Attaches a started manager: its region of `pid` starts at policy page
    /// `first_page` (as given to [`TierNode::placement`]).
    ///
    /// # Panics
    /// If no placement was made for `pid` and `first_page`.
    pub fn attach(&self, pid: Pid, first_page: PageId, manager: Arc<TierManager>) {
        let pages = manager.pages();
        let (records, feed) = lock(&self.pending)
            .remove(&(pid, first_page))
            .expect("TierNode::attach: no placement was made for this region");
        lock(&self.table).push(Entry {
            pid,
            first_page,
            pages,
            manager,
            records,
            feed,
        });
    }

    /// Detaches the region of `pid` starting at policy page `first_page`, and drops
    /// its pages from the policy (the region left management: `munmap`, or the
    /// process exited). Returns its manager, for the caller to stop.
    pub fn detach(&self, pid: Pid, first_page: PageId) -> Option<Arc<TierManager>> {
        let entry = {
            let mut t = lock(&self.table);
            let k = t
                .iter()
                .position(|e| e.pid == pid && e.first_page == first_page)?;
            t.swap_remove(k)
        };
        lock(&self.pending).remove(&(pid, first_page));
        self.forget_deferred(&entry.manager);
        let mut policy = lock(&self.policy);
        if policy.is_managed(pid) {
            for i in 0..entry.pages as u64 {
                let _ = policy.free_page(pid, first_page + i);
            }
        }
        Some(entry.manager)
    }

    /// Stops managing `pid`: detaches every region of it and returns its fast memory
    /// to the free pool (§3.1 "Process exit"). Returns the detached managers.
    pub fn unregister(&self, pid: Pid) -> Vec<Arc<TierManager>> {
        let mine: Vec<Entry> = {
            let mut t = lock(&self.table);
            let (mine, rest) = t.drain(..).partition(|e| e.pid == pid);
            *t = rest;
            mine
        };
        lock(&self.pending).retain(|k, _| k.0 != pid);
        lock(&self.rooms).remove(&pid);
        for e in &mine {
            self.forget_deferred(&e.manager);
        }
        let _ = lock(&self.policy).unregister(pid);
        mine.into_iter().map(|e| e.manager).collect()
    }

    /// The attached regions: `(pid, first policy page, pages, manager)`.
    pub fn regions(&self) -> Vec<(Pid, PageId, usize, Arc<TierManager>)> {
        lock(&self.table)
            .iter()
            .map(|e| (e.pid, e.first_page, e.pages, e.manager.clone()))
            .collect()
    }

    fn entries(&self) -> Vec<Entry> {
        lock(&self.table).clone()
    }

    /// The regions, latency-critical ones first (the sampler's order).
    fn entries_lc_first(&self) -> Vec<Entry> {
        let mut v = self.entries();
        v.sort_by_key(|e| !e.manager.is_latency_critical());
        v
    }

    /// Applies every region's queued records to the policy, in order
    /// ([`Record`]; [`MaxMem::fault_in_after`] for faults), queues the victims the
    /// policy names for faults that found no victim or a stale one, and publishes
    /// fresh credits (each process's unfilled allocation, the free pool) and, for a
    /// region whose list ran low, its next victims. Called by [`TierNode::run`] at
    /// every slot and epoch, and by [`TierNode::lock_policy`].
    pub fn drain(&self) {
        self.drain_inner(false);
        let mut late = EpochApplied::default();
        self.promote_ready(&mut late);
        for (pid, page, why) in late.failed {
            tracing::warn!(pid, page, error = %why, "tier node: a promotion failed");
        }
    }

    fn drain_inner(&self, refill_all: bool) {
        let entries = self.entries();
        let mut extra: Vec<(Pid, PageId)> = Vec::new();
        {
            let mut policy = lock(&self.policy);
            for e in &entries {
                let mut taken = 0usize;
                for r in e.records.try_iter() {
                    let id = |p: usize| e.first_page + p as u64;
                    match r {
                        Record::Fault { page, evicted } => {
                            taken += usize::from(evicted.is_some());
                            if let Ok(f) = policy.fault_in_after(e.pid, id(page), evicted.map(id)) {
                                if let Some(v) = f.victim {
                                    taken += 1;
                                    extra.push((e.pid, v));
                                }
                            }
                        }
                        Record::EvictFailed(page) => {
                            let _ = policy.set_tier(e.pid, id(page), Tier::Fast);
                        }
                        Record::Freed(page) => {
                            let _ = policy.free_page(e.pid, id(page));
                        }
                        Record::SecondChance(page) => {
                            let _ = policy.requeue(e.pid, id(page));
                        }
                        Record::FoundSlow(page) => {
                            let _ = policy.insert_slow(e.pid, id(page));
                        }
                    }
                }
                // The faults' share of the list on top of what probation holds: refill
                // once half of the faults' share is gone.
                let probe = e.feed.wanted();
                let want = (probe + FEED_MIN + 4 * taken).min(FEED_MAX);
                let low = (probe + (FEED_MIN + 4 * taken) / 2).min(want);
                if refill_all || taken > 0 && e.feed.len() < low || e.feed.is_empty() {
                    let (first, pages) = (e.first_page, e.pages as u64);
                    e.feed.publish(
                        policy
                            .coldest_pages(e.pid, Tier::Fast)
                            .take(want.saturating_mul(4).saturating_add(1024))
                            .filter_map(|id| {
                                let i = id.checked_sub(first)?;
                                (i < pages).then_some(i as usize)
                            })
                            .take(want),
                    );
                }
            }
            for (pid, room) in lock(&self.rooms).iter() {
                room.store(policy.room_pages(*pid) as i64, Ordering::Release);
            }
            self.pool
                .store(policy.free_pages() as i64, Ordering::Release);
        }
        // The victims the policy named, to their regions (any region of the process).
        let mut by_region: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (pid, v) in extra {
            match entries
                .iter()
                .enumerate()
                .find_map(|(k, e)| e.holds(pid, v).map(|i| (k, i)))
            {
                Some((k, i)) => by_region.entry(k).or_default().push(i),
                None => tracing::debug!(pid, victim = v, "tier node: victim in no region"),
            }
        }
        for (k, pages) in by_region {
            entries[k].manager.evict(&pages);
        }
    }

    /// Drops every reference to `m` from the deferred promotions (its region left),
    /// so that its owner can stop it.
    fn forget_deferred(&self, m: &Arc<TierManager>) {
        let mut d = lock(&self.deferred);
        for (tickets, promote) in d.iter_mut() {
            tickets.retain(|(x, _)| !Arc::ptr_eq(x, m));
            promote.retain(|(_, _, x, _)| !Arc::ptr_eq(x, m));
        }
        d.retain(|(_, promote)| !promote.is_empty());
    }

    /// Carries out the deferred promotions whose demotions are done; see
    /// [`TierNode::epoch`]. A failed load is reported to the policy (the page is slow
    /// after all) and in `applied`.
    fn promote_ready(&self, applied: &mut EpochApplied) {
        let ready: Vec<Deferred> = {
            let mut d = lock(&self.deferred);
            let (ready, wait): (Vec<Deferred>, Vec<Deferred>) = std::mem::take(&mut *d)
                .into_iter()
                .partition(|(tickets, _)| tickets.iter().all(|(m, t)| m.evicted(*t)));
            *d = wait;
            ready
        };
        for (_, promote) in ready {
            for (pid, first_page, manager, pages) in promote {
                if manager.fatal().is_some() {
                    continue;
                }
                let before = manager.stats().prefetches;
                let failed: Vec<(usize, TierError)> = manager.prefetch(&pages);
                applied.promoted += manager.stats().prefetches - before;
                if !failed.is_empty() {
                    let mut policy = lock(&self.policy);
                    for (i, err) in failed {
                        let page = first_page + i as u64;
                        let _ = policy.set_tier(pid, page, Tier::Slow);
                        applied.failed.push((pid, page, err.to_string()));
                    }
                }
            }
        }
    }

    /// Closes every region's sampling window and opens the next (latency-critical
    /// regions first), after a [`TierNode::drain`].
    pub fn window(&self) {
        self.drain();
        for e in self.entries_lc_first() {
            if e.manager.fatal().is_none() {
                e.manager.sample_begin();
            }
        }
    }

    /// Whether any region's open window re-arms its sample.
    pub fn rearming(&self) -> bool {
        self.entries().iter().any(|e| e.manager.sample_rearming())
    }

    /// A slot boundary within the windows: re-arms every region's touched sampled
    /// pages ([`TierManager::sample_rearm`]). Returns whether any region re-arms.
    pub fn rearm(&self) -> bool {
        let mut any = false;
        for e in self.entries_lc_first() {
            if e.manager.fatal().is_none() {
                any |= e.manager.sample_rearm();
            }
        }
        any
    }

    /// One policy epoch; see the module documentation. Returns the policy's outcome
    /// and what was carried out.
    pub fn epoch(&self) -> (EpochOutcome, EpochApplied) {
        self.drain();
        let entries = self.entries_lc_first();
        let mut applied = EpochApplied::default();
        // 1. The epoch's accesses, per process.
        let mut per_pid: BTreeMap<Pid, Accesses> = BTreeMap::new();
        for e in &entries {
            if let Some(why) = e.manager.fatal() {
                applied.fatal.push((e.pid, e.first_page, why));
                continue;
            }
            e.manager.sample_end();
            let acc = e.manager.take_epoch();
            let s = per_pid.entry(e.pid).or_default();
            s.0 += acc.fast;
            s.1 += acc.slow;
            s.2.extend(
                acc.pages
                    .into_iter()
                    .map(|(p, c)| (e.first_page + p as u64, c)),
            );
        }
        let samples: Vec<ProcSample> = per_pid
            .into_iter()
            .map(|(pid, (fast, slow, pages))| ProcSample {
                pid,
                fast_accesses: fast.round() as u64,
                slow_accesses: slow,
                pages,
            })
            .collect();
        // 2. The policy.
        let outcome = lock(&self.policy).step(&samples);
        // 3. Demotions first, waited for; then promotions.
        let route = |pid: Pid, page: PageId| {
            entries
                .iter()
                .enumerate()
                .find_map(|(k, e)| e.holds(pid, page).map(|i| (k, i)))
        };
        let mut demote: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut promote: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for m in &outcome.migrations {
            match route(m.pid, m.page) {
                Some((k, i)) => match m.to {
                    Tier::Slow => demote.entry(k).or_default().push(i),
                    Tier::Fast => promote.entry(k).or_default().push(i),
                },
                None => applied.unrouted += 1,
            }
        }
        let tickets: Vec<(Arc<TierManager>, u64)> = demote
            .iter()
            .map(|(&k, pages)| {
                applied.demoted += pages.len() as u64;
                (entries[k].manager.clone(), entries[k].manager.evict(pages))
            })
            .collect();
        // The promotions wait for those demotions, but the policy thread does not: a
        // best-effort donor's eviction worker runs at nice 19 and may take seconds to
        // get there, and the sampler must keep its windows meanwhile. They run at the
        // first drain that finds the demotions done (now, if they are).
        let promote: Vec<Promotion> = promote
            .into_iter()
            .map(|(k, pages)| {
                let e = &entries[k];
                (e.pid, e.first_page, e.manager.clone(), pages)
            })
            .collect();
        if !promote.is_empty() {
            lock(&self.deferred).push((tickets, promote));
        }
        self.promote_ready(&mut applied);
        // 4. Fresh victim lists (the bins changed), and new windows.
        self.drain_inner(true);
        for e in &entries {
            if e.manager.fatal().is_none() {
                e.manager.sample_begin();
            }
        }
        (outcome, applied)
    }

    /// Runs windows and epochs with `timing` until `stop` is set, calling `on_epoch`
    /// after every epoch. Windows are kept on a fixed schedule (a late window does not
    /// shift the ones after it); `stop` is checked at least once per window. While no
    /// region is attached the slot boundaries are skipped.
    pub fn run(
        &self,
        timing: NodeTiming,
        stop: &AtomicBool,
        mut on_epoch: impl FnMut(&EpochOutcome, &EpochApplied),
    ) {
        let per_epoch = timing.windows_per_epoch.max(1);
        let slots = timing.slots_per_window.max(1);
        let slot = timing.window / slots;
        let start = Instant::now();
        let mut tick: u64 = 0;
        self.window();
        while !stop.load(Ordering::Acquire) {
            tick += 1;
            let mut rearming = slots > 1 && self.rearming();
            let due = start + timing.window * tick as u32;
            // Slot boundaries of this window, while some region re-arms (a region
            // re-arms only while it has slow accesses; the others sleep through).
            let window_start = due - timing.window;
            // Every slot drains the regions' records, re-arming or not. With no region
            // attached there is nothing to drain: the thread sleeps the whole window
            // (an idle tier service wakes once a window, not once a slot).
            let idle = lock(&self.table).is_empty();
            for j in 1..if idle { 1 } else { slots } {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let at = window_start + slot * j;
                let now = Instant::now();
                if at <= now {
                    continue;
                }
                std::thread::sleep(at - now);
                if rearming {
                    rearming = self.rearm();
                }
                self.drain();
            }
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if stop.load(Ordering::Acquire) {
                break;
            }
            if tick.is_multiple_of(per_epoch as u64) {
                let (outcome, applied) = self.epoch();
                on_epoch(&outcome, &applied);
            } else {
                self.window();
            }
        }
    }
}
