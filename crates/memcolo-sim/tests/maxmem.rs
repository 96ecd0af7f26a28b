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
