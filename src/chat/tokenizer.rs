//! Tokenizer wrapper for chat and generation.
//!
//! Owns: [`TokenizerWrap`], a `tokenizers::Tokenizer` loaded from a `tokenizer.json` string plus
//! the special-token policy ([`SpecialTokens`]: BOS/EOS/end-of-turn ids, end-of-generation set,
//! add-BOS rule), and [`TokenBytes`], the exact byte string every token id decodes to (byte-level
//! BPE alphabet undone, SentencePiece `▁`/`<0xXX>` pieces resolved) that the incremental
//! detokenizer in `chat::detok` works from.
//!
//! Hostile tokenizers and inputs are errors, never crashes: regexes with nested repetition are
//! refused at load (catastrophic backtracking), long inputs are encoded in bounded chunks cut
//! where the pre-tokenizer splits anyway (so ids do not change), and a panic inside the
//! `tokenizers`/`onig` libraries (`retry-limit-in-match over`) becomes [`TokenizerError`].

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

pub use crate::model::special::SpecialTokens;

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

/// Inputs longer than this are encoded in chunks of at most this many bytes (when the
/// tokenizer's splitting is regex-based; see [`TokenizerWrap::encode`]).
pub const CHUNK_BYTES: usize = 16 * 1024;
/// Chunk size for tokenizers with a regex outside the known table: such a regex may repeat one
/// atom per alternative, which backtracks O(n) per start position, O(n²) per chunk: 512-byte
/// chunks keep that to a few milliseconds.
pub const UNKNOWN_REGEX_CHUNK_BYTES: usize = 512;

/// Every `"Regex"` pattern string in a tokenizer.json document (pre-tokenizer `Split`,
/// normalizer and decoder `Replace`).
fn regex_patterns(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("Regex", Value::String(p)) => out.push(p.clone()),
                    _ => regex_patterns(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| regex_patterns(x, out)),
        _ => {}
    }
}

/// Whether `v` (a normalizer / pre-tokenizer tree) contains a component of type `ty`.
fn has_type(v: &Value, ty: &str) -> bool {
    match v {
        Value::Object(m) => {
            m.get("type").and_then(Value::as_str) == Some(ty) || m.values().any(|x| has_type(x, ty))
        }
        Value::Array(a) => a.iter().any(|x| has_type(x, ty)),
        _ => false,
    }
}

/// Whether a tokenizer regex may run: one of the pre-tokenizer table's patterns (Llama 3, GPT-2,
/// Qwen2, GPT-4o, ...; they behave on any input in bounded chunks), or a pattern simple enough
/// that it cannot backtrack badly ([`check_regex`]).
pub fn regex_allowed(pattern: &str) -> Result<bool, String> {
    if crate::chat::pretokenizer::known_pre_tokenizer_regexes().contains(&pattern) {
        return Ok(true);
    }
    check_regex(pattern).map(|_| false)
}

