//! KV cache (filled in later).
