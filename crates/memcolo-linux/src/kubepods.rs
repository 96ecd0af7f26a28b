//! Pods and containers found in the kubelet's cgroup hierarchy.
//!
//! The kubelet puts every pod in a cgroup named after the pod's UID below a
//! `kubepods` group, under a per-QoS-class group for Burstable and BestEffort pods
//! and directly below `kubepods` for Guaranteed ones; the container runtime puts each
//! container in a group below its pod (Kubernetes docs, "Node Resource Managers" and
//! "cgroup drivers"; kubelet `pkg/kubelet/cm/cgroup_manager_linux.go`,
//! `pkg/kubelet/cm/qos_container_manager_linux.go`). The layout depends on the
//! kubelet's cgroup driver, and is the same on cgroup v1 and v2:
//!
//! | driver   | QoS class  | pod group                                                                      |
//! |----------|------------|--------------------------------------------------------------------------------|
//! | cgroupfs | Guaranteed | `kubepods/pod<uid>`                                                            |
//! | cgroupfs | Burstable  | `kubepods/burstable/pod<uid>`                                                  |
//! | cgroupfs | BestEffort | `kubepods/besteffort/pod<uid>`                                                 |
//! | systemd  | Guaranteed | `kubepods.slice/kubepods-pod<uid_>.slice`                                      |
//! | systemd  | Burstable  | `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice`   |
//! | systemd  | BestEffort | `kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice` |
//!
//! `<uid_>` is the pod UID with `-` written as `_` (systemd uses `-` for nesting).
//! A container's group below its pod is, with the cgroupfs driver, the container ID
//! (containerd, Docker) or `crio-<id>` (CRI-O); with the systemd driver a scope,
//! `cri-containerd-<id>.scope`, `docker-<id>.scope` or `crio-<id>.scope`. CRI-O's
//! monitor `crio-conmon-<id>.scope` is not a container. A kubelet started with
//! `--cgroup-root` nests `kubepods` deeper (kind: `kubelet.slice/kubelet-kubepods.slice/…`,
//! every slice name carrying the `kubelet-` prefix); the parser finds the `kubepods`
//! component anywhere in the path.
//!
//! [`parse_path`] is pure; [`discover`] walks a real (or fake) tree and reads each
//! container's `cgroup.procs`. Names are checked strictly (a pod UID is an RFC 4122
//! UUID, a container ID 12–64 lowercase hex digits): whatever else sits in the tree is
//! not a pod.

use crate::cgroup::MemoryCgroup;
use crate::error::{Error, Result};
pub use memcolo_policy::kubernetes::QosClass;
use memcolo_policy::types::Pid;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The kubelet's cgroup driver (`--cgroup-driver`, `cgroupDriver` in its config).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

/// The container runtime a container group's name shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Runtime {
    /// `cri-containerd-<id>.scope`, or a bare ID with the cgroupfs driver (containerd
    /// and Docker both name the group by the bare ID there).
    Containerd,
    /// `docker-<id>.scope`.
    Docker,
    /// `crio-<id>.scope` or `crio-<id>`.
    Crio,
}

/// What a cgroup path below `kubepods` is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum KubeCgroup {
    /// A pod's group.
    Pod(PodRef),
    /// A container's group in a pod.
    Container(PodRef, ContainerRef),
}

impl KubeCgroup {
    /// The pod of either kind of group.
    pub fn pod(&self) -> &PodRef {
        match self {
            KubeCgroup::Pod(p) | KubeCgroup::Container(p, _) => p,
        }
    }
}

/// A pod as its cgroup names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct PodRef {
    /// The pod's UID (`metadata.uid`), lowercase, with `-`.
    pub uid: String,
    pub qos: QosClass,
    pub driver: CgroupDriver,
}

/// A container as its cgroup names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ContainerRef {
    /// The container ID (`status.containerStatuses[].containerID` without its
    /// `containerd://` style prefix).
    pub id: String,
    pub runtime: Runtime,
}

/// Whether `s` is an RFC 4122 UUID in lowercase hex: 8-4-4-4-12 digits separated by
/// `sep`.
fn is_uuid(s: &str, sep: u8) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == sep,
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
        })
}

