//! One kernel per matrix, chosen once, as llama.cpp's `type_traits_cpu[type].vec_dot`: the table
//! of what runs a matrix's tiles ([`MatKernel`]) and the choice of its entry ([`select`]) from
//! the matrix's quant type, its layout (repacked or not) and the ISA asked for. The engine binds
//! every matrix's `format::Matrix::kernel` when it opens the model ([`bind`]); the matvec
//! drivers (`kernels::matvec`) then call the entry's `matvec` (decode: one tile, one token) or
//! `matmul` (prefill: one tile, a batch of tokens), with no type, ISA or CPU-feature test per
//! tile.
//!
//! [`select`] makes every decision the per-tile dispatch made, the same way:
//! * split layout (Q4_0, Q4_1, Q8_0, F16, F32): the best of AVX-512 (VNNI when present), AVX2
//!   and scalar up to the ISA asked for (`dot::tile_matvec`); prefill batches Q4_0/Q4_1 on the
//!   integer path on AVX2 and AVX-512, and every block type on the f32 path on AVX2 only
//!   (`dot::tile_matmul`); the rest runs one decode call per token;
//! * Q5_0, Q5_1 and the K-quants in the file's layout: decode on the ISA [`Isa::for_quant`]
//!   maps to (`kquant::tile_matvec`), prefill's batched integer kernels on the ISA asked for:
//!   the VNNI build of `kquant_batch` where AVX-512 VL + VNNI are present (with AMX when
//!   `packed_amx::available`), else its AVX2 build (`kquant::tile_matmul`);
//! * repacked tiles (`quant::packed`): the path [`packed::path`] picks for the ISA asked for.
//!
//! A matrix without a bound kernel (built by hand in a test or a tool), or bound for another ISA
//! than the call asks, is selected at call time ([`kernel`]: one lookup per stripe). The explicit
//! per-ISA entry points (`dot::tile_matvec`, `kquant::tile_matvec_act`, `packed::tile_run`, …)
//! stay for the kernel tests and benches, which run every ISA on one tile.

use super::kquant::{self, BatchAct};
use super::packed::{self, Kernel, Path};
use super::split::scalar;
#[cfg(target_arch = "x86_64")]
use super::split::{avx2, avx512};
use super::{check_tile, kquant_scalar, Isa, Q8Act, Q8KRef, Tile, XqBlocks, XqRef};
#[cfg(target_arch = "x86_64")]
use super::{kquant_avx2, kquant_avx512, kquant_batch};
use crate::format::reader::{KernelId, Matrix};
use crate::format::CflowFile;
use crate::quant::{QuantType, QK};

/// One tile for one token (decode): `y[r] += W_tile[r] · x`, with `x` the tile's columns of the
/// f32 activation and `act` the whole quantized activation (the tile covers its columns `c0..`;
/// each kernel takes the form its type reads), or none (f32 path).
pub type TileMatvec = fn(Tile, &[f32], Option<&Q8Act>, usize, &mut [f32]);

/// One tile for tokens `b0..b1` of a batch (prefill): `acc[j·rows + r] += W_tile[r] · x_{b0+j}`.
/// Bit-identical to one [`TileMatvec`] call per token, except where `kquant_batch` says.
pub type TileMatmul = for<'a> fn(Tile<'a>, &Batch<'a>, &mut Bufs<'a>, &mut [f32]);

/// An entry of the table: what runs a matrix's tiles.
pub struct MatKernel {
    /// What runs, in words (tests, debugging).
    pub name: &'static str,
    /// The types it runs, and whether in the repacked layout (checked by the tests).
    pub quants: &'static [QuantType],
    pub packed: bool,
    pub matvec: TileMatvec,
    pub matmul: TileMatmul,
}

/// The activations of a batched tile call ([`TileMatmul`]): tokens `b0..b1` of a batch, for the
/// tile whose first column is `c0`.
#[derive(Clone, Copy)]
pub struct Batch<'a> {
    /// Every token's f32 activation, `cols` (the matrix's width) values each.
    pub xs: &'a [f32],
    pub cols: usize,
    /// Every token's quantized activation (integer path), or none (f32 path).
    pub q8: Option<&'a [Q8Act]>,
    pub b0: usize,
    pub b1: usize,
    pub c0: usize,
}

