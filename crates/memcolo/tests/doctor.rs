//! `memcolo doctor` on this machine: every check is reported, the readings match
//! what the test suite's machine is known to have (a cgroup v1 memory controller,
//! PSI and its triggers, userfaultfd with the features tiering uses,
//! pidfds and `process_madvise`), every mechanism has a verdict, and the exit status
//! follows them.
//!
//! Needs root (the agent's view: PSI trigger windows and userfaultfd depend on it).

mod common;

use serde_json::Value;
use std::process::Command;

fn doctor(extra: &[&str]) -> (Value, i32) {
    let out = Command::new(env!("CARGO_BIN_EXE_memcolo"))
        .arg("doctor")
        .arg("--json")
        .args(extra)
        .output()
        .expect("run memcolo doctor");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (json, out.status.code().expect("doctor exited by a signal"))
}

fn check<'a>(json: &'a Value, name: &str) -> &'a Value {
    json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {json}"))
}

#[test]
fn doctor_reports_every_check_and_this_machines_known_facts() {
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, "").unwrap(); // the defaults, whatever /etc holds
    let (json, code) = doctor(&["--config", cfg.to_str().unwrap()]);
    let names: Vec<&str> = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, memcolo_linux_check_names(), "{json}");
    for c in json["checks"].as_array().unwrap() {
        assert!(
            ["ok", "warn", "fail"].contains(&c["status"].as_str().unwrap()),
            "{c}"
        );
        assert!(!c["reading"].as_str().unwrap().is_empty(), "{c}");
    }
    let cg = check(&json, "cgroup");
    assert_eq!(cg["status"], "ok", "{cg}");
    assert!(
        cg["reading"]
            .as_str()
            .unwrap()
            .contains("v1 memory controller at /sys/fs/cgroup/memory"),
        "{cg}"
    );
    // PSI triggers work; their windows depend on CAP_SYS_RESOURCE, which this
    // machine's root lacks (2 s multiples only): ok or warn, never fail.
    assert_ne!(check(&json, "psi_trigger")["status"], "fail");
    for name in [
        "psi",
        "userfaultfd",
        "pidfd_open",
        "pidfd_getfd",
        "process_madvise",
        "user",
    ] {
        assert_eq!(check(&json, name)["status"], "ok", "{}", check(&json, name));
    }
    let mechs: Vec<&str> = json["mechanisms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(mechs, ["m3", "hermes", "reclaim", "tier", "libmemcolo"]);
    for m in json["mechanisms"].as_array().unwrap() {
        assert_eq!(m["can_run"], true, "{m}");
    }
    assert_eq!(json["ready"], true);
    assert_eq!(code, 0);
}

#[test]
fn doctor_exits_2_on_a_configuration_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, "no_such_setting = 1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memcolo"))
        .args(["doctor", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("agent.toml"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The check names in the order the probe module lists them.
fn memcolo_linux_check_names() -> Vec<&'static str> {
    memcolo_linux::probe::CHECK_NAMES.to_vec()
}
