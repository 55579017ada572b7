//! Model description: geometry and semantics (`ModelConfig`, from the header + metadata), the
//! metadata JSON schema, per-layer stream byte accounting, and the KV cache.

pub mod bounded_json;
pub mod config;
pub mod special;

pub use config::*;
