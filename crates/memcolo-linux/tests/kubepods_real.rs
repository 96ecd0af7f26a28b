//! Pod discovery ([`memcolo_linux::kubepods`]) on real memory cgroup trees laid out
//! exactly as the kubelet and the container runtimes lay them out, for both cgroup
//! drivers, inside a scratch group below this test's own group, with real processes
//! (`sleep`) in the containers: on cgroup v1 here, and on v2 in the guest of
//! `scripts/v2bed` (every level given the memory controller, as the kubelet does).
//! A fake tree (plain directories) checks the v2 file names on any machine. The
//! scratch tree is removed afterwards, also on failure (Drop guard).

use memcolo_linux::cgroup::{CgroupVersion, MemoryCgroup};
use memcolo_linux::kubepods::{discover, CgroupDriver, QosClass, Runtime};
use memcolo_testkit::{real_memory_cgroup_available, Scratch};
use std::path::Path;
use std::process::{Child, Command};

/// A `sleep` killed and reaped when dropped.
struct Sleeper(Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Three pods, one per QoS class, each with a container (a sleep in it) and, for the
/// Burstable pod, a second container and, on v1, a process in the pod group itself (a
/// pause process, as the kubelet runs on cgroupfs with Docker; v2's "no internal
/// processes" rule keeps the kubelet from doing that there).
struct Layout {
    root: &'static str,
    guaranteed: String,
    burstable: String,
    besteffort: String,
    container: fn(&str) -> String,
}

const UIDS: [&str; 3] = [
    "11111111-2222-4333-8444-555555555555",
    "22222222-3333-4444-8555-666666666666",
    "33333333-4444-4555-8666-777777777777",
];
const CIDS: [&str; 4] = [
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc",
    "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd",
];

fn cgroupfs() -> Layout {
    Layout {
        root: "kubepods",
        guaranteed: format!("pod{}", UIDS[0]),
        burstable: format!("burstable/pod{}", UIDS[1]),
        besteffort: format!("besteffort/pod{}", UIDS[2]),
        container: |id| id.to_string(),
    }
}

fn systemd() -> Layout {
    let u = |s: &str| s.replace('-', "_");
    Layout {
        root: "kubepods.slice",
        guaranteed: format!("kubepods-pod{}.slice", u(UIDS[0])),
        burstable: format!(
            "kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            u(UIDS[1])
        ),
        besteffort: format!(
            "kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
            u(UIDS[2])
        ),
        container: |id| format!("cri-containerd-{id}.scope"),
    }
}

fn mkdirs(p: &Path) {
    std::fs::create_dir_all(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
}

fn sleep_in(dir: &Path) -> Sleeper {
    let child = Sleeper(Command::new("sleep").arg("600").spawn().unwrap());
    std::fs::write(dir.join("cgroup.procs"), child.0.id().to_string()).unwrap();
    child
}

/// `rel` below `base`, each level made a memory cgroup (on v2 its parent delegates the
/// controller, as the kubelet's groups have it).
fn groups(base: &MemoryCgroup, rel: &str) -> std::path::PathBuf {
    let mut cg = base.clone();
    for part in Path::new(rel).components() {
        let name = part.as_os_str().to_str().unwrap();
        cg = cg
            .create_child(name)
            .unwrap_or_else(|e| panic!("mkdir {}/{name}: {e}", cg.path().display()));
    }
    cg.path().to_path_buf()
}

fn check_layout(tag: &str, layout: Layout, driver: CgroupDriver) {
    let scratch = Scratch::new(tag);
    let v2 = scratch.cg.version() == CgroupVersion::V2;
    let kubepods = scratch.cg.path().join(layout.root);
    let pods = [&layout.guaranteed, &layout.burstable, &layout.besteffort];
    let mut sleepers = Vec::new();
    let mut expect = Vec::new(); // (uid, qos, [(cid, pid)], pod-level pids)
    for (i, (rel, qos)) in pods
        .iter()
        .zip([
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ])
        .enumerate()
    {
        let pod_dir = groups(&scratch.cg, &format!("{}/{rel}", layout.root));
        let mut ctrs = Vec::new();
        let mut cids = vec![CIDS[i]];
        if qos == QosClass::Burstable {
            cids.push(CIDS[3]);
        }
        for cid in cids {
            let d = groups(
                &MemoryCgroup::open(&pod_dir).unwrap(),
                &(layout.container)(cid),
            );
            let s = sleep_in(&d);
            ctrs.push((cid.to_string(), s.0.id() as i32));
            sleepers.push(s);
        }
        let mut pod_pids = Vec::new();
        if qos == QosClass::Burstable && !v2 {
            let s = sleep_in(&pod_dir);
            pod_pids.push(s.0.id() as i32);
            sleepers.push(s);
        }
        expect.push((UIDS[i], qos, ctrs, pod_pids));
    }
    // Groups that are not pods or containers are ignored.
    mkdirs(&kubepods.join("not-a-pod"));
    mkdirs(&kubepods.join(&layout.burstable).join("crio-conmon-x.scope"));

    let found = discover(&kubepods).unwrap();
    assert_eq!(found.len(), 3, "{found:#?}");
    for (pod, (uid, qos, ctrs, pod_pids)) in found.iter().zip(&expect) {
        assert_eq!(pod.pod.uid, *uid);
        assert_eq!(pod.pod.qos, *qos);
        assert_eq!(pod.pod.driver, driver);
        assert_eq!(pod.pids, *pod_pids);
        let got: Vec<(String, Vec<i32>)> = pod
            .containers
            .iter()
            .map(|c| (c.container.id.clone(), c.pids.clone()))
            .collect();
        let want: Vec<(String, Vec<i32>)> =
            ctrs.iter().map(|(c, p)| (c.clone(), vec![*p])).collect();
        assert_eq!(got, want, "pod {uid}");
        for c in &pod.containers {
            assert_eq!(c.container.runtime, Runtime::Containerd);
        }
        let mut all: Vec<i32> = ctrs
            .iter()
            .map(|(_, p)| *p)
            .chain(pod_pids.iter().copied())
            .collect();
        all.sort_unstable();
        assert_eq!(pod.all_pids(), all);
    }
    drop(sleepers);
    drop(scratch);
}

#[test]
fn discovers_cgroupfs_driver_pods_on_a_real_tree() {
    if !real_memory_cgroup_available("discovers_cgroupfs_driver_pods_on_a_real_tree") {
        return;
    }
    check_layout("kubepods-cgroupfs", cgroupfs(), CgroupDriver::Cgroupfs);
}

#[test]
fn discovers_systemd_driver_pods_on_a_real_tree() {
    if !real_memory_cgroup_available("discovers_systemd_driver_pods_on_a_real_tree") {
        return;
    }
    check_layout("kubepods-systemd", systemd(), CgroupDriver::Systemd);
}

/// The same walk over a cgroup v2 tree's file names (`memory.current`), on plain
/// directories: v2 is not mounted with the memory controller on this machine.
#[test]
fn discovers_pods_on_fake_v2_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let kubepods = tmp.path().join("kubepods.slice");
    let l = systemd();
    for (rel, cid, pid) in [
        (&l.guaranteed, CIDS[0], 101),
        (&l.burstable, CIDS[1], 202),
        (&l.besteffort, CIDS[2], 303),
    ] {
        let pod = kubepods.join(rel);
        let ctr = pod.join((l.container)(cid));
        mkdirs(&ctr);
        for d in [kubepods.as_path(), pod.parent().unwrap(), &pod, &ctr] {
            std::fs::write(d.join("memory.current"), "0\n").unwrap();
            std::fs::write(d.join("cgroup.procs"), "").unwrap();
        }
        std::fs::write(ctr.join("cgroup.procs"), format!("{pid}\n")).unwrap();
    }
    let found = discover(&kubepods).unwrap();
    let got: Vec<(QosClass, &str, Vec<i32>)> = found
        .iter()
        .map(|p| (p.pod.qos, p.pod.uid.as_str(), p.all_pids()))
        .collect();
    assert_eq!(
        got,
        vec![
            (QosClass::Guaranteed, UIDS[0], vec![101]),
            (QosClass::Burstable, UIDS[1], vec![202]),
            (QosClass::BestEffort, UIDS[2], vec![303]),
        ]
    );
    // A directory that is not a kubepods group is refused.
    assert!(discover(tmp.path()).is_err());
}

/// A container may own a delegated cgroup subtree (a cgroup namespace with a writable
/// cgroupfs, systemd in a container) and fill it with groups. Discovery walks at most
/// `MAX_GROUPS_PER_CONTAINER` groups of one container, breadth-first, so such a
/// container costs every poll a bounded walk; it is marked truncated, its own group's
/// processes are still found, and the other pods are discovered as usual.
#[test]
fn a_container_full_of_groups_costs_a_bounded_walk() {
    use memcolo_linux::kubepods::MAX_GROUPS_PER_CONTAINER;
    let tmp = tempfile::tempdir().unwrap();
    let kubepods = tmp.path().join("kubepods");
    let group = |d: &Path, pids: &str| {
        mkdirs(d);
        std::fs::write(d.join("memory.current"), "0\n").unwrap();
        std::fs::write(d.join("cgroup.procs"), pids).unwrap();
    };
    group(&kubepods, "");
    group(&kubepods.join("besteffort"), "");
    let hostile = kubepods.join(format!("besteffort/pod{}", UIDS[2]));
    group(&hostile, "");
    let ctr = hostile.join(CIDS[2]);
    group(&ctr, "300\n");
    // 40 groups wide, each 50 deep: 2,000 groups, each holding a process.
    let mut pid = 10_000;
    for w in 0..40 {
        let mut d = ctr.join(format!("w{w}"));
        for _ in 0..50 {
            group(&d, &format!("{pid}\n"));
            pid += 1;
            d = d.join("d");
        }
    }
    let quiet = kubepods.join(format!("pod{}", UIDS[0]));
    group(&quiet, "");
    group(&quiet.join(CIDS[0]), "101\n");

    let found = discover(&kubepods).unwrap();
    assert_eq!(found.len(), 2, "{found:#?}");
    let q = found.iter().find(|p| p.pod.uid == UIDS[0]).unwrap();
    assert_eq!(q.all_pids(), [101]);
    assert!(!q.containers[0].truncated);
    let h = found.iter().find(|p| p.pod.uid == UIDS[2]).unwrap();
    let c = &h.containers[0];
    assert!(c.truncated, "2,000 groups walked in full");
    assert!(
        c.pids.len() <= MAX_GROUPS_PER_CONTAINER,
        "{} processes read: the walk was not bounded",
        c.pids.len()
    );
    // Breadth-first: the container's own group and the first level come first.
    assert!(c.pids.contains(&300));
    for w in 0..40 {
        assert!(c.pids.contains(&(10_000 + w * 50)), "level 1, w{w}");
    }
}
