//! Scheduling of the calling process's own threads: policy and nice value
//! (`sched_setscheduler(2)`, `setpriority(2)`, `sched(7)`), thread ids
//! (`gettid(2)`), and their run and wait times (`/proc/self/task/TID/schedstat`,
//! read through [`ProcFs::read_self_task_schedstat`]). For the tier manager's fault
//! and eviction threads.

use crate::procfs::ProcFs;
use std::io;

/// A thread's scheduling policy (`sched(7)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadPolicy {
    /// `SCHED_OTHER` at nice value `nice` (-20..=19).
    Other {
        /// Nice value, -20..=19.
        nice: i32,
    },
    /// `SCHED_IDLE`: runs only when nothing else wants the CPU; `nice` is kept for a
    /// later return to `SCHED_OTHER` (the kernel ignores it under `SCHED_IDLE`).
    Idle {
        /// Nice value, -20..=19.
        nice: i32,
    },
    /// `SCHED_FIFO` at real-time priority `priority` (1..=99).
    Fifo {
        /// Real-time priority, 1..=99.
        priority: i32,
    },
}

impl ThreadPolicy {
    /// `SCHED_IDLE` (`idle`) or `SCHED_OTHER`, at nice value `nice`.
    pub fn background(nice: i32, idle: bool) -> Self {
        if idle {
            ThreadPolicy::Idle { nice }
        } else {
            ThreadPolicy::Other { nice }
        }
    }
}

/// The calling thread's id (`gettid(2)`).
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Sets the scheduling policy of thread `tid` of this process (`sched_setscheduler`
/// with `SCHED_OTHER`, `SCHED_IDLE` or `SCHED_FIFO`; then, for the first two,
/// `setpriority(PRIO_PROCESS, tid, nice)`).
///
/// # Errors
/// The failed call's error: `EPERM` raising the priority (real-time, or leaving
/// `SCHED_IDLE`) without `CAP_SYS_NICE`, `EACCES` lowering the nice value without
/// it, `ESRCH` for no such thread, `EINVAL` for a priority out of range.
pub fn set_thread_policy(tid: i32, policy: ThreadPolicy) -> io::Result<()> {
    let (class, priority, nice) = match policy {
        ThreadPolicy::Other { nice } => (libc::SCHED_OTHER, 0, Some(nice)),
        ThreadPolicy::Idle { nice } => (libc::SCHED_IDLE, 0, Some(nice)),
        ThreadPolicy::Fifo { priority } => (libc::SCHED_FIFO, priority, None),
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: a valid sched_param for a thread id; a plain syscall.
    if unsafe { libc::sched_setscheduler(tid, class, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if let Some(nice) = nice {
        // SAFETY: a plain syscall on a thread id; no memory is passed.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `(run time, run delay)` in ns of thread `tid` of this process: the time it spent
/// on a CPU, and runnable waiting for one (the first two fields of its
/// `schedstat`); `(0, 0)` when unknown (`tid` 0, or the file unreadable).
pub fn thread_run_and_wait_ns(tid: i32) -> (u64, u64) {
    if tid == 0 {
        return (0, 0);
    }
    match ProcFs::root().read_self_task_schedstat(tid) {
        Ok(s) => (s.run_ns, s.wait_ns),
        Err(_) => (0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current_nice(tid: i32) -> i32 {
        // SAFETY: a plain syscall; errno is cleared first to tell -1 from an error.
        unsafe {
            *libc::__errno_location() = 0;
            libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t)
        }
    }

    #[test]
    fn a_thread_sets_its_own_nice_value_and_idle_policy() {
        // In a thread of its own, so that the test harness's threads keep theirs.
        std::thread::spawn(|| {
            let me = gettid();
            assert!(me > 0);
            // Raising one's own nice value needs no privilege.
            set_thread_policy(me, ThreadPolicy::background(5, false)).unwrap();
            assert_eq!(current_nice(me), 5);
            // SAFETY: reads the calling thread's policy.
            assert_eq!(unsafe { libc::sched_getscheduler(me) }, libc::SCHED_OTHER);
            set_thread_policy(me, ThreadPolicy::background(7, true)).unwrap();
            // SAFETY: as above.
            assert_eq!(unsafe { libc::sched_getscheduler(me) }, libc::SCHED_IDLE);
            assert_eq!(current_nice(me), 7);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_out_of_range_priority_is_refused() {
        std::thread::spawn(|| {
            let e = set_thread_policy(gettid(), ThreadPolicy::Fifo { priority: 1000 }).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn run_time_is_read_for_a_live_thread_and_zero_for_none() {
        assert_eq!(thread_run_and_wait_ns(0), (0, 0));
        let me = gettid();
        // Burn a little CPU so that the run time is non-zero.
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(thread_run_and_wait_ns(me).0 > 0);
    }
}
