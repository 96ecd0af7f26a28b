//! Helpers shared by the CLI's end-to-end tests against a real agent.

#![allow(dead_code)]

pub mod agent;

use serde_json::Value;
use std::path::Path;
use std::process::Command;

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

/// The helpers for tests on the real kernel, shared by every crate's tests.
#[allow(unused_imports)]
pub use memcolo_testkit::{
    cannot_run, empty_and_remove_cgroup, own_v1_memory_cgroup, require_root, wait_for,
};
