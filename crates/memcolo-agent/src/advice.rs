//! The Hermes advice worker: file discovery, page-cache measurement and
//! `posix_fadvise(POSIX_FADV_DONTNEED)` for BE jobs (Hermes, Middleware'21 §3.3), off
//! the agent's main loop.
//!
//! Every one of those calls touches a file a tenant chose, and a file system may not
//! answer (a FUSE server that never replies to `getattr` or `flush`, a page locked
//! by a read that never completes). So they run on one thread of their own: the core
//! hands over one [`AdviceRound`] at a time ([`AdviceLink::try_hand_over`]); while a
//! round runs, the next ones are skipped (and counted), and the outcome comes back
//! as an [`AdviceOutcome`] the core drains at its next poll
//! ([`AdviceLink::outcomes`]). A stuck file stalls this worker only; the main loop
//! keeps answering clients and polling.
//!
//! A round:
//! 1. proves each process's identity
//!    ([`memcolo_linux::identity::ProvenProcess::open`]: pidfd, start time, uids); a
//!    BE job's uid is its registered process's, and a descendant that runs
//!    as another uid is left out;
//! 2. lists the identities of every file an LC process holds (never advised, rule H2)
//!    and the regular files each BE process holds and owns
//!    ([`memcolo_linux::filecache::ProcessFiles::owned_files`]: `pidfd_getfd(2)` and
//!    `/proc/PID/map_files`, never a path walk), deduplicated by `(st_dev, st_ino)`;
//! 3. measures each BE file's clean page cache (what advice can drop) on the agent's
//!    own descriptor;
//! 4. plans with [`memcolo_policy::hermes::plan_advice`] (largest first until used
//!    memory is below `adv_thr`) and advises each planned file through the
//!    [`Actuator`].

use memcolo_linux::actuate::Actuator;
use memcolo_linux::filecache::{CachedFile, ExpectedProcess, ProcessFiles, SkippedFiles};
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::hermes::{self, AdviceConfig, FileCache};
use memcolo_policy::Pid;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

/// One BE job: its registered process and the descendants one poll saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BeJob {
    /// The registered process (start time as registered; `uid` as expected, or
    /// `None` to take the uid it runs as).
    pub root: ExpectedProcess,
    /// Its descendants (start times from the same poll); each must run as the
    /// registered process's uid.
    pub descendants: Vec<ExpectedProcess>,
}

/// What one round works on, handed from the core to the worker.
#[derive(Clone, Debug, PartialEq)]
pub struct AdviceRound {
    /// Used memory of the scope when the poll ran, bytes.
    pub used_bytes: u64,
    /// Hermes' `adv_thr` and minimum resident size per file.
    pub cfg: AdviceConfig,
    /// The BE jobs whose own files may be advised.
    pub be: Vec<BeJob>,
    /// Every LC process (registered ones and their descendants); no file any of them
    /// holds is advised.
    pub lc: Vec<ExpectedProcess>,
}

/// One file advised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// The registered BE process whose job holds the file.
    pub job: Pid,
    /// Descriptive path (readlink of the magic link; informational, never opened).
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    /// Clean resident bytes when measured (what the plan expected to free).
    pub expected_bytes: u64,
    /// Resident before minus resident after the advice, bytes.
    pub dropped_bytes: u64,
}

/// An advice call that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failed {
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    pub error: String,
}

/// What one round did, sent back to the core.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdviceOutcome {
    /// `used_bytes` and `adv_thr_bytes` of the round.
    pub used_bytes: u64,
    pub adv_thr_bytes: u64,
    /// Regular files owned by their BE process's uid, measured.
    pub files: usize,
    /// Files left out while listing, by reason, summed over every BE process.
    pub skipped: SkippedFiles,
    /// BE processes left out: exited, pid reused, or running as another uid than
    /// their job's.
    pub processes_skipped: u64,
    /// Set when an LC process's files could not be listed: the round advised nothing
    /// (it could not tell which files LC processes hold).
    pub aborted: Option<String>,
    pub dropped: Vec<Dropped>,
    pub failed: Vec<Failed>,
}

/// The core's end of the worker.
pub struct AdviceLink {
    rounds: mpsc::SyncSender<AdviceRound>,
    outcomes: mpsc::Receiver<AdviceOutcome>,
    busy: Arc<AtomicBool>,
}

/// Why [`AdviceLink::try_hand_over`] did not hand a round over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotHandedOver {
    /// The previous round has not finished.
    Busy,
    /// The worker thread is gone.
    Stopped,
}

impl AdviceLink {
    /// Hands `round` to the worker unless the previous round is still running.
    /// Never blocks.
    pub fn try_hand_over(&self, round: AdviceRound) -> Result<(), NotHandedOver> {
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(NotHandedOver::Busy);
        }
        match self.rounds.try_send(round) {
            Ok(()) => Ok(()),
            Err(mpsc::TrySendError::Full(_)) => Err(NotHandedOver::Busy),
            Err(mpsc::TrySendError::Disconnected(_)) => {
                self.busy.store(false, Ordering::Release);
                Err(NotHandedOver::Stopped)
            }
        }
    }

    /// Outcomes of finished rounds not collected yet. Never blocks.
    pub fn outcomes(&self) -> Vec<AdviceOutcome> {
        self.outcomes.try_iter().collect()
    }

    /// Whether a round is running.
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }
}

