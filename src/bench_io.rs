//! The I/O and layout benchmarks: `bench overlap` (sync vs staged expert fetch on the direct tier,
//! paper §5.14), `bench layout` (tiled vs row-major matvec, §5.4) and `bench prefetch` (decode
//! with the PREFETCHT0 thread on vs off, §5.8).
//!
//! Cachegrind recipe for the layout claim (D1 read misses, tiled vs row-major):
//!
//! ```text
//! cargo build --release
//! valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file=cg.tiled \
//!     target/release/cflow-tui bench layout --d 1024 --iters 3 --only tiled --threads 1
//! valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file=cg.rowmajor \
//!     target/release/cflow-tui bench layout --d 1024 --iters 3 --only rowmajor --threads 1
//! cg_annotate cg.tiled | head -20; cg_annotate cg.rowmajor | head -20   # compare D1mr
//! ```
//! (Both runs include the identical quantization setup; subtract a `--iters 0` run to isolate the
//! matvecs.)

use crate::convert::generate::{generate, GenSpec, Rng};
use crate::engine::{Engine, EngineOptions};
use crate::format::reader::Matrix;
use crate::format::{CflowFile, EntryKind, MatrixData, TileHeader, TILE_COLS, TILE_ROWS};
use crate::io::{ExpertTier, FetchMode};
use crate::kernels::matvec::{rowmajor_matvec, tiled_matvec, Act};
use crate::kernels::pool::ThreadPool;
use crate::kernels::{Isa, Q8Act};
use crate::quant::{QuantType, QK};
use crate::{errln, outln};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Median of a bench's samples (0 when there are none), from the one home of the statistic.
fn median(v: &[f64]) -> f64 {
    crate::stats::median(v.iter().copied()).unwrap_or(0.0)
}

/// How the overlap bench started cold: what it evicted, and the model file's page-cache
/// residency after that (measured with `mincore`).
fn make_cold(path: &Path, drop_all: bool) -> Result<serde_json::Value> {
    let how = if drop_all {
        // Announced before it happens: this empties the page cache of the whole machine.
        errln!("--drop-caches: syncing and writing 1 to /proc/sys/vm/drop_caches (the whole machine's page cache)");
        let _ = std::process::Command::new("sync").status();
        std::fs::write("/proc/sys/vm/drop_caches", "1")
            .context("--drop-caches: writing /proc/sys/vm/drop_caches (needs root)")?;
        "drop_caches (whole machine)"
    } else {
        crate::io::page_cache::evict(path)
            .with_context(|| format!("evicting {} from the page cache", path.display()))?;
        "posix_fadvise(DONTNEED) on the model file only"
    };
    let resident = crate::io::page_cache::resident_fraction(path).ok();
    Ok(serde_json::json!({"method": how, "model_resident_pct": resident.map(|r| r * 100.0)}))
}

#[derive(Args, Debug)]
pub struct OverlapArgs {
    /// Model (default: a generated MoE sized so expert reads matter, cached).
    pub model: Option<PathBuf>,
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    #[arg(long, default_value_t = 16)]
    pub tokens: usize,
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Reader threads.
    #[arg(long, default_value_t = 2)]
    pub readers: usize,
    /// Empty the whole machine's page cache first (writes /proc/sys/vm/drop_caches; root
    /// only, affects every process). Without it only the model file's pages are evicted
    /// (posix_fadvise DONTNEED); the experts are read with O_DIRECT either way.
    #[arg(long)]
    pub drop_caches: bool,
    #[arg(long)]
    pub json: bool,
}

/// The default overlap model: arch2_4_combined, d=2048, 8 layers, expert_ffn 4096, vocab 4096
/// (a `crate::cache` entry: locked while generated, reused only while its hash matches).
pub fn overlap_model() -> Result<PathBuf> {
    let p = crate::util::cache_dir()?.join("bench-overlap-arch2_4-d2048-l8-e4096-v1.cflow");
    crate::cache::ensure(
        &p,
        "the overlap bench model",
        &mut |m| errln!("{m}"),
        |p, _| {
            errln!("generating the overlap bench model into {}", p.display());
            let mut s = GenSpec::new("arch2_4_combined");
            s.hidden = Some(2048);
            s.layers = Some(8);
            s.heads = Some(16);
            s.expert_ffn = Some(4096);
            s.ffn = Some(4096);
            s.vocab = Some(4096);
            generate(&s, p, |_, _| {})?;
            Ok(())
        },
    )
}

struct ArmResult {
    ms_tok: f64,
    c_layer_ms: f64,
    io_layer_ms: f64,
    wait_layer_ms: f64,
}

