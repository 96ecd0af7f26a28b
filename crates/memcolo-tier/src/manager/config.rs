//! The settings of one tier manager ([`TierConfig`]).

#[cfg(doc)]
use super::Placement;
#[cfg(doc)]
use super::TierManager;
#[cfg(doc)]
use crate::PageKey;

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
