//! Tokenizer building from GGUF metadata.
//!
//! Owns: turning the `tokenizer.ggml.*` keys of a GGUF file into a HuggingFace-format
//! `tokenizer.json` (returned as a string, so it can be embedded in a `.cflow` file) and a loaded
//! [`tokenizers::Tokenizer`], matching llama.cpp's tokenization:
//!
//! * `tokenizer.ggml.model = "gpt2"`: byte-level BPE (tokens, merges, token types). The
//!   `tokenizer.ggml.pre` name selects the pre-tokenizer split regexes llama.cpp uses (applied in
//!   sequence, each to the pieces of the previous one, matches kept as pieces); `llama3`-family
//!   vocabularies also ignore merges for whole-word vocabulary hits.
//! * `tokenizer.ggml.model = "llama"`: SentencePiece-style BPE with byte fallback: merges are
//!   derived from the piece scores, spaces become `▁`, a `▁` is prepended to each text segment when
//!   `tokenizer.ggml.add_space_prefix` (default true).
//!
//! Control, user-defined and unknown tokens become added tokens (control/unknown ones `special`),
//! so they are matched in the input text before pre-tokenization, like llama.cpp with
//! `parse_special = true`. BOS/EOS are added by the post-processor according to
//! `tokenizer.ggml.add_bos_token` / `add_eos_token` (with llama.cpp's per-model defaults).
//!
//! Known gap: llama.cpp's `clean_spaces` decode-time cleanup (GPT-2-style vocabularies only) is not
//! reproduced; encoding is unaffected.

use std::collections::{BTreeSet, HashMap};

use serde_json::{json, Value};

use super::gguf::{GgufError, GgufFile};

/// GGUF token types (`tokenizer.ggml.token_type`).
pub mod token_type {
    pub const NORMAL: i64 = 1;
    pub const UNKNOWN: i64 = 2;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
    pub const UNUSED: i64 = 5;
    pub const BYTE: i64 = 6;
}

/// Errors building a tokenizer from GGUF metadata.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerBuildError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{file}: unsupported tokenizer model {model:?} (supported: \"gpt2\", \"llama\")")]
    UnsupportedModel { file: String, model: String },
    #[error("{file}: unsupported pre-tokenizer {pre:?} (tokenizer.ggml.pre)")]
    UnsupportedPre { file: String, pre: String },
    #[error("{file}: bad tokenizer vocabulary: {reason}")]
    BadVocab { file: String, reason: String },
    #[error("{file}: building the tokenizer failed: {reason}")]
    Build { file: String, reason: String },
}

pub use crate::model::special::SpecialTokens;

/// A tokenizer built from GGUF metadata.
pub struct GgufTokenizer {
    /// HuggingFace `tokenizer.json` text.
    pub json: String,
    /// The same, loaded.
    pub tokenizer: tokenizers::Tokenizer,
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// `tokenizer.ggml.pre`, if present.
    pub pre: Option<String>,
    pub special: SpecialTokens,
    /// `tokenizer.chat_template`, if present.
    pub chat_template: Option<String>,
    pub vocab_size: usize,
}

impl GgufTokenizer {
    /// The runtime tokenizer over this one (what a `.cflow` imported from the GGUF loads).
    pub fn wrap(
        &self,
    ) -> Result<crate::chat::tokenizer::TokenizerWrap, crate::chat::tokenizer::TokenizerError> {
        crate::chat::tokenizer::TokenizerWrap::from_json(&self.json, Some(self.special.clone()))
    }
}

impl std::fmt::Debug for GgufTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTokenizer")
            .field("model", &self.model)
            .field("pre", &self.pre)
            .field("special", &self.special)
            .field("vocab_size", &self.vocab_size)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

use crate::chat::pretokenizer::EOT_NAMES;
pub use crate::chat::pretokenizer::{
    known_pre_tokenizer_regexes, pre_tokenizer_for, EOG_NAMES, PRE_TOKENIZER_ROWS,
};

