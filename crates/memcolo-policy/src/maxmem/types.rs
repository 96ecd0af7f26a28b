//! The MaxMem policy's public types: tiers, configuration, samples, decisions and
//! status (see the parent module for the rules).

use crate::error::PolicyError;
use crate::types::Pid;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A page of a process, in the caller's unit of placement (e.g. virtual address
/// divided by the page size). Unique within one process.
pub type PageId = u64;

/// The memory tier a page sits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// The fast tier (local DRAM).
    Fast,
    /// The slow tier (far memory, compressed memory, CXL or PMEM node).
    Slow,
}

impl Tier {
    /// The lowercase name used in logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Fast => "fast",
            Tier::Slow => "slow",
        }
    }

    pub(super) fn idx(self) -> usize {
        match self {
            Tier::Fast => 0,
            Tier::Slow => 1,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

pub(super) const FAST: usize = 0;
pub(super) const SLOW: usize = 1;

/// Configuration of the MaxMem policy (MaxMem §3.1–§3.2 give the paper's values).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MaxMemConfig {
    /// Pages of fast memory shared by the managed processes (128 GB in §5).
    pub fast_capacity_pages: u64,
    /// Pages the policy may migrate per epoch, each move in either direction counting
    /// once (4 GB per 1 s epoch in §3.1); half for reallocation (T3), half for
    /// keeping hot pages fast (T5). 0 disables policy migrations.
    pub migration_cap_pages: u64,
    /// Hotness bins per process, 2 to 32 (6 in §3.2).
    pub hotness_bins: u32,
    /// EWMA weight of the newest epoch's miss ratio, in `]0, 1]` (0.5 in §3.1).
    pub ewma_lambda: f64,
    /// Rule T3a (memcolo's, not the paper's; false: §3.1 exactly): the fast memory
    /// that changes hands in an epoch follows how far the neediest process is from
    /// its target by its newest measured miss ratio, `R·clamp(x/t_miss − 1, 1/2,
    /// cap/R)` pages instead of `R` (never more than the migration cap), and a needy
    /// process whose newest measurement already meets its target, or falls fast
    /// enough to meet it in the next epoch, is held (given nothing) while its EWMA
    /// follows. See the module documentation.
    #[serde(default)]
    pub proportional_step: bool,
}

impl MaxMemConfig {
    /// Default number of hotness bins (MaxMem §3.2).
    pub const DEFAULT_HOTNESS_BINS: u32 = 6;
    /// Default EWMA weight λ (MaxMem §3.1).
    pub const DEFAULT_EWMA_LAMBDA: f64 = 0.5;
    /// Default migration cap per epoch, bytes: 4 GiB (MaxMem §3.1).
    pub const DEFAULT_MIGRATION_CAP_BYTES: u64 = 4 << 30;

    /// The paper's configuration for a fast tier of `fast_capacity_pages` pages of
    /// `page_bytes` bytes each: a cap of 4 GiB per epoch in those pages (at least
    /// 2), 6 bins, λ = 0.5.
    pub fn with_capacity(fast_capacity_pages: u64, page_bytes: u64) -> Self {
        MaxMemConfig {
            fast_capacity_pages,
            migration_cap_pages: (Self::DEFAULT_MIGRATION_CAP_BYTES / page_bytes.max(1)).max(2),
            hotness_bins: Self::DEFAULT_HOTNESS_BINS,
            ewma_lambda: Self::DEFAULT_EWMA_LAMBDA,
            proportional_step: false,
        }
    }

    /// Checks the configuration: `fast_capacity_pages > 0`, `2 <= hotness_bins <=
    /// 32`, `0 < ewma_lambda <= 1`.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.fast_capacity_pages == 0 {
            return Err(PolicyError::InvalidConfig {
                field: "fast_capacity_pages",
                value: "0".into(),
                reason: "the fast tier must hold >= 1 page",
            });
        }
        if !(2..=32).contains(&self.hotness_bins) {
            return Err(PolicyError::InvalidConfig {
                field: "hotness_bins",
                value: self.hotness_bins.to_string(),
                reason: "need 2 to 32 hotness bins",
            });
        }
        if !(self.ewma_lambda > 0.0 && self.ewma_lambda <= 1.0) {
            return Err(PolicyError::InvalidConfig {
                field: "ewma_lambda",
                value: self.ewma_lambda.to_string(),
                reason: "the EWMA weight must be in ]0, 1]",
            });
        }
        Ok(())
    }

    /// The reallocation budget `R` of rule T3, pages per epoch.
    pub fn reallocation_pages(&self) -> u64 {
        self.migration_cap_pages / 2
    }

    /// The page-migration budget `X` of rule T5, page moves per epoch.
    pub fn exchange_pages(&self) -> u64 {
        self.migration_cap_pages - self.reallocation_pages()
    }

    /// The reallocation budget of an epoch whose neediest process has
    /// `ratio = x/t_miss` (> 1; `x` its distance measure, see rule T3a), pages: `R`
    /// by §3.1; with [`MaxMemConfig::proportional_step`] (rule T3a)
    /// `round(R·clamp(ratio − 1, floor, cap/R))`, within `1..=cap`, where `floor` is
    /// 1/2 ([`MaxMemConfig::MIN_STEP_OF_R`]) while that process's measured ratio is
    /// `converging` on its target (the last step still showing), and 1 otherwise.
    ///
    /// Worked examples (cap 64, R = 32): ratio 10 (x 1, t_miss 0.1) → 64, the
    /// whole cap; 1.75 → 24 (three quarters of R: the distance is 75 % of the
    /// target); 1.2 → 16 converging (the floor, half of R), 32 otherwise; with a cap
    /// of 128 (R = 64): ratio 2.5 → 96, 10 → 128.
    pub fn reallocation_budget(&self, ratio: f64, converging: bool) -> u64 {
        let r = self.reallocation_pages();
        // No needy process (ratio <= 1, or NaN): R, as §3.1.
        if !self.proportional_step || r == 0 || ratio.is_nan() || ratio <= 1.0 {
            return r;
        }
        let floor = if converging { Self::MIN_STEP_OF_R } else { 1.0 };
        let most = self.migration_cap_pages as f64 / r as f64;
        let f = (ratio - 1.0).clamp(floor, most.max(floor));
        ((r as f64 * f).round() as u64).clamp(1, self.migration_cap_pages)
    }

    /// Rule T3a's smallest step near the target while the neediest process's
    /// measured ratio converges on it, as a fraction of `R`.
    pub const MIN_STEP_OF_R: f64 = 0.5;

    /// The count at which a page triggers cooling: `2^(hotness_bins − 1)`.
    pub fn cooling_threshold(&self) -> u64 {
        1u64 << (self.hotness_bins - 1)
    }
}

