//! Sampled page turnaround: the time from a page's eviction by a reclaim batch to its
//! refault, measured on a bounded random sample of pages (Hermit, NSDI'23, "Page
//! Turnaround (PT): how long a swapped-out page remains untouched" — the signal
//! that tells reclaim it is evicting pages still in use).
//!
//! The scheduler's turnaround is a mean by Little's law over the whole swapped
//! population (see `memcolo_policy::hermit`); this module measures the
//! distribution directly:
//!
//! - **Evictions.** Around each batch a worker runs on a target, the target's
//!   [`EvictionWatch`] holds up to `want` of its resident anonymous pages, chosen at
//!   random (about uniformly over resident pages of its writable anonymous VMAs). The
//!   watched pages that the batch swapped out — `/proc/PID/pagemap` entry with the
//!   present bit (63) cleared and the swapped bit (62) set — were evicted by it, at
//!   the batch's end. This works alike for `process_madvise(MADV_PAGEOUT)` on one
//!   process and for a cgroup's limit step (the group's processes are watched),
//!   without knowing which pages the kernel picked.
//! - **Refaults.** The controller's [`TurnaroundSampler`] follows at most
//!   `capacity` evicted pages (more are turned away, so memory is bounded and each
//!   admitted page is followed to its end, whatever its turnaround), reads their
//!   pagemap entries every `poll`, and records the time until a page is present
//!   again into an HDR histogram (1 ms .. 1 h, 2 significant digits). A page still
//!   out after `horizon` is *censored*: counted, its turnaround only known to exceed
//!   the horizon. A page neither present nor swapped was freed by its process, and a
//!   process that exited takes its pages with it: both are dropped quietly.
//!
//! - **Recent evictions.** What steers the reclaim scheduler's back-off is not the
//!   window's distribution (its refaults are of pages evicted up to two minutes
//!   before) but [`TurnaroundSampler::recent`]: one quantile (default the median) of
//!   the turnaround of the sampled pages evicted in the last `recent` (10 s), by the
//!   product-limit (Kaplan–Meier) estimate. Each such page is either back (its
//!   turnaround), or not back yet — still followed (out for at least the time until
//!   the last poll saw it out), censored at the horizon, or freed (out until last
//!   seen) — and counts as a right-censored observation at that age, never as a
//!   refault. Counting a young page that is simply not back yet as "long" would hide
//!   the onset of thrashing: the pages evicted in the last half second are always
//!   out. When more than the quantile's share is still out at every age seen, the
//!   estimate is a lower bound (the largest age seen). Pages turned away when the
//!   sample is full are never followed, whatever their fate, so the estimate is not
//!   biased by them; it is biased in time towards moments with room.
//!
//! Resolution: a refault is seen at the first poll after it; the recorded time is the
//! midpoint between the last poll that saw the page out and the one that saw it
//! back, so it is off by at most half a poll interval (plus the batch's own length:
//! the eviction time is the batch's end). A page evicted and touched again within
//! the same batch is not seen at all.
//!
//! Cost: one `pread` of `/proc/PID/pagemap` per group of sampled pages within 64
//! pages of each other; per batch about `2 × want` entries plus a few probe windows
//! of 16 entries, and per poll at most `capacity` entries.

use hdrhistogram::Histogram;
use memcolo_linux::identity::ProvenProcess;
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::Pid;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes in a base page.
const PAGE: u64 = 4096;
/// Pages read around one random probe when looking for resident pages.
const PROBE_WINDOW: u64 = 16;
/// Sampled pages within this many pages of each other are read in one `pread`.
const READ_SPAN: u64 = 64;
/// At most this many processes of a cgroup target are watched per batch.
const MAX_WATCHED_PIDS: usize = 32;
/// A watch re-reads its processes' maps at most this often.
const VMA_REFRESH: Duration = Duration::from_secs(1);
/// Largest turnaround the histogram holds, milliseconds (1 h); the horizon is capped
/// to it.
const HIST_MAX_MS: u64 = 3_600_000;
/// Ended samples (refaulted, censored, dropped) kept for [`TurnaroundSampler::recent`],
/// at most this many times the capacity.
const RECENT_KEEP_PER_CAPACITY: usize = 16;

/// A virtual page as `/proc/PID/pagemap` sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageState {
    /// Bit 63: mapped to a page frame.
    Present,
    /// Bit 62: the entry holds a swap entry (swapped out, or in the swap cache).
    Swapped,
    /// Neither: never touched, freed, or not mapped.
    Absent,
}

impl PageState {
    /// The state in a raw 64-bit pagemap entry (Documentation/admin-guide/mm/pagemap.rst).
    pub fn from_pagemap(entry: u64) -> PageState {
        if entry & (1 << 63) != 0 {
            PageState::Present
        } else if entry & (1 << 62) != 0 {
            PageState::Swapped
        } else {
            PageState::Absent
        }
    }
}

/// Where the sampler reads page states and address spaces: [`ProcPages`] on a real
/// system, a fake in tests.
pub trait PageSource {
    /// States of the pages of `pid` at `addrs` (page-aligned virtual addresses, any
    /// order), in the order given. `None` when the process has exited or its pagemap
    /// cannot be read.
    fn page_states(&mut self, pid: Pid, addrs: &[u64]) -> Option<Vec<PageState>>;
    /// The writable anonymous VMAs of `pid` (where swappable pages live), in address
    /// order; `None` when the process has exited.
    fn anon_vmas(&mut self, pid: Pid) -> Option<Vec<Range<u64>>>;
    /// Forgets processes for which `keep` is false (closes their files).
    fn retain(&mut self, keep: &dyn Fn(Pid) -> bool);
}

/// [`PageSource`] over a procfs: `<procfs>/<pid>/pagemap` and `<procfs>/<pid>/maps`.
///
/// A pagemap is opened only for a proven process ([`ProcPages::bind`]: opened by
/// pid, then the process's pidfd checked alive, so the open file is that process's)
/// and stays open while it is in use: a pid reused by a new process is never
/// mistaken for the old one (the open file refers to the old address space and
/// reads end-of-file once it has exited). Pids never bound read as gone. Reading the
/// present and swapped bits needs `PTRACE_MODE_READ` on the process, not
/// `CAP_SYS_ADMIN`.
#[derive(Debug)]
pub struct ProcPages {
    procfs: ProcFs,
    files: HashMap<Pid, Arc<File>>,
}

