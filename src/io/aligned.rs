//! 4096-byte-aligned heap buffers: the staging slots that `O_DIRECT` reads land in.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// Alignment of every staging buffer (and of every expert region in `.cflow`/`.vflow`).
pub const ALIGN: usize = 4096;

/// Rounds `n` up to a multiple of [`ALIGN`].
pub fn round_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// An owned, zero-initialized, [`ALIGN`]-aligned byte buffer whose length is a multiple of
/// [`ALIGN`]. Moving it between threads moves ownership of the bytes (no sharing).
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: `AlignedBuf` uniquely owns its allocation (like `Vec<u8>`); no aliasing pointers exist.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`, which is `Sync`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of at least `len` bytes (rounded up to [`ALIGN`], at least one page).
    /// Returns `None` when the allocation fails or the size overflows.
    pub fn new(len: usize) -> Option<AlignedBuf> {
        let len = round_up(len.max(1));
        let layout = Layout::from_size_align(len, ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size (len >= ALIGN).
        let p = unsafe { alloc_zeroed(layout) };
        std::ptr::NonNull::new(p).map(|ptr| AlignedBuf { ptr, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialized (zeroed at allocation) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this size and alignment (validated there).
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len, ALIGN),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_rounded() {
        for n in [0, 1, 4095, 4096, 4097, 100_000] {
            let mut b = AlignedBuf::new(n).unwrap();
            assert_eq!(b.as_mut_ptr() as usize % ALIGN, 0);
            assert!(b.len() >= n && b.len().is_multiple_of(ALIGN));
            assert!(b.iter().all(|&x| x == 0));
            let n = b.len();
            b[n - 1] = 7;
        }
    }
}
