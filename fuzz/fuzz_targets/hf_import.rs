//! HuggingFace-directory import: `config.json` parsing, safetensors headers (single file, or an
//! index with shards), tensor loading/conversion and the `.cflow` writer. On success the output
//! must open with the validating reader; on failure nothing may be left in the output directory.
//!
//! Input layout: byte 0 picks the target quant type, the rest is split at [`SEP`] into files:
//! `config.json`, `model.safetensors`, `generation_config.json`, `tokenizer_config.json`,
//! `model.safetensors.index.json`, then shards `model-0000K-of-0000N.safetensors`. An empty part
//! means the file is absent.
#![no_main]

use cflow::convert::hf::import_hf;
use cflow::format::CflowFile;
use cflow::quant::QuantType;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

/// Separator between the files packed into one input.
const SEP: &[u8] = b"\0SPLIT\0";
const NAMED: [&str; 5] = [
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "tokenizer_config.json",
    "model.safetensors.index.json",
];
const MAX_SHARDS: usize = 16;

fn split(mut rest: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    while let Some(i) = rest.windows(SEP.len()).position(|w| w == SEP) {
        parts.push(&rest[..i]);
        rest = &rest[i + SEP.len()..];
    }
    parts.push(rest);
    parts
}

fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    // tmpfs when there is one: the writer `fsync`s, which would hit the disk on every execution.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return Ok(d);
        }
    }
    tempfile::tempdir()
}

fuzz_target!(|data: &[u8]| {
    let Some((&q, rest)) = data.split_first() else {
        return;
    };
    // libFuzzer's -max_len bounds this already; keep memory bounded for hand-fed inputs too.
    if rest.len() > 4 << 20 {
        return;
    }
    let quant = QuantType::ALL[q as usize % QuantType::ALL.len()];
    let parts = split(rest);
    let Ok(tmp) = scratch_dir() else {
        return;
    };
    let model = tmp.path().join("model");
    let outdir = tmp.path().join("out");
    if std::fs::create_dir(&model).is_err() || std::fs::create_dir(&outdir).is_err() {
        return;
    }
    let shards = parts.len().saturating_sub(NAMED.len()).min(MAX_SHARDS);
    for (i, p) in parts.iter().enumerate().take(NAMED.len() + shards) {
        if p.is_empty() {
            continue;
        }
        let name = match NAMED.get(i) {
            Some(n) => n.to_string(),
            None => format!(
                "model-{:05}-of-{shards:05}.safetensors",
                i - NAMED.len() + 1
            ),
        };
        if std::fs::write(model.join(name), p).is_err() {
            return;
        }
    }
    let out = outdir.join("m.cflow");
    match import_hf(&model, &out, quant, None, |_, _| {}) {
        Ok(cfg) => {
            let f = match CflowFile::open(&out) {
                Ok(f) => f,
                Err(e) => panic!("imported file does not validate: {e}"),
            };
            assert_eq!(f.cfg.n_layers, cfg.n_layers);
            assert_eq!(f.cfg.d_model, cfg.d_model);
            assert_eq!(f.cfg.vocab, cfg.vocab);
            assert_eq!(f.cfg.n_experts, cfg.n_experts);
        }
        Err(e) => {
            let _ = e.to_string();
            let left: Vec<_> = std::fs::read_dir(&outdir)
                .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            assert!(left.is_empty(), "failed import left {left:?} behind ({e})");
        }
    }
});
