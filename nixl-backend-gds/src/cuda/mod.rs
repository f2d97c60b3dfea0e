//! The CUDA driver, shared by the POSIX bounce engine and GDS: loaded at run time (libloading,
//! `libcuda.so.1`) on first use, never when a backend is created.
//!
//! Layering: [`sys`] is the function table; [`check`] is the one place a `CUresult` becomes a
//! typed [`CudaError`] (carried as the `source` of [`Error::Backend`]); the owning types
//! ([`PrimaryCtx`], [`PinnedBuf`], [`Stream`]) release exactly one handle each on drop and hold
//! an `Arc` of their parent. The loader is guarded: `cuInit` and at least one device are
//! required, otherwise every caller gets [`Error::Unavailable`] naming what to install (this
//! is also what keeps libcufile's `cuFileDriverOpen` from spinning without a driver).

pub(crate) mod sys;

use std::ffi::{c_uint, c_void, CStr};
use std::sync::{Arc, OnceLock};

use nixl_core::{Error, Op, Result};

/// A failed CUDA driver call: the function and the driver's code and name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name} ({code})")]
pub(crate) struct CudaError {
    /// The driver function.
    pub call: &'static str,
    /// The `CUresult`.
    pub code: i32,
    /// The driver's name for it (`CUDA_ERROR_INVALID_VALUE`), or `?` if unknown.
    pub name: String,
}

impl CudaError {
    /// Wraps the error into the workspace error of `backend` (`POSIX`, `GDS`).
    pub fn into_error(self, agent: &str, backend: &str, op: Op) -> Error {
        Error::Backend {
            agent: agent.to_owned(),
            backend: backend.to_owned(),
            op,
            message: self.to_string(),
            source: Some(std::sync::Arc::new(self)),
        }
    }
}

/// The loaded driver: its function table, the library kept open, and the device count.
pub(crate) struct Cuda {
    pub fns: sys::CudaFns,
    devices: i32,
    _lib: libloading::Library,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda")
            .field("devices", &self.devices)
            .finish()
    }
}

static CUDA: OnceLock<std::result::Result<Arc<Cuda>, (String, String)>> = OnceLock::new();

fn load() -> std::result::Result<Arc<Cuda>, (String, String)> {
    // SAFETY: loading libcuda runs its initialisers, which have no preconditions; the library
    // is kept alive (in `Cuda`) as long as the functions taken from it.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }.map_err(|e| {
        (
            "libcuda.so.1 (the NVIDIA driver)".to_owned(),
            format!("install the NVIDIA driver (or put libcuda.so.1 on LD_LIBRARY_PATH): {e}"),
        )
    })?;
    let fns = sys::cuda_fns(&lib).map_err(|e| {
        (
            "libcuda.so.1".to_owned(),
            format!("missing symbol {e}; update the NVIDIA driver (>= 525)"),
        )
    })?;
    // SAFETY: cuInit takes flags 0 and may be called any number of times.
    let rc = unsafe { (fns.cuInit)(0) };
    if rc != sys::CUDA_SUCCESS {
        return Err((
            "a CUDA device".to_owned(),
            format!("cuInit failed with CUresult {rc}; check the driver and CUDA_VISIBLE_DEVICES"),
        ));
    }
    let mut n = 0;
    // SAFETY: the pointer is valid for one int; the driver is initialised.
    let rc = unsafe { (fns.cuDeviceGetCount)(&mut n) };
    if rc != sys::CUDA_SUCCESS || n <= 0 {
        return Err((
            "a CUDA device".to_owned(),
            format!("cuDeviceGetCount: CUresult {rc}, {n} devices (CUDA_VISIBLE_DEVICES?)"),
        ));
    }
    Ok(Arc::new(Cuda {
        fns,
        devices: n,
        _lib: lib,
    }))
}

