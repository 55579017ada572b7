//! llama.cpp's pre-tokenizer table (the split regexes per `tokenizer.ggml.pre` name) and the
//! token names it treats as end of generation / end of turn. The GGUF importer builds tokenizers
//! from it; the tokenizer trusts its regexes by name ([`super::tokenizer::regex_allowed`]).

const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// One `tokenizer.ggml.pre` name per row of [`pre_tokenizer_for`]'s table.
pub const PRE_TOKENIZER_ROWS: [&str; 12] = [
    "default",
    "llama3",
    "dbrx",
    "falcon",
    "starcoder",
    "gpt-2",
    "qwen2",
    "deepseek-coder",
    "gpt-4o",
    "tekken",
    "poro-chat",
    "viking",
];

/// Every regex of the pre-tokenizer table (the patterns known to behave on any input).
pub fn known_pre_tokenizer_regexes() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = PRE_TOKENIZER_ROWS
        .iter()
        .filter_map(|n| pre_tokenizer_for(n))
        .flat_map(|(r, _)| r)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Pre-tokenizer regexes (applied in order) and whether whole-word vocabulary hits bypass the
/// merges, for a `tokenizer.ggml.pre` name, following llama.cpp's table. `None` = unknown name.
pub fn pre_tokenizer_for(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    Some(match pre {
        "default" => (
            vec![
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2_RE,
                r"\p{N}+",
                r"[0-9][0-9][0-9]",
            ],
            false,
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" => (vec![LLAMA3_RE], true),
        "dbrx" | "smaug-bpe" | "chatglm-bpe" => (vec![LLAMA3_RE], false),
        "falcon" => (
            vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2_RE, r"[0-9][0-9][0-9]"],
            false,
        ),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
            (vec![r"\p{N}", GPT2_RE], false)
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "mpt" | "olmo" | "jais" | "exaone4" | "roberta-bpe" | "jina-v1-en" | "jina-v2-code"
        | "mellum" | "a.x-4.0" | "trillion" | "granite-docling" => (vec![GPT2_RE], false),
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" | "hunyuan" | "kormo" => {
            (vec![QWEN2_RE], false)
        }
        "deepseek-coder" => (
            vec![
                r"[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                r"[一-龥ࠀ-一가-퟿]+",
                r"\p{N}",
            ],
            false,
        ),
        "gpt-4o" | "llama4" => (vec![GPT4O_RE], false),
        "tekken" => (vec![TEKKEN_RE], true),
        "poro-chat" | "bloom" | "gpt3-finnish" => (vec![r" ?[^(\s|.,!?…。，、।۔،)]+"], false),
        "viking" => (vec![r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"], false),
        _ => return None,
    })
}

/// Token names llama.cpp treats as end-of-generation.
pub const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];
/// Token names llama.cpp picks as end-of-turn, in priority order of appearance.
pub const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<end_of_utterance>",
];
