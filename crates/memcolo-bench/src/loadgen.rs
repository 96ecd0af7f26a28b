//! Open-loop load generator for the LC service (Redis or memcached) with latency measured from the intended send
//! time (no coordinated omission).
//!
//! Request `i` is due at `start + i / rate` ([`schedule_offset`]), whether or not
//! earlier requests have been answered: a pacing thread (timer slack 1 ns, so
//! `nanosleep` wakes within microseconds) hands each request to the tokio runtime as
//! its own task at its due time, and the task records `completion - due` in an HDR
//! histogram (µs, 3 significant digits). A stalled server therefore shows up as the
//! full queueing delay its clients would see, as in Hermes §5.3's query latency.
//!
//! The mix: a fraction `set_ratio` of requests SET a *new* key with a fresh value, so
//! Redis allocates memory as the run goes (the insertions of Hermes §5.3); the rest GET
//! a uniformly random existing key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::dataset::{key_name, value_offset};
use crate::error::{BenchError, Result};
use crate::lc::LcConn;

/// Largest latency the histograms hold, in µs (60 s); longer ones are clamped.
pub const HIST_MAX_US: u64 = 60_000_000;

/// A latency histogram in µs.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("valid histogram bounds")
}

/// Offset of request `i` from the start of an open-loop schedule at `rate_per_s`.
pub fn schedule_offset(i: u64, rate_per_s: f64) -> Duration {
    Duration::from_nanos((i as f64 * 1e9 / rate_per_s).round() as u64)
}

/// Number of requests an open-loop schedule of `rate_per_s` sends in `duration`
/// (due times in `[0, duration)`).
pub fn request_count(rate_per_s: f64, duration: Duration) -> u64 {
    (rate_per_s * duration.as_secs_f64()).ceil() as u64
}