impl ProcPages {
    /// A source reading the procfs at `procfs`.
    pub fn new(procfs: ProcFs) -> ProcPages {
        ProcPages {
            procfs,
            files: HashMap::new(),
        }
    }

    /// Opens the pagemap of the proven process `p` (unless it is open already) and
    /// proves it is `p`'s: `p` verified (alive, same credentials) after the open.
    /// Returns whether `p`'s pagemap is now open.
    pub fn bind(&mut self, p: &ProvenProcess) -> bool {
        if self.files.contains_key(&p.pid()) {
            return true;
        }
        let path = self.procfs.path().join(p.pid().to_string()).join("pagemap");
        let Ok(f) = File::open(path) else {
            return false;
        };
        if p.verify(&self.procfs).is_err() {
            return false;
        }
        self.files.insert(p.pid(), Arc::new(f));
        true
    }

    /// The open pagemap of `pid`, to hand to another source ([`ProcPages::adopt`]).
    pub fn pagemap(&self, pid: Pid) -> Option<Arc<File>> {
        self.files.get(&pid).cloned()
    }

    /// Follows `pid` in `f`, a pagemap another source bound to a proven process
    /// (replacing an older one: the newest evictions are of `f`'s process).
    pub fn adopt(&mut self, pid: Pid, f: Arc<File>) {
        self.files.insert(pid, f);
    }

    /// Whether `pid`'s pagemap is open.
    pub fn is_bound(&self, pid: Pid) -> bool {
        self.files.contains_key(&pid)
    }

    /// Entries of pages `first_vpn..first_vpn + n` of the open pagemap; `None` when
    /// the process is gone (end of file at a user address) or the read fails.
    fn read_entries(f: &File, first_vpn: u64, n: u64) -> Option<Vec<u64>> {
        let mut buf = vec![0u8; (n * 8) as usize];
        let mut got = 0usize;
        while got < buf.len() {
            match f.read_at(&mut buf[got..], first_vpn * 8 + got as u64) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        if got == 0 {
            return None;
        }
        // A short read past the end of the user address space reads as absent.
        buf.truncate(got - got % 8);
        Some(
            buf.chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().expect("8-byte chunk")))
                .collect(),
        )
    }
}

impl PageSource for ProcPages {
    fn page_states(&mut self, pid: Pid, addrs: &[u64]) -> Option<Vec<PageState>> {
        let f = self.files.get(&pid)?.clone();
        let f = &*f;
        let mut order: Vec<usize> = (0..addrs.len()).collect();
        order.sort_by_key(|&i| addrs[i]);
        let mut out = vec![PageState::Absent; addrs.len()];
        let mut k = 0;
        while k < order.len() {
            let first = addrs[order[k]] / PAGE;
            let mut j = k;
            while j + 1 < order.len() && addrs[order[j + 1]] / PAGE - first < READ_SPAN {
                j += 1;
            }
            let last = addrs[order[j]] / PAGE;
            let Some(entries) = Self::read_entries(f, first, last - first + 1) else {
                self.files.remove(&pid);
                return None;
            };
            for &i in &order[k..=j] {
                if let Some(&e) = entries.get((addrs[i] / PAGE - first) as usize) {
                    out[i] = PageState::from_pagemap(e);
                }
            }
            k = j + 1;
        }
        Some(out)
    }

    fn anon_vmas(&mut self, pid: Pid) -> Option<Vec<Range<u64>>> {
        // Only where to look: pages are read through the bound pagemap alone.
        if !self.is_bound(pid) {
            return None;
        }
        let maps = self.procfs.read_pid_maps(pid).ok()?;
        Some(
            maps.into_iter()
                .filter(|v| !v.is_file_backed() && v.perms.as_bytes().get(1) == Some(&b'w'))
                .filter(|v| v.end > v.start)
                .map(|v| v.start..v.end)
                .collect(),
        )
    }

    fn retain(&mut self, keep: &dyn Fn(Pid) -> bool) {
        self.files.retain(|&pid, _| keep(pid));
    }
}

/// The pages of one reclaim target watched across its batches, see the module docs.
#[derive(Debug)]
pub struct EvictionWatch {
    want: usize,
    cands: Vec<(Pid, u64)>,
    /// Writable anonymous VMAs of the watched processes, and when they were read.
    vmas: Vec<(Pid, Range<u64>)>,
    vmas_pids: Vec<Pid>,
    vmas_at: Option<Instant>,
}

impl EvictionWatch {
    /// A watch of up to `want` pages.
    pub fn new(want: usize) -> EvictionWatch {
        EvictionWatch {
            want,
            cands: Vec::new(),
            vmas: Vec::new(),
            vmas_pids: Vec::new(),
            vmas_at: None,
        }
    }

    /// Pages watched now.
    pub fn len(&self) -> usize {
        self.cands.len()
    }

    /// Whether no page is watched.
    pub fn is_empty(&self) -> bool {
        self.cands.is_empty()
    }

    /// Call right before a batch over `pids` (the target's processes; at most 32 of
    /// them, chosen at random, are looked at). Drops watched pages that are no longer
    /// resident (so an eviction seen after the batch is the batch's), then probes at
    /// most `2 × missing + 4` random windows of 16 pages of the processes' writable
    /// anonymous VMAs, a window chosen in proportion to the VMAs' sizes, and watches
    /// one resident page of each until `want` are watched.
    pub fn arm(
        &mut self,
        src: &mut dyn PageSource,
        pids: &[Pid],
        rng: &mut fastrand::Rng,
        now: Instant,
    ) {
        let states = self.states(src);
        let mut keep = states.iter().map(|s| *s == Some(PageState::Present));
        self.cands.retain(|_| keep.next().unwrap_or(false));
        if self.cands.len() >= self.want || pids.is_empty() {
            return;
        }
        let mut pids = pids.to_vec();
        if pids.len() > MAX_WATCHED_PIDS {
            rng.shuffle(&mut pids);
            pids.truncate(MAX_WATCHED_PIDS);
        }
        pids.sort_unstable();
        let stale = self
            .vmas_at
            .is_none_or(|t| now.saturating_duration_since(t) >= VMA_REFRESH);
        if stale || self.vmas_pids != pids {
            self.vmas.clear();
            for &pid in &pids {
                for r in src.anon_vmas(pid).unwrap_or_default() {
                    self.vmas.push((pid, r));
                }
            }
            self.vmas_pids = pids;
            self.vmas_at = Some(now);
        }
        let total: u64 = self.vmas.iter().map(|(_, r)| r.end - r.start).sum();
        if total < PAGE {
            return;
        }
        let probes = 2 * (self.want - self.cands.len()) + 4;
        for _ in 0..probes {
            if self.cands.len() >= self.want {
                break;
            }
            let mut x = rng.u64(0..total);
            let Some((pid, r)) = self.vmas.iter().find(|(_, r)| {
                let len = r.end - r.start;
                if x < len {
                    true
                } else {
                    x -= len;
                    false
                }
            }) else {
                break;
            };
            let (pid, start) = (*pid, r.start + x / PAGE * PAGE);
            let end = (start + PROBE_WINDOW * PAGE).min(r.end);
            let addrs: Vec<u64> = (start..end).step_by(PAGE as usize).collect();
            let Some(st) = src.page_states(pid, &addrs) else {
                continue;
            };
            let resident: Vec<u64> = addrs
                .iter()
                .zip(&st)
                .filter(|(a, s)| **s == PageState::Present && !self.cands.contains(&(pid, **a)))
                .map(|(a, _)| *a)
                .collect();
            if let Some(&a) = rng.choice(&resident) {
                self.cands.push((pid, a));
            }
        }
    }

