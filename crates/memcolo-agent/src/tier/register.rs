//! A region handed over (`tier_register`) or recovered after a crash
//! (`tier_recover`): its descriptors and mapping checked, its scope checked, its
//! tier manager started, its fault threads scheduled by the process's t_miss.

use super::config::thread_sched;
use super::connection::{err, policy_err, Conn};
use super::{lock, Region, Shared, MAX_REGIONS_PER_UID, REGION_FEATURES};
use memcolo_policy::maxmem::validate_t_miss;
use memcolo_policy::Pid;
use memcolo_proto::tier::TierReply;
use memcolo_proto::ErrorCode;
use memcolo_tier::manager::{TierConfig, TierManager};
use memcolo_tier::node::TierNode;
use memcolo_tier::region::{check_mapping, check_memfd, SharedFile, PAGE};
use memcolo_tier::shadow::Shadow;
use memcolo_tier::uffd::Uffd;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The descriptors a region comes with (`docs/protocol.md` §11).
pub(super) struct RegionFds {
    pub(super) ufd: OwnedFd,
    pub(super) memfd: OwnedFd,
    pub(super) shadow: Option<OwnedFd>,
}

impl RegionFds {
    /// Every descriptor that came with the request's line, in order: userfaultfd,
    /// memfd, and the shadow if a third came. `None` (and none taken) if fewer than
    /// `least` came.
    pub(super) fn take(fds: &mut Vec<OwnedFd>, least: usize) -> Option<RegionFds> {
        if fds.len() < least.max(2) {
            return None;
        }
        let mut it = fds.drain(..);
        let (ufd, memfd) = (it.next()?, it.next()?);
        Some(RegionFds {
            ufd,
            memfd,
            shadow: it.next(),
        })
    }
}

/// The target of a new region of `pid`: its own (`asked`), else its pod's
/// ([`super::TierDefaults`]), else `tier.default_t_miss`.
fn region_t_miss(asked: Option<f64>, pods: &super::TierDefaults, pid: Pid, default: f64) -> f64 {
    asked.or_else(|| pods.get(pid)).unwrap_or(default)
}

