//! Cache hints: ask the CPU to bring a range towards the core (into L2) without waiting for it;
//! and whether the weight-streaming kernels issue their own hints ahead of the bytes they read
//! ([`KernelPrefetch`]), which pays on some CPUs and costs on others (`prefetch_probe` measures
//! it).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Which kernel families prefetch their weights ahead (`prefetcht0` 2 KiB and `prefetcht1`
/// 16 KiB ahead of each row group: `dot::simd::prefetch_ahead`), by how they lay out the bytes
/// they stream. A hint only: the results are the same bits either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelPrefetch {
    /// Repacked Q4_0/Q4_1/Q8_0 (and Q5_0) records (`dot::packed`, its AVX-512 VNNI kernel; the AVX2 one
    /// never prefetches): one contiguous stream per task.
    pub repacked: bool,
    /// File-layout Q4_0/Q4_1/Q8_0 tiles: a tile's scales and quants are two streams.
    pub split: bool,
    /// Super-block bodies (the K-quants, Q5_0, Q5_1): one contiguous stream per row group.
    pub superblock: bool,
}

impl KernelPrefetch {
    /// Every family prefetches (the setting before any probe or flag).
    pub const ALL: KernelPrefetch = KernelPrefetch {
        repacked: true,
        split: true,
        superblock: true,
    };
    /// No family prefetches.
    pub const NONE: KernelPrefetch = KernelPrefetch {
        repacked: false,
        split: false,
        superblock: false,
    };

    /// `repacked`/`split`/`superblock` as on/off, e.g. `repacked off, split on, superblock on`.
    pub fn describe(self) -> String {
        let o = |b: bool| if b { "on" } else { "off" };
        format!(
            "repacked {}, split {}, superblock {}",
            o(self.repacked),
            o(self.split),
            o(self.superblock)
        )
    }
}

static REPACKED: AtomicBool = AtomicBool::new(true);
static SPLIT: AtomicBool = AtomicBool::new(true);
static SUPERBLOCK: AtomicBool = AtomicBool::new(true);

/// Sets which kernel families prefetch, for the whole process (the kernels read it per call).
pub fn set_kernel(p: KernelPrefetch) {
    REPACKED.store(p.repacked, Relaxed);
    SPLIT.store(p.split, Relaxed);
    SUPERBLOCK.store(p.superblock, Relaxed);
}

/// Which kernel families prefetch now.
pub fn kernel() -> KernelPrefetch {
    KernelPrefetch {
        repacked: repacked(),
        split: split(),
        superblock: superblock(),
    }
}

/// Whether the repacked kernels prefetch ([`KernelPrefetch::repacked`]).
#[inline]
pub fn repacked() -> bool {
    REPACKED.load(Relaxed)
}

/// Whether the split-tile kernels prefetch ([`KernelPrefetch::split`]).
#[inline]
pub fn split() -> bool {
    SPLIT.load(Relaxed)
}

/// Whether the super-block kernels prefetch ([`KernelPrefetch::superblock`]).
#[inline]
pub fn superblock() -> bool {
    SUPERBLOCK.load(Relaxed)
}

/// One address inside `w` in each 64-byte line that `w` touches (the first at its start, then
/// each following line's first byte), so an unaligned slice's last line is not missed.
fn lines<T>(w: &[T]) -> impl Iterator<Item = *const u8> + '_ {
    let base = w.as_ptr() as *const u8;
    let start = base as usize;
    let len = std::mem::size_of_val(w);
    // An empty slice touches no line (its pointer may dangle: CLFLUSH on it would fault).
    let end = if len == 0 { start & !63 } else { start + len };
    (start & !63..end)
        .step_by(64)
        .map(move |l| base.wrapping_add(l.max(start) - start))
}

/// Issues a `prefetcht1` for every 64-byte line of `w`. A hint: it never faults and changes no
/// value, only when the bytes arrive.
pub fn to_l2<T>(w: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        for p in lines(w) {
            // SAFETY: PREFETCHT1 is a hint that never faults; SSE is part of the x86_64
            // baseline; the address is inside the live slice `w`.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    p as *const i8,
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = w;
}

/// Flushes every 64-byte line of `w` from all cache levels (`clflush`, then a fence): for probes
/// that want some bytes cold and the rest warm. Changes no value.
pub fn evict<T>(w: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        for p in lines(w) {
            // SAFETY: CLFLUSH (SSE2, x86_64 baseline) on an address inside the live slice `w`;
            // it writes a dirty line back and never changes a value.
            unsafe { std::arch::x86_64::_mm_clflush(p) };
        }
        // SAFETY: MFENCE is SSE2 (x86_64 baseline); it orders the flushes before what follows.
        unsafe { std::arch::x86_64::_mm_mfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = w;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Held by the tests that set the process-wide [`KernelPrefetch`] and read it back.
    pub(crate) static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn kernel_setting_reads_back_per_family() {
        let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        for p in [
            KernelPrefetch::NONE,
            KernelPrefetch {
                repacked: false,
                split: true,
                superblock: false,
            },
            KernelPrefetch::ALL,
        ] {
            set_kernel(p);
            assert_eq!(kernel(), p);
            assert_eq!(
                (repacked(), split(), superblock()),
                (p.repacked, p.split, p.superblock)
            );
        }
        assert_eq!(
            KernelPrefetch::ALL.describe(),
            "repacked on, split on, superblock on"
        );
    }

    #[test]
    fn prefetch_of_any_slice_is_harmless() {
        super::to_l2::<f32>(&[]);
        super::to_l2(&[1.0f32; 33]);
    }

    #[test]
    fn every_line_a_slice_touches_is_named_once() {
        let buf = vec![0u8; 512];
        let at = buf.as_ptr() as usize;
        let off = (64 - at % 64) % 64 + 60; // 4 bytes before a line boundary
        let w = &buf[off..off + 70]; // 4 + 64 + 2 bytes: three lines
        let got: Vec<usize> = super::lines(w).map(|p| p as usize).collect();
        let s = w.as_ptr() as usize;
        assert_eq!(got, vec![s, s + 4, s + 68]);
        assert_eq!(super::lines::<u8>(&[]).count(), 0);
        assert_eq!(super::lines(&buf[off + 4..off + 68]).count(), 1);
    }

    #[test]
    fn evicting_changes_no_value() {
        let mut v: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
        v[7] = -3.0; // a dirty line: written back, not lost
        super::evict::<f32>(&[]);
        super::evict(&v);
        assert_eq!(v[7], -3.0);
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, &x)| i == 7 || x == i as f32 * 0.5));
    }
}
