//! The `maxmem-timeline` scenario: MaxMem §5.1.2's six-process timeline (Fig. 4) run
//! through the policy crate's own [`MaxMem`] state machine, at the paper's size (2 MiB
//! pages) or at the size `bench/tiering`'s `timeline` experiment runs on this machine
//! (4 KiB pages), with the same schedule and the same figure of merit: epochs from
//! each change until every latency-sensitive process has `a_miss <= t_miss`.
//!
//! Six GUPS processes, each updating a table of `table` bytes whose hot part (the
//! first half of its pages, 90 % of the updates) is touched first; p1 is best effort
//! (`t_miss` 1) and p2–p6 latency sensitive (0.1). Schedule (`bench/tiering`'s
//! `timeline.py`, after the paper): p1–p5 start 10 s apart, p6 at 100 s, p5's hot set
//! grows by half at 160 s, p1's target goes to 0.1 at 220 s, end at 280 s. One epoch
//! per second; each epoch every running process's updates are sampled (`samples`
//! per process, uniform within the hot and cold parts) and handed to
//! [`MaxMem::step`] as [`ProcSample`]s, whose migrations the policy has already
//! applied to its own placement. The slow tier is addressable memory (the paper's
//! Optane): a slow page is served in place, not faulted in, and a first touch is
//! placed by [`MaxMem::allocate`].

use memcolo_policy::maxmem::{MaxMem, MaxMemConfig, ProcSample, Tier};
use rand_xoshiro::rand_core::{Rng as _, SeedableRng};
use rand_xoshiro::SplitMix64;
use serde::Serialize;

/// Sampled updates per table page and epoch of [`TimelineConfig::scaled`]: 10,000
/// per process and epoch at the paper's size (16,384 pages of 2 MiB per table).
///
/// The density, not the size, sets how fast the policy moves a newcomer's hot pages
/// in: the hotness bins (rule T6) fill and cool at a rate of samples per page, and
/// with more than about one sample per page and epoch they cool every few epochs and
/// the other processes' exchanges take the migration budget the newcomer's fill
/// needs (p6's arrival: 8–11 epochs at 0.3–0.6 samples per page, 15–20 at 1.2–2.4,
/// at 144 MiB, 288 MiB and 144 GiB alike; `bench/sim/RESULTS.md`). Holding it fixed
/// makes every size the same experiment. The paper's own density (PEBS, 1 % of
/// loads, §3.2) depends on GUPS's update rate, which it does not give.
pub const SAMPLES_PER_PAGE: f64 = 10_000.0 / 16_384.0;

/// The timeline's sizes.
#[derive(Clone, Debug)]
pub struct TimelineConfig {
    /// Fast tier shared by the six processes, bytes (paper: 144 GiB; bench: 144 MiB).
    pub fast_bytes: u64,
    /// Table of each process, bytes (paper: 32 GiB; bench: 32 MiB).
    pub table_bytes: u64,
    /// Migration cap per 1 s epoch, bytes (paper: 10 GiB; bench: 10 MiB).
    pub cap_bytes: u64,
    /// Page size the policy places, bytes.
    pub page_bytes: u64,
    /// Updates sampled per process and epoch.
    pub samples: u32,
    pub seed: u64,
}

impl TimelineConfig {
    /// Sizes scaled from the paper's (fast tier `fast_bytes`; tables and cap in the
    /// paper's proportion: 32/144 and 10/144 of it); 2 MiB pages from a 1 GiB fast
    /// tier up, else 4 KiB; [`SAMPLES_PER_PAGE`] samples per table page and epoch.
    pub fn scaled(fast_bytes: u64, seed: u64) -> TimelineConfig {
        let page_bytes = if fast_bytes >= 1 << 30 { 2 << 20 } else { 4096 };
        let table_bytes = fast_bytes / 144 * 32;
        let pages = (table_bytes / page_bytes).max(1) as f64;
        TimelineConfig {
            fast_bytes,
            table_bytes,
            cap_bytes: fast_bytes / 144 * 10,
            page_bytes,
            samples: (pages * SAMPLES_PER_PAGE).round().clamp(100.0, 1e6) as u32,
            seed,
        }
    }
}

