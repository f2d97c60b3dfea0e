//! What a fresh request reuses instead of creating: the copy kernel's upload buffers (a
//! pinned host buffer the descriptors are written into, and the device buffer they are copied
//! to with one asynchronous copy) and the request's stream and event. A request takes them at
//! prepare time and gives them back when it is dropped after its work completed, so a fresh
//! request allocates nothing (`cuMemAlloc`, `cuMemHostAlloc`, `cuStreamCreate`,
//! `cuEventCreate` and their frees and destroys cost far more than writing the descriptors)
//! and uploads from pinned memory without the driver's staging of pageable memory.

use parking_lot::Mutex;
use std::sync::Arc;

use cudarc::driver::CudaContext;

use crate::cuda::{CudaError, Event, Stream};
use crate::sys::memory::{DeviceAlloc, HostAlloc};

/// Pairs kept for reuse at most (more are freed when given back): as many as an engine keeps
/// requests in flight (a scheduling step's transfers, each holding its pair while alive), so
/// steady state allocates and frees none (a free synchronizes the device).
const KEEP: usize = 32;
/// Bytes of pinned host memory kept for reuse at most (each pair holds as much on the device).
const KEEP_BYTES: usize = 64 << 20;
/// How long a pair given back past [`KEEP`] pending ones waits for its work.
const PENDING_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// The smallest pair allocated (sizes are rounded up to a power of two).
const MIN_BYTES: usize = 64 << 10;

/// A pinned host buffer and a device buffer of the same size.
pub(crate) struct Staging {
    pub host: HostAlloc,
    pub dev: DeviceAlloc,
}

impl Staging {
    /// Bytes each buffer holds.
    pub(super) fn capacity(&self) -> usize {
        self.host.len()
    }
}

/// The backend's pairs not in use.
pub(crate) struct StagingPool {
    ctx: Arc<CudaContext>,
    free: Mutex<Pairs>,
}

#[derive(Default)]
struct Pairs {
    /// Pairs no GPU work uses.
    free: Vec<Staging>,
    /// Pairs of dropped requests whose work (the upload, a launch) may still run: each is
    /// free once its event has completed.
    pending: Vec<(Staging, Arc<Event>)>,
}

impl StagingPool {
    /// An empty pool for `ctx`.
    pub(super) fn new(ctx: Arc<CudaContext>) -> Self {
        StagingPool {
            ctx,
            free: Mutex::new(Pairs::default()),
        }
    }

    /// A pair of at least `bytes` (the smallest free one that fits, or a new one).
    pub(super) fn take(&self, bytes: usize) -> Result<Staging, CudaError> {
        {
            let mut pairs = self.free.lock();
            let Pairs { free, pending } = &mut *pairs;
            // Pending pairs whose work completed are free; one whose event cannot be queried
            // is never reused (dropped here: its frees wait for the work).
            let mut k = 0;
            while k < pending.len() {
                match pending[k].1.query() {
                    Ok(false) => k += 1,
                    done => {
                        let (st, _) = pending.swap_remove(k);
                        if done == Ok(true) {
                            free.push(st);
                        }
                    }
                }
            }
            let fit = free
                .iter()
                .enumerate()
                .filter(|(_, s)| s.capacity() >= bytes)
                .min_by_key(|(_, s)| s.capacity())
                .map(|(i, _)| i);
            if let Some(i) = fit {
                return Ok(free.swap_remove(i));
            }
        }
        let cap = fit_size(bytes);
        Ok(Staging {
            host: HostAlloc::new(self.ctx.clone(), cap)?,
            dev: DeviceAlloc::new(self.ctx.clone(), cap)?,
        })
    }

