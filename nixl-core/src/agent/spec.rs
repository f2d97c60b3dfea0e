//! What a request moves, as the request keeps it: segments, or a block table (whole blocks
//! or tiles).

use crate::backend::XferSpec;
use crate::strided::BlockXferSpec;

/// What a request moves: segments, or a block table a backend consumes as strides.
pub(crate) enum ReqSpec {
    Segments(XferSpec),
    Blocks(BlockXferSpec),
}

impl ReqSpec {
    pub(crate) fn remote(&self) -> &str {
        match self {
            ReqSpec::Segments(s) => &s.remote,
            ReqSpec::Blocks(b) => &b.remote,
        }
    }

    /// Calls `f((local addr, remote addr, remote dev, len))` for every segment.
    pub(crate) fn for_each_segment(&self, mut f: impl FnMut((u64, u64, u64, u64))) {
        match self {
            ReqSpec::Segments(s) => {
                for g in &s.segments {
                    f((g.local_addr, g.remote_addr, g.remote_dev, g.len));
                }
            }
            ReqSpec::Blocks(b) => {
                for (l, la, ra, len) in b.segments() {
                    f((la, ra, b.layers[l].remote.dev_id, len));
                }
            }
        }
    }
}
