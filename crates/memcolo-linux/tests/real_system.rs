//! Tests against the real kernel: procfs of this test process, page-cache residency on
//! a disk filesystem, a scratch cgroup v1 memory group below this process's own group,
//! `memory.pressure_level` events, PSI triggers and pidfds; and, ignored on a v1
//! machine and run in the cgroup v2 guest of `scripts/v2bed/` (`make test-v2`), a
//! scratch v2 group with `memory.high`, `memory.events` and `memory.reclaim`.
//!
//! Tests that need root or the cgroup version they test fail saying why when those
//! are missing (unless MEMCOLO_TEST_ALLOW_SKIP=1). Every process they start is killed by pid and every scratch
//! cgroup removed, also on failure (Drop guards).

mod common;

use memcolo_linux::actuate::{Actuator, LinuxActuator};
use memcolo_linux::cgroup::{own_memory_cgroup, CgroupVersion, Limit};
use memcolo_linux::events::{
    psi_trigger, read_eventfd, v1_pressure_level_eventfd, v1_usage_threshold_eventfd,
    wait_for_event, wait_for_psi_event,
};
use memcolo_linux::filecache::{cache_stat, fadvise_dontneed, resident_bytes, CachedFile};
use memcolo_linux::identity::Prover;
use memcolo_linux::pidfd::{pidfd_exited, pidfd_open, pidfd_send_signal};
use memcolo_linux::procfs::ProcFs;
use memcolo_linux::scope::Scope;
use memcolo_linux::Error;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const MIB: u64 = 1 << 20;

/// A child process that is killed (by pid) and reaped when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

use common::Scratch;

/// Starts `cat path` inside `cg`: the child waits on stdin until it has joined the
/// group, so every page-cache page it reads is charged there.
fn read_file_in(cg: &memcolo_linux::cgroup::MemoryCgroup, path: &Path) -> Reaped {
    let mut child = Reaped(
        Command::new("sh")
            .args(["-c", "read _ && exec cat \"$0\"", path.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    cg.add_proc(child.0.id() as i32).unwrap();
    child.0.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    child
}

fn is_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        common::cannot_run(test, "needs root");
    }
    root
}

/// Whether this process has CAP_SYS_RESOURCE (bit 24 of `CapEff` in /proc/self/status).
fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap() & (1 << 24) != 0
}

/// A temp dir on a disk filesystem (page cache behaves as on a server, unlike tmpfs).
fn disk_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("memcolo-test")
        .tempdir_in("/var/tmp")
        .unwrap()
}

