//! MaxMem tiered memory in the agent (MaxMem §3.3, the central manager): processes
//! hand their large anonymous regions to the agent over the tiering socket
//! (`tier.sock` next to the agent's socket, protocol in `docs/protocol.md` §11), and
//! the agent runs a tier manager per region ([`memcolo_tier::manager`]: fault thread,
//! eviction worker, sampler) and the MaxMem policy over all of them
//! ([`memcolo_tier::node`]: a 1 s epoch of 50 ms sampling windows).
//!
//! A region arrives as a `tier_register` line carrying two descriptors
//! (`SCM_RIGHTS`): the userfaultfd the process registered the region with, and the
//! memfd backing it (`MAP_SHARED`), which the agent maps too, so that it can read
//! pages out and punch them out of memory ([`memcolo_tier::region::SharedFile`]).
//! libmemcolo sends them (`alloc/src/tier.c`); any program may.
//!
//! Lifetimes:
//! - `tier_unregister` (the process is unmapping the region): the manager stops
//!   without bringing pages back and the region's slow-tier copies are dropped.
//! - The connection closes: the process exited (its regions are discarded), or, if it
//!   still runs, its regions are handed back (every page brought back, the range
//!   unregistered) and keep working as plain memory.
//! - A page that cannot come back (the memory server stayed unreachable past its
//!   retry bound, a page failed its checksum): the process is stopped with SIGKILL
//!   and the reason is logged and kept in the status; it never reads zeros.
//! - The agent stops: every region is handed back, and `tier_released` is pushed to
//!   each connection before it is closed. A library that sees its connection close
//!   without it knows the agent died holding its pages and stops its process.
//!
//! Trust (`docs/protocol.md` §11): the socket is open to every user and every byte,
//! descriptor and length sent is a tenant's. A connection acts only on the process
//! that connected, a [`ProvenProcess`] (`SO_PEERPIDFD`) verified before each request;
//! it ends when that process exits or changes credentials, and a lost page kills it
//! through its pidfd only. A region is checked before anything is sized by it
//! ([`Uffd::from_untrusted_fd`], [`check_memfd`], [`check_mapping`] over the proven
//! process's `/proc/PID/maps`, the tier's scope). Connections are capped
//! ([`MAX_CONNECTIONS`], [`ROOT_RESERVED_CONNECTIONS`], [`MAX_CONNECTIONS_PER_UID`]);
//! answers are written outside shared locks and wait at most [`WRITE_TIMEOUT`], pushes
//! never wait, so a client that does not read is dropped, not waited for.
//!
//! Status (`tier_status`, `memcolo tier status`) and metrics (`memcolo_tier_*`) give,
//! per process: t_miss, a_miss, fast memory allotted and held, slow pages, and the
//! infeasible flag of MaxMem's first-come-first-served rule (§3.1).

use crate::metrics::Metrics;
use memcolo_linux::identity::{peer_cred, ticks_since_boot, ProvenProcess};
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::maxmem::{validate_t_miss, MaxMemConfig};
use memcolo_policy::tiering::{self, TierThreadSched};
use memcolo_policy::{Pid, PolicyError};
use memcolo_proto::tier::{decode_tier_request, TierReply, TierRequest, TIER_SOCKET_NAME};
use memcolo_proto::{encode, ErrorCode, MAX_LINE_BYTES};
use memcolo_tier::channel::Auth;
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::manager::{TierConfig, TierManager};
use memcolo_tier::node::{EpochApplied, NodeTiming, TierNode};
use memcolo_tier::region::{check_mapping, check_memfd, SharedFile, PAGE};
use memcolo_tier::remote::{RemoteConfig, RemoteTier};
use memcolo_tier::shadow::Shadow;
use memcolo_tier::uffd::{features, Uffd};
use memcolo_tier::SlowTier;
use prometheus::{IntCounter, IntGauge, IntGaugeVec, Opts};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::io::{IoSliceMut, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// `[tier]`: MaxMem tiering. On by default: the service acts only on the regions
/// processes hand it over the tiering socket (libmemcolo with `MEMCOLO_TIER=1`), and
/// idle it holds a socket and two threads that sleep until a region arrives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierSection {
    /// Serve the tiering socket and manage the regions processes send. Default true.
    pub enabled: bool,
    /// The tiering socket. Default `tier.sock` in the agent socket's directory.
    pub socket: Option<PathBuf>,
    /// Fast memory shared by every tiered region, bytes (MaxMem's DRAM tier).
    /// Default 1 GiB.
    pub fast_bytes: u64,
    /// Target FMMR of a process that names none, `]0, 1]`. Default 1 (best effort).
    pub default_t_miss: f64,
    /// Slow tier: `compressed` (LZ4 in the agent's memory) or `remote:HOST:PORT`
    /// (a `memcolo memserver`). Default `compressed`.
    pub slow: String,
    /// With `remote:`: the file holding the secret shared with the memory server
    /// (its `--secret-file`; a regular file of 32 to 4096 bytes, mode 0600 or
    /// stricter). Default none.
    pub slow_secret_file: Option<PathBuf>,
    /// With `remote:` and no `slow_secret_file`: talk to a memory server started
    /// with `--insecure-no-auth` (anyone who reaches it reads and writes every
    /// page). For tests on the loopback interface only. Default false.
    pub slow_insecure_no_auth: bool,
    /// Bytes the compressed slow tier may hold. Default 8 GiB.
    pub slow_capacity_bytes: u64,
    /// Policy migrations per epoch, bytes (MaxMem §3.1: 4 GB per epoch; half for
    /// reallocation, half for hot/cold exchange). Default 256 MiB.
    pub migration_cap_bytes: u64,
    /// Sampling window, ms. Default 50.
    pub window_ms: u64,
    /// Windows per policy epoch. Default 20 (1 s epochs, MaxMem §3.1).
    pub windows_per_epoch: u32,
    /// Slots per sampling window. While a region has slow accesses, its sampled
    /// pages touched are re-armed at every slot boundary, so that its fast accesses
    /// are counted per slot rather than as distinct pages per window (the FMMR is a
    /// ratio of accesses, MaxMem §3). Default 5 (10 ms slots); 1: no re-arming.
    pub slots_per_window: u32,
    /// Most resident pages sampled per region and window. Default 64.
    pub sample_pages: usize,
    /// Sample hits aimed at per region and window (each costs the process a fault;
    /// 0: always `sample_pages`). Default 16.
    pub sample_target_hits: usize,
    /// Standard error of an epoch's measured FMMR that each window's sample is sized
    /// for (within `sample_target_hits` and `sample_pages`); 0: always aim at
    /// `sample_target_hits`. Default 0.01. The sample is also all the hotness bins
    /// learn from, so this trades the process's sample faults against how well its
    /// hot pages are told apart (`bench/tiering/RESULTS.md`, sections kv and earlier/kv-*).
    pub sample_fmmr_error: f64,
    /// Eviction worker threads per region. Default 1.
    pub evict_workers: usize,
    /// Serve latency-critical processes' faults first: the fault thread of every
    /// region of a process with t_miss < 1 runs `SCHED_FIFO` (priority 1), so that
    /// its faults do not wait for a CPU behind a thrashing best-effort process's
    /// fault and eviction threads. Follows live target changes. Default true.
    pub lc_fault_priority: bool,
    /// Nice value (-20..=19) of the fault and eviction threads of a best-effort
    /// process's regions (t_miss >= 1). A latency-critical process's faulting
    /// thread, once its page is mapped, waits for its CPU behind every runnable
    /// thread there; beside a thrashing best-effort process, that was its fault
    /// thread (busy ~100 % at 20K+ faults/s) and eviction workers
    /// (`bench/tiering/faultpath.py`). 0 leaves them at the default. Default 19.
    pub be_thread_nice: i32,
    /// Run the fault and eviction threads of a best-effort process's regions
    /// (t_miss >= 1) `SCHED_IDLE` (a rule of ours, not MaxMem's): they get a CPU only
    /// when no ordinary or real-time thread wants it, a latency-critical process's
    /// thread waking beside them preempts them at once, and the scheduler places
    /// wake-ups on a CPU running only such threads as on an idle one. At nice 19
    /// (`be_thread_nice`, which still applies when this is off) GUPS's fault
    /// thread, serving 12-17K slow faults/s beside the KV store, took most of a
    /// vCPU: 40-52 µs of wall time per fault (`bench/tiering/RESULTS.md`, earlier/kv-final4).
    /// Measured: of that wall time 12-17 µs is the thread's CPU, the rest
    /// preemption, and `SCHED_IDLE` took a quarter of GUPS's faults away without
    /// the store gaining (3 paired reps, 101K against 104K ops/s at nice 19,
    /// `bench/tiering/RESULTS.md`, section earlier/kv-idle-dev; `docs/design.md`, "A best-effort
    /// process's tier threads run idle: measured, off"). Default false.
    pub be_thread_idle: bool,
    /// Most pages per region on probation: the next victims, unmapped with their
    /// contents kept in fast memory, so that a touch gives a page a second chance
    /// instead of a trip to the slow tier (0: none). Default 128 (never more than an
    /// eighth of the region's fast pages; only once the region has had to evict).
    pub probation_pages: usize,
    /// Count a slow fault on a page evicted fewer evictions ago than its region has
    /// resident pages (a refault at a short distance, as Linux's workingset
    /// detection) as a hotness sample for sure, so that a process given fast memory
    /// keeps its hot pages there sooner instead of as the sampler happens on them
    /// (`memcolo_tier::manager`, "Refaults"). Measured on the KV bench: arrival 14
    /// epochs against 16-18 and 11 % less fast memory at the same t_miss, with 12 %
    /// less throughput. Default false.
    pub refault_samples: bool,
    /// Rule T3a of `memcolo_policy::maxmem`: the fast memory reallocated per epoch
    /// follows the neediest process's distance from its target by its newest
    /// measured miss ratio, from `R/2` near the target (`R`, half the migration cap,
    /// MaxMem §3.1) up to the whole cap while it misses at least twice its t_miss,
    /// and a needy process whose newest measured ratio meets its target is held
    /// while its a_miss EWMA follows; false: `R` per epoch as in §3.1. Default true.
    pub proportional_step: bool,
}

