//! Elementwise building blocks of the forward pass: RMSNorm, RoPE (both pair conventions, partial
//! rotation), softmax, activations.

use crate::model::RopeStyle;

pub use crate::kernels::vec::{add_into, add_scaled, rmsnorm, rmsnorm_in_place};

/// Rotates one head vector in place for position `pos`.
pub fn rope(head: &mut [f32], pos: usize, rot_dims: usize, theta: f32, style: RopeStyle) {
    let mut c = RopeCache::default();
    rope_with(head, c.angles(pos, rot_dims, theta), style);
}

/// The rotation frequency of pair `i` of `rot_dims` rotated dimensions: θ^(−2i/rot_dims).
fn rope_freq(i: usize, rot_dims: usize, theta: f32) -> f32 {
    1.0 / theta.powf((2 * i) as f32 / rot_dims as f32)
}

/// The `(sin, cos)` of every rotated pair (`rot_dims / 2` entries) at a position, kept per RoPE
/// base: the frequencies are computed once per base, and the angles once per (position, base),
/// so a decode step pays the trigonometry once for all layers that share a base rather than
/// once per layer (and never per head).
#[derive(Default)]
pub struct RopeCache {
    bases: Vec<RopeBase>,
}

/// One RoPE base of a [`RopeCache`]: its frequencies and the angles of the last position.
struct RopeBase {
    theta_bits: u32,
    rot_dims: usize,
    freqs: Vec<f32>,
    at: Option<usize>,
    angles: Vec<(f32, f32)>,
}

impl RopeCache {
    /// The angles of position `pos` for base `theta` over `rot_dims` dimensions.
    pub fn angles(&mut self, pos: usize, rot_dims: usize, theta: f32) -> &[(f32, f32)] {
        let key = theta.to_bits();
        let i = match self
            .bases
            .iter()
            .position(|b| b.theta_bits == key && b.rot_dims == rot_dims)
        {
            Some(i) => i,
            None => {
                let freqs = (0..rot_dims / 2)
                    .map(|i| rope_freq(i, rot_dims, theta))
                    .collect();
                self.bases.push(RopeBase {
                    theta_bits: key,
                    rot_dims,
                    freqs,
                    at: None,
                    angles: Vec::new(),
                });
                self.bases.len() - 1
            }
        };
        let b = &mut self.bases[i];
        if b.at != Some(pos) {
            b.angles.clear();
            b.angles
                .extend(b.freqs.iter().map(|&f| (pos as f32 * f).sin_cos()));
            b.at = Some(pos);
        }
        &b.angles
    }
}

/// Rotates one head vector in place by precomputed [`RopeCache::angles`].
pub fn rope_with(head: &mut [f32], angles: &[(f32, f32)], style: RopeStyle) {
    let half = angles.len();
    for (i, &(s, c)) in angles.iter().enumerate() {
        let (a, b) = match style {
            RopeStyle::SplitHalf => (i, i + half),
            RopeStyle::Adjacent => (2 * i, 2 * i + 1),
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * c - x1 * s;
        head[b] = x0 * s + x1 * c;
    }
}

/// In-place softmax.
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// log Σ exp(x).
pub fn logsumexp(x: &[f32]) -> f32 {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    m + x.iter().map(|v| ((v - m) as f64).exp()).sum::<f64>().ln() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_conventions_agree_up_to_permutation() {
        let v: Vec<f32> = (0..8).map(|i| i as f32 * 0.3 - 1.0).collect();
        // Adjacent on the interleaved permutation equals SplitHalf on the original.
        let mut a = v.clone();
        rope(&mut a, 5, 8, 10000.0, RopeStyle::SplitHalf);
        let perm: Vec<f32> = (0..4).flat_map(|i| [v[i], v[i + 4]]).collect();
        let mut b = perm.clone();
        rope(&mut b, 5, 8, 10000.0, RopeStyle::Adjacent);
        for i in 0..4 {
            assert!((a[i] - b[2 * i]).abs() < 1e-6 && (a[i + 4] - b[2 * i + 1]).abs() < 1e-6);
        }
    }

    #[test]
    fn cached_angles_equal_fresh_ones_across_positions_and_bases() {
        let mut c = RopeCache::default();
        for pos in [0usize, 7, 7, 300, 7] {
            for (rot, theta) in [(64usize, 10000.0f32), (64, 1_000_000.0), (32, 10000.0)] {
                let fresh: Vec<(f32, f32)> = (0..rot / 2)
                    .map(|i| {
                        (pos as f32 * (1.0 / theta.powf((2 * i) as f32 / rot as f32))).sin_cos()
                    })
                    .collect();
                assert_eq!(c.angles(pos, rot, theta), &fresh[..]);
            }
        }
        assert_eq!(c.bases.len(), 3);
    }

    #[test]
    fn partial_rotation_leaves_tail() {
        let mut h = vec![1.0f32; 8];
        rope(&mut h, 3, 4, 100.0, RopeStyle::SplitHalf);
        assert_eq!(&h[4..], &[1.0; 4]);
        assert_ne!(h[0], 1.0);
    }
}
