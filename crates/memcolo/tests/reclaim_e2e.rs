//! End to end on the real kernel with `[reclaim] enabled = true`: `memcolo agent`
//! manages a 256 MiB memory cgroup scope (v1, or v2 as in the guest of
//! `scripts/v2bed/`) holding a real BE process that fills
//! 320 MiB of anonymous memory, paced, in its own group `be`, and a real LC process
//! holding 16 MiB in group `lc`; swap is a zram device of the test's own.
//!
//! Asserts that (1) the agent's workers reclaim the BE group (its swap and pgpgout
//! grow, `memcolo_reclaim_*` metrics and status move, the target is the BE group),
//! (2) the BE data is intact afterwards, (3) its refaults show in the sampled page
//! turnaround, which steers the back-off once enough recent evictions are sampled,
//! (4) no LC page is ever in swap and the LC is never a reclaim target, (5) no
//! process is killed, and (6) on SIGTERM, sent while the BE is refaulting and
//! the workers are busy, the agent exits cleanly with every v1 limit as it was and
//! no limit-step journal left behind.
//!
//! The LC group has swappiness 0 (v1), so the kernel's own reclaim at the scope's
//! limit (should the agent fall behind on a busy machine) never swaps LC memory: an
//! LC page in swap can then only be the agent's doing (`process_madvise` ignores
//! swappiness). v2 has no per-group swappiness: there the LC group gets
//! `memory.swap.max` 0, which forbids swap to the agent as well, so on v2 (4) rests
//! on the LC never being listed as a target. The first test needs root, a memory
//! cgroup (v1 or v2), zram and python3, the others cgroup v1; elsewhere it says why and
//! passes without running. Every wait is bounded; nothing depends on the machine's
//! speed. Cleanup (processes, groups, the zram device) runs on failure too.

#[path = "../../memcolo-agent/tests/support/mod.rs"]
mod support;

mod common;

use common::agent::{Agent, AgentCommand};

use common::{agent_status, wait_for};
use memcolo_linux::cgroup::{CgroupVersion, Limit, MemoryCgroup};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::{Holder, Scratch, MIB};

/// Starts `memcolo agent` over the cgroup `scope` with the config file `cfg`, metrics on
/// `metrics` (an `addr:port`), a 200 ms poll and `extra` arguments; its socket
/// (`agent.sock`), state directory (`state`) and event log (`events.jsonl`) live in
/// `dir` ([`AgentCommand`]). Returns once the socket answers, with the socket's path.
fn start_agent(
    exe: &str,
    dir: &Path,
    cfg: &Path,
    scope: &Path,
    metrics: &str,
    extra: &[&str],
) -> (Agent, PathBuf) {
    let agent = AgentCommand::new(exe, dir)
        .config(cfg)
        .metrics(metrics)
        .args(["--poll-ms", "200"])
        .args(extra)
        .scope(scope)
        .start();
    let sock = agent.socket.clone();
    (agent, sock)
}

fn stat(group: &Path, key: &str) -> u64 {
    std::fs::read_to_string(group.join("memory.stat"))
        .unwrap()
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no {key} in {}/memory.stat", group.display()))
}

/// The group's own hard limit (v1 `memory.limit_in_bytes`, v2 `memory.max`).
fn limit_of(group: &Path) -> Limit {
    MemoryCgroup::open(group).unwrap().read_limit().unwrap()
}

/// The group's swap usage in bytes (v1 `total_swap`, v2 `memory.swap.current`).
fn swap_of(group: &Path) -> u64 {
    MemoryCgroup::open(group)
        .unwrap()
        .read_memory_stat()
        .unwrap()
        .swap_bytes
}

/// The value of the series `name` (with its labels, if any) in exposition text.
fn series(text: &str, name: &str) -> f64 {
    common::metrics_series(text, name).unwrap_or_else(|| panic!("no series {name} in:\n{text}"))
}

