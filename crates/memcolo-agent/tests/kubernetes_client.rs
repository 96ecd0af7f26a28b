//! The kube-rs client of Kubernetes mode ([`memcolo_agent::kubernetes::client`])
//! against a stand-in for the API server on 127.0.0.1 that answers with objects
//! shaped like kube-apiserver's (tests/fixtures/kubernetes): the pod list and watch
//! with the node's field selector, an eviction accepted (201) and one refused by a
//! PodDisruptionBudget (429), the Event, the Node patches; and an API server that is
//! not there, which is "unreachable"; and the objects a real kube-apiserver wrote
//! (tests/fixtures/kubernetes/recorded, from tests/kubernetes_apiserver.rs) read as
//! the agent reads them. The client against the real API server itself is
//! tests/kubernetes_apiserver.rs.

#![cfg(feature = "kube-client")]

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, patch, post};
use axum::Router;
use memcolo_agent::kubernetes::api::{
    eviction_body, parse_watch_event, pods_from_list, ApiError, KubeApi, PodCache, PodMeta,
    WatchEvent,
};
use memcolo_agent::kubernetes::client::{spawn_pod_watch, KubeRsApi};
use memcolo_policy::kubernetes::QosClass;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kubernetes")
            .join(name),
    )
    .unwrap()
}

/// What the stand-in received: method, path, query, content type, body.
type Log = Arc<Mutex<Vec<(String, String, String, String, Value)>>>;

fn record(
    log: &Log,
    method: &str,
    path: String,
    query: Option<String>,
    h: &HeaderMap,
    body: &Bytes,
) {
    let ct = h
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let v = serde_json::from_slice(body).unwrap_or(Value::Null);
    log.lock()
        .unwrap()
        .push((method.into(), path, query.unwrap_or_default(), ct, v));
}

fn status(code: u16, reason: &str, message: &str) -> (StatusCode, String) {
    (
        StatusCode::from_u16(code).unwrap(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
               "status": if code < 300 { "Success" } else { "Failure" },
               "message": message, "reason": reason, "code": code})
        .to_string(),
    )
}

async fn evict(
    State(log): State<Log>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    h: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    record(
        &log,
        "POST",
        format!("/api/v1/namespaces/{ns}/pods/{name}/eviction"),
        None,
        &h,
        &body,
    );
    if name == "guarded" {
        status(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        )
    } else {
        status(201, "", "")
    }
}