impl<'a> Batch<'a> {
    /// Token `b`'s f32 activation over the tile's `cols` columns.
    fn x(&self, b: usize, cols: usize) -> &'a [f32] {
        &self.xs[b * self.cols + self.c0..b * self.cols + self.c0 + cols]
    }
}

/// Scratch of the batched calls of one task, reused from tile to tile: the tokens' activation
/// blocks over one tile's columns.
#[derive(Default)]
pub struct Bufs<'a> {
    xq: Vec<XqBlocks<'a>>,
    xk: Vec<Q8KRef<'a>>,
}

/// Where a kernel runs. Decode: [`SCALAR`], [`AVX2`], [`AVX512`] (F + BW) or [`VNNI`] (AVX-512
/// with `vpdpbusd`); the batched kernels of Q5_0/Q5_1 and the K-quants also [`AMX`] (the VNNI
/// build, with AMX INT8 from 8 tokens).
const SCALAR: u8 = 0;
const AVX2: u8 = 1;
const AVX512: u8 = 2;
const VNNI: u8 = 3;
const AMX: u8 = 4;

/// The split layout's decode: the tile contract, then the kernel of level `L`.
fn split_run<const L: u8>(t: Tile, x: &[f32], xq: XqRef, y: &mut [f32]) {
    check_tile(t, x, xq, y);
    #[cfg(target_arch = "x86_64")]
    match L {
        // SAFETY: an entry of level AVX2 is selected only where AVX2/FMA/F16C were detected
        // (`level`); slice lengths checked by `check_tile`.
        AVX2 => return unsafe { avx2::tile_matvec(t, x, xq, y) },
        // SAFETY: levels AVX512 and VNNI are selected only where AVX-512 F/BW (+ AVX2/FMA/F16C;
        // VNNI for VNNI) were detected (`level`); slice lengths checked by `check_tile`.
        AVX512 | VNNI => return unsafe { avx512::tile_matvec(t, x, xq, y, L == VNNI) },
        _ => {}
    }
    scalar::tile_matvec(t, x, xq, y)
}

/// [`TileMatvec`] of the split layout: block types take the Q8 blocks of their columns.
fn split<const L: u8>(t: Tile, x: &[f32], act: Option<&Q8Act>, c0: usize, y: &mut [f32]) {
    let xq = act
        .filter(|_| t.quant.is_blocked())
        .map(|a| a.tile_slice(c0, t.cols));
    split_run::<L>(t, x, xq, y)
}

