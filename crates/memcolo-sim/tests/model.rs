//! The node model's invariants and its wiring to the policy code: conservation of
//! memory, determinism for a seed, M3 signalling elastic processes that then shrink,
//! kills only above the top of memory and only of batch processes.

use memcolo_sim::node::{Mode, Node, NodeConfig, ProcSpec, Workload};
use memcolo_sim::scenario::{colocation_procs, elastic_procs};
use memcolo_sim::Calibration;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn cfg(total: u64, swap: u64, mode: Mode, seed: u64) -> NodeConfig {
    NodeConfig {
        total_bytes: total,
        swap_bytes: swap,
        step: Duration::from_millis(100),
        seed,
        mode,
        calib: Calibration::default(),
        poll: Duration::from_secs(1),
        slo_us: 10_000.0,
        reclaim_workers: 1,
        measure_from: Duration::ZERO,
        lc_samples_per_step: memcolo_sim::node::LC_SAMPLES_PER_STEP,
    }
}

#[test]
fn memory_never_exceeds_ram_and_swap() {
    for mode in [Mode::Kernel, Mode::Memcolo] {
        for level in [0, 100, 150, 500] {
            let total = 2048 * MIB;
            let mut node = Node::new(
                cfg(total, total / 2, mode, 7),
                colocation_procs(total, level, mode == Mode::Kernel),
            )
            .unwrap();
            while node.now() < Duration::from_secs(40) {
                node.step();
                node.check()
                    .unwrap_or_else(|e| panic!("{mode:?} level {level} at {:?}: {e}", node.now()));
            }
            let s = node.finish();
            // Level 500 asks for more than RAM + swap: someone must have been killed.
            if level == 500 {
                assert!(s.oom_kills + s.m3_kills > 0, "{mode:?}: {s:?}");
            }
        }
    }
}

#[test]
fn same_seed_same_run() {
    let run = |seed| {
        let total = 2048 * MIB;
        let mut node = Node::new(
            cfg(total, total / 2, Mode::Kernel, seed),
            colocation_procs(total, 150, true),
        )
        .unwrap();
        node.run(Duration::from_secs(20));
        serde_json::to_string(&node.finish()).unwrap()
    };
    assert_eq!(run(3), run(3));
}

#[test]
fn m3_signals_elastic_jobs_and_they_shrink() {
    let total = 8192 * MIB;
    let mut node = Node::new(
        cfg(total, total / 2, Mode::Memcolo, 1),
        elastic_procs(total, false, 30.0),
    )
    .unwrap();
    // Until the third job has started and pressure built up.
    let mut shrank = false;
    let mut last = 0;
    let mut highs_before = 0;
    while node.now() < Duration::from_secs(120) {
        node.step();
        let rss = node.rss_of("elastic-0");
        let highs = node.proc_stats("elastic-0").unwrap().notifications[1]
            + node.proc_stats("elastic-0").unwrap().notifications[2];
        if highs > highs_before && rss < last {
            shrank = true;
        }
        highs_before = highs;
        last = rss;
    }
    let s = node.finish();
    assert!(s.signals[1] > 0, "no high signal: {s:?}");
    assert!(
        shrank,
        "elastic-0 never shrank on a high or top signal: {s:?}"
    );
    assert_eq!(s.m3_kills, 0, "elastic processes are never killed");
    // Three jobs of 45 % each fit because they gave memory back.
    assert_eq!(s.oom_kills, 0, "{s:?}");
}

/// An LC service and one batch holder of `be_bytes`, no swap: the holder's working
/// set cannot be reclaimed.
fn holder(total: u64, be_bytes: u64) -> Vec<ProcSpec> {
    vec![
        ProcSpec {
            name: "lc".into(),
            start_s: 0.0,
            cap_bytes: None,
            stop_s: None,
            workload: Workload::Lc {
                ws_bytes: 64 * MIB,
                grow_bytes_per_s: 1024.0 * MIB as f64,
                rate: 100.0,
            },
        },
        ProcSpec {
            name: "be".into(),
            start_s: 1.0,
            cap_bytes: None,
            stop_s: None,
            workload: Workload::BeAnon {
                size_bytes: be_bytes,
                grow_bytes_per_s: 256.0 * MIB as f64,
                touch_bytes_per_s: 64.0 * MIB as f64,
            },
        },
    ]
    .into_iter()
    .inspect(|_| assert!(be_bytes + 64 * MIB <= total))
    .collect()
}

