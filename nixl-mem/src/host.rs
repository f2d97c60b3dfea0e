//! Host memory: the plain page-aligned [`HostBuffer`] (from nixl-core, re-exported), mmap'd
//! buffers with optional huge pages ([`MmapBuffer`]), and pinning with the CUDA driver
//! ([`Pinned`] around any host memory, [`CudaHostBuffer`] allocated pinned).

// Exception to the crate's `deny(unsafe_code)`: the memory contracts this file's types
// promise (`unsafe impl`s of `MemoryRegion`, `HostMemory`, `Send`/`Sync`; SAFETY at each).
#![allow(unsafe_code)]

use std::fmt;

use nixl_core::{HostBuffer, MemoryRegion, Op, RegionDesc};

use crate::error::{MemError, MemResult as Result};

use crate::cuda::{self, Context};
use crate::sys::host::{self as raw, Mapping};
use crate::sys::memory::{HostAlloc, HostRegistration};

/// Host memory accessed by copies: what [`Pinned`] wraps and what the `CUDA_IPC` backend can
/// pin. The provided methods bound-check every access (false = nothing copied).
///
/// # Safety
///
/// `as_ptr()..as_ptr()+len()` must be valid, writable host memory for the value's lifetime.
pub unsafe trait HostMemory: Send + Sync + 'static {
    /// The start pointer.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes (at least 1).
    fn len(&self) -> usize;

    /// Always false: host memory has at least one byte.
    fn is_empty(&self) -> bool {
        false
    }

    /// The start address.
    fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }

    /// Copies `src` in at `offset`; false (nothing copied) when out of range.
    fn write_at(&self, offset: usize, src: &[u8]) -> bool {
        raw::write_at(self, offset, src)
    }

    /// Copies out at `offset`; false (nothing copied) when out of range.
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        raw::read_at(self, offset, dst)
    }

    /// Copies everything out.
    fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.read_at(0, &mut v);
        v
    }

    /// Sets every byte.
    fn fill(&self, byte: u8) {
        raw::fill(self, byte)
    }
}

// SAFETY: `RawSpan`'s contract is `HostMemory`'s, which every implementor upholds.
unsafe impl<M: HostMemory + ?Sized> raw::RawSpan for M {
    fn span_ptr(&self) -> *mut u8 {
        self.as_ptr()
    }
    fn span_len(&self) -> usize {
        self.len()
    }
}

// SAFETY: HostBuffer owns its allocation for its lifetime.
unsafe impl HostMemory for HostBuffer {
    fn as_ptr(&self) -> *mut u8 {
        HostBuffer::as_ptr(self)
    }
    fn len(&self) -> usize {
        HostBuffer::len(self)
    }
}

/// Which pages back an [`MmapBuffer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// Base pages (4 KiB).
    Base,
    /// Base pages with `madvise(MADV_HUGEPAGE)`: transparent huge pages where the kernel
    /// provides them (no guarantee).
    Transparent,
    /// Reserved 2 MiB huge pages (`MAP_HUGETLB`); the length is rounded up to 2 MiB.
    Huge2M,
}

/// The size of a reserved huge page.
pub const HUGE_PAGE_2M: usize = 2 << 20;

/// An anonymous private mapping, optionally on huge pages, unmapped on drop.
///
/// [`MmapBuffer::new`] with [`Pages::Huge2M`] fails with an `Unavailable` [`MemError`](crate::MemError) when no huge
/// pages are reserved (`vm.nr_hugepages`); [`MmapBuffer::huge_or_fallback`] falls back to
/// transparent huge pages and [`MmapBuffer::pages`] says which one it got.
pub struct MmapBuffer {
    map: Mapping,
    len: usize,
    pages: Pages,
}

