//! Multi-head attention of one query over a KV cache, parallel over heads, or at long context
//! over chunks of positions, on the thread pool (each task writes only its own heads' output, or
//! its own chunk's partial result, which [`merge`] combines as a softmax over all positions).
//!
//! Per head: scores `s_t = q·k_t · scale` (optionally soft-capped), `softmax`, then `Σ_t w_t v_t`.
//! The scalar reference ([`head_scalar`]) and the AVX2 + FMA kernel sit side by side here and are
//! tested against each other and against a float64 forward. The AVX2 kernel works on the heads
//! that share a KV head together: it dots 4 positions at a time for up to 3 heads (12
//! independent FMA chains; each K row piece is loaded and converted from f16 once for them),
//! scales and takes the maximum of the scores 8 at a time, exponentiates 8 at a time (the vector
//! `exp` of `act.rs`), and sums the V rows 16 columns at a time for up to 4 heads (each V row
//! piece loaded once for them). It sums in another order than the scalar loop, so the two agree
//! to rounding, not bit for bit.
//!
//! Over a bf16 cache with the AVX-512 ISA on a CPU with AVX512-BF16, each (KV group, chunk) runs
//! [`super::attention_bf16`]'s `vdpbf16ps` kernel instead (queries and softmax weights rounded
//! to bf16 as well); chunks, merge and thread counts as above.

use super::kv_elem::KvElem;
use super::pool::ThreadPool;
use super::Isa;

/// Dot product of a query slice and a cached row with 8 independent accumulators (lets the
/// compiler vectorize the reduction).
#[inline]
pub fn dot<T: KvElem>(a: &[f32], b: &[T]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i].to_f32();
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y.to_f32();
    }
    s
}

/// One layer's K and V caches as the kernels read them (rows as [`AttnShape::at`] addresses).
#[derive(Clone, Copy, Debug)]
pub struct Kv<'a, T> {
    pub k: &'a [T],
    pub v: &'a [T],
}

/// The queries of one prefill batch ([`attend_batch`]): positions `pos0..pos0 + n`, each
/// attending to its last `window` positions (0: from position 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    pub window: usize,
    pub pos0: usize,
    pub n: usize,
    /// Let the block kernel round its operands to bfloat16 where the CPU has AVX512-BF16
    /// (`attention_block`'s BF16 build: about twice the multiply-adds per instruction; the
    /// engine sets it with `--act q8`, not with `--act f32`).
    pub bf16: bool,
}

/// Geometry of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub group: usize,
    pub head_dim: usize,
    pub kv_dim: usize,
    /// Elements between one cached position's row of a KV head and the next position's
    /// (`kv_dim` when the cache is position-major `[position][kv_dim]`; `head_dim` when it is
    /// head-major, as the engine's [`crate::engine::kv::KvCache`] stores it).
    pub row_stride: usize,
    /// Elements between KV head `kh`'s first row and KV head `kh + 1`'s (`head_dim` when
    /// position-major; the head's block of positions when head-major).
    pub head_stride: usize,
    /// First cached position attended to (sliding window) and the query's position.
    pub start: usize,
    pub pos: usize,
    pub scale: f32,
    /// Attention logit softcap (0 = off).
    pub cap: f32,
}

impl AttnShape {
    /// Where position `t` of KV head `kh` starts in the cache.
    #[inline]
    pub fn at(&self, t: usize, kh: usize) -> usize {
        t * self.row_stride + kh * self.head_stride
    }

    /// The first position a query at `pos` attends to under a sliding window of `window`
    /// positions (0: no window, from position 0).
    pub fn window_start(pos: usize, window: usize) -> usize {
        if window > 0 && pos + 1 > window {
            pos + 1 - window
        } else {
            0
        }
    }

    /// The score of a raw dot product: scaled, then soft-capped when a cap is set.
    #[inline]
    fn score(&self, dot: f32) -> f32 {
        let s = dot * self.scale;
        if self.cap > 0.0 {
            self.cap * (s / self.cap).tanh()
        } else {
            s
        }
    }
}

/// An output pointer shared by pool tasks that each write a disjoint range of it.
#[derive(Clone, Copy)]
pub(super) struct Ptr(pub(super) *mut f32);
// SAFETY: each task writes only the disjoint range of its own head (see `attend`, and
// `attention_block::attend_batch`: its own positions and heads).
unsafe impl Send for Ptr {}
// SAFETY: as above.
unsafe impl Sync for Ptr {}

/// `att[h] = softmax(q_h · K_{kv(h)} · scale) · V_{kv(h)}` for every head, over cached positions
/// `start..=pos` of `kc`/`vc` (laid out as `sh.row_stride`/`sh.head_stride` say, f32 or f16: [`KvElem`]). The AVX2
/// kernel runs unless `isa` is scalar, the CPU lacks AVX2/FMA/F16C or the head width is not a
/// multiple of 8.
///
/// On several threads, past one [`CHUNK`] of positions, the AVX2 kernel splits the positions
/// into chunks (boundaries at multiples of `CHUNK`, whatever the thread count), computes each
/// (KV group, chunk) pair as its own task (a partial softmax) and merges the chunks in order
/// ([`merge`]): the threads share the positions instead of the heads, so each K/V row is read
/// from memory once, by one thread, for every head of its group. Any thread count above one
/// gives the same bits; one thread (and the per-head-range split of short contexts) computes the
/// positions as one chunk, which agrees to rounding.
pub fn attend<T: KvElem>(
    pool: &ThreadPool,
    isa: Isa,
    sh: &AttnShape,
    q: &[f32],
    kc: &[T],
    vc: &[T],
    att: &mut [f32],
) {
    let hd = sh.head_dim;
    check_shape(sh, q, kc, vc, att);
    let n = sh.pos + 1 - sh.start;
    let simd = head_kernel(isa, hd);
    let kv = Kv { k: kc, v: vc };
    // Below ~16k multiply-adds the pool's hand-off costs more than it saves.
    let parallel = pool.threads() > 1 && n * sh.n_heads * hd >= 16 * 1024;
    let chunks = chunk_count(sh);
    if parallel && simd != HeadKernel::Scalar && chunks > 1 {
        // One task per (KV group, chunk), then each group's chunks merged in order on this
        // thread: the same arithmetic as `heads_into`, so the same bits.
        let groups = sh.n_heads.div_ceil(sh.group);
        let slot = sh.group * (hd + 2);
        return with_partials(groups * chunks * slot, |parts| {
            let pp = Ptr(parts.as_mut_ptr());
            pool.run(groups * chunks, &|task| {
                let (gi, c) = (task / chunks, task % chunks);
                let h0 = gi * sh.group;
                let g = sh.group.min(sh.n_heads - h0);
                let p = pp;
                // SAFETY: task (gi, c) owns slot gi·chunks + c of `parts` (groups·chunks slots
                // of `slot` floats); tasks are distinct.
                let part = unsafe {
                    std::slice::from_raw_parts_mut(p.0.add((gi * chunks + c) * slot), slot)
                };
                let shc = chunk_shape(sh, c);
                with_scores(|scores| chunk_into((simd, true), &shc, (h0, g), q, kv, scores, part));
            });
            for gi in 0..groups {
                let h0 = gi * sh.group;
                let g = sh.group.min(sh.n_heads - h0);
                let mine = &parts[gi * chunks * slot..(gi + 1) * chunks * slot];
                merge(mine, slot, (g, hd), &mut att[h0 * hd..(h0 + g) * hd]);
            }
        });
    }
    let out = Ptr(att.as_mut_ptr());
    // Heads h0..h0 + g (one KV head's) into their slice of `att`.
    let heads = |h0: usize, g: usize, scores: &mut Vec<f32>| {
        let o = out;
        // SAFETY: heads h0..h0 + g own att[h0·hd .. (h0 + g)·hd], inside `att` (checked by
        // `check_shape`); tasks take distinct heads.
        let oh = unsafe { std::slice::from_raw_parts_mut(o.0.add(h0 * hd), g * hd) };
        heads_into(simd, sh, (h0, g), q, kv, scores, oh);
    };
    // Within one chunk each thread takes one contiguous range of heads (9 heads on 2 threads:
    // 0..5 and 5..9) and runs it KV group by KV group, so a group's K/V rows are read once per
    // thread rather than once per head (`cargo bench --bench kernels -- attention`, 2 threads:
    // SmolLM2 shape at 128 positions 5.87 → 4.55 µs, Gemma 3 at 128 8.06 → 5.99 µs, against one
    // task per head). Alone, one range holds every head.
    let parts = if parallel {
        pool.threads().min(sh.n_heads)
    } else {
        1
    };
    pool.run(parts, &|p| {
        // Rounded up, so the first range (the caller's: it claims first, the other threads
        // join ~0.3 µs later) is the larger one: 0..5 and 5..9 for 9 heads.
        let edge = |p: usize| (p * sh.n_heads).div_ceil(parts);
        let (a, b) = (edge(p), edge(p + 1));
        with_scores(|scores| {
            let mut h = a;
            while h < b {
                let end = ((h / sh.group + 1) * sh.group).min(b);
                heads(h, end - h, scores);
                h = end;
            }
        })
    });
}