/// Checks a target FMMR: `0 < t_miss <= 1` (MaxMem §3.1: `t_miss ∈ ]0, 1]`; a target
/// of 0 means the process should not be tiered at all).
pub fn validate_t_miss(t_miss: f64) -> Result<(), PolicyError> {
    if t_miss > 0.0 && t_miss <= 1.0 {
        Ok(())
    } else {
        Err(PolicyError::InvalidConfig {
            field: "t_miss",
            value: t_miss.to_string(),
            reason: "a target FMMR must be in ]0, 1] (0 means: do not tier the process)",
        })
    }
}

/// What one process accessed during one epoch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcSample {
    /// The process.
    pub pid: Pid,
    /// Accesses served by the fast tier (sampled or estimated; same unit as
    /// `slow_accesses`).
    pub fast_accesses: u64,
    /// Accesses served by the slow tier.
    pub slow_accesses: u64,
    /// Samples per page, in the order they were taken (order matters for cooling,
    /// rule T6). Pages the policy does not know are ignored.
    pub pages: Vec<(PageId, u32)>,
}

/// Why a migration was emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrationReason {
    /// A demotion from a process whose allocation shrank this epoch (T3, T4).
    Reallocation,
    /// A demotion of a page above the process's allocation for another reason
    /// (a move the caller reported as failed, [`MaxMem::set_tier`]).
    Excess,
    /// A promotion into allocation the process has not filled (T5).
    Fill,
    /// One half of a hot/cold exchange (T5).
    Exchange,
}

