//! Gemma 3's SentencePiece (`tokenizer.ggml.model = llama`) tokenizer built from the GGUF
//! metadata must give llama.cpp's ids on the golden prompts
//! (`tests/reference/goldens/tokenizer_ids_gemma3.json`, made by
//! `tests/reference/tokenizer_ids.py --set gemma3`): with and without BOS, non-ASCII text, runs
//! of spaces/tabs/newlines (user-defined tokens), code, digits, byte fallback, the Gemma turn
//! markers, the empty string. decode(encode(s)) == s and the incremental detokenizer streams the
//! same text. Needs the Gemma 3 GGUF (`$CFLOW_GEMMA3` or the pull cache); SKIP otherwise (a
//! failure under CI=true).

mod common;

use cflow::chat::detok::Detok;
use cflow::convert::gguf::GgufFile;
use cflow::convert::gguf_tokenizer::tokenizer_from_gguf;

struct Prompt {
    name: String,
    text: String,
    ids: Vec<u32>,
    ids_bos: Vec<u32>,
}

fn goldens() -> Vec<Prompt> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/reference/goldens/tokenizer_ids_gemma3.json"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("goldens")).expect("json");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    doc["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| Prompt {
            name: p["name"].as_str().unwrap_or_default().to_string(),
            text: p["text"].as_str().unwrap_or_default().to_string(),
            ids: ids(&p["ids"]),
            ids_bos: ids(&p["ids_bos"]),
        })
        .collect()
}

#[test]
fn gemma3_ids_match_llama_cpp_and_roundtrip() {
    let Some(path) = common::gemma3_gguf() else {
        return;
    };
    let f = GgufFile::open(&path).expect("open the Gemma 3 GGUF");
    let t = tokenizer_from_gguf(&f).expect("build the tokenizer");
    assert_eq!(t.model, "llama");
    assert_eq!(t.vocab_size, 262_144);
    assert!(t.special.add_bos);
    assert_eq!((t.special.bos, t.special.eos), (Some(2), Some(1)));
    let w = t.wrap().unwrap();
    let g = goldens();
    assert!(g.len() >= 8);
    let mut failures = Vec::new();
    for p in &g {
        let ours = w.encode(&p.text, false).unwrap();
        if ours != p.ids {
            failures.push(format!(
                "{}: ours {ours:?}\n  llama.cpp {:?}",
                p.name, p.ids
            ));
        }
        let ours_bos = w.encode(&p.text, true).unwrap();
        if ours_bos != p.ids_bos {
            failures.push(format!(
                "{} (add_bos): ours {ours_bos:?}\n  llama.cpp {:?}",
                p.name, p.ids_bos
            ));
        }
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
    let table = w.token_bytes();
    for p in &g {
        let ids = w.encode(&p.text, false).unwrap();
        assert_eq!(
            w.decode(&ids, false).unwrap(),
            p.text,
            "{}: decode(encode(s))",
            p.name
        );
        let mut d = Detok::new(table.clone()).with_special(true);
        let mut s: String = ids.iter().map(|&id| d.push(id)).collect();
        s.push_str(&d.flush());
        assert_eq!(s, p.text, "{}: incremental detok", p.name);
    }
}

/// The split loader (`chat::tokenizer_parts`, which keeps the 262 k-token vocabulary out of the
/// library's intermediate tree) builds the same tokenizer as the library's own parser of the
/// same text: equal serializations, and equal ids on every golden prompt.
#[test]
fn gemma3_split_loader_builds_the_library_s_tokenizer() {
    let Some(path) = common::gemma3_gguf() else {
        return;
    };
    let f = GgufFile::open(&path).expect("open the GGUF");
    let json = tokenizer_from_gguf(&f).expect("build the tokenizer").json;
    let parts = cflow::chat::tokenizer_parts::Parts::parse(&json)
        .expect("split")
        .expect("a BPE model");
    let ours = parts.build().expect("build from the parts");
    let theirs: tokenizers::Tokenizer = json.parse().expect("the library's parse");
    assert_eq!(
        ours.to_string(false).unwrap(),
        theirs.to_string(false).unwrap(),
        "serializations differ"
    );
    for p in goldens() {
        for bos in [false, true] {
            assert_eq!(
                ours.encode(p.text.as_str(), bos).unwrap().get_ids(),
                theirs.encode(p.text.as_str(), bos).unwrap().get_ids(),
                "{} (bos {bos})",
                p.name
            );
        }
    }
}
