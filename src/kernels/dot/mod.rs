//! Tile dot-product kernels with fused dequantization. Every SIMD kernel sits next to its scalar
//! reference and is tested against it. Runtime ISA dispatch picks the best available path.
//!
//! Contract (used by `kernels::matvec`): a *tile* holds `rows × cols` weights of one quant type
//! (`cols` a multiple of 32 for the block types, any width for F16/F32) in the split layout (`scales`: per-row block scale entries, row-major; `qs`: per-row packed quants,
//! row-major; see `quant`). `tile_matvec` *accumulates* `y[r] += Σ_c W[r][c] · x[c]`.
//! When `xq` (the activation quantized to Q8 blocks, covering exactly these `cols`) is given and
//! the type is a block type (Q4_0, Q4_1, Q8_0), the integer path is used; F16/F32 always use `x`.
//! `x` may be empty when the integer path is taken.
//!
//! Dispatch: [`tile_matvec`] checks the slice lengths once per call (asserts), then runs the
//! kernel of the requested [`Isa`] if this CPU has it (a cached feature test, so a hand-made
//! `Isa` value can never run unsupported instructions), else the next lower one:
//! `Avx512` (F+BW; VNNI `vpdpbusd` variant when `avx512vnni` is present) → `Avx2` (AVX2+FMA+F16C)
//! → `Scalar`. [`Q8Act::quantize_from`] uses the AVX2 quantizer when available; it is
//! bit-identical to the scalar one (both in `act_q8`). The AVX2/AVX-512 helpers the kernels
//! share (`hsum`, `prefetch_ahead`) are in `simd`.
//!
//! Tiles of a repacked resident copy (`quant::packed`) run the kernels of [`packed`] instead
//! (AVX-512 VNNI when present, else AVX2, else scalar), whatever `Isa::for_quant` says.
//!
//! The matvec drivers do not dispatch per tile: each matrix's kernel is chosen once, from its
//! type, its layout and the ISA, by [`select`] (and bound on the matrix when the model is
//! opened). The dispatching entry points here ([`tile_matvec`], [`tile_matmul`],
//! `kquant::tile_matvec_act`, `packed::tile_run`) run one tile on an ISA named by the caller:
//! the kernel tests and benches use them.
//!
//! Which path to use: the integer (Q8-activation) path is faster for every block type on every
//! ISA measured (AVX2 on Zen 3, best-of-N, in-cache 2048×2048: Q4_0 ≈ 17–18 vs 6–9 GB/s, Q4_1
//! ≈ 17 vs 8–9, Q8_0 ≈ 23 vs 14; scalar ≈ 3× faster too), so [`int_path_preferred`] returns true
//! for block types. The f32 path stays as the exact reference-accuracy option. See
//! `benches/kernels.rs`.

pub mod act_q8;
pub mod float;
pub mod k4;
pub mod kquant;
#[cfg(target_arch = "x86_64")]
pub mod kquant_amx;
#[cfg(target_arch = "x86_64")]
pub mod kquant_avx2;
#[cfg(target_arch = "x86_64")]
pub mod kquant_avx512;
#[cfg(target_arch = "x86_64")]
pub mod kquant_batch;
pub mod kquant_scalar;
pub mod packed;
pub mod packed_amx;
pub mod q5;
pub mod q6_k;
pub mod select;
#[cfg(target_arch = "x86_64")]
pub mod simd;
pub mod split;
mod tile;
pub use act_q8::{quantize_act, Q8Act, Q8KRef, XqBlocks, XqRef, Q8K};
pub use tile::Tile;

use crate::quant::{QuantType, QK};
use split::scalar;
#[cfg(target_arch = "x86_64")]
use split::{avx2, avx512};

/// Instruction-set path chosen for the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
}

