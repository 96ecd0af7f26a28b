//! Taking a region over after its manager died ([`TierManager::recover`]) on real
//! memory of this process, a real userfaultfd and a real memory server on 127.0.0.1:
//! a manager evicts and samples, then is abandoned as if its agent had been killed
//! (`TierManager::abandon`: pages stay stored, stashed in the shadow, the range stays
//! registered); a new manager with a new slow-tier client recovers the region from
//! the memfd, the shadow, the server's listing and the remove journal, and every
//! byte the application reads is checked. Also: threads blocked in a fault of the
//! dead manager are served by the new one, pending journal slots win over stale
//! server copies, a non-durable tier is refused, and a live manager writes its
//! stash through to the shadow and clears journal slots of the removes it handled.
//!
//! These tests need userfaultfd: root, or vm.unprivileged_userfaultfd = 1 (checked
//! first; without it they fail saying why, unless MEMCOLO_TEST_ALLOW_SKIP=1).

use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::manager::{NoPlacement, TierConfig, TierManager};
use memcolo_tier::memserver::{MemServer, ServerConfig};
use memcolo_tier::region::{runs, RegionMemory, SharedFile, PAGE};
use memcolo_tier::remote::RemoteTier;
use memcolo_tier::uffd::{features, mode, Uffd};
use memcolo_tier::{PageKey, SlowTier};
use std::io;
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
mod recovery_rig;
use common::*;
use recovery_rig::*;

/// Manager A evicts half the pages to the memory server and samples some, then
/// dies; B recovers the region with a new client. Besides A's state, the region
/// holds what a death mid-way leaves: older server copies of a sampled page and of a
/// page in the memfd, an older shadow copy of a page in the memfd, and
/// write-protected pages in the memfd. Every byte is checked from the application,
/// after pages are evicted again by B (a recovered sampled page from its copy), and
/// after B stops.
#[test]
fn region_survives_its_manager_dying() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 256;
    let (h, store) = server();
    let (p, u) = Process::new(pages, 1, 0);
    // Every other page of the first half, and the whole last quarter.
    let evict: Vec<usize> = (0..128).step_by(2).chain(192..256).collect();
    let (a, sampled) = manager_a(&p, u, &h, config(11, 16), &evict);
    let left = a.stats();
    assert_eq!(
        (left.resident_pages, left.stored_pages),
        (pages as u64 - evict.len() as u64, evict.len() as u64),
        "{left:?}"
    );
    a.abandon();

    // What outlives the agent: the server's copies, the memfd without the evicted
    // and sampled pages, the shadow's copies of the sampled ones.
    let listed = |store: &CompressedStore| -> Vec<usize> {
        store
            .list_region(11)
            .unwrap()
            .iter()
            .map(|&q| q as usize)
            .collect()
    };
    assert_eq!(listed(&store), evict);
    let held: Vec<usize> = (0..pages)
        .filter(|q| !evict.contains(q) && !sampled.contains(q))
        .collect();
    assert_eq!(p.memfd_runs(), runs(&held));
    assert_eq!(p.shadow_runs(), runs(&sampled));
    // Older copies in the server of a sampled page and of a page in the memfd (a
    // page mapped back whose server copy was not dropped yet), an older shadow copy
    // of a page in the memfd (copied aside, not yet dropped), and pages left
    // write-protected (being evicted or sampled): the newer copy must win, the
    // others be dropped, and writes must not block.
    for q in [sampled[0], held[0]] {
        store
            .store(PageKey::new(11, q as u64), &pattern(q, 0))
            .unwrap();
    }
    shadow_of(&p.shadow, pages)
        .write_page(held[1], &pattern(held[1], 0))
        .unwrap();
    let protected = [held[2], held[3]];
    for q in protected {
        p.uffd()
            .writeprotect((p.base() + q * PAGE) as u64, PAGE as u64, true, false)
            .unwrap();
    }

    let b = recover_b(&p, p.uffd(), &h, config(11, 16));
    assert_eq!(listed(&store), evict, "stale server copies left");
    assert_eq!(p.shadow_runs(), runs(&sampled), "stale shadow copy left");
    let s = b.stats();
    assert_eq!(s.adopted_pages, left.resident_pages, "{s:?}");
    assert_eq!(s.recovered_stored_pages, left.stored_pages, "{s:?}");
    assert_eq!(
        (s.resident_pages, s.stored_pages, s.probation_pages),
        (left.resident_pages, left.stored_pages, sampled.len() as u64),
        "{s:?}"
    );
    assert!(b.transient_pages().is_empty(), "{:?}", b.transient_pages());

    // B evicts a recovered sampled page (stored from its copy) and a memfd page.
    let again = [sampled[1], held[4]];
    let t = b.evict(&again);
    b.wait_evicted(t);
    let s = b.stats();
    assert_eq!(
        s.stored_pages,
        left.stored_pages + 2,
        "{s:?} {:?}",
        b.last_error()
    );
    assert_eq!(s.probation_pages, sampled.len() as u64 - 1, "{s:?}");
    let mut stored: Vec<usize> = evict.iter().chain(&again).copied().collect();
    stored.sort_unstable();
    assert_eq!(listed(&store), stored);
    let mut kept = sampled.clone();
    kept.remove(1);
    assert_eq!(p.shadow_runs(), runs(&kept), "copy of an evicted page left");

    let base = p.base();
    within("writing write-protected pages", move || {
        for q in protected {
            fill(page_slice(base, q), q, 3);
        }
    });
    let want = move |q: usize| pattern(q, if protected.contains(&q) { 3 } else { 1 });
    let bad = differing(base, pages, want);
    assert!(bad.is_empty(), "pages read wrong after recovery: {bad:?}");
    let s = settle(&b, |s| s.stored_pages == 0 && s.probation_pages == 0);
    assert_eq!(s.slow_faults, stored.len() as u64, "{s:?}");
    assert_eq!(s.probation_hits, sampled.len() as u64 - 1, "{s:?}");
    assert_eq!((s.zero_faults, s.lost_pages), (0, 0), "{s:?}");
    assert!(b.fatal().is_none(), "{:?}", b.fatal());
    // Pages brought back leave no copy behind.
    assert!(p.shadow_runs().is_empty(), "{:?}", p.shadow_runs());

    within("stopping", move || b.stop()).unwrap();
    assert_eq!(p.memfd_runs(), vec![(0, pages)]);
    assert!(store.list_region(11).unwrap().is_empty());
    // Unregistered: plain memory again, same bytes.
    let bad = differing(base, pages, want);
    assert!(bad.is_empty(), "pages read wrong after stop: {bad:?}");
}

