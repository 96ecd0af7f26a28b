//! Helpers shared by the tier integration tests on real memory of this process.

#![allow(dead_code)]

use memcolo_tier::manager::{ManagerStats, TierManager};
use memcolo_tier::region::{MemfdRegion, SharedFile};
use memcolo_tier::uffd::{self, features, mode, Uffd};
use std::time::{Duration, Instant};

/// Whether this process may use userfaultfd (root, or vm.unprivileged_userfaultfd =
/// 1); when not, the test fails saying why ([`cannot_run`]).
pub fn permitted() -> bool {
    match uffd::check_permission() {
        Ok(()) => true,
        Err(why) => {
            cannot_run("this test", &why.to_string());
            false
        }
    }
}

/// Waits (at most 10 s) until the manager's counters satisfy `ok`: the fault thread
/// finishes a fault's bookkeeping after the faulting thread was woken. Panics with
/// the counters and the manager's last error when they never do.
pub fn settle(m: &TierManager, ok: impl Fn(&ManagerStats) -> bool) -> ManagerStats {
    let start = Instant::now();
    loop {
        let s = m.stats();
        if ok(&s) {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "counters never settled: {s:?} {:?}",
            m.last_error()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A memfd region registered with a fresh userfaultfd (MISSING and WP, with the
/// shmem features), and the manager's way to its pages: its own descriptor of the
/// memfd, as the agent reaches another process's region.
pub fn memfd_under_uffd(r: &MemfdRegion) -> (Uffd, SharedFile) {
    let u = Uffd::open(
        features::PAGEFAULT_FLAG_WP | features::MISSING_SHMEM | features::WP_HUGETLBFS_SHMEM,
    )
    .unwrap();
    u.register(r.as_ptr() as u64, r.len() as u64, mode::MISSING | mode::WP)
        .unwrap();
    let mem = SharedFile::new(r.dup_fd().unwrap(), r.as_ptr() as u64, r.pages()).unwrap();
    (u, mem)
}

/// The helper for tests that cannot run here, shared by every crate's tests.
pub use memcolo_testkit::cannot_run;