impl Isa {
    /// Best ISA available on this CPU (overridable with `CFLOW_ISA=scalar|avx2|avx512`).
    pub fn detect() -> Isa {
        if let Ok(v) = std::env::var("CFLOW_ISA") {
            match v.as_str() {
                "scalar" => return Isa::Scalar,
                "avx2" if Isa::Avx2.available() => return Isa::Avx2,
                "avx512" if Isa::Avx512.available() => return Isa::Avx512,
                _ => {}
            }
        }
        if Isa::Avx512.available() {
            Isa::Avx512
        } else if Isa::Avx2.available() {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    }

    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// True when the AVX-512 path may use VNNI (`vpdpbusd`).
    pub fn has_vnni(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => self.available() && is_x86_feature_detected!("avx512vnni"),
            _ => false,
        }
    }

    /// [`Isa::detect`], evaluated once per process.
    pub fn cached() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(Isa::detect)
    }

    /// The kernels that run weights of type `q` when the engine asks for `self`: the AVX-512
    /// kernels only where they are not slower than the AVX2 ones on a measured CPU. Q5_0 runs
    /// its AVX-512 VNNI + VBMI kernel where the CPU has them (Gemma 3 270M decode on an Intel
    /// Xeon with AMX, 2026-12-05: pair ratios 0.99–1.06, median ~1.03, at 1 thread). On AMD
    /// Zen 5 (2026-12-02, docs/PERFORMANCE.md, "Defaults chosen by measurement"), AVX-512 wins for Q8_0 (the
    /// LM heads), the float types and Q4 prefill (its batched VNNI kernel), and ties for Q4
    /// decode; the Q5 and K-quant kernels stay AVX2 (the AVX2 K-quant kernels run 4 rows at a
    /// time and are 2× faster than the one-row AVX-512 ones). Every other ISA runs as asked.
    pub fn for_quant(self, q: QuantType) -> Isa {
        match self {
            Isa::Avx512 if q.is_interleaved() && !(q == QuantType::Q5_0 && q5_0_avx512()) => {
                Isa::Avx2
            }
            isa => isa,
        }
    }

    /// Which kernels [`Isa::for_quant`] runs on this ISA, for reports (`run --json`, `bench
    /// --json`): the same words whatever the model.
    pub fn kernels(self) -> &'static str {
        match self {
            Isa::Avx512 if self.available() => {
                // Composed once: every part depends only on the CPU (and `CFLOW_AMX`, read once).
                static LABEL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
                LABEL.get_or_init(|| {
                    let q5 = if q5_0_avx512() {
                        "AVX-512 VNNI for Q5_0, AVX2 for Q5_1/K-quants"
                    } else {
                        "AVX2 for Q5_0/Q5_1/K-quants"
                    };
                    let batch = match (self.has_vnni(), packed_amx::available()) {
                        (true, true) => {
                            " (their batched prefill: AVX-512 VNNI; AMX INT8 for Q5_0/Q4_K/Q6_K)"
                        }
                        (true, false) => " (their batched prefill: AVX-512 VNNI)",
                        _ => "",
                    };
                    format!("AVX-512 for Q4_0/Q4_1/Q8_0/F16/F32, {q5}{batch}")
                })
            }
            Isa::Avx512 | Isa::Avx2 if Isa::Avx2.available() => "AVX2",
            _ => "scalar",
        }
    }

    /// [`Isa::kernels`] for a model whose Q4_0/Q4_1/Q8_0 (and, where [`packed::repacks_vnni_types`],
    /// Q5_0) matrices were `repacked` at open:
    /// those run the kernel [`packed::path`] picks, the other matrices as `kernels` says.
    pub fn kernels_with(self, repacked: bool) -> String {
        let k = self.kernels();
        if !repacked {
            return k.to_string();
        }
        let path = packed::path(self);
        let amx = if path == packed::Path::Vnni && packed_amx::available() {
            " (their batched prefill: AMX INT8)"
        } else {
            ""
        };
        let types = if packed::repacks_vnni_types(self) {
            "Q4_0/Q4_1/Q8_0/Q5_0/Q4_K/Q6_K"
        } else {
            "Q4_0/Q4_1/Q8_0"
        };
        match path.name() {
            p if p == k => format!("{k} (repacked {types} included)"),
            p => format!("{p} for repacked {types}{amx}; the other matrices: {k}"),
        }
    }

    /// The `kernels` field of the JSON reports: [`Isa::kernels_with`], then what runs prefill's
    /// attention with activations `q8` or not (`attention_block::label`).
    pub fn kernels_report(self, repacked: bool, q8: bool) -> String {
        format!(
            "{}; {}",
            self.kernels_with(repacked),
            crate::kernels::attention_block::label(self, q8)
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "AVX2",
            Isa::Avx512 => "AVX-512",
        }
    }
}

