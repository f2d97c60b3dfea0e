//! Building requests from prepared lists by descriptor index (NIXL's `makeXferReq`); the
//! steps every request shares (checks of the lists, candidate backends, assembling the
//! request). Block-id requests over block tables are in `blocks`, tile requests in `tiles`.
//!
//! Linear in the pairs with a small constant: one pass resolves the indices, merges runs
//! contiguous on both sides and narrows the candidate backends (once per distinct pair of
//! regions); the chosen backend's segments are built once and handed over by reference; the
//! request holds its lists' region tables (two reference counts, not one per descriptor).

pub(crate) mod blocks;
mod tiles;

use std::sync::Arc;

use crate::agent::options::XferOptions;
use crate::agent::prep::{Layout, PrepEntry, PreparedList, Side};
use crate::agent::remote::RemotePeer;
use crate::agent::request::{IntegrityPlan, ReqParts, XferReq};
use crate::agent::spec::ReqSpec;
use crate::agent::{Agent, BackendSlot};
use crate::backend::{BackendXfer, MdTable, Segment, XferSpec};
use crate::desc::XferOp;
use crate::error::{Error, Op, Result};
use crate::mem::MemKind;

/// Pairs whose entries are read ahead together in `make_prepped_xfer`.
const GATHER: usize = 64;

/// Entries of the region -> metadata index cache of `build_spec`.
const MD_CACHE: usize = 64;

/// What both kinds of request check first.
#[derive(Clone)]
pub(crate) struct Ends {
    pub remote_name: String,
    pub remote_peer: Option<Arc<RemotePeer>>,
    pub is_local: bool,
    pub candidates: Vec<Arc<BackendSlot>>,
}

impl Agent {
    /// Checks the lists' owners and sides, the integrity option, and picks the backends that
    /// could carry the request (by capability; regions narrow them further).
    pub(crate) fn ends(
        &self,
        op: XferOp,
        local: &PreparedList,
        remote: &PreparedList,
        opts: &XferOptions,
    ) -> Result<Ends> {
        let me = self.name();
        if !Arc::ptr_eq(&local.shared, &self.shared) || !Arc::ptr_eq(&remote.shared, &self.shared) {
            return Err(Error::mismatch(
                me,
                Op::MakeXfer,
                "prepared list belongs to another agent",
            ));
        }
        if !matches!(local.side, Side::Initiator) {
            return Err(Error::invalid(
                me,
                Op::MakeXfer,
                "local list must be prepared for XferTarget::Initiator",
            ));
        }
        let (remote_name, remote_peer, is_local) = match &remote.side {
            Side::Initiator => {
                return Err(Error::invalid(
                    me,
                    Op::MakeXfer,
                    "remote list must be prepared for an agent",
                ))
            }
            Side::SelfTarget => (self.shared.name.clone(), None, true),
            Side::Remote(p) => (p.name.clone(), Some(p.clone()), false),
        };
        if let Some(id) = opts.lease {
            crate::agent::lease::check_held(&self.shared, &remote_name, id, Op::MakeXfer)?;
        }
        if opts.integrity {
            check_integrity(
                me,
                op,
                (local, remote),
                remote_peer.as_deref(),
                &remote_name,
            )?;
        }
        if let Some(n) = &opts.notif {
            crate::lease::check_user_notif(me, Op::MakeXfer, n)?;
        }
        let wants_notif = opts.notif.is_some() || opts.integrity;
        let candidates = self
            .select_backends(Op::MakeXfer, &opts.backends)?
            .into_iter()
            .filter(|b| {
                if is_local {
                    b.caps.local
                } else {
                    b.caps.remote
                }
            })
            .filter(|b| !wants_notif || b.caps.notifications)
            .collect();
        Ok(Ends {
            remote_name,
            remote_peer,
            is_local,
            candidates,
        })
    }

