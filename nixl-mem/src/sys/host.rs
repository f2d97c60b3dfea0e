//! libc: anonymous and shared mappings, memfd, `poll`; and the bounded byte copies of
//! [`HostMemory`](crate::HostMemory), over the [`RawSpan`] contract this module defines (the
//! host module implements it for every `HostMemory`: this layer imports nothing above it).

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use nixl_core::backend::host::Span;

/// Memory the bounded copies of this module may reach.
///
/// # Safety
///
/// `span_ptr()..span_ptr()+span_len()` must be valid, writable host memory for the value's
/// lifetime (what [`crate::HostMemory`] promises).
pub(crate) unsafe trait RawSpan {
    /// The start pointer.
    fn span_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn span_len(&self) -> usize;
}

/// A memory mapping owned by the value, unmapped on drop.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by the value; its bytes are only reached through raw pointers
// under the `RawSpan` rules (bounded copies), never through references.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// An anonymous private read-write mapping of `len > 0` bytes, `extra` flags added
    /// (`MAP_HUGETLB | MAP_HUGE_2MB`); with `transparent_huge`, advised `MADV_HUGEPAGE`.
    pub(crate) fn anonymous(
        len: usize,
        extra: libc::c_int,
        transparent_huge: bool,
    ) -> std::io::Result<Self> {
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing; no
        // existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
                -1,
                0,
            )
        };
        let m = Self::from_raw(p, len)?;
        if transparent_huge {
            // SAFETY: advises on the mapping just created; failure only means no THP.
            let _ = unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        }
        Ok(m)
    }

    /// A shared read-write mapping of the first `len > 0` bytes of `fd`.
    pub(crate) fn shared(fd: &impl AsRawFd, len: usize) -> std::io::Result<Self> {
        // SAFETY: maps `len` bytes of a file the caller holds open; the kernel picks the
        // address, and the mapping stays valid after the descriptor is closed.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        Self::from_raw(p, len)
    }

    fn from_raw(p: *mut libc::c_void, len: usize) -> std::io::Result<Self> {
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    /// The start pointer (valid for `len` bytes while `self` lives).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by a constructor with this length, unmapped once; no reference into it
        // outlives the value.
        if unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) } != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "munmap failed");
        }
    }
}

/// `memfd_create(name, MFD_CLOEXEC)`.
pub(crate) fn memfd(name: &CStr) -> std::io::Result<OwnedFd> {
    // SAFETY: `name` is a valid C string; memfd_create returns a new descriptor or -1.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// `poll(fds, timeout_ms)`: the number of ready entries, or the error.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> std::io::Result<usize> {
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries for the whole call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

/// `m` as nixl-core's [`Span`], whose bounded copies are the one host-copy helper.
fn span<M: RawSpan + ?Sized>(m: &M) -> Span<'_> {
    let (ptr, len) = match NonNull::new(m.span_ptr()) {
        Some(p) => (p, m.span_len()),
        None => (NonNull::dangling(), 0),
    };
    // SAFETY: `RawSpan`'s contract: the range is valid and writable while `m` lives, and the
    // span borrows `m` (a null pointer, which no `HostMemory` has, gives an empty span).
    unsafe { Span::new(ptr, len) }
}

/// Copies `src` into `m` at `offset`; false (nothing copied) when out of range.
pub(crate) fn write_at<M: RawSpan + ?Sized>(m: &M, offset: usize, src: &[u8]) -> bool {
    span(m).write_at(offset, src)
}

/// Copies out of `m` at `offset` into `dst`; false (nothing copied) when out of range.
pub(crate) fn read_at<M: RawSpan + ?Sized>(m: &M, offset: usize, dst: &mut [u8]) -> bool {
    span(m).read_at(offset, dst)
}

/// Sets every byte of `m`.
pub(crate) fn fill<M: RawSpan + ?Sized>(m: &M, byte: u8) {
    span(m).fill(byte)
}
