//! What a post issues: merged segments or a block table walked per post. Shared by the UCX
//! put/get path (`crate::xfer`) and direct CMA (`crate::direct_cma`).

use nixl_core::backend::BlockRun;
use nixl_core::StridedDesc;

use crate::sys;

/// One merged segment: local address, remote address, length, local memory handle, rkey.
#[derive(Clone, Copy)]
pub(crate) struct Seg {
    pub local: u64,
    pub remote: u64,
    pub len: u64,
    pub memh: sys::MemH,
    pub rkey: sys::Rkey,
}

/// One layer of a block-table transfer: both sides' runs and the checked handles.
#[derive(Clone, Copy)]
pub(crate) struct BlockLayer {
    pub local: StridedDesc,
    pub remote: StridedDesc,
    /// Blocks are contiguous on both sides: a run of ids is one put/get.
    pub dense: bool,
    pub memh: sys::MemH,
    pub rkey: sys::Rkey,
}

/// What a post issues: a list of segments, or a block table walked per post (addresses are
/// computed from the layer and the id; nothing is stored per block).
pub(crate) enum Work {
    Segs(Vec<Seg>),
    Blocks {
        layers: Vec<BlockLayer>,
        runs: Vec<BlockRun>,
        /// Puts/gets per post.
        segments: usize,
    },
}

impl Work {
    /// Operations per post.
    pub(crate) fn len(&self) -> usize {
        match self {
            Work::Segs(v) => v.len(),
            Work::Blocks { segments, .. } => *segments,
        }
    }

    /// Bytes per post.
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            Work::Segs(v) => v.iter().map(|s| s.len).sum(),
            Work::Blocks { layers, runs, .. } => {
                let ids: u64 = runs.iter().map(|r| r.count).sum();
                layers.iter().map(|l| l.local.len.saturating_mul(ids)).sum()
            }
        }
    }

    /// Calls `f` on every segment in order until it returns `false`; returns whether every
    /// call returned `true`.
    pub(crate) fn each(&self, mut f: impl FnMut(&Seg) -> bool) -> bool {
        match self {
            Work::Segs(v) => v.iter().all(f),
            Work::Blocks { layers, runs, .. } => {
                for l in layers {
                    for r in runs {
                        // In bounds: the agent checked every id against every layer's count.
                        let (la, ra) = (
                            l.local.addr + r.local * l.local.stride,
                            l.remote.addr + r.remote * l.remote.stride,
                        );
                        if l.dense {
                            let s = Seg {
                                local: la,
                                remote: ra,
                                len: r.count * l.local.len,
                                memh: l.memh,
                                rkey: l.rkey,
                            };
                            if !f(&s) {
                                return false;
                            }
                            continue;
                        }
                        for k in 0..r.count {
                            let s = Seg {
                                local: la + k * l.local.stride,
                                remote: ra + k * l.remote.stride,
                                len: l.local.len,
                                memh: l.memh,
                                rkey: l.rkey,
                            };
                            if !f(&s) {
                                return false;
                            }
                        }
                    }
                }
                true
            }
        }
    }
}
