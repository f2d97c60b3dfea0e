//! The CUDA driver, loaded at run time through cudarc's `sys` bindings.
//!
//! Layering (house style): `cudarc::driver::sys` is the generated, run-time-loaded binding;
//! one private `check` function is the only place a `CUresult` becomes a typed error
//! ([`CudaError`] carried as the `source` of [`nixl_core::Error::Backend`]); the safe layer is
//! the owning types ([`DeviceBuffer`](crate::DeviceBuffer), [`IpcMapping`](crate::IpcMapping),
//! streams and events) whose `Drop` releases exactly one handle each, and which hold an `Arc`
//! of their context.
//!
//! Nothing here calls into the driver before [`driver`] has checked that `libcuda` is present
//! (`cudarc::driver::sys::is_culib_present`), that every symbol this crate uses exists (cudarc
//! would otherwise panic on a missing symbol), and that `cuInit` succeeds. On a machine without
//! the driver or without a device every entry point returns [`nixl_core::Error::Unavailable`].

pub(crate) mod device;
pub(crate) mod ipc;
pub(crate) mod kernel;
#[cfg(test)]
mod ptx_sim;
pub(crate) mod stream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub(crate) use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use nixl_core::{Error, Op, Result};

/// A failed CUDA driver call: the function and the driver's error code and name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name} ({code})")]
pub struct CudaError {
    /// The driver function.
    pub call: &'static str,
    /// The `CUresult` value.
    pub code: u32,
    /// The driver's name for it (`CUDA_ERROR_INVALID_VALUE`).
    pub name: String,
}

impl CudaError {
    /// Whether the code is `CUDA_ERROR_NOT_READY` (work still in flight).
    pub fn is_not_ready(&self) -> bool {
        self.code == sys::CUresult::CUDA_ERROR_NOT_READY as u32
    }
}

/// The backend name used in errors from the memory types.
pub(crate) const CUDA: &str = "CUDA";

/// Converts a driver status into a typed result. The one conversion point.
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> std::result::Result<(), CudaError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(CudaError {
        call,
        code: r as u32,
        name: format!("{r:?}"),
    })
}

/// Wraps a driver error into the workspace error, naming the agent (or `-` for memory types
/// used outside an agent) and the operation.
pub(crate) fn to_error(agent: &str, op: Op, e: CudaError) -> Error {
    Error::Backend {
        agent: agent.to_owned(),
        backend: CUDA.to_owned(),
        op,
        message: e.to_string(),
        source: Some(std::sync::Arc::new(e)),
    }
}

/// `check` then `to_error`, for memory types (no agent).
pub(crate) fn cu(op: Op, call: &'static str, r: sys::CUresult) -> Result<()> {
    check(call, r).map_err(|e| to_error("-", op, e))
}

/// Every driver symbol this crate calls (cudarc's `CudaContext` included); checked once so a
/// missing one is an `Unavailable` error instead of cudarc's panic.
const SYMBOLS: &[&str] = &[
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
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
];

static DRIVER: OnceLock<std::result::Result<(), (String, String)>> = OnceLock::new();

fn load_driver() -> std::result::Result<(), (String, String)> {
    // SAFETY: only tries to dlopen candidate library names; no symbol is called.
    if !unsafe { sys::is_culib_present() } {
        return Err((
            "the CUDA driver (libcuda.so)".to_owned(),
            "install the NVIDIA driver or put libcuda.so.1 on LD_LIBRARY_PATH".to_owned(),
        ));
    }
    // SAFETY: `is_culib_present` just succeeded, so `culib` loads instead of panicking.
    let lib = unsafe { sys::culib() };
    for name in SYMBOLS {
        // SAFETY: looks a symbol up without calling it; the pointer type is irrelevant here.
        if unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err() {
            return Err((
                format!("the CUDA driver symbol {name}"),
                "update the NVIDIA driver (>= 525)".to_owned(),
            ));
        }
    }
    // SAFETY: cuInit exists (checked above) and may be called any number of times.
    let r = unsafe { sys::cuInit(0) };
    if let Err(e) = check("cuInit", r) {
        return Err((
            "a CUDA device".to_owned(),
            format!("{e}; check the driver and CUDA_VISIBLE_DEVICES"),
        ));
    }
    let mut n = 0;
    // SAFETY: cuInit succeeded; `n` is a valid out pointer.
    let r = unsafe { sys::cuDeviceGetCount(&mut n) };
    match check("cuDeviceGetCount", r) {
        Ok(()) if n > 0 => Ok(()),
        Ok(()) => Err((
            "a CUDA device".to_owned(),
            "no device is visible (CUDA_VISIBLE_DEVICES?)".to_owned(),
        )),
        Err(e) => Err(("a CUDA device".to_owned(), e.to_string())),
    }
}

