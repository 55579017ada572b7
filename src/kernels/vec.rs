//! Whole-buffer f32 loops that the forward pass and greedy sampling run outside the matvecs:
//! the non-finite check ([`all_finite`]), the residual adds ([`add_into`], [`add_scaled`]),
//! RMSNorm ([`rmsnorm`], [`rmsnorm_in_place`]; the one home of its formula) and the greedy
//! token ([`argmax`]). Each has one plain-Rust body, built twice:
//! for baseline x86-64 and with AVX2, picked at run time. The baseline build has no 32-bit
//! integer max (SSE2) and 4-wide vectors: in a 2-thread SmolLM2 prefill, the check and the add
//! were ~3 % of the samples, all on the engine thread while the worker waited. Both builds do
//! the same operations in the same order (no fused multiply-add: Rust does not contract), so
//! their results are identical (tested).

/// The non-finite test: the largest `|x|` bit pattern is below +Inf's.
#[inline(always)]
fn all_finite_body(v: &[f32]) -> bool {
    v.iter().fold(0u32, |m, x| m.max(x.to_bits() & 0x7fff_ffff)) < 0x7f80_0000
}

/// [`argmax`]'s rule in two passes that vectorize: the largest value in 16 lanes of
/// compare-and-select, then the first index holding it, 16 at a time (every lane compared).
/// The scalar scan it replaces took ~0.3 ms of a Gemma 3 token (262,144 logits, 1 thread,
/// `perf record -e cpu-clock`), 3 % of it, on the engine thread while the others wait.
#[inline(always)]
fn argmax_body(l: &[f32]) -> usize {
    const W: usize = 16;
    if l.first().is_none_or(|v| v.is_nan()) {
        return 0;
    }
    let mut lanes = [f32::NEG_INFINITY; W];
    let chunks = l.chunks_exact(W);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let top = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    for (i, c) in l.chunks(W).enumerate() {
        if c.iter().fold(false, |hit, &v| hit | (v == top)) {
            return i * W + c.iter().position(|&v| v == top).unwrap_or(0);
        }
    }
    0
}

#[inline(always)]
fn add_into_body(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += s;
    }
}

#[inline(always)]
fn add_scaled_body(dst: &mut [f32], src: &[f32], k: f32) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += k * s;
    }
}

/// `1 / sqrt(mean(x²) + eps)`, the scale of an RMSNorm. The squares are summed in 8 interleaved
/// partial sums (element i into sum i mod 8), added pairwise at the end: one chain of 576
/// dependent adds took ~0.65 µs per norm on SmolLM2, twice per layer on the decode critical
/// path while the other threads wait.
#[inline(always)]
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i] * c[i];
        }
    }
    for (a, v) in acc.iter_mut().zip(tail) {
        *a += v * v;
    }
    let s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    1.0 / (s / x.len() as f32 + eps).sqrt()
}

#[inline(always)]
fn rmsnorm_body(out: &mut [f32], x: &[f32], w: Option<&[f32]>, eps: f32) {
    let inv = rms_scale(x, eps);
    match w {
        Some(w) => {
            for ((o, xv), wv) in out.iter_mut().zip(x).zip(w) {
                *o = xv * inv * wv;
            }
        }
        None => {
            for (o, xv) in out.iter_mut().zip(x) {
                *o = xv * inv;
            }
        }
    }
}

#[inline(always)]
fn rmsnorm_in_place_body(x: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let inv = rms_scale(x, eps);
    match w {
        Some(w) => x.iter_mut().zip(w).for_each(|(v, wv)| *v = *v * inv * wv),
        None => x.iter_mut().for_each(|v| *v *= inv),
    }
}

/// The public entry of a body: its AVX2 build when the CPU has AVX2, else the baseline build.
macro_rules! dispatch {
    ($(#[$doc:meta])* $name:ident => $body:ident ($($arg:ident: $ty:ty),*) $(-> $ret:ty)?) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }
                // SAFETY: AVX2 was detected just above; the body is safe Rust over the slices.
                return unsafe { avx2($($arg),*) };
            }
            $body($($arg),*)
        }
    };
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
}

