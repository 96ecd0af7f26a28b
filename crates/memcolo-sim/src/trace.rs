//! The `trace` scenario: a node and its processes read from a JSON file, run under
//! each management mode.
//!
//! A trace is the model's own vocabulary ([`ProcSpec`], [`Workload`]): per process a
//! name, a start and optional stop time (seconds), an optional static cap, and what it
//! does with its rates (bytes, bytes/s, requests/s). A process whose rates change over
//! time has `phases`: from `at_s` on it does the phase's workload (same class; its
//! memory is carried over, what it holds above the phase's size is freed at the
//! change; [`crate::Node::add_phase`]). A recorded `memcolo` event log is read into
//! a trace by [`crate::eventlog::trace_from_event_log`]. Example:
//!
//! ```json
//! {"node_bytes": 68719476736, "swap_bytes": 17179869184,
//!  "processes": [
//!   {"name": "redis", "start_s": 0,
//!    "workload": {"lc": {"ws_bytes": 4294967296, "grow_bytes_per_s": 1e9, "rate": 20000}},
//!    "phases": [{"at_s": 600, "workload": {"lc": {"ws_bytes": 8589934592,
//!      "grow_bytes_per_s": 1e9, "rate": 40000}}}]},
//!   {"name": "etl", "start_s": 60, "stop_s": 1800,
//!    "workload": {"be_file": {"file_bytes": 34359738368, "read_bytes_per_s": 5e8}}},
//!   {"name": "cache", "start_s": 0,
//!    "workload": {"elastic": {"want_bytes": 17179869184, "floor_bytes": 1073741824,
//!      "grow_bytes_per_s": 5e8, "layer_bytes": 268435456, "miss_penalty": 2,
//!      "work_s": 1e12}}}]}
//! ```
//!
//! Every figure is checked before the run ([`Trace::check`]): a trace file is input.

use crate::node::{Mode, ProcSpec, Workload};
use crate::scenario::Common;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// At most this many processes in a trace.
pub const MAX_PROCESSES: usize = 10_000;

/// A node and its processes.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    /// RAM, bytes (overridden by `--node-mem`).
    pub node_bytes: u64,
    /// Swap, bytes (overridden by `--swap`; default half the node).
    #[serde(default)]
    pub swap_bytes: Option<u64>,
    pub processes: Vec<TraceProc>,
}

/// At most this many phases per process.
pub const MAX_PHASES: usize = 10_000;

/// One process of a trace: a [`ProcSpec`] and its later phases.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceProc {
    /// [`ProcSpec::name`].
    pub name: String,
    /// [`ProcSpec::start_s`], seconds.
    pub start_s: f64,
    /// What it does from its start.
    pub workload: Workload,
    /// [`ProcSpec::cap_bytes`].
    #[serde(default)]
    pub cap_bytes: Option<u64>,
    /// [`ProcSpec::stop_s`], seconds.
    #[serde(default)]
    pub stop_s: Option<f64>,
    /// Later phases, in time order, each of the same class as `workload`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<Phase>,
}

/// From `at_s` (seconds) on, the process does `workload`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    pub at_s: f64,
    pub workload: Workload,
}

impl TraceProc {
    /// The process as the model starts it (its first phase).
    pub fn spec(&self) -> ProcSpec {
        ProcSpec {
            name: self.name.clone(),
            start_s: self.start_s,
            workload: self.workload.clone(),
            cap_bytes: self.cap_bytes,
            stop_s: self.stop_s,
        }
    }
}

fn workload_figures(w: &Workload) -> Vec<(&'static str, f64)> {
    match w {
        Workload::Lc {
            ws_bytes,
            grow_bytes_per_s,
            rate,
        } => vec![
            ("ws_bytes", *ws_bytes as f64),
            ("grow_bytes_per_s", *grow_bytes_per_s),
            ("rate", *rate),
        ],
        Workload::BeAnon {
            size_bytes,
            grow_bytes_per_s,
            touch_bytes_per_s,
        } => vec![
            ("size_bytes", *size_bytes as f64),
            ("grow_bytes_per_s", *grow_bytes_per_s),
            ("touch_bytes_per_s", *touch_bytes_per_s),
        ],
        Workload::BeFile {
            file_bytes,
            read_bytes_per_s,
        } => vec![
            ("file_bytes", *file_bytes as f64),
            ("read_bytes_per_s", *read_bytes_per_s),
        ],
        Workload::Elastic {
            want_bytes,
            floor_bytes,
            grow_bytes_per_s,
            layer_bytes,
            miss_penalty,
            work_s,
            num_epochs,
        } => vec![
            ("want_bytes", *want_bytes as f64),
            ("floor_bytes", *floor_bytes as f64),
            ("grow_bytes_per_s", *grow_bytes_per_s),
            ("layer_bytes", *layer_bytes as f64),
            ("miss_penalty", *miss_penalty),
            ("work_s", *work_s),
            ("num_epochs", f64::from(*num_epochs)),
        ],
    }
}

