//! The kernels' tests: descriptors, plans, conflicts, and the PTX run on the simulator.

use super::*;
use crate::cuda::ptx_sim::{run, Memory, Program};

const CHUNK: u64 = 128 << 10;
const MIB: u64 = 1 << 20;

fn seg(src: u64, dst: u64, len: u64) -> Segment {
    Segment { src, dst, len }
}

/// Every byte of every segment is covered exactly once, in order, by pieces of at most
/// `chunk` bytes that keep the segment's relative alignment.
fn check_cover(segs: &[Segment], chunk: u64) {
    let out = pack(segs, chunk);
    let c = (chunk & !15).max(16);
    let mut it = out.iter().peekable();
    for s in segs {
        let mut off = 0;
        while off < s.len {
            let d = it.next().expect("a descriptor for every byte");
            assert_eq!((d.src, d.dst), (s.src + off, s.dst + off), "{s:?} at {off}");
            assert!(d.len > 0 && d.len <= c);
            assert_eq!(co_aligned(d.src, d.dst), co_aligned(s.src, s.dst));
            assert_eq!(off % 16, 0, "cuts fall on multiples of 16");
            off += d.len;
        }
        assert_eq!(off, s.len);
    }
    assert!(it.peek().is_none());
}

#[test]
fn packing_covers_every_byte_once_in_order() {
    let segs = [
        seg(0x1000, 0x9000_0000, 1 << 20),
        seg(0x20_0003, 0x30_0013, 300_001),
        seg(0x5, 0x6, 17),
        seg(0x7000, 0x8000, 0),
        seg(0x1_0000_0000, 0x2_0000_0000, CHUNK),
        seg(0x1_0000_0000, 0x2_0000_0000, CHUNK + 1),
    ];
    for chunk in [1, 16, 100, 4096, CHUNK, u64::MAX] {
        check_cover(&segs, chunk);
    }
    let out = pack(&segs, CHUNK);
    assert_eq!(out.len(), 8 + 3 + 1 + 1 + 2);
    assert!(pack(&[seg(1, 2, 0)], CHUNK).is_empty());
    // 1024 blocks of 1 MiB: 8 descriptors per block.
    let blocks: Vec<Segment> = (0..1024u64)
        .map(|i| seg(i << 21, (i << 21) + (1 << 20), 1 << 20))
        .collect();
    assert_eq!(pack(&blocks, CHUNK).len(), 8192);
}

/// Disjoint segments: the non-empty descriptors tile each segment exactly once, keep its
/// relative alignment, cut at multiples of 16 from its start, and are at most `chunk`.
fn check_tiles(segs: &[Segment], descs: &[Segment], chunk: u64) {
    let mut real: Vec<Segment> = descs.iter().copied().filter(|d| d.len > 0).collect();
    real.sort_by_key(|d| d.dst);
    let mut it = real.iter();
    let mut sorted: Vec<Segment> = segs.iter().copied().filter(|s| s.len > 0).collect();
    sorted.sort_by_key(|s| s.dst);
    for s in &sorted {
        let mut off = 0;
        while off < s.len {
            let d = it.next().expect("a descriptor for every byte");
            assert_eq!((d.src, d.dst), (s.src + off, s.dst + off), "{s:?} at {off}");
            assert!(d.len <= chunk);
            assert_eq!(off % 16, 0, "cuts fall on multiples of 16");
            off += d.len;
        }
        assert_eq!(off, s.len);
    }
    assert!(it.next().is_none());
    assert!(descs
        .iter()
        .filter(|d| d.len == 0)
        .all(|d| (d.src, d.dst) == (0, 0)));
}

/// Bytes each CTA copies under the grid-stride mapping.
fn per_cta(descs: &[Segment], grid: u32) -> Vec<u64> {
    let mut v = vec![0u64; grid as usize];
    for (i, d) in descs.iter().enumerate() {
        v[i % grid as usize] += d.len;
    }
    v
}

