//! Deterministic instruction counts of one tile kernel: runs `tile_matvec_act` on one 128×256
//! tile of TYPE (Q8 integer activation, as decode runs it) ITERS times, for callgrind:
//!
//! `valgrind --tool=callgrind --toggle-collect='*avx2::tile_matvec*' \
//!   target/release/examples/kernel_icount Q5_0 100`
//!
//! then instructions per weight = Ir / (ITERS · 128 · 256).

use cflow::kernels::dot::kquant::tile_matvec_act;
use cflow::kernels::dot::Isa;
use cflow::quant::QuantType;
use std::hint::black_box;

#[path = "support/tile.rs"]
mod tile;

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
    let tile::TestTile {
        scales,
        qs,
        x,
        act: a,
    } = tile::make(q, rows, cols);
    let isa = Isa::cached();
    let mut y = vec![0f32; rows];
    for _ in 0..iters {
        tile_matvec_act(
            isa,
            cflow::kernels::dot::Tile::split(q, rows, cols, &scales, &qs),
            &x,
            Some(&a),
            0,
            &mut y,
        );
        black_box(&mut y);
    }
    println!(
        "{q} {rows}x{cols} ×{iters} on {}: y[0] = {}",
        isa.name(),
        y[0]
    );
}
