//! Memory cgroups, v1 and v2, behind one type.
//!
//! [`MemoryCgroup`] takes the directory of a group and detects the version from the
//! files present: `memory.usage_in_bytes` (v1, Documentation/admin-guide/cgroup-v1/
//! memory.rst) or `memory.current` (v2, Documentation/admin-guide/cgroup-v2.rst,
//! "Memory"). Methods are named after what they read; the kernel file is in each doc.
//! A limit is a [`Limit`], never `-1` or `"max"`.

use crate::error::{Error, Result};
use crate::procfs::ProcFs;
use crate::psi::Psi;
use memcolo_policy::types::Pid;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Which cgroup hierarchy a group belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// A memory limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Limit {
    /// A limit in bytes.
    Bytes(u64),
    /// No limit: v2 `max`; v1 any value >= 2^62 (v1 prints `PAGE_COUNTER_MAX` pages,
    /// 9223372036854771712 on 4 KiB pages).
    Max,
}

/// Values of v1 at or above this are "unlimited".
pub const V1_UNLIMITED_BYTES: u64 = 1 << 62;

impl Limit {
    /// The limit in bytes, or `None` for [`Limit::Max`].
    pub fn bytes(self) -> Option<u64> {
        match self {
            Limit::Bytes(b) => Some(b),
            Limit::Max => None,
        }
    }

    /// The smaller of two limits.
    pub fn min(self, other: Limit) -> Limit {
        match (self, other) {
            (Limit::Max, x) | (x, Limit::Max) => x,
            (Limit::Bytes(a), Limit::Bytes(b)) => Limit::Bytes(a.min(b)),
        }
    }
}

/// `memory.stat` of a group, in bytes (counters as counts).
///
/// v1: the hierarchical `total_*` fields (this group and its descendants), falling back
/// to the local field when `total_*` is absent. v2 `memory.stat` is hierarchical already;
/// v2 swap comes from `memory.swap.current`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryStat {
    /// Page cache, including shmem/tmpfs (v1 `total_cache`, v2 `file`).
    pub file_bytes: u64,
    /// Anonymous memory (v1 `total_rss`, v2 `anon`).
    pub anon_bytes: u64,
    /// File pages on the inactive LRU (v1 `total_inactive_file`, v2 `inactive_file`).
    pub inactive_file_bytes: u64,
    /// File pages on the active LRU.
    pub active_file_bytes: u64,
    /// Swap in use (v1 `total_swap`, 0 without swap accounting; v2 `memory.swap.current`).
    pub swap_bytes: u64,
    /// Refaults of evicted pages (`workingset_refault_anon + workingset_refault_file`,
    /// or `workingset_refault` before Linux 5.9); `None` if the kernel has neither.
    pub workingset_refault: Option<u64>,
    /// Major page faults (`pgmajfault`), if reported.
    pub pgmajfault: Option<u64>,
    /// Every line of the file, as printed.
    pub raw: BTreeMap<String, u64>,
}

/// Limit and OOM event counters of a group since its creation.
///
/// v2: `memory.events` (hierarchical). v1 has no such file: `max` is `memory.failcnt`
/// (charges that hit the limit) and `oom_kill` comes from `memory.oom_control`; the
/// counters v1 lacks are `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryEvents {
    /// Times usage was reclaimed below `memory.low` protection (v2).
    pub low: Option<u64>,
    /// Times usage went over `memory.high` and the group was throttled (v2).
    pub high: Option<u64>,
    /// Times usage was about to go over the hard limit.
    pub max: u64,
    /// Times the group hit the limit and the OOM killer was invoked (v2).
    pub oom: Option<u64>,
    /// Processes killed by the OOM killer in the group.
    pub oom_kill: u64,
    /// Whether the group is under OOM right now (v1 `under_oom`).
    pub under_oom: Option<bool>,
}

