//! Helpers shared by the CLI's end-to-end tests against a real agent.

#![allow(dead_code)]

pub mod agent;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Polls `f` every 100 ms until it holds; panics naming `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < limit,
            "timed out after {limit:?} waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `memcolo status --json` of the agent at `sock`, parsed; panics if the command fails.
#[allow(dead_code)]
pub fn agent_status(exe: &str, sock: &Path) -> Value {
    let o = Command::new(exe)
        .args(["status", "--json", "--socket"])
        .arg(sock)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// This process's own cgroup v1 memory directory, below which the tests make their
/// scratch groups; panics saying why when there is none (such a test cannot run).
#[allow(dead_code)]
pub fn own_v1_memory_cgroup() -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let rel = text
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
            ctrl.split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })
        .expect("this test needs the cgroup v1 memory controller");
    let p = Path::new("/sys/fs/cgroup/memory").join(rel.trim_start_matches('/'));
    assert!(
        p.join("memory.limit_in_bytes").exists(),
        "no cgroup v1 memory directory at {}: this test needs the cgroup v1 memory controller",
        p.display()
    );
    p
}

/// Panics unless the test runs as root (it makes cgroups, drops to other uids, or
/// attacks the agent as other users).
#[allow(dead_code)]
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: run it as root"
    );
}

/// Kills every process in the scratch memory cgroup `dir` and in its child groups
/// `subs` (retrying for up to 5 s while they die), then removes the child groups and
/// `dir`. For the tests' cleanup on every exit path; errors are ignored.
#[allow(dead_code)]
pub fn empty_and_remove_cgroup(dir: &Path, subs: &[&str]) {
    for _ in 0..50 {
        let mut pids: Vec<i32> = vec![];
        for sub in std::iter::once("").chain(subs.iter().copied()) {
            if let Ok(t) = std::fs::read_to_string(dir.join(sub).join("cgroup.procs")) {
                pids.extend(t.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        if pids.is_empty() {
            break;
        }
        for p in pids {
            // SAFETY: kill takes no pointers.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for sub in subs {
        let _ = std::fs::remove_dir(dir.join(sub));
    }
    let _ = std::fs::remove_dir(dir);
}

/// A test that cannot run here (no root, no cgroup v1, a missing tool or kernel
/// feature) fails saying why, unless the run asks on purpose to skip such tests with
/// `MEMCOLO_TEST_ALLOW_SKIP=1`; then it says it skipped. A run without root can thus
/// never be mistaken for a full pass.
#[allow(dead_code)]
pub fn cannot_run(test: &str, why: &str) {
    if std::env::var_os("MEMCOLO_TEST_ALLOW_SKIP").is_some_and(|v| v == "1") {
        eprintln!("{test}: skipped on purpose (MEMCOLO_TEST_ALLOW_SKIP=1): {why}");
    } else {
        panic!("{test} cannot run here: {why} (MEMCOLO_TEST_ALLOW_SKIP=1 skips it on purpose)");
    }
}
