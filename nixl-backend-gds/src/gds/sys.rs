//! Hand-written bindings of the parts of `cufile.h` (CUDA 12.0+, libcufile 1.5+) the GDS
//! backend uses, resolved at run time with libloading (the CUDA driver's are in
//! `crate::cuda::sys`). No logic here beyond loading: see `super` for the guarded open
//! sequence.
#![allow(non_camel_case_types, non_snake_case, dead_code)]

use std::ffi::{c_int, c_uint, c_void};

use crate::cuda::sys::load_fns;
pub use crate::cuda::sys::CUresult;

/// `CUfileError_t`: a cuFile status and the CUDA driver status behind it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUfileError_t {
    /// `CUfileOpError`: 0 is `CU_FILE_SUCCESS`, 5000 + n the cuFile errors.
    pub err: c_int,
    /// `CUresult` when `err` is `CU_FILE_CUDA_DRIVER_ERROR`.
    pub cu_err: CUresult,
}

/// The name and text of a `CUfileOpError` (cufile.h's `CUFILE_OP` table), as
/// `" (CU_FILE_X: text)"`, or an empty string for a code not listed.
pub fn error_hint(err: c_int) -> &'static str {
    match err - 5000 {
        1 => " (CU_FILE_DRIVER_NOT_INITIALIZED: nvidia-fs driver is not loaded)",
        7 => " (CU_FILE_PLATFORM_NOT_SUPPORTED: GPUDirect Storage not supported on current platform)",
        8 => " (CU_FILE_IO_NOT_SUPPORTED: GPUDirect Storage not supported on current file)",
        9 => " (CU_FILE_DEVICE_NOT_SUPPORTED: GPUDirect Storage not supported on current GPU)",
        10 => " (CU_FILE_NVFS_DRIVER_ERROR: nvidia-fs driver ioctl error)",
        11 => " (CU_FILE_CUDA_DRIVER_ERROR: CUDA Driver API error)",
        18 => " (CU_FILE_INVALID_FILE_TYPE: unsupported file type)",
        19 => " (CU_FILE_INVALID_FILE_OPEN_FLAG: unsupported file open flags)",
        20 => " (CU_FILE_DIO_NOT_SET: fd direct IO not set)",
        22 => " (CU_FILE_INVALID_VALUE: invalid arguments)",
        25 => " (CU_FILE_PERMISSION_DENIED: driver or file access error)",
        27 => " (CU_FILE_HANDLE_NOT_REGISTERED: file descriptor is not registered; cufile.log may say more, e.g. cufio-fs: error getting volume attributes)",
        28 => " (CU_FILE_HANDLE_ALREADY_REGISTERED: file descriptor is already registered)",
        29 => " (CU_FILE_DEVICE_NOT_FOUND: GPU device not found)",
        30 => " (CU_FILE_INTERNAL_ERROR: internal error)",
        34 => " (CU_FILE_IO_DISABLED: GPUDirect Storage disabled by config on current file)",
        _ => "",
    }
}

/// `CU_FILE_SUCCESS`.
pub const CU_FILE_SUCCESS: c_int = 0;
/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
pub const CU_FILE_HANDLE_TYPE_OPAQUE_FD: c_int = 1;
/// `CUFILE_READ`.
pub const CUFILE_READ: c_int = 0;
/// `CUFILE_WRITE`.
pub const CUFILE_WRITE: c_int = 1;
/// `CUFILE_PARAM_FORCE_COMPAT_MODE` of `CUFileBoolConfigParameter_t` (libcufile 1.14+).
pub const CUFILE_PARAM_FORCE_COMPAT_MODE: c_int = 2;
/// `CUFILE_BATCH`.
pub const CUFILE_BATCH: c_int = 1;
/// `CUfileStatus_t` values.
pub const CUFILE_WAITING: c_int = 0x01;
/// Pending.
pub const CUFILE_PENDING: c_int = 0x02;
/// Invalid.
pub const CUFILE_INVALID: c_int = 0x04;
/// Canceled.
pub const CUFILE_CANCELED: c_int = 0x08;
/// Complete.
pub const CUFILE_COMPLETE: c_int = 0x10;
/// Timed out.
pub const CUFILE_TIMEOUT: c_int = 0x20;
/// Failed.
pub const CUFILE_FAILED: c_int = 0x40;

/// `CUfileDescr_t` (the handle union holds an fd on Linux).
#[repr(C)]
pub struct CUfileDescr_t {
    /// `CUfileFileHandleType`.
    pub type_: c_int,
    /// `handle.fd` (the union is pointer-sized).
    pub handle: CUfileDescrHandle,
    /// `const CUfileFSOps_t *` (null for kernel file systems).
    pub fs_ops: *const c_void,
}

/// The `handle` union of `CUfileDescr_t`.
#[repr(C)]
pub union CUfileDescrHandle {
    /// A file descriptor.
    pub fd: c_int,
    /// A Windows handle (unused).
    pub handle: *mut c_void,
}

/// `CUfileHandle_t`.
pub type CUfileHandle_t = *mut c_void;
/// `CUfileBatchHandle_t`.
pub type CUfileBatchHandle_t = *mut c_void;

