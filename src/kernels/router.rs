//! The MoE router's logits: every expert's dot product with the router input in one pass, and a
//! cache hint that brings a router's weights in ahead of use.
//!
//! [`logits`] computes each expert's logit with exactly the arithmetic of
//! [`super::attention::dot`] (eight lane sums in chunk order, the lanes added in order, then the
//! tail), so a selection is bit-identical to the one-dot-per-expert reference ([`logits_ref`]);
//! it only interleaves up to eight experts per pass over the input, so their rows stream side by
//! side instead of one 2–8 KiB row after another. A router is E × d f32 (18 KiB per layer on a
//! moefied SmolLM2), read once per token from wherever the previous layers' weights left it.

/// Experts per pass over the input in [`logits`].
const GROUP: usize = 8;
/// Lanes of one partial sum (as in [`super::attention::dot`]).
const LANES: usize = 8;

/// `out[e] = r[e·d .. (e+1)·d] · x` for every expert `e` (`d = x.len()`, `out.len()` experts).
pub fn logits(r: &[f32], x: &[f32], out: &mut [f32]) {
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

/// The reference [`logits`] must equal bit for bit: one [`super::attention::dot`] per expert.
pub fn logits_ref(r: &[f32], x: &[f32], out: &mut [f32]) {
    let d = x.len();
    for (e, o) in out.iter_mut().enumerate() {
        *o = super::attention::dot(&r[e * d..(e + 1) * d], x);
    }
}

/// Asks the CPU to bring `w` towards the core (into L2) without waiting: issued a layer before
/// a router is used, its rows come from cache rather than DRAM.
pub fn prefetch(w: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in w.chunks(16) {
        // SAFETY: PREFETCHT1 is a hint that never faults; SSE is part of the x86_64 baseline;
        // the address is inside the live slice `w`.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                line.as_ptr() as *const i8
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = w;
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
            logits(&r, &x, &mut a);
            logits_ref(&r, &x, &mut b);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{e} experts × {d}");
        }
    }

    #[test]
    fn prefetch_of_any_slice_is_harmless() {
        prefetch(&[]);
        prefetch(&[1.0; 33]);
    }
}