/// Recovery over a region still holding sampled pages and stored pages, then
/// stopped at once: every page comes back from where recovery found it.
#[test]
fn recovered_region_stopped_untouched_gets_every_page_back() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 128;
    let (h, store) = server();
    let (p, u) = Process::new(pages, 1, 0);
    let evict: Vec<usize> = (0..pages).filter(|q| q % 3 == 0).collect();
    let (a, sampled) = manager_a(&p, u, &h, config(12, 8), &evict);
    a.abandon();
    let b = recover_b(&p, p.uffd(), &h, config(12, 8));
    assert_eq!(b.stats().probation_pages, sampled.len() as u64);
    within("stopping", move || b.stop()).unwrap();
    assert_eq!(p.memfd_runs(), vec![(0, pages)]);
    assert!(p.shadow_runs().is_empty());
    assert!(store.list_region(12).unwrap().is_empty());
    let bad = differing(p.base(), pages, |q| pattern(q, 1));
    assert!(bad.is_empty(), "pages read wrong after stop: {bad:?}");
}

/// A memory server restarted while no agent ran has lost the region's stored pages:
/// recovery against it is refused (the process is then stopped), and the region's
/// memfd and shadow are left as they were.
#[test]
fn recovery_against_a_restarted_memory_server_is_refused() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 64;
    let (h, _store) = server();
    let (p, u) = Process::new(pages, 1, 0);
    let evict: Vec<usize> = (0..pages).filter(|q| q % 2 == 0).collect();
    let (a, sampled) = manager_a(&p, u, &h, config(17, 4), &evict);
    a.abandon();
    let registered = instance(&h);
    let addr = h.addr();
    h.stop();
    let empty = Arc::new(CompressedStore::new(PAGE, 1 << 24));
    let h2 = MemServer::bind(addr, empty, ServerConfig::new(test_auth(), u64::MAX))
        .unwrap()
        .spawn()
        .unwrap();
    let (mem, shadow) = p.handed();
    let r = TierManager::recover(
        p.uffd(),
        mem,
        client(&h2),
        Box::new(NoPlacement),
        config(17, 4),
        shadow,
        registered,
    );
    match r {
        Ok(_) => panic!("recovered against a restarted, empty server"),
        Err(e) => {
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert!(e.to_string().contains("restarted"), "{e}");
        }
    }
    let kept: Vec<usize> = (0..pages)
        .filter(|q| !evict.contains(q) && !sampled.contains(q))
        .collect();
    assert_eq!(p.memfd_runs(), runs(&kept));
    assert_eq!(p.shadow_runs(), runs(&sampled));
}

