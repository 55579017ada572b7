//! The decode engine: elementwise ops, the forward pass with the delay-aware scheduler for every
//! combine style, the sampler, the critical-path analyzer, the memory check at open, and the
//! engine thread.

pub mod critical;
pub mod forward;
pub mod kv_budget;
pub mod ops;
pub mod sampler;
pub mod session;
pub mod worker;

pub use forward::{Engine, EngineOptions, Layout};
