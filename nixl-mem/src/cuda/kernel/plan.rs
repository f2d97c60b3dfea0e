//! The work of a launch: descriptors cut from segments, the grid, and the conflict check that
//! keeps dependent copies off the kernel.

#[allow(unused_imports)]
use super::*;
use nixl_core::backend::CellGrid;

/// One copy: `len` bytes from `src` to `dst`, both addresses the kernel can dereference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub src: u64,
    pub dst: u64,
    pub len: u64,
}

/// Whether two addresses share their alignment modulo 16 (the kernel's vector path; other
/// segments are copied byte by byte).
pub(crate) fn co_aligned(a: u64, b: u64) -> bool {
    (a ^ b) & 15 == 0
}

/// The first pair of copies `(dst, src, len)` (indices, in ascending order) that depend on
/// each other: a destination overlapping another copy's destination or source, or its own
/// source. Such copies must run one after another, in order (the kernel's CTAs and
/// `cuMemcpyBatchAsync`'s copies run in any order). Empty copies conflict with nothing.
///
/// `O(n)` where [`on_grids`] proves the copies independent (a block table's shape, runs of
/// blocks merged or not: every length a multiple of the shortest, each group's destinations
/// on one grid of that length, no destination span meeting another span), else `O(n log n)`
/// (a sort of every range).
pub(crate) fn conflict(copies: &[(u64, u64, u64)]) -> Option<(usize, usize)> {
    conflict_in_groups(copies, None)
}

/// [`conflict`] with each copy's `(destination group, source group)` (its regions, say:
/// `groups[i]` for `copies[i]`, each below twice `copies.len()` + 128): the linear proof then works
/// per group, so destinations spread over many separately allocated regions still qualify.
/// Groups only partition the proof's work; the answer depends on the addresses alone.
pub(crate) fn conflict_in_groups(
    copies: &[(u64, u64, u64)],
    groups: Option<&[(u32, u32)]>,
) -> Option<(usize, usize)> {
    if on_grids(copies, groups) {
        return None;
    }
    conflict_by_sort(copies)
}

/// Cells of the destination grids [`on_grids`] may mark per copy (and at least
/// `GRID_MIN_CELLS` in all): spans much larger than the copies are left to the sort.
pub(super) const GRID_CELLS_PER_COPY: u64 = 64;
pub(super) const GRID_MIN_CELLS: u64 = 1 << 16;

/// Whether the non-empty copies are provably independent in linear time (plus a sort of the
/// groups' spans): with `L` the shortest copy, every length is a multiple of `L`; in each
/// destination group every destination lies at a multiple of `L` from the group's lowest, so
/// a copy covers whole cells of length `L` on one grid, and no cell is covered twice; and no
/// group's destination span `[lowest start, highest end)` meets another destination span or
/// any source span (so no destination overlaps another group's destination or any source,
/// its own included). `false` means "not proven" (the sort decides), never "dependent".
pub(super) fn on_grids(copies: &[(u64, u64, u64)], groups: Option<&[(u32, u32)]>) -> bool {
    let group = |i: usize| groups.map_or((0, 0), |g| (g[i].0 as usize, g[i].1 as usize));
    if groups.is_some_and(|g| g.len() != copies.len()) {
        return false;
    }
    let Some(cell) = copies.iter().map(|c| c.2).filter(|&l| l > 0).min() else {
        return true;
    };
    let ngroups = copies.len().saturating_mul(2) + 128;
    // [lowest start, highest end) per destination group and per source group.
    let mut dspan: Vec<(u64, u64)> = Vec::new();
    let mut sspan: Vec<(u64, u64)> = Vec::new();
    for (i, &(d, s, l)) in copies.iter().enumerate() {
        if l == 0 {
            continue;
        }
        if !l.is_multiple_of(cell) {
            return false;
        }
        let (dg, sg) = group(i);
        if dg >= ngroups || sg >= ngroups {
            return false;
        }
        for (spans, g, a) in [(&mut dspan, dg, d), (&mut sspan, sg, s)] {
            let Some(end) = a.checked_add(l) else {
                return false;
            };
            if spans.len() <= g {
                spans.resize(g + 1, (u64::MAX, 0));
            }
            let e = &mut spans[g];
            *e = (e.0.min(a), e.1.max(end));
        }
    }
    // Every span as [start, end): destinations must meet nothing else.
    let mut ends: Vec<(u64, u64, bool)> = Vec::new();
    for (spans, is_dst) in [(&dspan, true), (&sspan, false)] {
        ends.extend(
            spans
                .iter()
                .filter(|e| e.0 < e.1)
                .map(|&(lo, end)| (lo, end, is_dst)),
        );
    }
    ends.sort_unstable();
    // The furthest end so far, and whether a destination reaches it.
    let mut reach: Option<(u64, bool)> = None;
    for &(lo, end, is_dst) in &ends {
        if let Some((e, by_dst)) = reach {
            if lo < e && (is_dst || by_dst) {
                return false;
            }
        }
        reach = match reach {
            Some((e, d)) if e >= end => Some((e, d)),
            _ => Some((end, is_dst)),
        };
    }
    // Each destination group's cells: one bit map, each group at its own offset.
    let most = GRID_MIN_CELLS.max((copies.len() as u64).saturating_mul(GRID_CELLS_PER_COPY));
    let lens = dspan.iter().map(|&(lo, end)| end.saturating_sub(lo));
    let Some(mut grid) = CellGrid::new(cell, lens, most) else {
        return false;
    };
    copies
        .iter()
        .enumerate()
        .filter(|(_, c)| c.2 > 0)
        .all(|(i, &(d, _, l))| {
            let g = group(i).0;
            grid.cover(g, d - dspan[g].0, l)
        })
}

