//! The node snapshot: what the core's poll sensed and the registry's view of the
//! processes, published once per poll as an immutable [`NodeSnapshot`] for the
//! controllers that run at their own periods.
//!
//! The core's poll (every `poll_ms`, 1 s by default, and on pressure events at least
//! `events.min_gap_ms` apart) is the one sensing stage of the node's slow figures:
//! the scope's memory, swap, PSI and refault counters ([`ScopeSample`]), every
//! process's RSS, and the registry it owns. It publishes them through a
//! [`tokio::sync::watch`] channel of `Arc<NodeSnapshot>`: publishing replaces the
//! latest snapshot without waiting, and a reader takes an `Arc` of the newest one
//! (never a half-written one, and never blocks the poll). Readers: the reclaim
//! controller (Hermit), every `reclaim.tick_ms`; see `docs/architecture.md`.

use memcolo_linux::identity::ProvenProcess;
use memcolo_linux::scope::ScopeSample;
use memcolo_policy::Class;
use memcolo_policy::Pid;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::sync::watch;

/// A registered process whose memory may be reclaimed: its proof (the pidfd, start
/// time and credentials the core registered) and class.
#[derive(Clone, Debug)]
pub struct ReclaimTarget {
    pub process: Arc<ProvenProcess>,
    pub class: Class,
}

impl ReclaimTarget {
    pub fn pid(&self) -> Pid {
        self.process.pid()
    }
}

/// One poll's view of the node. Immutable once published.
#[derive(Clone, Debug, Default)]
pub struct NodeSnapshot {
    /// The core's polls so far when it was taken (0: before the first poll).
    pub poll: u64,
    /// The scope's figures as the poll read them; `None` before the first sample.
    pub scope: Option<ScopeSample>,
    /// Registered processes (tree roots) whose memory the reclaim service may take,
    /// by their proof (pidfd, start time, credentials), never a bare pid.
    pub targets: Vec<ReclaimTarget>,
    /// RSS of each target, bytes (`/proc/PID/stat` field 24 × the page size), as the
    /// poll read it; a target the poll did not see has none.
    pub rss_bytes: BTreeMap<Pid, u64>,
    /// Every process of every LC tree: their memory is never reclaimed (unless
    /// allowed), and a cgroup holding one is never stepped.
    pub lc_pids: BTreeSet<Pid>,
    /// CPUs the agent may use (off the LC CPUs); `None`: any.
    pub cpus: Option<Vec<usize>>,
}

/// The publishing end, held by the core.
#[derive(Clone, Debug)]
pub struct SnapshotTx(Arc<watch::Sender<Arc<NodeSnapshot>>>);

/// A reading end: each controller holds its own.
#[derive(Clone, Debug)]
pub struct SnapshotRx(watch::Receiver<Arc<NodeSnapshot>>);

/// A channel holding an empty snapshot until the first publish.
pub fn channel() -> (SnapshotTx, SnapshotRx) {
    let (tx, rx) = watch::channel(Arc::new(NodeSnapshot::default()));
    (SnapshotTx(Arc::new(tx)), SnapshotRx(rx))
}

impl SnapshotTx {
    /// Replaces the latest snapshot; never waits, with or without readers.
    pub fn publish(&self, snapshot: NodeSnapshot) {
        self.0.send_replace(Arc::new(snapshot));
    }
}

impl SnapshotRx {
    /// The newest snapshot if one was published since this reader last took one.
    pub fn newer(&mut self) -> Option<Arc<NodeSnapshot>> {
        match self.0.has_changed() {
            Ok(true) => Some(self.0.borrow_and_update().clone()),
            _ => None,
        }
    }

    /// The newest snapshot, new or not.
    pub fn latest(&self) -> Arc<NodeSnapshot> {
        self.0.borrow().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_see_the_newest_snapshot_once() {
        let (tx, mut rx) = channel();
        assert!(rx.newer().is_none(), "nothing published yet");
        assert_eq!(rx.latest().poll, 0);
        let mut other = rx.clone();
        for poll in 1..=3 {
            tx.publish(NodeSnapshot {
                poll,
                ..Default::default()
            });
        }
        // Only the newest is kept; each reader takes it once.
        assert_eq!(rx.newer().map(|s| s.poll), Some(3));
        assert!(rx.newer().is_none());
        assert_eq!(other.newer().map(|s| s.poll), Some(3));
        // A reader holding a snapshot keeps it unchanged across a publish.
        let held = rx.latest();
        tx.publish(NodeSnapshot {
            poll: 4,
            ..Default::default()
        });
        assert_eq!(held.poll, 3);
        assert_eq!(rx.newer().map(|s| s.poll), Some(4));
    }

    #[test]
    fn publishing_without_readers_does_not_fail() {
        let (tx, rx) = channel();
        drop(rx);
        tx.publish(NodeSnapshot::default());
    }
}
