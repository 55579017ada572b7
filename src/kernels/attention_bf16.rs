//! Decode attention over a bfloat16 KV cache with `vdpbf16ps` (AVX512-BF16): the heads of one
//! KV group over one chunk of positions (or all of them), into a partial result as
//! [`super::attention`]'s kernels write it (each head's unnormalized `Σ_t w_t v_t` and its
//! `(m, Σ_t w_t)`, merged there).
//!
//! The f32-operand kernel converts every K/V element to f32 and multiplies once per lane; here
//! each `vdpbf16ps` adds two bf16 products per f32 lane, and the rows need no conversion:
//! 1. scores: the queries are rounded to bf16 once per call (nearest-even); a query and a K row
//!    pair adjacent dimensions (`(x[2d], x[2d + 1])` in one 32-bit lane), so a 32-dimension
//!    step of one (head, position) is one instruction. Four positions and up to four heads run
//!    together (16 accumulators), reduced as the AVX2 kernel reduces them;
//! 2. the softmax in f32 (scaled, soft-capped when set, `exp(s − m)`), each weight then rounded
//!    to bf16, and the sum taken over the rounded weights, so the divisor is the sum of the
//!    weights used;
//! 3. the V sum pairs adjacent positions: the weights `(w_t, w_{t+1})` against V rows `t` and
//!    `t + 1` interleaved in registers (`vpunpck[lh]wd`, which orders the columns within each
//!    128-bit lane; the accumulators are put back in column order once, at the end). An odd
//!    last position pairs with a zero row.
//!
//! Against the f32-operand kernel on the same cache the outputs move by the bf16 rounding of the
//! queries and weights (about 2⁻⁹ relative each); [`super::attention_block::reference_bf16`]
//! rounds the same operands and is the scalar reference (tests below, and the KL divergence in
//! docs/PERFORMANCE.md). The sums run in another order than it, so the two agree to rounding.

