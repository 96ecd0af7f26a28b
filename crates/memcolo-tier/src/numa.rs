//! The NUMA backend of tiering, for machines whose slow tier is memory the CPU
//! addresses directly: CPU-less memory nodes (CXL memory expanders, Optane PMEM in
//! KMEM DAX mode), as on MaxMem's testbed (§4–5). There, a slow page needs no fault
//! to be reached: pages move between nodes with `move_pages(2)`, which works on
//! another process's pages, and `/proc/PID/numa_maps` says where a region's pages sit.
//!
//! - [`NumaTopology`]: fast nodes (memory and CPUs) and slow nodes (memory without
//!   CPUs), from sysfs (`/sys/devices/system/node/has_cpu`, `has_memory`); the reader
//!   takes its root, so tests build fake trees.
//! - [`numa_maps_pages`]: pages per node of the mappings overlapping a range, from
//!   `numa_maps` text.
//! - [`PageMover`]: `move_pages(2)` behind a trait ([`LinuxMover`]); tests record
//!   calls instead.
//! - [`apply_migrations`]: carries out a MaxMem epoch's migrations for one process
//!   (demotions to a slow node, promotions to a fast node, in the policy's order, in
//!   batches) and reports the pages that did not move, so the caller can tell the
//!   policy where they really are ([`memcolo_policy::maxmem::MaxMem::set_tier`]).
//!
//! Access sampling on such machines is MaxMem's own (PEBS, §3.2); this machine has
//! neither CPU-less nodes nor PEBS, so the backend is tested with fakes only.

use memcolo_policy::maxmem::{Migration, PageId, Tier};
use memcolo_policy::Pid;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Parses a kernel node or CPU list (`0-3,8,10-11`).
///
/// # Errors
/// `InvalidData` naming the text.
pub fn parse_list(s: &str) -> io::Result<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("bad node list {s:?}"));
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(out)
}

/// Memory nodes split into tiers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaTopology {
    /// Nodes with memory and CPUs: the fast tier.
    pub fast: Vec<u32>,
    /// Nodes with memory and no CPUs: the slow tier.
    pub slow: Vec<u32>,
}

impl NumaTopology {
    /// Reads `<root>/has_cpu` and `<root>/has_memory` (root: normally
    /// `/sys/devices/system/node`).
    ///
    /// # Errors
    /// A missing or malformed file, naming it.
    pub fn read(root: &Path) -> io::Result<Self> {
        let read = |name: &str| -> io::Result<Vec<u32>> {
            let p: PathBuf = root.join(name);
            let text = std::fs::read_to_string(&p)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
            parse_list(&text).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))
        };
        let cpu = read("has_cpu")?;
        let mem = read("has_memory")?;
        Ok(NumaTopology {
            fast: mem.iter().copied().filter(|n| cpu.contains(n)).collect(),
            slow: mem.iter().copied().filter(|n| !cpu.contains(n)).collect(),
        })
    }

    /// Whether there is a slow tier at all.
    pub fn is_tiered(&self) -> bool {
        !self.fast.is_empty() && !self.slow.is_empty()
    }
}

/// Pages per node of the `numa_maps` mappings that start inside `[start, end)` (one
/// line per mapping: `ADDR policy ... N0=12 N1=30 ... kernelpagesize_kB=4`).
/// Counts are in the mapping's page size; lines that do not parse are skipped.
pub fn numa_maps_pages(text: &str, start: u64, end: u64) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(addr) = it.next().and_then(|a| u64::from_str_radix(a, 16).ok()) else {
            continue;
        };
        if addr < start || addr >= end {
            continue;
        }
        for field in it {
            if let Some((n, c)) = field.strip_prefix('N').and_then(|f| f.split_once('=')) {
                if let (Ok(n), Ok(c)) = (n.parse::<u32>(), c.parse::<u64>()) {
                    *out.entry(n).or_default() += c;
                }
            }
        }
    }
    out
}

/// `move_pages(2)` of one process.
pub trait PageMover {
    /// Moves the pages at `addrs` of `pid` to `nodes` (one per page); returns one
    /// status per page: the node it is on now, or a negative errno (`-ENOENT` for a
    /// page not present, `-EBUSY`, `-ENOMEM`, ...).
    ///
    /// # Errors
    /// The system call's error (`ESRCH`: no such process, `EPERM`).
    fn move_pages(&mut self, pid: Pid, addrs: &[u64], nodes: &[i32]) -> io::Result<Vec<i32>>;
}

