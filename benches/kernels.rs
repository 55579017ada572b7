//! Tile kernel throughput: `tile_matvec` over whole matrices stored as 128×256 tiles, per quant
//! type and path (scalar / AVX2 / AVX-512 × f32 activation / Q8 integer activation; Q8_K for the
//! K-quants; Q5_1 and the f32 paths of the new types run their AVX2 kernels under AVX-512, Q5_0
//! its AVX-512 VNNI + VBMI kernel where the CPU has them). Throughput is
//! reported in weight bytes (scales + quants) per second. The integer paths include the one
//! activation quantization per matvec, as the engine pays it. Q4_0/Q4_1/Q8_0, and Q5_0/Q4_K/Q6_K where
//! their VNNI kernels run (`packed::repacks_vnni_types`), also run over the repacked layout of a
//! resident copy (`-int-repacked`: `quant::packed`, `dot::packed`).
//!
//! `tile_matmul_128tok`: the batched prefill kernels of Q4_0, Q4_1 and Q8_0 (both layouts) and
//! Q5_0 (repacked) on one tile and 128 tokens. `kquant_matmul_32tok`: the batched prefill kernels
//! of Q5_0, Q4_K and Q6_K against per-token calls, and Q4_K's and Q6_K's repacked ones
//! (`-- kquant_matmul`).
//!
//! Also the gated FFN activations (`act`: GELU and SiLU per ISA, in values per second) and
//! single-query attention over an f32 and an f16 KV cache (`attention`: SmolLM2's and Gemma 3's
//! head shapes at 128 and 512 cached positions, per ISA, in cached positions per second).
//!
//! Run: `cargo bench --bench kernels` (short measurement times are set below; add `-- --quick` for
//! an even shorter run, or a filter such as `-- Q4_1`).

use std::hint::black_box;
use std::time::Duration;

use cflow::kernels::dot::kquant::tile_matvec_act;
use cflow::kernels::dot::{packed, quantize_act, tile_matmul, Isa, Q8Act};
use cflow::quant::packed::{pack_tile, packable};
use cflow::quant::{quantize_row, QuantType};
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};

const TR: usize = 128;
const TC: usize = 256;

struct Tile {
    r0: usize,
    c0: usize,
    rows: usize,
    cols: usize,
    scales: Vec<u8>,
    qs: Vec<u8>,
    /// The same tile repacked (`quant::packed`), when its type and rows allow.
    packed: Option<Vec<u8>>,
}

struct Matrix {
    q: QuantType,
    tiles: Vec<Tile>,
}

/// A value uniform in [-1, 1) from the crate's generator.
fn uniform(s: &mut cflow::rng::Rng) -> f32 {
    s.uniform()
}

fn build(q: QuantType, rows: usize, cols: usize) -> Matrix {
    let mut seed = cflow::rng::Rng::new(42);
    let mut tiles = Vec::new();
    for r0 in (0..rows).step_by(TR) {
        for c0 in (0..cols).step_by(TC) {
            let (tr, tc) = (TR.min(rows - r0), TC.min(cols - c0));
            let (mut scales, mut qs) = (Vec::new(), Vec::new());
            let mut src = vec![0f32; tc];
            for _ in 0..tr {
                for v in src.iter_mut() {
                    *v = uniform(&mut seed) * 0.1;
                }
                quantize_row(q, &src, &mut scales, &mut qs);
            }
            let packed = packable(q, tr).then(|| {
                let mut body = [&scales[..], &qs[..]].concat();
                pack_tile(q, tr, tc, &mut body);
                body
            });
            tiles.push(Tile {
                r0,
                c0,
                rows: tr,
                cols: tc,
                scales,
                qs,
                packed,
            });
        }
    }
    Matrix { q, tiles }
}

