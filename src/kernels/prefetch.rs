//! Cache hints: ask the CPU to bring a range towards the core (into L2) without waiting for it
//! ([`to_l2`]), and the redirect that sends the tile kernels' run-ahead prefetches
//! (`dot::avx2::prefetch_ahead`) into the next task's stripe when it does not follow the current
//! one in memory ([`redirect`]): a selected expert's region, or the next matrix of a fused call,
//! instead of bytes past the end that nothing reads next. On Zen 4 (`benches/ab_binaries.sh`,
//! 12 pairs) decode gained 7–10 % at 1 thread on SmolLM2 Q4_1 and its moefied MoE and ~4 % at
//! 2; Gemma 3 1.5 % at 1 thread; docs/PERFORMANCE.md, "Defaults chosen by measurement".

/// Issues a `prefetcht1` for every 64-byte line of `w`. A hint: it never faults and changes no
/// value, only when the bytes arrive.
pub fn to_l2<T>(w: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let p = w.as_ptr() as *const u8;
        let len = std::mem::size_of_val(w);
        let mut o = 0;
        while o < len {
            // SAFETY: PREFETCHT1 is a hint that never faults; SSE is part of the x86_64
            // baseline; the address is inside the live slice `w`.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    p.add(o) as *const i8
                )
            };
            o += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = w;
}

thread_local! {
    /// This thread's prefetch redirect: (end of the current run of bytes, start of the next
    /// run), as addresses; `(usize::MAX, 0)` when none. Set by the matvec driver around one
    /// task, so a kernel called anywhere else sees none.
    static REDIRECT: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((usize::MAX, 0)) };
}

/// Until [`clear_redirect`], this thread's kernel prefetches that would reach `end` or beyond go
/// the same distance past `next` instead (addresses).
pub fn redirect(end: usize, next: usize) {
    REDIRECT.with(|r| r.set((end, next)));
}

/// No redirect.
pub fn clear_redirect() {
    REDIRECT.with(|r| r.set((usize::MAX, 0)));
}

/// Where a prefetch of address `a` should go: `a`, or past the current run's end, the same
/// distance into the next run.
#[inline]
pub fn redirected(a: usize) -> usize {
    let (end, next) = REDIRECT.with(|r| r.get());
    if a >= end {
        next.wrapping_add(a - end)
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_moves_only_addresses_past_the_end_and_clears() {
        assert_eq!(redirected(5000), 5000);
        redirect(4096, 1 << 20);
        assert_eq!(redirected(4095), 4095);
        assert_eq!(redirected(4096), 1 << 20);
        assert_eq!(redirected(4096 + 100), (1 << 20) + 100);
        // Another thread has its own (none).
        std::thread::spawn(|| assert_eq!(redirected(9000), 9000))
            .join()
            .unwrap();
        clear_redirect();
        assert_eq!(redirected(4096 + 100), 4096 + 100);
    }

    #[test]
    fn prefetch_of_any_slice_is_harmless() {
        to_l2::<u8>(&[]);
        to_l2(&[1u64; 33]);
    }
}
