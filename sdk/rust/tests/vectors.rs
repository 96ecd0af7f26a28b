//! The shared protocol test vectors (`sdk/testvectors/*.json`) are generated from
//! memcolo-proto, the reference implementation, and checked against it here.
//!
//! Every SDK's tests read the same files, so all implementations stay byte-compatible
//! with the agent. Regenerate after a protocol change with
//! `MEMCOLO_REGEN_VECTORS=1 cargo test -p memcolo-sdk --test vectors`.

use memcolo_proto::{
    decode_reply, decode_request, encode, Class, ErrorCode, Level, NotifyMode, Reply, Request,
    MAX_LINE_BYTES, PROTOCOL_VERSION,
};
use serde_json::{json, Value};
use std::path::PathBuf;

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testvectors")
}

fn code_str(code: ErrorCode) -> String {
    serde_json::to_value(code)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

/// A valid entry: the canonical line of a message built in Rust.
fn canonical<T: serde::Serialize>(name: &str, msg: &T) -> Value {
    let line = encode(msg);
    json!({
        "name": name,
        "line": line.trim_end_matches('\n'),
        "canonical": true,
        "message": serde_json::to_value(msg).unwrap(),
    })
}

/// A valid entry whose line is not what an encoder writes (missing optional fields,
/// unknown fields, older version, other key order); `message` is its meaning.
fn accepted<T: serde::Serialize>(name: &str, line: &str, meaning: &T) -> Value {
    json!({
        "name": name,
        "line": line,
        "canonical": false,
        "message": serde_json::to_value(meaning).unwrap(),
    })
}

fn invalid(name: &str, line: &str, code: ErrorCode) -> Value {
    json!({ "name": name, "line": line, "code": code_str(code) })
}

fn too_long() -> Value {
    json!({
        "comment": "a line of prefix + fill*count + suffix is over max_line_bytes; decoders reject it with `code`",
        "prefix": "{\"v\":1,\"type\":\"cgroup\",\"name\":\"",
        "fill": "x",
        "count": MAX_LINE_BYTES,
        "suffix": "\"}",
        "code": code_str(ErrorCode::BadRequest),
    })
}

/// Invalid lines common to both directions.
fn common_invalid() -> Vec<Value> {
    use ErrorCode::*;
    vec![
        invalid("empty", "", BadRequest),
        invalid("not_json", "not json", BadRequest),
        invalid("truncated", "{\"v\":1,\"type\":\"pi", BadRequest),
        invalid("array", "[1,2]", BadRequest),
        invalid("string", "\"ping\"", BadRequest),
        invalid("missing_version", "{\"type\":\"ping\"}", BadRequest),
        invalid(
            "version_is_string",
            "{\"v\":\"1\",\"type\":\"ping\"}",
            BadRequest,
        ),
        invalid(
            "version_is_float",
            "{\"v\":1.0,\"type\":\"ping\"}",
            BadRequest,
        ),
        invalid(
            "version_negative",
            "{\"v\":-1,\"type\":\"ping\"}",
            BadRequest,
        ),
        invalid(
            "newer_version",
            "{\"v\":2,\"type\":\"ping\"}",
            UnsupportedVersion,
        ),
        invalid(
            "newer_version_unknown_type",
            "{\"v\":9,\"type\":\"hologram\",\"x\":1}",
            UnsupportedVersion,
        ),
        invalid("missing_type", "{\"v\":1}", BadRequest),
        invalid("type_not_string", "{\"v\":1,\"type\":3}", BadRequest),
        invalid(
            "unknown_type",
            "{\"v\":1,\"type\":\"launch_missiles\"}",
            BadRequest,
        ),
    ]
}

fn requests() -> Value {
    use ErrorCode::*;
    let mut valid = vec![
        canonical(
            "register_full",
            &Request::Register {
                pid: Some(4242),
                class: Class::Elastic,
                name: Some("cache".into()),
                expected_reclaim_bytes: Some(1 << 30),
                notify: NotifyMode::Socket,
            },
        ),
        canonical(
            "register_self_minimal",
            &Request::Register {
                pid: None,
                class: Class::Elastic,
                name: None,
                expected_reclaim_bytes: None,
                notify: NotifyMode::Socket,
            },
        ),
        // What libmemcolo sends: its process name (comm, at most 15 bytes) with the
        // characters JSON must escape.
        canonical(
            "register_self_named_escapes",
            &Request::Register {
                pid: None,
                class: Class::Elastic,
                name: Some("a\"b\\c\td\u{1}\u{7f}".into()),
                expected_reclaim_bytes: None,
                notify: NotifyMode::Socket,
            },
        ),
        canonical(
            "register_lc_signal",
            &Request::Register {
                pid: None,
                class: Class::Lc,
                name: Some("redis \"main\" ü".into()),
                expected_reclaim_bytes: None,
                notify: NotifyMode::Signal,
            },
        ),
        canonical(
            "register_be_none",
            &Request::Register {
                pid: Some(1),
                class: Class::Be,
                name: Some("batch".into()),
                expected_reclaim_bytes: Some(0),
                notify: NotifyMode::None,
            },
        ),
        canonical("unregister_self", &Request::Unregister { pid: None }),
        canonical("unregister_pid", &Request::Unregister { pid: Some(77) }),
        canonical(
            "reclaimed_ok",
            &Request::Reclaimed {
                pid: None,
                seq: Some(7),
                bytes: 268435456,
                duration_ms: 12,
                ok: true,
            },
        ),
        canonical(
            "reclaimed_failed",
            &Request::Reclaimed {
                pid: None,
                seq: Some(8),
                bytes: 0,
                duration_ms: 10000,
                ok: false,
            },
        ),
        canonical(
            "reclaimed_max",
            &Request::Reclaimed {
                pid: Some(2147483647),
                seq: Some(u64::MAX),
                bytes: u64::MAX,
                duration_ms: 0,
                ok: true,
            },
        ),
        canonical(
            "reclaimed_self_max",
            &Request::Reclaimed {
                pid: None,
                seq: Some(u64::MAX),
                bytes: u64::MAX,
                duration_ms: u64::MAX,
                ok: true,
            },
        ),
        canonical("status", &Request::Status { offset: 0 }),
        canonical(
            "cgroup",
            &Request::Cgroup {
                name: "spark-1".into(),
            },
        ),
        canonical("ping", &Request::Ping),
    ];
    valid.push(accepted(
        "reclaimed_defaults",
        "{\"v\":1,\"type\":\"reclaimed\",\"bytes\":10,\"duration_ms\":3}",
        &Request::Reclaimed {
            pid: None,
            seq: None,
            bytes: 10,
            duration_ms: 3,
            ok: true,
        },
    ));
    valid.push(accepted(
        "register_unknown_field_key_order",
        "{\"class\":\"be\",\"extra\":{\"nested\":[1,2]},\"type\":\"register\",\"v\":1}",
        &Request::Register {
            pid: None,
            class: Class::Be,
            name: None,
            expected_reclaim_bytes: None,
            notify: NotifyMode::Socket,
        },
    ));
    valid.push(accepted(
        "older_version_crlf",
        "{\"v\":0,\"type\":\"ping\"}\r",
        &Request::Ping,
    ));
    valid.push(accepted(
        "whitespace",
        "{ \"v\" : 1 , \"type\" : \"status\" }",
        &Request::Status { offset: 0 },
    ));
    let mut bad = common_invalid();
    bad.extend([
        invalid(
            "unknown_class",
            "{\"v\":1,\"type\":\"register\",\"class\":\"vip\"}",
            BadRequest,
        ),
        invalid(
            "register_no_class",
            "{\"v\":1,\"type\":\"register\"}",
            BadRequest,
        ),
        invalid(
            "unknown_notify",
            "{\"v\":1,\"type\":\"register\",\"class\":\"be\",\"notify\":\"email\"}",
            BadRequest,
        ),
        invalid(
            "pid_over_i32",
            "{\"v\":1,\"type\":\"register\",\"class\":\"be\",\"pid\":2147483648}",
            BadRequest,
        ),
        invalid(
            "negative_bytes",
            "{\"v\":1,\"type\":\"reclaimed\",\"bytes\":-5,\"duration_ms\":1}",
            BadRequest,
        ),
        invalid(
            "float_bytes",
            "{\"v\":1,\"type\":\"reclaimed\",\"bytes\":1.5,\"duration_ms\":1}",
            BadRequest,
        ),
        invalid(
            "bytes_over_u64",
            "{\"v\":1,\"type\":\"reclaimed\",\"bytes\":18446744073709551616,\"duration_ms\":1}",
            BadRequest,
        ),
        invalid(
            "ok_not_bool",
            "{\"v\":1,\"type\":\"reclaimed\",\"bytes\":1,\"duration_ms\":1,\"ok\":1}",
            BadRequest,
        ),
        invalid(
            "reclaimed_missing_duration",
            "{\"v\":1,\"type\":\"reclaimed\",\"bytes\":1}",
            BadRequest,
        ),
        invalid(
            "cgroup_missing_name",
            "{\"v\":1,\"type\":\"cgroup\"}",
            BadRequest,
        ),
        invalid(
            "reply_type_sent_as_request",
            "{\"v\":1,\"type\":\"notify\",\"seq\":1,\"level\":\"low\",\"target_bytes\":1}",
            BadRequest,
        ),
    ]);
    json!({
        "comment": "Lines a client sends to the agent (sdk -> agent). Generated from memcolo-proto by sdk/rust/tests/vectors.rs; do not edit by hand.",
        "protocol_version": PROTOCOL_VERSION,
        "max_line_bytes": MAX_LINE_BYTES,
        "valid": valid,
        "invalid": bad,
        "too_long": too_long(),
    })
}

fn replies() -> Value {
    use ErrorCode::*;
    let mut valid = vec![
        canonical("ok", &Reply::Ok),
        canonical(
            "registered",
            &Reply::Registered {
                pid: 4242,
                class: Class::Elastic,
            },
        ),
        canonical(
            "cgroup",
            &Reply::Cgroup {
                path: "/sys/fs/cgroup/memory/memcolo/spark-1".into(),
            },
        ),
        canonical(
            "pong",
            &Reply::Pong {
                agent_version: "0.1.0".into(),
            },
        ),
        canonical(
            "status",
            &Reply::Status {
                status: json!({"elastic": 2, "level": "low", "node_bytes": 25769803776u64}),
            },
        ),
        canonical(
            "notify_low",
            &Reply::Notify {
                seq: 1,
                level: Level::Low,
                target_bytes: 0,
            },
        ),
        canonical(
            "notify_high",
            &Reply::Notify {
                seq: 7,
                level: Level::High,
                target_bytes: 4096,
            },
        ),
        canonical(
            "notify_top_max",
            &Reply::Notify {
                seq: u64::MAX,
                level: Level::Top,
                target_bytes: u64::MAX,
            },
        ),
    ];
    for code in ErrorCode::ALL {
        valid.push(canonical(
            &format!("error_{}", code_str(code)),
            &Reply::Error {
                code,
                message: "pid 1: \"operation\" not permitted\n(detail)".into(),
            },
        ));
    }
    valid.push(accepted(
        "notify_unknown_field",
        "{\"v\":1,\"type\":\"notify\",\"seq\":3,\"level\":\"high\",\"target_bytes\":1048576,\"cgroup\":\"/x\"}",
        &Reply::Notify {
            seq: 3,
            level: Level::High,
            target_bytes: 1048576,
        },
    ));
    valid.push(accepted(
        "notify_key_order_older_version",
        "{\"target_bytes\":5,\"level\":\"top\",\"seq\":9,\"type\":\"notify\",\"v\":0}",
        &Reply::Notify {
            seq: 9,
            level: Level::Top,
            target_bytes: 5,
        },
    ));
    let mut bad = common_invalid();
    bad.extend([
        invalid(
            "notify_unknown_level",
            "{\"v\":1,\"type\":\"notify\",\"seq\":1,\"level\":\"red\",\"target_bytes\":1}",
            BadRequest,
        ),
        invalid(
            "notify_missing_seq",
            "{\"v\":1,\"type\":\"notify\",\"level\":\"low\",\"target_bytes\":1}",
            BadRequest,
        ),
        invalid(
            "notify_float_target",
            "{\"v\":1,\"type\":\"notify\",\"seq\":1,\"level\":\"low\",\"target_bytes\":4096.0}",
            BadRequest,
        ),
        invalid(
            "notify_negative_target",
            "{\"v\":1,\"type\":\"notify\",\"seq\":1,\"level\":\"low\",\"target_bytes\":-1}",
            BadRequest,
        ),
        invalid(
            "notify_seq_bool",
            "{\"v\":1,\"type\":\"notify\",\"seq\":true,\"level\":\"low\",\"target_bytes\":1}",
            BadRequest,
        ),
        invalid(
            "notify_target_string",
            "{\"v\":1,\"type\":\"notify\",\"seq\":1,\"level\":\"low\",\"target_bytes\":\"1\"}",
            BadRequest,
        ),
        invalid(
            "error_unknown_code",
            "{\"v\":1,\"type\":\"error\",\"code\":\"teapot\",\"message\":\"x\"}",
            BadRequest,
        ),
        invalid(
            "registered_unknown_class",
            "{\"v\":1,\"type\":\"registered\",\"pid\":1,\"class\":\"vip\"}",
            BadRequest,
        ),
        invalid(
            "request_type_sent_as_reply",
            "{\"v\":1,\"type\":\"ping\"}",
            BadRequest,
        ),
    ]);
    json!({
        "comment": "Lines the agent sends to a client (agent -> sdk). Generated from memcolo-proto by sdk/rust/tests/vectors.rs; do not edit by hand.",
        "protocol_version": PROTOCOL_VERSION,
        "max_line_bytes": MAX_LINE_BYTES,
        "valid": valid,
        "invalid": bad,
        "too_long": too_long(),
    })
}

/// Writes (with `MEMCOLO_REGEN_VECTORS=1`) or compares one vector file.
fn check_file(file: &str, generated: &Value) {
    let path = vectors_dir().join(file);
    let text = serde_json::to_string_pretty(generated).unwrap() + "\n";
    if std::env::var_os("MEMCOLO_REGEN_VECTORS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with MEMCOLO_REGEN_VECTORS=1)",
            path.display()
        )
    });
    assert!(
        on_disk == text,
        "{} is stale: regenerate with MEMCOLO_REGEN_VECTORS=1 cargo test -p memcolo-sdk --test vectors",
        path.display()
    );
}

