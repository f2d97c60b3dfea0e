//! Transfer requests (NIXL's `nixlXferReqH`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::{NixlError, XferTelemetry};

/// A transfer's direction, as the initiator sees it.
#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq)]
pub enum XferOp {
    /// Remote to local.
    Read = 0,
    /// Local to remote.
    Write = 1,
}

impl XferOp {
    pub(crate) fn rs(self) -> nixl::XferOp {
        match self {
            XferOp::Read => nixl::XferOp::Read,
            XferOp::Write => nixl::XferOp::Write,
        }
    }
}

/// How a cost estimate was made.
#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq)]
pub enum CostMethod {
    /// From the backend's own model.
    AnalyticalBackend = 0,
    /// Otherwise.
    Unknown = 1,
}

impl From<u32> for CostMethod {
    fn from(value: u32) -> Self {
        match value {
            0 => CostMethod::AnalyticalBackend,
            _ => CostMethod::Unknown,
        }
    }
}

/// A transfer request. Dropping it while in flight cancels it; nixl-rs keeps the memory it
/// uses registered until the backend confirms the copy stopped.
pub struct XferRequest {
    pub(crate) req: nixl::XferReq,
    pub(crate) telemetry: bool,
    pub(crate) posted: AtomicBool,
}

impl std::fmt::Debug for XferRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XferRequest")
            .field("id", &self.req.id())
            .field("backend", &self.req.backend().name())
            .finish()
    }
}

impl XferRequest {
    pub(crate) fn new(req: nixl::XferReq, telemetry: bool) -> Self {
        XferRequest {
            req,
            telemetry,
            posted: AtomicBool::new(false),
        }
    }

    /// The latest post's telemetry: `NoTelemetry` when telemetry is off
    /// (`NIXL_TELEMETRY_ENABLE`, [`crate::AgentConfig::capture_telemetry`]) or the transfer is
    /// still in flight, `BackendError` before the first post (NIXL's `NOT_POSTED`).
    pub fn get_telemetry(&self) -> Result<XferTelemetry, NixlError> {
        if !self.telemetry {
            return Err(NixlError::NoTelemetry);
        }
        if !self.posted.load(Ordering::Acquire) {
            return Err(NixlError::BackendError);
        }
        if self.req.is_in_flight() {
            return Err(NixlError::NoTelemetry);
        }
        let t = self.req.telemetry();
        let start = t.start.ok_or(NixlError::BackendError)?;
        Ok(XferTelemetry {
            start_time_us: monotonic_us(start),
            post_duration_us: t.post_duration.as_micros() as u64,
            xfer_duration_us: t.xfer_duration.as_micros() as u64,
            total_bytes: t.bytes,
            desc_count: t.desc_count as u64,
        })
    }
}

/// `at` in microseconds of the monotonic clock (NIXL's `steady_clock` epoch on Linux).
fn monotonic_us(at: Instant) -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let now_us = (now.tv_sec as u64)
        .saturating_mul(1_000_000)
        .saturating_add(now.tv_nsec as u64 / 1_000);
    now_us.saturating_sub(at.elapsed().as_micros() as u64)
}
