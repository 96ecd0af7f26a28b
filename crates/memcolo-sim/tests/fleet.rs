//! Fleet mode: the mixes follow the menu, every node keeps memory within RAM and
//! swap, the figures do not depend on the thread count, and processes stop when
//! their time is up.

use memcolo_sim::fleet::{fleet, fleet_ab, node_mix, node_seed, Ab, Arm, FleetConfig};
use memcolo_sim::node::{Mode, Node, NodeConfig, ProcSpec, Workload, LC_SAMPLES_PER_STEP};
use memcolo_sim::Calibration;
use std::time::Duration;

const GIB: u64 = 1 << 30;

fn cfg(nodes: u32, threads: usize, day_s: u64) -> FleetConfig {
    FleetConfig {
        nodes,
        node_bytes: 64 * GIB,
        swap_bytes: 32 * GIB,
        duration: Duration::from_secs(day_s),
        step: Duration::from_secs(1),
        seed: 9,
        calib: Calibration::default(),
        slo_us: 10_000.0,
        threads,
    }
}

#[test]
fn mixes_follow_the_menu_and_differ_between_nodes() {
    let day = 86_400.0;
    let mixes: Vec<Vec<ProcSpec>> = (0..50)
        .map(|k| node_mix(64 * GIB, day, node_seed(1, k)))
        .collect();
    for m in &mixes {
        let count = |f: fn(&Workload) -> bool| m.iter().filter(|p| f(&p.workload)).count();
        let lc = count(|w| matches!(w, Workload::Lc { .. }));
        let be = count(|w| matches!(w, Workload::BeAnon { .. } | Workload::BeFile { .. }));
        let el = count(|w| matches!(w, Workload::Elastic { .. }));
        assert!(
            (1..=2).contains(&lc) && (4..=12).contains(&be) && el <= 2,
            "{m:?}"
        );
        for p in m {
            assert!(p.start_s >= 0.0 && p.start_s < day, "{p:?}");
            match p.workload {
                Workload::BeAnon { .. } | Workload::BeFile { .. } => {
                    let stop = p.stop_s.expect("batch jobs end");
                    assert!(stop - p.start_s >= 1800.0 && stop - p.start_s <= 8.0 * 3600.0);
                }
                _ => assert_eq!(p.stop_s, None),
            }
        }
    }
    let names = |m: &Vec<ProcSpec>| format!("{m:?}");
    assert_ne!(names(&mixes[0]), names(&mixes[1]));
    assert_eq!(
        names(&mixes[3]),
        names(&node_mix(64 * GIB, day, node_seed(1, 3)))
    );
}

#[test]
fn every_node_keeps_memory_within_ram_and_swap() {
    for k in 0..3 {
        for mode in [Mode::Kernel, Mode::Memcolo] {
            let seed = node_seed(5, k);
            let mut node = Node::new(
                NodeConfig {
                    total_bytes: 64 * GIB,
                    swap_bytes: 8 * GIB,
                    step: Duration::from_secs(1),
                    seed,
                    mode,
                    calib: Calibration::default(),
                    poll: Duration::from_secs(1),
                    slo_us: 10_000.0,
                    reclaim_workers: 1,
                    measure_from: Duration::ZERO,
                    lc_samples_per_step: LC_SAMPLES_PER_STEP,
                },
                // A 4 h day: every batch job starts within it.
                node_mix(64 * GIB, 4.0 * 3600.0, seed),
            )
            .unwrap();
            while node.now() < Duration::from_secs(4 * 3600) {
                node.step();
                node.check()
                    .unwrap_or_else(|e| panic!("node {k} {mode:?} at {:?}: {e}", node.now()));
            }
        }
    }
}

#[test]
fn figures_do_not_depend_on_the_thread_count() {
    let strip = |rows: Vec<memcolo_sim::fleet::FleetRow>| {
        rows.into_iter()
            .map(|mut r| {
                r.wall_s = 0.0;
                serde_json::to_string(&r).unwrap()
            })
            .collect::<Vec<_>>()
    };
    let modes = [Mode::Kernel, Mode::Memcolo];
    let one = strip(fleet(&cfg(5, 1, 1800), &modes).unwrap());
    let three = strip(fleet(&cfg(5, 3, 1800), &modes).unwrap());
    assert_eq!(one, three);
    assert_eq!(one.len(), 2);
    assert!(one[0].contains("\"mode\":\"kernel\"") && one[1].contains("\"mode\":\"memcolo\""));
    assert!(fleet(&cfg(0, 1, 10), &modes).is_err());
}

#[test]
fn a_process_stops_at_its_time_and_gives_its_memory_back() {
    let procs = vec![ProcSpec {
        name: "job".into(),
        start_s: 1.0,
        cap_bytes: None,
        stop_s: Some(5.0),
        workload: Workload::BeAnon {
            size_bytes: GIB,
            grow_bytes_per_s: GIB as f64,
            touch_bytes_per_s: 1e6,
        },
    }];
    let mut node = Node::new(
        NodeConfig {
            total_bytes: 4 * GIB,
            swap_bytes: 0,
            step: Duration::from_millis(100),
            seed: 1,
            mode: Mode::Kernel,
            calib: Calibration::default(),
            poll: Duration::from_secs(1),
            slo_us: 10_000.0,
            reclaim_workers: 1,
            measure_from: Duration::ZERO,
            lc_samples_per_step: LC_SAMPLES_PER_STEP,
        },
        procs,
    )
    .unwrap();
    node.run(Duration::from_secs(4));
    assert_eq!(node.rss_of("job"), GIB);
    node.run(Duration::from_secs(6));
    assert_eq!(node.used_bytes(), 0);
    let s = node.finish();
    assert_eq!(s.procs[0].finished_s, Some(5.0));
    assert!(!s.procs[0].killed_by_oom && !s.procs[0].killed_by_m3);
}

