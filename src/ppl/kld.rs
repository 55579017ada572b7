//! The KL-divergence statistics of `perplexity --kl-divergence` (as `llama-perplexity
//! --kl-divergence` reports them): per position KL(P_ref ‖ Q_test) = Σ_j p_j (ln p_j − ln q_j),
//! whether the most likely token agrees, and both models' negative log-likelihood of the actual
//! next token; summarized as mean ± standard error, median, 99th percentile and max KLD, top-1
//! agreement, and the perplexity difference with its uncertainty (delta method, with the
//! covariance of the two models' per-token NLL: they are scored on the same tokens).

use serde::Serialize;

/// ln Σ exp(x), in f64 (max-shifted).
pub fn logsumexp(x: &[f64]) -> f64 {
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !m.is_finite() {
        return m;
    }
    m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
}

/// Log-softmax of f32 logits, computed in f64, into `out`.
pub fn log_softmax(logits: &[f32], out: &mut [f64]) {
    for (o, &l) in out.iter_mut().zip(logits) {
        *o = l as f64;
    }
    let lse = logsumexp(out);
    out.iter_mut().for_each(|v| *v -= lse);
}

/// KL(P ‖ Q) of two log-probability vectors (P the reference). Terms with p = 0 are 0.
pub fn kl_divergence(ref_lp: &[f64], test_lp: &[f64]) -> f64 {
    ref_lp
        .iter()
        .zip(test_lp)
        .map(|(&p, &q)| {
            let pe = p.exp();
            if pe == 0.0 {
                0.0
            } else {
                pe * (p - q)
            }
        })
        .sum()
}

/// Index of the largest value (the first one on ties).
pub fn argmax(x: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Accumulates the per-position figures of an evaluation against a reference.
#[derive(Debug, Default, Clone)]
pub struct KldAccum {
    kld: Vec<f64>,
    top1_same: usize,
    /// Σ of test NLL, reference NLL, their squares and their product.
    s_t: f64,
    s_r: f64,
    s_tt: f64,
    s_rr: f64,
    s_tr: f64,
}

/// Mean and standard error of the mean.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct MeanErr {
    pub mean: f64,
    pub stderr: f64,
}

/// The summary of [`KldAccum`] (the `kl_divergence` object of `perplexity --json`).
#[derive(Debug, Clone, Serialize)]
pub struct KldSummary {
    pub positions: usize,
    pub kld: MeanErr,
    pub kld_median: f64,
    pub kld_p99: f64,
    pub kld_max: f64,
    /// Fraction of positions where both distributions have the same most likely token.
    pub top1_agreement: MeanErr,
    pub ppl: f64,
    pub ppl_ref: f64,
    /// `ppl − ppl_ref`, with its standard error.
    pub delta_ppl: MeanErr,
    /// Mean of `nll − nll_ref` per token = ln(ppl / ppl_ref), with its standard error.
    pub ln_ppl_ratio: MeanErr,
}

impl KldAccum {
    /// Adds one position: both log-probability vectors and the NLL of the actual next token
    /// under each.
    pub fn push(&mut self, ref_lp: &[f64], test_lp: &[f64], nll_ref: f64, nll_test: f64) {
        self.kld.push(kl_divergence(ref_lp, test_lp));
        if argmax(ref_lp) == argmax(test_lp) {
            self.top1_same += 1;
        }
        self.s_t += nll_test;
        self.s_r += nll_ref;
        self.s_tt += nll_test * nll_test;
        self.s_rr += nll_ref * nll_ref;
        self.s_tr += nll_test * nll_ref;
    }

    pub fn len(&self) -> usize {
        self.kld.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kld.is_empty()
    }