/// True when the integer path (activation quantized once per matvec with [`Q8Act`]) should be
/// the default for `q` on `isa`: every block type, on every ISA (measured, see module docs).
/// F16/F32 have no integer path.
pub fn int_path_preferred(isa: Isa, q: QuantType) -> bool {
    let _ = isa;
    q.is_blocked()
}

/// Checks the tile contract before any SIMD code touches the slices (one set of asserts per tile
/// call). Returns true when the integer path applies (`xq` given and `q` is a block type).
#[inline]
fn check_tile(t: Tile, x: &[f32], xq: XqRef, y: &[f32]) -> bool {
    let Tile {
        quant: q,
        rows,
        cols,
        scales,
        qs,
    } = t;
    // Block types come in whole 32-weight blocks; F16/F32 tiles may have any width.
    assert!(
        !q.is_blocked() || cols.is_multiple_of(QK),
        "{q} tile cols {cols} not a multiple of 32"
    );
    let nb = cols / QK;
    assert!(y.len() >= rows, "y too short: {} < {rows}", y.len());
    assert!(
        scales.len() >= rows * nb * q.scale_bytes_per_block(),
        "scales too short"
    );
    let qs_bytes = if q.is_blocked() {
        rows * nb * q.quant_bytes_per_block()
    } else {
        q.matrix_bytes(rows, cols)
    };
    assert!(qs.len() >= qs_bytes, "qs too short");
    let int = q.is_blocked() && xq.is_some();
    match xq {
        Some((d, s, xqs)) if int => {
            assert!(
                d.len() >= nb && s.len() >= nb && xqs.len() >= cols,
                "xq too short"
            );
        }
        _ => assert!(x.len() >= cols, "x too short: {} < {cols}", x.len()),
    }
    int
}

/// `y[r] += W_tile[r] · x` for one tile (see module docs). `x.len() == cols`, `y.len() == rows`.
/// `xq`, when given, covers the same `cols` (block `b` of `xq` = columns `32b..32b+32`).
#[inline]
pub fn tile_matvec(isa: Isa, t: Tile, x: &[f32], xq: XqRef, y: &mut [f32]) {
    let Tile {
        quant: q,
        rows,
        cols,
        scales,
        qs,
    } = t;
    if q.is_interleaved() {
        // Q5_0/Q5_1 take `xq`; the K-quants need Q8_K (`kquant::tile_matvec_act`): f32 path here.
        let xq = if q.is_k() { None } else { xq };
        kquant::tile_matvec(isa, Tile::body(q, rows, cols, qs), x, xq, None, y);
        return;
    }
    check_tile(Tile::split(q, rows, cols, scales, qs), x, xq, y);
    #[cfg(target_arch = "x86_64")]
    match isa {
        // `available()` is a cached feature-bit test; it keeps a hand-made `Isa` value sound.
        Isa::Avx512 if isa.available() => {
            // SAFETY: AVX-512 F/BW (+ AVX2/FMA/F16C) detected just above; slice lengths checked
            // by `check_tile`.
            unsafe {
                avx512::tile_matvec(
                    Tile::split(q, rows, cols, scales, qs),
                    x,
                    xq,
                    y,
                    isa.has_vnni(),
                )
            };
            return;
        }
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.available() => {
            // SAFETY: AVX2/FMA/F16C detected just above; slice lengths checked by `check_tile`.
            unsafe { avx2::tile_matvec(Tile::split(q, rows, cols, scales, qs), x, xq, y) };
            return;
        }
        _ => {}
    }
    let _ = isa;
    scalar::tile_matvec(Tile::split(q, rows, cols, scales, qs), x, xq, y)
}

