//! A block-table request as the copy kernel sees it: each layer's source and destination
//! (base and stride, oriented by the operation) and the id runs. The kernel's descriptors are
//! written from it in one pass straight into the upload's staging bytes (no segment list, no
//! intermediate vectors); the segment list itself is built only where a request falls back to
//! the copy engines.

use nixl_core::backend::{BlockRun, BlockXferSpec};
use nixl_core::{StridedDesc, XferOp};

use crate::cuda::kernel::{BlockLayout, BLOCK_ENTRY_BYTES, DESC_BYTES};
use crate::sys::memory::EntryWriter;

/// One layer's copies: block `i` goes from `src + i * src_stride` to `dst + i * dst_stride`,
/// `len` bytes; `dense` where consecutive blocks are contiguous on both sides (a run is then
/// one copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LayerCopy {
    pub src: u64,
    pub src_stride: u64,
    pub dst: u64,
    pub dst_stride: u64,
    pub len: u64,
    pub dense: bool,
}

/// The layers and the id runs of a block-table request, in this process's addresses.
#[derive(Debug, Clone)]
pub(crate) struct BlockTable {
    pub layers: Vec<LayerCopy>,
    /// `(src id, dst id, count)` per run.
    pub runs: Vec<(u64, u64, u64)>,
    /// Blocks per layer (the runs' counts summed).
    per: u64,
}

impl BlockTable {
    /// The table of `spec` with each remote layer at `remote_here` (its address in this
    /// process), oriented by the operation (WRITE: local to remote; READ: remote to local).
    pub(super) fn new(spec: &BlockXferSpec, remote_here: &[StridedDesc]) -> Self {
        let write = spec.op == XferOp::Write;
        let layers = spec
            .layers
            .iter()
            .zip(remote_here)
            .map(|(l, r)| {
                let (s, d) = if write { (&l.local, r) } else { (r, &l.local) };
                LayerCopy {
                    src: s.addr,
                    src_stride: s.stride,
                    dst: d.addr,
                    dst_stride: d.stride,
                    len: l.local.len,
                    dense: l.is_dense(),
                }
            })
            .collect();
        let mut per = 0u64;
        let runs = spec
            .runs
            .iter()
            .map(|r: &BlockRun| {
                per = per.saturating_add(r.count);
                if write {
                    (r.local, r.remote, r.count)
                } else {
                    (r.remote, r.local, r.count)
                }
            })
            .collect();
        BlockTable { layers, runs, per }
    }

    fn blocks_per_layer(&self) -> u64 {
        self.per
    }

    /// The number of contiguous copies (a run of a dense layer is one).
    pub(super) fn copy_count(&self) -> usize {
        let per = self.blocks_per_layer() as usize;
        self.layers
            .iter()
            .map(|l| if l.dense { self.runs.len() } else { per })
            .sum()
    }

    /// Every contiguous copy as `(dst, src, len)`, layer after layer (the order of
    /// [`BlockXferSpec::segments`]).
    pub(super) fn copies(&self) -> Vec<(u64, u64, u64)> {
        let mut v = Vec::with_capacity(self.copy_count());
        for l in &self.layers {
            for &(s, d, n) in &self.runs {
                if l.dense {
                    v.push((
                        l.dst + d * l.dst_stride,
                        l.src + s * l.src_stride,
                        n * l.len,
                    ));
                } else {
                    v.extend((0..n).map(|k| {
                        (
                            l.dst + (d + k) * l.dst_stride,
                            l.src + (s + k) * l.src_stride,
                            l.len,
                        )
                    }));
                }
            }
        }
        v
    }

    /// The number of kernel descriptors at `chunk` bytes each at most (as
    /// [`kernel::pack`](crate::cuda::kernel::pack) cuts the copies).
    pub(super) fn descriptor_count(&self, chunk: u64) -> usize {
        let chunk = (chunk & !15).max(16);
        let per = self.blocks_per_layer();
        let mut n = 0u64;
        for l in &self.layers {
            if l.dense {
                n += self
                    .runs
                    .iter()
                    .map(|r| chunks(r.2 * l.len, chunk))
                    .sum::<u64>();
            } else {
                n += per * l.len.div_ceil(chunk);
            }
        }
        n as usize
    }

