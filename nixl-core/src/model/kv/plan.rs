//! The planner: which bytes of which peer land where, as contiguous pieces.

use super::one::{Form, KvMoves};
use super::{kv_error, KvLayout, KvOrder};
use crate::desc::{Desc, XferDescList, XferOp};
use crate::error::{ErrorKind, Result};

/// What one rank posts to one peer for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPeerXfer {
    /// The peer's agent name.
    pub peer: String,
    /// This rank's pieces.
    pub local: XferDescList,
    /// The peer's pieces, one per local piece, of the same length.
    pub remote: XferDescList,
    /// Bytes moved.
    pub bytes: u64,
}

/// What one rank posts for a request: one transfer per peer it exchanges heads with, all with
/// the same operation (`create_xfer_req(plan.op, &t.local, &t.remote, &t.peer, ..)`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KvPlan {
    /// `Read` for [`KvLayout::plan_read`], `Write` for [`KvLayout::plan_write`].
    pub op: XferOp,
    /// Per peer, in the order the peers were given; peers with nothing to move are left out.
    pub transfers: Vec<KvPeerXfer>,
}

impl KvPlan {
    /// Bytes the plan moves.
    pub fn bytes(&self) -> u64 {
        self.transfers.iter().map(|t| t.bytes).sum()
    }

    /// Descriptors the plan posts.
    pub fn pieces(&self) -> usize {
        self.transfers.iter().map(|t| t.local.len()).sum()
    }
}

/// The heads rank `rank` of a side holds: `(first, count)` (see [`KvLayout::head_range`]).
fn heads_of(side: &KvLayout, rank: u32) -> (u32, u32) {
    super::head_range_of(rank, side.tp_size, side.model_kv_heads, side.mla)
}

/// The rank of the source side that serves head `h` to destination rank `dst_rank`: among the
/// ranks holding it (several when heads are replicated, every rank for MLA), the one at
/// `dst_rank` modulo their number, so replicas share the load and the latent is read once.
fn source_of(src: &KvLayout, h: u32, dst_rank: u32) -> u32 {
    if src.mla {
        return dst_rank % src.tp_size;
    }
    let holders: Vec<u32> = (0..src.tp_size)
        .filter(|&r| {
            let (first, n) = heads_of(src, r);
            (first..first + n).contains(&h)
        })
        .collect();
    // Every head of a validated layout has a holder; u32::MAX (no rank) otherwise.
    holders
        .get((dst_rank as usize) % holders.len().max(1))
        .copied()
        .unwrap_or(u32::MAX)
}

/// The destination's heads grouped by the source rank that serves them: `(h0, h1, src_rank)`.
pub(super) fn head_segments(src: &KvLayout, dst: &KvLayout) -> Vec<(u32, u32, u32)> {
    let (first, n) = dst.head_range();
    let mut out: Vec<(u32, u32, u32)> = Vec::new();
    for h in first..first + n {
        let r = source_of(src, h, dst.tp_rank);
        match out.last_mut() {
            Some((_, h1, sr)) if *sr == r && *h1 == h => *h1 = h + 1,
            _ => out.push((h, h + 1, r)),
        }
    }
    out
}

/// The two sides of a set of pieces, merged where both continue.
#[derive(Default)]
pub(super) struct Pieces {
    pub(super) src: Vec<Desc>,
    pub(super) dst: Vec<Desc>,
    pub(super) bytes: u64,
}

impl Pieces {
    fn push(&mut self, src: u64, dst: u64, len: u64, src_dev: u64, dst_dev: u64) {
        self.bytes += len;
        if let (Some(s), Some(d)) = (self.src.last_mut(), self.dst.last_mut()) {
            if s.addr + s.len == src && d.addr + d.len == dst {
                s.len += len;
                d.len += len;
                return;
            }
        }
        self.src.push(Desc::on_device(src, len, src_dev));
        self.dst.push(Desc::on_device(dst, len, dst_dev));
    }
}

