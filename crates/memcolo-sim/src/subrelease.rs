//! libmemcolo's adaptive huge-page subrelease decisions (TCMalloc, Maas et al., ISMM'21
//! §3–4) as a Rust value: a safe wrapper over `alloc/src/subrelease.c`, the very file
//! the allocator links (compiled in by `build.rs`), so that the simulator's heaps
//! take the allocator's own decisions rather than a re-implementation.
//!
//! Units: pages of 4 KiB ([`PAGE_BYTES`]), times in milliseconds on any monotonic
//! origin above 0 (the first call that passes a time starts epoch 0 of the 1 s epoch
//! series there). Every call passes the heap's state: `used` pages (demand) and `free`
//! pages (free but mapped, i.e. backed). What the decisions remember:
//! - per 1 s epoch, the least and most used and free pages (§3.3);
//! - realized fragmentation: the least free pages over the last `T_schedule` (§3.2);
//! - the periodic release at `release_rate_bytes` per second, never below the peak
//!   demand of the last Δ = `skip_subrelease_s` (§4.1);
//! - the correctness of skipped releases: confirmed by demand coming back within Δ,
//!   else incorrect (§4.2).
//!
//! `alloc/test/vectors/subrelease.json` is replayed by `alloc/test/test_vectors.c` on
//! the C side and by this module's tests, so both sides are held to the same decisions.

use std::os::raw::c_void;

/// Bytes of a page, the unit of every page count here (`MC_SR_PAGE_SHIFT`).
pub const PAGE_BYTES: u64 = 4096;

/// Longest Δ or `T_schedule` honoured, seconds (`MC_SR_WINDOW_MAX`; longer ones are
/// capped).
pub const WINDOW_MAX_S: u64 = 900;

#[repr(C)]
#[derive(Default)]
struct RawStats {
    realized_fragmentation_pages: usize,
    skipped_pages: u64,
    correct_pages: u64,
    incorrect_pages: u64,
}

extern "C" {
    fn mc_sr_size() -> usize;
    fn mc_sr_init(sr: *mut c_void, skip_s: u64, t_schedule_s: u64, rate: u64);
    fn mc_sr_reset(sr: *mut c_void);
    fn mc_sr_advance(sr: *mut c_void, now_ms: u64, used: usize, free: usize);
    fn mc_sr_note(sr: *mut c_void, used: usize, free: usize);
    fn mc_sr_record(sr: *mut c_void, now_ms: u64, used: usize, free: usize);
    fn mc_sr_peak_used(sr: *mut c_void, now_ms: u64, used: usize, free: usize) -> usize;
    fn mc_sr_recent_peak_used(sr: *const c_void, used: usize) -> usize;
    fn mc_sr_release_budget(
        sr: *mut c_void,
        now_ms: u64,
        used: usize,
        free: usize,
        protect: usize,
        pages: *mut usize,
    ) -> bool;
    fn mc_sr_skipped(sr: *mut c_void, now_ms: u64, used: usize, free: usize, pages: usize);
    fn mc_sr_stats(sr: *mut c_void, now_ms: u64, used: usize, free: usize, out: *mut RawStats);
}

/// The settings of the decisions (libmemcolo's `MEMCOLO_SKIP_SUBRELEASE_S`,
/// `MEMCOLO_T_SCHEDULE_S`, `MEMCOLO_RELEASE_RATE`; [`Default`] is libmemcolo's
/// defaults: 60 s, 300 s, 1 MiB/s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Settings {
    /// Δ, seconds (0 = off: release at the rate whatever the recent demand).
    pub skip_subrelease_s: u64,
    /// Window of realized fragmentation, seconds (1..=900).
    pub t_schedule_s: u64,
    /// Periodic release rate, bytes per second (0 = no periodic release).
    pub release_rate_bytes: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            skip_subrelease_s: 60,
            t_schedule_s: 300,
            release_rate_bytes: 1 << 20,
        }
    }
}

/// What [`Subrelease::stats`] reports, pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Least free-but-mapped pages over the last `T_schedule` (ISMM'21 §3.2).
    pub realized_fragmentation_pages: u64,
    /// Releases skipped under the peak of Δ, pages, since the start.
    pub skipped_pages: u64,
    /// ... of which demand came back for within Δ (correct skips, §4.2).
    pub correct_pages: u64,
    /// ... of which it did not before they fell out of Δ (incorrect skips).
    pub incorrect_pages: u64,
}

