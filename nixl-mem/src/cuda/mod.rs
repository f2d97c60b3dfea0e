//! The CUDA driver, loaded at run time through cudarc: the one CUDA layer of the workspace
//! (nixl-mem's memory types and `CUDA_IPC`, the UCX backend's VRAM registration, and the POSIX
//! bounce engine and GDS backend of nixl-backend-gds all use it).
//!
//! Layering (house style): `cudarc::driver::sys` is the generated, run-time-loaded binding,
//! called only from this crate's `sys` module; one private `check` is the only place a `CUresult`
//! becomes a typed error ([`CudaError`], carried as the `source` of
//! [`nixl_core::Error::Backend`] by [`CudaError::into_error`]); the safe layer is the owning
//! types ([`DeviceBuffer`](crate::DeviceBuffer), [`IpcMapping`](crate::IpcMapping),
//! [`CudaHostBuffer`](crate::CudaHostBuffer), [`Stream`]) whose `Drop` releases exactly one
//! handle each, and which hold an `Arc` of their context.
//!
//! **One context policy: the device's primary context** (the one the CUDA runtime, and so
//! PyTorch, allocates in), retained once per process per GPU ([`Context::primary`]).
//!
//! Nothing here calls into the driver before [`driver`] has checked that `libcuda` is present
//! (`cudarc::driver::sys::is_culib_present`), that every symbol this crate uses exists (cudarc
//! would otherwise panic on a missing symbol), and that `cuInit` succeeds. On a machine without
//! the driver or without a device every entry point returns [`nixl_core::Error::Unavailable`].

pub(crate) mod device;
pub(crate) mod ipc;
pub(crate) mod kernel;
#[cfg(test)]
pub(crate) mod ptx_sim;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaContext;
use nixl_core::Op;

use crate::error::{MemError, MemResult as Result};

use crate::sys::cu;
use crate::sys::driver as drv;
pub use crate::sys::result::CudaError;
pub(crate) use crate::sys::result::{bind_raw, from_driver};
pub(crate) use crate::sys::stream::Event;
/// Hidden: the bounce engine's stream (see the crate root); applications use cudarc's.
#[doc(hidden)]
pub use crate::sys::stream::Stream;

impl CudaError {
    /// Wraps the error into the workspace error of `backend` (`CUDA`, `POSIX`, `GDS`),
    /// naming the agent and the operation (the memory types return [`MemError`]s instead).
    pub fn into_error(self, agent: &str, backend: &str, op: Op) -> nixl_core::Error {
        nixl_core::Error::Backend {
            agent: agent.to_owned(),
            backend: backend.to_owned(),
            op,
            message: self.to_string(),
            source: Some(std::sync::Arc::new(self)),
        }
    }
}

/// The backend name used in errors from the memory types.
pub(crate) const CUDA: &str = "CUDA";

/// Wraps a driver error into the workspace error of this crate's `CUDA` types.
pub(crate) fn to_error(agent: &str, op: Op, e: CudaError) -> nixl_core::Error {
    e.into_error(agent, CUDA, op)
}

/// A driver result as the workspace error of the memory types (no agent).
pub(crate) fn cu<T>(op: Op, r: std::result::Result<T, CudaError>) -> Result<T> {
    r.map_err(|e| cuda_err(op, e))
}

/// A driver error as the memory layer's error of `op`.
pub(crate) fn cuda_err(op: Op, e: CudaError) -> MemError {
    MemError::library(op, CUDA, e.to_string(), Some(Arc::new(e)))
}

static DRIVER: OnceLock<std::result::Result<(), (String, String)>> = OnceLock::new();

/// Checks (once per process) that the CUDA driver is loadable, complete and has a device.
/// Every CUDA entry point of this crate calls it first.
pub fn driver() -> Result<()> {
    match DRIVER.get_or_init(drv::load) {
        Ok(()) => Ok(()),
        Err((what, hint)) => Err(MemError::unavailable(
            Op::CreateBackend,
            what.clone(),
            hint.clone(),
        )),
    }
}

/// Whether CUDA is usable here (driver present and at least one device).
pub fn is_available() -> bool {
    driver().is_ok()
}

/// The number of visible CUDA devices.
pub fn device_count() -> Result<usize> {
    driver()?;
    let n = drv::device_count().map_err(|e| cuda_err(Op::CreateBackend, e))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

static CONTEXTS: Mutex<Option<HashMap<usize, Arc<CudaContext>>>> = Mutex::new(None);

/// The primary context of a device, retained once per process; the calling thread's current
/// context is left as it was.
pub(crate) fn retain(ordinal: usize) -> Result<Arc<CudaContext>> {
    driver()?;
    let count = device_count()?;
    if ordinal >= count {
        return Err(MemError::invalid(
            Op::RegisterMem,
            format!("CUDA device {ordinal} does not exist ({count} visible)"),
        ));
    }
    let mut g = CONTEXTS.lock();
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(c) = map.get(&ordinal) {
        return Ok(c.clone());
    }
    // cudarc binds a context it creates; the guard puts the caller's back.
    let _restore = drv::Restore::keep().map_err(|e| cuda_err(Op::CreateBackend, e))?;
    let c = CudaContext::new(ordinal).map_err(|e| {
        cuda_err(
            Op::CreateBackend,
            from_driver("cuDevicePrimaryCtxRetain", e),
        )
    })?;
    map.insert(ordinal, c.clone());
    Ok(c)
}

/// The primary context of a device, retained once per process and bound to the calling thread.
pub(crate) fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    let ctx = retain(ordinal)?;
    bind(&ctx)?;
    Ok(ctx)
}