impl MmapBuffer {
    /// Maps `len` zeroed bytes on the given pages.
    pub fn new(len: usize, pages: Pages) -> Result<Self> {
        if len == 0 {
            return Err(MemError::invalid(
                Op::RegisterMem,
                "an mmap buffer needs at least one byte",
            ));
        }
        let (map_len, extra) = match pages {
            Pages::Huge2M => (
                len.checked_next_multiple_of(HUGE_PAGE_2M),
                libc::MAP_HUGETLB | libc::MAP_HUGE_2MB,
            ),
            _ => (
                len.checked_next_multiple_of(nixl_core::backend::PAGE_SIZE),
                0,
            ),
        };
        let Some(map_len) = map_len else {
            return Err(MemError::invalid(Op::RegisterMem, "length overflows"));
        };
        let map = Mapping::anonymous(map_len, extra, pages == Pages::Transparent).map_err(|err| {
            match pages {
                Pages::Huge2M => MemError::unavailable(
                    Op::RegisterMem,
                    format!("{} reserved 2 MiB huge pages ({err})", map_len / HUGE_PAGE_2M),
                    "reserve them with `sysctl vm.nr_hugepages=N`, or use MmapBuffer::huge_or_fallback".to_owned(),
                ),
                _ => MemError::io(Op::RegisterMem, err),
            }
        })?;
        Ok(MmapBuffer { map, len, pages })
    }

    /// Reserved huge pages when available, else transparent huge pages.
    pub fn huge_or_fallback(len: usize) -> Result<Self> {
        match Self::new(len, Pages::Huge2M) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == nixl_core::ErrorKind::Unavailable => {
                tracing::debug!(%e, "falling back to transparent huge pages");
                Self::new(len, Pages::Transparent)
            }
            Err(e) => Err(e),
        }
    }

    /// The pages it got.
    pub fn pages(&self) -> Pages {
        self.pages
    }
}

// SAFETY: the mapping lives until Drop.
unsafe impl HostMemory for MmapBuffer {
    fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl fmt::Debug for MmapBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MmapBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("pages", &self.pages)
            .finish()
    }
}

// SAFETY: the mapping lives as long as the value and its description never changes.
unsafe impl MemoryRegion for MmapBuffer {
    fn desc(&self) -> RegionDesc {
        RegionDesc::dram(self.addr(), self.len as u64)
    }
}

/// Host memory page-locked with the CUDA driver (`cuMemHostRegister`, portable to every
/// context), unregistered on drop. Copies between it and GPUs run at full PCIe/NVLink-C2C speed
/// and asynchronously. `Unavailable` without CUDA.
pub struct Pinned<M: HostMemory> {
    // Fields drop in order: the pages are unregistered before `inner`'s memory is released.
    _reg: HostRegistration,
    inner: M,
}

impl<M: HostMemory> Pinned<M> {
    /// Pins `inner`. If the pages are already registered by someone else, fails with
    /// `Error::Backend` (`CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`) and the memory is dropped.
    pub fn new(inner: M) -> Result<Self> {
        let ctx = cuda::context(0)?;
        // `inner` is valid host memory of this length (the `HostMemory` contract) for as long
        // as `Pinned` lives, and the registration is dropped first.
        let reg = HostRegistration::new(&ctx, inner.addr(), inner.len())
            .map_err(|e| cuda::cuda_err(Op::RegisterMem, e))?;
        Ok(Pinned { _reg: reg, inner })
    }

    /// The pinned memory.
    pub fn inner(&self) -> &M {
        &self.inner
    }
}

impl<M: HostMemory> std::ops::Deref for Pinned<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.inner
    }
}

// SAFETY: pinning does not move or shorten the memory, which `inner` keeps valid.
unsafe impl<M: HostMemory> HostMemory for Pinned<M> {
    fn as_ptr(&self) -> *mut u8 {
        self.inner.as_ptr()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
}

// SAFETY: as for `inner`.
unsafe impl<M: HostMemory + MemoryRegion> MemoryRegion for Pinned<M> {
    fn desc(&self) -> RegionDesc {
        self.inner.desc()
    }
}

impl<M: HostMemory + fmt::Debug> fmt::Debug for Pinned<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pinned").field(&self.inner).finish()
    }
}

/// Pinned host memory allocated by the CUDA driver (`cuMemHostAlloc`, portable and mapped),
/// freed on drop. `Unavailable` without CUDA.
pub struct CudaHostBuffer {
    mem: HostAlloc,
}

