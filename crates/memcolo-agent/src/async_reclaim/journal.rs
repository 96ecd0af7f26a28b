//! The journal of v1 limit steps: a worker that lowers a v1 group's
//! `memory.limit_in_bytes` to make the kernel reclaim from it (see
//! [`memcolo_linux::pageout::reclaim_cgroup`]) first writes the previous limit to
//! `state_dir/reclaim-step-<worker>.json`, and removes the file once the limit is
//! restored; an agent that died in between leaves the file, and the next start puts
//! the limit back ([`recover_journal`]).

use memcolo_linux::cgroup::{Limit, MemoryCgroup};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub(super) fn journal_path(state_dir: &Path, worker: usize) -> PathBuf {
    state_dir.join(format!("reclaim-step-{worker}.json"))
}

#[derive(Serialize, Deserialize)]
pub(super) struct StepJournal {
    /// The stepped group's directory.
    pub(super) cgroup: PathBuf,
    /// Its limit before the step, bytes; `None`: unlimited.
    pub(super) limit: Option<u64>,
}

/// Undoes v1 limit steps left behind by an agent that died between lowering and
/// restoring a limit. Returns how many were undone.
pub fn recover_journal(state_dir: &Path) -> usize {
    let mut undone = 0;
    let Ok(dir) = std::fs::read_dir(state_dir) else {
        return 0;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("reclaim-step-") && name.ends_with(".json")) {
            continue;
        }
        let path = e.path();
        match std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<StepJournal>(&b).ok())
        {
            Some(j) => match MemoryCgroup::open(&j.cgroup) {
                Ok(cg) => {
                    let limit = j.limit.map(Limit::Bytes).unwrap_or(Limit::Max);
                    match cg.write_limit(limit) {
                        Ok(()) => {
                            tracing::warn!(cgroup = %j.cgroup.display(), ?limit, "restored a cgroup limit a previous agent left stepped down");
                            undone += 1;
                        }
                        Err(err) => {
                            tracing::error!(cgroup = %j.cgroup.display(), error = %err, "cannot restore a stepped-down cgroup limit")
                        }
                    }
                }
                Err(err) => {
                    tracing::info!(cgroup = %j.cgroup.display(), error = %err, "stepped cgroup is gone")
                }
            },
            None => tracing::warn!(path = %path.display(), "ignoring unreadable reclaim journal"),
        }
        let _ = std::fs::remove_file(&path);
    }
    undone
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake v1 group: the files `MemoryCgroup::open` and `write_limit` touch.
    fn fake_group(dir: &Path, limit: &str) -> PathBuf {
        let g = dir.join("be");
        std::fs::create_dir_all(&g).unwrap();
        std::fs::write(g.join("memory.usage_in_bytes"), "4096\n").unwrap();
        std::fs::write(g.join("memory.limit_in_bytes"), limit).unwrap();
        g
    }

    #[test]
    fn a_journaled_limit_step_is_undone_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        // The agent died with the group stepped down to 1 MiB from 512 MiB.
        let g = fake_group(dir.path(), "1048576\n");
        let j = StepJournal {
            cgroup: g.clone(),
            limit: Some(512 << 20),
        };
        std::fs::write(journal_path(&state, 0), serde_json::to_vec(&j).unwrap()).unwrap();
        // And from an unlimited group, on worker 1.
        let g2 = dir.path().join("be2");
        std::fs::create_dir_all(&g2).unwrap();
        std::fs::write(g2.join("memory.usage_in_bytes"), "4096\n").unwrap();
        std::fs::write(g2.join("memory.limit_in_bytes"), "1048576\n").unwrap();
        let j2 = StepJournal {
            cgroup: g2.clone(),
            limit: None,
        };
        std::fs::write(journal_path(&state, 1), serde_json::to_vec(&j2).unwrap()).unwrap();
        // A garbage journal is dropped, and a vanished group is no error.
        std::fs::write(state.join("reclaim-step-2.json"), "{not json").unwrap();
        let gone = StepJournal {
            cgroup: dir.path().join("removed"),
            limit: Some(1),
        };
        std::fs::write(journal_path(&state, 3), serde_json::to_vec(&gone).unwrap()).unwrap();

        assert_eq!(recover_journal(&state), 2);
        assert_eq!(
            std::fs::read_to_string(g.join("memory.limit_in_bytes")).unwrap(),
            (512u64 << 20).to_string()
        );
        assert_eq!(
            std::fs::read_to_string(g2.join("memory.limit_in_bytes")).unwrap(),
            "-1"
        );
        // Every journal is consumed: a second start has nothing to undo.
        assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
        assert_eq!(recover_journal(&state), 0);
        // No state dir at all: nothing to do.
        assert_eq!(recover_journal(&dir.path().join("missing")), 0);
    }
}
