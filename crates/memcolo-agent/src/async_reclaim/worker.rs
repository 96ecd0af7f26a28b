//! The reclaim workers: a pool of low-priority threads, each taking the next target
//! round-robin while the controller wants workers, running one batch on it (a
//! cgroup's reclaim or a process's page-out, with `reclaim.file_first` its clean
//! page cache first) and handing the pages the batch evicted to the controller's
//! turnaround sampler.

use super::journal::StepJournal;
use super::turnaround::{PageSource, ProcPages};
use super::{set_cpus, thread_cpu, Mechanism, Shared, Slot};
use memcolo_linux::cgroup::{CgroupVersion, MemoryCgroup};
use memcolo_linux::filecache::ProcessFiles;
use memcolo_linux::identity::ProvenProcess;
use memcolo_linux::pageout::{
    drop_file_cache, group_processes, reclaim_cgroup, reclaim_cgroup_file_first, BatchOutcome,
    FileId,
};
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::Pid;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sets the calling thread's nice value.
fn set_nice(nice: i32) {
    // SAFETY: setpriority takes no pointers; who = 0 is the calling thread on Linux.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
}

/// One worker thread's loop, until the service stops: `idx` is its number (it
/// works while `idx` is below the workers the controller wants).
pub(super) fn run(
    idx: u32,
    sh: Arc<Shared>,
    procfs: ProcFs,
    nice: Option<i32>,
    batch_bytes: u64,
    file_first: bool,
    journal: PathBuf,
) {
    set_nice(nice.unwrap_or(10));
    let mut place_gen = u64::MAX;
    let mut pages = ProcPages::new(procfs.clone());
    let mut rng = fastrand::Rng::new();
    loop {
        let (mut slot, batch, slot_idx, protected) = {
            let mut p = sh.pool.lock().unwrap();
            loop {
                if sh.stop.load(Ordering::SeqCst) {
                    return;
                }
                if idx < p.desired && p.remaining > 0 && p.slots.iter().any(|s| s.is_some()) {
                    break;
                }
                p = sh.cv.wait_timeout(p, Duration::from_millis(200)).unwrap().0;
            }
            if place_gen != p.place_gen {
                place_gen = p.place_gen;
                set_cpus(&p.place.cpus);
                set_nice(p.place.nice);
            }
            let n = p.slots.len();
            let start = p.rr % n;
            let i = (0..n)
                .map(|k| (start + k) % n)
                .find(|&i| p.slots[i].is_some())
                .unwrap();
            p.rr = i + 1;
            let slot = p.slots[i].take().unwrap();
            p.out.insert(slot.id.clone());
            let per_batch = if p.batch > 0 { p.batch } else { batch_bytes };
            let batch = per_batch.min(p.remaining);
            p.remaining -= batch;
            p.inflight += batch;
            p.active += 1;
            (slot, batch, i, file_first.then(|| p.protected.clone()))
        };
        let w0 = thread_cpu();
        let pids = slot
            .watch
            .as_ref()
            .map(|_| slot_pids(&slot, &procfs, &mut pages));
        if let (Some(w), Some(pids)) = (slot.watch.as_mut(), &pids) {
            w.arm(&mut pages, pids, &mut rng, Instant::now());
        }
        let t0 = Instant::now();
        let c0 = thread_cpu();
        let result = run_batch(&mut slot, &procfs, batch, protected.as_deref(), &journal);
        let busy = t0.elapsed();
        let cpu = thread_cpu().saturating_sub(c0);
        if let (Some(w), Some(pids)) = (slot.watch.as_mut(), &pids) {
            let end = t0 + busy;
            let w1 = thread_cpu();
            let evicted = w.evicted(&mut pages);
            pages.retain(&|p| pids.contains(&p));
            hand_over(&sh, &evicted, end, &pages);
            *sh.watch_cpu.lock().unwrap() +=
                thread_cpu().saturating_sub(w1) + c0.saturating_sub(w0);
        }
        let mut p = sh.pool.lock().unwrap();
        p.inflight -= batch;
        p.active -= 1;
        p.out.remove(&slot.id);
        p.busy += busy;
        p.cpu += cpu;
        p.batches += 1;
        match result {
            Ok(out) => {
                p.reclaimed += out.reclaimed_bytes;
                if slot_idx < p.slots.len() && p.slots[slot_idx].is_none() {
                    p.slots[slot_idx] = Some(slot);
                }
            }
            Err(e) => {
                let cause = match e.raw_os_error() {
                    _ if e.is_not_found() => "gone",
                    Some(libc::EPERM) | Some(libc::EACCES) => "refused",
                    _ => "failed",
                };
                let id = slot.id.clone();
                sh.log_once(format!("{id}:{cause}"), || {
                    format!("reclaim target {id} {cause}: {e}; dropping it")
                });
                p.dead.push(id);
            }
        }
        drop(p);
        sh.cv.notify_all();
    }
}

