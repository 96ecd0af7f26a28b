//! An elastic in-memory buffer beside `memcolo agent`: it grows by 1 MiB chunks, gives
//! chunks back on low (1 %) and high (4 %) signals, then trims glibc's heap, and
//! evicts before growing while the allow-rate gate says so (M3 §4.2).
//!
//! Run: `sudo memcolo agent &` then
//! `MEMCOLO_SOCKET=/run/memcolo/agent.sock cargo run -p memcolo-sdk --example elastic_buffer -- 2048`
//! (argument: the size to grow to, MiB).

use memcolo_sdk::{runtime, ClientBuilder, Level};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CHUNK_BYTES: usize = 1 << 20;

fn evict(buf: &Mutex<VecDeque<Vec<u8>>>, percent: usize, at_least: u64) -> u64 {
    let mut b = buf.lock().unwrap();
    let n = (b.len() * percent / 100)
        .max(at_least.div_ceil(CHUNK_BYTES as u64) as usize)
        .min(b.len());
    b.drain(..n);
    (n * CHUNK_BYTES) as u64
}

fn main() {
    let max_mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1024);
    let buf = Arc::new(Mutex::new(VecDeque::<Vec<u8>>::new()));
    let (b1, b2) = (buf.clone(), buf.clone());
    let client = ClientBuilder::new()
        .name("elastic-buffer")
        .expected_reclaim_bytes((max_mib * CHUNK_BYTES / 25) as u64)
        .on(Level::Low, move |_| Ok(evict(&b1, 1, 0)))
        .on(Level::High, move |n| Ok(evict(&b2, 4, n.target_bytes)))
        .on(Level::Low, |_| Ok(runtime::malloc_trim()))
        .on(Level::High, |_| Ok(runtime::malloc_trim()))
        .start();
    loop {
        if buf.lock().unwrap().len() < max_mib {
            // Delayed allocation: replace old data instead of growing.
            client.gate().before_alloc(|| {
                buf.lock().unwrap().pop_front();
            });
            buf.lock().unwrap().push_back(vec![0x5a; CHUNK_BYTES]);
        }
        let len = buf.lock().unwrap().len();
        println!(
            "size {len} MiB, rss {} MiB, allow rate {:.2}, registered {}, notifications {}",
            runtime::rss_bytes().unwrap_or(0) >> 20,
            client.gate().allow_rate(),
            client.is_registered(),
            client.notifications()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
