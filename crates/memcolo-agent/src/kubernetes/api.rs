//! The API server's side: the pod metadata the agent reads, the requests it sends, and
//! the [`KubeApi`] trait they go through, served off the main loop by [`ApiWorker`].
//!
//! Objects are read from and written as the API server's JSON (`core/v1` Pod, PodList
//! and watch events, `policy/v1` Eviction, `core/v1` Event, a JSON merge patch of a
//! Node; Kubernetes API reference, "Workload Resources" and "Cluster Resources").
//! Everything read is hostile: unknown fields are ignored, missing ones default, and
//! a pod whose UID, name or namespace do not check is dropped.
//!
//! [`ApiWorker`] runs a [`KubeApi`] on a blocking tokio task fed by a bounded
//! channel: the main loop only ever `try_send`s a request (a full queue drops it and
//! counts it) and `try_recv`s outcomes, so a slow or absent API server never blocks
//! it.

use memcolo_policy::kubernetes::QosClass;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use tokio::sync::mpsc;

/// A pod's metadata as the agent keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMeta {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `spec.nodeName`, empty while unscheduled.
    pub node_name: String,
    /// `status.qosClass`, once the API server has set it.
    pub qos: Option<QosClass>,
    /// `spec.priority`; 0 (the default priority) when absent.
    pub priority: i32,
    /// The controlling owner (`metadata.ownerReferences[]` with `controller: true`):
    /// `(kind, name)`.
    pub owner: Option<(String, String)>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawPod {
    #[serde(default)]
    metadata: RawMeta,
    #[serde(default)]
    spec: RawSpec,
    #[serde(default)]
    status: RawStatus,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMeta {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    owner_references: Option<Vec<RawOwner>>,
}

#[derive(Deserialize)]
struct RawOwner {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    controller: Option<bool>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    priority: Option<i32>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawStatus {
    #[serde(default)]
    qos_class: Option<String>,
}

/// Errors of reading the API server's objects.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("not JSON of the expected shape: {0}")]
    Json(String),
    #[error("pod {0}: {1}")]
    Invalid(String, String),
    #[error("watch event of type `{0}`")]
    EventType(String),
}

/// Whether `s` is an RFC 1123 DNS label/subdomain as object names and namespaces are
/// (lowercase alphanumerics, `-`, `.`; at most 253 characters).
fn is_name(s: &str) -> bool {
    crate::config::is_dns_subdomain(s)
}

fn is_uid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
        })
}

impl PodMeta {
    fn from_raw(raw: RawPod) -> Result<PodMeta, ParseError> {
        let m = raw.metadata;
        if !is_uid(&m.uid) {
            return Err(ParseError::Invalid(
                m.name.chars().take(64).collect(),
                "metadata.uid is not a UUID".into(),
            ));
        }
        if !is_name(&m.name) || !is_name(&m.namespace) {
            return Err(ParseError::Invalid(
                m.uid,
                "metadata.name or metadata.namespace is not a DNS subdomain".into(),
            ));
        }
        let owner = m
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .find(|o| o.controller == Some(true))
            .map(|o| (o.kind, o.name));
        Ok(PodMeta {
            uid: m.uid,
            name: m.name,
            namespace: m.namespace,
            node_name: raw.spec.node_name.unwrap_or_default(),
            qos: raw.status.qos_class.as_deref().and_then(QosClass::from_api),
            priority: raw.spec.priority.unwrap_or(0),
            owner,
            annotations: m.annotations.unwrap_or_default(),
        })
    }

    /// One `core/v1` Pod object.
    pub fn from_json(v: &[u8]) -> Result<PodMeta, ParseError> {
        let raw: RawPod = serde_json::from_slice(v).map_err(|e| ParseError::Json(e.to_string()))?;
        PodMeta::from_raw(raw)
    }
}

/// The pods of a `core/v1` PodList (the first answer of a list-then-watch); pods
/// that do not check are returned as errors beside the good ones.
pub fn pods_from_list(v: &[u8]) -> Result<(Vec<PodMeta>, Vec<ParseError>), ParseError> {
    #[derive(Deserialize)]
    struct List {
        #[serde(default)]
        items: Vec<Value>,
    }
    let list: List = serde_json::from_slice(v).map_err(|e| ParseError::Json(e.to_string()))?;
    let mut pods = Vec::new();
    let mut bad = Vec::new();
    for item in list.items {
        match serde_json::from_value::<RawPod>(item) {
            Ok(raw) => match PodMeta::from_raw(raw) {
                Ok(p) => pods.push(p),
                Err(e) => bad.push(e),
            },
            Err(e) => bad.push(ParseError::Json(e.to_string())),
        }
    }
    Ok((pods, bad))
}

