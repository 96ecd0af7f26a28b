//! Hermes' file-cache advice (Hermes §3.3) from the core's side: planning a round
//! over the registered BE processes, handing it to the advice worker
//! ([`crate::advice`]) and recording what the worker did.

use super::{Core, ProcTable};
use crate::advice::{AdviceLink, AdviceOutcome, AdviceRound, BeJob, NotHandedOver};
use memcolo_linux::filecache::ExpectedProcess;
use memcolo_linux::scope::ScopeSample;
use memcolo_policy::hermes::AdviceConfig;
use memcolo_policy::{Class, Pid};
use serde_json::json;

impl Core {
    /// Hermes §3.3: above `adv_thr`, hands a round to the advice worker, which drops
    /// BE files' page cache, largest first. Never blocks: when the previous round
    /// still runs, this one is skipped (counted).
    pub(super) fn advise(&mut self, sample: &ScopeSample, procs: &ProcTable) {
        let adv_thr = self.cfg.adv_thr_bytes(sample.total_bytes);
        if sample.used_bytes <= adv_thr {
            return;
        }
        let Some(link) = &self.advice else { return };
        // A registered process and its descendants must run as the user it
        // registered as (its real uid then).
        let expected = |pid: Pid, registered: Option<u64>, uid: Option<u32>| {
            let starttime_ticks =
                registered.or_else(|| procs.starttime_ticks.get(&pid).copied())?;
            Some(ExpectedProcess {
                pid,
                starttime_ticks,
                uid,
            })
        };
        let mut round = AdviceRound {
            used_bytes: sample.used_bytes,
            cfg: AdviceConfig {
                adv_thr_bytes: adv_thr,
                min_resident_bytes: self.cfg.hermes.min_resident_bytes,
            },
            be: Vec::new(),
            lc: Vec::new(),
        };
        for e in self.registry.iter() {
            let uid = e.creds.map(|c| c.ruid());
            let tree = procs.tree(e.pid);
            let descendants = tree
                .iter()
                .filter(|p| **p != e.pid)
                .filter_map(|p| expected(*p, None, uid));
            match e.class {
                Class::Elastic => {}
                Class::Lc => {
                    round
                        .lc
                        .extend(expected(e.pid, Some(e.starttime_ticks), None));
                    // Files an LC process holds are only looked at, never advised.
                    round.lc.extend(
                        tree.iter()
                            .filter(|p| **p != e.pid)
                            .filter_map(|p| expected(*p, None, None)),
                    );
                }
                Class::Be => {
                    if let Some(root) = expected(e.pid, Some(e.starttime_ticks), uid) {
                        round.be.push(BeJob {
                            root,
                            descendants: descendants.collect(),
                        });
                    }
                }
            }
        }
        let outcome = match link.try_hand_over(round) {
            Ok(()) => "handed_over",
            Err(NotHandedOver::Busy) => {
                self.advice_rounds_skipped += 1;
                "skipped_busy"
            }
            Err(NotHandedOver::Stopped) => {
                self.metrics
                    .errors
                    .with_label_values(&["advice_worker"])
                    .inc();
                return;
            }
        };
        self.metrics
            .file_advice_rounds
            .with_label_values(&[outcome])
            .inc();
    }

    /// Connects the Hermes advice worker ([`crate::advice::start`]).
    pub fn attach_advice(&mut self, link: AdviceLink) {
        self.advice = Some(link);
    }

    /// Records what finished advice rounds did: events, metrics and counters.
    pub fn collect_advice(&mut self) {
        let outcomes = match &self.advice {
            Some(link) => link.outcomes(),
            None => return,
        };
        for o in outcomes {
            self.record_advice(o);
        }
    }

    pub(super) fn record_advice(&mut self, o: AdviceOutcome) {
        if let Some(why) = &o.aborted {
            self.metrics
                .file_advice_rounds
                .with_label_values(&["aborted"])
                .inc();
            self.metrics.errors.with_label_values(&["advice"]).inc();
            tracing::warn!(error = %why, "Hermes advice round advised nothing");
        }
        for d in o.dropped {
            self.file_cache_dropped_bytes += d.dropped_bytes;
            self.metrics
                .file_cache_dropped_bytes
                .inc_by(d.dropped_bytes);
            self.metrics.file_advice.inc();
            self.events.record(
                "file_cache_dropped",
                json!({"pid": d.job, "path": d.path, "dev": d.dev, "ino": d.ino,
                       "expected_bytes": d.expected_bytes, "dropped_bytes": d.dropped_bytes,
                       "used_bytes": o.used_bytes, "adv_thr_bytes": o.adv_thr_bytes}),
            );
        }
        for f in o.failed {
            self.metrics.errors.with_label_values(&["fadvise"]).inc();
            tracing::warn!(path = %f.path, dev = f.dev, ino = f.ino, error = %f.error, "posix_fadvise failed");
        }
        if o.skipped.foreign > 0 || o.processes_skipped > 0 {
            tracing::debug!(skipped = ?o.skipped, processes_skipped = o.processes_skipped, "Hermes advice left files out");
        }
    }
}
