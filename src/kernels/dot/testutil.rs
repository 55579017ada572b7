//! The one SIMD-vs-scalar harness of the tile kernels (test builds only): random tiles of every
//! quant type in its layout (split scales and quants for Q4_0/Q4_1/Q8_0/F16/F32, interleaved
//! GGUF blocks for Q5_0/Q5_1 and the K-quants), activations in every form (f32, Q8 blocks,
//! Q8_K), and [`check_kernel`], which runs a kernel under test beside the scalar reference of
//! each type and bounds the difference. Also the batched kernels' cases and the activation
//! quantizer's check.

use super::split::scalar;
use super::Q8KRef;
use super::{act_q8, kquant_scalar, Q8Act, Tile, XqRef};
use crate::quant::kquants::QK_K;
use crate::quant::{dequantize_row, quantize_row, QuantType, QK};

/// A tile kernel under test: `y += W·x` for one tile, the activation as f32, as Q8 blocks (the
/// integer path of the block types) and as Q8_K blocks (the K-quants' integer path); a kernel
/// of the split types ignores the Q8_K argument.
pub type Kernel<'a> = &'a dyn Fn(Tile, &[f32], XqRef, Option<Q8KRef>, &mut [f32]);

/// `kern` against the scalar reference of `q` on one random `rows × cols` tile, on every path
/// the type has: per row the difference must stay within 1e-4 of the product's norm (+1e-6).
pub fn check_one(kern: Kernel, rng: &mut Rng, q: QuantType, rows: usize, cols: usize) {
    if QuantType::SPLIT.contains(&q) {
        check_one_split(kern, rng, q, rows, cols)
    } else {
        check_one_interleaved(kern, rng, q, rows, cols)
    }
}

/// Runs `kern` on random tiles and edge shapes of every type in `types` ([`QuantType::SPLIT`]
/// or [`INTERLEAVED`]), seeded with `seed`:
/// - split types: 1,000 random tiles each (rows 1..=128; cols 32..=256 step 32 for the block
///   types, any width 1..=256 for F16/F32), plus edge shapes (for F16/F32 also every width
///   around the SIMD steps of 8, 16 and 32 columns);
/// - interleaved types: 300 random tiles each (rows 1..=40; 1..=4 blocks for the K-quants,
///   1..=16 for Q5_0/Q5_1), plus edge shapes.
pub fn check_kernel(kern: Kernel, types: &[QuantType], seed: u64) {
    let mut rng = Rng::new(seed);
    for &q in types {
        if QuantType::SPLIT.contains(&q) {
            for _ in 0..1000 {
                let rows = 1 + rng.below(128);
                let cols = if q.is_blocked() {
                    QK * (1 + rng.below(8))
                } else {
                    1 + rng.below(256)
                };
                check_one(kern, &mut rng, q, rows, cols);
            }
            for rows in [1, 2, 3, 4, 5, 6, 7, 9, 127, 128] {
                for cols in [32, 64, 96, 128, 224, 256, 288, 512, 640] {
                    check_one(kern, &mut rng, q, rows, cols);
                }
                if !q.is_blocked() {
                    for cols in [
                        1, 2, 7, 8, 9, 15, 16, 17, 24, 31, 33, 40, 47, 48, 49, 63, 65, 100, 255,
                    ] {
                        check_one(kern, &mut rng, q, rows, cols);
                    }
                }
            }
        } else {
            let bl = q.block_len();
            for _ in 0..300 {
                let rows = 1 + rng.below(40);
                let cols = bl * (1 + rng.below(if q.is_k() { 4 } else { 16 }));
                check_one(kern, &mut rng, q, rows, cols);
            }
            for rows in [1, 2, 3, 4, 5, 7, 9, 128] {
                for nb in [1, 2, 3, 8] {
                    check_one(kern, &mut rng, q, rows, bl * nb);
                }
            }
        }
    }
}

/// A batched-kernel test case: a random `rows × cols` tile of `q`, `n` tokens of f32
/// activations, each quantized to Q8 blocks (scalar reference quantizer), and random start
/// values of the `n · rows` outputs (the kernels accumulate).
pub struct BatchCase {
    pub tile: TileData,
    pub xs: Vec<f32>,
    pub acts: Vec<Q8Act>,
    pub y0: Vec<f32>,
}

impl BatchCase {
    pub fn new(rng: &mut Rng, q: QuantType, rows: usize, cols: usize, n: usize) -> BatchCase {
        let tile = random_tile(rng, q, rows, cols);
        let xs: Vec<f32> = (0..n * cols).map(|_| rng.uniform() * 2.0).collect();
        let acts = xs
            .chunks_exact(cols)
            .map(|x| {
                let mut a = Q8Act::default();
                act_q8::scalar::quantize_act(x, &mut a);
                a
            })
            .collect();
        let y0 = (0..n * rows).map(|_| rng.uniform()).collect();
        BatchCase { tile, xs, acts, y0 }
    }