/// The processes whose pages a batch on `slot` may evict, each bound into `pages`
/// through its proof (the pagemap read is then that process's): the cursor's
/// process, or every process of the cgroup (none when it cannot be read).
fn slot_pids(slot: &Slot, procfs: &ProcFs, pages: &mut ProcPages) -> Vec<Pid> {
    match &slot.mech {
        Mechanism::Process(c) => {
            pages.bind(c.process());
            vec![c.pid()]
        }
        Mechanism::Cgroup(cg, _) => group_processes(cg, procfs)
            .unwrap_or_default()
            .iter()
            .filter(|p| pages.bind(p.process()))
            .map(|p| p.pid())
            .collect(),
    }
}

/// Queues pages a batch evicted at `at` for the controller's sampler; beyond the
/// queue's bound they are counted and dropped.
/// The pagemaps of their processes go along (the controller reads only those).
fn hand_over(sh: &Shared, evicted: &[(Pid, u64)], at: Instant, pages: &ProcPages) {
    if evicted.is_empty() {
        return;
    }
    let mut q = sh.evicted.lock().unwrap();
    let room = sh.evicted_cap.saturating_sub(q.len()).min(evicted.len());
    q.extend(evicted[..room].iter().map(|&(pid, addr)| (pid, addr, at)));
    drop(q);
    let mut bound = sh.evicted_pagemaps.lock().unwrap();
    for &(pid, _) in &evicted[..room] {
        if let Some(f) = pages.pagemap(pid) {
            bound.insert(pid, f);
        }
    }
    drop(bound);
    if room < evicted.len() {
        *sh.evicted_overflow.lock().unwrap() += (evicted.len() - room) as u64;
    }
}

/// One batch on `slot`. With `files_first` (the files LC processes hold, never
/// dropped), the target's clean page cache goes first, lowest file offset first
/// ([`drop_file_cache`]), and the cgroup's LRU or the pageout hand only make up the
/// rest. The target's registered processes are re-verified first: one that exited
/// or changed credentials ends the target (not found, or `EPERM`).
fn run_batch(
    slot: &mut Slot,
    procfs: &ProcFs,
    batch: u64,
    files_first: Option<&HashSet<FileId>>,
    journal: &Path,
) -> memcolo_linux::Result<BatchOutcome> {
    if let Mechanism::Cgroup(_, jobs) = &mut slot.mech {
        if !jobs.is_empty() {
            let mut last = None;
            jobs.retain(|p| match p.verify(procfs) {
                Ok(()) => true,
                Err(e) => {
                    last = Some(e);
                    false
                }
            });
            if let (true, Some(e)) = (jobs.is_empty(), last) {
                return Err(ProvenProcess::into_error(e));
            }
        }
    }
    let reclaim_cgroup =
        |cg: &MemoryCgroup, jobs: &[Arc<ProvenProcess>], bytes: u64| match files_first {
            Some(protected) => {
                let members = group_members(cg, jobs, procfs)?;
                reclaim_cgroup_file_first(cg, &members, bytes, protected)
            }
            None => reclaim_cgroup(cg, bytes),
        };
    if let (Some(protected), Mechanism::Process(c)) = (files_first, &mut slot.mech) {
        c.process()
            .verify(procfs)
            .map_err(ProvenProcess::into_error)?;
        let files = ProcessFiles::of_proven(procfs, c.process().try_clone()?, None);
        let dropped = match files.and_then(|f| drop_file_cache(&[f], batch, protected)) {
            Ok(r) => r.dropped_bytes,
            Err(memcolo_linux::Error::Unsupported { .. }) => 0,
            // Its uids are not one uid (a set-user-ID program): no files of its own,
            // its memory is still reclaimed.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => 0,
            Err(e) => return Err(e),
        };
        let rest = if dropped < batch {
            c.pageout(procfs, batch - dropped)?
        } else {
            BatchOutcome::default()
        };
        return Ok(BatchOutcome {
            reclaimed_bytes: rest.reclaimed_bytes + dropped,
            requested_bytes: batch,
        });
    }
    match &mut slot.mech {
        Mechanism::Cgroup(cg, jobs) => {
            if cg.version() == CgroupVersion::V1 {
                // Journal the limit so a restart can undo a step we die in.
                let limit = cg.read_limit()?.bytes();
                let j = StepJournal {
                    cgroup: cg.path().to_path_buf(),
                    limit,
                };
                let _ = std::fs::write(journal, serde_json::to_vec(&j).unwrap_or_default());
                let r = reclaim_cgroup(cg, jobs, batch);
                if r.is_ok() {
                    let _ = std::fs::remove_file(journal);
                }
                r
            } else {
                reclaim_cgroup(cg, jobs, batch)
            }
        }
        Mechanism::Process(c) => c.pageout(procfs, batch),
    }
}

/// The processes of `cg` whose own files a batch may drop: with `jobs` (the
/// registered processes the group is reclaimed for), those running as one of their
/// users ([`crate::registry::same_user`], the rule for killing a job's descendants);
/// without (a group the configuration names), every process of the group.
fn group_members(
    cg: &MemoryCgroup,
    jobs: &[Arc<ProvenProcess>],
    procfs: &ProcFs,
) -> memcolo_linux::Result<Vec<ProcessFiles>> {
    let mut members = group_processes(cg, procfs)?;
    if !jobs.is_empty() {
        members.retain(|m| {
            jobs.iter()
                .any(|j| crate::registry::same_user(m.process().credentials(), j.credentials()))
        });
    }
    Ok(members)
}
