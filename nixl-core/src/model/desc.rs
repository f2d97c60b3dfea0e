//! Transfer descriptors and descriptor lists.

use crate::bytes::{ByteReader, ByteWriter};
use crate::error::DecodeError;
use crate::mem::MemKind;

/// One transfer descriptor: an address (or storage offset), a length and a device id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Desc {
    /// Address, or offset for storage kinds.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Device id: GPU ordinal, file descriptor or object index; 0 for DRAM.
    pub dev_id: u64,
}

impl Desc {
    /// A descriptor on device 0 (DRAM).
    pub fn new(addr: u64, len: u64) -> Self {
        Desc {
            addr,
            len,
            dev_id: 0,
        }
    }

    /// A descriptor on a given device.
    pub fn on_device(addr: u64, len: u64, dev_id: u64) -> Self {
        Desc { addr, len, dev_id }
    }

    /// One past the last byte, or `None` on overflow.
    pub fn end(&self) -> Option<u64> {
        self.addr.checked_add(self.len)
    }
}

/// A list of transfer descriptors of one memory kind (NIXL's `nixl_xfer_dlist_t`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct XferDescList {
    kind: Option<MemKind>,
    descs: Vec<Desc>,
}

impl XferDescList {
    /// An empty list of the given kind.
    pub fn new(kind: MemKind) -> Self {
        XferDescList {
            kind: Some(kind),
            descs: Vec::new(),
        }
    }

    /// A list from descriptors.
    pub fn from_descs(kind: MemKind, descs: impl IntoIterator<Item = Desc>) -> Self {
        XferDescList {
            kind: Some(kind),
            descs: descs.into_iter().collect(),
        }
    }

    /// `count` consecutive blocks of `block` bytes starting at `base` on device 0.
    pub fn blocks(kind: MemKind, base: u64, block: u64, count: usize) -> Self {
        Self::from_descs(
            kind,
            (0..count as u64).map(|i| Desc::new(base + i * block, block)),
        )
    }

    /// Appends a descriptor.
    pub fn push(&mut self, desc: Desc) {
        self.descs.push(desc);
    }

    /// The memory kind (`Dram` for a default list).
    pub fn kind(&self) -> MemKind {
        self.kind.unwrap_or(MemKind::Dram)
    }

    /// The descriptors.
    pub fn descs(&self) -> &[Desc] {
        &self.descs
    }

    /// The number of descriptors.
    pub fn len(&self) -> usize {
        self.descs.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.descs.is_empty()
    }

    /// The total number of bytes, or `None` on overflow.
    pub fn total_bytes(&self) -> Option<u64> {
        self.descs
            .iter()
            .try_fold(0u64, |acc, d| acc.checked_add(d.len))
    }

    /// Serializes the list (NIXL's serialized descriptor lists), to tell a peer which blocks
    /// to read or write, e.g. in a notification: magic, kind, count, `(addr, len, dev_id)`
    /// each, little endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = ByteWriter::with_capacity(13 + self.descs.len() * 24);
        w.put(LIST_MAGIC)
            .put_u8(self.kind().tag())
            .put_len(self.descs.len());
        for d in &self.descs {
            w.put_u64(d.addr).put_u64(d.len).put_u64(d.dev_id);
        }
        w.into_vec()
    }

    /// Decodes [`XferDescList::encode`]'s bytes: bounded (at most `MAX_LIST` (2^24) descriptors,
    /// nothing allocated beyond the input's size) and typed; a descriptor whose range
    /// overflows is refused. Whether the descriptors lie in registered memory is checked
    /// later, by `prep_xfer_dlist`.
    ///
    /// Errors are the crate's [`Error::Decode`](crate::Error::Decode) (its agent is empty: the
    /// bytes are decoded outside any agent); [`XferDescList::decode_bytes`] gives the bare
    /// [`DecodeError`].
    pub fn decode(bytes: &[u8]) -> crate::Result<Self> {
        Self::decode_bytes(bytes).map_err(|e| e.outside_agent(crate::Op::GetNotifs))
    }

    /// [`XferDescList::decode`] with the bare [`DecodeError`].
    pub fn decode_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = ByteReader::new(bytes);
        r.magic(LIST_MAGIC)?;
        let kind = MemKind::from_tag(r.u8()?).ok_or(DecodeError::Invalid {
            what: "memory kind",
        })?;
        let n = r.count("descriptor count", MAX_LIST, 24)?;
        let mut descs = Vec::with_capacity(n);
        for _ in 0..n {
            let d = Desc::on_device(r.u64()?, r.u64()?, r.u64()?);
            if d.end().is_none() {
                return Err(DecodeError::Invalid {
                    what: "descriptor range",
                });
            }
            descs.push(d);
        }
        r.finish()?;
        Ok(XferDescList::from_descs(kind, descs))
    }
}

