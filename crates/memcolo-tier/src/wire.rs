//! The memory server's wire protocol: binary frames over one TCP connection,
//! little-endian, one response per request, in request order (clients may pipeline).
//!
//! Every connection opens with the handshake of [`crate::channel`] (mutual
//! authentication with a shared secret); afterwards each frame travels sealed: its
//! header as one ChaCha20-Poly1305 record (40 + 16 bytes for a request, 24 + 16 for a
//! response) and its payload, when not empty, as a second (`len` + 16 bytes). The
//! header's payload length is therefore read only once authenticated, and is checked
//! against [`MAX_PAYLOAD`] (and, for a store, against the server's memory) before
//! anything is allocated for it.
//!
//! Request (40-byte header, then `len` payload bytes):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `MCM2` |
//! | 4 | op: 1 hello, 2 store, 3 load, 4 remove, 5 remove region, 6 stats, 7 list region |
//! | 5..8 | zero |
//! | 8..16 | request id (echoed in the response) |
//! | 16..24 | region |
//! | 24..32 | page (list region: the first page index to list) |
//! | 32..36 | payload length |
//! | 36..40 | CRC-32 of the payload (store: of the page) |
//!
//! Response (24-byte header, then `len` payload bytes):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `MCM2` |
//! | 4 | status: 0 ok, 1 not found, 2 corrupt, 3 full, 4 bad request, 5 internal |
//! | 5..8 | zero |
//! | 8..16 | request id |
//! | 16..20 | payload length |
//! | 20..24 | CRC-32 of the payload (load: of the page) |
//!
//! Payloads: hello sends the client's page size (u32) and gets the server's back,
//! followed by the server's instance id (u64, random per server start: a client
//! tells a restarted, empty server by it) and the server's idle timeout (u32, ms: a
//! connection idle that long is closed, so clients reuse idle connections only
//! for less);
//! store sends the page; load gets the page; remove gets one byte (1 if a page was
//! removed); remove region gets the count (u64); stats gets six u64 counters (pages,
//! stored bytes, stores, loads, corrupt, retries); errors get a UTF-8 message.
//! Only a store carries a payload longer than [`MAX_SMALL_PAYLOAD`] bytes.
//!
//! List region (op 7) names the region in the header's region field and the first
//! page index wanted in its page field (0 to start), and sends either no payload or
//! the most indices wanted (u32, at least 1). The answer's payload is the indices of
//! the pages the server holds for the region that are ≥ the first index asked,
//! ascending, as u64 each: at most the number asked and never more than
//! [`LIST_MAX_PAGES`] (524 288, which fill [`MAX_PAYLOAD`]); no payload in the
//! request means [`LIST_MAX_PAGES`]. An answer shorter than the number asked is the
//! end of the listing; a full answer may be followed by more: the client asks again
//! from its last index + 1. The answer's CRC-32 covers the payload, as for every
//! answer. Listing a region the server holds nothing of answers no indices, not
//! "not found".

use crate::channel::{self, Auth, Dir, HandshakeError, MAGIC};
use crate::{checksum, PageKey};
use std::io::{self, BufRead, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};

/// Largest payload accepted, bytes (a 2 MiB huge page with room to spare).
pub const MAX_PAYLOAD: u32 = 4 << 20;
/// Largest payload of a request other than a store, bytes.
pub const MAX_SMALL_PAYLOAD: u32 = 64;
/// Most page indices one list-region answer carries: as many u64 as fill
/// [`MAX_PAYLOAD`] (524 288, i.e. 2 GiB of 4 KiB pages).
pub const LIST_MAX_PAGES: u32 = MAX_PAYLOAD / 8;
/// Bytes of a request header.
pub(crate) const REQUEST_HEADER: usize = 40;
/// Bytes of a response header.
pub(crate) const RESPONSE_HEADER: usize = 24;

/// Request operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Hello = 1,
    Store = 2,
    Load = 3,
    Remove = 4,
    RemoveRegion = 5,
    Stats = 6,
    ListRegion = 7,
}

