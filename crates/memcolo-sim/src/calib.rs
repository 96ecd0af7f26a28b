//! The node model's constants: what a page costs to swap in, reclaim or read back, and
//! what a latency-critical request costs without stalls.
//!
//! Every figure is a field of [`Calibration`], with its unit and where its default
//! comes from: a measurement on the development VM (2 vCPUs, 24 GiB, Linux 6.18, zram
//! swap), cited by file and section, or "assumed" with the way to measure it. Other
//! hardware (DRAM/CXL/Optane latencies, RDMA far memory, a real disk) is modelled by
//! overriding the fields (`--calibration FILE`, a JSON object with any subset).

use serde::{Deserialize, Serialize};

/// The constants of the node model. Times are microseconds (µs) per 4 KiB page or
/// per request; bandwidths bytes per second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Calibration {
    /// Page size the model counts in, bytes (x86-64 base page: 4096).
    pub page_bytes: u64,
    /// Fault latency of a swapped-out anonymous page brought back from the far tier
    /// (zram here), µs per 4 KiB page, paid by the faulting thread. Default 10 µs:
    /// *assumed* (LZ4 decompression of a page plus the fault path; the tiering bench's
    /// userfaultfd path, `bench/tiering/RESULTS.md`, measured 10–14 µs of serving per
    /// slow fault, a comparable path). Measure: touch a buffer swapped out in a scratch
    /// memory cgroup and divide the elapsed time by the major faults
    /// (`/usr/bin/time -v`), under `flock /tmp/memcolo-bench.lock`.
    pub swapin_us: f64,
    /// CPU time to reclaim one anonymous page into the far tier (compress and write to
    /// zram), µs per 4 KiB page: 7.6 µs, from k-means' 1.99 CPU s per GiB reclaimed into
    /// zram (`bench/reclaim/RESULTS.md`, "CPU spent reclaiming per GiB" of the
    /// 2026-11-24 runs: 1.99 s/GiB ÷ 262,144 pages).
    pub anon_reclaim_us: f64,
    /// CPU time to reclaim one clean page-cache page, µs per 4 KiB page: 0.61 µs, from
    /// the side-by-side runs' median 0.16 CPU s per GiB reclaimed, mostly clean page
    /// cache (`bench/reclaim/RESULTS.md`, section `side-by-side`, "CPU spent reclaiming
    /// reported per GiB").
    pub file_reclaim_us: f64,
    /// Extra time a direct reclaim costs the allocating thread beyond the per-page
    /// reclaim work (lock contention, LRU scanning of pages it cannot take, throttling),
    /// as a multiplier of that work. Default 2.0: *assumed*. Measure: the
    /// `mm_vmscan_direct_reclaim_begin/end` tracepoints around a hog in a scratch
    /// cgroup (`bench/diag/trace_run.sh`), time per page reclaimed.
    pub direct_reclaim_factor: f64,
    /// Read bandwidth of the disk behind the page cache, bytes/s: bounds a streamer's
    /// misses. Default 1 GiB/s: *assumed* (virtio disk of the VM). Measure: `fio
    /// --rw=read --direct=1 --bs=1M --size=2G`.
    pub disk_bytes_per_s: f64,
    /// Median latency of a latency-critical request without memory stalls, µs: 95 µs,
    /// the Redis p50 at level 0 with the kernel alone (`bench/colocation/RESULTS.md`,
    /// section `redis-quick`, median of the two accepted runs).
    pub lc_service_us: f64,
    /// 90th percentile of that latency, µs: 125 µs, the sweep's SLO, which the bench
    /// defines as the median p90 of those runs. The body of the latency (network,
    /// scheduling, the service's own work) is log-normal with this median and p90.
    /// Fitted, so level 0 matches by construction there.
    pub lc_service_p90_us: f64,
    /// Share of latency-critical requests that wait behind one of the service's own
    /// rare stalls (timer ticks, its event loop's housekeeping, the VM's vCPU
    /// scheduling), with no batch job running: 0.01, fitted (least squares on the log
    /// of p99 and p99.9, grid search) to the p99 (228 µs) and p99.9 (2,518 µs) of the
    /// same level-0 kernel-alone runs, as an exponential delay added to the body.
    pub lc_tail_share: f64,
    /// Mean of that stall, µs: 1,000 µs (same fit).
    pub lc_tail_mean_us: f64,
    /// Share of latency-critical requests delayed by the batch jobs' interference on
    /// the shared machine (memory bandwidth, last-level cache, the host's scheduling
    /// of the two vCPUs), whenever a batch job runs, before the term that grows with
    /// their memory ([`Calibration::be_interference_share_per_node`]): 0.004. Fitted
    /// (least squares on the log of p99 and p99.9, grid search) to the runs without
    /// memory pressure: the kernel-alone runs at 50 % of the Redis quick sweep of
    /// 2026-11-28 (node 37 % used) and the `no-pressure` runs at 100 and 125 % of the
    /// same day (`memcolo bench colocation --quick --levels 100,125 --modes
    /// no-pressure,kernel,full`, node limit above the demand). The LC service took
    /// no major fault and the node no swap in any run of the quick sweep, and without
    /// memory pressure its p99 is as high as with it (1,414 µs at 100 %), so its tail
    /// under load is interference, not memory; the runs with pressure are left for
    /// `memcolo sim --validate` to check.
    /// Re-measure: `memcolo bench colocation --quick --modes kernel,no-pressure`, then
    /// `memcolo sim --validate --reference DIR`.
    pub be_interference_share: f64,
    /// Growth of that share with the batch jobs' resident memory (anonymous and page
    /// cache, batch and elastic processes), per node's worth of it: the share is
    /// `be_interference_share + be_interference_share_per_node × be_resident / node`:
    /// 0.009 (same fit). A node with more memory bandwidth per byte (more channels, another
    /// CPU) has other figures: override them.
    pub be_interference_share_per_node: f64,
    /// Mean delay of an interfered request, µs (exponential; same fit): 4,000 µs; the
    /// p99.9 of the loaded runs sits at 8–11 ms at every level from 50 to 150 %.
    pub be_interference_mean_us: f64,
    /// Distinct pages of its working set one latency-critical request touches. Default
    /// 2: *assumed* (a Redis GET of a small value: the dict bucket and the value).
    pub lc_pages_per_request: f64,
    /// Weight of a latency-critical process's anonymous pages in the kernel's reclaim
    /// choice, relative to a batch process's (1.0: the LRU does not know classes; below
    /// 1: its hot pages sit on the active list). Default 0.5: *assumed*; the kernel
    /// runs of `bench/reclaim` show the LC service does lose pages (80,541 major faults
    /// of Redis at 100 %, side-by-side table) but not how many relative to the BE jobs.
    pub lc_lru_weight: f64,
    /// `vm.swappiness`: the kernel's direct reclaim takes `swappiness / 200` of what it
    /// needs from anonymous memory (into swap) and the rest from page cache. Default
    /// 60, the kernel's default (`Documentation/admin-guide/sysctl/vm.rst`), which this
    /// machine runs with (`sysctl vm.swappiness`).
    pub swappiness: f64,
    /// Pages the kernel reclaims beyond the shortfall in one direct reclaim
    /// (`SWAP_CLUSTER_MAX` = 32 pages in `mm/vmscan.c`).
    pub reclaim_cluster_pages: u64,
    /// Time an elastic application takes to handle a notification (run its handlers
    /// and return memory), µs. Default 15,000 µs: the Go cache's epochs of ~15 ms in
    /// bench/m3 (`sdk/rust/src/gate.rs`, module docs, "Minimum epoch").
    pub elastic_handle_us: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            page_bytes: 4096,
            swapin_us: 10.0,
            anon_reclaim_us: 1.99e6 / 262_144.0,
            file_reclaim_us: 0.16e6 / 262_144.0,
            direct_reclaim_factor: 2.0,
            disk_bytes_per_s: (1u64 << 30) as f64,
            lc_service_us: 95.0,
            lc_service_p90_us: 125.0,
            lc_tail_share: 0.01,
            lc_tail_mean_us: 1000.0,
            be_interference_share: 0.004,
            be_interference_share_per_node: 0.009,
            be_interference_mean_us: 4000.0,
            lc_pages_per_request: 2.0,
            lc_lru_weight: 0.5,
            swappiness: 60.0,
            reclaim_cluster_pages: 32,
            elastic_handle_us: 15_000.0,
        }
    }
}

