//! Fault injection between a managed process and a real `memcolo memserver`
//! process: the server killed, and pages damaged in transit. Either way the process
//! whose page cannot come back is stopped with a clear reason (exit status 70 and
//! the reason on stderr) and the thread that touched the page never sees zeros.
//!
//! The managed process is this test binary run again in child mode
//! (`MEMCOLO_TIER_CHILD=ADDR`, test `tier_child`): a region under a tier manager in
//! its own process whose slow tier is the memory server at ADDR, and a watcher that
//! stops the process once the manager reports a lost page, as the agent and
//! `gups` do. Needs userfaultfd (root, or vm.unprivileged_userfaultfd = 1).

mod common;

use memcolo_testkit::{child_stderr, memserver_address};
use memcolo_tier::channel::Auth;
use memcolo_tier::manager::{NoPlacement, TierConfig, TierManager};
use memcolo_tier::region::{AnonRegion, PAGE};
use memcolo_tier::remote::{RemoteConfig, RemoteTier};
use memcolo_tier::uffd::{self, features, mode, Uffd};
use memcolo_tier::SlowTier;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const PAGES: usize = 64;
const TOUCHED: usize = 10;

/// The secret of these tests' memory servers and clients: written once per test
/// process into a private directory (mode 0600), removed at exit.
fn secret_file() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("secret");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        f.write_all(b"memcolo memserver test secret, 32+ bytes long")
            .unwrap();
        d
    });
    Box::leak(dir.path().join("secret").into_boxed_path())
}

fn auth() -> Auth {
    // A child reads the file its parent named.
    let path = std::env::var_os("MEMCOLO_TIER_SECRET")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| secret_file().to_owned());
    Auth::from_file(&path).unwrap()
}

fn quick(addr: &str) -> RemoteConfig {
    RemoteConfig {
        connect_timeout: Duration::from_millis(200),
        io_timeout: Duration::from_millis(300),
        attempts: 3,
        backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(50),
        ..RemoteConfig::new(addr, PAGE, auth())
    }
}

fn byte(p: usize, i: usize) -> u8 {
    (p * 31 + i * 7 + 1) as u8
}

/// Child mode: see the module documentation. Prints `READY` once every page is in
/// the memory server and verified, then touches page `TOUCHED` when a line arrives
/// on stdin; prints `RETURNED` if the access ever returns.
#[test]
fn tier_child() {
    let Ok(addr) = std::env::var("MEMCOLO_TIER_CHILD") else {
        return; // Only the parent's tests run this in a child.
    };
    let region = AnonRegion::new(PAGES).unwrap();
    let base = region.as_ptr();
    let u = Uffd::open(features::PAGEFAULT_FLAG_WP).unwrap();
    u.register(base as u64, region.len() as u64, mode::MISSING | mode::WP)
        .unwrap();
    let cfg = match std::env::var("MEMCOLO_TIER_CHILD_TIMEOUTS").as_deref() {
        // every attempt must get as far as the server's answer, however loaded the
        // machine: a timed-out greeting would hide the reason under test
        Ok("patient") => RemoteConfig {
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(10),
            ..quick(&addr)
        },
        _ => quick(&addr),
    };
    let tier = Arc::new(RemoteTier::connect(cfg).unwrap());
    let m = Arc::new(
        TierManager::start(
            u,
            Box::new(region.memory()),
            tier,
            Box::new(NoPlacement),
            TierConfig::new(1),
        )
        .unwrap(),
    );
    {
        let m = m.clone();
        std::thread::spawn(move || loop {
            if let Some(why) = m.fatal() {
                eprintln!("STOPPED: {why}");
                let _ = std::io::stderr().flush();
                std::process::exit(70);
            }
            std::thread::sleep(Duration::from_millis(10));
        });
    }
    for p in 0..PAGES {
        for i in 0..PAGE {
            // SAFETY: inside the live region.
            unsafe { *base.add(p * PAGE + i) = byte(p, i) };
        }
    }
    m.evict(&(0..PAGES).collect::<Vec<_>>());
    m.wait_evictions();
    assert_eq!(m.stats().stored_pages, PAGES as u64, "{:?}", m.last_error());
    for p in 0..4 {
        for i in (0..PAGE).step_by(97) {
            // SAFETY: inside the live region; faults it back from the server.
            assert_eq!(unsafe { *base.add(p * PAGE + i) }, byte(p, i));
        }
    }
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    // SAFETY: inside the live region.
    let v = unsafe { std::ptr::read_volatile(base.add(TOUCHED * PAGE + 5)) };
    println!("RETURNED {}", v == byte(TOUCHED, 5));
    std::io::stdout().flush().unwrap();
    std::process::exit(0);
}

