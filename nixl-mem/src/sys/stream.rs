//! Owned CUDA streams and events: one handle per value, released on drop, context kept alive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;

use super::cu;
use super::result::{bind_raw, check, CudaError};

/// A non-blocking stream (`CU_STREAM_NON_BLOCKING`) of one context, destroyed on drop.
pub struct Stream {
    ctx: Arc<CudaContext>,
    raw: cu::CUstream,
}

// SAFETY: a CUstream may be used from any thread once its context is bound there; every
// method binds first or names the stream only in calls that carry it explicitly.
unsafe impl Send for Stream {}
// SAFETY: as above; the driver serialises concurrent use of one stream.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream in `ctx` (made current on the calling thread).
    pub(crate) fn create(ctx: Arc<CudaContext>) -> Result<Self, CudaError> {
        bind_raw(&ctx)?;
        let mut raw: cu::CUstream = std::ptr::null_mut();
        // SAFETY: the context is current; `raw` is a valid out pointer.
        check("cuStreamCreate", unsafe {
            cu::cuStreamCreate(&mut raw, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream { ctx, raw })
    }

    pub(crate) fn raw(&self) -> cu::CUstream {
        self.raw
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The ordinal of the stream's GPU.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Runs `f` on a driver thread once all work queued on the stream so far has completed
    /// (`cuLaunchHostFunc`). `f` must not call CUDA (the driver forbids it there); it is
    /// dropped unrun where the launch is refused.
    pub(crate) fn after_work(&self, f: Box<dyn FnOnce() + Send>) -> Result<(), CudaError> {
        unsafe extern "C" fn run(user: *mut std::ffi::c_void) {
            // SAFETY: `user` is the box leaked below, handed to exactly one call of this
            // function by the driver.
            let f = unsafe { Box::from_raw(user.cast::<Box<dyn FnOnce() + Send>>()) };
            // A panic must not unwind into the driver.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        }
        let user = Box::into_raw(Box::new(f)).cast::<std::ffi::c_void>();
        // SAFETY: the stream is live; `run` matches CUhostFn and takes ownership of `user`
        // when the driver calls it (once, after the stream's earlier work).
        let r = check("cuLaunchHostFunc", unsafe {
            cu::cuLaunchHostFunc(self.raw, Some(run), user)
        });
        if r.is_err() {
            // SAFETY: refused: the driver will never call `run`, so the box is still ours.
            drop(unsafe { Box::from_raw(user.cast::<Box<dyn FnOnce() + Send>>()) });
        }
        r
    }

    /// Waits for all work queued on the stream. The wait is bounded by that work; the driver
    /// reports a failed device as an error instead of blocking.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: the stream is live.
        check("cuStreamSynchronize", unsafe {
            cu::cuStreamSynchronize(self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Err(e) = bind_raw(&self.ctx) {
            tracing::warn!(error = %e, "binding the context to destroy a stream failed");
        }
        // SAFETY: the stream was created by `create` and is destroyed once; pending work
        // completes first (cuStreamDestroy does not wait but the driver keeps the resources
        // until it ends).
        if let Err(e) = check("cuStreamDestroy", unsafe {
            cu::cuStreamDestroy_v2(self.raw)
        }) {
            tracing::warn!(error = %e, "cuStreamDestroy failed");
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("ordinal", &self.ctx.ordinal())
            .finish()
    }
}

/// An event without timing, for completion queries.
pub(crate) struct Event {
    ctx: Arc<CudaContext>,
    raw: cu::CUevent,
}

// SAFETY: as for `Stream`.
unsafe impl Send for Event {}
// SAFETY: as for `Stream`.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event in `ctx` (made current on the calling thread).
    pub(crate) fn create(ctx: Arc<CudaContext>) -> Result<Self, CudaError> {
        bind_raw(&ctx)?;
        let mut raw: cu::CUevent = std::ptr::null_mut();
        // SAFETY: the context is current; `raw` is a valid out pointer.
        check("cuEventCreate", unsafe {
            cu::cuEventCreate(&mut raw, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        Ok(Event { ctx, raw })
    }

    /// The `CUevent` as an integer (for an application's own CUDA calls), valid while this
    /// value lives.
    pub(crate) fn raw_handle(&self) -> u64 {
        self.raw as u64
    }

    /// Captures the work queued on `stream` so far.
    /// Makes the work queued on `stream` after this call wait (on the GPU) for the work this
    /// event's latest record captured (`cuStreamWaitEvent`). Both must be of contexts the
    /// driver can order (any context of this process).
    pub(crate) fn gate(&self, stream: &cudarc::driver::CudaStream) -> Result<(), CudaError> {
        bind_raw(stream.context())?;
        // SAFETY: `stream` is a live stream (the borrow keeps it) and the event is live.
        check("cuStreamWaitEvent", unsafe {
            cu::cuStreamWaitEvent(stream.cu_stream(), self.raw, 0)
        })
    }

    pub(crate) fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        // SAFETY: both handles are live and belong to the same context.
        check("cuEventRecord", unsafe {
            cu::cuEventRecord(self.raw, stream.raw())
        })
    }

    /// `Ok(true)` when all work captured by the last `record` is complete.
    pub(crate) fn query(&self) -> Result<bool, CudaError> {
        // SAFETY: the event is live.
        match check("cuEventQuery", unsafe { cu::cuEventQuery(self.raw) }) {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_ready() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Polls until complete or the deadline passes (`Ok(false)`).
    pub(crate) fn wait(&self, timeout: Duration) -> Result<bool, CudaError> {
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
        if let Err(e) = bind_raw(&self.ctx) {
            tracing::warn!(error = %e, "binding the context to destroy an event failed");
        }
        // SAFETY: created by `create`, destroyed once.
        if let Err(e) = check("cuEventDestroy", unsafe { cu::cuEventDestroy_v2(self.raw) }) {
            tracing::warn!(error = %e, "cuEventDestroy failed");
        }
    }
}