#[test]
fn kill_only_above_top_and_only_batch() {
    let total = 1024 * MIB;
    let top = total / 64 * 62;
    // Above top (63/64 of the node) for longer than M3's 30 s: the batch job goes.
    let mut node = Node::new(
        cfg(total, 0, Mode::Memcolo, 1),
        holder(total, total / 64 * 63 - 64 * MIB),
    )
    .unwrap();
    node.run(Duration::from_secs(60));
    let s = node.finish();
    assert_eq!(s.m3_kills, 1, "{s:?}");
    assert!(s.procs[1].killed_by_m3 && !s.procs[0].killed_by_m3, "{s:?}");
    // In red but below top (60/64 of the node): never a kill.
    let mut node = Node::new(
        cfg(total, 0, Mode::Memcolo, 1),
        holder(total, total / 64 * 60 - 64 * MIB),
    )
    .unwrap();
    while node.now() < Duration::from_secs(60) {
        node.step();
        assert!(node.working_set_bytes() <= top);
    }
    assert_eq!(node.finish().m3_kills, 0);
}

#[test]
fn memcolo_keeps_the_lc_off_direct_reclaim_where_the_kernel_does_not() {
    let total = 2048 * MIB;
    let lc_stall = |mode| {
        let mut node = Node::new(
            cfg(total, total / 2, mode, 1),
            colocation_procs(total, 150, mode == Mode::Kernel),
        )
        .unwrap();
        node.run(Duration::from_secs(30));
        let s = node.finish();
        s.procs[0].direct_reclaim_s + s.procs[0].fault_s
    };
    let kernel = lc_stall(Mode::Kernel);
    let memcolo = lc_stall(Mode::Memcolo);
    assert!(
        kernel > 0.0,
        "the kernel alone stalls the LC service at 150 %"
    );
    assert!(
        memcolo < kernel,
        "memcolo {memcolo} s against kernel {kernel} s"
    );
}

#[test]
fn after_a_high_signal_the_sdk_gate_holds_growth_back() {
    // One elastic cache that wants more than the node: M3 signals it high, and the
    // SDK's allow-rate gate (rate 0 at the signal, climbing over 5 epochs of at least
    // 1 s) keeps it from growing back at its full rate.
    let total = 4096 * MIB;
    let grow = 256.0 * MIB as f64;
    let procs = vec![ProcSpec {
        name: "cache".into(),
        start_s: 0.0,
        cap_bytes: None,
        stop_s: None,
        workload: Workload::Elastic {
            want_bytes: total,
            floor_bytes: 0,
            grow_bytes_per_s: grow,
            layer_bytes: 64 * MIB,
            miss_penalty: 1.0,
            work_s: 1e9,
            num_epochs: 5,
        },
    }];
    let mut node = Node::new(cfg(total, 0, Mode::Memcolo, 1), procs).unwrap();
    let step_grow = (grow * 0.1) as u64;
    let mut highs = 0;
    while highs == 0 && node.now() < Duration::from_secs(60) {
        node.step();
        let p = node.proc_stats("cache").unwrap();
        highs = p.notifications[1] + p.notifications[2];
    }
    assert!(highs > 0, "no high signal in 60 s");
    // The step right after the signal: the gate admits nothing (rate 0 at receipt).
    let before = node.rss_of("cache");
    node.step();
    assert!(
        node.rss_of("cache") <= before,
        "grew {} bytes right after a high signal",
        node.rss_of("cache") - before
    );
    // Over the next second it grows, but by less than its ungated rate.
    let before = node.rss_of("cache");
    for _ in 0..10 {
        node.step();
    }
    let grown = node.rss_of("cache").saturating_sub(before);
    assert!(grown < 10 * step_grow, "grew {grown} of {}", 10 * step_grow);
}

#[test]
fn with_page_cache_to_spare_the_kernel_swaps_no_lc_page() {
    // bench/colocation's quick sweep of 2026-11-28: under the kernel alone at 125 and 150 %
    // the streamer held page cache and read almost nothing more (0.04 MiB/min), the
    // node never used swap and Redis took no major fault. The kernel reclaims page
    // cache only while it is plentiful and not refaulting (cache-trim mode).
    let total = 2048 * MIB;
    for level in [125, 150] {
        let mut procs = colocation_procs(total, level, true);
        for p in procs.iter_mut() {
            if let Workload::BeFile {
                file_bytes,
                read_bytes_per_s,
            } = &mut p.workload
            {
                // Reads three quarters of its file in the 30 s, never all of it.
                *read_bytes_per_s = (*file_bytes / 40) as f64;
            }
        }
        let mut node = Node::new(cfg(total, total / 2, Mode::Kernel, 1), procs).unwrap();
        node.run(Duration::from_secs(30));
        let s = node.finish();
        assert!(
            s.direct_reclaimed_bytes > 0,
            "level {level}: no pressure: {s:?}"
        );
        assert_eq!(s.procs[0].swapin_bytes, 0, "level {level}: {s:?}");
        assert_eq!(s.peak_swapped_bytes, 0, "level {level}: {s:?}");
    }
}
