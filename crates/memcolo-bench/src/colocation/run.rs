//! One run of the colocation sweep: a (level, mode, repeat) cell's attempt, from fresh
//! groups to teardown, and what it measured ([`RunOutcome`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use memcolo_proto::Class;

use super::args::Mode;
use super::plan::Slot;
use super::Sweep;
use crate::agent::{AgentProcess, AgentSpec};
use crate::be::{be_demand, BeDemand, BeJobs, BeStart};
use crate::cgroup::{read_procs, ScratchNode};
use crate::dataset::preload;
use crate::error::{BenchError, Result};
use crate::harness::{mem_total_bytes, monotonic_s, progress};
use crate::lc::{LcKind, LcLaunch, LcServer};
use crate::loadgen::{run_open_loop, LoadSpec};
use crate::peers::{koordinator::KoordinatorConfig, senpai::SenpaiConfig, PeerController};
use crate::process::{self, ChildPlacement};
use crate::report::{self, RunOutcome, RunRecord};
use crate::size::format_bytes;
use crate::timeline::{steal_free_latency, write_timelines, LcCpuUse, TimelineRow};

/// Which BE job a process belongs to, by its command name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum BeProc {
    /// The file streamer (fio).
    File,
    /// The anonymous holder (stress-ng) and anything else in `be/`.
    #[default]
    Anon,
    /// The elastic cache.
    Elastic,
}

/// One reading of a BE process: which job it belongs to, its reads and CPU time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct BeProcSample {
    pub job: BeProc,
    /// `rchar`: bytes read, page-cache hits included.
    pub rchar: u64,
    /// `read_bytes`: bytes fetched from storage (page-cache misses).
    pub read_bytes: u64,
    /// utime + stime, clock ticks.
    pub cpu_ticks: u64,
}

impl BeProcSample {
    pub(super) fn read(pid: i32) -> Option<BeProcSample> {
        let (rchar, read_bytes) = process::read_io(pid).ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        let job = match comm.trim() {
            "fio" => BeProc::File,
            c if c.contains("gocache") => BeProc::Elastic,
            _ => BeProc::Anon,
        };
        Some(BeProcSample {
            job,
            rchar,
            read_bytes,
            cpu_ticks: process::read_stat(pid).ok()?.cpu_ticks,
        })
    }
}

/// What the BE processes did in the measured phase, summed per job.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct BeWorkSummary {
    /// Bytes the streamer read, hits included.
    pub file_read: u64,
    /// Bytes the streamer fetched from storage.
    pub file_fetched: u64,
    /// CPU seconds of the streamer, the holder and the elastic cache.
    pub file_cpu_s: f64,
    pub anon_cpu_s: f64,
    pub elastic_cpu_s: f64,
}

pub(super) fn summarize_be(procs: &HashMap<i32, (BeProcSample, BeProcSample)>) -> BeWorkSummary {
    let hz = process::clock_ticks_per_s().max(1) as f64;
    let mut w = BeWorkSummary::default();
    for (a, b) in procs.values() {
        let cpu = b.cpu_ticks.saturating_sub(a.cpu_ticks) as f64 / hz;
        match b.job {
            BeProc::File => {
                w.file_read += b.rchar.saturating_sub(a.rchar);
                w.file_fetched += b.read_bytes.saturating_sub(a.read_bytes);
                w.file_cpu_s += cpu;
            }
            BeProc::Anon => w.anon_cpu_s += cpu,
            BeProc::Elastic => w.elastic_cpu_s += cpu,
        }
    }
    w
}

/// Samples taken during the measured phase.
#[derive(Default)]
struct Samples {
    n: u64,
    usage_sum: f64,
    usage_max: u64,
    swap_max: u64,
    elastic_mapped_max: Option<u64>,
    /// pid -> (first, last) reading of each BE process.
    be_procs: HashMap<i32, (BeProcSample, BeProcSample)>,
    timeline: Vec<TimelineRow>,
}

/// Sets sysctls for a run and restores them on drop.
struct SysctlGuard(Vec<(PathBuf, String)>);

impl SysctlGuard {
    fn set(values: &[(&str, String)]) -> Result<SysctlGuard> {
        let mut g = SysctlGuard(Vec::new());
        for (name, v) in values {
            let path = PathBuf::from("/proc/sys").join(name.replace('.', "/"));
            let old = std::fs::read_to_string(&path)
                .map_err(|e| BenchError::io(&path, e))?
                .trim()
                .to_string();
            std::fs::write(&path, v).map_err(|e| BenchError::io(&path, e))?;
            g.0.push((path, old));
        }
        Ok(g)
    }
}

