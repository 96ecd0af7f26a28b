//! The MaxMem policy ([`memcolo_policy::maxmem::MaxMem`]) as a tier manager's
//! [`Placement`], in two forms:
//!
//! - [`QueuedPlacement`] (what [`crate::node::TierNode`] hands out): no fault takes
//!   the policy's lock. The fault thread reports faults, failed evictions, frees and
//!   second chances as [`Record`]s on the region's own lock-free queue
//!   (`crossbeam-channel`), which the node's policy thread drains into the policy
//!   every slot (10 ms). Whether a fault needs a victim is decided from atomic
//!   credits the policy thread publishes after each drain (the process's unfilled
//!   allocation and the free pool); the victim is the next page of a list of the
//!   region's coldest fast pages that the policy thread published
//!   ([`Feed`]), and the policy is told after the fact
//!   ([`MaxMem::fault_in_after`]), which names a further victim if the list was
//!   stale. Why: a best-effort process's fault thread runs at nice 19; preempted
//!   while holding the node's policy lock, it stalled the latency-critical process's
//!   real-time fault thread behind it (priority inversion).
//! - [`MaxMemPlacement`]: the policy under its lock on every fault, for a policy
//!   that one process's manager owns alone (tests, single-region tools).
//!
//! Region page `i` is policy page `first_page + i`; a process with several regions
//! gives each a disjoint span (e.g. its start address divided by the page size).
//! A victim the policy picks in another region of the same process is handed to
//! `foreign`, which routes it to that region's manager.
//!
//! The manager's probation ([`crate::manager::TierConfig::probation_pages`]) reads
//! the policy's next victims ([`MaxMem::coldest_pages`]) and gives a page touched on
//! probation a second chance ([`MaxMem::requeue`]).

use crate::manager::Placement;
use crossbeam_channel::Sender;
use memcolo_policy::maxmem::{MaxMem, PageId, Tier};
use memcolo_policy::Pid;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Routes a victim page (policy page id) outside this region.
pub type ForeignVictim = Box<dyn FnMut(PageId) + Send>;

/// One region of process `pid` placed by a shared MaxMem policy.
pub struct MaxMemPlacement {
    policy: Arc<Mutex<MaxMem>>,
    pid: Pid,
    first_page: PageId,
    pages: usize,
    foreign: Option<ForeignVictim>,
}

impl MaxMemPlacement {
    /// Region pages `0..pages` of `pid` are policy pages `first_page..`. `pid` must be
    /// registered with the policy.
    pub fn new(policy: Arc<Mutex<MaxMem>>, pid: Pid, first_page: PageId, pages: usize) -> Self {
        MaxMemPlacement {
            policy,
            pid,
            first_page,
            pages,
            foreign: None,
        }
    }

    /// Routes victims outside this region to `f`.
    pub fn with_foreign(mut self, f: ForeignVictim) -> Self {
        self.foreign = Some(f);
        self
    }

    fn policy(&self) -> std::sync::MutexGuard<'_, MaxMem> {
        self.policy.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Placement for MaxMemPlacement {
    fn fault_in(&mut self, page: usize) -> Option<usize> {
        let r = self
            .policy()
            .fault_in(self.pid, self.first_page + page as u64);
        let victim = match r {
            Ok(f) => f.victim?,
            Err(e) => {
                tracing::warn!(pid = self.pid, error = %e, "placement: fault not recorded");
                return None;
            }
        };
        match victim.checked_sub(self.first_page) {
            Some(v) if v < self.pages as u64 => Some(v as usize),
            _ => {
                if let Some(f) = self.foreign.as_mut() {
                    f(victim);
                }
                None
            }
        }
    }

    fn evict_failed(&mut self, page: usize) {
        let pid = self.pid;
        let id = self.first_page + page as u64;
        let _ = self.policy().set_tier(pid, id, Tier::Fast);
    }

    fn freed(&mut self, page: usize) {
        let pid = self.pid;
        let id = self.first_page + page as u64;
        let _ = self.policy().free_page(pid, id);
    }

    /// The process's coldest fast pages in this region ([`MaxMem::coldest_pages`]):
    /// the demand victims to come. Pages of the process's other regions are skipped,
    /// looking at no more than `4n + 1024` pages.
    fn next_victims(&mut self, n: usize) -> Vec<usize> {
        let (pid, first, pages) = (self.pid, self.first_page, self.pages as u64);
        self.policy()
            .coldest_pages(pid, Tier::Fast)
            .take(n.saturating_mul(4).saturating_add(1024))
            .filter_map(|id| {
                let i = id.checked_sub(first)?;
                (i < pages).then_some(i as usize)
            })
            .take(n)
            .collect()
    }

    /// [`MaxMem::requeue`].
    fn second_chance(&mut self, page: usize) {
        let pid = self.pid;
        let id = self.first_page + page as u64;
        let _ = self.policy().requeue(pid, id);
    }

    /// [`MaxMem::insert_slow`].
    fn found_slow(&mut self, page: usize) {
        let pid = self.pid;
        let id = self.first_page + page as u64;
        let _ = self.policy().insert_slow(pid, id);
    }
}

/// What a region's fault thread and eviction workers tell the policy, in region pages,
/// in the order it happened ([`QueuedPlacement`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// `page` was mapped by a fault; `evicted` was queued for eviction to make room
    /// ([`MaxMem::fault_in_after`]).
    Fault {
        /// The page now mapped.
        page: usize,
        /// The victim the region took from its [`Feed`], if it had no credit.
        evicted: Option<usize>,
    },
    /// An eviction asked for did not happen; the page is still resident.
    EvictFailed(usize),
    /// The application freed the page.
    Freed(usize),
    /// The page was touched on probation ([`MaxMem::requeue`]).
    SecondChance(usize),
    /// The page was found in the slow tier ([`MaxMem::insert_slow`]).
    FoundSlow(usize),
}