impl Default for TierSection {
    /// The tier manager's and the node's own defaults ([`TierConfig::new`],
    /// [`NodeTiming::default`]) where they have one; the rest are the agent's.
    fn default() -> Self {
        let manager = TierConfig::new(0);
        let timing = NodeTiming::default();
        TierSection {
            enabled: true,
            socket: None,
            fast_bytes: 1 << 30,
            default_t_miss: 1.0,
            slow: "compressed".into(),
            slow_secret_file: None,
            slow_insecure_no_auth: false,
            slow_capacity_bytes: 8 << 30,
            migration_cap_bytes: 256 << 20,
            window_ms: timing.window.as_millis() as u64,
            windows_per_epoch: timing.windows_per_epoch,
            slots_per_window: timing.slots_per_window,
            sample_pages: manager.sample_pages,
            sample_target_hits: manager.sample_target_hits,
            sample_fmmr_error: manager.sample_fmmr_error,
            evict_workers: manager.evict_workers,
            lc_fault_priority: true,
            be_thread_nice: 19,
            be_thread_idle: false,
            probation_pages: manager.probation_pages,
            refault_samples: manager.refault_samples,
            proportional_step: true,
        }
    }
}

impl TierSection {
    /// Checks the section.
    ///
    /// # Errors
    /// A message naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.fast_bytes < PAGE as u64 {
            return Err(format!(
                "tier.fast_bytes {} is below one page",
                self.fast_bytes
            ));
        }
        validate_t_miss(self.default_t_miss).map_err(|e| format!("tier.default_t_miss: {e}"))?;
        if self.slow != "compressed" && !self.slow.starts_with("remote:") {
            return Err(format!(
                "tier.slow {:?}: `compressed` or `remote:HOST:PORT`",
                self.slow
            ));
        }
        if self.slow.starts_with("remote:") {
            match (&self.slow_secret_file, self.slow_insecure_no_auth) {
                (Some(_), true) => {
                    return Err(
                        "tier.slow_secret_file and tier.slow_insecure_no_auth: one or the other"
                            .into(),
                    )
                }
                (None, false) => {
                    return Err(format!(
                        "tier.slow {:?} needs tier.slow_secret_file (the memory server's --secret-file), or tier.slow_insecure_no_auth for tests on loopback",
                        self.slow
                    ))
                }
                _ => {}
            }
        }
        if !(self.sample_fmmr_error >= 0.0 && self.sample_fmmr_error < 1.0) {
            return Err(format!(
                "tier.sample_fmmr_error {}: in [0, 1)",
                self.sample_fmmr_error
            ));
        }
        if !(-20..=19).contains(&self.be_thread_nice) {
            return Err(format!(
                "tier.be_thread_nice {}: in -20..=19",
                self.be_thread_nice
            ));
        }
        if self.window_ms == 0 || self.windows_per_epoch == 0 || self.sample_pages == 0 {
            return Err(
                "tier.window_ms, windows_per_epoch and sample_pages must be positive".into(),
            );
        }
        Ok(())
    }

    /// The tiering socket for an agent socket at `agent_socket`.
    pub fn socket_path(&self, agent_socket: &Path) -> PathBuf {
        self.socket.clone().unwrap_or_else(|| {
            agent_socket
                .parent()
                .unwrap_or(Path::new("/"))
                .join(TIER_SOCKET_NAME)
        })
    }
}

/// Features the library negotiates on a region's userfaultfd.
const REGION_FEATURES: u64 = features::PAGEFAULT_FLAG_WP
    | features::MISSING_SHMEM
    | features::WP_HUGETLBFS_SHMEM
    | features::EVENT_REMOVE;

/// Most connections open at once on the tiering socket; the last
/// [`ROOT_RESERVED_CONNECTIONS`] of them only for root (`docs/protocol.md` §11).
pub const MAX_CONNECTIONS: usize = 512;
/// Connections kept for root (the operator's `memcolo tier status` and `target`)
/// however many other users hold.
pub const ROOT_RESERVED_CONNECTIONS: usize = 32;
/// Most connections open at once per non-root uid (libmemcolo holds one per process).
pub const MAX_CONNECTIONS_PER_UID: usize = 64;
/// Most regions managed at once per non-root uid (each has a fault thread and
/// eviction workers).
pub const MAX_REGIONS_PER_UID: usize = 128;
/// How long an answer waits for its peer to read; a peer that does not read by then
/// is dropped, its regions handled as on any disconnect.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most descriptors a request carries (userfaultfd, memfd, shadow).
const MAX_FDS: usize = 3;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Region {
    /// The region's key in the slow tier, told only to its process (a process that
    /// knows it may recover the region's pages after a crash: `tier_recover`).
    id: u64,
    /// What `tier status` shows: this agent's sequence number of the region.
    seq: u64,
    pid: Pid,
    /// The process the region is a mapping of: every signal goes through its pidfd.
    proc_: Arc<ProvenProcess>,
    /// Its effective uid when it connected.
    uid: u32,
    start: u64,
    length: u64,
    first_page: u64,
    conn: u64,
    /// Its pages outlive this agent (a durable slow tier and a shadow): a new agent
    /// can recover it after a crash.
    durable: bool,
}

