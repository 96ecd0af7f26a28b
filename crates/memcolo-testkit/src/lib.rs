//! What memcolo's tests on the real kernel share, one copy for every crate's tests (a
//! dev-dependency only; nothing here is part of the agent):
//!
//! - [`cannot_run`]: a test that cannot run here fails saying why, unless the run asks
//!   on purpose to skip such tests (`MEMCOLO_TEST_ALLOW_SKIP=1`), so a run without root
//!   can never be mistaken for a full pass;
//! - [`require_root`], [`real_cgroup_v1_available`], [`real_memory_cgroup_available`]:
//!   the usual preconditions (the last for tests that run on a v1 memory controller
//!   and on a v2 one alike, as in the cgroup v2 guest of `scripts/v2bed/`);
//! - [`Scratch`]: a scratch memory cgroup below the test's own group (v1, or v2 with
//!   the memory controller delegated to it), emptied and removed on drop;
//!   [`own_memory_cgroup`], [`own_v1_memory_cgroup`] and [`empty_and_remove_cgroup`]
//!   for tests that lay out their groups by hand;
//! - [`TestSwap`]: a zram swap device of the test's own (never `/dev/zram0`);
//! - [`wait_for`]: a bounded wait for a condition (a liveness bound, not a timing
//!   assertion);
//! - [`child_stderr`], [`memserver_address`]: reading what a child process said.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use memcolo_linux::cgroup::{CgroupVersion, MemoryCgroup};
use memcolo_linux::procfs::ProcFs;

/// A test that cannot run here (no root, no cgroup v1, a missing tool or kernel
/// feature) fails saying why, unless the run asks on purpose to skip such tests with
/// `MEMCOLO_TEST_ALLOW_SKIP=1`; then it says it skipped.
pub fn cannot_run(test: &str, why: &str) {
    if std::env::var_os("MEMCOLO_TEST_ALLOW_SKIP").is_some_and(|v| v == "1") {
        eprintln!("{test}: skipped on purpose (MEMCOLO_TEST_ALLOW_SKIP=1): {why}");
    } else {
        panic!("{test} cannot run here: {why} (MEMCOLO_TEST_ALLOW_SKIP=1 skips it on purpose)");
    }
}

/// Panics unless the test runs as root (it makes cgroups, drops to other uids, or
/// attacks the agent as other users).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "this test needs root: run it as root"
    );
}

/// Whether real-kernel tests can run here: root and a cgroup v1 memory controller.
/// When they cannot, [`cannot_run`] says why (and fails the test unless skipping is
/// asked for).
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

/// Whether real-kernel tests that work on either cgroup version can run here: root
/// and a memory cgroup of this process, v1 or v2. When they cannot, [`cannot_run`]
/// says why (and fails the test unless skipping is asked for).
pub fn real_memory_cgroup_available(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        cannot_run(test, "needs root");
        return false;
    }
    match memcolo_linux::cgroup::own_memory_cgroup(&ProcFs::root()) {
        Ok(_) => true,
        Err(e) => {
            cannot_run(test, &format!("no memory cgroup: {e}"));
            false
        }
    }
}

/// This process's own memory cgroup, v1 or v2 (with the memory controller), below
/// which the tests make their scratch groups with [`MemoryCgroup::create_child`]
/// (which on v2 delegates the controller to the children first); panics saying why
/// when there is none.
pub fn own_memory_cgroup() -> MemoryCgroup {
    memcolo_linux::cgroup::own_memory_cgroup(&ProcFs::root())
        .unwrap_or_else(|e| panic!("this test needs a memory cgroup (v1 or v2): {e}"))
}

/// This process's own cgroup v1 memory directory, below which the tests make their
/// scratch groups; panics saying why when there is none (such a test cannot run).
pub fn own_v1_memory_cgroup() -> PathBuf {
    let cg = memcolo_linux::cgroup::own_memory_cgroup(&ProcFs::root())
        .unwrap_or_else(|e| panic!("this test needs the cgroup v1 memory controller: {e}"));
    assert!(
        cg.version() == CgroupVersion::V1,
        "this test needs the cgroup v1 memory controller; {} is v2",
        cg.path().display()
    );
    cg.path().to_path_buf()
}

