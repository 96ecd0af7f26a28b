//! `memcolo sim --validate`: the colocation scenario run at the settings of a recorded
//! `memcolo bench colocation` sweep on this machine, set beside its measured figures,
//! with the error per metric and a pass/fail against a stated bound (issue 26, "Done
//! when": within 25 %).
//!
//! A reference ([`Reference`]) is the sweep's per-cell medians (level × mode × metric,
//! with the min–max over its repeats) and the settings the simulator must copy: node
//! memory, warm-up and measured seconds, the SLO, the LC service's resident memory. It
//! is read from a bench run's directory (`summary.csv`, `meta.json`, `runs.csv`, as
//! `bench/colocation` writes them) or from a JSON file in [`Reference`]'s own form;
//! [`Reference::builtin`] is the Redis quick sweep of 2026-11-28
//! (`bench/colocation/RESULTS.md`, section `redis-quick`), kept in
//! `crates/memcolo-sim/data/`.
//!
//! Also compared, when the reference carries them ([`Reference::other`], the built-in
//! one does): M3's `JJJ-0` mean speedup and MaxMem's timeline epochs
//! ([`OTHER_METRICS`]), one cell each.
//!
//! Compared: [`METRICS`] for the sim's `kernel` against the bench's `kernel`, and the
//! sim's `memcolo` (M3, Hermes, Hermit) against the bench's `agent` mode when the sweep
//! ran it, else `full` (the agent and libmemcolo, which the sim does not model). The
//! simulated figure of a cell is the median over `seeds` runs. A cell's error is
//! `(sim − measured) / measured`; a metric's error is the mean of `|error|` over its
//! cells, and the validation passes when every metric's error is at most the bound.

use crate::calib::Calibration;
use crate::node::{Mode, LC_SAMPLES_PER_STEP};
use crate::scenario::{self, Common};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

/// The metrics compared, as the bench names them in `summary.csv`.
pub const METRICS: [&str; 5] = [
    "p50_us",
    "p99_us",
    "p999_us",
    "slo_violation_pct",
    "node_util_pct",
];

/// The bench modes a reference keeps: those the sim's modes are set beside.
pub const COMPARED_MODES: [&str; 3] = ["kernel", "agent", "full"];

/// The bound of `--validate`, % error per metric (issue 26: within 25 %).
pub const DEFAULT_BOUND_PCT: f64 = 25.0;

/// One measured cell: the median and min–max over the repeats of a (level, mode) for
/// one metric.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredCell {
    /// BE memory demand, % of node memory.
    pub level: u32,
    /// The bench's mode (`kernel`, `agent`, `full`, ...).
    pub mode: String,
    /// One of [`METRICS`].
    pub metric: String,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// A recorded bench run: the settings to copy and the figures to meet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// Where the figures come from (bench, date, commit, host).
    pub source: String,
    /// Node memory (the bench's node cgroup limit), bytes.
    pub node_bytes: u64,
    /// Warm-up before the measured phase, seconds.
    pub warmup_s: f64,
    /// Measured phase, seconds.
    pub measured_s: f64,
    /// The LC latency SLO of the sweep, µs.
    pub slo_us: f64,
    /// Resident memory of the LC service at level 0, bytes (its working set in the sim).
    pub lc_rss_bytes: u64,
    /// LC request rate, requests/s.
    pub rate: f64,
    /// The file streamer's read rate, bytes/s: the median over the accepted runs with
    /// batch jobs of the bench's `be_file_mib_per_min` (the streamer shares the BE
    /// vCPU with the anonymous holder and the elastic cache's workers and read almost
    /// nothing in the 2026-11-28 sweep: 0.04 MiB/min).
    pub be_file_read_bytes_per_s: f64,
    pub cells: Vec<MeasuredCell>,
    /// Single figures of the other benches the sim has a scenario for
    /// ([`OTHER_METRICS`]); none in a reference read from a bench run directory.
    #[serde(default)]
    pub other: Vec<OtherFigure>,
}

