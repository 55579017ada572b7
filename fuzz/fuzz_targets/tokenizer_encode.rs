//! Hostile tokenizers and inputs through our tokenizer wrapper (`TokenizerWrap`): a crafted
//! pre-tokenizer or normalizer regex plus a text. Loading may refuse the regex; encoding may
//! fail with an error; neither may panic, abort or take long (onig's `retry-limit-in-match`
//! panics are caught, backtracking shapes are refused at load, long texts go in chunks).
//!
//! Input: byte 0 picks the mode, byte 1 a table regex and a repeat count, then
//! `regex \0 text`.
//! * mode 0: the regex as a `Split` pre-tokenizer (then byte-level), on a tiny byte-level BPE;
//! * mode 1: a regex of the known pre-tokenizer table instead (the text repeated up to 20 KiB,
//!   so that long inputs go through the chunked path); decode must give the text back;
//! * mode 2: the regex as a `Replace` normalizer pattern;
//! * mode 3: GPT-2's built-in byte-level regex (`use_regex: true`), text repeated.
#![no_main]

use cflow::chat::tokenizer::{byte_level_char, TokenizerWrap};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use std::sync::OnceLock;

/// A byte-level BPE with the 256 byte tokens, a few merges and one special token.
fn base() -> &'static Value {
    static B: OnceLock<Value> = OnceLock::new();
    B.get_or_init(|| {
        let mut vocab = serde_json::Map::new();
        for b in 0..=255u8 {
            vocab.insert(byte_level_char(b).to_string(), json!(b as u32));
        }
        let merges = [
            ("Ġ", "t"),
            ("h", "e"),
            ("Ġt", "he"),
            ("Ġ", "Ġ"),
            ("a", "a"),
            ("Ċ", "Ċ"),
        ];
        let mut id = 256u32;
        let mut ms = Vec::new();
        for (a, b) in merges {
            vocab.insert(format!("{a}{b}"), json!(id));
            ms.push(json!(format!("{a} {b}")));
            id += 1;
        }
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [{"id": id, "content": "<|eot|>", "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": null,
            "post_processor": {"type": "ByteLevel", "add_prefix_space": false,
                "trim_offsets": false, "use_regex": false},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false,
                "trim_offsets": false, "use_regex": false},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": ms}
        })
    })
}

fn split(pattern: &str) -> Value {
    json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
    ]})
}

fn repeated(text: &str, k: usize) -> String {
    let k = k.min((20 * 1024) / text.len().max(1)).max(1);
    text.repeat(k)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (mode, sel) = (data[0] % 4, data[1]);
    let rest = &data[2..];
    let (re, text) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&rest[..0], rest),
    };
    let (Ok(re), Ok(text)) = (std::str::from_utf8(re), std::str::from_utf8(text)) else {
        return;
    };
    let mut doc = base().clone();
    let known = cflow::convert::gguf_tokenizer::known_pre_tokenizer_regexes();
    let mut text = text.to_string();
    let roundtrip = match mode {
        0 => {
            doc["pre_tokenizer"] = split(re);
            false
        }
        1 => {
            doc["pre_tokenizer"] = split(known[sel as usize % known.len()]);
            text = repeated(&text, 1 << (sel >> 5));
            true
        }
        2 => {
            doc["normalizer"] =
                json!({"type": "Replace", "pattern": {"Regex": re}, "content": "Ġx"});
            doc["pre_tokenizer"] = json!({"type": "ByteLevel", "add_prefix_space": false,
                "trim_offsets": false, "use_regex": false});
            false
        }
        _ => {
            doc["pre_tokenizer"] = json!({"type": "ByteLevel", "add_prefix_space": false,
                "trim_offsets": false, "use_regex": true});
            text = repeated(&text, 1 << (sel >> 5));
            true
        }
    };
    let Ok(t) = TokenizerWrap::from_json(&doc.to_string(), None) else {
        return;
    };
    for add_special in [false, true] {
        let Ok(ids) = t.encode(&text, add_special) else {
            continue;
        };
        if roundtrip && !add_special && !text.contains("<|eot|>") {
            let back = t.decode(&ids, false).expect("decode of our own ids");
            assert_eq!(back, text, "decode(encode(text)) != text");
        }
    }
});
