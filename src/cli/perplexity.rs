//! `perplexity`: teacher-forced perplexity of a text in chunks of `--chunk` tokens (`-c`'s
//! context when not given, as llama.cpp's perplexity tool), optionally writing every position's distribution
//! (`--save-logits`) and comparing against a reference distribution file (`--kl-divergence`,
//! with the statistics of `crate::ppl::kld`), the evaluated distributions coming from the model
//! or from a second file (`--logits`).

use super::args::PplArgs;
use super::model::{build_session, progress_bar};
use crate::engine::session::Session;
use crate::ppl::kld::{log_softmax, KldAccum, KldSummary};
use crate::ppl::logits_file::{LogitsHeader, LogitsReader, LogitsWriter};
use crate::telemetry::SamplingParams;
use crate::{errln, outln};
use anyhow::{bail, Context, Result};
use std::path::Path;

/// Largest `perplexity --file` (64 MiB of text is ~16 M tokens, days of evaluation).
const PPL_MAX_FILE: u64 = 64 << 20;
/// The chunk length when neither `--chunk`, `-c` nor a reference gives one (llama-perplexity's
/// default `-c`).
const DEFAULT_CTX: usize = 512;

/// Where the evaluated distributions come from.
enum Source {
    Model(Box<Session>),
    File(LogitsReader),
}

