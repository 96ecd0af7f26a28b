//! The agent on a Kubernetes node (`[kubernetes]`, `--kubernetes`): pods found in
//! the kubelet's cgroup tree ([`memcolo_linux::kubepods`]), classed by annotation or
//! QoS class ([`memcolo_policy::kubernetes::pod_class`]), BE pods evicted through the
//! Eviction API when M3's kill rule picks them, the node's memory signals
//! published on its Node object, and the pods' processes handed to the core as
//! registrations ([`PodProcess`]) so that M3's notifications, Hermes' advice and
//! Hermit's reclaim reach them.
//!
//! [`KubeNode::poll`] is called once per poll with the scope's usage and M3's
//! thresholds. It never blocks on the API server: requests go to an [`ApiWorker`]
//! and their outcomes are read at the next poll.
//!
//! **Eviction** follows M3's kill rule (R5, M3 §5.1): once usage has been above top
//! for `kill_after`, [`pick_evictions`] takes BE pods, lowest `spec.priority` first,
//! until the memory they hold covers the overshoot; each is evicted through
//! `policy/v1` Eviction (which respects PodDisruptionBudgets) with the configured
//! grace period, and an Event on the pod says why. A pod whose eviction is in flight
//! is not asked again while it still shows in the tree; a pod whose eviction is
//! refused (429: a PodDisruptionBudget) is passed over for [`REFUSED_BACKOFF`],
//! doubling while refusals go on, so that the next BE pod is evicted instead. **SIGKILL** of a pod's
//! processes is the fallback only while the API server is unreachable (its last
//! answer was none) and the node is above top: each process is opened by pidfd, found
//! again in the same pod's cgroup, and killed through that pidfd. LC and elastic pods
//! are never evicted nor killed.
//!
//! **Signals to the scheduler**, at most once per `publish_interval_s`: the Node's
//! `memcolo.io/memory` annotation (zone, thresholds, usage, reclaimable BE bytes, as
//! JSON) and the `kubernetes.io/batch-memory` extended resource (Koordinator's name):
//! the memory below top that LC and elastic pods do not hold.

pub mod api;
#[cfg(feature = "kube-client")]
pub mod client;

pub use api::{ApiError, ApiOutcome, ApiRequest, ApiWorker, KubeApi, PodCache, PodMeta};

use memcolo_linux::actuate::Actuator;
use memcolo_linux::cgroup::{memory_cgroup_path, MemoryCgroup};
use memcolo_linux::identity::ProvenProcess;
use memcolo_linux::kubepods::{discover, parse_path, DiscoveredPod};
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::kubernetes::{pick_evictions, pod_class, ClassSource, PodView};
use memcolo_policy::m3::{Thresholds, Zone};
use memcolo_policy::Class;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

/// How long a pod whose eviction was refused (429) is passed over, doubling with each
/// refusal in a row up to [`REFUSED_BACKOFF_MAX`].
pub const REFUSED_BACKOFF: Duration = Duration::from_secs(10);
/// The longest a refused pod is passed over.
pub const REFUSED_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// What [`KubeNode`] needs to know.
#[derive(Clone, Debug)]
pub struct KubeNodeConfig {
    /// This node's name.
    pub node: String,
    /// The kubelet's `kubepods` group directory.
    pub kubepods: PathBuf,
    /// Class of a Burstable pod without the class annotation.
    pub burstable_class: Class,
    /// Namespaces whose pods may raise their class by annotation (`*`: all).
    pub trusted_namespaces: Vec<String>,
    /// Grace period of evictions; `None`: the pod's own.
    pub eviction_grace_period_s: Option<u64>,
    /// M3's `kill_after`: above top this long before evicting.
    pub kill_after: Duration,
    /// Node signals are published at most this often.
    pub publish_interval: Duration,
}

/// One pod as the last poll saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct PodState {
    pub found: DiscoveredPod,
    pub class: Class,
    pub priority: i32,
    /// `namespace/name`, when the API server has told it.
    pub name: Option<String>,
    pub memory_bytes: u64,
    /// Per-pod options from its annotations.
    pub options: memcolo_policy::kubernetes::PodOptions,
}

