//! Arrival counters: a block or tile request that advances, on the GPU, one counter per layer
//! as that layer's bytes land, so a decode kernel for layer `L` can wait for layer `L` on the
//! GPU (a spin on the counter, `cuStreamWaitValue64`) while later layers still move.

use crate::error::{Error, Op, Result};
use crate::mem::MemKind;

/// Where a request's arrival counters live: one `u64` per layer of a block or tile table (one
/// for a request of plain descriptors) from `addr` on GPU `dev_id`, in a region of the
/// request's local list (allocate them beside the KV pool, in its registration). The copy adds each item of layer `l` to counter `l` once the
/// item's bytes are visible on that GPU; every post adds
/// [`XferReq::arrival_per_post`](crate::XferReq::arrival_per_post) to each layer's counter, so
/// after post `k` (from zero) layer `l` has fully landed when its counter reaches `k` times
/// that. Nothing resets them: the caller zeroes them when it reuses them.
///
/// Only READs into this agent's VRAM (the decode side pulling) over a backend that
/// implements them (`CUDA_IPC`'s copy kernels) take counters; others refuse the
/// request `NotSupported`, never ignore them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArrivalCounters {
    /// Device address of counter 0 (8-byte aligned).
    pub addr: u64,
    /// The GPU holding them.
    pub dev_id: u64,
}

impl ArrivalCounters {
    /// Counters at `addr` on GPU `dev_id`.
    pub fn new(addr: u64, dev_id: u64) -> Self {
        ArrivalCounters { addr, dev_id }
    }

    /// Checks the counters against a request: a READ into VRAM, `layers` of them aligned and
    /// inside one of `covers`' regions (the local list's). `NotSupported` or `InvalidParam`.
    pub(crate) fn check(
        &self,
        me: &str,
        (read, kind): (bool, MemKind),
        layers: usize,
        covered: impl Fn(u64, u64, u64) -> bool,
    ) -> Result<()> {
        if !read || kind != MemKind::Vram {
            return Err(Error::not_supported(
                me,
                Op::MakeXfer,
                "arrival counters are advanced for READs into this agent's VRAM only",
            ));
        }
        let len = (layers as u64).saturating_mul(8);
        if !self.addr.is_multiple_of(8) {
            return Err(Error::invalid(
                me,
                Op::MakeXfer,
                format!(
                    "arrival counters at {:#x} are not 8-byte aligned",
                    self.addr
                ),
            ));
        }
        if !covered(self.addr, len, self.dev_id) {
            return Err(Error::invalid(
                me,
                Op::MakeXfer,
                format!(
                    "arrival counters [{:#x}, +{len}) on GPU {} lie outside the local block table's regions",
                    self.addr, self.dev_id
                ),
            ));
        }
        Ok(())
    }
}
