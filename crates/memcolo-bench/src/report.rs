//! Raw results of the colocation benchmark: one record per run attempt, the SLO of
//! Hermes §5.3, and the writers of the CSV files and of the terminal table.
//!
//! Files written into the output directory (the report itself, `report.md` and its
//! plots, is made from them by `bench/colocation/report.py`):
//! - `runs.csv`: one row per run attempt ([`RunRecord`], columns in field order);
//! - `percentiles.csv`: per accepted run, the HDR percentile distribution of query
//!   latency (`level_pct,mode,rep,percentile,latency_us,count_le`), for CDF plots.

use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::error::{BenchError, Result};

/// One attempt of one (pressure level, mode, repeat) run. Latencies in µs from the
/// intended send time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunRecord {
    /// BE demand / node memory, percent (Hermes §5.1).
    pub level_pct: u32,
    /// The mode's name ([`crate::colocation::Mode::as_str`]).
    pub mode: String,
    /// What the mode stands for: baseline, peer, reference, ablation, memcolo.
    pub mode_kind: String,
    /// 1-based repeat of the (level, mode) cell, and attempt of that repeat.
    pub rep: u32,
    pub attempt: u32,
    /// Whether this attempt is the run's figure (the others were rejected).
    pub accepted: bool,
    /// Accepted although every attempt was disturbed (the least disturbed is kept).
    pub disturbed: bool,
    /// Why the attempt was rejected (empty when it was not).
    pub reject_reason: String,
    /// `ok`, or why the run failed.
    pub status: String,
    /// The node's memory (`memory.limit_in_bytes`).
    pub node_bytes: u64,
    /// BE file demand (streamed file region).
    pub be_file_bytes: u64,
    /// BE anonymous demand.
    pub be_anon_bytes: u64,
    /// The elastic cache's share of the BE demand.
    pub be_elastic_bytes: u64,
    /// Requests due in the measured phase.
    pub requests: u64,
    /// Answered without error.
    pub requests_ok: u64,
    /// Failed or timed out (their latency is counted).
    pub errors: u64,
    /// Not sent: too many outstanding.
    pub dropped: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
    /// The SLO (p90 of the 0 % kernel-alone run unless given), µs.
    pub slo_us: Option<u64>,
    /// Fraction of requests slower than the SLO.
    pub slo_violation_ratio: Option<f64>,
    /// Answered requests per second.
    pub throughput_rps: f64,
    /// Bytes the file streamer read per minute, MiB (measured phase).
    pub be_file_mib_per_min: f64,
    /// stress-ng vm bogo ops per minute (its whole run), if it finished normally.
    pub be_anon_ops_per_min: Option<f64>,
    /// Share of the streamer's reads served from the page cache in the measured
    /// phase: 1 − `read_bytes` / `rchar` (`/proc/PID/io`).
    pub be_file_hit_ratio: Option<f64>,
    /// CPU seconds the file streamer and the anonymous holder used in the measured
    /// phase: they share the BE CPUs, so one's progress is partly the other's CPU.
    pub be_file_cpu_s: f64,
    pub be_anon_cpu_s: f64,
    /// Mean node `memory.usage_in_bytes` / limit over the measured phase.
    pub node_util: f64,
    /// Peak node usage seen in the measured phase, bytes.
    pub node_usage_max_bytes: u64,
    /// Peak zram swap use in the measured phase, bytes.
    pub swap_used_max_bytes: u64,
    /// Major faults of the LC service (Redis or memcached) during the measured phase;
    /// the CSV column keeps its first name, `redis_major_faults`.
    pub redis_major_faults: u64,
    /// redis-server RSS at the end of the measured phase, bytes.
    pub redis_rss_bytes: u64,
    /// Kernel OOM kills in the node during the run (`memory.oom_control`).
    pub oom_kills: u64,
    /// Kills in the agent's event log (agent mode only).
    pub agent_kills: Option<u64>,
    /// 1-minute load average at the start of the measured phase (machine noise).
    pub loadavg_1m: f64,
    /// Share of CPU time stolen by the hypervisor during the measured phase, percent.
    pub steal_pct: f64,
    /// Share of CPU time the machine was busy (not idle/iowait) during the measured
    /// phase, percent: the benchmark's own processes plus anything else running.
    pub cpu_busy_pct: f64,
    /// Bytes the agent's reclaim workers reclaimed over the run (reclaim modes).
    pub reclaim_bytes: Option<u64>,
    /// CPU seconds the agent's reclaim workers spent over the run.
    pub reclaim_cpu_s: Option<f64>,
    /// Reclaim CPU seconds per GiB reclaimed.
    pub reclaim_cpu_s_per_gib: Option<f64>,
    /// The LC service (`redis`, `memcached`); the `redis_*` columns are its figures.
    pub lc_service: String,
    /// The streamer's and the holder's solo rates (alone on the BE CPUs, no memory
    /// pressure; `solo.csv`), MiB/min and bogo ops/min; empty for a job the run lacks.
    pub be_file_solo_mib_per_min: Option<f64>,
    pub be_anon_solo_ops_per_min: Option<f64>,
    /// Each job's rate / its solo rate, and their sum, the weighted speedup
    /// ([`crate::progress`]).
    pub be_file_progress: Option<f64>,
    pub be_anon_progress: Option<f64>,
    pub be_weighted_speedup: Option<f64>,
    /// Charges that found the node at its limit in the measured phase
    /// (`memory.failcnt`): reclaim on the charging task's thread, the LC service's
    /// included.
    pub node_limit_hits: Option<u64>,
    /// Time the LC service's main thread waited runnable for a CPU in the measured
    /// phase (`/proc/<pid>/schedstat`), ms.
    pub lc_run_delay_ms: Option<f64>,
    /// Share of the LC CPUs' time in the measured phase that other work took: their
    /// busy time less the LC service's and the bench's own (load generator) CPU, %.
    /// Work outside the bench lock shows here; the agent stays off the LC CPUs. A lower
    /// bound: the bench's own CPU is subtracted wherever it ran, and its load
    /// generator's threads also run on the BE CPUs at times (perf: 0.65 of 20 s).
    pub lc_cpus_foreign_pct: Option<f64>,
    /// Host steal on the LC CPUs in the measured phase, ms (`/proc/stat` `steal`).
    pub lc_cpus_steal_ms: Option<f64>,
    /// Seconds of the measured phase (by due time) with at least one steal tick on the
    /// LC CPUs, and seconds with requests.
    pub lc_steal_seconds: Option<u32>,
    pub lc_measured_seconds: Option<u32>,
    /// p99 latency of the requests due in the seconds without steal on the LC CPUs, µs,
    /// and their share of all requests. Beside `p99_us` (all requests, the verdict),
    /// never instead of it.
    pub p99_steal_free_us: Option<u64>,
    pub steal_free_request_share: Option<f64>,
    /// Host steal on the LC CPUs, percent of their time in the measured phase.
    pub lc_cpus_steal_pct: Option<f64>,
    /// Gets the elastic cache served per minute in the measured phase (0 if it was
    /// killed: an evicted job's work is lost).
    pub elastic_gets_per_min: Option<f64>,
    /// Peak of the elastic cache's mapped slabs, bytes.
    pub elastic_mapped_max_bytes: Option<u64>,
    /// LC service processes killed (by anyone: the kernel, the agent, a peer) during
    /// the run; must be 0.
    pub lc_kills: u64,
    /// BE jobs killed by the agent or a peer during the run.
    pub be_kills: u64,
    /// Whether libmemcolo was mapped in the LC service (`/proc/PID/maps`), in the
    /// modes that preload it.
    pub lc_libmemcolo: Option<bool>,
    /// Bytes libmemcolo handed out in the LC service after the preload (its
    /// published statistics, `used_bytes`), beside the service's own count
    /// (Redis `INFO memory` `used_memory`): allocations really go through libmemcolo
    /// when the first is about the second.
    pub lc_alloc_used_bytes: Option<u64>,
    pub lc_used_memory_bytes: Option<u64>,
    /// Limit writes of a peer (Senpai) and how many the kernel refused (v1 `EBUSY`).
    pub peer_limit_writes: Option<u64>,
    pub peer_limit_write_failures: Option<u64>,
    /// Memory stall (PSI `some`) of the LC and BE groups in the measured phase, ms.
    pub lc_psi_some_ms: Option<f64>,
    pub be_psi_some_ms: Option<f64>,
}