/// `tier_register` (`recover` None: a new region), or `tier_recover` of the region
/// whose id and slow-tier instance the dead agent gave (`recover`).
#[allow(clippy::too_many_arguments)]
pub(super) fn register(
    shared: &Arc<Shared>,
    conn: &Arc<Conn>,
    start: u64,
    length: u64,
    t_miss: Option<f64>,
    fds: RegionFds,
    recover: Option<(u64, u64)>,
) -> TierReply {
    let RegionFds { ufd, memfd, shadow } = fds;
    let (pid, uid) = (conn.pid(), conn.uid);
    if length == 0 || !start.is_multiple_of(PAGE as u64) || !length.is_multiple_of(PAGE as u64) {
        return err(
            ErrorCode::BadRequest,
            format!("region {start:#x}+{length} is not page aligned"),
        );
    }
    let t_miss = region_t_miss(t_miss, &shared.defaults, pid, shared.cfg.default_t_miss);
    if let Err(e) = validate_t_miss(t_miss) {
        return err(ErrorCode::BadRequest, e.to_string());
    }
    // Nothing is sized by the client's numbers before they are checked: the region
    // within the tier's scope, the uid's regions too, none overlapping another of
    // the process.
    if let Err(e) = check_scope(shared, conn, start, length) {
        return e;
    }
    // The descriptors are what they claim to be, and the range is the memfd's
    // mapping in the proved process.
    let ufd = match Uffd::from_untrusted_fd(ufd, REGION_FEATURES) {
        Ok(u) => u,
        Err(e) => {
            return err(
                ErrorCode::BadRequest,
                format!("the region's userfaultfd: {e}"),
            )
        }
    };
    let memfd_id = match check_memfd(memfd.as_fd()) {
        Ok(id) => id,
        Err(e) => return err(ErrorCode::BadRequest, format!("the region's memfd: {e}")),
    };
    if let Some(sh) = &shadow {
        if let Err(e) = check_memfd(sh.as_fd()) {
            return err(ErrorCode::BadRequest, format!("the region's shadow: {e}"));
        }
    }
    let maps = shared.procfs.read_pid_maps_text(pid);
    // Read while the proved process was alive: its own maps.
    if let Err(e) = conn.proc_.verify(&shared.procfs) {
        return err(
            ErrorCode::NoSuchProcess,
            format!("the connecting process: {e}"),
        );
    }
    let maps = match maps {
        Ok(m) => m,
        Err(e) => return err(ErrorCode::Internal, e.to_string()),
    };
    if let Err(why) = check_mapping(&maps, start, length, &memfd_id) {
        return err(
            ErrorCode::BadRequest,
            format!("the region is not the memfd's mapping in pid {pid}: {why}"),
        );
    }
    let pages = (length / PAGE as u64) as usize;
    // A shadow serves only a recovery, which needs the stored pages to outlive this
    // agent too: with the compressed store it would cost a write per page sampled
    // or put on probation for nothing.
    let shadow = shadow.filter(|_| shared.slow.durable());
    let shadow = match shadow.map(|fd| Shadow::new(fd, pages)).transpose() {
        Ok(s) => s,
        Err(e) => return err(ErrorCode::BadRequest, format!("the region's shadow: {e}")),
    };
    if recover.is_some() && !shared.slow.durable() {
        return err(
            ErrorCode::BadRequest,
            format!(
                "this agent's slow tier ({}) does not outlive an agent: the region's pages are not here",
                shared.slow.name()
            ),
        );
    }
    if recover.is_some() && shadow.is_none() {
        return err(
            ErrorCode::BadRequest,
            "tier_recover needs the region's shadow",
        );
    }
    let (seq, id) = match recover {
        Some((id, _)) => {
            if lock(&shared.regions).iter().any(|r| r.id == id) {
                return err(ErrorCode::BadRequest, "that region is managed already");
            }
            (shared.next_region.fetch_add(1, Ordering::Relaxed), id)
        }
        None => new_region_id(shared),
    };
    // (A shadow is kept only with a durable tier, above.)
    let durable = shadow.is_some();
    let first_page = TierNode::first_page_of(start);
    if !shared.node.lock_policy().is_managed(pid) {
        if let Err(e) = shared.node.register(pid, t_miss) {
            return policy_err(e);
        }
    }
    let mem = match SharedFile::new(memfd, start, pages) {
        Ok(m) => m,
        Err(e) => {
            return err(
                ErrorCode::Internal,
                format!("mapping the region's memfd: {e}"),
            )
        }
    };
    let tcfg = TierConfig {
        sample_pages: shared.cfg.sample_pages,
        sample_target_hits: shared.cfg.sample_target_hits,
        sample_fmmr_error: shared.cfg.sample_fmmr_error,
        evict_workers: shared.cfg.evict_workers.max(1),
        probation_pages: shared.cfg.probation_pages,
        refault_samples: shared.cfg.refault_samples,
        track_remove: true,
        ..TierConfig::new(id)
    };
    let placement = shared.node.placement(pid, first_page);
    let uffd = ufd;
    let (mem, slow, placement) = (Box::new(mem), shared.slow.clone(), Box::new(placement));
    let started = match (shadow, recover) {
        (Some(sh), Some((_, instance))) => {
            TierManager::recover(uffd, mem, slow, placement, tcfg, sh, instance)
        }
        (Some(sh), None) => TierManager::start_shadowed(uffd, mem, slow, placement, tcfg, sh),
        (None, _) => TierManager::start(uffd, mem, slow, placement, tcfg),
    };
    let m = match started {
        Ok(m) => m,
        Err(e) => {
            let what = if recover.is_some() {
                "recovering the region"
            } else {
                "starting the tier manager"
            };
            // What no retry changes (a slow tier that is not durable, or restarted and
            // empty) is the request's fault; the rest (the server unreachable for a
            // moment) may pass.
            let code = match e.kind() {
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
                    ErrorCode::BadRequest
                }
                _ => ErrorCode::Internal,
            };
            return err(code, format!("{what}: {e}"));
        }
    };
    shared.node.attach(pid, first_page, Arc::new(m));
    apply_fault_priority(shared, pid);
    lock(&shared.regions).push(Region {
        id,
        seq,
        pid,
        proc_: conn.proc_.clone(),
        uid,
        start,
        length,
        first_page,
        conn: conn.id,
        durable,
    });
    tracing::info!(
        pid,
        region = seq,
        key = id,
        start = format!("{start:#x}"),
        length,
        t_miss,
        durable,
        recovered = recover.is_some(),
        "tiering: region registered"
    );
    TierReply::TierRegistered {
        region: id,
        durable,
        slow_instance: if durable { shared.slow.instance() } else { 0 },
    }
}

