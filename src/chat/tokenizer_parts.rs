//! A `tokenizer.json` read in one pass without building its big parts twice: a BPE model's
//! vocabulary and merges become plain lists, everything else a small JSON tree.
//!
//! The `tokenizers` crate parses a model through an untagged enum, which first copies the
//! whole model (a 262 k-token vocabulary and its merges) into an intermediate tree, then reads
//! it again: loading Gemma 3's tokenizer peaked at ~350 MB of heap that way. [`Parts::parse`]
//! reads the vocabulary and merges straight into lists; [`Parts::build`] gives them to the
//! crate's `BpeBuilder` and lets the crate parse only the rest (normalizer, pre-tokenizer,
//! post-processor, decoder, with a stub model), then sets the model and adds the added tokens
//! in the order the crate's own loader does. The result is the same tokenizer (tested: equal
//! serializations and encodings). Other model types return `None` and take the crate's path.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// A `tokenizer.json` with a BPE model, split.
pub struct Parts {
    /// Every top-level field; `model` without its `vocab` and `merges`.
    pub doc: Value,
    /// The model's vocabulary in document order (a later duplicate key replaces an earlier one
    /// when the model is built, as in a JSON map).
    pub vocab: Vec<(String, u32)>,
    /// The model's merges as pairs, in rank order.
    pub merges: Vec<(String, String)>,
}

impl Parts {
    /// Splits `json`. `Ok(None)`: the model is not a BPE with a vocabulary and merges (the
    /// caller uses the crate's parser). `Err`: not a JSON object, or a malformed vocabulary or
    /// merge list (named).
    pub fn parse(json: &str) -> Result<Option<Parts>, String> {
        let mut de = serde_json::Deserializer::from_str(json);
        let top = de
            .deserialize_map(TopVisitor)
            .and_then(|t| de.end().map(|()| t))
            .map_err(|e| e.to_string())?;
        let Top { mut doc, model } = top;
        let Some(ModelParts {
            rest,
            vocab,
            merges,
        }) = model
        else {
            return Ok(None);
        };
        let is_bpe = rest.get("type").and_then(Value::as_str) == Some("BPE");
        match (is_bpe, vocab, merges) {
            (true, Some(vocab), Some(merges)) => {
                doc.insert("model".into(), Value::Object(rest));
                let merges = merges.into_pairs()?;
                Ok(Some(Parts {
                    doc: Value::Object(doc),
                    vocab,
                    merges,
                }))
            }
            _ => Ok(None),
        }
    }

    /// The vocabulary as the crate's JSON-map parse would leave it, sorted by token (the order
    /// `serde_json`'s map iterates): one entry per token, the last one given.
    pub fn vocab_sorted(&self) -> Vec<(&str, u32)> {
        let mut v: Vec<(&str, u32)> = self.vocab.iter().map(|(t, i)| (t.as_str(), *i)).collect();
        // Stable: equal tokens keep document order, and the last of each run is kept.
        v.sort_by(|a, b| a.0.cmp(b.0));
        let mut out: Vec<(&str, u32)> = Vec::with_capacity(v.len());
        for e in v {
            match out.last_mut() {
                Some(last) if last.0 == e.0 => *last = e,
                _ => out.push(e),
            }
        }
        out
    }