    /// Checks a block or tile request's arrival counters and keeps the backends that advance
    /// them; `NotSupported` when none does.
    pub(crate) fn arrival_ends(
        &self,
        op: XferOp,
        (local, layers): (&PreparedList, usize),
        ends: &mut Ends,
        opts: &XferOptions,
    ) -> Result<()> {
        let Some(a) = &opts.arrival else {
            return Ok(());
        };
        a.check(
            self.name(),
            (op == XferOp::Read, local.kind),
            layers,
            |addr, len, dev| local.regions.iter().any(|r| r.covers(addr, len, dev)),
        )?;
        ends.candidates.retain(|s| s.backend.supports_arrival());
        if ends.candidates.is_empty() {
            return Err(Error::not_supported(
                self.name(),
                Op::MakeXfer,
                "no backend of this request advances arrival counters (CUDA_IPC's copy kernel does)",
            ));
        }
        Ok(())
    }

    pub(crate) fn no_backend(
        &self,
        local: &PreparedList,
        remote: &PreparedList,
        e: &Ends,
        notif: bool,
    ) -> Error {
        Error::not_supported(
            self.name(),
            Op::MakeXfer,
            format!(
                "no backend can move {} -> {} to {}{}",
                local.kind,
                remote.kind,
                e.remote_name,
                if notif { " with a notification" } else { "" }
            ),
        )
    }

    /// Builds a request from prepared lists by descriptor index (NIXL's `makeXferReq`); runs
    /// that are contiguous on both sides (in one region each) are merged. Linear in the pairs.
    ///
    /// Lists in NIXL's usual shape (one descriptor per layer and block, layer after layer,
    /// each layer's blocks equally spaced in one region) indexed as `layer * blocks + id`
    /// with the same ids (four or more) in every layer named become a block-table request, as
    /// [`Agent::make_block_xfer`] would build it ([`XferReq::path`] then says `block table`):
    /// backends that consume strides get the layers and id runs, not one segment per
    /// descriptor. Any other shape, and any request that path refuses, is built from the
    /// descriptors.
    #[doc(alias = "makeXferReq")]
    pub fn make_prepped_xfer(
        &self,
        op: XferOp,
        local: &PreparedList,
        local_idx: &[usize],
        remote: &PreparedList,
        remote_idx: &[usize],
        opts: XferOptions,
    ) -> Result<XferReq> {
        let mut ends = self.ends(op, local, remote, &opts)?;
        // One counter for the whole request (a block table has one per layer).
        self.arrival_ends(op, (local, 1), &mut ends, &opts)?;
        self.check_pairing(local_idx, remote_idx)?;
        // Lists that are block tables in disguise, indexed as block ids in every layer: the
        // block-table path (O(layers + runs) for backends that consume strides). Anything it
        // refuses is decided below, in the lists' own terms.
        if let Some(x) =
            self.flat_as_table(op, (local, local_idx), (remote, remote_idx), &ends, &opts)
        {
            return Ok(x);
        }
        // Each destination descriptor is written once.
        let (side, dst, list) = match op {
            XferOp::Read => ("local", local_idx, local),
            XferOp::Write => ("remote", remote_idx, remote),
        };
        // Distinct destination indices over a list of disjoint descriptors: no byte written
        // twice (the backends need not prove it again).
        let (mut dst_disjoint, mut ends_apart) = (false, false);
        if distinct_in(self.name(), side, dst, list.len())? {
            dst_disjoint = list.entries_disjoint();
            // And where both sides share an address space: regions apart from the sources'.
            ends_apart = dst_disjoint && local.regions_apart(remote);
        }
        let segments = self.gather_segments(
            (local, local_idx),
            (remote, remote_idx),
            &mut ends,
            opts.no_merge,
        )?;
        if ends.candidates.is_empty() {
            return Err(self.no_backend(local, remote, &ends, opts.notif.is_some()));
        }
        let proof = (dst_disjoint, ends_apart);
        self.prepare_first(op, (local, remote), (segments, proof), ends, &opts)
    }

