//! The agent's core: one owner of all state, driven by the main loop with requests
//! from clients, poll ticks, kernel pressure events and process exits.
//!
//! Each poll is one sense → decide → act round:
//! 1. sense: the scope's memory ([`memcolo_linux::scope::Scope::sample`]), every
//!    process's `/proc/PID/stat` (RSS, parent, start time);
//! 2. decide: the M3 monitor ([`memcolo_policy::m3::Monitor::step`]) on the working
//!    set, and Hermes' advice ([`memcolo_policy::hermes::plan_advice`]) on used memory;
//! 3. act: notifications (socket messages or real-time signals), a Hermes advice
//!    round handed to the advice worker ([`crate::advice`]: file discovery,
//!    measurement and `posix_fadvise` on BE files run there, never on this loop),
//!    and — the last resort — SIGKILL of BE processes.
//!
//! Nothing here blocks on a client: notifications go into bounded per-connection
//! queues, and a full queue drops the notification (counted) instead of waiting.
//! An LC process is never killed: the policy never asks for it, and the core checks
//! the class again before acting.
//!
//! This file holds the state and its construction; the methods are grouped by
//! concept: `requests.rs` (client requests, proofs of registered processes),
//! `poll.rs` (the round and its metrics), `class_groups.rs` (the memory cgroups of each
//! class and their events), `be_memory_high.rs` (BE groups capped in the red zone on
//! cgroup v2), `actions.rs` (notify, kill), `advice.rs`
//! (Hermes rounds), `reclaim_targets.rs` (the snapshot for asynchronous reclaim),
//! `cpu_affinity.rs` (the agent kept off LC CPUs), `status.rs` (saved state, status).

mod actions;
mod advice;
mod be_memory_high;
mod class_groups;
mod cpu_affinity;
mod pid_namespaces;
mod poll;
mod reclaim_targets;
mod requests;
mod status;

use crate::advice::AdviceLink;
use crate::config::AgentConfig;
use crate::eventlog::EventLog;
use crate::metrics::Metrics;
use crate::registry::{self, Registry};
use memcolo_linux::actuate::Actuator;
use memcolo_linux::identity::{IdentityError, ProvenProcess, Prover};
use memcolo_linux::procfs::ProcFs;
use memcolo_linux::scope::{Scope, ScopeSample};
use memcolo_policy::ledger::Ledger;
use memcolo_policy::m3::Monitor;
use memcolo_policy::{Level, Pid};
use memcolo_proto::{ErrorCode, Reply};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Who is on the other end of a connection: `SO_PEERCRED`'s pid and uid (both as the
/// agent's namespaces see them: the kernel translates), the connecting process proved
/// at accept ([`ProvenProcess::from_peer`]; `None` when it could not be proved: it
/// exited, or changed credentials, before the agent looked, and then the connection
/// may not act on "itself"), and its pid namespace.
#[derive(Clone, Debug)]
pub struct Peer {
    pub pid: Option<Pid>,
    pub uid: u32,
    pub process: Option<Arc<ProvenProcess>>,
    pub pid_ns: PeerNamespace,
}

/// The pid namespace of a peer, against the agent's (`/proc/PID/ns/pid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerNamespace {
    /// The agent's own: pids the peer names are the agent's.
    Agent,
    /// Another one (a container's, reaching the agent through a mounted socket), by
    /// its inode number: pids the peer names are read in that namespace, and uid 0
    /// there is root of that namespace only.
    Other(u64),
    /// Not known (the peer could not be proved): it may name no process.
    Unknown,
}

impl Peer {
    /// A peer in the agent's pid namespace whose process was proved.
    pub fn proven(uid: u32, p: ProvenProcess) -> Peer {
        Peer {
            pid: Some(p.pid()),
            uid,
            process: Some(Arc::new(p)),
            pid_ns: PeerNamespace::Agent,
        }
    }