/// Whether `[start, start + length)` may be managed for `conn`'s process: within the
/// tier's scope (fast plus slow capacity, `tier.fast_bytes + tier.slow_capacity_bytes`),
/// a non-root uid's regions within it too and at most [`MAX_REGIONS_PER_UID`] of
/// them, and overlapping no region of the process. A region of an earlier process
/// with the same pid still being released asks for a retry.
pub(super) fn check_scope(
    shared: &Shared,
    conn: &Conn,
    start: u64,
    length: u64,
) -> Result<(), TierReply> {
    let scope = shared
        .cfg
        .fast_bytes
        .saturating_add(shared.cfg.slow_capacity_bytes);
    let too_long = |what: String| {
        err(
            ErrorCode::BadRequest,
            format!("{what} exceeds the tier's scope of {scope} bytes (fast plus slow capacity)"),
        )
    };
    if length > scope {
        return Err(too_long(format!("a region of {length} bytes")));
    }
    let end = start.checked_add(length).ok_or_else(|| {
        err(
            ErrorCode::BadRequest,
            format!("{start:#x}+{length} wraps around"),
        )
    })?;
    let rs = lock(&shared.regions);
    let (mut bytes, mut count) = (length, 1usize);
    for r in rs.iter() {
        if r.pid == conn.pid() {
            if r.proc_.starttime_ticks() != conn.proc_.starttime_ticks() {
                return Err(err(
                    ErrorCode::Internal,
                    format!(
                        "an exited process's region with pid {} is being released; retry",
                        r.pid
                    ),
                ));
            }
            if r.start < end && start < r.start + r.length {
                return Err(err(
                    ErrorCode::BadRequest,
                    format!(
                        "{start:#x}+{length} overlaps the managed region {:#x}+{}",
                        r.start, r.length
                    ),
                ));
            }
        }
        if r.uid == conn.uid {
            bytes = bytes.saturating_add(r.length);
            count += 1;
        }
    }
    if !conn.root {
        if bytes > scope {
            return Err(too_long(format!(
                "uid {}'s regions ({bytes} bytes)",
                conn.uid
            )));
        }
        if count > MAX_REGIONS_PER_UID {
            return Err(err(
                ErrorCode::PermissionDenied,
                format!(
                    "uid {} manages {MAX_REGIONS_PER_UID} regions already (the cap)",
                    conn.uid
                ),
            ));
        }
    }
    Ok(())
}

/// A sequence number for `tier status`, and a key no region of this agent has: the
/// slow tier's key (see [`Shared::ids`]).
pub(super) fn new_region_id(shared: &Shared) -> (u64, u64) {
    loop {
        let n = shared.next_region.fetch_add(1, Ordering::Relaxed);
        // 63 bits, never 0: ids print as plain JSON numbers.
        let id = (std::hash::BuildHasher::hash_one(&shared.ids, n) >> 1).max(1);
        if !lock(&shared.regions).iter().any(|r| r.id == id) {
            return (n, id);
        }
    }
}

/// Puts the fault threads of `pid`'s regions in `SCHED_FIFO` if the process is
/// latency-critical (t_miss < 1) and `tier.lc_fault_priority` is on, else back to
/// ordinary scheduling; a best-effort process's (t_miss >= 1) fault and eviction
/// threads run at `tier.be_thread_nice` and, with `tier.be_thread_idle`,
/// `SCHED_IDLE`; every other process's at nice 0, `SCHED_OTHER`.
pub(super) fn apply_fault_priority(shared: &Shared, pid: Pid) {
    let t_miss = shared
        .node
        .lock_policy()
        .statuses()
        .iter()
        .find(|p| p.pid == pid)
        .map(|p| p.t_miss);
    let sched = thread_sched(&shared.cfg, t_miss);
    for (p, _, _, m) in shared.node.regions() {
        if p == pid {
            if let Err(e) = m.set_latency_critical(sched.fault_fifo) {
                tracing::warn!(pid, error = %e, "tiering: fault thread priority");
            }
            if let Err(e) = m.set_nice(sched.nice) {
                tracing::warn!(pid, error = %e, "tiering: tier threads' nice value");
            }
            if let Err(e) = m.set_idle(sched.idle) {
                tracing::warn!(pid, error = %e, "tiering: tier threads' SCHED_IDLE");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regions_target_is_its_own_then_its_pods_then_the_default() {
        let pods = super::super::TierDefaults::default();
        pods.replace([(7, 0.05)].into());
        assert_eq!(region_t_miss(Some(0.5), &pods, 7, 1.0), 0.5);
        assert_eq!(region_t_miss(None, &pods, 7, 1.0), 0.05);
        assert_eq!(region_t_miss(None, &pods, 8, 1.0), 1.0);
    }
}
