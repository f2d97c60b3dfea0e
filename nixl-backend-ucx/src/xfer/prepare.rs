//! Preparing transfers: segments (one put/get each) or a block table (a per-block put/get loop
//! over the layers and id runs, with nothing allocated per block).
//!
//! Linear with a small constant: each metadata of the spec is checked and its handle taken
//! once (a segment reads two handles from small tables, whatever order its regions come in);
//! the metadata kept alive is gathered once per distinct region.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use nixl_core::backend::{distinct_mds, downcast_md, BackendMd, BlockXferSpec, XferSpec};
use nixl_core::{Error, MemKind, Op, Result};

use crate::backend::UcxBackend;
use crate::endpoint::Peer;
use crate::memory::{mem_type, MemReg, RemoteMd};
use crate::sys;
use crate::work::{BlockLayer, Seg, Work};
use crate::xfer::UcxXfer;

/// The handles of a request's metadata, each checked once.
struct Handles<'a> {
    backend: &'a UcxBackend,
    peer: &'a Arc<Peer>,
    worker: usize,
    remote_type: Option<sys::ucs_memory_type_t>,
    mem_type: Option<sys::ucs_memory_type_t>,
}

impl<'a> Handles<'a> {
    fn new(
        backend: &'a UcxBackend,
        peer: &'a Arc<Peer>,
        worker: usize,
        remote: MemKind,
    ) -> Handles<'a> {
        Handles {
            backend,
            peer,
            worker,
            remote_type: mem_type(remote),
            mem_type: None,
        }
    }
}

/// Entry `i` of a table of checked handles (by the spec's metadata index), made by `make` the
/// first time.
#[inline]
fn memo<H: Copy>(table: &mut [Option<H>], i: usize, make: impl FnOnce() -> Result<H>) -> Result<H> {
    if let Some(Some(h)) = table.get(i) {
        return Ok(*h);
    }
    let h = make()?;
    if let Some(slot) = table.get_mut(i) {
        *slot = Some(h);
    }
    Ok(h)
}

impl Handles<'_> {
    fn check_local(&mut self, l: &BackendMd) -> Result<sys::MemH> {
        let me = self.backend.agent();
        let lr = downcast_md::<MemReg>(l)
            .ok_or_else(|| Error::invalid(me, Op::MakeXfer, "not UCX registration metadata"))?;
        if *self.mem_type.get_or_insert(lr.mem_type) != lr.mem_type {
            return Err(Error::mismatch(
                me,
                Op::MakeXfer,
                "local segments of different memory types",
            ));
        }
        Ok(lr.memh)
    }

    fn check_remote(&mut self, r: &BackendMd) -> Result<sys::Rkey> {
        let me = self.backend.agent();
        let rr = downcast_md::<RemoteMd>(r)
            .ok_or_else(|| Error::invalid(me, Op::MakeXfer, "remote metadata is not UCX's"))?;
        if self.remote_type != Some(rr.mem_type) {
            return Err(Error::mismatch(
                me,
                Op::MakeXfer,
                "remote region of another memory kind",
            ));
        }
        if !Arc::ptr_eq(&rr.peer, self.peer) {
            return Err(Error::mismatch(
                me,
                Op::MakeXfer,
                "segments reach different peers or connections",
            ));
        }
        Ok(rr.rkeys[self.worker])
    }
}

impl UcxBackend {
    /// Checks the kinds and the peer of a transfer and picks its worker.
    fn target(
        &self,
        kinds: [MemKind; 2],
        remote: &str,
        first_remote_md: Option<&BackendMd>,
    ) -> Result<(Arc<Peer>, usize)> {
        let me = self.agent();
        for k in kinds {
            if !nixl_core::backend::Backend::capabilities(self).supports(k) {
                return Err(Error::not_supported(
                    me,
                    Op::MakeXfer,
                    format!("UCX here does not move {k}"),
                ));
            }
        }
        let first =
            first_remote_md.ok_or_else(|| Error::invalid(me, Op::MakeXfer, "no segments"))?;
        let peer = downcast_md::<RemoteMd>(first)
            .ok_or_else(|| Error::invalid(me, Op::MakeXfer, "remote metadata is not UCX's"))?
            .peer
            .clone();
        if peer.name != remote {
            return Err(Error::mismatch(
                me,
                Op::MakeXfer,
                format!("remote metadata belongs to {}, not {remote}", peer.name),
            ));
        }
        let worker = self.next_worker.fetch_add(1, Ordering::Relaxed) % self.workers.len();
        Ok((peer, worker))
    }

    pub(crate) fn prepare_segments(&self, spec: &XferSpec) -> Result<UcxXfer> {
        let me = self.agent();
        let (peer, worker) = self.target(
            [spec.local_kind, spec.remote_kind],
            &spec.remote,
            spec.segments.first().and_then(|s| spec.md(s.remote_md)),
        )?;
        let mut h = Handles::new(self, &peer, worker, spec.remote_kind);
        // Each metadata of the spec checked once, its handle kept by index.
        let (mut memhs, mut rkeys) = (vec![None; spec.mds.len()], vec![None; spec.mds.len()]);
        let md = |i: usize| {
            spec.md(i)
                .ok_or_else(|| Error::invalid(me, Op::MakeXfer, "segment names no metadata"))
        };
        let mut segs = Vec::with_capacity(spec.segments.len());
        for s in &spec.segments {
            let memh = memo(&mut memhs, s.local_md, || h.check_local(md(s.local_md)?))?;
            let rkey = memo(&mut rkeys, s.remote_md, || h.check_remote(md(s.remote_md)?))?;
            if s.len == 0
                || s.local_addr.checked_add(s.len).is_none()
                || s.remote_addr.checked_add(s.len).is_none()
            {
                return Err(Error::invalid(
                    me,
                    Op::MakeXfer,
                    "empty or overflowing segment",
                ));
            }
            segs.push(Seg {
                local: s.local_addr,
                remote: s.remote_addr,
                len: s.len,
                memh,
                rkey,
            });
        }
        let mem_types = (h.mem_type, h.remote_type);
        let keep = spec.mds.clone();
        self.xfer(
            peer,
            worker,
            spec.op,
            mem_types,
            Work::Segs(segs),
            spec.notif.as_deref(),
            keep,
        )
    }

    pub(crate) fn prepare_block_table(&self, spec: &BlockXferSpec) -> Result<UcxXfer> {
        let (peer, worker) = self.target(
            [spec.local_kind, spec.remote_kind],
            &spec.remote,
            spec.layers.first().map(|l| &l.remote_md),
        )?;
        let mut h = Handles::new(self, &peer, worker, spec.remote_kind);
        let mut layers = Vec::with_capacity(spec.layers.len());
        for l in &spec.layers {
            // A layer per region pair, few of them: checked each.
            let (memh, rkey) = (h.check_local(&l.local_md)?, h.check_remote(&l.remote_md)?);
            layers.push(BlockLayer {
                local: l.local,
                remote: l.remote,
                dense: l.is_dense(),
                memh,
                rkey,
            });
        }
        let mem_types = (h.mem_type, h.remote_type);
        let keep = distinct_mds(spec.layers.iter().flat_map(|l| [&l.local_md, &l.remote_md]));
        let work = Work::Blocks {
            layers,
            runs: spec.runs.clone(),
            segments: spec.segment_count(),
        };
        self.xfer(
            peer,
            worker,
            spec.op,
            mem_types,
            work,
            spec.notif.as_deref(),
            keep,
        )
    }
}