/// Spawns an application thread that reads page `q` and sends its bytes back.
fn reader(base: usize, q: usize) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(page_slice(base, q).to_vec());
    });
    rx
}

/// Waits (at most 10 s) for the fault message of a thread, and reads it off the
/// userfaultfd: the dead agent had read it and never served it.
fn read_fault(u: &Uffd, base: usize, q: usize) {
    let start = Instant::now();
    loop {
        let (ready, _) = u.poll(None, 100).unwrap();
        if ready {
            let ev = u.read_events().unwrap();
            assert_eq!(ev.len(), 1, "{ev:?}");
            match ev[0] {
                memcolo_tier::uffd::Event::PageFault { address, .. } => {
                    assert_eq!(address & !(PAGE as u64 - 1), (base + q * PAGE) as u64)
                }
                other => panic!("{other:?}"),
            }
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no fault came");
    }
}

#[test]
fn threads_blocked_in_a_fault_when_the_manager_died_are_served_by_the_new_one() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 64;
    let (h, _store) = server();
    let (p, u) = Process::new(pages, 1, 0);
    let evict: Vec<usize> = (0..32).collect();
    let (a, sampled) = manager_a(&p, u, &h, config(13, 4), &evict);
    a.abandon();
    let base = p.base();
    let uffd = p.uffd();
    // Page 3 (stored) and a sampled page: faults the dead agent read and never
    // served; page 5 (stored): a fault nobody read yet.
    let read_stored = reader(base, 3);
    read_fault(&uffd, base, 3);
    let read_sampled = reader(base, sampled[0]);
    read_fault(&uffd, base, sampled[0]);
    let unread = reader(base, 5);
    std::thread::sleep(Duration::from_millis(100));
    for (rx, what) in [
        (&read_stored, "3"),
        (&read_sampled, "sampled"),
        (&unread, "5"),
    ] {
        assert!(
            matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
            "page {what} read with no manager"
        );
    }

    let b = recover_b(&p, uffd, &h, config(13, 4));
    let wait = |rx: &mpsc::Receiver<Vec<u8>>, what: &str| {
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("the reader of {what} was never served"))
    };
    assert!(wait(&read_stored, "page 3") == pattern(3, 1), "page 3");
    assert!(
        wait(&read_sampled, "the sampled page") == pattern(sampled[0], 1),
        "page {}",
        sampled[0]
    );
    assert!(wait(&unread, "page 5") == pattern(5, 1), "page 5");
    let s = settle(&b, |s| s.slow_faults >= 2 && s.probation_hits >= 1);
    assert_eq!(s.lost_pages, 0, "{s:?}");
    let bad = differing(base, pages, |q| pattern(q, 1));
    assert!(bad.is_empty(), "pages read wrong: {bad:?}");
    within("stopping", move || b.stop()).unwrap();
}

