//! The agent socket against an unprivileged tenant (docs/security.md): each test is
//! an attack by a process running as an unused uid, against a real `memcolo agent`.
//!
//! - a connection whose process exited (its pid reused by a root process, forced with
//!   `/proc/sys/kernel/ns_last_pid`) cannot register, and so signal or kill, that
//!   root process;
//! - a registered BE process that execs a set-user-ID program, or starts one, does not
//!   get that program killed (a plain BE process registered beside them is, so the
//!   kill path provably ran);
//! - one user holding more connections than its share locks out neither root nor
//!   another user.
//!
//! Needs root (for `setuid` and `ns_last_pid`) and, for the kill test, the cgroup v1
//! memory controller: without them each test fails saying what it lacks. Every
//! wait is bounded; nothing depends on the machine's speed. `MEMCOLO_EXE` runs the
//! tests against another build of `memcolo` (how they were shown to fail before
//! the fixes).

mod common;

use common::agent::AgentCommand;

use common::wait_for;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Unused uids the attacks run as (no passwd entry is needed for setuid).
const ATTACKER: u32 = 61_001;
const OTHER_USER: u32 = 61_002;
const PYTHON: &str = "/usr/bin/python3";

fn exe() -> String {
    std::env::var("MEMCOLO_EXE").unwrap_or_else(|_| env!("CARGO_BIN_EXE_memcolo").to_string())
}

fn require_root() {
    common::require_root();
    assert!(Path::new(PYTHON).exists(), "{PYTHON} is needed");
}

/// A running agent in its own directory (socket, state, config), killed on drop.
struct Agent {
    running: common::agent::Agent,
    dir: tempfile::TempDir,
}

impl Agent {
    fn start(config: &str) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        // Other users must reach the socket's directory (as /run/memcolo).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = dir.path().join("agent.toml");
        std::fs::write(&cfg, config).unwrap();
        let running = AgentCommand::new(&exe(), dir.path())
            .config(&cfg)
            .stderr(Stdio::null())
            .start();
        Agent { running, dir }
    }

    fn socket(&self) -> PathBuf {
        self.running.socket.clone()
    }

    /// `memcolo status --json` as root.
    fn status(&self) -> Value {
        common::agent_status(&exe(), &self.socket())
    }

    fn registered(&self) -> Vec<i64> {
        self.status()["processes"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p["pid"].as_i64()).collect())
            .unwrap_or_default()
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.running.event_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// Children killed on drop.
#[derive(Default)]
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A process the test did not start itself (a grandchild), killed through a pidfd
/// opened while it was known to be the one wanted.
struct Reaped(std::os::fd::OwnedFd);

impl Drop for Reaped {
    fn drop(&mut self) {
        use std::os::fd::AsFd;
        let _ = memcolo_linux::pidfd::pidfd_send_signal(self.0.as_fd(), libc::SIGKILL);
    }
}

/// A command that runs as `uid` (and gid `uid`), with no supplementary groups.
fn as_user(program: &str, uid: u32) -> Command {
    let mut c = Command::new(program);
    // std drops supplementary groups when root sets a uid without naming any.
    c.uid(uid).gid(uid);
    c
}

/// One request line and its answer, with a bounded wait.
fn call(sock: &Path, line: &str) -> Value {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    let mut r = String::new();
    BufReader::new(&s).read_line(&mut r).unwrap();
    serde_json::from_str(&r).unwrap_or_else(|e| panic!("answer `{r}`: {e}"))
}

/// The first line a child prints on its (piped) standard output.
fn first_line(c: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line
}

fn alive(pid: u32) -> bool {
    // A zombie is dead for this purpose.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
            !after.trim_start().starts_with('Z')
        })
        .unwrap_or(false)
}

fn euid(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1)?.parse().ok())
}

/// The attack of a connection outliving its process: the process connects, forks a
/// child that keeps the socket, and exits; the kernel gives its pid to a root
/// process; the child then asks to register "itself", which the agent resolved to
/// the connector's pid, now the root process — so that the agent would signal or,
/// as BE, kill root's process.
const REUSE: &str = r#"
import os, socket, sys, time
sock, go = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX)
s.connect(sock)
if os.fork() != 0:
    os._exit(0)  # the connector exits; its pid is free for the taking
while not os.path.exists(go):
    time.sleep(0.02)
s.sendall(b'{"v":1,"type":"register","class":"be","notify":"signal"}\n')
print(s.makefile().readline().strip(), flush=True)
"#;

