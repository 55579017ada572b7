//! `bench decode` (the other benchmarks live beside it: `bench_io`, `bench_layout`, `bench_schedule`, `bench_membw`).

use super::args::BenchDecodeArgs;
use super::model::{open_for_decode, resolve_model};
use crate::engine::session::Session;
use crate::engine::Engine;
use crate::telemetry::SamplingParams;
use crate::{errln, outln};
use anyhow::{bail, Result};

/// Median (from `crate::stats`), min and max of the repeats (every bench's `{median, min, max}`).
pub(super) fn stats3(v: &[f64]) -> serde_json::Value {
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
    // Decoding starts from the prompt's last token: with none, nothing would run, and every
    // figure would read 0.
    if a.prompt_len == 0 {
        bail!("--prompt-len must be at least 1 (decode starts from the prompt's last token)");
    }
    // Every count is checked before the first is measured (`--threads 1,0` used to run the
    // whole 1-thread benchmark, then fail).
    for &t in &threads {
        eng.with_threads(t).options()?;
    }
    let path = resolve_model(a.model.clone())?;
    let opened = open_for_decode(&path, eng)?;
    let file = opened.file;
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
            Session::with_tokenizer(engine, SamplingParams::default(), opened.tokenizer.clone())
                .map_err(anyhow::Error::msg)?;
        if a.feed == super::args::FeedArg::Random {
            sess.random_feed = Some(crate::rng::Rng::new(0x5eed));
        }
        let vocab = sess.engine.cfg().vocab;
        let depth_ids = synthetic_ids(0..a.depth, vocab);
        let prompt = synthetic_ids(a.depth..a.depth + a.prompt_len, vocab);
        let max_ctx = sess.engine.cfg().max_ctx;
        if a.depth + a.prompt_len + a.tokens > max_ctx {
            bail!(
                "--depth {} + --prompt-len {} + --tokens {} positions do not fit in the context \
                 of {max_ctx} (-c sets it, up to the model's)",
                a.depth,
                a.prompt_len,
                a.tokens
            );
        }
        let (mut dec, mut pre, mut ttft) = (Vec::new(), Vec::new(), Vec::new());
        let (mut mib_tok, mut kv_mib_tok) = (0.0, None);
        let mut split = crate::engine::step_split::StepSplit::default();
        let mut cache: Option<crate::telemetry::ExpertCacheStat> = None;
        let (mut prefetch, mut pf_tokens): (Option<crate::telemetry::PrefetchStat>, u64) =
            (None, 0);
        let (mut disk_bytes, mut disk_tokens) = (Some(0u64), 0u64);
        for r in 0..=a.repeat {
            start_repeat(&mut sess, &depth_ids)?;
            let io0 = proc_read_bytes();
            let out = sess.generate(&prompt, a.tokens, false, &mut |_| {});
            let io1 = proc_read_bytes();
            if let Some(e) = &out.error {
                bail!("threads {t} repeat {r}: {e}");
            }
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
            ttft.push(out.ttft_ns.unwrap_or(0) as f64 / 1e6);
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
            // The KV cache each step read (the weights above do not count it).
            let summary = sess.summary();
            kv_mib_tok = out
                .stats
                .iter()
                .map(|s| summary.kv_read_bytes(s.pos))
                .sum::<Option<u64>>()
                .map(|b| b as f64 / n / crate::util::MIB);
            if !a.json {
                errln!(
                    "threads {t} repeat {r}: decode {:.1} tok/s, prefill {:.1} tok/s, TTFT {:.2} ms",
                    dec[dec.len() - 1],
                    pre[pre.len() - 1],
                    ttft[ttft.len() - 1]
                );
            }
        }
        let mut row = serde_json::json!({
            "threads": t,
            "decode_tok_s": stats3(&dec),
            "prefill_tok_s": stats3(&pre),
            "ttft_ms": stats3(&ttft),
            "mib_per_token": mib_tok,
            "kv_mib_per_token": kv_mib_tok,
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
            "kernels": eng.isa.resolve()?.kernels_report(file.is_repacked(), act == "q8"),
            "kernel_prefetch": eng.kernel_prefetch(eng.isa.resolve()?).json(),
            "weights": file.weights_mode(),
            "expert_tier": tier_as_run,
            "experts_used": (file.cfg.n_experts > 0).then_some(file.cfg.top_k),
            "repacked": file.is_repacked(),
            "act": act,
            "kv": kv,
            "tokens_per_repeat": a.tokens,
            "repeat": a.repeat,
            "prompt_tokens": a.prompt_len,
            "depth": a.depth,
            "feed": if a.feed == super::args::FeedArg::Random { "random" } else { "sampled" },
            "rows": results,
        });
        outln!("{}", serde_json::to_string(&report)?)?;
    } else {
        outln!("model: {}", path.display())?;
        let at = if a.depth > 0 {
            format!(" at depth {}", a.depth)
        } else {
            String::new()
        };
        outln!(
            "prompt {} tokens{at}, then {} generated; {} measured repeat(s) after a warm-up",
            a.prompt_len,
            a.tokens,
            a.repeat
        )?;
        outln!(
            "{:>7} | {:>28} | {:>28} | {:>26} | {:>16} | {:>20}",
            "threads",
            "decode tok/s med (min-max)",
            "prefill tok/s med (min-max)",
            "TTFT ms med (min-max)",
            "weight MiB/token",
            "KV MiB/token (model)"
        )?;
        for r in &results {
            let f = |k: &str, s: &str| r[k][s].as_f64().unwrap_or(0.0);
            outln!(
                "{:>7} | {:>10.1} ({:>6.1}-{:>6.1})    | {:>10.1} ({:>6.1}-{:>6.1})    | \
                 {:>9.2} ({:>6.2}-{:>6.2})  | {:>16.2} | {:>20}",
                r["threads"].as_u64().unwrap_or(0),
                f("decode_tok_s", "median"),
                f("decode_tok_s", "min"),
                f("decode_tok_s", "max"),
                f("prefill_tok_s", "median"),
                f("prefill_tok_s", "min"),
                f("prefill_tok_s", "max"),
                f("ttft_ms", "median"),
                f("ttft_ms", "min"),
                f("ttft_ms", "max"),
                r["mib_per_token"].as_f64().unwrap_or(0.0),
                r["kv_mib_per_token"]
                    .as_f64()
                    .map_or("unknown".to_string(), |m| format!("{m:.2}"))
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

/// `bench decode`'s synthetic token ids: `(i * 7919 + 13) % vocab` for each position `i` of
/// `range` (the depth takes 0..depth, the prompt the positions after it). vs_llamacpp.py feeds
/// llama.cpp the same ids.
fn synthetic_ids(range: std::ops::Range<usize>, vocab: usize) -> Vec<u32> {
    range
        .map(|i| ((i as u64 * 7919 + 13) % vocab as u64) as u32)
        .collect()
}

/// Starts one repeat: an empty context, then `depth` (`--depth`) fed untimed, so that the
/// repeat's prefill and decode run with the KV cache holding it. The depth's forward passes
/// are left out of the measured step split.
fn start_repeat(sess: &mut Session, depth: &[u32]) -> Result<()> {
    sess.reset();
    if !depth.is_empty() {
        sess.fill_context(depth)
            .map_err(|e| anyhow::anyhow!("--depth {}: {e}", depth.len()))?;
        sess.engine.take_step_split();
    }
    Ok(())
}

/// `read_bytes` of /proc/self/io: bytes this process caused to be fetched from storage (None
/// where the file is missing, e.g. no task I/O accounting).
pub(super) fn proc_read_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/io").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn session(dir: &std::path::Path) -> Session {
        let p = dir.join("m.cflow");
        let mut s = crate::convert::generate::GenSpec::new("llama");
        (s.vocab, s.hidden, s.ffn, s.layers, s.ctx) =
            (Some(64), Some(64), Some(64), Some(2), Some(256));
        crate::convert::generate::generate(&s, &p, |_, _| {}).unwrap();
        let file = Arc::new(crate::format::CflowFile::open(&p).unwrap());
        let opts = crate::engine::EngineOptions {
            threads: 1,
            ..Default::default()
        };
        Session::new(Engine::new(file, opts), SamplingParams::default()).unwrap()
    }

    /// `--depth`: every repeat starts from an empty context, feeds the depth, then prefills the
    /// prompt and decodes after it: the context is the depth's ids, the prompt's, then the
    /// generated tokens, and the time to first token covers the prompt's prefill.
    #[test]
    fn depth_fills_the_context_before_the_measured_prompt() {
        let dir = tempfile::tempdir().unwrap();
        let mut sess = session(dir.path());
        let vocab = sess.engine.cfg().vocab;
        let (depth, prompt) = (synthetic_ids(0..40, vocab), synthetic_ids(40..48, vocab));
        assert_eq!(
            [&depth[..], &prompt[..]].concat(),
            synthetic_ids(0..48, vocab)
        );
        for _ in 0..2 {
            start_repeat(&mut sess, &depth).unwrap();
            assert_eq!(sess.engine.pos(), 40);
            assert_eq!(sess.context, depth);
            let out = sess.generate(&prompt, 5, false, &mut |_| {});
            assert!(out.error.is_none(), "{:?}", out.error);
            assert_eq!((out.prompt_tokens, out.tokens.len()), (8, 5));
            // Depth + prompt + the 5 generated tokens (the last one fed back).
            assert_eq!(sess.engine.pos(), 53);
            assert_eq!(sess.context[..48], synthetic_ids(0..48, vocab)[..]);
            assert_eq!(sess.context[48..], out.tokens[..]);
            let ttft = out.ttft_ns.expect("a token was generated");
            assert!(out.prefill_ns > 0 && ttft >= out.prefill_ns, "{out:?}");
            assert!(ttft <= out.prefill_ns + out.decode_ns, "{out:?}");
        }
        // No depth: the repeat starts at position 0.
        start_repeat(&mut sess, &[]).unwrap();
        assert_eq!((sess.engine.pos(), sess.context.len()), (0, 0));
        // A depth beyond the context is an error that names the flag.
        let e = start_repeat(&mut sess, &synthetic_ids(0..300, vocab)).unwrap_err();
        assert!(e.to_string().contains("--depth 300"), "{e}");
    }
}