    /// The tokenizer (consumes the lists): the BPE model from the lists and the model's
    /// settings, everything else parsed by the crate from [`Parts::doc`].
    pub fn build(self) -> Result<tokenizers::Tokenizer, String> {
        use tokenizers::models::bpe::{BpeBuilder, Vocab};
        let Parts { doc, vocab, merges } = self;
        let model = &doc["model"];
        let text = |k: &str| -> Result<Option<String>, String> {
            match &model[k] {
                Value::Null => Ok(None),
                Value::String(s) => Ok(Some(s.clone())),
                _ => Err(format!("model.{k}: not a string")),
            }
        };
        let flag = |k: &str| -> Result<Option<bool>, String> {
            match &model[k] {
                Value::Null => Ok(None),
                Value::Bool(b) => Ok(Some(*b)),
                _ => Err(format!("model.{k}: not a boolean")),
            }
        };
        let mut b = BpeBuilder::new();
        match &model["dropout"] {
            Value::Null => {}
            v => match v.as_f64() {
                Some(p) => b = b.dropout(p as f32),
                None => return Err("model.dropout: not a number".into()),
            },
        }
        if let Some(s) = text("unk_token")? {
            b = b.unk_token(s);
        }
        if let Some(s) = text("continuing_subword_prefix")? {
            b = b.continuing_subword_prefix(s);
        }
        if let Some(s) = text("end_of_word_suffix")? {
            b = b.end_of_word_suffix(s);
        }
        if let Some(f) = flag("fuse_unk")? {
            b = b.fuse_unk(f);
        }
        if let Some(f) = flag("byte_fallback")? {
            b = b.byte_fallback(f);
        }
        if let Some(f) = flag("ignore_merges")? {
            b = b.ignore_merges(f);
        }
        let vocab: Vocab = vocab.into_iter().collect();
        let bpe = b
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| format!("model: {e}"))?;
        // The crate parses the small rest, with an empty model and no added tokens; the added
        // tokens are added once the real model is in place, as its own loader does.
        let mut stub = doc.clone();
        stub["model"] = serde_json::json!({"type": "BPE", "vocab": {}, "merges": []});
        stub["added_tokens"] = Value::Array(Vec::new());
        let mut tok: tokenizers::Tokenizer =
            serde_json::from_value(stub).map_err(|e| e.to_string())?;
        let added: Vec<WithId> = match &doc["added_tokens"] {
            Value::Null => Vec::new(),
            v => serde_json::from_value(v.clone()).map_err(|e| format!("added_tokens: {e}"))?,
        };
        tok.with_model(bpe);
        let added: Vec<tokenizers::AddedToken> = added.into_iter().map(|t| t.token).collect();
        tok.add_tokens(&added);
        Ok(tok)
    }
}

/// One entry of `added_tokens` (the crate's own type for it is private).
#[derive(serde::Deserialize)]
struct WithId {
    #[allow(dead_code)] // read so that a missing id is refused, as by the crate
    id: u32,
    #[serde(flatten)]
    token: tokenizers::AddedToken,
}

/// The top level: the model split, every other field a [`Value`].
struct Top {
    doc: Map<String, Value>,
    model: Option<ModelParts>,
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Top;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a tokenizer.json object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Top, A::Error> {
        let mut doc = Map::new();
        let mut model = None;
        while let Some(k) = m.next_key::<String>()? {
            if k == "model" {
                model = m.next_value_seed(ModelSeed)?;
            } else {
                doc.insert(k, m.next_value()?);
            }
        }
        Ok(Top { doc, model })
    }
}

/// The model object's vocabulary and merges (when they have the BPE shapes) and its other
/// fields.
struct ModelParts {
    rest: Map<String, Value>,
    vocab: Option<Vec<(String, u32)>>,
    merges: Option<Merges>,
}

/// `model`: `None` for JSON `null`; anything else that is not an object is an error (the caller
/// then leaves the whole document to the crate's parser, which words it).
struct ModelSeed;

impl<'de> DeserializeSeed<'de> for ModelSeed {
    type Value = Option<ModelParts>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(ModelVisitor)
    }
}

struct ModelVisitor;

impl<'de> Visitor<'de> for ModelVisitor {
    type Value = Option<ModelParts>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a model object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        let mut rest = Map::new();
        let (mut vocab, mut merges) = (None, None);
        while let Some(k) = m.next_key::<String>()? {
            match k.as_str() {
                // A Unigram vocabulary is a list: kept as a Value, the crate parses it.
                "vocab" => match m.next_value::<VocabOrValue>()? {
                    VocabOrValue::Map(v) => vocab = Some(v),
                    VocabOrValue::Other(v) => {
                        vocab = None;
                        rest.insert(k, v);
                    }
                },
                "merges" => merges = Some(m.next_value::<Merges>()?),
                _ => {
                    rest.insert(k, m.next_value()?);
                }
            }
        }
        Ok(Some(ModelParts {
            rest,
            vocab,
            merges,
        }))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// A vocabulary map read into a list, or any other value kept as it is.
enum VocabOrValue {
    Map(Vec<(String, u32)>),
    Other(Value),
}

impl<'de> serde::Deserialize<'de> for VocabOrValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = VocabOrValue;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a vocabulary")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<VocabOrValue, A::Error> {
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(0).min(1 << 20));
                while let Some((k, v)) = m.next_entry::<String, u32>()? {
                    out.push((k, v));
                }
                Ok(VocabOrValue::Map(out))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, s: A) -> Result<VocabOrValue, A::Error> {
                let v = serde::Deserialize::deserialize(de::value::SeqAccessDeserializer::new(s))?;
                Ok(VocabOrValue::Other(v))
            }

            fn visit_unit<E: de::Error>(self) -> Result<VocabOrValue, E> {
                Ok(VocabOrValue::Other(Value::Null))
            }
        }
        d.deserialize_any(V)
    }
}

