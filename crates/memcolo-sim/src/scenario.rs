//! The scenarios `memcolo sim` runs: the workloads of the papers' experiments and of
//! the benches on this machine, built as [`ProcSpec`]s over a [`Node`].
//!
//! - [`colocation`]: Hermes §5.1's colocation levels, as `bench/colocation` runs them
//!   (its README, "Method"): one LC service (a Redis-like store holding 1/16 of the
//!   node, 2,000 requests/s) beside batch jobs whose memory demand is `level` % of the
//!   node, split file : anon : elastic = 2 : 1 : 1 (a streamer, an anonymous holder,
//!   an elastic cache static at its share under the kernel alone and free to grow to
//!   1.5 × its share, the bench cache's key space, under memcolo). LC latency is recorded after a 10 s warm-up. Each
//!   level runs with the kernel alone and with memcolo (M3, Hermes, Hermit; the
//!   bench's `agent` mode: libmemcolo is not modelled).
//! - [`m3_elastic`]: M3 Fig. 5-like: three elastic caches started 30 s apart (`--stagger`), each
//!   wanting 45 % of the node, with M3 against a static partition (each capped at a
//!   third of the top of memory, no monitor).
//! - [`scale`]: the scale benchmark: a node of `node_mem` (1 TiB by default) with 100
//!   processes (10 LC, 30 batch anonymous, 30 batch file, 30 elastic) under memcolo.

use crate::calib::Calibration;
use crate::node::{Mode, Node, NodeConfig, NodeStats, ProcSpec, Workload};
use serde::Serialize;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// What every scenario shares.
#[derive(Clone, Debug)]
pub struct Common {
    pub node_bytes: u64,
    pub swap_bytes: u64,
    pub duration: Duration,
    pub step: Duration,
    pub seed: u64,
    pub calib: Calibration,
    pub slo_us: f64,
    /// LC latency is recorded from this time on.
    pub warmup: Duration,
    /// [`NodeConfig::lc_samples_per_step`].
    pub lc_samples_per_step: usize,
}

impl Common {
    pub(crate) fn node(&self, mode: Mode, procs: Vec<ProcSpec>) -> anyhow::Result<Node> {
        Node::new(
            NodeConfig {
                total_bytes: self.node_bytes,
                swap_bytes: self.swap_bytes,
                step: self.step,
                seed: self.seed,
                mode,
                calib: self.calib.clone(),
                poll: Duration::from_secs(1),
                slo_us: self.slo_us,
                reclaim_workers: 1,
                measure_from: self.warmup,
                lc_samples_per_step: self.lc_samples_per_step,
            },
            procs,
        )
    }
}

/// One (level, mode) of the colocation scenario.
#[derive(Clone, Debug, Serialize)]
pub struct ColocationRow {
    /// BE demand, % of the memory the LC service leaves.
    pub level: u32,
    pub mode: String,
    pub lc_p50_us: f64,
    pub lc_p99_us: f64,
    pub lc_p999_us: f64,
    /// Share of LC requests slower than the SLO.
    pub slo_violation_ratio: f64,
    /// Share of seconds whose LC p99 exceeded the SLO.
    pub slo_violation_seconds_ratio: f64,
    /// Mean resident memory / node memory.
    pub utilisation: f64,
    /// Seconds the LC service spent in direct reclaim.
    pub lc_direct_reclaim_s: f64,
    /// Bytes the LC service swapped in.
    pub lc_swapin_bytes: u64,
    /// Batch progress: file streamer MiB read, anonymous holder MiB touched.
    pub be_file_mib: f64,
    pub be_anon_mib: f64,
    /// Elastic cache progress, seconds of full-speed work.
    pub be_elastic_work_s: f64,
    pub m3_kills: u64,
    pub oom_kills: u64,
    pub hermit_reclaimed_mib: f64,
    pub hermes_dropped_mib: f64,
}