/// The real `move_pages(2)` (`MPOL_MF_MOVE`: pages mapped by this process only).
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxMover;

const MPOL_MF_MOVE: libc::c_int = 1 << 1;

impl PageMover for LinuxMover {
    fn move_pages(&mut self, pid: Pid, addrs: &[u64], nodes: &[i32]) -> io::Result<Vec<i32>> {
        assert_eq!(addrs.len(), nodes.len());
        let ptrs: Vec<*mut libc::c_void> = addrs.iter().map(|&a| a as *mut libc::c_void).collect();
        let mut status = vec![0i32; addrs.len()];
        // SAFETY: the kernel reads `count` pointers and nodes and writes `count`
        // statuses, all of which are live vectors of that length.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                pid,
                addrs.len() as libc::c_ulong,
                ptrs.as_ptr(),
                nodes.as_ptr(),
                status.as_mut_ptr(),
                MPOL_MF_MOVE,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(status)
    }
}

/// What [`apply_migrations`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Pages now in the tier asked for.
    pub moved: u64,
    /// Pages that did not move, with the tier they are still in, for
    /// [`memcolo_policy::maxmem::MaxMem::set_tier`].
    pub failed: Vec<(PageId, Tier, i32)>,
}

/// Carries out the migrations of `pid` (others are skipped) in the policy's order,
/// `batch` pages per `move_pages` call (a batch never mixes directions, so every
/// demotion lands before the promotions after it). Page ids are virtual page
/// numbers of `page_bytes` pages. Demoted pages go to the slow nodes and promoted
/// ones to the fast nodes, spread round robin.
///
/// # Errors
/// The mover's error for the whole call (the process is gone, no permission); pages
/// already moved stay moved.
pub fn apply_migrations(
    mover: &mut dyn PageMover,
    topo: &NumaTopology,
    pid: Pid,
    migrations: &[Migration],
    page_bytes: u64,
    batch: usize,
) -> io::Result<Applied> {
    let mut applied = Applied::default();
    if !topo.is_tiered() {
        return Ok(applied);
    }
    let mine: Vec<&Migration> = migrations.iter().filter(|m| m.pid == pid).collect();
    let (mut next_fast, mut next_slow) = (0usize, 0usize);
    let mut i = 0;
    while i < mine.len() {
        let to = mine[i].to;
        let mut j = i;
        while j < mine.len() && mine[j].to == to && j - i < batch.max(1) {
            j += 1;
        }
        let chunk = &mine[i..j];
        let addrs: Vec<u64> = chunk.iter().map(|m| m.page * page_bytes).collect();
        let nodes: Vec<i32> = chunk
            .iter()
            .map(|_| {
                let (list, k) = match to {
                    Tier::Fast => (&topo.fast, &mut next_fast),
                    Tier::Slow => (&topo.slow, &mut next_slow),
                };
                let n = list[*k % list.len()];
                *k += 1;
                n as i32
            })
            .collect();
        let status = mover.move_pages(pid, &addrs, &nodes)?;
        for ((m, &want), &got) in chunk.iter().zip(&nodes).zip(&status) {
            if got == want {
                applied.moved += 1;
            } else {
                let still = match to {
                    Tier::Fast => Tier::Slow,
                    Tier::Slow => Tier::Fast,
                };
                applied.failed.push((m.page, still, got));
            }
        }
        i = j;
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memcolo_policy::maxmem::MigrationReason;

    #[test]
    fn lists_and_topology_from_a_fake_sysfs() {
        assert_eq!(parse_list("0-2,5,7-8\n").unwrap(), vec![0, 1, 2, 5, 7, 8]);
        assert_eq!(parse_list("\n").unwrap(), Vec::<u32>::new());
        assert!(parse_list("3-1").is_err() && parse_list("x").is_err());
        let d = tempfile_dir();
        // A two-socket machine with a CXL expander on node 2 (memory, no CPUs).
        std::fs::write(d.join("has_cpu"), "0-1\n").unwrap();
        std::fs::write(d.join("has_memory"), "0-2\n").unwrap();
        let t = NumaTopology::read(&d).unwrap();
        assert_eq!(
            t,
            NumaTopology {
                fast: vec![0, 1],
                slow: vec![2]
            }
        );
        assert!(t.is_tiered());
        // This machine: one node with everything.
        std::fs::write(d.join("has_memory"), "0\n").unwrap();
        std::fs::write(d.join("has_cpu"), "0\n").unwrap();
        assert!(!NumaTopology::read(&d).unwrap().is_tiered());
        std::fs::remove_file(d.join("has_cpu")).unwrap();
        let e = NumaTopology::read(&d).unwrap_err().to_string();
        assert!(e.contains("has_cpu"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "memcolo-numa-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn numa_maps_counts_pages_per_node_in_a_range() {
        // Lines as the kernel writes them (a region at 0x7f0000000000 split in two
        // mappings by mprotect, plus a library outside the range).
        let text = "\
7f0000000000 default anon=300 dirty=300 active=0 N0=200 N2=100 kernelpagesize_kB=4
7f0000200000 default anon=50 dirty=50 N2=50 kernelpagesize_kB=4
7f1234000000 default file=/usr/lib/x86_64-linux-gnu/libc.so.6 mapped=40 mapmax=9 N0=40 kernelpagesize_kB=4
garbage line
";
        let m = numa_maps_pages(text, 0x7f00_0000_0000, 0x7f00_4000_0000);
        assert_eq!(m, BTreeMap::from([(0, 200), (2, 150)]));
        assert!(numa_maps_pages(text, 0, 1).is_empty());
    }

    /// Records calls; refuses pages listed in `busy` (status -EBUSY).
    struct Fake {
        calls: Vec<(Pid, Vec<u64>, Vec<i32>)>,
        busy: Vec<u64>,
    }

    impl PageMover for Fake {
        fn move_pages(&mut self, pid: Pid, addrs: &[u64], nodes: &[i32]) -> io::Result<Vec<i32>> {
            self.calls.push((pid, addrs.to_vec(), nodes.to_vec()));
            Ok(addrs
                .iter()
                .zip(nodes)
                .map(|(a, &n)| {
                    if self.busy.contains(a) {
                        -libc::EBUSY
                    } else {
                        n
                    }
                })
                .collect())
        }
    }

    fn mig(pid: Pid, page: PageId, to: Tier) -> Migration {
        Migration {
            pid,
            page,
            to,
            reason: match to {
                Tier::Slow => MigrationReason::Reallocation,
                Tier::Fast => MigrationReason::Fill,
            },
        }
    }

    #[test]
    fn migrations_move_in_order_in_batches_and_failures_come_back() {
        let topo = NumaTopology {
            fast: vec![0, 1],
            slow: vec![2],
        };
        let migs = vec![
            mig(7, 10, Tier::Slow),
            mig(7, 11, Tier::Slow),
            mig(7, 12, Tier::Slow),
            mig(8, 99, Tier::Fast), // another process: skipped
            mig(7, 20, Tier::Fast),
            mig(7, 21, Tier::Fast),
        ];
        let mut f = Fake {
            calls: vec![],
            busy: vec![21 * 4096],
        };
        let a = apply_migrations(&mut f, &topo, 7, &migs, 4096, 2).unwrap();
        assert_eq!(
            f.calls,
            vec![
                (7, vec![10 * 4096, 11 * 4096], vec![2, 2]),
                (7, vec![12 * 4096], vec![2]),
                (7, vec![20 * 4096, 21 * 4096], vec![0, 1]),
            ]
        );
        assert_eq!(a.moved, 4);
        assert_eq!(a.failed, vec![(21, Tier::Slow, -libc::EBUSY)]);
        // No slow tier: nothing to do.
        let flat = NumaTopology {
            fast: vec![0],
            slow: vec![],
        };
        let mut f = Fake {
            calls: vec![],
            busy: vec![],
        };
        assert_eq!(
            apply_migrations(&mut f, &flat, 7, &migs, 4096, 8).unwrap(),
            Applied::default()
        );
        assert!(f.calls.is_empty());
    }
}
