//! `m3-paper`: M3 §7.2 at the paper's 64 GiB: the static partitions searched respect
//! every job's floor, identical jobs started together gain nothing over the best of
//! them (Fig. 8's premise), staggered jobs gain under M3 (Fig. 5), and malformed
//! workloads are refused; `hermes-paper`: Hermes §5.3's levels.

use memcolo_sim::cli::report;
use memcolo_sim::papers::M3Workload;

fn rows(workloads: &str, grid: &str) -> Vec<serde_json::Value> {
    report(
        &memcolo_sim::parse_args(["sim", "m3-paper", "--workloads", workloads, "--grid", grid])
            .unwrap(),
    )
    .unwrap()
    .rows
}

#[test]
fn identical_jobs_gain_nothing_and_staggered_jobs_gain() {
    let r = rows("MMM-0,MMW-180", "6");
    assert_eq!(r.len(), 2);
    let mmm = &r[0];
    assert_eq!(mmm["workload"], "MMM-0");
    // The top (62 GiB) in sixths: the 10 splits with every job at two parts or one
    // (k-means' floor, 9 GiB, is below a part), all run.
    assert_eq!(mmm["partitions_searched"], 10, "{mmm}");
    // Of the 10 splits of 6 parts, those giving n-weight (floor 20 GiB) one part are
    // not run.
    assert_eq!(r[1]["partitions_searched"], 6, "{}", r[1]);
    for row in &r {
        assert_eq!(row["oom_kills"], 0, "{row}");
        assert_eq!(row["m3_kills"], 0, "{row}");
        assert!(row["m3_notifications"].as_u64().unwrap() > 0, "{row}");
    }
    let mmw = r[1]["mean_speedup"].as_f64().expect("every job finished");
    assert!(mmw > 1.1, "staggered jobs gain from M3: {}", r[1]);
    // Identical jobs started together: nothing for M3 to gain over the Oracle
    // (Fig. 8), which is at least as good as the equal split among the candidates.
    let mmm_speedup = mmm["mean_speedup"].as_f64().unwrap();
    assert!(mmm_speedup < 1.02, "{mmm}");
    assert!(mmm_speedup < mmw, "{mmm_speedup} vs {mmw}");
}

#[test]
fn malformed_workloads_are_refused() {
    for bad in [
        "MMW", "MMX-10", "MM-10", "MMMM-10", "MMW--5", "MMW-1e9", "MMW-nan",
    ] {
        assert!(M3Workload::parse(bad).is_err(), "accepted {bad}");
    }
    assert_eq!(M3Workload::parse("cmw-180").unwrap().name(), "CMW-180");
    let a = |g: &str| {
        report(
            &memcolo_sim::parse_args(["sim", "m3-paper", "--workloads", "MMM-0", "--grid", g])
                .unwrap(),
        )
    };
    assert!(a("2").is_err());
    assert!(a("1000").is_err());
    // In fifths of the top (12.4 GiB), n-weight needs two parts for its floor (20
    // GiB): no split gives three of them theirs.
    assert!(report(
        &memcolo_sim::parse_args(["sim", "m3-paper", "--workloads", "WWW-0", "--grid", "5"])
            .unwrap()
    )
    .is_err());
}

#[test]
fn hermes_paper_sets_each_level_of_the_kernel_beside_memcolo() {
    let r = report(
        &memcolo_sim::parse_args([
            "sim",
            "hermes-paper",
            "--node-mem",
            "4G",
            "--duration",
            "120",
            "--levels",
            "0,150",
        ])
        .unwrap(),
    )
    .unwrap();
    assert_eq!(r.rows.len(), 2, "one row per level");
    let (idle, full) = (&r.rows[0], &r.rows[1]);
    assert_eq!(idle["level"], 0);
    assert_eq!(full["level"], 150);
    for row in &r.rows {
        // The SLO is the service's p90 alone: about a tenth of its requests miss it.
        assert_eq!(
            row["slo_us"],
            memcolo_sim::Calibration::default().lc_service_p90_us
        );
        let k = row["kernel_slo_violation_pct"].as_f64().unwrap();
        let m = row["memcolo_slo_violation_pct"].as_f64().unwrap();
        assert!((5.0..30.0).contains(&k), "{row}");
        let red = row["reduction_pct"].as_f64().unwrap();
        assert!((red - 100.0 * (k - m) / k).abs() < 1e-9, "{row}");
    }
    assert_eq!(
        idle["reduction_pct"], 0.0,
        "nothing to reduce alone: {idle}"
    );
    // At 150 % the kernel alone fills the node; memcolo's advice and reclaim keep
    // room, and the service's insertions stall less.
    assert!(
        full["kernel_utilisation_pct"].as_f64().unwrap() > 95.0,
        "{full}"
    );
    assert!(full["hermes_dropped_gib"].as_f64().unwrap() > 0.0, "{full}");
    assert!(
        full["lc_direct_reclaim_s_memcolo"].as_f64().unwrap()
            <= full["lc_direct_reclaim_s_kernel"].as_f64().unwrap(),
        "{full}"
    );
}