/// The processes of the colocation scenario at `level` (% of `node_bytes`); under
/// the kernel alone (`elastic_static`) the elastic cache is capped at its share.
pub fn colocation_procs(node_bytes: u64, level: u32, elastic_static: bool) -> Vec<ProcSpec> {
    colocation_procs_with(
        node_bytes,
        level,
        elastic_static,
        &ColocationShape::default_for(node_bytes),
    )
}

/// What the colocation scenario copies from the bench run it stands for.
#[derive(Clone, Debug)]
pub struct ColocationShape {
    /// The LC service's working set, bytes (default 1/16 of the node).
    pub lc_ws_bytes: u64,
    /// Its request rate, per second (default 2,000, the bench's `--quick` rate).
    pub rate: f64,
    /// The file streamer's read rate, bytes/s (default 2 GiB/s, as fast as the page
    /// cache serves it; the bench's `fio` got far less CPU on its shared BE vCPU, see
    /// [`crate::validate::Reference::be_file_read_bytes_per_s`]).
    pub file_read_bytes_per_s: f64,
}

impl ColocationShape {
    /// The defaults for a node of `node_bytes`.
    pub fn default_for(node_bytes: u64) -> ColocationShape {
        ColocationShape {
            lc_ws_bytes: node_bytes / 16,
            rate: 2000.0,
            file_read_bytes_per_s: 2048.0 * MIB as f64,
        }
    }
}

/// [`colocation_procs`] with the shape given, as `memcolo sim --validate` copies it
/// from a bench run.
pub fn colocation_procs_with(
    node_bytes: u64,
    level: u32,
    elastic_static: bool,
    shape: &ColocationShape,
) -> Vec<ProcSpec> {
    let (lc_ws, rate) = (shape.lc_ws_bytes, shape.rate);
    let be = node_bytes as f64 * level as f64 / 100.0;
    let mut v = vec![ProcSpec {
        name: "lc".into(),
        start_s: 0.0,
        cap_bytes: None,
        stop_s: None,
        workload: Workload::Lc {
            ws_bytes: lc_ws,
            grow_bytes_per_s: 1024.0 * MIB as f64,
            rate,
        },
    }];
    if level > 0 {
        let elastic_share = (be / 4.0) as u64;
        v.push(ProcSpec {
            name: "be-file".into(),
            start_s: 1.0,
            cap_bytes: None,
            stop_s: None,
            workload: Workload::BeFile {
                file_bytes: (be / 2.0) as u64,
                read_bytes_per_s: shape.file_read_bytes_per_s,
            },
        });
        v.push(ProcSpec {
            name: "be-anon".into(),
            start_s: 1.0,
            cap_bytes: None,
            stop_s: None,
            workload: Workload::BeAnon {
                size_bytes: (be / 4.0) as u64,
                grow_bytes_per_s: 256.0 * MIB as f64,
                touch_bytes_per_s: 256.0 * MIB as f64,
            },
        });
        v.push(ProcSpec {
            name: "be-elastic".into(),
            start_s: 1.0,
            cap_bytes: elastic_static.then_some(elastic_share),
            stop_s: None,
            workload: Workload::Elastic {
                // The bench's cache: its key space is 1.5 × its share
                // (`crates/memcolo-bench/src/elastic.rs`).
                want_bytes: elastic_share / 2 * 3,
                floor_bytes: 0,
                grow_bytes_per_s: 256.0 * MIB as f64,
                layer_bytes: (node_bytes / 64).max(MIB),
                miss_penalty: 2.0,
                work_s: 1e9,
                num_epochs: memcolo_sdk::gate::DEFAULT_NUM_EPOCHS,
            },
        });
    }
    v
}

fn proc_sum(s: &NodeStats, name: &str, f: impl Fn(&crate::node::ProcStats) -> f64) -> f64 {
    s.procs.iter().filter(|p| p.name == name).map(f).sum()
}

/// Hermes §5.1's colocation levels, kernel alone and memcolo.
pub fn colocation(c: &Common, levels: &[u32]) -> anyhow::Result<Vec<ColocationRow>> {
    colocation_with(c, levels, &ColocationShape::default_for(c.node_bytes))
}

