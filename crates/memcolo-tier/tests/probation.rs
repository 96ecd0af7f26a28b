//! Probation (`TierConfig::probation_pages`) on real memory of this process: the next
//! victims are unmapped with their contents kept, a touch puts a page back from its
//! copy (a probation hit: no slow-tier access, a second chance), an untouched victim
//! is evicted from its copy, frees and shutdown see the right bytes; and with the
//! MaxMem policy a page touched between evictions stays in fast memory under
//! eviction pressure while the pages touched once go, where without probation the
//! same page is evicted and faulted back again and again.
//!
//! These tests need userfaultfd: root, or vm.unprivileged_userfaultfd = 1 (checked
//! first; without it they print why and pass).

use memcolo_policy::maxmem::{MaxMem, MaxMemConfig, Tier};
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::manager::{ManagerStats, Placement, TierConfig, TierManager};
use memcolo_tier::placement::MaxMemPlacement;
use memcolo_tier::region::{AnonRegion, MemfdRegion, RegionMemory, PAGE};
use memcolo_tier::uffd::{features, mode, Uffd};
use memcolo_tier::SlowTier;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;
use common::*;

/// A region of this process and how a manager reaches it: anonymous memory (with
/// remove events) or a memfd mapped shared, as libmemcolo backs a region for the
/// agent.
enum Region {
    Anon(AnonRegion),
    Memfd(MemfdRegion),
}

impl Region {
    fn new(memfd: bool, pages: usize) -> (Region, Uffd, Box<dyn RegionMemory>) {
        if memfd {
            let r = MemfdRegion::new(pages).unwrap();
            let (u, mem) = memfd_under_uffd(&r);
            (Region::Memfd(r), u, Box::new(mem))
        } else {
            let r = AnonRegion::new(pages).unwrap();
            let u = Uffd::open(features::PAGEFAULT_FLAG_WP | features::EVENT_REMOVE).unwrap();
            u.register(r.as_ptr() as u64, r.len() as u64, mode::MISSING | mode::WP)
                .unwrap();
            let mem = r.memory();
            (Region::Anon(r), u, Box::new(mem))
        }
    }

    fn base(&self) -> *mut u8 {
        match self {
            Region::Anon(r) => r.as_ptr(),
            Region::Memfd(r) => r.as_ptr(),
        }
    }
}

/// The byte pattern of page `p` in round `round`.
fn fill(page: &mut [u8], p: usize, round: u64) {
    let mut x = (p as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round;
    for (i, b) in page.iter_mut().enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = if i % 2 == 0 { x as u8 } else { (p ^ i) as u8 };
    }
}

fn page_slice(base: *mut u8, p: usize) -> &'static mut [u8] {
    // SAFETY: tests only pass pages inside a live region they own.
    unsafe { std::slice::from_raw_parts_mut(base.add(p * PAGE), PAGE) }
}

fn check(base: *mut u8, p: usize, round: u64) {
    let mut want = vec![0u8; PAGE];
    fill(&mut want, p, round);
    assert!(page_slice(base, p) == want.as_slice(), "page {p} differs");
}

/// Reads one byte of page `p` (a touch that faults if the page is not mapped).
fn touch(base: *mut u8, p: usize) -> u8 {
    // SAFETY: inside the region; a volatile read so that the access happens.
    unsafe { std::ptr::read_volatile(base.add(p * PAGE + 8)) }
}

/// A placement whose next victims the test sets, recording second chances.
#[derive(Clone, Default)]
struct Script {
    next: Arc<Mutex<Vec<usize>>>,
    chances: Arc<Mutex<Vec<usize>>>,
}

impl Placement for Script {
    fn fault_in(&mut self, _page: usize) -> Option<usize> {
        None
    }
    fn evict_failed(&mut self, _page: usize) {}
    fn freed(&mut self, _page: usize) {}
    fn next_victims(&mut self, n: usize) -> Vec<usize> {
        self.next.lock().unwrap().iter().take(n).copied().collect()
    }
    fn second_chance(&mut self, page: usize) {
        self.chances.lock().unwrap().push(page);
    }
}

