//! The scope: what the agent treats as "the node".
//!
//! Either the whole host (`/proc/meminfo`) or a memory cgroup subtree whose limit plays
//! the role of the node's memory. The cgroup scope is how tests and benchmarks create
//! real pressure without endangering the machine, and how a Kubernetes node's
//! `kubepods` subtree is managed (DESIGN.md, "Config").

use crate::cgroup::{cgroup2_mount, v1_memory_mount, CgroupVersion, Limit, MemoryCgroup};
use crate::error::{Error, Result};
use crate::procfs::ProcFs;
use crate::psi::Psi;
use memcolo_policy::types::Pid;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The node the agent manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The whole machine, read from this procfs.
    Host(ProcFs),
    /// A memory cgroup and its descendants.
    Cgroup(MemoryCgroup),
}

/// One observation of a scope, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ScopeSample {
    /// Memory of the node: host `MemTotal`; cgroup: its effective limit (the smallest
    /// limit of the group and its ancestors), capped at the host's `MemTotal`, or
    /// `MemTotal` when unlimited.
    pub total_bytes: u64,
    /// All charged memory including page cache: host `MemTotal - MemFree`; cgroup usage.
    pub used_bytes: u64,
    /// The memory that M3 compares with its thresholds (M3 §5.1): host
    /// `MemTotal - MemAvailable`; cgroup `usage - inactive_file` (the kubelet's
    /// working-set definition).
    pub working_set_bytes: u64,
    /// Page cache: host `Buffers + Cached`; cgroup `file` (`total_cache` on v1).
    pub file_bytes: u64,
    /// Anonymous memory: host `AnonPages`; cgroup `anon` (`total_rss` on v1).
    pub anon_bytes: u64,
    /// Swap in use: host `SwapTotal - SwapFree`; cgroup swap.
    pub swap_used_bytes: u64,
    /// Memory PSI: host `/proc/pressure/memory`; cgroup v2 `memory.pressure`; `None`
    /// on cgroup v1 or without PSI.
    pub psi: Option<Psi>,
    /// Anonymous pages refaulted (swapped in) since boot or the group's creation, a
    /// counter: host `/proc/vmstat` `workingset_refault_anon` (0 without the file); cgroup v1
    /// `total_workingset_refault_anon`, v2 `workingset_refault_anon` of `memory.stat`.
    /// 0 when the kernel does not count it.
    pub refault_anon_pages: u64,
    /// Pages charged to the group, a counter: cgroup v1 `total_pgpgin` of
    /// `memory.stat`; `None` on the host and on v2, which do not count it.
    pub charged_pages: Option<u64>,
    /// Times the group's usage was about to go over its hard limit, a counter:
    /// `memory.events` `max` (v2; v1's `memory.oom_control` has no such count and
    /// reads 0); `None` on the host or when the file cannot be read.
    pub limit_failures: Option<u64>,
    /// The host's `SwapTotal` (for a cgroup too: the swap devices are the host's).
    pub host_swap_total_bytes: u64,
    /// The host's `SwapFree`.
    pub host_swap_free_bytes: u64,
}

