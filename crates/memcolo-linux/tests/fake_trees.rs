//! Readers against fake procfs and cgroupfs trees built from real kernel text.

mod common;

use common::*;
use memcolo_linux::cgroup::{
    cgroup2_mount, own_memory_cgroup, v1_memory_mount, CgroupVersion, Limit, MemoryCgroup,
};
use memcolo_linux::events::v1_pressure_level_eventfd;
use memcolo_linux::fake::{dir, file, symlink};
use memcolo_linux::procfs::{OpenFile, ProcFs};
use memcolo_linux::scope::Scope;
use memcolo_linux::Error;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

const KIB: u64 = 1024;

fn setup() -> (tempfile::TempDir, ProcFs) {
    let tmp = tempfile::tempdir().unwrap();
    let proc_root = fake_procfs(&tmp.path().join("proc"));
    (tmp, ProcFs::new(proc_root))
}

fn assert_parse_error_names(err: Error, path: &Path) {
    match &err {
        Error::Parse { path: p, .. } => assert_eq!(p, path, "{err}"),
        other => panic!("expected a parse error for {}, got {other}", path.display()),
    }
}

#[test]
fn meminfo_from_real_text() {
    let (_tmp, procfs) = setup();
    let m = procfs.read_meminfo().unwrap();
    assert_eq!(m.mem_total_bytes, 24_684_092 * KIB);
    assert_eq!(m.mem_free_bytes, 24_335_396 * KIB);
    assert_eq!(m.mem_available_bytes, 24_329_592 * KIB);
    assert_eq!(m.buffers_bytes, 1_436 * KIB);
    assert_eq!(m.cached_bytes, 114_940 * KIB);
    assert_eq!(m.active_file_bytes, 22_140 * KIB);
    assert_eq!(m.inactive_file_bytes, 85_264 * KIB);
    assert_eq!(m.anon_pages_bytes, 15_524 * KIB);
    assert_eq!(m.shmem_bytes, 8_856 * KIB);
    assert_eq!(m.swap_total_bytes, 0);
    assert_eq!(m.swap_free_bytes, 0);
    // Unit-less lines are kept as counts.
    assert_eq!(m.raw["HugePages_Total"], 0);
    assert_eq!(m.raw["MemTotal"], m.mem_total_bytes);
}

#[test]
fn meminfo_malformed_or_incomplete() {
    let (_tmp, procfs) = setup();
    let path = procfs.path().join("meminfo");
    for text in [
        "MemTotal: 10 kB\n".to_string(),
        fixture("meminfo").replace("MemAvailable:", "MemAvail:"),
        fixture("meminfo").replace("Cached:           114940 kB", "Cached: lots kB"),
        fixture("meminfo").replace("Buffers:            1436 kB", "Buffers 1436 kB"),
        fixture("meminfo").replace("Buffers:            1436 kB", "Buffers: 1436 MB"),
    ] {
        std::fs::write(&path, &text).unwrap();
        assert_parse_error_names(procfs.read_meminfo().unwrap_err(), &path);
    }
    std::fs::remove_file(&path).unwrap();
    assert!(procfs.read_meminfo().unwrap_err().is_not_found());
}

#[test]
fn vmstat_from_real_text() {
    let (_tmp, procfs) = setup();
    let v = procfs.read_vmstat().unwrap();
    assert_eq!(v["pgmajfault"], 1996);
    assert_eq!(v["workingset_refault_file"], 260_133);
    assert_eq!(v["nr_free_pages"], 1_181_053);
    assert_eq!(v.len(), fixture("vmstat").lines().count());
    let path = procfs.path().join("vmstat");
    std::fs::write(&path, "pgmajfault 12 extra\n").unwrap();
    assert_parse_error_names(procfs.read_vmstat().unwrap_err(), &path);
    std::fs::write(&path, "pgmajfault -1\n").unwrap();
    assert_parse_error_names(procfs.read_vmstat().unwrap_err(), &path);
}

#[test]
fn pressure_files() {
    let (_tmp, procfs) = setup();
    let cpu = procfs.read_pressure("cpu").unwrap();
    assert_eq!(cpu.some.avg10, 2.85);
    assert_eq!(cpu.some.total_us, 9_566_251);
    assert_eq!(cpu.full.unwrap().total_us, 0);
    let mem = procfs.read_pressure("memory").unwrap();
    assert_eq!(mem.some.avg10, 0.14);
    assert_eq!(mem.some.total_us, 364_676);
    assert_eq!(mem.full.unwrap().total_us, 86_163);
    assert!(procfs.read_pressure("irq").unwrap_err().is_not_found());
    assert!(matches!(
        procfs.read_pressure("../meminfo"),
        Err(Error::InvalidArgument { .. })
    ));
    let path = procfs.path().join("pressure/io");
    std::fs::write(&path, "some avg10=0.00 total=3\n").unwrap();
    assert_parse_error_names(procfs.read_pressure("io").unwrap_err(), &path);
}