/// One line of a pod watch (`?watch=1`, a `meta/v1` WatchEvent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// `ADDED` or `MODIFIED`.
    Upsert(PodMeta),
    /// `DELETED`.
    Deleted(PodMeta),
    /// `BOOKMARK`: a resourceVersion only.
    Bookmark,
}

/// Parses one watch line. An `ERROR` event (e.g. 410 Gone: the watch must be
/// restarted with a new list) is an error.
pub fn parse_watch_event(line: &[u8]) -> Result<WatchEvent, ParseError> {
    #[derive(Deserialize)]
    struct Ev {
        #[serde(rename = "type")]
        kind: String,
        object: Value,
    }
    let ev: Ev = serde_json::from_slice(line).map_err(|e| ParseError::Json(e.to_string()))?;
    let pod = || -> Result<PodMeta, ParseError> {
        let raw: RawPod = serde_json::from_value(ev.object.clone())
            .map_err(|e| ParseError::Json(e.to_string()))?;
        PodMeta::from_raw(raw)
    };
    match ev.kind.as_str() {
        "ADDED" | "MODIFIED" => Ok(WatchEvent::Upsert(pod()?)),
        "DELETED" => Ok(WatchEvent::Deleted(pod()?)),
        "BOOKMARK" => Ok(WatchEvent::Bookmark),
        other => Err(ParseError::EventType(other.chars().take(32).collect())),
    }
}

/// The pods of this node by UID, kept from a list and the watch that follows it. Pods
/// of other nodes are refused (the watch's field selector should already keep them
/// out).
#[derive(Clone, Debug, Default)]
pub struct PodCache {
    node: String,
    pods: BTreeMap<String, PodMeta>,
}

impl PodCache {
    pub fn new(node: &str) -> PodCache {
        PodCache {
            node: node.to_string(),
            pods: BTreeMap::new(),
        }
    }

    /// Replaces the cache with a list's pods.
    pub fn replace(&mut self, pods: Vec<PodMeta>) {
        self.pods.clear();
        for p in pods {
            self.upsert(p);
        }
    }

    fn upsert(&mut self, p: PodMeta) {
        if p.node_name == self.node {
            self.pods.insert(p.uid.clone(), p);
        }
    }

    /// Applies one watch event.
    pub fn apply(&mut self, ev: WatchEvent) {
        match ev {
            WatchEvent::Upsert(p) => self.upsert(p),
            WatchEvent::Deleted(p) => {
                self.pods.remove(&p.uid);
            }
            WatchEvent::Bookmark => {}
        }
    }

    pub fn get(&self, uid: &str) -> Option<&PodMeta> {
        self.pods.get(uid)
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// The body of `POST /api/v1/namespaces/{ns}/pods/{name}/eviction` (`policy/v1`
/// Eviction). The API server refuses it with 429 while a PodDisruptionBudget forbids
/// the disruption.
pub fn eviction_body(pod: &PodMeta, grace_period_s: Option<u64>) -> Value {
    let mut body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
    });
    if let Some(g) = grace_period_s {
        body["deleteOptions"] = json!({"gracePeriodSeconds": g});
    }
    body
}

/// The body of `POST /api/v1/namespaces/{ns}/events` (`core/v1` Event) on `pod`:
/// a Warning with reason `MemcoloEviction` and `message`, reported by `memcolo` on
/// `node`. `now_rfc3339` is the event's time.
pub fn event_body(pod: &PodMeta, node: &str, message: &str, now_rfc3339: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "generateName": format!("{}.", pod.name),
            "namespace": pod.namespace,
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
        },
        "type": "Warning",
        "reason": "MemcoloEviction",
        "message": message.chars().take(1024).collect::<String>(),
        "source": {"component": "memcolo", "host": node},
        "reportingComponent": "memcolo.io/agent",
        "reportingInstance": node,
        "firstTimestamp": now_rfc3339,
        "lastTimestamp": now_rfc3339,
        "count": 1,
    })
}

/// The node's memory signals, published on its Node object.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NodeSignals {
    /// M3's zone: `green`, `yellow`, `red`, `above_top`.
    pub zone: String,
    pub low_bytes: u64,
    pub high_bytes: u64,
    pub top_bytes: u64,
    pub used_bytes: u64,
    /// Memory BE pods hold that memcolo can take back (by reclaim or eviction), bytes.
    pub reclaimable_be_bytes: u64,
}