    pub fn summary(&self) -> KldSummary {
        let n = self.kld.len();
        let nf = n.max(1) as f64;
        // Sample (co)variance with n − 1, and the standard error of a mean, sd / √n.
        let cov = |sxy: f64, sx: f64, sy: f64| {
            if n < 2 {
                0.0
            } else {
                (sxy - sx * sy / nf) / (nf - 1.0)
            }
        };
        let se = |var: f64| (var.max(0.0) / nf).sqrt();
        let ksum: f64 = self.kld.iter().sum();
        let ksq: f64 = self.kld.iter().map(|x| x * x).sum();
        let mut sorted = self.kld.clone();
        sorted.sort_by(f64::total_cmp);
        let q = |p| crate::stats::percentile_sorted(&sorted, p).unwrap_or(0.0);
        let top1 = self.top1_same as f64 / nf;
        let (mt, mr) = (self.s_t / nf, self.s_r / nf);
        let (vt, vr) = (
            cov(self.s_tt, self.s_t, self.s_t),
            cov(self.s_rr, self.s_r, self.s_r),
        );
        let ctr = cov(self.s_tr, self.s_t, self.s_r);
        let (pt, pr) = (mt.exp(), mr.exp());
        // Δ = e^mt − e^mr; Var ≈ pt²·Var(mt) + pr²·Var(mr) − 2·pt·pr·Cov(mt, mr).
        let var_delta = (pt * pt * vt + pr * pr * vr - 2.0 * pt * pr * ctr) / nf;
        let var_diff = vt + vr - 2.0 * ctr;
        KldSummary {
            positions: n,
            kld: MeanErr {
                mean: ksum / nf,
                stderr: se(cov(ksq, ksum, ksum)),
            },
            kld_median: q(0.5),
            kld_p99: q(0.99),
            kld_max: sorted.last().copied().unwrap_or(0.0),
            top1_agreement: MeanErr {
                mean: top1,
                stderr: if n < 2 {
                    0.0
                } else {
                    (top1 * (1.0 - top1) / (nf - 1.0)).sqrt()
                },
            },
            ppl: pt,
            ppl_ref: pr,
            delta_ppl: MeanErr {
                mean: pt - pr,
                stderr: var_delta.max(0.0).sqrt(),
            },
            ln_ppl_ratio: MeanErr {
                mean: mt - mr,
                stderr: se(var_diff),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ln(p: &[f64]) -> Vec<f64> {
        p.iter().map(|x| x.ln()).collect()
    }

    /// KL([½, ½] ‖ [¼, ¾]) = ½ ln 2 + ½ ln(2/3) = ½ ln(4/3), by hand.
    #[test]
    fn kl_of_two_coins_by_hand() {
        let k = kl_divergence(&ln(&[0.5, 0.5]), &ln(&[0.25, 0.75]));
        assert!((k - 0.5 * (4.0f64 / 3.0).ln()).abs() < 1e-15, "{k}");
        // 0.143841036...
        assert!((k - 0.143_841_036_225_890_1).abs() < 1e-12);
        // Not symmetric: KL([¼, ¾] ‖ [½, ½]) = ¼ ln ½ + ¾ ln (3/2).
        let r = kl_divergence(&ln(&[0.25, 0.75]), &ln(&[0.5, 0.5]));
        assert!((r - (0.25 * 0.5f64.ln() + 0.75 * 1.5f64.ln())).abs() < 1e-15);
        // Identical distributions: 0; a zero reference probability contributes 0.
        assert_eq!(kl_divergence(&ln(&[0.2, 0.8]), &ln(&[0.2, 0.8])), 0.0);
        let k = kl_divergence(&[0.0, f64::NEG_INFINITY], &ln(&[0.5, 0.5]));
        assert!((k - 2f64.ln()).abs() < 1e-15);
    }

    #[test]
    fn log_softmax_is_shift_invariant_and_normalized() {
        let mut a = [0.0; 3];
        let mut b = [0.0; 3];
        log_softmax(&[1.0, 2.0, 3.0], &mut a);
        log_softmax(&[101.0, 102.0, 103.0], &mut b);
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-12);
        }
        assert!((a.iter().map(|v| v.exp()).sum::<f64>() - 1.0).abs() < 1e-15);
        // ln(e^3 / (e + e² + e³)) = −ln(1 + e^-1 + e^-2) = −0.40760596...
        assert!((a[2] + 0.407_605_964_444_380_1).abs() < 1e-12);
    }

    /// Two positions, figures worked by hand: KLDs ½ln(4/3) and 0, top-1 agrees once
    /// (argmax of [¼, ¾] is 1; of [½, ½] the first), the NLLs give the perplexities.
    #[test]
    fn summary_of_two_positions_by_hand() {
        let mut acc = KldAccum::default();
        // Position 1: ref [0.5, 0.5], test [0.25, 0.75]: top-1 0 vs 1, disagree.
        acc.push(&ln(&[0.5, 0.5]), &ln(&[0.25, 0.75]), 1.0, 2.0);
        // Position 2: identical: agree, KLD 0.
        acc.push(&ln(&[0.9, 0.1]), &ln(&[0.9, 0.1]), 3.0, 2.0);
        let s = acc.summary();
        let k1 = 0.5 * (4.0f64 / 3.0).ln();
        assert_eq!(s.positions, 2);
        assert!((s.kld.mean - k1 / 2.0).abs() < 1e-15);
        // sd of {k1, 0} with n − 1 is k1/√2; stderr = sd/√2 = k1/2.
        assert!((s.kld.stderr - k1 / 2.0).abs() < 1e-12, "{:?}", s.kld);
        assert!((s.kld_max - k1).abs() < 1e-15);
        assert!((s.kld_median - k1 / 2.0).abs() < 1e-15);
        // p99 interpolates 99% of the way from 0 to k1.
        assert!((s.kld_p99 - 0.99 * k1).abs() < 1e-15);
        assert_eq!(s.top1_agreement.mean, 0.5);
        assert!((s.top1_agreement.stderr - 0.5).abs() < 1e-15);
        // Mean NLL: test (2+2)/2 = 2, ref (1+3)/2 = 2: ppl e² both, Δ = 0.
        assert!((s.ppl - 2f64.exp()).abs() < 1e-12);
        assert!((s.ppl_ref - 2f64.exp()).abs() < 1e-12);
        assert!(s.delta_ppl.mean.abs() < 1e-12);
        // Differences nll_t − nll_r: {1, −1}: mean 0, sd √2, stderr 1.
        assert!(s.ln_ppl_ratio.mean.abs() < 1e-15);
        assert!((s.ln_ppl_ratio.stderr - 1.0).abs() < 1e-12);
        // Var(mt) = 0, Var(mr) = 2/2 = 1, Cov = 0: sd(Δ) = e²·1.
        assert!(
            (s.delta_ppl.stderr - 2f64.exp()).abs() < 1e-9,
            "{:?}",
            s.delta_ppl
        );
    }
}
