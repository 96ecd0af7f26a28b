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
        memcolo_sim::parse_args(["sim", "trace"]).is_err(),
        "--trace is required"
    );
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