/// The state machine, step by step: resident → probation (after an eviction) → hit
/// (put back, second chance) or evicted from the copy → faulted back from the slow
/// tier; a write to a page on probation, a free of one, a sample that does not draw
/// them, and shutdown bringing the rest back.
fn state_machine(memfd: bool) {
    let pages = 128;
    let (r, u, mem) = Region::new(memfd, pages);
    let base = r.base();
    let tier = Arc::new(CompressedStore::new(PAGE, 1 << 30));
    let script = Script::default();
    let cfg = TierConfig {
        probation_pages: 8,
        evict_linger: Duration::ZERO,
        track_remove: !memfd,
        ..TierConfig::new(31)
    };
    let m = TierManager::start(u, mem, tier.clone(), Box::new(script.clone()), cfg).unwrap();
    for p in 0..pages {
        fill(page_slice(base, p), p, 1);
    }
    // Nothing evicted yet: nothing on probation, whatever the placement names.
    *script.next.lock().unwrap() = (0..10).collect();
    assert_eq!(m.stats().probation_pages, 0);
    // An eviction: afterwards the next victims (at most 8, and an eighth of the 127
    // resident pages: 15) are on probation, still held in local memory.
    m.evict(&[127]);
    m.wait_evictions();
    let s = m.stats();
    assert_eq!(
        (s.evictions, s.probation_pages, s.probation_entries),
        (1, 8, 8),
        "{s:?}"
    );
    assert_eq!(s.resident_pages, 127);
    assert_eq!(tier.stats().pages, 1);
    *script.next.lock().unwrap() = Vec::new();
    // A sample draws mapped pages only, and its frame excludes the 8 on probation.
    let sampled = m.sample_begin();
    assert!(
        !sampled.is_empty() && sampled.iter().all(|&p| p >= 8),
        "{sampled:?}"
    );
    // A sampled page named as a victim is stored from its copy (not refused, which
    // would leave it in fast memory above the allocation).
    let victim = sampled[0];
    m.evict(&[victim]);
    m.wait_evictions();
    let s = m.stats();
    assert_eq!((s.evictions, s.evict_failures), (2, 0), "{s:?}");
    assert_eq!((s.stored_pages, s.resident_pages), (2, 126), "{s:?}");
    let w = m.sample_end();
    assert_eq!(w.resident, 127 - 8);
    // A touch of page 0: put back from its copy, a second chance, no slow access.
    check(base, 0, 1);
    let s = settle(&m, |s| s.probation_hits == 1);
    assert_eq!((s.probation_pages, s.slow_faults), (7, 0), "{s:?}");
    assert_eq!(*script.chances.lock().unwrap(), vec![0]);
    // The epoch counts it as a fast access and as a hotness sample of page 0.
    let e = m.take_epoch();
    assert_eq!((e.fast, e.slow), (1.0, 0));
    assert_eq!(e.pages, vec![(0, 1)]);
    // The sampled victim comes back from the slow tier.
    check(base, victim, 1);
    settle(&m, |s| s.slow_faults == 1);
    // A write to page 3 on probation lands on its bytes.
    page_slice(base, 3)[100] ^= 0xFF;
    let s = settle(&m, |s| s.probation_hits == 2);
    page_slice(base, 3)[100] ^= 0xFF;
    check(base, 3, 1);
    assert_eq!(s.probation_pages, 6);
    // Page 1 evicted untouched: stored from its copy, no protect or drop needed.
    m.evict(&[1, 2]);
    m.wait_evictions();
    let s = m.stats();
    assert_eq!((s.evictions, s.probation_evictions), (4, 3), "{s:?}");
    assert_eq!((s.probation_pages, s.stored_pages), (4, 3), "{s:?}");
    assert_eq!(s.resident_pages, 125);
    // Faulted back from the slow tier, byte-identical.
    check(base, 1, 1);
    let s = settle(&m, |s| s.slow_faults == 2);
    assert_eq!(s.probation_hits, 2);
    // The application frees page 4, on probation: it reads zeros.
    if !memfd {
        // SAFETY: the application drops a page of its own region.
        let rc = unsafe {
            libc::madvise(
                base.add(4 * PAGE) as *mut libc::c_void,
                PAGE,
                libc::MADV_DONTNEED,
            )
        };
        assert_eq!(rc, 0);
        assert!(page_slice(base, 4).iter().all(|&b| b == 0));
        let s = settle(&m, |s| s.freed_pages == 1);
        assert_eq!(s.probation_pages, 3, "{s:?}");
        fill(page_slice(base, 4), 4, 1);
    }
    assert!(m.transient_pages().is_empty(), "{:?}", m.transient_pages());
    // Shutdown brings back the pages still on probation and in the slow tier.
    m.stop().unwrap();
    for p in 0..pages {
        check(base, p, 1);
    }
}

