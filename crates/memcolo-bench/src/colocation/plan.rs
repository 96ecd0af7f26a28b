//! The order of a sweep's runs, which runs a noisy machine spoiled, and how long the
//! rest will take.
//!
//! Runs are interleaved: repeat 1 of every (level, mode) cell, then repeat 2, and so
//! on, so a slow drift of the machine (a neighbour, the host) spreads over every cell
//! instead of landing on one mode. Within a repeat the modes of a level rotate by one
//! place per repeat, so no mode always runs first after a level change.
//!
//! A run is rejected when work other than the LC service and the bench took more than
//! a set share of the LC CPUs, or when the host stole more than a set share of them
//! ([`RejectPolicy`]); it is run again, up to `max_attempts` times, and then the least
//! disturbed attempt is kept and marked.

use std::time::Duration;

use super::args::Mode;

/// One run of the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// 1-based repeat.
    pub rep: u32,
    pub level: u32,
    pub mode: Mode,
}

/// The interleaved order of `repeats` runs of every (level, mode) cell.
pub fn interleaved(levels: &[u32], modes: &[Mode], repeats: u32) -> Vec<Slot> {
    let mut out = Vec::with_capacity(levels.len() * modes.len() * repeats as usize);
    for rep in 1..=repeats {
        for &level in levels {
            let n = modes.len();
            for i in 0..n {
                let mode = modes[(i + (rep as usize - 1)) % n];
                out.push(Slot { rep, level, mode });
            }
        }
    }
    out
}

/// When a run counts as disturbed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RejectPolicy {
    /// Largest share of the LC CPUs other work may take, percent.
    pub foreign_pct_max: f64,
    /// Largest share of the LC CPUs' time the host may steal, percent.
    pub steal_pct_max: f64,
    /// Attempts per run before the least disturbed is kept.
    pub max_attempts: u32,
}

/// How disturbed a run was: the shares of the LC CPUs taken by other work and by the
/// host, percent (`None`: not measured, the LC service not pinned).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Disturbance {
    pub foreign_pct: Option<f64>,
    pub steal_pct: Option<f64>,
}

impl Disturbance {
    /// One number to compare attempts by: the larger excess over its threshold.
    pub fn score(&self, p: &RejectPolicy) -> f64 {
        let f = self.foreign_pct.unwrap_or(0.0) / p.foreign_pct_max.max(1e-9);
        let s = self.steal_pct.unwrap_or(0.0) / p.steal_pct_max.max(1e-9);
        f.max(s)
    }
}