#[test]
fn a_connection_outliving_its_process_cannot_register_the_process_that_reuses_its_pid() {
    require_root();
    let agent = Agent::start("[hermes]\nenabled = false\n");
    let go = agent.dir.path().join("go");
    let mut procs = Procs::default();
    // Up to 50 tries to make the kernel hand the connector's pid to a root process.
    let mut attack = None;
    for _ in 0..50 {
        let mut connector = as_user(PYTHON, ATTACKER)
            .args(["-c", REUSE])
            .arg(agent.socket())
            .arg(&go)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let freed = connector.id();
        let out = connector.stdout.take().unwrap();
        connector.wait().unwrap(); // the connector has exited and is reaped
        std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", freed - 1)).unwrap();
        let victim = Command::new("sleep").arg("600").spawn().unwrap();
        if victim.id() == freed {
            attack = Some((victim, out));
            break;
        }
        procs.0.push(victim);
        std::fs::write(&go, "").unwrap(); // let this try's child finish
        std::thread::sleep(Duration::from_millis(100));
        std::fs::remove_file(&go).unwrap();
    }
    let (victim, out) = attack.expect("the kernel never reused the connector's pid in 50 tries");
    let victim_pid = victim.id();
    procs.0.push(victim);
    assert_eq!(euid(victim_pid), Some(0));
    std::fs::write(&go, "").unwrap();
    let mut answer = String::new();
    BufReader::new(out).read_line(&mut answer).unwrap();
    let answer: Value = serde_json::from_str(&answer)
        .unwrap_or_else(|e| panic!("the attacker's answer `{answer}`: {e}"));
    assert_eq!(
        answer["type"], "error",
        "the agent registered root's process {victim_pid} for a connection of uid {ATTACKER}: {answer}"
    );
    assert_eq!(answer["code"], "permission_denied", "{answer}");
    assert!(!agent.registered().contains(&(victim_pid as i64)));
    assert!(alive(victim_pid));
}

/// Registers itself as BE (no notifications), then becomes what `mode` says:
/// `exec` the set-user-ID program, `child` start it as a child and exec `sleep`,
/// `plain` exec `sleep`.
const BE_JOB: &str = r#"
import os, socket, sys
sock, mode, suid = sys.argv[1], sys.argv[2], sys.argv[3]
s = socket.socket(socket.AF_UNIX)
s.connect(sock)
s.sendall(b'{"v":1,"type":"register","class":"be","notify":"none"}\n')
print(s.makefile().readline().strip(), flush=True)
s.close()
if mode == "child":
    if os.fork() == 0:
        os.execv(suid, [suid, "600"])
if mode == "exec":
    os.execv(suid, [suid, "600"])
os.execv("/usr/bin/sleep", ["sleep", "600"])
"#;

/// The scratch memory cgroup (v1) below this process's own: removed on drop with
/// whatever runs in it.
struct Scratch(PathBuf);