    /// The block kernel's pieces per layer at `chunk` bytes each at most, or `None` where the
    /// layers' blocks differ in length (the pieces would differ between layers). Where every
    /// layer is dense a run's bytes are cut into pieces; otherwise each block is.
    fn pieces(&self, chunk: u64) -> Option<u64> {
        let len = self.layers.first()?.len;
        if self.layers.iter().any(|l| l.len != len) {
            return None;
        }
        Some(if self.layers.iter().all(|l| l.dense) {
            self.runs.iter().map(|r| chunks(r.2 * len, chunk)).sum()
        } else {
            self.blocks_per_layer() * len.div_ceil(chunk)
        })
    }

    /// The block kernel's table for `chunk` (the kernel's shape, cut as for descriptors), or
    /// `None` where the layers' blocks differ in length or the items reach 2^32 (the kernel
    /// divides in 32 bits). O(runs): nothing per layer and block.
    pub(super) fn block_layout(&self, chunk: u64) -> Option<BlockLayout> {
        let chunk = (chunk & !15).max(16);
        let npieces = self.pieces(chunk)?;
        let layers = self.layers.len() as u64;
        if layers.checked_mul(npieces)? > u64::from(u32::MAX) {
            return None;
        }
        let bytes = layers
            .checked_add(npieces)?
            .checked_mul(BLOCK_ENTRY_BYTES as u64)?;
        Some(BlockLayout {
            bytes: usize::try_from(bytes).ok()?,
            items: layers.checked_mul(npieces)?,
            npieces,
            pieces_at: self.layers.len() * BLOCK_ENTRY_BYTES,
        })
    }

    /// Writes the block kernel's table for `chunk` into `out` (at least
    /// [`BlockLayout::bytes`]): one `(src base, src stride, dst base, dst stride)` per layer,
    /// then one `(src id, dst id, offset, len)` per piece, all `u64` little-endian. Item `i` of
    /// the kernel is piece `i % npieces` of layer `i / npieces`, the copy of descriptor `i` of
    /// [`BlockTable::write_descriptors`]. `None` (nothing written) where there is no such
    /// table or `out` is too short.
    pub(super) fn write_block_table(&self, chunk: u64, out: &mut [u8]) -> Option<BlockLayout> {
        let layout = self.block_layout(chunk)?;
        let mut w = EntryWriter::new(out.get_mut(..layout.bytes)?);
        self.write_entries(chunk, &mut w);
        (w.written() == layout.bytes).then_some(layout)
    }

    /// The entries of [`BlockTable::write_block_table`], in order, into `w`.
    fn write_entries(&self, chunk: u64, w: &mut EntryWriter<'_>) {
        let chunk = (chunk & !15).max(16);
        let Some(len) = self.layers.first().map(|l| l.len) else {
            return;
        };
        let mut put = |v: [u64; 4]| {
            w.put(v);
        };
        for l in &self.layers {
            put([l.src, l.src_stride, l.dst, l.dst_stride]);
        }
        let dense = self.layers.iter().all(|l| l.dense);
        for &(s, d, count) in &self.runs {
            if dense {
                let total = count * len;
                let mut off = 0;
                while off < total {
                    put([s, d, off, chunk.min(total - off)]);
                    off += chunk;
                }
                continue;
            }
            for k in 0..count {
                let mut off = 0;
                while off < len {
                    put([s + k, d + k, off, chunk.min(len - off)]);
                    off += chunk;
                }
            }
        }
    }

    /// Writes the kernel's descriptors (`(src, dst, len)` little-endian, cut at `chunk` bytes
    /// as [`kernel::pack`](crate::cuda::kernel::pack) cuts) into `out`, which holds at least
    /// [`BlockTable::descriptor_count`] of them; returns how many were written.
    pub(super) fn write_descriptors(&self, chunk: u64, out: &mut [u8]) -> usize {
        let chunk = (chunk & !15).max(16);
        let mut slots = out.chunks_exact_mut(DESC_BYTES);
        let mut n = 0usize;
        let mut put = |src: u64, dst: u64, len: u64| {
            let mut off = 0;
            while off < len {
                let take = chunk.min(len - off);
                let Some(d) = slots.next() else { return false };
                d[..8].copy_from_slice(&(src + off).to_le_bytes());
                d[8..16].copy_from_slice(&(dst + off).to_le_bytes());
                d[16..].copy_from_slice(&take.to_le_bytes());
                n += 1;
                off += take;
            }
            true
        };
        for l in &self.layers {
            for &(s, d, count) in &self.runs {
                let (mut src, mut dst) = (l.src + s * l.src_stride, l.dst + d * l.dst_stride);
                if l.dense {
                    if !put(src, dst, count * l.len) {
                        return n;
                    }
                    continue;
                }
                for _ in 0..count {
                    if !put(src, dst, l.len) {
                        return n;
                    }
                    src += l.src_stride;
                    dst += l.dst_stride;
                }
            }
        }
        n
    }
}