fn finite(name: &str, v: f64, hi: f64) -> anyhow::Result<()> {
    anyhow::ensure!(
        v.is_finite() && (0.0..=hi).contains(&v),
        "{name} = {v}: must be in 0..={hi}"
    );
    Ok(())
}

impl Trace {
    /// Reads and checks a trace file.
    pub fn load(path: &Path) -> anyhow::Result<Trace> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let t: Trace =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        t.check()?;
        Ok(t)
    }

    /// Checks sizes, rates and times: finite, non-negative, bounded.
    pub fn check(&self) -> anyhow::Result<()> {
        const PIB: f64 = (1u64 << 50) as f64;
        anyhow::ensure!(
            self.node_bytes > 0 && self.node_bytes <= 1 << 50,
            "node_bytes must be in 1..=1 PiB"
        );
        anyhow::ensure!(
            self.swap_bytes.unwrap_or(0) <= 1 << 50,
            "swap_bytes above 1 PiB"
        );
        anyhow::ensure!(
            !self.processes.is_empty() && self.processes.len() <= MAX_PROCESSES,
            "a trace has 1..={MAX_PROCESSES} processes"
        );
        for p in &self.processes {
            let ctx = |e: anyhow::Error| e.context(format!("process `{}`", p.name));
            anyhow::ensure!(p.name.len() <= 256, "process name above 256 bytes");
            finite("start_s", p.start_s, 1e9).map_err(ctx)?;
            if let Some(stop) = p.stop_s {
                finite("stop_s", stop, 1e9).map_err(ctx)?;
            }
            if let Some(cap) = p.cap_bytes {
                finite("cap_bytes", cap as f64, PIB).map_err(ctx)?;
            }
            anyhow::ensure!(p.phases.len() <= MAX_PHASES, "above {MAX_PHASES} phases");
            let mut after = p.start_s;
            for ph in &p.phases {
                finite("phases.at_s", ph.at_s, 1e9).map_err(ctx)?;
                anyhow::ensure!(
                    ph.at_s >= after,
                    "process `{}`: phase at {} s before {after} s",
                    p.name,
                    ph.at_s
                );
                anyhow::ensure!(
                    ph.workload.class() == p.workload.class(),
                    "process `{}`: a phase of another class",
                    p.name
                );
                after = ph.at_s;
            }
            let figures = std::iter::once(&p.workload)
                .chain(p.phases.iter().map(|ph| &ph.workload))
                .flat_map(workload_figures);
            for (name, v) in figures {
                // Rates per second and sizes share one bound: a PiB (per second).
                let hi = if name == "rate" { 1e9 } else { PIB };
                finite(name, v, hi).map_err(ctx)?;
            }
        }
        Ok(())
    }
}

/// One mode's run of a trace.
#[derive(Clone, Debug, Serialize)]
pub struct TraceRow {
    pub mode: String,
    pub utilisation: f64,
    pub lc_p50_us: f64,
    pub lc_p99_us: f64,
    pub lc_p999_us: f64,
    pub slo_violation_ratio: f64,
    pub lc_stall_s: f64,
    pub m3_kills: u64,
    pub oom_kills: u64,
    pub notifications: u64,
    pub hermit_reclaimed_mib: f64,
    pub hermes_dropped_mib: f64,
    pub peak_swapped_mib: f64,
    /// Elastic and batch processes that finished (by `stop_s` or their work).
    pub finished: usize,
}

/// Runs the trace's processes on the node of `c` under each of `modes`.
pub fn run(c: &Common, trace: &Trace, modes: &[Mode]) -> anyhow::Result<Vec<TraceRow>> {
    trace.check()?;
    let mut rows = Vec::new();
    for &mode in modes {
        let mut node = c.node(mode, trace.processes.iter().map(TraceProc::spec).collect())?;
        for (i, p) in trace.processes.iter().enumerate() {
            for ph in &p.phases {
                node.add_phase(i, ph.at_s, ph.workload.clone())?;
            }
        }
        node.run(c.duration);
        let s = node.finish();
        let mib = (1u64 << 20) as f64;
        rows.push(TraceRow {
            mode: mode.as_str().into(),
            utilisation: s.utilisation,
            lc_p50_us: s.lc.p50_us,
            lc_p99_us: s.lc.p99_us,
            lc_p999_us: s.lc.p999_us,
            slo_violation_ratio: s.lc.slo_violation_ratio,
            lc_stall_s: s
                .procs
                .iter()
                .filter(|p| p.class == "lc")
                .map(|p| p.direct_reclaim_s + p.fault_s)
                .sum(),
            m3_kills: s.m3_kills,
            oom_kills: s.oom_kills,
            notifications: s.signals.iter().sum(),
            hermit_reclaimed_mib: s.hermit_reclaimed_bytes as f64 / mib,
            hermes_dropped_mib: s.hermes_dropped_bytes as f64 / mib,
            peak_swapped_mib: s.peak_swapped_bytes as f64 / mib,
            finished: s.procs.iter().filter(|p| p.finished_s.is_some()).count(),
        });
    }
    Ok(rows)
}
