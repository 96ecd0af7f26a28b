//! Fleet mode (issue 26, "Build" 3): `nodes` independent nodes, each running a mix of
//! processes sampled from the fleet's menu ([`node_mix`]) for a simulated day, each
//! node run once per management mode (an A/B of kernel alone against memcolo on the
//! same mixes) and per arm of an optional A/B of any setting ([`Ab`]: a subrelease
//! setting, a heap churn parameter or a calibration field, e.g. `skip_subrelease_s=0,60`
//! for TCMalloc-AS's Δ), and the nodes' figures aggregated into fleet figures
//! ([`FleetRow`]), huge page coverage and realized fragmentation included: every
//! process's heap is a [`crate::heap`] model whose subrelease decisions are
//! libmemcolo's own ([`crate::subrelease`]).
//!
//! Every node is a [`Node`] running the policy crate's own M3 monitor, Hermes advice
//! and Hermit scheduler, as in the single-node scenarios; nothing is re-implemented
//! for the fleet. Nodes run in parallel on `threads` OS threads; node `k`'s mix and
//! model draws come from seeds derived from the fleet's seed and `k` only, so the
//! figures do not depend on the thread count or the order the nodes finish in.
//!
//! The menu per node (sizes are shares of the node's memory, times of the day):
//! - 1–2 LC services, working set 4–12 %, 1,000–4,000 requests/s, all day;
//! - 4–12 batch jobs, each an anonymous holder (5–25 %) or a file streamer (file
//!   10–40 %, 256 MiB/s–1 GiB/s of reads), starting at a uniform time of the day and
//!   running 30 min–8 h;
//! - 0–2 elastic caches wanting 10–35 %, started in the first hour, all day.
//!
//! Demand is sampled independently of the node's size, so some nodes are
//! oversubscribed part of the day and most are not, as in a fleet.

use crate::calib::Calibration;
use crate::heap::{Churn, HeapStats, NodeHeaps, PAGE_BYTES};
use crate::node::{Mode, Node, NodeConfig, NodeStats, ProcSpec, Workload};
use crate::subrelease::Settings;
use rand_xoshiro::rand_core::{Rng as _, SeedableRng};
use rand_xoshiro::SplitMix64;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const MIB: f64 = (1u64 << 20) as f64;

/// LC requests sampled per step and LC process in a fleet: a day at 1 s steps gives
/// 345,600 samples per service, enough for its p99, and sampling is most of a node's
/// cost.
pub const FLEET_LC_SAMPLES_PER_STEP: usize = 4;

/// A fleet run's settings.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// Number of nodes.
    pub nodes: u32,
    /// Memory of every node, bytes.
    pub node_bytes: u64,
    /// Swap (far tier) of every node, bytes.
    pub swap_bytes: u64,
    /// Simulated time per node.
    pub duration: Duration,
    /// Step of the node model.
    pub step: Duration,
    /// The fleet's seed: node `k` draws from `seed` and `k`.
    pub seed: u64,
    pub calib: Calibration,
    /// LC latency SLO, µs.
    pub slo_us: f64,
    /// OS threads running nodes.
    pub threads: usize,
}

struct Draw(SplitMix64);

impl Draw {
    fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    fn int(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.0.next_u64() % u64::from(hi - lo + 1)) as u32
    }
}

/// The seed of node `k` in a fleet seeded `seed` (SplitMix64 of both, so nearby
/// seeds and nodes give unrelated draws).
pub fn node_seed(seed: u64, k: u32) -> u64 {
    SplitMix64::seed_from_u64(seed ^ (u64::from(k) << 32 | u64::from(k))).next_u64()
}

