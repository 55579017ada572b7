//! The AVX-512 tile dispatch of the interleaved types' integer paths; the kernels sit in their
//! types' files beside their scalar references.
//!
//! * K-quants (Q4_K, Q5_K, Q6_K · Q8_K; `k4::avx512`, `q6_k::avx512`): 64 weights per 512-bit
//!   step, `vpmaddubsw` + `vpmaddwd` (AVX-512 BW) or `vpdpbusd` (VNNI) per sub-block, then the
//!   sub-block scales; minimums and Q6_K's −32 offset through the activation's `bsums`, as in
//!   the AVX2 kernels. One row at a time, so decode keeps the AVX2 kernels' rows-in-groups for
//!   them (`Isa::for_quant`).
//! * Q5_0 · Q8_0 (`q5::avx512::q5_0`, VNNI + VBMI; in Q5_0's own file, `q5.rs`, beside its
//!   scalar reference), the decode kernel of Q5_0 on such CPUs: rows in
//!   groups of 4, two blocks per 512-bit step. Per row and block pair: one masked 44-byte load;
//!   `vpermb` puts each block's 16 packed bytes in two 16-byte quarters, and a shift by 0 or 4
//!   per 64-bit lane and a mask leave the 64 low 4-bit levels in weight order; the fifth bits
//!   (the blocks' two `qh` words as one 64-bit mask) add 16 under mask; one `vpdpbusd` on the
//!   activation's 64 bytes, started from −16·Σy of each 4-byte group (one more `vpdpbusd` per
//!   pair, shared by the rows), gives `Σ (u − 16)·y`, exact. Then per lane
//!   `acc += dot · (d_w·d_x)`, lanes 0–7 with the first block's scales and 8–15 with the
//!   second's (`vpermw` of the loaded bytes, `vcvtph2ps`), and one horizontal sum per row. It
//!   sums in another order than the AVX2 kernel, within the same bound of the scalar
//!   reference. Gemma 3 270M's Q4_K_M file holds 81 Q5_0 matrices.
//!
//! Q5_1 and every f32 path run the AVX2 kernels. [`tile_matvec`] dispatches to both. Tested
//! against the scalar references (`kquant_scalar`; the tests
//! SKIP on a CPU without AVX-512 F/BW).

use super::Q8KRef;
use super::Tile;
use super::XqRef;
use crate::quant::QuantType;

/// `y[r] += W[r]·x` for one interleaved tile (AVX-512; `vnni` selects `vpdpbusd`).
///
/// # Safety
/// The CPU must support AVX-512 F and BW plus AVX2, FMA and F16C (and AVX512-VNNI when `vnni`),
/// and the slices must satisfy the contract checked by `kquant::tile_matvec`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub unsafe fn tile_matvec(
    t: Tile,
    x: &[f32],
    xq: XqRef,
    xk: Option<Q8KRef>,
    y: &mut [f32],
    vnni: bool,
) {
    let Tile {
        quant: q,
        rows,
        cols,
        qs,
        ..
    } = t;
    if let (QuantType::Q5_0, Some(xq), true) = (q, xq, vnni && super::q5::avx512::q5_0_available())
    {
        // SAFETY: AVX-512 F/BW/VNNI/VBMI detected (`q5_0_available`); `qs` holds `rows` rows
        // of `cols / 32` blocks and `xq` covers `cols` (checked by `kquant::tile_matvec`).
        return super::q5::avx512::q5_0(rows, cols, qs, xq, y);
    }
    let Some(k) = xk.filter(|_| q.is_k()) else {
        // SAFETY: AVX2/FMA/F16C are part of the caller's guarantee.
        return super::kquant_avx2::tile_matvec(t, x, xq, xk, y);
    };
    let rb = q.matrix_bytes(1, cols);
    for (r, yr) in y.iter_mut().enumerate().take(rows) {
        let row = &qs[r * rb..(r + 1) * rb];
        *yr += match (q, vnni) {
            (QuantType::Q6_K, true) => super::q6_k::avx512::vnni::q6k(row, k),
            (QuantType::Q6_K, false) => super::q6_k::avx512::bw::q6k(row, k),
            (_, true) => super::k4::avx512::vnni::k4(q == QuantType::Q5_K, row, k),
            (_, false) => super::k4::avx512::bw::k4(q == QuantType::Q5_K, row, k),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{check_kernel, INTERLEAVED};
    use super::super::Isa;

    #[test]
    fn avx512_matches_scalar_reference() {
        if !Isa::Avx512.available() {
            println!("SKIP: this CPU lacks AVX-512 F/BW (the AVX-512 K-quant kernels did not run)");
            return;
        }
        for vnni in [false, true] {
            if vnni && !Isa::Avx512.has_vnni() {
                println!("SKIP: this CPU lacks AVX512-VNNI (the vpdpbusd variant did not run)");
                continue;
            }
            check_kernel(
                // SAFETY: features detected above; `check_one` builds valid tiles.
                &|t, x, xq, xk, y| unsafe { super::tile_matvec(t, x, xq, xk, y, vnni) },
                &INTERLEAVED,
                29,
            );
        }
    }
}
