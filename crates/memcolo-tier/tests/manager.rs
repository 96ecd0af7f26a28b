//! The tier manager on real memory of this process: pages written by application
//! threads are evicted to the slow tier and faulted back byte-identical, writes racing
//! with eviction are never lost, a failing slow tier stops the faulting thread with a
//! clear reason instead of handing it zeros, and the access estimator counts exactly
//! the sampled pages a known access pattern touches.
//!
//! These tests need userfaultfd: root, or vm.unprivileged_userfaultfd = 1 (checked
//! first; without it they print why and pass).

use memcolo_policy::maxmem::{MaxMem, MaxMemConfig};
use memcolo_tier::channel::{Auth, Secret};
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::manager::{NoPlacement, Placement, TierConfig, TierManager};
use memcolo_tier::memserver::{MemServer, ServerConfig};
use memcolo_tier::placement::MaxMemPlacement;
use memcolo_tier::region::{AnonRegion, MemfdRegion, RegionMemory, PAGE};
use memcolo_tier::remote::{RemoteConfig, RemoteTier};
use memcolo_tier::uffd::{features, mode, Uffd};
use memcolo_tier::{PageKey, SlowTier, TierError, TierStats};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::*;

/// The shared secret of the memory servers and clients of these tests.
fn test_auth() -> Auth {
    Auth::Secret(Arc::new(Secret::from_bytes(vec![0x5a; 32]).unwrap()))
}

/// An anonymous region registered with a fresh userfaultfd.
fn anon(pages: usize, feats: u64) -> (AnonRegion, Uffd) {
    let r = AnonRegion::new(pages).unwrap();
    let u = Uffd::open(features::PAGEFAULT_FLAG_WP | feats).unwrap();
    u.register(r.as_ptr() as u64, r.len() as u64, mode::MISSING | mode::WP)
        .unwrap();
    (r, u)
}

/// An anonymous region of `pages` pages (userfaultfd features `feats` besides write
/// protection) under a started manager with the given slow tier, placement and config.
fn managed_anon(
    pages: usize,
    feats: u64,
    tier: Arc<dyn SlowTier>,
    placement: Box<dyn Placement>,
    cfg: TierConfig,
) -> (AnonRegion, TierManager) {
    let (r, u) = anon(pages, feats);
    let m = TierManager::start(u, Box::new(r.memory()), tier, placement, cfg).unwrap();
    (r, m)
}

fn store() -> Arc<CompressedStore> {
    Arc::new(CompressedStore::new(PAGE, 1 << 30))
}

