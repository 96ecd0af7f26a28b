//! Fuzzes a real memory server (`memcolo_tier::memserver::MemServer`, in this
//! process, on loopback, with the shared secret `memserver_wire::TEST_SECRET`)
//! through its socket, one connection per input. The first byte picks the peer:
//!
//! - even: an attacker without the secret; the rest is what it writes after the
//!   server's greeting. The server never answers it with an accepting verdict.
//! - odd: a client holding the secret (`memcolo_tier::wire::RawConn`, the crate's own
//!   handshake); the rest is a program of sealed requests, some valid (hello, store of
//!   a whole page, load, remove, list region …, any op byte), some damaged: a wrong
//!   CRC-32, a header whose payload length lies, a forged (unsealed) record. This
//!   reaches the server's handling of each operation and its compressed store.
//!
//! A panic in a connection thread aborts the process (libFuzzer's panic hook), so it
//! is a crash here; the server must also always finish the connection.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memcolo_fuzz::memserver_wire::TEST_SECRET;
use memcolo_tier::channel::{Auth, Secret};
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::memserver::{MemServer, MemServerHandle, ServerConfig};
use memcolo_tier::wire::RawConn;
use memcolo_tier::{checksum, PageKey};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

const PAGE: usize = 4096;

fn auth() -> Auth {
    Auth::Secret(Arc::new(
        Secret::from_bytes(TEST_SECRET.to_vec()).expect("a 32-byte secret"),
    ))
}

fn server() -> &'static MemServerHandle {
    static SERVER: OnceLock<MemServerHandle> = OnceLock::new();
    SERVER.get_or_init(|| {
        let store = Arc::new(CompressedStore::new(PAGE, 16 << 20));
        MemServer::bind("127.0.0.1:0", store, ServerConfig::new(auth(), 16 << 20))
            .and_then(MemServer::spawn)
            .expect("memory server on loopback")
    })
}

/// Reads what the server sends until it closes; panics if it never does.
fn drain(mut s: TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut sink = Vec::new();
    match s.read_to_end(&mut sink) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("memory server did not finish the connection: {e}"),
    }
    sink
}

fn take<'a>(p: &mut &'a [u8], n: usize) -> &'a [u8] {
    let n = n.min(p.len());
    let (a, b) = p.split_at(n);
    *p = b;
    a
}

fn byte(p: &mut &[u8]) -> u8 {
    take(p, 1).first().copied().unwrap_or(0)
}

/// Runs the authenticated program `p` (module docs): each step a command byte, then
/// op, region, page and a payload size byte (0xff: a whole page of the next byte).
fn program(conn: &mut RawConn, mut p: &[u8]) -> std::io::Result<()> {
    let mut id = 0u64;
    while let Some((&cmd, rest)) = p.split_first() {
        p = rest;
        id += 1;
        let (op, region, page) = (byte(&mut p), byte(&mut p), byte(&mut p));
        let key = PageKey::new(u64::from(region), u64::from(page));
        let payload = match byte(&mut p) {
            0xff => vec![byte(&mut p); PAGE],
            n => take(&mut p, n as usize).to_vec(),
        };
        match cmd % 8 {
            0..=3 => conn.send(op, id, key, &payload)?,
            4 => {
                // A wrong CRC-32.
                let crc = checksum(&payload) ^ 1;
                conn.send_header(op, id, key, payload.len() as u32, crc)?;
                if !payload.is_empty() {
                    conn.send_payload(&payload)?;
                }
            }
            5 => {
                // A header whose length lies about the payload record that follows.
                let len = u32::from_le_bytes([byte(&mut p), byte(&mut p), byte(&mut p), 0]);
                conn.send_header(op, id, key, len, checksum(&payload))?;
                conn.send_payload(&payload)?;
            }
            6 => conn.stream().write_all(&payload)?,
            _ => break,
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let addr = server().addr();
    if sel & 1 == 0 {
        let mut s = TcpStream::connect(addr).expect("connect to the memory server");
        // The server may close first (bytes it refuses): a failed write is fine.
        let _ = s.write_all(rest);
        let _ = s.shutdown(Shutdown::Write);
        let heard = drain(s);
        // A greeting (or a busy refusal), then at most a refusal: never a verdict
        // that accepts a client which could not have seen the server's nonce.
        if heard.len() > 44 && heard[4] == 0 {
            assert_ne!(heard[44], 0, "an unauthenticated client was accepted");
        }
        return;
    }
    // Connections the server closed a moment ago may still hold a slot: retry while
    // it says busy.
    let mut conn = (0..100)
        .find_map(|_| match RawConn::connect(addr, &auth()) {
            Ok(c) => Some(c),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                std::thread::sleep(Duration::from_millis(10));
                None
            }
            Err(e) => panic!("handshake with the test secret failed: {e}"),
        })
        .expect("the memory server stays busy");
    let reader = conn.stream().try_clone().expect("clone the socket");
    std::thread::scope(|sc| {
        let answers = sc.spawn(move || drain(reader));
        // The server may close first (a frame it refuses): a failed write is fine.
        let _ = program(&mut conn, rest);
        let _ = conn.stream().shutdown(Shutdown::Write);
        answers.join().expect("reader thread");
    });
});
