//! Tokenizer wrapper for chat and generation.
//!
//! Owns: [`TokenizerWrap`], a `tokenizers::Tokenizer` loaded from a `tokenizer.json` string plus
//! the special-token policy ([`SpecialTokens`]: BOS/EOS/end-of-turn ids, end-of-generation set,
//! add-BOS rule), and [`TokenBytes`], the exact byte string every token id decodes to (byte-level
//! BPE alphabet undone, SentencePiece `▁`/`<0xXX>` pieces resolved) that the incremental
//! detokenizer in `chat::detok` works from.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

pub use crate::convert::gguf_tokenizer::SpecialTokens;

/// Tokenizer errors.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer.json is invalid: {0}")]
    Load(String),
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("decoding failed: {0}")]
    Decode(String),
}

/// The GPT-2 byte-level alphabet: byte → char. Printable Latin-1 bytes map to themselves, the
/// rest to U+0100.. in byte order.
pub fn byte_level_char(b: u8) -> char {
    let printable = |x: u32| matches!(x, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b as u32) {
        return b as char;
    }
    let n = (0..b as u32).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap_or('\u{FFFD}')
}

fn byte_level_inverse() -> HashMap<char, u8> {
    (0..=255u8).map(|b| (byte_level_char(b), b)).collect()
}

/// How each token id turns into bytes.
#[derive(Clone, Debug, Default)]
pub struct TokenBytes {
    /// Bytes per id (empty for unknown ids).
    pub bytes: Vec<Vec<u8>>,
    /// Whether an id is a special (control) token, skipped by default when detokenizing.
    pub special: Vec<bool>,
    /// SentencePiece vocabularies prepend a space to the text; drop it at the start of output.
    pub strip_leading_space: bool,
}

impl TokenBytes {
    /// Build from a tokenizer.json document.
    pub fn from_json(doc: &Value) -> TokenBytes {
        let model = &doc["model"];
        let decoder = &doc["decoder"];
        let decoder_types: Vec<&str> = match decoder["type"].as_str() {
            Some("Sequence") => decoder["decoders"]
                .as_array()
                .map(|a| a.iter().filter_map(|d| d["type"].as_str()).collect())
                .unwrap_or_default(),
            Some(t) => vec![t],
            None => vec![],
        };
        let byte_level = decoder_types.contains(&"ByteLevel");
        let metaspace = decoder_types.contains(&"Metaspace")
            || decoder["decoders"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|d| d["type"] == "Replace" && d["pattern"]["String"] == "▁")
            });
        let byte_fallback = model["byte_fallback"].as_bool().unwrap_or(false)
            || decoder_types.contains(&"ByteFallback");
        let strip_leading_space = decoder["decoders"].as_array().is_some_and(|a| {
            a.iter()
                .any(|d| d["type"] == "Strip" && d["start"].as_u64().unwrap_or(0) >= 1)
        }) || (decoder_types.contains(&"Metaspace")
            && decoder["prepend_scheme"].as_str().unwrap_or("always") != "never");

        let inv = byte_level_inverse();
        let mut bytes: Vec<Vec<u8>> = Vec::new();
        let mut special: Vec<bool> = Vec::new();
        let mut put = |id: usize, b: Vec<u8>, s: bool| {
            if id >= bytes.len() {
                // Bound growth: ids come from the document we were given.
                if id > 1 << 24 {
                    return;
                }
                bytes.resize(id + 1, Vec::new());
                special.resize(id + 1, false);
            }
            bytes[id] = b;
            special[id] = s;
        };
        if let Some(vocab) = model["vocab"].as_object() {
            for (tok, id) in vocab {
                let Some(id) = id.as_u64() else { continue };
                let b = if byte_level {
                    let mut out = Vec::with_capacity(tok.len());
                    for c in tok.chars() {
                        match inv.get(&c) {
                            Some(&b) => out.push(b),
                            None => {
                                let mut buf = [0u8; 4];
                                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                            }
                        }
                    }
                    out
                } else if byte_fallback
                    && tok.len() == 6
                    && tok.starts_with("<0x")
                    && tok.ends_with('>')
                {
                    match u8::from_str_radix(&tok[3..5], 16) {
                        Ok(b) => vec![b],
                        Err(_) => tok.as_bytes().to_vec(),
                    }
                } else if metaspace {
                    tok.replace('▁', " ").into_bytes()
                } else {
                    tok.as_bytes().to_vec()
                };
                put(id as usize, b, false);
            }
        }
        if let Some(added) = doc["added_tokens"].as_array() {
            for t in added {
                let (Some(id), Some(content)) = (t["id"].as_u64(), t["content"].as_str()) else {
                    continue;
                };
                put(
                    id as usize,
                    content.as_bytes().to_vec(),
                    t["special"].as_bool().unwrap_or(false),
                );
            }
        }
        TokenBytes {
            bytes,
            special,
            strip_leading_space,
        }
    }

    /// Bytes of one id (empty if unknown).
    pub fn get(&self, id: u32) -> &[u8] {
        self.bytes
            .get(id as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Whether `id` is a special token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }
}

