//! Read-only memory maps: [`ModelMap`] for the `.cflow`/`.vflow` files the engine runs from, and
//! [`MappedInput`] for the importers' input files (GGUF, safetensors shards), so a large file is
//! paged in on demand instead of being read into memory whole. Both refuse anything but a
//! regular file (a FIFO or a device is opened non-blocking and rejected, never read), and both
//! register their mapping with [`super::sigbus`], so a file truncated while mapped makes the
//! mapping read zeros and flags it instead of killing the process with SIGBUS.

use super::error::FormatError;
use super::sigbus::{self, Watch};
use crate::input::{non_regular_kind, open_nonblocking};
use memmap2::{Mmap, MmapMut};
use std::fs::File;
use std::path::Path;
use std::time::SystemTime;

/// Maps `file` whole (None when empty) and registers the mapping for SIGBUS recovery.
/// Private anonymous memory of `len` bytes advised for transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`, best effort: without THP it is 4 KiB pages). The resident copy of
/// the weights lives in such memory, and the bandwidth probe (`telemetry::membw`) reads the same
/// kind, so the roofline is measured on the pages the weights are streamed from.
pub fn huge_anon(len: usize) -> std::io::Result<MmapMut> {
    let m = MmapMut::map_anon(len)?;
    let _ = m.advise(memmap2::Advice::HugePage);
    Ok(m)
}

/// KiB of the mapping that contains `addr` backed by transparent huge pages (`AnonHugePages` in
/// `/proc/self/smaps`). None where smaps is unreadable or lists no such mapping. Adjacent
/// mappings of the same kind may be merged into one entry, so this can exceed the caller's range.
pub fn anon_huge_kib(addr: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a <= addr && addr < b;
                continue;
            }
        }
        if inside {
            if let Some(v) = line.strip_prefix("AnonHugePages:") {
                return v.trim().trim_end_matches("kB").trim().parse().ok();
            }
        }
    }
    None
}

fn map_watched(file: &File, len: u64) -> std::io::Result<(Option<Mmap>, Watch)> {
    if len == 0 {
        return Ok((None, Watch::none()));
    }
    // SAFETY: a read-only private mapping, only ever read through bounds-checked slices whose
    // offsets the callers validate against `len()`. If another process truncates the file while
    // it is mapped, an access to a vanished page raises SIGBUS; the mapping is registered with
    // `sigbus` right here, whose handler maps zero pages over it and flags it (callers check
    // the flag and discard what they computed), so the access completes instead of killing us.
    let map = unsafe { Mmap::map(file) }?;
    let watch = sigbus::watch(map.as_ptr(), map.len());
    Ok((Some(map), watch))
}

/// A watched, read-only mapping of a model file, plus what is needed to tell whether the file
/// changed under it (the open descriptor, the size and modification time at open).
pub struct ModelMap {
    // Field order matters: the registration is dropped before the mapping is unmapped.
    watch: Watch,
    map: Option<Mmap>,
    file: File,
    len: u64,
    modified: Option<SystemTime>,
    /// The bytes are a private copy in anonymous memory ([`ModelMap::make_resident`]).
    resident: bool,
}

impl std::fmt::Debug for ModelMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelMap").field("len", &self.len).finish()
    }
}

impl ModelMap {
    /// Opens and maps a regular file; a FIFO, device or directory is refused (typed error naming
    /// the file), without blocking and without reading it.
    pub fn open(path: &Path) -> Result<ModelMap, FormatError> {
        let io = |e| FormatError::Io {
            file: path.into(),
            err: e,
        };
        let (file, meta) = open_nonblocking(path).map_err(io)?;
        if let Some(kind) = non_regular_kind(&meta) {
            return Err(FormatError::NotRegular {
                file: path.into(),
                kind,
            });
        }
        let len = meta.len();
        let (map, watch) = map_watched(&file, len).map_err(io)?;
        Ok(ModelMap {
            watch,
            map,
            file,
            len,
            modified: meta.modified().ok(),
            resident: false,
        })
    }

