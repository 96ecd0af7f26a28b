//! What the core tells the asynchronous reclaim service ([`crate::async_reclaim`]):
//! each poll's [`crate::snapshot::NodeSnapshot`], with the registered processes as
//! proofs, their RSS, the LC process trees and the CPUs the agent may use.

use super::{Core, ProcTable};
use memcolo_policy::Class;

impl Core {
    /// Connects the asynchronous reclaim service: every poll then hands it the
    /// registered targets, the LC process trees and the CPUs it may use.
    pub fn attach_reclaim(&mut self, link: crate::async_reclaim::AsyncReclaimLink) {
        self.reclaim = Some(link);
        let procs = self.read_procs_tracked();
        self.publish_reclaim_targets(&procs);
    }

    pub(super) fn publish_reclaim_targets(&mut self, procs: &ProcTable) {
        let Some(link) = &self.reclaim else { return };
        let mut inputs = crate::snapshot::NodeSnapshot {
            poll: self.polls,
            scope: self.last_sample.clone(),
            cpus: self.agent_cpus.clone(),
            ..Default::default()
        };
        for e in self.registry.iter() {
            if e.class == Class::Lc {
                inputs.lc_pids.extend(procs.tree(e.pid));
                inputs.lc_pids.insert(e.pid);
            }
            // A target is the registered process's proof, never its bare pid: the
            // workers act through its pidfd after re-verifying it, so a pid reused
            // after this poll is never reached.
            if let Some(p) = self.proven.get(&e.pid) {
                inputs.targets.push(crate::async_reclaim::ReclaimTarget {
                    process: p.clone(),
                    class: e.class,
                });
                if let Some(&rss) = procs.rss_bytes.get(&e.pid) {
                    inputs.rss_bytes.insert(e.pid, rss);
                }
            }
        }
        link.publish(inputs);
    }
}
