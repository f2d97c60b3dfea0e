//! The sys layer's result: the one conversion of a driver status (`CUresult`, or cudarc's
//! `DriverError`) into this crate's typed [`CudaError`]. Nothing here knows the layers above;
//! they convert a `CudaError` once, naming their agent and operation.

use cudarc::driver::CudaContext;

use super::cu;

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
        self.code == cu::CUresult::CUDA_ERROR_NOT_READY as u32
    }
}

/// Converts a driver status into a typed result. The one conversion point.
pub(crate) fn check(call: &'static str, r: cu::CUresult) -> std::result::Result<(), CudaError> {
    if r == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(CudaError {
        call,
        code: r as u32,
        name: format!("{r:?}"),
    })
}

/// The same conversion for errors of cudarc's safe layer (`CudaContext`).
pub(crate) fn from_driver(call: &'static str, e: cudarc::driver::DriverError) -> CudaError {
    CudaError {
        call,
        code: e.0 as u32,
        name: format!("{:?}", e.0),
    }
}

/// [`bind`] with the driver's error.
pub(crate) fn bind_raw(ctx: &CudaContext) -> std::result::Result<(), CudaError> {
    ctx.bind_to_thread()
        .map_err(|e| from_driver("cuCtxSetCurrent", e))
}
