//! `memcolo bench reclaim --batch`: Hermit's batch throughput experiment (NSDI'23,
//! "High throughput for batch applications": Spark / XGBoost jobs with 50–100 % of
//! their working set in local memory, the rest in far memory).
//!
//! A real batch job — k-means with numpy (`bench/reclaim/kmeans.py`, built into the
//! binary) — runs alone in a scratch cgroup v1 node whose `memory.limit_in_bytes` is
//! each level's share of the job's working set; the rest of the working set lives in
//! zram swap (the far memory here). Every k-means iteration reads all points, so
//! under the limit each iteration swaps in what does not fit and the kernel must swap
//! out as much to make room. Completion time is compared between:
//!
//! - `kernel`: the kernel alone. The job's faults find the node at its limit and
//!   reclaim on the job's own thread (v1 memcg has no background reclaim): every
//!   swap-in waits for a swap-out — zram compression, unmap, TLB shootdown.
//! - `fixed`, `reclaim`: `memcolo agent` managing the node with the job registered as
//!   BE: its workers keep headroom in the node by reclaiming from the job's group on
//!   their own threads, off the job's CPU, so the job's faults only swap in. Same
//!   kernel LRU choosing the pages; the swap-out work moves to another core.
//!
//! Working set: the job's peak RSS in a calibration run under no pressure (points,
//! interpreter, temporaries). Each (level, mode) runs `repeats` times, interleaved
//! (repeat-major), so slow drift of a shared machine spreads over every mode.
//! Outputs in `--out` (default `bench/out/reclaim-batch/<date>-<host>`):
//! `batch.csv` (one row per run), `batch-summary.csv` (medians per level and mode,
//! speedup over the kernel alone), `batch-report.md`, and
//! `timeline-batch-<level>-<mode>-<repeat>.csv` (node usage, headroom, swap, limit
//! hits, reclaim workers and marks every 250 ms).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use memcolo_proto::Class;

use crate::agent::{AgentProcess, AgentSpec};
use crate::cgroup::ScratchNode;
use crate::colocation::{ColocationArgs, Mode};
use crate::error::{BenchError, Result};
use crate::harness::{default_out_dir, hostname, mem_total_bytes, progress, which};
use crate::process::{self, ChildPlacement};
use crate::report;
use crate::size::format_bytes;
use crate::timeline::{write_timeline, TimelineRow};
use crate::zram::ZramSwap;

/// The k-means job, built in so the binary does not depend on the source tree.
const KMEANS_PY: &str = include_str!("../../../bench/reclaim/kmeans.py");

/// The interpreter the job runs with (Debian's, which has python3-numpy).
const PYTHON: &str = "/usr/bin/python3";

/// [`ColocationArgs`] of a `--batch` run with defaults applied and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchSettings {
    /// Local memory, percent of the job's working set.
    pub levels: Vec<u32>,
    pub modes: Vec<Mode>,
    /// Bytes of k-means points.
    pub points_bytes: u64,
    pub iters: u32,
    pub repeats: u32,
    pub out: PathBuf,
    /// CPU the job is pinned to (`None`: not pinned).
    pub job_cpu: Option<usize>,
}

