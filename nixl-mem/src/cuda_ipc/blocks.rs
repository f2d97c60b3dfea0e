//! `CUDA_IPC` block-table transfers, whole blocks and tiles alike (a block is the tile whose
//! rows keep their order): the layers are checked once each (metadata, the remote layer's
//! mapping, GPU and alignment for the copy kernels), then whole blocks and tiles part ways
//! only where their engines do.
//!
//! Whole blocks: the copies are generated from the strides in one pass (a dense run of a layer
//! is one copy), and whether copies can depend on each other is decided from the layers and the
//! ids, not by sorting every block ([`kernel::conflict`] runs only where that cannot prove
//! independence). A request proven independent whose layers' blocks share one length goes to
//! the block kernel: the layers (base and stride per side) and the ids' pieces are written into
//! a reused pinned buffer and uploaded with one asynchronous copy at prepare time, and the
//! kernel generates every copy on the device (nothing per layer and block on the host; reposts
//! reuse the table). Other independent tables write one descriptor per copy for the segment
//! kernel the same way; the segment list is built only for requests that need the one-by-one
//! check or the copy engines.
//!
//! Tiles ([`BlockXferSpec::rows`]): the tile kernel copies every tile's rows where the
//! destination wants them (an HND <-> NHD permute, heads gathered or sliced) in one pass, VRAM
//! to VRAM on the GPU of the local memory; its table (O(layers + tiles)) is uploaded once at
//! prepare time. There is no other engine: a tile request the kernel cannot take is refused
//! `NotSupported` with the reason.

use nixl_core::backend::{downcast_md, BackendXfer, BlockXferSpec};
use nixl_core::{Error, MemKind, Op, Result, StridedDesc, XferOp};

use super::gpu::Gpu;
use super::md::{LocalMd, Target};
use super::table::BlockTable;
use super::xfer::{Engine, KernelPlan, Work};
use super::{ends_of, CudaIpcBackend, Ends, KernelOk, NoKernel};
use crate::cuda;
use crate::cuda::kernel::{self, TileTable};

/// A table's layers as this process addresses them.
struct LayersHere {
    /// Each remote layer at its address here (its mapping is linear over the layer).
    remote: Vec<StridedDesc>,
    /// How the remote memory is reached.
    how: &'static str,
    /// Whether the copy kernels can take the table (the first layer that keeps them out).
    kernel: KernelOk,
}

impl CudaIpcBackend {
    /// A block-table request: whole blocks, or tiles where `spec.rows` is set.
    pub(super) fn prepare_table(&self, spec: &BlockXferSpec) -> Result<Box<dyn BackendXfer>> {
        let me = &self.agent;
        if spec.rows.is_some() {
            if spec.local_kind != MemKind::Vram || spec.remote_kind != MemKind::Vram {
                return Err(tile_refusal(
                    me,
                    format!(
                        "its tile kernel moves VRAM to VRAM, not {} -> {}",
                        spec.local_kind, spec.remote_kind
                    ),
                ));
            }
            if !self.params.copy_kernel {
                return Err(tile_refusal(
                    me,
                    "the copy kernel is off (CudaIpcParams::copy_kernel)".to_owned(),
                ));
            }
        }
        for k in [spec.local_kind, spec.remote_kind] {
            if !matches!(k, MemKind::Dram | MemKind::Vram) {
                return Err(Error::not_supported(
                    me,
                    Op::MakeXfer,
                    format!("CUDA_IPC moves DRAM and VRAM, not {k}"),
                ));
            }
        }
        let device = self.copy_device(
            (spec.local_kind, spec.remote_kind),
            spec.layers.iter().map(|l| l.local.dev_id),
            spec.layers.first().map(|l| l.remote.dev_id),
        )?;
        let gpu = self.gpu(device, Op::MakeXfer)?;
        let here = self.layers_here(spec, &gpu)?;
        let ends = ends_of!(self, spec, gpu);
        match spec.rows {
            None => self.block_xfer(spec, &gpu, here, ends),
            Some(_) => self.tile_xfer(spec, &gpu, here, ends),
        }
    }

