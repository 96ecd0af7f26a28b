//! Readers of procfs: `/proc/meminfo`, `/proc/vmstat`, `/proc/pressure/*` and the
//! per-process files `stat`, `status`, `cmdline`, `cgroup`, `fd/` and `maps`.
//!
//! A [`ProcFs`] takes its root path so that tests point it at a fake tree; only
//! [`ProcFs::root`] reads the real `/proc`. Methods are named after the kernel file they
//! read, and every size is converted to bytes (procfs prints kB = KiB, or pages).
//! Formats follow Documentation/filesystems/proc.rst and `man 5 proc`.

use crate::error::{Error, Result};
use crate::psi::Psi;
use memcolo_policy::types::Pid;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where procfs is mounted on a normal system: the default of the agent's `procfs`
/// setting and the root of [`ProcFs::root`].
pub const PROC_ROOT: &str = "/proc";

/// A procfs mount (normally `/proc`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcFs {
    root: PathBuf,
}

/// `/proc/meminfo`, in bytes. Source: Documentation/filesystems/proc.rst, "meminfo".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemInfo {
    /// `MemTotal`: usable RAM.
    pub mem_total_bytes: u64,
    /// `MemFree`: RAM not used at all.
    pub mem_free_bytes: u64,
    /// `MemAvailable`: the kernel's estimate of memory available for new work without
    /// swapping (free + reclaimable page cache and slab, minus watermarks).
    pub mem_available_bytes: u64,
    /// `Buffers`: block-device page cache.
    pub buffers_bytes: u64,
    /// `Cached`: file page cache, including shmem/tmpfs.
    pub cached_bytes: u64,
    /// `Active(file)`: file pages on the active LRU.
    pub active_file_bytes: u64,
    /// `Inactive(file)`: file pages on the inactive LRU (the first to be reclaimed).
    pub inactive_file_bytes: u64,
    /// `AnonPages`: anonymous pages mapped into user page tables.
    pub anon_pages_bytes: u64,
    /// `Shmem`: shared memory and tmpfs.
    pub shmem_bytes: u64,
    /// `SwapTotal`.
    pub swap_total_bytes: u64,
    /// `SwapFree`.
    pub swap_free_bytes: u64,
    /// Every line of the file: values with a `kB` unit converted to bytes, values
    /// without a unit (the `HugePages_*` counts) as printed.
    pub raw: BTreeMap<String, u64>,
}

/// `/proc/<pid>/stat` (see `man 5 proc`, fields 1-24). Times are in clock ticks
/// ([`ProcFs::clock_ticks_per_sec`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PidStat {
    /// Field 1.
    pub pid: Pid,
    /// Field 2, without the parentheses; may contain spaces and parentheses itself.
    pub comm: String,
    /// Field 3: R, S, D, Z, T, t, X, I...
    pub state: char,
    /// Field 4.
    pub ppid: Pid,
    /// Field 10: minor page faults.
    pub minflt: u64,
    /// Field 12: major page faults (those that needed I/O).
    pub majflt: u64,
    /// Field 14: user-mode CPU time, in clock ticks.
    pub utime_ticks: u64,
    /// Field 15: kernel-mode CPU time, in clock ticks.
    pub stime_ticks: u64,
    /// Field 20.
    pub num_threads: u64,
    /// Field 22: start time after boot, in clock ticks.
    pub starttime_ticks: u64,
    /// Field 23: virtual memory size, in bytes.
    pub vsize_bytes: u64,
    /// Field 24: resident set size, in pages of [`ProcFs::page_size`] bytes.
    pub rss_pages: u64,
}

/// `/proc/<pid>/status`, in bytes. Kernel threads have no `Vm*`/`Rss*` lines: those
/// fields are then 0.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PidStatus {
    /// `Name`: the command name (as in `comm`, escaped by the kernel).
    pub name: String,
    /// `Tgid`: the thread-group id (the process id).
    pub tgid: Pid,
    /// `PPid`.
    pub ppid: Pid,
    /// `Uid`: the real user id (first of the four).
    pub uid: u32,
    /// `Uid`: real, effective, saved and filesystem user ids.
    pub uids: [u32; 4],
    /// `Gid`: real, effective, saved and filesystem group ids.
    pub gids: [u32; 4],
    /// `CapPrm`: permitted capabilities (bit set).
    pub cap_prm: u64,
    /// `CapEff`: effective capabilities (bit set).
    pub cap_eff: u64,
    /// `SigCgt`: signals the process catches (bit `n - 1` for signal `n`).
    pub sig_cgt: u64,
    /// `SigIgn`: signals the process ignores (bit `n - 1` for signal `n`).
    pub sig_ign: u64,
    /// `VmRSS`: resident set size = `RssAnon + RssFile + RssShmem`.
    pub vm_rss_bytes: u64,
    /// `VmHWM`: peak RSS.
    pub vm_hwm_bytes: u64,
    /// `RssAnon`: resident anonymous memory.
    pub rss_anon_bytes: u64,
    /// `RssFile`: resident file mappings.
    pub rss_file_bytes: u64,
    /// `RssShmem`: resident shared memory (shmem, tmpfs, shared anonymous mappings).
    pub rss_shmem_bytes: u64,
    /// `VmSwap`: anonymous memory swapped out.
    pub vm_swap_bytes: u64,
    /// `Threads`.
    pub threads: u64,
    /// `NSpid`: the process's id in each pid namespace it is in, from the namespace
    /// of the procfs mount (first) to its own (last); one entry outside any child pid
    /// namespace. Empty when the kernel does not show it (Linux < 4.1).
    pub nspid: Vec<Pid>,
}

