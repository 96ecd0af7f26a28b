//! End to end on the real kernel: 60 s in M3's yellow zone give a registered elastic
//! process at most one low notification per poll period (issue 21, "signals with
//! manners"; M3 rules R8 and R9 of `memcolo_policy::m3`).
//!
//! `memcolo agent` manages a 512 MiB memory cgroup scope (v1) with a 1 s poll and
//! thresholds held still (ratio target 0:1: none moves in yellow). In the scope, a
//! filler process holds memory so that the working set sits in the middle of the
//! yellow zone, and an elastic process built on the Python SDK (`sdk/python`) answers
//! each low with a `reclaimed` report of 12 MiB it frees, then grows them back within
//! 100 ms (evict, regrow, evict: the storm's cache). Each fall and regrowth crosses
//! one of the usage thresholds the agent registers every M3 step (2 % of top), so
//! event-triggered polls run between the ticks: the test checks that they did. Each
//! of those polls would re-send low to a process that has answered, as before rule R8
//! (1,109 lows in 67 s).
//!
//! Asserted: the zone was yellow at every look; event-triggered polls ran; the
//! process received lows (liveness) and every low it received is one the agent
//! logged; consecutive lows were sent at polls at least one poll period apart
//! (`poll_at_ms` of the `notify` events: the poll's own clock, so the check does not
//! depend on how fast the machine delivers them); the process received at most one
//! low per poll period over the minute.
//!
//! Needs root, the cgroup v1 memory controller and python3. Every wait is bounded;
//! nothing depends on the machine's speed.

mod common;

use common::agent::AgentCommand;

use common::{agent_status, wait_for};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const POLL_MS: u64 = 1000;

/// Holds as many MiB as the file `argv[1]` says, re-read every 100 ms, and writes
/// how many it holds to `argv[1].held` once it holds them.
const FILLER: &str = r#"
import os, sys, time
MB = 1 << 20
chunks = []
held = -1
while True:
    try:
        with open(sys.argv[1]) as f:
            n = int(f.read().strip())
    except Exception:
        n = len(chunks)
    while len(chunks) < n:
        b = bytearray(MB)
        for i in range(0, MB, 4096):
            b[i] = 1
        chunks.append(b)
    del chunks[n:]
    if held != len(chunks):
        held = len(chunks)
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(held))
        os.rename(sys.argv[1] + ".tmp", sys.argv[1] + ".held")
    time.sleep(0.1)
"#;

/// The elastic process on the Python SDK: holds `hold` MiB, gives back `give` MiB on
/// each notification and grows back to `hold` within 100 ms. Prints `registered`,
/// then `<level> <seq> <monotonic s>` for every notification it receives.
const ELASTIC: &str = r#"
import sys, threading, time
import memcolo
sock, hold, give = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
MB = 1 << 20
chunks = []
lock = threading.Lock()
def fill():
    with lock:
        while len(chunks) < hold:
            b = bytearray(MB)
            for i in range(0, MB, 4096):
                b[i] = 1
            chunks.append(b)
fill()
client = memcolo.Client(name="e2e-manners", socket_path=sock, expected_reclaim_bytes=give * MB)
def answer(note):
    with lock:
        del chunks[len(chunks) - give:]
    print(note.level, note.seq, time.monotonic(), flush=True)
    return give * MB
for level in ("low", "high", "top"):
    client.on(level, answer)
client.start()
if not client.wait_registered(60):
    sys.exit("not registered")
print("registered", flush=True)
while True:
    time.sleep(0.1)
    fill()
"#;

