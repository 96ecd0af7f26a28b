//! `memcolo bench colocation`, memcolo's main job: an LC service (Redis or memcached)
//! beside real batch jobs (BE) and an elastic cache in a scratch memory-cgroup node, at
//! the memory pressure levels of Hermes §5.1, under the kernel alone, peers'
//! controllers (re-implemented, [`crate::peers`]), each of memcolo's mechanisms alone
//! and the whole of memcolo; with repeats, run rejection on a noisy machine, and a
//! report of medians and spreads.
//!
//! Every run starts from the same state: fresh `lc/` and `be/` groups, a fresh LC
//! service preloaded with the dataset, no page cache charged to the node. Phases:
//! start (agent or peer, service, preload, BE jobs), warm-up (BE jobs fill their
//! demand, the load runs and is discarded), measured phase (open-loop load recorded;
//! node usage, swap, BE work, the service's faults and the LC CPUs' noise sampled every
//! 250 ms), teardown. Runs are interleaved over repeats ([`plan`]); a run whose LC
//! CPUs were disturbed is run again. See `bench/colocation/README.md` for the method
//! and [`results`] for the outputs.

pub mod args;
pub mod plan;
mod results;
mod run;
mod solo;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};

pub use args::{ColocationArgs, Mode, ModeKind, Settings, DEFAULT_MODES};

use crate::be::{be_demand, ensure_data_file};
use crate::cgroup::{PsiGroups, ScratchNode};
use crate::dataset::value_pool;
use crate::error::BenchError;
use crate::harness::{format_duration_s, progress, which};
use crate::lc::LcKind;
use crate::process::{self, ChildPlacement};
use crate::progress::SoloRecord;
use crate::report::RunOutcome;
use crate::size::format_bytes;
use crate::zram::ZramSwap;
use plan::{interleaved, least_disturbed, Disturbance, Eta, RejectPolicy};

/// Shared state of a sweep.
pub(crate) struct Sweep<'a> {
    s: &'a Settings,
    args: &'a ColocationArgs,
    exe: &'a Path,
    rt: tokio::runtime::Runtime,
    node: ScratchNode,
    /// cgroup2 groups `lc` and `be` for PSI (`None` without cgroup2).
    psi: Option<PsiGroups>,
    zram: Option<ZramSwap>,
    data_file: PathBuf,
    work_dir: PathBuf,
    log_dir: PathBuf,
    lc_cpus: Option<Vec<usize>>,
    be_cpus: Option<Vec<usize>>,
    pool: Arc<Vec<u8>>,
    /// libmemcolo, for the modes that run the LC service under it.
    libmemcolo: Option<PathBuf>,
    /// The elastic cache's binary, when the split has an elastic share.
    elastic_exe: Option<PathBuf>,
    t0: Instant,
}

