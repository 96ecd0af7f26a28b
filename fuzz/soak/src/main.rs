//! `memcolo-soak`: hostile traffic against a real memcolo agent and memory server,
//! with liveness and resource-growth checks (`make fuzz-soak`).
//!
//! The driver (root) starts `memcolo agent` (scope host, agent.sock and, through a
//! `--config` with `[tier] enabled = true`, tier.sock, in a scratch directory) and
//! `memcolo memserver` on loopback, then re-executes itself as an unprivileged uid
//! (`--uid`, what any tenant is) to send the traffic ([`attack`]): by default 10 M
//! agent.sock lines (mutated valid requests, invalid ones, random bytes, over-long
//! lines, split writes, abrupt closes, bursts of concurrent connections past the
//! per-uid connection caps, whose refusals are counted, not failures), 1 M
//! tier.sock lines and 1 M memory-server frames ([`frames`]: a tenth from peers
//! without the secret, all refused; the rest from a client holding the shared secret,
//! valid frames and damaged records). The memory server and that client get the
//! secret from a 0600 file each (`--secret-file`). It
//! samples each daemon's VmRSS, threads (`/proc/PID/task`) and open descriptors
//! (`/proc/PID/fd`) at the start, every few seconds and at the end, prints a table,
//! and exits non-zero if the attacker saw a hang or a bad reply, a daemon died or
//! stopped answering, or a number grew without bound: RSS over 4 × the start plus a
//! slack, descriptors or threads not back near the start once the connections closed.

mod attack;
mod frames;
mod lines;

use anyhow::{bail, Context, Result};
use memcolo_tier::channel::Auth;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// RSS growth allowed beyond 4 × the start, KiB: the memory server's store capacity
/// (`--capacity-mib`) plus allocator and buffer slack.
const MEMSERVER_CAPACITY_MIB: u64 = 64;
const RSS_SLACK_KIB: u64 = (MEMSERVER_CAPACITY_MIB + 64) << 10;
/// Descriptors and threads a daemon may hold above its start once idle again.
const FD_SLACK: u64 = 8;
const THREAD_SLACK: u64 = 4;

struct Args {
    memcolo: PathBuf,
    agent_lines: u64,
    tier_lines: u64,
    frames: u64,
    workers: usize,
    burst: usize,
    uid: u32,
    seed: u64,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args> {
    let mut a = Args {
        memcolo: PathBuf::from("target/release/memcolo"),
        agent_lines: 10_000_000,
        tier_lines: 1_000_000,
        frames: 1_000_000,
        workers: 3,
        burst: 1100,
        uid: 64_790,
        seed: 0x5eed,
    };
    while let Some(k) = it.next() {
        let v = it.next().with_context(|| format!("{k} needs a value"))?;
        match k.as_str() {
            "--memcolo" => a.memcolo = v.into(),
            "--agent-lines" => a.agent_lines = v.parse()?,
            "--tier-lines" => a.tier_lines = v.parse()?,
            "--frames" => a.frames = v.parse()?,
            "--workers" => a.workers = v.parse()?,
            "--burst" => a.burst = v.parse()?,
            "--uid" => a.uid = v.parse()?,
            "--seed" => a.seed = v.parse()?,
            _ => bail!(
                "unknown option {k}; options: --memcolo PATH --agent-lines N --tier-lines N \
                 --frames N --workers N --burst N --uid UID --seed N"
            ),
        }
    }
    Ok(a)
}

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    let r = if args.peek().map(String::as_str) == Some("attack") {
        args.next();
        attack_main(args.collect())
    } else {
        parse(args).and_then(drive)
    };
    if let Err(e) = r {
        eprintln!("soak: FAILED: {e:#}");
        std::process::exit(1);
    }
}

fn attack_main(v: Vec<String>) -> Result<()> {
    let [agent_sock, tier_sock, memserver, secret, seeds, agent_lines, tier_lines, frames, workers, burst, seed] =
        <[String; 11]>::try_from(v).map_err(|_| anyhow::anyhow!("attack: bad arguments"))?;
    attack::run(attack::Plan {
        agent_sock: agent_sock.into(),
        tier_sock: tier_sock.into(),
        memserver: memserver.parse()?,
        secret: secret.into(),
        seeds: seeds.into(),
        agent_lines: agent_lines.parse()?,
        tier_lines: tier_lines.parse()?,
        frames: frames.parse()?,
        agent_workers: workers.parse()?,
        burst_conns: burst.parse()?,
        seed: seed.parse()?,
    })
}

/// A daemon's resource numbers from /proc.
#[derive(Clone, Copy, Default)]
struct Sample {
    rss_kib: u64,
    threads: u64,
    fds: u64,
}

