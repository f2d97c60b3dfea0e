//! The range index behind registration and peer-region look-ups: regions keyed by
//! (kind, device, start address, sequence), and the longest region per (kind, device) so a
//! look-up only scans regions that could cover the range (O(log n) plus the overlapping
//! candidates, not every region below the address).

use std::collections::{BTreeMap, HashMap};

use crate::mem::MemKind;

/// Orders regions by (kind, device, start address, unique sequence) for range look-ups.
pub(crate) type RegionKey = (MemKind, u64, u64, u64);

/// Regions by start address with a bound on backward scans.
pub(crate) struct RegionIndex<V> {
    map: BTreeMap<RegionKey, V>,
    /// The longest region ever inserted per (kind, device): a region starting more than this
    /// below a range cannot cover it. Never shrinks (a stale bound only costs a longer scan).
    longest: HashMap<(MemKind, u64), u64>,
}

impl<V> Default for RegionIndex<V> {
    fn default() -> Self {
        RegionIndex {
            map: BTreeMap::new(),
            longest: HashMap::new(),
        }
    }
}

impl<V> RegionIndex<V> {
    /// Inserts a region of `len` bytes under `key`.
    pub(crate) fn insert(&mut self, key: RegionKey, len: u64, value: V) {
        crate::work::tick(1);
        let l = self.longest.entry((key.0, key.1)).or_insert(0);
        *l = (*l).max(len);
        self.map.insert(key, value);
    }

    /// Removes a region.
    pub(crate) fn remove(&mut self, key: &RegionKey) -> Option<V> {
        crate::work::tick(1);
        self.map.remove(key)
    }

    /// Moves every region of `other` into this index.
    pub(crate) fn append(&mut self, other: &mut RegionIndex<V>) {
        for (k, l) in other.longest.drain() {
            let e = self.longest.entry(k).or_insert(0);
            *e = (*e).max(l);
        }
        self.map.append(&mut other.map);
    }

    /// The nearest-starting region among those that could cover `[addr, addr + len)` on
    /// `(kind, dev)` for which `covers` holds.
    pub(crate) fn find<'a>(
        &'a self,
        kind: MemKind,
        dev: u64,
        addr: u64,
        len: u64,
        covers: impl FnMut(&'a V) -> bool,
    ) -> Option<&'a V> {
        self.find_key(kind, dev, addr, len, covers).map(|(_, v)| v)
    }

    /// As [`RegionIndex::find`], with a bound for reusing the answer: `find` returns the same
    /// region for every range it covers that starts below the bound (no other region of
    /// `(kind, dev)` starts between it and the bound). Lets a caller resolve a run of
    /// descriptors in one region with one look-up.
    pub(crate) fn find_bounded<'a>(
        &'a self,
        kind: MemKind,
        dev: u64,
        addr: u64,
        len: u64,
        covers: impl FnMut(&'a V) -> bool,
    ) -> Option<(&'a V, u64)> {
        use std::ops::Bound::{Excluded, Included};
        let (key, v) = self.find_key(kind, dev, addr, len, covers)?;
        crate::work::tick(1);
        let next = self
            .map
            .range((Excluded(*key), Included((kind, dev, u64::MAX, u64::MAX))))
            .next()
            .map_or(u64::MAX, |(k, _)| k.2);
        Some((v, next))
    }

    fn find_key<'a>(
        &'a self,
        kind: MemKind,
        dev: u64,
        addr: u64,
        len: u64,
        mut covers: impl FnMut(&'a V) -> bool,
    ) -> Option<(&'a RegionKey, &'a V)> {
        let longest = *self.longest.get(&(kind, dev))?;
        let end = addr.checked_add(len)?;
        let lowest = end.saturating_sub(longest);
        if lowest > addr {
            return None;
        }
        crate::work::tick(1);
        self.map
            .range((kind, dev, lowest, 0)..=(kind, dev, addr, u64::MAX))
            .rev()
            .find(|(_, v)| {
                crate::work::tick(1);
                covers(v)
            })
    }

    /// How many regions it holds.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Every region, in key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.map.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (start, len) regions; `find` must agree with a linear scan.
    #[test]
    fn find_agrees_with_a_linear_scan() {
        let regions: Vec<(u64, u64)> = vec![
            (0, 100),
            (50, 10),
            (200, 4096),
            (300, 8),
            (5000, 1),
            (5000, 2),
            (9000, 1 << 20),
        ];
        let mut idx = RegionIndex::default();
        for (i, &(s, l)) in regions.iter().enumerate() {
            idx.insert((MemKind::Dram, 0, s, i as u64), l, (s, l));
        }
        for addr in (0..12_000u64).step_by(7) {
            for len in [1u64, 5, 64, 4000] {
                let covers = |&(s, l): &(u64, u64)| addr >= s && addr + len <= s + l;
                let want = regions
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| covers(r))
                    .max_by_key(|(i, r)| (r.0, *i))
                    .map(|(_, r)| *r);
                let got = idx.find(MemKind::Dram, 0, addr, len, covers).copied();
                assert_eq!(got, want, "addr {addr} len {len}");
            }
        }
        // The bound: every range the found region covers below it finds the same region.
        for addr in (0..12_000u64).step_by(13) {
            let covers = |a: u64, l: u64| move |&(s, n): &(u64, u64)| a >= s && a + l <= s + n;
            let Some((&r, bound)) = idx.find_bounded(MemKind::Dram, 0, addr, 1, covers(addr, 1))
            else {
                continue;
            };
            for a2 in r.0..(r.0 + r.1).min(bound).min(r.0 + 5000) {
                let again = idx.find(MemKind::Dram, 0, a2, 1, covers(a2, 1)).copied();
                assert_eq!(again, Some(r), "addr {a2} below bound {bound}");
            }
        }
        assert!(idx.find(MemKind::Vram, 0, 10, 1, |_| true).is_none());
        assert!(idx.find(MemKind::Dram, 0, u64::MAX, 2, |_| true).is_none());
    }
}