    /// Call right after the batch: the watched pages it swapped out, no longer
    /// watched. Pages still resident stay watched; pages that are gone (freed, a
    /// file page dropped, the process exited) are dropped.
    pub fn evicted(&mut self, src: &mut dyn PageSource) -> Vec<(Pid, u64)> {
        let states = self.states(src);
        let mut out = Vec::new();
        let mut kept = Vec::with_capacity(self.cands.len());
        for (c, s) in self.cands.iter().zip(states) {
            match s {
                Some(PageState::Present) => kept.push(*c),
                Some(PageState::Swapped) => out.push(*c),
                _ => {}
            }
        }
        self.cands = kept;
        out
    }

    /// States of the watched pages, in order; `None` for a process that is gone.
    fn states(&self, src: &mut dyn PageSource) -> Vec<Option<PageState>> {
        states_of(src, self.cands.iter().copied())
    }
}

/// Pagemap states of `(pid, addr)` pages, one read per process, in the order given.
fn states_of(
    src: &mut dyn PageSource,
    pages: impl Iterator<Item = (Pid, u64)>,
) -> Vec<Option<PageState>> {
    let pages: Vec<(Pid, u64)> = pages.collect();
    let mut by_pid: HashMap<Pid, Vec<usize>> = HashMap::new();
    for (i, (pid, _)) in pages.iter().enumerate() {
        by_pid.entry(*pid).or_default().push(i);
    }
    let mut out = vec![None; pages.len()];
    for (pid, idx) in by_pid {
        let addrs: Vec<u64> = idx.iter().map(|&i| pages[i].1).collect();
        if let Some(st) = src.page_states(pid, &addrs) {
            for (&i, s) in idx.iter().zip(st) {
                out[i] = Some(s);
            }
        }
    }
    out
}

/// The sampler's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnaroundConfig {
    /// Evicted pages followed at once, at most; more are turned away.
    pub capacity: usize,
    /// How often the followed pages' pagemap entries are read.
    pub poll: Duration,
    /// A page still out after this long is censored (at most 1 h).
    pub horizon: Duration,
    /// Quantiles cover the refaults and censorings of the last one to two windows.
    pub window: Duration,
    /// [`TurnaroundSampler::recent`] covers the pages evicted this long ago or less.
    pub recent: Duration,
    /// The quantile (0..1) that [`TurnaroundSampler::recent`] estimates.
    pub recent_quantile: f64,
}

impl Default for TurnaroundConfig {
    fn default() -> Self {
        TurnaroundConfig {
            capacity: 512,
            poll: Duration::from_millis(500),
            horizon: Duration::from_secs(120),
            window: Duration::from_secs(60),
            recent: Duration::from_secs(10),
            recent_quantile: 0.5,
        }
    }
}

/// One quantile of the turnaround of recent evictions, see
/// [`TurnaroundSampler::recent`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RecentTurnaround {
    /// Which quantile (0..1).
    pub quantile: f64,
    /// Its value, seconds; a lower bound when `at_least`.
    pub turnaround_s: f64,
    /// More than the quantile's share of the pages is still out at every age seen:
    /// `turnaround_s` is the largest age seen.
    pub at_least: bool,
    /// Sampled pages evicted within the window that the estimate rests on, and how
    /// many of them are back.
    pub pages: u64,
    pub refaulted: u64,
    /// The window, seconds.
    pub window_s: f64,
}

/// The sampled turnaround distribution, for `memcolo status` and the metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TurnaroundSummary {
    /// Median sampled turnaround over the window, seconds; `horizon_s` when the
    /// quantile falls among censored pages; `None` with no refault or censoring in
    /// the window.
    pub p50_s: Option<f64>,
    /// 90th percentile, as `p50_s`.
    pub p90_s: Option<f64>,
    /// 99th percentile, as `p50_s`.
    pub p99_s: Option<f64>,
    /// Refaults recorded in the window.
    pub refaulted: u64,
    /// Pages censored in the window (out longer than the horizon).
    pub censored: u64,
    /// Evicted pages followed now.
    pub tracked: u64,
    /// The censoring horizon, seconds.
    pub horizon_s: f64,
    /// The window: quantiles cover the last one to two of them, seconds.
    pub window_s: f64,
    /// Since the agent started: refaults recorded, pages censored, pages dropped
    /// (freed, or their process exited), evicted pages turned away (capacity full).
    pub refaulted_total: u64,
    pub censored_total: u64,
    pub dropped_total: u64,
    pub rejected_total: u64,
    /// CPU time spent sampling (watching batches and polling), seconds.
    pub cpu_seconds_total: f64,
    /// The turnaround of the pages evicted in the last few seconds that steers the
    /// scheduler's back-off, as of the last poll; `None` before any eviction in them.
    pub recent: Option<RecentTurnaround>,
}

/// What one [`TurnaroundSampler::poll`] found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PollOutcome {
    /// Turnarounds of the pages seen back.
    pub refaulted: Vec<Duration>,
    /// Pages censored at this poll.
    pub censored: u64,
    /// Pages dropped at this poll (freed, or their process exited).
    pub dropped: u64,
}

