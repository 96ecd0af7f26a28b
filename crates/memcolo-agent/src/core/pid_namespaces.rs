//! Pids named by peers in foreign pid namespaces, mapped to the agent's with a bounded
//! number of `/proc` scans.
//!
//! Root in a container's pid namespace names pids of its own namespace; finding the
//! host pid takes a walk over the whole procfs (one `stat` of `ns/pid` per process,
//! [`ProcFs::pid_namespace_map`]). Done per request, a container's root could keep
//! the agent's main loop walking `/proc` by sending requests in a loop. Here each
//! namespace's whole map comes from one walk, is reused until it is
//! [`RESCAN`] old, and all namespaces together get at most [`SCANS_PER_SECOND`]
//! walks a second: a pid missing from a fresh map is missing, and a request that
//! would need a walk beyond the budget is answered "try again" without one. A mapped
//! pid is a hint, not a proof: the caller opens it and checks its namespace and pid
//! there again.

use memcolo_linux::procfs::ProcFs;
use memcolo_policy::Pid;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A namespace's map is walked again, for a pid it lacks, once it is this old.
pub const RESCAN: Duration = Duration::from_millis(250);
/// Walks of `/proc` a second, all namespaces together.
pub const SCANS_PER_SECOND: u32 = 8;
/// Namespaces whose maps are kept (the least recently walked goes first).
pub const MAX_NAMESPACES: usize = 64;

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsLookup {
    /// The agent's pid of the process (to be proved by the caller).
    Found(Pid),
    /// No process of that pid in the namespace (as of a walk at most [`RESCAN`] old).
    Missing,
    /// The walk budget is spent: ask again later.
    Busy,
}

struct NsMap {
    walked: Instant,
    pids: HashMap<Pid, Pid>,
}

/// The maps and the walk budget. One per agent (the main loop's).
#[derive(Default)]
pub struct PidNamespaceMaps {
    maps: HashMap<u64, NsMap>,
    window: Option<Instant>,
    window_walks: u32,
    walks: u64,
}

impl PidNamespaceMaps {
    /// The agent's pid of process `ns_pid` of pid namespace `ns` (an inode number of
    /// `/proc/<pid>/ns/pid`), walking `procfs` only when the namespace's map lacks
    /// it and is at least [`RESCAN`] old, and the budget allows. Errors: the procfs
    /// cannot be read.
    pub fn lookup(
        &mut self,
        procfs: &ProcFs,
        ns: u64,
        ns_pid: Pid,
        now: Instant,
    ) -> memcolo_linux::Result<NsLookup> {
        if ns_pid <= 0 {
            return Ok(NsLookup::Missing);
        }
        if let Some(m) = self.maps.get(&ns) {
            if let Some(&h) = m.pids.get(&ns_pid) {
                return Ok(NsLookup::Found(h));
            }
            if now.duration_since(m.walked) < RESCAN {
                return Ok(NsLookup::Missing);
            }
        }
        match self.window {
            Some(w) if now.duration_since(w) < Duration::from_secs(1) => {
                if self.window_walks >= SCANS_PER_SECOND {
                    return Ok(NsLookup::Busy);
                }
            }
            _ => {
                self.window = Some(now);
                self.window_walks = 0;
            }
        }
        self.window_walks += 1;
        self.walks += 1;
        let pids = procfs.pid_namespace_map(ns)?;
        if !self.maps.contains_key(&ns) && self.maps.len() >= MAX_NAMESPACES {
            if let Some(oldest) = self
                .maps
                .iter()
                .min_by_key(|(_, m)| m.walked)
                .map(|(k, _)| *k)
            {
                self.maps.remove(&oldest);
            }
        }
        let found = pids.get(&ns_pid).copied();
        self.maps.insert(ns, NsMap { walked: now, pids });
        Ok(found.map_or(NsLookup::Missing, NsLookup::Found))
    }

    /// Drops what is known of namespace `ns` (a mapped pid turned out to be another
    /// process once opened).
    pub fn forget(&mut self, ns: u64) {
        self.maps.remove(&ns);
    }