/// [`TileMatmul`] of the split layout. `Q4`: Q4_0/Q4_1, whose integer path has batched kernels
/// on AVX2 and AVX-512; every block type's f32 path has one on AVX2.
fn split_matmul<'a, const L: u8, const Q4: bool>(
    t: Tile<'a>,
    b: &Batch<'a>,
    bufs: &mut Bufs<'a>,
    acc: &mut [f32],
) {
    let (rows, cols, nt) = (t.rows, t.cols, b.b1 - b.b0);
    assert!(acc.len() >= nt * rows, "y too short for {nt} tokens");
    if let Some(q) = b.q8.filter(|_| t.quant.is_blocked()) {
        let (c0, c1) = (b.c0, b.c0 + cols);
        let (k0, k1) = (c0 / QK, c1 / QK);
        let xq = &mut bufs.xq;
        xq.clear();
        xq.extend(
            q[b.b0..b.b1]
                .iter()
                .map(|a| (&a.d[k0..k1], &a.s[k0..k1], &a.qs[c0..c1])),
        );
        #[cfg(target_arch = "x86_64")]
        if Q4 && L != SCALAR {
            for (j, &x) in xq.iter().enumerate() {
                check_tile(t, &[], Some(x), &acc[j * rows..]);
            }
            if L == AVX2 {
                // SAFETY: level AVX2: AVX2/FMA/F16C detected (`level`); every token's slices
                // were checked against the tile contract by `check_tile`, and `acc` holds
                // `nt · rows` outputs.
                unsafe {
                    avx2::tile_matmul_q4(t.quant, rows, cols, t.scales, t.qs, xq, acc);
                }
            } else {
                // SAFETY: levels AVX512/VNNI: AVX-512 F/BW (+ AVX2/FMA/F16C; VNNI for VNNI)
                // detected (`level`); slices checked by `check_tile`, `acc` holds `nt · rows`.
                unsafe { avx512::tile_matmul_q4(t, xq, acc, L == VNNI) };
            }
            return;
        }
        for (j, &x) in xq.iter().enumerate() {
            split_run::<L>(t, &[], Some(x), &mut acc[j * rows..(j + 1) * rows]);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if L == AVX2 && t.quant.is_blocked() {
        // The f32 activations of this tile's columns, token-major.
        let xt: Vec<f32> = (b.b0..b.b1).flat_map(|i| b.x(i, cols)).copied().collect();
        for j in 0..nt {
            check_tile(t, &xt[j * cols..], None, &acc[j * rows..]);
        }
        // SAFETY: level AVX2: AVX2/FMA/F16C detected (`level`); every token's slices were
        // checked against the tile contract by `check_tile`, `xt` holds `nt · cols` and `acc`
        // `nt · rows`.
        unsafe { avx2::tile_matmul_f32(t, &xt, nt, acc) };
        return;
    }
    per_token(split::<L>, t, b, acc)
}

/// One decode call per token of `b`.
fn per_token(k: TileMatvec, t: Tile, b: &Batch, acc: &mut [f32]) {
    for i in b.b0..b.b1 {
        let j = i - b.b0;
        let y = &mut acc[j * t.rows..(j + 1) * t.rows];
        k(t, b.x(i, t.cols), b.q8.map(|q| &q[i]), b.c0, y);
    }
}

/// Decode of Q5_0/Q5_1 and the K-quants in the file's layout: the tile contract, then the
/// kernel of level `D` (never AVX512 without VNNI: `Isa::for_quant` keeps AVX-512 only for
/// Q5_0 where its VNNI + VBMI kernel runs).
fn gguf_run<const D: u8>(t: Tile, x: &[f32], xq: XqRef, xk: Option<Q8KRef>, y: &mut [f32]) {
    let t = Tile::body(t.quant, t.rows, t.cols, t.qs);
    let (int8, intk) = kquant::check(t, x, xq, xk, y);
    let xq = if int8 { xq } else { None };
    let xk = if intk { xk } else { None };
    #[cfg(target_arch = "x86_64")]
    match D {
        // SAFETY: level AVX2: AVX2/FMA/F16C detected (`level`); slice lengths checked by
        // `kquant::check`.
        AVX2 => return unsafe { kquant_avx2::tile_matvec(t, x, xq, xk, y) },
        // SAFETY: level VNNI: AVX-512 F/BW/VNNI (+ AVX2/FMA/F16C) detected (`level`); slice
        // lengths checked by `kquant::check`.
        AVX512 | VNNI => return unsafe { kquant_avx512::tile_matvec(t, x, xq, xk, y, D == VNNI) },
        _ => {}
    }
    kquant_scalar::tile_matvec(t, x, xq, xk, y)
}

/// [`TileMatvec`] of Q5_0/Q5_1 (their integer path takes the Q8 blocks).
fn q5<const D: u8>(t: Tile, x: &[f32], act: Option<&Q8Act>, c0: usize, y: &mut [f32]) {
    gguf_run::<D>(t, x, act.map(|a| a.tile_slice(c0, t.cols)), None, y)
}

/// [`TileMatvec`] of the K-quants (their integer path takes the Q8_K blocks, when quantized).
fn kq<const D: u8>(t: Tile, x: &[f32], act: Option<&Q8Act>, c0: usize, y: &mut [f32]) {
    gguf_run::<D>(t, x, None, act.and_then(|a| a.k.slice(c0, t.cols)), y)
}

/// [`TileMatmul`] of Q5_0/Q5_1 (`K` false) and the K-quants (`K`): the batched integer kernels
/// of level `B` when every token has its activation in the type's form, else decode (`D`) once
/// per token.
fn gguf_matmul<'a, const D: u8, const B: u8, const K: bool>(
    t: Tile<'a>,
    b: &Batch<'a>,
    bufs: &mut Bufs<'a>,
    acc: &mut [f32],
) {
    let t = Tile::body(t.quant, t.rows, t.cols, t.qs);
    let nt = b.b1 - b.b0;
    if let Some(q) = b.q8 {
        let (c0, c1) = (b.c0, b.c0 + t.cols);
        let acts = if K {
            bufs.xk.clear();
            bufs.xk
                .extend(q[b.b0..b.b1].iter().map_while(|a| a.k.slice(c0, t.cols)));
            (bufs.xk.len() == nt).then_some(BatchAct::K(&bufs.xk))
        } else {
            let (k0, k1) = (c0 / QK, c1 / QK);
            bufs.xq.clear();
            bufs.xq.extend(
                q[b.b0..b.b1]
                    .iter()
                    .map(|a| (&a.d[k0..k1], &a.s[k0..k1], &a.qs[c0..c1])),
            );
            Some(BatchAct::Q8(&bufs.xq))
        };
        if let Some(acts) = acts {
            return gguf_batch::<B>(t, acts, acc);
        }
    }
    let mv: TileMatvec = if K { kq::<D> } else { q5::<D> };
    per_token(mv, t, b, acc)
}

/// The batched integer kernels of Q5_0/Q5_1 and the K-quants at level `B` (`kquant_batch`; on
/// SCALAR one scalar call per token).
fn gguf_batch<const B: u8>(t: Tile, acts: BatchAct, y: &mut [f32]) {
    kquant::check_batch(t, acts, y);
    let Tile {
        quant: q,
        rows,
        cols,
        qs,
        ..
    } = t;
    #[cfg(target_arch = "x86_64")]
    match B {
        // SAFETY: levels VNNI/AMX: AVX-512 F/BW/VL/VNNI (+ AVX2/FMA/F16C) detected
        // (`kquant::batch_vnni`), AMX detected and permitted for AMX (`packed_amx::available`);
        // the activation form matches `q`, every token's slices passed `check_batch`, and `y`
        // holds `n · rows` outputs.
        VNNI | AMX => {
            return unsafe { kquant_batch::vnni::tile_matmul(q, rows, cols, qs, acts, y, B == AMX) }
        }
        // SAFETY: level AVX2: AVX2/FMA/F16C detected; form, slices and `y` checked above.
        AVX2 => {
            return unsafe { kquant_batch::avx2::tile_matmul(q, rows, cols, qs, acts, y, false) }
        }
        _ => {}
    }
    for j in 0..acts.len() {
        let (xq, xk) = acts.token(j);
        kquant_scalar::tile_matvec(t, &[], xq, xk, &mut y[j * rows..(j + 1) * rows]);
    }
}

/// The repacked kernels of path `P` (0: VNNI, 1: AVX2, 2: scalar).
const fn packed_kernel<const P: u8>() -> Kernel {
    Kernel::of_path(match P {
        0 => Path::Vnni,
        1 => Path::Avx2,
        _ => Path::Scalar,
    })
}

/// [`TileMatvec`] of a repacked tile: Q4_K/Q6_K records (`K`) take the Q8_K blocks, the others
/// the Q8 blocks.
fn packed_mv<const P: u8, const K: bool>(
    t: Tile,
    x: &[f32],
    act: Option<&Q8Act>,
    c0: usize,
    y: &mut [f32],
) {
    let k = packed_kernel::<P>();
    if K {
        packed::tile_run_k(k, t, x, act.and_then(|a| a.k.slice(c0, t.cols)), y);
    } else {
        packed::tile_run(k, t, x, act.map(|a| a.tile_slice(c0, t.cols)), y);
    }
}

/// [`TileMatmul`] of a repacked tile: the batched kernels, which unpack each record once for
/// several tokens (bit-identical to one call per token), when every token has its integer
/// activation; else one token at a time.
fn packed_mm<'a, const P: u8, const K: bool>(
    t: Tile<'a>,
    b: &Batch<'a>,
    bufs: &mut Bufs<'a>,
    acc: &mut [f32],
) {
    let k = packed_kernel::<P>();
    if let Some(q) = b.q8 {
        let (c0, nt) = (b.c0, b.b1 - b.b0);
        if K {
            bufs.xk.clear();
            bufs.xk
                .extend(q[b.b0..b.b1].iter().map_while(|a| a.k.slice(c0, t.cols)));
            if bufs.xk.len() == nt {
                return packed::tile_run_k_batch(k, t, &bufs.xk, acc);
            }
        } else {
            bufs.xq.clear();
            bufs.xq
                .extend(q[b.b0..b.b1].iter().map(|a| a.tile_slice(c0, t.cols)));
            return packed::tile_run_batch(k, t, &bufs.xq, acc);
        }
    }
    per_token(packed_mv::<P, K>, t, b, acc)
}