/// One heap's subrelease decisions (an `mc_subrelease_t`, about 48 KiB, held as
/// opaque storage of the size the C side reports).
pub struct Subrelease {
    mem: Box<[u64]>,
    settings: Settings,
}

impl Subrelease {
    /// A fresh instance.
    pub fn new(settings: Settings) -> Subrelease {
        // SAFETY: mc_sr_size has no preconditions.
        let words = unsafe { mc_sr_size() }.div_ceil(8);
        let mut s = Subrelease {
            mem: vec![0u64; words].into_boxed_slice(),
            settings,
        };
        // SAFETY: mem holds mc_sr_size() bytes, aligned to 8 (the struct's alignment).
        unsafe {
            mc_sr_init(
                s.ptr(),
                settings.skip_subrelease_s,
                settings.t_schedule_s,
                settings.release_rate_bytes,
            )
        };
        s
    }

    fn ptr(&mut self) -> *mut c_void {
        self.mem.as_mut_ptr().cast()
    }

    /// The settings it was made with.
    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// Restarts the epoch series and zeroes the counters; the settings are kept.
    pub fn reset(&mut self) {
        // SAFETY: initialised storage (new).
        unsafe { mc_sr_reset(self.ptr()) }
    }

    /// Moves the epoch series to `now_ms` (`used`, `free`: the heap now).
    pub fn advance(&mut self, now_ms: u64, used: usize, free: usize) {
        // SAFETY: initialised storage.
        unsafe { mc_sr_advance(self.ptr(), now_ms, used, free) }
    }

    /// Notes the heap's state in the current epoch without advancing (after a change
    /// made at the last advance, e.g. the release [`Self::release_budget`] asked for).
    pub fn note(&mut self, used: usize, free: usize) {
        // SAFETY: initialised storage.
        unsafe { mc_sr_note(self.ptr(), used, free) }
    }

    /// A page heap change at `now_ms`: advance, then note.
    pub fn record(&mut self, now_ms: u64, used: usize, free: usize) {
        // SAFETY: initialised storage.
        unsafe { mc_sr_record(self.ptr(), now_ms, used, free) }
    }

    /// Peak used pages over the last Δ epochs, at least `used`.
    pub fn peak_used(&mut self, now_ms: u64, used: usize, free: usize) -> usize {
        // SAFETY: initialised storage.
        unsafe { mc_sr_peak_used(self.ptr(), now_ms, used, free) }
    }

    /// Peak used pages over this and the previous epoch, at least `used`.
    pub fn recent_peak_used(&self, used: usize) -> usize {
        // SAFETY: initialised storage, only read.
        unsafe { mc_sr_recent_peak_used(self.mem.as_ptr().cast(), used) }
    }

    /// The periodic release at `now_ms`: `None` when there was nothing to decide (no
    /// rate, or less than a page of budget), else the pages to release now (possibly
    /// 0: what Δ forbade is counted as skipped). The caller releases them and then
    /// calls [`Self::note`] with the heap's new state.
    pub fn release_budget(
        &mut self,
        now_ms: u64,
        used: usize,
        free: usize,
        protect_pages: usize,
    ) -> Option<usize> {
        let mut pages = 0usize;
        // SAFETY: initialised storage; pages is a valid out-pointer.
        let decided = unsafe {
            mc_sr_release_budget(self.ptr(), now_ms, used, free, protect_pages, &mut pages)
        };
        decided.then_some(pages)
    }

    /// A release of `pages` skipped outside the periodic release (tracked as §4.2).
    pub fn skipped(&mut self, now_ms: u64, used: usize, free: usize, pages: usize) {
        // SAFETY: initialised storage.
        unsafe { mc_sr_skipped(self.ptr(), now_ms, used, free, pages) }
    }

