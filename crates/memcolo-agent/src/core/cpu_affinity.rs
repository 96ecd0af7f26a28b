//! The agent's own CPU confinement: its threads are kept off the CPUs LC processes
//! are confined to (`avoid_lc_cpus`), so its work never competes with LC threads.

use super::Core;
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::Class;
use serde_json::json;

impl Core {
    /// Confines the agent's thread to the CPUs no LC process is confined to, so that
    /// its own work (and the kernel work its `posix_fadvise` calls do) never
    /// competes with LC threads; all CPUs when LC processes may run anywhere.
    pub(super) fn apply_cpu_affinity(&mut self) {
        if !self.cfg.avoid_lc_cpus {
            return;
        }
        use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
        // Online CPUs of the machine, not of our own mask (which we may have inherited
        // pinned from whoever started us).
        // SAFETY: sysconf has no memory-safety preconditions.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        if online < 1 {
            return;
        }
        let online = online as usize;
        let all: Vec<usize> = (0..CpuSet::count().min(1024)).collect();
        let mut lc_cpus = std::collections::BTreeSet::new();
        for e in self.registry.iter().filter(|e| e.class == Class::Lc) {
            if let Ok(set) = sched_getaffinity(nix::unistd::Pid::from_raw(e.pid)) {
                let cpus: Vec<usize> = all
                    .iter()
                    .copied()
                    .filter(|c| set.is_set(*c).unwrap_or(false))
                    .collect();
                // An LC process allowed on every online CPU leaves none to avoid.
                if cpus.len() < online {
                    lc_cpus.extend(cpus);
                }
            }
        }
        let mut mine = CpuSet::new();
        let mut n = 0;
        let own = sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok();
        for c in 0..online.min(1024) {
            if !lc_cpus.contains(&c) && mine.set(c).is_ok() {
                n += 1;
            }
        }
        if n == 0 {
            // Every CPU hosts an LC process: run anywhere.
            for c in 0..online.min(1024) {
                let _ = mine.set(c);
            }
        }
        let confined = !lc_cpus.is_empty() && n > 0;
        self.agent_cpus = confined.then(|| {
            (0..online)
                .filter(|c| mine.is_set(*c).unwrap_or(false))
                .collect()
        });
        if own.as_ref() == Some(&mine) {
            return;
        }
        // Every thread of the agent (runtime workers, reclaim threads), not only this
        // one: sched_setaffinity acts on one thread.
        let tids = ProcFs::root().read_self_task_tids().unwrap_or_default();
        for tid in tids {
            let _ = sched_setaffinity(nix::unistd::Pid::from_raw(tid), &mine);
        }
        match sched_setaffinity(nix::unistd::Pid::from_raw(0), &mine) {
            Ok(()) => {
                let cpus: Vec<usize> = (0..online)
                    .filter(|c| mine.is_set(*c).unwrap_or(false))
                    .collect();
                self.events
                    .record("agent_cpus", json!({"cpus": cpus, "lc_cpus": lc_cpus}));
            }
            Err(e) => tracing::warn!(error = %e, "cannot set the agent's CPU affinity"),
        }
    }
}