    /// Each token's Q8 blocks as the kernels take them.
    pub fn xq(&self) -> Vec<(&[f32], &[f32], &[i8])> {
        self.acts
            .iter()
            .map(|a| (&a.d[..], &a.s[..], &a.qs[..]))
            .collect()
    }
}

pub use crate::rng::Rng;

pub struct TileData {
    pub scales: Vec<u8>,
    pub qs: Vec<u8>,
    /// Dequantized weights, row-major.
    pub w: Vec<f32>,
}

pub fn random_tile(rng: &mut Rng, q: QuantType, rows: usize, cols: usize) -> TileData {
    let amp = [0.01f32, 0.5, 3.0][rng.below(3)];
    let (mut scales, mut qs) = (Vec::new(), Vec::new());
    let mut w = vec![0f32; rows * cols];
    let mut src = vec![0f32; cols];
    for r in 0..rows {
        // Some rows with a positive bias so that Q4_1 minimums are not all negative.
        let bias = if rng.below(4) == 0 { amp } else { 0.0 };
        for v in src.iter_mut() {
            *v = rng.uniform() * amp + bias;
        }
        let (s0, q0) = (scales.len(), qs.len());
        quantize_row(q, &src, &mut scales, &mut qs);
        dequantize_row(
            q,
            &scales[s0..],
            &qs[q0..],
            &mut w[r * cols..(r + 1) * cols],
        );
    }
    TileData { scales, qs, w }
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|a| a * a).sum::<f32>().sqrt()
}

/// The interleaved types (GGUF blocks with their scales inside).
pub const INTERLEAVED: [QuantType; 5] = [
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q4_K,
    QuantType::Q5_K,
    QuantType::Q6_K,
];

/// A random interleaved tile: GGUF blocks plus the dequantized weights (row-major). The same
/// rows as [`random_tile`]'s; these types keep their scales inside the blocks.
pub fn random_body_tile(
    rng: &mut Rng,
    q: QuantType,
    rows: usize,
    cols: usize,
) -> (Vec<u8>, Vec<f32>) {
    let t = random_tile(rng, q, rows, cols);
    assert!(t.scales.is_empty(), "{q} is not an interleaved type");
    (t.qs, t.w)
}

/// The activation in every form.
pub fn acts(x: &[f32]) -> Q8Act {
    let mut a = Q8Act::default();
    act_q8::scalar::quantize_act(x, &mut a);
    if x.len().is_multiple_of(QK_K) {
        act_q8::scalar::quantize_q8k(x, &mut a.k);
    }
    a
}

/// [`check_one`] for a split-layout type: the f32 path and (block types) the integer path, and
/// the integer against the f32 path within the Q8 activation's error.
fn check_one_split(kern: Kernel, rng: &mut Rng, q: QuantType, rows: usize, cols: usize) {
    let t = random_tile(rng, q, rows, cols);
    let x: Vec<f32> = (0..cols).map(|_| rng.uniform() * 2.0).collect();
    let mut xq = Q8Act::default();
    act_q8::scalar::quantize_act(&x, &mut xq);
    let y0: Vec<f32> = (0..rows).map(|_| rng.uniform()).collect();
    let xqs = (&xq.d[..], &xq.s[..], &xq.qs[..]);
    let paths: &[XqRef] = if q.is_blocked() {
        &[None, Some(xqs)]
    } else {
        &[None]
    };
    let mut outs = Vec::new();
    for &xa in paths {
        let mut yr = y0.clone();
        scalar::tile_matvec(
            Tile::split(q, rows, cols, &t.scales, &t.qs),
            &x,
            xa,
            &mut yr,
        );
        let mut ys = y0.clone();
        kern(
            Tile::split(q, rows, cols, &t.scales, &t.qs),
            &x,
            xa,
            None,
            &mut ys,
        );
        let what = format!("{q} {}x{cols} int={}", y0.len(), xa.is_some());
        assert_near(&what, &y0, &yr, &ys);
        outs.push(ys);
    }
    if q.is_blocked() {
        // Integer vs f32 path: the only difference is the activation's Q8 rounding,
        // |x - x̂| ≤ d_x/2 per element, so per row |Δ| ≤ Σ_b (d_x[b]/2)·Σ_{j∈b} |w_j|
        // (+ the same float slack as above).
        let prod: Vec<f32> = outs[0].iter().zip(&y0).map(|(a, b)| a - b).collect();
        let slack = 1e-4 * norm(&prod) + 1e-6;
        for (r, wr) in t.w.chunks_exact(cols).enumerate() {
            let bound: f32 = wr
                .chunks_exact(QK)
                .enumerate()
                .map(|(b, blk)| xq.d[b] * 0.5 * blk.iter().map(|v| v.abs()).sum::<f32>())
                .sum();
            let d = (outs[0][r] - outs[1][r]).abs();
            assert!(
                d <= bound * 1.001 + slack,
                "{q} int vs f32 row {r}: {d} > {bound}"
            );
        }
    }
}