#[test]
fn pids_lists_numeric_entries_only() {
    let (_tmp, procfs) = setup();
    create_tree_in(
        procfs.path(),
        vec![dir("1", vec![]), dir("42", vec![]), dir("sys", vec![])],
    );
    assert_eq!(procfs.pids().unwrap(), vec![1, 42, FIXTURE_PID]);
}

fn create_tree_in(root: &Path, entries: Vec<memcolo_linux::fake::FakeEntry>) {
    memcolo_linux::fake::create_tree(root, &entries).unwrap();
}

#[test]
fn pid_stat_status_cmdline_cgroup_from_real_text() {
    let (_tmp, procfs) = setup();
    let st = procfs.read_pid_stat(FIXTURE_PID).unwrap();
    assert_eq!(st.pid, FIXTURE_PID);
    assert_eq!(st.comm, "db (x) srv");
    assert_eq!(st.state, 'S');
    assert_eq!(st.ppid, 1);
    assert_eq!((st.minflt, st.majflt), (3100, 6));
    assert_eq!((st.utime_ticks, st.stime_ticks), (0, 1));
    assert_eq!(st.starttime_ticks, 23_079);
    assert_eq!(st.rss_pages, 4291);

    let status = procfs.read_pid_status(FIXTURE_PID).unwrap();
    assert_eq!(status.name, "db (x) srv");
    assert_eq!(status.tgid, FIXTURE_PID);
    assert_eq!(status.uid, 0);
    assert_eq!(status.vm_rss_bytes, 17_260 * KIB);
    assert_eq!(status.vm_hwm_bytes, 17_260 * KIB);
    assert_eq!(status.rss_anon_bytes, 11_680 * KIB);
    assert_eq!(status.rss_file_bytes, 5_580 * KIB);
    assert_eq!(status.rss_shmem_bytes, 0);
    assert_eq!(status.vm_swap_bytes, 0);
    assert_eq!(
        status.vm_rss_bytes,
        status.rss_anon_bytes + status.rss_file_bytes + status.rss_shmem_bytes
    );

    let cmdline = procfs.read_pid_cmdline(FIXTURE_PID).unwrap();
    assert_eq!(cmdline.len(), 5);
    assert_eq!(cmdline[0], "/var/tmp/fx/db (x) srv");
    assert_eq!(cmdline[3], "--flag");
    assert_eq!(cmdline[4], "two words");

    let cg = procfs.read_pid_cgroup(FIXTURE_PID).unwrap();
    let mem = cg.iter().find(|l| l.controllers == ["memory"]).unwrap();
    assert_eq!(mem.hierarchy_id, 4);
    assert_eq!(mem.path, "/process_api/84b366b038052b2f9523859a0a062390");
    assert_eq!(cg.last().unwrap().hierarchy_id, 0);
}

