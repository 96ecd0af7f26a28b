//! What every benchmark of this crate shares: where raw results go, the facts about
//! the machine a report states, progress lines, and checks for the tools a benchmark
//! needs.
//!
//! Raw results are not source: they go to `bench/out/<experiment>/<date>-<host>/`
//! (ignored by git); what is committed of an experiment is its summary.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use memcolo_linux::procfs::ProcFs;

/// The default output directory of an experiment:
/// `bench/out/<name>/<YYYY-MM-DD>-<hostname>`.
pub fn default_out_dir(name: &str) -> PathBuf {
    let date = chrono::Utc::now().format("%Y-%m-%d").to_string();
    PathBuf::from("bench/out")
        .join(name)
        .join(format!("{date}-{}", hostname()))
}

/// The machine's hostname.
pub fn hostname() -> String {
    ProcFs::root()
        .read_sysctl("kernel.hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    ProcFs::root()
        .read_sysctl("kernel.osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `MemTotal` of `/proc/meminfo`, bytes (0 if unreadable).
pub fn mem_total_bytes() -> u64 {
    ProcFs::root()
        .read_meminfo()
        .map(|m| m.mem_total_bytes)
        .unwrap_or(0)
}

/// The commit of the source tree the benchmark runs from (`git rev-parse --short
/// HEAD` in the current directory, with `+dirty` when the tree has changes, as
/// `bench/benchlib.py` writes it); empty outside a git checkout.
pub fn source_commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else {
        return String::new();
    };
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) if !s.is_empty() => format!("{head}+dirty"),
        _ => head,
    }
}

/// Creates the output directory `out` and its `logs/`, and a private work directory
/// (removed when the returned guard drops) named `<prefix>…` in the temp dir.
/// Returns the log directory and the work directory.
pub fn prepare_out(out: &Path, prefix: &str) -> anyhow::Result<(PathBuf, tempfile::TempDir)> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let log_dir = out.join("logs");
    std::fs::create_dir_all(&log_dir).with_context(|| format!("create {}", log_dir.display()))?;
    let work = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .context("create work directory")?;
    Ok((log_dir, work))
}

/// Prints one progress line with the time since `t0`.
pub fn progress(t0: Instant, msg: &str) {
    eprintln!("[{:>7.1}s] {msg}", t0.elapsed().as_secs_f64());
}

/// CLOCK_MONOTONIC now, seconds (the clock of `perf record -k mono`).
pub fn monotonic_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Fails unless `p` names an existing file (a path) or a program in `PATH`.
pub fn which(p: &Path) -> anyhow::Result<()> {
    if p.components().count() > 1 {
        if p.exists() {
            return Ok(());
        }
        bail!("{} does not exist", p.display());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join(p).is_file()) {
        Ok(())
    } else {
        bail!("{} not found in PATH", p.display())
    }
}

/// Formats seconds as `1h02m`, `12m05s` or `42s`, for progress estimates.
pub fn format_duration_s(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_dir_is_under_the_ignored_folder() {
        let d = default_out_dir("colocation");
        assert!(d.starts_with("bench/out/colocation"), "{}", d.display());
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.gitignore");
        let ignore = std::fs::read_to_string(root).unwrap();
        assert!(
            ignore.lines().any(|l| l.trim() == "/bench/out/"),
            "bench/out/ must be ignored by git"
        );
    }

    #[test]
    fn durations_read_like_a_clock() {
        assert_eq!(format_duration_s(42.4), "42s");
        assert_eq!(format_duration_s(725.0), "12m05s");
        assert_eq!(format_duration_s(3720.0), "1h02m");
        assert_eq!(format_duration_s(-3.0), "0s");
    }

    #[test]
    fn machine_facts() {
        assert!(mem_total_bytes() > 0);
        assert!(!kernel_release().is_empty());
        assert!(!hostname().is_empty());
        assert!(which(Path::new("sh")).is_ok());
        assert!(which(Path::new("no-such-program-memcolo")).is_err());
        assert!(which(Path::new("/no/such/file")).is_err());
    }
}