#[test]
fn reclaim_agent_pages_out_be_memory_and_never_lc() {
    let test = "reclaim_agent_pages_out_be_memory_and_never_lc";
    let Some((python, _swap)) = support::python_and_swap_v1_or_v2(test, 768 * MIB) else {
        return;
    };
    let exe = env!("CARGO_BIN_EXE_memcolo");
    let tmp = tempfile::tempdir().unwrap();
    let scratch = Scratch::new("reclaim-e2e");
    let v2 = scratch.cg.version() == CgroupVersion::V2;
    let scope = scratch.cg.path().to_path_buf();
    scratch.cg.write_limit(Limit::Bytes(256 * MIB)).unwrap();
    let lc_group = scratch.cg.create_child("lc").unwrap();
    if v2 {
        std::fs::write(lc_group.path().join("memory.swap.max"), "0").unwrap();
    } else {
        std::fs::write(lc_group.path().join("memory.swappiness"), "0").unwrap();
    }
    let be_group = scratch.cg.create_child("be").unwrap();
    // A limit of its own, well above the scope's, that the agent's v1 limit steps
    // lower and must always put back.
    be_group.write_limit(Limit::Bytes(1 << 30)).unwrap();
    let be_limit = limit_of(be_group.path());
    let lc_limit = limit_of(lc_group.path());
    let scope_limit = limit_of(&scope);

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let maddr = format!("127.0.0.1:{port}");
    let cfg = tmp.path().join("agent.toml");
    // Hermit's workers alone: on v2 the red zone's BE `memory.high` cap would make the
    // kernel take the BE group's memory first, and this test measures the workers.
    std::fs::write(
        &cfg,
        "[reclaim]\nenabled = true\nmax_workers = 1\nturnaround_poll_ms = 100\n\
         [m3]\nbe_memory_high = false\n",
    )
    .unwrap();
    let ev = tmp.path().join("events.jsonl");
    let state = tmp.path().join("state");
    let (mut agent, sock) = start_agent(
        exe,
        tmp.path(),
        &cfg,
        &scope,
        &maddr,
        &["--kill-after-s", "3600"],
    );

    let status = || agent_status(exe, &sock);
    let run = |class: &str, group: &str, mib: u64, step: u64| {
        let mut c = Command::new(exe);
        c.args(["run", "--class", class, "--cgroup", group, "--socket"])
            .arg(&sock)
            .args(["--", python, "-c", support::HOLDER])
            .args([mib.to_string(), step.to_string()]);
        Holder::spawn(c)
    };
    // The LC first, then the BE, filling 8 MiB every 50 ms.
    let mut lc = run("lc", "lc", 16, 0);
    let mut be = run("be", "be", 320, 8);
    let pid_of = |class: &str| -> i32 {
        status()["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["class"] == class)
            .unwrap_or_else(|| panic!("no {class} process registered"))["pid"]
            .as_i64()
            .unwrap() as i32
    };
    let lc_pid = pid_of("lc");
    let be_pid = pid_of("be");
    let lc_never_targeted = |s: &Value| {
        let targets = s["reclaim"]["targets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for t in &targets {
            let id = t["id"].as_str().unwrap();
            assert!(
                !id.contains(&lc_group.path().display().to_string())
                    && id != format!("pid:{lc_pid}"),
                "the LC is a reclaim target: {targets:?}"
            );
        }
    };

    // (1) The workers reclaim the BE group into swap, through the group (a target
    // out with a worker is not listed, so it is enough to see it listed once).
    let be_path = be_group.path().to_path_buf();
    let be_target = format!("cgroup:{}", be_path.display());
    let mut be_listed = false;
    wait_for(
        "the agent reclaiming 32 MiB of the BE group into swap, the group listed as a target",
        Duration::from_secs(120),
        || {
            let s = status();
            lc_never_targeted(&s);
            let r = &s["reclaim"];
            be_listed |= r["targets"].as_array().into_iter().flatten().any(|t| {
                t["id"].as_str() == Some(be_target.as_str()) && t["mechanism"] == "cgroup"
            });
            be_listed
                && r["reclaimed_bytes_total"].as_u64().unwrap_or(0) >= 32 * MIB
                && swap_of(&be_path) >= 32 * MIB
        },
    );
    let s = status();
    assert!(s["reclaim"]["batches_total"].as_u64().unwrap() >= 1, "{s}");
    assert!(stat(&be_path, if v2 { "pgsteal" } else { "total_pgpgout" }) * 4096 >= 32 * MIB);
    let m = common::agent_metrics(&maddr);
    assert!(series(&m, "memcolo_reclaim_bytes_total") >= (32 * MIB) as f64);
    assert!(series(&m, "memcolo_reclaim_cpu_seconds_total") > 0.0);
    assert_eq!(series(&m, "memcolo_reclaim_workers{kind=\"budget\"}"), 1.0);

    // (2) Every BE byte is intact; reading it back refaults what was swapped.
    assert!(be.intact(), "BE data changed by reclaim");

    // (3) Those refaults reach the sampled page turnaround.
    let started = Instant::now();
    // What steered the back-off meanwhile: the sampled median of recent evictions
    // once enough of them are sampled, the Little's-law mean before.
    let mut steering: Vec<String> = Vec::new();
    let mut note = |r: &Value| {
        let seen = format!(
            "{}{} s ({}; mean {} s; recent {})",
            if r["turnaround_at_least"] == true {
                ">"
            } else {
                ""
            },
            r["turnaround_s"],
            r["turnaround_source"].as_str().unwrap_or("?"),
            r["mean_turnaround_s"],
            r["turnaround_sampled"]["recent"],
        );
        if steering.last() != Some(&seen) {
            steering.push(seen);
        }
    };
    wait_for(
        "sampled refaults in status",
        Duration::from_secs(60),
        || {
            let r = status()["reclaim"].clone();
            note(&r);
            r["turnaround_sampled"]["refaulted_total"].as_u64() > Some(0)
        },
    );
    let r = status()["reclaim"].clone();
    note(&r);
    let t = r["turnaround_sampled"].clone();
    eprintln!(
        "{test}: reclaimed {} MiB in {} batches ({} CPU s/GiB); BE swap {} MiB; \
         sampled turnaround p50 {} s p90 {} s p99 {} s over {} refaults, {} followed, \
         sampler {} CPU s",
        r["reclaimed_bytes_total"].as_u64().unwrap_or(0) >> 20,
        r["batches_total"],
        r["cpu_seconds_per_gib"],
        swap_of(&be_path) >> 20,
        t["p50_s"],
        t["p90_s"],
        t["p99_s"],
        t["refaulted"],
        t["tracked"],
        t["cpu_seconds_total"],
    );
    eprintln!("{test}: steering turnaround seen: {steering:#?}");
    // The back-off steers on the sampled median once 16 recent evictions back it
    // (how many do depends on the machine's timing, so both branches are checked).
    let recent = &t["recent"];
    if recent["pages"].as_u64().unwrap_or(0) >= 16 {
        assert_eq!(r["turnaround_source"], "sampled", "{r}");
        assert_eq!(r["turnaround_s"], recent["turnaround_s"], "{r}");
        assert_eq!(r["turnaround_at_least"], recent["at_least"], "{r}");
    } else {
        assert_ne!(r["turnaround_source"], "sampled", "{r}");
    }
    let p50 = t["p50_s"].as_f64().unwrap();
    assert!(p50 > 0.0 && p50 <= t["horizon_s"].as_f64().unwrap(), "{t}");
    let m = common::agent_metrics(&maddr);
    assert!(series(&m, "memcolo_reclaim_page_turnaround_sampled_seconds_count") >= 1.0);
    assert!(started.elapsed() < Duration::from_secs(60));

    // (4) No LC page was ever swapped out, and its data is intact.
    let lc_status = std::fs::read_to_string(format!("/proc/{lc_pid}/status")).unwrap();
    let vm_swap = lc_status
        .lines()
        .find(|l| l.starts_with("VmSwap:"))
        .unwrap()
        .to_string();
    assert_eq!(
        vm_swap.split_whitespace().nth(1),
        Some("0"),
        "LC in swap: {vm_swap}"
    );
    assert_eq!(swap_of(lc_group.path()), 0);
    assert!(lc.intact());
    lc_never_targeted(&status());

    // (5) Nobody was killed.
    let s = status();
    assert_eq!(s["counters"]["kills"], 0);
    let events = std::fs::read_to_string(&ev).unwrap_or_default();
    assert!(!events.contains("\"kill\""), "{events}");
    assert_eq!(scratch.cg.read_events().unwrap().oom_kill, 0);
    for pid in [lc_pid, be_pid] {
        // SAFETY: signal 0 only checks that the process exists.
        assert_eq!(unsafe { libc::kill(pid, 0) }, 0, "process {pid} is gone");
    }

    // (6) SIGTERM while the BE refaults its whole set again and the workers page it
    // back out: the agent stops, every limit is as it was, no journal is left.
    let batches = s["reclaim"]["batches_total"].as_u64().unwrap();
    be.send("touch");
    wait_for("the workers busy again", Duration::from_secs(60), || {
        status()["reclaim"]["batches_total"].as_u64().unwrap() > batches
    });
    let exit = agent
        .terminate(Duration::from_secs(60))
        .expect("the agent did not stop within 60 s of SIGTERM");
    assert!(exit.success(), "agent exit: {exit}");
    be.expect("touched");
    assert_eq!(limit_of(&be_path), be_limit);
    assert_eq!(limit_of(lc_group.path()), lc_limit);
    assert_eq!(limit_of(&scope), scope_limit);
    let journals: Vec<_> = std::fs::read_dir(&state)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("reclaim-step-"))
                .collect()
        })
        .unwrap_or_default();
    assert!(journals.is_empty(), "journals left: {journals:?}");
    assert!(be.intact(), "BE data changed");
    drop((lc, be));
    drop(scratch);
}