/// Takes one page of `credit` if there is one (lock-free).
pub fn take_credit(credit: &AtomicI64) -> bool {
    credit
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
            (c > 0).then(|| c - 1)
        })
        .is_ok()
}

/// The next victims of one region (region pages, coldest first), published by the
/// policy thread and taken by the region's fault thread (front first) and read by its
/// probation. Its lock is the region's own, held for a pop or a copy: only that
/// region's threads and the policy thread (for a swap) ever take it, so a nice-19
/// best-effort thread never holds a lock that another process's fault needs.
#[derive(Debug, Default)]
pub struct Feed {
    victims: Mutex<VecDeque<usize>>,
    /// The most pages the region's probation last asked to see
    /// ([`Placement::next_victims`]): the list is kept at least this long, besides
    /// what the faults take.
    wanted: AtomicUsize,
}

impl Feed {
    fn lock(&self) -> MutexGuard<'_, VecDeque<usize>> {
        self.victims.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the list.
    pub fn publish(&self, victims: impl IntoIterator<Item = usize>) {
        let fresh: VecDeque<usize> = victims.into_iter().collect();
        *self.lock() = fresh;
    }

    /// Pages in the list now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next victim other than `page`, taken off the list; `None` also while the
    /// list is being published or read (a fault never waits for it: the policy
    /// thread then names the victim when it drains the fault's record).
    pub fn take(&self, page: usize) -> Option<usize> {
        let mut v = match self.victims.try_lock() {
            Ok(v) => v,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        while let Some(x) = v.pop_front() {
            if x != page {
                return Some(x);
            }
        }
        None
    }

    /// The first `n` pages of the list.
    pub fn peek(&self, n: usize) -> Vec<usize> {
        self.lock().iter().copied().take(n).collect()
    }

    /// Pages the region's probation last asked to see (0 before it asked): the
    /// policy thread keeps the list longer than this by what the faults take.
    pub fn wanted(&self) -> usize {
        self.wanted.load(Ordering::Relaxed)
    }

    /// Takes `page` off the list (it was just seen used).
    pub fn remove(&self, page: usize) {
        let mut v = self.lock();
        if let Some(k) = v.iter().position(|&x| x == page) {
            v.remove(k);
        }
    }
}

/// One region of a process placed by a shared MaxMem policy without taking its lock;
/// see the module documentation. Built by [`crate::node::TierNode::placement`].
pub struct QueuedPlacement {
    tx: Sender<Record>,
    /// The process's unfilled allocation (pages), shared by its regions.
    room: Arc<AtomicI64>,
    /// The node's free pool (pages), shared by every region.
    pool: Arc<AtomicI64>,
    feed: Arc<Feed>,
}

impl QueuedPlacement {
    /// A placement that reports to `tx`, takes credit from `room` then `pool`, and
    /// victims from `feed`.
    pub fn new(
        tx: Sender<Record>,
        room: Arc<AtomicI64>,
        pool: Arc<AtomicI64>,
        feed: Arc<Feed>,
    ) -> Self {
        QueuedPlacement {
            tx,
            room,
            pool,
            feed,
        }
    }

    fn send(&self, r: Record) {
        // The receiver is gone only once the region left the node.
        let _ = self.tx.send(r);
    }
}

impl Placement for QueuedPlacement {
    /// Credit first (the process's unfilled allocation, then the free pool); with
    /// none, the next victim of the feed. With an empty feed the page stays without
    /// a victim and the policy thread, draining the record, names one and queues it.
    fn fault_in(&mut self, page: usize) -> Option<usize> {
        let evicted = if take_credit(&self.room) || take_credit(&self.pool) {
            None
        } else {
            self.feed.take(page)
        };
        self.send(Record::Fault { page, evicted });
        evicted
    }

    fn evict_failed(&mut self, page: usize) {
        self.send(Record::EvictFailed(page));
    }

