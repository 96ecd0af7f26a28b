//! cgroup v2's mechanisms in the agent, on the real kernel: `memcolo agent` manages a
//! 256 MiB v2 scope holding an LC process and a BE job that grows into the red zone.
//!
//! Asserts that (1) the BE group's `memory.high` is capped (`m3.be_memory_high`) and
//! the LC group's is not, (2) the kernel throttles the job against it and the agent's
//! `/metrics` counts it (`memcolo_cgroup_memory_events_total{group="be",event="high"}`,
//! `memcolo_be_memory_high_groups`), with the scope's own events present, and (3) once
//! the job is gone and the scope is green again, the previous `memory.high` (`max`)
//! is back.
//!
//! Needs root and a cgroup v2 memory controller: it runs in the guest of
//! `scripts/v2bed/` (`make test-v2`); elsewhere it fails saying so. Every wait is
//! bounded; nothing depends on the machine's speed.

mod common;

use common::agent::AgentCommand;
use common::{agent_status, wait_for};
use memcolo_linux::cgroup::{CgroupVersion, Limit};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// The BE job: 1 MiB more every 10 ms up to 240 MiB, then it holds.
const GROW: &str = r#"
import time
chunks = []
for _ in range(240):
    b = bytearray(1 << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    chunks.append(b)
    time.sleep(0.01)
time.sleep(600)
"#;

fn high(group: &Path) -> String {
    std::fs::read_to_string(group.join("memory.high"))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
#[ignore = "needs a cgroup v2 memory controller: runs in the guest of scripts/v2bed (make test-v2)"]
fn red_zone_caps_a_real_be_groups_memory_high_and_green_restores_it() {
    let test = "red_zone_caps_a_real_be_groups_memory_high_and_green_restores_it";
    common::require_root();
    let own = memcolo_testkit::own_memory_cgroup();
    if own.version() != CgroupVersion::V2 {
        common::cannot_run(test, "the memory controller is cgroup v1 here");
        return;
    }
    let exe = env!("CARGO_BIN_EXE_memcolo");
    let tmp = tempfile::tempdir().unwrap();
    let scope_cg = own
        .create_child(&format!("memcolo-high-{}", std::process::id()))
        .unwrap();
    let scope = scope_cg.path().to_path_buf();
    let mut guard = common::Cleanup::new(&scope, &["lc", "be"]);
    scope_cg.write_limit(Limit::Bytes(256 * MIB)).unwrap();
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    // M3's default thresholds for 256 MiB: top 248 MiB, high 220 MiB, low 200 MiB.
    let agent = AgentCommand::new(exe, tmp.path())
        .args(["--no-reclaim", "--poll-ms", "200", "--kill-after-s", "3600"])
        .metrics(&addr)
        .scope(&scope)
        .start();
    let sock = agent.socket.clone();
    let lc = Command::new(exe)
        .args(["run", "--class", "lc", "--cgroup", "lc", "--socket"])
        .arg(&sock)
        .args(["--", "sleep", "600"])
        .spawn()
        .unwrap();
    guard.children.push(lc);
    let be = Command::new(exe)
        .args(["run", "--class", "be", "--cgroup", "be", "--socket"])
        .arg(&sock)
        .args(["--", "python3", "-c", GROW])
        .spawn()
        .unwrap();
    guard.children.push(be);
    let (lc_group, be_group) = (scope.join("lc"), scope.join("be"));

    wait_for(
        "the BE group's memory.high capped in the red zone",
        Duration::from_secs(300),
        || be_group.exists() && high(&be_group) != "max",
    );
    let cap: u64 = high(&be_group).parse().unwrap();
    assert!(
        (150 * MIB..=256 * MIB).contains(&cap),
        "capped at the group's usage on entering red: {cap}"
    );
    assert_eq!(high(&lc_group), "max", "the LC group is never capped");
    let be_high = "memcolo_cgroup_memory_events_total{event=\"high\",group=\"be\"}";
    wait_for(
        "the kernel's throttling of the BE group counted in /metrics",
        Duration::from_secs(300),
        || common::metrics_series(&common::agent_metrics(&addr), be_high).is_some_and(|v| v > 0.0),
    );
    let m = common::agent_metrics(&addr);
    assert_eq!(
        common::metrics_series(&m, "memcolo_be_memory_high_groups"),
        Some(1.0),
        "{m}"
    );
    for e in ["low", "high", "max", "oom", "oom_kill"] {
        let key = format!("memcolo_cgroup_memory_events_total{{event=\"{e}\",group=\"scope\"}}");
        assert!(
            common::metrics_series(&m, &key).is_some(),
            "{key} missing: {m}"
        );
    }
    assert_eq!(
        common::metrics_series(
            &m,
            "memcolo_cgroup_memory_events_total{event=\"oom_kill\",group=\"lc\"}"
        ),
        Some(0.0),
        "{m}"
    );

    // The job goes: the scope is green again and the cap is lifted.
    for c in guard.children.iter_mut().skip(1) {
        let _ = c.kill();
        let _ = c.wait();
    }
    for pid in std::fs::read_to_string(be_group.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
    {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    wait_for(
        "memory.high restored once the scope is green",
        Duration::from_secs(120),
        || high(&be_group) == "max",
    );
    let s = agent_status(exe, &sock);
    assert_eq!(s["counters"]["kills"], 0, "capped, never killed: {s}");
}
