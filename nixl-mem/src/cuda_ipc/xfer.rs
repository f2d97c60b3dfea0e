//! A prepared `CUDA_IPC` transfer: copies enqueued on its own stream by one of three engines,
//! an event recorded after them, and the notification handed to the backend's completer, which
//! sends it once the event has completed (whether or not anyone polls).

use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::BackendXfer;
use nixl_core::{Error, Op, Result, XferState};

use super::complete::{self, Notif, Outcome, Ticket};
use super::staging::{Lane, LanePool, Staging, StagingPool};
use super::table::BlockTable;
use crate::cuda::kernel::{
    self, BlockLayout, CopyKernel, KernelSchedule, Segment, TableKernel, TileTable,
};
use crate::cuda::{self, bind_raw, CudaError, Event};
use crate::sys::memory::{memcpy_async, memcpy_batch_async};

/// The longest note (why an engine was not used) kept in the path.
const MAX_NOTE: usize = 240;

/// A request's copies: a list, or a block table whose list is built only where the copy
/// engines need it.
pub(crate) enum Work {
    /// `(dst, src, len)` in this process's address space.
    Copies(Vec<(u64, u64, u64)>),
    /// A block table (the copy kernel's descriptors are written straight from it).
    Table(BlockTable),
    /// Tiles with their rows rearranged: only the tile kernel copies them (no list of copies
    /// exists: the copy engines never take them).
    Tiles {
        /// Layers x tiles.
        items: usize,
    },
}

impl Work {
    /// The number of contiguous copies.
    pub(super) fn len(&self) -> usize {
        match self {
            Work::Copies(c) => c.len(),
            Work::Table(t) => t.copy_count(),
            Work::Tiles { items } => *items,
        }
    }

    /// The copies as a list (built from a table on first use, then kept).
    pub(super) fn copies(&mut self) -> &[(u64, u64, u64)] {
        if let Work::Table(t) = self {
            *self = Work::Copies(t.copies());
        }
        match self {
            Work::Copies(c) => c,
            Work::Table(_) | Work::Tiles { .. } => &[],
        }
    }
}

/// The copy kernel's work for one request, prepared once: descriptors written into a pinned
/// staging buffer and uploaded to the device on the request's stream, so every launch is
/// stream-ordered after the upload.
pub(crate) struct KernelPlan {
    kernel: Arc<CopyKernel>,
    /// The staging pair (host source, device array of `count` descriptors); `None` only
    /// while being dropped.
    staging: Option<Staging>,
    pool: Arc<StagingPool>,
    /// The request's stream (the upload was enqueued on it) and its event: the pair goes back
    /// to the pool only once the event, recorded after the upload, has completed.
    lane: Arc<Lane>,
    /// No record of the event covers the upload yet: the first post's record does (a driver
    /// call less per request); a plan dropped before any post records it then.
    unrecorded: bool,
    count: u64,
    grid: u32,
    /// The block table's layout where the array is one for the block kernel (else
    /// descriptors).
    blocks: Option<BlockLayout>,
    /// Whether the array is a tile table (then `blocks` is its layout) for the tile kernel.
    tiles: bool,
    /// The per-layer arrival counters the launch advances (the arrival kernels).
    arrival: Option<u64>,
}