#[test]
fn schedules_plan_grids_and_balanced_shares_are_even() {
    let blocks: Vec<Segment> = (0..1024u64)
        .map(|i| seg(i << 21, (i << 21) + MIB, MIB))
        .collect();
    let shape = BASE;
    // Persistent: the resident CTAs over 8192 chunks (7.76 rounds: a last partial one).
    let (d, g) = plan(&blocks, &shape, 1056);
    assert_eq!((d.len(), g), (8192, 1056));
    let bytes = per_cta(&d, g);
    assert_eq!(bytes.iter().max(), Some(&(8 * CHUNK)));
    assert_eq!(bytes.iter().min(), Some(&(7 * CHUNK)));
    // Per chunk: one CTA each.
    let per = KernelShape {
        schedule: KernelSchedule::PerChunk,
        ..shape
    };
    assert_eq!(plan(&blocks, &per, 1056).1, 8192);
    // Balanced: every CTA within 16 bytes of the same share, all bytes once.
    let bal = KernelShape {
        schedule: KernelSchedule::Balanced,
        ..shape
    };
    for (chunk, resident) in [(CHUNK, 1056), (512 << 10, 264), (4096, 1000), (CHUNK, 7)] {
        let s = KernelShape { chunk, ..bal };
        let (d, g) = plan(&blocks, &s, resident);
        assert_eq!(g, resident);
        assert_eq!(d.len() % g as usize, 0);
        check_tiles(&blocks, &d, chunk);
        let bytes = per_cta(&d, g);
        let (lo, hi) = (bytes.iter().min().unwrap(), bytes.iter().max().unwrap());
        assert!(hi - lo <= 16 * 2, "chunk {chunk} grid {g}: {lo}..{hi}");
        assert_eq!(bytes.iter().sum::<u64>(), 1 << 30);
    }
    // Odd segments, more CTAs than bytes allow, and a tiny request.
    let odd = [
        seg(0x10_0003, 0x90_0003, 300_001),
        seg(0x50_0000, 0xd0_0000, 17),
        seg(0x60_0005, 0xe0_0005, 0),
        seg(0x70_0009, 0xf0_0019, 70_000),
    ];
    for resident in [1, 2, 3, 5, 64, 10_000] {
        let (d, g) = plan(&odd, &KernelShape { chunk: 4096, ..bal }, resident);
        assert!(g >= 1 && g <= resident.max(1));
        check_tiles(&odd, &d, 4096);
    }
    assert_eq!(plan(&[seg(1, 2, 0)], &bal, 100), (vec![], 1));
    assert_eq!(plan(&[], &shape, 100), (vec![], 1));
    // A huge segment then many tiny ones would pad to grid x (tiny count): plain chunks.
    let mut skew = vec![seg(1 << 40, 2 << 40, 1 << 30)];
    skew.extend((0..10_000u64).map(|i| seg(i * 64, (1 << 39) + i * 64, 16)));
    let (d, g) = plan(&skew, &bal, 1056);
    assert_eq!((d.len(), g), (8192 + 10_000, 1056));
    check_tiles(&skew, &d, CHUNK);
}

#[test]
fn conflicts_are_found_between_and_within_copies() {
    // (dst, src, len)
    assert_eq!(conflict(&[]), None);
    assert_eq!(conflict(&[(0, 100, 10), (10, 110, 10), (20, 90, 10)]), None);
    // Sources may overlap each other; empty copies conflict with nothing.
    assert_eq!(conflict(&[(0, 100, 10), (10, 100, 10), (5, 5, 0)]), None);
    // Destination on destination, on another's source (either order), on its own source.
    assert_eq!(conflict(&[(0, 100, 10), (9, 200, 10)]), Some((0, 1)));
    assert_eq!(conflict(&[(0, 100, 10), (50, 5, 10)]), Some((0, 1)));
    assert_eq!(conflict(&[(50, 5, 10), (0, 100, 10)]), Some((0, 1)));
    assert_eq!(
        conflict(&[(0, 100, 10), (300, 200, 10), (250, 8, 4)]),
        Some((0, 2))
    );
    assert_eq!(conflict(&[(0, 100, 10), (300, 296, 8)]), Some((1, 1)));
    // A long range hides behind short ones.
    assert_eq!(
        conflict(&[(0, 1000, 100), (10, 2000, 5), (20, 3000, 5), (90, 4000, 5)]),
        Some((0, 1))
    );
    assert_eq!(conflict(&[(u64::MAX - 4, 0, 10), (16, 100, 8)]), None);
}