/// A child process killed when dropped (a failing test leaves nothing behind).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn memserver() -> (Killed, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memcolo"))
        .args([
            "memserver",
            "--listen",
            "127.0.0.1:0",
            "--capacity-mib",
            "64",
            "--secret-file",
            secret_file().to_str().unwrap(),
        ])
        .env("MEMCOLO_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let addr = memserver_address(&mut c);
    (Killed(c), addr)
}

struct ChildRun {
    child: Child,
    lines: mpsc::Receiver<String>,
}

/// Starts `tier_child` against `addr` and waits for its `READY`. `timeouts`: `quick`
/// (short ones, for the test that times the give-up) or `patient` (long ones, so that
/// no attempt fails for a slow machine).
fn managed_child(addr: &str, timeouts: &str) -> ChildRun {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tier_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("MEMCOLO_TIER_CHILD", addr)
        .env("MEMCOLO_TIER_CHILD_TIMEOUTS", timeouts)
        .env("MEMCOLO_TIER_SECRET", secret_file())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let start = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            // (libtest prints "test tier_child ... " first, on the same line.)
            Ok(l) if l.trim_end().ends_with("READY") => break,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                let err = child_stderr(&mut child);
                panic!(
                    "child never got ready ({e:?}, {:?}): {err}",
                    start.elapsed()
                );
            }
        }
    }
    ChildRun { child, lines: rx }
}

/// Lets the child touch its page; waits for it to end (at most `limit`). Returns its
/// exit status, its stderr, whether the access returned, and how long it took.
fn touch_and_wait(mut run: ChildRun, limit: Duration) -> (Option<i32>, String, bool, Duration) {
    let start = Instant::now();
    writeln!(run.child.stdin.as_mut().unwrap(), "go").unwrap();
    let status = loop {
        if let Some(s) = run.child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = run.child.kill();
            break run.child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = start.elapsed();
    let err = child_stderr(&mut run.child);
    let returned = run.lines.try_iter().any(|l| l.contains("RETURNED"));
    (status.code(), err, returned, took)
}

fn permitted() -> bool {
    match uffd::check_permission() {
        Ok(()) => true,
        Err(why) => {
            common::cannot_run("this test", &why.to_string());
            false
        }
    }
}

#[test]
fn killed_memserver_stops_the_process_with_a_reason_never_zeros() {
    if !permitted() {
        return;
    }
    let (mut server, addr) = memserver();
    let run = managed_child(&addr, "quick");
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    let bound = quick(&addr).retry_bound();
    let (code, err, returned, took) = touch_and_wait(run, bound + Duration::from_secs(20));
    assert!(!returned, "the access returned: {err}");
    assert_eq!(code, Some(70), "{err}");
    assert!(
        err.contains("STOPPED")
            && err.contains(&format!("page {TOUCHED} "))
            && err.contains("unreachable"),
        "{err}"
    );
    // Retries within the bound, then the watcher's poll.
    assert!(
        took <= bound + Duration::from_secs(2),
        "{took:?} > {bound:?}"
    );
}

/// Bytes the server sends in a handshake that succeeds: greeting and verdict.
const HANDSHAKE_FROM_SERVER: usize = 40 + 40;

/// Forwards one connection from the server to the client; past the handshake, while
/// `damage` is set, flips one bit in every chunk forwarded (inside a sealed record).
fn pump_responses(mut from: TcpStream, mut to: TcpStream, damage: Arc<AtomicBool>) {
    let mut seen = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let past = HANDSHAKE_FROM_SERVER.saturating_sub(seen);
        if past < n && damage.load(Ordering::Relaxed) {
            buf[n - 1] ^= 0x10;
        }
        seen += n;
        if to.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

fn damaging_proxy(server: String, damage: Arc<AtomicBool>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let Ok(s) = TcpStream::connect(&server) else {
                continue;
            };
            let (c2, s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
            std::thread::spawn(move || {
                let (mut c2, mut s2) = (c2, s2);
                let _ = std::io::copy(&mut c2, &mut s2);
            });
            let d = damage.clone();
            std::thread::spawn(move || pump_responses(s, c, d));
        }
    });
    addr
}

