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

use crate::advice::{AdviceLink, AdviceOutcome, AdviceRound, BeJob, NotHandedOver};
use crate::config::AgentConfig;
use crate::eventlog::EventLog;
use crate::metrics::Metrics;
use crate::registry::{self, Entry, Registry};
use memcolo_linux::actuate::Actuator;
use memcolo_linux::filecache::ExpectedProcess;
use memcolo_linux::identity::{Credentials, IdentityError, ProvenProcess, Prover};
use memcolo_linux::procfs::ProcFs;
use memcolo_linux::scope::{Scope, ScopeSample};
use memcolo_policy::hermes::AdviceConfig;
use memcolo_policy::ledger::Ledger;
use memcolo_policy::m3::{Action, Monitor, ProcView, Zone};
use memcolo_policy::{Class, Level, Pid};
use memcolo_proto::{ErrorCode, NotifyMode, Reply, Request};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Who is on the other end of a connection: `SO_PEERCRED`'s pid and uid, and the
/// connecting process proved at accept ([`ProvenProcess::from_peer`]); `None` when it
/// could not be proved (it exited, or changed credentials, before the agent looked),
/// and then the connection may not act on "itself".
#[derive(Clone, Debug)]
pub struct Peer {
    pub pid: Option<Pid>,
    pub uid: u32,
    pub process: Option<Arc<ProvenProcess>>,
}

