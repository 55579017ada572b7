//! The matvecs of one decode token and nothing else: opens a `.cflow` model resident (repacked
//! unless `REPACK=0`), then repeats the token's matvec calls in decode order (fused Q/K/V, O,
//! fused gate/up, down per layer, then the LM head) on a fixed activation, with the pool of
//! `THREADS` threads (default 2). Prints the weight bytes per pass and GB/s per call kind:
//! the ceiling decode could reach if the serial work between the calls (norms, RoPE,
//! attention, SwiGLU, sampling) cost nothing. Dense models only.
//!
//! `READ=1` replaces the kernels with a plain read of each stripe's bytes (one pool task per
//! stripe), `READ=3` reads each call's byte range in one contiguous share per thread, and
//! `READ=2` the whole file in one share per thread per pass: what the memory gives to the same
//! bytes without compute, under three access patterns (docs/PERFORMANCE.md, "Where the time goes").
//! `READ=4` runs the kernels again, but a whole pass in one pool run: each thread computes a
//! fixed contiguous share of every call's stripes and never waits for the other between calls
//! (the kernels' ceiling without the per-call hand-offs and imbalance; outputs are discarded).
//! `READ=5` reads like `READ=3` (one share per thread per call, a pool run per call) as if the
//! copy were laid out thread-major: each thread's shares of consecutive calls lie one after
//! another in its own part of the copy, so its stream runs on across the calls' barriers (the
//! bytes read are the copy's, in those places; docs/PERFORMANCE.md, "Where the time goes").
//!
//! `PF=0` turns the kernels' own prefetch hints off (`kernels::prefetch::set_kernel`); by
//! default every family issues them.
//!
//! `cargo run --release --example model_stream -- MODEL.cflow [PASSES]`

use cflow::format::reader::Matrix;
use cflow::format::CflowFile;
use cflow::kernels::matvec::{tiled_matvec, Act};
use cflow::kernels::pool::ThreadPool;
use cflow::kernels::{Isa, Q8Act};
use cflow::quant::QuantType;
use std::time::Instant;