/// Positions per chunk of the AVX2 kernel ([`attend`]): 256 KiB of K and V rows at Gemma 3's
/// head width in f16 (64 KiB at SmolLM2's), which stays in L2 between a chunk's dot products and
/// its weighted V sum. (1024 positions at SmolLM2's width decoded slower at depth 4096, 1
/// thread: 0.840 [0.758, 0.904] against the unchunked kernel, where 256 gave 0.928–0.964.)
pub const CHUNK: usize = 256;

/// How many chunks of [`CHUNK`] positions `sh.start..=sh.pos` spans.
fn chunk_count(sh: &AttnShape) -> usize {
    sh.pos / CHUNK - sh.start / CHUNK + 1
}

/// `sh` narrowed to its chunk `c` (0 = the chunk holding `sh.start`).
fn chunk_shape(sh: &AttnShape, c: usize) -> AttnShape {
    let first = (sh.start / CHUNK + c) * CHUNK;
    AttnShape {
        start: first.max(sh.start),
        pos: (first + CHUNK - 1).min(sh.pos),
        ..*sh
    }
}

/// Merges the chunks' partial results of `g` heads into `oh`. A partial (one KV group and chunk)
/// is `g · (hd + 2)` floats: head `j`'s unnormalized sum `Σ_t exp(s_t − m_j) v_t` at `j·hd`, then
/// `(m_j, Σ_t exp(s_t − m_j))` at `g·hd + 2j`; `parts` holds one per chunk, `slot` floats apart,
/// in position order. With `M = max_c m_c` and `w_c = exp(m_c − M)`,
/// `oh = Σ_c w_c · out_c / Σ_c w_c · l_c` (the softmax over all the chunks' positions).
fn merge(parts: &[f32], slot: usize, (g, hd): (usize, usize), oh: &mut [f32]) {
    let chunks = parts.len() / slot;
    for j in 0..g {
        let ml = |c: usize| {
            let p = &parts[c * slot + g * hd + 2 * j..];
            (p[0], p[1])
        };
        let m = (0..chunks)
            .map(|c| ml(c).0)
            .fold(f32::NEG_INFINITY, f32::max);
        let o = &mut oh[j * hd..(j + 1) * hd];
        o.fill(0.0);
        let mut l = 0f32;
        for c in 0..chunks {
            let (mc, lc) = ml(c);
            let w = (mc - m).exp();
            l += w * lc;
            let src = &parts[c * slot + j * hd..c * slot + (j + 1) * hd];
            for (o, &x) in o.iter_mut().zip(src) {
                *o += w * x;
            }
        }
        let inv = 1.0 / l;
        for o in o.iter_mut() {
            *o *= inv;
        }
    }
}

/// Runs `f` with this thread's buffer of partial results ([`merge`]; kept between calls) grown
/// to `len` floats. [`attend`] holds it on its thread while its chunk tasks run, which do not
/// take it; [`heads_into`] takes it within one call.
fn with_partials<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    thread_local! {
        static PARTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    PARTS.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < len {
            p.resize(len, 0.0);
        }
        f(&mut p[..len])
    })
}

/// [`attend`] for the queries of `n` consecutive positions `pos0..pos0 + n` (prefill): row `b`
/// of `q` and `att` (`n_heads · head_dim` apart) is position `pos0 + b`, which attends to
/// `pos0 + b + 1 − window ..= pos0 + b` (`window` 0: from position 0; `sh.start` and `sh.pos` are
/// ignored). With AVX-512 (`isa`), blocks of 16 positions run together
/// ([`super::attention_block`], equal to [`attend`] to rounding). Otherwise every (position, KV
/// group) pair is one task of a single pool run, the longest (latest positions) first, so both
/// cores stay busy; every head runs the same arithmetic as in [`attend`] on one thread, so the
/// results are bit-identical to `n` calls of it there (and on several threads while a query's
/// positions fit one [`CHUNK`]; past that, to rounding).
pub fn attend_batch<T: KvElem>(
    pool: &ThreadPool,
    isa: Isa,
    sh: &AttnShape,
    Batch {
        window,
        pos0,
        n,
        bf16,
    }: Batch,
    q: &[f32],
    Kv { k: kc, v: vc }: Kv<'_, T>,
    att: &mut [f32],
) {
    if n == 0 {
        return;
    }
    let (hd, nh) = (sh.head_dim, sh.n_heads);
    let row = nh * hd;
    let shape = |b: usize| {
        let pos = pos0 + b;
        AttnShape {
            start: AttnShape::window_start(pos, window),
            pos,
            ..*sh
        }
    };
    let last = shape(n - 1);
    assert!(q.len() >= n * row && att.len() >= n * row);
    check_shape(&last, &q[(n - 1) * row..], kc, vc, &att[(n - 1) * row..]);
    if isa == Isa::Avx512 && n > 1 && super::attention_block::usable(sh) {
        // Blocks of 16 positions in the lanes (`attention_block`): each K/V row converted once
        // per block; equal to the per-position kernels to rounding.
        let b = Batch {
            window,
            pos0,
            n,
            bf16,
        };
        return super::attention_block::attend_batch(pool, sh, b, q, Kv { k: kc, v: vc }, att);
    }
    let simd = head_kernel(isa, hd);
    let out = Ptr(att.as_mut_ptr());
    let groups = nh.div_ceil(sh.group);
    pool.run(n * groups, &|task| {
        let (b, h0) = (n - 1 - task / groups, task % groups * sh.group);
        let g = sh.group.min(nh - h0);
        let shb = shape(b);
        let o = out;
        // SAFETY: task (b, group) owns att[b·row + h0·hd ..][..g·hd], inside `att` (asserted
        // above: n·row ≤ len); each (b, group) is one task.
        let oh = unsafe { std::slice::from_raw_parts_mut(o.0.add(b * row + h0 * hd), g * hd) };
        let qb = &q[b * row..(b + 1) * row];
        with_scores(|scores| heads_into(simd, &shb, (h0, g), qb, Kv { k: kc, v: vc }, scores, oh));
    });
}

