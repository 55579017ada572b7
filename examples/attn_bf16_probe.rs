//! Decode attention over an f16 and a bf16 cache at Gemma 3's global-layer shape (4 heads, 1 KV
//! head of 256, 4096 positions, head-major), 1 and 2 threads, warm and cold (128 MiB read
//! between calls), µs per call: `cargo run --release --example attn_bf16_probe`.
//! `SHAPE=smollm2` takes SmolLM2's layer instead (9 heads, 3 KV heads of 64); `POSITIONS=N` the
//! cached positions (default 4096). `EVICT=1` flushes the K/V lines alone from the caches before
//! each call (`clflush`; code and the rest stay warm); `PREWARM=1` then asks for them into L2
//! (`prefetcht1`) and waits 30 µs before the call.
use cflow::kernels::attention::{attend, AttnShape};
use cflow::kernels::kv_elem::KvElem;
use cflow::kernels::pool::ThreadPool;
use cflow::kernels::Isa;
use std::io::Write;
use std::time::Instant;

fn run<T: KvElem>(pool: &ThreadPool, sh: &AttnShape, cold: bool, flush: &[u8]) -> f64 {
    let on = |k: &str| std::env::var(k).is_ok_and(|v| v == "1");
    let (evict, prewarm) = (on("EVICT"), on("PREWARM"));
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
        if evict {
            // Only the K/V lines leave the caches (the code and everything else stay warm).
            cflow::kernels::prefetch::evict(&k);
            cflow::kernels::prefetch::evict(&v);
        }
        if prewarm {
            cflow::kernels::prefetch::to_l2(&k);
            cflow::kernels::prefetch::to_l2(&v);
            let t = Instant::now();
            while t.elapsed().as_micros() < 30 {}
        }
        let t = Instant::now();
        attend(pool, Isa::Avx512, sh, &q, &k, &v, &mut att);
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let n: usize = match std::env::var("POSITIONS") {
        Err(_) => 4096,
        Ok(s) => match s.parse() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("POSITIONS={s:?}: a positive number of cached positions");
                std::process::exit(2);
            }
        },
    };
    let pos = n - 1;
    // (heads, KV heads, head width)
    let (heads, kv_heads, hd) = match std::env::var("SHAPE").as_deref() {
        Ok("smollm2") => (9, 3, 64),
        _ => (4, 1, 256),
    };
    let sh = AttnShape {
        n_heads: heads,
        group: heads / kv_heads,
        head_dim: hd,
        kv_dim: kv_heads * hd,
        row_stride: hd,
        head_stride: hd * (pos + 1),
        start: 0,
        pos,
        scale: 1.0 / (hd as f32).sqrt(),
        cap: 0.0,
    };
    let flush: Vec<u8> = (0..128usize << 20).map(|i| i as u8).collect();
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        for cold in [false, true] {
            let a = run::<half::f16>(&pool, &sh, cold, &flush);
            let b = run::<half::bf16>(&pool, &sh, cold, &flush);
            let line = format!("threads {threads} cold {cold}: f16 {a:.1} µs, bf16 {b:.1} µs");
            if writeln!(std::io::stdout(), "{line}").is_err() {
                return; // stdout closed (e.g. piped into `head`)
            }
        }
    }
}
