//! Fuzzes the memory server's frame decoders (`memcolo_tier::wire`): the first byte
//! picks the side (even: the server reading requests, odd: the client reading
//! responses), the rest is the connection's byte stream. No panic, no payload over
//! `MAX_PAYLOAD`, and every decoded frame re-encodes to its bytes
//! (`memcolo_fuzz::memserver_wire::decode_stream`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use memcolo_fuzz::memserver_wire::{decode_stream, Side};

fuzz_target!(|data: &[u8]| {
    if let Some((&sel, stream)) = data.split_first() {
        let side = if sel & 1 == 0 {
            Side::Server
        } else {
            Side::Client
        };
        decode_stream(side, stream);
    }
});
