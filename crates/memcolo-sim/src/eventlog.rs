//! A recorded `memcolo` event log read into a [`Trace`]: the processes the agent
//! managed, when, in which class, and the sizes the log gives evidence of.
//!
//! The log is the agent's JSON-lines file (`--event-log`, written by
//! `crates/memcolo-agent/src/eventlog.rs`): one object per line with `ts` (RFC 3339,
//! UTC) and `event`. What is read:
//!
//! - `registered` (`pid`, `class`, `name`, `again`): a process starts at `ts` (a
//!   re-registration of a live pid changes nothing but the name).
//! - `exited`, `unregistered` (`pid`): it stops at `ts`.
//! - `shutdown`: every live process stops; the log's end.
//! - `file_cache_dropped` (`pid`, `expected_bytes`, `adv_thr_bytes`): Hermes found
//!   `expected_bytes` of the process's page cache for one file; the sum over one
//!   advice round (one `ts`) is the process's page cache then. A BE process with such
//!   evidence is a file reader ([`Workload::BeFile`]), else an anonymous holder.
//!   `adv_thr_bytes` is 0.85 of the node's memory (Hermes' `adv_thr`), so it gives
//!   the node's size.
//! - `kill` (`pid`, `rss_bytes`): the process's size at `ts` (it is not stopped: the
//!   simulated policy decides its own kills).
//! - `reclaimed` (`pid`, `bytes`): an elastic process gave back `bytes`; it held at
//!   least that much.
//!
//! The log records decisions, not memory samples, so a process's size is the largest
//! figure of evidence up to each point: every new, larger figure at `t` opens a phase
//! from the previous evidence's time on ([`crate::trace::Phase`]). A process without
//! evidence gets its class's default size ([`Defaults`]). Rates (requests, reads,
//! touches, growth) are not in the log; they come from [`Defaults`].
//!
//! Every line is input: lines that do not parse, lack a field or carry an out-of-range
//! figure are skipped and counted ([`Imported::skipped_lines`]), at most
//! [`MAX_LINES`] lines and [`crate::trace::MAX_PROCESSES`] processes are read.

use crate::node::Workload;
use crate::trace::{Phase, Trace, TraceProc, MAX_PROCESSES};
use anyhow::Context;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// At most this many lines are read.
pub const MAX_LINES: usize = 1_000_000;

/// Hermes' default `adv_thr` as a share of the node
/// (`memcolo_policy::hermes::AdviceConfig::DEFAULT_ADV_THR_RATIO`).
const ADV_THR_RATIO: f64 = memcolo_policy::hermes::AdviceConfig::DEFAULT_ADV_THR_RATIO;

/// Sizes and rates the log does not give, per class.
#[derive(Clone, Debug, Serialize)]
pub struct Defaults {
    /// The node's memory when the log has no `adv_thr_bytes`, bytes.
    pub node_bytes: u64,
    /// An LC service's working set without evidence (default 1/16 of the node).
    pub lc_ws_bytes: u64,
    /// Its request rate, per second (2,000: `bench/colocation --quick`).
    pub lc_rate: f64,
    /// A BE process's size without evidence (1/8 of the node).
    pub be_bytes: u64,
    /// A BE file reader's read rate, bytes/s (64 MiB/s).
    pub be_read_bytes_per_s: f64,
    /// An elastic process's want without evidence (1/4 of the node).
    pub elastic_want_bytes: u64,
    /// Growth of every process, bytes/s (256 MiB/s).
    pub grow_bytes_per_s: f64,
}

impl Defaults {
    /// The defaults on a node of `node_bytes`.
    pub fn for_node(node_bytes: u64) -> Defaults {
        Defaults {
            node_bytes,
            lc_ws_bytes: node_bytes / 16,
            lc_rate: 2000.0,
            be_bytes: node_bytes / 8,
            be_read_bytes_per_s: 64.0 * (1u64 << 20) as f64,
            elastic_want_bytes: node_bytes / 4,
            grow_bytes_per_s: 256.0 * (1u64 << 20) as f64,
        }
    }
}

