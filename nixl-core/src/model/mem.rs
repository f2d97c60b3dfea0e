//! Memory kinds and the memory-region contract.
//!
//! A [`MemoryRegion`] is something a backend can register: a host buffer, a GPU allocation, a
//! file, an object key. The agent keeps the region (an `Arc`) alive for as long as any
//! registration, prepared list or request refers to it, so memory cannot be freed under a
//! transfer. [`HostBuffer`] is the plain page-aligned host buffer; `nixl-mem` adds pinned,
//! huge-page and device memory.

// Exception to the crate's `deny(unsafe_code)`: the `MemoryRegion` contract (an unsafe trait
// and its impls) and `HostBuffer`'s slice views, whose callers promise what `sys::host::Alloc`
// needs.
#![allow(unsafe_code)]

use std::fmt;

/// The kind of memory or storage a descriptor names (NIXL's `nixl_mem_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum MemKind {
    /// Host memory.
    Dram = 0,
    /// GPU memory.
    Vram = 1,
    /// A block device.
    Block = 2,
    /// An object in an object store.
    Object = 3,
    /// A file.
    File = 4,
}

impl MemKind {
    /// All kinds, in wire order.
    pub const ALL: [MemKind; 5] = [
        MemKind::Dram,
        MemKind::Vram,
        MemKind::Block,
        MemKind::Object,
        MemKind::File,
    ];

    /// Whether descriptors of this kind are addresses in this process (DRAM, VRAM) rather than
    /// offsets into storage.
    pub fn is_addressable(self) -> bool {
        matches!(self, MemKind::Dram | MemKind::Vram)
    }

    /// The kind for a wire tag.
    pub fn from_tag(tag: u8) -> Option<Self> {
        MemKind::ALL.get(usize::from(tag)).copied()
    }

    /// The wire tag.
    pub fn tag(self) -> u8 {
        self as u8
    }
}

impl fmt::Display for MemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            MemKind::Dram => "DRAM",
            MemKind::Vram => "VRAM",
            MemKind::Block => "BLOCK",
            MemKind::Object => "OBJ",
            MemKind::File => "FILE",
        };
        f.write_str(s)
    }
}

/// Where a region lives, as a backend sees it: address (or storage offset), length, device id
/// (GPU ordinal, file descriptor, object index), and the kind's extra bytes (a file path, an
/// object key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RegionDesc {
    /// The memory kind.
    pub kind: MemKind,
    /// Start address, or offset for storage kinds.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Device id: GPU ordinal for VRAM, 0 for DRAM, a file descriptor or object index.
    pub dev_id: u64,
    /// Extra bytes of storage kinds (an object key, a file path); empty otherwise.
    pub meta: Vec<u8>,
}

impl RegionDesc {
    /// Host memory at `addr` (a process virtual address) of `len` bytes.
    pub fn dram(addr: u64, len: u64) -> Self {
        RegionDesc {
            kind: MemKind::Dram,
            addr,
            len,
            dev_id: 0,
            meta: Vec::new(),
        }
    }

    /// Device memory at `addr` (a device pointer) of `len` bytes on device `dev_id` (its
    /// ordinal).
    pub fn vram(addr: u64, len: u64, dev_id: u64) -> Self {
        RegionDesc {
            kind: MemKind::Vram,
            addr,
            len,
            dev_id,
            meta: Vec::new(),
        }
    }

    /// One past the last byte.
    pub fn end(&self) -> Option<u64> {
        self.addr.checked_add(self.len)
    }

    /// Whether `[addr, addr+len)` on `dev_id` lies inside this region.
    pub fn covers(&self, addr: u64, len: u64, dev_id: u64) -> bool {
        match (self.end(), addr.checked_add(len)) {
            (Some(end), Some(e)) => dev_id == self.dev_id && addr >= self.addr && e <= end,
            _ => false,
        }
    }
}

/// Memory a backend can register.
///
/// # Safety
///
/// Implementors promise that the bytes `[addr, addr + len)` of [`MemoryRegion::desc`] (for
/// addressable kinds) stay valid for reads and writes by any thread, device or NIC, for as long
/// as the value lives, and that the description does not change. The agent then keeps the value
/// alive for as long as a registration, prepared list or request uses it.
pub unsafe trait MemoryRegion: Send + Sync + 'static {
    /// The region's description.
    fn desc(&self) -> RegionDesc;
}

/// A page-aligned, zero-initialised host buffer.
///
/// The agent's peers may read and write it at any time once it is registered and its metadata
/// is shared, so it is accessed by copying (`read_at`, `write_at`, `fill`) rather than through
/// long-lived references; the `unsafe` slice views are for code that knows no transfer is in
/// flight.
pub struct HostBuffer {
    alloc: crate::sys::host::Alloc,
}

/// The page size used to align host buffers.
pub const PAGE_SIZE: usize = 4096;

impl HostBuffer {
    /// Allocates `len` zeroed bytes aligned to [`PAGE_SIZE`]. Returns `None` when `len` is 0 or
    /// the allocation fails.
    pub fn new(len: usize) -> Option<Self> {
        Self::with_alignment(len, PAGE_SIZE)
    }

    /// Allocates `len` zeroed bytes with the given power-of-two alignment.
    pub fn with_alignment(len: usize, align: usize) -> Option<Self> {
        crate::sys::host::Alloc::zeroed(len, align).map(|alloc| HostBuffer { alloc })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.alloc.len()
    }