/// The annotation that carries [`NodeSignals`] as JSON.
pub const NODE_ANNOTATION: &str = "memcolo.io/memory";
/// The extended resource of BE memory the node can overcommit (Koordinator's name).
pub const BATCH_MEMORY: &str = "kubernetes.io/batch-memory";

/// The JSON merge patch of the Node (`PATCH /api/v1/nodes/{name}`,
/// `application/merge-patch+json`) that sets the [`NODE_ANNOTATION`].
pub fn node_annotation_patch(s: &NodeSignals) -> Value {
    json!({"metadata": {"annotations": {NODE_ANNOTATION: serde_json::to_string(s).unwrap_or_default()}}})
}

/// The JSON merge patch of the Node's status (`PATCH /api/v1/nodes/{name}/status`)
/// that sets the [`BATCH_MEMORY`] extended resource: the memory below top that LC
/// and elastic pods do not use, which BE pods may be scheduled onto.
pub fn batch_memory_patch(batch_bytes: u64) -> Value {
    json!({"status": {"capacity": {BATCH_MEMORY: batch_bytes.to_string()},
                      "allocatable": {BATCH_MEMORY: batch_bytes.to_string()}}})
}

/// Why an API call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No answer: connection refused, timed out, TLS or DNS failure.
    #[error("API server unreachable: {0}")]
    Unreachable(String),
    /// An answer with an error status (429: a PodDisruptionBudget forbids the
    /// eviction now; 404: the pod is gone; 403: RBAC).
    #[error("API server answered {code}: {message}")]
    Status { code: u16, message: String },
}

/// The calls the agent makes to the API server. Implementations may block (the
/// [`ApiWorker`] runs them off the main loop).
pub trait KubeApi: Send + 'static {
    /// `POST .../pods/{name}/eviction` with [`eviction_body`].
    fn evict(&mut self, pod: &PodMeta, body: &Value) -> Result<(), ApiError>;
    /// `POST .../namespaces/{ns}/events` with [`event_body`].
    fn create_event(&mut self, namespace: &str, body: &Value) -> Result<(), ApiError>;
    /// `PATCH /api/v1/nodes/{name}` (`status`: `.../status`) with a merge patch.
    fn patch_node(&mut self, node: &str, status: bool, patch: &Value) -> Result<(), ApiError>;
}

/// A request to the [`ApiWorker`].
#[derive(Clone, Debug, PartialEq)]
pub enum ApiRequest {
    /// Evict `pod`; on success post `event`.
    Evict {
        pod: PodMeta,
        body: Value,
        event: Value,
    },
    PatchNode {
        node: String,
        status: bool,
        patch: Value,
    },
}

/// What became of an [`ApiRequest`].
#[derive(Clone, Debug, PartialEq)]
pub enum ApiOutcome {
    Evicted { uid: String },
    EvictFailed { uid: String, error: ApiError },
    NodePatched,
    NodePatchFailed { error: ApiError },
}

/// The main loop's end of a [`KubeApi`] running on a blocking tokio task.
pub struct ApiWorker {
    tx: mpsc::Sender<ApiRequest>,
    rx: mpsc::Receiver<ApiOutcome>,
    /// Requests dropped because the queue was full.
    pub dropped: u64,
}

/// Requests queued at most: the agent sends a handful per poll.
pub const API_QUEUE: usize = 64;

impl ApiWorker {
    /// Starts `api` on a blocking task of the current tokio runtime.
    pub fn spawn(mut api: impl KubeApi) -> ApiWorker {
        let (tx, mut req_rx) = mpsc::channel::<ApiRequest>(API_QUEUE);
        let (out_tx, rx) = mpsc::channel::<ApiOutcome>(API_QUEUE);
        tokio::task::spawn_blocking(move || {
            while let Some(req) = req_rx.blocking_recv() {
                let out = match req {
                    ApiRequest::Evict { pod, body, event } => match api.evict(&pod, &body) {
                        Ok(()) => {
                            if let Err(e) = api.create_event(&pod.namespace, &event) {
                                tracing::warn!(pod = %pod.name, error = %e, "cannot post the eviction's Event");
                            }
                            ApiOutcome::Evicted { uid: pod.uid }
                        }
                        Err(error) => ApiOutcome::EvictFailed {
                            uid: pod.uid,
                            error,
                        },
                    },
                    ApiRequest::PatchNode {
                        node,
                        status,
                        patch,
                    } => match api.patch_node(&node, status, &patch) {
                        Ok(()) => ApiOutcome::NodePatched,
                        Err(error) => ApiOutcome::NodePatchFailed { error },
                    },
                };
                if out_tx.blocking_send(out).is_err() {
                    return;
                }
            }
        });
        ApiWorker { tx, rx, dropped: 0 }
    }

