//! Tokenizer building from untrusted data: SentencePiece merges derived from a vocabulary
//! (`convert::spm_merges`, what `import` runs on a GGUF `llama` vocabulary) and `tokenizer.json`
//! loading (`chat::tokenizer_load` via `TokenizerWrap::from_json`, what `run` does with a
//! `.cflow`'s tokenizer). Neither may panic, abort, or use memory or time out of proportion.
//!
//! Input: byte 0 picks the mode, the rest is the payload.
//! * mode 0: the payload split at `\n` is the vocabulary (at most 4096 pieces), byte `i` of it
//!   the score of piece `i` (255 = NaN, which the caller refuses: skipped); the merges must
//!   name vocabulary ids and stay within the budget;
//! * mode 1: the payload is a `tokenizer.json`; if it loads, a fixed text is encoded and
//!   decoded;
//! * mode 2: the payload is a `Precompiled` normaliser's charsmap (raw bytes) inside a small
//!   byte-fallback BPE; if it loads, a fixed text is encoded.
#![no_main]

use base64::Engine as _;
use cflow::chat::tokenizer::TokenizerWrap;
use cflow::convert::spm_merges::{spm_merges, MergeBudget};
use libfuzzer_sys::fuzz_target;
use serde_json::json;
use std::collections::HashMap;

fn merges(payload: &[u8]) {
    let text = String::from_utf8_lossy(payload);
    let tokens: Vec<&str> = text.split('\n').take(4096).collect();
    let scores: Vec<f32> = (0..tokens.len())
        .map(|i| payload.get(i).map_or(0.0, |&b| b as f32 - 128.0))
        .collect();
    let vocab: HashMap<&str, u32> = tokens.iter().enumerate().map(|(i, t)| (*t, i as u32)).collect();
    let bytes = tokens.iter().map(|t| t.len()).sum();
    let budget = MergeBudget::for_vocab(tokens.len(), bytes);
    if let Ok(m) = spm_merges(&tokens, &scores, &vocab, budget) {
        assert!(m.len() <= budget.max_merges);
        for (l, r) in m {
            let (l, r) = (tokens[l as usize], tokens[r as usize]);
            assert!(vocab.contains_key(format!("{l}{r}").as_str()));
        }
    }
}

fn load_and_encode(json: &str) {
    if let Ok(t) = TokenizerWrap::from_json(json, None) {
        if let Ok(ids) = t.encode("Hello wörld\n  ▁ab", true) {
            let _ = t.decode(&ids, false);
        }
    }
}

fn with_charsmap(map: &[u8]) -> String {
    let s = base64::engine::general_purpose::STANDARD.encode(map);
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": {"type": "Precompiled", "precompiled_charsmap": s},
        "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": true, "ignore_merges": false,
            "vocab": {"a": 0, "b": 1, "ab": 2, "<0x41>": 3}, "merges": [["a", "b"]]},
    })
    .to_string()
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, payload)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => merges(payload),
        1 => {
            if let Ok(s) = std::str::from_utf8(payload) {
                load_and_encode(s);
            }
        }
        _ => load_and_encode(&with_charsmap(payload)),
    }
});