/// Checks (once per process) that the CUDA driver is loadable, complete and has a device.
/// Every CUDA entry point of this crate calls it first.
pub fn driver() -> Result<()> {
    match DRIVER.get_or_init(load_driver) {
        Ok(()) => Ok(()),
        Err((what, hint)) => Err(Error::Unavailable {
            what: what.clone(),
            hint: hint.clone(),
        }),
    }
}

/// Whether CUDA is usable here (driver present and at least one device).
pub fn is_available() -> bool {
    driver().is_ok()
}

/// The number of visible CUDA devices.
pub fn device_count() -> Result<usize> {
    driver()?;
    let mut n = 0;
    // SAFETY: the driver is initialised; `n` is a valid out pointer.
    cu(Op::CreateBackend, "cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut n)
    })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

static CONTEXTS: Mutex<Option<HashMap<usize, Arc<CudaContext>>>> = Mutex::new(None);

/// The primary context of a device, retained once per process and bound to the calling thread.
pub(crate) fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    driver()?;
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::invalid(
            "-",
            Op::RegisterMem,
            format!("CUDA device {ordinal} does not exist ({count} visible)"),
        ));
    }
    let mut g = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    let ctx = match map.get(&ordinal) {
        Some(c) => c.clone(),
        None => {
            let c = CudaContext::new(ordinal).map_err(|e| {
                to_error(
                    "-",
                    Op::CreateBackend,
                    from_driver("cuDevicePrimaryCtxRetain", e),
                )
            })?;
            map.insert(ordinal, c.clone());
            c
        }
    };
    drop(g);
    bind(&ctx)?;
    Ok(ctx)
}

/// Makes `ctx` current on the calling thread.
pub(crate) fn bind(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread()
        .map_err(|e| to_error("-", Op::PostXfer, from_driver("cuCtxSetCurrent", e)))
}

fn from_driver(call: &'static str, e: cudarc::driver::DriverError) -> CudaError {
    CudaError {
        call,
        code: e.0 as u32,
        name: format!("{:?}", e.0),
    }
}

/// The device ordinal a device pointer belongs to, or `None` for host memory / unknown
/// pointers.
pub(crate) fn pointer_device(ptr: u64) -> Option<usize> {
    let mut mem_type: u32 = 0;
    // SAFETY: the out pointer is valid for the attribute's 4-byte value; the driver only reads
    // `ptr` as a number.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut mem_type as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    };
    if check("cuPointerGetAttribute", r).is_err()
        || mem_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
    {
        return None;
    }
    let mut ord: i32 = -1;
    // SAFETY: as above, 4-byte attribute.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ord as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    check("cuPointerGetAttribute", r).ok()?;
    usize::try_from(ord).ok()
}

/// The allocation containing a device pointer: (base, size).
pub(crate) fn address_range(op: Op, ptr: u64) -> Result<(u64, u64)> {
    let mut base: sys::CUdeviceptr = 0;
    let mut size: usize = 0;
    // SAFETY: valid out pointers; the driver only looks `ptr` up.
    cu(op, "cuMemGetAddressRange", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
    })?;
    Ok((base, size as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_typed_and_named() {
        let e = check("cuMemAlloc", sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY).unwrap_err();
        assert_eq!(e.code, 2);
        assert!(e.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"));
        assert!(check("x", sys::CUresult::CUDA_SUCCESS).is_ok());
        assert!(check("x", sys::CUresult::CUDA_ERROR_NOT_READY)
            .unwrap_err()
            .is_not_ready());
        let err = to_error("a", Op::PostXfer, e);
        assert_eq!(err.kind().as_str(), "backend");
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn absent_driver_is_unavailable_not_a_panic() {
        match driver() {
            Ok(()) => eprintln!("CUDA present; nothing to check"),
            Err(e) => {
                assert_eq!(e.kind().as_str(), "unavailable", "{e}");
                assert!(!is_available());
                assert!(device_count().is_err());
                assert!(context(0).is_err());
            }
        }
    }
}
