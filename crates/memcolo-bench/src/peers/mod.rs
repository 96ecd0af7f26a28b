//! Peers of memcolo in the colocation bench: faithful re-implementations of other
//! systems' documented memory controllers, run against the same node, services and
//! jobs as memcolo.
//!
//! - [`senpai`]: Meta's Senpai / TMO (ASPLOS'22), which squeezes the BE group's limit
//!   to hold a PSI memory-stall target;
//! - [`koordinator`]: Koordinator's koordlet BE memory eviction, which kills BE jobs
//!   above a node usage threshold.
//!
//! The algorithms are pure ([`senpai::Senpai`], [`koordinator::select_victims`]) and
//! unit-tested; [`PeerController`] runs one of them on a thread against the real
//! cgroups during a run and records what it did for the run's timeline and results.

pub mod koordinator;
pub mod senpai;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memcolo_linux::cgroup::{Limit, MemoryCgroup};
use memcolo_linux::procfs::ProcFs;
use memcolo_linux::psi::Psi;

use crate::error::{BenchError, Result};
use koordinator::{BeTask, Koordinator, KoordinatorConfig};
use senpai::{Senpai, SenpaiConfig, SenpaiStep};

/// A BE job a peer may kill: its name and its process group (the bench's child, not
/// reaped while the run lasts, so the group id cannot be reused under the peer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillableJob {
    pub name: String,
    pub pgid: i32,
}

/// One kill by a peer.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerKill {
    /// Seconds since the controller started.
    pub t_s: f64,
    pub job: String,
    /// The job's memory usage without cache when it was chosen, bytes.
    pub memory_bytes: u64,
}

/// What a running peer did, shared with the run's sampler.
#[derive(Debug, Default)]
pub struct PeerState {
    /// The BE group's limit the peer last set, bytes (0: none set).
    pub be_limit_bytes: AtomicU64,
    /// Limit writes and the ones the kernel refused (v1 `EBUSY`).
    pub limit_writes: AtomicU64,
    pub limit_write_failures: AtomicU64,
    /// Rounds whose readings failed (a file missing or unparsable).
    pub read_failures: AtomicU64,
    pub kills: Mutex<Vec<PeerKill>>,
}

impl PeerState {
    /// The kills so far.
    pub fn kills(&self) -> Vec<PeerKill> {
        self.kills.lock().map(|k| k.clone()).unwrap_or_default()
    }
}

/// A peer controller running on its own thread until [`PeerController::stop`].
pub struct PeerController {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    state: Arc<PeerState>,
}

