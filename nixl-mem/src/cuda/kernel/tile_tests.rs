//! The tile kernel's PTX run on the simulator: every row of every tile lands where the
//! destination's strides say, every other byte is untouched, no two threads race.

use super::*;
use crate::cuda::ptx_sim::{run, Memory, Program};

/// A KV-like table: `layers` layers of `pool` blocks on each side; source blocks hold
/// `sh` heads x `n` tokens in HND (`[head][token][row]`), destination blocks `dh` heads x `n`
/// tokens in NHD (`[token][head][row]`); each tile moves heads `0..a` of a source block to
/// heads `h0..h0 + a` of a destination block, so with `a < dh` tiles of several sources
/// gather into one destination.
struct Kv {
    layers: u64,
    pool: u64,
    sh: u64,
    dh: u64,
    n: u64,
    row: u64,
}

impl Kv {
    fn sblock(&self) -> u64 {
        self.sh * self.n * self.row
    }
    fn dblock(&self) -> u64 {
        self.dh * self.n * self.row
    }
    fn table(&self, src: u64, dst: u64, a: u64, pairs: &[(u64, u64, u64)]) -> TileTable {
        let (sb, db) = (self.sblock(), self.dblock());
        TileTable {
            rows: (a, self.n, self.row),
            src: (self.n * self.row, self.row),
            dst: (self.row, self.dh * self.row),
            layers: (0..self.layers)
                .map(|l| [src + l * self.pool * sb, sb, dst + l * self.pool * db, db])
                .collect(),
            tiles: pairs
                .iter()
                .map(|&(s, d, h0)| [s, d, 0, h0 * self.row])
                .collect(),
        }
    }
}

#[test]
fn the_tile_kernel_permutes_every_row_when_simulated() {
    let base = 0x7f00_0000_0000u64;
    for (shape, row) in [
        (KernelShape::default(), 256u64),
        (
            KernelShape {
                nc_loads: true,
                streaming_stores: false,
                ..KernelShape::default()
            },
            48,
        ),
        (KernelShape::default(), 16),
    ] {
        let prog = Program::parse(&ptx_tiles(&shape));
        let kv = Kv {
            layers: 2,
            pool: 5,
            sh: 2,
            dh: 4,
            n: 3,
            row,
        };
        let table_area = 4096u64;
        let src = base + table_area;
        let dst = src + kv.layers * kv.pool * kv.sblock();
        let end = dst + kv.layers * kv.pool * kv.dblock();
        // Two source blocks gathered into destination block 1 (heads 0-1 and 2-3), one into
        // block 4's upper heads.
        let pairs = [(0, 1, 0), (3, 1, 2), (2, 4, 2)];
        let t = kv.table(src, dst, 2, &pairs);
        assert_eq!(t.problem(), None);
        let mut image = vec![0u8; (end - base) as usize];
        for (i, b) in image.iter_mut().enumerate().skip(table_area as usize) {
            *b = (i as u64).wrapping_mul(0x9E37_79B9).wrapping_shr(7) as u8 | 1;
        }
        // The expected image, row by row from the definition (not from the table).
        let mut want = image.clone();
        for l in 0..kv.layers {
            for &(s, d, h0) in &pairs {
                for h in 0..2 {
                    for tok in 0..kv.n {
                        let so =
                            src - base + (l * kv.pool + s) * kv.sblock() + (h * kv.n + tok) * row;
                        let d_o = dst - base
                            + (l * kv.pool + d) * kv.dblock()
                            + (tok * kv.dh + h0 + h) * row;
                        let bytes = image[so as usize..(so + row) as usize].to_vec();
                        want[d_o as usize..(d_o + row) as usize].copy_from_slice(&bytes);
                    }
                }
            }
        }
        let mut m = Memory::new(base, image);
        assert!(t.write(&mut m.bytes));
        let at = table_area as usize;
        for (grid, ntid) in [(t.items() as u32, 32), (2, 64), (1, 96)] {
            let mut m = Memory::new(base, m.bytes.clone());
            let params = [
                ("nixl_descs", base),
                ("nixl_count", t.items()),
                ("nixl_pieces", base + t.tiles_at() as u64),
                ("nixl_npieces", t.tiles.len() as u64),
            ];
            run(&prog, &mut m, &params, grid, ntid)
                .unwrap_or_else(|e| panic!("row {row} grid {grid} ntid {ntid}: {e}"));
            assert!(
                m.bytes[at..] == want[at..],
                "row {row} grid {grid} ntid {ntid}: wrong bytes"
            );
        }
    }
}