fn opt_id(
    f: &GgufFile,
    key: &str,
    n_vocab: usize,
    default: Option<u32>,
) -> Result<Option<u32>, GgufError> {
    let id = match f.get(key) {
        None => default,
        // llama.cpp stores -1 (as u32::MAX or i32 -1) for "none"; treat out-of-range as none.
        Some(v) => v.as_int().and_then(|i| u32::try_from(i).ok()).or(None),
    };
    Ok(id.filter(|&i| (i as usize) < n_vocab))
}

fn added_token(id: u32, content: &str, special: bool) -> Value {
    json!({
        "id": id,
        "content": content,
        "single_word": false,
        "lstrip": false,
        "rstrip": false,
        "normalized": false,
        "special": special,
    })
}

fn post_processor(tokens: &[&str], sp: &SpecialTokens) -> Value {
    let bos = sp.bos.filter(|_| sp.add_bos);
    let eos = sp.eos.filter(|_| sp.add_eos);
    if bos.is_none() && eos.is_none() {
        return Value::Null;
    }
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = serde_json::Map::new();
    let tok = |id: u32| tokens[id as usize].to_string();
    if let Some(b) = bos {
        single.push(json!({"SpecialToken": {"id": tok(b), "type_id": 0}}));
        pair.push(json!({"SpecialToken": {"id": tok(b), "type_id": 0}}));
        specials.insert(
            tok(b),
            json!({"id": tok(b), "ids": [b], "tokens": [tok(b)]}),
        );
    }
    single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    pair.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
    if let Some(e) = eos {
        single.push(json!({"SpecialToken": {"id": tok(e), "type_id": 0}}));
        pair.push(json!({"SpecialToken": {"id": tok(e), "type_id": 0}}));
        specials.insert(
            tok(e),
            json!({"id": tok(e), "ids": [e], "tokens": [tok(e)]}),
        );
    }
    if let Some(b) = bos {
        pair.push(json!({"SpecialToken": {"id": tok(b), "type_id": 1}}));
    }
    pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
    if let Some(e) = eos {
        pair.push(json!({"SpecialToken": {"id": tok(e), "type_id": 1}}));
    }
    json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": specials,
    })
}