/// Checks one side's block ids: enough for `tokens`, each inside the pool.
pub(super) fn check_blocks(side: &KvLayout, ids: &[u64], tokens: u64, which: &str) -> Result<()> {
    let cap = (ids.len() as u64).saturating_mul(u64::from(side.tokens_per_block));
    if cap < tokens {
        return Err(kv_error(
            ErrorKind::InvalidParam,
            format!(
                "{which} blocks hold {cap} tokens ({} blocks of {}); the request has {tokens}",
                ids.len(),
                side.tokens_per_block
            ),
        ));
    }
    if let Some(b) = ids.iter().find(|&&b| b >= side.blocks) {
        return Err(kv_error(
            ErrorKind::InvalidParam,
            format!(
                "{which} block id {b} is outside the pool of {} blocks",
                side.blocks
            ),
        ));
    }
    // The blocks the request uses hold distinct tokens: an id listed twice would land two
    // blocks' tokens in one (or read one block's tokens twice).
    let used = tokens.div_ceil(u64::from(side.tokens_per_block.max(1)));
    let used = &ids[..ids.len().min(usize::try_from(used).unwrap_or(usize::MAX))];
    if let Some(b) = first_repeat(used) {
        return Err(kv_error(
            ErrorKind::InvalidParam,
            format!("{which} block id {b} is listed twice in the request's blocks"),
        ));
    }
    Ok(())
}

