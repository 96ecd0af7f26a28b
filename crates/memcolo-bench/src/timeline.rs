//! The per-250 ms record of a run's measured phase ([`TimelineRow`],
//! `timeline-<tag>.csv`), the per-second latency (`latency-<tag>.csv`), and what the
//! LC CPUs did besides serving ([`LcCpuUse`]): the noise a run is judged by.

use std::path::Path;

use crate::error::{BenchError, Result};
use crate::process;

/// One 250 ms sample of the measured phase.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TimelineRow {
    pub t_s: f64,
    pub usage_bytes: u64,
    pub headroom_bytes: u64,
    pub swap_bytes: u64,
    pub workers_desired: Option<u64>,
    pub workers_active: Option<u64>,
    pub low_mark_bytes: Option<u64>,
    pub high_mark_bytes: Option<u64>,
    pub reclaim_state: Option<String>,
    /// The agent's M3 zone (`green`, `yellow`, `red`) and thresholds, bytes.
    pub zone: Option<String>,
    pub m3_low_bytes: Option<u64>,
    pub m3_high_bytes: Option<u64>,
    pub m3_top_bytes: Option<u64>,
    /// The BE group's limit a peer set (Senpai), bytes.
    pub be_limit_bytes: Option<u64>,
    /// BE jobs killed since the run began (agent or peer).
    pub be_kills: Option<u64>,
    /// Memory stall (PSI `some`) of the LC service's and of the BE jobs' cgroup2
    /// groups since the phase began, µs.
    pub lc_psi_some_us: Option<u64>,
    pub be_psi_some_us: Option<u64>,
    /// Charges that found the node at its limit since the phase began
    /// (`memory.failcnt`): each one reclaimed on the charging task's own thread.
    pub node_limit_hits: Option<u64>,
    /// The LC service's major faults since the phase began.
    pub lc_major_faults: Option<u64>,
    /// Time the LC service's main thread waited runnable for a CPU since the phase
    /// began (`/proc/<pid>/schedstat`), ms; and the CPU time it ran, ms.
    pub lc_run_delay_ms: Option<f64>,
    pub lc_cpu_ms: Option<f64>,
    /// Busy time of the LC CPUs since the phase began, ms, and the part of it that
    /// neither the LC service nor this bench (its load generator) ran: other work on
    /// the LC CPUs (the agent stays off them), see [`LcCpuUse`].
    pub lc_cpus_busy_ms: Option<f64>,
    pub lc_cpus_foreign_ms: Option<f64>,
    /// Host steal on the LC CPUs since the phase began, ms (`/proc/stat` `steal`,
    /// 10 ms ticks): time their vCPUs wanted to run while the host ran something else.
    pub lc_cpus_steal_ms: Option<f64>,
}

/// Counters from which the LC CPUs' busy time and its foreign part follow: the BE
/// CPUs are saturated by the BE jobs, so the scheduler balances every other runnable
/// task of the machine (builds, tests, kernel threads) onto the LC CPUs, where it
/// queues in front of the LC service. `/proc/stat` busy ticks of the LC CPUs minus
/// the LC service's and this process's CPU ticks, in ticks. A lower bound on the
/// foreign part: this process's threads are subtracted wherever they ran, and the load
/// generator's runtime threads run on the BE CPUs at times.
#[derive(Clone, Copy, Debug)]
pub struct LcCpuUse {
    busy: u64,
    own: u64,
    steal: u64,
}

/// What the LC CPUs did between two [`LcCpuUse`] readings, ms.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LcCpuDelta {
    /// Busy (not idle, iowait or steal).
    pub busy_ms: f64,
    /// The busy part neither the LC service nor this bench ran (a lower bound).
    pub foreign_ms: f64,
    /// Host steal: the vCPU wanted to run and the host ran something else
    /// (`/proc/stat` `steal`, 10 ms ticks).
    pub steal_ms: f64,
}

impl LcCpuUse {
    pub fn read(lc_cpus: &Option<Vec<usize>>, lc_pid: i32) -> Option<LcCpuUse> {
        let (busy, steal) = process::read_cpus_busy_steal_ticks(lc_cpus.as_deref()?)?;
        let lc = process::read_stat(lc_pid).ok()?.cpu_ticks;
        let me = process::read_stat(std::process::id() as i32)
            .ok()?
            .cpu_ticks;
        Some(LcCpuUse {
            busy,
            own: lc + me,
            steal,
        })
    }

    /// What the LC CPUs did from `self` to `later`.
    pub fn since(&self, later: &LcCpuUse) -> LcCpuDelta {
        let ms = 1000.0 / process::clock_ticks_per_s().max(1) as f64;
        let busy = later.busy.saturating_sub(self.busy);
        let own = later.own.saturating_sub(self.own);
        LcCpuDelta {
            busy_ms: busy as f64 * ms,
            foreign_ms: busy.saturating_sub(own) as f64 * ms,
            steal_ms: later.steal.saturating_sub(self.steal) as f64 * ms,
        }
    }
}

