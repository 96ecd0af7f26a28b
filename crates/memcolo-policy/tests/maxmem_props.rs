//! Property tests of the MaxMem policy (MaxMem §3.1–§3.2): random sequences of
//! registrations, exits, target changes, faults, allocations, frees and epochs, with
//! the policy's invariants checked after every operation and the rules' guarantees
//! checked after every epoch. proptest shrinks a failing sequence to a minimal one
//! and prints it.

use memcolo_policy::maxmem::{
    MaxMem, MaxMemConfig, MigrationReason, Need, PageId, ProcSample, ProcStatus, Tier,
};
use memcolo_policy::Pid;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// (pid, fast accesses, slow accesses, samples per page) of one epoch.
type RawSample = (Pid, u8, u8, Vec<(PageId, u8)>);

#[derive(Clone, Debug)]
enum Op {
    Register {
        pid: Pid,
        t_tenths: u8,
    },
    Unregister {
        pid: Pid,
    },
    SetTarget {
        pid: Pid,
        t_tenths: u8,
    },
    Fault {
        pid: Pid,
        page: PageId,
    },
    Allocate {
        pid: Pid,
        page: PageId,
    },
    Free {
        pid: Pid,
        page: PageId,
    },
    /// A demotion or promotion the caller failed to carry out, reported as the page
    /// staying slow (only ever lowers fast usage).
    KeepSlow {
        pid: Pid,
        page: PageId,
    },
    Step {
        samples: Vec<RawSample>,
    },
}

const PIDS: std::ops::RangeInclusive<Pid> = 1..=6;
const PAGES: std::ops::Range<PageId> = 0..48;

fn op() -> impl Strategy<Value = Op> {
    let pid = PIDS;
    let page = PAGES;
    let sample = (
        PIDS,
        0u8..20,
        0u8..20,
        prop::collection::vec((PAGES, 0u8..40), 0..12),
    );
    prop_oneof![
        2 => (pid.clone(), 1u8..=10).prop_map(|(pid, t_tenths)| Op::Register { pid, t_tenths }),
        1 => pid.clone().prop_map(|pid| Op::Unregister { pid }),
        1 => (pid.clone(), 1u8..=10).prop_map(|(pid, t_tenths)| Op::SetTarget { pid, t_tenths }),
        12 => (pid.clone(), page.clone()).prop_map(|(pid, page)| Op::Fault { pid, page }),
        2 => (pid.clone(), page.clone()).prop_map(|(pid, page)| Op::Allocate { pid, page }),
        2 => (pid.clone(), page.clone()).prop_map(|(pid, page)| Op::Free { pid, page }),
        1 => (pid, page).prop_map(|(pid, page)| Op::KeepSlow { pid, page }),
        4 => prop::collection::vec(sample, 0..7).prop_map(|samples| Op::Step { samples }),
    ]
}

fn config() -> impl Strategy<Value = MaxMemConfig> {
    (
        1u64..80,
        0u64..40,
        2u32..8,
        prop::sample::select(vec![0.5, 0.25, 1.0]),
        any::<bool>(),
    )
        .prop_map(|(cap_pages, migr, bins, lambda, prop_step)| MaxMemConfig {
            fast_capacity_pages: cap_pages,
            migration_cap_pages: migr,
            hotness_bins: bins,
            ewma_lambda: lambda,
            proportional_step: prop_step,
        })
}

/// The EWMA of rule T1, computed independently.
#[derive(Clone, Copy, Debug)]
struct Miss {
    measured: bool,
    a: f64,
}

fn check_sums(m: &MaxMem) -> Result<(), TestCaseError> {
    if let Err(e) = m.check_invariants() {
        return Err(TestCaseError::fail(e));
    }
    let st = m.statuses();
    let fast: u64 = st.iter().map(|s| s.fast_pages).sum();
    prop_assert!(
        fast <= m.config().fast_capacity_pages,
        "fast memory over-used: {fast}"
    );
    for s in &st {
        prop_assert!(
            s.fast_pages <= s.alloc_pages,
            "pid {} above its allocation: {s:?}",
            s.pid
        );
    }
    Ok(())
}

