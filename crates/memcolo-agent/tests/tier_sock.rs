//! The tiering socket (`tier.sock`, `docs/protocol.md` §11) against hostile clients:
//! a real [`TierService`] in this process, clients forked off and dropped to unused
//! uids (61100-61199) speaking over the real socket.
//!
//! Checked: a pid reused by a root process after the connecting process exited is
//! never signalled (in a pid namespace of the test's own, `unshare --pid`, where the
//! reuse is forced through `ns_last_pid`); a region longer than the tier scope, a
//! file that is not a userfaultfd and a range that is not a mapping of the memfd are
//! refused with an error and the agent keeps answering; a flood of connections from
//! one uid leaves the agent's thread count bounded and root still served; a client
//! that never reads its replies blocks neither another client's `tier_status` nor
//! the agent's stop. Needs root.

use memcolo_agent::metrics::Metrics;
use memcolo_agent::tier::{TierSection, TierService};
use memcolo_linux::procfs::ProcFs;
use memcolo_proto::tier::{decode_tier_reply, TierReply, TierRequest};
use memcolo_proto::{encode, ErrorCode};
use memcolo_tier::uffd::{features, mode, Uffd};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these tests need root");
}

struct Agent {
    svc: Option<TierService>,
    _dir: tempfile::TempDir,
    sock: PathBuf,
}

impl Agent {
    fn start() -> Agent {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        // Reachable by the test's unprivileged clients.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let sock = dir.path().join("tier.sock");
        let cfg = TierSection {
            enabled: true,
            socket: Some(sock.clone()),
            fast_bytes: 16 << 20,
            slow_capacity_bytes: 64 << 20,
            window_ms: 20,
            windows_per_epoch: 5,
            ..TierSection::default()
        };
        let svc = TierService::start(
            &cfg,
            &dir.path().join("agent.sock"),
            &ProcFs::root(),
            &Metrics::new(),
        )
        .expect("tier service");
        Agent {
            svc: Some(svc),
            _dir: dir,
            sock,
        }
    }

    fn stop(&mut self) {
        if let Some(s) = self.svc.take() {
            s.stop();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends `req` as one line with `fds` as `SCM_RIGHTS`.
fn send(s: &UnixStream, req: &TierRequest, fds: &[RawFd]) {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let line = encode(req);
    let iov = [std::io::IoSlice::new(line.as_bytes())];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    let n = sendmsg::<()>(s.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).unwrap();
    assert_eq!(n, line.len());
}

/// [`send`], answering whether the line went out (false: the peer closed).
fn try_send(s: &UnixStream, req: &TierRequest, fds: &[RawFd]) -> bool {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let line = encode(req);
    let iov = [std::io::IoSlice::new(line.as_bytes())];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(s.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).is_ok()
}

/// The next answer on `r` (pushes skipped).
fn answer(r: &mut BufReader<UnixStream>) -> Option<TierReply> {
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        match decode_tier_reply(&line).ok()? {
            TierReply::TierTargetSet { .. } | TierReply::TierReleased { .. } => continue,
            other => return Some(other),
        }
    }
}

/// `tier_status` over a new connection, as `memcolo tier status` asks it.
fn status_over_socket(sock: &Path) -> serde_json::Value {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    send(&s, &TierRequest::TierStatus, &[]);
    match answer(&mut BufReader::new(s)) {
        Some(TierReply::TierStatus { status }) => status,
        other => panic!("tier_status answered {other:?}"),
    }
}

/// `status_over_socket` on another thread, waited for at most `bound`.
fn status_within(sock: &Path, bound: Duration) -> Option<serde_json::Value> {
    let (tx, rx) = mpsc::channel();
    let sock = sock.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(status_over_socket(&sock));
    });
    rx.recv_timeout(bound).ok()
}

fn has_pid(status: &serde_json::Value, pid: i32) -> bool {
    status["processes"]
        .as_array()
        .is_some_and(|ps| ps.iter().any(|p| p["pid"] == pid))
}