#[test]
fn ab_parses_and_rejects() {
    let ab = Ab::parse("skip_subrelease_s=0,60").unwrap();
    assert_eq!(ab.key, "skip_subrelease_s");
    assert_eq!(ab.values, ["0", "60"]);
    let ab = Ab::parse("trough_depth=[0.1,0.2],[0.3,0.4]").unwrap();
    assert_eq!(ab.values, ["[0.1,0.2]", "[0.3,0.4]"]);
    for bad in ["skip_subrelease_s", "=1,2", "skip_subrelease_s=1,"] {
        assert!(Ab::parse(bad).is_err(), "{bad}");
    }
    let base = Arm::base(&cfg(1, 1, 10));
    let arms = Ab::parse("skip_subrelease_s=0,60")
        .unwrap()
        .arms(&base)
        .unwrap();
    assert_eq!(arms[0].subrelease.skip_subrelease_s, 0);
    assert_eq!(arms[1].subrelease.skip_subrelease_s, 60);
    assert_eq!(arms[1].label, "skip_subrelease_s=60");
    // a calibration field and a churn parameter are settings too
    assert!(base.with("lc_lru_weight", "2.0").is_ok());
    assert_eq!(
        base.with("heal_per_s", "0.5").unwrap().churn.heal_per_s,
        0.5
    );
    for (k, v) in [
        ("no_such_setting", "1"),
        ("skip_subrelease_s", "901"),
        ("t_schedule_s", "0"),
        ("skip_subrelease_s", "-1"),
        ("skip_subrelease_s", "x"),
        ("heal_per_s", "2"),
    ] {
        assert!(base.with(k, v).is_err(), "{k}={v}");
    }
}

/// The fleet A/B of TCMalloc-AS's Δ: the heaps observe the node model, so the node
/// figures are the same in both arms; Δ = 60 s skips releases (some confirmed), breaks
/// fewer huge pages and keeps more memory mapped than Δ = 0, which skips none.
#[test]
fn skip_subrelease_ab_on_the_same_nodes() {
    let f = cfg(3, 2, 4 * 3600);
    let mut base = Arm::base(&f)
        .with("release_rate_bytes", "67108864")
        .unwrap();
    base.label.clear();
    let ab = Ab::parse("skip_subrelease_s=0,60").unwrap();
    let rows = fleet_ab(&f, &[Mode::Memcolo], &base, Some(&ab)).unwrap();
    assert_eq!(rows.len(), 2);
    let (d0, d60) = (&rows[0], &rows[1]);
    assert_eq!(d0.arm, "skip_subrelease_s=0");
    assert_eq!(d0.utilisation, d60.utilisation);
    assert_eq!(d0.lc_p99_median_us, d60.lc_p99_median_us);
    for r in &rows {
        assert!((0.0..=1.0).contains(&r.hugepage_coverage), "{r:?}");
        assert!(r.realized_fragmentation_ratio >= 0.0 && r.heap_free_ratio >= 0.0);
        assert!(r.subreleased_tib > 0.0 && r.hugepages_broken > 0, "{r:?}");
    }
    assert_eq!(d0.skipped_correct_ratio, 0.0);
    assert!(d60.skipped_correct_ratio > 0.0);
    assert!(
        d60.hugepage_coverage > d0.hugepage_coverage,
        "{d0:?} {d60:?}"
    );
    assert!(d60.heap_free_ratio > d0.heap_free_ratio);
    assert!(d60.subreleased_tib < d0.subreleased_tib);
}

#[test]
fn ab_and_set_from_the_command_line() {
    let args = |extra: &[&str]| {
        let mut v = vec![
            "sim",
            "fleet",
            "--nodes",
            "2",
            "--duration",
            "600",
            "--modes",
            "memcolo",
            "--threads",
            "1",
        ];
        v.extend_from_slice(extra);
        memcolo_sim::parse_args(v).unwrap()
    };
    let r = memcolo_sim::cli::report(&args(&[
        "--set",
        "release_rate_bytes=67108864",
        "--ab",
        "skip_subrelease_s=0,60",
    ]))
    .unwrap();
    let arms: Vec<&str> = r
        .rows
        .iter()
        .map(|row| row["arm"].as_str().unwrap())
        .collect();
    assert_eq!(arms, ["skip_subrelease_s=0", "skip_subrelease_s=60"]);
    assert!(r.rows[0]["hugepage_coverage"].as_f64().is_some());
    let plain = memcolo_sim::cli::report(&args(&[])).unwrap();
    assert_eq!(plain.rows.len(), 1);
    assert_eq!(plain.rows[0]["arm"], "");
    for bad in [
        &["--set", "release_rate_bytes"][..],
        &["--set", "nope=1"],
        &["--ab", "skip_subrelease_s"],
        &["--ab", "t_schedule_s=0,300"],
    ] {
        assert!(memcolo_sim::cli::report(&args(bad)).is_err(), "{bad:?}");
    }
}
