//! Solo baselines (`--solo`): each BE job alone on the BE CPUs without memory
//! pressure, the denominators of BE progress against running alone (Snavely &
//! Tullsen's weighted speedup, [`crate::progress`]). The report's BE progress against
//! the kernel alone needs none of them.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use super::run::{summarize_be, BeProcSample};
use super::{Settings, Sweep};
use crate::be::{be_demand, BeDemand, BeJobs, BeStart};
use crate::cgroup::{read_procs, ScratchNode};
use crate::error::Result;
use crate::harness;
use crate::process;
use crate::progress::{self, BeJob, SoloKey, SoloRecord};
use crate::report::RunOutcome;
use crate::size::format_bytes;

/// The BE CPUs as a solo key names them: `1`, `1-3`, `1,3`; `all` when not pinned.
fn cpus_label(cpus: &Option<Vec<usize>>) -> String {
    let Some(c) = cpus else {
        return "all".into();
    };
    let contiguous = c.windows(2).all(|w| w[1] == w[0] + 1);
    match (c.first(), c.last()) {
        (Some(a), Some(b)) if a == b => a.to_string(),
        (Some(a), Some(b)) if contiguous => format!("{a}-{b}"),
        _ => c
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// The demand of one BE job at `level`: its share of the level's demand, the other
/// job's share zero.
fn job_demand(level: u32, s: &Settings, job: BeJob) -> BeDemand {
    let d = be_demand(level, s.node_bytes, s.split);
    match job {
        BeJob::File => BeDemand {
            file_bytes: d.file_bytes,
            ..Default::default()
        },
        BeJob::Anon => BeDemand {
            anon_bytes: d.anon_bytes,
            ..Default::default()
        },
    }
}

/// The solo key of `job` at `level` in this sweep.
fn solo_key(s: &Settings, be_cpus: &Option<Vec<usize>>, level: u32, job: BeJob) -> SoloKey {
    SoloKey {
        job,
        demand_bytes: job_demand(level, s, job).total_bytes(),
        warmup_s: s.warmup.as_secs(),
        duration_s: s.duration.as_secs(),
        be_cpus: cpus_label(be_cpus),
    }
}

/// The solo rate of `job` at `level` from `solo`, per minute.
fn solo_rate_for(
    solo: &[SoloRecord],
    s: &Settings,
    be_cpus: &Option<Vec<usize>>,
    level: u32,
    job: BeJob,
) -> Option<f64> {
    progress::solo_rate(solo, &solo_key(s, be_cpus, level, job))
}

/// Puts the node back after a solo run: removes `be/`, drops the page cache left
/// charged to the node and restores the node's limit.
struct SoloGroup<'a> {
    node: &'a mut ScratchNode,
    limit_bytes: u64,
}

impl Drop for SoloGroup<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.node.remove_child("be") {
            eprintln!("warning: {e}");
        }
        if let Err(e) = self.node.force_empty() {
            eprintln!("warning: {e}");
        }
        if let Err(e) = self.node.set_limit(self.limit_bytes) {
            eprintln!("warning: cannot restore the node's limit: {e}");
        }
    }
}

