//! The state the core saves (registry and monitor, written at most once per
//! [`crate::registry::FLUSH_INTERVAL`]) and the status it shows (`memcolo status`,
//! pages of registered processes).

use super::Core;
use crate::registry::{self, Entry};
use memcolo_policy::m3::ProcView;
use serde_json::json;
use std::time::Duration;

impl Core {
    /// Marks the state (registry and monitor) changed: [`Core::flush_state`] writes
    /// it at the main loop's next flush, at most once per
    /// [`registry::FLUSH_INTERVAL`].
    pub(super) fn persist(&mut self) {
        self.state_dirty = true;
    }

    /// Writes the state if it changed since the last write (the main loop calls this
    /// every [`registry::FLUSH_INTERVAL`]). A failed write (full disk, read-only
    /// file system) is logged, counted (`memcolo_state_write_errors_total`) and
    /// retried at the next flush; the state stays in memory meanwhile. Returns
    /// whether the state is saved.
    pub fn flush_state(&mut self) -> bool {
        if !self.state_dirty {
            return true;
        }
        match registry::save(&self.state_path, &self.registry, Some(self.monitor.state())) {
            Ok(()) => {
                self.state_dirty = false;
                self.metrics.state_writes.inc();
                if self.state_write_failing {
                    tracing::info!(path = %self.state_path.display(), "state saved again");
                    self.state_write_failing = false;
                }
                true
            }
            Err(e) => {
                self.metrics.state_write_errors.inc();
                self.metrics.errors.with_label_values(&["state"]).inc();
                if !self.state_write_failing {
                    tracing::error!(error = %e, "cannot save state; it stays in memory and the write is retried every second");
                    self.state_write_failing = true;
                }
                false
            }
        }
    }

    /// Gives capped BE groups their `memory.high` back and saves the state (clean
    /// shutdown).
    pub fn shutdown(&mut self) {
        self.release_be_memory_high();
        self.persist();
        self.flush_state();
        self.events
            .record("shutdown", json!({"registered": self.registry.len()}));
    }

    /// `memcolo status --json`: the whole state, every registered process included.
    pub fn status_json(&self) -> serde_json::Value {
        let mut st = self.status_page(0);
        st["processes"] = self.registry.iter().map(|e| self.process_json(e)).collect();
        st["next_offset"] = serde_json::Value::Null;
        st
    }

    /// One page of the state for a `status` request: the registered processes from
    /// index `offset` on, as many as keep the encoded reply under the protocol's
    /// line limit, and `next_offset` (null after the last page). Reclaim's list of
    /// targets is cut to its first 32 (`targets_total` counts them all).
    pub fn status_page(&self, offset: u64) -> serde_json::Value {
        let mut st = self.status_header();
        if let Some(targets) = st
            .get_mut("reclaim")
            .and_then(|r| r.get_mut("targets"))
            .and_then(|t| t.as_array_mut())
        {
            let n = targets.len();
            targets.truncate(32);
            st["reclaim"]["targets_total"] = n.into();
        }
        // Room for the envelope ({"v":1,"type":"status","status":...}) and the
        // paging fields.
        let mut budget = memcolo_proto::MAX_LINE_BYTES
            .saturating_sub(serde_json::to_vec(&st).map(|v| v.len()).unwrap_or(0) + 256);
        let mut page = Vec::new();
        let mut next = None;
        for (i, e) in self.registry.iter().enumerate().skip(offset as usize) {
            let p = self.process_json(e);
            let len = serde_json::to_vec(&p).map(|v| v.len()).unwrap_or(0) + 1;
            if len > budget {
                next = Some(i);
                break;
            }
            budget -= len;
            page.push(p);
        }
        st["processes"] = page.into();
        st["processes_total"] = self.registry.len().into();
        st["processes_offset"] = offset.into();
        st["next_offset"] = next.into();
        st
    }

    pub(super) fn process_json(&self, e: &Entry) -> serde_json::Value {
        let seen = self.seen.get(&e.pid);
        let rates = self
            .ledgers
            .get(&e.pid)
            .map(|l| l.rates(self.last_poll_at))
            .unwrap_or_default();
        json!({
            "pid": e.pid, "class": e.class, "name": e.name, "notify": e.notify,
            "connected": e.conn.is_some(),
            "rss_bytes": seen.map(|s| s.rss_bytes), "descendants": seen.map(|s| s.descendants),
            "notifications_sent": e.notifications_sent, "notifications": e.notified,
            "notifications_per_min": rates.notifications_per_min,
            "reclaimed_bytes": e.reclaimed_bytes, "reclaim_reports": e.reclaim_reports,
            "reclaim_bytes_per_s": rates.reclaim_bytes_per_s,
            "reclaim_unmatched": self.reclaim_unmatched(e),
            "epoch_ms": self.monitor.epoch(e.pid).map(|d| d.as_millis() as u64),
            "failed_reclaims": e.failed_reclaims,
            "in_scope": !self.out_of_scope.contains(&e.pid),
            "expected_reclaim_bytes": self.monitor.expected_reclaim_bytes(&ProcView {
                pid: e.pid, class: e.class, started_at: Duration::ZERO,
                rss_bytes: seen.map(|s| s.rss_bytes).unwrap_or(0), notifiable: true,
                expected_reclaim_bytes: e.expected_reclaim_bytes,
            }),
        })
    }

    pub(super) fn status_header(&self) -> serde_json::Value {
        let t = self.monitor.thresholds();
        let s = self.last_sample.as_ref();
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "scope": self.scope.describe(),
            "poll_ms": self.cfg.poll_ms,
            "polls": self.polls,
            "zone": self.monitor.zone(),
            "memory": s.map(|s| json!({
                "total_bytes": s.total_bytes, "used_bytes": s.used_bytes,
                "working_set_bytes": s.working_set_bytes, "file_bytes": s.file_bytes,
                "anon_bytes": s.anon_bytes, "swap_used_bytes": s.swap_used_bytes,
            })),
            "thresholds": {
                "low_bytes": t.low_bytes, "high_bytes": t.high_bytes, "top_bytes": t.top_bytes,
                "adv_thr_bytes": self.cfg.adv_thr_bytes(self.scope_total_bytes),
            },
            "counters": {
                "file_cache_dropped_bytes": self.file_cache_dropped_bytes,
                "file_advice_rounds_skipped": self.advice_rounds_skipped,
                "kills": self.kills,
                "dropped_notifications": self.dropped_notifications,
                "outstanding_notifications": self.outstanding.len(),
            },
            "state": {
                "path": self.state_path, "dirty": self.state_dirty,
                "writes": self.metrics.state_writes.get(),
                "write_errors": self.metrics.state_write_errors.get(),
            },
            "reclaim": self.reclaim.as_ref().map(|r| r.status()),
            "mechanisms": self.mechanisms.json(),
            "mechanisms_off": self.mechanisms.off_json(),
        })
    }
}
