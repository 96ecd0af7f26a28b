//! A process registered with an agent whose scope is a memory cgroup, but living
//! outside that cgroup, is registered with a warning and marked `in_scope: false` in
//! `status` (its memory is not the scope's, so M3's thresholds do not see it); one
//! inside is not marked.
//!
//! Needs root and a memory cgroup, v1 or v2 (fails saying so otherwise); runs in the
//! cgroup v2 guest too (`scripts/v2bed/tests`).

mod common;

use common::agent::AgentCommand;
use common::agent_status;
use std::path::Path;
use std::process::{Command, Stdio};

fn register(exe: &str, sock: &Path, pid: u32) {
    let o = Command::new(exe)
        .args(["register", "--socket"])
        .arg(sock)
        .args(["--pid", &pid.to_string(), "--class", "be"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "register {pid}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_process_outside_a_cgroup_scope_is_marked() {
    common::require_root();
    let exe = env!("CARGO_BIN_EXE_memcolo");
    let scope_cg = memcolo_testkit::own_memory_cgroup()
        .create_child(&format!("memcolo-scope-{}", std::process::id()))
        .unwrap();
    let scope = scope_cg.path().to_path_buf();
    scope_cg
        .write_limit(memcolo_linux::cgroup::Limit::Bytes(256 << 20))
        .unwrap();
    let mut clean = common::Cleanup::new(&scope, &[]);
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentCommand::new(exe, dir.path())
        .scope(&scope)
        .stderr(Stdio::null())
        .start();
    let (sock, events) = (agent.socket.clone(), agent.event_log.clone());
    let inside = Command::new("sleep").arg("600").spawn().unwrap();
    std::fs::write(scope.join("cgroup.procs"), inside.id().to_string()).unwrap();
    let outside = Command::new("sleep").arg("600").spawn().unwrap();
    let (i, o) = (inside.id(), outside.id());
    clean.children.push(inside);
    clean.children.push(outside);
    register(exe, &sock, i);
    register(exe, &sock, o);
    let st = agent_status(exe, &sock);
    let mark = |pid: u32| {
        st["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid)
            .map(|p| p["in_scope"].clone())
    };
    assert_eq!(mark(i), Some(serde_json::json!(true)), "{st}");
    assert_eq!(mark(o), Some(serde_json::json!(false)), "{st}");
    let warned = std::fs::read_to_string(&events)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|e| e["event"] == "outside_scope" && e["pid"] == o);
    assert!(warned, "no outside_scope event for pid {o}");
    // The agent's stop kills nothing in the scope: the sleeps are removed by Cleanup.
    drop(agent);
    for c in &mut clean.children {
        let _ = c.kill();
        let _ = c.wait();
    }
    clean.children.clear();
}
