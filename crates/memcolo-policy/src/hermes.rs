//! Hermes' proactive file-cache advice (Hermes, Middleware'21 §3.3, §4), as a pure
//! function.
//!
//! Hermes' monitor daemon tracks the data files that batch (BE) jobs have loaded and,
//! when memory usage passes `adv_thr`, advises the kernel with
//! `posix_fadvise(POSIX_FADV_DONTNEED)` to drop their page cache, *largest file first*,
//! "until the percentage of file cache drops below the threshold or no file cache is
//! from the specified batch jobs" (§3.3). Largest first frees a large chunk at once
//! for the latency-critical (LC) services and keeps the number of advice calls low.
//!
//! memcolo states the threshold in bytes of used memory rather than as a percentage,
//! and the caller (the agent) does the I/O: it lists each BE process's open and mapped
//! files with their resident page-cache bytes (through descriptors it holds, never by
//! opening a path: see `memcolo_linux::filecache`), calls [`plan_advice`], and issues
//! the advice on the descriptor of the planned `dev`/`ino`.
//!
//! # Rules
//! - **H1** — nothing is advised while `used_bytes <= adv_thr_bytes`.
//! - **H2** — a file (identified by `dev`, `ino`) that any LC process also holds is
//!   never advised: dropping it would make the LC service refault it. When the same
//!   file is listed several times (once per holder), one listing with `held_by_lc`
//!   excludes it.
//! - **H3** — files with fewer than `min_resident_bytes` resident are skipped (an
//!   advice call would free too little to be worth it).
//! - **H4** — the rest are taken largest resident first (ties: `dev`, then `ino`,
//!   ascending), each expected to free its resident bytes, until
//!   `used_bytes - Σ expected <= adv_thr_bytes` or no file is left.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One file's page cache as seen by the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileCache {
    /// Device number of the file (`st_dev`).
    pub dev: u64,
    /// Inode number (`st_ino`).
    pub ino: u64,
    /// A path to the file, for logs only (a tenant may rename or replace it: the
    /// caller advises by `dev`/`ino`, on a descriptor it already holds).
    pub path: String,
    /// Bytes of the file resident in the page cache.
    pub resident_bytes: u64,
    /// Whether an LC process also has the file open or mapped.
    pub held_by_lc: bool,
}

/// One `posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)` to issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advice {
    /// Device number of the file (`st_dev`): with `ino`, the file to advise.
    pub dev: u64,
    /// Inode number (`st_ino`).
    pub ino: u64,
    /// The file's path from [`FileCache::path`], for logs only.
    pub path: String,
    /// Bytes the advice is expected to free: the file's resident page cache.
    pub expected_bytes: u64,
}

/// Configuration of the file-cache advice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdviceConfig {
    /// Used memory, bytes, above which BE file cache is dropped (`adv_thr`, §3.3).
    pub adv_thr_bytes: u64,
    /// Files with less page cache than this, bytes, are skipped (rule H3).
    pub min_resident_bytes: u64,
}

impl AdviceConfig {
    /// Default `min_resident_bytes`: 1 MiB.
    pub const DEFAULT_MIN_RESIDENT_BYTES: u64 = 1 << 20;
    /// Default `adv_thr` as a share of the node's memory (page cache included):
    /// 0.85, memcolo's choice; Hermes §3.3 leaves `adv_thr` to the operator.
    pub const DEFAULT_ADV_THR_RATIO: f64 = 0.85;

    /// `adv_thr_bytes` with the default minimum of 1 MiB resident per file.
    pub fn with_adv_thr(adv_thr_bytes: u64) -> Self {
        AdviceConfig {
            adv_thr_bytes,
            min_resident_bytes: Self::DEFAULT_MIN_RESIDENT_BYTES,
        }
    }
}

