//! Class groups: the memory cgroups that hold the registered processes of each class
//! (`lc`, `be`, `elastic`), and their limit and OOM events in `/metrics`.
//!
//! The agent makes no cgroups of its own: a class's groups are the memory cgroups its
//! registered processes run in (`/proc/PID/cgroup`), found again at every full read
//! of the process table ([`super::FULL_READ_POLLS`] polls) and after a registration
//! changes. A group counts when it is below the scope (a cgroup scope), or is any
//! group but the root (the host scope); of groups nested in one another only the
//! outermost of each class counts, because v2's `memory.events` is hierarchical. A
//! group that holds processes of two classes counts for both.
//!
//! `memcolo_cgroup_memory_events_total{group, event}` (`group`: `scope`, `lc`, `be`,
//! `elastic`) adds up, over the scope and each class's groups, the kernel's counters
//! since the agent first saw the group (Documentation/admin-guide/cgroup-v2.rst,
//! `memory.events`): `low` (reclaimed below `memory.low` protection), `high` (over
//! `memory.high`, throttled), `max` (about to go over `memory.max`), `oom` (the OOM
//! killer was invoked), `oom_kill` (processes it killed). cgroup v1 has only `max`
//! (`memory.failcnt`) and `oom_kill` (`memory.oom_control`, Linux 4.13+); the others
//! have no series there.

use super::Core;
use memcolo_linux::cgroup::{cgroup2_mount, v1_memory_mount, MemoryCgroup, MemoryEvents};
use memcolo_linux::scope::Scope;
use memcolo_policy::{Class, Pid};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

/// One memory cgroup holding registered processes.
#[derive(Clone, Debug)]
pub(super) struct ClassGroup {
    pub(super) group: MemoryCgroup,
    /// The classes of the registered processes in it (or below it).
    pub(super) classes: BTreeSet<Class>,
}

/// The class groups and the events counted so far.
#[derive(Default)]
pub(super) struct ClassGroups {
    pub(super) groups: Vec<ClassGroup>,
    /// The registered processes (pid, class) the groups were found for.
    found_for: Option<Vec<(Pid, Class)>>,
    /// The last `memory.events` read of each group (the scope included).
    last_events: HashMap<PathBuf, MemoryEvents>,
}

