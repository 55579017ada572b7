//! Q5_0 and Q5_1 (GGUF blocks of 32 five-bit levels; Q5_1 adds a minimum), their kernels side
//! by side: one body serves both types on each ISA (`ONE`/`q` selects Q5_1's minimum).
//!
//! * `scalar`: the reference, ggml's `vec_dot_q5_0_q8_0` / `vec_dot_q5_1_q8_1` arithmetic.
//! * `avx2`: rows in groups of 4 against the activation's Q8 blocks (what decode runs, through
//!   `kquant_avx2::tile_matvec`, also when `--isa avx512` asks for Q5_1).
//! * `avx512`: Q5_0's AVX-512 VNNI + VBMI kernel (decode of Q5_0 where the CPU has both).
//!
//! The tile dispatch in front of them and the row-group helpers they share are in
//! `kquant_scalar`, `kquant_avx2` and `kquant_avx512`; prefill's batched kernels in
//! `kquant_batch` (and `kquant_amx`), the repacked Q5_0 kernels in `packed`. All are tested
//! against `scalar` by `testutil::check_kernel`.

/// The scalar reference.
pub mod scalar {
    use crate::quant::{f16_at, QuantType};

    /// The 32 5-bit levels of a Q5_0/Q5_1 block (unsigned, 0..32) and the offset of `qh`.
    #[inline]
    pub fn q5_levels(q: QuantType, blk: &[u8]) -> [u8; 32] {
        let off = if q == QuantType::Q5_1 { 4 } else { 2 };
        let qh = u32::from_le_bytes([blk[off], blk[off + 1], blk[off + 2], blk[off + 3]]);
        let qs = &blk[off + 4..off + 20];
        let mut l = [0u8; 32];
        for j in 0..16 {
            l[j] = (qs[j] & 0xF) | ((((qh >> j) & 1) as u8) << 4);
            l[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
        }
        l
    }

    /// Q5_0 · Q8_0 (d_w·d_x·Σ(q−16)·x_q) or Q5_1 · Q8_1 (d_w·d_x·Σq·x_q + m·s_x).
    #[inline]
    pub(in crate::kernels::dot) fn dot_q5_q8(
        q: QuantType,
        blk: &[u8],
        xd: f32,
        xs: f32,
        xb: &[i8],
    ) -> f32 {
        let l = q5_levels(q, blk);
        let d = f16_at(blk, 0);
        if q == QuantType::Q5_0 {
            let s: i32 = l
                .iter()
                .zip(xb)
                .map(|(&l, &x)| (l as i32 - 16) * x as i32)
                .sum();
            s as f32 * d * xd
        } else {
            let m = f16_at(blk, 2);
            let s: i32 = l.iter().zip(xb).map(|(&l, &x)| l as i32 * x as i32).sum();
            s as f32 * d * xd + m * xs
        }
    }
}

/// AVX2 + FMA + F16C (see `kquant_avx2` for the row groups).
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use crate::kernels::dot::kquant_avx2::*;
    use crate::kernels::dot::simd::*;
    use crate::quant::QK;
    use std::arch::x86_64::*;

