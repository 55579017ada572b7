//! The MoE router's logits: every expert's dot product with the router input in one pass.
//!
//! [`logits`] computes each expert's logit with exactly the arithmetic of
//! [`super::attention::dot`] (eight lane sums in chunk order, the lanes added in order, then the
//! tail), so a selection is bit-identical to the one-dot-per-expert reference ([`logits_ref`]);
//! it only interleaves up to eight experts per pass over the input, so their rows stream side by
//! side instead of one 2–8 KiB row after another. A router is E × d f32 (18 KiB per layer on a
//! moefied SmolLM2), read once per token from wherever the previous layers' weights left it.
//! With AVX2 each full group of eight experts runs [`avx2::group`]: the same lane sums, eight
//! at a time in one register, with the multiply and the add apart (not fused), so it is
//! bit-identical too; the last partial group and other CPUs run [`logits_scalar`].

/// Experts per pass over the input in [`logits`].
const GROUP: usize = 8;
/// Lanes of one partial sum (as in [`super::attention::dot`]).
const LANES: usize = 8;

/// `out[e] = r[e·d .. (e+1)·d] · x` for every expert `e` (`d = x.len()`, `out.len()` experts).
pub fn logits(r: &[f32], x: &[f32], out: &mut [f32]) {
    let d = x.len();
    assert_eq!(r.len(), out.len() * d, "router is experts × d");
    #[cfg(target_arch = "x86_64")]
    if super::Isa::Avx2.available() {
        let full = out.len() / GROUP * GROUP;
        let (head, rest) = out.split_at_mut(full);
        for (g, outs) in head.chunks_exact_mut(GROUP).enumerate() {
            let rows = &r[g * GROUP * d..(g + 1) * GROUP * d];
            // SAFETY: AVX2 (with FMA/F16C) was detected just above (a cached test); `rows` is GROUP × d and `outs` GROUP long.
            unsafe { avx2::group(rows, x, outs) };
        }
        return logits_scalar(&r[full * d..], x, rest);
    }
    logits_scalar(r, x, out)
}

/// The scalar [`logits`]: every group of up to eight experts with plain lane arrays.
pub fn logits_scalar(r: &[f32], x: &[f32], out: &mut [f32]) {
    let d = x.len();
    assert_eq!(r.len(), out.len() * d, "router is experts × d");
    let whole = d / LANES * LANES;
    for (g, outs) in out.chunks_mut(GROUP).enumerate() {
        let e0 = g * GROUP;
        let mut acc = [[0f32; LANES]; GROUP];
        for c in (0..whole).step_by(LANES) {
            let xc = &x[c..c + LANES];
            for (k, a) in acc.iter_mut().enumerate().take(outs.len()) {
                let row = &r[(e0 + k) * d + c..(e0 + k) * d + c + LANES];
                for i in 0..LANES {
                    a[i] += row[i] * xc[i];
                }
            }
        }
        for (k, o) in outs.iter_mut().enumerate() {
            let row = &r[(e0 + k) * d..(e0 + k + 1) * d];
            let mut s: f32 = acc[k].iter().sum();
            for (a, b) in row[whole..].iter().zip(&x[whole..]) {
                s += a * b;
            }
            *o = s;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{GROUP, LANES};
    use std::arch::x86_64::*;

    /// One full group: `out[k] = rows[k·d ..][..d] · x` for k < 8, with [`super::logits_scalar`]'s
    /// arithmetic (lane sums of unfused products in chunk order, lanes added in order, then the
    /// tail).
    ///
    /// # Safety
    /// The CPU must support AVX2; `rows.len() == GROUP · x.len()` and `out.len() == GROUP`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn group(rows: &[f32], x: &[f32], out: &mut [f32]) {
        let d = x.len();
        assert!(rows.len() == GROUP * d && out.len() == GROUP);
        let whole = d / LANES * LANES;
        let mut acc = [_mm256_setzero_ps(); GROUP];
        let (rp, xp) = (rows.as_ptr(), x.as_ptr());
        let mut c = 0;
        while c < whole {
            // SAFETY (loads): c + 8 ≤ whole ≤ d, and row k's chunk ends at k·d + c + 8 ≤ 8·d.
            let xc = _mm256_loadu_ps(xp.add(c));
            for (k, a) in acc.iter_mut().enumerate() {
                let w = _mm256_loadu_ps(rp.add(k * d + c));
                *a = _mm256_add_ps(*a, _mm256_mul_ps(w, xc));
            }
            c += LANES;
        }
        for (k, (a, o)) in acc.iter().zip(out.iter_mut()).enumerate() {
            let mut lanes = [0f32; LANES];
            _mm256_storeu_ps(lanes.as_mut_ptr(), *a);
            let mut s: f32 = lanes.iter().sum();
            for (w, v) in rows[k * d + whole..(k + 1) * d].iter().zip(&x[whole..]) {
                s += w * v;
            }
            *o = s;
        }
    }
}

/// The reference [`logits`] must equal bit for bit: one [`super::attention::dot`] per expert.
pub fn logits_ref(r: &[f32], x: &[f32], out: &mut [f32]) {
    let d = x.len();
    for (e, o) in out.iter_mut().enumerate() {
        *o = super::attention::dot(&r[e * d..(e + 1) * d], x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logits_equal_one_dot_per_expert_bit_for_bit() {
        let mut rng = crate::rng::Rng::new(7);
        // Widths with and without a tail; expert counts below, at and above one group.
        for (e, d) in [(1, 8), (3, 13), (8, 576), (9, 100), (16, 2048), (128, 37)] {
            let r: Vec<f32> = (0..e * d).map(|_| rng.uniform()).collect();
            let x: Vec<f32> = (0..d).map(|_| rng.uniform() * 2.0).collect();
            let (mut a, mut b) = (vec![0.0; e], vec![0.0; e]);
            let mut c = vec![0.0; e];
            logits(&r, &x, &mut a);
            logits_ref(&r, &x, &mut b);
            logits_scalar(&r, &x, &mut c);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{e} experts × {d}");
            assert_eq!(bits(&c), bits(&b), "scalar, {e} experts × {d}");
        }
    }
}