impl KernelPlan {
    /// Writes the descriptors of `work` (no two copies in [`kernel::conflict`]) into a staging
    /// pair from `pool` and enqueues their upload on the request's `lane`.
    pub(super) fn new(
        kernel: Arc<CopyKernel>,
        pool: &Arc<StagingPool>,
        work: &mut Work,
        lane: &Arc<Lane>,
    ) -> std::result::Result<Self, String> {
        let shape = kernel.shape();
        // A block table whose layers' blocks have one length goes to the block kernel as it
        // is (nothing per layer and block is written here).
        if let Work::Table(t) = work {
            if let Some(layout) = t.block_layout(shape.chunk).filter(|_| kernel.has_blocks()) {
                let mut st = pool.take(layout.bytes).map_err(|e| e.to_string())?;
                if t.write_block_table(shape.chunk, st.host.bytes_mut()) != Some(layout) {
                    pool.give(st);
                    return Err("a block table did not fit its buffer".to_owned());
                }
                let grid = kernel.grid(layout.items);
                let (bytes, items) = (layout.bytes, layout.items);
                let blocks = Some(layout);
                return Self::upload(kernel, pool, st, bytes, items, grid, blocks, lane);
            }
        }
        // Otherwise a table is written as descriptors straight into the staging bytes where
        // the schedule cuts copies one by one; the balanced schedule needs the whole list.
        let direct = match work {
            Work::Table(t) if shape.schedule != KernelSchedule::Balanced => Some(t),
            _ => None,
        };
        let (staging, count, grid) = match direct {
            None if shape.schedule != KernelSchedule::Balanced => {
                // Copies cut one by one: written straight into the staging bytes too.
                let copies = work.copies();
                let n = kernel::packed_count(copies, shape.chunk);
                let mut st = pool
                    .take(n.saturating_mul(kernel::DESC_BYTES).max(1))
                    .map_err(|e| e.to_string())?;
                let written = kernel::write_packed(copies, shape.chunk, st.host.bytes_mut());
                (st, written, kernel.grid(written as u64))
            }
            Some(t) => {
                let n = t.descriptor_count(shape.chunk);
                let mut st = pool
                    .take((n * kernel::DESC_BYTES).max(1))
                    .map_err(|e| e.to_string())?;
                let written = t.write_descriptors(shape.chunk, st.host.bytes_mut());
                (st, written, kernel.grid(written as u64))
            }
            None => {
                let segs: Vec<Segment> = work
                    .copies()
                    .iter()
                    .map(|&(dst, src, len)| Segment { src, dst, len })
                    .collect();
                let (descs, grid) = kernel.plan(&segs);
                let mut st = pool
                    .take((descs.len() * kernel::DESC_BYTES).max(1))
                    .map_err(|e| e.to_string())?;
                let written = kernel::write_descriptors(&descs, st.host.bytes_mut());
                (st, written, grid)
            }
        };
        let bytes = count * kernel::DESC_BYTES;
        Self::upload(kernel, pool, staging, bytes, count as u64, grid, None, lane)
    }

    /// Writes a tile table (checked by [`TileTable::problem`]) into a staging pair from
    /// `pool` and enqueues its upload on the request's `lane`, for the tile kernel.
    pub(super) fn tiles(
        kernel: Arc<CopyKernel>,
        pool: &Arc<StagingPool>,
        table: &TileTable,
        lane: &Arc<Lane>,
    ) -> std::result::Result<Self, String> {
        if !kernel.has_tiles() {
            return Err("the tile copy kernel is not loaded".to_owned());
        }
        let bytes = table.bytes();
        let mut st = pool.take(bytes).map_err(|e| e.to_string())?;
        if !table.write(st.host.bytes_mut()) {
            pool.give(st);
            return Err("a tile table did not fit its buffer".to_owned());
        }
        let layout = BlockLayout {
            bytes,
            items: table.items(),
            npieces: table.tiles.len() as u64,
            pieces_at: table.tiles_at(),
        };
        let grid = kernel.tile_grid(layout.items);
        let mut plan = Self::upload(
            kernel,
            pool,
            st,
            bytes,
            layout.items,
            grid,
            Some(layout),
            lane,
        )?;
        plan.tiles = true;
        Ok(plan)
    }

    /// Enqueues the upload of the first `bytes` of `staging` and makes the plan.
    #[allow(clippy::too_many_arguments)]
    fn upload(
        kernel: Arc<CopyKernel>,
        pool: &Arc<StagingPool>,
        staging: Staging,
        bytes: usize,
        count: u64,
        grid: u32,
        blocks: Option<BlockLayout>,
        lane: &Arc<Lane>,
    ) -> std::result::Result<Self, String> {
        // Crate invariant: the staging pair is this plan's until the request's event, recorded
        // after this upload (by the first post, or by the plan's drop before any post) and
        // after every launch, has completed.
        if let Err(e) = staging.host.upload_async(bytes, &staging.dev, &lane.stream) {
            // Nothing was enqueued: the pair is free again.
            pool.give(staging);
            return Err(e.to_string());
        }
        Ok(KernelPlan {
            kernel,
            staging: Some(staging),
            pool: pool.clone(),
            lane: lane.clone(),
            unrecorded: true,
            count,
            grid,
            blocks,
            tiles: false,
            arrival: None,
        })
    }

    /// Makes the launches advance the per-layer counters at `counters` (a table plan whose
    /// arrival kernel loaded); the error says why it cannot.
    pub(super) fn with_arrival(mut self, counters: u64) -> std::result::Result<Self, String> {
        let (segments, blocks, tiles) = self.kernel.has_arrival();
        let why = match (&self.blocks, self.tiles) {
            (None, _) if !segments => Some("the segment kernel with a counter did not load"),
            (None, _) => None,
            (Some(_), false) if !blocks => Some("the block kernel with counters did not load"),
            (Some(_), true) if !tiles => Some("the tile kernel with counters did not load"),
            _ => None,
        };
        if let Some(w) = why {
            // Dropping the plan gives its buffers back (once the GPU is done with them).
            return Err(w.to_owned());
        }
        self.arrival = Some(counters);
        Ok(self)
    }