/// SplitMix64 (`rand_xoshiro`): a small, fast, seedable generator for keys and
/// operations (statistical quality is all that matters here).
#[derive(Clone, Debug)]
pub struct SplitMix64(rand_xoshiro::SplitMix64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        use rand_xoshiro::rand_core::SeedableRng;
        SplitMix64(rand_xoshiro::SplitMix64::seed_from_u64(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        use rand_xoshiro::rand_core::Rng;
        self.0.next_u64()
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[0, n)`; `n` > 0.
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// What one open-loop run does.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// Requests per second.
    pub rate_per_s: f64,
    /// Length of the schedule.
    pub duration: Duration,
    /// Fraction of requests that SET a new key; the rest are GETs.
    pub set_ratio: f64,
    /// Size of SET values in bytes.
    pub value_bytes: usize,
    /// A request not answered after this long counts as an error (its latency is
    /// still recorded).
    pub timeout: Duration,
    /// More requests than this outstanding: new ones are dropped and counted.
    pub max_in_flight: u64,
    /// Seed of key and operation choice.
    pub seed: u64,
}

/// The outcome of one open-loop run.
#[derive(Debug)]
pub struct LoadResult {
    /// Latency from due time to completion, µs, of every answered or timed-out request.
    pub hist_us: Histogram<u64>,
    /// The same, one histogram per second of the schedule (by due time), for
    /// latency timelines.
    pub per_sec_us: Vec<Histogram<u64>>,
    /// Requests due in the schedule.
    pub scheduled: u64,
    /// Answered without error.
    pub ok: u64,
    /// Failed or timed out.
    pub errors: u64,
    /// Not sent because `max_in_flight` requests were outstanding.
    pub dropped: u64,
    /// From the start of the schedule to the last completion.
    pub elapsed: Duration,
    /// The first error message seen, if any.
    pub first_error: Option<String>,
}

impl LoadResult {
    /// Answered requests per second over the run.
    pub fn throughput_rps(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.ok as f64 / s
        } else {
            0.0
        }
    }
}

#[derive(Default)]
struct Shared {
    ok: AtomicU64,
    errors: AtomicU64,
    in_flight: AtomicU64,
    last_done_ns: AtomicU64,
    first_error: Mutex<Option<String>>,
}

enum Op {
    Get(u64),
    Set(u64),
}

/// Runs one open-loop schedule against `conns` (round robin). `next_key` is the
/// number of keys that exist (`key:0 ..`); SETs create new keys from there and
/// advance it. Returns `Err(Interrupted)` on SIGINT/SIGTERM.
pub fn run_open_loop(
    rt: &tokio::runtime::Runtime,
    conns: &[LcConn],
    spec: &LoadSpec,
    next_key: &mut u64,
    pool: &Arc<Vec<u8>>,
) -> Result<LoadResult> {
    if conns.is_empty() || spec.rate_per_s <= 0.0 || *next_key == 0 {
        return Err(BenchError::Invalid(
            "load generator needs a connection, a positive rate and a preloaded key".into(),
        ));
    }
    let secs = spec.duration.as_secs() as usize + 1;
    let hist = Arc::new(Mutex::new((
        new_histogram(),
        (0..secs).map(|_| new_histogram()).collect::<Vec<_>>(),
    )));
    let shared = Arc::new(Shared::default());
    let n = request_count(spec.rate_per_s, spec.duration);
    let handle = rt.handle().clone();
    let start = Instant::now() + Duration::from_millis(5);
    let mut rng = SplitMix64::new(spec.seed);
    let mut dropped = 0u64;
    let mut interrupted = false;

    std::thread::scope(|s| {
        s.spawn(|| {
            // Precise wake-ups for the pacing thread only.
            // SAFETY: prctl(PR_SET_TIMERSLACK) affects the calling thread only.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
            for i in 0..n {
                if i % 64 == 0 && crate::signal::stop_requested() {
                    interrupted = true;
                    break;
                }
                let due = start + schedule_offset(i, spec.rate_per_s);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                if shared.in_flight.load(Ordering::Relaxed) >= spec.max_in_flight {
                    dropped += 1;
                    continue;
                }
                let op = if rng.next_f64() < spec.set_ratio {
                    let k = *next_key;
                    *next_key += 1;
                    Op::Set(k)
                } else {
                    Op::Get(rng.below(*next_key))
                };
                let mut con = conns[(i % conns.len() as u64) as usize].clone();
                let hist = hist.clone();
                let shared = shared.clone();
                let pool = pool.clone();
                let value_bytes = spec.value_bytes;
                let timeout = spec.timeout;
                shared.in_flight.fetch_add(1, Ordering::Relaxed);
                handle.spawn(async move {
                    let fut = async {
                        match op {
                            Op::Get(k) => con.get(&key_name(k)).await,
                            Op::Set(k) => {
                                let off = value_offset(k, pool.len(), value_bytes);
                                con.set(&key_name(k), &pool[off..off + value_bytes]).await
                            }
                        }
                    };
                    let res = tokio::time::timeout(timeout, fut).await;
                    let done = Instant::now();
                    let lat_us = done.saturating_duration_since(due).as_micros() as u64;
                    {
                        let mut h = hist.lock().expect("histogram lock");
                        let v = lat_us.clamp(1, HIST_MAX_US);
                        h.0.record(v).expect("value within bounds");
                        let sec = due.saturating_duration_since(start).as_secs() as usize;
                        let last = h.1.len() - 1;
                        h.1[sec.min(last)].record(v).expect("value within bounds");
                    }
                    let err = match res {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e),
                        Err(_) => Some(format!("no answer within {timeout:?}")),
                    };
                    match err {
                        None => {
                            shared.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(msg) => {
                            shared.errors.fetch_add(1, Ordering::Relaxed);
                            let mut f = shared.first_error.lock().expect("error lock");
                            if f.is_none() {
                                *f = Some(msg);
                            }
                        }
                    }
                    let since = done.saturating_duration_since(start).as_nanos() as u64;
                    shared.last_done_ns.fetch_max(since, Ordering::Relaxed);
                    shared.in_flight.fetch_sub(1, Ordering::Relaxed);
                });
            }
        });
    });

    // Let outstanding requests finish or time out.
    let drain_end = Instant::now() + spec.timeout + Duration::from_secs(1);
    while shared.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < drain_end {
        std::thread::sleep(Duration::from_millis(5));
    }
    if interrupted {
        return Err(BenchError::Interrupted);
    }
    let (hist_us, per_sec_us) = hist.lock().expect("histogram lock").clone();
    let first_error = shared.first_error.lock().expect("error lock").clone();
    Ok(LoadResult {
        hist_us,
        per_sec_us,
        scheduled: n,
        ok: shared.ok.load(Ordering::Relaxed),
        errors: shared.errors.load(Ordering::Relaxed) + shared.in_flight.load(Ordering::Relaxed),
        dropped,
        elapsed: Duration::from_nanos(shared.last_done_ns.load(Ordering::Relaxed)),
        first_error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_is_evenly_spaced_and_independent_of_answers() {
        assert_eq!(schedule_offset(0, 4000.0), Duration::ZERO);
        assert_eq!(schedule_offset(1, 4000.0), Duration::from_micros(250));
        assert_eq!(schedule_offset(4000, 4000.0), Duration::from_secs(1));
        // No accumulated drift after many requests at a rate that is not a divisor.
        assert_eq!(
            schedule_offset(3_000_000, 3000.0),
            Duration::from_secs(1000)
        );
        assert_eq!(schedule_offset(1, 3.0), Duration::from_nanos(333_333_333));
    }

    #[test]
    fn request_count_covers_duration() {
        assert_eq!(request_count(2000.0, Duration::from_secs(6)), 12_000);
        assert_eq!(request_count(2.5, Duration::from_secs(1)), 3);
        assert_eq!(request_count(1000.0, Duration::ZERO), 0);
        // The last due time lies inside the duration.
        let d = Duration::from_millis(1500);
        let n = request_count(333.0, d);
        assert!(schedule_offset(n - 1, 333.0) < d);
        assert!(schedule_offset(n, 333.0) >= d);
    }

    #[test]
    fn rng_bounds_and_values() {
        let mut r = SplitMix64::new(7);
        for _ in 0..10_000 {
            assert!(r.below(10) < 10);
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
    }
}
