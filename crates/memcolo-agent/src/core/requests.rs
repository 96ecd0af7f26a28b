//! Requests from clients, and the identity of the processes they name: register
//! (with a proof of the process: pidfd, start time, credentials), unregister,
//! `reclaimed` answers to notifications, cgroup creation, status; and the end of a
//! registration when its process exits or can no longer be proved.

use super::pid_namespaces::NsLookup;
use super::{err, notify_signals, unix_now_s, Core, Peer, PeerNamespace};
use crate::registry::{self, Entry};
use memcolo_linux::identity::{IdentityError, ProvenProcess};
use memcolo_linux::scope::Scope;
use memcolo_policy::{Class, Pid};
use memcolo_proto::{ErrorCode, NotifyMode, Reply, Request};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// What a pid in a request names ([`Core::named`]).
pub(super) enum Named {
    /// The connecting process itself.
    Peer,
    /// Another process, by the agent's pid; `ns`: the peer named it as the second
    /// member in the pid namespace of the first.
    Other { pid: Pid, ns: Option<(u64, Pid)> },
}

impl Core {
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
                        if peer.is_root()
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
    pub(super) fn cgroup(&mut self, peer: &Peer, name: &str) -> Reply {
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
        let made = if peer.is_root() {
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

    /// The pid a request acts on: the peer itself (`pid` absent or the peer's own), or
    /// another process for root ([`Named`]).
    pub(super) fn target_pid(&self, peer: &Peer, pid: Option<Pid>) -> Result<Pid, Reply> {
        match self.named(peer, pid)? {
            Named::Peer => self.self_pid(peer).map(|p| p.pid()),
            Named::Other { pid, .. } => Ok(pid),
        }
    }

    /// What a pid in a request names. It is read where the peer lives: a peer in the
    /// agent's pid namespace names the agent's pids; a peer in another one (a
    /// container's) names pids of its own namespace, mapped here to the agent's
    /// ([`super::pid_namespaces`], a bounded number of `/proc` walks), so that no
    /// process outside a container can be named from inside it. Another process than the
    /// peer may be named by root only: the node's root anywhere, a namespace's root
    /// within it. Errors: `bad_request` (pid <= 0), `permission_denied`,
    /// `no_such_process` (nothing of that id in the peer's namespace),
    /// `limit_exceeded` (the agent's `/proc` walks for this second are spent).
    pub(super) fn named(&self, peer: &Peer, pid: Option<Pid>) -> Result<Named, Reply> {
        let Some(p) = pid else {
            return Ok(Named::Peer);
        };
        if p <= 0 {
            return Err(err(ErrorCode::BadRequest, format!("invalid pid {p}")));
        }
        let denied = || {
            err(
                ErrorCode::PermissionDenied,
                format!("only root may act on another process (pid {p})"),
            )
        };
        match peer.pid_ns {
            PeerNamespace::Agent if Some(p) == peer.pid => Ok(Named::Peer),
            PeerNamespace::Agent if peer.uid == 0 => Ok(Named::Other { pid: p, ns: None }),
            PeerNamespace::Agent => Err(denied()),
            PeerNamespace::Other(ns) => {
                let own = peer
                    .process
                    .as_ref()
                    .and_then(|me| me.pid_in_own_namespace(&self.procfs).ok());
                if own == Some(p) {
                    return Ok(Named::Peer);
                }
                if peer.uid != 0 {
                    return Err(denied());
                }
                let found = {
                    let mut maps = self.ns_maps.borrow_mut();
                    let before = maps.walks();
                    let found = maps.lookup(&self.procfs, ns, p, std::time::Instant::now());
                    self.metrics
                        .pid_namespace_walks
                        .inc_by(maps.walks() - before);
                    found
                };
                match found {
                    Ok(NsLookup::Found(h)) => Ok(Named::Other {
                        pid: h,
                        ns: Some((ns, p)),
                    }),
                    Ok(NsLookup::Missing) => Err(err(
                        ErrorCode::NoSuchProcess,
                        format!("no process {p} in the caller's pid namespace"),
                    )),
                    Ok(NsLookup::Busy) => Err(err(
                        ErrorCode::LimitExceeded,
                        format!("too many lookups of pids in containers' pid namespaces this second; ask again for pid {p}"),
                    )),
                    Err(e) => Err(err(
                        ErrorCode::Internal,
                        format!("cannot read the caller's pid namespace: {e}"),
                    )),
                }
            }
            PeerNamespace::Unknown => Err(err(
                ErrorCode::PermissionDenied,
                "the connecting process could not be identified (it exited or changed credentials before the agent looked); connect again from the process itself".into(),
            )),
        }
    }

    /// Opens and proves process `pid` named by a request; `ns`: it was named as
    /// `ns_pid` in pid namespace `ns`, which is checked again once the process is
    /// held by its pidfd (the pid may have been reused since it was looked up).
    fn open_named(&self, pid: Pid, ns: Option<(u64, Pid)>) -> Result<ProvenProcess, Reply> {
        let shown = ns.map(|n| n.1).unwrap_or(pid);
        let p = match self.prover.open(pid, None) {
            Ok(x) => x,
            Err(e) if e.is_gone() => {
                return Err(err(ErrorCode::NoSuchProcess, format!("no process {shown}")))
            }
            Err(e) => {
                return Err(err(
                    ErrorCode::Internal,
                    format!("cannot read process {shown}: {e}"),
                ))
            }
        };
        if let Some((ns, ns_pid)) = ns {
            let same = p.pid_namespace(&self.procfs).ok() == Some(ns)
                && p.pid_in_own_namespace(&self.procfs).ok() == Some(ns_pid);
            if !same {
                self.ns_maps.borrow_mut().forget(ns);
                return Err(err(
                    ErrorCode::NoSuchProcess,
                    format!("process {ns_pid} left the caller's pid namespace"),
                ));
            }
        }
        Ok(p)
    }

    /// The connecting process itself, proved again now: a peer that exited since it
    /// connected (leaving, say, a forked child on the socket while its pid goes to
    /// another process) or that changed credentials (a set-user-ID exec) is refused.
    pub(super) fn self_pid(&self, peer: &Peer) -> Result<Arc<ProvenProcess>, Reply> {
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
    pub(super) fn track(&mut self, p: ProvenProcess) -> std::io::Result<()> {
        self.track_arc(Arc::new(p))
    }

    pub(super) fn track_arc(&mut self, p: Arc<ProvenProcess>) -> std::io::Result<()> {
        let fd = p.dup_pidfd().map_err(std::io::Error::other)?;
        self.watcher.watch(p.pid(), fd)?;
        self.proven.insert(p.pid(), p);
        Ok(())
    }

    /// The registered process `pid`, verified now; a process that exited or changed
    /// credentials loses its registration here (an exec of a set-user-ID program by
    /// a registered BE process must not make the agent kill that program).
    pub(super) fn verified(&mut self, pid: Pid) -> Option<Arc<ProvenProcess>> {
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
    pub(super) fn end_registration(&mut self, pid: Pid, why: &IdentityError) {
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
    pub(super) fn register(
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
        // The process, proved: the peer itself, or (root only) another one.
        let proc_ = match self.named(peer, pid).and_then(|n| match n {
            Named::Peer => self.self_pid(peer),
            Named::Other { pid, ns } => self.open_named(pid, ns).map(Arc::new),
        }) {
            Ok(x) => x,
            Err(r) => return r,
        };
        let target = proc_.pid();
        let creds = *proc_.credentials();
        let fresh = self
            .registry
            .get(target)
            .map(|e| e.starttime_ticks != proc_.starttime_ticks() || e.creds != Some(creds))
            .unwrap_or(true);
        if fresh && !peer.is_root() {
            let limit = self.cfg.limits.registrations_per_uid;
            let held = self
                .registry
                .iter()
                // Registrations the agent made for pods are not the user's.
                .filter(|e| e.pod_uid.is_none() && e.creds.is_some_and(|c| c.ruid() == peer.uid))
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
            match self.unhandled_notify_signals(target) {
                Ok(missing) if missing.is_empty() => {}
                Ok(missing) => {
                    return err(
                        ErrorCode::BadRequest,
                        format!(
                            "process {target} has no handler for signal(s) {missing:?} (SIGRTMIN+1..3 carry low, high and top): the first notification would kill it; install handlers first or register with notify socket"
                        ),
                    );
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
            pod_uid: None,
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
    pub(super) fn in_scope(&self, pid: Pid) -> bool {
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
    pub(super) fn note_scope(&mut self, pid: Pid, name: &str) {
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

    /// Kubernetes mode: the pods' processes as registrations. A process no client
    /// registered is registered as its pod says (class, name, notify, expected
    /// reclamation), proved like any other; a pod registration whose process left
    /// the list (the pod went, or its class changed) is removed. A registration a
    /// client made itself is left as it is. `notify: signal` is kept only for a
    /// process with handlers for the three signals: without one, the first signal
    /// would kill it, so it is registered with `none` and that is said once.
    pub fn sync_pod_registrations(&mut self, procs: &[crate::kubernetes::PodProcess]) {
        let want: std::collections::HashMap<Pid, &crate::kubernetes::PodProcess> =
            procs.iter().map(|p| (p.pid, p)).collect();
        let stale: Vec<Pid> = self
            .registry
            .iter()
            .filter(|e| {
                e.pod_uid.as_ref().is_some_and(|uid| {
                    want.get(&e.pid)
                        .is_none_or(|w| &w.pod_uid != uid || w.class != e.class)
                })
            })
            .map(|e| e.pid)
            .collect();
        let mut changed = !stale.is_empty();
        for pid in stale {
            if let Some(e) = self.registry.remove(pid) {
                self.forget(pid);
                self.events.record(
                    "unregistered",
                    json!({"pid": pid, "name": e.name, "pod_uid": e.pod_uid}),
                );
            }
        }
        for w in procs {
            if self.registry.get(w.pid).is_some() {
                continue;
            }
            let Ok(p) = self.prover.open(w.pid, None) else {
                continue;
            };
            let mut notify = w.notify;
            if notify == NotifyMode::Signal
                && !self
                    .unhandled_notify_signals(w.pid)
                    .is_ok_and(|m| m.is_empty())
            {
                tracing::warn!(pid = w.pid, pod = %w.name,
                    "memcolo.io/notify is signal but the process has no handler for SIGRTMIN+1..3: not signalled");
                notify = NotifyMode::None;
            }
            let entry = Entry {
                pid: w.pid,
                class: w.class,
                name: w.name.chars().take(registry::MAX_NAME_BYTES).collect(),
                starttime_ticks: p.starttime_ticks(),
                expected_reclaim_bytes: w.expected_reclaim_bytes,
                notify,
                registered_unix_s: unix_now_s(),
                notifications_sent: 0,
                notified: Default::default(),
                reclaimed_bytes: 0,
                reclaim_reports: 0,
                failed_reclaims: 0,
                creds: Some(*p.credentials()),
                conn: None,
                pod_uid: Some(w.pod_uid.clone()),
            };
            if entry.validate().is_err() || self.track(p).is_err() {
                continue;
            }
            self.monitor.forget(w.pid);
            self.events.record(
                "registered",
                json!({"pid": w.pid, "class": w.class, "name": entry.name, "notify": notify,
                       "pod_uid": w.pod_uid}),
            );
            self.registry.insert(entry);
            changed = true;
        }
        if changed {
            self.persist();
            self.update_registry_metrics();
        }
    }

    /// The notification signals (SIGRTMIN+1..3) that process `pid` neither catches
    /// nor ignores: without a handler, the first one's default action would kill it.
    fn unhandled_notify_signals(&self, pid: Pid) -> memcolo_linux::Result<Vec<i32>> {
        let st = self.procfs.read_pid_status(pid)?;
        let handled = st.sig_cgt | st.sig_ign;
        Ok(notify_signals()
            .iter()
            .copied()
            .filter(|s| handled & (1u64 << (s - 1)) == 0)
            .collect())
    }

    pub(super) fn forget(&mut self, pid: Pid) {
        self.out_of_scope.remove(&pid);
        if self.proven.remove(&pid).is_some() {
            self.watcher.unwatch(pid);
        }
        self.monitor.forget(pid);
        self.seen.remove(&pid);
        self.ledgers.remove(&pid);
        self.outstanding.retain(|_, o| o.pid != pid);
    }
}