#[test]
fn pending_journal_slots_win_over_stale_copies() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 128;
    let (h, store) = server();
    let (p, u) = Process::new(pages, 1, 0);
    let evict: Vec<usize> = (0..64).collect();
    let (a, sampled) = manager_a(&p, u, &h, config(14, 4), &evict);
    a.abandon();
    let removed_sampled = sampled[0];
    // A resident page with no other copy, away from the sampled ones.
    let removed_resident = (64..pages).find(|q| !sampled.contains(q)).unwrap();
    // The process removed pages 16..32 (stored), the sampled page and the resident
    // one (each journaled, then `madvise(MADV_REMOVE)`; the kernel punched them out
    // of the memfd and the dead agent read the events, dropping nothing yet), and
    // page 40 (stored), which it then wrote again.
    let b = |q: usize| (q * PAGE) as u64;
    journal_remove(&p.shadow, pages, 0, b(16), b(32));
    journal_remove(
        &p.shadow,
        pages,
        3,
        b(removed_sampled),
        b(removed_sampled + 1),
    );
    journal_remove(
        &p.shadow,
        pages,
        7,
        b(removed_resident),
        b(removed_resident + 1),
    );
    journal_remove(&p.shadow, pages, 9, b(40), b(41));
    punch(&p.memfd, 16, 16);
    punch(&p.memfd, removed_sampled, 1);
    punch(&p.memfd, removed_resident, 1);
    punch(&p.memfd, 40, 1);
    pwrite_page(&p.memfd, 40, &pattern(40, 2));
    assert_eq!(p.pending_removes().len(), 4);

    let m = recover_b(&p, p.uffd(), &h, config(14, 4));
    assert!(p.pending_removes().is_empty(), "{:?}", p.pending_removes());
    let stored: Vec<u64> = (0..16).chain(32..40).chain(41..64).collect();
    assert_eq!(store.list_region(14).unwrap(), stored);
    let s = m.stats();
    assert_eq!(s.recovered_stored_pages, stored.len() as u64, "{s:?}");
    assert_eq!(s.probation_pages, sampled.len() as u64 - 1, "{s:?}");
    // Held in local memory: pages 64..128 but the removed ones (the sampled ones
    // from their shadow copies), and page 40, written again.
    assert_eq!((s.adopted_pages, s.resident_pages), (63, 63), "{s:?}");
    // The removed sampled page's copy is gone from the shadow.
    let kept: Vec<usize> = sampled[1..].to_vec();
    assert_eq!(p.shadow_runs(), runs(&kept));
    // Page 40 is the process's again: evicted, its new bytes go to the server.
    let t = m.evict(&[40]);
    m.wait_evicted(t);
    let s = m.stats();
    assert_eq!(s.evictions, 1, "{s:?} {:?}", m.last_error());
    let mut now_stored = stored.clone();
    now_stored.push(40);
    now_stored.sort_unstable();
    assert_eq!(store.list_region(14).unwrap(), now_stored);

    let zeros =
        move |q: usize| (16..32).contains(&q) || q == removed_sampled || q == removed_resident;
    let bad = differing(p.base(), pages, move |q| {
        if zeros(q) {
            vec![0u8; PAGE]
        } else if q == 40 {
            pattern(40, 2)
        } else {
            pattern(q, 1)
        }
    });
    assert!(bad.is_empty(), "pages read wrong: {bad:?}");
    let s = settle(&m, |s| s.stored_pages == 0);
    assert_eq!(s.slow_faults, now_stored.len() as u64, "{s:?}");
    assert_eq!(s.zero_faults, 18, "{s:?}");
    assert_eq!(s.lost_pages, 0, "{s:?}");
    within("stopping", move || m.stop()).unwrap();
    assert!(store.list_region(14).unwrap().is_empty());
}

#[test]
fn recovery_refuses_a_tier_that_died_with_the_agent() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 16;
    let (p, u) = Process::new(pages, 1, 0);
    drop(u);
    let (mem, shadow) = p.handed();
    let tier = Arc::new(CompressedStore::new(PAGE, 1 << 24));
    assert!(!tier.durable());
    let r = TierManager::recover(
        p.uffd(),
        mem,
        tier,
        Box::new(NoPlacement),
        config(15, 4),
        shadow,
        0,
    );
    match r {
        Ok(_) => panic!("recovered over a non-durable tier"),
        Err(e) => assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}"),
    }
    // The region was left alone.
    assert_eq!(p.memfd_runs(), vec![(0, pages)]);
}

