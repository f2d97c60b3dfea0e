//! CUDA device memory: [`DeviceBuffer`], owned `cuMemAlloc` allocations.

// Exception to the crate's `deny(unsafe_code)`: the memory contracts this file's types
// promise (`unsafe impl`s of `MemoryRegion`, `HostMemory`, `Send`/`Sync`; SAFETY at each).
#![allow(unsafe_code)]

use std::fmt;

use nixl_core::{MemoryRegion, Op, RegionDesc};

use super::cuda_err;
use crate::error::{MemError, MemResult as Result};

use super::ipc::{DmaBuf, IpcHandle};
use super::{bind, context, cu};
use crate::sys::driver::ctx_synchronize;
use crate::sys::memory::DeviceAlloc;

/// A zero-initialised allocation in one GPU's memory (`cuMemAlloc`), freed on drop.
///
/// It describes itself as [`MemKind::Vram`](nixl_core::MemKind::Vram) with `dev_id` = the GPU ordinal and `addr` = the
/// device pointer. Host access is by explicit copies (`copy_from_host`, `copy_to_host`), which
/// synchronise with the device.
///
/// ```no_run
/// # fn main() -> nixl_core::Result<()> {
/// let buf = nixl_mem::DeviceBuffer::new(0, 1 << 20)?; // Unavailable without a GPU
/// buf.copy_from_host(0, &[7u8; 4096])?;
/// let mut back = [0u8; 4096];
/// buf.copy_to_host(0, &mut back)?;
/// assert_eq!(back, [7u8; 4096]);
/// # Ok(()) }
/// ```
pub struct DeviceBuffer {
    mem: DeviceAlloc,
    len: usize,
    ordinal: usize,
}

impl DeviceBuffer {
    /// Allocates `len` bytes on GPU `ordinal` and zeroes them. `Unavailable` without CUDA;
    /// `InvalidParam` for `len == 0` or an ordinal that does not exist.
    pub fn new(ordinal: usize, len: usize) -> Result<Self> {
        let buf = Self::alloc(ordinal, len)?;
        buf.fill(0)?;
        Ok(buf)
    }

    /// Allocates without initialising (and without the context-wide synchronisation of
    /// [`DeviceBuffer::fill`]), for the crate's own device-side scratch.
    pub(crate) fn alloc(ordinal: usize, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(MemError::invalid(
                Op::RegisterMem,
                "a device buffer needs at least one byte",
            ));
        }
        let ctx = context(ordinal)?;
        let mem = DeviceAlloc::new(ctx, len).map_err(|e| cuda_err(Op::RegisterMem, e))?;
        Ok(DeviceBuffer { mem, len, ordinal })
    }

    /// The GPU ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The device pointer.
    pub fn addr(&self) -> u64 {
        self.mem.ptr()
    }

    fn check_range(&self, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MemError::invalid(
                Op::PostXfer,
                format!(
                    "{offset}+{n} is outside the {}-byte device buffer",
                    self.len
                ),
            )),
        }
    }

    /// Sets every byte to `byte` and waits for it.
    pub fn fill(&self, byte: u8) -> Result<()> {
        bind(self.mem.context())?;
        cu(Op::PostXfer, self.mem.memset(byte))?;
        self.synchronize()
    }

    /// Copies `src` to the buffer at `offset` (synchronous host-to-device copy).
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        bind(self.mem.context())?;
        cu(Op::PostXfer, self.mem.write(offset, src))
    }

    /// Copies bytes at `offset` into `dst` (synchronous device-to-host copy).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        bind(self.mem.context())?;
        cu(Op::PostXfer, self.mem.read(offset, dst))
    }

    /// Copies `len` bytes from `src` at `src_offset` to this buffer at `offset` (device to
    /// device, possibly across GPUs), and waits for it.
    pub fn copy_from_device(
        &self,
        offset: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.check_range(offset, len)?;
        src.check_range(src_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        bind(self.mem.context())?;
        cu(
            Op::PostXfer,
            self.mem.copy_from(offset, &src.mem, src_offset, len),
        )?;
        self.synchronize()
    }

    /// Copies the whole buffer to a vector.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.len];
        self.copy_to_host(0, &mut v)?;
        Ok(v)
    }

    /// Waits for all work of the buffer's context.
    pub fn synchronize(&self) -> Result<()> {
        bind(self.mem.context())?;
        cu(Op::Wait, ctx_synchronize())
    }

    /// Exports the allocation for another process (`cuIpcGetMemHandle`).
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        IpcHandle::export(self.ordinal, self.addr(), self.len as u64)
    }

    /// Exports the allocation as a dma-buf file descriptor (for NIC registration), where the
    /// driver supports it (`cuMemGetHandleForAddressRange`).
    pub fn dmabuf(&self) -> Result<DmaBuf> {
        DmaBuf::export_cuda(self.ordinal, self.addr(), self.len as u64)
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ordinal", &self.ordinal)
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the allocation lives as long as the value (freed only in Drop) and its description
// never changes; the device pointer is valid for any device or peer mapping it.
unsafe impl MemoryRegion for DeviceBuffer {
    fn desc(&self) -> RegionDesc {
        RegionDesc::vram(self.addr(), self.len as u64, self.ordinal as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_without_a_gpu_is_unavailable_and_bad_sizes_are_invalid() {
        assert_eq!(
            DeviceBuffer::new(0, 0).unwrap_err().kind().as_str(),
            "invalid_param"
        );
        if crate::cuda::is_available() {
            eprintln!("CUDA present: allocation is covered by tests/gpu.rs");
            return;
        }
        let e = DeviceBuffer::new(0, 4096).unwrap_err();
        assert_eq!(e.kind().as_str(), "unavailable", "{e}");
    }
}
