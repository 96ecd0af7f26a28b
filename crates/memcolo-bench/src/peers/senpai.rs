//! A re-implementation of Senpai, the userspace controller of Meta's TMO
//! (Weiner et al., "TMO: Transparent Memory Offloading in Datacenters", ASPLOS'22,
//! §3.3; the published controller `senpai.py` of facebookincubator/senpai), for the
//! colocation bench: it squeezes a cgroup's memory limit until the group's PSI memory
//! stall reaches a target, and backs off above it.
//!
//! The algorithm, as published: once a second, add the growth of the group's
//! cumulative `some` memory stall (µs) to an integral. If the integral is above the
//! target (`pressure`, µs per `interval`), grow the limit by
//! `min(max_backoff, max_backoff × (integral / pressure / coeff_backoff)²)` of itself;
//! otherwise, once every `interval` seconds, shrink it by
//! `min(max_probe, max_probe × (pressure / integral / coeff_probe)²)`. Each change
//! resets the integral and waits `interval − 1` ticks. The limit stays within
//! `[min_size, max_size]`, in whole pages; when the limit read back is not the one
//! last written (the first tick, or somebody else changed it) it restarts from the
//! group's usage. Defaults are the published ones ([`SenpaiConfig::default`]).
//!
//! What differs, and why: Senpai writes v2 `memory.high`, a throttling limit. On a
//! cgroup v1 node (this machine) the only limit is `memory.limit_in_bytes`, a hard
//! one: a write below usage reclaims on the writer's thread and fails with `EBUSY`
//! when it cannot; such a step is skipped and counted. PSI comes from a cgroup2 group
//! holding the same processes (v1 has no per-group PSI).

/// Senpai's parameters (`senpai.py` command-line options, same defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SenpaiConfig {
    /// Lowest limit, bytes (`--min-size`, 100 MiB).
    pub min_size_bytes: u64,
    /// Highest limit, bytes (`--max-size`, 100 GiB).
    pub max_size_bytes: u64,
    /// Ticks (seconds) between probes (`--interval`, 6).
    pub interval_ticks: u32,
    /// Target cumulative `some` memory stall per interval, µs (`--pressure`, 10 ms).
    pub pressure_us: u64,
    /// Largest shrink per probe, as a fraction of the limit (`--max-probe`, 0.01).
    pub max_probe: f64,
    /// Largest growth per back-off, as a fraction (`--max-backoff`, 1.0).
    pub max_backoff: f64,
    /// The probe reaches `max_probe` at 1/`coeff_probe` of the target (`--coeff-probe`, 10).
    pub coeff_probe: f64,
    /// The back-off reaches `max_backoff` at `coeff_backoff` × the target
    /// (`--coeff-backoff`, 20).
    pub coeff_backoff: f64,
}

impl Default for SenpaiConfig {
    fn default() -> Self {
        SenpaiConfig {
            min_size_bytes: 100 << 20,
            max_size_bytes: 100 << 30,
            interval_ticks: 6,
            pressure_us: 10_000,
            max_probe: 0.01,
            max_backoff: 1.0,
            coeff_probe: 10.0,
            coeff_backoff: 20.0,
        }
    }
}

/// What one tick decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SenpaiStep {
    /// Nothing to write (waiting out the interval).
    Hold,
    /// Write this limit (bytes); `factor` is the relative change asked for
    /// (negative: probe, positive: back-off, 0: reset to usage).
    Set { limit_bytes: u64, factor: f64 },
}

/// The controller's state between ticks.
#[derive(Clone, Debug)]
pub struct Senpai {
    cfg: SenpaiConfig,
    /// The limit last written, if any.
    limit: Option<u64>,
    last_total_us: u64,
    integral_us: u64,
    grace_ticks: u32,
}

impl Senpai {
    /// A controller that starts from the group's cumulative stall `total_us` now.
    pub fn new(cfg: SenpaiConfig, total_us: u64) -> Self {
        Senpai {
            cfg,
            limit: None,
            last_total_us: total_us,
            integral_us: 0,
            grace_ticks: cfg.interval_ticks,
        }
    }

    /// The first write: the limit becomes the group's usage (clamped), as Senpai does
    /// at start.
    pub fn start(&mut self, usage_bytes: u64) -> SenpaiStep {
        let limit = self.sanitize(usage_bytes);
        self.limit = Some(limit);
        SenpaiStep::Set {
            limit_bytes: limit,
            factor: 0.0,
        }
    }

    /// One tick (a second): `total_us` is the group's cumulative `some` memory stall,
    /// `limit_read` the limit the group has now, `usage_bytes` its usage.
    pub fn tick(&mut self, total_us: u64, limit_read: u64, usage_bytes: u64) -> SenpaiStep {
        let delta = total_us.saturating_sub(self.last_total_us);
        self.last_total_us = total_us;
        self.integral_us = self.integral_us.saturating_add(delta);
        let c = self.cfg;
        if self.integral_us > c.pressure_us {
            let err = self.integral_us as f64 / c.pressure_us as f64;
            let adj = ((err / c.coeff_backoff).powi(2) * c.max_backoff).min(c.max_backoff);
            self.grace_ticks = c.interval_ticks.saturating_sub(1);
            return self.scale(adj, limit_read, usage_bytes);
        }
        if self.grace_ticks > 0 {
            self.grace_ticks -= 1;
            return SenpaiStep::Hold;
        }
        let err = c.pressure_us as f64 / self.integral_us.max(1) as f64;
        let adj = ((err / c.coeff_probe).powi(2) * c.max_probe).min(c.max_probe);
        self.grace_ticks = c.interval_ticks.saturating_sub(1);
        self.scale(-adj, limit_read, usage_bytes)
    }

