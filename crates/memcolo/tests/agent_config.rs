//! `memcolo agent`'s settings from the command line: `--print-config` with an empty
//! file is the defaults and every field it prints is in `dist/agent.toml`; the
//! mechanism switches (`--advice`, `--reclaim`, `--tier` and their `--no-`) apply on
//! top of the file, the last one given winning; `--help` names the five mechanisms;
//! a running agent names its mechanisms in its log and in `status`.
//!
//! The last test needs root (the agent's socket and state live in a temporary
//! directory).

mod common;

use common::agent::{Agent, AgentCommand};
use memcolo_agent::config::AgentConfig;
use memcolo_agent::mechanisms::Mechanisms;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_memcolo");

/// `memcolo agent --config <empty file> ARGS --print-config`, parsed.
fn print_config(args: &[&str]) -> (String, AgentConfig) {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("agent.toml");
    std::fs::write(&empty, "").unwrap();
    let out = Command::new(EXE)
        .arg("agent")
        .arg("--config")
        .arg(&empty)
        .args(args)
        .arg("--print-config")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let cfg = toml::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}\n{text}"));
    (text, cfg)
}

#[test]
fn print_config_is_the_defaults_and_the_example_file_names_every_field_it_prints() {
    let (text, cfg) = print_config(&[]);
    assert_eq!(cfg, AgentConfig::default());
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/agent.toml"),
    )
    .unwrap();
    // Section by section: `name = ...` printed under `[s]` is `#name = ...` under
    // `[s]` in the example.
    let sections = |t: &str| -> Vec<(String, String)> {
        let mut sec = String::new();
        let mut out = Vec::new();
        for l in t.lines() {
            let l = l.trim_start_matches('#');
            if let Some(s) = l.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
                sec = s.to_string();
            } else if let Some((k, _)) = l.split_once(" = ") {
                if k.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    out.push((sec.clone(), k.to_string()));
                }
            }
        }
        out
    };
    let shown = sections(&example);
    let missing: Vec<_> = sections(&text)
        .into_iter()
        .filter(|f| !shown.contains(f))
        .collect();
    assert!(missing.is_empty(), "not in dist/agent.toml: {missing:?}");
}

#[test]
fn mechanism_switches_apply_on_top_of_the_file_and_the_last_wins() {
    let (_, d) = print_config(&[]);
    assert!(d.hermes.enabled && d.tier.enabled && d.reclaim.enabled);
    let (_, c) = print_config(&["--no-advice", "--reclaim", "--no-tier"]);
    assert!(!c.hermes.enabled && c.reclaim.enabled && !c.tier.enabled);
    let (_, c) = print_config(&["--no-tier", "--tier", "--reclaim", "--no-reclaim"]);
    assert!(c.tier.enabled && !c.reclaim.enabled);
    // Over a file that says otherwise.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("agent.toml");
    std::fs::write(&f, "[tier]\nenabled = false\n[hermes]\nenabled = false\n").unwrap();
    let out = Command::new(EXE)
        .args(["agent", "--config"])
        .arg(&f)
        .args(["--tier", "--print-config"])
        .output()
        .unwrap();
    let c: AgentConfig = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert!(c.tier.enabled && !c.hermes.enabled);
}

#[test]
fn agent_help_names_the_five_mechanisms_and_their_defaults() {
    let out = Command::new(EXE)
        .args(["agent", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for w in [
        "M3 monitor (always on)",
        "Hermes file-cache advice (on; --no-advice",
        "Hermit reclaim (on; --no-reclaim",
        "MaxMem tiering (on; --no-tier",
        "Allocator (libmemcolo",
        "LD_PRELOAD",
        "--no-reclaim",
        "--no-advice",
        "--tier",
    ] {
        assert!(help.contains(w), "`{w}` not in:\n{help}");
    }
}

/// Starts an agent with `args` in `dir`; returns it once its socket answers.
fn start_agent(dir: &Path, args: &[&str]) -> Agent {
    start_agent_with(dir, Path::new("/dev/null"), args)
}

/// Starts an agent with the file `config` and `args` in `dir`, its log in
/// `dir/agent.log`.
fn start_agent_with(dir: &Path, config: &Path, args: &[&str]) -> Agent {
    let log = std::fs::File::create(dir.join("agent.log")).unwrap();
    AgentCommand::new(EXE, dir)
        .config(config)
        .args(args)
        .log("info")
        .stderr(log)
        .start()
}

#[test]
fn a_running_agent_names_its_mechanisms_in_its_log_and_status() {
    common::require_root();
    // Defaults: every mechanism on; tier.sock beside agent.sock.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let agent = start_agent(dir.path(), &[]);
    let st = common::agent_status(EXE, &sock);
    let tier_sock = dir.path().join("tier.sock").exists();
    let text = Command::new(EXE)
        .args(["status", "--socket"])
        .arg(&sock)
        .output()
        .unwrap();
    drop(agent);
    assert_eq!(
        st["mechanisms"],
        serde_json::json!({"m3": true, "advice": true, "reclaim": true, "tier": true}),
        "{st}"
    );
    assert_eq!(st["mechanisms_off"], serde_json::json!({}));
    assert!(tier_sock, "no tier.sock beside the agent's socket");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines()
            .take(3)
            .any(|l| l == "mechanisms: m3 on  advice on  reclaim on  tier on"),
        "{text}"
    );
    let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("mechanisms: "))
        .unwrap_or_else(|| panic!("no mechanisms line in the log:\n{log}"));
    // every mechanism on, as the agent's own summary of the defaults says
    // (mechanisms.rs tests what that summary names)
    let want = Mechanisms::from_config(&AgentConfig::default()).summary();
    assert!(line.contains(&want), "{line}\nwanted {want}");

    // Switched off from the command line: no tier.sock, and status says why.
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let agent = start_agent(dir.path(), &["--no-tier", "--no-advice", "--no-reclaim"]);
    let st = common::agent_status(EXE, &sock);
    let tier_sock = dir.path().join("tier.sock").exists();
    drop(agent);
    assert_eq!(
        st["mechanisms"],
        serde_json::json!({"m3": true, "advice": false, "reclaim": false, "tier": false})
    );
    assert_eq!(st["mechanisms_off"]["tier"], "tier.enabled = false");
    assert_eq!(st["mechanisms_off"]["advice"], "hermes.enabled = false");
    assert_eq!(st["mechanisms_off"]["reclaim"], "reclaim.enabled = false");
    assert!(!tier_sock, "tier.sock served with --no-tier");
}