/// Node `k`'s processes for a day of `day_s` seconds, drawn from the fleet's menu
/// (module docs) with `seed`.
pub fn node_mix(node_bytes: u64, day_s: f64, seed: u64) -> Vec<ProcSpec> {
    let mut d = Draw(SplitMix64::seed_from_u64(seed));
    let node = node_bytes as f64;
    let mut v = Vec::new();
    for k in 0..d.int(1, 2) {
        v.push(ProcSpec {
            name: format!("lc-{k}"),
            start_s: 0.0,
            cap_bytes: None,
            stop_s: None,
            workload: Workload::Lc {
                ws_bytes: (node * d.range(0.04, 0.12)) as u64,
                grow_bytes_per_s: 1024.0 * MIB,
                rate: d.range(1000.0, 4000.0),
            },
        });
    }
    for k in 0..d.int(4, 12) {
        let start_s = d.range(0.0, day_s * 0.9);
        let stop_s = Some(start_s + d.range(1800.0, 8.0 * 3600.0));
        let (name, workload) = if d.unit() < 0.5 {
            (
                format!("be-anon-{k}"),
                Workload::BeAnon {
                    size_bytes: (node * d.range(0.05, 0.25)) as u64,
                    grow_bytes_per_s: 256.0 * MIB,
                    touch_bytes_per_s: 256.0 * MIB,
                },
            )
        } else {
            (
                format!("be-file-{k}"),
                Workload::BeFile {
                    file_bytes: (node * d.range(0.10, 0.40)) as u64,
                    read_bytes_per_s: d.range(256.0, 1024.0) * MIB,
                },
            )
        };
        v.push(ProcSpec {
            name,
            start_s,
            cap_bytes: None,
            stop_s,
            workload,
        });
    }
    for k in 0..d.int(0, 2) {
        let want = node * d.range(0.10, 0.35);
        v.push(ProcSpec {
            name: format!("elastic-{k}"),
            start_s: d.range(0.0, 3600.0f64.min(day_s / 2.0)),
            cap_bytes: None,
            stop_s: None,
            workload: Workload::Elastic {
                want_bytes: want as u64,
                floor_bytes: (node * 0.02) as u64,
                grow_bytes_per_s: 512.0 * MIB,
                layer_bytes: (node / 64.0).max(MIB) as u64,
                miss_penalty: 2.0,
                work_s: 1e12,
                num_epochs: memcolo_sdk::gate::DEFAULT_NUM_EPOCHS,
            },
        });
    }
    v
}

/// One arm of a fleet run: the settings its nodes and heaps run with.
#[derive(Clone, Debug)]
pub struct Arm {
    /// `KEY=VALUE` of the A/B, or empty without one.
    pub label: String,
    pub calib: Calibration,
    /// The heaps' subrelease settings (libmemcolo's defaults unless the A/B sets one).
    pub subrelease: Settings,
    pub churn: Churn,
}

impl Arm {
    /// The arm of no A/B: `f`'s calibration, libmemcolo's and the churn's defaults.
    pub fn base(f: &FleetConfig) -> Arm {
        Arm {
            label: String::new(),
            calib: f.calib.clone(),
            subrelease: Settings::default(),
            churn: Churn::default(),
        }
    }

    /// This arm with setting `key` (a field of [`Settings`], [`Churn`] or
    /// [`Calibration`]) set to the JSON `value`; the label is kept.
    pub fn with(&self, key: &str, value: &str) -> anyhow::Result<Arm> {
        fn set<T: Serialize + serde::de::DeserializeOwned>(
            v: &T,
            key: &str,
            value: &serde_json::Value,
        ) -> anyhow::Result<Option<T>> {
            let mut o = serde_json::to_value(v)?;
            let Some(slot) = o.get_mut(key) else {
                return Ok(None);
            };
            *slot = value.clone();
            Ok(Some(
                serde_json::from_value(o).map_err(|e| anyhow::anyhow!("{key}={value}: {e}"))?,
            ))
        }
        let value: serde_json::Value = serde_json::from_str(value)
            .map_err(|e| anyhow::anyhow!("{key}={value}: not JSON: {e}"))?;
        let mut arm = self.clone();
        if let Some(s) = set(&arm.subrelease, key, &value)? {
            arm.subrelease = s;
        } else if let Some(c) = set(&arm.churn, key, &value)? {
            arm.churn = c;
        } else if let Some(c) = set(&arm.calib, key, &value)? {
            c.validate()?;
            arm.calib = c;
        } else {
            anyhow::bail!(
                "{key} is not a subrelease setting, a churn parameter or a calibration field"
            );
        }
        anyhow::ensure!(
            (1..=crate::subrelease::WINDOW_MAX_S).contains(&arm.subrelease.t_schedule_s)
                && arm.subrelease.skip_subrelease_s <= crate::subrelease::WINDOW_MAX_S,
            "{key}={value}: skip_subrelease_s must be in 0..=900 and t_schedule_s in 1..=900"
        );
        let c = &arm.churn;
        anyhow::ensure!(
            c.trough_depth.iter().all(|d| (0.0..=1.0).contains(d))
                && c.peak_s
                    .iter()
                    .chain(&c.trough_s)
                    .all(|s| s.is_finite() && *s >= 1.0)
                && (0.0..=1.0).contains(&c.heal_per_s)
                && (0.0..=1.0).contains(&c.free_share_released),
            "{key}={value}: churn depths and shares in 0..=1, durations >= 1 s"
        );
        Ok(arm)
    }
}

