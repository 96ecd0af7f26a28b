//! zram swap for the duration of a benchmark.
//!
//! Anonymous memory of BE jobs can only be reclaimed to swap; the benchmark uses a
//! compressed RAM disk (`/dev/zram0`) as that swap: `disksize`, `mkswap`, `swapon -p`.
//! [`ZramSwap`] undoes it when dropped: `swapoff` and `reset`. A device that is
//! already initialised or in use belongs to someone else and is left alone
//! ([`ZramSwap::setup`] returns `Ok(None)` with the reason).

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use crate::error::{BenchError, Result};

/// An active zram swap device.
#[derive(Debug)]
pub struct ZramSwap {
    dev: PathBuf,
    sys: PathBuf,
}

/// True if `dev` appears in the text of `/proc/swaps`.
pub fn listed_in_swaps(proc_swaps: &str, dev: &str) -> bool {
    proc_swaps
        .lines()
        .skip(1)
        .any(|l| l.split_whitespace().next() == Some(dev))
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().map_err(|source| BenchError::Spawn {
        program: format!("{:?}", cmd.get_program()),
        source,
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BenchError::Process(format!(
            "{:?} failed ({}): {}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl ZramSwap {
    /// Sets `/dev/<name>` up as swap of `size_bytes` with `priority`. `Ok(Err(reason))`
    /// when the device is absent or busy.
    pub fn setup(
        name: &str,
        size_bytes: u64,
        priority: i32,
    ) -> Result<std::result::Result<Self, String>> {
        let dev = PathBuf::from(format!("/dev/{name}"));
        let sys = PathBuf::from(format!("/sys/block/{name}"));
        if !dev.exists() || !sys.exists() {
            // zram may be a module that is not loaded yet.
            let _ = Command::new("modprobe").arg("zram").output();
            if !dev.exists() {
                return Ok(Err(format!("{} does not exist", dev.display())));
            }
        }
        let swaps = fs::read_to_string("/proc/swaps").unwrap_or_default();
        if listed_in_swaps(&swaps, &dev.to_string_lossy()) {
            return Ok(Err(format!("{} is already swap", dev.display())));
        }
        let disksize = sys.join("disksize");
        let cur = fs::read_to_string(&disksize).map_err(|e| BenchError::io(&disksize, e))?;
        if cur.trim() != "0" {
            return Ok(Err(format!(
                "{} is initialised (disksize {}), in use by someone else",
                dev.display(),
                cur.trim()
            )));
        }
        if let Err(e) = fs::write(&disksize, size_bytes.to_string()) {
            // EBUSY: someone initialised it between our check and the write.
            return Ok(Err(format!("{}: {e}", disksize.display())));
        }
        // From here on the device is ours: Drop resets it on any failure below.
        let z = ZramSwap { dev, sys };
        run(Command::new("mkswap").arg(&z.dev))?;
        run(Command::new("swapon")
            .arg("-p")
            .arg(priority.to_string())
            .arg(&z.dev))?;
        Ok(Ok(z))
    }

    /// Bytes of swap in use on the device (`/proc/swaps`, KiB there).
    pub fn used_bytes(&self) -> u64 {
        let swaps = fs::read_to_string("/proc/swaps").unwrap_or_default();
        let dev = self.dev.to_string_lossy();
        swaps
            .lines()
            .skip(1)
            .find(|l| l.split_whitespace().next() == Some(&dev))
            .and_then(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .unwrap_or(0)
    }
}

impl Drop for ZramSwap {
    fn drop(&mut self) {
        let swaps = fs::read_to_string("/proc/swaps").unwrap_or_default();
        if listed_in_swaps(&swaps, &self.dev.to_string_lossy()) {
            // Retried while a memory cgroup at its limit makes it fail (ENOMEM).
            if let Err(e) = memcolo_linux::swap::swapoff_retrying(&self.dev, 20) {
                eprintln!("warning: {e}; /dev/zram0 left as swap, undo with `swapoff {0} && echo 1 > {1}`", self.dev.display(), self.sys.join("reset").display());
                return;
            }
        }
        let reset = self.sys.join("reset");
        if let Err(e) = fs::write(&reset, "1") {
            eprintln!("warning: {}: {e}", reset.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_device_in_proc_swaps() {
        let text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/dev/zram0 partition\t8388604\t0\t100\n";
        assert!(listed_in_swaps(text, "/dev/zram0"));
        assert!(!listed_in_swaps(text, "/dev/zram1"));
        assert!(!listed_in_swaps(
            "Filename Type Size Used Priority\n",
            "/dev/zram0"
        ));
    }
}