/// A pod's process as a registration: each container's top processes (those whose
/// parent is not in the same pod) with the pod's class, name and per-pod options, so
/// that M3's notifications, Hermes' advice and Hermit's reclaim reach pods as they
/// reach registered processes ([`crate::core::Core::sync_pod_registrations`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodProcess {
    pub pid: memcolo_policy::Pid,
    pub class: Class,
    /// `namespace/name`, else `pod:<uid>`.
    pub name: String,
    /// `memcolo.io/notify`: signal or none.
    pub notify: memcolo_proto::NotifyMode,
    /// `memcolo.io/expected-reclaim-bytes`.
    pub expected_reclaim_bytes: Option<u64>,
    pub pod_uid: String,
}

/// What one poll did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PollReport {
    /// Pods found, by UID.
    pub pods: BTreeMap<String, (Class, u64)>,
    /// UIDs whose eviction was asked of the API server in this poll.
    pub evictions_requested: Vec<String>,
    /// UIDs whose processes were killed (fallback) in this poll.
    pub killed: Vec<String>,
    /// Whether node signals were queued.
    pub published: bool,
    /// The pods' processes as registrations.
    pub processes: Vec<PodProcess>,
    /// `memcolo.io/t-miss` of every process of the pods that have it: the target a
    /// tiered region of that process gets when it registers without one of its own.
    pub tier_targets: HashMap<memcolo_policy::Pid, f64>,
}

/// The Kubernetes side of the agent.
pub struct KubeNode {
    cfg: KubeNodeConfig,
    procfs: ProcFs,
    actuator: Box<dyn Actuator>,
    api: ApiWorker,
    /// Pod metadata from the API server (list + watch).
    pub cache: PodCache,
    first_seen: HashMap<String, Duration>,
    /// Pods asked to go (by eviction or kill), still in the tree.
    in_flight: BTreeMap<String, Duration>,
    /// The API server's last answer was none.
    api_unreachable: bool,
    above_top_since: Option<Duration>,
    last_publish: Option<Duration>,
    /// Evictions the API server accepted.
    pub evictions: u64,
    /// Pods whose processes were killed because the API server was unreachable.
    pub fallback_kills: u64,
    /// Pods whose eviction the API server refused (429: a PodDisruptionBudget), with
    /// when they may be asked again and how many refusals in a row: passed over by
    /// the kill rule until then, so that the next BE pod is evicted instead.
    refused: HashMap<String, (Duration, u32)>,
    /// The time of the last poll, for outcomes read at the next.
    last_now: Duration,
    /// Pods already reported for a refused class annotation or a truncated walk, so
    /// each is said once while the pod lives, not at every poll.
    reported: std::collections::HashSet<String>,
    /// The pod watch's latest snapshot of this node's pods.
    feed: Option<tokio::sync::watch::Receiver<std::sync::Arc<Vec<PodMeta>>>>,
}

impl KubeNode {
    pub fn new(
        cfg: KubeNodeConfig,
        procfs: ProcFs,
        actuator: Box<dyn Actuator>,
        api: ApiWorker,
    ) -> KubeNode {
        let cache = PodCache::new(&cfg.node);
        KubeNode {
            cfg,
            procfs,
            actuator,
            api,
            cache,
            first_seen: HashMap::new(),
            in_flight: BTreeMap::new(),
            api_unreachable: false,
            above_top_since: None,
            last_publish: None,
            evictions: 0,
            fallback_kills: 0,
            feed: None,
            reported: Default::default(),
            refused: HashMap::new(),
            last_now: Duration::ZERO,
        }
    }

    /// Pod metadata from now on comes from `feed` (the pod watch's snapshots), read
    /// at each poll when it has changed.
    pub fn attach_pod_feed(
        &mut self,
        feed: tokio::sync::watch::Receiver<std::sync::Arc<Vec<PodMeta>>>,
    ) {
        self.feed = Some(feed);
    }

    /// Whether the API server's last answer was none.
    pub fn api_unreachable(&self) -> bool {
        self.api_unreachable
    }