impl BatchSettings {
    /// Applies the batch defaults (levels 100,70,50; modes kernel,fixed,reclaim; 1 GiB
    /// of points; 8 iterations and 3 repeats, 5 and 2 with `--quick`) and checks ranges.
    pub fn resolve(a: &ColocationArgs) -> Result<Self> {
        let q = a.quick;
        let levels = a.levels.clone().unwrap_or_else(|| vec![100, 70, 50]);
        let modes = a
            .modes
            .clone()
            .unwrap_or_else(|| vec![Mode::Kernel, Mode::Fixed, Mode::Reclaim]);
        let s = BatchSettings {
            levels,
            modes,
            points_bytes: a.batch_bytes.unwrap_or(1 << 30),
            iters: a.batch_iters.unwrap_or(if q { 5 } else { 8 }),
            repeats: a.repeats.unwrap_or(if q { 2 } else { 3 }),
            out: a
                .out
                .clone()
                .unwrap_or_else(|| default_out_dir("reclaim-batch")),
            job_cpu: (!a.no_pin && process::online_cpus() >= 2).then_some(0),
        };
        let bad = |m: String| Err(BenchError::Invalid(m));
        if s.levels.is_empty() || s.modes.is_empty() {
            return bad("--levels and --modes need at least one value".into());
        }
        if let Some(l) = s.levels.iter().find(|&&l| !(10..=100).contains(&l)) {
            return bad(format!(
                "--batch level {l} % is not a share of the working set in 10..=100"
            ));
        }
        if s.modes.contains(&Mode::Agent)
            || s.modes.contains(&Mode::Watermarks)
            || s.modes.contains(&Mode::NoPressure)
        {
            return bad("--batch modes are kernel, fixed and reclaim".into());
        }
        if s.points_bytes < (64 << 20) {
            return bad("--batch-bytes must be at least 64MiB".into());
        }
        if s.iters == 0 || s.repeats == 0 {
            return bad("--batch-iters and --repeats must be at least 1".into());
        }
        Ok(s)
    }
}

/// What the job prints when it is done.
#[derive(Clone, Debug, Default, serde::Deserialize)]
struct JobReport {
    gen_s: f64,
    iter_s: Vec<f64>,
    total_s: f64,
    maxrss_bytes: u64,
    user_s: f64,
    sys_s: f64,
    major_faults: u64,
}

/// One run of the batch experiment (a row of `batch.csv`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct BatchRecord {
    /// Local memory, percent of the working set; 0 for the calibration run.
    pub level_pct: u32,
    pub mode: String,
    pub repeat: u32,
    pub status: String,
    pub limit_bytes: u64,
    pub ws_bytes: u64,
    pub points_bytes: u64,
    pub iters: u32,
    /// The job's own completion time (data generation and every iteration), seconds.
    pub total_s: f64,
    pub gen_s: f64,
    pub iter_mean_s: f64,
    /// CPU time of the job, seconds: user, and system (faults, swap-in, and the
    /// direct reclaim it does itself).
    pub job_user_s: f64,
    pub job_sys_s: f64,
    pub job_major_faults: u64,
    /// Charges that found the node at its limit (`memory.failcnt`): direct reclaim on
    /// the job's thread.
    pub node_limit_hits: u64,
    pub swap_max_bytes: u64,
    pub reclaim_bytes: Option<u64>,
    pub reclaim_cpu_s: Option<f64>,
    pub reclaim_cpu_s_per_gib: Option<f64>,
    pub reclaim_batches: Option<u64>,
    /// Machine-wide noise gauges over the run.
    pub cpu_busy_pct: f64,
    pub steal_pct: f64,
    pub loadavg_1m: f64,
}

