//! memcolo's node simulator: a discrete-time model of one node's memory (RAM, page
//! cache, a swap or far tier, direct and asynchronous reclaim, fault latencies) on
//! which the agent's own policy code runs — M3's [`memcolo_policy::m3::Monitor`],
//! Hermes' [`memcolo_policy::hermes::plan_advice`] and Hermit's
//! [`memcolo_policy::hermit::ReclaimScheduler`] — with elastic applications that
//! answer through the Rust SDK's allow-rate gate ([`memcolo_sdk::gate`]), so that
//! the policies are tried at sizes this machine cannot hold (a 1 TiB node, the
//! papers' 64 GB experiments).
//!
//! Modules:
//! - [`calib`]: [`Calibration`], the model's constants with their units and sources.
//! - [`node`]: [`Node`], the model and the policy wiring.
//! - [`scenario`]: the workloads of `memcolo sim SCENARIO`.
//! - [`fleet`]: fleet mode, N nodes with sampled mixes and an A/B of the management
//!   or of any setting.
//! - [`subrelease`]: libmemcolo's adaptive subrelease decisions (its C file, linked).
//! - [`heap`]: each process's heap in huge pages under those decisions (huge page
//!   coverage, realized fragmentation).
//! - [`maxmem`]: MaxMem's six-process timeline through the policy's MaxMem.
//! - [`trace`]: a node and its processes read from a JSON trace.
//! - [`eventlog`]: a recorded `memcolo` event log read into a trace.
//! - [`papers`]: the papers' headline experiments at their own sizes (M3 Fig. 5/8
//!   against the best static partition; Hermes §5.3's levels on 128 GiB).
//! - [`cli`]: `memcolo sim`'s arguments, table and report.
//! - [`validate`]: `memcolo sim --validate`, the comparison with a recorded bench run.
//!
//! A run is a deterministic function of its settings and seed: no clock is read by
//! the model (the SDK's gate is given instants at a fixed base plus simulated time).
//! Docs: `docs/sim.md`; measurements and validation: `bench/sim/RESULTS.md`.

pub mod calib;
pub mod cli;
pub mod eventlog;
pub mod fleet;
pub mod heap;
pub mod maxmem;
pub mod node;
pub mod papers;
pub mod scenario;
pub mod subrelease;
pub mod trace;
pub mod validate;

pub use calib::Calibration;
pub use cli::{parse_args, run, SimArgs};
pub use node::{Mode, Node, NodeConfig, NodeStats, ProcSpec, Workload};
