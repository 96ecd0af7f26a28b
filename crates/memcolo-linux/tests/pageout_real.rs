//! The asynchronous-reclaim mechanisms on the real kernel: a real process in a
//! scratch memory cgroup whose pages are reclaimed — through the group (stepping the
//! v1 limit; v2 `memory.reclaim`, in the guest of `scripts/v2bed/`), by batched
//! `process_madvise(MADV_PAGEOUT)` and by dropping the page cache of the files it
//! holds, lowest offset first — and counted, with its data intact afterwards.
//! Anonymous pages need swap: the tests add a small zram swap device of their own
//! (`/sys/class/zram-control/hot_add`) and remove it afterwards. They fail, saying
//! why, without root or a memory cgroup (unless MEMCOLO_TEST_ALLOW_SKIP=1).
//!
//! The attacks at the end run a BE tenant as uid 61500-61502 and fail (not skip)
//! without root: a target's pid reused by a root process (forced with
//! `/proc/sys/kernel/ns_last_pid`) is not paged out; a FIFO swapped over a BE job's
//! descriptor does not block a file-first batch; a root-owned file a BE job holds
//! keeps its page cache while the job's own file is dropped.

mod common;

use memcolo_linux::cgroup::{Limit, MemoryCgroup};
use memcolo_linux::filecache::{ExpectedProcess, ProcessFiles};
use memcolo_linux::identity::ProvenProcess;
use memcolo_linux::pageout::{
    drop_file_cache, group_processes, reclaim_cgroup, reclaim_cgroup_file_first, PageoutCursor,
    VmaKind,
};
use memcolo_linux::procfs::ProcFs;
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

const MIB: u64 = 1 << 20;

use common::Scratch;

use memcolo_testkit::TestSwap;

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
/// printed) without root, a memory cgroup (v1 or v2) or zram.
struct Rig {
    scratch: Scratch,
    _swap: TestSwap,
}

fn rig(test: &str, tag: &str) -> Option<Rig> {
    if !memcolo_testkit::real_memory_cgroup_available(test) {
        return None;
    }
    let swap = match TestSwap::add(256 * MIB) {
        Ok(s) => s,
        Err(e) => {
            common::cannot_run(test, &format!("no zram swap of its own: {e}"));
            return None;
        }
    };
    Some(Rig {
        scratch: Scratch::new(tag),
        _swap: swap,
    })
}

/// [`reclaim_cgroup`]: a v1 limit step, or v2 `memory.reclaim`.
#[test]
fn group_reclaim_takes_a_real_process_and_keeps_the_limit() {
    let test = "group_reclaim_takes_a_real_process_and_keeps_the_limit";
    let Some(rig) = rig(test, "limitstep") else {
        return;
    };
    let cg = &rig.scratch.cg;
    cg.write_limit(Limit::Bytes(512 * MIB)).unwrap();
    let Some(holder) = Holder::start(cg, 96) else {
        common::cannot_run(test, "no python3");
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
    // Asking for more than the group holds: EBUSY (v1) or EAGAIN (v2) inside,
    // reported as what was done.
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
        common::cannot_run(test, "no python3");
        return;
    };
    let pid = holder.child.id() as i32;
    let procfs = ProcFs::root();
    let rss0 = procfs.read_pid_stat(pid).unwrap().rss_pages * 4096;
    let proven = ProvenProcess::open(&procfs, pid, None).unwrap();
    let mut cursor = PageoutCursor::new(std::sync::Arc::new(proven), VmaKind::Anon);
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

/// A temp dir on a disk filesystem (page cache behaves as on a server, unlike tmpfs).
fn disk_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("memcolo-test")
        .tempdir_in("/var/tmp")
        .unwrap()
}