    /// A peer as accepted: `pid` from `SO_PEERCRED`, `process` its proof if there is
    /// one; its pid namespace is read through the proof, against the agent's.
    pub fn accepted(
        procfs: &ProcFs,
        uid: u32,
        pid: Option<Pid>,
        process: Option<ProvenProcess>,
    ) -> Peer {
        let pid_ns = match (&process, procfs.own_pid_namespace()) {
            (Some(p), Ok(own)) => match p.pid_namespace(procfs) {
                Ok(ns) if ns == own => PeerNamespace::Agent,
                Ok(ns) => PeerNamespace::Other(ns),
                Err(_) => PeerNamespace::Unknown,
            },
            _ => PeerNamespace::Unknown,
        };
        Peer {
            pid,
            uid,
            process: process.map(Arc::new),
            pid_ns,
        }
    }

    /// Root of the node: uid 0 in the agent's pid namespace. Root of a container's
    /// pid namespace (uid 0 on the host without a user namespace) is not: it may
    /// name the processes of its own namespace only, and is held to the per-user
    /// limits.
    pub fn is_root(&self) -> bool {
        self.uid == 0 && self.pid_ns == PeerNamespace::Agent
    }
}

/// Watches registered processes for exit (pidfd in the agent, a recorder in tests).
pub trait ExitWatcher: Send {
    /// Starts watching `pid` through `pidfd` (a descriptor of the proven process);
    /// the main loop learns of its exit through [`Core::process_exited`].
    fn watch(&mut self, pid: Pid, pidfd: OwnedFd) -> std::io::Result<()>;
    /// Stops watching `pid` (unregistered).
    fn unwatch(&mut self, pid: Pid);
}

/// Why a poll ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    Tick,
    Event,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Tick => "tick",
            Trigger::Event => "event",
        }
    }
}

/// What the last poll saw of one registered process.
#[derive(Clone, Debug)]
struct Seen {
    rss_bytes: u64,
    descendants: usize,
}

/// A notification waiting for its `reclaimed` answer.
#[derive(Clone, Copy, Debug)]
struct Outstanding {
    pid: Pid,
    level: Level,
    sent_at: Duration,
}

/// Every process seen by one poll, with the parent → children index built once.
#[derive(Clone, Default)]
struct ProcTable {
    /// Every process of the machine was read (else only the registered trees).
    full: bool,
    /// RSS of every process, in bytes.
    rss_bytes: HashMap<Pid, u64>,
    /// Start time of every process, clock ticks since boot: a descendant is acted on
    /// only if it is still the process this poll saw.
    starttime_ticks: HashMap<Pid, u64>,
    children: HashMap<Pid, Vec<Pid>>,
}

impl ProcTable {
    /// `root` and all its descendants that this poll saw.
    fn tree(&self, root: Pid) -> Vec<Pid> {
        let mut out = vec![root];
        let mut i = 0;
        while i < out.len() {
            if let Some(c) = self.children.get(&out[i]) {
                out.extend(c.iter().copied().filter(|p| *p != root));
            }
            i += 1;
        }
        out.retain(|p| self.rss_bytes.contains_key(p));
        out
    }

    /// RSS of `root` and its descendants, and how many descendants there are.
    fn tree_rss(&self, root: Pid) -> (u64, usize) {
        let tree = self.tree(root);
        let rss = tree.iter().filter_map(|p| self.rss_bytes.get(p)).sum();
        (rss, tree.len().saturating_sub(1))
    }
}

/// Polls between two reads of the whole process table ([`Core::read_procs`]).
const FULL_READ_POLLS: u64 = 10;

