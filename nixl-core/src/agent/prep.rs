//! Prepared lists: descriptors, or the layers of a block table, resolved once against
//! registrations (NIXL's `prepXferDlist`).
//!
//! Costs are linear with a small constant: a descriptor that falls in a region this call already
//! found reuses it without a look-up in the agent's tables (exactly: only where no other region
//! could be the answer, see `RegionIndex::find_bounded`), each distinct region is resolved and
//! its backend metadata gathered once, and a descriptor costs one small entry. A block table
//! costs one look-up per layer, whatever its block count.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::agent::post::first_overlap;
use crate::agent::registration::RegUse;
use crate::agent::remote::{RemotePeer, RemoteRegion};
use crate::agent::request::XferTarget;
use crate::agent::{Agent, BackendHandle, BackendSlot, Shared};
use crate::backend::{BackendMd, CellGrid, MdList};
use crate::desc::{Desc, XferDescList};
use crate::error::{Error, Op, Result};
use crate::mem::MemKind;
use crate::strided::{StridedDesc, StridedDescList};

/// What keeps a prepared region's memory valid.
enum Hold {
    Local(#[allow(dead_code)] RegUse),
    Remote(#[allow(dead_code)] Arc<RemoteRegion>),
}

/// A region a prepared list names, with the selected backends' metadata of it.
pub(crate) struct PrepRegion {
    /// (backend slot id, metadata)
    pub mds: Vec<(usize, BackendMd)>,
    /// The slot ids in `mds` as bits (`1 << id`); `None` where one is 64 or more. A request
    /// intersects its pairs' sets in one AND each instead of searching `mds` per backend.
    pub held: Option<u64>,
    /// The region: (address, length, device).
    pub span: (u64, u64, u64),
    _hold: Hold,
}

impl PrepRegion {
    /// Whether `[addr, addr + len)` on `dev` lies inside the region.
    pub(crate) fn covers(&self, addr: u64, len: u64, dev: u64) -> bool {
        let (a, n, d) = self.span;
        d == dev
            && addr >= a
            && addr
                .checked_add(len)
                .is_some_and(|e| e <= a.saturating_add(n))
    }
}

impl PrepRegion {
    /// The metadata of backend slot `slot`.
    pub(crate) fn md(&self, slot: usize) -> Option<&BackendMd> {
        crate::work::tick(self.mds.len());
        self.mds.iter().find(|(id, _)| *id == slot).map(|(_, m)| m)
    }
}

/// The regions of a prepared list; requests built from the list hold it.
pub(crate) type Regions = Arc<Vec<PrepRegion>>;

/// One prepared descriptor: the descriptor, the index of its region and that region's
/// backends as bits ([`PrepRegion::held`], 0 where it is `None` or names a slot of 32 or
/// more): a request reads the entry alone, not its region, for each pair (the region is
/// another cache miss per pair when the indices are random over many regions). 32 bytes.
#[derive(Clone, Copy)]
pub(crate) struct PrepEntry {
    pub desc: Desc,
    pub region: u32,
    pub held: u32,
}

impl PrepRegion {
    /// [`PrepRegion::held`] as an entry carries it.
    pub(crate) fn entry_held(&self) -> u32 {
        self.held.and_then(|h| u32::try_from(h).ok()).unwrap_or(0)
    }
}

/// One prepared layer of a block table.
#[derive(Clone, Copy)]
pub(crate) struct PrepLayer {
    pub run: StridedDesc,
    pub region: u32,
}

/// A descriptor list that is a block table in disguise (NIXL users' shape: one descriptor per
/// layer and block, layer after layer): layers of `per` blocks each, every layer an
/// arithmetic run of equal blocks inside one region. Found once at prepare time; requests by
/// index over two such lists whose indices name the same block ids in every layer they touch
/// are built as block-table requests ([`Agent::make_prepped_xfer`]).
pub(crate) struct FlatTable {
    pub layers: Vec<PrepLayer>,
    /// Blocks per layer.
    pub per: usize,
}

impl FlatTable {
    /// The table `entries` form, or `None` where they do not (fewer than two blocks per
    /// layer, layers of different counts, a run that changes region, device, length or step).
    /// One pass.
    fn of(entries: &[PrepEntry]) -> Option<Self> {
        let runs = table_runs(
            entries.len(),
            |i| entries[i].desc,
            |start, i| entries[i].region == entries[start].region,
        )?;
        let per = usize::try_from(runs.first()?.count).ok()?;
        let layers = runs
            .into_iter()
            .enumerate()
            .map(|(l, run)| PrepLayer {
                run,
                region: entries[l * per].region,
            })
            .collect();
        Some(FlatTable { layers, per })
    }
}

/// The layers `n` descriptors form when they are a block table: every layer the same count
/// (two or more) of equally long descriptors on one device, equally spaced, each descriptor
/// `together` with its layer's first (`together(first, i)`: in its region); layer 0 is as
/// long as its run goes on, every layer then has its length. `None` otherwise. Reads each
/// descriptor once and writes nothing per descriptor.
fn table_runs(
    n: usize,
    desc: impl Fn(usize) -> Desc,
    together: impl Fn(usize, usize) -> bool,
) -> Option<Vec<StridedDesc>> {
    let run_at = |i: usize| -> Option<StridedDesc> {
        if i + 1 >= n {
            return None;
        }
        let (a, b) = (desc(i), desc(i + 1));
        let stride = b.addr.checked_sub(a.addr)?;
        let run = StridedDesc::on_device(a.addr, stride, a.len, 2, a.dev_id);
        run.problem().is_none().then_some(run)
    };
    let fits = |run: &StridedDesc, start: usize, k: usize| {
        let d = desc(start + k);
        d.len == run.len
            && d.dev_id == run.dev_id
            && run.block_addr(k as u64) == Some(d.addr)
            && together(start, start + k)
    };
    let first = run_at(0)?;
    if !together(0, 1) {
        return None;
    }
    let per = 2 + (2..n).take_while(|&k| fits(&first, 0, k)).count();
    if !n.is_multiple_of(per) {
        return None;
    }
    let mut runs = Vec::with_capacity(n / per);
    for start in (0..n).step_by(per) {
        let mut run = run_at(start)?;
        // Layer 0's descriptors were read to find `per`.
        if start > 0 && !(0..per).all(|k| fits(&run, start, k)) {
            return None;
        }
        run.count = per as u64;
        run.problem().is_none().then_some(())?;
        runs.push(run);
    }
    Some(runs)
}

/// What a prepared list proves about its own bytes, decided when it is prepared (so a
/// request pays nothing for it): whether its descriptors are pairwise disjoint, and the span
/// of its regions on each device.
#[derive(Debug, Clone, Default)]
pub(crate) struct Footprint {
    /// No byte is named by two descriptors (on one device). `false` says nothing.
    pub disjoint: bool,
    /// Per device, `(device, lowest byte, one past the highest)` of the list's regions.
    pub bounds: Vec<(u64, u64, u64)>,
}

impl Footprint {
    /// The footprint of a list laid out as `layout` over `regions`: `O(descriptors +
    /// regions log regions)` (a pass where the descriptors come in address order, else one
    /// mark per block on a grid of the regions; block tables by their layers, with
    /// [`first_overlap`] as requests made from descriptor lists use it).
    pub(crate) fn of(layout: &Layout, regions: &[PrepRegion]) -> Self {
        let spans: Vec<(u64, u64, u64)> = regions.iter().map(|r| r.span).collect();
        let disjoint = match layout {
            Layout::Flat(entries) => {
                ordered_apart(entries.iter().map(|e| e.desc))
                    || grid_disjoint(entries.iter().map(|e| (e.desc, e.region as usize)), &spans)
            }
            // Blocks no longer than their stride (a layer's own are then disjoint), and the
            // layers' spans disjoint (layers that interleave answer `false`).
            Layout::Strided { layers, .. } => {
                let spans: Option<Vec<Desc>> = layers
                    .iter()
                    .map(|l| {
                        let r = l.run;
                        let fits = r.count <= 1 || r.len <= r.stride;
                        let end = r.end().filter(|_| fits)?;
                        Some(Desc::on_device(r.addr, end - r.addr, r.dev_id))
                    })
                    .collect();
                spans.is_some_and(|s| {
                    crate::work::tick(s.len());
                    first_overlap(&s).is_none()
                })
            }
        };
        Footprint {
            disjoint,
            bounds: bounds(&spans),
        }
    }

    /// Whether no region of one list shares a byte with a region of the other (by address,
    /// on one device): their spans per device do not meet. `false` says nothing.
    pub(crate) fn apart(&self, other: &Footprint) -> bool {
        self.bounds.iter().all(|&(d, lo, hi)| {
            other
                .bounds
                .iter()
                .all(|&(e, lo2, hi2)| d != e || hi <= lo2 || hi2 <= lo)
        })
    }
}

/// Per device, `(device, lowest byte, one past the highest)` of `(address, length, device)`
/// spans.
fn bounds(spans: &[(u64, u64, u64)]) -> Vec<(u64, u64, u64)> {
    crate::work::tick(spans.len());
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    for &(addr, len, dev) in spans {
        let end = addr.saturating_add(len);
        match out.iter_mut().find(|b| b.0 == dev) {
            Some(b) => *b = (dev, b.1.min(addr), b.2.max(end)),
            None => out.push((dev, addr, end)),
        }
    }
    out
}

/// Whether `descs` come sorted by device and address with no two sharing a byte: one pass
/// over neighbours (in that order a descriptor meeting any later one meets the next).
fn ordered_apart(descs: impl Iterator<Item = Desc> + Clone) -> bool {
    crate::work::tick(descs.clone().count());
    descs.clone().zip(descs.skip(1)).all(|(a, b)| {
        (a.dev_id, a.addr) <= (b.dev_id, b.addr)
            && (a.dev_id != b.dev_id || a.addr.saturating_add(a.len) <= b.addr)
    })
}

/// Cells of the regions' grid [`grid_disjoint`] may mark per descriptor (and at least
/// `GRID_MIN_CELLS` in all): regions much larger than the descriptors are left unproven.
const GRID_CELLS_PER_DESC: u64 = 64;
const GRID_MIN_CELLS: u64 = 1 << 16;

/// Whether no two of `entries` (a descriptor and the index of its region in `regions`,
/// `(address, length, device)` each, which contains it) share a byte, in any order and in
/// linear time: with `L` the shortest descriptor, every length a multiple of `L` and every
/// descriptor at a multiple of `L` from its region's start, each covers whole cells of length
/// `L` on its region's grid, and no cell is covered twice; the regions themselves pairwise
/// disjoint. `false` means "not proven".
fn grid_disjoint(
    entries: impl Iterator<Item = (Desc, usize)> + Clone,
    regions: &[(u64, u64, u64)],
) -> bool {
    let Some(cell) = entries.clone().map(|(d, _)| d.len).min().filter(|&c| c > 0) else {
        return true;
    };
    let n = entries.clone().count() as u64;
    let most = GRID_MIN_CELLS.max(n.saturating_mul(GRID_CELLS_PER_DESC));
    let Some(mut grid) = CellGrid::new(cell, regions.iter().map(|r| r.1), most) else {
        return false;
    };
    let spans: Vec<Desc> = regions
        .iter()
        .map(|&(a, l, d)| Desc::on_device(a, l, d))
        .collect();
    crate::work::tick(spans.len());
    if first_overlap(&spans).is_some() {
        return false;
    }
    crate::work::tick(n as usize);
    entries.into_iter().all(|(d, r)| {
        regions
            .get(r)
            .and_then(|&(start, _, _)| d.addr.checked_sub(start))
            .is_some_and(|off| grid.cover(r, off, d.len))
    })
}

/// A prepared list's descriptors.
pub(crate) enum Layout {
    /// One entry per descriptor.
    Flat(Vec<PrepEntry>),
    /// One entry per layer; `starts[l]` is the flat index of layer `l`'s block 0, and
    /// `uniform` the block count when every layer has the same (an O(1) index look-up).
    Strided {
        layers: Vec<PrepLayer>,
        starts: Vec<u64>,
        uniform: Option<u64>,
        total: u64,
        /// A descriptor list kept as the block table it is ([`Agent::prep_xfer_dlist`]): to
        /// the caller still a descriptor list (no layers; block ids and tiles refused).
        from_descs: bool,
    },
}

pub(crate) enum Side {
    Initiator,
    SelfTarget,
    Remote(Arc<RemotePeer>),
}

/// A descriptor list (or block table) resolved once against registrations (NIXL's
/// `nixlDlistH`).
#[must_use = "a prepared list is only useful to build requests from"]
pub struct PreparedList {
    pub(crate) shared: Arc<Shared>,
    pub(crate) side: Side,
    pub(crate) kind: MemKind,
    pub(crate) regions: Regions,
    /// Each backend's metadata of every region, in region order, for the backends that hold
    /// all of them (by slot id): a request over the list shares these instead of cloning
    /// each region's metadata.
    pub(crate) md_tables: MdTables,
    pub(crate) layout: Layout,
    /// A descriptor list's block-table form, where it has one.
    pub(crate) table: Option<FlatTable>,
    /// What the list proves about its own bytes ([`Footprint`]).
    pub(crate) footprint: Footprint,
}

/// [`PreparedList::md_tables`].
pub(crate) type MdTables = Vec<(usize, Arc<MdList>)>;

/// The metadata tables of `regions`: one per backend that holds every region.
fn md_tables(regions: &[PrepRegion]) -> MdTables {
    let Some(first) = regions.first() else {
        return Vec::new();
    };
    crate::work::tick(regions.len() * first.mds.len());
    first
        .mds
        .iter()
        .filter_map(|&(slot, _)| {
            let all: Option<Vec<BackendMd>> = regions.iter().map(|r| r.md(slot).cloned()).collect();
            all.map(|v| (slot, Arc::new(MdList::new(v))))
        })
        .collect()
}

impl std::fmt::Debug for PreparedList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedList")
            .field("kind", &self.kind)
            .field("len", &self.len())
            .field("layers", &self.layers())
            .finish()
    }
}

