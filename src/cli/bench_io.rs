//! The I/O benchmarks: `bench overlap` (sync vs staged expert fetch on the direct tier,
//! paper §5.14), its model alone on given figures (`bench overlap-model`), and `bench prefetch`
//! (decode with the PREFETCHT0 thread on vs off, §5.8).
//!
//! (`bench layout` lives in `bench_layout.rs`.)

use crate::convert::generate::{generate, GenSpec};
use crate::engine::{Engine, EngineOptions, ExpertTier, FetchMode};
use crate::telemetry::overlap_model::{self, LayerTiming, UniformFigures};
use crate::{errln, outln};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
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
#[command(
    after_help = "The sync arm runs without speculation; with --prefetch on the staged arm reads the next layer's \
predicted experts ahead (its hit rate feeds the model: overlap_model::predict_with_speculation).\n\n\
Examples:\n  cflow-tui bench overlap --threads 1,2 --repeat 3 --json   # on the cached overlap model\n  \
cflow-tui bench overlap MOE.cflow --prefetch on --threads 2   # a model without an expert delay"
)]
pub struct OverlapArgs {
    /// Model (default: a generated MoE sized so expert reads matter, cached).
    pub model: Option<PathBuf>,
    /// Tokens per arm and repeat.
    #[arg(long, default_value_t = 16)]
    pub tokens: usize,
    /// Repeats (alternating sync, staged; medians reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Empty the whole machine's page cache first (writes /proc/sys/vm/drop_caches; root
    /// only, affects every process). Without it only the model file's pages are evicted
    /// (posix_fadvise DONTNEED); the experts are read with O_DIRECT either way.
    #[arg(long)]
    pub drop_caches: bool,
    /// Print one JSON object (see docs/JSON.md).
    #[arg(long)]
    pub json: bool,
    /// `--threads` is a list here (default 1,2); `--readers` sets the direct tier's readers.
    #[command(flatten)]
    pub engine: crate::cli::EngineArgs,
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
    /// Mean reader-busy ms of one expert read.
    read_ms: f64,
    /// Every token's stats (the overlap model's input for sync arms).
    tokens: Vec<crate::telemetry::TokenStats>,
}

fn run_arm(e: &mut Engine, tokens: usize) -> ArmResult {
    e.reset();
    let vocab = e.cfg().vocab as u32;
    let (mut c, mut io, mut w, mut n) = (0u64, 0u64, 0u64, 0u64);
    let mut reads = 0usize;
    let mut kept = Vec::with_capacity(tokens);
    let t0 = Instant::now();
    for i in 0..tokens {
        let tok = (i as u32 * 7919 + 13) % vocab;
        if e.step(tok, true).is_err() {
            break;
        }
        for st in &e.stats().layers {
            if let Some(x) = st.io {
                c += x.compute_ns;
                io += x.io_ns;
                w += x.wait_ns;
                n += 1;
                reads += st.routing.len();
            }
        }
        kept.push(e.stats().clone());
    }
    let el = t0.elapsed().as_secs_f64() * 1e3;
    let n = n.max(1) as f64;
    ArmResult {
        ms_tok: el / tokens.max(1) as f64,
        c_layer_ms: c as f64 / n / 1e6,
        io_layer_ms: io as f64 / n / 1e6,
        wait_layer_ms: w as f64 / n / 1e6,
        read_ms: io as f64 / reads.max(1) as f64 / 1e6,
        tokens: kept,
    }
}