/// Makes `ctx` current on the calling thread.
pub(crate) fn bind(ctx: &CudaContext) -> Result<()> {
    bind_raw(ctx).map_err(|e| cuda_err(Op::PostXfer, e))
}

/// The device ordinal a device pointer belongs to, or `None` for host memory / unknown
/// pointers.
pub(crate) fn pointer_device(ptr: u64) -> Option<usize> {
    match drv::pointer_kind(ptr) {
        Ok((_, Some(ord))) => usize::try_from(ord).ok(),
        _ => None,
    }
}

/// The allocation containing a device pointer: (base, size).
pub(crate) fn address_range(op: Op, ptr: u64) -> Result<(u64, u64)> {
    drv::address_range(ptr).map_err(|e| cuda_err(op, e))
}

/// The primary context of one GPU: what the memory of this crate, the CUDA runtime (and so
/// PyTorch) and cuFile use. Retained once per process and GPU, never released; cheap to clone.
#[derive(Clone)]
pub struct Context {
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("ordinal", &self.ctx.ordinal())
            .finish()
    }
}

/// Restores the calling thread's previous current context on drop (see [`Context::scoped`]).
#[derive(Debug)]
pub struct ScopedContext {
    _restore: drv::Restore,
}

impl Context {
    /// The primary context of GPU `ordinal`. The calling thread's current context is left as
    /// it was. `Unavailable` without CUDA, `InvalidParam` for an ordinal that does not exist.
    pub fn primary(ordinal: usize) -> Result<Context> {
        Ok(Context {
            ctx: retain(ordinal)?,
        })
    }

    /// The GPU ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Makes the context current on the calling thread (and leaves it there).
    pub fn bind(&self) -> std::result::Result<(), CudaError> {
        bind_raw(&self.ctx)
    }

    /// Makes the context current until the guard drops, then restores the caller's context
    /// (for calls made on a user's thread).
    pub fn scoped(&self) -> std::result::Result<ScopedContext, CudaError> {
        Ok(ScopedContext {
            _restore: drv::Restore::bind(&self.ctx)?,
        })
    }

    /// Checks that `[addr, addr + len)` is device memory of this GPU inside one allocation;
    /// the reason when it is not.
    pub fn check_device_range(&self, addr: u64, len: u64) -> std::result::Result<(), String> {
        let _g = self.scoped().map_err(|e| e.to_string())?;
        let ordinal = match drv::pointer_kind(addr) {
            Ok((t, ord)) if t == drv::MEMORYTYPE_DEVICE => ord,
            Ok((t, _)) => {
                return Err(format!(
                    "{addr:#x} is not CUDA device memory (memory type {t})"
                ))
            }
            Err(e) => return Err(format!("{addr:#x} is not CUDA device memory ({e})")),
        };
        if let Some(o) = ordinal.filter(|&o| usize::try_from(o).ok() != Some(self.ordinal())) {
            return Err(format!(
                "{addr:#x} is memory of GPU {o}, not of GPU {} (the region's dev_id)",
                self.ordinal()
            ));
        }
        let (base, size) = drv::address_range(addr).map_err(|e| e.to_string())?;
        let end = addr.checked_add(len).ok_or("the region overflows")?;
        if end > base + size {
            return Err(format!(
                "{addr:#x}+{len} runs past the end of its allocation {base:#x}+{size}"
            ));
        }
        Ok(())
    }

    pub(crate) fn inner(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Stream {
    /// A non-blocking stream of `ctx` (made current on the calling thread).
    pub fn new(ctx: &Context) -> std::result::Result<Stream, CudaError> {
        Stream::create(ctx.ctx.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::result::check;

    #[test]
    fn errors_are_typed_and_named() {
        let e = check("cuMemAlloc", cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY).unwrap_err();
        assert_eq!(e.code, 2);
        assert!(e.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"));
        assert!(check("x", cu::CUresult::CUDA_SUCCESS).is_ok());
        assert!(check("x", cu::CUresult::CUDA_ERROR_NOT_READY)
            .unwrap_err()
            .is_not_ready());
        let err = to_error("a", Op::PostXfer, e.clone());
        assert_eq!(err.kind().as_str(), "backend");
        assert!(std::error::Error::source(&err).is_some());
        match e.into_error("a", "GDS", Op::RegisterMem) {
            nixl_core::Error::Backend { backend, .. } => assert_eq!(backend, "GDS"),
            other => panic!("{other:?}"),
        }
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
                assert_eq!(
                    Context::primary(0).unwrap_err().kind().as_str(),
                    "unavailable"
                );
                assert!(!drv::has_symbol("cuInit"));
            }
        }
    }
}
