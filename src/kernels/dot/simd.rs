//! The SIMD helpers the AVX2 and AVX-512 tile kernels share (x86_64 only): the horizontal sums
//! (one [`hsum`] of 8 floats, which every other float reduction here follows), the software
//! prefetch of the weights ahead of a row group ([`prefetch_ahead`]), and the one-row AVX-512
//! K-quant kernels' 64-level integer dot ([`dot64`]) and 256 → 512-bit join ([`join512`]).
//!
//! Safety contract of every `unsafe fn` here: the caller has detected the features named in its
//! `#[target_feature]`; [`hsum_block`] reads the 32 floats at its pointer, [`prefetch_ahead`]
//! only issues prefetches (which never fault).

use core::arch::x86_64::*;

/// Horizontal sum of 8 floats: the one AVX2 horizontal sum of the crate (the split-layout,
/// K-quant and attention kernels all reduce with it): (low + high half), then pairs, then the
/// last two lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// The horizontal sums of 4 vectors at once, lane i = Σ v[i], each in exactly `hsum`'s order
/// ((s0 + s2) + (s1 + s3) of the two halves' sum s): a 4 × 4 transpose instead of 4 reductions.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum4(v: [__m256; 4]) -> __m128 {
    let s = |x: __m256| _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let (s0, s1, s2, s3) = (s(v[0]), s(v[1]), s(v[2]), s(v[3]));
    let (t0, t1) = (_mm_unpacklo_ps(s0, s1), _mm_unpacklo_ps(s2, s3));
    let (t2, t3) = (_mm_unpackhi_ps(s0, s1), _mm_unpackhi_ps(s2, s3));
    // c_k = lane k of every vector's s.
    let (c0, c1) = (_mm_movelh_ps(t0, t1), _mm_movehl_ps(t1, t0));
    let (c2, c3) = (_mm_movelh_ps(t2, t3), _mm_movehl_ps(t3, t2));
    _mm_add_ps(_mm_add_ps(c0, c2), _mm_add_ps(c1, c3))
}

/// Sums of each of 4 vectors of 4 i32 (lane i = Σ v_i), 3 `vphaddd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum4_i32(v: [__m128i; 4]) -> __m128i {
    _mm_hadd_epi32(_mm_hadd_epi32(v[0], v[1]), _mm_hadd_epi32(v[2], v[3]))
}

/// [`hsum4_i32`] of 4 vectors of 8 i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum4_i32x8(v: [__m256i; 4]) -> __m128i {
    let f = |x: __m256i| _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x));
    hsum4_i32([f(v[0]), f(v[1]), f(v[2]), f(v[3])])
}

/// Horizontal sums of 4 vectors → one `__m128` (lane i = Σ a[i]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn reduce4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    let ab = _mm256_hadd_ps(a, b);
    let cd = _mm256_hadd_ps(c, d);
    let s = _mm256_hadd_ps(ab, cd);
    _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s))
}

/// Σ of the 32 floats at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_block(p: *const f32) -> f32 {
    let s = _mm256_add_ps(
        _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))),
        _mm256_add_ps(_mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))),
    );
    hsum(s)
}

/// How far ahead of a row group's weights [`prefetch_ahead`] reaches into L1, in bytes. The
/// hardware prefetchers alone left the Q8_0 LM head of Gemma 3 streaming at ~10 GB/s on one Zen 3
/// core against 15–18 GB/s for a plain read; prefetching every line 1–8 KiB ahead was 10–15%
/// faster (docs/PERFORMANCE.md, "Defaults chosen by measurement"), 2–4 KiB best.
pub(super) const PREFETCH_AHEAD: usize = 2048;

/// How far ahead [`prefetch_ahead`] also asks for each line into L2 (`prefetcht1`), in bytes.
/// A core reaching 34 GB/s from DRAM (Zen 5) needs more lines in flight than the L1 prefetches
/// can hold: 32 lines 2 KiB ahead cover ~18 GB/s at ~110 ns. The L2 requests carry the
/// distance; the L1 requests then hit L2. Q8_0 streamed 16 → 23 GB/s and SmolLM2 decode
/// ~+20% at 16 KiB, less at 8 or 24 (docs/PERFORMANCE.md, "Defaults chosen by measurement").
pub(super) const PREFETCH_L2_AHEAD: usize = 16384;

/// Issues a `prefetcht0` for every 64-byte line of `len` bytes starting [`PREFETCH_AHEAD`] bytes
/// after `p` (the weights of the row group after next, while this one computes) and a
/// `prefetcht1` for the same lines [`PREFETCH_L2_AHEAD`] bytes after `p`. Prefetches never
/// fault, so the ranges may run past the tile (into the next tiles of the stripe, the next
/// stripe, or past the mapping); `wrapping_add` keeps the address arithmetic defined there.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn prefetch_ahead(p: *const u8, len: usize) {
    let l1 = p.wrapping_add(PREFETCH_AHEAD);
    let l2 = p.wrapping_add(PREFETCH_L2_AHEAD);
    let mut o = 0;
    while o < len {
        _mm_prefetch::<_MM_HINT_T0>(l1.wrapping_add(o) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(l2.wrapping_add(o) as *const i8);
        o += 64;
    }
}

/// Two 256-bit halves as one 512-bit vector (low, high).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
pub(crate) unsafe fn join512(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Integer dot of 64 unsigned levels `q` with 64 activation quants `y`, scaled per 128-bit lane
/// group: `vpdpbusd` then the i32 scales `s32` (`VNNI`), or `vpmaddubsw` + `vpmaddwd` by the i16
/// scales `s16` (AVX-512 BW). Inlined into the one-row K-quant kernels' builds, whose features
/// it then has.
#[inline(always)]
pub(crate) unsafe fn dot64<const VNNI: bool>(
    q: __m512i,
    y: __m512i,
    s16: __m512i,
    s32: __m512i,
) -> __m512i {
    if VNNI {
        _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, y), s32)
    } else {
        _mm512_madd_epi16(_mm512_maddubs_epi16(q, y), s16)
    }
}

/// Folds a 512-bit accumulator to 256 bits (lane-wise sum of its halves).
#[inline]
#[target_feature(enable = "avx512f,avx2")]
pub(crate) unsafe fn fold512(v: __m512) -> __m256 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    _mm256_add_ps(lo, hi)
}
