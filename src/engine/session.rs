//! Generation session (later).
