//! memcolo's benchmarks on real services.
//!
//! - [`colocation`]: memcolo's main job. An LC service (Redis or memcached) beside
//!   real batch jobs and an elastic cache (BE) inside a scratch memory cgroup "node",
//!   at the memory pressure levels of Hermes §5.1 (BE demand / node memory = 0 … 150 %),
//!   under the kernel alone, peers' controllers ([`peers`]: Senpai/TMO, Koordinator's
//!   BE eviction, re-implemented), each of memcolo's mechanisms alone and the whole of
//!   memcolo; repeated, interleaved, with disturbed runs rejected; query latency, SLO
//!   violations (Hermes §5.3), BE progress and node utilisation.
//! - [`reclaim`]: `memcolo bench reclaim`, the asynchronous-reclaim comparison
//!   (Hermit) on the colocation sweep, or [`batch`]: a k-means batch job with part of
//!   its working set in zram swap (Hermit's throughput experiment).
//! - [`agent_cost`]: CPU time and RSS of the agent managing many registered processes.
//! - [`progress`]: BE progress per job against each job's solo rate, and the weighted
//!   speedup over the jobs (Snavely & Tullsen).
//!
//! The remaining modules are the pieces they share: output folders and machine facts
//! ([`harness`]), a scratch cgroup v1 node and cgroup2 PSI groups ([`cgroup`]), zram
//! swap ([`zram`]), child processes placed in cgroups ([`process`]), the agent process
//! ([`agent`]), the LC services and their open-loop load generator ([`lc`],
//! [`memcached`], [`loadgen`]), the BE jobs ([`be`], [`elastic`]), the per-run
//! timeline ([`timeline`]) and the raw-result writers ([`report`]).

pub mod agent;
pub mod agent_cost;
pub mod batch;
pub mod be;
pub mod cgroup;
pub mod colocation;
pub mod dataset;
pub mod elastic;
pub mod error;
pub mod harness;
pub mod lc;
pub mod loadgen;
pub mod memcached;
pub mod peers;
pub mod process;
pub mod progress;
pub mod reclaim;
pub mod redis_server;
pub mod report;
pub mod service;
pub mod signal;
pub mod size;
pub mod timeline;
pub mod zram;

pub use error::BenchError;
