//! The agent's asynchronous reclaim (Hermit, NSDI'23): a controller thread that
//! ticks every `reclaim.tick_ms`, senses the scope's headroom, allocation rate,
//! swap-ins and swap, asks [`ReclaimScheduler`] how many workers to run, and a pool
//! of low-priority worker threads that reclaim BE memory in batches until the scope
//! is back above the low mark.
//!
//! Targets come from the core's [`NodeSnapshot`] of every poll (the registry's view:
//! registered BE processes, and elastic ones when `include_elastic`, LC ones only when
//! `allow_lc`, with the RSS the poll read), plus `reclaim.cgroups`. The scope's
//! headroom, swap and refaults the controller samples itself every tick, through the
//! same [`Scope::sample_with_host`] as the poll: at 20 ms, a figure up to a poll (1 s)
//! old would be fifty ticks late.
//! A target whose own memory cgroup holds no LC process is reclaimed through that
//! cgroup (the kernel's LRU of the group picks the pages: v2 `memory.reclaim`, v1 a
//! limit step — see [`memcolo_linux::reclaim::reclaim_cgroup`]); otherwise through
//! batched `process_madvise(MADV_PAGEOUT)` over the process's address space.
//!
//! Identity: a target is the registered process's proof ([`ProvenProcess`]: pidfd,
//! start time and credentials the core saw), never a bare pid. Every batch
//! re-verifies it first and acts through its pidfd; a target's cgroup is read
//! through it (`/proc/PID/cgroup`, then the pidfd checked alive); its files are
//! reached only through [`ProcessFiles`] (no path opened, only regular files its
//! uid owns). In a target's cgroup, only processes running as the registered job's
//! user (same real and effective uid and gid, no extra capability) have their files
//! dropped, as only they are killed with the job.
//!
//! Faults: a target that exits, changes credentials, is refused (`EPERM`) or whose
//! cgroup vanishes is dropped and logged once with the cause; swap nearly full stops all reclaim; a v1
//! limit step that the agent did not live to undo is undone at the next start from
//! the journal in `state_dir` (`reclaim-step-<worker>.json`).
//!
//! Page turnaround is measured directly, on a sample of the pages the batches evict
//! (see [`turnaround`]): workers watch a few resident pages of each target around
//! every batch, and the controller follows the evicted ones until they refault, into
//! the distribution shown in status and metrics. The median turnaround of the sampled
//! pages evicted in the last 10 s ([`TurnaroundSampler::recent`]) is what the
//! scheduler backs off on ([`SampledTurnaround`]); with fewer than
//! `min_turnaround_samples` of them it falls back to the Little's-law mean.

pub mod turnaround;

use crate::config::AgentConfig;
use crate::metrics::Metrics;
use crate::snapshot::{NodeSnapshot, SnapshotRx, SnapshotTx};
use memcolo_linux::cgroup::{CgroupVersion, Limit, MemoryCgroup};
use memcolo_linux::filecache::ProcessFiles;
use memcolo_linux::identity::ProvenProcess;
use memcolo_linux::procfs::ProcFs;
use memcolo_linux::reclaim::{
    drop_file_cache, group_processes, reclaim_cgroup, reclaim_cgroup_file_first, BatchOutcome,
    FileId, PageoutCursor, VmaKind,
};
use memcolo_linux::scope::Scope;
use memcolo_policy::hermit::{worker_placement as placement, WorkerPlacement as Placement};
use memcolo_policy::hermit::{
    ReclaimDecision, ReclaimObservation, ReclaimScheduler, SampledTurnaround,
};
use memcolo_policy::{Class, Pid};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use turnaround::{
    EvictionWatch, PageSource, ProcPages, TurnaroundConfig, TurnaroundSampler, TurnaroundSummary,
};

/// Resident pages each target's [`EvictionWatch`] holds around a batch.
const WATCH_PAGES: usize = 64;

/// A registered process whose memory may be reclaimed: its proof (the pidfd, start
/// time and credentials the core registered) and class.
#[derive(Clone, Debug)]
pub struct ReclaimTarget {
    pub process: Arc<ProvenProcess>,
    pub class: Class,
}

/// How often the reclaim targets are rebuilt when nothing in the snapshot changed them.
const MEMBERSHIP_PERIOD: Duration = Duration::from_secs(10);

/// What the target slots are built from: the targets (pid, start time, class), the
/// LC processes and the CPUs the agent may use, as one snapshot gives them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Membership {
    targets: Vec<(Pid, u64, Class)>,
    lc_pids: BTreeSet<Pid>,
    cpus: Option<Vec<usize>>,
}

impl Membership {
    fn of(snap: &NodeSnapshot) -> Membership {
        let mut targets: Vec<(Pid, u64, Class)> = snap
            .targets
            .iter()
            .map(|t| (t.pid(), t.process.starttime_ticks(), t.class))
            .collect();
        targets.sort_unstable_by_key(|t| t.0);
        Membership {
            targets,
            lc_pids: snap.lc_pids.clone(),
            cpus: snap.cpus.clone(),
        }
    }
}

/// Where a target's reclaimable bytes are read: its memory cgroup's usage, or a
/// process's RSS as the latest snapshot has it.
#[derive(Clone, Debug)]
enum Source {
    Cgroup(MemoryCgroup),
    Process(Pid),
}

impl Source {
    fn bytes(&self, snap: &NodeSnapshot) -> u64 {
        match self {
            Source::Cgroup(cg) => cg.read_usage_bytes().unwrap_or(0),
            Source::Process(pid) => snap.rss_bytes.get(pid).copied().unwrap_or(0),
        }
    }
}

impl ReclaimTarget {
    pub fn pid(&self) -> Pid {
        self.process.pid()
    }
}

/// One target of the worker pool.
#[derive(Debug)]
enum Mechanism {
    /// A cgroup, and the registered processes it was chosen for (empty for a group
    /// named in `reclaim.cgroups`): only their user's processes' files are dropped.
    Cgroup(MemoryCgroup, Vec<Arc<ProvenProcess>>),
    Process(PageoutCursor),
}

#[derive(Debug)]
struct Slot {
    id: String,
    mech: Mechanism,
    class: Class,
    /// Pages watched around this target's batches; `None` when sampling is off.
    watch: Option<EvictionWatch>,
}

impl Slot {
    fn mechanism_name(&self) -> &'static str {
        match self.mech {
            Mechanism::Cgroup(..) => "cgroup",
            Mechanism::Process(_) => "process_madvise",
        }
    }
}