fn run_arm(e: &mut Engine, tokens: usize) -> ArmResult {
    e.reset();
    let vocab = e.cfg().vocab as u32;
    let (mut c, mut io, mut w, mut n) = (0u64, 0u64, 0u64, 0u64);
    let t0 = Instant::now();
    for i in 0..tokens {
        let tok = (i as u32 * 7919 + 13) % vocab;
        if e.step(tok, true).is_err() {
            break;
        }
        for l in &e.stats().layers {
            if let Some(x) = l.io {
                c += x.compute_ns;
                io += x.io_ns;
                w += x.wait_ns;
                n += 1;
            }
        }
    }
    let el = t0.elapsed().as_secs_f64() * 1e3;
    let n = n.max(1) as f64;
    ArmResult {
        ms_tok: el / tokens.max(1) as f64,
        c_layer_ms: c as f64 / n / 1e6,
        io_layer_ms: io as f64 / n / 1e6,
        wait_layer_ms: w as f64 / n / 1e6,
    }
}

pub fn overlap(a: &OverlapArgs, base: EngineOptions) -> Result<()> {
    if a.tokens == 0 || a.repeat == 0 || a.threads.is_empty() {
        bail!("--tokens, --repeat and --threads must be non-empty / >= 1");
    }
    let path = match &a.model {
        Some(p) => p.clone(),
        None => overlap_model()?,
    };
    // Before the model is mapped: pages mapped by this process could not be evicted.
    let cold = make_cold(&path, a.drop_caches)?;
    let file = Arc::new(CflowFile::open(&path)?);
    if !file.cfg.has_experts() {
        bail!("{}: not an MoE model", path.display());
    }
    let mut rows = Vec::new();
    for &t in &a.threads {
        let mut e = Engine::new(
            file.clone(),
            EngineOptions {
                threads: t,
                expert_tier: ExpertTier::Direct,
                fetch: FetchMode::Sync,
                readers: a.readers,
                prefetch: false,
                ..base.clone()
            },
        );
        // Warm-up (page cache for the non-expert streams; the experts bypass it on O_DIRECT).
        run_arm(&mut e, 2);
        let (mut sy, mut stg) = (Vec::new(), Vec::new());
        for _ in 0..a.repeat {
            for (mode, out) in [(FetchMode::Sync, &mut sy), (FetchMode::Staged, &mut stg)] {
                e.set_fetch(mode);
                out.push(run_arm(&mut e, a.tokens));
            }
        }
        let med = |v: &[ArmResult], f: fn(&ArmResult) -> f64| {
            median(&v.iter().map(f).collect::<Vec<_>>())
        };
        let sync_ms = med(&sy, |r| r.ms_tok);
        let staged_ms = med(&stg, |r| r.ms_tok);
        let c = med(&sy, |r| r.c_layer_ms);
        let io = med(&sy, |r| r.io_layer_ms);
        let w_sync = med(&sy, |r| r.wait_layer_ms);
        let w_staged = med(&stg, |r| r.wait_layer_ms);
        // IO_eff: the wall-clock I/O the compute thread sees per layer in the sync arm (its
        // blocked time), below the summed reader-busy time when readers run in parallel.
        let io_eff = w_sync;
        let predicted = (c + io_eff) / c.max(io_eff).max(1e-9);
        let net = sync_ms / staged_ms.max(1e-9);
        let hidden = if w_sync > 0.0 {
            (1.0 - w_staged / w_sync).max(0.0)
        } else {
            0.0
        };
        rows.push(serde_json::json!({
            "threads": t,
            "sync_ms_tok": sync_ms,
            "staged_ms_tok": staged_ms,
            "net_speedup": net,
            "hidden_pct": hidden * 100.0,
            "c_layer_ms": c,
            "io_layer_ms": io,
            "io_eff_layer_ms": io_eff,
            "wait_layer_ms_sync": w_sync,
            "wait_layer_ms_staged": w_staged,
            "predicted_net": predicted,
            "net_vs_predicted_pct": (net / predicted - 1.0) * 100.0,
        }));
    }
    let info = Engine::new(
        file.clone(),
        EngineOptions {
            threads: 1,
            expert_tier: ExpertTier::Direct,
            ..base
        },
    );
    let mut info = info;
    let _ = info.step(0, false);
    let notes = info.config_info().notes;
    if a.json {
        outln!(
            "{}",
            serde_json::json!({"model": path, "tokens": a.tokens, "repeat": a.repeat,
                "readers": a.readers, "cold_start": cold, "notes": notes, "rows": rows})
        )?;
        return Ok(());
    }
    outln!(
        "model: {} (δe = {}, {} layers, top-{} of {} experts); tokens {} × repeat {} (medians); readers {}; cold start: {} (model {} resident after it)",
        path.display(),
        file.cfg.expert_delay,
        file.cfg.n_layers,
        file.cfg.top_k,
        file.cfg.n_experts,
        a.tokens,
        a.repeat,
        a.readers,
        cold["method"].as_str().unwrap_or(""),
        cold["model_resident_pct"]
            .as_f64()
            .map_or("?".into(), |p| format!("{p:.0}%"))
    )?;
    for n in &notes {
        outln!("note: {n}")?;
    }
    outln!(
        "{:>7} | {:>10} | {:>10} | {:>7} | {:>8} | {:>9} | {:>12} | {:>11} | {:>9} | {:>8}",
        "threads",
        "sync ms/t",
        "staged ms/t",
        "net",
        "hidden %",
        "C/layer",
        "IO busy/lay",
        "IO_eff/lay",
        "predicted",
        "vs pred"
    )?;
    outln!(
        "(IO busy = summed reader-busy time per layer; IO_eff = compute blocked on experts per layer \
         in sync; predicted = (C + IO_eff) / max(C, IO_eff))"
    )?;
    for r in &rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        outln!(
            "{:>7} | {:>10.2} | {:>11.2} | {:>6.3}× | {:>8.1} | {:>6.2} ms | {:>9.2} ms | {:>8.2} ms | {:>8.3}× | {:>+7.1}%",
            r["threads"],
            f("sync_ms_tok"),
            f("staged_ms_tok"),
            f("net_speedup"),
            f("hidden_pct"),
            f("c_layer_ms"),
            f("io_layer_ms"),
            f("io_eff_layer_ms"),
            f("predicted_net"),
            f("net_vs_predicted_pct")
        )?;
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct LayoutArgs {
    /// Model width d (the paper uses 8192; dense hidden 4d, expert hidden d/2).
    #[arg(long, default_value_t = 4096)]
    pub d: usize,
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Timed iterations per shape and layout (median reported).
    #[arg(long, default_value_t = 7)]
    pub iters: usize,
    /// Run only one layout: tiled or rowmajor (for cachegrind).
    #[arg(long)]
    pub only: Option<String>,
    #[arg(long)]
    pub json: bool,
}

/// Tiles `m` into a standalone buffer; returns the bytes and the matrix view.
pub fn tile(m: &MatrixData, kind: EntryKind, buf: &mut Vec<u8>) -> Matrix {
    let q = m.quant;
    let (rsb, rqb) = (m.row_scale_bytes(), m.row_quant_bytes());
    let mut mat = Matrix {
        kind,
        quant: q,
        rows: m.rows,
        cols: m.cols,
        stripes: Vec::new(),
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
                expert_id: 0xFF,
                row_offset: r0 as u32,
                col_offset: c0 as u16,
                tile_rows: rows as u16,
                tile_cols: cols as u16,
                quant_group: q as u16,
            };
            buf.extend_from_slice(&th.encode());
            let (sb, qb) = (
                (cols / QK) * q.scale_bytes_per_block(),
                (cols / QK) * q.quant_bytes_per_block(),
            );
            let (so, qo) = (
                (c0 / QK) * q.scale_bytes_per_block(),
                (c0 / QK) * q.quant_bytes_per_block(),
            );
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

pub fn layout(a: &LayoutArgs, isa: Isa) -> Result<()> {
    let d = a.d;
    if d == 0 || !d.is_multiple_of(256) || d > 16384 {
        bail!("--d must be a positive multiple of 256, at most 16384");
    }
    let pool = ThreadPool::new(a.threads.max(1));
    let mut rng = Rng::new(1);
    let q = QuantType::Q4_0;
    let mut gen = |rows: usize, cols: usize| {
        let w = rng.fill(rows * cols, 1.0 / (cols as f32).sqrt());
        MatrixData::quantize(q, rows, cols, &w)
    };
    // (name, matrices sharing one input)
    let shapes: Vec<(String, Vec<MatrixData>)> = vec![
        (format!("dense-down {d}×{}", 4 * d), vec![gen(d, 4 * d)]),
        (
            format!("attn Q/K/V 3×{d}×{d}"),
            vec![gen(d, d), gen(d, d), gen(d, d)],
        ),
        (
            format!("gate-up 2×{}×{d}", 4 * d),
            vec![gen(4 * d, d), gen(4 * d, d)],
        ),
        (
            format!("expert gate-up 2×{}×{d}", d / 2),
            vec![gen(d / 2, d), gen(d / 2, d)],
        ),
    ];
    let run_tiled = a.only.as_deref() != Some("rowmajor");
    let run_rm = a.only.as_deref() != Some("tiled");
    let mut rows = Vec::new();
    for (name, ms) in &shapes {
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
        xq.quantize_from(&x);
        let act = Act {
            x: &x,
            q8: Some(&xq),
        };
        let mut ys: Vec<Vec<f32>> = ms.iter().map(|m| vec![0.0; m.rows]).collect();
        let time = |f: &mut dyn FnMut()| -> f64 {
            f();
            let mut v = Vec::new();
            for _ in 0..a.iters {
                let t = Instant::now();
                f();
                v.push(t.elapsed().as_secs_f64() * 1e3);
            }
            median(&v)
        };
        let tiled = if run_tiled {
            time(&mut || {
                let mut outs: Vec<(&Matrix, &mut [f32])> = mats
                    .iter()
                    .zip(ys.iter_mut())
                    .map(|(m, y)| (m, y.as_mut_slice()))
                    .collect();
                tiled_matvec(&pool, isa, &buf, &mut outs, &act);
            })
        } else {
            0.0
        };
        let y_tiled = ys.clone();
        let rm = if run_rm {
            time(&mut || {
                for (m, y) in ms.iter().zip(ys.iter_mut()) {
                    rowmajor_matvec(&pool, isa, m, &act, y);
                }
            })
        } else {
            0.0
        };
        let same = !(run_tiled && run_rm) || y_tiled == ys;
        let mib = ms.iter().map(|m| m.bytes()).sum::<usize>() as f64 / 1048576.0;
        rows.push(serde_json::json!({"shape": name, "mib": mib, "tiled_ms": tiled,
            "rowmajor_ms": rm, "ratio": if tiled > 0.0 { rm / tiled } else { 0.0 }, "identical": same}));
    }
    if a.json {
        outln!(
            "{}",
            serde_json::json!({"d": d, "threads": a.threads, "iters": a.iters, "rows": rows})
        )?;
        return Ok(());
    }
    outln!("d = {d}, threads {}, Q4_0, median of {} iterations (paper: 1.12–1.36× wall clock, 7.29× fewer L1D misses by PMU)", a.threads, a.iters)?;
    outln!(
        "{:<28} | {:>7} | {:>9} | {:>11} | {:>15} | {:>9}",
        "shape",
        "MiB",
        "tiled ms",
        "rowmajor ms",
        "rowmajor/tiled",
        "identical"
    )?;
    for r in &rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        outln!(
            "{:<28} | {:>7.1} | {:>9.3} | {:>11.3} | {:>14.3}× | {:>9}",
            r["shape"].as_str().unwrap_or(""),
            f("mib"),
            f("tiled_ms"),
            f("rowmajor_ms"),
            f("ratio"),
            r["identical"]
        )?;
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct PrefetchArgs {
    /// Model (default: the built-in demo model).
    pub model: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    #[arg(long, default_value_t = 16)]
    pub tokens: usize,
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    #[arg(long)]
    pub json: bool,
}

pub fn prefetch(a: &PrefetchArgs, path: &Path, base: EngineOptions) -> Result<()> {
    if a.tokens == 0 || a.repeat == 0 {
        bail!("--tokens and --repeat must be >= 1");
    }
    let file = Arc::new(CflowFile::open(path)?);
    let mut e = Engine::new(
        file.clone(),
        EngineOptions {
            threads: a.threads.max(1),
            ..base
        },
    );
    let vocab = e.cfg().vocab as u32;
    let run = |e: &mut Engine| -> f64 {
        e.reset();
        let t0 = Instant::now();
        for i in 0..a.tokens {
            let _ = e.step((i as u32 * 7919 + 13) % vocab, true);
        }
        t0.elapsed().as_secs_f64() * 1e3 / a.tokens as f64
    };
    run(&mut e);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..a.repeat {
        for (pf, out) in [(false, &mut off), (true, &mut on)] {
            e.set_prefetch(pf);
            out.push(run(&mut e));
        }
    }
    let (m_off, m_on) = (median(&off), median(&on));
    let counters = {
        e.set_prefetch(true);
        run(&mut e);
        e.prefetch_counters()
    };
    if a.json {
        outln!(
            "{}",
            serde_json::json!({"model": path, "threads": a.threads, "tokens": a.tokens,
            "repeat": a.repeat, "off_ms_tok": off, "on_ms_tok": on, "off_median": m_off,
            "on_median": m_on, "on_over_off": m_on / m_off})
        )?;
        return Ok(());
    }
    outln!(
        "model: {}; threads {}; {} tokens × {} runs (alternating)",
        path.display(),
        a.threads,
        a.tokens,
        a.repeat
    )?;
    outln!("{:>9} | {:>12} | {:>20}", "prefetch", "median ms/t", "runs")?;
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    outln!("{:>9} | {:>12.2} | {}", "off", m_off, fmt(&off))?;
    outln!("{:>9} | {:>12.2} | {}", "on", m_on, fmt(&on))?;
    outln!(
        "on/off = {:.3}× (paper §5.8: the prefetch thread was harmful)",
        m_on / m_off
    )?;
    if let Some((c, l, dr)) = counters {
        outln!("prefetch thread (last run): {c} commands, {l} lines hinted, {dr} dropped")?;
    }
    Ok(())
}
