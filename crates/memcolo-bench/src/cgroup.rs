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

use crate::error::{BenchError, Result};

/// Where the cgroup v1 memory hierarchy is mounted.
pub const MEMORY_V1_ROOT: &str = "/sys/fs/cgroup/memory";

/// The memory cgroup (v1) of the process described by `proc_cgroup_text` (the content
/// of `/proc/<pid>/cgroup`), e.g. `/process_api/abc`. `None` if no hierarchy lists the
/// `memory` controller.
pub fn memory_cgroup_from_proc(proc_cgroup_text: &str) -> Option<String> {
    proc_cgroup_text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })
}

/// The caller's own memory cgroup (v1), from `/proc/self/cgroup`.
pub fn own_memory_cgroup() -> Result<String> {
    let p = Path::new("/proc/self/cgroup");
    let text = fs::read_to_string(p).map_err(|e| BenchError::io(p, e))?;
    memory_cgroup_from_proc(&text).ok_or_else(|| BenchError::Parse {
        path: p.into(),
        msg: "no cgroup v1 hierarchy with the memory controller".into(),
    })
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(|e| BenchError::io(path, e))
}

fn read_u64(path: &Path) -> Result<u64> {
    let text = fs::read_to_string(path).map_err(|e| BenchError::io(path, e))?;
    text.trim().parse().map_err(|_| BenchError::Parse {
        path: path.into(),
        msg: format!("not an integer: {:?}", text.trim()),
    })
}

/// The pids in a cgroup's `cgroup.procs`.
pub fn read_procs(group: &Path) -> Result<Vec<i32>> {
    let p = group.join("cgroup.procs");
    let text = fs::read_to_string(&p).map_err(|e| BenchError::io(&p, e))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// The `oom_kill` counter of a v1 group's `memory.oom_control` (kernel ≥ 4.13).
pub fn read_oom_kills(group: &Path) -> Result<u64> {
    let p = group.join("memory.oom_control");
    let text = fs::read_to_string(&p).map_err(|e| BenchError::io(&p, e))?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0))
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
    let _ = fs::write(group.join("memory.force_empty"), "0");
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
    path: PathBuf,
    limit_bytes: u64,
    children: Vec<String>,
}

impl ScratchNode {
    /// Creates `<root>/<parent>/<name>` with `memory.limit_in_bytes = limit_bytes`.
    /// `parent` is a cgroup path as in `/proc/self/cgroup` (leading `/`). Fails if the
    /// group exists already (another run owns it).
    pub fn create(root: &Path, parent: &str, name: &str, limit_bytes: u64) -> Result<Self> {
        let parent_dir = root.join(parent.trim_start_matches('/'));
        if !parent_dir.join("memory.limit_in_bytes").exists() {
            return Err(BenchError::Invalid(format!(
                "{} is not a cgroup v1 memory group",
                parent_dir.display()
            )));
        }
        let path = parent_dir.join(name);
        fs::create_dir(&path).map_err(|e| BenchError::io(&path, e))?;
        let node = ScratchNode {
            path,
            limit_bytes,
            children: Vec::new(),
        };
        write(
            &node.path.join("memory.limit_in_bytes"),
            &limit_bytes.to_string(),
        )?;
        Ok(node)
    }

    /// Creates a scratch node below the caller's own memory cgroup, named
    /// `<prefix>-<pid>`, after removing stale empty nodes of earlier runs whose
    /// process is gone.
    pub fn create_below_self(prefix: &str, limit_bytes: u64) -> Result<Self> {
        let own = own_memory_cgroup()?;
        let root = Path::new(MEMORY_V1_ROOT);
        remove_stale(&root.join(own.trim_start_matches('/')), prefix);
        let name = format!("{prefix}-{}", std::process::id());
        Self::create(root, &own, &name, limit_bytes)
    }

    /// The group's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The node's memory: its `memory.limit_in_bytes`.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// Creates child group `name` (e.g. `lc`, `be`) and returns its directory.
    pub fn create_child(&mut self, name: &str) -> Result<PathBuf> {
        let p = self.path.join(name);
        fs::create_dir(&p).map_err(|e| BenchError::io(&p, e))?;
        self.children.push(name.to_string());
        Ok(p)
    }