impl CudaHostBuffer {
    /// Allocates `len` zeroed pinned bytes (GPU 0's primary context is made current).
    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(MemError::invalid(
                Op::RegisterMem,
                "a host buffer needs at least one byte",
            ));
        }
        let ctx = cuda::context(0)?;
        let mem = HostAlloc::new(ctx, len).map_err(|e| cuda::cuda_err(Op::RegisterMem, e))?;
        let b = CudaHostBuffer { mem };
        b.fill(0);
        Ok(b)
    }

    /// Allocates `len` zeroed pinned bytes with `ctx` current (the memory is pinned for every
    /// context: `CU_MEMHOSTALLOC_PORTABLE`). The caller's current context is left as it was.
    pub fn new_in(ctx: &Context, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(MemError::invalid(
                Op::RegisterMem,
                "a host buffer needs at least one byte",
            ));
        }
        let mem = {
            let _g = ctx
                .scoped()
                .map_err(|e| cuda::cuda_err(Op::RegisterMem, e))?;
            HostAlloc::new(ctx.inner().clone(), len)
                .map_err(|e| cuda::cuda_err(Op::RegisterMem, e))?
        };
        let b = CudaHostBuffer { mem };
        b.fill(0);
        Ok(b)
    }
}

// SAFETY: the allocation lives until the value (and so `HostAlloc`) is dropped.
unsafe impl HostMemory for CudaHostBuffer {
    fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }
    fn len(&self) -> usize {
        self.mem.len()
    }
}

impl fmt::Debug for CudaHostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaHostBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

// SAFETY: the allocation lives as long as the value; the description never changes.
unsafe impl MemoryRegion for CudaHostBuffer {
    fn desc(&self) -> RegionDesc {
        RegionDesc::dram(self.addr(), self.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmap_buffers_are_zeroed_bounded_and_page_aligned() {
        for pages in [Pages::Base, Pages::Transparent] {
            let b = MmapBuffer::new(10_000, pages).unwrap();
            assert_eq!(b.addr() % nixl_core::backend::PAGE_SIZE as u64, 0);
            assert_eq!(b.len(), 10_000);
            assert!(b.to_vec().iter().all(|&x| x == 0));
            assert!(b.write_at(9_996, &[1, 2, 3, 4]));
            assert!(!b.write_at(9_997, &[1, 2, 3, 4]));
            assert!(!b.write_at(usize::MAX, &[1]));
            let mut out = [0u8; 4];
            assert!(b.read_at(9_996, &mut out));
            assert_eq!(out, [1, 2, 3, 4]);
            assert_eq!(b.desc().kind, nixl_core::MemKind::Dram);
            assert_eq!(b.pages(), pages);
        }
        assert_eq!(
            MmapBuffer::new(0, Pages::Base).unwrap_err().kind().as_str(),
            "invalid_param"
        );
        assert_eq!(
            MmapBuffer::new(usize::MAX, Pages::Base)
                .unwrap_err()
                .kind()
                .as_str(),
            "invalid_param"
        );
    }

    #[test]
    fn huge_pages_are_typed_unavailable_or_work_and_fallback_always_works() {
        match MmapBuffer::new(3 << 20, Pages::Huge2M) {
            Ok(b) => {
                assert_eq!(b.addr() % HUGE_PAGE_2M as u64, 0);
                b.fill(9);
                assert!(b.to_vec().iter().all(|&x| x == 9));
            }
            Err(e) => {
                eprintln!("no reserved huge pages here: {e}");
                assert_eq!(e.kind().as_str(), "unavailable");
            }
        }
        let b = MmapBuffer::huge_or_fallback(1 << 20).unwrap();
        assert!(matches!(b.pages(), Pages::Huge2M | Pages::Transparent));
        b.fill(3);
        assert_eq!(b.to_vec()[12345], 3);
    }

    #[test]
    fn pinning_without_cuda_is_unavailable() {
        if cuda::is_available() {
            let p = Pinned::new(HostBuffer::new(8192).unwrap()).unwrap();
            p.fill(1);
            assert_eq!(p.to_vec()[8191], 1);
            let h = CudaHostBuffer::new(4096).unwrap();
            assert!(h.to_vec().iter().all(|&x| x == 0));
            return;
        }
        let e = Pinned::new(HostBuffer::new(8192).unwrap()).unwrap_err();
        assert_eq!(e.kind().as_str(), "unavailable", "{e}");
        assert_eq!(
            CudaHostBuffer::new(4096).unwrap_err().kind().as_str(),
            "unavailable"
        );
        assert_eq!(
            CudaHostBuffer::new(0).unwrap_err().kind().as_str(),
            "invalid_param"
        );
    }
}