    /// Step 1 of [`Agent::make_prepped_xfer`]: as many local as remote indices, and some.
    fn check_pairing(&self, local_idx: &[usize], remote_idx: &[usize]) -> Result<()> {
        let me = self.name();
        if local_idx.len() != remote_idx.len() {
            return Err(Error::mismatch(
                me,
                Op::MakeXfer,
                format!(
                    "{} local and {} remote indices",
                    local_idx.len(),
                    remote_idx.len()
                ),
            ));
        }
        if local_idx.is_empty() {
            return Err(Error::invalid(me, Op::MakeXfer, "no descriptors"));
        }
        Ok(())
    }

    /// Step 2: the segments of the index pairs (contiguous runs merged unless `no_merge`),
    /// whose metadata fields hold the regions' indices in the two lists' region tables laid
    /// end to end (local, then remote: `remote_md` is `local.regions.len()` + the index);
    /// `build_spec` maps them to a backend's metadata. Narrows `ends.candidates` to the
    /// backends holding both regions of every pair.
    fn gather_segments(
        &self,
        (local, local_idx): (&PreparedList, &[usize]),
        (remote, remote_idx): (&PreparedList, &[usize]),
        ends: &mut Ends,
        no_merge: bool,
    ) -> Result<Vec<Segment>> {
        // Descriptor lists on both sides (the common case) get the loop with their entries
        // read straight from the slices; block tables compute theirs. One loop, two copies.
        match (&local.layout, &remote.layout) {
            (Layout::Flat(l), Layout::Flat(r)) => self.gather_with(
                (local, local_idx, flat(l)),
                (remote, remote_idx, flat(r)),
                ends,
                no_merge,
            ),
            _ => self.gather_with(
                (local, local_idx, |i| local.block(i)),
                (remote, remote_idx, |i| remote.block(i)),
                ends,
                no_merge,
            ),
        }
    }

    #[inline(always)]
    fn gather_with<L, R>(
        &self,
        (local, local_idx, lget): (&PreparedList, &[usize], L),
        (remote, remote_idx, rget): (&PreparedList, &[usize], R),
        ends: &mut Ends,
        no_merge: bool,
    ) -> Result<Vec<Segment>>
    where
        L: Fn(usize) -> Option<PrepEntry>,
        R: Fn(usize) -> Option<PrepEntry>,
    {
        let me = self.name();
        // A block table computes its entries: nothing to read ahead.
        let prefetch = matches!(
            (&local.layout, &remote.layout),
            (Layout::Flat(_), Layout::Flat(_))
        );
        let mut segments: Vec<Segment> = Vec::with_capacity(local_idx.len());
        let mut last_pair = None;
        let rbase = local.regions.len();
        // The backends holding both regions of every pair so far, as slot-id bits (`None`
        // once a region's set does not fit: then the candidates are narrowed pair by pair).
        let mut held: Option<u64> = Some(u64::MAX);
        // Indices are often random over large lists: each chunk's entries are first touched in
        // a tight loop (many cache misses in flight at once), then processed in order.
        for (c, (lc, rc)) in local_idx
            .chunks(GATHER)
            .zip(remote_idx.chunks(GATHER))
            .enumerate()
        {
            if prefetch {
                std::hint::black_box(touch(lc, &lget) ^ touch(rc, &rget));
            }
            for (j, (&li, &ri)) in lc.iter().zip(rc).enumerate() {
                let k = c * GATHER + j;
                let le = lget(li).ok_or_else(|| out_of_range(me, "local", local, li))?;
                let re = rget(ri).ok_or_else(|| out_of_range(me, "remote", remote, ri))?;
                let (l, lreg, r, rreg) = (le.desc, le.region, re.desc, re.region);
                if l.len != r.len {
                    return Err(Error::mismatch(
                        me,
                        Op::MakeXfer,
                        format!("pair {k}: local {} bytes, remote {} bytes", l.len, r.len),
                    ));
                }
                // A backend must hold both regions of every pair: one AND per pair from the
                // entries while every region's backends fit in bits (no region read).
                if let (Some(h), true) = (held, le.held != 0 && re.held != 0) {
                    held = Some(h & u64::from(le.held & re.held));
                } else if last_pair != Some((lreg, rreg)) {
                    let (lr, rr) = (
                        &local.regions[lreg as usize],
                        &remote.regions[rreg as usize],
                    );
                    held = match (held, lr.held, rr.held) {
                        (Some(h), Some(a), Some(b)) => Some(h & a & b),
                        _ => {
                            if let Some(h) = held.take() {
                                narrow(&mut ends.candidates, h);
                            }
                            crate::work::tick(ends.candidates.len());
                            ends.candidates
                                .retain(|b| lr.md(b.id).is_some() && rr.md(b.id).is_some());
                            None
                        }
                    };
                    last_pair = Some((lreg, rreg));
                }
                let seg = Segment {
                    local_addr: l.addr,
                    local_dev: l.dev_id,
                    local_md: lreg as usize,
                    remote_addr: r.addr,
                    remote_dev: r.dev_id,
                    remote_md: rbase + rreg as usize,
                    len: l.len,
                };
                if no_merge || !segments.last_mut().is_some_and(|p| extend(p, &seg)) {
                    segments.push(seg);
                }
            }
        }
        if let Some(h) = held {
            narrow(&mut ends.candidates, h);
        }
        Ok(segments)
    }