    /// Always false: a buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The start address.
    pub fn addr(&self) -> u64 {
        self.alloc.ptr().as_ptr() as u64
    }

    /// The start pointer.
    pub fn as_ptr(&self) -> *mut u8 {
        self.alloc.ptr().as_ptr()
    }

    /// The buffer as a [`Span`](crate::backend::host::Span), for bounded copies.
    pub fn span(&self) -> crate::sys::host::Span<'_> {
        self.alloc.span()
    }

    /// Copies `src` into the buffer at `offset`. Returns false (and copies nothing) when it
    /// does not fit.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> bool {
        self.span().write_at(offset, src)
    }

    /// Copies bytes at `offset` into `dst`. Returns false (and copies nothing) when out of range.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        self.span().read_at(offset, dst)
    }

    /// Copies the whole buffer out.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.read_at(0, &mut v);
        v
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        self.span().fill(byte)
    }

    /// Fills the buffer with a deterministic pattern derived from `seed` (for tests/examples).
    pub fn fill_pattern(&self, seed: u64) {
        let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut chunk = [0u8; 4096];
        let mut off = 0;
        while off < self.len() {
            for b in chunk.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let bytes = x.to_le_bytes();
                b.copy_from_slice(&bytes[..b.len()]);
            }
            let n = chunk.len().min(self.len() - off);
            self.write_at(off, &chunk[..n]);
            off += n;
        }
    }

    /// Views the buffer as a slice.
    ///
    /// # Safety
    ///
    /// No transfer or peer may write the buffer while the slice lives.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the caller excludes writers (this function's contract is `Alloc::as_slice`'s).
        unsafe { self.alloc.as_slice() }
    }

    /// Views the buffer as a mutable slice.
    ///
    /// # Safety
    ///
    /// No transfer or peer may read or write the buffer while the slice lives, and no other
    /// view may exist.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: the caller excludes every other access (`Alloc::as_mut_slice`'s contract).
        unsafe { self.alloc.as_mut_slice() }
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

// SAFETY: the allocation lives as long as the value and its description never changes.
unsafe impl MemoryRegion for HostBuffer {
    fn desc(&self) -> RegionDesc {
        RegionDesc::dram(self.addr(), self.len() as u64)
    }
}

/// A region described by the caller, for memory the agent does not own (NIXL's model: raw
/// addresses). Creating one is `unsafe`: the caller keeps the memory valid.
#[derive(Debug, Clone)]
pub struct RawRegion {
    desc: RegionDesc,
}

impl RawRegion {
    /// Describes caller-owned memory or storage.
    ///
    /// # Safety
    ///
    /// For addressable kinds, `[desc.addr, desc.addr + desc.len)` must stay valid for reads and
    /// writes until every registration, prepared list and request that uses this region is
    /// gone. Storage kinds (files, objects, blocks) name no process memory and carry no such
    /// obligation beyond what the backend documents (a file descriptor must stay open).
    pub unsafe fn new(desc: RegionDesc) -> Self {
        RawRegion { desc }
    }

    /// Describes a storage region (file, object, block): these name no process memory, so no
    /// `unsafe` is needed. Returns `None` for DRAM or VRAM.
    pub fn storage(desc: RegionDesc) -> Option<Self> {
        (!desc.kind.is_addressable()).then_some(RawRegion { desc })
    }
}

// SAFETY: the constructor's contract (or, for storage, the absence of process memory) makes
// the description valid for the value's lifetime.
unsafe impl MemoryRegion for RawRegion {
    fn desc(&self) -> RegionDesc {
        self.desc.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffer_is_aligned_zeroed_and_bounded() {
        let b = HostBuffer::new(10_000).expect("alloc");
        assert_eq!(b.addr() % PAGE_SIZE as u64, 0);
        assert!(b.to_vec().iter().all(|&x| x == 0));
        assert!(b.write_at(9_996, &[1, 2, 3, 4]));
        assert!(!b.write_at(9_997, &[1, 2, 3, 4]));
        assert!(!b.write_at(usize::MAX, &[1]));
        let mut out = [0u8; 4];
        assert!(b.read_at(9_996, &mut out));
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(HostBuffer::new(0).is_none());
    }

    #[test]
    fn covers_handles_overflow_and_device() {
        let r = RegionDesc {
            kind: MemKind::Dram,
            addr: 100,
            len: 50,
            dev_id: 0,
            meta: vec![],
        };
        assert!(r.covers(100, 50, 0));
        assert!(r.covers(120, 10, 0));
        assert!(!r.covers(120, 31, 0));
        assert!(!r.covers(99, 1, 0));
        assert!(!r.covers(120, 10, 1));
        assert!(!r.covers(u64::MAX, 2, 0));
        assert!(RawRegion::storage(r).is_none());
    }

    #[test]
    fn pattern_is_deterministic() {
        let a = HostBuffer::new(5000).unwrap();
        let b = HostBuffer::new(5000).unwrap();
        a.fill_pattern(7);
        b.fill_pattern(7);
        assert_eq!(a.to_vec(), b.to_vec());
        b.fill_pattern(8);
        assert_ne!(a.to_vec(), b.to_vec());
    }
}
