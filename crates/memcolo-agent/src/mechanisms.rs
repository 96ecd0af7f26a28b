//! Which of memcolo's mechanisms the agent runs, and why one is off: logged in one
//! line at start-up and shown as `mechanisms` (and `mechanisms_off`, the reasons) in
//! the `status` reply.
//!
//! The agent's mechanisms, each with its configuration switch and default:
//! - `m3`: the M3 node monitor (M3, EuroSys'21): thresholds, notifications, BE kill
//!   as the last resort. The agent's core; always on.
//! - `advice`: Hermes' file-cache advice for BE processes (Hermes §3.3),
//!   `hermes.enabled`, on by default.
//! - `reclaim`: Hermit's asynchronous reclaim (NSDI'23), `reclaim.enabled`, on by
//!   default.
//! - `tier`: MaxMem tiering (`tier.sock`), `tier.enabled`, on by default; it acts
//!   only on processes that hand it their regions.
//!
//! The fifth, the allocator (libmemcolo: Hermes' reservation and TCMalloc's adaptive
//! subrelease), runs inside the processes started with `memcolo run` or
//! `LD_PRELOAD=libmemcolo.so`; it is no switch of the agent's.

use crate::config::AgentConfig;
use serde_json::{json, Map, Value};

/// Whether a mechanism runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Switch {
    /// It runs.
    On,
    /// It does not, for this reason (the configuration, or why it could not start).
    Off(String),
}

impl Switch {
    /// Whether it runs.
    pub fn is_on(&self) -> bool {
        matches!(self, Switch::On)
    }

    fn from_enabled(enabled: bool, field: &str) -> Switch {
        if enabled {
            Switch::On
        } else {
            Switch::Off(format!("{field} = false"))
        }
    }
}

/// The agent's mechanisms (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mechanisms {
    /// The M3 node monitor: always on.
    pub m3: Switch,
    /// Hermes' file-cache advice.
    pub advice: Switch,
    /// Hermit's asynchronous reclaim.
    pub reclaim: Switch,
    /// MaxMem tiering.
    pub tier: Switch,
}

/// What the log line says of the allocator, which is no switch of the agent's.
pub const ALLOCATOR_NOTE: &str =
    "allocator (libmemcolo) per process: memcolo run or LD_PRELOAD=libmemcolo.so";

impl Mechanisms {
    /// What `cfg` asks for, before anything starts.
    pub fn from_config(cfg: &AgentConfig) -> Mechanisms {
        Mechanisms {
            m3: Switch::On,
            advice: Switch::from_enabled(cfg.hermes.enabled, "hermes.enabled"),
            reclaim: Switch::from_enabled(cfg.reclaim.enabled, "reclaim.enabled"),
            tier: Switch::from_enabled(cfg.tier.enabled, "tier.enabled"),
        }
    }

    fn entries(&self) -> [(&'static str, &'static str, &Switch); 4] {
        [
            ("m3", "M3 monitor", &self.m3),
            ("advice", "Hermes file-cache advice", &self.advice),
            ("reclaim", "Hermit reclaim", &self.reclaim),
            ("tier", "MaxMem tiering", &self.tier),
        ]
    }

    /// `{"m3": true, "advice": true, "reclaim": true, "tier": false}`.
    pub fn json(&self) -> Value {
        let m: Map<String, Value> = self
            .entries()
            .iter()
            .map(|(k, _, s)| (k.to_string(), json!(s.is_on())))
            .collect();
        Value::Object(m)
    }

    /// The reason of each mechanism that is off: `{"tier": "tier.enabled = false"}`.
    pub fn off_json(&self) -> Value {
        let m: Map<String, Value> = self
            .entries()
            .iter()
            .filter_map(|(k, _, s)| match s {
                Switch::Off(why) => Some((k.to_string(), json!(why))),
                Switch::On => None,
            })
            .collect();
        Value::Object(m)
    }

    /// One line naming every mechanism and whether it runs, for the start-up log:
    /// `M3 monitor on; Hermes file-cache advice on; Hermit reclaim on; MaxMem tiering
    /// off (tier.enabled = false); allocator (libmemcolo) per process: ...`.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .entries()
            .iter()
            .map(|(_, name, s)| match s {
                Switch::On => format!("{name} on"),
                Switch::Off(why) => format!("{name} off ({why})"),
            })
            .collect();
        parts.push(ALLOCATOR_NOTE.into());
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_run_every_mechanism() {
        let m = Mechanisms::from_config(&AgentConfig::default());
        assert_eq!(
            m.json(),
            json!({"m3": true, "advice": true, "reclaim": true, "tier": true})
        );
        assert_eq!(m.off_json(), json!({}));
        let line = m.summary();
        for w in [
            "M3 monitor on",
            "Hermes file-cache advice on",
            "Hermit reclaim on",
            "MaxMem tiering on",
            "allocator (libmemcolo)",
        ] {
            assert!(line.contains(w), "{line}");
        }
        let mut cfg = AgentConfig::default();
        cfg.reclaim.enabled = false;
        let m = Mechanisms::from_config(&cfg);
        assert_eq!(m.off_json(), json!({"reclaim": "reclaim.enabled = false"}));
        assert!(
            m.summary()
                .contains("Hermit reclaim off (reclaim.enabled = false)"),
            "{}",
            m.summary()
        );
    }

    #[test]
    fn a_mechanism_that_could_not_start_says_why() {
        let mut m = Mechanisms::from_config(&AgentConfig::default());
        m.tier = Switch::Off("no userfaultfd: ENOSYS".into());
        assert_eq!(m.json()["tier"], json!(false));
        assert_eq!(m.off_json()["tier"], json!("no userfaultfd: ENOSYS"));
        assert!(m
            .summary()
            .contains("MaxMem tiering off (no userfaultfd: ENOSYS)"));
    }
}
