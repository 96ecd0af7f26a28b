//! The memory server's handshake and sealed frames (`crates/memcolo-tier/src/channel.rs`
//! and `wire.rs`, `docs/protocol.md` §12), compiled here from those files, and the
//! harnesses the `memserver_frame` target runs on them.
//!
//! Their readers are crate-private; including the source files tests exactly the code
//! the server and the agent's remote tier run without widening the crate's API.
//!
//! - [`server_handshake`] / [`client_handshake`]: one side of the handshake against
//!   a scripted peer that sends the fuzzer's bytes (an attacker without the secret,
//!   or a hostile server). Such a peer never completes it: it cannot prove a secret
//!   it does not hold over a nonce it never saw.
//! - [`sealed_stream`]: the fuzzer's bytes as the plaintext of a stream of frames,
//!   cut and sealed as an honest peer would under the keys of a real handshake with
//!   [`TEST_SECRET`], optionally tampered with in transit, then read by the other
//!   side's decoders. Every frame decoded is one that was sent, in order, byte for
//!   byte; untampered, every well-formed frame sent is decoded.

use crate::channel::{self, Auth, Dir, Keys, Secret, MAGIC, MAX_REASON, ST_DENIED, ST_OK};
use crate::wire::{self, MAX_PAYLOAD, REQUEST_HEADER, RESPONSE_HEADER};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// The shared secret of the fuzz targets' sessions (32 bytes, public: a test key).
pub const TEST_SECRET: [u8; 32] = *b"memcolo fuzz test secret 32 byte";

/// Bytes of a greeting (and of a verdict): magic, status, mode, 2 zero bytes, nonce
/// or proof.
const GREETING: usize = 40;
/// Bytes of a client hello: magic, mode, 3 zero bytes, nonce, proof.
const CLIENT_HELLO: usize = 72;

fn auth(insecure: bool) -> Auth {
    if insecure {
        Auth::InsecureNoAuth
    } else {
        Auth::Secret(Arc::new(
            Secret::from_bytes(TEST_SECRET.to_vec()).expect("a 32-byte secret"),
        ))
    }
}

/// A peer that sends a fixed script and records what it is sent.
struct Scripted<'a> {
    script: &'a [u8],
    heard: Vec<u8>,
}

impl Read for Scripted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.script.read(buf)
    }
}

impl Write for Scripted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.heard.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Checks that `b` is one refusal (status, u32 length, reason of at most
/// [`MAX_REASON`] bytes) and nothing more.
fn assert_refusal(b: &[u8], status: u8) {
    assert!(b.len() >= 12, "short refusal {b:02x?}");
    assert_eq!(b[..4], MAGIC, "refusal with a bad magic");
    assert_eq!(b[4], status, "refusal with status {}", b[4]);
    let len = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    assert!(len <= MAX_REASON, "refusal reason of {len} bytes");
    assert_eq!(b.len(), 12 + len as usize, "bytes after the refusal");
}

/// The server's handshake (`channel::server_handshake`, with [`TEST_SECRET`], or
/// without authentication) against a client that sends `attacker`: it never
/// completes, the server sends one greeting and at most one refusal.
pub fn server_handshake(insecure: bool, attacker: &[u8]) {
    let mut peer = Scripted {
        script: attacker,
        heard: Vec::new(),
    };
    let r = channel::server_handshake(&mut peer, &auth(insecure));
    assert!(
        r.is_err(),
        "a client that never saw the server's nonce completed the handshake"
    );
    let out = &peer.heard;
    assert!(out.len() >= GREETING, "no greeting: {out:02x?}");
    assert_eq!(out[..4], MAGIC);
    assert_eq!(out[4], ST_OK);
    assert_eq!(out[5], u8::from(!insecure));
    if out.len() > GREETING {
        assert_refusal(&out[GREETING..], ST_DENIED);
    }
}

/// The client's handshake (`channel::client_handshake`) against a server that sends
/// `server` (a compromised or impostor server): it never completes, and the client
/// sends nothing but at most one client hello.
pub fn client_handshake(insecure: bool, server: &[u8]) {
    let mut peer = Scripted {
        script: server,
        heard: Vec::new(),
    };
    let r = channel::client_handshake(&mut peer, &auth(insecure));
    assert!(
        r.is_err(),
        "a server that never saw the client's nonce completed the handshake"
    );
    assert!(
        peer.heard.is_empty() || peer.heard.len() == CLIENT_HELLO,
        "the client sent {} bytes",
        peer.heard.len()
    );
}

/// The client's and the server's keys of one real handshake with [`TEST_SECRET`]
/// (`channel::client_handshake` and `server_handshake` over a socket pair): fresh
/// nonces, so fresh keys and record counters, every call.
fn session() -> (Keys, Keys) {
    let (mut c, mut s) = UnixStream::pair().expect("socket pair");
    std::thread::scope(|sc| {
        let server = sc.spawn(move || channel::server_handshake(&mut s, &auth(false)));
        let client = channel::client_handshake(&mut c, &auth(false))
            .unwrap_or_else(|e| panic!("client handshake with the test secret: {e:?}"));
        let server = server
            .join()
            .expect("server handshake thread")
            .expect("server handshake with the test secret");
        (client, server)
    })
}

/// Which side's decoder [`sealed_stream`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The server reading a client's requests (`wire::read_request_header`,
    /// `wire::read_payload`).
    Server,
    /// The client (the agent's remote tier) reading a server's responses
    /// (`wire::read_response`): the server may be on another, compromised machine.
    Client,
}

