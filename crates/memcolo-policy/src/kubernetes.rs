//! Kubernetes pods as memcolo classes, and which BE pods M3's kill rule evicts.
//!
//! **Class of a pod** ([`pod_class`]): the annotation [`CLASS_ANNOTATION`]
//! (`memcolo.io/class: lc|be|elastic`) first; otherwise the pod's QoS class
//! (`status.qosClass`, Kubernetes docs "Pod Quality of Service Classes"):
//! Guaranteed → [`Class::Lc`], BestEffort → [`Class::Be`], Burstable → the configured
//! class, [`Class::Lc`] by default. Why LC: a Burstable pod is what most services
//! are (requests below limits), so calling one BE would let memcolo evict a service,
//! an outage, while calling a batch job LC only costs headroom; the kubelet itself
//! evicts Burstable pods only after BestEffort ones (node-pressure eviction), and
//! Koordinator treats a Burstable pod without its QoS label as latency-sensitive
//! (LS). Batch jobs that run Burstable opt in with the annotation, or a node sets
//! `burstable_class = "be"`. An annotation with another value is not obeyed (the
//! QoS class decides) and is reported, so a typo never turns a service into BE.
//!
//! **Who may ask for more.** Pod annotations are written by whoever may create pods
//! in the namespace, so the annotation is obeyed as it is only where it asks for
//! *less* protection than the QoS class gives (LC > elastic > BE: an LC pod can be
//! made elastic or BE, an elastic one BE). An annotation that asks for *more*
//! (a BestEffort pod calling itself `lc` or `elastic`, which would take it out of
//! eviction) is obeyed only in the namespaces the operator lists in
//! `kubernetes.trusted_namespaces` (`*`: every namespace, Koordinator's behaviour
//! with its QoS label); elsewhere the QoS class decides and the refusal is reported
//! ([`ClassSource::Refused`]). A cluster may also restrict the annotation with an
//! admission policy (docs/security.md).
//!
//! **Per-pod options** ([`pod_options`]), only where a registration setting exists:
//! `memcolo.io/notify` (`signal` or `none`: M3's real-time signals to the pod's
//! processes, or none), `memcolo.io/expected-reclaim-bytes` (M3 §5.1's expected
//! reclamation per signal) and `memcolo.io/t-miss` (MaxMem §3's target fast-memory
//! miss ratio of the pod's tiered regions, in ]0, 1]).
//!
//! **Eviction** ([`pick_evictions`]): M3's kill rule (R5, M3 §5.1) on pods: once
//! usage has been above top for `kill_after`, BE pods are taken in order until the
//! memory they hold covers the overshoot `used − top`. The order is the pods'
//! Kubernetes priority (`spec.priority`), lowest first, as the kubelet's
//! node-pressure eviction and Koordinator's BE eviction order them; among equal
//! priorities M3's newest-first (the paper's choice). LC and elastic pods are never
//! picked.

use crate::types::Class;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The annotation that names a pod's class.
pub const CLASS_ANNOTATION: &str = "memcolo.io/class";
/// The annotation that sets how a pod's processes are notified (`signal`, `none`).
pub const NOTIFY_ANNOTATION: &str = "memcolo.io/notify";
/// The annotation that sets a pod's expected reclamation per signal, in bytes.
pub const EXPECTED_RECLAIM_ANNOTATION: &str = "memcolo.io/expected-reclaim-bytes";
/// The annotation that sets the target miss ratio of a pod's tiered regions.
pub const T_MISS_ANNOTATION: &str = "memcolo.io/t-miss";

/// A pod's Kubernetes QoS class (`status.qosClass`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    /// The name the API server uses in `status.qosClass`.
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }

    /// Parses `status.qosClass` (`Guaranteed`, `Burstable`, `BestEffort`).
    pub fn from_api(s: &str) -> Option<QosClass> {
        match s {
            "Guaranteed" => Some(QosClass::Guaranteed),
            "Burstable" => Some(QosClass::Burstable),
            "BestEffort" => Some(QosClass::BestEffort),
            _ => None,
        }
    }
}