    /// Step 3: the first eligible backend (in preference order) that prepares the transfer
    /// makes the request; one that cannot reach these regions (`NotSupported`) yields to the
    /// next.
    fn prepare_first(
        &self,
        op: XferOp,
        (local, remote): (&PreparedList, &PreparedList),
        (mut segments, (dst_disjoint, ends_apart)): (Vec<Segment>, (bool, bool)),
        mut ends: Ends,
        opts: &XferOptions,
    ) -> Result<XferReq> {
        let me = self.name();
        let mut refusal = None;
        let candidates = std::mem::take(&mut ends.candidates);
        let last = candidates.len().saturating_sub(1);
        for (c, slot) in candidates.into_iter().enumerate() {
            // The last candidate takes the segments; earlier ones work on a copy.
            let segs = if c == last {
                std::mem::take(&mut segments)
            } else {
                segments.clone()
            };
            let mut spec = self.build_spec(&slot, op, (local, remote), segs, opts, &ends)?;
            (spec.dst_disjoint, spec.ends_apart) = (dst_disjoint, ends_apart);
            match slot.backend.prepare_xfer(&spec) {
                Ok(x) => {
                    return self.request(
                        slot,
                        x,
                        ReqSpec::Segments(spec),
                        (local, remote),
                        ends,
                        op,
                        opts,
                        None,
                    )
                }
                Err(e @ Error::NotSupported { .. }) => {
                    tracing::debug!(agent = %me, backend = %slot.name, error = %e, "backend declined the transfer");
                    refusal = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(refusal.unwrap_or_else(|| self.no_backend(local, remote, &ends, opts.notif.is_some())))
    }

    /// The spec for one candidate backend: `segments` name their regions by index in the two
    /// lists' region tables laid end to end. Where those tables are no larger than the request
    /// and the backend holds every region in them, `mds` is the tables' metadata in that order
    /// and the segments are used as they are (no pass over them). Else each index maps to the
    /// backend's metadata through a small direct-mapped cache, so a region's metadata is
    /// usually listed once (a cache conflict lists it again: harmless, and bounded by the
    /// segments).
    fn build_spec(
        &self,
        slot: &BackendSlot,
        op: XferOp,
        (local, remote): (&PreparedList, &PreparedList),
        mut segments: Vec<Segment>,
        opts: &XferOptions,
        ends: &Ends,
    ) -> Result<XferSpec> {
        let vanished = || Error::not_found(self.name(), Op::MakeXfer, "backend metadata vanished");
        let rbase = local.regions.len();
        let tables = rbase + remote.regions.len();
        if tables <= segments.len().saturating_mul(2) + MD_CACHE {
            // The lists' own tables, shared: no clone of each region's metadata.
            if let (Some(l), Some(r)) = (local.md_table(slot.id), remote.md_table(slot.id)) {
                let mds = MdTable::pair(l.clone(), r.clone());
                return Ok(self.spec(op, (local, remote), segments, mds, opts, ends));
            }
        }
        let mut mds = Vec::new();
        let mut lmap = [(usize::MAX, 0usize); MD_CACHE];
        let mut rmap = [(usize::MAX, 0usize); MD_CACHE];
        let mut index = |map: &mut [(usize, usize); MD_CACHE], list: &PreparedList, reg: usize| {
            let e = &mut map[reg % MD_CACHE];
            if e.0 != reg {
                let md = list
                    .regions
                    .get(reg)
                    .and_then(|r| r.md(slot.id))
                    .ok_or_else(vanished)?;
                *e = (reg, mds.len());
                mds.push(md.clone());
            }
            Ok::<usize, Error>(e.1)
        };
        crate::work::tick(segments.len());
        for s in &mut segments {
            s.local_md = index(&mut lmap, local, s.local_md)?;
            s.remote_md = index(&mut rmap, remote, s.remote_md - rbase)?;
        }
        Ok(self.spec(op, (local, remote), segments, mds.into(), opts, ends))
    }

    fn spec(
        &self,
        op: XferOp,
        (local, remote): (&PreparedList, &PreparedList),
        segments: Vec<Segment>,
        mds: MdTable,
        opts: &XferOptions,
        ends: &Ends,
    ) -> XferSpec {
        XferSpec {
            op,
            local_kind: local.kind,
            remote_kind: remote.kind,
            remote: ends.remote_name.clone(),
            is_local: ends.is_local,
            segments,
            mds,
            notif: if opts.integrity {
                None
            } else {
                opts.notif.clone()
            },
            arrival: opts.arrival,
            dst_disjoint: false,
            ends_apart: false,
        }
    }

    /// Assembles the request around the backend's prepared transfer.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn request(
        &self,
        slot: Arc<BackendSlot>,
        xfer: Box<dyn BackendXfer>,
        spec: ReqSpec,
        (local, remote): (&PreparedList, &PreparedList),
        ends: Ends,
        op: XferOp,
        opts: &XferOptions,
        note: Option<crate::agent::request::PathNote>,
    ) -> Result<XferReq> {
        if let Some(id) = opts.lease {
            crate::agent::lease::check_blocks(&self.shared, spec.remote(), id, &spec)?;
        }
        let integrity = opts.integrity.then(|| {
            let mut plan = IntegrityPlan {
                local: Vec::new(),
                remote: Vec::new(),
            };
            spec.for_each_segment(|s| {
                plan.local.push((s.0, s.3));
                plan.remote.push((s.2, s.1, s.3));
            });
            plan
        });
        Ok(XferReq::new(ReqParts {
            lease: opts.lease,
            shared: self.shared.clone(),
            op,
            backend: slot,
            xfer,
            remote: ends.remote_peer,
            spec,
            integrity,
            timeout: opts.timeout,
            notif: opts.notif.clone(),
            keep: [local.regions.clone(), remote.regions.clone()],
            note,
        }))
    }
}

/// Integrity frames: DRAM -> DRAM WRITEs to a nixl-rs target that verifies them.
fn check_integrity(
    me: &str,
    op: XferOp,
    (local, remote): (&PreparedList, &PreparedList),
    remote_peer: Option<&RemotePeer>,
    remote_name: &str,
) -> Result<()> {
    if op != XferOp::Write || local.kind != MemKind::Dram || remote.kind != MemKind::Dram {
        return Err(Error::not_supported(
            me,
            Op::MakeXfer,
            "integrity checking covers DRAM -> DRAM WRITE only",
        ));
    }
    match remote_peer {
        Some(p) if p.wire == crate::nixl_wire::Wire::Nixl => Err(Error::not_supported(
            me,
            Op::MakeXfer,
            "integrity checking needs a nixl-rs target; this peer speaks NIXL's wire",
        )),
        Some(p) if !p.verifies_integrity => Err(Error::not_supported(
            me,
            Op::MakeXfer,
            format!(
                "{remote_name} does not verify integrity frames (its AgentConfig::verify_integrity is off)"
            ),
        )),
        _ => Ok(()),
    }
}

/// Entry `i` of a prepared list and its region's index, or `InvalidParam`.
/// Keeps the candidates whose slot id is a bit of `held`.
fn narrow(candidates: &mut Vec<Arc<BackendSlot>>, held: u64) {
    crate::work::tick(candidates.len());
    candidates.retain(|b| {
        u32::try_from(b.id)
            .ok()
            .and_then(|s| 1u64.checked_shl(s))
            .is_some_and(|bit| held & bit != 0)
    });
}

/// A descriptor list's entry getter.
fn flat(l: &[PrepEntry]) -> impl Fn(usize) -> Option<PrepEntry> + '_ {
    move |i| {
        crate::work::tick(1);
        l.get(i).copied()
    }
}

/// Reads the entries of `idx` so their cache misses overlap; returns a value to keep the reads.
#[inline(always)]
fn touch(idx: &[usize], get: &impl Fn(usize) -> Option<PrepEntry>) -> u64 {
    idx.iter()
        .fold(0, |acc, &i| acc ^ get(i).map_or(0, |e| e.desc.len))
}

/// The error for index `i` outside a prepared list.
#[cold]
fn out_of_range(me: &str, side: &str, list: &PreparedList, i: usize) -> Error {
    Error::invalid(
        me,
        Op::MakeXfer,
        format!("{side} index {i} out of range ({})", list.len()),
    )
}

/// Extends `p` by `seg` when `seg` continues it on both sides (same regions and devices,
/// contiguous addresses); whether it did.
fn extend(p: &mut Segment, seg: &Segment) -> bool {
    let continues = p.local_md == seg.local_md
        && p.remote_md == seg.remote_md
        && p.local_dev == seg.local_dev
        && p.remote_dev == seg.remote_dev
        && p.local_addr.checked_add(p.len) == Some(seg.local_addr)
        && p.remote_addr.checked_add(p.len) == Some(seg.remote_addr);
    match p.len.checked_add(seg.len) {
        Some(n) if continues => {
            p.len = n;
            true
        }
        _ => false,
    }
}

/// Refuses an index (or block id) listed twice on a request's destination side
/// (`InvalidParam`): two sources would land in one place. O(ids) over a bitmap up to the
/// largest id, which the caller has bounded (a list's length, a layer's block count).
pub(crate) fn check_distinct(me: &str, side: &str, ids: &[usize]) -> Result<()> {
    let bound = ids.iter().copied().max().unwrap_or(0) + 1;
    match IdBits::distinct_below(ids, bound) {
        Err(Some(id)) => Err(listed_twice(me, side, id)),
        _ => Ok(()),
    }
}

/// The error for a destination index `id` listed twice.
#[cold]
fn listed_twice(me: &str, side: &str, id: usize) -> Error {
    Error::invalid(
        me,
        Op::MakeXfer,
        format!("{side} index {id} is listed twice: a request writes each destination once"),
    )
}

/// Whether the destination indices `ids` of a list of `len` descriptors are all inside it
/// (`false`: the caller names the first one outside), refusing one listed twice where they
/// are. A bitmap of the list's length, or of the largest index where the list is far longer
/// than the request (a few ids into a long list allocate for the ids, not the list); small
/// requests compare their ids pairwise.
fn distinct_in(me: &str, side: &str, ids: &[usize], len: usize) -> Result<bool> {
    if ids.len() <= PAIRWISE {
        if ids.iter().any(|&i| i >= len) {
            return Ok(false);
        }
        for (k, &id) in ids.iter().enumerate().skip(1) {
            if ids[..k].contains(&id) {
                return Err(listed_twice(me, side, id));
            }
        }
        return Ok(true);
    }
    let bound = if len / 64 > ids.len() {
        match ids.iter().copied().max() {
            Some(m) if m >= len => return Ok(false),
            m => m.map_or(0, |m| m + 1),
        }
    } else {
        len
    };
    match IdBits::distinct_below(ids, bound) {
        Ok(()) => Ok(true),
        Err(None) => Ok(false),
        Err(Some(id)) => Err(listed_twice(me, side, id)),
    }
}

/// Requests of at most this many descriptors check their destinations pairwise.
const PAIRWISE: usize = 16;

/// A set of ids below a bound, one bit each (the destination's ids of a request).
pub(crate) struct IdBits(Vec<u64>);

impl IdBits {
    /// An empty set for ids below `bound`.
    pub(crate) fn below(bound: usize) -> Self {
        IdBits(vec![0; bound.div_ceil(64)])
    }

