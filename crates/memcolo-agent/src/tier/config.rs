//! `[tier]`: the tiering service's configuration, and the scheduling of a
//! process's tier threads it implies.

use memcolo_policy::maxmem::validate_t_miss;
use memcolo_policy::tiering::{self, TierThreadSched};
use memcolo_proto::tier::TIER_SOCKET_NAME;
use memcolo_tier::manager::TierConfig;
use memcolo_tier::node::NodeTiming;
use memcolo_tier::region::PAGE;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `[tier]`: MaxMem tiering. On by default: the service acts only on the regions
/// processes hand it over the tiering socket (libmemcolo with `MEMCOLO_TIER=1`), and
/// idle it holds a socket and two threads that sleep until a region arrives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierSection {
    /// Serve the tiering socket and manage the regions processes send. Default true.
    pub enabled: bool,
    /// The tiering socket. Default `tier.sock` in the agent socket's directory.
    pub socket: Option<PathBuf>,
    /// Fast memory shared by every tiered region, bytes (MaxMem's DRAM tier).
    /// Default 1 GiB.
    pub fast_bytes: u64,
    /// Target FMMR of a process that names none, `]0, 1]`. Default 1 (best effort).
    pub default_t_miss: f64,
    /// Slow tier: `compressed` (LZ4 in the agent's memory) or `remote:HOST:PORT`
    /// (a `memcolo memserver`). Default `compressed`.
    pub slow: String,
    /// With `remote:`: the file holding the secret shared with the memory server
    /// (its `--secret-file`; a regular file of 32 to 4096 bytes, mode 0600 or
    /// stricter). Default none.
    pub slow_secret_file: Option<PathBuf>,
    /// With `remote:` and no `slow_secret_file`: talk to a memory server started
    /// with `--insecure-no-auth` (anyone who reaches it reads and writes every
    /// page). For tests on the loopback interface only. Default false.
    pub slow_insecure_no_auth: bool,
    /// Bytes the compressed slow tier may hold. Default 8 GiB.
    pub slow_capacity_bytes: u64,
    /// Policy migrations per epoch, bytes (MaxMem §3.1: 4 GB per epoch; half for
    /// reallocation, half for hot/cold exchange). Default 256 MiB.
    pub migration_cap_bytes: u64,
    /// Sampling window, ms. Default 50.
    pub window_ms: u64,
    /// Windows per policy epoch. Default 20 (1 s epochs, MaxMem §3.1).
    pub windows_per_epoch: u32,
    /// Slots per sampling window. While a region has slow accesses, its sampled
    /// pages touched are re-armed at every slot boundary, so that its fast accesses
    /// are counted per slot rather than as distinct pages per window (the FMMR is a
    /// ratio of accesses, MaxMem §3). Default 5 (10 ms slots); 1: no re-arming.
    pub slots_per_window: u32,
    /// Most resident pages sampled per region and window. Default 64.
    pub sample_pages: usize,
    /// Sample hits aimed at per region and window (each costs the process a fault;
    /// 0: always `sample_pages`). Default 16.
    pub sample_target_hits: usize,
    /// Standard error of an epoch's measured FMMR that each window's sample is sized
    /// for (within `sample_target_hits` and `sample_pages`); 0: always aim at
    /// `sample_target_hits`. Default 0.01. The sample is also all the hotness bins
    /// learn from, so this trades the process's sample faults against how well its
    /// hot pages are told apart (`bench/tiering/RESULTS.md`, sections kv and earlier/kv-*).
    pub sample_fmmr_error: f64,
    /// Eviction worker threads per region. Default 1.
    pub evict_workers: usize,
    /// Serve latency-critical processes' faults first: the fault thread of every
    /// region of a process with t_miss < 1 runs `SCHED_FIFO` (priority 1), so that
    /// its faults do not wait for a CPU behind a thrashing best-effort process's
    /// fault and eviction threads. Follows live target changes. Default true.
    pub lc_fault_priority: bool,
    /// Nice value (-20..=19) of the fault and eviction threads of a best-effort
    /// process's regions (t_miss >= 1). A latency-critical process's faulting
    /// thread, once its page is mapped, waits for its CPU behind every runnable
    /// thread there; beside a thrashing best-effort process, that was its fault
    /// thread (busy ~100 % at 20K+ faults/s) and eviction workers
    /// (`bench/tiering/faultpath.py`). 0 leaves them at the default. Default 19.
    pub be_thread_nice: i32,
    /// Run the fault and eviction threads of a best-effort process's regions
    /// (t_miss >= 1) `SCHED_IDLE` (a rule of ours, not MaxMem's): they get a CPU only
    /// when no ordinary or real-time thread wants it, a latency-critical process's
    /// thread waking beside them preempts them at once, and the scheduler places
    /// wake-ups on a CPU running only such threads as on an idle one. At nice 19
    /// (`be_thread_nice`, which still applies when this is off) GUPS's fault
    /// thread, serving 12-17K slow faults/s beside the KV store, took most of a
    /// vCPU: 40-52 µs of wall time per fault (`bench/tiering/RESULTS.md`, earlier/kv-final4).
    /// Measured: of that wall time 12-17 µs is the thread's CPU, the rest
    /// preemption, and `SCHED_IDLE` took a quarter of GUPS's faults away without
    /// the store gaining (3 paired reps, 101K against 104K ops/s at nice 19,
    /// `bench/tiering/RESULTS.md`, section earlier/kv-idle-dev; `docs/design.md`, "A best-effort
    /// process's tier threads run idle: measured, off"). Default false.
    pub be_thread_idle: bool,
    /// Most pages per region on probation: the next victims, unmapped with their
    /// contents kept in fast memory, so that a touch gives a page a second chance
    /// instead of a trip to the slow tier (0: none). Default 128 (never more than an
    /// eighth of the region's fast pages; only once the region has had to evict).
    pub probation_pages: usize,
    /// Count a slow fault on a page evicted fewer evictions ago than its region has
    /// resident pages (a refault at a short distance, as Linux's workingset
    /// detection) as a hotness sample for sure, so that a process given fast memory
    /// keeps its hot pages there sooner instead of as the sampler happens on them
    /// (`memcolo_tier::manager`, "Refaults"). Measured on the KV bench: arrival 14
    /// epochs against 16-18 and 11 % less fast memory at the same t_miss, with 12 %
    /// less throughput. Default false.
    pub refault_samples: bool,
    /// Rule T3a of `memcolo_policy::maxmem`: the fast memory reallocated per epoch
    /// follows the neediest process's distance from its target by its newest
    /// measured miss ratio, from `R/2` near the target (`R`, half the migration cap,
    /// MaxMem §3.1) up to the whole cap while it misses at least twice its t_miss,
    /// and a needy process whose newest measured ratio meets its target is held
    /// while its a_miss EWMA follows; false: `R` per epoch as in §3.1. Default true.
    pub proportional_step: bool,
}