/// A measured figure of another bench, compared with one scenario run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtherFigure {
    /// One of [`OTHER_METRICS`].
    pub metric: String,
    pub measured: f64,
    /// The RESULTS.md and section it comes from.
    pub source: String,
}

/// The other benches' figures `--validate` knows how to simulate:
/// - `m3_jjj0_mean_speedup`: `memcolo sim m3-elastic --node-mem 2G --swap 0 --stagger
///   0`, the mean per-job speedup over the static equal partition (`bench/m3`'s
///   `JJJ-0` against its nearest equal partition);
/// - `maxmem_p6_arrival_epochs` and `maxmem_p1_target_epochs`: `memcolo sim
///   maxmem-timeline --node-mem 144M`, epochs to `a_miss <= t_miss` of p6 after its
///   start and of p1 after its target change (`bench/tiering`'s `timeline`).
pub const OTHER_METRICS: [&str; 3] = [
    "m3_jjj0_mean_speedup",
    "maxmem_p6_arrival_epochs",
    "maxmem_p1_target_epochs",
];

const BUILTIN: &str = include_str!("../data/colocation-redis-quick-2026-11-28.json");

fn parse_bytes_text(s: &str) -> Option<u64> {
    // "2.00 GiB", "512.00 MiB"
    let mut it = s.split_whitespace();
    let v: f64 = it.next()?.parse().ok()?;
    let mul = match it.next()? {
        "KiB" => 1u64 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    (v.is_finite() && v > 0.0).then_some((v * mul as f64) as u64)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl Reference {
    /// The Redis quick sweep of 2026-11-28 (`bench/colocation/RESULTS.md`).
    pub fn builtin() -> Reference {
        serde_json::from_str(BUILTIN).expect("the built-in reference parses")
    }

    /// Reads a reference: a bench run's directory, or a JSON file of this form.
    pub fn load(path: &Path) -> anyhow::Result<Reference> {
        let r = if path.is_dir() {
            Reference::from_bench_dir(path)?
        } else {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
        };
        r.check()?;
        Ok(r)
    }

    /// Reads `summary.csv`, `meta.json` and `runs.csv` of a `memcolo bench colocation`
    /// run directory.
    pub fn from_bench_dir(dir: &Path) -> anyhow::Result<Reference> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .with_context(|| format!("reading {}", dir.join(name).display()))
        };
        let meta: serde_json::Value =
            serde_json::from_str(&read("meta.json")?).context("parsing meta.json")?;
        let param = |name: &str| -> Option<String> {
            meta["parameters"].as_array()?.iter().find_map(|p| {
                (p.get(0)?.as_str()? == name).then(|| p.get(1)?.as_str().map(String::from))?
            })
        };
        let node_bytes = param("node memory")
            .as_deref()
            .and_then(parse_bytes_text)
            .context("meta.json: no parseable `node memory` parameter")?;
        let (warmup_s, measured_s) = param("warm-up / measured")
            .and_then(|s| {
                let (a, b) = s.split_once('/')?;
                let num = |t: &str| t.trim().trim_end_matches('s').trim().parse::<f64>().ok();
                Some((num(a)?, num(b)?))
            })
            .context("meta.json: no parseable `warm-up / measured` parameter")?;
        let rate = param("rate")
            .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
            .context("meta.json: no parseable `rate` parameter")?;
        let slo_us = meta["slo_us"].as_f64().context("meta.json: no `slo_us`")?;
        let runs = read("runs.csv")?;
        let mut csv = csv::Reader::from_reader(runs.as_bytes());
        let head = csv.headers()?.clone();
        let col = |n: &str| head.iter().position(|h| h == n);
        let (lv, md, acc, rss, fr) = (
            col("level_pct").context("runs.csv: no level_pct")?,
            col("mode").context("runs.csv: no mode")?,
            col("accepted").context("runs.csv: no accepted")?,
            col("redis_rss_bytes").context("runs.csv: no redis_rss_bytes")?,
            col("be_file_mib_per_min").context("runs.csv: no be_file_mib_per_min")?,
        );
        let mut rss_at_0: Vec<f64> = Vec::new();
        let mut file_rate: Vec<f64> = Vec::new();
        for rec in csv.records() {
            let rec = rec?;
            if rec.get(lv) != Some("0") && rec.get(acc) == Some("true") {
                if let Some(v) = rec.get(fr).and_then(|v| v.parse::<f64>().ok()) {
                    file_rate.push(v * (1u64 << 20) as f64 / 60.0);
                }
            }
            if rec.get(lv) == Some("0")
                && rec.get(md) == Some("kernel")
                && rec.get(acc) == Some("true")
            {
                if let Some(v) = rec.get(rss).and_then(|v| v.parse::<f64>().ok()) {
                    rss_at_0.push(v);
                }
            }
        }
        anyhow::ensure!(
            !rss_at_0.is_empty(),
            "runs.csv: no accepted 0 % kernel run with the LC service's RSS"
        );
        let lc_rss_bytes = median(&mut rss_at_0) as u64;
        let summary = read("summary.csv")?;
        let mut csv = csv::Reader::from_reader(summary.as_bytes());
        let mut cells = Vec::new();
        for rec in csv.deserialize::<(u32, String, String, f64, f64, f64, u32)>() {
            let (level, mode, metric, median, min, max, _n) = rec.context("summary.csv")?;
            if METRICS.contains(&metric.as_str()) && COMPARED_MODES.contains(&mode.as_str()) {
                cells.push(MeasuredCell {
                    level,
                    mode,
                    metric,
                    median,
                    min,
                    max,
                });
            }
        }
        let text = |k: &str| meta[k].as_str().unwrap_or("?").to_string();
        let r = Reference {
            source: format!(
                "memcolo bench colocation, {} on {} ({}), commit {}: `{}`",
                text("lc_service"),
                text("host"),
                text("date"),
                text("commit"),
                text("command")
            ),
            node_bytes,
            warmup_s,
            measured_s,
            slo_us,
            lc_rss_bytes,
            rate,
            be_file_read_bytes_per_s: if file_rate.is_empty() {
                0.0
            } else {
                median(&mut file_rate)
            },
            cells,
            other: Vec::new(),
        };
        r.check()?;
        Ok(r)
    }

    /// Checks the figures are in range (a reference file is input like any other).
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.node_bytes >= 1 << 20 && self.node_bytes <= 1 << 50,
            "reference node_bytes out of range"
        );
        for (n, v, hi) in [
            ("warmup_s", self.warmup_s, 3600.0),
            ("measured_s", self.measured_s, 3600.0),
            ("slo_us", self.slo_us, 1e9),
            ("rate", self.rate, 1e7),
            (
                "be_file_read_bytes_per_s",
                self.be_file_read_bytes_per_s,
                1e15,
            ),
        ] {
            anyhow::ensure!(
                v.is_finite() && v >= 0.0 && v <= hi,
                "reference {n} = {v}: must be in 0..={hi}"
            );
        }
        anyhow::ensure!(
            self.measured_s > 0.0,
            "reference measured_s must be positive"
        );
        anyhow::ensure!(
            self.lc_rss_bytes <= self.node_bytes,
            "reference lc_rss_bytes above node_bytes"
        );
        for o in &self.other {
            anyhow::ensure!(
                OTHER_METRICS.contains(&o.metric.as_str()),
                "reference figure `{}` unknown (known: {})",
                o.metric,
                OTHER_METRICS.join(", ")
            );
            anyhow::ensure!(
                o.measured.is_finite() && o.measured > 0.0 && o.measured <= 1e6,
                "reference figure {} = {}: must be in ]0, 1e6]",
                o.metric,
                o.measured
            );
        }
        for c in &self.cells {
            anyhow::ensure!(c.level <= 1000, "reference level {} above 1000 %", c.level);
            anyhow::ensure!(
                [c.median, c.min, c.max].iter().all(|v| v.is_finite()),
                "reference cell {}/{}/{} not finite",
                c.level,
                c.mode,
                c.metric
            );
        }
        Ok(())
    }

    /// The bench mode the sim's `memcolo` is compared with: `agent` if the sweep ran
    /// it, else `full`.
    pub fn memcolo_mode(&self) -> &'static str {
        if self.cells.iter().any(|c| c.mode == "agent") {
            "agent"
        } else {
            "full"
        }
    }

    /// The levels with figures for both compared modes.
    pub fn levels(&self) -> Vec<u32> {
        let m = self.memcolo_mode();
        let mut v: Vec<u32> = self
            .cells
            .iter()
            .filter(|c| c.mode == "kernel")
            .map(|c| c.level)
            .filter(|l| self.cells.iter().any(|c| c.mode == m && c.level == *l))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn cell(&self, level: u32, mode: &str, metric: &str) -> Option<&MeasuredCell> {
        self.cells
            .iter()
            .find(|c| c.level == level && c.mode == mode && c.metric == metric)
    }
}

