//! `cflow-tui moefy`: reads the training text, tokenizes it with the model's own tokenizer and
//! runs `convert::moefy` with a progress bar per phase; prints what it made.

use super::args::MoefyArgs;
use super::model::progress_bar;
use crate::convert::moefy::{check_spec, moefy, Cluster, MoefySpec, RouterKind};
use crate::engine::session::Session;
use crate::engine::{Engine, EngineOptions};
use crate::format::CflowFile;
use crate::telemetry::SamplingParams;
use crate::{errln, outln};
use anyhow::{bail, Context, Result};
use std::sync::Arc;

pub(super) fn cmd_moefy(a: MoefyArgs) -> Result<()> {
    let src = Arc::new(
        CflowFile::open(&a.model).with_context(|| format!("opening {}", a.model.display()))?,
    );
    let spec = MoefySpec {
        experts: a.experts,
        top_k: a.top_k,
        shared: a.shared,
        route_from: a.route_from,
        expert_delay: a.expert_delay,
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
    check_spec(&src.cfg, &spec).map_err(anyhow::Error::msg)?;
    if a.train_tokens == 0 {
        bail!("--train-tokens 0: moefy needs training text");
    }
    // 64 MiB of text is far more than any --train-tokens needs.
    let text = crate::util::read_text_file(&a.text, 64 << 20)
        .map_err(|e| anyhow::anyhow!("--text {}: {e}", a.text.display()))?;
    let sess = Session::new(
        Engine::new(src.clone(), EngineOptions::default()),
        SamplingParams::default(),
    )
    .map_err(anyhow::Error::msg)?;
    let mut ids = sess.encode(&text).map_err(anyhow::Error::msg)?;
    drop(sess);
    ids.truncate(a.train_tokens);
    if ids.len() < crate::convert::moefy::SEQ {
        bail!(
            "--text {}: {} tokens; moefy needs at least {}",
            a.text.display(),
            ids.len(),
            crate::convert::moefy::SEQ
        );
    }
    let mut bar: Option<(String, indicatif::ProgressBar)> = None;
    let report = moefy(&src, &ids, &spec, &a.out, &mut |phase, done, total| {
        if bar.as_ref().is_none_or(|(p, _)| p != phase) {
            if let Some((_, b)) = bar.take() {
                b.finish_and_clear();
            }
            bar = Some((phase.to_string(), progress_bar(total as u64, phase)));
        }
        if let Some((_, b)) = &bar {
            b.set_position(done as u64);
        }
    })
    .map_err(anyhow::Error::msg)?;
    if let Some((_, b)) = bar.take() {
        b.finish_and_clear();
    }
    if a.json {
        outln!("{}", serde_json::to_string(&report)?)?;
    } else {
        let mean =
            report.train_recall.iter().sum::<f64>() / report.train_recall.len().max(1) as f64;
        errln!(
            "moefied {} → {} ({} experts × {} units, top-{}, shared {}, route from {} back, \
             expert delay {}; {} training tokens; router keeps {:.1}% of the experts' \
             activation norm² on the training text)",
            a.model.display(),
            a.out.display(),
            report.experts,
            report.expert_ffn,
            report.top_k,
            report.shared,
            report.route_from,
            report.expert_delay,
            report.tokens,
            100.0 * mean
        );
    }
    Ok(())
}
