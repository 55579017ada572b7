//! Commands that make model files: `gen`, `import`, `pull` and `convert`.

use super::args::{ConvertArgs, GenArgs, ImportArgs, PullArgs};
use super::model::{gpt2_tokenizer_json, progress_bar, MAX_CTX};
use crate::convert::generate::{generate, GenSpec};
use crate::format::CflowFile;
use crate::util::mib;
use crate::{errln, outln};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

pub(super) fn cmd_convert(a: ConvertArgs) -> Result<()> {
    let src = CflowFile::open(&a.file)?;
    let out = a.out.unwrap_or_else(|| a.file.with_extension("vflow"));
    // `convert` refuses an `out` that is the source (any spelling, link or hard link).
    crate::format::vflow::convert(&src, &out, a.group_size)?;
    if !output_is_file(&out) {
        errln!("wrote {} (a device or FIFO, not reopened)", out.display());
        return Ok(());
    }
    let v = crate::format::vflow::VflowFile::open(&out)?;
    errln!(
        "wrote {} ({:.1} MiB, {} groups of {} layers, {} experts in the bank)",
        out.display(),
        mib(std::fs::metadata(&out)
            .with_context(|| format!("{}: cannot inspect", out.display()))?
            .len()),
        v.header.n_groups,
        v.header.group_size,
        v.header.n_layers as usize * v.header.n_experts as usize
    );
    Ok(())
}

/// Whether a just-written output is a regular file (not a device or FIFO, which must not be
/// reopened to report on what was written).
fn output_is_file(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file())
}

/// `--max-ctx` for gen/import: reject what the reader would refuse to open later.
fn check_ctx(ctx: Option<usize>) -> Result<()> {
    match ctx {
        Some(c) if c == 0 || c > MAX_CTX => {
            bail!("--max-ctx {c}: must be between 1 and {MAX_CTX}")
        }
        _ => Ok(()),
    }
}

pub(super) fn cmd_gen(a: GenArgs) -> Result<()> {
    check_ctx(a.max_ctx)?;
    let quant = a.quant.quant();
    let mut spec = GenSpec::new(&a.arch);
    spec.seed = a.seed;
    spec.layers = a.layers;
    spec.hidden = a.hidden;
    spec.heads = a.heads;
    spec.kv_heads = a.kv_heads;
    spec.ffn = a.ffn;
    spec.experts = a.experts;
    spec.top_k = a.top_k;
    spec.expert_ffn = a.expert_ffn;
    spec.vocab = a.vocab;
    spec.ctx = a.max_ctx;
    spec.quant = quant;
    spec.tied = a.tied;
    if spec.vocab.unwrap_or(50257) == 50257 {
        spec.tokenizer_json = gpt2_tokenizer_json();
    }
    let cfg = spec.config().map_err(anyhow::Error::msg)?;
    let pb = progress_bar(cfg.n_layers as u64 + 1, &format!("gen {}", a.arch));
    generate(&spec, &a.out, |d, _| pb.set_position(d as u64))?;
    pb.finish_and_clear();
    if output_is_file(&a.out) {
        let size = std::fs::metadata(&a.out)
            .with_context(|| format!("{}: cannot inspect", a.out.display()))?
            .len();
        errln!("wrote {} ({:.1} MiB)", a.out.display(), mib(size));
    } else {
        errln!("wrote {}", a.out.display());
    }
    Ok(())
}

pub(super) fn cmd_import(a: ImportArgs) -> Result<()> {
    use crate::convert::import_gguf::{import_gguf, QuantTarget};
    check_ctx(a.max_ctx)?;
    let target = a.quant.target();
    if a.src.is_dir() {
        // HF safetensors directory; `keep` means f16 (HF weights are bf16/f16/f32 tensors).
        let q = match target {
            QuantTarget::Keep => crate::quant::QuantType::F16,
            QuantTarget::To(q) => q,
        };
        let pb = progress_bar(0, "import");
        let cfg = crate::convert::hf::import_hf(&a.src, &a.out, q, a.max_ctx, |d, t| {
            pb.set_length(t as u64);
            pb.set_position(d as u64);
        })?;
        pb.finish_and_clear();
        errln!(
            "imported {} → {} ({}, {} layers, d={}, vocab {}, {q})",
            a.src.display(),
            a.out.display(),
            cfg.meta.arch,
            cfg.n_layers,
            cfg.d_model,
            cfg.vocab
        );
        return Ok(());
    }
    if let QuantTarget::To(q) = target {
        errln!(
            "warning: --quant {} re-quantizes every tensor whose type differs, which loses \
             precision against the GGUF's own blocks; --quant keep (the default) copies them",
            q.name().to_lowercase()
        );
    }
    let pb = progress_bar(0, "import");
    let cfg = import_gguf(&a.src, &a.out, target, a.max_ctx, |d, t| {
        pb.set_length(t as u64);
        pb.set_position(d as u64);
    })?;
    pb.finish_and_clear();
    errln!(
        "imported {} → {} ({} layers, d={}, vocab {})",
        a.src.display(),
        a.out.display(),
        cfg.n_layers,
        cfg.d_model,
        cfg.vocab
    );
    Ok(())
}