#[test]
fn the_grid_proof_takes_block_tables_and_leaves_the_rest_to_the_sort() {
    // A shuffled block table: one length, destinations on one grid, apart from sources.
    let blocks: Vec<(u64, u64, u64)> = (0..1024u64)
        .map(|i| ((1 << 30) + ((i * 389) % 1024) * 4096, i * 4096, 4096))
        .collect();
    assert!(on_grids(&blocks, None));
    assert_eq!(conflict(&blocks), None);
    // Lengths that are multiples of the shortest cover whole cells.
    let merged = [(0, 100, 10), (10, 110, 20), (40, 200, 10), (30, 300, 10)];
    assert!(on_grids(&merged, None));
    assert!(!on_grids(
        &[(0, 100, 10), (10, 110, 20), (20, 200, 10)],
        None
    ));
    assert_eq!(
        conflict(&[(0, 100, 10), (10, 110, 20), (20, 200, 10)]),
        Some((1, 2))
    );
    // Not proven (the sort decides): lengths not multiples of the shortest, off-grid, spans that meet, a repeated
    // cell, a span far larger than the copies; each case's answer is the sort's.
    let cases: [&[(u64, u64, u64)]; 6] = [
        &[(0, 100, 10), (10, 110, 15)],
        &[(0, 100, 10), (15, 110, 10)],
        &[(0, 100, 10), (10, 5, 10)],
        &[(0, 100, 10), (20, 110, 10), (0, 120, 10)],
        &[(0, 1 << 44, 16), (1 << 40, (1 << 44) + 16, 16)],
        &[(u64::MAX - 9, 0, 10), (u64::MAX - 19, 10, 10)],
    ];
    for c in cases {
        assert!(!on_grids(c, None), "{c:?}");
        assert_eq!(conflict(c), conflict_by_sort(c), "{c:?}");
    }
    assert_eq!(conflict(cases[2]), Some((0, 1)));
    assert_eq!(conflict(cases[3]), Some((0, 2)));
    assert_eq!(conflict(cases[4]), None);
}

proptest::proptest! {
    /// Writing packed descriptors in one pass gives the bytes of `pack` then
    /// `write_descriptors`, and stops cleanly where the buffer ends.
    #[test]
    fn packed_writes_are_pack_then_write(
        copies in proptest::collection::vec((0u64..1 << 40, 0u64..1 << 40, 0u64..5000), 0..30),
        chunk in 0u64..3000,
        short in 0usize..4,
    ) {
        let segs: Vec<Segment> = copies
            .iter()
            .map(|&(dst, src, len)| Segment { src, dst, len })
            .collect();
        let want = descriptor_bytes(&pack(&segs, chunk));
        let n = packed_count(&copies, chunk);
        proptest::prop_assert_eq!(n * DESC_BYTES, want.len());
        let mut out = vec![0u8; want.len()];
        proptest::prop_assert_eq!(write_packed(&copies, chunk, &mut out), n);
        proptest::prop_assert!(out == want);
        let k = n.saturating_sub(short);
        let mut part = vec![0u8; k * DESC_BYTES];
        proptest::prop_assert_eq!(write_packed(&copies, chunk, &mut part), k);
        proptest::prop_assert!(part[..] == want[..k * DESC_BYTES]);
    }
}

