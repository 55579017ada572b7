//! import_gguf (in progress)