#[test]
fn smaps_rollup_and_maps_from_real_text() {
    let (_tmp, procfs) = setup();
    std::fs::write(
        procfs.path().join(format!("{FIXTURE_PID}/smaps_rollup")),
        fixture("pid_smaps_rollup"),
    )
    .unwrap();
    let r = procfs.read_pid_smaps_rollup(FIXTURE_PID).unwrap();
    let text = fixture("pid_smaps_rollup");
    let kib = |key: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{key}:")))
            .unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * KIB
    };
    assert_eq!(r.rss_bytes, kib("Rss"));
    assert_eq!(r.pss_bytes, kib("Pss"));
    assert_eq!(r.pss_anon_bytes, kib("Pss_Anon"));
    assert_eq!(r.pss_file_bytes, kib("Pss_File"));
    assert_eq!(r.anonymous_bytes, kib("Anonymous"));
    assert_eq!(r.private_dirty_bytes, kib("Private_Dirty"));
    assert_eq!(r.swap_bytes, 0);
    assert!(r.rss_bytes > 0 && r.pss_bytes <= r.rss_bytes);
    assert_eq!(
        r.rss_bytes,
        r.shared_clean_bytes + r.shared_dirty_bytes + r.private_clean_bytes + r.private_dirty_bytes
    );
    let path = procfs.path().join(format!("{FIXTURE_PID}/smaps_rollup"));
    std::fs::write(&path, "Pss: 4 kB\n").unwrap();
    assert_parse_error_names(
        procfs.read_pid_smaps_rollup(FIXTURE_PID).unwrap_err(),
        &path,
    );
    std::fs::write(&path, "Rss: 4 MB\n").unwrap();
    assert_parse_error_names(
        procfs.read_pid_smaps_rollup(FIXTURE_PID).unwrap_err(),
        &path,
    );
    std::fs::write(&path, "").unwrap(); // a kernel thread
    assert_eq!(
        procfs.read_pid_smaps_rollup(FIXTURE_PID).unwrap().rss_bytes,
        0
    );

    let maps = procfs.read_pid_maps(FIXTURE_PID).unwrap();
    assert_eq!(maps.len(), fixture("pid_maps").lines().count());
    let data = maps
        .iter()
        .find(|m| m.path.as_deref() == Some("/var/tmp/fx/data.bin"))
        .unwrap();
    assert_eq!(data.len_bytes(), 1 << 20);
    assert_eq!(data.perms, "r--s");
    assert_eq!(data.ino, 813_273);
    assert_eq!(data.dev, libc::makedev(0xfe, 0));
    assert!(data.is_file_backed());
    assert!(maps
        .iter()
        .any(|m| m.path.as_deref() == Some("[heap]") && !m.is_file_backed()));
    assert!(maps.iter().any(|m| m.path.is_none()));
    assert!(maps.windows(2).all(|w| w[0].end <= w[1].start));
    // The mapped fixture file shows up among the process's files.
    let files =
        memcolo_linux::procfs::parse_maps_files(&fixture("pid_maps"), Path::new("/proc/8928/maps"))
            .unwrap();
    assert!(files
        .iter()
        .any(|f| f.path == Path::new("/var/tmp/fx/data.bin") && f.ino == 813_273));
    let maps_path = procfs.path().join(format!("{FIXTURE_PID}/maps"));
    std::fs::write(&maps_path, "7f00-7e00 r--p 00000000 00:00 0\n").unwrap();
    assert_parse_error_names(procfs.read_pid_maps(FIXTURE_PID).unwrap_err(), &maps_path);
}

#[test]
fn pid_files_malformed_and_vanished() {
    let (_tmp, procfs) = setup();
    let stat = procfs.path().join(format!("{FIXTURE_PID}/stat"));
    std::fs::write(&stat, "8928 (db (x) srv) S 1 8922\n").unwrap();
    assert_parse_error_names(procfs.read_pid_stat(FIXTURE_PID).unwrap_err(), &stat);
    let status = procfs.path().join(format!("{FIXTURE_PID}/status"));
    std::fs::write(
        &status,
        fixture("pid_status").replace("VmRSS:\t   17260 kB", "VmRSS:\t   17260"),
    )
    .unwrap();
    assert_parse_error_names(procfs.read_pid_status(FIXTURE_PID).unwrap_err(), &status);
    std::fs::write(&status, "Uid:\t0\t0\t0\t0\n").unwrap();
    assert_parse_error_names(procfs.read_pid_status(FIXTURE_PID).unwrap_err(), &status);
    // An exited process: every reader reports not-found.
    assert!(procfs.read_pid_stat(999_999).unwrap_err().is_not_found());
    assert!(procfs.read_pid_status(999_999).unwrap_err().is_not_found());
    assert!(procfs.read_pid_cmdline(999_999).unwrap_err().is_not_found());
    assert!(procfs.read_pid_cgroup(999_999).unwrap_err().is_not_found());
    assert!(procfs.read_pid_files(999_999).unwrap_err().is_not_found());
}

#[test]
fn pid_files_from_fds_and_maps_deduplicated() {
    let (tmp, procfs) = setup();
    let data = tmp.path().join("data dir");
    std::fs::create_dir(&data).unwrap();
    let open_only = data.join("open-only.log");
    let both = data.join("both.bin");
    let mapped_only = data.join("mapped-only.so");
    for f in [&open_only, &both, &mapped_only] {
        std::fs::write(f, b"x").unwrap();
    }
    let meta = |p: &PathBuf| std::fs::metadata(p).unwrap();
    let maps_line = |p: &PathBuf| {
        let m = meta(p);
        let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
        format!(
            "7f0000000000-7f0000001000 r--s 00000000 {major:02x}:{minor:02x} {:<27}{}\n",
            m.ino(),
            p.display()
        )
    };
    let maps = format!(
        "00400000-0041f000 rw-p 00000000 00:00 0 \n{}{}{}7f0000002000-7f0000003000 rw-s 00000000 00:01 99 /memfd:x (deleted)\n",
        maps_line(&both),
        maps_line(&mapped_only),
        maps_line(&mapped_only),
    );
    let pid_dir = procfs.path().join("77");
    dir(
        "77",
        vec![
            file("maps", maps),
            dir(
                "fd",
                vec![
                    symlink("0", "/dev/null"),
                    symlink("1", "pipe:[13701]"),
                    symlink("2", "socket:[555]"),
                    symlink("3", &open_only),
                    symlink("4", &both),
                    symlink("5", &both),
                    symlink("6", "anon_inode:[eventfd]"),
                    symlink("7", data.join("gone.txt (deleted)")),
                    symlink("8", &data), // a directory
                    symlink("9", data.join("closed-meanwhile")),
                ],
            ),
        ],
    )
    .create_in(procfs.path())
    .unwrap();
    assert!(pid_dir.exists());
    let files = procfs.read_pid_files(77).unwrap();
    let expect = |p: &PathBuf| OpenFile {
        path: p.clone(),
        dev: meta(p).dev(),
        ino: meta(p).ino(),
    };
    let mut want = vec![expect(&both), expect(&mapped_only), expect(&open_only)];
    want.sort();
    assert_eq!(files, want);
}

