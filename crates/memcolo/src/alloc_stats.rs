//! `memcolo alloc-stats PID`: the allocator telemetry of a process running libmemcolo
//! (huge page coverage, realized fragmentation, skipped subreleases and the share
//! confirmed correct, reservation hits and misses, pre-faulted bytes, bytes released;
//! ISMM'21 §3-4, Hermes §3.2), as a table or as JSON with `--json`.
//!
//! It goes through the agent: the process must be registered (the agent's status
//! names it, with its class). libmemcolo publishes its numbers, while it is
//! registered, in a small versioned file next to the agent's socket,
//! `<socket dir>/alloc/<pid>.json`, rewritten once a second (see `alloc/src/stats.c`
//! and docs/design.md). A file is trusted only if it names the pid, carries the
//! process's start time (`/proc/PID/stat` field 22, so a reused pid is never mistaken
//! for it) and belongs to the process's user or to root.

use crate::status;
use crate::SocketArg;
use anyhow::{bail, Context, Result};
use memcolo_linux::procfs::ProcFs;
use memcolo_policy::Pid;
use serde_json::{json, Value};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The version of the stats file this reader understands.
pub const STATS_FILE_VERSION: u64 = 1;

/// A file older than this is shown with a warning (the process is not publishing).
const STALE_AFTER_MS: u64 = 10_000;

#[derive(clap::Args, Debug)]
pub struct AllocStatsArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// The process (registered with the agent, running libmemcolo).
    pid: Pid,
    /// Print JSON: the process's registration, the file's age and every counter.
    #[arg(long)]
    json: bool,
}

/// Where libmemcolo publishes the stats of `pid` for an agent listening on `socket`.
pub fn stats_path(socket: &Path, pid: Pid) -> PathBuf {
    socket
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("alloc")
        .join(format!("{pid}.json"))
}

/// Reads and checks the stats file of `pid` (see the module docs for the checks).
pub fn read_stats_file(path: &Path, pid: Pid, procfs: &ProcFs) -> Result<Value> {
    let (text, owner) = match read_tenant_file(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "no allocator stats for pid {pid} at {}: libmemcolo publishes them while the \
             process is registered with the agent (is it running with LD_PRELOAD=libmemcolo.so \
             and MEMCOLO_CLASS set, and may it write to that directory?)",
            path.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a JSON stats file", path.display()))?;
    match v["v"].as_u64() {
        Some(STATS_FILE_VERSION) => {}
        Some(n) if n > STATS_FILE_VERSION => bail!(
            "{}: stats file version {n} is newer than this memcolo ({STATS_FILE_VERSION})",
            path.display()
        ),
        _ => bail!("{}: no valid version `v`", path.display()),
    }
    if v["pid"].as_i64() != Some(i64::from(pid)) || !v["stats"].is_object() {
        bail!("{}: not the stats of pid {pid}", path.display());
    }
    let stat = procfs
        .read_pid_stat(pid)
        .with_context(|| format!("process {pid}"))?;
    if v["starttime_ticks"].as_u64() != Some(stat.starttime_ticks) {
        bail!(
            "{}: left by an earlier process with pid {pid} (start time differs); \
             the running one has published nothing",
            path.display()
        );
    }
    let proc_uid = procfs.read_pid_status(pid)?.uid;
    if owner != 0 && owner != proc_uid {
        bail!(
            "{}: written by uid {owner}, but process {pid} runs as uid {proc_uid}",
            path.display()
        );
    }
    Ok(v)
}

/// The largest stats file read (a real one is about 2 KiB).
const MAX_STATS_FILE_BYTES: u64 = 64 * 1024;

/// Reads a file a tenant wrote (this command may run as root): opened without
/// following a symbolic link and without blocking (a FIFO put there is refused, not
/// waited on), a regular file of at most [`MAX_STATS_FILE_BYTES`]; returns its text
/// and its owner, both from the one open descriptor.
fn read_tenant_file(path: &Path) -> std::io::Result<(String, u32)> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    if meta.len() > MAX_STATS_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} bytes, over the {MAX_STATS_FILE_BYTES}-byte bound",
                meta.len()
            ),
        ));
    }
    let mut text = String::new();
    f.take(MAX_STATS_FILE_BYTES).read_to_string(&mut text)?;
    Ok((text, meta.uid()))
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn ratio(num: Option<u64>, den: Option<u64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0 => Some(n as f64 / d as f64),
        _ => None,
    }
}

/// The JSON document of `--json`: registration, age and the library's counters.
pub fn document(pid: Pid, entry: &Value, file: &Value, now_ms: u64) -> Value {
    let s = &file["stats"];
    let age_ms = file["updated_unix_ms"]
        .as_u64()
        .map(|t| now_ms.saturating_sub(t));
    let hits = s["reserve_hits"].as_u64();
    let misses = s["reserve_misses"].as_u64();
    json!({
        "pid": pid,
        "name": entry["name"],
        "class": entry["class"],
        "connected": entry["connected"],
        "updated_unix_ms": file["updated_unix_ms"],
        "age_ms": age_ms,
        "skipped_correct_share": ratio(s["skipped_correct_bytes"].as_u64(), s["skipped_subrelease_bytes"].as_u64()),
        "reserve_hit_share": ratio(hits, hits.zip(misses).map(|(h, m)| h + m)),
        "stats": s,
    })
}