impl Scratch {
    /// `name` tells apart the groups of tests running at once.
    fn new(name: &str, limit_bytes: u64) -> Scratch {
        let own = common::own_v1_memory_cgroup();
        let path = own.join(format!("memcolo-security-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("memory.limit_in_bytes"), limit_bytes.to_string()).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for _ in 0..50 {
            let pids = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
            if pids.trim().is_empty() {
                break;
            }
            for p in pids.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        rmdir_tree(&self.0);
    }
}

/// Removes a cgroup and its child groups, deepest first.
fn rmdir_tree(p: &Path) {
    if let Ok(d) = std::fs::read_dir(p) {
        for e in d.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                rmdir_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(p);
}

#[test]
fn a_be_registration_never_kills_a_set_user_id_program() {
    require_root();
    const MIB: u64 = 1 << 20;
    let scratch = Scratch::new("kill", 256 * MIB);
    // Top of memory at 16 MiB of a scope that a 48 MiB holder keeps above it: after
    // 1 s the M3 monitor kills registered BE processes (rule R5).
    let agent = Agent::start(&format!(
        "scope = \"cgroup:{}\"\npoll_ms = 200\n[m3]\ntop_bytes = {}\nlow_bytes = {}\nhigh_bytes = {}\nkill_after_s = 1\n[hermes]\nenabled = false\n",
        scratch.0.display(),
        16 * MIB,
        8 * MIB,
        12 * MIB
    ));
    let bin = agent.dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let suid = bin.join("suid-sleep");
    std::fs::copy("/usr/bin/sleep", &suid).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let mut procs = Procs::default();
    let mut job = |mode: &str| {
        let mut c = as_user(PYTHON, ATTACKER)
            .args(["-c", BE_JOB])
            .arg(agent.socket())
            .arg(mode)
            .arg(&suid)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let line = first_line(&mut c);
        assert!(line.contains("registered"), "{mode}: {line}");
        let pid = c.id();
        procs.0.push(c);
        pid
    };
    let exec_pid = job("exec");
    let child_parent = job("child");
    let plain = job("plain");
    // The set-user-ID exec happened: the registered pid now runs as root.
    wait_for(
        "the exec of the set-user-ID program",
        Duration::from_secs(10),
        || euid(exec_pid) == Some(0),
    );
    let suid_child = {
        let mut found = None;
        wait_for("the set-user-ID child", Duration::from_secs(10), || {
            found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                let ppid: u32 = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()?;
                (ppid == child_parent && euid(pid) == Some(0)).then_some(pid)
            });
            found.is_some()
        });
        found.unwrap()
    };
    // Nobody reaps the set-user-ID child (its parent is killed): the test ends it.
    let _suid_child_guard = Reaped(memcolo_linux::pidfd::pidfd_open(suid_child as i32).unwrap());
    // Above top: the holder, as root, in the scope. It joins the scope before it
    // starts (a v1 group is charged only for pages touched while in it: moved after
    // its allocation, as a loaded machine once had it, it charged nothing there).
    let holder = Command::new("sh")
        .args([
            "-c",
            &format!(
                "echo $$ > {}/cgroup.procs && exec {PYTHON} -c \"$0\"",
                scratch.0.display()
            ),
            "import sys,time\nb=bytearray(48<<20)\nfor i in range(0,len(b),4096): b[i]=1\nprint('held',flush=True)\ntime.sleep(600)",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    procs.0.push(holder);
    // The plain BE process is killed: the kill path ran.
    wait_for(
        "the kill of the plain BE process",
        Duration::from_secs(30),
        || !alive(plain),
    );
    wait_for(
        "the kill of the parent of the set-user-ID child",
        Duration::from_secs(30),
        || !alive(child_parent),
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        alive(exec_pid),
        "the agent killed pid {exec_pid}, a set-user-ID program exec'd by a BE registration of uid {ATTACKER}"
    );
    assert!(
        alive(suid_child),
        "the agent killed pid {suid_child}, a set-user-ID child of a BE job of uid {ATTACKER}"
    );
    assert!(!agent.registered().contains(&(exec_pid as i64)));
    assert!(agent
        .events()
        .iter()
        .any(|e| e["event"] == "registration_ended" && e["pid"] == exec_pid as i64));
}

/// Opens `n` connections to the socket and holds them until stdin closes; prints how
/// many it got.
const HOLD: &str = r#"
import resource, socket, sys
sock, n = sys.argv[1], int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sock)
    except OSError:
        break
    held.append(s)
print(len(held), flush=True)
sys.stdin.read()
"#;

#[test]
fn one_user_holding_connections_locks_out_neither_root_nor_another_user() {
    require_root();
    let agent = Agent::start("[hermes]\nenabled = false\n");
    let mut procs = Procs::default();
    for _ in 0..2 {
        let mut c = as_user(PYTHON, ATTACKER)
            .args(["-c", HOLD])
            .arg(agent.socket())
            .arg("600")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let line = first_line(&mut c);
        assert_eq!(
            line.trim(),
            "600",
            "the attacker could not open its connections"
        );
        procs.0.push(c);
    }
    // Let the agent take in all 1,200 connections.
    std::thread::sleep(Duration::from_secs(1));
    let ping = r#"{"v":1,"type":"ping"}"#.to_string() + "\n";
    assert_eq!(
        call(&agent.socket(), &ping)["type"],
        "pong",
        "root is locked out"
    );
    let other = as_user(PYTHON, OTHER_USER)
        .args([
            "-c",
            "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.settimeout(10)\ns.connect(sys.argv[1])\ns.sendall(b'{\"v\":1,\"type\":\"ping\"}\\n')\nprint(s.makefile().readline().strip())",
        ])
        .arg(agent.socket())
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&other.stdout);
    assert!(
        answer.contains("pong"),
        "another user is locked out: `{answer}`"
    );
    assert!(agent.status()["polls"].as_u64().is_some());
}

#[test]
fn a_user_makes_cgroups_only_below_its_own_group_with_plain_names_and_few_of_them() {
    require_root();
    let scratch = Scratch::new("cgroup", 256 << 20);
    let agent = Agent::start(&format!(
        "scope = \"cgroup:{}\"\n[limits]\ncgroups_per_uid = 2\n[hermes]\nenabled = false\n",
        scratch.0.display()
    ));
    let ask = |name: &str| -> Value {
        let line = serde_json::json!({"v": 1, "type": "cgroup", "name": name}).to_string();
        let o = as_user(PYTHON, ATTACKER)
            .args([
                "-c",
                "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.settimeout(10)\ns.connect(sys.argv[1])\ns.sendall(sys.argv[2].encode()+b'\\n')\nprint(s.makefile().readline().strip())",
            ])
            .arg(agent.socket())
            .arg(&line)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("answer `{out}`: {e}"))
    };
    for bad in [
        "with space",
        "tab\there",
        &"x".repeat(255),
        ".hidden",
        "..",
        "a/b",
    ] {
        let r = ask(bad);
        assert_eq!(r["code"], "bad_request", "cgroup `{bad}`: {r}");
    }
    let r = ask("job-1");
    let path = PathBuf::from(r["path"].as_str().unwrap_or_else(|| panic!("{r}")));
    assert_eq!(
        path,
        scratch
            .0
            .join(format!("memcolo-uid-{ATTACKER}"))
            .join("job-1")
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(path.join("cgroup.procs")).unwrap().uid(),
        ATTACKER,
        "the user cannot move its process into the group"
    );
    // The limit holds, and asking for a group it already has is no new group.
    assert_eq!(ask("job-2")["type"], "cgroup");
    assert_eq!(ask("job-1")["type"], "cgroup");
    assert_eq!(ask("job-3")["code"], "limit_exceeded");
    // No group was made outside the user's own.
    let top: Vec<String> = std::fs::read_dir(&scratch.0)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(top, vec![format!("memcolo-uid-{ATTACKER}")]);
}

