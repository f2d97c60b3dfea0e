//! Strided block tables (NIXL 1.5's strided descriptor lists): a KV cache's layers described by
//! base, stride and block length instead of one descriptor per block, and a transfer named by
//! block ids over them.
//!
//! A [`StridedDescList`] holds one [`StridedDesc`] per layer (and per K/V): block `i` of a layer
//! is `[addr + i * stride, + len)`. [`Agent::prep_strided_dlist`](crate::Agent::prep_strided_dlist)
//! validates it against registrations in O(layers) (each layer must lie in one registered
//! region), and [`Agent::make_block_xfer`](crate::Agent::make_block_xfer) builds a request from
//! two lists of block ids in O(layers + ids): block `local[k]` of every local layer moves to
//! block `remote[k]` of the same remote layer. A backend that consumes strides gets the layers
//! and the id runs ([`BlockXferSpec`]); others get materialized segments.

use crate::desc::{Desc, XferDescList, XferOp};
use crate::mem::MemKind;
use crate::spec::{BackendMd, Segment, XferSpec};

/// A strided run of equal blocks on one device: block `i` (`0..count`) is
/// `[addr + i * stride, addr + i * stride + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StridedDesc {
    /// Address (or storage offset) of block 0.
    pub addr: u64,
    /// Bytes from one block's start to the next's (at least `len`).
    pub stride: u64,
    /// Bytes per block.
    pub len: u64,
    /// Number of blocks.
    pub count: u64,
    /// Device id: GPU ordinal, file descriptor or object index; 0 for DRAM.
    pub dev_id: u64,
}

impl StridedDesc {
    /// `count` blocks of `len` bytes, `stride` apart, from `addr` on device 0 (DRAM).
    pub fn new(addr: u64, stride: u64, len: u64, count: u64) -> Self {
        Self::on_device(addr, stride, len, count, 0)
    }

    /// `count` blocks of `len` bytes, `stride` apart, from `addr` on device `dev_id`.
    pub fn on_device(addr: u64, stride: u64, len: u64, count: u64, dev_id: u64) -> Self {
        StridedDesc {
            addr,
            stride,
            len,
            count,
            dev_id,
        }
    }

    /// One past the last byte of the last block, or `None` when empty or overflowing.
    pub fn end(&self) -> Option<u64> {
        let last = self.count.checked_sub(1)?;
        self.stride
            .checked_mul(last)?
            .checked_add(self.addr)?
            .checked_add(self.len)
    }

    /// Why the run is malformed, if it is: no blocks, empty blocks, blocks that overlap
    /// (`stride < len`), or a range past `u64::MAX`.
    pub fn problem(&self) -> Option<&'static str> {
        if self.count == 0 {
            Some("no blocks")
        } else if self.len == 0 {
            Some("empty blocks")
        } else if self.count > 1 && self.stride < self.len {
            Some("blocks overlap (stride < block length)")
        } else if self.end().is_none() {
            Some("range overflows")
        } else {
            None
        }
    }

    /// Whether blocks follow each other with no gap (`stride == len`): consecutive blocks
    /// form one contiguous range.
    pub fn is_dense(&self) -> bool {
        self.stride == self.len
    }

    /// The address of block `i` (no bounds check beyond overflow).
    pub fn block_addr(&self, i: u64) -> Option<u64> {
        self.stride.checked_mul(i)?.checked_add(self.addr)
    }

    /// Block `i` as a descriptor, or `None` past the last block.
    pub fn block(&self, i: u64) -> Option<Desc> {
        if i >= self.count {
            return None;
        }
        Some(Desc::on_device(self.block_addr(i)?, self.len, self.dev_id))
    }
}

/// A block table of one memory kind: one [`StridedDesc`] per layer (and per K/V).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StridedDescList {
    kind: MemKind,
    descs: Vec<StridedDesc>,
}

impl StridedDescList {
    /// An empty table of the given kind.
    pub fn new(kind: MemKind) -> Self {
        StridedDescList {
            kind,
            descs: Vec::new(),
        }
    }

    /// A table from strided descriptors.
    pub fn from_descs(kind: MemKind, descs: impl IntoIterator<Item = StridedDesc>) -> Self {
        StridedDescList {
            kind,
            descs: descs.into_iter().collect(),
        }
    }

    /// Appends a layer.
    pub fn push(&mut self, desc: StridedDesc) {
        self.descs.push(desc);
    }

    /// The memory kind.
    pub fn kind(&self) -> MemKind {
        self.kind
    }

