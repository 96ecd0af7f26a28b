//! The benchmark "node": a scratch cgroup v1 memory group below the caller's own group.
//!
//! Pressure is made inside this group only: its `memory.limit_in_bytes` is the node's
//! memory, and the LC and BE processes live in child groups (`lc/`, `be/`), so the
//! limit is shared hierarchically as a machine's RAM would be. The caller's own group is
//! never written. [`ScratchNode`] removes its children and itself when dropped, after
//! killing whatever is still inside (only the benchmark's own children can be there)
//! and dropping the charged page cache with `memory.force_empty`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memcolo_linux::cgroup::{Limit, MemoryCgroup};
use memcolo_linux::procfs::ProcFs;

use crate::error::{BenchError, Result};

fn linux(e: memcolo_linux::Error) -> BenchError {
    BenchError::Process(e.to_string())
}

/// The pids in a cgroup's `cgroup.procs` (any cgroup, v1 or v2, with or without the
/// memory controller).
pub fn read_procs(group: &Path) -> Result<Vec<i32>> {
    let p = group.join("cgroup.procs");
    let text = fs::read_to_string(&p).map_err(|e| BenchError::io(&p, e))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Kills every process in `group` (SIGKILL) and waits up to `timeout` for it to empty.
fn kill_all(group: &Path, timeout: Duration) {
    let end = Instant::now() + timeout;
    loop {
        let pids = read_procs(group).unwrap_or_default();
        if pids.is_empty() || Instant::now() >= end {
            return;
        }
        for pid in pids {
            // SAFETY: plain kill(2) of a pid in our scratch group.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Empties and removes one group (children must be gone already).
fn remove_group(group: &Path) -> Result<()> {
    if !group.exists() {
        return Ok(());
    }
    kill_all(group, Duration::from_secs(5));
    // Drop the group's page cache so the next run starts from the same state; the
    // kernel refuses while tasks remain, which kill_all above prevents.
    let _ = force_empty(group);
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        match fs::remove_dir(group) {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < end && e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(BenchError::io(group, e)),
        }
    }
}

/// A scratch memory cgroup standing for one machine's memory.
#[derive(Debug)]
pub struct ScratchNode {
    group: MemoryCgroup,
    limit_bytes: u64,
    children: Vec<String>,
}

impl ScratchNode {
    /// Creates `<parent>/<name>` with `memory.limit_in_bytes = limit_bytes`. Fails if
    /// `parent` is not a cgroup v1 memory group or the group exists already (another
    /// run owns it).
    pub fn create(parent: &Path, name: &str, limit_bytes: u64) -> Result<Self> {
        if !parent.join("memory.limit_in_bytes").exists() {
            return Err(BenchError::Invalid(format!(
                "{} is not a cgroup v1 memory group",
                parent.display()
            )));
        }
        let parent = MemoryCgroup::open(parent).map_err(linux)?;
        let group = parent.create_child(name).map_err(linux)?;
        let node = ScratchNode {
            group,
            limit_bytes,
            children: Vec::new(),
        };
        node.group
            .write_limit(Limit::Bytes(limit_bytes))
            .map_err(linux)?;
        Ok(node)
    }

    /// Creates a scratch node below the caller's own memory cgroup, named
    /// `<prefix>-<pid>`, after removing stale empty nodes of earlier runs whose
    /// process is gone.
    pub fn create_below_self(prefix: &str, limit_bytes: u64) -> Result<Self> {
        let own =
            memcolo_linux::cgroup::memory_cgroup_path(&ProcFs::root(), "self").map_err(linux)?;
        remove_stale(&own, prefix);
        Self::create(
            &own,
            &format!("{prefix}-{}", std::process::id()),
            limit_bytes,
        )
    }

    /// The group's directory.
    pub fn path(&self) -> &Path {
        self.group.path()
    }

    /// The node's memory: its `memory.limit_in_bytes`.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// Creates child group `name` (e.g. `lc`, `be`) and returns its directory.
    pub fn create_child(&mut self, name: &str) -> Result<PathBuf> {
        let c = self.group.create_child(name).map_err(linux)?;
        self.children.push(name.to_string());
        Ok(c.path().to_path_buf())
    }

    /// Kills what is left in child `name`, drops its page cache and removes it.
    pub fn remove_child(&mut self, name: &str) -> Result<()> {
        remove_group(&self.path().join(name))?;
        self.children.retain(|c| c != name);
        Ok(())
    }

    /// Current charge of the node (`memory.usage_in_bytes`: RSS + page cache + kernel).
    pub fn usage_bytes(&self) -> Result<u64> {
        self.group.read_usage_bytes().map_err(linux)
    }

    /// Sets the node's memory (`memory.limit_in_bytes`); the kernel reclaims down to a
    /// lower limit first (and refuses with `EBUSY` when it cannot).
    pub fn set_limit(&mut self, limit_bytes: u64) -> Result<()> {
        self.group
            .write_limit(Limit::Bytes(limit_bytes))
            .map_err(linux)?;
        self.limit_bytes = limit_bytes;
        Ok(())
    }

    /// Charges that found the node at its limit (`memory.failcnt`): each made the
    /// charging task reclaim from the node on its own thread (direct reclaim).
    pub fn limit_hits(&self) -> Result<u64> {
        Ok(self.group.read_events().map_err(linux)?.max)
    }

    /// The node's `oom_kill` counter.
    pub fn oom_kills(&self) -> Result<u64> {
        Ok(self.group.read_events().map_err(linux)?.oom_kill)
    }

    /// Reclaims everything charged to the node itself (page cache left by removed
    /// children). Only valid while no task sits directly in the node.
    pub fn force_empty(&self) -> Result<()> {
        force_empty(self.path())
    }
}

/// v1 `memory.force_empty`: reclaims what is charged to a group with no tasks (v1
/// only; memcolo-linux's readers have no writer for it, the agent never uses it).
fn force_empty(group: &Path) -> Result<()> {
    let p = group.join("memory.force_empty");
    fs::write(&p, "0").map_err(|e| BenchError::io(&p, e))
}

impl Drop for ScratchNode {
    fn drop(&mut self) {
        let path = self.path().to_path_buf();
        for c in std::mem::take(&mut self.children) {
            if let Err(e) = remove_group(&path.join(&c)) {
                eprintln!("warning: cannot remove cgroup: {e}");
            }
        }
        // Children created by others below the node (the agent's `memcolo run` groups).
        if let Ok(rd) = fs::read_dir(&path) {
            for entry in rd.flatten() {
                if entry.path().is_dir() {
                    let _ = remove_group(&entry.path());
                }
            }
        }
        if let Err(e) = remove_group(&path) {
            eprintln!("warning: cannot remove cgroup: {e}");
        }
    }
}

/// cgroup2 groups that only hold the bench's processes for their PSI: on a hybrid
/// hierarchy (cgroup v1 memory controller, cgroup2 without it) v1 has no per-group
/// `memory.pressure`, but every cgroup2 group has one, whatever its controllers.
/// `<cgroup2 mount><own cgroup2 path>/<prefix>-<pid>/<child>`; removed when dropped
/// (after killing what is left in them: only the bench's own children).
#[derive(Debug)]
pub struct PsiGroups {
    root: PathBuf,
    children: Vec<String>,
}

impl PsiGroups {
    /// Creates the groups `children` below the caller's own cgroup2 group.
    pub fn create_below_self(prefix: &str, children: &[&str]) -> Result<Self> {
        let procfs = memcolo_linux::procfs::ProcFs::root();
        let mount = memcolo_linux::cgroup::cgroup2_mount(&procfs)
            .map_err(|e| BenchError::Invalid(format!("no cgroup2 for PSI: {e}")))?;
        let p = Path::new("/proc/self/cgroup");
        let text = fs::read_to_string(p).map_err(|e| BenchError::io(p, e))?;
        let own = text
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or_else(|| BenchError::Parse {
                path: p.into(),
                msg: "no cgroup2 (0::) line".into(),
            })?;
        let parent = mount.join(own.trim().trim_start_matches('/'));
        remove_stale(&parent, prefix);
        let root = parent.join(format!("{prefix}-{}", std::process::id()));
        fs::create_dir(&root).map_err(|e| BenchError::io(&root, e))?;
        let mut g = PsiGroups {
            root,
            children: Vec::new(),
        };
        for c in children {
            let d = g.root.join(c);
            fs::create_dir(&d).map_err(|e| BenchError::io(&d, e))?;
            g.children.push(c.to_string());
        }
        Ok(g)
    }

    /// The directory of child `name`.
    pub fn child(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// The cumulative `some` memory stall of child `name`, µs.
    pub fn memory_some_us(&self, name: &str) -> Option<u64> {
        memcolo_linux::psi::Psi::read(&self.child(name).join("memory.pressure"))
            .ok()
            .map(|p| p.some.total_us)
    }
}

impl Drop for PsiGroups {
    fn drop(&mut self) {
        for c in std::mem::take(&mut self.children) {
            let d = self.root.join(c);
            kill_all(&d, Duration::from_secs(5));
            if let Err(e) = fs::remove_dir(&d) {
                eprintln!("warning: cannot remove cgroup {}: {e}", d.display());
            }
        }
        if let Err(e) = fs::remove_dir(&self.root) {
            eprintln!("warning: cannot remove cgroup {}: {e}", self.root.display());
        }
    }
}

/// Removes empty `<prefix>-<pid>` groups (and their empty children) left behind by a
/// run that was killed with SIGKILL, when `<pid>` no longer exists.
fn remove_stale(parent_dir: &Path, prefix: &str) {
    let Ok(rd) = fs::read_dir(parent_dir) else {
        return;
    };
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix('-'))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = entry.path();
        let children: Vec<PathBuf> = fs::read_dir(&dir)
            .map(|r| {
                r.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default();
        let busy = children
            .iter()
            .chain(std::iter::once(&dir))
            .any(|g| !read_procs(g).unwrap_or_default().is_empty());
        if busy {
            eprintln!(
                "warning: stale cgroup {} still has processes; left alone",
                dir.display()
            );
            continue;
        }
        for c in children {
            let _ = fs::remove_dir(c);
        }
        match fs::remove_dir(&dir) {
            Ok(()) => eprintln!("removed stale cgroup {}", dir.display()),
            Err(e) => eprintln!("warning: cannot remove stale cgroup {}: {e}", dir.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_refuses_a_directory_that_is_not_a_memory_group() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join("self");
        fs::create_dir(&parent).unwrap();
        let err = ScratchNode::create(&parent, "n", 1 << 30).unwrap_err();
        assert!(
            err.to_string().contains("not a cgroup v1 memory group"),
            "{err}"
        );
        assert!(!parent.join("n").exists());
    }

    #[test]
    fn procs_of_a_group() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("cgroup.procs"), "12\n34\n").unwrap();
        assert_eq!(read_procs(tmp.path()).unwrap(), vec![12, 34]);
        assert!(read_procs(&tmp.path().join("none")).is_err());
    }
}
