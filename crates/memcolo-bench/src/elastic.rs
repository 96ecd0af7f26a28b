//! The elastic tenant of the colocation bench: memcolo's elastic slab cache in Go
//! (`sdk/go/cache`), run by the M3 benchmark's cache job (`gocache`, M3's Go-Cache
//! benchmark, EuroSys'21 §7.1.1).
//!
//! It preloads part of a key space of 4 KiB values and serves uniform random gets for
//! the whole run from a few goroutines; a miss waits 1 ms (the backend lookup) and
//! puts the value, so the gets it serves per minute rise with the memory it holds.
//!
//! - Without the agent the cache is **static**: it never maps more than its share of
//!   the level's BE demand (`-max-mib`), the application's own size setting.
//! - With the agent it is **elastic**: it grows freely (up to its key space, 1.5 × its
//!   share), registers as `elastic` and gives memory back in layers on the agent's
//!   signals; the allow-rate gate (M3 §4.2) throttles its growth after a high signal.
//!
//! Its work is the gets it served in the measured phase, from the progress lines it
//! prints every 250 ms (`done_frac` × the gets it was asked to serve).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{BenchError, Result};
use crate::process::{spawn, ChildGuard, ChildPlacement};

const MIB: u64 = 1 << 20;
/// Value size of the cache's entries.
pub const VALUE_BYTES: u64 = 4096;
/// Gets the job is asked to serve: more than any run reaches.
const GETS: u64 = 1 << 40;

/// How to start the elastic tenant.
#[derive(Clone, Debug)]
pub struct ElasticSpec<'a> {
    /// The `gocache` binary.
    pub exe: &'a Path,
    /// Its share of the level's BE demand, bytes.
    pub share_bytes: u64,
    /// The agent's socket: elastic with the agent; `None`: static at its share.
    pub agent_socket: Option<&'a Path>,
    /// Goroutines serving gets.
    pub workers: u32,
}

/// A running elastic tenant; killed when dropped.
#[derive(Debug)]
pub struct ElasticJob {
    child: ChildGuard,
    out: PathBuf,
}

impl ElasticJob {
    /// Starts the job, placed as `place`; its progress lines go to `out`.
    pub fn start(spec: &ElasticSpec<'_>, place: &ChildPlacement<'_>, out: &Path) -> Result<Self> {
        let keys = (spec.share_bytes * 3 / 2 / VALUE_BYTES).max(1024);
        let stdout = std::fs::File::create(out).map_err(|e| BenchError::io(out, e))?;
        let mut cmd = Command::new(spec.exe);
        cmd.arg("-keys")
            .arg(keys.to_string())
            .arg("-value-bytes")
            .arg(VALUE_BYTES.to_string())
            // Preload about its share (2/3 of the key space).
            .args(["-preload", "0.66"])
            .arg("-gets")
            .arg(GETS.to_string())
            .arg("-workers")
            .arg(spec.workers.to_string())
            .args(["-miss-ms", "1"])
            .args(["-report-ms", "250"])
            .args(["-name", "be-elastic-cache"])
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::null());
        match spec.agent_socket {
            Some(sock) => {
                cmd.args(["-max-mib", "0"]).env("MEMCOLO_SOCKET", sock);
            }
            None => {
                cmd.arg("-max-mib")
                    .arg((spec.share_bytes / MIB).max(1).to_string());
            }
        }
        let child = spawn(&mut cmd, "gocache", place)?;
        Ok(ElasticJob {
            child,
            out: out.to_path_buf(),
        })
    }

    /// The job's pid (the leader of its process group).
    pub fn pid(&self) -> i32 {
        self.child.pid()
    }

    /// Whether the job still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Gets served so far, from its last progress line (`None` before the first).
    pub fn gets_served(&self) -> Option<f64> {
        last_progress(&self.out).map(|p| p.gets_served)
    }

    /// Its last progress line.
    pub fn last_progress(&self) -> Option<ElasticProgress> {
        last_progress(&self.out)
    }

    /// Ends the job (SIGTERM, then SIGKILL after a second).
    pub fn stop(&mut self) -> Result<()> {
        self.child
            .terminate(std::time::Duration::from_secs(1))
            .map(|_| ())
    }
}

/// One progress line of the job.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ElasticProgress {
    /// Seconds since the job started.
    pub t_s: f64,
    /// Gets served.
    pub gets_served: f64,
    /// Bytes of values cached, and bytes of slabs mapped.
    pub useful_bytes: u64,
    pub mapped_bytes: u64,
    /// Allowed growth rate of the gate (elastic only).
    pub allow_rate: Option<f64>,
}

/// Parses one progress line (JSON); `None` for anything else.
pub fn parse_progress(line: &str) -> Option<ElasticProgress> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    Some(ElasticProgress {
        t_s: v["t_s"].as_f64()?,
        gets_served: v["done_frac"].as_f64()? * GETS as f64,
        useful_bytes: v["useful_bytes"].as_u64().unwrap_or(0),
        mapped_bytes: v["mapped_bytes"].as_u64().unwrap_or(0),
        allow_rate: v["allow_rate"].as_f64(),
    })
}

fn last_progress(path: &Path) -> Option<ElasticProgress> {
    let f = std::fs::File::open(path).ok()?;
    BufReader::new(f)
        .lines()
        .map_while(|l| l.ok())
        .filter_map(|l| parse_progress(&l))
        .last()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines() {
        let p = parse_progress(
            r#"{"t_s":2.5,"useful_bytes":4096,"mapped_bytes":1048576,"done_frac":1e-9,"phase":1,"allow_rate":0.5}"#,
        )
        .unwrap();
        assert_eq!(p.t_s, 2.5);
        assert!((p.gets_served - 1e-9 * GETS as f64).abs() < 1e-3);
        assert_eq!((p.useful_bytes, p.mapped_bytes), (4096, 1 << 20));
        assert_eq!(p.allow_rate, Some(0.5));
        assert!(parse_progress("not json").is_none());
        assert!(parse_progress(r#"{"t_s":1}"#).is_none());
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("out");
        std::fs::write(
            &f,
            "{\"t_s\":1,\"done_frac\":0}\n{\"t_s\":2,\"done_frac\":0.5}\ngarbage",
        )
        .unwrap();
        assert_eq!(last_progress(&f).unwrap().t_s, 2.0);
        assert!(last_progress(&dir.path().join("none")).is_none());
    }
}