/// Runs the batch experiment. Needs root, cgroup v1 memory, zram and
/// `/usr/bin/python3` with numpy; removes everything it creates on every exit path.
pub fn run(args: &ColocationArgs, memcolo_exe: &Path) -> anyhow::Result<()> {
    let s = BatchSettings::resolve(args)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("memcolo bench reclaim --batch needs root (cgroups, zram swap)");
    }
    which(Path::new(PYTHON)).context("python3 is needed")?;
    let numpy = Command::new(PYTHON)
        .args(["-c", "import numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|st| st.success())
        .unwrap_or(false);
    if !numpy {
        bail!("{PYTHON} cannot import numpy (Debian: apt-get install python3-numpy)");
    }
    if s.modes.iter().any(|m| m.uses_agent()) {
        which(memcolo_exe).context("the memcolo binary is needed")?;
    }
    let _stop = crate::signal::StopGuard::install()?;
    let t0 = Instant::now();
    let (log_dir, work) = crate::harness::prepare_out(&s.out, "memcolo-batch-")?;
    let script = work.path().join("kmeans.py");
    std::fs::write(&script, KMEANS_PY).with_context(|| format!("write {}", script.display()))?;

    let _zram = if args.no_zram {
        bail!(
            "--batch needs zram swap: the part of the working set out of local memory lives there"
        );
    } else {
        match ZramSwap::setup("zram0", args.zram_size, 100)? {
            Ok(z) => z,
            Err(why) => bail!("no zram swap: {why}"),
        }
    };
    progress(
        t0,
        &format!("zram swap on /dev/zram0 ({})", format_bytes(args.zram_size)),
    );
    let calib_limit = s.points_bytes + (1 << 30);
    let node = ScratchNode::create_below_self("memcolo-batch", calib_limit)?;
    let mut b = Batch {
        s: &s,
        args,
        exe: memcolo_exe,
        node,
        script,
        work_dir: work.path().to_path_buf(),
        log_dir,
        t0,
    };

    let mut records = Vec::new();
    // Calibration: the working set is the job's peak RSS with no pressure.
    let calib = b.run_one(0, Mode::Kernel, 0, calib_limit, 0)?;
    let ws = calib.ws_bytes;
    progress(
        t0,
        &format!(
            "calibration: {:.1} s, working set {} (points {})",
            calib.total_s,
            format_bytes(ws),
            format_bytes(s.points_bytes)
        ),
    );
    records.push(calib);
    let mut failure = None;
    'runs: for r in 0..s.repeats {
        for &level in &s.levels {
            for &mode in &s.modes {
                let limit = ws * level as u64 / 100;
                match b.run_one(level, mode, r, limit, ws) {
                    Ok(rec) => {
                        progress(
                            t0,
                            &format!(
                                "{level}% {} #{r}: {:.1} s (iterations {:.2} s each), job sys {:.1} s, {} limit hits",
                                mode.as_str(),
                                rec.total_s,
                                rec.iter_mean_s,
                                rec.job_sys_s,
                                rec.node_limit_hits
                            ),
                        );
                        records.push(rec);
                    }
                    Err(BenchError::Interrupted) => {
                        failure = Some(anyhow::anyhow!("interrupted"));
                        break 'runs;
                    }
                    Err(e) => {
                        progress(t0, &format!("{level}% {} #{r}: FAILED: {e}", mode.as_str()));
                        records.push(BatchRecord {
                            level_pct: level,
                            mode: mode.as_str().into(),
                            repeat: r,
                            status: format!("failed: {e}"),
                            limit_bytes: limit,
                            ws_bytes: ws,
                            ..Default::default()
                        });
                        if !args.keep_going {
                            failure = Some(anyhow::Error::new(e));
                            break 'runs;
                        }
                    }
                }
            }
        }
    }
    let written = write_results(&s, &records);
    drop(b);
    drop(work);
    progress(t0, "cleaned up (processes, cgroups, zram)");
    written?;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

struct Batch<'a> {
    s: &'a BatchSettings,
    args: &'a ColocationArgs,
    exe: &'a Path,
    node: ScratchNode,
    script: PathBuf,
    work_dir: PathBuf,
    log_dir: PathBuf,
    t0: Instant,
}

/// Removes the run's `job/` group when dropped.
struct JobGroup<'a>(&'a mut ScratchNode);

impl Drop for JobGroup<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.remove_child("job") {
            eprintln!("warning: {e}");
        }
        if let Err(e) = self.0.force_empty() {
            eprintln!("warning: {e}");
        }
    }
}