pub(super) fn cmd_perplexity(a: PplArgs) -> Result<()> {
    let mut reference = match &a.kl_divergence {
        Some(p) => Some(LogitsReader::open(p).context("--kl-divergence")?),
        None => None,
    };
    let mut src = match (&a.model, &a.logits) {
        (Some(m), _) => Source::Model(Box::new(build_session(
            Some(m.clone()),
            &a.engine,
            SamplingParams::default(),
        )?)),
        (None, Some(p)) => Source::File(LogitsReader::open(p).context("--logits")?),
        (None, None) => bail!("give MODEL, or --logits FILE with --kl-divergence"),
    };
    if let (true, Source::Model(s)) = (a.oracle_router, &mut src) {
        s.engine
            .set_oracle_router(true)
            .map_err(|e| anyhow::anyhow!("--oracle-router: {e}"))?;
    }
    let text_ids = match &a.file {
        Some(f) => {
            let Source::Model(sess) = &src else {
                bail!("--file needs a model to tokenize it (with --logits the tokens come from the files)")
            };
            let text = crate::util::read_text_file(f, PPL_MAX_FILE).map_err(anyhow::Error::msg)?;
            Some(sess.encode(&text).map_err(anyhow::Error::msg)?)
        }
        None => None,
    };
    // Tokens and chunking: the reference's, else the text's.
    let (ids, ctx) = match (&reference, text_ids) {
        (Some(r), t) => {
            let h = &r.header;
            if let Some(t) = t {
                if t != h.tokens {
                    bail!(
                        "{}: tokenizes to {} tokens that differ from the {} of {} (a different text or tokenizer)",
                        a.file.as_ref().expect("file").display(),
                        t.len(),
                        h.tokens.len(),
                        r.path().display()
                    );
                }
            }
            if let Some(c) = a.chunk.filter(|&c| c != h.n_ctx) {
                bail!(
                    "--chunk {c}: the reference {} was made with chunks of {}",
                    r.path().display(),
                    h.n_ctx
                );
            }
            (h.tokens.clone(), h.n_ctx)
        }
        // As llama-perplexity: the context (`-c`) is the chunk unless --chunk says otherwise.
        (None, Some(t)) => (t, a.chunk.or(a.engine.max_ctx).unwrap_or(DEFAULT_CTX)),
        (None, None) => bail!("give --file TEXT (or --kl-divergence REF)"),
    };
    if ids.len() < 2 {
        bail!("fewer than 2 tokens to evaluate");
    }
    let n_vocab = match &src {
        Source::Model(s) => {
            let cfg = s.engine.cfg();
            // Without a reference the chunk length is capped by the model's context below.
            if reference.is_some() && ctx > cfg.max_ctx {
                bail!(
                    "the reference's chunks of {ctx} exceed the model's context {}",
                    cfg.max_ctx
                );
            }
            cfg.vocab
        }
        Source::File(f) => f.header.n_vocab,
    };
    let ctx = match &src {
        Source::Model(s) => ctx.min(s.engine.cfg().max_ctx).max(2),
        Source::File(_) => ctx,
    };
    if let Some(r) = &reference {
        if r.header.n_vocab != n_vocab {
            return Err(r
                .mismatch("n_vocab", r.header.n_vocab as u64, n_vocab as u64)
                .into());
        }
    }
    if let Source::File(f) = &src {
        let r = reference
            .as_ref()
            .expect("--logits requires --kl-divergence");
        if f.header.tokens != r.header.tokens || f.header.n_ctx != r.header.n_ctx {
            return Err(f
                .mismatch(
                    "tokens and chunking (vs the reference)",
                    f.header.tokens.len() as u64,
                    r.header.tokens.len() as u64,
                )
                .into());
        }
    }
    if let Some(t) = ids.iter().find(|&&t| t as usize >= n_vocab) {
        bail!("token id {t} is out of range (vocab {n_vocab})");
    }
    let label = match &src {
        Source::Model(s) => {
            let (act, kv) = s.engine.opts().numerics();
            let f = s.engine.file();
            format!(
                "cflow-tui {} act={act} kv={kv} isa={} weights={}{}{}{} model={}",
                env!("CARGO_PKG_VERSION"),
                s.engine.opts().isa.name(),
                f.weights_mode(),
                if f.is_repacked() { "+repacked" } else { "" },
                if a.oracle_router {
                    " router=oracle"
                } else {
                    ""
                },
                if a.batch { " eval=batch" } else { "" },
                f.path.file_name().unwrap_or_default().to_string_lossy()
            )
        }
        Source::File(f) => f.header.label.clone(),
    };
    let eval = match (&src, a.batch) {
        (Source::File(_), _) => "file",
        (_, true) => "batch",
        _ => "step",
    };
    let mut writer = match (&a.save_logits, &src) {
        (Some(p), Source::Model(s)) => {
            let mut inputs = s.engine.input_files();
            inputs.extend(a.file.as_deref());
            inputs.extend(a.kl_divergence.as_deref());
            let h = LogitsHeader {
                n_vocab,
                n_ctx: ctx,
                label: label.clone(),
                tokens: ids.clone(),
            };
            Some(LogitsWriter::create(p, &inputs, &h).context("--save-logits")?)
        }
        _ => None,
    };

    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut acc = KldAccum::default();
    let mut test_lp = vec![0f64; n_vocab];
    let mut ref_lp = vec![0f64; n_vocab];
    // Progress over the positions scored (each chunk's last token predicts nothing): an
    // indicatif bar on a terminal (a `\r` line showed as a literal `\u000d` there, since
    // stderr escapes control characters), nothing otherwise.
    let scored: u64 = ids
        .chunks(ctx)
        .map(|c| c.len().saturating_sub(1) as u64)
        .sum();
    let pb = if a.json {
        indicatif::ProgressBar::hidden()
    } else {
        progress_bar(scored, "perplexity")
    };
    for chunk in ids.chunks(ctx) {
        if let Source::Model(s) = &mut src {
            s.reset();
        }
        if let (true, Source::Model(s)) = (a.batch, &mut src) {
            // Every position's logits from one batched prompt; the scoring is the loop's below.
            let mut err = None;
            let mut i = 0;
            let inputs = &chunk[..chunk.len().saturating_sub(1)];
            s.engine.prefill_each(inputs, &mut |l| {
                if err.is_some() {
                    return;
                }
                log_softmax(l, &mut test_lp);
                let nll_test = -test_lp[chunk[i + 1] as usize];
                let target = chunk[i + 1] as usize;
                let (w, r) = (writer.as_mut(), reference.as_mut());
                err = record(&test_lp, target, nll_test, w, r, &mut ref_lp, &mut acc).err();
                nll += nll_test;
                nll2 += nll_test * nll_test;
                count += 1;
                i += 1;
            })?;
            if let Some(e) = err {
                return Err(e);
            }
            pb.set_position(count as u64);
            continue;
        }
        for (i, &id) in chunk.iter().enumerate() {
            let last = i + 1 == chunk.len();
            let nll_test = match &mut src {
                Source::Model(s) => {
                    let logits = s.engine.step(id, !last)?;
                    let Some(l) = logits.filter(|_| !last) else {
                        continue;
                    };
                    log_softmax(l, &mut test_lp);
                    -test_lp[chunk[i + 1] as usize]
                }
                Source::File(f) => {
                    if last {
                        continue;
                    }
                    -f.next_row(&mut test_lp)?.target_lp
                }
            };
            let target = chunk[i + 1] as usize;
            let (w, r) = (writer.as_mut(), reference.as_mut());
            record(&test_lp, target, nll_test, w, r, &mut ref_lp, &mut acc)?;
            nll += nll_test;
            nll2 += nll_test * nll_test;
            count += 1;
        }
        pb.set_position(count as u64);
        pb.set_message(format!(
            "perplexity {:.4} so far",
            (nll / count.max(1) as f64).exp()
        ));
    }
    pb.finish_and_clear();
    if let Some(w) = writer {
        w.finish()?;
        errln!(
            "wrote {count} positions to {}",
            a.save_logits.as_ref().expect("path").display()
        );
    }
    let n = count as f64;
    let mean = nll / n;
    let ppl = mean.exp();
    // Standard error of the mean NLL, carried to the perplexity (as llama-perplexity does).
    let se = if count > 1 {
        (((nll2 / n - mean * mean) * n / (n - 1.0)).max(0.0) / n).sqrt()
    } else {
        0.0
    };
    let kld = (!acc.is_empty()).then(|| acc.summary());
    if a.json {
        let (act, kv, isa, threads, model) = match &src {
            Source::Model(s) => {
                let (act, kv) = s.engine.opts().numerics();
                (
                    Some(act),
                    Some(kv),
                    Some(s.engine.opts().isa.name()),
                    Some(s.engine.threads()),
                    Some(s.engine.file().path.display().to_string()),
                )
            }
            Source::File(_) => (None, None, None, None, None),
        };
        let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let report = serde_json::json!({
            "model": model,
            "logits": path(&a.logits),
            "label": label,
            "text": path(&a.file),
            "act": act,
            "kv": kv,
            "isa": isa,
            "threads": threads,
            "eval": eval,
            "router": if a.oracle_router { "oracle" } else { "model" },
            "chunk": ctx,
            "n_tokens": ids.len(),
            "predictions": count,
            "ppl": ppl,
            "ppl_stderr": ppl * se,
            "saved_logits": path(&a.save_logits),
            "reference": reference.as_ref().map(|r| serde_json::json!({
                "file": r.path().display().to_string(),
                "label": r.header.label,
            })),
            "kl_divergence": kld,
        });
        outln!("{}", serde_json::to_string(&report)?)?;
    } else {
        outln!(
            "perplexity: {ppl:.4} ± {:.4} over {count} predictions (chunks of {ctx}) [{label}]",
            ppl * se
        )?;
        if let (Some(s), Some(r)) = (&kld, &reference) {
            outln!("{}", render_kld(s, r.path(), &r.header.label))?;
        }
    }
    Ok(())
}