#[test]
fn tile_tables_the_kernel_cannot_copy_are_named() {
    let kv = Kv {
        layers: 1,
        pool: 2,
        sh: 1,
        dh: 1,
        n: 2,
        row: 24,
    };
    let t = kv.table(0x1000, 0x2000, 1, &[(0, 0, 0)]);
    assert!(t.problem().unwrap().contains("multiples of 16"));
    let mut t = Kv { row: 32, ..kv }.table(0x1000, 0x2000, 1, &[(0, 0, 0)]);
    assert_eq!(t.problem(), None);
    t.tiles[0][2] = 8;
    assert!(t.problem().is_some());
    t.tiles.clear();
    assert_eq!(t.problem(), Some("no rows"));
    let mut small = vec![0u8; 8];
    assert!(!Kv { row: 32, ..kv }
        .table(0x1000, 0x2000, 1, &[(0, 0, 0)])
        .write(&mut small));
}

/// The tile kernel's arrival variant copies the same bytes and adds one per tile to the tile's
/// layer's counter: after two launches, every layer's counter is twice its tiles.
#[test]
fn the_tile_arrival_kernel_counts_each_layers_tiles() {
    let base = 0x7f00_0000_0000u64;
    let shape = KernelShape::default();
    let kv = Kv {
        layers: 3,
        pool: 4,
        sh: 2,
        dh: 2,
        n: 2,
        row: 32,
    };
    let table_area = 4096u64;
    let counters = base + table_area - 64;
    let src = base + table_area;
    let dst = src + kv.layers * kv.pool * kv.sblock();
    let end = dst + kv.layers * kv.pool * kv.dblock();
    let pairs = [(0, 3, 0), (1, 2, 0)];
    let t = kv.table(src, dst, 2, &pairs);
    let mut image = vec![0u8; (end - base) as usize];
    for (i, b) in image.iter_mut().enumerate().skip(table_area as usize) {
        *b = (i as u64).wrapping_mul(0x9E37_79B9).wrapping_shr(7) as u8 | 1;
    }
    let count = |m: &Memory, l: u64| {
        let o = (counters - base + 8 * l) as usize;
        u64::from_le_bytes(m.bytes[o..o + 8].try_into().unwrap())
    };
    // Tiles: with and without counters, the same bytes.
    let mut plain = Memory::new(base, image.clone());
    assert!(t.write(&mut plain.bytes));
    let mut counted = Memory::new(base, plain.bytes.clone());
    let params = |with: bool| {
        let mut p = vec![
            ("nixl_descs", base),
            ("nixl_count", t.items()),
            ("nixl_pieces", base + t.tiles_at() as u64),
            ("nixl_npieces", t.tiles.len() as u64),
        ];
        if with {
            p.push(("nixl_counters", counters));
        }
        p
    };
    run(
        &Program::parse(&ptx_tiles(&shape)),
        &mut plain,
        &params(false),
        4,
        64,
    )
    .unwrap();
    let prog = Program::parse(&ptx_tiles_arrival(&shape));
    for _ in 0..2 {
        run(&prog, &mut counted, &params(true), 4, 64).unwrap();
    }
    let at = table_area as usize;
    assert!(counted.bytes[at..] == plain.bytes[at..]);
    for l in 0..kv.layers {
        assert_eq!(count(&counted, l), 2 * pairs.len() as u64, "tile layer {l}");
    }
}