/// Whether `s` is a container ID: 12 to 64 lowercase hex digits.
fn is_container_id(s: &str) -> bool {
    (12..=64).contains(&s.len())
        && s.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// The pod UID in a cgroupfs pod group name `pod<uid>`.
fn cgroupfs_pod(name: &str) -> Option<String> {
    let uid = name.strip_prefix("pod")?;
    is_uuid(uid, b'-').then(|| uid.to_string())
}

/// The pod UID in a systemd pod slice name `<prefix>-pod<uid_>.slice`.
fn systemd_pod(name: &str, prefix: &str) -> Option<String> {
    let uid = name
        .strip_prefix(prefix)?
        .strip_prefix("-pod")?
        .strip_suffix(".slice")?;
    is_uuid(uid, b'_').then(|| uid.replace('_', "-"))
}

/// A container group's name parsed for either driver; `None` for anything else
/// (CRI-O's `crio-conmon-<id>.scope` included).
fn container(name: &str, driver: CgroupDriver) -> Option<ContainerRef> {
    let (id, runtime) = match driver {
        CgroupDriver::Systemd => {
            let stem = name.strip_suffix(".scope")?;
            if let Some(id) = stem.strip_prefix("cri-containerd-") {
                (id, Runtime::Containerd)
            } else if let Some(id) = stem.strip_prefix("docker-") {
                (id, Runtime::Docker)
            } else if let Some(id) = stem.strip_prefix("crio-") {
                (id, Runtime::Crio)
            } else {
                return None;
            }
        }
        CgroupDriver::Cgroupfs => match name.strip_prefix("crio-") {
            Some(id) => (id, Runtime::Crio),
            None => (name, Runtime::Containerd),
        },
    };
    is_container_id(id).then(|| ContainerRef {
        id: id.to_string(),
        runtime,
    })
}

/// Parses a cgroup path (absolute in its hierarchy, as `/proc/PID/cgroup` prints it,
/// or any path whose components include the kubelet's `kubepods` group) into the pod,
/// and container, it is the group of. `None` for a path that is not a pod's or a
/// container's group (`kubepods` itself, a QoS group, anything outside `kubepods`,
/// names that do not check).
pub fn parse_path(path: &str) -> Option<KubeCgroup> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    // The last `kubepods` component: cgroupfs `kubepods`, systemd `kubepods.slice` or
    // `<prefix>-kubepods.slice` (kind's `kubelet-kubepods.slice`).
    let root = comps.iter().rposition(|c| {
        *c == "kubepods" || *c == "kubepods.slice" || c.ends_with("-kubepods.slice")
    })?;
    let rest = &comps[root + 1..];
    if comps[root] == "kubepods" {
        parse_cgroupfs(rest)
    } else {
        let prefix = comps[root].strip_suffix(".slice")?;
        parse_systemd(rest, prefix)
    }
}

fn parse_cgroupfs(rest: &[&str]) -> Option<KubeCgroup> {
    let (qos, rest) = match *rest.first()? {
        "burstable" => (QosClass::Burstable, &rest[1..]),
        "besteffort" => (QosClass::BestEffort, &rest[1..]),
        _ => (QosClass::Guaranteed, rest),
    };
    let uid = cgroupfs_pod(rest.first()?)?;
    let pod = PodRef {
        uid,
        qos,
        driver: CgroupDriver::Cgroupfs,
    };
    match rest.len() {
        1 => Some(KubeCgroup::Pod(pod)),
        2 => container(rest[1], CgroupDriver::Cgroupfs).map(|c| KubeCgroup::Container(pod, c)),
        _ => None,
    }
}

fn parse_systemd(rest: &[&str], prefix: &str) -> Option<KubeCgroup> {
    let first = *rest.first()?;
    let burstable = format!("{prefix}-burstable");
    let besteffort = format!("{prefix}-besteffort");
    let (qos, pod_prefix, rest) = if first == format!("{burstable}.slice") {
        (QosClass::Burstable, burstable.as_str(), &rest[1..])
    } else if first == format!("{besteffort}.slice") {
        (QosClass::BestEffort, besteffort.as_str(), &rest[1..])
    } else {
        (QosClass::Guaranteed, prefix, rest)
    };
    let uid = systemd_pod(rest.first()?, pod_prefix)?;
    let pod = PodRef {
        uid,
        qos,
        driver: CgroupDriver::Systemd,
    };
    match rest.len() {
        1 => Some(KubeCgroup::Pod(pod)),
        2 => container(rest[1], CgroupDriver::Systemd).map(|c| KubeCgroup::Container(pod, c)),
        _ => None,
    }
}

