//! `memcolo agent` as a child process of a test: one way to start it, and a guard
//! that kills it when the test ends, also when the test panics, so a failing test
//! never leaves an agent running (holding its scratch cgroup, socket and threads).

use super::wait_for;
use std::ffi::OsStr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a started agent may take to accept connections on its socket. Generous:
/// an agent binds its socket within milliseconds; the bound only keeps a broken start
/// from hanging the test.
pub const AGENT_START_LIMIT: Duration = Duration::from_secs(60);

/// A `memcolo agent` command line being built. Its socket (`agent.sock`), state
/// directory (`state`) and event log (`events.jsonl`) live in the test's directory
/// `dir`; metrics are off, the log level is `warn` and stdout is discarded unless the
/// test says otherwise. The agent refuses an option given twice: pass each once.
pub struct AgentCommand {
    cmd: Command,
    socket: PathBuf,
    event_log: PathBuf,
    metrics_addr: String,
}

impl AgentCommand {
    /// `memcolo agent` (the binary `exe`) with its files in `dir`.
    pub fn new(exe: &str, dir: &Path) -> AgentCommand {
        let socket = dir.join("agent.sock");
        let event_log = dir.join("events.jsonl");
        let mut cmd = Command::new(exe);
        cmd.arg("agent")
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--event-log")
            .arg(&event_log)
            .env("MEMCOLO_LOG", "warn")
            .stdout(Stdio::null());
        AgentCommand {
            cmd,
            socket,
            event_log,
            metrics_addr: "off".into(),
        }
    }

    /// The agent manages the memory cgroup at `group` as its node (`--scope cgroup:PATH`).
    pub fn scope(mut self, group: &Path) -> AgentCommand {
        self.cmd
            .arg("--scope")
            .arg(format!("cgroup:{}", group.display()));
        self
    }

    /// Reads its configuration from `file` (`--config`).
    pub fn config(mut self, file: &Path) -> AgentCommand {
        self.cmd.arg("--config").arg(file);
        self
    }

    /// Serves metrics on `addr` (`host:port`).
    pub fn metrics(mut self, addr: &str) -> AgentCommand {
        self.metrics_addr = addr.into();
        self
    }

    /// More arguments, after those already given.
    pub fn args<I, S>(mut self, args: I) -> AgentCommand
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(args);
        self
    }

    /// The log level (`MEMCOLO_LOG`).
    pub fn log(mut self, level: &str) -> AgentCommand {
        self.cmd.env("MEMCOLO_LOG", level);
        self
    }

    /// Where its log (stderr) goes.
    pub fn stderr(mut self, to: impl Into<Stdio>) -> AgentCommand {
        self.cmd.stderr(to);
        self
    }

    /// Starts the agent and returns once its socket accepts a connection; panics if it
    /// does not within [`AGENT_START_LIMIT`] (the agent is killed first).
    pub fn start(mut self) -> Agent {
        self.cmd.args(["--metrics-addr", &self.metrics_addr]);
        let child = self.cmd.spawn().expect("cannot start `memcolo agent`");
        let agent = Agent {
            child: Some(child),
            socket: self.socket,
            event_log: self.event_log,
        };
        wait_for("the agent's socket", AGENT_START_LIMIT, || {
            UnixStream::connect(&agent.socket).is_ok()
        });
        agent
    }
}

/// A running agent, killed (SIGKILL) and reaped when dropped unless
/// [`Agent::terminate`] stopped it first.
pub struct Agent {
    child: Option<Child>,
    /// Its socket.
    pub socket: PathBuf,
    /// Its event log (JSON lines).
    pub event_log: PathBuf,
}

impl Agent {
    /// The agent's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// Sends SIGTERM and waits up to `limit` for the agent to exit; returns its exit
    /// status, or `None` (after killing it) when it did not exit in time.
    pub fn terminate(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        // SAFETY: kill takes no pointers; the agent is this test's unreaped child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Ok(Some(s)) = c.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
