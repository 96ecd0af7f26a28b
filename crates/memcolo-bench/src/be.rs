//! Best-effort (BE) batch jobs that put the node under memory pressure.
//!
//! Memory pressure follows Hermes §5.1: *pressure = memory demand of the batch jobs /
//! memory of the node*; a level of 150 % on a 4 GiB node means BE jobs that want
//! 6 GiB. The demand is split between three real jobs (default file : anon : elastic
//! = 2 : 1 : 1, [`be_demand`]):
//!
//! - a **file streamer**: `fio` reading one data file sequentially through the page
//!   cache (`--rw=read --ioengine=psync`, buffered) in a loop for the whole run; its
//!   demand is the size of the part of the file it reads. BE work = bytes read
//!   (`rchar`), sampled during the measured phase.
//! - an **anonymous-memory holder**: `stress-ng --vm 1 --vm-keep --vm-method write64`,
//!   which maps its share once and keeps writing all of it. BE work = stress-ng's
//!   bogo ops over its run.
//! - an **elastic cache** ([`crate::elastic`]): memcolo's Go slab cache, static at its
//!   share without the agent, elastic (M3's protocol) with it. BE work = gets served
//!   in the measured phase.
//!
//! The data file lives on the real disk (default `/var/tmp/memcolo-bench`), is
//! written once with `O_DIRECT` (no page cache) from `/dev/urandom`; the bench
//! removes it at the end unless asked to keep it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::elastic::{ElasticJob, ElasticSpec};
use crate::error::{BenchError, Result};
use crate::peers::KillableJob;
use crate::process::{spawn, ChildGuard, ChildPlacement};

const MIB: u64 = 1 << 20;

/// How BE demand divides between page cache, anonymous memory and the elastic cache,
/// in parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BeSplit {
    /// Parts of the demand that are file pages (the streamer).
    pub file_parts: u32,
    /// Parts that are anonymous pages (the holder).
    pub anon_parts: u32,
    /// Parts held by the elastic cache.
    pub elastic_parts: u32,
}

impl std::str::FromStr for BeSplit {
    type Err = BenchError;

    /// Parses `FILE:ANON` or `FILE:ANON:ELASTIC`, e.g. `2:1:1`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || BenchError::BadSplit(s.to_string());
        let parts: Vec<u32> = s
            .split(':')
            .map(|p| p.trim().parse::<u32>().map_err(|_| bad()))
            .collect::<Result<_>>()?;
        let (file_parts, anon_parts, elastic_parts) = match parts[..] {
            [f, a] => (f, a, 0),
            [f, a, e] => (f, a, e),
            _ => return Err(bad()),
        };
        if file_parts + anon_parts + elastic_parts == 0 {
            return Err(bad());
        }
        Ok(BeSplit {
            file_parts,
            anon_parts,
            elastic_parts,
        })
    }
}

impl std::fmt::Display for BeSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.file_parts, self.anon_parts, self.elastic_parts
        )
    }
}

/// Memory the BE jobs of one level want, in bytes (multiples of 1 MiB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BeDemand {
    /// Size of the file region the streamer reads through the page cache.
    pub file_bytes: u64,
    /// Anonymous memory the holder maps and keeps touching.
    pub anon_bytes: u64,
    /// The elastic cache's share (its static size without the agent).
    pub elastic_bytes: u64,
}

impl BeDemand {
    /// Total demand.
    pub fn total_bytes(&self) -> u64 {
        self.file_bytes + self.anon_bytes + self.elastic_bytes
    }
}