dispatch!(
    /// Whether every value of `v` is finite (no NaN, no ±Inf).
    all_finite => all_finite_body(v: &[f32]) -> bool
);
dispatch!(
    /// The first index of the largest value of `l`: a NaN never wins, and a NaN at index 0 (or
    /// no values) gives 0, as a scan from index 0 keeping the first strict maximum returns.
    argmax => argmax_body(l: &[f32]) -> usize
);
dispatch!(
    /// `dst[i] += src[i]` over the shorter length.
    add_into => add_into_body(dst: &mut [f32], src: &[f32])
);
dispatch!(
    /// `dst[i] += k · src[i]` over the shorter length (a product, then a sum).
    add_scaled => add_scaled_body(dst: &mut [f32], src: &[f32], k: f32)
);
dispatch!(
    /// `out = x / rms(x) · w` (`w` None: no weight), `rms(x) = sqrt(mean(x²) + eps)`.
    rmsnorm => rmsnorm_body(out: &mut [f32], x: &[f32], w: Option<&[f32]>, eps: f32)
);
dispatch!(
    /// `x ← x / rms(x) · w`, in place (the same arithmetic as [`rmsnorm`]).
    rmsnorm_in_place => rmsnorm_in_place_body(x: &mut [f32], w: Option<&[f32]>, eps: f32)
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Values the tests put among ordinary ones: non-finite, extreme, signed zeros, a tie-maker.
    const SPECIALS: [f32; 8] = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -0.0,
        0.0,
        1e-45,
        3.0,
    ];

    #[test]
    fn both_builds_agree_on_every_length_and_special_value() {
        let mut r = Rng::new(5);
        for n in [0usize, 1, 7, 8, 9, 31, 64, 577, 4096] {
            let base: Vec<f32> = (0..n).map(|_| r.uniform() * 8.0 - 4.0).collect();
            let src: Vec<f32> = (0..n).map(|_| r.uniform() * 8.0 - 4.0).collect();
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            let (mut a, mut b) = (base.clone(), base.clone());
            add_into(&mut a, &src);
            add_into_body(&mut b, &src);
            assert!(same(&a, &b));
            add_scaled(&mut a, &src, 0.37);
            add_scaled_body(&mut b, &src, 0.37);
            assert!(same(&a, &b));
            let (mut o1, mut o2) = (vec![0f32; n], vec![0f32; n]);
            for w in [None, Some(&src[..])] {
                rmsnorm(&mut o1, &base, w, 1e-6);
                rmsnorm_body(&mut o2, &base, w, 1e-6);
                assert!(same(&o1, &o2));
                let (mut i1, mut i2) = (base.clone(), base.clone());
                rmsnorm_in_place(&mut i1, w, 1e-6);
                rmsnorm_in_place_body(&mut i2, w, 1e-6);
                assert!(same(&i1, &i2) && same(&i1, &o1));
            }
            assert!(all_finite(&base) && all_finite_body(&base));
            for (i, &s) in SPECIALS.iter().enumerate() {
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

    #[test]
    fn rms_scale_matches_a_float64_sum() {
        for n in [1usize, 7, 8, 13, 576, 640, 2048] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 113) as f32 / 17.0 - 3.0)
                .collect();
            let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let want = 1.0 / (ms + 1e-6).sqrt();
            let got = rms_scale(&x, 1e-6) as f64;
            assert!((got - want).abs() <= 2e-7 * want, "n {n}: {got} vs {want}");
        }
    }

    /// The first strict maximum, scanning from index 0: [`argmax_body`]'s rule as one loop.
    fn argmax_scalar(l: &[f32]) -> usize {
        let mut best = 0;
        for (i, v) in l.iter().enumerate() {
            if *v > l[best] {
                best = i;
            }
        }
        best
    }

    /// Both builds of argmax answer as the scalar scan on random logits of every length near
    /// the 16-lane chunks, with ties, signed zeros, infinities and NaNs anywhere (index 0 too).
    #[test]
    fn argmax_equals_the_scalar_scan() {
        let mut rng = Rng::new(7);
        for n in (0..70).chain([262_144, 49_152 + 5]) {
            for trial in 0..40 {
                let mut l: Vec<f32> = (0..n)
                    .map(|_| {
                        ((rng.next_u64() % 7) as f32 - 3.0)
                            * if trial % 2 == 0 { 1.0 } else { 0.37 }
                    })
                    .collect();
                for _ in 0..(trial % 4) {
                    if n > 0 {
                        let at = (rng.next_u64() as usize) % n;
                        l[at] = SPECIALS[(rng.next_u64() as usize) % SPECIALS.len()];
                    }
                }
                if trial == 5 && n > 0 {
                    l[0] = f32::NAN;
                }
                if trial == 6 {
                    l.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
                }
                let want = argmax_scalar(&l);
                assert_eq!(argmax(&l), want, "n {n} trial {trial}");
                assert_eq!(argmax_body(&l), want, "n {n} trial {trial}");
            }
        }
        assert_eq!(argmax(&[-0.0, 0.0, 1.0, 1.0]), 2);
        assert_eq!(argmax(&[-0.0, 0.0]), 0);
        assert_eq!(argmax(&[0.0, -0.0]), 0);
        assert_eq!(argmax(&[-2.0, -1.0, -3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 5.0]), 0);
        assert_eq!(argmax(&[1.0, f32::NAN, 5.0]), 2);
    }
}