impl Drop for SysctlGuard {
    fn drop(&mut self) {
        for (p, old) in self.0.drain(..).rev() {
            if let Err(e) = std::fs::write(&p, &old) {
                eprintln!("warning: cannot restore {} to {old}: {e}", p.display());
            }
        }
    }
}

/// Removes a run's `lc/` and `be/` groups (killing what is left, dropping their page
/// cache), drops the page cache they leave charged to the node and, for a run that
/// raised the node's limit ([`Mode::NoPressure`]), puts the limit back.
struct RunGroups<'a> {
    node: &'a mut ScratchNode,
    restore_limit: Option<u64>,
}

impl Drop for RunGroups<'_> {
    fn drop(&mut self) {
        for c in ["be", "lc"] {
            if let Err(e) = self.node.remove_child(c) {
                eprintln!("warning: {e}");
            }
        }
        if let Err(e) = self.node.force_empty() {
            eprintln!("warning: {e}");
        }
        if let Some(limit) = self.restore_limit {
            if let Err(e) = self.node.set_limit(limit) {
                eprintln!("warning: cannot restore the node's limit: {e}");
            }
        }
    }
}

/// The node's limit for a run of `mode` at `level`: the node's memory, or for
/// [`Mode::NoPressure`] that plus the level's BE demand and 512 MiB (room for the
/// LC service's growth and the jobs' own overhead), so nothing is reclaimed.
pub(super) fn run_limit_bytes(mode: Mode, level: u32, node_bytes: u64, demand: &BeDemand) -> u64 {
    let _ = level;
    match mode {
        Mode::NoPressure => node_bytes + demand.total_bytes() + (512 << 20),
        _ => node_bytes,
    }
}

/// The file names of a run's timeline and latency CSVs: `<level>-<mode>-<rep>`, with
/// `-a<attempt>` until the attempt is accepted ([`super::results`] renames it).
pub(super) fn attempt_tag(slot: &Slot, attempt: u32) -> String {
    format!(
        "{}-{}-{}-a{attempt}",
        slot.level,
        slot.mode.as_str(),
        slot.rep
    )
}

/// What the agent's event log says about kills: how many, and whether one hit `pid`.
fn kills_in_event_log(text: &str, lc_pid: i32) -> (u64, bool) {
    let mut n = 0;
    let mut lc = false;
    for v in text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "kill")
    {
        n += 1;
        let hit = |x: &serde_json::Value| x.as_i64() == Some(lc_pid as i64);
        if hit(&v["pid"]) || v["pids"].as_array().is_some_and(|a| a.iter().any(hit)) {
            lc = true;
        }
    }
    (n, lc)
}

/// libmemcolo's published statistics of `pid` beside the agent's socket
/// (`<socket dir>/alloc/<pid>.json`, see `memcolo alloc-stats`): `used_bytes`, if the
/// file was written at or after `since_unix_ms`.
fn libmemcolo_used_bytes(socket_dir: &Path, pid: i32, since_unix_ms: u64) -> Option<u64> {
    let p = socket_dir.join("alloc").join(format!("{pid}.json"));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()?;
    (v["pid"].as_i64() == Some(pid as i64)
        && v["updated_unix_ms"].as_u64().unwrap_or(0) >= since_unix_ms)
        .then(|| v["stats"]["used_bytes"].as_u64())
        .flatten()
}