/// One full matvec `y = W·x` through the tile kernels.
fn matvec(isa: Isa, m: &Matrix, x: &[f32], xq: Option<&mut Q8Act>, y: &mut [f32]) {
    y.fill(0.0);
    let xq = xq.map(|a| {
        // K-quants take the Q8_K form of the activation, the others Q8_0/Q8_1 blocks.
        if m.q.is_k() {
            a.k.quantize_from(x);
        } else {
            quantize_act(isa, x, a);
        }
        &*a
    });
    for t in &m.tiles {
        tile_matvec_act(
            isa,
            cflow::kernels::dot::Tile::split(m.q, t.rows, t.cols, &t.scales, &t.qs),
            &x[t.c0..t.c0 + t.cols],
            xq,
            t.c0,
            &mut y[t.r0..t.r0 + t.rows],
        );
    }
}

/// The same matvec over the repacked tiles (integer path; Q8_K blocks for Q4_K).
fn packed_matvec(isa: Isa, m: &Matrix, x: &[f32], xq: &mut Q8Act, y: &mut [f32]) {
    y.fill(0.0);
    quantize_act(isa, x, xq);
    if m.q.is_k() {
        xq.quantize_k_from(x);
    }
    let k = packed::Kernel::of(isa);
    for t in &m.tiles {
        let tile = cflow::kernels::dot::Tile::body(
            m.q,
            t.rows,
            t.cols,
            t.packed.as_ref().expect("repacked"),
        );
        let y = &mut y[t.r0..t.r0 + t.rows];
        if m.q.is_k() {
            packed::tile_run_k(k, tile, &[], xq.k.slice(t.c0, t.cols), y);
        } else {
            packed::tile_run(k, tile, &[], Some(xq.tile_slice(t.c0, t.cols)), y);
        }
    }
}

fn isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|i| i.available())
        .collect()
}

fn bench_shape(c: &mut Criterion, group: &str, shapes: &[(QuantType, usize, usize)]) {
    let mut g = c.benchmark_group(group);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1200));
    for &(q, rows, cols) in shapes {
        let m = build(q, rows, cols);
        let mut s = cflow::rng::Rng::new(7);
        let x: Vec<f32> = (0..cols).map(|_| uniform(&mut s)).collect();
        let mut y = vec![0f32; rows];
        let mut xq = Q8Act::default();
        g.throughput(Throughput::Bytes(q.matrix_bytes(rows, cols) as u64));
        for isa in isas() {
            for int in [false, true] {
                if int && !q.is_blocked() {
                    continue;
                }
                let name = format!(
                    "{}/{}x{}/{}-{}",
                    q,
                    rows,
                    cols,
                    isa.name(),
                    if int { "int" } else { "f32" }
                );
                g.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter(|| {
                        let a = if int { Some(&mut xq) } else { None };
                        matvec(isa, &m, black_box(&x), a, &mut y);
                        black_box(&y);
                    })
                });
            }
            // Q5_0, Q4_K and Q6_K are repacked only where their VNNI kernels run.
            if m.tiles.iter().all(|t| t.packed.is_some()) && packed::repack_for(isa).includes(q) {
                let name = format!("{}/{}x{}/{}-int-repacked", q, rows, cols, isa.name());
                g.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter(|| {
                        packed_matvec(isa, &m, black_box(&x), &mut xq, &mut y);
                        black_box(&y);
                    })
                });
            }
        }
    }
    g.finish();
}

fn kernels(c: &mut Criterion) {
    bench_shape(
        c,
        "tile_matvec_2048x2048",
        &[
            (QuantType::Q4_0, 2048, 2048),
            (QuantType::Q4_1, 2048, 2048),
            (QuantType::Q8_0, 2048, 2048),
            (QuantType::Q5_0, 2048, 2048),
            (QuantType::Q5_1, 2048, 2048),
            (QuantType::Q4_K, 2048, 2048),
            (QuantType::Q5_K, 2048, 2048),
            (QuantType::Q6_K, 2048, 2048),
        ],
    );
}