/// [`colocation`] with the shape given ([`colocation_procs_with`]).
pub fn colocation_with(
    c: &Common,
    levels: &[u32],
    shape: &ColocationShape,
) -> anyhow::Result<Vec<ColocationRow>> {
    let mut rows = Vec::new();
    for &level in levels {
        for mode in [Mode::Kernel, Mode::Memcolo] {
            let procs = colocation_procs_with(c.node_bytes, level, mode == Mode::Kernel, shape);
            let mut node = c.node(mode, procs)?;
            node.run(c.duration);
            let s = node.finish();
            rows.push(ColocationRow {
                level,
                mode: mode.as_str().into(),
                lc_p50_us: s.lc.p50_us,
                lc_p99_us: s.lc.p99_us,
                lc_p999_us: s.lc.p999_us,
                slo_violation_ratio: s.lc.slo_violation_ratio,
                slo_violation_seconds_ratio: s.lc.slo_violation_seconds_ratio,
                utilisation: s.utilisation,
                lc_direct_reclaim_s: proc_sum(&s, "lc", |p| p.direct_reclaim_s),
                lc_swapin_bytes: proc_sum(&s, "lc", |p| p.swapin_bytes as f64) as u64,
                be_file_mib: proc_sum(&s, "be-file", |p| p.progress) / MIB as f64,
                be_anon_mib: proc_sum(&s, "be-anon", |p| p.progress) / MIB as f64,
                be_elastic_work_s: proc_sum(&s, "be-elastic", |p| p.progress),
                m3_kills: s.m3_kills,
                oom_kills: s.oom_kills,
                hermit_reclaimed_mib: s.hermit_reclaimed_bytes as f64 / MIB as f64,
                hermes_dropped_mib: s.hermes_dropped_bytes as f64 / MIB as f64,
            });
        }
    }
    Ok(rows)
}

/// One elastic job of the m3-elastic scenario under one management.
#[derive(Clone, Debug, Serialize)]
pub struct ElasticRow {
    pub job: String,
    /// `m3` (the monitor and the SDK's reclaim) or `static` (a third of the top each).
    pub mode: String,
    pub start_s: f64,
    /// Run time from start to finish, seconds (`None`: not finished in the duration).
    pub run_s: Option<f64>,
    /// Static run time ÷ this run time (1 for the static rows).
    pub speedup: Option<f64>,
    pub notifications_low: u64,
    pub notifications_high: u64,
    pub notifications_top: u64,
    pub peak_resident_mib: f64,
    pub oom_killed: bool,
}

/// The three elastic jobs, started `stagger_s` apart.
pub fn elastic_procs(node_bytes: u64, capped: bool, stagger_s: f64) -> Vec<ProcSpec> {
    let top = node_bytes / 64 * 62;
    (0..3)
        .map(|k| ProcSpec {
            name: format!("elastic-{k}"),
            start_s: stagger_s * k as f64,
            cap_bytes: capped.then_some(top / 3),
            stop_s: None,
            workload: Workload::Elastic {
                want_bytes: node_bytes / 100 * 45,
                floor_bytes: node_bytes / 10,
                grow_bytes_per_s: node_bytes as f64 / 50.0,
                layer_bytes: node_bytes / 50,
                miss_penalty: 2.0,
                work_s: 120.0,
                num_epochs: memcolo_sdk::gate::DEFAULT_NUM_EPOCHS,
            },
        })
        .collect()
}

