//! What a backend is handed to prepare a transfer: the merged segments, the backend metadata
//! of their regions, and the request's notification (re-exported for backend authors by
//! [`crate::backend`]; the data model needs them without the backend API).

use std::any::Any;
use std::sync::Arc;

use crate::desc::XferOp;
use crate::mem::MemKind;

/// Backend-private metadata of a registered or loaded region (a memory handle, an rkey). The
/// backend downcasts it with [`downcast_md`].
pub type BackendMd = Arc<dyn Any + Send + Sync>;

/// Downcasts backend metadata to the backend's own type.
pub fn downcast_md<T: Any + Send + Sync>(md: &BackendMd) -> Option<&T> {
    md.as_ref().downcast_ref::<T>()
}

/// The distinct metadata among `mds` (by identity), in first-seen order: what a prepared
/// transfer keeps alive. Linear: neighbours usually share a region, and the rest are found
/// in a set.
pub fn distinct_mds<'a>(mds: impl IntoIterator<Item = &'a BackendMd>) -> Vec<BackendMd> {
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<BackendMd> = Vec::new();
    let mut last: Option<*const ()> = None;
    for m in mds {
        crate::work::tick(1);
        let p = Arc::as_ptr(m) as *const ();
        if last == Some(p) {
            continue;
        }
        last = Some(p);
        if seen.insert(p as usize) {
            out.push(m.clone());
        }
    }
    out
}

/// One contiguous piece of a transfer, after merging. Its regions' metadata are named by index
/// into [`XferSpec::mds`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Local address (or offset).
    pub local_addr: u64,
    /// Local device id.
    pub local_dev: u64,
    /// The local region's backend metadata: an index into [`XferSpec::mds`].
    pub local_md: usize,
    /// Remote address (or offset, for storage).
    pub remote_addr: u64,
    /// Remote device id.
    pub remote_dev: u64,
    /// The remote region's backend metadata (from `load_remote` or `load_local`): an index
    /// into [`XferSpec::mds`].
    pub remote_md: usize,
    /// Length in bytes.
    pub len: u64,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("local_addr", &format_args!("{:#x}", self.local_addr))
            .field("remote_addr", &format_args!("{:#x}", self.remote_addr))
            .field("len", &self.len)
            .finish()
    }
}

/// A transfer for a backend to prepare.
#[derive(Debug, Clone)]
pub struct XferSpec {
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
    /// The segments, merged.
    pub segments: Vec<Segment>,
    /// The backend metadata of the segments' regions, which segments name by index: usually
    /// each region's once, so a backend checks (downcasts) each once and keeps them all
    /// alive by cloning this list (the same metadata may appear more than once). It may also
    /// hold the metadata of other regions of the request's two prepared lists (at most about
    /// twice the segments in all): a backend must not assume every entry is used.
    pub mds: Vec<BackendMd>,
    /// A notification to deliver to the remote after all data is complete.
    pub notif: Option<Vec<u8>>,
    /// One arrival counter for the whole request (checked by the agent: a READ into local
    /// VRAM, inside the local list's regions); only for a backend whose `supports_arrival`.
    pub arrival: Option<crate::ArrivalCounters>,
}

impl XferSpec {
    /// Total bytes.
    pub fn total_bytes(&self) -> u64 {
        crate::work::tick(self.segments.len());
        self.segments.iter().map(|s| s.len).sum()
    }

    /// Metadata `i` of [`XferSpec::mds`] (what [`Segment::local_md`] and
    /// [`Segment::remote_md`] name).
    pub fn md(&self, i: usize) -> Option<&BackendMd> {
        self.mds.get(i)
    }
}
