//! Turning a swap device off: `swapoff(8)`, retried.
//!
//! `swapoff` brings every swapped page back into memory and fails (`ENOMEM`) while a
//! page's memory cgroup is at its limit; a benchmark or test that pressed a scratch
//! cgroup against its limit and then turns its zram swap off meets that as long as
//! the cgroup's last charges are being released. So it is retried for a while before
//! giving up, and a device still on is left to the caller to report (its reset would
//! fail with `EBUSY` anyway).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Runs `swapoff DEV` up to `tries` times (at least once), sleeping 250 ms × the
/// attempt number (at most 2 s) between attempts.
///
/// # Errors
/// The last attempt's failure: `swapoff` could not be spawned, or it exited non-zero
/// (with its stderr).
pub fn swapoff_retrying(dev: &Path, tries: u32) -> Result<(), String> {
    let mut last = String::new();
    for attempt in 0..tries.max(1) {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(250 * u64::from(attempt.min(8))));
        }
        match Command::new("swapoff").arg(dev).output() {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => {
                last = format!(
                    "swapoff {} failed ({}): {}",
                    dev.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            }
            Err(e) => last = format!("swapoff {}: {e}", dev.display()),
        }
    }
    Err(last)
}
