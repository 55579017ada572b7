//! Deterministic instruction counts of one tile kernel: runs `tile_matvec_act` on one 128×256
//! tile of TYPE (Q8 integer activation, as decode runs it) ITERS times, for callgrind:
//!
//! `valgrind --tool=callgrind --toggle-collect='*avx2::tile_matvec*' \
//!   target/release/examples/kernel_icount Q5_0 100`
//!
//! then instructions per weight = Ir / (ITERS · 128 · 256).

use cflow::kernels::dot::kquant::tile_matvec_act;
use cflow::kernels::dot::{Isa, Q8Act};
use cflow::quant::{quantize_row, QuantType};
use std::hint::black_box;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(name), Some(iters)) = (args.get(1), args.get(2).and_then(|s| s.parse().ok())) else {
        eprintln!("usage: kernel_icount TYPE ITERS");
        std::process::exit(2);
    };
    let q = QuantType::parse(name).unwrap_or_else(|| {
        eprintln!("unknown type {name}");
        std::process::exit(2);
    });
    let (rows, cols) = (128, 256);
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
    let mut a = Q8Act::default();
    a.quantize_from(&x);
    a.quantize_k_from(&x);
    let isa = Isa::cached();
    let mut y = vec![0f32; rows];
    for _ in 0..iters {
        tile_matvec_act(isa, q, rows, cols, &scales, &qs, &x, Some(&a), 0, &mut y);
        black_box(&mut y);
    }
    println!(
        "{q} {rows}x{cols} ×{iters} on {}: y[0] = {}",
        isa.name(),
        y[0]
    );
}