    /// What each post adds to every layer's counter: the table's items per layer (the
    /// descriptors, for a request of segments).
    pub(super) fn arrival_per_post(&self) -> Option<u64> {
        self.arrival
            .map(|_| self.blocks.map_or(self.count, |b| b.npieces))
    }

    /// A record of the request's event after the upload has been enqueued (a post's): the
    /// event covers the upload from now on.
    pub(super) fn recorded(&mut self) {
        self.unrecorded = false;
    }

    fn descs(&self) -> u64 {
        self.staging.as_ref().map_or(0, |s| s.dev.ptr())
    }
}

impl Drop for KernelPlan {
    fn drop(&mut self) {
        let Some(s) = self.staging.take() else {
            return;
        };
        // A plan never posted: its upload may still run, and no record covers it yet.
        if self.unrecorded {
            let lane = &self.lane;
            if let Err(e) =
                bind_raw(lane.stream.context()).and_then(|()| lane.event.record(&lane.stream))
            {
                tracing::error!(error = %e, "could not record the copy kernel's upload; leaking its buffers");
                std::mem::forget(s);
                return;
            }
        }
        // Back to the pool, to be reused once the GPU is done with it (the event covers the
        // upload and every launch). The request leaks a plan whose launch may still run.
        self.pool.give_when_done(s, self.lane.event.clone());
    }
}

/// A CUDA_IPC request's event (recorded after each post's work), as handed out by
/// [`BackendXfer::device_event`].
pub(crate) struct RequestEvent(pub Arc<Event>);

/// How a request's copies are enqueued.
pub(crate) enum Engine {
    /// One `cuMemcpyAsync` per segment (copy engines), in order: the only engine for copies
    /// that depend on each other.
    Copies,
    /// One `cuMemcpyBatchAsync` for all segments (copy engines; CUDA 12.8+, falls back to
    /// `Copies` when refused).
    Batch,
    /// The scatter-gather copy kernel (SMs), one launch.
    Kernel(KernelPlan),
}

pub(crate) struct CudaIpcXfer {
    pub agent: String,
    /// The copies (`(dst, src, len)` in this process's address space).
    pub work: Work,
    /// The request's stream and the event recorded after its work (the event is shared with
    /// the ticket of the latest post, which the completer queries); from the backend's pool
    /// and given back to it on drop.
    pub lane: Arc<Lane>,
    pub lanes: Arc<LanePool>,
    pub engine: Engine,
    pub notif: Option<Arc<Notif>>,
    /// The target agent and where its notifications go (for per-post messages).
    pub remote: String,
    pub route: super::complete::NotifRoute,
    /// The latest post's notification ticket.
    pub ticket: Option<Arc<Ticket>>,
    pub completer: Arc<complete::Shared>,
    /// Woken (from a host function after the post's work) for the agent's futures.
    pub wake: nixl_core::backend::Wake,
    /// The latest post has no host function to wake the agent yet: queued by the first
    /// [`BackendXfer::arm_wake`] (an `async` caller), not by the post, which a blocking caller
    /// would pay for with a driver call it does not need.
    pub wake_unarmed: bool,
    pub cancel_timeout: Duration,
    pub device: usize,
    /// "cuda_ipc WRITE VRAM->VRAM via CUDA IPC mapping".
    pub path_head: String,
    /// Why the engine is not the one the request was eligible for, if so.
    pub note: Option<String>,
}

