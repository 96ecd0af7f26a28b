//! Helpers shared by the tier integration tests on real memory of this process.

#![allow(dead_code)]

use memcolo_tier::manager::{ManagerStats, TierManager};
use memcolo_tier::uffd;
use std::time::{Duration, Instant};

/// Whether this process may use userfaultfd (root, or vm.unprivileged_userfaultfd =
/// 1); prints why not, so that a test can pass without running.
pub fn permitted() -> bool {
    match uffd::check_permission() {
        Ok(()) => true,
        Err(why) => {
            eprintln!("skipped: {why}");
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
