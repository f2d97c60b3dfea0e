//! VRAM <-> FILE without GPUDirect Storage: pinned staging ("bounce") buffers and the pool's
//! `pread`/`pwrite`.
//!
//! A VRAM registration loads the CUDA driver (lazily: the first VRAM registration of the
//! process), checks that the address range is device memory of the region's GPU and retains
//! that GPU's primary context. The first VRAM transfer of an engine allocates
//! [`PoolEngine::buffers`] page-aligned pinned buffers of `bounce_chunk` bytes, each with
//! its own non-blocking stream per GPU. A pool worker running a VRAM chunk takes one buffer,
//! makes the chunk's context current, and does WRITE = `cuMemcpyDtoHAsync` + stream sync +
//! `pwrite`, READ = `pread` + `cuMemcpyHtoDAsync` + sync; several workers pipeline (one
//! copies while another is in the kernel). The same engine serves GDS's fallback.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nixl_core::backend::BackendMd;
use nixl_core::{Error, Op, RegionDesc, Result, XferOp};
use nixl_mem::{Context, CudaError, CudaHostBuffer, HostMemory, Stream};

use super::pool::{file_io, ChunkError, Pool};
use super::{Chunk, PosixParams};
use crate::sys::gpu;

/// Set once this crate used CUDA (a VRAM registration of any POSIX or GDS backend, or the GDS
/// driver's open): from then on POSIX path reports name the VRAM path.
static CUDA_USED: AtomicBool = AtomicBool::new(false);

/// Whether this crate used CUDA in this process (see [`note_cuda_used`]).
pub(crate) fn cuda_used() -> bool {
    CUDA_USED.load(Ordering::Relaxed)
}

/// Notes that CUDA was loaded and has a device (for path reports).
pub(crate) fn note_cuda_used() {
    CUDA_USED.store(true, Ordering::Relaxed);
}

/// Backend metadata of a registered VRAM region: the primary context of its GPU.
pub(crate) struct VramMd {
    pub ctx: Context,
}

/// Registers VRAM for bounce transfers: loads CUDA (`Unavailable` without a driver or device),
/// checks the range and retains the GPU's primary context.
pub(crate) fn register_vram(agent: &str, backend: &str, region: &RegionDesc) -> Result<BackendMd> {
    let ctx = vram_context(agent, backend, region)?;
    Ok(Arc::new(VramMd { ctx }))
}

/// The primary context of a VRAM region's GPU (nixl-mem's), after checking the region lies in
/// one device allocation of that GPU.
pub(crate) fn vram_context(agent: &str, backend: &str, region: &RegionDesc) -> Result<Context> {
    let count = nixl_mem::cuda_device_count().map_err(|e| e.at_backend(agent, backend))?;
    let ordinal = usize::try_from(region.dev_id)
        .ok()
        .filter(|o| *o < count)
        .ok_or_else(|| {
            Error::invalid(
                agent,
                Op::RegisterMem,
                format!(
                    "VRAM dev_id {} is not a CUDA device ordinal (0..{count})",
                    region.dev_id
                ),
            )
        })?;
    let ctx = Context::primary(ordinal).map_err(|e| e.at_backend(agent, backend))?;
    ctx.check_device_range(region.addr, region.len)
        .map_err(|why| Error::invalid(agent, Op::RegisterMem, format!("VRAM region: {why}")))?;
    note_cuda_used();
    Ok(ctx)
}

/// One staging buffer and the streams it copies on (one per GPU it has served).
struct Slot {
    /// Owns the pinned memory `base` points into.
    _buf: CudaHostBuffer,
    /// `buf`'s address rounded up to the O_DIRECT alignment.
    base: u64,
    streams: Vec<Stream>,
}

impl Slot {
    fn stream_for(&mut self, ctx: &Context) -> std::result::Result<&Stream, CudaError> {
        let i = match self
            .streams
            .iter()
            .position(|s| s.ordinal() == ctx.ordinal())
        {
            Some(i) => i,
            None => {
                self.streams.push(Stream::new(ctx)?);
                self.streams.len() - 1
            }
        };
        Ok(&self.streams[i])
    }
}

/// The pinned staging buffers of an engine.
pub(crate) struct Staging {
    free: Mutex<Vec<Slot>>,
    returned: Condvar,
    chunk: u64,
}

impl Staging {
    fn new(
        ctx: &Context,
        count: usize,
        chunk: u64,
        align: u64,
    ) -> std::result::Result<Self, String> {
        let extra = if align > 4096 { align } else { 0 };
        let len = usize::try_from(chunk + extra).map_err(|_| "bounce_chunk too large")?;
        let mut free = Vec::with_capacity(count);
        for _ in 0..count {
            let buf = CudaHostBuffer::new_in(ctx, len).map_err(|e| e.to_string())?;
            let base = buf.addr().next_multiple_of(align);
            if base + chunk > buf.addr() + buf.len() as u64 {
                return Err(format!(
                    "cuMemHostAlloc returned {:#x}, not aligned to {align}",
                    buf.addr()
                ));
            }
            free.push(Slot {
                _buf: buf,
                base,
                streams: Vec::new(),
            });
        }
        Ok(Staging {
            free: Mutex::new(free),
            returned: Condvar::new(),
            chunk,
        })
    }

    /// Takes a free buffer, waiting while all are in use (each is held for one chunk's
    /// bounded I/O); `Canceled` once the request is canceled.
    fn take(&self, canceled: &AtomicBool) -> std::result::Result<SlotGuard<'_>, ChunkError> {
        let mut free = self.free.lock();
        loop {
            if canceled.load(Ordering::Acquire) {
                return Err(ChunkError::Canceled);
            }
            if let Some(slot) = free.pop() {
                return Ok(SlotGuard {
                    staging: self,
                    slot: Some(slot),
                });
            }
            self.returned.wait_for(&mut free, Duration::from_millis(50));
        }
    }
}

