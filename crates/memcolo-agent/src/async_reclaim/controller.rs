//! The reclaim controller: one thread that ticks every `reclaim.tick_ms` (every
//! `reclaim.idle_tick_ms` while idle with margin), rebuilds the target slots from the
//! core's snapshots, samples the scope itself (the fast path of
//! `docs/architecture.md`), asks [`ReclaimScheduler`] how many workers to run, and
//! publishes status and metrics.

use super::turnaround::{
    EvictionWatch, ProcPages, TurnaroundConfig, TurnaroundSampler, TurnaroundSummary,
};
use super::{set_cpus, thread_cpu, Mechanism, ReclaimTarget, Shared, Slot, TargetStatus};
use crate::config::AgentConfig;
use crate::metrics::Metrics;
use crate::snapshot::{NodeSnapshot, SnapshotRx};
use memcolo_linux::cgroup::MemoryCgroup;
use memcolo_linux::identity::ProvenProcess;
use memcolo_linux::pageout::{PageoutCursor, VmaKind};
use memcolo_linux::procfs::ProcFs;
use memcolo_linux::scope::Scope;
use memcolo_policy::hermit::{worker_placement, TargetRules};
use memcolo_policy::hermit::{
    ReclaimDecision, ReclaimObservation, ReclaimScheduler, SampledTurnaround,
};
use memcolo_policy::{Class, Pid};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Resident pages each target's [`EvictionWatch`] holds around a batch.
const WATCH_PAGES: usize = 64;

/// How often the reclaim targets are rebuilt when nothing in the snapshot changed them.
const MEMBERSHIP_PERIOD: Duration = Duration::from_secs(10);

/// What the target slots are built from: the targets (pid, start time, class), the
/// LC processes and the CPUs the agent may use, as one snapshot gives them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Membership {
    targets: Vec<(Pid, u64, Class)>,
    lc_pids: BTreeSet<Pid>,
    cpus: Option<Vec<usize>>,
}

impl Membership {
    fn of(snap: &NodeSnapshot) -> Membership {
        let mut targets: Vec<(Pid, u64, Class)> = snap
            .targets
            .iter()
            .map(|t| (t.pid(), t.process.starttime_ticks(), t.class))
            .collect();
        targets.sort_unstable_by_key(|t| t.0);
        Membership {
            targets,
            lc_pids: snap.lc_pids.clone(),
            cpus: snap.cpus.clone(),
        }
    }
}

/// Where a target's reclaimable bytes are read: its memory cgroup's usage, or a
/// process's RSS as the latest snapshot has it.
#[derive(Clone, Debug)]
enum Source {
    Cgroup(MemoryCgroup),
    Process(Pid),
}

impl Source {
    fn bytes(&self, snap: &NodeSnapshot) -> u64 {
        match self {
            Source::Cgroup(cg) => cg.read_usage_bytes().unwrap_or(0),
            Source::Process(pid) => snap.rss_bytes.get(pid).copied().unwrap_or(0),
        }
    }
}

/// CPUs `pid` may run on, `None` when unreadable.
fn affinity_of(pid: Pid) -> Option<BTreeSet<usize>> {
    use nix::sched::{sched_getaffinity, CpuSet};
    let set = sched_getaffinity(nix::unistd::Pid::from_raw(pid)).ok()?;
    Some(
        (0..CpuSet::count().min(1024))
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
    )
}

/// The controller: senses, decides, and sizes the pool.
pub(super) struct Controller {
    cfg: AgentConfig,
    scope: Scope,
    procfs: ProcFs,
    sched: ReclaimScheduler,
    budget_max: u32,
    /// Online CPUs of the machine.
    online: usize,
    metrics: Arc<Metrics>,
    page_size: u64,
    last_refaults: Option<u64>,
    /// Pages charged to the scope at the previous observation (v1 `total_pgpgin`).
    last_charged: Option<u64>,
    /// The scope's limit failures (v1 `memory.failcnt`, v2 `memory.events` max) and
    /// the bytes memcolo's core dropped or elastic processes reported freeing, at the
    /// previous observation.
    last_failures: Option<u64>,
    last_removed: Option<u64>,
    last_refresh: Option<Instant>,
    /// What the target slots were last built from, and when (see [`Membership`]).
    membership: Option<(Membership, Instant)>,
    /// Where the reclaimable bytes of the current targets are read from.
    sources: Vec<Source>,
    /// Where the core's snapshots arrive, and the latest one taken.
    snapshots: SnapshotRx,
    snap: Arc<NodeSnapshot>,
    reclaimable: u64,
    totals: Totals,
    memory_mount: Option<PathBuf>,
    cpus_applied: Option<Option<Vec<usize>>>,
    /// Follows evicted pages until they refault; `None` when sampling is off.
    sampler: Option<TurnaroundSampler>,
    pages: ProcPages,
    sample_cpu: Duration,
    /// The sampled distribution as of the last poll, published with the decision it
    /// steered so that a status snapshot is consistent.
    sampled_summary: Option<TurnaroundSummary>,
    /// When the previous step ran (the controller's clock).
    last_step: Option<Duration>,
}