const BOS_NAMES: &[&str] = &["<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"];
const EOS_NAMES: &[&str] = &["<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>"];
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
];

/// A tokenizer plus its special-token policy.
#[derive(Clone)]
pub struct TokenizerWrap {
    tok: tokenizers::Tokenizer,
    special: SpecialTokens,
    bytes: Arc<TokenBytes>,
}

impl std::fmt::Debug for TokenizerWrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenizerWrap")
            .field("vocab_size", &self.vocab_size())
            .field("special", &self.special)
            .finish()
    }
}

impl TokenizerWrap {
    /// Load from tokenizer.json text. `special = None` infers the special ids from well-known
    /// token names and the post-processor.
    pub fn from_json(json: &str, special: Option<SpecialTokens>) -> Result<Self, TokenizerError> {
        let doc: Value =
            serde_json::from_str(json).map_err(|e| TokenizerError::Load(e.to_string()))?;
        let tok: tokenizers::Tokenizer = json
            .parse()
            .map_err(|e: tokenizers::Error| TokenizerError::Load(e.to_string()))?;
        let special = match special {
            Some(s) => s,
            None => infer_special(&tok, &doc),
        };
        Ok(TokenizerWrap {
            tok,
            special,
            bytes: Arc::new(TokenBytes::from_json(&doc)),
        })
    }

    /// Wrap a tokenizer built from GGUF metadata.
    pub fn from_gguf(
        t: &crate::convert::gguf_tokenizer::GgufTokenizer,
    ) -> Result<Self, TokenizerError> {
        Self::from_json(&t.json, Some(t.special.clone()))
    }

    /// Encode `text`; special tokens in the text (e.g. `<|im_start|>`) are always recognised.
    /// `add_special` adds BOS/EOS as the model's policy says.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.tok
            .encode_fast(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Decode ids to text (lossy on invalid UTF-8).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.tok
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// The special-token policy.
    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.special.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.special.eos
    }

    /// End-of-turn id (falls back to EOS).
    pub fn eot_id(&self) -> Option<u32> {
        self.special.eot.or(self.special.eos)
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.special.eog.contains(&id) || Some(id) == self.special.eos
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.tok.get_vocab_size(true)
    }

    /// Token text as stored in the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tok.id_to_token(id)
    }

    /// Id of a token string.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tok.token_to_id(token)
    }

    /// Per-id byte table for incremental detokenization.
    pub fn token_bytes(&self) -> Arc<TokenBytes> {
        self.bytes.clone()
    }

    /// The underlying tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.tok
    }
}

fn infer_special(tok: &tokenizers::Tokenizer, doc: &Value) -> SpecialTokens {
    let find = |names: &[&str]| names.iter().find_map(|n| tok.token_to_id(n));
    let bos = find(BOS_NAMES);
    let eos = find(EOS_NAMES);
    let eot = find(EOT_NAMES);
    let pp = serde_json::to_string(&doc["post_processor"]).unwrap_or_default();
    let mentions = |id: Option<u32>| {
        id.and_then(|i| tok.id_to_token(i))
            .is_some_and(|t| pp.contains(&format!("\"id\":{}", serde_json::Value::from(t))))
    };
    let mut eog: Vec<u32> = [eos, eot].into_iter().flatten().collect();
    for n in crate::convert::gguf_tokenizer::EOG_NAMES {
        if let Some(id) = tok.token_to_id(n) {
            eog.push(id);
        }
    }
    eog.sort_unstable();
    eog.dedup();
    SpecialTokens {
        bos,
        eos,
        eot,
        unk: None,
        pad: None,
        eog,
        add_bos: mentions(bos),
        add_eos: mentions(eos) && eos != bos,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet() {
        assert_eq!(byte_level_char(b' '), 'Ġ');
        assert_eq!(byte_level_char(b'\n'), 'Ċ');
        assert_eq!(byte_level_char(b'a'), 'a');
        assert_eq!(byte_level_char(0xAD), 'Ń');
        let inv = byte_level_inverse();
        assert_eq!(inv.len(), 256);
    }
}
