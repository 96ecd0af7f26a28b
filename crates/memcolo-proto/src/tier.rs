//! The tiering socket's messages (`docs/protocol.md` §11): how a process hands the
//! agent the regions it wants tiered (MaxMem §3.3: libmemcolo intercepts large
//! anonymous mappings and sends their userfaultfd to the central manager), and how
//! operators change a process's target FMMR.
//!
//! Same framing and versioning as the agent socket (one JSON object per line, `"v"`,
//! `"type"`), on a second socket, `tier.sock` next to the agent's socket: a
//! [`TierRequest::TierRegister`] carries two descriptors as `SCM_RIGHTS` ancillary data
//! on the `sendmsg` of its line (the userfaultfd first, then the memfd backing the
//! region, then optionally the region's shadow memfd), which the agent's
//! line-oriented main socket does not read. [`TierRequest::TierRecover`] carries the
//! same three.

use crate::{ErrorCode, Pid};
use serde::{Deserialize, Serialize};

/// The default name of the tiering socket, in the directory of the agent's socket.
pub const TIER_SOCKET_NAME: &str = "tier.sock";

/// A message to the agent on the tiering socket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TierRequest {
    /// Manage the peer's region `[start, start + length)` (page aligned, a `MAP_SHARED`
    /// mapping of the memfd sent along, registered with the userfaultfd sent along in
    /// MISSING and WP modes, not yet touched). `t_miss`: the process's target FMMR in
    /// `]0, 1]` (the agent's default when absent; a later region of the same process
    /// does not change it). A third descriptor, the region's *shadow* (a memfd of
    /// `length` + 4096 bytes whose last page the process initialized as the remove
    /// journal; `memcolo_tier::shadow`), lets a new agent recover the region if this
    /// one dies. Answer: `tier_registered`.
    TierRegister {
        start: u64,
        length: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        t_miss: Option<f64>,
    },
    /// Take over the peer's region `[start, start + length)` whose agent died
    /// without `tier_released`: `region` is the id the dead agent answered in
    /// `tier_registered`; the userfaultfd, memfd and shadow sent along are the ones
    /// the region was registered with. Only for a region the dead agent called
    /// `durable`. `slow_instance`: the slow tier's instance it answered then (a
    /// memory server restarted since has lost the region's pages, and the agent
    /// refuses). Answer: `tier_registered` (same id), or an error (the process
    /// cannot get its pages back and must stop).
    TierRecover {
        start: u64,
        length: u64,
        region: u64,
        slow_instance: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        t_miss: Option<f64>,
    },
    /// The peer's region starting at `start` leaves management (it is about to be
    /// unmapped): the agent stops managing it without bringing its pages back.
    /// Answer: `ok`.
    TierUnregister { start: u64 },
    /// Sets the target FMMR of `pid` (absent: the peer), from the next epoch on
    /// (MaxMem §3.1). Root may name any pid. Answer: `ok`.
    TierTarget {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<Pid>,
        t_miss: f64,
    },
    /// The tiering state. Answer: `tier_status`.
    TierStatus,
}

/// A message from the agent on the tiering socket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TierReply {
    /// Answer to `tier_unregister` and `tier_target`.
    Ok,
    /// Answer to `tier_register` and `tier_recover`: the region's id (also its key
    /// in the slow tier). `durable`: the region's pages outlive this agent (a slow
    /// tier in another process, and a shadow), so that a new agent can take it over
    /// with `tier_recover` if this one dies; otherwise the process must stop then.
    /// `slow_instance`: which incarnation of the slow tier holds the pages (a memory
    /// server's random id per start), for `tier_recover` to carry back; 0 when not
    /// durable.
    TierRegistered {
        region: u64,
        #[serde(default)]
        durable: bool,
        #[serde(default)]
        slow_instance: u64,
    },
    /// Answer to `tier_status`.
    TierStatus { status: serde_json::Value },
    /// **Not an answer**: pushed before the agent closes the connection on a clean
    /// stop, once every page of every region of the peer is back in its memfd and the
    /// regions are unregistered from their userfaultfds. A connection that closes
    /// without it means the agent died holding pages (§11). `t_miss`: the peer's
    /// target when the agent stopped (it may have been changed live with
    /// `tier_target`), for the client to hand its regions to the next agent with.
    TierReleased {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        t_miss: Option<f64>,
    },
    /// **Not an answer**: pushed to every connection of a process whose target was
    /// changed (`tier_target`, by the process or by an operator), so that the
    /// client can register its regions with it after an agent crash (`tier_recover`
    /// carries `t_miss`). A client waiting for an answer must not take it for one.
    TierTargetSet { t_miss: f64 },
    /// A request that failed.
    Error { code: ErrorCode, message: String },
}