/// The text report of a comparison against a reference.
/// One scored position: its distribution to `--save-logits`, and against the reference's
/// row to the KL-divergence statistics.
fn record(
    test_lp: &[f64],
    target: usize,
    nll_test: f64,
    writer: Option<&mut LogitsWriter>,
    reference: Option<&mut LogitsReader>,
    ref_lp: &mut [f64],
    acc: &mut KldAccum,
) -> Result<()> {
    if let Some(w) = writer {
        w.push(test_lp, target)?;
    }
    if let Some(r) = reference {
        let row = r.next_row(ref_lp)?;
        acc.push(ref_lp, test_lp, -row.target_lp, nll_test);
    }
    Ok(())
}

pub fn render_kld(s: &KldSummary, path: &Path, label: &str) -> String {
    format!(
        "vs reference {} [{label}] over {} positions:\n  \
         ppl {:.4} vs {:.4}: Δppl {:+.3e} ± {:.3e}, ln(ppl/ppl_ref) {:+.3e} ± {:.3e}\n  \
         KLD mean {:.3e} ± {:.1e}, median {:.3e}, p99 {:.3e}, max {:.3e}\n  \
         top-1 agreement {:.3} ± {:.3} %",
        path.display(),
        s.positions,
        s.ppl,
        s.ppl_ref,
        s.delta_ppl.mean,
        s.delta_ppl.stderr,
        s.ln_ppl_ratio.mean,
        s.ln_ppl_ratio.stderr,
        s.kld.mean,
        s.kld.stderr,
        s.kld_median,
        s.kld_p99,
        s.kld_max,
        100.0 * s.top1_agreement.mean,
        100.0 * s.top1_agreement.stderr,
    )
}
