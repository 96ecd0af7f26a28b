//! `memcolo sim SCENARIO`: the command line, the summary table on stdout and the
//! report written with `--out DIR` (`report.json`: settings and rows; `report.csv`:
//! the rows; `trace.json`: the trace read from `--event-log`, which `--trace` takes); `memcolo sim --validate`: the comparison with a recorded bench run
//! ([`crate::validate`]), written with `--out DIR` as `validation.json` and the
//! reference it used as `reference.json`.

use crate::calib::Calibration;
use crate::scenario::{self, Common};
use anyhow::Context;
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// A scenario of `memcolo sim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Hermes §5.1's colocation levels: an LC service and batch jobs at a pressure
    /// level, kernel alone against memcolo (default node 2 GiB, 40 s per run).
    Colocation,
    /// M3 Fig. 5-like: three elastic jobs started 30 s apart, M3 against a static
    /// partition (default node 64 GiB, 600 s).
    M3Elastic,
    /// Scale benchmark: 100 processes on a 1 TiB node for a simulated hour, timed.
    Scale,
    /// Fleet: --nodes nodes (1,000) of 256 GiB, each a sampled mix of LC, batch and
    /// elastic processes, for a simulated day at 1 s steps, kernel alone against
    /// memcolo on the same mixes; fleet figures per mode, timed.
    Fleet,
    /// MaxMem §5.1.2's six-process timeline (Fig. 4) through the policy's MaxMem:
    /// --node-mem is the fast tier (default 144 GiB, the paper's; 144M is
    /// bench/tiering's timeline), tables and migration cap in the paper's proportion.
    MaxmemTimeline,
    /// A node and its processes from a JSON trace (--trace FILE; see
    /// memcolo_sim::trace) or a recorded memcolo event log (--event-log FILE; see
    /// memcolo_sim::eventlog), under each of --modes.
    Trace,
    /// M3 §7.2 at the paper's size (64 GiB): Fig. 5's and Fig. 8's workloads
    /// (--workloads), each job's run time under M3 against the best static partition
    /// found by search (--grid); mean speedup per workload.
    M3Paper,
    /// Hermes §5.3 at the paper's size (128 GiB, Redis of 2 GiB, levels
    /// 0,50,75,100,125,150 unless --levels): SLO violations against the service's
    /// p90 alone, kernel against memcolo, and their reduction (Fig. 16).
    HermesPaper,
}

/// Arguments of `memcolo sim`.
#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// The scenario to run (none with --validate).
    #[arg(value_enum, required_unless_present = "validate")]
    pub scenario: Option<Scenario>,
    /// Run the colocation scenario at the settings of a recorded `memcolo bench
    /// colocation` sweep and compare: error per metric, exit status 1 when a metric's
    /// mean error is above --bound.
    #[arg(long, conflicts_with = "scenario")]
    pub validate: bool,
    /// --validate: the recorded sweep, a bench run directory (summary.csv, meta.json,
    /// runs.csv) or a reference.json; default the Redis quick sweep of 2026-11-28.
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// --validate: the bound on each metric's mean |error|, %.
    #[arg(long, default_value_t = crate::validate::DEFAULT_BOUND_PCT)]
    pub bound: f64,
    /// --validate: seeds 1..=N are run; the simulated figure is their median.
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// Node memory (bytes, or with a K/M/G/T suffix, powers of 1024). Default per
    /// scenario: colocation 2G, m3-elastic 64G, scale 1T.
    #[arg(long, value_parser = parse_size)]
    pub node_mem: Option<u64>,
    /// Swap (far tier) size; default half the node memory.
    #[arg(long, value_parser = parse_size)]
    pub swap: Option<u64>,
    /// Simulated seconds per run. Default per scenario: colocation 40 (10 s warm-up and
    /// 30 s measured, as bench/colocation), m3-elastic 600,
    /// scale 3600.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Step of the model, milliseconds. Default 100 (fleet: 1000).
    #[arg(long)]
    pub step_ms: Option<u64>,
    /// Fleet: number of nodes.
    #[arg(long, default_value_t = 1000)]
    pub nodes: u32,
    /// Fleet and trace: the management modes to run, each on the same processes (an
    /// A/B).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "kernel,memcolo"
    )]
    pub modes: Vec<crate::node::Mode>,
    /// Fleet: an A/B of any setting on the same mixes, `KEY=V1,V2,...` (a subrelease
    /// setting such as `skip_subrelease_s=0,60`, a heap churn parameter or a calibration
    /// field; `memcolo_sim::fleet::Ab`); one row per value and mode.
    #[arg(long)]
    pub ab: Option<String>,
    /// Fleet: a setting for every arm, `KEY=VALUE` (the keys of --ab), repeatable.
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Trace: the JSON file of the node and its processes.
    #[arg(long, conflicts_with = "event_log")]
    pub trace: Option<PathBuf>,
    /// Trace: a recorded `memcolo` event log (JSON lines) read into the trace; the
    /// run lasts as long as the log unless --duration is given.
    #[arg(long)]
    pub event_log: Option<PathBuf>,
    /// m3-paper: workloads, APPS-DELAY (apps of W, P, C, M; delay in s); default
    /// Fig. 5's then Fig. 8's.
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// m3-paper: the static partitions searched split the top of memory into this
    /// many parts.
    #[arg(long, default_value_t = 24)]
    pub grid: u64,
    /// Fleet: OS threads running nodes (default: the CPUs available).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seed of the model's random draws (the same seed gives the same report).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Colocation levels, % of the memory the LC service leaves to batch jobs.
    /// Default: colocation 0,50,100,125,150; hermes-paper 0,50,75,100,125,150.
    #[arg(long, value_delimiter = ',')]
    pub levels: Vec<u32>,
    /// m3-elastic: seconds between the starts of the three jobs.
    #[arg(long, default_value_t = 30.0)]
    pub stagger: f64,
    /// LC latency SLO, milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub slo_ms: f64,
    /// JSON file overriding fields of the calibration (see `memcolo_sim::Calibration`).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write report.json and report.csv into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Parses `2G`, `512M`, `1T`, `4096` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        Some('T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    let v: f64 = num.parse().map_err(|_| format!("bad size `{s}`"))?;
    if !v.is_finite() || v < 0.0 || v * mul as f64 > u64::MAX as f64 / 2.0 {
        return Err(format!("size `{s}` out of range"));
    }
    Ok((v * mul as f64) as u64)
}