/// How a followed page's sample ended: back after `age` (`refaulted`), or known to
/// be out for `age` and then not followed further (censored or freed).
#[derive(Clone, Copy, Debug)]
struct Ended {
    evicted: Instant,
    age: Duration,
    refaulted: bool,
}

#[derive(Clone, Copy, Debug)]
struct Tracked {
    pid: Pid,
    addr: u64,
    evicted: Instant,
    /// The last time the page was seen out.
    seen_out: Instant,
}

#[derive(Debug)]
struct Window {
    start: Instant,
    hist: Histogram<u64>,
    censored: u64,
}

impl Window {
    fn new(start: Instant) -> Window {
        Window {
            start,
            hist: Histogram::new_with_bounds(1, HIST_MAX_MS, 2).expect("valid histogram bounds"),
            censored: 0,
        }
    }
}

/// Follows evicted pages until they refault, see the module docs.
#[derive(Debug)]
pub struct TurnaroundSampler {
    cfg: TurnaroundConfig,
    tracked: Vec<Tracked>,
    last_poll: Option<Instant>,
    cur: Option<Window>,
    prev: Option<Window>,
    refaulted_total: u64,
    censored_total: u64,
    dropped_total: u64,
    rejected_total: u64,
    /// Samples that ended, eviction order roughly; pruned to `cfg.recent`.
    ended: std::collections::VecDeque<Ended>,
    recent: Option<RecentTurnaround>,
}

impl TurnaroundSampler {
    /// A sampler following nothing yet.
    pub fn new(mut cfg: TurnaroundConfig) -> TurnaroundSampler {
        cfg.horizon = cfg.horizon.min(Duration::from_millis(HIST_MAX_MS));
        TurnaroundSampler {
            cfg,
            tracked: Vec::new(),
            last_poll: None,
            cur: None,
            prev: None,
            refaulted_total: 0,
            censored_total: 0,
            dropped_total: 0,
            rejected_total: 0,
            ended: std::collections::VecDeque::new(),
            recent: None,
        }
    }

    /// Follows the pages evicted at `at` while there is room; the rest are turned
    /// away and counted. Returns how many were taken.
    pub fn admit(&mut self, evicted: &[(Pid, u64)], at: Instant) -> usize {
        let room = self.cfg.capacity.saturating_sub(self.tracked.len());
        let take = evicted.len().min(room);
        self.tracked
            .extend(evicted[..take].iter().map(|&(pid, addr)| Tracked {
                pid,
                addr,
                evicted: at,
                seen_out: at,
            }));
        self.rejected_total += (evicted.len() - take) as u64;
        take
    }

    /// Counts `n` evicted pages turned away before they reached the sampler.
    pub fn note_rejected(&mut self, n: u64) {
        self.rejected_total += n;
    }

    /// Whether a poll is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.last_poll
            .is_none_or(|t| now.saturating_duration_since(t) >= self.cfg.poll)
    }

    /// Processes with followed pages.
    pub fn pids(&self) -> BTreeSet<Pid> {
        self.tracked.iter().map(|t| t.pid).collect()
    }

    /// Reads the followed pages' states at `now`: records the turnaround of those
    /// present again, censors those out for longer than the horizon, drops those
    /// that are gone.
    pub fn poll(&mut self, src: &mut dyn PageSource, now: Instant) -> PollOutcome {
        self.last_poll = Some(now);
        self.rotate(now);
        let states = states_of(src, self.tracked.iter().map(|t| (t.pid, t.addr)));
        let mut out = PollOutcome::default();
        let mut kept = Vec::with_capacity(self.tracked.len());
        for (t, s) in self.tracked.iter().zip(states) {
            let end = |age: Duration, refaulted: bool| Ended {
                evicted: t.evicted,
                age,
                refaulted,
            };
            match s {
                Some(PageState::Present) => {
                    // Back somewhere between the last look and now: the midpoint.
                    let back = t.seen_out + now.saturating_duration_since(t.seen_out) / 2;
                    let d = back.saturating_duration_since(t.evicted);
                    out.refaulted.push(d);
                    self.ended.push_back(end(d, true));
                }
                Some(PageState::Swapped) => {
                    let age = now.saturating_duration_since(t.evicted);
                    if age >= self.cfg.horizon {
                        out.censored += 1;
                        self.ended.push_back(end(age, false));
                    } else {
                        kept.push(Tracked {
                            seen_out: now,
                            ..*t
                        });
                    }
                }
                Some(PageState::Absent) | None => {
                    out.dropped += 1;
                    self.ended
                        .push_back(end(t.seen_out.saturating_duration_since(t.evicted), false));
                }
            }
        }
        self.tracked = kept;
        let w = self.cur.get_or_insert_with(|| Window::new(now));
        for d in &out.refaulted {
            w.hist
                .saturating_record((d.as_millis() as u64).clamp(1, HIST_MAX_MS));
        }
        w.censored += out.censored;
        self.refaulted_total += out.refaulted.len() as u64;
        self.censored_total += out.censored;
        self.dropped_total += out.dropped;
        src.retain(&|pid| self.tracked.iter().any(|t| t.pid == pid));
        let keep = RECENT_KEEP_PER_CAPACITY * self.cfg.capacity.max(1);
        while self.ended.len() > keep
            || self
                .ended
                .front()
                .is_some_and(|e| now.saturating_duration_since(e.evicted) > self.cfg.recent)
        {
            self.ended.pop_front();
        }
        self.recent = self.estimate_recent(now);
        out
    }

    /// The turnaround of recent evictions as of the last poll: quantile
    /// `recent_quantile` of the sampled pages evicted at most `recent` before it, by
    /// the product-limit estimate over refaults and pages not back yet (see the
    /// module docs); `None` before the first poll and while no such page has been
    /// seen out for any time. Units: seconds.
    pub fn recent(&self) -> Option<RecentTurnaround> {
        self.recent
    }

    fn estimate_recent(&self, now: Instant) -> Option<RecentTurnaround> {
        let in_window =
            |evicted: Instant| now.saturating_duration_since(evicted) <= self.cfg.recent;
        let mut obs: Vec<(Duration, bool)> = self
            .ended
            .iter()
            .filter(|e| in_window(e.evicted))
            .map(|e| (e.age, e.refaulted))
            .chain(
                self.tracked
                    .iter()
                    .filter(|t| in_window(t.evicted))
                    .map(|t| (t.seen_out.saturating_duration_since(t.evicted), false)),
            )
            // A page not back and not yet seen out for any time says nothing.
            .filter(|&(age, refaulted)| refaulted || !age.is_zero())
            .collect();
        let (value, at_least) = product_limit_quantile(&mut obs, self.cfg.recent_quantile)?;
        Some(RecentTurnaround {
            quantile: self.cfg.recent_quantile,
            turnaround_s: value.as_secs_f64(),
            at_least,
            pages: obs.len() as u64,
            refaulted: obs.iter().filter(|o| o.1).count() as u64,
            window_s: self.cfg.recent.as_secs_f64(),
        })
    }

    fn rotate(&mut self, now: Instant) {
        let Some(cur) = &self.cur else { return };
        let age = now.saturating_duration_since(cur.start);
        if age >= 2 * self.cfg.window {
            self.prev = None;
            self.cur = Some(Window::new(now));
        } else if age >= self.cfg.window {
            let start = cur.start + self.cfg.window;
            self.prev = self.cur.replace(Window::new(start));
        }
    }

    /// The distribution over the current and the previous window.
    pub fn summary(&self) -> TurnaroundSummary {
        let mut hist =
            Histogram::<u64>::new_with_bounds(1, HIST_MAX_MS, 2).expect("valid histogram bounds");
        let mut censored = 0;
        for w in [&self.prev, &self.cur].into_iter().flatten() {
            hist.add(&w.hist).expect("same bounds");
            censored += w.censored;
        }
        let horizon_s = self.cfg.horizon.as_secs_f64();
        let q = |q: f64| quantile(&hist, censored, q, horizon_s);
        TurnaroundSummary {
            p50_s: q(0.5),
            p90_s: q(0.9),
            p99_s: q(0.99),
            refaulted: hist.len(),
            censored,
            tracked: self.tracked.len() as u64,
            horizon_s,
            window_s: self.cfg.window.as_secs_f64(),
            refaulted_total: self.refaulted_total,
            censored_total: self.censored_total,
            dropped_total: self.dropped_total,
            rejected_total: self.rejected_total,
            cpu_seconds_total: 0.0,
            recent: self.recent,
        }
    }
}

