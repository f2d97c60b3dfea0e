//! What a backend is handed to prepare a transfer: the merged segments, the backend metadata
//! of their regions, and the request's notification (re-exported for backend authors by
//! [`crate::backend`]; the data model needs them without the backend API).

use std::any::Any;
use std::sync::{Arc, OnceLock};

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

/// The backend metadata a transfer's segments name by index ([`Segment::local_md`],
/// [`Segment::remote_md`]). Cloning it is cheap whatever its length (a backend keeps a clone
/// to hold the metadata alive while its transfer lives): it shares the prepared lists' own
/// per-region tables where a request names them whole, or one list of its own.
#[derive(Clone, Default)]
pub struct MdTable(MdRepr);

#[derive(Clone)]
enum MdRepr {
    /// A list of its own.
    Owned(Arc<Vec<BackendMd>>),
    /// Two tables laid end to end (the local list's regions, then the remote list's).
    Pair(Arc<MdList>, Arc<MdList>),
}

/// One prepared list's metadata table for one backend (each region's metadata, in region
/// order), shared by every request over the list; see [`MdTable::lists`]. A backend may keep
/// what it derives from the table (checked handles, say) beside it, made once for every
/// request over the list ([`MdList::derived`]).
pub struct MdList {
    mds: Box<[BackendMd]>,
    derived: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl MdList {
    /// A table of `mds`, nothing derived yet.
    pub fn new(mds: Vec<BackendMd>) -> Self {
        MdList {
            mds: mds.into_boxed_slice(),
            derived: OnceLock::new(),
        }
    }

    /// The metadata, in region order.
    pub fn mds(&self) -> &[BackendMd] {
        &self.mds
    }

    /// What `derive` makes of this table: made by the first call and kept for as long as the
    /// table lives (as long as any request or transfer holding it), so a value derived from
    /// the metadata stays valid for as long as the metadata. The table is immutable, and a
    /// backend derives one type of value from it: a call asking for another type than the
    /// value kept gets `None` (only a backend's own type is ever asked for: each backend has
    /// its own tables).
    pub fn derived<T: Any + Send + Sync>(
        &self,
        derive: impl FnOnce(&[BackendMd]) -> T,
    ) -> Option<&T> {
        self.derived
            .get_or_init(|| Box::new(derive(&self.mds)))
            .downcast_ref::<T>()
    }
}

impl std::fmt::Debug for MdList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MdList({} entries)", self.mds.len())
    }
}

impl Default for MdRepr {
    fn default() -> Self {
        MdRepr::Owned(Arc::default())
    }
}

impl MdTable {
    /// Tables `a` then `b`, end to end (index `a.len()` is `b[0]`).
    pub(crate) fn pair(a: Arc<MdList>, b: Arc<MdList>) -> Self {
        MdTable(MdRepr::Pair(a, b))
    }

    /// The two prepared lists' tables `(local, remote)` where this table is them end to end
    /// (index `i` is `local`'s entry `i` below `local.mds().len()`, else `remote`'s entry
    /// `i - local.mds().len()`); `None` for a list of the request's own.
    pub fn lists(&self) -> Option<(&MdList, &MdList)> {
        match &self.0 {
            MdRepr::Owned(_) => None,
            MdRepr::Pair(a, b) => Some((a, b)),
        }
    }

    /// Metadata `i`.
    pub fn get(&self, i: usize) -> Option<&BackendMd> {
        match &self.0 {
            MdRepr::Owned(v) => v.get(i),
            MdRepr::Pair(a, b) => match i.checked_sub(a.mds.len()) {
                None => a.mds.get(i),
                Some(j) => b.mds.get(j),
            },
        }
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        match &self.0 {
            MdRepr::Owned(v) => v.len(),
            MdRepr::Pair(a, b) => a.mds.len() + b.mds.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each in index order.
    pub fn iter(&self) -> impl Iterator<Item = &BackendMd> {
        let (a, b): (&[BackendMd], &[BackendMd]) = match &self.0 {
            MdRepr::Owned(v) => (v, &[]),
            MdRepr::Pair(a, b) => (&a.mds, &b.mds),
        };
        a.iter().chain(b)
    }

    /// Appends `md`; its index.
    pub fn push(&mut self, md: BackendMd) -> usize {
        let mut v: Vec<BackendMd> = match std::mem::take(&mut self.0) {
            MdRepr::Owned(v) => Arc::try_unwrap(v).unwrap_or_else(|v| (*v).clone()),
            MdRepr::Pair(a, b) => a.mds.iter().chain(b.mds.iter()).cloned().collect(),
        };
        v.push(md);
        let i = v.len() - 1;
        self.0 = MdRepr::Owned(Arc::new(v));
        i
    }
}

impl From<Vec<BackendMd>> for MdTable {
    fn from(v: Vec<BackendMd>) -> Self {
        MdTable(MdRepr::Owned(Arc::new(v)))
    }
}

impl std::fmt::Debug for MdTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MdTable({} entries)", self.len())
    }
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
    /// alive by cloning this table, which costs the same whatever its length (the same
    /// metadata may appear more than once). It may also
    /// hold the metadata of other regions of the request's two prepared lists (at most about
    /// twice the segments in all): a backend must not assume every entry is used.
    pub mds: MdTable,
    /// A notification to deliver to the remote after all data is complete.
    pub notif: Option<Vec<u8>>,
    /// One arrival counter for the whole request (checked by the agent: a READ into local
    /// VRAM, inside the local list's regions); only for a backend whose `supports_arrival`.
    pub arrival: Option<crate::ArrivalCounters>,
    /// The agent proved that no two segments' destinations share a byte (each destination
    /// named once, over a prepared list whose descriptors are pairwise disjoint), in the
    /// destination agent's addresses. Sources are not covered: where sources and destinations
    /// live in one address space (a transfer to the agent itself, or to a peer in this
    /// process) a destination may still meet a source ([`XferSpec::ends_apart`]). `false`
    /// says nothing.
    pub dst_disjoint: bool,
    /// The agent proved that no region of the destination's list shares an address with a
    /// region of the source's list (on one device): where both sides live in one address
    /// space, no destination meets a source. Addresses of two processes' memory are compared
    /// as numbers (they may coincide): `false` says nothing.
    pub ends_apart: bool,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn md(v: u32) -> BackendMd {
        Arc::new(v)
    }

