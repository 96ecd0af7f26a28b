//! memcolo's benchmarks on real services.
//!
//! - [`colocation`]: Redis as the latency-critical (LC) service beside real batch jobs
//!   (best-effort, BE) inside a scratch memory cgroup "node", at the memory pressure
//!   levels of Hermes §5.1 (BE demand / node memory = 0, 50, 75, 100, 125, 150 %), with
//!   the kernel alone and with the memcolo agent; query latency, SLO violations
//!   (Hermes §5.3) and BE throughput.
//! - [`agent_cost`]: CPU time and RSS of the agent managing many registered processes.
//! - [`batch`]: a k-means batch job with part of its working set in zram swap, with the
//!   kernel alone and with the agent's asynchronous reclaim (Hermit's throughput
//!   experiment).
//! - [`progress`]: BE progress per job against each job's solo rate, and the weighted
//!   speedup over the jobs (Snavely & Tullsen).
//!
//! The remaining modules are the pieces both use: a scratch cgroup v1 node
//! ([`cgroup`]), zram swap ([`zram`]), child processes placed in cgroups ([`process`]),
//! the agent process ([`agent`]), Redis and its open-loop load generator ([`lc`],
//! [`loadgen`]), the BE jobs ([`be`]) and the report writers ([`report`]).

pub mod agent;
pub mod agent_cost;
pub mod batch;
pub mod be;
pub mod cgroup;
pub mod colocation;
pub mod error;
pub mod lc;
pub mod loadgen;
pub mod memcached;
pub mod process;
pub mod progress;
pub mod report;
pub mod signal;
pub mod size;
pub mod zram;

pub use error::BenchError;
