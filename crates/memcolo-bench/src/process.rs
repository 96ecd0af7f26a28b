//! Child processes of the benchmark, and what `/proc` says about any process.
//!
//! [`spawn`] starts a program in its own process group, already inside a given cgroup
//! (the child writes `0` to the group's `cgroup.procs` before `exec`, so not a single
//! page is charged elsewhere), optionally pinned to CPUs, and with `PR_SET_PDEATHSIG`
//! so it dies with the benchmark. [`ChildGuard`] kills the whole process group when
//! dropped.

use memcolo_linux::procfs::ProcFs;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::error::{BenchError, Result};

/// Where a child goes and how it runs.
#[derive(Clone, Debug, Default)]
pub struct ChildPlacement<'a> {
    /// cgroup v1 directory to join before exec.
    pub cgroup: Option<&'a Path>,
    /// cgroup2 directory to join as well before exec, on a hybrid hierarchy whose
    /// cgroup2 has no memory controller: it only groups the child for its PSI
    /// (`memory.pressure`), which cgroup v1 does not have.
    pub psi_cgroup: Option<&'a Path>,
    /// CPUs to pin to (`sched_setaffinity`), none = inherit.
    pub cpus: Option<&'a [usize]>,
}

/// A running child; SIGKILLs its process group when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    child: Option<Child>,
    name: String,
}

/// `<group>/cgroup.procs` opened for writing, for a child to join `group` before exec.
fn open_procs(group: Option<&Path>) -> Result<Option<File>> {
    group
        .map(|g| {
            let p = g.join("cgroup.procs");
            OpenOptions::new()
                .write(true)
                .open(&p)
                .map_err(|e| BenchError::io(&p, e))
        })
        .transpose()
}

/// Starts `cmd` as described by `place`. `name` is used in messages.
pub fn spawn(cmd: &mut Command, name: &str, place: &ChildPlacement<'_>) -> Result<ChildGuard> {
    let procs = open_procs(place.cgroup)?;
    let procs_fd = procs.as_ref().map(|f| f.as_raw_fd());
    let psi_procs = open_procs(place.psi_cgroup)?;
    let psi_fd = psi_procs.as_ref().map(|f| f.as_raw_fd());
    let mut cpuset: Option<libc::cpu_set_t> = None;
    if let Some(cpus) = place.cpus {
        // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write into it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in cpus {
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        cpuset = Some(set);
    }
    cmd.process_group(0);
    // SAFETY: the closure only calls async-signal-safe syscalls (prctl, write,
    // sched_setaffinity) on data prepared before fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for fd in [procs_fd, psi_fd].into_iter().flatten() {
                let buf = b"0";
                if libc::write(fd, buf.as_ptr().cast(), buf.len()) != buf.len() as isize {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(set) = cpuset.as_ref() {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|source| BenchError::Spawn {
        program: format!("{name} ({:?})", cmd.get_program()),
        source,
    })?;
    drop(procs);
    drop(psi_procs);
    Ok(ChildGuard {
        child: Some(child),
        name: name.to_string(),
    })
}

impl ChildGuard {
    /// The child's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(-1)
    }

    /// The child's stdin, when it was spawned with `Stdio::piped()`.
    pub fn stdin(&mut self) -> Option<&mut std::process::ChildStdin> {
        self.child.as_mut()?.stdin.as_mut()
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `Some(status)` if the child has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(c) => c
                .try_wait()
                .map_err(|e| BenchError::Process(format!("wait for {}: {e}", self.name))),
            None => Err(BenchError::Process(format!("{} already reaped", self.name))),
        }
    }

    /// Waits up to `timeout` for the child to exit by itself.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait()? {
                return Ok(Some(st));
            }
            if Instant::now() >= end {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `sig` to the child's process group.
    pub fn signal_group(&self, sig: libc::c_int) {
        let pid = self.pid();
        if pid > 0 {
            // SAFETY: kill(2) of the process group we created for this child.
            unsafe { libc::kill(-pid, sig) };
        }
    }

    /// SIGTERM to the process group, up to `grace` to exit, then SIGKILL. Returns the
    /// exit status.
    pub fn terminate(&mut self, grace: Duration) -> Result<ExitStatus> {
        if let Some(st) = self.try_wait()? {
            self.signal_group(libc::SIGKILL);
            self.child = None;
            return Ok(st);
        }
        self.signal_group(libc::SIGTERM);
        let st = match self.wait_timeout(grace)? {
            Some(st) => st,
            None => {
                self.signal_group(libc::SIGKILL);
                self.child
                    .as_mut()
                    .expect("child present")
                    .wait()
                    .map_err(|e| BenchError::Process(format!("wait for {}: {e}", self.name)))?
            }
        };
        // Workers the leader left behind.
        self.signal_group(libc::SIGKILL);
        self.child = None;
        Ok(st)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = c.id() as i32;
            // SAFETY: kill(2) of the process group we created for this child.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            let _ = c.wait();
        }
    }
}

