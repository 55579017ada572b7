//! I/O: prefetch thread, staged direct-I/O expert fetch, and process signal handling.

pub mod signal;
