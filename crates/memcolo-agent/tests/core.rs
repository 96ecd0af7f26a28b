//! The agent core against a fake procfs tree, with actuators and exit watchers that
//! record instead of acting: registration rules, M3 notifications and answers,
//! kills (BE only), Hermes advice (BE files only) and the registry across restarts.

use memcolo_agent::config::AgentConfig;
use memcolo_agent::core::{Core, ExitWatcher, Peer, PeerNamespace, Trigger};
use memcolo_agent::eventlog::EventLog;
use memcolo_agent::kubernetes::PodProcess;
use memcolo_agent::metrics::Metrics;
use memcolo_linux::actuate::{Actuator, ActuatorCall, RecordingActuator};
use memcolo_linux::filecache::CachedFile;
use memcolo_linux::identity::ProvenProcess;
use memcolo_linux::procfs::ProcFs;
use memcolo_linux::scope::Scope;
use memcolo_policy::{Class, Level, Pid};
use memcolo_proto::{ErrorCode, NotifyMode, Reply, Request};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

const GIB: u64 = 1 << 30;
const KIB: u64 = 1 << 10;

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<RecordingActuator>>);
impl Actuator for Shared {
    fn signal(&mut self, p: &ProvenProcess, sig: i32) -> memcolo_linux::Result<()> {
        self.0.lock().unwrap().signal(p, sig)
    }
    fn kill(&mut self, p: &ProvenProcess, reason: &str) -> memcolo_linux::Result<()> {
        self.0.lock().unwrap().kill(p, reason)
    }
    fn drop_file_cache(&mut self, file: &CachedFile) -> memcolo_linux::Result<u64> {
        self.0.lock().unwrap().drop_file_cache(file)
    }
}
impl Shared {
    fn calls(&self) -> Vec<ActuatorCall> {
        self.0.lock().unwrap().calls.clone()
    }
}

#[derive(Clone, Default)]
struct Watched(Arc<Mutex<Vec<Pid>>>);
impl ExitWatcher for Watched {
    fn watch(&mut self, pid: Pid, _pidfd: std::os::fd::OwnedFd) -> std::io::Result<()> {
        self.0.lock().unwrap().push(pid);
        Ok(())
    }
    fn unwatch(&mut self, pid: Pid) {
        self.0.lock().unwrap().retain(|p| *p != pid);
    }
}

/// A fake /proc: meminfo and one `stat` per process (real kernel field layout).
struct FakeProc {
    root: PathBuf,
}

