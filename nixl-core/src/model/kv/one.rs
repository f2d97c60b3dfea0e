//! The one planner entry ([`KvLayout::plan`]): either direction, pieces or tiles chosen by the
//! two sides' layouts, each peer rank with its own block ids, and one plan type
//! ([`KvXferPlan`]) that [`Agent::make_kv_xfers`](crate::Agent::make_kv_xfers) turns into its
//! requests.

use super::plan::{check_blocks, check_compat, side_of};
use super::KvLayout;
#[cfg(test)]
use super::KvOrder;
use crate::desc::{XferDescList, XferOp};
use crate::error::Result;
use crate::strided::StridedDescList;
use crate::tiles::{Tile, TileShape};

/// One rank of the other side of a request: its agent's name, its layout and the request's
/// block ids in its pool (each rank its own; ranks of one engine usually share them).
#[derive(Debug, Clone, Copy)]
pub struct KvPeer<'a> {
    /// The rank's agent name.
    pub name: &'a str,
    /// Its layout (from its handshake: [`KvLayout::decode`]).
    pub layout: &'a KvLayout,
    /// The request's block ids in its pool, in token order.
    pub blocks: &'a [u64],
}

/// How one transfer of a plan moves its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvMoves {
    /// Contiguous pieces, one list per side of equal lengths: any transport moves them.
    Pieces {
        /// This rank's pieces.
        local: XferDescList,
        /// The peer's pieces, one per local piece.
        remote: XferDescList,
    },
    /// Tiles over the two sides' block tables, their rows rearranged in the copy (an HND <->
    /// NHD permute): only a backend that rearranges rows takes them (`CUDA_IPC`'s copy kernel,
    /// `INPROC`); others refuse the request typed.
    Tiles {
        /// The peer's block table ([`KvLayout::block_table`]).
        remote_table: StridedDescList,
        /// Where each tile's rows lie on this rank (`local`) and the peer (`remote`).
        shape: TileShape,
        /// The tiles, the same in every layer and tensor.
        tiles: Vec<Tile>,
    },
}

/// One request of a rank to one peer rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvXfer {
    /// The peer's agent name.
    pub peer: String,
    /// Bytes moved.
    pub bytes: u64,
    /// What moves them.
    pub moves: KvMoves,
}

/// What one rank posts for a request: every transfer with the same operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvXferPlan {
    /// `Read`: this rank is the request's destination; `Write`: its source.
    pub op: XferOp,
    /// This rank's block table (what tile transfers are made over).
    pub local_table: StridedDescList,
    /// Per peer rank (in the order given; a peer with nothing to move is left out), and per
    /// tile shape for tiles.
    pub transfers: Vec<KvXfer>,
}

impl KvXferPlan {
    /// Bytes the plan moves.
    pub fn bytes(&self) -> u64 {
        self.transfers.iter().map(|t| t.bytes).sum()
    }

    /// Contiguous pieces the plan moves (0 for tile transfers).
    pub fn pieces(&self) -> usize {
        self.count(|m| match m {
            KvMoves::Pieces { local, .. } => local.len(),
            KvMoves::Tiles { .. } => 0,
        })
    }

    /// Tiles the plan moves (0 for piece transfers).
    pub fn tiles(&self) -> usize {
        self.count(|m| match m {
            KvMoves::Tiles { tiles, .. } => tiles.len(),
            KvMoves::Pieces { .. } => 0,
        })
    }

    fn count(&self, f: impl Fn(&KvMoves) -> usize) -> usize {
        self.transfers.iter().map(|t| f(&t.moves)).sum()
    }

    /// Whether some transfer rearranges rows (needs `CUDA_IPC` or `INPROC`).
    pub fn has_tiles(&self) -> bool {
        self.transfers
            .iter()
            .any(|t| matches!(t.moves, KvMoves::Tiles { .. }))
    }
}

