//! The planner's tile form: the same heads and tokens as the piece planner, as tiles whose rows
//! the transfer rearranges ([`Agent::make_tile_xfer`](crate::Agent::make_tile_xfer)), so two
//! sides in different orders (HND <-> NHD) land in one pass, with head slices and gathers in
//! the same copy.

use std::collections::BTreeMap;

use super::one::{Form, KvMoves};
use super::plan::head_segments;
use super::{KvLayout, KvOrder};
use crate::desc::XferOp;
use crate::error::Result;
use crate::strided::{StridedDesc, StridedDescList};
use crate::tiles::{RowStrides, Tile, TileShape};

/// One tile request of a rank to one peer: every tile has one shape (a peer gets one request
/// per shape it needs: full blocks, a request's last partial block, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvTileXfer {
    /// The peer's agent name.
    pub peer: String,
    /// How each tile's rows lie on this rank (`local`) and the peer (`remote`).
    pub shape: TileShape,
    /// The tiles, the same in every layer and tensor.
    pub tiles: Vec<Tile>,
    /// Bytes moved (all layers and tensors).
    pub bytes: u64,
}

/// What one rank posts for a request as tile transfers:
/// `agent.make_tile_xfer(plan.op, &mine, &theirs[peer], &t.shape, &t.tiles, ..)` for each,
/// where `mine` and `theirs` are the two sides' [`KvLayout::block_table`]s prepared with
/// `prep_strided_dlist`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvTilePlan {
    /// `Read` for [`KvLayout::plan_read_tiles`], `Write` for [`KvLayout::plan_write_tiles`].
    pub op: XferOp,
    /// Per peer (in the order given) and shape; peers with nothing to move are left out.
    pub transfers: Vec<KvTileXfer>,
}

impl KvTilePlan {
    /// Bytes the plan moves.
    pub fn bytes(&self) -> u64 {
        self.transfers.iter().map(|t| t.bytes).sum()
    }

    /// Tiles per layer and tensor over all transfers.
    pub fn tiles(&self) -> usize {
        self.transfers.iter().map(|t| t.tiles.len()).sum()
    }
}

/// Where row `(head i, token j)` of a tile lies in a block of `side`: strides per head and per
/// token, and the offset of head `h` (of the block's heads), token `t`.
fn strides(side: &KvLayout) -> RowStrides {
    let row = row_bytes(side);
    match side.order {
        KvOrder::Nhd => RowStrides::new(row, u64::from(side.kv_heads) * row),
        KvOrder::Hnd => RowStrides::new(u64::from(side.tokens_per_block) * row, row),
    }
}

fn offset(side: &KvLayout, h: u64, t: u64) -> u64 {
    let s = strides(side);
    h * s.outer + t * s.inner
}

fn row_bytes(side: &KvLayout) -> u64 {
    u64::from(side.head_dim) * u64::from(side.elem_size)
}

/// Tiles by `(heads, tokens)`, each `(src block, src offset, dst block, dst offset)`.
pub(super) type Tiles = BTreeMap<(u64, u64), Vec<(u64, u64, u64, u64)>>;

/// The tiles that move heads `h0..h1` of the request's first `tokens` tokens from `src`'s
/// blocks to `dst`'s; `split_tokens` cuts them to one token each (destination NHD with several
/// head ranges from one peer: whole-token tiles of different ranges would interleave).
#[allow(clippy::too_many_arguments)]
fn tiles_of(
    out: &mut Tiles,
    src: &KvLayout,
    src_ids: &[u64],
    dst: &KvLayout,
    dst_ids: &[u64],
    tokens: u64,
    (h0, h1): (u32, u32),
    split_tokens: bool,
) {
    let (sb, db) = (
        u64::from(src.tokens_per_block),
        u64::from(dst.tokens_per_block),
    );
    let (sf, df) = (u64::from(src.head_range().0), u64::from(dst.head_range().0));
    let (h0, h1) = (u64::from(h0), u64::from(h1));
    // A destination HND tile of several heads but part of a block's tokens would interleave
    // with the block's next tile: one head per tile there.
    let mut t = 0;
    crate::work::tick(usize::try_from(tokens).unwrap_or(usize::MAX));
    while t < tokens {
        let (ss, ds) = (t % sb, t % db);
        let mut n = (sb - ss).min(db - ds).min(tokens - t);
        if split_tokens {
            n = 1;
        }
        let (sblk, dblk) = (src_ids[(t / sb) as usize], dst_ids[(t / db) as usize]);
        let per_head = dst.order == KvOrder::Hnd && n < db && h1 - h0 > 1;
        let ranges: Vec<(u64, u64)> = if per_head {
            (h0..h1).map(|h| (h, h + 1)).collect()
        } else {
            vec![(h0, h1)]
        };
        for (a, b) in ranges {
            out.entry((b - a, n)).or_default().push((
                sblk,
                offset(src, a - sf, ss),
                dblk,
                offset(dst, a - df, ds),
            ));
        }
        t += n;
    }
}