    fn read_outcomes(&mut self) {
        for o in self.api.outcomes() {
            match o {
                ApiOutcome::Evicted { uid } => {
                    self.refused.remove(&uid);
                    self.set_reachable(true);
                    self.evictions += 1;
                    tracing::info!(pod_uid = %uid, "pod evicted through the API server");
                }
                ApiOutcome::EvictFailed { uid, error } => {
                    self.in_flight.remove(&uid);
                    self.set_reachable(!matches!(error, ApiError::Unreachable(_)));
                    if let ApiError::Status { code: 429, .. } = error {
                        // A budget protects the pod now: pass it over, asking again
                        // after REFUSED_BACKOFF, doubling while refusals go on.
                        let n = self.refused.get(&uid).map_or(1, |r| r.1 + 1);
                        let wait = REFUSED_BACKOFF
                            .saturating_mul(1 << (n - 1).min(5))
                            .min(REFUSED_BACKOFF_MAX);
                        self.refused.insert(uid.clone(), (self.last_now + wait, n));
                        tracing::info!(pod_uid = %uid, %error, again_in_s = wait.as_secs(),
                            "eviction refused: the next BE pod is taken instead");
                    } else {
                        tracing::warn!(pod_uid = %uid, %error, "eviction failed");
                    }
                }
                ApiOutcome::NodePatched => self.set_reachable(true),
                ApiOutcome::NodePatchFailed { error } => {
                    let unreachable = matches!(error, ApiError::Unreachable(_));
                    // An unreachable API server is said once, when it goes (below),
                    // not at every publish interval while it stays away.
                    if !(unreachable && self.api_unreachable) {
                        tracing::warn!(%error, "cannot publish the node's memory signals");
                    }
                    self.set_reachable(!unreachable);
                }
            }
        }
    }

    /// Records whether the API server answered, saying so when that changes.
    fn set_reachable(&mut self, reachable: bool) {
        if reachable && self.api_unreachable {
            tracing::info!("the API server answers again");
        } else if !reachable && !self.api_unreachable {
            tracing::warn!("the API server does not answer: BE pods are killed through their pidfds above top until it does");
        }
        self.api_unreachable = !reachable;
    }

    /// The pods in the tree now, with their class and memory.
    pub fn pods(&mut self, now: Duration) -> memcolo_linux::Result<Vec<PodState>> {
        let found = discover(&self.cfg.kubepods)?;
        let mut out = Vec::with_capacity(found.len());
        for f in found {
            let meta = self.cache.get(&f.pod.uid);
            let qos = meta.and_then(|m| m.qos).unwrap_or(f.pod.qos);
            let empty = BTreeMap::new();
            let ann = meta.map(|m| &m.annotations).unwrap_or(&empty);
            let trusted = meta.is_some_and(|m| {
                memcolo_policy::kubernetes::namespace_trusted(
                    &m.namespace,
                    &self.cfg.trusted_namespaces,
                )
            });
            let (class, source) = pod_class(ann, qos, self.cfg.burstable_class, trusted);
            let options = memcolo_policy::kubernetes::pod_options(ann);
            let truncated = f.containers.iter().any(|c| c.truncated);
            if (truncated
                || !matches!(
                    source,
                    ClassSource::Annotation
                        | ClassSource::Qos {
                            ignored_annotation: None
                        }
                ))
                && self.reported.insert(f.pod.uid.clone())
            {
                let name = meta.map(|m| format!("{}/{}", m.namespace, m.name));
                match &source {
                    ClassSource::Refused { asked } => tracing::warn!(
                        pod_uid = %f.pod.uid, pod = ?name, asked = asked.as_str(), class = class.as_str(),
                        "the pod's memcolo.io/class asks for more protection than its QoS class gives, \
                         and its namespace is not in kubernetes.trusted_namespaces: not obeyed"
                    ),
                    ClassSource::Qos {
                        ignored_annotation: Some(v),
                    } => tracing::warn!(
                        pod_uid = %f.pod.uid, pod = ?name, value = %v,
                        "the pod's memcolo.io/class is not lc, be or elastic: not obeyed"
                    ),
                    _ => {}
                }
                if truncated {
                    tracing::warn!(
                        pod_uid = %f.pod.uid, pod = ?name,
                        max_groups = memcolo_linux::kubepods::MAX_GROUPS_PER_CONTAINER,
                        "a container of the pod holds more cgroups than are read per poll: processes deep in it are not seen"
                    );
                }
            }
            let memory_bytes = MemoryCgroup::open(&f.path)
                .and_then(|cg| {
                    let usage = cg.read_usage_bytes()?;
                    let stat = cg.read_memory_stat()?;
                    Ok(usage.saturating_sub(stat.inactive_file_bytes))
                })
                .unwrap_or(0);
            self.first_seen.entry(f.pod.uid.clone()).or_insert(now);
            out.push(PodState {
                class,
                priority: meta.map(|m| m.priority).unwrap_or(0),
                name: meta.map(|m| format!("{}/{}", m.namespace, m.name)),
                memory_bytes,
                options,
                found: f,
            });
        }
        let live: std::collections::HashSet<&str> =
            out.iter().map(|p| p.found.pod.uid.as_str()).collect();
        self.first_seen.retain(|k, _| live.contains(k.as_str()));
        self.in_flight.retain(|k, _| live.contains(k.as_str()));
        self.reported.retain(|k| live.contains(k.as_str()));
        self.refused.retain(|k, _| live.contains(k.as_str()));
        Ok(out)
    }