    fn values(t: &MdTable) -> Vec<u32> {
        t.iter()
            .map(|m| *downcast_md::<u32>(m).expect("a u32"))
            .collect()
    }

    #[test]
    fn a_pair_indexes_its_tables_end_to_end_and_shares_them_when_cloned() {
        let a = Arc::new(MdList::new(vec![md(0), md(1)]));
        let b = Arc::new(MdList::new(vec![md(2), md(3), md(4)]));
        let t = MdTable::pair(a.clone(), b.clone());
        assert_eq!(t.len(), 5);
        assert!(!t.is_empty());
        assert_eq!(values(&t), [0, 1, 2, 3, 4]);
        for i in 0..5 {
            assert_eq!(
                downcast_md::<u32>(t.get(i).expect("in range")),
                Some(&(i as u32))
            );
        }
        assert!(t.get(5).is_none());
        // A clone shares both tables (the metadata are not cloned one by one).
        let c = t.clone();
        assert_eq!(Arc::strong_count(&a), 3);
        assert_eq!(Arc::strong_count(&b), 3);
        assert!(Arc::ptr_eq(c.get(3).expect("in range"), &b.mds()[1]));
        assert_eq!(Arc::strong_count(&b.mds()[1]), 1);
        let (l, r) = c.lists().expect("a pair");
        assert!(std::ptr::eq(l, &*a) && std::ptr::eq(r, &*b));
        assert!(MdTable::from(vec![md(0)]).lists().is_none());
    }

    #[test]
    fn a_list_derives_once_for_every_request_and_keeps_one_type() {
        let list = Arc::new(MdList::new(vec![md(3), md(4)]));
        let t1 = MdTable::pair(list.clone(), Arc::new(MdList::new(Vec::new())));
        let t2 = MdTable::pair(list.clone(), Arc::new(MdList::new(Vec::new())));
        let mut runs = 0;
        // The sum of the local list's values, derived once.
        let mut sum = |t: &MdTable| -> u32 {
            *t.lists()
                .expect("a pair")
                .0
                .derived(|mds| {
                    runs += 1;
                    mds.iter()
                        .map(|m| *downcast_md::<u32>(m).expect("a u32"))
                        .sum::<u32>()
                })
                .expect("its type")
        };
        // Another request over the same list finds the value made for the first.
        let (first, again) = (sum(&t1), sum(&t2));
        assert_eq!((first, again, runs), (7, 7, 1));
        // Another type is not the value kept.
        assert!(list.derived(|_| String::new()).is_none());
    }

    #[test]
    fn push_appends_to_a_pair_and_to_a_shared_list_without_changing_the_others() {
        let a = Arc::new(MdList::new(vec![md(0)]));
        let b = Arc::new(MdList::new(vec![md(1)]));
        let mut t = MdTable::pair(a, b);
        let before = t.clone();
        assert_eq!(t.push(md(7)), 2);
        assert_eq!(values(&t), [0, 1, 7]);
        assert_eq!(values(&before), [0, 1]);
        let mut owned = MdTable::from(vec![md(5)]);
        let shared = owned.clone();
        assert_eq!(owned.push(md(6)), 1);
        assert_eq!(values(&owned), [5, 6]);
        assert_eq!(values(&shared), [5]);
        let mut empty = MdTable::default();
        assert!(empty.is_empty());
        assert_eq!(empty.push(md(9)), 0);
        assert_eq!(values(&empty), [9]);
    }
}
