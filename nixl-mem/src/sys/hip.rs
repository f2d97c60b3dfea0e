//! HIP (ROCm) through hip-sys, feature `rocm`: device selection, `hipMalloc` allocations and
//! their copies, IPC handles and dma-buf export.

use std::ffi::{c_void, CStr};
use std::os::fd::{FromRawFd, OwnedFd};

use hip_sys::hiprt as hip;

/// Converts a HIP status into a typed result. The one conversion point for HIP.
pub(crate) fn check(call: &'static str, r: hip::hipError_t) -> Result<(), HipError> {
    if r == hip::hipError_t::hipSuccess {
        return Ok(());
    }
    // SAFETY: hipGetErrorName returns a static NUL-terminated string for any code.
    let name = unsafe { CStr::from_ptr(hip::hipGetErrorName(r)) }
        .to_string_lossy()
        .into_owned();
    Err(HipError {
        call,
        code: r as u32,
        name,
    })
}

/// `hipGetDeviceCount`.
pub(crate) fn device_count() -> Result<i32, HipError> {
    let mut n = 0;
    // SAFETY: valid out pointer; the runtime reports a missing driver or device as a code.
    check("hipGetDeviceCount", unsafe {
        hip::hipGetDeviceCount(&mut n)
    })?;
    Ok(n)
}

/// `hipSetDevice` (the ordinal is checked by the caller and by the runtime).
pub(crate) fn set_device(device: usize) -> Result<(), HipError> {
    let d = i32::try_from(device).unwrap_or(i32::MAX);
    // SAFETY: a plain call; the runtime validates the ordinal.
    check("hipSetDevice", unsafe { hip::hipSetDevice(d) })
}

fn inside(len: usize, offset: usize, n: usize) -> Result<(), HipError> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(HipError {
            call: "hipMemcpy",
            code: hip::hipError_t::hipErrorInvalidValue as u32,
            name: "range outside the allocation".to_owned(),
        }),
    }
}

/// A `hipMalloc` allocation on one device (set current by the caller), freed on drop.
pub(crate) struct HipAlloc {
    ptr: *mut c_void,
    len: usize,
    device: usize,
}

// SAFETY: a device allocation owned by the value; HIP calls are thread-safe once the device is
// set on the calling thread (the owner sets it before every call; Drop sets it).
unsafe impl Send for HipAlloc {}
// SAFETY: as above; host access is by copies only.
unsafe impl Sync for HipAlloc {}

