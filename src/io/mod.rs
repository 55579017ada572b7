//! Expert I/O: aligned staging buffers, the direct-I/O expert fetcher (sync and staged arms over
//! one reader pool) and the PREFETCHT0 prefetch thread (paper §3.9, §5.8, §5.14).

pub mod aligned;
pub mod fetch;
pub mod prefetch;

pub use fetch::{ExpertFetcher, ExpertTier, FetchCounters, FetchHooks, FetchMode, Ticket};
pub use prefetch::{PrefetchCmd, Prefetcher};
