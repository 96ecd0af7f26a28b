//! memcolo's wire protocol: versioned JSON lines over a Unix stream socket
//! (default `/run/memcolo/agent.sock`).
//!
//! Every message is one JSON object on one line (`\n`-terminated, at most
//! [`MAX_LINE_BYTES`]), with a protocol version `"v"` and a `"type"`. A client sends
//! [`Request`]s; the agent answers each request with exactly one [`Reply`], in order,
//! and may at any time push a [`Reply::Notify`] to a connection that registered with
//! `notify: socket`. `docs/protocol.md` is the normative description; this crate is
//! the reference implementation that the agent and the Rust SDK use.
//!
//! Compatibility: a receiver accepts any message whose `v` is at most its own
//! [`PROTOCOL_VERSION`] and ignores fields it does not know; a message with a newer `v`
//! or an unknown `type` is answered with an [`ErrorCode::UnsupportedVersion`] or
//! [`ErrorCode::BadRequest`] error and the connection stays open.

pub use memcolo_policy::{Class, Level, Pid};

pub mod tier;
use serde::{Deserialize, Serialize};

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// The longest line a peer may send, in bytes (newline excluded). Longer lines are
/// answered with [`ErrorCode::BadRequest`] and discarded.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// The default socket path of the agent.
pub const DEFAULT_SOCKET: &str = "/run/memcolo/agent.sock";

/// How a registered process wants to be told of memory pressure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyMode {
    /// [`Reply::Notify`] messages on the registering connection (the SDKs' way).
    #[default]
    Socket,
    /// Real-time signals, as the M3 prototype sent them (M3 §6): `SIGRTMIN+1` for low,
    /// `SIGRTMIN+2` for high, `SIGRTMIN+3` for top. For programs that cannot speak
    /// the protocol.
    Signal,
    /// Not notified (LC services and BE jobs that only want to be accounted).
    None,
}

/// A message from a client to the agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// Register a process. `pid` absent means the peer itself (from `SO_PEERCRED`);
    /// another pid may be registered only by a root peer.
    Register {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<Pid>,
        class: Class,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// What the process expects to give back on a high signal, in bytes; used by
        /// Algorithm 1 until it has reported reclamations (M3 §5.1).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expected_reclaim_bytes: Option<u64>,
        #[serde(default)]
        notify: NotifyMode,
    },
    /// Remove a registration (same permission rule as `Register`).
    Unregister {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<Pid>,
    },
    /// The answer to a [`Reply::Notify`]: the bytes the process itself gave back to
    /// the OS in its handler (M3's *reclamation* by the application, §4.2: freed
    /// caches, a shrunk heap; not the agent's page-out of its memory) and the time it
    /// took. `seq` names the notification answered; `ok: false` reports a failed
    /// handler.
    Reclaimed {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<Pid>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
        bytes: u64,
        duration_ms: u64,
        #[serde(default = "default_true")]
        ok: bool,
    },
    /// Ask for the agent's state ([`Reply::Status`]). The registered processes come
    /// in pages that keep the reply under [`MAX_LINE_BYTES`]: `offset` is the index of
    /// the first process wanted (0 by default), and the reply's `next_offset` that of
    /// the next page (null after the last).
    Status {
        #[serde(default, skip_serializing_if = "is_zero")]
        offset: u64,
    },
    /// Ask the agent to create (if needed) a child cgroup of its scope for `memcolo
    /// run --cgroup NAME`; answered with [`Reply::Cgroup`].
    Cgroup { name: String },
    /// Liveness check, answered with [`Reply::Pong`].
    Ping,
}

fn default_true() -> bool {
    true
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// A message from the agent to a client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// A request was carried out.
    Ok,
    /// Answer to `Register`.
    Registered { pid: Pid, class: Class },
    /// Answer to `Cgroup`: the directory to write a pid into (`cgroup.procs`).
    Cgroup { path: String },
    /// Answer to `Ping`.
    Pong { agent_version: String },
    /// Answer to `Status`: the agent's state as JSON (see `memcolo status --json`).
    Status { status: serde_json::Value },
    /// Memory pressure: give back about `target_bytes`, then answer with
    /// `Request::Reclaimed { seq, .. }`.
    Notify {
        seq: u64,
        level: Level,
        target_bytes: u64,
    },
    /// A request failed; the connection stays usable.
    Error { code: ErrorCode, message: String },
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Not JSON, not an object, unknown `type`, a missing or mistyped field, or a line
    /// over [`MAX_LINE_BYTES`].
    BadRequest,
    /// `v` is newer than the agent's [`PROTOCOL_VERSION`].
    UnsupportedVersion,
    /// The peer may not act on that pid.
    PermissionDenied,
    /// The pid does not exist (or exited).
    NoSuchProcess,
    /// The pid is not registered.
    NotRegistered,
    /// The agent could not carry the request out (a cgroup write failed, say).
    Internal,
    /// The peer's user holds as much of the agent as it may (`[limits]`: connections,
    /// registrations); nothing was done.
    LimitExceeded,
}

impl ErrorCode {
    /// Every code, in declaration order (the shared test vectors hold one reply each).
    pub const ALL: [ErrorCode; 7] = [
        ErrorCode::BadRequest,
        ErrorCode::UnsupportedVersion,
        ErrorCode::PermissionDenied,
        ErrorCode::NoSuchProcess,
        ErrorCode::NotRegistered,
        ErrorCode::Internal,
        ErrorCode::LimitExceeded,
    ];
}

/// A message with its version, as it travels.
#[derive(Serialize)]
struct Envelope<'a, T> {
    v: u32,
    #[serde(flatten)]
    body: &'a T,
}

