//! The rig of the recovery tests (`tests/recovery.rs`): patterned pages, a region
//! process with its shadow and remove journal, a memory server and its clients, and
//! the first manager that is abandoned as if its agent had been killed.

#![allow(dead_code)]

use memcolo_tier::channel::{Auth, Secret};
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::manager::{NoPlacement, TierConfig, TierManager};
use memcolo_tier::memserver::{MemServer, MemServerHandle, ServerConfig};
use memcolo_tier::region::{runs, MemfdRegion, RegionMemory, SharedFile, PAGE};
use memcolo_tier::remote::{RemoteConfig, RemoteTier};
use memcolo_tier::shadow::Shadow;
use memcolo_tier::uffd::{features, mode, Uffd};
use memcolo_tier::SlowTier;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// The shared secret of the memory servers and clients of these tests.
pub(crate) fn test_auth() -> Auth {
    Auth::Secret(Arc::new(Secret::from_bytes(vec![0x5a; 32]).unwrap()))
}

/// The byte pattern of page `p` in round `round`: distinct per page and round.
pub(crate) fn fill(page: &mut [u8], p: usize, round: u64) {
    let mut x = ((p as u64 + 1) << 8 ^ round).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in page.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

pub(crate) fn pattern(p: usize, round: u64) -> Vec<u8> {
    let mut v = vec![0u8; PAGE];
    fill(&mut v, p, round);
    v
}

pub(crate) fn page_slice(base: usize, p: usize) -> &'static mut [u8] {
    // SAFETY: tests only pass pages inside a live region they own.
    unsafe { std::slice::from_raw_parts_mut((base + p * PAGE) as *mut u8, PAGE) }
}

/// Runs `f` on a thread of its own and waits at most 10 s for it: an application
/// access that a broken recovery never serves fails the test instead of hanging it.
pub(crate) fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(v) => {
            let _ = h.join();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread sent nothing and did not panic"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still blocked after 10 s (a fault nobody serves)")
        }
    }
}

/// Reads every page of the region from the application side (faulting pages in)
/// and returns the pages whose bytes differ from `want(p)`.
pub(crate) fn differing(
    base: usize,
    pages: usize,
    want: impl Fn(usize) -> Vec<u8> + Send + 'static,
) -> Vec<usize> {
    within("reading the region", move || {
        (0..pages)
            .filter(|&p| *page_slice(base, p) != *want(p))
            .collect::<Vec<_>>()
    })
}

/// A new memfd for a shadow of a region of `pages` pages, its control page written
/// as libmemcolo does.
pub(crate) fn shadow_memfd(pages: usize) -> OwnedFd {
    // SAFETY: creating a new memfd with a static name.
    let fd = unsafe {
        libc::memfd_create(
            c"memcolo-shadow".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    assert!(fd >= 0, "{}", io::Error::last_os_error());
    // SAFETY: a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    Shadow::init(&fd, pages).unwrap();
    fd
}

pub(crate) fn shadow_of(fd: &OwnedFd, pages: usize) -> Shadow {
    Shadow::new(fd.try_clone().unwrap(), pages).unwrap()
}

/// Writes journal slot `k` of a shadow of a region of `pages` pages as the process
/// does before its `madvise(MADV_REMOVE)` of region bytes `[start, end)`: state 1,
/// the range, state 2 (pending).
pub(crate) fn journal_remove(fd: &OwnedFd, pages: usize, k: usize, start: u64, end: u64) {
    let slot = pages * PAGE + 64 + 32 * k;
    let pwrite = |data: &[u8], off: usize| {
        // SAFETY: writing from a live buffer of the given length.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                off as libc::off_t,
            )
        };
        assert_eq!(n, data.len() as isize, "{}", io::Error::last_os_error());
    };
    pwrite(&1u64.to_le_bytes(), slot);
    let mut range = [0u8; 16];
    range[..8].copy_from_slice(&start.to_le_bytes());
    range[8..].copy_from_slice(&end.to_le_bytes());
    pwrite(&range, slot + 8);
    pwrite(&2u64.to_le_bytes(), slot);
}