/// True when [`avx512::heads`] runs heads of width `hd` on this CPU: AVX512-F/BW/VL/BF16 and a
/// width that is a multiple of 32.
pub fn usable(hd: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        hd.is_multiple_of(32)
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && super::attention_block::bf16_available()
            && super::Isa::Avx2.available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = hd;
        false
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx512 {
    use super::super::attention::avx2::{prefetch_step, softmax};
    use super::super::attention::{AttnShape, Kv};
    use crate::kernels::dot::simd::{hsum, hsum4};
    use half::bf16;
    use std::arch::x86_64::*;
    use std::mem::transmute;

    /// Scratch of one thread: the queries as bf16, the weight pairs, the scrambled V sums.
    #[derive(Default)]
    struct Scratch {
        q: Vec<u16>,
        w: Vec<u16>,
        acc: Vec<f32>,
    }

    fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
        thread_local! {
            static S: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
        }
        S.with(|s| f(&mut s.borrow_mut()))
    }

    /// Heads `0..g` of `q` (`g · hd` floats; all use KV head `kh`) over positions
    /// `sh.start..=sh.pos`, into `slot` (`g · (hd + 2)` floats: the partial result of
    /// [`super::super::attention`]'s `merge`). `scores` is the caller's score buffer. Prefetch
    /// hints as the AVX2 kernel's (`HINT`: `_MM_HINT_T0` or `_MM_HINT_T1`).
    ///
    /// # Safety
    /// [`super::usable`]`(sh.head_dim)`; rows `start..=pos` of `kc` and `vc` hold KV head `kh`
    /// at `sh.at(t, kh)`; `q` holds `g · hd` floats, `slot` `g · (hd + 2)`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    pub(in crate::kernels) unsafe fn heads<const HINT: i32>(
        sh: &AttnShape,
        q: &[f32],
        g: usize,
        Kv { k: kc, v: vc }: Kv<'_, bf16>,
        kh: usize,
        scores: &mut Vec<f32>,
        slot: &mut [f32],
    ) {
        let hd = sh.head_dim;
        debug_assert!(hd.is_multiple_of(32) && q.len() >= g * hd && slot.len() >= g * (hd + 2));
        debug_assert!(kc.len() >= sh.at(sh.pos, kh) + hd && vc.len() >= sh.at(sh.pos, kh) + hd);
        let k0 = kc.as_ptr().add(sh.at(sh.start, kh)) as *const u16;
        let v0 = vc.as_ptr().add(sh.at(sh.start, kh)) as *const u16;
        // SAFETY: as this function's contract; `body` has the same target features (a closure
        // would not take them).
        with_scratch(|s| unsafe { body::<HINT>(sh, q, g, (k0, v0), scores, slot, s) })
    }

    /// [`heads`] with the thread's scratch; `k0`/`v0` point at row `sh.start` of the KV head.
    ///
    /// # Safety
    /// As [`heads`]; `k0`/`v0` as `heads` forms them.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    unsafe fn body<const HINT: i32>(
        sh: &AttnShape,
        q: &[f32],
        g: usize,
        (k0, v0): (*const u16, *const u16),
        scores: &mut Vec<f32>,
        slot: &mut [f32],
        s: &mut Scratch,
    ) {
        let (hd, stride) = (sh.head_dim, sh.row_stride);
        let n = sh.pos + 1 - sh.start;
        let (out, ml) = slot.split_at_mut(g * hd);
        {
            // The queries in bf16, in dimension order.
            s.q.resize(g * hd, 0);
            for c in (0..g * hd).step_by(32) {
                let p = q.as_ptr().add(c);
                let b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p.add(16)), _mm512_loadu_ps(p));
                _mm512_storeu_si512(
                    s.q.as_mut_ptr().add(c) as *mut _,
                    transmute::<__m512bh, __m512i>(b),
                );
            }
            scores.clear();
            scores.resize(g * n, 0.0);
            let row_bytes = hd * 2;
            let mut i = 0;
            while i + 4 <= n {
                prefetch_step::<HINT>((k0 as *const u8, v0 as *const u8), i, stride * 2, row_bytes);
                let mut j = 0;
                while j < g {
                    let qj = s.q.as_ptr().add(j * hd);
                    let (kb, sj) = (k0.add(i * stride), scores.as_mut_ptr().add(j * n + i));
                    j += match g - j {
                        1 => dots4::<1>(qj, kb, stride, hd, sj, n),
                        2 => dots4::<2>(qj, kb, stride, hd, sj, n),
                        3 => dots4::<3>(qj, kb, stride, hd, sj, n),
                        _ => dots4::<4>(qj, kb, stride, hd, sj, n),
                    };
                }
                i += 4;
            }
            for t in i..n {
                for j in 0..g {
                    scores[j * n + t] = dot(s.q.as_ptr().add(j * hd), k0.add(t * stride), hd);
                }
            }
            // Softmax per head; the rounded weights as bf16 in position order (a 32-bit read
            // at position 2i is the pair (w_2i, w_2i+1)), padded with a zero weight.
            let np = n.div_ceil(2);
            s.w.resize(g * 2 * np, 0);
            for j in 0..g {
                let sj = &mut scores[j * n..(j + 1) * n];
                let (m, l) = softmax::<true>(sh, sj);
                ml[2 * j] = m;
                ml[2 * j + 1] = l;
                let wj = s.w.as_mut_ptr().add(j * 2 * np);
                let mut i = 0;
                while i + 32 <= n {
                    // Exact: the weights are bf16 values already.
                    let p = sj.as_ptr().add(i);
                    let b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p.add(16)), _mm512_loadu_ps(p));
                    _mm512_storeu_si512(wj.add(i) as *mut _, transmute::<__m512bh, __m512i>(b));
                    i += 32;
                }
                for t in i..2 * np {
                    *wj.add(t) = sj.get(t).map_or(0, |x| (x.to_bits() >> 16) as u16);
                }
            }
            // The V sums, blocks of positions (L1-sized) by 32 columns, accumulators carried in
            // `acc` in the unpack order.
            s.acc.clear();
            s.acc.resize(g * hd, 0.0);
            let pb = (16 * 1024 / (2 * hd)).max(8) & !1;
            let mut p0 = 0;
            while p0 < n {
                let p1 = (p0 + pb).min(n);
                let mut j = 0;
                while j < g {
                    let (w, a) = (s.w.as_ptr().add(j * 2 * np), s.acc.as_mut_ptr().add(j * hd));
                    let vb = (v0, stride, p0, p1);
                    j += match g - j {
                        1 => weighted::<1>(w, np, vb, a, hd),
                        2 => weighted::<2>(w, np, vb, a, hd),
                        3 => weighted::<3>(w, np, vb, a, hd),
                        _ => weighted::<4>(w, np, vb, a, hd),
                    };
                }
                p0 = p1;
            }
            // Back to column order: in each 32-column step, lane 4L + i of the low half holds
            // column 8L + i and of the high half column 8L + 4 + i.
            for j in 0..g {
                for c in (0..hd).step_by(32) {
                    let a = &s.acc[j * hd + c..j * hd + c + 32];
                    let o = &mut out[j * hd + c..j * hd + c + 32];
                    for l in 0..4 {
                        for i in 0..4 {
                            o[8 * l + i] = a[4 * l + i];
                            o[8 * l + 4 + i] = a[16 + 4 * l + i];
                        }
                    }
                }
            }
        }
    }

    /// `out[j·n + r]` = bf16 dot of query `j` (`q + j·hd`, bf16) and K row `r` of the 4 at
    /// `k + r·stride`, for `G` heads; returns `G`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    unsafe fn dots4<const G: usize>(
        q: *const u16,
        k: *const u16,
        stride: usize,
        hd: usize,
        out: *mut f32,
        n: usize,
    ) -> usize {
        let mut acc = [[_mm512_setzero_ps(); 4]; G];
        for c in (0..hd).step_by(32) {
            let kr: [__m512bh; 4] =
                core::array::from_fn(|r| transmute(_mm512_loadu_si512(k.add(r * stride + c) as _)));
            for (j, a) in acc.iter_mut().enumerate() {
                let qv: __m512bh = transmute(_mm512_loadu_si512(q.add(j * hd + c) as _));
                for (a, k) in a.iter_mut().zip(kr) {
                    *a = _mm512_dpbf16_ps(*a, qv, k);
                }
            }
        }
        for (j, a) in acc.into_iter().enumerate() {
            _mm_storeu_ps(out.add(j * n), hsum4(a.map(|x| halves(x))));
        }
        G
    }

    /// The bf16 dot of one query and one K row (the tail positions).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    unsafe fn dot(q: *const u16, k: *const u16, hd: usize) -> f32 {
        let mut a = _mm512_setzero_ps();
        for c in (0..hd).step_by(32) {
            let qv: __m512bh = transmute(_mm512_loadu_si512(q.add(c) as _));
            let kv: __m512bh = transmute(_mm512_loadu_si512(k.add(c) as _));
            a = _mm512_dpbf16_ps(a, qv, kv);
        }
        hsum(halves(a))
    }

    /// The two 256-bit halves of `x` added.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn halves(x: __m512) -> __m256 {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
        _mm256_add_ps(_mm512_castps512_ps256(x), hi)
    }

    /// For `G` heads (bf16 weights `w + j·2·np`, accumulators `acc + j·hd`), positions
    /// `p0..p1` of `v` (`p0` even): `acc += Σ (w_t, w_{t+1}) · (v_t, v_{t+1})`, 32 columns at a
    /// time, unpack order. Returns `G`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    unsafe fn weighted<const G: usize>(
        w: *const u16,
        np: usize,
        (v, stride, p0, p1): (*const u16, usize, usize, usize),
        acc: *mut f32,
        hd: usize,
    ) -> usize {
        let zero = _mm512_setzero_si512();
        for c in (0..hd).step_by(32) {
            let mut a: [[__m512; 2]; G] = core::array::from_fn(|j| {
                let p = acc.add(j * hd + c);
                [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
            });
            let mut t = p0;
            while t < p1 {
                let x = _mm512_loadu_si512(v.add(t * stride + c) as _);
                let y = if t + 1 < p1 {
                    _mm512_loadu_si512(v.add((t + 1) * stride + c) as _)
                } else {
                    zero
                };
                let lo: __m512bh = transmute(_mm512_unpacklo_epi16(x, y));
                let hi: __m512bh = transmute(_mm512_unpackhi_epi16(x, y));
                for (j, a) in a.iter_mut().enumerate() {
                    let pair = (w.add(j * 2 * np + t) as *const i32).read_unaligned();
                    let wp: __m512bh = transmute(_mm512_set1_epi32(pair));
                    a[0] = _mm512_dpbf16_ps(a[0], wp, lo);
                    a[1] = _mm512_dpbf16_ps(a[1], wp, hi);
                }
                t += 2;
            }
            for (j, a) in a.iter().enumerate() {
                let p = acc.add(j * hd + c);
                _mm512_storeu_ps(p, a[0]);
                _mm512_storeu_ps(p.add(16), a[1]);
            }
        }
        G
    }
}

