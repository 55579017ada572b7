//! Terminal UI (in progress).