/// The agent's state.
pub struct Core {
    cfg: AgentConfig,
    procfs: ProcFs,
    scope: Scope,
    monitor: Monitor,
    registry: Registry,
    actuator: Box<dyn Actuator>,
    watcher: Box<dyn ExitWatcher>,
    /// Finds and re-checks processes; every action goes through what it proved.
    prover: Box<dyn Prover>,
    /// The pidfd, start time and credentials of every registered process.
    proven: HashMap<Pid, Arc<ProvenProcess>>,
    /// Registered processes that were outside a cgroup scope when they registered:
    /// their memory is not the scope's (warned about, marked in status).
    out_of_scope: HashSet<Pid>,
    metrics: Arc<Metrics>,
    events: EventLog,
    conns: HashMap<u64, mpsc::Sender<Reply>>,
    outstanding: HashMap<u64, Outstanding>,
    /// Each registered process's last minute of notifications, reports and RSS falls
    /// (rates, and rule R10: unmatched reclaim).
    ledgers: HashMap<Pid, Ledger>,
    next_seq: u64,
    state_path: PathBuf,
    scope_total_bytes: u64,
    last_sample: Option<ScopeSample>,
    /// The last full process table ([`Core::read_procs`]): whose descendants the polls
    /// between full reads follow.
    last_full: Option<ProcTable>,
    seen: BTreeMap<Pid, Seen>,
    polls: u64,
    /// `now` of the last poll (status rates are taken at it).
    last_poll_at: Duration,
    page_size: u64,
    ticks_per_sec: u64,
    file_cache_dropped_bytes: u64,
    /// Advice rounds skipped because the previous one still ran.
    advice_rounds_skipped: u64,
    kills: u64,
    dropped_notifications: u64,
    sense_error_logged: bool,
    /// The asynchronous reclaim service, when `[reclaim] enabled`.
    reclaim: Option<crate::async_reclaim::AsyncReclaimLink>,
    /// The Hermes advice worker; without it no file is advised.
    advice: Option<AdviceLink>,
    /// CPUs the agent confined itself to (None: not confined).
    agent_cpus: Option<Vec<usize>>,
    /// The registry or monitor state changed since the last write.
    state_dirty: bool,
    /// The last write failed (its error is logged once per failing streak).
    state_write_failing: bool,
    /// Which mechanisms run (status `mechanisms`, `mechanisms_off`).
    mechanisms: crate::mechanisms::Mechanisms,
    /// The node's pods, in Kubernetes mode ([`crate::kubernetes`]).
    kube: Option<crate::kubernetes::KubeNode>,
    /// Where the pods' `memcolo.io/t-miss` go, when tiering runs.
    tier_defaults: Option<crate::tier::TierDefaults>,
    /// The memory cgroups of each class's processes and their events ([`class_groups`]).
    class_groups: class_groups::ClassGroups,
    /// The BE groups whose `memory.high` the red zone capped ([`be_memory_high`]).
    be_memory_high: be_memory_high::BeMemoryHigh,
    /// Pids of containers' pid namespaces mapped to the agent's, with a bounded number
    /// of `/proc` walks ([`pid_namespaces`]).
    ns_maps: std::cell::RefCell<pid_namespaces::PidNamespaceMaps>,
}