/// [`conflict`] by sorting every range: `O(n log n)`, any shape.
pub(crate) fn conflict_by_sort(copies: &[(u64, u64, u64)]) -> Option<(usize, usize)> {
    // (start, end, is_dst, copy index) for every non-empty range, by start.
    let mut ranges: Vec<(u64, u64, bool, usize)> = Vec::with_capacity(copies.len() * 2);
    for (i, &(dst, src, len)) in copies.iter().enumerate() {
        if len > 0 {
            ranges.push((dst, dst.saturating_add(len), true, i));
            ranges.push((src, src.saturating_add(len), false, i));
        }
    }
    ranges.sort_unstable();
    // The furthest-reaching range seen so far, and the furthest-reaching destination: a range
    // starting before either's end overlaps it.
    let mut any: Option<(u64, usize)> = None;
    let mut dst: Option<(u64, usize)> = None;
    let pair = |a: usize, b: usize| Some((a.min(b), a.max(b)));
    for &(start, end, is_dst, i) in &ranges {
        if is_dst {
            if let Some((e, j)) = any {
                if start < e {
                    return pair(i, j);
                }
            }
        } else if let Some((e, j)) = dst {
            if start < e {
                return pair(i, j);
            }
        }
        if any.is_none_or(|(e, _)| end > e) {
            any = Some((end, i));
        }
        if is_dst && dst.is_none_or(|(e, _)| end > e) {
            dst = Some((end, i));
        }
    }
    None
}

/// Cuts segments into descriptors of at most `chunk` bytes (`chunk` is rounded down to a
/// multiple of 16, at least 16), in order, dropping empty ones.
pub(crate) fn pack(segments: &[Segment], chunk: u64) -> Vec<Segment> {
    let chunk = (chunk & !15).max(16);
    let mut out = Vec::with_capacity(segments.len());
    for s in segments {
        let mut off = 0;
        while off < s.len {
            let len = chunk.min(s.len - off);
            out.push(Segment {
                src: s.src + off,
                dst: s.dst + off,
                len,
            });
            off += len;
        }
    }
    out
}

/// How many descriptors [`pack`] cuts `copies` `(dst, src, len)` into.
pub(crate) fn packed_count(copies: &[(u64, u64, u64)], chunk: u64) -> usize {
    let chunk = (chunk & !15).max(16);
    copies
        .iter()
        .map(|c| usize::try_from(c.2.div_ceil(chunk)).unwrap_or(usize::MAX))
        .fold(0usize, usize::saturating_add)
}

/// [`pack`] then [`write_descriptors`] in one pass, with no list in between: writes the
/// descriptors of `copies` `(dst, src, len)` cut at `chunk` into `out`; returns how many were
/// written (all, where `out` holds [`packed_count`] descriptors).
pub(crate) fn write_packed(copies: &[(u64, u64, u64)], chunk: u64, out: &mut [u8]) -> usize {
    let chunk = (chunk & !15).max(16);
    let mut slots = out.chunks_exact_mut(DESC_BYTES);
    let mut n = 0;
    for &(dst, src, len) in copies {
        let mut off = 0;
        while off < len {
            let Some(slot) = slots.next() else {
                return n;
            };
            let l = chunk.min(len - off);
            slot[..8].copy_from_slice(&(src + off).to_le_bytes());
            slot[8..16].copy_from_slice(&(dst + off).to_le_bytes());
            slot[16..].copy_from_slice(&l.to_le_bytes());
            n += 1;
            off += l;
        }
    }
    n
}