    /// Takes back a pair whose work has completed (no copy reads or writes it any more),
    /// keeping the largest, up to [`KEEP`] pairs and [`KEEP_BYTES`].
    pub(super) fn give(&self, s: Staging) {
        let freed = {
            let mut pairs = self.free.lock();
            pairs.free.push(s);
            let bytes: usize = pairs.free.iter().map(Staging::capacity).sum();
            if pairs.free.len() <= KEEP && bytes <= KEEP_BYTES {
                return;
            }
            pairs
                .free
                .sort_unstable_by_key(|s| std::cmp::Reverse(s.capacity()));
            let (mut kept, mut held) = (0, 0);
            for s in &pairs.free {
                if kept == KEEP || held + s.capacity() > KEEP_BYTES {
                    break;
                }
                kept += 1;
                held += s.capacity();
            }
            pairs.free.split_off(kept)
        };
        // Freed outside the lock (a free waits for the device).
        drop(freed);
    }

    /// Takes back a pair whose work may still run (a request dropped while its upload or a
    /// launch was in flight): free at once if `event` (recorded after that work) has
    /// completed, else kept pending until it has, up to [`KEEP`] pending pairs. Past that,
    /// this waits up to [`PENDING_WAIT`] for the work; a pair whose work did not end (or
    /// whose event cannot be queried) is leaked, never freed or reused under the GPU.
    pub(super) fn give_when_done(&self, s: Staging, event: Arc<Event>) {
        match event.query() {
            Ok(true) => return self.give(s),
            Ok(false) => {
                let mut pairs = self.free.lock();
                if pairs.pending.len() < KEEP {
                    pairs.pending.push((s, event));
                    return;
                }
            }
            Err(_) => {}
        }
        if event.wait(PENDING_WAIT) == Ok(true) {
            return self.give(s);
        }
        tracing::error!("CUDA_IPC copy work outlived its request; leaking its staging buffers");
        std::mem::forget(s);
    }
}

/// A request's stream and the event recorded on it (only ever on this stream, so a later
/// record covers everything an earlier one did: a holder of an older clone of the event, such
/// as a pending staging pair, learns of completion later, never earlier).
pub(crate) struct Lane {
    pub stream: Stream,
    pub event: Arc<Event>,
}

/// The backend's lanes not in use.
pub(crate) struct LanePool {
    ctx: Arc<CudaContext>,
    free: Mutex<Vec<Arc<Lane>>>,
}

/// Lanes kept for reuse at most (requests alive at once beyond this create their own).
const KEEP_LANES: usize = 16;

impl LanePool {
    /// An empty pool for `ctx`.
    pub(super) fn new(ctx: Arc<CudaContext>) -> Self {
        LanePool {
            ctx,
            free: Mutex::new(Vec::new()),
        }
    }

    /// A lane no request uses (a kept one, or a new stream and event).
    pub(super) fn take(&self) -> Result<Arc<Lane>, CudaError> {
        {
            let mut free = self.free.lock();
            // A lane is given back from its request's `Drop`, which still holds it until its
            // fields are dropped: only a lane nothing else holds is handed out.
            if let Some(i) = free.iter().rposition(|l| Arc::strong_count(l) == 1) {
                return Ok(free.swap_remove(i));
            }
        }
        Ok(Arc::new(Lane {
            stream: Stream::create(self.ctx.clone())?,
            event: Arc::new(Event::create(self.ctx.clone())?),
        }))
    }

    /// Takes back the lane of a dropped request (called from its `Drop`). Kept only when every
    /// piece of work recorded on it has completed; otherwise it is dropped with the request
    /// (the driver destroys a stream only once its work has ended).
    pub(super) fn give(&self, lane: Arc<Lane>) {
        if lane.event.query() != Ok(true) {
            return;
        }
        let mut free = self.free.lock();
        if free.len() < KEEP_LANES {
            free.push(lane);
        }
    }
}

/// The size allocated for `bytes`: a power of two, at least [`MIN_BYTES`].
fn fit_size(bytes: usize) -> usize {
    bytes
        .max(MIN_BYTES)
        .checked_next_power_of_two()
        .unwrap_or(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_powers_of_two() {
        assert_eq!(fit_size(0), MIN_BYTES);
        assert_eq!(fit_size(1), MIN_BYTES);
        assert_eq!(fit_size(MIN_BYTES + 1), 2 * MIN_BYTES);
        assert_eq!(fit_size(131_072 * 24), 4 << 20);
        assert_eq!(fit_size(usize::MAX), usize::MAX);
    }
}