impl Side {
    fn header(self) -> usize {
        match self {
            Side::Server => REQUEST_HEADER,
            Side::Client => RESPONSE_HEADER,
        }
    }

    /// Where the header's payload length is.
    fn len_at(self) -> usize {
        match self {
            Side::Server => 32,
            Side::Client => 16,
        }
    }

    /// Whether the reader accepts this header (the frame tables of `wire.rs`).
    fn accepts(self, h: &[u8]) -> bool {
        let len = u32::from_le_bytes(h[self.len_at()..self.len_at() + 4].try_into().unwrap());
        let known = match self {
            Side::Server => (1..=7).contains(&h[4]),
            Side::Client => h[4] <= 5,
        };
        h[..4] == MAGIC && known && len <= MAX_PAYLOAD
    }
}

/// How records are damaged in transit (none, or one change at `at`).
#[derive(Clone, Copy, Debug)]
pub enum Tamper {
    /// Delivered as sent.
    None,
    /// One bit of the byte stream flipped.
    FlipBit { at: u16 },
    /// The byte stream cut short.
    Truncate { at: u16 },
    /// One record left out.
    Drop { at: u16 },
    /// One record delivered twice (a replay).
    Replay { at: u16 },
    /// Two neighbouring records swapped.
    Swap { at: u16 },
    /// Unsealed bytes (the record's plaintext) in place of one record.
    Unsealed { at: u16 },
}

fn seal(tx: &mut Dir, plain: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(plain.len() + channel::TAG_BYTES);
    tx.write(&mut out, plain).expect("sealing into a Vec");
    out
}

/// The frame header `wire::write_request` / `write_response` writes for a decoded
/// frame, before sealing (reserved bytes zero).
fn request_bytes(h: &wire::RequestHeader, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; REQUEST_HEADER];
    b[..4].copy_from_slice(&MAGIC);
    b[4] = h.op as u8;
    b[8..16].copy_from_slice(&h.id.to_le_bytes());
    b[16..24].copy_from_slice(&h.key.region.to_le_bytes());
    b[24..32].copy_from_slice(&h.key.page.to_le_bytes());
    b[32..36].copy_from_slice(&h.len.to_le_bytes());
    b[36..40].copy_from_slice(&h.crc.to_le_bytes());
    b.extend_from_slice(payload);
    b
}

fn response_bytes(r: &wire::Response) -> Vec<u8> {
    let mut b = vec![0u8; RESPONSE_HEADER];
    b[..4].copy_from_slice(&MAGIC);
    b[4] = r.status as u8;
    b[8..16].copy_from_slice(&r.id.to_le_bytes());
    b[16..20].copy_from_slice(&(r.payload.len() as u32).to_le_bytes());
    b[20..24].copy_from_slice(&r.crc.to_le_bytes());
    b.extend_from_slice(&r.payload);
    b
}