/// A run's record and its latency histogram (µs).
#[derive(Debug)]
pub struct RunOutcome {
    pub record: RunRecord,
    pub hist_us: Option<Histogram<u64>>,
}

impl RunOutcome {
    /// The record of an attempt that failed with `why`.
    pub fn failed(
        level: u32,
        mode: &str,
        rep: u32,
        attempt: u32,
        node_bytes: u64,
        why: &dyn std::fmt::Display,
    ) -> Self {
        RunOutcome {
            record: RunRecord {
                level_pct: level,
                mode: mode.into(),
                rep,
                attempt,
                status: format!("failed: {why}"),
                node_bytes,
                ..Default::default()
            },
            hist_us: None,
        }
    }
}

/// Fills the latency columns of `r` from `h`.
pub fn fill_latency(r: &mut RunRecord, h: &Histogram<u64>) {
    if h.is_empty() {
        return;
    }
    r.p50_us = h.value_at_quantile(0.50);
    r.p90_us = h.value_at_quantile(0.90);
    r.p99_us = h.value_at_quantile(0.99);
    r.p999_us = h.value_at_quantile(0.999);
    r.max_us = h.max();
    r.mean_us = h.mean();
}

/// Fraction of the recorded latencies above `slo_us` (Hermes §5.3's SLO violation).
/// Values share buckets at 3 significant digits; a bucket counts as violating when
/// its lowest equivalent value is above the SLO. 0 for an empty histogram.
pub fn slo_violation_ratio(h: &Histogram<u64>, slo_us: u64) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    let above: u64 = h
        .iter_recorded()
        .filter(|v| h.lowest_equivalent(v.value_iterated_to()) > slo_us)
        .map(|v| v.count_at_value())
        .sum();
    above as f64 / h.len() as f64
}

