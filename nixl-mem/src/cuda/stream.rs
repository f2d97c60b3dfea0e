//! Owned CUDA streams and events: one handle per value, released on drop, context kept alive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;
use nixl_core::{Op, Result};

use super::{bind, check, sys, CudaError};

/// A non-blocking stream of a context.
pub(crate) struct Stream {
    ctx: Arc<CudaContext>,
    raw: sys::CUstream,
}

// SAFETY: a CUstream may be used from any thread once its context is bound there; every method
// binds first.
unsafe impl Send for Stream {}
// SAFETY: as above; the driver serialises concurrent use of one stream.
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new(ctx: Arc<CudaContext>) -> Result<Self> {
        bind(&ctx)?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the context is current; `raw` is a valid out pointer.
        let r = unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        };
        super::cu(Op::MakeXfer, "cuStreamCreate", r)?;
        Ok(Stream { ctx, raw })
    }

    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Err(e) = bind(&self.ctx) {
            tracing::warn!(error = %e, "binding the context to destroy a stream failed");
        }
        // SAFETY: the stream was created by `new` and is destroyed once; pending work
        // completes first (cuStreamDestroy does not wait but the driver keeps the resources
        // until it ends).
        if let Err(e) = check("cuStreamDestroy", unsafe {
            sys::cuStreamDestroy_v2(self.raw)
        }) {
            tracing::warn!(error = %e, "cuStreamDestroy failed");
        }
    }
}

/// An event without timing, for completion queries.
pub(crate) struct Event {
    ctx: Arc<CudaContext>,
    raw: sys::CUevent,
}

// SAFETY: as for `Stream`.
unsafe impl Send for Event {}
// SAFETY: as for `Stream`.
unsafe impl Sync for Event {}

impl Event {
    pub fn new(ctx: Arc<CudaContext>) -> Result<Self> {
        bind(&ctx)?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: the context is current; `raw` is a valid out pointer.
        let r = unsafe {
            sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        };
        super::cu(Op::MakeXfer, "cuEventCreate", r)?;
        Ok(Event { ctx, raw })
    }

    pub fn record(&self, stream: &Stream) -> std::result::Result<(), CudaError> {
        // SAFETY: both handles are live and belong to the same context.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw, stream.raw())
        })
    }

    /// `Ok(true)` when all work captured by the last `record` is complete.
    pub fn query(&self) -> std::result::Result<bool, CudaError> {
        // SAFETY: the event is live.
        match check("cuEventQuery", unsafe { sys::cuEventQuery(self.raw) }) {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_ready() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Polls until complete or the deadline passes (`Ok(false)`).
    pub fn wait(&self, timeout: Duration) -> std::result::Result<bool, CudaError> {
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            if self.query()? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            spins += 1;
            if spins > 64 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::thread::yield_now();
            }
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Err(e) = bind(&self.ctx) {
            tracing::warn!(error = %e, "binding the context to destroy an event failed");
        }
        // SAFETY: created by `new`, destroyed once.
        if let Err(e) = check("cuEventDestroy", unsafe {
            sys::cuEventDestroy_v2(self.raw)
        }) {
            tracing::warn!(error = %e, "cuEventDestroy failed");
        }
    }
}
