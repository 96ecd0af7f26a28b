//! Helpers for the reclaim tests on the real kernel (also included by the `memcolo`
//! crate's reclaim end-to-end test): a zram swap device of the test's own, a scratch
//! memory cgroup below this process's own group, and a python3 process holding
//! anonymous memory filled with a pattern. Each is undone on drop, failures included.

#![allow(dead_code)]

use memcolo_linux::cgroup::{CgroupVersion, MemoryCgroup};
use memcolo_linux::procfs::ProcFs;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

pub const MIB: u64 = 1 << 20;

/// Whether real-kernel reclaim tests can run here: root and a cgroup v1 memory
/// controller. Prints why not when they cannot.
pub fn real_cgroup_v1_available(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        cannot_run(test, "needs root");
        return false;
    }
    match memcolo_linux::cgroup::own_memory_cgroup(&ProcFs::root()) {
        Ok(cg) if cg.version() == CgroupVersion::V1 => true,
        Ok(cg) => {
            cannot_run(
                test,
                &format!("own memory cgroup {} is not v1", cg.path().display()),
            );
            false
        }
        Err(e) => {
            cannot_run(test, &format!("no memory cgroup: {e}"));
            false
        }
    }
}

/// A zram swap device of the test's own (`/sys/class/zram-control/hot_add`, never
/// `/dev/zram0`), swapped off, reset and removed on drop.
pub struct TestSwap {
    id: u32,
}