    /// The layers.
    pub fn descs(&self) -> &[StridedDesc] {
        &self.descs
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.descs.len()
    }

    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.descs.is_empty()
    }

    /// The number of blocks over all layers (`None` on overflow).
    pub fn block_count(&self) -> Option<u64> {
        self.descs
            .iter()
            .try_fold(0u64, |a, d| a.checked_add(d.count))
    }

    /// Every block as a descriptor, layer after layer: the flat list this table stands for
    /// (block `i` of layer `l` is at index `sum(count of layers < l) + i`).
    pub fn to_desc_list(&self) -> XferDescList {
        XferDescList::from_descs(
            self.kind,
            self.descs
                .iter()
                .flat_map(|d| (0..d.count).filter_map(move |i| d.block(i))),
        )
    }
}

/// Tiles at block ids consecutive on both sides: the tile at `local_offset` bytes into local
/// blocks `local..local + count` moves to the tile at `remote_offset` bytes into remote blocks
/// `remote..remote + count`, in every layer. For whole blocks (a spec without
/// [`BlockXferSpec::rows`]) both offsets are 0 and the tile is the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockRun {
    /// The first local block id.
    pub local: u64,
    /// The first remote block id.
    pub remote: u64,
    /// How many blocks.
    pub count: u64,
    /// Bytes from each local block's start to its tile's (0 for whole blocks).
    pub local_offset: u64,
    /// Bytes from each remote block's start to its tile's (0 for whole blocks).
    pub remote_offset: u64,
}

impl BlockRun {
    /// `count` whole blocks from `local` and `remote`.
    pub fn blocks(local: u64, remote: u64, count: u64) -> Self {
        BlockRun {
            local,
            remote,
            count,
            local_offset: 0,
            remote_offset: 0,
        }
    }

    /// Whether `next` continues this run: the next block on both sides, the same offsets.
    fn continued_by(&self, next: &BlockRun) -> bool {
        self.local.checked_add(self.count) == Some(next.local)
            && self.remote.checked_add(self.count) == Some(next.remote)
            && (self.local_offset, self.remote_offset) == (next.local_offset, next.remote_offset)
    }
}

/// Appends `run`, merged into the last run where it continues it.
pub(crate) fn push_run(runs: &mut Vec<BlockRun>, run: BlockRun, merge: bool) {
    if merge {
        if let Some(last) = runs.last_mut() {
            if last.continued_by(&run) {
                last.count += run.count;
                return;
            }
        }
    }
    runs.push(run);
}

/// Splits paired block ids into runs consecutive on both sides (one run per id when
/// `merge` is false). The caller checked that both lists have the same length.
pub(crate) fn block_runs(local: &[usize], remote: &[usize], merge: bool) -> Vec<BlockRun> {
    // One allocation: ids in no order (a shuffled free list) are one run each.
    let mut runs: Vec<BlockRun> = Vec::with_capacity(local.len());
    crate::work::tick(local.len());
    for (&l, &r) in local.iter().zip(remote) {
        push_run(&mut runs, BlockRun::blocks(l as u64, r as u64, 1), merge);
    }
    runs
}

/// The tiles as runs: tiles at consecutive blocks on both sides with the same offsets merge
/// (one run per tile when `merge` is false).
pub(crate) fn tile_runs(tiles: &[crate::tiles::Tile], merge: bool) -> Vec<BlockRun> {
    let mut runs: Vec<BlockRun> = Vec::new();
    crate::work::tick(tiles.len());
    for t in tiles {
        let run = BlockRun {
            local: t.local_block,
            remote: t.remote_block,
            count: 1,
            local_offset: t.local_offset,
            remote_offset: t.remote_offset,
        };
        push_run(&mut runs, run, merge);
    }
    runs
}

/// One layer of a block transfer: the local and remote runs (blocks of the same length) and
/// the chosen backend's metadata of the regions holding them.
#[derive(Clone)]
pub struct LayerPair {
    /// The local layer.
    pub local: StridedDesc,
    /// The local region's backend metadata.
    pub local_md: BackendMd,
    /// The remote layer.
    pub remote: StridedDesc,
    /// The remote region's backend metadata (from `load_remote` or `load_local`).
    pub remote_md: BackendMd,
}

impl std::fmt::Debug for LayerPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerPair")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish()
    }
}

impl LayerPair {
    /// Whether a run of consecutive blocks is one contiguous range on both sides.
    pub fn is_dense(&self) -> bool {
        self.local.is_dense() && self.remote.is_dense()
    }
}