/// What [`MemoryCgroup::read_procs_bounded`] read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcsWalk {
    /// Processes found, sorted.
    pub pids: Vec<Pid>,
    /// Groups whose `cgroup.procs` was read or tried.
    pub groups: usize,
    /// The walk stopped at its bound, or skipped a group it could not read: some
    /// processes below may be missing.
    pub truncated: bool,
}

/// One memory cgroup directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryCgroup {
    path: PathBuf,
    version: CgroupVersion,
}

impl MemoryCgroup {
    /// Opens the group at `path`, detecting v1 (`memory.usage_in_bytes`) or v2
    /// (`memory.current`; or, for the v2 root, `memory` in `cgroup.controllers`).
    /// Errors: not found when `path` does not exist; [`Error::Unsupported`] when it has
    /// no memory controller.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?;
        let version = if path.join("memory.usage_in_bytes").exists() {
            CgroupVersion::V1
        } else if path.join("memory.current").exists()
            || std::fs::read_to_string(path.join("cgroup.controllers"))
                .map(|c| c.split_whitespace().any(|w| w == "memory"))
                .unwrap_or(false)
        {
            CgroupVersion::V2
        } else {
            return Err(Error::Unsupported {
                what: format!(
                    "{} is not a memory cgroup (neither memory.usage_in_bytes nor memory.current)",
                    path.display()
                ),
            });
        };
        Ok(MemoryCgroup { path, version })
    }

    /// v1 or v2.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The group's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    fn read_file(&self, name: &str) -> Result<String> {
        let path = self.file(name);
        std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))
    }

    fn write_file(&self, name: &str, text: &str) -> Result<()> {
        let path = self.file(name);
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
    }

    fn read_u64(&self, name: &str) -> Result<u64> {
        let text = self.read_file(name)?;
        text.trim().parse::<u64>().map_err(|_| {
            Error::parse(
                self.file(name),
                format!("expected a number, got `{}`", text.trim()),
            )
        })
    }

    /// Memory charged to the group, page cache included, in bytes: v1
    /// `memory.usage_in_bytes`, v2 `memory.current`.
    pub fn read_usage_bytes(&self) -> Result<u64> {
        match self.version {
            CgroupVersion::V1 => self.read_u64("memory.usage_in_bytes"),
            CgroupVersion::V2 => self.read_u64("memory.current"),
        }
    }

    /// The group's own hard limit: v1 `memory.limit_in_bytes`, v2 `memory.max`. The v2
    /// root has no `memory.max`: [`Limit::Max`].
    pub fn read_limit(&self) -> Result<Limit> {
        match self.version {
            CgroupVersion::V1 => {
                let v = self.read_u64("memory.limit_in_bytes")?;
                Ok(if v >= V1_UNLIMITED_BYTES {
                    Limit::Max
                } else {
                    Limit::Bytes(v)
                })
            }
            CgroupVersion::V2 => {
                let path = self.file("memory.max");
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    Err(e)
                        if e.kind() == io::ErrorKind::NotFound
                            && !self.path.join("memory.current").exists() =>
                    {
                        return Ok(Limit::Max)
                    }
                    Err(e) => return Err(Error::io(&path, e)),
                };
                parse_v2_limit(&text, &path)
            }
        }
    }

    /// The limit that binds this group: the smallest limit of the group and its
    /// ancestors. v1 reads `hierarchical_memory_limit` from `memory.stat`; v2 walks up
    /// `memory.max` of each parent while the parent is a memory cgroup.
    pub fn read_effective_limit(&self) -> Result<Limit> {
        match self.version {
            CgroupVersion::V1 => {
                let stat = self.read_memory_stat()?;
                let own = self.read_limit()?;
                Ok(match stat.raw.get("hierarchical_memory_limit") {
                    Some(&v) if v < V1_UNLIMITED_BYTES => own.min(Limit::Bytes(v)),
                    _ => own,
                })
            }
            CgroupVersion::V2 => {
                let mut limit = self.read_limit()?;
                let mut dir = self.path.parent();
                while let Some(d) = dir {
                    if !d.join("memory.max").exists() {
                        break;
                    }
                    let path = d.join("memory.max");
                    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
                    limit = limit.min(parse_v2_limit(&text, &path)?);
                    dir = d.parent();
                }
                Ok(limit)
            }
        }
    }

    /// Sets the hard limit (v1 `memory.limit_in_bytes`, `-1` for max; v2 `memory.max`).
    /// Lowering a limit below usage makes the kernel reclaim first; `EBUSY` (v1) when it
    /// cannot.
    pub fn write_limit(&self, limit: Limit) -> Result<()> {
        match (self.version, limit) {
            (CgroupVersion::V1, Limit::Bytes(b)) => {
                self.write_file("memory.limit_in_bytes", &b.to_string())
            }
            (CgroupVersion::V1, Limit::Max) => self.write_file("memory.limit_in_bytes", "-1"),
            (CgroupVersion::V2, Limit::Bytes(b)) => self.write_file("memory.max", &b.to_string()),
            (CgroupVersion::V2, Limit::Max) => self.write_file("memory.max", "max"),
        }
    }

    /// Peak usage in bytes: v1 `memory.max_usage_in_bytes`, v2 `memory.peak` (Linux
    /// 5.19+; [`Error::Unsupported`] when absent).
    pub fn read_peak_bytes(&self) -> Result<u64> {
        match self.version {
            CgroupVersion::V1 => self.read_u64("memory.max_usage_in_bytes"),
            CgroupVersion::V2 => match self.read_u64("memory.peak") {
                Err(e) if e.is_not_found() => Err(Error::Unsupported {
                    what: format!("memory.peak in {} (Linux 5.19+)", self.path.display()),
                }),
                other => other,
            },
        }
    }

    /// v2 `memory.high`: the throttle limit above which the kernel reclaims and slows
    /// allocations instead of OOM-killing. v1 has none: [`Error::Unsupported`].
    pub fn read_high(&self) -> Result<Limit> {
        match self.version {
            CgroupVersion::V1 => Err(Error::Unsupported {
                what: format!("memory.high on cgroup v1 ({})", self.path.display()),
            }),
            CgroupVersion::V2 => {
                let path = self.file("memory.high");
                parse_v2_limit(&self.read_file("memory.high")?, &path)
            }
        }
    }

    /// Sets v2 `memory.high`. v1: [`Error::Unsupported`].
    pub fn write_high(&self, limit: Limit) -> Result<()> {
        match (self.version, limit) {
            (CgroupVersion::V1, _) => Err(Error::Unsupported {
                what: format!("memory.high on cgroup v1 ({})", self.path.display()),
            }),
            (CgroupVersion::V2, Limit::Bytes(b)) => self.write_file("memory.high", &b.to_string()),
            (CgroupVersion::V2, Limit::Max) => self.write_file("memory.high", "max"),
        }
    }

    /// Limit and OOM events, see [`MemoryEvents`].
    pub fn read_events(&self) -> Result<MemoryEvents> {
        let (name, text) = match self.version {
            CgroupVersion::V1 => ("memory.oom_control", self.read_file("memory.oom_control")?),
            CgroupVersion::V2 => ("memory.events", self.read_file("memory.events")?),
        };
        let path = self.file(name);
        let mut kv = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mut w = line.split_whitespace();
            let (Some(k), Some(v), None) = (w.next(), w.next(), w.next()) else {
                return Err(Error::parse(
                    &path,
                    format!("expected `name value`, got `{line}`"),
                ));
            };
            let v = v
                .parse::<u64>()
                .map_err(|_| Error::parse(&path, format!("bad value in `{line}`")))?;
            kv.insert(k.to_string(), v);
        }
        let need = |k: &str| {
            kv.get(k)
                .copied()
                .ok_or_else(|| Error::parse(&path, format!("missing {k}")))
        };
        match self.version {
            CgroupVersion::V1 => Ok(MemoryEvents {
                low: None,
                high: None,
                max: self.read_u64("memory.failcnt")?,
                oom: None,
                // `oom_kill` appeared in Linux 4.13.
                oom_kill: kv.get("oom_kill").copied().unwrap_or(0),
                under_oom: Some(need("under_oom")? != 0),
            }),
            CgroupVersion::V2 => Ok(MemoryEvents {
                low: Some(need("low")?),
                high: Some(need("high")?),
                max: need("max")?,
                oom: Some(need("oom")?),
                oom_kill: need("oom_kill")?,
                under_oom: None,
            }),
        }
    }

    /// `memory.stat`, see [`MemoryStat`].
    pub fn read_memory_stat(&self) -> Result<MemoryStat> {
        let path = self.file("memory.stat");
        let text = self.read_file("memory.stat")?;
        let mut stat = parse_memory_stat(&text, &path, self.version)?;
        if self.version == CgroupVersion::V2 {
            let swap = self.file("memory.swap.current");
            stat.swap_bytes = match std::fs::read_to_string(&swap) {
                Ok(t) => t.trim().parse::<u64>().map_err(|_| {
                    Error::parse(&swap, format!("expected a number, got `{}`", t.trim()))
                })?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
                Err(e) => return Err(Error::io(&swap, e)),
            };
        }
        Ok(stat)
    }

    /// v2 `memory.pressure` (PSI of this group); `Ok(None)` on v1, and on v2 when the
    /// kernel has no PSI.
    pub fn read_pressure(&self) -> Result<Option<Psi>> {
        match self.version {
            CgroupVersion::V1 => Ok(None),
            CgroupVersion::V2 => match Psi::read(&self.file("memory.pressure")) {
                Ok(psi) => Ok(Some(psi)),
                Err(e) if e.is_not_found() => Ok(None),
                Err(e) => Err(e),
            },
        }
    }

    /// Proactive reclaim: writes `bytes` to v2 `memory.reclaim` (Linux 5.19+). The
    /// kernel answers `EAGAIN` when it could not reclaim that much: an [`Error::Io`].
    /// v1 has no such file: [`Error::Unsupported`].
    pub fn reclaim(&self, bytes: u64) -> Result<()> {
        match self.version {
            CgroupVersion::V1 => Err(Error::Unsupported {
                what: format!("memory.reclaim on cgroup v1 ({})", self.path.display()),
            }),
            CgroupVersion::V2 => self.write_file("memory.reclaim", &bytes.to_string()),
        }
    }

    /// Processes (thread-group ids) in `cgroup.procs` of this group only, sorted.
    pub fn read_procs(&self) -> Result<Vec<Pid>> {
        let path = self.file("cgroup.procs");
        let text = self.read_file("cgroup.procs")?;
        let mut pids = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                l.trim()
                    .parse::<Pid>()
                    .map_err(|_| Error::parse(&path, format!("bad pid `{l}`")))
            })
            .collect::<Result<Vec<_>>>()?;
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// Processes of this group and of every descendant group, sorted. Groups removed
    /// during the walk are skipped. The walk has no bound: for a tree whose groups a
    /// tenant may create (a container's delegated subtree), use
    /// [`MemoryCgroup::read_procs_bounded`].
    pub fn read_procs_recursive(&self) -> Result<Vec<Pid>> {
        let mut pids = self.read_procs()?;
        let mut stack = self.children()?;
        while let Some(cg) = stack.pop() {
            match cg.read_procs() {
                Ok(p) => pids.extend(p),
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            }
            match cg.children() {
                Ok(c) => stack.extend(c),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// Processes of this group and of its descendants, breadth-first, reading at most
    /// `max_groups` groups (this one included; at least this one). Past the bound, and
    /// where a descendant cannot be read (removed or dying during the walk, or any
    /// other error), the walk stops there and says so in [`ProcsWalk::truncated`]: a
    /// subtree that a tenant fills with groups costs a bounded walk and never fails
    /// the caller. Errors: this group's own `cgroup.procs` or listing cannot be read.
    pub fn read_procs_bounded(&self, max_groups: usize) -> Result<ProcsWalk> {
        let mut pids = self.read_procs()?;
        let mut queue: std::collections::VecDeque<MemoryCgroup> = self.children()?.into();
        let mut groups = 1;
        let mut truncated = false;
        while let Some(cg) = queue.pop_front() {
            if groups >= max_groups {
                truncated = true;
                break;
            }
            groups += 1;
            match cg.read_procs() {
                Ok(p) => pids.extend(p),
                Err(e) => {
                    truncated |= !e.is_not_found();
                    continue;
                }
            }
            match cg.children() {
                Ok(c) => queue.extend(c),
                Err(e) => truncated |= !e.is_not_found(),
            }
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(ProcsWalk {
            pids,
            groups,
            truncated,
        })
    }

    /// Moves process `pid` (all its threads) into this group (`cgroup.procs`).
    pub fn add_proc(&self, pid: Pid) -> Result<()> {
        if pid <= 0 {
            return Err(Error::InvalidArgument {
                what: format!("pid {pid}"),
            });
        }
        self.write_file("cgroup.procs", &pid.to_string())
    }

    /// Creates (mkdir) the child group `name`, or opens it if it exists. `name` must be
    /// one path component: not empty, no `/`, not `.` or `..`, no NUL.
    ///
    /// On v2 a child group has the memory controller only when its parent enables it
    /// for its children: this writes `+memory` to this group's `cgroup.subtree_control`
    /// first when it is not there yet ([`MemoryCgroup::delegate_memory`]).
    pub fn create_child(&self, name: &str) -> Result<MemoryCgroup> {
        if name.is_empty()
            || name == "."
            || name == ".."
            || name.contains('/')
            || name.contains('\0')
        {
            return Err(Error::InvalidArgument {
                what: format!("cgroup name `{name}` (must be one non-empty path component)"),
            });
        }
        if self.version == CgroupVersion::V2 {
            self.delegate_memory()?;
        }
        let path = self.path.join(name);
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(&path, e)),
        }
        MemoryCgroup::open(path)
    }

    /// v2: enables the memory controller for this group's children, writing `+memory`
    /// to its `cgroup.subtree_control` unless `memory` is listed there already
    /// (Documentation/admin-guide/cgroup-v2.rst, "Enabling and Disabling"). v1: nothing
    /// to do. Errors: the kernel refuses with `EBUSY` a non-root group that has
    /// processes of its own (the "no internal process" rule): [`Error::Io`]; and with
    /// `ENOENT` when this group's parent does not delegate memory to it.
    pub fn delegate_memory(&self) -> Result<()> {
        if self.version == CgroupVersion::V1 {
            return Ok(());
        }
        let enabled = self.read_file("cgroup.subtree_control")?;
        if enabled.split_whitespace().any(|c| c == "memory") {
            return Ok(());
        }
        self.write_file("cgroup.subtree_control", "+memory")
    }

    /// The direct child groups, sorted by path.
    pub fn children(&self) -> Result<Vec<MemoryCgroup>> {
        let dir = std::fs::read_dir(&self.path).map_err(|e| Error::io(&self.path, e))?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| Error::io(&self.path, e))?;
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if !is_dir {
                continue;
            }
            match MemoryCgroup::open(entry.path()) {
                Ok(cg) => out.push(cg),
                Err(e) if e.is_not_found() => {}
                Err(Error::Unsupported { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Removes the group (rmdir). Errors: [`Error::CgroupBusy`] when it still has
    /// processes or child groups.
    pub fn remove(&self) -> Result<()> {
        match std::fs::remove_dir(&self.path) {
            Ok(()) => Ok(()),
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    || e.raw_os_error() == Some(libc::ENOTEMPTY) =>
            {
                Err(Error::CgroupBusy {
                    path: self.path.clone(),
                    procs: self.read_procs().map(|p| p.len()).unwrap_or(0),
                    children: self.children().map(|c| c.len()).unwrap_or(0),
                })
            }
            Err(e) => Err(Error::io(&self.path, e)),
        }
    }
}

fn parse_v2_limit(text: &str, path: &Path) -> Result<Limit> {
    match text.trim() {
        "max" => Ok(Limit::Max),
        v => v
            .parse::<u64>()
            .map(Limit::Bytes)
            .map_err(|_| Error::parse(path, format!("expected a number or `max`, got `{v}`"))),
    }
}

/// Parses `memory.stat` text of the given version (v2 swap is left at 0: it lives in
/// `memory.swap.current`).
pub fn parse_memory_stat(text: &str, path: &Path, version: CgroupVersion) -> Result<MemoryStat> {
    let mut raw = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
            return Err(Error::parse(
                path,
                format!("expected `name value`, got `{line}`"),
            ));
        };
        let value = value
            .parse::<u64>()
            .map_err(|_| Error::parse(path, format!("bad value in `{line}`")))?;
        raw.insert(key.to_string(), value);
    }
    // v1: prefer the hierarchical total_ field.
    let get = |k: &str| -> Option<u64> {
        match version {
            CgroupVersion::V1 => raw
                .get(&format!("total_{k}"))
                .or_else(|| raw.get(k))
                .copied(),
            CgroupVersion::V2 => raw.get(k).copied(),
        }
    };
    let need = |k: &str| get(k).ok_or_else(|| Error::parse(path, format!("missing {k}")));
    let (file_key, anon_key) = match version {
        CgroupVersion::V1 => ("cache", "rss"),
        CgroupVersion::V2 => ("file", "anon"),
    };
    let workingset_refault = match (
        get("workingset_refault_anon"),
        get("workingset_refault_file"),
    ) {
        (None, None) => get("workingset_refault"),
        (a, f) => Some(a.unwrap_or(0) + f.unwrap_or(0)),
    };
    Ok(MemoryStat {
        file_bytes: need(file_key)?,
        anon_bytes: need(anon_key)?,
        inactive_file_bytes: need("inactive_file")?,
        active_file_bytes: need("active_file")?,
        swap_bytes: match version {
            CgroupVersion::V1 => get("swap").unwrap_or(0),
            CgroupVersion::V2 => 0,
        },
        workingset_refault,
        pgmajfault: get("pgmajfault"),
        raw,
    })
}

/// Unescapes the octal escapes (`\040` for space...) of a `/proc/*/mounts` field.
fn unescape_mount_field(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = u32::from(bytes[i + 1] - b'0') * 64
                + u32::from(bytes[i + 2] - b'0') * 8
                + u32::from(bytes[i + 3] - b'0');
            out.push(v as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points from `<procfs>/self/mounts` whose filesystem type is `fstype` and
/// whose options satisfy `want`.
fn find_mount(
    procfs: &ProcFs,
    fstype: &str,
    want: impl Fn(&[&str]) -> bool,
) -> Result<Option<PathBuf>> {
    let path = procfs.path().join("self").join("mounts");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            return Err(Error::parse(
                &path,
                format!("expected 6 fields, got `{line}`"),
            ));
        }
        let opts: Vec<&str> = f[3].split(',').collect();
        if f[2] == fstype && want(&opts) {
            return Ok(Some(PathBuf::from(unescape_mount_field(f[1]))));
        }
    }
    Ok(None)
}

/// Where the cgroup v1 memory controller is mounted (normally `/sys/fs/cgroup/memory`),
/// from `<procfs>/self/mounts`. Errors: [`Error::Unsupported`] when it is not mounted.
pub fn v1_memory_mount(procfs: &ProcFs) -> Result<PathBuf> {
    find_mount(procfs, "cgroup", |opts| opts.contains(&"memory"))?.ok_or_else(|| {
        Error::Unsupported {
            what: "no cgroup v1 hierarchy with the memory controller is mounted".into(),
        }
    })
}

/// Where cgroup2 is mounted (e.g. `/sys/fs/cgroup` or `/sys/fs/cgroup/unified`).
/// Errors: [`Error::Unsupported`] when it is not mounted.
pub fn cgroup2_mount(procfs: &ProcFs) -> Result<PathBuf> {
    find_mount(procfs, "cgroup2", |_| true)?.ok_or_else(|| Error::Unsupported {
        what: "cgroup2 is not mounted".into(),
    })
}

/// The memory cgroup of the process that owns `procfs`'s `self`: the v1 `memory` line
/// of `<procfs>/self/cgroup` joined to the v1 memory mount; else the v2 (`0::`) line
/// joined to the cgroup2 mount, if that group has the memory controller.
pub fn own_memory_cgroup(procfs: &ProcFs) -> Result<MemoryCgroup> {
    MemoryCgroup::open(memory_cgroup_path(procfs, "self")?)
}

/// The directory of the memory cgroup of process `who` (a pid, or `self`), as
/// [`own_memory_cgroup`] finds it, without opening it. Errors: the process is gone
/// ([`Error::is_not_found`]), or no memory cgroup hierarchy names it.
pub fn memory_cgroup_path(procfs: &ProcFs, who: &str) -> Result<PathBuf> {
    let path = procfs.path().join(who).join("cgroup");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let lines = crate::procfs::parse_cgroup_lines(&text, &path)?;
    if let Some(line) = lines
        .iter()
        .find(|l| l.controllers.iter().any(|c| c == "memory"))
    {
        return Ok(v1_memory_mount(procfs)?.join(line.path.trim_start_matches('/')));
    }
    if let Some(line) = lines.iter().find(|l| l.hierarchy_id == 0) {
        return Ok(cgroup2_mount(procfs)?.join(line.path.trim_start_matches('/')));
    }
    Err(Error::Unsupported {
        what: format!("{} names no memory cgroup", path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_min_and_bytes() {
        assert_eq!(Limit::Max.min(Limit::Bytes(5)), Limit::Bytes(5));
        assert_eq!(Limit::Bytes(7).min(Limit::Bytes(5)), Limit::Bytes(5));
        assert_eq!(Limit::Max.min(Limit::Max), Limit::Max);
        assert_eq!(Limit::Max.bytes(), None);
        assert_eq!(Limit::Bytes(3).bytes(), Some(3));
    }

    #[test]
    fn unescapes_mount_paths() {
        assert_eq!(unescape_mount_field("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mount_field("/plain"), "/plain");
        assert_eq!(unescape_mount_field("/x\\"), "/x\\");
    }

    #[test]
    fn v2_stat_sums_refaults() {
        let text = "anon 10\nfile 20\ninactive_file 5\nactive_file 15\nworkingset_refault_anon 3\nworkingset_refault_file 4\npgmajfault 9\n";
        let s = parse_memory_stat(text, Path::new("/x/memory.stat"), CgroupVersion::V2).unwrap();
        assert_eq!((s.anon_bytes, s.file_bytes), (10, 20));
        assert_eq!(s.workingset_refault, Some(7));
        assert_eq!(s.pgmajfault, Some(9));
        let old = "anon 1\nfile 2\ninactive_file 1\nactive_file 1\nworkingset_refault 11\n";
        let s = parse_memory_stat(old, Path::new("/x/memory.stat"), CgroupVersion::V2).unwrap();
        assert_eq!(s.workingset_refault, Some(11));
        assert_eq!(s.pgmajfault, None);
    }
}