fn events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `memcolo_polls_total{trigger="event"}` from the agent's metrics endpoint.
fn event_polls(addr: &str) -> u64 {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.lines()
        .find(|l| l.starts_with("memcolo_polls_total{trigger=\"event\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

fn python() -> &'static str {
    ["python3", "/usr/bin/python3"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .arg("-c")
                .arg("pass")
                .status()
                .is_ok_and(|s| s.success())
        })
        .expect("python3 is needed for the SDK process")
}

/// Starts `script` under python in the scope's cgroup (it joins before exec).
fn spawn_in(scope: &Path, python: &str, script: &str, args: &[String]) -> Child {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk/python");
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec {python} -u -c \"$0\" \"$@\"",
            scope.display()
        ))
        .arg(script)
        .args(args)
        .env("PYTHONPATH", sdk)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn sixty_seconds_in_yellow_give_at_most_one_low_per_poll_period() {
    common::require_root();
    let own = common::own_v1_memory_cgroup();
    let python = python();
    let exe = env!("CARGO_BIN_EXE_memcolo");
    let tmp = tempfile::tempdir().unwrap();
    let scope = own.join(format!("memcolo-manners-{}", std::process::id()));
    std::fs::create_dir(&scope).unwrap();
    let mut guard = common::Cleanup::new(&scope, &[]);
    std::fs::write(
        scope.join("memory.limit_in_bytes"),
        format!("{}", 512 * MIB),
    )
    .unwrap();

    let config = tmp.path().join("agent.toml");
    std::fs::write(
        &config,
        "[m3]\nratio_target = [0, 1]\nkill_after_s = 3600\n\n[hermes]\nenabled = false\n",
    )
    .unwrap();
    let metrics_addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    // M3's notifications alone: Hermit reclaim (on by default) would take the filler's
    // memory and move the node out of the yellow zone under the test.
    let agent = AgentCommand::new(exe, tmp.path())
        .args(["--no-reclaim", "--poll-ms", &POLL_MS.to_string()])
        .config(&config)
        .metrics(&metrics_addr)
        .scope(&scope)
        .start();
    let (sock, ev) = (agent.socket.clone(), agent.event_log.clone());
    let status = || agent_status(exe, &sock);
    let th = status()["thresholds"].clone();
    let (low, high) = (
        th["low_bytes"].as_u64().unwrap(),
        th["high_bytes"].as_u64().unwrap(),
    );
    let give_mib = 12u64;
    assert!(
        high - low >= 3 * give_mib * MIB,
        "yellow zone {low}..{high} too narrow for the test"
    );

    let fill_file = tmp.path().join("filler-mib");
    std::fs::write(&fill_file, "0").unwrap();
    let filler = spawn_in(&scope, python, FILLER, &[fill_file.display().to_string()]);
    guard.children.push(filler);
    let mut elastic = spawn_in(
        &scope,
        python,
        ELASTIC,
        &[
            sock.display().to_string(),
            "64".to_string(),
            give_mib.to_string(),
        ],
    );
    let out = BufReader::new(elastic.stdout.take().unwrap());
    guard.children.push(elastic);
    let (line_tx, line_rx) = std::sync::mpsc::channel::<(Instant, String)>();
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            let _ = line_tx.send((Instant::now(), l));
        }
    });
    let (_, first) = line_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the SDK process registered");
    assert_eq!(first, "registered");
    let pid = {
        let s = status();
        s["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "e2e-manners")
            .expect("the SDK process in status")["pid"]
            .as_i64()
            .unwrap()
    };

    // Bring the working set to the middle of yellow with the filler. Each step waits
    // until the filler holds what it was told and a poll has seen it, however slow
    // the machine.
    let mid = (low + high) / 2;
    let held_file = PathBuf::from(format!("{}.held", fill_file.display()));
    let mut filler_mib: i64 = 0;
    let mut close = 0;
    wait_for(
        "the working set in the middle of yellow",
        Duration::from_secs(180),
        || {
            wait_for(
                "the filler to hold its target",
                Duration::from_secs(60),
                || {
                    std::fs::read_to_string(&held_file)
                        .ok()
                        .and_then(|t| t.trim().parse::<i64>().ok())
                        == Some(filler_mib)
                },
            );
            std::thread::sleep(Duration::from_millis(2 * POLL_MS));
            let ws = status()["memory"]["working_set_bytes"].as_u64().unwrap() as i64;
            let off = (mid as i64 - ws) / MIB as i64;
            if off.abs() <= 4 {
                close += 1;
            } else {
                close = 0;
                filler_mib = (filler_mib + off).max(0);
                std::fs::write(&fill_file, filler_mib.to_string()).unwrap();
            }
            close >= 3
        },
    );

    // The minute in yellow.
    while line_rx.try_recv().is_ok() {}
    let polls_before = event_polls(&metrics_addr);
    let start_events = events(&ev).len();
    let t0 = Instant::now();
    let mut zones = vec![];
    let mut received: Vec<(Instant, String, u64)> = vec![];
    while t0.elapsed() < Duration::from_secs(60) {
        while let Ok((at, l)) = line_rx.try_recv() {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() == 3 {
                received.push((at, f[0].to_string(), f[1].parse().unwrap()));
            }
        }
        zones.push(status()["zone"].as_str().unwrap().to_string());
        std::thread::sleep(Duration::from_millis(500));
    }
    let window = t0.elapsed();
    let event_polls = event_polls(&metrics_addr) - polls_before;
    // Answers already in flight arrive within the bounded wait below.
    std::thread::sleep(Duration::from_millis(500));
    while let Ok((at, l)) = line_rx.try_recv() {
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() == 3 && at.duration_since(t0) <= window {
            received.push((at, f[0].to_string(), f[1].parse().unwrap()));
        }
    }

    let log: Vec<Value> = events(&ev).into_iter().skip(start_events).collect();
    let sent_lows: Vec<(u64, u64)> = log
        .iter()
        .filter(|e| e["event"] == "notify" && e["pid"] == pid && e["level"] == "low")
        .map(|e| {
            (
                e["seq"].as_u64().unwrap(),
                e["poll_at_ms"].as_u64().unwrap(),
            )
        })
        .collect();
    let lows: Vec<&(Instant, String, u64)> =
        received.iter().filter(|(_, l, _)| l == "low").collect();
    let summary = format!(
        "{} lows received in {:.1} s, {} event-triggered polls, zones {:?}, low send times (ms) {:?}",
        lows.len(),
        window.as_secs_f64(),
        event_polls,
        zones,
        sent_lows.iter().map(|(_, at)| at).collect::<Vec<_>>()
    );

    assert!(
        zones.iter().all(|z| z == "yellow"),
        "not held in yellow: {summary}"
    );
    assert!(
        event_polls >= 20,
        "too few event-triggered polls to test anything: {summary}"
    );
    assert!(lows.len() >= 10, "too few lows received: {summary}");
    for (_, _, seq) in &lows {
        assert!(
            sent_lows.iter().any(|(s, _)| s == seq),
            "low {seq} received but not logged: {summary}"
        );
    }
    // The agent's send times: one poll period at least between two lows.
    for w in sent_lows.windows(2) {
        assert!(
            w[1].1 - w[0].1 >= POLL_MS,
            "two lows {} ms apart (seq {} and {}): {summary}",
            w[1].1 - w[0].1,
            w[0].0,
            w[1].0
        );
    }
    // The process's own count: at most one low per poll period of the minute.
    let periods = window.as_millis() as u64 / POLL_MS + 1;
    assert!(
        lows.len() as u64 <= periods,
        "{} lows in {periods} poll periods: {summary}",
        lows.len()
    );
    drop(agent);
    drop(guard);
}
