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
//! ([`Uffd::from_untrusted_fd`], [`memcolo_tier::region::check_memfd`],
//! [`memcolo_tier::region::check_mapping`] over the proven process's `/proc/PID/maps`,
//! the tier's scope). Connections are capped
//! ([`MAX_CONNECTIONS`], [`ROOT_RESERVED_CONNECTIONS`], [`MAX_CONNECTIONS_PER_UID`]);
//! answers are written outside shared locks and wait at most [`WRITE_TIMEOUT`], pushes
//! never wait, so a client that does not read is dropped, not waited for.
//!
//! Status (`tier_status`, `memcolo tier status`) and metrics (`memcolo_tier_*`) give,
//! per process: t_miss, a_miss, fast memory allotted and held, slow pages, and the
//! infeasible flag of MaxMem's first-come-first-served rule (§3.1).
//!
//! This file holds the service's shared state, its start and stop, and the hand-back
//! of regions; `config.rs` the `[tier]` section, `connection.rs` the socket's
//! connections and requests, `register.rs` a region's arrival, `policy_thread.rs` the
//! MaxMem epochs, `status.rs` status and metrics.

mod config;
mod connection;
mod policy_thread;
mod register;
mod status;

use crate::metrics::Metrics;
use connection::{accept_loop, Conn};
use memcolo_linux::identity::ProvenProcess;
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::maxmem::MaxMemConfig;
use memcolo_policy::Pid;
use memcolo_proto::encode;
use memcolo_proto::tier::TierReply;
use memcolo_tier::channel::Auth;
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::manager::TierManager;
use memcolo_tier::node::TierNode;
use memcolo_tier::region::PAGE;
use memcolo_tier::remote::{RemoteConfig, RemoteTier};
use memcolo_tier::uffd::{features, Uffd};
use memcolo_tier::SlowTier;
use policy_thread::policy_loop;
use status::{status_json, Metricset};
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

pub use config::TierSection;

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

struct Shared {
    cfg: TierSection,
    node: TierNode,
    slow: Arc<dyn SlowTier>,
    regions: Mutex<Vec<Region>>,
    /// The open connections, by connection id.
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Connections accepted and not yet closed, by peer uid (the caps).
    slots: Mutex<crate::slots::Slots>,
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
    /// Targets for regions registered without one ([`TierDefaults`]).
    defaults: TierDefaults,
    epoch: AtomicU64,
}

/// Per-process targets for regions that register without a `t_miss` of their own:
/// Kubernetes mode fills it from pods' `memcolo.io/t-miss` annotations. Keyed by pid
/// as the last poll saw it; a pid reused since then only changes the starting target
/// of the new process's regions (which it may set itself with `tier_target`).
#[derive(Clone, Debug, Default)]
pub struct TierDefaults(Arc<Mutex<HashMap<Pid, f64>>>);

impl TierDefaults {
    /// Replaces every target.
    pub fn replace(&self, targets: HashMap<Pid, f64>) {
        *lock(&self.0) = targets;
    }

    /// The target for `pid`'s regions, if one was given.
    pub fn get(&self, pid: Pid) -> Option<f64> {
        lock(&self.0).get(&pid).copied()
    }
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
            slots: Mutex::new(crate::slots::Slots::default()),
            procfs: procfs.clone(),
            next_region: AtomicU64::new(1),
            ids: Default::default(),
            next_conn: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            pause: AtomicBool::new(false),
            metrics: Metricset::new(metrics),
            defaults: TierDefaults::default(),
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
    /// Where Kubernetes mode writes pods' tier targets.
    pub fn defaults(&self) -> TierDefaults {
        self.shared.defaults.clone()
    }

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
