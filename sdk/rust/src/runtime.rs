//! Runtime layer for native Rust/C programs: give the C allocator's free memory back
//! to the kernel (glibc `malloc_trim(3)`), the lowest layer of M3's layered
//! reclamation (M3 §4.1) for a process without a garbage collector.

/// Resident set size of this process in bytes, from `/proc/self/statm` (field 2,
/// pages). `None` where procfs is unavailable.
pub fn rss_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// Calls glibc `malloc_trim(0)` and returns the drop in RSS it caused, in bytes
/// (0 if RSS did not drop or on other C libraries, where it does nothing).
pub fn malloc_trim() -> u64 {
    let before = rss_bytes();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
    match (before, rss_bytes()) {
        (Some(b), Some(a)) => b.saturating_sub(a),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_read_from_procfs() {
        assert!(rss_bytes().unwrap() > 0);
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn malloc_trim_returns_freed_heap_pages() {
        // Many small blocks (below the mmap threshold) live on the heap; freeing
        // them leaves free pages that only malloc_trim gives back.
        let mut blocks: Vec<Vec<u8>> = (0..20_000).map(|_| vec![1u8; 4000]).collect();
        let keep = blocks.pop();
        drop(blocks);
        let freed = malloc_trim();
        drop(keep);
        assert!(freed > 16 << 20, "malloc_trim freed only {freed} bytes");
    }
}
