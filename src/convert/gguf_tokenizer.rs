//! gguf_tokenizer (in progress)
