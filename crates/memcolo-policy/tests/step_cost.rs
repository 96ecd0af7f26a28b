//! Cost of one M3 poll and one Hermes plan for large process and file tables, as the
//! simulator drives them (M3 §5: one poll per second per node). Ignored by default;
//! it prints figures and asserts nothing about speed:
//!
//! `cargo test --release -p memcolo-policy --test step_cost -- --ignored --nocapture`

use memcolo_policy::hermes::{plan_advice, AdviceConfig, FileCache};
use memcolo_policy::m3::{M3Config, Monitor, ProcView, SortOrder};
use memcolo_policy::Class;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

fn procs(n: usize) -> Vec<ProcView> {
    (0..n)
        .map(|i| ProcView {
            pid: 1000 + i as i32,
            class: [Class::Lc, Class::Be, Class::Elastic][i % 3],
            started_at: Duration::from_secs((i as u64 * 7919) % 10_000),
            rss_bytes: ((i as u64 * 104_729) % 64) * (GIB / 16),
            notifiable: i % 5 != 0,
            expected_reclaim_bytes: Some(((i as u64 * 31) % 17) * (GIB / 64)),
        })
        .collect()
}

#[test]
#[ignore = "prints timings; run with --ignored --nocapture"]
fn m3_step_and_hermes_plan_cost() {
    let top = 1024 * GIB;
    for order in [SortOrder::NewestFirst, SortOrder::LargestExpectedReclaim] {
        for n in [10, 100, 1000] {
            let table = procs(n);
            let mut m = Monitor::new(M3Config {
                sort_order: order,
                ..M3Config::with_top(top)
            });
            let polls = 20_000 / n.max(1) as u64 * 10;
            let start = Instant::now();
            let mut actions = 0usize;
            for t in 0..polls {
                // Usage cycles through every zone, 60 % .. 110 % of top.
                let used = top / 100 * (60 + (t % 51));
                actions += m.step(Duration::from_secs(t), used, &table).len();
            }
            let per_poll = start.elapsed() / polls as u32;
            println!(
                "m3 step  order={order:<24} procs={n:>5}  {per_poll:>10.2?} per poll  \
                 ({polls} polls, {actions} actions)"
            );
        }
    }
    for n in [100, 10_000] {
        let files: Vec<FileCache> = (0..n)
            .map(|i| FileCache {
                dev: 2049,
                ino: i as u64,
                path: format!("/data/part-{i:05}"),
                resident_bytes: (i as u64 * 7_368_787) % (8 * GIB),
                held_by_lc: i % 11 == 0,
            })
            .collect();
        let cfg = AdviceConfig::with_adv_thr(900 * GIB);
        let rounds = 200;
        let start = Instant::now();
        let mut advised = 0usize;
        for _ in 0..rounds {
            advised += plan_advice(&cfg, top, &files).len();
        }
        println!(
            "hermes plan files={n:>6}  {:>10.2?} per plan  ({} files advised per plan)",
            start.elapsed() / rounds,
            advised / rounds as usize
        );
    }
}