impl Op {
    fn from_u8(b: u8) -> Option<Op> {
        Some(match b {
            1 => Op::Hello,
            2 => Op::Store,
            3 => Op::Load,
            4 => Op::Remove,
            5 => Op::RemoveRegion,
            6 => Op::Stats,
            7 => Op::ListRegion,
            _ => return None,
        })
    }
}

/// Response statuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Ok = 0,
    NotFound = 1,
    Corrupt = 2,
    Full = 3,
    BadRequest = 4,
    Internal = 5,
}

impl Status {
    fn from_u8(b: u8) -> Option<Status> {
        Some(match b {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::Corrupt,
            3 => Status::Full,
            4 => Status::BadRequest,
            5 => Status::Internal,
            _ => return None,
        })
    }
}

/// A request header, authenticated; its payload is still to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestHeader {
    pub op: Op,
    pub id: u64,
    pub key: PageKey,
    pub len: u32,
    pub crc: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub op: Op,
    pub id: u64,
    pub key: PageKey,
    pub crc: u32,
    pub payload: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Response {
    pub status: Status,
    pub id: u64,
    pub crc: u32,
    pub payload: Vec<u8>,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Seals and writes `r` (header record, then payload record if any).
pub(crate) fn write_request(w: &mut impl Write, tx: &mut Dir, r: &Request) -> io::Result<()> {
    let mut h = [0u8; REQUEST_HEADER];
    h[0..4].copy_from_slice(&MAGIC);
    h[4] = r.op as u8;
    h[8..16].copy_from_slice(&r.id.to_le_bytes());
    h[16..24].copy_from_slice(&r.key.region.to_le_bytes());
    h[24..32].copy_from_slice(&r.key.page.to_le_bytes());
    h[32..36].copy_from_slice(&(r.payload.len() as u32).to_le_bytes());
    h[36..40].copy_from_slice(&r.crc.to_le_bytes());
    tx.write(w, &h)?;
    if !r.payload.is_empty() {
        tx.write(w, &r.payload)?;
    }
    Ok(())
}

/// Reads and opens one request header; `Ok(None)` on a clean end of stream before
/// it. The payload (`len` bytes, at most [`MAX_PAYLOAD`]) is the caller's to read
/// with [`read_payload`] or drop with [`Dir::skip`].
pub(crate) fn read_request_header(
    r: &mut impl BufRead,
    rx: &mut Dir,
) -> io::Result<Option<RequestHeader>> {
    if r.fill_buf()?.is_empty() {
        return Ok(None);
    }
    let mut h = [0u8; REQUEST_HEADER];
    rx.read_into(r, &mut h)?;
    if h[0..4] != MAGIC {
        return Err(invalid(format!("bad magic {:02x?}", &h[0..4])));
    }
    let op = Op::from_u8(h[4]).ok_or_else(|| invalid(format!("unknown op {}", h[4])))?;
    let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
    let len = u32_at(32);
    if len > MAX_PAYLOAD {
        return Err(invalid(format!("payload of {len} bytes > {MAX_PAYLOAD}")));
    }
    Ok(Some(RequestHeader {
        op,
        id: u64_at(8),
        key: PageKey::new(u64_at(16), u64_at(24)),
        len,
        crc: u32_at(36),
    }))
}

/// Reads and opens a payload record of `len` bytes (already checked by the caller).
pub(crate) fn read_payload(r: &mut impl Read, rx: &mut Dir, len: u32) -> io::Result<Vec<u8>> {
    let mut payload = vec![0u8; len as usize];
    if len > 0 {
        rx.read_into(r, &mut payload)?;
    }
    Ok(payload)
}

/// Reads one whole request (header and payload), for tests and fake servers.
#[cfg(test)]
pub(crate) fn read_request(r: &mut impl BufRead, rx: &mut Dir) -> io::Result<Option<Request>> {
    let Some(h) = read_request_header(r, rx)? else {
        return Ok(None);
    };
    Ok(Some(Request {
        op: h.op,
        id: h.id,
        key: h.key,
        crc: h.crc,
        payload: read_payload(r, rx, h.len)?,
    }))
}

/// Seals and writes `r` (header record, then payload record if any).
pub(crate) fn write_response(w: &mut impl Write, tx: &mut Dir, r: &Response) -> io::Result<()> {
    let mut h = [0u8; RESPONSE_HEADER];
    h[0..4].copy_from_slice(&MAGIC);
    h[4] = r.status as u8;
    h[8..16].copy_from_slice(&r.id.to_le_bytes());
    h[16..20].copy_from_slice(&(r.payload.len() as u32).to_le_bytes());
    h[20..24].copy_from_slice(&r.crc.to_le_bytes());
    tx.write(w, &h)?;
    if !r.payload.is_empty() {
        tx.write(w, &r.payload)?;
    }
    Ok(())
}

/// Reads and opens one response.
pub(crate) fn read_response(r: &mut impl Read, rx: &mut Dir) -> io::Result<Response> {
    let mut h = [0u8; RESPONSE_HEADER];
    rx.read_into(r, &mut h)?;
    if h[0..4] != MAGIC {
        return Err(invalid(format!("bad magic {:02x?}", &h[0..4])));
    }
    let status =
        Status::from_u8(h[4]).ok_or_else(|| invalid(format!("unknown status {}", h[4])))?;
    let len = u32::from_le_bytes(h[16..20].try_into().expect("4 bytes"));
    if len > MAX_PAYLOAD {
        return Err(invalid(format!("payload of {len} bytes > {MAX_PAYLOAD}")));
    }
    Ok(Response {
        status,
        id: u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")),
        crc: u32::from_le_bytes(h[20..24].try_into().expect("4 bytes")),
        payload: read_payload(r, rx, len)?,
    })
}

/// One answer as [`RawConn::recv`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawAnswer {
    /// Status byte (0 ok, 1 not found, 2 corrupt, 3 full, 4 bad request, 5 internal).
    pub status: u8,
    /// The request id answered.
    pub id: u64,
    /// CRC-32 the server gave the payload.
    pub crc: u32,
    /// The payload.
    pub payload: Vec<u8>,
}

