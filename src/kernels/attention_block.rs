//! Prefill attention over a block of up to 16 consecutive query positions at once, with the
//! positions in the lanes of an AVX-512 register ([`attention::attend_batch`] uses it where
//! [`usable`]).
//!
//! Per task (a block of positions × one KV group), for each head of the group:
//! 1. scores `s[t][i] = scale · q_i · k_t` for every key `t` the block needs, 16 positions per
//!    vector: the block's queries are transposed once (`qt[d]` = dimension `d` of the 16
//!    queries), each K row is converted to f32 once for all the group's heads, and a score
//!    vector is `hd` FMAs with the key's element broadcast. Keys outside a position's own range
//!    (after it, or before its sliding window) are masked out;
//! 2. the softmax down each lane: the maximum, `exp(s − max)` (`act`'s vector `exp`, masked keys
//!    exactly 0) and the sum;
//! 3. `Σ_t w_t v_t` with the weight vector times the V element broadcast, 16 output
//!    dimensions at a time, then divided by the sum.
//!
//! Against the per-query kernels ([`attention::attend`]) this reads and converts each K/V row
//! once per block instead of once per position, and needs no horizontal sums. It sums in
//! another order, so it agrees with them (and with the float64 forward) to rounding, not bit
//! for bit: prefill's logits already differ from decode's by rounding (tested in
//! `tests/engine_styles.rs`). No soft-cap (those shapes keep the per-query kernel).
//!
//! [`attention::attend_batch`]: super::attention::attend_batch
//! [`attention::attend`]: super::attention::attend

use super::attention::{AttnShape, Batch, Kv, Ptr};
use super::kv_elem::KvElem;
use super::pool::ThreadPool;

/// Query positions per block (the lanes).
pub const LANES: usize = 16;

/// True when the block kernel runs `sh` on this CPU: AVX-512F with AVX2/FMA/F16C, a head width
/// that is a multiple of 16 (at most 512), at most 8 heads per KV head, and no soft-cap.
pub fn usable(sh: &AttnShape) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        sh.cap <= 0.0
            && sh.group <= 8
            && sh.head_dim.is_multiple_of(16)
            && sh.head_dim <= 512
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = sh;
        false
    }
}

/// The prefill batch `Batch { window, pos0, n }` (as [`super::attention::attend_batch`]) in
/// blocks of [`LANES`] positions: one pool task per (block, KV group), latest blocks first.
/// The caller checked the shape (`check_shape` on the last position) and [`usable`].
pub fn attend_batch<T: KvElem>(
    pool: &ThreadPool,
    sh: &AttnShape,
    Batch { window, pos0, n }: Batch,
    q: &[f32],
    kv: Kv<'_, T>,
    att: &mut [f32],
) {
    assert!(usable(sh), "attention_block: shape or CPU not supported");
    let (hd, nh) = (sh.head_dim, sh.n_heads);
    let row = nh * hd;
    assert!(q.len() >= n * row && att.len() >= n * row);
    let blocks = n.div_ceil(LANES);
    let groups = nh.div_ceil(sh.group);
    let out = Ptr(att.as_mut_ptr());
    pool.run(blocks * groups, &|task| {
        let blk = blocks - 1 - task / groups;
        let h0 = task % groups * sh.group;
        let g = sh.group.min(nh - h0);
        let (b0, b1) = (blk * LANES, (blk * LANES + LANES).min(n));
        let o = out;
        let job = Job {
            sh,
            window,
            pos0: pos0 + b0,
            nq: b1 - b0,
            h0,
            g,
            q: &q[b0 * row..b1 * row],
        };
        // SAFETY: `usable` checked the CPU features, the head width and the group size; the
        // K/V rows read lie in `kv` (the caller's `check_shape` on the batch's last position,
        // and no key of a block is past it); this task writes rows b0..b1, heads h0..h0 + g of
        // `att` (inside it: n · row ≤ len, asserted), which no other task writes.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            with_scratch(|s| avx512::block(&job, kv, s, o.0.add(b0 * row)))
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (job, o, kv);
    });
}