#[test]
fn the_grid_proof_works_per_region_where_regions_interleave() {
    // 8 destination and 8 source regions of 16 blocks, allocated alternately (so the
    // destinations' overall span covers every source region), blocks shuffled.
    let region = |r: u64| r * (1 << 20);
    let mut copies = Vec::new();
    let mut groups = Vec::new();
    for i in 0..128u64 {
        let (dr, sr) = (i % 8, (i * 5) % 8);
        let (db, sb) = (((i / 8) * 7) % 16, i / 8);
        copies.push((
            region(2 * dr) + db * 4096,
            region(2 * sr + 1) + sb * 4096,
            4096,
        ));
        groups.push((dr as u32, sr as u32));
    }
    assert!(!on_grids(&copies, None));
    assert!(on_grids(&copies, Some(&groups)));
    assert_eq!(conflict_in_groups(&copies, Some(&groups)), None);
    assert_eq!(conflict_by_sort(&copies), None);
    // One destination moved onto a source region's block: not proven, and the sort names it.
    copies[3].0 = region(2 * 4 + 1) + 4096;
    assert!(!on_grids(&copies, Some(&groups)));
    assert_eq!(
        conflict_in_groups(&copies, Some(&groups)),
        conflict_by_sort(&copies)
    );
    assert!(conflict_by_sort(&copies).is_some());
    // Groups of the wrong count or out of bounds prove nothing.
    assert!(!on_grids(&copies[..4], Some(&groups)));
    let mut far = groups.clone();
    far[0].0 = u32::MAX;
    assert!(!on_grids(&copies, Some(&far)));
}

proptest::proptest! {
    /// With any grouping, the answer is the sort's: groups only split the proof's work.
    #[test]
    fn grouped_proofs_never_hide_a_conflict(
        cells in proptest::collection::vec((0u64..64, 0u64..64, 0u32..4, 0u32..4, 1u64..4), 0..40),
        len in 1u64..5,
        stride in 1u64..9,
        sbase in 0u64..600,
    ) {
        // Lengths are multiples of `len` (merged runs of blocks), some not of the grid's.
        let copies: Vec<(u64, u64, u64)> = cells
            .iter()
            .map(|&(d, s, _, _, m)| (d * stride, sbase + s * stride, len * m))
            .collect();
        let groups: Vec<(u32, u32)> = cells.iter().map(|&(_, _, g, h, _)| (g, h)).collect();
        proptest::prop_assert_eq!(
            conflict_in_groups(&copies, Some(&groups)),
            conflict_by_sort(&copies)
        );
    }

    /// The linear proof is sound: wherever it says independent, the sort finds no pair.
    #[test]
    fn the_grid_proof_never_hides_a_conflict(
        cells in proptest::collection::vec((0u64..64, 0u64..64), 0..40),
        len in 1u64..5,
        stride in 1u64..9,
        sbase in 0u64..600,
    ) {
        let copies: Vec<(u64, u64, u64)> = cells
            .iter()
            .map(|&(d, s)| (d * stride, sbase + s * stride, len))
            .collect();
        if on_grids(&copies, None) {
            proptest::prop_assert_eq!(conflict_by_sort(&copies), None);
        }
        proptest::prop_assert_eq!(conflict(&copies), conflict_by_sort(&copies));
    }
}

/// The segments of tests/gpu_agent.rs `gpu_agent_copy_kernel_scatter_gather` as first
/// written: (src offset, dst offset, len) in two 8 MiB buffers. The fifth segment's
/// destination (1 MiB + 2 MiB + 5) runs 5 bytes into the first's (3 MiB): the test wanted
/// the fifth's bytes there, the H200 left the first's.
fn gpu_test_segments(fixed: bool) -> Vec<(u64, u64, u64)> {
    vec![
        (0, 3 * MIB + if fixed { 32 } else { 0 }, MIB),
        (MIB + 3, 19, 1),
        (MIB + 64, 4096, 4095),
        (2 * MIB + 13, 7 * MIB + 29, 300_001),
        (3 * MIB, MIB, 2 * MIB + 5),
        (6 * MIB + 1, 5 * MIB + 17, 33),
        (7 * MIB, 6 * MIB, 16),
    ]
}

/// A source pattern no two nearby bytes share.
fn fill(bytes: &mut [u8]) {
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u64).wrapping_mul(0x9E37_79B9).wrapping_shr(7) as u8 | 1;
    }
}

