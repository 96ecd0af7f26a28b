//! `memcolo sim`'s command line: arguments parse, the report is written and complete.

use memcolo_sim::cli::{parse_size, report, run, SimArgs};

fn args(v: &[&str]) -> SimArgs {
    memcolo_sim::parse_args(std::iter::once("sim").chain(v.iter().copied())).unwrap()
}

#[test]
fn sizes_parse() {
    assert_eq!(parse_size("2G"), Ok(2 << 30));
    assert_eq!(parse_size("512m"), Ok(512 << 20));
    assert_eq!(parse_size("1T"), Ok(1 << 40));
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("0"), Ok(0));
    assert!(parse_size("-1G").is_err());
    assert!(parse_size("lots").is_err());
    assert!(parse_size("").is_err());
}

#[test]
fn colocation_writes_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r");
    let a = args(&[
        "colocation",
        "--node-mem",
        "1G",
        "--duration",
        "5",
        "--levels",
        "0,150",
        "--out",
        out.to_str().unwrap(),
    ]);
    run(&a).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(json["node_bytes"], 1u64 << 30);
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "two levels × kernel and memcolo");
    assert_eq!(rows[3]["level"], 150);
    assert_eq!(rows[3]["mode"], "memcolo");
    let csv = std::fs::read_to_string(out.join("report.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5);
    assert!(csv.lines().next().unwrap().contains("lc_p99_us"));
}

#[test]
fn other_scenarios_and_bad_arguments() {
    let r = report(&args(&[
        "m3-elastic",
        "--node-mem",
        "4G",
        "--duration",
        "20",
    ]))
    .unwrap();
    assert_eq!(r.rows.len(), 6, "three jobs, static and m3");
    let r = report(&args(&["scale", "--node-mem", "64G", "--duration", "5"])).unwrap();
    assert_eq!(r.rows[0]["processes"], 100);
    let r = report(&args(&["fleet", "--nodes", "2", "--duration", "60"])).unwrap();
    assert_eq!(r.rows.len(), 2, "kernel and memcolo");
    assert_eq!(r.step_ms, 1000, "fleet steps 1 s by default");
    assert_eq!(r.rows[1]["mode"], "memcolo");
    let r = report(&args(&[
        "fleet",
        "--nodes",
        "2",
        "--duration",
        "60",
        "--modes",
        "memcolo",
    ]))
    .unwrap();
    assert_eq!(r.rows.len(), 1);
    assert!(report(&args(&["fleet", "--nodes", "0", "--duration", "60"])).is_err());
    assert!(memcolo_sim::parse_args(["sim", "fleet", "--modes", "senpai"]).is_err());
    // tests/maxmem.rs runs the timeline (with fewer samples than the command's).
    assert!(memcolo_sim::parse_args(["sim", "maxmem-timeline", "--node-mem", "144M"]).is_ok());
    assert!(report(&args(&["colocation", "--duration", "0"])).is_err());
    assert!(report(&args(&["colocation", "--step-ms", "0"])).is_err());
    assert!(memcolo_sim::parse_args(["sim", "nonsense"]).is_err());
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("calib.json");
    for text in [
        r#"{"swapin_us": -1}"#,
        r#"{"page_bytes": 18446744073709551615}"#,
        r#"{"reclaim_cluster_pages": 18446744073709551615}"#,
        r#"{"lc_service_us": 500, "lc_service_p90_us": 100}"#,
        r#"{"lc_service_p99_us": 100}"#,
        r#"not json"#,
    ] {
        std::fs::write(&bad, text).unwrap();
        assert!(
            report(&args(&[
                "colocation",
                "--duration",
                "1",
                "--calibration",
                bad.to_str().unwrap()
            ]))
            .is_err(),
            "{text}"
        );
    }
    // A partial file overrides only what it names.
    std::fs::write(&bad, r#"{"swapin_us": 50}"#).unwrap();
    let r = report(&args(&[
        "colocation",
        "--duration",
        "1",
        "--levels",
        "0",
        "--calibration",
        bad.to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(r.calibration.swapin_us, 50.0);
    assert_eq!(r.calibration.lc_service_us, 95.0);
}
