//! BE progress of a colocation run, per job and as *weighted speedup*.
//!
//! The field measures the progress of colocated batch jobs against each job running
//! alone (Snavely & Tullsen, "Symbiotic Jobscheduling for a Simultaneous
//! Multithreading Processor", ASPLOS'00: weighted speedup = Σ over jobs of the rate
//! reached together / the job's rate alone). Here, for each BE job `j` of a run at
//! pressure level `L`:
//!
//! - `rate_j`: the streamer's MiB read per minute (`rchar`, page-cache hits included)
//!   in the measured phase; the anonymous holder's stress-ng bogo ops per minute over
//!   its run (warm-up + measured phase: stress-ng reports only when it exits);
//! - `solo_j(L)`: the same job with the same demand (level `L`'s share), the same CPUs
//!   (the BE CPUs), the same warm-up and measured phase, alone in the node with its
//!   limit raised above the job's demand: no LC service, no other BE job, no memory
//!   pressure ([`SoloRecord`], `solo.csv`);
//! - progress `p_j = rate_j / solo_j(L)` (1.0 = as fast as alone);
//! - weighted speedup `WS = Σ_j p_j` over the run's BE jobs (0..=2 with two jobs;
//!   about 1 when they split one CPU evenly).
//!
//! These solo figures are optional (`--solo`): the report's BE progress compares each
//! job's rate with the kernel alone's at the same level (`bench/colocation/report.py`),
//! which needs no solo runs.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};
use crate::report::RunRecord;

/// A BE job of the colocation bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BeJob {
    /// The page-cache streamer (fio); rate in MiB read per minute.
    File,
    /// The anonymous-memory holder (stress-ng vm); rate in bogo ops per minute.
    Anon,
}

impl BeJob {
    /// The job's name in results.
    pub fn as_str(self) -> &'static str {
        match self {
            BeJob::File => "file",
            BeJob::Anon => "anon",
        }
    }
}

/// What makes a solo run reusable for another invocation: the job, its demand, the
/// phases and the CPUs it ran on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoloKey {
    pub job: BeJob,
    /// The job's share of the level's BE demand, bytes.
    pub demand_bytes: u64,
    pub warmup_s: u64,
    pub duration_s: u64,
    /// The BE CPUs, e.g. `1` or `1-3`; `all` when not pinned.
    pub be_cpus: String,
}

/// One solo run: a BE job alone on the BE CPUs without memory pressure (a row of
/// `solo.csv`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SoloRecord {
    pub job: BeJob,
    /// The pressure level whose demand this is (informative; the key is the demand).
    pub level_pct: u32,
    pub demand_bytes: u64,
    pub warmup_s: u64,
    pub duration_s: u64,
    pub be_cpus: String,
    /// `ok`, or why the run failed.
    pub status: String,
    /// The node's limit during the run (above the demand), bytes.
    pub limit_bytes: u64,
    /// MiB read per minute (file) or bogo ops per minute (anon).
    pub rate_per_min: Option<f64>,
    /// The streamer's page-cache hit ratio (1 − read_bytes / rchar).
    pub file_hit_ratio: Option<f64>,
    /// CPU seconds of the job in the measured phase.
    pub cpu_s: f64,
    /// Peak node usage in the measured phase, bytes.
    pub node_usage_max_bytes: u64,
    /// Charges that found the node at its limit in the measured phase (0 = no
    /// pressure, as intended).
    pub node_limit_hits: u64,
    /// Machine noise gauges over the measured phase.
    pub loadavg_1m: f64,
    pub cpu_busy_pct: f64,
}

impl SoloRecord {
    /// The record's reuse key.
    pub fn key(&self) -> SoloKey {
        SoloKey {
            job: self.job,
            demand_bytes: self.demand_bytes,
            warmup_s: self.warmup_s,
            duration_s: self.duration_s,
            be_cpus: self.be_cpus.clone(),
        }
    }
}

/// The successful solo rates for `key` in `records`, per minute, in file order.
pub fn solo_rates(records: &[SoloRecord], key: &SoloKey) -> Vec<f64> {
    records
        .iter()
        .filter(|r| r.status == "ok" && r.key() == *key)
        .filter_map(|r| r.rate_per_min.filter(|v| *v > 0.0))
        .collect()
}

/// The solo rate for `key`: the median of its successful solo runs, per minute.
pub fn solo_rate(records: &[SoloRecord], key: &SoloKey) -> Option<f64> {
    median(solo_rates(records, key))
}

/// Reads `solo.csv`; a missing file is no records.
pub fn read_solo_csv(path: &Path) -> Result<Vec<SoloRecord>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(BenchError::io(path, e)),
    };
    let mut r = csv::Reader::from_reader(text.as_bytes());
    r.deserialize()
        .collect::<std::result::Result<Vec<SoloRecord>, _>>()
        .map_err(|e| BenchError::Parse {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })
}

/// Writes `records` as `solo.csv` (all of them: earlier rows are kept by the caller).
pub fn write_solo_csv(path: &Path, records: &[SoloRecord]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in records {
        w.serialize(r)
            .map_err(|e| BenchError::Invalid(format!("csv: {e}")))?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| BenchError::Invalid(format!("csv: {e}")))?;
    std::fs::write(path, bytes).map_err(|e| BenchError::io(path, e))
}

