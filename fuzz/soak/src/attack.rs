//! The hostile client: runs as an unprivileged uid (what any tenant can do) and
//! sends the soak's traffic. Exits non-zero when a daemon stopped answering (a read
//! timed out), answered with an undecodable reply, or owed replies it never sent.

use crate::frames::{self, op};
use crate::lines::{self, Seeds};
use anyhow::{bail, Context, Result};
use fastrand::Rng;
use memcolo_proto::{decode_reply, tier::decode_tier_reply, tier::TierReply, Reply};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the attacker is told by the driver.
pub struct Plan {
    pub agent_sock: PathBuf,
    pub tier_sock: PathBuf,
    pub memserver: SocketAddr,
    pub seeds: PathBuf,
    pub agent_lines: u64,
    pub tier_lines: u64,
    pub frames: u64,
    pub agent_workers: usize,
    pub burst_conns: usize,
    pub seed: u64,
}

/// How long a daemon may take to answer before the soak calls it hung.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines or frames written before their answers are read.
const BATCH: usize = 32;
/// Memory-server page size (the server's default).
const PAGE: usize = 4096;

#[derive(Default)]
struct Counters {
    agent_lines: AtomicU64,
    agent_replies: AtomicU64,
    tier_lines: AtomicU64,
    tier_replies: AtomicU64,
    frames: AtomicU64,
    responses: AtomicU64,
    conns: AtomicU64,
    burst_answered: AtomicU64,
    burst_refused: AtomicU64,
}

