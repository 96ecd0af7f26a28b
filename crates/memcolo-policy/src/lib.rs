//! memcolo's policy core: every algorithm memcolo takes from its papers, written as
//! a pure state machine `(state, observations, now) -> (state, actions)`.
//!
//! Nothing in this crate reads a file, a clock or makes a system call. Time comes in
//! as a [`std::time::Duration`] since an arbitrary epoch chosen by the caller (the
//! agent uses a monotonic clock), observations come in as plain values, and actions
//! go out as values the caller carries out, so the agent and tests on worked examples
//! run the same code.
//!
//! Modules:
//! - [`error`]: [`PolicyError`], why a policy refused a configuration or a state.
//! - [`types`]: the vocabulary shared by every policy (process class, signal level).
//! - [`m3`]: the M3 node monitor (M3, EuroSys'21 §5): adaptive low/high thresholds
//!   below a *top* of memory, selective high signalling (Algorithm 1), kill as a last
//!   resort (BE processes only).
//! - [`kubernetes`]: pods as classes (annotation, then QoS class) and M3's kill rule
//!   on pods (BE pods, lowest priority first).
//! - [`ledger`]: a registered process's notifications, reported reclamation and RSS
//!   falls over a sliding minute: its rates, and the unmatched-reclaim rule (M3's
//!   R10).
//! - [`hermes`]: Hermes' file-cache advice (Hermes, Middleware'21 §3.3): which BE
//!   files to drop from the page cache, largest resident first.
//! - [`hermit`]: Hermit's feedback-directed asynchronous reclaim (NSDI'23): when to
//!   reclaim, with how many workers, when to back off, when to look again, and where
//!   the workers run.
//! - [`maxmem`]: MaxMem's tiered-memory QoS (MaxMem §3.1–§3.2): per-process target
//!   fast-memory miss ratios, proportional reallocation of the fast tier, hotness bins
//!   with cooling, a migration cap per epoch.
//! - [`tiering`]: the rules of MaxMem's executor (the tier's sampler, fault handling
//!   and threads): sample sizing for the FMMR's standard error (§3.2), refaults at a
//!   short distance, tier thread scheduling by `t_miss`.

pub mod error;
pub mod hermes;
pub mod hermit;
pub mod kubernetes;
pub mod ledger;
pub mod m3;
pub mod maxmem;
pub mod tiering;
pub mod types;

pub use error::PolicyError;
pub use types::{Class, Level, Pid};
