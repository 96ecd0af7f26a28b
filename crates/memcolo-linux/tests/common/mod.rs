//! Helpers shared by the integration tests: fixtures (real kernel text copied from a
//! Linux 6.18 machine; hand-written cgroup v2 files following the kernel docs in `v2/`,
//! with values chosen for the assertions; and in `v2-guest/` a v2 group's files as
//! Linux 6.1 printed them in the guest of `scripts/v2bed/`) and fake procfs/cgroupfs
//! trees built from them.

#![allow(dead_code)]

use memcolo_linux::fake::{create_tree, dir, file, FakeEntry};
use std::path::{Path, PathBuf};

/// The text of `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The pid whose files `pid_*` fixtures hold.
pub const FIXTURE_PID: i32 = 8928;

/// `<pid>/` of a fake procfs, from the `pid_*` fixtures.
pub fn fixture_pid_dir(pid: i32) -> FakeEntry {
    dir(
        &pid.to_string(),
        vec![
            file("stat", fixture("pid_stat")),
            file("status", fixture("pid_status")),
            file("cmdline", fixture("pid_cmdline")),
            file("cgroup", fixture("pid_cgroup")),
            file("maps", fixture("pid_maps")),
            dir("fd", vec![]),
        ],
    )
}

/// A fake procfs at `root` built from the fixtures; `self/mounts` mounts the cgroup v1
/// memory hierarchy at `<root>/../cgroup/memory` and cgroup2 at `<root>/../cgroup/unified`.
pub fn fake_procfs(root: &Path) -> PathBuf {
    let base = root.parent().unwrap();
    let mounts = format!(
        "/dev/vda / ext4 rw,relatime 0 0\n\
         proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n\
         cgroup {v1} cgroup rw,relatime,memory 0 0\n\
         cgroup {base}/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
         cgroup2 {v2} cgroup2 rw,relatime 0 0\n",
        v1 = base.join("cgroup/memory").display(),
        v2 = base.join("cgroup/unified").display(),
        base = base.display(),
    );
    create_tree(
        root,
        &[
            file("meminfo", fixture("meminfo")),
            file("vmstat", fixture("vmstat")),
            dir(
                "pressure",
                vec![
                    file("memory", fixture("pressure_memory")),
                    file("cpu", fixture("pressure_cpu")),
                    file("io", fixture("pressure_io")),
                ],
            ),
            fixture_pid_dir(FIXTURE_PID),
            dir(
                "self",
                vec![
                    file("mounts", mounts),
                    file("cgroup", fixture("pid_cgroup")),
                ],
            ),
        ],
    )
    .unwrap();
    root.to_path_buf()
}

/// A fake v1 memory cgroup directory `name` in `parent` with the real `memory.stat`
/// fixture, the given usage and limit, and `procs` in `cgroup.procs`.
pub fn fake_v1_group(
    parent: &Path,
    name: &str,
    usage: u64,
    limit: u64,
    procs: &[i32],
    children: Vec<FakeEntry>,
) -> PathBuf {
    let mut entries = vec![
        file("memory.usage_in_bytes", format!("{usage}\n")),
        file("memory.limit_in_bytes", format!("{limit}\n")),
        file("memory.stat", fixture("v1_memory.stat")),
        file("memory.pressure_level", ""),
        file("memory.oom_control", fixture("v1_memory.oom_control")),
        file("memory.failcnt", "3\n"),
        file("memory.max_usage_in_bytes", format!("{}\n", usage + 4096)),
        file("cgroup.event_control", ""),
        file(
            "cgroup.procs",
            procs.iter().map(|p| format!("{p}\n")).collect::<String>(),
        ),
    ];
    entries.extend(children);
    dir(name, entries).create_in(parent).unwrap()
}

/// A fake v2 memory cgroup directory `name` in `parent` from the `v2/` fixtures.
pub fn fake_v2_group(
    parent: &Path,
    name: &str,
    procs: &[i32],
    children: Vec<FakeEntry>,
) -> PathBuf {
    let mut entries = vec![
        file("memory.current", fixture("v2/memory.current")),
        file("memory.max", fixture("v2/memory.max")),
        file("memory.stat", fixture("v2/memory.stat")),
        file("memory.swap.current", fixture("v2/memory.swap.current")),
        file("memory.pressure", fixture("v2/memory.pressure")),
        file("memory.reclaim", ""),
        file("memory.events", fixture("v2/memory.events")),
        file("memory.peak", fixture("v2/memory.peak")),
        file("memory.high", fixture("v2/memory.high")),
        file("cgroup.controllers", fixture("v2/cgroup.controllers")),
        file("cgroup.subtree_control", ""),
        file(
            "cgroup.procs",
            procs.iter().map(|p| format!("{p}\n")).collect::<String>(),
        ),
    ];
    entries.extend(children);
    dir(name, entries).create_in(parent).unwrap()
}

/// The helpers for tests on the real kernel, shared by every crate's tests.
#[allow(unused_imports)]
pub use memcolo_testkit::{cannot_run, real_cgroup_v1_available, Scratch};
