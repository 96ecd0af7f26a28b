//! M3's actions carried out (M3 §5): a notification to a process (a socket message,
//! or a real-time signal) and, the last resort, SIGKILL of a BE process tree through
//! pidfds.

use super::{notify_signals, same_user, Core, Outstanding, ProcTable};
use memcolo_policy::{Class, Level, Pid};
use memcolo_proto::{NotifyMode, Reply};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

impl Core {
    pub(super) fn notify(&mut self, pid: Pid, level: Level, target_bytes: u64, now: Duration) {
        let Some(e) = self.registry.get(pid) else {
            return;
        };
        let (notify, conn, name, class) = (e.notify, e.conn, e.name.clone(), e.class);
        let seq = self.next_seq;
        let via = match notify {
            NotifyMode::Socket => {
                let Some(tx) = conn.and_then(|c| self.conns.get(&c)) else {
                    return;
                };
                match tx.try_send(Reply::Notify {
                    seq,
                    level,
                    target_bytes,
                }) {
                    Ok(()) => "socket",
                    Err(_) => {
                        self.dropped_notifications += 1;
                        self.metrics
                            .errors
                            .with_label_values(&["notify_queue_full"])
                            .inc();
                        return;
                    }
                }
            }
            NotifyMode::Signal => {
                let sig = notify_signals()[match level {
                    Level::Low => 0,
                    Level::High => 1,
                    Level::Top => 2,
                }];
                // Through the registered process's pidfd, proved again just now.
                let Some(p) = self.verified(pid) else {
                    return;
                };
                if let Err(err) = self.actuator.signal(&p, sig) {
                    self.metrics.errors.with_label_values(&["signal"]).inc();
                    tracing::warn!(pid, error = %err, "cannot signal process");
                    return;
                }
                "signal"
            }
            NotifyMode::None => return,
        };
        self.next_seq += 1;
        if notify == NotifyMode::Socket {
            self.outstanding.insert(
                seq,
                Outstanding {
                    pid,
                    level,
                    sent_at: now,
                },
            );
            // Bound the table: answers older than a minute will not come.
            if self.outstanding.len() > 4096 {
                let cutoff = now.saturating_sub(Duration::from_secs(60));
                self.outstanding.retain(|_, o| o.sent_at >= cutoff);
            }
        }
        if let Some(e) = self.registry.get_mut(pid) {
            e.notifications_sent += 1;
            e.notified.add(level);
        }
        self.ledgers.entry(pid).or_default().notified(now, level);
        self.metrics
            .notifications
            .with_label_values(&[class.as_str(), level.as_str(), via])
            .inc();
        self.events.record(
            "notify",
            json!({"pid": pid, "name": name, "level": level, "target_bytes": target_bytes, "seq": seq, "via": via,
                   "poll_at_ms": now.as_millis() as u64}),
        );
    }

    pub(super) fn kill(&mut self, pid: Pid, reason: &str, procs: &ProcTable) {
        let Some(e) = self.registry.get(pid) else {
            return;
        };
        if e.class != Class::Be {
            // The policy never asks for this; refuse loudly if it ever does.
            tracing::error!(pid, class = %e.class, "refusing to kill a process that is not BE");
            self.metrics
                .errors
                .with_label_values(&["kill_refused"])
                .inc();
            return;
        }
        if e.pod_uid.is_some() {
            // A pod's process: Kubernetes mode evicts the pod through the API server
            // by its own rule (crate::kubernetes), never a process of it by M3's.
            return;
        }
        let name = e.name.clone();
        // The registered process proved again: one that exec'd a set-user-ID program
        // or otherwise changed credentials since it registered is no longer the BE job
        // that was registered, and loses its registration instead.
        let Some(job) = self.verified(pid) else {
            return;
        };
        let job_creds = *job.credentials();
        let lc_pids: HashSet<Pid> = self
            .registry
            .iter()
            .filter(|e| e.class == Class::Lc)
            .flat_map(|e| procs.tree(e.pid))
            .collect();
        // The registered process and its descendants are one BE job; an LC process
        // that somehow sits below it is spared.
        let mut victims = procs.tree(pid);
        victims.retain(|p| !lc_pids.contains(p));
        victims.reverse();
        let rss = self.seen.get(&pid).map(|s| s.rss_bytes).unwrap_or(0);
        let mut killed = Vec::with_capacity(victims.len());
        for v in victims {
            let target = if v == pid {
                job.clone()
            } else {
                // A descendant: still the process this poll saw, and running as the
                // job's user (a set-user-ID program the job started is not the job's).
                match self.prover.open(v, procs.starttime_ticks.get(&v).copied()) {
                    Ok(p) if same_user(p.credentials(), &job_creds) => Arc::new(p),
                    Ok(p) => {
                        self.metrics
                            .errors
                            .with_label_values(&["kill_refused"])
                            .inc();
                        tracing::warn!(pid = v, uids = ?p.credentials().uids, job_uids = ?job_creds.uids,
                            "not killing a descendant of a BE job that runs as another user");
                        continue;
                    }
                    Err(_) => continue, // exited since the poll
                }
            };
            match self.actuator.kill(&target, reason) {
                Ok(()) => killed.push(v),
                Err(err) => {
                    if !err.is_not_found() {
                        self.metrics.errors.with_label_values(&["kill"]).inc();
                        tracing::warn!(pid = v, error = %err, "kill failed");
                    }
                }
            }
        }
        let victims = killed;
        self.kills += 1;
        self.metrics.kills.inc();
        self.events.record(
            "kill",
            json!({"pid": pid, "name": name, "class": "be", "rss_bytes": rss, "pids": victims, "reason": reason}),
        );
    }
}