impl Batch<'_> {
    /// One run of the job in a node of `limit` bytes. `level` 0 is the calibration
    /// run, whose working set (peak RSS) is returned in `ws_bytes`.
    fn run_one(
        &mut self,
        level: u32,
        mode: Mode,
        repeat: u32,
        limit: u64,
        ws: u64,
    ) -> Result<BatchRecord> {
        let s = self.s;
        let t0 = self.t0;
        crate::signal::check()?;
        let tag = if level == 0 {
            "batch-calibration".to_string()
        } else {
            format!("batch-{level}-{}-{repeat}", mode.as_str())
        };
        progress(t0, &format!("{tag}: node limit {}", format_bytes(limit)));
        self.node.set_limit(limit)?;
        let node_path = self.node.path().to_path_buf();
        let job_cg = self.node.create_child("job")?;
        let group = JobGroup(&mut self.node);

        let mut agent = None;
        if mode.uses_agent() {
            let event_log = self.work_dir.join(format!("events-{tag}.jsonl"));
            let extra = mode.agent_args(limit, self.args, &self.work_dir, &tag)?;
            let spec = AgentSpec {
                exe: self.exe,
                scope_cgroup: &node_path,
                work_dir: &self.work_dir,
                event_log: &event_log,
                log: &self.log_dir.join(format!("agent-{tag}.log")),
                extra_args: &extra,
            };
            agent = Some(AgentProcess::start(
                &spec,
                &ChildPlacement::default(),
                Duration::from_secs(15),
            )?);
        }

        let out_path = self.work_dir.join(format!("{tag}.json"));
        let out_file =
            std::fs::File::create(&out_path).map_err(|e| BenchError::io(&out_path, e))?;
        let err_path = self.log_dir.join(format!("{tag}.log"));
        let err_file =
            std::fs::File::create(&err_path).map_err(|e| BenchError::io(&err_path, e))?;
        let mut cmd = Command::new(PYTHON);
        cmd.arg(&self.script)
            .args(["--bytes", &s.points_bytes.to_string()])
            .args(["--iters", &s.iters.to_string()])
            .arg("--wait-stdin")
            .env("OPENBLAS_NUM_THREADS", "1")
            .env("OMP_NUM_THREADS", "1")
            .stdin(Stdio::piped())
            .stdout(out_file)
            .stderr(err_file);
        let cpus = s.job_cpu.map(|c| vec![c]);
        let mut job = process::spawn(
            &mut cmd,
            "kmeans",
            &ChildPlacement {
                cgroup: Some(&job_cg),
                cpus: cpus.as_deref(),
                psi_cgroup: None,
            },
        )?;
        if let Some(a) = &agent {
            a.register(job.pid(), Class::Be, "kmeans")?;
            // The reclaim controller picks the new target up at its next tick.
            crate::signal::sleep(Duration::from_millis(200))?;
        }
        let hits0 = group.0.limit_hits()?;
        let cpu0 = process::read_cpu_times();
        let loadavg = process::loadavg_1m().unwrap_or(0.0);
        job.stdin()
            .ok_or_else(|| BenchError::Process("kmeans has no stdin".into()))?
            .write_all(b"go\n")
            .map_err(|e| BenchError::io(&out_path, e))?;

        let mut timeline = Vec::new();
        let mut swap_max = 0u64;
        let start = Instant::now();
        // Far beyond any sane run: a job slower than this has hung.
        let timeout = Duration::from_secs(3600);
        let status = loop {
            if let Some(st) = job.try_wait()? {
                break st;
            }
            crate::signal::check()?;
            if start.elapsed() > timeout {
                return Err(BenchError::Process(format!(
                    "{tag}: job ran over {timeout:?}"
                )));
            }
            let mut row = TimelineRow {
                t_s: start.elapsed().as_secs_f64(),
                ..Default::default()
            };
            if let Ok(u) = group.0.usage_bytes() {
                row.usage_bytes = u;
                row.headroom_bytes = limit.saturating_sub(u);
            }
            row.swap_bytes = swap_used_bytes();
            swap_max = swap_max.max(row.swap_bytes);
            if let Some(a) = &agent {
                if let Ok(st) = crate::agent::status(a.socket()) {
                    row.set_agent(&st);
                }
            }
            timeline.push(row);
            std::thread::sleep(Duration::from_millis(250));
        };
        let hits = group.0.limit_hits()?.saturating_sub(hits0);
        let (steal_pct, cpu_busy_pct) =
            process::steal_and_busy_pct(cpu0, process::read_cpu_times());
        let reclaim = agent
            .as_ref()
            .and_then(|a| crate::agent::status(a.socket()).ok())
            .map(|st| {
                let r = &st["reclaim"];
                (
                    r["reclaimed_bytes_total"].as_u64().unwrap_or(0),
                    r["cpu_seconds_total"].as_f64().unwrap_or(0.0),
                    r["batches_total"].as_u64().unwrap_or(0),
                )
            });
        if let Some(a) = agent.take() {
            a.stop(Duration::from_secs(10))?;
        }
        if level > 0 {
            write_timeline(&s.out, &tag, &timeline)?;
        }
        drop(group);
        if !status.success() {
            return Err(BenchError::Process(format!(
                "{tag}: kmeans exited with {status}; see {}",
                err_path.display()
            )));
        }
        let text = std::fs::read_to_string(&out_path).map_err(|e| BenchError::io(&out_path, e))?;
        let rep: JobReport = serde_json::from_str(text.trim()).map_err(|e| BenchError::Parse {
            path: out_path.clone(),
            msg: e.to_string(),
        })?;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        Ok(BatchRecord {
            level_pct: level,
            mode: mode.as_str().into(),
            repeat,
            status: "ok".into(),
            limit_bytes: limit,
            ws_bytes: if level == 0 { rep.maxrss_bytes } else { ws },
            points_bytes: s.points_bytes,
            iters: s.iters,
            total_s: rep.total_s,
            gen_s: rep.gen_s,
            iter_mean_s: if rep.iter_s.is_empty() {
                0.0
            } else {
                rep.iter_s.iter().sum::<f64>() / rep.iter_s.len() as f64
            },
            job_user_s: rep.user_s,
            job_sys_s: rep.sys_s,
            job_major_faults: rep.major_faults,
            node_limit_hits: hits,
            swap_max_bytes: swap_max,
            reclaim_bytes: reclaim.map(|r| r.0),
            reclaim_cpu_s: reclaim.map(|r| r.1),
            reclaim_cpu_s_per_gib: reclaim.filter(|r| r.0 > 0).map(|r| r.1 / gib(r.0)),
            reclaim_batches: reclaim.map(|r| r.2),
            cpu_busy_pct,
            steal_pct,
            loadavg_1m: loadavg,
        })
    }
}

