//! `CUDA_IPC` tile transfers: the tile kernel copies every tile's rows where the destination
//! wants them (an HND <-> NHD permute, heads gathered or sliced) in one pass, VRAM to VRAM on
//! the GPU of the local memory. The layers are checked once each (metadata, the remote
//! layer's mapping, peer access, 16-byte alignment); the table (O(layers + tiles)) is
//! uploaded once at prepare time. There is no other engine: a request the kernel cannot take
//! is refused `NotSupported` with the reason.

use nixl_core::backend::{downcast_md, BackendXfer, BlockXferSpec};
use nixl_core::{Error, MemKind, Op, Result, XferOp};

use super::gpu::Gpu;
use super::md::{LocalMd, Target};
use super::xfer::{Engine, KernelPlan, Work};
use super::{CudaIpcBackend, Ends, NoKernel};
use crate::cuda;
use crate::cuda::kernel::TileTable;

impl CudaIpcBackend {
    /// A block table whose tiles' rows are rearranged ([`BlockXferSpec::rows`]).
    pub(super) fn prepare_tile_table(&self, spec: &BlockXferSpec) -> Result<Box<dyn BackendXfer>> {
        let me = &self.agent;
        let refuse = |why: String| refusal(me, why);
        if spec.local_kind != MemKind::Vram || spec.remote_kind != MemKind::Vram {
            return Err(refuse(format!(
                "its tile kernel moves VRAM to VRAM, not {} -> {}",
                spec.local_kind, spec.remote_kind
            )));
        }
        if !self.params.copy_kernel {
            return Err(refuse(
                "the copy kernel is off (CudaIpcParams::copy_kernel)".to_owned(),
            ));
        }
        let device = self.copy_device(
            (spec.local_kind, spec.remote_kind),
            spec.layers.iter().map(|l| l.local.dev_id),
            spec.layers.first().map(|l| l.remote.dev_id),
        )?;
        let gpu = self.gpu(device, Op::MakeXfer)?;
        let table = self.tile_table(spec, &gpu)?;
        if let Some(why) = table.problem() {
            return Err(refuse(why.to_owned()));
        }
        let ends = Ends {
            op: spec.op,
            kinds: (spec.local_kind, spec.remote_kind),
            remote: &spec.remote,
            is_local: spec.is_local,
            notif: spec.notif.as_deref(),
            arrival: self.counters_on(spec.arrival, gpu.ordinal)?,
        };
        let (route, notif) = self.route(&ends)?;
        let kernel = gpu
            .copy_kernel(&self.agent, self.params.kernel_shape)
            .map_err(|why| refuse(format!("copy kernel unavailable: {why}")))?;
        let lane = gpu
            .lanes
            .take()
            .map_err(|e| cuda::to_error(me, Op::MakeXfer, e))?;
        let plan = KernelPlan::tiles(
            kernel,
            &gpu.staging,
            &table,
            lane.event.clone(),
            &lane.stream,
        )
        .map_err(refuse)?;
        let plan = match ends.arrival {
            Some(c) => plan.with_arrival(c).map_err(refuse)?,
            None => plan,
        };
        // The upload is in the event too (a request dropped before its first post still
        // knows whether the GPU is done with its table).
        lane.event
            .record(&lane.stream)
            .map_err(|e| cuda::to_error(me, Op::MakeXfer, e))?;
        let how = if spec.is_local {
            "same process"
        } else {
            "CUDA IPC mapping"
        };
        let work = Work::Tiles {
            items: usize::try_from(table.items()).unwrap_or(usize::MAX),
        };
        Ok(self.xfer(
            &gpu,
            &ends,
            how,
            (work, Engine::Kernel(plan), None),
            (lane, route, notif),
        ))
    }
    /// The tile kernel's table of `spec` as GPU `gpu` addresses it (remote layers through
    /// their mappings), in source and destination terms; every layer checked.
    fn tile_table(&self, spec: &BlockXferSpec, gpu: &Gpu) -> Result<TileTable> {
        let me = &self.agent;
        let refuse = |why: String| refusal(me, why);
        let mut layers = Vec::with_capacity(spec.layers.len());
        for l in &spec.layers {
            downcast_md::<LocalMd>(&l.local_md).ok_or_else(|| {
                Error::invalid(me, Op::MakeXfer, "local metadata is not CUDA_IPC's")
            })?;
            let t = downcast_md::<Target>(&l.remote_md).ok_or_else(|| {
                Error::invalid(me, Op::MakeXfer, "remote metadata is not CUDA_IPC's")
            })?;
            let extent = l.remote.end().map_or(0, |e| e - l.remote.addr);
            let (base, remote_gpu) = self
                .reach(t, gpu, l.remote.addr, extent, l.remote.dev_id)
                .map_err(|why| Error::not_supported(me, Op::MakeXfer, why))?;
            self.kernel_reaches(gpu, remote_gpu).map_err(|why| {
                refuse(match why {
                    NoKernel::Hardware(w) => w,
                    NoKernel::Layout(w) => w.to_owned(),
                    NoKernel::Dram => "an end is host memory".to_owned(),
                })
            })?;
            let (local, remote) = ([l.local.addr, l.local.stride], [base, l.remote.stride]);
            let (src, dst) = match spec.op {
                XferOp::Read => (remote, local),
                XferOp::Write => (local, remote),
            };
            layers.push([src[0], src[1], dst[0], dst[1]]);
        }
        let Some(s) = &spec.rows else {
            return Err(refuse("a block table without a tile shape".to_owned()));
        };
        let (ls, rs) = (
            (s.local.outer, s.local.inner),
            (s.remote.outer, s.remote.inner),
        );
        let read = spec.op == XferOp::Read;
        let table = TileTable {
            rows: (s.outer, s.inner, s.row),
            src: if read { rs } else { ls },
            dst: if read { ls } else { rs },
            layers,
            tiles: spec
                .runs
                .iter()
                .flat_map(|r| {
                    (0..r.count).map(move |k| {
                        let (l, m) = (r.local + k, r.remote + k);
                        if read {
                            [m, l, r.remote_offset, r.local_offset]
                        } else {
                            [l, m, r.local_offset, r.remote_offset]
                        }
                    })
                })
                .collect(),
        };
        Ok(table)
    }
}

/// A tile request CUDA_IPC cannot take, and why.
fn refusal(me: &str, why: String) -> Error {
    Error::not_supported(
        me,
        Op::MakeXfer,
        format!("CUDA_IPC cannot rearrange these tiles' rows: {why}"),
    )
}
