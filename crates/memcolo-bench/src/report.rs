//! Results of the colocation benchmark: one record per (level, mode) run, the SLO of
//! Hermes §5.3, and the writers of the CSV files, the Markdown report and the table.
//!
//! Files written into the output directory:
//! - `runs.csv`: one row per run ([`RunRecord`], columns in field order);
//! - `percentiles.csv`: per run, the HDR percentile distribution of query latency
//!   (`level_pct,mode,percentile,latency_us,count_le`), for CDF plots;
//! - `report.md`: the method, the parameters, the table and the plots.

use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::error::{BenchError, Result};

/// One (pressure level, mode) run. Latencies in µs from the intended send time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunRecord {
    /// BE demand / node memory, percent (Hermes §5.1).
    pub level_pct: u32,
    /// `kernel` (no agent) or `agent`.
    pub mode: String,
    /// `ok`, or why the run failed.
    pub status: String,
    /// The node's memory (`memory.limit_in_bytes`).
    pub node_bytes: u64,
    /// BE file demand (streamed file region).
    pub be_file_bytes: u64,
    /// BE anonymous demand.
    pub be_anon_bytes: u64,
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
}

/// A run's record and its latency histogram (µs).
#[derive(Debug)]
pub struct RunOutcome {
    pub record: RunRecord,
    pub hist_us: Option<Histogram<u64>>,
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

/// The SLO and where it came from: `given` if set, else the p90 of the successful
/// 0 % kernel-alone run (Hermes §5.3), else of any successful 0 % run.
pub fn choose_slo(records: &[RunRecord], given: Option<u64>) -> Option<(u64, String)> {
    if let Some(s) = given {
        return Some((s, "given with --slo-us".into()));
    }
    let zero = |mode: Option<&str>| {
        records.iter().find(|r| {
            r.level_pct == 0
                && r.status == "ok"
                && (mode.is_none() || mode == Some(r.mode.as_str()))
        })
    };
    if let Some(r) = zero(Some("kernel")) {
        return Some((r.p90_us, "p90 of the 0 % kernel-alone run".into()));
    }
    zero(None).map(|r| (r.p90_us, format!("p90 of the 0 % {} run", r.mode)))
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
/// distance) of each run.
pub fn percentiles_csv(outcomes: &[RunOutcome]) -> String {
    let mut s = String::from("level_pct,mode,percentile,latency_us,count_le\n");
    for o in outcomes {
        let Some(h) = &o.hist_us else { continue };
        if h.is_empty() {
            continue;
        }
        let mut cum = 0u64;
        for v in h.iter_quantiles(5) {
            cum += v.count_since_last_iteration();
            let _ = writeln!(
                s,
                "{},{},{:.6},{},{}",
                o.record.level_pct,
                o.record.mode,
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
    s.push_str("| level | mode | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | SLO viol. | req/s | BE file MiB/min | BE file hits | BE anon ops/min | node util | LC majflt | kills | status |\n");
    s.push_str("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for r in records {
        let kills = r.oom_kills + r.agent_kills.unwrap_or(0);
        let _ = writeln!(
            s,
            "| {}% | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.0} | {} | {} | {:.1}% | {} | {} | {} |",
            r.level_pct,
            r.mode,
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
            r.status,
        );
    }
    s
}

/// What the report says about the setup.
#[derive(Clone, Debug, Default)]
pub struct ReportContext {
    pub date: String,
    pub host: String,
    pub kernel: String,
    pub cpus: usize,
    pub mem_total_bytes: u64,
    pub command: String,
    pub parameters: Vec<(String, String)>,
    pub slo: Option<(u64, String)>,
    pub notes: Vec<String>,
    pub plots: Vec<String>,
}

/// `report.md` content.
pub fn markdown(ctx: &ReportContext, records: &[RunRecord]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Colocation: Redis (LC) beside batch jobs (BE), kernel alone vs memcolo agent\n"
    );
    let _ = writeln!(
        s,
        "{} on `{}`: Linux {}, {} CPUs, {:.1} GiB RAM.\n",
        ctx.date,
        ctx.host,
        ctx.kernel,
        ctx.cpus,
        ctx.mem_total_bytes as f64 / (1u64 << 30) as f64
    );
    let _ = writeln!(s, "Command: `{}`\n", ctx.command);
    s.push_str("## Method\n\n");
    s.push_str(
        "A scratch cgroup v1 memory group is the node (its `memory.limit_in_bytes` is the \
         node's memory), with children `lc/` (redis-server) and `be/` (batch jobs); zram \
         is the swap. Memory pressure = BE memory demand / node memory (Hermes §5.1); the \
         demand is split between a file streamer (fio reading a data file sequentially \
         through the page cache in a loop) and an anonymous-memory holder (stress-ng \
         --vm --vm-keep, writing its whole mapping over and over). Each run starts from \
         fresh groups, a fresh Redis preloaded with the dataset and no page cache \
         charged to the node. An open-loop generator sends GET/SET requests at a fixed \
         rate; latency is measured from each request's intended send time (no \
         coordinated omission). After a warm-up, the measured phase records every \
         request. SLO = p90 of the 0 % kernel-alone run; SLO violation = fraction of \
         requests slower than the SLO (Hermes §5.3).\n\n",
    );
    s.push_str("## Parameters\n\n| parameter | value |\n|---|---|\n");
    for (k, v) in &ctx.parameters {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    s.push('\n');
    match &ctx.slo {
        Some((us, src)) => {
            let _ = writeln!(s, "SLO: **{us} µs** ({src}).\n");
        }
        None => s.push_str("SLO: none (no successful 0 % run and no --slo-us).\n\n"),
    }
    s.push_str("## Results\n\n");
    s.push_str(&table(records));
    s.push_str(
        "\nkills = kernel OOM kills in the node + kills in the agent's event log. \
         BE anon ops = stress-ng vm bogo ops. Machine noise per run (1-min load average, \
         CPU busy %, steal %, share of the LC CPUs other work took, LC-CPU steal ms in \
         how many of the measured seconds, p99 over the seconds without LC-CPU steal): ",
    );
    let loads: Vec<String> = records
        .iter()
        .map(|r| {
            format!(
                "{}%/{} {:.2}, {:.0}%, {:.1}%, {}, {}",
                r.level_pct,
                r.mode,
                r.loadavg_1m,
                r.cpu_busy_pct,
                r.steal_pct,
                r.lc_cpus_foreign_pct
                    .map_or("-".into(), |f| format!("{f:.0}% foreign")),
                match (
                    r.lc_cpus_steal_ms,
                    r.lc_steal_seconds,
                    r.lc_measured_seconds
                ) {
                    (Some(ms), Some(n), Some(of)) => format!(
                        "steal {ms:.0} ms in {n}/{of} s, steal-free p99 {} µs",
                        r.p99_steal_free_us.map_or("-".into(), |p| p.to_string())
                    ),
                    _ => "steal -".into(),
                }
            )
        })
        .collect();
    s.push_str(&loads.join("; "));
    s.push_str(".\n\n");
    s.push_str(&be_progress_section(records));
    if !ctx.notes.is_empty() {
        s.push_str("## Notes\n\n");
        for n in &ctx.notes {
            let _ = writeln!(s, "- {n}");
        }
        s.push('\n');
    }
    if !ctx.plots.is_empty() {
        s.push_str("## Plots\n\n");
        for p in &ctx.plots {
            let _ = writeln!(s, "![{p}]({p})\n");
        }
    }
    s.push_str("Raw data: `runs.csv` (one row per run), `percentiles.csv` (latency distribution per run), `solo.csv` (BE jobs alone, the progress denominators), `logs/`.\n");
    s
}

/// The "BE progress" section of the report: each BE job's rate over its solo rate
/// and the weighted speedup ([`crate::progress`]), per mode against the kernel alone,
/// and a plain list of the figures below 90 % of the kernel alone's. Empty when no
/// run has a progress figure.
pub fn be_progress_section(records: &[RunRecord]) -> String {
    use crate::progress::{below_kernel, progress_rows, progress_table};
    let rows = progress_rows(records);
    if !rows
        .iter()
        .any(|r| r.file.is_some() || r.anon.is_some() || r.ws.is_some())
    {
        return String::new();
    }
    let mut s = String::from("## BE progress\n\n");
    s.push_str(
        "Per BE job: its rate in the run / its rate alone on the same CPUs without memory \
         pressure (`solo.csv`; streamer MiB/min read in the measured phase, holder \
         stress-ng bogo ops/min over its run). Weighted speedup = the sum over the run's \
         BE jobs (Snavely & Tullsen). Medians over the runs of each (level, mode); \
         \"vs kernel\" = the median over the kernel alone's at the same level.\n\n",
    );
    s.push_str(&progress_table(&rows));
    let below = below_kernel(&rows, 0.9);
    if below.is_empty() {
        s.push_str("\nNo figure is below 90 % of the kernel alone's.\n\n");
    } else {
        s.push_str("\nBelow 90 % of the kernel alone's:\n\n");
        for b in below {
            let _ = writeln!(s, "- {b}");
        }
        s.push('\n');
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
    fn slo_from_zero_kernel_run() {
        let rs = vec![
            rec(0, "agent", 150, "ok"),
            rec(0, "kernel", 120, "ok"),
            rec(100, "kernel", 900, "ok"),
        ];
        assert_eq!(choose_slo(&rs, None).unwrap().0, 120);
        assert_eq!(choose_slo(&rs, Some(77)).unwrap().0, 77);
        let rs = vec![
            rec(0, "kernel", 120, "failed: x"),
            rec(0, "agent", 150, "ok"),
        ];
        assert_eq!(choose_slo(&rs, None).unwrap().0, 150);
        assert_eq!(choose_slo(&[rec(50, "kernel", 1, "ok")], None), None);
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
    fn csv_and_report_render_every_run() {
        let mut a = rec(0, "kernel", 120, "ok");
        a.slo_violation_ratio = Some(0.1);
        let b = rec(150, "agent", 900, "failed: redis-server exited");
        let rs = vec![a, b];
        let csv = runs_csv(&rs).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("level_pct,mode,status,node_bytes"));
        assert!(lines[1].starts_with("0,kernel,ok,"));
        assert!(lines[2].contains("failed: redis-server exited"));
        let t = table(&rs);
        assert!(t.contains("| 0% | kernel |"));
        assert!(t.contains("10.00%"));
        let md = markdown(
            &ReportContext {
                slo: Some((120, "p90 of the 0 % kernel-alone run".into())),
                plots: vec!["latency_p90.png".into()],
                ..Default::default()
            },
            &rs,
        );
        assert!(md.contains("SLO: **120 µs**"));
        assert!(md.contains("![latency_p90.png](latency_p90.png)"));
        assert!(md.contains("| 150% | agent |"));
        // No progress figures, no progress section.
        assert!(!md.contains("## BE progress"));
    }

    #[test]
    fn report_names_progress_figures_below_the_kernel() {
        let mut k = rec(100, "kernel", 900, "ok");
        k.be_file_progress = Some(0.6);
        k.be_anon_progress = Some(0.4);
        k.be_weighted_speedup = Some(1.0);
        let mut m = rec(100, "reclaim", 300, "ok");
        m.be_file_progress = Some(0.3);
        m.be_anon_progress = Some(0.7);
        m.be_weighted_speedup = Some(1.0);
        let md = markdown(&ReportContext::default(), &[k.clone(), m]);
        assert!(md.contains("## BE progress"), "{md}");
        assert!(
            md.contains("| 100% | reclaim | 1 | 30 % | 70 % | 1.00 | 50 % | 175 % | 100 % |"),
            "{md}"
        );
        assert!(
            md.contains("- 100 % reclaim: file streamer 50 % of kernel-alone"),
            "{md}"
        );
        let md = markdown(&ReportContext::default(), &[k]);
        assert!(md.contains("No figure is below 90 %"), "{md}");
    }

    #[test]
    fn percentile_dump_is_cumulative() {
        let outs = vec![RunOutcome {
            record: rec(50, "agent", 0, "ok"),
            hist_us: Some(hist(&[(100, 50), (200, 50)])),
        }];
        let s = percentiles_csv(&outs);
        let rows: Vec<Vec<&str>> = s.lines().skip(1).map(|l| l.split(',').collect()).collect();
        assert!(!rows.is_empty());
        assert!(rows.iter().all(|r| r[0] == "50" && r[1] == "agent"));
        let last = rows.last().unwrap();
        assert_eq!(last[3], "200");
        assert_eq!(last[4], "100");
    }
}
