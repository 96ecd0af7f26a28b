//! Property-style checks of the M3 monitor and the Hermes advice over many random but
//! seeded inputs: a node whose usage wanders through every zone while processes
//! start, answer signals, get killed and exit. A failing case prints its seed and
//! poll, so it can be replayed exactly.

use memcolo_policy::hermes::{plan_advice, AdviceConfig, FileCache};
use memcolo_policy::m3::{Action, M3Config, Monitor, ProcView, SortOrder, Zone};
use memcolo_policy::{Class, Level, Pid};
use rand_xoshiro::rand_core::{Rng as _, SeedableRng};
use rand_xoshiro::SplitMix64;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// SplitMix64 (`rand_xoshiro`): a tiny, well-mixed PRNG, so the cases are the same on
/// every run.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(SplitMix64::seed_from_u64(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize]
    }
}

fn random_config(rng: &mut Rng) -> M3Config {
    let top = rng.range(1_000, 1 << 40);
    let high = rng.range(0, top);
    let low = rng.range(0, high);
    M3Config {
        top_bytes: top,
        low_bytes: low,
        high_bytes: high,
        window_samples: rng.range(1, 64) as usize,
        ratio_target: (rng.range(0, 4) as u32, rng.range(1, 64) as u32),
        step_bytes: rng.range(1, top / 5),
        sort_order: rng.pick(&[
            SortOrder::NewestFirst,
            SortOrder::OldestFirst,
            SortOrder::LargestRss,
            SortOrder::LargestExpectedReclaim,
        ]),
        kill_after: Duration::from_secs(rng.range(0, 20)),
        reclaim_history: rng.range(1, 8) as usize,
        resignal_after: Duration::from_secs(rng.pick(&[0, 1, 3, 5])),
        min_signal_interval: Duration::from_millis(rng.pick(&[0, 500, 1000])),
        fair_share: rng.chance(50),
    }
}

fn random_proc(rng: &mut Rng, pid: Pid, now: Duration, top: u64) -> ProcView {
    ProcView {
        pid,
        class: rng.pick(&[Class::Lc, Class::Be, Class::Elastic]),
        started_at: now,
        rss_bytes: rng.range(0, top / 4),
        notifiable: rng.chance(70),
        expected_reclaim_bytes: if rng.chance(50) {
            Some(rng.range(0, top / 8))
        } else {
            None
        },
    }
}

/// What a batch of scenarios exercised, so a generator that never reaches a rule
/// fails the test instead of passing it vacuously.
#[derive(Default, Debug)]
struct Coverage {
    zones: BTreeMap<Zone, u64>,
    levels: BTreeMap<Level, u64>,
    kills: u64,
    threshold_moves: u64,
    min_checks: u64,
}

