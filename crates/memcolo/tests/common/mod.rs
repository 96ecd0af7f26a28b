//! Helpers shared by the CLI's end-to-end tests against a real agent.

#![allow(dead_code)]

pub mod agent;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// On every exit path of a test: kills `children`, then empties and removes the
/// scratch group `scope` with its sub-groups `subs`, and deletes `files`.
pub struct Cleanup {
    pub scope: PathBuf,
    pub subs: &'static [&'static str],
    pub children: Vec<Child>,
    pub files: Vec<PathBuf>,
}

impl Cleanup {
    /// A guard for `scope` (and its sub-groups `subs`), with nothing else yet.
    pub fn new(scope: &Path, subs: &'static [&'static str]) -> Cleanup {
        Cleanup {
            scope: scope.to_path_buf(),
            subs,
            children: vec![],
            files: vec![],
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        empty_and_remove_cgroup(&self.scope, self.subs);
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
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

/// `GET path` from the agent's HTTP listener at `addr` (plain HTTP/1.1), the whole
/// response, each read waiting at most `timeout`.
#[allow(dead_code)]
pub fn agent_http_get(addr: &str, path: &str, timeout: std::time::Duration) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(timeout)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// The agent's `GET /metrics` at `addr`, the whole response.
#[allow(dead_code)]
pub fn agent_metrics(addr: &str) -> String {
    agent_http_get(addr, "/metrics", std::time::Duration::from_secs(30))
}

/// The value of the series `name_and_labels` (its name, with its labels if any) in
/// exposition text, if the text has it.
#[allow(dead_code)]
pub fn metrics_series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name_and_labels)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The helpers for tests on the real kernel, shared by every crate's tests.
#[allow(unused_imports)]
pub use memcolo_testkit::{
    cannot_run, empty_and_remove_cgroup, own_v1_memory_cgroup, require_root, wait_for,
};