/// Refuse a regex that can backtrack badly: a repeated group (`(...)*`, `(...)+`, `(...){n,}`)
/// that contains a repetition or an alternation (`(a+)+`, `(a|a)*`: exponential), more than
/// one unbounded repetition in one alternative (`a*a*b`: polynomial), or a backreference.
pub fn check_regex(pattern: &str) -> Result<(), String> {
    struct Group {
        has_rep: bool,
        has_alt: bool,
        /// Unbounded repetitions in the current alternative of this group (a group's count
        /// is its busiest alternative: `max_reps`).
        reps_here: u32,
        max_reps: u32,
    }
    let c: Vec<char> = pattern.chars().collect();
    // Returns (is_quantifier, repeats, length) for a quantifier starting at i.
    let quant = |i: usize| -> (bool, bool, usize) {
        match c.get(i) {
            Some('*') | Some('+') => (true, true, 1),
            Some('?') => (true, false, 1),
            Some('{') => {
                let mut j = i + 1;
                let mut body = String::new();
                while j < c.len() && c[j] != '}' {
                    body.push(c[j]);
                    j += 1;
                }
                let valid = j < c.len()
                    && !body.is_empty()
                    && body.chars().all(|x| x.is_ascii_digit() || x == ',');
                if !valid {
                    return (false, false, 0);
                }
                let max = match body.split_once(',') {
                    None => body.parse::<u64>().unwrap_or(u64::MAX),
                    Some((_, "")) => u64::MAX,
                    Some((_, m)) => m.parse::<u64>().unwrap_or(u64::MAX),
                };
                (true, max > 1, j + 1 - i)
            }
            _ => (false, false, 0),
        }
    };
    let mut stack = vec![Group {
        has_rep: false,
        has_alt: false,
        reps_here: 0,
        max_reps: 0,
    }];
    let too_many = || {
        Err(format!(
            "regex `{pattern}` has more than one unbounded repetition in one alternative \
             (polynomial backtracking); only the known pre-tokenizer patterns may"
        ))
    };
    let mut i = 0;
    while i < c.len() {
        // Parse one atom (or a group end), then its quantifier.
        let mut closed: Option<Group> = None;
        match c[i] {
            '\\' => {
                if c.get(i + 1)
                    .is_some_and(|x| x.is_ascii_digit() && *x != '0' || *x == 'k')
                {
                    return Err(format!("regex `{pattern}` uses a backreference"));
                }
                i += 2
            }
            '[' => {
                // Character class, possibly nested (onig), with escapes.
                let mut depth = 0;
                while i < c.len() {
                    match c[i] {
                        '\\' => i += 1,
                        '[' => depth += 1,
                        ']' => {
                            depth -= 1;
                            if depth == 0 {
                                i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            '(' => {
                stack.push(Group {
                    has_rep: false,
                    has_alt: false,
                    reps_here: 0,
                    max_reps: 0,
                });
                i += 1;
                continue;
            }
            ')' => {
                if stack.len() > 1 {
                    closed = stack.pop();
                }
                i += 1;
            }
            '|' => {
                if let Some(g) = stack.last_mut() {
                    g.has_alt = true;
                    g.max_reps = g.max_reps.max(g.reps_here);
                    g.reps_here = 0;
                }
                i += 1;
                continue;
            }
            _ => i += 1,
        }
        let (is_q, repeats, len) = quant(i);
        let unbounded = is_q
            && (matches!(c.get(i), Some('*') | Some('+'))
                || (c.get(i) == Some(&'{')
                    && c[i..i + len].iter().collect::<String>().ends_with(",}")));
        if is_q {
            i += len;
            // Lazy / possessive modifiers.
            if matches!(c.get(i), Some('?') | Some('+')) {
                i += 1;
            }
        }
        if let Some(g) = &closed {
            if repeats && (g.has_rep || g.has_alt) {
                return Err(format!(
                    "regex `{pattern}` repeats a group that contains a repetition or an \
                     alternation (catastrophic backtracking)"
                ));
            }
        }
        if let Some(top) = stack.last_mut() {
            if repeats || closed.as_ref().is_some_and(|g| g.has_rep) {
                top.has_rep = true;
            }
            // A group's own repetitions count in the enclosing alternative.
            let inner = closed.as_ref().map_or(0, |g| g.max_reps.max(g.reps_here));
            top.reps_here += inner + u32::from(unbounded);
            if top.reps_here > 1 {
                return too_many();
            }
        }
    }
    Ok(())
}

/// Split `text` into pieces of at most `limit` bytes, each cut right before a space that
/// follows a non-whitespace character (every regex pre-tokenizer in use splits there: a space
/// starts a new piece, `" world"`); a stretch without such a place is cut at a character
/// boundary.
pub fn chunks(text: &str, limit: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > limit {
        let mut end = limit;
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let b = rest.as_bytes();
        let cut = (limit / 2..=end)
            .rev()
            .find(|&i| b[i] == b' ' && i > 0 && !b[i - 1].is_ascii_whitespace())
            .unwrap_or(end);
        let cut = if cut == 0 { end.max(1) } else { cut };
        let cut = (cut..=rest.len())
            .find(|&i| rest.is_char_boundary(i))
            .unwrap_or(rest.len());
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    out.push(rest);
    out
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
    /// Every id's bytes back to back (a 262 k-token vocabulary: ~2 MB here against ~10 MB as
    /// one allocation per id).
    data: Vec<u8>,
    /// Where id `i`'s bytes end in `data` (they start where id `i − 1`'s end).
    ends: Vec<u32>,
    /// Whether an id is a special (control) token, skipped by default when detokenizing.
    pub special: Vec<bool>,
    /// SentencePiece vocabularies prepend a space to the text; drop it at the start of output.
    pub strip_leading_space: bool,
}

impl TokenBytes {
    /// The table of `bytes[id]` (empty for unknown ids) and `special[id]`.
    pub fn new(bytes: Vec<Vec<u8>>, special: Vec<bool>, strip_leading_space: bool) -> TokenBytes {
        let mut data = Vec::with_capacity(bytes.iter().map(Vec::len).sum());
        let ends = bytes
            .iter()
            .map(|b| {
                data.extend_from_slice(b);
                data.len() as u32
            })
            .collect();
        TokenBytes {
            data,
            ends,
            special,
            strip_leading_space,
        }
    }

    /// Build from a tokenizer.json document.
    pub fn from_json(doc: &Value) -> TokenBytes {
        TokenBytes::from_doc(doc, None)
    }

    /// [`TokenBytes::from_json`] with the model's vocabulary given apart from the document
    /// (sorted by token, as [`crate::chat::tokenizer_parts::Parts::vocab_sorted`] gives it)
    /// instead of `doc["model"]["vocab"]`.
    pub fn from_doc(doc: &Value, vocab: Option<&[(&str, u32)]>) -> TokenBytes {
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
        // Ids come from the document: a table indexed by id is bounded by the number of
        // entries (a lone id of 16 M would cost 400 MB), ids past that have no bytes.
        let entries = vocab
            .map(<[_]>::len)
            .or(model["vocab"].as_object().map(|v| v.len()))
            .unwrap_or(0)
            + doc["added_tokens"].as_array().map_or(0, |a| a.len());
        let max_id = (2 * entries + 1024).min(1 << 24);
        let mut put = |id: usize, b: Vec<u8>, s: bool| {
            if id >= bytes.len() {
                if id > max_id {
                    return;
                }
                bytes.resize(id + 1, Vec::new());
                special.resize(id + 1, false);
            }
            bytes[id] = b;
            special[id] = s;
        };
        let from_doc = || {
            model["vocab"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(t, id)| {
                    id.as_u64()
                        .filter(|&id| id <= u64::from(u32::MAX))
                        .map(|id| (t.as_str(), id as u32))
                })
        };
        let listed: Box<dyn Iterator<Item = (&str, u32)>> = match vocab {
            Some(v) => Box::new(v.iter().copied()),
            None => Box::new(from_doc()),
        };
        {
            for (tok, id) in listed {
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
        TokenBytes::new(bytes, special, strip_leading_space)
    }

    /// Bytes of one id (empty if unknown).
    pub fn get(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match self.ends.get(i) {
            Some(&end) => {
                let start = if i == 0 { 0 } else { self.ends[i - 1] };
                &self.data[start as usize..end as usize]
            }
            None => &[],
        }
    }

    /// Ids the table covers (unknown ids past it have no bytes).
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when the table covers no id.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
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
    /// Inputs longer than this are encoded in chunks (`usize::MAX`: never; SentencePiece-style
    /// vocabularies would get their `▁` prefix again at every chunk, and run no regex).
    chunk: usize,
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
        // A BPE model's vocabulary and merges are read as lists, the rest as a small tree
        // (`tokenizer_parts`); any other model as one tree.
        let parts = super::tokenizer_parts::Parts::parse(json).ok().flatten();
        let doc: Value = match &parts {
            Some(p) => p.doc.clone(),
            None => serde_json::from_str(json).map_err(|e| TokenizerError::Load(e.to_string()))?,
        };
        let mut patterns = Vec::new();
        regex_patterns(&doc, &mut patterns);
        let mut all_known = true;
        for p in &patterns {
            all_known &= regex_allowed(p).map_err(TokenizerError::Load)?;
        }
        super::tokenizer_load::check(&doc).map_err(TokenizerError::Load)?;
        let spm = has_type(&doc["pre_tokenizer"], "Metaspace")
            || has_type(&doc["normalizer"], "Prepend")
            || has_type(&doc["normalizer"], "Precompiled");
        let vocab = parts.as_ref().map(|p| p.vocab_sorted());
        let bytes = Arc::new(TokenBytes::from_doc(&doc, vocab.as_deref()));
        drop(vocab);
        let post_processor = doc["post_processor"].clone();
        // A parsed document of a 262 k-token vocabulary holds ~300 MB: gone before the
        // library builds its own tables, so the two never add up in the peak.
        drop(doc);
        let tok =
            super::tokenizer_load::build_checked(parts, json).map_err(TokenizerError::Load)?;
        let chunk = if spm {
            usize::MAX
        } else if all_known {
            CHUNK_BYTES
        } else {
            UNKNOWN_REGEX_CHUNK_BYTES
        };
        let special = match special {
            Some(s) => s,
            None => infer_special(&tok, &post_processor),
        };
        Ok(TokenizerWrap {
            tok,
            special,
            bytes,
            chunk,
        })
    }

    /// Encode `text`; special tokens in the text (e.g. `<|im_start|>`) are always recognised.
    /// `add_special` adds BOS/EOS as the model's policy says.
    ///
    /// Text longer than [`CHUNK_BYTES`] ([`UNKNOWN_REGEX_CHUNK_BYTES`] with a regex outside the
    /// known table) is split by [`chunks`] and the pieces are encoded one by
    /// one, then post-processed once (BOS/EOS): the regex engine never sees an unbounded input
    /// (11 MB of spaces through the Llama 3 regex exceeded onig's retry limit). A panic inside
    /// the library is an [`TokenizerError::Encode`].
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = |e: tokenizers::Error| TokenizerError::Encode(e.to_string());
        let panicked = |p: String| {
            TokenizerError::Encode(format!(
                "the tokenizer gave up on this input ({p}); try a shorter or simpler text"
            ))
        };
        if text.len() <= self.chunk {
            return crate::chat::guard::guarded(|| self.tok.encode_fast(text, add_special))
                .map_err(panicked)?
                .map(|e| e.get_ids().to_vec())
                .map_err(enc);
        }
        crate::chat::guard::guarded(|| -> Result<Vec<u32>, tokenizers::Error> {
            let mut parts = Vec::new();
            for c in chunks(text, self.chunk) {
                parts.push(self.tok.encode_fast(c, false)?);
            }
            let merged = tokenizers::Encoding::merge(parts, true);
            Ok(self
                .tok
                .post_process(merged, None, add_special)?
                .get_ids()
                .to_vec())
        })
        .map_err(panicked)?
        .map_err(enc)
    }

    /// Decode ids to text (lossy on invalid UTF-8).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        crate::chat::guard::guarded(|| self.tok.decode(ids, skip_special))
            .map_err(|p| TokenizerError::Decode(format!("the tokenizer library panicked: {p}")))?
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

fn infer_special(tok: &tokenizers::Tokenizer, post_processor: &Value) -> SpecialTokens {
    let find = |names: &[&str]| names.iter().find_map(|n| tok.token_to_id(n));
    let bos = find(BOS_NAMES);
    let eos = find(EOS_NAMES);
    let eot = find(EOT_NAMES);
    let pp = serde_json::to_string(post_processor).unwrap_or_default();
    let mentions = |id: Option<u32>| {
        id.and_then(|i| tok.id_to_token(i))
            .is_some_and(|t| pp.contains(&format!("\"id\":{}", serde_json::Value::from(t))))
    };
    let mut eog: Vec<u32> = [eos, eot].into_iter().flatten().collect();
    for n in crate::chat::pretokenizer::EOG_NAMES {
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

    fn gpt2() -> TokenizerWrap {
        TokenizerWrap::from_json(crate::chat::bundled_gpt2_tokenizer().unwrap(), None).unwrap()
    }

    /// A tokenizer.json with one Split pre-tokenizer regex.
    pub(crate) fn with_split_regex(pattern: &str) -> String {
        let mut doc: Value =
            serde_json::from_str(crate::chat::bundled_gpt2_tokenizer().unwrap()).unwrap();
        doc["pre_tokenizer"] = serde_json::json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
            ]
        });
        doc.to_string()
    }

    #[test]
    fn nested_repetition_is_refused_at_load() {
        for bad in [
            "(a+)+$",
            "(a*)*",
            "(a|aa)+b",
            "(?:x+y){2,}",
            "((ab)+)+",
            "(a?|b)*",
            "a*a*b",
            "a+(b*)c",
            "x|a{2,}b+",
            r"(a)\1",
        ] {
            assert!(check_regex(bad).is_err(), "{bad} accepted");
            let e = TokenizerWrap::from_json(&with_split_regex(bad), None).unwrap_err();
            assert!(
                e.to_string().contains("backtrack") || e.to_string().contains("backref"),
                "{e}"
            );
        }
        // What real tokenizers ship is accepted.
        for good in [
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
            r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++",
            r"(a)+",
            r"[(a+)]+",
            r"\(a+\)",
            r"(?i:'s|'t)?\w+",
        ] {
            check_regex(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        // The table's patterns (two repetitions per alternative, e.g. `\s*[\r\n]+`) are
        // allowed by name, not by shape.
        let known = crate::chat::pretokenizer::known_pre_tokenizer_regexes();
        assert!(known.len() >= 8, "{}", known.len());
        for r in &known {
            assert_eq!(regex_allowed(r), Ok(true), "{r}");
        }
    }

    #[test]
    fn chunks_cover_the_text_and_respect_the_limit() {
        let text = "hello world,  this is\n\n a test ".repeat(400)
            + &"x".repeat(3000)
            + "é".repeat(900).as_str();
        for limit in [7, 64, 1000, 4096] {
            let parts = chunks(&text, limit);
            assert_eq!(parts.concat(), text);
            for p in &parts {
                assert!(p.len() <= limit + 4, "{} > {limit}", p.len());
                assert!(!p.is_empty());
            }
        }
        assert_eq!(chunks("short", 100), vec!["short"]);
    }

    #[test]
    fn chunked_encoding_gives_the_same_ids() {
        let t = gpt2();
        let goldens: Value = serde_json::from_str(include_str!(
            "../../tests/reference/goldens/tokenizer_ids.json"
        ))
        .unwrap();
        let prompts: Vec<&str> = goldens["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect();
        assert!(!prompts.is_empty());
        let mut text = String::new();
        let mut i = 0;
        while text.len() < 5 * CHUNK_BYTES {
            text.push_str(prompts[i % prompts.len()]);
            text.push_str(if i % 3 == 0 { "\n\n" } else { " " });
            i += 1;
        }
        for add_special in [false, true] {
            let whole = t.inner().encode_fast(text.as_str(), add_special).unwrap();
            let ours = t.encode(&text, add_special).unwrap();
            assert_eq!(ours, whole.get_ids(), "chunking changed the ids");
        }
        // Every golden prompt by itself (below the chunk size) is unchanged too.
        for p in &prompts {
            assert_eq!(
                t.encode(p, true).unwrap(),
                t.inner().encode_fast(*p, true).unwrap().get_ids()
            );
        }
    }

    #[test]
    fn eleven_megabytes_of_spaces_encode() {
        // The Llama 3 regex (with `\s*[\r\n]+` first) on one long run of spaces made onig
        // panic (`retry-limit-in-match over`); in chunks it is bounded.
        let llama3 = crate::chat::pretokenizer::pre_tokenizer_for("llama-bpe")
            .unwrap()
            .0;
        let t = TokenizerWrap::from_json(&with_split_regex(&llama3.join("|")), None).unwrap();
        let text = " ".repeat(11 << 20);
        let ids = t.encode(&text, false).unwrap();
        assert!(!ids.is_empty());
    }

    #[test]
    fn a_library_panic_is_an_encode_error() {
        // A pattern refused at load, forced in by building the wrapper around it directly: on
        // a run of `a`s onig exceeds its retry limit in one match attempt and panics inside
        // the library.
        let json = with_split_regex(r"a*a*a*a*a*(?!a)b|a");
        let t = TokenizerWrap {
            tok: json.parse().unwrap(),
            special: SpecialTokens::default(),
            bytes: Arc::new(TokenBytes::default()),
            chunk: usize::MAX,
        };
        let text = "a".repeat(200);
        match t.encode(&text, false) {
            Err(TokenizerError::Encode(m)) => assert!(m.contains("retry"), "{m}"),
            other => panic!("{other:?}"),
        }
        // The tokenizer still works afterwards.
        assert!(!t.encode("hello b", false).unwrap().is_empty());
    }
}