/// The whole report.
#[derive(Serialize)]
pub struct Report {
    pub scenario: Scenario,
    pub node_bytes: u64,
    pub swap_bytes: u64,
    pub duration_s: f64,
    pub step_ms: u64,
    pub seed: u64,
    pub slo_ms: f64,
    pub calibration: Calibration,
    pub rows: Vec<serde_json::Value>,
    /// The trace read from `--event-log` (written as `trace.json` with `--out`, a
    /// trace file `--trace` reads back).
    #[serde(skip)]
    pub imported_trace: Option<crate::trace::Trace>,
}

fn calibration(a: &SimArgs) -> anyhow::Result<Calibration> {
    let calib: Calibration = match &a.calibration {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?
        }
        None => Calibration::default(),
    };
    calib.validate()?;
    Ok(calib)
}

/// `memcolo sim --validate`: the comparison with the reference (not yet judged).
pub fn validation(a: &SimArgs) -> anyhow::Result<crate::validate::Validation> {
    let step_ms = a.step_ms.unwrap_or(100);
    anyhow::ensure!(step_ms > 0, "--step-ms must be positive");
    let reference = match &a.reference {
        Some(p) => crate::validate::Reference::load(p)?,
        None => crate::validate::Reference::builtin(),
    };
    let v = crate::validate::validate(
        &reference,
        &calibration(a)?,
        a.seeds,
        Duration::from_millis(step_ms),
        a.bound,
    )?;
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(
            dir.join("reference.json"),
            serde_json::to_string_pretty(&reference)? + "\n",
        )?;
        std::fs::write(
            dir.join("validation.json"),
            serde_json::to_string_pretty(&v)? + "\n",
        )?;
    }
    Ok(v)
}

