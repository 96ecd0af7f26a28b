//! The adaptive allocation protocol of M3 §4.2: after a high-pressure signal, only
//! every ⌊1/r⌋-th allocation proceeds at once; the others first run the application's
//! eviction callback, so the application replaces data instead of growing. An
//! allocation is never failed, only made to evict first.
//!
//! ```text
//! r = min(time since the last high signal / (epoch × NUM_epochs), 1)
//! epoch = time the application took to handle that signal (receipt -> memory returned)
//! ```
//!
//! Before the first high signal is handled there is no epoch yet: from the receipt of
//! that signal until its handler returns, r = 0 (every allocation evicts first). A later
//! signal drops r to 0 at its receipt and r climbs with the previous epoch until its
//! handlers return.
//!
//! **Exact decisions.** Times are whole nanoseconds; ⌊1/r⌋ is computed as
//! ⌊window_ns / elapsed_ns⌋ in integers (window = epoch × NUM_epochs), not from a
//! floating-point r, so that r = 0.2 admits every 5th allocation whatever the clock
//! readings were. Every gate of the project (the SDKs and libmemcolo) replays the shared
//! vectors in `sdk/testvectors/gate.json`, generated from this one by
//! `sdk/rust/tests/gate_vectors.rs`.
//!
//! **Minimum epoch.** The epoch is at least [`DEFAULT_MIN_EPOCH`] (1 s; see
//! [`AllowRateGate::with_min_epoch`]). M3 ends the epoch "when memory has been
//! returned", and memory counts as returned for the node when the monitor sees it:
//! M3's monitor polls once a second (§6), as `memcolo agent` does by default. A
//! handler that returns in a few milliseconds (dropping cache blocks, unmapping
//! slabs) would otherwise reopen the gate before the next poll has even seen the
//! node leave the red zone, and the application would regrow at once: in bench/m3
//! the JVM job's epochs of ~11 ms and the Go cache's of ~15 ms put r back at 100 %
//! within one agent poll, and identical jobs shrank and regrew hundreds of times.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// M3 used NUM_epochs = 5 for Go-Cache and Memcached and 1 for Spark (M3 §4.2).
pub const DEFAULT_NUM_EPOCHS: u32 = 5;

/// The shortest epoch a gate uses: one poll of M3's monitor (§6) and of
/// `memcolo agent` with its default `poll_ms`. See the module docs.
pub const DEFAULT_MIN_EPOCH: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct GateState {
    last_signal: Option<Instant>,
    epoch: Option<Duration>,
    count: u64,
}

/// The allow-rate gate (M3 §4.2). Thread-safe; share it with `Arc`.
///
/// The [`crate::Client`] feeds it: [`AllowRateGate::signal_received`] when a `high` or
/// `top` notification arrives and [`AllowRateGate::signal_handled`] when its handlers
/// return. The application calls [`AllowRateGate::before_alloc`] (or
/// [`AllowRateGate::admit`]) in its allocation path.
#[derive(Debug)]
pub struct AllowRateGate {
    num_epochs: u32,
    min_epoch: Duration,
    state: Mutex<GateState>,
}

impl Default for AllowRateGate {
    fn default() -> Self {
        Self::new(DEFAULT_NUM_EPOCHS)
    }
}

impl AllowRateGate {
    /// A gate that reaches 100 % after `num_epochs` epochs (at least 1), with epochs
    /// of at least [`DEFAULT_MIN_EPOCH`].
    pub fn new(num_epochs: u32) -> Self {
        Self::with_min_epoch(num_epochs, DEFAULT_MIN_EPOCH)
    }

    /// A gate that reaches 100 % after `num_epochs` epochs (at least 1), where an
    /// epoch is the handling time of the last high signal but at least `min_epoch`
    /// (`Duration::ZERO`: the handling time alone, M3 §4.2 to the letter).
    pub fn with_min_epoch(num_epochs: u32, min_epoch: Duration) -> Self {
        AllowRateGate {
            num_epochs: num_epochs.max(1),
            min_epoch,
            state: Mutex::new(GateState::default()),
        }
    }