/// The byte pattern of page `p` in round `round`: distinct per page and round,
/// compressible in parts and not in others.
fn fill(page: &mut [u8], p: usize, round: u64) {
    let mut x = (p as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round;
    for (i, b) in page.iter_mut().enumerate() {
        if i % 512 < 256 {
            *b = (i as u64 ^ p as u64 ^ round) as u8;
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
}

fn page_slice(base: *mut u8, p: usize) -> &'static mut [u8] {
    // SAFETY: tests only pass pages inside a live region they own.
    unsafe { std::slice::from_raw_parts_mut(base.add(p * PAGE), PAGE) }
}

fn write_all(base: *mut u8, pages: usize, round: u64) {
    for p in 0..pages {
        fill(page_slice(base, p), p, round);
    }
}

fn check_all(base: *mut u8, pages: usize, round: u64) {
    let mut want = vec![0u8; PAGE];
    for p in 0..pages {
        fill(&mut want, p, round);
        assert!(page_slice(base, p) == want.as_slice(), "page {p} differs");
    }
}

#[test]
fn anon_pages_evicted_and_faulted_back_byte_identical() {
    if !permitted() {
        return;
    }
    let pages = 512;
    let tier = store();
    let (r, m) = managed_anon(
        pages,
        0,
        tier.clone(),
        Box::new(NoPlacement),
        TierConfig::new(1),
    );
    write_all(r.as_ptr(), pages, 7);
    assert_eq!(m.stats().zero_faults, pages as u64);
    assert_eq!(m.stats().resident_pages, pages as u64);

    m.evict(&(0..pages).collect::<Vec<_>>());
    m.wait_evictions();
    let s = m.stats();
    assert_eq!(
        (s.evictions, s.resident_pages, s.stored_pages),
        (pages as u64, 0, pages as u64),
        "{:?}",
        m.last_error()
    );
    assert_eq!(tier.stats().pages, pages as u64);
    // RSS of the region went away: every page is really dropped.
    check_all(r.as_ptr(), pages, 7);
    let s = settle(&m, |s| s.stored_pages == 0);
    assert_eq!(s.slow_faults, pages as u64);
    assert_eq!(
        tier.stats().pages,
        0,
        "copies of pages brought back are dropped"
    );
    assert_eq!((s.resident_pages, s.stored_pages), (pages as u64, 0));
    let e = m.take_epoch();
    assert_eq!(e.slow, pages as u64);
    assert_eq!(e.pages.len(), pages);

    // A kernel-mode access (write(2) reads the page) is served too.
    m.evict(&[3]);
    m.wait_evictions();
    let mut fds = [0i32; 2];
    // SAFETY: creating a pipe.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: page 3 lies in the region; the kernel faults it in through the manager.
    let n = unsafe {
        libc::write(
            fds[1],
            r.as_ptr().add(3 * PAGE) as *const libc::c_void,
            PAGE,
        )
    };
    assert_eq!(n, PAGE as isize);
    let mut got = vec![0u8; PAGE];
    // SAFETY: reading into a live buffer.
    let n = unsafe { libc::read(fds[0], got.as_mut_ptr() as *mut libc::c_void, PAGE) };
    assert_eq!(n, PAGE as isize);
    let mut want = vec![0u8; PAGE];
    fill(&mut want, 3, 7);
    assert_eq!(got, want);
    // SAFETY: closing our pipe.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }

    // Stopping brings every page back and leaves plain memory.
    m.evict(&(0..pages).step_by(2).collect::<Vec<_>>());
    m.wait_evictions();
    m.stop().unwrap();
    check_all(r.as_ptr(), pages, 7);
    assert_eq!(tier.stats().pages, 0);
}

#[test]
fn memfd_pages_evicted_and_faulted_back_byte_identical() {
    if !permitted() {
        return;
    }
    let pages = 256;
    let r = MemfdRegion::new(pages).unwrap();
    // The manager reaches the pages through its own mapping of the memfd, as the
    // agent does for another process.
    let (u, mem) = memfd_under_uffd(&r);
    let m = TierManager::start(
        u,
        Box::new(mem),
        store(),
        Box::new(NoPlacement),
        TierConfig::new(2),
    )
    .unwrap();
    write_all(r.as_ptr(), pages, 3);
    for round in 0..3 {
        m.evict(&(0..pages).filter(|p| p % 3 != round).collect::<Vec<_>>());
        m.wait_evictions();
        check_all(r.as_ptr(), pages, 3);
    }
    let s = settle(&m, |s| s.stored_pages == 0);
    assert!(s.evictions > 0 && s.slow_faults == s.evictions, "{s:?}");
    m.stop().unwrap();
    check_all(r.as_ptr(), pages, 3);
}

/// Writers keep writing while pages are evicted under them: write protection makes
/// every write wait for its page's eviction and land after it, so none is lost.
#[test]
fn writes_racing_with_eviction_are_never_lost() {
    if !permitted() {
        return;
    }
    let pages = 128;
    let rounds = 40u64;
    let (r, m) = managed_anon(pages, 0, store(), Box::new(NoPlacement), TierConfig::new(3));
    let base = r.as_ptr() as usize;
    let m = Arc::new(m);
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let done = done.clone();
        std::thread::spawn(move || {
            for round in 1..=rounds {
                write_all(base as *mut u8, pages, round);
            }
            done.store(true, Ordering::Release);
        })
    };
    let mut x = 12345u64;
    let mut batches = 0;
    while !done.load(Ordering::Acquire) {
        let batch: Vec<usize> = (0..16)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % pages as u64) as usize
            })
            .collect();
        m.evict(&batch);
        m.wait_evictions();
        batches += 1;
    }
    writer.join().unwrap();
    check_all(r.as_ptr(), pages, rounds);
    let s = m.stats();
    eprintln!("{batches} eviction rounds during the writes: {s:?}");
    assert!(s.evictions > 0);
    Arc::try_unwrap(m).ok().unwrap().stop().unwrap();
    check_all(r.as_ptr(), pages, rounds);
}