#[test]
fn pages_damaged_in_transit_stop_the_process_with_a_reason() {
    if !permitted() {
        return;
    }
    let (server, addr) = memserver();
    let damage = Arc::new(AtomicBool::new(false));
    let proxy = damaging_proxy(addr, damage.clone());
    let run = managed_child(&proxy, "patient");
    damage.store(true, Ordering::Relaxed);
    let (code, err, returned, _) = touch_and_wait(run, Duration::from_secs(120));
    drop(server);
    assert!(!returned, "the access returned: {err}");
    assert_eq!(code, Some(70), "{err}");
    // The altered records fail to open: every attempt's connection is dropped, and
    // the page is given up, never handed over altered.
    assert!(
        err.contains("STOPPED")
            && err.contains(&format!("page {TOUCHED} "))
            && err.contains("record failed authentication"),
        "{err}"
    );
}

/// Without a secret the server does not start (unless told `--insecure-no-auth`),
/// and a secret file others may read, or too short, is refused with its reason.
#[test]
fn memserver_refuses_to_start_without_a_private_secret() {
    use std::os::unix::fs::PermissionsExt;
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_memcolo"))
            .args(["memserver", "--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&[]).contains("--secret-file"));
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("s");
    std::fs::write(&f, [7u8; 40]).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(run(&["--secret-file", f.to_str().unwrap()]).contains("chmod 600"));
    std::fs::write(&f, [7u8; 8]).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(run(&["--secret-file", f.to_str().unwrap()]).contains("needs 32"));
}

/// A scratch pids cgroup (v1) below this test's own, removed when dropped.
struct PidsCgroup(std::path::PathBuf);

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A connection whose thread cannot be started is refused; the server goes on
/// serving (before: the accept loop returned the spawn's error and the process
/// exited, its pages lost).
#[test]
fn a_failed_thread_spawn_refuses_one_connection_and_the_server_goes_on() {
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .lines()
        .find_map(|l| l.split_once(":pids:").map(|(_, p)| p.to_string()))
        .expect("no pids cgroup (v1) controller");
    let cg = PidsCgroup(std::path::PathBuf::from(format!(
        "/sys/fs/cgroup/pids{}/memcolo-memserver-test-{}",
        own.trim_end_matches('/'),
        std::process::id()
    )));
    std::fs::create_dir(&cg.0).unwrap();
    let (mut server, addr) = memserver();
    let pid = server.0.id();
    let tasks = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count()
    };
    std::fs::write(cg.0.join("cgroup.procs"), pid.to_string()).unwrap();
    // Room for one connection thread, none more.
    std::fs::write(cg.0.join("pids.max"), (tasks() + 1).to_string()).unwrap();
    let t = RemoteTier::connect(quick(&addr)).unwrap();
    t.store(memcolo_tier::PageKey::new(1, 1), &[9u8; PAGE])
        .unwrap();
    // The next connections find no thread: refused with a reason.
    for _ in 0..3 {
        let mut c = TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        assert!(
            String::from_utf8_lossy(&got).contains("no thread"),
            "{got:?}"
        );
    }
    assert!(server.0.try_wait().unwrap().is_none(), "the server exited");
    let mut out = vec![0u8; PAGE];
    t.load(memcolo_tier::PageKey::new(1, 1), &mut out).unwrap();
    assert_eq!(out, vec![9u8; PAGE]);
    std::fs::write(cg.0.join("pids.max"), "max").unwrap();
    drop(t);
    let again = RemoteTier::connect(quick(&addr)).unwrap();
    again
        .load(memcolo_tier::PageKey::new(1, 1), &mut out)
        .unwrap();
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    // Move nothing back: the killed server left the cgroup empty.
}