pub fn overlap(a: &OverlapArgs) -> Result<()> {
    a.engine.require_mapped("bench overlap")?;
    let threads = match a.engine.threads.as_slice() {
        [] => vec![1, 2],
        t => t.to_vec(),
    };
    if a.tokens == 0 || a.repeat == 0 {
        bail!("--tokens and --repeat must be >= 1");
    }
    let base = a.engine.with_threads(threads[0]).options()?;
    let readers = base.readers;
    let speculate = base.prefetch;
    let (act, kv) = base.numerics();
    let path = match &a.model {
        Some(p) => crate::cli::resolve_model(Some(p.clone()))?,
        None => overlap_model()?,
    };
    // Before the model is mapped: pages mapped by this process could not be evicted.
    let cold = make_cold(&path, a.drop_caches)?;
    let file = crate::cli::open_model(&path)?;
    if !file.cfg.has_experts() {
        bail!("{}: not an MoE model", path.display());
    }
    let mut rows = Vec::new();
    // Progress on stderr (drawn only when it is a terminal): one step per measured arm.
    let pb = crate::cli::progress_bar((threads.len() * (1 + 2 * a.repeat)) as u64, "bench overlap");
    for &t in &threads {
        let mut e = Engine::new(
            file.clone(),
            EngineOptions {
                threads: t,
                expert_tier: ExpertTier::Direct,
                fetch: FetchMode::Sync,
                readers,
                prefetch: false,
                // Every expert read from disk: a cache would serve the arms' repeated tokens.
                expert_cache_mib: 0,
                ..base.clone()
            },
        );
        // Warm-up (page cache for the non-expert streams; the experts bypass it on O_DIRECT).
        pb.set_message(format!("bench overlap: {t} threads, warm-up"));
        run_arm(&mut e, 2);
        pb.inc(1);
        let (mut sy, mut stg) = (Vec::new(), Vec::new());
        for r in 0..a.repeat {
            for (mode, out) in [(FetchMode::Sync, &mut sy), (FetchMode::Staged, &mut stg)] {
                // The sync arm is the model's input: no speculation there. With --prefetch on
                // the staged arm reads the next layer's predicted experts ahead.
                e.set_prefetch(speculate && mode == FetchMode::Staged);
                pb.set_message(format!(
                    "bench overlap: {t} threads, repeat {}/{}, {}",
                    r + 1,
                    a.repeat,
                    mode.name()
                ));
                e.set_fetch(mode);
                out.push(run_arm(&mut e, a.tokens));
                pb.inc(1);
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
        // The model (telemetry::overlap_model: edges + reader pool) from the sync arms' tokens
        // only; the time outside the layers from the sync arms' wall clock.
        let (layers, _) =
            overlap_model::sync_layers(sy.iter().flat_map(|r| &r.tokens)).unwrap_or_default();
        let in_layers: f64 = layers
            .iter()
            .map(|l| l.pre_ns + l.inject_ns + l.io_ns)
            .sum();
        let other = (sync_ms * 1e6 - in_layers).max(0.0);
        // With speculation: its hit rate is a count of the staged arm (which experts the
        // prediction named and the routing chose), not a time; the times stay the sync arm's.
        let mut pf = crate::telemetry::PrefetchStat::default();
        for p in stg
            .iter()
            .flat_map(|r| &r.tokens)
            .filter_map(|s| s.prefetch)
        {
            pf.add(&p);
        }
        let hit_rate = pf.hit_rate().filter(|_| speculate);
        let de = file.cfg.expert_delay as usize;
        let model = match hit_rate {
            Some(h) => overlap_model::predict_with_speculation(&layers, de, readers, h),
            None => overlap_model::predict(&layers, de, readers),
        };
        let predicted = model.net(other);
        // The previous one-channel model (each layer's IO_eff as one block), for comparison.
        let one_channel: Vec<LayerTiming> = layers
            .iter()
            .map(|l| LayerTiming { reads: 0, ..*l })
            .collect();
        let predicted_one_channel =
            overlap_model::predict(&one_channel, file.cfg.expert_delay as usize, 1).net(other);
        // Consistency check, not a prediction: the same replay on the staged arm's own compute
        // and read times, against the staged arm's measured ms/token.
        let replay_staged_ms = overlap_model::staged_layers(stg.iter().flat_map(|r| &r.tokens))
            .map(|(l, _)| {
                let p = match hit_rate {
                    Some(h) => overlap_model::predict_with_speculation(&l, de, readers, h),
                    None => overlap_model::predict(&l, de, readers),
                };
                (p.staged_ns + other) / 1e6
            })
            .unwrap_or(0.0);
        let steady = model.steady_net;
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
            // Per repeat, in run order (the arms alternate): the CI of the ratio comes from these.
            "sync_runs_ms_tok": sy.iter().map(|r| r.ms_tok).collect::<Vec<_>>(),
            "staged_runs_ms_tok": stg.iter().map(|r| r.ms_tok).collect::<Vec<_>>(),
            "net_speedup": net,
            "hidden_pct": hidden * 100.0,
            "c_layer_ms": c,
            "io_layer_ms": io,
            "io_eff_layer_ms": io_eff,
            "wait_layer_ms_sync": w_sync,
            "wait_layer_ms_staged": w_staged,
            "predicted_net": predicted,
            "predicted_net_one_channel": predicted_one_channel,
            "read_ms_sync": med(&sy, |r| r.read_ms),
            "read_ms_staged": med(&stg, |r| r.read_ms),
            "c_layer_ms_staged": med(&stg, |r| r.c_layer_ms),
            "replay_on_staged_inputs_ms_tok": replay_staged_ms,
            "predicted_net_steady_state": steady,
            "net_vs_predicted_pct": (net / predicted - 1.0) * 100.0,
            "speculation_hit_rate": hit_rate,
        }));
    }
    pb.finish_and_clear();
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
            serde_json::json!({"model": path, "isa": base.isa.name(), "kernels": base.isa.kernels_report(file.is_repacked(), act == "q8"), "act": act, "kv": kv,
                "tokens_per_arm": a.tokens, "repeat": a.repeat, "readers": readers,
                "cold_start": cold, "notes": notes, "rows": rows})
        )?;
        return Ok(());
    }
    outln!(
        "model: {} (δe = {}, {} layers, top-{} of {} experts); tokens {} × repeat {} (medians); readers {}; staged arm {}; cold start: {} (model {} resident after it)",
        path.display(),
        file.cfg.expert_delay,
        file.cfg.n_layers,
        file.cfg.top_k,
        file.cfg.n_experts,
        a.tokens,
        a.repeat,
        readers,
        match rows.first().and_then(|r| r["speculation_hit_rate"].as_f64()) {
            Some(h) => format!(
                "with speculative next-layer reads (--prefetch on; hit rate {:.0}% counted there, fed to the model)",
                100.0 * h
            ),
            None => "without speculation".into(),
        },
        cold["method"].as_str().unwrap_or(""),
        cold["model_resident_pct"]
            .as_f64()
            .map_or("?".into(), |p| format!("{p:.0}%"))
    )?;
    for n in &notes {
        outln!("note: {n}")?;
    }
    outln!(
        "{:>7} | {:>10} | {:>10} | {:>7} | {:>8} | {:>9} | {:>11} | {:>11} | {:>9} | {:>8} | {:>9} | {:>8} | {:>13} | {:>9} | {:>10}",
        "threads",
        "sync ms/t",
        "staged ms/t",
        "net",
        "hidden %",
        "C/layer",
        "IO_eff/lay",
        "read ms",
        "predicted",
        "vs pred",
        "1-channel",
        "steady",
        "staged: read",
        "C/layer",
        "replay"
    )?;
    outln!(
        "(C = compute per layer; IO_eff = compute blocked on experts per layer in sync; read ms = \
         reader-busy time of one expert read in sync; predicted = the per-layer replay of \
         telemetry::overlap_model (fill and drain at the token's edges, the reads on the reader \
         pool), from the sync arm's measurements only; 1-channel = the same replay with each \
         layer's IO_eff as one block on one channel (the previous model); steady = the paper's \
         (C + IO_eff) / max(C, IO_eff); the last two columns are the staged arm's own read and \
         compute times, which the model does not see; replay = the model's replay fed those \
         staged-arm times instead, ms/token (a check of the model's structure, not a prediction))"
    )?;
    for r in &rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        outln!(
            "{:>7} | {:>10.2} | {:>11.2} | {:>6.3}× | {:>8.1} | {:>6.2} ms | {:>8.2} ms | {:>8.2} ms | {:>8.3}× | {:>+7.1}% | {:>8.3}× | {:>7.3}× | {:>10.2} ms | {:>6.2} ms | {:>7.2} ms",
            r["threads"],
            f("sync_ms_tok"),
            f("staged_ms_tok"),
            f("net_speedup"),
            f("hidden_pct"),
            f("c_layer_ms"),
            f("io_eff_layer_ms"),
            f("read_ms_sync"),
            f("predicted_net"),
            f("net_vs_predicted_pct"),
            f("predicted_net_one_channel"),
            f("predicted_net_steady_state"),
            f("read_ms_staged"),
            f("c_layer_ms_staged"),
            f("replay_on_staged_inputs_ms_tok")
        )?;
    }
    Ok(())
}