    /// Queues `req` without waiting; false (and counted) when the queue is full or
    /// the worker is gone.
    pub fn send(&mut self, req: ApiRequest) -> bool {
        match self.tx.try_send(req) {
            Ok(()) => true,
            Err(_) => {
                self.dropped += 1;
                false
            }
        }
    }

    /// The outcomes ready now.
    pub fn outcomes(&mut self) -> Vec<ApiOutcome> {
        let mut out = Vec::new();
        while let Ok(o) = self.rx.try_recv() {
            out.push(o);
        }
        out
    }
}

/// A [`KubeApi`] that records every call and answers as told: for unit and end-to-end
/// tests only (the agent never builds one outside tests).
#[derive(Clone, Default)]
pub struct FakeApi {
    pub calls: std::sync::Arc<std::sync::Mutex<Vec<FakeCall>>>,
    /// Every call fails with this when set.
    pub fail_with: std::sync::Arc<std::sync::Mutex<Option<ApiError>>>,
    /// Evictions of these pods (by name) are refused with 429, as a
    /// PodDisruptionBudget makes the API server refuse them.
    pub budget_blocks: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// One call a [`FakeApi`] received.
#[derive(Clone, Debug, PartialEq)]
pub enum FakeCall {
    Evict {
        namespace: String,
        name: String,
        body: Value,
    },
    Event {
        namespace: String,
        body: Value,
    },
    PatchNode {
        node: String,
        status: bool,
        patch: Value,
    },
}

impl FakeApi {
    fn answer(&self, call: FakeCall) -> Result<(), ApiError> {
        self.calls.lock().unwrap().push(call);
        match self.fail_with.lock().unwrap().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl KubeApi for FakeApi {
    fn evict(&mut self, pod: &PodMeta, body: &Value) -> Result<(), ApiError> {
        self.answer(FakeCall::Evict {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            body: body.clone(),
        })?;
        if self.budget_blocks.lock().unwrap().contains(&pod.name) {
            return Err(ApiError::Status {
                code: 429,
                message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            });
        }
        Ok(())
    }
    fn create_event(&mut self, namespace: &str, body: &Value) -> Result<(), ApiError> {
        self.answer(FakeCall::Event {
            namespace: namespace.into(),
            body: body.clone(),
        })
    }
    fn patch_node(&mut self, node: &str, status: bool, patch: &Value) -> Result<(), ApiError> {
        self.answer(FakeCall::PatchNode {
            node: node.into(),
            status,
            patch: patch.clone(),
        })
    }
}

/// A [`KubeApi`] with no API server behind it: every call is
/// [`ApiError::Unreachable`]. What the agent runs with until a client is configured,
/// so that only the SIGKILL fallback (above top) acts.
pub struct NoApi;

impl KubeApi for NoApi {
    fn evict(&mut self, _: &PodMeta, _: &Value) -> Result<(), ApiError> {
        Err(ApiError::Unreachable("no API client configured".into()))
    }
    fn create_event(&mut self, _: &str, _: &Value) -> Result<(), ApiError> {
        Err(ApiError::Unreachable("no API client configured".into()))
    }
    fn patch_node(&mut self, _: &str, _: bool, _: &Value) -> Result<(), ApiError> {
        Err(ApiError::Unreachable("no API client configured".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            include_bytes!(concat!("../../tests/fixtures/kubernetes/", $name)).as_slice()
        };
    }

    #[test]
    fn reads_pods_as_the_api_server_writes_them() {
        let be = PodMeta::from_json(fixture!("pod-besteffort.json")).unwrap();
        assert_eq!(be.uid, "33333333-4444-4555-8666-777777777777");
        assert_eq!(
            (be.namespace.as_str(), be.name.as_str()),
            ("batch", "etl-nightly-28871230-x7k2p")
        );
        assert_eq!(be.node_name, "worker-1");
        assert_eq!(be.qos, Some(QosClass::BestEffort));
        assert_eq!(be.priority, -10);
        assert_eq!(
            be.owner,
            Some(("Job".into(), "etl-nightly-28871230".into()))
        );
        assert_eq!(be.annotations["memcolo.io/class"], "be");
        let g = PodMeta::from_json(fixture!("pod-guaranteed.json")).unwrap();
        assert_eq!((g.qos, g.priority), (Some(QosClass::Guaranteed), 1000));
        assert_eq!(g.owner, Some(("StatefulSet".into(), "cache".into())));
    }

    #[test]
    fn list_drops_pods_that_do_not_check() {
        let (pods, bad) = pods_from_list(fixture!("podlist.json")).unwrap();
        let qos: Vec<_> = pods.iter().map(|p| (p.name.as_str(), p.qos)).collect();
        assert_eq!(
            qos,
            [
                ("cache-0", Some(QosClass::Guaranteed)),
                ("api-7c9d5b6f4-qz8wn", Some(QosClass::Burstable)),
                ("etl-nightly-28871230-x7k2p", Some(QosClass::BestEffort)),
            ]
        );
        assert_eq!(bad.len(), 1, "{bad:?}");
        let mut cache = PodCache::new("worker-1");
        cache.replace(pods.clone());
        assert_eq!(cache.len(), 3);
        // Another node's pods are refused.
        let mut other = PodCache::new("worker-2");
        other.replace(pods);
        assert!(other.is_empty());
        assert!(pods_from_list(b"[1,2]").is_err());
    }

    #[test]
    fn watch_events_update_the_cache() {
        let lines: Vec<&[u8]> = fixture!("watch.jsonl")
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        let mut cache = PodCache::new("worker-1");
        let uid = "33333333-4444-4555-8666-777777777777";
        cache.apply(parse_watch_event(lines[0]).unwrap());
        assert_eq!(
            cache.get(uid).unwrap().annotations["memcolo.io/class"],
            "be"
        );
        cache.apply(parse_watch_event(lines[1]).unwrap());
        assert_eq!(
            cache.get(uid).unwrap().annotations["memcolo.io/class"],
            "elastic"
        );
        assert_eq!(parse_watch_event(lines[2]).unwrap(), WatchEvent::Bookmark);
        cache.apply(parse_watch_event(lines[3]).unwrap());
        assert!(cache.get(uid).is_none());
        assert_eq!(
            parse_watch_event(lines[4]),
            Err(ParseError::EventType("ERROR".into()))
        );
        assert!(parse_watch_event(b"{\"type\":\"ADDED\"}").is_err());
    }

    #[test]
    fn request_bodies() {
        let be = PodMeta::from_json(fixture!("pod-besteffort.json")).unwrap();
        let e = eviction_body(&be, Some(30));
        assert_eq!(e["apiVersion"], "policy/v1");
        assert_eq!(e["kind"], "Eviction");
        assert_eq!(e["metadata"]["name"], "etl-nightly-28871230-x7k2p");
        assert_eq!(e["metadata"]["namespace"], "batch");
        assert_eq!(e["deleteOptions"]["gracePeriodSeconds"], 30);
        assert!(eviction_body(&be, None).get("deleteOptions").is_none());
        let ev = event_body(&be, "worker-1", "why", "2026-11-28T11:00:00Z");
        assert_eq!(ev["involvedObject"]["uid"], be.uid);
        assert_eq!(ev["involvedObject"]["kind"], "Pod");
        assert_eq!(ev["reason"], "MemcoloEviction");
        assert_eq!(ev["type"], "Warning");
        let s = NodeSignals {
            zone: "red".into(),
            low_bytes: 1,
            high_bytes: 2,
            top_bytes: 3,
            used_bytes: 4,
            reclaimable_be_bytes: 5,
        };
        let p = node_annotation_patch(&s);
        let v: Value = serde_json::from_str(
            p["metadata"]["annotations"][NODE_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(v["zone"], "red");
        assert_eq!(v["reclaimable_be_bytes"], 5);
        assert_eq!(
            batch_memory_patch(7)["status"]["allocatable"][BATCH_MEMORY],
            "7"
        );
    }

    #[tokio::test]
    async fn worker_never_blocks_the_caller() {
        let fake = FakeApi::default();
        let mut w = ApiWorker::spawn(fake.clone());
        let be = PodMeta::from_json(fixture!("pod-besteffort.json")).unwrap();
        assert!(w.send(ApiRequest::Evict {
            pod: be.clone(),
            body: eviction_body(&be, None),
            event: json!({}),
        }));
        let mut got = Vec::new();
        for _ in 0..500 {
            got.extend(w.outcomes());
            if !got.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            got,
            [ApiOutcome::Evicted {
                uid: be.uid.clone()
            }]
        );
        let calls = fake.calls.lock().unwrap().clone();
        assert!(matches!(&calls[0], FakeCall::Evict { name, .. } if name == &be.name));
        assert!(matches!(&calls[1], FakeCall::Event { namespace, .. } if namespace == "batch"));
    }
}