#[test]
fn cgroup_v1_fake_group() {
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path();
    let path = fake_v1_group(
        parent,
        "be",
        61_501_440,
        9_223_372_036_854_771_712,
        &[30, 10],
        vec![],
    );
    fake_v1_group(&path, "child", 4096, 1 << 30, &[20, 10], vec![]);
    let cg = MemoryCgroup::open(&path).unwrap();
    assert_eq!(cg.version(), CgroupVersion::V1);
    assert_eq!(cg.read_usage_bytes().unwrap(), 61_501_440);
    assert_eq!(cg.read_limit().unwrap(), Limit::Max);
    let stat = cg.read_memory_stat().unwrap();
    assert_eq!(stat.file_bytes, 40_239_104); // total_cache
    assert_eq!(stat.anon_bytes, 1_724_416); // total_rss
    assert_eq!(stat.inactive_file_bytes, 38_612_992);
    assert_eq!(stat.active_file_bytes, 1_626_112);
    assert_eq!(stat.swap_bytes, 0);
    assert_eq!(stat.workingset_refault, Some(14_747));
    assert_eq!(stat.pgmajfault, Some(47));
    assert_eq!(cg.read_pressure().unwrap(), None);
    assert!(matches!(cg.reclaim(4096), Err(Error::Unsupported { .. })));
    assert_eq!(cg.read_peak_bytes().unwrap(), 61_501_440 + 4096);
    let ev = cg.read_events().unwrap();
    assert_eq!((ev.max, ev.oom_kill, ev.under_oom), (3, 0, Some(false)));
    assert_eq!((ev.low, ev.high, ev.oom), (None, None, None));
    assert!(matches!(cg.read_high(), Err(Error::Unsupported { .. })));
    assert!(matches!(
        cg.write_high(Limit::Max),
        Err(Error::Unsupported { .. })
    ));
    let oom = path.join("memory.oom_control");
    std::fs::write(&oom, "oom_kill_disable 0\nunder_oom 1\noom_kill 4\n").unwrap();
    assert_eq!(cg.read_events().unwrap().under_oom, Some(true));
    assert_eq!(cg.read_events().unwrap().oom_kill, 4);
    std::fs::write(&oom, "oom_kill_disable 0\n").unwrap();
    assert_parse_error_names(cg.read_events().unwrap_err(), &oom);
    assert_eq!(cg.read_procs().unwrap(), vec![10, 30]);
    assert_eq!(cg.read_procs_recursive().unwrap(), vec![10, 20, 30]);
    let children = cg.children().unwrap();
    assert_eq!(children.len(), 1);
    assert_eq!(children[0].read_limit().unwrap(), Limit::Bytes(1 << 30));

    cg.write_limit(Limit::Bytes(64 << 20)).unwrap();
    assert_eq!(
        std::fs::read_to_string(path.join("memory.limit_in_bytes")).unwrap(),
        "67108864"
    );
    assert_eq!(cg.read_limit().unwrap(), Limit::Bytes(64 << 20));
    cg.write_limit(Limit::Max).unwrap();
    assert_eq!(
        std::fs::read_to_string(path.join("memory.limit_in_bytes")).unwrap(),
        "-1"
    );
    cg.add_proc(55).unwrap();
    assert_eq!(
        std::fs::read_to_string(path.join("cgroup.procs")).unwrap(),
        "55"
    );
    assert!(matches!(cg.add_proc(0), Err(Error::InvalidArgument { .. })));

    // The v1 effective limit comes from hierarchical_memory_limit.
    let stat_path = path.join("memory.stat");
    std::fs::write(
        &stat_path,
        fixture("v1_memory.stat").replace(
            "hierarchical_memory_limit 9223372036854771712",
            "hierarchical_memory_limit 1073741824",
        ),
    )
    .unwrap();
    std::fs::write(path.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
    assert_eq!(cg.read_effective_limit().unwrap(), Limit::Bytes(1 << 30));

    // Malformed files name the path.
    std::fs::write(&stat_path, "total_cache 12\n").unwrap();
    assert_parse_error_names(cg.read_memory_stat().unwrap_err(), &stat_path);
    std::fs::write(&stat_path, "cache twelve\n").unwrap();
    assert_parse_error_names(cg.read_memory_stat().unwrap_err(), &stat_path);
    let usage = path.join("memory.usage_in_bytes");
    std::fs::write(&usage, "-5\n").unwrap();
    assert_parse_error_names(cg.read_usage_bytes().unwrap_err(), &usage);
    let procs = path.join("cgroup.procs");
    std::fs::write(&procs, "12\nabc\n").unwrap();
    assert_parse_error_names(cg.read_procs().unwrap_err(), &procs);
}

#[test]
fn cgroup_v2_fake_group() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("unified");
    dir(
        "unified",
        vec![file("cgroup.controllers", fixture("v2/cgroup.controllers"))],
    )
    .create_in(tmp.path())
    .unwrap();
    let kube = fake_v2_group(&root, "kubepods", &[7], vec![]);
    std::fs::write(kube.join("memory.max"), "1073741824\n").unwrap();
    let path = fake_v2_group(&kube, "burstable", &[9, 8], vec![]);
    let cg = MemoryCgroup::open(&path).unwrap();
    assert_eq!(cg.version(), CgroupVersion::V2);
    assert_eq!(cg.read_usage_bytes().unwrap(), 1_610_612_736);
    assert_eq!(cg.read_limit().unwrap(), Limit::Bytes(2 << 30));
    // The parent's smaller limit binds.
    assert_eq!(cg.read_effective_limit().unwrap(), Limit::Bytes(1 << 30));
    let stat = cg.read_memory_stat().unwrap();
    assert_eq!(stat.anon_bytes, 1 << 30);
    assert_eq!(stat.file_bytes, 512 << 20);
    assert_eq!(stat.inactive_file_bytes, 384 << 20);
    assert_eq!(stat.active_file_bytes, 128 << 20);
    assert_eq!(stat.swap_bytes, 16 << 20); // memory.swap.current
    assert_eq!(stat.workingset_refault, Some(120 + 3456));
    assert_eq!(stat.pgmajfault, Some(321));
    let psi = cg.read_pressure().unwrap().unwrap();
    assert_eq!(psi.some.avg10, 12.5);
    assert_eq!(psi.full.unwrap().total_us, 1_204_770);
    assert_eq!(cg.read_peak_bytes().unwrap(), 1_879_048_192);
    let ev = cg.read_events().unwrap();
    assert_eq!(ev.low, Some(0));
    assert_eq!(ev.high, Some(1520));
    assert_eq!(ev.max, 37);
    assert_eq!(ev.oom, Some(2));
    assert_eq!(ev.oom_kill, 1);
    assert_eq!(ev.under_oom, None);
    assert_eq!(cg.read_high().unwrap(), Limit::Bytes(1_610_612_736));
    cg.write_high(Limit::Max).unwrap();
    assert_eq!(cg.read_high().unwrap(), Limit::Max);
    let events = path.join("memory.events");
    std::fs::write(&events, "low 0\nhigh x\n").unwrap();
    assert_parse_error_names(cg.read_events().unwrap_err(), &events);
    std::fs::write(&events, "low 0\n").unwrap();
    assert_parse_error_names(cg.read_events().unwrap_err(), &events);
    std::fs::remove_file(path.join("memory.peak")).unwrap();
    assert!(matches!(
        cg.read_peak_bytes(),
        Err(Error::Unsupported { .. })
    ));
    cg.reclaim(1 << 20).unwrap();
    assert_eq!(
        std::fs::read_to_string(path.join("memory.reclaim")).unwrap(),
        "1048576"
    );
    cg.write_limit(Limit::Max).unwrap();
    assert_eq!(
        std::fs::read_to_string(path.join("memory.max")).unwrap(),
        "max"
    );
    assert_eq!(cg.read_limit().unwrap(), Limit::Max);
    assert_eq!(cg.read_effective_limit().unwrap(), Limit::Bytes(1 << 30));
    // The v2 root: no memory.current, but memory in cgroup.controllers; no limit.
    let root_cg = MemoryCgroup::open(&root).unwrap();
    assert_eq!(root_cg.version(), CgroupVersion::V2);
    assert_eq!(root_cg.read_limit().unwrap(), Limit::Max);
    assert!(root_cg.read_procs_recursive().unwrap_err().is_not_found());
    // Not a memory cgroup at all.
    assert!(matches!(
        MemoryCgroup::open(tmp.path()),
        Err(Error::Unsupported { .. })
    ));
    assert!(MemoryCgroup::open(tmp.path().join("nope"))
        .unwrap_err()
        .is_not_found());
    // v1 events are refused on v2.
    assert!(matches!(
        v1_pressure_level_eventfd(&cg, "low", "default"),
        Err(Error::Unsupported { .. })
    ));

    let max = path.join("memory.max");
    std::fs::write(&max, "unlimited\n").unwrap();
    assert_parse_error_names(cg.read_limit().unwrap_err(), &max);
    let pressure = path.join("memory.pressure");
    std::fs::write(&pressure, "some avg10=1\n").unwrap();
    assert_parse_error_names(cg.read_pressure().unwrap_err(), &pressure);
    std::fs::remove_file(&pressure).unwrap();
    assert_eq!(cg.read_pressure().unwrap(), None);
}