pub(super) fn cmd_pull(a: PullArgs) -> Result<()> {
    use crate::convert::{pull, pull_gemma3};
    let name = a.name.to_ascii_lowercase();
    let (out, what): (PathBuf, &str) = match name.as_str() {
        "smollm2-moe" => return pull_smollm2_moe(),
        "smollm2" => (
            pull::pull_dir()?.join(pull::CFLOW_NAME),
            "the SmolLM2 import",
        ),
        "gemma3-270m" | "gemma3" => {
            let terms = if std::env::var_os(pull_gemma3::ENV).is_some() {
                pull_gemma3::TERMS_URL.to_string()
            } else {
                pull_gemma3::fetch_terms(&mut |m| errln!("{m}"))?
                    .display()
                    .to_string()
            };
            errln!(
                "Gemma 3 270M is provided under the Gemma Terms of Use: {terms} (also {})",
                pull_gemma3::TERMS_URL
            );
            if !a.accept_license {
                bail!(
                    "not downloading Gemma 3 without --accept-license: read the terms ({terms}), \
                     then run `cflow-tui pull gemma3-270m --accept-license`"
                );
            }
            (
                pull_gemma3::pull_dir()?.join(pull_gemma3::CFLOW_NAME),
                "the Gemma 3 import",
            )
        }
        _ => bail!(
            "unknown model `{}`: this build knows `smollm2`, `smollm2-moe` and `gemma3-270m`",
            a.name
        ),
    };
    // A cache entry: a concurrent pull waits for this one, then reuses its verified result.
    crate::cache::ensure(&out, what, &mut |m| errln!("{m}"), |out, log| {
        let gguf = if name == "smollm2" {
            pull::fetch_gguf(log)?
        } else {
            pull_gemma3::fetch_gguf(log)?
        };
        log(&format!(
            "importing {} (blocks copied without re-quantizing)...",
            gguf.display()
        ));
        cmd_import(ImportArgs {
            src: gguf,
            out: out.to_path_buf(),
            quant: super::args::ImportQuant::Keep,
            max_ctx: None,
        })
    })?;
    outln!("{}", out.display())?;
    Ok(())
}

/// The settings `pull smollm2-moe` makes (docs/MOE.md, "The default": the smallest K with D ≥ 1
/// whose held-out KL divergence from the dense model is within the bar).
pub const SMOLLM2_MOE: (usize, usize, usize, usize) = (8, 6, 256, 1); // experts, top-k, shared, route-from
/// Training tokens of `pull smollm2-moe`.
pub const SMOLLM2_MOE_TOKENS: usize = 4096;

/// `pull smollm2-moe`: SmolLM2 (pulled when missing), Moby-Dick chapters 1-6 (npm), then
/// `moefy` with [`SMOLLM2_MOE`] into the cache; prints the MoE's path.
fn pull_smollm2_moe() -> Result<()> {
    use crate::convert::{pull, pull_moby};
    let dense = pull::pull_dir()?.join(pull::CFLOW_NAME);
    crate::cache::ensure(
        &dense,
        "the SmolLM2 import",
        &mut |m| errln!("{m}"),
        |out, log| {
            let gguf = pull::fetch_gguf(log)?;
            cmd_import(ImportArgs {
                src: gguf,
                out: out.to_path_buf(),
                quant: super::args::ImportQuant::Keep,
                max_ctx: None,
            })
        },
    )?;
    let (e, k, sh, d) = SMOLLM2_MOE;
    let out = pull::pull_dir()?.join(format!(
        "SmolLM2-135M-Instruct.Q4_1.moe-e{e}k{k}s{sh}d{d}.cflow"
    ));
    crate::cache::ensure(
        &out,
        "the SmolLM2 MoE",
        &mut |m| errln!("{m}"),
        |out, log| {
            let text = pull_moby::chapters(&pull::pull_dir()?, 1, 6, log)?;
            log(&format!(
                "moefy: {e} experts, top-{k}, shared {sh}, route from {d} back (a few minutes)..."
            ));
            super::moefy::cmd_moefy(super::args::MoefyArgs {
                model: dense.clone(),
                out: out.to_path_buf(),
                experts: e,
                top_k: vec![k],
                shared: sh,
                route_from: vec![d],
                expert_delay: vec![0],
                cluster: "coact".into(),
                router: "trained".into(),
                text,
                train_tokens: SMOLLM2_MOE_TOKENS,
                heldout: None,
                seed: 1,
                threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
                json: false,
            })
        },
    )?;
    outln!("{}", out.display())?;
    Ok(())
}