/// Punches pages `[first, first + count)` out of the memfd, as the kernel did for a
/// `madvise(MADV_REMOVE)` the dead agent had read.
pub(crate) fn punch(fd: &OwnedFd, first: usize, count: usize) {
    // SAFETY: punching a hole in our own memfd.
    let r = unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            (first * PAGE) as libc::off_t,
            (count * PAGE) as libc::off_t,
        )
    };
    assert_eq!(r, 0, "{}", io::Error::last_os_error());
}

/// Writes one page of the memfd behind the application's back (as a write that
/// reached the page cache before the agent died).
pub(crate) fn pwrite_page(fd: &OwnedFd, p: usize, data: &[u8]) {
    // SAFETY: writing from a live buffer of PAGE bytes.
    let n = unsafe {
        libc::pwrite(
            fd.as_raw_fd(),
            data.as_ptr().cast(),
            PAGE,
            (p * PAGE) as libc::off_t,
        )
    };
    assert_eq!(n, PAGE as isize, "{}", io::Error::last_os_error());
}

/// A memory server on 127.0.0.1 and the store behind it.
pub(crate) fn server() -> (MemServerHandle, Arc<CompressedStore>) {
    let store = Arc::new(CompressedStore::new(PAGE, 1 << 30));
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

/// A new client of the server at `h` (a new agent's connection).
pub(crate) fn client(h: &MemServerHandle) -> Arc<RemoteTier> {
    let cfg = RemoteConfig {
        connect_timeout: Duration::from_millis(300),
        io_timeout: Duration::from_secs(2),
        attempts: 3,
        backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
        ..RemoteConfig::new(h.addr().to_string(), PAGE, test_auth())
    };
    Arc::new(RemoteTier::connect(cfg).unwrap())
}

/// One test at a time: a test that unmaps a page of its region leaves a hole that
/// another test's mapping (a shadow's control page is one page) could take, and
/// its MADV_REMOVE would then punch that test's memory.
pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The instance id the memory server answers (what the agent keeps for a region
/// at registration, and `tier_recover` carries back).
pub(crate) fn instance(h: &MemServerHandle) -> u64 {
    client(h).instance()
}

/// Manager A: the region handed to an agent with its shadow.
pub(crate) fn shadowed(
    p: &Process,
    u: Uffd,
    tier: Arc<dyn SlowTier>,
    cfg: TierConfig,
) -> TierManager {
    let (mem, shadow) = p.handed();
    TierManager::start_shadowed(u, mem, tier, Box::new(NoPlacement), cfg, shadow).unwrap()
}

/// Manager B: the region taken over by a new agent (`uffd`: the process's
/// userfaultfd, as it hands it over) with its own client of the same server.
pub(crate) fn recover_b(
    p: &Process,
    uffd: Uffd,
    h: &MemServerHandle,
    cfg: TierConfig,
) -> TierManager {
    let (mem, shadow) = p.handed();
    TierManager::recover(
        uffd,
        mem,
        client(h),
        Box::new(NoPlacement),
        cfg,
        shadow,
        instance(h),
    )
    .unwrap()
}

/// Region `region` handling the application's frees (remove events), sampling
/// windows of 8 pages.
pub(crate) fn removing(region: u64) -> TierConfig {
    TierConfig {
        track_remove: true,
        ..config(region, 8)
    }
}

/// Sampling windows of exactly `sample_pages` pages.
pub(crate) fn config(region: u64, sample_pages: usize) -> TierConfig {
    TierConfig {
        sample_pages,
        sample_target_hits: 0,
        ..TierConfig::new(region)
    }
}

/// A region the process keeps through its agent's death: the memfd mapped here, the
/// shadow memfd, and its own descriptor of the userfaultfd.
pub(crate) struct Process {
    pub(crate) r: MemfdRegion,
    pub(crate) memfd: OwnedFd,
    pub(crate) shadow: OwnedFd,
    pub(crate) uffd: OwnedFd,
    pub(crate) features: u64,
    pub(crate) pages: usize,
}

impl Process {
    /// A region of `pages` pages, every page written with its round-`round` pattern,
    /// registered with a userfaultfd (`extra` features besides the shmem ones).
    pub(crate) fn new(pages: usize, round: u64, extra: u64) -> (Process, Uffd) {
        let r = MemfdRegion::new(pages).unwrap();
        for p in 0..pages {
            fill(page_slice(r.as_ptr() as usize, p), p, round);
        }
        let u = Uffd::open(
            features::PAGEFAULT_FLAG_WP
                | features::MISSING_SHMEM
                | features::WP_HUGETLBFS_SHMEM
                | extra,
        )
        .unwrap();
        u.register(r.as_ptr() as u64, r.len() as u64, mode::MISSING | mode::WP)
            .unwrap();
        let p = Process {
            memfd: r.dup_fd().unwrap(),
            shadow: shadow_memfd(pages),
            uffd: u.as_fd().try_clone_to_owned().unwrap(),
            features: u.features(),
            pages,
            r,
        };
        (p, u)
    }

    pub(crate) fn base(&self) -> usize {
        self.r.as_ptr() as usize
    }

    /// What an agent is handed for the region: the memory, and the shadow.
    pub(crate) fn handed(&self) -> (Box<dyn RegionMemory>, Shadow) {
        let mem = SharedFile::new(self.r.dup_fd().unwrap(), self.base() as u64, self.pages);
        (Box::new(mem.unwrap()), shadow_of(&self.shadow, self.pages))
    }

    /// The userfaultfd again, as the process hands it to a new agent.
    pub(crate) fn uffd(&self) -> Uffd {
        Uffd::from_fd(self.uffd.try_clone().unwrap(), self.features)
    }

    /// The memfd's data runs.
    pub(crate) fn memfd_runs(&self) -> Vec<(usize, usize)> {
        SharedFile::new(self.memfd.try_clone().unwrap(), 0, self.pages)
            .unwrap()
            .present_runs()
            .unwrap()
    }

    pub(crate) fn shadow_runs(&self) -> Vec<(usize, usize)> {
        shadow_of(&self.shadow, self.pages).present_runs().unwrap()
    }

    pub(crate) fn pending_removes(&self) -> Vec<(usize, u64, u64)> {
        shadow_of(&self.shadow, self.pages).pending_removes()
    }
}

/// Starts manager A over the process's region with a new client of `h`, evicts
/// `evict` and waits for it, then opens a sampling window and leaves it open.
/// Returns A and the sampled pages (sorted), their copies checked in the shadow.
pub(crate) fn manager_a(
    p: &Process,
    u: Uffd,
    h: &MemServerHandle,
    cfg: TierConfig,
    evict: &[usize],
) -> (TierManager, Vec<usize>) {
    let a = shadowed(p, u, client(h), cfg);
    let t = a.evict(evict);
    a.wait_evicted(t);
    let s = a.stats();
    assert_eq!(
        s.stored_pages,
        evict.len() as u64,
        "{s:?} {:?}",
        a.last_error()
    );
    let mut sampled = a.sample_begin();
    sampled.sort_unstable();
    assert!(!sampled.is_empty());
    assert!(sampled.iter().all(|s| !evict.contains(s)), "{sampled:?}");
    // The stash is in the shadow, written through before the pages were dropped.
    assert_eq!(p.shadow_runs(), runs(&sampled));
    let sh = shadow_of(&p.shadow, p.pages);
    let mut out = vec![0u8; PAGE];
    for &q in &sampled {
        sh.read_page(q, &mut out).unwrap();
        assert!(out == pattern(q, 1), "shadow copy of page {q}");
    }
    (a, sampled)
}
