//! Fuzzes the agent socket's decoders (`memcolo_proto::decode_request`, and
//! `decode_reply` which the SDKs run): no panic, and a decoded message round-trips
//! through its canonical encoding (`memcolo_fuzz::json_lines`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    memcolo_fuzz::json_lines::check(data, memcolo_proto::decode_request);
    memcolo_fuzz::json_lines::check(data, memcolo_proto::decode_reply);
});