/// The MaxMem policy as placement: a fast tier of 64 pages for a region of 256, so
/// every fault past 64 resident pages evicts the process's coldest page.
#[test]
fn maxmem_placement_keeps_resident_pages_within_the_allocation() {
    if !permitted() {
        return;
    }
    let pages = 256;
    let policy = Arc::new(Mutex::new(MaxMem::new(MaxMemConfig::with_capacity(
        64,
        PAGE as u64,
    ))));
    policy.lock().unwrap().register(42, 1.0).unwrap();
    let placement = MaxMemPlacement::new(policy.clone(), 42, 0, pages);
    let (r, m) = managed_anon(pages, 0, store(), Box::new(placement), TierConfig::new(4));
    write_all(r.as_ptr(), pages, 1);
    m.wait_evictions();
    assert_eq!(m.stats().resident_pages, 64);
    assert_eq!(policy.lock().unwrap().status(42).unwrap().fast_pages, 64);
    check_all(r.as_ptr(), pages, 1);
    // Every slow fault evicted one page in exchange (on top of the 192 of the first
    // pass); wait for the last ones.
    let start = Instant::now();
    let s = loop {
        m.wait_evictions();
        let s = m.stats();
        if s.evictions == 192 + s.slow_faults && s.resident_pages == 64 {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{s:?}");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(s.resident_pages, 64, "{s:?}");
    assert_eq!(s.stored_pages, 192);
    let st = policy.lock().unwrap().status(42).unwrap();
    assert_eq!((st.fast_pages, st.slow_pages), (64, 192));
    m.stop().unwrap();
}

/// A manager released while something else still holds it (the agent's epoch, in
/// flight), told to discard: the last reference drops the region's slow-tier pages
/// and unregisters it, and does not bring them back (the region is being unmapped or
/// its process exited). Without the flag the last reference brings them back.
#[test]
fn manager_dropped_last_discards_when_told() {
    if !permitted() {
        return;
    }
    for discard in [true, false] {
        let pages = 64;
        let r = MemfdRegion::new(pages).unwrap();
        let (u, mem) = memfd_under_uffd(&r);
        let tier = store();
        let m = Arc::new(
            TierManager::start(
                u,
                Box::new(mem),
                tier.clone(),
                Box::new(NoPlacement),
                TierConfig::new(7),
            )
            .unwrap(),
        );
        write_all(r.as_ptr(), pages, 9);
        m.evict(&(0..pages).collect::<Vec<_>>());
        m.wait_evictions();
        assert_eq!(tier.stats().pages, pages as u64);
        let other = m.clone();
        if discard {
            m.discard_when_dropped();
        }
        drop(m);
        assert_eq!(tier.stats().pages, pages as u64, "dropped while still held");
        drop(other);
        assert_eq!(tier.stats().pages, 0);
        if discard {
            // Unregistered and not brought back: the holes read as zeros.
            assert!(page_slice(r.as_ptr(), 5).iter().all(|&b| b == 0));
        } else {
            check_all(r.as_ptr(), pages, 9);
        }
    }
}

/// A region handed over again (a process giving its memfd region to an agent that
/// restarted): the manager takes the pages the memfd holds as resident, places each
/// as if it had just faulted in, and evicts what the allocation cannot hold; holes
/// still read as zeros, and every byte survives, through eviction and a stop.
#[test]
fn memfd_region_holding_data_is_taken_over() {
    if !permitted() {
        return;
    }
    let pages = 256;
    let r = MemfdRegion::new(pages).unwrap();
    // Written before any manager: pages 0..100 and 150..200; 100..150 and 200..256
    // are holes.
    let written: Vec<usize> = (0..100).chain(150..200).collect();
    for &p in &written {
        fill(page_slice(r.as_ptr(), p), p, 5);
    }
    let (u, mem) = memfd_under_uffd(&r);
    assert_eq!(mem.present_runs().unwrap(), vec![(0, 100), (150, 50)]);
    let policy = Arc::new(Mutex::new(MaxMem::new(MaxMemConfig::with_capacity(
        64,
        PAGE as u64,
    ))));
    policy.lock().unwrap().register(42, 1.0).unwrap();
    let placement = MaxMemPlacement::new(policy.clone(), 42, 0, pages);
    let m = TierManager::start(
        u,
        Box::new(mem),
        store(),
        Box::new(placement),
        TierConfig::new(6),
    )
    .unwrap();
    m.wait_evictions();
    let s = settle(&m, |s| s.resident_pages == 64 && s.stored_pages == 86);
    assert_eq!(s.adopted_pages, 150, "{s:?}");
    assert_eq!((s.zero_faults, s.slow_faults), (0, 0), "{s:?}");
    let st = policy.lock().unwrap().status(42).unwrap();
    assert_eq!((st.fast_pages, st.slow_pages), (64, 86));
    let mut want = vec![0u8; PAGE];
    for p in 0..pages {
        if written.contains(&p) {
            fill(&mut want, p, 5);
        } else {
            want.fill(0);
        }
        assert!(
            page_slice(r.as_ptr(), p) == want.as_slice(),
            "page {p} differs"
        );
    }
    let s = m.stats();
    assert_eq!(s.zero_faults, 106, "{s:?}");
    assert!(s.slow_faults >= 86, "{s:?}");
    m.stop().unwrap();
    for &p in &written {
        fill(&mut want, p, 5);
        assert!(
            page_slice(r.as_ptr(), p) == want.as_slice(),
            "page {p} after stop"
        );
    }
}

/// The estimator against a known access pattern on real memory: 1024 resident
/// pages, pages 0..300 touched in every window. Hits are exactly the sampled pages of
/// the touched set, and over 60 windows the estimate comes close to 300.
#[test]
fn sampled_estimate_matches_a_known_access_pattern() {
    if !permitted() {
        return;
    }
    let pages = 1024;
    let touched = 300;
    let cfg = TierConfig {
        sample_target_hits: 0, // always 64 pages
        ..TierConfig::new(5)
    };
    let (r, m) = managed_anon(pages, 0, store(), Box::new(NoPlacement), cfg);
    write_all(r.as_ptr(), pages, 9);
    let windows = 60;
    let mut sum = 0.0;
    for w in 0..windows {
        let sampled = m.sample_begin();
        assert_eq!(sampled.len(), 64);
        for p in 0..touched {
            // SAFETY: reading page p of the live region.
            unsafe { std::ptr::read_volatile(r.as_ptr().add(p * PAGE + (w % PAGE))) };
        }
        let est = m.sample_end();
        let expected_hits = sampled.iter().filter(|&&p| p < touched).count() as u64;
        assert_eq!(est.hits, expected_hits, "window {w}");
        assert_eq!((est.resident, est.sampled), (pages as u64, 64));
        sum += est.estimate();
    }
    let mean = sum / windows as f64;
    // Relative standard error of one window: sqrt(0.707/(64·0.293)·960/1023) = 0.19;
    // of the mean of 60 windows 0.025: allow 4 of those (10 %).
    assert!(
        (mean - touched as f64).abs() < 0.1 * touched as f64,
        "mean estimate {mean}"
    );
    let e = m.take_epoch();
    assert!((e.fast - sum).abs() < 1e-6);
    assert_eq!(e.slow, 0);
    // Untouched sampled pages were put back: content intact, nothing left out.
    check_all(r.as_ptr(), pages, 9);
    assert_eq!(m.stats().resident_pages, pages as u64);
    m.stop().unwrap();
}

/// Re-arming on real memory: once the region has a slow access, a window's sampled
/// pages touched are re-armed at each slot boundary, so a page touched in three
/// slots counts three touches (the accesses), where one window without re-arming
/// counts it once (a distinct page). Contents stay intact throughout.
#[test]
fn rearmed_sample_counts_touches_per_slot() {
    if !permitted() {
        return;
    }
    let pages = 1024;
    let touched = 300;
    let cfg = TierConfig {
        sample_target_hits: 0, // always 64 pages
        ..TierConfig::new(6)
    };
    let (r, m) = managed_anon(pages, 0, store(), Box::new(NoPlacement), cfg);
    write_all(r.as_ptr(), pages, 4);
    let touch = |p: usize| {
        // SAFETY: reading page p of the live region.
        unsafe { std::ptr::read_volatile(r.as_ptr().add(p * PAGE)) };
    };
    // No slow access yet: the window does not re-arm, and a slot boundary is a no-op.
    m.sample_begin();
    assert!(!m.sample_rearming());
    assert!(!m.sample_rearm());
    let est = m.sample_end();
    assert_eq!(est.hits, est.pages_hit);
    // One slow access (page 1000 evicted, then read).
    m.wait_evicted(m.evict(&[1000]));
    m.sample_begin();
    touch(1000);
    // The fault thread counts the fault after waking the reader.
    common::settle(&m, |s| s.slow_faults == 1);
    m.sample_end();
    assert_eq!(m.stats().slow_faults, 1);
    let mut sum = 0.0;
    let windows = 30;
    for w in 0..windows {
        let sampled = m.sample_begin();
        assert!(m.sample_rearming(), "window {w}");
        assert_eq!(sampled.len(), 64);
        for slot in 0..3 {
            for p in 0..touched {
                touch(p);
            }
            if slot < 2 {
                assert!(m.sample_rearm());
            }
        }
        let est = m.sample_end();
        let expected = sampled.iter().filter(|&&p| p < touched).count() as u64;
        assert_eq!(est.pages_hit, expected, "window {w}");
        assert_eq!(est.hits, 3 * expected, "window {w}");
        sum += est.estimate();
    }
    // Three touches per slot-window of each of the 300 pages: about 900 per window
    // (relative standard error of the mean of 30 windows about 0.035; allow 15 %).
    let mean = sum / windows as f64;
    assert!((mean - 900.0).abs() < 0.15 * 900.0, "mean estimate {mean}");
    check_all(r.as_ptr(), pages, 4);
    assert_eq!(m.stats().resident_pages, pages as u64);
    m.stop().unwrap();
}

/// A latency-critical region's fault thread runs `SCHED_FIFO` and goes back to
/// ordinary scheduling when the process is no longer latency-critical.
#[test]
fn latency_critical_fault_thread_runs_sched_fifo() {
    if !permitted() {
        return;
    }
    let pages = 16;
    let (r, m) = managed_anon(
        pages,
        0,
        store(),
        Box::new(NoPlacement),
        TierConfig::new(77),
    );
    // The fault thread's scheduling policy (field 41 of its stat: 1 is SCHED_FIFO).
    let policy = || -> Option<u32> {
        for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() == "tier-fault-77" {
                let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
                let after = &stat[stat.rfind(')')? + 2..];
                return after.split_whitespace().nth(38)?.parse().ok();
            }
        }
        None
    };
    write_all(r.as_ptr(), pages, 1); // the fault thread has run
    assert_eq!(policy(), Some(0));
    m.set_latency_critical(true).unwrap();
    assert!(m.stats().latency_critical);
    assert_eq!(policy(), Some(1));
    // Faults are still served, and timed.
    m.wait_evicted(m.evict(&[3]));
    check_all(r.as_ptr(), pages, 1);
    let s = m.stats();
    assert_eq!(s.slow_faults, 1);
    assert!(s.slow_fault_ns > 0);
    m.set_latency_critical(false).unwrap();
    assert_eq!(policy(), Some(0));
    m.stop().unwrap();
}

/// A best-effort region's fault thread and eviction workers run `SCHED_IDLE` and
/// still serve every fault and eviction correctly; a latency-critical fault thread
/// stays `SCHED_FIFO` while its workers run idle; back to `SCHED_OTHER` after. The
/// per-step times and the threads' CPU times are reported.
#[test]
fn best_effort_tier_threads_run_sched_idle() {
    if !permitted() {
        return;
    }
    let pages = 32;
    let (r, m) = managed_anon(
        pages,
        0,
        store(),
        Box::new(NoPlacement),
        TierConfig::new(78),
    );
    // Each tier thread's scheduling policy (field 41 of its stat: 0 SCHED_OTHER,
    // 1 SCHED_FIFO, 5 SCHED_IDLE), by name prefix.
    let policies = |prefix: &str| -> Vec<u32> {
        let mut v = Vec::new();
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim().starts_with(prefix) {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap();
                let after = &stat[stat.rfind(')').unwrap() + 2..];
                v.push(after.split_whitespace().nth(38).unwrap().parse().unwrap());
            }
        }
        v
    };
    write_all(r.as_ptr(), pages, 1); // the fault thread has run
    m.wait_evicted(m.evict(&[0])); // and a worker
    check_all(r.as_ptr(), pages, 1);
    assert_eq!(policies("tier-fault-78"), vec![0]);
    m.set_idle(true).unwrap();
    assert_eq!(policies("tier-fault-78"), vec![5]);
    let workers = policies("tier-evict-78-");
    assert!(
        !workers.is_empty() && workers.iter().all(|&p| p == 5),
        "{workers:?}"
    );
    // Evictions and slow faults are served from idle threads, contents intact.
    let evict: Vec<usize> = (0..pages).step_by(2).collect();
    m.wait_evicted(m.evict(&evict));
    write_all(r.as_ptr(), pages, 2);
    check_all(r.as_ptr(), pages, 2);
    let s = settle(&m, |s| s.slow_faults == 1 + evict.len() as u64);
    assert!(s.slow_load_ns > 0 && s.slow_map_ns > 0 && s.slow_drop_ns > 0);
    assert!(s.slow_load_ns + s.slow_map_ns + s.slow_drop_ns <= s.slow_fault_ns);
    assert!(s.fault_thread_cpu_ns > 0 && s.evict_threads_cpu_ns > 0);
    // Latency-critical takes precedence for the fault thread only.
    m.set_latency_critical(true).unwrap();
    assert_eq!(policies("tier-fault-78"), vec![1]);
    assert!(policies("tier-evict-78-").iter().all(|&p| p == 5));
    m.set_latency_critical(false).unwrap();
    assert_eq!(policies("tier-fault-78"), vec![5]);
    m.set_idle(false).unwrap();
    assert_eq!(policies("tier-fault-78"), vec![0]);
    assert!(policies("tier-evict-78-").iter().all(|&p| p == 0));
    m.stop().unwrap();
}

