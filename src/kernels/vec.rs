//! Whole-buffer f32 loops that the forward pass runs outside the matvecs: the non-finite check
//! ([`all_finite`]) and the residual add ([`add_into`]). Each has one plain-Rust body, built
//! twice: for baseline x86-64 and with AVX2, picked at run time. The baseline build has no
//! 32-bit integer max (SSE2), so the check took five instructions per four floats. In a 2-thread
//! SmolLM2 prefill, the check and the add were ~3 % of the samples, all on the engine thread
//! while the worker waited. Both builds do the same arithmetic (an integer max, one add per
//! element), so their results are identical (tested).

/// The non-finite test: the largest `|x|` bit pattern is below +Inf's.
#[inline(always)]
fn all_finite_body(v: &[f32]) -> bool {
    v.iter().fold(0u32, |m, x| m.max(x.to_bits() & 0x7fff_ffff)) < 0x7f80_0000
}

#[inline(always)]
fn add_into_body(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += s;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn all_finite(v: &[f32]) -> bool {
        super::all_finite_body(v)
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn add_into(dst: &mut [f32], src: &[f32]) {
        super::add_into_body(dst, src)
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
}

/// Whether every value of `v` is finite (no NaN, no ±Inf).
pub fn all_finite(v: &[f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 was detected just above; the body only reads `v`.
        return unsafe { avx2::all_finite(v) };
    }
    all_finite_body(v)
}

/// `dst[i] += src[i]` over the shorter length.
pub fn add_into(dst: &mut [f32], src: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 was detected just above; the body indexes only through the slices.
        return unsafe { avx2::add_into(dst, src) };
    }
    add_into_body(dst, src)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn both_builds_agree_on_every_length_and_special_value() {
        let mut r = Rng::new(5);
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -0.0,
            1e-45,
        ];
        for n in [0usize, 1, 7, 8, 9, 31, 64, 577, 4096] {
            let base: Vec<f32> = (0..n).map(|_| r.uniform() * 8.0 - 4.0).collect();
            let src: Vec<f32> = (0..n).map(|_| r.uniform() * 8.0 - 4.0).collect();
            let mut a = base.clone();
            let mut b = base.clone();
            add_into(&mut a, &src);
            add_into_body(&mut b, &src);
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
            assert!(all_finite(&base) && all_finite_body(&base));
            for (i, &s) in specials.iter().enumerate() {
                if n == 0 {
                    break;
                }
                let mut v = base.clone();
                v[(i * 131) % n] = s;
                let want = s.is_finite();
                assert_eq!(all_finite(&v), want, "n {n} special {s}");
                assert_eq!(all_finite_body(&v), want, "n {n} special {s}");
            }
        }
    }
}
