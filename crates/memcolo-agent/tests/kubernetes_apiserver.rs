//! Kubernetes mode's API side against a real API server: etcd and kube-apiserver
//! (built by scripts/setup.sh into `$MEMCOLO_TOOLS/bin`) on loopback ports with a
//! temporary data directory, RBAC on, the default admission plugins. memcolo's own
//! client code talks to it: a kube-rs client from a kubeconfig
//! ([`memcolo_agent::kubernetes::client::client`]), the pod watch
//! ([`spawn_pod_watch`]) and the [`ApiWorker`] over [`KubeRsApi`] that Kubernetes mode
//! runs, acting as the Helm chart's service account under the chart's own
//! ClusterRole (rendered with `helm template`).
//!
//! The test creates a Node `worker-1` and three pods bound to it (`spec.nodeName`
//! set): an LC pod (Guaranteed, priority 1000) and two BE pods (BestEffort,
//! priorities -10 and 5). No kubelet runs, so the pods stay Pending unless the test
//! writes their status as a kubelet would. Then: the watch sees the pods with the QoS
//! class, priority, owner and annotations the API server gave them; the eviction of
//! the lowest-priority BE pod is accepted with the grace period asked for and a
//! Warning Event appears on the pod; a PodDisruptionBudget that forbids the other BE
//! pod's eviction gets a 429, which the client reports after exactly one request (the
//! API server's audit log counts them); the `memcolo.io/memory` annotation and the
//! `kubernetes.io/batch-memory` extended resource appear on the Node. The second test
//! runs Kubernetes mode whole ([`KubeNode`]) on a real cgroup v1 tree laid out as the
//! kubelet's, against the same kind of API server: the lowest-priority BE pod is
//! evicted through it, never the LC pod, and a PodDisruptionBudget's refusal is not
//! taken for an absent API server (no SIGKILL).
//!
//! With `MEMCOLO_RECORD_FIXTURES=<dir>`, the objects the API server returned are also
//! written there (tests/fixtures/kubernetes/recorded was made so).

#![cfg(feature = "kube-client")]

use memcolo_agent::kubernetes::api::{
    batch_memory_patch, event_body, eviction_body, node_annotation_patch, ApiError, ApiOutcome,
    ApiRequest, ApiWorker, NodeSignals, PodMeta, BATCH_MEMORY, NODE_ANNOTATION,
};
use memcolo_agent::kubernetes::client::{client, spawn_pod_watch, KubeRsApi, PodSnapshot};
use memcolo_agent::kubernetes::{KubeNode, KubeNodeConfig};
use memcolo_linux::actuate::LinuxActuator;
use memcolo_linux::cgroup::MemoryCgroup;
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::kubernetes::QosClass;
use memcolo_policy::m3::Thresholds;
use memcolo_policy::Class;
use memcolo_testkit::{cannot_run, hog_in, real_cgroup_v1_available, Scratch};
use serde_json::{json, Value};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NODE: &str = "worker-1";
/// The Helm chart's release namespace and service account (deploy/helm/memcolo).
const RELEASE_NS: &str = "memcolo-system";
const AGENT_USER: &str = "system:serviceaccount:memcolo-system:memcolo";
const ADMIN_TOKEN: &str = "memcolo-test-admin";
const AGENT_TOKEN: &str = "memcolo-test-agent";