/// An A/B of one setting over the same mixes: `KEY=V1,V2,...` where KEY is a field of
/// [`Settings`] (`skip_subrelease_s`, `t_schedule_s`, `release_rate_bytes`), of
/// [`Churn`] or of [`Calibration`], and each value is JSON (a number, or an array for
/// the churn's ranges; commas inside brackets do not split).
#[derive(Clone, Debug, PartialEq)]
pub struct Ab {
    pub key: String,
    pub values: Vec<String>,
}

impl Ab {
    /// Parses `KEY=V1,V2,...` (at least one value).
    pub fn parse(s: &str) -> anyhow::Result<Ab> {
        let (key, vals) = s
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--ab wants KEY=V1,V2,... (got {s:?})"))?;
        let mut values = Vec::new();
        let (mut depth, mut cur) = (0i32, String::new());
        for ch in vals.chars() {
            match ch {
                '[' => depth += 1,
                ']' => depth -= 1,
                ',' if depth == 0 => {
                    values.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
            cur.push(ch);
        }
        values.push(cur);
        let values: Vec<String> = values.into_iter().map(|v| v.trim().to_string()).collect();
        anyhow::ensure!(
            !key.trim().is_empty() && values.iter().all(|v| !v.is_empty()),
            "--ab wants KEY=V1,V2,... (got {s:?})"
        );
        Ok(Ab {
            key: key.trim().to_string(),
            values,
        })
    }

    /// The arms, one per value, each `base` with the A/B's setting applied.
    pub fn arms(&self, base: &Arm) -> anyhow::Result<Vec<Arm>> {
        self.values
            .iter()
            .map(|v| {
                let mut arm = base.with(&self.key, v)?;
                arm.label = format!("{}={v}", self.key);
                Ok(arm)
            })
            .collect()
    }
}

/// The fleet's figures under one management mode (and arm of an A/B).
#[derive(Clone, Debug, Serialize)]
pub struct FleetRow {
    /// `kernel` or `memcolo`.
    pub mode: String,
    /// The A/B arm (`KEY=VALUE`), empty without an A/B.
    pub arm: String,
    pub nodes: u32,
    pub processes: usize,
    pub simulated_s_per_node: f64,
    /// Wall-clock time of this mode's nodes, seconds (machine-dependent: a benchmark
    /// figure).
    pub wall_s: f64,
    /// Mean over nodes of their mean resident memory / node memory.
    pub utilisation: f64,
    /// Median over nodes of their LC p99, µs.
    pub lc_p99_median_us: f64,
    /// 95th percentile over nodes of their LC p99, µs (the fleet's bad nodes).
    pub lc_p99_p95_us: f64,
    /// Largest node LC p99, µs.
    pub lc_p99_max_us: f64,
    /// Share of all LC requests slower than the SLO.
    pub slo_violation_ratio: f64,
    /// Mean over nodes of the share of seconds whose LC p99 exceeded the SLO.
    pub slo_violation_seconds_ratio: f64,
    /// LC time stalled in direct reclaim and faults, seconds, all nodes.
    pub lc_stall_s: f64,
    /// Batch work: bytes read (streamers) and touched (holders), TiB, all nodes.
    pub be_work_tib: f64,
    /// Elastic caches' work, seconds of full-speed work, all nodes.
    pub elastic_work_s: f64,
    pub m3_kills: u64,
    pub oom_kills: u64,
    /// Notifications M3 sent, all nodes.
    pub notifications: u64,
    /// Largest swap use of any node, share of its swap.
    pub peak_swap_ratio: f64,
    /// Share of heap memory in use on intact huge pages, time-weighted over the fleet
    /// (ISMM'21 §5's huge page coverage; [`crate::heap`]).
    pub hugepage_coverage: f64,
    /// Realized fragmentation (least free-but-mapped heap memory over `T_schedule`,
    /// ISMM'21 §3.2) over heap memory in use, at minute samples.
    pub realized_fragmentation_ratio: f64,
    /// Free but mapped heap memory over heap memory in use, time-weighted: what the
    /// heaps hold beyond their demand (the memory subrelease saves or keeps).
    pub heap_free_ratio: f64,
    /// Mean free but mapped heap memory per node, GiB.
    pub heap_free_gib_per_node: f64,
    /// Heap memory subreleased, TiB, all nodes.
    pub subreleased_tib: f64,
    /// Huge pages broken by subrelease, all nodes.
    pub hugepages_broken: u64,
    /// Skipped releases confirmed by demand within Δ, share of those judged (§4.2).
    pub skipped_correct_ratio: f64,
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Added to a node's seed for its heaps' churn, which stays apart from the node
/// model's draws (an A/B of a heap setting runs the same node model).
const HEAP_SEED: u64 = 0x6865_6170_5f63_6875;

/// Runs every node of the fleet under `mode` and `arm`; returns the nodes' statistics
/// and heap figures in node order.
pub fn run_nodes(
    f: &FleetConfig,
    mode: Mode,
    arm: &Arm,
) -> anyhow::Result<Vec<(NodeStats, HeapStats)>> {
    anyhow::ensure!(f.nodes > 0, "a fleet needs at least one node");
    let day_s = f.duration.as_secs_f64();
    let next = AtomicUsize::new(0);
    type Out = anyhow::Result<(NodeStats, HeapStats)>;
    let out: Mutex<Vec<Option<Out>>> = Mutex::new((0..f.nodes).map(|_| None).collect());
    let run_one = |k: u32| -> Out {
        let seed = node_seed(f.seed, k);
        let mut node = Node::new(
            NodeConfig {
                total_bytes: f.node_bytes,
                swap_bytes: f.swap_bytes,
                step: f.step,
                seed,
                mode,
                calib: arm.calib.clone(),
                poll: Duration::from_secs(1),
                slo_us: f.slo_us,
                reclaim_workers: 1,
                measure_from: Duration::ZERO,
                lc_samples_per_step: FLEET_LC_SAMPLES_PER_STEP,
            },
            node_mix(f.node_bytes, day_s, seed),
        )?;
        let mut heaps = NodeHeaps::new(arm.subrelease, arm.churn, seed ^ HEAP_SEED);
        while node.now() < f.duration {
            node.step();
            heaps.observe(node.now().as_millis() as u64, node.anon_footprints());
        }
        let heap = heaps.finish(node.now().as_millis() as u64);
        Ok((node.finish(), heap))
    };
    std::thread::scope(|s| {
        for _ in 0..f.threads.clamp(1, 256) {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= f.nodes as usize {
                    break;
                }
                let r = run_one(k as u32);
                out.lock().expect("no thread panics holding it")[k] = Some(r);
            });
        }
    });
    out.into_inner()
        .expect("no thread panicked holding it")
        .into_iter()
        .map(|r| r.expect("every node ran"))
        .collect()
}

/// Aggregates the nodes of one mode and arm into the fleet's figures.
pub fn aggregate(
    f: &FleetConfig,
    mode: Mode,
    arm: &Arm,
    runs: &[(NodeStats, HeapStats)],
    wall_s: f64,
) -> FleetRow {
    let nodes: Vec<NodeStats> = runs.iter().map(|r| r.0.clone()).collect();
    let nodes = &nodes[..];
    let mut heap = HeapStats::default();
    for r in runs {
        heap.merge(&r.1);
    }
    let mut p99: Vec<f64> = nodes.iter().map(|s| s.lc.p99_us).collect();
    let requests: f64 = nodes.iter().map(|s| s.lc.requests).sum();
    let slow: f64 = nodes
        .iter()
        .map(|s| s.lc.requests * s.lc.slo_violation_ratio)
        .sum();
    let procs = nodes.iter().flat_map(|s| s.procs.iter());
    let mut lc_stall_s = 0.0;
    let mut be_work = 0.0;
    let mut elastic_work_s = 0.0;
    for p in procs.clone() {
        match p.class.as_str() {
            "lc" => lc_stall_s += p.direct_reclaim_s + p.fault_s,
            "be" => be_work += p.progress,
            _ => elastic_work_s += p.progress,
        }
    }
    let n = nodes.len().max(1) as f64;
    FleetRow {
        mode: mode.as_str().into(),
        arm: arm.label.clone(),
        nodes: f.nodes,
        processes: procs.count(),
        simulated_s_per_node: f.duration.as_secs_f64(),
        wall_s,
        utilisation: nodes.iter().map(|s| s.utilisation).sum::<f64>() / n,
        lc_p99_median_us: quantile(&mut p99, 0.5),
        lc_p99_p95_us: quantile(&mut p99, 0.95),
        lc_p99_max_us: quantile(&mut p99, 1.0),
        slo_violation_ratio: if requests > 0.0 { slow / requests } else { 0.0 },
        slo_violation_seconds_ratio: nodes
            .iter()
            .map(|s| s.lc.slo_violation_seconds_ratio)
            .sum::<f64>()
            / n,
        lc_stall_s,
        be_work_tib: be_work / (1u64 << 40) as f64,
        elastic_work_s,
        m3_kills: nodes.iter().map(|s| s.m3_kills).sum(),
        oom_kills: nodes.iter().map(|s| s.oom_kills).sum(),
        notifications: nodes.iter().map(|s| s.signals.iter().sum::<u64>()).sum(),
        peak_swap_ratio: if f.swap_bytes > 0 {
            nodes
                .iter()
                .map(|s| s.peak_swapped_bytes as f64 / f.swap_bytes as f64)
                .fold(0.0, f64::max)
        } else {
            0.0
        },
        hugepage_coverage: heap.coverage(),
        realized_fragmentation_ratio: heap.realized_fragmentation_ratio(),
        heap_free_ratio: heap.free_ratio(),
        heap_free_gib_per_node: heap.free_page_s * PAGE_BYTES as f64
            / f.duration.as_secs_f64().max(1.0)
            / n
            / (1u64 << 30) as f64,
        subreleased_tib: heap.subreleased_pages as f64 * PAGE_BYTES as f64 / (1u64 << 40) as f64,
        hugepages_broken: heap.hugepages_broken,
        skipped_correct_ratio: {
            let judged = heap.correct_pages + heap.incorrect_pages;
            if judged > 0 {
                heap.correct_pages as f64 / judged as f64
            } else {
                0.0
            }
        },
    }
}

/// The fleet under each of `modes` (the same mixes), one row per mode.
pub fn fleet(f: &FleetConfig, modes: &[Mode]) -> anyhow::Result<Vec<FleetRow>> {
    fleet_ab(f, modes, &Arm::base(f), None)
}

/// The fleet under each of `modes` and each arm of `ab` on top of `base` (the same
/// mixes), one row per arm and mode.
pub fn fleet_ab(
    f: &FleetConfig,
    modes: &[Mode],
    base: &Arm,
    ab: Option<&Ab>,
) -> anyhow::Result<Vec<FleetRow>> {
    let arms = match ab {
        Some(ab) => ab.arms(base)?,
        None => vec![base.clone()],
    };
    let mut rows = Vec::new();
    for arm in &arms {
        for &mode in modes {
            let t0 = Instant::now();
            let nodes = run_nodes(f, mode, arm)?;
            rows.push(aggregate(f, mode, arm, &nodes, t0.elapsed().as_secs_f64()));
        }
    }
    Ok(rows)
}