/// A slow tier that hands back damaged bytes without noticing: the manager's own
/// CRC-32 of the page catches it.
struct Damaging {
    inner: CompressedStore,
    damage: AtomicBool,
}

impl SlowTier for Damaging {
    fn name(&self) -> &'static str {
        "damaging"
    }
    fn page_bytes(&self) -> usize {
        PAGE
    }
    fn store(&self, key: PageKey, data: &[u8]) -> Result<(), TierError> {
        self.inner.store(key, data)
    }
    fn load(&self, key: PageKey, out: &mut [u8]) -> Result<(), TierError> {
        self.inner.load(key, out)?;
        if self.damage.load(Ordering::Relaxed) {
            out[100] ^= 1;
        }
        Ok(())
    }
    fn remove(&self, key: PageKey) -> Result<bool, TierError> {
        self.inner.remove(key)
    }
    fn remove_region(&self, region: u64) -> Result<u64, TierError> {
        self.inner.remove_region(region)
    }
    fn list_region(&self, region: u64) -> Result<Vec<u64>, TierError> {
        self.inner.list_region(region)
    }
    fn stats(&self) -> TierStats {
        self.inner.stats()
    }
}

/// Waits for `m` to turn fatal, at most `limit`.
fn wait_fatal(m: &TierManager, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Some(why) = m.fatal() {
            return why;
        }
        assert!(start.elapsed() < limit, "no fatal error after {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Touches page `p` on a new thread; returns a flag set once the access returned.
fn touch_in_thread(base: *mut u8, p: usize) -> Arc<AtomicBool> {
    let returned = Arc::new(AtomicBool::new(false));
    let flag = returned.clone();
    let addr = base as usize + p * PAGE;
    std::thread::spawn(move || {
        // SAFETY: reading a page of a live region.
        let v = unsafe { std::ptr::read_volatile(addr as *const u64) };
        std::hint::black_box(v);
        flag.store(true, Ordering::Release);
    });
    returned
}

#[test]
fn damaged_page_stops_the_faulting_thread_with_a_reason() {
    if !permitted() {
        return;
    }
    let pages = 16;
    let tier = Arc::new(Damaging {
        inner: CompressedStore::new(PAGE, 1 << 20),
        damage: AtomicBool::new(false),
    });
    let (r, m) = managed_anon(
        pages,
        0,
        tier.clone(),
        Box::new(NoPlacement),
        TierConfig::new(6),
    );
    write_all(r.as_ptr(), pages, 5);
    m.evict(&[4]);
    m.wait_evictions();
    tier.damage.store(true, Ordering::Relaxed);
    let returned = touch_in_thread(r.as_ptr(), 4);
    let why = wait_fatal(&m, Duration::from_secs(10));
    assert!(
        why.contains("page 4") && why.contains("checksum mismatch"),
        "{why}"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !returned.load(Ordering::Acquire),
        "the thread got the damaged page"
    );
    assert_eq!(m.stats().lost_pages, 1);
    // The reader stays blocked for good: stopping keeps the region registered.
    assert!(m.stop().is_err());
    std::mem::forget(r);
}

#[test]
fn killed_memory_server_stops_the_faulting_thread_never_zeros() {
    if !permitted() {
        return;
    }
    let backend = Arc::new(CompressedStore::new(PAGE, 1 << 24));
    let server = MemServer::bind(
        "127.0.0.1:0",
        backend,
        ServerConfig::new(test_auth(), u64::MAX),
    )
    .unwrap()
    .spawn()
    .unwrap();
    let cfg = RemoteConfig {
        connect_timeout: Duration::from_millis(200),
        io_timeout: Duration::from_millis(300),
        attempts: 3,
        backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(50),
        ..RemoteConfig::new(server.addr().to_string(), PAGE, test_auth())
    };
    let bound = cfg.retry_bound();
    let tier = Arc::new(RemoteTier::connect(cfg).unwrap());
    let pages = 32;
    let (r, m) = managed_anon(pages, 0, tier, Box::new(NoPlacement), TierConfig::new(7));
    write_all(r.as_ptr(), pages, 11);
    m.evict(&(0..pages).collect::<Vec<_>>());
    m.wait_evictions();
    assert_eq!(m.stats().stored_pages, pages as u64);
    // Round trip through the server while it is up.
    check_all(r.as_ptr(), 4, 11);
    server.stop();
    let returned = touch_in_thread(r.as_ptr(), 10);
    let start = Instant::now();
    let why = wait_fatal(&m, bound + Duration::from_secs(5));
    assert!(
        start.elapsed() <= bound + Duration::from_secs(1),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        why.contains("page 10") && why.contains("unreachable"),
        "{why}"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !returned.load(Ordering::Acquire),
        "the thread was handed a page"
    );
    assert!(m.stop().is_err());
    std::mem::forget(r);
}

/// With remove events, an application's own `madvise(MADV_DONTNEED)` makes pages
/// read as zeros again, evicted ones included (their slow-tier copies are dropped);
/// the manager's own drops are not mistaken for it.
#[test]
fn application_dontneed_reads_zeros_even_for_evicted_pages() {
    if !permitted() {
        return;
    }
    let pages = 32;
    let tier = store();
    let cfg = TierConfig {
        track_remove: true,
        ..TierConfig::new(8)
    };
    let (r, m) = managed_anon(
        pages,
        features::EVENT_REMOVE,
        tier.clone(),
        Box::new(NoPlacement),
        cfg,
    );
    write_all(r.as_ptr(), pages, 2);
    m.evict(&[4, 5, 6, 20]);
    m.wait_evictions();
    assert_eq!(
        m.stats().stored_pages,
        4,
        "{:?} {:?}",
        m.stats(),
        m.last_error()
    );
    // SAFETY: the application drops pages 0..10 of its own region.
    let rc = unsafe {
        libc::madvise(
            r.as_ptr() as *mut libc::c_void,
            10 * PAGE,
            libc::MADV_DONTNEED,
        )
    };
    assert_eq!(rc, 0);
    for p in 0..10 {
        assert!(
            page_slice(r.as_ptr(), p).iter().all(|&b| b == 0),
            "page {p}"
        );
    }
    let mut want = vec![0u8; PAGE];
    for p in 10..pages {
        fill(&mut want, p, 2);
        assert!(page_slice(r.as_ptr(), p) == want.as_slice(), "page {p}");
    }
    let s = settle(&m, |s| s.stored_pages == 0);
    assert_eq!(s.freed_pages, 10);
    // Copies of pages brought back (20) and of freed pages (4, 5, 6) are gone.
    assert_eq!(tier.stats().pages, 0);
    m.stop().unwrap();
}

/// The production mix at once: two writer threads, sampling windows and evictions
/// by two workers racing on the same pages. No write is lost and no sampled page is
/// left out.
fn production_mix(mem: Box<dyn RegionMemory>, u: Uffd, base: *mut u8, track_remove: bool) {
    let pages = mem.pages();
    let rounds = 30u64;
    let cfg = TierConfig {
        sample_pages: 32,
        evict_workers: 2,
        evict_batch: 8,
        track_remove,
        ..TierConfig::new(9)
    };
    let m = TierManager::start(u, mem, store(), Box::new(NoPlacement), cfg).unwrap();
    let base_addr = base as usize;
    let done = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let done = done.clone();
            std::thread::spawn(move || {
                for round in 1..=rounds {
                    for p in (w..pages).step_by(2) {
                        fill(page_slice(base_addr as *mut u8, p), p, round);
                    }
                }
                done.store(true, Ordering::Release);
            })
        })
        .collect();
    let mut x = 99u64;
    let start = Instant::now();
    while !done.load(Ordering::Acquire) {
        if start.elapsed() > Duration::from_secs(60) {
            panic!(
                "writers stuck: {:?} transient {:?} last error {:?}",
                m.stats(),
                m.transient_pages(),
                m.last_error()
            );
        }
        m.sample_begin();
        let batch: Vec<usize> = (0..24)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % pages as u64) as usize
            })
            .collect();
        m.evict(&batch);
        m.sample_end();
        m.wait_evictions();
    }
    for w in writers {
        w.join().unwrap();
    }
    check_all(base, pages, rounds);
    let s = m.stats();
    eprintln!("{s:?}");
    assert!(s.sample_windows > 0 && s.evictions > 0);
    assert_eq!(s.freed_pages, 0, "own drops mistaken for the application's");
    m.stop().unwrap();
    check_all(base, pages, rounds);
}

