//! The page cache of one file: evict its pages (`posix_fadvise(POSIX_FADV_DONTNEED)`) and
//! measure how much of it is resident (`mincore`). Benchmarks use this to start cold without
//! touching the rest of the machine's page cache (writing `/proc/sys/vm/drop_caches` empties it
//! for every process and is done only on an explicit `--drop-caches`).

use std::path::Path;

/// Asks the kernel to drop `path`'s cached pages. Clean pages that no process has mapped go at
/// once (pages mapped by this or another process stay); the call is advisory, so check with
/// [`resident_fraction`].
pub fn evict(path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path)?;
    // Dirty pages (a file written moments ago) are not dropped: write them back first.
    let _ = f.sync_data();
    // SAFETY: plain syscall on a file descriptor we own for the duration of the call.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Fraction (0..=1) of `path`'s pages that are in the page cache now. An empty file is 0.
pub fn resident_fraction(path: &Path) -> std::io::Result<f64> {
    let f = std::fs::File::open(path)?;
    let len = f.metadata()?.len() as usize;
    if len == 0 {
        return Ok(0.0);
    }
    // SAFETY: a read-only shared mapping of a file we opened; it is never dereferenced, only
    // passed to mincore, so a concurrent truncation cannot fault here.
    let map = unsafe { memmap2::Mmap::map(&f)? };
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `len` bytes starting at a page-aligned address, and
    // `vec` holds one byte per page of that range, as mincore requires.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages as f64)
}

/// How [`touch_mapped`] asks the kernel to read a cold mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readahead {
    /// The kernel's default: faults on a sequential walk trigger readahead.
    Normal,
    /// `madvise(MADV_RANDOM)`: every fault reads only around its own page.
    Random,
}

/// Maps `path` read-only and reads one byte of every page in file order, as a forward pass
/// faults in weights it has not read yet. Returns the bytes walked. With a cold file this
/// measures what OS readahead delivers to a sequential mmap walk (paper §5.7, Claim 5).
pub fn touch_mapped(path: &Path, advice: Readahead) -> std::io::Result<usize> {
    let f = std::fs::File::open(path)?;
    // SAFETY: a read-only shared mapping of a file we opened; a benchmark input that nothing
    // truncates while it is walked (a concurrent truncation would raise SIGBUS, as for any map).
    let map = unsafe { memmap2::Mmap::map(&f)? };
    if advice == Readahead::Random {
        map.advise(memmap2::Advice::Random)?;
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let mut sum = 0u8;
    for i in (0..map.len()).step_by(page) {
        sum = sum.wrapping_add(map[i]);
    }
    std::hint::black_box(sum);
    Ok(map.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_read_file_is_resident_and_eviction_drops_only_it() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        for p in [&a, &b] {
            let mut f = std::fs::File::create(p).unwrap();
            f.write_all(&vec![7u8; 4 << 20]).unwrap();
            f.sync_all().unwrap();
            let mut buf = Vec::new();
            std::fs::File::open(p)
                .unwrap()
                .read_to_end(&mut buf)
                .unwrap();
        }
        let before = resident_fraction(&a).unwrap();
        if before < 0.5 {
            // tmpfs or a file system that does not report residency: nothing to check.
            println!("SKIP: page residency not observable here ({before:.2})");
            return;
        }
        evict(&a).unwrap();
        let (ra, rb) = (
            resident_fraction(&a).unwrap(),
            resident_fraction(&b).unwrap(),
        );
        // tmpfs pages cannot be evicted (they are the file); only check where it works.
        if ra < before {
            assert!(ra < 0.1, "a still {ra:.2} resident");
        }
        assert!(rb > 0.9, "evicting a dropped b too ({rb:.2})");
    }
}