/// The driver, loaded and checked once per process; later calls return the same driver or
/// the same reason it is unavailable.
pub(crate) fn cuda() -> Result<Arc<Cuda>> {
    CUDA.get_or_init(load)
        .clone()
        .map_err(|(what, hint)| Error::Unavailable { what, hint })
}

/// The driver if an earlier call loaded it (never loads it).
pub(crate) fn loaded() -> Option<Arc<Cuda>> {
    CUDA.get().and_then(|r| r.as_ref().ok().cloned())
}

impl Cuda {
    /// Converts a driver status into a typed result. The one conversion point.
    pub fn check(
        &self,
        call: &'static str,
        rc: sys::CUresult,
    ) -> std::result::Result<(), CudaError> {
        if rc == sys::CUDA_SUCCESS {
            return Ok(());
        }
        let mut p: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: the out-pointer is valid; the driver returns a static string or an error.
        let named = unsafe { (self.fns.cuGetErrorName)(rc, &mut p) } == sys::CUDA_SUCCESS;
        let name = if named && !p.is_null() {
            // SAFETY: cuGetErrorName succeeded, so `p` is a static NUL-terminated string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            "?".to_owned()
        };
        Err(CudaError {
            call,
            code: rc,
            name,
        })
    }

    /// The number of visible devices.
    pub fn device_count(&self) -> i32 {
        self.devices
    }

    /// Retains the primary context of device `ordinal` (released when the last `Arc` drops).
    pub fn retain_primary(
        self: &Arc<Self>,
        ordinal: i32,
    ) -> std::result::Result<Arc<PrimaryCtx>, CudaError> {
        let mut dev = 0;
        // SAFETY: the out-pointer is valid; the driver is initialised.
        self.check("cuDeviceGet", unsafe {
            (self.fns.cuDeviceGet)(&mut dev, ordinal)
        })?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the out-pointer is valid; `dev` came from cuDeviceGet.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.fns.cuDevicePrimaryCtxRetain)(&mut raw, dev)
        })?;
        Ok(Arc::new(PrimaryCtx {
            cuda: self.clone(),
            dev,
            ordinal,
            raw,
        }))
    }
}

/// One retain of a device's primary context (the context nixl-mem's and the CUDA runtime's
/// allocations live in).
pub(crate) struct PrimaryCtx {
    cuda: Arc<Cuda>,
    dev: sys::CUdevice,
    ordinal: i32,
    raw: sys::CUcontext,
}

// SAFETY: a CUDA context handle may be made current on, and used from, any thread; the driver
// synchronises internally.
unsafe impl Send for PrimaryCtx {}
// SAFETY: as above; `&PrimaryCtx` only reads the handle.
unsafe impl Sync for PrimaryCtx {}

impl std::fmt::Debug for PrimaryCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrimaryCtx")
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

impl Drop for PrimaryCtx {
    fn drop(&mut self) {
        // SAFETY: this value holds exactly one retain of the device's primary context.
        let rc = unsafe { (self.cuda.fns.cuDevicePrimaryCtxRelease_v2)(self.dev) };
        if let Err(e) = self.cuda.check("cuDevicePrimaryCtxRelease", rc) {
            tracing::warn!(error = %e, "CUDA: releasing a primary context failed");
        }
    }
}

/// Restores the calling thread's previous current context on drop.
pub(crate) struct Scoped<'a> {
    cuda: &'a Cuda,
    prev: sys::CUcontext,
}

impl Drop for Scoped<'_> {
    fn drop(&mut self) {
        // SAFETY: `prev` was current on this thread before (or null, which unbinds).
        let rc = unsafe { (self.cuda.fns.cuCtxSetCurrent)(self.prev) };
        if let Err(e) = self.cuda.check("cuCtxSetCurrent", rc) {
            tracing::warn!(error = %e, "CUDA: restoring the previous context failed");
        }
    }
}

