//! Issue 44, class 1: tokenizer building never panics or aborts on hostile input. NaN
//! SentencePiece scores are refused naming `tokenizer.ggml.scores`; a malformed `Precompiled`
//! normaliser is refused before the `tokenizers` crate sees it (it reserved up to 8 GB, an
//! abort), on every path: HF import, the GGUF builder, a `.cflow` that carries it (`run`).

#[path = "common/gguf_writer.rs"]
mod gguf_writer;
#[path = "common/limited.rs"]
mod limited;
#[path = "common/tiny_llama_gguf.rs"]
mod tiny_llama_gguf;

use base64::Engine as _;
use cflow::chat::tokenizer::TokenizerWrap;
use cflow::convert::generate::{generate, GenSpec};
use cflow::convert::hf::import_hf;
use cflow::convert::import_gguf::{import_gguf, QuantTarget};
use cflow::quant::QuantType;
use gguf_writer::{f32_array, str_array};
use serde_json::{json, Value};
use std::path::Path;

/// A vocabulary with many merges (every split of `▁ab…` pieces), scores with NaNs among them.
#[test]
fn nan_scores_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    for c in 'a'..='z' {
        tokens.push(c.to_string());
    }
    while tokens.len() < tiny_llama_gguf::V {
        let i = tokens.len();
        tokens.push(format!(
            "{}{}",
            (b'a' + (i % 26) as u8) as char,
            (b'a' + (i / 3 % 26) as u8) as char
        ));
    }
    let scores: Vec<f32> = (0..tokens.len())
        .map(|i| if i % 3 == 0 { f32::NAN } else { -(i as f32) })
        .collect();
    let bytes = tiny_llama_gguf::gguf(
        None,
        &[
            ("tokenizer.ggml.tokens", str_array(&tokens)),
            ("tokenizer.ggml.scores", f32_array(&scores)),
        ],
        &|_, _| {},
    );
    let src = dir.path().join("nan.gguf");
    std::fs::write(&src, bytes).unwrap();
    let out = dir.path().join("nan.cflow");
    let e = import_gguf(&src, &out, QuantTarget::Keep, None, |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer.ggml.scores") && e.contains("NaN"),
        "{e}"
    );
    assert!(!out.exists());
}

/// A charsmap declaring a 4 GiB trie in a few bytes.
fn hostile_precompiled() -> Value {
    let map = [0xfc, 0xff, 0xff, 0xff, 1, 2, 3, 4];
    json!({"type": "Precompiled",
        "precompiled_charsmap": base64::engine::general_purpose::STANDARD.encode(map)})
}

fn with_precompiled(tokenizer_json: &str) -> String {
    let mut v: Value = serde_json::from_str(tokenizer_json).unwrap();
    v["normalizer"] = json!({"type": "Sequence", "normalizers": [hostile_precompiled()]});
    v.to_string()
}

fn ref_llama() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/hf/llama")
}

#[test]
fn a_malformed_precompiled_normaliser_is_an_error_on_every_path() {
    let tj = std::fs::read_to_string(ref_llama().join("tokenizer.json")).unwrap();
    let bad = with_precompiled(&tj);
    // The runtime wrapper (what a .cflow's tokenizer goes through).
    let e = TokenizerWrap::from_json(&bad, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("precompiled_charsmap"), "{e}");
    // HF import.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("llama");
    std::fs::create_dir(&src).unwrap();
    for e in std::fs::read_dir(ref_llama()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    std::fs::write(src.join("tokenizer.json"), &bad).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let e = import_hf(&src, &out.join("m.cflow"), QuantType::F32, None, |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("precompiled_charsmap"), "{e}");
    assert!(std::fs::read_dir(&out).unwrap().next().is_none());
}

/// A `.cflow` carrying such a tokenizer: `run` fails with an error, under a memory limit that
/// the 8 GB reservation would have hit (before: abort).
#[test]
fn run_on_a_cflow_with_a_hostile_tokenizer_exits_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let tj = std::fs::read_to_string(ref_llama().join("tokenizer.json")).unwrap();
    let mut spec = GenSpec::new("llama");
    spec.layers = Some(1);
    spec.hidden = Some(64);
    spec.heads = Some(4);
    spec.kv_heads = Some(2);
    spec.ffn = Some(128);
    let n_vocab = serde_json::from_str::<Value>(&tj).unwrap()["model"]["vocab"]
        .as_object()
        .unwrap()
        .len();
    spec.vocab = Some(n_vocab.div_ceil(32) * 32);
    spec.tokenizer_json = Some(with_precompiled(&tj));
    let p = dir.path().join("bad-tok.cflow");
    generate(&spec, &p, |_, _| {}).unwrap();
    let (code, sig, err) = limited::run_limited(
        limited::baseline_kib() + 1024 * 1024,
        &[&"run", &p, &"-p", &"hello", &"-n", &"2"],
    );
    assert_eq!((code, sig), (Some(1), None), "{err}");
    assert!(err.contains("precompiled_charsmap"), "{err}");
}