/// A staging buffer held by one worker; returned on drop.
struct SlotGuard<'a> {
    staging: &'a Staging,
    slot: Option<Slot>,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            self.staging.free.lock().push(s);
            self.staging.returned.notify_one();
        }
    }
}

/// What the workers need for the VRAM chunks of a request: the staging buffers and the
/// contexts the chunks' [`Chunk::gpu`] indexes name.
pub(crate) struct VramSide {
    pub staging: Arc<Staging>,
    pub ctxs: Vec<Context>,
}

/// Runs one VRAM chunk through a staging buffer on the calling pool worker.
pub(crate) fn run_vram_chunk(
    op: XferOp,
    c: Chunk,
    v: &VramSide,
    gpu: u32,
    canceled: &AtomicBool,
) -> std::result::Result<(), ChunkError> {
    let einval = || ChunkError::Os(std::io::Error::from_raw_os_error(libc::EINVAL));
    let ctx = v.ctxs.get(gpu as usize).ok_or_else(einval)?;
    if c.len > v.staging.chunk {
        return Err(einval());
    }
    let len = usize::try_from(c.len).map_err(|_| einval())?;
    let mut guard = v.staging.take(canceled)?;
    let slot = guard.slot.as_mut().ok_or_else(einval)?;
    let host = slot.base;
    ctx.bind().map_err(ChunkError::Cuda)?;
    let stream = slot.stream_for(ctx).map_err(ChunkError::Cuda)?;
    // Crate invariant: `c.buf..+len` lies in a VRAM registration of this GPU that the request
    // keeps alive until the chunk finishes (cancel waits for running chunks); the staging
    // buffer is this worker's alone (the slot it holds) and at least `len` bytes; the plan
    // keeps `fd` open.
    match op {
        XferOp::Write => {
            gpu::copy_to_host(stream, host, c.buf, len).map_err(ChunkError::Cuda)?;
            file_io(op, c.fd, host, c.off, c.len)
        }
        XferOp::Read => {
            file_io(op, c.fd, host, c.off, c.len)?;
            gpu::copy_from_host(stream, c.buf, host, len).map_err(ChunkError::Cuda)
        }
    }
}

fn size(b: u64) -> String {
    if b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b.is_multiple_of(1024) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// The thread pool and the staging buffers, created lazily; one per POSIX backend and one
/// per GDS backend (its fallback).
pub(crate) struct PoolEngine {
    params: PosixParams,
    pool: OnceLock<Arc<Pool>>,
    staging: Mutex<Option<Arc<Staging>>>,
}

impl PoolEngine {
    /// An engine with validated params; allocates nothing yet.
    pub(crate) fn new(params: PosixParams) -> Self {
        PoolEngine {
            params,
            pool: OnceLock::new(),
            staging: Mutex::new(None),
        }
    }

    /// Its parameters.
    pub(crate) fn params(&self) -> &PosixParams {
        &self.params
    }

    /// The number of staging buffers.
    pub(crate) fn buffers(&self) -> usize {
        self.params
            .bounce_buffers
            .unwrap_or(self.params.pool_threads)
    }

    /// The thread pool, started on first use.
    pub(crate) fn pool(&self, agent: &str) -> Result<Arc<Pool>> {
        if let Some(p) = self.pool.get() {
            return Ok(p.clone());
        }
        let p = Arc::new(
            Pool::new(self.params.pool_threads).map_err(|e| Error::io(agent, Op::MakeXfer, e))?,
        );
        Ok(self.pool.get_or_init(|| p).clone())
    }

    /// The staging buffers, allocated on first use (with `ctx` current).
    pub(crate) fn staging(&self, agent: &str, ctx: &Context) -> Result<Arc<Staging>> {
        let mut g = self.staging.lock();
        if let Some(s) = &*g {
            return Ok(s.clone());
        }
        let s = Arc::new(
            Staging::new(
                ctx,
                self.buffers(),
                self.params.bounce_chunk,
                self.params.direct_alignment,
            )
            .map_err(|why| Error::Unavailable {
                what: format!(
                    "{} pinned staging buffers of {}",
                    self.buffers(),
                    size(self.params.bounce_chunk)
                ),
                hint: format!("{why} (agent {agent}; lower bounce_buffers or bounce_chunk)"),
            })?,
        );
        *g = Some(s.clone());
        Ok(s)
    }

    /// The path of VRAM requests: "pinned bounce buffers 4 x 8 MiB + pread/pwrite x4,
    /// cuMemcpyAsync".
    pub(crate) fn vram_label(&self) -> String {
        format!(
            "pinned bounce buffers {} x {} + pread/pwrite x{}, cuMemcpyAsync",
            self.buffers(),
            size(self.params.bounce_chunk),
            self.params.pool_threads
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vram_path_names_buffers_chunk_and_threads() {
        let e = PoolEngine::new(PosixParams::default());
        assert_eq!(
            e.vram_label(),
            "pinned bounce buffers 4 x 8 MiB + pread/pwrite x4, cuMemcpyAsync"
        );
        let e = PoolEngine::new(PosixParams {
            bounce_chunk: 512 << 10,
            bounce_buffers: Some(2),
            pool_threads: 8,
            ..PosixParams::default()
        });
        assert_eq!(
            e.vram_label(),
            "pinned bounce buffers 2 x 512 KiB + pread/pwrite x8, cuMemcpyAsync"
        );
        // Nothing is allocated or loaded by an engine that has not moved VRAM.
        assert!(e.staging.lock().is_none());
    }
}
