//! The memory server's wire as the soak's clients speak it (`docs/protocol.md` §12,
//! `crates/memcolo-tier/src/channel.rs` and `wire.rs`): an authenticated client goes
//! through the crate's own [`RawConn`] (handshake with the shared secret, sealed
//! records); an unauthenticated attacker writes raw bytes. The only place that
//! knows the layout.

use memcolo_tier::channel::Auth;
use memcolo_tier::wire::RawConn;
use memcolo_tier::PageKey;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::time::Duration;

/// Handshake and frame magic (protocol version).
pub const MAGIC: [u8; 4] = *b"MCM2";
/// The previous, unauthenticated protocol's magic.
pub const OLD_MAGIC: [u8; 4] = *b"MCM1";
/// Largest payload the server accepts, bytes (`wire::MAX_PAYLOAD`).
pub const MAX_PAYLOAD: u32 = 4 << 20;
/// Bytes of the server's greeting.
pub const GREETING: usize = 40;

/// Request operations (`wire::Op`).
pub mod op {
    pub const HELLO: u8 = 1;
    pub const STORE: u8 = 2;
    pub const LOAD: u8 = 3;
    pub const REMOVE: u8 = 4;
    pub const REMOVE_REGION: u8 = 5;
    pub const STATS: u8 = 6;
    pub const LIST_REGION: u8 = 7;
}

/// A request frame of the old, unauthenticated protocol (MCM1, in clear), as a
/// client of an older release or an attacker sends it.
pub fn old_request(op: u8, id: u64, region: u64, page: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + payload.len());
    out.extend_from_slice(&OLD_MAGIC);
    out.extend_from_slice(&[op, 0, 0, 0]);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&region.to_le_bytes());
    out.extend_from_slice(&page.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// A client hello (72 bytes) in `mode` (1 shared secret, 0 none) with the given
/// nonce and proof: without the secret, the proof is a guess.
pub fn client_hello(mode: u8, nonce: &[u8; 32], proof: &[u8; 32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(72);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[mode, 0, 0, 0]);
    out.extend_from_slice(nonce);
    out.extend_from_slice(proof);
    out
}

/// What the server said to an unauthenticated peer, read until it closed.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Greeted, then refused (or closed without a word: a peer that sent too little).
    Refused,
    /// Turned away at the greeting: the server is at its connection cap.
    Busy,
}

/// Reads what the server sent an unauthenticated peer (`heard`, up to its close)
/// and checks that it never accepted it: a greeting of status 0, then nothing or a
/// refusal of status 2; or a busy refusal (status 1) instead of the greeting.
pub fn judge(heard: &[u8]) -> io::Result<Verdict> {
    let bad = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{why}: {:02x?}", &heard[..heard.len().min(64)]),
        ))
    };
    if heard.len() < 8 || heard[..4] != MAGIC {
        return bad("no greeting");
    }
    match heard[4] {
        0 if heard.len() >= GREETING => {}
        1 => return Ok(Verdict::Busy),
        _ => return bad("bad greeting"),
    }
    let rest = &heard[GREETING..];
    if rest.is_empty() {
        return Ok(Verdict::Refused);
    }
    if rest.len() < 8 || rest[..4] != MAGIC {
        return bad("bad verdict");
    }
    if rest[4] == 0 {
        return bad("an unauthenticated peer was ACCEPTED");
    }
    Ok(Verdict::Refused)
}

/// Reads until the peer closes (a reset counts as closed).
pub fn read_to_close(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut heard = Vec::new();
    match r.read_to_end(&mut heard) {
        Ok(_) => Ok(heard),
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(heard),
        Err(e) => Err(e),
    }
}

/// Connects with the shared secret; `Ok(None)` when the server is at its cap.
pub fn connect(addr: SocketAddr, auth: &Auth, timeout: Duration) -> io::Result<Option<RawConn>> {
    match RawConn::connect(addr, auth) {
        Ok(c) => {
            c.stream().set_read_timeout(Some(timeout))?;
            c.stream().set_write_timeout(Some(timeout))?;
            Ok(Some(c))
        }
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(None),
        Err(e) => Err(e),
    }
}

/// Sends a hello with this page size and reads its answer: (status, request id).
pub fn hello(c: &mut RawConn, id: u64, page_bytes: u32) -> io::Result<(u8, u64)> {
    c.send(op::HELLO, id, PageKey::new(0, 0), &page_bytes.to_le_bytes())?;
    let a = c.recv()?;
    Ok((a.status, a.id))
}

/// CRC-32 (IEEE), as `memcolo_tier::checksum`.
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}