/// Writes `bytes` to `path`, syncs it (clean pages) and drops its page cache, so that
/// whoever reads it next is charged for it.
fn write_uncached(path: &Path, bytes: u64) {
    let mut f = File::create(path).unwrap();
    let chunk = vec![0x5au8; MIB as usize];
    for _ in 0..bytes / MIB {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    memcolo_linux::filecache::fadvise_dontneed(path).unwrap();
}

/// Bytes of `[off, off + len)` of `path` in the page cache (`mincore`).
fn cached_in(path: &Path, off: u64, len: u64) -> u64 {
    let f = File::open(path).unwrap();
    // SAFETY: a fresh shared read-only mapping of an open file, unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            off as libc::off_t,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED);
    let mut vec = vec![0u8; (len / 4096) as usize];
    // SAFETY: one byte per page of the mapping.
    let rc = unsafe { libc::mincore(addr, len as usize, vec.as_mut_ptr()) };
    // SAFETY: unmapping exactly what was mapped.
    unsafe { libc::munmap(addr, len as usize) };
    assert_eq!(rc, 0);
    vec.iter().filter(|b| *b & 1 != 0).count() as u64 * 4096
}

/// A child that reads `path` whole (its page cache is charged to the child's group)
/// and then holds it open as its stdin; started stopped on a pipe so that `cg` can
/// take it first.
struct FileHolder(Child);

impl FileHolder {
    fn start(path: &Path, cg: Option<&MemoryCgroup>) -> FileHolder {
        let mut child = Command::new("sh")
            .args([
                "-c",
                "read go; cat \"$0\" > /dev/null; echo ready; exec sleep 120 < \"$0\"",
                &path.display().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Not the test's stderr: where that is a file (a CI log), its clean page
            // cache is the holder's too, and the drops below would count it.
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if let Some(cg) = cg {
            cg.add_proc(child.id() as i32).unwrap();
        }
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        // `exec sleep < file` follows `ready`: wait until the fd is there.
        let fd0 = format!("/proc/{}/fd/0", child.id());
        for _ in 0..200 {
            if std::fs::read_link(&fd0).is_ok_and(|t| t == path) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        FileHolder(child)
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for FileHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether this kernel has `cachestat(2)` (6.5+); prints why not otherwise.
fn has_cachestat(test: &str, path: &Path) -> bool {
    match memcolo_linux::filecache::cache_stat(path) {
        Ok(_) => true,
        Err(e) => {
            common::cannot_run(test, &e.to_string());
            false
        }
    }
}

#[test]
fn file_cache_is_dropped_lowest_offset_first_and_protected_files_are_kept() {
    let test = "file_cache_is_dropped_lowest_offset_first_and_protected_files_are_kept";
    let dir = disk_tempdir();
    let path = dir.path().join("stream-64m");
    write_uncached(&path, 64 * MIB);
    if !has_cachestat(test, &path) {
        return;
    }
    let holder = FileHolder::start(&path, None);
    assert!(cached_in(&path, 0, 64 * MIB) >= 60 * MIB);

    // A file an LC process holds is never advised.
    let id = {
        let m = std::fs::metadata(&path).unwrap();
        (m.dev(), m.ino())
    };
    let protected: HashSet<_> = [id].into();
    let r = drop_file_cache(&[files_of(holder.pid())], 16 * MIB, &protected).unwrap();
    assert_eq!(r.dropped_bytes, 0, "{r:?}");
    assert!(cached_in(&path, 0, 64 * MIB) >= 60 * MIB);

    // 16 MiB asked: the first 16 MiB of the file go, the rest stays.
    let r = drop_file_cache(&[files_of(holder.pid())], 16 * MIB, &HashSet::new()).unwrap();
    assert!(
        r.dropped_bytes >= 15 * MIB && r.dropped_bytes <= 17 * MIB,
        "{r:?}"
    );
    assert_eq!(r.files, 1);
    assert!(r.droppable_bytes >= 60 * MIB, "{r:?}");
    assert!(
        cached_in(&path, 0, 15 * MIB) == 0,
        "low offsets still cached"
    );
    assert!(cached_in(&path, 20 * MIB, 44 * MIB) >= 43 * MIB);
    // The next batch takes the next lowest cached offsets, not the same range again.
    let r = drop_file_cache(&[files_of(holder.pid())], 16 * MIB, &HashSet::new()).unwrap();
    assert!(r.dropped_bytes >= 15 * MIB, "{r:?}");
    assert!(cached_in(&path, 0, 31 * MIB) == 0);
    assert!(cached_in(&path, 36 * MIB, 28 * MIB) >= 27 * MIB);
    // An exited process has nothing to drop.
    let files = files_of(holder.pid());
    drop(holder);
    let r = drop_file_cache(&[files], 16 * MIB, &HashSet::new()).unwrap();
    assert_eq!(r.dropped_bytes, 0);
}

#[test]
fn file_first_reclaim_takes_a_groups_page_cache_before_its_limit() {
    let test = "file_first_reclaim_takes_a_groups_page_cache_before_its_limit";
    if !memcolo_testkit::real_memory_cgroup_available(test) {
        return;
    }
    let dir = disk_tempdir();
    let path = dir.path().join("stream-64m");
    write_uncached(&path, 64 * MIB);
    if !has_cachestat(test, &path) {
        return;
    }
    let scratch = Scratch::new("filefirst");
    let cg = &scratch.cg;
    cg.write_limit(Limit::Bytes(512 * MIB)).unwrap();
    let holder = FileHolder::start(&path, Some(cg));
    let before = cg.read_usage_bytes().unwrap();
    assert!(
        before >= 60 * MIB,
        "the page cache is the group's: {before}"
    );
    let procfs = ProcFs::root();
    let members = group_processes(cg, &procfs).unwrap();
    assert_eq!(members.len(), 1);
    let out = reclaim_cgroup_file_first(cg, &members, 24 * MIB, &HashSet::new()).unwrap();
    let after = cg.read_usage_bytes().unwrap();
    assert!(out.reclaimed_bytes >= 23 * MIB, "{out:?}");
    assert!(after + 20 * MIB <= before, "usage {before} -> {after}");
    // Taken from the low offsets of the file, the rest still cached.
    assert_eq!(cached_in(&path, 0, 23 * MIB), 0);
    assert!(cached_in(&path, 28 * MIB, 36 * MIB) >= 35 * MIB);
    assert_eq!(cg.read_limit().unwrap(), Limit::Bytes(512 * MIB));
    // Asking for more than its page cache: the rest from the kernel's LRU of the
    // group (a limit step; without swap it finds little), the limit restored.
    let out = reclaim_cgroup_file_first(cg, &members, 256 * MIB, &HashSet::new()).unwrap();
    assert!(out.reclaimed_bytes >= 35 * MIB, "{out:?}");
    assert!(cached_in(&path, 0, 64 * MIB) <= MIB);
    assert_eq!(cg.read_limit().unwrap(), Limit::Bytes(512 * MIB));
    drop(holder);
}

// ---------------------------------------------------------------------------------
// Attacks by an unprivileged BE tenant (docs/security.md): uids 61500-61599.

/// The uid the BE tenants of these tests run as.
const TENANT: u32 = 61_500;

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests attack reclaim as another user: run them as root"
    );
}

/// A python3 child running `code` as `uid` (setgid, then setuid, before exec), its
/// stdout piped; the first line it prints is returned.
fn tenant_python(uid: u32, code: &str, args: &[&str]) -> (Child, String) {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(code)
        .args(args)
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 is needed");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line.trim().to_string())
}

/// `Swap:` of `/proc/PID/smaps_rollup`, bytes.
fn swapped_bytes(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("Swap:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("a Swap: line")
        * 1024
}

/// A BE target exits between the poll that saw it and the batch that reclaims it, and
/// the kernel gives its pid to a root process (forced with `ns_last_pid`): the batch
/// must not page that root process out.
#[test]
fn a_be_targets_pid_reused_by_a_root_process_is_not_paged_out() {
    let test = "a_be_targets_pid_reused_by_a_root_process_is_not_paged_out";
    require_root();
    let rig = rig(test, "pidreuse").expect("cgroup v1 and zram swap are needed");
    let cg = &rig.scratch.cg;
    let procfs = ProcFs::root();
    let mut hit = None;
    let mut spare = Vec::new();
    for _ in 0..50 {
        // The BE job, proved as the core proves a registered process.
        let (mut be, _) = tenant_python(
            TENANT,
            "print('ready', flush=True)\nimport sys\nsys.stdin.readline()",
            &[],
        );
        let be_pid = be.id() as i32;
        let proven = memcolo_linux::identity::ProvenProcess::open(&procfs, be_pid, None).unwrap();
        let target = Target::of(proven);
        drop(be.stdin.take());
        be.wait().unwrap();
        std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", be_pid - 1)).unwrap();
        let Some(victim) = Holder::start(cg, 64) else {
            panic!("python3 is needed");
        };
        if victim.child.id() as i32 == be_pid {
            hit = Some((target, victim));
            break;
        }
        spare.push(victim);
    }
    drop(spare);
    let (target, victim) = hit.expect("the kernel never reused the BE job's pid in 50 tries");
    let vpid = victim.child.id();
    assert_eq!(procfs.read_pid_status(vpid as i32).unwrap().uid, 0);
    assert_eq!(swapped_bytes(vpid), 0);
    let outcome = target.pageout(&procfs, 32 * MIB);
    assert_eq!(
        swapped_bytes(vpid),
        0,
        "the root process that took the BE job's pid was paged out: {outcome:?}"
    );
    let err = outcome.expect_err("a batch on an exited target must fail");
    assert!(err.is_not_found(), "{err}");
    assert!(victim.verify());
}

/// What the reclaim controller turns a published target (the registered process's
/// proof) into.
struct Target(PageoutCursor);
impl Target {
    fn of(p: ProvenProcess) -> Target {
        Target(PageoutCursor::new(std::sync::Arc::new(p), VmaKind::All))
    }
    fn pageout(
        mut self,
        procfs: &ProcFs,
        bytes: u64,
    ) -> memcolo_linux::Result<memcolo_linux::pageout::BatchOutcome> {
        self.0.pageout(procfs, bytes)
    }
}

/// A tenant directory on disk: `own` (the tenant's file) and `root` (root's, readable
/// by all), both `mib` MiB, written and cached.
fn tenant_files(mib: u64) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = disk_tempdir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let own = dir.path().join("own");
    let root = dir.path().join("root-owned");
    for p in [&own, &root] {
        write_uncached(p, mib * MIB);
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let _ = std::fs::read(p).unwrap(); // cached
    }
    std::os::unix::fs::chown(&own, Some(TENANT + 1), Some(TENANT + 1)).unwrap();
    (dir, own, root)
}

/// A BE job holds its own file and a root-owned file open: a file-first batch drops
/// the page cache of its own file only.
#[test]
fn a_root_owned_file_held_by_a_be_job_keeps_its_page_cache() {
    require_root();
    let (_dir, own, root) = tenant_files(32);
    let code = "import sys\na = open(sys.argv[1], 'rb')\nb = open(sys.argv[2], 'rb')\nprint('ready', flush=True)\nsys.stdin.readline()";
    let (be, ready) = tenant_python(
        TENANT + 1,
        code,
        &[&own.display().to_string(), &root.display().to_string()],
    );
    let be = Killed(be);
    assert_eq!(ready, "ready");
    assert!(cached_in(&own, 0, 32 * MIB) >= 30 * MIB);
    assert!(cached_in(&root, 0, 32 * MIB) >= 30 * MIB);
    let r = JobFiles::of(be.0.id() as i32).drop(256 * MIB);
    assert!(
        cached_in(&root, 0, 32 * MIB) >= 30 * MIB,
        "root's file lost its page cache to a BE job's batch: {r:?}"
    );
    assert!(cached_in(&own, 0, 32 * MIB) <= MIB, "{r:?}");
}

/// A BE job keeps swapping a FIFO (with no writer) and one of its regular files over
/// the same descriptor, as fast as it can, while file-first batches list and open its
/// files: no batch may open the FIFO (which would block the worker for good).
#[test]
fn a_fifo_swapped_over_a_be_jobs_fd_does_not_block_a_reclaim_thread() {
    require_root();
    let (dir, own, _root) = tenant_files(4);
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    let code = r#"
import os, sys
p = os.open(sys.argv[2], os.O_RDONLY | os.O_NONBLOCK)
print('ready', flush=True)
while True:
    os.dup2(p, 50)
    f = os.open(sys.argv[1], os.O_RDONLY)
    os.dup2(f, 50)
    os.close(f)
"#;
    let (be, ready) = tenant_python(
        TENANT + 2,
        code,
        &[&own.display().to_string(), &fifo.display().to_string()],
    );
    let be = Killed(be);
    assert_eq!(ready, "ready");
    let pid = be.0.id() as i32;
    // The window between a look at the descriptor and an open of it is a few
    // microseconds; on a busy machine the tenant runs in it rarely.
    const ROUNDS: u32 = 50_000;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for i in 0..ROUNDS {
            let _ = JobFiles::of(pid).drop(MIB);
            let _ = tx.send(i);
        }
    });
    let mut done = 0;
    // Generous: one batch over a few files takes well under a second.
    while done + 1 < ROUNDS {
        match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(i) => done = i,
            Err(_) => panic!("a file-first batch blocked after {done} rounds (a FIFO was opened)"),
        }
    }
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A BE job's files as a worker reaches them.
struct JobFiles(ProcessFiles);
impl JobFiles {
    fn of(pid: i32) -> JobFiles {
        JobFiles(files_of(pid))
    }
    fn drop(&self, bytes: u64) -> memcolo_linux::Result<memcolo_linux::pageout::FileDropReport> {
        drop_file_cache(std::slice::from_ref(&self.0), bytes, &HashSet::new())
    }
}

/// The files of `pid`, proved now.
fn files_of(pid: i32) -> ProcessFiles {
    let procfs = ProcFs::root();
    let want = ExpectedProcess {
        pid,
        starttime_ticks: procfs.read_pid_stat(pid).unwrap().starttime_ticks,
        uid: None,
    };
    ProcessFiles::open(&procfs, want).unwrap()
}