/// Simulated memory before a launch: descriptors go in its first `desc_area` bytes.
struct Image<'a> {
    bytes: &'a [u8],
    base: u64,
    desc_area: u64,
}

/// Simulates one launch: descriptors at the image's base, planned for `resident` CTAs of
/// `ntid` threads; returns the memory after it (descriptor area zeroed), or the race.
fn simulate(
    prog: &Program,
    shape: &KernelShape,
    img: &Image,
    segs: &[Segment],
    resident: u32,
    ntid: u32,
) -> Result<Vec<u8>, String> {
    let (descs, grid) = plan(segs, shape, resident);
    let bytes = descriptor_bytes(&descs);
    assert!(
        bytes.len() as u64 <= img.desc_area,
        "{} descriptors",
        descs.len()
    );
    let mut m = Memory::new(img.base, img.bytes.to_vec());
    m.bytes[..bytes.len()].copy_from_slice(&bytes);
    let params = [("nixl_descs", img.base), ("nixl_count", descs.len() as u64)];
    run(prog, &mut m, &params, grid, ntid)?;
    m.bytes[..bytes.len()].fill(0);
    Ok(m.bytes)
}

/// The H200 failure, reproduced: the first version of the GPU test's request, simulated,
/// is reported as a race at the byte the GPU got "wrong" (the simulator used to pass it,
/// running CTAs in the one order the test's expectation assumed), and the host refuses it
/// to the kernel. The fixed request copies every byte, race-free.
#[test]
fn the_gpu_tests_first_request_races_and_the_fixed_one_does_not() {
    let base = 0x7f00_0000_0000u64;
    let desc_area = 64 << 10;
    let (src0, dst0) = (base + desc_area, base + desc_area + 8 * MIB);
    let mut image = vec![0u8; (desc_area + 16 * MIB) as usize];
    fill(&mut image[desc_area as usize..(desc_area + 8 * MIB) as usize]);
    let segs = |fixed| -> Vec<Segment> {
        gpu_test_segments(fixed)
            .iter()
            .map(|&(s, d, len)| seg(src0 + s, dst0 + d, len))
            .collect()
    };
    let copies = |fixed| -> Vec<(u64, u64, u64)> {
        segs(fixed).iter().map(|s| (s.dst, s.src, s.len)).collect()
    };
    let shape = BASE;
    let prog = Program::parse(&ptx(&shape));
    // 32 chunks on 32 CTAs, as on the H200.
    assert_eq!(plan(&segs(false), &shape, 1056).1, 32);
    let img = Image {
        bytes: &image,
        base,
        desc_area,
    };
    let e = simulate(&prog, &shape, &img, &segs(false), 1056, 256).unwrap_err();
    assert!(
        e.contains(&format!("write-after-write race at {:#x}", dst0 + 3 * MIB)),
        "{e}"
    );
    assert_eq!(conflict(&copies(false)), Some((0, 4)));
    // Fixed: no conflict, and every byte lands under every shape.
    assert_eq!(conflict(&copies(true)), None);
    let mut want = image.clone();
    for s in segs(true) {
        let (a, b) = ((s.src - base) as usize, (s.dst - base) as usize);
        let src = want[a..a + s.len as usize].to_vec();
        want[b..b + s.len as usize].copy_from_slice(&src);
    }
    // Every sweep shape in release builds (the GPU machine runs those), the default in
    // debug builds (the other shapes are simulated on smaller requests elsewhere).
    let mut shapes = vec![shape];
    if !cfg!(debug_assertions) {
        shapes.extend(KernelShape::sweep().iter().skip(1).map(|s| s.1));
    }
    for shape in shapes {
        let prog = Program::parse(&ptx(&shape));
        let got = simulate(&prog, &shape, &img, &segs(true), 1056, 64)
            .unwrap_or_else(|e| panic!("{shape}: {e}"));
        assert!(got == want, "{shape}: bytes differ");
    }
}