/// What decided a pod's class.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum ClassSource {
    /// The `memcolo.io/class` annotation.
    Annotation,
    /// The QoS class; `ignored_annotation` holds an annotation value that did not parse.
    Qos { ignored_annotation: Option<String> },
    /// The QoS class: the annotation asked for the more protected class `asked`, and
    /// the pod's namespace is not one the operator trusts to do so.
    Refused { asked: Class },
}

/// How much a class protects a pod from memcolo: BE (evicted, advised, reclaimed
/// first) < elastic (asked to shrink, never evicted) < LC.
pub fn protection(class: Class) -> u8 {
    match class {
        Class::Be => 0,
        Class::Elastic => 1,
        Class::Lc => 2,
    }
}

/// Whether pods of `namespace` may raise their class by annotation: it is listed in
/// `trusted`, or `trusted` holds `*`.
pub fn namespace_trusted(namespace: &str, trusted: &[String]) -> bool {
    trusted.iter().any(|t| t == "*" || t == namespace)
}

/// The class of a pod with these annotations and QoS class; `burstable` is the class
/// of a Burstable pod without the annotation; `trusted` says whether the pod's
/// namespace may ask for more protection than its QoS class gives
/// ([`namespace_trusted`]).
pub fn pod_class(
    annotations: &BTreeMap<String, String>,
    qos: QosClass,
    burstable: Class,
    trusted: bool,
) -> (Class, ClassSource) {
    let by_qos = match qos {
        QosClass::Guaranteed => Class::Lc,
        QosClass::BestEffort => Class::Be,
        QosClass::Burstable => burstable,
    };
    let mut ignored = None;
    if let Some(v) = annotations.get(CLASS_ANNOTATION) {
        let asked = match v.trim() {
            "lc" => Some(Class::Lc),
            "be" => Some(Class::Be),
            "elastic" => Some(Class::Elastic),
            _ => None,
        };
        match asked {
            Some(c) if trusted || protection(c) <= protection(by_qos) => {
                return (c, ClassSource::Annotation)
            }
            Some(c) => return (by_qos, ClassSource::Refused { asked: c }),
            None => ignored = Some(v.chars().take(64).collect()),
        }
    }
    (
        by_qos,
        ClassSource::Qos {
            ignored_annotation: ignored,
        },
    )
}

/// How a pod's processes hear of memory pressure (`memcolo.io/notify`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum PodNotify {
    /// Not notified (the default: a container's program does not speak the protocol).
    #[default]
    None,
    /// M3's real-time signals (SIGRTMIN+1/+2/+3 for low/high/top).
    Signal,
}

/// Per-pod options read from annotations.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PodOptions {
    pub notify: PodNotify,
    /// Expected reclamation per signal, bytes (M3 §5.1).
    pub expected_reclaim_bytes: Option<u64>,
    /// Target fast-memory miss ratio of the pod's tiered regions (MaxMem §3), in
    /// ]0, 1]; a region's own `t_miss` at registration wins.
    pub t_miss: Option<f64>,
    /// Annotations that were present but did not parse: `(key, value)`, values cut to
    /// 64 characters.
    pub ignored: Vec<(String, String)>,
}

/// The per-pod options of a pod with these annotations.
pub fn pod_options(annotations: &BTreeMap<String, String>) -> PodOptions {
    let mut o = PodOptions::default();
    let cut = |v: &str| v.chars().take(64).collect::<String>();
    if let Some(v) = annotations.get(NOTIFY_ANNOTATION) {
        match v.trim() {
            "signal" => o.notify = PodNotify::Signal,
            "none" => o.notify = PodNotify::None,
            _ => o.ignored.push((NOTIFY_ANNOTATION.into(), cut(v))),
        }
    }
    if let Some(v) = annotations.get(EXPECTED_RECLAIM_ANNOTATION) {
        match v.trim().parse::<u64>() {
            Ok(b) => o.expected_reclaim_bytes = Some(b),
            Err(_) => o.ignored.push((EXPECTED_RECLAIM_ANNOTATION.into(), cut(v))),
        }
    }
    if let Some(v) = annotations.get(T_MISS_ANNOTATION) {
        match v.trim().parse::<f64>() {
            Ok(t) if crate::maxmem::validate_t_miss(t).is_ok() => o.t_miss = Some(t),
            _ => o.ignored.push((T_MISS_ANNOTATION.into(), cut(v))),
        }
    }
    o
}

