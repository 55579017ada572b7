//! Loading a `tokenizer.json` from an untrusted file into the `tokenizers` crate: every path
//! (the `.cflow` metadata, the HF importer, the GGUF tokenizer builder) goes through [`load`].
//!
//! What the library does not survive is checked first: a SentencePiece `Precompiled`
//! normaliser whose charsmap declares a trie larger than the map makes `spm_precompiled`
//! reserve up to 8 GB (an allocation failure aborts, it cannot be caught), and an empty trie
//! panics on first use. The parse itself runs under [`guarded`](super::guard::guarded) (a
//! library panic becomes an error). Padding is switched off after loading: a `padding` section
//! would pad every prompt to whatever length it names, and a prompt is never a batch.

use super::tokenizer_parts::Parts;
use base64::Engine as _;
use serde_json::Value;

/// Longest added (special) token: the library matches them with an Aho-Corasick automaton whose
/// construction is quadratic in the length of one pattern (a 400 KB token took ~15 minutes).
/// Real special tokens are a few dozen bytes.
pub const MAX_ADDED_TOKEN_BYTES: usize = 256;

/// Checks the parts of `doc` the library would abort or panic on, or spend time out of
/// proportion on. `Err` names the field.
pub fn check(doc: &Value) -> Result<(), String> {
    if let Some(a) = doc["added_tokens"].as_array() {
        for (i, t) in a.iter().enumerate() {
            let n = t["content"].as_str().map_or(0, str::len);
            if n > MAX_ADDED_TOKEN_BYTES {
                return Err(format!(
                    "added_tokens[{i}].content: {n} bytes, more than {MAX_ADDED_TOKEN_BYTES}"
                ));
            }
        }
    }
    let mut err = Ok(());
    visit_precompiled(&doc["normalizer"], &mut |map| {
        if err.is_ok() {
            err = check_charsmap(map);
        }
    });
    err
}

fn visit_precompiled(v: &Value, f: &mut dyn FnMut(&Value)) {
    match v {
        Value::Object(o) => {
            if o.get("type").and_then(Value::as_str) == Some("Precompiled") {
                f(o.get("precompiled_charsmap").unwrap_or(&Value::Null));
            }
            o.values().for_each(|c| visit_precompiled(c, f));
        }
        Value::Array(a) => a.iter().for_each(|c| visit_precompiled(c, f)),
        _ => {}
    }
}

/// The charsmap layout (`spm_precompiled`): u32 LE trie size in bytes, the trie as u32 units,
/// then the normalized strings.
fn check_charsmap(v: &Value) -> Result<(), String> {
    const FIELD: &str = "normalizer.precompiled_charsmap";
    let Some(s) = v.as_str() else {
        // Not a string: the library refuses it with an error of its own.
        return Ok(());
    };
    let map = base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| format!("{FIELD}: not base64: {e}"))?;
    if map.len() < 4 {
        return Err(format!(
            "{FIELD}: {} bytes, too short for the trie size",
            map.len()
        ));
    }
    let trie = u32::from_le_bytes([map[0], map[1], map[2], map[3]]) as usize / 4;
    if trie == 0 || 4 + trie * 4 > map.len() {
        return Err(format!(
            "{FIELD}: declares a trie of {trie} units, but the map holds {} bytes",
            map.len()
        ));
    }
    Ok(())
}

/// Parses `json` (already checked with [`check`]) under the panic guard, with padding off.
pub fn parse_checked(json: &str) -> Result<tokenizers::Tokenizer, String> {
    build_checked(Parts::parse(json).ok().flatten(), json)
}

/// [`parse_checked`] from `json` already split ([`Parts::parse`]) when it has a BPE model: built
/// from the parts, which holds a fraction of the crate's own parse in memory. Any error on that
/// path, and any other model, goes to the crate's parser, so errors read as the crate words them.
pub fn build_checked(parts: Option<Parts>, json: &str) -> Result<tokenizers::Tokenizer, String> {
    let built = parts.and_then(|p| super::guard::guarded(|| p.build()).ok()?.ok());
    let mut tok = match built {
        Some(t) => t,
        None => super::guard::guarded(|| json.parse())
            .map_err(|p| format!("the tokenizer library panicked: {p}"))?
            .map_err(|e: tokenizers::Error| e.to_string())?,
    };
    tok.with_padding(None);
    Ok(tok)
}

/// [`check`] then [`parse_checked`].
pub fn load(json: &str) -> Result<tokenizers::Tokenizer, String> {
    let doc: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    check(&doc)?;
    parse_checked(json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A byte-level BPE over a few tokens with `normalizer` and `padding` set.
    fn doc(normalizer: Value, padding: Value) -> String {
        json!({
            "version": "1.0", "truncation": null, "padding": padding, "added_tokens": [],
            "normalizer": normalizer, "pre_tokenizer": null, "post_processor": null, "decoder": null,
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                "byte_fallback": false, "ignore_merges": false,
                "vocab": {"a": 0, "b": 1, "ab": 2, "<pad>": 3}, "merges": [["a", "b"]]},
        })
        .to_string()
    }

    fn precompiled(map: &[u8]) -> Value {
        let s = base64::engine::general_purpose::STANDARD.encode(map);
        json!({"type": "Sequence", "normalizers": [{"type": "Precompiled", "precompiled_charsmap": s}]})
    }

    #[test]
    fn a_charsmap_declaring_a_huge_trie_is_refused_before_the_library_sees_it() {
        for map in [&[0xff, 0xff, 0xff, 0xff, 1, 2][..], &[0, 0, 0, 0], &[8, 0]] {
            let e = load(&doc(precompiled(map), Value::Null)).unwrap_err();
            assert!(e.contains("precompiled_charsmap"), "{e}");
        }
    }

    #[test]
    fn a_panic_inside_the_library_is_an_error() {
        // A one-unit trie whose offsets point outside it: the library indexes out of bounds
        // when it normalizes (not at load): the encode guard reports it; here the load is fine.
        let mut map = 4u32.to_le_bytes().to_vec();
        map.extend_from_slice(&0xffff_ffffu32.to_le_bytes());
        let t = load(&doc(precompiled(&map), Value::Null)).unwrap();
        let r = crate::chat::guard::guarded(|| t.encode("ab", false).map(|e| e.get_ids().to_vec()));
        assert!(r.is_err() || r.unwrap().is_ok());
    }

    #[test]
    fn padding_is_switched_off() {
        let pad = json!({"strategy": {"Fixed": 100000}, "direction": "Right", "pad_to_multiple_of": null,
            "pad_id": 3, "pad_type_id": 0, "pad_token": "<pad>"});
        let t = load(&doc(Value::Null, pad)).unwrap();
        assert_eq!(t.encode("ab", false).unwrap().get_ids(), &[2]);
    }
}