/// The pool's shared state, under one mutex.
#[derive(Debug, Default)]
struct Pool {
    desired: u32,
    /// Bytes per batch the scheduler asked for ([`ReclaimDecision::batch_bytes`]); 0
    /// before its first decision (the configured `batch_bytes` then).
    batch: u64,
    remaining: u64,
    inflight: u64,
    active: u32,
    /// Available targets in round-robin order; a worker takes one out while it works.
    slots: Vec<Option<Slot>>,
    rr: usize,
    /// Ids of targets dropped by workers (exited, refused); the controller forgets them.
    dead: Vec<String>,
    /// Ids of targets out with a worker right now.
    out: BTreeSet<String>,
    /// Since the controller last read them.
    reclaimed: u64,
    busy: Duration,
    cpu: Duration,
    batches: u64,
    /// Where workers run and at which nice value, see [`Placement`].
    place: Placement,
    place_gen: u64,
    /// Files an LC process holds: their page cache is never dropped (`file_first`).
    protected: Arc<HashSet<FileId>>,
}

/// CPUs `pid` may run on, `None` when unreadable.
fn affinity_of(pid: Pid) -> Option<BTreeSet<usize>> {
    use nix::sched::{sched_getaffinity, CpuSet};
    let set = sched_getaffinity(nix::unistd::Pid::from_raw(pid)).ok()?;
    Some(
        (0..CpuSet::count().min(1024))
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
    )
}

/// Reclaim's state for `memcolo status` and `memcolo top`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReclaimStatus {
    pub enabled: bool,
    pub state: String,
    pub workers_budget: u32,
    pub workers_desired: u32,
    pub workers_active: u32,
    pub headroom_bytes: u64,
    pub low_mark_bytes: u64,
    pub high_mark_bytes: u64,
    pub alloc_rate_bytes_per_s: f64,
    /// Bytes per 4 KiB charge event that the allocation rate scales v1 charges by
    /// (1 until calibrated; see `memcolo_policy::hermit::ReclaimObservation`).
    #[serde(default)]
    pub charge_scale: f64,
    pub worker_rate_bytes_per_s: f64,
    /// The page turnaround the back-off steers on, seconds (`null`: nothing
    /// refaults): the sampled median of recent evictions, or the mean by Little's law
    /// while too few are sampled; see `turnaround_source`.
    pub turnaround_s: Option<f64>,
    /// `sampled`, `mean` or `none`.
    #[serde(default)]
    pub turnaround_source: String,
    /// `turnaround_s` is a sampled lower bound (over half the recent sample is still
    /// out at every age seen).
    #[serde(default)]
    pub turnaround_at_least: bool,
    /// Mean page turnaround by Little's law (swapped bytes ÷ swap-in rate), seconds.
    #[serde(default)]
    pub mean_turnaround_s: Option<f64>,
    /// Mean refault distance (the swapped population), bytes; `None` while nothing
    /// refaults.
    pub refault_distance_bytes: Option<u64>,
    /// The low mark is capped because the proactive band would only churn.
    pub churn_capped: bool,
    /// The scheduler is backed off: the page turnaround fell (below
    /// `reclaim.thrash_turnaround_ms`, or below `turnaround_drop_ratio` of the previous
    /// period's), so the proactive band is cut to one batch above the high mark.
    #[serde(default)]
    pub backing_off: bool,
    /// Adapt periods in which the turnaround fell (each starts or renews a back-off)
    /// since the agent started.
    #[serde(default)]
    pub backoffs_total: u64,
    pub refault_bytes_per_s: f64,
    /// Sampled page turnaround (eviction by a batch to refault): quantiles over the
    /// last one to two minutes, censored and followed pages; `None` when sampling is
    /// off (`turnaround_samples = 0`).
    #[serde(default)]
    pub turnaround_sampled: Option<TurnaroundSummary>,
    pub reclaimed_bytes_total: u64,
    pub cpu_seconds_total: f64,
    pub cpu_seconds_per_gib: Option<f64>,
    pub batches_total: u64,
    pub errors_total: u64,
    pub targets: Vec<TargetStatus>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TargetStatus {
    pub id: String,
    pub class: String,
    pub mechanism: String,
}

struct Shared {
    pool: Mutex<Pool>,
    cv: Condvar,
    stop: AtomicBool,
    status: Mutex<ReclaimStatus>,
    /// Causes already logged, so each is logged once.
    logged: Mutex<HashSet<String>>,
    errors: Mutex<u64>,
    /// Pages workers saw their batches evict, with the batch's end, for the
    /// controller's turnaround sampler; at most `evicted_cap` wait.
    evicted: Mutex<Vec<(Pid, u64, Instant)>>,
    /// The pagemap each of those pages is followed in, bound by a worker to the
    /// proven process it evicted them from.
    evicted_pagemaps: Mutex<HashMap<Pid, Arc<std::fs::File>>>,
    evicted_cap: usize,
    /// Evicted pages turned away because the queue was full, and the workers' CPU
    /// time spent watching pages, since the controller last took them.
    evicted_overflow: Mutex<u64>,
    watch_cpu: Mutex<Duration>,
}

impl Shared {
    fn log_once(&self, key: String, msg: impl FnOnce() -> String) {
        *self.errors.lock().unwrap() += 1;
        if self.logged.lock().unwrap().insert(key) {
            tracing::warn!("{}", msg());
        }
    }
}

/// Handle to the running service; dropping it stops the threads.
pub struct ReclaimService {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// The core's side: where it publishes each poll's [`NodeSnapshot`] and reads status.
#[derive(Clone)]
pub struct ReclaimLink {
    shared: Arc<Shared>,
    snapshots: SnapshotTx,
}

impl ReclaimLink {
    /// Publishes this poll's snapshot; never waits for the controller.
    pub fn publish(&self, snapshot: NodeSnapshot) {
        self.snapshots.publish(snapshot);
    }

