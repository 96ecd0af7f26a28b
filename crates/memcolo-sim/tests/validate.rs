//! `memcolo sim --validate`: references load from a bench run directory or a JSON
//! file and are checked like any input; a reference equal to the sim's own figures
//! passes with no error, one off by a factor fails on that metric alone; the command
//! line writes its files and exits with an error above the bound.

use memcolo_sim::cli::{run, validation, SimArgs};
use memcolo_sim::validate::{validate, OtherFigure, Reference, METRICS, OTHER_METRICS};
use memcolo_sim::Calibration;
use std::time::Duration;

fn args(v: &[&str]) -> SimArgs {
    memcolo_sim::parse_args(std::iter::once("sim").chain(v.iter().copied())).unwrap()
}

/// The built-in reference cut to two levels and no other bench's figure (quick to
/// run).
fn small() -> Reference {
    let mut r = Reference::builtin();
    r.cells.retain(|c| c.level == 0 || c.level == 125);
    r.other.clear();
    r
}

#[test]
fn the_builtin_reference_is_the_redis_quick_sweep() {
    let r = Reference::builtin();
    r.check().unwrap();
    assert_eq!(r.node_bytes, 2 << 30);
    assert_eq!((r.warmup_s, r.measured_s, r.slo_us), (4.0, 6.0, 125.0));
    assert_eq!(r.levels(), vec![0, 50, 100, 125, 150]);
    assert_eq!(r.memcolo_mode(), "full");
    // Every compared metric at every level for both modes.
    assert_eq!(r.cells.len(), 5 * 2 * METRICS.len());
    let p99_100 = r
        .cells
        .iter()
        .find(|c| c.level == 100 && c.mode == "kernel" && c.metric == "p99_us")
        .unwrap();
    assert_eq!(p99_100.median, 1405.0);
    let other: Vec<&str> = r.other.iter().map(|o| o.metric.as_str()).collect();
    assert_eq!(other, OTHER_METRICS);
}

#[test]
fn another_benchs_figure_is_simulated_and_compared() {
    let mut r = small();
    r.cells.retain(|c| c.level == 0 && c.metric == "p50_us");
    r.other.push(OtherFigure {
        metric: "m3_jjj0_mean_speedup".into(),
        measured: 1.12,
        source: "bench/m3/RESULTS.md".into(),
    });
    let v = validate(
        &r,
        &Calibration::default(),
        1,
        Duration::from_millis(100),
        25.0,
    )
    .unwrap();
    let m3 = v
        .cells
        .iter()
        .find(|c| c.metric == "m3_jjj0_mean_speedup")
        .unwrap();
    assert!(m3.sim > 0.5 && m3.sim < 3.0, "{m3:?}");
    let e = v
        .metrics
        .iter()
        .find(|m| m.metric == "m3_jjj0_mean_speedup")
        .unwrap();
    assert_eq!(e.cells, 1);
    assert!((e.mean_abs_error_pct - m3.error_pct.unwrap().abs()).abs() < 1e-9);
    // An unknown figure is refused, not skipped.
    r.other[0].metric = "hermes_fig7".into();
    assert!(r.check().is_err());
    r.other[0].metric = "m3_jjj0_mean_speedup".into();
    r.other[0].measured = f64::INFINITY;
    assert!(r.check().is_err());
}

#[test]
fn the_sims_own_figures_pass_and_a_factor_of_two_fails_that_metric() {
    let calib = Calibration::default();
    let step = Duration::from_millis(100);
    let first = validate(&small(), &calib, 1, step, 25.0).unwrap();
    assert_eq!(first.cells.len(), 2 * 2 * METRICS.len());
    // A reference made of the sim's own medians.
    let mut own = small();
    for cell in own.cells.iter_mut() {
        let sim_mode = if cell.mode == "kernel" {
            "kernel"
        } else {
            "memcolo"
        };
        let c = first
            .cells
            .iter()
            .find(|c| c.level == cell.level && c.sim_mode == sim_mode && c.metric == cell.metric)
            .unwrap();
        (cell.median, cell.min, cell.max) = (c.sim, c.sim, c.sim);
    }
    let same = validate(&own, &calib, 1, step, 25.0).unwrap();
    assert!(same.pass, "{}", same.table());
    for m in &same.metrics {
        assert!(m.max_abs_error_pct < 1e-9, "{m:?}");
        assert_eq!(m.within_measured_range, m.cells, "{m:?}");
    }
    // The measured p99 twice the sim's: error −50 % on p99 only.
    for cell in own.cells.iter_mut().filter(|c| c.metric == "p99_us") {
        cell.median *= 2.0;
    }
    let off = validate(&own, &calib, 1, step, 25.0).unwrap();
    assert!(!off.pass);
    for m in &off.metrics {
        if m.metric == "p99_us" {
            assert!((m.mean_abs_error_pct - 50.0).abs() < 1e-6, "{m:?}");
            assert!(!m.pass);
        } else {
            assert!(m.pass, "{m:?}");
        }
    }
}