impl Core {
    /// Builds the core and reloads the registry saved under `cfg.state_dir`, keeping
    /// only processes that still run with the same start time.
    pub fn new(
        cfg: AgentConfig,
        scope: Scope,
        actuator: Box<dyn Actuator>,
        watcher: Box<dyn ExitWatcher>,
        prover: Box<dyn Prover>,
        metrics: Arc<Metrics>,
        mut events: EventLog,
    ) -> anyhow::Result<Core> {
        let procfs = ProcFs::new(cfg.procfs.clone());
        // Caps of BE groups' memory.high a previous agent left in force.
        be_memory_high::restore_journal(&cfg.state_dir);
        let sample = scope.sample_with_host(&procfs)?;
        let scope_total_bytes = sample.total_bytes;
        let mut monitor = Monitor::try_new(cfg.m3_config(scope_total_bytes)).map_err(|e| {
            anyhow::anyhow!("M3 configuration for a scope of {scope_total_bytes} bytes: {e}")
        })?;
        let state_path = registry::registry_path(&cfg.state_dir);
        // Refused (the agent does not start, the file is untouched): an unknown
        // version, a non-regular or unreadable file. Dropped and reported: anything
        // that does not parse, entry by entry.
        let loaded = registry::load(&state_path)?;
        for p in &loaded.problems {
            tracing::error!(path = %state_path.display(), "{p}");
            metrics
                .state_load_problems
                .with_label_values(&[p.kind()])
                .inc();
            let (kind, mut fields) = p.event();
            fields["path"] = json!(state_path);
            events.record(kind, fields);
        }
        let (saved, monitor_state) = (loaded.registry, loaded.monitor);
        if let Some(st) = monitor_state {
            if let Err(e) = monitor.try_restore(st) {
                tracing::warn!(error = %e, "ignoring saved monitor state");
            }
        }
        let mut core = Core {
            procfs,
            scope,
            monitor,
            registry: Registry::default(),
            actuator,
            watcher,
            prover,
            proven: HashMap::new(),
            out_of_scope: HashSet::new(),
            metrics,
            events,
            conns: HashMap::new(),
            outstanding: HashMap::new(),
            ledgers: HashMap::new(),
            next_seq: 1,
            state_path,
            scope_total_bytes,
            last_sample: Some(sample),
            last_full: None,
            seen: BTreeMap::new(),
            polls: 0,
            last_poll_at: Duration::ZERO,
            page_size: ProcFs::page_size(),
            ticks_per_sec: ProcFs::clock_ticks_per_sec(),
            file_cache_dropped_bytes: 0,
            advice_rounds_skipped: 0,
            kills: 0,
            dropped_notifications: 0,
            sense_error_logged: false,
            reclaim: None,
            advice: None,
            agent_cpus: None,
            state_dirty: false,
            state_write_failing: false,
            mechanisms: crate::mechanisms::Mechanisms::from_config(&cfg),
            kube: None,
            tier_defaults: None,
            class_groups: Default::default(),
            be_memory_high: Default::default(),
            ns_maps: Default::default(),
            cfg,
        };
        let mut kept = 0;
        for e in saved.iter() {
            // The same process: same pid, start time and (when recorded) credentials.
            let found = core
                .prover
                .open(e.pid, Some(e.starttime_ticks))
                .and_then(|p| match &e.creds {
                    Some(c) if p.credentials() != c => Err(IdentityError::CredentialsChanged {
                        pid: e.pid,
                        was: c.uids,
                        now: p.credentials().uids,
                        was_g: c.gids,
                        now_g: p.credentials().gids,
                    }),
                    _ => Ok(p),
                });
            match found {
                Ok(p) => {
                    let mut e = e.clone();
                    e.creds = Some(*p.credentials());
                    if let Err(err) = core.track(p) {
                        tracing::warn!(pid = e.pid, error = %err, "cannot watch restored process");
                        continue;
                    }
                    let (pid, name) = (e.pid, e.name.clone());
                    core.registry.insert(e);
                    core.note_scope(pid, &name);
                    kept += 1;
                }
                Err(err) => {
                    if !err.is_gone() {
                        tracing::warn!(pid = e.pid, error = %err, "not restoring a registration");
                    }
                    core.monitor.forget(e.pid);
                }
            }
        }
        if !saved.is_empty() {
            core.events.record(
                "restored",
                json!({"saved": saved.len(), "kept": kept, "path": core.state_path}),
            );
        }
        core.persist();
        core.update_registry_metrics();
        core.apply_cpu_affinity();
        Ok(core)
    }

    /// A connection opened; `push` carries notifications to it.
    pub fn conn_opened(&mut self, conn: u64, push: mpsc::Sender<Reply>) {
        self.conns.insert(conn, push);
    }

    /// A connection closed: its processes stay registered but are not notifiable by
    /// socket until they register again.
    pub fn conn_closed(&mut self, conn: u64) {
        self.conns.remove(&conn);
        self.registry.detach_conn(conn);
    }

    /// The registry, for tests and the status view.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The monitor, for tests and the status view.
    pub fn monitor(&self) -> &Monitor {
        &self.monitor
    }

    /// Records which mechanisms run (what started of what the configuration asked).
    pub fn set_mechanisms(&mut self, m: crate::mechanisms::Mechanisms) {
        self.mechanisms = m;
    }

    /// Kubernetes mode: `node` is polled after M3 at every poll, with the scope's
    /// working set and M3's thresholds.
    pub fn attach_kubernetes(&mut self, node: crate::kubernetes::KubeNode) {
        self.kube = Some(node);
    }

    /// Kubernetes mode with tiering: pods' tier targets go to `d` at every poll.
    pub fn attach_tier_defaults(&mut self, d: crate::tier::TierDefaults) {
        self.tier_defaults = Some(d);
    }
}

/// The signals that carry `low`, `high` and `top` in signal mode: SIGRTMIN+1..3.
fn notify_signals() -> [i32; 3] {
    let base = libc::SIGRTMIN();
    [base + 1, base + 2, base + 3]
}

pub(crate) use crate::registry::same_user;

fn err(code: ErrorCode, message: String) -> Reply {
    Reply::Error { code, message }
}

fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