#[test]
fn create_child_validates_names() {
    let tmp = tempfile::tempdir().unwrap();
    let path = fake_v1_group(tmp.path(), "g", 0, 0, &[], vec![]);
    let cg = MemoryCgroup::open(&path).unwrap();
    for bad in ["", ".", "..", "a/b", "/abs", "x\0y"] {
        assert!(
            matches!(cg.create_child(bad), Err(Error::InvalidArgument { .. })),
            "{bad:?}"
        );
    }
    // On a plain directory mkdir makes no control files, so the result is not a
    // memory cgroup; prepare one first and check that an existing child is opened.
    fake_v1_group(&path, "scratch", 1, 2, &[], vec![]);
    let child = cg.create_child("scratch").unwrap();
    assert_eq!(child.path(), path.join("scratch"));
    assert_eq!(child.read_usage_bytes().unwrap(), 1);
}

/// The readers on the kernel's own text of a v2 group (`fixtures/v2-guest/`, printed by
/// Linux 6.1 in the guest of `scripts/v2bed/`: memory.max 64 MiB, memory.high 48 MiB,
/// 16 MiB of page cache and 24 MiB of anonymous memory; regenerate with
/// `scripts/v2bed/run.sh` and copy `target/v2bed/fixtures/*` there). Fields the
/// hand-written `fixtures/v2/` lack, such as `oom_group_kill` in memory.events and the
/// 40-odd memory.stat counters, are read past.
#[test]
fn cgroup_v2_group_from_the_kernels_own_text() {
    let tmp = tempfile::tempdir().unwrap();
    let names = [
        "cgroup.controllers",
        "memory.current",
        "memory.max",
        "memory.high",
        "memory.peak",
        "memory.events",
        "memory.stat",
        "memory.pressure",
        "memory.swap.current",
    ];
    let files = names
        .iter()
        .map(|n| file(n, fixture(&format!("v2-guest/{n}"))))
        .collect();
    let path = dir("g", files).create_in(tmp.path()).unwrap();
    let cg = MemoryCgroup::open(&path).unwrap();
    assert_eq!(cg.version(), CgroupVersion::V2);
    assert_eq!(cg.read_limit().unwrap(), Limit::Bytes(64 << 20));
    assert_eq!(cg.read_high().unwrap(), Limit::Bytes(48 << 20));
    let used = cg.read_usage_bytes().unwrap();
    assert!((40 << 20..=64 << 20).contains(&used), "{used}");
    assert!(cg.read_peak_bytes().unwrap() >= used);
    let stat = cg.read_memory_stat().unwrap();
    assert!(stat.anon_bytes >= 24 << 20, "{stat:?}");
    assert!(stat.file_bytes >= 16 << 20, "{stat:?}");
    assert!(
        stat.inactive_file_bytes + stat.active_file_bytes >= 16 << 20,
        "{stat:?}"
    );
    assert_eq!(stat.swap_bytes, 0);
    assert_eq!(stat.workingset_refault, Some(0));
    assert_eq!(stat.pgmajfault, Some(0));
    assert!(stat.raw.contains_key("pgsteal"));
    let ev = cg.read_events().unwrap();
    assert_eq!(
        (ev.low, ev.high, ev.max, ev.oom, ev.oom_kill),
        (Some(0), Some(0), 0, Some(0), 0)
    );
    let psi = cg.read_pressure().unwrap().unwrap();
    assert!(psi.full.is_some());
}