/// Runs one seeded scenario of `polls` polls and checks every invariant after each.
fn run_scenario(seed: u64, polls: u64, cov: &mut Coverage) {
    let mut rng = Rng::new(seed);
    let cfg = random_config(&mut rng);
    let mut m = Monitor::new(cfg.clone());
    let mut procs: Vec<ProcView> = Vec::new();
    let mut next_pid: Pid = 100;
    // pid -> poll at which a killed process disappears.
    let mut dying: BTreeMap<Pid, u64> = BTreeMap::new();
    let mut killed_ever: BTreeSet<(Pid, Duration)> = BTreeSet::new();
    let mut used = rng.range(0, cfg.top_bytes);

    for poll in 0..polls {
        let now = Duration::from_secs(poll);
        let ctx = format!("seed {seed} poll {poll}");

        // Processes come and go; pids are sometimes reused.
        if procs.len() < 12 && rng.chance(30) {
            let pid = if rng.chance(20) && next_pid > 100 {
                rng.range(100, next_pid as u64 - 1) as Pid
            } else {
                next_pid += 1;
                next_pid
            };
            if !procs.iter().any(|p| p.pid == pid) {
                let top = m.thresholds().top_bytes;
                procs.push(random_proc(&mut rng, pid, now, top));
            }
        }
        if !procs.is_empty() && rng.chance(5) {
            let i = (rng.next() % procs.len() as u64) as usize;
            let gone = procs.remove(i);
            m.forget(gone.pid);
        }
        let exited: Vec<Pid> = dying
            .iter()
            .filter(|(_, at)| **at <= poll)
            .map(|(pid, _)| *pid)
            .collect();
        for pid in exited {
            dying.remove(&pid);
            procs.retain(|p| p.pid != pid);
            m.forget(pid);
        }
        for p in procs.iter_mut() {
            if rng.chance(20) {
                p.rss_bytes = rng.range(0, m.thresholds().top_bytes / 4);
            }
        }

        // The scope's memory sometimes changes.
        if rng.chance(2) {
            let t = m.thresholds().top_bytes;
            m.set_top(rng.range(t / 2 + 1, t.saturating_mul(2)));
        }

        // Usage wanders through every zone, with occasional jumps.
        let top = m.thresholds().top_bytes;
        used = if rng.chance(10) {
            rng.range(0, top + top / 3)
        } else {
            let delta = rng.range(0, top / 20 + 1);
            if rng.chance(50) {
                used.saturating_add(delta).min(top * 2)
            } else {
                used.saturating_sub(delta)
            }
        };

        let before = m.thresholds();
        let zone = before.zone_of(used);
        let actions = m.step(now, used, &procs);
        let after = m.thresholds();
        assert_eq!(m.zone(), zone, "{ctx}");
        *cov.zones.entry(zone).or_default() += 1;
        if before != after {
            cov.threshold_moves += 1;
        }

        // Thresholds: ordered, at most one step each per poll, still in green.
        assert!(after.low_bytes <= after.high_bytes, "{ctx}: {after:?}");
        assert!(after.high_bytes <= after.top_bytes, "{ctx}: {after:?}");
        let step = m.config().step_bytes;
        assert!(after.low_bytes.abs_diff(before.low_bytes) <= step, "{ctx}");
        assert!(
            after.high_bytes.abs_diff(before.high_bytes) <= step,
            "{ctx}"
        );
        if zone == Zone::Green {
            assert_eq!(before, after, "{ctx}: thresholds moved in green");
        }

        // Actions: one per pid, signals only to notifiable listed processes with a
        // positive target and the zone's levels; kills only BE, only after kill_after.
        let by_pid: BTreeMap<Pid, &ProcView> = procs.iter().map(|p| (p.pid, p)).collect();
        let mut seen = BTreeSet::new();
        let mut kill_rss: Vec<u64> = Vec::new();
        let mut high_expected: Vec<u64> = Vec::new();
        for a in &actions {
            assert!(seen.insert(a.pid()), "{ctx}: two actions for {}", a.pid());
            let p = by_pid
                .get(&a.pid())
                .unwrap_or_else(|| panic!("{ctx}: action for unlisted pid {}", a.pid()));
            match a {
                Action::Signal {
                    level,
                    target_bytes,
                    ..
                } => {
                    assert!(p.notifiable, "{ctx}: signal to a non-notifiable process");
                    assert!(*target_bytes > 0, "{ctx}: zero target");
                    let allowed: &[Level] = match zone {
                        Zone::Green => &[],
                        Zone::Yellow => &[Level::Low],
                        Zone::Red => &[Level::Low, Level::High],
                        Zone::AboveTop => &[Level::Top],
                    };
                    assert!(allowed.contains(level), "{ctx}: {level} in {zone}");
                    *cov.levels.entry(*level).or_default() += 1;
                    if *level == Level::High {
                        // Expected reclamation as the monitor saw it before this poll's
                        // reports: nothing was reported between the step and here.
                        high_expected.push(m.expected_reclaim_bytes(p));
                    }
                }
                Action::Kill { reason, .. } => {
                    assert_eq!(p.class, Class::Be, "{ctx}: killed a {} process", p.class);
                    assert_eq!(zone, Zone::AboveTop, "{ctx}");
                    assert!(m.above_top_for(now).unwrap() >= cfg.kill_after, "{ctx}");
                    assert!(reason.contains("kill"), "{ctx}: {reason}");
                    assert!(
                        killed_ever.insert((p.pid, p.started_at)),
                        "{ctx}: killed {} twice",
                        p.pid
                    );
                    kill_rss.push(p.rss_bytes);
                    cov.kills += 1;
                    dying.insert(p.pid, poll + rng.range(1, 3));
                }
            }
        }

        // Algorithm 1 stops as soon as expected covers the target: every High signal
        // but the last was needed. Only exact without suppression (resignal_after 0,
        // so no process is skipped-but-counted).
        if cfg.resignal_after.is_zero() && zone == Zone::Red && !high_expected.is_empty() {
            let target = used - before.high_bytes;
            let all_but_last: u64 = high_expected[..high_expected.len() - 1].iter().sum();
            assert!(all_but_last < target, "{ctx}: signalled past the target");
            cov.min_checks += 1;
        }
        // Same for a kill round when no earlier kill is still exiting.
        if !kill_rss.is_empty() && dying.len() == kill_rss.len() {
            let target = used - before.top_bytes;
            let all_but_last: u64 = kill_rss[..kill_rss.len() - 1].iter().sum();
            assert!(all_but_last < target, "{ctx}: killed past the target");
            cov.min_checks += 1;
        }

        // Some signalled processes answer.
        for a in &actions {
            if let Action::Signal { pid, level, .. } = a {
                if rng.chance(60) {
                    let top = m.thresholds().top_bytes;
                    m.record_reclaim(*pid, Some(*level), rng.range(0, top / 10), now);
                }
            }
        }

        // What survives a restart restores to the same thresholds and expectations.
        if poll % 97 == 0 {
            let mut fresh = Monitor::new(m.config().clone());
            fresh.restore(m.state());
            assert_eq!(fresh.state(), m.state(), "{ctx}");
            assert_eq!(fresh.thresholds(), m.thresholds(), "{ctx}");
            for p in &procs {
                assert_eq!(
                    fresh.expected_reclaim_bytes(p),
                    m.expected_reclaim_bytes(p),
                    "{ctx}"
                );
            }
        }
    }
}