impl Sweep<'_> {
    /// Fills the solo-based progress columns of a run from `solo`.
    pub(super) fn fill_solo_progress(&self, o: &mut RunOutcome, solo: &[SoloRecord]) {
        let s = self.s;
        let level = o.record.level_pct;
        let d = be_demand(level, s.node_bytes, s.split);
        let rate = |job| solo_rate_for(solo, s, &self.be_cpus, level, job);
        progress::fill_progress(
            &mut o.record,
            d.file_bytes > 0,
            d.anon_bytes > 0,
            rate(BeJob::File),
            rate(BeJob::Anon),
        );
    }

    /// Runs the solo baselines of every BE job of every level of the sweep until each
    /// has `--solo-repeats` successful runs in `solo` (one attempt per missing run;
    /// repetitions interleaved over the levels and jobs), appending each to `solo` and
    /// rewriting `path` after each run (so an interrupted sweep keeps what it measured).
    pub(super) fn solo_baselines(&mut self, solo: &mut Vec<SoloRecord>, path: &Path) -> Result<()> {
        let s = self.s;
        let want = self.args.solo_repeats as usize;
        let mut todo: Vec<(u32, BeJob, SoloKey, usize)> = Vec::new();
        for &level in &s.levels {
            for job in [BeJob::File, BeJob::Anon] {
                let key = solo_key(s, &self.be_cpus, level, job);
                let have = progress::solo_rates(solo, &key).len();
                if key.demand_bytes > 0 && have < want {
                    todo.push((level, job, key, want - have));
                }
            }
        }
        for round in 0..want {
            for (level, job, key, missing) in &todo {
                if round >= *missing {
                    continue;
                }
                let rec = self.run_solo(*level, *job, key)?;
                harness::progress(
                    self.t0,
                    &format!(
                        "solo {level}% {}: {} {}/min{}, {:.1} CPU s",
                        job.as_str(),
                        rec.rate_per_min
                            .map(|r| format!("{r:.0}"))
                            .unwrap_or_else(|| "-".into()),
                        match job {
                            BeJob::File => "MiB",
                            BeJob::Anon => "ops",
                        },
                        rec.file_hit_ratio
                            .map(|h| format!(", {:.0} % page-cache hits", h * 100.0))
                            .unwrap_or_default(),
                        rec.cpu_s
                    ),
                );
                solo.push(rec);
                progress::write_solo_csv(path, solo)?;
            }
        }
        Ok(())
    }

    /// One BE job alone in `be/` on the BE CPUs, the node's limit raised above the
    /// job's demand (no memory pressure), with the phases of a colocated run: the
    /// job starts, 300 ms, the warm-up, the measured phase sampled every 250 ms.
    fn run_solo(&mut self, level: u32, job: BeJob, key: &SoloKey) -> Result<SoloRecord> {
        let s = self.s;
        let tag = format!("solo-{level}-{}", job.as_str());
        crate::signal::check()?;
        let demand = job_demand(level, s, job);
        let limit = s.node_bytes.max(demand.total_bytes() + (512 << 20));
        harness::progress(
            self.t0,
            &format!(
                "{tag}: {} alone, node limit {}",
                format_bytes(demand.total_bytes()),
                format_bytes(limit)
            ),
        );
        self.node.set_limit(limit)?;
        let be = match self.node.create_child("be") {
            Ok(b) => b,
            Err(e) => {
                let _ = self.node.set_limit(s.node_bytes);
                return Err(e);
            }
        };
        let group = SoloGroup {
            node: &mut self.node,
            limit_bytes: s.node_bytes,
        };
        let mut jobs = BeJobs::start(&BeStart {
            demand,
            data_file: &self.data_file,
            run_for: s.warmup + s.duration + Duration::from_secs(30),
            place: Self::place(&be, &self.be_cpus, None),
            log_dir: &self.log_dir,
            tag: &tag,
            elastic_exe: None,
            agent_socket: None,
        })?;
        crate::signal::sleep(Duration::from_millis(300) + s.warmup)?;
        let hits0 = group.node.limit_hits()?;
        let loadavg = process::loadavg_1m().unwrap_or(0.0);
        let cpu_before = process::read_cpu_times();
        let mut procs: HashMap<i32, (BeProcSample, BeProcSample)> = HashMap::new();
        let mut usage_max = 0u64;
        let start = Instant::now();
        loop {
            if let Ok(u) = group.node.usage_bytes() {
                usage_max = usage_max.max(u);
            }
            for pid in read_procs(&be).unwrap_or_default() {
                if let Some(r) = BeProcSample::read(pid) {
                    procs.entry(pid).or_insert((r, r)).1 = r;
                }
            }
            if start.elapsed() >= s.duration {
                break;
            }
            crate::signal::sleep(Duration::from_millis(250).min(s.duration - start.elapsed()))?;
        }
        let hits = group.node.limit_hits()?.saturating_sub(hits0);
        let cpu_busy_pct = match (cpu_before, process::read_cpu_times()) {
            (Some(a), Some(b)) if b.total > a.total => {
                (1.0 - (b.idle - a.idle) as f64 / (b.total - a.total) as f64) * 100.0
            }
            _ => 0.0,
        };
        let work = jobs.stop(Duration::ZERO)?;
        drop(group);
        let be_work = summarize_be(&procs);
        let measured_s = s.duration.as_secs_f64();
        let (rate, hit_ratio, cpu_s) = match job {
            BeJob::File => (
                (be_work.file_read > 0)
                    .then(|| be_work.file_read as f64 / (1u64 << 20) as f64 / measured_s * 60.0),
                (be_work.file_read > 0).then(|| {
                    1.0 - (be_work.file_fetched as f64 / be_work.file_read as f64).min(1.0)
                }),
                be_work.file_cpu_s,
            ),
            BeJob::Anon => (work.anon_ops_per_min, None, be_work.anon_cpu_s),
        };
        Ok(SoloRecord {
            job,
            level_pct: level,
            demand_bytes: key.demand_bytes,
            warmup_s: key.warmup_s,
            duration_s: key.duration_s,
            be_cpus: key.be_cpus.clone(),
            status: if rate.is_some() {
                "ok".into()
            } else {
                format!("failed: no {} rate", job.as_str())
            },
            limit_bytes: limit,
            rate_per_min: rate,
            file_hit_ratio: hit_ratio,
            cpu_s,
            node_usage_max_bytes: usage_max,
            node_limit_hits: hits,
            loadavg_1m: loadavg,
            cpu_busy_pct,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::colocation::tests::parse;

    #[test]
    fn solo_keys_name_the_cpus_and_one_job_s_demand() {
        assert_eq!(cpus_label(&None), "all");
        assert_eq!(cpus_label(&Some(vec![1])), "1");
        assert_eq!(cpus_label(&Some(vec![1, 2, 3])), "1-3");
        assert_eq!(cpus_label(&Some(vec![1, 3])), "1,3");
        let s = Settings::resolve(&parse(&[
            "--quick",
            "--duration-s",
            "15",
            "--be-split",
            "2:1",
        ]))
        .unwrap();
        let k = solo_key(&s, &Some(vec![1]), 150, BeJob::File);
        // 150 % of 2 GiB split 2:1: the streamer's 2 GiB.
        assert_eq!(k.demand_bytes, 2 << 30);
        assert_eq!((k.warmup_s, k.duration_s, k.be_cpus.as_str()), (4, 15, "1"));
        assert_eq!(solo_key(&s, &None, 150, BeJob::Anon).demand_bytes, 1 << 30);
        assert_eq!(solo_key(&s, &None, 0, BeJob::Anon).demand_bytes, 0);
    }
}
