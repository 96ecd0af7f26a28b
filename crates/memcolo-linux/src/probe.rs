//! What a node offers memcolo, checked before the agent runs (`memcolo doctor`).
//!
//! Two kinds of [`Check`]:
//! - readings of kernel files below configurable roots ([`Roots`]: procfs, sysfs,
//!   devtmpfs), so tests point them at fake trees ([`file_checks`]): the kernel
//!   release, cgroup versions and the memory controller, PSI, swap devices, zram and
//!   zswap, `vm.unprivileged_userfaultfd`, the transparent huge page (THP) mode;
//! - system calls tried on this process only, never on another ([`live_checks`]):
//!   a PSI trigger, `userfaultfd(2)` and its `UFFDIO_API` features, `pidfd_open(2)`,
//!   `pidfd_getfd(2)`, `process_madvise(2)` with `MADV_COLD`, `SO_PEERPIDFD`,
//!   `cachestat(2)` and `MADV_COLLAPSE` on an aligned 2 MiB anonymous mapping.
//!
//! [`assess`] turns the checks into a [`Verdict`] per mechanism — M3 monitor, Hermes
//! advice, Hermit reclaim, MaxMem tiering and the libmemcolo allocator — saying
//! whether it can run here and, if not, why. Nothing here changes the machine: the
//! PSI trigger, descriptors and mappings are closed or unmapped before each function
//! returns.

use crate::events::{psi_trigger, PSI_UNPRIVILEGED_WINDOW_US};
use crate::identity::peer_pidfd;
use crate::pageout::{process_madvise, ReclaimAdvice};
use crate::pidfd::pidfd_open;
use crate::Error;
use memcolo_policy::types::Pid;
use serde::Serialize;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The roots the file checks read below.
#[derive(Clone, Debug)]
pub struct Roots {
    /// procfs, normally `/proc`.
    pub procfs: PathBuf,
    /// sysfs, normally `/sys`.
    pub sysfs: PathBuf,
    /// devtmpfs, normally `/dev`.
    pub dev: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            procfs: PathBuf::from("/proc"),
            sysfs: PathBuf::from("/sys"),
            dev: PathBuf::from("/dev"),
        }
    }
}

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The feature is there and works.
    Ok,
    /// Missing or limited; memcolo runs with a fallback or without an option.
    Warn,
    /// Missing; what needs it cannot run.
    Fail,
}

impl Status {
    /// `ok`, `warn` or `fail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check: its stable name (the key in `memcolo doctor --json`), the outcome and
/// what was read or returned, in words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// One of [`CHECK_NAMES`].
    pub name: &'static str,
    pub status: Status,
    /// The reading: file contents, the errno of a call, what follows from it.
    pub reading: String,
}

/// Every check's name, in the order [`run`] returns them.
pub const CHECK_NAMES: [&str; 15] = [
    "kernel",
    "user",
    "cgroup",
    "psi",
    "psi_trigger",
    "swap",
    "userfaultfd",
    "unprivileged_userfaultfd",
    "pidfd_open",
    "pidfd_getfd",
    "process_madvise",
    "so_peerpidfd",
    "thp",
    "cachestat",
    "madv_collapse",
];

fn check(name: &'static str, status: Status, reading: impl Into<String>) -> Check {
    debug_assert!(CHECK_NAMES.contains(&name));
    Check {
        name,
        status,
        reading: reading.into(),
    }
}

/// Every check, file and live, in [`CHECK_NAMES`] order.
pub fn run(roots: &Roots) -> Vec<Check> {
    let mut all = file_checks(roots);
    all.extend(live_checks(roots));
    all.sort_by_key(|c| CHECK_NAMES.iter().position(|n| *n == c.name));
    all
}

fn read_trimmed(path: &Path) -> io::Result<String> {
    std::fs::read_to_string(path).map(|s| s.trim().to_string())
}

/// The checks that only read files below `roots`: `kernel`, `cgroup`, `psi`, `swap`,
/// `unprivileged_userfaultfd`, `thp`.
pub fn file_checks(roots: &Roots) -> Vec<Check> {
    vec![
        kernel(roots),
        cgroup(roots),
        psi(roots),
        swap(roots),
        unprivileged_userfaultfd(roots),
        thp(roots),
    ]
}

fn kernel(roots: &Roots) -> Check {
    let path = roots.procfs.join("sys/kernel/osrelease");
    match read_trimmed(&path) {
        Ok(r) => check("kernel", Status::Ok, format!("Linux {r}")),
        Err(e) => check("kernel", Status::Warn, format!("{}: {e}", path.display())),
    }
}