    /// 0xFF in byte i where bit i of the little-endian u32 at `p` is set.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::kernels::dot) unsafe fn q5_bits(p: *const u8) -> __m256i {
        let v = _mm256_set1_epi32(p.cast::<i32>().read_unaligned());
        let shuf = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let b = _mm256_shuffle_epi8(v, shuf);
        let m = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(b, m), m)
    }

    /// Rows `r0..r0 + R` of Q5_0 · Q8_0 (`ONE` false) or Q5_1 · Q8_1 blocks. Per block the
    /// activation quants are loaded once for the group. Q5_0's `q − 16` goes through the unsigned
    /// levels: `Σ q·y − Σ 16·y` per pair of bytes, in i16, is exactly the pair sum of the
    /// sign-trick product `|q − 16| · sign(y, q − 16)` (no saturation: |Σ| ≤ 2·31·127).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::kernels::dot) unsafe fn q5_group<const ONE: bool, const R: usize>(
        r0: usize,
        t: Rows,
        xd: *const f32,
        xs: *const f32,
        xq: *const i8,
    ) {
        if crate::kernels::prefetch::superblock() {
            prefetch_ahead(t.qs.add(r0 * t.rb), R * t.rb);
        }
        let bb = if ONE { 24 } else { 22 };
        let off = if ONE { 4 } else { 2 };
        let m4 = _mm256_set1_epi8(0x0F);
        // The 16 packed bytes sit in both 128-bit halves (`vbroadcasti128`, a load with no shuffle);
        // shifting the high half's 64-bit lanes by 4 puts the high nibbles there, so one `vpand`
        // gives [low nibbles | high nibbles] (was two 128-bit ands, a shift and a `vinserti128`).
        let nib_shift = _mm256_setr_epi64x(0, 0, 4, 4);
        let b16 = _mm256_set1_epi8(0x10);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut mins = _mm_setzero_ps();
        let mut dd = Lanes4([0.0; 4]);
        for b in 0..t.nb {
            let yv = _mm256_loadu_si256(xq.add(b * QK) as *const __m256i);
            let y16 = _mm256_maddubs_epi16(b16, yv);
            // Each row's scale is broadcast from memory (a load, not a shuffle-port `vpermps`).
            _mm_store_ps(
                dd.0.as_mut_ptr(),
                _mm_mul_ps(f16_lanes::<R>(t, r0, bb, b, 0), _mm_set1_ps(*xd.add(b))),
            );
            if ONE {
                let m = f16_lanes::<R>(t, r0, bb, b, 2);
                mins = _mm_add_ps(mins, _mm_mul_ps(m, _mm_set1_ps(*xs.add(b))));
            }
            for (i, a) in acc.iter_mut().enumerate() {
                let p = t.qs.add((r0 + i) * t.rb + b * bb);
                let bits = q5_bits(p.add(off));
                let q =
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(off + 4) as *const __m128i));
                let nib = _mm256_and_si256(_mm256_srlv_epi64(q, nib_shift), m4);
                let qv = _mm256_or_si256(nib, _mm256_and_si256(bits, b16));
                let s = _mm256_maddubs_epi16(qv, yv);
                let s = if ONE { s } else { _mm256_sub_epi16(s, y16) };
                let p32 = _mm256_madd_epi16(s, ones);
                *a = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd.0[i]), _mm256_cvtepi32_ps(p32), *a);
            }
        }
        finish::<R>(&acc, mins, false, t.y.add(r0));
    }
}