async fn event(
    State(log): State<Log>,
    UrlPath(ns): UrlPath<String>,
    h: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    record(
        &log,
        "POST",
        format!("/api/v1/namespaces/{ns}/events"),
        None,
        &h,
        &body,
    );
    (
        StatusCode::CREATED,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

async fn node(
    State(log): State<Log>,
    UrlPath(n): UrlPath<String>,
    h: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    record(&log, "PATCH", format!("/api/v1/nodes/{n}"), None, &h, &body);
    (
        StatusCode::OK,
        json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": n}}).to_string(),
    )
}

async fn node_status(
    State(log): State<Log>,
    UrlPath(n): UrlPath<String>,
    h: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    record(
        &log,
        "PATCH",
        format!("/api/v1/nodes/{n}/status"),
        None,
        &h,
        &body,
    );
    (
        StatusCode::OK,
        json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": n}}).to_string(),
    )
}

/// The pod list, or, with `watch=true`, the ADDED and MODIFIED lines of the watch
/// fixture on a stream that then stays open.
async fn pods(State(log): State<Log>, RawQuery(q): RawQuery, h: HeaderMap) -> (StatusCode, Body) {
    record(
        &log,
        "GET",
        "/api/v1/pods".into(),
        q.clone(),
        &h,
        &Bytes::new(),
    );
    if q.as_deref().unwrap_or("").contains("watch=true") {
        let text = String::from_utf8(fixture("watch.jsonl")).unwrap();
        let lines: Vec<Result<Bytes, std::io::Error>> = text
            .lines()
            .take(2)
            .map(|l| Ok(Bytes::from(format!("{l}\n"))))
            .collect();
        let stream = futures::stream::iter(lines).chain(futures::stream::pending());
        (StatusCode::OK, Body::from_stream(stream))
    } else {
        (StatusCode::OK, Body::from(fixture("podlist.json")))
    }
}

use futures::StreamExt as _;

async fn stand_in() -> (String, Log) {
    let log: Log = Arc::default();
    let app = Router::new()
        .route("/api/v1/namespaces/:ns/pods/:name/eviction", post(evict))
        .route("/api/v1/namespaces/:ns/events", post(event))
        .route("/api/v1/nodes/:name", patch(node))
        .route("/api/v1/nodes/:name/status", patch(node_status))
        .route("/api/v1/pods", get(pods))
        .with_state(log.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), log)
}

fn client(url: &str) -> kube::Client {
    let mut cfg = kube::Config::new(url.parse().unwrap());
    cfg.default_namespace = "default".into();
    memcolo_agent::kubernetes::client::client(cfg).unwrap()
}

fn be_pod() -> PodMeta {
    PodMeta::from_json(&fixture("pod-besteffort.json")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reach_the_api_server_as_it_expects_them() {
    let (url, log) = stand_in().await;
    let c = client(&url);
    let res = tokio::task::spawn_blocking(move || {
        let mut api = KubeRsApi::new(c);
        let pod = be_pod();
        let ok = api.evict(&pod, &eviction_body(&pod, Some(30)));
        let mut guarded = pod.clone();
        guarded.name = "guarded".into();
        let refused = api.evict(&guarded, &eviction_body(&guarded, None));
        let ev = api.create_event(
            "batch",
            &json!({"kind": "Event", "reason": "MemcoloEviction"}),
        );
        let an = api.patch_node(
            "worker-1",
            false,
            &json!({"metadata": {"annotations": {"memcolo.io/memory": "{}"}}}),
        );
        let st = api.patch_node(
            "worker-1",
            true,
            &json!({"status": {"capacity": {"kubernetes.io/batch-memory": "1"}}}),
        );
        (ok, refused, ev, an, st)
    })
    .await
    .unwrap();
    assert_eq!(res.0, Ok(()));
    match res.1 {
        Err(ApiError::Status { code: 429, message }) => {
            assert!(message.contains("disruption budget"), "{message}")
        }
        other => panic!("a PDB refusal must be a 429 status: {other:?}"),
    }
    assert_eq!((res.2, res.3, res.4), (Ok(()), Ok(()), Ok(())));
    let log = log.lock().unwrap();
    let paths: Vec<(&str, &str, &str)> = log
        .iter()
        .map(|(m, p, _, ct, _)| (m.as_str(), p.as_str(), ct.as_str()))
        .collect();
    assert_eq!(
        paths,
        [
            (
                "POST",
                "/api/v1/namespaces/batch/pods/etl-nightly-28871230-x7k2p/eviction",
                "application/json"
            ),
            (
                "POST",
                "/api/v1/namespaces/batch/pods/guarded/eviction",
                "application/json"
            ),
            (
                "POST",
                "/api/v1/namespaces/batch/events",
                "application/json"
            ),
            (
                "PATCH",
                "/api/v1/nodes/worker-1",
                "application/merge-patch+json"
            ),
            (
                "PATCH",
                "/api/v1/nodes/worker-1/status",
                "application/merge-patch+json"
            ),
        ]
    );
    assert_eq!(log[0].4["kind"], "Eviction");
    assert_eq!(log[0].4["deleteOptions"]["gracePeriodSeconds"], 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_api_server_is_unreachable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let c = client(&format!("http://127.0.0.1:{port}"));
    let r = tokio::task::spawn_blocking(move || {
        let pod = be_pod();
        KubeRsApi::new(c).evict(&pod, &eviction_body(&pod, None))
    })
    .await
    .unwrap();
    assert!(matches!(r, Err(ApiError::Unreachable(_))), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_watch_lists_then_follows_this_nodes_pods() {
    let (url, log) = stand_in().await;
    let mut feed = spawn_pod_watch(client(&url), "worker-1");
    let be_uid = "33333333-4444-4555-8666-777777777777";
    // The list (three good pods, one dropped), then the watch's MODIFIED: the BE pod
    // now annotated elastic.
    let got = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            feed.changed().await.unwrap();
            let snap = feed.borrow_and_update().clone();
            let class = snap
                .iter()
                .find(|p| p.uid == be_uid)
                .map(|p| p.annotations.get("memcolo.io/class").cloned());
            if snap.len() == 3 && class == Some(Some("elastic".into())) {
                return snap;
            }
        }
    })
    .await
    .expect("the watch's snapshot");
    let mut names: Vec<&str> = got.iter().map(|p| p.name.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "api-7c9d5b6f4-qz8wn",
            "cache-0",
            "etl-nightly-28871230-x7k2p"
        ]
    );
    let log = log.lock().unwrap();
    let gets: Vec<&str> = log
        .iter()
        .filter(|r| r.0 == "GET")
        .map(|r| r.2.as_str())
        .collect();
    assert!(gets.len() >= 2, "{gets:?}");
    for q in &gets {
        assert!(q.contains("fieldSelector=spec.nodeName%3Dworker-1"), "{q}");
    }
    assert!(gets.iter().any(|q| q.contains("watch=true")), "{gets:?}");
}

/// The list and watch lines kube-apiserver v1.37 wrote for worker-1's pods: an LC
/// pod, two BE pods; one BE pod annotated, evicted (terminating, then deleted), the
/// other set Running.
#[test]
fn recorded_list_and_watch_of_a_real_api_server() {
    let (pods, bad) = pods_from_list(&fixture("recorded/podlist.json")).unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    let mut cache = PodCache::new("worker-1");
    cache.replace(pods.clone());
    let find = |name: &str| pods.iter().find(|p| p.name == name).unwrap().clone();
    let (lc, low, high) = (find("cache-0"), find("etl-low"), find("etl-high"));
    assert_eq!((lc.qos, lc.priority), (Some(QosClass::Guaranteed), 1000));
    assert_eq!((low.qos, low.priority), (Some(QosClass::BestEffort), -10));
    assert_eq!((high.qos, high.priority), (Some(QosClass::BestEffort), 5));
    assert_eq!(low.owner, Some(("Job".into(), "etl-nightly".into())));
    assert_eq!(low.annotations["memcolo.io/class"], "be");
    assert_eq!(low.node_name, "worker-1");
    let single = PodMeta::from_json(&fixture("recorded/pod-besteffort.json")).unwrap();
    assert_eq!(single, low);
    assert!(high.annotations.is_empty());
    let text = String::from_utf8(fixture("recorded/watch.jsonl")).unwrap();
    let mut deleted = 0;
    for line in text.lines() {
        let ev = parse_watch_event(line.as_bytes()).unwrap();
        deleted += matches!(ev, WatchEvent::Deleted(_)) as usize;
        cache.apply(ev);
    }
    assert_eq!(deleted, 1);
    assert!(cache.get(&low.uid).is_none());
    assert_eq!(
        cache.get(&high.uid).unwrap().annotations["memcolo.io/class"],
        "be"
    );
    assert_eq!(cache.len(), 2);
}
