//! The LC service's dataset: key names, the pool of random bytes values are cut
//! from (so values differ and do not compress to nothing in zram), and the preload.

use crate::error::{BenchError, Result};
use crate::lc::LcConn;

/// The key of dataset entry `i`.
pub fn key_name(i: u64) -> String {
    format!("key:{i}")
}

/// A pool of random bytes from which values are cut: `value_bytes + 64 KiB` long, so
/// values at different offsets differ and do not compress to nothing in zram.
pub fn value_pool(value_bytes: usize, seed: u64) -> Vec<u8> {
    use rand_xoshiro::rand_core::{Rng, SeedableRng};
    let mut rng = rand_xoshiro::SplitMix64::seed_from_u64(seed);
    let mut v = Vec::with_capacity(value_bytes + 65536);
    while v.len() < value_bytes + 65536 {
        v.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    v.truncate(value_bytes + 65536);
    v
}

/// Offset in a pool of `pool_len` bytes of the value for key `i`.
pub fn value_offset(i: u64, pool_len: usize, value_bytes: usize) -> usize {
    let span = (pool_len - value_bytes).max(1) as u64;
    ((i.wrapping_mul(7919)) % span) as usize
}

/// Loads `keys` entries `key:0 .. key:<keys-1>` with `value_bytes`-byte values cut
/// from `pool` (see [`value_pool`]), in pipelines of 1,000 SETs.
pub async fn preload(con: &mut LcConn, keys: u64, value_bytes: usize, pool: &[u8]) -> Result<()> {
    const BATCH: u64 = 1000;
    let con = match con {
        LcConn::Redis(c) => c,
        LcConn::Memcached(c) => {
            let mut i = 0;
            while i < keys {
                crate::signal::check()?;
                let pending: Vec<_> = (i..(i + BATCH).min(keys))
                    .map(|k| {
                        let off = value_offset(k, pool.len(), value_bytes);
                        c.set_pipelined(&key_name(k), &pool[off..off + value_bytes])
                    })
                    .collect();
                for rx in pending {
                    rx.await
                        .unwrap_or_else(|_| Err("connection closed".into()))
                        .map_err(|e| BenchError::Process(format!("memcached preload: {e}")))?;
                }
                i += BATCH;
            }
            return Ok(());
        }
    };
    let mut i = 0;
    while i < keys {
        crate::signal::check()?;
        let mut p = redis::pipe();
        for k in i..(i + BATCH).min(keys) {
            let off = value_offset(k, pool.len(), value_bytes);
            p.cmd("SET")
                .arg(key_name(k))
                .arg(&pool[off..off + value_bytes])
                .ignore();
        }
        p.query_async::<()>(con).await?;
        i += BATCH;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_cut_inside_the_pool_at_differing_offsets() {
        let pool = value_pool(1024, 1);
        assert_eq!(pool.len(), 1024 + 65536);
        for k in [0u64, 1, 99, u64::MAX / 3] {
            let off = value_offset(k, pool.len(), 1024);
            assert!(off + 1024 <= pool.len());
        }
        assert_ne!(
            value_offset(1, pool.len(), 1024),
            value_offset(2, pool.len(), 1024)
        );
        assert_eq!(key_name(7), "key:7");
    }
}
