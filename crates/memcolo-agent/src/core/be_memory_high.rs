//! M3's red zone on a cgroup v2 scope: `memory.high` of the BE groups
//! (`m3.be_memory_high`, on by default).
//!
//! M3 answers a BE job's growth with notifications and, after `kill_after` above top,
//! a kill (M3 §5.1). A job that ignores its notifications keeps growing meanwhile,
//! and the kernel meets the scope's limit by reclaiming from every group, the LC ones
//! included. On cgroup v2 the agent also caps the job where it stands: entering the
//! red zone (above high) it sets `memory.high` of each class group
//! ([`super::class_groups`]) that holds only BE processes to the group's
//! `memory.current`, and lowers the cap to it at every poll in red or above top where
//! the usage fell (Hermit's reclaim takes from BE groups on its own threads: the cap
//! is never set below the usage, so the write makes the kernel reclaim nothing on the
//! agent's main loop); above it the kernel reclaims from that group and throttles its
//! allocations (Documentation/admin-guide/cgroup-v2.rst, `memory.high`; Senpai and
//! Kubernetes' memory QoS, KEP-2570, use it so). Back in the green zone (at or below
//! low) each group gets its previous `memory.high` back, and so at the agent's clean
//! shutdown. bench/v2qos measured it against M3 alone in the guest of scripts/v2bed
//! (docs/design.md, "BE growth on cgroup v2").
//!
//! A group is capped only when every process in it and below it is a registered BE
//! process or a descendant of one: a cap acts on the whole group. A group already
//! capped lower is left alone. The previous values are kept in
//! `state_dir/be-memory-high.json` while any cap is in force, so that an agent that
//! died meanwhile restores them at its next start ([`restore_journal`]).
//!
//! Events: `be_memory_high` (`cgroup`, `high_bytes`, `previous`: bytes or null for
//! `max`, at the first cap of an episode and at each lowering) and `be_memory_high_restored` (`cgroup`, `high_bytes`); metric
//! `memcolo_be_memory_high_groups` (groups capped now).

use super::{Core, ProcTable};
use memcolo_linux::cgroup::{CgroupVersion, Limit, MemoryCgroup};
use memcolo_linux::scope::Scope;
use memcolo_policy::m3::Zone;
use memcolo_policy::{Class, Pid};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// The journal's file name in `state_dir`.
pub const JOURNAL: &str = "be-memory-high.json";

/// One capped group and the `memory.high` it had before.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Capped {
    cgroup: PathBuf,
    /// Bytes; `None`: `max`.
    previous: Option<u64>,
}

/// The groups capped now, with their previous `memory.high`.
#[derive(Default)]
pub(super) struct BeMemoryHigh {
    capped: BTreeMap<PathBuf, Limit>,
}

/// Restores the `memory.high` of every group a previous agent left capped (its
/// journal in `state_dir`), then removes the journal. Returns how many were restored.
pub fn restore_journal(state_dir: &Path) -> usize {
    let path = state_dir.join(JOURNAL);
    let Ok(bytes) = std::fs::read(&path) else {
        return 0;
    };
    let mut restored = 0;
    match serde_json::from_slice::<Vec<Capped>>(&bytes) {
        Ok(list) => {
            for c in list {
                let previous = c.previous.map(Limit::Bytes).unwrap_or(Limit::Max);
                match MemoryCgroup::open(&c.cgroup).and_then(|cg| cg.write_high(previous)) {
                    Ok(()) => {
                        tracing::warn!(cgroup = %c.cgroup.display(), ?previous, "restored memory.high a previous agent left capped");
                        restored += 1;
                    }
                    Err(e) => {
                        tracing::info!(cgroup = %c.cgroup.display(), error = %e, "cannot restore memory.high (the group may be gone)")
                    }
                }
            }
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable memory.high journal")
        }
    }
    let _ = std::fs::remove_file(&path);
    restored
}

impl Core {
    /// Caps or releases the BE groups' `memory.high` by the zone of this poll (see the
    /// module documentation). Only on a cgroup v2 scope with `m3.be_memory_high`.
    pub(super) fn apply_be_memory_high(&mut self, procs: &ProcTable) {
        let v2_scope =
            matches!(&self.scope, Scope::Cgroup(cg) if cg.version() == CgroupVersion::V2);
        if !self.cfg.m3.be_memory_high || !v2_scope {
            return;
        }
        let zone = self.monitor.zone();
        let before: Vec<PathBuf> = self.be_memory_high.capped.keys().cloned().collect();
        if zone >= Zone::Red {
            let candidates: Vec<MemoryCgroup> = self
                .class_groups
                .groups
                .iter()
                .filter(|g| g.classes.len() == 1 && g.classes.contains(&Class::Be))
                .map(|g| g.group.clone())
                .collect();
            // A capped group that no longer holds only BE processes (an LC process
            // moved in, the job is gone) gets its previous value back at once.
            let stale: Vec<PathBuf> = self
                .be_memory_high
                .capped
                .keys()
                .filter(|p| !candidates.iter().any(|c| c.path() == p.as_path()))
                .cloned()
                .collect();
            for path in stale {
                if let Some(previous) = self.be_memory_high.capped.remove(&path) {
                    self.restore(&path, previous);
                }
            }
            if !candidates.is_empty() {
                let be_pids = self.be_trees(procs);
                for cg in candidates {
                    self.cap(&cg, &be_pids);
                }
            }
        } else if zone == Zone::Green {
            self.release_be_memory_high();
        }
        if !self.be_memory_high.capped.keys().eq(before.iter()) {
            self.write_be_memory_high_journal();
        }
        self.metrics
            .be_memory_high_groups
            .set(self.be_memory_high.capped.len() as i64);
    }