fn run(cfg: MaxMemConfig, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut m = MaxMem::new(cfg.clone());
    let mut miss: BTreeMap<Pid, Miss> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Register { pid, t_tenths } => {
                let r = m.register(pid, t_tenths as f64 / 10.0);
                prop_assert_eq!(r.is_ok(), !miss.contains_key(&pid));
                miss.entry(pid).or_insert(Miss {
                    measured: false,
                    a: 0.0,
                });
            }
            Op::Unregister { pid } => {
                let before = m.free_pages();
                let held = m.status(pid).map(|s| s.alloc_pages);
                let r = m.unregister(pid);
                prop_assert_eq!(r.clone().ok(), held);
                if let Ok(n) = r {
                    prop_assert_eq!(m.free_pages(), before + n);
                }
                miss.remove(&pid);
            }
            Op::SetTarget { pid, t_tenths } => {
                let r = m.set_t_miss(pid, t_tenths as f64 / 10.0);
                prop_assert_eq!(r.is_ok(), miss.contains_key(&pid));
            }
            Op::Fault { pid, page } => {
                let before = m.tier_of(pid, page);
                match m.fault_in(pid, page) {
                    Ok(f) => {
                        if let Some(v) = f.victim {
                            prop_assert_eq!(m.tier_of(pid, v), Some(Tier::Slow));
                            if v != page {
                                prop_assert_eq!(m.tier_of(pid, page), Some(Tier::Fast));
                            }
                        } else {
                            prop_assert_eq!(m.tier_of(pid, page), Some(Tier::Fast));
                        }
                        if before == Some(Tier::Fast) {
                            prop_assert_eq!(f.victim, None);
                        }
                    }
                    Err(_) => prop_assert!(!miss.contains_key(&pid)),
                }
            }
            Op::Allocate { pid, page } => {
                let before = m.tier_of(pid, page);
                if let Ok(t) = m.allocate(pid, page) {
                    if let Some(b) = before {
                        prop_assert_eq!(t, b);
                    }
                    prop_assert_eq!(m.tier_of(pid, page), Some(t));
                }
            }
            Op::Free { pid, page } => {
                let before = m.tier_of(pid, page);
                if let Ok(t) = m.free_page(pid, page) {
                    prop_assert_eq!(t, before);
                    prop_assert_eq!(m.tier_of(pid, page), None);
                }
            }
            Op::KeepSlow { pid, page } => {
                if m.tier_of(pid, page).is_some() {
                    m.set_tier(pid, page, Tier::Slow).unwrap();
                }
            }
            Op::Step { samples } => step(&mut m, &cfg, &mut miss, samples)?,
        }
        check_sums(&m)?;
    }
    Ok(())
}

