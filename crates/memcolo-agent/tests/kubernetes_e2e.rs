//! The agent's Kubernetes side end to end on a real cgroup v1 tree laid out as the
//! kubelet lays it out (cgroupfs driver), in a scratch group below this test's own
//! group: an LC pod (Guaranteed) and two BE pods (BestEffort, priorities -10 and 5),
//! each with a real process holding memory, and the node's working set above top.
//! The API server is a fake client ([`FakeApi`]) fed with pod objects shaped like the
//! API server's (tests/fixtures/kubernetes): the lowest-priority BE pod is evicted
//! through the Eviction API with an Event, the LC pod never; with the API server
//! unreachable the BE pod's processes are killed through pidfds instead.

use memcolo_agent::kubernetes::api::{FakeApi, FakeCall, PodMeta};
use memcolo_agent::kubernetes::{ApiError, ApiWorker, KubeNode, KubeNodeConfig};
use memcolo_linux::actuate::LinuxActuator;
use memcolo_linux::cgroup::MemoryCgroup;
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::m3::Thresholds;
use memcolo_policy::Class;
use memcolo_proto::NotifyMode;
use memcolo_testkit::{hog_in, real_cgroup_v1_available, wait_for, Hog, Scratch};
use std::path::{Path, PathBuf};
use std::time::Duration;

const MIB: u64 = 1 << 20;
const LC_UID: &str = "11111111-2222-4333-8444-555555555555";
const BE_LOW_UID: &str = "33333333-4444-4555-8666-777777777777";
const BE_HIGH_UID: &str = "44444444-5555-4666-8777-888888888888";

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kubernetes")
            .join(name),
    )
    .unwrap()
}

