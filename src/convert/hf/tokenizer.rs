//! The tokenizer files: `tokenizer.json`, the special tokens and the chat template.

use super::*;
use crate::model::ModelMeta;
use serde_json::Value;
use std::path::Path;

// ---------------------------------------------------------------------------------------------
// Tokenizer

pub(super) fn token_str(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
        _ => None,
    }
}

pub(super) fn load_tokenizer(
    dir: &Path,
    meta: &mut ModelMeta,
    vocab: usize,
) -> Result<(), HfError> {
    let tj = dir.join("tokenizer.json");
    let tc = read_json_opt(
        &dir.join("tokenizer_config.json"),
        MAX_TOKENIZER_CONFIG_BYTES,
    )?;
    let tok = match read_model_file(&tj, MAX_TOKENIZER_JSON_BYTES)? {
        Some(text) => {
            let t = crate::chat::tokenizer_load::load(&text)
                .map_err(|e| HfError::Tokenizer(format!("{}: {e}", tj.display())))?;
            meta.tokenizer_json = Some(std::sync::Arc::from(text));
            Some(t)
        }
        None => None,
    };
    let Some(tc) = tc else {
        return Ok(());
    };
    meta.chat_template = match tc.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        // A list of named templates: take "default", else the first.
        Some(Value::Array(a)) => a
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| a.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(String::from),
        _ => None,
    };
    if meta.chat_template.is_none() {
        meta.chat_template =
            read_model_file(&dir.join("chat_template.jinja"), MAX_TEMPLATE_FILE_BYTES)?;
    }
    if let Some(b) = tc.get("add_bos_token").and_then(Value::as_bool) {
        meta.add_bos = b;
    }
    if let Some(t) = &tok {
        let id = |k: &str| token_str(tc.get(k)).and_then(|s| t.token_to_id(&s));
        if meta.bos_id.is_none() {
            meta.bos_id = id("bos_token");
        }
        if let Some(e) = id("eos_token") {
            if !meta.eos_ids.contains(&e) {
                meta.eos_ids.push(e);
            }
        }
    }
    if let Some(b) = meta.bos_id {
        if b as usize >= vocab {
            meta.bos_id = None;
        }
    }
    meta.eos_ids.retain(|&e| (e as usize) < vocab);
    Ok(())
}