impl KvLayout {
    /// The older entries' plans: every peer rank at `peer_blocks`, in `form`, each transfer
    /// turned into the older type by `pick` (which drops the other form's).
    pub(super) fn plan_older<T>(
        &self,
        (form, op): (Form, XferOp),
        peers: &[(&str, &KvLayout)],
        (peer_blocks, local_blocks): (&[u64], &[u64]),
        tokens: u64,
        pick: impl Fn(KvXfer) -> Option<T>,
    ) -> Result<Vec<T>> {
        let peers: Vec<KvPeer<'_>> = peers
            .iter()
            .map(|&(name, layout)| KvPeer {
                name,
                layout,
                blocks: peer_blocks,
            })
            .collect();
        let plan = self.plan_as(form, op, local_blocks, &peers, tokens)?;
        Ok(plan.transfers.into_iter().filter_map(pick).collect())
    }
}

/// What [`KvLayout::plan_as`] plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// Per peer: pieces where the bytes lie in one order, tiles otherwise.
    Chosen,
    /// Pieces only; a pair in different orders is refused.
    Pieces,
    /// Tiles only.
    Tiles,
}

/// Whether a block of `side` lies the same in either order: one head per block (MLA's latent,
/// a rank of one head) or one token per block.
fn order_free(side: &KvLayout) -> bool {
    side.kv_heads == 1 || side.tokens_per_block == 1
}

/// The pair as pieces can move it, where they can: the same order, or an order-free side
/// taken in the other's order (its bytes are the same in both).
fn as_pieces(src: &KvLayout, dst: &KvLayout) -> Option<(KvLayout, KvLayout)> {
    let (mut s, mut d) = (src.clone(), dst.clone());
    if s.order != d.order {
        if order_free(&s) {
            s.order = d.order;
        } else if order_free(&d) {
            d.order = s.order;
        } else {
            return None;
        }
    }
    Some((s, d))
}

