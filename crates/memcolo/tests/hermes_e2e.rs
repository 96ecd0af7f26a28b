//! Hermes' file-cache advice against hostile BE tenants, on the real kernel: a real
//! `memcolo agent` manages a scratch memory cgroup scope (v1 or v2) whose used memory is
//! above `adv_thr`, and unprivileged tenants (uids 61200-61299, dropped to with
//! `setpriv`) registered as BE try to turn the root agent's advice against it or
//! against other users:
//!
//! - a FIFO swapped in at the path of the tenant's open file (a `renameat2`
//!   `RENAME_EXCHANGE` loop, or a bind mount in the tenant's own user and mount
//!   namespaces) must not stall the agent: `status` and `/metrics` keep answering
//!   and polls go on;
//! - a symlink swapped in towards a root-only (0600) file must not get that file's
//!   page cache dropped;
//! - files the tenant holds but does not own (another user's, root's) are never
//!   advised, while its own files, open or only mapped, are.
//!
//! Needs root, `setpriv`, `/usr/bin/python3` and a memory cgroup, v1 or v2; without
//! them the tests fail saying why. Runs in the cgroup v2 guest too
//! (`scripts/v2bed/tests`). Waits are bounded and counted in polls;
//! nothing depends on the machine's speed.

mod common;

use common::agent::{Agent, AgentCommand};

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const PYTHON: &str = "/usr/bin/python3";
/// How long one `status` or `/metrics` request may take before the agent is declared
/// stalled (generous: a live agent answers in milliseconds).
const ANSWER_LIMIT: Duration = Duration::from_secs(30);

/// Prelude of every tenant script: ctypes for the system calls Python lacks, and
/// 48 MiB of anonymous memory so that the scope's used memory is above adv_thr.
const PRELUDE: &str = r#"
import ctypes, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
AT_FDCWD, RENAME_EXCHANGE = -100, 2
ballast = b"\x01" * (48 << 20)
def write_file(path, mib):
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(b"\x5a" * (1 << 20))
        f.flush()
        os.fsync(f.fileno())
def ready():
    print("ready", os.getpid(), flush=True)
"#;

/// An agent on a scratch scope, the tenants it manages, and a work directory;
/// everything is killed and removed on drop.
struct Rig {
    scope: PathBuf,
    work: PathBuf,
    metrics_addr: String,
    agent: Option<Agent>,
    /// The tenants.
    children: Vec<Child>,
    _tmp: tempfile::TempDir,
}