    /// The pods' processes as registrations: in each pod, the processes whose parent
    /// is not in the pod (a container's init, or a process the runtime started in it),
    /// since a registration covers its process's descendants. Pods whose eviction is in
    /// flight are left out.
    pub fn pod_processes(&self, pods: &[PodState]) -> Vec<PodProcess> {
        use memcolo_policy::kubernetes::PodNotify;
        let mut out = Vec::new();
        for p in pods {
            if self.in_flight.contains_key(&p.found.pod.uid) {
                continue;
            }
            let all = p.found.all_pids();
            let name = p
                .name
                .clone()
                .unwrap_or_else(|| format!("pod:{}", p.found.pod.uid));
            for &pid in &all {
                let Ok(st) = self.procfs.read_pid_stat(pid) else {
                    continue;
                };
                if all.binary_search(&st.ppid).is_ok() {
                    continue;
                }
                out.push(PodProcess {
                    pid,
                    class: p.class,
                    name: name.clone(),
                    notify: match p.options.notify {
                        PodNotify::Signal => memcolo_proto::NotifyMode::Signal,
                        PodNotify::None => memcolo_proto::NotifyMode::None,
                    },
                    expected_reclaim_bytes: p.options.expected_reclaim_bytes,
                    pod_uid: p.found.pod.uid.clone(),
                });
            }
        }
        out
    }