/// Shortens a note for the path (JIT logs can be long).
pub(crate) fn short_note(s: String) -> String {
    if s.len() <= MAX_NOTE {
        return s;
    }
    let mut end = MAX_NOTE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

impl CudaIpcXfer {
    fn fail(&self, op: Op, e: CudaError) -> Error {
        cuda::to_error(&self.agent, op, e)
    }

    fn enqueue(&mut self) -> std::result::Result<(), CudaError> {
        if let Engine::Kernel(p) = &self.engine {
            // Crate invariant (the launch's): the descriptors were uploaded on this stream at
            // prepare time; prepare admitted the kernel only for segments whose both ends are
            // device memory of this context's GPU (local registrations, same-GPU IPC
            // mappings), kept alive by the request's registrations and loaded regions; prepare
            // admitted it only for copies of which no two conflict (`kernel::conflict`: no
            // destination overlaps another copy's destination or source, or its own source).
            let stream = &self.lane.stream;
            if p.tiles {
                // Tiles have no other engine: a failed launch fails the post.
                let Some(b) = &p.blocks else {
                    return Err(CudaError {
                        call: "cuLaunchKernel",
                        code: 0,
                        name: "a tile plan without its table".to_owned(),
                    });
                };
                return p.kernel.launch_over_table(
                    TableKernel::Tiles,
                    p.descs(),
                    b,
                    p.grid,
                    stream,
                    p.arrival,
                );
            }
            let launched = match &p.blocks {
                Some(b) => p.kernel.launch_over_table(
                    TableKernel::Blocks,
                    p.descs(),
                    b,
                    p.grid,
                    stream,
                    p.arrival,
                ),
                None => p
                    .kernel
                    .launch(p.descs(), p.count, p.grid, stream, p.arrival),
            };
            if p.arrival.is_some() {
                // Counters have no other engine either.
                return launched;
            }
            match launched {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!(agent = %self.agent, error = %e, "the copy kernel did not launch; using cuMemcpyBatchAsync for this request");
                    self.note = Some(short_note(format!("copy kernel launch failed: {e}")));
                    self.engine = Engine::Batch;
                }
            }
        }
        if matches!(self.engine, Engine::Batch) {
            match self.enqueue_batch() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!(error = %e, "cuMemcpyBatchAsync refused; copying one by one");
                    self.engine = Engine::Copies;
                }
            }
        }
        for &(dst, src, len) in self.work.copies() {
            // Crate invariant: both ranges lie in memory the request keeps alive (local
            // registration, loaded peer region), resolved to this process's addresses.
            memcpy_async(dst, src, len as usize, &self.lane.stream)?;
        }
        Ok(())
    }

    /// One driver call for every segment (CUDA 12.8+), so a request of many blocks is not
    /// bound by the per-call launch cost.
    fn enqueue_batch(&mut self) -> std::result::Result<(), CudaError> {
        // Crate invariant: every range is valid as in `enqueue`.
        memcpy_batch_async(self.work.copies(), &self.lane.stream)
    }

    /// What the engine is, for the path.
    fn engine_name(&self) -> String {
        let n = self.work.len();
        match &self.engine {
            Engine::Copies => format!("cuMemcpyAsync x{n}"),
            Engine::Batch => format!("cuMemcpyBatchAsync x{n}"),
            Engine::Kernel(p) if p.tiles => format!(
                "tile copy kernel x{n} tiles ({} CTAs), rows rearranged",
                p.grid
            ),
            Engine::Kernel(p) if p.blocks.is_some() => format!(
                "block-table copy kernel x{n} segments ({} chunks, {} CTAs)",
                p.count, p.grid
            ),
            Engine::Kernel(p) => format!(
                "copy kernel x{n} segments ({} chunks, {} CTAs)",
                p.count, p.grid
            ),
        }
    }
}

impl BackendXfer for CudaIpcXfer {
    fn post(&mut self) -> Result<XferState> {
        cuda::bind(self.lane.stream.context()).map_err(|e| e.at(&self.agent))?;
        // A ticket of an earlier post that never completed (its request failed) must not be
        // sent when this post's data lands: the event is about to be recorded again.
        if let Some(t) = self.ticket.take() {
            t.cancel();
        }
        if let Err(e) = self.enqueue() {
            // Some copies may already be queued: let them drain (bounded) before reporting,
            // since a failed request's memory may be released right after.
            let drained = self
                .lane
                .event
                .record(&self.lane.stream)
                .ok()
                .and_then(|()| self.lane.event.wait(self.cancel_timeout).ok());
            if drained != Some(true) {
                tracing::error!(agent = %self.agent, "a partly enqueued CUDA_IPC transfer did not drain");
            }
            return Err(self.fail(Op::PostXfer, e));
        }
        self.lane
            .event
            .record(&self.lane.stream)
            .map_err(|e| self.fail(Op::PostXfer, e))?;
        if let Engine::Kernel(p) = &mut self.engine {
            p.recorded();
        }
        if let Some(n) = &self.notif {
            let t = Arc::new(Ticket::new(self.lane.event.clone(), n.clone()));
            self.completer.submit(t.clone());
            // A request with a notification is done once it is sent: the completer wakes
            // the agent then.
            t.wake_when_sent(self.wake.clone());
            self.ticket = Some(t);
        }
        // The wake-up for async callers is queued when one awaits (`arm_wake`).
        self.wake_unarmed = true;
        Ok(XferState::InProgress)
    }

