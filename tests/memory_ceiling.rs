//! Issue 44, class 2: every parser's memory is in proportion to its input. Each case runs the
//! release binary under an address-space limit (`ulimit -v`) of the binary's own baseline +
//! 64 MiB + a few × the input's size; before the fixes each of these aborted on an allocation
//! failure (or took minutes): `.cflow` metadata arrays (~22×), SentencePiece merges from a
//! chain vocabulary (cubic), one long SentencePiece token (quadratic), `export --chrome` (~75×).

#[path = "common/gguf_writer.rs"]
mod gguf_writer;
#[path = "common/limited.rs"]
mod limited;
#[path = "common/tiny_llama_gguf.rs"]
mod tiny_llama_gguf;

use cflow::convert::generate::{gen_layer, gen_vocab, GenSpec};
use cflow::format::CflowWriter;
use cflow::quant::QuantType;
use cflow::rng::Rng;
use gguf_writer::{f32_array, str_array};
use std::path::Path;
use std::time::{Duration, Instant};

/// KiB allowed for an input of `bytes` bytes: baseline + 64 MiB + `k` × the size.
fn ceiling(bytes: u64, k: u64) -> u64 {
    limited::baseline_kib() + 64 * 1024 + k * bytes / 1024
}

fn size(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

/// Runs `args` under the ceiling for `input`; must end with exit 0 or 1 (never a signal) within
/// `secs`.
fn bounded(input: &Path, k: u64, secs: u64, args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let t = Instant::now();
    let (code, sig, err) = limited::run_limited(ceiling(size(input), k), args);
    assert_eq!(
        sig, None,
        "killed by signal {sig:?} under the memory ceiling: {err}"
    );
    assert!(matches!(code, Some(0) | Some(1)), "{code:?}: {err}");
    assert!(
        t.elapsed() < Duration::from_secs(secs),
        "{:?}: {err}",
        t.elapsed()
    );
    err
}

#[test]
fn cflow_metadata_arrays() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = GenSpec::new("llama");
    spec.layers = Some(1);
    spec.hidden = Some(64);
    spec.heads = Some(4);
    spec.kv_heads = Some(2);
    spec.ffn = Some(128);
    spec.vocab = Some(128);
    let cfg = spec.config().unwrap();
    let mut rng = Rng::new(1);
    let mut meta = cfg.meta.clone();
    // 8 M elements of `0,`: 16 MB of metadata.
    meta.provenance = serde_json::Value::Array(vec![0.into(); 8 << 20]);
    let p = dir.path().join("meta.cflow");
    let mut w = CflowWriter::create(&p, &cfg).unwrap();
    w.write_layer(&gen_layer(&mut rng, &cfg, QuantType::Q8_0))
        .unwrap();
    w.finish(&gen_vocab(&mut rng, &cfg, QuantType::Q8_0), &meta)
        .unwrap();
    drop(meta);
    let err = bounded(&p, 4, 60, &[&"inspect", &p]);
    assert!(
        err.contains("provenance") || err.contains("JSON values"),
        "{err}"
    );
}

fn spm_gguf(dir: &Path, name: &str, tokens: &[String]) -> std::path::PathBuf {
    let bytes = tiny_llama_gguf::gguf(
        None,
        &[
            ("tokenizer.ggml.tokens", str_array(tokens)),
            ("tokenizer.ggml.scores", f32_array(&vec![0.0; tokens.len()])),
        ],
        &|_, _| {},
    );
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// The vocabulary of a GGUF must have as many entries as the embedding has rows: pad it.
fn padded(mut t: Vec<String>, n: usize) -> Vec<String> {
    let mut i = 0;
    while t.len() < n {
        t.push(format!("<pad{i}>"));
        i += 1;
    }
    t
}

#[test]
fn sentencepiece_merges_chain_and_long_token() {
    let dir = tempfile::tempdir().unwrap();
    // a, aa, …, a^1900 (1.8 MB): every split of every piece is a merge (cubic in total size).
    let chain: Vec<String> = (1..=1900).map(|k| "a".repeat(k)).collect();
    let n = chain.len();
    let v = tiny_llama_gguf::V;
    // The tiny GGUF has V embedding rows: the vocabulary must match, so the chain is cut into
    // GGUFs of V tokens with the longest pieces (the costly part) in each.
    let chain = padded(chain[n - v..].to_vec(), v);
    let g = spm_gguf(dir.path(), "chain.gguf", &chain);
    let out = dir.path().join("chain.cflow");
    bounded(&g, 8, 60, &[&"import", &g, &"-o", &out]);
    // One piece of 400 KB next to its one-byte pieces: quadratic in its length before.
    let piece = "x".repeat(400_000) + "y";
    let long = padded(
        ["<unk>", "<s>", "</s>", "x", "y", piece.as_str()]
            .map(String::from)
            .to_vec(),
        v,
    );
    let g = spm_gguf(dir.path(), "long.gguf", &long);
    let out = dir.path().join("long.cflow");
    bounded(&g, 8, 30, &[&"import", &g, &"-o", &out]);
    // The same piece as the end-of-sequence (control) token: refused (the library's matcher of
    // special tokens is quadratic in one token's length).
    let long = padded(vec!["x".into(), "y".into(), piece], v);
    let g = spm_gguf(dir.path(), "long.gguf", &long);
    let out = dir.path().join("long.cflow");
    bounded(&g, 8, 30, &[&"import", &g, &"-o", &out]);
}

#[test]
fn export_chrome_streams() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.cflow");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_cflow-tui"))
        .args([
            "gen", "--arch", "llama", "--layers", "8", "--hidden", "64", "--heads", "4",
        ])
        .args([
            "--kv-heads",
            "2",
            "--ffn",
            "128",
            "--vocab",
            "130",
            "--max-ctx",
            "4096",
            "-o",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let trace = dir.path().join("t.jsonl");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_cflow-tui"))
        .arg("run")
        .arg(&model)
        .args([
            "--token-ids",
            "1,2,3",
            "-n",
            "4000",
            "--ignore-eos",
            "--threads",
            "1",
            "--record",
        ])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = dir.path().join("t.json");
    let err = bounded(&trace, 8, 60, &[&"export", &trace, &"--chrome", &out]);
    assert!(out.exists(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert!(v["traceEvents"].as_array().unwrap().len() > 4000);
}