impl PeerController {
    /// Senpai on the v1 group `be` (limit and usage), reading PSI from the cgroup2
    /// group `be_psi` that holds the same processes.
    pub fn start_senpai(be: PathBuf, be_psi: PathBuf, cfg: SenpaiConfig) -> Result<Self> {
        let group = MemoryCgroup::open(&be).map_err(|e| linux_err(&be, e))?;
        let pressure = be_psi.join("memory.pressure");
        let total = Psi::read(&pressure)
            .map_err(|e| linux_err(&pressure, e))?
            .some
            .total_us;
        let usage = group.read_usage_bytes().map_err(|e| linux_err(&be, e))?;
        let mut ctl = Senpai::new(cfg, total);
        let state = Arc::new(PeerState::default());
        let write = |state: &PeerState, ctl: &mut Senpai, group: &MemoryCgroup, step| {
            if let SenpaiStep::Set { limit_bytes, .. } = step {
                state.limit_writes.fetch_add(1, Ordering::Relaxed);
                match group.write_limit(Limit::Bytes(limit_bytes)) {
                    Ok(()) => state.be_limit_bytes.store(limit_bytes, Ordering::Relaxed),
                    Err(_) => {
                        state.limit_write_failures.fetch_add(1, Ordering::Relaxed);
                        ctl.write_failed();
                    }
                }
            }
        };
        let step = ctl.start(usage);
        write(&state, &mut ctl, &group, step);
        Self::spawn(state, Duration::from_secs(1), move |state, _t| {
            let reading = (|| {
                let total = Psi::read(&pressure).ok()?.some.total_us;
                let limit = match group.read_limit().ok()? {
                    Limit::Bytes(b) => b,
                    Limit::Max => u64::MAX,
                };
                Some((total, limit, group.read_usage_bytes().ok()?))
            })();
            match reading {
                Some((total, limit, usage)) => {
                    let step = ctl.tick(total, limit, usage);
                    write(state, &mut ctl, &group, step);
                }
                None => {
                    state.read_failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    }

    /// Koordinator's BE eviction on the v1 node group `node` (capacity: its limit),
    /// killing among `jobs`, whose processes are found in the v1 group `be`.
    pub fn start_koordinator(
        node: PathBuf,
        be: PathBuf,
        jobs: Vec<KillableJob>,
        cfg: KoordinatorConfig,
    ) -> Result<Self> {
        let node = MemoryCgroup::open(&node).map_err(|e| linux_err(&node, e))?;
        let be = MemoryCgroup::open(&be).map_err(|e| linux_err(&be, e))?;
        let mut ctl = Koordinator::new(cfg);
        let mut alive = jobs;
        let state = Arc::new(PeerState::default());
        let t0 = Instant::now();
        Self::spawn(state, cfg.interval, move |state, now| {
            let reading = (|| {
                let capacity = match node.read_limit().ok()? {
                    Limit::Bytes(b) => b,
                    Limit::Max => return None,
                };
                let usage = node.read_usage_bytes().ok()?;
                let cache = node.read_memory_stat().ok()?.file_bytes;
                let tasks = job_usage(&be, &alive)?;
                Some((capacity, usage.saturating_sub(cache), tasks))
            })();
            let Some((capacity, used, tasks)) = reading else {
                state.read_failures.fetch_add(1, Ordering::Relaxed);
                return;
            };
            for name in ctl.round(now, capacity, used, &tasks) {
                let Some(i) = alive.iter().position(|j| j.name == name) else {
                    continue;
                };
                let job = alive.remove(i);
                // SAFETY: kill(2) of a process group the bench created and has not
                // reaped (see KillableJob).
                unsafe { libc::kill(-job.pgid, libc::SIGKILL) };
                let memory_bytes = tasks
                    .iter()
                    .find(|t| t.name == name)
                    .map_or(0, |t| t.memory_bytes);
                if let Ok(mut k) = state.kills.lock() {
                    k.push(PeerKill {
                        t_s: now.duration_since(t0).as_secs_f64(),
                        job: name,
                        memory_bytes,
                    });
                }
            }
        })
    }

    fn spawn(
        state: Arc<PeerState>,
        every: Duration,
        mut round: impl FnMut(&PeerState, Instant) + Send + 'static,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name("bench-peer".into())
            .spawn(move || {
                // A peer daemon is not pinned with the LC service: all CPUs, as the
                // agent.
                let all: Vec<usize> = (0..crate::process::online_cpus()).collect();
                let _unpin = crate::process::AffinityGuard::pin_current_thread(&all);
                let mut next = Instant::now() + every;
                while !sp.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now < next {
                        std::thread::sleep((next - now).min(Duration::from_millis(100)));
                        continue;
                    }
                    next += every;
                    round(&st, now);
                }
            })
            .map_err(|e| BenchError::Process(format!("peer thread: {e}")))?;
        Ok(PeerController {
            stop,
            handle: Some(handle),
            state,
        })
    }

    /// What the peer has done so far.
    pub fn state(&self) -> &Arc<PeerState> {
        &self.state
    }

    /// Stops the thread and returns what the peer did.
    pub fn stop(mut self) -> Arc<PeerState> {
        self.halt();
        self.state.clone()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for PeerController {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The memory usage without cache of each job in `jobs`: anonymous and shmem
/// resident bytes of the processes of `be` in the job's process group.
fn job_usage(be: &MemoryCgroup, jobs: &[KillableJob]) -> Option<Vec<BeTask>> {
    let procfs = ProcFs::root();
    let mut tasks: Vec<BeTask> = jobs
        .iter()
        .map(|j| BeTask {
            name: j.name.clone(),
            priority: 0,
            memory_bytes: 0,
        })
        .collect();
    for pid in be.read_procs_recursive().ok()? {
        // SAFETY: getpgid has no memory-safety preconditions.
        let pgid = unsafe { libc::getpgid(pid) };
        let Some(i) = jobs.iter().position(|j| j.pgid == pgid) else {
            continue;
        };
        if let Ok(st) = procfs.read_pid_status(pid) {
            tasks[i].memory_bytes += st.rss_anon_bytes + st.rss_shmem_bytes;
        }
    }
    Some(tasks)
}

fn linux_err(path: &std::path::Path, e: memcolo_linux::Error) -> BenchError {
    BenchError::Process(format!("{}: {e}", path.display()))
}