const Q4: &[QuantType] = &[QuantType::Q4_0, QuantType::Q4_1];
const Q8_FLOAT: &[QuantType] = &[QuantType::Q8_0, QuantType::F16, QuantType::F32];
const Q5: &[QuantType] = &[QuantType::Q5_0, QuantType::Q5_1];
const KQ: &[QuantType] = &[QuantType::Q4_K, QuantType::Q5_K, QuantType::Q6_K];
const PACKED_Q8: &[QuantType] = &[
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q8_0,
    QuantType::Q5_0,
];
const PACKED_K: &[QuantType] = &[QuantType::Q4_K, QuantType::Q6_K];

/// A split-layout entry of level `$l` (`$q4`: Q4_0/Q4_1's batched kernels).
macro_rules! split {
    ($name:literal, $quants:expr, $l:expr, $q4:literal) => {
        MatKernel {
            name: $name,
            quants: $quants,
            packed: false,
            matvec: split::<$l>,
            matmul: split_matmul::<$l, $q4>,
        }
    };
}

/// An entry of Q5_0/Q5_1 (`$k` false) or the K-quants in the file's layout: decode at level
/// `$d`, prefill's batches at `$b`.
macro_rules! gguf {
    ($name:literal, $quants:expr, $d:expr, $b:expr, $k:literal) => {
        MatKernel {
            name: $name,
            quants: $quants,
            packed: false,
            matvec: if $k { kq::<$d> } else { q5::<$d> },
            matmul: gguf_matmul::<$d, $b, $k>,
        }
    };
}

