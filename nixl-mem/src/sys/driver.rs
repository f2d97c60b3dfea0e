//! Loading the CUDA driver, the calling thread's current context, and pointer and device
//! queries.

use std::sync::OnceLock;

use cudarc::driver::CudaContext;

use super::cu;
use super::result::{check, CudaError};

/// Every driver symbol this crate calls (cudarc's `CudaContext` included); checked once so a
/// missing one is an `Unavailable` error instead of cudarc's panic.
pub(crate) const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2",
    "cuMemcpyAsync",
    "cuMemGetAddressRange_v2",
    "cuPointerGetAttribute",
    "cuPointerSetAttribute",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuDeviceCanAccessPeer",
    "cuCtxEnablePeerAccess",
];

/// Loads libcuda, checks [`SYMBOLS`], runs `cuInit` and requires a device; otherwise what is
/// missing and how to get it.
pub(crate) fn load() -> Result<(), (String, String)> {
    if !present() {
        return Err((
            "the CUDA driver (libcuda.so)".to_owned(),
            "install the NVIDIA driver or put libcuda.so.1 on LD_LIBRARY_PATH".to_owned(),
        ));
    }
    for name in SYMBOLS {
        if !has_symbol(name) {
            return Err((
                format!("the CUDA driver symbol {name}"),
                "update the NVIDIA driver (>= 525)".to_owned(),
            ));
        }
    }
    // SAFETY: cuInit exists (checked above) and may be called any number of times.
    let r = unsafe { cu::cuInit(0) };
    if let Err(e) = check("cuInit", r) {
        return Err((
            "a CUDA device".to_owned(),
            format!("{e}; check the driver and CUDA_VISIBLE_DEVICES"),
        ));
    }
    match device_count() {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err((
            "a CUDA device".to_owned(),
            "no device is visible (CUDA_VISIBLE_DEVICES?)".to_owned(),
        )),
        Err(e) => Err(("a CUDA device".to_owned(), e.to_string())),
    }
}

/// Whether libcuda loads (tried once per process).
fn present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen cudarc's candidate library names; no symbol is called.
    *PRESENT.get_or_init(|| unsafe { cu::is_culib_present() })
}

/// Whether the loaded libcuda exports `name` (false when libcuda is not present).
pub(crate) fn has_symbol(name: &str) -> bool {
    if !present() {
        return false;
    }
    // SAFETY: `is_culib_present` succeeded, so `culib` loads instead of panicking; looking a
    // symbol up calls nothing, and the pointer type is irrelevant.
    unsafe { cu::culib().get::<*const ()>(name.as_bytes()) }.is_ok()
}

/// `cuDeviceGetCount` (the driver is initialised: [`load`] succeeded).
pub(crate) fn device_count() -> Result<i32, CudaError> {
    let mut n = 0;
    // SAFETY: `cuInit` succeeded before any caller gets here; `n` is a valid out pointer.
    check("cuDeviceGetCount", unsafe { cu::cuDeviceGetCount(&mut n) })?;
    Ok(n)
}

