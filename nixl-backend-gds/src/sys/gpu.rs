//! The raw-address operations of nixl-mem's CUDA layer: the bounce engine's stream copies and
//! (feature `gds`) cuFile I/O. Crate invariant (see `super`): device ranges lie in VRAM
//! registrations the request holds, host ranges in a staging buffer the calling worker holds
//! or a DRAM registration the request holds, until the operation completes.

use nixl_mem::{CudaError, Stream};

/// Copies `len` bytes of device memory at `dev` into host memory at `host` on `stream` and
/// waits.
pub(crate) fn copy_to_host(
    stream: &Stream,
    host: u64,
    dev: u64,
    len: usize,
) -> Result<(), CudaError> {
    // SAFETY: the crate invariant: `dev..+len` is VRAM of the stream's GPU in a registration the
    // request keeps alive until the chunk finishes (cancel waits for running chunks); the
    // staging range is this worker's alone and at least `len` bytes.
    unsafe { stream.copy_to_host_sync(host as *mut u8, dev, len) }
}

/// Copies `len` bytes of host memory at `host` to device memory at `dev` on `stream` and waits.
pub(crate) fn copy_from_host(
    stream: &Stream,
    dev: u64,
    host: u64,
    len: usize,
) -> Result<(), CudaError> {
    // SAFETY: as for `copy_to_host`, with the directions swapped; no one else writes the
    // destination range while the request runs.
    unsafe { stream.copy_from_host_sync(dev, host as *const u8, len) }
}

#[cfg(feature = "gds")]
pub(crate) use cufile::*;

#[cfg(feature = "gds")]
mod cufile {
    use nixl_mem::cufile::{Batch, BatchIo, BufRegistration, CufileError, Driver, FileHandle};

    /// Registers `[addr, addr+len)` (DRAM or VRAM, VRAM in the current context) with cuFile.
    pub(crate) fn register_buf(
        drv: &Driver,
        addr: u64,
        len: usize,
    ) -> Result<BufRegistration, CufileError> {
        // SAFETY: the crate invariant: the region is memory the agent keeps alive while this
        // registration (held by the backend's metadata of that region) lives.
        unsafe { BufRegistration::new(drv, addr, len) }
    }

    /// `cuFileRead` (or, `write`, `cuFileWrite`) of `len` bytes between `base + buf_off` and
    /// `file_off`; see [`FileHandle::read`] for the return value.
    pub(crate) fn file_io(
        file: &FileHandle,
        write: bool,
        base: u64,
        len: usize,
        file_off: i64,
        buf_off: i64,
    ) -> isize {
        if write {
            // SAFETY: the crate invariant: the buffer is a registration the request keeps alive;
            // cuFileWrite only reads it.
            unsafe { file.write(base, len, file_off, buf_off) }
        } else {
            // SAFETY: the crate invariant: the buffer is a registration the request keeps alive
            // and no one else accesses while the request runs; cuFile writes at most `len`
            // bytes at `base + buf_off`.
            unsafe { file.read(base, len, file_off, buf_off) }
        }
    }

    /// Submits `ios` to `batch`.
    pub(crate) fn submit(batch: &mut Batch, ios: &[BatchIo<'_>]) -> Result<(), CufileError> {
        // SAFETY: the crate invariant: every buffer is a registration the request keeps alive,
        // and the files stay registered, until each entry reports an event or a cancel was
        // waited for (the request leaks them otherwise).
        unsafe { batch.submit(ios) }
    }
}