    /// A snapshot of the service's state.
    pub fn status(&self) -> ReclaimStatus {
        self.shared.status.lock().unwrap().clone()
    }
}

fn journal_path(state_dir: &Path, worker: usize) -> PathBuf {
    state_dir.join(format!("reclaim-step-{worker}.json"))
}

#[derive(Serialize, Deserialize)]
struct StepJournal {
    cgroup: PathBuf,
    limit: Option<u64>,
}

/// Undoes v1 limit steps left behind by an agent that died between lowering and
/// restoring a limit. Returns how many were undone.
pub fn recover_journal(state_dir: &Path) -> usize {
    let mut undone = 0;
    let Ok(dir) = std::fs::read_dir(state_dir) else {
        return 0;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("reclaim-step-") && name.ends_with(".json")) {
            continue;
        }
        let path = e.path();
        match std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<StepJournal>(&b).ok())
        {
            Some(j) => match MemoryCgroup::open(&j.cgroup) {
                Ok(cg) => {
                    let limit = j.limit.map(Limit::Bytes).unwrap_or(Limit::Max);
                    match cg.write_limit(limit) {
                        Ok(()) => {
                            tracing::warn!(cgroup = %j.cgroup.display(), ?limit, "restored a cgroup limit a previous agent left stepped down");
                            undone += 1;
                        }
                        Err(err) => {
                            tracing::error!(cgroup = %j.cgroup.display(), error = %err, "cannot restore a stepped-down cgroup limit")
                        }
                    }
                }
                Err(err) => {
                    tracing::info!(cgroup = %j.cgroup.display(), error = %err, "stepped cgroup is gone")
                }
            },
            None => tracing::warn!(path = %path.display(), "ignoring unreadable reclaim journal"),
        }
        let _ = std::fs::remove_file(&path);
    }
    undone
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32))
        .unwrap_or_default()
}

fn set_cpus(cpus: &Option<Vec<usize>>) {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    match cpus {
        Some(c) if !c.is_empty() => {
            for &i in c {
                let _ = set.set(i);
            }
        }
        _ => {
            for i in 0..CpuSet::count().min(1024) {
                let _ = set.set(i);
            }
        }
    }
    let _ = sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
}

impl ReclaimService {
    /// Starts the controller and `budget` workers (default: the online CPUs; the
    /// controller narrows the pool to the CPUs off LC cores as the core publishes
    /// them). Undoes journaled v1 limit steps first.
    pub fn start(
        cfg: &AgentConfig,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<(ReclaimService, ReclaimLink)> {
        let recovered = recover_journal(&cfg.state_dir);
        if recovered > 0 {
            tracing::warn!(recovered, "undid v1 limit steps from the reclaim journal");
        }
        let scope = Scope::parse(&cfg.scope, ProcFs::new(cfg.procfs.clone()))
            .map_err(|e| anyhow::anyhow!("reclaim scope `{}`: {e}", cfg.scope))?;
        // SAFETY: sysconf has no memory-safety preconditions.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32;
        let threads_n = cfg.reclaim.max_workers.unwrap_or(online).max(1);
        let shared = Arc::new(Shared {
            pool: Mutex::new(Pool::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            status: Mutex::new(ReclaimStatus {
                enabled: true,
                state: "starting".into(),
                ..Default::default()
            }),
            logged: Mutex::new(HashSet::new()),
            errors: Mutex::new(0),
            evicted: Mutex::new(Vec::new()),
            evicted_pagemaps: Mutex::new(HashMap::new()),
            evicted_cap: cfg.reclaim.turnaround_samples,
            evicted_overflow: Mutex::new(0),
            watch_cpu: Mutex::new(Duration::ZERO),
        });
        let mut threads = Vec::new();
        for i in 0..threads_n as usize {
            let sh = shared.clone();
            let procfs = ProcFs::new(cfg.procfs.clone());
            let nice = cfg.reclaim.nice;
            let batch = cfg.reclaim.batch_bytes;
            let file_first = cfg.reclaim.file_first;
            let journal = journal_path(&cfg.state_dir, i);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("memcolo-reclaim-{i}"))
                    .spawn(move || {
                        worker(i as u32, sh, procfs, nice, batch, file_first, journal)
                    })?,
            );
        }
        let sh = shared.clone();
        let (tx, rx) = crate::snapshot::channel();
        let ctl = Controller::new(cfg, scope, rx, threads_n, metrics)?;
        threads.push(
            std::thread::Builder::new()
                .name("memcolo-reclaimctl".into())
                .spawn(move || ctl.run(sh))?,
        );
        let link = ReclaimLink {
            shared: shared.clone(),
            snapshots: tx,
        };
        Ok((ReclaimService { shared, threads }, link))
    }