/// M3 Fig. 5-like: three staggered elastic jobs, M3 against a static partition.
pub fn m3_elastic(c: &Common, stagger_s: f64) -> anyhow::Result<Vec<ElasticRow>> {
    let mut out = Vec::new();
    let mut static_runs = Vec::new();
    for (mode, capped, label) in [(Mode::Kernel, true, "static"), (Mode::Memcolo, false, "m3")] {
        let specs = elastic_procs(c.node_bytes, capped, stagger_s);
        let mut node = c.node(mode, specs.clone())?;
        node.run(c.duration);
        let s = node.finish();
        for (k, (spec, p)) in specs.iter().zip(&s.procs).enumerate() {
            let run_s = p.finished_s.map(|f| f - spec.start_s);
            if capped {
                static_runs.push(run_s);
            }
            let speedup = match (static_runs.get(k).copied().flatten(), run_s) {
                (Some(st), Some(r)) if r > 0.0 => Some(st / r),
                _ => None,
            };
            out.push(ElasticRow {
                job: spec.name.clone(),
                mode: label.into(),
                start_s: spec.start_s,
                run_s,
                speedup,
                notifications_low: p.notifications[0],
                notifications_high: p.notifications[1],
                notifications_top: p.notifications[2],
                peak_resident_mib: p.peak_resident_bytes as f64 / MIB as f64,
                oom_killed: p.killed_by_oom,
            });
        }
    }
    Ok(out)
}

/// The scale benchmark's result.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleRow {
    pub node_gib: f64,
    pub processes: usize,
    pub simulated_s: f64,
    pub steps: u64,
    /// Wall-clock time of the run, seconds (machine-dependent: a benchmark figure).
    pub wall_s: f64,
    pub utilisation: f64,
    pub signals: u64,
    pub m3_kills: u64,
    pub oom_kills: u64,
}

/// 100 processes on a node of `node_bytes`: 10 LC, 30 batch anonymous, 30 batch file
/// and 30 elastic, started over the first 100 s.
pub fn scale_procs(node_bytes: u64) -> Vec<ProcSpec> {
    let unit = node_bytes / 100;
    let mut v = Vec::new();
    for k in 0..100u32 {
        let start_s = k as f64;
        let (name, workload) = match k % 10 {
            0 => (
                "lc",
                Workload::Lc {
                    ws_bytes: unit * 2,
                    grow_bytes_per_s: (1u64 << 30) as f64,
                    rate: 2000.0,
                },
            ),
            1..=3 => (
                "be-anon",
                Workload::BeAnon {
                    size_bytes: unit * 2,
                    grow_bytes_per_s: 256.0 * MIB as f64,
                    touch_bytes_per_s: 256.0 * MIB as f64,
                },
            ),
            4..=6 => (
                "be-file",
                Workload::BeFile {
                    file_bytes: unit * 2,
                    read_bytes_per_s: 1024.0 * MIB as f64,
                },
            ),
            _ => (
                "elastic",
                Workload::Elastic {
                    want_bytes: unit * 3,
                    floor_bytes: unit / 2,
                    grow_bytes_per_s: 512.0 * MIB as f64,
                    layer_bytes: unit / 8,
                    miss_penalty: 2.0,
                    work_s: 1e9,
                    num_epochs: memcolo_sdk::gate::DEFAULT_NUM_EPOCHS,
                },
            ),
        };
        v.push(ProcSpec {
            name: format!("{name}-{k}"),
            start_s,
            cap_bytes: None,
            stop_s: None,
            workload,
        });
    }
    v
}

/// Runs the scale benchmark under memcolo and times it.
pub fn scale(c: &Common) -> anyhow::Result<Vec<ScaleRow>> {
    let procs = scale_procs(c.node_bytes);
    let n = procs.len();
    let t0 = Instant::now();
    let mut node = c.node(Mode::Memcolo, procs)?;
    node.run(c.duration);
    let s = node.finish();
    let wall_s = t0.elapsed().as_secs_f64();
    Ok(vec![ScaleRow {
        node_gib: c.node_bytes as f64 / (1u64 << 30) as f64,
        processes: n,
        simulated_s: s.simulated_s,
        steps: (s.simulated_s / c.step.as_secs_f64()).round() as u64,
        wall_s,
        utilisation: s.utilisation,
        signals: s.signals.iter().sum(),
        m3_kills: s.m3_kills,
        oom_kills: s.oom_kills,
    }])
}
