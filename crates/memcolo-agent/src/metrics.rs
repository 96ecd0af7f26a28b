//! Prometheus metrics of the agent, exposed as text at `GET /metrics`.
//!
//! Every series is prefixed `memcolo_`; sizes are in bytes. Per-process series carry
//! `pid`, `class` and `name` labels and are rebuilt every poll, so an exited process
//! leaves no stale series behind.
//!
//! Notifications and reclaim reports are counted per class (`lc`, `be`, `elastic`),
//! never per process: a pid label would add series with every process that comes
//! and goes. Their rates are `rate()` of these counters; per-process rates and counts
//! are in `memcolo status` (`notifications_per_min`, `reclaim_bytes_per_s`).

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// All metrics of one agent.
pub struct Metrics {
    pub registry: Registry,
    /// `memcolo_node_memory_bytes{kind}`: total, used, working_set, file, anon, swap.
    pub node_memory_bytes: IntGaugeVec,
    /// `memcolo_threshold_bytes{threshold}`: low, high, top, adv_thr.
    pub threshold_bytes: IntGaugeVec,
    /// `memcolo_zone`: 0 green, 1 yellow, 2 red, 3 above top.
    pub zone: IntGauge,
    /// `memcolo_registered_processes{class}`.
    pub registered: IntGaugeVec,
    /// `memcolo_process_rss_bytes{pid,class,name}` (the process and its descendants).
    pub process_rss_bytes: IntGaugeVec,
    /// `memcolo_notifications_total{class,level,via}`: notifications sent, by the
    /// class of the process, level and channel (socket, signal).
    pub notifications: IntCounterVec,
    /// `memcolo_reclaimed_bytes_total{class}`: bytes processes reported reclaimed.
    pub reclaimed_bytes: IntCounterVec,
    /// `memcolo_reclaim_reports_total{class}`: `reclaimed` reports received.
    pub reclaim_reports: IntCounterVec,
    /// `memcolo_reclaim_unmatched_total{class}`: unmatched-reclaim episodes begun
    /// (rule R10: reported reclamation not matched by a fall of the RSS).
    pub reclaim_unmatched: IntCounterVec,
    /// `memcolo_reclaim_unmatched_processes{class}`: processes in such an episode now.
    pub reclaim_unmatched_processes: IntGaugeVec,
    /// `memcolo_file_cache_dropped_bytes_total`: BE page cache dropped (Hermes §3.3).
    pub file_cache_dropped_bytes: IntCounter,
    /// `memcolo_file_advice_total`: `posix_fadvise(DONTNEED)` calls.
    pub file_advice: IntCounter,
    /// `memcolo_file_advice_rounds_total{outcome}`: Hermes advice rounds handed to the
    /// advice worker (`handed_over`), skipped because the previous one still ran
    /// (`skipped_busy`), or that advised nothing because an LC process's files could
    /// not be listed (`aborted`).
    pub file_advice_rounds: IntCounterVec,
    /// `memcolo_kills_total`.
    pub kills: IntCounter,
    /// `memcolo_cgroup_memory_events_total{group,event}`: the kernel's limit and OOM
    /// events of the scope group (`scope`) and of each class's memory cgroups (`lc`,
    /// `be`, `elastic`) since the agent first saw them: `low`, `high`, `max`, `oom`,
    /// `oom_kill` of v2 `memory.events`; on v1 only `max` (`memory.failcnt`) and
    /// `oom_kill` (`memory.oom_control`). See `core/class_groups.rs`.
    pub cgroup_memory_events: IntCounterVec,
    /// `memcolo_be_memory_high_groups`: BE groups whose `memory.high` the red zone
    /// capped now (cgroup v2, `m3.be_memory_high`).
    pub be_memory_high_groups: IntGauge,
    /// `memcolo_pod_evictions_total{via}`: BE pods asked to leave the node in
    /// Kubernetes mode, through the Eviction API (`eviction_api`) or, with the API
    /// server unreachable above top, by killing their processes (`sigkill`).
    pub pod_evictions: IntCounterVec,
    /// `memcolo_kubernetes_api_reachable`: 1 while the API server's last answer came,
    /// 0 after a request got none (Kubernetes mode only).
    pub kubernetes_api_reachable: IntGauge,
    /// `memcolo_polls_total{trigger}`: tick or event.
    pub polls: IntCounterVec,
    /// `memcolo_last_poll_timestamp_seconds`: when the main loop last polled, Unix time
    /// (what `GET /healthz` judges the agent alive by).
    pub last_poll_timestamp: IntGauge,
    /// `memcolo_pressure_events_total{source}`.
    pub pressure_events: IntCounterVec,
    /// `memcolo_errors_total{kind}`.
    pub errors: IntCounterVec,
    /// `memcolo_pid_namespace_walks_total`: walks of `/proc` to map pids named in
    /// containers' pid namespaces to the agent's (bounded per second).
    pub pid_namespace_walks: IntCounter,
    /// `memcolo_state_writes_total`: registry writes (`registry.json` replaced).
    pub state_writes: IntCounter,
    /// `memcolo_state_write_errors_total`: failed registry writes (retried at the
    /// next flush; the state stays in memory).
    pub state_write_errors: IntCounter,
    /// `memcolo_state_load_problems_total{kind}`: what the registry load found wrong
    /// (malformed, copied, bad_entry, duplicate_pid, bad_monitor).
    pub state_load_problems: IntCounterVec,
    /// `memcolo_reclaim_workers{kind}`: budget, desired, active (Hermit).
    pub reclaim_workers: IntGaugeVec,
    /// `memcolo_reclaim_marks_bytes{mark}`: headroom, low, high.
    pub reclaim_marks: IntGaugeVec,
    /// `memcolo_reclaim_rate_bytes_per_second{kind}`: alloc, worker, refault.
    pub reclaim_rate: GaugeVec,
    /// `memcolo_reclaim_page_turnaround_seconds`: mean time an evicted page stays out
    /// (Little's law); +Inf while nothing refaults.
    pub reclaim_turnaround: Gauge,
    /// `memcolo_reclaim_bytes_total`: bytes memcolo's workers reclaimed.
    pub reclaim_bytes: IntCounter,
    /// `memcolo_reclaim_refault_bytes_total`: anonymous refaults (swap-ins) in the scope.
    pub reclaim_refault_bytes: IntCounter,
    /// `memcolo_reclaim_cpu_seconds_total`: CPU time of the reclaim workers.
    pub reclaim_cpu_seconds: Gauge,
    /// `memcolo_reclaim_page_turnaround_sampled_seconds`: sampled time from a page's
    /// eviction by a reclaim batch to its refault (pages still out at the horizon are
    /// not in it: see the censored counter).
    pub reclaim_turnaround_sampled: Histogram,
    /// `memcolo_reclaim_page_turnaround_censored_total`: sampled pages still out at
    /// the horizon.
    pub reclaim_turnaround_censored: IntCounter,
    /// `memcolo_reclaim_page_turnaround_tracked_pages`: sampled evicted pages followed now.
    pub reclaim_turnaround_tracked: IntGauge,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let gv = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let cv = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let c = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let zone = IntGauge::new(
            "memcolo_zone",
            "M3 zone: 0 green, 1 yellow, 2 red, 3 above top",
        )
        .expect("valid metric");
        registry
            .register(Box::new(zone.clone()))
            .expect("unique metric");
        Metrics {
            node_memory_bytes: gv(
                "memcolo_node_memory_bytes",
                "Node (scope) memory by kind: total, used (page cache included), working_set, file, anon, swap",
                &["kind"],
            ),
            threshold_bytes: gv(
                "memcolo_threshold_bytes",
                "M3 thresholds (low, high, top) and Hermes adv_thr, in bytes",
                &["threshold"],
            ),
            zone,
            registered: gv("memcolo_registered_processes", "Registered processes by class", &["class"]),
            process_rss_bytes: gv(
                "memcolo_process_rss_bytes",
                "RSS of a registered process and its descendants",
                &["pid", "class", "name"],
            ),
            notifications: cv(
                "memcolo_notifications_total",
                "Memory pressure notifications sent, by class of the process, level and channel (socket, signal)",
                &["class", "level", "via"],
            ),
            reclaimed_bytes: cv(
                "memcolo_reclaimed_bytes_total",
                "Bytes processes reported reclaimed, by class",
                &["class"],
            ),
            reclaim_reports: cv(
                "memcolo_reclaim_reports_total",
                "Reclaim reports (reclaimed messages) received, by class",
                &["class"],
            ),
            reclaim_unmatched: cv(
                "memcolo_reclaim_unmatched_total",
                "Episodes of reported reclamation not matched by a fall of the process's RSS (>= 64 MiB reported in 60 s, RSS fell by less than a quarter of it), by class",
                &["class"],
            ),
            reclaim_unmatched_processes: gv(
                "memcolo_reclaim_unmatched_processes",
                "Processes whose reported reclamation is not matched by a fall of their RSS now, by class",
                &["class"],
            ),
            file_cache_dropped_bytes: c(
                "memcolo_file_cache_dropped_bytes_total",
                "BE page cache dropped with posix_fadvise(DONTNEED)",
            ),
            file_advice: c("memcolo_file_advice_total", "posix_fadvise(DONTNEED) calls on BE files"),
            file_advice_rounds: cv(
                "memcolo_file_advice_rounds_total",
                "Hermes advice rounds by outcome: handed_over, skipped_busy, aborted",
                &["outcome"],
            ),
            kills: c("memcolo_kills_total", "BE processes killed above the top of memory"),
            cgroup_memory_events: cv(
                "memcolo_cgroup_memory_events_total",
                "Memory cgroup events (memory.events: low, high, max, oom, oom_kill; v1: max from memory.failcnt, oom_kill) of the scope group and of each class's groups since the agent first saw them",
                &["group", "event"],
            ),
            be_memory_high_groups: {
                let g = IntGauge::new(
                    "memcolo_be_memory_high_groups",
                    "BE memory cgroups whose memory.high the red zone capped now (cgroup v2)",
                )
                .expect("valid metric");
                registry.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            pod_evictions: cv(
                "memcolo_pod_evictions_total",
                "BE pods asked to leave the node (Kubernetes mode), via eviction_api or sigkill",
                &["via"],
            ),
            kubernetes_api_reachable: {
                let g = IntGauge::new(
                    "memcolo_kubernetes_api_reachable",
                    "1 while the Kubernetes API server answers, 0 after a request got no answer",
                )
                .expect("valid metric");
                registry.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            polls: cv("memcolo_polls_total", "Sense-decide-act rounds by trigger", &["trigger"]),
            last_poll_timestamp: {
                let g = IntGauge::new(
                    "memcolo_last_poll_timestamp_seconds",
                    "When the main loop last polled, Unix time in seconds",
                )
                .expect("valid metric");
                registry.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            pressure_events: cv(
                "memcolo_pressure_events_total",
                "Kernel memory pressure events received, by source",
                &["source"],
            ),
            errors: cv("memcolo_errors_total", "Errors by kind", &["kind"]),
            pid_namespace_walks: c(
                "memcolo_pid_namespace_walks_total",
                "Walks of the process table to map pids named in containers' pid namespaces to the agent's",
            ),
            state_writes: c("memcolo_state_writes_total", "Registry writes (registry.json replaced)"),
            state_write_errors: c(
                "memcolo_state_write_errors_total",
                "Failed registry writes, retried at the next flush",
            ),
            state_load_problems: cv(
                "memcolo_state_load_problems_total",
                "Problems found loading the registry: malformed, copied, bad_entry, duplicate_pid, bad_monitor",
                &["kind"],
            ),
            reclaim_workers: gv(
                "memcolo_reclaim_workers",
                "Asynchronous reclaim workers: budget (CPU cap), desired (scheduler), active",
                &["kind"],
            ),
            reclaim_marks: gv(
                "memcolo_reclaim_marks_bytes",
                "Free headroom of the scope and the reclaim scheduler's low and high marks",
                &["mark"],
            ),
            reclaim_rate: {
                let g = GaugeVec::new(
                    Opts::new(
                        "memcolo_reclaim_rate_bytes_per_second",
                        "Allocation rate of the scope, one worker's reclaim throughput, refault rate",
                    ),
                    &["kind"],
                )
                .expect("valid metric");
                registry.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            reclaim_turnaround: {
                let g = Gauge::new(
                    "memcolo_reclaim_page_turnaround_seconds",
                    "Mean time an evicted page stays out before it refaults (Little's law); +Inf while nothing refaults",
                )
                .expect("valid metric");
                registry.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            reclaim_bytes: c("memcolo_reclaim_bytes_total", "Bytes reclaimed by memcolo's reclaim workers"),
            reclaim_refault_bytes: c(
                "memcolo_reclaim_refault_bytes_total",
                "Anonymous pages refaulted (swapped in) in the scope, bytes",
            ),
            reclaim_cpu_seconds: {
                let g = Gauge::new(
                    "memcolo_reclaim_cpu_seconds_total",
                    "CPU time spent by the reclaim workers",
                )
                .expect("valid metric");
                registry.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            reclaim_turnaround_sampled: {
                let h = Histogram::with_opts(
                    HistogramOpts::new(
                        "memcolo_reclaim_page_turnaround_sampled_seconds",
                        "Sampled time from a page's eviction by a reclaim batch to its refault",
                    )
                    .buckets(vec![
                        0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                    ]),
                )
                .expect("valid metric");
                registry.register(Box::new(h.clone())).expect("unique metric");
                h
            },
            reclaim_turnaround_censored: c(
                "memcolo_reclaim_page_turnaround_censored_total",
                "Sampled evicted pages still out at the horizon (turnaround longer than it)",
            ),
            reclaim_turnaround_tracked: {
                let g = IntGauge::new(
                    "memcolo_reclaim_page_turnaround_tracked_pages",
                    "Sampled evicted pages followed until they refault",
                )
                .expect("valid metric");
                registry.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            registry,
        }
    }

    /// Bytes processes of every class reported reclaimed
    /// (`memcolo_reclaimed_bytes_total` summed over its classes).
    pub fn reported_reclaimed_bytes(&self) -> u64 {
        ["lc", "be", "elastic"]
            .iter()
            .map(|c| self.reclaimed_bytes.with_label_values(&[c]).get())
            .sum()
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding of gathered metrics");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_contains_series_with_labels() {
        let m = Metrics::new();
        m.node_memory_bytes.with_label_values(&["used"]).set(123);
        m.notifications
            .with_label_values(&["elastic", "high", "socket"])
            .inc();
        m.kills.inc();
        m.pod_evictions.with_label_values(&["eviction_api"]).inc();
        m.kubernetes_api_reachable.set(1);
        let t = m.render();
        assert!(
            t.contains("memcolo_node_memory_bytes{kind=\"used\"} 123"),
            "{t}"
        );
        assert!(
            t.contains(
                "memcolo_notifications_total{class=\"elastic\",level=\"high\",via=\"socket\"} 1"
            ),
            "{t}"
        );
        assert!(t.contains("memcolo_kills_total 1"), "{t}");
        assert!(
            t.contains("memcolo_pod_evictions_total{via=\"eviction_api\"} 1"),
            "{t}"
        );
        assert!(t.contains("memcolo_kubernetes_api_reachable 1"), "{t}");
    }
}