impl Scope {
    /// Parses `host` or `cgroup:PATH`. PATH is an absolute directory of a memory cgroup,
    /// or a path relative to the v1 memory mount, else to the cgroup2 mount (so
    /// `cgroup:/kubepods` and `cgroup:kubepods` both work). Mounts are found in
    /// `<procfs>/self/mounts`.
    pub fn parse(spec: &str, procfs: ProcFs) -> Result<Scope> {
        if spec == "host" {
            return Ok(Scope::Host(procfs));
        }
        let Some(rel) = spec.strip_prefix("cgroup:") else {
            return Err(Error::InvalidArgument {
                what: format!("scope `{spec}` (expected `host` or `cgroup:PATH`)"),
            });
        };
        if rel.is_empty() {
            return Err(Error::InvalidArgument {
                what: format!("scope `{spec}`: empty cgroup path"),
            });
        }
        let mut tried: Vec<PathBuf> = Vec::new();
        let direct = Path::new(rel);
        if direct.is_absolute() {
            if let Ok(cg) = MemoryCgroup::open(direct) {
                return Ok(Scope::Cgroup(cg));
            }
            tried.push(direct.to_path_buf());
        }
        let mounts = [v1_memory_mount(&procfs), cgroup2_mount(&procfs)];
        for mount in mounts.into_iter().flatten() {
            let candidate = mount.join(rel.trim_start_matches('/'));
            match MemoryCgroup::open(&candidate) {
                Ok(cg) => return Ok(Scope::Cgroup(cg)),
                Err(_) => tried.push(candidate),
            }
        }
        Err(Error::InvalidArgument {
            what: format!(
                "scope `{spec}`: no memory cgroup at {}",
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }

    /// Samples the scope; a cgroup scope reads the host's `MemTotal` from `/proc`.
    pub fn sample(&self) -> Result<ScopeSample> {
        match self {
            Scope::Host(procfs) => self.sample_with_host(procfs),
            Scope::Cgroup(_) => self.sample_with_host(&ProcFs::root()),
        }
    }

    /// Samples the scope, taking the host's `MemTotal` (the cap of a cgroup scope) from
    /// `host`. For [`Scope::Host`] the scope's own procfs is used and `host` is ignored.
    pub fn sample_with_host(&self, host: &ProcFs) -> Result<ScopeSample> {
        match self {
            Scope::Host(procfs) => {
                let m = procfs.read_meminfo()?;
                let psi = match procfs.read_pressure("memory") {
                    Ok(p) => Some(p),
                    Err(e) if e.is_not_found() => None,
                    Err(e) => return Err(e),
                };
                // A procfs without vmstat (a fake tree) counts no refaults.
                let refault_anon_pages = match procfs.read_vmstat() {
                    Ok(vm) => vm.get("workingset_refault_anon").copied().unwrap_or(0),
                    Err(e) if e.is_not_found() => 0,
                    Err(e) => return Err(e),
                };
                Ok(ScopeSample {
                    total_bytes: m.mem_total_bytes,
                    used_bytes: m.mem_total_bytes.saturating_sub(m.mem_free_bytes),
                    working_set_bytes: m.mem_total_bytes.saturating_sub(m.mem_available_bytes),
                    file_bytes: m.buffers_bytes + m.cached_bytes,
                    anon_bytes: m.anon_pages_bytes,
                    swap_used_bytes: m.swap_total_bytes.saturating_sub(m.swap_free_bytes),
                    psi,
                    refault_anon_pages,
                    charged_pages: None,
                    limit_failures: None,
                    host_swap_total_bytes: m.swap_total_bytes,
                    host_swap_free_bytes: m.swap_free_bytes,
                })
            }
            Scope::Cgroup(cg) => {
                let host_mi = host.read_meminfo()?;
                let mem_total = host_mi.mem_total_bytes;
                let total_bytes = match cg.read_effective_limit()? {
                    Limit::Bytes(b) => b.min(mem_total),
                    Limit::Max => mem_total,
                };
                let usage = cg.read_usage_bytes()?;
                let stat = cg.read_memory_stat()?;
                let (refault_key, charged_pages) = match cg.version() {
                    CgroupVersion::V1 => (
                        "total_workingset_refault_anon",
                        stat.raw.get("total_pgpgin").copied(),
                    ),
                    CgroupVersion::V2 => ("workingset_refault_anon", None),
                };
                Ok(ScopeSample {
                    total_bytes,
                    used_bytes: usage,
                    working_set_bytes: usage.saturating_sub(stat.inactive_file_bytes),
                    file_bytes: stat.file_bytes,
                    anon_bytes: stat.anon_bytes,
                    swap_used_bytes: stat.swap_bytes,
                    psi: cg.read_pressure()?,
                    refault_anon_pages: stat.raw.get(refault_key).copied().unwrap_or(0),
                    charged_pages,
                    limit_failures: cg.read_events().ok().map(|e| e.max),
                    host_swap_total_bytes: host_mi.swap_total_bytes,
                    host_swap_free_bytes: host_mi.swap_free_bytes,
                })
            }
        }
    }

    /// The processes in scope, sorted: host: every pid; cgroup: the group's and its
    /// descendants' `cgroup.procs`.
    pub fn pids(&self) -> Result<Vec<Pid>> {
        match self {
            Scope::Host(procfs) => procfs.pids(),
            Scope::Cgroup(cg) => cg.read_procs_recursive(),
        }
    }

    /// `host` or `cgroup:PATH (v1|v2)`, for logs and `memcolo status`.
    pub fn describe(&self) -> String {
        match self {
            Scope::Host(procfs) if procfs.path() == Path::new("/proc") => "host".to_string(),
            Scope::Host(procfs) => format!("host ({})", procfs.path().display()),
            Scope::Cgroup(cg) => format!(
                "cgroup:{} ({})",
                cg.path().display(),
                match cg.version() {
                    crate::cgroup::CgroupVersion::V1 => "v1",
                    crate::cgroup::CgroupVersion::V2 => "v2",
                }
            ),
        }
    }
}
