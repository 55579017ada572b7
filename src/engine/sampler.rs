//! Token sampling: greedy, temperature, top-k, top-p and repetition penalty, seeded and
//! reproducible (same seed and logits → same token).

use crate::rng::Rng;
use crate::telemetry::SamplingParams;

pub struct Sampler {
    pub p: SamplingParams,
    rng: Rng,
    idx: Vec<usize>,
}

impl Sampler {
    pub fn new(p: SamplingParams) -> Sampler {
        Sampler {
            rng: Rng::new(p.seed),
            p,
            idx: Vec::new(),
        }
    }

    /// Picks the next token from `logits` given the recent `history` (for the penalty).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let mut l: Vec<f32> = logits.to_vec();
        if self.p.repeat_penalty != 1.0 && self.p.repeat_penalty > 0.0 {
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
        if self.p.temperature <= 0.0 {
            return argmax(&l) as u32;
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
        let t = self.p.temperature;
        let m = l[self.idx[0]];
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
        let total: f64 = probs[..keep].iter().sum();
        let r = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut c = 0.0;
        for (i, p) in probs[..keep].iter().enumerate() {
            c += p;
            if r < c {
                return self.idx[i] as u32;
            }
        }
        self.idx[keep - 1] as u32
    }
}

pub fn argmax(l: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in l.iter().enumerate() {
        if *v > l[best] {
            best = i;
        }
    }
    best
}

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