    fn freed(&mut self, page: usize) {
        self.feed.remove(page);
        self.send(Record::Freed(page));
    }

    /// The front of the feed: the victims the next faults will take. `n` is also
    /// remembered as the length the feed must keep ([`Feed::wanted`]), so that a
    /// probation longer than the faults' share of the list can fill.
    fn next_victims(&mut self, n: usize) -> Vec<usize> {
        self.feed.wanted.store(n, Ordering::Relaxed);
        self.feed.peek(n)
    }

    fn second_chance(&mut self, page: usize) {
        self.feed.remove(page);
        self.send(Record::SecondChance(page));
    }

    fn found_slow(&mut self, page: usize) {
        self.send(Record::FoundSlow(page));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcolo_policy::maxmem::MaxMemConfig;

    /// Credit taken from many threads at once: exactly as many takes succeed as there
    /// was credit, and it never goes below zero.
    #[test]
    fn credit_is_taken_exactly_once_per_page() {
        let credit = Arc::new(AtomicI64::new(10_000));
        let took: usize = (0..4)
            .map(|_| {
                let c = credit.clone();
                std::thread::spawn(move || (0..5_000).filter(|_| take_credit(&c)).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(took, 10_000);
        assert_eq!(credit.load(Ordering::SeqCst), 0);
    }

    /// Four regions fault concurrently while a drainer applies their queues to the
    /// policy and republishes credits and victim lists, as `TierNode::drain` does: no
    /// record is lost, each region's records arrive in order, and once drained the
    /// policy counts exactly the fast memory it has (the victims it named where a
    /// region's list ran dry included).
    #[test]
    fn queued_records_are_never_lost() {
        let (regions, faults, fast) = (4usize, 3_000usize, 512u64);
        let mut policy = MaxMem::new(MaxMemConfig {
            migration_cap_pages: 64,
            ..MaxMemConfig::with_capacity(fast, 4096)
        });
        let pool = Arc::new(AtomicI64::new(fast as i64));
        let mut ends = Vec::new();
        let mut producers = Vec::new();
        for r in 0..regions {
            let pid = r as Pid + 1;
            policy.register(pid, 1.0).unwrap();
            let (tx, rx) = crossbeam_channel::unbounded();
            let room = Arc::new(AtomicI64::new(0));
            let feed = Arc::new(Feed::default());
            let mut pl = QueuedPlacement::new(tx, room.clone(), pool.clone(), feed.clone());
            ends.push((pid, rx, room, feed));
            producers.push(std::thread::spawn(move || {
                // Pages 0..1000 in turn, a second chance now and then.
                for k in 0..faults {
                    let page = k % 1000;
                    pl.fault_in(page);
                    if k % 7 == 0 {
                        pl.second_chance(page);
                    }
                }
            }));
        }
        let policy = Arc::new(Mutex::new(policy));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let drainer = {
            let (policy, stop, pool) = (policy.clone(), stop.clone(), pool.clone());
            std::thread::spawn(move || {
                let mut seen = vec![0usize; regions];
                let mut named = 0u64;
                loop {
                    let last = stop.load(Ordering::Acquire);
                    let mut m = policy.lock().unwrap();
                    for (k, (pid, rx, room, feed)) in ends.iter().enumerate() {
                        for rec in rx.try_iter() {
                            if let Record::Fault { page, evicted } = rec {
                                // In order: region pages 0..1000 in turn.
                                assert_eq!(page, seen[k] % 1000, "region {k}");
                                seen[k] += 1;
                                let f = m
                                    .fault_in_after(*pid, page as u64, evicted.map(|v| v as u64))
                                    .unwrap();
                                named += u64::from(f.victim.is_some());
                            } else if let Record::SecondChance(page) = rec {
                                let _ = m.requeue(*pid, page as u64);
                            }
                        }
                        room.store(m.room_pages(*pid) as i64, Ordering::Release);
                        feed.publish(
                            m.coldest_pages(*pid, Tier::Fast)
                                .take(64)
                                .map(|p| p as usize),
                        );
                    }
                    pool.store(m.free_pages() as i64, Ordering::Release);
                    m.check_invariants().unwrap();
                    drop(m);
                    if last {
                        return (seen, named);
                    }
                    std::thread::yield_now();
                }
            })
        };
        for p in producers {
            p.join().unwrap();
        }
        stop.store(true, Ordering::Release);
        let (seen, named) = drainer.join().unwrap();
        assert_eq!(seen, vec![faults; regions], "every fault record arrived");
        let m = policy.lock().unwrap();
        let st = m.statuses();
        let total: u64 = st.iter().map(|s| s.fast_pages + s.slow_pages).sum();
        assert_eq!(total, regions as u64 * 1000, "every page known");
        let fast_now: u64 = st.iter().map(|s| s.fast_pages).sum();
        assert_eq!(fast_now, fast, "the fast tier is exactly full");
        eprintln!("victims named by the drainer: {named}");
    }
}