    /// Realized fragmentation and the skipped-release counters at `now_ms`.
    pub fn stats(&mut self, now_ms: u64, used: usize, free: usize) -> Stats {
        let mut r = RawStats::default();
        // SAFETY: initialised storage; r is a valid out-pointer of the C layout.
        unsafe { mc_sr_stats(self.ptr(), now_ms, used, free, &mut r) };
        Stats {
            realized_fragmentation_pages: r.realized_fragmentation_pages as u64,
            skipped_pages: r.skipped_pages,
            correct_pages: r.correct_pages,
            incorrect_pages: r.incorrect_pages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn u(v: &Value, k: &str) -> u64 {
        v[k].as_u64()
            .unwrap_or_else(|| panic!("{k} missing in {v}"))
    }

    /// Replays `alloc/test/vectors/subrelease.json`, as `alloc/test/test_vectors.c`
    /// does on the C side.
    #[test]
    fn shared_vectors() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../alloc/test/vectors/subrelease.json"
        );
        let f: Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect(path)).expect("valid JSON");
        let cases = f["cases"].as_array().expect("cases");
        assert!(!cases.is_empty());
        let mut checked = 0;
        for c in cases {
            let name = c["name"].as_str().expect("name");
            let st = &c["settings"];
            let mut sr = Subrelease::new(Settings {
                skip_subrelease_s: u(st, "skip_subrelease_s"),
                t_schedule_s: u(st, "t_schedule_s"),
                release_rate_bytes: u(st, "release_rate_bytes"),
            });
            for (i, s) in c["steps"].as_array().expect("steps").iter().enumerate() {
                let now = s["now_ms"].as_u64().unwrap_or(0);
                let used = s["used"].as_u64().unwrap_or(0) as usize;
                let free = s["free"].as_u64().unwrap_or(0) as usize;
                let want = &s["expect"];
                let at = format!("{name} step {i}");
                match s["op"].as_str().expect("op") {
                    "record" => sr.record(now, used, free),
                    "note" => sr.note(used, free),
                    "skipped" => sr.skipped(now, used, free, u(s, "pages") as usize),
                    "peak" => {
                        assert_eq!(sr.peak_used(now, used, free) as u64, u(s, "expect"), "{at}");
                        checked += 1;
                    }
                    "recent_peak" => {
                        assert_eq!(sr.recent_peak_used(used) as u64, u(s, "expect"), "{at}");
                        checked += 1;
                    }
                    "budget" => {
                        let got = sr.release_budget(now, used, free, u(s, "protect") as usize);
                        assert_eq!(got.is_some(), want["decided"].as_bool().unwrap(), "{at}");
                        assert_eq!(got.unwrap_or(0) as u64, u(want, "pages"), "{at}");
                        checked += 1;
                    }
                    "stats" => {
                        let got = sr.stats(now, used, free);
                        for (k, g) in [
                            (
                                "realized_fragmentation_pages",
                                got.realized_fragmentation_pages,
                            ),
                            ("skipped_pages", got.skipped_pages),
                            ("correct_pages", got.correct_pages),
                            ("incorrect_pages", got.incorrect_pages),
                        ] {
                            if let Some(w) = want[k].as_u64() {
                                assert_eq!(g, w, "{at}: {k}");
                                checked += 1;
                            }
                        }
                    }
                    op => panic!("{at}: unknown op {op}"),
                }
            }
        }
        assert!(checked > 20, "only {checked} expectations checked");
    }

    #[test]
    fn instances_are_independent() {
        let mut a = Subrelease::new(Settings::default());
        let mut b = Subrelease::new(Settings {
            skip_subrelease_s: 0,
            ..Settings::default()
        });
        for s in [&mut a, &mut b] {
            s.record(1000, 1000, 0);
            s.record(1500, 200, 800);
        }
        // Δ = 60 s keeps the 800 free pages under the peak of 1000; Δ = 0 releases the
        // 1 MiB/s budget of the 2 s since the start.
        assert_eq!(a.release_budget(3000, 200, 800, 0), Some(0));
        assert_eq!(b.release_budget(3000, 200, 800, 0), Some(512));
        assert_eq!(a.stats(3000, 200, 800).skipped_pages, 512);
        assert_eq!(b.stats(3000, 200, 800).skipped_pages, 0);
        a.reset();
        assert_eq!(a.stats(4000, 0, 0), Stats::default());
    }
}
