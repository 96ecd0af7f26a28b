//! The agent's persistent state against hostile or damaged input, on the real
//! binary: each test starts `memcolo agent` with its own socket and state directory
//! (`--metrics-addr off`, host scope) and checks what it does with a corrupt,
//! partly bad, ambiguous, unknown-version or non-regular `registry.json`, a state
//! directory shared with another agent or planted by another user, and a burst of
//! registrations.
//!
//! Needs root (the agent's own uid owns the state directory; the planted directory
//! belongs to uid 61300). Every wait is bounded; nothing depends on the machine's
//! speed.

mod common;

use common::{agent_status, wait_for};
use memcolo_testkit::child_stderr;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long an agent may take to start or to refuse to (a liveness bound).
const LIMIT: Duration = Duration::from_secs(60);

/// The uid that plays a tenant owning a planted state directory.
const TENANT_UID: u32 = 61300;

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_memcolo")
}

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "these tests start the agent as root"
    );
}

/// A test's directory: the agent's socket, state directory and event log.
struct Dir {
    tmp: tempfile::TempDir,
}

impl Dir {
    fn new() -> Dir {
        Dir {
            tmp: tempfile::tempdir().unwrap(),
        }
    }
    fn state(&self) -> PathBuf {
        self.tmp.path().join("state")
    }
    fn registry(&self) -> PathBuf {
        self.state().join("registry.json")
    }
    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.tmp.path().join("events.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
    /// Creates the state directory as the agent wants it (owned by us, mode 0700).
    fn make_state(&self) {
        std::fs::create_dir(self.state()).unwrap();
        std::fs::set_permissions(self.state(), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
}

/// A running (or refused) `memcolo agent`; killed on drop.
struct Agent {
    child: Child,
    sock: PathBuf,
}

/// How an agent start ended.
enum Start {
    Ready,
    Exited(ExitStatus, String),
}

impl Agent {
    /// Starts an agent on `dir` with socket `sock_name`.
    fn spawn(dir: &Dir, sock_name: &str) -> Agent {
        let sock = dir.tmp.path().join(sock_name);
        let child = Command::new(exe())
            .args(["agent", "--metrics-addr", "off", "--poll-ms", "200"])
            .arg("--socket")
            .arg(&sock)
            .arg("--state-dir")
            .arg(dir.state())
            .arg("--event-log")
            .arg(dir.tmp.path().join("events.jsonl"))
            .env("MEMCOLO_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Agent { child, sock }
    }

    /// Whether the agent's main loop answers a ping (the socket is bound before the
    /// registry is loaded, so a connection alone proves nothing).
    fn answers(&self) -> bool {
        let Ok(c) = UnixStream::connect(&self.sock) else {
            return false;
        };
        c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut w = c.try_clone().unwrap();
        if writeln!(w, "{}", json!({"v": 1, "type": "ping"})).is_err() {
            return false;
        }
        let mut line = String::new();
        BufReader::new(c).read_line(&mut line).is_ok() && line.contains("pong")
    }

    /// Waits until the agent answers on its socket or exits; panics after [`LIMIT`].
    fn start(&mut self) -> Start {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Start::Exited(st, child_stderr(&mut self.child));
            }
            if self.answers() {
                return Start::Ready;
            }
            assert!(
                t0.elapsed() < LIMIT,
                "the agent neither started nor exited within {LIMIT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn expect_ready(&mut self) {
        match self.start() {
            Start::Ready => {}
            Start::Exited(st, err) => panic!("the agent exited ({st}): {err}"),
        }
    }

    /// Waits for a refusal and returns its message.
    fn expect_refusal(&mut self) -> String {
        match self.start() {
            Start::Ready => panic!("the agent started; it should have refused to"),
            Start::Exited(st, err) => {
                assert!(!st.success(), "refused with status {st}: {err}");
                err
            }
        }
    }

    fn status(&self) -> Value {
        agent_status(exe(), &self.sock)
    }

    /// `class` of each registered pid.
    fn classes(&self) -> Vec<(i64, String)> {
        let mut v: Vec<(i64, String)> = self.status()["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["pid"].as_i64().unwrap(),
                    p["class"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// SIGTERM and wait for a clean exit.
    fn stop(mut self) {
        // SAFETY: kill takes no pointers; the agent is our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let mut status = None;
        wait_for("the agent to stop on SIGTERM", LIMIT, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        let st = status.unwrap();
        assert!(st.success(), "agent exit status {st}");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sleep` processes that the registry can name; killed on drop.
struct Sleepers(Vec<Child>);

impl Sleepers {
    fn new(n: usize) -> Sleepers {
        Sleepers(
            (0..n)
                .map(|_| Command::new("sleep").arg("600").spawn().unwrap())
                .collect(),
        )
    }
    fn pid(&self, i: usize) -> i64 {
        self.0[i].id() as i64
    }
    /// `/proc/PID/stat` field 22 of the i-th sleeper.
    fn starttime(&self, i: usize) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid(i))).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split(' ').nth(19).unwrap().parse().unwrap()
    }
    /// A saved registry entry for the i-th sleeper.
    fn entry(&self, i: usize, class: &str) -> Value {
        json!({
            "pid": self.pid(i), "class": class, "name": format!("sleeper{i}"),
            "starttime_ticks": self.starttime(i), "expected_reclaim_bytes": null,
            "notify": "none", "registered_unix_s": 1,
        })
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Files in the state directory whose names start with `registry.json.bad-`.
fn set_aside(dir: &Dir) -> Vec<PathBuf> {
    use memcolo_agent::registry::{registry_path, set_aside_copies};
    set_aside_copies(&registry_path(&dir.state())).unwrap()
}

#[test]
fn a_corrupt_registry_is_kept_aside_and_the_agent_starts() {
    require_root();
    let s = Sleepers::new(1);
    let whole = serde_json::to_vec(&json!({"version": 1, "entries": [s.entry(0, "lc")]})).unwrap();
    let truncated = whole[..whole.len() / 2].to_vec();
    for bad in [truncated, b"\x00\xffgarbage{{{".to_vec()] {
        let dir = Dir::new();
        dir.make_state();
        std::fs::write(dir.registry(), &bad).unwrap();
        let mut a = Agent::spawn(&dir, "agent.sock");
        a.expect_ready();
        let aside = set_aside(&dir);
        assert_eq!(aside.len(), 1, "one copy kept aside: {aside:?}");
        assert_eq!(std::fs::read(&aside[0]).unwrap(), bad, "kept byte for byte");
        assert!(
            dir.events()
                .iter()
                .any(|e| e["event"] == "registry_set_aside"),
            "an event says so: {:?}",
            dir.events()
        );
        a.stop();
        // The copy aside survives the agent's own writes.
        assert_eq!(std::fs::read(&aside[0]).unwrap(), bad);
    }
}

#[test]
fn one_bad_entry_is_dropped_and_the_others_are_kept() {
    require_root();
    let s = Sleepers::new(3);
    let dir = Dir::new();
    dir.make_state();
    let mut mistyped = s.entry(1, "be");
    mistyped["class"] = json!("lcc");
    let mut bad_pid = s.entry(1, "be");
    bad_pid["pid"] = json!(-1);
    let reg = json!({"version": 1, "entries": [s.entry(0, "lc"), mistyped, bad_pid, s.entry(2, "elastic")]});
    std::fs::write(dir.registry(), serde_json::to_vec(&reg).unwrap()).unwrap();
    let mut a = Agent::spawn(&dir, "agent.sock");
    a.expect_ready();
    let mut want = vec![(s.pid(0), "lc".to_string()), (s.pid(2), "elastic".into())];
    want.sort();
    assert_eq!(a.classes(), want);
    // The original, bad entries included, is kept aside.
    let aside = set_aside(&dir);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        serde_json::from_slice::<Value>(&std::fs::read(&aside[0]).unwrap()).unwrap(),
        reg
    );
    a.stop();
}

#[test]
fn a_pid_listed_twice_keeps_its_most_protective_class() {
    require_root();
    let s = Sleepers::new(2);
    let dir = Dir::new();
    dir.make_state();
    let reg = json!({"version": 1, "entries": [
        s.entry(0, "lc"), s.entry(0, "be"),
        s.entry(1, "be"), s.entry(1, "elastic"), s.entry(1, "be"),
    ]});
    std::fs::write(dir.registry(), serde_json::to_vec(&reg).unwrap()).unwrap();
    let mut a = Agent::spawn(&dir, "agent.sock");
    a.expect_ready();
    let mut want = vec![(s.pid(0), "lc".to_string()), (s.pid(1), "elastic".into())];
    want.sort();
    assert_eq!(a.classes(), want);
    a.stop();
}

#[test]
fn an_unknown_version_is_refused_and_the_file_left_untouched() {
    require_root();
    let s = Sleepers::new(1);
    let dir = Dir::new();
    dir.make_state();
    let body = serde_json::to_vec(&json!({"version": 99, "entries": [s.entry(0, "lc")]})).unwrap();
    std::fs::write(dir.registry(), &body).unwrap();
    let mut a = Agent::spawn(&dir, "agent.sock");
    let err = a.expect_refusal();
    assert!(err.contains("version 99"), "{err}");
    assert!(err.contains("registry.json"), "{err}");
    assert_eq!(std::fs::read(dir.registry()).unwrap(), body);
    assert!(set_aside(&dir).is_empty());
}

#[test]
fn a_fifo_at_the_registry_is_refused_without_hanging() {
    require_root();
    let dir = Dir::new();
    dir.make_state();
    let c = std::ffi::CString::new(dir.registry().to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut a = Agent::spawn(&dir, "agent.sock");
    let err = a.expect_refusal();
    assert!(err.contains("not a regular file"), "{err}");
    assert!(std::fs::symlink_metadata(dir.registry())
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn a_second_agent_on_the_same_state_dir_refuses_to_start() {
    require_root();
    let dir = Dir::new();
    let mut first = Agent::spawn(&dir, "first.sock");
    first.expect_ready();
    let mut second = Agent::spawn(&dir, "second.sock");
    let err = second.expect_refusal();
    assert!(err.contains(dir.state().to_str().unwrap()), "{err}");
    assert!(
        err.contains(&format!("pid {}", first.child.id())),
        "names the holder: {err}"
    );
    // The first agent is unaffected.
    first.status();
    first.stop();
}

#[test]
fn a_state_dir_another_user_could_plant_is_refused() {
    require_root();
    // World-writable.
    let dir = Dir::new();
    std::fs::create_dir(dir.state()).unwrap();
    std::fs::set_permissions(dir.state(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = Agent::spawn(&dir, "a.sock").expect_refusal();
    assert!(err.contains("writable"), "{err}");
    // Owned by a tenant.
    let dir = Dir::new();
    dir.make_state();
    std::os::unix::fs::chown(dir.state(), Some(TENANT_UID), Some(TENANT_UID)).unwrap();
    let err = Agent::spawn(&dir, "a.sock").expect_refusal();
    assert!(err.contains(&format!("uid {TENANT_UID}")), "{err}");
    // A symlink to a directory.
    let dir = Dir::new();
    let real = dir.tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, dir.state()).unwrap();
    let err = Agent::spawn(&dir, "a.sock").expect_refusal();
    assert!(err.contains("symlink"), "{err}");
    // A file.
    let dir = Dir::new();
    std::fs::write(dir.state(), b"").unwrap();
    let err = Agent::spawn(&dir, "a.sock").expect_refusal();
    assert!(err.contains("not a directory"), "{err}");
    // Missing: created, mode 0700.
    let dir = Dir::new();
    let mut a = Agent::spawn(&dir, "a.sock");
    a.expect_ready();
    let mode = std::fs::metadata(dir.state()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    a.stop();
}

/// Counts renames onto `registry.json` in a directory (inotify `IN_MOVED_TO`): one
/// per registry write, whatever the agent reports. `IN_MOVED_FROM` is watched too:
/// inotify merges an event identical to the last one queued, and the renames from
/// the temporary file between them keep the renames onto the registry apart.
struct RenameCounter {
    fd: i32,
}

impl RenameCounter {
    fn watch(dir: &Path) -> RenameCounter {
        // SAFETY: plain syscalls on a fresh fd and a NUL-terminated path.
        unsafe {
            let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
            assert!(fd >= 0);
            let c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
            assert!(
                libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_MOVED_TO | libc::IN_MOVED_FROM)
                    >= 0
            );
            RenameCounter { fd }
        }
    }
    /// Renames onto `registry.json` since the last call.
    fn take(&mut self) -> usize {
        let mut n = 0;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            // SAFETY: buf is valid for its length.
            let r = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                assert_eq!(
                    std::io::Error::last_os_error().raw_os_error(),
                    Some(libc::EAGAIN)
                );
                return n;
            }
            let mut off = 0usize;
            while off < r as usize {
                // SAFETY: the kernel wrote whole events into buf.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
                let name_at = off + std::mem::size_of::<libc::inotify_event>();
                let name = &buf[name_at..name_at + ev.len as usize];
                let name = name.split(|b| *b == 0).next().unwrap();
                assert_ne!(ev.mask & libc::IN_Q_OVERFLOW, libc::IN_Q_OVERFLOW);
                if ev.mask & libc::IN_MOVED_TO != 0 && name == b"registry.json" {
                    n += 1;
                }
                off = name_at + ev.len as usize;
            }
        }
    }
}

impl Drop for RenameCounter {
    fn drop(&mut self) {
        // SAFETY: our own fd.
        unsafe { libc::close(self.fd) };
    }
}

#[test]
fn a_burst_of_registrations_is_written_a_few_times_not_once_each() {
    require_root();
    const REGISTRATIONS: usize = 3000;
    let s = Sleepers::new(3);
    let dir = Dir::new();
    dir.make_state();
    let mut renames = RenameCounter::watch(&dir.state());
    let mut a = Agent::spawn(&dir, "agent.sock");
    a.expect_ready();
    let before = renames.take();
    let t0 = Instant::now();
    let conn = UnixStream::connect(&a.sock).unwrap();
    conn.set_read_timeout(Some(LIMIT)).unwrap();
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    for i in 0..REGISTRATIONS {
        let req = json!({"v": 1, "type": "register", "pid": s.pid(i % 3),
                         "class": "elastic", "notify": "none"});
        writeln!(w, "{req}").unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.contains("\"registered\""), "{line}");
    }
    let st = a.status();
    let reported = st["state"]["writes"].as_u64();
    a.stop();
    let elapsed = t0.elapsed();
    let writes = renames.take();
    // Every registration is in the state.
    let saved: Value = serde_json::from_slice(&std::fs::read(dir.registry()).unwrap()).unwrap();
    assert_eq!(saved["entries"].as_array().unwrap().len(), 3, "{saved}");
    // At most one write per flush interval (1 s) while the burst lasted, one more for
    // a flush under way and one at shutdown.
    let bound = elapsed.as_secs() as usize + 3;
    assert!(
        writes <= bound,
        "{writes} registry writes for {REGISTRATIONS} registrations in {elapsed:?} \
         (after {before} at start); at most {bound} expected"
    );
    assert!(reported.is_some_and(|n| n >= before as u64), "{st}");
}
