//! Preparing transfers: segments (one put/get each) or a block table (a per-block put/get loop
//! over the layers and id runs, with nothing allocated per block).
//!
//! Linear with a small constant. Where the spec's metadata are its two prepared lists' tables
//! ([`MdTable::lists`]), each list's handles are taken and checked once for every request
//! over it ([`LocalHandles`], [`RemoteHandles`], kept beside the table) and a request checks
//! only that the lists fit it; otherwise each metadata of the spec is checked and its handle
//! taken once per request. Either way a segment reads two handles from tables, whatever
//! order its regions come in.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use nixl_core::backend::{
    distinct_mds, downcast_md, BackendMd, BlockXferSpec, MdList, Segment, XferSpec,
};
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
        crate::reached::md_check();
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
        crate::reached::md_check();
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

/// The local and remote memory types of a transfer (`None`: not known).
type MemTypes = (
    Option<sys::ucs_memory_type_t>,
    Option<sys::ucs_memory_type_t>,
);

/// A prepared local list's handles, derived once from its table for every request over it:
/// each region's memory handle, and the memory type they share. `None` (a table that is not
/// all UCX registrations of one memory type) sends each request to the per-request checks.
struct LocalHandles {
    memhs: Vec<sys::MemH>,
    mem_type: sys::ucs_memory_type_t,
}

impl LocalHandles {
    fn derive(mds: &[BackendMd]) -> Option<LocalHandles> {
        let mut mem_type = None;
        let memhs = mds
            .iter()
            .map(|m| {
                crate::reached::md_check();
                let r = downcast_md::<MemReg>(m)?;
                (*mem_type.get_or_insert(r.mem_type) == r.mem_type).then_some(r.memh)
            })
            .collect::<Option<Vec<_>>>()?;
        Some(LocalHandles {
            memhs,
            mem_type: mem_type?,
        })
    }
}

/// A prepared remote list's handles, derived once from its table: each region's rkey on each
/// worker (`rkeys[region * workers + worker]`), the peer they all reach and their memory type.
/// `None` (not all UCX remote metadata of one peer and memory type) sends each request to the
/// per-request checks.
struct RemoteHandles {
    peer: Arc<Peer>,
    mem_type: sys::ucs_memory_type_t,
    workers: usize,
    rkeys: Vec<sys::Rkey>,
}

impl RemoteHandles {
    fn derive(mds: &[BackendMd], workers: usize) -> Option<RemoteHandles> {
        let first = downcast_md::<RemoteMd>(mds.first()?)?;
        let mut rkeys = Vec::with_capacity(mds.len() * workers);
        for m in mds {
            crate::reached::md_check();
            let r = downcast_md::<RemoteMd>(m)?;
            if !Arc::ptr_eq(&r.peer, &first.peer) || r.mem_type != first.mem_type {
                return None;
            }
            rkeys.extend_from_slice(r.rkeys.get(..workers)?);
        }
        Some(RemoteHandles {
            peer: first.peer.clone(),
            mem_type: first.mem_type,
            workers,
            rkeys,
        })
    }
}

impl UcxBackend {
    /// The spec's prepared lists' handles `(local, remote, remote base index)`, where its
    /// metadata are two lists' tables whose handles were derived and fit this transfer (the
    /// target's peer, the remote memory kind).
    fn list_handles<'s>(
        &self,
        spec: &'s XferSpec,
        peer: &Arc<Peer>,
    ) -> Option<(&'s LocalHandles, &'s RemoteHandles, usize)> {
        let (l, r): (&MdList, &MdList) = spec.mds.lists()?;
        let lh = l.derived(LocalHandles::derive)?.as_ref()?;
        let workers = self.workers.len();
        let rh = r
            .derived(|mds| RemoteHandles::derive(mds, workers))?
            .as_ref()?;
        let fits = Arc::ptr_eq(&rh.peer, peer)
            && rh.workers == workers
            && Some(rh.mem_type) == mem_type(spec.remote_kind);
        fits.then_some((lh, rh, l.mds().len()))
    }

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
        let (peer, worker) = self.target(
            [spec.local_kind, spec.remote_kind],
            &spec.remote,
            spec.segments.first().and_then(|s| spec.md(s.remote_md)),
        )?;
        let (segs, mem_types) = match self.list_handles(spec, &peer) {
            Some(handles) => self.segs_from_lists(spec, worker, handles)?,
            None => self.segs_checked(spec, &peer, worker)?,
        };
        self.xfer(
            peer,
            worker,
            spec.op,
            mem_types,
            Work::Segs(segs),
            spec.notif.as_deref(),
            spec.mds.clone(),
        )
    }

    /// The segments' put/gets with their handles read from the prepared lists' derived
    /// tables (checked once per list), and the two memory types.
    fn segs_from_lists(
        &self,
        spec: &XferSpec,
        worker: usize,
        (lh, rh, base): (&LocalHandles, &RemoteHandles, usize),
    ) -> Result<(Vec<Seg>, MemTypes)> {
        let me = self.agent();
        let bad = || Error::invalid(me, Op::MakeXfer, "segment names no metadata");
        let mut segs = Vec::with_capacity(spec.segments.len());
        for s in &spec.segments {
            let memh = *lh.memhs.get(s.local_md).ok_or_else(bad)?;
            let rkey = *s
                .remote_md
                .checked_sub(base)
                .and_then(|j| rh.rkeys.get(j * rh.workers + worker))
                .ok_or_else(bad)?;
            segs.push(seg(me, s, memh, rkey)?);
        }
        Ok((segs, (Some(lh.mem_type), Some(rh.mem_type))))
    }

    /// The segments' put/gets with each metadata of the spec checked once for this request,
    /// its handle kept by index, and the two memory types.
    fn segs_checked(
        &self,
        spec: &XferSpec,
        peer: &Arc<Peer>,
        worker: usize,
    ) -> Result<(Vec<Seg>, MemTypes)> {
        let me = self.agent();
        let mut h = Handles::new(self, peer, worker, spec.remote_kind);
        let (mut memhs, mut rkeys) = (vec![None; spec.mds.len()], vec![None; spec.mds.len()]);
        let md = |i: usize| {
            spec.md(i)
                .ok_or_else(|| Error::invalid(me, Op::MakeXfer, "segment names no metadata"))
        };
        let mut segs = Vec::with_capacity(spec.segments.len());
        for s in &spec.segments {
            let memh = memo(&mut memhs, s.local_md, || h.check_local(md(s.local_md)?))?;
            let rkey = memo(&mut rkeys, s.remote_md, || h.check_remote(md(s.remote_md)?))?;
            segs.push(seg(me, s, memh, rkey)?);
        }
        Ok((segs, (h.mem_type, h.remote_type)))
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
        let keep =
            distinct_mds(spec.layers.iter().flat_map(|l| [&l.local_md, &l.remote_md])).into();
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

/// Segment `s`'s put/get with its handles; refused where it is empty or overflows.
#[inline]
fn seg(me: &str, s: &Segment, memh: sys::MemH, rkey: sys::Rkey) -> Result<Seg> {
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
    Ok(Seg {
        local: s.local_addr,
        remote: s.remote_addr,
        len: s.len,
        memh,
        rkey,
    })
}