/// The block kernel's arrival variant: the same copies, each layer's counter its pieces.
#[test]
fn the_block_arrival_kernel_counts_each_layers_pieces() {
    let base = 0x7f00_0000_0000u64;
    let shape = KernelShape::default();
    let layers = 3u64;
    let table_area = 4096u64;
    let counters = base + table_area - 64;
    let src = base + table_area;
    let dst = src + layers * 4 * 48;
    let end = dst + layers * 4 * 48;
    let mut image = vec![0u8; (end - base) as usize];
    for (i, b) in image.iter_mut().enumerate().skip(table_area as usize) {
        *b = (i as u64).wrapping_mul(0x9E37_79B9).wrapping_shr(7) as u8 | 1;
    }
    let count = |m: &Memory, l: u64| {
        let o = (counters - base + 8 * l) as usize;
        u64::from_le_bytes(m.bytes[o..o + 8].try_into().unwrap())
    };
    let at = table_area as usize;
    let kv = Kv {
        layers,
        pool: 4,
        sh: 1,
        dh: 1,
        n: 1,
        row: 48,
    };
    // Blocks: layers of 3 pools, pieces (src id, dst id, offset, len) of 48-byte blocks.
    let bb = 48u64;
    let mut table = Vec::new();
    for l in 0..kv.layers {
        for w in [src + l * 4 * bb, bb, dst + l * 4 * bb, bb] {
            table.extend_from_slice(&w.to_le_bytes());
        }
    }
    let pieces_at = table.len() as u64;
    for (s, d) in [(0u64, 1u64), (2, 3), (3, 0)] {
        for w in [s, d, 0, bb] {
            table.extend_from_slice(&w.to_le_bytes());
        }
    }
    let mut m = Memory::new(base, image);
    m.bytes[..table.len()].copy_from_slice(&table);
    let bparams = [
        ("nixl_descs", base),
        ("nixl_count", 3 * kv.layers),
        ("nixl_pieces", base + pieces_at),
        ("nixl_npieces", 3),
        ("nixl_counters", counters),
    ];
    let mut want = m.bytes.clone();
    for l in 0..kv.layers {
        for (s, d) in [(0u64, 1u64), (2, 3), (3, 0)] {
            let so = (src - base + l * 4 * bb + s * bb) as usize;
            let d_o = (dst - base + l * 4 * bb + d * bb) as usize;
            let bytes = m.bytes[so..so + bb as usize].to_vec();
            want[d_o..d_o + bb as usize].copy_from_slice(&bytes);
        }
    }
    run(
        &Program::parse(&ptx_blocks_arrival(&shape)),
        &mut m,
        &bparams,
        2,
        32,
    )
    .unwrap();
    assert!(m.bytes[at..] == want[at..]);
    for l in 0..kv.layers {
        assert_eq!(count(&m, l), 3, "block layer {l}");
    }
}

/// The segment kernel's arrival variant: the same copies, one counter for the request that
/// every descriptor adds one to.
#[test]
fn the_segment_arrival_kernel_counts_every_descriptor() {
    let base = 0x7f00_0000_0000u64;
    let shape = KernelShape::default();
    let (area, len) = (4096u64, 4096u64);
    let counter = base + area - 8;
    let (src, dst) = (base + area, base + area + 4 * len);
    let descs: Vec<Segment> = (0..4)
        .map(|i| Segment {
            src: src + i * len,
            dst: dst + (3 - i) * len,
            len: len - 16 * i,
        })
        .collect();
    let mut image = vec![0u8; (area + 8 * len) as usize];
    for (i, b) in image.iter_mut().enumerate().skip(area as usize) {
        *b = (i as u64).wrapping_mul(0x9E37_79B9).wrapping_shr(7) as u8 | 1;
    }
    let table = descriptor_bytes(&descs);
    image[..table.len()].copy_from_slice(&table);
    let mut want = image.clone();
    for d in &descs {
        let (s, t) = ((d.src - base) as usize, (d.dst - base) as usize);
        let bytes = image[s..s + d.len as usize].to_vec();
        want[t..t + d.len as usize].copy_from_slice(&bytes);
    }
    let mut m = Memory::new(base, image);
    let params = [
        ("nixl_descs", base),
        ("nixl_count", descs.len() as u64),
        ("nixl_counters", counter),
    ];
    let prog = Program::parse(&ptx_segments_arrival(&shape));
    run(&prog, &mut m, &params, 2, 64).unwrap();
    let at = area as usize;
    assert!(m.bytes[at..] == want[at..]);
    let o = (counter - base) as usize;
    assert_eq!(u64::from_le_bytes(m.bytes[o..o + 8].try_into().unwrap()), 4);
}
