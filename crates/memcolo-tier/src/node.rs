//! A tier node: the managed regions of one or more processes sharing one fast tier
//! under the MaxMem policy (MaxMem §3.1–§3.3), and the loop that drives it.
//!
//! The node owns the policy ([`MaxMem`], behind a mutex shared with every region's
//! [`MaxMemPlacement`]) and a table of regions, each a [`TierManager`] of one
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
//! order: every demotion is queued and waited for (not the fault victims queued
//! after it) before the promotions it makes room for are brought in
//! ([`TierManager::prefetch`]); a promotion that fails
//! (the slow tier could not load the page) is reported back to the policy, which
//! then counts the page in the slow tier again. [`TierNode::run`] repeats windows
//! and epochs on a clock until told to stop.
//!
//! # Locks
//!
//! The region table is only held to copy it: managers are called without it, so a
//! fault thread routing a foreign victim (placement lock → table lock) never waits
//! for a caller that holds the table while calling into a manager.

use crate::manager::TierManager;
use crate::placement::MaxMemPlacement;
use crate::region::PAGE;
use crate::TierError;
use memcolo_policy::maxmem::{EpochOutcome, MaxMem, MaxMemConfig, PageId, ProcSample, Tier};
use memcolo_policy::{Pid, PolicyError};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One managed region as the node knows it.
#[derive(Clone)]
struct Entry {
    pid: Pid,
    first_page: PageId,
    pages: usize,
    manager: Arc<TierManager>,
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

/// Managed regions sharing one fast tier; see the module documentation.
pub struct TierNode {
    policy: Arc<Mutex<MaxMem>>,
    table: Table,
}

impl TierNode {
    /// A node whose fast tier and migration cap are given by `cfg`.
    ///
    /// # Errors
    /// [`PolicyError::InvalidConfig`] from [`MaxMemConfig::validate`].
    pub fn new(cfg: MaxMemConfig) -> Result<Self, PolicyError> {
        Ok(TierNode {
            policy: Arc::new(Mutex::new(MaxMem::try_new(cfg)?)),
            table: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// The policy, shared with the regions' placements.
    pub fn policy(&self) -> Arc<Mutex<MaxMem>> {
        self.policy.clone()
    }

    /// Locks the policy (for status and for reports).
    pub fn lock_policy(&self) -> MutexGuard<'_, MaxMem> {
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
    /// `first_page + i`, to hand to [`TierManager::start`]. Victims in other regions
    /// of `pid` are routed to their managers.
    pub fn placement(&self, pid: Pid, first_page: PageId, pages: usize) -> MaxMemPlacement {
        let table = self.table.clone();
        MaxMemPlacement::new(self.policy.clone(), pid, first_page, pages).with_foreign(Box::new(
            move |victim| {
                let target = lock(&table)
                    .iter()
                    .find_map(|e| e.holds(pid, victim).map(|i| (e.manager.clone(), i)));
                match target {
                    Some((m, i)) => {
                        m.evict(&[i]);
                    }
                    None => tracing::debug!(pid, victim, "tier node: victim in no region"),
                }
            },
        ))
    }

    /// Attaches a started manager: its region of `pid` starts at policy page
    /// `first_page` (as given to [`TierNode::placement`]).
    pub fn attach(&self, pid: Pid, first_page: PageId, manager: Arc<TierManager>) {
        let pages = manager.pages();
        lock(&self.table).push(Entry {
            pid,
            first_page,
            pages,
            manager,
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

    /// Closes every region's sampling window and opens the next.
    pub fn window(&self) {
        for e in self.entries() {
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
        for e in self.entries() {
            if e.manager.fatal().is_none() {
                any |= e.manager.sample_rearm();
            }
        }
        any
    }

    /// One policy epoch; see the module documentation. Returns the policy's outcome
    /// and what was carried out.
    pub fn epoch(&self) -> (EpochOutcome, EpochApplied) {
        let entries = self.entries();
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
        let tickets: Vec<(usize, u64)> = demote
            .iter()
            .map(|(&k, pages)| {
                applied.demoted += pages.len() as u64;
                (k, entries[k].manager.evict(pages))
            })
            .collect();
        for (k, ticket) in tickets {
            entries[k].manager.wait_evicted(ticket);
        }
        for (&k, pages) in &promote {
            let e = &entries[k];
            let before = e.manager.stats().prefetches;
            let failed: Vec<(usize, TierError)> = e.manager.prefetch(pages);
            applied.promoted += e.manager.stats().prefetches - before;
            if !failed.is_empty() {
                let mut policy = lock(&self.policy);
                for (i, err) in failed {
                    let page = e.first_page + i as u64;
                    let _ = policy.set_tier(e.pid, page, Tier::Slow);
                    applied.failed.push((e.pid, page, err.to_string()));
                }
            }
        }
        // 4. New windows.
        for e in &entries {
            if e.manager.fatal().is_none() {
                e.manager.sample_begin();
            }
        }
        (outcome, applied)
    }

    /// Runs windows and epochs with `timing` until `stop` is set, calling `on_epoch`
    /// after every epoch. Windows are kept on a fixed schedule (a late window does not
    /// shift the ones after it); `stop` is checked at least once per window.
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
            for j in 1..slots {
                if !rearming || stop.load(Ordering::Acquire) {
                    break;
                }
                let at = window_start + slot * j;
                let now = Instant::now();
                if at <= now {
                    continue;
                }
                std::thread::sleep(at - now);
                rearming = self.rearm();
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
