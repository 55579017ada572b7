//! Training a layer's router: ridge regression (faer's Cholesky solve) from the router input
//! (the normalized residual the router reads, plus a constant for the bias) to each expert's
//! activation norm ‖h_e‖ over the training tokens, accumulated as XᵀX and XᵀY in f64 so the
//! tokens need not be kept. The router then ranks experts by predicted contribution.

use faer::linalg::solvers::Solve;
use faer::Mat;

/// The normal equations of one layer's router, accumulated token by token.
#[derive(Clone, Debug)]
pub struct RidgeAcc {
    d: usize,
    e: usize,
    /// (d+1)² row-major XᵀX (last feature = 1).
    xtx: Vec<f64>,
    /// (d+1) × e row-major XᵀY.
    xty: Vec<f64>,
    pub n: u64,
}

impl RidgeAcc {
    pub fn new(d: usize, e: usize) -> RidgeAcc {
        RidgeAcc {
            d,
            e,
            xtx: vec![0.0; (d + 1) * (d + 1)],
            xty: vec![0.0; (d + 1) * e],
            n: 0,
        }
    }

    /// Adds one token: router input `x` (d), targets `y` (e).
    pub fn add(&mut self, x: &[f32], y: &[f32]) {
        let d1 = self.d + 1;
        let xa: Vec<f64> = x.iter().map(|&v| v as f64).chain([1.0]).collect();
        for i in 0..d1 {
            let xi = xa[i];
            let row = &mut self.xtx[i * d1..(i + 1) * d1];
            // Upper triangle only (mirrored in `solve`).
            for j in i..d1 {
                row[j] += xi * xa[j];
            }
            for (k, &yk) in y.iter().enumerate() {
                self.xty[i * self.e + k] += xi * yk as f64;
            }
        }
        self.n += 1;
    }

    /// Solves (XᵀX + λI)W = XᵀY with λ = `ridge` × mean diagonal. Returns the router
    /// (`e × d` row-major f32) and its bias (`e`).
    pub fn solve(&self, ridge: f64) -> Result<(Vec<f32>, Vec<f32>), String> {
        let d1 = self.d + 1;
        if self.n == 0 {
            return Err("no training tokens".into());
        }
        let mean_diag = (0..d1).map(|i| self.xtx[i * d1 + i]).sum::<f64>() / d1 as f64;
        let lam = ridge * mean_diag.max(1e-12);
        let a = Mat::<f64>::from_fn(d1, d1, |i, j| {
            let (r, c) = if i <= j { (i, j) } else { (j, i) };
            self.xtx[r * d1 + c] + if i == j && i < self.d { lam } else { 0.0 }
        });
        let b = Mat::<f64>::from_fn(d1, self.e, |i, k| self.xty[i * self.e + k]);
        let llt = a
            .llt(faer::Side::Lower)
            .map_err(|e| format!("router normal equations not positive definite: {e:?}"))?;
        let w = llt.solve(&b);
        let mut router = vec![0f32; self.e * self.d];
        let mut bias = vec![0f32; self.e];
        for k in 0..self.e {
            for i in 0..self.d {
                router[k * self.d + i] = w[(i, k)] as f32;
            }
            bias[k] = w[(self.d, k)] as f32;
        }
        Ok((router, bias))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_linear_map_with_bias() {
        let (d, e) = (3, 2);
        let mut acc = RidgeAcc::new(d, e);
        let mut s = 1u32;
        let mut r = || {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        for _ in 0..200 {
            let x = [r(), r(), r()];
            let y = [2.0 * x[0] - x[2] + 0.5, x[1] - 1.0];
            acc.add(&x, &y);
        }
        let (w, b) = acc.solve(1e-9).unwrap();
        let want = [2.0, 0.0, -1.0, 0.0, 1.0, 0.0];
        for (a, b) in w.iter().zip(want) {
            assert!((a - b).abs() < 1e-3, "{w:?}");
        }
        assert!(
            (b[0] - 0.5).abs() < 1e-3 && (b[1] + 1.0).abs() < 1e-3,
            "{b:?}"
        );
        // Bit-identical when trained twice.
        assert_eq!(acc.solve(1e-9).unwrap(), (w, b));
    }
}