/// A scratch memory cgroup below this process's own group, named
/// `memcolo-test-<pid>-<tag>`; on drop every process in it and in its children is
/// killed by pid, and the groups are removed, deepest first. On v2 the own group must
/// be able to delegate the memory controller: the root group, or one without
/// processes of its own (the kernel's "no internal process" rule; the v2 guest runs
/// its tests in the root group).
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

/// Kills every process in the memory cgroup `dir` and in its child groups `subs`
/// (retrying for up to 5 s while they die), then removes the child groups and `dir`.
/// For cleanup on every exit path; errors are ignored.
pub fn empty_and_remove_cgroup(dir: &Path, subs: &[&str]) {
    for _ in 0..50 {
        let mut pids: Vec<i32> = vec![];
        for sub in std::iter::once("").chain(subs.iter().copied()) {
            if let Ok(t) = std::fs::read_to_string(dir.join(sub).join("cgroup.procs")) {
                pids.extend(t.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        if pids.is_empty() {
            break;
        }
        for p in pids {
            // SAFETY: kill takes no pointers.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for sub in subs {
        let _ = std::fs::remove_dir(dir.join(sub));
    }
    let _ = std::fs::remove_dir(dir);
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
        if let Err(e) = memcolo_linux::swap::swapoff_retrying(Path::new(&dev), 20) {
            eprintln!("warning: {e}; {dev} left as swap");
            return;
        }
        let _ = std::fs::write(format!("/sys/block/zram{}/reset", self.id), "1");
        let _ = std::fs::write("/sys/class/zram-control/hot_remove", self.id.to_string());
    }
}

/// Waits up to `limit` for `f` to hold, checking every 50 ms; panics naming `what`
/// when it never does. A liveness bound, not a timing assertion: pick it generously.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What is left of a child's piped stderr, read to its end (for a failure message);
/// empty where stderr was not piped or was taken already. Blocks until the child
/// closes its stderr, i.e. call it once the child has exited or been killed.
pub fn child_stderr(child: &mut std::process::Child) -> String {
    use std::io::Read;
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    err
}

/// The address that a just-started `memcolo memserver` announces as the first line of
/// its piped stdout (`listening on ADDR`). Panics with the line it read otherwise.
pub fn memserver_address(child: &mut std::process::Child) -> String {
    use std::io::{BufRead, BufReader};
    let mut line = String::new();
    let out = child.stdout.take().expect("memserver's stdout is piped");
    BufReader::new(out)
        .read_line(&mut line)
        .expect("memserver's first line");
    line.trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("memserver said {line:?}"))
        .to_string()
}

/// A process started by [`hog_in`], killed and reaped when dropped.
pub struct Hog(pub std::process::Child);

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process in the cgroup directory `dir` (a container's group, say) that touches
/// `mib` MiB of anonymous memory and sleeps: it joins the group before allocating, so
/// the memory is charged there, and this returns once it is all touched.
pub fn hog_in(dir: &Path, mib: u64) -> Hog {
    use std::io::{BufRead, Write};
    let mut child = Hog(Command::new("python3")
        .args([
            "-c",
            &format!(
                "import sys,time; sys.stdin.readline(); b=bytearray({mib}<<20); \
                 [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; \
                 print('ready', flush=True); time.sleep(600)"
            ),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 starts"));
    std::fs::write(dir.join("cgroup.procs"), child.0.id().to_string())
        .unwrap_or_else(|e| panic!("join {}: {e}", dir.display()));
    child.0.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.0.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "the hog in {}", dir.display());
    child
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cannot_run_fails_unless_skipping_is_asked_for() {
        // The variable is read at each call; this test sets it for itself only when
        // the run did not.
        if std::env::var_os("MEMCOLO_TEST_ALLOW_SKIP").is_none() {
            let r = std::panic::catch_unwind(|| cannot_run("t", "no reason"));
            let msg = *r.unwrap_err().downcast::<String>().unwrap();
            assert!(msg.contains("t cannot run here: no reason"), "{msg}");
        }
    }

    #[test]
    fn wait_for_returns_once_the_condition_holds_and_names_what_never_came() {
        let mut n = 0;
        wait_for("three calls", Duration::from_secs(60), || {
            n += 1;
            n >= 3
        });
        assert_eq!(n, 3);
        let r = std::panic::catch_unwind(|| wait_for("never", Duration::ZERO, || false));
        let msg = *r.unwrap_err().downcast::<String>().unwrap();
        assert!(msg.contains("timed out waiting for never"), "{msg}");
    }
}