/// The tiles `src`'s rank serves `dst`'s rank.
pub(super) fn served(
    src: &KvLayout,
    src_ids: &[u64],
    dst: &KvLayout,
    dst_ids: &[u64],
    tokens: u64,
) -> Tiles {
    let mut out = Tiles::new();
    let mine: Vec<(u32, u32)> = head_segments(src, dst)
        .into_iter()
        .filter(|&(_, _, r)| r == src.tp_rank)
        .map(|(a, b, _)| (a, b))
        .collect();
    let split = dst.order == KvOrder::Nhd && mine.len() > 1;
    for &hs in &mine {
        tiles_of(&mut out, src, src_ids, dst, dst_ids, tokens, hs, split);
    }
    out
}

/// The transfers of one peer: one per shape, each side's rows as `local` / `remote` says.
pub(super) fn peer_tiles(
    name: &str,
    tiles: Tiles,
    (src, dst): (&KvLayout, &KvLayout),
    local_is_dst: bool,
    transfers: &mut Vec<KvTileXfer>,
) {
    let layers = src.tensors.len() as u64;
    for ((heads, tokens), list) in tiles {
        let (ss, ds) = (strides(src), strides(dst));
        let (local, remote) = if local_is_dst { (ds, ss) } else { (ss, ds) };
        let shape = TileShape {
            outer: heads,
            inner: tokens,
            row: row_bytes(src),
            local,
            remote,
        };
        let tiles: Vec<Tile> = list
            .into_iter()
            .map(|(sb, so, db, dof)| {
                let ((lb, lo), (rb, ro)) = if local_is_dst {
                    ((db, dof), (sb, so))
                } else {
                    ((sb, so), (db, dof))
                };
                Tile {
                    local_block: lb,
                    local_offset: lo,
                    remote_block: rb,
                    remote_offset: ro,
                }
            })
            .collect();
        transfers.push(KvTileXfer {
            peer: name.to_owned(),
            bytes: shape.bytes() * tiles.len() as u64 * layers,
            shape,
            tiles,
        });
    }
}

impl KvLayout {
    /// This rank's pools as a block table, one run per tensor (layer by layer, K then V, or
    /// the latent): what [`Agent::prep_strided_dlist`](crate::Agent::prep_strided_dlist)
    /// prepares for a tile plan (this rank's own, and each peer's from its layout).
    pub fn block_table(&self) -> StridedDescList {
        StridedDescList::from_descs(
            self.kind,
            self.tensors.iter().map(|t| {
                StridedDesc::on_device(
                    t.base,
                    t.block_stride,
                    self.block_bytes(),
                    self.blocks,
                    self.dev_id,
                )
            }),
        )
    }

    /// [`KvLayout::plan_read`] as tile transfers: the same heads from the same ranks, landed
    /// in this rank's order whatever the peers' (HND <-> NHD permuted in the copy, head slices
    /// and gathers in the same pass). Needs a backend that rearranges rows (`CUDA_IPC`'s copy
    /// kernel, `INPROC`); other transports refuse the requests typed. Time linear in layers
    /// x blocks (x heads for HND destinations whose blocks hold several source blocks), never
    /// per element.
    #[deprecated(
        since = "0.1.0",
        note = "use KvLayout::plan(XferOp::Read, ..) (peers as KvPeer, each with its block ids; pieces or tiles chosen per peer) and Agent::make_kv_xfers"
    )]
    pub fn plan_read_tiles(
        &self,
        peers: &[(&str, &KvLayout)],
        peer_blocks: &[u64],
        local_blocks: &[u64],
        tokens: u64,
    ) -> Result<KvTilePlan> {
        self.plan_tiles(XferOp::Read, peers, peer_blocks, local_blocks, tokens)
    }

    /// [`KvLayout::plan_write`] as tile transfers: this (source) rank writes each destination
    /// rank's heads into that rank's blocks in that rank's order.
    #[deprecated(
        since = "0.1.0",
        note = "use KvLayout::plan(XferOp::Write, ..) (peers as KvPeer, each with its block ids; pieces or tiles chosen per peer) and Agent::make_kv_xfers"
    )]
    pub fn plan_write_tiles(
        &self,
        peers: &[(&str, &KvLayout)],
        local_blocks: &[u64],
        peer_blocks: &[u64],
        tokens: u64,
    ) -> Result<KvTilePlan> {
        self.plan_tiles(XferOp::Write, peers, peer_blocks, local_blocks, tokens)
    }

    /// [`KvLayout::plan`] as tiles only, every peer at `peer_blocks`.
    fn plan_tiles(
        &self,
        op: XferOp,
        peers: &[(&str, &KvLayout)],
        peer_blocks: &[u64],
        local_blocks: &[u64],
        tokens: u64,
    ) -> Result<KvTilePlan> {
        let transfers = self.plan_older(
            (Form::Tiles, op),
            peers,
            (peer_blocks, local_blocks),
            tokens,
            |t| match t.moves {
                KvMoves::Tiles { shape, tiles, .. } => Some(KvTileXfer {
                    peer: t.peer,
                    shape,
                    tiles,
                    bytes: t.bytes,
                }),
                KvMoves::Pieces { .. } => None,
            },
        )?;
        Ok(KvTilePlan { op, transfers })
    }
}