/// The balanced schedule's descriptors for `grid` CTAs: the segments' bytes, taken in order,
/// are cut into `grid` shares of equal size (give or take 16 bytes: cuts fall on multiples of
/// 16 from a segment's start), each share into pieces of at most `chunk` bytes; descriptor
/// `j * grid + i` is share `i`'s piece `j`, or an empty descriptor where share `i` has fewer
/// pieces. `None` where the padding would exceed a quarter of the pieces (a few shares
/// holding most of the segments, as when tiny segments follow a huge one).
pub(super) fn balanced(segments: &[Segment], chunk: u64, grid: u64) -> Option<Vec<Segment>> {
    let chunk = (chunk & !15).max(16);
    let total = segments
        .iter()
        .try_fold(0u64, |a, s| a.checked_add(s.len))?;
    let grid = grid.max(1);
    // Share `c` ends at this offset of the concatenated segments (absolute, so the cuts'
    // rounding to 16 bytes does not accumulate).
    let bound = |c: usize| {
        u64::try_from((c as u128 + 1) * u128::from(total) / u128::from(grid)).unwrap_or(u64::MAX)
    };
    let mut shares: Vec<Vec<Segment>> = vec![Vec::new(); usize::try_from(grid).ok()?];
    let last = shares.len() - 1;
    let (mut cta, mut pos) = (0usize, 0u64);
    let mut pieces = 0usize;
    for s in segments {
        let mut off = 0;
        while off < s.len {
            while cta < last && pos >= bound(cta) {
                cta += 1;
            }
            let room = if cta == last {
                u64::MAX
            } else {
                bound(cta) - pos
            };
            let mut take = (s.len - off).min(chunk).min(room);
            if take < s.len - off {
                // Cut at a multiple of 16 from the segment's start (`off` is one already).
                take = take.next_multiple_of(16).min(s.len - off);
            }
            shares[cta].push(Segment {
                src: s.src + off,
                dst: s.dst + off,
                len: take,
            });
            pieces += 1;
            off += take;
            pos += take;
        }
    }
    let rounds = shares.iter().map(Vec::len).max().unwrap_or(0);
    let slots = rounds.checked_mul(shares.len())?;
    if slots > pieces + pieces / 4 + shares.len() {
        return None;
    }
    let empty = Segment {
        src: 0,
        dst: 0,
        len: 0,
    };
    let mut out = Vec::with_capacity(slots);
    for j in 0..rounds {
        out.extend(shares.iter().map(|s| s.get(j).copied().unwrap_or(empty)));
    }
    Some(out)
}

/// The descriptors and the grid for `segments` under `shape`, on a GPU where `resident` CTAs
/// of the shape run at once. The grid is at least 1; with no bytes to copy there are no
/// descriptors.
pub(crate) fn plan(
    segments: &[Segment],
    shape: &KernelShape,
    resident: u32,
) -> (Vec<Segment>, u32) {
    let plain = pack(segments, shape.chunk);
    let count = plain.len() as u64;
    let resident = u64::from(resident.max(1));
    let grid = |n: u64| u32::try_from(n.clamp(1, MAX_GRID)).unwrap_or(1);
    match shape.schedule {
        KernelSchedule::PerChunk => (plain, grid(count)),
        KernelSchedule::Persistent => (plain, grid(count.min(resident))),
        KernelSchedule::Balanced => {
            let g = count.min(resident);
            if g <= 1 {
                return (plain, 1);
            }
            match balanced(segments, shape.chunk, g) {
                Some(descs) => (descs, grid(g)),
                None => (plain, grid(g)),
            }
        }
    }
}

/// Writes `descs` as the device array's bytes into `out` (`(src, dst, len)` little-endian each); returns
/// how many fit (all, where `out` holds `descs.len() * DESC_BYTES` bytes).
pub(crate) fn write_descriptors(descs: &[Segment], out: &mut [u8]) -> usize {
    let mut n = 0;
    for (d, slot) in descs.iter().zip(out.chunks_exact_mut(DESC_BYTES)) {
        slot[..8].copy_from_slice(&d.src.to_le_bytes());
        slot[8..16].copy_from_slice(&d.dst.to_le_bytes());
        slot[16..].copy_from_slice(&d.len.to_le_bytes());
        n += 1;
    }
    n
}

/// The grid for `count` descriptors cut one by one (the persistent and per-chunk schedules)
/// on a GPU where `resident` CTAs of the shape run at once; at least 1.
pub(crate) fn grid(shape: &KernelShape, count: u64, resident: u32) -> u32 {
    let resident = u64::from(resident.max(1));
    let n = match shape.schedule {
        KernelSchedule::PerChunk => count,
        KernelSchedule::Persistent | KernelSchedule::Balanced => count.min(resident),
    };
    u32::try_from(n.clamp(1, MAX_GRID)).unwrap_or(1)
}

/// The device array's bytes: `(src, dst, len)` little-endian per descriptor (every CUDA GPU is
/// little-endian, as is every host this crate builds for).
#[cfg(test)]
pub(crate) fn descriptor_bytes(descs: &[Segment]) -> Vec<u8> {
    let mut v = Vec::with_capacity(descs.len() * DESC_BYTES);
    for d in descs {
        v.extend_from_slice(&d.src.to_le_bytes());
        v.extend_from_slice(&d.dst.to_le_bytes());
        v.extend_from_slice(&d.len.to_le_bytes());
    }
    v
}
