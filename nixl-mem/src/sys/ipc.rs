//! CUDA IPC handles (export, open, close) and dma-buf export.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::cu;
use super::result::{bind_raw, check, CudaError};

/// Marks the allocation at `alloc_base` `SYNC_MEMOPS` (synchronous copies by either process
/// are ordered with the other's) and returns its 64-byte IPC handle. The context owning the
/// allocation is current.
pub(crate) fn export(alloc_base: u64) -> Result<[u8; 64], CudaError> {
    let one: u32 = 1;
    // SAFETY: the attribute value is a 4-byte flag read by the driver; it looks `alloc_base`
    // up and refuses an address that is not an allocation.
    check("cuPointerSetAttribute(SYNC_MEMOPS)", unsafe {
        cu::cuPointerSetAttribute(
            (&one as *const u32).cast(),
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
            alloc_base,
        )
    })?;
    let mut h = cu::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `h` is a valid out pointer for the 64-byte handle.
    check("cuIpcGetMemHandle", unsafe {
        cu::cuIpcGetMemHandle(&mut h, alloc_base)
    })?;
    let mut handle = [0u8; 64];
    for (d, s) in handle.iter_mut().zip(h.reserved.iter()) {
        *d = *s as u8;
    }
    Ok(handle)
}

/// Another process's allocation opened here (`cuIpcOpenMemHandle`, lazy peer access), closed
/// on drop (`cuIpcCloseMemHandle`).
pub(crate) struct IpcOpen {
    ctx: Arc<CudaContext>,
    base: u64,
    size: u64,
}

// SAFETY: holds a device address of a mapping owned by the value and a context handle, both
// usable from any thread once the context is bound (every method binds).
unsafe impl Send for IpcOpen {}
// SAFETY: as above.
unsafe impl Sync for IpcOpen {}

impl IpcOpen {
    /// Opens `handle` (an allocation the exporter says has `size` bytes) in `ctx` (made
    /// current). Accesses are bounded by the smaller of that and the size the driver reports
    /// for the mapping.
    pub(crate) fn open(
        ctx: Arc<CudaContext>,
        handle: &[u8; 64],
        size: u64,
    ) -> Result<Self, CudaError> {
        bind_raw(&ctx)?;
        let mut h = cu::CUipcMemHandle { reserved: [0; 64] };
        for (d, s) in h.reserved.iter_mut().zip(handle.iter()) {
            *d = *s as _;
        }
        let mut base: cu::CUdeviceptr = 0;
        let flags = cu::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: the context is current; `base` is a valid out pointer; the handle is plain
        // bytes the driver validates.
        check("cuIpcOpenMemHandle", unsafe {
            cu::cuIpcOpenMemHandle_v2(&mut base, h, flags)
        })?;
        let size = super::driver::address_range(base).map_or(size, |(_, real)| real.min(size));
        Ok(IpcOpen { ctx, base, size })
    }

    /// Where the allocation is mapped here.
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    fn at(&self, offset: u64, n: usize) -> Result<u64, CudaError> {
        match offset.checked_add(n as u64) {
            Some(end) if end <= self.size => Ok(self.base + offset),
            _ => Err(CudaError {
                call: "cuMemcpy",
                code: cu::CUresult::CUDA_ERROR_INVALID_VALUE as u32,
                name: "range outside the mapping".to_owned(),
            }),
        }
    }

    /// Copies `src` to `offset` of the allocation (synchronous).
    pub(crate) fn write(&self, offset: u64, src: &[u8]) -> Result<(), CudaError> {
        let dst = self.at(offset, src.len())?;
        bind_raw(&self.ctx)?;
        // SAFETY: the range lies in the live mapping (checked); `src` is a live slice.
        check("cuMemcpyHtoD", unsafe {
            cu::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len())
        })
    }

    /// Copies `offset` of the allocation into `dst` (synchronous).
    pub(crate) fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), CudaError> {
        let src = self.at(offset, dst.len())?;
        bind_raw(&self.ctx)?;
        // SAFETY: the range lies in the live mapping (checked); `dst` is a live exclusive slice.
        check("cuMemcpyDtoH", unsafe {
            cu::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }
}

impl Drop for IpcOpen {
    fn drop(&mut self) {
        if let Err(e) = bind_raw(&self.ctx) {
            tracing::warn!(error = %e, "binding the context to close an IPC mapping failed");
        }
        // SAFETY: opened by `open`, closed once; the owner (a registration or loaded remote
        // region) is dropped only after every request using it is gone.
        if let Err(e) = check("cuIpcCloseMemHandle", unsafe {
            cu::cuIpcCloseMemHandle(self.base)
        }) {
            tracing::warn!(error = %e, "closing a CUDA IPC mapping failed");
        }
    }
}

/// Exports the page-aligned device range `[start, start+len)` as a dma-buf file descriptor
/// (`cuMemGetHandleForAddressRange(DMA_BUF_FD)`); the caller checked that the symbol exists.
pub(crate) fn dmabuf_fd(start: u64, len: usize) -> Result<Option<OwnedFd>, CudaError> {
    let mut fd: i32 = -1;
    // SAFETY: `fd` is a valid out pointer for the int handle; the driver validates the range.
    check("cuMemGetHandleForAddressRange(DMA_BUF_FD)", unsafe {
        cu::cuMemGetHandleForAddressRange(
            (&mut fd as *mut i32).cast(),
            start,
            len,
            cu::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    })?;
    if fd < 0 {
        return Ok(None);
    }
    // SAFETY: the driver returned a fresh descriptor that nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}
