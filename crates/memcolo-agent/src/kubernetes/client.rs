//! The API server client of Kubernetes mode, on kube-rs (feature `kube-client`).
//!
//! - [`KubeRsApi`]: [`KubeApi`] over a [`kube::Client`] (in-cluster service account,
//!   else `$KUBECONFIG`/`~/.kube/config`): the request bodies are
//!   [`super::api`]'s, sent as raw requests so they have one definition. Runs on the
//!   [`super::ApiWorker`]'s blocking task; each call waits on the runtime it was
//!   built on. A call that gets no answer is [`ApiError::Unreachable`]; an answer
//!   with an error status is [`ApiError::Status`].
//! - [`spawn_pod_watch`]: kube's [`watcher`] on pods with
//!   `spec.nodeName=<node>` (list, then watch; relists after a 410 and backs off on
//!   errors), whose pods reach the main loop as the latest whole snapshot through a
//!   `tokio::sync::watch` channel ([`PodSnapshot`]).

use super::api::{ApiError, KubeApi, PodMeta};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use serde_json::Value;
use std::collections::BTreeMap;
use tokio::runtime::Handle;
use tokio::sync::watch;

/// How long one API call may take before it counts as unanswered.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// [`KubeApi`] on a kube-rs client.
pub struct KubeRsApi {
    client: Client,
    rt: Handle,
}

impl KubeRsApi {
    /// A client from the environment (in-cluster config, else kubeconfig), on the
    /// current tokio runtime. Errors: no configuration found.
    pub async fn from_env() -> Result<KubeRsApi, kube::Error> {
        let cfg = kube::Config::infer()
            .await
            .map_err(kube::Error::InferConfig)?;
        Ok(KubeRsApi::new(client(cfg)?))
    }

    /// A client built by the caller (tests point one at a local server), on the
    /// current tokio runtime.
    pub fn new(client: Client) -> KubeRsApi {
        KubeRsApi {
            client,
            rt: Handle::current(),
        }
    }

    /// The client, for the pod watch.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    fn call(&self, req: http::Request<Vec<u8>>) -> Result<(), ApiError> {
        let client = self.client.clone();
        self.rt.block_on(async move {
            match tokio::time::timeout(CALL_TIMEOUT, client.request_text(req)).await {
                Err(_) => Err(ApiError::Unreachable(format!(
                    "no answer in {} s",
                    CALL_TIMEOUT.as_secs()
                ))),
                Ok(Ok(_)) => Ok(()),
                Ok(Err(kube::Error::Api(s))) => Err(ApiError::Status {
                    code: s.code,
                    message: s.message.chars().take(256).collect(),
                }),
                Ok(Err(e)) => Err(ApiError::Unreachable(e.to_string())),
            }
        })
    }
}

/// A client on `cfg` without kube's retries of 429 and 503 answers: an eviction that
/// a PodDisruptionBudget refuses (429) is asked again at a later poll by the agent,
/// not held in the client, and a call's answer comes within [`CALL_TIMEOUT`].
pub fn client(mut cfg: kube::Config) -> Result<Client, kube::Error> {
    cfg.default_retry = false;
    Client::try_from(cfg)
}

fn request(
    method: &str,
    path: &str,
    content_type: &str,
    body: &Value,
) -> Result<http::Request<Vec<u8>>, ApiError> {
    http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(serde_json::to_vec(body).unwrap_or_default())
        .map_err(|e| ApiError::Status {
            code: 0,
            message: format!("cannot build request: {e}"),
        })
}

impl KubeApi for KubeRsApi {
    fn evict(&mut self, pod: &PodMeta, body: &Value) -> Result<(), ApiError> {
        // Names were checked as DNS subdomains when read: nothing to escape.
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            pod.namespace, pod.name
        );
        self.call(request("POST", &path, "application/json", body)?)
    }

    fn create_event(&mut self, namespace: &str, body: &Value) -> Result<(), ApiError> {
        let path = format!("/api/v1/namespaces/{namespace}/events");
        self.call(request("POST", &path, "application/json", body)?)
    }

    fn patch_node(&mut self, node: &str, status: bool, patch: &Value) -> Result<(), ApiError> {
        let path = format!(
            "/api/v1/nodes/{node}{}",
            if status { "/status" } else { "" }
        );
        self.call(request(
            "PATCH",
            &path,
            "application/merge-patch+json",
            patch,
        )?)
    }
}

/// The pods of `node` the watch knows now, by UID.
pub type PodSnapshot = std::sync::Arc<Vec<PodMeta>>;

fn meta(pod: &Pod) -> Option<PodMeta> {
    let json = serde_json::to_vec(pod).ok()?;
    match PodMeta::from_json(&json) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(error = %e, "ignoring a pod from the API server");
            None
        }
    }
}

/// Starts the watch of `node`'s pods on the current runtime. The main loop reads the
/// latest snapshot from the receiver when it has changed: the watch never waits on
/// the loop, and the loop never falls behind (it skips to the newest snapshot).
pub fn spawn_pod_watch(client: Client, node: &str) -> watch::Receiver<PodSnapshot> {
    let (tx, rx) = watch::channel(PodSnapshot::default());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let pods: Api<Pod> = Api::all(client);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(pods, cfg).default_backoff());
        let mut known: BTreeMap<String, PodMeta> = BTreeMap::new();
        let mut init: BTreeMap<String, PodMeta> = BTreeMap::new();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Init) => {
                    init.clear();
                    continue;
                }
                Ok(Event::InitApply(p)) => {
                    if let Some(m) = meta(&p) {
                        init.insert(m.uid.clone(), m);
                    }
                    continue;
                }
                Ok(Event::InitDone) => known = std::mem::take(&mut init),
                Ok(Event::Apply(p)) => match meta(&p) {
                    Some(m) => {
                        known.insert(m.uid.clone(), m);
                    }
                    None => continue,
                },
                Ok(Event::Delete(p)) => match meta(&p) {
                    Some(m) => {
                        known.remove(&m.uid);
                    }
                    None => continue,
                },
                Err(e) => {
                    tracing::warn!(error = %e, "pod watch error; retrying with backoff");
                    continue;
                }
            }
            if tx
                .send(PodSnapshot::new(known.values().cloned().collect()))
                .is_err()
            {
                return;
            }
        }
    });
    rx
}