/// Whether [`tile_matvec`] on `isa` would run the AVX2 kernels (the batched kernels are
/// bit-identical to those; AVX-512 has its own batched Q4 kernel and per-token kernels otherwise).
#[cfg(target_arch = "x86_64")]
fn avx2_batch(isa: Isa) -> bool {
    match isa {
        Isa::Avx2 => Isa::Avx2.available(),
        Isa::Avx512 => !Isa::Avx512.available() && Isa::Avx2.available(),
        Isa::Scalar => false,
    }
}

/// Batched [`tile_matvec`] for prefill: for every token `j < n`, `y[j·rows + r] += W_tile[r] ·
/// x_j`, with `x_j = xs[j·cols ..][..cols]`, or its Q8 blocks `xq[j]` when `xq` is given and `q`
/// is a block type (integer path). `xs` may be empty on the integer path.
///
/// With AVX2, Q4_0/Q4_1 on the integer path and every block type on the f32 path use batched
/// kernels that unpack each row group once for all tokens; with AVX-512, Q4_0/Q4_1 on the
/// integer path do (`avx512::tile_matmul_q4`, VNNI when present). They are bit-identical to one
/// [`tile_matvec`] call per token on the same ISA (tested). Every other case (F16/F32, Q8_0
/// integer, scalar, the AVX-512 f32 path) is one `tile_matvec` call per token, which is also
/// the reference of the batched kernels.
pub fn tile_matmul(
    isa: Isa,
    t: Tile,
    xs: &[f32],
    xq: Option<&[XqBlocks]>,
    n: usize,
    y: &mut [f32],
) {
    let Tile {
        quant: q,
        rows,
        cols,
        scales,
        qs,
    } = t;
    assert!(y.len() >= n * rows, "y too short for {n} tokens");
    let int = q.is_blocked() && xq.is_some();
    if let Some(xq) = xq.filter(|_| int) {
        assert_eq!(xq.len(), n, "one Q8 activation per token");
        #[cfg(target_arch = "x86_64")]
        if matches!(q, QuantType::Q4_0 | QuantType::Q4_1) {
            let avx512 = isa == Isa::Avx512 && Isa::Avx512.available();
            if avx512 || avx2_batch(isa) {
                for (j, &x) in xq.iter().enumerate() {
                    check_tile(
                        Tile::split(q, rows, cols, scales, qs),
                        &[],
                        Some(x),
                        &y[j * rows..],
                    );
                }
                if avx512 {
                    // SAFETY: AVX-512 F/BW (+ AVX2/FMA/F16C; VNNI when `has_vnni`) detected just
                    // above; every token's slices were checked against the tile contract by
                    // `check_tile`, and `y` holds `n · rows` outputs.
                    unsafe {
                        avx512::tile_matmul_q4(
                            Tile::split(q, rows, cols, scales, qs),
                            xq,
                            y,
                            isa.has_vnni(),
                        )
                    };
                } else {
                    // SAFETY: AVX2/FMA/F16C detected by `avx2_batch`; every token's slices were
                    // checked against the tile contract by `check_tile`, and `y` holds `n · rows`
                    // outputs.
                    unsafe { avx2::tile_matmul_q4(q, rows, cols, scales, qs, xq, y) };
                }
                return;
            }
        }
        for (j, &x) in xq.iter().enumerate() {
            let yj = &mut y[j * rows..(j + 1) * rows];
            tile_matvec(
                isa,
                Tile::split(q, rows, cols, scales, qs),
                &[],
                Some(x),
                yj,
            );
        }
        return;
    }
    assert!(xs.len() >= n * cols, "xs too short for {n} tokens");
    #[cfg(target_arch = "x86_64")]
    if avx2_batch(isa) && q.is_blocked() {
        for j in 0..n {
            check_tile(
                Tile::split(q, rows, cols, scales, qs),
                &xs[j * cols..],
                None,
                &y[j * rows..],
            );
        }
        // SAFETY: AVX2/FMA/F16C detected by `avx2_batch`; every token's slices were checked
        // against the tile contract by `check_tile`, `xs` holds `n · cols` and `y` `n · rows`.
        unsafe { avx2::tile_matmul_f32(Tile::split(q, rows, cols, scales, qs), xs, n, y) };
        return;
    }
    for j in 0..n {
        let yj = &mut y[j * rows..(j + 1) * rows];
        tile_matvec(
            isa,
            Tile::split(q, rows, cols, scales, qs),
            &xs[j * cols..][..cols],
            None,
            yj,
        );
    }
}

