//! Chat support: tokenizer wrapper, incremental UTF-8-safe detokenizer, chat templates, and the
//! conversation / context policy.

pub mod detok;
pub mod template;
pub mod tokenizer;
