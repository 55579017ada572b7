//! Giving freed heap back to the operating system after a large, short-lived load.
//!
//! glibc keeps freed memory in its arenas for reuse, so a load that peaks high and then frees
//! most of it (parsing a 262 k-token tokenizer) leaves the process's resident size at the peak
//! for the rest of the run. [`release_free_heap`] asks the allocator to return what it can.

/// Returns the allocator's free pages to the OS (glibc's `malloc_trim(0)`); `true` when some
/// memory was released. A no-op (false) on other C libraries.
pub fn release_free_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists under its locks; it has
        // no preconditions and does not touch live allocations.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn releasing_after_a_large_free_is_safe_and_keeps_live_data() {
        let keep = vec![7u8; 1 << 16];
        let big: Vec<Vec<u8>> = (0..1000).map(|i| vec![i as u8; 4096]).collect();
        drop(big);
        super::release_free_heap();
        assert!(keep.iter().all(|&b| b == 7));
    }
}
