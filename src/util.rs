//! Small shared helpers: cache directory, human-readable sizes (the one `MIB`), the FNV-1a
//! fingerprint, bounded reads of text files.

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

/// Bytes in a MiB (every MiB figure divides by this).
pub const MIB: f64 = 1024.0 * 1024.0;

/// Bytes → MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

/// 64-bit FNV-1a of `bytes`, continuing from `h` (start with [`FNV_OFFSET`]): a fast,
/// non-cryptographic fingerprint (cache keys, model-file hashes).
pub fn fnv1a_from(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &x| (h ^ x as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The FNV-1a offset basis.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_from(FNV_OFFSET, bytes)
}

/// Reads a UTF-8 text file given on the command line: only a regular file (a FIFO or device such
/// as `/dev/zero` is refused without reading it) of at most `cap` bytes. Errors name the file.
pub fn read_text_file(path: &std::path::Path, cap: u64) -> Result<String, String> {
    use std::io::Read;
    let p = path.display();
    let (file, meta) =
        crate::input::open_nonblocking(path).map_err(|e| format!("{p}: cannot open: {e}"))?;
    if let Some(kind) = crate::input::non_regular_kind(&meta) {
        return Err(format!("{p}: {kind}, not a regular file: give a text file"));
    }
    if meta.len() > cap {
        return Err(format!(
            "{p}: {:.1} MiB is more than the {:.0} MiB this reads",
            mib(meta.len()),
            mib(cap)
        ));
    }
    let mut b = Vec::with_capacity(meta.len() as usize);
    // The file may still grow while it is read: never read more than the cap.
    file.take(cap + 1)
        .read_to_end(&mut b)
        .map_err(|e| format!("{p}: cannot read: {e}"))?;
    if b.len() as u64 > cap {
        return Err(format!(
            "{p}: grew past {:.0} MiB while it was read",
            mib(cap)
        ));
    }
    String::from_utf8(b).map_err(|e| format!("{p}: not UTF-8 text: {e}"))
}
