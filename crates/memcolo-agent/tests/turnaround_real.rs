//! The page-turnaround sampler on the real kernel: a real process in a scratch memory
//! cgroup is paged out with batched `process_madvise(MADV_PAGEOUT)` (zram swap of the
//! test's own); the eviction watch sees which of its watched pages the batch swapped
//! out, and once the process touches its memory again the sampler records each
//! refault with a time between the polls around it. Skips, saying why, without root,
//! cgroup v1, zram or python3. No assertion depends on the machine's speed: every
//! bound comes from instants the test measured.

mod support;

use memcolo_agent::async_reclaim::turnaround::{
    EvictionWatch, PageSource, PageState, ProcPages, TurnaroundConfig, TurnaroundSampler,
};
use memcolo_linux::pageout::{PageoutCursor, VmaKind};
use memcolo_linux::procfs::ProcFs;
use std::time::{Duration, Instant};
use support::{Holder, Scratch, MIB};

#[test]
fn a_paged_out_page_touched_again_is_recorded_with_its_turnaround() {
    let test = "a_paged_out_page_touched_again_is_recorded_with_its_turnaround";
    let Some((python, swap)) = support::python_and_swap(test, 128 * MIB) else {
        return;
    };
    let scratch = Scratch::new("turnaround");
    let mut holder = Holder::start_in(&scratch.cg, python, 16);
    let pid = holder.child.id() as i32;
    let procfs = ProcFs::root();
    let mut pages = ProcPages::new(procfs.clone());
    let mut rng = fastrand::Rng::with_seed(42);
    let proven = std::sync::Arc::new(
        memcolo_linux::identity::ProvenProcess::open(&procfs, pid, None).unwrap(),
    );
    assert!(pages.bind(&proven));

    // Watch 64 resident pages, then page the whole process out in one batch.
    let mut watch = EvictionWatch::new(64);
    watch.arm(&mut pages, &[pid], &mut rng, Instant::now());
    let watched = watch.len();
    assert!(watched >= 32, "only {watched} resident pages found");
    let mut cursor = PageoutCursor::new(proven.clone(), VmaKind::Anon);
    let out = cursor.pageout(&procfs, 1 << 30).unwrap();
    let evicted_at = Instant::now();
    assert!(out.reclaimed_bytes >= 8 * MIB, "{out:?}");
    let evicted = watch.evicted(&mut pages);
    // Nearly every watched page went to swap (a page the kernel declines — shared,
    // or touched again meanwhile — stays watched).
    assert!(
        evicted.len() * 4 >= watched * 3,
        "{} of {watched} watched pages evicted",
        evicted.len()
    );
    let st = pages.page_states(pid, &[evicted[0].1]).unwrap();
    assert_eq!(st, vec![PageState::Swapped]);

    let mut sampler = TurnaroundSampler::new(TurnaroundConfig {
        capacity: 512,
        poll: Duration::from_millis(100),
        horizon: Duration::from_secs(600),
        window: Duration::from_secs(600),
        recent: Duration::from_secs(600),
        ..Default::default()
    });
    assert_eq!(sampler.admit(&evicted, evicted_at), evicted.len());

    // The process sleeps on its input: nothing comes back, and reading the pagemap
    // does not fault pages in.
    std::thread::sleep(Duration::from_secs(1));
    let p1 = Instant::now();
    let first = sampler.poll(&mut pages, p1);
    assert!(first.refaulted.is_empty(), "{first:?}");
    assert_eq!(first.dropped, 0);
    assert_eq!(sampler.summary().tracked, evicted.len() as u64);

    // It reads its memory again: the pages it touched are recorded, each with a
    // turnaround between the two polls around the refault.
    holder.touch();
    let p2 = Instant::now();
    let second = sampler.poll(&mut pages, p2);
    assert!(!second.refaulted.is_empty(), "nothing recorded: {second:?}");
    let (lo, hi) = (p1 - evicted_at, p2 - evicted_at);
    for d in &second.refaulted {
        assert!(
            *d >= lo && *d <= hi,
            "turnaround {d:?} outside [{lo:?}, {hi:?}]"
        );
    }
    assert!(lo >= Duration::from_secs(1));
    let sum = sampler.summary();
    assert_eq!(sum.refaulted, second.refaulted.len() as u64);
    let p50 = sum.p50_s.unwrap();
    assert!(
        p50 >= lo.as_secs_f64() * 0.99 && p50 <= hi.as_secs_f64() * 1.01,
        "p50 {p50} s outside [{lo:?}, {hi:?}]"
    );
    // The median of these recent evictions, which steers the scheduler's back-off,
    // lies between the polls too when over half of them are back; a lower bound
    // (the time they were last seen out) otherwise.
    let recent = sampler.recent().unwrap();
    assert_eq!(recent.pages, evicted.len() as u64, "{recent:?}");
    assert_eq!(recent.refaulted, second.refaulted.len() as u64);
    if recent.refaulted * 2 >= recent.pages {
        assert!(!recent.at_least, "{recent:?}");
        assert!(
            recent.turnaround_s >= lo.as_secs_f64() && recent.turnaround_s <= hi.as_secs_f64(),
            "recent median {recent:?} outside [{lo:?}, {hi:?}]"
        );
    } else {
        assert!(recent.at_least, "{recent:?}");
    }
    eprintln!(
        "{test}: {watched} watched, {} evicted, {} refaulted in [{lo:?}, {hi:?}], p50 {p50:.3} s",
        evicted.len(),
        second.refaulted.len()
    );
    assert!(holder.intact(), "data changed by pageout");

    // The process exits: its remaining pages are dropped quietly.
    drop(holder);
    let third = sampler.poll(&mut pages, Instant::now());
    assert_eq!(
        third.dropped as usize,
        evicted.len() - second.refaulted.len()
    );
    assert_eq!(sampler.summary().tracked, 0);
    assert!(sampler.pids().is_empty());
    drop(scratch);
    drop(swap);
}