/// A live shadowed manager: sampled pages are written through to the shadow and
/// punched from it once mapped back (a hit, or the window's end); an application
/// remove of a stashed page and of a stored one drops their copies and clears
/// their journal slots.
#[test]
fn live_manager_keeps_the_shadow_up_to_date() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 64;
    let (h, store) = server();
    let (p, u) = Process::new(pages, 1, features::EVENT_REMOVE);
    let cfg = removing(16);
    let m = shadowed(&p, u, client(&h), cfg);
    let t = m.evict(&[0, 1, 2, 3]);
    m.wait_evicted(t);
    assert!(p.shadow_runs().is_empty(), "eviction writes no shadow copy");

    let mut sampled = m.sample_begin();
    sampled.sort_unstable();
    assert_eq!(sampled.len(), 8);
    assert_eq!(p.shadow_runs(), runs(&sampled));
    // A hit maps the page back and punches its copy.
    let hit = sampled[0];
    let base = p.base();
    assert!(within("a sample hit", move || page_slice(base, hit).to_vec()) == pattern(hit, 1));
    settle(&m, |s| s.sample_hits == 1);
    assert_eq!(p.shadow_runs(), runs(&sampled[1..]));

    // The application removes a stashed page and a stored one, journaled first.
    let gone = sampled[1];
    for (k, q) in [(0, gone), (1, 2)] {
        journal_remove(
            &p.shadow,
            pages,
            k,
            (q * PAGE) as u64,
            ((q + 1) * PAGE) as u64,
        );
        let at = base + q * PAGE;
        let r = within("madvise", move || {
            // SAFETY: removing one page of our own region.
            let r = unsafe { libc::madvise(at as *mut libc::c_void, PAGE, libc::MADV_REMOVE) };
            (r == 0).then_some(()).ok_or_else(io::Error::last_os_error)
        });
        r.unwrap_or_else(|e| panic!("madvise(MADV_REMOVE) of page {q}: {e}"));
    }
    settle(&m, |s| s.freed_pages == 2);
    let start = Instant::now();
    while !p.pending_removes().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "journal slots never cleared: {:?}",
            p.pending_removes()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(p.shadow_runs(), runs(&sampled[2..]));
    assert_eq!(store.list_region(16).unwrap(), [0, 1, 3]);

    // The window's end maps the rest back and punches their copies.
    m.sample_end();
    assert!(p.shadow_runs().is_empty(), "{:?}", p.shadow_runs());
    let bad = differing(base, pages, move |q| {
        if q == gone || q == 2 {
            vec![0u8; PAGE]
        } else {
            pattern(q, 1)
        }
    });
    assert!(bad.is_empty(), "pages read wrong: {bad:?}");
    within("stopping", move || m.stop()).unwrap();
}

fn madvise_remove(at: usize, len: usize) -> io::Result<()> {
    within("madvise", move || {
        // SAFETY: removing pages of our own region.
        let r = unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_REMOVE) };
        (r == 0).then_some(()).ok_or_else(io::Error::last_os_error)
    })
}

/// An madvise over a range with a hole (a page unmapped before, as libmemcolo's
/// partial munmap leaves) raises one remove event per VMA and none for the hole:
/// the slot must still be cleared, or a recovery later would take it for a free
/// of pages rewritten and evicted since (zeros).
#[test]
fn a_free_over_a_hole_clears_its_journal_slot() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 32;
    let (h, store) = server();
    let (p, u) = Process::new(pages, 1, features::EVENT_REMOVE);
    let cfg = removing(21);
    let a = shadowed(&p, u, client(&h), cfg.clone());
    let base = p.base();
    // SAFETY: unmapping one page of our own region (libmemcolo: munmap of a part).
    assert_eq!(
        unsafe { libc::munmap((base + 10 * PAGE) as *mut libc::c_void, PAGE) },
        0
    );
    // libmemcolo's madvise(DONTNEED) of pages 5..20: journal, then MADV_REMOVE.
    journal_remove(&p.shadow, pages, 0, (5 * PAGE) as u64, (20 * PAGE) as u64);
    let e = madvise_remove(base + 5 * PAGE, 15 * PAGE).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOMEM)); // libmemcolo keeps the slot then
    settle(&a, |s| s.freed_pages == 14);
    std::thread::sleep(Duration::from_millis(50));
    assert!(p.pending_removes().is_empty(), "{:?}", p.pending_removes());
    // The application uses pages 11..20 again; the agent evicts them.
    for q in 11..20 {
        within("write", move || fill(page_slice(base, q), q, 2));
    }
    let t = a.evict(&(11..20).collect::<Vec<_>>());
    a.wait_evicted(t);
    assert_eq!(
        store.list_region(21).unwrap(),
        (11..20).collect::<Vec<u64>>()
    );
    a.abandon();
    let b = recover_b(&p, p.uffd(), &h, cfg);
    let bad: Vec<usize> = (11..20)
        .filter(|&q| within("read", move || page_slice(base, q).to_vec()) != pattern(q, 2))
        .collect();
    b.discard();
    assert!(bad.is_empty(), "pages read wrong after recovery: {bad:?}");
}

/// A durable tier whose remove can be made to fail (a memory server unreachable
/// past the retry bound for a moment), and whose store_batch can be held after the
/// pages are stored (an agent that dies before it hears the answer, or is slow).
struct Flaky {
    inner: Arc<RemoteTier>,
    fail_remove: std::sync::atomic::AtomicBool,
    hold_store: std::sync::Mutex<Option<mpsc::Receiver<()>>>,
    stored: std::sync::Mutex<Option<mpsc::Sender<()>>>,
}

