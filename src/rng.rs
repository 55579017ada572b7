//! The one deterministic random generator of the crate (SplitMix64): synthetic weights
//! (`convert::generate`), the sampler's draws (`engine::sampler`), benchmark inputs and the
//! kernels' randomized tests. The same seed gives the same stream on every machine.

/// SplitMix64 (Steele, Lea and Flood 2014), seeded through the golden-ratio increment.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
    /// `n` values uniform with standard deviation `std`.
    pub fn fill(&mut self, n: usize, std: f32) -> Vec<f32> {
        let a = std * 3f32.sqrt();
        (0..n).map(|_| self.uniform() * a).collect()
    }
    /// Uniform in `0..n` (`n` > 0; the modulo bias is below 2^-40 for the sizes used here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Uniform in [0, 1), with 53 random bits.
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_stream_and_values_stay_in_range() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            let u = a.uniform();
            b.uniform();
            assert!((-1.0..1.0).contains(&u));
            assert!(a.below(10) < 10);
            b.below(10);
            let f = a.unit_f64();
            b.unit_f64();
            assert!((0.0..1.0).contains(&f));
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }
}