#[test]
fn descriptor_bytes_are_src_dst_len_little_endian() {
    let d = [
        seg(0x0102_0304_0506_0708, 0x1112_1314_1516_1718, 0x20),
        seg(1, 2, 3),
    ];
    let b = descriptor_bytes(&d);
    assert_eq!(b.len(), 2 * DESC_BYTES);
    assert_eq!(b[0], 0x08);
    assert_eq!(b[7], 0x01);
    assert_eq!(&b[8..16], &0x1112_1314_1516_1718u64.to_le_bytes());
    assert_eq!(&b[16..24], &0x20u64.to_le_bytes());
    assert_eq!(
        &b[24..48],
        &[1u8, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]
    );
    assert!(descriptor_bytes(&[]).is_empty());
}

#[test]
fn written_descriptors_equal_descriptor_bytes() {
    let d: Vec<Segment> = (0..5u64).map(|i| seg(i * 7, i << 40, i + 1)).collect();
    let want = descriptor_bytes(&d);
    let mut out = vec![0u8; want.len() + 5];
    assert_eq!(write_descriptors(&d, &mut out), 5);
    assert!(out[..want.len()] == want[..] && out[want.len()..] == [0; 5]);
    let mut short = vec![0u8; 2 * DESC_BYTES + 3];
    assert_eq!(write_descriptors(&d, &mut short), 2);
    assert_eq!(short[..2 * DESC_BYTES], want[..2 * DESC_BYTES]);
}

#[test]
fn alignment_classes() {
    assert!(co_aligned(0x10, 0x20));
    assert!(co_aligned(0x13, 0x23));
    assert!(!co_aligned(0x10, 0x28));
}

#[test]
fn shapes_print_parse_and_validate() {
    let d = BASE;
    assert_eq!(
        d.to_string(),
        "chunk=128k,ctas=8,threads=256,unroll=4,load=nc,store=cs,schedule=persistent"
    );
    assert_eq!(d.to_string().parse::<KernelShape>(), Ok(d));
    assert_eq!("".parse::<KernelShape>(), Ok(KernelShape::default()));
    let s: KernelShape =
        " chunk=1m, threads=1024,ctas=2,unroll=8,load=plain,store=wb,schedule=balanced "
            .parse()
            .unwrap();
    assert_eq!(
        s,
        KernelShape {
            chunk: MIB,
            ctas_per_sm: 2,
            threads: 1024,
            unroll: 8,
            nc_loads: false,
            streaming_stores: false,
            schedule: KernelSchedule::Balanced,
        }
    );
    assert_eq!("chunk=65552".parse::<KernelShape>().unwrap().chunk, 65552);
    assert_eq!(
        "schedule=per-chunk"
            .parse::<KernelShape>()
            .unwrap()
            .schedule,
        KernelSchedule::PerChunk
    );
    for bad in [
        "chunk=4000",
        "chunk=4097",
        "chunk=2048m",
        "chunk=x",
        "chunk=99999999999999999999m",
        "threads=48",
        "threads=2048",
        "threads=0",
        "ctas=0",
        "ctas=33",
        "unroll=0",
        "unroll=9",
        "store=wt",
        "load=ca",
        "schedule=random",
        "speed=11",
        "threads",
    ] {
        assert!(bad.parse::<KernelShape>().is_err(), "{bad}");
    }
    let sweep = KernelShape::sweep();
    assert!((8..=12).contains(&sweep.len()));
    assert_eq!(sweep[0].1, BASE);
    for (i, (name, s)) in sweep.iter().enumerate() {
        s.validate().unwrap();
        assert_eq!(s.to_string().parse::<KernelShape>(), Ok(*s));
        for (other, t) in &sweep[..i] {
            assert!(name != other && s != t, "{name} repeats {other}");
        }
    }
}

