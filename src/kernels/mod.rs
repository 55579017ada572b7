//! Compute kernels: fused dequantize-dot products per ISA (`dot`), the persistent thread pool
//! (`pool`), the tiled and row-major matvec drivers (`matvec`), the gated FFN activations
//! (`act`) single-query attention over the KV cache (`attention`), the cache's element types
//! (`kv_elem`) and the whole-buffer loops of the forward pass and greedy sampling (`vec`).

pub mod act;
pub mod attention;
pub mod attention_bf16;
pub mod attention_block;
pub mod dot;
pub mod kv_elem;
pub mod matvec;
pub mod pool;
pub mod prefetch;
pub mod prefetch_probe;
pub mod router;
pub mod vec;

pub use dot::{Isa, Q8Act};
