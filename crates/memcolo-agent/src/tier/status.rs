//! What the tiering service shows: `tier_status` (`memcolo tier status`) and the
//! `memcolo_tier_*` metrics, per process and for the node.

use super::{lock, Shared};
use crate::metrics::Metrics;
use memcolo_tier::region::PAGE;
use prometheus::{IntCounter, IntGauge, IntGaugeVec, Opts};
use std::sync::atomic::Ordering;

pub(super) struct Metricset {
    pub(super) a_miss: prometheus::GaugeVec,
    pub(super) t_miss: prometheus::GaugeVec,
    pub(super) bytes: IntGaugeVec,
    pub(super) infeasible: IntGaugeVec,
    pub(super) faults: IntGaugeVec,
    pub(super) free_bytes: IntGauge,
    pub(super) regions: IntGauge,
    pub(super) migrations: IntCounter,
    pub(super) stopped: IntCounter,
}

impl Metricset {
    pub(super) fn new(m: &Metrics) -> Self {
        let r = &m.registry;
        let gv = |name: &str, help: &str, labels: &[&str]| {
            let g = prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("metric");
            let _ = r.register(Box::new(g.clone()));
            g
        };
        let igv = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("metric");
            let _ = r.register(Box::new(g.clone()));
            g
        };
        let free_bytes = IntGauge::new(
            "memcolo_tier_free_bytes",
            "fast memory held by no tiered process",
        )
        .expect("metric");
        let regions = IntGauge::new("memcolo_tier_regions", "tiered regions").expect("metric");
        let migrations = IntCounter::new(
            "memcolo_tier_migrations_total",
            "MaxMem policy migrations carried out (pages)",
        )
        .expect("metric");
        let stopped = IntCounter::new(
            "memcolo_tier_processes_stopped_total",
            "processes stopped because a page could not come back",
        )
        .expect("metric");
        for c in [&free_bytes, &regions] {
            let _ = r.register(Box::new(c.clone()));
        }
        for c in [&migrations, &stopped] {
            let _ = r.register(Box::new(c.clone()));
        }
        Metricset {
            a_miss: gv(
                "memcolo_tier_a_miss",
                "measured fast-memory miss ratio (EWMA, MaxMem §3.1)",
                &["pid"],
            ),
            t_miss: gv(
                "memcolo_tier_t_miss",
                "target fast-memory miss ratio",
                &["pid"],
            ),
            bytes: igv(
                "memcolo_tier_bytes",
                "tiered memory of a process by kind: alloc (fast allotted), fast, slow",
                &["pid", "kind"],
            ),
            infeasible: igv(
                "memcolo_tier_infeasible",
                "1 if the target cannot be met (first come, first served)",
                &["pid"],
            ),
            faults: igv(
                "memcolo_tier_faults",
                "faults since the region arrived, by kind: slow, zero, sample, probation",
                &["pid", "kind"],
            ),
            free_bytes,
            regions,
            migrations,
            stopped,
        }
    }
}

pub(super) fn status_json(shared: &Shared) -> serde_json::Value {
    let policy = shared.node.lock_policy();
    let statuses = policy.statuses();
    let free = policy.free_pages();
    drop(policy);
    let regions = lock(&shared.regions);
    let managers = shared.node.regions();
    let procs: Vec<serde_json::Value> = statuses
        .iter()
        .map(|p| {
            let rs: Vec<serde_json::Value> = regions
                .iter()
                .filter(|r| r.pid == p.pid)
                .map(|r| {
                    let st = managers
                        .iter()
                        .find(|(pid, first, _, _)| *pid == r.pid && *first == r.first_page)
                        .map(|(_, _, _, m)| m.stats())
                        .unwrap_or_default();
                    serde_json::json!({
                        "region": r.seq, "start": r.start, "length_bytes": r.length,
                        "resident_pages": st.resident_pages, "stored_pages": st.stored_pages,
                        "slow_faults": st.slow_faults, "zero_faults": st.zero_faults,
                        "sample_hits": st.sample_hits, "evictions": st.evictions,
                        "probation_pages": st.probation_pages,
                        "probation_hits": st.probation_hits,
                        "probation_evictions": st.probation_evictions,
                        "refault_samples": st.refault_samples,
                        "prefetches": st.prefetches, "freed_pages": st.freed_pages,
                        "adopted_pages": st.adopted_pages,
                        "recovered_stored_pages": st.recovered_stored_pages,
                        "durable": r.durable,
                        "slow_fault_ns": st.slow_fault_ns,
                        "fault_thread_wait_ns": st.fault_thread_wait_ns,
                        "fault_thread_cpu_ns": st.fault_thread_cpu_ns,
                        "slow_load_ns": st.slow_load_ns,
                        "slow_map_ns": st.slow_map_ns,
                        "slow_drop_ns": st.slow_drop_ns,
                        "evict_threads_cpu_ns": st.evict_threads_cpu_ns,
                        "evict_threads_wait_ns": st.evict_threads_wait_ns,
                        "placement_ns": st.placement_ns,
                        "placement_max_ns": st.placement_max_ns,
                        "latency_critical": st.latency_critical,
                    })
                })
                .collect();
            serde_json::json!({
                "pid": p.pid, "t_miss": p.t_miss, "a_miss": p.a_miss, "need": p.need,
                "infeasible": p.infeasible,
                "alloc_bytes": p.alloc_pages * PAGE as u64,
                "fast_bytes": p.fast_pages * PAGE as u64,
                "slow_bytes": p.slow_pages * PAGE as u64,
                "regions": rs,
            })
        })
        .collect();
    let stopped: Vec<serde_json::Value> = lock(&shared.stopped)
        .iter()
        .map(|(pid, why)| serde_json::json!({"pid": pid, "reason": why}))
        .collect();
    let st = shared.slow.stats();
    serde_json::json!({
        "epoch": shared.epoch.load(Ordering::Relaxed),
        "fast_capacity_bytes": shared.cfg.fast_bytes,
        "free_bytes": free * PAGE as u64,
        "slow": {"kind": shared.slow.name(), "pages": st.pages, "stored_bytes": st.stored_bytes},
        "processes": procs,
        "stopped": stopped,
    })
}