/// One compared cell.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub level: u32,
    /// `kernel` or `memcolo`.
    pub sim_mode: String,
    /// The bench mode it is set beside.
    pub bench_mode: String,
    pub metric: String,
    /// Median over the seeds, and their min–max.
    pub sim: f64,
    pub sim_min: f64,
    pub sim_max: f64,
    /// The bench's median and min–max over its repeats.
    pub measured: f64,
    pub measured_min: f64,
    pub measured_max: f64,
    /// `(sim − measured) / measured`, % (`None` when the measured figure is 0).
    pub error_pct: Option<f64>,
    /// The sim's median lies within the measured min–max.
    pub within_measured_range: bool,
}

/// The error of one metric over its cells.
#[derive(Clone, Debug, Serialize)]
pub struct MetricError {
    pub metric: String,
    pub cells: usize,
    /// Mean of |error| over the cells, %.
    pub mean_abs_error_pct: f64,
    /// Largest |error|, %.
    pub max_abs_error_pct: f64,
    /// Cells whose sim median lies within the measured min–max.
    pub within_measured_range: usize,
    /// `mean_abs_error_pct <= bound`.
    pub pass: bool,
}

/// The result of `memcolo sim --validate`.
#[derive(Clone, Debug, Serialize)]
pub struct Validation {
    pub source: String,
    pub bound_pct: f64,
    pub seeds: u64,
    pub metrics: Vec<MetricError>,
    pub cells: Vec<Comparison>,
    /// Every metric within the bound.
    pub pass: bool,
}