    /// Replaces the file mapping by a private read-only copy in anonymous memory advised for
    /// transparent huge pages (`madvise(MADV_HUGEPAGE)`; best effort). Streaming weights through
    /// 2 MiB pages instead of the page cache's 4 KiB ones spares the TLB misses, which a KVM
    /// guest pays with two-level page walks (SmolLM2 decode ~18% faster on the Zen 5 of
    /// docs/PERFORMANCE.md). Costs a copy at open and the file's size in private memory. A file
    /// truncated during the copy gives [`FormatError::Changed`]; after it, the file no longer
    /// matters ([`ModelMap::check_unchanged`] is Ok). `transform` rewrites the copy before it is
    /// made read-only (the repacking of `CflowFile::make_resident`).
    pub fn make_resident(
        &mut self,
        path: &Path,
        transform: impl FnOnce(&mut [u8]),
    ) -> Result<(), FormatError> {
        let Some(src) = self.map.as_ref() else {
            return Ok(());
        };
        let io = |e| FormatError::Io {
            file: path.into(),
            err: e,
        };
        let mut anon = huge_anon(src.len()).map_err(io)?;
        // In 8 MiB pieces, each piece's file pages unmapped from this process once copied: the
        // page cache keeps them, but the process's peak resident set stays near one copy of the
        // model plus one piece instead of the copy plus the whole mapping (64 MiB pieces left
        // Gemma 3's peak ~56 MB higher).
        const PIECE: usize = 8 << 20;
        let mut off = 0;
        while off < src.len() {
            let n = PIECE.min(src.len() - off);
            anon[off..off + n].copy_from_slice(&src[off..off + n]);
            // SAFETY: `src` is a read-only shared mapping of a file: MADV_DONTNEED only drops
            // this process's page-table entries for the range, and a later read faults the
            // same bytes in again from the page cache. No reference into the range outlives
            // the copy above; the engine, the only other reader, does not exist yet.
            let _ =
                unsafe { src.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, off, n) };
            off += n;
        }
        if self.watch.changed() {
            return Err(FormatError::Changed {
                file: path.into(),
                why: "pages vanished while it was being copied to memory: it was truncated".into(),
            });
        }
        transform(&mut anon);
        let copy = anon.make_read_only().map_err(io)?;
        // The registration goes before the file mapping it protects.
        self.watch = Watch::none();
        self.map = Some(copy);
        self.resident = true;
        Ok(())
    }

    /// Unmaps the file's pages from this process (they stay in the page cache; a later read
    /// faults them in again): a model about to be copied ([`ModelMap::make_resident`]) then
    /// does not hold its whole mapping resident while something else allocates in between.
    /// Nothing for a resident copy.
    pub fn release_pages(&self) {
        if self.resident {
            return;
        }
        if let Some(src) = self.map.as_ref() {
            // SAFETY: `src` is a read-only shared mapping of a file: MADV_DONTNEED only drops
            // this process's page-table entries, and any later read faults the same bytes in
            // again from the page cache, so references into the mapping stay valid.
            let _ = unsafe { src.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }

    /// True once [`ModelMap::make_resident`] ran.
    pub fn is_resident(&self) -> bool {
        self.resident
    }

    /// The SIGBUS registration of the mapping.
    pub fn watch(&self) -> &Watch {
        &self.watch
    }

    /// Ok while the file is as it was at open; else why not: a page vanished under the mapping
    /// (SIGBUS absorbed), or `fstat` of the open descriptor shows another size or modification
    /// time (the file was truncated or rewritten in place). Replacing the file by rename is not
    /// a change: the mapped inode stays intact.
    pub fn check_unchanged(&self) -> Result<(), String> {
        if self.resident {
            return Ok(());
        }
        if self.watch.changed() {
            return Err("pages vanished while they were being read: it was truncated".into());
        }
        let Ok(m) = self.file.metadata() else {
            return Ok(());
        };
        if m.len() < self.len {
            return Err(format!(
                "it was truncated from {} to {} bytes",
                self.len,
                m.len()
            ));
        }
        if m.len() != self.len {
            return Err(format!("it grew from {} to {} bytes", self.len, m.len()));
        }
        if m.modified().ok() != self.modified {
            return Err("it was rewritten in place since it was opened".into());
        }
        Ok(())
    }
}

impl std::ops::Deref for ModelMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

/// A read-only view of a whole input file (empty files map to an empty slice).
pub struct MappedInput {
    watch: Watch,
    map: Option<Mmap>,
}

impl MappedInput {
    /// Maps `path`; anything but a regular file is refused (`InvalidInput`, "not a regular file
    /// (a FIFO)"), without blocking on it.
    pub fn open(path: &Path) -> std::io::Result<MappedInput> {
        let (file, meta) = open_nonblocking(path)?;
        if let Some(kind) = non_regular_kind(&meta) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("not a regular file ({kind})"),
            ));
        }
        Self::from_file(&file, meta.len())
    }

    /// Maps an open regular file of `len` bytes (its type already checked by the caller).
    pub fn from_file(file: &File, len: u64) -> std::io::Result<MappedInput> {
        let (map, watch) = map_watched(file, len)?;
        Ok(MappedInput { watch, map })
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// True once pages of the input vanished while mapped (it was truncated during the import;
    /// what was read from there is zeros and the import must be abandoned).
    pub fn changed(&self) -> bool {
        self.watch.changed()
    }
}

impl AsRef<[u8]> for MappedInput {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}