/// A block-table transfer for a backend that consumes strides
/// ([`Backend::prepare_blocks`](crate::backend::Backend::prepare_blocks)): every run of
/// tiles in every layer. A whole block is the identity tile (its rows in order, `rows` is
/// `None`); with [`BlockXferSpec::rows`] each tile's rows are rearranged on the way (an HND <->
/// NHD permute, heads gathered or sliced). Block ids were checked against every layer's block
/// count, tiles inside their blocks, and every layer lies in one registered region, so every
/// byte is in bounds. For whole blocks (`rows` is `None`) the destination's ids are distinct
/// across the runs (the agent refuses a request that names one twice), so two copies of one
/// layer never write one block.
#[derive(Debug, Clone)]
pub struct BlockXferSpec {
    /// READ or WRITE.
    pub op: XferOp,
    /// Memory kind of the local side.
    pub local_kind: MemKind,
    /// Memory kind of the remote side.
    pub remote_kind: MemKind,
    /// The remote agent's name (the agent's own name for local transfers).
    pub remote: String,
    /// Whether the remote side is the agent itself.
    pub is_local: bool,
    /// The layers, in order.
    pub layers: Vec<LayerPair>,
    /// The block-id runs, the same in every layer (for whole blocks, no destination id in two
    /// runs or twice in one).
    pub runs: Vec<BlockRun>,
    /// How each tile's rows lie on both sides; `None`: whole blocks, rows in order. `Some`
    /// only for a backend whose [`Backend::rearranges_rows`](crate::backend::Backend::rearranges_rows)
    /// (the agent checked the shape, that every tile lies inside its blocks and that no two
    /// destination rows share a byte); moving such a request's bytes as they lie is wrong.
    pub rows: Option<crate::tiles::TileShape>,
    /// A notification to deliver to the remote after all data is complete.
    pub notif: Option<Vec<u8>>,
    /// Per-layer arrival counters to advance (checked by the agent: a READ into local VRAM,
    /// inside the local list's regions); only for a backend whose `supports_arrival`.
    pub arrival: Option<crate::ArrivalCounters>,
}

impl BlockXferSpec {
    /// What a block-table request's path says of its table.
    pub(crate) fn summary(&self) -> String {
        match &self.rows {
            None => format!(
                "block table: {} layers x {} blocks",
                self.layers.len(),
                self.blocks_per_layer()
            ),
            Some(s) => format!(
                "tiles: {} layers x {} tiles of {} x {} rows of {} bytes, rearranged in the copy",
                self.layers.len(),
                self.blocks_per_layer(),
                s.outer,
                s.inner,
                s.row
            ),
        }
    }

    /// Blocks (tiles) per layer.
    pub fn blocks_per_layer(&self) -> u64 {
        crate::work::tick(self.runs.len());
        self.runs.iter().map(|r| r.count).sum()
    }

    /// Blocks (tiles) over all layers.
    pub fn block_count(&self) -> u64 {
        self.blocks_per_layer() * self.layers.len() as u64
    }

    /// Total bytes.
    pub fn total_bytes(&self) -> u64 {
        let per = self.blocks_per_layer();
        match &self.rows {
            None => self.layers.iter().map(|l| l.local.len * per).sum(),
            Some(s) => self.block_count().saturating_mul(s.bytes()),
        }
    }

    /// The number of contiguous segments: for whole blocks a run is one segment in a dense
    /// layer, one per block otherwise; for tiles one per row.
    pub fn segment_count(&self) -> usize {
        crate::work::tick(self.layers.len());
        let per = self.blocks_per_layer() as usize;
        match &self.rows {
            None => self
                .layers
                .iter()
                .map(|l| if l.is_dense() { self.runs.len() } else { per })
                .sum(),
            Some(s) => usize::try_from(
                self.block_count()
                    .saturating_mul(s.outer.saturating_mul(s.inner)),
            )
            .unwrap_or(usize::MAX),
        }
    }

