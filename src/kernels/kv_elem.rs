//! The element types a KV cache stores (`f32`, IEEE `f16` as llama.cpp stores it by default, or
//! `bf16`) and how the attention kernels read them: one scalar conversion for the reference, and
//! one 8-wide load to f32 for the AVX2 kernel (`vcvtph2ps` for f16, a 16-bit shift for bf16; both
//! exact). Storing rounds to nearest-even (`half`'s `from_f32`); every stored value converts back
//! to f32 exactly, so the f32-operand kernels over an f16 or bf16 cache equal them over an f32
//! cache holding the same rounded values, bit for bit. A bf16 cache also lets decode run the
//! `vdpbf16ps` kernel ([`super::attention_bf16`]), which reaches its rows through
//! [`KvElem::as_bf16`].

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// A value type of the KV cache.
pub trait KvElem: Copy + Default + Send + Sync + 'static {
    /// Bytes per stored value.
    const BYTES: usize;
    /// The name `run --json` reports for the cache (`kv`).
    const NAME: &'static str;
    /// The stored value of `x` (rounded to nearest-even for f16).
    fn from_f32(x: f32) -> Self;
    /// The stored value as f32 (exact).
    fn to_f32(self) -> f32;
    /// `dst[i] = from_f32(src[i])` for a whole row (the cache's store; f16 converts 8 at a time).
    fn store(dst: &mut [Self], src: &[f32]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(x);
        }
    }
    /// Values `p[0..8]` as f32.
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C; `p .. p + 8` must be readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> __m256;
    /// The rows as bf16 when that is what they are (the bf16 decode kernel's input), else `None`.
    fn as_bf16(rows: &[Self]) -> Option<&[half::bf16]> {
        let _ = rows;
        None
    }
}

impl KvElem for f32 {
    const BYTES: usize = 4;
    const NAME: &'static str = "f32";
    #[inline]
    fn from_f32(x: f32) -> f32 {
        x
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller guarantees 8 readable floats at p.
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl KvElem for half::f16 {
    const BYTES: usize = 2;
    const NAME: &'static str = "f16";
    #[inline]
    fn from_f32(x: f32) -> half::f16 {
        half::f16::from_f32(x)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn store(dst: &mut [half::f16], src: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        // Same rounding as `from_f32` (nearest-even), with F16C 8 values at a time when present.
        dst.convert_from_f32_slice(&src[..dst.len()]);
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const half::f16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable halves (16 bytes) at p; f16 is 2 plain bytes.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

impl KvElem for half::bf16 {
    const BYTES: usize = 2;
    const NAME: &'static str = "bf16";
    #[inline]
    fn from_f32(x: f32) -> half::bf16 {
        half::bf16::from_f32(x)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const half::bf16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable bf16 (16 bytes) at p; a bf16 is the upper
        // half of the f32 with the same bits, so widening and shifting by 16 is exact.
        unsafe {
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
        }
    }
    fn as_bf16(rows: &[half::bf16]) -> Option<&[half::bf16]> {
        Some(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// The vector load converts every f16 bit pattern (finite ones) to the scalar conversion's f32.
    #[test]
    fn the_vector_load_equals_the_scalar_conversion() {
        if !crate::kernels::Isa::Avx2.available() {
            println!("SKIP: this CPU has no AVX2/F16C");
            return;
        }
        let all: Vec<f16> = (0..=u16::MAX)
            .map(f16::from_bits)
            .filter(|h| h.is_finite())
            .collect();
        for c in all.chunks_exact(8) {
            let mut got = [0f32; 8];
            // SAFETY: AVX2/F16C checked above; c holds 8 values.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), f16::load8(c.as_ptr())) };
            for (g, h) in got.iter().zip(c) {
                assert_eq!(g.to_bits(), h.to_f32().to_bits(), "{:#06x}", h.to_bits());
            }
        }
    }

    /// The row store (8 at a time for f16) equals `from_f32` value by value, ties and tails
    /// included.
    #[test]
    fn the_row_store_equals_the_scalar_rounding() {
        let mut rng = crate::rng::Rng::new(3);
        let mut src = rng.fill(197, 8.0);
        src.extend([1.0 + 1.0 / 2048.0, 65520.0, -7e-8, 0.0, -0.0]);
        let mut dst = vec![f16::ZERO; src.len()];
        <f16 as KvElem>::store(&mut dst, &src);
        for (d, &x) in dst.iter().zip(&src) {
            assert_eq!(d.to_bits(), f16::from_f32(x).to_bits(), "{x}");
        }
    }

    /// The bf16 vector load widens every finite bf16 exactly as the scalar conversion does, and
    /// the row store rounds as `from_f32` (nearest-even: 1 + 2^-8 is a tie, kept at 1).
    #[test]
    fn bf16_loads_and_stores_equal_the_scalar_conversions() {
        use half::bf16;
        if !crate::kernels::Isa::Avx2.available() {
            println!("SKIP: this CPU has no AVX2");
            return;
        }
        let all: Vec<bf16> = (0..=u16::MAX)
            .map(bf16::from_bits)
            .filter(|h| h.is_finite())
            .collect();
        for c in all.chunks_exact(8) {
            let mut got = [0f32; 8];
            // SAFETY: AVX2 checked above; c holds 8 values.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), bf16::load8(c.as_ptr())) };
            for (g, h) in got.iter().zip(c) {
                assert_eq!(g.to_bits(), h.to_f32().to_bits(), "{:#06x}", h.to_bits());
            }
        }
        let src = [0.1f32, -3.3e-5, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, 3e38];
        let mut dst = vec![bf16::ZERO; src.len()];
        <bf16 as KvElem>::store(&mut dst, &src);
        for (d, &x) in dst.iter().zip(&src) {
            assert_eq!(d.to_bits(), bf16::from_f32(x).to_bits(), "{x}");
        }
        assert_eq!(dst[2].to_f32(), 1.0);
        assert_eq!(dst[3].to_f32(), 1.0 + 4.0 / 256.0);
        assert!(<bf16 as KvElem>::as_bf16(&dst).is_some());
        assert!(<f16 as KvElem>::as_bf16(&[f16::ZERO]).is_none());
    }

    /// Rounding is to nearest-even and the round trip of a stored value is exact.
    #[test]
    fn stored_values_round_trip() {
        for x in [0.1f32, -3.3e-5, 65504.0, 1.0 + 1.0 / 4096.0, 7e-8] {
            let s = f16::from_f32(x);
            assert_eq!(<f16 as KvElem>::from_f32(s.to_f32()), s);
        }
        // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1).
        assert_eq!(<f16 as KvElem>::from_f32(1.0 + 1.0 / 2048.0).to_f32(), 1.0);
    }
}