/// Quantile `q` (0..1) of turnarounds observed as `(age, refaulted)`: a refault after
/// `age`, or a page known to be out for `age` and not followed beyond (right-censored),
/// by the product-limit (Kaplan–Meier) estimate of the distribution: at each refault
/// time `t`, `S(t) = S(t−) × (1 − refaults at t / pages still at risk at t)`, a censored
/// page at risk up to and including its age. Returns the first refault time where
/// `1 − S ≥ q` and `false`, or, when `1 − S` never reaches `q`, the largest age seen and
/// `true` (a lower bound). `None` for no observations. Sorts `obs`.
fn product_limit_quantile(obs: &mut [(Duration, bool)], q: f64) -> Option<(Duration, bool)> {
    // By time, refaults before censorings at the same time.
    obs.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let last = obs.last()?.0;
    let mut at_risk = obs.len();
    let mut survival = 1.0f64;
    let mut i = 0;
    while i < obs.len() {
        let t = obs[i].0;
        let (mut refaults, mut ended) = (0usize, 0usize);
        while i < obs.len() && obs[i].0 == t {
            refaults += usize::from(obs[i].1);
            ended += 1;
            i += 1;
        }
        if refaults > 0 {
            survival *= 1.0 - refaults as f64 / at_risk as f64;
            if 1.0 - survival >= q - 1e-9 {
                return Some((t, false));
            }
        }
        at_risk -= ended;
    }
    Some((last, true))
}