/// The scheduler's allocation rate against a known allocator: fio, registered BE in
/// a 768 MiB scope, reads a sparse file through the page cache at a paced 64 MiB/s
/// (one thread, 1 MiB reads); on Linux 6.x the page cache comes in large folios,
/// which v1 `total_pgpgin` counts as one event each, so the agent must scale the
/// charges to bytes. The agent runs with its defaults (Hermes advice on: the core
/// drops the file's cache as usage passes its threshold, and the readahead restarts
/// in small folios). Asserts that the median `alloc_rate_bytes_per_s` in status after
/// the first 5 s is within 0.5x..2x of the rate fio reports it read at (its own
/// measurement, so the bound does not depend on the machine's speed). Needs root,
/// cgroup v1 and fio; elsewhere it says why and passes without running.
#[test]
fn reclaim_allocation_rate_follows_a_page_cache_streamer() {
    let test = "reclaim_allocation_rate_follows_a_page_cache_streamer";
    if !support::real_cgroup_v1_available(test) {
        return;
    }
    if Command::new("fio").arg("--version").output().is_err() {
        support::cannot_run(test, "no fio");
        return;
    }
    let exe = env!("CARGO_BIN_EXE_memcolo");
    let tmp = tempfile::tempdir().unwrap();
    let scratch = Scratch::new("reclaim-rate");
    let scope = scratch.cg.path().to_path_buf();
    scratch.cg.write_limit(Limit::Bytes(768 * MIB)).unwrap();
    let data = tmp.path().join("sparse");
    std::fs::File::create(&data)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    let cfg = tmp.path().join("agent.toml");
    std::fs::write(&cfg, "[reclaim]\nenabled = true\n").unwrap();
    let (_agent, sock) = start_agent(exe, tmp.path(), &cfg, &scope, "127.0.0.1:0", &[]);
    let fio_out = tmp.path().join("fio.json");
    let mut fio = Command::new(exe)
        .args(["run", "--class", "be", "--cgroup", "be", "--socket"])
        .arg(&sock)
        .args([
            "--",
            "fio",
            "--thread",
            "--name=stream",
            "--rw=read",
            "--bs=1m",
        ])
        .args([
            "--ioengine=psync",
            "--rate=64m",
            "--time_based",
            "--runtime=14",
        ])
        .args(["--invalidate=1", "--output-format=json"])
        .arg(format!("--filename={}", data.display()))
        .arg(format!("--output={}", fio_out.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut rates = Vec::new();
    let mut scales = Vec::new();
    let exit = loop {
        if let Some(st) = fio.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "fio did not end");
        std::thread::sleep(Duration::from_millis(100));
        if t0.elapsed() >= Duration::from_secs(5) {
            let r = agent_status(exe, &sock)["reclaim"].clone();
            rates.extend(r["alloc_rate_bytes_per_s"].as_f64());
            scales.extend(r["charge_scale"].as_f64());
        }
    };
    assert!(exit.success(), "fio: {exit}");
    let report: Value = serde_json::from_slice(&std::fs::read(&fio_out).unwrap()).unwrap();
    let fio_rate = report["jobs"][0]["read"]["bw_bytes"].as_f64().unwrap();
    assert!(rates.len() >= 10, "only {} status samples", rates.len());
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (rate, scale) = (median(&mut rates), median(&mut scales));
    eprintln!(
        "{test}: fio read {:.1} MiB/s; the agent's allocation rate, median of {} samples \
         after 5 s: {:.1} MiB/s ({:.2}x), charge scale {scale:.0}",
        fio_rate / MIB as f64,
        rates.len(),
        rate / MIB as f64,
        rate / fio_rate
    );
    assert!(fio_rate > 0.0);
    assert!(
        rate >= 0.5 * fio_rate && rate <= 2.0 * fio_rate,
        "allocation rate {rate:.0} B/s against fio's {fio_rate:.0} B/s"
    );
    drop(scratch);
}

/// The back-off on a BE job that thrashes: a 320 MiB BE process in a 256 MiB scope
/// reads its whole set again and again, so what the workers evict comes back within
/// one pass. The agent runs with `thrash_turnaround_ms = 30000` (a pass takes seconds,
/// so the bound does not depend on the machine's speed) and a proactive band of up to
/// a quarter of the scope (`max_low_ratio = 0.25`; at the default 2 % the band of a
/// 256 MiB scope is below the 32 MiB high-mark floor and backing off has nothing to
/// cut; in the runs so far the burst-sized high mark itself reached the band's
/// ceiling, a quarter of the scope, so the back-off still had nothing to cut and only
/// its state shows). Asserts that (1) the page turnaround falls below the threshold
/// and the scheduler backs off (`backoffs_total`, `backing_off` in status), (2) while
/// backed off the low mark is at most one batch (16 MiB) above the high mark, (3) the high
/// mark is kept (the workers still reclaim below it) and nothing is killed, (4) once
/// the passes stop the back-off runs out, and (5) the BE data is intact. The status
/// seen is printed, to show what the back-off does. Needs root, cgroup v1, zram and
/// python3; elsewhere it says why and passes without running.
#[test]
fn reclaim_backs_off_while_a_be_job_thrashes_and_recovers() {
    let test = "reclaim_backs_off_while_a_be_job_thrashes_and_recovers";
    let Some((python, _swap)) = support::python_and_swap(test, 768 * MIB) else {
        return;
    };
    let exe = env!("CARGO_BIN_EXE_memcolo");
    let tmp = tempfile::tempdir().unwrap();
    let scratch = Scratch::new("reclaim-backoff");
    let scope = scratch.cg.path().to_path_buf();
    scratch.cg.write_limit(Limit::Bytes(256 * MIB)).unwrap();
    let be_group = scratch.cg.create_child("be").unwrap();
    be_group.write_limit(Limit::Bytes(1 << 30)).unwrap();
    let cfg = tmp.path().join("agent.toml");
    std::fs::write(
        &cfg,
        "[reclaim]\nenabled = true\nmax_workers = 1\nturnaround_poll_ms = 100\n\
         max_low_ratio = 0.25\nthrash_turnaround_ms = 30000\nbackoff_periods = 3\n",
    )
    .unwrap();
    let (_agent, sock) = start_agent(
        exe,
        tmp.path(),
        &cfg,
        &scope,
        "127.0.0.1:0",
        &["--kill-after-s", "3600"],
    );
    let status = || agent_status(exe, &sock)["reclaim"].clone();
    let mut c = Command::new(exe);
    c.args(["run", "--class", "be", "--cgroup", "be", "--socket"])
        .arg(&sock)
        .args(["--", python, "-c", support::HOLDER, "320", "8"]);
    let mut be = Holder::spawn(c);
    wait_for(
        "the agent reclaiming 32 MiB of the BE job",
        Duration::from_secs(120),
        || status()["reclaimed_bytes_total"].as_u64().unwrap_or(0) >= 32 * MIB,
    );
    let t0 = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    let mut note = |r: &Value| {
        let line = format!(
            "{:5.1} s {:>11} headroom {:>3} MiB low {:>3} high {:>3} turnaround {}{} ({}) \
             backing_off {} backoffs {}",
            t0.elapsed().as_secs_f64(),
            r["state"].as_str().unwrap_or("?"),
            r["headroom_bytes"].as_u64().unwrap_or(0) >> 20,
            r["low_mark_bytes"].as_u64().unwrap_or(0) >> 20,
            r["high_mark_bytes"].as_u64().unwrap_or(0) >> 20,
            if r["turnaround_at_least"] == true {
                ">"
            } else {
                ""
            },
            r["turnaround_s"],
            r["turnaround_source"].as_str().unwrap_or("?"),
            r["backing_off"],
            r["backoffs_total"],
        );
        seen.push(line);
    };
    let before = status();
    note(&before);
    assert_eq!(before["backoffs_total"], 0, "{before}");

    // (1)-(3) Passes over the whole set until the scheduler has backed off, and a few
    // more while it stays backed off.
    let mut backed_off_views = 0;
    let mut passes = 0;
    while backed_off_views < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "no back-off within 180 s of passes:\n{}",
            seen.join("\n")
        );
        be.touch();
        passes += 1;
        let r = status();
        note(&r);
        if r["backing_off"] == true {
            backed_off_views += 1;
            let (low, high) = (
                r["low_mark_bytes"].as_u64().unwrap(),
                r["high_mark_bytes"].as_u64().unwrap(),
            );
            assert!(low <= high + 16 * MIB, "band not cut: {r}");
            assert!(high >= 32 * MIB, "high mark abandoned: {r}");
            assert!(r["backoffs_total"].as_u64().unwrap() >= 1, "{r}");
            assert!(r["turnaround_s"].as_f64().unwrap() < 30.0, "{r}");
        }
    }
    let reclaimed = status()["reclaimed_bytes_total"].as_u64().unwrap();
    // (4) The passes stop: nothing refaults, and the back-off runs out.
    wait_for(
        "the back-off to run out once the BE job is idle",
        Duration::from_secs(90),
        || {
            let r = status();
            let done = r["backing_off"] == false;
            if done {
                note(&r);
            }
            done
        },
    );
    eprintln!(
        "{test}: {passes} passes over 320 MiB in a 256 MiB scope; reclaimed {} MiB; \
         status seen:\n{}",
        reclaimed >> 20,
        seen.join("\n")
    );
    // (5) Intact, and nobody killed.
    assert!(be.intact(), "BE data changed");
    let oom = std::fs::read_to_string(scope.join("memory.oom_control")).unwrap();
    assert!(oom.lines().any(|l| l == "oom_kill 0"), "{oom}");
    drop(be);
    drop(scratch);
}
