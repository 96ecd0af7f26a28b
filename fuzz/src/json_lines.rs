//! The invariants of `memcolo-proto`'s JSON-lines decoders under hostile input
//! (`docs/protocol.md` §2 framing, §3 versioning, §10 canonical encoding).
//!
//! For any bytes a peer sends as a line:
//! 1. decoding never panics (a malformed line is an `Err`, answered with
//!    `bad_request` or `unsupported_version`);
//! 2. a decoded message encodes as exactly one line: `\n`-terminated, no other
//!    newline or `\r` inside, starting with `{"v":1,"type":`;
//! 3. that line decodes to the same message (`decode(encode(m)) == m`);
//! 4. encoding is a fixed point: `encode(decode(encode(m))) == encode(m)` (the
//!    canonical form of §2 is unique).

use memcolo_proto::{encode, DecodeError, ErrorCode};
use serde::Serialize;
use std::fmt::Debug;

/// Checks invariants 1–4 for one decoder on one input line (the bytes between two
/// newlines, as the receiver's line reader hands them over: not UTF-8 is a
/// `bad_request` before decoding, so it is mapped through `from_utf8_lossy` here to
/// still exercise the decoder).
pub fn check<T, D>(data: &[u8], decode: D)
where
    T: Serialize + PartialEq + Debug,
    D: Fn(&str) -> Result<T, DecodeError>,
{
    let line = String::from_utf8_lossy(data);
    let msg = match decode(&line) {
        Ok(m) => m,
        Err(e) => {
            // Every failure maps to one of the two documented codes.
            assert!(matches!(
                e.code(),
                ErrorCode::BadRequest | ErrorCode::UnsupportedVersion
            ));
            return;
        }
    };
    let enc = encode(&msg);
    assert!(enc.ends_with('\n'), "encoding {enc:?} has no final newline");
    let body = &enc[..enc.len() - 1];
    assert!(
        !body.contains(['\n', '\r']),
        "encoding {enc:?} is more than one line"
    );
    assert!(
        body.starts_with("{\"v\":1,\"type\":\""),
        "encoding {enc:?} does not open with v and type"
    );
    let again = decode(&enc).unwrap_or_else(|e| panic!("re-encoding {enc:?} fails: {e}"));
    assert_eq!(
        again, msg,
        "line {line:?} -> {enc:?} decodes to another value"
    );
    assert_eq!(
        encode(&again),
        enc,
        "encoding of {line:?} is not a fixed point"
    );
}