#[test]
fn m3_invariants_hold_over_random_scenarios() {
    let mut cov = Coverage::default();
    for seed in 0..300 {
        run_scenario(seed, 400, &mut cov);
    }
    assert_eq!(cov.zones.len(), 4, "{cov:?}");
    assert_eq!(cov.levels.len(), 3, "{cov:?}");
    assert!(cov.kills > 0, "{cov:?}");
    assert!(cov.threshold_moves > 0, "{cov:?}");
    assert!(cov.min_checks > 0, "{cov:?}");
    eprintln!("{cov:?}");
}

#[test]
fn m3_paper_config_invariants_hold() {
    // The paper's own configuration (with_top), under the same random workload.
    for seed in 1000..1100 {
        let mut rng = Rng::new(seed);
        let top = rng.range(1 << 30, 1 << 40);
        let cfg = M3Config::with_top(top);
        let mut m = Monitor::new(cfg.clone());
        let mut used = top / 2;
        for poll in 0..500 {
            let delta = rng.range(0, top / 30);
            used = if rng.chance(50) {
                used + delta
            } else {
                used.saturating_sub(delta)
            }
            .min(top + top / 5);
            m.step(Duration::from_secs(poll), used, &[]);
            let t = m.thresholds();
            assert!(
                t.low_bytes <= t.high_bytes && t.high_bytes <= t.top_bytes,
                "seed {seed} poll {poll}: {t:?}"
            );
            // with_top starts with gaps of at least one step, and the clamps keep them.
            assert!(
                t.low_bytes >= cfg.step_bytes,
                "seed {seed} poll {poll}: {t:?}"
            );
            assert!(t.high_bytes - t.low_bytes >= cfg.step_bytes, "seed {seed}");
            assert!(t.top_bytes - t.high_bytes >= cfg.step_bytes, "seed {seed}");
        }
    }
}

#[test]
fn hermes_plans_hold_their_rules_over_random_inputs() {
    for seed in 0..500 {
        let mut rng = Rng::new(seed);
        let n = rng.range(0, 30);
        let files: Vec<FileCache> = (0..n)
            .map(|_| {
                let ino = rng.range(1, 20);
                FileCache {
                    dev: rng.range(1, 2),
                    ino,
                    path: format!("/data/{ino}"),
                    resident_bytes: rng.range(0, 1 << 30),
                    held_by_lc: rng.chance(15),
                }
            })
            .collect();
        let cfg = AdviceConfig {
            adv_thr_bytes: rng.range(0, 8 << 30),
            min_resident_bytes: rng.range(0, 64 << 20),
        };
        let used = rng.range(0, 12 << 30);
        let plan = plan_advice(&cfg, used, &files);
        let ctx = format!("seed {seed}");
        if used <= cfg.adv_thr_bytes {
            assert!(plan.is_empty(), "{ctx}");
            continue;
        }
        let lc: BTreeSet<(u64, u64)> = files
            .iter()
            .filter(|f| f.held_by_lc)
            .map(|f| (f.dev, f.ino))
            .collect();
        let mut keys = BTreeSet::new();
        for (i, a) in plan.iter().enumerate() {
            assert!(!lc.contains(&(a.dev, a.ino)), "{ctx}: LC-held file advised");
            assert!(keys.insert((a.dev, a.ino)), "{ctx}: file advised twice");
            assert!(a.expected_bytes >= cfg.min_resident_bytes, "{ctx}");
            if i > 0 {
                assert!(plan[i - 1].expected_bytes >= a.expected_bytes, "{ctx}");
            }
        }
        let overshoot = used - cfg.adv_thr_bytes;
        let sum: u64 = plan.iter().map(|a| a.expected_bytes).sum();
        if let Some(last) = plan.last() {
            assert!(
                sum - last.expected_bytes < overshoot,
                "{ctx}: advised too much"
            );
        }
        if sum < overshoot {
            // Not enough: then every eligible file was advised.
            let eligible: BTreeSet<(u64, u64)> = files
                .iter()
                .filter(|f| !lc.contains(&(f.dev, f.ino)))
                .filter(|f| {
                    files
                        .iter()
                        .filter(|g| (g.dev, g.ino) == (f.dev, f.ino))
                        .map(|g| g.resident_bytes)
                        .max()
                        .unwrap_or(0)
                        >= cfg.min_resident_bytes
                })
                .map(|f| (f.dev, f.ino))
                .collect();
            assert_eq!(keys, eligible, "{ctx}");
        }
    }
}