    /// Every layer's metadata checked, its remote run reached from GPU `gpu`, and whether the
    /// copy kernels can take it (the GPU reaches the remote memory; for whole blocks, blocks
    /// 16-byte co-aligned: a tile table checks its rows itself).
    fn layers_here(&self, spec: &BlockXferSpec, gpu: &Gpu) -> Result<LayersHere> {
        let me = &self.agent;
        let mut here = LayersHere {
            remote: Vec::with_capacity(spec.layers.len()),
            how: "same process",
            kernel: if spec.local_kind == MemKind::Vram && spec.remote_kind == MemKind::Vram {
                Ok(())
            } else {
                Err(NoKernel::Dram)
            },
        };
        for l in &spec.layers {
            downcast_md::<LocalMd>(&l.local_md).ok_or_else(|| {
                Error::invalid(me, Op::MakeXfer, "local metadata is not CUDA_IPC's")
            })?;
            let t = downcast_md::<Target>(&l.remote_md).ok_or_else(|| {
                Error::invalid(me, Op::MakeXfer, "remote metadata is not CUDA_IPC's")
            })?;
            let extent = l.remote.end().map_or(0, |e| e - l.remote.addr);
            let (base, remote_gpu) = self
                .reached(t, gpu)
                .at(l.remote.addr, extent, l.remote.dev_id)
                .map_err(|why| Error::not_supported(me, Op::MakeXfer, why))?;
            here.how = match t {
                Target::Vram(_) => "CUDA IPC mapping",
                Target::Host(_) => "shared memfd mapping",
                _ => here.how,
            };
            if here.kernel.is_ok() {
                here.kernel = self.kernel_reaches(gpu, remote_gpu).and_then(|()| {
                    let aligned = kernel::co_aligned(l.local.addr, base)
                        && l.local.stride % 16 == 0
                        && l.remote.stride % 16 == 0;
                    if spec.rows.is_some() || aligned {
                        Ok(())
                    } else {
                        Err(NoKernel::Layout("blocks not 16-byte co-aligned"))
                    }
                });
            }
            here.remote.push(StridedDesc {
                addr: base,
                ..l.remote
            });
        }
        Ok(here)
    }

    /// Whole blocks: the block kernel, the segment kernel or the copy engines.
    fn block_xfer(
        &self,
        spec: &BlockXferSpec,
        gpu: &Gpu,
        here: LayersHere,
        ends: Ends<'_>,
    ) -> Result<Box<dyn BackendXfer>> {
        let table = BlockTable::new(spec, &here.remote);
        if table.copy_count() == 0 {
            return Err(Error::invalid(&self.agent, Op::MakeXfer, "no blocks"));
        }
        // Proven independent from the layers and the ids: the kernel's descriptors are written
        // straight from the table. Otherwise the copies are listed and checked one by one.
        let (work, conflict) = if independent(spec, &here.remote) {
            (Work::Table(table), None)
        } else {
            let copies = table.copies();
            let conflict = kernel::conflict(&copies);
            (Work::Copies(copies), conflict)
        };
        self.finish(gpu, ends, work, here.how, here.kernel, conflict)
    }

    /// Tiles: the tile kernel, or a refusal that says why not.
    fn tile_xfer(
        &self,
        spec: &BlockXferSpec,
        gpu: &Gpu,
        here: LayersHere,
        ends: Ends<'_>,
    ) -> Result<Box<dyn BackendXfer>> {
        let me = &self.agent;
        here.kernel.map_err(|why| {
            tile_refusal(
                me,
                match why {
                    NoKernel::Hardware(w) => w,
                    NoKernel::Layout(w) => w.to_owned(),
                    NoKernel::Dram => "an end is host memory".to_owned(),
                },
            )
        })?;
        let table = tile_table(spec, &here.remote)
            .ok_or_else(|| tile_refusal(me, "a block table without a tile shape".to_owned()))?;
        if let Some(why) = table.problem() {
            return Err(tile_refusal(me, why.to_owned()));
        }
        let (route, notif) = self.route(&ends)?;
        let kernel = gpu
            .copy_kernel(&self.agent, self.params.kernel_shape)
            .map_err(|why| tile_refusal(me, format!("copy kernel unavailable: {why}")))?;
        let lane = gpu
            .lanes
            .take()
            .map_err(|e| cuda::to_error(me, Op::MakeXfer, e))?;
        let plan = KernelPlan::tiles(kernel, &gpu.staging, &table, &lane)
            .map_err(|why| tile_refusal(me, why))?;
        let plan = match ends.arrival {
            Some(c) => plan.with_arrival(c).map_err(|why| tile_refusal(me, why))?,
            None => plan,
        };
        // The first post's event record covers the upload; a plan dropped before any post
        // records it then.
        let work = Work::Tiles {
            items: usize::try_from(table.items()).unwrap_or(usize::MAX),
        };
        Ok(self.xfer(
            gpu,
            &ends,
            here.how,
            (work, Engine::Kernel(plan), None),
            (lane, route, notif),
        ))
    }
}