/// `println!` that stops quietly when stdout is closed (e.g. piped into `head`).
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write;
        if writeln!(std::io::stdout(), $($t)*).is_err() {
            std::process::exit(0);
        }
    }};
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: model_stream MODEL.cflow [PASSES]");
        std::process::exit(2);
    };
    let passes: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(200);
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let threads = env("THREADS", 2);
    let repack = env("REPACK", 1) == 1;
    let read_only = matches!(env("READ", 0), 1 | 3);
    let halves = env("READ", 0) == 3;
    if env("PF", 1) == 0 {
        cflow::kernels::prefetch::set_kernel(cflow::kernels::prefetch::KernelPrefetch::NONE);
    }
    let mut f = CflowFile::open(std::path::Path::new(path)).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1);
    });
    let isa = Isa::detect();
    // The types the engine repacks: Q5_0, Q4_K and Q6_K too where their VNNI kernels run.
    let types = if repack {
        cflow::kernels::dot::packed::repack_for(isa)
    } else {
        Default::default()
    };
    f.make_resident(types).expect("resident copy");
    let pool = ThreadPool::new(threads);
    let lv0 = &f.layers[0];
    // The inputs of Q/K/V and gate/up (d_model), of O (the heads' width, which Gemma 3's
    // differs from d_model) and of down (d_ff).
    let (d, od, ff) = (
        lv0.q.cols,
        lv0.o.cols,
        lv0.down.as_ref().expect("dense").cols,
    );
    // Each input quantized in the forms its readers take (Q8_0 blocks, and Q8_K super-blocks
    // where a K-quant reads it), as the engine's `Q8Act::quantize_for` does; with Q8 blocks
    // alone a K-quant matrix would run its f32 path.
    let act_of = |n: usize, readers: &[QuantType]| {
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 31 % 97) as f32 - 48.0) / 97.0)
            .collect();
        let mut q = Q8Act::default();
        q.quantize_for(&x, readers.iter().copied());
        (x, q)
    };
    let (mut on_d, mut on_o, mut on_f) = (vec![f.lm_head().quant], Vec::new(), Vec::new());
    for lv in &f.layers {
        let q = |m: &Option<Matrix>| m.as_ref().expect("dense").quant;
        on_d.extend([lv.q.quant, lv.k.quant, lv.v.quant, q(&lv.gate), q(&lv.up)]);
        on_o.push(lv.o.quant);
        on_f.push(q(&lv.down));
    }
    let (xd, qd) = act_of(d, &on_d);
    let (xo, qo) = act_of(od, &on_o);
    let (xf, qf) = act_of(ff, &on_f);
    let ad = Act {
        x: &xd,
        q8: Some(&qd),
    };
    let ao = Act {
        x: &xo,
        q8: Some(&qo),
    };
    let af = Act {
        x: &xf,
        q8: Some(&qf),
    };
    let mut bufs: Vec<Vec<f32>> = (0..7).map(|_| Vec::new()).collect();
    let bytes = f.bytes();
    // kind → (seconds, bytes)
    let mut t = [(0f64, 0usize); 5];
    let names = ["q/k/v", "o", "gate/up", "down", "lm head"];
    let thread_major = env("READ", 0) == 5;
    // READ=5: where each thread's next share starts, in its part of the copy.
    let cursor = std::cell::Cell::new(0usize);
    let call =
        |t: &mut [(f64, usize); 5], k: usize, outs: &mut [(&Matrix, &mut [f32])], act: &Act| {
            let b: usize = outs.iter().map(|(m, _)| m.bytes()).sum();
            let s = Instant::now();
            if thread_major {
                let n = pool.threads();
                let (len, part) = (b / n / 64 * 64, bytes.len() / n / 64 * 64);
                let mut c = cursor.get();
                if c + len > part {
                    c = 0;
                }
                pool.run(n, &|i| {
                    let a = i * part + c;
                    std::hint::black_box(read_sum(&bytes[a..a + len]));
                });
                cursor.set(c + len);
            } else if read_only {
                // The same stripes, each read as one contiguous range without the kernel.
                let ranges: Vec<(usize, usize)> = outs
                    .iter()
                    .flat_map(|(m, _)| {
                        (0..m.n_stripes()).map(|st| {
                            let a = m.tile_offset(st, 0);
                            let last = m.n_col_tiles() - 1;
                            let end = m.tile_offset(st, last)
                                + cflow::format::TileHeader::SIZE
                                + m.quant.matrix_bytes(m.stripe_rows(st), m.tile_cols(last));
                            (a, end)
                        })
                    })
                    .collect();
                if halves {
                    // The call's whole byte range in one contiguous share per thread.
                    let a = ranges.iter().map(|r| r.0).min().unwrap();
                    let e = ranges.iter().map(|r| r.1).max().unwrap();
                    let n = pool.threads();
                    let share = (e - a) / n / 64 * 64;
                    pool.run(n, &|i| {
                        let end = if i + 1 == n { e } else { a + (i + 1) * share };
                        std::hint::black_box(read_sum(&bytes[a + i * share..end]));
                    });
                } else {
                    pool.run(ranges.len(), &|i| {
                        let (a, e) = ranges[i];
                        std::hint::black_box(read_sum(&bytes[a..e]));
                    });
                }
            } else {
                tiled_matvec(&pool, isa, bytes, outs, act);
            }
            t[k].0 += s.elapsed().as_secs_f64();
            t[k].1 += b;
        };
    if env("READ", 0) == 4 {
        // The kernels over every call of a pass in one pool run: each thread takes a contiguous
        // half (third, …) of each call's stripes and never waits for the other between calls.
        // The ceiling of the kernels on this memory without the per-call hand-offs.
        let n = pool.threads();
        let mut calls: Vec<(&Matrix, &Act)> = Vec::new();
        for lv in &f.layers {
            calls.extend([(&lv.q, &ad), (&lv.k, &ad), (&lv.v, &ad), (&lv.o, &ao)]);
            calls.push((lv.gate.as_ref().expect("dense"), &ad));
            calls.push((lv.up.as_ref().expect("dense"), &ad));
            calls.push((lv.down.as_ref().expect("dense"), &af));
        }
        calls.push((f.lm_head(), &ad));
        let total: usize = calls.iter().map(|(m, _)| m.bytes()).sum();
        let s = Instant::now();
        for _ in 0..passes {
            pool.run(n, &|i| {
                let mut out = vec![0f32; 128];
                for (m, a) in &calls {
                    let ns = m.n_stripes();
                    for st in ns * i / n..ns * (i + 1) / n {
                        let o = &mut out[..m.stripe_rows(st)];
                        cflow::kernels::matvec::stripe_matvec(isa, bytes, m, st, a, o);
                    }
                }
                std::hint::black_box(&out);
            });
        }
        let dt = s.elapsed().as_secs_f64();
        out!(
            "kernels, one pool run per pass: {:.2} MB/pass {:.2} GB/s",
            total as f64 / 1e6,
            (total * passes) as f64 / dt / 1e9
        );
        return;
    }
    if env("READ", 0) == 2 {
        // The whole file in one run per pass, each thread one contiguous share (as `membw`).
        let n = pool.threads();
        let share = bytes.len() / n / 64 * 64;
        let s = Instant::now();
        for _ in 0..passes {
            pool.run(n, &|i| {
                let e = if i + 1 == n {
                    bytes.len()
                } else {
                    (i + 1) * share
                };
                std::hint::black_box(read_sum(&bytes[i * share..e]));
            });
        }
        let dt = s.elapsed().as_secs_f64();
        out!(
            "whole file, {n} contiguous shares: {:.2} MB/pass {:.2} GB/s",
            bytes.len() as f64 / 1e6,
            (bytes.len() * passes) as f64 / dt / 1e9
        );
        return;
    }
    for pass in 0..passes + 5 {
        if pass == 5 {
            t = [(0.0, 0); 5];
        }
        for lv in &f.layers {
            let [q, k, v, o, g, u, dn] = &mut bufs[..] else {
                unreachable!()
            };
            q.resize(lv.q.rows, 0.0);
            k.resize(lv.k.rows, 0.0);
            v.resize(lv.v.rows, 0.0);
            o.resize(lv.o.rows, 0.0);
            call(&mut t, 0, &mut [(&lv.q, q), (&lv.k, k), (&lv.v, v)], &ad);
            call(&mut t, 1, &mut [(&lv.o, o)], &ao);
            let (gm, um, dm) = (
                lv.gate.as_ref().expect("dense"),
                lv.up.as_ref().expect("dense"),
                lv.down.as_ref().expect("dense"),
            );
            g.resize(gm.rows, 0.0);
            u.resize(um.rows, 0.0);
            dn.resize(dm.rows, 0.0);
            call(&mut t, 2, &mut [(gm, g), (um, u)], &ad);
            call(&mut t, 3, &mut [(dm, dn)], &af);
        }
        let lm = f.lm_head();
        let mut logits = vec![0f32; lm.rows];
        call(&mut t, 4, &mut [(lm, &mut logits)], &ad);
    }
    let total_s: f64 = t.iter().map(|x| x.0).sum();
    let total_b: usize = t.iter().map(|x| x.1).sum();
    out!(
        "{path}: {threads} thread(s), repacked {}, {:.2} MB/pass, {:.3} ms/pass, {:.2} GB/s",
        f.is_repacked(),
        total_b as f64 / passes as f64 / 1e6,
        total_s / passes as f64 * 1e3,
        total_b as f64 / total_s / 1e9
    );
    for (n, (s, b)) in names.iter().zip(t) {
        out!(
            "  {n:8} {:8.1} us/pass {:7.2} MB/pass {:6.2} GB/s",
            s / passes as f64 * 1e6,
            b as f64 / passes as f64 / 1e6,
            b as f64 / s / 1e9
        );
    }
}

/// Sum of the 8-byte words of `b`, 8 independent sums (a plain read at the memory's speed).
fn read_sum(b: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    let chunks = b.chunks_exact(64);
    for c in chunks {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = a.wrapping_add(u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().unwrap()));
        }
    }
    acc.iter().fold(0, |x, y| x.wrapping_add(*y))
}
