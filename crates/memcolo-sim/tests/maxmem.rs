//! The MaxMem timeline through the policy's own MaxMem: the schedule's changes are
//! all reported, latency-sensitive processes reach their target in every phase, the
//! fast tier is never over-allotted, and a seed gives one result.

use memcolo_sim::maxmem::{timeline, TimelineConfig};

fn bench_size(seed: u64) -> TimelineConfig {
    TimelineConfig {
        samples: 400,
        ..TimelineConfig::scaled(144 << 20, seed)
    }
}

#[test]
fn every_phase_reaches_its_targets_within_the_fast_tier() {
    let c = bench_size(1);
    assert_eq!(
        (c.table_bytes, c.cap_bytes, c.page_bytes),
        (32 << 20, 10 << 20, 4096)
    );
    let rows = timeline(&c).unwrap();
    let changes: Vec<&str> = rows.iter().map(|r| r.change.as_str()).collect();
    for ch in [
        "start p1 @0s",
        "start p6 @100s",
        "grow_hot p5 @160s",
        "target p1 @220s",
    ] {
        assert!(changes.contains(&ch), "{ch} missing: {changes:?}");
    }
    for r in &rows {
        assert!(r.epochs_to_target.is_some(), "{r:?}");
        assert!((0.0..=1.0).contains(&r.settled_a_miss), "{r:?}");
    }
    // p6 arrives when the others hold all the fast memory: it has to be given some.
    let p6 = rows
        .iter()
        .find(|r| r.change == "start p6 @100s" && r.process == "p6")
        .unwrap();
    assert!(p6.epochs_to_target.unwrap() > 0, "{p6:?}");
    // At the end of each phase the allotments fit the 144 MiB fast tier.
    for ch in ["start p6 @100s", "grow_hot p5 @160s", "target p1 @220s"] {
        let fast: f64 = rows
            .iter()
            .filter(|r| r.change == ch)
            .map(|r| r.fast_mib_at_end)
            .sum();
        assert!(fast <= 144.0 + 1e-9, "{ch}: {fast} MiB");
    }
}

#[test]
fn same_seed_same_timeline() {
    let a = serde_json::to_string(&timeline(&bench_size(4)).unwrap()).unwrap();
    let b = serde_json::to_string(&timeline(&bench_size(4)).unwrap()).unwrap();
    assert_eq!(a, b);
    let mut bad = bench_size(1);
    bad.fast_bytes = 0;
    assert!(timeline(&bad).is_err());
}

#[test]
fn fast_memory_saved_is_reported_for_latency_sensitive_processes() {
    let c = bench_size(1);
    let rows = timeline(&c).unwrap();
    let table_mib = (c.table_bytes >> 20) as f64;
    for r in &rows {
        // p1 is best effort until 220 s: nothing to compare.
        let best_effort = r.process == "p1" && r.change != "target p1 @220s";
        assert_eq!(r.saved_vs_table_pct.is_none(), best_effort, "{r:?}");
        if let Some(saved) = r.saved_vs_table_pct {
            let expect = 100.0 * (1.0 - r.fast_mib_at_end / table_mib);
            assert!((saved - expect).abs() < 1e-9, "{r:?}");
        }
        let hot = if r.process == "p5"
            && r.change != "start p5 @40s"
            && !r.change.starts_with("start p6")
        {
            0.75
        } else {
            0.5
        };
        assert_eq!(r.hot_mib, table_mib * hot, "{r:?}");
    }
    // Six tables of 32 MiB do not fit a 144 MiB tier: after p6 starts, the
    // latency-sensitive processes save fast memory against a table each.
    let after_p6: Vec<f64> = rows
        .iter()
        .filter(|r| r.change == "start p6 @100s")
        .filter_map(|r| r.saved_vs_table_pct)
        .collect();
    assert_eq!(after_p6.len(), 5);
    assert!(after_p6.iter().sum::<f64>() > 0.0, "{after_p6:?}");
}

/// The epochs of p6's arrival depend on the sampling density (samples per page and
/// epoch), not on the size: `TimelineConfig::scaled` holds the density, so
/// `bench/tiering`'s size (8,192 pages per table) and twice it (16,384, the paper's
/// page count) are the same experiment. With 10,000 samples at every size the
/// former took 18–20 epochs and the latter 10–11.
#[test]
fn the_arrival_takes_the_same_epochs_at_the_bench_size_and_twice_it() {
    let p6 = |fast: u64| {
        let c = TimelineConfig::scaled(fast, 1);
        let rows = timeline(&c).unwrap();
        rows.iter()
            .find(|r| r.change == "start p6 @100s" && r.process == "p6")
            .unwrap()
            .epochs_to_target
            .unwrap()
    };
    let (bench, twice) = (p6(144 << 20), p6(288 << 20));
    assert!(
        bench.abs_diff(twice) <= 3,
        "144 MiB: {bench} epochs, 288 MiB: {twice}"
    );
    assert_eq!(
        TimelineConfig::scaled(144 << 30, 1).samples,
        10_000,
        "the paper's size keeps its 10,000 samples"
    );
}
