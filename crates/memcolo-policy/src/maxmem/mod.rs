//! MaxMem's tiered-memory QoS policy (MaxMem §3.1–§3.2), as a pure state machine.
//!
//! Many processes share a small fast tier (here local DRAM) and a large slow tier (far
//! memory, or a CPU-less NUMA node). Each process has a target fast-memory miss ratio
//! (FMMR) `t_miss ∈ ]0, 1]`; every epoch (1 s in the paper) the caller hands
//! [`MaxMem::step`] what each process accessed, and the policy answers with the fast
//! memory each process is now allotted and the page migrations that realize it.
//! Between epochs the caller reports page faults ([`MaxMem::fault_in`]), first
//! touches ([`MaxMem::allocate`]) and frees ([`MaxMem::free_page`]). No clock is read:
//! an epoch is one call to `step`, whatever its duration.
//!
//! A *page* is the caller's unit of placement ([`PageId`], e.g. a 4 KiB page's virtual
//! page number, or a 2 MiB huge page's as MaxMem quantizes samples to huge pages);
//! every count in this module is in those pages.
//!
//! # Rules
//!
//! **T1 — measured FMMR** (§3.1). For an epoch in which a process made `a_fast`
//! accesses served by the fast tier and `a_slow` by the slow tier,
//! `x = a_slow / (a_slow + a_fast)`; `a_miss ← λ·x + (1 − λ)·a_miss` with
//! λ = [`MaxMemConfig::ewma_lambda`] (0.5). A process's first measured epoch sets
//! `a_miss = x` (there is no history to average with: §5.1.2 sees a new process at
//! `a_miss = 1` at once). An epoch with `a_slow = a_fast = 0` sets `a_miss := 0`
//! outright, not through the average ("we set a_miss := 0 for that epoch"), so a
//! memory-inactive process reaches the `a_miss = 0` case of T3 and gives up its fast
//! memory. A process absent from the epoch's samples made no accesses.
//!
//! **T2 — need.** A process is *needy* if `a_miss > t_miss`, in *surplus* if
//! `a_miss < t_miss`, and *met* if they are equal; a met process keeps its allocation.
//!
//! **T3 — reallocation** (§3.1, "Fast memory reallocation"). The reallocation budget
//! is `R = migration_cap_pages / 2` pages of fast memory per epoch. With
//! `F_need = Σ_needy a_miss/t_miss` and `F_surplus = Σ_surplus t_miss/a_miss`, a needy
//! process is given `M_p = (a_miss/t_miss)·R/F_need` and a surplus process that has
//! fast memory gives `M_p = (t_miss/a_miss)·R/F_surplus`, or all of its allocation if
//! that is less ("MaxMem simply takes all of its remaining fast memory"). Shares are
//! whole pages: each is rounded down and the pages left over go to the largest
//! remainders (ties: first come), so `Σ_needy M_p = R` exactly. A surplus process
//! with `a_miss = 0` has `t_miss/a_miss = ∞`, hence `F_surplus = ∞`; with `∞/∞ = 1`
//! that process gives `M_p = R` and every finite surplus process gives `0`. Only one
//! `a_miss = 0` process gives per epoch (the paper's rule); memcolo takes them in turn
//! (round robin in arrival order, moving on once one has given). Surplus processes
//! without fast memory are not donors, so an idle new process does not block others.
//!
//! A needy process is given no more than it can use this epoch: its slow pages not
//! already covered by allocation it has not filled (`slow − (alloc − fast)`).
//! Reallocation only happens when some process is needy: surplus processes keep
//! their memory while nobody needs it. Memory comes from the free pool first (fast
//! memory nobody holds, e.g. left by an exited process: "immediately allocated from
//! the free memory pool"), then from surplus processes; needy processes are served in
//! arrival order (first come, first served), each up to its `M_p`, taking from the
//! donors allowed to give to it (T4) in proportion to what each still has to give.
//!
//! **T4 — infeasible targets** (§3.1, last paragraph of "Fast memory reallocation").
//! When a needy process is still short and nothing is left to give it (the free pool
//! is empty and no allowed donor has anything left), targets cannot all be met: the
//! process takes the rest of its `M_p` from needy processes that arrived *after* it,
//! latest first (first come, first served). A needy process that ends the epoch short
//! of its `M_p`, or that was taken from, is flagged *infeasible* for operators
//! ([`ProcStatus::infeasible`]); the flag clears when it is no longer needy or is
//! served in full. To stop once all the targets that can be met are met ("MaxMem
//! minimizes fast memory reallocations [...] by stopping once it has met all the
//! target FMMRs it can"), a process that turned needy again after giving memory away
//! (a *relapse*: its surplus was not real) no longer gives to flagged processes that
//! arrived after it, since it would take the memory straight back (T4 itself) and
//! only churn pages. Relapses are forgotten when the mix changes (a process arrives
//! or exits, a target changes). Best-effort processes (`t_miss = 1`) are never
//! needy, so they never relapse and always give.
//!
//! **T3a — a step that follows the newest measurement** (memcolo's, with
//! [`MaxMemConfig::proportional_step`]; off, rule T3 is §3.1's exactly). With one needy
//! process §3.1 gives it `M_p = R` per epoch however far it is from its target, so a
//! process that arrives with no fast memory and needs `G` pages takes `G/R` epochs
//! plus the EWMA's lag. And the EWMA (λ = 0.5) lags the measured ratio `x` of the
//! newest epoch by about an epoch: a process whose `x` already meets its target stays
//! needy by a_miss for one to three more epochs, and each of them grew its allotment
//! under §3.1 (the KV store of `bench/tiering`, arriving beside GUPS, went on growing
//! from 34 to 41-43 MiB while its `x` was already 0.09-0.10 and its a_miss fell from
//! 0.24 to 0.10; ~34 MiB met the target). T3a keeps T1 (a_miss), T2 and the shares
//! `M_p` of T3 as written, and changes two things:
//!
//! - *Hold.* A needy process whose newest `x` meets its target (`x <= t_miss`), or
//!   is near it (`x < 2·t_miss`) and still converging on it (`x` fell in the last
//!   epoch by at least a third of its remaining distance: the fast memory given
//!   before is still filling with hot pages), is given nothing this epoch: its
//!   a_miss follows `x` without more fast memory. It stays needy (T2) and counts in
//!   `F_need`; its share goes unused ("MaxMem may underutilize its migration
//!   rate"), and it is not flagged infeasible for it. A hold never lasts while `x`
//!   stands above the target: once `x` stops falling, the process is given memory
//!   again. (The KV store's `x` went on falling for 3-5 epochs after its allotment
//!   stopped growing, 0.127 to 0.07 at 42.6 MiB: each step near the target is
//!   looked at before the next.)
//! - *Budget by the distance.* The epoch's budget is `R·clamp(d − 1, 1/2, cap/R)`
//!   pages with `d = max over needy, not held processes of min(x, a_miss)/t_miss`:
//!   up to the whole migration cap while the neediest process misses at twice its
//!   target or more (MaxMem §5.4 evaluates such a cap, 10 GB/s), and near the target
//!   a step in proportion to the remaining distance, down to `R/2`
//!   ([`MaxMemConfig::MIN_STEP_OF_R`]) while that process's `x` converges on the
//!   target (it fell in the last epoch by at least a third of its remaining
//!   distance: the last step is still showing), so that the allotment does not
//!   overshoot the need by a whole `R`; `R` while it does not (a flat miss curve, as
//!   after a lowered target, needs memory faster than its distance in miss ratio
//!   says). `min(x, a_miss)`: the newest measurement where the EWMA
//!   still carries older, higher readings; the EWMA where `x` jumped up (one noisy
//!   epoch does not take the whole cap).
//!
//! The budget is shared among needy processes and taken from donors as in T3; the
//! donors' demotions (T5) use the same budget, and the exchanges of T5 the rest of the
//! cap (`cap − max(budget, R)`, never more than §3.1's `X`), so one epoch never moves
//! more than the cap. A process arriving with nothing is given the whole cap from its
//! first measured epoch (its first `x` sets a_miss, T1). What the EWMA keeps: a_miss
//! meets `t_miss` only some epochs after `x` does, so at a cap of `C` pages per epoch
//! a process that needs `G` pages meets its target no sooner than `G/C` epochs plus
//! that lag (the closed-loop tests show both).
//!
//! **T5 — page migration** (§3.1, "Page migration"). The other half of the cap,
//! `X = migration_cap_pages − R` page moves, keeps each process's hottest pages in
//! fast memory: a process whose allocation is not filled promotes its hottest slow
//! pages (*fill*), then hottest slow pages are exchanged with coldest fast pages
//! while the slow page sits in a strictly hotter bin than the fast one (*exchange*,
//! two moves per pair). Only pages sampled since their last cooling to zero (bin ≥ 1)
//! are promoted: pages nobody touched come in on demand, if ever. `X` is shared
//! among the processes that have such work by water-filling (equal shares, what one
//! cannot use goes to the others). Before that, pages above a process's allocation
//! (a donor's reallocation, or a reported move that failed) are demoted, coldest
//! first, within `R`; they are counted against `R` because they are the migrations
//! that reallocation costs. Every move counts once against the cap, so one epoch
//! never emits more than `migration_cap_pages` migrations, and never promotes into
//! fast memory that a demotion of the same epoch has not freed (carry migrations out
//! in the order given: each epoch's demotions come before the promotions they make
//! room for).
//!
//! **T6 — hotness bins** (§3.2). Each process has [`MaxMemConfig::hotness_bins`] bins
//! (6). A page's sample count `c` puts it in bin 0 if `c = 0` (not recently accessed)
//! and otherwise in bin `⌊log₂ c⌋ + 1`, so bin `k ≥ 1` holds `2^(k−1) ≤ c < 2^k` and
//! neighbouring bins differ by about 2× in access frequency. When a page reaches the
//! threshold `T = 2^(bins−1)` (2^5 = 32 with 6 bins) the process *cools*: every count
//! is halved (rounded down), every page moves one bin colder, and the page that
//! reached `T` is left at `T/2` alone in the hottest bin. Cooling happens at most once
//! per epoch: a page that reaches `T` again in the same epoch stays at `T` and the
//! cooling is applied at the start of the next epoch. As in the paper, counts are
//! cooled lazily (a page remembers the cooling generation of its count) and the bin
//! lists shift by one list per cooling, so cooling does not touch every page. Within
//! a bin, pages keep the order in which they entered its list (the paper's linked
//! lists): a page enters at the end when it is created, sampled or moved, so the
//! coldest page of a bin is the one sampled or moved longest ago and the hottest the
//! latest. (Ordering a bin by page id instead would make every demand victim of a
//! far-memory tier, where most pages sit in bin 0, the lowest address, whatever its
//! use.) A caller that sees a page accessed between samples may give it a second
//! chance ([`MaxMem::requeue`]): it goes to the end of its bin's list, count unchanged.
//!
//! **T7 — allocation on demand** (§3.1, "Memory allocation"; "Process exit"). A page
//! touched for the first time is placed in fast memory if the process has unfilled
//! allocation or the free pool has a page (which then joins its allocation), and in
//! slow memory otherwise ([`MaxMem::allocate`], for slow tiers the CPU can address).
//! On a far-memory slow tier the CPU cannot address slow pages, so every access to a
//! slow page faults and maps the page locally ([`MaxMem::fault_in`]); when the process
//! has no allocation left for it, its coldest other fast page becomes the victim to
//! evict, or, holding no fast memory at all, the faulting page itself once the access
//! is served. These demand moves are the workload's own accesses and are not capped.
//! A freed fast page returns its allocation to the free pool; an exiting process
//! returns all of it ([`MaxMem::unregister`]).
//!
//! Invariants (checked by [`MaxMem::check_invariants`]): the allocations and the free
//! pool add up to `fast_capacity_pages`; every page sits in exactly one tier list and
//! the bin of its (lazily cooled) count; `0 ≤ a_miss ≤ 1`.
//!
//! Cost: a fault or an allocation is `O(bins + log n)` for `n` pages of the process;
//! a step is `O(s·log n)` for `s` sampled pages, plus `O(m·log n)` for `m` migrations,
//! plus `O(p log p)` for `p` processes; a cooling costs `O(min(|bin 0|, |bin 1|) log n)`.