    fn arm_wake(&mut self) {
        if !std::mem::take(&mut self.wake_unarmed) {
            return;
        }
        // Queued after the post's work (the stream runs in order; the request is not posted
        // again before it completes), even where that work has completed already.
        let wake = self.wake.clone();
        let queued = bind_raw(self.lane.stream.context())
            .and_then(|()| self.lane.stream.after_work(Box::new(move || wake.wake())));
        if let Err(e) = queued {
            // The post stands; an async caller is then woken by its deadline, or earlier by
            // any other completion of this agent (a backend that wakes gets no recheck timer).
            tracing::warn!(agent = %self.agent, error = %e, "could not queue the completion wake-up; an async caller of this request waits for another wake or its deadline");
        }
    }

    fn check(&mut self) -> Result<XferState> {
        cuda::bind(self.lane.stream.context()).map_err(|e| e.at(&self.agent))?;
        if !self
            .lane
            .event
            .query()
            .map_err(|e| self.fail(Op::CheckXfer, e))?
        {
            return Ok(XferState::InProgress);
        }
        let Some(t) = &self.ticket else {
            return Ok(XferState::Done);
        };
        if matches!(t.outcome(), Outcome::Pending) {
            // The data is complete: send now rather than wait for the completer's next round
            // (the queue lock makes it exactly once, in order).
            self.completer.pump_key(&t.route_key());
        }
        match t.outcome() {
            Outcome::Sent => Ok(XferState::Done),
            // An earlier notification to the same peer is still waiting for its data.
            Outcome::Pending => Ok(XferState::InProgress),
            Outcome::Failed(f) => Err(t.error(f)),
            Outcome::Canceled => Err(Error::Canceled {
                agent: self.agent.clone(),
                op: Op::CheckXfer,
            }),
        }
    }

    fn cancel(&mut self) -> Result<()> {
        // No notification for a canceled request: the ticket is marked before waiting (if the
        // completer was sending it, this waits for that send, and the data was complete).
        if let Some(t) = &self.ticket {
            t.cancel();
        }
        // Copies already handed to the GPU cannot be recalled: cancel waits for them
        // (bounded), so the memory is never freed under the hardware.
        cuda::bind(self.lane.stream.context()).map_err(|e| e.at(&self.agent))?;
        match self.lane.event.wait(self.cancel_timeout) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::TimedOut {
                agent: self.agent.clone(),
                op: Op::Cancel,
                elapsed: self.cancel_timeout,
            }),
            Err(e) => Err(self.fail(Op::Cancel, e)),
        }
    }

    fn path(&self) -> Option<String> {
        let note = match &self.note {
            Some(n) => format!(" ({n})"),
            None => String::new(),
        };
        Some(format!(
            "{}, {} on GPU {}{note}",
            self.path_head,
            self.engine_name(),
            self.device
        ))
    }
    fn device_event(&self) -> Option<nixl_core::backend::DeviceEvent> {
        let ev = &self.lane.event;
        Some(nixl_core::backend::DeviceEvent::cuda(
            self.device as u32,
            ev.raw_handle(),
            Arc::new(RequestEvent(ev.clone())),
        ))
    }

    fn arrival_per_post(&self) -> Option<u64> {
        match &self.engine {
            Engine::Kernel(p) => p.arrival_per_post(),
            _ => None,
        }
    }

    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        self.notif = match msg {
            None => None,
            Some(m) => Some(Notif::new(
                &self.agent,
                &self.remote,
                m.to_vec(),
                self.route.clone(),
                Op::PostXfer,
            )?),
        };
        Ok(())
    }
}

impl Drop for CudaIpcXfer {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            t.cancel();
        }
        // A kernel plan whose upload or launch may still run (a request dropped right after
        // make, or whose cancel could not wait for the GPU) gives its descriptors' buffers
        // back pending: reused once the request's event completes, leaked if the work never
        // ends, never freed under the GPU (`StagingPool::give_when_done`).
        // The stream and event go back to the pool if their work is complete.
        self.lanes.give(self.lane.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_bounded_on_char_boundaries() {
        assert_eq!(short_note("short".into()), "short");
        let long = "é".repeat(400);
        let s = short_note(long);
        assert!(s.len() <= MAX_NOTE + 3 && s.ends_with("..."));
    }
}