/// `(fstype, mount point, options)` of every mount in `<procfs>/self/mounts`.
fn mounts(roots: &Roots) -> io::Result<Vec<(String, String, Vec<String>)>> {
    let text = std::fs::read_to_string(roots.procfs.join("self/mounts"))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4).then(|| {
                (
                    f[2].to_string(),
                    f[1].replace("\\040", " "),
                    f[3].split(',').map(str::to_string).collect(),
                )
            })
        })
        .collect())
}

/// A mount point of procfs's view, found below `roots.sysfs` when it is under `/sys`
/// (so a fake tree holds it), else as is.
fn under_sysfs(roots: &Roots, mount_point: &str) -> PathBuf {
    match mount_point.strip_prefix("/sys/") {
        Some(rest) => roots.sysfs.join(rest),
        None => PathBuf::from(mount_point),
    }
}

fn cgroup(roots: &Roots) -> Check {
    let ms = match mounts(roots) {
        Ok(m) => m,
        Err(e) => return check("cgroup", Status::Fail, format!("self/mounts: {e}")),
    };
    let v1 = ms
        .iter()
        .find(|(t, _, o)| t == "cgroup" && o.iter().any(|x| x == "memory"))
        .map(|(_, p, _)| p.clone());
    let v2 = ms
        .iter()
        .find(|(t, _, _)| t == "cgroup2")
        .map(|(_, p, _)| p.clone());
    let v2_memory = v2.as_ref().map(|p| {
        read_trimmed(&under_sysfs(roots, p).join("cgroup.controllers"))
            .map(|c| c.split_whitespace().any(|x| x == "memory"))
            .unwrap_or(false)
    });
    let mut parts = Vec::new();
    if let Some(p) = &v1 {
        parts.push(format!("v1 memory controller at {p}"));
    }
    match (&v2, v2_memory) {
        (Some(p), Some(true)) => {
            parts.push(format!("cgroup2 at {p} with memory"));
            parts.push(v2_interface(roots, &under_sysfs(roots, p)));
        }
        (Some(p), _) => parts.push(format!("cgroup2 at {p} without memory")),
        _ => parts.push("no cgroup2".into()),
    }
    if v1.is_some() || v2_memory == Some(true) {
        check("cgroup", Status::Ok, parts.join("; "))
    } else {
        parts.push("no memory controller: only the `host` scope (/proc/meminfo)".into());
        check("cgroup", Status::Warn, parts.join("; "))
    }
}

/// The v2 memory interface files a node offers (the mechanisms that would use them:
/// `memory.reclaim` for proactive reclaim, `memory.high` to throttle, `memory.low` /
/// `memory.min` to protect, `memory.pressure` for per-group PSI, `memory.events` for
/// limit and OOM events), read in this process's own cgroup2 group, or, when that is
/// the root (which has none of them), in the first child group with the memory
/// controller.
fn v2_interface(roots: &Roots, mount: &Path) -> String {
    const FILES: [&str; 8] = [
        "memory.high",
        "memory.max",
        "memory.low",
        "memory.min",
        "memory.reclaim",
        "memory.pressure",
        "memory.events",
        "memory.swap.max",
    ];
    let own = std::fs::read_to_string(roots.procfs.join("self/cgroup"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("0::").map(|p| p.trim().to_string()))
        })
        .filter(|p| p != "/")
        .map(|p| mount.join(p.trim_start_matches('/')));
    let group = own
        .filter(|g| g.join("memory.current").exists())
        .or_else(|| {
            let mut children: Vec<PathBuf> = std::fs::read_dir(mount)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join("memory.current").exists())
                .collect();
            children.sort();
            children.into_iter().next()
        });
    let Some(g) = group else {
        return "v2 memory files: no non-root group to look at".into();
    };
    let (have, lack): (Vec<&str>, Vec<&str>) = FILES.iter().partition(|f| g.join(f).exists());
    let mut s = format!("v2 memory files ({}): {}", g.display(), have.join(" "));
    if !lack.is_empty() {
        s.push_str(&format!("; missing: {}", lack.join(" ")));
    }
    s
}

fn psi(roots: &Roots) -> Check {
    let path = roots.procfs.join("pressure/memory");
    match crate::psi::Psi::read(&path) {
        Ok(p) => check(
            "psi",
            Status::Ok,
            format!(
                "{} readable (some avg10 {:.2} %)",
                path.display(),
                p.some.avg10
            ),
        ),
        Err(e) => check(
            "psi",
            Status::Warn,
            format!("{e} (PSI off: no `psi=1` or CONFIG_PSI; M3 polls without PSI triggers)"),
        ),
    }
}