/// Errors of [`decode_request`] and [`decode_reply`].
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("line is {0} bytes, over the {MAX_LINE_BYTES}-byte limit")]
    TooLong(usize),
    #[error("protocol version {0} is newer than {PROTOCOL_VERSION}")]
    UnsupportedVersion(u64),
    #[error("malformed message: {0}")]
    Malformed(String),
}

impl DecodeError {
    /// The error code a receiver answers this failure with.
    pub fn code(&self) -> ErrorCode {
        match self {
            DecodeError::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion,
            _ => ErrorCode::BadRequest,
        }
    }
}

/// Encodes a message as one line, newline included.
pub fn encode<T: Serialize>(msg: &T) -> String {
    let mut s = serde_json::to_string(&Envelope {
        v: PROTOCOL_VERSION,
        body: msg,
    })
    .expect("protocol messages always serialize");
    s.push('\n');
    s
}

fn decode<T: for<'de> Deserialize<'de>>(line: &str) -> Result<T, DecodeError> {
    let line = line.trim_end_matches(['\n', '\r']);
    if line.len() > MAX_LINE_BYTES {
        return Err(DecodeError::TooLong(line.len()));
    }
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    let obj = value
        .as_object()
        .ok_or_else(|| DecodeError::Malformed("not a JSON object".into()))?;
    match obj.get("v") {
        Some(v) => {
            let v = v
                .as_u64()
                .ok_or_else(|| DecodeError::Malformed("`v` is not an unsigned integer".into()))?;
            if v > PROTOCOL_VERSION as u64 {
                return Err(DecodeError::UnsupportedVersion(v));
            }
        }
        None => return Err(DecodeError::Malformed("missing `v`".into())),
    }
    serde_json::from_value(value).map_err(|e| DecodeError::Malformed(e.to_string()))
}

/// Decodes one line sent by a client.
pub fn decode_request(line: &str) -> Result<Request, DecodeError> {
    decode(line)
}

/// Decodes one line sent by the agent.
pub fn decode_reply(line: &str) -> Result<Reply, DecodeError> {
    decode(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_round_trips_with_version() {
        let r = Request::Register {
            pid: None,
            class: Class::Elastic,
            name: Some("cache".into()),
            expected_reclaim_bytes: Some(1 << 20),
            notify: NotifyMode::Socket,
        };
        let line = encode(&r);
        assert_eq!(
            line,
            "{\"v\":1,\"type\":\"register\",\"class\":\"elastic\",\"name\":\"cache\",\"expected_reclaim_bytes\":1048576,\"notify\":\"socket\"}\n"
        );
        assert_eq!(decode_request(&line).unwrap(), r);
    }

    #[test]
    fn notify_encodes_as_documented() {
        let line = encode(&Reply::Notify {
            seq: 7,
            level: Level::High,
            target_bytes: 4096,
        });
        assert_eq!(
            line,
            "{\"v\":1,\"type\":\"notify\",\"seq\":7,\"level\":\"high\",\"target_bytes\":4096}\n"
        );
    }

    #[test]
    fn defaults_fill_optional_fields() {
        let r = decode_request(r#"{"v":1,"type":"reclaimed","bytes":10,"duration_ms":3}"#).unwrap();
        assert_eq!(
            r,
            Request::Reclaimed {
                pid: None,
                seq: None,
                bytes: 10,
                duration_ms: 3,
                ok: true
            }
        );
        let r =
            decode_request(r#"{"v":1,"type":"register","class":"be","extra":"ignored"}"#).unwrap();
        assert!(matches!(
            r,
            Request::Register {
                notify: NotifyMode::Socket,
                class: Class::Be,
                ..
            }
        ));
    }

    #[test]
    fn all_error_codes_are_listed_once() {
        // the match has no wildcard: a new code does not compile until it has a place
        let place = |c: ErrorCode| match c {
            ErrorCode::BadRequest => 0,
            ErrorCode::UnsupportedVersion => 1,
            ErrorCode::PermissionDenied => 2,
            ErrorCode::NoSuchProcess => 3,
            ErrorCode::NotRegistered => 4,
            ErrorCode::Internal => 5,
            ErrorCode::LimitExceeded => 6,
        };
        for (i, c) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(place(*c), i, "{c:?}");
        }
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        for (line, code) in [
            ("", ErrorCode::BadRequest),
            ("not json", ErrorCode::BadRequest),
            ("[1,2]", ErrorCode::BadRequest),
            (r#"{"type":"ping"}"#, ErrorCode::BadRequest),
            (r#"{"v":"1","type":"ping"}"#, ErrorCode::BadRequest),
            (r#"{"v":1,"type":"launch_missiles"}"#, ErrorCode::BadRequest),
            (
                r#"{"v":1,"type":"register","class":"vip"}"#,
                ErrorCode::BadRequest,
            ),
            (
                r#"{"v":1,"type":"reclaimed","bytes":-5,"duration_ms":1}"#,
                ErrorCode::BadRequest,
            ),
            (r#"{"v":2,"type":"ping"}"#, ErrorCode::UnsupportedVersion),
        ] {
            let err = decode_request(line).unwrap_err();
            assert_eq!(err.code(), code, "line {line:?}: {err}");
        }
        let long = format!(
            r#"{{"v":1,"type":"cgroup","name":"{}"}}"#,
            "x".repeat(MAX_LINE_BYTES)
        );
        assert!(matches!(
            decode_request(&long),
            Err(DecodeError::TooLong(_))
        ));
    }
}
