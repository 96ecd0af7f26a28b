//! Hostile peers of the memory server, on loopback: peers without the secret, a
//! server with another secret, frames replayed in transit, connection floods, idle
//! connections, and stores larger than the server's memory. Each test asserts what
//! the server refuses and that an authenticated client still works.

use memcolo_tier::channel::{Auth, Secret};
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::memserver::{MemServer, MemServerHandle, ServerConfig};
use memcolo_tier::remote::{RemoteConfig, RemoteTier};
use memcolo_tier::wire::RawConn;
use memcolo_tier::{PageKey, SlowTier, TierError};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
const STORE: u8 = 2;
const LOAD: u8 = 3;

fn secret(b: u8) -> Auth {
    Auth::Secret(Arc::new(Secret::from_bytes(vec![b; 32]).unwrap()))
}

fn server_with(cfg: ServerConfig) -> MemServerHandle {
    let store = Arc::new(CompressedStore::new(PAGE, cfg.capacity_bytes));
    MemServer::bind("127.0.0.1:0", store, cfg)
        .unwrap()
        .spawn()
        .unwrap()
}

fn client(addr: impl ToString, auth: Auth) -> Result<RemoteTier, TierError> {
    RemoteTier::connect(RemoteConfig {
        connect_timeout: Duration::from_secs(1),
        io_timeout: Duration::from_secs(5),
        attempts: 2,
        backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
        ..RemoteConfig::new(addr.to_string(), PAGE, auth)
    })
}

fn wait(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < Duration::from_secs(60), "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The tests of this file one at a time: they count the process's connection
/// threads, which the servers of tests running beside them would add to.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Threads of this process whose name starts with `memserver-conn`.
fn conn_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.starts_with("memserver-conn"))
        .count()
}

#[test]
fn a_peer_without_the_secret_can_neither_read_nor_write_pages() {
    let _serial = serial();
    let h = server_with(ServerConfig::new(secret(1), 16 << 20));
    let agent = client(h.addr(), secret(1)).unwrap();
    let key = PageKey::new(42, 0);
    agent.store(key, &[b'V'; PAGE]).unwrap();
    // No secret, a wrong secret, the old unauthenticated protocol.
    for auth in [Auth::InsecureNoAuth, secret(2)] {
        let err = RawConn::connect(h.addr(), &auth).err().expect("connected");
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
        match client(h.addr(), auth) {
            Err(TierError::Auth { .. }) => {}
            other => panic!("{:?}", other.err()),
        }
    }
    let mut old = TcpStream::connect(h.addr()).unwrap();
    let mut frame = b"MCM1".to_vec();
    frame.extend_from_slice(&[LOAD, 0, 0, 0]);
    frame.extend_from_slice(&[0; 32]);
    frame[16..24].copy_from_slice(&42u64.to_le_bytes());
    old.write_all(&frame).unwrap();
    old.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let _ = old.read_to_end(&mut got);
    assert!(
        !got.windows(8).any(|w| w == [b'V'; 8]),
        "the page was handed out"
    );
    assert!(String::from_utf8_lossy(&got).contains("MCM1"), "{got:?}");
    let mut out = vec![0u8; PAGE];
    agent.load(key, &mut out).unwrap();
    assert_eq!(out, vec![b'V'; PAGE], "the page was overwritten");
}

#[test]
fn a_server_with_another_secret_is_refused_by_the_client() {
    let _serial = serial();
    let h = server_with(ServerConfig::new(secret(3), 16 << 20));
    match client(h.addr(), secret(4)) {
        Err(TierError::Auth { reason, .. }) => assert!(reason.contains("proof"), "{reason}"),
        other => panic!("{:?}", other.err()),
    }
    // A server without authentication is refused by a client with a secret.
    let open = server_with(ServerConfig::new(Auth::InsecureNoAuth, 16 << 20));
    match client(open.addr(), secret(3)) {
        Err(TierError::Auth { reason, .. }) => {
            assert!(reason.contains("insecure-no-auth"), "{reason}")
        }
        other => panic!("{:?}", other.err()),
    }
}

/// A proxy that forwards client bytes to the server; once past the handshake
/// (`skip` bytes), it sends every chunk twice (a replay).
fn replaying_proxy(server: std::net::SocketAddr, skip: usize) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let mut s = TcpStream::connect(server).unwrap();
            let (mut c2, mut s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                // The server hung up: so does the proxy, toward the client.
                let _ = c2.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || {
                let mut seen = 0;
                let mut buf = [0u8; 65536];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        return;
                    }
                    if seen >= skip {
                        let _ = s.write_all(&buf[..n]);
                    }
                    seen += n;
                }
            });
        }
    });
    addr
}