impl KvLayout {
    /// The requests this rank posts for a request, in one call for both directions and both
    /// forms: with `op` `Read` this rank is the destination and `peers` are every rank of the
    /// source side (each head comes from one of them; replicas and MLA's latent spread over
    /// the ranks that hold them); with `Write` this rank is a source and `peers` every rank of
    /// the destination side (each gets the heads it takes from this rank, the same bytes a
    /// `Read` plan moves). `my_blocks` are the request's block ids here and each peer carries
    /// its own, so the two sides' tables cannot be swapped by argument order. `tokens` is the
    /// request's length.
    ///
    /// Each peer gets contiguous pieces where the two sides' bytes lie in one order (the same
    /// [`KvOrder`](super::KvOrder), or a side with one head or one token per block, whose bytes are the same
    /// in either order), and tiles rearranged in the copy otherwise ([`KvMoves`]). Refused
    /// typed: malformed or incompatible layouts, a side's ranks that disagree or repeat, block
    /// ids outside a pool, too few for `tokens` or listed twice.
    ///
    /// ```
    /// # use nixl_core::{XferOp, kv::{KvLayout, KvPeer}};
    /// # fn decode(mine: &KvLayout, prefill: &KvLayout, prefill_ids: &[u64], my_ids: &[u64])
    /// #     -> nixl_core::Result<()> {
    /// let peers = [KvPeer { name: "prefill-0", layout: prefill, blocks: prefill_ids }];
    /// let plan = mine.plan(XferOp::Read, my_ids, &peers, 64)?;
    /// # let _ = plan; Ok(()) }
    /// ```
    ///
    /// The two sides' tables cannot trade places: the peer's ids go with the peer.
    ///
    /// ```compile_fail
    /// # use nixl_core::{XferOp, kv::{KvLayout, KvPeer}};
    /// # fn swapped(mine: &KvLayout, peers: &[KvPeer<'_>], my_ids: &[u64]) {
    /// let _ = mine.plan(XferOp::Read, peers, my_ids, 64);
    /// # }
    /// ```
    pub fn plan(
        &self,
        op: XferOp,
        my_blocks: &[u64],
        peers: &[KvPeer<'_>],
        tokens: u64,
    ) -> Result<KvXferPlan> {
        self.plan_as(Form::Chosen, op, my_blocks, peers, tokens)
    }

    /// The planner behind every entry: [`KvLayout::plan`] with the form chosen per peer, or
    /// pieces only (the pair in one order, else `NotSupported`) or tiles only.
    pub(super) fn plan_as(
        &self,
        form: Form,
        op: XferOp,
        my_blocks: &[u64],
        peers: &[KvPeer<'_>],
        tokens: u64,
    ) -> Result<KvXferPlan> {
        let side: Vec<(&str, &KvLayout)> = peers.iter().map(|p| (p.name, p.layout)).collect();
        side_of(&side)?;
        self.validate()?;
        check_blocks(self, my_blocks, tokens, "local")?;
        let mut transfers = Vec::new();
        for p in peers {
            check_blocks(p.layout, p.blocks, tokens, &format!("peer {}", p.name))?;
            let ((src, src_ids), (dst, dst_ids)) = match op {
                XferOp::Read => ((p.layout, p.blocks), (self, my_blocks)),
                XferOp::Write => ((self, my_blocks), (p.layout, p.blocks)),
            };
            let local_is_dst = op == XferOp::Read;
            let pieces = match form {
                Form::Chosen => {
                    check_compat(src, dst)?;
                    as_pieces(src, dst)
                }
                Form::Pieces => {
                    super::plan::check_pair(src, dst)?;
                    Some((src.clone(), dst.clone()))
                }
                Form::Tiles => {
                    check_compat(src, dst)?;
                    None
                }
            };
            match pieces {
                Some((s, d)) => {
                    let pieces = super::plan::served(&s, src_ids, &d, dst_ids, tokens);
                    if pieces.bytes == 0 {
                        continue;
                    }
                    let (src_kind, dst_kind) = (src.kind, dst.kind);
                    let bytes = pieces.bytes;
                    let (s_list, d_list) = (
                        XferDescList::from_descs(src_kind, pieces.src),
                        XferDescList::from_descs(dst_kind, pieces.dst),
                    );
                    let (local, remote) = if local_is_dst {
                        (d_list, s_list)
                    } else {
                        (s_list, d_list)
                    };
                    transfers.push(KvXfer {
                        peer: p.name.to_owned(),
                        bytes,
                        moves: KvMoves::Pieces { local, remote },
                    });
                }
                None => {
                    let tiles = super::tiles::served(src, src_ids, dst, dst_ids, tokens);
                    let mut per_shape = Vec::new();
                    super::tiles::peer_tiles(
                        p.name,
                        tiles,
                        (src, dst),
                        local_is_dst,
                        &mut per_shape,
                    );
                    transfers.extend(per_shape.into_iter().map(|t| KvXfer {
                        peer: t.peer,
                        bytes: t.bytes,
                        moves: KvMoves::Tiles {
                            remote_table: p.layout.block_table(),
                            shape: t.shape,
                            tiles: t.tiles,
                        },
                    }));
                }
            }
        }
        Ok(KvXferPlan {
            op,
            local_table: self.block_table(),
            transfers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_side_of_one_head_or_one_token_lies_the_same_in_either_order() {
        let mut a = KvLayout {
            model: "m".into(),
            layers: 1,
            tokens_per_block: 16,
            kv_heads: 1,
            model_kv_heads: 1,
            head_dim: 64,
            elem_size: 2,
            order: KvOrder::Nhd,
            tp_rank: 0,
            tp_size: 1,
            mla: true,
            blocks: 4,
            kind: crate::mem::MemKind::Dram,
            dev_id: 0,
            tensors: Vec::new(),
        };
        let mut b = KvLayout {
            order: KvOrder::Hnd,
            ..a.clone()
        };
        assert!(as_pieces(&a, &b).is_some_and(|(s, d)| s.order == d.order));
        a.kv_heads = 4;
        a.model_kv_heads = 4;
        b.kv_heads = 4;
        b.model_kv_heads = 4;
        assert!(as_pieces(&a, &b).is_none(), "four heads in other orders");
        b.tokens_per_block = 1;
        assert!(as_pieces(&a, &b).is_some_and(|(s, d)| s.order == d.order));
    }
}