    /// Records that the last write failed (v1 `EBUSY`): the next tick restarts from
    /// the limit the group really has.
    pub fn write_failed(&mut self) {
        self.limit = None;
    }

    fn scale(&mut self, factor: f64, limit_read: u64, usage_bytes: u64) -> SenpaiStep {
        self.integral_us = 0;
        let base = match self.limit {
            Some(l) if l == limit_read => l,
            // Not the limit we wrote: start again from usage.
            _ => usage_bytes,
        };
        let grown = base as f64 + base as f64 * factor;
        let limit = self.sanitize(grown.max(0.0) as u64);
        self.limit = Some(limit);
        SenpaiStep::Set {
            limit_bytes: limit,
            factor,
        }
    }

    fn sanitize(&self, bytes: u64) -> u64 {
        bytes.clamp(self.cfg.min_size_bytes, self.cfg.max_size_bytes) & !4095
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn set(step: SenpaiStep) -> (u64, f64) {
        match step {
            SenpaiStep::Set {
                limit_bytes,
                factor,
            } => (limit_bytes, factor),
            SenpaiStep::Hold => panic!("expected a write, got Hold"),
        }
    }

    #[test]
    fn starts_at_usage_in_whole_pages_within_bounds() {
        let mut s = Senpai::new(SenpaiConfig::default(), 0);
        assert_eq!(set(s.start(1000 * MIB + 123)).0, 1000 * MIB);
        let mut s = Senpai::new(SenpaiConfig::default(), 0);
        assert_eq!(set(s.start(MIB)).0, 100 * MIB, "min_size");
    }

    #[test]
    fn without_stall_it_probes_by_max_probe_once_per_interval() {
        let mut s = Senpai::new(SenpaiConfig::default(), 0);
        let l0 = set(s.start(1000 * MIB)).0;
        // The first `interval` ticks are grace.
        for _ in 0..6 {
            assert_eq!(s.tick(0, l0, l0), SenpaiStep::Hold);
        }
        let (l1, f) = set(s.tick(0, l0, l0));
        assert_eq!(f, -0.01, "no stall: the largest probe");
        assert_eq!(l1, ((l0 as f64 * 0.99) as u64) & !4095);
        // Then interval - 1 ticks of grace before the next probe.
        for _ in 0..5 {
            assert_eq!(s.tick(0, l1, l1), SenpaiStep::Hold);
        }
        assert!(set(s.tick(0, l1, l1)).0 < l1);
    }

    #[test]
    fn probe_shrinks_less_near_the_target() {
        let mut s = Senpai::new(SenpaiConfig::default(), 0);
        let l0 = set(s.start(1000 * MIB)).0;
        let mut total = 0;
        for _ in 0..6 {
            total += 1000; // 1 ms a second: 6 ms over the interval, under the 10 ms target
            assert_eq!(s.tick(total, l0, l0), SenpaiStep::Hold);
        }
        total += 1000;
        let (_, f) = set(s.tick(total, l0, l0));
        // err = 10_000 / 7_000; adj = (err / 10)^2 * 0.01
        let want = (10_000f64 / 7_000.0 / 10.0).powi(2) * 0.01;
        assert!((f + want).abs() < 1e-12, "{f} vs -{want}");
    }

    #[test]
    fn stall_above_target_backs_off_at_once_up_to_max_backoff() {
        let mut s = Senpai::new(SenpaiConfig::default(), 0);
        let l0 = set(s.start(1000 * MIB)).0;
        // 40 ms of stall in one tick: err 4, adj (4/20)^2 = 0.04.
        let (l1, f) = set(s.tick(40_000, l0, l0));
        assert!((f - 0.04).abs() < 1e-12, "{f}");
        assert_eq!(l1, ((l0 as f64 * 1.04) as u64) & !4095);
        // 10 s of stall in one tick: capped at doubling.
        let (l2, f) = set(s.tick(40_000 + 10_000_000, l1, l1));
        assert_eq!(f, 1.0);
        assert_eq!(l2, (l1 * 2) & !4095);
    }

    #[test]
    fn a_limit_changed_behind_its_back_restarts_from_usage() {
        let mut s = Senpai::new(SenpaiConfig::default(), 0);
        let l0 = set(s.start(1000 * MIB)).0;
        let (l1, _) = set(s.tick(40_000, l0 + 4096, 500 * MIB));
        assert_eq!(l1, ((500.0 * MIB as f64 * 1.04) as u64) & !4095);
        // A failed write: the same.
        s.write_failed();
        let (l2, _) = set(s.tick(80_000, l1, 600 * MIB));
        assert_eq!(l2, ((600.0 * MIB as f64 * 1.04) as u64) & !4095);
    }

    #[test]
    fn a_counter_that_goes_backwards_counts_as_no_stall() {
        let mut s = Senpai::new(SenpaiConfig::default(), 5_000_000);
        let l0 = set(s.start(1000 * MIB)).0;
        for _ in 0..6 {
            assert_eq!(s.tick(0, l0, l0), SenpaiStep::Hold);
        }
        assert_eq!(set(s.tick(0, l0, l0)).1, -0.01);
    }
}