/// Files to drop with `POSIX_FADV_DONTNEED`, largest resident first, until
/// `used_bytes - Σ expected_bytes <= adv_thr_bytes` or no BE file is left; never a file
/// an LC process also holds. Empty when `used_bytes <= adv_thr_bytes`. Each file
/// appears at most once (listings of the same `dev`/`ino` are merged, keeping the
/// largest resident figure and the first path). Rules H1–H4 in the module docs.
pub fn plan_advice(cfg: &AdviceConfig, used_bytes: u64, files: &[FileCache]) -> Vec<Advice> {
    if used_bytes <= cfg.adv_thr_bytes {
        return Vec::new();
    }
    // Merge listings of the same file: (dev, ino) -> (path, resident, held_by_lc).
    let mut merged: BTreeMap<(u64, u64), (&str, u64, bool)> = BTreeMap::new();
    for f in files {
        let e = merged.entry((f.dev, f.ino)).or_insert((
            f.path.as_str(),
            f.resident_bytes,
            f.held_by_lc,
        ));
        e.1 = e.1.max(f.resident_bytes);
        e.2 |= f.held_by_lc;
    }
    let mut candidates: Vec<((u64, u64), &str, u64)> = merged
        .into_iter()
        .filter(|(_, (_, resident, lc))| !lc && *resident >= cfg.min_resident_bytes)
        .map(|(key, (path, resident, _))| (key, path, resident))
        .collect();
    candidates.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));

    let overshoot = used_bytes - cfg.adv_thr_bytes;
    let mut expected: u64 = 0;
    let mut plan = Vec::new();
    for ((dev, ino), path, resident) in candidates {
        if expected >= overshoot {
            break;
        }
        expected = expected.saturating_add(resident);
        plan.push(Advice {
            dev,
            ino,
            path: path.to_string(),
            expected_bytes: resident,
        });
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn file(ino: u64, resident_mib: u64, held_by_lc: bool) -> FileCache {
        FileCache {
            dev: 2049,
            ino,
            path: format!("/data/part-{ino}"),
            resident_bytes: resident_mib * MIB,
            held_by_lc,
        }
    }

    fn inos(plan: &[Advice]) -> Vec<u64> {
        plan.iter().map(|a| a.ino).collect()
    }

    fn cfg(adv_thr_mib: u64) -> AdviceConfig {
        AdviceConfig::with_adv_thr(adv_thr_mib * MIB)
    }

    fn files() -> Vec<FileCache> {
        vec![
            file(1, 100, false),
            file(2, 400, false),
            file(3, 900, true),
            file(4, 250, false),
            file(5, 50, false),
        ]
    }

    #[test]
    fn largest_resident_first_until_below_threshold() {
        // adv_thr 1000 MiB, used 1600 MiB: overshoot 600 MiB. BE files by size:
        // 2 (400), 4 (250), 1 (100), 5 (50); 3 is held by an LC process.
        // 2: 400 < 600, take; 4: 650 >= 600 after it, stop.
        let plan = plan_advice(&cfg(1000), 1600 * MIB, &files());
        assert_eq!(inos(&plan), vec![2, 4]);
        assert_eq!(plan[0].expected_bytes, 400 * MIB);
        assert_eq!(plan[0].path, "/data/part-2");
        assert_eq!(plan[0].dev, 2049);
        // Overshoot 100 MiB: the largest file alone.
        assert_eq!(
            inos(&plan_advice(&cfg(1000), 1100 * MIB, &files())),
            vec![2]
        );
    }

    #[test]
    fn lc_held_files_are_never_advised() {
        // A huge overshoot: every BE file, never 3 (900 MiB but LC-held).
        let plan = plan_advice(&cfg(0), 10_000 * MIB, &files());
        assert_eq!(inos(&plan), vec![2, 4, 1, 5]);
        // A file listed once by a BE holder and once by an LC holder is LC-held.
        let mut f = files();
        f.push(file(2, 400, true));
        assert_eq!(inos(&plan_advice(&cfg(0), 10_000 * MIB, &f)), vec![4, 1, 5]);
    }

    #[test]
    fn nothing_at_or_below_threshold() {
        assert!(plan_advice(&cfg(1000), 1000 * MIB, &files()).is_empty());
        assert!(plan_advice(&cfg(1000), 10 * MIB, &files()).is_empty());
        assert_eq!(
            inos(&plan_advice(&cfg(1000), 1000 * MIB + 1, &files())),
            vec![2]
        );
    }

    #[test]
    fn min_resident_filter() {
        // min 100 MiB: 5 (50 MiB) is skipped, 1 (exactly 100 MiB) is kept.
        let c = AdviceConfig {
            adv_thr_bytes: 0,
            min_resident_bytes: 100 * MIB,
        };
        assert_eq!(
            inos(&plan_advice(&c, 10_000 * MIB, &files())),
            vec![2, 4, 1]
        );
        // Default minimum 1 MiB: a file of 4 KiB resident is not worth a call.
        let tiny = vec![FileCache {
            resident_bytes: 4096,
            ..file(9, 0, false)
        }];
        assert!(plan_advice(&cfg(0), MIB, &tiny).is_empty());
    }

    #[test]
    fn duplicate_listings_merge_and_ties_break_by_inode() {
        // 7 listed twice (two BE holders, different resident figures: the larger
        // wins); 6 and 8 tie at 300 MiB: lower inode first.
        let f = vec![
            file(8, 300, false),
            file(7, 200, false),
            file(7, 350, false),
            file(6, 300, false),
        ];
        let plan = plan_advice(&cfg(0), 10_000 * MIB, &f);
        assert_eq!(inos(&plan), vec![7, 6, 8]);
        assert_eq!(plan[0].expected_bytes, 350 * MIB);
    }

    #[test]
    fn runs_out_of_files_before_threshold() {
        // Overshoot 5000 MiB, only 800 MiB of BE cache: advise all of it.
        let plan = plan_advice(&cfg(1000), 6000 * MIB, &files());
        let freed: u64 = plan.iter().map(|a| a.expected_bytes).sum();
        assert_eq!(freed, 800 * MIB);
        assert!(plan_advice(&cfg(1000), 6000 * MIB, &[]).is_empty());
    }
}