/// Segments of every alignment class and many lengths, laid out in a source and a
/// destination area at `src0` / `dst0`: `(src offset, dst offset, len)` and the areas'
/// size. `full`: every length with every skew; else a smaller set that still has heads
/// and tails of several lengths, the byte path and multi-round bodies.
fn cases(full: bool) -> (Vec<(u64, u64, u64)>, u64) {
    let lens: &[u64] = if full {
        &[0, 1, 2, 15, 16, 17, 31, 33, 64, 65, 100, 4095, 4103, 20_001]
    } else {
        &[0, 1, 15, 17, 33, 100, 4103, 20_001]
    };
    let skews: &[(u64, u64)] = if full {
        &[
            (0, 0),
            (3, 3),
            (13, 13),
            (15, 15),
            (1, 0),
            (0, 8),
            (5, 9),
            (16, 0),
        ]
    } else {
        &[(0, 0), (13, 13), (5, 9)]
    };
    let (mut s, mut d) = (0u64, 0u64);
    let mut v = Vec::new();
    for &len in lens {
        for &(ks, kd) in skews {
            // The byte path is the same text in every shape: short ones suffice there.
            if !full && !co_aligned(ks, kd) && len > 4103 {
                continue;
            }
            v.push((s + ks, d + kd, len));
            s = (s + ks + len + 64).next_multiple_of(64);
            d = (d + kd + len + 64).next_multiple_of(64);
        }
    }
    // A multiple of 64, so equal skews are co-aligned.
    let area = (v.iter().map(|c| c.0.max(c.1) + c.2).max().unwrap_or(0) + 64).next_multiple_of(64);
    (v, area)
}

/// Simulates `shape` over `cases` for each (chunk, resident CTAs, threads): every
/// destination byte must be the source's, nothing else written, and no two threads touch
/// one byte.
fn check_shape(shape: &KernelShape, full: bool, launches: &[(u64, u32, u32)]) {
    let base = 0x7f00_0000_0000u64;
    let (cases, area) = cases(full);
    let desc_area = 256 << 10;
    let (src0, dst0) = (base + desc_area, base + desc_area + area);
    let mut image = vec![0u8; (desc_area + 2 * area) as usize];
    fill(&mut image[desc_area as usize..(desc_area + area) as usize]);
    let segs: Vec<Segment> = cases
        .iter()
        .map(|&(s, d, len)| seg(src0 + s, dst0 + d, len))
        .collect();
    // Both paths of the kernel, and heads of several lengths, are exercised.
    assert!(segs
        .iter()
        .any(|s| s.len > 64 && co_aligned(s.src, s.dst) && s.src % 16 == 0));
    assert!(segs
        .iter()
        .any(|s| s.len > 64 && co_aligned(s.src, s.dst) && s.src % 16 == 13));
    assert!(segs.iter().any(|s| s.len > 64 && !co_aligned(s.src, s.dst)));
    let mut want = image.clone();
    for &(s, d, len) in &cases {
        let (s, d) = ((desc_area + s) as usize, (desc_area + area + d) as usize);
        let src = want[s..s + len as usize].to_vec();
        want[d..d + len as usize].copy_from_slice(&src);
    }
    let prog = Program::parse(&ptx(shape));
    let img = Image {
        bytes: &image,
        base,
        desc_area,
    };
    for &(chunk, resident, ntid) in launches {
        let s = KernelShape { chunk, ..*shape };
        let got = simulate(&prog, &s, &img, &segs, resident, ntid)
            .unwrap_or_else(|e| panic!("{s} on {resident} CTAs x {ntid}: {e}"));
        if got != want {
            let i = (0..want.len()).find(|&i| want[i] != got[i]).unwrap_or(0);
            panic!(
                "{s} on {resident} CTAs x {ntid}: byte {:#x} differs",
                base + i as u64
            );
        }
    }
}

/// Executes the default shape's PTX text on the CPU over descriptors of every alignment
/// class and many lengths, with chunks from its own down to 64 bytes (every long segment
/// split, many rounds of the grid-stride loop) and thread counts from its own down to 16.
#[test]
fn the_ptx_copies_every_byte_when_simulated() {
    let d = KernelShape::default();
    check_shape(
        &d,
        true,
        &[
            (d.chunk, 7, d.threads),
            (4096, 3, d.threads),
            (1024, 64, 32),
            (64, 5, 16),
        ],
    );
}

