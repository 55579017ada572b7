//! Opening input files: [`open_regular`] never blocks and accepts only a regular file. A plain
//! `open(2)` of a FIFO blocks until a writer appears (forever, if none does), so every input
//! path (traces for `replay`/`export`, logits files for `perplexity`, transcripts, the cached
//! machine profile, files hashed for the cache, model files) is opened with `O_NONBLOCK` and
//! checked with `fstat` on the open descriptor (no window between a check and the open). Reads
//! of a regular file ignore `O_NONBLOCK`.

use std::fs::{File, Metadata};
use std::io::{Error, ErrorKind};
use std::path::Path;

/// Opens `path` for reading if it is a regular file (following symlinks); a FIFO, device,
/// socket or directory is an `InvalidInput` error naming the path and what it is.
pub fn open_regular(path: &Path) -> std::io::Result<(File, Metadata)> {
    let (file, meta) = crate::format::mmap::open_nonblocking(path)?;
    if let Some(kind) = crate::format::mmap::non_regular_kind(&meta) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("{}: is {kind}, not a regular file", path.display()),
        ));
    }
    Ok((file, meta))
}

/// Reads a whole regular file of at most `cap` bytes (an `InvalidData` error beyond).
pub fn read_regular(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let (file, meta) = open_regular(path)?;
    let mut b = Vec::with_capacity(meta.len().min(cap) as usize);
    file.take(cap + 1).read_to_end(&mut b)?;
    if b.len() as u64 > cap {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("{}: more than {cap} bytes", path.display()),
        ));
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_blocking_and_a_file_reads() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let ok = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(ok.success());
        let e = open_regular(&fifo).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("a FIFO"), "{e}");
        assert!(open_regular(dir.path())
            .unwrap_err()
            .to_string()
            .contains("directory"));
        let f = dir.path().join("f");
        std::fs::write(&f, b"abc").unwrap();
        assert_eq!(read_regular(&f, 3).unwrap(), b"abc");
        assert_eq!(
            read_regular(&f, 2).unwrap_err().kind(),
            ErrorKind::InvalidData
        );
    }
}
