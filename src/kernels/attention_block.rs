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
//! **BF16 build** (`Batch::bf16`, set with `--act q8`, on CPUs with AVX512-BF16): the same three
//! steps with the queries, K rows, softmax weights and V rows rounded to bfloat16 (nearest-even),
//! each `vdpbf16ps` adding two products per lane in f32, so a score takes `hd / 2`
//! instructions instead of `hd`, and so does a weighted V element. Queries and K rows pair
//! adjacent dimensions (`(x[2d], x[2d + 1])` in one 32-bit lane); the weights and V rows pair
//! adjacent keys (`(w_t, w_{t+1})` against `(v_t[d], v_{t+1}[d])`). Each weight is rounded
//! before it is summed, so the divisor is the sum of the weights used; the scores, the softmax
//! and the accumulators stay f32. [`reference_bf16`] is its scalar reference (within 2·10⁻³,
//! tested); against the f32 build it moves outputs by up to ~1 % on random data. Measured
//! cost and gain: docs/PERFORMANCE.md, "Prefill".
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

/// True when the CPU has what the BF16 build needs beyond [`usable`]: AVX512-BF16 and -BW.
pub fn bf16_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512bf16") && is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// What runs prefill's attention on `isa` (with `bf16` allowed: `--act q8`), for reports:
/// the block kernel's BF16 or f32 build, or the per-position kernels. Shapes [`usable`]
/// refuses (a soft-cap, more than 8 heads per KV head) take the per-position kernels anyway.
pub fn label(isa: crate::kernels::Isa, bf16: bool) -> &'static str {
    use crate::kernels::Isa;
    match isa {
        Isa::Avx512 if Isa::Avx512.available() && bf16 && bf16_available() => {
            "prefill attention: 16-position blocks, bf16 operands (AVX512-BF16)"
        }
        Isa::Avx512 if Isa::Avx512.available() => "prefill attention: 16-position blocks (AVX-512)",
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.available() => {
            "prefill attention: per position (AVX2)"
        }
        _ => "prefill attention: per position (scalar)",
    }
}

/// The prefill batch `Batch { window, pos0, n, bf16 }` (as [`super::attention::attend_batch`]) in
/// blocks of [`LANES`] positions: one pool task per (block, KV group), latest blocks first.
/// With `bf16` on a CPU that has it ([`bf16_available`]) the BF16 build runs, else the f32 one.
/// The caller checked the shape (`check_shape` on the last position) and [`usable`].
pub fn attend_batch<T: KvElem>(
    pool: &ThreadPool,
    sh: &AttnShape,
    Batch {
        window,
        pos0,
        n,
        bf16,
    }: Batch,
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
    let bf16 = bf16 && bf16_available();
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
        // `att` (inside it: n · row ≤ len, asserted), which no other task writes. The BF16
        // build runs only where `bf16_available` found AVX512-BF16/BW.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            with_scratch(|s| {
                if bf16 {
                    avx512::block_bf16(&job, kv, s, o.0.add(b0 * row))
                } else {
                    avx512::block(&job, kv, s, o.0.add(b0 * row))
                }
            })
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (job, o, kv, bf16);
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

impl Job<'_> {
    /// Lane `i`'s query for head `h0 + h` (padding lanes repeat the last real position's).
    fn query(&self, h: usize, i: usize) -> &[f32] {
        let (hd, row) = (self.sh.head_dim, self.sh.n_heads * self.sh.head_dim);
        &self.q[i.min(self.nq - 1) * row + (self.h0 + h) * hd..][..hd]
    }
}

/// Per-thread buffers: transposed queries, scores, converted K/V rows, output accumulators.
#[derive(Default)]
struct Scratch {
    qt: Vec<f32>,
    scores: Vec<f32>,
    rows: Vec<f32>,
    acc: Vec<f32>,
    /// The BF16 build's operands: transposed query pairs, K rows, V row pairs, weight pairs.
    qp: Vec<u32>,
    kb: Vec<u32>,
    vp: Vec<u32>,
    wp: Vec<u32>,
}

fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    thread_local! {
        static S: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
    }
    S.with_borrow_mut(f)
}

/// The lanes of key `t` that attend to it: positions `p` with `start(p) <= t <= p`.
fn lanes_for(t: usize, first: &[usize; LANES], last: &[usize; LANES]) -> u16 {
    if first[LANES - 1] <= t && t <= last[0] {
        return 0xFFFF;
    }
    let mut m = 0u16;
    for i in 0..LANES {
        if first[i] <= t && t <= last[i] {
            m |= 1 << i;
        }
    }
    m
}

/// Each lane's key range (`first[i] ..= last[i]`) for a job; padding lanes copy the last real
/// position's.
fn lane_ranges(j: &Job) -> ([usize; LANES], [usize; LANES]) {
    let mut first = [0usize; LANES];
    let mut last = [0usize; LANES];
    for i in 0..LANES {
        let p = j.pos0 + i.min(j.nq - 1);
        first[i] = AttnShape::window_start(p, j.window);
        last[i] = p;
    }
    (first, last)
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use crate::kernels::act::exp_avx2;
    use std::arch::x86_64::*;
    use std::mem::transmute;

    /// Keys converted per step (even: the BF16 build's V rows go in pairs; the weighted V sum
    /// keeps its 16 accumulators over all of them).
    const KC: usize = 32;
    /// Keys scored together (their score vectors stay in registers).
    const KS: usize = 8;

    /// A job's key span: each lane's range (`first[i] ..= last[i]`), their union `lo ..= hi`
    /// (`nk` keys), the head width and the KV head.
    struct Span {
        first: [usize; LANES],
        last: [usize; LANES],
        lo: usize,
        hi: usize,
        nk: usize,
        hd: usize,
        kh: usize,
    }

    impl Span {
        fn of(j: &Job) -> Span {
            let (first, last) = lane_ranges(j);
            let (lo, hi) = (first[0], last[LANES - 1]);
            Span {
                first,
                last,
                lo,
                hi,
                nk: hi + 1 - lo,
                hd: j.sh.head_dim,
                kh: j.h0 / j.sh.group,
            }
        }

        /// The key chunks `(t0, k)` of at most [`KC`] keys.
        fn chunks(&self) -> impl Iterator<Item = (usize, usize)> {
            let hi = self.hi;
            (self.lo..=hi)
                .step_by(KC)
                .map(move |t0| (t0, KC.min(hi + 1 - t0)))
        }

        /// Lane masks of the keys of the chunk at `t0`.
        fn masks(&self, t0: usize) -> [u16; KC] {
            std::array::from_fn(|jj| lanes_for(t0 + jj, &self.first, &self.last))
        }
    }

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

    /// 16 cache values from `p` as f32.
    ///
    /// # Safety
    /// AVX-512F/AVX2/F16C; `p .. p + 16` readable.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn load16<T: KvElem>(p: *const T) -> __m512 {
        let (lo, hi) = (T::load8(p), T::load8(p.add(8)));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castps_pd(_mm512_castps256_ps512(lo)),
            _mm256_castps_pd(hi),
        ))
    }

    /// One task ([`Job`]) with f32 operands: writes `att` rows `0..nq` (from `o`, `n_heads · hd`
    /// apart), heads `h0..h0 + g`.
    ///
    /// # Safety
    /// As at the call in [`super::attend_batch`].
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn block<T: KvElem>(j: &Job, kv: Kv<'_, T>, s: &mut Scratch, o: *mut f32) {
        let sp = Span::of(j);
        s.scores.resize(j.g * sp.nk * LANES, 0.0);
        s.acc.resize(j.g * sp.hd * LANES, 0.0);
        scores(j, kv.k, &sp, s);
        let sums = softmax::<false>(j, &sp, s);
        weighted_v(j, kv.v, &sp, s);
        store(j, &sp, s, &sums, o);
    }

    /// [`block`] with bf16 operands (the module docs, "BF16 build").
    ///
    /// # Safety
    /// As [`block`], and the CPU has AVX512-BF16 and AVX512-BW.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
    pub(super) unsafe fn block_bf16<T: KvElem>(
        j: &Job,
        kv: Kv<'_, T>,
        s: &mut Scratch,
        o: *mut f32,
    ) {
        let sp = Span::of(j);
        s.scores.resize(j.g * sp.nk * LANES, 0.0);
        s.acc.resize(j.g * sp.hd * LANES, 0.0);
        scores_bf16(j, kv.k, &sp, s);
        let sums = softmax::<true>(j, &sp, s);
        weighted_v_bf16(j, kv.v, &sp, s);
        store(j, &sp, s, &sums, o);
    }

    /// Step 1, f32: `scores[h][t][i] = scale · q_i · k_t` (−∞ where lane `i` does not attend to
    /// key `t`). The block's queries are transposed once (`qt[(h·hd + d)·16 + i]`); each K row
    /// is converted once for all the group's heads; a score vector is `hd` FMAs.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn scores<T: KvElem>(j: &Job, kc: &[T], sp: &Span, s: &mut Scratch) {
        let (sh, hd) = (j.sh, sp.hd);
        s.qt.resize(j.g * hd * LANES, 0.0);
        s.rows.resize(KC * hd, 0.0);
        for h in 0..j.g {
            for i in 0..LANES {
                for (d, &v) in j.query(h, i).iter().enumerate() {
                    s.qt[(h * hd + d) * LANES + i] = v;
                }
            }
        }
        let scale = _mm512_set1_ps(sh.scale);
        for (t0, k) in sp.chunks() {
            // Rows past `k` keep an earlier chunk's keys (or zeros): scored, not stored.
            for jj in 0..k {
                let dst = s.rows.as_mut_ptr().add(jj * hd);
                let src = kc.as_ptr().add(sh.at(t0 + jj, sp.kh));
                for d in (0..hd).step_by(16) {
                    _mm512_storeu_ps(dst.add(d), load16(src.add(d)));
                }
            }
            let kr = s.rows.as_ptr();
            let masks = sp.masks(t0);
            for h in 0..j.g {
                let qt = s.qt.as_ptr().add(h * hd * LANES);
                let out = s.scores.as_mut_ptr().add((h * sp.nk + t0 - sp.lo) * LANES);
                for j0 in (0..k).step_by(KS) {
                    let kp: [*const f32; KS] = std::array::from_fn(|jj| kr.add((j0 + jj) * hd));
                    let mut acc = [_mm512_setzero_ps(); KS];
                    for d in 0..hd {
                        let qv = _mm512_loadu_ps(qt.add(d * LANES));
                        for (a, kp) in acc.iter_mut().zip(&kp) {
                            *a = _mm512_fmadd_ps(qv, _mm512_set1_ps(*kp.add(d)), *a);
                        }
                    }
                    store_scores(&acc, k - j0, &masks[j0..], scale, out.add(j0 * LANES));
                }
            }
        }
    }

    /// The first `n` score vectors of `acc` (keys `0..n` of `out`, 16 lanes apart), scaled;
    /// −∞ in the lanes `masks` leaves out.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn store_scores(
        acc: &[__m512; KS],
        n: usize,
        masks: &[u16],
        scale: __m512,
        out: *mut f32,
    ) {
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        for (jj, a) in acc.iter().enumerate().take(n) {
            let v = _mm512_mask_blend_ps(masks[jj], ninf, _mm512_mul_ps(*a, scale));
            _mm512_storeu_ps(out.add(jj * LANES), v);
        }
    }

    /// Step 2: the softmax down each lane (every lane has at least its own position), the
    /// weights `exp(s − max)` written over the scores (masked keys exactly 0), their sums per
    /// head returned. `ROUND`: each weight rounded to bf16 before it is stored and summed, so
    /// the divisor is the sum of the weights the BF16 step 3 uses.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn softmax<const ROUND: bool>(j: &Job, sp: &Span, s: &mut Scratch) -> [__m512; 8] {
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut sums = [_mm512_setzero_ps(); 8];
        for (h, sum) in sums.iter_mut().enumerate().take(j.g) {
            let p0 = s.scores.as_mut_ptr().add(h * sp.nk * LANES);
            let mut m = ninf;
            for t in 0..sp.nk {
                m = _mm512_max_ps(m, _mm512_loadu_ps(p0.add(t * LANES)));
            }
            for t in 0..sp.nk {
                let p = p0.add(t * LANES);
                let x = _mm512_loadu_ps(p);
                let valid = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(x, ninf);
                let mut e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(x, m)));
                if ROUND {
                    e = round_bf16(e);
                }
                _mm512_storeu_ps(p, e);
                *sum = _mm512_add_ps(*sum, e);
            }
        }
        sums
    }

    /// Step 3, f32: `acc[h][d][i] += Σ_t w_t[i] · v_t[d]`, 16 dimensions at a time.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn weighted_v<T: KvElem>(j: &Job, vc: &[T], sp: &Span, s: &mut Scratch) {
        let hd = sp.hd;
        s.rows.resize(KC * hd, 0.0);
        s.acc.fill(0.0);
        for (t0, k) in sp.chunks() {
            for jj in 0..k {
                let src = vc.as_ptr().add(j.sh.at(t0 + jj, sp.kh));
                let dst = s.rows.as_mut_ptr().add(jj * hd);
                for d in (0..hd).step_by(16) {
                    _mm512_storeu_ps(dst.add(d), load16(src.add(d)));
                }
            }
            let vr = s.rows.as_ptr();
            for h in 0..j.g {
                let w0 = s.scores.as_ptr().add((h * sp.nk + t0 - sp.lo) * LANES);
                for d0 in (0..hd).step_by(16) {
                    let ap = s.acc.as_mut_ptr().add((h * hd + d0) * LANES);
                    let mut a: [__m512; 16] =
                        std::array::from_fn(|dd| _mm512_loadu_ps(ap.add(dd * LANES)));
                    for jj in 0..k {
                        let w = _mm512_loadu_ps(w0.add(jj * LANES));
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
        }
    }

    /// The outputs: `acc ÷ sum`, lane `i` to row `i` of `att` (from `o`), heads `h0..h0 + g`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn store(j: &Job, sp: &Span, s: &Scratch, sums: &[__m512; 8], o: *mut f32) {
        let (hd, row) = (sp.hd, j.sh.n_heads * sp.hd);
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

    /// 16-bit lane order that interleaves the two halves of `vcvtne2ps2bf16`'s result:
    /// `(a[m], b[m])` in 32-bit lane `m`.
    const PAIRS: [u16; 32] = {
        let mut p = [0u16; 32];
        let mut m = 0;
        while m < 16 {
            p[2 * m] = m as u16;
            p[2 * m + 1] = 16 + m as u16;
            m += 1;
        }
        p
    };

    /// `(a[m], b[m])` as bf16 in 32-bit lane `m`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
    unsafe fn pair(a: __m512, b: __m512) -> __m512i {
        let idx = _mm512_loadu_si512(PAIRS.as_ptr() as *const _);
        _mm512_permutexvar_epi16(
            idx,
            transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(b, a)),
        )
    }

    /// 16 values as bf16, in order (256 bits).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
    unsafe fn to_bf16(x: __m512) -> __m256i {
        transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(x))
    }

    /// `x` rounded to bf16 (nearest-even, in integer arithmetic as [`super::bf16_round`]) and
    /// widened back to f32: for the finite values here what `vcvtneps2bf16` gives.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn round_bf16(x: __m512) -> __m512 {
        let b = _mm512_castps_si512(x);
        let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
        let r = _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
        _mm512_castsi512_ps(_mm512_and_si512(
            r,
            _mm512_set1_epi32(0xFFFF_0000u32 as i32),
        ))
    }

    /// Step 1 with bf16 operands: queries and K rows pair adjacent dimensions (`(x[2d],
    /// x[2d + 1])` in a 32-bit lane), so a score vector is `hd / 2` `vdpbf16ps`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
    unsafe fn scores_bf16<T: KvElem>(j: &Job, kc: &[T], sp: &Span, s: &mut Scratch) {
        let (sh, hd) = (j.sh, sp.hd);
        let hp = hd / 2;
        s.qp.resize(j.g * hp * LANES, 0);
        s.kb.resize(KC * hp, 0);
        // qp[(h·hp + d)·16 + i] = (q[2d], q[2d + 1]) of position i, head h0 + h.
        let mut qb = [0u32; 256];
        for h in 0..j.g {
            for i in 0..LANES {
                let src = j.query(h, i).as_ptr();
                for d in (0..hd).step_by(16) {
                    let b = to_bf16(_mm512_loadu_ps(src.add(d)));
                    _mm256_storeu_si256(qb.as_mut_ptr().add(d / 2) as *mut __m256i, b);
                }
                for (d, &p) in qb.iter().enumerate().take(hp) {
                    s.qp[(h * hp + d) * LANES + i] = p;
                }
            }
        }
        let scale = _mm512_set1_ps(sh.scale);
        for (t0, k) in sp.chunks() {
            for jj in 0..k {
                let src = kc.as_ptr().add(sh.at(t0 + jj, sp.kh));
                let dst = s.kb.as_mut_ptr().add(jj * hp);
                for d in (0..hd).step_by(16) {
                    _mm256_storeu_si256(
                        dst.add(d / 2) as *mut __m256i,
                        to_bf16(load16(src.add(d))),
                    );
                }
            }
            let kr = s.kb.as_ptr();
            let masks = sp.masks(t0);
            for h in 0..j.g {
                let qt = s.qp.as_ptr().add(h * hp * LANES);
                let out = s.scores.as_mut_ptr().add((h * sp.nk + t0 - sp.lo) * LANES);
                for j0 in (0..k).step_by(KS) {
                    // Rows past `k` hold an earlier chunk's keys (or zeros): scored, not stored.
                    let kp: [*const u32; KS] = std::array::from_fn(|jj| kr.add((j0 + jj) * hp));
                    let mut acc = [_mm512_setzero_ps(); KS];
                    for d in 0..hp {
                        let qv = transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                            qt.add(d * LANES) as *const _,
                        ));
                        for (a, kp) in acc.iter_mut().zip(&kp) {
                            let kb = _mm512_set1_epi32(*kp.add(d) as i32);
                            *a = _mm512_dpbf16_ps(*a, qv, transmute::<__m512i, __m512bh>(kb));
                        }
                    }
                    store_scores(&acc, k - j0, &masks[j0..], scale, out.add(j0 * LANES));
                }
            }
        }
    }

    /// Step 3 with bf16 operands: the (rounded) weights and the V rows pair adjacent keys
    /// (`(w_t, w_{t+1})` against `(v_t[d], v_{t+1}[d])`), so a key pair is one `vdpbf16ps` per
    /// output vector.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma,f16c")]
    unsafe fn weighted_v_bf16<T: KvElem>(j: &Job, vc: &[T], sp: &Span, s: &mut Scratch) {
        let hd = sp.hd;
        s.vp.resize(KC / 2 * hd, 0);
        s.wp.resize(KC / 2 * LANES, 0);
        s.acc.fill(0.0);
        let zero = _mm512_setzero_ps();
        for (t0, k) in sp.chunks() {
            let np = k.div_ceil(2);
            // vp[p·hd + d] = (v_{t0+2p}[d], v_{t0+2p+1}[d]); the second is 0 past `k`.
            for p in 0..np {
                let a = vc.as_ptr().add(j.sh.at(t0 + 2 * p, sp.kh));
                let b = (2 * p + 1 < k).then(|| vc.as_ptr().add(j.sh.at(t0 + 2 * p + 1, sp.kh)));
                let dst = s.vp.as_mut_ptr().add(p * hd);
                for d in (0..hd).step_by(16) {
                    let vb = b.map_or(zero, |b| load16(b.add(d)));
                    _mm512_storeu_si512(dst.add(d) as *mut _, pair(load16(a.add(d)), vb));
                }
            }
            for h in 0..j.g {
                let w0 = s.scores.as_ptr().add((h * sp.nk + t0 - sp.lo) * LANES);
                for p in 0..np {
                    let wa = _mm512_loadu_ps(w0.add(2 * p * LANES));
                    let wb = if 2 * p + 1 < k {
                        _mm512_loadu_ps(w0.add((2 * p + 1) * LANES))
                    } else {
                        zero
                    };
                    _mm512_storeu_si512(s.wp.as_mut_ptr().add(p * LANES) as *mut _, pair(wa, wb));
                }
                for d0 in (0..hd).step_by(16) {
                    let ap = s.acc.as_mut_ptr().add((h * hd + d0) * LANES);
                    let mut a: [__m512; 16] =
                        std::array::from_fn(|dd| _mm512_loadu_ps(ap.add(dd * LANES)));
                    for p in 0..np {
                        let w = transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                            s.wp.as_ptr().add(p * LANES) as *const _,
                        ));
                        let v = s.vp.as_ptr().add(p * hd + d0);
                        for (dd, a) in a.iter_mut().enumerate() {
                            let vb = _mm512_set1_epi32(*v.add(dd) as i32);
                            *a = _mm512_dpbf16_ps(*a, w, transmute::<__m512i, __m512bh>(vb));
                        }
                    }
                    for (dd, a) in a.iter().enumerate() {
                        _mm512_storeu_ps(ap.add(dd * LANES), *a);
                    }
                }
            }
        }
    }
}