fn check_semantics<T, F>(vectors: &Value, decode: F)
where
    T: serde::Serialize + std::fmt::Debug,
    F: Fn(&str) -> Result<T, memcolo_proto::DecodeError>,
{
    for v in vectors["valid"].as_array().unwrap() {
        let line = v["line"].as_str().unwrap();
        let msg = decode(line).unwrap_or_else(|e| panic!("{}: {e}", v["name"]));
        assert_eq!(
            serde_json::to_value(&msg).unwrap(),
            v["message"],
            "{}",
            v["name"]
        );
        if v["canonical"].as_bool().unwrap() {
            assert_eq!(encode(&msg), format!("{line}\n"), "{}", v["name"]);
        }
    }
    for v in vectors["invalid"].as_array().unwrap() {
        let line = v["line"].as_str().unwrap();
        let err = decode(line).expect_err(v["name"].as_str().unwrap());
        assert_eq!(code_str(err.code()), v["code"], "{}: {err}", v["name"]);
    }
    let t = &vectors["too_long"];
    let line = format!(
        "{}{}{}",
        t["prefix"].as_str().unwrap(),
        t["fill"]
            .as_str()
            .unwrap()
            .repeat(t["count"].as_u64().unwrap() as usize),
        t["suffix"].as_str().unwrap()
    );
    assert!(line.len() > MAX_LINE_BYTES);
    assert_eq!(code_str(decode(&line).unwrap_err().code()), t["code"]);
}

#[test]
fn request_vectors_match_memcolo_proto() {
    let v = requests();
    check_semantics(&v, decode_request);
    check_file("requests.json", &v);
}

#[test]
fn reply_vectors_match_memcolo_proto() {
    let v = replies();
    check_semantics(&v, decode_reply);
    check_file("replies.json", &v);
}
