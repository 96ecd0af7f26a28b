//! Tests of the turnaround sampler against a fake address space, and of the real
//! pagemap reader on this process.

#![cfg(test)]

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