impl MigrationReason {
    /// The snake_case name used in logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            MigrationReason::Reallocation => "reallocation",
            MigrationReason::Excess => "excess",
            MigrationReason::Fill => "fill",
            MigrationReason::Exchange => "exchange",
        }
    }
}

/// One page to move between tiers. The policy already counts the page in its new
/// tier; a caller that fails to move it says so with [`MaxMem::set_tier`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Migration {
    /// The process.
    pub pid: Pid,
    /// The page.
    pub page: PageId,
    /// The tier to move it to.
    pub to: Tier,
    /// Why.
    pub reason: MigrationReason,
}

/// The result of a fault reported with [`MaxMem::fault_in`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultIn {
    /// A fast page of the process to evict to the slow tier because the faulting page
    /// took its place (T7); `Some(page)` equal to the faulting page means: serve the
    /// access, then evict it again (the process holds no fast memory).
    pub victim: Option<PageId>,
}

/// Where a process stands against its target (rule T2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Need {
    /// `a_miss > t_miss`: needs more fast memory.
    Needy,
    /// `a_miss < t_miss`: may give fast memory.
    Surplus,
    /// `a_miss = t_miss`: keeps its allocation.
    Met,
}

impl Need {
    /// The snake_case name used in logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Need::Needy => "needy",
            Need::Surplus => "surplus",
            Need::Met => "met",
        }
    }
}

/// Pages of one hotness bin, per tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BinCount {
    /// Pages of the bin in fast memory.
    pub fast: u64,
    /// Pages of the bin in slow memory.
    pub slow: u64,
}

/// One managed process as the policy sees it after the latest call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcStatus {
    /// The process.
    pub pid: Pid,
    /// Position in arrival order (first come, first served; lower came first).
    pub arrival: u64,
    /// Target FMMR, `]0, 1]`.
    pub t_miss: f64,
    /// FMMR as of the last epoch (EWMA, rule T1), `[0, 1]`.
    pub a_miss: f64,
    /// Where the process stood against its target in the last epoch.
    pub need: Need,
    /// The target cannot be met with the fast memory there is (rule T4).
    pub infeasible: bool,
    /// Fast memory allotted, pages.
    pub alloc_pages: u64,
    /// Pages in the fast tier, as placed by the policy.
    pub fast_pages: u64,
    /// Pages in the slow tier, as placed by the policy: a demoted page counts here at
    /// once, while its move is left to whoever executes the placement (the tier
    /// manager's eviction workers, whose stored pages may lag far behind).
    pub slow_pages: u64,
    /// Change of `alloc_pages` by the last epoch's reallocation, pages.
    pub alloc_change_pages: i64,
    /// Coolings of the hotness bins so far.
    pub coolings: u64,
    /// Pages per hotness bin, coldest first.
    pub bins: Vec<BinCount>,
}

/// What one epoch decided.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochOutcome {
    /// The epoch's number, from 1.
    pub epoch: u64,
    /// Migrations to carry out, in order (demotions before the promotions they make
    /// room for).
    pub migrations: Vec<Migration>,
    /// Fast memory that changed hands between processes or left the free pool: the
    /// sum of the allocations' increases, pages (`<= R`).
    pub reallocated_pages: u64,
    /// The managed processes, in arrival order.
    pub procs: Vec<ProcStatus>,
    /// Fast memory held by nobody, pages.
    pub free_pages: u64,
}
