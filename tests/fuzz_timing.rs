//! Per-input time of the `chat_template` and `tokenizer_encode` fuzz harnesses in a release
//! build (the fuzz builds carry AddressSanitizer): every input must finish in well under
//! 100 ms. Runs on the committed seeds; point `CFLOW_FUZZ_CORPUS_CHAT_TEMPLATE` /
//! `CFLOW_FUZZ_CORPUS_TOKENIZER_ENCODE` at a grown corpus directory to time all of it
//! (`cargo test --release --test fuzz_timing -- --nocapture` prints the slowest inputs).
//! The harness bodies mirror `fuzz/fuzz_targets/{chat_template,tokenizer_encode}.rs`.

use cflow::chat::template::{
    names_wrapped_function_as_value, render_unbounded_reference, ChatMessage, ChatTemplate,
};
use cflow::chat::tokenizer::{byte_level_char, TokenizerWrap};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn chat_template(data: &[u8]) {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(t) = ChatTemplate::new(src, "<s>", "</s>") else {
        return;
    };
    let msgs = [
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Hi {{ there }} {% raw %}"),
        ChatMessage::new("assistant", "Hello."),
    ];
    for gen in [true, false] {
        let Ok(ours) = t.render(&msgs, gen) else {
            continue;
        };
        if src.contains("debug")
            || ours.contains("cflow::chat::template_bounds")
            || names_wrapped_function_as_value(src)
        {
            continue;
        }
        let theirs = render_unbounded_reference(src, &msgs, gen, "<s>", "</s>");
        if matches!(&theirs, Err(e) if e.to_string().contains("minijinja panicked")) {
            continue;
        }
        assert_eq!(Ok(&ours), theirs.as_ref().map_err(|e| e.to_string()));
    }
}

fn base() -> Value {
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
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": id, "content": "<|eot|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": null,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false,
            "trim_offsets": false, "use_regex": false},
        "decoder": {"type": "ByteLevel", "add_prefix_space": false,
            "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": ms}
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

fn tokenizer_encode(data: &[u8]) {
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
    let mut doc = base();
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
            assert_eq!(t.decode(&ids, false).unwrap(), text);
        }
    }
}

fn inputs(target: &str) -> Vec<PathBuf> {
    let var = format!("CFLOW_FUZZ_CORPUS_{}", target.to_uppercase());
    let dir = std::env::var_os(&var)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fuzz/corpus")
                .join(target)
        });
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

fn time_all(target: &str, f: fn(&[u8])) {
    let files = inputs(target);
    assert!(!files.is_empty());
    let mut times: Vec<(Duration, PathBuf)> = files
        .iter()
        .map(|p| {
            let data = std::fs::read(p).unwrap();
            let t0 = Instant::now();
            f(&data);
            (t0.elapsed(), p.clone())
        })
        .collect();
    times.sort();
    println!("{target}: {} inputs; slowest:", times.len());
    for (d, p) in times.iter().rev().take(5) {
        println!("  {d:>10.2?}  {}", p.display());
    }
    let (worst, p) = times.last().unwrap();
    // 100 ms is the requirement; the margin absorbs a loaded shared machine.
    assert!(
        *worst < Duration::from_millis(250),
        "{}: {worst:?}",
        p.display()
    );
}

#[test]
fn chat_template_inputs_finish_fast() {
    time_all("chat_template", chat_template);
}

#[test]
fn tokenizer_encode_inputs_finish_fast() {
    time_all("tokenizer_encode", tokenizer_encode);
}
