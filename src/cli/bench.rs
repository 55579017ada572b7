//! `bench decode` (the other benchmarks live in `crate::bench_io`).

use super::args::BenchDecodeArgs;
use super::model::{open_for_decode, resolve_model};
use crate::engine::session::Session;
use crate::engine::Engine;
use crate::telemetry::SamplingParams;
use crate::{errln, outln};
use anyhow::{bail, Result};

/// Median (from `crate::stats`), min and max of the repeats.
fn stats3(v: &[f64]) -> serde_json::Value {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    serde_json::json!({
        "median": crate::stats::median(v.iter().copied()).unwrap_or(0.0),
        "min": if v.is_empty() { 0.0 } else { min },
        "max": if v.is_empty() { 0.0 } else { max },
    })
}

pub(super) fn cmd_bench_decode(a: BenchDecodeArgs) -> Result<()> {
    let eng = &a.engine;
    let threads = match eng.threads.as_slice() {
        [] => vec![1, 2],
        t => t.to_vec(),
    };
    if a.repeat == 0 || a.tokens == 0 {
        bail!("--repeat and --tokens must be at least 1");
    }
    // Every count is checked before the first is measured (`--threads 1,0` used to run the
    // whole 1-thread benchmark, then fail).
    for &t in &threads {
        eng.with_threads(t).options()?;
    }
    let path = resolve_model(a.model.clone())?;
    let file = open_for_decode(&path, eng)?;
    let mut results = Vec::new();
    // The expert tier as the engine resolved it (the same for every thread count).
    let mut tier_as_run: Option<&str> = None;
    for &t in &threads {
        let e = eng.with_threads(t);
        let mut opts = e.options()?;
        opts.timings = !a.no_timings;
        opts.step_split = !a.no_timings;
        let mut engine = Engine::new(file.clone(), opts);
        e.apply_max_ctx(&mut engine)?;
        if a.pmu {
            engine.set_pmu(crate::telemetry::pmu::Pmu::new());
        }
        tier_as_run = engine
            .cfg()
            .has_experts()
            .then(|| engine.opts().expert_tier.name());
        let mut sess =
            Session::new(engine, SamplingParams::default()).map_err(anyhow::Error::msg)?;
        if a.feed == super::args::FeedArg::Random {
            sess.random_feed = Some(0x5eed);
        }
        let prompt: Vec<u32> = (0..a.prompt_len as u32)
            .map(|i| (i * 7919 + 13) % sess.engine.cfg().vocab as u32)
            .collect();
        let (mut dec, mut pre) = (Vec::new(), Vec::new());
        let mut mib_tok = 0.0;
        let mut split = crate::engine::step_split::StepSplit::default();
        let mut cache: Option<crate::telemetry::ExpertCacheStat> = None;
        let (mut prefetch, mut pf_tokens): (Option<crate::telemetry::PrefetchStat>, u64) =
            (None, 0);
        let (mut disk_bytes, mut disk_tokens) = (Some(0u64), 0u64);
        for r in 0..=a.repeat {
            sess.reset();
            let io0 = proc_read_bytes();
            let out = sess.generate(&prompt, a.tokens, false, &mut |_| {});
            let io1 = proc_read_bytes();
            let this_split = sess.engine.take_step_split();
            if r == 0 {
                continue; // warm-up
            }
            split.add(&this_split);
            for c in out.stats.iter().filter_map(|s| s.expert_cache.as_ref()) {
                cache.get_or_insert_with(Default::default).add(c);
            }
            for p in out.stats.iter().filter_map(|s| s.prefetch.as_ref()) {
                prefetch.get_or_insert_with(Default::default).add(p);
                pf_tokens += 1;
            }
            disk_bytes = match (disk_bytes, io0, io1) {
                (Some(b), Some(x), Some(y)) => Some(b + y.saturating_sub(x)),
                _ => None,
            };
            disk_tokens += (out.stats.len() + prompt.len()) as u64;
            dec.push(out.decode_tok_s());
            pre.push(out.prefill_tok_s());
            let n = out.stats.len().max(1) as f64;
            mib_tok = out
                .stats
                .iter()
                .map(|s| {
                    s.layers
                        .iter()
                        .map(|l| l.bytes.attn + l.bytes.dense + l.bytes.experts)
                        .sum::<u64>()
                        + s.lm_head_bytes
                })
                .sum::<u64>() as f64
                / n
                / crate::util::MIB;
            if !a.json {
                errln!(
                    "threads {t} repeat {r}: decode {:.1} tok/s, prefill {:.1} tok/s",
                    dec[dec.len() - 1],
                    pre[pre.len() - 1]
                );
            }
        }
        let mut row = serde_json::json!({
            "threads": t,
            "decode_tok_s": stats3(&dec),
            "prefill_tok_s": stats3(&pre),
            "mib_per_token": mib_tok,
        });
        if let Some(j) = split.json() {
            row["time_split"] = j;
        }
        // Measured: bytes the process caused to be read from storage (/proc/self/io
        // `read_bytes`: page-cache misses of the map and direct reads alike), per prefilled or
        // generated token of the measured repeats.
        row["disk_read_mib_per_token"] = match disk_bytes {
            Some(b) if disk_tokens > 0 => {
                serde_json::json!(b as f64 / disk_tokens as f64 / crate::util::MIB)
            }
            _ => serde_json::Value::Null,
        };
        row["expert_cache"] = match cache {
            Some(c) => serde_json::json!({
                "capacity_mib": c.capacity_bytes as f64 / crate::util::MIB,
                "cached_mib": c.cached_bytes as f64 / crate::util::MIB,
                "hits": c.hits,
                "misses": c.misses,
                "hit_rate": c.hit_rate(),
            }),
            None => serde_json::Value::Null,
        };
        // The next-layer expert prediction (--prefetch on): ids fetched ahead, how many the
        // routing then selected, and (direct tier) the bytes read ahead and not used.
        row["prefetch"] = match prefetch {
            Some(p) => serde_json::json!({
                "predicted": p.predicted,
                "hits": p.hits,
                "hit_rate": p.hit_rate(),
                "wasted_mib_per_token": p.wasted_bytes as f64
                    / pf_tokens.max(1) as f64
                    / crate::util::MIB,
                "hints_sent": p.sent,
                "hints_dropped": p.dropped,
            }),
            None => serde_json::Value::Null,
        };
        results.push(row);
    }
    if a.json {
        let (act, kv) = eng.with_threads(1).options()?.numerics();
        let report = serde_json::json!({
            "model": path.display().to_string(),
            "isa": eng.isa.resolve()?.name(),
            "kernels": eng.isa.resolve()?.kernels_with(file.is_repacked()),
            "weights": file.weights_mode(),
            "expert_tier": tier_as_run,
            "repacked": file.is_repacked(),
            "act": act,
            "kv": kv,
            "tokens_per_repeat": a.tokens,
            "repeat": a.repeat,
            "prompt_tokens": a.prompt_len,
            "feed": if a.feed == super::args::FeedArg::Random { "random" } else { "sampled" },
            "rows": results,
        });
        outln!("{}", serde_json::to_string(&report)?)?;
    } else {
        outln!("model: {}", path.display())?;
        outln!(
            "{:>7} | {:>28} | {:>28} | {:>9}",
            "threads",
            "decode tok/s med (min-max)",
            "prefill tok/s med (min-max)",
            "MiB/token"
        )?;
        for r in &results {
            let f = |k: &str, s: &str| r[k][s].as_f64().unwrap_or(0.0);
            outln!(
                "{:>7} | {:>10.1} ({:>6.1}-{:>6.1})    | {:>10.1} ({:>6.1}-{:>6.1})    | {:>9.2}",
                r["threads"],
                f("decode_tok_s", "median"),
                f("decode_tok_s", "min"),
                f("decode_tok_s", "max"),
                f("prefill_tok_s", "median"),
                f("prefill_tok_s", "min"),
                f("prefill_tok_s", "max"),
                r["mib_per_token"].as_f64().unwrap_or(0.0)
            )?;
        }
        for r in results.iter().filter(|r| r["time_split"].is_object()) {
            let sp = &r["time_split"];
            let f = |k: &str| sp[k].as_f64().unwrap_or(0.0);
            outln!(
                "{} thread(s): a decode step {:.2} ms = in pool runs {:.1} % (of which waiting \
                 for other threads' tasks {:.1} %) + serial on the engine thread {:.1} %; \
                 {:.1} pool runs per step (measured on the engine thread's clock)",
                r["threads"],
                f("ms_per_step"),
                100.0 * f("in_pool_runs"),
                100.0 * f("waiting_in_pool_runs"),
                100.0 * f("serial"),
                f("pool_runs_per_step")
            )?;
        }
    }
    Ok(())
}

/// `read_bytes` of /proc/self/io: bytes this process caused to be fetched from storage (None
/// where the file is missing, e.g. no task I/O accounting).
fn proc_read_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/io").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}
