//! Vocabulary shared by every policy.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A Linux process id (`pid_t`).
pub type Pid = i32;

/// The class a process is registered with.
///
/// - `Lc`: latency-critical; never killed, its memory is never reclaimed by memcolo
///   unless the operator allows it.
/// - `Be`: best-effort batch work; its file cache may be dropped (Hermes §3.3) and, as
///   the last resort above the top of memory, it may be killed (M3 §5.1).
/// - `Elastic`: an application that shrinks itself when signalled (M3 §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Lc,
    Be,
    Elastic,
}

impl Class {
    /// The lowercase name used on the wire, in the CLI and in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Lc => "lc",
            Class::Be => "be",
            Class::Elastic => "elastic",
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Class {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "lc" => Ok(Class::Lc),
            "be" => Ok(Class::Be),
            "elastic" => Ok(Class::Elastic),
            other => Err(format!(
                "unknown class `{other}` (expected lc, be or elastic)"
            )),
        }
    }
}

/// The level of a memory-pressure notification (M3 §3, §5).
///
/// - `Low`: usage passed the low threshold (yellow zone): an early warning.
/// - `High`: usage passed the high threshold (red zone): reclaim, and throttle growth
///   with the allow rate (M3 §4.2).
/// - `Top`: usage passed the top of memory: every registered process is signalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Low,
    High,
    Top,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Low => "low",
            Level::High => "high",
            Level::Top => "top",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "low" => Ok(Level::Low),
            "high" => Ok(Level::High),
            "top" => Ok(Level::Top),
            other => Err(format!(
                "unknown level `{other}` (expected low, high or top)"
            )),
        }
    }
}