mod apportion;
mod page_bins;
#[cfg(test)]
mod tests;
mod types;

use crate::error::PolicyError;
use crate::types::Pid;
use apportion::{apportion, apportion_int, water_fill, Plan};
use page_bins::{bin_of, Proc};
use std::collections::{BTreeMap, BTreeSet};
pub use types::*;

/// The MaxMem policy: per-process targets, allocations, hotness bins and the epoch
/// step. See the module documentation for the rules.
#[derive(Clone, Debug)]
pub struct MaxMem {
    cfg: MaxMemConfig,
    procs: BTreeMap<Pid, Proc>,
    free: u64,
    next_arrival: u64,
    epoch: u64,
    /// Arrival of the `a_miss = 0` process that gave last (rule T3's round robin).
    zero_cursor: Option<u64>,
    /// This epoch's reallocation budget (rule T3a; `R` without it).
    epoch_r: u64,
}

impl MaxMem {
    /// A policy with no processes and the whole fast tier free.
    ///
    /// # Panics
    /// If the configuration is invalid; see [`MaxMem::try_new`].
    pub fn new(cfg: MaxMemConfig) -> Self {
        Self::try_new(cfg).expect("invalid MaxMem configuration")
    }

    /// A policy with no processes and the whole fast tier free, or the reason the
    /// configuration was refused ([`MaxMemConfig::validate`]).
    pub fn try_new(cfg: MaxMemConfig) -> Result<Self, PolicyError> {
        cfg.validate()?;
        let cfg_r = cfg.reallocation_pages();
        Ok(MaxMem {
            free: cfg.fast_capacity_pages,
            cfg,
            procs: BTreeMap::new(),
            next_arrival: 0,
            epoch: 0,
            zero_cursor: None,
            epoch_r: cfg_r,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &MaxMemConfig {
        &self.cfg
    }

    /// Epochs stepped so far.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Fast memory held by nobody, pages.
    pub fn free_pages(&self) -> u64 {
        self.free
    }

    /// Starts managing `pid` with target FMMR `t_miss`, last in arrival order and with
    /// no fast memory allotted.
    ///
    /// # Errors
    /// [`PolicyError::InvalidConfig`] for a target outside `]0, 1]`;
    /// [`PolicyError::AlreadyManaged`] if `pid` is managed already.
    pub fn register(&mut self, pid: Pid, t_miss: f64) -> Result<(), PolicyError> {
        validate_t_miss(t_miss)?;
        if self.procs.contains_key(&pid) {
            return Err(PolicyError::AlreadyManaged { pid });
        }
        self.mix_changed();
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.procs.insert(
            pid,
            Proc::new(arrival, t_miss, self.cfg.hotness_bins as usize),
        );
        Ok(())
    }

    /// Changes the target FMMR of `pid`, effective from the next epoch.
    ///
    /// # Errors
    /// [`PolicyError::InvalidConfig`] for a target outside `]0, 1]`;
    /// [`PolicyError::UnknownProcess`].
    pub fn set_t_miss(&mut self, pid: Pid, t_miss: f64) -> Result<(), PolicyError> {
        validate_t_miss(t_miss)?;
        let p = self.proc_mut(pid)?;
        if p.t_miss != t_miss {
            p.t_miss = t_miss;
            self.mix_changed();
        }
        Ok(())
    }

    /// Stops managing `pid` (it exited): its fast memory returns to the free pool
    /// (§3.1 "Process exit"). Returns the pages returned.
    ///
    /// # Errors
    /// [`PolicyError::UnknownProcess`].
    pub fn unregister(&mut self, pid: Pid) -> Result<u64, PolicyError> {
        let p = self
            .procs
            .remove(&pid)
            .ok_or(PolicyError::UnknownProcess { pid })?;
        self.free += p.alloc;
        self.mix_changed();
        Ok(p.alloc)
    }

    /// Whether `pid` is managed.
    pub fn is_managed(&self, pid: Pid) -> bool {
        self.procs.contains_key(&pid)
    }

    /// The mix of processes or targets changed: relapses no longer tell anything
    /// (rule T4).
    fn mix_changed(&mut self) {
        for p in self.procs.values_mut() {
            p.gave = false;
            p.relapsed = false;
        }
    }

    fn proc_mut(&mut self, pid: Pid) -> Result<&mut Proc, PolicyError> {
        self.procs
            .get_mut(&pid)
            .ok_or(PolicyError::UnknownProcess { pid })
    }

    /// Takes one page of allocation for `pid` from the free pool if it has no unfilled
    /// allocation for one more fast page. Returns whether the page fits.
    fn grow_for_one(free: &mut u64, p: &mut Proc) -> bool {
        if p.fast() < p.alloc {
            true
        } else if *free > 0 {
            *free -= 1;
            p.alloc += 1;
            true
        } else {
            false
        }
    }

    /// A first touch of `page` on a slow tier the CPU can address (CXL, PMEM): the
    /// tier to place it in (rule T7). A page already known keeps its tier.
    ///
    /// # Errors
    /// [`PolicyError::UnknownProcess`].
    pub fn allocate(&mut self, pid: Pid, page: PageId) -> Result<Tier, PolicyError> {
        let free = &mut self.free;
        let p = self
            .procs
            .get_mut(&pid)
            .ok_or(PolicyError::UnknownProcess { pid })?;
        if let Some(rec) = p.pages.get(&page) {
            return Ok(rec.tier);
        }
        let tier = if Self::grow_for_one(free, p) {
            Tier::Fast
        } else {
            Tier::Slow
        };
        p.insert(page, tier);
        Ok(tier)
    }

    /// A fault on a far-memory tier: `page` (new, or in the slow tier) is now mapped
    /// in fast memory. Returns the page to evict in exchange, if any (rule T7). A page
    /// already fast is a no-op.
    ///
    /// # Errors
    /// [`PolicyError::UnknownProcess`].
    pub fn fault_in(&mut self, pid: Pid, page: PageId) -> Result<FaultIn, PolicyError> {
        let free = &mut self.free;
        let p = self
            .procs
            .get_mut(&pid)
            .ok_or(PolicyError::UnknownProcess { pid })?;
        match p.pages.get(&page).map(|r| r.tier) {
            Some(Tier::Fast) => return Ok(FaultIn { victim: None }),
            Some(Tier::Slow) => {}
            None => p.insert(page, Tier::Slow),
        }
        if Self::grow_for_one(free, p) {
            p.move_to(page, Tier::Fast);
            return Ok(FaultIn { victim: None });
        }
        // No room: the coldest other fast page makes room; with none, the page itself
        // goes back once the access is served.
        let victim = p
            .coldest(FAST)
            .map(|(_, v)| v)
            .find(|&v| v != page)
            .unwrap_or(page);
        if victim != page {
            p.move_to(victim, Tier::Slow);
            p.move_to(page, Tier::Fast);
        }
        Ok(FaultIn {
            victim: Some(victim),
        })
    }

    /// A fault reported after the fact by a caller that chose its own victim: `page`
    /// is now mapped in fast memory and `evicted` (if any) already went to the slow
    /// tier to make room (rule T7, decided outside the policy's lock: a fault thread
    /// that may not wait for the policy takes a victim from a list the policy handed
    /// out earlier, e.g. [`MaxMem::coldest_pages`], and reports both moves here).
    ///
    /// `evicted` moves to the slow tier first if the policy still counts it fast (an
    /// unknown page, or one already slow, changes nothing); then `page` is placed as
    /// by [`MaxMem::fault_in`]: in the process's unfilled allocation or a page of the
    /// free pool if there is one, and otherwise the policy names a further victim in
    /// the result, which the caller must evict too (its list was stale). So the
    /// policy's counts stay exact whatever the caller chose.
    ///
    /// Worked example (fast tier of 2 pages, pages 10 and 11 fast): the caller
    /// reports `fault_in_after(pid, 12, Some(10))` → 10 slow, 12 fast, no further
    /// victim; `fault_in_after(pid, 13, Some(10))` (a stale victim, already slow) →
    /// 13 fast and the policy's victim `Some(11)`.
    ///
    /// # Errors
    /// [`PolicyError::UnknownProcess`].
    pub fn fault_in_after(
        &mut self,
        pid: Pid,
        page: PageId,
        evicted: Option<PageId>,
    ) -> Result<FaultIn, PolicyError> {
        if let Some(v) = evicted.filter(|&v| v != page) {
            let p = self.proc_mut(pid)?;
            if p.pages.get(&v).map(|r| r.tier) == Some(Tier::Fast) {
                p.move_to(v, Tier::Slow);
            }
        }
        self.fault_in(pid, page)
    }

    /// Fast memory allotted to `pid` that it has not filled yet (`alloc − fast`,
    /// pages; 0 when over its allotment): faults it may take without a victim, besides
    /// the free pool ([`MaxMem::free_pages`]). 0 for an unknown process.
    pub fn room_pages(&self, pid: Pid) -> u64 {
        self.procs
            .get(&pid)
            .map_or(0, |p| p.alloc.saturating_sub(p.fast()))
    }

    /// `page` was freed (`munmap`, `MADV_DONTNEED`): it leaves management; a fast
    /// page's allocation returns to the free pool. Returns the tier it was in, or
    /// `None` for a page the policy did not know.
    ///
    /// # Errors
    /// [`PolicyError::UnknownProcess`].
    pub fn free_page(&mut self, pid: Pid, page: PageId) -> Result<Option<Tier>, PolicyError> {
        let free = &mut self.free;
        let p = self
            .procs
            .get_mut(&pid)
            .ok_or(PolicyError::UnknownProcess { pid })?;
        let tier = p.remove(page);
        if tier == Some(Tier::Fast) && p.alloc > 0 {
            p.alloc -= 1;
            *free += 1;
        }
        Ok(tier)
    }

    /// `page` was found in the slow tier without a fault or an eviction this policy
    /// saw (a region taken over after the process that managed it died): recorded
    /// there, in the coldest bin. A page already known keeps its tier.
    ///
    /// # Errors
    /// [`PolicyError::UnknownProcess`].
    pub fn insert_slow(&mut self, pid: Pid, page: PageId) -> Result<(), PolicyError> {
        let p = self
            .procs
            .get_mut(&pid)
            .ok_or(PolicyError::UnknownProcess { pid })?;
        if !p.pages.contains_key(&page) {
            p.insert(page, Tier::Slow);
        }
        Ok(())
    }

    /// The caller says where `page` really is (e.g. a migration it could not carry
    /// out). A page that lands in fast memory above the process's allocation takes a
    /// page from the free pool if there is one, and is otherwise demoted in a later
    /// epoch (reason [`MigrationReason::Excess`]).
    ///
    /// # Errors
    /// [`PolicyError::UnknownProcess`]; [`PolicyError::UnknownPage`].
    pub fn set_tier(&mut self, pid: Pid, page: PageId, tier: Tier) -> Result<(), PolicyError> {
        let free = &mut self.free;
        let p = self
            .procs
            .get_mut(&pid)
            .ok_or(PolicyError::UnknownProcess { pid })?;
        let Some(rec) = p.pages.get(&page) else {
            return Err(PolicyError::UnknownPage { pid, page });
        };
        if rec.tier == tier {
            return Ok(());
        }
        if tier == Tier::Fast {
            let _ = Self::grow_for_one(free, p);
        }
        p.move_to(page, tier);
        Ok(())
    }

    /// The pages of `pid` in `tier`, coldest first: bins ascending and, within a bin,
    /// in the order they entered its list (rule T6). This is the order in which demand
    /// victims ([`MaxMem::fault_in`]) and demotions are chosen, so a caller can test
    /// the next victims before they are evicted (a second chance, see
    /// [`MaxMem::requeue`]). Empty for a process the policy does not manage.
    pub fn coldest_pages(&self, pid: Pid, tier: Tier) -> impl Iterator<Item = PageId> + '_ {
        self.procs
            .get(&pid)
            .into_iter()
            .flat_map(move |p| p.coldest(tier.idx()).map(|(_, page)| page))
    }

    /// A second chance (CLOCK on rule T6's lists): `page` of `pid` was seen accessed
    /// between samples (e.g. touched while it was being tested as the next victim).
    /// It moves to the end of its bin's list in its tier, so that every other page of
    /// that bin is chosen as a victim before it; its sample count is unchanged (counts
    /// change only through [`MaxMem::step`]'s samples).
    ///
    /// # Errors
    /// [`PolicyError::UnknownProcess`]; [`PolicyError::UnknownPage`].
    pub fn requeue(&mut self, pid: Pid, page: PageId) -> Result<(), PolicyError> {
        let p = self.proc_mut(pid)?;
        if p.requeue(page) {
            Ok(())
        } else {
            Err(PolicyError::UnknownPage { pid, page })
        }
    }

    /// The tier `page` of `pid` is in, if the policy knows the page.
    pub fn tier_of(&self, pid: Pid, page: PageId) -> Option<Tier> {
        Some(self.procs.get(&pid)?.pages.get(&page)?.tier)
    }

    /// The hotness bin of `page` of `pid` (0 coldest), if the policy knows the page.
    pub fn bin_of(&self, pid: Pid, page: PageId) -> Option<usize> {
        self.procs.get(&pid)?.bin_of_page(page)
    }

    /// The status of `pid`.
    pub fn status(&self, pid: Pid) -> Option<ProcStatus> {
        self.procs.get(&pid).map(|p| p.status(pid))
    }

    /// Every managed process, in arrival order.
    pub fn statuses(&self) -> Vec<ProcStatus> {
        self.arrival_order()
            .into_iter()
            .map(|pid| self.procs[&pid].status(pid))
            .collect()
    }

    fn arrival_order(&self) -> Vec<Pid> {
        let mut order: Vec<Pid> = self.procs.keys().copied().collect();
        order.sort_by_key(|pid| self.procs[pid].arrival);
        order
    }

    /// One policy epoch (§3.1): folds in the epoch's samples (T1, T6), reallocates
    /// fast memory (T3, T4) and plans the epoch's migrations (T5). Samples of pids
    /// that are not managed are ignored; a managed process without a sample made no
    /// accesses. Several samples of one pid add up.
    pub fn step(&mut self, samples: &[ProcSample]) -> EpochOutcome {
        self.epoch += 1;
        let epoch = self.epoch;
        let threshold = self.cfg.cooling_threshold();
        for p in self.procs.values_mut() {
            p.alloc_change = 0;
            if p.cool_pending {
                p.cool(epoch);
            }
        }
        let mut accesses: BTreeMap<Pid, (u64, u64)> = BTreeMap::new();
        for s in samples {
            let Some(p) = self.procs.get_mut(&s.pid) else {
                continue;
            };
            for &(page, n) in &s.pages {
                p.add_samples(page, n, epoch, threshold);
            }
            let a = accesses.entry(s.pid).or_default();
            a.0 = a.0.saturating_add(s.fast_accesses);
            a.1 = a.1.saturating_add(s.slow_accesses);
        }
        let lambda = self.cfg.ewma_lambda;
        for (pid, p) in self.procs.iter_mut() {
            let (fast, slow) = accesses.get(pid).copied().unwrap_or((0, 0));
            p.update_miss(fast, slow, lambda);
        }

        let order = self.arrival_order();
        let reallocated_pages = self.reallocate(&order);
        let migrations = self.migrate(&order);
        EpochOutcome {
            epoch,
            migrations,
            reallocated_pages,
            procs: self.statuses(),
            free_pages: self.free,
        }
    }

    /// Rules T3 and T4: moves allocation from the free pool and from donors to needy
    /// processes. Returns the pages moved.
    fn reallocate(&mut self, order: &[Pid]) -> u64 {
        // T3a: the budget follows the neediest process's distance from its target,
        // by its newest measurement; held processes take nothing.
        let step = self.cfg.proportional_step;
        let (ratio, converging) = self
            .procs
            .values()
            .filter(|p| p.need == Need::Needy && !(step && p.held()))
            .map(|p| {
                if step {
                    (p.step_miss() / p.t_miss, p.converging())
                } else {
                    (p.a_miss / p.t_miss, false)
                }
            })
            .fold((0.0, false), |m, v| if v.0 > m.0 { v } else { m });
        let r = self.cfg.reallocation_budget(ratio, converging);
        self.epoch_r = r;
        for p in self.procs.values_mut() {
            if p.need == Need::Needy && p.gave {
                p.relapsed = true;
                p.gave = false;
            }
        }
        let needy: Vec<Pid> = order
            .iter()
            .copied()
            .filter(|pid| self.procs[pid].need == Need::Needy)
            .collect();
        if needy.is_empty() || r == 0 {
            for p in self.procs.values_mut() {
                p.infeasible = false;
            }
            return 0;
        }

        // Needy shares M_p = (a/t)·R/F_need, capped by what each can use now.
        let weights: Vec<f64> = needy
            .iter()
            .map(|pid| {
                let p = &self.procs[pid];
                p.a_miss / p.t_miss
            })
            .collect();
        let m_need = apportion(r, &weights);
        let demand: Vec<u64> = needy
            .iter()
            .zip(&m_need)
            .map(|(pid, &m)| {
                let p = &self.procs[pid];
                if step && p.held() {
                    return 0;
                }
                let unfilled = p.alloc.saturating_sub(p.fast());
                m.min(p.slow().saturating_sub(unfilled))
            })
            .collect();

        // Donors: surplus processes with fast memory; one a_miss = 0 process at most.
        let holders: Vec<Pid> = order
            .iter()
            .copied()
            .filter(|pid| {
                let p = &self.procs[pid];
                p.need == Need::Surplus && p.alloc > 0
            })
            .collect();
        let zeros: Vec<Pid> = holders
            .iter()
            .copied()
            .filter(|pid| self.procs[pid].a_miss == 0.0)
            .collect();
        let zero = match self.zero_cursor {
            Some(c) => zeros
                .iter()
                .copied()
                .find(|pid| self.procs[pid].arrival > c)
                .or_else(|| zeros.first().copied()),
            None => zeros.first().copied(),
        };
        let (donors, m_surplus): (Vec<Pid>, Vec<u64>) = match zero {
            // F_surplus = ∞: the a_miss = 0 process gives ∞/∞·R = R, the rest 0.
            Some(z) => (vec![z], vec![r]),
            None => {
                let w: Vec<f64> = holders
                    .iter()
                    .map(|pid| {
                        let p = &self.procs[pid];
                        p.t_miss / p.a_miss
                    })
                    .collect();
                let m = apportion(r, &w);
                (holders, m)
            }
        };
        let mut left: Vec<u64> = donors
            .iter()
            .zip(&m_surplus)
            .map(|(pid, &m)| m.min(self.procs[pid].alloc))
            .collect();

        let allowed = |procs: &BTreeMap<Pid, Proc>, donor: Pid, to: Pid| {
            let d = &procs[&donor];
            let t = &procs[&to];
            !(t.infeasible && d.arrival < t.arrival && d.relapsed)
        };

        let mut gain: BTreeMap<Pid, u64> = BTreeMap::new();
        let mut loss: BTreeMap<Pid, u64> = BTreeMap::new();
        let mut unmet: Vec<u64> = vec![0; needy.len()];
        let mut exhausted: Vec<bool> = vec![false; needy.len()];
        for (i, &pid) in needy.iter().enumerate() {
            let mut need = demand[i];
            let from_pool = need.min(self.free);
            self.free -= from_pool;
            need -= from_pool;
            let mut got = from_pool;
            if need > 0 {
                let idx: Vec<usize> = (0..donors.len())
                    .filter(|&j| left[j] > 0 && allowed(&self.procs, donors[j], pid))
                    .collect();
                let avail: u64 = idx.iter().map(|&j| left[j]).sum();
                let take = need.min(avail);
                let parts = apportion_int(take, &idx.iter().map(|&j| left[j]).collect::<Vec<_>>());
                for (&j, part) in idx.iter().zip(parts) {
                    left[j] -= part;
                    *loss.entry(donors[j]).or_default() += part;
                }
                need -= take;
                got += take;
                exhausted[i] = self.free == 0
                    && !(0..donors.len())
                        .any(|j| left[j] > 0 && allowed(&self.procs, donors[j], pid));
            }
            *gain.entry(pid).or_default() += got;
            unmet[i] = need;
        }

        // T4: a needy process still short with nothing left to give it takes from the
        // needy processes that came after it, latest first.
        let mut preempted: BTreeSet<Pid> = BTreeSet::new();
        for i in 0..needy.len() {
            if unmet[i] == 0 || !exhausted[i] {
                continue;
            }
            for k in (i + 1..needy.len()).rev() {
                if unmet[i] == 0 {
                    break;
                }
                let q = needy[k];
                let held = self.procs[&q].alloc + gain.get(&q).copied().unwrap_or(0)
                    - loss.get(&q).copied().unwrap_or(0);
                let take = held.min(unmet[i]);
                if take == 0 {
                    continue;
                }
                *loss.entry(q).or_default() += take;
                *gain.entry(needy[i]).or_default() += take;
                unmet[i] -= take;
                preempted.insert(q);
            }
        }

        let mut moved = 0;
        for (pid, p) in self.procs.iter_mut() {
            let g = gain.get(pid).copied().unwrap_or(0);
            let l = loss.get(pid).copied().unwrap_or(0);
            p.alloc = p.alloc + g - l;
            p.alloc_change = g as i64 - l as i64;
            moved += g.saturating_sub(l);
            p.infeasible = false;
            if p.need == Need::Surplus && l > 0 {
                p.gave = true;
            }
        }
        for (i, pid) in needy.iter().enumerate() {
            let p = self.procs.get_mut(pid).expect("needy process");
            p.infeasible = unmet[i] > 0 || preempted.contains(pid);
        }
        if let Some(z) = zero {
            if loss.get(&z).copied().unwrap_or(0) > 0 {
                self.zero_cursor = Some(self.procs[&z].arrival);
            }
        }
        moved
    }

    /// Rule T5: demotions above allocation within R, then fills and exchanges within
    /// X, water-filled among processes.
    fn migrate(&mut self, order: &[Pid]) -> Vec<Migration> {
        let mut out = Vec::new();
        let mut budget_r = self.epoch_r;
        for &pid in order {
            let p = self.procs.get_mut(&pid).expect("managed process");
            let excess = p.fast().saturating_sub(p.alloc).min(budget_r);
            if excess == 0 {
                continue;
            }
            let reason = if p.alloc_change < 0 {
                MigrationReason::Reallocation
            } else {
                MigrationReason::Excess
            };
            let victims: Vec<PageId> = p
                .coldest(FAST)
                .take(excess as usize)
                .map(|(_, v)| v)
                .collect();
            for v in victims {
                p.move_to(v, Tier::Slow);
                out.push(Migration {
                    pid,
                    page: v,
                    to: Tier::Slow,
                    reason,
                });
            }
            budget_r -= excess;
        }

        // Exchanges get the rest of the cap, never more than §3.1's X (T3a's budget
        // may be below R).
        let x = self
            .cfg
            .migration_cap_pages
            .saturating_sub(self.epoch_r.max(self.cfg.reallocation_pages()));
        let used: u64 = self.procs.values().map(|p| p.fast()).sum();
        let mut room = self.cfg.fast_capacity_pages.saturating_sub(used);
        // Plan each process's work within X: fills, then exchange pairs.
        let mut plans: Vec<Plan> = Vec::new();
        for &pid in order {
            let p = &self.procs[&pid];
            let fill_n = p.alloc.saturating_sub(p.fast()).min(p.hot_slow()).min(x);
            let fill: Vec<PageId> = p
                .hottest(SLOW, 1)
                .take(fill_n as usize)
                .map(|(_, v)| v)
                .collect();
            let mut pairs = Vec::new();
            let mut hot = p.hottest(SLOW, 1).skip(fill.len());
            let mut cold = p.coldest(FAST);
            while (pairs.len() as u64) < x / 2 {
                match (hot.next(), cold.next()) {
                    (Some((bh, ph)), Some((bc, pc))) if bh > bc => pairs.push((ph, pc)),
                    _ => break,
                }
            }
            if !fill.is_empty() || !pairs.is_empty() {
                plans.push(Plan { pid, fill, pairs });
            }
        }
        let demands: Vec<u64> = plans
            .iter()
            .map(|p| p.fill.len() as u64 + 2 * p.pairs.len() as u64)
            .collect();
        let shares = water_fill(x, &demands);
        for (Plan { pid, fill, pairs }, share) in plans.into_iter().zip(shares) {
            let p = self.procs.get_mut(&pid).expect("managed process");
            let k = (fill.len() as u64).min(share).min(room);
            room -= k;
            for &v in &fill[..k as usize] {
                p.move_to(v, Tier::Fast);
                out.push(Migration {
                    pid,
                    page: v,
                    to: Tier::Fast,
                    reason: MigrationReason::Fill,
                });
            }
            let n_pairs = ((share - k) / 2) as usize;
            for &(hot, cold) in pairs.iter().take(n_pairs) {
                p.move_to(cold, Tier::Slow);
                p.move_to(hot, Tier::Fast);
                out.push(Migration {
                    pid,
                    page: cold,
                    to: Tier::Slow,
                    reason: MigrationReason::Exchange,
                });
                out.push(Migration {
                    pid,
                    page: hot,
                    to: Tier::Fast,
                    reason: MigrationReason::Exchange,
                });
            }
        }
        out
    }

    /// Checks the policy's invariants (module docs): allocations plus the free pool
    /// equal the fast capacity; per process, tier counts match the pages, every page
    /// is in the list of its tier and of the bin of its cooled count (saturated pages
    /// at the threshold, in the hottest bin), and `0 <= a_miss <= 1`. Returns a
    /// description of the first violation. Costs `O(pages)`; meant for tests and
    /// debug builds.
    pub fn check_invariants(&self) -> Result<(), String> {
        let alloc: u64 = self.procs.values().map(|p| p.alloc).sum();
        if alloc + self.free != self.cfg.fast_capacity_pages {
            return Err(format!(
                "allocations {alloc} + free {} != capacity {}",
                self.free, self.cfg.fast_capacity_pages
            ));
        }
        let nb = self.cfg.hotness_bins as usize;
        let threshold = self.cfg.cooling_threshold();
        for (pid, p) in &self.procs {
            if !(0.0..=1.0).contains(&p.a_miss) {
                return Err(format!("pid {pid}: a_miss {} outside [0, 1]", p.a_miss));
            }
            if p.bins.len() != nb {
                return Err(format!("pid {pid}: {} bins, expected {nb}", p.bins.len()));
            }
            let mut n = [0u64; 2];
            for (page, rec) in &p.pages {
                n[rec.tier.idx()] += 1;
                let c = p.eff(rec);
                if c > threshold {
                    return Err(format!("pid {pid} page {page}: count {c} above threshold"));
                }
                let b = bin_of(c, nb);
                if !p.bins[b][rec.tier.idx()].contains(&(rec.stamp, *page)) {
                    return Err(format!(
                        "pid {pid} page {page}: count {c} ({}) not in bin {b}",
                        rec.tier
                    ));
                }
                if (c == threshold) != p.saturated.contains(page) {
                    return Err(format!("pid {pid} page {page}: saturation mismatch at {c}"));
                }
            }
            let listed: u64 = p
                .bins
                .iter()
                .map(|b| (b[0].len() + b[1].len()) as u64)
                .sum();
            if listed != p.pages.len() as u64 || n != p.n {
                return Err(format!(
                    "pid {pid}: {listed} pages in bins, {} pages, counts {:?} vs {:?}",
                    p.pages.len(),
                    n,
                    p.n
                ));
            }
        }
        Ok(())
    }
}
