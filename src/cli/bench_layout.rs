//! `bench layout`: the paper's §5.4 tile-locality claim, tiled vs row-major matvec. Owns the
//! shapes (the four matrix groups of one layer at width `d`, dense hidden `dff`), the two
//! row-major baselines and the timing. The naive baseline is the paper's loop (row by row, f32
//! activation, dequantize and dot; [`naive_matvec`]) and its tiled arm also reads the f32
//! activation, so the two differ only in the order memory is touched and give bit-identical
//! outputs. The blocked baseline is today's faster row-major kernel (Q8 activation, 4 rows per
//! pass), compared with the tiled Q8 path.
//!
//! D1 read misses come from cachegrind (no hardware PMU in this VM): `benches/cachegrind_layout.sh`
//! runs one shape and one arm with `--iters 0` and `--iters 1 --warmup 0` and subtracts, so only
//! the matvec is counted.

use crate::format::reader::Matrix;
use crate::format::{EntryKind, MatrixData, TileHeader, TILE_COLS, TILE_ROWS};
use crate::kernels::matvec::{naive_matvec, rowmajor_matvec, tiled_matvec, Act};
use crate::kernels::pool::ThreadPool;
use crate::kernels::{Isa, Q8Act};
use crate::outln;
use crate::quant::{QuantType, QK};
use crate::rng::Rng;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use std::time::Instant;

/// Which row-major loop the tiled kernel is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Baseline {
    /// The paper's NaiveMatvec: row by row, f32 activation, dequantize and dot.
    Naive,
    /// Row-major but blocked: Q8 activation, 4 rows per kernel pass (our fast row-major path).
    Blocked,
}

/// One matrix group of a layer (matrices sharing one input).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Shape {
    /// W_down, d × dff (the paper's headline shape: 8192 × 32768).
    DenseDown,
    /// W_Q, W_K, W_V, each d × d.
    Qkv,
    /// W_gate and W_up, each dff × d.
    GateUp,
    /// One expert's gate and up, each (d/2) × d.
    Expert,
}

/// Which arm(s) to run; one arm alone is what cachegrind measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Arm {
    Tiled,
    Baseline,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  cflow-tui bench layout --baseline naive --shape dense-down --d 8192 --dff 32768\n  \
    benches/cachegrind_layout.sh dense-down 8192 32768   # simulated D1 read misses, tiled vs naive"
)]
pub struct LayoutArgs {
    /// Model width d (the paper's geometry: 8192).
    #[arg(long, default_value_t = 4096)]
    pub d: usize,
    /// Dense FFN hidden width (default 4·d; the paper's geometry: 32768).
    #[arg(long)]
    pub dff: Option<usize>,
    /// Row-major baseline: `naive` (the paper's loop, f32 activation on both arms) or
    /// `blocked` (Q8 activation, 4 rows per pass, on both arms).
    #[arg(long, value_enum, default_value_t = Baseline::Naive)]
    pub baseline: Baseline,
    /// Run one matrix group only (default: all four).
    #[arg(long, value_enum)]
    pub shape: Option<Shape>,
    /// Compute threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Kernel ISA.
    #[arg(long, value_enum, default_value_t = crate::cli::IsaArg::Auto)]
    pub isa: crate::cli::IsaArg,
    /// Timed iterations per shape and arm (median, min and max reported). 0 = set up only
    /// (the cachegrind subtraction run).
    #[arg(long, default_value_t = 7)]
    pub iters: usize,
    /// Untimed warm-up passes before the timed ones.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Run one arm only (for cachegrind).
    #[arg(long, value_enum)]
    pub only: Option<Arm>,
    /// Print one JSON object (see docs/JSON.md).
    #[arg(long)]
    pub json: bool,
}

/// Tiles `m` into a standalone buffer; returns the matrix view into `buf`.
pub fn tile(m: &MatrixData, kind: EntryKind, buf: &mut Vec<u8>) -> Matrix {
    let q = m.quant;
    let (rsb, rqb) = (m.row_scale_bytes(), m.row_quant_bytes());
    let mut mat = Matrix {
        kind,
        quant: q,
        rows: m.rows,
        cols: m.cols,
        stripes: Vec::new(),
        packed: false,
        kernel: crate::format::reader::KernelId::UNSET,
    };
    for s in 0..m.rows.div_ceil(TILE_ROWS) {
        mat.stripes.push(buf.len());
        let r0 = s * TILE_ROWS;
        let rows = mat.stripe_rows(s);
        for c in 0..mat.n_col_tiles() {
            let cols = mat.tile_cols(c);
            let c0 = c * TILE_COLS;
            let th = TileHeader {
                layer_id: 0,
                matrix_id: kind as u8,
                expert_id: crate::format::header::DENSE_EXPERT_ID,
                row_offset: r0 as u32,
                col_offset: c0 as u16,
                tile_rows: rows as u16,
                tile_cols: cols as u16,
                quant_group: q as u16,
            };
            buf.extend_from_slice(&th.encode());
            // Per-row byte counts of the tile layout (also right for the interleaved types,
            // whose blocks are 32 or 256 weights).
            let (sb, qb) = (q.row_scale_bytes(cols), q.row_quant_bytes(cols));
            let (so, qo) = (q.row_scale_bytes(c0), q.row_quant_bytes(c0));
            for r in r0..r0 + rows {
                buf.extend_from_slice(&m.scales[r * rsb + so..r * rsb + so + sb]);
            }
            for r in r0..r0 + rows {
                buf.extend_from_slice(&m.qs[r * rqb + qo..r * rqb + qo + qb]);
            }
        }
    }
    mat
}

