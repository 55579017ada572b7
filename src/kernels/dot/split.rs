//! The split layout's block types (`quant`: per-row block scales, then the quants): Q4_0, Q4_1
//! and Q8_0, with the scalar reference (`scalar`) and its AVX2 (`avx2`) and AVX-512 (`avx512`,
//! F + BW, and a VNNI build) versions side by side. The three share one kernel body per ISA,
//! generic over the type (`K_Q4_0`, `K_Q4_1`, `K_Q8_0`). Each ISA's tile entry (`tile_matvec`)
//! also takes the layout's float types, F16 and F32, whose kernels are in `float`. The ISA
//! dispatch in front of them is `dot::tile_matvec` (tests, benches) and `dot::select` (the
//! engine); every SIMD kernel is tested against `scalar` by `testutil::check_kernel`.

pub mod scalar {
    //! Scalar reference kernels: the ground truth every SIMD path is tested against.

    use super::super::{Tile, XqRef};
    use crate::quant::{f16_at, QuantType, QK};

    /// Scalar `y[r] += W[r]·x` over one tile; integer path when `xq` is given for block types.
    pub fn tile_matvec(t: Tile, x: &[f32], xq: XqRef, y: &mut [f32]) {
        let Tile {
            quant: q,
            rows,
            cols,
            scales,
            qs,
        } = t;
        if !q.is_blocked() {
            return super::super::float::scalar::tile_matvec(t, x, y);
        }
        let nb = cols / QK;
        let sb = q.scale_bytes_per_block();
        let qb = q.quant_bytes_per_block();
        for (r, yr) in y.iter_mut().enumerate().take(rows) {
            let mut acc = 0f32;
            let rs = &scales[r * nb * sb..(r + 1) * nb * sb];
            let rq = &qs[r * nb * qb..(r + 1) * nb * qb];
            for b in 0..nb {
                let bq = &rq[b * qb..(b + 1) * qb];
                if let Some((xd, xs, xqs)) = xq {
                    let xb = &xqs[b * QK..(b + 1) * QK];
                    acc += dot_block_int(q, rs, b, bq, xd[b], xs[b], xb);
                } else {
                    let xb = &x[b * QK..(b + 1) * QK];
                    acc += dot_block_f32(q, rs, b, bq, xb);
                }
            }
            *yr += acc;
        }
    }

    #[inline]
    fn dot_block_f32(q: QuantType, rs: &[u8], b: usize, bq: &[u8], xb: &[f32]) -> f32 {
        match q {
            QuantType::Q4_0 => {
                let d = f16_at(rs, 2 * b);
                let mut s = 0f32;
                for j in 0..16 {
                    s += ((bq[j] & 0x0F) as i32 - 8) as f32 * xb[j];
                    s += ((bq[j] >> 4) as i32 - 8) as f32 * xb[j + 16];
                }
                s * d
            }
            QuantType::Q4_1 => {
                let d = f16_at(rs, 4 * b);
                let m = f16_at(rs, 4 * b + 2);
                let (mut s, mut sx) = (0f32, 0f32);
                for j in 0..16 {
                    s += (bq[j] & 0x0F) as f32 * xb[j];
                    s += (bq[j] >> 4) as f32 * xb[j + 16];
                    sx += xb[j] + xb[j + 16];
                }
                s * d + m * sx
            }
            QuantType::Q8_0 => {
                let d = f16_at(rs, 2 * b);
                let mut s = 0f32;
                for j in 0..QK {
                    s += (bq[j] as i8) as f32 * xb[j];
                }
                s * d
            }
            _ => unreachable!("not a block type"),
        }
    }