/// One line of `/proc/<pid>/cgroup`: `hierarchy-ID:controller-list:cgroup-path`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CgroupLine {
    /// Hierarchy id; 0 for the cgroup v2 unified hierarchy.
    pub hierarchy_id: u32,
    /// Controllers bound to the hierarchy (`memory`, `name=systemd`...); empty for v2.
    pub controllers: Vec<String>,
    /// Path relative to the hierarchy's mount point, starting with `/`.
    pub path: String,
}

/// A regular file a process holds open or has mapped.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct OpenFile {
    /// The path as the kernel shows it (the fd link target or the maps path column).
    pub path: PathBuf,
    /// Device number (`st_dev`, as `makedev(major, minor)`).
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
}

/// `/proc/<pid>/smaps_rollup` (Linux 4.14+): the sums of `/proc/<pid>/smaps` over
/// every mapping, in bytes. Fields a kernel does not print are 0.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SmapsRollup {
    /// `Rss`: resident memory mapped by the process.
    pub rss_bytes: u64,
    /// `Pss`: proportional set size (each shared page divided among its mappers).
    pub pss_bytes: u64,
    /// `Pss_Anon`.
    pub pss_anon_bytes: u64,
    /// `Pss_File`.
    pub pss_file_bytes: u64,
    /// `Pss_Shmem`.
    pub pss_shmem_bytes: u64,
    /// `Shared_Clean`.
    pub shared_clean_bytes: u64,
    /// `Shared_Dirty`.
    pub shared_dirty_bytes: u64,
    /// `Private_Clean`.
    pub private_clean_bytes: u64,
    /// `Private_Dirty`.
    pub private_dirty_bytes: u64,
    /// `Referenced`: resident pages referenced since the last clear.
    pub referenced_bytes: u64,
    /// `Anonymous`.
    pub anonymous_bytes: u64,
    /// `AnonHugePages`: anonymous memory backed by transparent huge pages (THP).
    pub anon_huge_pages_bytes: u64,
    /// `Swap`: anonymous memory swapped out.
    pub swap_bytes: u64,
    /// `SwapPss`: proportional share of swap.
    pub swap_pss_bytes: u64,
    /// `Locked`: mlocked memory.
    pub locked_bytes: u64,
}

/// One line of `/proc/<pid>/maps`: a virtual memory area (VMA).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MapsEntry {
    /// Start address (inclusive).
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Permissions, e.g. `r-xp` (`p` private, `s` shared).
    pub perms: String,
    /// Offset into the mapped file, in bytes.
    pub offset: u64,
    /// Device of the mapped file (`makedev(major, minor)`), 0 for anonymous memory.
    pub dev: u64,
    /// Inode of the mapped file, 0 for anonymous memory.
    pub ino: u64,
    /// The path or pseudo-path (`[heap]`, `[stack]`, `[vdso]`, `[anon:name]`, a file,
    /// possibly with ` (deleted)`); `None` for unnamed anonymous memory.
    pub path: Option<String>,
}

impl MapsEntry {
    /// Length of the area in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the area maps a file (or shmem): inode is not 0.
    pub fn is_file_backed(&self) -> bool {
        self.ino != 0
    }
}