/// Starts the worker thread; `actuator` issues the advice (`drop_file_cache`) and
/// `procfs` is where identities are read (the real `/proc` in the agent). The thread
/// ends when the [`AdviceLink`] is dropped and the round in progress, if any, ends.
pub fn start(procfs: ProcFs, mut actuator: Box<dyn Actuator>) -> std::io::Result<AdviceLink> {
    let (round_tx, round_rx) = mpsc::sync_channel::<AdviceRound>(1);
    let (out_tx, out_rx) = mpsc::channel();
    let busy = Arc::new(AtomicBool::new(false));
    let busy_w = busy.clone();
    std::thread::Builder::new()
        .name("memcolo-advice".into())
        .spawn(move || {
            while let Ok(round) = round_rx.recv() {
                let outcome = run_round(&procfs, actuator.as_mut(), &round);
                let sent = out_tx.send(outcome);
                busy_w.store(false, Ordering::Release);
                if sent.is_err() {
                    return;
                }
            }
        })?;
    Ok(AdviceLink {
        rounds: round_tx,
        outcomes: out_rx,
        busy,
    })
}

/// One round, synchronously (the worker's body; tests call it directly).
pub fn run_round(
    procfs: &ProcFs,
    actuator: &mut dyn Actuator,
    round: &AdviceRound,
) -> AdviceOutcome {
    let mut out = AdviceOutcome {
        used_bytes: round.used_bytes,
        adv_thr_bytes: round.cfg.adv_thr_bytes,
        ..Default::default()
    };
    if round.used_bytes <= round.cfg.adv_thr_bytes {
        return out; // H1
    }
    let mut lc_files = HashSet::new();
    for want in &round.lc {
        let ids = ProcessFiles::open(procfs, *want).and_then(|p| p.file_ids());
        match ids {
            Ok(ids) => lc_files.extend(ids),
            Err(e) if e.is_not_found() => {} // exited: holds nothing
            Err(e) => {
                out.aborted = Some(format!("LC pid {}: {e}", want.pid));
                return out;
            }
        }
    }
    // (dev, ino) -> (job, file); the first holder's descriptor is kept.
    let mut files: BTreeMap<(u64, u64), (Pid, CachedFile)> = BTreeMap::new();
    for job in &round.be {
        let root = match ProcessFiles::open(procfs, job.root) {
            Ok(p) => p,
            Err(e) => {
                out.processes_skipped += 1 + job.descendants.len() as u64;
                tracing::debug!(pid = job.root.pid, error = %e, "BE job not advised");
                continue;
            }
        };
        let uid = root.uid();
        let mut members = vec![root];
        for d in &job.descendants {
            let want = ExpectedProcess {
                uid: Some(uid),
                ..*d
            };
            match ProcessFiles::open(procfs, want) {
                Ok(p) => members.push(p),
                Err(e) => {
                    out.processes_skipped += 1;
                    tracing::debug!(pid = d.pid, error = %e, "BE descendant not advised");
                }
            }
        }
        for p in members {
            match p.owned_files() {
                Ok((owned, skipped)) => {
                    out.skipped.not_regular += skipped.not_regular;
                    out.skipped.foreign += skipped.foreign;
                    out.skipped.memory_backed += skipped.memory_backed;
                    out.skipped.vanished += skipped.vanished;
                    for f in owned {
                        files.entry(f.id()).or_insert((job.root.pid, f));
                    }
                }
                Err(e) => {
                    out.processes_skipped += 1;
                    tracing::debug!(pid = p.pid(), error = %e, "cannot list BE files");
                }
            }
        }
    }
    let mut cache = Vec::with_capacity(files.len());
    for (&(dev, ino), (_, f)) in &files {
        let Ok(resident_bytes) = f.clean_bytes() else {
            continue; // e.g. an O_PATH descriptor the process held: nothing to advise
        };
        cache.push(FileCache {
            dev,
            ino,
            path: f.path().display().to_string(),
            resident_bytes,
            held_by_lc: lc_files.contains(&(dev, ino)),
        });
    }
    out.files = cache.len();
    for advice in hermes::plan_advice(&round.cfg, round.used_bytes, &cache) {
        let Some((job, f)) = files.get(&(advice.dev, advice.ino)) else {
            continue;
        };
        match actuator.drop_file_cache(f) {
            Ok(dropped_bytes) => out.dropped.push(Dropped {
                job: *job,
                path: advice.path,
                dev: advice.dev,
                ino: advice.ino,
                expected_bytes: advice.expected_bytes,
                dropped_bytes,
            }),
            Err(e) => out.failed.push(Failed {
                path: advice.path,
                dev: advice.dev,
                ino: advice.ino,
                error: e.to_string(),
            }),
        }
    }
    out
}
