//! Preparing transfers: segments (one put/get each) or a block table (a per-block put/get loop
//! over the layers and id runs, with nothing allocated per block).
//!
//! Linear with a small constant: a segment whose metadata is the previous segment's (the
//! usual case: neighbours share a region) reuses its checked handles; the metadata kept alive
//! is gathered once per distinct region.

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

/// The handles of a (local, remote) metadata pair, checked once per distinct pair.
struct Handles<'a> {
    backend: &'a UcxBackend,
    peer: &'a Arc<Peer>,
    worker: usize,
    remote_type: Option<sys::ucs_memory_type_t>,
    mem_type: Option<sys::ucs_memory_type_t>,
    last: Option<(*const (), *const (), sys::MemH, sys::Rkey)>,
}

impl Handles<'_> {
    fn resolve(&mut self, l: &BackendMd, r: &BackendMd) -> Result<(sys::MemH, sys::Rkey)> {
        let key = (Arc::as_ptr(l) as *const (), Arc::as_ptr(r) as *const ());
        if let Some((a, b, memh, rkey)) = self.last {
            if (a, b) == key {
                return Ok((memh, rkey));
            }
        }
        let me = self.backend.agent();
        let lr = downcast_md::<MemReg>(l)
            .ok_or_else(|| Error::invalid(me, Op::MakeXfer, "not UCX registration metadata"))?;
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
        if *self.mem_type.get_or_insert(lr.mem_type) != lr.mem_type {
            return Err(Error::mismatch(
                me,
                Op::MakeXfer,
                "local segments of different memory types",
            ));
        }
        let rkey = rr.rkeys[self.worker];
        self.last = Some((key.0, key.1, lr.memh, rkey));
        Ok((lr.memh, rkey))
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
        let mut h = Handles {
            backend: self,
            peer: &peer,
            worker,
            remote_type: mem_type(spec.remote_kind),
            mem_type: None,
            last: None,
        };
        let mut segs = Vec::with_capacity(spec.segments.len());
        let vanished = || Error::invalid(me, Op::MakeXfer, "segment names no metadata");
        for s in &spec.segments {
            let (l, r) = (spec.md(s.local_md), spec.md(s.remote_md));
            let (memh, rkey) = h.resolve(l.ok_or_else(vanished)?, r.ok_or_else(vanished)?)?;
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
        let mem_type = h.mem_type;
        let keep = spec.mds.clone();
        self.xfer(
            peer,
            worker,
            spec.op,
            mem_type,
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
        let mut h = Handles {
            backend: self,
            peer: &peer,
            worker,
            remote_type: mem_type(spec.remote_kind),
            mem_type: None,
            last: None,
        };
        let mut layers = Vec::with_capacity(spec.layers.len());
        for l in &spec.layers {
            let (memh, rkey) = h.resolve(&l.local_md, &l.remote_md)?;
            layers.push(BlockLayer {
                local: l.local,
                remote: l.remote,
                dense: l.is_dense(),
                memh,
                rkey,
            });
        }
        let mem_type = h.mem_type;
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
            mem_type,
            work,
            spec.notif.as_deref(),
            keep,
        )
    }
}