/// SmolLM2-135M shapes (d = 576): a Q4_1 FFN projection and the 49152×576 Q8_0 LM head.
fn smollm2(c: &mut Criterion) {
    bench_shape(
        c,
        "smollm2",
        &[(QuantType::Q4_1, 1536, 576), (QuantType::Q8_0, 49152, 576)],
    );
}

/// Gemma 3 270M shapes (d = 640 = 2.5 × 256, FFN 2048): the Q5_0 gate/up projection, the
/// K-quant down projections, and a 16384-row slice of the 262144 × 640 Q8_0 LM head.
fn gemma3(c: &mut Criterion) {
    bench_shape(
        c,
        "gemma3",
        &[
            (QuantType::Q5_0, 2048, 640),
            (QuantType::Q4_K, 640, 2048),
            (QuantType::Q6_K, 640, 2048),
            (QuantType::Q8_0, 16384, 640),
        ],
    );
}

/// One 128×256 tile (L1/L2-resident): the kernels' compute ceiling without cache misses.
fn single_tile(c: &mut Criterion) {
    bench_shape(
        c,
        "single_tile",
        &[
            (QuantType::Q4_0, 128, 256),
            (QuantType::Q4_1, 128, 256),
            (QuantType::Q8_0, 128, 256),
            (QuantType::F16, 128, 256),
            (QuantType::F32, 128, 256),
            (QuantType::Q5_0, 128, 256),
            (QuantType::Q5_1, 128, 256),
            (QuantType::Q4_K, 128, 256),
            (QuantType::Q5_K, 128, 256),
            (QuantType::Q6_K, 128, 256),
        ],
    );
}

/// The batched prefill kernel `tile_matmul`: one 128×256 tile applied to 128 tokens (a prefill
/// batch), per ISA and path, and the repacked layout's batch kernel (`packed::tile_run_batch`).
/// Throughput counts the weight bytes once per token, so it compares directly with
/// `single_tile` (128 `tile_matvec` calls).
fn batched_tile(c: &mut Criterion) {
    const N: usize = 128;
    let mut g = c.benchmark_group("tile_matmul_128tok");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1200));
    // Q5_0 runs only its repacked batch kernel here (where the VNNI build repacks it); its
    // file-layout batch kernel is in `kquant_matmul_32tok`.
    for q in [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q8_0,
        QuantType::Q5_0,
    ] {
        let m = build(q, TR, TC);
        let t = &m.tiles[0];
        let mut s = cflow::rng::Rng::new(9);
        let xs: Vec<f32> = (0..N * TC).map(|_| uniform(&mut s)).collect();
        let acts: Vec<Q8Act> = xs
            .chunks_exact(TC)
            .map(|x| {
                let mut a = Q8Act::default();
                quantize_act(Isa::Scalar, x, &mut a);
                a
            })
            .collect();
        let xq: Vec<_> = acts
            .iter()
            .map(|a| (&a.d[..], &a.s[..], &a.qs[..]))
            .collect();
        let mut y = vec![0f32; N * TR];
        g.throughput(Throughput::Bytes((N * q.matrix_bytes(TR, TC)) as u64));
        for isa in isas() {
            let split = q != QuantType::Q5_0;
            for int in [false, true].into_iter().filter(|_| split) {
                let name = format!("{q}/{}-{}", isa.name(), if int { "int" } else { "f32" });
                g.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter(|| {
                        let xa = int.then_some(&xq[..]);
                        tile_matmul(
                            isa,
                            cflow::kernels::dot::Tile::split(q, TR, TC, &t.scales, &t.qs),
                            &xs,
                            xa,
                            N,
                            &mut y,
                        );
                        black_box(&y);
                    })
                });
            }
            // The repacked layout's batched kernel (`packed::tile_run_batch`), where it runs.
            let repacked = packed::repack_for(isa).includes(q);
            if let Some(body) = t.packed.as_ref().filter(|_| repacked) {
                let name = format!("{q}/{}-int-repacked", isa.name());
                let k = packed::Kernel::of(isa);
                g.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter(|| {
                        y.fill(0.0);
                        let tile = cflow::kernels::dot::Tile::body(q, TR, TC, body);
                        packed::tile_run_batch(k, tile, &xq, &mut y);
                        black_box(&y);
                    })
                });
            }
        }
    }
    g.finish();
}