/// The first value listed twice in `ids`, if any (O(n log n) on a copy).
pub(crate) fn first_repeat<T: Ord + Copy>(ids: &[T]) -> Option<T> {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// The pieces that move heads `h0..h1` of the request's first `tokens` tokens from `src`'s
/// blocks to `dst`'s, every layer and tensor.
fn pieces(
    p: &mut Pieces,
    src: &KvLayout,
    src_ids: &[u64],
    dst: &KvLayout,
    dst_ids: &[u64],
    tokens: u64,
    (h0, h1): (u32, u32),
) {
    let (sb, db) = (
        u64::from(src.tokens_per_block),
        u64::from(dst.tokens_per_block),
    );
    let (sh, dh) = (u64::from(src.kv_heads), u64::from(dst.kv_heads));
    let (sf, df) = (u64::from(src.head_range().0), u64::from(dst.head_range().0));
    let row = u64::from(src.head_dim) * u64::from(src.elem_size);
    let (h0, h1) = (u64::from(h0), u64::from(h1));
    for (st, dt) in src.tensors.iter().zip(&dst.tensors) {
        let mut t = 0;
        while t < tokens {
            let (ss, ds) = (t % sb, t % db);
            let n = (sb - ss).min(db - ds).min(tokens - t);
            let sblk = st.base + src_ids[(t / sb) as usize] * st.block_stride;
            let dblk = dt.base + dst_ids[(t / db) as usize] * dt.block_stride;
            match src.order {
                KvOrder::Nhd => {
                    for i in 0..n {
                        let so = ((ss + i) * sh + (h0 - sf)) * row;
                        let doff = ((ds + i) * dh + (h0 - df)) * row;
                        p.push(
                            sblk + so,
                            dblk + doff,
                            (h1 - h0) * row,
                            src.dev_id,
                            dst.dev_id,
                        );
                    }
                }
                KvOrder::Hnd => {
                    for h in h0..h1 {
                        let so = ((h - sf) * sb + ss) * row;
                        let doff = ((h - df) * db + ds) * row;
                        p.push(sblk + so, dblk + doff, n * row, src.dev_id, dst.dev_id);
                    }
                }
            }
            t += n;
        }
    }
}

/// What `src`'s rank serves `dst`'s rank: the heads [`head_segments`] assigns to it, as
/// pieces (none when another rank serves every head `dst` holds).
pub(super) fn served(
    src: &KvLayout,
    src_ids: &[u64],
    dst: &KvLayout,
    dst_ids: &[u64],
    tokens: u64,
) -> Pieces {
    let mut p = Pieces::default();
    for (h0, h1, r) in head_segments(src, dst) {
        if r == src.tp_rank {
            pieces(&mut p, src, src_ids, dst, dst_ids, tokens, (h0, h1));
        }
    }
    p
}

/// Checks a pair of sides on their own and against each other (any orders).
pub(super) fn check_compat(src: &KvLayout, dst: &KvLayout) -> Result<()> {
    src.validate()?;
    dst.validate()?;
    dst.check_compatible(src)
}

/// Checks a pair of sides before planning pieces: compatible and in one order.
pub(super) fn check_pair(src: &KvLayout, dst: &KvLayout) -> Result<()> {
    check_compat(src, dst)?;
    if src.order != dst.order {
        return Err(kv_error(
            ErrorKind::NotSupported,
            format!(
                "the {} -> {} permute: contiguous pieces cannot reorder bytes; \
                 plan_read_tiles / plan_write_tiles permute in the copy (CUDA_IPC, INPROC)",
                src.order.name(),
                dst.order.name()
            ),
        ));
    }
    Ok(())
}

impl KvLayout {
    /// The reads this (destination) rank posts to land a request: `peers` are the source
    /// side's ranks (agent name and layout, every rank of that side), `peer_blocks` the
    /// request's block ids there (the same on every source rank), `local_blocks` here, and
    /// `tokens` the request's length. Each head comes from one source rank (replicas and MLA's
    /// latent spread over the ranks that hold them).
    #[deprecated(
        since = "0.1.0",
        note = "use KvLayout::plan(XferOp::Read, ..) (peers as KvPeer, each with its block ids; pieces or tiles chosen per peer) and Agent::make_kv_xfers"
    )]
    pub fn plan_read(
        &self,
        peers: &[(&str, &KvLayout)],
        peer_blocks: &[u64],
        local_blocks: &[u64],
        tokens: u64,
    ) -> Result<KvPlan> {
        self.plan_pieces(XferOp::Read, peers, peer_blocks, local_blocks, tokens)
    }

    /// The writes this (source) rank posts to land a request in the destination ranks
    /// (`peers`: every rank of that side): the heads each of them takes from this rank, by
    /// the same choice [`KvLayout::plan_read`] makes, so the two plans move the same bytes.
    #[deprecated(
        since = "0.1.0",
        note = "use KvLayout::plan(XferOp::Write, ..) (peers as KvPeer, each with its block ids; pieces or tiles chosen per peer) and Agent::make_kv_xfers"
    )]
    pub fn plan_write(
        &self,
        peers: &[(&str, &KvLayout)],
        local_blocks: &[u64],
        peer_blocks: &[u64],
        tokens: u64,
    ) -> Result<KvPlan> {
        self.plan_pieces(XferOp::Write, peers, peer_blocks, local_blocks, tokens)
    }

    /// [`KvLayout::plan`] as pieces only, every peer at `peer_blocks`.
    fn plan_pieces(
        &self,
        op: XferOp,
        peers: &[(&str, &KvLayout)],
        peer_blocks: &[u64],
        local_blocks: &[u64],
        tokens: u64,
    ) -> Result<KvPlan> {
        let transfers = self.plan_older(
            (Form::Pieces, op),
            peers,
            (peer_blocks, local_blocks),
            tokens,
            |t| match t.moves {
                KvMoves::Pieces { local, remote } => Some(KvPeerXfer {
                    peer: t.peer,
                    local,
                    remote,
                    bytes: t.bytes,
                }),
                KvMoves::Tiles { .. } => None,
            },
        )?;
        Ok(KvPlan { op, transfers })
    }
}

/// The other side's common shape, checked: at least one rank, one TP size, each rank once.
pub(super) fn side_of<'a>(peers: &[(&str, &'a KvLayout)]) -> Result<&'a KvLayout> {
    let Some((_, first)) = peers.first() else {
        return Err(kv_error(
            ErrorKind::InvalidParam,
            "no peer ranks to plan with",
        ));
    };
    let mut seen = vec![false; first.tp_size as usize];
    for (name, p) in peers {
        p.validate()?;
        if p.tp_size != first.tp_size || p.tokens_per_block != first.tokens_per_block {
            return Err(kv_error(
                ErrorKind::Mismatch,
                format!("peer {name}: the other side's ranks disagree on TP size or block size"),
            ));
        }
        let slot = &mut seen[p.tp_rank as usize];
        if *slot {
            return Err(kv_error(
                ErrorKind::InvalidParam,
                format!("peer {name}: TP rank {} given twice", p.tp_rank),
            ));
        }
        *slot = true;
    }
    if seen.iter().any(|s| !s) {
        return Err(kv_error(
            ErrorKind::InvalidParam,
            format!(
                "the other side has TP {}; give every rank ({} given)",
                first.tp_size,
                peers.len()
            ),
        ));
    }
    Ok(first)
}
