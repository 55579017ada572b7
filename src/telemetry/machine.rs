//! machine (in progress)
