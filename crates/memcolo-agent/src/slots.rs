//! Connection limits of the agent's sockets (`agent.sock`, `tier.sock`): how many
//! connections are served at once, how many of them only the node's root may take,
//! and how many one owner may hold (docs/security.md, "What each user may ask").
//!
//! An owner is a uid, and the pid namespace of the connecting process when it is not
//! the agent's. Root of a container's pid namespace is uid 0 to `SO_PEERCRED` (without
//! a user namespace) but not the node's root: it is held to the per-owner limit, in a
//! share of its own, so it can lock out neither root nor another container.

use memcolo_linux::procfs::ProcFs;
use std::collections::HashMap;

/// Whose connection it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotOwner {
    pub uid: u32,
    /// The connecting process's pid namespace (`/proc/PID/ns/pid` inode) when it is
    /// not the agent's; `Some(0)` when it could not be read.
    pub foreign_pid_ns: Option<u64>,
}

impl SlotOwner {
    /// The owner of a connection from `pid` (`SO_PEERCRED`) as `uid`. The namespace is
    /// read by pid, before the peer is proved: a pid reused in between only moves the
    /// connection to another share. A namespace that cannot be read counts as foreign.
    pub fn of(procfs: &ProcFs, uid: u32, pid: Option<i32>) -> SlotOwner {
        let own = procfs.own_pid_namespace().ok();
        let ns = pid.and_then(|p| procfs.pid_namespace(p).ok());
        SlotOwner {
            uid,
            foreign_pid_ns: match (own, ns) {
                (Some(a), Some(b)) if a == b => None,
                (_, Some(b)) => Some(b),
                _ => Some(0),
            },
        }
    }

    /// The node's root: uid 0 in the agent's pid namespace.
    pub fn is_root(&self) -> bool {
        self.uid == 0 && self.foreign_pid_ns.is_none()
    }
}

/// The limits: `total` connections at once, the last `root_reserved` of them for the
/// node's root, at most `per_owner` per other owner.
#[derive(Clone, Copy, Debug)]
pub struct SlotLimits {
    pub total: usize,
    pub root_reserved: usize,
    pub per_owner: usize,
}

/// Connections held per owner, and all together.
#[derive(Debug, Default)]
pub struct Slots {
    total: usize,
    per_owner: HashMap<SlotOwner, usize>,
}

impl Slots {
    /// Takes a slot for a connection of `who`, or says which limit it would cross.
    pub fn take(&mut self, who: SlotOwner, l: &SlotLimits) -> Result<(), String> {
        let mine = self.per_owner.get(&who).copied().unwrap_or(0);
        if self.total >= l.total {
            return Err(format!("{} connections open (cap {})", self.total, l.total));
        }
        if !who.is_root() {
            if self.total >= l.total.saturating_sub(l.root_reserved) {
                return Err(format!(
                    "the last {} connections are kept for root",
                    l.root_reserved
                ));
            }
            if mine >= l.per_owner {
                return Err(format!(
                    "user {} holds {mine} connections (cap {} per user)",
                    who.uid, l.per_owner
                ));
            }
        }
        self.total += 1;
        *self.per_owner.entry(who).or_default() += 1;
        Ok(())
    }

    /// Gives back a slot of `who`.
    pub fn give_back(&mut self, who: SlotOwner) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_owner.get_mut(&who) {
            *n -= 1;
            if *n == 0 {
                self.per_owner.remove(&who);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_containers_root_is_held_to_a_users_share() {
        let l = SlotLimits {
            total: 10,
            root_reserved: 2,
            per_owner: 3,
        };
        let root = SlotOwner {
            uid: 0,
            foreign_pid_ns: None,
        };
        let ctr_a = SlotOwner {
            uid: 0,
            foreign_pid_ns: Some(7),
        };
        let ctr_b = SlotOwner {
            uid: 0,
            foreign_pid_ns: Some(8),
        };
        let mut s = Slots::default();
        for _ in 0..3 {
            s.take(ctr_a, &l).unwrap();
        }
        assert!(s.take(ctr_a, &l).is_err(), "past its share");
        for _ in 0..3 {
            s.take(ctr_b, &l).unwrap();
        }
        let user = SlotOwner {
            uid: 1000,
            foreign_pid_ns: None,
        };
        s.take(user, &l).unwrap();
        s.take(user, &l).unwrap();
        // 8 taken: the last 2 are root's.
        assert!(s.take(user, &l).is_err());
        s.take(root, &l).unwrap();
        s.take(root, &l).unwrap();
        assert!(s.take(root, &l).is_err(), "total cap");
        s.give_back(ctr_a);
        s.give_back(ctr_a);
        s.give_back(ctr_a);
        s.take(ctr_a, &l).unwrap();
    }
}