impl HipAlloc {
    /// Allocates `len > 0` bytes on the current device (`device`) and zeroes them.
    pub(crate) fn new(device: usize, len: usize) -> Result<Self, HipError> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointer; the device is set.
        check("hipMalloc", unsafe { hip::hipMalloc(&mut ptr, len) })?;
        let a = HipAlloc { ptr, len, device };
        // SAFETY: the whole fresh allocation; hipMemset is synchronous for device memory.
        check("hipMemset", unsafe { hip::hipMemset(ptr, 0, len) })?;
        Ok(a)
    }

    /// The device pointer.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Copies `src` in at `offset` (synchronous; the device is set).
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result<(), HipError> {
        inside(self.len, offset, src.len())?;
        // SAFETY: the destination is inside the allocation (checked); `src` is a live slice.
        check("hipMemcpy", unsafe {
            hip::hipMemcpy(
                self.ptr.cast::<u8>().add(offset).cast(),
                src.as_ptr().cast(),
                src.len(),
                hip::hipMemcpyKind::hipMemcpyHostToDevice,
            )
        })
    }

    /// Copies out at `offset` into `dst` (synchronous; the device is set).
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), HipError> {
        inside(self.len, offset, dst.len())?;
        // SAFETY: the source is inside the allocation (checked); `dst` is a live exclusive
        // slice.
        check("hipMemcpy", unsafe {
            hip::hipMemcpy(
                dst.as_mut_ptr().cast(),
                self.ptr.cast::<u8>().add(offset).cast(),
                dst.len(),
                hip::hipMemcpyKind::hipMemcpyDeviceToHost,
            )
        })
    }

    /// `hipIpcGetMemHandle` of the allocation (the device is set).
    pub(crate) fn ipc_handle(&self) -> Result<[u8; 64], HipError> {
        let mut h = hip::hipIpcMemHandle_t { reserved: [0; 64] };
        // SAFETY: valid out pointer; the allocation is live.
        check("hipIpcGetMemHandle", unsafe {
            hip::hipIpcGetMemHandle(&mut h, self.ptr)
        })?;
        let mut bytes = [0u8; 64];
        for (d, s) in bytes.iter_mut().zip(h.reserved.iter()) {
            *d = *s as u8;
        }
        Ok(bytes)
    }

    /// Exports the whole allocation as a dma-buf with `hipMemGetHandleForAddressRange`,
    /// looked up at run time (ROCm >= 6.2): `Ok(None)` when the runtime has no such function.
    pub(crate) fn dmabuf(&self) -> Result<Option<OwnedFd>, HipError> {
        type F = unsafe extern "C" fn(*mut c_void, u64, usize, u32, u64) -> hip::hipError_t;
        const HIP_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: u32 = 1;
        let this = libloading::os::unix::Library::this();
        // SAFETY: the symbol, if present, has the C signature of hipMemGetHandleForAddressRange.
        let Ok(f) = (unsafe { this.get::<F>(b"hipMemGetHandleForAddressRange") }) else {
            return Ok(None);
        };
        let mut fd: i32 = -1;
        // SAFETY: `fd` is a valid out pointer for the int handle; the range is the whole live
        // allocation (hipMalloc returns page-aligned memory).
        check("hipMemGetHandleForAddressRange", unsafe {
            f(
                (&mut fd as *mut i32).cast(),
                self.addr(),
                self.len,
                HIP_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        })?;
        if fd < 0 {
            return Err(HipError {
                call: "hipMemGetHandleForAddressRange",
                code: 0,
                name: "no dma-buf fd returned".to_owned(),
            });
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

impl Drop for HipAlloc {
    fn drop(&mut self) {
        let _ = set_device(self.device);
        // SAFETY: allocated by hipMalloc in `new`, freed once.
        if let Err(e) = check("hipFree", unsafe { hip::hipFree(self.ptr) }) {
            tracing::warn!(error = %e, "hipFree failed");
        }
    }
}

/// Another process's allocation opened here (`hipIpcOpenMemHandle`), closed on drop.
pub(crate) struct HipIpcOpen {
    ptr: *mut c_void,
    device: usize,
}

// SAFETY: as for `HipAlloc`.
unsafe impl Send for HipIpcOpen {}
// SAFETY: as for `HipAlloc`.
unsafe impl Sync for HipIpcOpen {}

impl HipIpcOpen {
    /// Opens `bytes` (a `hipIpcMemHandle_t`) on the current device (`device`).
    pub(crate) fn open(device: usize, bytes: &[u8; 64]) -> Result<Self, HipError> {
        let mut h = hip::hipIpcMemHandle_t { reserved: [0; 64] };
        for (d, s) in h.reserved.iter_mut().zip(bytes.iter()) {
            *d = *s as _;
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointer; flag 1 = hipIpcMemLazyEnablePeerAccess.
        check("hipIpcOpenMemHandle", unsafe {
            hip::hipIpcOpenMemHandle(&mut ptr, h, 1)
        })?;
        Ok(HipIpcOpen { ptr, device })
    }

    /// The mapped address.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for HipIpcOpen {
    fn drop(&mut self) {
        let _ = set_device(self.device);
        // SAFETY: opened in `open`, closed once.
        if let Err(e) = check("hipIpcCloseMemHandle", unsafe {
            hip::hipIpcCloseMemHandle(self.ptr)
        }) {
            tracing::warn!(error = %e, "hipIpcCloseMemHandle failed");
        }
    }
}

/// A failed HIP call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name} ({code})")]
pub struct HipError {
    /// The HIP function.
    pub call: &'static str,
    /// The `hipError_t` value.
    pub code: u32,
    /// HIP's name for it.
    pub name: String,
}
