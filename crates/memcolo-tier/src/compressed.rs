//! A slow tier of LZ4-compressed pages in this process's memory.
//!
//! Each page is kept as one of: nothing at all for a page of zeros (common in freshly
//! touched anonymous memory), its LZ4 block (lz4_flex) when that saves at least an
//! eighth of the page, or its raw bytes otherwise (incompressible data costs no
//! decompression on load). Every entry keeps the CRC-32 of the uncompressed page,
//! taken on store and verified after every load, so a flipped bit in the compressed
//! bytes is reported as [`TierError::Corrupt`] instead of handed back.
//!
//! `capacity_bytes` bounds the memory the store may occupy: the compressed (or raw)
//! bytes of every page plus [`ENTRY_OVERHEAD_BYTES`] each. A store that would pass it
//! is refused with [`TierError::Full`] and changes nothing.
//!
//! The map is split in [`SHARDS`] shards, each behind its own mutex, so a fault thread
//! and eviction workers rarely wait on each other; compression runs outside the lock.

use crate::{checksum, PageKey, SlowTier, TierError, TierStats};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Shards of the page map.
pub const SHARDS: usize = 16;

/// Bookkeeping charged per stored page on top of its bytes (map entry, box header),
/// bytes; an estimate used for the capacity bound.
pub const ENTRY_OVERHEAD_BYTES: u64 = 48;

#[derive(Debug)]
enum Body {
    Zero,
    Raw(Box<[u8]>),
    Lz4(Box<[u8]>),
}

impl Body {
    fn bytes(&self) -> u64 {
        match self {
            Body::Zero => 0,
            Body::Raw(b) | Body::Lz4(b) => b.len() as u64,
        }
    }
}

#[derive(Debug)]
struct Entry {
    body: Body,
    crc: u32,
}

fn footprint(body: &Body) -> u64 {
    body.bytes() + ENTRY_OVERHEAD_BYTES
}

/// Pages compressed with LZ4 in memory; see the module documentation.
#[derive(Debug)]
pub struct CompressedStore {
    page_bytes: usize,
    capacity_bytes: u64,
    shards: Box<[Mutex<HashMap<PageKey, Entry>>]>,
    hasher: std::collections::hash_map::RandomState,
    used: AtomicU64,
    pages: AtomicU64,
    stores: AtomicU64,
    loads: AtomicU64,
    corrupt: AtomicU64,
    zero_pages: AtomicU64,
    raw_pages: AtomicU64,
}

impl CompressedStore {
    /// An empty store of pages of `page_bytes` bytes (> 0) that may occupy up to
    /// `capacity_bytes` bytes.
    ///
    /// # Panics
    /// If `page_bytes` is 0.
    pub fn new(page_bytes: usize, capacity_bytes: u64) -> Self {
        assert!(page_bytes > 0, "page_bytes must be > 0");
        CompressedStore {
            page_bytes,
            capacity_bytes,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
            used: AtomicU64::new(0),
            pages: AtomicU64::new(0),
            stores: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
            zero_pages: AtomicU64::new(0),
            raw_pages: AtomicU64::new(0),
        }
    }

    /// The capacity, bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// Pages held as zero pages (no bytes) and as raw (incompressible) pages now.
    pub fn zero_and_raw_pages(&self) -> (u64, u64) {
        (
            self.zero_pages.load(Ordering::Relaxed),
            self.raw_pages.load(Ordering::Relaxed),
        )
    }