/// Quantile `q` of the refaults in `hist` (ms) and `censored` pages that stayed out
/// longer than the horizon, in seconds: the horizon when it falls among the censored.
fn quantile(hist: &Histogram<u64>, censored: u64, q: f64, horizon_s: f64) -> Option<f64> {
    let n = hist.len();
    let all = n + censored;
    if all == 0 {
        return None;
    }
    let rank = ((q * all as f64).ceil() as u64).clamp(1, all);
    if rank > n {
        return Some(horizon_s);
    }
    let ms = hist.value_at_quantile(rank as f64 / n as f64);
    Some(hist.highest_equivalent(ms).min(HIST_MAX_MS) as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// A fake address space per process: VMAs and the state of each page (absent
    /// unless set), processes that are gone, and a count of reads.
    #[derive(Default)]
    struct Fake {
        vmas: HashMap<Pid, Vec<Range<u64>>>,
        pages: HashMap<(Pid, u64), PageState>,
        gone: HashSet<Pid>,
        reads: usize,
        entries: usize,
    }

    impl Fake {
        /// `pid` with one VMA at `base` of `n` pages, all present.
        fn process(&mut self, pid: Pid, base: u64, n: u64) {
            self.vmas
                .entry(pid)
                .or_default()
                .push(base..base + n * PAGE);
            for i in 0..n {
                self.pages
                    .insert((pid, base + i * PAGE), PageState::Present);
            }
        }

        fn set(&mut self, pid: Pid, addr: u64, s: PageState) {
            self.pages.insert((pid, addr), s);
        }

        /// Swaps out every present page of `pid` in `range` (a reclaim batch).
        fn swap_out(&mut self, pid: Pid, range: Range<u64>) {
            for (k, s) in self.pages.iter_mut() {
                if k.0 == pid && range.contains(&k.1) && *s == PageState::Present {
                    *s = PageState::Swapped;
                }
            }
        }
    }

    impl PageSource for Fake {
        fn page_states(&mut self, pid: Pid, addrs: &[u64]) -> Option<Vec<PageState>> {
            self.reads += 1;
            self.entries += addrs.len();
            if self.gone.contains(&pid) {
                return None;
            }
            Some(
                addrs
                    .iter()
                    .map(|a| *self.pages.get(&(pid, *a)).unwrap_or(&PageState::Absent))
                    .collect(),
            )
        }

        fn anon_vmas(&mut self, pid: Pid) -> Option<Vec<Range<u64>>> {
            if self.gone.contains(&pid) {
                return None;
            }
            self.vmas.get(&pid).cloned()
        }

        fn retain(&mut self, _keep: &dyn Fn(Pid) -> bool) {}
    }

    const BASE: u64 = 0x7f00_0000_0000;

    #[test]
    fn pagemap_bits_give_the_state() {
        assert_eq!(
            PageState::from_pagemap(1 << 63 | 0x1234),
            PageState::Present
        );
        // A swap entry: bit 62, swap type and offset in the low bits.
        assert_eq!(
            PageState::from_pagemap(1 << 62 | 0x5_0000_0001),
            PageState::Swapped
        );
        assert_eq!(PageState::from_pagemap(0), PageState::Absent);
        // Soft-dirty / exclusive bits alone say nothing about residency.
        assert_eq!(
            PageState::from_pagemap(1 << 55 | 1 << 56),
            PageState::Absent
        );
    }

    #[test]
    fn the_watch_reports_exactly_the_pages_a_batch_swapped_out() {
        let mut src = Fake::default();
        src.process(10, BASE, 1024);
        let mut rng = fastrand::Rng::with_seed(7);
        let t0 = Instant::now();
        let mut w = EvictionWatch::new(64);
        w.arm(&mut src, &[10], &mut rng, t0);
        assert_eq!(w.len(), 64);
        // Distinct pages, all inside the VMA, spread over it.
        let set: HashSet<u64> = w.cands.iter().map(|c| c.1).collect();
        assert_eq!(set.len(), 64);
        assert!(set.iter().all(|a| (BASE..BASE + 1024 * PAGE).contains(a)));
        let low = set.iter().filter(|&&a| a < BASE + 512 * PAGE).count();
        assert!((16..=48).contains(&low), "{low} of 64 in the lower half");
        // The batch swaps out the lower half: the watched pages there are reported,
        // the others stay watched.
        src.swap_out(10, BASE..BASE + 512 * PAGE);
        let ev = w.evicted(&mut src);
        assert_eq!(ev.len(), low);
        assert!(ev.iter().all(|&(p, a)| p == 10 && a < BASE + 512 * PAGE));
        assert_eq!(w.len(), 64 - low);
        // Re-armed: topped up (half the probes find nothing now) with resident pages
        // only, those of the upper half.
        w.arm(&mut src, &[10], &mut rng, t0);
        assert!(w.len() > 64 - low && w.len() <= 64, "{}", w.len());
        assert!(w.cands.iter().all(|c| c.1 >= BASE + 512 * PAGE));
    }

    #[test]
    fn a_page_evicted_before_the_batch_is_not_the_batchs() {
        let mut src = Fake::default();
        src.process(10, BASE, 256);
        let mut rng = fastrand::Rng::with_seed(1);
        let t0 = Instant::now();
        let mut w = EvictionWatch::new(8);
        w.arm(&mut src, &[10], &mut rng, t0);
        let first = w.cands.clone();
        // The kernel swaps everything out between batches; the next arm drops the
        // watched pages (they are no longer resident) and finds no new ones.
        src.swap_out(10, BASE..BASE + 256 * PAGE);
        w.arm(&mut src, &[10], &mut rng, t0);
        assert!(w.is_empty(), "{:?} of {first:?}", w.cands);
        assert!(w.evicted(&mut src).is_empty());
    }

    #[test]
    fn freed_pages_and_exited_processes_leave_the_watch_quietly() {
        let mut src = Fake::default();
        src.process(10, BASE, 64);
        src.process(11, BASE, 64);
        let mut rng = fastrand::Rng::with_seed(3);
        let t0 = Instant::now();
        let mut w = EvictionWatch::new(32);
        w.arm(&mut src, &[10, 11], &mut rng, t0);
        assert_eq!(w.len(), 32);
        let of_11 = w.cands.iter().filter(|c| c.0 == 11).count();
        assert!(of_11 > 0 && of_11 < 32);
        src.gone.insert(11);
        // Process 10 unmaps its pages (MADV_DONTNEED or munmap): absent, not evicted.
        for i in 0..64 {
            src.set(10, BASE + i * PAGE, PageState::Absent);
        }
        assert!(w.evicted(&mut src).is_empty());
        assert!(w.is_empty());
        // Nothing resident left to watch: arming does nothing, and costs a bounded
        // number of reads.
        let reads = src.reads;
        w.arm(&mut src, &[10, 11], &mut rng, t0 + VMA_REFRESH);
        assert!(w.is_empty());
        assert!(
            src.reads - reads <= 2 * 32 + 4 + 1,
            "{} reads",
            src.reads - reads
        );
    }

    #[test]
    fn arming_is_bounded_in_sparse_address_spaces() {
        let mut src = Fake::default();
        // A 1 GiB reservation with 8 resident pages.
        src.vmas.entry(10).or_default().push(BASE..BASE + (1 << 30));
        for i in 0..8 {
            src.set(10, BASE + i * (1 << 27), PageState::Present);
        }
        let mut rng = fastrand::Rng::with_seed(5);
        let mut w = EvictionWatch::new(64);
        w.arm(&mut src, &[10], &mut rng, Instant::now());
        // At most 2 × 64 + 4 probes of 16 pages, plus the recheck of nothing.
        assert!(src.reads <= 2 * 64 + 4 + 1, "{} reads", src.reads);
        assert!(src.entries <= (2 * 64 + 4) * PROBE_WINDOW as usize);
        assert!(w.len() <= 8);
    }

    #[test]
    fn many_processes_of_a_group_are_watched_a_bounded_few_at_a_time() {
        let mut src = Fake::default();
        let pids: Vec<Pid> = (100..200).collect();
        for &p in &pids {
            src.process(p, BASE, 16);
        }
        let mut rng = fastrand::Rng::with_seed(9);
        let mut w = EvictionWatch::new(64);
        w.arm(&mut src, &pids, &mut rng, Instant::now());
        assert_eq!(w.len(), 64);
        let watched: HashSet<Pid> = w.cands.iter().map(|c| c.0).collect();
        assert!(watched.len() <= MAX_WATCHED_PIDS);
        assert_eq!(w.vmas_pids.len(), MAX_WATCHED_PIDS);
    }

    fn cfg() -> TurnaroundConfig {
        TurnaroundConfig {
            capacity: 4,
            poll: Duration::from_millis(500),
            horizon: Duration::from_secs(10),
            window: Duration::from_secs(60),
            ..Default::default()
        }
    }

    #[test]
    fn a_refault_is_recorded_at_the_midpoint_of_the_polls_around_it() {
        let mut src = Fake::default();
        let t0 = Instant::now();
        let s = |x: f64| t0 + Duration::from_secs_f64(x);
        let (a, b) = (BASE, BASE + PAGE);
        src.set(10, a, PageState::Swapped);
        src.set(10, b, PageState::Swapped);
        let mut ts = TurnaroundSampler::new(cfg());
        assert_eq!(ts.admit(&[(10, a), (10, b)], t0), 2);
        assert!(ts.due(t0));
        assert_eq!(ts.poll(&mut src, s(1.0)), PollOutcome::default());
        assert!(!ts.due(s(1.2)));
        assert!(ts.due(s(1.5)));
        // Page a comes back between 1 s and 2 s: recorded as 1.5 s.
        src.set(10, a, PageState::Present);
        let out = ts.poll(&mut src, s(2.0));
        assert_eq!(out.refaulted, vec![Duration::from_millis(1500)]);
        // Page b comes back between 2 s and 4 s: 3 s.
        src.set(10, b, PageState::Present);
        let out = ts.poll(&mut src, s(4.0));
        assert_eq!(out.refaulted, vec![Duration::from_secs(3)]);
        let sum = ts.summary();
        assert_eq!((sum.refaulted, sum.censored, sum.tracked), (2, 0, 0));
        assert_eq!(sum.refaulted_total, 2);
        let p50 = sum.p50_s.unwrap();
        let p99 = sum.p99_s.unwrap();
        assert!((p50 - 1.5).abs() < 0.02, "p50 {p50}");
        assert!((p99 - 3.0).abs() < 0.04, "p99 {p99}");
    }

    #[test]
    fn pages_out_past_the_horizon_are_censored_and_set_the_upper_quantiles() {
        let mut src = Fake::default();
        let t0 = Instant::now();
        let s = |x: u64| t0 + Duration::from_secs(x);
        for i in 0..4 {
            src.set(10, BASE + i * PAGE, PageState::Swapped);
        }
        let mut ts = TurnaroundSampler::new(cfg());
        let pages: Vec<(Pid, u64)> = (0..4).map(|i| (10, BASE + i * PAGE)).collect();
        assert_eq!(ts.admit(&pages, t0), 4);
        // Full: a fifth page is turned away, not swapped for an old one.
        assert_eq!(ts.admit(&[(11, BASE)], s(1)), 0);
        src.set(10, BASE, PageState::Present);
        assert_eq!(ts.poll(&mut src, s(2)).refaulted.len(), 1);
        // The other three are still out at the horizon.
        let out = ts.poll(&mut src, s(10));
        assert_eq!(out.censored, 3);
        let sum = ts.summary();
        assert_eq!((sum.refaulted, sum.censored, sum.tracked), (1, 3, 0));
        assert_eq!(sum.rejected_total, 1);
        // One of four came back in 1 s: the median is past the horizon.
        assert!((sum.p50_s.unwrap() - 10.0).abs() < 1e-9);
        assert!((sum.p99_s.unwrap() - 10.0).abs() < 1e-9);
        // With room again, new pages are taken.
        assert_eq!(ts.admit(&[(11, BASE)], s(10)), 1);
    }

    #[test]
    fn freed_pages_and_dead_processes_are_dropped_quietly() {
        let mut src = Fake::default();
        let t0 = Instant::now();
        src.set(10, BASE, PageState::Swapped);
        src.set(11, BASE, PageState::Swapped);
        src.set(11, BASE + PAGE, PageState::Swapped);
        let mut ts = TurnaroundSampler::new(cfg());
        ts.admit(&[(10, BASE), (11, BASE), (11, BASE + PAGE)], t0);
        assert_eq!(ts.pids(), [10, 11].into());
        src.set(10, BASE, PageState::Absent);
        src.gone.insert(11);
        let out = ts.poll(&mut src, t0 + Duration::from_secs(1));
        assert_eq!(out.dropped, 3);
        assert!(out.refaulted.is_empty());
        let sum = ts.summary();
        assert_eq!((sum.tracked, sum.dropped_total, sum.refaulted), (0, 3, 0));
        assert_eq!(sum.p50_s, None);
        assert!(ts.pids().is_empty());
    }

    #[test]
    fn quantiles_cover_the_last_one_to_two_windows() {
        let mut src = Fake::default();
        let t0 = Instant::now();
        let s = |x: u64| t0 + Duration::from_secs(x);
        let mut ts = TurnaroundSampler::new(TurnaroundConfig {
            capacity: 100,
            ..cfg()
        });
        let mut refault_after = |ts: &mut TurnaroundSampler, at: u64, secs: u64| {
            src.set(10, BASE, PageState::Swapped);
            ts.admit(&[(10, BASE)], s(at));
            ts.poll(&mut src, s(at + secs) - Duration::from_millis(1));
            src.set(10, BASE, PageState::Present);
            ts.poll(&mut src, s(at + secs) + Duration::from_millis(1));
        };
        refault_after(&mut ts, 0, 8);
        assert!((ts.summary().p50_s.unwrap() - 8.0).abs() < 0.1);
        // 70 s on (the second window): a 2 s refault; both count.
        refault_after(&mut ts, 70, 2);
        assert_eq!(ts.summary().refaulted, 2);
        // 130 s on (the third window): the first window is forgotten.
        refault_after(&mut ts, 130, 2);
        let sum = ts.summary();
        assert_eq!(sum.refaulted, 2);
        assert!((sum.p99_s.unwrap() - 2.0).abs() < 0.05, "{sum:?}");
        // Long idle: everything is forgotten.
        ts.poll(&mut src, s(1000));
        assert_eq!(ts.summary().refaulted, 0);
        assert_eq!(ts.summary().refaulted_total, 3);
    }

    fn secs(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    #[test]
    fn the_product_limit_quantile_counts_pages_not_back_as_censored() {
        // Every page back: the plain quantile.
        let mut all: Vec<(Duration, bool)> = [3.0, 1.0, 2.0, 4.0]
            .iter()
            .map(|&x| (secs(x), true))
            .collect();
        assert_eq!(
            product_limit_quantile(&mut all, 0.5),
            Some((secs(2.0), false))
        );
        assert_eq!(
            product_limit_quantile(&mut all, 0.75),
            Some((secs(3.0), false))
        );
        assert_eq!(
            product_limit_quantile(&mut all, 1.0),
            Some((secs(4.0), false))
        );
        // Thrashing as it starts: 10 pages evicted a while ago came back after
        // 0.5 s; 15 evicted just now have been out 0.2 s. Counted as "not back", the
        // young pages would put the median past everything seen (10 of 25 back);
        // censored at 0.2 s they leave the 10 older pages at risk at 0.5 s, all of
        // which came back: the median is 0.5 s.
        let mut onset: Vec<(Duration, bool)> = (0..10)
            .map(|_| (secs(0.5), true))
            .chain((0..15).map(|_| (secs(0.2), false)))
            .collect();
        assert_eq!(
            product_limit_quantile(&mut onset, 0.5),
            Some((secs(0.5), false))
        );
        // A page out for 0.5 s and one back at 1 s, one at 2 s, one out for 3 s:
        // S(1) = 2/3, S(2) = 1/3, so the median is 2 s and the p25 1 s.
        let mut mixed = vec![
            (secs(0.5), false),
            (secs(1.0), true),
            (secs(2.0), true),
            (secs(3.0), false),
        ];
        assert_eq!(
            product_limit_quantile(&mut mixed, 0.5),
            Some((secs(2.0), false))
        );
        assert_eq!(
            product_limit_quantile(&mut mixed, 0.25),
            Some((secs(1.0), false))
        );
        // Over 2/3 of it (S never below 1/3): a lower bound, the largest age seen.
        assert_eq!(
            product_limit_quantile(&mut mixed, 0.9),
            Some((secs(3.0), true))
        );
        // Nothing back: a lower bound; nothing at all: none.
        let mut out = vec![(secs(4.0), false), (secs(7.0), false)];
        assert_eq!(
            product_limit_quantile(&mut out, 0.5),
            Some((secs(7.0), true))
        );
        assert_eq!(product_limit_quantile(&mut [], 0.5), None);
        // A refault and a censoring at the same time: the censored page was at risk.
        let mut tie = vec![(secs(1.0), false), (secs(1.0), true)];
        assert_eq!(
            product_limit_quantile(&mut tie, 0.5),
            Some((secs(1.0), false))
        );
    }

    #[test]
    fn recent_turnaround_covers_the_last_evictions_back_or_not() {
        let mut src = Fake::default();
        let t0 = Instant::now();
        let s = |x: f64| t0 + secs(x);
        let mut ts = TurnaroundSampler::new(TurnaroundConfig {
            capacity: 100,
            poll: Duration::from_millis(100),
            horizon: Duration::from_secs(30),
            window: Duration::from_secs(60),
            recent: Duration::from_secs(10),
            recent_quantile: 0.5,
        });
        assert_eq!(ts.recent(), None);
        let page = |i: u64| BASE + i * PAGE;
        // At 0 s, 20 pages evicted; 12 come back by 0.3 s (recorded at 0.25 s), 4
        // are freed at 1 s, 4 stay out.
        for i in 0..20 {
            src.set(10, page(i), PageState::Swapped);
        }
        let first: Vec<(Pid, u64)> = (0..20).map(|i| (10, page(i))).collect();
        ts.admit(&first, s(0.0));
        ts.poll(&mut src, s(0.2));
        for i in 0..12 {
            src.set(10, page(i), PageState::Present);
        }
        ts.poll(&mut src, s(0.3));
        let r = ts.recent().unwrap();
        assert_eq!((r.pages, r.refaulted), (20, 12));
        assert!(!r.at_least);
        assert!((r.turnaround_s - 0.25).abs() < 1e-9, "{r:?}");
        for i in 12..16 {
            src.set(10, page(i), PageState::Absent);
        }
        ts.poll(&mut src, s(1.0));
        assert_eq!(ts.summary().recent, ts.recent());
        // Still a median of 0.25 s: freed pages are censored where last seen out.
        let r = ts.recent().unwrap();
        assert_eq!((r.pages, r.refaulted), (20, 12));
        assert!((r.turnaround_s - 0.25).abs() < 1e-9, "{r:?}");
        // 11 s on, those evictions have left the window; 8 new ones at 11 s have
        // been out 1 s and the 4 old ones still out are not counted.
        for i in 20..28 {
            src.set(10, page(i), PageState::Swapped);
        }
        let second: Vec<(Pid, u64)> = (20..28).map(|i| (10, page(i))).collect();
        ts.admit(&second, s(11.0));
        ts.poll(&mut src, s(12.0));
        let r = ts.recent().unwrap();
        assert_eq!((r.pages, r.refaulted), (8, 0), "{r:?}");
        assert!(r.at_least && (r.turnaround_s - 1.0).abs() < 1e-9, "{r:?}");
        // Admitted and not yet seen out: no information, so no estimate.
        let mut fresh = TurnaroundSampler::new(TurnaroundConfig::default());
        src.set(11, BASE, PageState::Swapped);
        fresh.admit(&[(11, BASE)], s(20.0));
        fresh.poll(&mut src, s(20.0));
        assert_eq!(fresh.recent(), None);
    }

    #[test]
    fn proc_pages_reads_its_own_pagemap() {
        // This process's own pagemap: a page just written is present, a page of a
        // fresh mapping never touched is absent. Needs no privilege.
        let mut src = ProcPages::new(ProcFs::root());
        let me = std::process::id() as Pid;
        // Not bound: nothing is read by pid.
        assert_eq!(src.page_states(me, &[0]), None);
        let proof = ProvenProcess::open(&ProcFs::root(), me, None).unwrap();
        assert!(src.bind(&proof), "/proc/self/pagemap is not readable here");
        let mut v = vec![0u8; 64 * PAGE as usize];
        let base = v.as_ptr() as u64;
        let first = base.div_ceil(PAGE) * PAGE;
        for i in 0..8 {
            v[(first - base + i * PAGE) as usize] = 1;
        }
        let addrs: Vec<u64> = (0..8).map(|i| first + i * PAGE).collect();
        let st = src.page_states(me, &addrs).unwrap();
        assert!(st.iter().all(|s| *s == PageState::Present), "{st:?}");
        let vmas = src.anon_vmas(me).unwrap();
        assert!(vmas.iter().any(|r| r.contains(&first)));
        // Scattered addresses in any order come back in that order.
        let mixed = [addrs[5], addrs[0], addrs[7]];
        assert_eq!(src.page_states(me, &mixed).unwrap().len(), 3);
        assert_eq!(src.page_states(me, &[]).unwrap(), vec![]);
        // A process that does not exist: None, not a panic.
        assert_eq!(src.page_states(i32::MAX, &addrs), None);
        std::hint::black_box(&v);
    }
}