    /// The registered BE processes and their descendants this poll saw.
    fn be_trees(&self, procs: &ProcTable) -> HashSet<Pid> {
        self.registry
            .iter()
            .filter(|e| e.class == Class::Be)
            .flat_map(|e| procs.tree(e.pid))
            .collect()
    }

    fn cap(&mut self, cg: &MemoryCgroup, be_pids: &HashSet<Pid>) {
        let (members, previous, usage) = match (
            cg.read_procs_recursive(),
            cg.read_high(),
            cg.read_usage_bytes(),
        ) {
            (Ok(m), Ok(p), Ok(u)) => (m, p, u),
            _ => return, // gone since the groups were found
        };
        if let Some(stranger) = members.iter().find(|p| !be_pids.contains(p)) {
            tracing::debug!(cgroup = %cg.path().display(), pid = stranger,
                "not capping memory.high of a group holding a process that is not a registered BE job's");
            return;
        }
        if previous.bytes().is_some_and(|b| b <= usage) {
            return; // already capped at or below its usage
        }
        // Capped before (the group's usage fell since, by Hermit's reclaim or the job
        // itself): the cap follows it down and keeps the first previous value.
        let first = !self.be_memory_high.capped.contains_key(cg.path());
        if first {
            // Journaled before the write: an agent that dies right after it still
            // restores the previous value at its next start.
            self.be_memory_high
                .capped
                .insert(cg.path().to_path_buf(), previous);
            self.write_be_memory_high_journal();
        }
        if let Err(e) = cg.write_high(Limit::Bytes(usage)) {
            if first {
                self.be_memory_high.capped.remove(cg.path());
            }
            self.metrics
                .errors
                .with_label_values(&["be_memory_high"])
                .inc();
            tracing::warn!(cgroup = %cg.path().display(), error = %e, "cannot set memory.high");
            return;
        }
        self.events.record(
            "be_memory_high",
            json!({"cgroup": cg.path(), "high_bytes": usage, "previous": previous.bytes()}),
        );
    }

    /// Gives every capped group its previous `memory.high` back (green zone, clean
    /// shutdown, the option turned off).
    pub(super) fn release_be_memory_high(&mut self) {
        let capped = std::mem::take(&mut self.be_memory_high.capped);
        if capped.is_empty() {
            return;
        }
        for (path, previous) in capped {
            self.restore(&path, previous);
        }
        self.write_be_memory_high_journal();
        self.metrics.be_memory_high_groups.set(0);
    }

    /// Writes `previous` back to the `memory.high` of the group at `path`.
    fn restore(&mut self, path: &Path, previous: Limit) {
        let res = MemoryCgroup::open(path).and_then(|cg| cg.write_high(previous));
        match res {
            Ok(()) => self.events.record(
                "be_memory_high_restored",
                json!({"cgroup": path, "high_bytes": previous.bytes()}),
            ),
            Err(e) if e.is_not_found() => {} // the group is gone with its jobs
            Err(e) => {
                self.metrics
                    .errors
                    .with_label_values(&["be_memory_high"])
                    .inc();
                tracing::warn!(cgroup = %path.display(), error = %e, "cannot restore memory.high");
            }
        }
    }

    /// The journal of the groups capped now; removed when none is.
    fn write_be_memory_high_journal(&self) {
        let path = self.cfg.state_dir.join(JOURNAL);
        if self.be_memory_high.capped.is_empty() {
            let _ = std::fs::remove_file(&path);
            return;
        }
        let list: Vec<Capped> = self
            .be_memory_high
            .capped
            .iter()
            .map(|(p, l)| Capped {
                cgroup: p.clone(),
                previous: l.bytes(),
            })
            .collect();
        let tmp = path.with_extension("json.tmp");
        let res = serde_json::to_vec(&list)
            .map_err(std::io::Error::other)
            .and_then(|b| {
                std::fs::create_dir_all(&self.cfg.state_dir)?;
                std::fs::write(&tmp, b)
            })
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = res {
            self.metrics.errors.with_label_values(&["state"]).inc();
            tracing::warn!(path = %path.display(), error = %e, "cannot write the memory.high journal");
        }
    }
}
