//! Engine thread (later).