pub fn run(plan: Plan) -> Result<()> {
    let agent_seeds = Arc::new(Seeds::load(&plan.seeds.join("agent_request"))?);
    let tier_seeds = Arc::new(Seeds::load(&plan.seeds.join("tier_request"))?);
    let c = Arc::new(Counters::default());
    let done = Arc::new(AtomicBool::new(false));
    let plan = Arc::new(plan);
    let start = Instant::now();
    let mut workers = Vec::new();
    for w in 0..plan.agent_workers {
        let (p, c, s) = (plan.clone(), c.clone(), agent_seeds.clone());
        let quota = plan.agent_lines / plan.agent_workers as u64;
        workers.push(std::thread::spawn(move || {
            agent_worker(&p, &c, &s, quota, p.seed + w as u64)
        }));
    }
    {
        let (p, c, s) = (plan.clone(), c.clone(), tier_seeds.clone());
        workers.push(std::thread::spawn(move || tier_worker(&p, &c, &s)));
    }
    {
        let (p, c) = (plan.clone(), c.clone());
        workers.push(std::thread::spawn(move || memserver_worker(&p, &c)));
    }
    let bursts = {
        let (p, c, d) = (plan.clone(), c.clone(), done.clone());
        std::thread::spawn(move || -> Result<()> {
            // A burst of concurrent connections every 30 s while the rest runs.
            let mut next = Instant::now() + Duration::from_secs(10);
            while !d.load(Ordering::Acquire) {
                if Instant::now() >= next {
                    burst(&p, &c)?;
                    next = Instant::now() + Duration::from_secs(30);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            burst(&p, &c)
        })
    };
    let progress = {
        let (c, d) = (c.clone(), done.clone());
        std::thread::spawn(move || {
            while !d.load(Ordering::Acquire) {
                for _ in 0..50 {
                    if d.load(Ordering::Acquire) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                eprintln!(
                    "soak: {:>4}s agent {} lines / {} replies, tier {} / {}, memserver {} frames / {}, {} connections",
                    start.elapsed().as_secs(),
                    c.agent_lines.load(Ordering::Relaxed),
                    c.agent_replies.load(Ordering::Relaxed),
                    c.tier_lines.load(Ordering::Relaxed),
                    c.tier_replies.load(Ordering::Relaxed),
                    c.frames.load(Ordering::Relaxed),
                    c.responses.load(Ordering::Relaxed),
                    c.conns.load(Ordering::Relaxed),
                );
            }
        })
    };
    let mut failed = Vec::new();
    for w in workers {
        if let Err(e) = w.join().expect("worker panicked") {
            failed.push(format!("{e:#}"));
        }
    }
    done.store(true, Ordering::Release);
    if let Err(e) = bursts.join().expect("burst thread panicked") {
        failed.push(format!("{e:#}"));
    }
    let _ = progress.join();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "attack: {:.0} s; agent.sock {} lines ({:.0}/s), {} replies; tier.sock {} lines, {} replies; \
         memserver {} frames, {} responses; {} connections; bursts: {} answered, {} refused or closed",
        secs,
        c.agent_lines.load(Ordering::Relaxed),
        c.agent_lines.load(Ordering::Relaxed) as f64 / secs,
        c.agent_replies.load(Ordering::Relaxed),
        c.tier_lines.load(Ordering::Relaxed),
        c.tier_replies.load(Ordering::Relaxed),
        c.frames.load(Ordering::Relaxed),
        c.responses.load(Ordering::Relaxed),
        c.conns.load(Ordering::Relaxed),
        c.burst_answered.load(Ordering::Relaxed),
        c.burst_refused.load(Ordering::Relaxed),
    );
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

fn unix(path: &PathBuf) -> Result<UnixStream> {
    let s = UnixStream::connect(path).with_context(|| format!("connecting {}", path.display()))?;
    s.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    Ok(s)
}

/// Reads `owed` replies (pushed notifications aside), each of which must decode.
fn read_replies<T>(
    r: &mut impl BufRead,
    owed: usize,
    decode: impl Fn(&str) -> Result<T, memcolo_proto::DecodeError>,
    is_push: impl Fn(&T) -> bool,
    what: &str,
) -> Result<usize> {
    let mut got = 0;
    let mut line = String::new();
    while got < owed {
        line.clear();
        let n = r
            .read_line(&mut line)
            .with_context(|| format!("{what}: waiting for reply {} of {owed}", got + 1))?;
        if n == 0 {
            bail!(
                "{what}: connection closed with {} of {owed} replies owed",
                owed - got
            );
        }
        let reply = decode(&line).with_context(|| format!("{what}: undecodable reply {line:?}"))?;
        if !is_push(&reply) {
            got += 1;
        }
    }
    Ok(got)
}

fn agent_worker(plan: &Plan, c: &Counters, seeds: &Seeds, quota: u64, seed: u64) -> Result<()> {
    let mut rng = Rng::with_seed(seed);
    let mut sent = 0u64;
    while sent < quota {
        let s = unix(&plan.agent_sock)?;
        c.conns.fetch_add(1, Ordering::Relaxed);
        let mut w = s.try_clone()?;
        let mut r = BufReader::new(s);
        let batches = rng.usize(1..400);
        for b in 0..batches {
            let mut out = Vec::new();
            let mut n = 0;
            while n < BATCH {
                lines::push_line(&mut rng, seeds, &mut out);
                n += 1;
            }
            let lines = out.iter().filter(|&&b| b == b'\n').count() as u64;
            let owed = lines::replies_owed(&out);
            let last = b + 1 == batches;
            if last && rng.u8(0..10) == 0 {
                // Leave abruptly: a partial line, replies unread.
                out.extend_from_slice(b"{\"v\":1,\"type\":\"regi");
                let _ = lines::write_chunked(&mut rng, &mut w, &out);
                sent += lines;
                c.agent_lines.fetch_add(lines, Ordering::Relaxed);
                break;
            }
            lines::write_chunked(&mut rng, &mut w, &out).context("agent.sock: writing")?;
            sent += lines;
            c.agent_lines.fetch_add(lines, Ordering::Relaxed);
            let got = read_replies(
                &mut r,
                owed,
                decode_reply,
                |r| matches!(r, Reply::Notify { .. }),
                "agent.sock",
            )?;
            c.agent_replies.fetch_add(got as u64, Ordering::Relaxed);
            if sent >= quota {
                break;
            }
        }
    }
    Ok(())
}

fn tier_worker(plan: &Plan, c: &Counters, seeds: &Seeds) -> Result<()> {
    let mut rng = Rng::with_seed(plan.seed ^ 0x7133);
    let mut sent = 0u64;
    while sent < plan.tier_lines {
        let s = unix(&plan.tier_sock)?;
        c.conns.fetch_add(1, Ordering::Relaxed);
        let mut w = s.try_clone()?;
        let mut r = BufReader::new(s);
        for _ in 0..rng.usize(1..200) {
            if sent >= plan.tier_lines {
                break;
            }
            let mut out = Vec::new();
            for _ in 0..BATCH {
                lines::push_line(&mut rng, seeds, &mut out);
            }
            let lines = out.iter().filter(|&&b| b == b'\n').count() as u64;
            // tier.sock's framing of over-long lines depends on how reads split them,
            // so the batch is closed by a `tier_status` and answers are read up to
            // its reply: the batch's own `tier_status` lines are counted in.
            let statuses = out
                .split(|&b| b == b'\n')
                .filter(|l| {
                    matches!(
                        memcolo_proto::tier::decode_tier_request(&String::from_utf8_lossy(l)),
                        Ok(memcolo_proto::tier::TierRequest::TierStatus)
                    )
                })
                .count();
            out.extend_from_slice(b"{\"v\":1,\"type\":\"tier_status\"}\n");
            lines::write_chunked(&mut rng, &mut w, &out).context("tier.sock: writing")?;
            sent += lines + 1;
            c.tier_lines.fetch_add(lines + 1, Ordering::Relaxed);
            let mut seen = 0;
            let mut line = String::new();
            while seen < statuses + 1 {
                line.clear();
                if r.read_line(&mut line)
                    .context("tier.sock: waiting for tier_status")?
                    == 0
                {
                    bail!("tier.sock: closed before answering tier_status");
                }
                let reply = decode_tier_reply(&line)
                    .with_context(|| format!("tier.sock: undecodable reply {line:?}"))?;
                c.tier_replies.fetch_add(1, Ordering::Relaxed);
                if matches!(reply, TierReply::TierStatus { .. }) {
                    seen += 1;
                }
            }
        }
    }
    Ok(())
}

/// One memory-server frame of a random kind; `fatal` frames make the server drop the
/// connection (unknown op, bad magic, payload over the limit).
fn frame(rng: &mut Rng, id: u64, fatal: bool) -> Vec<u8> {
    let region = rng.u64(0..64);
    let page = rng.u64(0..256);
    if fatal {
        return match rng.u8(0..4) {
            0 => frames::request(rng.u8(8..), id, region, page, 0, &[], None),
            1 => {
                let mut f = frames::request(op::LOAD, id, region, page, 0, &[], None);
                f[..4].copy_from_slice(b"GET ");
                f
            }
            2 => frames::request(
                op::STORE,
                id,
                region,
                page,
                0,
                &[],
                Some(frames::MAX_PAYLOAD + 1 + rng.u32(..1 << 20)),
            ),
            // Announces the largest payload, sends a little, then the connection closes.
            _ => frames::request(
                op::STORE,
                id,
                region,
                page,
                0,
                &[0; 100],
                Some(frames::MAX_PAYLOAD),
            ),
        };
    }
    match rng.u8(0..12) {
        0..=3 => {
            let mut p = vec![0u8; PAGE];
            for _ in 0..8 {
                let i = rng.usize(0..PAGE);
                p[i] = rng.u8(..);
            }
            let crc = if rng.u8(0..10) == 0 {
                rng.u32(..)
            } else {
                frames::crc32(&p)
            };
            frames::request(op::STORE, id, region, page, crc, &p, None)
        }
        4 => {
            // A payload of the wrong size.
            let p = vec![7u8; rng.usize(0..3 * PAGE)];
            frames::request(op::STORE, id, region, page, frames::crc32(&p), &p, None)
        }
        5 | 6 => frames::request(op::LOAD, id, region, page, 0, &[], None),
        7 => frames::request(op::REMOVE, id, region, page, 0, &[], None),
        8 => frames::request(op::REMOVE_REGION, id, region, 0, 0, &[], None),
        9 => frames::request(op::STATS, id, 0, 0, 0, &[], None),
        10 => {
            let p: Vec<u8> = match rng.u8(0..4) {
                0 => Vec::new(),
                1 => 0u32.to_le_bytes().to_vec(),
                2 => rng.u32(..).to_le_bytes().to_vec(),
                _ => vec![1; rng.usize(1..64)],
            };
            frames::request(
                op::LIST_REGION,
                id,
                region,
                rng.u64(..),
                frames::crc32(&p),
                &p,
                None,
            )
        }
        _ => frames::hello(id, if rng.bool() { PAGE as u32 } else { rng.u32(..) }),
    }
}

fn memserver_worker(plan: &Plan, c: &Counters) -> Result<()> {
    let mut rng = Rng::with_seed(plan.seed ^ 0x3e3);
    let mut sent = 0u64;
    let mut id = 1u64;
    while sent < plan.frames {
        let s = TcpStream::connect(plan.memserver).context("memserver: connecting")?;
        s.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        s.set_nodelay(true)?;
        c.conns.fetch_add(1, Ordering::Relaxed);
        let mut w = s.try_clone()?;
        let mut r = BufReader::new(s);
        'conn: for _ in 0..rng.usize(1..300) {
            if sent >= plan.frames {
                break;
            }
            let fatal = rng.u8(0..30) == 0;
            let mut out = Vec::new();
            let mut ids = Vec::new();
            for k in 0..BATCH {
                let last = k + 1 == BATCH;
                out.extend_from_slice(&frame(&mut rng, id, fatal && last));
                if !(fatal && last) {
                    ids.push(id);
                }
                id += 1;
            }
            lines::write_chunked(&mut rng, &mut w, &out).context("memserver: writing")?;
            sent += BATCH as u64;
            c.frames.fetch_add(BATCH as u64, Ordering::Relaxed);
            if fatal {
                // The server may hold its answers until the frame it is reading ends
                // (it flushes once its read buffer is empty): end the stream first.
                w.shutdown(std::net::Shutdown::Write)?;
            }
            for want in &ids {
                let (_, got, _) = frames::read_response(&mut r)
                    .with_context(|| format!("memserver: waiting for response to {want}"))?;
                anyhow::ensure!(
                    got == *want,
                    "memserver: response to {got}, expected {want}"
                );
                c.responses.fetch_add(1, Ordering::Relaxed);
            }
            if fatal {
                match frames::read_response(&mut r) {
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                    other => bail!("memserver: expected the connection closed after a hostile frame, got {other:?}"),
                }
                break 'conn;
            }
        }
    }
    Ok(())
}

/// Opens `plan.burst_conns` connections to agent.sock, a fifth as many to tier.sock
/// and to the memory server, all at once; asks each for an answer (ping,
/// tier_status, hello), then closes them all.
fn burst(plan: &Plan, c: &Counters) -> Result<()> {
    let mut agent = Vec::new();
    let mut tier = Vec::new();
    let mut mem = Vec::new();
    for _ in 0..plan.burst_conns {
        agent.push(UnixStream::connect(&plan.agent_sock));
    }
    for _ in 0..plan.burst_conns / 5 {
        tier.push(UnixStream::connect(&plan.tier_sock));
        mem.push(TcpStream::connect(plan.memserver));
    }
    c.conns.fetch_add(
        (agent.len() + tier.len() + mem.len()) as u64,
        Ordering::Relaxed,
    );
    let ask = |s: std::io::Result<UnixStream>, line: &[u8]| -> bool {
        let Ok(mut s) = s else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
        if s.write_all(line).is_err() {
            return false;
        }
        let mut r = BufReader::new(s);
        let mut l = String::new();
        matches!(r.read_line(&mut l), Ok(n) if n > 0)
    };
    let mut answered = 0;
    let mut refused = 0;
    for s in agent {
        if ask(s, b"{\"v\":1,\"type\":\"ping\"}\n") {
            answered += 1
        } else {
            refused += 1
        }
    }
    for s in tier {
        if ask(s, b"{\"v\":1,\"type\":\"tier_status\"}\n") {
            answered += 1
        } else {
            refused += 1
        }
    }
    for s in mem {
        let ok = (|| -> std::io::Result<()> {
            let mut s = s?;
            s.set_read_timeout(Some(Duration::from_secs(20)))?;
            s.write_all(&frames::hello(1, PAGE as u32))?;
            frames::read_response(&mut s).map(|_| ())
        })();
        if ok.is_ok() {
            answered += 1
        } else {
            refused += 1
        }
    }
    c.burst_answered.fetch_add(answered, Ordering::Relaxed);
    c.burst_refused.fetch_add(refused, Ordering::Relaxed);
    Ok(())
}