/// Pins the calling thread (and the threads it creates afterwards) to some CPUs;
/// the previous affinity comes back when dropped.
pub struct AffinityGuard {
    old: libc::cpu_set_t,
}

impl AffinityGuard {
    /// Pins the calling thread to `cpus`.
    pub fn pin_current_thread(cpus: &[usize]) -> Result<Self> {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: cpu_set_t is plain data; the calls only read or write the given sets
        // of the size passed.
        unsafe {
            let mut old: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, size, &mut old) != 0 {
                return Err(BenchError::Process(format!(
                    "sched_getaffinity: {}",
                    std::io::Error::last_os_error()
                )));
            }
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in cpus {
                libc::CPU_SET(c, &mut set);
            }
            if libc::sched_setaffinity(0, size, &set) != 0 {
                return Err(BenchError::Process(format!(
                    "sched_setaffinity({cpus:?}): {}",
                    std::io::Error::last_os_error()
                )));
            }
            Ok(AffinityGuard { old })
        }
    }
}

impl Drop for AffinityGuard {
    fn drop(&mut self) {
        // SAFETY: restores the mask read at creation.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.old);
        }
    }
}

/// Counters of one process from `/proc/<pid>/stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcStat {
    /// Major page faults (`majflt`): faults that needed I/O, swap-ins from zram included.
    pub major_faults: u64,
    /// User + system CPU time, in clock ticks (`utime + stime`).
    pub cpu_ticks: u64,
}

/// Reads `/proc/<pid>/stat` through memcolo-linux's procfs reader.
pub fn read_stat(pid: i32) -> Result<ProcStat> {
    let st = ProcFs::root()
        .read_pid_stat(pid)
        .map_err(|e| BenchError::Parse {
            path: format!("/proc/{pid}/stat").into(),
            msg: e.to_string(),
        })?;
    Ok(ProcStat {
        major_faults: st.majflt,
        cpu_ticks: st.utime_ticks + st.stime_ticks,
    })
}

/// CPU time and run-queue wait of a process's main thread from `/proc/<pid>/schedstat`
/// (`exec_ns wait_ns timeslices`): `(exec_ns, wait_ns)`. The wait is time runnable but
/// not running: a CPU taken by another task.
pub fn read_schedstat(pid: i32) -> Result<(u64, u64)> {
    let st = ProcFs::root()
        .read_pid_schedstat(pid)
        .map_err(|e| BenchError::Parse {
            path: format!("/proc/{pid}/schedstat").into(),
            msg: e.to_string(),
        })?;
    Ok((st.run_ns, st.wait_ns))
}

/// Resident memory of one process from `/proc/<pid>/status`, in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcMem {
    /// `VmRSS`.
    pub rss_kib: u64,
    /// `VmHWM`: the peak of RSS.
    pub hwm_kib: u64,
}

/// Reads `/proc/<pid>/status` through memcolo-linux's procfs reader.
pub fn read_status_mem(pid: i32) -> Result<ProcMem> {
    let st = ProcFs::root()
        .read_pid_status(pid)
        .map_err(|e| BenchError::Parse {
            path: format!("/proc/{pid}/status").into(),
            msg: e.to_string(),
        })?;
    Ok(ProcMem {
        rss_kib: st.vm_rss_bytes / 1024,
        hwm_kib: st.vm_hwm_bytes / 1024,
    })
}

