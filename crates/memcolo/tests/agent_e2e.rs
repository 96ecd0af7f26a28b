//! End to end on the real kernel: `memcolo agent` manages a 512 MiB memory cgroup
//! scope (v1, or v2 as in the guest of `scripts/v2bed/`) holding a real BE job that keeps a file's page cache, a real elastic
//! process that gives memory back when told, and a real LC process.
//!
//! Asserts that (1) the BE file's page cache is dropped by Hermes' advice once the
//! scope passes adv_thr, (2) the elastic process receives a high notification when
//! its growth takes the working set into the red zone, (3) its reclaimed amount is
//! recorded by the agent, and (4) the LC process is untouched.
//!
//! Needs root and a memory cgroup (v1, or v2 with the controller delegatable: see
//! `memcolo_testkit::Scratch`); elsewhere it fails saying which is missing. Every wait is bounded; nothing depends on the machine's speed.

mod common;

use common::agent::AgentCommand;
use common::{agent_status, wait_for};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The elastic process: stdlib Python speaking the protocol. It holds `hold` MiB,
/// registers itself for socket notifications, grows to `grow` MiB when the file
/// `go` appears, and answers every notification with the bytes it freed: one
/// chunk on `low` (an early warning), half of what it holds on `high` or `top`.
const ELASTIC: &str = r#"
import json, os, socket, sys, time
sock_path, go, hold, grow = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
MB = 1 << 20
chunks = []
def fill(n):
    while len(chunks) < n:
        b = bytearray(MB)
        for i in range(0, MB, 4096):
            b[i] = 1
        chunks.append(b)
fill(hold)
s = socket.socket(socket.AF_UNIX)
s.connect(sock_path)
s.sendall((json.dumps({"v": 1, "type": "register", "class": "elastic", "name": "e2e-elastic", "notify": "socket"}) + "\n").encode())
f = s.makefile("r")
print(f.readline().strip(), flush=True)
s.setblocking(False)
grown = False
buf = ""
while True:
    if not grown and os.path.exists(go):
        fill(grow)
        grown = True
        print("grown", flush=True)
    try:
        data = s.recv(65536).decode()
        if not data:
            break
        buf += data
    except BlockingIOError:
        time.sleep(0.05)
        continue
    while "\n" in buf:
        line, buf = buf.split("\n", 1)
        msg = json.loads(line)
        if msg.get("type") == "notify":
            t0 = time.time()
            n = 1 if msg["level"] == "low" else len(chunks) // 2
            del chunks[len(chunks) - n:]
            reply = {"v": 1, "type": "reclaimed", "seq": msg["seq"], "bytes": n * MB, "duration_ms": int((time.time() - t0) * 1000)}
            s.sendall((json.dumps(reply) + "\n").encode())
            print("notified", msg["level"], flush=True)
"#;

