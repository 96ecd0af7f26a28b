//! The hostile client: runs as an unprivileged uid (what any tenant can do) and
//! sends the soak's traffic. Exits non-zero when a daemon stopped answering (a read
//! timed out), answered with an undecodable reply, owed replies it never sent, or
//! accepted a memory-server peer without the secret.
//!
//! The agent serves a non-root uid at most 64 connections on agent.sock
//! (`[limits] connections_per_uid`) and on tier.sock (`MAX_CONNECTIONS_PER_UID`), and
//! the memory server 64 in all: the bursts go past those caps on purpose, and the
//! workers, which meet them during a burst, see their connection refused (with
//! `limit_exceeded`, `permission_denied` or a busy greeting), count it and connect
//! again. Lines and frames are counted only on connections that were admitted.

use crate::frames::{self, op, Verdict};
use crate::lines::{self, Seeds};
use anyhow::{bail, Context, Result};
use fastrand::Rng;
use memcolo_proto::{decode_reply, tier::decode_tier_reply, tier::TierReply, ErrorCode, Reply};
use memcolo_tier::channel::Auth;
use memcolo_tier::wire::RawConn;
use memcolo_tier::PageKey;
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
    /// The memory server's shared secret (a 0600 file of this uid).
    pub secret: PathBuf,
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
    /// Connections refused at the per-uid cap (`limit_exceeded`).
    agent_refused: AtomicU64,
    /// Connections refused at the per-uid cap (`permission_denied`).
    tier_refused: AtomicU64,
    /// Frames sent by the authenticated client, and answers it read.
    frames: AtomicU64,
    responses: AtomicU64,
    /// Sealed records sent damaged or forged (each ends its connection).
    damaged: AtomicU64,
    /// Frames and handshake attempts sent without the secret, on how many
    /// connections, all refused.
    unauth_frames: AtomicU64,
    unauth_conns: AtomicU64,
    /// Memory-server connections turned away busy (at its cap).
    mem_busy: AtomicU64,
    conns: AtomicU64,
    burst_answered: AtomicU64,
    burst_limited: AtomicU64,
    burst_closed: AtomicU64,
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
    let auth = Auth::from_file(&plan.secret).context("the memory server's secret")?;
    {
        let (p, c, a) = (plan.clone(), c.clone(), auth.clone());
        workers.push(std::thread::spawn(move || memserver_worker(&p, &c, &a)));
    }
    {
        let (p, c) = (plan.clone(), c.clone());
        workers.push(std::thread::spawn(move || unauth_worker(&p, &c)));
    }
    let bursts = {
        let (p, c, d, a) = (plan.clone(), c.clone(), done.clone(), auth.clone());
        std::thread::spawn(move || -> Result<()> {
            // A burst of concurrent connections every 30 s while the rest runs.
            let mut next = Instant::now() + Duration::from_secs(10);
            while !d.load(Ordering::Acquire) {
                if Instant::now() >= next {
                    burst(&p, &c, &a)?;
                    next = Instant::now() + Duration::from_secs(30);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            burst(&p, &c, &a)
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
                    "soak: {:>4}s agent {} lines / {} replies ({} refused), tier {} / {} ({} refused), \
                     memserver {} frames / {} ({} damaged), {} unauthenticated on {}, {} busy, {} connections",
                    start.elapsed().as_secs(),
                    c.agent_lines.load(Ordering::Relaxed),
                    c.agent_replies.load(Ordering::Relaxed),
                    c.agent_refused.load(Ordering::Relaxed),
                    c.tier_lines.load(Ordering::Relaxed),
                    c.tier_replies.load(Ordering::Relaxed),
                    c.tier_refused.load(Ordering::Relaxed),
                    c.frames.load(Ordering::Relaxed),
                    c.responses.load(Ordering::Relaxed),
                    c.damaged.load(Ordering::Relaxed),
                    c.unauth_frames.load(Ordering::Relaxed),
                    c.unauth_conns.load(Ordering::Relaxed),
                    c.mem_busy.load(Ordering::Relaxed),
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
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "attack: {:.0} s; agent.sock {} lines ({:.0}/s), {} replies, {} connections refused \
         (limit_exceeded); tier.sock {} lines, {} replies, {} connections refused; memserver \
         {} authenticated frames, {} responses, {} damaged records; {} unauthenticated frames \
         on {} connections, all refused; {} busy; {} connections; bursts: {} answered, \
         {} refused at a cap, {} closed or failed to connect",
        secs,
        n(&c.agent_lines),
        n(&c.agent_lines) as f64 / secs,
        n(&c.agent_replies),
        n(&c.agent_refused),
        n(&c.tier_lines),
        n(&c.tier_replies),
        n(&c.tier_refused),
        n(&c.frames),
        n(&c.responses),
        n(&c.damaged),
        n(&c.unauth_frames),
        n(&c.unauth_conns),
        n(&c.mem_busy),
        n(&c.conns),
        n(&c.burst_answered),
        n(&c.burst_limited),
        n(&c.burst_closed),
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

/// Whether a connection was admitted: the answer to its first line (a ping or a
/// `tier_status`) is that line's reply, not a refusal at the per-uid cap. The refusal
/// comes before anything is read, so a write may fail on a refused connection.
fn admitted<T>(
    w: &mut UnixStream,
    r: &mut impl BufRead,
    probe: &[u8],
    decode: impl Fn(&str) -> Result<T, memcolo_proto::DecodeError>,
    refusal: impl Fn(&T) -> bool,
    what: &str,
) -> Result<bool> {
    let _ = w.write_all(probe);
    let mut line = String::new();
    if r.read_line(&mut line)
        .with_context(|| format!("{what}: waiting for the first reply"))?
        == 0
    {
        bail!("{what}: connection closed without a reply or a refusal");
    }
    let reply = decode(&line).with_context(|| format!("{what}: undecodable reply {line:?}"))?;
    Ok(!refusal(&reply))
}

const PING: &[u8] = b"{\"v\":1,\"type\":\"ping\"}\n";
const TIER_STATUS: &[u8] = b"{\"v\":1,\"type\":\"tier_status\"}\n";

fn agent_refusal(r: &Reply) -> bool {
    matches!(r, Reply::Error { code: ErrorCode::LimitExceeded, message } if message.starts_with("connection refused"))
}

fn tier_refusal(r: &TierReply) -> bool {
    matches!(r, TierReply::Error { code: ErrorCode::PermissionDenied, message } if message.contains("connections"))
}

/// How long a worker refused at a cap waits before it connects again.
const REFUSED_BACKOFF: Duration = Duration::from_millis(50);

fn agent_worker(plan: &Plan, c: &Counters, seeds: &Seeds, quota: u64, seed: u64) -> Result<()> {
    let mut rng = Rng::with_seed(seed);
    let mut sent = 0u64;
    while sent < quota {
        let s = unix(&plan.agent_sock)?;
        c.conns.fetch_add(1, Ordering::Relaxed);
        let mut w = s.try_clone()?;
        let mut r = BufReader::new(s);
        if !admitted(
            &mut w,
            &mut r,
            PING,
            decode_reply,
            agent_refusal,
            "agent.sock",
        )? {
            c.agent_refused.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(REFUSED_BACKOFF);
            continue;
        }
        sent += 1;
        c.agent_lines.fetch_add(1, Ordering::Relaxed);
        c.agent_replies.fetch_add(1, Ordering::Relaxed);
        let batches = rng.usize(1..400);
        for b in 0..batches {
            let mut out = Vec::new();
            for _ in 0..BATCH {
                lines::push_line(&mut rng, seeds, &mut out);
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
        if !admitted(
            &mut w,
            &mut r,
            TIER_STATUS,
            decode_tier_reply,
            tier_refusal,
            "tier.sock",
        )? {
            c.tier_refused.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(REFUSED_BACKOFF);
            continue;
        }
        sent += 1;
        c.tier_lines.fetch_add(1, Ordering::Relaxed);
        c.tier_replies.fetch_add(1, Ordering::Relaxed);
        for _ in 0..rng.usize(1..200) {
            if sent >= plan.tier_lines {
                break;
            }
            let mut out = Vec::new();
            for _ in 0..BATCH {
                lines::push_line(&mut rng, seeds, &mut out);
            }
            let lines = out.iter().filter(|&&b| b == b'\n').count() as u64;
            // The batch is closed by a `tier_status` and answers are read up to its
            // reply: the batch's own `tier_status` lines are counted in.
            let statuses = out
                .split(|&b| b == b'\n')
                .filter(|l| {
                    matches!(
                        memcolo_proto::tier::decode_tier_request(&String::from_utf8_lossy(l)),
                        Ok(memcolo_proto::tier::TierRequest::TierStatus)
                    )
                })
                .count();
            out.extend_from_slice(TIER_STATUS);
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

/// Sends one sealed request of a random kind on an authenticated connection:
/// stores (whole pages with a right or wrong CRC-32, payloads of the wrong size),
/// loads, removes, stats, list region, hellos with any page size. All are answered.
fn send_frame(rng: &mut Rng, conn: &mut RawConn, id: u64) -> std::io::Result<()> {
    let key = PageKey::new(rng.u64(0..64), rng.u64(0..256));
    match rng.u8(0..12) {
        0..=3 => {
            let mut p = vec![0u8; PAGE];
            for _ in 0..8 {
                let i = rng.usize(0..PAGE);
                p[i] = rng.u8(..);
            }
            if rng.u8(0..10) == 0 {
                conn.send_header(op::STORE, id, key, PAGE as u32, rng.u32(..))?;
                conn.send_payload(&p)
            } else {
                conn.send(op::STORE, id, key, &p)
            }
        }
        4 => conn.send(op::STORE, id, key, &vec![7u8; rng.usize(0..3 * PAGE)]),
        5 | 6 => conn.send(op::LOAD, id, key, &[]),
        7 => conn.send(op::REMOVE, id, key, &[]),
        8 => conn.send(op::REMOVE_REGION, id, PageKey::new(key.region, 0), &[]),
        9 => conn.send(op::STATS, id, PageKey::new(0, 0), &[]),
        10 => {
            let p: Vec<u8> = match rng.u8(0..4) {
                0 => Vec::new(),
                1 => 0u32.to_le_bytes().to_vec(),
                2 => rng.u32(..).to_le_bytes().to_vec(),
                _ => vec![1; rng.usize(1..64)],
            };
            conn.send(
                op::LIST_REGION,
                id,
                PageKey::new(key.region, rng.u64(..)),
                &p,
            )
        }
        _ => {
            let size = if rng.bool() { PAGE as u32 } else { rng.u32(..) };
            conn.send(op::HELLO, id, PageKey::new(0, 0), &size.to_le_bytes())
        }
    }
}

/// Sends one damaged record on an authenticated connection, after which the server
/// closes it: a forged record (bytes not sealed with the session's key), a sealed
/// header with an unknown op or a payload over the limit, or a header announcing the
/// largest payload followed by a short payload record.
fn send_damaged(rng: &mut Rng, conn: &mut RawConn, id: u64) -> std::io::Result<()> {
    let key = PageKey::new(rng.u64(0..64), rng.u64(0..256));
    match rng.u8(0..4) {
        0 => {
            let mut forged = vec![0u8; 40 + 16];
            rng.fill(&mut forged);
            forged[..4].copy_from_slice(&frames::MAGIC);
            conn.stream().write_all(&forged)
        }
        1 => conn.send_header(rng.u8(8..), id, key, 0, 0),
        2 => conn.send_header(
            op::STORE,
            id,
            key,
            frames::MAX_PAYLOAD + 1 + rng.u32(..1 << 20),
            0,
        ),
        _ => {
            conn.send_header(op::STORE, id, key, frames::MAX_PAYLOAD, 0)?;
            conn.send_payload(&[0; 100])
        }
    }
}

/// The authenticated client: 9/10 of the frames, in batches of [`BATCH`], every
/// answer read and matched to its request; one batch in 30 ends with a damaged
/// record, and the connection must then close after the answers owed.
fn memserver_worker(plan: &Plan, c: &Counters, auth: &Auth) -> Result<()> {
    let mut rng = Rng::with_seed(plan.seed ^ 0x3e3);
    let quota = plan.frames - plan.frames / 10;
    let mut sent = 0u64;
    let mut id = 1u64;
    while sent < quota {
        let Some(mut conn) = frames::connect(plan.memserver, auth, ANSWER_TIMEOUT)
            .context("memserver: authenticated connection")?
        else {
            c.mem_busy.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(REFUSED_BACKOFF);
            continue;
        };
        c.conns.fetch_add(1, Ordering::Relaxed);
        for _ in 0..rng.usize(1..300) {
            if sent >= quota {
                break;
            }
            let damaged = rng.u8(0..30) == 0;
            let mut ids = Vec::new();
            for k in 0..BATCH {
                if damaged && k + 1 == BATCH {
                    send_damaged(&mut rng, &mut conn, id).context("memserver: writing")?;
                    c.damaged.fetch_add(1, Ordering::Relaxed);
                } else {
                    send_frame(&mut rng, &mut conn, id).context("memserver: writing")?;
                    ids.push(id);
                }
                id += 1;
            }
            sent += BATCH as u64;
            c.frames.fetch_add(BATCH as u64, Ordering::Relaxed);
            if damaged {
                // The server may hold its answers until the record it is reading
                // ends: end the stream first.
                conn.stream().shutdown(std::net::Shutdown::Write)?;
            }
            for want in &ids {
                let a = conn
                    .recv()
                    .with_context(|| format!("memserver: waiting for the answer to {want}"))?;
                anyhow::ensure!(
                    a.id == *want,
                    "memserver: answer to {}, expected {want}",
                    a.id
                );
                c.responses.fetch_add(1, Ordering::Relaxed);
            }
            if damaged {
                match conn.recv() {
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::UnexpectedEof
                                | std::io::ErrorKind::ConnectionReset
                        ) => {}
                    other => bail!(
                        "memserver: expected the connection closed after a damaged record, got {other:?}"
                    ),
                }
                break;
            }
        }
    }
    Ok(())
}

/// The attacker without the secret: 1/10 of the frames, on connections of their
/// own: old-protocol (MCM1) frames, client hellos with a guessed proof or the other
/// mode, truncated hellos, random bytes, an HTTP request. Each connection must be
/// refused (or turned away busy), never accepted.
fn unauth_worker(plan: &Plan, c: &Counters) -> Result<()> {
    let mut rng = Rng::with_seed(plan.seed ^ 0xa17);
    let quota = plan.frames / 10;
    let mut sent = 0u64;
    while sent < quota {
        let mut nonce = [0u8; 32];
        let mut proof = [0u8; 32];
        rng.fill(&mut nonce);
        rng.fill(&mut proof);
        let (bytes, n) = match rng.u8(0..6) {
            0 | 1 => {
                let n = rng.u64(1..=32);
                let mut out = Vec::new();
                for i in 0..n {
                    let p = vec![rng.u8(..); if rng.bool() { PAGE } else { 4 }];
                    out.extend(frames::old_request(rng.u8(1..=7), i, 0, i, &p));
                }
                (out, n)
            }
            2 => (frames::client_hello(1, &nonce, &proof), 1),
            3 => (frames::client_hello(rng.u8(..), &nonce, &proof), 1),
            4 => {
                let h = frames::client_hello(1, &nonce, &proof);
                (h[..rng.usize(0..72)].to_vec(), 1)
            }
            _ => {
                if rng.bool() {
                    (b"GET / HTTP/1.1\r\nHost: memserver\r\n\r\n".to_vec(), 1)
                } else {
                    let mut b = vec![0u8; rng.usize(1..4096)];
                    rng.fill(&mut b);
                    (b, 1)
                }
            }
        };
        let mut s = TcpStream::connect(plan.memserver).context("memserver: connecting")?;
        s.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        s.set_write_timeout(Some(ANSWER_TIMEOUT))?;
        c.conns.fetch_add(1, Ordering::Relaxed);
        // The server closes after it refuses: a failed write is expected.
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let heard = frames::read_to_close(&mut s).context("memserver: unauthenticated peer")?;
        match frames::judge(&heard).context("memserver: unauthenticated peer")? {
            Verdict::Busy => {
                c.mem_busy.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(REFUSED_BACKOFF);
                continue;
            }
            Verdict::Refused => {}
        }
        sent += n;
        c.unauth_frames.fetch_add(n, Ordering::Relaxed);
        c.unauth_conns.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// How one burst connection fared.
enum Fate {
    Answered,
    /// Refused at a cap, with the cap's refusal.
    Limited,
    /// Failed to connect, or closed without an answer.
    Closed,
}

/// Opens `plan.burst_conns` connections to agent.sock, a fifth as many to tier.sock
/// and to the memory server (with the secret), all at once; asks each for an answer
/// (ping, tier_status, hello), then closes them all. Past each cap the connections
/// are refused with that cap's refusal.
fn burst(plan: &Plan, c: &Counters, auth: &Auth) -> Result<()> {
    let mut agent = Vec::new();
    let mut tier = Vec::new();
    let mut mem = Vec::new();
    for _ in 0..plan.burst_conns {
        agent.push(UnixStream::connect(&plan.agent_sock));
    }
    for _ in 0..plan.burst_conns / 5 {
        tier.push(UnixStream::connect(&plan.tier_sock));
        mem.push(frames::connect(
            plan.memserver,
            auth,
            Duration::from_secs(20),
        ));
    }
    c.conns.fetch_add(
        (agent.len() + tier.len() + mem.len()) as u64,
        Ordering::Relaxed,
    );
    fn ask<T>(
        s: std::io::Result<UnixStream>,
        line: &[u8],
        decode: impl Fn(&str) -> Result<T, memcolo_proto::DecodeError>,
        refusal: impl Fn(&T) -> bool,
    ) -> Fate {
        let Ok(mut s) = s else { return Fate::Closed };
        let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
        let _ = s.write_all(line);
        let mut r = BufReader::new(s);
        let mut l = String::new();
        match r.read_line(&mut l) {
            Ok(n) if n > 0 => match decode(&l) {
                Ok(reply) if refusal(&reply) => Fate::Limited,
                Ok(_) => Fate::Answered,
                Err(_) => Fate::Closed,
            },
            _ => Fate::Closed,
        }
    }
    let mut fates = Vec::new();
    for s in agent {
        fates.push(ask(s, PING, decode_reply, agent_refusal));
    }
    for s in tier {
        fates.push(ask(s, TIER_STATUS, decode_tier_reply, tier_refusal));
    }
    for s in mem {
        fates.push(match s {
            Ok(Some(mut conn)) => match frames::hello(&mut conn, 1, PAGE as u32) {
                Ok((0, 1)) => Fate::Answered,
                _ => Fate::Closed,
            },
            Ok(None) => Fate::Limited,
            Err(_) => Fate::Closed,
        });
    }
    for f in fates {
        match f {
            Fate::Answered => &c.burst_answered,
            Fate::Limited => &c.burst_limited,
            Fate::Closed => &c.burst_closed,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