/// Run in a new pid namespace (as root, with no user namespace: a container's root,
/// which is uid 0 on the host): names the host's process `argv[2]`, then a child of
/// its own (pid 2 in its namespace), then itself; prints each answer on a line.
const IN_PIDNS: &str = r#"
import os, socket, sys, time
sock, host_pid = sys.argv[1], int(sys.argv[2])
assert os.getpid() == 1, os.getpid()
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sock)
f = s.makefile()
def ask(line):
    s.sendall(line.encode() + b'\n')
    print(f.readline().strip(), flush=True)
ask('{"v":1,"type":"register","pid":%d,"class":"be","notify":"none"}' % host_pid)
ask('{"v":1,"type":"register","pid":%d,"class":"be","notify":"none"}' % child)
ask('{"v":1,"type":"register","class":"elastic","notify":"none"}')
sys.stdin.readline()
"#;

/// Root in a container's pid namespace reaches `agent.sock` (the hostPath socket
/// that elastic pods mount) and names a pid: the pid is read in the peer's own
/// namespace, never the agent's, so a host process (which, registered BE, M3 would
/// kill) cannot be named from inside a container; the container's own processes
/// can, and the agent finds them under their host pids (`SO_PEERCRED` already gives
/// the connecting process's).
#[test]
fn root_in_a_container_pid_namespace_names_pids_of_its_own_namespace_only() {
    require_root();
    let agent = Agent::start("[hermes]\nenabled = false\n");
    let mut procs = Procs::default();
    procs
        .0
        .push(Command::new("sleep").arg("600").spawn().unwrap());
    let host_pid = procs.0[0].id();
    let mut c = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", PYTHON, "-c", IN_PIDNS])
        .arg(agent.socket())
        .arg(host_pid.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let unshare_pid = c.id();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut answers = Vec::new();
    for _ in 0..3 {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        answers.push(
            serde_json::from_str::<Value>(line.trim())
                .unwrap_or_else(|e| panic!("answer `{line}`: {e}")),
        );
    }
    procs.0.push(c);
    // The python process in the namespace (pid 1 there) and its child (pid 2).
    let ns_init: u32 = children_of(unshare_pid)[0];
    let ns_child: u32 = children_of(ns_init)[0];
    let registered = agent.registered();
    assert_eq!(
        answers[0]["type"], "error",
        "a host process was registered from a container: {}",
        answers[0]
    );
    assert!(!registered.contains(&(host_pid as i64)), "{registered:?}");
    assert_eq!(answers[1]["type"], "registered", "{}", answers[1]);
    assert_eq!(answers[1]["pid"], ns_child, "{}", answers[1]);
    assert_eq!(answers[2]["type"], "registered", "{}", answers[2]);
    assert_eq!(answers[2]["pid"], ns_init, "{}", answers[2]);
    for p in [ns_init, ns_child] {
        assert!(registered.contains(&(p as i64)), "{p} in {registered:?}");
    }
}

/// Run in a new pid namespace as its root: asks `argv[2]` times for a pid its
/// namespace does not have, then (a second later) for its own child; prints the
/// count of each answer's type and code, then the last answer.
const NS_FLOOD: &str = r#"
import collections, json, os, socket, sys, time
sock, n = sys.argv[1], int(sys.argv[2])
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(sock)
f = s.makefile()
def ask(line):
    s.sendall(line.encode() + b'\n')
    return json.loads(f.readline())
seen = collections.Counter()
for _ in range(n):
    a = ask('{"v":1,"type":"register","pid":4242,"class":"be","notify":"none"}')
    seen[a["type"] + ":" + a.get("code", "")] += 1
time.sleep(1.2)
print(json.dumps(seen), flush=True)
print(json.dumps(ask('{"v":1,"type":"register","pid":%d,"class":"be","notify":"none"}' % child)), flush=True)
sys.stdin.readline()
"#;

/// Root in a container's pid namespace names a pid there in a loop: each request
/// walked the whole of `/proc` on the agent's main loop (one `stat` per process of
/// the node), so a container kept the agent busy at will. A namespace's map now
/// comes from one walk, reused for 250 ms, and walks are capped per second: the
/// answers are still right, the walks bounded.
#[test]
fn root_in_a_container_pid_namespace_cannot_make_the_agent_walk_proc_per_request() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(&cfg, "[hermes]\nenabled = false\n").unwrap();
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let agent = AgentCommand::new(&exe(), dir.path())
        .config(&cfg)
        .metrics(&addr)
        .stderr(Stdio::null())
        .start();
    let mut procs = Procs::default();
    let mut c = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", PYTHON, "-c", NS_FLOOD])
        .arg(&agent.socket)
        .arg("400")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let unshare_pid = c.id();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut lines = [String::new(), String::new()];
    for l in &mut lines {
        out.read_line(l).unwrap();
    }
    procs.0.push(c);
    let seen: Value = serde_json::from_str(lines[0].trim()).unwrap();
    let last: Value = serde_json::from_str(lines[1].trim()).unwrap();
    let walks = common::metrics_series(
        &common::agent_metrics(&addr),
        "memcolo_pid_namespace_walks_total",
    )
    .unwrap_or_else(|| panic!("no walks counted on /metrics"));
    assert!(
        walks <= 20.0,
        "400 requests walked /proc {walks} times (answers {seen})"
    );
    let map = seen.as_object().unwrap();
    let total: u64 = map.values().filter_map(Value::as_u64).sum();
    assert_eq!(total, 400, "{seen}");
    for k in map.keys() {
        assert!(
            k == "error:no_such_process" || k == "error:limit_exceeded",
            "an answer of {k} to a pid the namespace lacks: {seen}"
        );
    }
    // the container's own child is still found (a walk after the flood's second)
    let ns_init: u32 = children_of(unshare_pid)[0];
    let ns_child: u32 = children_of(ns_init)[0];
    assert_eq!(last["type"], "registered", "{last}");
    assert_eq!(last["pid"], ns_child, "{last}");
}