/// One (change, process) of the timeline, as `bench/tiering`'s report gives it.
#[derive(Clone, Debug, Serialize)]
pub struct TimelineRow {
    /// The change, e.g. `start p6 @100s`.
    pub change: String,
    pub process: String,
    /// Epochs from the change until `a_miss <= t_miss` (0: it never left its target);
    /// `None`: not within the phase.
    pub epochs_to_target: Option<u64>,
    /// Median `a_miss` over the second half of the phase.
    pub settled_a_miss: f64,
    /// Share of the phase's epochs the policy flagged the process infeasible (T4).
    pub infeasible_share: f64,
    /// Its fast memory at the end of the phase, MiB.
    pub fast_mib_at_end: f64,
    /// Its hot set (90 % of its updates) in the phase, MiB: the static partition a
    /// HeMem-style configuration gives it with hindsight (MaxMem §5.2 compares with
    /// such a partition).
    pub hot_mib: f64,
    /// Fast memory saved against a static partition of its whole table (what meets
    /// its target without knowing the access pattern), % (negative: MaxMem gave it
    /// more); `None` for a best-effort process (`t_miss` 1 through the phase).
    pub saved_vs_table_pct: Option<f64>,
}

struct Gups {
    name: String,
    pid: memcolo_policy::Pid,
    start_s: u64,
    t_miss: f64,
    hot_share: f64,
    running: bool,
}

/// A process's `a_miss`, `t_miss`, infeasible flag and fast pages after an epoch.
type EpochState = (f64, f64, bool, u64);

enum Event {
    Start(usize),
    GrowHot(usize),
    Target(usize, f64),
}

