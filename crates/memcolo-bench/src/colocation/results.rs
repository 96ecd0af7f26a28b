//! What a sweep leaves in its output directory, and the report made from it.
//!
//! Raw (ignored by git, `bench/out/...` by default): `runs.csv` (one row per run
//! attempt, [`crate::report::RunRecord`]), `percentiles.csv` (latency distribution per
//! accepted run), `meta.json` (machine, settings, modes and their sources, SLO,
//! rejection policy), `timeline-<level>-<mode>-<rep>.csv` and
//! `latency-<level>-<mode>-<rep>.csv` per accepted run (rejected attempts keep an
//! `-a<attempt>` suffix), `events-*.jsonl` (agent), `logs/`. From these,
//! `bench/colocation/report.py` (built into the binary) writes `report.md`,
//! `summary.csv` and the plots.

use std::path::Path;
use std::process::Command;

use anyhow::Context;
use serde_json::json;

use super::run::attempt_tag;
use super::{plan::Slot, Mode, Sweep};
use crate::harness::{self, progress};
use crate::report::{self, RunOutcome, RunRecord};
use crate::size::format_bytes;

/// The report script, built in so the binary does not depend on the source tree.
const REPORT_PY: &str = include_str!("../../../../bench/colocation/report.py");

/// Requests a run needs for its p99.9 to rest on at least ten slower requests.
pub const P999_MIN_REQUESTS: u64 = 10_000;

/// Writes the raw results of `outcomes`, then the report.
pub(super) fn write(sw: &Sweep<'_>, outcomes: &mut [RunOutcome]) -> anyhow::Result<()> {
    let s = sw.s;
    let args = sw.args;
    let records: Vec<RunRecord> = outcomes.iter().map(|o| o.record.clone()).collect();
    let slo = report::choose_slo(&records, args.slo_us);
    if let Some((us, _)) = &slo {
        report::apply_slo(outcomes, *us);
    }
    for o in outcomes.iter().filter(|o| o.record.accepted) {
        name_accepted_files(&s.out, &o.record);
    }
    let records: Vec<RunRecord> = outcomes.iter().map(|o| o.record.clone()).collect();
    report::write_file(&s.out, "runs.csv", &report::runs_csv(&records)?)?;
    report::write_file(
        &s.out,
        "percentiles.csv",
        &report::percentiles_csv(outcomes),
    )?;
    let meta = meta_json(sw, &records, slo.as_ref());
    report::write_file(
        &s.out,
        "meta.json",
        &serde_json::to_string_pretty(&meta).context("meta.json")?,
    )?;
    // The provenance `bench/benchlib.py publish` puts at the top of a RESULTS.md
    // section (its `machine.json`: one entry per invocation).
    let machine = json!([{
        "date": meta["date"],
        "commit": meta["commit"],
        "host": meta["host"],
        "kernel": meta["kernel"],
        "cpus": meta["cpus_online"],
        "mem_gib": (harness::mem_total_bytes() as f64 / (1u64 << 30) as f64 * 10.0).round() / 10.0,
        "command": meta["command"],
    }]);
    report::write_file(
        &s.out,
        "machine.json",
        &serde_json::to_string_pretty(&machine).context("machine.json")?,
    )?;
    println!("{}", report::table(&records));
    match &slo {
        Some((us, src)) => println!("SLO {us} µs ({src})"),
        None => println!("SLO: none"),
    }
    if args.no_report || records.is_empty() {
        progress(sw.t0, &format!("raw results in {}", s.out.display()));
        return Ok(());
    }
    match run_report(&s.out) {
        Ok(files) => progress(
            sw.t0,
            &format!(
                "report in {} ({})",
                s.out.join("report.md").display(),
                files.join(", ")
            ),
        ),
        Err(e) => {
            eprintln!(
                "warning: no report: {e:#}; raw results in {} (rerun: python3 bench/colocation/report.py {})",
                s.out.display(),
                s.out.display()
            );
        }
    }
    Ok(())
}

/// Renames an accepted attempt's timeline and latency files to their cell's name.
fn name_accepted_files(out: &Path, r: &RunRecord) {
    let Some(mode) = Mode::ALL.iter().find(|m| m.as_str() == r.mode) else {
        return;
    };
    let slot = Slot {
        rep: r.rep,
        level: r.level_pct,
        mode: *mode,
    };
    let from = attempt_tag(&slot, r.attempt);
    let to = format!("{}-{}-{}", r.level_pct, r.mode, r.rep);
    for kind in ["timeline", "latency"] {
        let a = out.join(format!("{kind}-{from}.csv"));
        if a.exists() {
            let _ = std::fs::rename(&a, out.join(format!("{kind}-{to}.csv")));
        }
    }
}

