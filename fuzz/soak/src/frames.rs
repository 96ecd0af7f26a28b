//! The memory server's frames as an unauthenticated client sends and reads them
//! (`crates/memcolo-tier/src/wire.rs`: 40-byte request header, 24-byte response
//! header, little-endian). The only place that knows the layout: when the wire gains
//! authentication or AEAD framing, adapt [`request`], [`read_response`] and [`hello`].

use std::io::{self, Read};

/// Frame magic and protocol version.
pub const MAGIC: [u8; 4] = *b"MCM1";
/// Largest payload the server accepts, bytes (`wire::MAX_PAYLOAD`).
pub const MAX_PAYLOAD: u32 = 4 << 20;

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

/// One request frame: `op` (any byte, for garbage), request id, page key
/// (`region`, `page`), the CRC-32 the header carries, and the payload. `len` overrides
/// the header's payload length (a lie about the payload, for hostile frames).
pub fn request(
    op: u8,
    id: u64,
    region: u64,
    page: u64,
    crc: u32,
    payload: &[u8],
    len: Option<u32>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[op, 0, 0, 0]);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&region.to_le_bytes());
    out.extend_from_slice(&page.to_le_bytes());
    out.extend_from_slice(&len.unwrap_or(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The hello a client opens with: its page size.
pub fn hello(id: u64, page_bytes: u32) -> Vec<u8> {
    let p = page_bytes.to_le_bytes();
    request(op::HELLO, id, 0, 0, crc32(&p), &p, None)
}

/// One response: (status, request id, payload). Errors on a bad magic, an unknown
/// status or a payload over [`MAX_PAYLOAD`]; `UnexpectedEof` when the server closed.
pub fn read_response(r: &mut impl Read) -> io::Result<(u8, u64, Vec<u8>)> {
    let mut h = [0u8; 24];
    r.read_exact(&mut h)?;
    if h[0..4] != MAGIC || h[4] > 5 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad response header {h:02x?}"),
        ));
    }
    let id = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(h[16..20].try_into().expect("4 bytes"));
    if len > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("response payload of {len} bytes"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    let crc = u32::from_le_bytes(h[20..24].try_into().expect("4 bytes"));
    if crc != crc32(&payload) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "response CRC-32 mismatch",
        ));
    }
    Ok((h[4], id, payload))
}

/// CRC-32 (IEEE), as `memcolo_tier::checksum`.
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}
