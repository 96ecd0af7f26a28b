//! Fleet mode: the mixes follow the menu, every node keeps memory within RAM and
//! swap, the figures do not depend on the thread count, and processes stop when
//! their time is up.

use memcolo_sim::fleet::{fleet, node_mix, node_seed, FleetConfig};
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
