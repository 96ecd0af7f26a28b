//! A tier node on real memory of this process: two regions standing for two
//! processes share a fast tier of 128 pages under the MaxMem policy. The test drives
//! the sampling windows and policy epochs itself, so nothing depends on the
//! machine's speed.
//!
//! Needs userfaultfd (root, or vm.unprivileged_userfaultfd = 1; checked first).

use memcolo_policy::maxmem::{MaxMemConfig, Need};
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::manager::{TierConfig, TierManager};
use memcolo_tier::node::TierNode;
use memcolo_tier::region::{AnonRegion, PAGE};
use memcolo_tier::uffd::{features, mode, Uffd};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::*;

fn word(p: usize, round: u64) -> u64 {
    (p as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round
}

fn write_page(base: *mut u8, p: usize, round: u64) {
    // SAFETY: tests only pass pages inside a live region they own.
    let page = unsafe { std::slice::from_raw_parts_mut(base.add(p * PAGE) as *mut u64, PAGE / 8) };
    for (i, w) in page.iter_mut().enumerate() {
        *w = word(p, round) ^ i as u64;
    }
}

fn check_page(base: *mut u8, p: usize, round: u64) {
    // SAFETY: as above.
    let page = unsafe { std::slice::from_raw_parts(base.add(p * PAGE) as *const u64, PAGE / 8) };
    for (i, &w) in page.iter().enumerate() {
        assert_eq!(w, word(p, round) ^ i as u64, "page {p} word {i}");
    }
}

fn read_page(base: *mut u8, p: usize) {
    // SAFETY: reading page p of a live region.
    unsafe { std::ptr::read_volatile(base.add(p * PAGE) as *const u64) };
}

struct Proc {
    pid: i32,
    region: AnonRegion,
    first: u64,
    manager: Arc<TierManager>,
}

fn start(node: &TierNode, pid: i32, t_miss: f64, pages: usize, id: u64) -> Proc {
    let cfg = TierConfig {
        sample_pages: 64,
        ..TierConfig::new(id)
    };
    start_with(node, pid, t_miss, pages, cfg)
}

fn start_with(node: &TierNode, pid: i32, t_miss: f64, pages: usize, cfg: TierConfig) -> Proc {
    node.register(pid, t_miss).unwrap();
    let region = AnonRegion::new(pages).unwrap();
    let base = region.as_ptr() as u64;
    let u = Uffd::open(features::PAGEFAULT_FLAG_WP).unwrap();
    u.register(base, region.len() as u64, mode::MISSING | mode::WP)
        .unwrap();
    let first = TierNode::first_page_of(base);
    let placement = node.placement(pid, first);
    let manager = Arc::new(
        TierManager::start(
            u,
            Box::new(region.memory()),
            Arc::new(CompressedStore::new(PAGE, 1 << 26)),
            Box::new(placement),
            cfg,
        )
        .unwrap(),
    );
    node.attach(pid, first, manager.clone());
    Proc {
        pid,
        region,
        first,
        manager,
    }
}

/// Waits until every fault of `m` has been accounted, in the region and in the
/// policy: the node drains the fault records (the policy may name victims then), and
/// the region settles again.
fn settle_node(node: &TierNode, m: &TierManager) {
    settle(m);
    node.drain();
    settle(m);
}

/// Waits until every fault the test thread took has been accounted (the fault
/// thread finishes its bookkeeping after waking the faulting thread).
fn settle(m: &TierManager) {
    let start = Instant::now();
    loop {
        let before = m.stats();
        std::thread::sleep(Duration::from_millis(5));
        m.wait_evictions();
        if m.stats() == before {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never settled");
    }
}

/// A best-effort process (t_miss = 1) holds the whole fast tier; a latency-sensitive
/// one (t_miss = 0.1) arrives with none, misses on every access, and the policy moves
/// fast memory to it, R = 32 pages per epoch, until its a_miss meets its target: well
/// within the 10 epochs the issue allows. Reallocation demotions are routed to the
/// best-effort region's manager; no byte of either region is lost.
#[test]
fn latency_sensitive_process_gets_fast_memory_from_an_idle_best_effort_one() {
    if !permitted() {
        return;
    }
    let cfg = MaxMemConfig {
        migration_cap_pages: 64,
        ..MaxMemConfig::with_capacity(128, PAGE as u64)
    };
    let node = TierNode::new(cfg).unwrap();
    let be = start(&node, 2, 1.0, 256, 1);
    for p in 0..256 {
        write_page(be.region.as_ptr(), p, 1);
    }
    settle_node(&node, &be.manager);
    assert_eq!(node.lock_policy().status(2).unwrap().fast_pages, 128);
    assert_eq!(be.manager.stats().resident_pages, 128);

    let ls = start(&node, 1, 0.1, 256, 2);
    for p in 0..256 {
        write_page(ls.region.as_ptr(), p, 7);
    }
    settle_node(&node, &ls.manager);
    assert_eq!(node.lock_policy().status(1).unwrap().fast_pages, 0);

    // The latency-sensitive process reads its hot set, pages 0..64, in every window;
    // the best-effort one is idle.
    let mut met_at = None;
    for epoch in 1..=10u64 {
        for _ in 0..4 {
            node.window();
            for p in 0..64 {
                read_page(ls.region.as_ptr(), p);
            }
            settle(&ls.manager);
        }
        let (out, applied) = node.epoch();
        settle(&be.manager);
        let s = out.procs.iter().find(|p| p.pid == 1).unwrap();
        let b = out.procs.iter().find(|p| p.pid == 2).unwrap();
        eprintln!(
            "epoch {epoch}: ls a_miss {:.3} alloc {} fast {} | be alloc {} fast {} | {applied:?}",
            s.a_miss, s.alloc_pages, s.fast_pages, b.alloc_pages, b.fast_pages
        );
        assert!(applied.failed.is_empty() && applied.unrouted == 0);
        assert!(s.alloc_pages + b.alloc_pages <= 128);
        node.lock_policy().check_invariants().unwrap();
        // Real memory follows the policy: the best-effort region keeps no more pages
        // resident than the policy counts fast for it, once the policy has heard what
        // the region reported (a demoted page caught mid-sample is refused, stays
        // resident and is reported back as fast: the epoch's outcome predates that).
        node.drain();
        let be_fast = node.lock_policy().status(2).unwrap().fast_pages;
        assert!(
            be.manager.stats().resident_pages <= be_fast,
            "{:?} vs {be_fast} (the epoch's outcome said {})",
            be.manager.stats(),
            b.fast_pages
        );
        if s.a_miss <= s.t_miss && met_at.is_none() {
            met_at = Some(epoch);
            assert_eq!(s.need, Need::Surplus);
        }
    }
    let met_at = met_at.expect("the target was never met in 10 epochs");
    eprintln!("target met at epoch {met_at}");
    let s = node.lock_policy().status(1).unwrap();
    assert!(s.fast_pages >= 64, "{s:?}");

    // Nothing lost, in either region; then both leave management.
    for p in 0..256 {
        check_page(ls.region.as_ptr(), p, 7);
        check_page(be.region.as_ptr(), p, 1);
    }
    for proc in [ls, be] {
        drop(proc.manager);
        let m = node.detach(proc.pid, proc.first).unwrap();
        let m = Arc::try_unwrap(m)
            .ok()
            .expect("the node held the last reference");
        m.stop().unwrap();
        for p in 0..256 {
            check_page(proc.region.as_ptr(), p, if proc.pid == 1 { 7 } else { 1 });
        }
    }
    assert!(node.regions().is_empty());
}

/// A probation longer than the faults' share of the victim list stays full: the node
/// keeps a region's list as long as its probation last asked to see, besides what the
/// faults take. One process over its 5000-page fast tier takes 10 slow faults per
/// epoch (the list the node would size for the faults alone is 256 + 4 x 10 pages);
/// each fault takes a page off probation, and probation refills to its 600 pages.
/// Every page survives.
#[test]
fn probation_longer_than_the_faults_share_of_the_victim_list_fills() {
    if !permitted() {
        return;
    }
    let (fast, pages, probation) = (5000usize, 6000usize, 600usize);
    let node = TierNode::new(MaxMemConfig::with_capacity(fast as u64, PAGE as u64)).unwrap();
    let cfg = TierConfig {
        sample_pages: 64,
        probation_pages: probation,
        ..TierConfig::new(1)
    };
    let p = start_with(&node, 1, 0.1, pages, cfg);
    for i in 0..pages {
        write_page(p.region.as_ptr(), i, 3);
    }
    settle_node(&node, &p.manager);
    assert_eq!(
        node.lock_policy().status(1).unwrap().fast_pages,
        fast as u64
    );
    // The fill stored the oldest pages (0..1000, first in the coldest bin) to the slow
    // tier. Epochs of 10 slow faults on them; each epoch publishes the victim lists
    // afresh, and each fault's victim is the front of the list: a page on probation.
    let before = p.manager.stats();
    for round in 0..20 {
        for i in round * 10..round * 10 + 10 {
            read_page(p.region.as_ptr(), i);
        }
        settle(&p.manager);
        let (_, applied) = node.epoch();
        assert!(applied.failed.is_empty() && applied.unrouted == 0);
        settle(&p.manager);
    }
    let st = p.manager.stats();
    assert_eq!(st.slow_faults - before.slow_faults, 200, "{st:?}");
    assert_eq!(st.probation_pages, probation as u64, "{st:?}");
    assert!(st.resident_pages <= fast as u64, "{st:?}");
    for i in 0..pages {
        check_page(p.region.as_ptr(), i, 3);
    }
    drop(p.manager);
    let m = node.detach(p.pid, p.first).unwrap();
    Arc::try_unwrap(m)
        .ok()
        .expect("the node held the last reference")
        .stop()
        .unwrap();
}