impl Default for TierSection {
    /// The tier manager's and the node's own defaults ([`TierConfig::new`],
    /// [`NodeTiming::default`]) where they have one; the rest are the agent's.
    fn default() -> Self {
        let manager = TierConfig::new(0);
        let timing = NodeTiming::default();
        TierSection {
            enabled: true,
            socket: None,
            fast_bytes: 1 << 30,
            default_t_miss: 1.0,
            slow: "compressed".into(),
            slow_secret_file: None,
            slow_insecure_no_auth: false,
            slow_capacity_bytes: 8 << 30,
            migration_cap_bytes: 256 << 20,
            window_ms: timing.window.as_millis() as u64,
            windows_per_epoch: timing.windows_per_epoch,
            slots_per_window: timing.slots_per_window,
            sample_pages: manager.sample_pages,
            sample_target_hits: manager.sample_target_hits,
            sample_fmmr_error: manager.sample_fmmr_error,
            evict_workers: manager.evict_workers,
            lc_fault_priority: true,
            be_thread_nice: 19,
            be_thread_idle: false,
            probation_pages: manager.probation_pages,
            refault_samples: manager.refault_samples,
            proportional_step: true,
        }
    }
}

impl TierSection {
    /// Checks the section.
    ///
    /// # Errors
    /// A message naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.fast_bytes < PAGE as u64 {
            return Err(format!(
                "tier.fast_bytes {} is below one page",
                self.fast_bytes
            ));
        }
        validate_t_miss(self.default_t_miss).map_err(|e| format!("tier.default_t_miss: {e}"))?;
        if self.slow != "compressed" && !self.slow.starts_with("remote:") {
            return Err(format!(
                "tier.slow {:?}: `compressed` or `remote:HOST:PORT`",
                self.slow
            ));
        }
        if self.slow.starts_with("remote:") {
            match (&self.slow_secret_file, self.slow_insecure_no_auth) {
                (Some(_), true) => {
                    return Err(
                        "tier.slow_secret_file and tier.slow_insecure_no_auth: one or the other"
                            .into(),
                    )
                }
                (None, false) => {
                    return Err(format!(
                        "tier.slow {:?} needs tier.slow_secret_file (the memory server's --secret-file), or tier.slow_insecure_no_auth for tests on loopback",
                        self.slow
                    ))
                }
                _ => {}
            }
        }
        if !(self.sample_fmmr_error >= 0.0 && self.sample_fmmr_error < 1.0) {
            return Err(format!(
                "tier.sample_fmmr_error {}: in [0, 1)",
                self.sample_fmmr_error
            ));
        }
        if !(-20..=19).contains(&self.be_thread_nice) {
            return Err(format!(
                "tier.be_thread_nice {}: in -20..=19",
                self.be_thread_nice
            ));
        }
        if self.window_ms == 0 || self.windows_per_epoch == 0 || self.sample_pages == 0 {
            return Err(
                "tier.window_ms, windows_per_epoch and sample_pages must be positive".into(),
            );
        }
        Ok(())
    }

    /// The tiering socket for an agent socket at `agent_socket`.
    pub fn socket_path(&self, agent_socket: &Path) -> PathBuf {
        self.socket.clone().unwrap_or_else(|| {
            agent_socket
                .parent()
                .unwrap_or(Path::new("/"))
                .join(TIER_SOCKET_NAME)
        })
    }
}