/// The batched prefill kernels of the interleaved types a Q4_K_M file mixes
/// (`kquant::tile_matmul`: Q5_0 · Q8_0, Q4_K and Q6_K · Q8_K): one 128×256 tile applied to 32
/// tokens, per ISA (AVX-512 = the VL + VNNI build, on AMX INT8 where `packed_amx::available`;
/// `CFLOW_AMX=0` for the VNNI kernels), against 32 per-token calls of the kernel
/// decode runs (`tile_matvec_act` with `Isa::for_quant`). Throughput counts the weight bytes
/// once per token.
fn batched_kquant_tile(c: &mut Criterion) {
    use cflow::kernels::dot::kquant::{self, BatchAct};
    const N: usize = 32;
    let mut g = c.benchmark_group("kquant_matmul_32tok");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1200));
    for q in [QuantType::Q5_0, QuantType::Q4_K, QuantType::Q6_K] {
        let m = build(q, TR, TC);
        let t = &m.tiles[0];
        let mut s = cflow::rng::Rng::new(9);
        let xs: Vec<f32> = (0..N * TC).map(|_| uniform(&mut s)).collect();
        let acts: Vec<Q8Act> = xs
            .chunks_exact(TC)
            .map(|x| {
                let mut a = Q8Act::default();
                a.quantize_for(x, [q]);
                a
            })
            .collect();
        // `quantize_for` leaves a K-quant's input without Q8 blocks: slice only what exists.
        let xq: Vec<_> = if q.is_k() {
            Vec::new()
        } else {
            acts.iter().map(|a| a.tile_slice(0, TC)).collect()
        };
        let xk: Vec<_> = acts.iter().filter_map(|a| a.k.slice(0, TC)).collect();
        let batch = if q.is_k() {
            BatchAct::K(&xk)
        } else {
            BatchAct::Q8(&xq)
        };
        let mut y = vec![0f32; N * TR];
        g.throughput(Throughput::Bytes((N * q.matrix_bytes(TR, TC)) as u64));
        for isa in isas() {
            let name = format!("{q}/{}-per-token", isa.name());
            g.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter(|| {
                    for (j, a) in acts.iter().enumerate() {
                        let yj = &mut y[j * TR..(j + 1) * TR];
                        let x = &xs[j * TC..(j + 1) * TC];
                        let i = isa.for_quant(q);
                        tile_matvec_act(
                            i,
                            cflow::kernels::dot::Tile::split(q, TR, TC, &t.scales, &t.qs),
                            x,
                            Some(a),
                            0,
                            yj,
                        );
                    }
                    black_box(&y);
                })
            });
            let name = format!("{q}/{}-batched", isa.name());
            g.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter(|| {
                    kquant::tile_matmul(
                        isa,
                        cflow::kernels::dot::Tile::body(q, TR, TC, &t.qs),
                        batch,
                        &mut y,
                    );
                    black_box(&y);
                })
            });
            // The repacked layout's batch kernel of Q4_K/Q6_K (`packed::tile_run_k_batch`), where
            // the VNNI build repacks them (Q5_0's is in `tile_matmul_128tok`).
            let repacked = q.is_k() && packed::repack_for(isa).includes(q);
            if let Some(body) = t.packed.as_ref().filter(|_| repacked) {
                let name = format!("{q}/{}-batched-repacked", isa.name());
                let k = packed::Kernel::of(isa);
                g.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter(|| {
                        y.fill(0.0);
                        let tile = cflow::kernels::dot::Tile::body(q, TR, TC, body);
                        packed::tile_run_k_batch(k, tile, &xk, &mut y);
                        black_box(&y);
                    })
                });
            }
        }
    }
    g.finish();
}