impl ProcFs {
    /// A procfs mounted (or faked) at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ProcFs { root: root.into() }
    }

    /// The real `/proc` ([`PROC_ROOT`]).
    pub fn root() -> Self {
        ProcFs::new(PROC_ROOT)
    }

    /// The root path of this procfs.
    pub fn path(&self) -> &Path {
        &self.root
    }

    fn pid_path(&self, pid: Pid, file: &str) -> PathBuf {
        self.root.join(pid.to_string()).join(file)
    }

    /// `/proc/meminfo`. Errors: [`Error::Parse`] when one of the fields of [`MemInfo`]
    /// is missing or a value is not a number.
    pub fn read_meminfo(&self) -> Result<MemInfo> {
        let path = self.root.join("meminfo");
        let text = read(&path)?;
        parse_meminfo(&text, &path)
    }

    /// `/proc/vmstat`: counter name to value (pages or events, as the kernel prints).
    pub fn read_vmstat(&self) -> Result<BTreeMap<String, u64>> {
        let path = self.root.join("vmstat");
        let text = read(&path)?;
        let mut out = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mut words = line.split_whitespace();
            let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
                return Err(Error::parse(
                    &path,
                    format!("expected `name value`, got `{line}`"),
                ));
            };
            let value = value
                .parse::<u64>()
                .map_err(|_| Error::parse(&path, format!("bad value in `{line}`")))?;
            out.insert(key.to_string(), value);
        }
        Ok(out)
    }

    /// `/proc/pressure/<resource>` (`memory`, `cpu`, `io` or `irq`). Errors: not found
    /// when the kernel has no PSI (`CONFIG_PSI=n` or `psi=0`).
    pub fn read_pressure(&self, resource: &str) -> Result<Psi> {
        if resource.is_empty() || resource.contains('/') || resource == ".." {
            return Err(Error::InvalidArgument {
                what: format!("PSI resource `{resource}`"),
            });
        }
        Psi::read(&self.root.join("pressure").join(resource))
    }

    /// Every process id (the numeric entries of the procfs root), sorted.
    pub fn pids(&self) -> Result<Vec<Pid>> {
        let dir = std::fs::read_dir(&self.root).map_err(|e| Error::io(&self.root, e))?;
        let mut pids = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| Error::io(&self.root, e))?;
            if let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<Pid>().ok())
            {
                if pid > 0 {
                    pids.push(pid);
                }
            }
        }
        pids.sort_unstable();
        Ok(pids)
    }

    /// The pid namespace of process `pid`: the inode number of `/proc/<pid>/ns/pid`
    /// (namespaces(7): two processes are in the same namespace when these are equal).
    pub fn pid_namespace(&self, pid: Pid) -> Result<u64> {
        use std::os::unix::fs::MetadataExt;
        let path = self.root.join(pid.to_string()).join("ns").join("pid");
        std::fs::metadata(&path)
            .map(|m| m.ino())
            .map_err(|e| Error::io(&path, e))
    }

    /// The pid namespace of the calling process (`/proc/self/ns/pid`).
    pub fn own_pid_namespace(&self) -> Result<u64> {
        use std::os::unix::fs::MetadataExt;
        let path = self.root.join("self").join("ns").join("pid");
        std::fs::metadata(&path)
            .map(|m| m.ino())
            .map_err(|e| Error::io(&path, e))
    }

    /// Every process directly in pid namespace `ns` (a [`pid_namespace`] value, not a
    /// namespace below it), by its pid there (its last `NSpid` entry), with its pid as
    /// this procfs names it. Cost: one `stat` per process of the procfs, and a `status`
    /// read per process in `ns`. Pids, not proofs: open one and check again.
    ///
    /// [`pid_namespace`]: ProcFs::pid_namespace
    pub fn pid_namespace_map(&self, ns: u64) -> Result<std::collections::HashMap<Pid, Pid>> {
        let mut map = std::collections::HashMap::new();
        for pid in self.pids()? {
            if self.pid_namespace(pid).ok() != Some(ns) {
                continue;
            }
            if let Some(&inner) = self
                .read_pid_status(pid)
                .ok()
                .as_ref()
                .and_then(|s| s.nspid.last())
            {
                map.insert(inner, pid);
            }
        }
        Ok(map)
    }

    /// `/proc/<pid>/stat`. The command name sits between the first `(` and the *last*
    /// `)`, since it may itself contain spaces and parentheses.
    pub fn read_pid_stat(&self, pid: Pid) -> Result<PidStat> {
        let path = self.pid_path(pid, "stat");
        let text = read(&path)?;
        parse_pid_stat(&text, &path)
    }

    /// `/proc/<pid>/status`.
    pub fn read_pid_status(&self, pid: Pid) -> Result<PidStatus> {
        let path = self.pid_path(pid, "status");
        let text = read(&path)?;
        parse_pid_status(&text, &path)
    }

    /// `/proc/<pid>/cmdline`, split at NUL bytes. Empty for kernel threads and zombies.
    pub fn read_pid_cmdline(&self, pid: Pid) -> Result<Vec<String>> {
        let path = self.pid_path(pid, "cmdline");
        let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        let mut args: Vec<String> = bytes
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if bytes.last() == Some(&0) || bytes.is_empty() {
            args.pop();
        }
        Ok(args)
    }

    /// `/proc/<pid>/cgroup`, one [`CgroupLine`] per hierarchy.
    pub fn read_pid_cgroup(&self, pid: Pid) -> Result<Vec<CgroupLine>> {
        let path = self.pid_path(pid, "cgroup");
        let text = read(&path)?;
        parse_cgroup_lines(&text, &path)
    }

    /// `/proc/<pid>/smaps_rollup`. Empty (all 0) for kernel threads.
    pub fn read_pid_smaps_rollup(&self, pid: Pid) -> Result<SmapsRollup> {
        let path = self.pid_path(pid, "smaps_rollup");
        let text = read(&path)?;
        parse_smaps_rollup(&text, &path)
    }

    /// `/proc/<pid>/maps`: every VMA in address order.
    pub fn read_pid_maps(&self, pid: Pid) -> Result<Vec<MapsEntry>> {
        let path = self.pid_path(pid, "maps");
        let text = read(&path)?;
        parse_maps(&text, &path)
    }

    /// `/proc/<pid>/maps` as the kernel prints it, for checks that need the columns
    /// [`MapsEntry`] leaves out (the device and inode of a mapped file, its offset).
    pub fn read_pid_maps_text(&self, pid: Pid) -> Result<String> {
        read(&self.pid_path(pid, "maps"))
    }

    /// Thread ids of the calling process: the entries of `/proc/self/task`, unsorted.
    /// Errors: [`Error::Io`] when the directory cannot be listed.
    pub fn read_self_task_tids(&self) -> Result<Vec<i32>> {
        let dir = self.root.join("self/task");
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
        Ok(entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
            .collect())
    }

    /// `<root>/<pid>/schedstat`: the first two fields, the time the process's main
    /// thread spent on a CPU and the time it spent runnable waiting for one
    /// (`sched_info` in Documentation/scheduler/sched-stats.rst). Errors:
    /// [`Error::Io`] (the process exited: [`Error::is_not_found`]); [`Error::Parse`]
    /// when a field is missing or not a number.
    pub fn read_pid_schedstat(&self, pid: Pid) -> Result<SchedStat> {
        let path = self.root.join(format!("{pid}/schedstat"));
        let text = read(&path)?;
        parse_schedstat(&text, &path)
    }

    /// `/proc/self/task/<tid>/schedstat` of a thread of the calling process, as
    /// [`ProcFs::read_pid_schedstat`] reads a process's.
    pub fn read_self_task_schedstat(&self, tid: i32) -> Result<SchedStat> {
        let path = self.root.join(format!("self/task/{tid}/schedstat"));
        let text = read(&path)?;
        parse_schedstat(&text, &path)
    }

    /// The target of the calling process's descriptor link `/proc/self/fd/<fd>`: a
    /// path, or a pseudo-name such as `anon_inode:[userfaultfd]` or `/memfd:name`
    /// (`proc_fd_link` in fs/proc/fd.c).
    pub fn read_self_fd_link(&self, fd: RawFd) -> Result<PathBuf> {
        let path = self.root.join(format!("self/fd/{fd}"));
        std::fs::read_link(&path).map_err(|e| Error::io(&path, e))
    }

    /// `/proc/self/fdinfo/<fd>` of the calling process: `pos`, `flags`, `mnt_id`, then
    /// lines particular to the file's kind (for a userfaultfd, `API:`), as text.
    pub fn read_self_fdinfo(&self, fd: RawFd) -> Result<String> {
        read(&self.root.join(format!("self/fdinfo/{fd}")))
    }

    /// A sysctl by its dotted name (`vm.unprivileged_userfaultfd` reads
    /// `/proc/sys/vm/unprivileged_userfaultfd`), trimmed of surrounding white space.
    /// Errors: [`Error::InvalidArgument`] for a name with an empty component, `/` or
    /// `..`; [`Error::Io`] when the file cannot be read.
    pub fn read_sysctl(&self, name: &str) -> Result<String> {
        if name.is_empty() || name.contains('/') || name.split('.').any(|c| c.is_empty()) {
            return Err(Error::InvalidArgument {
                what: format!("sysctl name {name:?}"),
            });
        }
        let mut path = self.root.join("sys");
        path.extend(name.split('.'));
        Ok(read(&path)?.trim().to_string())
    }

    /// Regular files the process holds open (`/proc/<pid>/fd/*`) or has mapped
    /// (`/proc/<pid>/maps`), deduplicated by `(dev, ino)` and sorted by path.
    ///
    /// Open files are found by `stat()` through each fd link (so `dev`/`ino` are the
    /// file's own); mapped files by the `dev` and `inode` columns of `maps`. Skipped:
    /// sockets, pipes, anonymous inodes, deleted files, anything that is not a regular
    /// file, and paths under `/dev`, `/proc` and `/sys`.
    ///
    /// The paths are descriptive: a process controls what its files' paths lead to
    /// (a FIFO, a symlink, a bind mount in its own namespaces), so never open them
    /// on its behalf; reach its files with [`crate::filecache::ProcessFiles`].
    ///
    /// Errors: when the process has exited before its `fd/` directory or its `maps`
    /// could be opened, an error for which [`Error::is_not_found`] is true. An fd closed
    /// while the walk runs is skipped. Reading another user's process needs
    /// `CAP_SYS_PTRACE` (or root): otherwise an `EACCES` [`Error::Io`].
    pub fn read_pid_files(&self, pid: Pid) -> Result<Vec<OpenFile>> {
        let mut seen = HashSet::new();
        let mut files = Vec::new();
        let mut push = |f: OpenFile| {
            if seen.insert((f.dev, f.ino)) {
                files.push(f);
            }
        };

        let fd_dir = self.pid_path(pid, "fd");
        let entries = std::fs::read_dir(&fd_dir).map_err(|e| Error::io(&fd_dir, e))?;
        for entry in entries {
            // An error here (ESRCH when the process exits mid-listing) ends the walk.
            let entry = entry.map_err(|e| Error::io(&fd_dir, e))?;
            let link = entry.path();
            let target = match std::fs::read_link(&link) {
                Ok(t) => t,
                Err(e) if is_gone(&e) => continue, // fd closed meanwhile
                Err(e) => return Err(Error::io(&link, e)),
            };
            if !is_interesting_path(&target) {
                continue;
            }
            let meta = match std::fs::metadata(&link) {
                Ok(m) => m,
                Err(e) if is_gone(&e) => continue,
                Err(e) => return Err(Error::io(&link, e)),
            };
            if !meta.file_type().is_file() {
                continue;
            }
            push(OpenFile {
                path: target,
                dev: meta.dev(),
                ino: meta.ino(),
            });
        }

        let maps_path = self.pid_path(pid, "maps");
        let maps = read(&maps_path)?;
        for mapped in parse_maps_files(&maps, &maps_path)? {
            push(mapped);
        }
        files.sort();
        Ok(files)
    }

    /// `sysconf(_SC_CLK_TCK)`: the unit of the `*_ticks` fields (100 on Linux).
    pub fn clock_ticks_per_sec() -> u64 {
        // SAFETY: sysconf has no memory-safety preconditions.
        let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if v > 0 {
            v as u64
        } else {
            100
        }
    }

    /// `sysconf(_SC_PAGESIZE)`: the unit of [`PidStat::rss_pages`] (4096 on x86_64).
    pub fn page_size() -> u64 {
        // SAFETY: sysconf has no memory-safety preconditions.
        let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if v > 0 {
            v as u64
        } else {
            4096
        }
    }
}