/// The SLO and where it came from: `given` if set, else the median over the
/// accepted, successful 0 % kernel-alone runs of their p90 (Hermes §5.3 takes the
/// p90 of the LC service alone; the median over repeats keeps one noisy run from
/// moving it), else the same over any mode's 0 % runs.
pub fn choose_slo(records: &[RunRecord], given: Option<u64>) -> Option<(u64, String)> {
    if let Some(s) = given {
        return Some((s, "given with --slo-us".into()));
    }
    let zero = |mode: Option<&str>| -> Vec<u64> {
        records
            .iter()
            .filter(|r| {
                r.level_pct == 0
                    && r.status == "ok"
                    && r.accepted
                    && (mode.is_none() || mode == Some(r.mode.as_str()))
            })
            .map(|r| r.p90_us)
            .collect()
    };
    let k = zero(Some("kernel"));
    if let Some(m) = median_u64(&k) {
        return Some((
            m,
            format!(
                "median p90 of the {} accepted 0 % kernel-alone runs",
                k.len()
            ),
        ));
    }
    let any = zero(None);
    median_u64(&any).map(|m| {
        (
            m,
            format!("median p90 of the {} accepted 0 % runs", any.len()),
        )
    })
}

/// The median of `v` (the lower middle value for an even count); `None` if empty.
pub fn median_u64(v: &[u64]) -> Option<u64> {
    let mut v = v.to_vec();
    v.sort_unstable();
    (!v.is_empty()).then(|| v[(v.len() - 1) / 2])
}

/// Sets `slo_us` and `slo_violation_ratio` of every outcome.
pub fn apply_slo(outcomes: &mut [RunOutcome], slo_us: u64) {
    for o in outcomes {
        o.record.slo_us = Some(slo_us);
        o.record.slo_violation_ratio = o.hist_us.as_ref().map(|h| slo_violation_ratio(h, slo_us));
    }
}