/// A log read into a trace, with what was skipped.
#[derive(Clone, Debug, Serialize)]
pub struct Imported {
    pub trace: Trace,
    /// Seconds from the first to the last event (the run's natural duration).
    pub duration_s: f64,
    /// Lines that did not parse or carried no usable figure.
    pub skipped_lines: u64,
    /// Events of the log by kind, as read.
    pub events: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Seen {
    name: String,
    class: String,
    start_s: f64,
    stop_s: Option<f64>,
    file_reader: bool,
    /// (time, bytes) of size evidence, in log order.
    evidence: Vec<(f64, u64)>,
    /// `file_cache_dropped` of the current round: (ts, sum).
    round: Option<(f64, u64)>,
}

fn ts_seconds(v: &serde_json::Value) -> Option<f64> {
    let t = chrono::DateTime::parse_from_rfc3339(v.get("ts")?.as_str()?).ok()?;
    Some(t.timestamp_millis() as f64 / 1000.0)
}

fn bytes(v: &serde_json::Value, field: &str) -> Option<u64> {
    v.get(field)?.as_u64().filter(|b| *b <= 1 << 50)
}

/// Reads the event log at `path`.
///
/// # Errors
/// The file cannot be read, or holds no registered process.
pub fn trace_from_event_log(path: &Path, defaults: &Defaults) -> anyhow::Result<Imported> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    trace_from_event_log_text(&text, defaults)
        .with_context(|| format!("event log {}", path.display()))
}

