//! Opening input files: [`open_regular`] never blocks and accepts only a regular file. A plain
//! `open(2)` of a FIFO blocks until a writer appears (forever, if none does), so every input
//! path (traces for `replay`/`export`, logits files for `perplexity`, transcripts, the cached
//! machine profile, files hashed for the cache, model files) is opened with `O_NONBLOCK` and
//! checked with `fstat` on the open descriptor (no window between a check and the open). Reads
//! of a regular file ignore `O_NONBLOCK`.

use std::fs::{File, Metadata};
use std::io::{Error, ErrorKind};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for reading if it is a regular file (following symlinks); a FIFO, device,
/// socket or directory is an `InvalidInput` error naming the path and what it is.
pub fn open_regular(path: &Path) -> std::io::Result<(File, Metadata)> {
    let (file, meta) = open_nonblocking(path)?;
    if let Some(kind) = non_regular_kind(&meta) {
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

/// What a non-regular file is ("a FIFO", "a character device", ...); None for a regular file.
pub fn non_regular_kind(m: &std::fs::Metadata) -> Option<&'static str> {
    let t = m.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    }
}

/// Opens `path` for reading without blocking on a FIFO (O_NONBLOCK: it has no effect on the
/// reads of a regular file) and returns it with its metadata.
pub fn open_nonblocking(path: &Path) -> std::io::Result<(File, std::fs::Metadata)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    Ok((file, meta))
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