/// `meta.json`: what the report states about the machine, the settings and the modes.
fn meta_json(
    sw: &Sweep<'_>,
    records: &[RunRecord],
    slo: Option<&(u64, String)>,
) -> serde_json::Value {
    let s = sw.s;
    let args = sw.args;
    let modes: Vec<serde_json::Value> = s
        .modes
        .iter()
        .map(|m| {
            json!({
                "name": m.as_str(),
                "kind": m.kind().as_str(),
                "label": m.label(),
                "settings": m.settings(),
                "source": m.source(),
            })
        })
        .collect();
    let mut notes: Vec<String> = Vec::new();
    let disturbed = records.iter().filter(|r| r.disturbed).count();
    if disturbed > 0 {
        notes.push(format!(
            "{disturbed} runs were disturbed in every one of their {} attempts; the least disturbed attempt was kept (column `disturbed`).",
            s.max_attempts
        ));
    }
    let lib: Vec<&RunRecord> = records
        .iter()
        .filter(|r| r.lc_libmemcolo.is_some() && r.accepted)
        .collect();
    let lc_alloc = (!lib.is_empty()).then(|| {
        let mapped = lib.iter().all(|r| r.lc_libmemcolo == Some(true));
        let through: Vec<String> = lib
            .iter()
            .filter_map(|r| {
                Some(format!(
                    "{} % {} #{}: libmemcolo used {} vs the service's used_memory {}",
                    r.level_pct,
                    r.mode,
                    r.rep,
                    format_bytes(r.lc_alloc_used_bytes?),
                    format_bytes(r.lc_used_memory_bytes?)
                ))
            })
            .take(3)
            .collect();
        json!({
            "checked": true,
            "libmemcolo_mapped": mapped,
            "allocations_through_libmemcolo": if through.is_empty() {
                "libmemcolo.so mapped in the service (/proc/PID/maps); no published statistics to compare".to_string()
            } else {
                through.join("; ")
            },
        })
    });
    let mut m = json!({
        "date": chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        "commit": harness::source_commit(),
        "host": harness::hostname(),
        "kernel": harness::kernel_release(),
        "cpus_online": crate::process::online_cpus(),
        "mem_total_bytes": harness::mem_total_bytes(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "lc_service": args.lc.as_str(),
        "elapsed_s": sw.t0.elapsed().as_secs_f64(),
        "parameters": parameters(sw),
        "modes": modes,
        "levels": s.levels,
        "repeats": s.repeats,
        "slo_us": slo.map(|x| x.0),
        "slo_source": slo.map(|x| x.1.clone()).unwrap_or_else(|| "none (no accepted 0 % run and no --slo-us)".into()),
        "reject": {
            "foreign_pct_max": s.reject_foreign_pct,
            "steal_pct_max": s.reject_steal_pct,
            "max_attempts": s.max_attempts,
        },
        "p999_min_requests": P999_MIN_REQUESTS,
        "notes": notes,
    });
    if let Some(a) = lc_alloc {
        m["lc_alloc"] = a;
    }
    m
}

fn parameters(sw: &Sweep<'_>) -> Vec<[String; 2]> {
    let s = sw.s;
    let args = sw.args;
    let p = |k: &str, v: String| [k.to_string(), v];
    vec![
        p("levels (%)", format!("{:?}", s.levels)),
        p("repeats × attempts", format!("{} × up to {}", s.repeats, s.max_attempts)),
        p(
            "rejection",
            format!(
                "other work > {} % or host steal > {} % of the LC CPUs",
                s.reject_foreign_pct, s.reject_steal_pct
            ),
        ),
        p("node memory", format_bytes(s.node_bytes)),
        p("BE split file:anon:elastic", s.split.to_string()),
        p(
            "warm-up / measured",
            format!("{} s / {} s", s.warmup.as_secs(), s.duration.as_secs()),
        ),
        p(
            "rate",
            format!("{} req/s, open loop, {} connections", s.rate_per_s, s.connections),
        ),
        p(
            "requests",
            format!(
                "{:.0} % SET of a new key, rest GET of a random key",
                s.set_ratio * 100.0
            ),
        ),
        p(
            "dataset",
            format!("{}: {} keys × {} B values", args.lc.as_str(), s.keys, s.value_bytes),
        ),
        p(
            "pinning",
            match (&sw.lc_cpus, &sw.be_cpus) {
                (Some(l), Some(b)) => format!(
                    "{} and the load generator on CPU {l:?}, BE jobs on CPUs {b:?}, agent and peers unpinned",
                    args.lc.as_str()
                ),
                _ => "none".into(),
            },
        ),
        p(
            "zram",
            if sw.zram.is_some() {
                format_bytes(args.zram_size)
            } else {
                "off".into()
            },
        ),
        p(
            "libmemcolo",
            sw.libmemcolo
                .as_ref()
                .map_or("-".into(), |l| l.display().to_string()),
        ),
        p(
            "LC environment (alloc, full)",
            if args.lc_env.is_empty() {
                "libmemcolo's defaults".into()
            } else {
                args.lc_env
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        ),
    ]
}

/// Runs the report script on `out` with the first python3 that works; returns the
/// files it wrote.
fn run_report(out: &Path) -> anyhow::Result<Vec<String>> {
    let script = out.join(".report.py");
    std::fs::write(&script, REPORT_PY).with_context(|| format!("write {}", script.display()))?;
    let mut last_err = String::from("no python3 found");
    let mut result = None;
    for py in ["/usr/bin/python3", "python3"] {
        match Command::new(py).arg(&script).arg(out).output() {
            Ok(o) if o.status.success() => {
                result = Some(String::from_utf8_lossy(&o.stdout).to_string());
                break;
            }
            Ok(o) => last_err = format!("{py}: {}", String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => last_err = format!("{py}: {e}"),
        }
    }
    let _ = std::fs::remove_file(&script);
    let stdout = result.ok_or_else(|| anyhow::anyhow!(last_err))?;
    Ok(stdout
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}