    /// The contiguous segments of layer `layer`: `(local addr, remote addr, len)`: for whole
    /// blocks a run of a dense layer as one segment, for tiles each row. Empty for a layer
    /// index out of range.
    pub fn layer_segments(&self, layer: usize) -> LayerSegments<'_> {
        LayerSegments {
            layer: self.layers.get(layer),
            runs: if self.layers.get(layer).is_some() {
                &self.runs
            } else {
                &[]
            },
            rows: self.rows,
            run: 0,
            k: 0,
            row: 0,
        }
    }

    /// Every segment, layer after layer: `(layer, local addr, remote addr, len)`.
    pub fn segments(&self) -> impl Iterator<Item = (usize, u64, u64, u64)> + '_ {
        (0..self.layers.len())
            .flat_map(move |l| self.layer_segments(l).map(move |(a, b, n)| (l, a, b, n)))
    }

    /// The same transfer as a segment list (for backends that do not consume strides): layer
    /// `l`'s metadata are `mds[2l]` (local) and `mds[2l + 1]` (remote).
    pub fn materialize(&self) -> XferSpec {
        let mut segments = Vec::with_capacity(self.segment_count());
        let mut mds = Vec::with_capacity(self.layers.len() * 2);
        for (l, layer) in self.layers.iter().enumerate() {
            mds.push(layer.local_md.clone());
            mds.push(layer.remote_md.clone());
            for (la, ra, len) in self.layer_segments(l) {
                segments.push(Segment {
                    local_addr: la,
                    local_dev: layer.local.dev_id,
                    local_md: 2 * l,
                    remote_addr: ra,
                    remote_dev: layer.remote.dev_id,
                    remote_md: 2 * l + 1,
                    len,
                });
            }
        }
        XferSpec {
            op: self.op,
            local_kind: self.local_kind,
            remote_kind: self.remote_kind,
            remote: self.remote.clone(),
            is_local: self.is_local,
            segments,
            mds: mds.into(),
            notif: self.notif.clone(),
            // Materialized blocks go to backends that do not consume strides, which take no
            // counters (the agent refuses counters there before materializing).
            arrival: None,
            dst_disjoint: false,
            ends_apart: false,
        }
    }
}

/// The segments of one layer of a [`BlockXferSpec`] (see
/// [`BlockXferSpec::layer_segments`]).
#[derive(Debug, Clone)]
pub struct LayerSegments<'a> {
    layer: Option<&'a LayerPair>,
    runs: &'a [BlockRun],
    rows: Option<crate::tiles::TileShape>,
    run: usize,
    /// The block within the run.
    k: u64,
    /// The row within the tile (`a * inner + b`).
    row: u64,
}