struct Metricset {
    a_miss: prometheus::GaugeVec,
    t_miss: prometheus::GaugeVec,
    bytes: IntGaugeVec,
    infeasible: IntGaugeVec,
    faults: IntGaugeVec,
    free_bytes: IntGauge,
    regions: IntGauge,
    migrations: IntCounter,
    stopped: IntCounter,
}

impl Metricset {
    fn new(m: &Metrics) -> Self {
        let r = &m.registry;
        let gv = |name: &str, help: &str, labels: &[&str]| {
            let g = prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("metric");
            let _ = r.register(Box::new(g.clone()));
            g
        };
        let igv = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("metric");
            let _ = r.register(Box::new(g.clone()));
            g
        };
        let free_bytes = IntGauge::new(
            "memcolo_tier_free_bytes",
            "fast memory held by no tiered process",
        )
        .expect("metric");
        let regions = IntGauge::new("memcolo_tier_regions", "tiered regions").expect("metric");
        let migrations = IntCounter::new(
            "memcolo_tier_migrations_total",
            "MaxMem policy migrations carried out (pages)",
        )
        .expect("metric");
        let stopped = IntCounter::new(
            "memcolo_tier_processes_stopped_total",
            "processes stopped because a page could not come back",
        )
        .expect("metric");
        for c in [&free_bytes, &regions] {
            let _ = r.register(Box::new(c.clone()));
        }
        for c in [&migrations, &stopped] {
            let _ = r.register(Box::new(c.clone()));
        }
        Metricset {
            a_miss: gv(
                "memcolo_tier_a_miss",
                "measured fast-memory miss ratio (EWMA, MaxMem §3.1)",
                &["pid"],
            ),
            t_miss: gv(
                "memcolo_tier_t_miss",
                "target fast-memory miss ratio",
                &["pid"],
            ),
            bytes: igv(
                "memcolo_tier_bytes",
                "tiered memory of a process by kind: alloc (fast allotted), fast, slow",
                &["pid", "kind"],
            ),
            infeasible: igv(
                "memcolo_tier_infeasible",
                "1 if the target cannot be met (first come, first served)",
                &["pid"],
            ),
            faults: igv(
                "memcolo_tier_faults",
                "faults since the region arrived, by kind: slow, zero, sample, probation",
                &["pid", "kind"],
            ),
            free_bytes,
            regions,
            migrations,
            stopped,
        }
    }
}

struct Shared {
    cfg: TierSection,
    node: TierNode,
    slow: Arc<dyn SlowTier>,
    regions: Mutex<Vec<Region>>,
    /// The open connections, by connection id.
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Connections accepted and not yet closed, by peer uid (the caps).
    slots: Mutex<HashMap<u32, usize>>,
    procfs: ProcFs,
    /// Regions registered so far (their `tier status` numbers); hashed with
    /// [`Shared::ids`] into region keys.
    next_region: AtomicU64,
    /// The random key region keys are drawn with: they are the slow tier's keys, which
    /// a memory server keeps across agents (a recovered region keeps its key), so a
    /// key must not repeat across agents nor be guessed by another process; status
    /// shows the sequence number instead, and only the region's process is told the
    /// key.
    ids: std::collections::hash_map::RandomState,
    next_conn: AtomicU64,
    stop: AtomicBool,
    /// Ends the running epochs (set with `stop`, or when an epoch ends with no
    /// region attached); see [`policy_loop`].
    pause: AtomicBool,
    metrics: Metricset,
    /// Processes stopped because a page could not come back: `(pid, reason)`.
    stopped: Mutex<Vec<(Pid, String)>>,
    epoch: AtomicU64,
}

/// The running tiering service; [`TierService::stop`] hands every region back.
pub struct TierService {
    shared: Arc<Shared>,
    socket: PathBuf,
    threads: Vec<JoinHandle<()>>,
}

fn slow_tier(cfg: &TierSection) -> anyhow::Result<Arc<dyn SlowTier>> {
    if let Some(addr) = cfg.slow.strip_prefix("remote:") {
        let auth = match &cfg.slow_secret_file {
            Some(path) => {
                Auth::from_file(path).map_err(|e| anyhow::anyhow!("tier.slow_secret_file: {e}"))?
            }
            None if cfg.slow_insecure_no_auth => Auth::InsecureNoAuth,
            None => anyhow::bail!("tier.slow {:?}: no tier.slow_secret_file", cfg.slow),
        };
        let t = RemoteTier::connect(RemoteConfig::new(addr, PAGE, auth))
            .map_err(|e| anyhow::anyhow!("tier.slow: {e}"))?;
        Ok(Arc::new(t))
    } else {
        Ok(Arc::new(CompressedStore::new(
            PAGE,
            cfg.slow_capacity_bytes,
        )))
    }
}