impl Rig {
    fn start(tag: &str) -> Rig {
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "these tests need root (the agent runs as root)"
        );
        assert!(Path::new(PYTHON).exists(), "{PYTHON} is needed");
        assert!(
            Command::new("setpriv")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success()),
            "setpriv (util-linux) is needed"
        );
        let exe = env!("CARGO_BIN_EXE_memcolo");
        let tmp = tempfile::tempdir().unwrap();
        let id = format!("memcolo-hermes-{tag}-{}", std::process::id());
        let scope_cg = memcolo_testkit::own_memory_cgroup()
            .create_child(&id)
            .unwrap();
        let scope = scope_cg.path().to_path_buf();
        let work = PathBuf::from("/var/tmp").join(&id);
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir(&work).unwrap();
        std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut rig = Rig {
            scope: scope.clone(),
            work,
            metrics_addr: {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().to_string()
            },
            agent: None,
            children: vec![],
            _tmp: tmp,
        };
        scope_cg
            .write_limit(memcolo_linux::cgroup::Limit::Bytes(512 * MIB))
            .unwrap();
        // adv_thr = 5 % of 512 MiB = 25.6 MiB: every tenant's ballast is above it.
        // Hermes' advice alone: Hermit reclaim (on by default) drops BE page cache
        // too, and would race the advice this test follows.
        let agent = AgentCommand::new(exe, rig._tmp.path())
            .args(["--no-reclaim", "--poll-ms", "200", "--kill-after-s", "3600"])
            .args(["--adv-thr-ratio", "0.05"])
            .metrics(&rig.metrics_addr)
            .scope(&scope)
            .start();
        rig.agent = Some(agent);
        rig
    }

    /// The running agent.
    fn agent(&self) -> &Agent {
        self.agent.as_ref().expect("the rig's agent runs")
    }

    /// A directory of the work directory owned by `uid`.
    fn tenant_dir(&self, name: &str, uid: u32) -> PathBuf {
        let d = self.work.join(name);
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(uid), Some(uid)).unwrap();
        d
    }

    /// Runs `script` (after [`PRELUDE`]) as `uid` inside the scope, waits for its
    /// `ready` line and registers it as BE; returns its pid.
    fn tenant(&mut self, uid: u32, script: &str, args: &[&Path]) -> i32 {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec {} --reuid={uid} --regid={uid} --clear-groups {PYTHON} -u -c \"$0\" \"$@\"",
                self.scope.display(),
                setpriv().display()
            ))
            .arg(format!("{PRELUDE}\n{script}"))
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        self.children.push(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("tenant did not get ready");
        let pid: i32 = line
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("tenant said {line:?}"))
            .parse()
            .unwrap();
        let reply = self.request(&format!(
            r#"{{"v":1,"type":"register","pid":{pid},"class":"be","name":"tenant-{uid}","notify":"none"}}"#
        ));
        assert_eq!(reply["type"], "registered", "{reply}");
        pid
    }

    /// One request line on a fresh connection; panics when no answer comes within
    /// [`ANSWER_LIMIT`] (the agent's main loop is stuck).
    fn request(&self, line: &str) -> Value {
        let mut s = UnixStream::connect(&self.agent().socket).unwrap();
        s.set_read_timeout(Some(ANSWER_LIMIT)).unwrap();
        s.set_write_timeout(Some(ANSWER_LIMIT)).unwrap();
        s.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut r = BufReader::new(s);
        let mut answer = String::new();
        match r.read_line(&mut answer) {
            Ok(n) if n > 0 => serde_json::from_str(&answer).unwrap(),
            other => panic!("the agent did not answer `{line}` within {ANSWER_LIMIT:?}: {other:?}"),
        }
    }

    fn status(&self) -> Value {
        let r = self.request(r#"{"v":1,"type":"status"}"#);
        r["status"].clone()
    }

    /// `memcolo_polls_total` summed over triggers, from `GET /metrics`; panics when
    /// the endpoint does not answer within [`ANSWER_LIMIT`].
    fn metrics_polls(&self) -> u64 {
        let mut s = std::net::TcpStream::connect(&self.metrics_addr).unwrap();
        s.set_read_timeout(Some(ANSWER_LIMIT)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        if let Err(e) = s.read_to_string(&mut body) {
            panic!("/metrics did not answer within {ANSWER_LIMIT:?}: {e}");
        }
        body.lines()
            .filter(|l| l.starts_with("memcolo_polls_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Waits until `n` more polls ran, asking `status` and `/metrics` all along.
    fn polls_go_on(&self, n: u64) {
        let start = self.status()["polls"].as_u64().unwrap();
        let t0 = Instant::now();
        loop {
            let polls = self.status()["polls"].as_u64().unwrap();
            let from_metrics = self.metrics_polls();
            if polls >= start + n && from_metrics >= start + n {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "polls stopped at {polls} (metrics {from_metrics}); started at {start}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.agent().event_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn dropped_paths(&self) -> Vec<String> {
        self.events()
            .iter()
            .filter(|e| e["event"] == "file_cache_dropped")
            .filter_map(|e| e["path"].as_str().map(String::from))
            .collect()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        drop(self.agent.take());
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        common::empty_and_remove_cgroup(&self.scope, &[]);
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// util-linux's `setpriv`, found in `PATH`: by its path, because a busybox `sh` (the
/// cgroup v2 guest's) runs its own `setpriv` applet, which lacks `--reuid`, before
/// looking in `PATH`.
fn setpriv() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("setpriv"))
                .find(|f| f.is_file())
        })
        .expect("setpriv (util-linux) is needed")
}

/// Writes `mib` MiB as root, mode `mode`, owned by `uid`, synced (so its page cache
/// is clean and droppable) and left in the page cache.
fn root_file(path: &Path, mib: u64, mode: u32, uid: u32) {
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0x33u8; MIB as usize];
    for _ in 0..mib {
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
    let _ = std::fs::read(path).unwrap();
}

/// Bytes of `path` in the page cache, from `cachestat(2)` (or `mincore(2)`).
fn resident(path: &Path) -> u64 {
    memcolo_linux::filecache::resident_bytes(path).unwrap()
}

#[test]
fn a_fifo_exchanged_in_at_a_be_files_path_does_not_stall_the_agent() {
    let mut rig = Rig::start("fifo");
    let dir = rig.tenant_dir("t", 61200);
    rig.tenant(
        61200,
        r#"
d = sys.argv[1]
write_file(d + "/data", 4)
f = open(d + "/data", "rb"); f.read()
os.mkfifo(d + "/fifo")
ready()
a, b = (d + "/data").encode(), (d + "/fifo").encode()
while True:
    libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
"#,
        &[&dir],
    );
    rig.polls_go_on(30);
    // The advice went through the tenant's files all along: its own file was
    // reached through its descriptor, whatever sits at its path.
    common::wait_for(
        "the tenant's own file advised",
        Duration::from_secs(120),
        || !rig.dropped_paths().is_empty(),
    );
}

#[test]
fn a_fifo_bind_mounted_in_a_tenants_user_namespace_does_not_stall_the_agent() {
    let mut rig = Rig::start("userns");
    let dir = rig.tenant_dir("t", 61201);
    rig.tenant(
        61201,
        r#"
d = sys.argv[1]
write_file(d + "/real", 4)
os.mkfifo(d + "/fifo")
if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
    sys.exit("unshare: errno %d" % ctypes.get_errno())
# In the tenant's namespaces only, its regular file covers the FIFO's path.
if libc.mount((d + "/real").encode(), (d + "/fifo").encode(), None, 4096, None) != 0:  # MS_BIND
    sys.exit("mount: errno %d" % ctypes.get_errno())
f = open(d + "/fifo", "rb"); f.read()
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
ready()
while True:
    time.sleep(1)
"#,
        &[&dir],
    );
    rig.polls_go_on(30);
    // The advice went through the tenant's files all along: its own file was
    // reached through its descriptor, whatever sits at its path.
    common::wait_for(
        "the tenant's own file advised",
        Duration::from_secs(120),
        || !rig.dropped_paths().is_empty(),
    );
}

#[test]
fn a_symlink_exchanged_in_towards_a_root_only_file_leaves_its_cache_alone() {
    let mut rig = Rig::start("symlink");
    let secret_dir = rig.work.join("root");
    std::fs::create_dir(&secret_dir).unwrap();
    let secret = secret_dir.join("secret");
    root_file(&secret, 16, 0o600, 0);
    let before = resident(&secret);
    assert!(before >= 8 * MIB, "the root file is not cached: {before}");
    let dir = rig.tenant_dir("t", 61202);
    rig.tenant(
        61202,
        r#"
d, secret = sys.argv[1], sys.argv[2]
write_file(d + "/own", 2)
f = open(d + "/own", "rb"); f.read()
os.symlink(secret, d + "/link")
ready()
a, b = (d + "/own").encode(), (d + "/link").encode()
while True:
    libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
"#,
        &[&dir, &secret],
    );
    rig.polls_go_on(60);
    let after = resident(&secret);
    assert!(
        after >= before - MIB,
        "the root-only file's page cache went from {before} to {after} bytes; events: {:?}",
        rig.events()
    );
}

#[test]
fn files_the_be_tenant_does_not_own_are_never_advised_its_own_are() {
    let mut rig = Rig::start("owner");
    let other_dir = rig.tenant_dir("other", 61204);
    let other = other_dir.join("db");
    root_file(&other, 16, 0o644, 61204);
    let shared = rig.work.join("shared.lib");
    root_file(&shared, 16, 0o644, 0);
    let dir = rig.tenant_dir("t", 61203);
    let own = dir.join("own");
    let mapped = dir.join("mapped");
    rig.tenant(
        61203,
        r#"
d, other, shared = sys.argv[1], sys.argv[2], sys.argv[3]
write_file(d + "/own", 16)
write_file(d + "/mapped", 8)
held = [open(p, "rb") for p in (d + "/own", other, shared)]
for f in held:
    f.read()
with open(d + "/mapped", "rb") as f:
    f.read()
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)  # mapped, no fd left
ready()
while True:
    time.sleep(1)
"#,
        &[&dir, &other, &shared],
    );
    common::wait_for(
        "the tenant's own files advised",
        Duration::from_secs(120),
        || {
            let d = rig.dropped_paths();
            d.iter().any(|p| Path::new(p) == own) && d.iter().any(|p| Path::new(p) == mapped)
        },
    );
    rig.polls_go_on(10);
    assert!(resident(&own) < 8 * MIB, "own file still cached");
    assert!(resident(&mapped) < 4 * MIB, "mapped file still cached");
    for f in [&other, &shared] {
        assert!(
            resident(f) >= 15 * MIB,
            "{} lost its page cache; events: {:?}",
            f.display(),
            rig.events()
        );
        assert!(
            !rig.dropped_paths()
                .iter()
                .any(|p| Path::new(p) == f.as_path()),
            "{} advised",
            f.display()
        );
    }
    // The log names each advised file by dev/ino as well as by path.
    let e = rig
        .events()
        .into_iter()
        .find(|e| e["event"] == "file_cache_dropped")
        .unwrap();
    assert!(e["dev"].is_u64() && e["ino"].is_u64(), "{e}");
}