/// Runs the scenario and returns its report.
pub fn report(a: &SimArgs) -> anyhow::Result<Report> {
    let scenario = a.scenario.context("a scenario is needed (or --validate)")?;
    let (mem, dur) = match scenario {
        Scenario::Colocation => (2u64 << 30, 40.0),
        Scenario::M3Elastic => (64 << 30, 600.0),
        Scenario::Scale => (1 << 40, 3600.0),
        Scenario::Fleet => (256 << 30, 86_400.0),
        Scenario::MaxmemTimeline => (144 << 30, 280.0),
        Scenario::Trace => (1 << 30, 600.0),
        Scenario::M3Paper => (64 << 30, 2400.0),
        Scenario::HermesPaper => (128 << 30, 600.0),
    };
    let step_ms = a.step_ms.unwrap_or(match scenario {
        Scenario::Fleet => 1000,
        _ => 100,
    });
    let mut log_duration = None;
    let mut imported_trace = None;
    let trace = match (scenario, &a.trace, &a.event_log) {
        (Scenario::Trace, Some(p), _) => Some(crate::trace::Trace::load(p)?),
        (Scenario::Trace, None, Some(p)) => {
            let d = crate::eventlog::Defaults::for_node(a.node_mem.unwrap_or(mem));
            let imported = crate::eventlog::trace_from_event_log(p, &d)?;
            log_duration = Some(imported.duration_s.max(1.0));
            imported_trace = Some(imported.trace.clone());
            Some(imported.trace)
        }
        (Scenario::Trace, None, None) => {
            anyhow::bail!("the trace scenario needs --trace FILE or --event-log FILE")
        }
        _ => None,
    };
    let node_bytes = a
        .node_mem
        .or(trace.as_ref().map(|t| t.node_bytes))
        .unwrap_or(mem);
    let duration_s = a.duration.or(log_duration).unwrap_or(dur);
    anyhow::ensure!(
        duration_s.is_finite() && duration_s > 0.0,
        "--duration must be positive"
    );
    anyhow::ensure!(step_ms > 0, "--step-ms must be positive");
    let calib = calibration(a)?;
    let c = Common {
        node_bytes,
        swap_bytes: a
            .swap
            .or(trace.as_ref().and_then(|t| t.swap_bytes))
            .unwrap_or(node_bytes / 2),
        duration: Duration::from_secs_f64(duration_s),
        step: Duration::from_millis(step_ms),
        seed: a.seed,
        calib,
        slo_us: a.slo_ms * 1000.0,
        lc_samples_per_step: crate::node::LC_SAMPLES_PER_STEP,
        warmup: match scenario {
            Scenario::Colocation => {
                Duration::from_secs(10).min(Duration::from_secs_f64(duration_s / 4.0))
            }
            _ => Duration::ZERO,
        },
    };
    let rows: Vec<serde_json::Value> = match scenario {
        Scenario::Colocation => {
            let levels = if a.levels.is_empty() {
                vec![0, 50, 100, 125, 150]
            } else {
                a.levels.clone()
            };
            to_values(scenario::colocation(&c, &levels)?)?
        }
        Scenario::M3Elastic => {
            anyhow::ensure!(
                a.stagger.is_finite() && a.stagger >= 0.0,
                "--stagger must be >= 0"
            );
            to_values(scenario::m3_elastic(&c, a.stagger)?)?
        }
        Scenario::Scale => to_values(scenario::scale(&c)?)?,
        Scenario::Fleet => {
            anyhow::ensure!(
                (1..=1_000_000).contains(&a.nodes),
                "--nodes must be in 1..=1000000"
            );
            anyhow::ensure!(!a.modes.is_empty(), "--modes needs at least one mode");
            let f = crate::fleet::FleetConfig {
                nodes: a.nodes,
                node_bytes: c.node_bytes,
                swap_bytes: c.swap_bytes,
                duration: c.duration,
                step: c.step,
                seed: c.seed,
                calib: c.calib.clone(),
                slo_us: c.slo_us,
                threads: a
                    .threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            };
            let ab = a.ab.as_deref().map(crate::fleet::Ab::parse).transpose()?;
            let mut base = crate::fleet::Arm::base(&f);
            for kv in &a.set {
                let (k, v) = kv.split_once('=').context("--set wants KEY=VALUE")?;
                base = base.with(k.trim(), v.trim()).context("--set")?;
            }
            to_values(crate::fleet::fleet_ab(&f, &a.modes, &base, ab.as_ref())?)?
        }
        Scenario::Trace => {
            anyhow::ensure!(!a.modes.is_empty(), "--modes needs at least one mode");
            let t = trace.as_ref().expect("loaded above");
            to_values(crate::trace::run(&c, t, &a.modes)?)?
        }
        Scenario::M3Paper => {
            let names: Vec<String> = if a.workloads.is_empty() {
                crate::papers::FIG5_WORKLOADS
                    .iter()
                    .chain(&crate::papers::FIG8_WORKLOADS)
                    .map(|s| s.to_string())
                    .collect()
            } else {
                a.workloads.clone()
            };
            anyhow::ensure!(names.len() <= 100, "at most 100 workloads");
            let w = names
                .iter()
                .map(|n| crate::papers::M3Workload::parse(n))
                .collect::<anyhow::Result<Vec<_>>>()?;
            to_values(crate::papers::m3_paper(&c, &w, a.grid)?)?
        }
        Scenario::HermesPaper => {
            let levels: Vec<u32> = if a.levels.is_empty() {
                crate::papers::HERMES_LEVELS.to_vec()
            } else {
                a.levels.clone()
            };
            to_values(crate::papers::hermes_paper(&c, &levels, c.node_bytes / 64)?)?
        }
        Scenario::MaxmemTimeline => to_values(crate::maxmem::timeline(
            &crate::maxmem::TimelineConfig::scaled(c.node_bytes, c.seed),
        )?)?,
    };
    Ok(Report {
        scenario,
        node_bytes,
        swap_bytes: c.swap_bytes,
        duration_s,
        step_ms,
        seed: a.seed,
        slo_ms: a.slo_ms,
        calibration: c.calib,
        rows,
        imported_trace,
    })
}