/// A random matrix in the split row-major layout, written directly as quantized bytes (random
/// packed quants, per-block scales ≈ 1/(8·√cols)), so the paper's 8192 × 32768 geometry is set
/// up in well under a second natively and in reasonable time under cachegrind.
pub fn random_matrix(rng: &mut Rng, q: QuantType, rows: usize, cols: usize) -> MatrixData {
    let nb = cols / QK;
    let scale = 1.0 / (8.0 * (cols as f32).sqrt());
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let mut scales = Vec::with_capacity(rows * nb * q.scale_bytes_per_block());
    if q.is_blocked() {
        for _ in 0..rows * nb {
            scales.extend_from_slice(&f16(scale * (1.0 + 0.25 * rng.uniform())));
            if q == QuantType::Q4_1 {
                scales.extend_from_slice(&f16(-8.0 * scale * (1.0 + 0.25 * rng.uniform())));
            }
        }
    }
    // Packed quants only: the block scales live in `scales` (split layout).
    let n = if q.is_blocked() {
        rows * nb * q.quant_bytes_per_block()
    } else {
        q.matrix_bytes(rows, cols)
    };
    let mut qs = Vec::with_capacity(n);
    match q {
        QuantType::F32 => (0..rows * cols)
            .for_each(|_| qs.extend_from_slice(&(8.0 * scale * rng.uniform()).to_le_bytes())),
        QuantType::F16 => {
            (0..rows * cols).for_each(|_| qs.extend_from_slice(&f16(8.0 * scale * rng.uniform())))
        }
        _ => {
            while qs.len() < n {
                let w = rng.next_u64().to_le_bytes();
                qs.extend_from_slice(&w[..(n - qs.len()).min(8)]);
            }
        }
    }
    MatrixData {
        quant: q,
        rows,
        cols,
        scales,
        qs,
    }
}

/// The matrices of one shape at width `d` and dense hidden `dff`: (label, matrices).
fn shape_mats(rng: &mut Rng, s: Shape, d: usize, dff: usize) -> (String, Vec<MatrixData>) {
    let q = QuantType::Q4_0;
    let mut g = |rows, cols| random_matrix(rng, q, rows, cols);
    match s {
        Shape::DenseDown => (format!("dense-down {d}×{dff}"), vec![g(d, dff)]),
        Shape::Qkv => (
            format!("attn Q/K/V 3×{d}×{d}"),
            vec![g(d, d), g(d, d), g(d, d)],
        ),
        Shape::GateUp => (format!("gate-up 2×{dff}×{d}"), vec![g(dff, d), g(dff, d)]),
        Shape::Expert => (
            format!("expert gate-up 2×{}×{d}", d / 2),
            vec![g(d / 2, d), g(d / 2, d)],
        ),
    }
}

/// Median, min and max (ms) of a sample; None when it is empty.
fn summary(v: &[f64]) -> Option<(f64, f64, f64)> {
    let med = crate::stats::median(v.iter().copied())?;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    Some((med, min, max))
}

/// Times the enabled arms alternately (A B A B …, `iters` rounds after `warmup` untimed ones),
/// so drift in the machine's load lands on both arms alike. Returns each arm's (median, min,
/// max) in ms, None for an arm that did not run.
type Run<'a> = Option<&'a mut dyn FnMut()>;
/// Per arm: (median, min, max) ms, and every timed iteration's ms in order.
type ArmTimes = ([Option<(f64, f64, f64)>; 2], [Vec<f64>; 2]);

