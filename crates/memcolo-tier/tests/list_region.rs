//! Finding a region's pages again: [`SlowTier::list_region`] over a real memory
//! server on 127.0.0.1 (one answer, several answers, answers of the largest size),
//! and the pages of a client outliving it: dropped, vanished without reading its
//! answers, or killed with SIGKILL in a process of its own, as a crashed agent is.
//! A new client lists the region and loads every page, bytes checked.
//!
//! The killed client is this test binary run again in child mode
//! (`MEMCOLO_LIST_CHILD=ADDR`, test `list_child`).

use memcolo_tier::channel::{Auth, Secret};
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::memserver::{MemServer, MemServerHandle, ServerConfig};
use memcolo_tier::remote::{RemoteConfig, RemoteTier};
use memcolo_tier::wire::RawConn;
use memcolo_tier::wire::LIST_MAX_PAGES;
use memcolo_tier::{PageKey, SlowTier};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The shared secret of the memory servers and clients of these tests.
fn test_auth() -> Auth {
    Auth::Secret(Arc::new(Secret::from_bytes(vec![0x5a; 32]).unwrap()))
}

const PAGE: usize = 4096;

/// The bytes of page `p` of region `region`: different for every page.
fn page(region: u64, p: u64) -> Vec<u8> {
    let mut x = (region << 32 ^ p).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..PAGE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn server(page_bytes: usize, capacity: u64) -> (MemServerHandle, Arc<CompressedStore>) {
    let store = Arc::new(CompressedStore::new(page_bytes, capacity));
    let h = MemServer::bind(
        "127.0.0.1:0",
        store.clone(),
        ServerConfig::new(test_auth(), u64::MAX),
    )
    .unwrap()
    .spawn()
    .unwrap();
    (h, store)
}

/// Short back-offs so failures show quickly; reads may take a while (listing half a
/// million pages in a debug build on a loaded machine).
fn quick(addr: impl ToString, page_bytes: usize) -> RemoteConfig {
    RemoteConfig {
        connect_timeout: Duration::from_millis(300),
        io_timeout: Duration::from_secs(10),
        attempts: 3,
        backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
        ..RemoteConfig::new(addr.to_string(), page_bytes, test_auth())
    }
}

/// Waits (at most 10 s) until the server has no connection open.
fn wait_no_connections(h: &MemServerHandle) {
    let start = Instant::now();
    while h.open_connections() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} connections still open",
            h.open_connections()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Lists `region` with a new client and loads every page listed, checking its bytes.
fn recover(addr: impl ToString, region: u64, want: &[u64]) {
    let t = RemoteTier::connect(quick(addr, PAGE)).unwrap();
    let listed = t.list_region(region).unwrap();
    assert_eq!(listed, want);
    let mut out = vec![0u8; PAGE];
    for &p in &listed {
        t.load(PageKey::new(region, p), &mut out).unwrap();
        assert!(
            out == page(region, p),
            "region {region} page {p}: wrong bytes"
        );
    }
}

#[test]
fn remote_list_region_matches_what_was_stored() {
    let (h, store) = server(PAGE, 64 << 20);
    let t = RemoteTier::connect(quick(h.addr(), PAGE)).unwrap();
    assert!(t.durable());
    assert_eq!(t.list_region(1).unwrap(), Vec::<u64>::new());
    let mut want: Vec<u64> = vec![1 << 50, 31, 0, 7, 8, 1000, u64::MAX];
    let pages: Vec<Vec<u8>> = want.iter().map(|&p| page(1, p)).collect();
    let batch: Vec<(PageKey, &[u8])> = want
        .iter()
        .zip(&pages)
        .map(|(&p, d)| (PageKey::new(1, p), d.as_slice()))
        .collect();
    t.store_batch(&batch).unwrap();
    t.store(PageKey::new(2, 9), &page(2, 9)).unwrap();
    want.sort_unstable();
    assert_eq!(t.list_region(1).unwrap(), want);
    assert_eq!(t.list_region(1).unwrap(), store.list_region(1).unwrap());
    assert_eq!(t.list_region(2).unwrap(), [9]);
    assert!(t.remove(PageKey::new(1, 8)).unwrap());
    want.retain(|&p| p != 8);
    assert_eq!(t.list_region(1).unwrap(), want);
    t.remove_region(2).unwrap();
    assert_eq!(t.list_region(2).unwrap(), Vec::<u64>::new());
    assert_eq!(t.stats().retries, 0);
}

#[test]
fn listing_is_paged_across_requests() {
    let (h, _store) = server(PAGE, 64 << 20);
    let t = RemoteTier::connect(RemoteConfig {
        list_batch: 3,
        ..quick(h.addr(), PAGE)
    })
    .unwrap();
    // Regions of 0, 1, 2, 3 (one full answer then an empty one), 4, 9 and 10 pages,
    // with gaps between the indices.
    for n in [0u64, 1, 2, 3, 4, 9, 10] {
        let region = 100 + n;
        let want: Vec<u64> = (0..n).map(|i| i * i * 7 + 2).collect();
        for &p in want.iter().rev() {
            t.store(PageKey::new(region, p), &page(region, p)).unwrap();
        }
        assert_eq!(t.list_region(region).unwrap(), want, "{n} pages");
    }
    // A full last answer that ends at page u64::MAX: no index after it to ask from.
    let want = [5, u64::MAX - 1, u64::MAX];
    for &p in &want {
        t.store(PageKey::new(200, p), &page(200, p)).unwrap();
    }
    assert_eq!(t.list_region(200).unwrap(), want);
    // A batch of 0 is asked as 1.
    let one = RemoteTier::connect(RemoteConfig {
        list_batch: 0,
        ..quick(h.addr(), PAGE)
    })
    .unwrap();
    assert_eq!(one.list_region(109).unwrap().len(), 9);
    assert_eq!(one.list_region(200).unwrap(), want);
}

/// More pages than one answer carries, with the default batch: two requests, the
/// first answer exactly [`wire::MAX_PAYLOAD`] bytes. Pages of 64 bytes keep the
/// store small (about 40 MiB) and quick to fill.
#[test]
fn a_region_larger_than_one_answer_is_listed_whole() {
    const SMALL: usize = 64;
    let (h, store) = server(SMALL, 1 << 30);
    let n = u64::from(LIST_MAX_PAGES) + 5;
    let zeros = [0u8; SMALL];
    for p in 0..n {
        store.store(PageKey::new(9, p * 2), &zeros).unwrap();
    }
    store.store(PageKey::new(8, 1), &zeros).unwrap();
    let t = RemoteTier::connect(quick(h.addr(), SMALL)).unwrap();
    assert_eq!(t.config().list_batch, LIST_MAX_PAGES);
    let listed = t.list_region(9).unwrap();
    assert_eq!(listed.len() as u64, n);
    assert!(listed.iter().enumerate().all(|(i, &p)| p == 2 * i as u64));
    assert_eq!(t.list_region(8).unwrap(), [1]);
}

#[test]
fn pages_outlive_the_client_that_stored_them() {
    let (h, _store) = server(PAGE, 64 << 20);
    let want: Vec<u64> = (0..40).map(|i| i * 3).collect();
    {
        let t = RemoteTier::connect(quick(h.addr(), PAGE)).unwrap();
        let pages: Vec<Vec<u8>> = want.iter().map(|&p| page(5, p)).collect();
        let batch: Vec<(PageKey, &[u8])> = want
            .iter()
            .zip(&pages)
            .map(|(&p, d)| (PageKey::new(5, p), d.as_slice()))
            .collect();
        t.store_batch(&batch).unwrap();
        assert!(h.open_connections() >= 1);
    }
    // The client and every connection it had are gone.
    wait_no_connections(&h);
    recover(h.addr(), 5, &want);
    // Reading and listing again changed nothing either.
    wait_no_connections(&h);
    recover(h.addr(), 5, &want);
}

/// A client that vanishes with an answer unread (its socket closes with a reset)
/// leaves the pages it had confirmed.
#[test]
fn pages_outlive_a_connection_reset() {
    let (h, _store) = server(PAGE, 64 << 20);
    {
        let t = RemoteTier::connect(quick(h.addr(), PAGE)).unwrap();
        t.store(PageKey::new(6, 1), &page(6, 1)).unwrap();
        t.store(PageKey::new(6, 4), &page(6, 4)).unwrap();
    }
    wait_no_connections(&h);
    // The same over a raw connection: a hello, a store of page 2 that is confirmed,
    // then a stats request whose answer is never read before the socket closes.
    let mut c = RawConn::connect(h.addr(), &test_auth()).unwrap();
    c.send(1, 1, PageKey::new(0, 0), &(PAGE as u32).to_le_bytes())
        .unwrap();
    assert_eq!(c.recv().unwrap().status, 0, "hello refused");
    c.send(2, 2, PageKey::new(6, 2), &page(6, 2)).unwrap();
    assert_eq!(c.recv().unwrap().status, 0, "store refused");
    c.send(6, 3, PageKey::new(0, 0), &[]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(c);
    wait_no_connections(&h);
    recover(h.addr(), 6, &[1, 2, 4]);
}

/// Region and pages the child stores before it is killed.
const CHILD_REGION: u64 = 42;
const CHILD_PAGES: u64 = 50;

/// Child mode: stores pages 0, 2, … of region 42 in the memory server at
/// `MEMCOLO_LIST_CHILD`, prints `READY`, and waits to be killed.
#[test]
fn list_child() {
    let Ok(addr) = std::env::var("MEMCOLO_LIST_CHILD") else {
        return; // Only the parent's test runs this in a child.
    };
    let t = RemoteTier::connect(quick(addr, PAGE)).unwrap();
    for p in 0..CHILD_PAGES {
        t.store(
            PageKey::new(CHILD_REGION, 2 * p),
            &page(CHILD_REGION, 2 * p),
        )
        .unwrap();
    }
    println!("READY");
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn pages_outlive_a_killed_client_process() {
    let (h, _store) = server(PAGE, 64 << 20);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "list_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("MEMCOLO_LIST_CHILD", h.addr().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let start = Instant::now();
    // (libtest prints "test list_child ... " first, on the same line.)
    while !line.trim_end().ends_with("READY") {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 || start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child never got ready");
        }
    }
    assert!(h.open_connections() >= 1);
    child.kill().unwrap(); // SIGKILL, as a crash.
    child.wait().unwrap();
    wait_no_connections(&h);
    let want: Vec<u64> = (0..CHILD_PAGES).map(|p| 2 * p).collect();
    recover(h.addr(), CHILD_REGION, &want);
}
