//! Token sampling: greedy, temperature, top-k, min-p, top-p and repetition penalty, seeded and
//! reproducible (same seed and logits → same token).
//!
//! Order: repetition penalty → top-k → min-p (on the untempered logits, as llama.cpp: keep
//! tokens whose probability is ≥ min_p × the top token's) → temperature softmax → top-p.

use crate::rng::Rng;
use crate::telemetry::SamplingParams;

pub struct Sampler {
    pub p: SamplingParams,
    rng: Rng,
    idx: Vec<usize>,
    /// The penalized logits, reused from token to token (a 262k-entry vocabulary would
    /// otherwise allocate and free 1 MiB per token).
    buf: Vec<f32>,
}

impl Sampler {
    pub fn new(p: SamplingParams) -> Sampler {
        Sampler {
            rng: Rng::new(p.seed),
            p,
            idx: Vec::new(),
            buf: Vec::new(),
        }
    }

    /// Picks the next token from `logits` given the recent `history` (for the penalty).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let penalize = self.p.repeat_penalty != 1.0 && self.p.repeat_penalty > 0.0;
        if !penalize && self.p.temperature <= 0.0 {
            return argmax(logits) as u32;
        }
        let mut l = std::mem::take(&mut self.buf);
        l.clear();
        l.extend_from_slice(logits);
        if penalize {
            self.penalize(&mut l, history);
        }
        let t = if self.p.temperature <= 0.0 {
            argmax(&l) as u32
        } else {
            self.draw(&l)
        };
        self.buf = l;
        t
    }

    /// A seeded draw from the candidates of [`Sampler::distribution`].
    fn draw(&mut self, l: &[f32]) -> u32 {
        let probs = self.distribution(l);
        let total: f64 = probs.iter().map(|&(_, p)| p).sum();
        let r = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut c = 0.0;
        for &(i, p) in &probs {
            c += p;
            if r < c {
                return i as u32;
            }
        }
        probs.last().map_or(0, |&(i, _)| i as u32)
    }

    /// Applies the repetition penalty over the last 64 distinct tokens of `history` to `l`.
    fn penalize(&self, l: &mut [f32], history: &[u32]) {
        let mut seen = std::collections::HashSet::new();
        for &t in history.iter().rev().take(64) {
            if seen.insert(t) {
                if let Some(v) = l.get_mut(t as usize) {
                    *v = if *v > 0.0 {
                        *v / self.p.repeat_penalty
                    } else {
                        *v * self.p.repeat_penalty
                    };
                }
            }
        }
    }

    /// The candidates a non-greedy draw picks from, best first: (token, probability) after
    /// top-k, min-p, the temperature softmax and top-p (probabilities sum to 1 before top-p
    /// cuts the tail; the draw renormalizes). Empty logits give no candidates.
    pub fn distribution(&mut self, l: &[f32]) -> Vec<(usize, f64)> {
        if l.is_empty() {
            return Vec::new();
        }
        self.idx.clear();
        self.idx.extend(0..l.len());
        let k = if self.p.top_k == 0 {
            l.len()
        } else {
            (self.p.top_k as usize).min(l.len())
        };
        self.idx
            .select_nth_unstable_by(k.saturating_sub(1), |&a, &b| {
                l[b].total_cmp(&l[a]).then(a.cmp(&b))
            });
        self.idx.truncate(k);
        self.idx
            .sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
        let m = l[self.idx[0]];
        // min-p: p_i / p_max = exp(l_i - l_max) >= min_p, on the untempered logits.
        if self.p.min_p > 0.0 && self.p.min_p <= 1.0 {
            let floor = (self.p.min_p as f64).ln();
            let keep = self
                .idx
                .iter()
                .take_while(|&&i| (l[i] - m) as f64 >= floor)
                .count()
                .max(1);
            self.idx.truncate(keep);
        }
        let t = self.p.temperature.max(f32::MIN_POSITIVE);
        let mut probs: Vec<f64> = self
            .idx
            .iter()
            .map(|&i| (((l[i] - m) / t) as f64).exp())
            .collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= sum);
        // top-p: smallest prefix with cumulative probability >= p.
        let mut keep = probs.len();
        if self.p.top_p > 0.0 && self.p.top_p < 1.0 {
            let mut c = 0.0;
            for (i, p) in probs.iter().enumerate() {
                c += p;
                if c >= self.p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        self.idx[..keep].iter().copied().zip(probs).collect()
    }
}

/// The index of the largest logit, the first of equal ones (greedy decoding): the rule's f32
/// home, vectorized, is [`crate::kernels::vec::argmax`].
pub use crate::kernels::vec::argmax;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_and_seeded_reproducible() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
        let mut g = Sampler::new(SamplingParams {
            temperature: 0.0,
            ..Default::default()
        });
        assert_eq!(g.sample(&logits, &[]) as usize, argmax(&logits));
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            seed: 7,
            ..Default::default()
        };
        let (mut a, mut b) = (Sampler::new(p.clone()), Sampler::new(p));
        let sa: Vec<u32> = (0..50).map(|_| a.sample(&logits, &[])).collect();
        let sb: Vec<u32> = (0..50).map(|_| b.sample(&logits, &[])).collect();
        assert_eq!(sa, sb);
        assert!(sa.iter().collect::<std::collections::HashSet<_>>().len() > 1);
    }

    /// min-p by hand: logits [2, 1, 0, -1] → p/p_max = 1, e^-1 = 0.368, e^-2 = 0.135,
    /// e^-3 = 0.050. min_p 0.3 keeps tokens 0 and 1; at T = 1 they get 1/(1+e^-1) = 0.7311 and
    /// e^-1/(1+e^-1) = 0.2689. At T = 2 the cut is the same (untempered) and the weights are
    /// 1/(1+e^-0.5) = 0.6225 and 0.3775.
    #[test]
    fn min_p_keeps_tokens_above_the_fraction_of_the_top_probability() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.3,
            ..Default::default()
        });
        let d = s.distribution(&logits);
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!((d[0].0, d[1].0), (0, 1));
        assert!(
            (d[0].1 - 0.7311).abs() < 1e-4 && (d[1].1 - 0.2689).abs() < 1e-4,
            "{d:?}"
        );
        s.p.temperature = 2.0;
        let d = s.distribution(&logits);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!((d[0].1 - 0.6225).abs() < 1e-4, "{d:?}");
        // 0.13 keeps the third (0.135 >= 0.13), not the fourth.
        s.p.min_p = 0.13;
        assert_eq!(s.distribution(&logits).len(), 3);
        // Off: all four.
        s.p.min_p = 0.0;
        assert_eq!(s.distribution(&logits).len(), 4);
        // Draws only ever pick a kept token.
        s.p.min_p = 0.3;
        s.p.temperature = 1.0;
        let picks: std::collections::HashSet<u32> =
            (0..200).map(|_| s.sample(&logits, &[])).collect();
        assert_eq!(picks, [0u32, 1].into_iter().collect());
    }

    #[test]
    fn top_k_one_is_greedy_and_penalty_applies() {
        let logits = vec![1.0, 5.0, 4.9];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        });
        assert_eq!(s.sample(&logits, &[]), 1);
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            repeat_penalty: 2.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&logits, &[1]), 2);
    }
}
