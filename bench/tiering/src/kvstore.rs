//! A key-value store as the latency-sensitive process of MaxMem §5.2 (the paper uses
//! FlexKVS), with its load generator in the same process.
//!
//! The store keeps `--items` values of `--value-bytes` bytes in one anonymous mapping
//! (so that libmemcolo hands it to the agent when `MEMCOLO_TIER=1`, or the
//! in-process tier manager manages it with `--manage maxmem`). Keys are 0..items; a
//! key's slot is a bijective hash of it (every slot holds one key, so the store's
//! footprint is the whole mapping), so a hot key range is spread over the whole
//! mapping as in a real store. Each value carries its key, a version and a
//! checksum, verified on every GET: a lost or wrong page is an error, not a latency.
//!
//! Load: `--clients` closed-loop threads; each request is a GET (a SET with
//! probability `--set-pct`) of a key from the hot set (the first `--hot-items-pct` of
//! the keys) with probability `--hot-pct`, else from all keys (FlexKVS in §5.2: 90 %
//! of the requests to the hot set). Latency is measured per request (µs, HDR
//! histogram). Phases: `init` (every value written), `warmup`, `measure`. Output: one
//! JSON summary (ops/s, p50/p90/p99/p99.9 µs, errors) and, with `--timeline`, a CSV of
//! one row per second.

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use memcolo_policy::maxmem::MaxMemConfig;
use memcolo_tier::compressed::CompressedStore;
use memcolo_tier::manager::{TierConfig, TierManager};
use memcolo_tier::node::{NodeTiming, TierNode};
use memcolo_tier::region::{AnonRegion, PAGE};
use memcolo_tier::uffd::{self, features, mode, Uffd};
use serde_json::json;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Manage {
    Off,
    Maxmem,
}

#[derive(Parser, Debug)]
#[command(
    name = "kvstore",
    about = "A KV store with a skewed closed-loop load (MaxMem §5.2)"
)]
struct Args {
    /// Values in the store.
    #[arg(long, default_value_t = 131072)]
    items: u64,
    /// Bytes per value (a multiple of 64).
    #[arg(long, default_value_t = 1024)]
    value_bytes: u64,
    /// Share of the keys in the hot set, percent.
    #[arg(long, default_value_t = 15.0)]
    hot_items_pct: f64,
    /// Share of requests to the hot set, percent.
    #[arg(long, default_value_t = 90.0)]
    hot_pct: f64,
    /// Share of requests that are SETs, percent.
    #[arg(long, default_value_t = 10.0)]
    set_pct: f64,
    /// Closed-loop client threads.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    #[arg(long, default_value_t = 10.0)]
    warmup_s: f64,
    #[arg(long, default_value_t = 20.0)]
    measure_s: f64,
    /// In-process management (a static partition: `--fast-mib` for this process).
    #[arg(long, value_enum, default_value_t = Manage::Off)]
    manage: Manage,
    /// Fast memory of an in-process managed store, MiB.
    #[arg(long)]
    fast_mib: Option<u64>,
    /// Policy migrations per epoch of an in-process managed store, KiB (MaxMem §3.1's
    /// cap: half for reallocation, half for hot/cold exchange).
    #[arg(long, default_value_t = 64 << 10)]
    migration_cap_kib: u64,
    /// The in-process sampler's FMMR error target (0: aim at 16 hits per window), as
    /// the agent's `tier.sample_fmmr_error`.
    #[arg(long, default_value_t = 0.01)]
    sample_fmmr_error: f64,
    /// Most pages on probation of an in-process managed store (0: none), as the
    /// agent's `tier.probation_pages`.
    #[arg(long, default_value_t = 128)]
    probation_pages: usize,
    /// Count short-distance refaults as hotness samples for sure in an in-process
    /// managed store (default: sample them at k/R), as the agent's
    /// `tier.refault_samples`.
    #[arg(long)]
    refault_samples: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    timeline: Option<std::path::PathBuf>,
    #[arg(long, default_value = "")]
    label: String,
}

/// The store's index: key → slot, a bijection of `0..items` (every slot holds exactly
/// one key, so the whole mapping is the store's footprint) that scatters neighbouring
/// keys over the mapping, so that a hot key range is spread over the whole region as
/// in a hashed store. A permutation of `0..2^k` (odd multiplications and xor-shifts,
/// each invertible on `k` bits) walked until it lands below `items` (cycle walking).
fn slot_of(key: u64, items: u64) -> u64 {
    let bits = 64 - (items.max(2) - 1).leading_zeros();
    let mask = (1u64 << bits) - 1;
    let half = (bits / 2).max(1);
    let mut x = key;
    loop {
        x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15) & mask;
        x ^= x >> half;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9) & mask;
        x ^= x >> half;
        if x < items {
            return x;
        }
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Header of a value: key, version, checksum of the payload.
const HDR: usize = 24;