/// Runs `f` with this thread's score buffer (kept between calls: a decode step runs ~300 head
/// tasks, each of which would otherwise allocate one).
fn with_scores<R>(f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
    thread_local! {
        static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCORES.with(|s| f(&mut s.borrow_mut()))
}

/// The bounds every head kernel relies on: `q`/`att` hold all heads, `kc`/`vc` hold rows up to
/// `pos`, and the KV heads fit in `kv_dim`.
fn check_shape<T>(sh: &AttnShape, q: &[f32], kc: &[T], vc: &[T], att: &[f32]) {
    assert!(sh.start <= sh.pos && sh.group >= 1 && sh.head_dim >= 1);
    assert!(q.len() >= sh.n_heads * sh.head_dim && att.len() >= sh.n_heads * sh.head_dim);
    let kv_heads = sh.n_heads.div_ceil(sh.group);
    assert!(
        kv_heads * sh.head_dim <= sh.kv_dim,
        "KV heads exceed kv_dim"
    );
    // The last element read: head kv_heads − 1's row at `pos`. Rows of one head must not overlap
    // (row_stride ≥ head_dim), nor heads' blocks when head-major.
    assert!(sh.row_stride >= sh.head_dim, "rows of one head overlap");
    let end = sh.at(sh.pos, kv_heads - 1) + sh.head_dim;
    assert!(
        kc.len() >= end && vc.len() >= end,
        "K/V shorter than the shape reads"
    );
}

/// Which head kernel runs: the scalar reference, or the AVX2 kernel (not scalar, the CPU has
/// AVX2/FMA/F16C, head width % 8 == 0), built for AVX-512VL when `isa` is AVX-512 and the CPU
/// has VL. The VL build is the same code and the same operations in the same order (so the same
/// bits); it only has 32 vector registers instead of 16, which keeps [`avx2::dots4`]'s 12
/// accumulators, 4 K rows and query in registers instead of spilling them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HeadKernel {
    Scalar,
    Avx2,
    Avx2Vl,
}