/// `KBENCH_MIN=1 cargo bench --bench kernels`: instead of criterion, time every kernel many
/// times and print best-of-N and median GB/s. On a shared, loaded machine the best run is the
/// least disturbed one, so it is the more stable figure for comparing kernels.
fn min_of_n() {
    let shapes = [
        (QuantType::Q4_0, 2048, 2048),
        (QuantType::Q4_1, 2048, 2048),
        (QuantType::Q8_0, 2048, 2048),
        (QuantType::Q5_0, 2048, 2048),
        (QuantType::Q5_1, 2048, 2048),
        (QuantType::Q4_K, 2048, 2048),
        (QuantType::Q5_K, 2048, 2048),
        (QuantType::Q6_K, 2048, 2048),
        (QuantType::Q4_0, 128, 256),
        (QuantType::Q4_1, 128, 256),
        (QuantType::Q8_0, 128, 256),
        (QuantType::F16, 128, 256),
        (QuantType::F32, 128, 256),
        (QuantType::Q4_1, 1536, 576),
        (QuantType::Q8_0, 49152, 576),
        // MoE experts: `pull smollm2-moe` (160 units of 576: gate/up, and the down projection
        // 576 × 160, one partial chunk per row) and the Qwen3-30B-A3B geometry (768 of 2048).
        (QuantType::Q4_1, 160, 576),
        (QuantType::Q4_1, 576, 160),
        (QuantType::Q4_0, 768, 2048),
        (QuantType::Q4_0, 2048, 768),
    ];
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    println!(
        "{:<22} {:<14} {:>10} {:>10}",
        "shape", "path", "best GB/s", "med GB/s"
    );
    for (q, rows, cols) in shapes {
        let m = build(q, rows, cols);
        let mut s = cflow::rng::Rng::new(7);
        let x: Vec<f32> = (0..cols).map(|_| uniform(&mut s)).collect();
        let mut y = vec![0f32; rows];
        let mut xq = Q8Act::default();
        let bytes = q.matrix_bytes(rows, cols) as f64;
        let reps = ((2e9 / bytes) as usize).clamp(20, 20000);
        for isa in isas() {
            for int in [false, true] {
                if int && !q.is_blocked() {
                    continue;
                }
                let shape = format!("{q} {rows}x{cols}");
                let path = format!("{}-{}", isa.name(), if int { "int" } else { "f32" });
                if let Some(f) = &filter {
                    if !format!("{shape} {path}").contains(f.as_str()) {
                        continue;
                    }
                }
                let mut times = Vec::with_capacity(reps);
                for _ in 0..reps {
                    let t0 = std::time::Instant::now();
                    let a = if int { Some(&mut xq) } else { None };
                    matvec(isa, &m, black_box(&x), a, &mut y);
                    black_box(&y);
                    times.push(t0.elapsed().as_secs_f64());
                }
                times.sort_by(|a, b| a.partial_cmp(b).unwrap());
                println!(
                    "{:<22} {:<14} {:>10.2} {:>10.2}",
                    shape,
                    path,
                    bytes / times[0] / 1e9,
                    bytes / times[reps / 2] / 1e9
                );
            }
        }
    }
}

