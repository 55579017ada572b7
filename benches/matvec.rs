//! Tiled vs row-major matvec over the same Q4_0 weights, per kernel path, at the shapes of the
//! engine-core issue: 512×2048, 2048×512, 8192×8192, 8192×32768 — reported as GB/s of weight
//! bytes (criterion `Throughput::Bytes`). One thread, so the numbers are per core.
//! `cargo bench --bench matvec` (scalar paths run only on the two small shapes: they would take
//! minutes on the large ones).

use cflow::cli::bench_layout::tile;
use cflow::format::{EntryKind, MatrixData};
use cflow::kernels::matvec::{rowmajor_matvec, tiled_matvec, Act};
use cflow::kernels::pool::ThreadPool;
use cflow::kernels::{Isa, Q8Act};
use cflow::quant::QuantType;
use cflow::rng::Rng;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let pool = ThreadPool::new(1);
    let mut rng = Rng::new(7);
    let mut g = c.benchmark_group("matvec_q4_0");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    for (rows, cols) in [
        (512usize, 2048usize),
        (2048, 512),
        (8192, 8192),
        (8192, 32768),
    ] {
        let w = rng.fill(rows * cols, 1.0 / (cols as f32).sqrt());
        let md = MatrixData::quantize(QuantType::Q4_0, rows, cols, &w);
        drop(w);
        let mut buf = Vec::new();
        let m = tile(&md, EntryKind::Down, &mut buf);
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 31 % 97) as f32 - 48.0) / 97.0)
            .collect();
        let mut xq = Q8Act::default();
        xq.quantize_from(&x);
        let mut y = vec![0f32; rows];
        g.throughput(Throughput::Bytes(md.bytes() as u64));
        let small = rows * cols <= 1 << 21;
        let mut paths = vec![
            (Isa::Avx2, true, "avx2-int"),
            (Isa::Avx2, false, "avx2-f32"),
        ];
        if Isa::Avx512.available() {
            paths.push((Isa::Avx512, true, "avx512-int"));
        }
        if small {
            paths.push((Isa::Scalar, true, "scalar-int"));
            paths.push((Isa::Scalar, false, "scalar-f32"));
        }
        for (isa, int, name) in paths {
            if !isa.available() {
                continue;
            }
            let act = Act {
                x: &x,
                q8: if int { Some(&xq) } else { None },
            };
            g.bench_with_input(
                BenchmarkId::new(format!("tiled/{name}"), format!("{rows}x{cols}")),
                &(),
                |b, _| b.iter(|| tiled_matvec(&pool, isa, &buf, &mut [(&m, &mut y)], &act)),
            );
            g.bench_with_input(
                BenchmarkId::new(format!("rowmajor/{name}"), format!("{rows}x{cols}")),
                &(),
                |b, _| b.iter(|| rowmajor_matvec(&pool, isa, &md, &act, &mut y)),
            );
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