/// A repacked entry of path `$p` (see [`packed_kernel`]); `$k`: the Q8_K records.
macro_rules! repacked {
    ($name:literal, $quants:expr, $p:literal, $k:literal) => {
        MatKernel {
            name: $name,
            quants: $quants,
            packed: true,
            matvec: packed_mv::<$p, $k>,
            matmul: packed_mm::<$p, $k>,
        }
    };
}

/// Index of the first split-layout entry of level `l`: Q4_0/Q4_1, then Q8_0/F16/F32.
const fn split_at(l: u8) -> usize {
    2 * l as usize
}
/// First Q5_0/Q5_1 entry, first K-quant entry, first repacked entry.
const Q5_AT: usize = 8;
const K_AT: usize = 15;
const PACKED_AT: usize = 19;

/// The kernels. Order: see [`split_at`], [`Q5_AT`], [`K_AT`], [`PACKED_AT`] ([`index`]).
#[rustfmt::skip]
static TABLE: [MatKernel; 25] = [
    // The split layout, by level.
    split!("Q4_0/Q4_1 scalar", Q4, SCALAR, true),
    split!("Q8_0/F16/F32 scalar", Q8_FLOAT, SCALAR, false),
    split!("Q4_0/Q4_1 AVX2", Q4, AVX2, true),
    split!("Q8_0/F16/F32 AVX2", Q8_FLOAT, AVX2, false),
    split!("Q4_0/Q4_1 AVX-512", Q4, AVX512, true),
    split!("Q8_0/F16/F32 AVX-512", Q8_FLOAT, AVX512, false),
    split!("Q4_0/Q4_1 AVX-512 VNNI", Q4, VNNI, true),
    split!("Q8_0/F16/F32 AVX-512 VNNI", Q8_FLOAT, VNNI, false),
    // Q5_0/Q5_1 in the file's layout, by (decode, prefill) level.
    gguf!("Q5_0/Q5_1 scalar", Q5, SCALAR, SCALAR, false),
    gguf!("Q5_0/Q5_1 AVX2", Q5, AVX2, AVX2, false),
    gguf!("Q5_0/Q5_1 AVX2, prefill AVX-512 VNNI", Q5, AVX2, VNNI, false),
    gguf!("Q5_0/Q5_1 AVX2, prefill AVX-512 VNNI + AMX", Q5, AVX2, AMX, false),
    gguf!("Q5_0 AVX-512 VNNI", Q5, VNNI, VNNI, false),
    gguf!("Q5_0 AVX-512 VNNI, prefill + AMX", Q5, VNNI, AMX, false),
    gguf!("Q5_0 AVX-512 VNNI, prefill AVX2", Q5, VNNI, AVX2, false),
    // The K-quants in the file's layout, by (decode, prefill) level.
    gguf!("Q4_K/Q5_K/Q6_K scalar", KQ, SCALAR, SCALAR, true),
    gguf!("Q4_K/Q5_K/Q6_K AVX2", KQ, AVX2, AVX2, true),
    gguf!("Q4_K/Q5_K/Q6_K AVX2, prefill AVX-512 VNNI", KQ, AVX2, VNNI, true),
    gguf!("Q4_K/Q5_K/Q6_K AVX2, prefill AVX-512 VNNI + AMX", KQ, AVX2, AMX, true),
    // Repacked tiles, by path.
    repacked!("repacked Q4_0/Q4_1/Q8_0/Q5_0 AVX-512 VNNI", PACKED_Q8, 0, false),
    repacked!("repacked Q4_0/Q4_1/Q8_0/Q5_0 AVX2", PACKED_Q8, 1, false),
    repacked!("repacked Q4_0/Q4_1/Q8_0/Q5_0 scalar", PACKED_Q8, 2, false),
    repacked!("repacked Q4_K/Q6_K AVX-512 VNNI", PACKED_K, 0, true),
    repacked!("repacked Q4_K/Q6_K AVX2", PACKED_K, 1, true),
    repacked!("repacked Q4_K/Q6_K scalar", PACKED_K, 2, true),
];

