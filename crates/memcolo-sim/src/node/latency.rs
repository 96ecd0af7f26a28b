//! The latency of a latency-critical process's requests in one step of the node
//! model (see the parent module's docs, "Latency"), and the weighted quantiles the
//! run's figures are read from.

use super::{Class, Node, Proc, Sample};

pub(super) fn weighted_quantile(s: &mut [Sample], q: f64) -> f64 {
    if s.is_empty() {
        return 0.0;
    }
    s.sort_by(|a, b| a.us.total_cmp(&b.us));
    let total: f64 = s.iter().map(|x| x.weight).sum();
    let mut acc = 0.0;
    for x in s.iter() {
        acc += x.weight;
        if acc >= q * total {
            return x.us;
        }
    }
    s[s.len() - 1].us
}

impl Node {
    /// Samples the latency of the `n` requests of LC process `i` in this step.
    pub(super) fn lc_latency(&mut self, i: usize, n: f64, dt: f64, frac: f64, fault_s: f64) {
        if n <= 0.0 {
            return;
        }
        let measured = self.now >= self.cfg.measure_from;
        let c = &self.cfg.calib;
        let base_s = c.lc_service_us * 1e-6;
        // z = 1.2816 at the 90th percentile of the standard normal.
        let sigma = (c.lc_service_p90_us / c.lc_service_us.max(1e-9)).ln() / 1.2816;
        let be_resident: u64 = self
            .procs
            .iter()
            .filter(|p| p.alive && p.spec.workload.class() != Class::Lc)
            .map(Proc::resident)
            .sum();
        let be_running = self
            .procs
            .iter()
            .any(|p| p.alive && p.spec.workload.class() != Class::Lc);
        let interference_share = if be_running {
            (c.be_interference_share
                + c.be_interference_share_per_node * be_resident as f64
                    / self.cfg.total_bytes as f64)
                .min(1.0)
        } else {
            0.0
        };
        let (tail_share, tail_mean_s) = (c.lc_tail_share, c.lc_tail_mean_us * 1e-6);
        let be_mean_s = c.be_interference_mean_us * 1e-6;
        let per_req_pages = c.lc_pages_per_request;
        let swapin_s = c.swapin_us * 1e-6;
        let stall_s = self.procs[i].step_stall_s;
        let backlog0 = self.procs[i].backlog_s;
        let busy = n * base_s + fault_s + stall_s;
        // The stall (direct reclaim) happens as one block at a random time of the step.
        let block_at = self.uniform() * dt;
        let samples = self.cfg.lc_samples_per_step.clamp(1, 1 << 16);
        let weight = n / samples as f64;
        let p_fault = 1.0 - (1.0 - frac).powf(per_req_pages);
        for k in 0..samples {
            let arrive = (k as f64 + self.uniform()) / samples as f64 * dt;
            // Backlog drains at the rate the server gets ahead of arrivals.
            let spare = (1.0 - busy / dt).max(0.0);
            let mut wait = (backlog0 - arrive * spare).max(0.0);
            if busy > dt {
                wait += (busy - dt) * arrive / dt;
            }
            if arrive >= block_at && arrive < block_at + stall_s {
                wait += block_at + stall_s - arrive;
            }
            let own = if self.uniform() < p_fault {
                swapin_s * (1.0 + (per_req_pages - 1.0) * frac).max(1.0)
            } else {
                0.0
            };
            // Log-normal service time: median × e^(σ z), z standard normal
            // (Box–Muller), σ from the p99 (z = 2.326 at the 99th percentile).
            let (u1, u2) = (self.uniform().max(1e-12), self.uniform());
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            let service = base_s * (sigma * z).exp();
            let mut extra = 0.0;
            if self.uniform() < tail_share {
                extra += -tail_mean_s * (1.0 - self.uniform()).ln();
            }
            if self.uniform() < interference_share {
                extra += -be_mean_s * (1.0 - self.uniform()).ln();
            }
            let s = Sample {
                us: (service + extra + own + wait) * 1e6,
                weight,
            };
            if measured {
                self.samples.push(s);
                self.second_samples.push(s);
            }
        }
        self.procs[i].backlog_s = (backlog0 + busy - dt).max(0.0);
        if measured {
            self.stats.lc.requests += n;
        }
        // Keep the run's sample store bounded: merge to a coarse log histogram.
        if self.samples.len() >= 1 << 16 {
            self.compact_samples();
        }
    }

    fn compact_samples(&mut self) {
        use std::collections::BTreeMap;
        let mut buckets: BTreeMap<i64, (f64, f64)> = BTreeMap::new();
        for s in self.samples.drain(..) {
            let b = (s.us.max(1e-3).ln() / 0.01f64.ln_1p()).floor() as i64;
            let e = buckets.entry(b).or_insert((0.0, 0.0));
            e.0 += s.us * s.weight;
            e.1 += s.weight;
        }
        self.samples = buckets
            .into_values()
            .map(|(sum, w)| Sample {
                us: sum / w,
                weight: w,
            })
            .collect();
    }
}
