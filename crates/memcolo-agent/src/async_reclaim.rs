//! The agent's asynchronous reclaim (Hermit, NSDI'23: feedback-directed reclaim off
//! the application's critical path), configured by the `reclaim.*` keys: a
//! controller thread (`controller.rs`) that ticks every `reclaim.tick_ms`, senses the
//! scope's headroom, allocation rate, swap-ins and swap, asks
//! [`memcolo_policy::hermit::ReclaimScheduler`] how many workers to run, and a pool
//! of low-priority worker threads (`worker.rs`) that reclaim BE memory in batches until the scope is back above the low mark. This
//! module holds what the two share (the target slots, the pool, the status) and
//! starts them.
//!
//! Targets come from the core's [`NodeSnapshot`] of every poll (the registry's view:
//! registered BE processes, and elastic ones when `include_elastic`, LC ones only when
//! `allow_lc`, with the RSS the poll read), plus `reclaim.cgroups`. The scope's
//! headroom, swap and refaults the controller samples itself every tick, through the
//! same [`Scope::sample_with_host`] as the poll: at 20 ms, a figure up to a poll (1 s)
//! old would be fifty ticks late.
//! A target whose own memory cgroup holds no LC process is reclaimed through that
//! cgroup (the kernel's LRU of the group picks the pages: v2 `memory.reclaim`, v1 a
//! limit step — see [`memcolo_linux::pageout::reclaim_cgroup`]); otherwise through
//! batched `process_madvise(MADV_PAGEOUT)` over the process's address space.
//!
//! Identity: a target is the registered process's proof ([`ProvenProcess`]: pidfd,
//! start time and credentials the core saw), never a bare pid. Every batch
//! re-verifies it first and acts through its pidfd; a target's cgroup is read
//! through it (`/proc/PID/cgroup`, then the pidfd checked alive); its files are
//! reached only through [`memcolo_linux::filecache::ProcessFiles`] (no path opened, only regular files its
//! uid owns). In a target's cgroup, only processes running as the registered job's
//! user (same real and effective uid and gid, no extra capability) have their files
//! dropped, as only they are killed with the job.
//!
//! Faults: a target that exits, changes credentials, is refused (`EPERM`) or whose
//! cgroup vanishes is dropped and logged once with the cause; swap nearly full stops
//! all reclaim; a v1 limit step that the agent did not live to undo is undone at the next start from
//! the journal in `state_dir` (`reclaim-step-<worker>.json`, `journal.rs`).
//!
//! Page turnaround is measured directly, on a sample of the pages the batches evict
//! (see [`turnaround`]): workers watch a few resident pages of each target around
//! every batch, and the controller follows the evicted ones until they refault, into
//! the distribution shown in status and metrics. The median turnaround of the sampled
//! pages evicted in the last 10 s ([`turnaround::TurnaroundSampler::recent`]) is what the
//! scheduler backs off on ([`memcolo_policy::hermit::SampledTurnaround`]); with fewer than
//! `min_turnaround_samples` of them it falls back to the Little's-law mean.

mod controller;
mod journal;
pub mod turnaround;
mod worker;

use crate::config::AgentConfig;
use crate::metrics::Metrics;
use crate::snapshot::{NodeSnapshot, SnapshotTx};
use controller::Controller;
use memcolo_linux::cgroup::MemoryCgroup;
use memcolo_linux::identity::ProvenProcess;
use memcolo_linux::pageout::{FileId, PageoutCursor};
use memcolo_linux::procfs::ProcFs;
use memcolo_linux::scope::Scope;
use memcolo_policy::hermit::WorkerPlacement;
use memcolo_policy::{Class, Pid};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use turnaround::{EvictionWatch, TurnaroundSummary};

pub use journal::recover_journal;

pub use crate::snapshot::ReclaimTarget;

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
    /// Where workers run and at which nice value, see [`WorkerPlacement`].
    place: WorkerPlacement,
    place_gen: u64,
    /// Files an LC process holds: their page cache is never dropped (`file_first`).
    protected: Arc<HashSet<FileId>>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AsyncReclaimStatus {
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
    status: Mutex<AsyncReclaimStatus>,
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
pub struct AsyncReclaimService {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// The core's side: where it publishes each poll's [`NodeSnapshot`] and reads status.
#[derive(Clone)]
pub struct AsyncReclaimLink {
    shared: Arc<Shared>,
    snapshots: SnapshotTx,
}

impl AsyncReclaimLink {
    /// Publishes this poll's snapshot; never waits for the controller.
    pub fn publish(&self, snapshot: NodeSnapshot) {
        self.snapshots.publish(snapshot);
    }

    /// A snapshot of the service's state.
    pub fn status(&self) -> AsyncReclaimStatus {
        self.shared.status.lock().unwrap().clone()
    }
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

impl AsyncReclaimService {
    /// Starts the controller and `budget` workers (default: the online CPUs; the
    /// controller narrows the pool to the CPUs off LC cores as the core publishes
    /// them). Undoes journaled v1 limit steps first.
    pub fn start(
        cfg: &AgentConfig,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<(AsyncReclaimService, AsyncReclaimLink)> {
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
            status: Mutex::new(AsyncReclaimStatus {
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
            let journal = journal::journal_path(&cfg.state_dir, i);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("memcolo-reclaim-{i}"))
                    .spawn(move || {
                        worker::run(i as u32, sh, procfs, nice, batch, file_first, journal)
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
        let link = AsyncReclaimLink {
            shared: shared.clone(),
            snapshots: tx,
        };
        Ok((AsyncReclaimService { shared, threads }, link))
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

impl Drop for AsyncReclaimService {
    fn drop(&mut self) {
        self.halt();
    }
}