impl Calibration {
    /// Checks that every figure is finite, costs are non-negative and sizes positive.
    pub fn validate(&self) -> anyhow::Result<()> {
        let costs = [
            ("swapin_us", self.swapin_us),
            ("anon_reclaim_us", self.anon_reclaim_us),
            ("file_reclaim_us", self.file_reclaim_us),
            ("direct_reclaim_factor", self.direct_reclaim_factor),
            ("lc_service_us", self.lc_service_us),
            ("lc_service_p90_us", self.lc_service_p90_us),
            ("lc_tail_share", self.lc_tail_share),
            ("lc_tail_mean_us", self.lc_tail_mean_us),
            ("be_interference_share", self.be_interference_share),
            (
                "be_interference_share_per_node",
                self.be_interference_share_per_node,
            ),
            ("be_interference_mean_us", self.be_interference_mean_us),
            ("lc_pages_per_request", self.lc_pages_per_request),
            ("lc_lru_weight", self.lc_lru_weight),
            ("swappiness", self.swappiness),
            ("elastic_handle_us", self.elastic_handle_us),
        ];
        for (name, v) in costs {
            anyhow::ensure!(
                v.is_finite() && v >= 0.0,
                "calibration {name} = {v}: must be finite and >= 0"
            );
        }
        anyhow::ensure!(
            self.disk_bytes_per_s.is_finite() && self.disk_bytes_per_s > 0.0,
            "calibration disk_bytes_per_s must be positive"
        );
        anyhow::ensure!(
            self.lc_service_p90_us >= self.lc_service_us,
            "calibration lc_service_p90_us must be >= lc_service_us"
        );
        anyhow::ensure!(
            self.lc_tail_share <= 1.0 && self.be_interference_share <= 1.0,
            "calibration shares must be at most 1"
        );
        anyhow::ensure!(
            self.page_bytes > 0 && self.page_bytes <= 1 << 30,
            "calibration page_bytes must be in 1..=1 GiB"
        );
        anyhow::ensure!(
            self.reclaim_cluster_pages <= 1 << 20,
            "calibration reclaim_cluster_pages must be at most 2^20"
        );
        Ok(())
    }

    /// Throughput of one asynchronous reclaim worker on anonymous memory, bytes/s.
    pub fn anon_worker_bytes_per_s(&self) -> f64 {
        self.page_bytes as f64 / (self.anon_reclaim_us.max(1e-3) * 1e-6)
    }

    /// Throughput of one asynchronous reclaim worker on clean page cache, bytes/s.
    pub fn file_worker_bytes_per_s(&self) -> f64 {
        self.page_bytes as f64 / (self.file_reclaim_us.max(1e-3) * 1e-6)
    }
}