impl PreparedList {
    /// Whether no byte is named by two of the list's descriptors (on one device), decided
    /// when the list was prepared ([`Footprint`]). A request whose destination indices are
    /// distinct over such a list writes no byte twice, which spares a backend its own proof.
    pub(crate) fn entries_disjoint(&self) -> bool {
        self.footprint.disjoint
    }

    /// Whether no region of this list shares a byte with a region of `other` (by address,
    /// on one device; [`Footprint::apart`]): `O(devices)`.
    pub(crate) fn regions_apart(&self, other: &PreparedList) -> bool {
        self.footprint.apart(&other.footprint)
    }

    /// Backend slot `slot`'s metadata of every region, if it holds them all.
    pub(crate) fn md_table(&self, slot: usize) -> Option<&Arc<MdList>> {
        self.md_tables
            .iter()
            .find(|(id, _)| *id == slot)
            .map(|(_, t)| t)
    }

    /// Number of descriptors (for a block table: blocks over all layers).
    pub fn len(&self) -> usize {
        match &self.layout {
            Layout::Flat(e) => e.len(),
            Layout::Strided { total, .. } => usize::try_from(*total).unwrap_or(usize::MAX),
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Layers of a block table ([`Agent::prep_strided_dlist`]); 0 for a descriptor list.
    pub fn layers(&self) -> usize {
        self.table_layers().map_or(0, <[PrepLayer]>::len)
    }

    /// The layers of a list prepared from a block table ([`Agent::prep_strided_dlist`]);
    /// `None` for a descriptor list, also one kept as the table it is.
    pub(crate) fn table_layers(&self) -> Option<&[PrepLayer]> {
        match &self.layout {
            Layout::Strided {
                layers,
                from_descs: false,
                ..
            } => Some(layers),
            _ => None,
        }
    }

    /// The memory kind.
    pub fn kind(&self) -> MemKind {
        self.kind
    }

    /// The name of the agent whose memory it names (`None` for the initiator side).
    pub fn target(&self) -> Option<&str> {
        match &self.side {
            Side::Initiator => None,
            Side::SelfTarget => Some(&self.shared.name),
            Side::Remote(p) => Some(&p.name),
        }
    }

    /// Descriptor `i` and its region's index (a block table's blocks are numbered layer after
    /// layer, as in [`StridedDescList::to_desc_list`]).
    #[inline]
    pub(crate) fn block(&self, i: usize) -> Option<PrepEntry> {
        crate::work::tick(1);
        match &self.layout {
            Layout::Flat(e) => e.get(i).copied(),
            Layout::Strided {
                layers,
                starts,
                uniform,
                total,
                ..
            } => {
                let i = i as u64;
                if i >= *total {
                    return None;
                }
                let l = match uniform {
                    Some(c) => (i / c) as usize,
                    None => starts.partition_point(|&s| s <= i).checked_sub(1)?,
                };
                let layer = layers.get(l)?;
                Some(PrepEntry {
                    desc: layer.run.block(i - starts[l])?,
                    region: layer.region,
                    held: self.regions.get(layer.region as usize)?.entry_held(),
                })
            }
        }
    }
}

/// The region a look-up found, kept for the descriptors that follow.
#[derive(Clone, Copy)]
struct Cached {
    idx: u32,
    dev: u64,
    start: u64,
    end: u64,
    /// Below this address the look-up would find the same region (see `find_bounded`).
    bound: u64,
}

/// Resolves ranges to prepared regions, one look-up per run of ranges in one region.
struct Resolver<'a> {
    agent: &'a Agent,
    side: &'a Side,
    kind: MemKind,
    backends: Vec<Arc<BackendSlot>>,
    regions: Vec<PrepRegion>,
    known: HashMap<(u64, usize), u32>,
    /// The region of the previous range.
    last: Option<Cached>,
    /// Every region found so far, by (device, start): their `[start, bound)` spans do not
    /// overlap, so the one starting at or below an address is the only candidate.
    found: BTreeMap<(u64, u64), Cached>,
}

impl Resolver<'_> {
    /// The prepared region covering `[addr, addr + len)` on `dev`: `Ok(None)` where no
    /// registered (or loaded) region covers it.
    fn resolve(&mut self, what: &dyn Fn() -> String, d: Desc) -> Result<Option<u32>> {
        crate::work::tick(1);
        let end = d.addr.saturating_add(d.len);
        let hit =
            |c: &Cached| d.dev_id == c.dev && d.addr >= c.start && d.addr < c.bound && end <= c.end;
        if let Some(c) = self.last.filter(hit) {
            return Ok(Some(c.idx));
        }
        crate::work::tick(1);
        if let Some((_, c)) = self
            .found
            .range((d.dev_id, 0)..=(d.dev_id, d.addr))
            .next_back()
        {
            if hit(c) {
                self.last = Some(*c);
                return Ok(Some(c.idx));
            }
        }
        let me = self.agent.name();
        let (key, desc, found) = match self.side {
            Side::Remote(peer) => {
                let Some((r, bound)) = peer.find_bounded(self.kind, d.dev_id, d.addr, d.len) else {
                    return Ok(None);
                };
                let key = (Arc::as_ptr(&r) as *const () as u64, 0);
                (key, (r.desc.addr, r.desc.len, bound), Found::Remote(r))
            }
            Side::Initiator | Side::SelfTarget => {
                let Some((reg, i, bound)) = self
                    .agent
                    .shared
                    .regs
                    .lock()
                    .find_bounded(self.kind, d.dev_id, d.addr, d.len)
                else {
                    return Ok(None);
                };
                let r = &reg.regions[i].desc;
                ((reg.id, i), (r.addr, r.len, bound), Found::Local(reg, i))
            }
        };
        let idx = match self.known.get(&key) {
            Some(&idx) => idx,
            None => {
                let region = self.prepare(what, found)?;
                let idx = u32::try_from(self.regions.len()).map_err(|_| {
                    Error::invalid(me, Op::PrepXferDlist, "more than 2^32 regions in one list")
                })?;
                self.regions.push(region);
                self.known.insert(key, idx);
                idx
            }
        };
        let (start, len, bound) = desc;
        let c = Cached {
            idx,
            dev: d.dev_id,
            start,
            end: start.saturating_add(len),
            bound,
        };
        self.last = Some(c);
        self.found.insert((d.dev_id, start), c);
        Ok(Some(idx))
    }