fn swap(roots: &Roots) -> Check {
    let path = roots.procfs.join("swaps");
    let devices: Vec<String> = match std::fs::read_to_string(&path) {
        Ok(t) => t
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 3).then(|| format!("{} ({}, {} KiB)", f[0], f[1], f[2]))
            })
            .collect(),
        Err(e) => return check("swap", Status::Warn, format!("{}: {e}", path.display())),
    };
    let zram = devices.iter().filter(|d| d.contains("/zram")).count();
    let zswap = match read_trimmed(&roots.sysfs.join("module/zswap/parameters/enabled")) {
        Ok(v) if v == "Y" || v == "1" => "zswap on",
        Ok(_) => "zswap off",
        Err(_) => "no zswap",
    };
    if devices.is_empty() {
        check(
            "swap",
            Status::Warn,
            format!(
                "no swap device, {zswap}: anonymous memory cannot be reclaimed (Hermit reclaims \
                 file pages only; MaxMem tiering has its own slow tier)"
            ),
        )
    } else {
        check(
            "swap",
            Status::Ok,
            format!("{}; {zram} on zram; {zswap}", devices.join(", ")),
        )
    }
}

fn unprivileged_userfaultfd(roots: &Roots) -> Check {
    let path = roots.procfs.join("sys/vm/unprivileged_userfaultfd");
    let dev = roots.dev.join("userfaultfd");
    let dev_reading = match std::fs::metadata(&dev) {
        Ok(m) => format!(
            "{} mode {:04o}",
            dev.display(),
            m.permissions().mode() & 0o7777
        ),
        Err(_) => format!("no {}", dev.display()),
    };
    match read_trimmed(&path) {
        Ok(v) if v == "1" => check(
            "unprivileged_userfaultfd",
            Status::Ok,
            format!("vm.unprivileged_userfaultfd = 1; {dev_reading}"),
        ),
        Ok(v) => check(
            "unprivileged_userfaultfd",
            Status::Warn,
            format!(
                "vm.unprivileged_userfaultfd = {v}; {dev_reading}: libmemcolo tiers the memory \
                 of processes with CAP_SYS_PTRACE (root) only"
            ),
        ),
        Err(e) => check(
            "unprivileged_userfaultfd",
            Status::Warn,
            format!("{}: {e}; {dev_reading}", path.display()),
        ),
    }
}

/// The selected word of a sysfs choice file (`always [madvise] never` → `madvise`).
pub fn selected_choice(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find(|w| w.starts_with('[') && w.ends_with(']'))
        .map(|w| &w[1..w.len() - 1])
}

fn thp(roots: &Roots) -> Check {
    let dir = roots.sysfs.join("kernel/mm/transparent_hugepage");
    let read = |f: &str| {
        read_trimmed(&dir.join(f))
            .ok()
            .and_then(|t| selected_choice(&t).map(str::to_string))
    };
    match (read("enabled"), read("defrag")) {
        (Some(e), d) => {
            let d = d.unwrap_or_else(|| "?".into());
            let reading = format!("enabled [{e}], defrag [{d}]");
            if e == "never" {
                check(
                    "thp",
                    Status::Warn,
                    format!(
                        "{reading}: no huge pages at fault; libmemcolo relies on MADV_COLLAPSE"
                    ),
                )
            } else {
                check("thp", Status::Ok, reading)
            }
        }
        (None, _) => check(
            "thp",
            Status::Warn,
            format!("{}: unreadable (no THP in this kernel)", dir.display()),
        ),
    }
}

/// The checks that try system calls on this process: `user`, `psi_trigger`,
/// `userfaultfd`, `pidfd_open`, `pidfd_getfd`, `process_madvise`, `so_peerpidfd`,
/// `cachestat`, `madv_collapse`. `roots.procfs` names the PSI file.
pub fn live_checks(roots: &Roots) -> Vec<Check> {
    vec![
        user(),
        psi_trigger_check(&roots.procfs.join("pressure/memory")),
        userfaultfd(),
        pidfd_open_check(),
        pidfd_getfd_check(),
        process_madvise_check(),
        so_peerpidfd(),
        cachestat(),
        madv_collapse(),
    ]
}

fn user() -> Check {
    let euid = nix::unistd::geteuid();
    if euid.is_root() {
        check("user", Status::Ok, "euid 0 (the agent runs as root)")
    } else {
        check(
            "user",
            Status::Warn,
            format!("euid {euid}: the agent runs as root; these results are this user's"),
        )
    }
}

