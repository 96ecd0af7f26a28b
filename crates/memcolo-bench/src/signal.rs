//! Ctrl-C and SIGTERM during a benchmark: a flag, not death.
//!
//! A benchmark owns cgroups, zram swap and child processes that must be undone on every
//! exit path. [`StopGuard::install`] replaces the SIGINT and SIGTERM handlers with one
//! that only sets a flag ([`stop_requested`]); every wait in the benchmark polls it and
//! returns [`crate::BenchError::Interrupted`], so the ordinary `Drop` guards clean up.
//! The previous handlers come back when the guard is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

use crate::error::{BenchError, Result};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// True once SIGINT or SIGTERM arrived while a [`StopGuard`] was installed.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// `Err(Interrupted)` if a stop was requested.
pub fn check() -> Result<()> {
    if stop_requested() {
        Err(BenchError::Interrupted)
    } else {
        Ok(())
    }
}

/// Sleeps for `d` in small steps, returning early with `Err(Interrupted)` on a stop.
pub fn sleep(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    loop {
        check()?;
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

/// Keeps the flag-setting handlers installed while alive.
pub struct StopGuard {
    old: Vec<(Signal, SigAction)>,
}

impl StopGuard {
    /// Installs the handlers for SIGINT and SIGTERM and clears the flag.
    pub fn install() -> Result<Self> {
        STOP.store(false, Ordering::SeqCst);
        let action = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        let mut old = Vec::new();
        for sig in [Signal::SIGINT, Signal::SIGTERM] {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
            let prev = unsafe { sigaction(sig, &action) }
                .map_err(|e| BenchError::Process(format!("sigaction({sig}): {e}")))?;
            old.push((sig, prev));
        }
        Ok(StopGuard { old })
    }
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        for (sig, prev) in self.old.drain(..) {
            // SAFETY: restores the handler that was installed before ours.
            let _ = unsafe { sigaction(sig, &prev) };
        }
    }
}