/// Runs the sweep described by `args`; `memcolo_exe` is the `memcolo` binary that
/// provides `memcolo agent` and `memcolo run`. Needs root, cgroup v1 memory, the LC
/// service, fio, stress-ng, and for some modes libmemcolo, the elastic cache and
/// cgroup2 (PSI). Everything it creates is removed on every exit path (Ctrl-C
/// included), except the results (and the data file with `--keep-data`).
pub fn run(args: &ColocationArgs, memcolo_exe: &Path) -> anyhow::Result<()> {
    if args.batch {
        bail!("--batch is an experiment of `memcolo bench reclaim`");
    }
    let s = Settings::resolve(args)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("memcolo bench colocation needs root (cgroups, zram swap)");
    }
    let lc_exe = match args.lc {
        LcKind::Redis => &args.redis_server,
        LcKind::Memcached => &args.memcached,
    };
    let mut tools: Vec<&Path> = vec![lc_exe, Path::new("dd")];
    if s.split.file_parts > 0 {
        tools.push(Path::new("fio"));
    }
    if s.split.anon_parts > 0 {
        tools.push(Path::new("stress-ng"));
    }
    if s.modes.iter().any(|m| m.uses_agent()) {
        tools.push(memcolo_exe);
    }
    for t in tools {
        which(t).with_context(|| format!("{} is needed", t.display()))?;
    }
    let libmemcolo = if s.modes.iter().any(|m| m.lc_under_libmemcolo()) {
        Some(find_beside(memcolo_exe, args.libmemcolo.as_deref(), &["../lib/libmemcolo.so"], "alloc/build/libmemcolo.so")
            .context("libmemcolo is needed by the alloc and full modes (build it with `make -C alloc`, or pass --libmemcolo)")?)
    } else {
        None
    };
    let elastic_exe = if s.split.elastic_parts > 0 {
        Some(find_beside(memcolo_exe, args.elastic_cache.as_deref(), &["memcolo-gocache"], "target/release/memcolo-gocache")
            .context("the elastic cache job is needed by a split with an elastic share (scripts/setup.sh builds it; or pass --elastic-cache, or --be-split 2:1)")?)
    } else {
        None
    };
    let _stop = crate::signal::StopGuard::install()?;
    let t0 = Instant::now();
    let (log_dir, work) = crate::harness::prepare_out(&s.out, "memcolo-bench-")?;

    let slots = interleaved(&s.levels, &s.modes, s.repeats);
    let mut eta = Eta::new(plan::prior_run_time(s.warmup, s.duration));
    let solo_runs = if args.solo {
        s.levels.iter().filter(|&&l| l > 0).count() * 2 * args.solo_repeats as usize
    } else {
        0
    };
    progress(
        t0,
        &format!(
            "{} runs ({} levels × {} modes × {} repeats){}; estimated {} (more if runs are rejected)",
            slots.len(),
            s.levels.len(),
            s.modes.len(),
            s.repeats,
            if solo_runs > 0 {
                format!(" after up to {solo_runs} solo baselines")
            } else {
                String::new()
            },
            format_duration_s(eta.left_s(slots.len() + solo_runs))
        ),
    );

    // zram first, so that it is torn down last (after every process is gone).
    let zram = if args.no_zram {
        eprintln!("warning: --no-zram: anonymous BE memory cannot be swapped out");
        None
    } else {
        match ZramSwap::setup("zram0", args.zram_size, 100)? {
            Ok(z) => {
                progress(
                    t0,
                    &format!("zram swap on /dev/zram0 ({})", format_bytes(args.zram_size)),
                );
                Some(z)
            }
            Err(why) => {
                eprintln!("warning: no zram swap: {why}");
                None
            }
        }
    };
    let mut node = ScratchNode::create_below_self("memcolo-bench", s.node_bytes)?;
    progress(
        t0,
        &format!(
            "node {} with limit {}",
            node.path().display(),
            format_bytes(s.node_bytes)
        ),
    );
    let psi = match PsiGroups::create_below_self("memcolo-bench", &["lc", "be"]) {
        Ok(g) => Some(g),
        Err(e) if s.modes.contains(&Mode::Senpai) => {
            return Err(anyhow::Error::new(e).context("the senpai mode needs cgroup2 PSI"))
        }
        Err(e) => {
            eprintln!("warning: no PSI of the LC and BE groups: {e}");
            None
        }
    };

    let max_file = s
        .levels
        .iter()
        .map(|&l| be_demand(l, s.node_bytes, s.split).file_bytes)
        .max()
        .unwrap_or(0);
    let data_dir_existed = args.data_dir.exists();
    let data_file = {
        let prep = node.create_child("prep")?;
        let (p, written) = ensure_data_file(
            &args.data_dir,
            max_file.max(1 << 20),
            &ChildPlacement {
                cgroup: Some(&prep),
                ..Default::default()
            },
        )?;
        node.remove_child("prep")?;
        progress(
            t0,
            &format!(
                "data file {} ({}{})",
                p.display(),
                format_bytes(std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0)),
                if written { ", written" } else { ", reused" }
            ),
        );
        p
    };
    let _data_guard = RemoveOnDrop {
        file: (!args.keep_data).then(|| data_file.clone()),
        dir: (!args.keep_data && !data_dir_existed).then(|| args.data_dir.clone()),
    };

    let cpus = process::online_cpus();
    let (lc_cpus, be_cpus) = if !args.no_pin && cpus >= 2 {
        (Some(vec![0]), Some((1..cpus).collect::<Vec<_>>()))
    } else {
        (None, None)
    };
    // The load generator is the LC service's client: it runs on the LC CPUs, so that a
    // request and its answer do not cross to a BE CPU (and, in a VM, do not wait for a
    // halted vCPU to be woken). Threads created from here on inherit the mask.
    let _affinity = match &lc_cpus {
        Some(c) => Some(process::AffinityGuard::pin_current_thread(c)?),
        None => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let mut sweep = Sweep {
        s: &s,
        args,
        exe: memcolo_exe,
        rt,
        node,
        psi,
        zram,
        data_file,
        work_dir: work.path().to_path_buf(),
        log_dir,
        lc_cpus,
        be_cpus,
        pool: Arc::new(value_pool(s.value_bytes, 0x5eed)),
        libmemcolo,
        elastic_exe,
        t0,
    };

    let solo_path = args
        .solo_csv
        .clone()
        .unwrap_or_else(|| s.out.join("solo.csv"));
    let mut solo: Vec<SoloRecord> = crate::progress::read_solo_csv(&solo_path)?;
    let mut failure: Option<anyhow::Error> = None;
    if args.solo || args.solo_only {
        if let Err(e) = sweep.solo_baselines(&mut solo, &solo_path) {
            match e {
                BenchError::Interrupted => failure = Some(anyhow::anyhow!("interrupted")),
                e if !args.keep_going => failure = Some(anyhow::Error::new(e)),
                e => progress(t0, &format!("solo baselines: FAILED: {e}")),
            }
        }
    }

    let policy = RejectPolicy {
        foreign_pct_max: s.reject_foreign_pct,
        steal_pct_max: s.reject_steal_pct,
        max_attempts: s.max_attempts,
    };
    let mut outcomes: Vec<RunOutcome> = Vec::new();
    let slots: &[plan::Slot] = if failure.is_none() && !args.solo_only {
        &slots
    } else {
        &[]
    };
    'sweep: for (i, slot) in slots.iter().enumerate() {
        let label = format!(
            "[{}/{}] {}% {} #{}",
            i + 1,
            slots.len(),
            slot.level,
            slot.mode.as_str(),
            slot.rep
        );
        let mut attempts: Vec<RunOutcome> = Vec::new();
        for attempt in 1..=s.max_attempts {
            let started = Instant::now();
            match sweep.run_one(slot, attempt) {
                Ok(mut o) => {
                    eta.record(started.elapsed());
                    sweep.fill_solo_progress(&mut o, &solo);
                    let d = disturbance(&o);
                    let verdict = policy.verdict(&d);
                    progress(
                        t0,
                        &format!(
                            "{label}: p50 {} µs, p99 {} µs, {:.0} req/s, node util {:.1} %{}",
                            o.record.p50_us,
                            o.record.p99_us,
                            o.record.throughput_rps,
                            o.record.node_util * 100.0,
                            match &verdict {
                                Some(why) => format!("; REJECTED (attempt {attempt}): {why}"),
                                None => String::new(),
                            }
                        ),
                    );
                    o.record.reject_reason = verdict.clone().unwrap_or_default();
                    let done = verdict.is_none();
                    attempts.push(o);
                    if done {
                        break;
                    }
                }
                Err(BenchError::Interrupted) => {
                    progress(t0, &format!("{label}: interrupted; cleaning up"));
                    failure = Some(anyhow::anyhow!("interrupted"));
                    outcomes.append(&mut attempts);
                    break 'sweep;
                }
                Err(e) => {
                    eta.record(started.elapsed());
                    progress(t0, &format!("{label}: FAILED: {e}"));
                    outcomes.append(&mut attempts);
                    outcomes.push(RunOutcome::failed(
                        slot.level,
                        slot.mode.as_str(),
                        slot.rep,
                        attempt,
                        s.node_bytes,
                        &e,
                    ));
                    if !args.keep_going {
                        failure = Some(anyhow::Error::new(e).context(format!("run {label}")));
                        break 'sweep;
                    }
                    break;
                }
            }
        }
        settle_attempts(&mut attempts, &policy);
        outcomes.append(&mut attempts);
        let left = slots.len() - i - 1;
        if left > 0 {
            progress(
                t0,
                &format!(
                    "{left} runs left, about {} (ETA {})",
                    format_duration_s(eta.left_s(left)),
                    (chrono::Local::now() + chrono::Duration::seconds(eta.left_s(left) as i64))
                        .format("%H:%M")
                ),
            );
        }
    }

    // Results first (also partial ones), then the teardown by Drop. A solo-only
    // invocation leaves the directory's runs and report as they were.
    let written = if args.solo_only {
        progress(t0, &format!("solo baselines in {}", solo_path.display()));
        Ok(())
    } else {
        results::write(&sweep, &mut outcomes)
    };
    drop(sweep);
    drop(work);
    progress(
        t0,
        "cleaned up (processes, cgroups, zram, data file unless --keep-data)",
    );
    written?;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// How disturbed a run's LC CPUs were.