#[test]
fn agent_manages_real_processes_in_a_cgroup_scope() {
    common::require_root();
    let own = memcolo_testkit::own_memory_cgroup();
    let python = ["python3", "/usr/bin/python3"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .arg("-c")
                .arg("pass")
                .status()
                .is_ok_and(|s| s.success())
        })
        .expect("python3 is needed for the elastic test process");
    let exe = env!("CARGO_BIN_EXE_memcolo");
    let tmp = tempfile::tempdir().unwrap();
    let scope_cg = own
        .create_child(&format!("memcolo-e2e-{}", std::process::id()))
        .unwrap();
    let scope = scope_cg.path().to_path_buf();
    let data = PathBuf::from(format!("/var/tmp/memcolo-e2e-{}.dat", std::process::id()));
    let mut guard = common::Cleanup::new(&scope, &["lc", "be", "elastic"]);
    guard.files.push(data.clone());
    scope_cg
        .write_limit(memcolo_linux::cgroup::Limit::Bytes(512 * MIB))
        .unwrap();

    // 300 MiB BE data file, written back and dropped from the cache so the BE job's
    // reads charge its page cache to the scope.
    {
        let mut f = std::fs::File::create(&data).unwrap();
        let block = vec![0x5au8; MIB as usize];
        for _ in 0..300 {
            f.write_all(&block).unwrap();
        }
        f.sync_all().unwrap();
    }
    memcolo_linux::filecache::fadvise_dontneed(&data).unwrap();

    // What this test follows is Hermes' advice and M3's signals; Hermit reclaim (on by
    // default) would drop the BE file's cache first, in a race.
    let agent = AgentCommand::new(exe, tmp.path())
        .args(["--no-reclaim", "--poll-ms", "200", "--kill-after-s", "3600"])
        .scope(&scope)
        .start();
    let (sock, ev) = (agent.socket.clone(), agent.event_log.clone());

    // LC: a real process that must come through untouched.
    let lc = Command::new(exe)
        .args(["run", "--class", "lc", "--cgroup", "lc", "--socket"])
        .arg(&sock)
        .args(["--", "sleep", "600"])
        .spawn()
        .unwrap();
    guard.children.push(lc);
    // BE: holds the data file open and reads it through the page cache.
    let be = Command::new(exe)
        .args(["run", "--class", "be", "--cgroup", "be", "--socket"])
        .arg(&sock)
        .args(["--", "sh", "-c"])
        .arg(format!(
            "exec 3<{0}; cat {0} >/dev/null; sleep 600",
            data.display()
        ))
        .spawn()
        .unwrap();
    guard.children.push(be);

    // Elastic: joins its cgroup before exec, then registers itself.
    scope_cg.create_child("elastic").unwrap();
    let go = tmp.path().join("go");
    let mut elastic = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec {python} -u -c \"$0\" {} {} 200 460",
            scope.join("elastic").display(),
            sock.display(),
            go.display()
        ))
        .arg(ELASTIC)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(elastic.stdout.take().unwrap());
    guard.children.push(elastic);
    let (line_tx, line_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            let _ = line_tx.send(l);
        }
    });
    let first = line_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("elastic process registered");
    assert!(
        first.contains("\"registered\""),
        "registration reply: {first}"
    );

    let status = || agent_status(exe, &sock);
    wait_for(
        "lc, be and elastic registered",
        Duration::from_secs(30),
        || {
            let s = status();
            let classes: Vec<String> = s["processes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["class"].as_str().unwrap().to_string())
                .collect();
            ["lc", "be", "elastic"]
                .iter()
                .all(|c| classes.iter().any(|x| x == c))
        },
    );
    let lc_pid = status()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["class"] == "lc")
        .unwrap()["pid"]
        .as_i64()
        .unwrap() as i32;

    // `memcolo run` hands the class and the socket to the command (libmemcolo
    // reads them), and the agent prepared the allocator statistics directory.
    let environ = std::fs::read(format!("/proc/{lc_pid}/environ")).unwrap();
    let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
    assert!(
        vars.contains(&&b"MEMCOLO_CLASS=lc"[..]),
        "LC child environment lacks MEMCOLO_CLASS=lc"
    );
    let sock_var = format!("MEMCOLO_SOCKET={}", sock.display());
    assert!(
        vars.contains(&sock_var.as_bytes()),
        "LC child environment lacks {sock_var}"
    );
    let alloc_dir = std::fs::metadata(sock.parent().unwrap().join("alloc")).unwrap();
    assert!(alloc_dir.is_dir());
    assert_eq!(alloc_dir.permissions().mode() & 0o7777, 0o1777);

    // (1) BE page cache + elastic memory pass adv_thr (85 % of 512 MiB): the BE
    // file is advised out of the page cache.
    wait_for(
        "the BE file's page cache dropped",
        Duration::from_secs(60),
        || {
            events(&ev).iter().any(|e| {
                e["event"] == "file_cache_dropped"
                    && e["path"].as_str() == Some(data.to_str().unwrap())
            })
        },
    );

    // (2) The elastic process grows into the red zone and is told to give back.
    std::fs::write(&go, b"").unwrap();
    let mut notified = vec![];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60)
        && !notified
            .iter()
            .any(|l: &String| l.contains("high") || l.contains("top"))
    {
        if let Ok(l) = line_rx.recv_timeout(Duration::from_millis(500)) {
            if l.starts_with("notified") {
                notified.push(l);
            }
        }
    }
    assert!(
        notified
            .iter()
            .any(|l| l.contains("high") || l.contains("top")),
        "no high notification; saw {notified:?}; events: {:?}",
        events(&ev)
    );

    // (3) The agent recorded what it gave back.
    wait_for("reclaimed bytes recorded", Duration::from_secs(30), || {
        status()["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["class"] == "elastic" && p["reclaimed_bytes"].as_u64().unwrap_or(0) > 0)
    });
    assert!(events(&ev).iter().any(|e| e["event"] == "reclaimed"));

    // (4) No LC process harmed: no kill at all, the LC process still runs.
    assert!(!events(&ev).iter().any(|e| e["event"] == "kill"));
    assert_eq!(
        unsafe { libc::kill(lc_pid, 0) },
        0,
        "LC process {lc_pid} is gone"
    );
    let s = status();
    assert!(s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["pid"] == lc_pid));
    drop(agent);
    drop(guard);
}
