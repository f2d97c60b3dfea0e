//! A prepared `CUDA_IPC` transfer: copies enqueued on its own stream, an event recorded after
//! them, and the notification sent only once the event has completed.

use std::sync::Arc;
use std::time::Duration;

use nixl_core::{BackendXfer, Error, Op, Result, XferState};

use super::notif::NotifSenders;
use crate::cuda::stream::{Event, Stream};
use crate::cuda::{self, check, sys, CudaError};

/// Where a notification goes once the data is complete.
pub(crate) enum NotifRoute {
    /// A peer's notification server.
    Remote {
        senders: Arc<NotifSenders>,
        server: Vec<u8>,
    },
    /// The agent itself (loopback).
    Local(Arc<nixl_core::NotifQueue>),
}

pub(crate) struct CudaIpcXfer {
    pub agent: String,
    pub remote: String,
    /// (dst, src, len) in this process's address space.
    pub copies: Vec<(u64, u64, u64)>,
    pub stream: Stream,
    pub event: Event,
    pub batch: bool,
    pub notif: Option<(Vec<u8>, NotifRoute)>,
    pub notif_sent: bool,
    pub cancel_timeout: Duration,
    pub path: String,
}

impl CudaIpcXfer {
    fn fail(&self, op: Op, e: CudaError) -> Error {
        cuda::to_error(&self.agent, op, e)
    }

    fn enqueue(&mut self) -> std::result::Result<(), CudaError> {
        if self.batch && self.copies.len() > 1 {
            match self.enqueue_batch() {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!(error = %e, "cuMemcpyBatchAsync refused; copying one by one");
                    self.batch = false;
                    self.path = self.path.replace("cuMemcpyBatchAsync", "cuMemcpyAsync");
                }
            }
        }
        for &(dst, src, len) in &self.copies {
            // SAFETY: both ranges lie in memory the request keeps alive (local registration,
            // loaded peer region), resolved to this process's addresses; unified addressing
            // lets the driver route host and device pointers.
            check("cuMemcpyAsync", unsafe {
                sys::cuMemcpyAsync(dst, src, len as usize, self.stream.raw())
            })?;
        }
        Ok(())
    }

    /// One driver call for every segment (CUDA 12.8+), so a request of many blocks is not
    /// bound by the per-call launch cost.
    fn enqueue_batch(&mut self) -> std::result::Result<(), CudaError> {
        // SAFETY: looking a symbol up calls nothing; the driver is loaded (a stream exists).
        if unsafe { sys::culib().get::<*const ()>(b"cuMemcpyBatchAsync") }.is_err() {
            return Err(CudaError {
                call: "cuMemcpyBatchAsync",
                code: 0,
                name: "symbol missing".into(),
            });
        }
        let mut dsts: Vec<sys::CUdeviceptr> = self.copies.iter().map(|c| c.0).collect();
        let mut srcs: Vec<sys::CUdeviceptr> = self.copies.iter().map(|c| c.1).collect();
        let mut sizes: Vec<usize> = self.copies.iter().map(|c| c.2 as usize).collect();
        let loc = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        };
        let mut attrs = [sys::CUmemcpyAttributes {
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: loc,
            dstLocHint: loc,
            flags: 0,
        }];
        let mut idx = [0usize];
        let mut fail_idx = usize::MAX;
        // SAFETY: the three arrays have `copies.len()` entries each and live across the call;
        // one attribute applies from index 0; every range is valid as in `enqueue`.
        let r = unsafe {
            sys::cuMemcpyBatchAsync(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                dsts.len(),
                attrs.as_mut_ptr(),
                idx.as_mut_ptr(),
                1,
                &mut fail_idx,
                self.stream.raw(),
            )
        };
        check("cuMemcpyBatchAsync", r)
    }

    fn deliver_notif(&mut self) -> Result<()> {
        if self.notif_sent {
            return Ok(());
        }
        if let Some((msg, route)) = &self.notif {
            match route {
                NotifRoute::Remote { senders, server } => {
                    senders.send(&self.agent, &self.remote, server, msg)?
                }
                NotifRoute::Local(q) => q.push(&self.agent, msg.clone()),
            }
        }
        self.notif_sent = true;
        Ok(())
    }
}

impl BackendXfer for CudaIpcXfer {
    fn post(&mut self) -> Result<XferState> {
        cuda::bind(self.stream.context())?;
        self.notif_sent = false;
        if let Err(e) = self.enqueue() {
            // Some copies may already be queued: let them drain (bounded) before reporting,
            // since a failed request's memory may be released right after.
            let drained = self
                .event
                .record(&self.stream)
                .ok()
                .and_then(|()| self.event.wait(self.cancel_timeout).ok());
            if drained != Some(true) {
                tracing::error!(agent = %self.agent, "a partly enqueued CUDA_IPC transfer did not drain");
            }
            return Err(self.fail(Op::PostXfer, e));
        }
        self.event
            .record(&self.stream)
            .map_err(|e| self.fail(Op::PostXfer, e))?;
        Ok(XferState::InProgress)
    }

    fn check(&mut self) -> Result<XferState> {
        cuda::bind(self.stream.context())?;
        if !self
            .event
            .query()
            .map_err(|e| self.fail(Op::CheckXfer, e))?
        {
            return Ok(XferState::InProgress);
        }
        self.deliver_notif()?;
        Ok(XferState::Done)
    }

    fn cancel(&mut self) -> Result<()> {
        // Copies already handed to the copy engines cannot be recalled: cancel waits for them
        // (bounded), so the memory is never freed under the hardware.
        cuda::bind(self.stream.context())?;
        match self.event.wait(self.cancel_timeout) {
            Ok(true) => {
                self.notif_sent = true;
                Ok(())
            }
            Ok(false) => Err(Error::TimedOut {
                agent: self.agent.clone(),
                op: Op::Cancel,
                elapsed: self.cancel_timeout,
            }),
            Err(e) => Err(self.fail(Op::Cancel, e)),
        }
    }

    fn path(&self) -> Option<String> {
        Some(self.path.clone())
    }
}