/// Forks a child that drops to `uid` (and gid) and runs `f` with its end of a
/// control channel; its exit code is `f`'s (101 on a panic). The parent gets the
/// child's pid and its end of the channel.
fn fork_as(uid: u32, f: impl FnOnce(UnixStream) -> i32) -> (libc::pid_t, UnixStream) {
    let (mine, theirs) = UnixStream::pair().unwrap();
    // SAFETY: the child only runs `f` and exits; it never returns into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        drop(mine);
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: dropping privileges in the child: no groups, then gid, then uid.
            unsafe {
                assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
                assert_eq!(libc::setgid(uid), 0);
                assert_eq!(libc::setuid(uid), 0);
            }
            f(theirs)
        }))
        .unwrap_or(101);
        // SAFETY: leaving the child without running the harness's exit handlers.
        unsafe { libc::_exit(code) };
    }
    drop(theirs);
    (pid, mine)
}

fn reap(pid: libc::pid_t) -> i32 {
    let mut st = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    st
}

fn line(s: &UnixStream) -> String {
    let mut l = String::new();
    BufReader::new(s).read_line(&mut l).unwrap();
    l.trim().to_string()
}

fn tell(mut s: &UnixStream, what: &str) {
    writeln!(s, "{what}").unwrap();
}

/// A memfd of `size` bytes and, if `map_pages` > 0, a `MAP_SHARED` mapping of its
/// first `map_pages` pages (address returned, 0 if not mapped).
fn memfd(size: u64, map_pages: usize) -> (OwnedFd, u64) {
    // SAFETY: a new memfd with a static name.
    let fd = unsafe { libc::memfd_create(c"memcolo-tier".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: the kernel gave us this descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sizing our memfd.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) }, 0);
    if map_pages == 0 {
        return (fd, 0);
    }
    // SAFETY: a new shared mapping of our memfd.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_pages * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    (fd, p as u64)
}

/// A userfaultfd an unprivileged process may open (`UFFD_USER_MODE_ONLY`), with
/// `[start, start + len)` registered in MISSING and WP modes.
fn user_uffd(start: u64, len: u64) -> Uffd {
    const UFFD_USER_MODE_ONLY: libc::c_int = 1;
    // SAFETY: the userfaultfd syscall takes one int of flags.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_userfaultfd,
            libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY,
        )
    };
    assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
    // SAFETY: the kernel gave us this descriptor.
    let u = Uffd::handshake(
        unsafe { OwnedFd::from_raw_fd(fd as RawFd) },
        features::PAGEFAULT_FLAG_WP
            | features::MISSING_SHMEM
            | features::WP_HUGETLBFS_SHMEM
            | features::EVENT_REMOVE,
    )
    .unwrap();
    u.register(start, len, mode::MISSING | mode::WP).unwrap();
    u
}

fn reply_kind(r: &Option<TierReply>) -> String {
    match r {
        Some(TierReply::Error { code, message }) => format!("error {code:?}: {message}"),
        Some(other) => format!("{other:?}"),
        None => "closed".into(),
    }
}

fn register_reply(sock: &Path, start: u64, length: u64, fds: &[RawFd], t_miss: f64) -> String {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let req = TierRequest::TierRegister {
        start,
        length,
        t_miss: Some(t_miss),
    };
    send(&s, &req, fds);
    reply_kind(&answer(&mut BufReader::new(s)))
}

fn tier_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| c.starts_with("tier-fault") || c.starts_with("tier-evict"))
        .collect()
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

// --- Pid reuse --------------------------------------------------------------------

const PIDNS_ENV: &str = "MEMCOLO_TIER_TEST_IN_PIDNS";

/// A client connects, forks and exits; its pid is given to a root process; the
/// forked child then registers a region whose userfaultfd cannot be read (a
/// write-only `/dev/null`), which turns the region fatal. The root process must not
/// be signalled. Runs [`pid_reuse_inside_a_pid_namespace`] as pid 1 of a pid
/// namespace of its own, so that nothing else takes the pid meanwhile.
#[test]
fn a_reused_pid_is_never_signalled() {
    require_root();
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(exe)
        .args([
            "--exact",
            "pid_reuse_inside_a_pid_namespace",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PIDNS_ENV, "1")
        .output()
        .expect("unshare (util-linux) must be installed");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("1 passed"),
        "the inner test did not run: {text}"
    );
}