/// Bytes a process has read (`rchar`: page-cache hits included) and caused to be
/// fetched from storage (`read_bytes`), from `/proc/<pid>/io`.
pub fn read_io(pid: i32) -> Result<(u64, u64)> {
    let p = format!("/proc/{pid}/io");
    let text = fs::read_to_string(&p).map_err(|e| BenchError::io(&p, e))?;
    let field = |name: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| BenchError::Parse {
                path: p.clone().into(),
                msg: format!("no {name}"),
            })
    };
    Ok((field("rchar:")?, field("read_bytes:")?))
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks_per_s() -> u64 {
    ProcFs::clock_ticks_per_sec()
}

/// Number of online CPUs of the machine (`sysconf(_SC_NPROCESSORS_ONLN)`), whatever
/// the calling thread's affinity: the benchmarks pin their own threads to the LC
/// CPUs, and a count that followed the mask would place "all CPUs" children on them.
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(1)
}

/// Aggregate CPU time of the machine from the `cpu` line of `/proc/stat`, in ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// All states summed (user … steal).
    pub total: u64,
    /// Time the hypervisor ran something else while a vCPU wanted to run.
    pub steal: u64,
    /// idle + iowait.
    pub idle: u64,
}

/// The first 8 tick counts (user nice system idle iowait irq softirq steal) of the
/// `/proc/stat` line that starts with `tag` (`"cpu "`, `"cpu1 "`); `None` when the line
/// is missing or short.
fn stat_ticks(proc_stat: &str, tag: &str) -> Option<Vec<u64>> {
    let line = proc_stat.lines().find(|l| l.starts_with(tag))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    (v.len() == 8).then_some(v)
}

/// Parses the `cpu ` line of `/proc/stat` text.
pub fn parse_cpu_times(proc_stat: &str) -> Option<CpuTimes> {
    let v = stat_ticks(proc_stat, "cpu ")?;
    Some(CpuTimes {
        total: v.iter().sum(),
        steal: v[7],
        idle: v[3] + v[4],
    })
}

/// Host steal and busy (not idle or iowait) shares of the machine's CPU time between
/// two readings, in percent: `(steal_pct, busy_pct)`; `(0, 0)` when a reading is
/// missing or no time passed between them.
pub fn steal_and_busy_pct(before: Option<CpuTimes>, after: Option<CpuTimes>) -> (f64, f64) {
    match (before, after) {
        (Some(a), Some(b)) if b.total > a.total => {
            let d = (b.total - a.total) as f64;
            (
                b.steal.saturating_sub(a.steal) as f64 / d * 100.0,
                (1.0 - b.idle.saturating_sub(a.idle) as f64 / d) * 100.0,
            )
        }
        _ => (0.0, 0.0),
    }
}

/// Reads `/proc/stat`.
pub fn read_cpu_times() -> Option<CpuTimes> {
    parse_cpu_times(&fs::read_to_string("/proc/stat").ok()?)
}

/// Busy ticks (every state but idle, iowait and steal) of the CPUs `cpus`, summed,
/// from the `cpuN` lines of `/proc/stat` text; `None` when a CPU's line is missing.
/// Steal (the hypervisor ran something else while the vCPU wanted to run) is not the
/// guest's work: it is [`parse_cpus_steal_ticks`].
pub fn parse_cpus_busy_ticks(proc_stat: &str, cpus: &[usize]) -> Option<u64> {
    let mut sum = 0;
    for &c in cpus {
        let v = stat_ticks(proc_stat, &format!("cpu{c} "))?;
        sum += v.iter().sum::<u64>() - v[3] - v[4] - v[7];
    }
    Some(sum)
}