fn psi_trigger_check(path: &Path) -> Check {
    // 150 ms of `some` stall in 1 s: the window the kernel grants privileged openers only.
    match psi_trigger(path, false, 150_000, 1_000_000) {
        Ok(_fd) => check(
            "psi_trigger",
            Status::Ok,
            "a 1 s window accepted: any window of 500 ms..10 s",
        ),
        Err(Error::InvalidArgument { .. }) => {
            match psi_trigger(path, false, 150_000, PSI_UNPRIVILEGED_WINDOW_US) {
                Ok(_fd) => check(
                    "psi_trigger",
                    Status::Warn,
                    "a 1 s window refused, 2 s accepted: no CAP_SYS_RESOURCE, windows must be \
                     multiples of 2 s",
                ),
                Err(e) => check("psi_trigger", Status::Fail, e.to_string()),
            }
        }
        Err(e) => check("psi_trigger", Status::Fail, e.to_string()),
    }
}

/// `UFFD_FEATURE_*` bits libmemcolo's tiered regions ask for (`alloc/src/tier.c`).
const UFFD_TIER_FEATURES: [(u64, &str); 4] = [
    (1 << 0, "PAGEFAULT_FLAG_WP"),
    (1 << 3, "EVENT_REMOVE"),
    (1 << 5, "MISSING_SHMEM"),
    (1 << 12, "WP_HUGETLBFS_SHMEM"),
];

/// `struct uffdio_api` (linux/userfaultfd.h).
#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
/// `_IOWR(0xAA, 0x3F, struct uffdio_api)`.
const UFFDIO_API: u64 = (3 << 30) | (24 << 16) | (0xAA << 8) | 0x3F;

fn userfaultfd() -> Check {
    // SAFETY: userfaultfd takes one int of flags and returns a new descriptor.
    let raw = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return check(
            "userfaultfd",
            Status::Fail,
            format!("userfaultfd(2): {e}: MaxMem tiering cannot run"),
        );
    }
    // SAFETY: a new descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    let mut api = UffdioApi {
        api: 0xAA,
        features: 0,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes a struct uffdio_api, which UffdioApi mirrors.
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
        let e = io::Error::last_os_error();
        return check("userfaultfd", Status::Fail, format!("UFFDIO_API: {e}"));
    }
    let missing: Vec<&str> = UFFD_TIER_FEATURES
        .iter()
        .filter(|(bit, _)| api.features & bit == 0)
        .map(|(_, n)| *n)
        .collect();
    if missing.is_empty() {
        check(
            "userfaultfd",
            Status::Ok,
            "userfaultfd(2) and UFFDIO_API with every feature tiered regions use \
             (PAGEFAULT_FLAG_WP, EVENT_REMOVE, MISSING_SHMEM, WP_HUGETLBFS_SHMEM)",
        )
    } else {
        check(
            "userfaultfd",
            Status::Fail,
            format!("UFFDIO_API lacks {}", missing.join(", ")),
        )
    }
}

fn own_pidfd() -> crate::Result<OwnedFd> {
    pidfd_open(std::process::id() as Pid)
}

fn pidfd_open_check() -> Check {
    match own_pidfd() {
        Ok(_) => check("pidfd_open", Status::Ok, "pidfd_open(2) of this process"),
        Err(e) => check(
            "pidfd_open",
            Status::Fail,
            format!("{e} (Linux >= 5.3 needed): processes cannot be proven"),
        ),
    }
}

fn pidfd_getfd_check() -> Check {
    let pidfd = match own_pidfd() {
        Ok(p) => p,
        Err(e) => return check("pidfd_getfd", Status::Fail, e.to_string()),
    };
    // SAFETY: two descriptor numbers and flags, no pointers.
    let raw = unsafe {
        libc::syscall(
            libc::SYS_pidfd_getfd,
            pidfd.as_raw_fd(),
            pidfd.as_raw_fd(),
            0,
        )
    };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return check(
            "pidfd_getfd",
            Status::Fail,
            format!("pidfd_getfd(2): {e} (Linux >= 5.6 and ptrace access needed)"),
        );
    }
    // SAFETY: a new descriptor we own; dropping it closes it.
    drop(unsafe { OwnedFd::from_raw_fd(raw as i32) });
    check(
        "pidfd_getfd",
        Status::Ok,
        "pidfd_getfd(2) of a descriptor of this process",
    )
}