    /// Gathers the selected backends' metadata of a newly found region.
    fn prepare(&self, what: &dyn Fn() -> String, found: Found) -> Result<PrepRegion> {
        let me = self.agent.name();
        let ids = self.backends.iter().map(|b| b.id);
        let (mds, hold, span) = match found {
            Found::Remote(r) => {
                let mds: Vec<(usize, BackendMd)> =
                    ids.filter_map(|id| r.md_for(id).map(|m| (id, m))).collect();
                let span = (r.desc.addr, r.desc.len, r.desc.dev_id);
                (mds, Hold::Remote(r), span)
            }
            Found::Local(reg, i) => {
                let region = &reg.regions[i];
                let span = (region.desc.addr, region.desc.len, region.desc.dev_id);
                let mut mds = Vec::new();
                for slot in &self.backends {
                    let Some(md) = region.md_for(slot.id) else {
                        continue;
                    };
                    let md = match self.side {
                        Side::SelfTarget if !slot.caps.local => continue,
                        Side::SelfTarget => slot.backend.load_local(&region.desc, &md)?,
                        _ => md,
                    };
                    mds.push((slot.id, md));
                }
                (mds, Hold::Local(RegUse::new(reg.clone())), span)
            }
        };
        if mds.is_empty() {
            return Err(Error::not_found(
                me,
                Op::PrepXferDlist,
                format!("{}: no selected backend holds that region", what()),
            ));
        }
        let held = mds.iter().try_fold(0u64, |acc, (id, _)| {
            u32::try_from(*id)
                .ok()
                .and_then(|b| 1u64.checked_shl(b))
                .map(|bit| acc | bit)
        });
        Ok(PrepRegion {
            mds,
            held,
            span,
            _hold: hold,
        })
    }
}