/// [`trace_from_event_log`] on the log's text.
pub fn trace_from_event_log_text(text: &str, defaults: &Defaults) -> anyhow::Result<Imported> {
    let mut skipped = 0u64;
    let mut events: BTreeMap<String, u64> = BTreeMap::new();
    let mut t0: Option<f64> = None;
    let mut last = 0.0f64;
    let mut adv_thr: Option<u64> = None;
    // Per pid, its current incarnation's index in `procs`.
    let mut live: BTreeMap<i64, usize> = BTreeMap::new();
    let mut procs: Vec<Seen> = Vec::new();
    for line in text.lines().take(MAX_LINES) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            skipped += 1;
            continue;
        };
        let (Some(kind), Some(t)) = (v.get("event").and_then(|e| e.as_str()), ts_seconds(&v))
        else {
            skipped += 1;
            continue;
        };
        if kind.len() > 64 {
            skipped += 1;
            continue;
        }
        *events.entry(kind.to_string()).or_default() += 1;
        let base = *t0.get_or_insert(t);
        let at = (t - base).max(0.0);
        last = last.max(at);
        let pid = v.get("pid").and_then(|p| p.as_i64());
        let idx = pid.and_then(|p| live.get(&p).copied());
        match kind {
            "registered" => {
                let (Some(pid), Some(class)) = (pid, v.get("class").and_then(|c| c.as_str()))
                else {
                    skipped += 1;
                    continue;
                };
                if !matches!(class, "lc" | "be" | "elastic") {
                    skipped += 1;
                    continue;
                }
                let name: String = v
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or("process")
                    .chars()
                    .take(64)
                    .collect();
                match idx {
                    Some(i) if procs[i].class == class => procs[i].name = name,
                    _ => {
                        if let Some(i) = idx {
                            procs[i].stop_s = Some(at);
                        }
                        if procs.len() >= MAX_PROCESSES {
                            skipped += 1;
                            continue;
                        }
                        live.insert(pid, procs.len());
                        procs.push(Seen {
                            name,
                            class: class.to_string(),
                            start_s: at,
                            ..Default::default()
                        });
                    }
                }
            }
            "exited" | "unregistered" => match (pid, idx) {
                (Some(pid), Some(i)) => {
                    procs[i].stop_s = Some(at);
                    live.remove(&pid);
                }
                _ => skipped += 1,
            },
            "shutdown" => {
                for (_, i) in std::mem::take(&mut live) {
                    procs[i].stop_s = Some(at);
                }
            }
            "file_cache_dropped" => {
                if let Some(a) = bytes(&v, "adv_thr_bytes").filter(|a| *a > 0) {
                    adv_thr = Some(a);
                }
                let (Some(i), Some(b)) = (idx, bytes(&v, "expected_bytes")) else {
                    skipped += 1;
                    continue;
                };
                let p = &mut procs[i];
                p.file_reader = true;
                match &mut p.round {
                    Some((rt, sum)) if *rt == at => *sum = sum.saturating_add(b),
                    round => {
                        if let Some(r) = round.take() {
                            p.evidence.push(r);
                        }
                        *round = Some((at, b));
                    }
                }
            }
            "kill" | "reclaimed" => {
                let field = if kind == "kill" { "rss_bytes" } else { "bytes" };
                match (idx, bytes(&v, field)) {
                    (Some(i), Some(b)) => procs[i].evidence.push((at, b)),
                    _ => skipped += 1,
                }
            }
            _ => {}
        }
    }
    anyhow::ensure!(!procs.is_empty(), "no registered process in the log");
    let node_bytes = adv_thr.map_or(defaults.node_bytes, |a| {
        (a as f64 / ADV_THR_RATIO).round() as u64
    });
    let d = if adv_thr.is_some() {
        Defaults {
            node_bytes,
            ..Defaults::for_node(node_bytes)
        }
    } else {
        defaults.clone()
    };
    let processes = procs
        .into_iter()
        .map(|mut p| {
            if let Some(r) = p.round.take() {
                p.evidence.push(r);
            }
            // Each new largest figure opens a phase at the previous evidence's time.
            let mut steps: Vec<(f64, u64)> = Vec::new();
            let mut from = p.start_s;
            for (t, b) in p.evidence {
                if steps.last().is_none_or(|s| b > s.1) {
                    steps.push((from, b));
                }
                from = t.max(p.start_s);
            }
            let work = |size: Option<u64>| -> Workload {
                match (p.class.as_str(), p.file_reader) {
                    ("lc", _) => Workload::Lc {
                        ws_bytes: size.unwrap_or(d.lc_ws_bytes),
                        grow_bytes_per_s: d.grow_bytes_per_s,
                        rate: d.lc_rate,
                    },
                    ("be", true) => Workload::BeFile {
                        file_bytes: size.unwrap_or(d.be_bytes),
                        read_bytes_per_s: d.be_read_bytes_per_s,
                    },
                    ("be", false) => Workload::BeAnon {
                        size_bytes: size.unwrap_or(d.be_bytes),
                        grow_bytes_per_s: d.grow_bytes_per_s,
                        touch_bytes_per_s: d.grow_bytes_per_s,
                    },
                    _ => {
                        let want = size.unwrap_or(0).max(d.elastic_want_bytes);
                        Workload::Elastic {
                            want_bytes: want,
                            floor_bytes: 0,
                            grow_bytes_per_s: d.grow_bytes_per_s,
                            layer_bytes: (want / 16).max(1 << 20),
                            miss_penalty: 2.0,
                            work_s: 1e12,
                            num_epochs: memcolo_sdk::gate::DEFAULT_NUM_EPOCHS,
                        }
                    }
                }
            };
            let first = steps.first().map(|s| s.1);
            let phases = steps
                .iter()
                .skip(1)
                .map(|&(at_s, b)| Phase {
                    at_s,
                    workload: work(Some(b)),
                })
                .collect();
            TraceProc {
                workload: work(first),
                name: p.name,
                start_s: p.start_s,
                cap_bytes: None,
                stop_s: p.stop_s,
                phases,
            }
        })
        .collect();
    let trace = Trace {
        node_bytes,
        swap_bytes: None,
        processes,
    };
    trace.check()?;
    Ok(Imported {
        trace,
        duration_s: last,
        skipped_lines: skipped,
        events,
    })
}
