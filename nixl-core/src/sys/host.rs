//! Host memory by raw pointer: one aligned allocation type, the bounded copies every host
//! buffer type uses ([`Span`]: nixl-core's `HostBuffer`, nixl-mem's `HostMemory` types), and
//! the hash of ranges the agent checked against live registrations (integrity frames).

use std::alloc::{self, Layout};
use std::marker::PhantomData;
use std::ptr::NonNull;

/// `[ptr, ptr + len)`: memory valid for reads and writes for `'a`, reached only by bounded
/// copies (never by references, so a NIC or peer writing it at the same time is no aliasing).
#[derive(Debug, Clone, Copy)]
pub struct Span<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _life: PhantomData<&'a ()>,
}

impl<'a> Span<'a> {
    /// A span over `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// `[ptr, ptr + len)` must be valid, writable host memory for `'a`.
    pub unsafe fn new(ptr: NonNull<u8>, len: usize) -> Span<'a> {
        Span {
            ptr,
            len,
            _life: PhantomData,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the span has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `src` in at `offset`; false (nothing copied) when it does not fit.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> bool {
        match offset.checked_add(src.len()) {
            Some(end) if end <= self.len => {
                // SAFETY: in range of memory valid for `'a` (`Span::new`'s contract); `src` is
                // a distinct Rust slice (a `&[u8]` cannot alias memory reached only by raw
                // pointers).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.as_ptr(),
                        self.ptr.as_ptr().add(offset),
                        src.len(),
                    )
                };
                true
            }
            _ => false,
        }
    }

    /// Copies out at `offset` into `dst`; false (nothing copied) when out of range.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        match offset.checked_add(dst.len()) {
            Some(end) if end <= self.len => {
                // SAFETY: in range of valid memory (`Span::new`'s contract); `dst` is a
                // distinct exclusive slice.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.ptr.as_ptr().add(offset),
                        dst.as_mut_ptr(),
                        dst.len(),
                    )
                };
                true
            }
            _ => false,
        }
    }

    /// Sets every byte.
    pub fn fill(&self, byte: u8) {
        // SAFETY: the whole span is valid and writable (`Span::new`'s contract).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) };
    }
}

/// A zeroed, aligned heap allocation owned by the value and freed on drop.
pub(crate) struct Alloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain memory owned by the value; its bytes are reached only through raw pointers
// (bounded copies, a NIC), never through references, so any thread may hold it.
unsafe impl Send for Alloc {}
// SAFETY: as above.
unsafe impl Sync for Alloc {}

impl Alloc {
    /// `len` zeroed bytes aligned to `align` (a power of two); `None` for 0 bytes, a bad
    /// alignment or a failed allocation.
    pub(crate) fn zeroed(len: usize, align: usize) -> Option<Alloc> {
        if len == 0 {
            return None;
        }
        let layout = Layout::from_size_align(len, align).ok()?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(raw).map(|ptr| Alloc { ptr, layout })
    }

    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// The allocation as a [`Span`] for as long as it is borrowed.
    pub(crate) fn span(&self) -> Span<'_> {
        // SAFETY: the allocation is valid and writable while `self` is borrowed.
        unsafe { Span::new(self.ptr, self.len()) }
    }

    /// The bytes as a slice.
    ///
    /// # Safety
    ///
    /// Nothing may write them while the slice lives.
    pub(crate) unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: valid and initialised (zeroed); the caller excludes writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len()) }
    }

    /// The bytes as a mutable slice.
    ///
    /// # Safety
    ///
    /// Nothing else may read or write them while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: valid and initialised; the caller excludes every other access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for Alloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Hashes host memory ranges in order (xxh3-64).
///
/// # Safety
///
/// Every `(addr, len)` must be readable host memory for the duration of the call.
pub(crate) unsafe fn hash_ranges(ranges: impl IntoIterator<Item = (u64, u64)>) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (addr, len) in ranges {
        // SAFETY: the caller guarantees the range is readable.
        let s = unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
        h.update(s);
    }
    h.digest()
}
