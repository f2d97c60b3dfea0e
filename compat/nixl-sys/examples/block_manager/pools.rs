//! The block manager's pools as nixl-sys code declares them (its own allocations, registered
//! by pointer or descriptor) and the blocks' byte pattern; shared by the example and the
//! adapter bench (`benches/adapter.rs`).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use nixl_sys::{MemType, MemoryRegion, NixlDescriptor};

/// A host pool: the manager's own page-aligned allocation, registered by pointer.
#[derive(Debug)]
pub(crate) struct HostPool(pub(crate) Arc<nixl::HostBuffer>);

impl HostPool {
    /// `len` zeroed bytes (`None` for 0 or a failed allocation).
    pub(crate) fn new(len: usize) -> Option<Self> {
        Some(HostPool(Arc::new(nixl::HostBuffer::new(len)?)))
    }

    /// The pool's address.
    pub(crate) fn addr(&self) -> usize {
        self.0.addr() as usize
    }
}

impl MemoryRegion for HostPool {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }

    fn size(&self) -> usize {
        self.0.len()
    }
}

impl NixlDescriptor for HostPool {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }

    fn device_id(&self) -> u64 {
        0
    }
}

/// The disk pool: a file, named by its descriptor (NIXL's FILE segments: offset and fd).
#[derive(Debug)]
pub(crate) struct DiskPool {
    pub(crate) file: File,
    pub(crate) len: usize,
}

impl MemoryRegion for DiskPool {
    unsafe fn as_ptr(&self) -> *const u8 {
        std::ptr::null()
    }

    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for DiskPool {
    fn mem_type(&self) -> MemType {
        MemType::File
    }

    fn device_id(&self) -> u64 {
        self.file.as_raw_fd() as u64
    }
}

/// The byte at `offset` of block `block`.
pub(crate) fn byte(block: usize, offset: usize) -> u8 {
    (block.wrapping_mul(31) ^ offset.wrapping_mul(7) ^ (offset >> 8)) as u8
}

/// `n` blocks of `bb` bytes, each block its pattern.
pub(crate) fn pattern(n: usize, bb: usize) -> Vec<u8> {
    let mut v = vec![0u8; n * bb];
    for (i, block) in v.chunks_mut(bb).enumerate() {
        for (k, b) in block.iter_mut().enumerate() {
            *b = byte(i, k);
        }
    }
    v
}

/// `Err` naming the first byte of `got` that is not block `map(j)`'s pattern at block `j`.
pub(crate) fn check_blocks(
    what: &str,
    got: &[u8],
    bb: usize,
    map: impl Fn(usize) -> usize,
) -> Result<(), String> {
    for (j, block) in got.chunks(bb).enumerate() {
        let i = map(j);
        if let Some(k) = block.iter().enumerate().position(|(k, &b)| b != byte(i, k)) {
            return Err(format!("{what}: block {j} byte {k} differs"));
        }
    }
    Ok(())
}
