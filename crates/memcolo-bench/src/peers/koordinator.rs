//! A re-implementation of Koordinator's BE memory eviction (koordlet's
//! `memoryevict` QoS strategy, koordinator-sh/koordinator; `NodeSLO`
//! `resourceUsedThresholdWithBE.memoryEvictThresholdPercent`), for the colocation
//! bench: when the node's memory usage without page cache crosses a threshold, kill
//! best-effort jobs until the usage they held brings the node below a lower mark.
//!
//! The algorithm, as documented: every `MemoryEvictIntervalSeconds` (1 s), outside a
//! cooling time of `MemoryEvictCoolTimeSeconds` (4 s) after the last eviction, compute
//! usage% = used × 100 / capacity (integer percent; used = usage without page cache).
//! At or above `memoryEvictThresholdPercent` (default 70), the memory to release is
//! capacity × (usage% − `memoryEvictLowerPercent`) / 100 (lower default: threshold −
//! 2). BE pods are sorted by priority (lowest first), then by memory usage (largest
//! first), and killed in that order until the sum of their usage reaches what is to
//! be released.
//!
//! Here a "pod" is one BE job (a process group), its usage the anonymous and shmem
//! resident memory of its processes (a v1 pod group's usage without cache), the
//! node's capacity the scratch node's limit and its usage `memory.usage_in_bytes`
//! minus `total_cache`. A killed job stays dead for the rest of the run (an evicted
//! pod is rescheduled elsewhere; its work on this node is lost).

use std::time::{Duration, Instant};

/// The eviction's parameters (koordlet and `NodeSLO` defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KoordinatorConfig {
    /// `memoryEvictThresholdPercent` (70).
    pub threshold_pct: u64,
    /// `memoryEvictLowerPercent` (threshold − 2).
    pub lower_pct: u64,
    /// `MemoryEvictIntervalSeconds` (1 s).
    pub interval: Duration,
    /// `MemoryEvictCoolTimeSeconds` (4 s).
    pub cool_time: Duration,
}

impl Default for KoordinatorConfig {
    fn default() -> Self {
        KoordinatorConfig {
            threshold_pct: 70,
            lower_pct: 68,
            interval: Duration::from_secs(1),
            cool_time: Duration::from_secs(4),
        }
    }
}

/// One BE job as the eviction sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BeTask {
    /// Who it is (the bench's job name).
    pub name: String,
    /// Pod priority: lower is evicted first.
    pub priority: i64,
    /// Memory usage without page cache, bytes.
    pub memory_bytes: u64,
}

/// The eviction's state: when it last evicted.
#[derive(Clone, Debug, Default)]
pub struct Koordinator {
    cfg: KoordinatorConfig,
    last_evict: Option<Instant>,
}

impl Koordinator {
    pub fn new(cfg: KoordinatorConfig) -> Self {
        Koordinator {
            cfg,
            last_evict: None,
        }
    }

    pub fn config(&self) -> &KoordinatorConfig {
        &self.cfg
    }

    /// One round at `now`: which of `tasks` to kill (by name, in kill order) with the
    /// node at `used_bytes` (without cache) of `capacity_bytes`. Empty in the cooling
    /// time, below the threshold, or with nothing to kill.
    pub fn round(
        &mut self,
        now: Instant,
        capacity_bytes: u64,
        used_bytes: u64,
        tasks: &[BeTask],
    ) -> Vec<String> {
        if let Some(t) = self.last_evict {
            if now.duration_since(t) < self.cfg.cool_time {
                return Vec::new();
            }
        }
        let victims = select_victims(&self.cfg, capacity_bytes, used_bytes, tasks);
        if !victims.is_empty() {
            self.last_evict = Some(now);
        }
        victims
    }
}

/// The jobs to kill, in order, at `used_bytes` of `capacity_bytes` (see the module
/// documentation); empty below the threshold.
pub fn select_victims(
    cfg: &KoordinatorConfig,
    capacity_bytes: u64,
    used_bytes: u64,
    tasks: &[BeTask],
) -> Vec<String> {
    if capacity_bytes == 0 {
        return Vec::new();
    }
    let usage_pct = (used_bytes as u128 * 100 / capacity_bytes as u128) as u64;
    if usage_pct < cfg.threshold_pct {
        return Vec::new();
    }
    let need =
        (capacity_bytes as u128 * usage_pct.saturating_sub(cfg.lower_pct) as u128 / 100) as u64;
    let mut order: Vec<&BeTask> = tasks.iter().collect();
    order.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.memory_bytes.cmp(&a.memory_bytes))
    });
    let mut released = 0u64;
    let mut out = Vec::new();
    for t in order {
        if released >= need {
            break;
        }
        out.push(t.name.clone());
        released = released.saturating_add(t.memory_bytes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn task(name: &str, priority: i64, memory_bytes: u64) -> BeTask {
        BeTask {
            name: name.into(),
            priority,
            memory_bytes,
        }
    }

    #[test]
    fn nothing_below_the_threshold() {
        let cfg = KoordinatorConfig::default();
        let tasks = [task("a", 0, GIB)];
        // 69.9 % rounds down to 69 %.
        assert!(select_victims(&cfg, 10 * GIB, 10 * GIB * 699 / 1000, &tasks).is_empty());
        assert!(select_victims(&cfg, 10 * GIB, 6 * GIB, &tasks).is_empty());
        assert!(select_victims(&cfg, 0, 6 * GIB, &tasks).is_empty());
    }

    #[test]
    fn largest_first_within_a_priority_until_below_the_lower_mark() {
        let cfg = KoordinatorConfig::default();
        // 80 % of 10 GiB: release 12 % = 1.2 GiB.
        let tasks = [
            task("small", 0, GIB / 2),
            task("big", 0, GIB),
            task("mid", 0, GIB * 3 / 4),
        ];
        assert_eq!(
            select_victims(&cfg, 10 * GIB, 8 * GIB, &tasks),
            vec!["big", "mid"]
        );
        // Exactly 70 %: release 2 % = 0.2 GiB, the biggest job covers it.
        assert_eq!(select_victims(&cfg, 10 * GIB, 7 * GIB, &tasks), vec!["big"]);
    }

    #[test]
    fn lower_priority_goes_first_whatever_its_size() {
        let cfg = KoordinatorConfig::default();
        let tasks = [task("big-high", 5, 4 * GIB), task("tiny-low", 1, 1 << 20)];
        let v = select_victims(&cfg, 10 * GIB, 9 * GIB, &tasks);
        assert_eq!(v, vec!["tiny-low", "big-high"]);
    }

    #[test]
    fn cooling_time_after_an_eviction() {
        let mut k = Koordinator::new(KoordinatorConfig::default());
        let t0 = Instant::now();
        let tasks = [task("a", 0, GIB), task("b", 0, GIB)];
        // 90 %: release 22 % = 2.2 GiB, both jobs (equal sizes keep their order).
        assert_eq!(k.round(t0, 10 * GIB, 9 * GIB, &tasks), vec!["a", "b"]);
        assert!(k
            .round(t0 + Duration::from_secs(3), 10 * GIB, 9 * GIB, &tasks)
            .is_empty());
        assert!(!k
            .round(t0 + Duration::from_secs(4), 10 * GIB, 9 * GIB, &tasks)
            .is_empty());
        // No eviction, no cooling: the next round may evict at once.
        let mut k = Koordinator::new(KoordinatorConfig::default());
        assert!(k.round(t0, 10 * GIB, GIB, &tasks).is_empty());
        assert!(!k.round(t0, 10 * GIB, 9 * GIB, &tasks).is_empty());
    }
}