/// The LC latency over the seconds of the measured phase in which the LC CPUs saw no
/// host steal, beside the verdict's figure over all requests (which stays the
/// verdict): it puts a number on how much of a tail the host's steal explains.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StealFreeLatency {
    /// Seconds (by the requests' due time) with at least one steal tick on the LC CPUs.
    pub steal_seconds: u32,
    /// Seconds with requests.
    pub seconds: u32,
    /// p99 of the requests due in the seconds without steal, µs (`None`: none such).
    pub p99_us: Option<u64>,
    /// Their share of all requests.
    pub request_share: f64,
}

/// [`StealFreeLatency`] from the timeline's cumulative LC-CPU steal
/// (`rows[i].lc_cpus_steal_ms` at `rows[i].t_s`, both from the start of the measured
/// phase) and the per-second latency histograms (index = second of due time). Steal
/// that rose between two samples marks every second the interval touches; a second
/// past the last sample counts as stolen when the last interval had steal, and as
/// clean otherwise.
pub fn steal_free_latency(
    rows: &[TimelineRow],
    per_sec: &[hdrhistogram::Histogram<u64>],
) -> StealFreeLatency {
    let mut stolen = vec![false; per_sec.len()];
    let mut prev = (0.0f64, 0.0f64);
    for r in rows {
        let Some(steal) = r.lc_cpus_steal_ms else {
            continue;
        };
        if steal > prev.1 {
            let from = prev.0.max(0.0).floor() as usize;
            let to = r.t_s.max(0.0).floor() as usize;
            for s in stolen.iter_mut().take(to + 1).skip(from) {
                *s = true;
            }
        }
        prev = (r.t_s, steal);
    }
    let mut h = crate::loadgen::new_histogram();
    let (mut all, mut out) = (0u64, StealFreeLatency::default());
    for (sec, hs) in per_sec.iter().enumerate() {
        if hs.is_empty() {
            continue;
        }
        out.seconds += 1;
        all += hs.len();
        if stolen[sec] {
            out.steal_seconds += 1;
        } else {
            let _ = h.add(hs);
        }
    }
    out.p99_us = (!h.is_empty()).then(|| h.value_at_quantile(0.99));
    out.request_share = if all > 0 {
        h.len() as f64 / all as f64
    } else {
        0.0
    };
    out
}

impl TimelineRow {
    /// Fills the agent's columns (reclaim, M3 zone and thresholds) from its `status`
    /// answer.
    pub fn set_agent(&mut self, status: &serde_json::Value) {
        self.zone = status["zone"].as_str().map(String::from);
        let t = &status["thresholds"];
        self.m3_low_bytes = t["low_bytes"].as_u64();
        self.m3_high_bytes = t["high_bytes"].as_u64();
        self.m3_top_bytes = t["top_bytes"].as_u64();
        let r = &status["reclaim"];
        self.workers_desired = r["workers_desired"].as_u64();
        self.workers_active = r["workers_active"].as_u64();
        self.low_mark_bytes = r["low_mark_bytes"].as_u64();
        self.high_mark_bytes = r["high_mark_bytes"].as_u64();
        self.reclaim_state = r["state"].as_str().map(String::from);
    }
}

/// `timeline-<tag>.csv`: node memory, reclaim workers and marks every 250 ms.
pub fn write_timeline(out: &Path, tag: &str, rows: &[TimelineRow]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)
            .map_err(|e| BenchError::Process(format!("timeline csv: {e}")))?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| BenchError::Process(format!("timeline csv: {e}")))?;
    let p = out.join(format!("timeline-{tag}.csv"));
    std::fs::write(&p, bytes).map_err(|e| BenchError::io(&p, e))
}

/// [`write_timeline`] and `latency-<tag>.csv` (per-second p50/p99/p99.9/max of
/// requests due in that second).
pub fn write_timelines(
    out: &Path,
    tag: &str,
    rows: &[TimelineRow],
    per_sec: &[hdrhistogram::Histogram<u64>],
) -> Result<()> {
    write_timeline(out, tag, rows)?;
    let mut text = String::from("second,requests,p50_us,p99_us,p999_us,max_us\n");
    for (i, h) in per_sec.iter().enumerate() {
        if h.is_empty() {
            continue;
        }
        text.push_str(&format!(
            "{i},{},{},{},{},{}\n",
            h.len(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max()
        ));
    }
    let p = out.join(format!("latency-{tag}.csv"));
    std::fs::write(&p, text).map_err(|e| BenchError::io(&p, e))
}
