//! The end-to-end tests' agent guard (`common::agent::Agent`): a test that panics
//! while its agent runs leaves no agent behind, and `terminate` stops it cleanly.
//!
//! Needs root (as every test that starts an agent).

mod common;

use common::agent::AgentCommand;
use memcolo_linux::pidfd::{pidfd_exited, pidfd_open};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_memcolo");

#[test]
fn a_panicking_test_leaves_no_agent_behind() {
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    // A pidfd of the agent taken while it runs: it tells the agent's exit apart from
    // a later process that reuses the pid.
    let watched: Mutex<Option<OwnedFd>> = Mutex::new(None);
    let outcome = std::panic::catch_unwind(|| {
        let agent = AgentCommand::new(EXE, dir.path()).start();
        let fd = pidfd_open(agent.pid()).unwrap();
        assert!(!pidfd_exited(fd.as_fd()).unwrap(), "the agent runs");
        *watched.lock().unwrap() = Some(fd);
        panic!("a test fails while its agent runs");
    });
    assert!(outcome.is_err());
    let fd = watched.lock().unwrap().take().expect("the agent started");
    // The guard killed and reaped it while the panic unwound.
    assert!(
        pidfd_exited(fd.as_fd()).unwrap(),
        "the agent outlived its test"
    );
}

#[test]
fn terminate_stops_the_agent_with_sigterm() {
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentCommand::new(EXE, dir.path()).start();
    let fd = pidfd_open(agent.pid()).unwrap();
    let status = agent
        .terminate(Duration::from_secs(60))
        .expect("the agent stops within 60 s of SIGTERM");
    assert!(status.success(), "agent exit: {status}");
    assert!(pidfd_exited(fd.as_fd()).unwrap());
    // Stopped already: nothing left for the guard to do.
    assert!(agent.terminate(Duration::from_secs(1)).is_none());
}