/// One seed's simulated value of one of [`OTHER_METRICS`].
fn other_figure(metric: &str, calib: &Calibration, seed: u64) -> anyhow::Result<f64> {
    match metric {
        "m3_jjj0_mean_speedup" => {
            let c = Common {
                node_bytes: 2 << 30,
                swap_bytes: 0,
                duration: Duration::from_secs(600),
                step: Duration::from_millis(100),
                seed,
                calib: calib.clone(),
                slo_us: 10_000.0,
                warmup: Duration::ZERO,
                lc_samples_per_step: LC_SAMPLES_PER_STEP,
            };
            let rows = scenario::m3_elastic(&c, 0.0)?;
            let s: Vec<f64> = rows
                .iter()
                .filter(|r| r.mode == "m3")
                .filter_map(|r| r.speedup)
                .collect();
            anyhow::ensure!(s.len() == 3, "an m3-elastic job did not finish");
            Ok(s.iter().sum::<f64>() / 3.0)
        }
        "maxmem_p6_arrival_epochs" | "maxmem_p1_target_epochs" => {
            let (change, process) = if metric == "maxmem_p6_arrival_epochs" {
                ("start p6 @100s", "p6")
            } else {
                ("target p1 @220s", "p1")
            };
            let rows =
                crate::maxmem::timeline(&crate::maxmem::TimelineConfig::scaled(144 << 20, seed))?;
            rows.iter()
                .find(|r| r.change == change && r.process == process)
                .and_then(|r| r.epochs_to_target)
                .map(|e| e as f64)
                .context("the timeline never reached the target")
        }
        _ => anyhow::bail!("unknown figure {metric}"),
    }
}