#[test]
fn production_mix_memfd() {
    if !permitted() {
        return;
    }
    let r = MemfdRegion::new(256).unwrap();
    let (u, mem) = memfd_under_uffd(&r);
    production_mix(Box::new(mem), u, r.as_ptr(), false);
}

#[test]
fn production_mix_anon_with_remove_events() {
    if !permitted() {
        return;
    }
    let (r, u) = anon(256, features::EVENT_REMOVE);
    production_mix(Box::new(r.memory()), u, r.as_ptr(), true);
}

/// Scattered runs dropped in one batched call (`process_madvise` on this process)
/// read as zeros afterwards; the pages between them keep their bytes.
#[test]
fn batched_drops_of_scattered_runs() {
    let pages = 256;
    let r = AnonRegion::new(pages).unwrap();
    write_all(r.as_ptr(), pages, 4);
    let runs = [(1, 1), (5, 3), (100, 2), (255, 1)];
    r.memory().drop_page_runs(&runs).unwrap();
    let mut want = vec![0u8; PAGE];
    for p in 0..pages {
        let dropped = runs.iter().any(|&(f, c)| (f..f + c).contains(&p));
        if dropped {
            assert!(
                page_slice(r.as_ptr(), p).iter().all(|&b| b == 0),
                "page {p}"
            );
        } else {
            fill(&mut want, p, 4);
            assert!(page_slice(r.as_ptr(), p) == want.as_slice(), "page {p}");
        }
    }
    // More runs than one call takes (1024): all dropped.
    write_all(r.as_ptr(), pages, 5);
    let many: Vec<(usize, usize)> = (0..pages).map(|p| (p, 1)).collect();
    let mut twice = many.clone();
    twice.extend(many.iter().copied().cycle().take(1200 - pages));
    r.memory().drop_page_runs(&twice).unwrap();
    for p in 0..pages {
        assert!(
            page_slice(r.as_ptr(), p).iter().all(|&b| b == 0),
            "page {p}"
        );
    }
}