/// The body of [`a_reused_pid_is_never_signalled`]; only meaningful as pid 1 of a
/// new pid namespace.
#[test]
#[ignore = "run by a_reused_pid_is_never_signalled inside a pid namespace"]
fn pid_reuse_inside_a_pid_namespace() {
    assert_eq!(std::env::var(PIDNS_ENV).as_deref(), Ok("1"));
    assert_eq!(std::process::id(), 1, "not pid 1 of a new pid namespace");
    let agent = Agent::start();
    let sock = agent.sock.clone();
    let (connector, ctl) = fork_as(61101, move |ctl| {
        let s = UnixStream::connect(&sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        // Served once: the agent has taken the connection.
        send(&s, &TierRequest::TierStatus, &[]);
        let mut r = BufReader::new(s.try_clone().unwrap());
        assert!(matches!(answer(&mut r), Some(TierReply::TierStatus { .. })));
        // SAFETY: the forked child only uses its own socket and control channel.
        let child = unsafe { libc::fork() };
        if child != 0 {
            tell(&ctl, &child.to_string());
            return 0; // the connector exits; its child keeps the socket
        }
        assert_eq!(line(&ctl), "go");
        let (mfd, start) = memfd(16 * PAGE as u64, 16);
        let null = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap();
        let req = TierRequest::TierRegister {
            start,
            length: 16 * PAGE as u64,
            t_miss: Some(0.5),
        };
        // The agent may have closed the connection already (its connector exited):
        // a refused send is the same outcome as a closed connection.
        let sent = try_send(&s, &req, &[null.as_raw_fd(), mfd.as_raw_fd()]);
        let reply = if sent {
            reply_kind(&answer(&mut r))
        } else {
            "closed".into()
        };
        tell(&ctl, &reply);
        let _ = line(&ctl); // "done"
                            // SAFETY: leaving the grandchild.
        unsafe { libc::_exit(0) }
    });
    let grandchild: libc::pid_t = line(&ctl).parse().unwrap();
    assert_eq!(reap(connector), 0);
    // The connector's pid is free: the next process forked here gets it.
    std::fs::write("/proc/sys/kernel/ns_last_pid", (connector - 1).to_string()).unwrap();
    // SAFETY: the victim only waits for a signal.
    let victim = unsafe { libc::fork() };
    if victim == 0 {
        loop {
            // SAFETY: pause has no preconditions.
            unsafe { libc::pause() };
        }
    }
    assert_eq!(victim, connector, "the pid was not reused");
    tell(&ctl, "go");
    let reply = line(&ctl);
    // Epochs of 100 ms: a fatal region is acted on within one.
    std::thread::sleep(Duration::from_secs(3));
    let mut st = 0;
    // SAFETY: polling our own child.
    let gone = unsafe { libc::waitpid(victim, &mut st, libc::WNOHANG) };
    let status = status_within(&agent.sock, Duration::from_secs(60));
    // SAFETY: ending our own children.
    unsafe {
        libc::kill(victim, libc::SIGKILL);
    }
    // The grandchild may be gone already.
    let _ = writeln!(&ctl, "done");
    reap(victim);
    reap(grandchild);
    assert_eq!(
        gone, 0,
        "the root process that reused the pid was killed (status {st:#x}); the register was answered: {reply}"
    );
    // The connection ends when its connecting process exits: the request is not
    // served (or, had it come first, refused).
    assert!(
        reply == "closed" || reply.starts_with("error"),
        "registered: {reply}"
    );
    assert!(status.is_some(), "the agent stopped answering");
}

// --- Lengths and descriptors --------------------------------------------------------

/// `tier_register` of 2^50 bytes over a sparse memfd that long: refused, the agent
/// stays up (it used to size its page table by the client's length, and abort).
#[test]
fn a_length_beyond_the_tier_scope_is_refused() {
    let agent = Agent::start();
    let sock = agent.sock.clone();
    let (child, ctl) = fork_as(61102, move |ctl| {
        let (mfd, start) = memfd(1 << 50, 16);
        let u = user_uffd(start, 16 * PAGE as u64);
        let r = register_reply(
            &sock,
            start,
            1 << 50,
            &[std::os::fd::AsFd::as_fd(&u).as_raw_fd(), mfd.as_raw_fd()],
            1.0,
        );
        tell(&ctl, &r);
        0
    });
    let reply = line(&ctl);
    assert_eq!(reap(child), 0);
    assert!(reply.starts_with("error BadRequest"), "{reply}");
    let st = status_within(&agent.sock, Duration::from_secs(60)).expect("status");
    assert!(!has_pid(&st, child), "{st}");
}

/// `/dev/null` as the userfaultfd (it polls readable and reads nothing: a fault
/// thread spinning at `SCHED_FIFO` for t_miss < 1): refused, no tier thread started.
#[test]
fn a_file_that_is_not_a_userfaultfd_is_refused() {
    let agent = Agent::start();
    let sock = agent.sock.clone();
    let (child, ctl) = fork_as(61103, move |ctl| {
        let (mfd, start) = memfd(16 * PAGE as u64, 16);
        let null = std::fs::File::open("/dev/null").unwrap();
        let r = register_reply(
            &sock,
            start,
            16 * PAGE as u64,
            &[null.as_raw_fd(), mfd.as_raw_fd()],
            0.1,
        );
        tell(&ctl, &r);
        let _ = line(&ctl);
        0
    });
    let reply = line(&ctl);
    let threads = tier_threads();
    tell(&ctl, "done");
    assert_eq!(reap(child), 0);
    assert!(reply.starts_with("error BadRequest"), "{reply}");
    assert!(threads.is_empty(), "tier threads started: {threads:?}");
}

/// A real userfaultfd and memfd, but the range named is not where the memfd is
/// mapped (nor the memfd a memfd): refused before anything starts.
#[test]
fn a_range_that_is_not_a_mapping_of_the_memfd_is_refused() {
    let agent = Agent::start();
    let sock = agent.sock.clone();
    let (child, ctl) = fork_as(61104, move |ctl| {
        let (mfd, start) = memfd(32 * PAGE as u64, 16);
        let u = user_uffd(start, 16 * PAGE as u64);
        let ufd = std::os::fd::AsFd::as_fd(&u).as_raw_fd();
        // Longer than the mapping.
        let a = register_reply(&sock, start, 32 * PAGE as u64, &[ufd, mfd.as_raw_fd()], 1.0);
        // Another memfd than the one mapped there.
        let (other, _) = memfd(16 * PAGE as u64, 0);
        let b = register_reply(
            &sock,
            start,
            16 * PAGE as u64,
            &[ufd, other.as_raw_fd()],
            1.0,
        );
        // A regular file on disk as the memfd.
        let f = tempfile::tempfile().unwrap();
        f.set_len(16 * PAGE as u64).unwrap();
        let c = register_reply(&sock, start, 16 * PAGE as u64, &[ufd, f.as_raw_fd()], 1.0);
        tell(&ctl, &format!("{a}|{b}|{c}"));
        let _ = line(&ctl);
        0
    });
    let replies = line(&ctl);
    let threads = tier_threads();
    tell(&ctl, "done");
    assert_eq!(reap(child), 0);
    for r in replies.split('|') {
        assert!(r.starts_with("error BadRequest"), "{replies}");
    }
    assert!(threads.is_empty(), "tier threads started: {threads:?}");
}

// --- Connections ----------------------------------------------------------------------

/// 1,500 connections from one uid (each asking `tier_status`, so that the agent has
/// taken them all): the agent's threads stay bounded, the connections over the cap
/// are answered with an error, and root is still served.
#[test]
fn a_connection_flood_keeps_the_threads_bounded() {
    let agent = Agent::start();
    let before = thread_count();
    let sock = agent.sock.clone();
    let (child, ctl) = fork_as(61105, move |ctl| {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: reading and raising our own descriptor limit (soft to hard).
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
            assert!(lim.rlim_max >= 1600, "RLIMIT_NOFILE hard limit below 1600");
            lim.rlim_cur = lim.rlim_max;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
        let mut conns = Vec::new();
        let (mut served, mut refused) = (0, 0);
        for _ in 0..1500 {
            let s = UnixStream::connect(&sock).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            let _ = nix::sys::socket::send(
                s.as_raw_fd(),
                encode(&TierRequest::TierStatus).as_bytes(),
                nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            );
            match answer(&mut BufReader::new(s.try_clone().unwrap())) {
                Some(TierReply::TierStatus { .. }) => served += 1,
                _ => refused += 1,
            }
            conns.push(s);
        }
        tell(&ctl, &format!("{served} {refused}"));
        let _ = line(&ctl);
        drop(conns);
        0
    });
    let counts = line(&ctl);
    let during = thread_count();
    let root = status_within(&agent.sock, Duration::from_secs(60));
    tell(&ctl, "done");
    assert_eq!(reap(child), 0);
    assert!(
        during <= before + 80,
        "{during} threads with 1,500 connections open ({before} before; served/refused: {counts})"
    );
    let (served, refused) = counts.split_once(' ').unwrap();
    assert!(served.parse::<u32>().unwrap() > 0, "{counts}");
    assert!(refused.parse::<u32>().unwrap() > 1000, "{counts}");
    assert!(root.is_some(), "root was not served beside the flood");
}

/// A client that sends requests and never reads the answers: another client's
/// `tier_status` and the agent's stop still finish.
#[test]
fn a_client_that_does_not_read_blocks_neither_status_nor_stop() {
    let mut agent = Agent::start();
    let sock = agent.sock.clone();
    let (child, ctl) = fork_as(61106, move |ctl| {
        let s = UnixStream::connect(&sock).unwrap();
        s.set_nonblocking(true).unwrap();
        let req = encode(&TierRequest::TierStatus);
        // Until the agent stops taking requests (its answers fill our buffer), or
        // drops us.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut sent = 0u64;
        let mut stalled_since: Option<Instant> = None;
        while Instant::now() < deadline {
            match nix::sys::socket::send(
                s.as_raw_fd(),
                req.as_bytes(),
                nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            ) {
                Ok(_) => {
                    sent += 1;
                    stalled_since = None;
                }
                Err(nix::errno::Errno::EAGAIN) => {
                    let t = *stalled_since.get_or_insert_with(Instant::now);
                    if t.elapsed() > Duration::from_millis(500) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => break, // dropped
            }
        }
        tell(&ctl, &sent.to_string());
        let _ = line(&ctl);
        drop(s);
        0
    });
    let sent = line(&ctl);
    let status = status_within(&agent.sock, Duration::from_secs(30));
    let (tx, rx) = mpsc::channel();
    let svc = agent.svc.take().unwrap();
    std::thread::spawn(move || {
        svc.stop();
        let _ = tx.send(());
    });
    let stopped = rx.recv_timeout(Duration::from_secs(30)).is_ok();
    tell(&ctl, "done");
    assert_eq!(reap(child), 0);
    assert!(
        status.is_some(),
        "tier_status hung behind a client that does not read ({sent} requests sent)"
    );
    assert!(
        stopped,
        "stop hung behind a client that does not read ({sent} requests sent)"
    );
}

/// A line over the protocol's limit is refused whole; its tail is never served as a
/// request of its own (protocol §2), so a client's answers stay in step with its lines.
#[test]
fn an_over_long_line_is_refused_whole() {
    require_root();
    let agent = Agent::start();
    let s = UnixStream::connect(&agent.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut w = &s;
    // 70,000 bytes with no newline, then (in a later write) a request and the newline
    // that ends the long line.
    w.write_all(&vec![b'x'; 70_000]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let req = encode(&TierRequest::TierStatus);
    w.write_all(req.as_bytes()).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    match answer(&mut r) {
        Some(TierReply::Error { code, message }) => {
            assert_eq!(code, ErrorCode::BadRequest, "{message}");
            assert!(message.contains("over the"), "{message}");
        }
        other => panic!("the tail of an over-long line was served: {other:?}"),
    }
    // The next line is served normally.
    w.write_all(req.as_bytes()).unwrap();
    assert!(matches!(answer(&mut r), Some(TierReply::TierStatus { .. })));
}
