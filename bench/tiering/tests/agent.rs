//! Tiering end to end: the real agent (`memcolo agent` with `[tier] enabled`) manages
//! regions that real processes hand it through libmemcolo's `tier.c` (built here with
//! its options table, `options.c`, as a preload library of their own), with 8 MiB of
//! fast memory for 32 MiB regions, so pages really go to the slow tier and come back.
//!
//! Checked: a C program's view of its region (zero fill, data through eviction,
//! MADV_DONTNEED → zeros, mremap refused, fork not inheriting it, munmap in parts),
//! the agent's status while the region lives and after it leaves, t_miss changed
//! live through `memcolo tier target`, GUPS updates verified after a run under the
//! agent, a region handed to a new agent after a clean restart (the program's pages
//! and semantics checked again under it), and a process stopped with the reason when
//! the agent dies holding its pages. Needs root (userfaultfd for kernel-mode faults), cc, and the `memcolo`
//! binary built next to `gups` (as `cargo test --workspace` does).

use memcolo_testkit::{child_stderr, memserver_address};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cc(args: &[&str], out: &Path) -> bool {
    let ok = Command::new("cc")
        .args(args)
        .arg("-o")
        .arg(out)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipped: cc failed for {}", out.display());
    }
    ok
}

fn status(memcolo: &Path, sock: &Path) -> serde_json::Value {
    let o = Command::new(memcolo)
        .args(["tier", "status", "--json", "--socket"])
        .arg(sock)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn proc_of(st: &serde_json::Value, pid: u32) -> Option<serde_json::Value> {
    st["processes"]
        .as_array()?
        .iter()
        .find(|p| p["pid"] == pid)
        .cloned()
}

/// Sets `pid`'s target through `memcolo tier target`.
fn set_target(memcolo: &Path, sock: &Path, pid: u32, t_miss: &str) {
    let o = Command::new(memcolo)
        .args([
            "tier",
            "target",
            "--pid",
            &pid.to_string(),
            "--t-miss",
            t_miss,
            "--socket",
        ])
        .arg(sock)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `tier_semantics` started, paused after "MAPPED" (its region written and handed to
/// the agent).
struct Program {
    child: Kill,
    out: BufReader<std::process::ChildStdout>,
}

impl Program {
    fn start(mut c: Command) -> Self {
        let mut child = Kill(
            c.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut out = BufReader::new(child.0.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.starts_with("MAPPED"), "{line:?}");
        Program { child, out }
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Lets it check every page and the region's semantics, waits for it, asserts
    /// it passed ("OK"), and returns its stderr.
    fn finish(mut self) -> String {
        writeln!(self.child.0.stdin.as_mut().unwrap(), "go").unwrap();
        let mut rest = String::new();
        self.out.read_to_string(&mut rest).unwrap();
        let st = self.child.0.wait().unwrap();
        let err = child_stderr(&mut self.child.0);
        assert!(st.success() && rest.contains("OK"), "{rest} {err}");
        err
    }
}

impl Program {
    /// Waits (at most `limit`) for it to be stopped, before "go": its exit status
    /// and stderr.
    fn stopped(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        self.child.stopped(limit)
    }
}

impl Kill {
    /// Waits (at most `limit`) for the child to end by itself: its exit status and
    /// stderr (piped).
    fn stopped(&mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let start = Instant::now();
        let st = loop {
            if let Some(s) = self.0.try_wait().unwrap() {
                break s;
            }
            assert!(start.elapsed() < limit, "the child kept running");
            std::thread::sleep(Duration::from_millis(20));
        };
        (st, child_stderr(&mut self.0))
    }
}

fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pieces every test here needs: libmemcolo's `tier.c` (with its options table,
/// `options.c`) built alone as a preload library, the C program, the binaries, an
/// agent config with 8 MiB of fast memory.
struct Rig {
    tmp: tempfile::TempDir,
    lib: PathBuf,
    prog: PathBuf,
    gups: PathBuf,
    memcolo: PathBuf,
    cfg: PathBuf,
    sock: PathBuf,
    tier_sock: PathBuf,
}

impl Rig {
    /// None (with the reason printed) where the test cannot run: not root, no
    /// userfaultfd, no `memcolo` binary, no C compiler. `slow`: the `[tier] slow`
    /// setting (None: the compressed store).
    fn new(slow: Option<&str>) -> Option<Rig> {
        // SAFETY: geteuid has no preconditions.
        if memcolo_tier::uffd::check_permission().is_err() || unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root");
            return None;
        }
        let gups = PathBuf::from(env!("CARGO_BIN_EXE_gups"));
        let memcolo = gups.with_file_name("memcolo");
        if !memcolo.exists() {
            eprintln!("skipped: {} not built", memcolo.display());
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        let lib = tmp.path().join("libtier.so");
        let prog = tmp.path().join("tier_semantics");
        let alloc = root().join("alloc");
        let (src, inc) = (alloc.join("src"), alloc.join("include"));
        if !cc(
            &[
                "-std=gnu11",
                "-O2",
                "-fPIC",
                "-shared",
                "-fvisibility=hidden",
                "-pthread",
                &format!("-I{}", src.display()),
                &format!("-I{}", inc.display()),
                src.join("tier.c").to_str().unwrap(),
                src.join("options.c").to_str().unwrap(),
            ],
            &lib,
        ) || !cc(
            &[
                "-O1",
                root()
                    .join("bench/tiering/tests/tier_semantics.c")
                    .to_str()
                    .unwrap(),
            ],
            &prog,
        ) {
            return None;
        }
        let cfg = tmp.path().join("agent.toml");
        let slow = slow
            .map(|s| match s.starts_with("remote:") {
                true => format!(
                    "slow = \"{s}\"\nslow_secret_file = \"{}\"\n",
                    secret_file().display()
                ),
                false => format!("slow = \"{s}\"\n"),
            })
            .unwrap_or_default();
        std::fs::write(
            &cfg,
            format!("metrics_addr = \"off\"\n[tier]\nenabled = true\nfast_bytes = 8388608\nmigration_cap_bytes = 4194304\n{slow}"),
        )
        .unwrap();
        let sock = tmp.path().join("agent.sock");
        let tier_sock = tmp.path().join("tier.sock");
        Some(Rig {
            lib,
            prog,
            gups,
            memcolo,
            cfg,
            sock,
            tier_sock,
            tmp,
        })
    }

    /// Starts an agent and waits for its tiering socket.
    fn start_agent(&self) -> Kill {
        let agent = Kill(
            Command::new(&self.memcolo)
                .arg("agent")
                .arg("--config")
                .arg(&self.cfg)
                .arg("--socket")
                .arg(&self.sock)
                .arg("--state-dir")
                .arg(self.tmp.path().join("state"))
                .env("MEMCOLO_LOG", "warn")
                .spawn()
                .unwrap(),
        );
        wait_until("the tiering socket", Duration::from_secs(30), || {
            UnixStream::connect(&self.tier_sock).is_ok()
        });
        agent
    }

    /// A command of `exe` that hands its large mappings to the agent.
    fn command(&self, exe: &Path) -> Command {
        let mut c = Command::new(exe);
        c.env("MEMCOLO_SOCKET", &self.sock)
            .env("MEMCOLO_TIER", "1")
            .env("MEMCOLO_TIER_THRESHOLD", "16m")
            .env("MEMCOLO_T_MISS", "0.2")
            // libmemcolo says what it refused and recovered on stderr only when asked;
            // these tests read it there.
            .env("MEMCOLO_VERBOSE", "1")
            .env("LD_PRELOAD", &self.lib);
        c
    }

    fn status(&self) -> serde_json::Value {
        status(&self.memcolo, &self.sock)
    }

    /// Waits (at most `limit`) until `pid`'s entry in `tier status` satisfies `ok`.
    fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        pid: u32,
        ok: impl Fn(&serde_json::Value) -> bool,
    ) {
        wait_until(what, limit, || {
            proc_of(&self.status(), pid).is_some_and(|p| ok(&p))
        });
    }

    /// GUPS with `args`, handing its table to the agent; stdout and stderr piped.
    fn gups(&self, args: &[&str]) -> Kill {
        Kill(
            self.command(&self.gups)
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }
}

/// A process's bytes in the slow tier as the policy placed them, from its `tier status`
/// entry: a page counts as soon as it is demoted, before its region's manager has
/// stored it (see [`stored_pages`]).
fn slow(p: &serde_json::Value) -> u64 {
    p["slow_bytes"].as_u64().unwrap_or(0)
}

/// The pages the manager of a process's first region holds in the slow tier now
/// (`stored_pages` of its `tier status` entry): stored, and dropped from the memfd.
/// What a crash leaves on the memory server, unlike [`slow`], which counts the pages
/// the policy demoted whether the manager's workers stored them yet or not.
fn stored_pages(p: &serde_json::Value) -> u64 {
    p["regions"][0]["stored_pages"].as_u64().unwrap_or(0)
}

/// The two tests run one at a time: side by side, each one's agent, memory server and
/// GUPS took the CPU the other's crash recovery waited for, and the recovery missed
/// its bound.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn processes_hand_regions_to_the_agent_and_keep_their_semantics() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(rig) = Rig::new(None) else {
        return;
    };
    let (memcolo, sock, gups, prog) = (&rig.memcolo, &rig.sock, &rig.gups, &rig.prog);
    let mut agent = rig.start_agent();
    // 1. A C program's region: semantics, status, t_miss changed live.
    let child = Program::start(rig.command(prog));
    let pid = child.pid();
    let st = rig.status();
    let p = proc_of(&st, pid).expect("the program's region is managed");
    assert_eq!(p["t_miss"], 0.2);
    assert_eq!(p["regions"].as_array().unwrap().len(), 1);
    assert_eq!(p["regions"][0]["length_bytes"], 32 << 20);
    // 32 MiB written with 8 MiB of fast memory: most of it is in the slow tier.
    assert!(p["slow_bytes"].as_u64().unwrap() >= 16 << 20, "{p}");
    // (Fast memory may pass the allotment for a while: a victim being sampled when
    // its eviction comes is kept, and demoted at a later epoch.)
    assert!(p["fast_bytes"].as_u64().unwrap() <= 12 << 20, "{p}");
    set_target(memcolo, sock, pid, "0.5");
    assert_eq!(proc_of(&rig.status(), pid).unwrap()["t_miss"], 0.5);
    let err = child.finish();
    assert!(err.contains("mremap of a tiered region refused"), "{err}");
    wait_until("the region to leave", Duration::from_secs(10), || {
        proc_of(&rig.status(), pid).is_none()
    });
    assert_eq!(rig.status()["slow"]["pages"], 0);

    // 2. GUPS under the agent: every update verified.
    let mut g = rig.command(gups);
    let o = g
        .args([
            "--footprint-mib",
            "32",
            "--warmup-s",
            "1",
            "--measure-s",
            "1",
            "--verify",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(o.stdout.trim_ascii()).unwrap();
    assert_eq!(s["verify_errors"], 0, "{s}");

    // 3. The agent restarts cleanly (SIGTERM, then a new one): it hands the C
    //    program's region back as plain memory, the library hands it to the new
    //    agent (with the target last set), which takes the pages it finds as resident
    //    and evicts down to its fast memory; the program then checks every page and
    //    its semantics as in 1.
    let survivor = Program::start(rig.command(prog));
    let spid = survivor.pid();
    assert!(proc_of(&rig.status(), spid).is_some_and(|p| slow(&p) > 0));
    // A target changed live goes with the region to the new agent.
    set_target(memcolo, sock, spid, "0.4");
    // SAFETY: signalling our own child.
    assert_eq!(
        unsafe { libc::kill(agent.0.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    assert!(agent.0.wait().unwrap().success());
    agent = rig.start_agent();
    rig.wait_for(
        "the region handed to the new agent",
        Duration::from_secs(20),
        spid,
        |p| p["regions"][0]["adopted_pages"].as_u64().unwrap_or(0) > 0 && slow(p) >= 16 << 20,
    );
    assert_eq!(proc_of(&rig.status(), spid).unwrap()["t_miss"], 0.4);
    let err = survivor.finish();
    assert!(err.contains("handed to the agent again"), "{err}");
    wait_until(
        "the region to leave the new agent",
        Duration::from_secs(10),
        || proc_of(&rig.status(), spid).is_none(),
    );

    // 4. The agent dies holding pages: the process is stopped with the reason.
    let mut victim = rig.gups(&[
        "--footprint-mib",
        "32",
        "--warmup-s",
        "60",
        "--measure-s",
        "1",
    ]);
    let vpid = victim.0.id();
    rig.wait_for("gups's region", Duration::from_secs(20), vpid, |p| {
        slow(p) > 0
    });
    agent.0.kill().unwrap();
    agent.0.wait().unwrap();
    let (st, err) = victim.stopped(Duration::from_secs(10));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?} {err}");
    assert!(
        err.contains("the agent managing this process's tiered memory is gone"),
        "{err}"
    );
    drop(agent);
}

/// The secret the memory servers and agents of these tests share: a file of 32
/// random bytes, mode 0600, in a directory removed when the tests end.
fn secret_file() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(d.path().join("secret"))
            .unwrap();
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .unwrap()
            .read_exact(&mut bytes)
            .unwrap();
        f.write_all(&bytes).unwrap();
        d
    });
    Box::leak(dir.path().join("secret").into_boxed_path())
}

/// `memcolo memserver` on `listen` (port 0: a free port), and its address.
fn memserver(memcolo: &Path, listen: &str) -> (Kill, String) {
    let secret = secret_file().to_str().unwrap().to_string();
    let mut child = Kill(
        Command::new(memcolo)
            .args(["memserver", "--listen", listen, "--capacity-mib", "256"])
            .args(["--secret-file", &secret])
            .env("MEMCOLO_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let addr = memserver_address(&mut child.0);
    (child, addr)
}

/// With its slow tier on a memory server, a region outlives the agent: the agent is
/// killed (`SIGKILL`, no `tier_released`) while GUPS faults on its region and a C
/// program's region is mostly in the slow tier with pages stashed for sampling; both
/// wait, a new agent takes their regions over (`tier_recover`) from the memfds, the
/// shadows and the memory server, and then every GUPS update verifies and the C
/// program finds every page and its region's semantics as before.
#[test]
fn regions_on_a_memory_server_survive_an_agent_crash() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(probe) = Rig::new(None) else {
        return;
    };
    let (server, addr) = memserver(&probe.memcolo, "127.0.0.1:0");
    drop(probe);
    let rig = Rig::new(Some(&format!("remote:{addr}"))).expect("the probe could");
    let mut agent = rig.start_agent();

    let survivor = Program::start(rig.command(&rig.prog));
    let spid = survivor.pid();
    // Stored, not only demoted: the policy counts 24 MiB in the slow tier as soon as
    // the allotment is applied, while the eviction workers store the pages on the
    // server at their own pace (on a loaded 2-CPU machine with a debug build, about
    // 200 pages/s: 20 s for 16 MiB). A crash before they did leaves the pages in the
    // memfd, where the new agent rightly finds them resident, and nothing on the
    // server to recover. The bound is generous for that reason.
    rig.wait_for(
        "the C program's region stored on the memory server",
        Duration::from_secs(120),
        spid,
        |p| stored_pages(p) >= 4096 && p["regions"][0]["durable"] == true,
    );
    let mut gups = rig.gups(&[
        "--footprint-mib",
        "32",
        "--warmup-s",
        "1",
        "--measure-s",
        "2",
        "--verify",
    ]);
    let gpid = gups.0.id();
    // A target changed live survives the crash (the agent pushes it to the process).
    set_target(&rig.memcolo, &rig.sock, spid, "0.3");
    rig.wait_for(
        "gups's region stored on the memory server",
        Duration::from_secs(60),
        gpid,
        |p| stored_pages(p) > 0,
    );
    // The program is paused: nothing faults its stored pages back, so every page
    // stored now is still on the server when the agent dies, and must be recovered.
    let stored_at_crash = proc_of(&rig.status(), spid).map_or(0, |p| stored_pages(&p));
    assert!(stored_at_crash >= 4096, "{stored_at_crash}");
    agent.0.kill().unwrap();
    agent.0.wait().unwrap();
    // Both wait for a new agent: nothing stops them, nothing reads zeros meanwhile.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        gups.0.try_wait().unwrap().is_none(),
        "gups ended without an agent"
    );
    agent = rig.start_agent();
    // (GUPS may finish its run before a look at the status finds it: its stderr
    // and its verification below tell.)
    // A bound, not a timing assumption: the process retries its hand-over every
    // 50 ms, and the new agent took both regions over within a second here, but a
    // loaded machine may take far longer. Every page stored at the crash is found on
    // the server (none was faulted back: the program is paused).
    rig.wait_for(
        "the C program's region recovered",
        Duration::from_secs(120),
        spid,
        |p| {
            p["regions"][0]["recovered_stored_pages"]
                .as_u64()
                .unwrap_or(0)
                >= stored_at_crash
                && slow(p) >= 16 << 20
        },
    );
    assert_eq!(proc_of(&rig.status(), spid).unwrap()["t_miss"], 0.3);
    let (mut out, mut gerr) = (String::new(), String::new());
    gups.0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    gups.0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut gerr)
        .unwrap();
    assert!(gups.0.wait().unwrap().success(), "{gerr}");
    assert!(gerr.contains("recovered by the new agent"), "{gerr}");
    let s: serde_json::Value = serde_json::from_slice(out.trim().as_bytes()).unwrap();
    assert_eq!(s["verify_errors"], 0, "{s}");
    let err = survivor.finish();
    assert!(err.contains("recovered by the new agent"), "{err}");
    wait_until("the regions to leave", Duration::from_secs(10), || {
        let st = rig.status();
        proc_of(&st, spid).is_none() && proc_of(&st, gpid).is_none()
    });
    // The regions' pages left the memory server with them.
    let held = || {
        memcolo_tier::remote::RemoteTier::connect(memcolo_tier::remote::RemoteConfig::new(
            addr.clone(),
            4096,
            memcolo_tier::channel::Auth::from_file(secret_file()).unwrap(),
        ))
        .unwrap()
        .server_stats()
        .unwrap()
        .pages
    };
    assert_eq!(held(), 0);

    // A memory server restarted while no agent ran has lost the pages: the new
    // agent refuses the region, and the process is stopped, never given zeros.
    let victim = Program::start(rig.command(&rig.prog));
    let vpid = victim.pid();
    // (Stored, not only demoted: see the first program's wait.)
    rig.wait_for(
        "the second program's region stored on the memory server",
        Duration::from_secs(120),
        vpid,
        |p| stored_pages(p) >= 4096,
    );
    assert!(held() > 0);
    agent.0.kill().unwrap();
    agent.0.wait().unwrap();
    drop(server);
    let (_server, again) = memserver(&rig.memcolo, &addr);
    assert_eq!(again, addr);
    agent = rig.start_agent();
    let (st, err) = victim.stopped(Duration::from_secs(30));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?} {err}");
    assert!(
        err.contains("could not take over") && err.contains("restarted"),
        "{err}"
    );
    drop(agent);
}