/// The sample follows the precision the FMMR needs: a region whose touches all hit
/// fast memory is sampled one page per window; slow faults make it sample more.
/// Sampled pages are still put back intact.
#[test]
fn sample_size_follows_the_fmmr_precision_needed() {
    if !permitted() {
        return;
    }
    let pages = 1024;
    let touched = 600;
    let (r, m) = managed_anon(
        pages,
        0,
        store(),
        Box::new(NoPlacement),
        TierConfig::new(11),
    );
    write_all(r.as_ptr(), pages, 3);
    let touch = |w: usize| {
        for p in 0..touched {
            // SAFETY: reading page p of the live region.
            unsafe { std::ptr::read_volatile(r.as_ptr().add(p * PAGE + (w % PAGE))) };
        }
    };
    // Before anything is known: the most for 16 hits (p̂ taken as 1).
    let mut sizes = Vec::new();
    for w in 0..6 {
        sizes.push(m.sample_begin().len());
        touch(w);
        m.sample_end();
    }
    assert_eq!(sizes[0], 16, "{sizes:?}");
    assert!(sizes[1..].iter().all(|&k| k == 1), "{sizes:?}");
    // Slow faults: 60 touched pages evicted and touched again.
    m.evict(&(0..touched).step_by(10).collect::<Vec<_>>());
    m.wait_evictions();
    let mut sizes = Vec::new();
    for w in 0..4 {
        sizes.push(m.sample_begin().len());
        touch(w);
        m.sample_end();
    }
    assert_eq!(sizes[0], 1, "{sizes:?}");
    assert!(sizes[1] > 8, "{sizes:?}");
    assert!(m.stats().slow_faults >= 60);
    check_all(r.as_ptr(), pages, 3);
    m.stop().unwrap();
}