/// The decode level `dot::tile_matvec` and `kquant::tile_matvec` run on `isa`: the one asked
/// for if this CPU has it, else the next lower one.
fn level(isa: Isa) -> u8 {
    match isa {
        Isa::Avx512 if isa.available() => {
            if isa.has_vnni() {
                VNNI
            } else {
                AVX512
            }
        }
        Isa::Avx2 | Isa::Avx512 if Isa::Avx2.available() => AVX2,
        _ => SCALAR,
    }
}

/// The level of `kquant::tile_matmul` on `isa`: the VNNI build where AVX-512 VL + VNNI are
/// present (AMX when also `packed_amx::available`), else AVX2 unless scalar, else scalar.
fn gguf_batch_level(isa: Isa) -> u8 {
    #[cfg(target_arch = "x86_64")]
    {
        if kquant::batch_vnni(isa) {
            return if super::packed_amx::available() {
                AMX
            } else {
                VNNI
            };
        }
        if isa != Isa::Scalar && Isa::Avx2.available() {
            return AVX2;
        }
    }
    SCALAR
}

/// The table index for a matrix of type `q`, repacked or not, on `isa` (module docs).
fn index(q: QuantType, packed: bool, isa: Isa) -> usize {
    if packed {
        let at = PACKED_AT + if q.is_k() { 3 } else { 0 };
        return at
            + match packed::path(isa) {
                Path::Vnni => 0,
                Path::Avx2 => 1,
                Path::Scalar => 2,
            };
    }
    if q.is_interleaved() {
        // Decode on the ISA `for_quant` maps to; prefill's batches on the one asked for. A
        // batched level above scalar needs AVX2, which then runs decode too (or Q5_0's VNNI).
        let (d, b) = (level(isa.for_quant(q)), gguf_batch_level(isa));
        let at = if q.is_k() { K_AT } else { Q5_AT };
        return at
            + match (d, b) {
                (SCALAR, _) => 0,
                (AVX2, AVX2) => 1,
                (AVX2, VNNI) => 2,
                (AVX2, AMX) => 3,
                (VNNI, VNNI) if !q.is_k() => 4,
                (VNNI, AMX) if !q.is_k() => 5,
                (VNNI, AVX2) if !q.is_k() => 6,
                _ => unreachable!("{q}: decode level {d} with prefill level {b}"),
            };
    }
    let q4 = matches!(q, QuantType::Q4_0 | QuantType::Q4_1);
    split_at(level(isa)) + !q4 as usize
}

