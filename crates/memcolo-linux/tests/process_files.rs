//! [`ProvenProcess`] on the real kernel: identity proofs (start time, uids), and the
//! files of another user's process reached through `pidfd_getfd(2)` and
//! `/proc/PID/map_files` — only regular files its uid owns, a held FIFO neither
//! opened nor waited on.
//!
//! Needs root and `setpriv` (util-linux); fails otherwise. Uid 61206 is the tenant.

use memcolo_linux::filecache::{ExpectedProcess, ProcessFiles};
use memcolo_linux::procfs::ProcFs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const TENANT: u32 = 61206;

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn expected(pid: i32, uid: Option<u32>) -> ExpectedProcess {
    ExpectedProcess {
        pid,
        starttime_ticks: ProcFs::root().read_pid_stat(pid).unwrap().starttime_ticks,
        uid,
    }
}

/// A `sleep` running as the tenant with `redirs` (sh syntax) applied, once its last
/// descriptor `last_fd` is open.
fn tenant(redirs: &str, last_fd: u32) -> Killed {
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    let child = Command::new("setpriv")
        .args([
            format!("--reuid={TENANT}"),
            format!("--regid={TENANT}"),
            "--clear-groups".into(),
        ])
        .args(["sh", "-c"])
        .arg(format!("exec {redirs}; exec sleep 600"))
        .spawn()
        .expect("setpriv (util-linux) is needed");
    let k = Killed(child);
    let fd = format!("/proc/{}/fd/{last_fd}", k.0.id());
    let t0 = Instant::now();
    while !Path::new(&fd).exists() {
        assert!(t0.elapsed() < Duration::from_secs(60), "tenant not started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Past setpriv's exec: the uid is the tenant's.
    while ProcFs::root().read_pid_status(k.0.id() as i32).unwrap().uid != TENANT {
        assert!(t0.elapsed() < Duration::from_secs(60), "tenant uid not set");
        std::thread::sleep(Duration::from_millis(20));
    }
    k
}

#[test]
fn identity_is_proven_by_start_time_and_uids() {
    let me = std::process::id() as i32;
    let procfs = ProcFs::root();
    let good = expected(me, Some(0));
    let p = ProcessFiles::open(&procfs, good).unwrap();
    assert_eq!((p.pid(), p.uid()), (me, 0));
    // Another start time: a reused pid, reported as "not found".
    let reused = ExpectedProcess {
        starttime_ticks: good.starttime_ticks + 1,
        ..good
    };
    assert!(ProcessFiles::open(&procfs, reused)
        .unwrap_err()
        .is_not_found());
    // Another uid than expected: refused.
    let other = ExpectedProcess {
        uid: Some(TENANT),
        ..good
    };
    let e = ProcessFiles::open(&procfs, other).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
    // A process that exited and was reaped.
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id() as i32;
    let st = ExpectedProcess {
        pid,
        starttime_ticks: procfs
            .read_pid_stat(pid)
            .map(|s| s.starttime_ticks)
            .unwrap_or(0),
        uid: None,
    };
    c.wait().unwrap();
    assert!(ProcessFiles::open(&procfs, st).unwrap_err().is_not_found());
}

#[test]
fn only_regular_files_the_tenant_owns_are_reached() {
    let dir = tempfile::Builder::new()
        .prefix("memcolo-procfiles")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let own = dir.path().join("own");
    let rootfile = dir.path().join("root-owned");
    let fifo = dir.path().join("fifo");
    let shm = tempfile::Builder::new()
        .prefix("memcolo-procfiles")
        .tempfile_in("/dev/shm")
        .unwrap();
    std::fs::write(shm.path(), vec![4u8; 64 * 1024]).unwrap();
    std::os::unix::fs::chown(shm.path(), Some(TENANT), Some(TENANT)).unwrap();
    std::fs::write(&own, vec![1u8; 64 * 1024]).unwrap();
    std::os::unix::fs::chown(&own, Some(TENANT), Some(TENANT)).unwrap();
    std::fs::write(&rootfile, vec![2u8; 64 * 1024]).unwrap();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits(0o666).unwrap()).unwrap();
    std::os::unix::fs::chown(&fifo, Some(TENANT), Some(TENANT)).unwrap();
    // The FIFO opened read-write does not block the tenant; nobody ever writes to it,
    // so anyone opening it read-only would block.
    let t = tenant(
        &format!(
            "3<'{}' 4<'{}' 5<>'{}' 6<'{}'",
            own.display(),
            rootfile.display(),
            fifo.display(),
            shm.path().display()
        ),
        6,
    );
    let pid = t.0.id() as i32;
    let p = ProcessFiles::open(&ProcFs::root(), expected(pid, None)).unwrap();
    assert_eq!(p.uid(), TENANT);
    let (files, skipped) = p.owned_files().unwrap();
    let own_meta = std::fs::metadata(&own).unwrap();
    let ids: Vec<_> = files.iter().map(|f| f.id()).collect();
    assert!(ids.contains(&(own_meta.dev(), own_meta.ino())), "{files:?}");
    let root_meta = std::fs::metadata(&rootfile).unwrap();
    assert!(!ids.contains(&(root_meta.dev(), root_meta.ino())));
    let fifo_meta = std::fs::metadata(&fifo).unwrap();
    assert!(!ids.contains(&(fifo_meta.dev(), fifo_meta.ino())));
    // The root-owned file (and the sleep binary, a shared library mapped, both root's)
    // are foreign; the FIFO and the terminal are not regular.
    assert!(skipped.foreign >= 1, "{skipped:?}");
    assert!(skipped.not_regular >= 1, "{skipped:?}");
    // Its own tmpfs file: advice cannot drop memory-backed page cache.
    assert_eq!(skipped.memory_backed, 1, "{skipped:?}");
    let shm_meta = std::fs::metadata(shm.path()).unwrap();
    assert!(!ids.contains(&(shm_meta.dev(), shm_meta.ino())));
    let f = files
        .iter()
        .find(|f| f.id() == (own_meta.dev(), own_meta.ino()))
        .unwrap();
    assert_eq!(f.path(), own.as_path());
    assert_eq!(f.size_bytes(), 64 * 1024);
    assert!(f.resident_bytes().unwrap() <= 64 * 1024);
    f.fadvise_dontneed().unwrap();
    // Identities cover everything it holds, FIFO and root-owned file included.
    let all = p.file_ids().unwrap();
    for m in [&own_meta, &root_meta, &fifo_meta] {
        assert!(all.contains(&(m.dev(), m.ino())));
    }
}

#[test]
fn mapped_files_are_reached_through_map_files() {
    let dir = tempfile::Builder::new()
        .prefix("memcolo-procfiles")
        .tempdir_in("/var/tmp")
        .unwrap();
    let mapped = dir.path().join("mapped");
    std::fs::write(&mapped, vec![3u8; 8192]).unwrap();
    let f = std::fs::File::open(&mapped).unwrap();
    // SAFETY: a fresh read-only shared mapping, unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED);
    drop(f); // only mapped now
    let me = std::process::id() as i32;
    let p = ProcessFiles::open(&ProcFs::root(), expected(me, Some(0))).unwrap();
    let (files, _) = p.owned_files().unwrap();
    let m = std::fs::metadata(&mapped).unwrap();
    let found = files.iter().find(|f| f.id() == (m.dev(), m.ino()));
    // SAFETY: unmapping what was mapped above.
    unsafe { libc::munmap(addr, 8192) };
    let found = found.expect("the mapped file");
    assert_eq!(found.path(), mapped.as_path());
    assert_eq!(found.size_bytes(), 8192);
}