/// The tile kernel's table of `spec` (remote layers at `remote_here`, their addresses here),
/// in source and destination terms; `None` without a tile shape.
fn tile_table(spec: &BlockXferSpec, remote_here: &[StridedDesc]) -> Option<TileTable> {
    let s = spec.rows.as_ref()?;
    let read = spec.op == XferOp::Read;
    let layers = spec
        .layers
        .iter()
        .zip(remote_here)
        .map(|(l, r)| {
            let (local, remote) = ([l.local.addr, l.local.stride], [r.addr, r.stride]);
            let (src, dst) = if read {
                (remote, local)
            } else {
                (local, remote)
            };
            [src[0], src[1], dst[0], dst[1]]
        })
        .collect();
    let (ls, rs) = (
        (s.local.outer, s.local.inner),
        (s.remote.outer, s.remote.inner),
    );
    Some(TileTable {
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
    })
}

/// A tile request CUDA_IPC cannot take, and why.
fn tile_refusal(me: &str, why: String) -> Error {
    Error::not_supported(
        me,
        Op::MakeXfer,
        format!("CUDA_IPC cannot rearrange these tiles' rows: {why}"),
    )
}

impl CudaIpcBackend {
    /// The counters' address for GPU `device`'s kernel (they are this process's memory: the
    /// agent checked them inside the local list's regions); `NotSupported` on another GPU.
    pub(super) fn counters_on(
        &self,
        arrival: Option<nixl_core::ArrivalCounters>,
        device: usize,
    ) -> Result<Option<u64>> {
        match arrival {
            None => Ok(None),
            Some(a) if a.dev_id == device as u64 => Ok(Some(a.addr)),
            Some(a) => Err(Error::not_supported(
                &self.agent,
                Op::MakeXfer,
                format!(
                    "arrival counters on GPU {} for a copy made by GPU {device}: put them on the GPU the data lands on",
                    a.dev_id
                ),
            )),
        }
    }
}

/// Whether no copy of the request can touch bytes another copy writes: no block of any layer,
/// local or remote as addressed here, meets a block of another layer. The destination's ids
/// are distinct (an invariant of [`BlockXferSpec`] for whole blocks: the agent refuses others)
/// and blocks of one layer never overlap (the agent checked `stride >= len`), so two copies'
/// destinations are different blocks of one layer or blocks of different layers, and no
/// destination meets a source (those are other layers; the sources' ids may repeat). O(layers),
/// plus the pairs of layers whose extents overlap (K and V interleaved in one region): nothing
/// per id. `false` means "not proven", never "dependent".
pub(super) fn independent(spec: &BlockXferSpec, remote_here: &[StridedDesc]) -> bool {
    debug_assert!(
        spec.rows.is_some() || distinct_destinations(spec),
        "a whole-block spec names a destination block twice"
    );
    let mut runs: Vec<StridedDesc> = spec.layers.iter().map(|l| l.local).collect();
    runs.extend_from_slice(remote_here);
    runs.sort_unstable_by_key(|r| r.addr);
    // Sweep in address order, comparing each run with the earlier ones still open.
    let mut open: Vec<StridedDesc> = Vec::new();
    for r in runs {
        open.retain(|o| o.end().unwrap_or(u64::MAX) > r.addr);
        if open.iter().any(|o| !strided_disjoint(o, &r)) {
            return false;
        }
        open.push(r);
    }
    true
}

/// Whether the runs name each destination id once (the agent's check, again: debug builds).
fn distinct_destinations(spec: &BlockXferSpec) -> bool {
    let mut ids: Vec<u64> = spec
        .runs
        .iter()
        .flat_map(|r| {
            let first = match spec.op {
                XferOp::Read => r.local,
                XferOp::Write => r.remote,
            };
            first..first.saturating_add(r.count)
        })
        .collect();
    ids.sort_unstable();
    ids.windows(2).all(|w| w[0] != w[1])
}