/// `runs.csv` content.
pub fn runs_csv(records: &[RunRecord]) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in records {
        w.serialize(r)
            .map_err(|e| BenchError::Invalid(format!("csv: {e}")))?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| BenchError::Invalid(format!("csv: {e}")))?;
    Ok(String::from_utf8(bytes).expect("csv of UTF-8 fields"))
}

/// `percentiles.csv` content: the HDR percentile distribution (5 ticks per half
/// distance) of each accepted run.
pub fn percentiles_csv(outcomes: &[RunOutcome]) -> String {
    let mut s = String::from("level_pct,mode,rep,percentile,latency_us,count_le\n");
    for o in outcomes.iter().filter(|o| o.record.accepted) {
        let Some(h) = &o.hist_us else { continue };
        if h.is_empty() {
            continue;
        }
        let mut cum = 0u64;
        for v in h.iter_quantiles(5) {
            cum += v.count_since_last_iteration();
            let _ = writeln!(
                s,
                "{},{},{},{:.6},{},{}",
                o.record.level_pct,
                o.record.mode,
                o.record.rep,
                v.percentile(),
                v.value_iterated_to(),
                cum
            );
        }
    }
    s
}

fn opt_f(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}"))
        .unwrap_or_else(|| "-".into())
}

/// The table printed on stdout and put in the report (Markdown pipe table).
pub fn table(records: &[RunRecord]) -> String {
    let mut s = String::new();
    s.push_str("| level | mode | rep | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | SLO viol. | req/s | BE file MiB/min | BE file hits | BE anon ops/min | node util | LC majflt | kills | status |\n");
    s.push_str(
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in records {
        let kills = r.oom_kills + r.be_kills + r.lc_kills;
        let status = if !r.accepted && r.status == "ok" {
            "rejected"
        } else {
            r.status.as_str()
        };
        let _ = writeln!(
            s,
            "| {}% | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} | {} | {} | {:.1}% | {} | {} | {} |",
            r.level_pct,
            r.mode,
            r.rep,
            r.p50_us,
            r.p90_us,
            r.p99_us,
            r.p999_us,
            r.max_us,
            r.slo_violation_ratio
                .map(|x| format!("{:.2}%", x * 100.0))
                .unwrap_or_else(|| "-".into()),
            r.throughput_rps,
            r.be_file_mib_per_min,
            r.be_file_hit_ratio
                .map(|x| format!("{:.0}%", x * 100.0))
                .unwrap_or_else(|| "-".into()),
            opt_f(r.be_anon_ops_per_min, 0),
            r.node_util * 100.0,
            r.redis_major_faults,
            kills,
            status,
        );
    }
    s
}

/// Writes `content` to `dir/name`.
pub fn write_file(dir: &Path, name: &str, content: &str) -> Result<()> {
    let p = dir.join(name);
    std::fs::write(&p, content).map_err(|e| BenchError::io(&p, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::new_histogram;

    fn hist(values: &[(u64, u64)]) -> Histogram<u64> {
        let mut h = new_histogram();
        for &(v, n) in values {
            h.record_n(v, n).unwrap();
        }
        h
    }

    #[test]
    fn violation_ratio_counts_strictly_slower() {
        let h = hist(&[(100, 90), (500, 10)]);
        assert_eq!(slo_violation_ratio(&h, 200), 0.1);
        assert_eq!(slo_violation_ratio(&h, 500), 0.0);
        assert_eq!(slo_violation_ratio(&h, 99), 1.0);
        assert_eq!(slo_violation_ratio(&new_histogram(), 10), 0.0);
        // Large values, in coarse buckets.
        let h = hist(&[(1_000, 3), (2_000_000, 1)]);
        assert_eq!(slo_violation_ratio(&h, 1_500), 0.25);
    }

    fn rec(level: u32, mode: &str, p90: u64, status: &str) -> RunRecord {
        RunRecord {
            level_pct: level,
            mode: mode.into(),
            p90_us: p90,
            status: status.into(),
            ..Default::default()
        }
    }

    #[test]
    fn slo_is_the_median_of_the_accepted_zero_percent_kernel_runs() {
        let acc = |mut r: RunRecord| {
            r.accepted = true;
            r
        };
        let rs = vec![
            acc(rec(0, "agent", 150, "ok")),
            acc(rec(0, "kernel", 120, "ok")),
            acc(rec(0, "kernel", 300, "ok")),
            acc(rec(0, "kernel", 100, "ok")),
            // Rejected and failed runs do not count.
            rec(0, "kernel", 5, "ok"),
            acc(rec(0, "kernel", 1, "failed: x")),
            acc(rec(100, "kernel", 900, "ok")),
        ];
        let (us, why) = choose_slo(&rs, None).unwrap();
        assert_eq!(us, 120);
        assert!(why.contains("3 accepted 0 % kernel-alone runs"), "{why}");
        assert_eq!(choose_slo(&rs, Some(77)).unwrap().0, 77);
        let rs = vec![
            acc(rec(0, "kernel", 120, "failed: x")),
            acc(rec(0, "agent", 150, "ok")),
        ];
        assert_eq!(choose_slo(&rs, None).unwrap().0, 150);
        assert_eq!(choose_slo(&[acc(rec(50, "kernel", 1, "ok"))], None), None);
        assert_eq!(median_u64(&[4, 1, 3, 2]), Some(2));
        assert_eq!(median_u64(&[]), None);
    }

    #[test]
    fn apply_slo_and_latency_columns() {
        let mut outs = vec![RunOutcome {
            record: rec(100, "kernel", 0, "ok"),
            hist_us: Some(hist(&[(100, 50), (1000, 50)])),
        }];
        let o = &mut outs[0];
        fill_latency(&mut o.record, o.hist_us.as_ref().unwrap());
        assert_eq!(outs[0].record.p50_us, 100);
        assert_eq!(outs[0].record.p90_us, 1000);
        assert_eq!(outs[0].record.max_us, 1000);
        apply_slo(&mut outs, 500);
        assert_eq!(outs[0].record.slo_violation_ratio, Some(0.5));
        assert_eq!(outs[0].record.slo_us, Some(500));
    }

    #[test]
    fn csv_and_table_render_every_attempt() {
        let mut a = rec(0, "kernel", 120, "ok");
        a.slo_violation_ratio = Some(0.1);
        a.accepted = true;
        a.rep = 1;
        let b = rec(150, "full", 900, "failed: redis-server exited");
        let c = rec(150, "full", 900, "ok");
        let rs = vec![a, b, c];
        let csv = runs_csv(&rs).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("level_pct,mode,mode_kind,rep,attempt,accepted,disturbed,reject_reason,status,node_bytes"), "{}", lines[0]);
        assert!(
            lines[1].starts_with("0,kernel,,1,0,true,false,,ok,"),
            "{}",
            lines[1]
        );
        assert!(lines[2].contains("failed: redis-server exited"));
        let t = table(&rs);
        assert!(t.contains("| 0% | kernel | 1 |"), "{t}");
        assert!(t.contains("10.00%"));
        assert!(
            t.contains("| rejected |"),
            "an ok attempt that was not accepted: {t}"
        );
    }

    #[test]
    fn percentile_dump_is_cumulative() {
        let mut r = rec(50, "agent", 0, "ok");
        r.accepted = true;
        r.rep = 2;
        let outs = vec![
            RunOutcome {
                record: r,
                hist_us: Some(hist(&[(100, 50), (200, 50)])),
            },
            // A rejected attempt is not dumped.
            RunOutcome {
                record: rec(50, "agent", 0, "ok"),
                hist_us: Some(hist(&[(7, 1)])),
            },
        ];
        let s = percentiles_csv(&outs);
        let rows: Vec<Vec<&str>> = s.lines().skip(1).map(|l| l.split(',').collect()).collect();
        assert!(!rows.is_empty());
        assert!(rows
            .iter()
            .all(|r| r[0] == "50" && r[1] == "agent" && r[2] == "2"));
        let last = rows.last().unwrap();
        assert_eq!(last[4], "200");
        assert_eq!(last[5], "100");
    }
}