/// An anonymous private mapping, unmapped on drop.
struct Mapping {
    addr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn anonymous(len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { addr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made and nothing else refers to.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// Writes one byte in every 4 KiB page of `[start, start + len)` of `m`.
fn touch(m: &Mapping, start: usize, len: usize) {
    for off in (start..start + len).step_by(4096) {
        // SAFETY: `off` lies inside the mapping, which is readable and writable.
        unsafe { (m.addr as *mut u8).add(off).write_volatile(1) };
    }
}

fn process_madvise_check() -> Check {
    let run = || -> Result<(), String> {
        let m = Mapping::anonymous(64 << 10).map_err(|e| format!("mmap: {e}"))?;
        touch(&m, 0, m.len);
        let pidfd = own_pidfd().map_err(|e| e.to_string())?;
        let start = m.addr as u64;
        let range = start..start + m.len as u64;
        let (advised, skipped) = process_madvise(
            pidfd.as_fd(),
            std::slice::from_ref(&range),
            ReclaimAdvice::Cold,
        )
        .map_err(|e| e.to_string())?;
        if skipped > 0 || advised == 0 {
            return Err(format!("MADV_COLD refused ({skipped} range skipped)"));
        }
        Ok(())
    };
    match run() {
        Ok(()) => check(
            "process_madvise",
            Status::Ok,
            "process_madvise(2) MADV_COLD on 64 KiB of this process",
        ),
        Err(e) => check(
            "process_madvise",
            Status::Fail,
            format!("{e} (Linux >= 5.10 and CAP_SYS_NICE needed)"),
        ),
    }
}

fn so_peerpidfd() -> Check {
    let pair = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Stream,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    );
    let (a, _b) = match pair {
        Ok(p) => p,
        Err(e) => return check("so_peerpidfd", Status::Fail, format!("socketpair: {e}")),
    };
    match peer_pidfd(a.as_fd()) {
        Ok(Some(_)) => check(
            "so_peerpidfd",
            Status::Ok,
            "SO_PEERPIDFD gives a pidfd of a socket's peer",
        ),
        Ok(None) => check(
            "so_peerpidfd",
            Status::Warn,
            "no SO_PEERPIDFD (Linux < 6.5): peers are proven by SO_PEERCRED and their start time",
        ),
        Err(e) => check("so_peerpidfd", Status::Warn, e.to_string()),
    }
}

fn cachestat() -> Check {
    let exe = PathBuf::from("/proc/self/exe");
    match crate::filecache::cache_stat(&exe) {
        Ok(s) => check(
            "cachestat",
            Status::Ok,
            format!(
                "cachestat(2) on this program: {} pages cached",
                s.cache_pages
            ),
        ),
        Err(e @ Error::Unsupported { .. }) => check(
            "cachestat",
            Status::Warn,
            format!("{e} (Linux < 6.5): Hermes reads the page cache with mincore(2)"),
        ),
        Err(e) => check("cachestat", Status::Warn, e.to_string()),
    }
}

/// `MADV_COLLAPSE` (Linux 6.1; not in every libc crate version).
const MADV_COLLAPSE: i32 = 25;
const HUGE: usize = 2 << 20;

fn madv_collapse() -> Check {
    let m = match Mapping::anonymous(2 * HUGE) {
        Ok(m) => m,
        Err(e) => return check("madv_collapse", Status::Warn, format!("mmap: {e}")),
    };
    let start = (m.addr as usize).next_multiple_of(HUGE) - m.addr as usize;
    touch(&m, start, HUGE);
    // SAFETY: an aligned 2 MiB range inside the mapping.
    let rc = unsafe { libc::madvise((m.addr as *mut u8).add(start).cast(), HUGE, MADV_COLLAPSE) };
    if rc == 0 {
        return check(
            "madv_collapse",
            Status::Ok,
            "MADV_COLLAPSE made an aligned 2 MiB anonymous range one huge page",
        );
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) => check(
            "madv_collapse",
            Status::Warn,
            "MADV_COLLAPSE: EINVAL (Linux < 6.1, or THP off for this process): libmemcolo \
             falls back to MADV_HUGEPAGE at mmap",
        ),
        _ => check(
            "madv_collapse",
            Status::Warn,
            format!("MADV_COLLAPSE: {e}: supported, but no huge page could be made now"),
        ),
    }
}

/// Which mechanisms the configuration turns on (the M3 monitor always runs, and
/// libmemcolo is there for every process that loads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enabled {
    pub hermes: bool,
    pub reclaim: bool,
    pub tier: bool,
    /// The scope is a memory cgroup (`cgroup:PATH`), not the host: the M3 monitor
    /// then needs a memory controller.
    pub cgroup_scope: bool,
}

/// Whether one mechanism can run on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// `m3`, `hermes`, `reclaim`, `tier` or `libmemcolo`.
    pub name: &'static str,
    /// What it is, for a person: "M3 monitor", "Hermes advice"...
    pub title: &'static str,
    /// On in the configuration checked.
    pub enabled: bool,
    pub can_run: bool,
    /// Why it cannot run, or what limits it (empty when nothing does).
    pub why: String,
}