/// Swap in use on the machine (`SwapTotal − SwapFree`), bytes; the node is its only
/// user while the experiment holds the zram device.
fn swap_used_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    field("SwapTotal:").saturating_sub(field("SwapFree:"))
}

/// Medians of one (level, mode) over its successful repeats.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct BatchSummary {
    pub level_pct: u32,
    pub mode: String,
    pub runs: usize,
    pub total_s_median: f64,
    pub total_s_min: f64,
    pub total_s_max: f64,
    pub iter_mean_s_median: f64,
    pub job_sys_s_median: f64,
    pub node_limit_hits_median: f64,
    pub reclaim_cpu_s_median: Option<f64>,
    pub reclaim_cpu_s_per_gib_median: Option<f64>,
    /// Median completion time of the kernel alone at this level ÷ this mode's.
    pub speedup_vs_kernel: Option<f64>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One summary per (level, mode) in the order they first appear, calibration
/// excluded; the speedup is relative to the kernel-alone median of the same level.
pub fn summarize(records: &[BatchRecord]) -> Vec<BatchSummary> {
    let mut keys: Vec<(u32, String)> = Vec::new();
    for r in records.iter().filter(|r| r.level_pct > 0) {
        let k = (r.level_pct, r.mode.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut out: Vec<BatchSummary> = keys
        .into_iter()
        .filter_map(|(level, mode)| {
            let ok: Vec<&BatchRecord> = records
                .iter()
                .filter(|r| r.level_pct == level && r.mode == mode && r.status == "ok")
                .collect();
            if ok.is_empty() {
                return None;
            }
            let col = |f: &dyn Fn(&BatchRecord) -> f64| median(ok.iter().map(|r| f(r)).collect());
            let opt = |f: &dyn Fn(&BatchRecord) -> Option<f64>| {
                let v: Vec<f64> = ok.iter().filter_map(|r| f(r)).collect();
                (!v.is_empty()).then(|| median(v))
            };
            let totals: Vec<f64> = ok.iter().map(|r| r.total_s).collect();
            Some(BatchSummary {
                level_pct: level,
                mode,
                runs: ok.len(),
                total_s_median: median(totals.clone()),
                total_s_min: totals.iter().cloned().fold(f64::INFINITY, f64::min),
                total_s_max: totals.iter().cloned().fold(0.0, f64::max),
                iter_mean_s_median: col(&|r| r.iter_mean_s),
                job_sys_s_median: col(&|r| r.job_sys_s),
                node_limit_hits_median: col(&|r| r.node_limit_hits as f64),
                reclaim_cpu_s_median: opt(&|r| r.reclaim_cpu_s),
                reclaim_cpu_s_per_gib_median: opt(&|r| r.reclaim_cpu_s_per_gib),
                speedup_vs_kernel: None,
            })
        })
        .collect();
    let kernel: Vec<(u32, f64)> = out
        .iter()
        .filter(|s| s.mode == "kernel")
        .map(|s| (s.level_pct, s.total_s_median))
        .collect();
    for s in &mut out {
        s.speedup_vs_kernel = kernel
            .iter()
            .find(|(l, _)| *l == s.level_pct)
            .map(|(_, k)| k / s.total_s_median);
    }
    out
}

fn csv_of<T: serde::Serialize>(rows: &[T]) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)
            .map_err(|e| BenchError::Process(format!("csv: {e}")))?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| BenchError::Process(format!("csv: {e}")))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The Markdown report: machine, method, the summary table and the calibration.
