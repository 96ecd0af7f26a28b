//! The MaxMem policy thread: epochs while a region is attached, near-idle otherwise,
//! and the process stopped when a page of it cannot come back.

use super::{lock, release, Shared};
use memcolo_tier::node::{EpochApplied, NodeTiming};
use memcolo_tier::region::PAGE;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How often the idle policy thread (no region attached) looks for a region.
pub(super) const IDLE_CHECK: Duration = Duration::from_millis(200);

/// Runs the MaxMem epochs while some region is attached. Without one the thread only
/// looks for a region every [`IDLE_CHECK`] (rather than waking at every 10 ms slot):
/// the service is on by default and must cost next to nothing on a node where no
/// process tiers.
pub(super) fn policy_loop(shared: &Arc<Shared>) {
    let timing = NodeTiming {
        window: Duration::from_millis(shared.cfg.window_ms),
        windows_per_epoch: shared.cfg.windows_per_epoch,
        slots_per_window: shared.cfg.slots_per_window.max(1),
    };
    while !shared.stop.load(Ordering::Acquire) {
        if shared.node.regions().is_empty() {
            std::thread::sleep(IDLE_CHECK);
            continue;
        }
        shared.pause.store(false, Ordering::SeqCst);
        // `stop` sets `stop` before `pause` (SeqCst): either it is seen set here or
        // the epochs will see `pause` set.
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        run_epochs(shared, timing);
    }
}

/// Epochs until the agent stops or an epoch ends with no region attached.
pub(super) fn run_epochs(shared: &Arc<Shared>, timing: NodeTiming) {
    shared.node.run(timing, &shared.pause, |out, applied| {
        shared.epoch.store(out.epoch, Ordering::Relaxed);
        on_fatal(shared, applied);
        let m = &shared.metrics;
        m.a_miss.reset();
        m.t_miss.reset();
        m.bytes.reset();
        m.infeasible.reset();
        for p in &out.procs {
            let pid = p.pid.to_string();
            m.a_miss.with_label_values(&[&pid]).set(p.a_miss);
            m.t_miss.with_label_values(&[&pid]).set(p.t_miss);
            let page = PAGE as i64;
            m.bytes
                .with_label_values(&[&pid, "alloc"])
                .set(p.alloc_pages as i64 * page);
            m.bytes
                .with_label_values(&[&pid, "fast"])
                .set(p.fast_pages as i64 * page);
            m.bytes
                .with_label_values(&[&pid, "slow"])
                .set(p.slow_pages as i64 * page);
            m.infeasible
                .with_label_values(&[&pid])
                .set(p.infeasible as i64);
        }
        m.free_bytes.set((out.free_pages * PAGE as u64) as i64);
        m.migrations.inc_by(applied.demoted + applied.promoted);
        m.faults.reset();
        let regions = shared.node.regions();
        m.regions.set(regions.len() as i64);
        for (pid, _, _, mgr) in regions {
            let s = mgr.stats();
            let pid = pid.to_string();
            for (kind, v) in [
                ("slow", s.slow_faults),
                ("zero", s.zero_faults),
                ("sample", s.sample_hits),
                ("probation", s.probation_hits),
            ] {
                m.faults.with_label_values(&[&pid, kind]).add(v as i64);
            }
        }
        if m.regions.get() == 0 || shared.stop.load(Ordering::Acquire) {
            shared.pause.store(true, Ordering::Release);
        }
    });
}

/// Stops every process that lost a page: SIGKILL, the reason logged and kept.
pub(super) fn on_fatal(shared: &Arc<Shared>, applied: &EpochApplied) {
    for (pid, first_page, why) in &applied.fatal {
        let r = {
            let mut rs = lock(&shared.regions);
            rs.iter()
                .position(|r| r.pid == *pid && r.first_page == *first_page)
                .map(|k| rs.swap_remove(k))
        };
        // Only the proved process the region is a mapping of, through its pidfd: a
        // region already gone, or a process that exited (its pid perhaps reused) or
        // changed credentials, is not signalled.
        let Some(r) = r else {
            continue;
        };
        match r.proc_.signal(&shared.procfs, libc::SIGKILL) {
            Ok(()) => {
                tracing::error!(pid, reason = %why, "tiering: a page cannot come back; stopping the process");
                shared.metrics.stopped.inc();
                lock(&shared.stopped).push((*pid, why.clone()));
            }
            Err(e) => {
                tracing::warn!(pid, reason = %why, error = %e, "tiering: a region's page is lost; its process is not signalled");
            }
        }
        release(shared, &r, false);
    }
}