impl Flaky {
    fn new(inner: Arc<RemoteTier>) -> Arc<Flaky> {
        Arc::new(Flaky {
            inner,
            fail_remove: false.into(),
            hold_store: std::sync::Mutex::new(None),
            stored: std::sync::Mutex::new(None),
        })
    }
}

impl SlowTier for Flaky {
    fn name(&self) -> &'static str {
        "flaky"
    }
    fn page_bytes(&self) -> usize {
        self.inner.page_bytes()
    }
    fn store(&self, key: PageKey, data: &[u8]) -> Result<(), memcolo_tier::TierError> {
        self.inner.store(key, data)
    }
    fn store_batch(&self, pages: &[(PageKey, &[u8])]) -> Result<(), memcolo_tier::TierError> {
        let r = self.inner.store_batch(pages);
        if let Some(tx) = self.stored.lock().unwrap().take() {
            let _ = tx.send(());
        }
        if let Some(rx) = self.hold_store.lock().unwrap().take() {
            let _ = rx.recv();
        }
        r
    }
    fn load(&self, key: PageKey, out: &mut [u8]) -> Result<(), memcolo_tier::TierError> {
        self.inner.load(key, out)
    }
    fn remove(&self, key: PageKey) -> Result<bool, memcolo_tier::TierError> {
        if self.fail_remove.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(memcolo_tier::TierError::NotFound { key }); // any error
        }
        self.inner.remove(key)
    }
    fn remove_region(&self, region: u64) -> Result<u64, memcolo_tier::TierError> {
        self.inner.remove_region(region)
    }
    fn list_region(&self, region: u64) -> Result<Vec<u64>, memcolo_tier::TierError> {
        self.inner.list_region(region)
    }
    fn durable(&self) -> bool {
        true
    }
    fn instance(&self) -> u64 {
        self.inner.instance()
    }
    fn stats(&self) -> memcolo_tier::TierStats {
        self.inner.stats()
    }
}

/// A free of a stored page whose server copy cannot be dropped (the server failed
/// for a moment) marks the shadow tainted, so that no recovery takes the copy for
/// the page; the next eviction batch drops it and lifts the mark, and a recovery
/// then reads the page as zeros.
#[test]
fn a_copy_that_could_not_be_dropped_taints_the_region_until_it_is() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 16;
    let (h, store) = server();
    let (p, u) = Process::new(pages, 1, features::EVENT_REMOVE);
    let cfg = removing(22);
    let flaky = Flaky::new(client(&h));
    let a = shadowed(&p, u, flaky.clone(), cfg.clone());
    let t = a.evict(&[3]);
    a.wait_evicted(t);
    assert_eq!(a.stats().stored_pages, 1);
    flaky
        .fail_remove
        .store(true, std::sync::atomic::Ordering::SeqCst);
    journal_remove(&p.shadow, pages, 0, (3 * PAGE) as u64, (4 * PAGE) as u64);
    madvise_remove(p.base() + 3 * PAGE, PAGE).unwrap();
    settle(&a, |s| s.freed_pages == 1);
    let sh = shadow_of(&p.shadow, pages);
    assert!(sh.tainted());
    assert_eq!(store.list_region(22).unwrap(), vec![3]);
    // Tainted: a recovery now is refused (the process would be stopped).
    {
        let (mem, shadow) = p.handed();
        match TierManager::recover(
            p.uffd(),
            mem,
            client(&h),
            Box::new(NoPlacement),
            cfg.clone(),
            shadow,
            instance(&h),
        ) {
            Ok(_) => panic!("recovered a tainted region"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}"),
        }
    }
    // The server answers again: the next batch drops the copy and lifts the mark.
    flaky
        .fail_remove
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let t = a.evict(&[7]);
    a.wait_evicted(t);
    assert!(!sh.tainted());
    assert_eq!(store.list_region(22).unwrap(), vec![7]);
    a.abandon();
    let b = recover_b(&p, p.uffd(), &h, cfg);
    let base = p.base();
    let got = within("read", move || page_slice(base, 3).to_vec());
    assert!(
        got.iter().all(|&b| b == 0),
        "a freed page came back with data"
    );
    let got = within("read", move || page_slice(base, 7).to_vec());
    assert!(got == pattern(7, 1), "page 7 read wrong");
    b.discard();
}

