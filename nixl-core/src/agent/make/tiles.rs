//! Building tile requests ([`Agent::make_tile_xfer`]): the tiles' own checks, then the block
//! table path ([`Agent::make_block_xfer`]'s), with each tile's rows rearranged on the way; and
//! a KV plan's requests ([`Agent::make_kv_xfers`]), pieces and tiles alike.

use crate::agent::options::XferOptions;
use crate::agent::prep::{PrepLayer, PreparedList};
use crate::agent::request::{XferReq, XferTarget};
use crate::agent::Agent;
use crate::desc::XferOp;
use crate::error::{Error, Op, Result};
use crate::kv::{KvMoves, KvXferPlan};
use crate::strided::tile_runs;
use crate::tiles::{Tile, TileShape};

/// The most tiles of a request over all layers (the copy kernel indexes them in 32 bits).
pub(crate) const MAX_TILE_ITEMS: u64 = u32::MAX as u64;

impl Agent {
    /// Builds a request that moves tiles between two block tables
    /// ([`Agent::prep_strided_dlist`]) with their rows rearranged on the way ([`TileShape`]):
    /// in every layer `l`, for every tile, row `(a, b)` of the tile in local layer `l`'s block
    /// `local_block` at `local_offset` and row `(a, b)` of the tile in remote layer `l`'s block
    /// `remote_block` at `remote_offset` are each other's source and destination (READ: remote
    /// to local; WRITE: local to remote). The KV planner ([`KvLayout::plan_read`](crate::KvLayout::plan_read))
    /// makes such requests for an HND <-> NHD permute, so the data lands in the destination's
    /// layout in one pass.
    ///
    /// Only backends that can rearrange bytes take it (`CUDA_IPC`'s copy kernel between GPUs,
    /// `INPROC`); with none, the request is refused with [`Error::NotSupported`] naming the
    /// transform. Refused with [`Error::InvalidParam`] for lists that are not block tables, a
    /// malformed shape ([`TileShape::problem`]), no tiles or too many, a tile past its block
    /// in some layer, two tiles writing the same bytes (or, on one agent, a destination
    /// meeting a source), integrity checking; with [`Error::Mismatch`] for different layer
    /// counts. Nothing is kept on refusal.
    pub fn make_tile_xfer(
        &self,
        op: XferOp,
        local: &PreparedList,
        remote: &PreparedList,
        shape: &TileShape,
        tiles: &[Tile],
        opts: XferOptions,
    ) -> Result<XferReq> {
        let me = self.name();
        let invalid = |why: String| Error::invalid(me, Op::MakeXfer, why);
        let ends = self.ends(op, local, remote, &opts)?;
        let (Some(ll), Some(rl)) = (local.table_layers(), remote.table_layers()) else {
            return Err(invalid(
                "tiles need lists prepared from block tables (prep_strided_dlist)".to_owned(),
            ));
        };
        if ll.len() != rl.len() {
            return Err(Error::mismatch(
                me,
                Op::MakeXfer,
                format!("{} local and {} remote layers", ll.len(), rl.len()),
            ));
        }
        check_request(me, op, shape, tiles, (ll, rl), ends.is_local, &opts)?;
        let runs = tile_runs(tiles, !opts.no_merge);
        self.make_table(
            op,
            (local, remote),
            (ll, rl),
            ends,
            runs,
            Some(*shape),
            opts,
        )
    }
}

impl Agent {
    /// The requests of a KV plan ([`KvLayout::plan`](crate::KvLayout::plan)), one per
    /// transfer, in the plan's order, each with `opts` (a notification in it goes with each):
    /// pieces through [`Agent::create_xfer_req`], tiles through [`Agent::make_tile_xfer`] over
    /// this rank's and the peer's block tables (prepared here, O(layers) each). Every peer's
    /// metadata must be loaded. All or nothing: the first refusal is returned and no request
    /// is kept.
    pub fn make_kv_xfers(&self, plan: &KvXferPlan, opts: &XferOptions) -> Result<Vec<XferReq>> {
        let mut local = None;
        let mut reqs = Vec::with_capacity(plan.transfers.len());
        for t in &plan.transfers {
            let req = match &t.moves {
                KvMoves::Pieces { local, remote } => {
                    self.create_xfer_req(plan.op, local, remote, &t.peer, opts.clone())?
                }
                KvMoves::Tiles {
                    remote_table,
                    shape,
                    tiles,
                } => {
                    let mine = match &local {
                        Some(l) => l,
                        None => local.insert(self.prep_strided_dlist(
                            XferTarget::Initiator,
                            &plan.local_table,
                            &[],
                        )?),
                    };
                    let theirs =
                        self.prep_strided_dlist(XferTarget::Agent(&t.peer), remote_table, &[])?;
                    self.make_tile_xfer(plan.op, mine, &theirs, shape, tiles, opts.clone())?
                }
            };
            reqs.push(req);
        }
        Ok(reqs)
    }
}