fn disturbance(o: &RunOutcome) -> Disturbance {
    Disturbance {
        foreign_pct: o.record.lc_cpus_foreign_pct,
        steal_pct: o.record.lc_cpus_steal_pct,
    }
}

/// Marks the attempts of one run: the last is accepted if it passed; if every one was
/// rejected, the least disturbed is kept (accepted, marked `disturbed`).
fn settle_attempts(attempts: &mut [RunOutcome], policy: &RejectPolicy) {
    if attempts.is_empty() {
        return;
    }
    if attempts
        .last()
        .is_some_and(|o| o.record.reject_reason.is_empty() && o.record.status == "ok")
    {
        attempts.last_mut().expect("non-empty").record.accepted = true;
        return;
    }
    let d: Vec<Disturbance> = attempts.iter().map(disturbance).collect();
    if let Some(i) = least_disturbed(&d, policy) {
        let n = attempts.len();
        let r = &mut attempts[i].record;
        if r.status == "ok" {
            r.accepted = true;
            r.disturbed = true;
            r.reject_reason = format!(
                "kept: least disturbed of {n} attempts ({})",
                r.reject_reason
            );
        }
    }
}

/// `given` if set; else the first of `beside` (relative to the directory of `exe`)
/// that exists; else `fallback` (relative to the current directory) if it exists.
fn find_beside(
    exe: &Path,
    given: Option<&Path>,
    beside: &[&str],
    fallback: &str,
) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        which(p)?;
        return Ok(p.canonicalize().unwrap_or_else(|_| p.to_path_buf()));
    }
    let exe = exe.canonicalize().unwrap_or_else(|_| exe.to_path_buf());
    let dir = exe.parent().unwrap_or(Path::new("."));
    for b in beside {
        let p = dir.join(b);
        if p.is_file() {
            return Ok(p.canonicalize().unwrap_or(p));
        }
    }
    let p = Path::new(fallback);
    if p.is_file() {
        return Ok(p.canonicalize().unwrap_or_else(|_| p.to_path_buf()));
    }
    bail!(
        "not found next to {} ({}) nor at {fallback}",
        exe.display(),
        beside.join(", ")
    )
}

