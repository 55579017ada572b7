//! recorder (in progress)
