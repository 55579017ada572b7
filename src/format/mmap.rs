//! Read-only memory maps of *input* files (safetensors shards) for the importers, so a large
//! checkpoint is paged in tensor by tensor instead of being read into memory whole.

use memmap2::Mmap;
use std::path::Path;

/// A read-only view of a whole file (empty files map to an empty slice).
pub struct MappedInput {
    map: Option<Mmap>,
}

impl MappedInput {
    pub fn open(path: &Path) -> std::io::Result<MappedInput> {
        let file = std::fs::File::open(path)?;
        if file.metadata()?.len() == 0 {
            return Ok(MappedInput { map: None });
        }
        // SAFETY: the map is read-only and private to this process; like every mmap-based reader
        // (and our own `.cflow` reader) we rely on the input file not being truncated or rewritten
        // by another process while the import runs. All offsets derived from the file's own
        // header are bounds-checked against `len()` before slicing.
        let map = unsafe { Mmap::map(&file) }?;
        Ok(MappedInput { map: Some(map) })
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}
