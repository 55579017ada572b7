//! Expert I/O: aligned staging buffers, the direct-I/O expert fetcher (sync and staged arms over
//! one reader pool), the PREFETCHT0 prefetch thread (paper §3.9, §5.8, §5.14), and process signal
//! handling for the REPLs, plus the fault-injection plan the reliability tests use on them.

pub mod aligned;
pub mod fault;
pub mod fetch;
pub mod heap;
pub mod page_cache;
pub mod prefetch;
pub mod signal;

pub use fault::{FaultKind, FaultPlan};
pub use fetch::{ExpertFetcher, FetchCounters, FetchHooks, Ticket};
pub use prefetch::{PrefetchCmd, Prefetcher};
