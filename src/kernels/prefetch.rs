//! Cache hints: ask the CPU to bring a range towards the core (into L2) without waiting for it.

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

#[cfg(test)]
mod tests {
    #[test]
    fn prefetch_of_any_slice_is_harmless() {
        super::to_l2::<f32>(&[]);
        super::to_l2(&[1.0f32; 33]);
    }
}