impl TierService {
    /// Binds the tiering socket and starts the accept and policy threads.
    ///
    /// # Errors
    /// An invalid section, an unreachable memory server, a socket that cannot be bound.
    pub fn start(
        cfg: &TierSection,
        agent_socket: &Path,
        procfs: &ProcFs,
        metrics: &Metrics,
    ) -> anyhow::Result<Self> {
        cfg.validate()
            .map_err(|e| anyhow::anyhow!("invalid config: {e}"))?;
        // No region could ever be served without userfaultfd and the features
        // libmemcolo asks for (a kernel built without them).
        Uffd::open(REGION_FEATURES).map_err(|e| {
            anyhow::anyhow!("no userfaultfd with write-protect on shared memory: {e}")
        })?;
        let policy = MaxMemConfig {
            migration_cap_pages: (cfg.migration_cap_bytes / PAGE as u64).max(2),
            proportional_step: cfg.proportional_step,
            ..MaxMemConfig::with_capacity(cfg.fast_bytes / PAGE as u64, PAGE as u64)
        };
        let node = TierNode::new(policy).map_err(|e| anyhow::anyhow!("tier policy: {e}"))?;
        let socket = cfg.socket_path(agent_socket);
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                anyhow::anyhow!("cannot create socket directory {}: {e}", dir.display())
            })?;
        }
        if socket.exists() {
            if UnixStream::connect(&socket).is_ok() {
                anyhow::bail!("another agent serves {}", socket.display());
            }
            std::fs::remove_file(&socket)?;
        }
        let listener = UnixListener::bind(&socket)
            .map_err(|e| anyhow::anyhow!("cannot bind {}: {e}", socket.display()))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))?;
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            slow: slow_tier(cfg)?,
            cfg: cfg.clone(),
            node,
            regions: Mutex::new(Vec::new()),
            conns: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
            procfs: procfs.clone(),
            next_region: AtomicU64::new(1),
            ids: Default::default(),
            next_conn: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            pause: AtomicBool::new(false),
            metrics: Metricset::new(metrics),
            stopped: Mutex::new(Vec::new()),
            epoch: AtomicU64::new(0),
        });
        let mut threads = Vec::new();
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("tier-accept".into())
                .spawn(move || accept_loop(&s, listener))?,
        );
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("tier-policy".into())
                .spawn(move || policy_loop(&s))?,
        );
        tracing::info!(socket = %socket.display(), fast_bytes = cfg.fast_bytes, slow = %cfg.slow, "tiering: serving");
        Ok(TierService {
            shared,
            socket,
            threads,
        })
    }

    /// The tiering state, as `tier_status` answers it.
    pub fn status(&self) -> serde_json::Value {
        status_json(&self.shared)
    }

    /// Stops: every region is handed back (pages brought back, range unregistered),
    /// each connection gets `tier_released` and is closed.
    pub fn stop(mut self) {
        // SeqCst: `policy_loop` relies on the order of these two stores.
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.pause.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Each process's target as it stands (it may have been changed live), told to
        // it with tier_released so that it hands its regions to the next agent with it.
        let targets: HashMap<Pid, f64> = self
            .shared
            .node
            .lock_policy()
            .statuses()
            .into_iter()
            .map(|p| (p.pid, p.t_miss))
            .collect();
        let regions: Vec<Region> = std::mem::take(&mut *lock(&self.shared.regions));
        for r in regions {
            release(&self.shared, &r, true);
        }
        let conns: Vec<Arc<Conn>> = lock(&self.shared.conns).drain().map(|(_, c)| c).collect();
        for c in conns {
            // Never waits for a peer: one that does not read misses it.
            c.push(encode(&TierReply::TierReleased {
                t_miss: targets.get(&c.pid()).copied(),
            }));
            c.hang_up();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Takes a region out of the node and stops its manager: `restore` brings every page
/// back (the process keeps the region as plain memory), otherwise the pages are
/// dropped (the region is being unmapped, or its process exited).
fn release(shared: &Shared, r: &Region, restore: bool) {
    let Some(m) = shared.node.detach(r.pid, r.first_page) else {
        return;
    };
    match Arc::try_unwrap(m) {
        Ok(m) => stop_or_discard(shared, r, m, restore),
        Err(m) => {
            // Still referenced by a running epoch: it stops when the last reference
            // goes, bringing its pages back or discarding them as asked here.
            tracing::info!(
                region = r.seq,
                "tiering: region still in use while released"
            );
            if !restore {
                m.discard_when_dropped();
            }
        }
    }
    // A process with no region left leaves the policy: its fast memory returns to
    // the free pool (§3.1 "Process exit").
    if !lock(&shared.regions).iter().any(|x| x.pid == r.pid) {
        shared.node.unregister(r.pid);
    }
}

fn stop_or_discard(shared: &Shared, r: &Region, m: TierManager, restore: bool) {
    if restore {
        if let Err(why) = m.stop() {
            if r.proc_.verify(&shared.procfs).is_ok() {
                tracing::error!(pid = r.pid, region = r.seq, reason = %why, "tiering: region could not be handed back");
            } else {
                // It exited while its pages were being brought back: nothing is lost.
                tracing::info!(
                    pid = r.pid,
                    region = r.seq,
                    "tiering: process exited while its region was handed back"
                );
            }
        }
    } else {
        m.discard();
    }
}

/// A connection's place in the caps; given back when dropped.
struct Slot {
    shared: Arc<Shared>,
    uid: u32,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut slots = lock(&self.shared.slots);
        if let Some(n) = slots.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                slots.remove(&self.uid);
            }
        }
    }
}

/// A place for a connection of `uid`, or why not: [`MAX_CONNECTIONS`] in all, of
/// which [`ROOT_RESERVED_CONNECTIONS`] only for root, and
/// [`MAX_CONNECTIONS_PER_UID`] per other uid.
fn take_slot(shared: &Arc<Shared>, uid: u32) -> Result<Slot, String> {
    let mut slots = lock(&shared.slots);
    let total: usize = slots.values().sum();
    let mine = slots.get(&uid).copied().unwrap_or(0);
    if uid == 0 {
        if total >= MAX_CONNECTIONS {
            return Err(format!("{total} connections open (cap {MAX_CONNECTIONS})"));
        }
    } else if mine >= MAX_CONNECTIONS_PER_UID {
        return Err(format!(
            "uid {uid} holds {mine} connections (cap {MAX_CONNECTIONS_PER_UID} per uid)"
        ));
    } else if total >= MAX_CONNECTIONS - ROOT_RESERVED_CONNECTIONS {
        return Err(format!(
            "{total} connections open (cap {} for non-root peers)",
            MAX_CONNECTIONS - ROOT_RESERVED_CONNECTIONS
        ));
    }
    *slots.entry(uid).or_insert(0) += 1;
    Ok(Slot {
        shared: shared.clone(),
        uid,
    })
}

