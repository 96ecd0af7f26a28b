//! The scheduling of a region's threads ([`super::TierManager::set_latency_critical`],
//! [`super::TierManager::set_nice`], [`super::TierManager::set_idle`]) and their CPU
//! and wait times for [`super::ManagerStats`], through [`memcolo_linux::sched`].

use super::{lock, Inner};
use memcolo_linux::sched::{gettid, set_thread_policy, thread_run_and_wait_ns, ThreadPolicy};
use std::io;
use std::sync::atomic::Ordering;

impl Inner {
    /// Puts the fault thread in `SCHED_FIFO` at priority 1 (`on`) or back in
    /// `SCHED_OTHER`; a no-op before the thread runs (it applies the flag itself).
    pub(super) fn apply_priority(&self, on: bool) -> io::Result<()> {
        let tid = self.fault_tid.load(Ordering::SeqCst);
        if tid == 0 {
            return Ok(());
        }
        let policy = if on {
            ThreadPolicy::Fifo { priority: 1 }
        } else {
            self.background_policy()
        };
        set_thread_policy(tid, policy)
    }

    /// Applies the region's nice value and `SCHED_IDLE` flag to its eviction
    /// workers and, unless latency-critical, its fault thread.
    pub(super) fn apply_background(&self) -> io::Result<()> {
        let policy = self.background_policy();
        let mut tids = lock(&self.worker_tids).clone();
        if !self.latency_critical.load(Ordering::SeqCst) {
            tids.push(self.fault_tid.load(Ordering::SeqCst));
        }
        for tid in tids.into_iter().filter(|&t| t != 0) {
            set_thread_policy(tid, policy)?;
        }
        Ok(())
    }

    /// The calling thread takes the region's nice value and `SCHED_IDLE` flag (a
    /// thread started after [`super::TierManager::set_nice`] or
    /// [`super::TierManager::set_idle`]).
    pub(super) fn apply_own_nice(&self) {
        let nice = self.nice.load(Ordering::SeqCst);
        let idle = self.idle.load(Ordering::SeqCst);
        if nice != 0 || idle {
            if let Err(e) = set_thread_policy(gettid(), ThreadPolicy::background(nice, idle)) {
                self.note_error(format!("thread nice: {e}"));
            }
        }
    }

    /// The region's nice value and `SCHED_IDLE` flag, as a policy.
    fn background_policy(&self) -> ThreadPolicy {
        ThreadPolicy::background(
            self.nice.load(Ordering::SeqCst),
            self.idle.load(Ordering::SeqCst),
        )
    }

    /// The fault thread's `(run time, run delay)` in ns (see
    /// [`thread_run_and_wait_ns`]).
    pub(super) fn fault_thread_schedstat(&self) -> (u64, u64) {
        thread_run_and_wait_ns(self.fault_tid.load(Ordering::Acquire))
    }

    /// The eviction workers' `(run time, run delay)` in ns, summed.
    pub(super) fn evict_threads_schedstat(&self) -> (u64, u64) {
        lock(&self.worker_tids)
            .iter()
            .map(|&t| thread_run_and_wait_ns(t))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }
}