/// One task's work: positions `pos0 .. pos0 + nq` (their query rows in `q`), heads
/// `h0 .. h0 + g` (one KV group).
struct Job<'a> {
    sh: &'a AttnShape,
    window: usize,
    pos0: usize,
    nq: usize,
    h0: usize,
    g: usize,
    q: &'a [f32],
}

/// Per-thread buffers: transposed queries, scores, converted K/V rows, output accumulators.
#[derive(Default)]
struct Scratch {
    qt: Vec<f32>,
    scores: Vec<f32>,
    rows: Vec<f32>,
    acc: Vec<f32>,
}

fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    thread_local! {
        static S: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
    }
    S.with_borrow_mut(f)
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use crate::kernels::act::exp_avx2;
    use std::arch::x86_64::*;

    /// Keys converted per step (the weighted V sum keeps its 16 accumulators over all of them).
    const KC: usize = 32;
    /// Keys scored together (their score vectors stay in registers).
    const KS: usize = 8;

    /// `e^x` for 16 lanes, as `act`'s 8-lane `exp` on each half.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn exp16(x: __m512) -> __m512 {
        let lo = exp_avx2(_mm512_castps512_ps256(x));
        let hi = exp_avx2(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
            _mm512_castps_pd(x),
        )));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castps_pd(_mm512_castps256_ps512(lo)),
            _mm256_castps_pd(hi),
        ))
    }

    /// Rows `t0 .. t0 + k` of KV head `kh` of `c` as f32 into `rows` (`KC` rows of `hd`; rows
    /// past `k` are zero).
    ///
    /// # Safety
    /// AVX2/F16C; rows `t0 .. t0 + k` of KV head `kh` lie in `c`; `rows` holds `KC · hd`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn convert<T: KvElem>(
        sh: &AttnShape,
        c: &[T],
        kh: usize,
        (t0, k): (usize, usize),
        rows: &mut [f32],
    ) {
        let hd = sh.head_dim;
        for j in 0..KC {
            let dst = rows.as_mut_ptr().add(j * hd);
            if j >= k {
                std::ptr::write_bytes(dst, 0, hd);
                continue;
            }
            let src = c.as_ptr().add(sh.at(t0 + j, kh));
            for d in (0..hd).step_by(8) {
                _mm256_storeu_ps(dst.add(d), T::load8(src.add(d)));
            }
        }
    }

    /// The lanes of key `t` that attend to it: positions `p` with `start(p) <= t <= p`.
    fn lanes_for(t: usize, first: &[usize; LANES], last: &[usize; LANES]) -> __mmask16 {
        if first[LANES - 1] <= t && t <= last[0] {
            return 0xFFFF;
        }
        let mut m: __mmask16 = 0;
        for i in 0..LANES {
            if first[i] <= t && t <= last[i] {
                m |= 1 << i;
            }
        }
        m
    }

    /// One task ([`Job`]): writes `att` rows `0..nq` (from `o`, `n_heads · hd` apart), heads
    /// `h0..h0 + g`.
    ///
    /// # Safety
    /// As at the call in [`super::attend_batch`].
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn block<T: KvElem>(j: &Job, kv: Kv<'_, T>, s: &mut Scratch, o: *mut f32) {
        let sh = j.sh;
        let (hd, row) = (sh.head_dim, sh.n_heads * sh.head_dim);
        let kh = j.h0 / sh.group;
        // Each lane's range; padding lanes copy the last real position's.
        let mut first = [0usize; LANES];
        let mut last = [0usize; LANES];
        for i in 0..LANES {
            let p = j.pos0 + i.min(j.nq - 1);
            first[i] = AttnShape::window_start(p, j.window);
            last[i] = p;
        }
        let (lo, hi) = (first[0], last[LANES - 1]);
        let nk = hi + 1 - lo;
        s.qt.resize(j.g * hd * LANES, 0.0);
        s.scores.resize(j.g * nk * LANES, 0.0);
        s.rows.resize(KC * hd, 0.0);
        s.acc.resize(j.g * hd * LANES, 0.0);
        // Queries transposed: qt[(h·hd + d)·16 + i] = q of position i, head h0 + h, dim d.
        for h in 0..j.g {
            for i in 0..LANES {
                let src = &j.q[i.min(j.nq - 1) * row + (j.h0 + h) * hd..][..hd];
                for (d, &v) in src.iter().enumerate() {
                    s.qt[(h * hd + d) * LANES + i] = v;
                }
            }
        }
        let scale = _mm512_set1_ps(sh.scale);
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        // 1. Scores.
        let mut t0 = lo;
        while t0 <= hi {
            let k = KC.min(hi + 1 - t0);
            convert(sh, kv.k, kh, (t0, k), &mut s.rows);
            let kr = s.rows.as_ptr();
            let masks: [__mmask16; KC] =
                std::array::from_fn(|jj| lanes_for(t0 + jj, &first, &last));
            for h in 0..j.g {
                let qt = s.qt.as_ptr().add(h * hd * LANES);
                let sp = s.scores.as_mut_ptr().add((h * nk + t0 - lo) * LANES);
                for j0 in (0..k).step_by(KS) {
                    let kp: [*const f32; KS] = std::array::from_fn(|jj| kr.add((j0 + jj) * hd));
                    let mut acc = [_mm512_setzero_ps(); KS];
                    for d in 0..hd {
                        let qv = _mm512_loadu_ps(qt.add(d * LANES));
                        for (a, kp) in acc.iter_mut().zip(&kp) {
                            *a = _mm512_fmadd_ps(qv, _mm512_set1_ps(*kp.add(d)), *a);
                        }
                    }
                    for (jj, a) in acc.iter().enumerate().take(k - j0) {
                        let m = masks[j0 + jj];
                        let v = _mm512_mask_blend_ps(m, ninf, _mm512_mul_ps(*a, scale));
                        _mm512_storeu_ps(sp.add((j0 + jj) * LANES), v);
                    }
                }
            }
            t0 += k;
        }
        // 2. Softmax down each lane (every lane has at least its own position).
        let mut sums = [_mm512_setzero_ps(); 8];
        for (h, sum) in sums.iter_mut().enumerate().take(j.g) {
            let sp = s.scores.as_mut_ptr().add(h * nk * LANES);
            let mut m = ninf;
            for t in 0..nk {
                m = _mm512_max_ps(m, _mm512_loadu_ps(sp.add(t * LANES)));
            }
            for t in 0..nk {
                let p = sp.add(t * LANES);
                let x = _mm512_loadu_ps(p);
                let valid = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(x, ninf);
                let e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(x, m)));
                _mm512_storeu_ps(p, e);
                *sum = _mm512_add_ps(*sum, e);
            }
        }
        // 3. Weighted V rows, 16 dimensions at a time, then ÷ the sum.
        s.acc.fill(0.0);
        let mut t0 = lo;
        while t0 <= hi {
            let k = KC.min(hi + 1 - t0);
            convert(sh, kv.v, kh, (t0, k), &mut s.rows);
            let vr = s.rows.as_ptr();
            for h in 0..j.g {
                let sp = s.scores.as_ptr().add((h * nk + t0 - lo) * LANES);
                for d0 in (0..hd).step_by(16) {
                    let ap = s.acc.as_mut_ptr().add((h * hd + d0) * LANES);
                    let mut a = [_mm512_setzero_ps(); 16];
                    for (dd, a) in a.iter_mut().enumerate() {
                        *a = _mm512_loadu_ps(ap.add(dd * LANES));
                    }
                    for jj in 0..k {
                        let w = _mm512_loadu_ps(sp.add(jj * LANES));
                        let v = vr.add(jj * hd + d0);
                        for (dd, a) in a.iter_mut().enumerate() {
                            *a = _mm512_fmadd_ps(w, _mm512_set1_ps(*v.add(dd)), *a);
                        }
                    }
                    for (dd, a) in a.iter().enumerate() {
                        _mm512_storeu_ps(ap.add(dd * LANES), *a);
                    }
                }
            }
            t0 += k;
        }
        let mut lane = [0f32; LANES];
        for (h, sum) in sums.iter().enumerate().take(j.g) {
            for d in 0..hd {
                let a = _mm512_loadu_ps(s.acc.as_ptr().add((h * hd + d) * LANES));
                _mm512_storeu_ps(lane.as_mut_ptr(), _mm512_div_ps(a, *sum));
                for (i, v) in lane.iter().enumerate().take(j.nq) {
                    *o.add(i * row + (j.h0 + h) * hd + d) = *v;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::attention::attend;
    use crate::kernels::Isa;

    fn shape(nh: usize, group: usize, hd: usize, ctx: usize) -> AttnShape {
        let kv_heads = nh / group;
        AttnShape {
            n_heads: nh,
            group,
            head_dim: hd,
            kv_dim: kv_heads * hd,
            row_stride: hd,
            head_stride: hd * ctx,
            start: 0,
            pos: 0,
            scale: 1.0 / (hd as f32).sqrt(),
            cap: 0.0,
        }
    }

    /// The block kernel against one per-query `attend` per position (scalar reference), for
    /// f32 and f16 caches, with and without a sliding window, whole and partial blocks, and a
    /// batch that starts after earlier positions.
    #[test]
    fn block_attention_equals_per_query_attention_to_rounding() {
        let pool = ThreadPool::new(2);
        for (nh, group, hd) in [(9, 3, 64), (4, 4, 256), (2, 1, 16)] {
            let ctx = 80;
            let sh = shape(nh, group, hd, ctx);
            if !usable(&sh) {
                println!("SKIP block attention: this CPU lacks AVX-512F");
                return;
            }
            let mut rng = crate::rng::Rng::new(hd as u64);
            let kvd = (nh / group) * hd * ctx;
            let kf = rng.fill(kvd, 1.0);
            let vf = rng.fill(kvd, 1.0);
            let kh: Vec<half::f16> = kf.iter().map(|&x| half::f16::from_f32(x)).collect();
            let vh: Vec<half::f16> = vf.iter().map(|&x| half::f16::from_f32(x)).collect();
            let row = nh * hd;
            for (window, pos0, n) in [(0, 0, 32), (0, 7, 21), (0, 40, 16), (12, 30, 35), (5, 0, 3)]
            {
                let q = rng.fill(n * row, 2.0);
                let b = Batch { window, pos0, n };
                let mut got32 = vec![0f32; n * row];
                attend_batch(&pool, &sh, b, &q, Kv { k: &kf, v: &vf }, &mut got32);
                let mut got16 = vec![0f32; n * row];
                attend_batch(&pool, &sh, b, &q, Kv { k: &kh, v: &vh }, &mut got16);
                for i in 0..n {
                    let p = pos0 + i;
                    let s = AttnShape {
                        start: AttnShape::window_start(p, window),
                        pos: p,
                        ..sh
                    };
                    let qi = &q[i * row..(i + 1) * row];
                    let mut want32 = vec![0f32; row];
                    attend(&pool, Isa::Scalar, &s, qi, &kf, &vf, &mut want32);
                    let mut want16 = vec![0f32; row];
                    attend(&pool, Isa::Scalar, &s, qi, &kh, &vh, &mut want16);
                    for (got, want) in [(&got32, &want32), (&got16, &want16)] {
                        let g = &got[i * row..(i + 1) * row];
                        for (x, y) in g.iter().zip(want) {
                            assert!(
                                (x - y).abs() <= 2e-5 * (1.0 + y.abs()),
                                "nh {nh} hd {hd} window {window} pos {p}: {x} vs {y}"
                            );
                        }
                    }
                }
            }
        }
    }
}