    fn shard(&self, key: &PageKey) -> &Mutex<HashMap<PageKey, Entry>> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    fn lock(&self, key: &PageKey) -> std::sync::MutexGuard<'_, HashMap<PageKey, Entry>> {
        // A panic while holding a shard lock cannot leave an entry half written (the
        // map is only changed by whole inserts and removes), so a poisoned lock is
        // still consistent.
        self.shard(key).lock().unwrap_or_else(|e| e.into_inner())
    }

    fn encode(&self, data: &[u8]) -> Body {
        if data.iter().all(|&b| b == 0) {
            return Body::Zero;
        }
        let compressed = lz4_flex::block::compress(data);
        if compressed.len() <= data.len() - data.len() / 8 {
            Body::Lz4(compressed.into_boxed_slice())
        } else {
            Body::Raw(data.to_vec().into_boxed_slice())
        }
    }

    fn count_kind(&self, body: &Body, delta: i64) {
        let c = match body {
            Body::Zero => &self.zero_pages,
            Body::Raw(_) => &self.raw_pages,
            Body::Lz4(_) => return,
        };
        if delta > 0 {
            c.fetch_add(1, Ordering::Relaxed);
        } else {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Flips one bit of a stored page's bytes (or its checksum for a zero page), to
    /// test that corruption is caught.
    #[cfg(test)]
    pub(crate) fn corrupt_for_test(&self, key: PageKey) {
        let mut shard = self.lock(&key);
        let e = shard.get_mut(&key).expect("stored page");
        match &mut e.body {
            Body::Zero => e.crc ^= 1,
            Body::Raw(b) | Body::Lz4(b) => {
                let i = b.len() / 2;
                b[i] ^= 0x10;
            }
        }
    }

    /// Whether the page is held as an LZ4 block (for tests of the encoding).
    #[cfg(test)]
    fn is_lz4(&self, key: PageKey) -> bool {
        matches!(
            self.lock(&key).get(&key).map(|e| &e.body),
            Some(Body::Lz4(_))
        )
    }
}

impl SlowTier for CompressedStore {
    fn name(&self) -> &'static str {
        "compressed"
    }

    fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    fn store(&self, key: PageKey, data: &[u8]) -> Result<(), TierError> {
        if data.len() != self.page_bytes {
            return Err(TierError::WrongSize {
                key,
                expected: self.page_bytes,
                got: data.len(),
            });
        }
        let crc = checksum(data);
        let body = self.encode(data);
        let new = footprint(&body);
        let mut shard = self.lock(&key);
        let old = shard.get(&key).map(|e| footprint(&e.body)).unwrap_or(0);
        // Reserve the growth against the capacity before inserting.
        if new > old {
            let grow = new - old;
            let reserved = self
                .used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                    (u + grow <= self.capacity_bytes).then_some(u + grow)
                });
            if let Err(used) = reserved {
                return Err(TierError::Full {
                    capacity_bytes: self.capacity_bytes,
                    used_bytes: used,
                });
            }
        } else {
            self.used.fetch_sub(old - new, Ordering::AcqRel);
        }
        self.count_kind(&body, 1);
        if let Some(prev) = shard.insert(key, Entry { body, crc }) {
            self.count_kind(&prev.body, -1);
        } else {
            self.pages.fetch_add(1, Ordering::Relaxed);
        }
        self.stores.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn load(&self, key: PageKey, out: &mut [u8]) -> Result<(), TierError> {
        if out.len() != self.page_bytes {
            return Err(TierError::WrongSize {
                key,
                expected: self.page_bytes,
                got: out.len(),
            });
        }
        let shard = self.lock(&key);
        let Some(e) = shard.get(&key) else {
            return Err(TierError::NotFound { key });
        };
        let expected = e.crc;
        let decoded_ok = match &e.body {
            Body::Zero => {
                out.fill(0);
                true
            }
            Body::Raw(b) => {
                out.copy_from_slice(b);
                true
            }
            Body::Lz4(b) => matches!(
                lz4_flex::block::decompress_into(b, out),
                Ok(n) if n == out.len()
            ),
        };
        drop(shard);
        let actual = if decoded_ok { checksum(out) } else { !expected };
        if actual != expected {
            self.corrupt.fetch_add(1, Ordering::Relaxed);
            return Err(TierError::Corrupt {
                key,
                expected,
                actual,
            });
        }
        self.loads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn remove(&self, key: PageKey) -> Result<bool, TierError> {
        let prev = self.lock(&key).remove(&key);
        Ok(match prev {
            Some(e) => {
                self.used.fetch_sub(footprint(&e.body), Ordering::AcqRel);
                self.pages.fetch_sub(1, Ordering::Relaxed);
                self.count_kind(&e.body, -1);
                true
            }
            None => false,
        })
    }

    fn remove_region(&self, region: u64) -> Result<u64, TierError> {
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<PageKey> = map.keys().filter(|k| k.region == region).copied().collect();
            for k in keys {
                let e = map.remove(&k).expect("listed key");
                self.used.fetch_sub(footprint(&e.body), Ordering::AcqRel);
                self.pages.fetch_sub(1, Ordering::Relaxed);
                self.count_kind(&e.body, -1);
                n += 1;
            }
        }
        Ok(n)
    }

    /// Scans the shards one at a time, each under its lock.
    fn list_region(&self, region: u64) -> Result<Vec<u64>, TierError> {
        let mut pages = Vec::new();
        for shard in self.shards.iter() {
            let map = shard.lock().unwrap_or_else(|e| e.into_inner());
            pages.extend(map.keys().filter(|k| k.region == region).map(|k| k.page));
        }
        pages.sort_unstable();
        Ok(pages)
    }

    fn stats(&self) -> TierStats {
        TierStats {
            pages: self.pages.load(Ordering::Relaxed),
            stored_bytes: self.used.load(Ordering::Relaxed),
            stores: self.stores.load(Ordering::Relaxed),
            loads: self.loads.load(Ordering::Relaxed),
            corrupt: self.corrupt.load(Ordering::Relaxed),
            retries: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PAGE: usize = 4096;

    fn text_page(seed: u8) -> Vec<u8> {
        (0..PAGE)
            .map(|i| b"memcolo tiers pages "[(i + seed as usize) % 20])
            .collect()
    }

    /// xorshift bytes: incompressible.
    fn random_page(mut x: u64) -> Vec<u8> {
        (0..PAGE)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn round_trip_each_encoding() {
        let s = CompressedStore::new(PAGE, 1 << 20);
        let pages = [vec![0u8; PAGE], text_page(3), random_page(42)];
        for (i, p) in pages.iter().enumerate() {
            s.store(PageKey::new(1, i as u64), p).unwrap();
        }
        assert!(s.is_lz4(PageKey::new(1, 1)));
        assert_eq!(s.zero_and_raw_pages(), (1, 1));
        let mut out = vec![0xAAu8; PAGE];
        for (i, p) in pages.iter().enumerate() {
            s.load(PageKey::new(1, i as u64), &mut out).unwrap();
            assert_eq!(&out, p, "page {i}");
        }
        let st = s.stats();
        assert_eq!((st.pages, st.stores, st.loads, st.corrupt), (3, 3, 3, 0));
        // The text page compresses well below a raw page.
        assert!(st.stored_bytes < (PAGE as u64) + 4 * ENTRY_OVERHEAD_BYTES + 400);
    }

    #[test]
    fn overwrite_remove_and_regions() {
        let s = CompressedStore::new(PAGE, 1 << 20);
        let k = PageKey::new(7, 0);
        s.store(k, &random_page(1)).unwrap();
        let used_raw = s.stats().stored_bytes;
        s.store(k, &vec![0u8; PAGE]).unwrap();
        assert_eq!(s.stats().pages, 1);
        assert_eq!(s.stats().stored_bytes, ENTRY_OVERHEAD_BYTES);
        assert!(used_raw > ENTRY_OVERHEAD_BYTES);
        assert_eq!(s.zero_and_raw_pages(), (1, 0));
        for p in 1..5 {
            s.store(PageKey::new(7, p), &text_page(p as u8)).unwrap();
            s.store(PageKey::new(8, p), &text_page(p as u8)).unwrap();
        }
        assert!(s.remove(PageKey::new(8, 1)).unwrap());
        assert!(!s.remove(PageKey::new(8, 1)).unwrap());
        assert_eq!(s.remove_region(7).unwrap(), 5);
        assert_eq!(s.stats().pages, 3);
        let mut out = vec![0u8; PAGE];
        assert!(matches!(
            s.load(k, &mut out),
            Err(TierError::NotFound { key }) if key == k
        ));
        s.remove_region(8).unwrap();
        assert_eq!(s.stats().stored_bytes, 0);
        assert_eq!(s.zero_and_raw_pages(), (0, 0));
    }

    #[test]
    fn list_region_is_sorted_and_per_region() {
        let s = CompressedStore::new(PAGE, 1 << 20);
        assert!(!s.durable());
        assert_eq!(s.list_region(5).unwrap(), Vec::<u64>::new());
        // Indices spread over the shards, stored out of order, of every encoding.
        let indices = [40u64, 3, u64::MAX, 0, 17, 1 << 33, 4, 1000];
        for (i, &p) in indices.iter().enumerate() {
            let data = match i % 3 {
                0 => vec![0u8; PAGE],
                1 => text_page(i as u8),
                _ => random_page(i as u64 + 1),
            };
            s.store(PageKey::new(5, p), &data).unwrap();
            s.store(PageKey::new(6, p ^ 1), &text_page(0)).unwrap();
        }
        // Overwriting a page lists it once.
        s.store(PageKey::new(5, 17), &text_page(9)).unwrap();
        let mut want = indices.to_vec();
        want.sort_unstable();
        assert_eq!(s.list_region(5).unwrap(), want);
        assert_eq!(s.list_region(6).unwrap().len(), indices.len());
        assert!(s.remove(PageKey::new(5, 17)).unwrap());
        want.retain(|&p| p != 17);
        assert_eq!(s.list_region(5).unwrap(), want);
        s.remove_region(5).unwrap();
        assert_eq!(s.list_region(5).unwrap(), Vec::<u64>::new());
        assert_eq!(s.list_region(6).unwrap().len(), indices.len());
    }

    #[test]
    fn corruption_is_detected_for_every_encoding() {
        let s = CompressedStore::new(PAGE, 1 << 20);
        let pages = [vec![0u8; PAGE], text_page(9), random_page(5)];
        let mut out = vec![0u8; PAGE];
        for (i, p) in pages.iter().enumerate() {
            let k = PageKey::new(2, i as u64);
            s.store(k, p).unwrap();
            s.corrupt_for_test(k);
            match s.load(k, &mut out) {
                Err(TierError::Corrupt {
                    key,
                    expected,
                    actual,
                }) => {
                    assert_eq!(key, k);
                    assert_ne!(expected, actual);
                }
                other => panic!("page {i}: {other:?}"),
            }
        }
        assert_eq!(s.stats().corrupt, 3);
    }

    #[test]
    fn capacity_is_enforced_and_a_refused_store_changes_nothing() {
        let cap = 2 * (PAGE as u64 + ENTRY_OVERHEAD_BYTES);
        let s = CompressedStore::new(PAGE, cap);
        s.store(PageKey::new(1, 0), &random_page(1)).unwrap();
        s.store(PageKey::new(1, 1), &random_page(2)).unwrap();
        let before = s.stats();
        match s.store(PageKey::new(1, 2), &random_page(3)) {
            Err(TierError::Full {
                capacity_bytes,
                used_bytes,
            }) => {
                assert_eq!(capacity_bytes, cap);
                assert_eq!(used_bytes, cap);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.stats(), before);
        // Zero pages and compressible pages still fit? No: even a zero page costs
        // its entry. Replacing a page by a smaller one does fit.
        s.store(PageKey::new(1, 0), &vec![0u8; PAGE]).unwrap();
        s.store(PageKey::new(1, 2), &text_page(0)).unwrap();
    }

    #[test]
    fn wrong_sizes_are_refused() {
        let s = CompressedStore::new(PAGE, 1 << 20);
        let k = PageKey::new(1, 1);
        assert!(matches!(
            s.store(k, &[1u8; 100]),
            Err(TierError::WrongSize {
                expected: PAGE,
                got: 100,
                ..
            })
        ));
        s.store(k, &text_page(1)).unwrap();
        let mut small = vec![0u8; 10];
        assert!(matches!(
            s.load(k, &mut small),
            Err(TierError::WrongSize { .. })
        ));
    }

    #[test]
    fn concurrent_writers_and_readers() {
        let s = std::sync::Arc::new(CompressedStore::new(PAGE, 64 << 20));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut out = vec![0u8; PAGE];
                    for i in 0..500u64 {
                        let data = if i % 3 == 0 {
                            random_page(t * 1000 + i + 1)
                        } else {
                            text_page((t + i) as u8)
                        };
                        let k = PageKey::new(t, i);
                        s.store(k, &data).unwrap();
                        s.load(k, &mut out).unwrap();
                        assert_eq!(out, data);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.stats().pages, 2000);
    }

    proptest! {
        /// Any bytes round trip, and a flipped bit in a stored page never yields wrong
        /// bytes.
        #[test]
        fn any_page_round_trips(
            data in prop::collection::vec(any::<u8>(), PAGE..=PAGE),
            runs in prop::collection::vec((0usize..PAGE, 1usize..64, any::<u8>()), 0..8),
        ) {
            // Mix random bytes with runs of one byte, so pages of every
            // compressibility occur.
            let mut data = data;
            for (at, len, b) in runs {
                let end = (at + len).min(PAGE);
                data[at..end].fill(b);
            }
            let s = CompressedStore::new(PAGE, 1 << 20);
            let k = PageKey::new(3, 3);
            s.store(k, &data).unwrap();
            let mut out = vec![0u8; PAGE];
            s.load(k, &mut out).unwrap();
            prop_assert_eq!(&out, &data);
            // A flipped bit may, rarely, leave an LZ4 block that still decodes to the
            // same page (a match offset moved within a run): what must never happen is
            // different bytes handed back.
            s.corrupt_for_test(k);
            out.fill(0x5A);
            match s.load(k, &mut out) {
                Err(TierError::Corrupt { .. }) => {}
                Ok(()) => prop_assert_eq!(&out, &data),
                Err(e) => prop_assert!(false, "{e}"),
            }
        }
    }
}
