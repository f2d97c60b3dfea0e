//! Tiles: a block-table transfer that rearranges rows on the way, so data lands in the
//! destination's layout in one pass (a KV cache's HND <-> NHD permute, heads gathered into or
//! sliced out of a block) instead of being moved as it is and permuted by a second kernel.
//!
//! A [`TileShape`] says how one tile's rows lie on each side: `outer x inner` rows of `row`
//! bytes, row `(a, b)` at `a * outer + b * inner` bytes from the tile's start, with strides per
//! side ([`RowStrides`]). A [`Tile`] places one tile: a block id and a byte offset in that
//! block, per side. [`Agent::make_tile_xfer`](crate::Agent::make_tile_xfer) pairs the layers
//! of two block tables as [`Agent::make_block_xfer`](crate::Agent::make_block_xfer) does and
//! moves every tile in every layer: the same request, whose blocks are tiles with their rows
//! rearranged ([`BlockXferSpec::rows`](crate::backend::BlockXferSpec::rows)); a whole block is
//! the identity tile. Only backends that can rearrange bytes take it (the copy kernel of
//! `CUDA_IPC`, `INPROC`: [`Backend::rearranges_rows`](crate::backend::Backend::rearranges_rows));
//! the others are never offered it, and a request no backend takes is refused typed
//! (`NotSupported`), never moved with its bytes unpermuted.

/// Where a tile's rows lie on one side, in bytes from the tile's start: row `(a, b)` at
/// `a * outer + b * inner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RowStrides {
    /// Bytes between rows `(a, b)` and `(a + 1, b)`.
    pub outer: u64,
    /// Bytes between rows `(a, b)` and `(a, b + 1)`.
    pub inner: u64,
}

impl RowStrides {
    /// Rows `outer` then `inner` bytes apart.
    pub fn new(outer: u64, inner: u64) -> Self {
        RowStrides { outer, inner }
    }
}

/// One tile's rows on both sides: `outer x inner` rows of `row` bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct TileShape {
    /// Rows along the outer index `a`.
    pub outer: u64,
    /// Rows along the inner index `b`.
    pub inner: u64,
    /// Bytes per row.
    pub row: u64,
    /// The rows on the local side.
    pub local: RowStrides,
    /// The rows on the remote side.
    pub remote: RowStrides,
}

/// The most rows one tile may have (the copy kernel indexes them in 32 bits, as vectors).
pub const MAX_TILE_ROWS: u64 = 1 << 24;

impl TileShape {
    /// `outer x inner` rows of `row` bytes, laid out by `local` and `remote`.
    pub fn new(outer: u64, inner: u64, row: u64, local: RowStrides, remote: RowStrides) -> Self {
        TileShape {
            outer,
            inner,
            row,
            local,
            remote,
        }
    }

    /// Bytes one tile moves.
    pub fn bytes(&self) -> u64 {
        self.outer
            .saturating_mul(self.inner)
            .saturating_mul(self.row)
    }

    /// Bytes from a tile's start to one past its last row on a side with strides `s`
    /// (`None` on overflow).
    pub fn extent(&self, s: &RowStrides) -> Option<u64> {
        let a = self.outer.checked_sub(1)?.checked_mul(s.outer)?;
        let b = self.inner.checked_sub(1)?.checked_mul(s.inner)?;
        a.checked_add(b)?.checked_add(self.row)
    }

    /// The offset of row `(a, b)` from the tile's start on a side with strides `s`.
    pub fn row_offset(&self, s: &RowStrides, a: u64, b: u64) -> u64 {
        a * s.outer + b * s.inner
    }

    /// Why the shape is malformed, if it is: no rows, empty rows, too many rows, a side whose
    /// rows overlap each other (neither nesting of the two indices keeps them apart), or a
    /// tile past `u64::MAX`.
    pub fn problem(&self) -> Option<String> {
        if self.outer == 0 || self.inner == 0 {
            return Some("a tile has no rows".to_owned());
        }
        if self.row == 0 {
            return Some("rows are empty".to_owned());
        }
        if self.outer.saturating_mul(self.inner) > MAX_TILE_ROWS {
            return Some(format!(
                "a tile of {} x {} rows exceeds {MAX_TILE_ROWS} rows",
                self.outer, self.inner
            ));
        }
        for (side, s) in [("local", &self.local), ("remote", &self.remote)] {
            if self.extent(s).is_none() {
                return Some(format!("the {side} tile's extent overflows"));
            }
            if !self.rows_apart(s) {
                return Some(format!(
                    "the {side} rows overlap (strides outer {} inner {} for rows of {} bytes)",
                    s.outer, s.inner, self.row
                ));
            }
        }
        None
    }

    /// Whether no two rows on a side with strides `s` share a byte: one index's rows are
    /// apart and the other index steps over a whole run of them.
    fn rows_apart(&self, s: &RowStrides) -> bool {
        let (a, b, r) = (self.outer, self.inner, self.row);
        let run = |n: u64, stride: u64| (n - 1).saturating_mul(stride).saturating_add(r);
        let inner_first = (b == 1 || s.inner >= r) && (a == 1 || s.outer >= run(b, s.inner));
        let outer_first = (a == 1 || s.outer >= r) && (b == 1 || s.inner >= run(a, s.outer));
        inner_first || outer_first
    }
}

/// Where one tile lies: in every layer, block `local_block` at `local_offset` bytes on the
/// local side and block `remote_block` at `remote_offset` on the remote side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tile {
    /// The local block id.
    pub local_block: u64,
    /// Bytes from the local block's start to the tile's.
    pub local_offset: u64,
    /// The remote block id.
    pub remote_block: u64,
    /// Bytes from the remote block's start to the tile's.
    pub remote_offset: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(outer: u64, inner: u64, row: u64, l: (u64, u64), r: (u64, u64)) -> TileShape {
        TileShape {
            outer,
            inner,
            row,
            local: RowStrides::new(l.0, l.1),
            remote: RowStrides::new(r.0, r.1),
        }
    }

    #[test]
    fn shapes_are_checked() {
        // HND [4 heads][16 tokens][256] <-> NHD [16 tokens][8 heads][256] (a head slice).
        let ok = shape(4, 16, 256, (256, 2048), (4096, 256));
        assert_eq!(ok.problem(), None);
        assert_eq!(ok.bytes(), 4 * 16 * 256);
        assert_eq!(ok.extent(&ok.local), Some(3 * 256 + 15 * 2048 + 256));
        assert_eq!(ok.extent(&ok.remote), Some(3 * 4096 + 15 * 256 + 256));
        assert!(shape(0, 1, 16, (16, 16), (16, 16)).problem().is_some());
        assert!(shape(1, 1, 0, (16, 16), (16, 16)).problem().is_some());
        // Rows of 256 bytes 128 apart overlap.
        assert!(shape(2, 1, 256, (128, 0), (256, 0))
            .problem()
            .unwrap()
            .contains("local rows overlap"));
        // Two indices landing on the same rows (outer 0 apart).
        assert!(shape(2, 2, 16, (16, 32), (0, 16)).problem().is_some());
        assert!(shape(2, 2, 16, (u64::MAX, 16), (32, 16))
            .problem()
            .is_some());
        assert!(shape(1 << 13, 1 << 12, 16, (16 << 12, 16), (16, 16 << 13))
            .problem()
            .unwrap()
            .contains("exceeds"));
        // Single rows need no strides.
        assert_eq!(shape(1, 1, 64, (0, 0), (0, 0)).problem(), None);
    }
}
