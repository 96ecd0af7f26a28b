//! The trace scenario: the documented example runs under both modes, processes stop
//! at their time, and malformed or out-of-range traces are refused before any run.

use memcolo_sim::cli::{report, SimArgs};
use memcolo_sim::trace::Trace;

fn args(v: &[&str]) -> SimArgs {
    memcolo_sim::parse_args(std::iter::once("sim").chain(v.iter().copied())).unwrap()
}

/// The example of `memcolo_sim::trace`'s docs, at 1/16 of its size.
const EXAMPLE: &str = r#"{"node_bytes": 4294967296, "swap_bytes": 1073741824,
 "processes": [
  {"name": "redis", "start_s": 0,
   "workload": {"lc": {"ws_bytes": 268435456, "grow_bytes_per_s": 1e9, "rate": 20000}}},
  {"name": "etl", "start_s": 5, "stop_s": 40,
   "workload": {"be_file": {"file_bytes": 2147483648, "read_bytes_per_s": 5e8}}},
  {"name": "hog", "start_s": 10,
   "workload": {"be_anon": {"size_bytes": 2147483648, "grow_bytes_per_s": 5e8,
                            "touch_bytes_per_s": 1e8}}},
  {"name": "cache", "start_s": 0,
   "workload": {"elastic": {"want_bytes": 1073741824, "floor_bytes": 67108864,
     "grow_bytes_per_s": 5e8, "layer_bytes": 16777216, "miss_penalty": 2,
     "work_s": 1e12}}}]}"#;

#[test]
fn the_documented_example_runs_under_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("trace.json");
    std::fs::write(&f, EXAMPLE).unwrap();
    let r = report(&args(&[
        "trace",
        "--trace",
        f.to_str().unwrap(),
        "--duration",
        "60",
    ]))
    .unwrap();
    assert_eq!(r.node_bytes, 4 << 30, "from the trace");
    assert_eq!(r.swap_bytes, 1 << 30, "from the trace");
    assert_eq!(r.rows.len(), 2);
    assert_eq!(r.rows[0]["mode"], "kernel");
    assert_eq!(r.rows[1]["mode"], "memcolo");
    for row in &r.rows {
        assert_eq!(row["finished"], 1, "etl stops at 40 s: {row}");
        assert!(row["lc_p99_us"].as_f64().unwrap() > 0.0);
    }
    assert!(
        r.rows[1]["notifications"].as_u64().unwrap() > 0,
        "M3 signals the cache"
    );
    // --node-mem overrides the trace.
    let r = report(&args(&[
        "trace",
        "--trace",
        f.to_str().unwrap(),
        "--duration",
        "5",
        "--node-mem",
        "8G",
        "--modes",
        "memcolo",
    ]))
    .unwrap();
    assert_eq!((r.node_bytes, r.rows.len()), (8 << 30, 1));
    assert!(report(&args(&[
        "trace",
        "--duration",
        "5",
        "--trace",
        "/nonexistent"
    ]))
    .is_err());
    assert!(
        report(&args(&["trace"])).is_err(),
        "--trace or --event-log is required"
    );
    assert!(
        memcolo_sim::parse_args(["sim", "trace", "--trace", "a", "--event-log", "b"]).is_err(),
        "one or the other"
    );
}

/// A holder of 1 GiB whose second phase (at 10 s) holds 256 MiB, and an LC service
/// whose second phase (at 5 s) doubles its working set.
const PHASED: &str = r#"{"node_bytes": 4294967296, "swap_bytes": 0,
 "processes": [
  {"name": "lc", "start_s": 0,
   "workload": {"lc": {"ws_bytes": 268435456, "grow_bytes_per_s": 1e9, "rate": 1000}},
   "phases": [{"at_s": 5, "workload": {"lc": {"ws_bytes": 536870912,
     "grow_bytes_per_s": 1e9, "rate": 1000}}}]},
  {"name": "hog", "start_s": 0,
   "workload": {"be_anon": {"size_bytes": 1073741824, "grow_bytes_per_s": 1e9,
                            "touch_bytes_per_s": 1e8}},
   "phases": [{"at_s": 10, "workload": {"be_anon": {"size_bytes": 268435456,
     "grow_bytes_per_s": 1e9, "touch_bytes_per_s": 1e8}}}]}]}"#;

