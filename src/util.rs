//! Small shared helpers: cache directory, human-readable sizes.

use std::path::PathBuf;

/// The per-user cache directory (`$CFLOW_CACHE` or `~/.cache/cflow-tui`), created on demand.
pub fn cache_dir() -> std::io::Result<PathBuf> {
    let dir = match std::env::var_os("CFLOW_CACHE") {
        Some(p) => PathBuf::from(p),
        None => dirs::cache_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("cflow-tui"),
    };
    std::fs::create_dir_all(&dir).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot create the cache directory {}: {e}", dir.display()),
        )
    })?;
    Ok(dir)
}

/// Bytes → MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