impl Iterator for LayerSegments<'_> {
    type Item = (u64, u64, u64);

    fn next(&mut self) -> Option<Self::Item> {
        let layer = self.layer?;
        let run = self.runs.get(self.run)?;
        let (l, r) = (&layer.local, &layer.remote);
        // In bounds: ids were checked against the layer's count, whose range cannot overflow,
        // and tiles inside their blocks.
        let la = l.addr + (run.local + self.k) * l.stride + run.local_offset;
        let ra = r.addr + (run.remote + self.k) * r.stride + run.remote_offset;
        let seg = match &self.rows {
            None if layer.is_dense() => {
                self.run += 1;
                return Some((la, ra, run.count * l.len));
            }
            None => (la, ra, l.len),
            Some(s) => {
                let (a, b) = (self.row / s.inner, self.row % s.inner);
                self.row += 1;
                let seg = (
                    la + s.row_offset(&s.local, a, b),
                    ra + s.row_offset(&s.remote, a, b),
                    s.row,
                );
                if self.row < s.outer * s.inner {
                    return Some(seg);
                }
                self.row = 0;
                seg
            }
        };
        self.k += 1;
        if self.k == run.count {
            self.k = 0;
            self.run += 1;
        }
        Some(seg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn md() -> BackendMd {
        Arc::new(())
    }

    #[test]
    fn problems_are_named() {
        assert_eq!(StridedDesc::new(0, 8, 8, 0).problem(), Some("no blocks"));
        assert_eq!(StridedDesc::new(0, 8, 0, 1).problem(), Some("empty blocks"));
        assert!(StridedDesc::new(0, 4, 8, 2).problem().is_some());
        assert!(
            StridedDesc::new(0, 4, 8, 1).problem().is_none(),
            "one block may have any stride"
        );
        assert!(StridedDesc::new(u64::MAX - 8, 16, 8, 2).problem().is_some());
        assert_eq!(StridedDesc::new(100, 16, 8, 3).end(), Some(140));
        assert_eq!(StridedDesc::new(100, 16, 8, 3).block(3), None);
    }

    /// A layer pair with `count` blocks each side.
    fn pair(l: StridedDesc, r: StridedDesc) -> LayerPair {
        LayerPair {
            local: l,
            local_md: md(),
            remote: r,
            remote_md: md(),
        }
    }

    fn spec(layers: Vec<LayerPair>, runs: Vec<BlockRun>) -> BlockXferSpec {
        BlockXferSpec {
            op: XferOp::Write,
            local_kind: MemKind::Dram,
            remote_kind: MemKind::Dram,
            remote: "b".into(),
            is_local: false,
            layers,
            runs,
            rows: None,
            notif: None,
            arrival: None,
        }
    }

    fn layer() -> impl Strategy<Value = (u64, u64, u64, u64, u64, u64)> {
        // (local addr, local gap, remote addr, remote gap, len, count)
        (
            0u64..1 << 20,
            0u64..3,
            0u64..1 << 20,
            0u64..3,
            1u64..64,
            1u64..24,
        )
    }

    proptest! {
        /// `block_runs` covers the id pairs in order, and expanding its runs gives them back.
        #[test]
        fn runs_expand_to_the_ids(ids in proptest::collection::vec((0usize..40, 0usize..40), 0..60), merge: bool) {
            let (l, r): (Vec<usize>, Vec<usize>) = ids.iter().copied().unzip();
            let runs = block_runs(&l, &r, merge);
            let back: Vec<(usize, usize)> = runs
                .iter()
                .flat_map(|x| (0..x.count).map(move |k| ((x.local + k) as usize, (x.remote + k) as usize)))
                .collect();
            prop_assert_eq!(back, ids.clone());
            if !merge {
                prop_assert_eq!(runs.len(), ids.len());
            }
            // Merged runs are maximal: no two neighbours continue each other.
            for w in runs.windows(2) {
                if merge {
                    prop_assert!(!(w[0].local + w[0].count == w[1].local && w[0].remote + w[0].count == w[1].remote));
                }
            }
        }

        /// A strided transfer moves exactly the bytes its flat expansion names: expanding the
        /// segments byte by byte equals expanding block `ids[k]` of every layer.
        #[test]
        fn segments_match_the_flat_expansion(
            layers in proptest::collection::vec(layer(), 1..4),
            picks in proptest::collection::vec((0u64..1000, 0u64..1000), 1..12),
            merge: bool,
        ) {
            let pairs: Vec<LayerPair> = layers
                .iter()
                .map(|&(la, lg, ra, rg, len, count)| {
                    pair(StridedDesc::new(la, len + lg, len, count), StridedDesc::new(ra, len + rg, len, count))
                })
                .collect();
            let min_count = layers.iter().map(|l| l.5).min().unwrap_or(1);
            let (l, r): (Vec<usize>, Vec<usize>) = picks
                .iter()
                .map(|&(a, b)| ((a % min_count) as usize, (b % min_count) as usize))
                .unzip();
            let s = spec(pairs.clone(), block_runs(&l, &r, merge));
            let mut want = Vec::new();
            for p in &pairs {
                for (&a, &b) in l.iter().zip(&r) {
                    let (x, y) = (p.local.block(a as u64).unwrap(), p.remote.block(b as u64).unwrap());
                    for k in 0..x.len {
                        want.push((x.addr + k, y.addr + k));
                    }
                }
            }
            let mut got = Vec::new();
            let mut segs = 0;
            for (_, a, b, n) in s.segments() {
                segs += 1;
                for k in 0..n {
                    got.push((a + k, b + k));
                }
            }
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(segs, s.segment_count());
            prop_assert_eq!(s.total_bytes(), want.len() as u64);
            prop_assert_eq!(s.block_count(), (l.len() * pairs.len()) as u64);
            let m = s.materialize();
            prop_assert_eq!(m.segments.len(), segs);
            prop_assert_eq!(m.total_bytes(), s.total_bytes());
        }

        /// `to_desc_list` lists block `i` of layer `l` at `sum(counts before l) + i`, and
        /// every block lies inside `[addr, end)`.
        #[test]
        fn flat_list_matches_blocks(layers in proptest::collection::vec(layer(), 0..4)) {
            let t = StridedDescList::from_descs(
                MemKind::Dram,
                layers.iter().map(|&(a, g, _, _, len, count)| StridedDesc::new(a, len + g, len, count)),
            );
            let flat = t.to_desc_list();
            prop_assert_eq!(flat.len() as u64, t.block_count().unwrap());
            let mut i = 0;
            for d in t.descs() {
                prop_assert!(d.problem().is_none());
                for b in 0..d.count {
                    let x = flat.descs()[i];
                    prop_assert_eq!(Some(x), d.block(b));
                    prop_assert!(x.addr >= d.addr && x.addr + x.len <= d.end().unwrap());
                    i += 1;
                }
            }
        }
    }

    proptest! {
        /// A tile table moves exactly its tiles' rows: the segments of a spec with `rows` are,
        /// layer by layer and tile by tile, row `(a, b)` of each tile at its block and offset
        /// on both sides; merged runs expand back to the tiles; and a whole block is the
        /// identity tile (one row of the block's length at offset 0).
        #[test]
        fn tile_segments_are_the_rows(
            layers in proptest::collection::vec((0u64..1 << 20, 0u64..1 << 20), 1..3),
            outer in 1u64..4,
            inner in 1u64..4,
            row in 1u64..9,
            tiles in proptest::collection::vec((0u64..6, 0u64..2, 0u64..6, 0u64..2), 1..8),
            merge: bool,
        ) {
            use crate::tiles::{RowStrides, Tile, TileShape};
            // Local rows inner-first, remote rows outer-first (an HND <-> NHD permute).
            let shape = TileShape {
                outer,
                inner,
                row,
                local: RowStrides::new(inner * row, row),
                remote: RowStrides::new(row, outer * row),
            };
            let tile_len = outer * inner * row;
            let block = 2 * tile_len;
            let pairs: Vec<LayerPair> = layers
                .iter()
                .map(|&(la, ra)| pair(StridedDesc::new(la, block, block, 6), StridedDesc::new(ra, block, block, 6)))
                .collect();
            let tiles: Vec<Tile> = tiles
                .iter()
                .map(|&(lb, lo, rb, ro)| Tile {
                    local_block: lb,
                    local_offset: lo * tile_len,
                    remote_block: rb,
                    remote_offset: ro * tile_len,
                })
                .collect();
            let mut s = spec(pairs.clone(), tile_runs(&tiles, merge));
            s.rows = Some(shape);
            let back: Vec<Tile> = s
                .runs
                .iter()
                .flat_map(|r| (0..r.count).map(move |k| Tile {
                    local_block: r.local + k,
                    local_offset: r.local_offset,
                    remote_block: r.remote + k,
                    remote_offset: r.remote_offset,
                }))
                .collect();
            prop_assert_eq!(&back, &tiles);
            let mut want = Vec::new();
            for p in &pairs {
                for t in &tiles {
                    let lt = p.local.addr + t.local_block * p.local.stride + t.local_offset;
                    let rt = p.remote.addr + t.remote_block * p.remote.stride + t.remote_offset;
                    for a in 0..outer {
                        for b in 0..inner {
                            want.push((lt + a * inner * row + b * row, rt + a * row + b * outer * row, row));
                        }
                    }
                }
            }
            let got: Vec<(u64, u64, u64)> = s.segments().map(|(_, a, b, n)| (a, b, n)).collect();
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(s.segment_count(), want.len());
            prop_assert_eq!(s.total_bytes(), want.len() as u64 * row);

            // Whole blocks are identity tiles: the same segments as a tile of one row of the
            // block's length at offset 0, when nothing merges.
            let ids: Vec<usize> = tiles.iter().map(|t| t.local_block as usize).collect();
            let rids: Vec<usize> = tiles.iter().map(|t| t.remote_block as usize).collect();
            let whole = spec(pairs.clone(), block_runs(&ids, &rids, false));
            let mut identity = spec(
                pairs,
                tiles
                    .iter()
                    .map(|t| BlockRun::blocks(t.local_block, t.remote_block, 1))
                    .collect(),
            );
            identity.rows = Some(TileShape {
                outer: 1,
                inner: 1,
                row: block,
                local: RowStrides::default(),
                remote: RowStrides::default(),
            });
            let (w, i): (Vec<_>, Vec<_>) = (whole.segments().collect(), identity.segments().collect());
            prop_assert_eq!(w, i);
        }
    }

    #[test]
    fn out_of_range_layer_has_no_segments() {
        let s = spec(
            vec![pair(
                StridedDesc::new(0, 8, 8, 4),
                StridedDesc::new(64, 8, 8, 4),
            )],
            vec![BlockRun::blocks(0, 1, 2)],
        );
        assert_eq!(s.layer_segments(1).count(), 0);
        assert_eq!(s.layer_segments(0).collect::<Vec<_>>(), vec![(0, 72, 16)]);
    }
}