/// The children of `pid` (`/proc/PID/task/*/children`), waiting a bounded time for one.
fn children_of(pid: u32) -> Vec<u32> {
    let mut kids = Vec::new();
    wait_for("a child process", Duration::from_secs(10), || {
        kids = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
                    .flat_map(|s| {
                        s.split_whitespace()
                            .filter_map(|p| p.parse().ok())
                            .collect::<Vec<u32>>()
                    })
                    .collect()
            })
            .unwrap_or_default();
        !kids.is_empty()
    });
    kids
}

/// Root of a container's pid namespace is uid 0 to `SO_PEERCRED`; holding every
/// connection it can must not lock the node's root out, as a user's cannot.
#[test]
fn root_in_a_container_pid_namespace_holding_connections_locks_out_neither_root() {
    require_root();
    let agent = Agent::start("[hermes]\nenabled = false\n");
    let mut procs = Procs::default();
    let mut c = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", PYTHON, "-c", HOLD])
        .arg(agent.socket())
        .arg("1100")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut c);
    procs.0.push(c);
    assert_eq!(line.trim(), "1100", "the container could not connect");
    // Let the agent take in (or refuse) all 1,100.
    std::thread::sleep(Duration::from_secs(1));
    let ping = r#"{"v":1,"type":"ping"}"#.to_string() + "\n";
    assert_eq!(
        call(&agent.socket(), &ping)["type"],
        "pong",
        "the node's root is locked out by a container's root"
    );
}