fn sim_metric(row: &scenario::ColocationRow, metric: &str) -> f64 {
    match metric {
        "p50_us" => row.lc_p50_us,
        "p99_us" => row.lc_p99_us,
        "p999_us" => row.lc_p999_us,
        "slo_violation_pct" => row.slo_violation_ratio * 100.0,
        "node_util_pct" => row.utilisation * 100.0,
        _ => f64::NAN,
    }
}

/// Runs the colocation scenario at the reference's settings over seeds `1..=seeds`
/// and compares it with the reference, `step` being the model's step.
pub fn validate(
    reference: &Reference,
    calib: &Calibration,
    seeds: u64,
    step: Duration,
    bound_pct: f64,
) -> anyhow::Result<Validation> {
    reference.check()?;
    anyhow::ensure!((1..=100).contains(&seeds), "--seeds must be in 1..=100");
    anyhow::ensure!(
        bound_pct.is_finite() && bound_pct >= 0.0,
        "--bound must be a finite percentage"
    );
    let levels = reference.levels();
    anyhow::ensure!(
        !levels.is_empty(),
        "the reference has no level with both `kernel` and `{}` figures",
        reference.memcolo_mode()
    );
    let warmup = Duration::from_secs_f64(reference.warmup_s);
    let mut cells_other = Vec::new();
    let per_step = (reference.rate * step.as_secs_f64()).ceil() as usize;
    let mut runs = Vec::new();
    for seed in 1..=seeds {
        let c = Common {
            node_bytes: reference.node_bytes,
            swap_bytes: reference.node_bytes / 2,
            duration: warmup + Duration::from_secs_f64(reference.measured_s),
            step,
            seed,
            calib: calib.clone(),
            slo_us: reference.slo_us,
            warmup,
            lc_samples_per_step: per_step.clamp(LC_SAMPLES_PER_STEP, 4096),
        };
        let shape = scenario::ColocationShape {
            lc_ws_bytes: reference.lc_rss_bytes.max(1 << 20),
            rate: reference.rate,
            file_read_bytes_per_s: reference.be_file_read_bytes_per_s,
        };
        runs.push(scenario::colocation_with(&c, &levels, &shape)?);
    }
    for o in &reference.other {
        let mut v = Vec::new();
        for seed in 1..=seeds {
            v.push(other_figure(&o.metric, calib, seed)?);
        }
        let sim = median(&mut v);
        cells_other.push(Comparison {
            level: 0,
            sim_mode: "memcolo".into(),
            bench_mode: o.source.clone(),
            metric: o.metric.clone(),
            sim,
            sim_min: v.first().copied().unwrap_or(f64::NAN),
            sim_max: v.last().copied().unwrap_or(f64::NAN),
            measured: o.measured,
            measured_min: o.measured,
            measured_max: o.measured,
            error_pct: Some((sim - o.measured) / o.measured * 100.0),
            within_measured_range: sim == o.measured,
        });
    }
    let bench_memcolo = reference.memcolo_mode();
    let mut cells = Vec::new();
    for &level in &levels {
        for (mode, bench_mode) in [(Mode::Kernel, "kernel"), (Mode::Memcolo, bench_memcolo)] {
            for metric in METRICS {
                let Some(m) = reference.cell(level, bench_mode, metric) else {
                    continue;
                };
                let mut v: Vec<f64> = runs
                    .iter()
                    .flatten()
                    .filter(|r| r.level == level && r.mode == mode.as_str())
                    .map(|r| sim_metric(r, metric))
                    .collect();
                let sim = median(&mut v);
                let error_pct =
                    (m.median != 0.0).then(|| (sim - m.median) / m.median.abs() * 100.0);
                cells.push(Comparison {
                    level,
                    sim_mode: mode.as_str().into(),
                    bench_mode: bench_mode.into(),
                    metric: metric.into(),
                    sim,
                    sim_min: v.first().copied().unwrap_or(f64::NAN),
                    sim_max: v.last().copied().unwrap_or(f64::NAN),
                    measured: m.median,
                    measured_min: m.min,
                    measured_max: m.max,
                    error_pct,
                    within_measured_range: sim >= m.min && sim <= m.max,
                });
            }
        }
    }
    cells.extend(cells_other);
    let metrics: Vec<MetricError> = METRICS
        .iter()
        .chain(OTHER_METRICS.iter())
        .filter_map(|&metric| {
            let errs: Vec<f64> = cells
                .iter()
                .filter(|c| c.metric == metric)
                .filter_map(|c| c.error_pct.map(f64::abs))
                .collect();
            if errs.is_empty() {
                return None;
            }
            let mean = errs.iter().sum::<f64>() / errs.len() as f64;
            Some(MetricError {
                metric: metric.into(),
                cells: errs.len(),
                mean_abs_error_pct: mean,
                max_abs_error_pct: errs.iter().copied().fold(0.0, f64::max),
                within_measured_range: cells
                    .iter()
                    .filter(|c| c.metric == metric && c.within_measured_range)
                    .count(),
                pass: mean <= bound_pct,
            })
        })
        .collect();
    let pass = !metrics.is_empty() && metrics.iter().all(|m| m.pass);
    Ok(Validation {
        source: reference.source.clone(),
        bound_pct,
        seeds,
        metrics,
        cells,
        pass,
    })
}