fn pct(v: Option<f64>) -> String {
    v.map(|x| format!("{:.1} %", 100.0 * x))
        .unwrap_or_else(|| "-".into())
}

/// The table of the default output.
pub fn render(doc: &Value) -> Vec<String> {
    let s = &doc["stats"];
    let mib = |k: &str| status::mib(&s[k]);
    let n = |k: &str| {
        s[k].as_u64()
            .map(|v| v.to_string())
            .unwrap_or_else(|| "-".into())
    };
    let age = doc["age_ms"]
        .as_u64()
        .map(|a| {
            let stale = if a > STALE_AFTER_MS {
                " — STALE: the process is not publishing"
            } else {
                ""
            };
            format!("updated {:.1} s ago{stale}", a as f64 / 1000.0)
        })
        .unwrap_or_default();
    vec![
        format!(
            "pid {}  {}  class {}  {}  {}",
            doc["pid"],
            doc["name"].as_str().unwrap_or("?"),
            doc["class"].as_str().unwrap_or("?"),
            if doc["connected"] == true {
                "connected"
            } else {
                "not connected"
            },
            age
        ),
        format!(
            "huge page coverage          {}   ({} of {} huge pages broken; THP-backed {}, {} huge pages)",
            pct(s["hugepage_coverage"].as_f64()),
            n("hugepages_broken"),
            n("hugepages_total"),
            pct(s["thp_coverage"].as_f64()),
            n("hugepages_thp")
        ),
        format!(
            "realized fragmentation      {} MiB   (average now {} MiB)",
            mib("realized_fragmentation_bytes"),
            mib("average_fragmentation_bytes")
        ),
        format!(
            "skipped subreleases         {} MiB   confirmed correct {} MiB ({})   incorrect {} MiB",
            mib("skipped_subrelease_bytes"),
            mib("skipped_correct_bytes"),
            pct(doc["skipped_correct_share"].as_f64()),
            mib("skipped_incorrect_bytes")
        ),
        format!(
            "reservation hits            {}   misses {}   ({} hits)   reservation {}, target {} MiB, reserved {} MiB",
            n("reserve_hits"),
            n("reserve_misses"),
            pct(doc["reserve_hit_share"].as_f64()),
            if s["reservation_on"].as_u64() == Some(1) {
                "on"
            } else {
                "off"
            },
            mib("reserve_target_bytes"),
            mib("reserved_bytes")
        ),
        format!(
            "pool of large blocks        {} MiB   hits {}   misses {}",
            mib("pool_bytes"),
            n("pool_hits"),
            n("pool_misses")
        ),
        format!("pre-faulted                 {} MiB", mib("prefaulted_bytes")),
        format!(
            "released to the OS          {} MiB   (subreleased {} MiB; on the agent's notifications {} MiB, {} notifications)",
            mib("released_total_bytes"),
            mib("subreleased_bytes"),
            mib("agent_released_bytes"),
            n("agent_notifications")
        ),
        format!(
            "page heap                   mapped {} MiB   used {} MiB   free and backed {} MiB",
            mib("mapped_bytes"),
            mib("used_bytes"),
            mib("free_backed_bytes")
        ),
    ]
}