/// Fills the solo and progress columns of a run: `file_solo` / `anon_solo` are the
/// solo rates of the jobs the run had (`None` for a job it had but whose solo rate is
/// unknown). The weighted speedup is set only when every job of the run has a
/// progress figure.
pub fn fill_progress(
    r: &mut RunRecord,
    has_file: bool,
    has_anon: bool,
    file_solo: Option<f64>,
    anon_solo: Option<f64>,
) {
    r.be_file_solo_mib_per_min = file_solo.filter(|_| has_file);
    r.be_anon_solo_ops_per_min = anon_solo.filter(|_| has_anon);
    r.be_file_progress = r
        .be_file_solo_mib_per_min
        .map(|s| r.be_file_mib_per_min / s);
    r.be_anon_progress = match (r.be_anon_solo_ops_per_min, r.be_anon_ops_per_min) {
        (Some(s), Some(v)) => Some(v / s),
        _ => None,
    };
    let parts = [
        (has_file, r.be_file_progress),
        (has_anon, r.be_anon_progress),
    ];
    r.be_weighted_speedup = if !has_file && !has_anon {
        None
    } else {
        parts
            .iter()
            .filter(|(has, _)| *has)
            .map(|(_, p)| *p)
            .sum::<Option<f64>>()
    };
}

/// The median of `v`; `None` when empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn solo(job: BeJob, demand: u64, status: &str, rate: Option<f64>) -> SoloRecord {
        SoloRecord {
            job,
            level_pct: 100,
            demand_bytes: demand,
            warmup_s: 4,
            duration_s: 15,
            be_cpus: "1".into(),
            status: status.into(),
            limit_bytes: 0,
            rate_per_min: rate,
            file_hit_ratio: None,
            cpu_s: 0.0,
            node_usage_max_bytes: 0,
            node_limit_hits: 0,
            loadavg_1m: 0.0,
            cpu_busy_pct: 0.0,
        }
    }

    #[test]
    fn solo_rate_matches_the_whole_key_and_takes_the_median_of_successes() {
        let rs = vec![
            solo(BeJob::File, 100, "ok", Some(10.0)),
            solo(BeJob::File, 100, "ok", Some(12.0)),
            solo(BeJob::File, 100, "failed: x", Some(99.0)),
            solo(BeJob::Anon, 100, "ok", Some(5.0)),
        ];
        let mut key = rs[0].key();
        assert_eq!(solo_rates(&rs, &key), vec![10.0, 12.0]);
        assert_eq!(solo_rate(&rs, &key), Some(11.0));
        key.job = BeJob::Anon;
        assert_eq!(solo_rate(&rs, &key), Some(5.0));
        key.duration_s = 30;
        assert_eq!(solo_rate(&rs, &key), None);
        let mut key = rs[0].key();
        key.demand_bytes = 200;
        assert_eq!(solo_rate(&rs, &key), None);
        key.demand_bytes = 100;
        key.be_cpus = "1-3".into();
        assert_eq!(solo_rate(&rs, &key), None);
    }

    #[test]
    fn solo_csv_round_trips_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("solo.csv");
        assert!(read_solo_csv(&p).unwrap().is_empty());
        let rs = vec![
            solo(BeJob::File, 100, "ok", Some(10.5)),
            solo(BeJob::Anon, 50, "failed: stress-ng", None),
        ];
        write_solo_csv(&p, &rs).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.starts_with("job,level_pct,demand_bytes,"), "{text}");
        assert!(text.contains("\nfile,100,100,"), "{text}");
        assert_eq!(read_solo_csv(&p).unwrap(), rs);
        std::fs::write(&p, "job\nnot-a-job\n").unwrap();
        assert!(read_solo_csv(&p).is_err());
    }

    fn run(level: u32, mode: &str, file: f64, anon: Option<f64>) -> RunRecord {
        RunRecord {
            level_pct: level,
            mode: mode.into(),
            status: "ok".into(),
            be_file_mib_per_min: file,
            be_anon_ops_per_min: anon,
            ..Default::default()
        }
    }

    #[test]
    fn weighted_speedup_sums_the_jobs_of_the_run() {
        let mut r = run(100, "kernel", 300.0, Some(50.0));
        fill_progress(&mut r, true, true, Some(600.0), Some(100.0));
        assert_eq!(r.be_file_progress, Some(0.5));
        assert_eq!(r.be_anon_progress, Some(0.5));
        assert_eq!(r.be_weighted_speedup, Some(1.0));
        // A job without a solo rate leaves the aggregate unknown, not smaller.
        let mut r = run(100, "kernel", 300.0, Some(50.0));
        fill_progress(&mut r, true, true, Some(600.0), None);
        assert_eq!(r.be_file_progress, Some(0.5));
        assert_eq!(r.be_weighted_speedup, None);
        // stress-ng did not report: no anon progress, no aggregate.
        let mut r = run(100, "kernel", 300.0, None);
        fill_progress(&mut r, true, true, Some(600.0), Some(100.0));
        assert_eq!(r.be_anon_progress, None);
        assert_eq!(r.be_weighted_speedup, None);
        // Only a streamer: the aggregate is its progress.
        let mut r = run(100, "kernel", 300.0, None);
        fill_progress(&mut r, true, false, Some(600.0), Some(100.0));
        assert_eq!(r.be_anon_solo_ops_per_min, None);
        assert_eq!(r.be_weighted_speedup, Some(0.5));
        // Level 0: no BE job, nothing to weigh.
        let mut r = run(0, "kernel", 0.0, None);
        fill_progress(&mut r, false, false, Some(600.0), Some(100.0));
        assert_eq!(r.be_weighted_speedup, None);
        assert_eq!(r.be_file_progress, None);
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }
}