    /// Kills what is left in child `name`, drops its page cache and removes it.
    pub fn remove_child(&mut self, name: &str) -> Result<()> {
        remove_group(&self.path.join(name))?;
        self.children.retain(|c| c != name);
        Ok(())
    }

    /// Current charge of the node (`memory.usage_in_bytes`: RSS + page cache + kernel).
    pub fn usage_bytes(&self) -> Result<u64> {
        read_u64(&self.path.join("memory.usage_in_bytes"))
    }

    /// Sets the node's memory (`memory.limit_in_bytes`); the kernel reclaims down to a
    /// lower limit first (and refuses with `EBUSY` when it cannot).
    pub fn set_limit(&mut self, limit_bytes: u64) -> Result<()> {
        write(
            &self.path.join("memory.limit_in_bytes"),
            &limit_bytes.to_string(),
        )?;
        self.limit_bytes = limit_bytes;
        Ok(())
    }

    /// Charges that found the node at its limit (`memory.failcnt`): each made the
    /// charging task reclaim from the node on its own thread (direct reclaim).
    pub fn limit_hits(&self) -> Result<u64> {
        read_u64(&self.path.join("memory.failcnt"))
    }

    /// The node's `oom_kill` counter.
    pub fn oom_kills(&self) -> Result<u64> {
        read_oom_kills(&self.path)
    }

    /// Reclaims everything charged to the node itself (page cache left by removed
    /// children). Only valid while no task sits directly in the node.
    pub fn force_empty(&self) -> Result<()> {
        write(&self.path.join("memory.force_empty"), "0")
    }
}

impl Drop for ScratchNode {
    fn drop(&mut self) {
        for c in std::mem::take(&mut self.children) {
            if let Err(e) = remove_group(&self.path.join(&c)) {
                eprintln!("warning: cannot remove cgroup: {e}");
            }
        }
        // Children created by others below the node (the agent's `memcolo run` groups).
        if let Ok(rd) = fs::read_dir(&self.path) {
            for entry in rd.flatten() {
                if entry.path().is_dir() {
                    let _ = remove_group(&entry.path());
                }
            }
        }
        if let Err(e) = remove_group(&self.path) {
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
    fn finds_memory_line_of_v1() {
        let text = "9:name=systemd:/\n4:memory:/process_api/abc\n3:cpuset:/\n0::/\n";
        assert_eq!(
            memory_cgroup_from_proc(text).as_deref(),
            Some("/process_api/abc")
        );
        let joined = "5:cpu,memory:/a/b\n";
        assert_eq!(memory_cgroup_from_proc(joined).as_deref(), Some("/a/b"));
        assert_eq!(memory_cgroup_from_proc("0::/user.slice\n"), None);
        // "memory" must be a whole controller name.
        assert_eq!(memory_cgroup_from_proc("3:memoryx:/x\n"), None);
    }

    #[test]
    fn create_writes_limit_and_refuses_non_groups() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = tmp.path().join("self");
        fs::create_dir(&parent).unwrap();
        assert!(ScratchNode::create(tmp.path(), "/self", "n", 1 << 30).is_err());
        fs::write(parent.join("memory.limit_in_bytes"), "max").unwrap();
        // A plain directory accepts the limit write, but the test only checks the value
        // written; the node is forgotten so that Drop does not look for cgroup files.
        let node = ScratchNode::create(tmp.path(), "/self", "n", 1 << 30).unwrap();
        assert_eq!(
            fs::read_to_string(parent.join("n/memory.limit_in_bytes")).unwrap(),
            (1u64 << 30).to_string()
        );
        std::mem::forget(node);
    }

    #[test]
    fn oom_kill_counter() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(
            tmp.path().join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        )
        .unwrap();
        assert_eq!(read_oom_kills(tmp.path()).unwrap(), 3);
    }
}