impl TestSwap {
    /// Adds a device of `bytes` and turns it on as swap; `Err` says why it could not.
    pub fn add(bytes: u64) -> Result<TestSwap, String> {
        let _ = Command::new("modprobe")
            .arg("zram")
            .stderr(Stdio::null())
            .status();
        let id: u32 = std::fs::read_to_string("/sys/class/zram-control/hot_add")
            .map_err(|e| format!("zram hot_add: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("zram hot_add: {e}"))?;
        let swap = TestSwap { id };
        let sys = format!("/sys/block/zram{id}");
        std::fs::write(format!("{sys}/disksize"), bytes.to_string())
            .map_err(|e| format!("{sys}/disksize: {e}"))?;
        let dev = swap.dev();
        for (cmd, args) in [
            ("mkswap", vec![dev.as_str()]),
            ("swapon", vec![dev.as_str()]),
        ] {
            let ok = Command::new(cmd)
                .args(&args)
                .stdout(Stdio::null())
                .status()
                .map_err(|e| format!("{cmd}: {e}"))?
                .success();
            if !ok {
                return Err(format!("{cmd} {dev} failed"));
            }
        }
        Ok(swap)
    }

    /// `/dev/zram<id>`.
    pub fn dev(&self) -> String {
        format!("/dev/zram{}", self.id)
    }
}

impl Drop for TestSwap {
    fn drop(&mut self) {
        // Retried while the test's scratch cgroup releases its charges (ENOMEM); a
        // device still on is reported, not reset (it would fail, EBUSY).
        let dev = self.dev();
        if let Err(e) = memcolo_linux::swap::swapoff_retrying(std::path::Path::new(&dev), 20) {
            eprintln!("warning: {e}; {dev} left as swap");
            return;
        }
        let _ = std::fs::write(format!("/sys/block/zram{}/reset", self.id), "1");
        let _ = std::fs::write("/sys/class/zram-control/hot_remove", self.id.to_string());
    }
}

/// A scratch memory cgroup below this process's own group; on drop every process in
/// it (and in its children) is killed by pid, and the groups are removed.
pub struct Scratch {
    pub cg: MemoryCgroup,
}

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let own = memcolo_linux::cgroup::own_memory_cgroup(&ProcFs::root()).unwrap();
        let name = format!("memcolo-test-{}-{tag}", std::process::id());
        Scratch {
            cg: own.create_child(&name).unwrap(),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for _ in 0..100 {
            for pid in self.cg.read_procs_recursive().unwrap_or_default() {
                // SAFETY: kill takes no pointers; these are the test's own processes.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let mut below = Vec::new();
            let mut stack = self.cg.children().unwrap_or_default();
            while let Some(c) = stack.pop() {
                stack.extend(c.children().unwrap_or_default());
                below.push(c);
            }
            // Deepest first.
            below.sort_by_key(|c| std::cmp::Reverse(c.path().components().count()));
            for c in below {
                let _ = c.remove();
            }
            match self.cg.remove() {
                Ok(()) => return,
                Err(e) if e.is_not_found() => return,
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        eprintln!(
            "could not remove scratch cgroup {}",
            self.cg.path().display()
        );
    }
}

/// A python3 program holding `argv[1]` MiB of anonymous memory in 1 MiB chunks, each
/// 4 KiB page stamped with its chunk and page number; it allocates `argv[2]` MiB at a
/// time with a 50 ms pause between (0: all at once), says `ready`, then on each input
/// line: `touch` reads one byte of every page and says `touched`; `check` verifies
/// every stamp and says `ok` or `bad`. It exits at end of input.
pub const HOLDER: &str = r#"
import sys, time
mib, step = int(sys.argv[1]), int(sys.argv[2])
MB, PG = 1 << 20, 4096
def stamp(c, i):
    return (c * 256 + i // PG).to_bytes(8, "little")
chunks = []
for c in range(mib):
    b = bytearray(MB)
    for i in range(0, MB, PG):
        b[i:i + 8] = stamp(c, i)
    chunks.append(b)
    if step and (c + 1) % step == 0:
        time.sleep(0.05)
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "touch":
        s = 0
        for b in chunks:
            for i in range(0, MB, PG):
                s += b[i]
        print("touched", flush=True)
    elif cmd == "check":
        good = all(b[i:i + 8] == stamp(c, i) for c, b in enumerate(chunks) for i in range(0, MB, PG))
        print("ok" if good else "bad", flush=True)
"#;

/// The first of `python3`, `/usr/bin/python3` that runs.
pub fn python() -> Option<&'static str> {
    ["python3", "/usr/bin/python3"].into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "pass"])
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// What a test that pages out a real python3 [`Holder`] needs: root, cgroup v1, python3
/// and a zram swap of `swap_bytes` of its own. Returns the python3 to run and the swap
/// (turned off on drop); `None`, with the reason printed, when any of them is missing.
pub fn python_and_swap(test: &str, swap_bytes: u64) -> Option<(&'static str, TestSwap)> {
    if !real_cgroup_v1_available(test) {
        return None;
    }
    let Some(python) = python() else {
        cannot_run(test, "no python3");
        return None;
    };
    match TestSwap::add(swap_bytes) {
        Ok(swap) => Some((python, swap)),
        Err(e) => {
            cannot_run(test, &format!("no zram swap of its own: {e}"));
            None
        }
    }
}

/// How long any answer of a holder may take before the test fails (a bound, not a
/// timing assumption: a 320 MiB holder answers in seconds).
pub const ANSWER_LIMIT: Duration = Duration::from_secs(180);

/// A running [`HOLDER`]; killed on drop.
pub struct Holder {
    pub child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Holder {
    /// Starts `command` (ending in the holder's arguments) and waits for `ready`.
    pub fn spawn(mut command: Command) -> Holder {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the holder");
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                if tx.send(l.trim().to_string()).is_err() {
                    break;
                }
            }
        });
        let mut h = Holder {
            child,
            stdin,
            lines,
        };
        h.expect("ready");
        h
    }

    /// Starts a holder of `mib` MiB inside `cg`: the shell joins the group before it
    /// execs python, so every page is charged there.
    pub fn start_in(cg: &MemoryCgroup, python: &str, mib: u64) -> Holder {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo $$ > \"$1/cgroup.procs\" && exec \"$2\" -c \"$0\" \"$3\" 0",
            HOLDER,
            &cg.path().display().to_string(),
            python,
            &mib.to_string(),
        ]);
        Holder::spawn(c)
    }

    /// The next line the holder prints; panics when it exits or stays silent for
    /// [`ANSWER_LIMIT`].
    pub fn line(&mut self) -> String {
        self.lines
            .recv_timeout(ANSWER_LIMIT)
            .unwrap_or_else(|e| panic!("no answer from the holder: {e}"))
    }

    /// Waits for the line `want`.
    pub fn expect(&mut self, want: &str) {
        let got = self.line();
        assert_eq!(got, want, "the holder said {got:?}, not {want:?}");
    }

    /// Sends a command (`touch` or `check`) without waiting for the answer.
    pub fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Reads every page (each swapped-out one refaults); returns when done.
    pub fn touch(&mut self) {
        self.send("touch");
        self.expect("touched");
    }

    /// Whether every page still holds its stamp.
    pub fn intact(&mut self) -> bool {
        self.send("check");
        self.line() == "ok"
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test that cannot run here (no root, no cgroup v1, a missing tool or kernel
/// feature) fails saying why, unless the run asks on purpose to skip such tests with
/// `MEMCOLO_TEST_ALLOW_SKIP=1`; then it says it skipped. A run without root can thus
/// never be mistaken for a full pass.
#[allow(dead_code)]
pub fn cannot_run(test: &str, why: &str) {
    if std::env::var_os("MEMCOLO_TEST_ALLOW_SKIP").is_some_and(|v| v == "1") {
        eprintln!("{test}: skipped on purpose (MEMCOLO_TEST_ALLOW_SKIP=1): {why}");
    } else {
        panic!("{test} cannot run here: {why} (MEMCOLO_TEST_ALLOW_SKIP=1 skips it on purpose)");
    }
}
