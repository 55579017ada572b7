//! Headless generation (`run`, with `--json` and `--dump-logits`), and the trace recorder tap
//! the headless commands share.

use super::args::{EngineArgs, RunArgs};
use super::model::{build_session, install_sigint};
use crate::chat::conversation::Conversation;
use crate::engine::session::{GenOutcome, Session};
use crate::engine::stream_bytes;
use crate::telemetry::Event;
use crate::util::{mib, MIB};
use crate::{err, errln, outln};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

pub(super) fn cmd_run(a: RunArgs, eng: &EngineArgs) -> Result<()> {
    if a.n > 1_000_000 && a.n != super::args::UNLIMITED {
        bail!("-n {}: too many tokens (max 1000000)", a.n);
    }
    let mut sess = build_session(a.model.clone(), eng, a.sampling.params()?)?;
    let ids = match (&a.token_ids, &a.prompt) {
        (Some(t), _) => t.clone(),
        (None, Some(p)) if a.chat => {
            let tok = sess.tok.as_ref().context("this model has no tokenizer")?;
            let mut conv = Conversation::for_tokenizer(sess.engine.cfg(), Some(tok))
                .map_err(|e| anyhow::anyhow!("chat template: {e}"))?;
            conv.prepare_turn(p, tok, sess.engine.cfg().max_ctx, 0)?.ids
        }
        (None, Some(p)) => sess.encode(p).map_err(anyhow::Error::msg)?,
        (None, None) => bail!("give --prompt TEXT or --token-ids ID,ID,..."),
    };
    if ids.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    if let Some(v) = ids.iter().find(|&&t| t as usize >= sess.engine.cfg().vocab) {
        bail!(
            "token id {v} is out of range (vocab {})",
            sess.engine.cfg().vocab
        );
    }
    if a.dump_routing.is_some() {
        if !sess.engine.cfg().has_experts() {
            bail!(
                "--dump-routing: {} has no experts (a dense model routes nothing)",
                a.model
                    .as_deref()
                    .map_or("the model".into(), |p| p.display().to_string())
            );
        }
        sess.engine.set_routing_log(true);
    }
    if let Some(path) = &a.dump_logits {
        dump_logits(&mut sess, &ids, a.top, path)?;
        if let Some(rp) = &a.dump_routing {
            write_routing(&mut sess, rp)?;
        }
        return Ok(());
    }
    if sess.engine.cfg().meta.synthetic && !a.json {
        errln!("note: synthetic model (random weights): the generated text is noise.");
    }
    let json = a.json;
    let mut text_out = super::text_out::TextOut::new(sess.engine.stop_flag().clone());
    let mut tap = match &a.record {
        Some(p) => Some(RecordTap::start(p, &sess, None)?),
        None => None,
    };
    if let Some(t) = tap.as_mut() {
        t.emit(Event::Prompt {
            text: a.prompt.clone().unwrap_or_default(),
            tokens: ids.clone(),
            chat: a.chat,
        });
    }
    let mut emit = |e: Event| {
        if let Some(t) = tap.as_mut() {
            t.emit(e.clone());
        }
        if let Event::Token { text, .. } = &e {
            if !json {
                text_out.write(text);
            }
        }
    };
    // Ctrl-C / SIGINT stops generation within one layer; the trace gets its Done event, the
    // stats are printed and the process exits with 130 (also when SIGINT was inherited as
    // ignored, e.g. under nohup or a background CI job).
    let interrupted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    install_sigint(sess.engine.stop_flag().clone(), interrupted.clone());
    let out = sess.generate(&ids, a.n, !a.ignore_eos, &mut emit);
    text_out.check()?;
    if !json {
        outln!()?;
    }
    if let Some(e) = &out.error {
        errln!("error: {e}");
    }
    if let Some(rp) = &a.dump_routing {
        write_routing(&mut sess, rp)?;
    }
    let report = run_report(&sess, &out);
    if json {
        outln!("{}", serde_json::to_string(&report)?)?;
    } else {
        err!(
            "{}",
            render_run_report(&report, &out, sess.engine.cfg().max_ctx, a.verbose)
        );
    }
    if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
        errln!(
            "interrupted (SIGINT): stopped after {} tokens",
            out.tokens.len()
        );
        std::process::exit(130);
    }
    if out.error.is_some() {
        bail!("generation failed");
    }
    if let Some(e) = tap.and_then(|t| t.failed) {
        bail!("--record: {e}");
    }
    Ok(())
}

/// Percentile of per-token nanoseconds (0 when there are none), from `crate::stats`.
fn percentile(v: &[u64], p: f64) -> f64 {
    crate::stats::percentile(v.iter().map(|&x| x as f64), p).unwrap_or(0.0)
}