/// Answers a connection that is not served with `reply` and closes it, never
/// waiting for the peer to read.
fn refuse(stream: &UnixStream, reply: &TierReply) {
    let line = encode(reply);
    // SAFETY: a non-blocking send from a live buffer on our socket.
    let _ = unsafe {
        libc::send(
            stream.as_raw_fd(),
            line.as_ptr().cast(),
            line.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn accept_loop(shared: &Arc<Shared>, listener: UnixListener) {
    while !shared.stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polling one valid descriptor.
        unsafe { libc::poll(&mut pfd, 1, 200) };
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!(error = %e, "tiering: accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let accepted_at = ticks_since_boot();
        let _ = stream.set_nonblocking(false);
        let uid = match peer_cred(stream.as_fd()) {
            Ok(c) => c.uid,
            Err(e) => {
                tracing::warn!(error = %e, "tiering: no peer credentials");
                continue;
            }
        };
        let slot = match take_slot(shared, uid) {
            Ok(s) => s,
            Err(why) => {
                tracing::warn!(uid, reason = %why, "tiering: connection refused");
                refuse(&stream, &err(ErrorCode::PermissionDenied, why));
                continue;
            }
        };
        let s = shared.clone();
        let conn = s.next_conn.fetch_add(1, Ordering::Relaxed);
        let _ = std::thread::Builder::new()
            .name(format!("tier-conn-{conn}"))
            .spawn(move || connection(&s, conn, stream, accepted_at, slot));
    }
}

/// An open connection: its proven peer and how answers and pushes reach it.
struct Conn {
    id: u64,
    /// The process that connected (`SO_PEERPIDFD`): the only process the
    /// connection's requests act on.
    proc_: Arc<ProvenProcess>,
    /// Its effective uid when proved.
    uid: u32,
    /// The socket, to hang up on (never written through).
    stream: UnixStream,
    /// The socket to write through, held only while a message is written.
    writer: Mutex<UnixStream>,
    /// Pushes waiting for the writer (`tier_target_set`, `tier_released`).
    outbox: Mutex<VecDeque<String>>,
}

impl Conn {
    fn pid(&self) -> Pid {
        self.proc_.pid()
    }

    /// Writes the connection's own answer, waiting up to [`WRITE_TIMEOUT`] for the
    /// peer to read; false (and the connection hung up) if it did not.
    fn answer(&self, line: &str) -> bool {
        let mut w = lock(&self.writer);
        let ok = w.write_all(line.as_bytes()).is_ok() && self.drain(&w);
        drop(w);
        if !ok {
            self.hang_up();
            return false;
        }
        self.flush()
    }

    /// Queues a push and writes what the writer is free to write now, never waiting
    /// for the peer: a peer whose socket buffer is full is hung up on.
    fn push(&self, line: String) {
        lock(&self.outbox).push_back(line);
        self.flush();
    }

    fn flush(&self) -> bool {
        loop {
            let w = match self.writer.try_lock() {
                Ok(w) => w,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                // Its holder writes the outbox before it lets go.
                Err(std::sync::TryLockError::WouldBlock) => return true,
            };
            let ok = self.drain(&w);
            drop(w);
            if !ok {
                self.hang_up();
                return false;
            }
            if lock(&self.outbox).is_empty() {
                return true;
            }
        }
    }

    /// Writes the outbox without waiting; false if the peer's buffer is full.
    fn drain(&self, w: &UnixStream) -> bool {
        loop {
            let Some(m) = lock(&self.outbox).pop_front() else {
                return true;
            };
            // SAFETY: a non-blocking send from a live buffer on our socket.
            let n = unsafe {
                libc::send(
                    w.as_raw_fd(),
                    m.as_ptr().cast(),
                    m.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n != m.len() as isize {
                return false;
            }
        }
    }

    /// Ends the connection: its thread sees the end of the stream and hands its
    /// regions back as on any disconnect.
    fn hang_up(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Reads what is available: bytes into `buf`, descriptors into `fds`. Returns the
/// bytes read (0 at end of stream).
fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<usize> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut iov = [IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; 8]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let n = msg.bytes;
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(rs) = c {
            for fd in rs {
                // SAFETY: the kernel just installed this descriptor for us.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Ok(n)
}

/// Waits until `stream` is readable (true) or the process behind `pidfd` exited
/// (false); wakes every second to look at `stop`.
fn wait_readable(shared: &Shared, stream: &UnixStream, pidfd: RawFd) -> bool {
    while !shared.stop.load(Ordering::Acquire) {
        let mut fds = [
            libc::pollfd {
                fd: stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: polling two valid descriptors.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
        if n > 0 {
            if fds[1].revents != 0 {
                return false;
            }
            return true;
        }
    }
    false
}

fn connection(shared: &Arc<Shared>, id: u64, stream: UnixStream, accepted_at: u64, _slot: Slot) {
    let proc_ = match ProvenProcess::from_peer(&shared.procfs, stream.as_fd(), accepted_at) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            tracing::warn!(error = %e, "tiering: the connecting process cannot be proved");
            let code = if e.is_gone() {
                ErrorCode::NoSuchProcess
            } else {
                ErrorCode::PermissionDenied
            };
            refuse(&stream, &err(code, format!("the connecting process: {e}")));
            return;
        }
    };
    let (Ok(writer), Ok(hangup)) = (stream.try_clone(), stream.try_clone()) else {
        return;
    };
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let conn = Arc::new(Conn {
        id,
        uid: proc_.credentials().euid(),
        proc_,
        stream: hangup,
        writer: Mutex::new(writer),
        outbox: Mutex::new(VecDeque::new()),
    });
    lock(&shared.conns).insert(id, conn.clone());
    let pid = conn.pid();
    let pidfd = conn.proc_.pidfd().as_raw_fd();
    let mut pending: Vec<u8> = Vec::new();
    // Bytes of an over-long line dropped so far (its newline not seen yet).
    let mut overflow = 0usize;
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut buf = vec![0u8; 16 << 10];
    'read: loop {
        if !wait_readable(shared, &stream, pidfd) {
            break;
        }
        let n = match recv_with_fds(&stream, &mut buf, &mut fds) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if fds.len() > MAX_FDS {
            // More than any request carries: none is kept (the request then lacks
            // them and is refused).
            fds.clear();
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some(i) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            // A line over the limit is refused whole (protocol §2), never its tail
            // taken for a request of its own.
            let long = overflow + line.len();
            overflow = 0;
            if long > MAX_LINE_BYTES + 1 {
                fds.clear();
                let e = err(
                    ErrorCode::BadRequest,
                    format!("line of {long} bytes is over the {MAX_LINE_BYTES}-byte limit"),
                );
                if !conn.answer(&encode(&e)) {
                    break 'read;
                }
                continue;
            }
            let text = String::from_utf8_lossy(&line);
            if text.trim().is_empty() {
                continue;
            }
            // The connecting process is still the one proved, or the connection ends.
            if let Err(e) = conn.proc_.verify(&shared.procfs) {
                let code = if e.is_gone() {
                    ErrorCode::NoSuchProcess
                } else {
                    ErrorCode::PermissionDenied
                };
                tracing::info!(pid, error = %e, "tiering: the connecting process changed; connection ends");
                conn.answer(&encode(&err(code, format!("the connecting process: {e}"))));
                break 'read;
            }
            let reply = match decode_tier_request(&text) {
                Err(e) => TierReply::Error {
                    code: e.code(),
                    message: e.to_string(),
                },
                Ok(req) => handle(shared, &conn, req, &mut fds),
            };
            // Descriptors go with the line they came with.
            fds.clear();
            if !conn.answer(&encode(&reply)) {
                break 'read;
            }
        }
        if pending.len() > MAX_LINE_BYTES {
            overflow += pending.len();
            pending.clear();
        }
    }
    if shared.stop.load(Ordering::Acquire) {
        // The stop hands the regions back, then pushes tier_released and hangs up.
        return;
    }
    conn.hang_up();
    lock(&shared.conns).remove(&id);
    // The process exited (or closed its link): discard or hand back its regions.
    let mine: Vec<Region> = {
        let mut rs = lock(&shared.regions);
        let (mine, rest) = rs.drain(..).partition(|r| r.conn == id);
        *rs = rest;
        mine
    };
    let restore = conn.proc_.verify(&shared.procfs).is_ok();
    for r in &mine {
        tracing::info!(
            pid,
            region = r.seq,
            restore,
            "tiering: connection closed; region leaves management"
        );
        release(shared, r, restore);
    }
}

fn err(code: ErrorCode, message: impl Into<String>) -> TierReply {
    TierReply::Error {
        code,
        message: message.into(),
    }
}

fn policy_err(e: PolicyError) -> TierReply {
    match e {
        PolicyError::UnknownProcess { pid } => err(
            ErrorCode::NotRegistered,
            format!("pid {pid} has no tiered region"),
        ),
        other => err(ErrorCode::BadRequest, other.to_string()),
    }
}

fn handle(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    req: TierRequest,
    fds: &mut Vec<OwnedFd>,
) -> TierReply {
    let (pid, uid) = (conn.pid(), conn.uid);
    match req {
        TierRequest::TierRegister {
            start,
            length,
            t_miss,
        } => {
            let Some(fds) = RegionFds::take(fds, 2) else {
                return err(
                    ErrorCode::BadRequest,
                    "tier_register needs two or three descriptors (userfaultfd, memfd, shadow) as SCM_RIGHTS",
                );
            };
            register(shared, conn, start, length, t_miss, fds, None)
        }
        TierRequest::TierRecover {
            start,
            length,
            region,
            slow_instance,
            t_miss,
        } => {
            let Some(fds) = RegionFds::take(fds, 3) else {
                return err(
                    ErrorCode::BadRequest,
                    "tier_recover needs three descriptors (userfaultfd, memfd, shadow) as SCM_RIGHTS",
                );
            };
            let recover = Some((region, slow_instance));
            register(shared, conn, start, length, t_miss, fds, recover)
        }
        TierRequest::TierUnregister { start } => {
            let r = {
                let mut rs = lock(&shared.regions);
                match rs.iter().position(|r| r.pid == pid && r.start == start) {
                    Some(k) => rs.swap_remove(k),
                    None => {
                        return err(
                            ErrorCode::NotRegistered,
                            format!("no tiered region of pid {pid} at {start:#x}"),
                        )
                    }
                }
            };
            release(shared, &r, false);
            TierReply::Ok
        }
        TierRequest::TierTarget {
            pid: target,
            t_miss,
        } => {
            let target = target.unwrap_or(pid);
            if uid != 0 && target != pid {
                return err(
                    ErrorCode::PermissionDenied,
                    format!("pid {target} is not yours"),
                );
            }
            match shared.node.set_t_miss(target, t_miss) {
                Ok(()) => {
                    apply_fault_priority(shared, target);
                    tracing::info!(pid = target, t_miss, "tiering: target changed");
                    // The process keeps its target, for a new agent after a crash.
                    let push = encode(&TierReply::TierTargetSet { t_miss });
                    let to: Vec<Arc<Conn>> = lock(&shared.conns)
                        .values()
                        .filter(|c| c.pid() == target)
                        .cloned()
                        .collect();
                    for c in to {
                        c.push(push.clone());
                    }
                    TierReply::Ok
                }
                Err(e) => policy_err(e),
            }
        }
        TierRequest::TierStatus => TierReply::TierStatus {
            status: status_json(shared),
        },
    }
}

/// The descriptors a region comes with (`docs/protocol.md` §11).
struct RegionFds {
    ufd: OwnedFd,
    memfd: OwnedFd,
    shadow: Option<OwnedFd>,
}

impl RegionFds {
    /// Every descriptor that came with the request's line, in order: userfaultfd,
    /// memfd, and the shadow if a third came. `None` (and none taken) if fewer than
    /// `least` came.
    fn take(fds: &mut Vec<OwnedFd>, least: usize) -> Option<RegionFds> {
        if fds.len() < least.max(2) {
            return None;
        }
        let mut it = fds.drain(..);
        let (ufd, memfd) = (it.next()?, it.next()?);
        Some(RegionFds {
            ufd,
            memfd,
            shadow: it.next(),
        })
    }
}

/// `tier_register` (`recover` None: a new region), or `tier_recover` of the region
/// whose id and slow-tier instance the dead agent gave (`recover`).
#[allow(clippy::too_many_arguments)]
fn register(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    start: u64,
    length: u64,
    t_miss: Option<f64>,
    fds: RegionFds,
    recover: Option<(u64, u64)>,
) -> TierReply {
    let RegionFds { ufd, memfd, shadow } = fds;
    let (pid, uid) = (conn.pid(), conn.uid);
    if length == 0 || !start.is_multiple_of(PAGE as u64) || !length.is_multiple_of(PAGE as u64) {
        return err(
            ErrorCode::BadRequest,
            format!("region {start:#x}+{length} is not page aligned"),
        );
    }
    let t_miss = t_miss.unwrap_or(shared.cfg.default_t_miss);
    if let Err(e) = validate_t_miss(t_miss) {
        return err(ErrorCode::BadRequest, e.to_string());
    }
    // Nothing is sized by the client's numbers before they are checked: the region
    // within the tier's scope, the uid's regions too, none overlapping another of
    // the process.
    if let Err(e) = check_scope(shared, conn, start, length) {
        return e;
    }
    // The descriptors are what they claim to be, and the range is the memfd's
    // mapping in the proved process.
    let ufd = match Uffd::from_untrusted_fd(ufd, REGION_FEATURES) {
        Ok(u) => u,
        Err(e) => {
            return err(
                ErrorCode::BadRequest,
                format!("the region's userfaultfd: {e}"),
            )
        }
    };
    let memfd_id = match check_memfd(memfd.as_fd()) {
        Ok(id) => id,
        Err(e) => return err(ErrorCode::BadRequest, format!("the region's memfd: {e}")),
    };
    if let Some(sh) = &shadow {
        if let Err(e) = check_memfd(sh.as_fd()) {
            return err(ErrorCode::BadRequest, format!("the region's shadow: {e}"));
        }
    }
    let maps = shared.procfs.read_pid_maps_text(pid);
    // Read while the proved process was alive: its own maps.
    if let Err(e) = conn.proc_.verify(&shared.procfs) {
        return err(
            ErrorCode::NoSuchProcess,
            format!("the connecting process: {e}"),
        );
    }
    let maps = match maps {
        Ok(m) => m,
        Err(e) => return err(ErrorCode::Internal, e.to_string()),
    };
    if let Err(why) = check_mapping(&maps, start, length, &memfd_id) {
        return err(
            ErrorCode::BadRequest,
            format!("the region is not the memfd's mapping in pid {pid}: {why}"),
        );
    }
    let pages = (length / PAGE as u64) as usize;
    // A shadow serves only a recovery, which needs the stored pages to outlive this
    // agent too: with the compressed store it would cost a write per page sampled
    // or put on probation for nothing.
    let shadow = shadow.filter(|_| shared.slow.durable());
    let shadow = match shadow.map(|fd| Shadow::new(fd, pages)).transpose() {
        Ok(s) => s,
        Err(e) => return err(ErrorCode::BadRequest, format!("the region's shadow: {e}")),
    };
    if recover.is_some() && !shared.slow.durable() {
        return err(
            ErrorCode::BadRequest,
            format!(
                "this agent's slow tier ({}) does not outlive an agent: the region's pages are not here",
                shared.slow.name()
            ),
        );
    }
    if recover.is_some() && shadow.is_none() {
        return err(
            ErrorCode::BadRequest,
            "tier_recover needs the region's shadow",
        );
    }
    let (seq, id) = match recover {
        Some((id, _)) => {
            if lock(&shared.regions).iter().any(|r| r.id == id) {
                return err(ErrorCode::BadRequest, "that region is managed already");
            }
            (shared.next_region.fetch_add(1, Ordering::Relaxed), id)
        }
        None => new_region_id(shared),
    };
    // (A shadow is kept only with a durable tier, above.)
    let durable = shadow.is_some();
    let first_page = TierNode::first_page_of(start);
    if !shared.node.lock_policy().is_managed(pid) {
        if let Err(e) = shared.node.register(pid, t_miss) {
            return policy_err(e);
        }
    }
    let mem = match SharedFile::new(memfd, start, pages) {
        Ok(m) => m,
        Err(e) => {
            return err(
                ErrorCode::Internal,
                format!("mapping the region's memfd: {e}"),
            )
        }
    };
    let tcfg = TierConfig {
        sample_pages: shared.cfg.sample_pages,
        sample_target_hits: shared.cfg.sample_target_hits,
        sample_fmmr_error: shared.cfg.sample_fmmr_error,
        evict_workers: shared.cfg.evict_workers.max(1),
        probation_pages: shared.cfg.probation_pages,
        refault_samples: shared.cfg.refault_samples,
        track_remove: true,
        ..TierConfig::new(id)
    };
    let placement = shared.node.placement(pid, first_page);
    let uffd = ufd;
    let (mem, slow, placement) = (Box::new(mem), shared.slow.clone(), Box::new(placement));
    let started = match (shadow, recover) {
        (Some(sh), Some((_, instance))) => {
            TierManager::recover(uffd, mem, slow, placement, tcfg, sh, instance)
        }
        (Some(sh), None) => TierManager::start_shadowed(uffd, mem, slow, placement, tcfg, sh),
        (None, _) => TierManager::start(uffd, mem, slow, placement, tcfg),
    };
    let m = match started {
        Ok(m) => m,
        Err(e) => {
            let what = if recover.is_some() {
                "recovering the region"
            } else {
                "starting the tier manager"
            };
            // What no retry changes (a slow tier that is not durable, or restarted and
            // empty) is the request's fault; the rest (the server unreachable for a
            // moment) may pass.
            let code = match e.kind() {
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
                    ErrorCode::BadRequest
                }
                _ => ErrorCode::Internal,
            };
            return err(code, format!("{what}: {e}"));
        }
    };
    shared.node.attach(pid, first_page, Arc::new(m));
    apply_fault_priority(shared, pid);
    lock(&shared.regions).push(Region {
        id,
        seq,
        pid,
        proc_: conn.proc_.clone(),
        uid,
        start,
        length,
        first_page,
        conn: conn.id,
        durable,
    });
    tracing::info!(
        pid,
        region = seq,
        key = id,
        start = format!("{start:#x}"),
        length,
        t_miss,
        durable,
        recovered = recover.is_some(),
        "tiering: region registered"
    );
    TierReply::TierRegistered {
        region: id,
        durable,
        slow_instance: if durable { shared.slow.instance() } else { 0 },
    }
}

/// Whether `[start, start + length)` may be managed for `conn`'s process: within the
/// tier's scope (fast plus slow capacity, `tier.fast_bytes + tier.slow_capacity_bytes`),
/// a non-root uid's regions within it too and at most [`MAX_REGIONS_PER_UID`] of
/// them, and overlapping no region of the process. A region of an earlier process
/// with the same pid still being released asks for a retry.
fn check_scope(shared: &Shared, conn: &Conn, start: u64, length: u64) -> Result<(), TierReply> {
    let scope = shared
        .cfg
        .fast_bytes
        .saturating_add(shared.cfg.slow_capacity_bytes);
    let too_long = |what: String| {
        err(
            ErrorCode::BadRequest,
            format!("{what} exceeds the tier's scope of {scope} bytes (fast plus slow capacity)"),
        )
    };
    if length > scope {
        return Err(too_long(format!("a region of {length} bytes")));
    }
    let end = start.checked_add(length).ok_or_else(|| {
        err(
            ErrorCode::BadRequest,
            format!("{start:#x}+{length} wraps around"),
        )
    })?;
    let rs = lock(&shared.regions);
    let (mut bytes, mut count) = (length, 1usize);
    for r in rs.iter() {
        if r.pid == conn.pid() {
            if r.proc_.starttime_ticks() != conn.proc_.starttime_ticks() {
                return Err(err(
                    ErrorCode::Internal,
                    format!(
                        "an exited process's region with pid {} is being released; retry",
                        r.pid
                    ),
                ));
            }
            if r.start < end && start < r.start + r.length {
                return Err(err(
                    ErrorCode::BadRequest,
                    format!(
                        "{start:#x}+{length} overlaps the managed region {:#x}+{}",
                        r.start, r.length
                    ),
                ));
            }
        }
        if r.uid == conn.uid {
            bytes = bytes.saturating_add(r.length);
            count += 1;
        }
    }
    if conn.uid != 0 {
        if bytes > scope {
            return Err(too_long(format!(
                "uid {}'s regions ({bytes} bytes)",
                conn.uid
            )));
        }
        if count > MAX_REGIONS_PER_UID {
            return Err(err(
                ErrorCode::PermissionDenied,
                format!(
                    "uid {} manages {MAX_REGIONS_PER_UID} regions already (the cap)",
                    conn.uid
                ),
            ));
        }
    }
    Ok(())
}

/// A sequence number for `tier status`, and a key no region of this agent has: the
/// slow tier's key (see [`Shared::ids`]).
fn new_region_id(shared: &Shared) -> (u64, u64) {
    loop {
        let n = shared.next_region.fetch_add(1, Ordering::Relaxed);
        // 63 bits, never 0: ids print as plain JSON numbers.
        let id = (std::hash::BuildHasher::hash_one(&shared.ids, n) >> 1).max(1);
        if !lock(&shared.regions).iter().any(|r| r.id == id) {
            return (n, id);
        }
    }
}

/// Puts the fault threads of `pid`'s regions in `SCHED_FIFO` if the process is
/// latency-critical (t_miss < 1) and `tier.lc_fault_priority` is on, else back to
/// ordinary scheduling; a best-effort process's (t_miss >= 1) fault and eviction
/// threads run at `tier.be_thread_nice` and, with `tier.be_thread_idle`,
/// `SCHED_IDLE`; every other process's at nice 0, `SCHED_OTHER`.
fn apply_fault_priority(shared: &Shared, pid: Pid) {
    let t_miss = shared
        .node
        .lock_policy()
        .statuses()
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| p.t_miss);
    let sched = thread_sched(&shared.cfg, t_miss);
    for (p, _, _, m) in shared.node.regions() {
        if p == pid {
            if let Err(e) = m.set_latency_critical(sched.fault_fifo) {
                tracing::warn!(pid, error = %e, "tiering: fault thread priority");
            }
            if let Err(e) = m.set_nice(sched.nice) {
                tracing::warn!(pid, error = %e, "tiering: tier threads' nice value");
            }
            if let Err(e) = m.set_idle(sched.idle) {
                tracing::warn!(pid, error = %e, "tiering: tier threads' SCHED_IDLE");
            }
        }
    }
}

/// The scheduling of the tier threads of a process with target `t_miss` (`None`: not
/// registered), by [`tiering::tier_thread_sched`] with this section's settings.
fn thread_sched(cfg: &TierSection, t_miss: Option<f64>) -> TierThreadSched {
    tiering::tier_thread_sched(
        t_miss,
        cfg.lc_fault_priority,
        cfg.be_thread_nice,
        cfg.be_thread_idle,
    )
}

/// How often the idle policy thread (no region attached) looks for a region.
const IDLE_CHECK: Duration = Duration::from_millis(200);

/// Runs the MaxMem epochs while some region is attached. Without one the thread only
/// looks for a region every [`IDLE_CHECK`] (rather than waking at every 10 ms slot):
/// the service is on by default and must cost next to nothing on a node where no
/// process tiers.
fn policy_loop(shared: &Arc<Shared>) {
    let timing = NodeTiming {
        window: Duration::from_millis(shared.cfg.window_ms),
        windows_per_epoch: shared.cfg.windows_per_epoch,
        slots_per_window: shared.cfg.slots_per_window.max(1),
    };
    while !shared.stop.load(Ordering::Acquire) {
        if shared.node.regions().is_empty() {
            std::thread::sleep(IDLE_CHECK);
            continue;
        }
        shared.pause.store(false, Ordering::SeqCst);
        // `stop` sets `stop` before `pause` (SeqCst): either it is seen set here or
        // the epochs will see `pause` set.
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        run_epochs(shared, timing);
    }
}

/// Epochs until the agent stops or an epoch ends with no region attached.
fn run_epochs(shared: &Arc<Shared>, timing: NodeTiming) {
    shared.node.run(timing, &shared.pause, |out, applied| {
        shared.epoch.store(out.epoch, Ordering::Relaxed);
        on_fatal(shared, applied);
        let m = &shared.metrics;
        m.a_miss.reset();
        m.t_miss.reset();
        m.bytes.reset();
        m.infeasible.reset();
        for p in &out.procs {
            let pid = p.pid.to_string();
            m.a_miss.with_label_values(&[&pid]).set(p.a_miss);
            m.t_miss.with_label_values(&[&pid]).set(p.t_miss);
            let page = PAGE as i64;
            m.bytes
                .with_label_values(&[&pid, "alloc"])
                .set(p.alloc_pages as i64 * page);
            m.bytes
                .with_label_values(&[&pid, "fast"])
                .set(p.fast_pages as i64 * page);
            m.bytes
                .with_label_values(&[&pid, "slow"])
                .set(p.slow_pages as i64 * page);
            m.infeasible
                .with_label_values(&[&pid])
                .set(p.infeasible as i64);
        }
        m.free_bytes.set((out.free_pages * PAGE as u64) as i64);
        m.migrations.inc_by(applied.demoted + applied.promoted);
        m.faults.reset();
        let regions = shared.node.regions();
        m.regions.set(regions.len() as i64);
        for (pid, _, _, mgr) in regions {
            let s = mgr.stats();
            let pid = pid.to_string();
            for (kind, v) in [
                ("slow", s.slow_faults),
                ("zero", s.zero_faults),
                ("sample", s.sample_hits),
                ("probation", s.probation_hits),
            ] {
                m.faults.with_label_values(&[&pid, kind]).add(v as i64);
            }
        }
        if m.regions.get() == 0 || shared.stop.load(Ordering::Acquire) {
            shared.pause.store(true, Ordering::Release);
        }
    });
}

/// Stops every process that lost a page: SIGKILL, the reason logged and kept.
fn on_fatal(shared: &Arc<Shared>, applied: &EpochApplied) {
    for (pid, first_page, why) in &applied.fatal {
        let r = {
            let mut rs = lock(&shared.regions);
            rs.iter()
                .position(|r| r.pid == *pid && r.first_page == *first_page)
                .map(|k| rs.swap_remove(k))
        };
        // Only the proved process the region is a mapping of, through its pidfd: a
        // region already gone, or a process that exited (its pid perhaps reused) or
        // changed credentials, is not signalled.
        let Some(r) = r else {
            continue;
        };
        match r.proc_.signal(&shared.procfs, libc::SIGKILL) {
            Ok(()) => {
                tracing::error!(pid, reason = %why, "tiering: a page cannot come back; stopping the process");
                shared.metrics.stopped.inc();
                lock(&shared.stopped).push((*pid, why.clone()));
            }
            Err(e) => {
                tracing::warn!(pid, reason = %why, error = %e, "tiering: a region's page is lost; its process is not signalled");
            }
        }
        release(shared, &r, false);
    }
}

fn status_json(shared: &Shared) -> serde_json::Value {
    let policy = shared.node.lock_policy();
    let statuses = policy.statuses();
    let free = policy.free_pages();
    drop(policy);
    let regions = lock(&shared.regions);
    let managers = shared.node.regions();
    let procs: Vec<serde_json::Value> = statuses
        .iter()
        .map(|p| {
            let rs: Vec<serde_json::Value> = regions
                .iter()
                .filter(|r| r.pid == p.pid)
                .map(|r| {
                    let st = managers
                        .iter()
                        .find(|(pid, first, _, _)| *pid == r.pid && *first == r.first_page)
                        .map(|(_, _, _, m)| m.stats())
                        .unwrap_or_default();
                    serde_json::json!({
                        "region": r.seq, "start": r.start, "length_bytes": r.length,
                        "resident_pages": st.resident_pages, "stored_pages": st.stored_pages,
                        "slow_faults": st.slow_faults, "zero_faults": st.zero_faults,
                        "sample_hits": st.sample_hits, "evictions": st.evictions,
                        "probation_pages": st.probation_pages,
                        "probation_hits": st.probation_hits,
                        "probation_evictions": st.probation_evictions,
                        "refault_samples": st.refault_samples,
                        "prefetches": st.prefetches, "freed_pages": st.freed_pages,
                        "adopted_pages": st.adopted_pages,
                        "recovered_stored_pages": st.recovered_stored_pages,
                        "durable": r.durable,
                        "slow_fault_ns": st.slow_fault_ns,
                        "fault_thread_wait_ns": st.fault_thread_wait_ns,
                        "fault_thread_cpu_ns": st.fault_thread_cpu_ns,
                        "slow_load_ns": st.slow_load_ns,
                        "slow_map_ns": st.slow_map_ns,
                        "slow_drop_ns": st.slow_drop_ns,
                        "evict_threads_cpu_ns": st.evict_threads_cpu_ns,
                        "evict_threads_wait_ns": st.evict_threads_wait_ns,
                        "placement_ns": st.placement_ns,
                        "placement_max_ns": st.placement_max_ns,
                        "latency_critical": st.latency_critical,
                    })
                })
                .collect();
            serde_json::json!({
                "pid": p.pid, "t_miss": p.t_miss, "a_miss": p.a_miss, "need": p.need,
                "infeasible": p.infeasible,
                "alloc_bytes": p.alloc_pages * PAGE as u64,
                "fast_bytes": p.fast_pages * PAGE as u64,
                "slow_bytes": p.slow_pages * PAGE as u64,
                "regions": rs,
            })
        })
        .collect();
    let stopped: Vec<serde_json::Value> = lock(&shared.stopped)
        .iter()
        .map(|(pid, why)| serde_json::json!({"pid": pid, "reason": why}))
        .collect();
    let st = shared.slow.stats();
    serde_json::json!({
        "epoch": shared.epoch.load(Ordering::Relaxed),
        "fast_capacity_bytes": shared.cfg.fast_bytes,
        "free_bytes": free * PAGE as u64,
        "slow": {"kind": shared.slow.name(), "pages": st.pages, "stored_bytes": st.stored_bytes},
        "processes": procs,
        "stopped": stopped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_effort_tier_threads_take_the_configured_nice() {
        let cfg = TierSection::default();
        assert_eq!(thread_sched(&cfg, Some(1.0)).nice, 19);
        assert_eq!(thread_sched(&cfg, Some(0.1)).nice, 0);
        assert_eq!(thread_sched(&cfg, None).nice, 0);
        let off = TierSection {
            be_thread_nice: 0,
            ..TierSection::default()
        };
        assert_eq!(thread_sched(&off, Some(1.0)).nice, 0);
        let bad = TierSection {
            be_thread_nice: 20,
            ..TierSection::default()
        };
        assert!(bad.validate().unwrap_err().contains("be_thread_nice"));
    }

    #[test]
    fn only_best_effort_tier_threads_run_idle() {
        assert!(!thread_sched(&TierSection::default(), Some(1.0)).idle);
        let cfg = TierSection {
            be_thread_idle: true,
            ..TierSection::default()
        };
        assert!(thread_sched(&cfg, Some(1.0)).idle);
        assert!(!thread_sched(&cfg, Some(0.1)).idle);
        assert!(!thread_sched(&cfg, Some(0.999)).idle);
        assert!(!thread_sched(&cfg, None).idle);
        let off = TierSection {
            be_thread_idle: false,
            ..TierSection::default()
        };
        assert!(!thread_sched(&off, Some(1.0)).idle);
        // A target change moves a process between the two (applied live).
        assert_ne!(
            thread_sched(&cfg, Some(1.0)).idle,
            thread_sched(&cfg, Some(0.07)).idle
        );
    }

    #[test]
    fn sample_fmmr_error_is_checked() {
        let mut t = TierSection::default();
        assert!(t.validate().is_ok());
        t.sample_fmmr_error = 0.0;
        assert!(t.validate().is_ok(), "0: aim at sample_target_hits");
        for bad in [-0.1, 1.0, f64::NAN] {
            t.sample_fmmr_error = bad;
            assert!(t.validate().unwrap_err().contains("sample_fmmr_error"));
        }
    }
}
