//! Fuzzes the tiering socket's decoders (`memcolo_proto::tier::decode_tier_request`,
//! and `decode_tier_reply` which libmemcolo's peer runs): no panic, and a decoded
//! message round-trips through its canonical encoding (`memcolo_fuzz::json_lines`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use memcolo_proto::tier;

fuzz_target!(|data: &[u8]| {
    memcolo_fuzz::json_lines::check(data, tier::decode_tier_request);
    memcolo_fuzz::json_lines::check(data, tier::decode_tier_reply);
});