fn write_file(path: &Path, bytes: u64) {
    let mut f = File::create(path).unwrap();
    let chunk = vec![0x5au8; MIB as usize];
    for _ in 0..bytes / MIB {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap(); // clean pages: DONTNEED can drop them
}

#[test]
fn procfs_reads_this_process() {
    let procfs = ProcFs::root();
    let pid = std::process::id() as i32;
    let stat = procfs.read_pid_stat(pid).unwrap();
    assert_eq!(stat.pid, pid);
    assert!(!stat.comm.is_empty());
    assert!(stat.rss_pages > 0);
    assert!(stat.num_threads >= 1);
    let status = procfs.read_pid_status(pid).unwrap();
    assert_eq!(status.tgid, pid);
    // SAFETY: getuid has no preconditions.
    assert_eq!(status.uid, unsafe { libc::getuid() });
    assert!(status.vm_rss_bytes > 0);
    assert_eq!(status.name, stat.comm);
    let cmdline = procfs.read_pid_cmdline(pid).unwrap();
    let exe = std::env::current_exe().unwrap();
    assert!(
        cmdline[0].ends_with(exe.file_name().unwrap().to_str().unwrap()),
        "{cmdline:?} vs {}",
        exe.display()
    );
    assert!(!procfs.read_pid_cgroup(pid).unwrap().is_empty());
    assert!(procfs.pids().unwrap().contains(&pid));
    let m = procfs.read_meminfo().unwrap();
    assert!(m.mem_total_bytes >= m.mem_available_bytes);
    assert!(m.mem_total_bytes >= m.mem_free_bytes);
    assert!(procfs.read_vmstat().unwrap().contains_key("pgmajfault"));
    match procfs.read_pressure("memory") {
        Ok(psi) => assert!(psi.full.is_some()),
        Err(e) => assert!(e.is_not_found(), "{e}"),
    }
    assert!(ProcFs::clock_ticks_per_sec() > 0);
    assert!(ProcFs::page_size().is_power_of_two());
    // The host scope on the real /proc.
    let s = Scope::parse("host", ProcFs::root())
        .unwrap()
        .sample()
        .unwrap();
    assert_eq!(s.total_bytes, m.mem_total_bytes);
    assert!(s.working_set_bytes <= s.total_bytes);
}

#[test]
fn read_pid_files_finds_open_and_mapped_files() {
    let dir = disk_tempdir();
    let open_path = dir.path().join("held open.log");
    let mapped_path = dir.path().join("mapped.bin");
    std::fs::write(&open_path, b"log line\n").unwrap();
    std::fs::write(&mapped_path, vec![1u8; 8192]).unwrap();
    let held = File::open(&open_path).unwrap();
    let mapped = {
        let f = File::open(&mapped_path).unwrap();
        // SAFETY: a fresh read-only private mapping; unmapped at the end of the test.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        addr // the fd closes here: the file is only in maps now
    };
    let files = ProcFs::root()
        .read_pid_files(std::process::id() as i32)
        .unwrap();
    for (path, fd_held) in [(&open_path, true), (&mapped_path, false)] {
        let meta = std::fs::metadata(path).unwrap();
        let found: Vec<_> = files
            .iter()
            .filter(|f| f.ino == meta.ino() && f.dev == meta.dev())
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{} (fd held: {fd_held}) in {files:?}",
            path.display()
        );
        assert_eq!(&found[0].path, path);
    }
    assert!(files
        .iter()
        .all(|f| !f.path.starts_with("/dev") && !f.path.starts_with("/proc")));
    drop(held);
    // SAFETY: unmapping what was mapped above.
    unsafe { libc::munmap(mapped, 8192) };

    // An exited and reaped process: not found.
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    assert!(ProcFs::root()
        .read_pid_files(pid)
        .unwrap_err()
        .is_not_found());
}

#[test]
fn file_cache_residency_and_dontneed() {
    let dir = disk_tempdir();
    let path = dir.path().join("cache-64m");
    let size = 64 * MIB;
    write_file(&path, size);
    let mut buf = Vec::new();
    File::open(&path).unwrap().read_to_end(&mut buf).unwrap();
    assert_eq!(buf.len() as u64, size);
    let before = resident_bytes(&path).unwrap();
    assert!(before <= size, "{before}");
    assert!(
        before >= size * 9 / 10,
        "just read, mostly cached: {before} of {size}"
    );
    match cache_stat(&path) {
        Ok(cs) => assert_eq!(cs.cache_pages * ProcFs::page_size(), before),
        Err(Error::Unsupported { .. }) => eprintln!("no cachestat(2): mincore fallback used"),
        Err(e) => panic!("{e}"),
    }
    fadvise_dontneed(&path).unwrap();
    let after = resident_bytes(&path).unwrap();
    assert!(
        after < before / 2,
        "DONTNEED dropped little: {before} -> {after}"
    );

    // The actuator reports what it dropped.
    File::open(&path)
        .unwrap()
        .read_to_end(&mut Vec::new())
        .unwrap();
    let cached = resident_bytes(&path).unwrap();
    let file = CachedFile::from_file(File::open(&path).unwrap(), &path).unwrap();
    let dropped = LinuxActuator.drop_file_cache(&file).unwrap();
    assert!(dropped > cached / 2, "dropped {dropped} of {cached}");
    assert!(dropped <= cached);
}