    /// Adds `id` (below the bound); whether it was new.
    pub(crate) fn insert(&mut self, id: usize) -> bool {
        let (w, b) = (id / 64, 1u64 << (id % 64));
        let fresh = self.0[w] & b == 0;
        self.0[w] |= b;
        fresh
    }

    /// Whether `ids` are distinct and below `bound`: `Err(None)` where one is not below it,
    /// else `Err(Some(id))` for the first id listed a second time. One pass; the bitmap's
    /// current word is kept in a register, so consecutive ids (the usual destination slots)
    /// touch memory once per 64 and carry no dependency through it.
    pub(crate) fn distinct_below(
        ids: &[usize],
        bound: usize,
    ) -> std::result::Result<(), Option<usize>> {
        let mut seen = IdBits::below(bound);
        let mut twice = None;
        let (mut w, mut word) = (0usize, 0u64);
        for &id in ids {
            if id >= bound {
                return Err(None);
            }
            let (i, bit) = (id / 64, 1u64 << (id % 64));
            if i != w {
                seen.0[w] = word;
                (w, word) = (i, seen.0[i]);
            }
            if word & bit != 0 && twice.is_none() {
                twice = Some(id);
            }
            word |= bit;
        }
        twice.map_or(Ok(()), |id| Err(Some(id)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What the one-pass checks must answer: `Ok(false)` where an index is outside the list,
    /// else the first index (in order) seen before, else `Ok(true)`.
    fn model(ids: &[usize], len: usize) -> std::result::Result<bool, usize> {
        if ids.iter().any(|&i| i >= len) {
            return Ok(false);
        }
        let mut seen = std::collections::HashSet::new();
        match ids.iter().find(|&&i| !seen.insert(i)) {
            Some(&i) => Err(i),
            None => Ok(true),
        }
    }

    fn answer(ids: &[usize], len: usize) -> std::result::Result<bool, usize> {
        distinct_in("t", "remote", ids, len).map_err(|e| {
            let text = e.to_string();
            assert!(text.contains("listed twice"), "{text}");
            let id = text
                .split("remote index ")
                .nth(1)
                .and_then(|t| t.split(' ').next())
                .and_then(|t| t.parse().ok());
            id.unwrap_or(usize::MAX)
        })
    }

    proptest! {
        /// Short and long requests, into short and long lists (the pairwise, list-sized and
        /// largest-index bitmaps), consecutive runs and scattered ids alike, name the same
        /// first repeat and the same out-of-range verdict as the model.
        #[test]
        fn distinct_in_matches_the_model(
            ids in proptest::collection::vec(0usize..300, 0..200),
            run in 0usize..150,
            len in prop_oneof![Just(256usize), Just(300), Just(100_000), 1usize..400],
        ) {
            // A consecutive run first (the usual destination slots), then the drawn ids.
            let all: Vec<usize> = (0..run).chain(ids).collect();
            prop_assert_eq!(answer(&all, len), model(&all, len));
            let tail = &all[all.len().saturating_sub(10)..];
            prop_assert_eq!(answer(tail, len), model(tail, len));
        }
    }

    #[test]
    fn a_repeat_across_a_word_is_found() {
        // 0..64 fills word 0 in a register; 64 moves to word 1; 5 comes back to word 0.
        let ids: Vec<usize> = (0..65).chain([5]).collect();
        assert_eq!(IdBits::distinct_below(&ids, 128), Err(Some(5)));
        assert_eq!(IdBits::distinct_below(&ids[..65], 128), Ok(()));
        assert_eq!(IdBits::distinct_below(&[3, 200], 128), Err(None));
        assert_eq!(IdBits::distinct_below(&[], 0), Ok(()));
    }
}
