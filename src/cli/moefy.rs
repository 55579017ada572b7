//! `cflow-tui moefy`: reads the training (and held-out) text, tokenizes it with the model's own
//! tokenizer, runs `convert::moefy::analyze` once and writes every requested variant, with a
//! progress bar per phase; prints what it made.

use super::args::MoefyArgs;
use super::model::progress_bar;
use crate::convert::moefy::{analyze, check_spec, write_moe, Cluster, MoefySpec, RouterKind};
use crate::engine::session::Session;
use crate::engine::{Engine, EngineOptions};
use crate::format::CflowFile;
use crate::telemetry::SamplingParams;
use crate::{errln, outln};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The text of `path` tokenized by `src`'s tokenizer (at most `cap` tokens).
fn tokens(src: &Arc<CflowFile>, path: &Path, cap: usize) -> Result<Vec<u32>> {
    // 64 MiB of text is far more than any token budget needs.
    // The error names the file.
    let text = crate::util::read_text_file(path, 64 << 20).map_err(anyhow::Error::msg)?;
    let sess = Session::new(
        Engine::new(src.clone(), EngineOptions::default()),
        SamplingParams::default(),
    )
    .map_err(anyhow::Error::msg)?;
    let mut ids = sess.encode(&text).map_err(anyhow::Error::msg)?;
    ids.truncate(cap);
    Ok(ids)
}

/// `out` itself for a single variant, else `STEM-k{K}-d{D}[-de{δe}].cflow` beside it.
fn variant_path(out: &Path, many: bool, k: usize, d: usize, de: usize) -> PathBuf {
    if !many {
        return out.to_path_buf();
    }
    let stem = out
        .file_stem()
        .map_or("moe".into(), |s| s.to_string_lossy().to_string());
    let tail = if de > 0 {
        format!("-de{de}")
    } else {
        String::new()
    };
    out.with_file_name(format!("{stem}-k{k}-d{d}{tail}.cflow"))
}

pub(super) fn cmd_moefy(a: MoefyArgs) -> Result<()> {
    let src = Arc::new(
        CflowFile::open(&a.model).with_context(|| format!("opening {}", a.model.display()))?,
    );
    let base = MoefySpec {
        experts: a.experts,
        top_k: a.top_k.first().copied().unwrap_or(2),
        shared: a.shared,
        route_from: 0,
        expert_delay: 0,
        cluster: if a.cluster == "weights" {
            Cluster::Weights
        } else {
            Cluster::CoActivation
        },
        router: if a.router == "random" {
            RouterKind::Random
        } else {
            RouterKind::Trained
        },
        seed: a.seed,
        threads: a.threads.max(1),
        ridge: 1e-3,
    };
    // The variants: every k with every route-from distance, and every nonzero expert delay.
    let delays: Vec<usize> = a.expert_delay.iter().copied().filter(|&x| x > 0).collect();
    let mut variants = Vec::new();
    for &k in &a.top_k {
        if delays.is_empty() || a.route_from != [0] {
            for &d in &a.route_from {
                variants.push((k, d, 0));
            }
        }
        for &de in &delays {
            variants.push((k, 0, de));
        }
    }
    for &(k, d, de) in &variants {
        check_spec(
            &src.cfg,
            &MoefySpec {
                top_k: k,
                route_from: d,
                expert_delay: de,
                ..base.clone()
            },
        )
        .map_err(anyhow::Error::msg)?;
    }
    if a.train_tokens == 0 {
        bail!("--train-tokens 0: moefy needs training text");
    }
    let train = tokens(&src, &a.text, a.train_tokens).context("--text")?;
    if train.len() < crate::convert::moefy::SEQ {
        bail!(
            "--text {}: {} tokens; moefy needs at least {}",
            a.text.display(),
            train.len(),
            crate::convert::moefy::SEQ
        );
    }
    let heldout = match &a.heldout {
        // Recall is a mean over positions × layers: 2,048 tokens are plenty and keep it quick.
        Some(p) => tokens(&src, p, 2048).context("--heldout")?,
        None => Vec::new(),
    };
    let mut route_froms: Vec<usize> = variants.iter().map(|v| v.1).collect();
    route_froms.sort_unstable();
    route_froms.dedup();
    let mut bar: Option<(String, indicatif::ProgressBar)> = None;
    let mut progress = |phase: &str, done: usize, total: usize| {
        if bar.as_ref().is_none_or(|(p, _)| p != phase) {
            if let Some((_, b)) = bar.take() {
                b.finish_and_clear();
            }
            bar = Some((phase.to_string(), progress_bar(total as u64, phase)));
        }
        if let Some((_, b)) = &bar {
            b.set_position(done as u64);
        }
    };
    let an = analyze(
        &src,
        &train,
        &heldout,
        &base,
        &route_froms,
        &a.top_k,
        &mut progress,
    )
    .map_err(anyhow::Error::msg)?;
    let many = variants.len() > 1;
    let mut reports = Vec::new();
    for &(k, d, de) in &variants {
        let spec = MoefySpec {
            top_k: k,
            route_from: d,
            expert_delay: de,
            ..base.clone()
        };
        let out = variant_path(&a.out, many, k, d, de);
        let r = write_moe(&src, &an, &spec, &out, &mut progress).map_err(anyhow::Error::msg)?;
        reports.push((out, r));
    }
    if let Some((_, b)) = bar.take() {
        b.finish_and_clear();
    }
    if a.json {
        let v: Vec<serde_json::Value> = reports
            .iter()
            .map(|(p, r)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["out"] = p.display().to_string().into();
                v
            })
            .collect();
        outln!("{}", serde_json::Value::Array(v))?;
    } else {
        for (p, r) in &reports {
            let recall = r.heldout_recall.map_or(String::new(), |x| {
                format!("; held-out router recall {:.1}%", 100.0 * x)
            });
            errln!(
                "moefied {} → {} ({} experts × {} units, top-{}, shared {}, route from {} back, \
                 expert delay {}; {} training tokens{recall})",
                a.model.display(),
                p.display(),
                r.experts,
                r.expert_ffn,
                r.top_k,
                r.shared,
                r.route_from,
                r.expert_delay,
                r.tokens,
            );
        }
    }
    Ok(())
}