/// `cuDeviceGetAttribute` of GPU `ordinal`.
pub(crate) fn device_attribute(
    ordinal: usize,
    attr: cu::CUdevice_attribute,
) -> Result<i32, CudaError> {
    let mut dev: cu::CUdevice = 0;
    let ordinal = i32::try_from(ordinal).unwrap_or(i32::MAX);
    // SAFETY: valid out pointer; the driver validates the ordinal.
    check("cuDeviceGet", unsafe { cu::cuDeviceGet(&mut dev, ordinal) })?;
    let mut v = 0;
    // SAFETY: valid out pointer for a 4-byte attribute of a valid device.
    check("cuDeviceGetAttribute", unsafe {
        cu::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

/// Whether GPU `ordinal` can access GPU `peer`'s memory directly (NVLink or PCIe P2P):
/// `cuDeviceCanAccessPeer`.
pub(crate) fn can_access_peer(ordinal: usize, peer: usize) -> Result<bool, CudaError> {
    let dev = |o: usize| -> Result<cu::CUdevice, CudaError> {
        let mut d: cu::CUdevice = 0;
        // SAFETY: valid out pointer; the driver validates the ordinal.
        check("cuDeviceGet", unsafe {
            cu::cuDeviceGet(&mut d, i32::try_from(o).unwrap_or(i32::MAX))
        })?;
        Ok(d)
    };
    let (a, b) = (dev(ordinal)?, dev(peer)?);
    let mut yes = 0;
    // SAFETY: valid out pointer and two valid devices.
    check("cuDeviceCanAccessPeer", unsafe {
        cu::cuDeviceCanAccessPeer(&mut yes, a, b)
    })?;
    Ok(yes != 0)
}

/// Lets kernels of `ctx` access memory of `peer`'s context (`cuCtxEnablePeerAccess` with
/// `ctx` current); already enabled counts as done.
pub(crate) fn enable_peer_access(ctx: &CudaContext, peer: &CudaContext) -> Result<(), CudaError> {
    let _restore = Restore::bind(ctx)?;
    // SAFETY: `ctx` is current (bound above) and `peer` is a live context (borrowed).
    let r = unsafe { cu::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) };
    match check("cuCtxEnablePeerAccess", r) {
        Err(e) if e.code == cu::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED as u32 => Ok(()),
        other => other,
    }
}

/// Makes `ctx` current until the guard drops, then restores the thread's previous context
/// (possibly none).
#[derive(Debug)]
pub(crate) struct Restore {
    prev: cu::CUcontext,
}

impl Restore {
    /// Binds `ctx` on the calling thread, remembering what was current.
    pub(crate) fn bind(ctx: &CudaContext) -> Result<Self, CudaError> {
        let prev = current()?;
        ctx.bind_to_thread()
            .map_err(|e| super::result::from_driver("cuCtxSetCurrent", e))?;
        Ok(Restore { prev })
    }

    /// Remembers the current context without changing it (for work that may bind another).
    pub(crate) fn keep() -> Result<Self, CudaError> {
        Ok(Restore { prev: current()? })
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        // SAFETY: `prev` was current on this thread when the guard was made (or null, which
        // unbinds); the driver reports a context destroyed since as an error.
        let r = unsafe { cu::cuCtxSetCurrent(self.prev) };
        if let Err(e) = check("cuCtxSetCurrent", r) {
            tracing::warn!(error = %e, "CUDA: restoring the previous context failed");
        }
    }
}

fn current() -> Result<cu::CUcontext, CudaError> {
    let mut c: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    check("cuCtxGetCurrent", unsafe { cu::cuCtxGetCurrent(&mut c) })?;
    Ok(c)
}

/// `cuCtxSynchronize` of the current context.
pub(crate) fn ctx_synchronize() -> Result<(), CudaError> {
    // SAFETY: no arguments; without a current context the driver returns an error.
    check("cuCtxSynchronize", unsafe { cu::cuCtxSynchronize() })
}

/// `CU_MEMORYTYPE_DEVICE` as the number [`pointer_kind`] returns.
pub(crate) const MEMORYTYPE_DEVICE: u32 = cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;

/// What `cuPointerGetAttribute` says of `ptr`: its memory type (`CUmemorytype` as a number)
/// and, for device memory, its GPU ordinal.
pub(crate) fn pointer_kind(ptr: u64) -> Result<(u32, Option<i32>), CudaError> {
    let mut mem_type: u32 = 0;
    // SAFETY: the out pointer is valid for the attribute's 4-byte value; the driver only reads
    // `ptr` as a number.
    check("cuPointerGetAttribute", unsafe {
        cu::cuPointerGetAttribute(
            (&mut mem_type as *mut u32).cast(),
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    })?;
    if mem_type != MEMORYTYPE_DEVICE {
        return Ok((mem_type, None));
    }
    let mut ord: i32 = -1;
    // SAFETY: as above, 4-byte attribute.
    let r = unsafe {
        cu::cuPointerGetAttribute(
            (&mut ord as *mut i32).cast(),
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    Ok((
        mem_type,
        check("cuPointerGetAttribute", r).ok().map(|()| ord),
    ))
}

/// The allocation containing a device pointer: (base, size).
pub(crate) fn address_range(ptr: u64) -> Result<(u64, u64), CudaError> {
    let mut base: cu::CUdeviceptr = 0;
    let mut size: usize = 0;
    // SAFETY: valid out pointers; the driver only looks `ptr` up.
    check("cuMemGetAddressRange", unsafe {
        cu::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
    })?;
    Ok((base, size as u64))
}