/// [`check_one`] for an interleaved type: the f32 and the integer paths.
fn check_one_interleaved(kern: Kernel, rng: &mut Rng, q: QuantType, rows: usize, cols: usize) {
    let (qs, _) = random_body_tile(rng, q, rows, cols);
    let x: Vec<f32> = (0..cols).map(|_| rng.uniform() * 2.0).collect();
    let a = acts(&x);
    let y0: Vec<f32> = (0..rows).map(|_| rng.uniform()).collect();
    for int in [false, true] {
        let xq = (int && !q.is_k()).then(|| a.tile_slice(0, cols));
        let xk = if int && q.is_k() {
            a.k.slice(0, cols)
        } else {
            None
        };
        let mut yr = y0.clone();
        kquant_scalar::tile_matvec(Tile::body(q, rows, cols, &qs), &x, xq, xk, &mut yr);
        let mut ys = y0.clone();
        kern(Tile::body(q, rows, cols, &qs), &x, xq, xk, &mut ys);
        assert_near(&format!("{q} {rows}x{cols} int={int}"), &y0, &yr, &ys);
    }
}

/// The kernel's outputs `ys` against the reference's `yr`, both accumulated onto `y0`: per row
/// within 1e-4 of the product's norm, plus a few ulps of the accumulated y0 (|y0| < 1). `what`
/// names the case in a failure. The one bound of the SIMD-vs-scalar tests (per token and batched).
pub(super) fn assert_near(what: &str, y0: &[f32], yr: &[f32], ys: &[f32]) {
    let prod: Vec<f32> = yr.iter().zip(y0).map(|(a, b)| a - b).collect();
    let tol = 1e-4 * norm(&prod) + 1e-6;
    for r in 0..y0.len() {
        let d = (yr[r] - ys[r]).abs();
        assert!(
            d <= tol,
            "{what} row {r}: ref {} simd {} (diff {d}, tol {tol})",
            yr[r],
            ys[r]
        );
    }
}

/// Activation quantizer must match the scalar one bit for bit (incl. exact .5 ties).
pub fn check_quantize(quant: &dyn Fn(&[f32], &mut Q8Act)) {
    let mut rng = Rng::new(99);
    let mut xs: Vec<Vec<f32>> = (0..200)
        .map(|i| {
            let n = QK * (1 + i % 20);
            (0..n).map(|_| rng.uniform() * 10.0).collect()
        })
        .collect();
    // amax = 127 → d = 1: every k + 0.5 is a tie.
    let mut ties: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) + 0.5).collect();
    ties[0] = 127.0;
    ties[40] = -127.0;
    xs.push(ties);
    xs.push(vec![0.0; 64]);
    // Blocks of very different scales side by side (the AVX2 quantizer takes 8 at a time):
    // all-zero blocks, subnormal and huge maxima, a single nonzero value.
    // 127/f32::MAX ≈ 3.73e-37: around it 1/d goes from finite to +inf.
    let scales = [
        0.0, 1e-40, 3e-39, 3.7e-37, 3.8e-37, 1e-36, 1e-20, 1e-3, 1.0, 127.0, 1e20, 3e38,
    ];
    for n_blocks in [8, 9, 16, 17, 48] {
        xs.push(
            (0..n_blocks * QK)
                .map(|i| rng.uniform() * scales[(i / QK * 5 + n_blocks) % scales.len()])
                .collect(),
        );
    }
    // Infinities (the forward pass stops at them, but the bytes still match): a block holding
    // one has d = inf and quantizes to zeros.
    let mut infs: Vec<f32> = (0..16 * QK).map(|_| rng.uniform()).collect();
    infs[2 * QK + 5] = f32::INFINITY;
    infs[11 * QK] = f32::NEG_INFINITY;
    xs.push(infs);
    let mut lone = vec![0.0; 8 * QK];
    lone[3 * QK + 7] = -1e-3;
    xs.push(lone);
    // One reused buffer too, as decode reuses its `Q8Act` across lengths (576, 1536, …):
    // whatever a longer activation left behind must not show in a shorter one's blocks.
    let mut reused = Q8Act::default();
    for x in &xs {
        let (mut a, mut b) = (Q8Act::default(), Q8Act::default());
        act_q8::scalar::quantize_act(x, &mut a);
        quant(x, &mut b);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(a.qs, b.qs);
        assert_eq!(bits(&a.d), bits(&b.d));
        assert_eq!(bits(&a.s), bits(&b.s));
        quant(x, &mut reused);
        assert_eq!(a.qs, reused.qs);
        assert_eq!((bits(&a.d), bits(&a.s)), (bits(&reused.d), bits(&reused.s)));
    }
}