/// A connection to a memory server spoken to frame by frame, past the handshake:
/// for tests and diagnostic tools that need to send what [`crate::remote`] never
/// would (a store that never sends its payload, requests never read).
pub struct RawConn {
    stream: TcpStream,
    tx: Dir,
    rx: Dir,
}

impl RawConn {
    /// Connects and runs the client handshake under `auth`.
    ///
    /// # Errors
    /// The network's I/O errors (a server at its cap: `ConnectionRefused` with its
    /// reason); `PermissionDenied` with the reason when authentication fails.
    pub fn connect(addr: impl ToSocketAddrs, auth: &Auth) -> io::Result<RawConn> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        let keys = channel::client_handshake(&mut stream, auth).map_err(|e| match e {
            HandshakeError::Io(e) => e,
            HandshakeError::Denied(why) => io::Error::new(io::ErrorKind::PermissionDenied, why),
        })?;
        Ok(RawConn {
            stream,
            tx: keys.send,
            rx: keys.recv,
        })
    }

    /// The socket (to set timeouts, write raw bytes, shut it down).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Sends a request of op `op` (the table above) with `payload` and its CRC-32.
    ///
    /// # Errors
    /// The socket's.
    pub fn send(&mut self, op: u8, id: u64, key: PageKey, payload: &[u8]) -> io::Result<()> {
        self.send_header(op, id, key, payload.len() as u32, checksum(payload))?;
        if !payload.is_empty() {
            self.tx.write(&mut &self.stream, payload)?;
        }
        Ok(())
    }

    /// Sends a request header alone, announcing a payload of `len` bytes that the
    /// caller sends (or not) with [`RawConn::send_payload`].
    ///
    /// # Errors
    /// The socket's.
    pub fn send_header(
        &mut self,
        op: u8,
        id: u64,
        key: PageKey,
        len: u32,
        crc: u32,
    ) -> io::Result<()> {
        let mut h = [0u8; REQUEST_HEADER];
        h[0..4].copy_from_slice(&MAGIC);
        h[4] = op;
        h[8..16].copy_from_slice(&id.to_le_bytes());
        h[16..24].copy_from_slice(&key.region.to_le_bytes());
        h[24..32].copy_from_slice(&key.page.to_le_bytes());
        h[32..36].copy_from_slice(&len.to_le_bytes());
        h[36..40].copy_from_slice(&crc.to_le_bytes());
        self.tx.write(&mut &self.stream, &h)
    }

    /// Sends a payload record (after [`RawConn::send_header`]).
    ///
    /// # Errors
    /// The socket's.
    pub fn send_payload(&mut self, payload: &[u8]) -> io::Result<()> {
        self.tx.write(&mut &self.stream, payload)
    }

    /// Reads the next answer.
    ///
    /// # Errors
    /// The socket's; `InvalidData` for a record that fails to open.
    pub fn recv(&mut self) -> io::Result<RawAnswer> {
        let r = read_response(&mut &self.stream, &mut self.rx)?;
        Ok(RawAnswer {
            status: r.status as u8,
            id: r.id,
            crc: r.crc,
            payload: r.payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let (mut tx, mut rx) = Dir::test_pair();
        let req = Request {
            op: Op::Store,
            id: 77,
            key: PageKey::new(3, 9),
            crc: 0xDEAD_BEEF,
            payload: vec![1, 2, 3],
        };
        let mut buf = Vec::new();
        write_request(&mut buf, &mut tx, &req).unwrap();
        assert_eq!(buf.len(), 40 + 16 + 3 + 16);
        let mut rd = &buf[..];
        assert_eq!(read_request(&mut rd, &mut rx).unwrap(), Some(req));
        assert_eq!(read_request(&mut rd, &mut rx).unwrap(), None);

        let list = Request {
            op: Op::ListRegion,
            id: 78,
            key: PageKey::new(3, 1 << 40),
            crc: checksum(&[]),
            payload: Vec::new(),
        };
        let mut buf = Vec::new();
        write_request(&mut buf, &mut tx, &list).unwrap();
        assert_eq!(buf.len(), 40 + 16);
        assert_eq!(read_request(&mut &buf[..], &mut rx).unwrap(), Some(list));

        let resp = Response {
            status: Status::Full,
            id: 77,
            crc: 5,
            payload: b"full".to_vec(),
        };
        let mut buf = Vec::new();
        write_response(&mut buf, &mut tx, &resp).unwrap();
        assert_eq!(read_response(&mut &buf[..], &mut rx).unwrap(), resp);
    }

    #[test]
    fn a_full_listing_fits_the_largest_payload() {
        let (mut tx, mut rx) = Dir::test_pair();
        let indices: Vec<u8> = (0..u64::from(LIST_MAX_PAGES))
            .flat_map(|p| p.to_le_bytes())
            .collect();
        let resp = Response {
            status: Status::Ok,
            id: 1,
            crc: checksum(&indices),
            payload: indices,
        };
        let mut buf = Vec::new();
        write_response(&mut buf, &mut tx, &resp).unwrap();
        assert_eq!(read_response(&mut &buf[..], &mut rx).unwrap(), resp);
    }

    #[test]
    fn garbage_is_refused() {
        // Not a sealed record at all.
        let (_, mut rx) = Dir::test_pair();
        let mut bad = [0u8; 56];
        bad[0..4].copy_from_slice(b"HTTP");
        assert!(read_request(&mut &bad[..], &mut rx).is_err());
        // Sealed, but with a payload length past the limit, or an unknown op.
        for (at, v) in [(32, (MAX_PAYLOAD + 1).to_le_bytes()), (4, [99, 0, 0, 0])] {
            let (mut tx, mut rx) = Dir::test_pair();
            let mut h = [0u8; REQUEST_HEADER];
            h[0..4].copy_from_slice(&MAGIC);
            h[4] = Op::Load as u8;
            h[at..at + 4].copy_from_slice(&v);
            let mut buf = Vec::new();
            tx.write(&mut buf, &h).unwrap();
            assert!(read_request(&mut &buf[..], &mut rx).is_err());
        }
        // Truncated frame.
        let (mut tx, mut rx) = Dir::test_pair();
        let mut buf = Vec::new();
        write_request(
            &mut buf,
            &mut tx,
            &Request {
                op: Op::Load,
                id: 1,
                key: PageKey::new(0, 0),
                crc: 0,
                payload: Vec::new(),
            },
        )
        .unwrap();
        assert!(read_request(&mut &buf[..20], &mut rx).is_err());
    }
}
