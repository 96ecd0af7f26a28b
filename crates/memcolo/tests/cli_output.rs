//! What the `memcolo` commands write for people and pipelines: `memcolo status`
//! into a pipe whose reader is gone ends quietly (no panic), and the agent's log has
//! no terminal colour codes when it goes to a file; an error names its subject once.
//!
//! Needs root (the agent's socket and state live in a temporary directory).

mod common;

use common::agent::AgentCommand;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

#[test]
fn status_into_a_closed_pipe_ends_quietly_and_the_agent_log_has_no_colour_codes() {
    common::require_root();
    let exe = env!("CARGO_BIN_EXE_memcolo");
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
    let agent = AgentCommand::new(exe, dir.path())
        .log("info")
        .stderr(log)
        .start();
    let sock = agent.socket.clone();
    // A pipe whose read end is closed before `status` writes: every write fails.
    let (rd, wr) = nix::unistd::pipe().unwrap();
    drop(rd);
    let stdout = Stdio::from(wr);
    let out = Command::new(exe)
        .args(["status", "--socket"])
        .arg(&sock)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    drop(agent);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "status panicked: {err}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "status ended with {:?}: {err}",
        out.status
    );
    let text = std::fs::read(dir.path().join("agent.log")).unwrap();
    assert!(!text.is_empty(), "the agent logged nothing");
    assert!(
        !text.contains(&0x1b),
        "terminal colour codes in a log file: {}",
        String::from_utf8_lossy(&text)
    );
}

#[test]
fn a_bad_scope_is_named_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memcolo"))
        .args(["agent", "--scope", "bogus", "--socket"])
        .arg(dir.path().join("agent.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--metrics-addr", "off"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("scope `bogus`").count(), 1, "{err}");
}