#[test]
fn create_child_on_v2_delegates_memory_first() {
    let tmp = tempfile::tempdir().unwrap();
    let path = fake_v2_group(tmp.path(), "scope", &[], vec![]);
    let cg = MemoryCgroup::open(&path).unwrap();
    let subtree = path.join("cgroup.subtree_control");
    // A child that is a memory cgroup only once its parent enables the controller
    // for its children (here prepared by hand: mkdir makes no files in a fake tree).
    fake_v2_group(&path, "lc", &[], vec![]);
    let child = cg.create_child("lc").unwrap();
    assert_eq!(child.version(), CgroupVersion::V2);
    assert_eq!(std::fs::read_to_string(&subtree).unwrap(), "+memory");
    // Already delegated: nothing is written again.
    std::fs::write(&subtree, "cpu memory\n").unwrap();
    cg.create_child("lc").unwrap();
    assert_eq!(std::fs::read_to_string(&subtree).unwrap(), "cpu memory\n");
    // No cgroup.subtree_control: an error naming it, and no child made.
    std::fs::remove_file(&subtree).unwrap();
    let e = cg.create_child("be").unwrap_err();
    assert!(e.to_string().contains("cgroup.subtree_control"), "{e}");
    assert!(!path.join("be").exists());
}

#[test]
fn mounts_and_own_cgroup() {
    let (tmp, procfs) = setup();
    // The real mounts text of this machine.
    std::fs::write(procfs.path().join("self/mounts"), fixture("mounts")).unwrap();
    assert_eq!(
        v1_memory_mount(&procfs).unwrap(),
        PathBuf::from("/sys/fs/cgroup/memory")
    );
    assert_eq!(
        cgroup2_mount(&procfs).unwrap(),
        PathBuf::from("/sys/fs/cgroup/unified")
    );
    std::fs::write(
        procfs.path().join("self/mounts"),
        "proc /proc proc rw 0 0\n",
    )
    .unwrap();
    assert!(matches!(
        v1_memory_mount(&procfs),
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        cgroup2_mount(&procfs),
        Err(Error::Unsupported { .. })
    ));

    // Fake mounts below the temp dir; own group from self/cgroup (the v1 memory line).
    let (tmp2, procfs) = setup();
    drop(tmp);
    let v1 = tmp2.path().join("cgroup/memory");
    let own = fake_v1_group(
        &v1.join("process_api"),
        "84b366b038052b2f9523859a0a062390",
        5,
        6,
        &[1],
        vec![],
    );
    let cg = own_memory_cgroup(&procfs).unwrap();
    assert_eq!(cg.path(), own);
    assert_eq!(cg.version(), CgroupVersion::V1);

    // A v2-only process: the 0:: line under the cgroup2 mount.
    std::fs::write(procfs.path().join("self/cgroup"), "0::/app.slice\n").unwrap();
    let v2 = fake_v2_group(
        &tmp2.path().join("cgroup/unified"),
        "app.slice",
        &[],
        vec![],
    );
    let cg = own_memory_cgroup(&procfs).unwrap();
    assert_eq!(cg.path(), v2);
    assert_eq!(cg.version(), CgroupVersion::V2);
}

