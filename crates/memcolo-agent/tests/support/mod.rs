//! Helpers for the reclaim tests on the real kernel (also included by the `memcolo`
//! crate's reclaim end-to-end test): a zram swap device of the test's own, a scratch
//! memory cgroup below this process's own group, and a python3 process holding
//! anonymous memory filled with a pattern. Each is undone on drop, failures included.

#![allow(dead_code)]

use memcolo_linux::cgroup::MemoryCgroup;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

pub const MIB: u64 = 1 << 20;

/// The helpers for tests on the real kernel, shared by every crate's tests.
pub use memcolo_testkit::{cannot_run, real_cgroup_v1_available, Scratch, TestSwap};

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

/// [`python_and_swap`] for a test that runs on a v1 memory controller and on a v2
/// one alike: root, a memory cgroup of either version, python3 and the zram swap.
pub fn python_and_swap_v1_or_v2(test: &str, swap_bytes: u64) -> Option<(&'static str, TestSwap)> {
    if !memcolo_testkit::real_memory_cgroup_available(test) {
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
