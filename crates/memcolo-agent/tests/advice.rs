//! One Hermes advice round ([`memcolo_agent::advice::run_round`]) on real processes
//! with a recording actuator: which processes' files are advised when identities do
//! not match (a reused pid, a descendant running as another uid, an LC process that
//! exited).
//!
//! Needs root and `setpriv` (util-linux); fails otherwise. Uid 61207 is the tenant.

use memcolo_agent::advice::{run_round, AdviceRound, BeJob};
use memcolo_linux::actuate::{ActuatorCall, RecordingActuator};
use memcolo_linux::filecache::ExpectedProcess;
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::hermes::AdviceConfig;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const TENANT: u32 = 61207;

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `sleep` holding `file` on descriptor 3, as `uid` (through setpriv) or as root.
fn holder(file: &Path, uid: Option<u32>) -> Killed {
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    let script = format!("exec 3<'{}'; exec sleep 600", file.display());
    let child = match uid {
        Some(u) => Command::new("setpriv")
            .args([
                format!("--reuid={u}"),
                format!("--regid={u}"),
                "--clear-groups".into(),
            ])
            .args(["sh", "-c", &script])
            .spawn()
            .expect("setpriv (util-linux) is needed"),
        None => Command::new("sh").args(["-c", &script]).spawn().unwrap(),
    };
    let k = Killed(child);
    let fd = format!("/proc/{}/fd/3", k.0.id());
    let t0 = Instant::now();
    while !Path::new(&fd).exists()
        || uid.is_some_and(|u| {
            ProcFs::root()
                .read_pid_status(k.0.id() as i32)
                .map(|s| s.uid != u)
                .unwrap_or(true)
        })
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "holder not started");
        std::thread::sleep(Duration::from_millis(20));
    }
    k
}

fn expected(k: &Killed) -> ExpectedProcess {
    let pid = k.0.id() as i32;
    ExpectedProcess {
        pid,
        starttime_ticks: ProcFs::root().read_pid_stat(pid).unwrap().starttime_ticks,
        uid: None,
    }
}

fn round(be: Vec<BeJob>, lc: Vec<ExpectedProcess>) -> AdviceRound {
    AdviceRound {
        // Far above adv_thr: every eligible file is planned.
        used_bytes: u64::MAX / 2,
        cfg: AdviceConfig {
            adv_thr_bytes: 1,
            min_resident_bytes: 0,
        },
        be,
        lc,
    }
}

fn advised(act: &RecordingActuator) -> Vec<PathBuf> {
    act.calls
        .iter()
        .filter_map(|c| match c {
            ActuatorCall::DropFileCache { path, .. } => Some(path.clone()),
            _ => None,
        })
        .collect()
}

fn file(dir: &Path, name: &str, owner: u32) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, vec![9u8; 256 * 1024]).unwrap();
    std::os::unix::fs::chown(&p, Some(owner), Some(owner)).unwrap();
    p
}

fn workdir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("memcolo-advice")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(
        d.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    d
}

#[test]
fn a_descendant_running_as_another_uid_is_left_out() {
    let dir = workdir();
    let root_file = file(dir.path(), "job", 0);
    let tenant_file = file(dir.path(), "tenant", TENANT);
    let job = holder(&root_file, None);
    let child = holder(&tenant_file, Some(TENANT));
    let mut act = RecordingActuator::default();
    let out = run_round(
        &ProcFs::root(),
        &mut act,
        &round(
            vec![BeJob {
                root: expected(&job),
                descendants: vec![expected(&child)],
            }],
            vec![],
        ),
    );
    // The job runs as root: root's files (its shared libraries included) are its
    // own; the descendant's file is not reached at all.
    let advised = advised(&act);
    assert!(advised.contains(&root_file), "{advised:?}");
    assert!(!advised.contains(&tenant_file), "{advised:?}");
    assert_eq!(out.processes_skipped, 1, "{out:?}");
}

#[test]
fn a_reused_pid_is_not_advised_and_an_exited_lc_process_does_not_stop_the_round() {
    let dir = workdir();
    let a = file(dir.path(), "a", TENANT);
    let b = file(dir.path(), "b", TENANT);
    let reused = holder(&a, Some(TENANT));
    let live = holder(&b, Some(TENANT));
    let wrong = ExpectedProcess {
        starttime_ticks: expected(&reused).starttime_ticks + 1,
        ..expected(&reused)
    };
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id() as i32;
    gone.wait().unwrap();
    let lc_gone = ExpectedProcess {
        pid: gone_pid,
        starttime_ticks: 1,
        uid: None,
    };
    let mut act = RecordingActuator::default();
    let out = run_round(
        &ProcFs::root(),
        &mut act,
        &round(
            vec![
                BeJob {
                    root: wrong,
                    descendants: vec![],
                },
                BeJob {
                    root: expected(&live),
                    descendants: vec![],
                },
            ],
            vec![lc_gone],
        ),
    );
    assert!(out.aborted.is_none(), "{out:?}");
    // The tenant's sleep maps only root's files: its own file is all there is.
    assert_eq!(advised(&act), vec![b]);
    assert_eq!(out.processes_skipped, 1);
}

#[test]
fn nothing_is_advised_at_or_below_adv_thr() {
    let dir = workdir();
    let a = file(dir.path(), "a", TENANT);
    let be = holder(&a, Some(TENANT));
    let mut r = round(
        vec![BeJob {
            root: expected(&be),
            descendants: vec![],
        }],
        vec![],
    );
    r.used_bytes = r.cfg.adv_thr_bytes;
    let mut act = RecordingActuator::default();
    let out = run_round(&ProcFs::root(), &mut act, &r);
    assert!(act.calls.is_empty());
    assert_eq!(out.files, 0);
}