#[test]
fn hostile_references_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ref.json");
    let good = serde_json::to_value(small()).unwrap();
    let mut cases = Vec::new();
    for (k, v) in [
        ("node_bytes", serde_json::json!(0)),
        ("measured_s", serde_json::json!(0)),
        ("warmup_s", serde_json::json!(1e300)),
        ("rate", serde_json::json!(-1)),
        ("lc_rss_bytes", serde_json::json!(u64::MAX)),
        ("unknown_field", serde_json::json!(1)),
    ] {
        let mut r = good.clone();
        r[k] = v;
        cases.push(r);
    }
    let mut r = good.clone();
    r["cells"][0]["level"] = serde_json::json!(5000);
    cases.push(r);
    for r in cases {
        std::fs::write(&file, r.to_string()).unwrap();
        assert!(Reference::load(&file).is_err(), "{r}");
    }
    std::fs::write(&file, "not json").unwrap();
    assert!(Reference::load(&file).is_err());
    // No level with both modes: nothing to compare.
    let mut r = small();
    r.cells.retain(|c| c.mode == "kernel");
    assert!(validate(
        &r,
        &Calibration::default(),
        1,
        Duration::from_millis(100),
        25.0
    )
    .is_err());
}

#[test]
fn a_bench_run_directory_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("meta.json"),
        r#"{"commit": "abc1234", "date": "2026-11-28 10:30 UTC", "host": "vm",
            "lc_service": "redis", "command": "memcolo bench colocation --quick",
            "slo_us": 120,
            "parameters": [["node memory", "1.00 GiB"], ["warm-up / measured", "3 s / 5 s"],
                           ["rate", "1500 req/s, open loop, 4 connections"]]}"#,
    )
    .unwrap();
    std::fs::write(
        d.join("runs.csv"),
        "level_pct,mode,accepted,redis_rss_bytes,be_file_mib_per_min\n\
         0,kernel,true,100000000,0.0\n\
         0,kernel,true,80000000,0.0\n\
         0,kernel,false,1,0.0\n\
         100,kernel,true,90000000,60.0\n\
         100,full,true,90000000,120.0\n",
    )
    .unwrap();
    std::fs::write(
        d.join("summary.csv"),
        "level,mode,metric,median,min,max,n\n\
         0,kernel,p99_us,200,190,210,2\n\
         0,full,p99_us,180,170,190,2\n\
         0,senpai,p99_us,300,290,310,2\n\
         0,kernel,be_kills,0,0,0,2\n",
    )
    .unwrap();
    let r = Reference::load(d).unwrap();
    assert_eq!(r.node_bytes, 1 << 30);
    assert_eq!(
        (r.warmup_s, r.measured_s, r.slo_us, r.rate),
        (3.0, 5.0, 120.0, 1500.0)
    );
    assert_eq!(
        r.lc_rss_bytes, 90_000_000,
        "median of the accepted 0 % kernel runs"
    );
    assert_eq!(r.be_file_read_bytes_per_s, 1.5 * (1u64 << 20) as f64);
    assert_eq!(
        r.cells.len(),
        2,
        "compared metrics and modes only: {:?}",
        r.cells
    );
    assert_eq!(r.levels(), vec![0]);
    // A directory without the files is an error, not an empty reference.
    let empty = tempfile::tempdir().unwrap();
    assert!(Reference::load(empty.path()).is_err());
}

#[test]
fn the_command_line_writes_its_files_and_fails_above_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ref.json");
    std::fs::write(&file, serde_json::to_string(&small()).unwrap()).unwrap();
    let out = dir.path().join("out");
    let f = file.to_str().unwrap();
    let o = out.to_str().unwrap();
    let v = validation(&args(&[
        "--validate",
        "--reference",
        f,
        "--seeds",
        "1",
        "--out",
        o,
    ]))
    .unwrap();
    assert_eq!(v.seeds, 1);
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("validation.json")).unwrap())
            .unwrap();
    assert_eq!(written["cells"].as_array().unwrap().len(), v.cells.len());
    let back = Reference::load(&out.join("reference.json")).unwrap();
    assert_eq!(back, small());
    // A bound no model meets fails; a bound every error is below passes.
    assert!(run(&args(&[
        "--validate",
        "--reference",
        f,
        "--seeds",
        "1",
        "--bound",
        "0"
    ]))
    .is_err());
    run(&args(&[
        "--validate",
        "--reference",
        f,
        "--seeds",
        "1",
        "--bound",
        "1e9",
    ]))
    .unwrap();
    // --validate takes no scenario; without it a scenario is needed.
    assert!(memcolo_sim::parse_args(["sim", "colocation", "--validate"]).is_err());
    assert!(memcolo_sim::parse_args(["sim"]).is_err());
}