impl Peer {
    /// A peer whose process was proved.
    pub fn proven(uid: u32, p: ProvenProcess) -> Peer {
        Peer {
            pid: Some(p.pid()),
            uid,
            process: Some(Arc::new(p)),
        }
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

    /// Answers one client request.
    pub fn handle(&mut self, conn: u64, peer: &Peer, req: Request, now: Duration) -> Reply {
        match req {
            Request::Ping => Reply::Pong {
                agent_version: env!("CARGO_PKG_VERSION").into(),
            },
            Request::Status { offset } => Reply::Status {
                status: self.status_page(offset),
            },
            Request::Register {
                pid,
                class,
                name,
                expected_reclaim_bytes,
                notify,
            } => self.register(conn, peer, pid, class, name, expected_reclaim_bytes, notify),
            Request::Unregister { pid } => {
                let target = match self.target_pid(peer, pid) {
                    Ok(p) => p,
                    Err(r) => return r,
                };
                match self.registry.remove(target) {
                    Some(e) => {
                        self.forget(target);
                        self.events
                            .record("unregistered", json!({"pid": target, "name": e.name}));
                        self.persist();
                        self.update_registry_metrics();
                        Reply::Ok
                    }
                    None => err(
                        ErrorCode::NotRegistered,
                        format!("pid {target} is not registered"),
                    ),
                }
            }
            Request::Reclaimed {
                pid,
                seq,
                bytes,
                duration_ms,
                ok,
            } => {
                let answered = seq.and_then(|s| self.outstanding.get(&s).copied());
                let from_seq = answered.map(|o| o.pid);
                let target = match (from_seq, pid) {
                    (Some(p), _)
                        if peer.uid == 0
                            || self.registry.get(p).and_then(|e| e.conn) == Some(conn)
                            || (Some(p) == peer.pid && self.self_pid(peer).is_ok()) =>
                    {
                        p
                    }
                    (Some(p), _) => {
                        return err(
                            ErrorCode::PermissionDenied,
                            format!(
                                "notification {} went to pid {p}, not to this peer",
                                seq.unwrap_or(0)
                            ),
                        )
                    }
                    (None, p) => match self.target_pid(peer, p) {
                        Ok(p) => p,
                        Err(r) => return r,
                    },
                };
                let Some(e) = self.registry.get_mut(target) else {
                    return err(
                        ErrorCode::NotRegistered,
                        format!("pid {target} is not registered"),
                    );
                };
                e.reclaimed_bytes += bytes;
                e.reclaim_reports += 1;
                if !ok {
                    e.failed_reclaims += 1;
                }
                let class = e.class;
                self.ledgers.entry(target).or_default().reported(now, bytes);
                self.metrics
                    .reclaim_reports
                    .with_label_values(&[class.as_str()])
                    .inc();
                if let Some(s) = seq {
                    self.outstanding.remove(&s);
                }
                self.monitor.record_reclaim(
                    target,
                    answered.map(|o| o.level),
                    if ok { bytes } else { 0 },
                    now,
                );
                self.metrics
                    .reclaimed_bytes
                    .with_label_values(&[class.as_str()])
                    .inc_by(bytes);
                self.events.record(
                    "reclaimed",
                    json!({"pid": target, "seq": seq, "bytes": bytes, "duration_ms": duration_ms, "ok": ok}),
                );
                Reply::Ok
            }
            Request::Cgroup { name } => self.cgroup(peer, &name),
        }
    }

    /// `memcolo run --cgroup NAME`: a child cgroup of the scope for root, and for
    /// another user one below its own group `memcolo-uid-<uid>` (at most
    /// `limits.cgroups_per_uid` of them), whose `cgroup.procs` (and v1 `tasks`) it
    /// may write so that its process can move itself in. Names are 1-64 characters of
    /// `A-Z a-z 0-9 _ . -`, not starting with a dot.
    fn cgroup(&mut self, peer: &Peer, name: &str) -> Reply {
        let Scope::Cgroup(cg) = &self.scope else {
            return err(
                ErrorCode::BadRequest,
                "the agent's scope is the host; --cgroup needs --scope cgroup:PATH".to_string(),
            );
        };
        let valid = (1..=64).contains(&name.len())
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !valid {
            return err(
                ErrorCode::BadRequest,
                "a cgroup name is 1-64 characters of A-Z a-z 0-9 _ . - and does not start with a dot".into(),
            );
        }
        let made = if peer.uid == 0 {
            cg.create_child(name)
        } else {
            let limit = self.cfg.limits.cgroups_per_uid;
            let parent = match cg.create_child(&format!("memcolo-uid-{}", peer.uid)) {
                Ok(p) => p,
                Err(e) => {
                    return err(
                        ErrorCode::Internal,
                        format!("cannot create cgroup for user {}: {e}", peer.uid),
                    )
                }
            };
            let exists = parent.path().join(name).is_dir();
            let held = parent.children().map(|c| c.len()).unwrap_or(usize::MAX);
            if !exists && held >= limit {
                return err(
                    ErrorCode::LimitExceeded,
                    format!(
                        "user {} has {held} cgroups (limits.cgroups_per_uid = {limit})",
                        peer.uid
                    ),
                );
            }
            parent.create_child(name).and_then(|child| {
                for f in ["cgroup.procs", "tasks"] {
                    let path = child.path().join(f);
                    if path.exists() {
                        std::os::unix::fs::chown(&path, Some(peer.uid), None)
                            .map_err(|e| memcolo_linux::Error::io(&path, e))?;
                    }
                }
                Ok(child)
            })
        };
        match made {
            Ok(child) => Reply::Cgroup {
                path: child.path().display().to_string(),
            },
            Err(e) => err(
                ErrorCode::Internal,
                format!("cannot create cgroup `{name}`: {e}"),
            ),
        }
    }

    /// The pid a request acts on: the peer itself, or any pid for a root peer.
    fn target_pid(&self, peer: &Peer, pid: Option<Pid>) -> Result<Pid, Reply> {
        match pid {
            Some(p) if p <= 0 => Err(err(ErrorCode::BadRequest, format!("invalid pid {p}"))),
            Some(p) if peer.uid == 0 && Some(p) != peer.pid => Ok(p),
            Some(p) if Some(p) != peer.pid => Err(err(
                ErrorCode::PermissionDenied,
                format!("only root may act on another process (pid {p})"),
            )),
            _ => self.self_pid(peer).map(|p| p.pid()),
        }
    }

    /// The connecting process itself, proved again now: a peer that exited since it
    /// connected (leaving, say, a forked child on the socket while its pid goes to
    /// another process) or that changed credentials (a set-user-ID exec) is refused.
    fn self_pid(&self, peer: &Peer) -> Result<Arc<ProvenProcess>, Reply> {
        let Some(p) = &peer.process else {
            return Err(err(
                ErrorCode::PermissionDenied,
                "the connecting process could not be identified (it exited or changed credentials before the agent looked); connect again from the process itself".into(),
            ));
        };
        match self.prover.verify(p) {
            Ok(()) => Ok(p.clone()),
            Err(e) => Err(err(
                ErrorCode::PermissionDenied,
                format!("the process that connected is no longer the same ({e}); connect again from the process itself"),
            )),
        }
    }

    /// Keeps `p`'s pidfd for actions and watches it for exit.
    fn track(&mut self, p: ProvenProcess) -> std::io::Result<()> {
        self.track_arc(Arc::new(p))
    }

    fn track_arc(&mut self, p: Arc<ProvenProcess>) -> std::io::Result<()> {
        let fd = p.dup_pidfd().map_err(std::io::Error::other)?;
        self.watcher.watch(p.pid(), fd)?;
        self.proven.insert(p.pid(), p);
        Ok(())
    }

    /// The registered process `pid`, verified now; a process that exited or changed
    /// credentials loses its registration here (an exec of a set-user-ID program by
    /// a registered BE process must not make the agent kill that program).
    fn verified(&mut self, pid: Pid) -> Option<Arc<ProvenProcess>> {
        let p = self.proven.get(&pid)?.clone();
        match self.prover.verify(&p) {
            Ok(()) => Some(p),
            Err(e) => {
                self.end_registration(pid, &e);
                None
            }
        }
    }

    /// Ends the registration of a process that is no longer the one registered.
    fn end_registration(&mut self, pid: Pid, why: &IdentityError) {
        if let Some(e) = self.registry.remove(pid) {
            self.forget(pid);
            if !why.is_gone() {
                self.metrics
                    .errors
                    .with_label_values(&["identity_changed"])
                    .inc();
                tracing::warn!(pid, name = %e.name, error = %why, "registration ended: the process is no longer the one registered");
            }
            self.events.record(
                "registration_ended",
                json!({"pid": pid, "name": e.name, "class": e.class, "reason": why.to_string()}),
            );
            self.persist();
            self.update_registry_metrics();
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn register(
        &mut self,
        conn: u64,
        peer: &Peer,
        pid: Option<Pid>,
        class: Class,
        name: Option<String>,
        expected_reclaim_bytes: Option<u64>,
        notify: NotifyMode,
    ) -> Reply {
        if let Some(n) = &name {
            if n.len() > registry::MAX_NAME_BYTES || n.chars().any(|c| c.is_control()) {
                return err(
                    ErrorCode::BadRequest,
                    "name must be at most 256 printable characters".into(),
                );
            }
        }
        // The process, proved: the peer itself, or (root only) any pid.
        let proc_ = match pid {
            Some(p) if p > 0 && peer.uid == 0 && Some(p) != peer.pid => {
                match self.prover.open(p, None) {
                    Ok(x) => Arc::new(x),
                    Err(e) if e.is_gone() => {
                        return err(ErrorCode::NoSuchProcess, format!("no process {p}"))
                    }
                    Err(e) => {
                        return err(ErrorCode::Internal, format!("cannot read process {p}: {e}"))
                    }
                }
            }
            _ => match self.target_pid(peer, pid).and_then(|_| self.self_pid(peer)) {
                Ok(x) => x,
                Err(r) => return r,
            },
        };
        let target = proc_.pid();
        let creds = *proc_.credentials();
        let fresh = self
            .registry
            .get(target)
            .map(|e| e.starttime_ticks != proc_.starttime_ticks() || e.creds != Some(creds))
            .unwrap_or(true);
        if fresh && peer.uid != 0 {
            let limit = self.cfg.limits.registrations_per_uid;
            let held = self
                .registry
                .iter()
                .filter(|e| e.creds.is_some_and(|c| c.ruid() == peer.uid))
                .count();
            if held >= limit {
                self.metrics
                    .errors
                    .with_label_values(&["registration_limit"])
                    .inc();
                return err(
                    ErrorCode::LimitExceeded,
                    format!("user {} already has {held} registered processes (limits.registrations_per_uid = {limit})", peer.uid),
                );
            }
        }
        if notify == NotifyMode::Signal {
            // Without a handler, the first real-time signal's default action would
            // kill the process.
            let sigs = notify_signals();
            match self.procfs.read_pid_status(target) {
                Ok(st) => {
                    let handled = st.sig_cgt | st.sig_ign;
                    let missing: Vec<i32> = sigs
                        .iter()
                        .copied()
                        .filter(|s| handled & (1u64 << (s - 1)) == 0)
                        .collect();
                    if !missing.is_empty() {
                        return err(
                            ErrorCode::BadRequest,
                            format!(
                                "process {target} has no handler for signal(s) {missing:?} (SIGRTMIN+1..3 carry low, high and top): the first notification would kill it; install handlers first or register with notify socket"
                            ),
                        );
                    }
                }
                Err(e) => {
                    return err(
                        ErrorCode::NoSuchProcess,
                        format!("cannot read process {target}: {e}"),
                    )
                }
            }
        }
        let comm = match self.procfs.read_pid_stat(target) {
            Ok(s) => s.comm,
            Err(_) => String::new(),
        };
        if fresh {
            if let Some(old) = self.registry.remove(target) {
                // Another process (or the same one under other credentials) held
                // this pid's registration: it is gone.
                self.forget(old.pid);
            }
            if let Err(e) = self.track_arc(proc_.clone()) {
                return err(
                    ErrorCode::NoSuchProcess,
                    format!("cannot watch process {target}: {e}"),
                );
            }
            self.monitor.forget(target);
        }
        let prev = self.registry.get(target).cloned().filter(|_| !fresh);
        let entry = Entry {
            pid: target,
            class,
            name: name.unwrap_or(comm),
            starttime_ticks: proc_.starttime_ticks(),
            expected_reclaim_bytes,
            notify,
            registered_unix_s: prev
                .as_ref()
                .map(|p| p.registered_unix_s)
                .unwrap_or_else(unix_now_s),
            notifications_sent: prev.as_ref().map(|p| p.notifications_sent).unwrap_or(0),
            notified: prev.as_ref().map(|p| p.notified).unwrap_or_default(),
            reclaimed_bytes: prev.as_ref().map(|p| p.reclaimed_bytes).unwrap_or(0),
            reclaim_reports: prev.as_ref().map(|p| p.reclaim_reports).unwrap_or(0),
            failed_reclaims: prev.as_ref().map(|p| p.failed_reclaims).unwrap_or(0),
            creds: Some(creds),
            conn: (notify == NotifyMode::Socket).then_some(conn),
        };
        self.events.record(
            "registered",
            json!({"pid": target, "class": class, "name": entry.name, "notify": notify,
                   "by_pid": peer.pid, "by_uid": peer.uid, "again": prev.is_some()}),
        );
        self.note_scope(target, &entry.name.clone());
        self.registry.insert(entry);
        self.persist();
        self.update_registry_metrics();
        if class == Class::Lc {
            self.apply_cpu_affinity();
        }
        // Reclaim learns of a new target (or a new LC process to protect) now, not at
        // the next poll: a batch job starts allocating as soon as it is registered.
        if self.reclaim.is_some() {
            // Only the registered trees: a burst of registrations must not read the
            // whole process table once each.
            let procs = self.read_procs_tracked();
            self.publish_reclaim_targets(&procs);
        }
        Reply::Registered { pid: target, class }
    }

    /// A registered process exited (its pidfd became readable).
    pub fn process_exited(&mut self, pid: Pid) {
        if let Some(e) = self.registry.remove(pid) {
            self.forget(pid);
            self.events.record(
                "exited",
                json!({"pid": pid, "name": e.name, "class": e.class}),
            );
            self.persist();
            self.update_registry_metrics();
        }
    }

    /// Whether `pid` lives in the scope: always on a host scope; on a cgroup scope,
    /// when its memory cgroup is the scope's or below it. Unknown (gone, unreadable)
    /// counts as inside: nothing is claimed without evidence.
    fn in_scope(&self, pid: Pid) -> bool {
        let Scope::Cgroup(cg) = &self.scope else {
            return true;
        };
        match memcolo_linux::cgroup::memory_cgroup_path(&self.procfs, &pid.to_string()) {
            Ok(p) => p.starts_with(cg.path()),
            Err(_) => true,
        }
    }

    /// Records whether a newly (re)registered process is in the scope, warning once
    /// when it is not.
    fn note_scope(&mut self, pid: Pid, name: &str) {
        if self.in_scope(pid) {
            self.out_of_scope.remove(&pid);
        } else if self.out_of_scope.insert(pid) {
            tracing::warn!(pid, name, scope = %self.scope.describe(),
                "registered process is outside the agent's scope: its memory is not the scope's, and M3's thresholds do not see it");
            self.events.record(
                "outside_scope",
                json!({"pid": pid, "name": name, "scope": self.scope.describe()}),
            );
        }
    }

    fn forget(&mut self, pid: Pid) {
        self.out_of_scope.remove(&pid);
        if self.proven.remove(&pid).is_some() {
            self.watcher.unwatch(pid);
        }
        self.monitor.forget(pid);
        self.seen.remove(&pid);
        self.ledgers.remove(&pid);
        self.outstanding.retain(|_, o| o.pid != pid);
    }

    /// One sense → decide → act round.
    pub fn poll(&mut self, now: Duration, trigger: Trigger) {
        self.polls += 1;
        self.last_poll_at = self.last_poll_at.max(now);
        self.metrics
            .polls
            .with_label_values(&[trigger.as_str()])
            .inc();
        let sample = match self.scope.sample_with_host(&self.procfs) {
            Ok(s) => {
                self.sense_error_logged = false;
                s
            }
            Err(e) => {
                self.metrics.errors.with_label_values(&["sense"]).inc();
                if !self.sense_error_logged {
                    tracing::error!(scope = %self.scope.describe(), error = %e, "cannot read scope memory; skipping polls until it recovers");
                    self.sense_error_logged = true;
                }
                return;
            }
        };
        if sample.total_bytes != self.scope_total_bytes && self.cfg.m3.top_bytes.is_none() {
            let top = self.cfg.m3_config(sample.total_bytes).top_bytes;
            match self.monitor.try_set_top(top) {
                Ok(()) => self.scope_total_bytes = sample.total_bytes,
                Err(e) => {
                    self.metrics.errors.with_label_values(&["config"]).inc();
                    tracing::warn!(error = %e, "scope memory changed to an unusable size; keeping the old top");
                }
            }
        }
        self.collect_advice();
        let mut procs = self.read_procs();
        let views = self.views(&procs);
        self.audit_reclaim(now);
        let actions = self.monitor.step(now, sample.working_set_bytes, &views);
        // A kill takes the job's whole tree: read every process, so that a child forked
        // since the last full read is not left behind.
        if !procs.full && actions.iter().any(|a| matches!(a, Action::Kill { .. })) {
            procs = self.read_procs_full();
        }
        for a in actions {
            self.act(a, now, &procs);
        }
        if self.cfg.hermes.enabled {
            self.advise(&sample, &procs);
        }
        self.update_poll_metrics(&sample);
        self.last_sample = Some(sample);
        self.publish_reclaim_targets(&procs);
        // The registry is marked for saving on every change; the adapted thresholds
        // every 10 polls.
        if self.polls.is_multiple_of(10) {
            self.persist();
        }
    }

    /// The process table of this poll: every process's `/proc/PID/stat` every
    /// [`FULL_READ_POLLS`] polls (a registered process's new children are found
    /// then), and in between only the registered processes and the descendants the
    /// last full read found ([`Core::read_procs_tracked`]). The full read costs a
    /// `stat` of every process on the machine, registered or not: on a node of
    /// thousands of processes it was most of the agent's CPU.
    fn read_procs(&mut self) -> ProcTable {
        if self.last_full.is_none() || self.polls.is_multiple_of(FULL_READ_POLLS) {
            self.read_procs_full()
        } else {
            self.read_procs_tracked()
        }
    }

    /// The registered processes and the descendants the last full read found that are
    /// still the same processes (start time) and still below a registered process.
    fn read_procs_tracked(&mut self) -> ProcTable {
        let Some(last) = self.last_full.as_ref() else {
            return self.read_procs_full();
        };
        let mut want: Vec<Pid> = Vec::new();
        for e in self.registry.iter() {
            want.push(e.pid);
            want.extend(last.tree(e.pid));
        }
        want.sort_unstable();
        want.dedup();
        let mut t = ProcTable::default();
        for pid in want {
            let Ok(st) = self.procfs.read_pid_stat(pid) else {
                continue;
            };
            // A pid the full read saw as another process is not followed.
            if last
                .starttime_ticks
                .get(&pid)
                .is_some_and(|s| *s != st.starttime_ticks)
            {
                continue;
            }
            t.rss_bytes
                .insert(pid, st.rss_pages.saturating_mul(self.page_size));
            t.starttime_ticks.insert(pid, st.starttime_ticks);
            t.children.entry(st.ppid).or_default().push(pid);
        }
        t
    }

    /// `/proc/PID/stat` of every process, for RSS of process trees.
    fn read_procs_full(&mut self) -> ProcTable {
        let mut t = ProcTable {
            full: true,
            ..Default::default()
        };
        let pids = match self.procfs.pids() {
            Ok(p) => p,
            Err(e) => {
                self.metrics.errors.with_label_values(&["procfs"]).inc();
                tracing::warn!(error = %e, "cannot list processes");
                return t;
            }
        };
        for pid in pids {
            // Processes exit between listing and reading: skip them silently.
            if let Ok(st) = self.procfs.read_pid_stat(pid) {
                t.rss_bytes
                    .insert(pid, st.rss_pages.saturating_mul(self.page_size));
                t.starttime_ticks.insert(pid, st.starttime_ticks);
                t.children.entry(st.ppid).or_default().push(pid);
            }
        }
        self.last_full = Some(t.clone());
        t
    }

    fn views(&mut self, procs: &ProcTable) -> Vec<ProcView> {
        let mut views = Vec::with_capacity(self.registry.len());
        self.seen.clear();
        for e in self.registry.iter() {
            let (rss, descendants) = procs.tree_rss(e.pid);
            self.seen.insert(
                e.pid,
                Seen {
                    rss_bytes: rss,
                    descendants,
                },
            );
            views.push(ProcView {
                pid: e.pid,
                class: e.class,
                started_at: Duration::from_secs_f64(
                    e.starttime_ticks as f64 / self.ticks_per_sec as f64,
                ),
                rss_bytes: rss,
                notifiable: match e.notify {
                    NotifyMode::Socket => e.conn.is_some_and(|c| self.conns.contains_key(&c)),
                    NotifyMode::Signal => true,
                    NotifyMode::None => false,
                },
                expected_reclaim_bytes: e.expected_reclaim_bytes,
            });
        }
        views
    }

    /// Feeds each registered process's RSS (as this poll saw it) to its ledger, and
    /// reports an elastic process whose reported reclamation its RSS does not show
    /// (rule R10 of `memcolo_policy::m3`): once per episode, as the event
    /// `reclaim_unmatched`, a warning and `memcolo_reclaim_unmatched_total`.
    fn audit_reclaim(&mut self, now: Duration) {
        for e in self.registry.iter() {
            let Some(seen) = self.seen.get(&e.pid) else {
                continue;
            };
            let ledger = self.ledgers.entry(e.pid).or_default();
            let Some(u) = ledger.observe_rss(now, seen.rss_bytes) else {
                continue;
            };
            if e.class != Class::Elastic {
                continue;
            }
            self.metrics
                .reclaim_unmatched
                .with_label_values(&[e.class.as_str()])
                .inc();
            tracing::warn!(pid = e.pid, name = %e.name, reported_bytes = u.reported_bytes,
                rss_fell_bytes = u.rss_fell_bytes,
                "reported reclamation is not matched by a fall of the process's RSS");
            self.events.record(
                "reclaim_unmatched",
                json!({"pid": e.pid, "name": e.name, "class": e.class,
                       "window_s": memcolo_policy::ledger::WINDOW.as_secs(),
                       "reported_bytes": u.reported_bytes, "rss_fell_bytes": u.rss_fell_bytes,
                       "rss_bytes": seen.rss_bytes}),
            );
        }
    }

    /// Whether `e` is in an unmatched-reclaim episode (R10; elastic processes only).
    fn reclaim_unmatched(&self, e: &Entry) -> bool {
        e.class == Class::Elastic && self.ledgers.get(&e.pid).is_some_and(|l| l.unmatched())
    }

    fn act(&mut self, action: Action, now: Duration, procs: &ProcTable) {
        match action {
            Action::Signal {
                pid,
                level,
                target_bytes,
            } => self.notify(pid, level, target_bytes, now),
            Action::Kill { pid, reason } => self.kill(pid, &reason, procs),
        }
    }

    fn notify(&mut self, pid: Pid, level: Level, target_bytes: u64, now: Duration) {
        let Some(e) = self.registry.get(pid) else {
            return;
        };
        let (notify, conn, name, class) = (e.notify, e.conn, e.name.clone(), e.class);
        let seq = self.next_seq;
        let via = match notify {
            NotifyMode::Socket => {
                let Some(tx) = conn.and_then(|c| self.conns.get(&c)) else {
                    return;
                };
                match tx.try_send(Reply::Notify {
                    seq,
                    level,
                    target_bytes,
                }) {
                    Ok(()) => "socket",
                    Err(_) => {
                        self.dropped_notifications += 1;
                        self.metrics
                            .errors
                            .with_label_values(&["notify_queue_full"])
                            .inc();
                        return;
                    }
                }
            }
            NotifyMode::Signal => {
                let sig = notify_signals()[match level {
                    Level::Low => 0,
                    Level::High => 1,
                    Level::Top => 2,
                }];
                // Through the registered process's pidfd, proved again just now.
                let Some(p) = self.verified(pid) else {
                    return;
                };
                if let Err(err) = self.actuator.signal(&p, sig) {
                    self.metrics.errors.with_label_values(&["signal"]).inc();
                    tracing::warn!(pid, error = %err, "cannot signal process");
                    return;
                }
                "signal"
            }
            NotifyMode::None => return,
        };
        self.next_seq += 1;
        if notify == NotifyMode::Socket {
            self.outstanding.insert(
                seq,
                Outstanding {
                    pid,
                    level,
                    sent_at: now,
                },
            );
            // Bound the table: answers older than a minute will not come.
            if self.outstanding.len() > 4096 {
                let cutoff = now.saturating_sub(Duration::from_secs(60));
                self.outstanding.retain(|_, o| o.sent_at >= cutoff);
            }
        }
        if let Some(e) = self.registry.get_mut(pid) {
            e.notifications_sent += 1;
            e.notified.add(level);
        }
        self.ledgers.entry(pid).or_default().notified(now, level);
        self.metrics
            .notifications
            .with_label_values(&[class.as_str(), level.as_str(), via])
            .inc();
        self.events.record(
            "notify",
            json!({"pid": pid, "name": name, "level": level, "target_bytes": target_bytes, "seq": seq, "via": via,
                   "poll_at_ms": now.as_millis() as u64}),
        );
    }

    fn kill(&mut self, pid: Pid, reason: &str, procs: &ProcTable) {
        let Some(e) = self.registry.get(pid) else {
            return;
        };
        if e.class != Class::Be {
            // The policy never asks for this; refuse loudly if it ever does.
            tracing::error!(pid, class = %e.class, "refusing to kill a process that is not BE");
            self.metrics
                .errors
                .with_label_values(&["kill_refused"])
                .inc();
            return;
        }
        let name = e.name.clone();
        // The registered process proved again: one that exec'd a set-user-ID program
        // or otherwise changed credentials since it registered is no longer the BE job
        // that was registered, and loses its registration instead.
        let Some(job) = self.verified(pid) else {
            return;
        };
        let job_creds = *job.credentials();
        let lc_pids: HashSet<Pid> = self
            .registry
            .iter()
            .filter(|e| e.class == Class::Lc)
            .flat_map(|e| procs.tree(e.pid))
            .collect();
        // The registered process and its descendants are one BE job; an LC process
        // that somehow sits below it is spared.
        let mut victims = procs.tree(pid);
        victims.retain(|p| !lc_pids.contains(p));
        victims.reverse();
        let rss = self.seen.get(&pid).map(|s| s.rss_bytes).unwrap_or(0);
        let mut killed = Vec::with_capacity(victims.len());
        for v in victims {
            let target = if v == pid {
                job.clone()
            } else {
                // A descendant: still the process this poll saw, and running as the
                // job's user (a set-user-ID program the job started is not the job's).
                match self.prover.open(v, procs.starttime_ticks.get(&v).copied()) {
                    Ok(p) if same_user(p.credentials(), &job_creds) => Arc::new(p),
                    Ok(p) => {
                        self.metrics
                            .errors
                            .with_label_values(&["kill_refused"])
                            .inc();
                        tracing::warn!(pid = v, uids = ?p.credentials().uids, job_uids = ?job_creds.uids,
                            "not killing a descendant of a BE job that runs as another user");
                        continue;
                    }
                    Err(_) => continue, // exited since the poll
                }
            };
            match self.actuator.kill(&target, reason) {
                Ok(()) => killed.push(v),
                Err(err) => {
                    if !err.is_not_found() {
                        self.metrics.errors.with_label_values(&["kill"]).inc();
                        tracing::warn!(pid = v, error = %err, "kill failed");
                    }
                }
            }
        }
        let victims = killed;
        self.kills += 1;
        self.metrics.kills.inc();
        self.events.record(
            "kill",
            json!({"pid": pid, "name": name, "class": "be", "rss_bytes": rss, "pids": victims, "reason": reason}),
        );
    }

    /// Hermes §3.3: above `adv_thr`, hands a round to the advice worker, which drops
    /// BE files' page cache, largest first. Never blocks: when the previous round
    /// still runs, this one is skipped (counted).
    fn advise(&mut self, sample: &ScopeSample, procs: &ProcTable) {
        let adv_thr = self.cfg.adv_thr_bytes(sample.total_bytes);
        if sample.used_bytes <= adv_thr {
            return;
        }
        let Some(link) = &self.advice else { return };
        // A registered process and its descendants must run as the user it
        // registered as (its real uid then).
        let expected = |pid: Pid, registered: Option<u64>, uid: Option<u32>| {
            let starttime_ticks =
                registered.or_else(|| procs.starttime_ticks.get(&pid).copied())?;
            Some(ExpectedProcess {
                pid,
                starttime_ticks,
                uid,
            })
        };
        let mut round = AdviceRound {
            used_bytes: sample.used_bytes,
            cfg: AdviceConfig {
                adv_thr_bytes: adv_thr,
                min_resident_bytes: self.cfg.hermes.min_resident_bytes,
            },
            be: Vec::new(),
            lc: Vec::new(),
        };
        for e in self.registry.iter() {
            let uid = e.creds.map(|c| c.ruid());
            let tree = procs.tree(e.pid);
            let descendants = tree
                .iter()
                .filter(|p| **p != e.pid)
                .filter_map(|p| expected(*p, None, uid));
            match e.class {
                Class::Elastic => {}
                Class::Lc => {
                    round
                        .lc
                        .extend(expected(e.pid, Some(e.starttime_ticks), None));
                    // Files an LC process holds are only looked at, never advised.
                    round.lc.extend(
                        tree.iter()
                            .filter(|p| **p != e.pid)
                            .filter_map(|p| expected(*p, None, None)),
                    );
                }
                Class::Be => {
                    if let Some(root) = expected(e.pid, Some(e.starttime_ticks), uid) {
                        round.be.push(BeJob {
                            root,
                            descendants: descendants.collect(),
                        });
                    }
                }
            }
        }
        let outcome = match link.try_hand_over(round) {
            Ok(()) => "handed_over",
            Err(NotHandedOver::Busy) => {
                self.advice_rounds_skipped += 1;
                "skipped_busy"
            }
            Err(NotHandedOver::Stopped) => {
                self.metrics
                    .errors
                    .with_label_values(&["advice_worker"])
                    .inc();
                return;
            }
        };
        self.metrics
            .file_advice_rounds
            .with_label_values(&[outcome])
            .inc();
    }

    /// Connects the Hermes advice worker ([`crate::advice::start`]).
    pub fn attach_advice(&mut self, link: AdviceLink) {
        self.advice = Some(link);
    }

    /// Records what finished advice rounds did: events, metrics and counters.
    pub fn collect_advice(&mut self) {
        let outcomes = match &self.advice {
            Some(link) => link.outcomes(),
            None => return,
        };
        for o in outcomes {
            self.record_advice(o);
        }
    }

    fn record_advice(&mut self, o: AdviceOutcome) {
        if let Some(why) = &o.aborted {
            self.metrics
                .file_advice_rounds
                .with_label_values(&["aborted"])
                .inc();
            self.metrics.errors.with_label_values(&["advice"]).inc();
            tracing::warn!(error = %why, "Hermes advice round advised nothing");
        }
        for d in o.dropped {
            self.file_cache_dropped_bytes += d.dropped_bytes;
            self.metrics
                .file_cache_dropped_bytes
                .inc_by(d.dropped_bytes);
            self.metrics.file_advice.inc();
            self.events.record(
                "file_cache_dropped",
                json!({"pid": d.job, "path": d.path, "dev": d.dev, "ino": d.ino,
                       "expected_bytes": d.expected_bytes, "dropped_bytes": d.dropped_bytes,
                       "used_bytes": o.used_bytes, "adv_thr_bytes": o.adv_thr_bytes}),
            );
        }
        for f in o.failed {
            self.metrics.errors.with_label_values(&["fadvise"]).inc();
            tracing::warn!(path = %f.path, dev = f.dev, ino = f.ino, error = %f.error, "posix_fadvise failed");
        }
        if o.skipped.foreign > 0 || o.processes_skipped > 0 {
            tracing::debug!(skipped = ?o.skipped, processes_skipped = o.processes_skipped, "Hermes advice left files out");
        }
    }

    /// Connects the asynchronous reclaim service: every poll then hands it the
    /// registered targets, the LC process trees and the CPUs it may use.
    pub fn attach_reclaim(&mut self, link: crate::async_reclaim::AsyncReclaimLink) {
        self.reclaim = Some(link);
        let procs = self.read_procs_tracked();
        self.publish_reclaim_targets(&procs);
    }

    fn publish_reclaim_targets(&mut self, procs: &ProcTable) {
        let Some(link) = &self.reclaim else { return };
        let mut inputs = crate::snapshot::NodeSnapshot {
            poll: self.polls,
            scope: self.last_sample.clone(),
            cpus: self.agent_cpus.clone(),
            ..Default::default()
        };
        for e in self.registry.iter() {
            if e.class == Class::Lc {
                inputs.lc_pids.extend(procs.tree(e.pid));
                inputs.lc_pids.insert(e.pid);
            }
            // A target is the registered process's proof, never its bare pid: the
            // workers act through its pidfd after re-verifying it, so a pid reused
            // after this poll is never reached.
            if let Some(p) = self.proven.get(&e.pid) {
                inputs.targets.push(crate::async_reclaim::ReclaimTarget {
                    process: p.clone(),
                    class: e.class,
                });
                if let Some(&rss) = procs.rss_bytes.get(&e.pid) {
                    inputs.rss_bytes.insert(e.pid, rss);
                }
            }
        }
        link.publish(inputs);
    }

    /// Confines the agent's thread to the CPUs no LC process is confined to, so that
    /// its own work (and the kernel work its `posix_fadvise` calls do) never
    /// competes with LC threads; all CPUs when LC processes may run anywhere.
    fn apply_cpu_affinity(&mut self) {
        if !self.cfg.avoid_lc_cpus {
            return;
        }
        use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
        // Online CPUs of the machine, not of our own mask (which we may have inherited
        // pinned from whoever started us).
        // SAFETY: sysconf has no memory-safety preconditions.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        if online < 1 {
            return;
        }
        let online = online as usize;
        let all: Vec<usize> = (0..CpuSet::count().min(1024)).collect();
        let mut lc_cpus = std::collections::BTreeSet::new();
        for e in self.registry.iter().filter(|e| e.class == Class::Lc) {
            if let Ok(set) = sched_getaffinity(nix::unistd::Pid::from_raw(e.pid)) {
                let cpus: Vec<usize> = all
                    .iter()
                    .copied()
                    .filter(|c| set.is_set(*c).unwrap_or(false))
                    .collect();
                // An LC process allowed on every online CPU leaves none to avoid.
                if cpus.len() < online {
                    lc_cpus.extend(cpus);
                }
            }
        }
        let mut mine = CpuSet::new();
        let mut n = 0;
        let own = sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok();
        for c in 0..online.min(1024) {
            if !lc_cpus.contains(&c) && mine.set(c).is_ok() {
                n += 1;
            }
        }
        if n == 0 {
            // Every CPU hosts an LC process: run anywhere.
            for c in 0..online.min(1024) {
                let _ = mine.set(c);
            }
        }
        let confined = !lc_cpus.is_empty() && n > 0;
        self.agent_cpus = confined.then(|| {
            (0..online)
                .filter(|c| mine.is_set(*c).unwrap_or(false))
                .collect()
        });
        if own.as_ref() == Some(&mine) {
            return;
        }
        // Every thread of the agent (runtime workers, reclaim threads), not only this
        // one: sched_setaffinity acts on one thread.
        let tids = ProcFs::root().read_self_task_tids().unwrap_or_default();
        for tid in tids {
            let _ = sched_setaffinity(nix::unistd::Pid::from_raw(tid), &mine);
        }
        match sched_setaffinity(nix::unistd::Pid::from_raw(0), &mine) {
            Ok(()) => {
                let cpus: Vec<usize> = (0..online)
                    .filter(|c| mine.is_set(*c).unwrap_or(false))
                    .collect();
                self.events
                    .record("agent_cpus", json!({"cpus": cpus, "lc_cpus": lc_cpus}));
            }
            Err(e) => tracing::warn!(error = %e, "cannot set the agent's CPU affinity"),
        }
    }

    fn update_registry_metrics(&self) {
        for class in [Class::Lc, Class::Be, Class::Elastic] {
            let n = self.registry.iter().filter(|e| e.class == class).count();
            self.metrics
                .registered
                .with_label_values(&[class.as_str()])
                .set(n as i64);
        }
    }

    fn update_poll_metrics(&self, s: &ScopeSample) {
        let m = &self.metrics;
        for (k, v) in [
            ("total", s.total_bytes),
            ("used", s.used_bytes),
            ("working_set", s.working_set_bytes),
            ("file", s.file_bytes),
            ("anon", s.anon_bytes),
            ("swap", s.swap_used_bytes),
        ] {
            m.node_memory_bytes.with_label_values(&[k]).set(v as i64);
        }
        let t = self.monitor.thresholds();
        for (k, v) in [
            ("low", t.low_bytes),
            ("high", t.high_bytes),
            ("top", t.top_bytes),
            ("adv_thr", self.cfg.adv_thr_bytes(s.total_bytes)),
        ] {
            m.threshold_bytes.with_label_values(&[k]).set(v as i64);
        }
        m.zone.set(match self.monitor.zone() {
            Zone::Green => 0,
            Zone::Yellow => 1,
            Zone::Red => 2,
            Zone::AboveTop => 3,
        });
        for class in [Class::Lc, Class::Be, Class::Elastic] {
            let n = self
                .registry
                .iter()
                .filter(|e| e.class == class && self.reclaim_unmatched(e))
                .count();
            m.reclaim_unmatched_processes
                .with_label_values(&[class.as_str()])
                .set(n as i64);
        }
        m.process_rss_bytes.reset();
        for e in self.registry.iter() {
            if let Some(seen) = self.seen.get(&e.pid) {
                m.process_rss_bytes
                    .with_label_values(&[&e.pid.to_string(), e.class.as_str(), &e.name])
                    .set(seen.rss_bytes as i64);
            }
        }
    }

    /// Marks the state (registry and monitor) changed: [`Core::flush_state`] writes
    /// it at the main loop's next flush, at most once per
    /// [`registry::FLUSH_INTERVAL`].
    fn persist(&mut self) {
        self.state_dirty = true;
    }

    /// Writes the state if it changed since the last write (the main loop calls this
    /// every [`registry::FLUSH_INTERVAL`]). A failed write (full disk, read-only
    /// file system) is logged, counted (`memcolo_state_write_errors_total`) and
    /// retried at the next flush; the state stays in memory meanwhile. Returns
    /// whether the state is saved.
    pub fn flush_state(&mut self) -> bool {
        if !self.state_dirty {
            return true;
        }
        match registry::save(&self.state_path, &self.registry, Some(self.monitor.state())) {
            Ok(()) => {
                self.state_dirty = false;
                self.metrics.state_writes.inc();
                if self.state_write_failing {
                    tracing::info!(path = %self.state_path.display(), "state saved again");
                    self.state_write_failing = false;
                }
                true
            }
            Err(e) => {
                self.metrics.state_write_errors.inc();
                self.metrics.errors.with_label_values(&["state"]).inc();
                if !self.state_write_failing {
                    tracing::error!(error = %e, "cannot save state; it stays in memory and the write is retried every second");
                    self.state_write_failing = true;
                }
                false
            }
        }
    }

    /// Saves the state (clean shutdown).
    pub fn shutdown(&mut self) {
        self.persist();
        self.flush_state();
        self.events
            .record("shutdown", json!({"registered": self.registry.len()}));
    }

    /// The registry, for tests and the status view.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The monitor, for tests and the status view.
    pub fn monitor(&self) -> &Monitor {
        &self.monitor
    }

    /// `memcolo status --json`: the whole state, every registered process included.
    pub fn status_json(&self) -> serde_json::Value {
        let mut st = self.status_page(0);
        st["processes"] = self.registry.iter().map(|e| self.process_json(e)).collect();
        st["next_offset"] = serde_json::Value::Null;
        st
    }

    /// One page of the state for a `status` request: the registered processes from
    /// index `offset` on, as many as keep the encoded reply under the protocol's
    /// line limit, and `next_offset` (null after the last page). Reclaim's list of
    /// targets is cut to its first 32 (`targets_total` counts them all).
    pub fn status_page(&self, offset: u64) -> serde_json::Value {
        let mut st = self.status_header();
        if let Some(targets) = st
            .get_mut("reclaim")
            .and_then(|r| r.get_mut("targets"))
            .and_then(|t| t.as_array_mut())
        {
            let n = targets.len();
            targets.truncate(32);
            st["reclaim"]["targets_total"] = n.into();
        }
        // Room for the envelope ({"v":1,"type":"status","status":...}) and the
        // paging fields.
        let mut budget = memcolo_proto::MAX_LINE_BYTES
            .saturating_sub(serde_json::to_vec(&st).map(|v| v.len()).unwrap_or(0) + 256);
        let mut page = Vec::new();
        let mut next = None;
        for (i, e) in self.registry.iter().enumerate().skip(offset as usize) {
            let p = self.process_json(e);
            let len = serde_json::to_vec(&p).map(|v| v.len()).unwrap_or(0) + 1;
            if len > budget {
                next = Some(i);
                break;
            }
            budget -= len;
            page.push(p);
        }
        st["processes"] = page.into();
        st["processes_total"] = self.registry.len().into();
        st["processes_offset"] = offset.into();
        st["next_offset"] = next.into();
        st
    }

    fn process_json(&self, e: &Entry) -> serde_json::Value {
        let seen = self.seen.get(&e.pid);
        let rates = self
            .ledgers
            .get(&e.pid)
            .map(|l| l.rates(self.last_poll_at))
            .unwrap_or_default();
        json!({
            "pid": e.pid, "class": e.class, "name": e.name, "notify": e.notify,
            "connected": e.conn.is_some(),
            "rss_bytes": seen.map(|s| s.rss_bytes), "descendants": seen.map(|s| s.descendants),
            "notifications_sent": e.notifications_sent, "notifications": e.notified,
            "notifications_per_min": rates.notifications_per_min,
            "reclaimed_bytes": e.reclaimed_bytes, "reclaim_reports": e.reclaim_reports,
            "reclaim_bytes_per_s": rates.reclaim_bytes_per_s,
            "reclaim_unmatched": self.reclaim_unmatched(e),
            "epoch_ms": self.monitor.epoch(e.pid).map(|d| d.as_millis() as u64),
            "failed_reclaims": e.failed_reclaims,
            "in_scope": !self.out_of_scope.contains(&e.pid),
            "expected_reclaim_bytes": self.monitor.expected_reclaim_bytes(&ProcView {
                pid: e.pid, class: e.class, started_at: Duration::ZERO,
                rss_bytes: seen.map(|s| s.rss_bytes).unwrap_or(0), notifiable: true,
                expected_reclaim_bytes: e.expected_reclaim_bytes,
            }),
        })
    }

    fn status_header(&self) -> serde_json::Value {
        let t = self.monitor.thresholds();
        let s = self.last_sample.as_ref();
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "scope": self.scope.describe(),
            "poll_ms": self.cfg.poll_ms,
            "polls": self.polls,
            "zone": self.monitor.zone(),
            "memory": s.map(|s| json!({
                "total_bytes": s.total_bytes, "used_bytes": s.used_bytes,
                "working_set_bytes": s.working_set_bytes, "file_bytes": s.file_bytes,
                "anon_bytes": s.anon_bytes, "swap_used_bytes": s.swap_used_bytes,
            })),
            "thresholds": {
                "low_bytes": t.low_bytes, "high_bytes": t.high_bytes, "top_bytes": t.top_bytes,
                "adv_thr_bytes": self.cfg.adv_thr_bytes(self.scope_total_bytes),
            },
            "counters": {
                "file_cache_dropped_bytes": self.file_cache_dropped_bytes,
                "file_advice_rounds_skipped": self.advice_rounds_skipped,
                "kills": self.kills,
                "dropped_notifications": self.dropped_notifications,
                "outstanding_notifications": self.outstanding.len(),
            },
            "state": {
                "path": self.state_path, "dirty": self.state_dirty,
                "writes": self.metrics.state_writes.get(),
                "write_errors": self.metrics.state_write_errors.get(),
            },
            "reclaim": self.reclaim.as_ref().map(|r| r.status()),
            "mechanisms": self.mechanisms.json(),
            "mechanisms_off": self.mechanisms.off_json(),
        })
    }

    /// Records which mechanisms run (what started of what the configuration asked).
    pub fn set_mechanisms(&mut self, m: crate::mechanisms::Mechanisms) {
        self.mechanisms = m;
    }
}

/// The signals that carry `low`, `high` and `top` in signal mode: SIGRTMIN+1..3.
fn notify_signals() -> [i32; 3] {
    let base = libc::SIGRTMIN();
    [base + 1, base + 2, base + 3]
}

/// Whether a process runs as the same user as a registered job: the same real and
/// effective uid and gid, and no capability the job did not have.
pub(crate) fn same_user(c: &Credentials, job: &Credentials) -> bool {
    c.ruid() == job.ruid()
        && c.euid() == job.euid()
        && c.gids[0] == job.gids[0]
        && c.egid() == job.egid()
        && c.cap_eff & !job.cap_eff == 0
        && c.cap_prm & !job.cap_prm == 0
}

fn err(code: ErrorCode, message: String) -> Reply {
    Reply::Error { code, message }
}

fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
