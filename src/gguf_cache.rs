//! Opening a `.gguf` directly (`cflow-tui model.gguf`, `run`, `chat`, `bench`, `perplexity`,
//! `inspect`): the file is imported once into the cache directory (`CFLOW_CACHE`, else
//! `~/.cache/cflow-tui`) as `gguf/SHA256.cflow`, keyed by the sha256 of its bytes, and that
//! `.cflow` is opened from then on, as ollama keeps its blobs. The hash is remembered in
//! `gguf/index.json` against the file's canonical path, size, mtime, ctime, device and inode, so
//! an unchanged file is not hashed again and a changed one is. The import is written to a
//! temporary file in the cache directory and renamed into place when complete
//! ([`crate::output::Output`]), under the entry's lock ([`crate::cache::lock`]): a failed or
//! interrupted import leaves no entry, and concurrent opens import a file once.

use crate::convert::import_gguf::{import_gguf, ImportError, QuantTarget};
use crate::output::{Output, OutputError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The cache subdirectory of the imports and their index.
pub const DIR: &str = "gguf";
/// The index of known hashes, in [`DIR`].
pub const INDEX: &str = "index.json";
/// Largest index read (beyond it the index is ignored and rebuilt).
const INDEX_CAP: u64 = 16 << 20;

/// Why a GGUF could not be opened through the cache. Every variant names its file.
#[derive(Debug, thiserror::Error)]
pub enum GgufCacheError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: cannot use the cache directory: {source}", path.display())]
    CacheDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Taking a cache lock failed (the message names the lock file).
    #[error("{0}")]
    Lock(String),
    /// The import failed: the same error as `cflow-tui import` gives.
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("{}: changed while it was being imported; open it again", path.display())]
    Changed { path: PathBuf },
}

/// What [`open`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The cached `.cflow` to open.
    pub cflow: PathBuf,
    /// Hex sha256 of the GGUF's bytes.
    pub sha256: String,
    /// The GGUF was hashed (not found unchanged in the index).
    pub hashed: bool,
    /// The GGUF was imported (no cached import of its content yet).
    pub imported: bool,
}

/// What identifies one version of a file without reading it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
    ctime: i64,
    ctime_nsec: i64,
    dev: u64,
    ino: u64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            size: m.len(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
            ctime: m.ctime(),
            ctime_nsec: m.ctime_nsec(),
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// One remembered hash.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Known {
    #[serde(flatten)]
    stamp: Stamp,
    sha256: String,
}

/// `gguf/index.json`: canonical path → the file version last hashed and its hash.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Index {
    entries: BTreeMap<String, Known>,
}