#[test]
fn probation_state_machine_anon() {
    if permitted() {
        state_machine(false);
    }
}

#[test]
fn probation_state_machine_memfd() {
    if permitted() {
        state_machine(true);
    }
}

/// One run of the pressure test: `hot` is touched between every two touches of the
/// other pages, which are touched in turn, each once per pass, in a region 8 times
/// its fast memory. Returns the slow faults of the second pass (every page has been
/// touched once before it) and the final counters; asserts the contents.
fn pressure(memfd: bool, probation_pages: usize) -> (u64, ManagerStats, Tier, Tier) {
    let (pages, fast) = (256usize, 32u64);
    let (hot, pid) = (0usize, 7);
    let (r, u, mem) = Region::new(memfd, pages);
    let base = r.base();
    let policy = Arc::new(Mutex::new(MaxMem::new(MaxMemConfig::with_capacity(
        fast,
        PAGE as u64,
    ))));
    policy.lock().unwrap().register(pid, 1.0).unwrap();
    let cfg = TierConfig {
        probation_pages,
        evict_linger: Duration::ZERO,
        ..TierConfig::new(32)
    };
    let placement = MaxMemPlacement::new(policy.clone(), pid, 0, pages);
    let m = TierManager::start(
        u,
        mem,
        Arc::new(CompressedStore::new(PAGE, 1 << 30)),
        Box::new(placement),
        cfg,
    )
    .unwrap();
    // Each touch of another page faults (zero fill in the first pass, the slow tier in
    // the second) and evicts one page once fast memory is full; wait for that
    // eviction (and the probation top-up after it) before touching the hot page, so
    // that the run does not depend on the machine's speed.
    // Each fault evicts one page once fast memory is full; every one is waited for
    // (and the probation top-up after it) before the next touch, so that the run
    // does not depend on the machine's speed. The hot page is first touched once
    // fast memory is full (before, there is no probation to protect it: no page has
    // been evicted yet).
    let mut faults = 0u64;
    let mut hot_seen = false;
    let mut slow_first = 0;
    let fault_and_wait = |faults: &mut u64| {
        *faults += 1;
        // This fault counted, and every victim so far (one per fault beyond the
        // fast memory) evicted.
        let want = *faults;
        settle(&m, |s| {
            let f = s.zero_faults + s.slow_faults;
            f >= want && s.evictions + fast >= f
        });
        m.wait_evictions();
    };
    for pass in 0..2 {
        if pass == 1 {
            slow_first = m.stats().slow_faults;
        }
        for p in 1..pages {
            fill(page_slice(base, p), p, pass);
            fault_and_wait(&mut faults);
            if hot_seen {
                touch(base, hot);
            } else if faults + 1 == fast {
                fill(page_slice(base, hot), hot, 9);
                fault_and_wait(&mut faults);
                hot_seen = true;
            }
        }
    }
    let s = m.stats();
    let tiers = {
        let pol = policy.lock().unwrap();
        (
            pol.tier_of(pid, hot as u64).unwrap(),
            pol.tier_of(pid, 1).unwrap(),
        )
    };
    check(base, hot, 9);
    for p in 1..pages {
        check(base, p, 1);
    }
    m.stop().unwrap();
    (s.slow_faults - slow_first, s, tiers.0, tiers.1)
}

fn hot_page_survives(memfd: bool) {
    // With probation: the hot page is on probation each time it is about to be the
    // victim, its touch puts it back, and it never leaves fast memory; every slow
    // fault is a page touched once per pass (all of them in the second), and those
    // go.
    let (slow, s, hot, cold) = pressure(memfd, 4);
    assert_eq!((slow, s.slow_faults), (255, 255), "{s:?}");
    assert!(s.probation_hits > 0 && s.probation_evictions > 0, "{s:?}");
    assert_eq!((hot, cold), (Tier::Fast, Tier::Slow));
    // Without: the policy's victims are first in, first out, and the hot page goes
    // every time it reaches the front (each 32 evictions or so).
    let (slow, s, _, _) = pressure(memfd, 0);
    assert!(slow >= 255 + 6, "{slow} {s:?}");
    assert_eq!(s.probation_hits, 0);
}

#[test]
fn hot_page_survives_eviction_pressure_and_cold_ones_go_anon() {
    if permitted() {
        hot_page_survives(false);
    }
}

#[test]
fn hot_page_survives_eviction_pressure_and_cold_ones_go_memfd() {
    if permitted() {
        hot_page_survives(true);
    }
}