fn head_kernel(isa: Isa, hd: usize) -> HeadKernel {
    if !(cfg!(target_arch = "x86_64")
        && isa != Isa::Scalar
        && Isa::Avx2.available()
        && hd.is_multiple_of(8))
    {
        return HeadKernel::Scalar;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && Isa::Avx512.available() && is_x86_feature_detected!("avx512vl") {
        return HeadKernel::Avx2Vl;
    }
    HeadKernel::Avx2
}

/// Heads `h0..h0 + g` of one query (`q` holds all heads; the `g` heads share KV head
/// `h0 / group`) into `oh` (`g · head_dim` floats), with the kernel `simd` ([`head_kernel`]):
/// the AVX2 kernel over all the positions at once, or the scalar reference head by head. The
/// shape was checked by [`check_shape`].
fn heads_into<T: KvElem>(
    simd: HeadKernel,
    sh: &AttnShape,
    (h0, g): (usize, usize),
    q: &[f32],
    kv: Kv<'_, T>,
    scores: &mut Vec<f32>,
    oh: &mut [f32],
) {
    let hd = sh.head_dim;
    debug_assert!(g >= 1 && (h0 + g - 1) / sh.group == h0 / sh.group && oh.len() == g * hd);
    if simd == HeadKernel::Scalar {
        let kh = h0 / sh.group;
        for j in 0..g {
            let qh = &q[(h0 + j) * hd..(h0 + j + 1) * hd];
            head_scalar(
                sh,
                qh,
                kv.k,
                kv.v,
                kh,
                scores,
                &mut oh[j * hd..(j + 1) * hd],
            );
        }
        return;
    }
    // All positions as one chunk: the chunk tasks of `attend` pay only when threads share the
    // positions (at 1 thread, SmolLM2 at depth 4096 decoded 0.90–0.96× as fast chunked).
    let slot = g * (hd + 2);
    let l2 = hd * T::BYTES > L1_ROW_MAX;
    with_partials(slot, |part| {
        chunk_into((simd, l2), sh, (h0, g), q, kv, scores, part);
        merge(part, slot, (g, hd), oh);
    })
}

/// The longest K/V row, in bytes, that the one-pass kernel ([`heads_into`]: one thread, or a
/// short context) prefetches into L1; longer rows go into L2, as the chunk tasks' always do.
/// A 4-position step asks for 8 rows (4 K rows ahead and its own 4 V rows): 16 cache lines at
/// SmolLM2's f16 rows (128 bytes), 32 at its f32 rows, 64 at Gemma 3's (512). Zen 4, one thread,
/// depth 4096, `ab_binaries.sh`: Gemma 3 into L2 over into L1 1.164 [1.038, 1.351] (12 pairs;
/// 256-position chunks into L2 did less: the one pass over them 1.081 [1.055, 1.101]); SmolLM2
/// Q4_0 gained nothing into L2 and likely lost, with an f32 cache 0.913 [0.820, 1.018], with
/// its f16 rows in chunks 0.896 [0.828, 1.024] (`docs/data/ab_attn_hint.json`). Why the wider
/// rows want L2 is our reading, not a measurement: 64 outstanding L1 prefetches a step are more
/// than L1's miss buffers hold.
///
/// In the f32/f16 kernel (one pass or chunk tasks), rows longer than this are also asked for a
/// line at a time, spread through the dot products ([`avx2::dots4`]), rather than in one burst
/// of whole rows per step (the bf16 kernel keeps the burst): Gemma 3 at depth 4096, 1 thread,
/// 1.078 [1.029, 1.104] (12 pairs), its attention in `run --record` 2.63–2.66 → 2.25–2.43 ms a
/// token; at 2 threads, measured with a switch in one binary, 1.051 [0.914, 1.134] (10 pairs,
/// no difference shown). SmolLM2's rows keep the burst: spread, 0.960 [0.910, 1.060] (8 pairs;
/// `docs/data/ab_attn_spread.json`).
const L1_ROW_MAX: usize = 256;

/// Positions `sh.start..=sh.pos` (one [`CHUNK`], or all of them) of heads `h0..h0 + g` into
/// `part` (a partial result: [`merge`]), with an AVX2 build (`simd` is not scalar) whose prefetches go
/// into L2 when `l2` (the chunk tasks of several threads, and rows longer than [`L1_ROW_MAX`]),
/// else into L1.
///
/// The hint is chosen per path by measurement (Zen 4, depth 4096, `ab_binaries.sh`, 6 pairs):
/// into L2 the chunk tasks of Gemma 3 at 2 threads decoded 1.036 [1.023, 1.058]× faster (1 thread
/// 1.008 [0.983, 1.027], none), while SmolLM2 at 1 thread, one thread running the chunks in turn,
/// lost with it (chunked with L2 hints 0.928 [0.918, 0.951]× the unchunked kernel, with L1 hints
/// 0.964 [0.885, 1.049]). The hint never changes the result.
fn chunk_into<T: KvElem>(
    (simd, l2): (HeadKernel, bool),
    sh: &AttnShape,
    (h0, g): (usize, usize),
    q: &[f32],
    kv: Kv<'_, T>,
    scores: &mut Vec<f32>,
    part: &mut [f32],
) {
    let hd = sh.head_dim;
    let kh = h0 / sh.group;
    debug_assert!(part.len() == g * (hd + 2));
    let qg = &q[h0 * hd..(h0 + g) * hd];
    #[cfg(target_arch = "x86_64")]
    if let (HeadKernel::Avx2Vl, Some(k), Some(v)) = (simd, T::as_bf16(kv.k), T::as_bf16(kv.v)) {
        if super::attention_bf16::usable(hd) {
            use super::attention_bf16::avx512::heads;
            let kv = Kv { k, v };
            // SAFETY: `usable(hd)` checked the CPU and the width; rows as for the AVX2 builds
            // below (`check_shape`).
            unsafe {
                if l2 {
                    heads::<{ avx2::INTO_L2 }>(sh, qg, g, kv, kh, scores, part)
                } else {
                    heads::<{ avx2::INTO_L1 }>(sh, qg, g, kv, kh, scores, part)
                }
            }
            return;
        }
    }
    #[cfg(target_arch = "x86_64")]
    match simd {
        // SAFETY: AVX2/FMA/F16C available and hd % 8 == 0 (`head_kernel`); every K/V row read
        // lies inside kc/vc (rows ≤ pos of KV heads < n_heads / group: `check_shape`); qg holds
        // g heads and part g · (hd + 2) floats.
        HeadKernel::Avx2 => unsafe {
            if l2 {
                avx2::heads::<T, { avx2::INTO_L2 }>(sh, qg, g, kv, kh, scores, part)
            } else {
                avx2::heads::<T, { avx2::INTO_L1 }>(sh, qg, g, kv, kh, scores, part)
            }
        },
        // SAFETY: as above, and AVX-512F/VL available (`head_kernel`).
        HeadKernel::Avx2Vl => unsafe {
            if l2 {
                avx2::heads_vl::<T, { avx2::INTO_L2 }>(sh, qg, g, kv, kh, scores, part)
            } else {
                avx2::heads_vl::<T, { avx2::INTO_L1 }>(sh, qg, g, kv, kh, scores, part)
            }
        },
        HeadKernel::Scalar => unreachable!("chunk_into runs an AVX2 build"),
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (simd, l2, sh, kh, qg, kv, scores, part);
}

/// The scalar reference of one head: `oh = softmax(score(qh · k_t)) · V` over `start..=pos`,
/// with K/V head `kh`.
pub fn head_scalar<T: KvElem>(
    sh: &AttnShape,
    qh: &[f32],
    kc: &[T],
    vc: &[T],
    kh: usize,
    scores: &mut Vec<f32>,
    oh: &mut [f32],
) {
    let hd = sh.head_dim;
    scores.clear();
    let mut m = f32::NEG_INFINITY;
    for t in sh.start..=sh.pos {
        let kt = &kc[sh.at(t, kh)..sh.at(t, kh) + hd];
        let s = sh.score(dot(qh, kt));
        m = m.max(s);
        scores.push(s);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - m).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    oh.fill(0.0);
    for (i, t) in (sh.start..=sh.pos).enumerate() {
        let vt = &vc[sh.at(t, kh)..sh.at(t, kh) + hd];
        let w = scores[i] * inv;
        for j in 0..hd {
            oh[j] += w * vt[j].to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::{AttnShape, Kv};
    use crate::kernels::act::exp_avx2;
    use crate::kernels::dot::simd::{hsum, hsum4};
    use crate::kernels::kv_elem::KvElem;
    use std::arch::x86_64::*;

    /// `q · k` over `hd` floats (a multiple of 8): one accumulator over 8-float steps, then
    /// [`hsum`], the arithmetic of one (head, row) of [`dots4`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot<T: KvElem>(q: *const f32, k: *const T, hd: usize) -> f32 {
        let mut a = _mm256_setzero_ps();
        for c in (0..hd).step_by(8) {
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(c)), T::load8(k.add(c)), a);
        }
        hsum(a)
    }

    /// `out[j·n + r] = q_j · k_r` for the `G` heads `q_j = q + j·hd` and the 4 rows
    /// `k_r = k + r·stride` (`hd` a multiple of 8); returns `G`. Each (head, row) pair has one
    /// accumulator over 8-float steps, reduced by [`hsum4`] (lane for lane the same sums as
    /// [`hsum`]), so a score does not depend on `G` nor on which of [`dot`] and this computes it.
    ///
    /// With `pf = Some((pk, pv))` it also asks (`HINT`) for the 4 rows from `pk` and the 4 from
    /// `pv` (rows `stride` elements apart, as `k`'s), spread through the dot products: before
    /// reading each 64 bytes of its own rows, the line at that offset of each of the 8 rows.
    /// Where rows do not start on a line, a row's last partial line comes with the next row's
    /// first only when the rows of one head are contiguous (the engine's head-major cache); in a
    /// position-major layout it is not asked for. The hints never change the result.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dots4<T: KvElem, const G: usize, const HINT: i32>(
        q: *const f32,
        k: *const T,
        (stride, hd): (usize, usize),
        out: *mut f32,
        n: usize,
        pf: Option<(*const u8, *const u8)>,
    ) -> usize {
        let mut acc = [[_mm256_setzero_ps(); 4]; G];
        for c in (0..hd).step_by(8) {
            if let Some((pk, pv)) = pf {
                let off = c * T::BYTES;
                if off.is_multiple_of(64) {
                    let sb = stride * T::BYTES;
                    for r in 0..4 {
                        _mm_prefetch::<HINT>(pk.wrapping_add(r * sb + off) as *const i8);
                        _mm_prefetch::<HINT>(pv.wrapping_add(r * sb + off) as *const i8);
                    }
                }
            }
            let kr: [__m256; 4] = core::array::from_fn(|r| T::load8(k.add(r * stride + c)));
            for (j, a) in acc.iter_mut().enumerate() {
                let qv = _mm256_loadu_ps(q.add(j * hd + c));
                for (a, k) in a.iter_mut().zip(kr) {
                    *a = _mm256_fmadd_ps(qv, k, *a);
                }
            }
        }
        for (j, a) in acc.into_iter().enumerate() {
            _mm_storeu_ps(out.add(j * n), hsum4(a));
        }
        G
    }

    /// `out[0 .. 8·W] += Σ_i w[i] · v_i[0 .. 8·W]` (one FMA per position, in order), `v_i` at
    /// `v + i·stride`: W accumulators stay in registers across the positions.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weighted_rows<T: KvElem, const W: usize>(
        w: &[f32],
        v: *const T,
        stride: usize,
        out: *mut f32,
    ) {
        let mut acc: [__m256; W] = core::array::from_fn(|j| _mm256_loadu_ps(out.add(8 * j)));
        for (i, &wi) in w.iter().enumerate() {
            let wv = _mm256_set1_ps(wi);
            let row = v.add(i * stride);
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(wv, T::load8(row.add(8 * j)), *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.add(8 * j), *a);
        }
    }

    /// [`weighted_rows`] of 16 columns for the `G` heads of a group at once: head `j`'s
    /// `out[j·hd ..][0 .. 16] += Σ_i w[j][i] · v_i[0 .. 16]`. Each row piece is loaded once for
    /// all heads; every head's operations, and their order, are those of [`weighted_rows`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weighted_rows_group<T: KvElem, const G: usize>(
        w: [&[f32]; G],
        v: *const T,
        stride: usize,
        out: *mut f32,
        hd: usize,
    ) {
        let n = w[0].len();
        debug_assert!(w.iter().all(|x| x.len() == n));
        let mut acc: [[__m256; 2]; G] = core::array::from_fn(|j| {
            let o = out.add(j * hd);
            [_mm256_loadu_ps(o), _mm256_loadu_ps(o.add(8))]
        });
        for i in 0..n {
            let row = v.add(i * stride);
            let (x0, x1) = (T::load8(row), T::load8(row.add(8)));
            for (a, wj) in acc.iter_mut().zip(&w) {
                // SAFETY: i < n, and every head's weights hold n entries (the caller's score
                // slices of one block; asserted in debug builds above).
                let wv = _mm256_set1_ps(*wj.get_unchecked(i));
                a[0] = _mm256_fmadd_ps(wv, x0, a[0]);
                a[1] = _mm256_fmadd_ps(wv, x1, a[1]);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            let o = out.add(j * hd);
            _mm256_storeu_ps(o, a[0]);
            _mm256_storeu_ps(o.add(8), a[1]);
        }
    }

    /// Heads `0..g` of `q` (`g · hd` floats; all use KV head `kh`) over positions
    /// `sh.start..=sh.pos` (one [`super::CHUNK`], or all of them), in AVX2 + FMA, into `slot` (a
    /// partial result of `g` heads, [`super::merge`]): each head's `Σ_t exp(s_t − m) v_t`,
    /// unnormalized, and its `(m, Σ_t exp(s_t − m))`. Each block of 4 K rows is read once for all
    /// `g` heads, and the V rows in blocks of [`v_block`] positions (L1-sized),
    /// with each head's accumulators carried in `out` between blocks. Every head's operations and
    /// their order are those of a head computed alone, so the results do not depend on `g`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C (`Isa::Avx2`); `sh.head_dim % 8 == 0`; rows
    /// `start..=pos` of `kc` and `vc` hold KV head `kh` at `sh.at(t, kh)` (rows `row_stride` apart); `q`
    /// holds `g · hd` floats, `slot` `g · (hd + 2)`.
    // Inlined into each of its two builds ([`heads`], [`heads_vl`]), whose target features
    // it then takes: `#[inline(always)]` cannot carry `#[target_feature]` itself.
    #[inline(always)]
    unsafe fn heads_body<T: KvElem, const WIDE: bool, const HINT: i32>(
        sh: &AttnShape,
        q: &[f32],
        g: usize,
        Kv { k: kc, v: vc }: Kv<'_, T>,
        kh: usize,
        scores: &mut Vec<f32>,
        slot: &mut [f32],
    ) {
        let hd = sh.head_dim;
        let n = sh.pos + 1 - sh.start;
        debug_assert!(hd.is_multiple_of(8) && q.len() >= g * hd && slot.len() >= g * (hd + 2));
        let (out, ml) = slot.split_at_mut(g * hd);
        debug_assert!(kc.len() >= sh.at(sh.pos, kh) + hd && (kh + 1) * hd <= sh.kv_dim);
        let k0 = kc.as_ptr().add(sh.at(sh.start, kh));
        let v0 = vc.as_ptr().add(sh.at(sh.start, kh));
        let stride = sh.row_stride;
        scores.clear();
        scores.resize(g * n, 0.0);
        // Four positions at a time ([`dots4`]), one 4-way reduction per head. In decode the rows
        // come from DRAM (the weight stream evicts them between layers): each step asks (into L1
        // or L2: `HINT`) for the K rows [`KV_AHEAD`] positions on, and for its own positions' V
        // rows, which the V sum reads next. Rows over [`super::L1_ROW_MAX`] bytes (Gemma 3's)
        // are asked for a line at a time through the step's first dot products, shorter ones
        // (SmolLM2's) all at once before them, as measured (docs/PERFORMANCE.md, Long context).
        let (sb, row_bytes) = (stride * T::BYTES, hd * T::BYTES);
        let spread = row_bytes > super::L1_ROW_MAX;
        let geo = (stride, hd);
        let mut i = 0;
        while i + 4 <= n {
            let bases = (k0 as *const u8, v0 as *const u8);
            if !spread {
                prefetch_step::<HINT>(bases, i, sb, row_bytes);
            }
            let hints = step_rows(bases, i, sb);
            // The group's heads in chunks of at most 3 (12 accumulators and the 4 K rows fill
            // the 16 registers), or 4 in the `WIDE` build (32 registers: 16 accumulators), so
            // each K row piece is converted once per chunk; the first chunk gives spread hints.
            let mut j = 0;
            while j < g {
                let qj = q.as_ptr().add(j * hd);
                let (kb, sj) = (k0.add(i * stride), scores.as_mut_ptr().add(j * n + i));
                let pf = (spread && j == 0).then_some(hints);
                j += match g - j {
                    1 => dots4::<T, 1, HINT>(qj, kb, geo, sj, n, pf),
                    4.. if WIDE => dots4::<T, 4, HINT>(qj, kb, geo, sj, n, pf),
                    2 | 4 => dots4::<T, 2, HINT>(qj, kb, geo, sj, n, pf),
                    _ => dots4::<T, 3, HINT>(qj, kb, geo, sj, n, pf),
                };
            }
            i += 4;
        }
        for t in i..n {
            for j in 0..g {
                scores[j * n + t] = dot(q.as_ptr().add(j * hd), k0.add(t * stride), hd);
            }
        }
        for j in 0..g {
            let (m, l) = softmax::<false>(sh, &mut scores[j * n..(j + 1) * n]);
            ml[2 * j] = m;
            ml[2 * j + 1] = l;
        }
        out[..g * hd].fill(0.0);
        let pb = v_block(hd);
        let mut p0 = 0;
        while p0 < n {
            let p1 = (p0 + pb).min(n);
            if (2..=4).contains(&g) && hd.is_multiple_of(16) {
                // The group's heads together, 16 columns at a time: each V row piece is loaded
                // (and converted from f16) once for all of them.
                let vb = v0.add(p0 * stride);
                let w = |j: usize| &scores[j * n + p0..j * n + p1];
                let op = out.as_mut_ptr();
                for c in (0..hd).step_by(16) {
                    let (vp, o) = (vb.add(c), op.add(c));
                    match g {
                        2 => {
                            weighted_rows_group::<T, 2>(core::array::from_fn(w), vp, stride, o, hd)
                        }
                        3 => {
                            weighted_rows_group::<T, 3>(core::array::from_fn(w), vp, stride, o, hd)
                        }
                        _ => {
                            weighted_rows_group::<T, 4>(core::array::from_fn(w), vp, stride, o, hd)
                        }
                    }
                }
                p0 = p1;
                continue;
            }
            for j in 0..g {
                let w = &scores[j * n + p0..j * n + p1];
                let vb = v0.add(p0 * stride);
                let mut c = 0;
                while c < hd {
                    let (vp, op) = (vb.add(c), out.as_mut_ptr().add(j * hd + c));
                    c += match (hd - c) / 8 {
                        8.. => {
                            weighted_rows::<T, 8>(w, vp, stride, op);
                            64
                        }
                        4..=7 => {
                            weighted_rows::<T, 4>(w, vp, stride, op);
                            32
                        }
                        _ => {
                            weighted_rows::<T, 1>(w, vp, stride, op);
                            8
                        }
                    };
                }
            }
            p0 = p1;
        }
    }

    /// One entry point per build of [`heads_body`]: the body is inlined and compiled with the
    /// entry's target features.
    macro_rules! head_build {
        ($(#[$doc:meta])* $name:ident, $wide:literal, $features:literal) => {
            $(#[$doc])*
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<T: KvElem, const HINT: i32>(
                sh: &AttnShape,
                q: &[f32],
                g: usize,
                kv: Kv<'_, T>,
                kh: usize,
                scores: &mut Vec<f32>,
                slot: &mut [f32],
            ) {
                heads_body::<T, $wide, HINT>(sh, q, g, kv, kh, scores, slot)
            }
        };
    }

    head_build!(
        /// [`heads_body`] built for AVX2 + FMA + F16C.
        ///
        /// # Safety
        /// As [`heads_body`].
        heads,
        false,
        "avx2,fma,f16c"
    );

    head_build!(
        /// [`heads_body`] built for AVX-512VL as well: the same source and operation order, with
        /// 32 vector registers (`ymm16`–`ymm31`) for the register allocator, which lets the dot
        /// products take 4 heads per pass over the K rows (Gemma 3's group of 4 was 2 + 2).
        ///
        /// # Safety
        /// As [`heads_body`], and the CPU must support AVX-512F and AVX-512VL.
        heads_vl,
        true,
        "avx2,fma,f16c,avx512f,avx512vl"
    );

    /// How many positions ahead of its dot products [`heads`] (and the bf16 kernel) asks for K
    /// rows.
    const KV_AHEAD: usize = 16;

    /// The prefetch hints [`heads_body`] takes: into L1 (`prefetcht0`) or into L2 (`prefetcht1`).
    pub(super) const INTO_L1: i32 = _MM_HINT_T0;
    pub(super) const INTO_L2: i32 = _MM_HINT_T1;

    /// The prefetches of one 4-position step of the dot products, all at once (the bf16
    /// kernel's, and this one's for rows up to [`super::L1_ROW_MAX`] bytes; longer rows ask for
    /// the same lines spread through the dot products, [`dots4`]): the K rows of positions
    /// `i + KV_AHEAD ..` and the V rows of `i ..`, 4 each, rows `stride` bytes apart from `k0` /
    /// `v0` (row `start`), `row_bytes` long.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::kernels) unsafe fn prefetch_step<const HINT: i32>(
        (k0, v0): (*const u8, *const u8),
        i: usize,
        stride: usize,
        row_bytes: usize,
    ) {
        let (k, v) = step_rows((k0, v0), i, stride);
        for r in 0..4 {
            prefetch_row::<HINT>(k.wrapping_add(r * stride), row_bytes);
            prefetch_row::<HINT>(v.wrapping_add(r * stride), row_bytes);
        }
    }

    /// The first of the 4 K rows and of the 4 V rows that the 4-position step from position
    /// `i` asks for: K at `i + KV_AHEAD`, V at `i` (rows `stride` bytes apart from `k0` / `v0`,
    /// row `start`). Formed with `wrapping_add`: the last steps' K rows lie past the cache.
    #[inline]
    fn step_rows(
        (k0, v0): (*const u8, *const u8),
        i: usize,
        stride: usize,
    ) -> (*const u8, *const u8) {
        (
            k0.wrapping_add((i + KV_AHEAD) * stride),
            v0.wrapping_add(i * stride),
        )
    }

    /// Prefetch `HINT` ([`INTO_L1`] or [`INTO_L2`]) of the lines of `len` bytes from `p`.
    /// Prefetches never fault, so `p` may lie past the cache (the last positions ask for rows
    /// that do not exist); the callers form it with `wrapping_add`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prefetch_row<const HINT: i32>(p: *const u8, len: usize) {
        let mut o = 0;
        while o < len {
            _mm_prefetch::<HINT>(p.wrapping_add(o) as *const i8);
            o += 64;
        }
        _mm_prefetch::<HINT>(p.wrapping_add(len - 1) as *const i8);
    }

    /// Positions per block of the weighted V sum: 16 KiB of one head's V rows (64 at head width
    /// 64, 16 at 256), so the group's other heads find them in L1.
    fn v_block(hd: usize) -> usize {
        (16 * 1024 / (4 * hd)).max(8)
    }

    /// `scores[i] = exp(score(dot_i) − m)`: the raw dot products scaled (and soft-capped), then
    /// exponentiated 8 at a time (the tail through libm, as the reference) against their maximum
    /// `m`, not normalized; with `ROUND` each rounded to bf16 (nearest-even) before it is stored
    /// and summed (the bf16 decode kernel's weights). Returns `(m, Σ_i scores[i])` for
    /// [`super::merge`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::kernels) unsafe fn softmax<const ROUND: bool>(
        sh: &AttnShape,
        scores: &mut [f32],
    ) -> (f32, f32) {
        let n = scores.len();
        let mut m = f32::NEG_INFINITY;
        let mut i = 0;
        if sh.cap <= 0.0 {
            // Without a cap the score is one product: 8 at a time, with the running maximum in
            // a vector (the maximum of a set does not depend on the order it is taken in).
            let (sc, mut mv) = (_mm256_set1_ps(sh.scale), _mm256_set1_ps(f32::NEG_INFINITY));
            while i + 8 <= n {
                let p = scores.as_mut_ptr().add(i);
                let v = _mm256_mul_ps(_mm256_loadu_ps(p), sc);
                _mm256_storeu_ps(p, v);
                mv = _mm256_max_ps(mv, v);
                i += 8;
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), mv);
            m = lanes.iter().fold(m, |a, &b| a.max(b));
        }
        for s in scores[i..].iter_mut() {
            *s = sh.score(*s);
            m = m.max(*s);
        }
        // e_i = exp(s_i − m), 8 at a time; the tail through libm as in the reference.
        let mv = _mm256_set1_ps(m);
        let mut sv = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            let p = scores.as_mut_ptr().add(i);
            let mut e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
            if ROUND {
                e = round_bf16(e);
            }
            _mm256_storeu_ps(p, e);
            sv = _mm256_add_ps(sv, e);
            i += 8;
        }
        let mut sum = hsum(sv);
        for s in &mut scores[i..] {
            *s = (*s - m).exp();
            if ROUND {
                *s = crate::kernels::attention_block::bf16_round(*s);
            }
            sum += *s;
        }
        (m, sum)
    }

    /// `x` rounded to bf16 (nearest-even, in integer arithmetic as
    /// [`crate::kernels::attention_block::bf16_round`]) as f32, 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn round_bf16(x: __m256) -> __m256 {
        let b = _mm256_castps_si256(x);
        let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
        let r = _mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
        _mm256_castsi256_ps(_mm256_and_si256(
            r,
            _mm256_set1_epi32(0xFFFF_0000u32 as i32),
        ))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::rng::Rng;

    /// A float64 forward of one head from the same f32 inputs.
    fn head_f64(sh: &AttnShape, qh: &[f32], kc: &[f32], vc: &[f32], kh: usize) -> Vec<f64> {
        let hd = sh.head_dim;
        let row = |c: &[f32], t: usize| -> Vec<f64> {
            c[sh.at(t, kh)..][..hd].iter().map(|&x| x as f64).collect()
        };
        let s: Vec<f64> = (sh.start..=sh.pos)
            .map(|t| {
                let d: f64 = row(kc, t)
                    .iter()
                    .zip(qh)
                    .map(|(k, &q)| k * q as f64)
                    .sum::<f64>()
                    * sh.scale as f64;
                if sh.cap > 0.0 {
                    sh.cap as f64 * (d / sh.cap as f64).tanh()
                } else {
                    d
                }
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        let mut o = vec![0f64; hd];
        for (i, t) in (sh.start..=sh.pos).enumerate() {
            for (o, v) in o.iter_mut().zip(row(vc, t)) {
                *o += e[i] / z * v;
            }
        }
        o
    }

    /// Shapes of SmolLM2 (9 heads of 64, 3 KV heads) and Gemma 3 (4 of 256, 1 KV head), odd
    /// widths, a sliding window, a soft cap and lengths around the 8-score vector step.
    /// The test shapes (position-major), shared with the bf16 kernel's tests.
    pub(in crate::kernels) fn cases() -> Vec<AttnShape> {
        let mut v = Vec::new();
        // Groups of 1–5 heads: the AVX2 kernel takes heads in chunks of at most 3 for the dots
        // and sums V for 2–4 heads together when the width is a multiple of 16.
        for (n_heads, group, hd) in [
            (9, 3, 64),
            (4, 4, 256),
            (2, 1, 40),
            (3, 3, 8),
            (2, 2, 12),
            (4, 2, 16),
            (10, 5, 32),
            (8, 8, 64),
            (4, 1, 32),
        ] {
            // The last four span several chunks ([`CHUNK`]): from 0, from inside one, one
            // position each side of a boundary, and over eight boundaries.
            for (start, pos) in [
                (0, 0),
                (0, 6),
                (0, 7),
                (0, 16),
                (3, 40),
                (0, 130),
                (0, 600),
                (300, 900),
                (255, 256),
                (0, 2100),
            ] {
                for cap in [0.0, 30.0] {
                    v.push(AttnShape {
                        n_heads,
                        group,
                        head_dim: hd,
                        kv_dim: n_heads / group * hd,
                        row_stride: n_heads / group * hd,
                        head_stride: hd,
                        start,
                        pos,
                        scale: 1.0 / (hd as f32).sqrt(),
                        cap,
                    });
                }
            }
        }
        v
    }

    pub(in crate::kernels) fn inputs(sh: &AttnShape, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut r = Rng::new(seed);
        let q = r.fill(sh.n_heads * sh.head_dim, 2.0);
        let k = r.fill((sh.pos + 1) * sh.kv_dim, 2.0);
        let v = r.fill((sh.pos + 1) * sh.kv_dim, 1.0);
        (q, k, v)
    }

    /// Every ISA and thread count against float64: |Δ| ≤ 2e-5 · (1 + |want|) per output.
    #[test]
    fn every_isa_matches_a_float64_forward() {
        for (ci, sh) in cases().iter().enumerate() {
            let (q, k, v) = inputs(sh, ci as u64 + 1);
            let hd = sh.head_dim;
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                for threads in [1, 2] {
                    let pool = ThreadPool::new(threads);
                    let mut att = vec![f32::NAN; sh.n_heads * hd];
                    attend(&pool, isa, sh, &q, &k, &v, &mut att);
                    for h in 0..sh.n_heads {
                        let want = head_f64(sh, &q[h * hd..(h + 1) * hd], &k, &v, h / sh.group);
                        for (j, (&g, w)) in att[h * hd..].iter().zip(&want).enumerate() {
                            assert!(
                                (g as f64 - w).abs() <= 2e-5 * (1.0 + w.abs()),
                                "case {ci} {isa:?} t{threads} head {h} col {j}: {g} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The AVX2 kernel against the scalar reference, head by head (where the CPU has AVX2).
    #[test]
    fn avx2_matches_the_scalar_reference() {
        if !Isa::Avx2.available() {
            println!("SKIP: this CPU has no AVX2/FMA");
            return;
        }
        for (ci, sh) in cases().iter().enumerate() {
            if !sh.head_dim.is_multiple_of(8) {
                continue;
            }
            let (q, k, v) = inputs(sh, 100 + ci as u64);
            let hd = sh.head_dim;
            let pool = ThreadPool::new(1);
            let (mut a, mut b) = (vec![0f32; sh.n_heads * hd], vec![0f32; sh.n_heads * hd]);
            attend(&pool, Isa::Avx2, sh, &q, &k, &v, &mut a);
            let mut scores = Vec::new();
            for h in 0..sh.n_heads {
                let qh = &q[h * hd..(h + 1) * hd];
                head_scalar(
                    sh,
                    qh,
                    &k,
                    &v,
                    h / sh.group,
                    &mut scores,
                    &mut b[h * hd..(h + 1) * hd],
                );
            }
            for (j, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "case {ci} out {j}: avx2 {x} scalar {y}"
                );
            }
        }
    }

    /// The AVX-512VL build of the AVX2 kernel gives the AVX2 build's bits (where the CPU has VL).
    #[test]
    fn the_vl_build_equals_the_avx2_build_bit_for_bit() {
        if head_kernel(Isa::Avx512, 64) != HeadKernel::Avx2Vl {
            println!("SKIP: this CPU has no AVX-512VL");
            return;
        }
        let pool = ThreadPool::new(2);
        for (ci, base) in cases().iter().enumerate() {
            if !base.head_dim.is_multiple_of(8) {
                continue;
            }
            for pos in [0, 3, 37, 300] {
                let sh = AttnShape {
                    pos,
                    start: base.start.min(pos),
                    ..*base
                };
                let (q, k, v) = inputs(&sh, 700 + ci as u64);
                let n = sh.n_heads * sh.head_dim;
                let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                attend(&pool, Isa::Avx2, &sh, &q, &k, &v, &mut a);
                attend(&pool, Isa::Avx512, &sh, &q, &k, &v, &mut b);
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "case {ci} pos {pos}"
                );
            }
        }
    }

    /// A KV group's heads computed together equal each head computed alone, bit for bit.
    #[test]
    fn grouped_heads_equal_heads_alone_bit_for_bit() {
        for (ci, sh) in cases().iter().enumerate() {
            let (q, k, v) = inputs(sh, 300 + ci as u64);
            let hd = sh.head_dim;
            for isa in [Isa::Scalar, Isa::Avx2] {
                let simd = head_kernel(isa, hd);
                let mut scores = Vec::new();
                for h0 in (0..sh.n_heads).step_by(sh.group) {
                    let g = sh.group.min(sh.n_heads - h0);
                    let mut together = vec![f32::NAN; g * hd];
                    heads_into(
                        simd,
                        sh,
                        (h0, g),
                        &q,
                        Kv { k: &k, v: &v },
                        &mut scores,
                        &mut together,
                    );
                    for j in 0..g {
                        let mut alone = vec![f32::NAN; hd];
                        heads_into(
                            simd,
                            sh,
                            (h0 + j, 1),
                            &q,
                            Kv { k: &k, v: &v },
                            &mut scores,
                            &mut alone,
                        );
                        let t = &together[j * hd..(j + 1) * hd];
                        assert!(
                            t.iter()
                                .zip(&alone)
                                .all(|(x, y)| x.to_bits() == y.to_bits()),
                            "case {ci} {isa:?} head {}",
                            h0 + j
                        );
                    }
                }
            }
        }
    }

    /// Every thread count above one gives the same bits: the head ranges of the threads only
    /// decide which heads share a K/V pass, and the chunks' boundaries and merge order do not
    /// depend on the threads. (One thread computes the positions as one chunk: to rounding, in
    /// `every_isa_matches_a_float64_forward`.)
    #[test]
    fn thread_counts_agree_bit_for_bit() {
        let pools: Vec<ThreadPool> = (2..=4).map(ThreadPool::new).collect();
        for (base, pos) in cases().into_iter().flat_map(|b| [(b, 300), (b, 1100)]) {
            let sh = AttnShape { pos, ..base };
            let (q, kc, vc) = inputs(&sh, 5);
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512]
                .into_iter()
                .filter(|i| i.available())
            {
                let outs: Vec<Vec<f32>> = pools
                    .iter()
                    .map(|p| {
                        let mut att = vec![0f32; sh.n_heads * sh.head_dim];
                        attend(p, isa, &sh, &q, &kc, &vc, &mut att);
                        att
                    })
                    .collect();
                assert!(outs.iter().all(|o| o == &outs[0]), "{isa:?} {sh:?}");
            }
        }
    }

    /// A batch of positions in one pool run equals one `attend` per position, bit for bit, with
    /// and without a sliding window, on every ISA and thread count; where the AVX-512 block
    /// kernel serves the batch (`attention_block`), to rounding.
    #[test]
    fn a_batch_equals_one_call_per_position_bit_for_bit() {
        for (n_heads, group, hd) in [(9, 3, 64), (4, 4, 256), (2, 2, 12)] {
            let kv_dim = n_heads / group * hd;
            let sh = AttnShape {
                n_heads,
                group,
                head_dim: hd,
                kv_dim,
                row_stride: kv_dim,
                head_stride: hd,
                start: 0,
                pos: 0,
                scale: 1.0 / (hd as f32).sqrt(),
                cap: 0.0,
            };
            let (pos0, n) = (5, 37);
            let mut r = Rng::new(hd as u64);
            let q = r.fill(n * n_heads * hd, 2.0);
            let k = r.fill((pos0 + n) * kv_dim, 2.0);
            let v = r.fill((pos0 + n) * kv_dim, 1.0);
            for window in [0, 8] {
                for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                    for threads in [1, 2] {
                        let pool = ThreadPool::new(threads);
                        let row = n_heads * hd;
                        let mut got = vec![f32::NAN; n * row];
                        attend_batch(
                            &pool,
                            isa,
                            &sh,
                            Batch {
                                window,
                                pos0,
                                n,
                                bf16: false,
                            },
                            &q,
                            Kv { k: &k, v: &v },
                            &mut got,
                        );
                        for b in 0..n {
                            let pos = pos0 + b;
                            let start = if window > 0 {
                                (pos + 1).saturating_sub(window)
                            } else {
                                0
                            };
                            let one = AttnShape { start, pos, ..sh };
                            let mut want = vec![f32::NAN; row];
                            attend(
                                &pool,
                                isa,
                                &one,
                                &q[b * row..(b + 1) * row],
                                &k,
                                &v,
                                &mut want,
                            );
                            let g = &got[b * row..(b + 1) * row];
                            let what =
                                format!("hd {hd} window {window} {isa:?} t{threads} pos {pos}");
                            if isa == Isa::Avx512 && super::super::attention_block::usable(&sh) {
                                // The block kernel (`attention_block`): equal to rounding.
                                for (x, y) in g.iter().zip(&want) {
                                    assert!((x - y).abs() <= 2e-5 * (1.0 + y.abs()), "{what}");
                                }
                                continue;
                            }
                            assert!(
                                g.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()),
                                "{what}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Attention over an f16 cache equals attention over an f32 cache holding the same rounded
    /// values, bit for bit, for one query and for a batch, on every ISA and thread count: the
    /// kernels convert each f16 exactly and then run the f32 arithmetic.
    #[test]
    fn an_f16_cache_equals_an_f32_cache_of_the_rounded_values() {
        use half::f16;
        let pools: Vec<ThreadPool> = (1..=2).map(ThreadPool::new).collect();
        for (ci, sh) in cases().iter().enumerate() {
            let (q, k, v) = inputs(sh, 700 + ci as u64);
            let (k16, v16): (Vec<f16>, Vec<f16>) = (
                k.iter().map(|&x| f16::from_f32(x)).collect(),
                v.iter().map(|&x| f16::from_f32(x)).collect(),
            );
            let (kr, vr): (Vec<f32>, Vec<f32>) = (
                k16.iter().map(|x| x.to_f32()).collect(),
                v16.iter().map(|x| x.to_f32()).collect(),
            );
            let row = sh.n_heads * sh.head_dim;
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                for pool in &pools {
                    let (mut a, mut b) = (vec![f32::NAN; row], vec![f32::NAN; row]);
                    attend(pool, isa, sh, &q, &k16, &v16, &mut a);
                    attend(pool, isa, sh, &q, &kr, &vr, &mut b);
                    let same = |a: &[f32], b: &[f32]| {
                        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
                    };
                    assert!(same(&a, &b), "case {ci} {isa:?} t{}", pool.threads());
                    // The last two positions as a batch (one query row each).
                    if sh.pos >= 1 && sh.start == 0 {
                        let qq: Vec<f32> = q.iter().chain(&q).copied().collect();
                        let (mut a, mut b) = (vec![f32::NAN; 2 * row], vec![f32::NAN; 2 * row]);
                        let p0 = sh.pos - 1;
                        attend_batch(
                            pool,
                            isa,
                            sh,
                            Batch {
                                window: 0,
                                pos0: p0,
                                n: 2,
                                bf16: false,
                            },
                            &qq,
                            Kv { k: &k16, v: &v16 },
                            &mut a,
                        );
                        attend_batch(
                            pool,
                            isa,
                            sh,
                            Batch {
                                window: 0,
                                pos0: p0,
                                n: 2,
                                bf16: false,
                            },
                            &qq,
                            Kv { k: &kr, v: &vr },
                            &mut b,
                        );
                        assert!(same(&a, &b), "batch: case {ci} {isa:?} t{}", pool.threads());
                    }
                }
            }
        }
    }

    /// The same rows laid out head-major (each KV head's rows one block of `cap`, as the engine's
    /// cache stores them) give the same bits as position-major, one query and a batch, on every
    /// ISA and thread count.
    #[test]
    fn head_major_rows_equal_position_major_bit_for_bit() {
        for sh in cases() {
            let (q, k, v) = inputs(&sh, 21);
            let (hd, heads) = (sh.head_dim, sh.kv_dim / sh.head_dim);
            let cap = sh.pos + 1 + 3;
            let to_heads = |c: &[f32]| -> Vec<f32> {
                let mut out = vec![0f32; heads * cap * hd];
                for t in 0..=sh.pos {
                    for h in 0..heads {
                        out[(h * cap + t) * hd..][..hd]
                            .copy_from_slice(&c[t * sh.kv_dim + h * hd..][..hd]);
                    }
                }
                out
            };
            let (kh, vh) = (to_heads(&k), to_heads(&v));
            let hm = AttnShape {
                row_stride: hd,
                head_stride: cap * hd,
                ..sh
            };
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                for threads in [1, 2] {
                    let pool = ThreadPool::new(threads);
                    let mut a = vec![0f32; sh.n_heads * hd];
                    let mut b = a.clone();
                    attend(&pool, isa, &sh, &q, &k, &v, &mut a);
                    attend(&pool, isa, &hm, &q, &kh, &vh, &mut b);
                    assert!(a == b, "{isa:?} {threads} {sh:?}");
                    let n = (sh.pos + 1 - sh.start).min(4);
                    let pos0 = sh.pos + 1 - n;
                    let qb: Vec<f32> = (0..n).flat_map(|_| q.iter().copied()).collect();
                    let mut ab = vec![0f32; n * sh.n_heads * hd];
                    let mut bb = ab.clone();
                    attend_batch(
                        &pool,
                        isa,
                        &sh,
                        Batch {
                            window: 0,
                            pos0,
                            n,
                            bf16: false,
                        },
                        &qb,
                        Kv { k: &k, v: &v },
                        &mut ab,
                    );
                    attend_batch(
                        &pool,
                        isa,
                        &hm,
                        Batch {
                            window: 0,
                            pos0,
                            n,
                            bf16: false,
                        },
                        &qb,
                        Kv { k: &kh, v: &vh },
                        &mut bb,
                    );
                    assert!(ab == bb, "batch {isa:?} {threads} {sh:?}");
                }
            }
        }
    }

    /// One position attends only to itself: the output is its V row exactly (weight 1).
    #[test]
    fn a_single_position_returns_its_value_row() {
        let sh = AttnShape {
            n_heads: 4,
            group: 2,
            head_dim: 16,
            kv_dim: 32,
            row_stride: 32,
            head_stride: 16,
            start: 5,
            pos: 5,
            scale: 0.25,
            cap: 0.0,
        };
        let (q, k, v) = inputs(&sh, 9);
        for isa in [Isa::Scalar, Isa::Avx2] {
            let mut att = vec![0f32; 64];
            attend(&ThreadPool::new(1), isa, &sh, &q, &k, &v, &mut att);
            for h in 0..4 {
                let kh = h / 2;
                assert_eq!(&att[h * 16..(h + 1) * 16], &v[5 * 32 + kh * 16..][..16]);
            }
        }
    }
}