#[derive(Args, Debug)]
#[command(
    after_help = "Example:\n  cflow-tui bench prefetch model.cflow --threads 1 --tokens 16 --repeat 5"
)]
pub struct PrefetchArgs {
    /// Model (default: the built-in demo model).
    pub model: Option<PathBuf>,
    /// Tokens per run.
    #[arg(long, default_value_t = 16)]
    pub tokens: usize,
    /// Runs per arm (off and on alternate).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// The storage-bound regime of §5.8: the model file's pages are evicted first
    /// (posix_fadvise DONTNEED on that file only) and the experts are read from disk with
    /// O_DIRECT on every token (direct tier, sync fetch).
    #[arg(long)]
    pub storage: bool,
    /// Print one JSON object (see docs/JSON.md).
    #[arg(long)]
    pub json: bool,
    /// `--threads` defaults to 1 here.
    #[command(flatten)]
    pub engine: crate::cli::EngineArgs,
}

pub fn prefetch(a: &PrefetchArgs, path: &Path) -> Result<()> {
    a.engine.require_mapped("bench prefetch")?;
    let threads = a.engine.thread_count()?.unwrap_or(1);
    let base = a.engine.with_threads(threads).options()?;
    let (act, kv) = base.numerics();
    if a.tokens == 0 || a.repeat == 0 {
        bail!("--tokens and --repeat must be >= 1");
    }
    // Before the model is mapped: pages mapped by this process could not be evicted.
    let cold = if a.storage {
        Some(make_cold(path, false)?)
    } else {
        None
    };
    let file = crate::cli::open_model(path)?;
    if a.storage && !file.cfg.has_experts() {
        bail!(
            "{}: --storage reads the experts from disk; this model has none",
            path.display()
        );
    }
    let mut opts = EngineOptions {
        threads: threads.max(1),
        ..base.clone()
    };
    if a.storage {
        opts.expert_tier = ExpertTier::Direct;
        opts.expert_cache_mib = 0; // every expert from disk: the storage-bound regime
        opts.fetch = FetchMode::Sync;
    }
    let mut e = Engine::new(file.clone(), opts);
    let vocab = e.cfg().vocab as u32;
    let hints = std::cell::Cell::new(crate::telemetry::PrefetchStat::default());
    let run = |e: &mut Engine| -> f64 {
        e.reset();
        let t0 = Instant::now();
        let mut h = crate::telemetry::PrefetchStat::default();
        for i in 0..a.tokens {
            let _ = e.step((i as u32 * 7919 + 13) % vocab, true);
            if let Some(p) = &e.stats().prefetch {
                h.add(p);
            }
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3 / a.tokens as f64;
        if h.sent + h.dropped > 0 {
            hints.set(h);
        }
        ms
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
    let counters = e.prefetch_counters();
    let h = hints.get();
    let regime = if a.storage {
        "storage-bound: experts read with O_DIRECT every token (direct tier, sync)"
    } else {
        "RAM-bound: weights from the page cache (mmap tier)"
    };
    if a.json {
        outln!(
            "{}",
            serde_json::json!({"model": path, "threads": threads, "isa": base.isa.name(), "kernels": base.isa.kernels_report(e.file().is_repacked(), act == "q8"),
            "act": act, "kv": kv, "tokens_per_run": a.tokens, "repeat": a.repeat, "off_ms_tok": off, "on_ms_tok": on, "off_median": m_off,
            "on_median": m_on, "on_over_off": m_on / m_off, "regime": regime, "cold_start": cold,
            "hints_last_on_run": h, "prefetch_depth": crate::io::prefetch::depth_for_steps(file.cfg.effective_layers())})
        )?;
        return Ok(());
    }
    outln!(
        "model: {}; threads {}; {} tokens × {} runs (alternating); {regime}{}",
        path.display(),
        threads,
        a.tokens,
        a.repeat,
        cold.as_ref().map_or(String::new(), |c| format!(
            "; cold start: {} (model {} resident after it)",
            c["method"].as_str().unwrap_or(""),
            c["model_resident_pct"]
                .as_f64()
                .map_or("?".into(), |p| format!("{p:.0}%"))
        ))
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
        "tok/s: off {:.2} → on {:.2}; on/off time = {:.3}× (paper §5.8, 30.9B model: on 2.58 → off 4.96 tok/s, on/off time 1.92×)",
        1e3 / m_off,
        1e3 / m_on,
        m_on / m_off
    )?;
    if let Some((c, l, dr)) = counters {
        outln!(
            "prefetch thread (last on run): {c} commands walked, {l} lines hinted, {dr} dropped (channel depth {})",
            crate::io::prefetch::depth_for_steps(file.cfg.effective_layers())
        )?;
    }
    outln!(
        "last on run: {} hints sent, {} dropped; next-layer expert prediction: {} of {} hit ({})",
        h.sent,
        h.dropped,
        h.hits,
        h.predicted,
        h.hit_rate().map_or(
            "— (no expert hints: direct tier or dense model)".into(),
            |r| format!("{:.0}%", r * 100.0)
        )
    )?;
    Ok(())
}

/// `bench overlap-model`: the model on uniform per-layer figures.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Example (the paper's Table 5.6, T = 4: 1128 ms/token sync = 16 layers × (38.0 + 32.5) ms):\n  \
    cflow-tui bench overlap-model --layers 16 --expert-delay 2 --c 38.0 --io 32.5 --io-eff 40 --sync-ms 1128"
)]
pub struct OverlapModelArgs {
    /// Layers per token.
    #[arg(long)]
    pub layers: usize,
    /// Expert delay δe (reads of layer ℓ are injected at min(ℓ + δe, L − 1)).
    #[arg(long)]
    pub expert_delay: usize,
    /// Compute per layer before its expert reads are submitted, ms.
    #[arg(long)]
    pub c: f64,
    /// Compute per layer of the injected experts (after their reads), ms.
    #[arg(long, default_value_t = 0.0)]
    pub inject: f64,
    /// Wall-clock expert I/O per layer the staged arm's reads take, ms (IO_eff).
    #[arg(long)]
    pub io_eff: f64,
    /// Expert I/O per layer the sync arm pays, ms (default: --io-eff). The paper's Table 5.6
    /// gives IO = 32.5 for the sync arm and IO_eff ≈ 40 for the disk floor.
    #[arg(long)]
    pub io: Option<f64>,
    /// The measured sync ms/token, when known: the time outside the layers is then
    /// sync − L·(c + inject + io), the same in both arms; without it that time is taken as 0.
    #[arg(long)]
    pub sync_ms: Option<f64>,
    /// Reader threads serving the reads (FIFO).
    #[arg(long, default_value_t = 1)]
    pub readers: usize,
    /// Expert reads per layer, each keeping a reader busy for --read-ms (default: one read of
    /// --io-eff per layer).
    #[arg(long, default_value_t = 1)]
    pub reads: usize,
    /// Reader-busy ms of one read (default: --io-eff / --reads).
    #[arg(long)]
    pub read_ms: Option<f64>,
}

impl OverlapModelArgs {
    /// The flags as the model's figures.
    pub fn figures(&self) -> UniformFigures {
        UniformFigures {
            layers: self.layers,
            expert_delay: self.expert_delay,
            c: self.c,
            inject: self.inject,
            io_eff: self.io_eff,
            io: self.io,
            sync_ms: self.sync_ms,
            readers: self.readers,
            reads: self.reads,
            read_ms: self.read_ms,
        }
    }
}