/// The reclaim scheduler (Hermit) over random observation sequences: worker counts
/// stay within the CPU budget, the marks are ordered and bounded by the limit, the
/// target never exceeds what is reclaimable, and the safety stops always hold.
#[test]
fn reclaim_scheduler_invariants() {
    use memcolo_policy::hermit::{
        ReclaimConfig, ReclaimObservation, ReclaimScheduler, ReclaimState, SampledTurnaround,
    };
    for seed in 0..200u64 {
        let mut rng = Rng::new(seed);
        let cfg = ReclaimConfig {
            max_workers: rng.range(1, 8) as u32,
            batch_bytes: rng.range(1 << 20, 64 << 20),
            ..Default::default()
        };
        let max_low_ratio = cfg.max_low_ratio;
        let max_workers = cfg.max_workers;
        let mut s = ReclaimScheduler::new(cfg).unwrap();
        let limit = rng.range(256 << 20, 64 << 30);
        let swap_total = rng.pick(&[0, limit / 2, limit * 2]);
        let mut now = Duration::ZERO;
        let mut used = rng.range(0, limit);
        for step in 0..500 {
            now += Duration::from_millis(rng.range(1, 200));
            used = if rng.chance(10) {
                rng.range(0, limit + limit / 10)
            } else {
                used.saturating_add(rng.range(0, 64 << 20))
                    .min(limit + (8 << 20))
            };
            let swap_free = if swap_total == 0 {
                0
            } else {
                rng.range(0, swap_total)
            };
            let obs = ReclaimObservation {
                limit_bytes: limit,
                used_bytes: used,
                reclaimed_bytes: rng.range(0, 128 << 20),
                charged_bytes: if rng.chance(2) {
                    Some(rng.range(0, 256 << 20))
                } else {
                    None
                },
                worker_busy: Duration::from_millis(rng.range(0, 400)),
                swapin_bytes: rng.range(0, 256 << 20),
                swapped_bytes: rng.range(0, swap_total),
                swap_total_bytes: swap_total,
                swap_free_bytes: swap_free,
                reclaimable_bytes: if rng.chance(20) {
                    0
                } else {
                    rng.range(0, limit)
                },
                removed_bytes: if rng.chance(10) {
                    rng.range(0, 512 << 20)
                } else {
                    0
                },
                limit_failures: if rng.chance(20) { rng.range(0, 100) } else { 0 },
                inflight_bytes: rng.range(0, 64 << 20),
                sampled_turnaround: if rng.chance(50) {
                    Some(SampledTurnaround {
                        turnaround_s: rng.range(0, 200_000) as f64 / 1000.0,
                        at_least: rng.chance(25),
                        pages: rng.range(0, 64) as u32,
                    })
                } else {
                    None
                },
            };
            let d = s.step(now, &obs);
            let ctx = format!("seed {seed} step {step}: {obs:?} -> {d:?}");
            assert!(d.workers <= max_workers, "{ctx}");
            assert!(d.high_mark_bytes <= d.low_mark_bytes, "{ctx}");
            // Proactive reclaim never holds back more than max_low_ratio of the node
            // beyond the high mark, which is at most a quarter of it.
            assert!(
                d.high_mark_bytes as f64 <= limit as f64 / 4.0 + 1.0,
                "{ctx}"
            );
            assert!(
                d.low_mark_bytes as f64
                    <= (max_low_ratio * limit as f64).max(d.high_mark_bytes as f64) + 1.0,
                "{ctx}"
            );
            assert!(d.target_bytes <= obs.reclaimable_bytes, "{ctx}");
            assert_eq!(d.headroom_bytes, limit.saturating_sub(used), "{ctx}");
            if swap_total > 0 && (swap_free as f64) < 0.05 * swap_total as f64 {
                assert_eq!(d.workers, 0, "{ctx}");
                assert_eq!(d.state, ReclaimState::SwapFull, "{ctx}");
            }
            if obs.reclaimable_bytes == 0 {
                assert_eq!(d.workers, 0, "{ctx}");
            }
            if d.headroom_bytes >= d.low_mark_bytes {
                assert_eq!(d.workers, 0, "{ctx}");
            }
            if d.headroom_bytes < d.high_mark_bytes
                && d.state != ReclaimState::SwapFull
                && obs.reclaimable_bytes > 0
            {
                assert!(d.workers >= 1, "{ctx}");
                assert_eq!(d.state, ReclaimState::Urgent, "{ctx}");
            }
        }
    }
}