#[derive(Default)]
struct Totals {
    reclaimed: u64,
    cpu: Duration,
    batches: u64,
    refault_rate: f64,
}

impl Controller {
    pub(super) fn new(
        cfg: &AgentConfig,
        scope: Scope,
        snapshots: SnapshotRx,
        budget: u32,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Controller> {
        let procfs = ProcFs::new(cfg.procfs.clone());
        let memory_mount = memcolo_linux::cgroup::v1_memory_mount(&procfs)
            .or_else(|_| memcolo_linux::cgroup::cgroup2_mount(&procfs))
            .ok();
        Ok(Controller {
            sched: ReclaimScheduler::new(cfg.reclaim.scheduler_config(budget))
                .map_err(|e| anyhow::anyhow!("reclaim: {e}"))?,
            budget_max: budget,
            // SAFETY: sysconf has no memory-safety preconditions.
            online: unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize,
            cfg: cfg.clone(),
            scope,
            procfs,
            metrics,
            page_size: ProcFs::page_size(),
            last_refaults: None,
            last_charged: None,
            last_failures: None,
            last_removed: None,
            last_refresh: None,
            membership: None,
            sources: Vec::new(),
            snap: snapshots.latest(),
            snapshots,
            reclaimable: 0,
            totals: Totals::default(),
            memory_mount,
            cpus_applied: None,
            sampler: (cfg.reclaim.turnaround_samples > 0).then(|| {
                TurnaroundSampler::new(TurnaroundConfig {
                    capacity: cfg.reclaim.turnaround_samples,
                    poll: Duration::from_millis(cfg.reclaim.turnaround_poll_ms),
                    horizon: Duration::from_secs(cfg.reclaim.turnaround_horizon_s),
                    ..Default::default()
                })
            }),
            pages: ProcPages::new(ProcFs::new(cfg.procfs.clone())),
            sample_cpu: Duration::ZERO,
            sampled_summary: None,
            last_step: None,
        })
    }

    pub(super) fn run(mut self, sh: Arc<Shared>) {
        let epoch = Instant::now();
        let mut next = Instant::now();
        while !sh.stop.load(Ordering::SeqCst) {
            // The scheduler says when to look again: every `tick_ms` while engaged,
            // every `idle_tick_ms` while idle with margin (hermit `next_tick`).
            next += self.tick(&sh, epoch.elapsed());
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
        }
        let mut p = sh.pool.lock().unwrap();
        p.desired = 0;
        p.remaining = 0;
    }

    /// Memory cgroup of `pid`, when it is a real group (not the root). Read by pid:
    /// only for the LC processes a group must not hold (a wrong answer only spares a
    /// group); a target's group is [`Controller::cgroup_of_target`].
    fn cgroup_of(&self, pid: Pid) -> Option<MemoryCgroup> {
        let lines = self.procfs.read_pid_cgroup(pid).ok()?;
        self.memory_group(&lines)
    }

    /// Memory cgroup of the proven process `p`: `/proc/PID/cgroup` read by pid, then
    /// `p` verified (alive, same credentials), which proves the file was its own.
    fn cgroup_of_target(&self, p: &ProvenProcess) -> Option<MemoryCgroup> {
        let lines = self.procfs.read_pid_cgroup(p.pid()).ok()?;
        p.verify(&self.procfs).ok()?;
        self.memory_group(&lines)
    }

    fn memory_group(&self, lines: &[memcolo_linux::procfs::CgroupLine]) -> Option<MemoryCgroup> {
        let mount = self.memory_mount.as_ref()?;
        let v1 = lines
            .iter()
            .find(|l| l.controllers.iter().any(|c| c == "memory"));
        let line = v1.or_else(|| lines.iter().find(|l| l.hierarchy_id == 0))?;
        let rel = line.path.trim_start_matches('/');
        if rel.is_empty() {
            return None;
        }
        MemoryCgroup::open(mount.join(rel)).ok()
    }

    /// Rebuilds the target slots from the latest snapshot (once a second, or when the
    /// core published a new one).
    fn refresh(&mut self, sh: &Shared) {
        let fresh = self.snapshots.newer();
        let due = self
            .last_refresh
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if fresh.is_none() && !due {
            return;
        }
        if let Some(f) = fresh {
            self.snap = f;
        }
        self.last_refresh = Some(Instant::now());
        // The slots are rebuilt (cgroups read and proved, LC files listed, CPU masks
        // read: the reclaim thread's costliest work with many processes) only when the
        // registry's targets, LC processes or CPUs changed, a target died, or every
        // MEMBERSHIP_PERIOD (a process may move to another cgroup or open other
        // files); otherwise only the reclaimable bytes are brought up to date.
        let key = Membership::of(&self.snap);
        let dead = !sh.pool.lock().unwrap().dead.is_empty();
        let stale = match &self.membership {
            Some((k, at)) => *k != key || at.elapsed() >= MEMBERSHIP_PERIOD,
            None => true,
        };
        if !stale && !dead {
            self.reclaimable = self.sources.iter().map(|s| s.bytes(&self.snap)).sum();
            return;
        }
        self.membership = Some((key, Instant::now()));
        let rc = &self.cfg.reclaim;
        let scope_path = match &self.scope {
            Scope::Cgroup(cg) => Some(cg.path().to_path_buf()),
            Scope::Host(_) => None,
        };
        let lc_groups: Vec<PathBuf> = self
            .snap
            .lc_pids
            .iter()
            .filter_map(|&p| self.cgroup_of(p).map(|c| c.path().to_path_buf()))
            .collect();
        if rc.file_first && !rc.allow_lc {
            let mut protected = HashSet::new();
            for &pid in &self.snap.lc_pids {
                for f in self.procfs.read_pid_files(pid).unwrap_or_default() {
                    protected.insert((f.dev, f.ino));
                }
            }
            let mut p = sh.pool.lock().unwrap();
            if *p.protected != protected {
                p.protected = Arc::new(protected);
            }
        }
        let rules = TargetRules {
            include_elastic: rc.include_elastic,
            allow_lc: rc.allow_lc,
        };
        let steppable =
            |path: &Path| rules.may_reclaim_group(path, scope_path.as_deref(), &lc_groups);
        type Wanted = (
            Class,
            Option<(MemoryCgroup, Vec<Arc<ProvenProcess>>)>,
            Option<Arc<ProvenProcess>>,
        );
        let mut wanted: BTreeMap<String, Wanted> = BTreeMap::new();
        let mut order: Vec<ReclaimTarget> = self.snap.targets.clone();
        order.sort_by_key(|t| TargetRules::rank(t.class));
        for ReclaimTarget { process, class } in order {
            let pid = process.pid();
            if !rules.eligible(class, self.snap.lc_pids.contains(&pid)) {
                continue;
            }
            let cg = if rc.mechanism != "process" {
                self.cgroup_of_target(&process)
                    .filter(|c| steppable(c.path()))
            } else {
                None
            };
            match cg {
                Some(cg) => {
                    let w = wanted
                        .entry(format!("cgroup:{}", cg.path().display()))
                        .or_insert((class, Some((cg, Vec::new())), None));
                    if let Some((_, jobs)) = &mut w.1 {
                        jobs.push(process);
                    }
                }
                None if rc.mechanism == "cgroup" => {
                    sh.log_once(format!("nocg:{pid}"), || {
                        format!("reclaim: pid {pid} has no memory cgroup of its own without LC processes; mechanism = cgroup leaves it alone")
                    });
                }
                None => {
                    wanted.insert(format!("pid:{pid}"), (class, None, Some(process)));
                }
            }
        }
        for path in &rc.cgroups {
            match MemoryCgroup::open(path) {
                Ok(cg) if steppable(cg.path()) => {
                    wanted
                        .entry(format!("cgroup:{}", path.display()))
                        .or_insert((Class::Be, Some((cg, Vec::new())), None));
                }
                Ok(_) => sh.log_once(format!("cgunsafe:{}", path.display()), || {
                    format!("reclaim: cgroup {} holds an LC process or is not inside the scope; not reclaiming it", path.display())
                }),
                Err(e) => sh.log_once(format!("cgmissing:{}", path.display()), || {
                    format!("reclaim: cgroup {}: {e}", path.display())
                }),
            }
        }
        // Reconcile with the pool: keep slots (and their clock hands) of targets still
        // wanted, add new ones, drop the rest and the dead.
        let mut p = sh.pool.lock().unwrap();
        let dead: Vec<String> = std::mem::take(&mut p.dead);
        let mut have: BTreeSet<String> = p.out.clone();
        let mut busy = 0;
        for s in p.slots.iter_mut() {
            match s {
                Some(slot) if wanted.contains_key(&slot.id) => {
                    have.insert(slot.id.clone());
                }
                Some(_) => *s = None,
                None => busy += 1,
            }
        }
        // Busy slots are out with a worker; they come back to their index. Only
        // compact when none is out.
        if busy == 0 {
            p.slots.retain(|s| s.is_some());
        }
        let mut sources = Vec::with_capacity(wanted.len());
        for (id, (class, cg, proc_)) in wanted {
            if let Some((cg, _)) = &cg {
                sources.push(Source::Cgroup(cg.clone()));
            } else if let Some(p) = &proc_ {
                sources.push(Source::Process(p.pid()));
            }
            if have.contains(&id) || dead.contains(&id) {
                continue;
            }
            let mech = match (cg, proc_) {
                (Some((cg, jobs)), _) => Mechanism::Cgroup(cg, jobs),
                (None, Some(p)) => Mechanism::Process(PageoutCursor::new(p, VmaKind::All)),
                (None, None) => continue,
            };
            let watch = self
                .sampler
                .is_some()
                .then(|| EvictionWatch::new(WATCH_PAGES));
            p.slots.push(Some(Slot {
                id,
                mech,
                class,
                watch,
            }));
        }
        self.reclaimable = sources.iter().map(|s| s.bytes(&self.snap)).sum();
        self.sources = sources;
        let mut target_cpus = BTreeSet::new();
        for t in &self.snap.targets {
            if let Some(c) = affinity_of(t.pid()) {
                target_cpus.extend(c);
            }
        }
        let place = worker_placement(
            rc.nice,
            &self.snap.cpus,
            !self.snap.lc_pids.is_empty(),
            &target_cpus,
            self.online,
        );
        if p.place != place || p.place_gen == 0 {
            p.place = place;
            p.place_gen += 1;
        }
        let targets: Vec<TargetStatus> = p
            .slots
            .iter()
            .flatten()
            .map(|s| TargetStatus {
                id: s.id.clone(),
                class: s.class.to_string(),
                mechanism: s.mechanism_name().into(),
            })
            .collect();
        drop(p);
        sh.status.lock().unwrap().targets = targets;
    }

    /// The scope's figures, sampled now (the 20 ms fast path: see
    /// `docs/architecture.md`), turned into the scheduler's observation: counters
    /// become the increments since the previous tick.
    fn observe(&mut self) -> memcolo_linux::Result<ReclaimObservation> {
        let s = self.scope.sample_with_host(&self.procfs)?;
        let (limit, used, swapped, refaults, charged, failures) = (
            s.total_bytes,
            s.used_bytes,
            s.swap_used_bytes,
            s.refault_anon_pages,
            s.charged_pages,
            s.limit_failures,
        );
        let swapin = match self.last_refaults {
            Some(prev) => refaults.saturating_sub(prev) * self.page_size,
            None => 0,
        };
        self.last_refaults = Some(refaults);
        let charged_bytes = match (self.last_charged, charged) {
            (Some(prev), Some(now)) => Some(now.saturating_sub(prev) * self.page_size),
            _ => None,
        };
        self.last_charged = charged;
        let limit_failures = match (self.last_failures, failures) {
            (Some(prev), Some(now)) => now.saturating_sub(prev),
            _ => 0,
        };
        self.last_failures = failures;
        // Page cache the core dropped on Hermes advice and memory elastic processes
        // reported freeing: taken out of the scope, so usage growth alone would
        // understate allocation by it.
        let removed =
            self.metrics.file_cache_dropped_bytes.get() + self.metrics.reported_reclaimed_bytes();
        let removed_bytes = removed.saturating_sub(self.last_removed.unwrap_or(removed));
        self.last_removed = Some(removed);
        Ok(ReclaimObservation {
            limit_bytes: limit,
            used_bytes: used,
            swapin_bytes: swapin,
            charged_bytes,
            removed_bytes,
            limit_failures,
            swapped_bytes: swapped,
            swap_total_bytes: s.host_swap_total_bytes,
            swap_free_bytes: s.host_swap_free_bytes,
            reclaimable_bytes: self.reclaimable,
            ..Default::default()
        })
    }

    /// Hands the pages workers saw evicted to the sampler and, when due, polls the
    /// followed pages; publishes the distribution.
    fn sample(&mut self, sh: &Shared) {
        let Some(sampler) = self.sampler.as_mut() else {
            return;
        };
        let c0 = thread_cpu();
        let queued = std::mem::take(&mut *sh.evicted.lock().unwrap());
        for (pid, f) in std::mem::take(&mut *sh.evicted_pagemaps.lock().unwrap()) {
            self.pages.adopt(pid, f);
        }
        let overflow = std::mem::take(&mut *sh.evicted_overflow.lock().unwrap());
        self.sample_cpu += std::mem::take(&mut *sh.watch_cpu.lock().unwrap());
        let mut i = 0;
        while i < queued.len() {
            let at = queued[i].2;
            let j = queued[i..]
                .iter()
                .position(|e| e.2 != at)
                .map_or(queued.len(), |k| i + k);
            let pages: Vec<(Pid, u64)> = queued[i..j].iter().map(|e| (e.0, e.1)).collect();
            sampler.admit(&pages, at);
            i = j;
        }
        sampler.note_rejected(overflow);
        let now = Instant::now();
        if !sampler.due(now) {
            self.sample_cpu += thread_cpu().saturating_sub(c0);
            return;
        }
        let out = sampler.poll(&mut self.pages, now);
        self.sample_cpu += thread_cpu().saturating_sub(c0);
        let m = &self.metrics;
        for d in &out.refaulted {
            m.reclaim_turnaround_sampled.observe(d.as_secs_f64());
        }
        m.reclaim_turnaround_censored.inc_by(out.censored);
        let mut summary = sampler.summary();
        summary.cpu_seconds_total = self.sample_cpu.as_secs_f64();
        m.reclaim_turnaround_tracked.set(summary.tracked as i64);
        self.sampled_summary = Some(summary);
    }

    /// One controller step; returns how long until the next.
    fn tick(&mut self, sh: &Shared, now: Duration) -> Duration {
        let engaged = Duration::from_millis(self.cfg.reclaim.tick_ms);
        self.refresh(sh);
        self.sample(sh);
        let cpus = sh.pool.lock().unwrap().place.cpus.clone();
        if self.cpus_applied.as_ref() != Some(&cpus) {
            set_cpus(&cpus);
            self.cpus_applied = Some(cpus);
        }
        let mut obs = match self.observe() {
            Ok(o) => o,
            Err(e) => {
                sh.log_once(format!("sense:{e}"), || {
                    format!("reclaim: cannot sense the scope: {e}")
                });
                return engaged;
            }
        };
        let (budget, active) = {
            let mut p = sh.pool.lock().unwrap();
            obs.reclaimed_bytes = std::mem::take(&mut p.reclaimed);
            obs.inflight_bytes = p.inflight;
            obs.worker_busy = std::mem::take(&mut p.busy);
            self.totals.cpu += std::mem::take(&mut p.cpu);
            self.totals.batches += std::mem::take(&mut p.batches);
            let budget = match (&p.place.cpus, self.cfg.reclaim.max_workers) {
                (_, Some(n)) => n,
                (Some(c), None) => (c.len() as u32).clamp(1, self.budget_max),
                (None, None) => self.budget_max,
            };
            (budget, p.active)
        };
        self.totals.reclaimed += obs.reclaimed_bytes;
        self.reclaimable = self.reclaimable.saturating_sub(obs.reclaimed_bytes);
        obs.reclaimable_bytes = self.reclaimable;
        obs.sampled_turnaround =
            self.sampler
                .as_ref()
                .and_then(|s| s.recent())
                .map(|r| SampledTurnaround {
                    turnaround_s: r.turnaround_s,
                    at_least: r.at_least,
                    pages: r.pages.min(u32::MAX as u64) as u32,
                });
        let d = self.sched.step(now, &obs);
        let desired = d.workers.min(budget);
        {
            let mut p = sh.pool.lock().unwrap();
            p.desired = desired;
            p.remaining = d.target_bytes.saturating_sub(p.inflight);
            p.batch = d.batch_bytes;
        }
        if desired > 0 {
            sh.cv.notify_all();
        }
        // The refault rate over the time since the previous step (ticks vary).
        let dt = now
            .saturating_sub(self.last_step.replace(now).unwrap_or(now))
            .as_secs_f64();
        if dt > 0.0 {
            let w = 1.0 - (-dt / 1.0f64).exp();
            self.totals.refault_rate +=
                w * (obs.swapin_bytes as f64 / dt - self.totals.refault_rate);
        }
        self.publish(sh, &d, budget, desired, active, obs.swapin_bytes);
        d.next_tick
    }

    fn publish(
        &self,
        sh: &Shared,
        d: &ReclaimDecision,
        budget: u32,
        desired: u32,
        active: u32,
        swapin: u64,
    ) {
        let m = &self.metrics;
        m.reclaim_workers
            .with_label_values(&["desired"])
            .set(desired as i64);
        m.reclaim_workers
            .with_label_values(&["active"])
            .set(active as i64);
        m.reclaim_workers
            .with_label_values(&["budget"])
            .set(budget as i64);
        m.reclaim_marks
            .with_label_values(&["headroom"])
            .set(d.headroom_bytes as i64);
        m.reclaim_marks
            .with_label_values(&["low"])
            .set(d.low_mark_bytes as i64);
        m.reclaim_marks
            .with_label_values(&["high"])
            .set(d.high_mark_bytes as i64);
        m.reclaim_rate
            .with_label_values(&["alloc"])
            .set(d.alloc_rate);
        m.reclaim_rate
            .with_label_values(&["worker"])
            .set(d.worker_rate);
        m.reclaim_rate
            .with_label_values(&["refault"])
            .set(self.totals.refault_rate);
        m.reclaim_turnaround
            .set(d.mean_turnaround_s.unwrap_or(f64::INFINITY));
        m.reclaim_refault_bytes.inc_by(swapin);
        let total = self.totals.reclaimed;
        let prev = m.reclaim_bytes.get();
        if total > prev {
            m.reclaim_bytes.inc_by(total - prev);
        }
        m.reclaim_cpu_seconds.set(self.totals.cpu.as_secs_f64());
        let gib = total as f64 / (1u64 << 30) as f64;
        let mut st = sh.status.lock().unwrap();
        st.state = d.state.as_str().into();
        st.workers_budget = budget;
        st.workers_desired = desired;
        st.workers_active = active;
        st.headroom_bytes = d.headroom_bytes;
        st.low_mark_bytes = d.low_mark_bytes;
        st.high_mark_bytes = d.high_mark_bytes;
        st.alloc_rate_bytes_per_s = d.alloc_rate;
        st.charge_scale = d.charge_scale;
        st.worker_rate_bytes_per_s = d.worker_rate;
        st.turnaround_s = d.turnaround_s;
        if self.sampled_summary.is_some() {
            st.turnaround_sampled = self.sampled_summary.clone();
        }
        st.turnaround_source = d.turnaround_source.as_str().into();
        st.turnaround_at_least = d.turnaround_at_least;
        st.mean_turnaround_s = d.mean_turnaround_s;
        st.refault_distance_bytes = d.refault_distance_bytes;
        st.churn_capped = d.churn_capped;
        st.backing_off = d.backing_off;
        st.backoffs_total = d.backoffs;
        st.refault_bytes_per_s = self.totals.refault_rate;
        st.reclaimed_bytes_total = total;
        st.cpu_seconds_total = self.totals.cpu.as_secs_f64();
        st.cpu_seconds_per_gib = (gib > 0.0).then(|| self.totals.cpu.as_secs_f64() / gib);
        st.batches_total = self.totals.batches;
        st.errors_total = *sh.errors.lock().unwrap();
    }
}
