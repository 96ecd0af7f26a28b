//! The MaxMem policy ([`memcolo_policy::maxmem::MaxMem`]) as a tier manager's
//! [`Placement`]: faults, failed evictions and frees of one region are reported to
//! the policy shared by every managed process, under its lock.
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
use memcolo_policy::maxmem::{MaxMem, PageId, Tier};
use memcolo_policy::Pid;
use std::sync::{Arc, Mutex};

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
}