enum Found {
    Local(Arc<crate::agent::registration::RegInner>, usize),
    Remote(Arc<RemoteRegion>),
}

impl Agent {
    fn resolver<'a>(
        &'a self,
        side: &'a Side,
        kind: MemKind,
        hints: &[BackendHandle],
    ) -> Result<Resolver<'a>> {
        Ok(Resolver {
            agent: self,
            side,
            kind,
            backends: self.select_backends(Op::PrepXferDlist, hints)?,
            regions: Vec::new(),
            known: HashMap::new(),
            last: None,
            found: BTreeMap::new(),
        })
    }

    fn side(&self, target: XferTarget<'_>) -> Result<Side> {
        Ok(match target {
            XferTarget::Initiator => Side::Initiator,
            XferTarget::Agent(n) if n == self.name() => Side::SelfTarget,
            XferTarget::Agent(n) => Side::Remote(self.remote_peer(n, Op::PrepXferDlist)?),
        })
    }

    fn whose(&self, side: &Side) -> String {
        match side {
            Side::Remote(p) => format!("{}'s loaded regions", p.name),
            _ => "registered memory".to_owned(),
        }
    }

    /// Resolves descriptors once against registrations (NIXL's `prepXferDlist`).
    ///
    /// For [`XferTarget::Initiator`] and for the agent's own name they must lie inside this
    /// agent's registrations; for a peer, inside its loaded regions. `hints` narrows the
    /// backends considered. Linear in the descriptors (one region look-up per run of
    /// descriptors in one region).
    #[doc(alias = "prepXferDlist")]
    pub fn prep_xfer_dlist(
        &self,
        target: XferTarget<'_>,
        descs: &XferDescList,
        hints: &[BackendHandle],
    ) -> Result<PreparedList> {
        let me = self.name();
        let kind = descs.kind();
        let side = self.side(target)?;
        let whose = self.whose(&side);
        // A list that is a block table (NIXL users' shape: every block of each region, region
        // after region) is kept as its layers, each resolved once: no entry per descriptor.
        // Anything else, and any layer not inside one region, takes the descriptor path
        // (whose answers and errors are the same as before).
        let mut res = self.resolver(&side, kind, hints)?;
        let first = match descs.descs().first() {
            Some(d) if descs.len() >= 4 => match res.resolve(&|| String::new(), *d) {
                Ok(Some(_)) => res.last.map(|c| (c.bound, c.end)),
                _ => None,
            },
            _ => None,
        };
        let list = descs.descs();
        // Layer 0 ends where its run does, or where its first descriptor's region does (the
        // region a look-up finds below `bound`; later layers are resolved whole below).
        let runs = first.and_then(|(bound, end)| {
            let inside = |d: &Desc| d.addr < bound && d.end().is_some_and(|e| e <= end);
            table_runs(
                list.len(),
                |i| list[i],
                |start, i| start > 0 || inside(&list[i]),
            )
        });
        if let Some(runs) = runs {
            let mut layers = Vec::with_capacity(runs.len());
            for run in &runs {
                let end = run.end().unwrap_or(u64::MAX);
                let extent = Desc::on_device(run.addr, end - run.addr, run.dev_id);
                match res.resolve(&|| String::new(), extent) {
                    Ok(Some(region)) => layers.push(PrepLayer { run: *run, region }),
                    _ => break,
                }
            }
            if layers.len() == runs.len() {
                let per = runs[0].count;
                let regions = Arc::new(std::mem::take(&mut res.regions));
                drop(res);
                let table = usize::try_from(per).ok().map(|per| FlatTable {
                    layers: layers.clone(),
                    per,
                });
                let starts = (0..layers.len() as u64).map(|l| l * per).collect();
                let layout = Layout::Strided {
                    total: per * layers.len() as u64,
                    layers,
                    starts,
                    uniform: Some(per),
                    from_descs: true,
                };
                return Ok(self.prepared((side, kind), regions, layout, table));
            }
        }
        let mut res = self.resolver(&side, kind, hints)?;
        let mut entries = Vec::with_capacity(descs.len());
        for (i, d) in descs.descs().iter().enumerate() {
            if d.len == 0 || d.end().is_none() {
                return Err(Error::invalid(
                    me,
                    Op::PrepXferDlist,
                    format!("descriptor {i} is empty or overflows"),
                ));
            }
            let what = || format!("descriptor {i}");
            let region = res.resolve(&what, *d)?.ok_or_else(|| {
                Error::not_found(
                    me,
                    Op::PrepXferDlist,
                    format!(
                        "descriptor {i} ({kind} {:#x}+{} dev {}) in {whose}",
                        d.addr, d.len, d.dev_id
                    ),
                )
            })?;
            let held = res.regions[region as usize].entry_held();
            entries.push(PrepEntry {
                desc: *d,
                region,
                held,
            });
        }
        let regions = Arc::new(std::mem::take(&mut res.regions));
        drop(res);
        let table = FlatTable::of(&entries);
        Ok(self.prepared((side, kind), regions, Layout::Flat(entries), table))
    }

    /// The prepared list of `layout` over `regions`: their metadata tables and the list's
    /// [`Footprint`] made here, once.
    fn prepared(
        &self,
        (side, kind): (Side, MemKind),
        regions: Regions,
        layout: Layout,
        table: Option<FlatTable>,
    ) -> PreparedList {
        PreparedList {
            shared: self.shared.clone(),
            side,
            kind,
            md_tables: md_tables(&regions),
            footprint: Footprint::of(&layout, &regions),
            regions,
            layout,
            table,
        }
    }

    /// Resolves a block table once against registrations (NIXL 1.5's strided descriptor
    /// lists): O(layers), whatever the block count. Each layer must lie inside one registered
    /// (or, for a peer, loaded) region; a layer spread over several is refused with
    /// [`Error::NotFound`] (register the layer's memory as one region, or use a descriptor
    /// list). Malformed layers (no blocks, empty or overlapping blocks, overflowing ranges)
    /// are refused with [`Error::InvalidParam`]. Build requests from it by block ids with
    /// [`Agent::make_block_xfer`], or by flat index with [`Agent::make_prepped_xfer`] (block
    /// `i` of layer `l` is index `sum(counts of earlier layers) + i`).
    pub fn prep_strided_dlist(
        &self,
        target: XferTarget<'_>,
        table: &StridedDescList,
        hints: &[BackendHandle],
    ) -> Result<PreparedList> {
        let me = self.name();
        let kind = table.kind();
        if table.is_empty() {
            return Err(Error::invalid(
                me,
                Op::PrepXferDlist,
                "a block table with no layers",
            ));
        }
        let side = self.side(target)?;
        let whose = self.whose(&side);
        let mut res = self.resolver(&side, kind, hints)?;
        let mut layers = Vec::with_capacity(table.len());
        let mut starts = Vec::with_capacity(table.len());
        let mut total = 0u64;
        for (l, run) in table.descs().iter().enumerate() {
            if let Some(why) = run.problem() {
                return Err(Error::invalid(
                    me,
                    Op::PrepXferDlist,
                    format!("layer {l}: {why}"),
                ));
            }
            // `problem` checked that the range does not overflow.
            let end = run.end().unwrap_or(u64::MAX);
            let extent = Desc::on_device(run.addr, end - run.addr, run.dev_id);
            let what = || format!("layer {l}");
            let region = res.resolve(&what, extent)?.ok_or_else(|| {
                Error::not_found(
                    me,
                    Op::PrepXferDlist,
                    format!(
                        "layer {l} ({kind} {:#x}..{end:#x} dev {}) inside one region of {whose}",
                        run.addr, run.dev_id
                    ),
                )
            })?;
            layers.push(PrepLayer { run: *run, region });
            starts.push(total);
            total = total
                .checked_add(run.count)
                .ok_or_else(|| Error::invalid(me, Op::PrepXferDlist, "block count overflows"))?;
        }
        let first = layers[0].run.count;
        let uniform = layers.iter().all(|l| l.run.count == first).then_some(first);
        let regions = Arc::new(std::mem::take(&mut res.regions));
        drop(res);
        // Flat indices into layers of one count are what a flat list of the same blocks
        // would take: the same block-table form (`FlatTable::of` finds it for those).
        let table = uniform
            .filter(|&n| n >= 2)
            .and_then(|n| usize::try_from(n).ok())
            .map(|per| FlatTable {
                layers: layers.clone(),
                per,
            });
        let layout = Layout::Strided {
            layers,
            starts,
            uniform,
            total,
            from_descs: false,
        };
        Ok(self.prepared((side, kind), regions, layout, table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Whether two of `descs` share a byte on one device, pair by pair.
    fn overlap_by_pairs(descs: &[Desc]) -> bool {
        descs.iter().enumerate().any(|(i, a)| {
            descs[i + 1..]
                .iter()
                .any(|b| a.dev_id == b.dev_id && a.addr < b.addr + b.len && b.addr < a.addr + a.len)
        })
    }

    proptest! {
        /// The ordered pass proves only disjoint descriptors, and on sorted input all of them,
        /// on small addresses where overlaps are common and on two devices.
        #[test]
        fn the_ordered_pass_matches_the_pairwise_check(
            raw in proptest::collection::vec((0u64..64, 1u64..9, 0u64..2), 0..12),
            sort in any::<bool>(),
        ) {
            let mut descs: Vec<Desc> =
                raw.iter().map(|&(a, l, d)| Desc::on_device(a, l, d)).collect();
            if sort {
                descs.sort_unstable_by_key(|d| (d.dev_id, d.addr));
            }
            let proven = ordered_apart(descs.iter().copied());
            prop_assert!(!(proven && overlap_by_pairs(&descs)));
            if sort {
                prop_assert_eq!(proven, !overlap_by_pairs(&descs));
            }
        }
    }

    proptest! {
        /// Footprints are apart only where no span of one meets a span of the other.
        #[test]
        fn apart_footprints_share_no_byte(
            a in proptest::collection::vec((0u64..64, 1u64..9, 0u64..2), 0..8),
            b in proptest::collection::vec((0u64..64, 1u64..9, 0u64..2), 0..8),
        ) {
            let meets = a.iter().any(|&(x, n, d)| {
                b.iter().any(|&(y, m, e)| d == e && x < y + m && y < x + n)
            });
            let fp = |s: &[(u64, u64, u64)]| Footprint { disjoint: false, bounds: bounds(s) };
            if fp(&a).apart(&fp(&b)) {
                prop_assert!(!meets);
            }
        }

        /// The grid proof never calls overlapping descriptors disjoint, and proves blocks of
        /// one length at their offsets disjoint exactly when no two coincide.
        #[test]
        fn the_grid_proves_only_disjoint_descriptors(
            raw in proptest::collection::vec((0usize..3, 0u64..12, 1u64..4), 0..16),
            blocks in proptest::collection::vec((0usize..3, 0u64..12), 0..16),
        ) {
            // Three regions of 64 bytes, 64 apart; descriptors at multiples of 4 bytes.
            let regions: Vec<(u64, u64, u64)> = (0..3).map(|r| (r * 128, 64, 0)).collect();
            let at = |r: usize, k: u64, n: u64| (Desc::new(r as u64 * 128 + 4 * k, 4 * n), r);
            let any: Vec<(Desc, usize)> = raw.iter().map(|&(r, k, n)| at(r, k, n.min(16 - k))).collect();
            if grid_disjoint(any.iter().copied(), &regions) {
                let descs: Vec<Desc> = any.iter().map(|e| e.0).collect();
                prop_assert!(!overlap_by_pairs(&descs));
            }
            let one: Vec<(Desc, usize)> = blocks.iter().map(|&(r, k)| at(r, k, 1)).collect();
            let descs: Vec<Desc> = one.iter().map(|e| e.0).collect();
            prop_assert_eq!(grid_disjoint(one.iter().copied(), &regions), !overlap_by_pairs(&descs));
        }
    }

    #[test]
    fn the_grid_refuses_overlapping_regions_and_huge_ones() {
        let d = |a, l| (Desc::new(a, l), 0usize);
        // Disjoint blocks, but the list's two regions overlap: not proven.
        let overlapping = [(0u64, 64u64, 0u64), (32, 64, 0)];
        assert!(!grid_disjoint(
            [d(0, 8), (Desc::new(40, 8), 1)].into_iter(),
            &overlapping
        ));
        // A region far larger than its descriptors call for: left unproven.
        let huge = [(0u64, 1u64 << 40, 0u64)];
        assert!(!grid_disjoint([d(8, 8), d(0, 8)].into_iter(), &huge));
        // Out of order, disjoint, on one small region: proven.
        let small = [(0u64, 64u64, 0u64)];
        assert!(grid_disjoint([d(8, 8), d(0, 8)].into_iter(), &small));
        assert!(!grid_disjoint([d(8, 16), d(16, 8)].into_iter(), &small));
    }

    #[test]
    fn touching_descriptors_and_other_devices_are_disjoint() {
        let d = |a, l, dev| Desc::on_device(a, l, dev);
        assert!(ordered_apart([d(0, 8, 0), d(8, 8, 0)].into_iter()));
        // Out of order: not proven by the pass (the grid's to decide).
        assert!(!ordered_apart([d(8, 8, 0), d(0, 8, 0)].into_iter()));
        assert!(ordered_apart([d(0, 8, 0), d(0, 8, 1)].into_iter()));
        assert!(!ordered_apart([d(0, 9, 0), d(8, 8, 0)].into_iter()));
        // A long descriptor covering a later one past a short one between them.
        assert!(!ordered_apart(
            [d(0, 100, 0), d(10, 1, 0), d(50, 1, 0)].into_iter()
        ));
        assert!(ordered_apart(std::iter::empty()));
    }
}
