//! Numbers survive a decode/encode round trip exactly (`docs/protocol.md` §2: one
//! canonical encoding; §10: `decode(encode(m)) == m`). Found by the `agent_request`
//! fuzz target (`fuzz/`): serde_json's default float parser is not correctly rounded,
//! so a long decimal decoded to one `f64` and its shortest encoding decoded to the
//! neighbouring one. The workspace enables serde_json's `float_roundtrip`.

use memcolo_proto::tier::{decode_tier_request, TierRequest};
use memcolo_proto::{decode_reply, encode};

/// The fuzzer's input: 86 significant digits, parsed one ULP off without
/// `float_roundtrip`.
const LONG: &str =
    "25769803776111111111111111111111111111111111111111111111111111111111111111111111111111";

#[test]
fn a_status_reply_number_round_trips() {
    let line = format!(r#"{{"v":1,"type":"status","status":{{"x":{LONG}}}}}"#);
    let reply = decode_reply(&line).unwrap();
    assert_eq!(decode_reply(&encode(&reply)).unwrap(), reply);
}

#[test]
fn a_target_round_trips_and_is_correctly_rounded() {
    for t in [LONG, "0.8748534153485358512512", "0.7983395633827623259259"] {
        let line = format!(r#"{{"v":1,"type":"tier_target","t_miss":{t}}}"#);
        let req = decode_tier_request(&line).unwrap();
        let TierRequest::TierTarget { t_miss, .. } = req else {
            panic!("{req:?}")
        };
        assert_eq!(
            t_miss,
            t.parse::<f64>().unwrap(),
            "{t} is not correctly rounded"
        );
        assert_eq!(decode_tier_request(&encode(&req)).unwrap(), req);
    }
}
