//! The memcolo agent as a child of a benchmark, and a minimal client of its socket.
//!
//! Started as `memcolo agent --scope cgroup:<node> --socket <dir>/agent.sock
//! --state-dir <dir>/state --metrics-addr off --event-log <file>` (plus any extra
//! arguments), it manages the scratch node only. Processes are registered with one
//! `register` request per connection of the versioned JSON-lines protocol
//! (`memcolo-proto`); the benchmark runs as root, so it may register any pid.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use memcolo_proto::{decode_reply, encode, Class, NotifyMode, Reply, Request};

use crate::error::{BenchError, Result};
use crate::process::{spawn, ChildGuard, ChildPlacement};

/// A running agent; killed when dropped, stopped gracefully by [`AgentProcess::stop`].
#[derive(Debug)]
pub struct AgentProcess {
    child: ChildGuard,
    socket: PathBuf,
}

/// Where and how to start the agent.
#[derive(Clone, Debug)]
pub struct AgentSpec<'a> {
    /// The `memcolo` binary.
    pub exe: &'a Path,
    /// The node cgroup (absolute directory) the agent manages.
    pub scope_cgroup: &'a Path,
    /// Directory for the socket and the state directory.
    pub work_dir: &'a Path,
    /// JSON-lines event log to write.
    pub event_log: &'a Path,
    /// Agent output (stdout and stderr).
    pub log: &'a Path,
    /// Further arguments (e.g. `--adv-thr-ratio 0.9`).
    pub extra_args: &'a [String],
}

impl AgentProcess {
    /// Starts the agent and waits up to `timeout` for its socket to accept connections.
    pub fn start(
        spec: &AgentSpec<'_>,
        place: &ChildPlacement<'_>,
        timeout: Duration,
    ) -> Result<Self> {
        let socket = spec.work_dir.join("agent.sock");
        let state = spec.work_dir.join("state");
        std::fs::create_dir_all(&state).map_err(|e| BenchError::io(&state, e))?;
        let _ = std::fs::remove_file(&socket);
        let log = std::fs::File::create(spec.log).map_err(|e| BenchError::io(spec.log, e))?;
        let mut cmd = Command::new(spec.exe);
        cmd.arg("agent")
            .arg("--scope")
            .arg(format!("cgroup:{}", spec.scope_cgroup.display()))
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(&state)
            .args(["--metrics-addr", "off"])
            .arg("--event-log")
            .arg(spec.event_log)
            .args(spec.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| BenchError::io(spec.log, e))?)
            .stderr(log);
        let mut agent = AgentProcess {
            child: spawn(&mut cmd, "memcolo agent", place)?,
            socket,
        };
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = agent.child.try_wait()? {
                return Err(BenchError::Process(format!(
                    "memcolo agent exited at start ({st}); see {}",
                    spec.log.display()
                )));
            }
            if UnixStream::connect(&agent.socket).is_ok() {
                return Ok(agent);
            }
            crate::signal::check()?;
            if Instant::now() >= end {
                return Err(BenchError::Process(format!(
                    "memcolo agent socket {} did not appear within {timeout:?}",
                    agent.socket.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The agent's pid.
    pub fn pid(&self) -> i32 {
        self.child.pid()
    }

    /// The agent's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Fails if the agent has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            Some(st) => Err(BenchError::Process(format!("memcolo agent exited: {st}"))),
            None => Ok(()),
        }
    }

    /// Registers `pid` with `class` (not notified: plain Redis and batch tools do not
    /// speak the protocol).
    pub fn register(&self, pid: i32, class: Class, name: &str) -> Result<()> {
        register(&self.socket, pid, class, name)
    }

    /// SIGTERM, then up to `grace` to exit (SIGKILL after).
    pub fn stop(mut self, grace: Duration) -> Result<std::process::ExitStatus> {
        self.child.terminate(grace)
    }
}

/// Sends one `register` request to the agent at `socket` and checks the reply.
pub fn register(socket: &Path, pid: i32, class: Class, name: &str) -> Result<()> {
    let io = |e| BenchError::io(socket, e);
    let mut s = UnixStream::connect(socket).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    let req = Request::Register {
        pid: Some(pid),
        class,
        name: Some(name.to_string()),
        expected_reclaim_bytes: None,
        notify: NotifyMode::None,
    };
    s.write_all(encode(&req).as_bytes()).map_err(io)?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(io)?;
    match decode_reply(&line) {
        Ok(Reply::Registered { .. }) | Ok(Reply::Ok) => Ok(()),
        Ok(Reply::Error { code, message }) => Err(BenchError::Process(format!(
            "agent refused to register pid {pid} ({name}): {code:?}: {message}"
        ))),
        Ok(other) => Err(BenchError::Process(format!(
            "unexpected agent reply to register: {other:?}"
        ))),
        Err(e) => Err(BenchError::Process(format!(
            "bad agent reply {:?}: {e}",
            line.trim()
        ))),
    }
}

/// Asks the agent at `socket` for its state (`memcolo status --json`), with a short
/// timeout so a sampler never stalls on a busy agent.
pub fn status(socket: &Path) -> Result<serde_json::Value> {
    let io = |e| BenchError::io(socket, e);
    let mut s = UnixStream::connect(socket).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .map_err(io)?;
    s.write_all(encode(&Request::Status { offset: 0 }).as_bytes())
        .map_err(io)?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(io)?;
    match decode_reply(&line) {
        Ok(Reply::Status { status }) => Ok(status),
        other => Err(BenchError::Process(format!(
            "unexpected agent reply to status: {other:?}"
        ))),
    }
}

/// Counts kill actions in the text of an agent event log (JSON lines): objects whose
/// `kind`, `type`, `event` or `action` field contains `kill`. Lines that are not JSON
/// are skipped.
pub fn count_kills(event_log_text: &str) -> u64 {
    event_log_text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            ["kind", "type", "event", "action"].iter().any(|k| {
                v.get(k)
                    .and_then(|x| x.as_str())
                    .is_some_and(|s| s.to_ascii_lowercase().contains("kill"))
            })
        })
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kills_in_event_log() {
        let log = concat!(
            "{\"ts\":1,\"kind\":\"notify\",\"pid\":3}\n",
            "{\"ts\":2,\"kind\":\"kill\",\"pid\":4}\n",
            "not json\n",
            "{\"ts\":3,\"action\":\"Kill\",\"pid\":5}\n",
            "{\"ts\":4,\"kind\":\"advise\",\"note\":\"kill\"}\n",
        );
        assert_eq!(count_kills(log), 2);
        assert_eq!(count_kills(""), 0);
    }

    #[test]
    fn register_talks_protocol() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("a.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            let req = memcolo_proto::decode_request(&line).unwrap();
            let reply = match req {
                Request::Register { pid, class, .. } => Reply::Registered {
                    pid: pid.unwrap(),
                    class,
                },
                _ => panic!("unexpected {req:?}"),
            };
            (&s).write_all(encode(&reply).as_bytes()).unwrap();
            // Second connection: refuse.
            let (s, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            let reply = Reply::Error {
                code: memcolo_proto::ErrorCode::NoSuchProcess,
                message: "gone".into(),
            };
            (&s).write_all(encode(&reply).as_bytes()).unwrap();
        });
        register(&sock, 42, Class::Lc, "redis").unwrap();
        let err = register(&sock, 43, Class::Be, "fio").unwrap_err();
        assert!(err.to_string().contains("gone"), "{err}");
        server.join().unwrap();
    }
}