#[test]
fn a_replayed_frame_is_refused_and_the_connection_dropped() {
    let _serial = serial();
    let h = server_with(ServerConfig::new(secret(5), 16 << 20));
    let proxy = replaying_proxy(h.addr(), 72);
    let mut c = RawConn::connect(proxy, &secret(5)).unwrap();
    c.stream()
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    c.send(STORE, 1, PageKey::new(1, 1), &[7u8; PAGE]).unwrap();
    // The replayed record fails to open wherever it falls and the server hangs up:
    // after the whole frame, the frame is answered once; inside it (the proxy saw the
    // header and the payload as two chunks), the frame never completes. Nothing is
    // ever answered twice.
    if let Ok(first) = c.recv() {
        assert_eq!(first.status, 0);
    }
    assert!(c.recv().is_err());
    wait("the replaying connection to close", || {
        h.open_connections() == 0
    });
}

#[test]
fn a_flood_beyond_the_cap_is_refused_while_an_agent_works() {
    let _serial = serial();
    let cfg = ServerConfig {
        max_connections: 8,
        ..ServerConfig::new(secret(6), 16 << 20)
    };
    let h = server_with(cfg);
    let agent = client(h.addr(), secret(6)).unwrap();
    agent.store(PageKey::new(1, 0), &[1u8; PAGE]).unwrap();
    let before = conn_threads();
    let flood: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect(h.addr()).ok())
        .collect();
    wait("the cap to be reached", || h.open_connections() == 8);
    wait("the refusals", || h.refused_connections() >= 150);
    // The agent's pooled connection is one of the 8; it still works.
    let mut out = vec![0u8; PAGE];
    agent.load(PageKey::new(1, 0), &mut out).unwrap();
    assert_eq!(out, vec![1u8; PAGE]);
    assert!(conn_threads() <= 8, "{} connection threads", conn_threads());
    assert!(conn_threads() >= before);
    // A refused peer is told why.
    let mut late = TcpStream::connect(h.addr()).unwrap();
    late.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    let _ = late.read_to_end(&mut got);
    assert!(
        String::from_utf8_lossy(&got).contains("too many connections"),
        "{got:?}"
    );
    drop(flood);
    wait("the flood's slots to be freed", || {
        h.open_connections() <= 1
    });
    let fresh = client(h.addr(), secret(6)).unwrap();
    fresh.load(PageKey::new(1, 0), &mut out).unwrap();
}

#[test]
fn idle_and_silent_connections_time_out_and_free_their_slots() {
    let _serial = serial();
    let cfg = ServerConfig {
        max_connections: 4,
        handshake_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_secs(1),
        ..ServerConfig::new(secret(7), 16 << 20)
    };
    let h = server_with(cfg);
    // Two never speak (no handshake), two authenticate and then idle.
    let _silent: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(h.addr()).unwrap())
        .collect();
    let _idle: Vec<RawConn> = (0..2)
        .map(|_| RawConn::connect(h.addr(), &secret(7)).unwrap())
        .collect();
    wait("the four slots to be taken", || h.open_connections() == 4);
    wait("the slots to be freed", || h.open_connections() == 0);
    // The client drops its pooled connection before the server's idle timeout.
    let agent = client(h.addr(), secret(7)).unwrap();
    agent.store(PageKey::new(2, 0), &[2u8; PAGE]).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    agent.store(PageKey::new(2, 1), &[2u8; PAGE]).unwrap();
    assert_eq!(agent.stats().retries, 0);
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn stores_beyond_the_capacity_in_flight_are_refused() {
    let _serial = serial();
    const CAP: u64 = 16 << 20;
    const BIG: u32 = 4 << 20;
    let cfg = ServerConfig {
        max_connections: 150,
        ..ServerConfig::new(secret(8), CAP)
    };
    let h = server_with(cfg);
    let rss_before = rss_kib();
    // 150 connections announce a 4 MiB store each and send a little of it.
    let mut conns: Vec<RawConn> = (0..150)
        .map(|i| {
            let mut c = RawConn::connect(h.addr(), &secret(8)).unwrap();
            c.send_header(STORE, i, PageKey::new(3, i), BIG, 0).unwrap();
            c.stream().write_all(&[0u8; 1000]).unwrap();
            c
        })
        .collect();
    wait("every header to be read", || {
        h.in_flight_bytes() >= 3 * u64::from(BIG)
    });
    std::thread::sleep(Duration::from_millis(500));
    let peak = h.peak_accounted_bytes();
    let rss_after = rss_kib();
    eprintln!(
        "in flight {} B, peak accounted {} B, capacity {CAP} B; test process RSS {} -> {} KiB",
        h.in_flight_bytes(),
        peak,
        rss_before,
        rss_after
    );
    assert!(peak <= CAP, "{peak} > {CAP}");
    assert!(h.in_flight_bytes() <= CAP);
    // A refused store is answered `full` once its bytes have passed.
    let mut c = conns.pop().unwrap();
    c.stream()
        .write_all(&vec![0u8; BIG as usize + 16 - 1000])
        .unwrap();
    c.stream()
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    assert_eq!(c.recv().unwrap().status, 3);
    drop(conns);
    wait("the reservations to be released", || {
        h.in_flight_bytes() == 0
    });
    let agent = client(h.addr(), secret(8)).unwrap();
    agent.store(PageKey::new(3, 0), &[3u8; PAGE]).unwrap();
    assert!(h.accounted_bytes() <= CAP);
}
