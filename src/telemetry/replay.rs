//! replay (in progress)