/// A merge list in either of the crate's two forms, each entry kept as read.
enum Merges {
    /// `[["a", "b"], …]`.
    Pairs(Vec<(String, String)>),
    /// `["a b", …]` (the older form; `#version` lines are skipped).
    Lines(Vec<String>),
}

impl Merges {
    /// The pairs, in rank order: a line must be two pieces separated by one space (as the
    /// crate requires; `Err` names the rank).
    fn into_pairs(self) -> Result<Vec<(String, String)>, String> {
        match self {
            Merges::Pairs(p) => Ok(p),
            Merges::Lines(lines) => lines
                .into_iter()
                .filter(|l| !l.starts_with("#version"))
                .enumerate()
                .map(|(rank, l)| {
                    let mut it = l.split(' ');
                    match (it.next(), it.next(), it.next()) {
                        (Some(a), Some(b), None) => Ok((a.to_string(), b.to_string())),
                        _ => Err(format!(
                            "model.merges: merge {} is not two pieces separated by a space",
                            rank + 1
                        )),
                    }
                })
                .collect(),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Merges {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// One entry: a pair or a line.
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Entry {
            Pair(String, String),
            Line(String),
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Merges;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of merges")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Merges, A::Error> {
                let cap = s.size_hint().unwrap_or(0).min(1 << 20);
                let (mut pairs, mut lines) = (Vec::with_capacity(cap), Vec::new());
                while let Some(e) = s.next_element::<Entry>()? {
                    match e {
                        Entry::Pair(a, b) if lines.is_empty() => pairs.push((a, b)),
                        Entry::Line(l) if pairs.is_empty() => lines.push(l),
                        _ => return Err(de::Error::custom("model.merges mixes pairs and lines")),
                    }
                }
                Ok(if lines.is_empty() {
                    Merges::Pairs(pairs)
                } else {
                    Merges::Lines(lines)
                })
            }
        }
        d.deserialize_seq(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bpe(merges: Value) -> String {
        json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [{"id": 4, "content": "<s>", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
            "decoder": null,
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                "byte_fallback": false, "ignore_merges": false,
                "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3}, "merges": merges},
        })
        .to_string()
    }

    fn same(json: &str) {
        let ours = Parts::parse(json).unwrap().unwrap().build().unwrap();
        let theirs: tokenizers::Tokenizer = json.parse().unwrap();
        assert_eq!(
            ours.to_string(false).unwrap(),
            theirs.to_string(false).unwrap()
        );
        for text in ["ab c", "<s>ab", "cab ba"] {
            assert_eq!(
                ours.encode(text, true).unwrap().get_ids(),
                theirs.encode(text, true).unwrap().get_ids()
            );
        }
    }

    #[test]
    fn both_merge_forms_build_the_tokenizer_the_crate_builds() {
        same(&bpe(json!([["a", "b"]])));
        same(&bpe(json!(["#version: 0.2", "a b"])));
    }

    #[test]
    fn malformed_merges_and_non_bpe_models() {
        let e = Parts::parse(&bpe(json!(["a b c"])));
        assert!(e.is_err_and(|e| e.contains("merge 1")));
        assert!(Parts::parse(&bpe(json!([["a", "b"], "a b"]))).is_err());
        let unigram = json!({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}).to_string();
        assert!(Parts::parse(&unigram).unwrap().is_none());
        assert!(Parts::parse("[1]").is_err());
        assert!(Parts::parse(r#"{"model": null}"#).unwrap().is_none());
    }

    #[test]
    fn a_duplicate_vocabulary_key_keeps_the_last_value() {
        let json = bpe(json!([])).replace(r#""c":3"#, r#""c":3,"a":3"#);
        let p = Parts::parse(&json).unwrap().unwrap();
        assert_eq!(
            p.vocab_sorted(),
            vec![("a", 3), ("ab", 2), ("b", 1), ("c", 3)]
        );
    }
}
