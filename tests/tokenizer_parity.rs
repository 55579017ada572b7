//! Tokenizer parity: our GGUF-built tokenizer must produce llama.cpp's ids on golden prompts
//! (`tests/reference/goldens/tokenizer_ids.json`, made by `tests/reference/tokenizer_ids.py`), decode
//! back to the input, detokenize incrementally to the same text, and render SmolLM2's own chat
//! template. Also checks the bundled GPT-2 tokenizer (`assets/tokenizer-gpt2.json`).
//! SmolLM2 tests need `CFLOW_SMOLLM2` (path to the GGUF) and are skipped otherwise.

mod common;

use cflow::chat::detok::Detok;
use cflow::chat::template::{ChatMessage, ChatTemplate};
use cflow::chat::tokenizer::TokenizerWrap;
use cflow::convert::gguf::GgufFile;
use cflow::convert::gguf_tokenizer::{tokenizer_from_gguf, GgufTokenizer};

fn smollm2() -> Option<GgufTokenizer> {
    let path = common::smollm2_gguf()?;
    let f = GgufFile::open(&path).expect("open SmolLM2 GGUF");
    Some(tokenizer_from_gguf(&f).expect("build tokenizer"))
}

fn goldens() -> Vec<(String, String, Vec<u32>)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/reference/goldens/tokenizer_ids.json"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("goldens")).expect("json");
    doc["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_string(),
                p["text"].as_str().unwrap_or_default().to_string(),
                p["ids"]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|v| v.as_u64().expect("id") as u32)
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn smollm2_ids_match_llama_cpp() {
    let Some(t) = smollm2() else { return };
    assert_eq!(t.model, "gpt2");
    assert_eq!(t.pre.as_deref(), Some("smollm"));
    assert!(!t.special.add_bos);
    assert_eq!(t.special.bos, Some(1));
    assert_eq!(t.special.eos, Some(2));
    assert_eq!(t.special.eot, Some(2));
    let w = t.wrap().unwrap();
    assert_eq!(w.vocab_size(), 49152);
    let mut failures = Vec::new();
    for (name, text, ids) in goldens() {
        let ours = w.encode(&text, false).unwrap();
        if ours != ids {
            failures.push(format!("{name}: ours {ours:?}\n  llama.cpp {ids:?}"));
        }
        // Same with add_special: SmolLM2 has add_bos_token = false, so nothing is added.
        assert_eq!(w.encode(&text, true).unwrap(), ours, "{name}");
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
}

/// Inputs longer than the chunk size are encoded in chunks (issue 14 item 8): on a long text
/// made of all golden prompts the ids are the same as one unchunked encode, and the golden
/// prompts themselves are llama.cpp's ids (previous test) through the same wrapper.
#[test]
fn smollm2_chunked_long_text_gives_the_same_ids() {
    let Some(t) = smollm2() else { return };
    let w = t.wrap().unwrap();
    let mut text = String::new();
    let g = goldens();
    let mut i = 0;
    while text.len() < 5 * cflow::chat::tokenizer::CHUNK_BYTES {
        text.push_str(&g[i % g.len()].1);
        text.push_str(if i % 2 == 0 { " " } else { "\n\n" });
        i += 1;
    }
    let whole = w.inner().encode_fast(text.as_str(), false).unwrap();
    assert_eq!(w.encode(&text, false).unwrap(), whole.get_ids());
}

#[test]
fn smollm2_roundtrip_and_incremental_detok() {
    let Some(t) = smollm2() else { return };
    let w = t.wrap().unwrap();
    let table = w.token_bytes();
    for (name, text, _) in goldens() {
        let ids = w.encode(&text, false).unwrap();
        assert_eq!(
            w.decode(&ids, false).unwrap(),
            text,
            "{name}: decode(encode(s))"
        );
        let mut d = Detok::new(table.clone()).with_special(true);
        let mut streamed = String::new();
        for &id in &ids {
            let piece = d.push(id);
            assert!(
                !piece.contains('\u{FFFD}'),
                "{name}: replacement char mid-stream"
            );
            streamed.push_str(&piece);
        }
        streamed.push_str(&d.flush());
        assert_eq!(streamed, text, "{name}: incremental detok");
        // Skipping specials equals the tokenizer's skip-special decode.
        let mut d = Detok::new(table.clone());
        let mut s: String = ids.iter().map(|&id| d.push(id)).collect();
        s.push_str(&d.flush());
        assert_eq!(s, w.decode(&ids, true).unwrap(), "{name}: skip-special");
    }
    // An emoji split across byte tokens streams as one piece.
    let ids = w.encode("🦀", false).unwrap();
    assert!(ids.len() > 1, "expected a multi-token emoji, got {ids:?}");
    let mut d = Detok::new(table);
    let pieces: Vec<String> = ids.iter().map(|&id| d.push(id)).collect();
    assert_eq!(pieces.concat(), "🦀");
    assert!(pieces[..pieces.len() - 1].iter().all(|p| p.is_empty()));
}

#[test]
fn smollm2_chat_template() {
    let Some(t) = smollm2() else { return };
    let src = t
        .chat_template
        .as_deref()
        .expect("SmolLM2 ships a chat template");
    let tmpl = ChatTemplate::new(src, "<|im_start|>", "<|im_end|>").unwrap();
    let msgs = [ChatMessage::new("user", "What is 2+2?")];
    let s = tmpl.render(&msgs, true).unwrap();
    assert_eq!(
        s,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ];
    let s = tmpl.render(&msgs, false).unwrap();
    assert_eq!(
        s,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
    // The rendered prompt tokenizes with the specials as single ids.
    let w = t.wrap().unwrap();
    let ids = w.encode(&s, false).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2);
}

#[test]
fn gpt2_asset_known_ids() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/tokenizer-gpt2.json");
    let json = std::fs::read_to_string(path).expect("assets/tokenizer-gpt2.json");
    let w = TokenizerWrap::from_json(&json, None).unwrap();
    assert_eq!(w.vocab_size(), 50257);
    assert_eq!(w.token_to_id("<|endoftext|>"), Some(50256));
    assert_eq!(w.eos_id(), Some(50256));
    assert!(w.is_eog(50256));
    assert_eq!(w.encode("Hello world", false).unwrap(), vec![15496, 995]);
    assert_eq!(w.encode(" the", false).unwrap(), vec![262]);
    assert_eq!(
        w.encode("Hello world<|endoftext|>", false).unwrap(),
        vec![15496, 995, 50256]
    );
    // Reference ids from gpt-3-encoder@1.1.4's own Encoder.js (node) on the same string.
    let text = "It's 2024: naïve café — 日本語 🦀! The  quick\n\n brown fox's 123456 jumps.";
    let reference = [
        1026, 338, 48609, 25, 41492, 40304, 851, 10545, 245, 98, 17312, 105, 45739, 252, 12520, 99,
        222, 0, 383, 220, 2068, 628, 7586, 21831, 338, 17031, 29228, 18045, 13,
    ];
    assert_eq!(w.encode(text, false).unwrap(), reference);
    let ids = w.encode(text, false).unwrap();
    assert_eq!(w.decode(&ids, false).unwrap(), text);
    let mut d = Detok::new(w.token_bytes());
    let mut s: String = ids.iter().map(|&id| d.push(id)).collect();
    s.push_str(&d.flush());
    assert_eq!(s, text);
}
