//! Model conversion: GGUF reading and import, HF safetensors import, the synthetic model
//! generator, and tokenizer building from GGUF metadata.

pub mod generate;
pub mod gguf;
pub mod gguf_arch;
pub mod gguf_gemma3;
pub mod gguf_tokenizer;
pub mod hf;
pub mod import_gguf;
pub mod moefy;
pub mod pull;
pub mod pull_gemma3;
pub mod pull_moby;
pub mod spm_merges;
pub mod validate;