impl RejectPolicy {
    /// Why a run with `d` is rejected, or `None` if it is accepted.
    pub fn verdict(&self, d: &Disturbance) -> Option<String> {
        let mut why = Vec::new();
        if let Some(f) = d.foreign_pct.filter(|&f| f > self.foreign_pct_max) {
            why.push(format!(
                "foreign load {f:.1} % of the LC CPUs > {}",
                self.foreign_pct_max
            ));
        }
        if let Some(s) = d.steal_pct.filter(|&s| s > self.steal_pct_max) {
            why.push(format!(
                "host steal {s:.1} % of the LC CPUs > {}",
                self.steal_pct_max
            ));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

/// Of the attempts of one run (their disturbance), which to keep once all were
/// rejected: the least disturbed (the first of equals).
pub fn least_disturbed(attempts: &[Disturbance], p: &RejectPolicy) -> Option<usize> {
    (0..attempts.len()).min_by(|&a, &b| {
        attempts[a]
            .score(p)
            .partial_cmp(&attempts[b].score(p))
            .unwrap_or(std::cmp::Ordering::Equal)
    })
}

/// An estimate of the time left, from the runs done so far.
#[derive(Clone, Debug)]
pub struct Eta {
    /// Seconds a run takes before any has finished.
    prior_s: f64,
    done: u32,
    total_s: f64,
}

impl Eta {
    /// `prior` is the guess for one run until the first finishes.
    pub fn new(prior: Duration) -> Self {
        Eta {
            prior_s: prior.as_secs_f64(),
            done: 0,
            total_s: 0.0,
        }
    }

    /// Records one finished run (attempt) that took `took`.
    pub fn record(&mut self, took: Duration) {
        self.done += 1;
        self.total_s += took.as_secs_f64();
    }

    /// Seconds one run takes: the mean so far, or the prior.
    pub fn per_run_s(&self) -> f64 {
        if self.done == 0 {
            self.prior_s
        } else {
            self.total_s / self.done as f64
        }
    }

    /// Seconds left for `runs` more runs.
    pub fn left_s(&self, runs: usize) -> f64 {
        self.per_run_s() * runs as f64
    }
}

/// The prior guess of one run's duration: warm-up and measured phase plus about 4 s
/// of start (agent, service, preload) and teardown, as measured on a 2-vCPU VM.
pub fn prior_run_time(warmup: Duration, measured: Duration) -> Duration {
    warmup + measured + Duration::from_secs(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cell_once_per_repeat_with_rotating_modes() {
        let modes = [Mode::Kernel, Mode::Senpai, Mode::Full];
        let plan = interleaved(&[0, 100], &modes, 3);
        assert_eq!(plan.len(), 18);
        for rep in 1..=3 {
            let r: Vec<_> = plan.iter().filter(|s| s.rep == rep).collect();
            assert_eq!(r.len(), 6);
            for l in [0, 100] {
                let mut m: Vec<_> = r
                    .iter()
                    .filter(|s| s.level == l)
                    .map(|s| s.mode as u8)
                    .collect();
                m.sort();
                let mut want: Vec<_> = modes.iter().map(|&x| x as u8).collect();
                want.sort();
                assert_eq!(m, want);
            }
        }
        // Repeats are whole before the next starts.
        assert!(plan.windows(2).all(|w| w[0].rep <= w[1].rep));
        // The first mode of a level changes from one repeat to the next.
        let firsts: Vec<_> = (1..=3)
            .map(|rep| {
                plan.iter()
                    .find(|s| s.rep == rep && s.level == 0)
                    .unwrap()
                    .mode
            })
            .collect();
        assert_eq!(firsts, vec![Mode::Kernel, Mode::Senpai, Mode::Full]);
    }

    #[test]
    fn disturbed_runs_are_rejected_with_reasons() {
        let p = RejectPolicy {
            foreign_pct_max: 5.0,
            steal_pct_max: 2.0,
            max_attempts: 3,
        };
        let d = |f, s| Disturbance {
            foreign_pct: f,
            steal_pct: s,
        };
        assert_eq!(p.verdict(&d(Some(4.9), Some(2.0))), None);
        assert_eq!(p.verdict(&d(None, None)), None);
        let why = p.verdict(&d(Some(11.0), Some(0.0))).unwrap();
        assert!(why.contains("foreign load 11.0 %"), "{why}");
        let why = p.verdict(&d(Some(6.0), Some(3.0))).unwrap();
        assert!(why.contains("foreign") && why.contains("steal"), "{why}");
        // The least disturbed relative to its threshold: 6/5 = 1.2 beats 3/2 = 1.5.
        let attempts = [
            d(Some(1.0), Some(3.0)),
            d(Some(6.0), Some(0.0)),
            d(Some(20.0), None),
        ];
        assert_eq!(least_disturbed(&attempts, &p), Some(1));
        assert_eq!(least_disturbed(&[], &p), None);
    }

    #[test]
    fn eta_starts_from_the_prior_and_follows_the_runs() {
        let mut e = Eta::new(prior_run_time(
            Duration::from_secs(4),
            Duration::from_secs(6),
        ));
        assert_eq!(e.per_run_s(), 14.0);
        assert_eq!(e.left_s(10), 140.0);
        e.record(Duration::from_secs(20));
        e.record(Duration::from_secs(30));
        assert_eq!(e.per_run_s(), 25.0);
        assert_eq!(e.left_s(4), 100.0);
    }
}