impl Validation {
    /// The per-metric summary and the per-cell comparison as Markdown tables.
    pub fn table(&self) -> String {
        let mut out = format!(
            "memcolo sim --validate: colocation against {}\nsim: median over seeds 1..={}; \
             error = (sim − measured) / measured; bound {:.0} % mean |error| per metric\n\n",
            self.source, self.seeds, self.bound_pct
        );
        out += "| metric | cells | mean |error| % | max |error| % | sim within measured min–max | verdict |\n";
        out += "|---|---:|---:|---:|---:|---|\n";
        for m in &self.metrics {
            out += &format!(
                "| {} | {} | {:.1} | {:.1} | {}/{} | {} |\n",
                m.metric,
                m.cells,
                m.mean_abs_error_pct,
                m.max_abs_error_pct,
                m.within_measured_range,
                m.cells,
                if m.pass { "pass" } else { "**FAIL**" }
            );
        }
        out += "\n| level | sim mode | bench mode | metric | sim [min–max] | measured [min–max] | error % |\n";
        out += "|---:|---|---|---|---:|---:|---:|\n";
        for c in &self.cells {
            out += &format!(
                "| {} | {} | {} | {} | {:.1} [{:.1}–{:.1}] | {:.1} [{:.1}–{:.1}] | {} |\n",
                c.level,
                c.sim_mode,
                c.bench_mode,
                c.metric,
                c.sim,
                c.sim_min,
                c.sim_max,
                c.measured,
                c.measured_min,
                c.measured_max,
                c.error_pct
                    .map(|e| format!("{e:+.0}"))
                    .unwrap_or_else(|| "-".into())
            );
        }
        out += &format!(
            "\nverdict: {}\n",
            if self.pass {
                "every metric within the bound"
            } else {
                "FAIL: a metric's mean error is above the bound"
            }
        );
        out
    }
}
