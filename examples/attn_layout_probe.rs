//! The KV cache's layout at depth: one query's attention over 30 layers of f16 K/V at
//! SmolLM2's shape (9 heads, 3 KV heads of 64) and 4096 positions, out of cache (30 × 3 MiB),
//! with the rows position-major (`[position][kv_dim]`: a KV head reads a third of each row)
//! against head-major (each KV head's rows one contiguous stream, as `model::kv::KvCache`
//! stores them). Same bytes, same arithmetic; prints the best of 20 passes.
//!
//! `cargo run --release --example attn_layout_probe -- THREADS [POSITIONS]`
use cflow::kernels::attention::{attend, AttnShape};
use cflow::kernels::pool::ThreadPool;
use cflow::kernels::Isa;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let pool = ThreadPool::new(threads);
    let isa = Isa::detect();
    let (n_heads, group, hd) = (9, 3, 64);
    let kv_dim = n_heads / group * hd;
    let layouts = [("position-major", kv_dim, hd), ("head-major", hd, n * hd)];
    for (name, row_stride, head_stride) in layouts {
        let sh = AttnShape {
            n_heads,
            group,
            head_dim: hd,
            kv_dim,
            row_stride,
            head_stride,
            start: 0,
            pos: n - 1,
            scale: 0.125,
            cap: 0.0,
        };
        let fill = |l: usize, m: usize| -> Vec<half::f16> {
            (0..n * kv_dim)
                .map(|i| half::f16::from_f32(((i * m + l) % 13) as f32 * 0.01))
                .collect()
        };
        let layers: Vec<_> = (0..30).map(|l| (fill(l, 7), fill(l, 5))).collect();
        let q: Vec<f32> = (0..n_heads * hd).map(|i| (i % 7) as f32 * 0.1).collect();
        let mut att = vec![0f32; n_heads * hd];
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t = Instant::now();
            for (k, v) in &layers {
                attend(&pool, isa, &sh, &q, k, v, &mut att);
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let bytes = 30.0 * 2.0 * (n * kv_dim * 2) as f64;
        println!(
            "{threads} thread(s), {n} positions, {name}: {:.0} µs per 30 layers, {:.1} GB/s of K/V",
            best * 1e6,
            bytes / best / 1e9
        );
    }
}