#[cfg(test)]
pub(crate) mod testutil;

/// Whether Q5_0 decode runs its AVX-512 kernel on this CPU (`q5::avx512::q5_0`).
fn q5_0_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return q5::avx512::q5_0_available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::testutil::{random_tile, Rng};
    use super::*;
    #[allow(unused_imports)]
    use crate::kernels::dot::Tile;

    /// `kernels_with` names what runs: unchanged without repacking; with it, the packed
    /// kernels' own dispatch (VNNI only where the CPU has it).
    #[test]
    fn kernels_label_names_the_repacked_kernels() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            assert_eq!(isa.kernels_with(false), isa.kernels());
            let with = isa.kernels_with(true);
            assert!(with.contains("repacked Q4_0/Q4_1/Q8_0"), "{isa:?}: {with}");
            assert_eq!(with.contains("VNNI"), isa.has_vnni(), "{isa:?}: {with}");
            assert_eq!(
                with.contains("repacked Q4_0/Q4_1/Q8_0/Q5_0/Q4_K/Q6_K"),
                packed::repacks_vnni_types(isa),
                "{isa:?}: {with}"
            );
            assert_eq!(
                with.contains("AMX"),
                isa.has_vnni() && packed_amx::available(),
                "{isa:?}: {with}"
            );
        }
        assert_eq!(
            Isa::Scalar.kernels_with(true),
            "scalar (repacked Q4_0/Q4_1/Q8_0 included)"
        );
    }

    /// A 3-tile stripe (256 + 256 + 64 columns, SmolLM2's 576) through `tile_slice` equals the
    /// scalar kernel over the whole row, on every ISA and path.
    #[test]
    fn stripe_via_tile_slice_matches_whole_row() {
        let mut rng = Rng::new(11);
        let (rows, widths) = (37, [256usize, 256, 64]);
        let cols: usize = widths.iter().sum();
        let x: Vec<f32> = (0..cols).map(|_| rng.uniform()).collect();
        let mut xq = Q8Act::default();
        xq.quantize_from(&x);
        for q in [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q8_0] {
            let whole = random_tile(&mut rng, q, rows, cols);
            // Cut the whole matrix into column tiles in the split layout.
            let (sb, qb) = (q.scale_bytes_per_block(), q.quant_bytes_per_block());
            let nb = cols / QK;
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                for int in [false, true] {
                    let xa = int.then(|| (&xq.d[..], &xq.s[..], &xq.qs[..]));
                    let mut want = vec![0f32; rows];
                    scalar::tile_matvec(
                        Tile::split(q, rows, cols, &whole.scales, &whole.qs),
                        &x,
                        xa,
                        &mut want,
                    );
                    let mut got = vec![0f32; rows];
                    let mut c0 = 0;
                    for w in widths {
                        let (b0, tb) = (c0 / QK, w / QK);
                        let (mut sc, mut qs) = (Vec::new(), Vec::new());
                        for r in 0..rows {
                            sc.extend_from_slice(&whole.scales[(r * nb + b0) * sb..][..tb * sb]);
                            qs.extend_from_slice(&whole.qs[(r * nb + b0) * qb..][..tb * qb]);
                        }
                        let xa = int.then(|| xq.tile_slice(c0, w));
                        tile_matvec(
                            isa,
                            Tile::split(q, rows, w, &sc, &qs),
                            &x[c0..c0 + w],
                            xa,
                            &mut got,
                        );
                        c0 += w;
                    }
                    let norm = want.iter().map(|v| v * v).sum::<f32>().sqrt();
                    for (a, b) in want.iter().zip(&got) {
                        assert!((a - b).abs() <= 1e-4 * norm + 1e-6, "{q} {isa:?} int={int}");
                    }
                }
            }
        }
    }
}
