//! The asynchronous-reclaim mechanisms on the real kernel: a real process in a
//! scratch memory cgroup whose pages are reclaimed — by stepping the v1 limit and by
//! batched `process_madvise(MADV_PAGEOUT)` — and counted, with its data intact
//! afterwards. Anonymous pages need swap: the tests add a small zram swap device of
//! their own (`/sys/class/zram-control/hot_add`) and remove it afterwards. They skip,
//! saying why, without root or a cgroup v1 memory controller.

mod common;

use memcolo_linux::cgroup::{Limit, MemoryCgroup};
use memcolo_linux::procfs::ProcFs;
use memcolo_linux::reclaim::{reclaim_cgroup, PageoutCursor, VmaKind};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

const MIB: u64 = 1 << 20;

use common::Scratch;

/// A zram swap device of our own, swapped off, reset and removed on drop.
struct TestSwap {
    id: u32,
}

impl TestSwap {
    fn add(bytes: u64) -> Result<TestSwap, String> {
        let id: u32 = std::fs::read_to_string("/sys/class/zram-control/hot_add")
            .map_err(|e| format!("zram hot_add: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("zram hot_add: {e}"))?;
        let swap = TestSwap { id };
        let sys = format!("/sys/block/zram{id}");
        std::fs::write(format!("{sys}/disksize"), bytes.to_string())
            .map_err(|e| format!("{sys}/disksize: {e}"))?;
        let dev = format!("/dev/zram{id}");
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
}

impl Drop for TestSwap {
    fn drop(&mut self) {
        let dev = format!("/dev/zram{}", self.id);
        let _ = Command::new("swapoff").arg(&dev).status();
        let _ = std::fs::write(format!("/sys/block/zram{}/reset", self.id), "1");
        let _ = std::fs::write("/sys/class/zram-control/hot_remove", self.id.to_string());
    }
}

/// A python3 child that allocates `MIB` MiB of anonymous memory filled with a
/// pattern, says `ready`, and on any input line checks every byte and says `ok` or
/// `bad`.
const HOLDER: &str = r#"
import sys
n = int(sys.argv[1]) << 20
buf = bytearray(n)
for i in range(0, n, 4096):
    buf[i:i + 8] = (i // 4096).to_bytes(8, "little")
print("ready", flush=True)
sys.stdin.readline()
good = all(buf[i:i + 8] == (i // 4096).to_bytes(8, "little") for i in range(0, n, 4096))
print("ok" if good else "bad", flush=True)
"#;

struct Holder {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Holder {
    fn start(cg: &MemoryCgroup, mib: u64) -> Option<Holder> {
        // Start stopped on stdin so it allocates inside the group.
        let mut child = Command::new("sh")
            .args([
                "-c",
                "read go && exec python3 -c \"$0\" \"$1\"",
                HOLDER,
                &mib.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        cg.add_proc(child.id() as i32).unwrap();
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        Some(Holder { child, out })
    }

    fn verify(mut self) -> bool {
        self.child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(b"check\n")
            .unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        let _ = self.child.wait();
        line.trim() == "ok"
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn swap_of(cg: &MemoryCgroup) -> u64 {
    cg.read_memory_stat().unwrap().swap_bytes
}

/// A scratch group and a zram swap of the test's own; fields drop in order, so the
/// group's processes are gone before the swap is turned off. `None` (with the reason
/// printed) without root, cgroup v1 or zram.
struct Rig {
    scratch: Scratch,
    _swap: TestSwap,
}

fn rig(test: &str, tag: &str) -> Option<Rig> {
    if !common::real_cgroup_v1_available(test) {
        return None;
    }
    let swap = match TestSwap::add(256 * MIB) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{test}: skipped: no zram swap of its own: {e}");
            return None;
        }
    };
    Some(Rig {
        scratch: Scratch::new(tag),
        _swap: swap,
    })
}

#[test]
fn v1_limit_step_reclaims_a_real_process_and_restores_the_limit() {
    let test = "v1_limit_step_reclaims_a_real_process_and_restores_the_limit";
    let Some(rig) = rig(test, "limitstep") else {
        return;
    };
    let cg = &rig.scratch.cg;
    cg.write_limit(Limit::Bytes(512 * MIB)).unwrap();
    let Some(holder) = Holder::start(cg, 96) else {
        eprintln!("{test}: skipped: no python3");
        return;
    };
    let before = cg.read_usage_bytes().unwrap();
    assert!(before >= 96 * MIB, "usage {before}");
    let out = reclaim_cgroup(cg, 48 * MIB).unwrap();
    let after = cg.read_usage_bytes().unwrap();
    // The kernel reclaimed about what was asked, from this group, into swap.
    assert!(out.reclaimed_bytes >= 40 * MIB, "{out:?}");
    assert!(after + 40 * MIB <= before, "usage {before} -> {after}");
    assert!(swap_of(cg) >= 32 * MIB, "swap {}", swap_of(cg));
    // The limit is back where it was.
    assert_eq!(cg.read_limit().unwrap(), Limit::Bytes(512 * MIB));
    // Asking for more than the group holds: EBUSY inside, reported as what was done.
    let out = reclaim_cgroup(cg, 4 << 30).unwrap();
    assert_eq!(out.requested_bytes, 4 << 30);
    assert_eq!(cg.read_limit().unwrap(), Limit::Bytes(512 * MIB));
    // Every byte comes back intact.
    assert!(holder.verify(), "data changed by reclaim");
}

#[test]
fn pageout_cursor_swaps_out_a_real_process_in_batches() {
    let test = "pageout_cursor_swaps_out_a_real_process_in_batches";
    let Some(rig) = rig(test, "pageout") else {
        return;
    };
    let cg = &rig.scratch.cg;
    let Some(holder) = Holder::start(cg, 96) else {
        eprintln!("{test}: skipped: no python3");
        return;
    };
    let pid = holder.child.id() as i32;
    let procfs = ProcFs::root();
    let rss0 = procfs.read_pid_stat(pid).unwrap().rss_pages * 4096;
    let mut cursor = PageoutCursor::open(pid, VmaKind::Anon).unwrap();
    let first = cursor.pageout(&procfs, 32 * MIB).unwrap();
    assert!(first.reclaimed_bytes >= 32 * MIB, "{first:?}");
    // A batch advises many ranges in one go, and the hand moves on: a second batch
    // frees more rather than re-advising the same pages.
    let second = cursor.pageout(&procfs, 32 * MIB).unwrap();
    assert!(second.reclaimed_bytes >= 16 * MIB, "{second:?}");
    let rss1 = procfs.read_pid_stat(pid).unwrap().rss_pages * 4096;
    assert!(rss1 + 48 * MIB <= rss0, "rss {rss0} -> {rss1}");
    assert!(swap_of(cg) >= 48 * MIB, "swap {}", swap_of(cg));
    assert!(holder.verify(), "data changed by pageout");
    // The process has exited: the cursor reports it as gone, not a crash.
    let err = cursor.pageout(&procfs, MIB).unwrap_err();
    assert!(err.is_not_found(), "{err}");
}