/// `x` rounded to bfloat16 (nearest-even; the values here are finite), as f32.
pub(super) fn bf16_round(x: f32) -> f32 {
    let b = x.to_bits();
    let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(r)
}

/// The scalar reference of the BF16 block kernel, one position and one head at a time in f64:
/// queries, keys, V rows and the softmax weights rounded to bf16 as the kernel rounds them,
/// the weights' sum taken over the rounded weights. `att` as [`attend_batch`] writes it.
pub fn reference_bf16<T: KvElem>(
    sh: &AttnShape,
    Batch {
        window, pos0, n, ..
    }: Batch,
    q: &[f32],
    kv: Kv<'_, T>,
    att: &mut [f32],
) {
    let (hd, row) = (sh.head_dim, sh.n_heads * sh.head_dim);
    for b in 0..n {
        let p = pos0 + b;
        let start = AttnShape::window_start(p, window);
        for h in 0..sh.n_heads {
            let kh = h / sh.group;
            let qh: Vec<f64> = q[b * row + h * hd..][..hd]
                .iter()
                .map(|&x| bf16_round(x) as f64)
                .collect();
            let elem =
                |c: &[T], t: usize, d: usize| bf16_round(c[sh.at(t, kh) + d].to_f32()) as f64;
            let scores: Vec<f64> = (start..=p)
                .map(|t| {
                    let dot: f64 = (0..hd).map(|d| qh[d] * elem(kv.k, t, d)).sum();
                    dot * sh.scale as f64
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores
                .iter()
                .map(|&s| bf16_round((s - m).exp() as f32) as f64)
                .collect();
            let sum: f64 = w.iter().sum();
            for d in 0..hd {
                let v: f64 = (start..=p)
                    .zip(&w)
                    .map(|(t, &w)| w * elem(kv.v, t, d))
                    .sum();
                att[b * row + h * hd + d] = (v / sum) as f32;
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

    /// (window, first position, positions) of the batches the tests run: whole and partial
    /// blocks, a batch after earlier positions, sliding windows.
    const CASES: [(usize, usize, usize); 5] =
        [(0, 0, 32), (0, 7, 21), (0, 40, 16), (12, 30, 35), (5, 0, 3)];

    /// Random K and V caches of `ctx` positions for `sh`, as f32 and as f16.
    fn caches(
        rng: &mut crate::rng::Rng,
        sh: &AttnShape,
        ctx: usize,
    ) -> (Vec<f32>, Vec<f32>, Vec<half::f16>, Vec<half::f16>) {
        let kvd = (sh.n_heads / sh.group) * sh.head_dim * ctx;
        let kf = rng.fill(kvd, 1.0);
        let vf = rng.fill(kvd, 1.0);
        let kh = kf.iter().map(|&x| half::f16::from_f32(x)).collect();
        let vh = vf.iter().map(|&x| half::f16::from_f32(x)).collect();
        (kf, vf, kh, vh)
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
            let (kf, vf, kh, vh) = caches(&mut rng, &sh, ctx);
            let row = nh * hd;
            for (window, pos0, n) in CASES {
                let q = rng.fill(n * row, 2.0);
                let b = Batch {
                    window,
                    pos0,
                    n,
                    bf16: false,
                };
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
    /// The BF16 build against its scalar reference (bf16-rounded operands, f64 sums), for f32
    /// and f16 caches, windows, partial blocks and a batch after earlier positions; and against
    /// the f32 build within bf16's precision.
    #[test]
    fn bf16_block_equals_its_reference() {
        let pool = ThreadPool::new(2);
        for (nh, group, hd) in [(9, 3, 64), (4, 4, 256), (2, 1, 16)] {
            let ctx = 80;
            let sh = shape(nh, group, hd, ctx);
            if !usable(&sh) || !bf16_available() {
                println!("SKIP bf16 block attention: this CPU lacks AVX512-BF16");
                return;
            }
            let mut rng = crate::rng::Rng::new(hd as u64 + 1);
            let (kf, vf, kh, vh) = caches(&mut rng, &sh, ctx);
            let row = nh * hd;
            for (window, pos0, n) in CASES {
                let q = rng.fill(n * row, 2.0);
                let b = Batch {
                    window,
                    pos0,
                    n,
                    bf16: true,
                };
                let f32_build = Batch { bf16: false, ..b };
                let mut got = vec![0f32; n * row];
                let mut want = vec![0f32; n * row];
                let mut exact = vec![0f32; n * row];
                attend_batch(&pool, &sh, b, &q, Kv { k: &kh, v: &vh }, &mut got);
                reference_bf16(&sh, b, &q, Kv { k: &kh, v: &vh }, &mut want);
                attend_batch(&pool, &sh, f32_build, &q, Kv { k: &kh, v: &vh }, &mut exact);
                let mut got32 = vec![0f32; n * row];
                attend_batch(&pool, &sh, b, &q, Kv { k: &kf, v: &vf }, &mut got32);
                let mut want32 = vec![0f32; n * row];
                reference_bf16(&sh, b, &q, Kv { k: &kf, v: &vf }, &mut want32);
                for (got, want) in [(&got, &want), (&got32, &want32)] {
                    for (x, y) in got.iter().zip(want.iter()) {
                        assert!(
                            (x - y).abs() <= 2e-3 * (1.0 + y.abs()),
                            "nh {nh} hd {hd} window {window} pos0 {pos0}: {x} vs reference {y}"
                        );
                    }
                }
                let worst = got
                    .iter()
                    .zip(&exact)
                    .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
                    .fold(0f32, f32::max);
                assert!(worst <= 3e-2, "hd {hd}: {worst} from the f32 build");
            }
        }
    }
}