/// Build the tokenizer described by a GGUF file's metadata.
pub fn tokenizer_from_gguf(f: &GgufFile) -> Result<GgufTokenizer, TokenizerBuildError> {
    let file = f.name().to_string();
    let bad = |reason: String| TokenizerBuildError::BadVocab {
        file: file.clone(),
        reason,
    };
    let model = f.get_str("tokenizer.ggml.model")?.to_string();
    let pre = f.opt_str("tokenizer.ggml.pre")?.map(str::to_string);
    let tokens = f.get_str_array("tokenizer.ggml.tokens")?;
    let n = tokens.len();
    if n == 0 || n > u32::MAX as usize / 2 {
        return Err(bad(format!("{n} tokens")));
    }
    let types: Vec<i64> = match f.get("tokenizer.ggml.token_type") {
        Some(_) => f.get_int_array("tokenizer.ggml.token_type")?,
        None => vec![token_type::NORMAL; n],
    };
    if types.len() != n {
        return Err(bad(format!(
            "token_type has {} entries for {n} tokens",
            types.len()
        )));
    }
    let chat_template = f.opt_str("tokenizer.chat_template")?.map(str::to_string);

    // Token → id (last occurrence wins, as in llama.cpp).
    let mut vocab: HashMap<&str, u32> = HashMap::with_capacity(n);
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t, i as u32);
    }

    let (is_spm, def_bos, def_eos, def_unk, def_add_bos) = match model.as_str() {
        "gpt2" => (false, Some(11), Some(11), None, false),
        "llama" => (true, Some(1), Some(2), Some(0), true),
        _ => {
            return Err(TokenizerBuildError::UnsupportedModel {
                file: file.clone(),
                model,
            })
        }
    };
    let mut add_bos = def_add_bos;
    let (regexes, ignore_merges) = if is_spm {
        (Vec::new(), false)
    } else {
        let p = pre.as_deref().unwrap_or("default");
        let (r, ig) = pre_tokenizer_for(p).ok_or_else(|| TokenizerBuildError::UnsupportedPre {
            file: file.clone(),
            pre: p.to_string(),
        })?;
        if matches!(
            p,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "tekken"
        ) {
            add_bos = true;
        }
        (r, ig)
    };
    if let Some(b) = f.opt_bool("tokenizer.ggml.add_bos_token")? {
        add_bos = b;
    }
    let add_eos = f.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);

    let bos = opt_id(f, "tokenizer.ggml.bos_token_id", n, def_bos)?;
    let eos = opt_id(f, "tokenizer.ggml.eos_token_id", n, def_eos)?;
    let unk = opt_id(f, "tokenizer.ggml.unknown_token_id", n, def_unk)?;
    let pad = opt_id(f, "tokenizer.ggml.padding_token_id", n, None)?;
    let mut eot = opt_id(f, "tokenizer.ggml.eot_token_id", n, None)?;
    let eom = opt_id(f, "tokenizer.ggml.eom_token_id", n, None)?;
    if eot.is_none() {
        eot = EOT_NAMES.iter().find_map(|name| vocab.get(name).copied());
    }
    let mut eog: BTreeSet<u32> = [eos, eot, eom].into_iter().flatten().collect();
    for name in EOG_NAMES {
        if let Some(&id) = vocab.get(name) {
            eog.insert(id);
        }
    }
    // llama.cpp forces EOG/EOT-looking tokens to be control tokens.
    let mut types = types;
    for &id in &eog {
        if types[id as usize] == token_type::NORMAL {
            types[id as usize] = token_type::CONTROL;
        }
    }
    let special = SpecialTokens {
        bos,
        eos,
        eot,
        unk,
        pad,
        eog: eog.into_iter().collect(),
        add_bos,
        add_eos,
    };

    let mut added = Vec::new();
    let max_added = crate::chat::tokenizer_load::MAX_ADDED_TOKEN_BYTES;
    for (i, (t, &ty)) in tokens.iter().zip(&types).enumerate() {
        let special = matches!(
            ty,
            token_type::CONTROL | token_type::UNKNOWN | token_type::USER_DEFINED
        );
        if special && t.len() > max_added {
            return Err(bad(format!(
                "tokenizer.ggml.tokens[{i}]: a control/user-defined token of {} bytes (more \
                 than {max_added})",
                t.len()
            )));
        }
        match ty {
            token_type::CONTROL | token_type::UNKNOWN => added.push(added_token(i as u32, t, true)),
            token_type::USER_DEFINED => added.push(added_token(i as u32, t, false)),
            _ => {}
        }
    }

    let vocab_json: serde_json::Map<String, Value> = vocab
        .iter()
        .map(|(k, &v)| (k.to_string(), json!(v)))
        .collect();

    let (model_json, normalizer, pre_tokenizer, decoder) = if is_spm {
        let scores = match f.get("tokenizer.ggml.scores") {
            Some(_) => f.get_f32_array("tokenizer.ggml.scores")?,
            None => vec![0.0; n],
        };
        if scores.len() != n {
            return Err(bad(format!(
                "scores has {} entries for {n} tokens",
                scores.len()
            )));
        }
        // A NaN score has no rank (and made the merge sort panic).
        if let Some(i) = scores.iter().position(|s| s.is_nan()) {
            return Err(bad(format!("tokenizer.ggml.scores[{i}] is NaN")));
        }
        let bytes = tokens.iter().map(|t| t.len()).sum();
        let budget = super::spm_merges::MergeBudget::for_vocab(n, bytes);
        let merges = super::spm_merges::spm_merges(&tokens, &scores, &vocab, budget)
            .map_err(|e| bad(format!("tokenizer.ggml.tokens: {e}")))?;
        let add_space_prefix = f
            .opt_bool("tokenizer.ggml.add_space_prefix")?
            .unwrap_or(true);
        let mut norm = Vec::new();
        if add_space_prefix {
            norm.push(json!({"type": "Prepend", "prepend": "▁"}));
        }
        norm.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
        let mut dec = vec![
            json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        if add_space_prefix {
            dec.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        }
        (
            json!({
                "type": "BPE",
                "dropout": null,
                "unk_token": unk.map(|u| tokens[u as usize].to_string()),
                "continuing_subword_prefix": null,
                "end_of_word_suffix": null,
                "fuse_unk": true,
                "byte_fallback": true,
                "ignore_merges": false,
                "vocab": vocab_json,
                "merges": merges
                    .iter()
                    .map(|&(a, b)| json!([tokens[a as usize], tokens[b as usize]]))
                    .collect::<Vec<_>>(),
            }),
            json!({"type": "Sequence", "normalizers": norm}),
            Value::Null,
            json!({"type": "Sequence", "decoders": dec}),
        )
    } else {
        let merges_raw = f.get_str_array("tokenizer.ggml.merges")?;
        let mut merges = Vec::with_capacity(merges_raw.len());
        for (i, m) in merges_raw.iter().enumerate() {
            // Split at the first space after the first character (tokens may start with ' ').
            let pos = m
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(p, _)| p)
                .ok_or_else(|| bad(format!("merge #{i} {m:?} has no separator")))?;
            let (a, b) = (&m[..pos], &m[pos + 1..]);
            if !vocab.contains_key(a) || !vocab.contains_key(b) {
                return Err(bad(format!(
                    "merge #{i} {m:?} uses a token not in the vocabulary"
                )));
            }
            merges.push(json!([a, b]));
        }
        let mut pre_seq: Vec<Value> = regexes
            .iter()
            .map(|r| {
                json!({
                    "type": "Split",
                    "pattern": {"Regex": r},
                    "behavior": "Isolated",
                    "invert": false,
                })
            })
            .collect();
        pre_seq.push(json!({
            "type": "ByteLevel",
            "add_prefix_space": false,
            "trim_offsets": false,
            "use_regex": false,
        }));
        (
            json!({
                "type": "BPE",
                "dropout": null,
                "unk_token": null,
                "continuing_subword_prefix": null,
                "end_of_word_suffix": null,
                "fuse_unk": false,
                "byte_fallback": false,
                "ignore_merges": ignore_merges,
                "vocab": vocab_json,
                "merges": merges,
            }),
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": pre_seq}),
            json!({
                "type": "ByteLevel",
                "add_prefix_space": false,
                "trim_offsets": false,
                "use_regex": false,
            }),
        )
    };

    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(&tokens, &special),
        "decoder": decoder,
        "model": model_json,
    });
    let json = serde_json::to_string(&doc).map_err(|e| TokenizerBuildError::Build {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    let tokenizer = crate::chat::tokenizer_load::parse_checked(&json).map_err(|reason| {
        TokenizerBuildError::Build {
            file: file.clone(),
            reason,
        }
    })?;
    Ok(GgufTokenizer {
        json,
        tokenizer,
        model,
        pre,
        special,
        chat_template,
        vocab_size: n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::gguf::testutil::*;
    use crate::convert::gguf::GgufValue;

    /// Byte-level alphabet char for a byte (GPT-2 mapping).
    fn byte_char(b: u8) -> char {
        match b {
            b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF => b as char,
            _ => {
                let mut n = 0u32;
                for x in 0u32..256 {
                    let printable = matches!(x, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
                    if !printable {
                        if x == b as u32 {
                            break;
                        }
                        n += 1;
                    }
                }
                char::from_u32(256 + n).unwrap_or('?')
            }
        }
    }

    fn tiny_gpt2(pre: &str, add_bos: Option<bool>) -> GgufFile {
        let mut toks: Vec<String> = vec![
            "<|endoftext|>".into(),
            "<|im_start|>".into(),
            "<|im_end|>".into(),
        ];
        for b in 0..=255u8 {
            toks.push(byte_char(b).to_string());
        }
        toks.push("he".into());
        toks.push("ll".into());
        toks.push("hell".into());
        toks.push("hello".into());
        toks.push("Ġw".into());
        let mut types = vec![3, 3, 3];
        types.extend(std::iter::repeat_n(1, toks.len() - 3));
        let mut g = TestGguf::default()
            .kv("tokenizer.ggml.model", GgufValue::String("gpt2".into()))
            .kv("tokenizer.ggml.pre", GgufValue::String(pre.into()))
            .kv("tokenizer.ggml.tokens", str_array(&toks))
            .kv("tokenizer.ggml.token_type", i32_array(&types))
            .kv(
                "tokenizer.ggml.merges",
                str_array(&["h e", "l l", "he ll", "hell o", "Ġ w"]),
            )
            .kv("tokenizer.ggml.bos_token_id", GgufValue::U32(1))
            .kv("tokenizer.ggml.eos_token_id", GgufValue::U32(2))
            .kv("tokenizer.chat_template", GgufValue::String("{{x}}".into()));
        if let Some(b) = add_bos {
            g = g.kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(b));
        }
        GgufFile::parse(g.write().bytes, "tiny").unwrap()
    }

    #[test]
    fn tiny_gpt2_bpe() {
        let f = tiny_gpt2("smollm", Some(false));
        let t = tokenizer_from_gguf(&f).unwrap();
        assert_eq!(t.chat_template.as_deref(), Some("{{x}}"));
        assert_eq!(t.special.bos, Some(1));
        assert_eq!(t.special.eos, Some(2));
        assert_eq!(t.special.eot, Some(2));
        assert_eq!(t.special.eog, vec![0, 2]);
        let hello = 3 + 256 + 3;
        let enc = t.tokenizer.encode("hello<|im_end|> w12", true).unwrap();
        let w = 3 + 256 + 4;
        let d = |c: char| 3 + c as u32;
        assert_eq!(enc.get_ids(), &[hello, 2, w, d('1'), d('2')]);
        let dec = t.tokenizer.decode(enc.get_ids(), false).unwrap();
        assert_eq!(dec, "hello<|im_end|> w12");
    }

    #[test]
    fn add_bos_post_processor() {
        let f = tiny_gpt2("gpt-2", Some(true));
        let t = tokenizer_from_gguf(&f).unwrap();
        assert!(t.special.add_bos);
        let enc = t.tokenizer.encode("hello", true).unwrap();
        assert_eq!(enc.get_ids()[0], 1);
        let enc = t.tokenizer.encode("hello", false).unwrap();
        assert_ne!(enc.get_ids()[0], 1);
        // llama-bpe defaults to add_bos when the key is absent
        let t = tokenizer_from_gguf(&tiny_gpt2("llama-bpe", None)).unwrap();
        assert!(t.special.add_bos);
    }

    #[test]
    fn unknown_pre_is_a_clear_error() {
        let e = tokenizer_from_gguf(&tiny_gpt2("nonesuch", None)).unwrap_err();
        assert!(e.to_string().contains("nonesuch"), "{e}");
    }

    #[test]
    fn every_known_pre_compiles() {
        for pre in [
            "default",
            "llama-bpe",
            "dbrx",
            "falcon",
            "smollm",
            "gpt-2",
            "qwen2",
            "deepseek-coder",
            "gpt-4o",
            "tekken",
            "bloom",
            "viking",
        ] {
            tokenizer_from_gguf(&tiny_gpt2(pre, None)).unwrap_or_else(|e| panic!("{pre}: {e}"));
        }
    }

    #[test]
    fn tiny_spm() {
        let mut toks: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        let mut scores = vec![0.0f32, 0.0, 0.0];
        for b in 0..=255u32 {
            toks.push(format!("<0x{b:02X}>"));
            types.push(6);
            scores.push(0.0);
        }
        for (p, s) in [
            ("▁", -1.0),
            ("h", -2.0),
            ("i", -3.0),
            ("hi", -1.5),
            ("▁hi", -0.5),
        ] {
            toks.push(p.into());
            types.push(1);
            scores.push(s);
        }
        let g = TestGguf::default()
            .kv("tokenizer.ggml.model", GgufValue::String("llama".into()))
            .kv("tokenizer.ggml.tokens", str_array(&toks))
            .kv("tokenizer.ggml.token_type", i32_array(&types))
            .kv("tokenizer.ggml.scores", f32_array(&scores));
        let f = GgufFile::parse(g.write().bytes, "spm").unwrap();
        let t = tokenizer_from_gguf(&f).unwrap();
        assert!(t.special.add_bos);
        let enc = t.tokenizer.encode("hi hé", true).unwrap();
        let hi = 259 + 4;
        let sp = 259;
        // <s> ▁hi ▁ h <0xC3> <0xA9>
        assert_eq!(enc.get_ids(), &[1, hi, sp, 260, 3 + 0xC3, 3 + 0xA9]);
        let dec = t.tokenizer.decode(enc.get_ids(), true).unwrap();
        assert_eq!(dec, "hi hé");
    }
}