pub fn run(a: &AllocStatsArgs) -> Result<()> {
    let st = status::fetch(&a.socket.socket)?;
    let entry = st["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["pid"].as_i64() == Some(i64::from(a.pid)))
        .cloned();
    let Some(entry) = entry else {
        bail!(
            "pid {} is not registered with the agent (libmemcolo registers a process that \
             has MEMCOLO_CLASS set; `memcolo status` lists the registered ones)",
            a.pid
        );
    };
    let path = stats_path(&a.socket.socket, a.pid);
    let file = read_stats_file(&path, a.pid, &ProcFs::root())?;
    let doc = document(a.pid, &entry, &file, now_unix_ms());
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for l in render(&doc) {
            println!("{l}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /proc with one process: its stat (start time) and status (uid).
    fn fake_proc(root: &Path, pid: Pid, starttime: u64, uid: u32) {
        let d = root.join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("stat"),
            format!("{pid} (svc (x)) S 1 {pid} {pid} 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 4 0 {starttime} 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"),
        )
        .unwrap();
        std::fs::write(
            d.join("status"),
            format!("Name:\tsvc\nTgid:\t{pid}\nPPid:\t1\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nThreads:\t4\n"),
        )
        .unwrap();
    }

    fn file_text(pid: Pid, starttime: u64) -> String {
        format!(
            "{{\"v\":1,\"pid\":{pid},\"starttime_ticks\":{starttime},\"uid\":0,\"updated_unix_ms\":1000,\"stats\":{{\
             \"hugepage_coverage\":0.981000,\"hugepages_total\":10,\"hugepages_broken\":1,\
             \"realized_fragmentation_bytes\":1048576,\"skipped_subrelease_bytes\":4194304,\
             \"skipped_correct_bytes\":3145728,\"reserve_hits\":99,\"reserve_misses\":1,\
             \"prefaulted_bytes\":8388608,\"released_total_bytes\":2097152,\"reservation_on\":1,\
             \"reserved_bytes\":6291456}}}}\n"
        )
    }

    #[test]
    fn path_sits_next_to_the_socket() {
        assert_eq!(
            stats_path(Path::new("/run/memcolo/agent.sock"), 42),
            PathBuf::from("/run/memcolo/alloc/42.json")
        );
    }

    #[test]
    fn accepts_the_live_process_and_derives_shares() {
        let t = tempfile::tempdir().unwrap();
        let uid = unsafe { libc::geteuid() };
        fake_proc(&t.path().join("proc"), 77, 5000, uid);
        let f = t.path().join("77.json");
        std::fs::write(&f, file_text(77, 5000)).unwrap();
        let v = read_stats_file(&f, 77, &ProcFs::new(t.path().join("proc"))).unwrap();
        let doc = document(
            77,
            &json!({"name": "svc", "class": "lc", "connected": true}),
            &v,
            3500,
        );
        assert_eq!(doc["age_ms"], 2500);
        assert_eq!(doc["skipped_correct_share"], 0.75);
        assert_eq!(doc["reserve_hit_share"], 0.99);
        let text = render(&doc).join("\n");
        assert!(
            text.contains("huge page coverage          98.1 %"),
            "{text}"
        );
        assert!(
            text.contains("confirmed correct 3.0 MiB (75.0 %)"),
            "{text}"
        );
        assert!(
            text.contains("reservation hits            99   misses 1"),
            "{text}"
        );
        assert!(text.contains("reserved 6.0 MiB"), "{text}");
    }

    #[test]
    fn refuses_stale_foreign_or_newer_files() {
        let t = tempfile::tempdir().unwrap();
        let uid = unsafe { libc::geteuid() };
        let procfs = ProcFs::new(t.path().join("proc"));
        fake_proc(&t.path().join("proc"), 77, 5000, uid);
        let f = t.path().join("77.json");
        // a reused pid: the file's start time is another process's
        std::fs::write(&f, file_text(77, 4000)).unwrap();
        let e = read_stats_file(&f, 77, &procfs).unwrap_err().to_string();
        assert!(e.contains("earlier process"), "{e}");
        // another pid's numbers
        std::fs::write(&f, file_text(78, 5000)).unwrap();
        assert!(read_stats_file(&f, 77, &procfs).is_err());
        // a newer format
        std::fs::write(&f, file_text(77, 5000).replace("\"v\":1", "\"v\":2")).unwrap();
        let e = read_stats_file(&f, 77, &procfs).unwrap_err().to_string();
        assert!(e.contains("newer"), "{e}");
        // not there at all
        let e = read_stats_file(&t.path().join("none.json"), 77, &procfs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no allocator stats"), "{e}");
        // garbage
        std::fs::write(&f, "{\"v\":1,").unwrap();
        assert!(read_stats_file(&f, 77, &procfs).is_err());
    }

    #[test]
    fn a_fifo_or_symlink_planted_at_the_path_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        fake_proc(&proc_root, 42, 777, 0);
        let procfs = ProcFs::new(&proc_root);
        // A symlink to a file root may read and the tenant may not.
        let secret = dir.path().join("secret");
        std::fs::write(&secret, file_text(42, 777)).unwrap();
        let link = dir.path().join("42.json");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let e = read_stats_file(&link, 42, &procfs).unwrap_err();
        assert!(format!("{e:#}").contains("42.json"), "{e:#}");
        // A FIFO: refused at once (a blocking open would wait for a writer forever).
        let fifo = dir.path().join("43.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        fake_proc(&proc_root, 43, 777, 0);
        let e = read_stats_file(&fifo, 43, &procfs).unwrap_err();
        assert!(format!("{e:#}").contains("not a regular file"), "{e:#}");
    }

    #[test]
    fn refuses_a_file_of_another_user() {
        if unsafe { libc::geteuid() } == 0 {
            // root's files are always accepted; check the rule with a process of uid 4242
            // and a file owned by root: accepted; the refusal needs a non-root owner.
            let t = tempfile::tempdir().unwrap();
            fake_proc(&t.path().join("proc"), 77, 5000, 4242);
            let f = t.path().join("77.json");
            std::fs::write(&f, file_text(77, 5000)).unwrap();
            std::os::unix::fs::chown(&f, Some(4343), None).unwrap();
            let e = read_stats_file(&f, 77, &ProcFs::new(t.path().join("proc")))
                .unwrap_err()
                .to_string();
            assert!(e.contains("written by uid 4343"), "{e}");
        }
    }
}
