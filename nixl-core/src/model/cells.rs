//! [`CellGrid`]: cells of one length over several spans, one bit each, so ranges that cover
//! whole cells are proven pairwise disjoint in linear time (no sort).

/// Cells of `cell` bytes laid over spans (regions, or groups of copies) one after another, one
/// bit each. [`CellGrid::cover`] marks a range's cells and says whether any was marked before:
/// ranges that each cover whole cells, all covered without a refusal, share no byte. Used by
/// the agent for a prepared list's descriptors and by `CUDA_IPC` for a request's destinations.
#[derive(Debug)]
pub struct CellGrid {
    cell: u64,
    /// Each span's first cell.
    base: Vec<u64>,
    /// Each span's cell count.
    cells: Vec<u64>,
    seen: Vec<u64>,
}

impl CellGrid {
    /// A grid of `cell`-byte cells (at least 1) over spans of `lens` bytes each; `None` where
    /// it would take more than `most` cells.
    pub fn new(cell: u64, lens: impl IntoIterator<Item = u64>, most: u64) -> Option<Self> {
        let cell = cell.max(1);
        let (mut base, mut cells) = (Vec::new(), Vec::new());
        let mut total = 0u64;
        for len in lens {
            let n = len.div_ceil(cell);
            base.push(total);
            cells.push(n);
            total = total.checked_add(n).filter(|&t| t <= most)?;
        }
        crate::work::tick(base.len());
        Some(CellGrid {
            cell,
            base,
            cells,
            seen: vec![0; usize::try_from(total.div_ceil(64)).ok()?],
        })
    }

    /// Marks the cells of `[off, off + len)` in span `span`; `false` (not proven disjoint)
    /// where one of them was marked already, where `off` or `len` is not a whole number of
    /// cells, or where the range leaves the span. An empty range is covered.
    pub fn cover(&mut self, span: usize, off: u64, len: u64) -> bool {
        let (Some(&b), Some(&n)) = (self.base.get(span), self.cells.get(span)) else {
            return false;
        };
        if !off.is_multiple_of(self.cell) || !len.is_multiple_of(self.cell) {
            return false;
        }
        let (first, count) = (off / self.cell, len / self.cell);
        if first.checked_add(count).is_none_or(|end| end > n) {
            return false;
        }
        for c in b + first..b + first + count {
            let (w, bit) = ((c / 64) as usize, 1u64 << (c % 64));
            let Some(word) = self.seen.get_mut(w) else {
                return false;
            };
            if *word & bit != 0 {
                return false;
            }
            *word |= bit;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disjoint_ranges_are_covered_and_a_repeat_is_refused() {
        let mut g = CellGrid::new(16, [64, 32], 100).unwrap();
        assert!(g.cover(0, 0, 32));
        assert!(g.cover(0, 32, 32));
        assert!(g.cover(1, 0, 16), "another span's cells are its own");
        assert!(!g.cover(0, 16, 16), "a cell covered twice");
        assert!(!g.cover(1, 8, 16), "not on the grid");
        assert!(!g.cover(1, 16, 32), "past the span");
        assert!(!g.cover(2, 0, 16), "no such span");
        assert!(g.cover(1, 16, 0), "an empty range");
    }

    #[test]
    fn a_grid_over_its_limit_is_not_made() {
        assert!(CellGrid::new(16, [64 * 16], 63).is_none());
        assert!(CellGrid::new(16, [64 * 16], 64).is_some());
        assert!(CellGrid::new(1, [u64::MAX, u64::MAX], u64::MAX).is_none());
    }
}