/// Voluntary context switches of the agent's thread named `comm` so far, once it
/// exists: the agent's socket answers before its tier service has started (waits at
/// most 30 s).
fn thread_switches(pid: u32, comm: &str) -> u64 {
    let mut n = None;
    common::wait_for(
        &format!("the agent's {comm} thread"),
        Duration::from_secs(30),
        || {
            n = thread_switches_now(pid, comm);
            n.is_some()
        },
    );
    n.unwrap()
}

fn thread_switches_now(pid: u32, comm: &str) -> Option<u64> {
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(t) = t else { continue };
        let t = t.path();
        if std::fs::read_to_string(t.join("comm"))
            .unwrap_or_default()
            .trim()
            != comm
        {
            continue;
        }
        let status = std::fs::read_to_string(t.join("status")).ok()?;
        return Some(
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("voluntary_ctxt_switches"),
        );
    }
    None
}

#[test]
fn idle_tiering_sleeps_until_a_region_arrives() {
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(dir.path(), &["--tier"]);
    let pid = agent.pid() as u32;
    let before = thread_switches(pid, "tier-policy");
    std::thread::sleep(Duration::from_secs(2));
    let after = thread_switches(pid, "tier-policy");
    drop(agent);
    // It looks for a region every 200 ms: about 10 wake-ups in 2 s. Waking at every
    // 10 ms sampling slot with no region to sample would be about 200; a slower or
    // busier machine only wakes it less.
    assert!(
        after - before <= 40,
        "the idle tiering policy thread woke {} times in 2 s",
        after - before
    );
}

#[test]
fn tiering_that_cannot_start_leaves_the_agent_running_and_says_why() {
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    // A socket below a file: it cannot be bound.
    let blocker = dir.path().join("not-a-directory");
    std::fs::write(&blocker, "").unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        format!("[tier]\nsocket = \"{}/tier.sock\"\n", blocker.display()),
    )
    .unwrap();
    let agent = start_agent_with(dir.path(), &cfg, &[]);
    let st = common::agent_status(EXE, &dir.path().join("agent.sock"));
    drop(agent);
    assert_eq!(st["mechanisms"]["tier"], false, "{st}");
    assert_eq!(st["mechanisms"]["m3"], true, "{st}");
    let why = st["mechanisms_off"]["tier"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("cannot start: ") && why.contains("not-a-directory"),
        "{st}"
    );
}

/// `GET /healthz` on the metrics address answers 200 while the main loop polls, and
/// the last poll's time is on `/metrics` (what a liveness probe and an alert read).
#[test]
fn healthz_answers_while_the_main_loop_polls() {
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let _agent = AgentCommand::new(EXE, dir.path()).metrics(&addr).start();
    let get = |path: &str| common::agent_http_get(&addr, path, Duration::from_secs(10));
    let h = get("/healthz");
    assert!(h.starts_with("HTTP/1.1 200"), "{h}");
    assert!(h.ends_with("ok\n"), "{h}");
    // The first poll may still be on its way: a bounded wait.
    let polled = || {
        get("/metrics")
            .lines()
            .any(|l| l.starts_with("memcolo_last_poll_timestamp_seconds ") && !l.ends_with(" 0"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !polled() {
        assert!(
            std::time::Instant::now() < deadline,
            "no poll time on /metrics"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