impl FakeProc {
    fn new(dir: &Path) -> FakeProc {
        let root = dir.join("proc");
        std::fs::create_dir_all(&root).unwrap();
        let f = FakeProc { root };
        f.set_meminfo(64 * GIB, 60 * GIB);
        f
    }
    /// Total and available memory; free is set to available, so "used" (page cache
    /// included) equals the working set.
    fn set_meminfo(&self, total: u64, available: u64) {
        let text = format!(
            "MemTotal:       {} kB\nMemFree:        {} kB\nMemAvailable:   {} kB\nBuffers:               0 kB\nCached:           0 kB\nSwapCached:            0 kB\nActive(file):          0 kB\nInactive(file):        0 kB\nAnonPages:       {} kB\nShmem:                 0 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n",
            total / KIB,
            available / KIB,
            available / KIB,
            (total - available) / KIB
        );
        std::fs::write(self.root.join("meminfo"), text).unwrap();
    }
    fn add(&self, pid: Pid, ppid: Pid, comm: &str, starttime: u64, rss_pages: u64) {
        self.add_as(pid, ppid, comm, starttime, rss_pages, 0)
    }
    /// [`add`](Self::add) of a process running as `uid` (all four uids and gids).
    fn add_as(&self, pid: Pid, ppid: Pid, comm: &str, starttime: u64, rss_pages: u64, uid: u32) {
        let d = self.root.join(pid.to_string());
        std::fs::create_dir_all(d.join("fd")).unwrap();
        std::fs::write(
            d.join("stat"),
            format!("{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194304 3100 0 6 0 0 1 0 0 20 0 1 0 {starttime} 23887872 {rss_pages} 18446744073709551615 4321280 7148169 140725439413920 0 0 0 0 16781318 0 1 0 0 17 1 0 0 0 0 0 9723336 11027064 685113344 140725439416529 140725439416788 140725439416788 140725439418337 0\n"),
        )
        .unwrap();
        std::fs::write(d.join("maps"), "").unwrap();
        // It catches SIGRTMIN+1..3, as a process registered for signals must.
        let sig_cgt: u64 = (1..=3).map(|n| 1u64 << (libc::SIGRTMIN() + n - 1)).sum();
        std::fs::write(
            d.join("status"),
            format!(
                "Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\nSigCgt:\t{sig_cgt:016x}\nVmRSS:\t{} kB\n",
                rss_pages * 4
            ),
        )
        .unwrap();
    }
    fn remove(&self, pid: Pid) {
        std::fs::remove_dir_all(self.root.join(pid.to_string())).unwrap();
    }
    /// Makes `pid` catch no signal (its `SigCgt` empty).
    fn drop_handlers(&self, pid: Pid) {
        let path = self.root.join(pid.to_string()).join("status");
        let text = std::fs::read_to_string(&path).unwrap();
        let text: String = text
            .lines()
            .map(|l| {
                if l.starts_with("SigCgt:") {
                    "SigCgt:\t0000000000000000\n".to_string()
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(&path, text).unwrap();
    }
}

struct Harness {
    _dir: tempfile::TempDir,
    proc_: FakeProc,
    act: Shared,
    watched: Watched,
    cfg: AgentConfig,
    core: Core,
    data: PathBuf,
}

fn harness(tweak: impl FnOnce(&mut AgentConfig)) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let proc_ = FakeProc::new(dir.path());
    let mut cfg = AgentConfig {
        procfs: proc_.root.clone(),
        state_dir: dir.path().join("state"),
        metrics_addr: "off".into(),
        // Fake pids must not steer the test process's own CPU affinity.
        avoid_lc_cpus: false,
        ..AgentConfig::default()
    };
    cfg.m3.kill_after_s = 30;
    tweak(&mut cfg);
    let act = Shared::default();
    let watched = Watched::default();
    let core = new_core(&cfg, &act, &watched);
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    Harness {
        _dir: dir,
        proc_,
        act,
        watched,
        cfg,
        core,
        data,
    }
}

fn new_core(cfg: &AgentConfig, act: &Shared, watched: &Watched) -> Core {
    let scope = Scope::Host(ProcFs::new(cfg.procfs.clone()));
    Core::new(
        cfg.clone(),
        scope,
        Box::new(act.clone()),
        Box::new(watched.clone()),
        Box::new(memcolo_linux::fake::FakeProver {
            procfs: ProcFs::new(cfg.procfs.clone()),
        }),
        Arc::new(Metrics::new()),
        EventLog::off(),
    )
    .unwrap()
}

const ROOT: Peer = Peer {
    pid_ns: PeerNamespace::Agent,
    pid: Some(1),
    uid: 0,
    process: None,
};

/// The process `pid` of the fake tree as a connected peer of user `uid`.
fn peer_of(h: &Harness, pid: Pid, uid: u32) -> Peer {
    use memcolo_linux::identity::Prover;
    let prover = memcolo_linux::fake::FakeProver {
        procfs: ProcFs::new(h.cfg.procfs.clone()),
    };
    Peer::proven(uid, prover.open(pid, None).unwrap())
}

fn register(
    core: &mut Core,
    conn: u64,
    peer: &Peer,
    pid: Option<Pid>,
    class: Class,
    notify: NotifyMode,
) -> Reply {
    core.handle(
        conn,
        peer,
        Request::Register {
            pid,
            class,
            name: None,
            expected_reclaim_bytes: None,
            notify,
        },
        Duration::from_secs(1),
    )
}

#[test]
fn registration_follows_the_peer_credential_rule() {
    let mut h = harness(|_| {});
    h.proc_.add(100, 1, "app", 500, 10);
    h.proc_.add(200, 1, "other", 600, 10);
    let user = peer_of(&h, 100, 1000);
    // A process registers itself.
    assert_eq!(
        register(
            &mut h.core,
            1,
            &user,
            None,
            Class::Elastic,
            NotifyMode::Socket
        ),
        Reply::Registered {
            pid: 100,
            class: Class::Elastic
        }
    );
    // An unprivileged peer may not register another process...
    assert!(matches!(
        register(
            &mut h.core,
            1,
            &user,
            Some(200),
            Class::Be,
            NotifyMode::None
        ),
        Reply::Error {
            code: ErrorCode::PermissionDenied,
            ..
        }
    ));
    // ...root may.
    assert!(matches!(
        register(
            &mut h.core,
            2,
            &ROOT,
            Some(200),
            Class::Be,
            NotifyMode::None
        ),
        Reply::Registered { pid: 200, .. }
    ));
    // A pid that does not exist is refused with its own code.
    assert!(matches!(
        register(
            &mut h.core,
            2,
            &ROOT,
            Some(999),
            Class::Be,
            NotifyMode::None
        ),
        Reply::Error {
            code: ErrorCode::NoSuchProcess,
            ..
        }
    ));
    assert!(matches!(
        register(&mut h.core, 2, &ROOT, Some(-3), Class::Be, NotifyMode::None),
        Reply::Error {
            code: ErrorCode::BadRequest,
            ..
        }
    ));
    assert_eq!(h.core.registry().len(), 2);
    assert_eq!(*h.watched.0.lock().unwrap(), vec![100, 200]);
    // Unregistering another process is also root's.
    assert!(matches!(
        h.core.handle(
            1,
            &user,
            Request::Unregister { pid: Some(200) },
            Duration::ZERO
        ),
        Reply::Error {
            code: ErrorCode::PermissionDenied,
            ..
        }
    ));
    assert_eq!(
        h.core.handle(
            2,
            &ROOT,
            Request::Unregister { pid: Some(200) },
            Duration::ZERO
        ),
        Reply::Ok
    );
    assert!(h.core.registry().get(200).is_none());
    assert_eq!(*h.watched.0.lock().unwrap(), vec![100]);
    // An exit removes the registration at once.
    h.core.process_exited(100);
    assert!(h.core.registry().is_empty());
}

#[test]
fn red_zone_notifies_over_the_socket_and_records_the_answer() {
    let mut h = harness(|_| {});
    h.proc_.add(100, 1, "cache", 500, 1000);
    let (tx, mut rx) = mpsc::channel(8);
    h.core.conn_opened(7, tx);
    let peer = peer_of(&h, 100, 1000);
    register(
        &mut h.core,
        7,
        &peer,
        None,
        Class::Elastic,
        NotifyMode::Socket,
    );
    // 64 GiB node: top 62, low 50, high 55 GiB. Working set 58 GiB: red.
    h.proc_.set_meminfo(64 * GIB, 6 * GIB);
    h.core.poll(Duration::from_secs(10), Trigger::Tick);
    let mut levels = vec![];
    let mut seqs = vec![];
    while let Ok(Reply::Notify {
        seq,
        level,
        target_bytes,
    }) = rx.try_recv()
    {
        assert!(target_bytes > 0);
        levels.push(level);
        seqs.push(seq);
    }
    assert!(levels.contains(&Level::High), "got {levels:?}");
    let seq = *seqs.last().unwrap();
    let r = h.core.handle(
        7,
        &peer,
        Request::Reclaimed {
            pid: None,
            seq: Some(seq),
            bytes: 3 * GIB,
            duration_ms: 40,
            ok: true,
        },
        Duration::from_secs(11),
    );
    assert_eq!(r, Reply::Ok);
    let e = h.core.registry().get(100).unwrap();
    assert_eq!(e.reclaimed_bytes, 3 * GIB);
    assert!(e.notifications_sent >= 1);
    let st = h.core.status_json();
    assert_eq!(st["processes"][0]["expected_reclaim_bytes"], 3 * GIB);
    assert_eq!(st["zone"], "red");
    // Yellow (52 GiB): a low signal; its answer of 0 bytes (a collection that gave
    // nothing back) leaves the expected reclamation of a high signal alone (M3 §5.1).
    h.proc_.set_meminfo(64 * GIB, 12 * GIB);
    h.core.poll(Duration::from_secs(12), Trigger::Tick);
    let Ok(Reply::Notify {
        seq: low_seq,
        level: Level::Low,
        ..
    }) = rx.try_recv()
    else {
        panic!("expected a low notification");
    };
    let r = h.core.handle(
        7,
        &peer,
        Request::Reclaimed {
            pid: None,
            seq: Some(low_seq),
            bytes: 0,
            duration_ms: 5,
            ok: true,
        },
        Duration::from_secs(12),
    );
    assert_eq!(r, Reply::Ok);
    let st = h.core.status_json();
    assert_eq!(st["processes"][0]["expected_reclaim_bytes"], 3 * GIB);
    // Another process may not answer for it.
    h.proc_.add(555, 1, "stranger", 700, 1);
    let stranger = peer_of(&h, 555, 1000);
    assert!(matches!(
        h.core.handle(
            9,
            &stranger,
            Request::Reclaimed {
                pid: None,
                seq: Some(seq),
                bytes: 1,
                duration_ms: 1,
                ok: true
            },
            Duration::ZERO
        ),
        Reply::Error { .. }
    ));
    // A closed connection makes it unreachable (not notified) but still registered.
    h.core.conn_closed(7);
    h.core.poll(Duration::from_secs(30), Trigger::Tick);
    assert!(h.core.registry().get(100).is_some());
    assert!(rx.try_recv().is_err());
}

#[test]
fn signal_mode_uses_realtime_signals() {
    let mut h = harness(|_| {});
    h.proc_.add(100, 1, "legacy", 500, 1000);
    register(
        &mut h.core,
        1,
        &ROOT,
        Some(100),
        Class::Elastic,
        NotifyMode::Signal,
    );
    h.proc_.set_meminfo(64 * GIB, 13 * GIB); // 51 GiB: yellow
    h.core.poll(Duration::from_secs(10), Trigger::Tick);
    assert_eq!(
        h.act.calls(),
        vec![ActuatorCall::Signal {
            pid: 100,
            sig: libc::SIGRTMIN() + 1
        }]
    );
}

#[test]
fn signal_mode_is_refused_for_a_process_without_handlers() {
    let mut h = harness(|_| {});
    h.proc_.add(100, 1, "plain", 500, 1000);
    h.proc_.drop_handlers(100);
    let r = register(
        &mut h.core,
        1,
        &ROOT,
        Some(100),
        Class::Elastic,
        NotifyMode::Signal,
    );
    match r {
        Reply::Error {
            code: ErrorCode::BadRequest,
            message,
        } => assert!(message.contains("no handler"), "{message}"),
        other => panic!("registered a process the first notification would kill: {other:?}"),
    }
    assert!(h.core.registry().is_empty());
    // Socket notifications need no handler.
    assert!(matches!(
        register(
            &mut h.core,
            1,
            &ROOT,
            Some(100),
            Class::Elastic,
            NotifyMode::Socket
        ),
        Reply::Registered { .. }
    ));
}

#[test]
fn above_top_only_be_is_killed_and_only_after_kill_after() {
    let mut h = harness(|c| c.m3.kill_after_s = 30);
    h.proc_.add(100, 1, "redis", 100, 1_000_000);
    h.proc_.add(200, 1, "batch", 200, 2_000_000);
    h.proc_.add(201, 200, "batch-worker", 210, 1_000_000);
    h.proc_.add(300, 1, "cache", 300, 3_000_000);
    register(
        &mut h.core,
        1,
        &ROOT,
        Some(100),
        Class::Lc,
        NotifyMode::None,
    );
    register(
        &mut h.core,
        1,
        &ROOT,
        Some(200),
        Class::Be,
        NotifyMode::None,
    );
    register(
        &mut h.core,
        1,
        &ROOT,
        Some(300),
        Class::Elastic,
        NotifyMode::Signal,
    );
    h.proc_.set_meminfo(64 * GIB, GIB); // 63 GiB: above the 62 GiB top
    for s in 0..30 {
        h.core.poll(Duration::from_secs(100 + s), Trigger::Tick);
    }
    assert!(
        !h.act
            .calls()
            .iter()
            .any(|c| matches!(c, ActuatorCall::Kill { .. })),
        "killed before kill_after: {:?}",
        h.act.calls()
    );
    h.core.poll(Duration::from_secs(131), Trigger::Tick);
    let kills: Vec<Pid> = h
        .act
        .calls()
        .iter()
        .filter_map(|c| match c {
            ActuatorCall::Kill { pid, .. } => Some(*pid),
            _ => None,
        })
        .collect();
    // The BE job and its child; never the LC or the elastic process.
    assert_eq!(kills, vec![201, 200]);
    assert_eq!(h.core.status_json()["counters"]["kills"], 1);
}

#[test]
fn a_child_forked_between_full_process_reads_is_killed_with_its_job() {
    // Between full reads of the process table the polls follow only the registered
    // trees; a kill must still take a child the job forked since the last full read.
    let mut h = harness(|c| c.m3.kill_after_s = 30);
    h.proc_.add(200, 1, "batch", 200, 2_000_000);
    register(
        &mut h.core,
        1,
        &ROOT,
        Some(200),
        Class::Be,
        NotifyMode::None,
    );
    h.proc_.set_meminfo(64 * GIB, GIB); // above the 62 GiB top
    for s in 0..30 {
        h.core.poll(Duration::from_secs(100 + s), Trigger::Tick);
    }
    h.proc_.add(202, 200, "late-worker", 290, 1_000);
    h.core.poll(Duration::from_secs(131), Trigger::Tick);
    let mut kills: Vec<Pid> = h
        .act
        .calls()
        .iter()
        .filter_map(|c| match c {
            ActuatorCall::Kill { pid, .. } => Some(*pid),
            _ => None,
        })
        .collect();
    kills.sort_unstable();
    assert_eq!(kills, vec![200, 202]);
}

/// A real `sleep` holding `files` open (descriptors 3, 4, ...), killed on drop.
struct Holder(std::process::Child);

impl Holder {
    fn spawn(files: &[&Path]) -> Holder {
        let redirs: String = files
            .iter()
            .enumerate()
            .map(|(i, f)| format!(" {}<'{}'", i + 3, f.display()))
            .collect();
        let child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("exec{redirs}; exec sleep 600"))
            .spawn()
            .unwrap();
        let h = Holder(child);
        let last = format!("/proc/{}/fd/{}", h.pid(), files.len() + 2);
        wait_until("the holder's descriptors", || Path::new(&last).exists());
        h
    }
    fn pid(&self) -> Pid {
        self.0.id() as Pid
    }
    /// Its real start time, for the fake procfs tree.
    fn starttime(&self) -> u64 {
        ProcFs::root()
            .read_pid_stat(self.pid())
            .unwrap()
            .starttime_ticks
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A harness whose Hermes advice worker (on the real `/proc`) acts through `act`;
/// processes are real, their start times copied into the fake tree.
fn advice_harness(act: Box<dyn Actuator>) -> Harness {
    let mut h = harness(|c| {
        c.hermes.min_resident_bytes = 0;
        c.hermes.adv_thr_ratio = 0.5;
    });
    h.core
        .attach_advice(memcolo_agent::advice::start(ProcFs::root(), act).unwrap());
    h
}

fn dropped_paths(act: &Shared) -> Vec<PathBuf> {
    act.calls()
        .iter()
        .filter_map(|c| match c {
            ActuatorCall::DropFileCache { path, .. } => Some(path.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn hermes_drops_be_files_but_never_files_an_lc_process_holds() {
    let act = Shared::default();
    let mut h = advice_harness(Box::new(act.clone()));
    let be_only = h.data.join("be-only.dat");
    let shared = h.data.join("shared.dat");
    std::fs::write(&be_only, vec![7u8; 512 * 1024]).unwrap();
    std::fs::write(&shared, vec![7u8; 512 * 1024]).unwrap();
    let lc = Holder::spawn(&[&shared]);
    let be = Holder::spawn(&[&be_only, &shared]);
    h.proc_.add(lc.pid(), 1, "redis", lc.starttime(), 10);
    h.proc_.add(be.pid(), 1, "batch", be.starttime(), 10);
    register(
        &mut h.core,
        1,
        &ROOT,
        Some(lc.pid()),
        Class::Lc,
        NotifyMode::None,
    );
    register(
        &mut h.core,
        1,
        &ROOT,
        Some(be.pid()),
        Class::Be,
        NotifyMode::None,
    );
    // Below adv_thr (32 GiB of 64): no round at all.
    h.proc_.set_meminfo(64 * GIB, 40 * GIB);
    h.core.poll(Duration::from_secs(1), Trigger::Tick);
    std::thread::sleep(Duration::from_millis(200));
    h.core.collect_advice();
    assert!(act.calls().is_empty());
    h.proc_.set_meminfo(64 * GIB, 20 * GIB);
    // The file cache of a freshly written file may already be written back and
    // evicted on a busy machine: keep it resident while waiting.
    let mut s = 2;
    wait_until("the BE file advised", || {
        let _ = std::fs::read(&be_only);
        h.core.poll(Duration::from_secs(s), Trigger::Tick);
        s += 1;
        !dropped_paths(&act).is_empty()
    });
    // Only the file no LC process holds. (The loop keeps the file resident and
    // polls until a round has advised it, so a round handed over just before that
    // was seen may advise it again: the count is not the point.)
    let dropped = dropped_paths(&act);
    assert!(!dropped.is_empty());
    assert!(dropped.iter().all(|p| *p == be_only), "{dropped:?}");
}

/// Blocks in `drop_file_cache` until `release` is set, like a file system that does
/// not answer.
#[derive(Clone, Default)]
struct Stuck {
    entered: Arc<std::sync::atomic::AtomicBool>,
    release: Arc<std::sync::atomic::AtomicBool>,
}
impl Actuator for Stuck {
    fn signal(&mut self, _: &ProvenProcess, _: i32) -> memcolo_linux::Result<()> {
        Ok(())
    }
    fn kill(&mut self, _: &ProvenProcess, _: &str) -> memcolo_linux::Result<()> {
        Ok(())
    }
    fn drop_file_cache(&mut self, _: &CachedFile) -> memcolo_linux::Result<u64> {
        use std::sync::atomic::Ordering;
        self.entered.store(true, Ordering::SeqCst);
        while !self.release.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(4096)
    }
}

#[test]
fn a_stuck_advice_round_stalls_only_the_worker_and_later_rounds_are_skipped() {
    use std::sync::atomic::Ordering;
    let stuck = Stuck::default();
    let mut h = advice_harness(Box::new(stuck.clone()));
    let file = h.data.join("be.dat");
    std::fs::write(&file, vec![7u8; 512 * 1024]).unwrap();
    let be = Holder::spawn(&[&file]);
    h.proc_.add(be.pid(), 1, "batch", be.starttime(), 10);
    register(
        &mut h.core,
        1,
        &ROOT,
        Some(be.pid()),
        Class::Be,
        NotifyMode::None,
    );
    h.proc_.set_meminfo(64 * GIB, 20 * GIB);
    let mut s = 1;
    wait_until("the worker stuck in the advice", || {
        let _ = std::fs::read(&file);
        h.core.poll(Duration::from_secs(s), Trigger::Tick);
        s += 1;
        stuck.entered.load(Ordering::SeqCst)
    });
    // The main loop goes on: polls return, status answers, rounds are skipped.
    let polls = h.core.status_json()["polls"].as_u64().unwrap();
    for _ in 0..5 {
        h.core.poll(Duration::from_secs(s), Trigger::Tick);
        s += 1;
    }
    assert_eq!(h.core.status_json()["polls"].as_u64().unwrap(), polls + 5);
    assert_eq!(
        h.core.status_json()["counters"]["file_cache_dropped_bytes"],
        0
    );
    assert!(
        h.core.status_json()["counters"]["file_advice_rounds_skipped"]
            .as_u64()
            .unwrap()
            >= 5
    );
    stuck.release.store(true, Ordering::SeqCst);
    wait_until("the round's outcome recorded", || {
        h.core.poll(Duration::from_secs(s), Trigger::Tick);
        s += 1;
        h.core.status_json()["counters"]["file_cache_dropped_bytes"]
            .as_u64()
            .unwrap()
            > 0
    });
}

#[test]
fn registry_survives_a_restart_but_not_a_reused_pid() {
    let mut h = harness(|_| {});
    h.proc_.add(100, 1, "redis", 100, 10);
    h.proc_.add(200, 1, "batch", 200, 10);
    register(
        &mut h.core,
        1,
        &ROOT,
        Some(100),
        Class::Lc,
        NotifyMode::None,
    );
    register(
        &mut h.core,
        1,
        &ROOT,
        Some(200),
        Class::Be,
        NotifyMode::None,
    );
    h.core.shutdown();
    // While the agent was down, pid 200 exited and the pid was reused.
    h.proc_.remove(200);
    h.proc_.add(200, 1, "newcomer", 999, 10);
    let watched = Watched::default();
    let core = new_core(&h.cfg, &h.act, &watched);
    assert_eq!(core.registry().len(), 1);
    assert_eq!(core.registry().get(100).unwrap().class, Class::Lc);
    assert_eq!(*watched.0.lock().unwrap(), vec![100]);
}

#[test]
fn requests_on_a_host_scope_for_a_cgroup_are_refused_clearly() {
    let mut h = harness(|_| {});
    match h.core.handle(
        1,
        &ROOT,
        Request::Cgroup { name: "be".into() },
        Duration::ZERO,
    ) {
        Reply::Error { code, message } => {
            assert_eq!(code, ErrorCode::BadRequest);
            assert!(message.contains("scope"), "{message}");
        }
        r => panic!("{r:?}"),
    }
    assert!(matches!(
        h.core.handle(1, &ROOT, Request::Ping, Duration::ZERO),
        Reply::Pong { .. }
    ));
}

#[test]
fn one_user_may_register_only_its_share_of_processes() {
    let mut h = harness(|c| c.limits.registrations_per_uid = 3);
    for pid in 100..105 {
        h.proc_.add_as(pid, 1, "job", 500 + pid as u64, 1, 1000);
    }
    h.proc_.add_as(200, 1, "other", 900, 1, 1001);
    for pid in 100..103 {
        let p = peer_of(&h, pid, 1000);
        assert!(matches!(
            register(&mut h.core, 1, &p, None, Class::Be, NotifyMode::None),
            Reply::Registered { .. }
        ));
    }
    let p = peer_of(&h, 103, 1000);
    assert!(matches!(
        register(&mut h.core, 1, &p, None, Class::Be, NotifyMode::None),
        Reply::Error {
            code: ErrorCode::LimitExceeded,
            ..
        }
    ));
    // Registering again the same process is no new registration.
    let p = peer_of(&h, 100, 1000);
    assert!(matches!(
        register(&mut h.core, 1, &p, None, Class::Elastic, NotifyMode::None),
        Reply::Registered { .. }
    ));
    // Another user, and root, are not held back by it.
    let p = peer_of(&h, 200, 1001);
    assert!(matches!(
        register(&mut h.core, 1, &p, None, Class::Be, NotifyMode::None),
        Reply::Registered { .. }
    ));
    assert!(matches!(
        register(
            &mut h.core,
            2,
            &ROOT,
            Some(104),
            Class::Be,
            NotifyMode::None
        ),
        Reply::Registered { .. }
    ));
}

#[test]
fn status_fits_the_protocol_line_in_pages_at_ten_thousand_registrations() {
    let mut h = harness(|_| {});
    let long = "n".repeat(256);
    for pid in 1000..11_000 {
        h.proc_.add(pid, 1, "p", pid as u64, 1);
        let r = h.core.handle(
            1,
            &ROOT,
            Request::Register {
                pid: Some(pid),
                class: Class::Be,
                name: Some(long.clone()),
                expected_reclaim_bytes: None,
                notify: NotifyMode::None,
            },
            Duration::ZERO,
        );
        assert!(matches!(r, Reply::Registered { .. }), "{r:?}");
    }
    let mut offset = 0;
    let mut seen = 0;
    let mut pages = 0;
    loop {
        let reply = h
            .core
            .handle(1, &ROOT, Request::Status { offset }, Duration::ZERO);
        let line = memcolo_proto::encode(&reply);
        assert!(
            line.len() <= memcolo_proto::MAX_LINE_BYTES,
            "a status page of {} bytes",
            line.len()
        );
        assert!(matches!(
            memcolo_proto::decode_reply(&line),
            Ok(Reply::Status { .. })
        ));
        let Reply::Status { status } = reply else {
            unreachable!()
        };
        assert_eq!(status["processes_total"], 10_000);
        seen += status["processes"].as_array().unwrap().len();
        pages += 1;
        match status["next_offset"].as_u64() {
            Some(n) => {
                assert!(n > offset);
                offset = n;
            }
            None => break,
        }
    }
    assert_eq!(seen, 10_000);
    assert!(pages > 1);
}

/// A core whose metrics the test can read.
fn core_with_metrics(cfg: &AgentConfig) -> (Core, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    let core = Core::new(
        cfg.clone(),
        Scope::Host(ProcFs::new(cfg.procfs.clone())),
        Box::new(Shared::default()),
        Box::new(Watched::default()),
        Box::new(memcolo_linux::fake::FakeProver {
            procfs: ProcFs::new(cfg.procfs.clone()),
        }),
        metrics.clone(),
        EventLog::off(),
    )
    .unwrap();
    (core, metrics)
}

#[test]
fn a_burst_of_registrations_is_one_write_at_the_next_flush() {
    let h = harness(|_| {});
    for pid in 1000..4000 {
        h.proc_.add(pid, 1, "job", pid as u64, 10);
    }
    let (mut core, metrics) = core_with_metrics(&h.cfg);
    assert!(core.flush_state());
    let at_start = metrics.state_writes.get();
    for pid in 1000..4000 {
        let r = register(&mut core, 1, &ROOT, Some(pid), Class::Be, NotifyMode::None);
        assert!(matches!(r, Reply::Registered { .. }), "{r:?}");
    }
    assert_eq!(
        metrics.state_writes.get(),
        at_start,
        "no write per registration"
    );
    assert!(core.flush_state());
    assert!(core.flush_state(), "nothing new: nothing written");
    assert_eq!(metrics.state_writes.get(), at_start + 1);
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(h.cfg.state_dir.join("registry.json")).unwrap())
            .unwrap();
    assert_eq!(saved["entries"].as_array().unwrap().len(), 3000);
}

#[test]
fn a_failed_state_write_loses_nothing_and_is_retried() {
    let h = harness(|_| {});
    h.proc_.add(100, 1, "redis", 100, 10);
    let (mut core, metrics) = core_with_metrics(&h.cfg);
    assert!(core.flush_state());
    // The temporary file's name is taken by a directory: every write fails.
    let blocker = h.cfg.state_dir.join("registry.json.tmp");
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("x"), b"").unwrap();
    register(&mut core, 1, &ROOT, Some(100), Class::Lc, NotifyMode::None);
    assert!(!core.flush_state());
    assert!(!core.flush_state());
    assert_eq!(metrics.state_write_errors.get(), 2);
    assert_eq!(core.registry().get(100).unwrap().class, Class::Lc);
    assert_eq!(core.status_json()["state"]["dirty"], true);
    // The disk recovers: the next flush writes what was kept in memory.
    std::fs::remove_dir_all(&blocker).unwrap();
    assert!(core.flush_state());
    drop(core);
    let (core, _) = core_with_metrics(&h.cfg);
    assert_eq!(core.registry().get(100).unwrap().class, Class::Lc);
}

#[test]
fn answers_without_an_rss_fall_are_flagged_once_and_rates_are_in_status() {
    // The storm's cache: yellow for two minutes, event-triggered polls every 100 ms
    // between ticks of 1 s, every low answered at once with 8 MiB while the RSS the
    // polls see never falls (evict, regrow, evict). Thresholds held still (a ratio
    // target of 0:1 moves none in yellow).
    let still = |c: &mut AgentConfig| c.m3.ratio_target = [0, 1];
    let h = harness(still);
    h.proc_.add(100, 1, "cache", 500, 1000);
    let events = h._dir.path().join("events.jsonl");
    let metrics = Arc::new(Metrics::new());
    let mut core = Core::new(
        h.cfg.clone(),
        Scope::Host(ProcFs::new(h.cfg.procfs.clone())),
        Box::new(Shared::default()),
        Box::new(Watched::default()),
        Box::new(memcolo_linux::fake::FakeProver {
            procfs: ProcFs::new(h.cfg.procfs.clone()),
        }),
        metrics.clone(),
        EventLog::open(events.to_str().unwrap()).unwrap(),
    )
    .unwrap();
    let (tx, mut rx) = mpsc::channel(64);
    core.conn_opened(7, tx);
    let peer = peer_of(&h, 100, 1000);
    register(
        &mut core,
        7,
        &peer,
        None,
        Class::Elastic,
        NotifyMode::Socket,
    );
    // 64 GiB node: low 50, high 55 GiB. Working set 52 GiB: yellow.
    h.proc_.set_meminfo(64 * GIB, 12 * GIB);
    let ms = Duration::from_millis;
    let mut lows = 0;
    for i in 0..1200u64 {
        let now = Duration::from_secs(10) + ms(100 * i);
        let trigger = if i % 10 == 0 {
            Trigger::Tick
        } else {
            Trigger::Event
        };
        core.poll(now, trigger);
        while let Ok(Reply::Notify { seq, level, .. }) = rx.try_recv() {
            assert_eq!(level, Level::Low);
            lows += 1;
            core.handle(
                7,
                &peer,
                Request::Reclaimed {
                    pid: None,
                    seq: Some(seq),
                    bytes: 8 << 20,
                    duration_ms: 1,
                    ok: true,
                },
                now,
            );
        }
    }
    // 120 s at one poll period (1 s) of epoch after each answer: a low every 1.1 s
    // at most (R8, R9), not one per poll.
    assert!((100..=120).contains(&lows), "{lows} lows");
    let st = core.status_json();
    let p = &st["processes"][0];
    assert_eq!(p["notifications_sent"], lows);
    assert_eq!(p["notifications"]["low"], lows);
    assert_eq!(p["reclaim_reports"], lows);
    assert_eq!(p["epoch_ms"], 1000);
    let per_min = p["notifications_per_min"]["low"].as_u64().unwrap();
    assert!((50..=60).contains(&per_min), "{per_min} per minute");
    let rate = p["reclaim_bytes_per_s"].as_f64().unwrap();
    assert!(
        (rate - (per_min * (8 << 20)) as f64 / 60.0).abs() < 1.0,
        "{rate}"
    );
    assert_eq!(p["reclaim_unmatched"], true);
    // One episode: one event, one count.
    let flagged: Vec<serde_json::Value> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "reclaim_unmatched")
        .collect();
    assert_eq!(flagged.len(), 1, "{flagged:?}");
    assert_eq!(flagged[0]["pid"], 100);
    assert!(flagged[0]["reported_bytes"].as_u64().unwrap() >= 64 << 20);
    let text = metrics.render();
    assert!(
        text.contains("memcolo_reclaim_unmatched_total{class=\"elastic\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("memcolo_reclaim_unmatched_processes{class=\"elastic\"} 1"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "memcolo_notifications_total{{class=\"elastic\",level=\"low\",via=\"socket\"}} {lows}"
        )),
        "{text}"
    );
    // Reclaim that the RSS shows is matched: a process whose RSS falls by what it
    // reports is not flagged.
    let h = harness(still);
    h.proc_.add(100, 1, "honest", 500, 1_000_000);
    let (tx, mut rx) = mpsc::channel(64);
    let mut core = new_core(&h.cfg, &h.act, &h.watched);
    core.conn_opened(7, tx);
    let peer = peer_of(&h, 100, 1000);
    register(
        &mut core,
        7,
        &peer,
        None,
        Class::Elastic,
        NotifyMode::Socket,
    );
    h.proc_.set_meminfo(64 * GIB, 12 * GIB);
    let mut pages = 1_000_000u64;
    for t in 0..120u64 {
        let now = Duration::from_secs(10 + t);
        core.poll(now, Trigger::Tick);
        while let Ok(Reply::Notify { seq, .. }) = rx.try_recv() {
            pages -= 2048; // 8 MiB
            h.proc_.add(100, 1, "honest", 500, pages);
            core.handle(
                7,
                &peer,
                Request::Reclaimed {
                    pid: None,
                    seq: Some(seq),
                    bytes: 8 << 20,
                    duration_ms: 1,
                    ok: true,
                },
                now,
            );
        }
    }
    let st = core.status_json();
    assert!(st["processes"][0]["reclaim_reports"].as_u64().unwrap() >= 40);
    assert_eq!(st["processes"][0]["reclaim_unmatched"], false);
}

fn pod_process(pid: Pid, class: Class, notify: NotifyMode, uid: &str) -> PodProcess {
    PodProcess {
        pid,
        class,
        name: format!("ns/{uid}"),
        notify,
        expected_reclaim_bytes: Some(64 << 20),
        pod_uid: uid.into(),
    }
}

/// Kubernetes mode's pods as registrations: registered as their pods say, notified
/// like registered processes (a signal only to a process with handlers), never
/// killed by M3's rule (the pod is evicted through the API instead), removed when
/// the pod goes; a client's own registration is left alone.
#[test]
fn pods_are_registrations_notified_as_their_annotations_say_and_never_killed_by_pid() {
    let mut h = harness(|c| c.m3.kill_after_s = 0);
    h.proc_.add(100, 1, "etl", 100, 2_000_000);
    h.proc_.add(101, 100, "etl-worker", 110, 1_000_000);
    h.proc_.add(200, 1, "cache", 200, 1_000_000);
    h.proc_.add(300, 1, "cache-plain", 300, 1_000_000);
    h.proc_.drop_handlers(300);
    h.proc_.add(400, 1, "self-registered", 400, 1_000);
    register(
        &mut h.core,
        1,
        &ROOT,
        Some(400),
        Class::Elastic,
        NotifyMode::Socket,
    );
    let pods = vec![
        pod_process(100, Class::Be, NotifyMode::None, "be-pod"),
        pod_process(200, Class::Elastic, NotifyMode::Signal, "cache-pod"),
        pod_process(300, Class::Elastic, NotifyMode::Signal, "plain-pod"),
        pod_process(400, Class::Be, NotifyMode::None, "self-pod"),
    ];
    h.core.sync_pod_registrations(&pods);
    let reg: Vec<(Pid, Class, NotifyMode, Option<String>)> = h
        .core
        .registry()
        .iter()
        .map(|e| (e.pid, e.class, e.notify, e.pod_uid.clone()))
        .collect();
    assert_eq!(
        reg,
        vec![
            (100, Class::Be, NotifyMode::None, Some("be-pod".into())),
            (
                200,
                Class::Elastic,
                NotifyMode::Signal,
                Some("cache-pod".into())
            ),
            // No handlers: the first signal would kill it.
            (
                300,
                Class::Elastic,
                NotifyMode::None,
                Some("plain-pod".into())
            ),
            // The client's registration stands.
            (400, Class::Elastic, NotifyMode::Socket, None),
        ]
    );
    // Yellow: the elastic pod with handlers is signalled.
    h.proc_.set_meminfo(64 * GIB, 13 * GIB);
    h.core.poll(Duration::from_secs(10), Trigger::Tick);
    assert!(
        h.act.calls().contains(&ActuatorCall::Signal {
            pid: 200,
            sig: libc::SIGRTMIN() + 1
        }),
        "{:?}",
        h.act.calls()
    );
    assert!(!h
        .act
        .calls()
        .iter()
        .any(|c| matches!(c, ActuatorCall::Signal { pid: 300, .. })));
    // Above top past kill_after: M3's rule picks the BE pod's process, and nothing is
    // killed by pid.
    h.proc_.set_meminfo(64 * GIB, GIB);
    for s in 0..5 {
        h.core.poll(Duration::from_secs(20 + s), Trigger::Tick);
    }
    assert!(
        !h.act
            .calls()
            .iter()
            .any(|c| matches!(c, ActuatorCall::Kill { .. })),
        "{:?}",
        h.act.calls()
    );
    // The pods go: their registrations with them, the client's stays.
    h.core.sync_pod_registrations(&[]);
    let left: Vec<Pid> = h.core.registry().iter().map(|e| e.pid).collect();
    assert_eq!(left, [400]);
}

/// A fake memory cgroup of `version` at `dir` holding `used` bytes, with the kernel's
/// files (the v2 ones as the guest of scripts/v2bed printed them).
fn fake_group(dir: &Path, version: u8, used: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let w = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
    if version == 2 {
        w("memory.current", format!("{used}\n"));
        w("memory.max", "max\n".into());
        w(
            "memory.stat",
            format!("anon {used}\nfile 0\ninactive_file 0\nactive_file 0\n"),
        );
        set_events(dir, 2, [0; 5]);
    } else {
        w("memory.usage_in_bytes", format!("{used}\n"));
        w("memory.limit_in_bytes", "9223372036854771712\n".into());
        w(
            "memory.stat",
            format!("rss {used}\ncache 0\ninactive_file 0\nactive_file 0\n"),
        );
        set_events(dir, 1, [0; 5]);
    }
}

/// Writes a group's event counters `[low, high, max, oom, oom_kill]`: v2
/// `memory.events`; v1 `memory.failcnt` (max) and `memory.oom_control` (oom_kill).
fn set_events(dir: &Path, version: u8, [low, high, max, oom, oom_kill]: [u64; 5]) {
    if version == 2 {
        std::fs::write(
            dir.join("memory.events"),
            format!("low {low}\nhigh {high}\nmax {max}\noom {oom}\noom_kill {oom_kill}\noom_group_kill 0\n"),
        )
        .unwrap();
    } else {
        std::fs::write(dir.join("memory.failcnt"), format!("{max}\n")).unwrap();
        std::fs::write(
            dir.join("memory.oom_control"),
            format!("oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n"),
        )
        .unwrap();
    }
}

/// The value of one series of the exposition text, if it is there.
fn series(text: &str, name_and_labels: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

/// `memcolo_cgroup_memory_events_total` on a cgroup scope of either version: the
/// scope's events and those of the groups of LC and BE processes, counted from the
/// first poll; v2 has all five counters, v1 only max and oom_kill.
#[test]
fn memory_events_of_the_scope_and_class_groups_are_counted_in_metrics() {
    for version in [2u8, 1] {
        let h = harness(|_| {});
        let cg = h._dir.path().join("cgroup");
        let scope_dir = cg.join("node");
        fake_group(&scope_dir, version, GIB);
        fake_group(&scope_dir.join("lc"), version, GIB / 4);
        fake_group(&scope_dir.join("be"), version, GIB / 2);
        // A BE group nested in the BE group: counted once, through its parent.
        fake_group(&scope_dir.join("be").join("inner"), version, GIB / 4);
        let self_dir = h.proc_.root.join("self");
        std::fs::create_dir_all(&self_dir).unwrap();
        let (mount, line) = if version == 2 {
            (format!("cgroup2 {} cgroup2 rw 0 0\n", cg.display()), "0::")
        } else {
            (
                format!("cgroup {} cgroup rw,memory 0 0\n", cg.display()),
                "4:memory:",
            )
        };
        std::fs::write(self_dir.join("mounts"), mount).unwrap();
        for (pid, group) in [
            (100, "/node/lc"),
            (200, "/node/be"),
            (201, "/node/be/inner"),
            (300, "/"),
        ] {
            h.proc_.add(pid, 1, "job", pid as u64, 10);
            std::fs::write(
                h.proc_.root.join(pid.to_string()).join("cgroup"),
                format!("{line}{group}\n"),
            )
            .unwrap();
        }
        let metrics = Arc::new(Metrics::new());
        let mut core = Core::new(
            h.cfg.clone(),
            Scope::Cgroup(memcolo_linux::cgroup::MemoryCgroup::open(&scope_dir).unwrap()),
            Box::new(Shared::default()),
            Box::new(Watched::default()),
            Box::new(memcolo_linux::fake::FakeProver {
                procfs: ProcFs::new(h.cfg.procfs.clone()),
            }),
            metrics.clone(),
            EventLog::off(),
        )
        .unwrap();
        for (pid, class) in [
            (100, Class::Lc),
            (200, Class::Be),
            (201, Class::Be),
            (300, Class::Be),
        ] {
            let r = register(&mut core, 1, &ROOT, Some(pid), class, NotifyMode::None);
            assert!(matches!(r, Reply::Registered { .. }), "{r:?}");
        }
        // Events before the first poll are not the agent's to count.
        set_events(&scope_dir.join("be"), version, [1, 1, 1, 1, 1]);
        core.poll(Duration::from_secs(1), Trigger::Tick);
        let t = metrics.render();
        let key = |g: &str, e: &str| {
            format!("memcolo_cgroup_memory_events_total{{event=\"{e}\",group=\"{g}\"}}")
        };
        assert_eq!(series(&t, &key("be", "max")), Some(0), "v{version}: {t}");
        set_events(&scope_dir, version, [0, 0, 7, 0, 1]);
        set_events(&scope_dir.join("lc"), version, [3, 0, 0, 0, 0]);
        set_events(&scope_dir.join("be"), version, [1, 41, 6, 2, 2]);
        core.poll(Duration::from_secs(2), Trigger::Tick);
        let t = metrics.render();
        let want: &[(&str, &str, Option<u64>)] = if version == 2 {
            &[
                ("scope", "max", Some(7)),
                ("scope", "oom_kill", Some(1)),
                ("lc", "low", Some(3)),
                ("lc", "high", Some(0)),
                ("be", "high", Some(40)),
                ("be", "max", Some(5)),
                ("be", "oom", Some(1)),
                ("be", "oom_kill", Some(1)),
                ("be", "low", Some(0)),
            ]
        } else {
            &[
                ("scope", "max", Some(7)),
                ("scope", "oom_kill", Some(1)),
                ("lc", "max", Some(0)),
                ("lc", "low", None),
                ("be", "high", None),
                ("be", "max", Some(5)),
                ("be", "oom", None),
                ("be", "oom_kill", Some(1)),
            ]
        };
        for (g, e, v) in want {
            assert_eq!(series(&t, &key(g, e)), *v, "v{version} {g} {e}: {t}");
        }
        assert_eq!(series(&t, &key("elastic", "max")), None, "v{version}: {t}");
    }
}

/// A fake cgroup tree below the harness's directory, mounted (in the fake procfs's
/// `self/mounts`) as cgroup2 or the v1 memory hierarchy, with a scope group `node`;
/// `place` puts fake process `pid` in group `rel` (its `/proc/PID/cgroup` and the
/// group's `cgroup.procs`).
struct FakeCgroups {
    mount: PathBuf,
    version: u8,
    proc_root: PathBuf,
}

impl FakeCgroups {
    fn new(h: &Harness, version: u8) -> FakeCgroups {
        let mount = h._dir.path().join("cgroup");
        let self_dir = h.proc_.root.join("self");
        std::fs::create_dir_all(&self_dir).unwrap();
        let line = if version == 2 {
            format!("cgroup2 {} cgroup2 rw 0 0\n", mount.display())
        } else {
            format!("cgroup {} cgroup rw,memory 0 0\n", mount.display())
        };
        std::fs::write(self_dir.join("mounts"), line).unwrap();
        FakeCgroups {
            mount,
            version,
            proc_root: h.proc_.root.clone(),
        }
    }
    fn group(&self, rel: &str, used: u64) -> PathBuf {
        let d = self.mount.join(rel);
        fake_group(&d, self.version, used);
        if self.version == 2 {
            std::fs::write(d.join("memory.high"), "max\n").unwrap();
        }
        std::fs::write(d.join("cgroup.procs"), "").unwrap();
        d
    }
    fn place(&self, pid: Pid, rel: &str) {
        let prefix = if self.version == 2 {
            "0::"
        } else {
            "4:memory:"
        };
        std::fs::write(
            self.proc_root.join(pid.to_string()).join("cgroup"),
            format!("{prefix}/{rel}\n"),
        )
        .unwrap();
        let procs = self.mount.join(rel).join("cgroup.procs");
        let mut text = std::fs::read_to_string(&procs).unwrap_or_default();
        text.push_str(&format!("{pid}\n"));
        std::fs::write(procs, text).unwrap();
    }
    fn core(&self, h: &Harness, metrics: &Arc<Metrics>) -> Core {
        Core::new(
            h.cfg.clone(),
            Scope::Cgroup(
                memcolo_linux::cgroup::MemoryCgroup::open(self.mount.join("node")).unwrap(),
            ),
            Box::new(Shared::default()),
            Box::new(Watched::default()),
            Box::new(memcolo_linux::fake::FakeProver {
                procfs: ProcFs::new(h.cfg.procfs.clone()),
            }),
            metrics.clone(),
            EventLog::off(),
        )
        .unwrap()
    }
}

fn read_trimmed(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap().trim().to_string()
}

/// `m3.be_memory_high` on a v2 scope: entering red caps the memory.high of the group
/// holding only BE processes at its usage, and not that of a group shared with an LC
/// process or holding an unregistered process; green restores the previous value; a
/// cap left by an agent that died is restored at the next start; a v1 scope and the
/// option turned off leave memory.high alone.
#[test]
fn red_zone_caps_be_groups_memory_high_on_v2_and_green_restores_it() {
    const MIB: u64 = 1 << 20;
    let h = harness(|_| {});
    let cgs = FakeCgroups::new(&h, 2);
    let node = cgs.group("node", 512 * MIB);
    std::fs::write(node.join("memory.max"), format!("{}\n", 1024 * MIB)).unwrap();
    let be = cgs.group("node/be", 300 * MIB);
    let mixed = cgs.group("node/mixed", 100 * MIB);
    let stranger = cgs.group("node/stranger", 100 * MIB);
    // The BE group's own earlier memory.high: restored as it was.
    std::fs::write(be.join("memory.high"), format!("{}\n", 2048 * MIB)).unwrap();
    for (pid, rel) in [
        (100, "node/lc"),
        (200, "node/be"),
        (201, "node/be"),
        (300, "node/mixed"),
        (301, "node/mixed"),
        (400, "node/stranger"),
        (401, "node/stranger"),
    ] {
        if rel == "node/lc" {
            cgs.group(rel, 100 * MIB);
        }
        h.proc_.add(pid, 1, "job", pid as u64, 10);
        cgs.place(pid, rel);
    }
    // 201 is a child of 200 (one job); 401 is nobody's: not registered.
    h.proc_.add(201, 200, "job", 201, 10);
    let metrics = Arc::new(Metrics::new());
    let mut core = cgs.core(&h, &metrics);
    for (pid, class) in [
        (100, Class::Lc),
        (200, Class::Be),
        (300, Class::Be),
        (301, Class::Lc),
        (400, Class::Be),
    ] {
        let r = register(&mut core, 1, &ROOT, Some(pid), class, NotifyMode::None);
        assert!(matches!(r, Reply::Registered { .. }), "{r:?}");
    }
    // Used memory in the middle of a zone of the thresholds in force (M3 adapts them).
    let zone_used = |core: &Core, zone: &str| {
        let t = core.monitor().thresholds();
        match zone {
            "green" => t.low_bytes / 2,
            "yellow" => (t.low_bytes + t.high_bytes) / 2,
            _ => (t.high_bytes + t.top_bytes) / 2,
        }
    };
    let set_used = |bytes: u64| {
        std::fs::write(node.join("memory.current"), format!("{bytes}\n")).unwrap();
        std::fs::write(
            node.join("memory.stat"),
            format!("anon {bytes}\nfile 0\ninactive_file 0\nactive_file 0\n"),
        )
        .unwrap();
    };
    set_used(zone_used(&core, "green"));
    core.poll(Duration::from_secs(1), Trigger::Tick);
    assert_eq!(
        read_trimmed(&be.join("memory.high")),
        (2048 * MIB).to_string(),
        "green: untouched"
    );
    set_used(zone_used(&core, "red"));
    core.poll(Duration::from_secs(2), Trigger::Tick);
    assert_eq!(
        read_trimmed(&be.join("memory.high")),
        (300 * MIB).to_string(),
        "red: capped at usage"
    );
    assert_eq!(
        read_trimmed(&mixed.join("memory.high")),
        "max",
        "a group with an LC process"
    );
    assert_eq!(
        read_trimmed(&stranger.join("memory.high")),
        "max",
        "a group with an unregistered process"
    );
    assert!(
        metrics.render().contains("memcolo_be_memory_high_groups 1"),
        "{}",
        metrics.render()
    );
    let journal = h.cfg.state_dir.join("be-memory-high.json");
    assert!(journal.exists());
    // Still red, the group's usage fell (Hermit's reclaim): the cap follows it down.
    std::fs::write(be.join("memory.current"), format!("{}\n", 280 * MIB)).unwrap();
    core.poll(Duration::from_secs(2), Trigger::Tick);
    assert_eq!(
        read_trimmed(&be.join("memory.high")),
        (280 * MIB).to_string(),
        "red: follows usage down"
    );
    std::fs::write(be.join("memory.current"), format!("{}\n", 300 * MIB)).unwrap();
    // Yellow keeps the cap; green restores it.
    set_used(zone_used(&core, "yellow"));
    core.poll(Duration::from_secs(3), Trigger::Tick);
    assert_eq!(
        read_trimmed(&be.join("memory.high")),
        (280 * MIB).to_string(),
        "yellow: kept"
    );
    set_used(zone_used(&core, "green"));
    core.poll(Duration::from_secs(4), Trigger::Tick);
    assert_eq!(
        read_trimmed(&be.join("memory.high")),
        (2048 * MIB).to_string(),
        "green: restored"
    );
    assert!(!journal.exists());
    // Capped again, then the agent dies: its successor restores the cap at start.
    set_used(zone_used(&core, "red"));
    core.poll(Duration::from_secs(5), Trigger::Tick);
    assert_eq!(
        read_trimmed(&be.join("memory.high")),
        (300 * MIB).to_string()
    );
    assert!(core.flush_state());
    drop(core);
    let core = cgs.core(&h, &metrics);
    assert_eq!(
        read_trimmed(&be.join("memory.high")),
        (2048 * MIB).to_string(),
        "restored at start"
    );
    assert!(!journal.exists());
    // A clean shutdown restores too.
    let mut core = core;
    core.poll(Duration::from_secs(6), Trigger::Tick);
    assert_eq!(
        read_trimmed(&be.join("memory.high")),
        (300 * MIB).to_string()
    );
    core.shutdown();
    assert_eq!(
        read_trimmed(&be.join("memory.high")),
        (2048 * MIB).to_string(),
        "restored at shutdown"
    );
    drop(core);
    // An LC process joins a capped group: the cap is lifted at the next poll.
    let mut core = cgs.core(&h, &metrics);
    set_used(zone_used(&core, "red"));
    core.poll(Duration::from_secs(7), Trigger::Tick);
    assert_eq!(
        read_trimmed(&be.join("memory.high")),
        (300 * MIB).to_string()
    );
    h.proc_.add(500, 1, "lc", 500, 10);
    cgs.place(500, "node/be");
    register(&mut core, 1, &ROOT, Some(500), Class::Lc, NotifyMode::None);
    core.poll(Duration::from_secs(8), Trigger::Tick);
    assert_eq!(
        read_trimmed(&be.join("memory.high")),
        (2048 * MIB).to_string(),
        "no longer BE only: restored"
    );
    drop(core);

    // The option off: nothing capped.
    let h = harness(|c| c.m3.be_memory_high = false);
    let cgs = FakeCgroups::new(&h, 2);
    let node = cgs.group("node", 900 * MIB);
    std::fs::write(node.join("memory.max"), format!("{}\n", 1024 * MIB)).unwrap();
    let be = cgs.group("node/be", 300 * MIB);
    h.proc_.add(200, 1, "job", 200, 10);
    cgs.place(200, "node/be");
    let mut core = cgs.core(&h, &Arc::new(Metrics::new()));
    register(&mut core, 1, &ROOT, Some(200), Class::Be, NotifyMode::None);
    core.poll(Duration::from_secs(1), Trigger::Tick);
    assert_eq!(core.monitor().zone(), memcolo_policy::m3::Zone::Red);
    assert_eq!(read_trimmed(&be.join("memory.high")), "max", "off");
}
