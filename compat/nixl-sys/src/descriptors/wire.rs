//! The byte form of serialized descriptor lists: nixl-sys's (bincode 1 with its default
//! options: a little-endian `u32` enum index, `u64` lengths and `usize`s), so lists move between
//! a nixl-sys program and one on this crate. Decoding is bounded by the input: a count larger
//! than the bytes left could hold is refused before anything is allocated.

use super::MemType;

pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn new(kind: MemType, count: usize) -> Self {
        let mut w = Writer(Vec::with_capacity(12 + count * 24));
        w.0.extend_from_slice(&kind.index().to_le_bytes());
        w.u64(count as u64);
        w
    }

    pub(super) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    /// A descriptor's address, length and device.
    pub(super) fn desc(&mut self, addr: usize, len: usize, dev_id: u64) {
        self.u64(addr as u64);
        self.u64(len as u64);
        self.u64(dev_id);
    }

    pub(super) fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
}

pub(super) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads the header: the memory type and a count of items of at least `min_item` bytes.
    pub(super) fn new(bytes: &'a [u8], min_item: usize) -> Option<(Self, MemType, usize)> {
        let mut r = Reader { rest: bytes };
        let kind = MemType::from_index(u32::from_le_bytes(r.take(4)?.try_into().ok()?))?;
        let count = usize::try_from(r.u64()?).ok()?;
        if count > r.rest.len() / min_item {
            return None;
        }
        Some((r, kind, count))
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.rest.len() < n {
            return None;
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Some(a)
    }

    pub(super) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    pub(super) fn usize(&mut self) -> Option<usize> {
        usize::try_from(self.u64()?).ok()
    }

    pub(super) fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.usize()?;
        Some(self.take(n)?.to_vec())
    }

    /// Whether every byte was read (trailing bytes are refused).
    pub(super) fn done(&self) -> bool {
        self.rest.is_empty()
    }
}