#[cfg(test)]
mod tests {
    use super::super::attention::{attend, AttnShape, Batch, Kv};
    use super::super::attention_block::reference_bf16;
    use super::super::pool::ThreadPool;
    use super::super::Isa;
    use half::bf16;

    /// The f32-operand kernel's test shapes whose head width the bf16 kernel takes (a multiple
    /// of 32: groups of 1, 3, 4, 5 and 8 heads, over 1 to 8 chunk boundaries), with K and V
    /// rounded to bf16.
    fn cases() -> Vec<AttnShape> {
        let mut v = super::super::attention::tests::cases();
        v.retain(|s| s.head_dim.is_multiple_of(32));
        v
    }

    fn inputs(sh: &AttnShape, seed: u64) -> (Vec<f32>, Vec<bf16>, Vec<bf16>) {
        let (q, k, v) = super::super::attention::tests::inputs(sh, seed);
        let to = |x: Vec<f32>| x.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
        (q, to(k), to(v))
    }

    /// On AVX512-BF16 CPUs, decode over a bf16 cache (1–3 threads: one pass, or 256-position
    /// chunks merged) matches the scalar reference that rounds the same operands, within
    /// 2·10⁻³ · (1 + |want|); every thread count above one gives the same bits; and it is not
    /// the f32-operand kernel (which the AVX2 ISA runs on the same cache).
    #[test]
    fn bf16_decode_matches_its_reference() {
        if !super::usable(32) || !Isa::Avx512.available() {
            println!("SKIP: this CPU has no AVX512-BF16");
            return;
        }
        let mut differs = 0;
        for (ci, sh) in cases().iter().enumerate() {
            if sh.cap > 0.0 {
                // The reference has no soft-cap: checked against the AVX2 build below.
                continue;
            }
            let (q, k, v) = inputs(sh, ci as u64 + 7);
            let row = sh.n_heads * sh.head_dim;
            let mut want = vec![0f32; row];
            let b = Batch {
                window: sh.pos + 1 - sh.start,
                pos0: sh.pos,
                n: 1,
                bf16: true,
            };
            reference_bf16(sh, b, &q, Kv { k: &k, v: &v }, &mut want);
            let mut multi: Option<Vec<f32>> = None;
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let mut got = vec![f32::NAN; row];
                attend(&pool, Isa::Avx512, sh, &q, &k, &v, &mut got);
                for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (x - y).abs() <= 2e-3 * (1.0 + y.abs()),
                        "case {ci} ({sh:?}) t{threads} [{i}]: {x} vs reference {y}"
                    );
                }
                if threads > 1 {
                    match &multi {
                        None => multi = Some(got.clone()),
                        Some(m) => assert!(
                            m.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "case {ci}: 2 and {threads} threads differ"
                        ),
                    }
                }
                let mut f32_ops = vec![f32::NAN; row];
                attend(&pool, Isa::Avx2, sh, &q, &k, &v, &mut f32_ops);
                differs += usize::from(f32_ops != got);
            }
        }
        assert!(differs > 0, "the bf16 kernel never ran");
    }

    /// [`reference_bf16`] with a soft-cap (which it lacks), one position, in f64.
    fn reference_capped(sh: &AttnShape, q: &[f32], k: &[bf16], v: &[bf16]) -> Vec<f32> {
        let r = |x: f32| bf16::from_f32(x).to_f32() as f64;
        let hd = sh.head_dim;
        let mut att = vec![0f32; sh.n_heads * hd];
        for h in 0..sh.n_heads {
            let kh = h / sh.group;
            let s: Vec<f64> = (sh.start..=sh.pos)
                .map(|t| {
                    let d: f64 = (0..hd)
                        .map(|d| r(q[h * hd + d]) * k[sh.at(t, kh) + d].to_f64())
                        .sum();
                    let c = sh.cap as f64;
                    c * (d * sh.scale as f64 / c).tanh()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|&x| r((x - m).exp() as f32)).collect();
            let sum: f64 = w.iter().sum();
            for d in 0..hd {
                let o: f64 = (sh.start..=sh.pos)
                    .zip(&w)
                    .map(|(t, w)| w * v[sh.at(t, kh) + d].to_f64())
                    .sum();
                att[h * hd + d] = (o / sum) as f32;
            }
        }
        att
    }

    /// With a soft-cap, against [`reference_capped`] within the same bound.
    #[test]
    fn bf16_decode_with_a_softcap_matches_its_reference() {
        if !super::usable(32) || !Isa::Avx512.available() {
            println!("SKIP: this CPU has no AVX512-BF16");
            return;
        }
        for (ci, sh) in cases().iter().enumerate().filter(|(_, s)| s.cap > 0.0) {
            let (q, k, v) = inputs(sh, ci as u64 + 11);
            let want = reference_capped(sh, &q, &k, &v);
            for threads in [1, 2] {
                let pool = ThreadPool::new(threads);
                let mut got = vec![f32::NAN; want.len()];
                attend(&pool, Isa::Avx512, sh, &q, &k, &v, &mut got);
                for (x, y) in got.iter().zip(&want) {
                    assert!(
                        (x - y).abs() <= 2e-3 * (1.0 + y.abs()),
                        "case {ci} t{threads}: {x} vs {y}"
                    );
                }
            }
        }
    }
}