/// Wall-clock now, ms since the epoch.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Sweep<'_> {
    pub(super) fn place<'b>(
        cgroup: &'b Path,
        cpus: &'b Option<Vec<usize>>,
        psi_cgroup: Option<&'b Path>,
    ) -> ChildPlacement<'b> {
        ChildPlacement {
            cgroup: Some(cgroup),
            cpus: cpus.as_deref(),
            psi_cgroup,
        }
    }

    /// How the LC service starts in `mode` (with the agent's socket, if any).
    fn lc_launch(&self, mode: Mode, agent_socket: Option<&Path>) -> LcLaunch {
        let lib = || {
            self.libmemcolo
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        let mut launch = match (mode, agent_socket) {
            (Mode::Full, Some(sock)) => LcLaunch {
                wrapper: vec![
                    self.exe.into(),
                    "run".into(),
                    "--socket".into(),
                    sock.into(),
                    "--class".into(),
                    "lc".into(),
                    "--name".into(),
                    self.args.lc.as_str().into(),
                    "--".into(),
                    "env".into(),
                    format!("LD_PRELOAD={}", lib()).into(),
                ],
                env: Vec::new(),
            },
            (Mode::Alloc, _) => LcLaunch {
                wrapper: Vec::new(),
                env: vec![
                    ("LD_PRELOAD".into(), lib()),
                    ("MEMCOLO_CLASS".into(), "lc".into()),
                ],
            },
            _ => LcLaunch::default(),
        };
        if mode.lc_under_libmemcolo() {
            launch.env.extend(self.args.lc_env.iter().cloned());
        }
        launch
    }

    /// One attempt of `slot`.
    pub(super) fn run_one(&mut self, slot: &Slot, attempt: u32) -> Result<RunOutcome> {
        let s = self.s;
        let t0 = self.t0;
        let (level, mode) = (slot.level, slot.mode);
        let label = format!("{level}% {} #{}", mode.as_str(), slot.rep);
        let tag = attempt_tag(slot, attempt);
        crate::signal::check()?;
        progress(t0, &format!("{label}: start (attempt {attempt})"));
        let oom_before = self.node.oom_kills().unwrap_or(0);
        let node_path = self.node.path().to_path_buf();
        let demand: BeDemand = be_demand(level, s.node_bytes, s.split);
        let limit = run_limit_bytes(mode, level, s.node_bytes, &demand);
        if limit != s.node_bytes {
            progress(
                t0,
                &format!(
                    "{label}: node limit raised to {} (no memory pressure)",
                    format_bytes(limit)
                ),
            );
            self.node.set_limit(limit)?;
        }
        let restore_limit = (limit != s.node_bytes).then_some(s.node_bytes);
        // The agent's socket (see AgentProcess::start), known before it starts.
        let planned_socket = mode.uses_agent().then(|| self.work_dir.join("agent.sock"));
        let launch = self.lc_launch(mode, planned_socket.as_deref());
        let lc = match self.node.create_child("lc") {
            Ok(l) => l,
            Err(e) => {
                if let Some(l) = restore_limit {
                    let _ = self.node.set_limit(l);
                }
                return Err(e);
            }
        };
        let be = match self.node.create_child("be") {
            Ok(b) => b,
            Err(e) => {
                let _ = self.node.remove_child("lc");
                if let Some(l) = restore_limit {
                    let _ = self.node.set_limit(l);
                }
                return Err(e);
            }
        };
        let groups = RunGroups {
            node: &mut self.node,
            restore_limit,
        };
        let lc_psi = self.psi.as_ref().map(|g| g.child("lc"));
        let be_psi = self.psi.as_ref().map(|g| g.child("be"));
        let psi_now = |name: &str| self.psi.as_ref().and_then(|g| g.memory_some_us(name));

        let event_log = s.out.join(format!("events-{tag}.jsonl"));
        let mut agent = None;
        let _sysctl = if mode == Mode::Watermarks {
            let kib = mem_total_bytes() / 1024 / 50;
            Some(SysctlGuard::set(&[
                ("vm.watermark_scale_factor", "1000".to_string()),
                ("vm.min_free_kbytes", kib.to_string()),
            ])?)
        } else {
            None
        };
        if mode.uses_agent() {
            let _ = std::fs::remove_file(&event_log);
            let extra = mode.agent_args(s.node_bytes, self.args, &self.work_dir, &tag)?;
            let spec = AgentSpec {
                exe: self.exe,
                scope_cgroup: &node_path,
                work_dir: &self.work_dir,
                event_log: &event_log,
                log: &self.log_dir.join(format!("agent-{tag}.log")),
                extra_args: &extra,
            };
            // All CPUs: the bench's own threads are pinned to the LC CPUs and a child
            // would inherit that.
            let all: Vec<usize> = (0..process::online_cpus()).collect();
            agent = Some(AgentProcess::start(
                &spec,
                &ChildPlacement {
                    cpus: Some(&all),
                    ..Default::default()
                },
                Duration::from_secs(15),
            )?);
            progress(t0, &format!("{label}: agent up"));
        }
        let agent_socket = agent.as_ref().map(|a| a.socket().to_path_buf());

        let lc_kind = self.args.lc;
        let mut server = LcServer::start(
            lc_kind,
            match lc_kind {
                LcKind::Redis => &self.args.redis_server,
                LcKind::Memcached => &self.args.memcached,
            },
            &Self::place(&lc, &self.lc_cpus, lc_psi.as_deref()),
            &self.log_dir.join(format!("{}-{tag}.log", lc_kind.as_str())),
            (s.node_bytes / 2) >> 20,
            &launch,
        )?;
        let mut conns = self
            .rt
            .block_on(server.connect(s.connections, Duration::from_secs(15)))?;
        {
            let mut c = conns[0].clone();
            self.rt
                .block_on(preload(&mut c, s.keys, s.value_bytes, &self.pool))?;
        }
        let mut next_key = s.keys;
        let lc_pid = server.pid();
        progress(
            t0,
            &format!(
                "{label}: {} pid {lc_pid} preloaded with {} keys",
                lc_kind.as_str(),
                s.keys
            ),
        );
        let mut registered: Vec<i32> = Vec::new();
        if let Some(a) = &agent {
            // `memcolo run` registered the service in the full mode.
            if mode != Mode::Full {
                a.register(lc_pid, Class::Lc, lc_kind.as_str())?;
            }
            registered.push(lc_pid);
        }
        // Does the service really allocate through libmemcolo?
        let lc_libmemcolo = mode.lc_under_libmemcolo().then(|| {
            std::fs::read_to_string(format!("/proc/{lc_pid}/maps"))
                .map(|m| m.contains("libmemcolo"))
                .unwrap_or(false)
        });
        let lc_used_memory_bytes = self.rt.block_on(conns[0].used_memory_bytes());
        let lc_alloc_used_bytes = match (&agent_socket, mode.lc_under_libmemcolo()) {
            (Some(sock), true) => {
                // Published once a second while registered: wait for a file written
                // after the preload.
                let dir = sock.parent().unwrap_or(Path::new("."));
                let since = unix_ms();
                let end = Instant::now() + Duration::from_secs(3);
                loop {
                    match libmemcolo_used_bytes(dir, lc_pid, since) {
                        Some(b) => break Some(b),
                        None if Instant::now() < end => {
                            std::thread::sleep(Duration::from_millis(100))
                        }
                        None => break None,
                    }
                }
            }
            _ => None,
        };

        // The jobs outlive the measured phase and are stopped after it: a job exiting
        // (freeing, swap slots released) must not fall into the last measured second.
        let mut jobs = BeJobs::start(&BeStart {
            demand,
            data_file: &self.data_file,
            run_for: s.warmup + s.duration + Duration::from_secs(30),
            place: Self::place(&be, &self.be_cpus, be_psi.as_deref()),
            log_dir: &self.log_dir,
            tag: &tag,
            elastic_exe: self.elastic_exe.as_deref(),
            agent_socket: agent_socket.as_deref(),
        })?;
        if demand.total_bytes() > 0 {
            progress(
                t0,
                &format!(
                    "{label}: BE jobs {:?} (file {}, anon {}, elastic {})",
                    jobs.leader_pids(),
                    format_bytes(demand.file_bytes),
                    format_bytes(demand.anon_bytes),
                    format_bytes(demand.elastic_bytes)
                ),
            );
        }
        let peer = match mode {
            Mode::Senpai => Some(PeerController::start_senpai(
                be.clone(),
                be_psi.clone().ok_or_else(|| {
                    BenchError::Invalid("the senpai mode needs cgroup2 PSI".into())
                })?,
                SenpaiConfig::default(),
            )?),
            Mode::Koordinator => Some(PeerController::start_koordinator(
                node_path.clone(),
                be.clone(),
                jobs.killable(),
                KoordinatorConfig::default(),
            )?),
            _ => None,
        };
        // The elastic cache registers itself; every other BE process is registered
        // by the bench as `be`.
        let elastic_pgid = jobs.elastic().map(|e| e.pid());
        let register_be = |agent: &Option<AgentProcess>, registered: &mut Vec<i32>| -> Result<()> {
            let Some(a) = agent else { return Ok(()) };
            for pid in read_procs(&be)? {
                // SAFETY: getpgid has no memory-safety preconditions.
                if elastic_pgid.is_some_and(|g| unsafe { libc::getpgid(pid) } == g) {
                    continue;
                }
                if !registered.contains(&pid) {
                    // A worker may exit between the listing and the request.
                    if let Err(e) = a.register(pid, Class::Be, "be-job") {
                        eprintln!("warning: {e}");
                    }
                    registered.push(pid);
                }
            }
            Ok(())
        };
        crate::signal::sleep(Duration::from_millis(300))?;
        register_be(&agent, &mut registered)?;

        let base_spec = LoadSpec {
            rate_per_s: s.rate_per_s,
            duration: s.warmup,
            set_ratio: s.set_ratio,
            value_bytes: s.value_bytes,
            timeout: s.timeout,
            max_in_flight: 100_000,
            seed: level as u64 * 1000 + mode as u64 * 10 + slot.rep as u64,
        };
        if !s.warmup.is_zero() {
            progress(t0, &format!("{label}: warm-up {} s", s.warmup.as_secs()));
            run_open_loop(&self.rt, &conns, &base_spec, &mut next_key, &self.pool)?;
            server.check_alive()?;
        }
        register_be(&agent, &mut registered)?;

        // CLOCK_MONOTONIC at the start of the measured phase: a `perf record -k mono`
        // trace puts the latency CSV's second i at this + i.
        progress(
            t0,
            &format!(
                "{label}: measured {} s from CLOCK_MONOTONIC {:.6}",
                s.duration.as_secs(),
                monotonic_s()
            ),
        );
        let loadavg = process::loadavg_1m().unwrap_or(0.0);
        let cpu_before = process::read_cpu_times();
        let stat_before = process::read_stat(lc_pid)?;
        let sched_before = process::read_schedstat(lc_pid).ok();
        let lc_cpus = &self.lc_cpus;
        let cpu_use_before = LcCpuUse::read(lc_cpus, lc_pid);
        let hits_before = groups.node.limit_hits().ok();
        let (lc_psi0, be_psi0) = (psi_now("lc"), psi_now("be"));
        let elastic_before = jobs.elastic().and_then(|e| e.gets_served());
        let measure_spec = LoadSpec {
            duration: s.duration,
            seed: base_spec.seed + 1,
            ..base_spec
        };
        let sampling = AtomicBool::new(true);
        let node_ref: &ScratchNode = groups.node;
        let zram = &self.zram;
        let peer_state = peer.as_ref().map(|p| p.state().clone());
        let elastic = jobs.elastic();
        let (load, samples) = std::thread::scope(|sc| {
            let sampler = sc.spawn(|| {
                let mut smp = Samples::default();
                let t_start = Instant::now();
                while sampling.load(Ordering::Relaxed) {
                    let mut row = TimelineRow {
                        t_s: t_start.elapsed().as_secs_f64(),
                        ..Default::default()
                    };
                    if let Ok(u) = node_ref.usage_bytes() {
                        smp.n += 1;
                        smp.usage_sum += u as f64;
                        smp.usage_max = smp.usage_max.max(u);
                        row.usage_bytes = u;
                        row.headroom_bytes = s.node_bytes.saturating_sub(u);
                    }
                    if let Some(z) = zram {
                        let used = z.used_bytes();
                        smp.swap_max = smp.swap_max.max(used);
                        row.swap_bytes = used;
                    }
                    if let Some(sock) = &agent_socket {
                        if let Ok(st) = crate::agent::status(sock) {
                            row.set_agent(&st);
                            row.be_kills = st["counters"]["kills"].as_u64();
                        }
                    }
                    if let Some(p) = &peer_state {
                        let l = p.be_limit_bytes.load(Ordering::Relaxed);
                        row.be_limit_bytes = (l > 0).then_some(l);
                        row.be_kills = Some(p.kills().len() as u64);
                    }
                    row.lc_psi_some_us =
                        psi_now("lc").zip(lc_psi0).map(|(a, b)| a.saturating_sub(b));
                    row.be_psi_some_us =
                        psi_now("be").zip(be_psi0).map(|(a, b)| a.saturating_sub(b));
                    row.node_limit_hits = match (hits_before, node_ref.limit_hits()) {
                        (Some(a), Ok(b)) => Some(b.saturating_sub(a)),
                        _ => None,
                    };
                    row.lc_major_faults = process::read_stat(lc_pid)
                        .ok()
                        .map(|st| st.major_faults.saturating_sub(stat_before.major_faults));
                    if let (Some((e0, w0)), Ok((e, w))) =
                        (sched_before, process::read_schedstat(lc_pid))
                    {
                        row.lc_run_delay_ms = Some(w.saturating_sub(w0) as f64 / 1e6);
                        row.lc_cpu_ms = Some(e.saturating_sub(e0) as f64 / 1e6);
                    }
                    if let (Some(a), Some(b)) = (cpu_use_before, LcCpuUse::read(lc_cpus, lc_pid)) {
                        let d = a.since(&b);
                        row.lc_cpus_busy_ms = Some(d.busy_ms);
                        row.lc_cpus_foreign_ms = Some(d.foreign_ms);
                        row.lc_cpus_steal_ms = Some(d.steal_ms);
                    }
                    if let Some(p) = elastic.and_then(|e| e.last_progress()) {
                        smp.elastic_mapped_max =
                            Some(smp.elastic_mapped_max.unwrap_or(0).max(p.mapped_bytes));
                    }
                    smp.timeline.push(row);
                    for pid in read_procs(&be).unwrap_or_default() {
                        if let Some(r) = BeProcSample::read(pid) {
                            smp.be_procs.entry(pid).or_insert((r, r)).1 = r;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                smp
            });
            let load = run_open_loop(&self.rt, &conns, &measure_spec, &mut next_key, &self.pool);
            sampling.store(false, Ordering::Relaxed);
            (load, sampler.join().expect("sampler thread"))
        });
        let load = load?;
        let elastic_after = jobs.elastic().and_then(|e| e.gets_served());
        let exited = jobs.exited();
        let stat_after = process::read_stat(lc_pid).unwrap_or(stat_before);
        let node_limit_hits = match (hits_before, groups.node.limit_hits()) {
            (Some(a), Ok(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        let lc_cpu_delta = match (cpu_use_before, LcCpuUse::read(lc_cpus, lc_pid)) {
            (Some(a), Some(b)) => Some(a.since(&b)),
            _ => None,
        };
        let lc_cpu_ms = s.duration.as_secs_f64()
            * 1000.0
            * lc_cpus.as_ref().map_or(1, |c| c.len().max(1)) as f64;
        let lc_cpus_foreign_pct = lc_cpu_delta.map(|d| d.foreign_ms / lc_cpu_ms * 100.0);
        let lc_cpus_steal_ms = lc_cpu_delta.map(|d| d.steal_ms);
        let steal_free =
            lc_cpu_delta.map(|_| steal_free_latency(&samples.timeline, &load.per_sec_us));
        let lc_run_delay_ms = match (sched_before, process::read_schedstat(lc_pid)) {
            (Some((_, w0)), Ok((_, w))) => Some(w.saturating_sub(w0) as f64 / 1e6),
            _ => None,
        };
        let (lc_psi_some_ms, be_psi_some_ms) = (
            psi_now("lc")
                .zip(lc_psi0)
                .map(|(a, b)| a.saturating_sub(b) as f64 / 1e3),
            psi_now("be")
                .zip(be_psi0)
                .map(|(a, b)| a.saturating_sub(b) as f64 / 1e3),
        );
        let (steal_pct, cpu_busy_pct) =
            process::steal_and_busy_pct(cpu_before, process::read_cpu_times());
        let lc_rss = process::read_status_mem(lc_pid)
            .map(|m| m.rss_kib * 1024)
            .unwrap_or(0);
        let lc_alive = server.check_alive();

        let reclaim_totals = agent
            .as_ref()
            .and_then(|a| crate::agent::status(a.socket()).ok())
            .and_then(|st| {
                let r = &st["reclaim"];
                Some((
                    r["reclaimed_bytes_total"].as_u64()?,
                    r["cpu_seconds_total"].as_f64()?,
                ))
            });
        write_timelines(&s.out, &tag, &samples.timeline, &load.per_sec_us)?;
        progress(t0, &format!("{label}: teardown"));
        let peer_state = peer.map(|p| p.stop());
        let work = jobs.stop(Duration::ZERO)?;
        let (agent_kills, agent_killed_lc) = match agent.take() {
            Some(a) => {
                a.stop(Duration::from_secs(10))?;
                let text = std::fs::read_to_string(&event_log).unwrap_or_default();
                let (n, lc) = kills_in_event_log(&text, lc_pid);
                (Some(n), lc)
            }
            None => (None, false),
        };
        let oom_after = groups.node.oom_kills().unwrap_or(oom_before);
        drop(conns);
        drop(server);
        drop(groups);

        let measured_s = s.duration.as_secs_f64();
        let be_work = summarize_be(&samples.be_procs);
        // A killed job's work is lost (an evicted batch task starts over elsewhere).
        let killed = |job: &str| exited.contains(&job);
        let peer_kills = peer_state.as_ref().map_or(0, |p| p.kills().len() as u64);
        let mut record = RunRecord {
            level_pct: level,
            mode: mode.as_str().into(),
            mode_kind: mode.kind().as_str().into(),
            rep: slot.rep,
            attempt,
            status: match &lc_alive {
                Err(e) => format!("failed: {e}"),
                Ok(()) => "ok".into(),
            },
            node_bytes: s.node_bytes,
            be_file_bytes: demand.file_bytes,
            be_anon_bytes: demand.anon_bytes,
            be_elastic_bytes: demand.elastic_bytes,
            requests: load.scheduled,
            requests_ok: load.ok,
            errors: load.errors,
            dropped: load.dropped,
            throughput_rps: load.throughput_rps(),
            be_file_mib_per_min: if killed("file") {
                0.0
            } else {
                be_work.file_read as f64 / (1u64 << 20) as f64 / measured_s * 60.0
            },
            be_anon_ops_per_min: if demand.anon_bytes == 0 {
                None
            } else if killed("anon") {
                Some(0.0)
            } else {
                work.anon_ops_per_min
            },
            elastic_gets_per_min: if demand.elastic_bytes == 0 {
                None
            } else if killed("elastic") {
                Some(0.0)
            } else {
                match (elastic_before, elastic_after) {
                    (Some(a), Some(b)) => Some((b - a).max(0.0) / measured_s * 60.0),
                    _ => None,
                }
            },
            elastic_mapped_max_bytes: samples.elastic_mapped_max,
            be_file_hit_ratio: (be_work.file_read > 0)
                .then(|| 1.0 - (be_work.file_fetched as f64 / be_work.file_read as f64).min(1.0)),
            be_file_cpu_s: be_work.file_cpu_s,
            be_anon_cpu_s: be_work.anon_cpu_s,
            node_util: if samples.n > 0 {
                samples.usage_sum / samples.n as f64 / s.node_bytes as f64
            } else {
                0.0
            },
            node_usage_max_bytes: samples.usage_max,
            swap_used_max_bytes: samples.swap_max,
            redis_major_faults: stat_after
                .major_faults
                .saturating_sub(stat_before.major_faults),
            redis_rss_bytes: lc_rss,
            oom_kills: oom_after.saturating_sub(oom_before),
            agent_kills,
            lc_kills: u64::from(lc_alive.is_err() || agent_killed_lc),
            be_kills: agent_kills.unwrap_or(0) + peer_kills,
            loadavg_1m: loadavg,
            steal_pct,
            cpu_busy_pct,
            reclaim_bytes: reclaim_totals.map(|t| t.0),
            reclaim_cpu_s: reclaim_totals.map(|t| t.1),
            reclaim_cpu_s_per_gib: reclaim_totals
                .filter(|t| t.0 > 0)
                .map(|t| t.1 / (t.0 as f64 / (1u64 << 30) as f64)),
            lc_service: lc_kind.as_str().into(),
            node_limit_hits,
            lc_run_delay_ms,
            lc_cpus_foreign_pct,
            lc_cpus_steal_ms,
            lc_cpus_steal_pct: lc_cpus_steal_ms.map(|ms| ms / lc_cpu_ms * 100.0),
            lc_steal_seconds: steal_free.as_ref().map(|f| f.steal_seconds),
            lc_measured_seconds: steal_free.as_ref().map(|f| f.seconds),
            p99_steal_free_us: steal_free.as_ref().and_then(|f| f.p99_us),
            steal_free_request_share: steal_free.as_ref().map(|f| f.request_share),
            lc_libmemcolo,
            lc_alloc_used_bytes,
            lc_used_memory_bytes,
            peer_limit_writes: peer_state
                .as_ref()
                .filter(|_| mode == Mode::Senpai)
                .map(|p| p.limit_writes.load(Ordering::Relaxed)),
            peer_limit_write_failures: peer_state
                .as_ref()
                .filter(|_| mode == Mode::Senpai)
                .map(|p| p.limit_write_failures.load(Ordering::Relaxed)),
            lc_psi_some_ms,
            be_psi_some_ms,
            ..Default::default()
        };
        if let Some(e) = &load.first_error {
            eprintln!(
                "warning: {label}: {} request errors, first: {e}",
                load.errors
            );
        }
        report::fill_latency(&mut record, &load.hist_us);
        Ok(RunOutcome {
            record,
            hist_us: Some(load.hist_us),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_pressure_raises_the_limit_above_the_level_demand_only() {
        let node = 2u64 << 30;
        let split = "2:1:1".parse().unwrap();
        let demand = be_demand(100, node, split);
        assert_eq!(
            run_limit_bytes(Mode::NoPressure, 100, node, &demand),
            node + demand.total_bytes() + (512 << 20)
        );
        let zero = be_demand(0, node, split);
        assert_eq!(
            run_limit_bytes(Mode::NoPressure, 0, node, &zero),
            node + (512 << 20)
        );
        for m in [Mode::Kernel, Mode::Reclaim, Mode::Senpai, Mode::Full] {
            assert_eq!(run_limit_bytes(m, 150, node, &demand), node);
        }
    }

    #[test]
    fn be_work_is_summed_per_job_with_hits_and_cpu() {
        let s = |job, rchar, read_bytes, cpu_ticks| BeProcSample {
            job,
            rchar,
            read_bytes,
            cpu_ticks,
        };
        let hz = process::clock_ticks_per_s() as f64;
        let procs: HashMap<i32, (BeProcSample, BeProcSample)> = [
            // fio's parent (reads nothing) and its job process.
            (10, (s(BeProc::File, 5, 0, 1), s(BeProc::File, 5, 0, 2))),
            (
                11,
                (
                    s(BeProc::File, 1000, 100, 10),
                    s(BeProc::File, 9000, 900, 10 + hz as u64),
                ),
            ),
            // stress-ng's worker and the elastic cache.
            (
                12,
                (
                    s(BeProc::Anon, 0, 0, 0),
                    s(BeProc::Anon, 0, 0, 3 * hz as u64),
                ),
            ),
            (
                13,
                (
                    s(BeProc::Elastic, 0, 0, 0),
                    s(BeProc::Elastic, 0, 0, hz as u64),
                ),
            ),
        ]
        .into();
        let w = summarize_be(&procs);
        assert_eq!((w.file_read, w.file_fetched), (8000, 800));
        assert!((w.file_cpu_s - (1.0 + 1.0 / hz)).abs() < 1e-9, "{w:?}");
        assert!((w.anon_cpu_s - 3.0).abs() < 1e-9, "{w:?}");
        assert!((w.elastic_cpu_s - 1.0).abs() < 1e-9, "{w:?}");
    }

    #[test]
    fn kills_are_counted_and_the_lc_service_recognised() {
        let log = concat!(
            "{\"ts\":\"x\",\"event\":\"kill\",\"pid\":40,\"pids\":[40,41],\"class\":\"be\"}\n",
            "{\"ts\":\"x\",\"event\":\"registered\",\"pid\":7}\n",
            "not json\n",
        );
        assert_eq!(kills_in_event_log(log, 7), (1, false));
        assert_eq!(kills_in_event_log(log, 41), (1, true));
        assert_eq!(kills_in_event_log("", 1), (0, false));
    }

    #[test]
    fn libmemcolo_statistics_are_read_for_their_pid_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("alloc")).unwrap();
        std::fs::write(
            dir.path().join("alloc/42.json"),
            r#"{"v":1,"pid":42,"updated_unix_ms":2000,"stats":{"used_bytes":1234}}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("alloc/43.json"),
            r#"{"v":1,"pid":42,"stats":{"used_bytes":1}}"#,
        )
        .unwrap();
        assert_eq!(libmemcolo_used_bytes(dir.path(), 42, 1000), Some(1234));
        assert_eq!(libmemcolo_used_bytes(dir.path(), 42, 3000), None, "stale");
        assert_eq!(libmemcolo_used_bytes(dir.path(), 43, 0), None);
        assert_eq!(libmemcolo_used_bytes(dir.path(), 44, 0), None);
    }

    #[test]
    fn attempt_tags_name_the_cell() {
        let slot = Slot {
            rep: 2,
            level: 125,
            mode: Mode::Senpai,
        };
        assert_eq!(attempt_tag(&slot, 3), "125-senpai-2-a3");
    }
}
