//! The memory server's frames (`crates/memcolo-tier/src/wire.rs`), compiled here from
//! that file, and the harness the fuzz target and the soak driver use.
//!
//! `memcolo_tier::wire`'s readers and writers are crate-private; including the source
//! file tests exactly the code the server runs without widening the crate's API.
//! When the frame format changes (authentication, AEAD), adapt [`decode_stream`] and
//! [`encode_request`]: they are the only users of the included module.

#[allow(dead_code)]
#[path = "../../crates/memcolo-tier/src/wire.rs"]
mod wire;

pub use wire::{LIST_MAX_PAGES, MAX_PAYLOAD};

/// Request operations by number (`wire.rs`' table): 1 hello … 7 list region.
pub const OPS: [u8; 7] = [1, 2, 3, 4, 5, 6, 7];

/// One request frame as an unauthenticated client sends it: `op` (a number of
/// [`OPS`], or any byte for garbage), request `id`, page key, payload and the CRC-32
/// the header carries. The one place that knows the request layout on the client side.
pub fn encode_request(
    op: u8,
    id: u64,
    region: u64,
    page: u64,
    crc: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + payload.len());
    out.extend_from_slice(b"MCM1");
    out.extend_from_slice(&[op, 0, 0, 0]);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&region.to_le_bytes());
    out.extend_from_slice(&page.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Which side's decoder [`decode_stream`] runs.
#[derive(Clone, Copy, Debug)]
pub enum Side {
    /// The server reading a client's requests (`wire::read_request`).
    Server,
    /// The client (the agent's remote tier) reading a server's responses
    /// (`wire::read_response`): the server may be on another, compromised machine.
    Client,
}

/// Decodes `data` as a stream of frames, as the given side reads a connection, until
/// the end or the first error, and checks that every frame decoded re-encodes to the
/// bytes it was read from (reserved header bytes 5..8 zeroed, since readers ignore
/// them). Returns how many frames decoded. Panics on a broken invariant.
pub fn decode_stream(side: Side, data: &[u8]) -> usize {
    let mut rest = data;
    let mut frames = 0;
    loop {
        let before = rest;
        let mut reencoded = Vec::new();
        let ok = match side {
            Side::Server => match wire::read_request(&mut rest) {
                Ok(Some(req)) => {
                    assert!(req.payload.len() <= MAX_PAYLOAD as usize);
                    wire::write_request(&mut reencoded, &req).expect("write to a Vec");
                    true
                }
                Ok(None) => {
                    assert!(before.is_empty(), "end of stream reported with bytes left");
                    false
                }
                Err(_) => false,
            },
            Side::Client => {
                if rest.is_empty() {
                    false
                } else {
                    match wire::read_response(&mut rest) {
                        Ok(resp) => {
                            assert!(resp.payload.len() <= MAX_PAYLOAD as usize);
                            wire::write_response(&mut reencoded, &resp).expect("write to a Vec");
                            true
                        }
                        Err(_) => false,
                    }
                }
            }
        };
        if !ok {
            return frames;
        }
        let consumed = &before[..before.len() - rest.len()];
        let mut expected = consumed.to_vec();
        expected[5..8].fill(0);
        assert_eq!(reencoded, expected, "frame does not re-encode to its bytes");
        frames += 1;
    }
}