/// Magic of a serialized descriptor list.
const LIST_MAGIC: &[u8; 4] = b"NXDL";
/// Most descriptors in a serialized list.
pub(crate) const MAX_LIST: usize = 1 << 24;

/// The direction of a transfer, seen from the initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XferOp {
    /// Copy remote into local.
    Read,
    /// Copy local into remote.
    Write,
}

impl std::fmt::Display for XferOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            XferOp::Read => "READ",
            XferOp::Write => "WRITE",
        })
    }
}

/// Merges runs of segments that are contiguous on both sides: `(local, remote, len)` triples
/// whose next element continues both ranges become one. `same_run(i, j)` says whether two
/// neighbours share registrations (a merge must not cross one).
pub fn merge_contiguous<F>(segs: &[(u64, u64, u64)], mut same_run: F) -> Vec<(u64, u64, u64, usize)>
where
    F: FnMut(usize, usize) -> bool,
{
    let mut out: Vec<(u64, u64, u64, usize)> = Vec::with_capacity(segs.len());
    for (i, &(l, r, len)) in segs.iter().enumerate() {
        if let Some(last) = out.last_mut() {
            let prev = i - 1;
            if last.0.checked_add(last.2) == Some(l)
                && last.1.checked_add(last.2) == Some(r)
                && same_run(prev, i)
            {
                if let Some(n) = last.2.checked_add(len) {
                    last.2 = n;
                    continue;
                }
            }
        }
        out.push((l, r, len, i));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desc_lists_serialize_and_refuse_garbage() {
        let l = XferDescList::from_descs(
            MemKind::Vram,
            [Desc::on_device(0x1000, 64, 1), Desc::new(0x2000, 4096)],
        );
        let b = l.encode();
        assert_eq!(XferDescList::decode_bytes(&b), Ok(l));
        for n in 0..b.len() {
            assert!(XferDescList::decode(&b[..n]).is_err());
        }
        let mut bad = b.clone();
        bad[4] = 99;
        assert!(XferDescList::decode(&bad).is_err(), "unknown kind");
        let over = XferDescList::from_descs(MemKind::Dram, [Desc::new(u64::MAX, 2)]).encode();
        assert!(XferDescList::decode(&over).is_err(), "overflowing range");
    }
    use proptest::prelude::*;

    #[test]
    fn merges_only_when_both_sides_continue() {
        let segs = [(0, 100, 10), (10, 110, 10), (20, 200, 10), (30, 210, 5)];
        let m = merge_contiguous(&segs, |_, _| true);
        assert_eq!(m, vec![(0, 100, 20, 0), (20, 200, 15, 2)]);
        let m = merge_contiguous(&segs, |a, _| a != 0);
        assert_eq!(m, vec![(0, 100, 10, 0), (10, 110, 10, 1), (20, 200, 15, 2)]);
    }

    proptest! {
        /// Merging preserves every byte mapping: expanding the merged runs byte by byte gives
        /// the same (local, remote) pairs as the input.
        #[test]
        fn merge_preserves_mapping(segs in proptest::collection::vec((0u64..64, 0u64..64, 1u64..8), 0..20)) {
            let merged = merge_contiguous(&segs, |_, _| true);
            let expand = |v: &mut Vec<(u64, u64)>, l: u64, r: u64, n: u64| for k in 0..n { v.push((l + k, r + k)); };
            let mut a = Vec::new();
            for &(l, r, n) in &segs { expand(&mut a, l, r, n); }
            let mut b = Vec::new();
            for &(l, r, n, _) in &merged { expand(&mut b, l, r, n); }
            prop_assert_eq!(a, b);
            prop_assert!(merged.len() <= segs.len());
        }
    }
}