    /// Stops and joins every thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ReclaimService {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Sets the calling thread's nice value.
fn set_nice(nice: i32) {
    // SAFETY: setpriority takes no pointers; who = 0 is the calling thread on Linux.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
}

fn worker(
    idx: u32,
    sh: Arc<Shared>,
    procfs: ProcFs,
    nice: Option<i32>,
    batch_bytes: u64,
    file_first: bool,
    journal: PathBuf,
) {
    set_nice(nice.unwrap_or(10));
    let mut place_gen = u64::MAX;
    let mut pages = ProcPages::new(procfs.clone());
    let mut rng = fastrand::Rng::new();
    loop {
        let (mut slot, batch, slot_idx, protected) = {
            let mut p = sh.pool.lock().unwrap();
            loop {
                if sh.stop.load(Ordering::SeqCst) {
                    return;
                }
                if idx < p.desired && p.remaining > 0 && p.slots.iter().any(|s| s.is_some()) {
                    break;
                }
                p = sh.cv.wait_timeout(p, Duration::from_millis(200)).unwrap().0;
            }
            if place_gen != p.place_gen {
                place_gen = p.place_gen;
                set_cpus(&p.place.cpus);
                set_nice(p.place.nice);
            }
            let n = p.slots.len();
            let start = p.rr % n;
            let i = (0..n)
                .map(|k| (start + k) % n)
                .find(|&i| p.slots[i].is_some())
                .unwrap();
            p.rr = i + 1;
            let slot = p.slots[i].take().unwrap();
            p.out.insert(slot.id.clone());
            let per_batch = if p.batch > 0 { p.batch } else { batch_bytes };
            let batch = per_batch.min(p.remaining);
            p.remaining -= batch;
            p.inflight += batch;
            p.active += 1;
            (slot, batch, i, file_first.then(|| p.protected.clone()))
        };
        let w0 = thread_cpu();
        let pids = slot
            .watch
            .as_ref()
            .map(|_| slot_pids(&slot, &procfs, &mut pages));
        if let (Some(w), Some(pids)) = (slot.watch.as_mut(), &pids) {
            w.arm(&mut pages, pids, &mut rng, Instant::now());
        }
        let t0 = Instant::now();
        let c0 = thread_cpu();
        let result = run_batch(&mut slot, &procfs, batch, protected.as_deref(), &journal);
        let busy = t0.elapsed();
        let cpu = thread_cpu().saturating_sub(c0);
        if let (Some(w), Some(pids)) = (slot.watch.as_mut(), &pids) {
            let end = t0 + busy;
            let w1 = thread_cpu();
            let evicted = w.evicted(&mut pages);
            pages.retain(&|p| pids.contains(&p));
            hand_over(&sh, &evicted, end, &pages);
            *sh.watch_cpu.lock().unwrap() +=
                thread_cpu().saturating_sub(w1) + c0.saturating_sub(w0);
        }
        let mut p = sh.pool.lock().unwrap();
        p.inflight -= batch;
        p.active -= 1;
        p.out.remove(&slot.id);
        p.busy += busy;
        p.cpu += cpu;
        p.batches += 1;
        match result {
            Ok(out) => {
                p.reclaimed += out.reclaimed_bytes;
                if slot_idx < p.slots.len() && p.slots[slot_idx].is_none() {
                    p.slots[slot_idx] = Some(slot);
                }
            }
            Err(e) => {
                let cause = match e.raw_os_error() {
                    _ if e.is_not_found() => "gone",
                    Some(libc::EPERM) | Some(libc::EACCES) => "refused",
                    _ => "failed",
                };
                let id = slot.id.clone();
                sh.log_once(format!("{id}:{cause}"), || {
                    format!("reclaim target {id} {cause}: {e}; dropping it")
                });
                p.dead.push(id);
            }
        }
        drop(p);
        sh.cv.notify_all();
    }
}

/// The processes whose pages a batch on `slot` may evict, each bound into `pages`
/// through its proof (the pagemap read is then that process's): the cursor's
/// process, or every process of the cgroup (none when it cannot be read).
fn slot_pids(slot: &Slot, procfs: &ProcFs, pages: &mut ProcPages) -> Vec<Pid> {
    match &slot.mech {
        Mechanism::Process(c) => {
            pages.bind(c.process());
            vec![c.pid()]
        }
        Mechanism::Cgroup(cg, _) => group_processes(cg, procfs)
            .unwrap_or_default()
            .iter()
            .filter(|p| pages.bind(p.process()))
            .map(|p| p.pid())
            .collect(),
    }
}

/// Queues pages a batch evicted at `at` for the controller's sampler; beyond the
/// queue's bound they are counted and dropped.
/// The pagemaps of their processes go along (the controller reads only those).
fn hand_over(sh: &Shared, evicted: &[(Pid, u64)], at: Instant, pages: &ProcPages) {
    if evicted.is_empty() {
        return;
    }
    let mut q = sh.evicted.lock().unwrap();
    let room = sh.evicted_cap.saturating_sub(q.len()).min(evicted.len());
    q.extend(evicted[..room].iter().map(|&(pid, addr)| (pid, addr, at)));
    drop(q);
    let mut bound = sh.evicted_pagemaps.lock().unwrap();
    for &(pid, _) in &evicted[..room] {
        if let Some(f) = pages.pagemap(pid) {
            bound.insert(pid, f);
        }
    }
    drop(bound);
    if room < evicted.len() {
        *sh.evicted_overflow.lock().unwrap() += (evicted.len() - room) as u64;
    }
}

/// One batch on `slot`. With `files_first` (the files LC processes hold, never
/// dropped), the target's clean page cache goes first, lowest file offset first
/// ([`drop_file_cache`]), and the cgroup's LRU or the pageout hand only make up the
/// rest. The target's registered processes are re-verified first: one that exited
/// or changed credentials ends the target (not found, or `EPERM`).
fn run_batch(
    slot: &mut Slot,
    procfs: &ProcFs,
    batch: u64,
    files_first: Option<&HashSet<FileId>>,
    journal: &Path,
) -> memcolo_linux::Result<BatchOutcome> {
    if let Mechanism::Cgroup(_, jobs) = &mut slot.mech {
        if !jobs.is_empty() {
            let mut last = None;
            jobs.retain(|p| match p.verify(procfs) {
                Ok(()) => true,
                Err(e) => {
                    last = Some(e);
                    false
                }
            });
            if let (true, Some(e)) = (jobs.is_empty(), last) {
                return Err(ProvenProcess::into_error(e));
            }
        }
    }
    let reclaim_cgroup =
        |cg: &MemoryCgroup, jobs: &[Arc<ProvenProcess>], bytes: u64| match files_first {
            Some(protected) => {
                let members = group_members(cg, jobs, procfs)?;
                reclaim_cgroup_file_first(cg, &members, bytes, protected)
            }
            None => reclaim_cgroup(cg, bytes),
        };
    if let (Some(protected), Mechanism::Process(c)) = (files_first, &mut slot.mech) {
        c.process()
            .verify(procfs)
            .map_err(ProvenProcess::into_error)?;
        let files = ProcessFiles::of_proven(procfs, c.process().try_clone()?, None);
        let dropped = match files.and_then(|f| drop_file_cache(&[f], batch, protected)) {
            Ok(r) => r.dropped_bytes,
            Err(memcolo_linux::Error::Unsupported { .. }) => 0,
            // Its uids are not one uid (a set-user-ID program): no files of its own,
            // its memory is still reclaimed.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => 0,
            Err(e) => return Err(e),
        };
        let rest = if dropped < batch {
            c.pageout(procfs, batch - dropped)?
        } else {
            BatchOutcome::default()
        };
        return Ok(BatchOutcome {
            reclaimed_bytes: rest.reclaimed_bytes + dropped,
            requested_bytes: batch,
        });
    }
    match &mut slot.mech {
        Mechanism::Cgroup(cg, jobs) => {
            if cg.version() == CgroupVersion::V1 {
                // Journal the limit so a restart can undo a step we die in.
                let limit = cg.read_limit()?.bytes();
                let j = StepJournal {
                    cgroup: cg.path().to_path_buf(),
                    limit,
                };
                let _ = std::fs::write(journal, serde_json::to_vec(&j).unwrap_or_default());
                let r = reclaim_cgroup(cg, jobs, batch);
                if r.is_ok() {
                    let _ = std::fs::remove_file(journal);
                }
                r
            } else {
                reclaim_cgroup(cg, jobs, batch)
            }
        }
        Mechanism::Process(c) => c.pageout(procfs, batch),
    }
}

/// The processes of `cg` whose own files a batch may drop: with `jobs` (the
/// registered processes the group is reclaimed for), those running as one of their
/// users ([`crate::core::same_user`], the rule for killing a job's descendants);
/// without (a group the configuration names), every process of the group.
fn group_members(
    cg: &MemoryCgroup,
    jobs: &[Arc<ProvenProcess>],
    procfs: &ProcFs,
) -> memcolo_linux::Result<Vec<ProcessFiles>> {
    let mut members = group_processes(cg, procfs)?;
    if !jobs.is_empty() {
        members.retain(|m| {
            jobs.iter()
                .any(|j| crate::core::same_user(m.process().credentials(), j.credentials()))
        });
    }
    Ok(members)
}

/// The controller: senses, decides, and sizes the pool.
struct Controller {
    cfg: AgentConfig,
    scope: Scope,
    procfs: ProcFs,
    sched: ReclaimScheduler,
    budget_max: u32,
    /// Online CPUs of the machine.
    online: usize,
    metrics: Arc<Metrics>,
    page_size: u64,
    last_refaults: Option<u64>,
    /// Pages charged to the scope at the previous observation (v1 `total_pgpgin`).
    last_charged: Option<u64>,
    /// The scope's limit failures (v1 `memory.failcnt`, v2 `memory.events` max) and
    /// the bytes memcolo's core dropped or elastic processes reported freeing, at the
    /// previous observation.
    last_failures: Option<u64>,
    last_removed: Option<u64>,
    last_refresh: Option<Instant>,
    /// What the target slots were last built from, and when (see [`Membership`]).
    membership: Option<(Membership, Instant)>,
    /// Where the reclaimable bytes of the current targets are read from.
    sources: Vec<Source>,
    /// Where the core's snapshots arrive, and the latest one taken.
    snapshots: SnapshotRx,
    snap: Arc<NodeSnapshot>,
    reclaimable: u64,
    totals: Totals,
    memory_mount: Option<PathBuf>,
    cpus_applied: Option<Option<Vec<usize>>>,
    /// Follows evicted pages until they refault; `None` when sampling is off.
    sampler: Option<TurnaroundSampler>,
    pages: ProcPages,
    sample_cpu: Duration,
    /// The sampled distribution as of the last poll, published with the decision it
    /// steered so that a status snapshot is consistent.
    sampled_summary: Option<TurnaroundSummary>,
    /// When the previous step ran (the controller's clock).
    last_step: Option<Duration>,
}

#[derive(Default)]
struct Totals {
    reclaimed: u64,
    cpu: Duration,
    batches: u64,
    refault_rate: f64,
}

impl Controller {
    fn new(
        cfg: &AgentConfig,
        scope: Scope,
        snapshots: SnapshotRx,
        budget: u32,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Controller> {
        let procfs = ProcFs::new(cfg.procfs.clone());
        let memory_mount = memcolo_linux::cgroup::v1_memory_mount(&procfs)
            .or_else(|_| memcolo_linux::cgroup::cgroup2_mount(&procfs))
            .ok();
        Ok(Controller {
            sched: ReclaimScheduler::new(cfg.reclaim.scheduler_config(budget))
                .map_err(|e| anyhow::anyhow!("reclaim: {e}"))?,
            budget_max: budget,
            // SAFETY: sysconf has no memory-safety preconditions.
            online: unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize,
            cfg: cfg.clone(),
            scope,
            procfs,
            metrics,
            page_size: ProcFs::page_size(),
            last_refaults: None,
            last_charged: None,
            last_failures: None,
            last_removed: None,
            last_refresh: None,
            membership: None,
            sources: Vec::new(),
            snap: snapshots.latest(),
            snapshots,
            reclaimable: 0,
            totals: Totals::default(),
            memory_mount,
            cpus_applied: None,
            sampler: (cfg.reclaim.turnaround_samples > 0).then(|| {
                TurnaroundSampler::new(TurnaroundConfig {
                    capacity: cfg.reclaim.turnaround_samples,
                    poll: Duration::from_millis(cfg.reclaim.turnaround_poll_ms),
                    horizon: Duration::from_secs(cfg.reclaim.turnaround_horizon_s),
                    ..Default::default()
                })
            }),
            pages: ProcPages::new(ProcFs::new(cfg.procfs.clone())),
            sample_cpu: Duration::ZERO,
            sampled_summary: None,
            last_step: None,
        })
    }

    fn run(mut self, sh: Arc<Shared>) {
        let epoch = Instant::now();
        let mut next = Instant::now();
        while !sh.stop.load(Ordering::SeqCst) {
            // The scheduler says when to look again: every `tick_ms` while engaged,
            // every `idle_tick_ms` while idle with margin (hermit `next_tick`).
            next += self.tick(&sh, epoch.elapsed());
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
        }
        let mut p = sh.pool.lock().unwrap();
        p.desired = 0;
        p.remaining = 0;
    }

    /// Memory cgroup of `pid`, when it is a real group (not the root). Read by pid:
    /// only for the LC processes a group must not hold (a wrong answer only spares a
    /// group); a target's group is [`Controller::cgroup_of_target`].
    fn cgroup_of(&self, pid: Pid) -> Option<MemoryCgroup> {
        let lines = self.procfs.read_pid_cgroup(pid).ok()?;
        self.memory_group(&lines)
    }

    /// Memory cgroup of the proven process `p`: `/proc/PID/cgroup` read by pid, then
    /// `p` verified (alive, same credentials), which proves the file was its own.
    fn cgroup_of_target(&self, p: &ProvenProcess) -> Option<MemoryCgroup> {
        let lines = self.procfs.read_pid_cgroup(p.pid()).ok()?;
        p.verify(&self.procfs).ok()?;
        self.memory_group(&lines)
    }

    fn memory_group(&self, lines: &[memcolo_linux::procfs::CgroupLine]) -> Option<MemoryCgroup> {
        let mount = self.memory_mount.as_ref()?;
        let v1 = lines
            .iter()
            .find(|l| l.controllers.iter().any(|c| c == "memory"));
        let line = v1.or_else(|| lines.iter().find(|l| l.hierarchy_id == 0))?;
        let rel = line.path.trim_start_matches('/');
        if rel.is_empty() {
            return None;
        }
        MemoryCgroup::open(mount.join(rel)).ok()
    }

    /// Rebuilds the target slots from the latest snapshot (once a second, or when the
    /// core published a new one).
    fn refresh(&mut self, sh: &Shared) {
        let fresh = self.snapshots.newer();
        let due = self
            .last_refresh
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if fresh.is_none() && !due {
            return;
        }
        if let Some(f) = fresh {
            self.snap = f;
        }
        self.last_refresh = Some(Instant::now());
        // The slots are rebuilt (cgroups read and proved, LC files listed, CPU masks
        // read: the reclaim thread's costliest work with many processes) only when the
        // registry's targets, LC processes or CPUs changed, a target died, or every
        // MEMBERSHIP_PERIOD (a process may move to another cgroup or open other
        // files); otherwise only the reclaimable bytes are brought up to date.
        let key = Membership::of(&self.snap);
        let dead = !sh.pool.lock().unwrap().dead.is_empty();
        let stale = match &self.membership {
            Some((k, at)) => *k != key || at.elapsed() >= MEMBERSHIP_PERIOD,
            None => true,
        };
        if !stale && !dead {
            self.reclaimable = self.sources.iter().map(|s| s.bytes(&self.snap)).sum();
            return;
        }
        self.membership = Some((key, Instant::now()));
        let rc = &self.cfg.reclaim;
        let scope_path = match &self.scope {
            Scope::Cgroup(cg) => Some(cg.path().to_path_buf()),
            Scope::Host(_) => None,
        };
        let lc_groups: Vec<PathBuf> = self
            .snap
            .lc_pids
            .iter()
            .filter_map(|&p| self.cgroup_of(p).map(|c| c.path().to_path_buf()))
            .collect();
        if rc.file_first && !rc.allow_lc {
            let mut protected = HashSet::new();
            for &pid in &self.snap.lc_pids {
                for f in self.procfs.read_pid_files(pid).unwrap_or_default() {
                    protected.insert((f.dev, f.ino));
                }
            }
            let mut p = sh.pool.lock().unwrap();
            if *p.protected != protected {
                p.protected = Arc::new(protected);
            }
        }
        // A group may be stepped when it is strictly inside the scope and holds no LC
        // process (directly or in a child group).
        let steppable = |path: &Path| -> bool {
            let inside = scope_path
                .as_ref()
                .is_none_or(|s| path.starts_with(s) && path != s.as_path());
            inside && (rc.allow_lc || !lc_groups.iter().any(|l| l.starts_with(path)))
        };
        type Wanted = (
            Class,
            Option<(MemoryCgroup, Vec<Arc<ProvenProcess>>)>,
            Option<Arc<ProvenProcess>>,
        );
        let mut wanted: BTreeMap<String, Wanted> = BTreeMap::new();
        let mut order: Vec<ReclaimTarget> = self.snap.targets.clone();
        // BE before elastic before LC.
        order.sort_by_key(|t| match t.class {
            Class::Be => 0,
            Class::Elastic => 1,
            Class::Lc => 2,
        });
        for ReclaimTarget { process, class } in order {
            let pid = process.pid();
            let allowed = match class {
                Class::Be => true,
                Class::Elastic => rc.include_elastic,
                Class::Lc => rc.allow_lc,
            };
            if !allowed || (!rc.allow_lc && self.snap.lc_pids.contains(&pid)) {
                continue;
            }
            let cg = if rc.mechanism != "process" {
                self.cgroup_of_target(&process)
                    .filter(|c| steppable(c.path()))
            } else {
                None
            };
            match cg {
                Some(cg) => {
                    let w = wanted
                        .entry(format!("cgroup:{}", cg.path().display()))
                        .or_insert((class, Some((cg, Vec::new())), None));
                    if let Some((_, jobs)) = &mut w.1 {
                        jobs.push(process);
                    }
                }
                None if rc.mechanism == "cgroup" => {
                    sh.log_once(format!("nocg:{pid}"), || {
                        format!("reclaim: pid {pid} has no memory cgroup of its own without LC processes; mechanism = cgroup leaves it alone")
                    });
                }
                None => {
                    wanted.insert(format!("pid:{pid}"), (class, None, Some(process)));
                }
            }
        }
        for path in &rc.cgroups {
            match MemoryCgroup::open(path) {
                Ok(cg) if steppable(cg.path()) => {
                    wanted
                        .entry(format!("cgroup:{}", path.display()))
                        .or_insert((Class::Be, Some((cg, Vec::new())), None));
                }
                Ok(_) => sh.log_once(format!("cgunsafe:{}", path.display()), || {
                    format!("reclaim: cgroup {} holds an LC process or is not inside the scope; not reclaiming it", path.display())
                }),
                Err(e) => sh.log_once(format!("cgmissing:{}", path.display()), || {
                    format!("reclaim: cgroup {}: {e}", path.display())
                }),
            }
        }
        // Reconcile with the pool: keep slots (and their clock hands) of targets still
        // wanted, add new ones, drop the rest and the dead.
        let mut p = sh.pool.lock().unwrap();
        let dead: Vec<String> = std::mem::take(&mut p.dead);
        let mut have: BTreeSet<String> = p.out.clone();
        let mut busy = 0;
        for s in p.slots.iter_mut() {
            match s {
                Some(slot) if wanted.contains_key(&slot.id) => {
                    have.insert(slot.id.clone());
                }
                Some(_) => *s = None,
                None => busy += 1,
            }
        }
        // Busy slots are out with a worker; they come back to their index. Only
        // compact when none is out.
        if busy == 0 {
            p.slots.retain(|s| s.is_some());
        }
        let mut sources = Vec::with_capacity(wanted.len());
        for (id, (class, cg, proc_)) in wanted {
            if let Some((cg, _)) = &cg {
                sources.push(Source::Cgroup(cg.clone()));
            } else if let Some(p) = &proc_ {
                sources.push(Source::Process(p.pid()));
            }
            if have.contains(&id) || dead.contains(&id) {
                continue;
            }
            let mech = match (cg, proc_) {
                (Some((cg, jobs)), _) => Mechanism::Cgroup(cg, jobs),
                (None, Some(p)) => Mechanism::Process(PageoutCursor::new(p, VmaKind::All)),
                (None, None) => continue,
            };
            let watch = self
                .sampler
                .is_some()
                .then(|| EvictionWatch::new(WATCH_PAGES));
            p.slots.push(Some(Slot {
                id,
                mech,
                class,
                watch,
            }));
        }
        self.reclaimable = sources.iter().map(|s| s.bytes(&self.snap)).sum();
        self.sources = sources;
        let mut target_cpus = BTreeSet::new();
        for t in &self.snap.targets {
            if let Some(c) = affinity_of(t.pid()) {
                target_cpus.extend(c);
            }
        }
        let place = placement(
            rc.nice,
            &self.snap.cpus,
            !self.snap.lc_pids.is_empty(),
            &target_cpus,
            self.online,
        );
        if p.place != place || p.place_gen == 0 {
            p.place = place;
            p.place_gen += 1;
        }
        let targets: Vec<TargetStatus> = p
            .slots
            .iter()
            .flatten()
            .map(|s| TargetStatus {
                id: s.id.clone(),
                class: s.class.to_string(),
                mechanism: s.mechanism_name().into(),
            })
            .collect();
        drop(p);
        sh.status.lock().unwrap().targets = targets;
    }

    /// The scope's figures, sampled now (the 20 ms fast path: see
    /// `docs/architecture.md`), turned into the scheduler's observation: counters
    /// become the increments since the previous tick.
    fn observe(&mut self) -> memcolo_linux::Result<ReclaimObservation> {
        let s = self.scope.sample_with_host(&self.procfs)?;
        let (limit, used, swapped, refaults, charged, failures) = (
            s.total_bytes,
            s.used_bytes,
            s.swap_used_bytes,
            s.refault_anon_pages,
            s.charged_pages,
            s.limit_failures,
        );
        let swapin = match self.last_refaults {
            Some(prev) => refaults.saturating_sub(prev) * self.page_size,
            None => 0,
        };
        self.last_refaults = Some(refaults);
        let charged_bytes = match (self.last_charged, charged) {
            (Some(prev), Some(now)) => Some(now.saturating_sub(prev) * self.page_size),
            _ => None,
        };
        self.last_charged = charged;
        let limit_failures = match (self.last_failures, failures) {
            (Some(prev), Some(now)) => now.saturating_sub(prev),
            _ => 0,
        };
        self.last_failures = failures;
        // Page cache the core dropped on Hermes advice and memory elastic processes
        // reported freeing: taken out of the scope, so usage growth alone would
        // understate allocation by it.
        let removed =
            self.metrics.file_cache_dropped_bytes.get() + self.metrics.reported_reclaimed_bytes();
        let removed_bytes = removed.saturating_sub(self.last_removed.unwrap_or(removed));
        self.last_removed = Some(removed);
        Ok(ReclaimObservation {
            limit_bytes: limit,
            used_bytes: used,
            swapin_bytes: swapin,
            charged_bytes,
            removed_bytes,
            limit_failures,
            swapped_bytes: swapped,
            swap_total_bytes: s.host_swap_total_bytes,
            swap_free_bytes: s.host_swap_free_bytes,
            reclaimable_bytes: self.reclaimable,
            ..Default::default()
        })
    }

    /// Hands the pages workers saw evicted to the sampler and, when due, polls the
    /// followed pages; publishes the distribution.
    fn sample(&mut self, sh: &Shared) {
        let Some(sampler) = self.sampler.as_mut() else {
            return;
        };
        let c0 = thread_cpu();
        let queued = std::mem::take(&mut *sh.evicted.lock().unwrap());
        for (pid, f) in std::mem::take(&mut *sh.evicted_pagemaps.lock().unwrap()) {
            self.pages.adopt(pid, f);
        }
        let overflow = std::mem::take(&mut *sh.evicted_overflow.lock().unwrap());
        self.sample_cpu += std::mem::take(&mut *sh.watch_cpu.lock().unwrap());
        let mut i = 0;
        while i < queued.len() {
            let at = queued[i].2;
            let j = queued[i..]
                .iter()
                .position(|e| e.2 != at)
                .map_or(queued.len(), |k| i + k);
            let pages: Vec<(Pid, u64)> = queued[i..j].iter().map(|e| (e.0, e.1)).collect();
            sampler.admit(&pages, at);
            i = j;
        }
        sampler.note_rejected(overflow);
        let now = Instant::now();
        if !sampler.due(now) {
            self.sample_cpu += thread_cpu().saturating_sub(c0);
            return;
        }
        let out = sampler.poll(&mut self.pages, now);
        self.sample_cpu += thread_cpu().saturating_sub(c0);
        let m = &self.metrics;
        for d in &out.refaulted {
            m.reclaim_turnaround_sampled.observe(d.as_secs_f64());
        }
        m.reclaim_turnaround_censored.inc_by(out.censored);
        let mut summary = sampler.summary();
        summary.cpu_seconds_total = self.sample_cpu.as_secs_f64();
        m.reclaim_turnaround_tracked.set(summary.tracked as i64);
        self.sampled_summary = Some(summary);
    }

    /// One controller step; returns how long until the next.
    fn tick(&mut self, sh: &Shared, now: Duration) -> Duration {
        let engaged = Duration::from_millis(self.cfg.reclaim.tick_ms);
        self.refresh(sh);
        self.sample(sh);
        let cpus = sh.pool.lock().unwrap().place.cpus.clone();
        if self.cpus_applied.as_ref() != Some(&cpus) {
            set_cpus(&cpus);
            self.cpus_applied = Some(cpus);
        }
        let mut obs = match self.observe() {
            Ok(o) => o,
            Err(e) => {
                sh.log_once(format!("sense:{e}"), || {
                    format!("reclaim: cannot sense the scope: {e}")
                });
                return engaged;
            }
        };
        let (budget, active) = {
            let mut p = sh.pool.lock().unwrap();
            obs.reclaimed_bytes = std::mem::take(&mut p.reclaimed);
            obs.inflight_bytes = p.inflight;
            obs.worker_busy = std::mem::take(&mut p.busy);
            self.totals.cpu += std::mem::take(&mut p.cpu);
            self.totals.batches += std::mem::take(&mut p.batches);
            let budget = match (&p.place.cpus, self.cfg.reclaim.max_workers) {
                (_, Some(n)) => n,
                (Some(c), None) => (c.len() as u32).clamp(1, self.budget_max),
                (None, None) => self.budget_max,
            };
            (budget, p.active)
        };
        self.totals.reclaimed += obs.reclaimed_bytes;
        self.reclaimable = self.reclaimable.saturating_sub(obs.reclaimed_bytes);
        obs.reclaimable_bytes = self.reclaimable;
        obs.sampled_turnaround =
            self.sampler
                .as_ref()
                .and_then(|s| s.recent())
                .map(|r| SampledTurnaround {
                    turnaround_s: r.turnaround_s,
                    at_least: r.at_least,
                    pages: r.pages.min(u32::MAX as u64) as u32,
                });
        let d = self.sched.step(now, &obs);
        let desired = d.workers.min(budget);
        {
            let mut p = sh.pool.lock().unwrap();
            p.desired = desired;
            p.remaining = d.target_bytes.saturating_sub(p.inflight);
            p.batch = d.batch_bytes;
        }
        if desired > 0 {
            sh.cv.notify_all();
        }
        // The refault rate over the time since the previous step (ticks vary).
        let dt = now
            .saturating_sub(self.last_step.replace(now).unwrap_or(now))
            .as_secs_f64();
        if dt > 0.0 {
            let w = 1.0 - (-dt / 1.0f64).exp();
            self.totals.refault_rate +=
                w * (obs.swapin_bytes as f64 / dt - self.totals.refault_rate);
        }
        self.publish(sh, &d, budget, desired, active, obs.swapin_bytes);
        d.next_tick
    }

    fn publish(
        &self,
        sh: &Shared,
        d: &ReclaimDecision,
        budget: u32,
        desired: u32,
        active: u32,
        swapin: u64,
    ) {
        let m = &self.metrics;
        m.reclaim_workers
            .with_label_values(&["desired"])
            .set(desired as i64);
        m.reclaim_workers
            .with_label_values(&["active"])
            .set(active as i64);
        m.reclaim_workers
            .with_label_values(&["budget"])
            .set(budget as i64);
        m.reclaim_marks
            .with_label_values(&["headroom"])
            .set(d.headroom_bytes as i64);
        m.reclaim_marks
            .with_label_values(&["low"])
            .set(d.low_mark_bytes as i64);
        m.reclaim_marks
            .with_label_values(&["high"])
            .set(d.high_mark_bytes as i64);
        m.reclaim_rate
            .with_label_values(&["alloc"])
            .set(d.alloc_rate);
        m.reclaim_rate
            .with_label_values(&["worker"])
            .set(d.worker_rate);
        m.reclaim_rate
            .with_label_values(&["refault"])
            .set(self.totals.refault_rate);
        m.reclaim_turnaround
            .set(d.mean_turnaround_s.unwrap_or(f64::INFINITY));
        m.reclaim_refault_bytes.inc_by(swapin);
        let total = self.totals.reclaimed;
        let prev = m.reclaim_bytes.get();
        if total > prev {
            m.reclaim_bytes.inc_by(total - prev);
        }
        m.reclaim_cpu_seconds.set(self.totals.cpu.as_secs_f64());
        let gib = total as f64 / (1u64 << 30) as f64;
        let mut st = sh.status.lock().unwrap();
        st.state = d.state.as_str().into();
        st.workers_budget = budget;
        st.workers_desired = desired;
        st.workers_active = active;
        st.headroom_bytes = d.headroom_bytes;
        st.low_mark_bytes = d.low_mark_bytes;
        st.high_mark_bytes = d.high_mark_bytes;
        st.alloc_rate_bytes_per_s = d.alloc_rate;
        st.charge_scale = d.charge_scale;
        st.worker_rate_bytes_per_s = d.worker_rate;
        st.turnaround_s = d.turnaround_s;
        if self.sampled_summary.is_some() {
            st.turnaround_sampled = self.sampled_summary.clone();
        }
        st.turnaround_source = d.turnaround_source.as_str().into();
        st.turnaround_at_least = d.turnaround_at_least;
        st.mean_turnaround_s = d.mean_turnaround_s;
        st.refault_distance_bytes = d.refault_distance_bytes;
        st.churn_capped = d.churn_capped;
        st.backing_off = d.backing_off;
        st.backoffs_total = d.backoffs;
        st.refault_bytes_per_s = self.totals.refault_rate;
        st.reclaimed_bytes_total = total;
        st.cpu_seconds_total = self.totals.cpu.as_secs_f64();
        st.cpu_seconds_per_gib = (gib > 0.0).then(|| self.totals.cpu.as_secs_f64() / gib);
        st.batches_total = self.totals.batches;
        st.errors_total = *sh.errors.lock().unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake v1 group: the files `MemoryCgroup::open` and `write_limit` touch.
    fn fake_group(dir: &Path, limit: &str) -> PathBuf {
        let g = dir.join("be");
        std::fs::create_dir_all(&g).unwrap();
        std::fs::write(g.join("memory.usage_in_bytes"), "4096\n").unwrap();
        std::fs::write(g.join("memory.limit_in_bytes"), limit).unwrap();
        g
    }

    #[test]
    fn a_journaled_limit_step_is_undone_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        // The agent died with the group stepped down to 1 MiB from 512 MiB.
        let g = fake_group(dir.path(), "1048576\n");
        let j = StepJournal {
            cgroup: g.clone(),
            limit: Some(512 << 20),
        };
        std::fs::write(journal_path(&state, 0), serde_json::to_vec(&j).unwrap()).unwrap();
        // And from an unlimited group, on worker 1.
        let g2 = dir.path().join("be2");
        std::fs::create_dir_all(&g2).unwrap();
        std::fs::write(g2.join("memory.usage_in_bytes"), "4096\n").unwrap();
        std::fs::write(g2.join("memory.limit_in_bytes"), "1048576\n").unwrap();
        let j2 = StepJournal {
            cgroup: g2.clone(),
            limit: None,
        };
        std::fs::write(journal_path(&state, 1), serde_json::to_vec(&j2).unwrap()).unwrap();
        // A garbage journal is dropped, and a vanished group is no error.
        std::fs::write(state.join("reclaim-step-2.json"), "{not json").unwrap();
        let gone = StepJournal {
            cgroup: dir.path().join("removed"),
            limit: Some(1),
        };
        std::fs::write(journal_path(&state, 3), serde_json::to_vec(&gone).unwrap()).unwrap();

        assert_eq!(recover_journal(&state), 2);
        assert_eq!(
            std::fs::read_to_string(g.join("memory.limit_in_bytes")).unwrap(),
            (512u64 << 20).to_string()
        );
        assert_eq!(
            std::fs::read_to_string(g2.join("memory.limit_in_bytes")).unwrap(),
            "-1"
        );
        // Every journal is consumed: a second start has nothing to undo.
        assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
        assert_eq!(recover_journal(&state), 0);
        // No state dir at all: nothing to do.
        assert_eq!(recover_journal(&dir.path().join("missing")), 0);
    }
}
