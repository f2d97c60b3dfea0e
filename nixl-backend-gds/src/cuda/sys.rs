//! Hand-written bindings of the CUDA driver API functions this crate calls (`cuda.h`, driver
//! 525+), resolved at run time with libloading. No logic beyond loading: the guarded open
//! sequence and the owning types are in `super`.
#![allow(non_camel_case_types, non_snake_case, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `CUresult` (0 is `CUDA_SUCCESS`).
pub type CUresult = c_int;
/// `CUdevice`.
pub type CUdevice = c_int;
/// `CUcontext`.
pub type CUcontext = *mut c_void;
/// `CUstream`.
pub type CUstream = *mut c_void;
/// `CUdeviceptr` (64-bit).
pub type CUdeviceptr = u64;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CUresult = 0;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` (an `unsigned int` holding a `CUmemorytype`).
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` (an `int`).
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CU_MEMORYTYPE_DEVICE`.
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;
/// `CU_STREAM_NON_BLOCKING`.
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context, not only the current one.
pub const CU_MEMHOSTALLOC_PORTABLE: c_uint = 1;

/// The libcuda entry points.
pub struct CudaFns {
    pub cuInit: unsafe extern "C" fn(c_uint) -> CUresult,
    pub cuGetErrorName: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
    pub cuDeviceGetCount: unsafe extern "C" fn(*mut c_int) -> CUresult,
    pub cuDeviceGet: unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult,
    pub cuDevicePrimaryCtxRetain: unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult,
    pub cuDevicePrimaryCtxRelease_v2: unsafe extern "C" fn(CUdevice) -> CUresult,
    pub cuCtxGetCurrent: unsafe extern "C" fn(*mut CUcontext) -> CUresult,
    pub cuCtxSetCurrent: unsafe extern "C" fn(CUcontext) -> CUresult,
    pub cuPointerGetAttribute: unsafe extern "C" fn(*mut c_void, c_int, CUdeviceptr) -> CUresult,
    pub cuMemGetAddressRange_v2:
        unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> CUresult,
    pub cuMemHostAlloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CUresult,
    pub cuMemFreeHost: unsafe extern "C" fn(*mut c_void) -> CUresult,
    pub cuStreamCreate: unsafe extern "C" fn(*mut CUstream, c_uint) -> CUresult,
    pub cuStreamDestroy_v2: unsafe extern "C" fn(CUstream) -> CUresult,
    pub cuStreamSynchronize: unsafe extern "C" fn(CUstream) -> CUresult,
    pub cuMemcpyDtoHAsync_v2:
        unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult,
    pub cuMemcpyHtoDAsync_v2:
        unsafe extern "C" fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult,
}

/// Resolves the fields of a function table from a library, failing with the first missing
/// symbol's name.
macro_rules! load_fns {
    ($lib:expr, $ty:ident { $($name:ident),* $(,)? }) => {{
        $ty {
            $(
                // SAFETY: the symbol's C signature is the field's type, copied from the
                // library's header; the `Library` outlives the pointer (kept beside it).
                $name: unsafe { *$lib.get(concat!(stringify!($name), "\0").as_bytes()).map_err(|e| format!("{}: {e}", stringify!($name)))? },
            )*
        }
    }};
}
#[cfg(feature = "gds")]
pub(crate) use load_fns;

/// Resolves the libcuda functions.
pub fn cuda_fns(lib: &libloading::Library) -> Result<CudaFns, String> {
    Ok(load_fns!(
        lib,
        CudaFns {
            cuInit,
            cuGetErrorName,
            cuDeviceGetCount,
            cuDeviceGet,
            cuDevicePrimaryCtxRetain,
            cuDevicePrimaryCtxRelease_v2,
            cuCtxGetCurrent,
            cuCtxSetCurrent,
            cuPointerGetAttribute,
            cuMemGetAddressRange_v2,
            cuMemHostAlloc,
            cuMemFreeHost,
            cuStreamCreate,
            cuStreamDestroy_v2,
            cuStreamSynchronize,
            cuMemcpyDtoHAsync_v2,
            cuMemcpyHtoDAsync_v2,
        }
    ))
}