fn run_report(sess: &Session, out: &GenOutcome) -> serde_json::Value {
    let f = sess.engine.file();
    let sb = stream_bytes(f);
    let attn: u64 = sb.iter().map(|s| s.attn).sum();
    let dense: u64 = sb.iter().map(|s| s.dense).sum();
    // Expert bytes actually touched (average over measured tokens).
    let n = out.stats.len().max(1) as f64;
    let experts = out
        .stats
        .iter()
        .map(|s| s.layers.iter().map(|l| l.bytes.experts).sum::<u64>())
        .sum::<u64>() as f64
        / n;
    let lm_head = f.lm_head().bytes() as f64;
    let experts_all = crate::engine::streams::all_expert_bytes(f);
    let total = attn as f64 + dense as f64 + experts + lm_head;
    // The KV cache each decode step read (not in `total`, which counts weights).
    let summary = sess.summary();
    let kv_mib = out
        .stats
        .iter()
        .map(|s| summary.kv_read_bytes(s.pos))
        .sum::<Option<u64>>()
        .map(|b| b as f64 / n / MIB);
    // Per-token figures only from timed decode steps, rates only from ≥ 2 tokens
    // (`stats::MIN_RATE_TOKENS`): `null` otherwise, and the text report says why.
    let ms_per_token = (!out.token_ns.is_empty()).then(|| {
        serde_json::json!({
            "median": percentile(&out.token_ns, 0.5) / 1e6,
            "p90": percentile(&out.token_ns, 0.9) / 1e6,
        })
    });
    let ms_median = percentile(&out.token_ns, 0.5) / 1e6;
    let gbs = (ms_median > 0.0).then(|| total / (ms_median / 1e3) / 1e9);
    let (act, kv) = sess.engine.opts().numerics();
    serde_json::json!({
        "model": f.path.display().to_string(),
        "threads": sess.engine.threads(),
        "isa": sess.engine.opts().isa.name(),
        "kernels": sess.engine.opts().isa.kernels_report(sess.engine.file().is_repacked(), act == "q8"),
        "weights": sess.engine.file().weights_mode(),
        "expert_tier": sess.engine.cfg().has_experts().then(|| sess.engine.opts().expert_tier.name()),
        "repacked": sess.engine.file().is_repacked(),
        "act": act,
        "kv": kv,
        "prompt_tokens": out.prompt_tokens,
        "generated_tokens": out.tokens.len(),
        "prefill_tok_s": crate::stats::tok_per_s(out.prompt_tokens as u64, out.prefill_ns),
        "ttft_ms": out.ttft_ns.map(|ns| ns as f64 / 1e6),
        "decode_tok_s": crate::stats::tok_per_s(out.tokens.len() as u64, out.decode_ns),
        "ms_per_token": ms_per_token,
        "mib_per_token": {
            "attention": mib(attn), "dense": mib(dense), "experts": experts / MIB,
            "experts_all": mib(experts_all), "lm_head": lm_head / MIB, "total": total / MIB
        },
        "kv_mib_per_token": kv_mib,
        "effective_gb_s": gbs,
        "critical_path_mib": crate::engine::critical::critical_path_both(f),
        "stop_reason": out.reason,
        "tokens": out.tokens,
        "text": out.text,
    })
}

/// The text summary. The critical-path lines only where they say something (a delayed model,
/// whose critical path is shorter than its weights) or with `verbose`.
fn render_run_report(
    r: &serde_json::Value,
    out: &GenOutcome,
    max_ctx: usize,
    verbose: bool,
) -> String {
    let g = |p: &str| r.pointer(p).and_then(|v| v.as_f64()).unwrap_or(0.0);
    let rate = |n: usize, ns: u64| crate::stats::tok_per_s_text(n as u64, ns);
    let per_token = if r["ms_per_token"].is_null() {
        "ms/token: no decode step was timed".to_string()
    } else {
        format!(
            "{:.2} ms/token (median), {:.2} ms (p90)",
            g("/ms_per_token/median"),
            g("/ms_per_token/p90")
        )
    };
    let gbs = match r["effective_gb_s"].as_f64() {
        Some(x) => format!(" · {x:.2} GB/s effective"),
        None => String::new(),
    };
    let ended = match out.reason {
        Some(crate::telemetry::StopReason::ContextFull) => format!(
            "stopped: the context is full ({max_ctx} position{}; --max-ctx sets it)\n",
            if max_ctx == 1 { "" } else { "s" }
        ),
        _ => String::new(),
    };
    let ttft = out.ttft_ns.map_or(String::new(), |ns| {
        format!(" · TTFT {}", crate::stats::latency_text(ns))
    });
    format!(
        "\n--- {} generated, {} prompt tokens, {} threads, {}\n{ended}\
         prefill {}{ttft} · decode {} · {per_token}\n\
         weight MiB/token: attention {:.2} · dense {:.2} · experts {:.2} · lm head {:.2} · total {:.2}{gbs} · KV cache {}\n\
         {}",
        r["generated_tokens"], r["prompt_tokens"], r["threads"], r["isa"].as_str().unwrap_or(""),
        rate(out.prompt_tokens, out.prefill_ns), rate(out.tokens.len(), out.decode_ns),
        g("/mib_per_token/attention"), g("/mib_per_token/dense"), g("/mib_per_token/experts"),
        g("/mib_per_token/lm_head"), g("/mib_per_token/total"),
        r["kv_mib_per_token"].as_f64().map_or("unknown".to_string(), |m| format!("{m:.2} MiB/token (modelled from its shape)")),
        {
            let c = &r["critical_path_mib"];
            let delayed = c["payload"]["ratio"].as_f64().is_some_and(|x| x != 1.0);
            if delayed || verbose {
                format!("{}\n", crate::inspect::critical_path_line(c))
            } else {
                String::new()
            }
        },
    )
}