/// The gated FFN activations (`kernels::act`) over one token's widths: Gemma 3 270M's GELU
/// (2,048 per layer) and SmolLM2's SiLU (1,536), and the Q8 activation quantizer at SmolLM2's
/// widths, per ISA. Throughput in values per second.
fn activations(c: &mut Criterion) {
    use cflow::kernels::act::{gelu_mul, silu_mul};
    let mut g = c.benchmark_group("act");
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(300));
    for (name, n, gelu) in [("gelu", 2048usize, true), ("silu", 1536, false)] {
        let mut s = cflow::rng::Rng::new(7);
        let x: Vec<f32> = (0..n).map(|_| uniform(&mut s) * 4.0).collect();
        let u: Vec<f32> = (0..n).map(|_| uniform(&mut s)).collect();
        g.throughput(Throughput::Elements(n as u64));
        for isa in [Isa::Scalar, Isa::Avx2] {
            if !isa.available() {
                continue;
            }
            let id = format!("{name} {n} {isa:?}");
            let mut v = x.clone();
            g.bench_function(BenchmarkId::from_parameter(id), |b| {
                b.iter(|| {
                    v.copy_from_slice(&x);
                    if gelu {
                        gelu_mul(isa, black_box(&mut v), &u);
                    } else {
                        silu_mul(isa, black_box(&mut v), &u);
                    }
                })
            });
        }
    }
    // The Q8 activation quantizer (`quantize_act`) at SmolLM2's widths: prefill runs it on
    // every row of a batch before each matrix.
    for n in [576usize, 1536] {
        let mut s = cflow::rng::Rng::new(5);
        let x: Vec<f32> = (0..n).map(|_| uniform(&mut s) * 4.0).collect();
        g.throughput(Throughput::Elements(n as u64));
        for isa in [Isa::Scalar, Isa::Avx2] {
            if !isa.available() {
                continue;
            }
            let mut a = Q8Act::default();
            let id = format!("q8 {n} {isa:?}");
            g.bench_function(BenchmarkId::from_parameter(id), |b| {
                b.iter(|| quantize_act(isa, black_box(&x), &mut a))
            });
        }
    }
    g.finish();
}

/// The MoE router's logits (`kernels::router`) at a moefied SmolLM2's shape (8 experts × 576)
/// and a Qwen3-MoE's (128 × 2048): the scalar form and the dispatched one (AVX2 where present).
/// Throughput in router weights per second.
fn router(c: &mut Criterion) {
    use cflow::kernels::router::{logits, logits_scalar};
    let mut g = c.benchmark_group("router");
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(300));
    for (e, d) in [(8usize, 576usize), (128, 2048)] {
        let mut s = cflow::rng::Rng::new(11);
        let r: Vec<f32> = (0..e * d).map(|_| uniform(&mut s)).collect();
        let x: Vec<f32> = (0..d).map(|_| uniform(&mut s)).collect();
        let mut out = vec![0.0f32; e];
        g.throughput(Throughput::Elements((e * d) as u64));
        let avx2 = if Isa::Avx2.available() {
            "Avx2"
        } else {
            "Scalar"
        };
        for (name, f) in [
            ("Scalar", logits_scalar as fn(&[f32], &[f32], &mut [f32])),
            (avx2, logits),
        ] {
            let id = format!("{e}x{d} {name}");
            g.bench_function(BenchmarkId::from_parameter(id), |b| {
                b.iter(|| f(black_box(&r), black_box(&x), &mut out))
            });
        }
    }
    g.finish();
}

/// A model's attention geometry for one query at `pos` over positions `0..=pos`.
fn attn_shape(
    n_heads: usize,
    group: usize,
    hd: usize,
    pos: usize,
) -> cflow::kernels::attention::AttnShape {
    cflow::kernels::attention::AttnShape {
        n_heads,
        group,
        head_dim: hd,
        kv_dim: n_heads / group * hd,
        // Position-major rows, as the benchmark's buffers are filled.
        row_stride: n_heads / group * hd,
        head_stride: hd,
        start: 0,
        pos,
        scale: 1.0 / (hd as f32).sqrt(),
        cap: 0.0,
    }
}