/// Sends `plain` as a stream of frames from one side to the other over a fresh
/// session (module docs): header records of the side's fixed size, each followed by
/// a payload record of the length its header names (with `fit`, that length is first
/// reduced modulo what the input has left, so that streams of several whole frames
/// are common). A header the reader refuses, or an input that runs out, ends the
/// stream. The records are damaged as `tamper` says, then decoded. Panics when a
/// decoded frame is not the next frame sent, or when, undamaged, a frame sent whole is
/// not decoded. Returns how many frames decoded.
pub fn sealed_stream(side: Side, fit: bool, tamper: Tamper, plain: &[u8]) -> usize {
    let (client, server) = session();
    let (mut tx, mut rx) = match side {
        Side::Server => (client.send, server.recv),
        Side::Client => (server.send, client.recv),
    };
    let (hl, la) = (side.header(), side.len_at());
    let mut sent: Vec<Vec<u8>> = Vec::new();
    let mut records: Vec<Vec<u8>> = Vec::new();
    let mut plains: Vec<Vec<u8>> = Vec::new();
    let mut rest = plain;
    while !rest.is_empty() {
        let n = rest.len().min(hl);
        let mut h = rest[..n].to_vec();
        rest = &rest[n..];
        if n < hl {
            records.push(seal(&mut tx, &h));
            plains.push(h);
            break;
        }
        let mut len = u32::from_le_bytes(h[la..la + 4].try_into().expect("4 bytes"));
        if fit {
            len %= rest.len() as u32 + 1;
            h[la..la + 4].copy_from_slice(&len.to_le_bytes());
        }
        records.push(seal(&mut tx, &h));
        plains.push(h.clone());
        if !side.accepts(&h) {
            break;
        }
        let take = (len as usize).min(rest.len());
        let payload = &rest[..take];
        rest = &rest[take..];
        if len > 0 {
            records.push(seal(&mut tx, payload));
            plains.push(payload.to_vec());
        }
        if take < len as usize {
            break;
        }
        h[5..8].fill(0);
        h.extend_from_slice(payload);
        sent.push(h);
    }

    let n = records.len();
    let idx = |at: u16| at as usize % n.max(1);
    match tamper {
        Tamper::None => {}
        Tamper::Drop { at } if n > 0 => {
            records.remove(idx(at));
        }
        Tamper::Replay { at } if n > 0 => {
            let r = records[idx(at)].clone();
            records.insert(idx(at) + 1, r);
        }
        Tamper::Swap { at } if n > 1 => {
            let i = at as usize % (n - 1);
            records.swap(i, i + 1);
        }
        Tamper::Unsealed { at } if n > 0 => {
            let i = idx(at);
            records[i] = plains[i].clone();
            records[i].resize(plains[i].len() + channel::TAG_BYTES, 0);
        }
        _ => {}
    }
    let mut stream: Vec<u8> = records.concat();
    match tamper {
        Tamper::FlipBit { at } if !stream.is_empty() => {
            let i = at as usize % stream.len();
            stream[i] ^= 1 << (at % 8);
        }
        Tamper::Truncate { at } => stream.truncate(at as usize % (stream.len() + 1)),
        _ => {}
    }

    let mut decoded = Vec::new();
    let mut r = &stream[..];
    loop {
        let frame = match side {
            Side::Server => match wire::read_request_header(&mut r, &mut rx) {
                Ok(None) => {
                    assert!(r.is_empty(), "end of stream reported with bytes left");
                    break;
                }
                Ok(Some(h)) => {
                    assert!(h.len <= MAX_PAYLOAD, "header of {} bytes accepted", h.len);
                    match wire::read_payload(&mut r, &mut rx, h.len) {
                        Ok(p) => request_bytes(&h, &p),
                        Err(_) => break,
                    }
                }
                Err(_) => break,
            },
            Side::Client => {
                if r.is_empty() {
                    break;
                }
                match wire::read_response(&mut r, &mut rx) {
                    Ok(resp) => {
                        assert!(resp.payload.len() <= MAX_PAYLOAD as usize);
                        response_bytes(&resp)
                    }
                    Err(_) => break,
                }
            }
        };
        decoded.push(frame);
    }
    assert!(
        decoded.len() <= sent.len() && decoded[..] == sent[..decoded.len()],
        "decoded frames that were not sent, or out of order ({tamper:?}): {} decoded, {} sent",
        decoded.len(),
        sent.len()
    );
    if matches!(tamper, Tamper::None) {
        assert_eq!(
            decoded.len(),
            sent.len(),
            "an undamaged, well-formed frame was refused"
        );
    }
    decoded.len()
}
