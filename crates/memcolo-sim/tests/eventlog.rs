//! A recorded `memcolo` event log read into a trace: the agent's log of a
//! `bench/colocation` run (`crates/memcolo-sim/data/events-redis-quick-150-full-2026-11-28.jsonl`,
//! written by `memcolo bench colocation --quick`, Redis at level 150 % in mode `full`)
//! gives the node, the processes with their classes and lifetimes, and phases where
//! the log shows a process's page cache growing; hostile lines are skipped, counted.

use memcolo_sim::cli::report;
use memcolo_sim::eventlog::{trace_from_event_log, trace_from_event_log_text, Defaults};
use memcolo_sim::Workload;
use std::path::PathBuf;

fn recorded() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data/events-redis-quick-150-full-2026-11-28.jsonl")
}

#[test]
fn a_recorded_log_gives_the_node_processes_and_phases() {
    let imp = trace_from_event_log(&recorded(), &Defaults::for_node(1 << 30)).unwrap();
    let t = &imp.trace;
    // adv_thr_bytes 1,825,361,100 = 0.85 × the bench's 2 GiB node.
    assert!(
        (t.node_bytes as i64 - (2i64 << 30)).abs() < 16,
        "node {}",
        t.node_bytes
    );
    // Three `file_cache_dropped` of pid 16419 come 0.1 s after its `exited` (an
    // advice round planned before the exit was seen): no process to charge them to.
    assert_eq!(imp.skipped_lines, 3);
    assert_eq!(imp.events["registered"], 8);
    assert_eq!(imp.events["notify"], 6);
    // redis (registered twice, by `memcolo run` and by libmemcolo), the elastic
    // cache, five BE jobs.
    assert_eq!(t.processes.len(), 7, "{:#?}", t.processes);
    let lc: Vec<_> = t
        .processes
        .iter()
        .filter(|p| matches!(p.workload, Workload::Lc { .. }))
        .collect();
    assert_eq!(lc.len(), 1);
    assert_eq!(lc[0].name, "redis-server", "the later registration's name");
    let elastic: Vec<_> = t
        .processes
        .iter()
        .filter(|p| matches!(p.workload, Workload::Elastic { .. }))
        .collect();
    assert_eq!(elastic.len(), 1);
    // Every process stops where the log says it exited (~14 s after the first event).
    for p in &t.processes {
        let stop = p.stop_s.expect("exited or shut down");
        assert!(stop > p.start_s && stop < 16.0, "{}: {stop}", p.name);
    }
    // fio (pid 16419) read its 400 MiB file through the page cache: Hermes saw
    // 29 MiB of it first, then 400 MiB; the trace has that as a second phase.
    let readers: Vec<_> = t
        .processes
        .iter()
        .filter(|p| matches!(p.workload, Workload::BeFile { .. }))
        .collect();
    assert_eq!(readers.len(), 2, "two BE processes had page cache advised");
    let fio = readers
        .iter()
        .find(|p| !p.phases.is_empty())
        .expect("a reader with phases");
    let Workload::BeFile { file_bytes, .. } = fio.workload else {
        unreachable!()
    };
    let Workload::BeFile {
        file_bytes: later, ..
    } = fio.phases.last().unwrap().workload
    else {
        panic!("a phase of the same class")
    };
    assert!(
        file_bytes < 64 << 20 && later > 384 << 20,
        "{file_bytes} then {later}"
    );
    assert!(fio.phases[0].at_s > fio.start_s);
    assert!((imp.duration_s - 15.2).abs() < 0.5, "{}", imp.duration_s);
}

#[test]
fn the_trace_scenario_runs_a_recorded_log_under_both_modes() {
    let r = report(
        &memcolo_sim::parse_args(["sim", "trace", "--event-log", recorded().to_str().unwrap()])
            .unwrap(),
    )
    .unwrap();
    assert!(
        (r.duration_s - 15.236).abs() < 1e-3,
        "the log's length: {}",
        r.duration_s
    );
    assert!((r.node_bytes as i64 - (2i64 << 30)).abs() < 16);
    assert_eq!(r.rows.len(), 2);
    for row in &r.rows {
        assert_eq!(row["finished"], 6, "5 BE jobs and the cache exit: {row}");
        assert!(row["lc_p50_us"].as_f64().unwrap() > 0.0);
    }
    // With --out the imported trace is written as trace.json, which --trace reads
    // back into the same run.
    let dir = tempfile::tempdir().unwrap();
    memcolo_sim::run(
        &memcolo_sim::parse_args([
            "sim",
            "trace",
            "--event-log",
            recorded().to_str().unwrap(),
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ])
        .unwrap(),
    )
    .unwrap();
    let again = report(
        &memcolo_sim::parse_args([
            "sim",
            "trace",
            "--trace",
            dir.path().join("trace.json").to_str().unwrap(),
            "--duration",
            &r.duration_s.to_string(),
        ])
        .unwrap(),
    )
    .unwrap();
    assert_eq!(again.rows, r.rows, "the written trace is the one that ran");
}

#[test]
fn hostile_lines_are_skipped_and_counted() {
    let d = Defaults::for_node(4 << 30);
    let log = [
        r#"{"event":"registered","pid":7,"class":"lc","name":"svc","ts":"2026-01-01T00:00:00.000Z"}"#,
        "not json",
        r#"{"event":"registered","pid":8,"class":"root","ts":"2026-01-01T00:00:01.000Z"}"#,
        r#"{"event":"registered","pid":9,"class":"be","ts":"yesterday"}"#,
        r#"{"event":"kill","pid":99,"rss_bytes":5,"ts":"2026-01-01T00:00:02.000Z"}"#,
        r#"{"event":"kill","pid":7,"rss_bytes":1e300,"ts":"2026-01-01T00:00:02.000Z"}"#,
        r#"{"event":"registered","pid":10,"class":"be","ts":"2026-01-01T00:00:03.000Z"}"#,
        r#"{"event":"kill","pid":10,"rss_bytes":1073741824,"ts":"2026-01-01T00:00:09.000Z"}"#,
        r#"[1,2,3]"#,
        r#"{"event":"exited","pid":7,"ts":"2026-01-01T00:00:10.000Z"}"#,
    ]
    .join("\n");
    let imp = trace_from_event_log_text(&log, &d).unwrap();
    assert_eq!(imp.skipped_lines, 6);
    assert_eq!(imp.trace.node_bytes, 4 << 30, "no adv_thr: the default");
    assert_eq!(imp.trace.processes.len(), 2);
    let svc = &imp.trace.processes[0];
    assert_eq!(svc.stop_s, Some(10.0));
    assert!(
        matches!(svc.workload, Workload::Lc { ws_bytes, .. } if ws_bytes == (4 << 30) / 16),
        "no evidence: the default size"
    );
    let be = &imp.trace.processes[1];
    assert_eq!(be.stop_s, None, "a kill is evidence, not a stop");
    assert!(
        matches!(be.workload, Workload::BeAnon { size_bytes, .. } if size_bytes == 1 << 30),
        "{:?}",
        be.workload
    );
    // Nothing registered: an error, not an empty run.
    assert!(trace_from_event_log_text("{}\nnope\n", &d).is_err());
}