impl PrimaryCtx {
    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Makes the context current on the calling thread (for the backend's own workers).
    pub fn bind(&self) -> std::result::Result<(), CudaError> {
        // SAFETY: `raw` is a retained context, valid while `self` lives.
        let rc = unsafe { (self.cuda.fns.cuCtxSetCurrent)(self.raw) };
        self.cuda.check("cuCtxSetCurrent", rc)
    }

    /// Makes the context current until the guard drops, then restores the caller's context
    /// (for calls made on a user's thread).
    pub fn scoped(&self) -> std::result::Result<Scoped<'_>, CudaError> {
        let mut prev = std::ptr::null_mut();
        // SAFETY: the out-pointer is valid.
        let rc = unsafe { (self.cuda.fns.cuCtxGetCurrent)(&mut prev) };
        self.cuda.check("cuCtxGetCurrent", rc)?;
        self.bind()?;
        Ok(Scoped {
            cuda: &self.cuda,
            prev,
        })
    }

    /// Checks that `[addr, addr + len)` is device memory of this device inside one
    /// allocation; the reason when it is not.
    pub fn check_range(&self, addr: u64, len: u64) -> std::result::Result<(), String> {
        let _g = self.scoped().map_err(|e| e.to_string())?;
        let f = &self.cuda.fns;
        let mut mem_type: c_uint = 0;
        // SAFETY: CU_POINTER_ATTRIBUTE_MEMORY_TYPE writes one unsigned int into the pointer.
        let rc = unsafe {
            (f.cuPointerGetAttribute)(
                (&mut mem_type as *mut c_uint).cast::<c_void>(),
                sys::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                addr,
            )
        };
        if rc != sys::CUDA_SUCCESS || mem_type != sys::CU_MEMORYTYPE_DEVICE {
            return Err(format!(
                "{addr:#x} is not CUDA device memory (CUresult {rc}, memory type {mem_type})"
            ));
        }
        let mut ordinal: std::ffi::c_int = -1;
        // SAFETY: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL writes one int into the pointer.
        let rc = unsafe {
            (f.cuPointerGetAttribute)(
                (&mut ordinal as *mut std::ffi::c_int).cast::<c_void>(),
                sys::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        };
        if rc == sys::CUDA_SUCCESS && ordinal != self.ordinal {
            return Err(format!(
                "{addr:#x} is memory of GPU {ordinal}, not of GPU {} (the region's dev_id)",
                self.ordinal
            ));
        }
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: both out-pointers are valid; `addr` is device memory (checked above).
        let rc = unsafe { (f.cuMemGetAddressRange_v2)(&mut base, &mut size, addr) };
        self.cuda
            .check("cuMemGetAddressRange", rc)
            .map_err(|e| e.to_string())?;
        let end = addr.checked_add(len).ok_or("the region overflows")?;
        if end > base + size as u64 {
            return Err(format!(
                "{addr:#x}+{len} runs past the end of its allocation {base:#x}+{size}"
            ));
        }
        Ok(())
    }
}

/// Page-locked host memory (`cuMemHostAlloc`, portable to every context), freed on drop.
pub(crate) struct PinnedBuf {
    ctx: Arc<PrimaryCtx>,
    ptr: *mut c_void,
    len: usize,
}

// SAFETY: the allocation is plain host memory owned by this value; access to its bytes is
// arranged by the owner (one staging slot is used by one worker at a time).
unsafe impl Send for PinnedBuf {}
// SAFETY: as above; `&PinnedBuf` exposes only the address.
unsafe impl Sync for PinnedBuf {}

impl PinnedBuf {
    /// Allocates `len` bytes of pinned memory with `ctx` current.
    pub fn new(ctx: &Arc<PrimaryCtx>, len: usize) -> std::result::Result<Self, CudaError> {
        let _g = ctx.scoped()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: the out-pointer is valid; a context is current.
        let rc =
            unsafe { (ctx.cuda.fns.cuMemHostAlloc)(&mut ptr, len, sys::CU_MEMHOSTALLOC_PORTABLE) };
        ctx.cuda.check("cuMemHostAlloc", rc)?;
        Ok(PinnedBuf {
            ctx: ctx.clone(),
            ptr,
            len,
        })
    }