/// Whether two strided runs share no byte: their extents are disjoint, or they have the same
/// stride and their blocks interleave without touching.
fn strided_disjoint(a: &StridedDesc, b: &StridedDesc) -> bool {
    let (Some(ae), Some(be)) = (a.end(), b.end()) else {
        return false;
    };
    if ae <= b.addr || be <= a.addr {
        return true;
    }
    if a.stride != b.stride || a.stride == 0 {
        return false;
    }
    let (lo, hi) = if a.addr <= b.addr { (a, b) } else { (b, a) };
    let d = (hi.addr - lo.addr) % lo.stride;
    d >= lo.len && lo.stride - d >= hi.len
}

#[cfg(test)]
mod tests {
    use super::*;
    use nixl_core::backend::{BlockRun, LayerPair};
    use nixl_core::XferOp;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn run() -> impl Strategy<Value = StridedDesc> {
        (0u64..512, 1u64..4, 1u64..24, 1u64..6).prop_map(|(addr, extra, len, count)| {
            StridedDesc::new(addr, len + extra * 8, len, count)
        })
    }

    proptest! {
        /// `strided_disjoint` never says "disjoint" for runs that share a byte.
        #[test]
        fn disjoint_is_sound(a in run(), b in run()) {
            if strided_disjoint(&a, &b) {
                for i in 0..a.count {
                    for j in 0..b.count {
                        let (x, y) = (a.block(i).unwrap(), b.block(j).unwrap());
                        prop_assert!(x.addr + x.len <= y.addr || y.addr + y.len <= x.addr);
                    }
                }
            }
        }

        /// Where `independent` proves a request independent, the block-by-block check finds
        /// no conflict either.
        #[test]
        fn independence_is_sound(
            layers in proptest::collection::vec((run(), 0u64..2048), 1..4),
            ids in proptest::collection::vec((0usize..6, 0usize..6), 1..6),
            read in any::<bool>(),
        ) {
            let pairs: Vec<LayerPair> = layers
                .iter()
                .map(|&(l, off)| LayerPair {
                    local: l,
                    local_md: Arc::new(()),
                    remote: StridedDesc { addr: l.addr + off, ..l },
                    remote_md: Arc::new(()),
                })
                .collect();
            let min = pairs.iter().map(|p| p.local.count).min().unwrap_or(1) as usize;
            // Whole-block specs name each destination id once (the agent refuses others).
            let mut seen = std::collections::HashSet::new();
            let (li, ri): (Vec<usize>, Vec<usize>) = ids
                .iter()
                .map(|&(a, b)| (a % min, b % min))
                .filter(|&(a, b)| seen.insert(if read { a } else { b }))
                .unzip();
            let spec = BlockXferSpec {
                op: if read { XferOp::Read } else { XferOp::Write },
                local_kind: MemKind::Vram,
                remote_kind: MemKind::Vram,
                remote: "b".into(),
                is_local: true,
                layers: pairs.clone(),
                runs: li
                    .iter()
                    .zip(&ri)
                    .map(|(&a, &b)| BlockRun::blocks(a as u64, b as u64, 1))
                    .collect(),
                rows: None,
                notif: None,
                arrival: None,
            };
            let here: Vec<StridedDesc> = pairs.iter().map(|p| p.remote).collect();
            if independent(&spec, &here) {
                // (destination, source, bytes): local -> remote for a WRITE, back for a READ.
                let copies: Vec<(u64, u64, u64)> = spec
                    .segments()
                    .map(|(_, a, b, n)| if read { (a, b, n) } else { (b, a, n) })
                    .collect();
                prop_assert_eq!(kernel::conflict(&copies), None);
            }
        }
    }

    #[test]
    fn interleaved_k_and_v_are_independent() {
        // K and V of 8 blocks of 64 bytes side by side (stride 128), as FlashInfer lays them out.
        let k = StridedDesc::new(0x1000, 128, 64, 8);
        let v = StridedDesc::new(0x1040, 128, 64, 8);
        assert!(strided_disjoint(&k, &v));
        assert!(!strided_disjoint(&k, &StridedDesc::new(0x1020, 128, 64, 8)));
    }
}