fn tools() -> PathBuf {
    std::env::var_os("MEMCOLO_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/memcolo-test/tools"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A command for a server that dies with the thread that started it, should this
/// test be killed before its [`Cluster`] is dropped.
fn server(program: PathBuf) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// etcd and kube-apiserver, killed and their directory removed on drop.
struct Cluster {
    children: Vec<Child>,
    dir: tempfile::TempDir,
    url: String,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The API server first, then its store.
        for c in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Cluster {
    fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn not_ready(&self, what: &str) -> String {
        format!(
            "kube-apiserver: {what} in 120 s\n--- kube-apiserver.log\n{}\n--- etcd.log\n{}",
            self.log_tail("kube-apiserver.log"),
            self.log_tail("etcd.log")
        )
    }

    /// Whether etcd and kube-apiserver still run.
    fn running(&mut self) -> bool {
        self.children
            .iter_mut()
            .all(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn start(bin: &Path) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("memcolo-apiserver")
            .tempdir()
            .unwrap();
        let d = dir.path().to_path_buf();
        let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let mut cluster = Cluster {
            children: Vec::new(),
            url: format!("https://127.0.0.1:{api_port}"),
            dir,
        };
        let log = |name: &str| Stdio::from(std::fs::File::create(d.join(name)).unwrap());
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        cluster.children.push(
            server(bin.join("etcd"))
                .arg("--name=memcolo-test")
                .arg(format!("--data-dir={}", d.join("etcd").display()))
                .arg(format!("--listen-client-urls={etcd_url}"))
                .arg(format!("--advertise-client-urls={etcd_url}"))
                .arg(format!("--listen-peer-urls={peer_url}"))
                .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                .arg(format!("--initial-cluster=memcolo-test={peer_url}"))
                .arg("--log-level=warn")
                .stdout(log("etcd.log"))
                .stderr(log("etcd.log"))
                .spawn()
                .expect("etcd starts"),
        );
        // The service-account token signing key (kube-apiserver requires one).
        let key = d.join("sa.key");
        let st = Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&key)
            .stderr(Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(st.success(), "openssl genpkey");
        // Static tokens: an administrator (system:masters) and the chart's service
        // account, which RBAC knows by that user name and its groups.
        std::fs::write(
            d.join("tokens.csv"),
            format!(
                "{ADMIN_TOKEN},memcolo-test-admin,1,\"system:masters\"\n\
                 {AGENT_TOKEN},{AGENT_USER},2,\"system:serviceaccounts,system:serviceaccounts:{RELEASE_NS}\"\n"
            ),
        )
        .unwrap();
        // Every eviction request, for counting what the client sent.
        std::fs::write(
            d.join("audit.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
             - level: Metadata\n  resources:\n  - group: \"\"\n    resources: [pods/eviction]\n\
             - level: None\n",
        )
        .unwrap();
        cluster.children.push(
            server(bin.join("kube-apiserver"))
                .arg(format!("--etcd-servers={etcd_url}"))
                .arg("--bind-address=127.0.0.1")
                .arg("--advertise-address=127.0.0.1")
                // No `kubernetes` Service endpoints: they may not be a loopback address.
                .arg("--endpoint-reconciler-type=none")
                .arg(format!("--secure-port={api_port}"))
                .arg(format!("--cert-dir={}", d.join("certs").display()))
                .arg(format!(
                    "--token-auth-file={}",
                    d.join("tokens.csv").display()
                ))
                .arg("--authorization-mode=RBAC")
                .arg("--anonymous-auth=false")
                .arg(format!("--service-account-key-file={}", key.display()))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    key.display()
                ))
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg("--service-cluster-ip-range=10.96.0.0/24")
                .arg(format!(
                    "--audit-policy-file={}",
                    d.join("audit.yaml").display()
                ))
                .arg(format!(
                    "--audit-log-path={}",
                    d.join("audit.log").display()
                ))
                .arg("--audit-log-mode=blocking")
                .stdout(log("kube-apiserver.log"))
                .stderr(log("kube-apiserver.log"))
                .spawn()
                .expect("kube-apiserver starts"),
        );
        cluster
    }

    /// A kubeconfig for `token` trusting the API server's self-signed certificate.
    fn kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let path = self.path(&format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    \
                 server: {}\n    certificate-authority: {}\nusers:\n- name: {name}\n  user:\n    \
                 token: {token}\ncontexts:\n- name: {name}\n  context:\n    cluster: test\n    \
                 user: {name}\ncurrent-context: {name}\n",
                self.url,
                self.path("certs/apiserver.crt").display()
            ),
        )
        .unwrap();
        path
    }
}

/// A client as Kubernetes mode builds one, from the kubeconfig at `path`.
async fn kube_client(path: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap();
    client(cfg).unwrap()
}

/// One request with a JSON body (or none); the answer's JSON.
async fn call(
    c: &kube::Client,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<Value, kube::Error> {
    let ct = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", ct)
        .body(
            body.map(|b| serde_json::to_vec(&b).unwrap())
                .unwrap_or_default(),
        )
        .unwrap();
    c.request::<Value>(req).await
}

async fn create(c: &kube::Client, path: &str, body: Value) -> Value {
    call(c, "POST", path, Some(body.clone()))
        .await
        .unwrap_or_else(|e| panic!("POST {path} {body}: {e}"))
}

async fn get(c: &kube::Client, path: &str) -> Value {
    call(c, "GET", path, None)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Pod `name` of namespace `batch` (labelled `app: <name>`) runs, its status written
/// as a kubelet would, and a PodDisruptionBudget allows no disruption of it, with the
/// status the disruption controller (not running here) would write: the API server
/// refuses its eviction with 429 (it ignores budgets for Pending pods).
async fn run_under_a_budget(admin: &kube::Client, name: &str) {
    call(
        admin,
        "PATCH",
        &format!("/api/v1/namespaces/batch/pods/{name}/status"),
        Some(json!({"status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})),
    )
    .await
    .unwrap();
    create(
        admin,
        "/apis/policy/v1/namespaces/batch/poddisruptionbudgets",
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": name}}}}),
    )
    .await;
    call(
        admin,
        "PATCH",
        &format!("/apis/policy/v1/namespaces/batch/poddisruptionbudgets/{name}/status"),
        Some(
            json!({"status": {"observedGeneration": 1, "disruptionsAllowed": 0,
            "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}}),
        ),
    )
    .await
    .unwrap();
}

/// The Helm chart's ServiceAccount, ClusterRole and ClusterRoleBinding, as JSON.
/// Rendered for `kube_version`, the API server's.
fn chart_rbac(helm: &Path, kube_version: &str) -> Vec<Value> {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/memcolo");
    let out = Command::new(helm)
        .args(["template", "memcolo"])
        .arg(&chart)
        .args(["--namespace", RELEASE_NS, "--kube-version", kube_version])
        .args(["--show-only", "templates/serviceaccount.yaml"])
        .args(["--show-only", "templates/rbac.yaml"])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut py = Command::new("python3")
        .args([
            "-c",
            "import json,sys,yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    use std::io::Write;
    py.stdin.take().unwrap().write_all(&out.stdout).unwrap();
    let json = py.wait_with_output().unwrap();
    assert!(json.status.success(), "YAML to JSON");
    serde_json::from_slice(&json.stdout).unwrap()
}

fn pod(name: &str, ns: &str, priority_class: &str, extra: Value) -> Value {
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {
            "nodeName": NODE,
            "priorityClassName": priority_class,
            "containers": [{"name": "main", "image": "registry.invalid/memcolo-test:1"}],
        },
    });
    merge(&mut p, extra);
    p
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

async fn wait_for_snapshot(
    feed: &mut tokio::sync::watch::Receiver<PodSnapshot>,
    what: &str,
    ok: impl Fn(&[PodMeta]) -> bool,
) -> PodSnapshot {
    let r = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            {
                let snap = feed.borrow_and_update().clone();
                if ok(&snap) {
                    return snap;
                }
            }
            feed.changed().await.unwrap();
        }
    })
    .await;
    r.unwrap_or_else(|_| panic!("the pod watch never showed {what}"))
}

async fn outcome(w: &mut ApiWorker) -> ApiOutcome {
    for _ in 0..3000 {
        if let Some(o) = w.outcomes().pop() {
            return o;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no outcome from the API worker in 30 s");
}

/// Writes `v` as `name` into the recording directory, when one is asked for.
fn record(name: &str, v: &Value) {
    if let Some(dir) = std::env::var_os("MEMCOLO_RECORD_FIXTURES") {
        let text = if name.ends_with(".jsonl") {
            v.as_array()
                .unwrap()
                .iter()
                .map(|l| format!("{l}\n"))
                .collect()
        } else {
            format!("{}\n", serde_json::to_string_pretty(v).unwrap())
        };
        std::fs::write(Path::new(&dir).join(name), text).unwrap();
    }
}

/// A running API server with the namespaces `memcolo-system`, `batch` and `prod`, the
/// priority classes `lc-critical` (1000), `batch-low` (-10) and `batch-high` (5), and
/// the Node; the administrator's client and the agent's (the chart's service
/// account, allowed nothing until [`apply_chart_rbac`]). `None` when the tools are
/// missing and [`cannot_run`] let the test skip.
async fn cluster(test: &str) -> Option<Setup> {
    let bin = tools().join("bin");
    for b in ["etcd", "kube-apiserver", "helm"] {
        if !bin.join(b).is_file() {
            cannot_run(
                test,
                &format!("{} missing: run scripts/setup.sh", bin.join(b).display()),
            );
            return None;
        }
    }
    let started = Instant::now();
    let mut cluster = Cluster::start(&bin);
    let deadline = Instant::now() + Duration::from_secs(120);
    // The serving certificate it makes for itself, which the kubeconfigs trust.
    while !std::fs::metadata(cluster.path("certs/apiserver.crt")).is_ok_and(|m| m.len() > 0) {
        assert!(
            cluster.running() && Instant::now() < deadline,
            "{}",
            cluster.not_ready("no certificate")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let admin = kube_client(&cluster.kubeconfig("admin", ADMIN_TOKEN)).await;
    loop {
        let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
        if matches!(admin.request_text(req).await, Ok(t) if t == "ok") {
            break;
        }
        assert!(
            cluster.running() && Instant::now() < deadline,
            "{}",
            cluster.not_ready("not ready")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ready_after = started.elapsed();

    // The cluster's objects, as an administrator.
    for ns in [RELEASE_NS, "batch", "prod"] {
        create(
            &admin,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
        // Pods need their namespace's default service account (the ServiceAccount
        // admission plugin); no controller manager makes it here.
        if ns != RELEASE_NS {
            create(&admin, &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})).await;
        }
    }
    for (name, value) in [("lc-critical", 1000), ("batch-low", -10), ("batch-high", 5)] {
        create(
            &admin,
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            json!({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value}),
        )
        .await;
    }
    create(
        &admin,
        "/api/v1/nodes",
        json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        "status": {"capacity": {"cpu": "2", "memory": "24Gi", "pods": "110"}}}),
    )
    .await;
    let agent = kube_client(&cluster.kubeconfig("agent", AGENT_TOKEN)).await;
    eprintln!(
        "{test}: API server ready after {:.1} s",
        ready_after.as_secs_f64()
    );
    Some(Setup {
        cluster,
        admin,
        agent,
        helm: bin.join("helm"),
    })
}

struct Setup {
    cluster: Cluster,
    admin: kube::Client,
    agent: kube::Client,
    helm: PathBuf,
}

/// Applies the Helm chart's ServiceAccount, ClusterRole and ClusterRoleBinding.
async fn apply_chart_rbac(s: &Setup) {
    let admin = &s.admin;
    let version = get(admin, "/version").await;
    for obj in chart_rbac(&s.helm, version["gitVersion"].as_str().unwrap()) {
        let path = match obj["kind"].as_str().unwrap() {
            "ServiceAccount" => format!("/api/v1/namespaces/{RELEASE_NS}/serviceaccounts"),
            "ClusterRole" => "/apis/rbac.authorization.k8s.io/v1/clusterroles".into(),
            "ClusterRoleBinding" => "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".into(),
            other => panic!("unexpected kind {other} in the chart's RBAC"),
        };
        create(admin, &path, obj).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_mode_against_a_real_api_server() {
    let test = "kubernetes_mode_against_a_real_api_server";
    let started = Instant::now();
    let Some(setup) = cluster(test).await else {
        return;
    };
    let (cluster, admin, agent) = (&setup.cluster, &setup.admin, &setup.agent);
    // The agent, as the chart's service account: nothing is allowed before the
    // chart's RBAC is applied.
    let mut worker = ApiWorker::spawn(KubeRsApi::new(agent.clone()));
    let signals = NodeSignals {
        zone: "yellow".into(),
        low_bytes: 16 << 30,
        high_bytes: 18 << 30,
        top_bytes: 20 << 30,
        used_bytes: 17 << 30,
        reclaimable_be_bytes: 3 << 30,
    };
    let annotate = ApiRequest::PatchNode {
        node: NODE.into(),
        status: false,
        patch: node_annotation_patch(&signals),
    };
    assert!(worker.send(annotate.clone()));
    match outcome(&mut worker).await {
        ApiOutcome::NodePatchFailed {
            error: ApiError::Status { code: 403, .. },
        } => {}
        other => panic!("without the chart's RBAC the node patch must be forbidden: {other:?}"),
    }
    apply_chart_rbac(&setup).await;

    // The pods, bound to the node; a pod of another node that the watch must not see.
    let mut feed = spawn_pod_watch(agent.clone(), NODE);
    let job_uid = "9a1c3e5f-0b2d-4f6a-8c1e-3d5f7a9b1c2e";
    let lc = create(
        admin,
        "/api/v1/namespaces/prod/pods",
        pod(
            "cache-0",
            "prod",
            "lc-critical",
            json!({
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/memcolo-test:1",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                          "limits": {"cpu": "100m", "memory": "64Mi"}}}]}}),
        ),
    )
    .await;
    let low = create(
        admin,
        "/api/v1/namespaces/batch/pods",
        pod(
            "etl-low",
            "batch",
            "batch-low",
            json!({
        "metadata": {"annotations": {"memcolo.io/class": "be"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "etl-nightly",
                                 "uid": job_uid, "controller": true}]}}),
        ),
    )
    .await;
    let high = create(
        admin,
        "/api/v1/namespaces/batch/pods",
        pod("etl-high", "batch", "batch-high", json!({})),
    )
    .await;
    create(
        admin,
        "/api/v1/namespaces/batch/pods",
        pod(
            "elsewhere",
            "batch",
            "batch-low",
            json!({"spec": {"nodeName": "worker-2"}}),
        ),
    )
    .await;
    record("pod-guaranteed.json", &lc);
    record("pod-besteffort.json", &low);
    let uid = |p: &Value| p["metadata"]["uid"].as_str().unwrap().to_string();
    let (lc_uid, low_uid, high_uid) = (uid(&lc), uid(&low), uid(&high));

    let snap = wait_for_snapshot(&mut feed, "the node's three pods", |s| s.len() == 3).await;
    let by_uid = |u: &str| snap.iter().find(|p| p.uid == u).unwrap().clone();
    let (l, b1, b2) = (by_uid(&lc_uid), by_uid(&low_uid), by_uid(&high_uid));
    assert_eq!((l.qos, l.priority), (Some(QosClass::Guaranteed), 1000));
    assert_eq!((b1.qos, b1.priority), (Some(QosClass::BestEffort), -10));
    assert_eq!((b2.qos, b2.priority), (Some(QosClass::BestEffort), 5));
    assert_eq!(b1.annotations["memcolo.io/class"], "be");
    assert_eq!(b1.owner, Some(("Job".into(), "etl-nightly".into())));
    assert_eq!(
        (b1.namespace.as_str(), b1.node_name.as_str()),
        ("batch", NODE)
    );
    let list = get(
        agent,
        &format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"),
    )
    .await;
    record("podlist.json", &list);
    let list_rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    // A change of annotation reaches the watch.
    call(
        admin,
        "PATCH",
        "/api/v1/namespaces/batch/pods/etl-high",
        Some(json!({"metadata": {"annotations": {"memcolo.io/class": "be"}}})),
    )
    .await
    .unwrap();
    wait_for_snapshot(&mut feed, "etl-high's annotation", |s| {
        s.iter().any(|p| {
            p.uid == high_uid
                && p.annotations
                    .get("memcolo.io/class")
                    .is_some_and(|c| c == "be")
        })
    })
    .await;

    // The lowest-priority BE pod is evicted with the grace period asked for, and a
    // Warning Event says why.
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(worker.send(ApiRequest::Evict {
        pod: b1.clone(),
        body: eviction_body(&b1, Some(30)),
        event: event_body(&b1, NODE, "memcolo: node above top (test)", &now),
    }));
    assert_eq!(
        outcome(&mut worker).await,
        ApiOutcome::Evicted {
            uid: low_uid.clone()
        }
    );
    let gone = get(admin, "/api/v1/namespaces/batch/pods/etl-low").await;
    assert!(gone["metadata"]["deletionTimestamp"].is_string(), "{gone}");
    assert_eq!(gone["metadata"]["deletionGracePeriodSeconds"], 30);
    let events = get(
        admin,
        "/api/v1/namespaces/batch/events?fieldSelector=involvedObject.name%3Detl-low",
    )
    .await;
    let items = events["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{events}");
    assert_eq!(items[0]["type"], "Warning");
    assert_eq!(items[0]["reason"], "MemcoloEviction");
    assert_eq!(items[0]["involvedObject"]["uid"], low_uid.as_str());
    record("event.json", &items[0]);

    // The kubelet would delete the pod for good once its containers stopped; the
    // watch then drops it.
    call(
        admin,
        "DELETE",
        "/api/v1/namespaces/batch/pods/etl-low",
        Some(json!({
        "apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})),
    )
    .await
    .unwrap();
    wait_for_snapshot(&mut feed, "etl-low gone", |s| {
        s.len() == 2 && s.iter().all(|p| p.uid != low_uid)
    })
    .await;

    // etl-high runs (its status written as a kubelet would) and a
    // PodDisruptionBudget allows no disruption of it: the eviction is refused with
    // 429, reported once, with no Event.
    run_under_a_budget(admin, "etl-high").await;
    assert!(worker.send(ApiRequest::Evict {
        pod: b2.clone(),
        body: eviction_body(&b2, Some(30)),
        event: event_body(&b2, NODE, "memcolo: node above top (test)", &now),
    }));
    match outcome(&mut worker).await {
        ApiOutcome::EvictFailed {
            uid,
            error: ApiError::Status { code: 429, message },
        } => {
            assert_eq!(uid, high_uid);
            assert!(message.contains("disruption budget"), "{message}");
        }
        other => panic!("a PodDisruptionBudget must refuse the eviction with 429: {other:?}"),
    }
    let still = get(admin, "/api/v1/namespaces/batch/pods/etl-high").await;
    assert!(still["metadata"]["deletionTimestamp"].is_null(), "{still}");
    let events = get(
        admin,
        "/api/v1/namespaces/batch/events?fieldSelector=involvedObject.name%3Detl-high",
    )
    .await;
    assert_eq!(events["items"].as_array().unwrap().len(), 0, "{events}");
    let audit = std::fs::read_to_string(cluster.path("audit.log")).unwrap();
    let asked = |name: &str| {
        audit
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| {
                e["objectRef"]["name"] == name && e["objectRef"]["subresource"] == "eviction"
            })
            .map(|e| {
                (
                    e["user"]["username"].as_str().unwrap_or("").to_string(),
                    e["responseStatus"]["code"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(asked("etl-low"), [(AGENT_USER.to_string(), json!(201))]);
    assert_eq!(
        asked("etl-high"),
        [(AGENT_USER.to_string(), json!(429))],
        "one request, no retries"
    );

    // The node's memory signals, read back from the Node.
    assert!(worker.send(annotate));
    assert_eq!(outcome(&mut worker).await, ApiOutcome::NodePatched);
    assert!(worker.send(ApiRequest::PatchNode {
        node: NODE.into(),
        status: true,
        patch: batch_memory_patch(3 << 30),
    }));
    assert_eq!(outcome(&mut worker).await, ApiOutcome::NodePatched);
    let node = get(agent, &format!("/api/v1/nodes/{NODE}")).await;
    let ann: Value = serde_json::from_str(
        node["metadata"]["annotations"][NODE_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(ann["zone"], "yellow");
    assert_eq!(ann["reclaimable_be_bytes"], 3u64 << 30);
    assert_eq!(
        node["status"]["capacity"][BATCH_MEMORY],
        (3u64 << 30).to_string()
    );
    assert_eq!(
        node["status"]["allocatable"][BATCH_MEMORY],
        (3u64 << 30).to_string()
    );
    // The kubelet's own capacity is kept (a merge patch).
    assert_eq!(node["status"]["capacity"]["memory"], "24Gi");
    record("node.json", &node);

    // The watch's lines as the API server writes them, from the list's
    // resourceVersion: the changes above (the server ends the watch after a second).
    if std::env::var_os("MEMCOLO_RECORD_FIXTURES").is_some() {
        let req = http::Request::get(format!(
            "/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&watch=1&resourceVersion={list_rv}&timeoutSeconds=1"
        ))
        .body(Vec::new())
        .unwrap();
        let text = agent.request_text(req).await.unwrap();
        let lines = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        record("watch.jsonl", &Value::Array(lines));
    }
    eprintln!(
        "{test}: done after {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Kubernetes mode whole ([`KubeNode`], as the agent runs it) against the real API
/// server: the three pods' containers are real processes holding memory in a cgroup
/// v1 tree laid out as the kubelet's cgroupfs driver lays it out (in a scratch group
/// below this test's own), named by the UIDs the API server gave the pods. Above top,
/// the lowest-priority BE pod is evicted through the API server with an Event, never
/// the LC pod; a BE pod that a PodDisruptionBudget protects is refused (429), which
/// is an answer: its processes are not killed, and it is asked again only after a
/// back-off. The node's signals appear on the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_node_evicts_through_a_real_api_server() {
    let test = "kube_node_evicts_through_a_real_api_server";
    if !real_cgroup_v1_available(test) {
        return;
    }
    let started = Instant::now();
    let Some(setup) = cluster(test).await else {
        return;
    };
    apply_chart_rbac(&setup).await;
    let (cluster, admin, agent) = (&setup.cluster, &setup.admin, &setup.agent);
    let guaranteed = json!({"spec": {"containers": [{"name": "main",
        "image": "registry.invalid/memcolo-test:1",
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"cpu": "100m", "memory": "128Mi"}}}]}});
    let lc = create(
        admin,
        "/api/v1/namespaces/prod/pods",
        pod("cache-0", "prod", "lc-critical", guaranteed),
    )
    .await;
    let low = create(
        admin,
        "/api/v1/namespaces/batch/pods",
        pod("etl-low", "batch", "batch-low", json!({})),
    )
    .await;
    let high = create(
        admin,
        "/api/v1/namespaces/batch/pods",
        pod("etl-high", "batch", "batch-high", json!({})),
    )
    .await;
    let uid = |p: &Value| p["metadata"]["uid"].as_str().unwrap().to_string();
    let (lc_uid, low_uid, high_uid) = (uid(&lc), uid(&low), uid(&high));

    // The kubelet's cgroupfs layout, each container running a process.
    let scratch = Scratch::new("k8s-apiserver");
    let kubepods = scratch.cg.path().join("kubepods");
    let mut hogs = Vec::new();
    for (pod, cid, mib) in [
        (format!("pod{lc_uid}"), "a".repeat(64), 96),
        (format!("besteffort/pod{low_uid}"), "c".repeat(64), 48),
        (format!("besteffort/pod{high_uid}"), "d".repeat(64), 48),
    ] {
        let dir = kubepods.join(pod).join(cid);
        std::fs::create_dir_all(&dir).unwrap();
        hogs.push(hog_in(&dir, mib));
    }
    let cg = MemoryCgroup::open(&kubepods).unwrap();
    let used = cg
        .read_usage_bytes()
        .unwrap()
        .saturating_sub(cg.read_memory_stat().unwrap().inactive_file_bytes);
    let below = |overshoot: u64| {
        let top = used - overshoot;
        Thresholds {
            low_bytes: top / 2,
            high_bytes: top * 3 / 4,
            top_bytes: top,
        }
    };

    let mut node = KubeNode::new(
        KubeNodeConfig {
            node: NODE.into(),
            kubepods: kubepods.clone(),
            burstable_class: Class::Lc,
            trusted_namespaces: Vec::new(),
            eviction_grace_period_s: Some(30),
            kill_after: Duration::ZERO,
            publish_interval: Duration::from_secs(3600),
        },
        ProcFs::root(),
        Box::new(LinuxActuator),
        ApiWorker::spawn(KubeRsApi::new(agent.clone())),
    );
    node.attach_pod_feed(spawn_pod_watch(agent.clone(), NODE));
    let now = "2026-11-28T11:00:00Z";

    // Below top until the watch has told the three pods: nothing evicted, the node's
    // signals published (once: the interval is long).
    let mut t = 0;
    let mut published = 0;
    while node.cache.len() < 3 {
        t += 1;
        let r = node
            .poll(Duration::from_secs(t), used, below(0), now)
            .unwrap();
        assert!(
            r.evictions_requested.is_empty() && r.killed.is_empty(),
            "{r:?}"
        );
        published += r.published as u32;
        assert!(t < 600, "the pod watch never told the three pods");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(published, 1);
    let classes: Vec<(String, Class, i32)> = node
        .pods(Duration::from_secs(t))
        .unwrap()
        .into_iter()
        .map(|p| (p.found.pod.uid, p.class, p.priority))
        .collect();
    for (u, class, prio) in [
        (&lc_uid, Class::Lc, 1000),
        (&low_uid, Class::Be, -10),
        (&high_uid, Class::Be, 5),
    ] {
        assert!(
            classes.contains(&(u.clone(), class, prio)),
            "{u}: {classes:?}"
        );
    }
    let mut signals = Value::Null;
    for _ in 0..300 {
        let n = get(admin, &format!("/api/v1/nodes/{NODE}")).await;
        if let Some(a) = n["metadata"]["annotations"][NODE_ANNOTATION].as_str() {
            signals = serde_json::from_str(a).unwrap();
            assert!(n["status"]["capacity"][BATCH_MEMORY].is_string(), "{n}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(signals["used_bytes"], used, "{signals}");
    assert_eq!(signals["top_bytes"], used, "{signals}");

    // 16 MiB above top: the BE pod of priority -10 alone covers it.
    t += 1;
    let r = node
        .poll(Duration::from_secs(t), used, below(16 << 20), now)
        .unwrap();
    assert_eq!(r.evictions_requested, std::slice::from_ref(&low_uid));
    assert!(r.killed.is_empty());
    let mut evicted = Value::Null;
    for _ in 0..300 {
        evicted = get(admin, "/api/v1/namespaces/batch/pods/etl-low").await;
        if evicted["metadata"]["deletionTimestamp"].is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        evicted["metadata"]["deletionGracePeriodSeconds"], 30,
        "{evicted}"
    );
    let mut events = Value::Null;
    for _ in 0..300 {
        events = get(
            admin,
            "/api/v1/namespaces/batch/events?fieldSelector=involvedObject.name%3Detl-low",
        )
        .await;
        if !events["items"].as_array().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let msg = events["items"][0]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("priority -10"), "{events}");

    // etl-high runs and a PodDisruptionBudget allows no disruption of it. Far above
    // top, only etl-high is asked for (etl-low's eviction is in flight, the LC pod
    // never), the API server refuses it, and it is not killed either.
    run_under_a_budget(admin, "etl-high").await;
    let polls = 10;
    let mut asked = Vec::new();
    for _ in 0..polls {
        t += 1;
        let r = node
            .poll(Duration::from_secs(t), used, below(used - (1 << 20)), now)
            .unwrap();
        assert!(r.killed.is_empty(), "{r:?}");
        asked.extend(r.evictions_requested);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        !asked.is_empty() && asked.iter().all(|u| *u == high_uid),
        "{asked:?}"
    );
    assert!(!node.api_unreachable(), "a refusal is an answer");
    assert_eq!(node.evictions, 1);
    assert_eq!(node.fallback_kills, 0);
    let audit = std::fs::read_to_string(cluster.path("audit.log")).unwrap();
    let refusals: Vec<Value> = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["objectRef"]["subresource"] == "eviction")
        .filter(|e| e["objectRef"]["name"] == "etl-high" || e["objectRef"]["name"] == "cache-0")
        .map(|e| json!([e["objectRef"]["name"], e["responseStatus"]["code"]]))
        .collect();
    assert!(
        !refusals.is_empty(),
        "no eviction of etl-high reached the API server"
    );
    assert!(
        refusals.len() <= polls,
        "more than one eviction request a poll: {refusals:?}"
    );
    assert!(
        refusals.iter().all(|r| *r == json!(["etl-high", 429])),
        "{refusals:?}"
    );
    let still = get(admin, "/api/v1/namespaces/batch/pods/etl-high").await;
    assert!(still["metadata"]["deletionTimestamp"].is_null(), "{still}");
    let lc_now = get(admin, "/api/v1/namespaces/prod/pods/cache-0").await;
    assert!(
        lc_now["metadata"]["deletionTimestamp"].is_null(),
        "{lc_now}"
    );
    for u in [&lc_uid, &high_uid] {
        let pods = memcolo_linux::kubepods::discover(&kubepods).unwrap();
        let p = pods.iter().find(|p| p.pod.uid == *u).unwrap();
        assert_eq!(p.all_pids().len(), 1, "pod {u} lost its process");
    }
    drop(hogs);
    eprintln!(
        "{test}: done after {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