#[test]
fn pidfd_readable_after_exit_and_signals() {
    let mut waiting = Reaped(
        Command::new("sh")
            .args(["-c", "read line; exit 0"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let fd = pidfd_open(waiting.0.id() as i32).unwrap();
    assert!(!pidfd_exited(fd.as_fd()).unwrap());
    drop(waiting.0.stdin.take()); // EOF: the shell exits
    assert!(
        wait_for_event(fd.as_fd(), 30_000).unwrap(),
        "no exit within 30 s"
    );
    assert!(pidfd_exited(fd.as_fd()).unwrap());
    let status = waiting.0.wait().unwrap();
    assert!(status.success(), "{status:?}");

    let sleeper = Reaped(Command::new("sleep").arg("1000").spawn().unwrap());
    let mut sleeper = sleeper;
    let fd = pidfd_open(sleeper.0.id() as i32).unwrap();
    pidfd_send_signal(fd.as_fd(), libc::SIGTERM).unwrap();
    assert_eq!(sleeper.0.wait().unwrap().signal(), Some(libc::SIGTERM));
    // Reaped: signalling through the pidfd now fails with ESRCH.
    assert!(pidfd_send_signal(fd.as_fd(), libc::SIGTERM)
        .unwrap_err()
        .is_not_found());
    assert!(pidfd_open(sleeper.0.id() as i32)
        .unwrap_err()
        .is_not_found());

    let mut victim = Reaped(Command::new("sleep").arg("1000").spawn().unwrap());
    let prover = memcolo_linux::identity::LinuxProver::root();
    let p = prover.open(victim.0.id() as i32, None).unwrap();
    LinuxActuator.kill(&p, "test").unwrap();
    assert_eq!(victim.0.wait().unwrap().signal(), Some(libc::SIGKILL));
    let mut usr = Reaped(Command::new("sleep").arg("1000").spawn().unwrap());
    let p = prover.open(usr.0.id() as i32, None).unwrap();
    LinuxActuator.signal(&p, libc::SIGUSR1).unwrap();
    assert_eq!(usr.0.wait().unwrap().signal(), Some(libc::SIGUSR1));
}

#[test]
fn cgroup_v1_scratch_group_lifecycle() {
    if !common::real_cgroup_v1_available("cgroup_v1_scratch_group_lifecycle") {
        return;
    }
    let own = own_memory_cgroup(&ProcFs::root()).unwrap();
    let scratch = Scratch::new("life");
    let cg = &scratch.cg;
    assert_eq!(cg.path().parent().unwrap(), own.path());
    assert!(own
        .children()
        .unwrap()
        .iter()
        .any(|c| c.path() == cg.path()));
    // Creating it again opens the same group.
    assert_eq!(
        own.create_child(cg.path().file_name().unwrap().to_str().unwrap())
            .unwrap(),
        *cg
    );
    assert_eq!(cg.read_procs().unwrap(), Vec::<i32>::new());
    assert!(cg.read_usage_bytes().unwrap() < 64 * MIB);
    let stat = cg.read_memory_stat().unwrap();
    assert!(stat.raw.contains_key("hierarchical_memory_limit"));
    cg.write_limit(Limit::Bytes(64 * MIB)).unwrap();
    assert_eq!(cg.read_limit().unwrap(), Limit::Bytes(64 * MIB));
    assert_eq!(cg.read_effective_limit().unwrap(), Limit::Bytes(64 * MIB));
    let ev = cg.read_events().unwrap();
    assert_eq!((ev.oom_kill, ev.under_oom), (0, Some(false)));
    assert!(cg.read_peak_bytes().unwrap() >= cg.read_usage_bytes().unwrap());

    let mut child = Reaped(Command::new("sleep").arg("1000").spawn().unwrap());
    let pid = child.0.id() as i32;
    cg.add_proc(pid).unwrap();
    assert_eq!(cg.read_procs().unwrap(), vec![pid]);
    assert!(own.read_procs_recursive().unwrap().contains(&pid));
    let cgline = ProcFs::root().read_pid_cgroup(pid).unwrap();
    let mem = cgline
        .iter()
        .find(|l| l.controllers.iter().any(|c| c == "memory"))
        .unwrap();
    assert!(
        cg.path().ends_with(mem.path.trim_start_matches('/')),
        "{} vs {}",
        cg.path().display(),
        mem.path
    );

    // The scope over this group.
    let scope = Scope::Cgroup(cg.clone());
    let s = scope.sample().unwrap();
    assert_eq!(s.total_bytes, 64 * MIB);
    assert!(s.used_bytes <= 64 * MIB);
    assert_eq!(scope.pids().unwrap(), vec![pid]);

    match cg.remove() {
        Err(Error::CgroupBusy { procs, .. }) => assert_eq!(procs, 1),
        other => panic!("removing a busy group: {other:?}"),
    }
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    cg.write_limit(Limit::Max).unwrap();
    assert_eq!(cg.read_limit().unwrap(), Limit::Max);
    // Drop removes the group; check it is gone.
    let path = cg.path().to_path_buf();
    drop(scratch);
    assert!(!path.exists());
}

/// Whether this process's memory cgroup is on cgroup v2 (the guest of
/// `scripts/v2bed/`); otherwise the test cannot run here.
fn real_cgroup_v2_available(test: &str) -> bool {
    if !is_root(test) {
        return false;
    }
    match own_memory_cgroup(&ProcFs::root()) {
        Ok(cg) if cg.version() == CgroupVersion::V2 => true,
        Ok(cg) => {
            common::cannot_run(
                test,
                &format!(
                    "own memory cgroup {} is v1 (scripts/v2bed/run.sh runs it on v2)",
                    cg.path().display()
                ),
            );
            false
        }
        Err(e) => {
            common::cannot_run(test, &format!("no memory cgroup: {e}"));
            false
        }
    }
}

/// The readers and writers of a v2 group against the kernel's own files: a scratch
/// group below this process's group (the memory controller delegated to it), its
/// usage, limits, events, PSI and page cache, `memory.reclaim`, a nested group and
/// the "no internal process" rule.
#[test]
#[ignore = "needs a cgroup v2 memory controller: runs in the guest of scripts/v2bed (make test-v2)"]
fn cgroup_v2_scratch_group_lifecycle() {
    if !real_cgroup_v2_available("cgroup_v2_scratch_group_lifecycle") {
        return;
    }
    let procfs = ProcFs::root();
    let own = own_memory_cgroup(&procfs).unwrap();
    let scratch = Scratch::new("life2");
    let cg = &scratch.cg;
    assert_eq!(cg.version(), CgroupVersion::V2);
    assert_eq!(cg.path().parent().unwrap(), own.path());
    let subtree = std::fs::read_to_string(own.path().join("cgroup.subtree_control")).unwrap();
    assert!(
        subtree.split_whitespace().any(|c| c == "memory"),
        "{subtree}"
    );
    assert_eq!(cg.read_procs().unwrap(), Vec::<i32>::new());
    assert!(cg.read_usage_bytes().unwrap() < 64 * MIB);
    assert_eq!(cg.read_limit().unwrap(), Limit::Max);
    assert_eq!(cg.read_high().unwrap(), Limit::Max);
    cg.write_limit(Limit::Bytes(96 * MIB)).unwrap();
    assert_eq!(cg.read_limit().unwrap(), Limit::Bytes(96 * MIB));
    assert_eq!(cg.read_effective_limit().unwrap(), Limit::Bytes(96 * MIB));
    cg.write_high(Limit::Bytes(80 * MIB)).unwrap();
    assert_eq!(cg.read_high().unwrap(), Limit::Bytes(80 * MIB));
    let ev = cg.read_events().unwrap();
    assert_eq!(
        (ev.low, ev.high, ev.max, ev.oom, ev.oom_kill, ev.under_oom),
        (Some(0), Some(0), 0, Some(0), 0, None)
    );
    assert!(cg.read_pressure().unwrap().is_some(), "no memory.pressure");

    // A nested group inherits the binding limit; this group, having a child but no
    // process, delegates the controller to it.
    let leaf = cg.create_child("leaf").unwrap();
    assert_eq!(leaf.version(), CgroupVersion::V2);
    assert_eq!(leaf.read_limit().unwrap(), Limit::Max);
    assert_eq!(leaf.read_effective_limit().unwrap(), Limit::Bytes(96 * MIB));

    // 64 MiB of a file's page cache, charged to the leaf by its reader.
    let dir = disk_tempdir();
    let path = dir.path().join("v2-64m");
    write_file(&path, 64 * MIB);
    fadvise_dontneed(&path).unwrap();
    let mut reader = read_file_in(&leaf, &path);
    reader.0.wait().unwrap();
    let pid = {
        let child = Reaped(Command::new("sleep").arg("1000").spawn().unwrap());
        leaf.add_proc(child.0.id() as i32).unwrap();
        child
    };
    let pid_n = pid.0.id() as i32;
    assert_eq!(leaf.read_procs().unwrap(), vec![pid_n]);
    assert_eq!(cg.read_procs_recursive().unwrap(), vec![pid_n]);
    assert_eq!(
        memcolo_linux::cgroup::memory_cgroup_path(&procfs, &pid_n.to_string()).unwrap(),
        leaf.path()
    );
    let stat = cg.read_memory_stat().unwrap();
    assert!(stat.file_bytes >= 60 * MIB, "{stat:?}");
    assert!(
        stat.inactive_file_bytes + stat.active_file_bytes >= 60 * MIB,
        "{stat:?}"
    );
    let used = cg.read_usage_bytes().unwrap();
    assert!(used >= 60 * MIB, "memory.current {used}");
    assert!(cg.read_peak_bytes().unwrap() >= used);

    // memory.reclaim takes the page cache back (clean pages, no swap needed).
    cg.reclaim(32 * MIB).unwrap();
    let after = cg.read_usage_bytes().unwrap();
    assert!(after + 24 * MIB <= used, "memory.current {used} -> {after}");
    assert!(cg.read_memory_stat().unwrap().raw["pgsteal"] * 4096 >= 24 * MIB);

    // The scope over this group: its limit is the total.
    let scope = Scope::Cgroup(cg.clone());
    let s = scope.sample().unwrap();
    assert_eq!(s.total_bytes, 96 * MIB);
    assert_eq!(scope.pids().unwrap(), vec![pid_n]);

    // The "no internal process" rule: the leaf, holding a process, cannot delegate.
    let e = leaf.create_child("inner").unwrap_err();
    assert!(e.to_string().contains("cgroup.subtree_control"), "{e}");
    match leaf.remove() {
        Err(Error::CgroupBusy { procs, .. }) => assert_eq!(procs, 1),
        other => panic!("removing a busy group: {other:?}"),
    }
    drop(pid);
    // Drop removes both groups; check they are gone.
    let path = cg.path().to_path_buf();
    drop(scratch);
    assert!(!path.exists());
}

/// `memory.high` throttles a group that grows past it, and `memory.events` counts it.
#[test]
#[ignore = "needs a cgroup v2 memory controller: runs in the guest of scripts/v2bed (make test-v2)"]
fn cgroup_v2_memory_high_is_counted_in_events() {
    if !real_cgroup_v2_available("cgroup_v2_memory_high_is_counted_in_events") {
        return;
    }
    let scratch = Scratch::new("high2");
    let cg = &scratch.cg;
    cg.write_high(Limit::Bytes(16 * MIB)).unwrap();
    let dir = disk_tempdir();
    let path = dir.path().join("v2-48m");
    write_file(&path, 48 * MIB);
    fadvise_dontneed(&path).unwrap();
    let mut reader = read_file_in(cg, &path);
    assert!(reader.0.wait().unwrap().success());
    let ev = cg.read_events().unwrap();
    assert!(ev.high.unwrap() > 0, "{ev:?}");
    assert_eq!((ev.max, ev.oom_kill), (0, 0), "{ev:?}");
    // Reclaimed back to about the throttle limit (the kernel overshoots a little).
    assert!(cg.read_usage_bytes().unwrap() <= 24 * MIB);
}

/// A PSI trigger on a v2 group's own `memory.pressure` (what the agent opens on a v2
/// scope) fires when the group stalls: a process allocating 32 MiB of anonymous
/// memory past a 4 MiB `memory.high`, with no swap, is throttled by the kernel
/// (`mem_cgroup_handle_over_high` sleeps count as memory stalls). Removing the group
/// hangs the trigger up.
#[test]
#[ignore = "needs a cgroup v2 memory controller: runs in the guest of scripts/v2bed (make test-v2)"]
fn cgroup_v2_psi_trigger_fires_when_the_group_is_throttled() {
    let test = "cgroup_v2_psi_trigger_fires_when_the_group_is_throttled";
    if !real_cgroup_v2_available(test) {
        return;
    }
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
    if swaps.lines().count() > 1 {
        common::cannot_run(test, "swap is on: the throttled process would swap instead");
        return;
    }
    let scratch = Scratch::new("psi2");
    let cg = &scratch.cg;
    cg.write_high(Limit::Bytes(4 * MIB)).unwrap();
    let trigger =
        psi_trigger(&cg.path().join("memory.pressure"), false, 50_000, 2_000_000).unwrap();
    // Nothing stalls yet; the file polls readable all the same, so wait_for_event
    // could not tell (it returns at once).
    assert!(!wait_for_psi_event(trigger.as_fd(), 0).unwrap());
    assert!(wait_for_event(trigger.as_fd(), 0).unwrap());
    let mut child = Reaped(
        Command::new("sh")
            .args([
                "-c",
                "read _ && exec python3 -c 'b = bytearray(32 << 20); b[::4096] = b\"x\" * (len(b) // 4096); input()'",
            ])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    cg.add_proc(child.0.id() as i32).unwrap();
    child.0.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    assert!(
        wait_for_psi_event(trigger.as_fd(), 120_000).unwrap(),
        "no PSI event from {} within 120 s; events {:?}",
        cg.path().display(),
        cg.read_events()
    );
    assert!(cg.read_events().unwrap().high.unwrap() > 0);
    drop(child);
    let path = cg.path().to_path_buf();
    drop(scratch);
    assert!(!path.exists());
    // The group is gone: the trigger reports it rather than waiting forever.
    assert!(wait_for_psi_event(trigger.as_fd(), 10_000).is_err());
}

#[test]
fn v1_pressure_level_fires_when_a_child_fills_its_limit() {
    if !common::real_cgroup_v1_available("v1_pressure_level_fires_when_a_child_fills_its_limit") {
        return;
    }
    // 128 MiB of clean page cache read inside a 32 MiB group: the kernel reclaims in
    // the group (no swap, no OOM: clean file pages are always reclaimable).
    let dir = disk_tempdir();
    let data = dir.path().join("data-128m");
    write_file(&data, 128 * MIB);
    fadvise_dontneed(&data).unwrap(); // charge the reads to the scratch group, not ours

    let scratch = Scratch::new("pressure");
    let cg = &scratch.cg;
    cg.write_limit(Limit::Bytes(32 * MIB)).unwrap();
    for (level, mode) in [("bogus", "default"), ("low", "bogus")] {
        assert!(matches!(
            v1_pressure_level_eventfd(cg, level, mode),
            Err(Error::InvalidArgument { .. })
        ));
    }
    let low = v1_pressure_level_eventfd(cg, "low", "local").unwrap();
    // Reclaim in the group stalls the reader: host memory PSI counts it. A 2 s window
    // works with or without CAP_SYS_RESOURCE; 500 us is far below what reclaiming
    // ~96 MiB costs.
    let psi = std::path::Path::new("/proc/pressure/memory");
    let psi_fd = psi
        .exists()
        .then(|| psi_trigger(psi, false, 500, 2_000_000).unwrap());
    let low_default = v1_pressure_level_eventfd(cg, "low", "default").unwrap();
    assert_eq!(
        read_eventfd(low.as_fd()).unwrap(),
        None,
        "fired before any pressure"
    );

    let mut child = read_file_in(cg, &data);
    assert!(
        wait_for_event(low.as_fd(), 60_000).unwrap(),
        "no low-pressure event within 60 s"
    );
    assert!(read_eventfd(low.as_fd()).unwrap().unwrap() >= 1);
    assert!(wait_for_event(low_default.as_fd(), 60_000).unwrap());
    let status = child.0.wait().unwrap();
    assert!(status.success(), "reader failed: {status:?}");
    if let Some(fd) = psi_fd {
        assert!(
            wait_for_event(fd.as_fd(), 10_000).unwrap(),
            "PSI trigger did not fire"
        );
    }
    let stat = cg.read_memory_stat().unwrap();
    assert!(cg.read_usage_bytes().unwrap() <= 32 * MIB);
    assert!(
        stat.raw.get("total_pgpgout").copied().unwrap_or(0) > 0,
        "no reclaim seen: {:?}",
        stat.raw
    );
    // Charges hit the 32 MiB limit (failcnt), with no OOM kill: clean cache reclaims.
    let ev = cg.read_events().unwrap();
    assert!(ev.max > 0, "{ev:?}");
    assert_eq!(ev.oom_kill, 0);
    assert!(cg.read_peak_bytes().unwrap() <= 32 * MIB);
}

#[test]
fn v1_usage_threshold_fires_when_usage_crosses_it() {
    if !common::real_cgroup_v1_available("v1_usage_threshold_fires_when_usage_crosses_it") {
        return;
    }
    // A child in a scratch group reads 64 MiB of page cache (charged to the group):
    // usage crosses the 16 MiB threshold on the way up.
    let dir = disk_tempdir();
    let data = dir.path().join("data-64m");
    write_file(&data, 64 * MIB);
    fadvise_dontneed(&data).unwrap();
    let scratch = Scratch::new("threshold");
    let cg = &scratch.cg;
    assert!(matches!(
        v1_usage_threshold_eventfd(cg, &[]),
        Err(Error::InvalidArgument { .. })
    ));
    let fd = v1_usage_threshold_eventfd(cg, &[16 * MIB, 1 << 40]).unwrap();
    assert_eq!(
        read_eventfd(fd.as_fd()).unwrap(),
        None,
        "fired before any use"
    );
    let mut child = read_file_in(cg, &data);
    assert!(
        wait_for_event(fd.as_fd(), 60_000).unwrap(),
        "no threshold event within 60 s"
    );
    assert!(read_eventfd(fd.as_fd()).unwrap().unwrap() >= 1);
    assert!(child.0.wait().unwrap().success());
    assert!(cg.read_usage_bytes().unwrap() > 16 * MIB);
}

#[test]
fn psi_trigger_registers_on_proc_pressure_memory() {
    let path = PathBuf::from("/proc/pressure/memory");
    if !path.exists() {
        common::cannot_run("psi_trigger_registers_on_proc_pressure_memory", "no PSI");
        return;
    }
    // 2 s windows are accepted with or without CAP_SYS_RESOURCE (Linux 6.5+; before
    // that, only root may open the file for writing).
    let some = match psi_trigger(&path, false, 150_000, 2_000_000) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            common::cannot_run(
                "psi_trigger_registers_on_proc_pressure_memory",
                &e.to_string(),
            );
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let full = psi_trigger(&path, true, 500_000, 4_000_000).unwrap();
    // Registered triggers poll without error (whether they fired depends on the load).
    wait_for_event(some.as_fd(), 0).unwrap();
    wait_for_event(full.as_fd(), 0).unwrap();
    // 1 s windows need CAP_SYS_RESOURCE (Linux 6.5+); root without it is refused.
    match psi_trigger(&path, false, 150_000, 1_000_000) {
        Ok(_) => assert!(
            has_cap_sys_resource(),
            "1 s window accepted without CAP_SYS_RESOURCE"
        ),
        Err(e) => {
            assert!(
                !has_cap_sys_resource(),
                "1 s window refused with CAP_SYS_RESOURCE: {e}"
            );
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            assert!(e.to_string().contains("multiple of 2 s"), "{e}");
        }
    }
    // A file that is not a PSI file refuses the trigger text.
    let e = psi_trigger(Path::new("/proc/meminfo"), false, 150_000, 2_000_000).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
}

/// A python3 child that maps `file` (touching every page) and dirties 16 MiB of
/// anonymous memory, then waits for a line on stdin.
const MAPPER: &str = r#"
import mmap, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
total = sum(m[i] for i in range(0, len(m), 4096))
anon = bytearray(16 << 20)
for i in range(0, len(anon), 4096):
    anon[i] = 1
print("ready", total, flush=True)
sys.stdin.readline()
"#;

#[test]
fn process_madvise_pages_out_a_childs_file_mapping() {
    if !is_root("process_madvise_pages_out_a_childs_file_mapping") {
        return;
    }
    let dir = disk_tempdir();
    let data = dir.path().join("mapped-32m");
    write_file(&data, 32 * MIB);
    let spawned = Command::new("python3")
        .args(["-c", MAPPER, data.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => Reaped(c),
        Err(e) => {
            common::cannot_run(
                "process_madvise_pages_out_a_childs_file_mapping",
                &format!("no python3: {e}"),
            );
            return;
        }
    };
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.0.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("ready"), "child said {line:?}");
    let pid = child.0.id() as i32;
    let procfs = ProcFs::root();
    let before = procfs.read_pid_status(pid).unwrap();
    assert!(before.rss_file_bytes >= 30 * MIB, "{before:?}");
    let proven = memcolo_linux::identity::ProvenProcess::open(&procfs, pid, None).unwrap();

    let report = memcolo_linux::pageout::reclaim_process(
        &procfs,
        &proven,
        memcolo_linux::pageout::ReclaimAdvice::Pageout,
        memcolo_linux::pageout::VmaKind::File,
    )
    .unwrap();
    assert!(report.vmas > 0);
    assert!(report.advised_bytes >= 32 * MIB, "{report:?}");
    let after = procfs.read_pid_status(pid).unwrap();
    assert!(
        after.rss_file_bytes + 16 * MIB < before.rss_file_bytes,
        "RssFile {} -> {}",
        before.rss_file_bytes,
        after.rss_file_bytes
    );
    assert!(
        resident_bytes(&data).unwrap() < 16 * MIB,
        "the file's page cache was reclaimed"
    );

    // MADV_COLD on the anonymous areas through the actuator: advised, process unharmed.
    let advised = LinuxActuator
        .reclaim_process(
            &proven,
            memcolo_linux::pageout::ReclaimAdvice::Cold,
            memcolo_linux::pageout::VmaKind::Anon,
        )
        .unwrap();
    assert!(advised >= 16 * MIB, "{advised}");
    child
        .0
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"done\n")
        .unwrap();
    assert!(child.0.wait().unwrap().success());
    assert!(LinuxActuator
        .reclaim_process(
            &proven,
            memcolo_linux::pageout::ReclaimAdvice::Cold,
            memcolo_linux::pageout::VmaKind::All
        )
        .unwrap_err()
        .is_not_found());
}