fn dump_logits(sess: &mut Session, ids: &[u32], top: usize, path: &Path) -> Result<()> {
    // Write errors name the path (`Output`); the file appears only when complete.
    let out =
        crate::output::Output::create(path, &sess.engine.input_files()).context("--dump-logits")?;
    let mut w = std::io::BufWriter::new(out);
    for (i, &id) in ids.iter().enumerate() {
        let logits = sess.engine.step(id, true)?.context("logits")?;
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        let k = top.min(logits.len()).max(1);
        idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
        idx.truncate(k);
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let topv: Vec<(usize, f32)> = idx.iter().map(|&j| (j, logits[j])).collect();
        let lse = crate::engine::ops::logsumexp(logits);
        writeln!(
            w,
            "{}",
            serde_json::json!({"pos": i, "token": id, "top": topv, "logsumexp": lse})
        )?;
    }
    w.into_inner().map_err(|e| e.into_error())?.commit()?;
    errln!("wrote {} positions to {}", ids.len(), path.display());
    Ok(())
}

/// Writes the routing the engine kept (`Engine::set_routing_log`) as JSON Lines, one position a
/// line (docs/JSON.md, "Routing dump"); the file appears only when complete.
fn write_routing(sess: &mut Session, path: &Path) -> Result<()> {
    let log = sess.engine.take_routing_log();
    let out = crate::output::Output::create(path, &sess.engine.input_files())
        .context("--dump-routing")?;
    let mut w = std::io::BufWriter::new(out);
    for r in &log {
        writeln!(w, "{}", serde_json::to_string(r)?)?;
    }
    w.into_inner().map_err(|e| e.into_error())?.commit()?;
    errln!(
        "wrote the routing of {} positions to {}",
        log.len(),
        path.display()
    );
    Ok(())
}

/// Records a headless session's events to a trace file, through the shared recorder tap
/// ([`crate::telemetry::recorder::Tap`]); a write error is reported once on stderr.
pub(super) struct RecordTap {
    tap: crate::telemetry::recorder::Tap,
    failed: Option<String>,
}

impl RecordTap {
    /// Starts recording to `path`: the header, the `Session` event, then the `Settings` in
    /// force (sampling, the chat's system prompt from `conv`, numerics).
    pub(super) fn start(
        path: &Path,
        s: &Session,
        conv: Option<&Conversation>,
    ) -> Result<RecordTap> {
        use crate::telemetry::recorder::{Recorder, Tap, TraceHeader};
        let machine = crate::telemetry::machine::MachineProfile::detect(s.engine.opts().isa.name());
        let cfg = crate::engine::worker::config_info(s);
        // The error names the path; the model (and twin) cannot be the trace.
        let rec = Recorder::create_for(
            path,
            TraceHeader::new(s.summary(), cfg.clone(), Some(machine)),
            &s.engine.input_files(),
        )
        .context("--record")?;
        let mut t = RecordTap {
            tap: Tap::new(),
            failed: None,
        };
        t.tap.start(rec);
        t.emit(Event::Session {
            model: Box::new(s.summary()),
            config: cfg,
        });
        t.emit(Event::Settings(crate::engine::worker::gen_settings(
            s, conv,
        )));
        Ok(t)
    }

    /// The first write error, when recording failed.
    pub(super) fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    pub(super) fn emit(&mut self, e: Event) {
        self.tap.emit(e);
        if let Some(err) = self.tap.take_error() {
            errln!("error: {err}");
            self.failed = Some(err);
        }
    }
}