/// The scheduler's per-thread counters (`/proc/PID/task/TID/schedstat`), in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SchedStat {
    /// Field 1: time spent on a CPU.
    pub run_ns: u64,
    /// Field 2: time spent runnable, waiting for a CPU.
    pub wait_ns: u64,
}

/// Parses a `schedstat` line (`run_ns wait_ns timeslices`); the third field is
/// optional. Errors: [`Error::Parse`] when field 1 or 2 is missing or not a number.
pub fn parse_schedstat(text: &str, path: &Path) -> Result<SchedStat> {
    let mut f = text.split_whitespace().map(str::parse::<u64>);
    match (f.next(), f.next()) {
        (Some(Ok(run_ns)), Some(Ok(wait_ns))) => Ok(SchedStat { run_ns, wait_ns }),
        _ => Err(Error::parse(
            path,
            format!("not `run_ns wait_ns ...`: {text:?}"),
        )),
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

fn is_gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// Whether an fd-link target or a maps path can name a regular file worth reporting.
fn is_interesting_path(p: &Path) -> bool {
    let Some(s) = p.to_str() else {
        return p.is_absolute();
    };
    s.starts_with('/')
        && !s.ends_with(" (deleted)")
        && !["/dev/", "/proc/", "/sys/", "/memfd:"]
            .iter()
            .any(|prefix| s.starts_with(prefix))
}

/// Parses `/proc/meminfo` text.
pub fn parse_meminfo(text: &str, path: &Path) -> Result<MemInfo> {
    let mut raw = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (key, rest) = line
            .split_once(':')
            .ok_or_else(|| Error::parse(path, format!("expected `Key: value`, got `{line}`")))?;
        let mut words = rest.split_whitespace();
        let value = words
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| Error::parse(path, format!("bad value in `{line}`")))?;
        let value = match words.next() {
            None => value,
            Some("kB") => value.saturating_mul(1024),
            Some(unit) => {
                return Err(Error::parse(
                    path,
                    format!("unknown unit `{unit}` in `{line}`"),
                ))
            }
        };
        raw.insert(key.trim().to_string(), value);
    }
    let get = |k: &str| {
        raw.get(k)
            .copied()
            .ok_or_else(|| Error::parse(path, format!("missing {k}")))
    };
    Ok(MemInfo {
        mem_total_bytes: get("MemTotal")?,
        mem_free_bytes: get("MemFree")?,
        mem_available_bytes: get("MemAvailable")?,
        buffers_bytes: get("Buffers")?,
        cached_bytes: get("Cached")?,
        active_file_bytes: get("Active(file)")?,
        inactive_file_bytes: get("Inactive(file)")?,
        anon_pages_bytes: get("AnonPages")?,
        shmem_bytes: get("Shmem")?,
        swap_total_bytes: get("SwapTotal")?,
        swap_free_bytes: get("SwapFree")?,
        raw,
    })
}