/// Removes the data file (and the directory the bench created for it) when dropped.
struct RemoveOnDrop {
    file: Option<PathBuf>,
    dir: Option<PathBuf>,
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = &self.file {
            let _ = std::fs::remove_file(p);
        }
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::RunRecord;
    use clap::Parser;
    use std::time::Duration;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: ColocationArgs,
    }

    /// Parses `argv` (without the program name) as `memcolo bench colocation|reclaim`
    /// arguments; shared with the batch experiment's tests.
    pub(crate) fn parse(argv: &[&str]) -> ColocationArgs {
        Cli::try_parse_from(std::iter::once("x").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn defaults_and_quick() {
        let full = Settings::resolve(&parse(&[])).unwrap();
        assert_eq!(full.levels, vec![0, 50, 75, 100, 125, 150]);
        assert_eq!(full.modes, DEFAULT_MODES.to_vec());
        assert_eq!((full.repeats, full.max_attempts), (3, 3));
        assert_eq!(full.node_bytes, 4 << 30);
        assert_eq!(full.duration, Duration::from_secs(30));
        let quick = Settings::resolve(&parse(&["--quick"])).unwrap();
        assert_eq!(quick.node_bytes, 2 << 30);
        assert_eq!(quick.duration, Duration::from_secs(6));
        assert_eq!(quick.repeats, 2);
        assert_eq!(quick.levels, vec![0, 50, 100, 125, 150]);
        // Explicit options win over --quick.
        let q = Settings::resolve(&parse(&[
            "--quick",
            "--node-mem",
            "3GiB",
            "--rate",
            "500",
            "--repeats",
            "5",
        ]))
        .unwrap();
        assert_eq!(q.node_bytes, 3 << 30);
        assert_eq!(q.rate_per_s, 500.0);
        assert_eq!(q.repeats, 5);
        let m = Settings::resolve(&parse(&[
            "--modes",
            "kernel,senpai,koordinator,full",
            "--levels",
            "0,100",
        ]))
        .unwrap();
        assert_eq!(
            m.modes,
            vec![Mode::Kernel, Mode::Senpai, Mode::Koordinator, Mode::Full]
        );
        assert_eq!(m.levels, vec![0, 100]);
    }

    #[test]
    fn every_mode_has_a_name_kind_label_and_settings() {
        let mut names = std::collections::HashSet::new();
        for m in Mode::ALL {
            assert!(names.insert(m.as_str()), "{m:?} name twice");
            assert!(!m.label().is_empty() && !m.settings().is_empty());
            if m.kind() == ModeKind::Peer {
                // The report labels peers "re-implementation of <source>".
                assert!(!m.source().is_empty(), "{m:?}");
            }
        }
        assert!(Mode::Full.uses_agent() && Mode::Full.lc_under_libmemcolo());
        assert!(!Mode::Alloc.uses_agent() && Mode::Alloc.lc_under_libmemcolo());
        assert!(!Mode::Senpai.uses_agent() && !Mode::Koordinator.uses_agent());
        assert_eq!(
            Mode::M3.agent_flags(),
            &["--no-advice", "--no-reclaim", "--no-tier"]
        );
        assert!(
            Mode::Full.agent_flags().is_empty() && Mode::Full.agent_config(1 << 30, &[]).is_none()
        );
    }

    #[test]
    fn rejects_bad_settings() {
        for argv in [
            &["--rate", "0"][..],
            &["--set-ratio", "1.5"],
            &["--node-mem", "100MiB"],
            &["--levels", "500"],
            &["--keys", "10000000"],
            &["--duration-s", "0"],
            &["--repeats", "0"],
            &["--max-attempts", "0"],
            &["--reject-foreign-pct", "101"],
        ] {
            assert!(
                Settings::resolve(&parse(argv)).is_err(),
                "{argv:?} accepted"
            );
        }
        assert!(Cli::try_parse_from(["x", "--node-mem", "lots"]).is_err());
        assert!(Cli::try_parse_from(["x", "--be-split", "0:0"]).is_err());
        assert!(Cli::try_parse_from(["x", "--modes", "magic"]).is_err());
        assert!(Cli::try_parse_from(["x", "--lc-env", "NOEQUALS"]).is_err());
        assert!(Cli::try_parse_from(["x", "--lc-env", "A B=1"]).is_err());
        let a = parse(&["--lc-env", "MEMCOLO_THP=0", "--lc-env", "X="]);
        assert_eq!(
            a.lc_env,
            vec![("MEMCOLO_THP".into(), "0".into()), ("X".into(), "".into())]
        );
    }

    fn outcome(foreign: f64, status: &str) -> RunOutcome {
        RunOutcome {
            record: RunRecord {
                status: status.into(),
                lc_cpus_foreign_pct: Some(foreign),
                lc_cpus_steal_pct: Some(0.0),
                ..Default::default()
            },
            hist_us: None,
        }
    }

    #[test]
    fn a_clean_attempt_is_accepted_and_a_run_of_rejects_keeps_the_least_disturbed() {
        let p = RejectPolicy {
            foreign_pct_max: 5.0,
            steal_pct_max: 2.0,
            max_attempts: 3,
        };
        let mut a = vec![outcome(11.0, "ok"), outcome(1.0, "ok")];
        a[0].record.reject_reason = p.verdict(&disturbance(&a[0])).unwrap();
        settle_attempts(&mut a, &p);
        assert!(!a[0].record.accepted && a[1].record.accepted && !a[1].record.disturbed);
        let mut a = vec![outcome(11.0, "ok"), outcome(7.0, "ok"), outcome(9.0, "ok")];
        for o in &mut a {
            o.record.reject_reason = p.verdict(&disturbance(o)).unwrap();
        }
        settle_attempts(&mut a, &p);
        let kept: Vec<bool> = a.iter().map(|o| o.record.accepted).collect();
        assert_eq!(kept, vec![false, true, false]);
        assert!(a[1].record.disturbed);
        assert!(a[1]
            .record
            .reject_reason
            .starts_with("kept: least disturbed of 3"));
        // A failed attempt is never accepted.
        let mut a = vec![outcome(0.0, "failed: redis-server exited")];
        settle_attempts(&mut a, &p);
        assert!(!a[0].record.accepted);
    }

    #[test]
    fn tools_are_found_beside_the_binary_or_given() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let lib = dir.path().join("lib");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&lib).unwrap();
        let exe = bin.join("memcolo");
        std::fs::write(&exe, "").unwrap();
        std::fs::write(lib.join("libmemcolo.so"), "").unwrap();
        let found = find_beside(&exe, None, &["../lib/libmemcolo.so"], "/nonexistent").unwrap();
        assert!(found.ends_with("lib/libmemcolo.so"), "{}", found.display());
        assert!(find_beside(&exe, None, &["memcolo-gocache"], "/nonexistent/x").is_err());
        let given = lib.join("libmemcolo.so");
        assert_eq!(
            find_beside(&exe, Some(&given), &[], "x").unwrap(),
            given.canonicalize().unwrap()
        );
    }
}