/// Refault samples on real memory: a page evicted 100 evictions before it faults
/// back, in a region holding ~900 resident pages, is a refault at a short distance
/// and enters the epoch's per-page samples for sure (the sampler's k/R is 1/1024
/// here); a page evicted 900 evictions before, with 23 resident, is not counted
/// as one; with `refault_samples` off neither is. The slow-access count is exact in
/// every case, and contents come back intact.
#[test]
fn short_refaults_are_hotness_samples() {
    if !permitted() {
        return;
    }
    for on in [true, false] {
        let pages = 1024;
        let cfg = TierConfig {
            sample_pages: 1,
            sample_target_hits: 0,
            refault_samples: on,
            ..TierConfig::new(11)
        };
        let (r, m) = managed_anon(pages, 0, store(), Box::new(NoPlacement), cfg);
        write_all(r.as_ptr(), pages, 4);
        m.wait_evicted(m.evict(&[5]));
        m.wait_evicted(m.evict(&(200..300).collect::<Vec<_>>()));
        m.take_epoch();
        // The window sets the slow faults' sampling probability to 1/1024.
        assert_eq!(m.sample_begin().len(), 1);
        // SAFETY: reading page 5 of the live region.
        unsafe { std::ptr::read_volatile(r.as_ptr().add(5 * PAGE)) };
        settle(&m, |s| s.slow_faults == 1);
        m.sample_end();
        let e = m.take_epoch();
        assert_eq!(e.slow, 1, "refault_samples {on}");
        let counted = e.pages.iter().any(|&(p, c)| p == 5 && c >= 1);
        assert_eq!(counted, on, "refault_samples {on}: {:?}", e.pages);
        assert_eq!(m.stats().refault_samples, u64::from(on));

        // A far refault: 900 evictions since page 7's, 23 pages resident.
        m.wait_evicted(m.evict(&[7]));
        let far: Vec<usize> = (0..pages)
            .filter(|p| ![5, 7].contains(p) && !(200..300).contains(p))
            .collect();
        m.wait_evicted(m.evict(&far[..900]));
        m.take_epoch();
        assert_eq!(m.sample_begin().len(), 1);
        // SAFETY: reading page 7 of the live region.
        unsafe { std::ptr::read_volatile(r.as_ptr().add(7 * PAGE)) };
        settle(&m, |s| s.slow_faults == 2);
        m.sample_end();
        assert_eq!(m.take_epoch().slow, 1);
        assert_eq!(
            m.stats().refault_samples,
            u64::from(on),
            "far refault counted"
        );
        check_all(r.as_ptr(), pages, 4);
        m.stop().unwrap();
    }
}