/// The ISA a [`KernelId`] was chosen for, in its high byte (`UNSET`'s 0xFF matches none).
fn isa_tag(isa: Isa) -> u16 {
    match isa {
        Isa::Scalar => 0,
        Isa::Avx2 => 1,
        Isa::Avx512 => 2,
    }
}

/// The kernel of a matrix of type `q`, repacked or not, when the engine asks for `isa`. The
/// choice for every ISA, type and layout is made once per process (the CPU's features do not
/// change), so a matrix without a bound kernel costs one lookup per stripe.
pub fn select(q: QuantType, packed: bool, isa: Isa) -> KernelId {
    static CHOSEN: std::sync::OnceLock<[KernelId; SLOTS]> = std::sync::OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| {
        let mut t = [KernelId::UNSET; SLOTS];
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            for q in QuantType::ALL {
                for packed in [false, true] {
                    t[slot(q, packed, isa)] =
                        KernelId((isa_tag(isa) << 8) | index(q, packed, isa) as u16);
                }
            }
        }
        t
    });
    chosen[slot(q, packed, isa)]
}

/// Slots of [`select`]'s choices: 3 ISAs × 16 type ids × 2 layouts.
const SLOTS: usize = 3 * 16 * 2;

/// The slot of `(q, packed, isa)` among [`SLOTS`].
fn slot(q: QuantType, packed: bool, isa: Isa) -> usize {
    (isa_tag(isa) as usize * 16 + q as usize) * 2 + packed as usize
}

/// The entry of `id` (made by [`select`]).
pub fn entry(id: KernelId) -> &'static MatKernel {
    &TABLE[(id.0 & 0xFF) as usize]
}

/// What runs `m`'s tiles on `isa`: its bound kernel, or (not bound, or bound for another ISA)
/// the one [`select`] picks now.
#[inline]
pub fn kernel(m: &Matrix, isa: Isa) -> &'static MatKernel {
    let id = if m.kernel.0 >> 8 == isa_tag(isa) {
        m.kernel
    } else {
        select(m.quant, m.packed, isa)
    };
    debug_assert_eq!(id, select(m.quant, m.packed, isa), "{m:?}: stale kernel");
    entry(id)
}

/// Binds every matrix of `f` to its kernel on `isa` ([`select`]): when the engine opens a model,
/// after its resident copy was made (and repacked).
pub fn bind(f: &mut CflowFile, isa: Isa) {
    f.bind_kernels(|m| select(m.quant, m.packed, isa));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every type, in either layout it can be in, on every ISA, selects an entry that runs it.
    #[test]
    fn every_selection_runs_its_type() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            for q in QuantType::ALL {
                for packed in [false, true] {
                    if packed && !PACKED_Q8.contains(&q) && !PACKED_K.contains(&q) {
                        continue;
                    }
                    let k = entry(select(q, packed, isa));
                    assert!(k.quants.contains(&q), "{q} {isa:?}: {}", k.name);
                    assert_eq!(k.packed, packed, "{q} {isa:?}: {}", k.name);
                }
            }
        }
    }

    /// A matrix bound for one ISA and asked for another gets the other's kernel.
    #[test]
    fn a_kernel_bound_for_another_isa_is_chosen_again() {
        let mut m = Matrix {
            kind: crate::format::EntryKind::Down,
            quant: QuantType::Q4_0,
            rows: 1,
            cols: 32,
            stripes: vec![0],
            packed: false,
            kernel: KernelId::UNSET,
        };
        m.kernel = select(m.quant, false, Isa::Scalar);
        assert_eq!(kernel(&m, Isa::Scalar).name, "Q4_0/Q4_1 scalar");
        let want = entry(select(m.quant, false, Isa::Avx2)).name;
        assert_eq!(kernel(&m, Isa::Avx2).name, want);
    }
}