fn step(
    m: &mut MaxMem,
    cfg: &MaxMemConfig,
    miss: &mut BTreeMap<Pid, Miss>,
    samples: Vec<RawSample>,
) -> Result<(), TestCaseError> {
    let before: BTreeMap<Pid, ProcStatus> = m.statuses().into_iter().map(|s| (s.pid, s)).collect();
    let tiers_before: BTreeMap<(Pid, PageId), Tier> = PIDS
        .flat_map(|pid| PAGES.map(move |page| (pid, page)))
        .filter_map(|(pid, page)| m.tier_of(pid, page).map(|t| ((pid, page), t)))
        .collect();
    let free_before = m.free_pages();
    let samples: Vec<ProcSample> = samples
        .into_iter()
        .map(|(pid, fast, slow, pages)| ProcSample {
            pid,
            fast_accesses: fast as u64,
            slow_accesses: slow as u64,
            pages: pages.into_iter().map(|(p, n)| (p, n as u32)).collect(),
        })
        .collect();
    let out = m.step(&samples);

    // T1: the EWMA, computed independently.
    let mut acc: BTreeMap<Pid, (u64, u64)> = BTreeMap::new();
    for s in &samples {
        let a = acc.entry(s.pid).or_default();
        a.0 += s.fast_accesses;
        a.1 += s.slow_accesses;
    }
    for (pid, mm) in miss.iter_mut() {
        let (f, s) = acc.get(pid).copied().unwrap_or((0, 0));
        mm.a = if f + s == 0 {
            0.0
        } else {
            let x = s as f64 / (f + s) as f64;
            if mm.measured {
                cfg.ewma_lambda * x + (1.0 - cfg.ewma_lambda) * mm.a
            } else {
                x
            }
        };
        mm.measured = true;
    }

    // T3a: an epoch's reallocation budget is R to the whole cap, and exchanges get
    // the rest, never more than §3.1's X.
    let r = if cfg.proportional_step {
        cfg.migration_cap_pages
    } else {
        cfg.migration_cap_pages / 2
    };
    let x = cfg.migration_cap_pages - cfg.migration_cap_pages / 2;
    // The cap and its split (T3, T5).
    prop_assert!(out.migrations.len() as u64 <= cfg.migration_cap_pages);
    let demotions_r = out
        .migrations
        .iter()
        .filter(|g| {
            matches!(
                g.reason,
                MigrationReason::Reallocation | MigrationReason::Excess
            )
        })
        .count() as u64;
    prop_assert!(
        demotions_r <= r,
        "{demotions_r} reallocation moves > R = {r}"
    );
    prop_assert!(out.migrations.len() as u64 - demotions_r <= x);
    prop_assert!(out.reallocated_pages <= r);

    // Each page moves at most once, from the tier it was in.
    let mut seen = BTreeSet::new();
    for g in &out.migrations {
        prop_assert!(seen.insert((g.pid, g.page)), "page moved twice: {g:?}");
        let from = tiers_before.get(&(g.pid, g.page)).copied();
        prop_assert!(
            from.is_some() && from != Some(g.to),
            "bad move {g:?} from {from:?}"
        );
        match g.reason {
            MigrationReason::Reallocation | MigrationReason::Excess => {
                prop_assert_eq!(g.to, Tier::Slow)
            }
            MigrationReason::Fill => {
                prop_assert_eq!(g.to, Tier::Fast);
                prop_assert!(
                    m.bin_of(g.pid, g.page).unwrap() >= 1,
                    "unsampled fill {g:?}"
                );
            }
            MigrationReason::Exchange => {}
        }
    }
    // Exchanges come in (demote cold, promote strictly hotter) pairs of one process.
    let ex: Vec<_> = out
        .migrations
        .iter()
        .filter(|g| g.reason == MigrationReason::Exchange)
        .collect();
    prop_assert!(ex.len() % 2 == 0);
    for pair in ex.chunks(2) {
        prop_assert_eq!(pair[0].to, Tier::Slow);
        prop_assert_eq!(pair[1].to, Tier::Fast);
        prop_assert_eq!(pair[0].pid, pair[1].pid);
        let cold = m.bin_of(pair[0].pid, pair[0].page).unwrap();
        let hot = m.bin_of(pair[1].pid, pair[1].page).unwrap();
        prop_assert!(
            hot > cold,
            "exchange {pair:?}: bin {hot} not hotter than {cold}"
        );
    }

    // Reallocation (T2–T4).
    let any_needy = out.procs.iter().any(|p| p.need == Need::Needy);
    let mut gained = 0u64;
    let mut net = 0i64;
    let mut zero_givers = 0;
    let mut finite_givers = 0;
    for p in &out.procs {
        let mm = miss[&p.pid];
        prop_assert_eq!(p.a_miss, mm.a.clamp(0.0, 1.0), "pid {} a_miss", p.pid);
        let want = if p.a_miss > p.t_miss {
            Need::Needy
        } else if p.a_miss < p.t_miss {
            Need::Surplus
        } else {
            Need::Met
        };
        prop_assert_eq!(p.need, want);
        let b = &before[&p.pid];
        prop_assert_eq!(
            p.alloc_pages as i64 - b.alloc_pages as i64,
            p.alloc_change_pages
        );
        prop_assert!(p.coolings <= b.coolings + 1, "cooled twice in one epoch");
        net += p.alloc_change_pages;
        gained += p.alloc_change_pages.max(0) as u64;
        if !any_needy {
            prop_assert_eq!(p.alloc_change_pages, 0);
        }
        match p.need {
            Need::Met => prop_assert_eq!(p.alloc_change_pages, 0),
            Need::Surplus => {
                prop_assert!(p.alloc_change_pages <= 0);
                prop_assert!(!p.infeasible);
                if p.alloc_change_pages < 0 {
                    if p.a_miss == 0.0 {
                        zero_givers += 1;
                    } else {
                        finite_givers += 1;
                    }
                }
            }
            Need::Needy => {
                if p.alloc_change_pages < 0 {
                    // Taken by a needy process that came first (FCFS).
                    prop_assert!(p.infeasible);
                    prop_assert!(out.procs.iter().any(|q| q.need == Need::Needy
                        && q.arrival < p.arrival
                        && q.alloc_change_pages > 0));
                }
            }
        }
    }
    prop_assert!(zero_givers <= 1, "{zero_givers} a_miss = 0 processes gave");
    prop_assert!(zero_givers == 0 || finite_givers == 0);
    prop_assert_eq!(gained, out.reallocated_pages);
    prop_assert_eq!(net, free_before as i64 - out.free_pages as i64);
    Ok(())
}

