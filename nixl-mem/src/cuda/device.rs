//! CUDA device memory: [`DeviceBuffer`], owned `cuMemAlloc` allocations.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::CudaContext;
use nixl_core::{Error, MemoryRegion, Op, RegionDesc, Result};

use super::ipc::{DmaBuf, IpcHandle};
use super::{bind, context, cu, sys};

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
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
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
            return Err(Error::invalid(
                "-",
                Op::RegisterMem,
                "a device buffer needs at least one byte",
            ));
        }
        let ctx = context(ordinal)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the context is current; `ptr` is a valid out pointer.
        cu(Op::RegisterMem, "cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut ptr, len)
        })?;
        Ok(DeviceBuffer {
            ctx,
            ptr,
            len,
            ordinal,
        })
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
        self.ptr
    }

    fn range(&self, offset: usize, n: usize) -> Result<u64> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(self.ptr + offset as u64),
            _ => Err(Error::invalid(
                "-",
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
        bind(&self.ctx)?;
        // SAFETY: the whole allocation belongs to self; the synchronous memset completes
        // before returning.
        cu(Op::PostXfer, "cuMemsetD8", unsafe {
            sys::cuMemsetD8_v2(self.ptr, byte, self.len)
        })?;
        self.synchronize()
    }

    /// Copies `src` to the buffer at `offset` (synchronous host-to-device copy).
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.range(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: `dst..dst+len` lies in the allocation; `src` is a live slice; the copy is
        // synchronous with respect to the host buffer.
        cu(Op::PostXfer, "cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len())
        })
    }

    /// Copies bytes at `offset` into `dst` (synchronous device-to-host copy).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.range(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: `src..src+len` lies in the allocation; `dst` is a live exclusive slice.
        cu(Op::PostXfer, "cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
        })
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
        let d = self.range(offset, len)?;
        let s = src.range(src_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: both ranges lie in live allocations (checked above); unified addressing lets
        // the driver resolve either device.
        cu(Op::PostXfer, "cuMemcpyDtoD", unsafe {
            sys::cuMemcpyDtoD_v2(d, s, len)
        })?;
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
        bind(&self.ctx)?;
        // SAFETY: the context is current.
        cu(Op::Wait, "cuCtxSynchronize", unsafe {
            sys::cuCtxSynchronize()
        })
    }

    /// Exports the allocation for another process (`cuIpcGetMemHandle`).
    pub fn ipc_handle(&self) -> Result<IpcHandle> {
        IpcHandle::export(self.ordinal, self.ptr, self.len as u64)
    }

    /// Exports the allocation as a dma-buf file descriptor (for NIC registration), where the
    /// driver supports it (`cuMemGetHandleForAddressRange`).
    pub fn dmabuf(&self) -> Result<DmaBuf> {
        DmaBuf::export_cuda(self.ordinal, self.ptr, self.len as u64)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Err(e) = bind(&self.ctx) {
            tracing::warn!(error = %e, "binding the context to free device memory failed");
        }
        // SAFETY: allocated by `new`, freed once. Registrations hold an `Arc` of the buffer, so
        // no transfer can still use it; cuMemFree waits for outstanding work on it.
        if let Err(e) = cu(Op::DeregisterMem, "cuMemFree", unsafe {
            sys::cuMemFree_v2(self.ptr)
        }) {
            tracing::warn!(error = %e, "freeing device memory failed");
        }
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ordinal", &self.ordinal)
            .field("addr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the allocation lives as long as the value (freed only in Drop) and its description
// never changes; the device pointer is valid for any device or peer mapping it.
unsafe impl MemoryRegion for DeviceBuffer {
    fn desc(&self) -> RegionDesc {
        RegionDesc::vram(self.ptr, self.len as u64, self.ordinal as u64)
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