/// Steal ticks (`steal`, the 8th field: time the host ran something else while the
/// vCPU was runnable; USER_HZ ticks, 10 ms) of the CPUs `cpus`, summed, from the
/// `cpuN` lines of `/proc/stat` text; `None` when a CPU's line is missing.
pub fn parse_cpus_steal_ticks(proc_stat: &str, cpus: &[usize]) -> Option<u64> {
    let mut sum = 0;
    for &c in cpus {
        sum += stat_ticks(proc_stat, &format!("cpu{c} "))?[7];
    }
    Some(sum)
}

/// ([`parse_cpus_busy_ticks`], [`parse_cpus_steal_ticks`]) of the machine's
/// `/proc/stat`, from one read.
pub fn read_cpus_busy_steal_ticks(cpus: &[usize]) -> Option<(u64, u64)> {
    let text = fs::read_to_string("/proc/stat").ok()?;
    Some((
        parse_cpus_busy_ticks(&text, cpus)?,
        parse_cpus_steal_ticks(&text, cpus)?,
    ))
}

/// The 1-minute load average (`/proc/loadavg`), a gauge of how busy the machine was.
pub fn loadavg_1m() -> Option<f64> {
    fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn online_cpus_counts_the_machine_not_the_thread_mask() {
        let before = online_cpus();
        // Pinned to one CPU, the count stays the machine's (a count that followed the
        // mask said "1 CPUs" in reports and put "all CPUs" children on CPU 0).
        let t = std::thread::spawn(move || {
            let _g = AffinityGuard::pin_current_thread(&[0]).unwrap();
            online_cpus()
        });
        assert_eq!(t.join().unwrap(), before);
        let sys = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
        let n: usize = sys
            .trim()
            .split(',')
            .map(|r| match r.split_once('-') {
                Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
                None => 1,
            })
            .sum();
        assert_eq!(before, n);
    }

    #[test]
    fn busy_ticks_of_some_cpus() {
        let text = "cpu  10 0 10 100 5 0 0 0 0 0\n\
                    cpu0 4 0 6 50 2 0 0 0 0 0\n\
                    cpu1 6 0 4 50 3 1 1 2 0 0\n";
        assert_eq!(parse_cpus_busy_ticks(text, &[0]), Some(10));
        assert_eq!(parse_cpus_busy_ticks(text, &[1]), Some(12));
        assert_eq!(parse_cpus_busy_ticks(text, &[0, 1]), Some(22));
        assert_eq!(parse_cpus_busy_ticks(text, &[2]), None);
        assert_eq!(parse_cpus_steal_ticks(text, &[0]), Some(0));
        assert_eq!(parse_cpus_steal_ticks(text, &[0, 1]), Some(2));
        assert_eq!(parse_cpus_steal_ticks(text, &[2]), None);
        assert!(read_cpus_busy_steal_ticks(&[0]).is_some());
    }

    #[test]
    fn schedstat_of_a_real_process() {
        // The parser's cases are memcolo-linux's (`parse_schedstat`).
        let (exec, _) = read_schedstat(std::process::id() as i32).unwrap();
        assert!(exec > 0);
    }

    #[test]
    fn cpu_line_of_proc_stat() {
        let text = "cpu  100 5 50 800 20 1 2 22 0 0\ncpu0 50 2 25 400 10 0 1 11 0 0\n";
        let t = parse_cpu_times(text).unwrap();
        assert_eq!(t.total, 1000);
        assert_eq!(t.steal, 22);
        assert_eq!(t.idle, 820);
        assert_eq!(parse_cpu_times("cpu0 1 2 3\n"), None);
    }

    #[test]
    fn steal_and_busy_between_two_readings() {
        let a = CpuTimes {
            total: 1000,
            steal: 10,
            idle: 500,
        };
        let b = CpuTimes {
            total: 2000,
            steal: 60,
            idle: 800,
        };
        assert_eq!(steal_and_busy_pct(Some(a), Some(b)), (5.0, 70.0));
        assert_eq!(steal_and_busy_pct(Some(b), Some(a)), (0.0, 0.0));
        assert_eq!(steal_and_busy_pct(None, Some(b)), (0.0, 0.0));
    }
}