fn write_value(v: &mut [u8], key: u64, version: u64) {
    let (h, body) = v.split_at_mut(HDR);
    let mut x = key ^ version.rotate_left(17) ^ 0xA5A5;
    for c in body.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    let sum = fnv(body);
    h[0..8].copy_from_slice(&key.to_le_bytes());
    h[8..16].copy_from_slice(&version.to_le_bytes());
    h[16..24].copy_from_slice(&sum.to_le_bytes());
}

/// Whether a value read back is whole (its checksum matches its payload).
fn value_ok(v: &[u8]) -> bool {
    let sum = u64::from_le_bytes(v[16..24].try_into().expect("8 bytes"));
    fnv(&v[HDR..]) == sum
}

struct Store {
    base: usize,
    items: u64,
    vb: u64,
    /// One lock per 64 slots (a GET copies the value out under it).
    locks: Vec<Mutex<()>>,
}

impl Store {
    /// The bytes of slot `s`.
    ///
    /// # Safety
    /// The caller holds the slot's lock ([`Store::lock`]) or is the only thread.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot(&self, s: u64) -> &mut [u8] {
        // SAFETY: slot s lies inside the mapping; the caller holds the slot's lock.
        unsafe {
            std::slice::from_raw_parts_mut(
                (self.base + (s * self.vb) as usize) as *mut u8,
                self.vb as usize,
            )
        }
    }
    fn lock(&self, s: u64) -> std::sync::MutexGuard<'_, ()> {
        self.locks[(s / 64) as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// An in-process manager: the node, the region's manager, the policy thread, the
/// region's first policy page.
type InProcess = (
    Arc<TierNode>,
    Arc<TierManager>,
    std::thread::JoinHandle<()>,
    u64,
);

fn main() -> Result<()> {
    let a = Args::parse();
    if a.value_bytes < 64 || a.value_bytes % 8 != 0 || a.items == 0 {
        bail!("--value-bytes: a multiple of 8, at least 64; --items positive");
    }
    let bytes = a.items * a.value_bytes;
    let pages = (bytes as usize).div_ceil(PAGE);
    let region = AnonRegion::new(pages).context("mapping the store")?;
    let stop_mgr = Arc::new(AtomicBool::new(false));
    let mut managed: Option<InProcess> = None;
    if a.manage == Manage::Maxmem {
        uffd::check_permission().map_err(|w| anyhow::anyhow!("userfaultfd: {w}"))?;
        let fast_pages = a.fast_mib.map_or(pages as u64, |m| (m << 20) / PAGE as u64);
        let node = Arc::new(TierNode::new(MaxMemConfig {
            migration_cap_pages: ((a.migration_cap_kib << 10) / PAGE as u64).max(2),
            ..MaxMemConfig::with_capacity(fast_pages, PAGE as u64)
        })?);
        let pid = std::process::id() as i32;
        node.register(pid, 0.1)?;
        let base = region.as_ptr() as u64;
        let first = TierNode::first_page_of(base);
        let u = Uffd::open(features::PAGEFAULT_FLAG_WP)?;
        u.register(base, region.len() as u64, mode::MISSING | mode::WP)?;
        let m = Arc::new(TierManager::start(
            u,
            Box::new(region.memory()),
            Arc::new(CompressedStore::new(PAGE, bytes * 2 + (64 << 20))),
            Box::new(node.placement(pid, first)),
            TierConfig {
                zero_fill_ahead: 64,
                sample_fmmr_error: a.sample_fmmr_error,
                probation_pages: a.probation_pages,
                refault_samples: a.refault_samples,
                ..TierConfig::new(1)
            },
        )?);
        node.attach(pid, first, m.clone());
        let (n2, s2) = (node.clone(), stop_mgr.clone());
        let driver = std::thread::spawn(move || {
            n2.run(NodeTiming::default(), &s2, |_, applied| {
                if let Some((_, _, why)) = applied.fatal.first() {
                    eprintln!("kvstore: stopped: {why}");
                    std::process::exit(70);
                }
            })
        });
        managed = Some((node, m, driver, first));
    }
    let store = Arc::new(Store {
        base: region.as_ptr() as usize,
        items: a.items,
        vb: a.value_bytes,
        locks: (0..a.items.div_ceil(64)).map(|_| Mutex::new(())).collect(),
    });
    // Init: every key written once (every slot: the whole footprint is touched).
    let t0 = Instant::now();
    for k in 0..a.items {
        let s = slot_of(k, a.items);
        // SAFETY: no client runs yet.
        write_value(unsafe { store.slot(s) }, k, 0);
    }
    let init_s = t0.elapsed().as_secs_f64();
    let measuring = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1, 60_000_000, 3,
    )?));
    let sec_hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1, 60_000_000, 3,
    )?));
    let hot_items = ((a.items as f64 * a.hot_items_pct / 100.0) as u64).max(1);
    let clients: Vec<_> = (0..a.clients)
        .map(|c| {
            let (store, measuring, done, ops, errors, hist, sec_hist) = (
                store.clone(),
                measuring.clone(),
                done.clone(),
                ops.clone(),
                errors.clone(),
                hist.clone(),
                sec_hist.clone(),
            );
            let (hot_t, set_t) = (
                (a.hot_pct / 100.0 * 65536.0) as u64,
                (a.set_pct / 100.0 * 65536.0) as u64,
            );
            let seed = a.seed.wrapping_mul(31).wrapping_add(c as u64);
            std::thread::spawn(move || {
                let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut buf = vec![0u8; store.vb as usize];
                let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("hist");
                let mut n = 0u64;
                while !done.load(Ordering::Relaxed) {
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
                    let key = if (r >> 48) < hot_t {
                        ((r & 0xFFFF_FFFF) * hot_items) >> 32
                    } else {
                        ((r & 0xFFFF_FFFF) * store.items) >> 32
                    };
                    let set = ((r >> 32) & 0xFFFF) < set_t;
                    let s = slot_of(key, store.items);
                    let t = Instant::now();
                    {
                        let _g = store.lock(s);
                        // SAFETY: the slot's lock is held.
                        let v = unsafe { store.slot(s) };
                        if set {
                            let ver = u64::from_le_bytes(v[8..16].try_into().expect("8")) + 1;
                            write_value(v, key, ver);
                        } else {
                            buf.copy_from_slice(v);
                        }
                    }
                    if !set && !value_ok(&buf) {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    let us = (t.elapsed().as_nanos() as u64 / 1000).max(1);
                    local.saturating_record(us);
                    n += 1;
                    if n.is_multiple_of(256) {
                        ops.fetch_add(256, Ordering::Relaxed);
                        if measuring.load(Ordering::Relaxed) {
                            hist.lock().expect("hist").add(&local).expect("same bounds");
                        }
                        sec_hist
                            .lock()
                            .expect("hist")
                            .add(&local)
                            .expect("same bounds");
                        local.reset();
                    }
                }
            })
        })
        .collect();
    let mut tl = match &a.timeline {
        Some(p) => {
            let mut f = std::fs::File::create(p)?;
            writeln!(
                f,
                "t_s,phase,ops_per_s,p50_us,p90_us,p99_us,ops,slow_faults,sample_hits"
            )?;
            Some(f)
        }
        None => None,
    };
    let start = Instant::now();
    let total = a.warmup_s + a.measure_s;
    let mut last = (Instant::now(), 0u64);
    let mut m0 = None;
    let mut per_second = Vec::new();
    let mut sec = 0u32;
    // The in-process manager's counters (a static partition); 0 otherwise.
    let counters = || {
        managed.as_ref().map_or((0, 0), |(_, m, _, _)| {
            let s = m.stats();
            (s.slow_faults, s.sample_hits)
        })
    };
    let mut slow0 = 0;
    let mut stats0 = None;
    loop {
        sec += 1;
        let due = start + Duration::from_secs(1) * sec;
        let warm_end = start + Duration::from_secs_f64(a.warmup_s);
        if m0.is_none() && warm_end < due {
            std::thread::sleep(warm_end.saturating_duration_since(Instant::now()));
            measuring.store(true, Ordering::Relaxed);
            m0 = Some((Instant::now(), ops.load(Ordering::Relaxed)));
            slow0 = counters().0;
            stats0 = managed.as_ref().map(|(_, m, _, _)| m.stats());
        }
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let now = Instant::now();
        let n = ops.load(Ordering::Relaxed);
        let rate = (n - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
        let h = std::mem::replace(
            &mut *sec_hist.lock().expect("hist"),
            Histogram::new_with_bounds(1, 60_000_000, 3)?,
        );
        let phase = if m0.is_some() { "measure" } else { "warmup" };
        if m0.is_some() {
            per_second.push(rate);
        }
        if let Some(f) = tl.as_mut() {
            let (slow, hits) = counters();
            writeln!(
                f,
                "{:.3},{phase},{rate:.1},{},{},{},{n},{slow},{hits}",
                now.duration_since(start).as_secs_f64(),
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.9),
                h.value_at_quantile(0.99)
            )?;
        }
        last = (now, n);
        if now.duration_since(start).as_secs_f64() >= total {
            break;
        }
    }
    done.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    let (t_m, n_m) = m0.unwrap_or((start, 0));
    let measured = last.0.duration_since(t_m).as_secs_f64();
    let h = hist.lock().expect("hist");
    let mut summary = json!({
        "label": a.label, "manage": format!("{:?}", a.manage).to_lowercase(),
        "items": a.items, "value_bytes": a.value_bytes, "store_mib": bytes as f64 / (1u64 << 20) as f64,
        "hot_items_pct": a.hot_items_pct, "hot_pct": a.hot_pct, "clients": a.clients,
        "init_s": init_s, "measure_s": measured,
        "ops_per_s": (last.1 - n_m) as f64 / measured.max(1e-9),
        "p50_us": h.value_at_quantile(0.5), "p90_us": h.value_at_quantile(0.9),
        "p99_us": h.value_at_quantile(0.99), "p999_us": h.value_at_quantile(0.999),
        "errors": errors.load(Ordering::Relaxed), "per_second_ops": per_second,
        "fast_mib": a.fast_mib,
    });
    if managed.is_some() {
        // Slow-tier accesses of the measure phase, per request.
        let slow = counters().0 - slow0;
        summary["slow_faults_per_op"] = json!(slow as f64 / (last.1 - n_m).max(1) as f64);
    }
    if let Some((node, m, driver, first)) = managed {
        stop_mgr.store(true, Ordering::Release);
        let _ = driver.join();
        let s = m.stats();
        summary["manager"] = json!({"slow_faults": s.slow_faults, "evictions": s.evictions,
            "resident_pages": s.resident_pages, "sample_hits": s.sample_hits,
            "probation_pages": s.probation_pages, "probation_hits": s.probation_hits,
            "probation_evictions": s.probation_evictions, "refault_samples": s.refault_samples});
        if let Some(s0) = stats0 {
            // The measure phase's fault and eviction costs, as `memcolo tier status`
            // gives them for the agent's regions (kv.py's per-step comparison).
            let n = (s.slow_faults - s0.slow_faults).max(1) as f64;
            let secs = measured.max(1e-9);
            let ev = s.evictions - s0.evictions;
            summary["fault_steps_us"] = json!({
                "load": (s.slow_load_ns - s0.slow_load_ns) as f64 / n / 1e3,
                "map": (s.slow_map_ns - s0.slow_map_ns) as f64 / n / 1e3,
                "drop": (s.slow_drop_ns - s0.slow_drop_ns) as f64 / n / 1e3,
                "serve": (s.slow_fault_ns - s0.slow_fault_ns) as f64 / n / 1e3,
                "fault_thread_cpu": (s.fault_thread_cpu_ns - s0.fault_thread_cpu_ns) as f64 / n / 1e3,
                "fault_thread_wait": (s.fault_thread_wait_ns - s0.fault_thread_wait_ns) as f64 / n / 1e3,
                "evictions_per_s": ev as f64 / secs,
                "evict_cpu_per_eviction": (s.evict_threads_cpu_ns - s0.evict_threads_cpu_ns) as f64
                    / ev.max(1) as f64 / 1e3,
                "evict_wait_per_eviction": (s.evict_threads_wait_ns - s0.evict_threads_wait_ns) as f64
                    / ev.max(1) as f64 / 1e3,
                "fault_thread_cpu_share": (s.fault_thread_cpu_ns - s0.fault_thread_cpu_ns) as f64 / 1e9 / secs,
                "evict_threads_cpu_share": (s.evict_threads_cpu_ns - s0.evict_threads_cpu_ns) as f64 / 1e9 / secs,
            });
        }
        drop(node.detach(std::process::id() as i32, first));
        drop(node);
        if let Ok(m) = Arc::try_unwrap(m) {
            let _ = m.stop();
        }
    }
    println!("{summary}");
    drop(region);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_a_bijection_that_scatters_keys() {
        for items in [1u64, 2, 3, 1000, 32768, 40000] {
            let mut seen = vec![false; items as usize];
            for k in 0..items {
                let s = slot_of(k, items) as usize;
                assert!(!seen[s], "items {items}: slot {s} twice");
                seen[s] = true;
            }
        }
        // The first 15 % of the keys (a hot set) land all over the mapping: every
        // eighth of it holds some of them.
        let items = 32768u64;
        let mut eighths = [0u32; 8];
        for k in 0..items * 15 / 100 {
            eighths[(slot_of(k, items) * 8 / items) as usize] += 1;
        }
        assert!(eighths.iter().all(|&n| n > 400), "{eighths:?}");
    }

    #[test]
    fn values_carry_their_checksum() {
        let mut v = vec![0u8; 256];
        write_value(&mut v, 7, 3);
        assert!(value_ok(&v));
        v[100] ^= 1;
        assert!(!value_ok(&v));
    }
}