fn status_of<'a>(checks: &'a [Check], name: &str) -> Option<&'a Check> {
    checks.iter().find(|c| c.name == name)
}

/// The mechanisms' verdicts from `checks` (as [`run`] returns them; a check left out
/// counts as failed).
pub fn assess(checks: &[Check], enabled: Enabled) -> Vec<Verdict> {
    let ok = |n: &str| status_of(checks, n).is_some_and(|c| c.status == Status::Ok);
    let why_not = |needs: &[(&str, &str)]| -> Vec<String> {
        needs
            .iter()
            .filter(|(n, _)| !ok(n))
            .map(|(n, what)| match status_of(checks, n) {
                Some(c) => format!("{what}: {}", c.reading),
                None => format!("{what}: not checked"),
            })
            .collect()
    };
    let limits = |notes: &[(&str, &str)]| -> Vec<String> {
        notes
            .iter()
            .filter(|(n, _)| !ok(n))
            .map(|(_, what)| what.to_string())
            .collect()
    };
    let verdict = |name, title, enabled, needs: &[(&str, &str)], notes: &[(&str, &str)]| {
        let missing = why_not(needs);
        let can_run = missing.is_empty();
        let why = if can_run { limits(notes) } else { missing };
        Verdict {
            name,
            title,
            enabled,
            can_run,
            why: why.join("; "),
        }
    };
    let m3_needs: &[(&str, &str)] = if enabled.cgroup_scope {
        &[
            ("pidfd_open", "notifies and kills only through pidfds"),
            ("cgroup", "a cgroup scope needs a memory controller"),
        ]
    } else {
        &[("pidfd_open", "notifies and kills only through pidfds")]
    };
    vec![
        verdict(
            "m3",
            "M3 monitor",
            true,
            m3_needs,
            &[
                ("cgroup", "no memory controller: `host` scope only"),
                ("psi", "no PSI: polls only"),
            ],
        ),
        verdict(
            "hermes",
            "Hermes advice",
            enabled.hermes,
            &[
                ("pidfd_open", "proves BE processes by pidfd"),
                ("pidfd_getfd", "takes BE processes' files by pidfd_getfd"),
            ],
            &[("cachestat", "no cachestat: mincore(2) instead")],
        ),
        verdict(
            "reclaim",
            "Hermit reclaim",
            enabled.reclaim,
            &[
                ("pidfd_open", "proves processes by pidfd"),
                (
                    "process_madvise",
                    "reclaims with process_madvise(MADV_PAGEOUT)",
                ),
            ],
            &[("swap", "no swap: file pages only")],
        ),
        verdict(
            "tier",
            "MaxMem tiering",
            enabled.tier,
            &[(
                "userfaultfd",
                "serves faults of tiered regions by userfaultfd",
            )],
            &[(
                "unprivileged_userfaultfd",
                "only processes with CAP_SYS_PTRACE can tier (vm.unprivileged_userfaultfd)",
            )],
        ),
        verdict(
            "libmemcolo",
            "libmemcolo allocator",
            true,
            &[],
            &[
                (
                    "madv_collapse",
                    "no MADV_COLLAPSE: huge pages by MADV_HUGEPAGE at mmap",
                ),
                ("thp", "THP never"),
                ("pidfd_open", "no pidfd: cannot register with the agent"),
            ],
        ),
    ]
}