/// AVX-512 F + BW + VNNI + VBMI: Q5_0 only.
#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use crate::kernels::dot::kquant_avx2::{row_groups, Rows};
    use crate::kernels::dot::simd::prefetch_ahead;
    use std::arch::x86_64::*;

    /// Whether this CPU runs [`q5_0`]: AVX-512 F, BW, VNNI and VBMI (`vpermb`), asked once.
    pub fn q5_0_available() -> bool {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| {
            crate::kernels::dot::Isa::Avx512.has_vnni() && is_x86_feature_detected!("avx512vbmi")
        })
    }

    /// Bytes of one Q5_0 block: `d` (f16), `qh` (4 bytes), 16 packed bytes.
    const Q5_0_BLOCK: usize = 22;

    /// `vpermb` indices of a Q5_0 block pair: quarters 0–1 are the first block's packed bytes
    /// (offset 6), quarters 2–3 the second's (offset 22 + 6).
    const Q5_0_PERM: [u8; 64] = {
        let mut t = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            let base = if i < 32 { 6 } else { 28 };
            t[i] = (base + i % 16) as u8;
            i += 1;
        }
        t
    };

    /// `vpermw` indices: words 0–7 the first block's `d` (word 0), 8–15 the second's (word 11).
    const Q5_0_SCALES: [u16; 32] = {
        let mut t = [0u16; 32];
        let mut i = 8;
        while i < 16 {
            t[i] = 11;
            i += 1;
        }
        t
    };

    /// `y[r] += W[r]·x` for a Q5_0 tile on the integer path (see the module docs).
    ///
    /// # Safety
    /// [`q5_0_available`]; `qs` holds `rows` rows of `cols / 32` blocks; the activation's blocks
    /// cover `cols`; `y.len() >= rows`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    pub unsafe fn q5_0(
        rows: usize,
        cols: usize,
        qs: &[u8],
        xq: crate::kernels::dot::XqBlocks,
        y: &mut [f32],
    ) {
        let nb = cols / crate::quant::QK;
        let (d, _, x) = xq;
        let t = Rows {
            qs: qs.as_ptr(),
            rb: nb * Q5_0_BLOCK,
            nb,
            y: y.as_mut_ptr(),
        };
        row_groups!(rows, q5_0_rows(t, d.as_ptr(), x.as_ptr()));
    }

    /// Rows `r0..r0 + R` of [`q5_0`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi,avx2,fma,f16c")]
    unsafe fn q5_0_rows<const R: usize>(r0: usize, t: Rows, xd: *const f32, x: *const i8) {
        if crate::kernels::prefetch::superblock() {
            prefetch_ahead(t.qs.add(r0 * t.rb), R * t.rb);
        }
        let perm = _mm512_loadu_si512(Q5_0_PERM.as_ptr() as *const _);
        let pscale = _mm512_loadu_si512(Q5_0_SCALES.as_ptr() as *const _);
        let shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
        let m4 = _mm512_set1_epi8(0x0F);
        let b16 = _mm512_set1_epi8(16);
        let zero = _mm512_setzero_si512();
        let mut acc = [_mm512_setzero_ps(); R];
        let mut b = 0;
        while b < t.nb {
            // A pair of blocks, or the last block alone (the upper lanes then load zeros: zero
            // levels, activations and scales, so they add nothing).
            let two = b + 1 < t.nb;
            let (wmask, xmask): (u64, u64) = if two {
                ((1 << (2 * Q5_0_BLOCK)) - 1, u64::MAX)
            } else {
                ((1 << Q5_0_BLOCK) - 1, u32::MAX as u64)
            };
            let yv = _mm512_maskz_loadu_epi8(xmask, x.add(b * 32));
            let ny16 = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, b16, yv));
            let dx1 = if two { *xd.add(b + 1) } else { 0.0 };
            // (`vinsertf64x4` on the bits: `vinsertf32x8` would need AVX-512 DQ.)
            let dx = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castps_pd(_mm512_set1_ps(*xd.add(b))),
                _mm256_castps_pd(_mm256_set1_ps(dx1)),
            ));
            for (i, a) in acc.iter_mut().enumerate() {
                let p = t.qs.add((r0 + i) * t.rb + b * Q5_0_BLOCK);
                let raw = _mm512_maskz_loadu_epi8(wmask, p as *const i8);
                let lv = _mm512_permutexvar_epi8(perm, raw);
                let nib = _mm512_and_si512(_mm512_srlv_epi64(lv, shift), m4);
                let h0 = p.add(2).cast::<u32>().read_unaligned() as u64;
                let h1 = if two {
                    p.add(Q5_0_BLOCK + 2).cast::<u32>().read_unaligned() as u64
                } else {
                    0
                };
                let u = _mm512_mask_add_epi8(nib, h0 | (h1 << 32), nib, b16);
                let dot = _mm512_dpbusd_epi32(ny16, u, yv);
                let dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(
                    pscale, raw,
                )));
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, dx), *a);
            }
            b += 2;
        }
        for (i, a) in acc.iter().enumerate() {
            *t.y.add(r0 + i) += _mm512_reduce_add_ps(*a);
        }
    }
}