/// `bytes` cut in pieces of `chunk` (positive): how many. A run within one chunk (the usual
/// case: a block of a shuffled free list) costs no division, which would cost more than the
/// rest of a pass over the runs.
#[inline]
fn chunks(bytes: u64, chunk: u64) -> u64 {
    if bytes <= chunk {
        u64::from(bytes > 0)
    } else {
        bytes.div_ceil(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::kernel::{descriptor_bytes, pack, Segment};
    use nixl_core::backend::LayerPair;
    use nixl_core::MemKind;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Where [`kv_spec_at`]'s local and remote regions lie unless a test says otherwise.
    const BASES: (u64, u64) = (0x7000_0000_0000, 0x7800_0000_0000);

    /// A model-shaped spec: `layers` x K,V over regions of `pool` blocks of `bb` bytes, split
    /// (K blocks then V blocks) or interleaved, and `ids` pairs from shuffled free lists, with
    /// the local and remote regions at `bases`.
    fn kv_spec_at(
        op: XferOp,
        layers: u64,
        pool: u64,
        bb: u64,
        ids: usize,
        interleaved: bool,
        bases: (u64, u64),
    ) -> BlockXferSpec {
        let table = |base: u64| -> Vec<StridedDesc> {
            let mut t = Vec::new();
            for l in 0..layers {
                let at = base + l * 2 * pool * bb;
                for kv in 0..2 {
                    t.push(if interleaved {
                        StridedDesc::on_device(at + kv * bb, 2 * bb, bb, pool, 0)
                    } else {
                        StridedDesc::on_device(at + kv * pool * bb, bb, bb, pool, 0)
                    });
                }
            }
            t
        };
        // A fixed permutation (multiplicative, odd step), so runs are mostly single blocks
        // with a few consecutive ones.
        let perm = |seed: u64| -> Vec<u64> {
            let mut v: Vec<u64> = (0..pool).collect();
            let mut x = seed;
            for i in (1..v.len()).rev() {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                v.swap(i, (x >> 33) as usize % (i + 1));
            }
            v
        };
        let (a, b) = (perm(1), perm(2));
        let local: Vec<usize> = a[..ids].iter().map(|&i| i as usize).collect();
        let mut remote: Vec<usize> = b[..ids].iter().map(|&i| i as usize).collect();
        remote.reverse();
        // Merge consecutive pairs into runs as nixl-core does.
        let mut runs: Vec<BlockRun> = Vec::new();
        for (&l, &r) in local.iter().zip(&remote) {
            let (l, r) = (l as u64, r as u64);
            if let Some(last) = runs.last_mut() {
                if last.local + last.count == l && last.remote + last.count == r {
                    last.count += 1;
                    continue;
                }
            }
            runs.push(BlockRun::blocks(l, r, 1));
        }
        let (lt, rt) = (table(bases.0), table(bases.1));
        BlockXferSpec {
            op,
            local_kind: MemKind::Vram,
            remote_kind: MemKind::Vram,
            remote: "b".into(),
            is_local: true,
            layers: lt
                .iter()
                .zip(&rt)
                .map(|(&local, &remote)| LayerPair {
                    local,
                    local_md: Arc::new(()),
                    remote,
                    remote_md: Arc::new(()),
                })
                .collect(),
            runs,
            rows: None,
            notif: None,
            arrival: None,
        }
    }

    /// The table's copies, count and descriptors equal those of the segment path (the spec's
    /// segments, oriented, then `pack` and `descriptor_bytes`), for split and interleaved
    /// layouts, dense runs (consecutive ids) and sparse ones, WRITE and READ, blocks below,
    /// at and above the chunk.
    #[test]
    fn pieces_are_counted_as_by_division() {
        for chunk in [16u64, 4096, 65536, 65552] {
            for bytes in [
                0u64,
                1,
                15,
                16,
                17,
                4095,
                4096,
                65535,
                65536,
                65537,
                1 << 20,
                (1 << 20) + 3,
            ] {
                assert_eq!(
                    chunks(bytes, chunk),
                    bytes.div_ceil(chunk),
                    "{bytes} in {chunk}"
                );
            }
        }
    }

    #[test]
    fn descriptors_equal_the_segment_paths() {
        for spec in cases() {
            let here: Vec<StridedDesc> = spec.layers.iter().map(|l| l.remote).collect();
            let t = BlockTable::new(&spec, &here);
            let want: Vec<(u64, u64, u64)> = spec
                .segments()
                .map(|(_, la, ra, n)| match spec.op {
                    XferOp::Write => (ra, la, n),
                    XferOp::Read => (la, ra, n),
                })
                .collect();
            assert_eq!(t.copies(), want);
            assert_eq!(t.copy_count(), spec.segment_count());
            for chunk in [16, 4096, 64 << 10, 1 << 20] {
                let segs: Vec<Segment> = want
                    .iter()
                    .map(|&(dst, src, len)| Segment { src, dst, len })
                    .collect();
                let bytes = descriptor_bytes(&pack(&segs, chunk));
                let n = t.descriptor_count(chunk);
                assert_eq!(n * DESC_BYTES, bytes.len());
                let mut out = vec![0u8; bytes.len() + DESC_BYTES];
                assert_eq!(t.write_descriptors(chunk, &mut out), n);
                assert!(out[..bytes.len()] == bytes[..], "chunk {chunk}");
                assert_eq!(out[bytes.len()..], [0u8; DESC_BYTES]);
                // A short buffer is filled and no further.
                let mut short = vec![0u8; bytes.len() / 2];
                assert_eq!(
                    t.write_descriptors(chunk, &mut short),
                    short.len() / DESC_BYTES
                );
            }
        }
    }

    /// A block table decoded as the block kernel decodes it: item `i`'s copy.
    fn expand(table: &[u8], b: &BlockLayout) -> Vec<Segment> {
        let u = |at: usize| u64::from_le_bytes(table[at..at + 8].try_into().unwrap());
        (0..b.items)
            .map(|i| {
                let (l, p) = ((i / b.npieces) as usize, (i % b.npieces) as usize);
                let lay = l * BLOCK_ENTRY_BYTES;
                let pc = b.pieces_at + p * BLOCK_ENTRY_BYTES;
                let off = u(pc + 16);
                Segment {
                    src: u(lay) + u(pc) * u(lay + 8) + off,
                    dst: u(lay + 16) + u(pc + 8) * u(lay + 24) + off,
                    len: u(pc + 24),
                }
            })
            .collect()
    }

    /// The cases of the equivalence tests: split (dense) and interleaved layouts, sparse ids
    /// and runs of consecutive ones, WRITE and READ, blocks below, at and above the chunk.
    fn cases() -> Vec<BlockXferSpec> {
        let mut dense = kv_spec_at(XferOp::Write, 3, 40, 4096, 16, false, BASES);
        dense.runs = vec![
            BlockRun::blocks(0, 5, 7),
            BlockRun::blocks(20, 30, 3),
            BlockRun::blocks(9, 0, 1),
        ];
        let mut read_dense = dense.clone();
        read_dense.op = XferOp::Read;
        let mut v = vec![dense, read_dense];
        for op in [XferOp::Write, XferOp::Read] {
            for interleaved in [false, true] {
                for bb in [48, 4096, 64 << 10, 200_000] {
                    v.push(kv_spec_at(op, 3, 40, bb, 25, interleaved, BASES));
                }
            }
        }
        v
    }

    /// The block kernel's table generates, item by item, exactly the descriptors of the
    /// segment path; layers of different block lengths have no table; a short buffer gets
    /// nothing.
    #[test]
    fn block_tables_generate_the_descriptors() {
        for spec in cases() {
            let here: Vec<StridedDesc> = spec.layers.iter().map(|l| l.remote).collect();
            let t = BlockTable::new(&spec, &here);
            for chunk in [16, 4096, 64 << 10, 1 << 20] {
                let segs: Vec<Segment> = t
                    .copies()
                    .iter()
                    .map(|&(dst, src, len)| Segment { src, dst, len })
                    .collect();
                let want = pack(&segs, chunk);
                let b = t.block_layout(chunk).unwrap();
                let (bytes, items) = (b.bytes, b.items);
                assert_eq!(items as usize, want.len());
                assert_eq!(b.npieces * t.layers.len() as u64, items);
                assert_eq!(b.pieces_at, t.layers.len() * BLOCK_ENTRY_BYTES);
                // Nothing per layer and block: the table is O(layers + pieces of one layer).
                assert_eq!(
                    bytes,
                    BLOCK_ENTRY_BYTES * (t.layers.len() + want.len() / t.layers.len())
                );
                let mut out = vec![0u8; bytes];
                assert_eq!(t.write_block_table(chunk, &mut out), Some(b));
                assert_eq!(expand(&out, &b), want, "chunk {chunk}");
                assert_eq!(t.write_block_table(chunk, &mut out[..bytes - 1]), None);
            }
            // 2^32 items or more: no table (the kernel divides in 32 bits).
            let mut huge = t.clone();
            huge.runs = vec![(0, 0, 1 << 31)];
            huge.per = 1 << 31;
            huge.layers.iter_mut().for_each(|l| l.dense = false);
            assert_eq!(huge.block_layout(1 << 30), None);
            let mut mixed = t.clone();
            mixed.layers[1].len += 16;
            assert_eq!(mixed.block_layout(4096), None);
            assert_eq!(mixed.write_block_table(4096, &mut [0u8; 1 << 16]), None);
        }
    }

    /// The block kernel's PTX, executed on the CPU: every destination byte is its source's,
    /// nothing else changes, no two threads touch one byte, every access is inside the
    /// simulated memory; split (dense runs) and interleaved layouts, the same or different on
    /// each side, sparse and consecutive ids, WRITE and READ, chunks that cut blocks and runs, one CTA per item and fewer CTAs
    /// than items.
    #[test]
    fn the_block_kernel_copies_every_byte_when_simulated() {
        use crate::cuda::kernel::{ptx_blocks, KernelShape};
        use crate::cuda::ptx_sim::{run, Memory, Program};
        let shape = KernelShape::default();
        let prog = Program::parse(&ptx_blocks(&shape));
        let base = 0x7f00_0000_0000u64;
        let table_area = 16u64 << 10;
        for bb in [48u64, 256, 1040] {
            let (layers, pool) = (2u64, 7u64);
            let region = layers * 2 * pool * bb;
            let (lbase, rbase) = (base + table_area, base + table_area + region);
            for op in [XferOp::Write, XferOp::Read] {
                // (local, remote) layouts: the same, or different on each side (strides
                // differ between source and destination).
                for (interleaved, remote_interleaved) in
                    [(false, false), (true, true), (true, false), (false, true)]
                {
                    let mut spec = kv_spec_at(op, layers, pool, bb, 5, interleaved, (lbase, rbase));
                    for (i, l) in spec.layers.iter_mut().enumerate() {
                        let (layer, kv) = (i as u64 / 2, i as u64 % 2);
                        let at = rbase + layer * 2 * pool * bb;
                        l.remote = if remote_interleaved {
                            StridedDesc::on_device(at + kv * bb, 2 * bb, bb, pool, 0)
                        } else {
                            StridedDesc::on_device(at + kv * pool * bb, bb, bb, pool, 0)
                        };
                    }
                    if bb == 256 {
                        // Runs of consecutive ids (one copy per run in dense layers).
                        spec.runs = vec![BlockRun::blocks(0, 3, 3), BlockRun::blocks(5, 0, 2)];
                    }
                    let here: Vec<StridedDesc> = spec.layers.iter().map(|l| l.remote).collect();
                    let t = BlockTable::new(&spec, &here);
                    let mut image = vec![0u8; (table_area + 2 * region) as usize];
                    for (i, b) in image.iter_mut().enumerate().skip(table_area as usize) {
                        *b = (i as u64).wrapping_mul(0x9E37_79B9).wrapping_shr(7) as u8 | 1;
                    }
                    let mut want = image.clone();
                    for (dst, src, len) in t.copies() {
                        let (s, d) = ((src - base) as usize, (dst - base) as usize);
                        let bytes = want[s..s + len as usize].to_vec();
                        want[d..d + len as usize].copy_from_slice(&bytes);
                    }
                    for chunk in [16u64, 128, 4096] {
                        let b = t.block_layout(chunk).unwrap();
                        assert!(b.bytes as u64 <= table_area);
                        let mut m = Memory::new(base, image.clone());
                        assert_eq!(t.write_block_table(chunk, &mut m.bytes), Some(b));
                        for (grid, ntid) in [(b.items as u32, 32), (3, 64)] {
                            let mut m = Memory::new(base, m.bytes.clone());
                            let params = [
                                ("nixl_descs", base),
                                ("nixl_count", b.items),
                                ("nixl_pieces", base + b.pieces_at as u64),
                                ("nixl_npieces", b.npieces),
                            ];
                            run(&prog, &mut m, &params, grid, ntid).unwrap_or_else(|e| {
                                panic!("{op} {bb} B interleaved={interleaved} chunk {chunk}: {e}")
                            });
                            let at = table_area as usize;
                            assert!(
                                m.bytes[at..] == want[at..],
                                "{op} {bb} B interleaved={interleaved} chunk {chunk} grid {grid}"
                            );
                        }
                    }
                }
            }
        }
    }

    fn best(n: usize, mut f: impl FnMut()) -> Duration {
        (0..n)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .min()
            .unwrap_or_default()
    }

    /// The host-side build of a Llama-3-8B-shaped request (64 layers x 2,048 ids = 131,072
    /// blocks of 32 KiB), step by step, for the old segment path and the table: prints the
    /// timings (`cargo test --release -p nixl-mem --all-features table -- --nocapture`) and
    /// checks both produce the same bytes.
    #[test]
    fn host_build_of_131072_blocks() {
        let spec = kv_spec_at(XferOp::Write, 32, 2560, 32 << 10, 2048, false, BASES);
        let here: Vec<StridedDesc> = spec.layers.iter().map(|l| l.remote).collect();
        let chunk = 64 << 10;
        let mut old = Vec::new();
        let reps = if cfg!(debug_assertions) { 1 } else { 9 };
        let t_copies = best(reps, || {
            let mut copies = Vec::with_capacity(spec.segment_count());
            for (_, la, ra, len) in spec.segments() {
                copies.push((ra, la, len));
            }
            old = copies;
        });
        let mut segs = Vec::new();
        let t_segs = best(reps, || {
            segs = old
                .iter()
                .map(|&(dst, src, len)| Segment { src, dst, len })
                .collect();
        });
        let mut packed = Vec::new();
        let t_pack = best(reps, || packed = pack(&segs, chunk));
        let mut bytes = Vec::new();
        let t_bytes = best(reps, || bytes = descriptor_bytes(&packed));
        let t_conflict = best(reps, || {
            assert_eq!(crate::cuda::kernel::conflict(&old), None);
        });
        let t_sort = best(reps, || {
            assert_eq!(crate::cuda::kernel::conflict_by_sort(&old), None);
        });
        let mut out = vec![0u8; bytes.len()];
        let mut n = 0;
        let t_table = best(reps, || {
            let t = BlockTable::new(&spec, &here);
            n = t.write_descriptors(chunk, &mut out);
        });
        assert_eq!(n, 131_072);
        assert!(out == bytes);
        let mut dev = vec![0u8; 1 << 20];
        let mut items = None;
        let t_blocks = best(reps, || {
            let t = BlockTable::new(&spec, &here);
            items = t.write_block_table(chunk, &mut dev);
        });
        assert_eq!(items.map(|b| b.items), Some(131_072));
        let mut proven = false;
        let t_indep = best(reps, || {
            proven = super::super::blocks::independent(&spec, &here)
        });
        assert!(proven);
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "host build, 131,072 blocks of 32 KiB (best of {reps}): old path: copies {:.0} us, \
             segments {:.0} us, pack {:.0} us, descriptor bytes {:.0} us (total {:.0} us; \
             conflict check {:.0} us: the grid proof; the sort it spares {:.0} us); table into a reused \
             buffer {:.0} us; block kernel's table into a reused buffer {:.1} us; independence proof {:.1} us",
            us(t_copies),
            us(t_segs),
            us(t_pack),
            us(t_bytes),
            us(t_copies + t_segs + t_pack + t_bytes),
            us(t_conflict),
            us(t_sort),
            us(t_table),
            us(t_blocks),
            us(t_indep)
        );
    }
}