/// The BE demand at `level_pct` % of `node_bytes` (Hermes §5.1), split by `split`
/// and rounded down to whole MiB. Level 0 is no BE at all.
pub fn be_demand(level_pct: u32, node_bytes: u64, split: BeSplit) -> BeDemand {
    let total = node_bytes as u128 * level_pct as u128 / 100;
    let parts = (split.file_parts + split.anon_parts + split.elastic_parts) as u128;
    let file = total * split.file_parts as u128 / parts;
    let anon = total * split.anon_parts as u128 / parts;
    let elastic = total * split.elastic_parts as u128 / parts;
    let mib = |b: u128| (b as u64) / MIB * MIB;
    BeDemand {
        file_bytes: mib(file),
        anon_bytes: mib(anon),
        elastic_bytes: mib(elastic),
    }
}

/// Makes sure `<dir>/stream.dat` holds at least `bytes` (rounded up to MiB), writing
/// it with `dd oflag=direct` from `/dev/urandom` (placed as `place`) if it is missing
/// or short. Returns the path and whether it was (re)written.
pub fn ensure_data_file(
    dir: &Path,
    bytes: u64,
    place: &ChildPlacement<'_>,
) -> Result<(PathBuf, bool)> {
    fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let path = dir.join("stream.dat");
    let want_mib = bytes.div_ceil(MIB).max(1);
    if let Ok(m) = fs::metadata(&path) {
        if m.len() >= want_mib * MIB {
            return Ok((path, false));
        }
    }
    let mut cmd = Command::new("dd");
    cmd.arg("if=/dev/urandom")
        .arg(format!("of={}", path.display()))
        .arg("bs=1M")
        .arg(format!("count={want_mib}"))
        .arg("oflag=direct")
        .arg("status=none")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = spawn(&mut cmd, "dd", place)?;
    loop {
        if let Some(st) = child.wait_timeout(Duration::from_millis(200))? {
            if !st.success() {
                let _ = fs::remove_file(&path);
                return Err(BenchError::Process(format!(
                    "dd writing {} failed: {st}",
                    path.display()
                )));
            }
            break;
        }
        if crate::signal::stop_requested() {
            drop(child);
            let _ = fs::remove_file(&path);
            return Err(BenchError::Interrupted);
        }
    }
    Ok((path, true))
}

/// The running BE jobs of one run.
#[derive(Debug, Default)]
pub struct BeJobs {
    streamer: Option<ChildGuard>,
    holder: Option<ChildGuard>,
    holder_yaml: Option<PathBuf>,
    elastic: Option<ElasticJob>,
}

/// What the BE jobs did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BeWork {
    /// stress-ng vm bogo ops per minute over its run, if it finished normally.
    pub anon_ops_per_min: Option<f64>,
}

/// How to start one run's BE jobs.
#[derive(Clone, Debug)]
pub struct BeStart<'a> {
    pub demand: BeDemand,
    /// The streamer's data file.
    pub data_file: &'a Path,
    /// How long the jobs run by themselves ([`BeJobs::stop`] ends them otherwise).
    pub run_for: Duration,
    pub place: ChildPlacement<'a>,
    /// Logs and stress-ng's YAML report go here, with `tag` in their names.
    pub log_dir: &'a Path,
    pub tag: &'a str,
    /// The elastic cache's binary (needed when the demand has an elastic share).
    pub elastic_exe: Option<&'a Path>,
    /// The agent's socket: the cache is elastic with it, static without.
    pub agent_socket: Option<&'a Path>,
}