/// A pod found by [`discover`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DiscoveredPod {
    pub pod: PodRef,
    /// The pod's group.
    pub path: PathBuf,
    /// Its containers, sorted by ID.
    pub containers: Vec<DiscoveredContainer>,
    /// Processes in the pod's group itself (not in a container), sorted.
    pub pids: Vec<Pid>,
}

impl DiscoveredPod {
    /// Every process of the pod: its own group's and its containers', sorted.
    pub fn all_pids(&self) -> Vec<Pid> {
        let mut all: Vec<Pid> = self.pids.clone();
        for c in &self.containers {
            all.extend(&c.pids);
        }
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// A container found by [`discover`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DiscoveredContainer {
    pub container: ContainerRef,
    /// The container's group.
    pub path: PathBuf,
    /// Processes of the container's group and of groups below it, sorted; at most
    /// [`MAX_GROUPS_PER_CONTAINER`] groups are read.
    pub pids: Vec<Pid>,
    /// The container's subtree was not read in full (more groups than the bound, or a
    /// group that could not be read): processes deep in it may be missing from `pids`.
    pub truncated: bool,
}

/// Groups read per container in one discovery, the container's own included. The
/// kubelet and runtimes create none below a container; whatever is there the
/// container made itself (a delegated subtree), so the walk is bounded, breadth-first,
/// to keep each poll's cost independent of what tenants create.
pub const MAX_GROUPS_PER_CONTAINER: usize = 64;

/// Walks the kubelet's tree below `kubepods` (the directory of the `kubepods` group of
/// either driver, in a v1 memory or a v2 hierarchy) and returns every pod, sorted by
/// UID. Groups that vanish during the walk are skipped; unknown groups are ignored.
/// Errors: `kubepods` cannot be read, or its name is not a `kubepods` group's
/// ([`Error::InvalidArgument`]).
pub fn discover(kubepods: &Path) -> Result<Vec<DiscoveredPod>> {
    let root_name = kubepods
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| *n == "kubepods" || *n == "kubepods.slice" || n.ends_with("-kubepods.slice"))
        .ok_or_else(|| Error::InvalidArgument {
            what: format!(
                "{} is not the kubelet's kubepods group (kubepods, kubepods.slice or <prefix>-kubepods.slice)",
                kubepods.display()
            ),
        })?;
    let root = MemoryCgroup::open(kubepods)?;
    let mut pods = Vec::new();
    // Pods sit one or two levels down (Guaranteed, or below a QoS group).
    let mut level1 = root.children()?;
    let mut candidates = Vec::new();
    for cg in level1.drain(..) {
        candidates.push(cg.clone());
        match cg.children() {
            Ok(c) => candidates.extend(c),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    for cg in candidates {
        let Ok(rel) = cg.path().strip_prefix(kubepods) else {
            continue;
        };
        let rel = format!("{root_name}/{}", rel.display());
        let Some(KubeCgroup::Pod(pod)) = parse_path(&rel) else {
            continue;
        };
        match read_pod(pod, &cg) {
            Ok(p) => pods.push(p),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        }
    }
    pods.sort_by(|a, b| a.pod.uid.cmp(&b.pod.uid));
    Ok(pods)
}

fn read_pod(pod: PodRef, cg: &MemoryCgroup) -> Result<DiscoveredPod> {
    let pids = cg.read_procs()?;
    let mut containers = Vec::new();
    for child in cg.children()? {
        let Some(name) = child.path().file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(container) = container(name, pod.driver) else {
            continue;
        };
        match child.read_procs_bounded(MAX_GROUPS_PER_CONTAINER) {
            Ok(walk) => containers.push(DiscoveredContainer {
                container,
                path: child.path().to_path_buf(),
                pids: walk.pids,
                truncated: walk.truncated,
            }),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        }
    }
    containers.sort_by(|a, b| a.container.id.cmp(&b.container.id));
    Ok(DiscoveredPod {
        pod,
        path: cg.path().to_path_buf(),
        containers,
        pids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f5e8c3a-6b2d-4c1e-9a7f-3d2b1c0e9f8a";
    const UID_: &str = "0f5e8c3a_6b2d_4c1e_9a7f_3d2b1c0e9f8a";
    const CID: &str = "4b3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f";

    fn pod(qos: QosClass, driver: CgroupDriver) -> PodRef {
        PodRef {
            uid: UID.into(),
            qos,
            driver,
        }
    }

    fn ctr(runtime: Runtime) -> ContainerRef {
        ContainerRef {
            id: CID.into(),
            runtime,
        }
    }

    #[test]
    fn cgroupfs_layouts() {
        use CgroupDriver::Cgroupfs as D;
        for (qos, dir) in [
            (QosClass::Guaranteed, "/kubepods".to_string()),
            (QosClass::Burstable, "/kubepods/burstable".to_string()),
            (QosClass::BestEffort, "/kubepods/besteffort".to_string()),
        ] {
            assert_eq!(
                parse_path(&format!("{dir}/pod{UID}")),
                Some(KubeCgroup::Pod(pod(qos, D)))
            );
            assert_eq!(
                parse_path(&format!("{dir}/pod{UID}/{CID}")),
                Some(KubeCgroup::Container(pod(qos, D), ctr(Runtime::Containerd)))
            );
            assert_eq!(
                parse_path(&format!("{dir}/pod{UID}/crio-{CID}")),
                Some(KubeCgroup::Container(pod(qos, D), ctr(Runtime::Crio)))
            );
        }
        // Nested under a --cgroup-root, or under a scratch group in the tests.
        assert_eq!(
            parse_path(&format!(
                "/memcolo-test-1/kubepods/besteffort/pod{UID}/{CID}/"
            )),
            Some(KubeCgroup::Container(
                pod(QosClass::BestEffort, D),
                ctr(Runtime::Containerd)
            ))
        );
    }

    #[test]
    fn systemd_layouts() {
        use CgroupDriver::Systemd as D;
        for (prefix, top) in [
            ("kubepods", "/kubepods.slice".to_string()),
            (
                "kubelet-kubepods",
                "/kubelet.slice/kubelet-kubepods.slice".to_string(),
            ),
        ] {
            for (qos, dir, pprefix) in [
                (QosClass::Guaranteed, top.clone(), prefix.to_string()),
                (
                    QosClass::Burstable,
                    format!("{top}/{prefix}-burstable.slice"),
                    format!("{prefix}-burstable"),
                ),
                (
                    QosClass::BestEffort,
                    format!("{top}/{prefix}-besteffort.slice"),
                    format!("{prefix}-besteffort"),
                ),
            ] {
                let podd = format!("{dir}/{pprefix}-pod{UID_}.slice");
                assert_eq!(
                    parse_path(&podd),
                    Some(KubeCgroup::Pod(pod(qos, D))),
                    "{podd}"
                );
                for (scope, rt) in [
                    ("cri-containerd", Runtime::Containerd),
                    ("docker", Runtime::Docker),
                    ("crio", Runtime::Crio),
                ] {
                    let p = format!("{podd}/{scope}-{CID}.scope");
                    assert_eq!(
                        parse_path(&p),
                        Some(KubeCgroup::Container(pod(qos, D), ctr(rt))),
                        "{p}"
                    );
                }
                assert_eq!(parse_path(&format!("{podd}/crio-conmon-{CID}.scope")), None);
            }
        }
    }

    #[test]
    fn not_pods() {
        for p in [
            "/",
            "/kubepods",
            "/kubepods/burstable",
            "/kubepods.slice/kubepods-besteffort.slice",
            "/system.slice/containerd.service",
            "/user.slice/user-0.slice/session-1.scope",
            // Wrong separators, case, length, characters.
            &format!("/kubepods/pod{UID_}"),
            &format!("/kubepods.slice/kubepods-pod{UID}.slice"),
            &format!("/kubepods/pod{}", UID.to_uppercase()),
            "/kubepods/pod0f5e8c3a-6b2d-4c1e-9a7f-3d2b1c0e9f8",
            "/kubepods/pod../../etc",
            // A systemd pod slice under the wrong QoS slice, or a mixed layout.
            &format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{UID_}.slice"
            ),
            &format!("/kubepods/burstable/kubepods-burstable-pod{UID_}.slice"),
            // Container names that do not check.
            &format!("/kubepods/pod{UID}/{}", &CID[..11]),
            &format!("/kubepods/pod{UID}/{CID}0"),
            &format!("/kubepods/pod{UID}/{}", CID.to_uppercase()),
            &format!("/kubepods/pod{UID}/cri-containerd-{CID}.scope"),
            &format!("/kubepods.slice/kubepods-pod{UID_}.slice/{CID}"),
            &format!("/kubepods.slice/kubepods-pod{UID_}.slice/podman-{CID}.scope"),
            // Deeper than a container.
            &format!("/kubepods/pod{UID}/{CID}/sub"),
        ] {
            assert_eq!(parse_path(p), None, "{p}");
        }
    }
}
