//! Compute kernels: fused dequantize-dot products per ISA (`dot`), the persistent thread pool
//! (`pool`), the tiled and row-major matvec drivers (`matvec`), the gated FFN activations
//! (`act`) single-query attention over the KV cache (`attention`) and the cache's element types
//! (`kv_elem`).

pub mod act;
pub mod attention;
pub mod attention_block;
pub mod dot;
pub mod kv_elem;
pub mod matvec;
pub mod pool;
pub mod router;

pub use dot::{Isa, Q8Act};