/// Decodes one line sent to the tiering socket.
pub fn decode_tier_request(line: &str) -> Result<TierRequest, crate::DecodeError> {
    crate::decode(line)
}

/// Decodes one line sent by the agent on the tiering socket.
pub fn decode_tier_reply(line: &str) -> Result<TierReply, crate::DecodeError> {
    crate::decode(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode;

    #[test]
    fn tier_messages_encode_as_documented() {
        let r = TierRequest::TierRegister {
            start: 140_000_000_000_000,
            length: 1 << 30,
            t_miss: Some(0.1),
        };
        assert_eq!(
            encode(&r),
            "{\"v\":1,\"type\":\"tier_register\",\"start\":140000000000000,\"length\":1073741824,\"t_miss\":0.1}\n"
        );
        assert_eq!(decode_tier_request(&encode(&r)).unwrap(), r);
        let t = TierRequest::TierTarget {
            pid: None,
            t_miss: 1.0,
        };
        assert_eq!(
            encode(&t),
            "{\"v\":1,\"type\":\"tier_target\",\"t_miss\":1.0}\n"
        );
        assert_eq!(
            decode_tier_request("{\"v\":1,\"type\":\"tier_unregister\",\"start\":4096}").unwrap(),
            TierRequest::TierUnregister { start: 4096 }
        );
        assert_eq!(
            encode(&TierReply::TierRegistered {
                region: 3,
                durable: true,
                slow_instance: 18_000_000_000_000_000_000
            }),
            "{\"v\":1,\"type\":\"tier_registered\",\"region\":3,\"durable\":true,\"slow_instance\":18000000000000000000}\n"
        );
        assert_eq!(
            decode_tier_reply("{\"v\":1,\"type\":\"tier_registered\",\"region\":3}").unwrap(),
            TierReply::TierRegistered {
                region: 3,
                durable: false,
                slow_instance: 0
            }
        );
        let rec = TierRequest::TierRecover {
            start: 4096,
            length: 8192,
            region: 77,
            slow_instance: 5,
            t_miss: None,
        };
        assert_eq!(
            encode(&rec),
            "{\"v\":1,\"type\":\"tier_recover\",\"start\":4096,\"length\":8192,\"region\":77,\"slow_instance\":5}\n"
        );
        assert_eq!(decode_tier_request(&encode(&rec)).unwrap(), rec);
        assert_eq!(
            decode_tier_reply("{\"v\":1,\"type\":\"tier_released\"}").unwrap(),
            TierReply::TierReleased { t_miss: None }
        );
        assert_eq!(
            encode(&TierReply::TierReleased { t_miss: Some(0.5) }),
            "{\"v\":1,\"type\":\"tier_released\",\"t_miss\":0.5}\n"
        );
        assert_eq!(
            encode(&TierReply::TierTargetSet { t_miss: 0.25 }),
            "{\"v\":1,\"type\":\"tier_target_set\",\"t_miss\":0.25}\n"
        );
        assert!(decode_tier_request("{\"v\":2,\"type\":\"tier_status\"}").is_err());
        assert!(decode_tier_request("{\"v\":1,\"type\":\"tier_register\",\"start\":1}").is_err());
    }
}