impl Core {
    /// Finds the class groups again when the process table was read in full or the
    /// registry changed, then adds the events of the scope and of each class's groups
    /// since the last poll to `memcolo_cgroup_memory_events_total`.
    pub(super) fn update_class_groups(&mut self, full_read: bool) {
        let mut registered: Vec<(Pid, Class)> =
            self.registry.iter().map(|e| (e.pid, e.class)).collect();
        registered.sort_unstable();
        if full_read || self.class_groups.found_for.as_ref() != Some(&registered) {
            self.class_groups.groups = self.find_class_groups();
            self.class_groups.found_for = Some(registered);
        }
        let mut read: Vec<(&'static str, MemoryCgroup)> = Vec::new();
        if let Scope::Cgroup(cg) = &self.scope {
            read.push(("scope", cg.clone()));
        }
        for g in &self.class_groups.groups {
            for c in &g.classes {
                read.push((c.as_str(), g.group.clone()));
            }
        }
        let mut fresh: HashMap<PathBuf, MemoryEvents> = HashMap::new();
        for (label, cg) in read {
            let ev = match fresh.get(cg.path()) {
                Some(ev) => *ev,
                None => match cg.read_events() {
                    Ok(ev) => {
                        fresh.insert(cg.path().to_path_buf(), ev);
                        ev
                    }
                    // A group removed since it was found: its processes are gone too.
                    Err(_) => continue,
                },
            };
            // Counted from the first sight of the group.
            let Some(last) = self.class_groups.last_events.get(cg.path()) else {
                continue;
            };
            for (event, now, before) in event_pairs(&ev, last) {
                // A group removed and made again at the same path starts from 0.
                let delta = if now >= before { now - before } else { now };
                if delta > 0 {
                    self.metrics
                        .cgroup_memory_events
                        .with_label_values(&[label, event])
                        .inc_by(delta);
                }
            }
        }
        // Series of the counters the kernel keeps, at 0 until the first event.
        for (label, ev) in self.labelled(&fresh) {
            for (event, v) in event_values(&ev) {
                if v.is_some() {
                    self.metrics
                        .cgroup_memory_events
                        .with_label_values(&[label, event]);
                }
            }
        }
        self.class_groups.last_events = fresh;
    }

    fn labelled(
        &self,
        fresh: &HashMap<PathBuf, MemoryEvents>,
    ) -> Vec<(&'static str, MemoryEvents)> {
        let mut out = Vec::new();
        if let Scope::Cgroup(cg) = &self.scope {
            if let Some(ev) = fresh.get(cg.path()) {
                out.push(("scope", *ev));
            }
        }
        for g in &self.class_groups.groups {
            if let Some(ev) = fresh.get(g.group.path()) {
                for c in &g.classes {
                    out.push((c.as_str(), *ev));
                }
            }
        }
        out
    }

    /// The memory cgroups of the registered processes (see the module documentation).
    fn find_class_groups(&self) -> Vec<ClassGroup> {
        let scope_path = match &self.scope {
            Scope::Cgroup(cg) => Some(cg.path().to_path_buf()),
            Scope::Host(_) => None,
        };
        let v1 = v1_memory_mount(&self.procfs).ok();
        let v2 = cgroup2_mount(&self.procfs).ok();
        let mut by_path: BTreeMap<PathBuf, BTreeSet<Class>> = BTreeMap::new();
        for e in self.registry.iter() {
            let Ok(lines) = self.procfs.read_pid_cgroup(e.pid) else {
                continue;
            };
            let (line, mount) = match lines
                .iter()
                .find(|l| l.controllers.iter().any(|c| c == "memory"))
            {
                Some(l) => (l, v1.as_ref()),
                None => match lines.iter().find(|l| l.hierarchy_id == 0) {
                    Some(l) => (l, v2.as_ref()),
                    None => continue,
                },
            };
            let rel = line.path.trim_start_matches('/');
            let Some(mount) = mount else { continue };
            if rel.is_empty() {
                continue; // the root group
            }
            let path = mount.join(rel);
            if let Some(sp) = &scope_path {
                if path == *sp || !path.starts_with(sp) {
                    continue;
                }
            }
            by_path.entry(path).or_default().insert(e.class);
        }
        let mut out = Vec::new();
        for (path, classes) in &by_path {
            // Only the outermost group of each class: an ancestor of the same class
            // already counts this group's events.
            let classes: BTreeSet<Class> = classes
                .iter()
                .copied()
                .filter(|c| {
                    !by_path
                        .iter()
                        .any(|(p, cs)| p != path && path.starts_with(p) && cs.contains(c))
                })
                .collect();
            if classes.is_empty() {
                continue;
            }
            if let Ok(group) = MemoryCgroup::open(path) {
                out.push(ClassGroup { group, classes });
            }
        }
        out
    }
}

/// `(event, value)` of each counter, `None` where the cgroup version has none.
fn event_values(ev: &MemoryEvents) -> [(&'static str, Option<u64>); 5] {
    [
        ("low", ev.low),
        ("high", ev.high),
        ("max", Some(ev.max)),
        ("oom", ev.oom),
        ("oom_kill", Some(ev.oom_kill)),
    ]
}

/// `(event, now, before)` of each counter both reads have.
fn event_pairs(now: &MemoryEvents, before: &MemoryEvents) -> Vec<(&'static str, u64, u64)> {
    event_values(now)
        .into_iter()
        .zip(event_values(before))
        .filter_map(|((k, n), (_, b))| Some((k, n?, b?)))
        .collect()
}