#[test]
fn scope_host_and_cgroup() {
    let (tmp, procfs) = setup();
    let host = Scope::parse("host", procfs.clone()).unwrap();
    assert_eq!(
        host.describe(),
        format!("host ({})", procfs.path().display())
    );
    let s = host.sample().unwrap();
    let m = procfs.read_meminfo().unwrap();
    assert_eq!(s.total_bytes, m.mem_total_bytes);
    assert_eq!(s.used_bytes, m.mem_total_bytes - m.mem_free_bytes);
    assert_eq!(
        s.working_set_bytes,
        m.mem_total_bytes - m.mem_available_bytes
    );
    assert_eq!(s.file_bytes, m.buffers_bytes + m.cached_bytes);
    assert_eq!(s.anon_bytes, m.anon_pages_bytes);
    assert_eq!(s.swap_used_bytes, 0);
    assert!(s.psi.is_some());
    assert_eq!(
        s.refault_anon_pages,
        procfs.read_vmstat().unwrap()["workingset_refault_anon"]
    );
    assert_eq!((s.charged_pages, s.limit_failures), (None, None));
    assert_eq!(s.host_swap_total_bytes, m.swap_total_bytes);
    assert_eq!(s.host_swap_free_bytes, m.swap_free_bytes);
    assert!(host.pids().unwrap().contains(&FIXTURE_PID));

    // A v1 group with a 1 GiB limit, relative to the fake v1 mount.
    let v1 = tmp.path().join("cgroup/memory");
    let be = fake_v1_group(&v1, "be", 600 << 20, 1 << 30, &[3], vec![]);
    fake_v1_group(&be, "job", 1, 1 << 62, &[4], vec![]);
    for spec in [
        "cgroup:be",
        "cgroup:/be",
        &format!("cgroup:{}", be.display()),
    ] {
        let scope = Scope::parse(spec, procfs.clone()).unwrap();
        assert_eq!(
            scope.describe(),
            format!("cgroup:{} (v1)", be.display()),
            "{spec}"
        );
        let s = scope.sample_with_host(&procfs).unwrap();
        assert_eq!(s.total_bytes, 1 << 30);
        assert_eq!(s.used_bytes, 600 << 20);
        assert_eq!(s.working_set_bytes, (600 << 20) - 38_612_992);
        assert_eq!(s.file_bytes, 40_239_104);
        assert_eq!(s.anon_bytes, 1_724_416);
        assert_eq!(s.psi, None);
        assert_eq!(s.charged_pages, Some(29_205));
        assert_eq!(s.refault_anon_pages, 0);
        assert_eq!(s.host_swap_total_bytes, m.swap_total_bytes);
        assert_eq!(scope.pids().unwrap(), vec![3, 4]);
    }
    // Unlimited: the host's MemTotal.
    std::fs::write(be.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
    let scope = Scope::parse("cgroup:be", procfs.clone()).unwrap();
    assert_eq!(
        scope.sample_with_host(&procfs).unwrap().total_bytes,
        m.mem_total_bytes
    );

    // v2, relative to the cgroup2 mount when the v1 mount has no such group.
    let v2 = fake_v2_group(&tmp.path().join("cgroup/unified"), "kubepods", &[], vec![]);
    let scope = Scope::parse("cgroup:kubepods", procfs.clone()).unwrap();
    assert_eq!(scope.describe(), format!("cgroup:{} (v2)", v2.display()));
    let s = scope.sample_with_host(&procfs).unwrap();
    assert_eq!(s.total_bytes, 2 << 30);
    assert_eq!(s.working_set_bytes, 1_610_612_736 - (384 << 20));
    assert_eq!(s.swap_used_bytes, 16 << 20);
    assert_eq!(s.psi.unwrap().some.avg60, 4.2);
    assert_eq!(s.refault_anon_pages, 120);
    assert_eq!(s.charged_pages, None);
    assert_eq!(s.limit_failures, Some(37));

    for bad in ["", "hostx", "cgroup:", "cgroup:nope", "cpu:x"] {
        assert!(
            matches!(
                Scope::parse(bad, procfs.clone()),
                Err(Error::InvalidArgument { .. })
            ),
            "{bad:?}"
        );
    }
}

/// A pid named inside a pid namespace maps to the process directly in that
/// namespace whose last `NSpid` is that pid: not one of another namespace with the
/// same id there, nor one in a namespace below it. Namespaces are `ns/pid` inodes:
/// hard links of one file stand for one namespace.
#[test]
fn pids_named_in_a_pid_namespace_map_to_the_process_in_that_namespace() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let proc_ = tmp.path();
    let ns_file = |name: &str| {
        let p = proc_.join(name);
        std::fs::write(&p, "").unwrap();
        p
    };
    let (host, ctr_a, ctr_b, nested) = (
        ns_file("ns-host"),
        ns_file("ns-a"),
        ns_file("ns-b"),
        ns_file("ns-a-nested"),
    );
    // (pid, namespace, NSpid)
    for (pid, ns, nspid) in [
        (1, &host, "1"),
        (100, &ctr_a, "100\t1"),
        (101, &ctr_a, "101\t2"),
        (200, &ctr_b, "200\t2"),
        (300, &nested, "300\t3\t2"),
    ] {
        let d = proc_.join(pid.to_string());
        std::fs::create_dir_all(d.join("ns")).unwrap();
        std::fs::hard_link(ns, d.join("ns/pid")).unwrap();
        std::fs::write(
            d.join("status"),
            format!("Name:\tp{pid}\nUid:\t0\t0\t0\t0\nNSpid:\t{nspid}\n"),
        )
        .unwrap();
    }
    let procfs = ProcFs::new(proc_);
    let a = std::fs::metadata(&ctr_a).unwrap().ino();
    assert_eq!(procfs.pid_namespace(100).unwrap(), a);
    assert_eq!(procfs.read_pid_status(300).unwrap().nspid, [300, 3, 2]);
    // the nested namespace's process (NSpid 300 3 2) is not one of a's
    let in_a = procfs.pid_namespace_map(a).unwrap();
    assert_eq!(in_a.len(), 2, "{in_a:?}");
    assert_eq!(in_a.get(&1), Some(&100));
    assert_eq!(in_a.get(&2), Some(&101));
    assert_eq!(in_a.get(&3), None);
    let b = std::fs::metadata(&ctr_b).unwrap().ino();
    assert_eq!(procfs.pid_namespace_map(b).unwrap().get(&2), Some(&200));
}