/// Runs the timeline; one row per (change, running latency-sensitive process or the
/// process the change concerns).
pub fn timeline(c: &TimelineConfig) -> anyhow::Result<Vec<TimelineRow>> {
    anyhow::ensure!(c.page_bytes > 0, "page size must be positive");
    let fast_pages = c.fast_bytes / c.page_bytes;
    let table_pages = (c.table_bytes / c.page_bytes).max(2);
    anyhow::ensure!(fast_pages > 0, "the fast tier holds no page");
    anyhow::ensure!(table_pages <= 1 << 24, "tables above 2^24 pages");
    anyhow::ensure!((1..=1_000_000).contains(&c.samples), "samples in 1..=1e6");
    let mut cfg = MaxMemConfig::with_capacity(fast_pages, c.page_bytes);
    cfg.migration_cap_pages = (c.cap_bytes / c.page_bytes).max(2);
    let mut mm = MaxMem::try_new(cfg)?;
    let mut rng = SplitMix64::seed_from_u64(c.seed);
    let mut procs: Vec<Gups> = (0..6)
        .map(|k| Gups {
            name: format!("p{}", k + 1),
            pid: 100 + k as memcolo_policy::Pid,
            start_s: if k < 5 { 10 * k as u64 } else { 100 },
            t_miss: if k == 0 { 1.0 } else { 0.1 },
            hot_share: 0.5,
            running: false,
        })
        .collect();
    let mut schedule: Vec<(u64, String, Event)> = (0..6)
        .map(|k| {
            (
                procs[k].start_s,
                format!("start {} @{}s", procs[k].name, procs[k].start_s),
                Event::Start(k),
            )
        })
        .collect();
    schedule.push((160, "grow_hot p5 @160s".into(), Event::GrowHot(4)));
    schedule.push((220, "target p1 @220s".into(), Event::Target(0, 0.1)));
    schedule.sort_by_key(|e| e.0);
    let end_s = 280u64;
    // a_miss, t_miss, infeasible and fast pages per process per epoch.
    let mut trace: Vec<Vec<Option<EpochState>>> = vec![Vec::new(); procs.len()];
    // Hot share per process per epoch.
    let mut hot_trace: Vec<Vec<f64>> = vec![Vec::new(); procs.len()];
    let mut counts = vec![0u32; table_pages as usize];
    for t in 0..end_s {
        for (at, _, ev) in &schedule {
            if *at != t {
                continue;
            }
            match *ev {
                Event::Start(k) => {
                    let p = &mut procs[k];
                    mm.register(p.pid, p.t_miss)?;
                    // GUPS initialises its table in order: the hot part first.
                    for page in 0..table_pages {
                        mm.allocate(p.pid, page)?;
                    }
                    p.running = true;
                }
                Event::GrowHot(k) => procs[k].hot_share = 0.75,
                Event::Target(k, t_miss) => {
                    procs[k].t_miss = t_miss;
                    mm.set_t_miss(procs[k].pid, t_miss)?;
                }
            }
        }
        let mut samples = Vec::new();
        for p in procs.iter().filter(|p| p.running) {
            let hot = ((table_pages as f64 * p.hot_share) as u64).clamp(1, table_pages - 1);
            let (mut fast, mut slow) = (0u64, 0u64);
            let mut order: Vec<u64> = Vec::new();
            for _ in 0..c.samples {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                let r = rng.next_u64();
                let page = if u < 0.9 {
                    r % hot
                } else {
                    hot + r % (table_pages - hot)
                };
                match mm.tier_of(p.pid, page) {
                    Some(Tier::Fast) => fast += 1,
                    _ => slow += 1,
                }
                if counts[page as usize] == 0 {
                    order.push(page);
                }
                counts[page as usize] += 1;
            }
            let pages = order
                .into_iter()
                .map(|pg| (pg, std::mem::take(&mut counts[pg as usize])))
                .collect();
            samples.push(ProcSample {
                pid: p.pid,
                fast_accesses: fast,
                slow_accesses: slow,
                pages,
            });
        }
        let out = mm.step(&samples);
        for (k, p) in procs.iter().enumerate() {
            hot_trace[k].push(p.hot_share);
            let st = out.procs.iter().find(|s| s.pid == p.pid);
            trace[k].push(st.map(|s| (s.a_miss, s.t_miss, s.infeasible, s.fast_pages)));
        }
    }
    let mut rows = Vec::new();
    for (i, (at, change, ev)) in schedule.iter().enumerate() {
        let next = schedule.get(i + 1).map_or(end_s, |e| e.0);
        let concerned = match ev {
            Event::Start(k) | Event::GrowHot(k) | Event::Target(k, _) => *k,
        };
        for (k, p) in procs.iter().enumerate() {
            let phase: Vec<EpochState> = trace[k][*at as usize..next as usize]
                .iter()
                .flatten()
                .copied()
                .collect();
            let sensitive = phase.first().is_some_and(|s| s.1 < 1.0);
            if phase.is_empty() || (!sensitive && k != concerned) {
                continue;
            }
            let epochs_to_target = phase.iter().position(|s| s.0 <= s.1).map(|e| e as u64);
            let mut second: Vec<f64> = phase[phase.len() / 2..].iter().map(|s| s.0).collect();
            let fast_mib = phase
                .last()
                .map_or(0.0, |s| (s.3 * c.page_bytes) as f64 / (1u64 << 20) as f64);
            let table_mib = (table_pages * c.page_bytes) as f64 / (1u64 << 20) as f64;
            let hot_share = hot_trace[k][(next as usize).saturating_sub(1)];
            second.sort_by(f64::total_cmp);
            rows.push(TimelineRow {
                change: change.clone(),
                process: p.name.clone(),
                epochs_to_target,
                settled_a_miss: second.get(second.len() / 2).copied().unwrap_or(f64::NAN),
                infeasible_share: phase.iter().filter(|s| s.2).count() as f64 / phase.len() as f64,
                fast_mib_at_end: fast_mib,
                hot_mib: table_mib * hot_share,
                saved_vs_table_pct: sensitive.then(|| 100.0 * (1.0 - fast_mib / table_mib)),
            });
        }
    }
    Ok(rows)
}
