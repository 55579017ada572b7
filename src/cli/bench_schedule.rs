//! `bench schedule`: decode ms/token under the sequential and the vertical schedule (paper
//! §4.4), alternating A B A B on one engine, with min / median / max per schedule and
//! thread count; and eq. 4.23's prediction of both from the measured per-stream bandwidth,
//! once with the bandwidths each stream reaches alone (the sequential run: one stream at a time
//! on every thread) and once with those reached concurrently (the vertical run: attention on
//! one core while the dense and expert streams run on the other).

use crate::cli::bench::stats3;
use crate::engine::critical::{critical_ns, serial_ns, StreamRates};
use crate::engine::{stream_bytes, Engine, EngineOptions, Schedule};
use crate::format::CflowFile;
use crate::outln;
use crate::telemetry::TokenStats;
use anyhow::{bail, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ScheduleArgs {
    /// Model (default: the built-in demo model).
    pub model: Option<PathBuf>,
    /// Decode steps per run.
    #[arg(long, default_value_t = 32)]
    pub tokens: usize,
    /// Runs per schedule (alternating A B A B).
    #[arg(long, default_value_t = 7)]
    pub repeat: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// `--threads` is a list here (default 1,2); `--schedule` is ignored (both are measured).
    #[command(flatten)]
    pub engine: crate::cli::EngineArgs,
}

/// Bytes and ns per stream summed over runs (from the per-layer telemetry).
#[derive(Default, Clone, Copy)]
struct Acc {
    bytes: [u64; 3],
    ns: [u64; 3],
    lm_ns: u64,
    tokens: u64,
}

impl Acc {
    fn add(&mut self, st: &TokenStats) {
        for l in &st.layers {
            for (i, (b, ns)) in [
                (l.bytes.attn, l.ns_attn),
                (l.bytes.dense, l.ns_dense),
                (l.bytes.experts, l.ns_experts),
            ]
            .into_iter()
            .enumerate()
            {
                self.bytes[i] += b;
                self.ns[i] += ns;
            }
        }
        self.lm_ns += st.ns_lm_head;
        self.tokens += 1;
    }

    /// GB/s of each stream (bytes / its own compute time).
    fn rates(&self) -> StreamRates {
        let r = |i: usize| {
            if self.ns[i] == 0 {
                0.0
            } else {
                self.bytes[i] as f64 / self.ns[i] as f64
            }
        };
        StreamRates {
            attn: r(0),
            dense: r(1),
            experts: r(2),
        }
    }

    /// ms per token spent in each stream (attention, dense, experts, LM head).
    fn ms_json(&self) -> serde_json::Value {
        let per = |ns: u64| ns as f64 / self.tokens.max(1) as f64 / 1e6;
        serde_json::json!({"attn": per(self.ns[0]), "dense": per(self.ns[1]),
            "experts": per(self.ns[2]), "lm_head": per(self.lm_ns)})
    }

    fn lm_ms(&self) -> f64 {
        self.lm_ns as f64 / self.tokens.max(1) as f64 / 1e6
    }
}

/// One run: reset, a 4-token prompt, `n` decode steps; returns ms per decode step.
fn run(e: &mut Engine, n: usize, acc: &mut Acc) -> Result<f64> {
    e.reset();
    let vocab = e.cfg().vocab as u32;
    for t in [1u32, 17, 99, 3] {
        e.step(t % vocab, false)?;
    }
    let t0 = Instant::now();
    for i in 0..n {
        e.step((i as u32 * 7919 + 13) % vocab, true)?;
        acc.add(e.stats());
    }
    Ok(t0.elapsed().as_secs_f64() * 1e3 / n as f64)
}

pub fn bench(a: &ScheduleArgs, path: &Path) -> Result<()> {
    a.engine.require_mapped("bench schedule")?;
    let thread_list = match a.engine.threads.as_slice() {
        [] => vec![1, 2],
        t => t.to_vec(),
    };
    let base = a.engine.with_threads(thread_list[0]).options()?;
    if a.tokens == 0 || a.repeat == 0 {
        bail!("--tokens and --repeat must be at least 1");
    }
    let file = Arc::new(CflowFile::open(path)?);
    let cfg = &file.cfg;
    let layers = stream_bytes(&file);
    let (dd, de) = (cfg.dense_delay, cfg.expert_delay);
    let mut rows = Vec::new();
    for &threads in &thread_list {
        if threads == 0 || threads > 256 {
            bail!("--threads {threads}: must be between 1 and 256");
        }
        let opts = EngineOptions {
            threads,
            timings: true,
            schedule: Schedule::Sequential,
            ..base.clone()
        };
        let mut e = Engine::new(file.clone(), opts);
        let applies = e.vertical_applies();
        let mut warm = Acc::default();
        run(&mut e, a.tokens.min(8), &mut warm)?;
        let (mut ms, mut acc) = ([Vec::new(), Vec::new()], [Acc::default(); 2]);
        for _ in 0..a.repeat {
            for (i, s) in [Schedule::Sequential, Schedule::Vertical]
                .into_iter()
                .enumerate()
            {
                e.set_schedule(s);
                ms[i].push(run(&mut e, a.tokens, &mut acc[i])?);
            }
        }
        let med = |v: &[f64]| crate::stats::median(v.iter().copied()).unwrap_or(0.0);
        let (alone, conc) = (acc[0].rates(), acc[1].rates());
        let lm = acc[0].lm_ms();
        let pred = serde_json::json!({
            "sequential_ms": serial_ns(&layers, alone) / 1e6 + lm,
            "vertical_alone_bw_ms": critical_ns(&layers, dd, de, alone) / 1e6 + lm,
            "vertical_concurrent_bw_ms": critical_ns(&layers, dd, de, conc) / 1e6 + lm,
            "lm_head_ms": lm,
        });
        rows.push(serde_json::json!({
            "threads": threads,
            "vertical_applies": applies,
            "sequential_ms_tok": stats3(&ms[0]),
            "vertical_ms_tok": stats3(&ms[1]),
            "runs": {"sequential": ms[0], "vertical": ms[1]},
            "speedup_median": med(&ms[0]) / med(&ms[1]).max(1e-9),
            "gb_s": {
                "alone": {"attn": alone.attn, "dense": alone.dense, "experts": alone.experts},
                "concurrent": {"attn": conc.attn, "dense": conc.dense, "experts": conc.experts},
            },
            "eq_4_23_prediction": pred,
            "stream_ms_tok": {"sequential": acc[0].ms_json(), "vertical": acc[1].ms_json()},
        }));
    }
    let out = serde_json::json!({
        "model": path, "dense_delay": dd, "expert_delay": de, "tokens": a.tokens,
        "repeat": a.repeat, "results": rows,
    });
    if a.json {
        outln!("{}", serde_json::to_string(&out)?)?;
        return Ok(());
    }
    outln!(
        "model: {}; δd {dd} δe {de}; {} decode steps × {} runs per schedule (alternating)",
        path.display(),
        a.tokens,
        a.repeat
    )?;
    for r in &rows {
        let f = |k: &str, s: &str| r[k][s].as_f64().unwrap_or(0.0);
        let g = |k: &str, s: &str| r["gb_s"][k][s].as_f64().unwrap_or(0.0);
        let p = |k: &str| r["eq_4_23_prediction"][k].as_f64().unwrap_or(0.0);
        outln!("threads {}:", r["threads"])?;
        outln!(
            "  {:>10} | {:>8} {:>8} {:>8}  ms/token",
            "schedule",
            "min",
            "median",
            "max"
        )?;
        for (name, k) in [
            ("sequential", "sequential_ms_tok"),
            ("vertical", "vertical_ms_tok"),
        ] {
            outln!(
                "  {:>10} | {:>8.3} {:>8.3} {:>8.3}",
                name,
                f(k, "min"),
                f(k, "median"),
                f(k, "max")
            )?;
        }
        outln!(
            "  vertical speedup (median): {:.3}x{}",
            r["speedup_median"].as_f64().unwrap_or(0.0),
            if r["vertical_applies"] == false {
                " (δd = δe = 0: vertical runs as sequential)"
            } else {
                ""
            }
        )?;
        outln!(
            "  per-stream GB/s   {:>7} {:>7} {:>7}",
            "attn",
            "dense",
            "experts"
        )?;
        for k in ["alone", "concurrent"] {
            outln!(
                "  {:>15}  {:>7.2} {:>7.2} {:>7.2}",
                k,
                g(k, "attn"),
                g(k, "dense"),
                g(k, "experts")
            )?;
        }
        for k in ["sequential", "vertical"] {
            let m = |s: &str| r["stream_ms_tok"][k][s].as_f64().unwrap_or(0.0);
            outln!(
                "  {:>10} ms/token in attn {:.3} · dense {:.3} · experts {:.3} · lm head {:.3}",
                k,
                m("attn"),
                m("dense"),
                m("experts"),
                m("lm_head")
            )?;
        }
        outln!(
            "  eq. 4.23 ms/token: sequential {:.3} (alone bw); vertical {:.3} (alone bw), {:.3} (concurrent bw); incl. lm head {:.3}",
            p("sequential_ms"),
            p("vertical_alone_bw_ms"),
            p("vertical_concurrent_bw_ms"),
            p("lm_head_ms")
        )?;
    }
    Ok(())
}