/// Parses `/proc/<pid>/stat` text.
pub fn parse_pid_stat(text: &str, path: &Path) -> Result<PidStat> {
    let text = text.trim_end();
    let open = text
        .find('(')
        .ok_or_else(|| Error::parse(path, "no `(` before the command name"))?;
    let close = text
        .rfind(')')
        .filter(|c| *c > open)
        .ok_or_else(|| Error::parse(path, "no `)` after the command name"))?;
    let pid = text[..open]
        .trim()
        .parse::<Pid>()
        .map_err(|_| Error::parse(path, format!("bad pid `{}`", text[..open].trim())))?;
    let comm = text[open + 1..close].to_string();
    // Fields from 3 (state) on; field n sits at index n - 3.
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    if rest.len() < 22 {
        return Err(Error::parse(
            path,
            format!("expected at least 24 fields, got {}", rest.len() + 2),
        ));
    }
    let field = |n: usize| -> Result<u64> {
        rest[n - 3].parse::<u64>().map_err(|_| {
            Error::parse(
                path,
                format!("field {n} is not a number: `{}`", rest[n - 3]),
            )
        })
    };
    let mut state_chars = rest[0].chars();
    let state = match (state_chars.next(), state_chars.next()) {
        (Some(c), None) => c,
        _ => return Err(Error::parse(path, format!("bad state `{}`", rest[0]))),
    };
    let ppid = rest[1]
        .parse::<Pid>()
        .map_err(|_| Error::parse(path, format!("bad ppid `{}`", rest[1])))?;
    Ok(PidStat {
        pid,
        comm,
        state,
        ppid,
        minflt: field(10)?,
        majflt: field(12)?,
        utime_ticks: field(14)?,
        stime_ticks: field(15)?,
        num_threads: field(20)?,
        starttime_ticks: field(22)?,
        vsize_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

/// Parses `/proc/<pid>/status` text.
pub fn parse_pid_status(text: &str, path: &Path) -> Result<PidStatus> {
    let mut out = PidStatus::default();
    let (mut have_name, mut have_uid) = (false, false);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let kib = || -> Result<u64> {
            let mut w = value.split_whitespace();
            match (w.next().map(str::parse::<u64>), w.next()) {
                (Some(Ok(v)), Some("kB")) => Ok(v.saturating_mul(1024)),
                _ => Err(Error::parse(path, format!("expected `<n> kB` in `{line}`"))),
            }
        };
        let num = || -> Result<u64> {
            value
                .parse::<u64>()
                .map_err(|_| Error::parse(path, format!("bad number in `{line}`")))
        };
        match key {
            "Name" => {
                out.name = value.to_string();
                have_name = true;
            }
            "Tgid" => out.tgid = num()? as Pid,
            "PPid" => out.ppid = num()? as Pid,
            "Uid" | "Gid" => {
                let mut ids = [0u32; 4];
                let mut w = value.split_whitespace();
                for id in ids.iter_mut() {
                    *id = w
                        .next()
                        .and_then(|v| v.parse::<u32>().ok())
                        .ok_or_else(|| Error::parse(path, format!("bad {key} line `{line}`")))?;
                }
                if key == "Uid" {
                    out.uid = ids[0];
                    out.uids = ids;
                    have_uid = true;
                } else {
                    out.gids = ids;
                }
            }
            "CapPrm" | "CapEff" | "SigCgt" | "SigIgn" => {
                let v = u64::from_str_radix(value, 16)
                    .map_err(|_| Error::parse(path, format!("bad {key} line `{line}`")))?;
                match key {
                    "CapPrm" => out.cap_prm = v,
                    "CapEff" => out.cap_eff = v,
                    "SigCgt" => out.sig_cgt = v,
                    _ => out.sig_ign = v,
                }
            }
            "VmRSS" => out.vm_rss_bytes = kib()?,
            "VmHWM" => out.vm_hwm_bytes = kib()?,
            "RssAnon" => out.rss_anon_bytes = kib()?,
            "RssFile" => out.rss_file_bytes = kib()?,
            "RssShmem" => out.rss_shmem_bytes = kib()?,
            "VmSwap" => out.vm_swap_bytes = kib()?,
            "Threads" => out.threads = num()?,
            "NSpid" => {
                out.nspid = value
                    .split_whitespace()
                    .map(|v| v.parse::<Pid>())
                    .collect::<std::result::Result<_, _>>()
                    .map_err(|_| Error::parse(path, format!("bad NSpid line `{line}`")))?
            }
            _ => {}
        }
    }
    if !have_name {
        return Err(Error::parse(path, "missing Name"));
    }
    if !have_uid {
        return Err(Error::parse(path, "missing Uid"));
    }
    Ok(out)
}

/// Parses `/proc/<pid>/cgroup` text.
pub fn parse_cgroup_lines(text: &str, path: &Path) -> Result<Vec<CgroupLine>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(ctrl), Some(cg_path)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(Error::parse(
                    path,
                    format!("expected `id:controllers:path`, got `{line}`"),
                ));
            };
            let hierarchy_id = id
                .parse::<u32>()
                .map_err(|_| Error::parse(path, format!("bad hierarchy id in `{line}`")))?;
            let controllers = ctrl
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            Ok(CgroupLine {
                hierarchy_id,
                controllers,
                path: cg_path.to_string(),
            })
        })
        .collect()
}

