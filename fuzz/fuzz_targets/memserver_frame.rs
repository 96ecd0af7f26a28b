//! Fuzzes the memory server's wire (`memcolo_tier::channel` and `memcolo_tier::wire`,
//! compiled from source; `memcolo_fuzz::memserver_wire`). The first byte picks what
//! the rest is:
//!
//! - `sel % 4 == 0`: the bytes an attacker's client sends to the server's handshake
//!   (bit 2: a server without authentication): it never completes;
//! - `sel % 4 == 1`: the bytes a hostile server sends to the client's handshake;
//! - `sel % 4 == 2` / `3`: the plaintext of the frames a client (requests) or a server
//!   (responses) sends after a real handshake with the test secret, sealed by the
//!   harness and read by the other side's decoders. Bit 2 fits each header's payload
//!   length to the input; bits 3..6 pick damage in transit (a flipped bit, a cut, a
//!   dropped, replayed or swapped record, an unsealed one) at the position in the next
//!   two bytes. Every frame decoded is one sent, byte for byte and in order.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memcolo_fuzz::memserver_wire::{
    client_handshake, sealed_stream, server_handshake, Side, Tamper,
};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let flag = sel & 4 != 0;
    match sel % 4 {
        0 => server_handshake(flag, rest),
        1 => client_handshake(flag, rest),
        side => {
            let side = if side == 2 {
                Side::Server
            } else {
                Side::Client
            };
            let (tamper, plain) = match (sel >> 3) & 7 {
                0 | 7 => (Tamper::None, rest),
                kind => {
                    let (at, plain) = match rest {
                        [a, b, plain @ ..] => (u16::from_le_bytes([*a, *b]), plain),
                        _ => return,
                    };
                    let t = match kind {
                        1 => Tamper::FlipBit { at },
                        2 => Tamper::Truncate { at },
                        3 => Tamper::Drop { at },
                        4 => Tamper::Replay { at },
                        5 => Tamper::Swap { at },
                        _ => Tamper::Unsealed { at },
                    };
                    (t, plain)
                }
            };
            sealed_stream(side, flag, tamper, plain);
        }
    }
});
