//! Helpers shared by the CLI's end-to-end tests against a real agent.

use serde_json::Value;
use std::path::Path;
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
