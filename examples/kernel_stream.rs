//! Wall-clock GB/s of one tile kernel, in cache vs streamed from DRAM: runs `tile_matvec_act` on
//! one 128×256 tile of TYPE repeatedly (the tile stays in L1/L2: the kernel's compute ceiling),
//! then over MIB MiB of distinct copies of that tile laid out back to back (each tile's scales
//! then quants, as in a `.cflow` stripe: DRAM streaming). If streaming is much slower than in
//! cache, the kernel waits on memory; if both are alike, it is bound by its own instructions.
//!
//! Also prints a plain read of the same buffer (the ceiling `membw` measures). Environment:
//! `REPACK=1` runs the tile in the repacked layout of a resident copy with the repacked kernels
//! (Q4_0, Q4_1, Q8_0, Q5_0, Q4_K, Q6_K). `COLS=128` makes the tile 128 columns wide (as the last tile of a 640-wide row), `THREADS=n` streams with n threads (static halves), `FILE=path` streams over a read-only
//! mapping of that file instead of anonymous memory, `HUGE=1` asks for transparent huge pages.
//!
//! `cargo run --release --example kernel_stream -- Q8_0 512`

use cflow::kernels::dot::kquant::tile_matvec_act;
use cflow::kernels::dot::packed;
use cflow::kernels::dot::Isa;
use cflow::quant::packed::{pack_tile, packable};
use cflow::quant::QuantType;
use std::hint::black_box;
use std::time::Instant;

#[path = "support/tile.rs"]
mod tile;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(name), Some(mib)) = (
        args.get(1),
        args.get(2).and_then(|s| s.parse::<usize>().ok()),
    ) else {
        eprintln!("usage: kernel_stream TYPE MIB");
        std::process::exit(2);
    };
    let q = QuantType::parse(name).unwrap_or_else(|| {
        eprintln!("unknown type {name}");
        std::process::exit(2);
    });
    let rows = 128;
    let cols: usize = std::env::var("COLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let tile::TestTile {
        scales,
        qs,
        x,
        act: a,
    } = tile::make(q, rows, cols);
    // REPACK=1: the tile in the resident copy's repacked records (`quant::packed`), run by the
    // repacked kernels (`dot::packed`) as decode runs them.
    let repack = std::env::var("REPACK").is_ok_and(|v| v == "1");
    if repack && !(packable(q, rows) && packed::repack_for(Isa::cached()).includes(q)) {
        eprintln!("{q} has no repacked layout on this CPU (Q4_0/Q4_1/Q8_0 always; Q5_0/Q4_K/Q6_K where their AVX-512 VNNI kernels run)");
        std::process::exit(2);
    }
    let (scales, qs) = if repack {
        let mut body = [scales, qs].concat();
        pack_tile(q, rows, cols, &mut body);
        (Vec::new(), body)
    } else {
        (scales, qs)
    };
    let (sl, ql) = (scales.len(), qs.len());
    let tile = sl + ql;
    let n = (mib << 20) / tile;
    let huge = std::env::var("HUGE").is_ok_and(|v| v == "1");
    // FILE=path: stream over that file's pages instead (a read-only file mapping, as the engine
    // reads a model; the bytes are whatever the file holds, which only the timing cares about).
    let file_map = std::env::var("FILE").ok().map(|p| {
        let f = std::fs::File::open(&p).expect("open FILE");
        // SAFETY: a read-only mapping of a file nobody writes during the run.
        let m = unsafe { memmap2::Mmap::map(&f) }.expect("map FILE");
        if huge {
            m.advise(memmap2::Advice::HugePage).expect("madvise");
        }
        m
    });
    let n = file_map.as_ref().map_or(n, |m| m.len() / tile);
    let mut anon =
        memmap2::MmapMut::map_anon(if file_map.is_some() { 8 } else { n * tile }).expect("map");
    if file_map.is_none() {
        if huge {
            anon.advise(memmap2::Advice::HugePage).expect("madvise");
        }
        for t in 0..n {
            anon[t * tile..t * tile + sl].copy_from_slice(&scales);
            anon[t * tile + sl..(t + 1) * tile].copy_from_slice(&qs);
        }
    }
    let big: &[u8] = match &file_map {
        Some(m) => &m[..n * tile],
        None => &anon[..],
    };
    let isa = Isa::cached();
    let kernel = packed::Kernel::of(isa);
    let mut y = vec![0f32; rows];
    let run = |t: usize, y: &mut [f32]| {
        let b = &big[t * tile..(t + 1) * tile];
        if repack {
            let body = cflow::kernels::dot::Tile::body(q, rows, cols, b);
            if q.is_k() {
                packed::tile_run_k(kernel, body, &[], a.k.slice(0, cols), y);
            } else {
                packed::tile_run(kernel, body, &[], Some(a.tile_slice(0, cols)), y);
            }
            black_box(y);
            return;
        }
        tile_matvec_act(
            isa,
            cflow::kernels::dot::Tile::split(q, rows, cols, &b[..sl], &b[sl..]),
            &x,
            Some(&a),
            0,
            y,
        );
        black_box(y);
    };
    // The read ceiling of this buffer: a plain sum of its words (what `membw` measures).
    let words: &[u64] = bytemuck_words(big);
    for _ in 0..2 {
        let t0 = Instant::now();
        let mut acc = [0u64; 4];
        for c in words.chunks_exact(4) {
            for j in 0..4 {
                acc[j] = acc[j].wrapping_add(c[j]);
            }
        }
        black_box(acc);
        let s = t0.elapsed().as_secs_f64();
        println!(
            "plain read of the same buffer: {:.2} GB/s",
            (n * tile) as f64 / 1e9 / s
        );
    }
    for _ in 0..3 {
        let t0 = Instant::now();
        for _ in 0..n {
            run(0, &mut y);
        }
        let hot = t0.elapsed().as_secs_f64();
        let threads: usize = std::env::var("THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let t0 = Instant::now();
        std::thread::scope(|sc| {
            for k in 0..threads {
                let run = &run;
                sc.spawn(move || {
                    let mut y = vec![0f32; rows];
                    for t in (k * n / threads)..((k + 1) * n / threads) {
                        run(t, &mut y);
                    }
                });
            }
        });
        let cold = t0.elapsed().as_secs_f64();
        let gb = (n * tile) as f64 / 1e9;
        println!(
            "{q} on {}: {n} tiles ({:.0} MiB): in cache {:.2} GB/s, streamed {:.2} GB/s",
            isa.name(),
            (n * tile) as f64 / (1 << 20) as f64,
            gb / hot,
            gb / cold
        );
    }
}

/// The buffer as u64 words (its length is rounded down to whole words).
fn bytemuck_words(b: &[u8]) -> &[u64] {
    let n = b.len() / 8;
    assert_eq!(b.as_ptr() as usize % 8, 0, "mmap is page aligned");
    // SAFETY: the pointer is 8-byte aligned (page-aligned mmap), `n * 8 <= b.len()`, any bit
    // pattern is a valid u64, and the borrow keeps `b` alive and unmodified.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u64, n) }
}