#[test]
fn phases_change_a_process_and_carry_its_memory() {
    use memcolo_sim::scenario::Common;
    use std::time::Duration;
    let t: Trace = serde_json::from_str(PHASED).unwrap();
    t.check().unwrap();
    let c = Common {
        node_bytes: t.node_bytes,
        swap_bytes: 0,
        duration: Duration::from_secs(20),
        step: Duration::from_millis(100),
        seed: 1,
        calib: memcolo_sim::Calibration::default(),
        slo_us: 10_000.0,
        warmup: Duration::ZERO,
        lc_samples_per_step: 4,
    };
    let specs: Vec<_> = t.processes.iter().map(|p| p.spec()).collect();
    let mut node = memcolo_sim::Node::new(
        memcolo_sim::NodeConfig {
            total_bytes: c.node_bytes,
            swap_bytes: 0,
            step: c.step,
            seed: 1,
            mode: memcolo_sim::Mode::Kernel,
            calib: c.calib.clone(),
            poll: Duration::from_secs(1),
            slo_us: c.slo_us,
            reclaim_workers: 1,
            measure_from: Duration::ZERO,
            lc_samples_per_step: 4,
        },
        specs,
    )
    .unwrap();
    for (i, p) in t.processes.iter().enumerate() {
        for ph in &p.phases {
            node.add_phase(i, ph.at_s, ph.workload.clone()).unwrap();
        }
    }
    // A phase of another class, or before the last one, is refused.
    let lc_again = t.processes[0].workload.clone();
    assert!(node.add_phase(1, 30.0, lc_again.clone()).is_err());
    assert!(node.add_phase(0, 1.0, lc_again).is_err());
    assert!(node
        .add_phase(9, 30.0, t.processes[1].workload.clone())
        .is_err());
    node.run(Duration::from_secs(4));
    assert_eq!(node.rss_of("lc"), 256 << 20);
    assert_eq!(node.rss_of("hog"), 1 << 30);
    node.run(Duration::from_secs(9));
    assert_eq!(
        node.rss_of("lc"),
        512 << 20,
        "the LC phase grew its working set"
    );
    assert_eq!(node.rss_of("hog"), 1 << 30, "memory carried, not restarted");
    node.run(Duration::from_secs(12));
    assert_eq!(
        node.rss_of("hog"),
        256 << 20,
        "the smaller phase freed the rest"
    );
    node.check().unwrap();

    // Through the trace scenario, and refused when malformed.
    let good: serde_json::Value = serde_json::from_str(PHASED).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("t.json");
    std::fs::write(&f, PHASED).unwrap();
    let r = report(&args(&[
        "trace",
        "--trace",
        f.to_str().unwrap(),
        "--duration",
        "15",
    ]))
    .unwrap();
    assert_eq!(r.rows.len(), 2);
    for edit in [
        serde_json::json!({"at_s": -1, "workload": good["processes"][1]["workload"]}),
        serde_json::json!({"at_s": 1e300, "workload": good["processes"][1]["workload"]}),
        serde_json::json!({"at_s": 3, "workload": good["processes"][0]["workload"]}),
        serde_json::json!({"at_s": 3, "workload": {"be_anon": {"size_bytes": 1e30,
            "grow_bytes_per_s": 1, "touch_bytes_per_s": 1}}}),
        serde_json::json!({"at_s": 3, "workload": good["processes"][1]["workload"], "x": 1}),
    ] {
        let mut v = good.clone();
        v["processes"][1]["phases"] = serde_json::json!([edit]);
        std::fs::write(&f, v.to_string()).unwrap();
        assert!(Trace::load(&f).is_err(), "accepted: {v}");
    }
}

#[test]
fn malformed_traces_are_refused() {
    let good: serde_json::Value = serde_json::from_str(EXAMPLE).unwrap();
    let mut bad = Vec::new();
    let mut edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = good.clone();
        f(&mut v);
        bad.push(v);
    };
    edit(&|v| v["node_bytes"] = 0.into());
    edit(&|v| v["node_bytes"] = u64::MAX.into());
    edit(&|v| v["processes"] = serde_json::json!([]));
    edit(&|v| v["processes"][0]["start_s"] = (-1.0).into());
    edit(&|v| v["processes"][1]["stop_s"] = 1e300.into());
    edit(&|v| v["processes"][0]["workload"]["lc"]["rate"] = 1e300.into());
    edit(&|v| v["processes"][2]["workload"]["be_anon"]["size_bytes"] = u64::MAX.into());
    edit(&|v| v["processes"][0]["name"] = "x".repeat(300).into());
    edit(&|v| v["processes"][0]["workload"] = serde_json::json!({"gpu": {}}));
    edit(&|v| v["processes"][0]["priority"] = 1.into());
    edit(&|v| v["extra"] = 1.into());
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("t.json");
    for v in bad {
        std::fs::write(&f, v.to_string()).unwrap();
        assert!(Trace::load(&f).is_err(), "accepted: {v}");
    }
    std::fs::write(&f, "{").unwrap();
    assert!(Trace::load(&f).is_err());
    std::fs::write(&f, EXAMPLE).unwrap();
    Trace::load(&f).unwrap();
}
