//! The poll: one sense → decide → act round (the scope's memory, the process table,
//! the M3 monitor's step, Hermes' advice round, the snapshot for the reclaim service),
//! and the metrics it updates.

use super::{Core, ProcTable, Seen, Trigger, FULL_READ_POLLS};
use crate::registry::Entry;
use memcolo_linux::scope::ScopeSample;
use memcolo_policy::m3::{Action, ProcView, Zone};
use memcolo_policy::{Class, Pid};
use memcolo_proto::NotifyMode;
use serde_json::json;
use std::time::Duration;

impl Core {
    /// One sense → decide → act round.
    pub fn poll(&mut self, now: Duration, trigger: Trigger) {
        self.polls += 1;
        self.last_poll_at = self.last_poll_at.max(now);
        self.metrics
            .polls
            .with_label_values(&[trigger.as_str()])
            .inc();
        self.metrics
            .last_poll_timestamp
            .set(super::unix_now_s() as i64);
        let sample = match self.scope.sample_with_host(&self.procfs) {
            Ok(s) => {
                self.sense_error_logged = false;
                s
            }
            Err(e) => {
                self.metrics.errors.with_label_values(&["sense"]).inc();
                if !self.sense_error_logged {
                    tracing::error!(scope = %self.scope.describe(), error = %e, "cannot read scope memory; skipping polls until it recovers");
                    self.sense_error_logged = true;
                }
                return;
            }
        };
        if sample.total_bytes != self.scope_total_bytes && self.cfg.m3.top_bytes.is_none() {
            let top = self.cfg.m3_config(sample.total_bytes).top_bytes;
            match self.monitor.try_set_top(top) {
                Ok(()) => self.scope_total_bytes = sample.total_bytes,
                Err(e) => {
                    self.metrics.errors.with_label_values(&["config"]).inc();
                    tracing::warn!(error = %e, "scope memory changed to an unusable size; keeping the old top");
                }
            }
        }
        self.collect_advice();
        let mut procs = self.read_procs();
        let views = self.views(&procs);
        self.audit_reclaim(now);
        let actions = self.monitor.step(now, sample.working_set_bytes, &views);
        // A kill takes the job's whole tree: read every process, so that a child forked
        // since the last full read is not left behind.
        if !procs.full && actions.iter().any(|a| matches!(a, Action::Kill { .. })) {
            procs = self.read_procs_full();
        }
        for a in actions {
            self.act(a, now, &procs);
        }
        if self.cfg.hermes.enabled {
            self.advise(&sample, &procs);
        }
        let mut pod_processes = None;
        if let Some(kube) = self.kube.as_mut() {
            let stamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            match kube.poll(
                now,
                sample.working_set_bytes,
                self.monitor.thresholds(),
                &stamp,
            ) {
                Ok(mut r) => {
                    let processes = std::mem::take(&mut r.processes);
                    if let Some(d) = &self.tier_defaults {
                        d.replace(std::mem::take(&mut r.tier_targets));
                    }
                    // The event log says which pods were asked to go, and how.
                    for (uid, via) in r
                        .evictions_requested
                        .iter()
                        .map(|u| (u, "eviction_api"))
                        .chain(r.killed.iter().map(|u| (u, "sigkill")))
                    {
                        self.metrics.pod_evictions.with_label_values(&[via]).inc();
                        let memory_bytes = r.pods.get(uid).map(|p| p.1).unwrap_or(0);
                        self.events.record(
                            "pod_evict",
                            serde_json::json!({"pod_uid": uid, "via": via, "memory_bytes": memory_bytes,
                                               "used_bytes": sample.working_set_bytes}),
                        );
                    }
                    pod_processes = Some(processes);
                }
                Err(e) => {
                    self.metrics.errors.with_label_values(&["kubernetes"]).inc();
                    tracing::warn!(error = %e, "cannot read the node's pods");
                }
            }
            self.metrics
                .kubernetes_api_reachable
                .set(i64::from(!kube.api_unreachable()));
        }
        if let Some(p) = pod_processes {
            self.sync_pod_registrations(&p);
        }
        self.update_poll_metrics(&sample);
        self.update_class_groups(procs.full);
        self.apply_be_memory_high(&procs);
        self.last_sample = Some(sample);
        self.publish_reclaim_targets(&procs);
        // The registry is marked for saving on every change; the adapted thresholds
        // every 10 polls.
        if self.polls.is_multiple_of(10) {
            self.persist();
        }
    }

