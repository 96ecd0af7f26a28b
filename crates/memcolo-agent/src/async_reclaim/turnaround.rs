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

pub use crate::config::TurnaroundConfig;

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
mod tests;