    #[inline]
    fn dot_block_int(
        q: QuantType,
        rs: &[u8],
        b: usize,
        bq: &[u8],
        xd: f32,
        xs: f32,
        xb: &[i8],
    ) -> f32 {
        match q {
            QuantType::Q4_0 => {
                let d = f16_at(rs, 2 * b);
                let mut s = 0i32;
                for j in 0..16 {
                    s += ((bq[j] & 0x0F) as i32 - 8) * xb[j] as i32;
                    s += ((bq[j] >> 4) as i32 - 8) * xb[j + 16] as i32;
                }
                s as f32 * d * xd
            }
            QuantType::Q4_1 => {
                let d = f16_at(rs, 4 * b);
                let m = f16_at(rs, 4 * b + 2);
                let mut s = 0i32;
                for j in 0..16 {
                    s += (bq[j] & 0x0F) as i32 * xb[j] as i32;
                    s += (bq[j] >> 4) as i32 * xb[j + 16] as i32;
                }
                s as f32 * d * xd + m * xs
            }
            QuantType::Q8_0 => {
                let d = f16_at(rs, 2 * b);
                let mut s = 0i32;
                for j in 0..QK {
                    s += (bq[j] as i8) as i32 * xb[j] as i32;
                }
                s as f32 * d * xd
            }
            _ => unreachable!("not a block type"),
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    //! AVX2 + FMA + F16C tile kernels (x86_64 only).
    //!
    //! Layout of the hot loops (see `dot`'s module docs for the tile contract):
    //! * Columns are walked in *chunks* of up to 8 blocks (256 columns, one full tile width). Per chunk
    //!   and per row the block scales are converted once with `vcvtph2ps` (8 blocks at a time; partial
    //!   chunks use one masked full-width load when it stays inside the slice) and pre-multiplied by
    //!   the activation block scale.
    //! * Rows are processed 4 at a time so that every activation load is shared by 4 weight rows; the
    //!   row tails (1–3 rows) use the same generic code with a smaller `R`.
    //! * Integer path (activation pre-quantized to Q8), Q4: two blocks per step. Once per chunk the
    //!   activation bytes of each block pair are regrouped as `[b: 0..16 | b+1: 0..16]` and
    //!   `[b: 16..32 | b+1: 16..32]`; then per row one 32-byte load of the two blocks' packed quants
    //!   gives the low nibbles (`vpand`) and high nibbles (`vpsrlw` + `vpand`) in exactly that order.
    //!   The *unsigned* nibbles go straight into `vpmaddubsw` (u8 × i8), the two i16 results are added
    //!   (no overflow), `vpmaddwd` by 1. The offset of
    //!   Q4_0 (−8) and the minimum of Q4_1 (`m`) are applied per block in float as `−8·d·s` resp. `m·s`,
    //!   with `s = d_x·Σq_x` from [`crate::kernels::dot::Q8Act`], folded into the row accumulator's initial value
    //!   with one vector multiply per 8 blocks — no `vpsignb` pair and no per-block offset subtraction.
    //!   For full 8-block chunks the four per-pair sums are folded with `vphaddd` into per-block sums
    //!   and scaled with one FMA; partial chunks scale each pair with `[d_b ×4, d_b+1 ×4]`.
    //!   A lone trailing block uses `vbroadcasti128` + `vpsrlvd` (shift 0 | 4) + `vpand`.
    //! * Integer path, Q8_0: the sign trick (`|w|` × `sign(x, w)`); chunks of 4 or 8 blocks fold each
    //!   row's per-block integer sums with `vphaddd` and scale them with one FMA per chunk, other
    //!   block counts take one convert + FMA per block.
    //! * f32 path: dequantization fused into FMAs; the Q4 offset/minimum is applied through the
    //!   per-block activation sums `Σx` in the same way.
    //!
    //! Safety contract of every private `unsafe fn` in this module: it is reached only from this
    //! module's public `tile_matvec` (whose callers, `dot::tile_matvec` and `dot::select`, have detected the CPU
    //! features named in its `#[target_feature]` and checked the slice lengths with `check_tile`), and
    //! it reads/writes only inside the tile's `scales`, `qs`, activation and `y` ranges derived from
    //! those lengths (masked loads for partial block pairs; full-width scale loads only when they stay
    //! inside the `scales` slice).

    use super::super::simd::{hsum_block, prefetch_ahead, reduce4};
    use super::super::{Tile, XqRef};
    use core::arch::x86_64::*;

    use crate::quant::{QuantType, QK};

    /// Blocks per column chunk.
    pub(super) const CHUNK: usize = 8;

    pub(super) const K_Q4_0: u8 = 0;
    pub(super) const K_Q4_1: u8 = 1;
    pub(super) const K_Q8_0: u8 = 2;

    /// 32-byte aligned scratch for per-row scales.
    #[derive(Clone, Copy)]
    #[repr(C, align(32))]
    pub(super) struct Lanes(pub(super) [f32; 8]);

    /// `y[r] += W[r]·x` for one tile (AVX2). Integer path when `xq` is given for a block type.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and the slices must satisfy the tile contract checked
    /// by `dot::check_tile` (`cols % 32 == 0` for block types, any `cols` for F16/F32,
    /// `scales`/`qs` hold `rows × cols` weights of type `q`,
    /// `x.len() >= cols` unless the integer path is taken, `xq` covers `cols`, `y.len() >= rows`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile_matvec(t: Tile, x: &[f32], xq: XqRef, y: &mut [f32]) {
        let Tile {
            quant: q,
            rows,
            cols,
            scales,
            qs,
        } = t;
        let nb = cols / QK;
        let t = RawTile {
            rows,
            nb,
            cols,
            scales: scales.as_ptr(),
            scales_len: scales.len(),
            qs: qs.as_ptr(),
            y: y.as_mut_ptr(),
        };
        match q {
            QuantType::F32 => super::super::float::avx2::f32_rows(&t, x.as_ptr()),
            QuantType::F16 => super::super::float::avx2::f16_rows(&t, x.as_ptr()),
            _ => {
                let k = match q {
                    QuantType::Q4_0 => K_Q4_0,
                    QuantType::Q4_1 => K_Q4_1,
                    _ => K_Q8_0,
                };
                match (k, xq) {
                    (K_Q4_0, Some(a)) => blocked::<K_Q4_0, true>(&t, Act::int(a)),
                    (K_Q4_1, Some(a)) => blocked::<K_Q4_1, true>(&t, Act::int(a)),
                    (_, Some(a)) => blocked::<K_Q8_0, true>(&t, Act::int(a)),
                    (K_Q4_0, None) => blocked::<K_Q4_0, false>(&t, Act::f32(x)),
                    (K_Q4_1, None) => blocked::<K_Q4_1, false>(&t, Act::f32(x)),
                    (_, None) => blocked::<K_Q8_0, false>(&t, Act::f32(x)),
                }
            }
        }
    }

    /// Raw view of one tile (validated by the caller).
    pub(in crate::kernels::dot) struct RawTile {
        pub(in crate::kernels::dot) rows: usize,
        pub(in crate::kernels::dot) nb: usize,
        /// Columns (= 32·nb for block types; any width for F16/F32).
        pub(in crate::kernels::dot) cols: usize,
        pub(in crate::kernels::dot) scales: *const u8,
        /// Length of the `scales` slice in bytes.
        pub(in crate::kernels::dot) scales_len: usize,
        pub(in crate::kernels::dot) qs: *const u8,
        pub(in crate::kernels::dot) y: *mut f32,
    }

    impl RawTile {
        /// The view of a `rows × cols` tile's slices and its output.
        pub(super) fn new(
            rows: usize,
            cols: usize,
            scales: &[u8],
            qs: &[u8],
            y: &mut [f32],
        ) -> RawTile {
            RawTile {
                rows,
                nb: cols / QK,
                cols,
                scales: scales.as_ptr(),
                scales_len: scales.len(),
                qs: qs.as_ptr(),
                y: y.as_mut_ptr(),
            }
        }
    }

    /// Activation pointers: f32 `x`, or Q8 blocks (`d`, `s`, `qs`).
    #[derive(Clone, Copy)]
    pub(super) struct Act {
        pub(super) x: *const f32,
        pub(super) d: *const f32,
        pub(super) s: *const f32,
        pub(super) q: *const i8,
    }

    impl Act {
        pub(super) fn int(a: (&[f32], &[f32], &[i8])) -> Act {
            Act {
                x: core::ptr::null(),
                d: a.0.as_ptr(),
                s: a.1.as_ptr(),
                q: a.2.as_ptr(),
            }
        }
        pub(super) fn f32(x: &[f32]) -> Act {
            Act {
                x: x.as_ptr(),
                d: core::ptr::null(),
                s: core::ptr::null(),
                q: core::ptr::null(),
            }
        }
    }

    pub(super) const fn scale_bytes(k: u8) -> usize {
        if k == K_Q4_1 {
            4
        } else {
            2
        }
    }

    pub(super) const fn quant_bytes(k: u8) -> usize {
        if k == K_Q8_0 {
            32
        } else {
            16
        }
    }

    /// Loads the `cn` (≤ 8) block scales of one row starting at `p` as (d, m) vectors (m = 0 for
    /// Q4_0/Q8_0); lanes ≥ `cn` are zero. `avail` = readable bytes from `p` to the end of the tile's
    /// scales: a partial chunk is loaded with one full-width load when that stays inside the slice
    /// (the excess lanes are masked off), otherwise through a small stack copy.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn load_scales<const K: u8>(
        p: *const u8,
        cn: usize,
        avail: usize,
    ) -> (__m256, __m256) {
        let sb = scale_bytes(K);
        let width = CHUNK * sb;
        let mut buf = [0u8; 32];
        let src = if cn == CHUNK || avail >= width {
            p
        } else {
            for (i, v) in buf.iter_mut().enumerate().take(cn * sb) {
                // SAFETY: the row holds `cn` blocks of `sb` scale bytes (tile contract).
                *v = *p.add(i);
            }
            buf.as_ptr()
        };
        let (d, m) = if K == K_Q4_1 {
            // 8 × u32 = (d | m << 16): split, pack to u16, fix the lane order, convert.
            let v = _mm256_loadu_si256(src as *const __m256i);
            let d = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
            let m = _mm256_srli_epi32::<16>(v);
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(d, m));
            (
                _mm256_cvtph_ps(_mm256_castsi256_si128(p)),
                _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(p)),
            )
        } else {
            let v = _mm_loadu_si128(src as *const __m128i);
            (_mm256_cvtph_ps(v), _mm256_setzero_ps())
        };
        if cn == CHUNK {
            (d, m)
        } else {
            let keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                _mm256_set1_epi32(cn as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            ));
            (_mm256_and_ps(d, keep), _mm256_and_ps(m, keep))
        }
    }

    /// Adds the `R` row accumulators into `y[0..R]`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::kernels::dot) unsafe fn store_rows<const R: usize>(
        acc: &[__m256; R],
        y: *mut f32,
    ) {
        let z = _mm256_setzero_ps();
        let g = |i: usize| if i < R { acc[i] } else { z };
        let s = reduce4(g(0), g(1), g(2), g(3));
        if R == 4 {
            _mm_storeu_ps(y, _mm_add_ps(_mm_loadu_ps(y), s));
        } else {
            let mut t = [0f32; 4];
            _mm_storeu_ps(t.as_mut_ptr(), s);
            for (i, v) in t.iter().enumerate().take(R) {
                *y.add(i) += v;
            }
        }
    }

    /// Tokens per block of [`tile_matmul_q4`] (its per-token activation buffers live on the stack).
    pub(super) const TB: usize = 32;

    /// Batched integer tile kernel for Q4_0/Q4_1 (prefill): for every token `j` of `xq`,
    /// `y[j·rows + r] += W[r]·x_j`. Each group of 4 rows is unpacked once per column chunk (nibbles
    /// split, scales converted) and applied to every token of the batch, so the unpacking and the
    /// scale conversion are paid once per batch instead of once per token. Per token the arithmetic
    /// is that of [`tile_matvec`]'s integer path, operation for operation, so the result is
    /// bit-identical to calling it once per token.
    ///
    /// # Safety
    /// As [`tile_matvec`] (integer path, `q` Q4_0 or Q4_1), for each token's `xq`;
    /// `y.len() >= xq.len() · rows`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile_matmul_q4(
        q: QuantType,
        rows: usize,
        cols: usize,
        scales: &[u8],
        qs: &[u8],
        xq: &[(&[f32], &[f32], &[i8])],
        y: &mut [f32],
    ) {
        let t = RawTile::new(rows, cols, scales, qs, y);
        let mut acts = [Act::f32(&[]); TB];
        for (tb0, blk) in xq.chunks(TB).enumerate() {
            for (a, x) in acts.iter_mut().zip(blk) {
                *a = Act::int(*x);
            }
            let yb = t.y.add(tb0 * TB * rows);
            match q {
                QuantType::Q4_0 => matmul_q4::<K_Q4_0>(&t, &acts[..blk.len()], yb),
                _ => matmul_q4::<K_Q4_1>(&t, &acts[..blk.len()], yb),
            }
        }
    }

    /// Up to [`TB`] tokens of [`tile_matmul_q4`]; `y` = the first token's output rows.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn matmul_q4<const K: u8>(t: &RawTile, acts: &[Act], y: *mut f32) {
        let n = acts.len();
        let mut amv = [_mm256_setzero_ps(); TB];
        let mut csv = [_mm256_setzero_ps(); TB];
        let mut xp = [[_mm256_setzero_si256(); CHUNK]; TB];
        let mut c0 = 0;
        while c0 < t.nb {
            let cn = CHUNK.min(t.nb - c0);
            // Per token: the chunk constants and the regrouped activation pairs of `blocked`.
            for j in 0..n {
                let a = acts[j];
                (amv[j], csv[j]) = chunk_consts::<K, true>(a, c0, cn);
                for p in 0..cn / 2 {
                    let b = c0 + 2 * p;
                    let y0 = _mm256_loadu_si256(a.q.add(b * QK) as *const __m256i);
                    let y1 = _mm256_loadu_si256(a.q.add((b + 1) * QK) as *const __m256i);
                    xp[j][2 * p] = _mm256_permute2x128_si256::<0x20>(y0, y1);
                    xp[j][2 * p + 1] = _mm256_permute2x128_si256::<0x31>(y0, y1);
                }
            }
            let ch = MmChunk {
                c0,
                cn,
                amv: &amv,
                csv: &csv,
                xp: &xp,
            };
            let mut r0 = 0;
            while r0 + 4 <= t.rows {
                if cn == CHUNK {
                    mm_group::<K, 4, CHUNK>(t, acts, r0, &ch, y);
                } else {
                    mm_group::<K, 4, 0>(t, acts, r0, &ch, y);
                }
                r0 += 4;
            }
            match t.rows - r0 {
                1 => mm_group::<K, 1, 0>(t, acts, r0, &ch, y),
                2 => mm_group::<K, 2, 0>(t, acts, r0, &ch, y),
                3 => mm_group::<K, 3, 0>(t, acts, r0, &ch, y),
                _ => {}
            }
            c0 += cn;
        }
    }

    /// Per-chunk, per-token state of [`matmul_q4`].
    struct MmChunk<'a> {
        c0: usize,
        cn: usize,
        amv: &'a [__m256; TB],
        csv: &'a [__m256; TB],
        xp: &'a [[__m256i; CHUNK]; TB],
    }

    /// `R` rows from `r0` of one chunk, for every token: unpack once, then per token the same
    /// operations as `group::<K, true, R, _>`.
    #[inline]
    #[allow(clippy::needless_range_loop)] // indices address several parallel arrays in the hot loop
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mm_group<const K: u8, const R: usize, const CN: usize>(
        t: &RawTile,
        acts: &[Act],
        r0: usize,
        ch: &MmChunk,
        y: *mut f32,
    ) {
        let (c0, cn) = (ch.c0, if CN > 0 { CN } else { ch.cn });
        let full = cn == CHUNK;
        let (sb, qb) = (scale_bytes(K), quant_bytes(K));
        let ones = _mm256_set1_epi16(1);
        let m4 = _mm256_set1_epi8(0x0F);
        let mut lo = [[_mm256_setzero_si256(); CHUNK / 2]; R];
        let mut hi = [[_mm256_setzero_si256(); CHUNK / 2]; R];
        let mut dm = [(_mm256_setzero_ps(), _mm256_setzero_ps()); R];
        let mut wp = [core::ptr::null::<u8>(); R];
        for i in 0..R {
            let r = r0 + i;
            let off = (r * t.nb + c0) * sb;
            dm[i] = load_scales::<K>(t.scales.add(off), cn, t.scales_len - off);
            wp[i] = t.qs.add((r * t.nb + c0) * qb);
            for p in 0..cn / 2 {
                let w = _mm256_loadu_si256(wp[i].add(p * 2 * qb) as *const __m256i);
                lo[i][p] = _mm256_and_si256(w, m4);
                hi[i][p] = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
            }
        }
        let unz = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
        for j in 0..acts.len() {
            let xp = &ch.xp[j];
            let mut acc = [_mm256_setzero_ps(); R];
            for i in 0..R {
                let (d, m) = dm[i];
                let dv = _mm256_mul_ps(d, ch.amv[j]);
                acc[i] = if K == K_Q4_0 {
                    _mm256_mul_ps(d, ch.csv[j])
                } else {
                    _mm256_mul_ps(m, ch.csv[j])
                };
                let pair = |p: usize| {
                    let s = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo[i][p], xp[2 * p]),
                        _mm256_maddubs_epi16(hi[i][p], xp[2 * p + 1]),
                    );
                    _mm256_madd_epi16(s, ones)
                };
                if full {
                    let h01 = _mm256_hadd_epi32(pair(0), pair(1));
                    let h23 = _mm256_hadd_epi32(pair(2), pair(3));
                    let h = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(h01, h23), unz);
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), dv, acc[i]);
                } else {
                    let mut idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
                    for p in 0..cn / 2 {
                        let dp = _mm256_permutevar8x32_ps(dv, idx);
                        idx = _mm256_add_epi32(idx, _mm256_set1_epi32(2));
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair(p)), dp, acc[i]);
                    }
                    if cn % 2 == 1 {
                        // A lone trailing block, as in `group`.
                        let b = cn - 1;
                        let mut dd = Lanes([0.0; 8]);
                        _mm256_store_ps(dd.0.as_mut_ptr(), dv);
                        let xv = _mm256_loadu_si256(acts[j].q.add((c0 + b) * QK) as *const __m256i);
                        let w = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                            wp[i].add(b * qb) as *const __m128i
                        ));
                        let u = _mm256_and_si256(_mm256_srlv_epi32(w, shift), m4);
                        let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(
                            _mm256_maddubs_epi16(u, xv),
                            ones,
                        ));
                        acc[i] = _mm256_fmadd_ps(p, _mm256_set1_ps(dd.0[b]), acc[i]);
                    }
                }
            }
            store_rows::<R>(&acc, y.add(j * t.rows + r0));
        }
    }

    /// Batched f32-activation tile kernel for the block types (prefill on the exact path): for every
    /// token `j`, `y[j·rows + r] += W[r]·x_j` with `x_j = xs[j·cols..][..cols]`. Each group of 4
    /// rows has its quants converted to floats once per column chunk (kept on the stack) and
    /// applied to every token; per token the arithmetic is that of [`tile_matvec`]'s f32 path,
    /// operation for operation, so the result is bit-identical to one call per token.
    ///
    /// # Safety
    /// As [`tile_matvec`] (f32 path, `q` a block type) for each token's `x_j`;
    /// `xs.len() >= n · cols`, `y.len() >= n · rows`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile_matmul_f32(t: Tile, xs: &[f32], n: usize, y: &mut [f32]) {
        let Tile {
            quant: q,
            rows,
            cols,
            scales,
            qs,
        } = t;
        let t = RawTile::new(rows, cols, scales, qs, y);
        let mut acts = [Act::f32(&[]); TB];
        let mut j0 = 0;
        while j0 < n {
            let tn = TB.min(n - j0);
            for (j, a) in acts.iter_mut().enumerate().take(tn) {
                *a = Act::f32(&xs[(j0 + j) * cols..]);
            }
            let yb = t.y.add(j0 * rows);
            match q {
                QuantType::Q4_0 => matmul_f32::<K_Q4_0>(&t, &acts[..tn], yb),
                QuantType::Q4_1 => matmul_f32::<K_Q4_1>(&t, &acts[..tn], yb),
                _ => matmul_f32::<K_Q8_0>(&t, &acts[..tn], yb),
            }
            j0 += tn;
        }
    }

    /// Up to [`TB`] tokens of [`tile_matmul_f32`]; `y` = the first token's output rows.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn matmul_f32<const K: u8>(t: &RawTile, acts: &[Act], y: *mut f32) {
        let mut amv = [_mm256_setzero_ps(); TB];
        let mut csv = [_mm256_setzero_ps(); TB];
        let mut c0 = 0;
        while c0 < t.nb {
            let cn = CHUNK.min(t.nb - c0);
            for (j, a) in acts.iter().enumerate() {
                (amv[j], csv[j]) = chunk_consts::<K, false>(*a, c0, cn);
            }
            let mut r0 = 0;
            while r0 < t.rows {
                match t.rows - r0 {
                    1 => mm_group_f32::<K, 1>(t, acts, r0, (c0, cn), (&amv, &csv), y),
                    2 => mm_group_f32::<K, 2>(t, acts, r0, (c0, cn), (&amv, &csv), y),
                    3 => mm_group_f32::<K, 3>(t, acts, r0, (c0, cn), (&amv, &csv), y),
                    _ => mm_group_f32::<K, 4>(t, acts, r0, (c0, cn), (&amv, &csv), y),
                }
                r0 += (t.rows - r0).min(4);
            }
            c0 += cn;
        }
    }

    /// `R` rows from `r0` of one chunk, for every token: the quants of each block converted to
    /// floats once, then per token the same operations as `group::<K, false, R, _>`.
    #[inline]
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mm_group_f32<const K: u8, const R: usize>(
        t: &RawTile,
        acts: &[Act],
        r0: usize,
        (c0, cn): (usize, usize),
        (amv, csv): (&[__m256; TB], &[__m256; TB]),
        y: *mut f32,
    ) {
        let (sb, qb) = (scale_bytes(K), quant_bytes(K));
        let m4 = _mm256_set1_epi32(0x0F);
        let mut wf = [[[_mm256_setzero_ps(); 4]; CHUNK]; R];
        let mut dm = [(_mm256_setzero_ps(), _mm256_setzero_ps()); R];
        for i in 0..R {
            let r = r0 + i;
            let off = (r * t.nb + c0) * sb;
            dm[i] = load_scales::<K>(t.scales.add(off), cn, t.scales_len - off);
            let wp = t.qs.add((r * t.nb + c0) * qb);
            for b in 0..cn {
                let p = wp.add(b * qb);
                let (e0, e1, e2, e3) = if K == K_Q8_0 {
                    (
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)),
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i)),
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(16) as *const __m128i)),
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(24) as *const __m128i)),
                    )
                } else {
                    let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
                    let hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i));
                    (
                        _mm256_and_si256(lo, m4),
                        _mm256_and_si256(hi, m4),
                        _mm256_srli_epi32::<4>(lo),
                        _mm256_srli_epi32::<4>(hi),
                    )
                };
                wf[i][b] = [
                    _mm256_cvtepi32_ps(e0),
                    _mm256_cvtepi32_ps(e1),
                    _mm256_cvtepi32_ps(e2),
                    _mm256_cvtepi32_ps(e3),
                ];
            }
        }
        for (j, a) in acts.iter().enumerate() {
            let mut acc = [_mm256_setzero_ps(); R];
            let mut dd = [Lanes([0.0; 8]); R];
            for i in 0..R {
                let (d, m) = dm[i];
                _mm256_store_ps(dd[i].0.as_mut_ptr(), _mm256_mul_ps(d, amv[j]));
                acc[i] = match K {
                    K_Q4_0 => _mm256_mul_ps(d, csv[j]),
                    K_Q4_1 => _mm256_mul_ps(m, csv[j]),
                    _ => _mm256_setzero_ps(),
                };
            }
            for b in 0..cn {
                let xp = a.x.add((c0 + b) * QK);
                let x0 = _mm256_loadu_ps(xp);
                let x1 = _mm256_loadu_ps(xp.add(8));
                let x2 = _mm256_loadu_ps(xp.add(16));
                let x3 = _mm256_loadu_ps(xp.add(24));
                for i in 0..R {
                    let w = &wf[i][b];
                    let s = _mm256_mul_ps(w[0], x0);
                    let s = _mm256_fmadd_ps(w[1], x1, s);
                    let s = _mm256_fmadd_ps(w[2], x2, s);
                    let s = _mm256_fmadd_ps(w[3], x3, s);
                    acc[i] = _mm256_fmadd_ps(s, _mm256_set1_ps(dd[i].0[b]), acc[i]);
                }
            }
            store_rows::<R>(&acc, y.add(j * t.rows + r0));
        }
    }

    /// Block-type kernel (Q4_0 / Q4_1 / Q8_0), integer (`INT`) or f32 activation path.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn blocked<const K: u8, const INT: bool>(t: &RawTile, a: Act) {
        let mut c0 = 0;
        while c0 < t.nb {
            let cn = CHUNK.min(t.nb - c0);
            let (amv, csv) = chunk_consts::<K, INT>(a, c0, cn);
            // Q4 integer path: activation bytes of each block pair (b, b+1) regrouped as
            // [b: 0..16 | b+1: 0..16] and [b: 16..32 | b+1: 16..32], matching the low and high
            // nibbles of one 32-byte load of the two blocks' packed quants. Shared by all rows.
            let mut xp = [_mm256_setzero_si256(); CHUNK];
            if INT && K != K_Q8_0 {
                for p in 0..cn / 2 {
                    let b = c0 + 2 * p;
                    let y0 = _mm256_loadu_si256(a.q.add(b * QK) as *const __m256i);
                    let y1 = _mm256_loadu_si256(a.q.add((b + 1) * QK) as *const __m256i);
                    xp[2 * p] = _mm256_permute2x128_si256::<0x20>(y0, y1);
                    xp[2 * p + 1] = _mm256_permute2x128_si256::<0x31>(y0, y1);
                }
            }
            let ch = Chunk {
                c0,
                cn,
                amv,
                csv,
                xp: &xp,
            };
            let mut r0 = 0;
            // Full chunks, the 4-block chunk of 640-wide models (256 + 256 + 128: Gemma 3 270M, whose
            // 262k-row LM head is most of its bytes) and the 2-block chunk of 576-wide ones
            // (256 + 256 + 64) get a compile-time block count, so their block loops unroll into
            // straight-line code.
            match cn {
                CHUNK => {
                    while r0 + 4 <= t.rows {
                        group::<K, INT, 4, CHUNK>(t, a, r0, &ch);
                        r0 += 4;
                    }
                }
                4 => {
                    while r0 + 4 <= t.rows {
                        group::<K, INT, 4, 4>(t, a, r0, &ch);
                        r0 += 4;
                    }
                }
                2 => {
                    while r0 + 4 <= t.rows {
                        group::<K, INT, 4, 2>(t, a, r0, &ch);
                        r0 += 4;
                    }
                }
                _ => {}
            }
            while r0 + 4 <= t.rows {
                group::<K, INT, 4, 0>(t, a, r0, &ch);
                r0 += 4;
            }
            match t.rows - r0 {
                1 => group::<K, INT, 1, 0>(t, a, r0, &ch),
                2 => group::<K, INT, 2, 0>(t, a, r0, &ch),
                3 => group::<K, INT, 3, 0>(t, a, r0, &ch),
                _ => {}
            }
            c0 += cn;
        }
    }

    /// Per-chunk state shared by all row groups.
    struct Chunk<'a> {
        c0: usize,
        cn: usize,
        amv: __m256,
        csv: __m256,
        xp: &'a [__m256i; CHUNK],
    }

    /// Per-chunk activation constants for blocks `c0..c0+cn`: the factor multiplying the weight
    /// scale (`d_x` on the integer path, 1 on the f32 path) and the per-block activation sums used for
    /// the Q4 offset / minimum (`s = d_x·Σq` or `Σx`; times −8 for Q4_0). Lanes ≥ `cn` are zero.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn chunk_consts<const K: u8, const INT: bool>(
        a: Act,
        c0: usize,
        cn: usize,
    ) -> (__m256, __m256) {
        let mut am = Lanes([0.0; 8]);
        let mut cs = Lanes([0.0; 8]);
        for b in 0..cn {
            if INT {
                am.0[b] = *a.d.add(c0 + b);
                cs.0[b] = *a.s.add(c0 + b);
            } else {
                am.0[b] = 1.0;
                if K != K_Q8_0 {
                    cs.0[b] = hsum_block(a.x.add((c0 + b) * QK));
                }
            }
        }
        let amv = _mm256_load_ps(am.0.as_ptr());
        let mut csv = _mm256_load_ps(cs.0.as_ptr());
        if K == K_Q4_0 {
            csv = _mm256_mul_ps(csv, _mm256_set1_ps(-8.0));
        }
        (amv, csv)
    }

    /// `R` rows starting at `r0`, blocks `ch.c0..ch.c0+ch.cn`.
    #[inline]
    #[allow(clippy::needless_range_loop)] // indices address several parallel arrays in the hot loop
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group<const K: u8, const INT: bool, const R: usize, const CN: usize>(
        t: &RawTile,
        a: Act,
        r0: usize,
        ch: &Chunk,
    ) {
        let c0 = ch.c0;
        // `CN` > 0: the chunk's block count is a compile-time constant (straight-line code).
        let cn = if CN > 0 { CN } else { ch.cn };
        let full = cn == CHUNK;
        let sb = scale_bytes(K);
        let qb = quant_bytes(K);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut dd = [Lanes([0.0; 8]); R];
        let mut wp = [core::ptr::null::<u8>(); R];
        // Q4 integer path: per row and block pair, the scales spread as [d_b ×4, d_b+1 ×4].
        let mut dp = [[_mm256_setzero_ps(); CHUNK / 2]; R];
        for i in 0..R {
            let r = r0 + i;
            let off = (r * t.nb + c0) * sb;
            let (d, m) = load_scales::<K>(t.scales.add(off), cn, t.scales_len - off);
            let dv = _mm256_mul_ps(d, ch.amv);
            _mm256_store_ps(dd[i].0.as_mut_ptr(), dv);
            if INT && K != K_Q8_0 && !full {
                let mut idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
                for v in dp[i].iter_mut().take(cn / 2) {
                    *v = _mm256_permutevar8x32_ps(dv, idx);
                    idx = _mm256_add_epi32(idx, _mm256_set1_epi32(2));
                }
            }
            acc[i] = match K {
                K_Q4_0 => _mm256_mul_ps(d, ch.csv),
                K_Q4_1 => _mm256_mul_ps(m, ch.csv),
                _ => _mm256_setzero_ps(),
            };
            wp[i] = t.qs.add((r * t.nb + c0) * qb);
        }
        // The group's rows are contiguous in the tile when the chunk spans it (tiles are at most
        // one chunk wide, 256 columns).
        if crate::kernels::prefetch::split() {
            prefetch_ahead(wp[0], R * cn * qb);
        }
        if INT {
            let ones = _mm256_set1_epi16(1);
            let m4 = _mm256_set1_epi8(0x0F);
            let mut b0 = 0;
            if K != K_Q8_0 && full {
                // Full chunk: keep the four per-pair integer sums (lanes [b ×4 | b+1 ×4]), fold them
                // into one vector of 8 per-block sums with 3 `vphaddd` + 1 `vpermd`, then a single
                // convert + FMA with the scales in natural order (no per-pair scale spreading).
                let pair = |i: usize, p: usize| {
                    let w = _mm256_loadu_si256(wp[i].add(p * 2 * qb) as *const __m256i);
                    let lo = _mm256_and_si256(w, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                    let s = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, ch.xp[2 * p]),
                        _mm256_maddubs_epi16(hi, ch.xp[2 * p + 1]),
                    );
                    _mm256_madd_epi16(s, ones)
                };
                let mut h01 = [_mm256_setzero_si256(); R];
                for i in 0..R {
                    h01[i] = _mm256_hadd_epi32(pair(i, 0), pair(i, 1));
                }
                // hadd leaves [b0 b2 b4 b6 | b1 b3 b5 b7]; restore block order.
                let unz = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
                for i in 0..R {
                    let h23 = _mm256_hadd_epi32(pair(i, 2), pair(i, 3));
                    let h = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(h01[i], h23), unz);
                    let dv = _mm256_load_ps(dd[i].0.as_ptr());
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), dv, acc[i]);
                }
                b0 = cn;
            } else if K != K_Q8_0 {
                // Two blocks per step: one 32-byte load, low/high nibbles against the regrouped
                // activation; the two i16 products add without overflow (|Σ| ≤ 2·2·15·127).
                for p in 0..cn / 2 {
                    let y0 = ch.xp[2 * p];
                    let y1 = ch.xp[2 * p + 1];
                    for i in 0..R {
                        let w = _mm256_loadu_si256(wp[i].add(p * 2 * qb) as *const __m256i);
                        let lo = _mm256_and_si256(w, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                        let s = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, y0),
                            _mm256_maddubs_epi16(hi, y1),
                        );
                        let s = _mm256_cvtepi32_ps(_mm256_madd_epi16(s, ones));
                        acc[i] = _mm256_fmadd_ps(s, dp[i][p], acc[i]);
                    }
                }
                b0 = cn & !1;
            } else if cn.is_multiple_of(4) {
                // Q8_0, 4 or 8 blocks: per row the 8-lane integer sums of each 4 blocks are folded
                // with 3 `vphaddd` into [b0..b3 low halves | b0..b3 high halves]; two such quads
                // (or one quad's halves) add up to the exact per-block sums (|Σ| ≤ 32·127·128), then
                // one convert + FMA with the scales in natural order (instead of one per block).
                let mut hq = [[_mm256_setzero_si256(); 2]; R];
                for qd in 0..cn / 4 {
                    let xv: [__m256i; 4] = core::array::from_fn(|j| {
                        _mm256_loadu_si256(a.q.add((c0 + 4 * qd + j) * QK) as *const __m256i)
                    });
                    for i in 0..R {
                        let p = |j: usize| {
                            let w =
                                _mm256_loadu_si256(wp[i].add((4 * qd + j) * qb) as *const __m256i);
                            let s = _mm256_maddubs_epi16(
                                _mm256_abs_epi8(w),
                                _mm256_sign_epi8(xv[j], w),
                            );
                            _mm256_madd_epi16(s, ones)
                        };
                        hq[i][qd] = _mm256_hadd_epi32(
                            _mm256_hadd_epi32(p(0), p(1)),
                            _mm256_hadd_epi32(p(2), p(3)),
                        );
                    }
                }
                for i in 0..R {
                    let s = if cn == CHUNK {
                        _mm256_add_epi32(
                            _mm256_permute2x128_si256::<0x20>(hq[i][0], hq[i][1]),
                            _mm256_permute2x128_si256::<0x31>(hq[i][0], hq[i][1]),
                        )
                    } else {
                        let h = hq[i][0];
                        let s4 = _mm_add_epi32(
                            _mm256_castsi256_si128(h),
                            _mm256_extracti128_si256::<1>(h),
                        );
                        _mm256_set_m128i(_mm_setzero_si128(), s4)
                    };
                    // Scale lanes ≥ cn are zero (masked in `load_scales`).
                    let dv = _mm256_load_ps(dd[i].0.as_ptr());
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dv, acc[i]);
                }
                b0 = cn;
            }
            // Q8_0 (other block counts) and a lone trailing Q4 block: one block per step.
            let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
            for b in b0..cn {
                let xv = _mm256_loadu_si256(a.q.add((c0 + b) * QK) as *const __m256i);
                for i in 0..R {
                    let p = if K == K_Q8_0 {
                        let w = _mm256_loadu_si256(wp[i].add(b * qb) as *const __m256i);
                        _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w))
                    } else {
                        let w = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                            wp[i].add(b * qb) as *const __m128i
                        ));
                        let u = _mm256_and_si256(_mm256_srlv_epi32(w, shift), m4);
                        _mm256_maddubs_epi16(u, xv)
                    };
                    let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                    acc[i] = _mm256_fmadd_ps(p, _mm256_set1_ps(dd[i].0[b]), acc[i]);
                }
            }
        } else {
            let m4 = _mm256_set1_epi32(0x0F);
            for b in 0..cn {
                let xp = a.x.add((c0 + b) * QK);
                let x0 = _mm256_loadu_ps(xp);
                let x1 = _mm256_loadu_ps(xp.add(8));
                let x2 = _mm256_loadu_ps(xp.add(16));
                let x3 = _mm256_loadu_ps(xp.add(24));
                for i in 0..R {
                    let p = wp[i].add(b * qb);
                    let (e0, e1, e2, e3) = if K == K_Q8_0 {
                        (
                            _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)),
                            _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i)),
                            _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(16) as *const __m128i)),
                            _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(24) as *const __m128i)),
                        )
                    } else {
                        let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
                        let hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i));
                        (
                            _mm256_and_si256(lo, m4),
                            _mm256_and_si256(hi, m4),
                            _mm256_srli_epi32::<4>(lo),
                            _mm256_srli_epi32::<4>(hi),
                        )
                    };
                    let s = _mm256_mul_ps(_mm256_cvtepi32_ps(e0), x0);
                    let s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(e1), x1, s);
                    let s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(e2), x2, s);
                    let s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(e3), x3, s);
                    acc[i] = _mm256_fmadd_ps(s, _mm256_set1_ps(dd[i].0[b]), acc[i]);
                }
            }
        }
        store_rows::<R>(&acc, t.y.add(r0));
    }

    #[cfg(test)]
    mod tests {
        use super::super::super::testutil::check_kernel;
        use super::super::super::Isa;
        #[allow(unused_imports)]
        use crate::kernels::dot::Tile;
        use crate::quant::QuantType;

        fn skip() -> bool {
            if !Isa::Avx2.available() {
                println!("SKIP: no AVX2/FMA/F16C on this CPU");
                return true;
            }
            false
        }

        #[test]
        fn avx2_matches_scalar_on_random_tiles() {
            if skip() {
                return;
            }
            check_kernel(
                &|t, x, xq, _, y| {
                    super::super::super::check_tile(t, x, xq, y);
                    // SAFETY: features detected by `skip()`, tile checked just above.
                    unsafe { super::tile_matvec(t, x, xq, y) }
                },
                &QuantType::SPLIT,
                1,
            );
        }

        /// The batched kernels (Q4 integer path; every block type on the f32 path) equal one
        /// per-token AVX2 call bit for bit (and so stay within the scalar reference's tolerance,
        /// which `avx2_matches_scalar_on_random_tiles` checks for the per-token kernel), for token
        /// counts around the stack block of 32, full and partial chunks, odd block counts and every
        /// row tail.
        #[test]
        fn batched_kernels_match_per_token_bit_for_bit() {
            use super::super::super::testutil::{BatchCase, Rng};
            use super::super::super::tile_matmul;
            use crate::quant::QuantType;
            if skip() {
                return;
            }
            let mut rng = Rng::new(17);
            for q in [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q8_0] {
                for (rows, nb, n) in [
                    (128, 8, 32),
                    (128, 2, 33),
                    (37, 8, 5),
                    (5, 3, 1),
                    (3, 7, 40),
                    (64, 9, 2),
                    (1, 1, 3),
                ] {
                    let cols = nb * 32;
                    let c = BatchCase::new(&mut rng, q, rows, cols, n);
                    let (t, xs, y0, xq) = (&c.tile, &c.xs, &c.y0, c.xq());
                    for int in [true, false] {
                        let mut want = y0.clone();
                        for j in 0..n {
                            super::super::super::tile_matvec(
                                Isa::Avx2,
                                Tile::split(q, rows, cols, &t.scales, &t.qs),
                                &xs[j * cols..(j + 1) * cols],
                                int.then(|| xq[j]),
                                &mut want[j * rows..(j + 1) * rows],
                            );
                        }
                        let mut got = y0.clone();
                        let xa = int.then_some(&xq[..]);
                        tile_matmul(
                            Isa::Avx2,
                            Tile::split(q, rows, cols, &t.scales, &t.qs),
                            xs,
                            xa,
                            n,
                            &mut got,
                        );
                        assert_eq!(
                            want, got,
                            "{q} int={int} rows {rows} blocks {nb} tokens {n}"
                        );
                    }
                }
            }
        }

        #[test]
        fn dispatch_avx2_matches_scalar() {
            if skip() {
                return;
            }
            check_kernel(
                &|t, x, xq, _, y| super::super::super::tile_matvec(Isa::Avx2, t, x, xq, y),
                &QuantType::SPLIT,
                2,
            );
        }

        #[test]
        fn requested_avx512_falls_back_when_missing() {
            if skip() {
                return;
            }
            // On a CPU without AVX-512 this exercises the AVX2 fallback; with it, the AVX-512 kernels.
            check_kernel(
                &|t, x, xq, _, y| super::super::super::tile_matvec(Isa::Avx512, t, x, xq, y),
                &QuantType::SPLIT,
                5,
            );
        }

        #[test]
        fn empty_tiles_are_no_ops() {
            use crate::quant::QuantType;
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                for q in QuantType::SPLIT {
                    let mut y = [1.0f32; 3];
                    super::super::super::tile_matvec(
                        isa,
                        Tile::split(q, 0, 64, &[], &[]),
                        &[0.0; 64],
                        None,
                        &mut y,
                    );
                    super::super::super::tile_matvec(
                        isa,
                        Tile::split(q, 3, 0, &[], &[]),
                        &[],
                        None,
                        &mut y,
                    );
                    assert_eq!(y, [1.0; 3]);
                }
            }
        }

        #[test]
        #[should_panic(expected = "qs too short")]
        fn short_slices_are_rejected_before_simd() {
            let mut y = [0.0f32; 4];
            super::super::super::tile_matvec(
                Isa::Avx2,
                Tile::split(crate::quant::QuantType::Q4_0, 4, 32, &[0; 8], &[0; 63]),
                &[0.0; 32],
                None,
                &mut y,
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    //! AVX-512 (F + BW) tile kernels, with a VNNI (`vpdpbusd`) variant of the integer path.
    //!
    //! Same structure as `avx2` (chunks of 8 blocks, 4 rows sharing activation loads, Q4
    //! offset/minimum folded into the accumulator's initial value), but each integer step covers *two*
    //! 32-element blocks in one 512-bit register: the 32 packed bytes of two Q4 blocks are spread to
    //! `[b0, b0, b1, b1]` (128-bit lanes) with `vpermq`, shifted by `[0, 4, 0, 4]` per lane and masked,
    //! which matches the 64 activation bytes of the two blocks. The two per-block scales are spread to
    //! `[d0 ×8, d1 ×8]` with one `vpermps`. The f32 path handles one block per step (two registers of
    //! 16 floats).
    //!
    //! The kernels are generated twice by a macro: once for `avx512f,avx512bw` (`vpmaddubsw` +
    //! `vpmaddwd`) and once with `avx512vnni` added (`vpdpbusd`), so the non-VNNI code can never pick
    //! up VNNI instructions. Selected only by runtime detection (`dot::tile_matvec`, `dot::select`).
    //!
    //! Safety contract of every private `unsafe fn` in this module: it is reached only from this
    //! module's public `tile_matvec` (whose callers, `dot::tile_matvec` and `dot::select`, have detected the CPU
    //! features named in its `#[target_feature]` and checked the slice lengths with `check_tile`), and
    //! it reads/writes only inside the tile's `scales`, `qs`, activation and `y` ranges derived from
    //! those lengths (masked loads for partial block pairs; full-width scale loads only when they stay
    //! inside the `scales` slice).

    use super::super::{Tile, XqBlocks, XqRef};
    use core::arch::x86_64::*;

    use super::super::simd::prefetch_ahead;
    use super::avx2::{
        chunk_consts, load_scales, quant_bytes, scale_bytes, store_rows, Act, Lanes, RawTile,
        CHUNK, K_Q4_0, K_Q4_1, K_Q8_0, TB,
    };
    use crate::quant::{QuantType, QK};

    /// `y[r] += W[r]·x` for one tile (AVX-512). Integer path when `xq` is given for a block type;
    /// `vnni` selects the `vpdpbusd` variant.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and BW plus AVX2, FMA and F16C (and AVX512-VNNI when `vnni`),
    /// and the slices must satisfy the tile contract checked by `dot::check_tile`.
    pub unsafe fn tile_matvec(t: Tile, x: &[f32], xq: XqRef, y: &mut [f32], vnni: bool) {
        let Tile {
            quant: q,
            rows,
            cols,
            scales,
            qs,
        } = t;
        let t = RawTile::new(rows, cols, scales, qs, y);
        let a = match xq {
            Some(a) if q.is_blocked() => Act::int(a),
            _ => Act::f32(x),
        };
        if vnni {
            // SAFETY: forwarded caller guarantee (features incl. VNNI, validated tile).
            vnni::run(q, &t, a, xq.is_some());
        } else {
            // SAFETY: forwarded caller guarantee (features, validated tile).
            bw::run(q, &t, a, xq.is_some());
        }
    }

    /// Batched integer tile kernel for Q4_0/Q4_1 (prefill), AVX-512: for every token `j` of `xq`,
    /// `y[j·rows + r] += W[r]·x_j`. Each group of 4 rows has its nibbles spread to the 512-bit
    /// layout once per column chunk and applied to every token of the batch. Per token the
    /// arithmetic is that of this module's [`tile_matvec`] integer path, operation for operation
    /// (same integer dots, same scale lanes, same FMA order, same fold and row reduction), so the
    /// result is bit-identical to calling it once per token (tested).
    ///
    /// # Safety
    /// As [`tile_matvec`] (integer path, `q` Q4_0 or Q4_1) for each token's `xq[j]`, and
    /// `y.len() >= xq.len() · rows`.
    pub unsafe fn tile_matmul_q4(t: Tile, xq: &[XqBlocks], y: &mut [f32], vnni: bool) {
        let Tile {
            quant: q,
            rows,
            cols,
            scales,
            qs,
        } = t;
        let t = RawTile::new(rows, cols, scales, qs, y);
        let mut acts = [Act::f32(&[]); TB];
        for (tb0, blk) in xq.chunks(TB).enumerate() {
            for (a, x) in acts.iter_mut().zip(blk) {
                *a = Act::int(*x);
            }
            let yb = t.y.add(tb0 * TB * rows);
            if vnni {
                // SAFETY: forwarded caller guarantee (features incl. VNNI, validated tiles).
                vnni::matmul_q4(q, &t, &acts[..blk.len()], yb);
            } else {
                // SAFETY: forwarded caller guarantee (features, validated tiles).
                bw::matmul_q4(q, &t, &acts[..blk.len()], yb);
            }
        }
    }

    macro_rules! avx512_kernels {
        ($name:ident, $feat:literal, $vnni:literal) => {
            mod $name {
                use super::*;
                use crate::kernels::dot::simd::fold512 as fold;

                const VNNI: bool = $vnni;

                /// Dispatch on the quant type.
                #[target_feature(enable = $feat)]
                pub(super) unsafe fn run(q: QuantType, t: &RawTile, a: Act, int: bool) {
                    match (q, int) {
                        (QuantType::F32, _) => {
                            crate::kernels::dot::float::avx512::rows::<false>(t, a.x)
                        }
                        (QuantType::F16, _) => {
                            crate::kernels::dot::float::avx512::rows::<true>(t, a.x)
                        }
                        (QuantType::Q4_0, true) => blocked::<K_Q4_0, true>(t, a),
                        (QuantType::Q4_1, true) => blocked::<K_Q4_1, true>(t, a),
                        (QuantType::Q8_0, true) => blocked::<K_Q8_0, true>(t, a),
                        (QuantType::Q4_0, false) => blocked::<K_Q4_0, false>(t, a),
                        (QuantType::Q4_1, false) => blocked::<K_Q4_1, false>(t, a),
                        (QuantType::Q8_0, false) => blocked::<K_Q8_0, false>(t, a),
                        // Dispatched to `kquant` before this module is reached.
                        _ => unreachable!("{q} is not a split type"),
                    }
                }

                /// Up to [`TB`] tokens of [`tile_matmul_q4`]; `y` = the first token's output rows.
                #[target_feature(enable = $feat)]
                pub(super) unsafe fn matmul_q4(
                    q: QuantType,
                    t: &RawTile,
                    acts: &[Act],
                    y: *mut f32,
                ) {
                    match q {
                        QuantType::Q4_0 => matmul::<K_Q4_0>(t, acts, y),
                        QuantType::Q4_1 => matmul::<K_Q4_1>(t, acts, y),
                        _ => unreachable!("{q} has no batched AVX-512 kernel"),
                    }
                }

                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn matmul<const K: u8>(t: &RawTile, acts: &[Act], y: *mut f32) {
                    let mut amv = [_mm256_setzero_ps(); TB];
                    let mut csv = [_mm256_setzero_ps(); TB];
                    let mut c0 = 0;
                    while c0 < t.nb {
                        let cn = CHUNK.min(t.nb - c0);
                        for (j, a) in acts.iter().enumerate() {
                            (amv[j], csv[j]) = chunk_consts::<K, true>(*a, c0, cn);
                        }
                        let ch = (c0, cn, &amv, &csv);
                        let mut r0 = 0;
                        if cn == CHUNK {
                            while r0 + 4 <= t.rows {
                                mm_group::<K, 4, true>(t, acts, r0, ch, y);
                                r0 += 4;
                            }
                        }
                        while r0 + 4 <= t.rows {
                            mm_group::<K, 4, false>(t, acts, r0, ch, y);
                            r0 += 4;
                        }
                        match t.rows - r0 {
                            1 => mm_group::<K, 1, false>(t, acts, r0, ch, y),
                            2 => mm_group::<K, 2, false>(t, acts, r0, ch, y),
                            3 => mm_group::<K, 3, false>(t, acts, r0, ch, y),
                            _ => {}
                        }
                        c0 += cn;
                    }
                }

                /// `R` rows from `r0` of the chunk `ch = (c0, cn, amv, csv)` for every token:
                /// the nibbles are spread once, then per token the integer path of [`group`].
                #[inline]
                #[allow(clippy::needless_range_loop)] // parallel per-row arrays in the hot loop
                #[allow(clippy::type_complexity)]
                #[target_feature(enable = $feat)]
                unsafe fn mm_group<const K: u8, const R: usize, const FULL: bool>(
                    t: &RawTile,
                    acts: &[Act],
                    r0: usize,
                    ch: (usize, usize, &[__m256; TB], &[__m256; TB]),
                    y: *mut f32,
                ) {
                    let (c0, cn, amv, csv) = ch;
                    let cn = if FULL { CHUNK } else { cn };
                    let sb = scale_bytes(K);
                    let qb = quant_bytes(K);
                    let m4 = _mm512_set1_epi8(0x0F);
                    let spread = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
                    let shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
                    let two = _mm512_set1_epi32(2);
                    let mut dm = [(_mm256_setzero_ps(), _mm256_setzero_ps()); R];
                    let mut u = [[_mm512_setzero_si512(); CHUNK / 2]; R];
                    for i in 0..R {
                        let r = r0 + i;
                        let off = (r * t.nb + c0) * sb;
                        dm[i] = load_scales::<K>(t.scales.add(off), cn, t.scales_len - off);
                        let wp = t.qs.add((r * t.nb + c0) * qb);
                        let mut b = 0;
                        while b < cn {
                            let wb = wp.add(b * qb);
                            let w = if b + 1 < cn {
                                _mm256_loadu_si256(wb as *const __m256i)
                            } else {
                                _mm256_zextsi128_si256(_mm_loadu_si128(wb as *const __m128i))
                            };
                            let w = _mm512_permutexvar_epi64(spread, _mm512_castsi256_si512(w));
                            u[i][b / 2] = _mm512_and_si512(_mm512_srlv_epi64(w, shift), m4);
                            b += 2;
                        }
                    }
                    for (j, a) in acts.iter().enumerate() {
                        let mut acc = [_mm512_setzero_ps(); R];
                        let mut ddz = [_mm512_setzero_ps(); R];
                        for i in 0..R {
                            let (d, m) = dm[i];
                            ddz[i] = _mm512_zextps256_ps512(_mm256_mul_ps(d, amv[j]));
                            let init = if K == K_Q4_0 {
                                _mm256_mul_ps(d, csv[j])
                            } else {
                                _mm256_mul_ps(m, csv[j])
                            };
                            acc[i] = _mm512_zextps256_ps512(init);
                        }
                        let mut sidx =
                            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
                        let mut b = 0;
                        while b < cn {
                            let xmask: __mmask64 = if b + 1 < cn { !0 } else { 0xFFFF_FFFF };
                            let xv = _mm512_maskz_loadu_epi8(xmask, a.q.add((c0 + b) * QK));
                            for i in 0..R {
                                let p = dot_u8i8(u[i][b / 2], xv);
                                let sc = _mm512_permutexvar_ps(sidx, ddz[i]);
                                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[i]);
                            }
                            sidx = _mm512_add_epi32(sidx, two);
                            b += 2;
                        }
                        let mut folded = [_mm256_setzero_ps(); R];
                        for i in 0..R {
                            folded[i] = fold(acc[i]);
                        }
                        store_rows::<R>(&folded, y.add(j * t.rows + r0));
                    }
                }

                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn blocked<const K: u8, const INT: bool>(t: &RawTile, a: Act) {
                    let mut c0 = 0;
                    while c0 < t.nb {
                        let cn = CHUNK.min(t.nb - c0);
                        let (amv, csv) = chunk_consts::<K, INT>(a, c0, cn);
                        let mut r0 = 0;
                        // Compile-time block counts → straight-line code: full chunks, and the
                        // 2-block tail of 576-wide rows (576 = 256 + 256 + 64).
                        if cn == CHUNK {
                            while r0 + 4 <= t.rows {
                                group::<K, INT, 4, CHUNK>(t, a, r0, c0, cn, amv, csv);
                                r0 += 4;
                            }
                        } else if cn == 2 {
                            while r0 + 4 <= t.rows {
                                group::<K, INT, 4, 2>(t, a, r0, c0, cn, amv, csv);
                                r0 += 4;
                            }
                        }
                        while r0 + 4 <= t.rows {
                            group::<K, INT, 4, 0>(t, a, r0, c0, cn, amv, csv);
                            r0 += 4;
                        }
                        match t.rows - r0 {
                            1 => group::<K, INT, 1, 0>(t, a, r0, c0, cn, amv, csv),
                            2 => group::<K, INT, 2, 0>(t, a, r0, c0, cn, amv, csv),
                            3 => group::<K, INT, 3, 0>(t, a, r0, c0, cn, amv, csv),
                            _ => {}
                        }
                        c0 += cn;
                    }
                }

                /// Integer dot of unsigned bytes `u` with signed bytes `s`, as 16 i32 partial sums.
                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn dot_u8i8(u: __m512i, s: __m512i) -> __m512i {
                    if VNNI {
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s)
                    } else {
                        _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1))
                    }
                }

                #[inline]
                #[target_feature(enable = $feat)]
                unsafe fn group<const K: u8, const INT: bool, const R: usize, const CN: usize>(
                    t: &RawTile,
                    a: Act,
                    r0: usize,
                    c0: usize,
                    cn: usize,
                    amv: __m256,
                    csv: __m256,
                ) {
                    let cn = if CN > 0 { CN } else { cn };
                    let sb = scale_bytes(K);
                    let qb = quant_bytes(K);
                    let mut acc = [_mm512_setzero_ps(); R];
                    let mut dd = [Lanes([0.0; 8]); R];
                    let mut ddz = [_mm512_setzero_ps(); R];
                    let mut wp = [core::ptr::null::<u8>(); R];
                    for i in 0..R {
                        let r = r0 + i;
                        let off = (r * t.nb + c0) * sb;
                        let (d, m) = load_scales::<K>(t.scales.add(off), cn, t.scales_len - off);
                        let dm = _mm256_mul_ps(d, amv);
                        _mm256_store_ps(dd[i].0.as_mut_ptr(), dm);
                        ddz[i] = _mm512_zextps256_ps512(dm);
                        let init = match K {
                            K_Q4_0 => _mm256_mul_ps(d, csv),
                            K_Q4_1 => _mm256_mul_ps(m, csv),
                            _ => _mm256_setzero_ps(),
                        };
                        acc[i] = _mm512_zextps256_ps512(init);
                        wp[i] = t.qs.add((r * t.nb + c0) * qb);
                    }
                    // The group's rows are contiguous in the tile (tiles are at most one chunk
                    // wide); ask for the lines [`PREFETCH_AHEAD`] bytes on, as the AVX2 kernel does.
                    if crate::kernels::prefetch::split() {
                        prefetch_ahead(wp[0], R * cn * qb);
                    }
                    if INT {
                        let m4 = _mm512_set1_epi8(0x0F);
                        let spread = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
                        let shift = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
                        let two = _mm512_set1_epi32(2);
                        // Scale lane index for the current pair of blocks: [2p ×8, 2p+1 ×8].
                        let mut sidx =
                            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
                        let mut b = 0;
                        while b < cn {
                            let full = b + 1 < cn;
                            // Activation bytes of blocks b, b+1 (upper half zeroed for a lone block).
                            let xmask: __mmask64 = if full { !0 } else { 0xFFFF_FFFF };
                            let xv = _mm512_maskz_loadu_epi8(xmask, a.q.add((c0 + b) * QK));
                            for i in 0..R {
                                let wb = wp[i].add(b * qb);
                                let p = if K == K_Q8_0 {
                                    let w = _mm512_maskz_loadu_epi8(xmask, wb as *const i8);
                                    let neg = _mm512_movepi8_mask(w);
                                    let sx =
                                        _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                                    dot_u8i8(_mm512_abs_epi8(w), sx)
                                } else {
                                    let w = if full {
                                        _mm256_loadu_si256(wb as *const __m256i)
                                    } else {
                                        _mm256_zextsi128_si256(_mm_loadu_si128(
                                            wb as *const __m128i,
                                        ))
                                    };
                                    let w =
                                        _mm512_permutexvar_epi64(spread, _mm512_castsi256_si512(w));
                                    let u = _mm512_and_si512(_mm512_srlv_epi64(w, shift), m4);
                                    dot_u8i8(u, xv)
                                };
                                let sc = _mm512_permutexvar_ps(sidx, ddz[i]);
                                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sc, acc[i]);
                            }
                            sidx = _mm512_add_epi32(sidx, two);
                            b += 2;
                        }
                    } else {
                        let m4 = _mm512_set1_epi32(0x0F);
                        for b in 0..cn {
                            let xp = a.x.add((c0 + b) * QK);
                            let x0 = _mm512_loadu_ps(xp);
                            let x1 = _mm512_loadu_ps(xp.add(16));
                            for i in 0..R {
                                let p = wp[i].add(b * qb);
                                let (e0, e1) = if K == K_Q8_0 {
                                    (
                                        _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)),
                                        _mm512_cvtepi8_epi32(_mm_loadu_si128(
                                            p.add(16) as *const __m128i
                                        )),
                                    )
                                } else {
                                    let v =
                                        _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
                                    (_mm512_and_si512(v, m4), _mm512_srli_epi32::<4>(v))
                                };
                                let s = _mm512_mul_ps(_mm512_cvtepi32_ps(e0), x0);
                                let s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(e1), x1, s);
                                acc[i] = _mm512_fmadd_ps(s, _mm512_set1_ps(dd[i].0[b]), acc[i]);
                            }
                        }
                    }
                    let mut folded = [_mm256_setzero_ps(); R];
                    for i in 0..R {
                        folded[i] = fold(acc[i]);
                    }
                    store_rows::<R>(&folded, t.y.add(r0));
                }
            }
        };
    }

    avx512_kernels!(bw, "avx512f,avx512bw,avx2,fma,f16c", false);
    avx512_kernels!(vnni, "avx512f,avx512bw,avx512vnni,avx2,fma,f16c", true);

    #[cfg(test)]
    mod tests {
        use super::super::super::testutil::check_kernel;
        use super::super::super::Isa;
        #[allow(unused_imports)]
        use crate::kernels::dot::Tile;
        use crate::quant::QuantType;

        #[test]
        fn avx512_matches_scalar_on_random_tiles() {
            if !Isa::Avx512.available() {
                // Skipped only for what the CPU lacks (is_x86_feature_detected at run time).
                println!("SKIP: this CPU has no AVX-512 F/BW");
                return;
            }
            check_kernel(
                &|t, x, xq, _, y| {
                    super::super::super::check_tile(t, x, xq, y);
                    // SAFETY: AVX-512 F/BW detected above; tile checked just above.
                    unsafe { super::tile_matvec(t, x, xq, y, false) }
                },
                &QuantType::SPLIT,
                3,
            );
        }

        /// The batched Q4 kernel (prefill) equals this module's per-token kernel bit for bit, with
        /// and without VNNI: full 8-block chunks, the 2-block tail of 576-wide rows, odd block
        /// counts (a lone trailing block), row tails of 1–3, token counts across the 32-token block.
        #[test]
        fn batched_q4_matches_per_token_bit_for_bit() {
            use super::super::super::check_tile;
            use super::super::super::testutil::{BatchCase, Rng};
            use crate::quant::QuantType;
            let mut rng = Rng::new(23);
            for vnni in [false, true] {
                if !Isa::Avx512.available() || (vnni && !Isa::Avx512.has_vnni()) {
                    println!("SKIP: this CPU lacks AVX-512 F/BW (vnni={vnni})");
                    continue;
                }
                for q in [QuantType::Q4_0, QuantType::Q4_1] {
                    for (rows, nb, n) in [
                        (128, 8, 32),
                        (128, 2, 33),
                        (37, 18, 5),
                        (5, 3, 1),
                        (3, 7, 40),
                        (1, 1, 3),
                    ] {
                        let cols = nb * 32;
                        let c = BatchCase::new(&mut rng, q, rows, cols, n);
                        let (t, y0, xq) = (&c.tile, &c.y0, c.xq());
                        let mut want = y0.clone();
                        for (j, x) in xq.iter().enumerate() {
                            let y = &mut want[j * rows..(j + 1) * rows];
                            check_tile(
                                Tile::split(q, rows, cols, &t.scales, &t.qs),
                                &[],
                                Some(*x),
                                y,
                            );
                            // SAFETY: features detected above; this token's tile checked just above.
                            unsafe {
                                super::tile_matvec(
                                    Tile::split(q, rows, cols, &t.scales, &t.qs),
                                    &[],
                                    Some(*x),
                                    y,
                                    vnni,
                                )
                            };
                        }
                        let mut got = y0.clone();
                        // SAFETY: features detected above; every token's tile checked above.
                        unsafe {
                            super::tile_matmul_q4(
                                Tile::split(q, rows, cols, &t.scales, &t.qs),
                                &xq,
                                &mut got,
                                vnni,
                            )
                        };
                        assert_eq!(
                            want, got,
                            "{q} vnni={vnni} rows {rows} blocks {nb} tokens {n}"
                        );
                    }
                }
            }
        }

        #[test]
        fn avx512_vnni_matches_scalar_on_random_tiles() {
            if !Isa::Avx512.has_vnni() {
                println!("SKIP: this CPU has no AVX-512 F/BW/VNNI");
                return;
            }
            check_kernel(
                &|t, x, xq, _, y| {
                    super::super::super::check_tile(t, x, xq, y);
                    // SAFETY: AVX-512 F/BW/VNNI detected above; tile checked just above.
                    unsafe { super::tile_matvec(t, x, xq, y, true) }
                },
                &QuantType::SPLIT,
                4,
            );
        }
    }
}