/// The three pods' metadata, as the pod watch would give it.
fn metas() -> Vec<PodMeta> {
    let mut v: serde_json::Value = serde_json::from_slice(&fixture("pod-guaranteed.json")).unwrap();
    v["metadata"]["annotations"]["memcolo.io/t-miss"] = "0.05".into();
    let lc = PodMeta::from_json(&serde_json::to_vec(&v).unwrap()).unwrap();
    let low = PodMeta::from_json(&fixture("pod-besteffort.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&fixture("pod-besteffort.json")).unwrap();
    v["metadata"]["uid"] = BE_HIGH_UID.into();
    v["metadata"]["name"] = "etl-weekly-0".into();
    v["spec"]["priority"] = 5.into();
    // The attack: a BestEffort batch pod that calls itself LC to escape eviction.
    v["metadata"]["annotations"]["memcolo.io/class"] = "lc".into();
    let high = PodMeta::from_json(&serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!((lc.uid.as_str(), low.uid.as_str()), (LC_UID, BE_LOW_UID));
    vec![lc, low, high]
}

struct Node {
    _procs: Vec<Hog>,
    kubepods: PathBuf,
    _scratch: Scratch,
}

/// The kubelet's cgroupfs layout with the three pods, each container running a hog.
fn lay_out(tag: &str) -> Node {
    let scratch = Scratch::new(tag);
    let kubepods = scratch.cg.path().join("kubepods");
    let mut procs = Vec::new();
    for (pod, cid, mib) in [
        (format!("pod{LC_UID}"), "a".repeat(64), 96),
        (format!("besteffort/pod{BE_LOW_UID}"), "c".repeat(64), 48),
        (format!("besteffort/pod{BE_HIGH_UID}"), "d".repeat(64), 48),
    ] {
        let dir = kubepods.join(pod).join(cid);
        std::fs::create_dir_all(&dir).unwrap();
        procs.push(hog_in(&dir, mib));
    }
    Node {
        _procs: procs,
        kubepods,
        _scratch: scratch,
    }
}

fn working_set(kubepods: &Path) -> u64 {
    let cg = MemoryCgroup::open(kubepods).unwrap();
    cg.read_usage_bytes()
        .unwrap()
        .saturating_sub(cg.read_memory_stat().unwrap().inactive_file_bytes)
}

fn kube_node(kubepods: &Path, fake: &FakeApi, trusted: &[&str]) -> KubeNode {
    let mut node = KubeNode::new(
        KubeNodeConfig {
            node: "worker-1".into(),
            kubepods: kubepods.to_path_buf(),
            burstable_class: Class::Lc,
            trusted_namespaces: trusted.iter().map(|s| s.to_string()).collect(),
            eviction_grace_period_s: Some(30),
            kill_after: Duration::ZERO,
            publish_interval: Duration::from_secs(10),
        },
        ProcFs::root(),
        Box::new(LinuxActuator),
        ApiWorker::spawn(fake.clone()),
    );
    node.cache.replace(metas());
    node
}

/// Thresholds with top `overshoot` below the working set now.
fn thresholds_below(used: u64, overshoot: u64) -> Thresholds {
    let top = used - overshoot;
    Thresholds {
        low_bytes: top / 2,
        high_bytes: top * 3 / 4,
        top_bytes: top,
    }
}

fn evictions(fake: &FakeApi) -> Vec<String> {
    fake.calls
        .lock()
        .unwrap()
        .iter()
        .filter_map(|c| match c {
            FakeCall::Evict { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowest_priority_be_pod_is_evicted_through_the_api_never_lc() {
    if !real_cgroup_v1_available("lowest_priority_be_pod_is_evicted_through_the_api_never_lc") {
        return;
    }
    let n = lay_out("k8s-evict");
    let fake = FakeApi::default();
    let mut node = kube_node(&n.kubepods, &fake, &[]);
    let used = working_set(&n.kubepods);
    // Classes from the pod objects: the Guaranteed pod LC, the others BE, the one
    // annotated `lc` too: its namespace is not trusted to raise its class.
    let pods = node.pods(Duration::ZERO).unwrap();
    let classes: Vec<(&str, Class)> = pods
        .iter()
        .map(|p| (p.found.pod.uid.as_str(), p.class))
        .collect();
    assert_eq!(
        classes,
        [
            (LC_UID, Class::Lc),
            (BE_LOW_UID, Class::Be),
            (BE_HIGH_UID, Class::Be)
        ]
    );
    // Each pod's process is a registration with the pod's class and options: the
    // BestEffort pod's annotation asks for signals.
    let procs = node.pod_processes(&pods);
    let regs: Vec<(&str, Class, NotifyMode)> = procs
        .iter()
        .map(|p| (p.pod_uid.as_str(), p.class, p.notify))
        .collect();
    assert_eq!(
        regs,
        [
            (LC_UID, Class::Lc, NotifyMode::None),
            (BE_LOW_UID, Class::Be, NotifyMode::Signal),
            (BE_HIGH_UID, Class::Be, NotifyMode::Signal)
        ]
    );
    for (p, pod) in procs.iter().zip(&pods) {
        assert_eq!(vec![p.pid], pod.found.all_pids());
        assert_eq!(p.name, pod.name.clone().unwrap());
    }
    // Where the operator trusts the namespace, the annotation is obeyed.
    let mut trusting = kube_node(&n.kubepods, &FakeApi::default(), &["batch"]);
    let high = trusting.pods(Duration::ZERO).unwrap();
    let high = high
        .iter()
        .find(|p| p.found.pod.uid == BE_HIGH_UID)
        .unwrap();
    assert_eq!(high.class, Class::Lc);

    // Below top: nothing evicted, the node's signals published.
    let r = node
        .poll(
            Duration::from_secs(1),
            used,
            thresholds_below(used + MIB, 0),
            "2026-11-28T11:00:00Z",
        )
        .unwrap();
    assert!(r.evictions_requested.is_empty() && r.killed.is_empty());
    assert!(r.published);
    // The LC pod's memcolo.io/t-miss, for its processes' tiered regions.
    let lc_pids = pods[0].found.all_pids();
    assert_eq!(r.tier_targets, lc_pids.iter().map(|p| (*p, 0.05)).collect());

    // 16 MiB above top: the BE pod of priority -10 alone covers it.
    let r = node
        .poll(
            Duration::from_secs(2),
            used,
            thresholds_below(used, 16 * MIB),
            "2026-11-28T11:00:01Z",
        )
        .unwrap();
    assert_eq!(r.evictions_requested, [BE_LOW_UID]);
    assert!(r.killed.is_empty());
    wait_for(
        "the eviction and its Event",
        Duration::from_secs(10),
        || {
            fake.calls
                .lock()
                .unwrap()
                .iter()
                .any(|c| matches!(c, FakeCall::Event { .. }))
        },
    );
    assert_eq!(evictions(&fake), ["etl-nightly-28871230-x7k2p"]);
    {
        let calls = fake.calls.lock().unwrap();
        let (body, event) = calls.iter().fold((None, None), |(b, e), c| match c {
            FakeCall::Evict {
                namespace, body, ..
            } => {
                assert_eq!(namespace, "batch");
                (Some(body.clone()), e)
            }
            FakeCall::Event { body, .. } => (b, Some(body.clone())),
            _ => (b, e),
        });
        let body = body.unwrap();
        assert_eq!(body["kind"], "Eviction");
        assert_eq!(body["deleteOptions"]["gracePeriodSeconds"], 30);
        let event = event.unwrap();
        assert_eq!(event["involvedObject"]["uid"], BE_LOW_UID);
        assert!(event["message"].as_str().unwrap().contains("priority -10"));
    }

    // The eviction is in flight: not asked again, nothing more while it covers.
    let r = node
        .poll(
            Duration::from_secs(3),
            used,
            thresholds_below(used, 16 * MIB),
            "2026-11-28T11:00:02Z",
        )
        .unwrap();
    assert!(r.evictions_requested.is_empty(), "{r:?}");

    // Whatever the overshoot, the LC pod is never evicted.
    let r = node
        .poll(
            Duration::from_secs(4),
            used,
            thresholds_below(used, used - MIB),
            "2026-11-28T11:00:03Z",
        )
        .unwrap();
    assert_eq!(r.evictions_requested, [BE_HIGH_UID]);
    wait_for("the second eviction", Duration::from_secs(10), || {
        evictions(&fake).len() == 2
    });
    assert_eq!(
        evictions(&fake),
        ["etl-nightly-28871230-x7k2p", "etl-weekly-0"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_unreachable_above_top_kills_the_be_pod_through_pidfds() {
    if !real_cgroup_v1_available("api_unreachable_above_top_kills_the_be_pod_through_pidfds") {
        return;
    }
    let n = lay_out("k8s-fallback");
    let fake = FakeApi::default();
    *fake.fail_with.lock().unwrap() = Some(ApiError::Unreachable("connection refused".into()));
    let mut node = kube_node(&n.kubepods, &fake, &[]);
    let used = working_set(&n.kubepods);
    let th = thresholds_below(used, 16 * MIB);
    // First the API is tried.
    let r = node.poll(Duration::from_secs(1), used, th, "t").unwrap();
    assert_eq!(r.evictions_requested, [BE_LOW_UID]);
    wait_for("the failed eviction", Duration::from_secs(10), || {
        !evictions(&fake).is_empty()
    });
    // Its failure read, and still above top: the pod's processes are killed.
    let mut killed = Vec::new();
    for i in 2..200 {
        let r = node.poll(Duration::from_secs(i), used, th, "t").unwrap();
        killed.extend(r.killed);
        if !killed.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(node.api_unreachable());
    assert_eq!(killed, [BE_LOW_UID]);
    wait_for(
        "the BE pod's process to die",
        Duration::from_secs(10),
        || {
            let pods = memcolo_linux::kubepods::discover(&n.kubepods).unwrap();
            pods.iter()
                .find(|p| p.pod.uid == BE_LOW_UID)
                .unwrap()
                .all_pids()
                .is_empty()
        },
    );
    let pods = memcolo_linux::kubepods::discover(&n.kubepods).unwrap();
    for uid in [LC_UID, BE_HIGH_UID] {
        let p = pods.iter().find(|p| p.pod.uid == uid).unwrap();
        assert_eq!(p.all_pids().len(), 1, "pod {uid} lost its process");
    }

    // Unreachable API but below top: nothing is killed.
    let fake2 = FakeApi::default();
    *fake2.fail_with.lock().unwrap() = Some(ApiError::Unreachable("connection refused".into()));
    let mut node2 = kube_node(&n.kubepods, &fake2, &[]);
    let below = thresholds_below(used + 64 * MIB, 0);
    for i in 1..20 {
        let r = node2
            .poll(Duration::from_secs(i), used, below, "t")
            .unwrap();
        assert!(r.killed.is_empty() && r.evictions_requested.is_empty());
    }
}

/// A PodDisruptionBudget refuses the eviction of the BE pod that alone would cover the
/// overshoot (429): that pod is not asked again at every poll, and the next BE pod
/// is evicted instead, so the node does not stay above top while the budget holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_its_budget_protects_is_passed_over_for_the_next_be_pod() {
    if !real_cgroup_v1_available("a_pod_its_budget_protects_is_passed_over_for_the_next_be_pod") {
        return;
    }
    let n = lay_out("k8s-pdb");
    let fake = FakeApi::default();
    fake.budget_blocks
        .lock()
        .unwrap()
        .push("etl-nightly-28871230-x7k2p".into());
    let mut node = kube_node(&n.kubepods, &fake, &[]);
    let used = working_set(&n.kubepods);
    let above = thresholds_below(used, 16 * MIB);
    let mut t = 1;
    let mut poll = |node: &mut KubeNode| {
        t += 1;
        node.poll(Duration::from_secs(t), used, above, "2026-11-28T11:00:00Z")
            .unwrap()
    };
    assert_eq!(poll(&mut node).evictions_requested, [BE_LOW_UID]);
    wait_for("the refused eviction", Duration::from_secs(10), || {
        !evictions(&fake).is_empty()
    });
    // The refusal is read at the next poll, which picks the next BE pod.
    let mut asked = Vec::new();
    for _ in 0..5 {
        asked.extend(poll(&mut node).evictions_requested);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(asked, [BE_HIGH_UID], "{:?}", evictions(&fake));
    wait_for("the second eviction", Duration::from_secs(10), || {
        evictions(&fake).len() == 2
    });
    assert_eq!(
        evictions(&fake),
        ["etl-nightly-28871230-x7k2p", "etl-weekly-0"]
    );
}
