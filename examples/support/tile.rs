//! What the kernel examples share: one deterministic `rows × cols` tile of type `q` (weights in
//! ±0.1, seed 7) and its activation in ±1, quantized for every integer path (Q8 and Q8_K).

use cflow::kernels::dot::Q8Act;
use cflow::quant::{quantize_row, QuantType};

/// A tile's scales and quants, and its activation (f32 and quantized).
pub struct TestTile {
    pub scales: Vec<u8>,
    pub qs: Vec<u8>,
    pub x: Vec<f32>,
    pub act: Q8Act,
}

pub fn make(q: QuantType, rows: usize, cols: usize) -> TestTile {
    let mut seed = 7u64;
    let mut rnd = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    };
    let (mut scales, mut qs) = (Vec::new(), Vec::new());
    for _ in 0..rows {
        let src: Vec<f32> = (0..cols).map(|_| rnd() * 0.1).collect();
        quantize_row(q, &src, &mut scales, &mut qs);
    }
    let x: Vec<f32> = (0..cols).map(|_| rnd()).collect();
    let mut act = Q8Act::default();
    act.quantize_from(&x);
    act.quantize_k_from(&x);
    TestTile { scales, qs, x, act }
}