fn to_values<T: Serialize>(rows: Vec<T>) -> anyhow::Result<Vec<serde_json::Value>> {
    rows.into_iter()
        .map(|r| serde_json::to_value(r).map_err(Into::into))
        .collect()
}

fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "-".into(),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => {
                // `+ 0.0` turns the -0.0 of an empty sum into 0.
                let f = f + 0.0;
                if f.abs() >= 100.0 {
                    format!("{f:.0}")
                } else {
                    format!("{f:.3}")
                }
            }
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

fn columns(rows: &[serde_json::Value]) -> Vec<String> {
    rows.first()
        .and_then(|r| r.as_object())
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The rows as CSV (header from the first row's fields).
pub fn csv(rows: &[serde_json::Value]) -> String {
    let cols = columns(rows);
    let mut out = cols.join(",") + "\n";
    for r in rows {
        let line: Vec<String> = cols.iter().map(|c| cell(&r[c.as_str()])).collect();
        out += &line.join(",");
        out += "\n";
    }
    out
}

/// The rows as a Markdown table.
pub fn table(rows: &[serde_json::Value]) -> String {
    let cols = columns(rows);
    let mut out = format!("| {} |\n", cols.join(" | "));
    out += &format!("|{}\n", "---|".repeat(cols.len()));
    for r in rows {
        let line: Vec<String> = cols.iter().map(|c| cell(&r[c.as_str()])).collect();
        out += &format!("| {} |\n", line.join(" | "));
    }
    out
}

/// `memcolo sim`'s arguments as a command of their own (`name` first, as in
/// `argv`): for the `sim` example and the tests, which run the simulator without the
/// agent's binary.
///
/// # Errors
/// clap's error for arguments that do not parse (it prints itself with `exit()`).
pub fn parse_args<I, T>(argv: I) -> Result<SimArgs, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    #[derive(clap::Parser)]
    #[command(name = "sim")]
    struct Cli {
        #[command(flatten)]
        args: SimArgs,
    }
    <Cli as clap::Parser>::try_parse_from(argv).map(|c| c.args)
}

/// `memcolo sim`: runs, prints, and writes the report if asked.
pub fn run(a: &SimArgs) -> anyhow::Result<()> {
    if a.validate {
        let v = validation(a)?;
        let mut stdout = std::io::stdout().lock();
        if a.json {
            writeln!(stdout, "{}", serde_json::to_string_pretty(&v)?)?;
        } else {
            write!(stdout, "{}", v.table())?;
        }
        anyhow::ensure!(
            v.pass,
            "the simulator is outside the bound of {} % on: {}",
            v.bound_pct,
            v.metrics
                .iter()
                .filter(|m| !m.pass)
                .map(|m| format!("{} ({:.0} %)", m.metric, m.mean_abs_error_pct))
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Ok(());
    }
    let r = report(a)?;
    let json = serde_json::to_string_pretty(&r)?;
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("report.json"), &json)?;
        std::fs::write(dir.join("report.csv"), csv(&r.rows))?;
        if let Some(t) = &r.imported_trace {
            std::fs::write(
                dir.join("trace.json"),
                serde_json::to_string_pretty(t)? + "\n",
            )?;
        }
    }
    let mut stdout = std::io::stdout().lock();
    if a.json {
        writeln!(stdout, "{json}")?;
    } else {
        writeln!(
            stdout,
            "memcolo sim {}: node {} MiB, swap {} MiB, {} s at {} ms steps, seed {}\n",
            r.scenario
                .to_possible_value()
                .map(|v| v.get_name().to_string())
                .unwrap_or_default(),
            r.node_bytes >> 20,
            r.swap_bytes >> 20,
            r.duration_s,
            r.step_ms,
            r.seed
        )?;
        write!(stdout, "{}", table(&r.rows))?;
    }
    Ok(())
}