fn time_ab<'a>(warmup: usize, iters: usize, mut a: Run<'a>, mut b: Run<'a>) -> ArmTimes {
    // `--iters 0` sets up only: no warm-up either, so cachegrind can subtract it.
    let warm = if iters > 0 { warmup } else { 0 };
    let mut v = [Vec::with_capacity(iters), Vec::with_capacity(iters)];
    for round in 0..warm + iters {
        for (i, f) in [&mut a, &mut b].into_iter().enumerate() {
            if let Some(f) = f {
                let t = Instant::now();
                f();
                if round >= warm {
                    v[i].push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
    }
    ([summary(&v[0]), summary(&v[1])], v)
}

pub fn layout(a: &LayoutArgs, isa: Isa) -> Result<()> {
    let d = a.d;
    let dff = a.dff.unwrap_or(4 * d);
    if d == 0 || !d.is_multiple_of(256) || d > 16384 {
        bail!("--d must be a positive multiple of 256, at most 16384");
    }
    if dff == 0 || !dff.is_multiple_of(256) || dff > 65536 {
        bail!("--dff must be a positive multiple of 256, at most 65536");
    }
    let pool = ThreadPool::new(a.threads.max(1));
    let mut rng = Rng::new(1);
    let shapes: Vec<Shape> = match a.shape {
        Some(s) => vec![s],
        None => vec![Shape::DenseDown, Shape::Qkv, Shape::GateUp, Shape::Expert],
    };
    let run_tiled = a.only != Some(Arm::Baseline);
    let run_base = a.only != Some(Arm::Tiled);
    let q8 = a.baseline == Baseline::Blocked;
    let mut rows = Vec::new();
    for &shape in &shapes {
        let (name, ms) = shape_mats(&mut rng, shape, d, dff);
        let mut buf = Vec::new();
        let mats: Vec<Matrix> = ms
            .iter()
            .map(|m| tile(m, EntryKind::Gate, &mut buf))
            .collect();
        let cols = ms[0].cols;
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 31 % 97) as f32 - 48.0) / 97.0)
            .collect();
        let mut xq = Q8Act::default();
        if q8 {
            xq.quantize_from(&x);
        }
        let act = Act {
            x: &x,
            q8: q8.then_some(&xq),
        };
        let mut yt: Vec<Vec<f32>> = ms.iter().map(|m| vec![0.0; m.rows]).collect();
        let mut yb = yt.clone();
        let mut tiled_run = || {
            let mut outs: Vec<(&Matrix, &mut [f32])> = mats
                .iter()
                .zip(yt.iter_mut())
                .map(|(m, y)| (m, y.as_mut_slice()))
                .collect();
            tiled_matvec(&pool, isa, &buf, &mut outs, &act);
        };
        let mut base_run = || {
            for (m, y) in ms.iter().zip(yb.iter_mut()) {
                match a.baseline {
                    Baseline::Naive => naive_matvec(&pool, isa, m, &x, y),
                    Baseline::Blocked => rowmajor_matvec(&pool, isa, m, &act, y),
                }
            }
        };
        let ([tiled, base], [tiled_runs, base_runs]) = time_ab(
            a.warmup,
            a.iters,
            run_tiled.then_some(&mut tiled_run as &mut dyn FnMut()),
            run_base.then_some(&mut base_run as &mut dyn FnMut()),
        );
        // Only meaningful when both arms ran at least once.
        let identical = (tiled.is_some() && base.is_some()).then(|| yt == yb);
        let mib = ms.iter().map(|m| m.bytes()).sum::<usize>() as f64 / 1048576.0;
        let t3 = |t: Option<(f64, f64, f64)>| {
            t.map(|(m, lo, hi)| serde_json::json!({"median": m, "min": lo, "max": hi}))
        };
        let ratio = match (tiled, base) {
            (Some(t), Some(b)) if t.0 > 0.0 => Some(b.0 / t.0),
            _ => None,
        };
        rows.push(
            serde_json::json!({"shape": name, "weights_mib_with_scales": mib,
            "tiled_ms": t3(tiled), "baseline_ms": t3(base), "baseline_over_tiled": ratio,
            "tiled_runs_ms": tiled_runs, "baseline_runs_ms": base_runs,
            "identical": identical}),
        );
    }
    let act = if q8 { "q8" } else { "f32" };
    let base = match a.baseline {
        Baseline::Naive => "naive",
        Baseline::Blocked => "blocked",
    };
    if a.json {
        outln!(
            "{}",
            serde_json::json!({"d": d, "dff": dff, "threads": a.threads, "iters": a.iters,
                "quant": "q4_0", "baseline": base, "act": act, "isa": isa.name(), "rows": rows})
        )?;
        return Ok(());
    }
    outln!(
        "d = {d}, dff = {dff}, Q4_0 weights (MiB w+sc = weights with block scales), {act} activation on both arms, baseline {base}, \
         threads {}, {} timed iterations per arm, arms alternated (median [min–max]); paper §5.4: 1.12–1.36× wall clock, \
         7.29× fewer L1-d read misses (PMU) against its naive loop",
        a.threads, a.iters
    )?;
    outln!(
        "{:<26} | {:>8} | {:>24} | {:>24} | {:>10} | {:>9}",
        "shape",
        "MiB w+sc",
        "tiled ms",
        format!("{base} ms"),
        format!("{base}/tiled"),
        "identical"
    )?;
    let cell = |v: &serde_json::Value| -> String {
        if v.is_null() {
            return "—".into();
        }
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        format!("{:.3} [{:.3}–{:.3}]", f("median"), f("min"), f("max"))
    };
    for r in &rows {
        outln!(
            "{:<26} | {:>8.1} | {:>24} | {:>24} | {:>10} | {:>9}",
            r["shape"].as_str().unwrap_or(""),
            r["weights_mib_with_scales"].as_f64().unwrap_or(0.0),
            cell(&r["tiled_ms"]),
            cell(&r["baseline_ms"]),
            r["baseline_over_tiled"]
                .as_f64()
                .map_or("—".into(), |v| format!("{v:.3}×")),
            r["identical"]
                .as_bool()
                .map_or("—".into(), |b| b.to_string())
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn isas() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.available())
            .collect()
    }

    /// The naive loop and the tiled kernel with an f32 activation do the same arithmetic, so
    /// their outputs are bit-identical for every type, ISA and ragged shape.
    #[test]
    fn naive_matches_tiled_bit_for_bit() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(7);
        for q in [
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::F16,
            QuantType::F32,
        ] {
            for (rows, cols) in [(1, 32), (130, 288), (257, 544), (128, 256)] {
                let m = random_matrix(&mut rng, q, rows, cols);
                let mut buf = Vec::new();
                let t = tile(&m, EntryKind::Gate, &mut buf);
                let x = rng.fill(cols, 1.0);
                for isa in isas() {
                    let mut yt = vec![0.0; rows];
                    let mut outs = [(&t, yt.as_mut_slice())];
                    tiled_matvec(&pool, isa, &buf, &mut outs, &Act { x: &x, q8: None });
                    let mut yn = vec![f32::NAN; rows];
                    naive_matvec(&pool, isa, &m, &x, &mut yn);
                    assert_eq!(yt, yn, "{q} {rows}×{cols} {}", isa.name());
                    // and both agree with a float64 dequantize-and-dot
                    let w = m.dequantize();
                    for r in 0..rows {
                        let exact: f64 = (0..cols)
                            .map(|c| w[r * cols + c] as f64 * x[c] as f64)
                            .sum();
                        let tol = 1e-4 * (1.0 + exact.abs());
                        assert!((yn[r] as f64 - exact).abs() < tol, "{q} row {r}");
                    }
                }
            }
        }
    }

    #[test]
    fn shapes_have_the_papers_geometry() {
        let mut rng = Rng::new(1);
        let (_, m) = shape_mats(&mut rng, Shape::DenseDown, 256, 1024);
        assert_eq!((m[0].rows, m[0].cols), (256, 1024));
        // Q4_0 with scales: 18 bytes per 32 weights, split into 2 of scale and 16 of quants.
        assert_eq!(m[0].bytes(), 256 * 1024 / 32 * 18);
        assert_eq!(m[0].qs.len(), 256 * m[0].row_quant_bytes());
        let (_, m) = shape_mats(&mut rng, Shape::GateUp, 256, 1024);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].rows, m[0].cols), (1024, 256));
        let (_, m) = shape_mats(&mut rng, Shape::Expert, 256, 1024);
        assert_eq!((m[0].rows, m[0].cols), (128, 256));
    }

    #[test]
    fn arms_alternate_and_zero_iterations_run_nothing() {
        let log = std::cell::RefCell::new(Vec::new());
        let (mut fa, mut fb) = (|| log.borrow_mut().push('A'), || log.borrow_mut().push('B'));
        let (r, v) = time_ab(1, 0, Some(&mut fa), Some(&mut fb));
        assert!(r[0].is_none() && r[1].is_none() && log.borrow().is_empty());
        assert!(v[0].is_empty() && v[1].is_empty());
        let (r, v) = time_ab(1, 2, Some(&mut fa), Some(&mut fb));
        assert!(r[0].is_some() && r[1].is_some());
        assert_eq!((v[0].len(), v[1].len()), (2, 2), "the warm-up is not kept");
        assert_eq!(log.borrow().iter().collect::<String>(), "ABABAB");
        let (r, v) = time_ab(0, 2, None, Some(&mut fb));
        assert!(r[0].is_none() && r[1].is_some() && v[0].is_empty());
    }
}