/// Parses `/proc/<pid>/maps` text. Line format:
/// `start-end perms offset major:minor inode [path]` (addresses, offset and device in
/// hex, inode in decimal; the path may contain spaces).
pub fn parse_maps(text: &str, path: &Path) -> Result<Vec<MapsEntry>> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut rest = line;
        let mut cols = [""; 5];
        for col in cols.iter_mut() {
            let trimmed = rest.trim_start();
            let end = trimmed.find(' ').unwrap_or(trimmed.len());
            *col = &trimmed[..end];
            rest = &trimmed[end..];
        }
        if cols[4].is_empty() {
            return Err(Error::parse(
                path,
                format!("expected 5 or 6 columns, got `{line}`"),
            ));
        }
        let bad = |what: &str| Error::parse(path, format!("bad {what} in `{line}`"));
        let (start, end) = cols[0]
            .split_once('-')
            .and_then(|(a, b)| {
                Some((
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                ))
            })
            .filter(|(a, b)| a <= b)
            .ok_or_else(|| bad("address range"))?;
        let offset = u64::from_str_radix(cols[2], 16).map_err(|_| bad("offset"))?;
        let (major, minor) = cols[3]
            .split_once(':')
            .and_then(|(ma, mi)| {
                Some((
                    u32::from_str_radix(ma, 16).ok()?,
                    u32::from_str_radix(mi, 16).ok()?,
                ))
            })
            .ok_or_else(|| bad("device"))?;
        let ino = cols[4].parse::<u64>().map_err(|_| bad("inode"))?;
        let name = rest.trim_start();
        out.push(MapsEntry {
            start,
            end,
            perms: cols[1].to_string(),
            offset,
            dev: libc::makedev(major, minor),
            ino,
            path: (!name.is_empty()).then(|| name.to_string()),
        });
    }
    Ok(out)
}