/// `CUfileIOParams_t` (its union has one member, the `batch` struct, inlined here).
#[repr(C)]
pub struct CUfileIOParams_t {
    /// `CUFILE_BATCH`.
    pub mode: c_int,
    /// `u.batch.devPtr_base`: device or host memory.
    pub devPtr_base: *mut c_void,
    /// `u.batch.file_offset`.
    pub file_offset: libc::off_t,
    /// `u.batch.devPtr_offset`.
    pub devPtr_offset: libc::off_t,
    /// `u.batch.size`.
    pub size: usize,
    /// The registered file.
    pub fh: CUfileHandle_t,
    /// `CUFILE_READ` or `CUFILE_WRITE`.
    pub opcode: c_int,
    /// Returned in the event.
    pub cookie: *mut c_void,
}

/// `CUfileIOEvents_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfileIOEvents_t {
    /// The submitted cookie.
    pub cookie: *mut c_void,
    /// `CUfileStatus_t`.
    pub status: c_int,
    /// Bytes done, or a negative error.
    pub ret: usize,
}

/// The libcufile entry points.
pub struct CufileFns {
    pub cuFileDriverOpen: unsafe extern "C" fn() -> CUfileError_t,
    pub cuFileDriverClose: unsafe extern "C" fn() -> CUfileError_t,
    pub cuFileHandleRegister:
        unsafe extern "C" fn(*mut CUfileHandle_t, *mut CUfileDescr_t) -> CUfileError_t,
    pub cuFileHandleDeregister: unsafe extern "C" fn(CUfileHandle_t),
    pub cuFileBufRegister: unsafe extern "C" fn(*const c_void, usize, c_int) -> CUfileError_t,
    pub cuFileBufDeregister: unsafe extern "C" fn(*const c_void) -> CUfileError_t,
    pub cuFileRead:
        unsafe extern "C" fn(CUfileHandle_t, *mut c_void, usize, libc::off_t, libc::off_t) -> isize,
    pub cuFileWrite: unsafe extern "C" fn(
        CUfileHandle_t,
        *const c_void,
        usize,
        libc::off_t,
        libc::off_t,
    ) -> isize,
    pub cuFileBatchIOSetUp: unsafe extern "C" fn(*mut CUfileBatchHandle_t, c_uint) -> CUfileError_t,
    pub cuFileBatchIOSubmit: unsafe extern "C" fn(
        CUfileBatchHandle_t,
        c_uint,
        *mut CUfileIOParams_t,
        c_uint,
    ) -> CUfileError_t,
    pub cuFileBatchIOGetStatus: unsafe extern "C" fn(
        CUfileBatchHandle_t,
        c_uint,
        *mut c_uint,
        *mut CUfileIOEvents_t,
        *mut libc::timespec,
    ) -> CUfileError_t,
    pub cuFileBatchIOCancel: unsafe extern "C" fn(CUfileBatchHandle_t) -> CUfileError_t,
    pub cuFileBatchIODestroy: unsafe extern "C" fn(CUfileBatchHandle_t),
}

/// `cuFileSetParameterBool(CUFileBoolConfigParameter_t, bool)`, libcufile 1.14+ only (loaded
/// as an optional symbol); must be called before `cuFileDriverOpen`.
pub type CuFileSetParameterBool = unsafe extern "C" fn(c_int, bool) -> CUfileError_t;

/// Resolves `cuFileSetParameterBool` where the library has it.
pub fn set_parameter_bool(lib: &libloading::Library) -> Option<CuFileSetParameterBool> {
    // SAFETY: the symbol's C signature is `CuFileSetParameterBool` (cufile.h of CUDA 12.6+);
    // the `Library` is kept beside the pointer.
    unsafe { lib.get::<CuFileSetParameterBool>(b"cuFileSetParameterBool\0") }
        .ok()
        .map(|s| *s)
}

/// Resolves the libcufile functions.
pub fn cufile_fns(lib: &libloading::Library) -> Result<CufileFns, String> {
    Ok(load_fns!(
        lib,
        CufileFns {
            cuFileDriverOpen,
            cuFileDriverClose,
            cuFileHandleRegister,
            cuFileHandleDeregister,
            cuFileBufRegister,
            cuFileBufDeregister,
            cuFileRead,
            cuFileWrite,
            cuFileBatchIOSetUp,
            cuFileBatchIOSubmit,
            cuFileBatchIOGetStatus,
            cuFileBatchIOCancel,
            cuFileBatchIODestroy,
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_cufile_h() {
        assert_eq!(std::mem::size_of::<CUfileError_t>(), 8);
        assert_eq!(std::mem::size_of::<CUfileDescr_t>(), 24);
        assert_eq!(std::mem::size_of::<CUfileIOParams_t>(), 64);
        assert_eq!(std::mem::offset_of!(CUfileIOParams_t, fh), 40);
        assert_eq!(std::mem::size_of::<CUfileIOEvents_t>(), 24);
    }

    #[test]
    fn the_vm_disk_error_is_named() {
        assert!(error_hint(5027).contains("CU_FILE_HANDLE_NOT_REGISTERED"));
        assert!(error_hint(5020).contains("CU_FILE_DIO_NOT_SET"));
        assert_eq!(error_hint(0), "");
    }
}