/// A page freed while its eviction's store is in flight: faults on it wait until
/// the worker has dropped the copy it stored (so a page written again meanwhile is
/// neither punched by the eviction's drop nor shadowed by that copy), and its
/// journal slot stays pending until then (a crash before would find the copy).
#[test]
fn a_page_freed_while_its_eviction_stores_waits_and_keeps_its_new_data() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 16;
    let (h, store) = server();
    let (p, u) = Process::new(pages, 1, features::EVENT_REMOVE);
    let cfg = TierConfig {
        probation_pages: 0,
        ..removing(23)
    };
    let flaky = Flaky::new(client(&h));
    let (hold_tx, hold_rx) = mpsc::channel();
    let (stored_tx, stored_rx) = mpsc::channel();
    *flaky.hold_store.lock().unwrap() = Some(hold_rx);
    *flaky.stored.lock().unwrap() = Some(stored_tx);
    let a = shadowed(&p, u, flaky.clone(), cfg);
    let _t = a.evict(&[5]);
    stored_rx.recv_timeout(Duration::from_secs(5)).unwrap(); // stored, answer held
    let base = p.base();
    journal_remove(&p.shadow, pages, 0, (5 * PAGE) as u64, (6 * PAGE) as u64);
    madvise_remove(base + 5 * PAGE, PAGE).unwrap();
    settle(&a, |s| s.freed_pages == 1);
    // The copy is still on the server: the slot must stay.
    assert_eq!(store.list_region(23).unwrap(), vec![5]);
    assert_eq!(p.pending_removes().len(), 1);
    // The application writes the page again: it waits for the eviction.
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        fill(page_slice(base, 5), 5, 9);
        done_tx.send(()).unwrap();
    });
    assert!(
        done_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "the write did not wait"
    );
    hold_tx.send(()).unwrap();
    done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the write never resumed");
    a.wait_evictions();
    let got = within("read", move || page_slice(base, 5).to_vec());
    assert!(
        got == pattern(5, 9),
        "the page written after its free read back wrong"
    );
    assert!(
        store.list_region(23).unwrap().is_empty(),
        "the freed page's copy stayed"
    );
    assert!(p.pending_removes().is_empty(), "{:?}", p.pending_removes());
    a.discard();
}

/// A slot journaled by an madvise that raised no remove event (libmemcolo still saw
/// the region managed while the old agent's clean stop had already unregistered
/// it) is forgotten by the next agent's registration: kept, a crash of that agent
/// would make its recovery zero the pages rewritten and evicted since.
#[test]
fn a_new_registration_forgets_the_journal_of_the_last() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 16;
    let (h, store) = server();
    let (p, u) = Process::new(pages, 1, features::EVENT_REMOVE);
    let cfg = removing(25);
    let a = shadowed(&p, u, client(&h), cfg.clone());
    a.stop().unwrap(); // clean stop: range unregistered, before tier_released reaches the process
    let base = p.base();
    journal_remove(&p.shadow, pages, 0, (2 * PAGE) as u64, (4 * PAGE) as u64);
    madvise_remove(base + 2 * PAGE, 2 * PAGE).unwrap(); // no uffd registration: no event
                                                        // hand_over_again: a new userfaultfd, same memfd and shadow, tier_register.
    let u2 = Uffd::open(
        features::PAGEFAULT_FLAG_WP
            | features::MISSING_SHMEM
            | features::WP_HUGETLBFS_SHMEM
            | features::EVENT_REMOVE,
    )
    .unwrap();
    u2.register(base as u64, (pages * PAGE) as u64, mode::MISSING | mode::WP)
        .unwrap();
    let keep = u2.as_fd().try_clone_to_owned().unwrap();
    let feats = u2.features();
    let b = shadowed(&p, u2, client(&h), cfg.clone());
    for q in 2..4 {
        within("write", move || fill(page_slice(base, q), q, 3));
    }
    let t = b.evict(&[2, 3]);
    b.wait_evicted(t);
    assert!(p.pending_removes().is_empty(), "{:?}", p.pending_removes());
    assert_eq!(store.list_region(25).unwrap(), vec![2, 3]);
    b.abandon();
    let c = recover_b(&p, Uffd::from_fd(keep, feats), &h, cfg);
    let bad: Vec<usize> = (2..4)
        .filter(|&q| within("read", move || page_slice(base, q).to_vec()) != pattern(q, 3))
        .collect();
    c.discard();
    assert!(bad.is_empty(), "pages read wrong after recovery: {bad:?}");
}

