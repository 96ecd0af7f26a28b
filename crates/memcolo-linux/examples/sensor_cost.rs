//! Cost of the agent's sensors on this machine: how long each reader takes on the real
//! `/proc` and cgroupfs, so the 1 s sense→decide→act tick (M3 §6) can be budgeted.
//!
//! Usage: `cargo run --release -p memcolo-linux --example sensor_cost [ITERATIONS]`
//! (default 2000). Prints a Markdown table of p50/p99/mean in microseconds. Operations
//! that need what this machine lacks (cgroup, cachestat) are reported as skipped.

use memcolo_linux::cgroup::own_memory_cgroup;
use memcolo_linux::filecache::{cache_stat, resident_bytes};
use memcolo_linux::procfs::ProcFs;
use memcolo_linux::scope::Scope;
use std::io::Write;
use std::time::Instant;

fn measure(name: &str, iterations: usize, mut op: impl FnMut() -> Result<(), String>) {
    // Warm up: the host hands back idle guest memory, first touches are slower.
    for _ in 0..iterations / 10 + 1 {
        if let Err(e) = op() {
            println!("| {name} | skipped: {e} | | |");
            return;
        }
    }
    let mut samples_us: Vec<f64> = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        op().unwrap();
        samples_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    samples_us.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| samples_us[((samples_us.len() - 1) as f64 * p).round() as usize];
    let mean = samples_us.iter().sum::<f64>() / samples_us.len() as f64;
    println!(
        "| {name} | {:.1} | {:.1} | {:.1} |",
        pct(0.50),
        pct(0.99),
        mean
    );
}

fn main() {
    let iterations: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("ITERATIONS must be a number"))
        .unwrap_or(2000);
    let procfs = ProcFs::root();
    let me = std::process::id() as i32;
    let nproc = procfs.pids().map(|p| p.len()).unwrap_or(0);
    println!("iterations: {iterations}; processes on the host: {nproc}\n");
    println!("| operation | p50 µs | p99 µs | mean µs |");
    println!("|---|---|---|---|");
    let e = |e: memcolo_linux::Error| e.to_string();
    measure("read_meminfo", iterations, || {
        procfs.read_meminfo().map(|_| ()).map_err(e)
    });
    measure("read_vmstat", iterations, || {
        procfs.read_vmstat().map(|_| ()).map_err(e)
    });
    measure("read_pressure(memory)", iterations, || {
        procfs.read_pressure("memory").map(|_| ()).map_err(e)
    });
    let host = Scope::Host(procfs.clone());
    measure("Scope::Host sample", iterations, || {
        host.sample().map(|_| ()).map_err(e)
    });
    match own_memory_cgroup(&procfs) {
        Ok(cg) => {
            let scope = Scope::Cgroup(cg);
            measure("Scope::Cgroup sample (own group)", iterations, || {
                scope.sample().map(|_| ()).map_err(e)
            });
            measure("Scope::Cgroup pids (recursive)", iterations, || {
                scope.pids().map(|_| ()).map_err(e)
            });
        }
        Err(err) => println!("| Scope::Cgroup sample | skipped: {err} | | |"),
    }
    measure("read_pid_stat(self)", iterations, || {
        procfs.read_pid_stat(me).map(|_| ()).map_err(e)
    });
    measure("read_pid_status(self)", iterations, || {
        procfs.read_pid_status(me).map(|_| ()).map_err(e)
    });
    measure("read_pid_smaps_rollup(self)", iterations, || {
        procfs.read_pid_smaps_rollup(me).map(|_| ()).map_err(e)
    });
    measure("read_pid_files(self)", iterations, || {
        procfs.read_pid_files(me).map(|_| ()).map_err(e)
    });
    measure("status of every process", iterations / 20 + 1, || {
        for pid in procfs.pids().map_err(e)? {
            match procfs.read_pid_status(pid) {
                Ok(_) => {}
                Err(err) if err.is_not_found() => {}
                Err(err) => return Err(err.to_string()),
            }
        }
        Ok(())
    });

    // Page-cache residency of a 64 MiB file on a disk filesystem.
    let dir = tempfile_dir();
    let path = dir.join("residency-64m");
    {
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![1u8; 1 << 20];
        for _ in 0..64 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    measure("cachestat(64 MiB file)", iterations, || {
        cache_stat(&path).map(|_| ()).map_err(e)
    });
    measure("resident_bytes(64 MiB file)", iterations, || {
        resident_bytes(&path).map(|_| ()).map_err(e)
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::path::Path::new("/var/tmp")
        .join(format!("memcolo-sensor-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