proptest! {
    // 256 cases by default (PROPTEST_CASES=N for more). Failing cases are printed
    // (shrunk), not persisted: an integration test has no lib.rs next to it for
    // proptest's regression files.
    #![proptest_config(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn maxmem_invariants(cfg in config(), ops in prop::collection::vec(op(), 1..200)) {
        run(cfg, ops)?;
    }
}

/// Many processes with skewed accesses over many epochs reach a steady state: once
/// the targets can all be met, reallocation stops (no churn).
#[test]
fn feasible_targets_converge_and_settle() {
    let mut m = MaxMem::new(MaxMemConfig {
        fast_capacity_pages: 300,
        migration_cap_pages: 40,
        hotness_bins: 6,
        ewma_lambda: 0.5,
        proportional_step: false,
    });
    // Three processes of 200 pages each; hot sets of 80 pages get 90 % of accesses.
    for pid in 1..=3 {
        m.register(pid, 0.2).unwrap();
        for page in 0..200 {
            m.fault_in(pid, page).unwrap();
        }
    }
    let mut settled_at = None;
    for epoch in 0..200u64 {
        let samples: Vec<ProcSample> = (1..=3)
            .map(|pid| {
                // Fast accesses: 9 per hot fast page, 1 per cold fast page; slow alike.
                let mut fast = 0;
                let mut slow = 0;
                let mut pages = Vec::new();
                for page in 0..200 {
                    let w = if page < 80 { 9 } else { 1 };
                    match m.tier_of(pid, page) {
                        Some(Tier::Fast) => fast += w,
                        _ => slow += w,
                    }
                    if page < 80 || (page + epoch) % 9 == 0 {
                        pages.push((page, 1));
                    }
                }
                ProcSample {
                    pid,
                    fast_accesses: fast,
                    slow_accesses: slow,
                    pages,
                }
            })
            .collect();
        let out = m.step(&samples);
        m.check_invariants().unwrap();
        let met = out.procs.iter().all(|p| p.a_miss <= p.t_miss);
        if met && out.reallocated_pages == 0 && settled_at.is_none() {
            settled_at = Some(epoch);
        }
        if let Some(s) = settled_at {
            if epoch > s + 20 {
                assert!(out.procs.iter().all(|p| p.a_miss <= p.t_miss), "{out:?}");
            }
        }
    }
    assert!(settled_at.is_some(), "never settled: {:?}", m.statuses());
}