    /// One poll: `used_bytes` of the scope against M3's thresholds `th`, `now` on the
    /// agent's monotonic clock. `now_rfc3339` stamps the Events.
    pub fn poll(
        &mut self,
        now: Duration,
        used_bytes: u64,
        th: Thresholds,
        now_rfc3339: &str,
    ) -> memcolo_linux::Result<PollReport> {
        self.last_now = now;
        self.read_outcomes();
        if let Some(feed) = self.feed.as_mut() {
            if feed.has_changed().unwrap_or(false) {
                let pods = feed.borrow_and_update().clone();
                self.cache.replace(pods.as_ref().clone());
            }
        }
        let pods = self.pods(now)?;
        let mut report = PollReport {
            pods: pods
                .iter()
                .map(|p| (p.found.pod.uid.clone(), (p.class, p.memory_bytes)))
                .collect(),
            processes: self.pod_processes(&pods),
            tier_targets: pods
                .iter()
                .filter_map(|p| p.options.t_miss.map(|t| (p, t)))
                .flat_map(|(p, t)| p.found.all_pids().into_iter().map(move |pid| (pid, t)))
                .collect(),
            ..Default::default()
        };
        let zone = th.zone_of(used_bytes);
        if zone == Zone::AboveTop {
            self.above_top_since.get_or_insert(now);
        } else {
            self.above_top_since = None;
        }
        let above_for = self.above_top_since.map(|s| now.saturating_sub(s));
        if above_for.is_some_and(|d| d >= self.cfg.kill_after) {
            let views: Vec<PodView> = pods
                .iter()
                .filter(|p| {
                    self.refused
                        .get(&p.found.pod.uid)
                        .is_none_or(|r| now >= r.0)
                })
                .map(|p| PodView {
                    uid: p.found.pod.uid.clone(),
                    class: p.class,
                    priority: p.priority,
                    started_at: self
                        .first_seen
                        .get(&p.found.pod.uid)
                        .copied()
                        .unwrap_or(now),
                    memory_bytes: p.memory_bytes,
                })
                .collect();
            let already: Vec<String> = self.in_flight.keys().cloned().collect();
            for uid in pick_evictions(&views, used_bytes, th.top_bytes, &already) {
                let Some(p) = pods.iter().find(|p| p.found.pod.uid == uid) else {
                    continue;
                };
                if p.class != Class::Be {
                    // pick_evictions never returns one; refuse loudly if it ever does.
                    tracing::error!(pod_uid = %uid, class = %p.class, "refusing to evict a pod that is not BE");
                    continue;
                }
                let reason = format!(
                    "memcolo: node memory working set {used_bytes} bytes above top {} bytes for {:.0} s \
                     (M3 kill rule); best-effort pod (priority {}, {} bytes) picked lowest priority first",
                    th.top_bytes,
                    above_for.unwrap_or_default().as_secs_f64(),
                    p.priority,
                    p.memory_bytes
                );
                let meta = self.cache.get(&uid).cloned();
                match meta {
                    Some(meta) if !self.api_unreachable => {
                        let body = api::eviction_body(&meta, self.cfg.eviction_grace_period_s);
                        let event = api::event_body(&meta, &self.cfg.node, &reason, now_rfc3339);
                        if self.api.send(ApiRequest::Evict {
                            pod: meta,
                            body,
                            event,
                        }) {
                            self.in_flight.insert(uid.clone(), now);
                            report.evictions_requested.push(uid);
                        }
                    }
                    _ if self.api_unreachable => {
                        self.kill_pod(&p.found, &reason);
                        self.in_flight.insert(uid.clone(), now);
                        self.fallback_kills += 1;
                        report.killed.push(uid);
                    }
                    // No metadata yet but the API server answers: wait for the watch.
                    _ => {}
                }
            }
        }
        if self
            .last_publish
            .is_none_or(|t| now.saturating_sub(t) >= self.cfg.publish_interval)
        {
            self.last_publish = Some(now);
            let be: u64 = pods
                .iter()
                .filter(|p| p.class == Class::Be)
                .map(|p| p.memory_bytes)
                .sum();
            let others: u64 = pods
                .iter()
                .filter(|p| p.class != Class::Be)
                .map(|p| p.memory_bytes)
                .sum();
            let signals = api::NodeSignals {
                zone: zone.as_str().into(),
                low_bytes: th.low_bytes,
                high_bytes: th.high_bytes,
                top_bytes: th.top_bytes,
                used_bytes,
                reclaimable_be_bytes: be,
            };
            let a = self.api.send(ApiRequest::PatchNode {
                node: self.cfg.node.clone(),
                status: false,
                patch: api::node_annotation_patch(&signals),
            });
            let b = self.api.send(ApiRequest::PatchNode {
                node: self.cfg.node.clone(),
                status: true,
                patch: api::batch_memory_patch(th.top_bytes.saturating_sub(others)),
            });
            report.published = a && b;
        }
        Ok(report)
    }

    /// SIGKILL of every process of a BE pod through its pidfd, each found again in
    /// the same pod's cgroup after its pidfd was opened.
    fn kill_pod(&mut self, pod: &DiscoveredPod, reason: &str) {
        for pid in pod.all_pids() {
            let Ok(p) = ProvenProcess::open(&self.procfs, pid, None) else {
                continue; // exited since the walk
            };
            let same_pod = memory_cgroup_path(&self.procfs, &pid.to_string())
                .ok()
                .and_then(|path| parse_path(&path.to_string_lossy()))
                .is_some_and(|k| k.pod().uid == pod.pod.uid);
            if !same_pod {
                continue;
            }
            if let Err(e) = self.actuator.kill(&p, reason) {
                if !e.is_not_found() {
                    tracing::warn!(pid, error = %e, "kill failed");
                }
            }
        }
    }
}