/// The file-backed mappings of `/proc/<pid>/maps` text that pass the filters of
/// [`ProcFs::read_pid_files`], deduplicated by `(dev, ino)`, in order of appearance.
pub fn parse_maps_files(text: &str, path: &Path) -> Result<Vec<OpenFile>> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for vma in parse_maps(text, path)? {
        let Some(file) = vma.path else { continue };
        if vma.ino == 0 || !is_interesting_path(Path::new(&file)) {
            continue;
        }
        if seen.insert((vma.dev, vma.ino)) {
            out.push(OpenFile {
                path: PathBuf::from(file),
                dev: vma.dev,
                ino: vma.ino,
            });
        }
    }
    Ok(out)
}

/// Parses `/proc/<pid>/smaps_rollup` text (the first line is the `[rollup]` pseudo-VMA).
pub fn parse_smaps_rollup(text: &str, path: &Path) -> Result<SmapsRollup> {
    let mut out = SmapsRollup::default();
    let mut seen_rss = false;
    for line in text
        .lines()
        .skip_while(|l| l.contains("[rollup]") || l.trim().is_empty())
    {
        let (key, value) = line
            .split_once(':')
            .ok_or_else(|| Error::parse(path, format!("expected `Key: n kB`, got `{line}`")))?;
        let mut w = value.split_whitespace();
        let bytes = match (w.next().map(str::parse::<u64>), w.next()) {
            (Some(Ok(v)), Some("kB")) => v.saturating_mul(1024),
            _ => return Err(Error::parse(path, format!("expected `<n> kB` in `{line}`"))),
        };
        let field = match key {
            "Rss" => {
                seen_rss = true;
                &mut out.rss_bytes
            }
            "Pss" => &mut out.pss_bytes,
            "Pss_Anon" => &mut out.pss_anon_bytes,
            "Pss_File" => &mut out.pss_file_bytes,
            "Pss_Shmem" => &mut out.pss_shmem_bytes,
            "Shared_Clean" => &mut out.shared_clean_bytes,
            "Shared_Dirty" => &mut out.shared_dirty_bytes,
            "Private_Clean" => &mut out.private_clean_bytes,
            "Private_Dirty" => &mut out.private_dirty_bytes,
            "Referenced" => &mut out.referenced_bytes,
            "Anonymous" => &mut out.anonymous_bytes,
            "AnonHugePages" => &mut out.anon_huge_pages_bytes,
            "Swap" => &mut out.swap_bytes,
            "SwapPss" => &mut out.swap_pss_bytes,
            "Locked" => &mut out.locked_bytes,
            _ => continue,
        };
        *field = bytes;
    }
    // A kernel thread's smaps_rollup is empty; anything else must have Rss.
    if !seen_rss && !text.trim().is_empty() {
        return Err(Error::parse(path, "missing Rss"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_takes_run_and_wait_times() {
        let p = Path::new("schedstat");
        let s = parse_schedstat("123456 789 42\n", p).unwrap();
        assert_eq!(
            s,
            SchedStat {
                run_ns: 123_456,
                wait_ns: 789
            }
        );
        assert_eq!(parse_schedstat("5 6", p).unwrap().wait_ns, 6);
        for bad in ["", "5", "5 x 1", "-1 2 3"] {
            assert!(parse_schedstat(bad, p).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sysctl_names_are_dotted_and_stay_under_sys() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("sys/vm")).unwrap();
        std::fs::write(t.path().join("sys/vm/unprivileged_userfaultfd"), "1\n").unwrap();
        let fs = ProcFs::new(t.path());
        assert_eq!(fs.read_sysctl("vm.unprivileged_userfaultfd").unwrap(), "1");
        for bad in ["", "vm/x", "vm..x", ".vm", "vm."] {
            assert!(
                matches!(fs.read_sysctl(bad), Err(Error::InvalidArgument { .. })),
                "{bad:?}"
            );
        }
        assert!(fs.read_sysctl("vm.absent").unwrap_err().is_not_found());
    }

    #[test]
    fn self_readers_see_this_process() {
        let fs = ProcFs::root();
        let me = nix::unistd::gettid().as_raw();
        assert!(fs.read_self_task_tids().unwrap().contains(&me));
        fs.read_self_task_schedstat(me).unwrap();
        let f = std::fs::File::open(file!()).or_else(|_| std::fs::File::open("Cargo.toml"));
        let f = f.unwrap();
        let n = std::os::fd::AsRawFd::as_raw_fd(&f);
        assert!(fs.read_self_fd_link(n).unwrap().is_absolute());
        assert!(fs.read_self_fdinfo(n).unwrap().contains("flags:"));
        let mine = std::process::id() as Pid;
        assert_eq!(
            fs.read_pid_maps_text(mine).unwrap().lines().count(),
            fs.read_pid_maps(mine).unwrap().len()
        );
    }

    #[test]
    fn stat_comm_with_spaces_and_parens() {
        let text = "8928 (db (x) srv) S 1 8922 6902 0 -1 4194304 3100 0 6 0 0 1 0 0 20 0 1 0 \
                    23079 23887872 4291 18446744073709551615 4321280 7148169";
        let st = parse_pid_stat(text, Path::new("/proc/8928/stat")).unwrap();
        assert_eq!(st.pid, 8928);
        assert_eq!(st.comm, "db (x) srv");
        assert_eq!(st.state, 'S');
        assert_eq!(st.ppid, 1);
        assert_eq!(st.minflt, 3100);
        assert_eq!(st.majflt, 6);
        assert_eq!(st.utime_ticks, 0);
        assert_eq!(st.stime_ticks, 1);
        assert_eq!(st.num_threads, 1);
        assert_eq!(st.starttime_ticks, 23079);
        assert_eq!(st.vsize_bytes, 23_887_872);
        assert_eq!(st.rss_pages, 4291);
    }

    #[test]
    fn stat_rejects_truncated_lines() {
        let p = Path::new("/proc/1/stat");
        for text in [
            "",
            "1 (init S 0",
            "1 (init) S 0 1 1 0",
            "x (a) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22",
        ] {
            let err = parse_pid_stat(text, p).unwrap_err();
            assert!(matches!(err, Error::Parse { .. }), "{text:?}");
        }
    }

    #[test]
    fn maps_keeps_regular_files_only() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:00 100   /usr/bin/my prog\n\
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:00 100   /usr/bin/my prog\n\
7f00000000-7f00001000 rw-p 00000000 00:00 0 \n\
7f00001000-7f00002000 rw-s 00000000 00:01 2048  /dev/zero (deleted)\n\
7f00002000-7f00003000 rw-s 00000000 00:01 2049  /memfd:pool (deleted)\n\
7f00003000-7f00004000 r--s 00000000 fe:00 813273  /var/tmp/x.bin (deleted)\n\
7f00004000-7f00005000 r--p 00000000 00:05 12  /dev/nvidia0\n\
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0   [stack]\n\
7ffd00030000-7ffd00031000 r-xp 00000000 00:00 0   [vdso]\n";
        let files = parse_maps_files(text, Path::new("/proc/1/maps")).unwrap();
        assert_eq!(
            files,
            vec![OpenFile {
                path: PathBuf::from("/usr/bin/my prog"),
                dev: libc::makedev(0xfe, 0),
                ino: 100
            }]
        );
    }

    #[test]
    fn maps_malformed_names_path() {
        for text in [
            "55d0-55d1 r--p 00000000 fe:00\n",
            "55d0-55d1 r--p 0 zz:00 1 /a\n",
            "55d0-55d1 r--p 0 fe:00 x /a\n",
        ] {
            let err = parse_maps_files(text, Path::new("/proc/9/maps")).unwrap_err();
            assert!(err.to_string().contains("/proc/9/maps"), "{err}");
        }
    }

    #[test]
    fn cgroup_lines_v1_and_v2() {
        let lines = parse_cgroup_lines(
            "4:memory:/process_api/abc\n9:name=systemd:/\n3:cpu,cpuacct:/a:b\n0::/user.slice\n",
            Path::new("/proc/1/cgroup"),
        )
        .unwrap();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0].controllers, vec!["memory"]);
        assert_eq!(lines[0].path, "/process_api/abc");
        assert_eq!(lines[2].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(lines[2].path, "/a:b");
        assert_eq!(lines[3].hierarchy_id, 0);
        assert!(lines[3].controllers.is_empty());
        assert!(parse_cgroup_lines("4:memory\n", Path::new("/p")).is_err());
        assert!(parse_cgroup_lines("x:memory:/\n", Path::new("/p")).is_err());
    }

    #[test]
    fn status_of_kernel_thread_has_zero_rss() {
        let text =
            "Name:\tkthreadd\nUmask:\t0000\nState:\tS (sleeping)\nTgid:\t2\nNgid:\t0\nPid:\t2\n\
                    PPid:\t0\nTracerPid:\t0\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nThreads:\t1\n";
        let st = parse_pid_status(text, Path::new("/proc/2/status")).unwrap();
        assert_eq!(st.name, "kthreadd");
        assert_eq!(st.tgid, 2);
        assert_eq!(st.vm_rss_bytes, 0);
        assert_eq!(st.threads, 1);
    }
}
