//! Reading the model directory's files: only regular files inside it, each under a size cap,
//! JSON parsed with the file named in every error.

use super::*;
use serde_json::Value;
use std::path::Path;

pub(super) fn io_err(path: &Path, kind: std::io::ErrorKind, why: String) -> HfError {
    HfError::Io {
        file: path.to_path_buf(),
        source: std::io::Error::new(kind, why),
    }
}

/// Whether `real` (a canonical path) lies inside the model directory `root` (canonical). A
/// HuggingFace hub cache snapshot (`…/snapshots/<rev>/`) holds symlinks into the repository's
/// `…/blobs/`, which count as inside.
pub(super) fn inside_model_dir(root: &Path, real: &Path) -> bool {
    if real.starts_with(root) {
        return true;
    }
    let snapshots = root.parent();
    if snapshots.and_then(Path::file_name) == Some(std::ffi::OsStr::new("snapshots")) {
        if let Some(repo) = snapshots.and_then(Path::parent) {
            return real.starts_with(repo.join("blobs"));
        }
    }
    false
}

/// Read a small model-directory file as UTF-8 text: only a regular file inside the directory
/// (symlinks are resolved and must stay inside), at most `cap` bytes, opened without blocking
/// (a FIFO is refused, never waited on). `Ok(None)` when the file does not exist; every other
/// failure is an error naming the file.
pub(super) fn read_model_file(path: &Path, cap: u64) -> Result<Option<String>, HfError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let real = match std::fs::canonicalize(path) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // A dangling symlink is not "absent": it names something that is not there.
            if std::fs::symlink_metadata(path).is_ok() {
                return Err(io_err(
                    path,
                    std::io::ErrorKind::NotFound,
                    "is a symlink to a file that does not exist".into(),
                ));
            }
            return Ok(None);
        }
        Err(e) => {
            return Err(HfError::Io {
                file: path.to_path_buf(),
                source: e,
            })
        }
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let root = std::fs::canonicalize(dir).map_err(|e| HfError::Io {
        file: dir.to_path_buf(),
        source: e,
    })?;
    if !inside_model_dir(&root, &real) {
        return Err(io_err(
            path,
            std::io::ErrorKind::PermissionDenied,
            format!(
                "resolves to {}, outside the model directory {}: refusing to read it",
                real.display(),
                root.display()
            ),
        ));
    }
    let not_regular = |ft: std::fs::FileType| {
        io_err(
            path,
            std::io::ErrorKind::InvalidInput,
            format!("is not a regular file ({ft:?}): refusing to read it"),
        )
    };
    let md = std::fs::metadata(&real).map_err(|e| HfError::Io {
        file: path.to_path_buf(),
        source: e,
    })?;
    if !md.is_file() {
        return Err(not_regular(md.file_type()));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(&real)
        .map_err(|e| HfError::Io {
            file: path.to_path_buf(),
            source: e,
        })?;
    // Re-check on the open handle: the path may have been swapped since the check above.
    let md = file.metadata().map_err(|e| HfError::Io {
        file: path.to_path_buf(),
        source: e,
    })?;
    if !md.is_file() {
        return Err(not_regular(md.file_type()));
    }
    let too_big = |n: u64| {
        io_err(
            path,
            std::io::ErrorKind::InvalidData,
            format!("is {n} bytes, more than the {cap}-byte limit for this file"),
        )
    };
    if md.len() > cap {
        return Err(too_big(md.len()));
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    // Read at most cap + 1 bytes: a file growing while it is read is caught too.
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| HfError::Io {
            file: path.to_path_buf(),
            source: e,
        })?;
    if bytes.len() as u64 > cap {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map(Some).map_err(|e| {
        io_err(
            path,
            std::io::ErrorKind::InvalidData,
            format!("is not valid UTF-8 ({e})"),
        )
    })
}

pub(super) fn parse_json(path: &Path, text: &str) -> Result<Value, HfError> {
    serde_json::from_str(text).map_err(|e| HfError::Json {
        file: path.to_path_buf(),
        source: e,
    })
}

pub(super) fn read_json(path: &Path, cap: u64) -> Result<Value, HfError> {
    match read_model_file(path, cap)? {
        Some(text) => parse_json(path, &text),
        None => Err(io_err(
            path,
            std::io::ErrorKind::NotFound,
            "no such file".into(),
        )),
    }
}

pub(super) fn read_json_opt(path: &Path, cap: u64) -> Result<Option<Value>, HfError> {
    match read_model_file(path, cap)? {
        Some(text) => parse_json(path, &text).map(Some),
        None => Ok(None),
    }
}

// ---------------------------------------------------------------------------------------------
// Safetensors shards
