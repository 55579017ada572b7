//! template (in progress)