    /// The process table of this poll: every process's `/proc/PID/stat` every
    /// [`FULL_READ_POLLS`] polls (a registered process's new children are found
    /// then), and in between only the registered processes and the descendants the
    /// last full read found ([`Core::read_procs_tracked`]). The full read costs a
    /// `stat` of every process on the machine, registered or not: on a node of
    /// thousands of processes it was most of the agent's CPU.
    pub(super) fn read_procs(&mut self) -> ProcTable {
        if self.last_full.is_none() || self.polls.is_multiple_of(FULL_READ_POLLS) {
            self.read_procs_full()
        } else {
            self.read_procs_tracked()
        }
    }

    /// The registered processes and the descendants the last full read found that are
    /// still the same processes (start time) and still below a registered process.
    pub(super) fn read_procs_tracked(&mut self) -> ProcTable {
        let Some(last) = self.last_full.as_ref() else {
            return self.read_procs_full();
        };
        let mut want: Vec<Pid> = Vec::new();
        for e in self.registry.iter() {
            want.push(e.pid);
            want.extend(last.tree(e.pid));
        }
        want.sort_unstable();
        want.dedup();
        let mut t = ProcTable::default();
        for pid in want {
            let Ok(st) = self.procfs.read_pid_stat(pid) else {
                continue;
            };
            // A pid the full read saw as another process is not followed.
            if last
                .starttime_ticks
                .get(&pid)
                .is_some_and(|s| *s != st.starttime_ticks)
            {
                continue;
            }
            t.rss_bytes
                .insert(pid, st.rss_pages.saturating_mul(self.page_size));
            t.starttime_ticks.insert(pid, st.starttime_ticks);
            t.children.entry(st.ppid).or_default().push(pid);
        }
        t
    }

    /// `/proc/PID/stat` of every process, for RSS of process trees.
    pub(super) fn read_procs_full(&mut self) -> ProcTable {
        let mut t = ProcTable {
            full: true,
            ..Default::default()
        };
        let pids = match self.procfs.pids() {
            Ok(p) => p,
            Err(e) => {
                self.metrics.errors.with_label_values(&["procfs"]).inc();
                tracing::warn!(error = %e, "cannot list processes");
                return t;
            }
        };
        for pid in pids {
            // Processes exit between listing and reading: skip them silently.
            if let Ok(st) = self.procfs.read_pid_stat(pid) {
                t.rss_bytes
                    .insert(pid, st.rss_pages.saturating_mul(self.page_size));
                t.starttime_ticks.insert(pid, st.starttime_ticks);
                t.children.entry(st.ppid).or_default().push(pid);
            }
        }
        self.last_full = Some(t.clone());
        t
    }

    pub(super) fn views(&mut self, procs: &ProcTable) -> Vec<ProcView> {
        let mut views = Vec::with_capacity(self.registry.len());
        self.seen.clear();
        for e in self.registry.iter() {
            let (rss, descendants) = procs.tree_rss(e.pid);
            self.seen.insert(
                e.pid,
                Seen {
                    rss_bytes: rss,
                    descendants,
                },
            );
            views.push(ProcView {
                pid: e.pid,
                class: e.class,
                started_at: Duration::from_secs_f64(
                    e.starttime_ticks as f64 / self.ticks_per_sec as f64,
                ),
                rss_bytes: rss,
                notifiable: match e.notify {
                    NotifyMode::Socket => e.conn.is_some_and(|c| self.conns.contains_key(&c)),
                    NotifyMode::Signal => true,
                    NotifyMode::None => false,
                },
                expected_reclaim_bytes: e.expected_reclaim_bytes,
            });
        }
        views
    }