/// The request's own checks: shape, integrity, tile count, every tile inside its blocks, and
/// destinations written once.
fn check_request(
    me: &str,
    op: XferOp,
    shape: &TileShape,
    tiles: &[Tile],
    (ll, rl): (&[PrepLayer], &[PrepLayer]),
    is_local: bool,
    opts: &XferOptions,
) -> Result<()> {
    let invalid = |why: String| Error::invalid(me, Op::MakeXfer, why);
    if let Some(why) = shape.problem() {
        return Err(invalid(format!("tile shape: {why}")));
    }
    if opts.integrity {
        return Err(Error::not_supported(
            me,
            Op::MakeXfer,
            "integrity checking covers plain DRAM -> DRAM WRITEs, not tile transfers",
        ));
    }
    if tiles.is_empty() {
        return Err(invalid("no tiles".to_owned()));
    }
    let items = (ll.len() as u64).saturating_mul(tiles.len() as u64);
    if items > MAX_TILE_ITEMS {
        return Err(invalid(format!(
            "{} layers x {} tiles exceed {MAX_TILE_ITEMS} tiles per request",
            ll.len(),
            tiles.len()
        )));
    }
    check_tiles(shape, tiles, ll, rl).map_err(invalid)?;
    let dst_local = op == XferOp::Read;
    check_destinations(shape, tiles, ll, rl, dst_local, is_local).map_err(invalid)?;
    Ok(())
}

/// Every tile's blocks exist in every layer and the tile lies inside its block on both sides:
/// checked against the smallest layer of each side, O(tiles + layers).
fn check_tiles(
    shape: &TileShape,
    tiles: &[Tile],
    ll: &[PrepLayer],
    rl: &[PrepLayer],
) -> std::result::Result<(), String> {
    crate::work::tick(tiles.len() + ll.len());
    for (side, layers, strides) in [("local", ll, &shape.local), ("remote", rl, &shape.remote)] {
        let count = layers.iter().map(|l| l.run.count).min().unwrap_or(0);
        let len = layers.iter().map(|l| l.run.len).min().unwrap_or(0);
        let extent = shape.extent(strides).unwrap_or(u64::MAX);
        for (i, t) in tiles.iter().enumerate() {
            let (block, offset) = if side == "local" {
                (t.local_block, t.local_offset)
            } else {
                (t.remote_block, t.remote_offset)
            };
            if block >= count {
                return Err(format!(
                    "tile {i}: {side} block {block} out of range (a layer has {count} blocks)"
                ));
            }
            if offset.checked_add(extent).is_none_or(|end| end > len) {
                return Err(format!(
                    "tile {i}: {side} rows at offset {offset} (extent {extent}) pass the end of a block of {len} bytes"
                ));
            }
        }
    }
    Ok(())
}

/// No two destination tiles share a byte, and (on one agent, where both sides are this
/// process's memory) no destination meets a source: conservative (tiles' extents, not their
/// rows, are compared), O(n log n) in layers x tiles.
fn check_destinations(
    shape: &TileShape,
    tiles: &[Tile],
    ll: &[PrepLayer],
    rl: &[PrepLayer],
    dst_local: bool,
    is_local: bool,
) -> std::result::Result<(), String> {
    let (dl, sl) = if dst_local { (ll, rl) } else { (rl, ll) };
    let (ds, ss) = if dst_local {
        (&shape.local, &shape.remote)
    } else {
        (&shape.remote, &shape.local)
    };
    let (dext, sext) = (
        shape.extent(ds).unwrap_or(u64::MAX),
        shape.extent(ss).unwrap_or(u64::MAX),
    );
    let place = |t: &Tile, dst: bool| {
        if dst == dst_local {
            (t.local_block, t.local_offset)
        } else {
            (t.remote_block, t.remote_offset)
        }
    };
    // (start, end, is destination, layer, tile)
    let mut ranges: Vec<(u64, u64, bool, usize, usize)> = Vec::new();
    let sides: &[(bool, &[PrepLayer], u64)] = if is_local {
        &[(true, dl, dext), (false, sl, sext)]
    } else {
        &[(true, dl, dext)]
    };
    crate::work::tick(ll.len() * tiles.len() * sides.len());
    for &(dst, layers, extent) in sides {
        for (l, layer) in layers.iter().enumerate() {
            for (i, t) in tiles.iter().enumerate() {
                let (block, offset) = place(t, dst);
                // In range: check_tiles bounded every block id and offset by the layer.
                let start = layer.run.addr + block * layer.run.stride + offset;
                ranges.push((start, start + extent, dst, l, i));
            }
        }
    }
    ranges.sort_unstable();
    // The furthest end so far and what reached it.
    let mut reach: Option<(u64, bool, usize, usize)> = None;
    for &(start, end, dst, l, i) in &ranges {
        if let Some((e, by_dst, pl, pi)) = reach {
            if start < e && (dst || by_dst) {
                let what = if dst && by_dst {
                    "write the same bytes"
                } else {
                    "overlap a destination with a source"
                };
                return Err(format!(
                    "tiles {pi} (layer {pl}) and {i} (layer {l}) {what}; each destination byte must be written once"
                ));
            }
        }
        if reach.is_none_or(|(e, ..)| end > e) {
            reach = Some((end, dst, l, i));
        }
    }
    Ok(())
}
