//! Persistent worker pool for parallel matvecs (filled in below).