fn attention(c: &mut Criterion) {
    use cflow::kernels::attention::attend;
    use cflow::kernels::pool::ThreadPool;
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let mut g = c.benchmark_group("attention");
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(300));
    for (name, n_heads, group, hd) in [("smollm2", 9, 3, 64), ("gemma3", 4, 4, 256)] {
        // 4096: decode at depth (the vs_llamacpp `depth` column), K/V rows past L2.
        for n in [128usize, 512, 4096] {
            let sh = attn_shape(n_heads, group, hd, n - 1);
            let mut s = cflow::rng::Rng::new(11);
            let q: Vec<f32> = (0..n_heads * hd).map(|_| uniform(&mut s)).collect();
            let k: Vec<f32> = (0..n * sh.kv_dim).map(|_| uniform(&mut s)).collect();
            let v: Vec<f32> = (0..n * sh.kv_dim).map(|_| uniform(&mut s)).collect();
            let k16: Vec<half::f16> = k.iter().map(|&x| half::f16::from_f32(x)).collect();
            let v16: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
            let mut att = vec![0f32; n_heads * hd];
            g.throughput(Throughput::Elements(n as u64));
            // Avx512: the AVX2 kernel built for AVX-512VL (32 vector registers), where the CPU
            // has VL; else the same AVX2 build as `Avx2`.
            for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
                if !isa.available() {
                    continue;
                }
                for pool in &pools {
                    let t = pool.threads();
                    let id = format!("{name} {n} {isa:?} {t}t f32");
                    g.bench_function(BenchmarkId::from_parameter(id), |b| {
                        b.iter(|| attend(pool, isa, &sh, &q, &k, &v, black_box(&mut att)))
                    });
                    let id = format!("{name} {n} {isa:?} {t}t f16");
                    g.bench_function(BenchmarkId::from_parameter(id), |b| {
                        b.iter(|| attend(pool, isa, &sh, &q, &k16, &v16, black_box(&mut att)))
                    });
                }
            }
        }
    }
    g.finish();
}

/// Prefill's attention: the 32 queries of one batch at positions 224..256 of SmolLM2's shape,
/// as 32 `attend` calls and as one `attend_batch` (all (position, head) pairs in one pool run),
/// on 1 and 2 threads.
fn attention_batch(c: &mut Criterion) {
    use cflow::kernels::attention::{attend, attend_batch, AttnShape};
    use cflow::kernels::pool::ThreadPool;
    let mut g = c.benchmark_group("attention_batch");
    g.measurement_time(Duration::from_secs(2));
    g.warm_up_time(Duration::from_millis(300));
    let (n_heads, group, hd, pos0, n) = (9, 3, 64, 224, 32);
    let sh = attn_shape(n_heads, group, hd, 0);
    let row = n_heads * hd;
    let mut s = cflow::rng::Rng::new(5);
    let q: Vec<f32> = (0..n * row).map(|_| uniform(&mut s)).collect();
    let k: Vec<f32> = (0..(pos0 + n) * sh.kv_dim)
        .map(|_| uniform(&mut s))
        .collect();
    let v: Vec<f32> = (0..(pos0 + n) * sh.kv_dim)
        .map(|_| uniform(&mut s))
        .collect();
    let mut att = vec![0f32; n * row];
    g.throughput(Throughput::Elements(n as u64));
    let isa = Isa::cached();
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        g.bench_function(
            BenchmarkId::from_parameter(format!("smollm2 per query t{threads}")),
            |b| {
                b.iter(|| {
                    for i in 0..n {
                        let one = AttnShape {
                            pos: pos0 + i,
                            ..sh
                        };
                        attend(&pool, isa, &one, &q[i * row..], &k, &v, &mut att[i * row..]);
                    }
                    black_box(&att);
                })
            },
        );
        for (name, bf16) in [("batch", false), ("batch-bf16", true)] {
            g.bench_function(
                BenchmarkId::from_parameter(format!("smollm2 {name} t{threads}")),
                |b| {
                    b.iter(|| {
                        attend_batch(
                            &pool,
                            isa,
                            &sh,
                            cflow::kernels::attention::Batch {
                                window: 0,
                                pos0,
                                n,
                                bf16,
                            },
                            &q,
                            cflow::kernels::attention::Kv { k: &k, v: &v },
                            black_box(&mut att),
                        )
                    })
                },
            );
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    kernels,
    smollm2,
    gemma3,
    single_tile,
    batched_tile,
    batched_kquant_tile,
    activations,
    router,
    attention,
    attention_batch
);

fn main() {
    if std::env::var_os("KBENCH_MIN").is_some() {
        min_of_n();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