fn read_index(path: &Path) -> Index {
    // A missing, unreadable or corrupt index only costs a hash: start afresh.
    crate::input::read_regular(path, INDEX_CAP)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// The cached `.cflow` of `gguf`, importing it into `cache` first when its content has none.
/// `log` gets one line saying what happened; progress bars (hashing, importing) go to stderr
/// when it is a terminal.
pub fn open(
    gguf: &Path,
    cache: &Path,
    log: &mut dyn FnMut(&str),
) -> Result<Opened, GgufCacheError> {
    let read = |e| GgufCacheError::Read {
        path: gguf.to_path_buf(),
        source: e,
    };
    let canon = std::fs::canonicalize(gguf).map_err(read)?;
    let stamp = Stamp::of(&std::fs::metadata(&canon).map_err(read)?);
    let dir = cache.join(DIR);
    std::fs::create_dir_all(&dir).map_err(|e| GgufCacheError::CacheDir {
        path: dir.clone(),
        source: e,
    })?;
    let index = dir.join(INDEX);
    let key = canon.to_string_lossy().into_owned();
    let known = read_index(&index)
        .entries
        .remove(&key)
        .filter(|k| k.stamp == stamp && k.sha256.len() == 64);
    let name = gguf.display();
    let (sha256, hashed) = match known {
        Some(k) => (k.sha256, false),
        None => {
            let h = hash(gguf, &canon, stamp.size)?;
            let known = Known {
                stamp: stamp.clone(),
                sha256: h.clone(),
            };
            // The index only saves a hash next time: a cache that cannot record it still opens.
            if let Err(e) = remember(&index, key, known, log) {
                log(&format!("note: {e} (the file is hashed again next time)"));
            }
            (h, true)
        }
    };
    let cflow = dir.join(format!("{sha256}.cflow"));
    let opened = |imported| Opened {
        cflow: cflow.clone(),
        sha256: sha256.clone(),
        hashed,
        imported,
    };
    if cflow.is_file() {
        log(&format!(
            "{name}: opening its import from the cache → {}",
            cflow.display()
        ));
        return Ok(opened(false));
    }
    let _lock =
        crate::cache::lock(&cflow, log).map_err(|e| GgufCacheError::Lock(format!("{e:#}")))?;
    // Another process may have imported it while this one waited for the lock.
    if cflow.is_file() {
        log(&format!(
            "{name}: opening its import from the cache → {}",
            cflow.display()
        ));
        return Ok(opened(false));
    }
    log(&format!(
        "importing {name} into the cache (once) → {}",
        cflow.display()
    ));
    let pb = crate::console::progress_bar(0, "import");
    let done = import_gguf(&canon, &cflow, QuantTarget::Keep, None, |d, t| {
        pb.set_length(t as u64);
        pb.set_position(d as u64);
    });
    pb.finish_and_clear();
    done?;
    // The entry is keyed by the content hashed before: a file rewritten meanwhile may have been
    // imported with other content.
    let now = std::fs::metadata(&canon).map(|m| Stamp::of(&m));
    if now.ok().as_ref() != Some(&stamp) {
        let _ = std::fs::remove_file(&cflow);
        return Err(GgufCacheError::Changed {
            path: gguf.to_path_buf(),
        });
    }
    Ok(opened(true))
}

/// Hex sha256 of the file at `canon` (`shown` in messages), with a progress bar of `size` bytes.
fn hash(shown: &Path, canon: &Path, size: u64) -> Result<String, GgufCacheError> {
    let read = |e| GgufCacheError::Read {
        path: shown.to_path_buf(),
        source: e,
    };
    let (mut f, _) = crate::input::open_regular(canon).map_err(read)?;
    let pb = indicatif::ProgressBar::new(size);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    pb.set_message(format!(
        "sha256 {}",
        shown.file_name().unwrap_or_default().to_string_lossy()
    ));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = f.read(&mut buf).map_err(read)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        pb.inc(n as u64);
    }
    pb.finish_and_clear();
    Ok(crate::cache::hex(&h.finalize()))
}

/// Records `known` for `key` in the index (under its lock; entries of files that no longer
/// exist are dropped).
fn remember(
    index: &Path,
    key: String,
    known: Known,
    log: &mut dyn FnMut(&str),
) -> Result<(), GgufCacheError> {
    let _lock =
        crate::cache::lock(index, log).map_err(|e| GgufCacheError::Lock(format!("{e:#}")))?;
    let mut ix = read_index(index);
    ix.entries.retain(|p, _| Path::new(p).exists());
    ix.entries.insert(key, known);
    let mut o = Output::create(index, &[])?;
    let text = serde_json::to_string_pretty(&ix).expect("index serializes");
    writeln!(o, "{text}").map_err(|e| o.error("write", e))?;
    o.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_remembers_a_hash_and_forgets_it_when_the_file_changes() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("x.bin");
        std::fs::write(&f, b"abc").unwrap();
        let ix = d.path().join(INDEX);
        let stamp = Stamp::of(&std::fs::metadata(&f).unwrap());
        let key = f.to_string_lossy().into_owned();
        let known = Known {
            stamp: stamp.clone(),
            sha256: "0".repeat(64),
        };
        remember(&ix, key.clone(), known, &mut |_| {}).unwrap();
        assert_eq!(read_index(&ix).entries[&key].stamp, stamp);
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::write(&f, b"abd").unwrap();
        assert_ne!(Stamp::of(&std::fs::metadata(&f).unwrap()), stamp);
        // A corrupt index reads as empty.
        std::fs::write(&ix, b"{not json").unwrap();
        assert!(read_index(&ix).entries.is_empty());
    }

    #[test]
    fn a_file_that_is_not_readable_is_named_in_the_error() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("gone.gguf");
        let e = open(&missing, d.path(), &mut |_| {}).unwrap_err();
        assert!(matches!(e, GgufCacheError::Read { .. }), "{e}");
        assert!(e.to_string().contains("gone.gguf"), "{e}");
    }
}