    /// The start address.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        let _g = self.ctx.scoped();
        // SAFETY: `ptr` came from cuMemHostAlloc and is freed once; no copy uses it any more
        // (a staging slot is dropped only when no worker holds it).
        let rc = unsafe { (self.ctx.cuda.fns.cuMemFreeHost)(self.ptr) };
        if let Err(e) = self.ctx.cuda.check("cuMemFreeHost", rc) {
            tracing::warn!(error = %e, "CUDA: freeing a pinned buffer failed");
        }
    }
}

/// A non-blocking stream of one context, destroyed on drop.
pub(crate) struct Stream {
    ctx: Arc<PrimaryCtx>,
    raw: sys::CUstream,
}

// SAFETY: a stream handle may be used from any thread with its context current.
unsafe impl Send for Stream {}

impl Stream {
    /// Creates a `CU_STREAM_NON_BLOCKING` stream in `ctx`.
    pub fn new(ctx: &Arc<PrimaryCtx>) -> std::result::Result<Self, CudaError> {
        let _g = ctx.scoped()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the out-pointer is valid; `ctx` is current.
        let rc = unsafe { (ctx.cuda.fns.cuStreamCreate)(&mut raw, sys::CU_STREAM_NON_BLOCKING) };
        ctx.cuda.check("cuStreamCreate", rc)?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// The context the stream belongs to.
    pub fn ctx(&self) -> &Arc<PrimaryCtx> {
        &self.ctx
    }

    /// Copies `len` bytes of device memory at `src` to `dst` and waits for the copy.
    ///
    /// # Safety
    /// `src..src+len` is device memory of the stream's device and `dst..dst+len` pinned host
    /// memory, both alive and not written by anyone else until this returns; the stream's
    /// context is current on the calling thread.
    pub unsafe fn copy_dtoh(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
    ) -> std::result::Result<(), CudaError> {
        let f = &self.ctx.cuda.fns;
        // SAFETY: the caller guarantees both ranges and the current context.
        let rc = unsafe { (f.cuMemcpyDtoHAsync_v2)(dst.cast(), src, len, self.raw) };
        self.ctx.cuda.check("cuMemcpyDtoHAsync", rc)?;
        self.synchronize()
    }

    /// Copies `len` bytes of host memory at `src` to device memory at `dst` and waits.
    ///
    /// # Safety
    /// As [`Stream::copy_dtoh`], with the directions swapped.
    pub unsafe fn copy_htod(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> std::result::Result<(), CudaError> {
        let f = &self.ctx.cuda.fns;
        // SAFETY: the caller guarantees both ranges and the current context.
        let rc = unsafe { (f.cuMemcpyHtoDAsync_v2)(dst, src.cast(), len, self.raw) };
        self.ctx.cuda.check("cuMemcpyHtoDAsync", rc)?;
        self.synchronize()
    }

    fn synchronize(&self) -> std::result::Result<(), CudaError> {
        // SAFETY: the stream is valid. The wait is bounded by the copy just queued (a copy
        // engine transfer of at most one staging buffer); the driver reports a failed device
        // as an error instead of blocking.
        let rc = unsafe { (self.ctx.cuda.fns.cuStreamSynchronize)(self.raw) };
        self.ctx.cuda.check("cuStreamSynchronize", rc)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _g = self.ctx.scoped();
        // SAFETY: the stream is destroyed once; every copy on it was synchronised.
        let rc = unsafe { (self.ctx.cuda.fns.cuStreamDestroy_v2)(self.raw) };
        if let Err(e) = self.ctx.cuda.check("cuStreamDestroy", rc) {
            tracing::warn!(error = %e, "CUDA: destroying a stream failed");
        }
    }
}