/// True when every enabled mechanism can run: `memcolo doctor`'s exit status 0.
pub fn ready(verdicts: &[Verdict]) -> bool {
    verdicts.iter().all(|v| !v.enabled || v.can_run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{dir, file};

    fn fake(entries: Vec<crate::fake::FakeEntry>) -> (tempfile::TempDir, Roots) {
        let t = tempfile::tempdir().unwrap();
        crate::fake::create_tree(t.path(), &entries).unwrap();
        let roots = Roots {
            procfs: t.path().join("proc"),
            sysfs: t.path().join("sys"),
            dev: t.path().join("dev"),
        };
        (t, roots)
    }

    fn get(checks: &[Check], name: &str) -> Check {
        checks.iter().find(|c| c.name == name).unwrap().clone()
    }

    const PSI: &str = "some avg10=1.50 avg60=0.00 avg300=0.00 total=10\n\
                       full avg10=0.00 avg60=0.00 avg300=0.00 total=5\n";

    fn v1_node() -> Vec<crate::fake::FakeEntry> {
        vec![
            dir(
                "proc",
                vec![
                    dir(
                        "self",
                        vec![file(
                            "mounts",
                            "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
                             cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n",
                        )],
                    ),
                    dir(
                        "sys",
                        vec![
                            dir("kernel", vec![file("osrelease", "6.18.1\n")]),
                            dir("vm", vec![file("unprivileged_userfaultfd", "0\n")]),
                        ],
                    ),
                    dir("pressure", vec![file("memory", PSI)]),
                    file("swaps", "Filename\tType\tSize\tUsed\tPriority\n"),
                ],
            ),
            dir(
                "sys",
                vec![
                    dir(
                        "fs",
                        vec![dir(
                            "cgroup",
                            vec![dir("unified", vec![file("cgroup.controllers", "\n")])],
                        )],
                    ),
                    dir(
                        "kernel",
                        vec![dir(
                            "mm",
                            vec![dir(
                                "transparent_hugepage",
                                vec![
                                    file("enabled", "always [madvise] never\n"),
                                    file("defrag", "always defer defer+madvise [madvise] never\n"),
                                ],
                            )],
                        )],
                    ),
                    dir(
                        "module",
                        vec![dir(
                            "zswap",
                            vec![dir("parameters", vec![file("enabled", "N\n")])],
                        )],
                    ),
                ],
            ),
        ]
    }

    #[test]
    fn a_v1_node_without_swap() {
        let (_t, roots) = fake(v1_node());
        let c = file_checks(&roots);
        assert_eq!(get(&c, "kernel").reading, "Linux 6.18.1");
        let cg = get(&c, "cgroup");
        assert_eq!(cg.status, Status::Ok);
        assert!(
            cg.reading
                .contains("v1 memory controller at /sys/fs/cgroup/memory"),
            "{cg:?}"
        );
        assert!(
            cg.reading
                .contains("cgroup2 at /sys/fs/cgroup/unified without memory"),
            "{cg:?}"
        );
        assert_eq!(get(&c, "psi").status, Status::Ok);
        let sw = get(&c, "swap");
        assert_eq!(sw.status, Status::Warn);
        assert!(sw.reading.contains("no swap device, zswap off"), "{sw:?}");
        let uu = get(&c, "unprivileged_userfaultfd");
        assert_eq!(uu.status, Status::Warn);
        assert!(uu.reading.contains("= 0; no "), "{uu:?}");
        assert_eq!(
            get(&c, "thp").reading,
            "enabled [madvise], defrag [madvise]"
        );
    }

    #[test]
    fn a_v2_node_with_memory_and_zram() {
        let (_t, roots) = fake(vec![
            dir(
                "proc",
                vec![
                    dir("self", vec![file("mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n")]),
                    file(
                        "swaps",
                        "Filename\tType\tSize\tUsed\tPriority\n/dev/zram0 partition 4194300 0 100\n",
                    ),
                ],
            ),
            dir(
                "sys",
                vec![
                    dir("fs", vec![dir("cgroup", vec![
                        file("cgroup.controllers", "cpu io memory pids\n"),
                        // A child group as systemd makes them, without memory.reclaim
                        // (Linux < 5.19) and without swap accounting.
                        dir("system.slice", vec![
                            file("memory.current", "0\n"),
                            file("memory.high", "max\n"),
                            file("memory.max", "max\n"),
                            file("memory.low", "0\n"),
                            file("memory.min", "0\n"),
                            file("memory.pressure", ""),
                            file("memory.events", ""),
                        ]),
                    ])]),
                    dir("kernel", vec![dir("mm", vec![dir("transparent_hugepage", vec![
                        file("enabled", "always madvise [never]\n"),
                    ])])]),
                ],
            ),
            dir("dev", vec![file("userfaultfd", "")]),
        ]);
        let c = file_checks(&roots);
        let cg = get(&c, "cgroup");
        assert_eq!(cg.status, Status::Ok);
        assert!(
            cg.reading
                .starts_with("cgroup2 at /sys/fs/cgroup with memory; v2 memory files ("),
            "{cg:?}"
        );
        assert!(
            cg.reading.ends_with(
                "system.slice): memory.high memory.max memory.low memory.min memory.pressure memory.events; missing: memory.reclaim memory.swap.max"
            ),
            "{cg:?}"
        );
        let sw = get(&c, "swap");
        assert_eq!(sw.status, Status::Ok);
        assert!(
            sw.reading
                .contains("/dev/zram0 (partition, 4194300 KiB); 1 on zram; no zswap"),
            "{sw:?}"
        );
        assert_eq!(get(&c, "psi").status, Status::Warn);
        assert_eq!(get(&c, "thp").status, Status::Warn);
        let uu = get(&c, "unprivileged_userfaultfd");
        assert!(uu.reading.contains("userfaultfd mode"), "{uu:?}");
        // No osrelease in this tree: a warning, never a panic.
        assert_eq!(get(&c, "kernel").status, Status::Warn);
    }

    #[test]
    fn a_node_without_a_memory_controller_warns() {
        let (_t, roots) = fake(vec![dir(
            "proc",
            vec![dir(
                "self",
                vec![file(
                    "mounts",
                    "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n",
                )],
            )],
        )]);
        let cg = get(&file_checks(&roots), "cgroup");
        assert_eq!(cg.status, Status::Warn);
        assert!(
            cg.reading.contains("no cgroup2") && cg.reading.contains("host"),
            "{cg:?}"
        );
    }

    #[test]
    fn the_selected_choice_is_the_bracketed_word() {
        assert_eq!(selected_choice("always [madvise] never"), Some("madvise"));
        assert_eq!(selected_choice("[always] madvise never\n"), Some("always"));
        assert_eq!(selected_choice("always madvise never"), None);
    }

    fn all_ok() -> Vec<Check> {
        CHECK_NAMES
            .iter()
            .map(|n| check(n, Status::Ok, "fine"))
            .collect()
    }

    const ALL: Enabled = Enabled {
        hermes: true,
        reclaim: true,
        tier: true,
        cgroup_scope: false,
    };

    #[test]
    fn a_cgroup_scope_needs_a_memory_controller() {
        let mut c = all_ok();
        for x in c.iter_mut().filter(|x| x.name == "cgroup") {
            x.status = Status::Warn;
            x.reading = "no memory controller".into();
        }
        let host = assess(&c, ALL);
        assert!(host[0].can_run);
        assert_eq!(host[0].why, "no memory controller: `host` scope only");
        let cg = assess(
            &c,
            Enabled {
                cgroup_scope: true,
                ..ALL
            },
        );
        assert!(!cg[0].can_run);
        assert!(
            cg[0]
                .why
                .starts_with("a cgroup scope needs a memory controller"),
            "{cg:?}"
        );
        assert!(!ready(&cg));
    }

    #[test]
    fn every_mechanism_runs_where_every_check_passes() {
        let v = assess(&all_ok(), ALL);
        let names: Vec<&str> = v.iter().map(|v| v.name).collect();
        assert_eq!(names, ["m3", "hermes", "reclaim", "tier", "libmemcolo"]);
        assert!(v.iter().all(|v| v.can_run && v.why.is_empty()), "{v:?}");
        assert!(ready(&v));
    }

    #[test]
    fn a_failed_requirement_stops_the_mechanisms_that_need_it_and_says_why() {
        let mut c = all_ok();
        for x in c.iter_mut() {
            if x.name == "process_madvise" {
                x.status = Status::Fail;
                x.reading = "ENOSYS".into();
            }
            if x.name == "swap" {
                x.status = Status::Warn;
            }
        }
        let v = assess(&c, ALL);
        let reclaim = v.iter().find(|v| v.name == "reclaim").unwrap();
        assert!(!reclaim.can_run);
        assert!(
            reclaim.why.contains("process_madvise") && reclaim.why.contains("ENOSYS"),
            "{reclaim:?}"
        );
        assert!(v.iter().filter(|v| v.name != "reclaim").all(|v| v.can_run));
        assert!(!ready(&v));
        // Reclaim off in the configuration: the node is ready for what is on.
        let off = assess(
            &c,
            Enabled {
                reclaim: false,
                ..ALL
            },
        );
        assert!(ready(&off));
    }

    #[test]
    fn a_limit_is_named_without_stopping_the_mechanism() {
        let mut c = all_ok();
        c.retain(|x| x.name != "cachestat");
        c.push(check("cachestat", Status::Warn, "ENOSYS"));
        let v = assess(&c, ALL);
        let h = v.iter().find(|v| v.name == "hermes").unwrap();
        assert!(h.can_run);
        assert_eq!(h.why, "no cachestat: mincore(2) instead");
    }

    #[test]
    fn a_check_left_out_counts_as_failed() {
        let c: Vec<Check> = all_ok()
            .into_iter()
            .filter(|x| x.name != "pidfd_open")
            .collect();
        let v = assess(&c, ALL);
        let m3 = v.iter().find(|v| v.name == "m3").unwrap();
        assert!(!m3.can_run);
        assert!(m3.why.contains("not checked"));
    }

    #[test]
    fn live_checks_name_each_check_once() {
        let roots = Roots::default();
        let all = run(&roots);
        let names: Vec<&str> = all.iter().map(|c| c.name).collect();
        assert_eq!(names, CHECK_NAMES);
    }
}