impl BeJobs {
    /// Starts the jobs of `spec.demand`.
    pub fn start(spec: &BeStart<'_>) -> Result<Self> {
        let (demand, place, log_dir, tag) = (spec.demand, &spec.place, spec.log_dir, spec.tag);
        let mut jobs = BeJobs::default();
        let secs = spec.run_for.as_secs().max(1);
        let log = |name: &str| -> Result<fs::File> {
            let p = log_dir.join(format!("{name}-{tag}.log"));
            fs::File::create(&p).map_err(|e| BenchError::io(&p, e))
        };
        if demand.file_bytes > 0 {
            let mut cmd = Command::new("fio");
            cmd.arg("--name=be-stream")
                .arg(format!("--filename={}", spec.data_file.display()))
                .arg("--rw=read")
                .arg("--bs=1M")
                .arg("--ioengine=psync")
                .arg(format!("--size={}m", demand.file_bytes / MIB))
                .arg("--time_based=1")
                .arg(format!("--runtime={secs}"))
                .arg("--invalidate=0")
                .arg("--output-format=terse")
                .stdin(Stdio::null())
                .stdout(log("fio")?)
                .stderr(log("fio-err")?);
            jobs.streamer = Some(spawn(&mut cmd, "fio", place)?);
        }
        if demand.anon_bytes > 0 {
            let yaml = log_dir.join(format!("stress-ng-{tag}.yaml"));
            let mut cmd = Command::new("stress-ng");
            cmd.args(["--vm", "1"])
                .arg("--vm-bytes")
                .arg(format!("{}m", demand.anon_bytes / MIB))
                .arg("--vm-keep")
                .args(["--vm-method", "write64"])
                .arg("--timeout")
                .arg(format!("{secs}s"))
                .arg("--metrics-brief")
                .arg("--yaml")
                .arg(&yaml)
                .stdin(Stdio::null())
                .stdout(log("stress-ng")?)
                .stderr(Stdio::null());
            jobs.holder = Some(spawn(&mut cmd, "stress-ng", place)?);
            jobs.holder_yaml = Some(yaml);
        }
        if demand.elastic_bytes > 0 {
            let exe = spec.elastic_exe.ok_or_else(|| {
                BenchError::Invalid(
                    "the split has an elastic share but no elastic cache binary".into(),
                )
            })?;
            let out = log_dir.join(format!("elastic-{tag}.jsonl"));
            let e = ElasticSpec {
                exe,
                share_bytes: demand.elastic_bytes,
                agent_socket: spec.agent_socket,
                workers: 4,
            };
            jobs.elastic = Some(ElasticJob::start(&e, place, &out)?);
        }
        Ok(jobs)
    }

    /// Pids of the job leaders (their workers are found in the cgroup).
    pub fn leader_pids(&self) -> Vec<i32> {
        self.killable().into_iter().map(|j| j.pgid).collect()
    }

    /// The jobs by name (`file`, `anon`, `elastic`) with their process groups.
    pub fn killable(&self) -> Vec<KillableJob> {
        let mut out = Vec::new();
        for (name, pid) in [
            ("file", self.streamer.as_ref().map(|c| c.pid())),
            ("anon", self.holder.as_ref().map(|c| c.pid())),
            ("elastic", self.elastic.as_ref().map(|e| e.pid())),
        ] {
            if let Some(pgid) = pid {
                out.push(KillableJob {
                    name: name.into(),
                    pgid,
                });
            }
        }
        out
    }

    /// The jobs whose leader has exited (they run past the measured phase by design,
    /// so before [`BeJobs::stop`] an exited job was killed: by the OOM killer, the
    /// agent or a peer).
    pub fn exited(&mut self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (name, c) in [("file", &mut self.streamer), ("anon", &mut self.holder)] {
            if let Some(c) = c {
                if !matches!(c.try_wait(), Ok(None)) {
                    out.push(name);
                }
            }
        }
        if let Some(e) = &mut self.elastic {
            if !e.is_running() {
                out.push("elastic");
            }
        }
        out
    }

    /// The elastic cache, if the demand has one.
    pub fn elastic(&self) -> Option<&ElasticJob> {
        self.elastic.as_ref()
    }

    /// Waits up to `grace` for the jobs to end by themselves, then terminates them,
    /// and reads what the holder reported.
    pub fn stop(&mut self, grace: Duration) -> Result<BeWork> {
        for c in [&mut self.streamer, &mut self.holder].into_iter().flatten() {
            if c.wait_timeout(grace)?.is_none() {
                c.terminate(Duration::from_secs(3))?;
            }
        }
        if let Some(e) = &mut self.elastic {
            e.stop()?;
        }
        self.streamer = None;
        self.holder = None;
        self.elastic = None;
        let anon_ops_per_min = match &self.holder_yaml {
            Some(p) => fs::read_to_string(p)
                .ok()
                .and_then(|t| parse_stress_ng_yaml(&t))
                .map(|(ops, wall_s)| ops / wall_s * 60.0),
            None => None,
        };
        Ok(BeWork { anon_ops_per_min })
    }
}