/// The scheduling of the tier threads of a process with target `t_miss` (`None`: not
/// registered), by [`tiering::tier_thread_sched`] with this section's settings.
pub(super) fn thread_sched(cfg: &TierSection, t_miss: Option<f64>) -> TierThreadSched {
    tiering::tier_thread_sched(
        t_miss,
        cfg.lc_fault_priority,
        cfg.be_thread_nice,
        cfg.be_thread_idle,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_effort_tier_threads_take_the_configured_nice() {
        let cfg = TierSection::default();
        assert_eq!(thread_sched(&cfg, Some(1.0)).nice, 19);
        assert_eq!(thread_sched(&cfg, Some(0.1)).nice, 0);
        assert_eq!(thread_sched(&cfg, None).nice, 0);
        let off = TierSection {
            be_thread_nice: 0,
            ..TierSection::default()
        };
        assert_eq!(thread_sched(&off, Some(1.0)).nice, 0);
        let bad = TierSection {
            be_thread_nice: 20,
            ..TierSection::default()
        };
        assert!(bad.validate().unwrap_err().contains("be_thread_nice"));
    }

    #[test]
    fn only_best_effort_tier_threads_run_idle() {
        assert!(!thread_sched(&TierSection::default(), Some(1.0)).idle);
        let cfg = TierSection {
            be_thread_idle: true,
            ..TierSection::default()
        };
        assert!(thread_sched(&cfg, Some(1.0)).idle);
        assert!(!thread_sched(&cfg, Some(0.1)).idle);
        assert!(!thread_sched(&cfg, Some(0.999)).idle);
        assert!(!thread_sched(&cfg, None).idle);
        let off = TierSection {
            be_thread_idle: false,
            ..TierSection::default()
        };
        assert!(!thread_sched(&off, Some(1.0)).idle);
        // A target change moves a process between the two (applied live).
        assert_ne!(
            thread_sched(&cfg, Some(1.0)).idle,
            thread_sched(&cfg, Some(0.07)).idle
        );
    }

    #[test]
    fn sample_fmmr_error_is_checked() {
        let mut t = TierSection::default();
        assert!(t.validate().is_ok());
        t.sample_fmmr_error = 0.0;
        assert!(t.validate().is_ok(), "0: aim at sample_target_hits");
        for bad in [-0.1, 1.0, f64::NAN] {
            t.sample_fmmr_error = bad;
            assert!(t.validate().unwrap_err().contains("sample_fmmr_error"));
        }
    }
}