pub fn markdown(s: &BatchSettings, records: &[BatchRecord], sums: &[BatchSummary]) -> String {
    let mut m = String::new();
    m.push_str("# Batch job under limited local memory (Hermit's throughput experiment)\n\n");
    m.push_str(&format!(
        "- date: {}\n- host: {}, {} CPUs, {} RAM, kernel {}\n- command: `{}`\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        hostname(),
        process::online_cpus(),
        format_bytes(mem_total_bytes()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        std::env::args().collect::<Vec<_>>().join(" ")
    ));
    m.push_str(&format!(
        "- job: k-means (numpy, one thread{}), {} of float32 points, {} iterations\n- repeats: {} per level and mode, interleaved\n",
        match s.job_cpu {
            Some(c) => format!(", pinned to CPU {c}"),
            None => String::new(),
        },
        format_bytes(s.points_bytes),
        s.iters,
        s.repeats
    ));
    if let Some(c) = records
        .iter()
        .find(|r| r.level_pct == 0 && r.status == "ok")
    {
        m.push_str(&format!(
            "- working set (peak RSS, no pressure): {}; completion with no pressure {:.1} s\n",
            format_bytes(c.ws_bytes),
            c.total_s
        ));
    }
    m.push_str("\n| local memory | mode | runs | completion s (median, min–max) | iteration s | job sys s | node limit hits | reclaim CPU s | CPU s / GiB | speedup vs kernel |\n");
    m.push_str("|---:|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
    let o = |v: Option<f64>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or("-".into());
    for x in sums {
        m.push_str(&format!(
            "| {} % | {} | {} | {:.1} ({:.1}–{:.1}) | {:.2} | {:.1} | {:.0} | {} | {} | {} |\n",
            x.level_pct,
            x.mode,
            x.runs,
            x.total_s_median,
            x.total_s_min,
            x.total_s_max,
            x.iter_mean_s_median,
            x.job_sys_s_median,
            x.node_limit_hits_median,
            o(x.reclaim_cpu_s_median, 1),
            o(x.reclaim_cpu_s_per_gib_median, 2),
            o(x.speedup_vs_kernel, 2)
        ));
    }
    let failed = records.iter().filter(|r| r.status != "ok").count();
    if failed > 0 {
        m.push_str(&format!("\n{failed} run(s) failed: see batch.csv.\n"));
    }
    m.push_str("\nRaw rows: `batch.csv`; medians: `batch-summary.csv`; timelines: `timeline-batch-*.csv`.\n");
    m
}

fn write_results(s: &BatchSettings, records: &[BatchRecord]) -> anyhow::Result<()> {
    let sums = summarize(records);
    report::write_file(&s.out, "batch.csv", &csv_of(records)?)?;
    report::write_file(&s.out, "batch-summary.csv", &csv_of(&sums)?)?;
    let md = markdown(s, records, &sums);
    report::write_file(&s.out, "batch-report.md", &md)?;
    println!("{md}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::colocation::tests::parse;

    #[test]
    fn batch_defaults_replace_the_sweep_defaults() {
        let s = BatchSettings::resolve(&parse(&["--batch"])).unwrap();
        assert_eq!(s.levels, vec![100, 70, 50]);
        assert_eq!(s.modes, vec![Mode::Kernel, Mode::Fixed, Mode::Reclaim]);
        assert_eq!(s.points_bytes, 1 << 30);
        assert_eq!((s.iters, s.repeats), (8, 3));
        let q = BatchSettings::resolve(&parse(&["--batch", "--quick"])).unwrap();
        assert_eq!((q.iters, q.repeats), (5, 2));
        let e = BatchSettings::resolve(&parse(&[
            "--batch",
            "--levels",
            "70",
            "--modes",
            "kernel,reclaim",
            "--batch-bytes",
            "256MiB",
            "--repeats",
            "1",
        ]))
        .unwrap();
        assert_eq!(e.levels, vec![70]);
        assert_eq!(e.modes, vec![Mode::Kernel, Mode::Reclaim]);
        assert_eq!(e.points_bytes, 256 << 20);
        assert_eq!(e.repeats, 1);
    }

    #[test]
    fn batch_rejects_levels_and_modes_that_mean_nothing_here() {
        for argv in [
            &["--batch", "--levels", "150"][..],
            &["--batch", "--levels", "0"],
            &["--batch", "--modes", "kernel,watermarks"],
            &["--batch", "--batch-bytes", "1MiB"],
            &["--batch", "--repeats", "0"],
        ] {
            assert!(
                BatchSettings::resolve(&parse(argv)).is_err(),
                "{argv:?} accepted"
            );
        }
    }

    fn rec(level: u32, mode: &str, total: f64) -> BatchRecord {
        BatchRecord {
            level_pct: level,
            mode: mode.into(),
            status: "ok".into(),
            total_s: total,
            ..Default::default()
        }
    }

    #[test]
    fn summary_takes_medians_and_divides_by_the_kernel_median() {
        let mut r = vec![
            rec(0, "kernel", 5.0),
            rec(70, "kernel", 20.0),
            rec(70, "reclaim", 12.0),
            rec(70, "kernel", 24.0),
            rec(70, "reclaim", 10.0),
            rec(70, "kernel", 22.0),
            rec(70, "reclaim", 11.0),
            rec(50, "reclaim", 30.0),
        ];
        r.push(BatchRecord {
            status: "failed: x".into(),
            ..rec(70, "reclaim", 1.0)
        });
        let s = summarize(&r);
        // Calibration (level 0) is not a row; a level without a kernel run has no speedup.
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].level_pct, s[0].mode.as_str()), (70, "kernel"));
        assert_eq!(s[0].total_s_median, 22.0);
        assert_eq!(s[0].speedup_vs_kernel, Some(1.0));
        assert_eq!(s[1].runs, 3, "the failed run is left out");
        assert_eq!(s[1].total_s_median, 11.0);
        assert_eq!((s[1].total_s_min, s[1].total_s_max), (10.0, 12.0));
        assert_eq!(s[1].speedup_vs_kernel, Some(2.0));
        assert_eq!(s[2].speedup_vs_kernel, None);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