/// A pod as [`pick_evictions`] sees it in a poll.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// `metadata.uid`.
    pub uid: String,
    pub class: Class,
    /// `spec.priority`; 0 when the API server has not told it (the default priority).
    pub priority: i32,
    /// When the pod's oldest process started, same epoch as the caller's clock.
    pub started_at: Duration,
    /// Memory the pod's group holds (its working set), bytes.
    pub memory_bytes: u64,
}

/// M3's kill rule on pods: the BE pods to evict, in order, when usage `used_bytes` is
/// above `top_bytes` (none otherwise). Pods in `already` (evictions still in flight)
/// are not picked again, but the memory they hold counts toward the overshoot, so a
/// new eviction happens only when those already asked for are not enough.
pub fn pick_evictions(
    pods: &[PodView],
    used_bytes: u64,
    top_bytes: u64,
    already: &[String],
) -> Vec<String> {
    if used_bytes <= top_bytes {
        return Vec::new();
    }
    let overshoot = used_bytes - top_bytes;
    let mut be: Vec<&PodView> = pods.iter().filter(|p| p.class == Class::Be).collect();
    be.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.started_at.cmp(&a.started_at))
            .then(a.uid.cmp(&b.uid))
    });
    let mut covered: u64 = pods
        .iter()
        .filter(|p| already.contains(&p.uid))
        .map(|p| p.memory_bytes)
        .fold(0, u64::saturating_add);
    let mut out = Vec::new();
    for p in be {
        if covered >= overshoot {
            break;
        }
        if already.contains(&p.uid) {
            continue;
        }
        out.push(p.uid.clone());
        covered = covered.saturating_add(p.memory_bytes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn annotation_first_then_qos() {
        use QosClass::*;
        let none = ann(&[]);
        assert_eq!(pod_class(&none, Guaranteed, Class::Be, false).0, Class::Lc);
        assert_eq!(pod_class(&none, BestEffort, Class::Lc, false).0, Class::Be);
        assert_eq!(pod_class(&none, Burstable, Class::Lc, false).0, Class::Lc);
        assert_eq!(pod_class(&none, Burstable, Class::Be, false).0, Class::Be);
        // In a trusted namespace the annotation decides, whatever the QoS class.
        for (v, c) in [
            ("lc", Class::Lc),
            ("be", Class::Be),
            ("elastic", Class::Elastic),
        ] {
            for q in [Guaranteed, Burstable, BestEffort] {
                assert_eq!(
                    pod_class(&ann(&[(CLASS_ANNOTATION, v)]), q, Class::Lc, true),
                    (c, ClassSource::Annotation)
                );
            }
        }
        // A value that does not parse is not obeyed, and is reported.
        let (c, src) = pod_class(
            &ann(&[(CLASS_ANNOTATION, "BE ")]),
            Guaranteed,
            Class::Lc,
            true,
        );
        assert_eq!(c, Class::Lc);
        assert_eq!(
            src,
            ClassSource::Qos {
                ignored_annotation: Some("BE ".into())
            }
        );
    }

    /// The attack: a tenant's BestEffort batch pod annotated `lc` (or `elastic`) to
    /// escape eviction. Outside the trusted namespaces it stays BE; asking for less
    /// protection is obeyed everywhere.
    #[test]
    fn an_untrusted_pod_cannot_raise_its_class() {
        use QosClass::*;
        for asked in [Class::Lc, Class::Elastic] {
            let a = ann(&[(CLASS_ANNOTATION, asked.as_str())]);
            assert_eq!(
                pod_class(&a, BestEffort, Class::Lc, false),
                (Class::Be, ClassSource::Refused { asked })
            );
            assert_eq!(
                pod_class(&a, Burstable, Class::Be, false),
                (Class::Be, ClassSource::Refused { asked })
            );
        }
        let a = ann(&[(CLASS_ANNOTATION, "lc")]);
        assert_eq!(
            pod_class(&a, Guaranteed, Class::Lc, false),
            (Class::Lc, ClassSource::Annotation)
        );
        // Less protection: obeyed without trust.
        for (v, q, c) in [
            ("be", Guaranteed, Class::Be),
            ("elastic", Guaranteed, Class::Elastic),
            ("be", Burstable, Class::Be),
            ("be", BestEffort, Class::Be),
        ] {
            assert_eq!(
                pod_class(&ann(&[(CLASS_ANNOTATION, v)]), q, Class::Lc, false),
                (c, ClassSource::Annotation)
            );
        }
        let list = vec!["batch".to_string(), "prod".to_string()];
        assert!(namespace_trusted("prod", &list));
        assert!(!namespace_trusted("tenant-a", &list));
        assert!(!namespace_trusted("prod", &[]));
        assert!(namespace_trusted("tenant-a", &["*".to_string()]));
    }

    #[test]
    fn options_from_annotations() {
        assert_eq!(pod_options(&ann(&[])), PodOptions::default());
        let o = pod_options(&ann(&[
            (NOTIFY_ANNOTATION, "signal"),
            (EXPECTED_RECLAIM_ANNOTATION, "1048576"),
        ]));
        assert_eq!(o.notify, PodNotify::Signal);
        assert_eq!(o.expected_reclaim_bytes, Some(1 << 20));
        assert_eq!(
            pod_options(&ann(&[(T_MISS_ANNOTATION, "0.05")])).t_miss,
            Some(0.05)
        );
        let o = pod_options(&ann(&[
            (NOTIFY_ANNOTATION, "socket"),
            (EXPECTED_RECLAIM_ANNOTATION, "-1"),
            (T_MISS_ANNOTATION, "1.5"),
        ]));
        assert_eq!(o.notify, PodNotify::None);
        assert_eq!(o.expected_reclaim_bytes, None);
        assert_eq!(o.t_miss, None);
        assert_eq!(o.ignored.len(), 3);
    }

    fn pv(uid: &str, class: Class, priority: i32, started_s: u64, mib: u64) -> PodView {
        PodView {
            uid: uid.into(),
            class,
            priority,
            started_at: Duration::from_secs(started_s),
            memory_bytes: mib << 20,
        }
    }

    #[test]
    fn evicts_lowest_priority_be_first_never_lc() {
        let pods = vec![
            pv("lc", Class::Lc, -100, 50, 900),
            pv("el", Class::Elastic, -100, 50, 900),
            pv("be-hi", Class::Be, 1000, 40, 100),
            pv("be-lo", Class::Be, -10, 10, 100),
            pv("be-mid-old", Class::Be, 0, 5, 100),
            pv("be-mid-new", Class::Be, 0, 30, 100),
        ];
        let top = 1000 << 20;
        assert!(pick_evictions(&pods, top, top, &[]).is_empty());
        assert_eq!(pick_evictions(&pods, top + (50 << 20), top, &[]), ["be-lo"]);
        assert_eq!(
            pick_evictions(&pods, top + (150 << 20), top, &[]),
            ["be-lo", "be-mid-new"]
        );
        // In flight: counted, not picked again.
        assert!(pick_evictions(&pods, top + (50 << 20), top, &["be-lo".into()]).is_empty());
        assert_eq!(
            pick_evictions(&pods, top + (150 << 20), top, &["be-lo".into()]),
            ["be-mid-new"]
        );
        // Whatever the overshoot, never an LC or elastic pod.
        let all = pick_evictions(&pods, u64::MAX, top, &[]);
        assert_eq!(all, ["be-lo", "be-mid-new", "be-mid-old", "be-hi"]);
    }

    #[test]
    fn qos_names_round_trip() {
        for q in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            assert_eq!(QosClass::from_api(q.as_str()), Some(q));
        }
        assert_eq!(QosClass::from_api("guaranteed"), None);
    }
}