/// Every shape `gpu_bench --sweep` measures (and each schedule with an odd unroll and
/// plain stores), simulated as above at its own thread count and chunk, and with small
/// chunks on many small CTAs; the full case set in release builds (the GPU machine runs
/// those), a smaller one in debug builds to keep CI fast.
#[test]
fn every_sweep_shape_copies_every_byte_when_simulated() {
    let full = !cfg!(debug_assertions);
    let mut shapes: Vec<KernelShape> = KernelShape::sweep().iter().map(|s| s.1).collect();
    for schedule in [
        KernelSchedule::Persistent,
        KernelSchedule::Balanced,
        KernelSchedule::PerChunk,
    ] {
        shapes.push(KernelShape {
            schedule,
            unroll: 3,
            nc_loads: schedule != KernelSchedule::Balanced,
            streaming_stores: false,
            ..KernelShape::default()
        });
    }
    for shape in shapes {
        let mut launches = vec![(shape.chunk, 5, shape.threads), (4096, 32, 32)];
        if full {
            launches.push((1024, 7, 64));
            launches.push((64, 3, 16));
        }
        check_shape(&shape, full, &launches);
    }
}

#[test]
fn ptx_is_terminated_and_declares_what_the_launch_passes() {
    for (_, shape) in KernelShape::sweep() {
        let p = ptx(&shape);
        assert!(p.ends_with('\0'));
        assert_eq!(p.matches('\0').count(), 1);
        assert!(p.contains(".visible .entry nixl_copy_segments("));
        assert_eq!(p.matches(".param .u64").count(), 2);
        assert!(p.contains(&format!(".maxntid {}, 1, 1", shape.threads)));
        // Every placeholder was filled: the only '@'s left are predicate guards.
        assert!(p
            .match_indices('@')
            .all(|(i, _)| p[i + 1..].starts_with('%')));
        let loads = p.matches("ld.global.nc.v4.u32").count() as u32;
        let plain = p.matches("ld.global.v4.u32").count() as u32;
        if shape.nc_loads {
            assert_eq!((loads, plain), (shape.unroll + 1, 0));
        } else {
            assert_eq!((loads, plain), (0, shape.unroll + 1));
        }
        assert_eq!(
            p.matches("st.global.cs.v4.u32").count() as u32,
            if shape.streaming_stores {
                shape.unroll + 1
            } else {
                0
            }
        );
        assert!(p.contains(&format!("// shape: {shape}\n")));
        // Descriptor stride and field offsets match `descriptor_bytes`.
        assert!(p.contains(&format!("mad.lo.u64 \t%rd11, %rd3, {DESC_BYTES}, %rd1;")));
        assert!(p.contains("[%rd11+8]") && p.contains("[%rd11+16]"));
    }
    assert_eq!(NAME.to_str().unwrap(), "nixl_copy_segments");
}

/// The block kernel of every sweep shape: terminated, named as loaded, the launch's four
/// parameters, every placeholder filled, and the segment kernel's copy code from the
/// alignment check on, unchanged (so a CTA's copy runs as fast).
#[test]
fn the_block_kernel_is_the_segment_kernels_copy_code() {
    for (_, shape) in KernelShape::sweep() {
        let (p, s) = (ptx_blocks(&shape), ptx(&shape));
        assert!(p.ends_with('\0') && p.matches('\0').count() == 1);
        assert!(p.contains(".visible .entry nixl_copy_blocks("));
        assert_eq!(p.matches(".param .u64").count(), 4);
        assert!(p
            .match_indices('@')
            .all(|(i, _)| p[i + 1..].starts_with('%')));
        let copy = |t: &str| t[t.find("\txor.b64").unwrap()..].to_owned();
        assert_eq!(copy(&p), copy(&s));
        assert!(p.contains("div.u32") && !p.contains("div.u64"));
    }
    assert_eq!(BLOCKS_NAME.to_str().unwrap(), "nixl_copy_blocks");
}
