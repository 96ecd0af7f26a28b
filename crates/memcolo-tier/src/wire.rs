//! The memory server's wire protocol: binary frames over one TCP connection,
//! little-endian, one response per request, in request order (clients may pipeline).
//!
//! Request (40-byte header, then `len` payload bytes):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `MCM1` |
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
//! | 0..4 | magic `MCM1` |
//! | 4 | status: 0 ok, 1 not found, 2 corrupt, 3 full, 4 bad request, 5 internal |
//! | 5..8 | zero |
//! | 8..16 | request id |
//! | 16..20 | payload length |
//! | 20..24 | CRC-32 of the payload (load: of the page) |
//!
//! Payloads: hello sends the client's page size (u32) and gets the server's back,
//! followed by the server's instance id (u64, random per server start: a client
//! tells a restarted, empty server by it);
//! store sends the page; load gets the page; remove gets one byte (1 if a page was
//! removed); remove region gets the count (u64); stats gets six u64 counters (pages,
//! stored bytes, stores, loads, corrupt, retries); errors get a UTF-8 message.
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

use crate::PageKey;
use std::io::{self, Read, Write};

/// Frame magic and protocol version.
pub(crate) const MAGIC: [u8; 4] = *b"MCM1";
/// Largest payload accepted, bytes (a 2 MiB huge page with room to spare).
pub const MAX_PAYLOAD: u32 = 4 << 20;
/// Most page indices one list-region answer carries: as many u64 as fill
/// [`MAX_PAYLOAD`] (524 288, i.e. 2 GiB of 4 KiB pages).
pub const LIST_MAX_PAGES: u32 = MAX_PAYLOAD / 8;

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

pub(crate) fn write_request(w: &mut impl Write, r: &Request) -> io::Result<()> {
    let mut h = [0u8; 40];
    h[0..4].copy_from_slice(&MAGIC);
    h[4] = r.op as u8;
    h[8..16].copy_from_slice(&r.id.to_le_bytes());
    h[16..24].copy_from_slice(&r.key.region.to_le_bytes());
    h[24..32].copy_from_slice(&r.key.page.to_le_bytes());
    h[32..36].copy_from_slice(&(r.payload.len() as u32).to_le_bytes());
    h[36..40].copy_from_slice(&r.crc.to_le_bytes());
    w.write_all(&h)?;
    w.write_all(&r.payload)
}

/// Reads one request; `Ok(None)` on a clean end of stream before a header.
pub(crate) fn read_request(r: &mut impl Read) -> io::Result<Option<Request>> {
    let mut h = [0u8; 40];
    match r.read(&mut h[..1])? {
        0 => return Ok(None),
        _ => r.read_exact(&mut h[1..])?,
    }
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
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok(Some(Request {
        op,
        id: u64_at(8),
        key: PageKey::new(u64_at(16), u64_at(24)),
        crc: u32_at(36),
        payload,
    }))
}

pub(crate) fn write_response(w: &mut impl Write, r: &Response) -> io::Result<()> {
    let mut h = [0u8; 24];
    h[0..4].copy_from_slice(&MAGIC);
    h[4] = r.status as u8;
    h[8..16].copy_from_slice(&r.id.to_le_bytes());
    h[16..20].copy_from_slice(&(r.payload.len() as u32).to_le_bytes());
    h[20..24].copy_from_slice(&r.crc.to_le_bytes());
    w.write_all(&h)?;
    w.write_all(&r.payload)
}

pub(crate) fn read_response(r: &mut impl Read) -> io::Result<Response> {
    let mut h = [0u8; 24];
    r.read_exact(&mut h)?;
    if h[0..4] != MAGIC {
        return Err(invalid(format!("bad magic {:02x?}", &h[0..4])));
    }
    let status =
        Status::from_u8(h[4]).ok_or_else(|| invalid(format!("unknown status {}", h[4])))?;
    let len = u32::from_le_bytes(h[16..20].try_into().expect("4 bytes"));
    if len > MAX_PAYLOAD {
        return Err(invalid(format!("payload of {len} bytes > {MAX_PAYLOAD}")));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok(Response {
        status,
        id: u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")),
        crc: u32::from_le_bytes(h[20..24].try_into().expect("4 bytes")),
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum;

    #[test]
    fn frames_round_trip() {
        let req = Request {
            op: Op::Store,
            id: 77,
            key: PageKey::new(3, 9),
            crc: 0xDEAD_BEEF,
            payload: vec![1, 2, 3],
        };
        let mut buf = Vec::new();
        write_request(&mut buf, &req).unwrap();
        assert_eq!(buf.len(), 43);
        let mut rd = &buf[..];
        assert_eq!(read_request(&mut rd).unwrap(), Some(req));
        assert_eq!(read_request(&mut rd).unwrap(), None);

        let list = Request {
            op: Op::ListRegion,
            id: 78,
            key: PageKey::new(3, 1 << 40),
            crc: checksum(&[]),
            payload: Vec::new(),
        };
        let mut buf = Vec::new();
        write_request(&mut buf, &list).unwrap();
        assert_eq!(buf.len(), 40);
        assert_eq!(buf[4], 7);
        assert_eq!(read_request(&mut &buf[..]).unwrap(), Some(list));

        let resp = Response {
            status: Status::Full,
            id: 77,
            crc: 5,
            payload: b"full".to_vec(),
        };
        let mut buf = Vec::new();
        write_response(&mut buf, &resp).unwrap();
        assert_eq!(read_response(&mut &buf[..]).unwrap(), resp);
    }

    #[test]
    fn a_full_listing_fits_the_largest_payload() {
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
        write_response(&mut buf, &resp).unwrap();
        assert_eq!(read_response(&mut &buf[..]).unwrap(), resp);
    }

    #[test]
    fn garbage_is_refused() {
        let mut bad = [0u8; 40];
        bad[0..4].copy_from_slice(b"HTTP");
        assert!(read_request(&mut &bad[..]).is_err());
        let mut big = Vec::new();
        write_request(
            &mut big,
            &Request {
                op: Op::Load,
                id: 1,
                key: PageKey::new(0, 0),
                crc: 0,
                payload: Vec::new(),
            },
        )
        .unwrap();
        big[32..36].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert!(read_request(&mut &big[..]).is_err());
        big[4] = 99;
        assert!(read_request(&mut &big[..]).is_err());
        // Truncated frame.
        assert!(read_request(&mut &big[..20]).is_err());
    }
}