/// `(bogo ops, wall-clock seconds)` of the first stressor in a stress-ng `--yaml`
/// report; `None` if absent or zero time.
pub fn parse_stress_ng_yaml(text: &str) -> Option<(f64, f64)> {
    let metrics = &text[text.find("metrics:")?..];
    let field = |name: &str| -> Option<f64> {
        metrics
            .lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    let ops = field("bogo-ops:")?;
    let wall = field("wall-clock-time:")?;
    (wall > 0.0).then_some((ops, wall))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn demand_follows_level_and_split() {
        let split: BeSplit = "2:1".parse().unwrap();
        assert_eq!(be_demand(0, 4 * GIB, split), BeDemand::default());
        let d = be_demand(150, 4 * GIB, split);
        assert_eq!(d.file_bytes, 4 * GIB);
        assert_eq!(d.anon_bytes, 2 * GIB);
        assert_eq!(d.total_bytes(), 6 * GIB);
        let d = be_demand(75, 4 * GIB, split);
        assert_eq!(d.total_bytes(), 3 * GIB);
        assert_eq!(d.file_bytes, 2 * GIB);
        // Only file, only anon.
        let d = be_demand(100, 4 * GIB, "1:0".parse().unwrap());
        assert_eq!((d.file_bytes, d.anon_bytes), (4 * GIB, 0));
        let d = be_demand(50, 4 * GIB, "0:1".parse().unwrap());
        assert_eq!((d.file_bytes, d.anon_bytes), (0, 2 * GIB));
        // Three ways.
        let d = be_demand(100, 4 * GIB, "2:1:1".parse().unwrap());
        assert_eq!(
            (d.file_bytes, d.anon_bytes, d.elastic_bytes),
            (2 * GIB, GIB, GIB)
        );
    }

    #[test]
    fn demand_is_whole_mib_and_never_over() {
        let split = BeSplit {
            file_parts: 2,
            anon_parts: 1,
            elastic_parts: 1,
        };
        let node = 3 * GIB + 12345;
        for level in [33, 50, 125, 150] {
            let d = be_demand(level, node, split);
            assert_eq!(d.file_bytes % MIB, 0);
            assert_eq!(d.anon_bytes % MIB, 0);
            assert_eq!(d.elastic_bytes % MIB, 0);
            assert!(d.total_bytes() as u128 <= node as u128 * level as u128 / 100);
        }
    }

    #[test]
    fn split_parsing() {
        assert_eq!(
            "3:1".parse::<BeSplit>().unwrap(),
            BeSplit {
                file_parts: 3,
                anon_parts: 1,
                elastic_parts: 0
            }
        );
        assert_eq!("2:1:1".parse::<BeSplit>().unwrap().to_string(), "2:1:1");
        for bad in ["", "2", "0:0", "0:0:0", "a:1", "1:-1", "1:2:3:4"] {
            assert!(bad.parse::<BeSplit>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn stress_ng_yaml_metrics() {
        let text = "---\nsystem-info:\n      uptime: 306\n\nmetrics:\n    - stressor: vm\n      bogo-ops: 25856\n      wall-clock-time: 2.004945\n      user-time: 0.742108\n...\n";
        let (ops, wall) = parse_stress_ng_yaml(text).unwrap();
        assert_eq!(ops, 25856.0);
        assert!((wall - 2.004945).abs() < 1e-9);
        assert_eq!(parse_stress_ng_yaml("---\nsystem-info:\n"), None);
    }
}
