//! memcolo's Linux layer: readers of procfs, cgroup v1/v2 memory and PSI that take
//! their root path (so tests point them at fake trees), kernel pressure event sources
//! (v1 `memory.pressure_level` eventfds, PSI triggers, pidfds), the actuators the
//! agent acts through, behind a trait, and the node checks of `memcolo doctor`
//! ([`probe`]).
//!
//! Modelled on facebookincubator/below's `procfs` and `cgroupfs` crates: methods are
//! named after the kernel file they read, units are in field names, and a limit is an
//! enum rather than `-1` or `"max"`.

pub mod actuate;
pub mod cgroup;
pub mod error;
pub mod events;
pub mod fake;
pub mod filecache;
pub mod identity;
pub mod kubepods;
pub mod pageout;
pub mod pidfd;
pub mod probe;
pub mod procfs;
pub mod psi;
pub mod sched;
pub mod scope;
pub mod swap;

pub use error::{Error, Result};
