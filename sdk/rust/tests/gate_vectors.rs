//! The shared allow-rate gate test vectors (`sdk/testvectors/gate.json`): sequences of
//! signals, handler completions, rate queries and allocations on a synthetic clock, with
//! the rate, epoch and decisions the gate of M3 §4.2 (docs/protocol.md §9.3) gives.
//!
//! The expected values are those of this SDK's [`AllowRateGate`], the reference; every
//! other gate (the Go, Python, Java and C SDKs and libmemcolo's `alloc/src/agent.c`)
//! replays the same file in its tests. This test fails when the file no longer matches
//! the reference; regenerate it with
//! `MEMCOLO_REGEN_VECTORS=1 cargo test -p memcolo-sdk --test gate_vectors`.

use memcolo_sdk::AllowRateGate;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// One step of a case; times are nanoseconds on the case's clock (from 0).
enum Step {
    /// A notification of `level` arrives (`low` does not feed the gate, §9.3).
    Signal(u64, &'static str),
    /// The handlers of that notification return.
    Handled(u64, &'static str),
    /// Query the allow rate.
    Rate(u64),
    /// `n` allocations in a row.
    Admit(u64, usize),
    /// Query the epoch.
    Epoch,
}
use Step::*;

struct Case {
    name: &'static str,
    comment: &'static str,
    num_epochs: u32,
    min_epoch_ns: u64,
    steps: Vec<Step>,
}

fn case(
    name: &'static str,
    comment: &'static str,
    num_epochs: u32,
    min_epoch_ns: u64,
    steps: Vec<Step>,
) -> Case {
    Case {
        name,
        comment,
        num_epochs,
        min_epoch_ns,
        steps,
    }
}

fn cases() -> Vec<Case> {
    vec![
        case(
            "no_signal",
            "no high signal yet: full rate, every allocation proceeds",
            5,
            S,
            vec![Rate(0), Admit(0, 4), Rate(1000 * S), Epoch],
        ),
        case(
            "low_does_not_feed_the_gate",
            "low notifications leave the gate as it is",
            5,
            S,
            vec![
                Signal(S, "low"),
                Handled(2 * S, "low"),
                Rate(S),
                Admit(S, 3),
                Epoch,
            ],
        ),
        case(
            "first_signal_not_yet_handled",
            "from the receipt of the first high signal until its handlers return there is no epoch: rate 0, every allocation evicts first",
            5,
            S,
            vec![
                Signal(S, "high"),
                Rate(S),
                Rate(3 * S),
                Rate(1_000_000 * S),
                Admit(3 * S, 5),
                Epoch,
            ],
        ),
        case(
            "linear_recovery",
            "epoch 2 s (handled 2 s after receipt), NUM_epochs 5: the rate climbs linearly from 0 to 1 over 10 s; r = 0.25 admits every 4th allocation, r = 0.1 every 10th",
            5,
            S,
            vec![
                Signal(0, "high"),
                Handled(2 * S, "high"),
                Epoch,
                Rate(0),
                Rate(S),
                Rate(2500 * MS),
                Rate(5 * S),
                Rate(10 * S - 1),
                Rate(10 * S),
                Rate(11 * S),
                Admit(2500 * MS, 8),
                Admit(S, 10),
                Admit(10 * S, 3),
            ],
        ),
        case(
            "top_feeds_the_gate_like_high",
            "a top notification resets the gate as high does",
            1,
            S,
            vec![
                Signal(0, "top"),
                Rate(500 * MS),
                Handled(3 * S, "top"),
                Epoch,
                Rate(1500 * MS),
                Admit(1500 * MS, 4),
            ],
        ),
        case(
            "fast_handler_held_to_min_epoch",
            "handled in 10 ms, minimum epoch 1 s, NUM_epochs 1: the rate climbs over one second, not 10 ms; r = 0.2 admits every 5th",
            1,
            S,
            vec![
                Signal(0, "high"),
                Handled(10 * MS, "high"),
                Epoch,
                Rate(10 * MS),
                Rate(200 * MS),
                Admit(200 * MS, 5),
                Rate(S),
                Admit(S, 2),
            ],
        ),
        case(
            "slow_handler_is_the_epoch",
            "handled in 3 s with a minimum epoch of 1 s: the epoch is the handling time",
            5,
            S,
            vec![Signal(0, "high"), Handled(3 * S, "high"), Epoch, Rate(3 * S)],
        ),
        case(
            "zero_min_epoch_is_the_paper_to_the_letter",
            "minimum epoch 0 (M3 §4.2 alone): a signal handled in the instant it arrived leaves an empty window, full rate",
            5,
            0,
            vec![
                Signal(S, "high"),
                Handled(S, "high"),
                Epoch,
                Rate(S),
                Admit(S, 3),
            ],
        ),
        case(
            "zero_min_epoch_fast_handler",
            "minimum epoch 0, handled in 10 ms, NUM_epochs 1: full rate 10 ms after the signal",
            1,
            0,
            vec![
                Signal(0, "high"),
                Handled(10 * MS, "high"),
                Epoch,
                Rate(5 * MS),
                Admit(5 * MS, 2),
                Rate(10 * MS),
            ],
        ),
        case(
            "repeated_signals",
            "a second high signal drops the rate to 0 at its receipt and restarts the count; until its handlers return the rate climbs with the previous epoch, then with the new one",
            1,
            S,
            vec![
                Signal(0, "high"),
                Handled(2 * S, "high"),
                Rate(S),
                Admit(S, 1),
                Signal(S + 500 * MS, "high"),
                Rate(S + 500 * MS),
                Admit(S + 500 * MS, 3),
                Rate(2 * S),
                Admit(2 * S, 4),
                Handled(5 * S + 500 * MS, "high"),
                Epoch,
                Rate(2 * S + 500 * MS),
                Rate(6 * S + 500 * MS),
                Signal(7 * S, "top"),
                Signal(7 * S + 100 * MS, "high"),
                Rate(7 * S + 100 * MS),
                Rate(7 * S + 1100 * MS),
            ],
        ),
        case(
            "count_carries_over_rate_changes",
            "allocations counted at one rate count towards the next admission at a higher rate",
            1,
            S,
            vec![
                Signal(0, "high"),
                Handled(4 * S, "high"),
                Admit(S, 2),
                Admit(2 * S, 1),
                Admit(2 * S, 2),
            ],
        ),
        case(
            "clock_not_advancing",
            "a second signal with a known epoch: allocations at the very instant of the signal evict first however many there are",
            5,
            S,
            vec![
                Signal(0, "high"),
                Handled(S, "high"),
                Signal(20 * S, "high"),
                Rate(20 * S),
                Admit(20 * S, 6),
                Rate(20 * S),
                Rate(20 * S + 1),
            ],
        ),
        case(
            "clock_going_back",
            "times before the signal count as no time elapsed; a handler that returns before its signal's receipt gets the minimum epoch",
            5,
            S,
            vec![
                Signal(10 * S, "high"),
                Handled(9 * S, "high"),
                Epoch,
                Rate(5 * S),
                Admit(5 * S, 2),
                Rate(12 * S + 500 * MS),
            ],
        ),
        case(
            "exact_floor_of_one_over_r",
            "r = 0.2 reached from times that are not multiples of r in binary floating point: ⌊1/r⌋ = 5 exactly (window_ns / elapsed_ns in integers)",
            1,
            S,
            vec![
                Signal(600 * MS, "high"),
                Handled(610 * MS, "high"),
                Rate(800 * MS),
                Admit(800 * MS, 5),
                Signal(2 * S + 100 * MS, "high"),
                Handled(2 * S + 300 * MS, "high"),
                Rate(2 * S + 400 * MS),
                Admit(2 * S + 400 * MS, 10),
                Rate(2 * S + 433_333_333),
                Admit(2 * S + 433_333_333, 8),
            ],
        ),
        case(
            "huge_gaps",
            "a handler that took a day and queries days apart: exact rates and decisions with nanosecond counts near 2^50",
            5,
            S,
            vec![
                Signal(0, "high"),
                Handled(86_400 * S, "high"),
                Epoch,
                Rate(86_400 * S + 1),
                Admit(1, 2),
                Rate(432_000 * S - 1),
                Rate(432_000 * S),
                Rate(1_000_000 * S),
                Admit(1_000_000 * S, 2),
            ],
        ),
        case(
            "handled_without_signal",
            "handlers returning with no signal received are ignored",
            5,
            S,
            vec![Handled(S, "high"), Epoch, Rate(S), Admit(S, 2)],
        ),
        case(
            "handled_twice",
            "a second completion of the same signal sets the epoch again, from that signal's receipt",
            1,
            S,
            vec![
                Signal(0, "high"),
                Handled(2 * S, "high"),
                Handled(3 * S, "high"),
                Epoch,
                Rate(1500 * MS),
            ],
        ),
    ]
}

/// Runs the cases through the reference gate and returns the file's content.
fn generate() -> Value {
    let base = Instant::now();
    let at = |t: u64| base + Duration::from_nanos(t);
    let feeds = |level: &str| level != "low";
    let mut out = Vec::new();
    for c in cases() {
        let g = AllowRateGate::with_min_epoch(c.num_epochs, Duration::from_nanos(c.min_epoch_ns));
        let mut steps = Vec::new();
        for step in &c.steps {
            steps.push(match *step {
                Signal(t, level) => {
                    if feeds(level) {
                        g.signal_received(at(t));
                    }
                    json!({"op": "signal", "t_ns": t, "level": level})
                }
                Handled(t, level) => {
                    if feeds(level) {
                        g.signal_handled(at(t));
                    }
                    json!({"op": "handled", "t_ns": t, "level": level})
                }
                Rate(t) => json!({"op": "rate", "t_ns": t, "rate": g.allow_rate_at(at(t))}),
                Admit(t, n) => {
                    let admitted: Vec<bool> = (0..n).map(|_| g.admit_at(at(t))).collect();
                    json!({"op": "admit", "t_ns": t, "admitted": admitted})
                }
                Epoch => {
                    let e = g.epoch().map(|d| d.as_nanos() as u64);
                    json!({"op": "epoch", "epoch_ns": e})
                }
            });
        }
        out.push(json!({
            "name": c.name,
            "comment": c.comment,
            "num_epochs": c.num_epochs,
            "min_epoch_ns": c.min_epoch_ns,
            "steps": steps,
        }));
    }
    json!({
        "comment": [
            "The allow-rate gate of M3 §4.2 (docs/protocol.md §9.3, §10), generated from sdk/rust/src/gate.rs by sdk/rust/tests/gate_vectors.rs.",
            "Each case: a fresh gate with num_epochs (NUM_epochs) and min_epoch_ns (the minimum epoch), then its steps in order on a synthetic clock (t_ns: nanoseconds from any origin).",
            "signal: a notification of `level` arrives at t_ns (high and top call the gate's signal-received; low does nothing). handled: its handlers return at t_ns (high and top: signal-handled).",
            "rate: the allow rate at t_ns is `rate` (compare within 1e-12). admit: one allocation per entry of `admitted`, all at t_ns; each entry is the gate's decision (true: proceeds at once, false: evicts first).",
            "epoch: the gate's epoch is epoch_ns (null: no signal handled yet).",
            "Rule: r = min(elapsed_ns / (epoch_ns * num_epochs), 1); an allocation proceeds when r >= 1, or when r > 0 and it is the floor(window_ns / elapsed_ns)-th since the last one that proceeded or the last signal, counted in integers."
        ],
        "cases": out,
    })
}

#[test]
fn gate_vectors_match_the_reference() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testvectors/gate.json");
    let text = serde_json::to_string_pretty(&generate()).unwrap() + "\n";
    if std::env::var_os("MEMCOLO_REGEN_VECTORS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with MEMCOLO_REGEN_VECTORS=1)",
            path.display()
        )
    });
    assert!(
        on_disk == text,
        "{} is stale: regenerate with MEMCOLO_REGEN_VECTORS=1 cargo test -p memcolo-sdk --test gate_vectors",
        path.display()
    );
}