/// A journal slot whose first byte is past its end (any process may send
/// tier_recover with a shadow it wrote) frees nothing, and panics nothing.
#[test]
fn an_inverted_journal_slot_frees_nothing() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 16;
    let (h, _store) = server();
    let (p, _u) = Process::new(pages, 1, features::EVENT_REMOVE);
    journal_remove(&p.shadow, pages, 0, (8 * PAGE) as u64, (4 * PAGE) as u64);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let m = recover_b(&p, p.uffd(), &h, config(26, 8));
        let adopted = m.stats().adopted_pages;
        m.discard();
        adopted
    }));
    assert_eq!(
        r.ok(),
        Some(pages as u64),
        "recover panicked or freed pages"
    );
}

/// A memfd region whose next read_page (once armed) reads the page, then reports
/// the page and waits for a go.
struct Gate {
    inner: SharedFile,
    armed: std::sync::atomic::AtomicBool,
    hit: std::sync::Mutex<Option<mpsc::Sender<usize>>>,
    go: std::sync::Mutex<Option<mpsc::Receiver<()>>>,
}

impl RegionMemory for Gate {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn base(&self) -> u64 {
        self.inner.base()
    }
    fn pages(&self) -> usize {
        self.inner.pages()
    }
    fn read_page(&self, index: usize, out: &mut [u8]) -> io::Result<()> {
        let r = self.inner.read_page(index, out);
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.hit
                .lock()
                .unwrap()
                .take()
                .unwrap()
                .send(index)
                .unwrap();
            let _ = self.go.lock().unwrap().take().unwrap().recv();
        }
        r
    }
    fn drop_pages(&self, first: usize, count: usize) -> io::Result<()> {
        self.inner.drop_pages(first, count)
    }
    fn drop_page_runs(&self, runs: &[(usize, usize)]) -> Result<(), (usize, io::Error)> {
        self.inner.drop_page_runs(runs)
    }
    fn drop_raises_remove_event(&self) -> bool {
        self.inner.drop_raises_remove_event()
    }
    fn drop_clears_write_protect(&self) -> bool {
        self.inner.drop_clears_write_protect()
    }
    fn present_runs(&self) -> io::Result<Vec<(usize, usize)>> {
        self.inner.present_runs()
    }
}

/// A page freed by the application while the sampler copies it aside (sample-drop,
/// its copy possibly in the shadow already) leaves no shadow copy: a recovery would
/// take one for a page on probation, and the freed page would read its old data.
#[test]
fn a_page_freed_while_the_sampler_copies_it_leaves_no_shadow_copy() {
    if !permitted() {
        return;
    }
    let _serial = serial();
    let pages = 8;
    let (h, _store) = server();
    let (p, u) = Process::new(pages, 1, features::EVENT_REMOVE);
    let cfg = removing(27);
    let (hit_tx, hit_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let gate = Gate {
        inner: SharedFile::new(p.r.dup_fd().unwrap(), p.base() as u64, pages).unwrap(),
        armed: true.into(),
        hit: std::sync::Mutex::new(Some(hit_tx)),
        go: std::sync::Mutex::new(Some(go_rx)),
    };
    let shadow = shadow_of(&p.shadow, pages);
    let a = Arc::new(
        TierManager::start_shadowed(
            u,
            Box::new(gate),
            client(&h),
            Box::new(NoPlacement),
            cfg.clone(),
            shadow,
        )
        .unwrap(),
    );
    let a2 = a.clone();
    let sampler = std::thread::spawn(move || a2.sample_begin());
    let q = hit_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let base = p.base();
    journal_remove(
        &p.shadow,
        pages,
        0,
        (q * PAGE) as u64,
        ((q + 1) * PAGE) as u64,
    );
    madvise_remove(base + q * PAGE, PAGE).unwrap();
    settle(&a, |s| s.freed_pages == 1);
    go_tx.send(()).unwrap();
    sampler.join().unwrap();
    let a = Arc::try_unwrap(a).ok().unwrap();
    a.abandon();
    let b = recover_b(&p, p.uffd(), &h, cfg);
    let got = within("read", move || page_slice(base, q).to_vec());
    let stale = got == pattern(q, 1);
    b.discard();
    assert!(!stale, "the freed page read its old contents");
}
