//! Decode attention over an f16 and a bf16 cache at Gemma 3's global-layer shape (4 heads, 1 KV
//! head of 256, 4096 positions, head-major), 1 and 2 threads, warm and cold (128 MiB read
//! between calls), µs per call: `cargo run --release --example attn_bf16_probe`.
use cflow::kernels::attention::{attend, AttnShape};
use cflow::kernels::kv_elem::KvElem;
use cflow::kernels::pool::ThreadPool;
use cflow::kernels::Isa;
use std::time::Instant;

fn run<T: KvElem>(pool: &ThreadPool, sh: &AttnShape, cold: bool, flush: &[u8]) -> f64 {
    let n = (sh.pos + 1) * sh.kv_dim;
    let k: Vec<T> = (0..n)
        .map(|i| T::from_f32(((i % 97) as f32 - 48.0) / 50.0))
        .collect();
    let v: Vec<T> = (0..n)
        .map(|i| T::from_f32(((i % 89) as f32 - 44.0) / 50.0))
        .collect();
    let q: Vec<f32> = (0..sh.n_heads * sh.head_dim)
        .map(|i| (i % 13) as f32 / 13.0)
        .collect();
    let mut att = vec![0f32; q.len()];
    let mut times = Vec::new();
    for _ in 0..40 {
        if cold {
            // Read, not written: no dirty lines left to write back during the call.
            let s: u64 = flush.iter().step_by(64).map(|&b| b as u64).sum();
            std::hint::black_box(s);
        }
        let t = Instant::now();
        attend(pool, Isa::Avx512, sh, &q, &k, &v, &mut att);
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let pos = 4095;
    let sh = AttnShape {
        n_heads: 4,
        group: 4,
        head_dim: 256,
        kv_dim: 256,
        row_stride: 256,
        head_stride: 256 * (pos + 1),
        start: 0,
        pos,
        scale: 1.0 / 16.0,
        cap: 0.0,
    };
    let flush: Vec<u8> = (0..128usize << 20).map(|i| i as u8).collect();
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        for cold in [false, true] {
            let a = run::<half::f16>(&pool, &sh, cold, &flush);
            let b = run::<half::bf16>(&pool, &sh, cold, &flush);
            println!("threads {threads} cold {cold}: f16 {a:.0} µs, bf16 {b:.0} µs");
        }
    }
}