    /// Walks of `/proc` so far.
    pub fn walks(&self) -> u64 {
        self.walks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    /// A fake procfs: pids 100 and 101 in namespace `a` (1 and 2 there), 200 in `b`.
    fn tree(dir: &Path) -> (ProcFs, u64, u64) {
        let proc_ = dir.join("proc");
        let ns_file = |n: &str| {
            let p = dir.join(n);
            std::fs::write(&p, n).unwrap();
            p
        };
        let (a, b) = (ns_file("ns-a"), ns_file("ns-b"));
        for (pid, ns, nspid) in [
            (100, &a, "100\t1"),
            (101, &a, "101\t2"),
            (200, &b, "200\t1"),
        ] {
            let d = proc_.join(pid.to_string());
            std::fs::create_dir_all(d.join("ns")).unwrap();
            std::fs::hard_link(ns, d.join("ns/pid")).unwrap();
            std::fs::write(
                d.join("status"),
                format!("Name:\tp\nUid:\t0\t0\t0\t0\nNSpid:\t{nspid}\n"),
            )
            .unwrap();
        }
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        (ProcFs::new(proc_), ino(&a), ino(&b))
    }

    #[test]
    fn one_walk_serves_a_namespace_until_it_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let (procfs, a, b) = tree(dir.path());
        let mut m = PidNamespaceMaps::default();
        let t0 = Instant::now();
        assert_eq!(m.lookup(&procfs, a, 1, t0).unwrap(), NsLookup::Found(100));
        assert_eq!(m.lookup(&procfs, a, 2, t0).unwrap(), NsLookup::Found(101));
        for _ in 0..100 {
            assert_eq!(m.lookup(&procfs, a, 7, t0).unwrap(), NsLookup::Missing);
        }
        assert_eq!(m.walks(), 1, "a fresh map answers alone");
        assert_eq!(m.lookup(&procfs, a, 0, t0).unwrap(), NsLookup::Missing);
        assert_eq!(m.lookup(&procfs, b, 1, t0).unwrap(), NsLookup::Found(200));
        assert_eq!(m.walks(), 2, "another namespace, its own walk");
        // a process that appears is found once the map is stale
        let d = dir.path().join("proc/102");
        std::fs::create_dir_all(d.join("ns")).unwrap();
        std::fs::hard_link(dir.path().join("ns-a"), d.join("ns/pid")).unwrap();
        std::fs::write(
            d.join("status"),
            "Name:\tp\nUid:\t0\t0\t0\t0\nNSpid:\t102\t7\n",
        )
        .unwrap();
        assert_eq!(
            m.lookup(&procfs, a, 7, t0 + RESCAN / 2).unwrap(),
            NsLookup::Missing
        );
        assert_eq!(
            m.lookup(&procfs, a, 7, t0 + RESCAN).unwrap(),
            NsLookup::Found(102)
        );
        assert_eq!(m.walks(), 3);
        // a forgotten namespace is walked again at once
        m.forget(a);
        assert_eq!(
            m.lookup(&procfs, a, 1, t0 + RESCAN).unwrap(),
            NsLookup::Found(100)
        );
        assert_eq!(m.walks(), 4);
    }

    #[test]
    fn walks_beyond_the_budget_are_refused_until_the_next_second() {
        let dir = tempfile::tempdir().unwrap();
        let (procfs, a, _) = tree(dir.path());
        let mut m = PidNamespaceMaps::default();
        let t0 = Instant::now();
        let mut busy = 0;
        for i in 0..100u32 {
            // always stale: every lookup of a missing pid would walk
            let t = t0 + RESCAN * i / 100 + Duration::from_micros(u64::from(i));
            m.forget(a);
            if m.lookup(&procfs, a, 9, t).unwrap() == NsLookup::Busy {
                busy += 1;
            }
        }
        assert_eq!(m.walks(), u64::from(SCANS_PER_SECOND));
        assert_eq!(busy, 100 - SCANS_PER_SECOND);
        let later = t0 + Duration::from_secs(1) + RESCAN;
        m.forget(a);
        assert_eq!(
            m.lookup(&procfs, a, 1, later).unwrap(),
            NsLookup::Found(100)
        );
    }

    #[test]
    fn the_maps_kept_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (procfs, _, _) = tree(dir.path());
        let mut m = PidNamespaceMaps::default();
        let t0 = Instant::now();
        for ns in 0..(MAX_NAMESPACES as u64 * 2) {
            // one second apart: the budget never binds
            let t = t0 + Duration::from_secs(ns + 1);
            assert_eq!(
                m.lookup(&procfs, 1_000_000 + ns, 1, t).unwrap(),
                NsLookup::Missing
            );
        }
        assert_eq!(m.maps.len(), MAX_NAMESPACES);
    }
}