    /// Feeds each registered process's RSS (as this poll saw it) to its ledger, and
    /// reports an elastic process whose reported reclamation its RSS does not show
    /// (rule R10 of `memcolo_policy::m3`): once per episode, as the event
    /// `reclaim_unmatched`, a warning and `memcolo_reclaim_unmatched_total`.
    pub(super) fn audit_reclaim(&mut self, now: Duration) {
        for e in self.registry.iter() {
            let Some(seen) = self.seen.get(&e.pid) else {
                continue;
            };
            let ledger = self.ledgers.entry(e.pid).or_default();
            let Some(u) = ledger.observe_rss(now, seen.rss_bytes) else {
                continue;
            };
            if e.class != Class::Elastic {
                continue;
            }
            self.metrics
                .reclaim_unmatched
                .with_label_values(&[e.class.as_str()])
                .inc();
            tracing::warn!(pid = e.pid, name = %e.name, reported_bytes = u.reported_bytes,
                rss_fell_bytes = u.rss_fell_bytes,
                "reported reclamation is not matched by a fall of the process's RSS");
            self.events.record(
                "reclaim_unmatched",
                json!({"pid": e.pid, "name": e.name, "class": e.class,
                       "window_s": memcolo_policy::ledger::WINDOW.as_secs(),
                       "reported_bytes": u.reported_bytes, "rss_fell_bytes": u.rss_fell_bytes,
                       "rss_bytes": seen.rss_bytes}),
            );
        }
    }

    /// Whether `e` is in an unmatched-reclaim episode (R10; elastic processes only).
    pub(super) fn reclaim_unmatched(&self, e: &Entry) -> bool {
        e.class == Class::Elastic && self.ledgers.get(&e.pid).is_some_and(|l| l.unmatched())
    }

    pub(super) fn act(&mut self, action: Action, now: Duration, procs: &ProcTable) {
        match action {
            Action::Signal {
                pid,
                level,
                target_bytes,
            } => self.notify(pid, level, target_bytes, now),
            Action::Kill { pid, reason } => self.kill(pid, &reason, procs),
        }
    }

    pub(super) fn update_registry_metrics(&self) {
        for class in [Class::Lc, Class::Be, Class::Elastic] {
            let n = self.registry.iter().filter(|e| e.class == class).count();
            self.metrics
                .registered
                .with_label_values(&[class.as_str()])
                .set(n as i64);
        }
    }

    pub(super) fn update_poll_metrics(&self, s: &ScopeSample) {
        let m = &self.metrics;
        for (k, v) in [
            ("total", s.total_bytes),
            ("used", s.used_bytes),
            ("working_set", s.working_set_bytes),
            ("file", s.file_bytes),
            ("anon", s.anon_bytes),
            ("swap", s.swap_used_bytes),
        ] {
            m.node_memory_bytes.with_label_values(&[k]).set(v as i64);
        }
        let t = self.monitor.thresholds();
        for (k, v) in [
            ("low", t.low_bytes),
            ("high", t.high_bytes),
            ("top", t.top_bytes),
            ("adv_thr", self.cfg.adv_thr_bytes(s.total_bytes)),
        ] {
            m.threshold_bytes.with_label_values(&[k]).set(v as i64);
        }
        m.zone.set(match self.monitor.zone() {
            Zone::Green => 0,
            Zone::Yellow => 1,
            Zone::Red => 2,
            Zone::AboveTop => 3,
        });
        for class in [Class::Lc, Class::Be, Class::Elastic] {
            let n = self
                .registry
                .iter()
                .filter(|e| e.class == class && self.reclaim_unmatched(e))
                .count();
            m.reclaim_unmatched_processes
                .with_label_values(&[class.as_str()])
                .set(n as i64);
        }
        m.process_rss_bytes.reset();
        for e in self.registry.iter() {
            if let Some(seen) = self.seen.get(&e.pid) {
                m.process_rss_bytes
                    .with_label_values(&[&e.pid.to_string(), e.class.as_str(), &e.name])
                    .set(seen.rss_bytes as i64);
            }
        }
    }
}