    /// The shortest epoch this gate uses.
    pub fn min_epoch(&self) -> Duration {
        self.min_epoch
    }

    /// NUM_epochs of this gate.
    pub fn num_epochs(&self) -> u32 {
        self.num_epochs
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A high signal arrived at `at`: the rate drops to 0 and climbs from there.
    pub fn signal_received(&self, at: Instant) {
        let mut s = self.lock();
        s.last_signal = Some(at);
        s.count = 0;
    }

    /// The handlers of the signal received last finished at `at`: the epoch is the
    /// time between receipt and `at`, but at least [`AllowRateGate::min_epoch`].
    pub fn signal_handled(&self, at: Instant) {
        let mut s = self.lock();
        if let Some(t) = s.last_signal {
            s.epoch = Some(at.saturating_duration_since(t).max(self.min_epoch));
        }
    }

    /// The epoch of the last handled signal (at least the minimum epoch), if any.
    pub fn epoch(&self) -> Option<Duration> {
        self.lock().epoch
    }

    /// The allow rate r in [0, 1] at `now`.
    pub fn allow_rate_at(&self, now: Instant) -> f64 {
        let s = self.lock();
        Self::rate(&s, self.num_epochs, now)
    }

    /// The allow rate r in [0, 1] now.
    pub fn allow_rate(&self) -> f64 {
        self.allow_rate_at(Instant::now())
    }

    /// Elapsed time since the last signal and the window (epoch × NUM_epochs), both in
    /// nanoseconds, or `None` while no signal has been handled yet; `Some((_, 0))` for
    /// no signal at all or an empty window (full rate).
    fn elapsed_and_window(s: &GateState, num_epochs: u32, now: Instant) -> Option<(u128, u128)> {
        let Some(t) = s.last_signal else {
            return Some((0, 0));
        };
        let epoch = s.epoch?;
        let window = epoch.as_nanos() * u128::from(num_epochs);
        Some((now.saturating_duration_since(t).as_nanos(), window))
    }

    fn rate(s: &GateState, num_epochs: u32, now: Instant) -> f64 {
        match Self::elapsed_and_window(s, num_epochs, now) {
            None => 0.0,
            Some((elapsed, window)) if elapsed >= window => 1.0,
            Some((elapsed, window)) => elapsed as f64 / window as f64,
        }
    }

    /// Whether an allocation at `now` may proceed at once (`true`) or must first evict
    /// (`false`): only the ⌊1/r⌋-th allocation proceeds; r is recomputed on every call.
    /// ⌊1/r⌋ is computed exactly, as ⌊window_ns / elapsed_ns⌋ in integers, so that every
    /// implementation takes the same decisions (`sdk/testvectors/gate.json`).
    pub fn admit_at(&self, now: Instant) -> bool {
        let mut s = self.lock();
        // No epoch yet: no time counts as elapsed in a non-empty window (r = 0).
        let (elapsed, window) =
            Self::elapsed_and_window(&s, self.num_epochs, now).unwrap_or((0, 1));
        if elapsed >= window {
            s.count = 0;
            return true;
        }
        s.count += 1;
        if elapsed == 0 {
            return false;
        }
        if u128::from(s.count) >= window / elapsed {
            s.count = 0;
            true
        } else {
            false
        }
    }

    /// [`AllowRateGate::admit_at`] now.
    pub fn admit(&self) -> bool {
        self.admit_at(Instant::now())
    }

    /// Call in the allocation path: runs `evict` (which should free about as much as
    /// the allocation needs) unless this allocation is admitted. Returns whether
    /// eviction ran. Never fails the allocation.
    pub fn before_alloc<F: FnOnce()>(&self, evict: F) -> bool {
        if self.admit() {
            false
        } else {
            evict();
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_rate_without_signals() {
        let g = AllowRateGate::new(5);
        let t = Instant::now();
        assert_eq!(g.allow_rate_at(t), 1.0);
        assert!((0..100).all(|_| g.admit_at(t)));
    }

    #[test]
    fn rate_is_zero_while_first_signal_is_handled() {
        let g = AllowRateGate::new(5);
        let t = Instant::now();
        g.signal_received(t);
        assert_eq!(g.allow_rate_at(t + Duration::from_secs(3)), 0.0);
        assert!(!g.admit_at(t + Duration::from_secs(3)));
    }

    #[test]
    fn rate_grows_linearly_over_num_epochs() {
        let g = AllowRateGate::new(5);
        let t = Instant::now();
        g.signal_received(t);
        g.signal_handled(t + Duration::from_secs(2)); // epoch 2 s, window 10 s
        let r = g.allow_rate_at(t + Duration::from_secs(1));
        assert!((r - 0.1).abs() < 1e-9, "{r}");
        let r = g.allow_rate_at(t + Duration::from_secs(5));
        assert!((r - 0.5).abs() < 1e-9, "{r}");
        assert_eq!(g.allow_rate_at(t + Duration::from_secs(11)), 1.0);
    }

    #[test]
    fn only_every_floor_one_over_r_th_allocation_proceeds() {
        let g = AllowRateGate::new(1);
        let t = Instant::now();
        g.signal_received(t);
        g.signal_handled(t + Duration::from_secs(10));
        // r = 2.5 / 10 = 0.25 -> every 4th allocation.
        let now = t + Duration::from_millis(2500);
        let admitted: Vec<bool> = (0..8).map(|_| g.admit_at(now)).collect();
        assert_eq!(
            admitted,
            [false, false, false, true, false, false, false, true]
        );
        // r = 0.3 -> floor(3.33) = every 3rd.
        let now = t + Duration::from_secs(3);
        let admitted: Vec<bool> = (0..6).map(|_| g.admit_at(now)).collect();
        assert_eq!(admitted, [false, false, true, false, false, true]);
    }

    #[test]
    fn new_signal_resets_rate() {
        let g = AllowRateGate::new(1);
        let t = Instant::now();
        g.signal_received(t);
        g.signal_handled(t + Duration::from_secs(1));
        assert_eq!(g.allow_rate_at(t + Duration::from_secs(5)), 1.0);
        let t2 = t + Duration::from_secs(5);
        g.signal_received(t2);
        assert_eq!(g.allow_rate_at(t2), 0.0);
        // Now is before t2, so no time has elapsed since the signal: evict first.
        let mut evicted = 0;
        assert!(g.before_alloc(|| evicted += 1));
        assert_eq!(evicted, 1);
    }

    #[test]
    fn fast_handler_is_held_to_the_minimum_epoch() {
        // A handler done in 10 ms, NUM_epochs 1: without a floor r would be 100 %
        // 10 ms after the signal; with the 1 s floor it climbs over one second.
        let g = AllowRateGate::new(1);
        let t = Instant::now();
        g.signal_received(t);
        g.signal_handled(t + Duration::from_millis(10));
        assert_eq!(g.epoch(), Some(Duration::from_secs(1)));
        let r = g.allow_rate_at(t + Duration::from_millis(200));
        assert!((r - 0.2).abs() < 1e-9, "{r}");
        // r = 0.2 at the next poll of an agent polling every 200 ms: every 5th.
        let admitted: Vec<bool> = (0..5)
            .map(|_| g.admit_at(t + Duration::from_millis(200)))
            .collect();
        assert_eq!(admitted, [false, false, false, false, true]);
        assert_eq!(g.allow_rate_at(t + Duration::from_secs(1)), 1.0);
        // Longer handling than the floor is the epoch itself.
        g.signal_received(t + Duration::from_secs(2));
        g.signal_handled(t + Duration::from_secs(5));
        assert_eq!(g.epoch(), Some(Duration::from_secs(3)));
    }

    #[test]
    fn zero_floor_is_the_paper_to_the_letter() {
        let g = AllowRateGate::with_min_epoch(5, Duration::ZERO);
        let t = Instant::now();
        g.signal_received(t);
        g.signal_handled(t);
        assert_eq!(g.allow_rate_at(t), 1.0);
        let g = AllowRateGate::with_min_epoch(1, Duration::ZERO);
        g.signal_received(t);
        g.signal_handled(t + Duration::from_millis(10));
        assert_eq!(g.allow_rate_at(t + Duration::from_millis(10)), 1.0);
    }
}