fn sample(pid: u32) -> Result<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS")?;
    let count = |d: &str| -> Result<u64> {
        Ok(std::fs::read_dir(format!("/proc/{pid}/{d}"))?.count() as u64)
    };
    Ok(Sample {
        rss_kib,
        threads: count("task")?,
        fds: count("fd")?,
    })
}

struct Daemon {
    name: &'static str,
    child: Child,
    start: Sample,
    peak: Sample,
    end: Sample,
}

impl Daemon {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn observe(&mut self) -> Result<Sample> {
        if let Some(st) = self.child.try_wait()? {
            bail!("{} died: {st}", self.name);
        }
        let s = sample(self.pid())?;
        self.peak.rss_kib = self.peak.rss_kib.max(s.rss_kib);
        self.peak.threads = self.peak.threads.max(s.threads);
        self.peak.fds = self.peak.fds.max(s.fds);
        Ok(s)
    }

    fn settled(&self, s: &Sample) -> bool {
        s.fds <= self.start.fds + FD_SLACK && s.threads <= self.start.threads + THREAD_SLACK
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: signalling our own child, which we have not reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        if Instant::now() > deadline {
            bail!("{what} did not come up within 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Sends one line and reads one line back.
fn ask(sock: &Path, line: &str) -> Result<String> {
    let mut s =
        UnixStream::connect(sock).with_context(|| format!("connecting {}", sock.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(line.as_bytes())?;
    let mut r = BufReader::new(s);
    let mut out = String::new();
    r.read_line(&mut out)?;
    Ok(out)
}

/// The agent answers ping and status, and tier.sock answers tier_status.
fn agent_alive(sock: &Path, tier: &Path) -> Result<()> {
    let pong = ask(sock, "{\"v\":1,\"type\":\"ping\"}\n")?;
    anyhow::ensure!(
        pong.contains("\"type\":\"pong\""),
        "agent answered ping with {pong:?}"
    );
    let st = ask(sock, "{\"v\":1,\"type\":\"status\"}\n")?;
    anyhow::ensure!(
        st.contains("\"type\":\"status\""),
        "agent answered status with {st:?}"
    );
    let ts = ask(tier, "{\"v\":1,\"type\":\"tier_status\"}\n")?;
    anyhow::ensure!(
        ts.contains("\"type\":\"tier_status\""),
        "tier.sock answered tier_status with {ts:?}"
    );
    Ok(())
}

/// The memory server accepts a client with the secret and answers its hello.
fn memserver_alive(addr: SocketAddr, auth: &Auth) -> Result<()> {
    let mut c = frames::connect(addr, auth, Duration::from_secs(10))?.context("memserver busy")?;
    let (status, id) = frames::hello(&mut c, 1, 4096)?;
    anyhow::ensure!(
        status == 0 && id == 1,
        "memserver answered hello with status {status}, id {id}"
    );
    Ok(())
}

fn drive(a: Args) -> Result<()> {
    anyhow::ensure!(
        a.memcolo.exists(),
        "{} not found (cargo build --release -p memcolo)",
        a.memcolo.display()
    );
    let memcolo = a.memcolo.canonicalize()?;
    let tmp = std::env::temp_dir().join(format!("memcolo-soak-{}", std::process::id()));
    std::fs::create_dir_all(tmp.join("state"))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    let r = drive_in(&a, &memcolo, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    r
}

fn drive_in(a: &Args, memcolo: &Path, tmp: &Path) -> Result<()> {
    let sock = tmp.join("agent.sock");
    let tier = tmp.join("tier.sock");
    let config = tmp.join("agent.toml");
    std::fs::write(&config, "[tier]\nenabled = true\n")?;
    // The memory server's shared secret: one 0600 file for the server (root's), one
    // for the attacker's authenticated client (its own uid's).
    let mut secret = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut secret)?;
    let server_secret = tmp.join("memserver.secret");
    let client_secret = tmp.join("client.secret");
    for (path, uid) in [(&server_secret, 0), (&client_secret, a.uid)] {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?
            .write_all(&secret)?;
        std::os::unix::fs::chown(path, Some(uid), Some(uid))?;
    }
    let auth = Auth::from_file(&server_secret)?;
    let t0 = Instant::now();

    let mut ms = Command::new(memcolo)
        .args([
            "memserver",
            "--listen",
            "127.0.0.1:0",
            "--capacity-mib",
            &MEMSERVER_CAPACITY_MIB.to_string(),
        ])
        .arg("--secret-file")
        .arg(&server_secret)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting memcolo memserver")?;
    let mut first = String::new();
    BufReader::new(ms.stdout.take().expect("piped")).read_line(&mut first)?;
    let addr: SocketAddr = first
        .trim()
        .strip_prefix("listening on ")
        .with_context(|| format!("memserver printed {first:?}"))?
        .parse()?;
    let mut memserver = Daemon {
        name: "memserver",
        child: ms,
        start: Sample::default(),
        peak: Sample::default(),
        end: Sample::default(),
    };

    let agent_child = Command::new(memcolo)
        .arg("agent")
        .arg("--config")
        .arg(&config)
        .arg("--socket")
        .arg(&sock)
        .arg("--state-dir")
        .arg(tmp.join("state"))
        .args([
            "--metrics-addr",
            "off",
            "--scope",
            "host",
            "--event-log",
            "off",
        ])
        // Registrations are the attacker's own pid only (it is not root); never kill it.
        .args(["--kill-after-s", "1000000000"])
        .env("MEMCOLO_LOG", "error")
        .spawn()
        .context("starting memcolo agent")?;
    let mut agent = Daemon {
        name: "agent",
        child: agent_child,
        start: Sample::default(),
        peak: Sample::default(),
        end: Sample::default(),
    };
    wait_for("the agent", || agent_alive(&sock, &tier).is_ok())?;
    memserver_alive(addr, &auth)?;
    std::thread::sleep(Duration::from_secs(1));
    for d in [&mut agent, &mut memserver] {
        d.start = d.observe()?;
        d.peak = d.start;
    }

    // The attacker: this program again, as an unprivileged uid, with real-time
    // signals ignored (a registration with notify: signal must not end it).
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../seeds")
        .canonicalize()?;
    let me = std::env::current_exe()?;
    let mut cmd = Command::new(&me);
    cmd.arg("attack")
        .arg(&sock)
        .arg(&tier)
        .arg(addr.to_string())
        .arg(&client_secret)
        .arg(&seeds)
        .args([a.agent_lines, a.tier_lines, a.frames].map(|n| n.to_string()))
        .args([a.workers, a.burst].map(|n| n.to_string()))
        .arg(a.seed.to_string())
        .uid(a.uid)
        .gid(a.uid);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for s in libc::SIGRTMIN()..=libc::SIGRTMAX() {
                libc::signal(s, libc::SIG_IGN);
            }
            Ok(())
        });
    }
    let mut attacker = cmd.spawn().context("starting the attacker")?;
    let attack_start = Instant::now();
    let mut samples = 0;
    let status = loop {
        if let Some(st) = attacker.try_wait()? {
            break st;
        }
        for d in [&mut agent, &mut memserver] {
            if let Err(e) = d.observe() {
                let _ = attacker.kill();
                let _ = attacker.wait();
                return Err(e);
            }
        }
        samples += 1;
        std::thread::sleep(Duration::from_secs(2));
    };
    let attack_secs = attack_start.elapsed().as_secs_f64();

    // Idle again: descriptors and threads must come back near the start.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (sa, sm) = (agent.observe()?, memserver.observe()?);
        agent.end = sa;
        memserver.end = sm;
        if (agent.settled(&sa) && memserver.settled(&sm)) || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let alive_agent = agent_alive(&sock, &tier);
    let alive_mem = memserver_alive(addr, &auth);

    println!();
    println!("| daemon | | VmRSS KiB | threads | fds |");
    println!("|---|---|---:|---:|---:|");
    for d in [&agent, &memserver] {
        for (when, s) in [("start", d.start), ("peak", d.peak), ("end", d.end)] {
            println!(
                "| {} | {when} | {} | {} | {} |",
                d.name, s.rss_kib, s.threads, s.fds
            );
        }
    }
    println!(
        "\nattack {:.0} s, {samples} samples, total {:.0} s",
        attack_secs,
        t0.elapsed().as_secs_f64()
    );

    let mut failures = Vec::new();
    if !status.success() {
        failures.push(format!("the attacker failed ({status})"));
    }
    if let Err(e) = alive_agent {
        failures.push(format!("agent not answering after the soak: {e:#}"));
    }
    if let Err(e) = alive_mem {
        failures.push(format!("memserver not answering after the soak: {e:#}"));
    }
    for d in [&agent, &memserver] {
        if d.end.rss_kib > 4 * d.start.rss_kib + RSS_SLACK_KIB {
            failures.push(format!(
                "{}: RSS grew from {} to {} KiB",
                d.name, d.start.rss_kib, d.end.rss_kib
            ));
        }
        if !d.settled(&d.end) {
            failures.push(format!(
                "{}: fds {} -> {}, threads {} -> {} after the connections closed",
                d.name, d.start.fds, d.end.fds, d.start.threads, d.end.threads
            ));
        }
    }
    drop(agent);
    drop(memserver);
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    println!("soak: ok");
    Ok(())
}
