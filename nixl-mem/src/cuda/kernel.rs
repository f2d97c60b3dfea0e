//! A scatter-gather copy kernel: one launch copies every segment of a request, where
//! `cuMemcpyBatchAsync` issues one copy per segment.
//!
//! The kernel is hand-written PTX (ISA 7.0 for `sm_70`, so the driver JIT-compiles it for the
//! GPU at hand; no CUDA toolkit is needed to build), generated from a [`KernelShape`] by
//! [`ptx`]. It takes a device array of descriptors `(src u64, dst u64, len u64)` and their
//! count. Each CTA grid-strides over the descriptors; in a descriptor whose source and
//! destination share their alignment modulo 16, threads `0..15` copy the head bytes up to the
//! first 16-byte boundary, all threads copy the body with 16-byte vector loads and stores
//! (`unroll` loads in flight per thread, then their stores), and threads `0..15` copy the
//! tail; other descriptors are copied byte by byte (correct but slow: the backend routes such
//! requests to the copy engines instead). A zero-length descriptor touches no memory (the
//! balanced schedule pads with them).
//!
//! The block kernel ([`ptx_blocks`]) is the same copy code over items generated on the device
//! from a block table (per layer: source and destination base and stride; per piece of the
//! ids: source id, destination id, offset, length), so a block-table request uploads
//! O(layers + ids) bytes instead of a descriptor per layer and block. Its item `i` is the
//! segment kernel's descriptor `i` of the same request, so CTAs get the same work.
//!
//! [`plan`] cuts the segments into descriptors of at most `chunk` bytes and picks the grid
//! ([`KernelSchedule`]); cuts fall on multiples of 16 bytes from a segment's start, which keeps each
//! piece's relative alignment. CTAs share no data, and no two descriptors may conflict (one's
//! destination overlapping another's source or destination): the GPU runs CTAs in any order,
//! so such bytes would be whatever the last writer left. [`conflict`] finds such requests on
//! the host; the backend copies them with in-order `cuMemcpyAsync` calls instead.

use std::ffi::CStr;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::{bind, CudaError};
use crate::sys::cu as sys;
use crate::sys::driver::device_attribute;
use crate::sys::module::KernelModule;
use crate::sys::stream::Stream;

/// Bytes per descriptor in the device array.
pub(crate) const DESC_BYTES: usize = 24;
/// The largest `gridDim.x`.
const MAX_GRID: u64 = (1 << 31) - 1;

const NAME: &CStr = c"nixl_copy_segments";
const BLOCKS_NAME: &CStr = c"nixl_copy_blocks";

/// How the copy kernel's descriptors are assigned to CTAs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelSchedule {
    /// As many CTAs as fit on the GPU at once; CTA `i` copies descriptors `i`, `i + grid`, ...
    /// (the last round of descriptors may leave some CTAs idle).
    Persistent,
    /// As `Persistent`, but the request's bytes are first split into one equal share per CTA
    /// (each share cut into descriptors of at most `chunk` bytes, padded with empty ones), so
    /// every CTA copies the same number of bytes.
    Balanced,
    /// One CTA per descriptor; the hardware starts CTAs as others finish.
    PerChunk,
}

impl KernelSchedule {
    fn name(self) -> &'static str {
        match self {
            KernelSchedule::Persistent => "persistent",
            KernelSchedule::Balanced => "balanced",
            KernelSchedule::PerChunk => "per-chunk",
        }
    }
}

/// The copy kernel's shape: how requests are cut, how many CTAs of how many threads copy them,
/// and how each thread issues its loads and stores. The default is the shape measured first
/// (docs/perf/gpu.md, run 2). Written and parsed as
/// `chunk=128k,ctas=8,threads=256,unroll=4,load=nc,store=cs,schedule=persistent` (any subset
/// of the keys, the rest default; sizes in bytes or with `k`/`m`; `load` is `nc` or `plain`;
/// `store` is `cs` or `wb`; `schedule` is `persistent`, `balanced` or `per-chunk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelShape {
    /// The largest descriptor in bytes: a multiple of 16, from 4 KiB to 1 GiB.
    pub chunk: u64,
    /// At most this many CTAs per SM (1 to 32); fewer where the GPU's occupancy calculator
    /// allows fewer (registers, threads).
    pub ctas_per_sm: u32,
    /// Threads per CTA: a multiple of 32, from 32 to 1024.
    pub threads: u32,
    /// 16-byte loads each thread issues before it stores them: 1 to 8.
    pub unroll: u32,
    /// Load the body through the read-only path (`ld.global.nc`) rather than with a plain
    /// `ld.global`. `ptxas` may sink read-only loads below the stores that follow them (it
    /// does, to stay at 32 registers), so with `.nc` at most about four loads are in flight
    /// whatever `unroll` says; plain loads keep all `unroll` ahead of the round's stores (more
    /// registers: 48-54 for 8).
    pub nc_loads: bool,
    /// Store with the streaming hint (`st.global.cs`, evict first) rather than the default
    /// write-back (`st.global`, i.e. `.wb`).
    pub streaming_stores: bool,
    /// How descriptors are assigned to CTAs.
    pub schedule: KernelSchedule,
}

/// The shape of docs/perf/gpu.md's run 2 on an H200, the sweep's baseline.
const BASE: KernelShape = KernelShape {
    chunk: 128 << 10,
    ctas_per_sm: 8,
    threads: 256,
    unroll: 4,
    nc_loads: true,
    streaming_stores: true,
    schedule: KernelSchedule::Persistent,
};

/// The default: the winner of `gpu_bench --sweep` on an NVIDIA H200 (2026-11-22, docs/perf/gpu.md):
/// per-block VRAM<->VRAM at 1 and 4 MiB x 1024, slowest cell 1925.9 GB/s (the first shape,
/// `BASE`, reached 1815.0).
const TUNED: KernelShape = KernelShape {
    chunk: 64 << 10,
    ctas_per_sm: 8,
    threads: 256,
    unroll: 8,
    nc_loads: false,
    streaming_stores: true,
    schedule: KernelSchedule::PerChunk,
};

impl Default for KernelShape {
    fn default() -> Self {
        TUNED
    }
}

fn size_text(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}m", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}k", n >> 10)
    } else {
        n.to_string()
    }
}

fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim().to_ascii_lowercase();
    let (num, shift) = match v.as_bytes().last() {
        Some(b'k') => (&v[..v.len() - 1], 10),
        Some(b'm') => (&v[..v.len() - 1], 20),
        _ => (&v[..], 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

impl fmt::Display for KernelShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "chunk={},ctas={},threads={},unroll={},load={},store={},schedule={}",
            size_text(self.chunk),
            self.ctas_per_sm,
            self.threads,
            self.unroll,
            if self.nc_loads { "nc" } else { "plain" },
            if self.streaming_stores { "cs" } else { "wb" },
            self.schedule.name()
        )
    }
}

impl FromStr for KernelShape {
    type Err = String;

    /// Parses the [`Display`](fmt::Display) form (any subset of its keys) and validates it.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut k = KernelShape::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (key, v) = item
                .split_once('=')
                .ok_or_else(|| format!("copy kernel shape item {item:?} is not key=value"))?;
            let bad = || format!("copy kernel shape: {key}={v:?} is not valid");
            let num = |v: &str| v.trim().parse::<u32>().map_err(|_| bad());
            match key.trim() {
                "chunk" => k.chunk = parse_size(v).ok_or_else(bad)?,
                "ctas" => k.ctas_per_sm = num(v)?,
                "threads" => k.threads = num(v)?,
                "unroll" => k.unroll = num(v)?,
                "load" => {
                    k.nc_loads = match v.trim() {
                        "nc" => true,
                        "plain" => false,
                        _ => return Err(bad()),
                    }
                }
                "store" => {
                    k.streaming_stores = match v.trim() {
                        "cs" => true,
                        "wb" => false,
                        _ => return Err(bad()),
                    }
                }
                "schedule" => {
                    k.schedule = match v.trim() {
                        "persistent" => KernelSchedule::Persistent,
                        "balanced" => KernelSchedule::Balanced,
                        "per-chunk" => KernelSchedule::PerChunk,
                        _ => return Err(bad()),
                    }
                }
                other => return Err(format!("copy kernel shape has no key {other:?}")),
            }
        }
        k.validate()?;
        Ok(k)
    }
}

impl KernelShape {
    /// Whether every field is in range; the error names the first that is not.
    pub fn validate(&self) -> Result<(), String> {
        if !self.chunk.is_multiple_of(16) || !(4 << 10..=1 << 30).contains(&self.chunk) {
            return Err(format!(
                "copy kernel chunk {} is not a multiple of 16 from 4 KiB to 1 GiB",
                self.chunk
            ));
        }
        if !(1..=32).contains(&self.ctas_per_sm) {
            return Err(format!(
                "copy kernel CTAs per SM {} is not 1 to 32",
                self.ctas_per_sm
            ));
        }
        if !self.threads.is_multiple_of(32) || !(32..=1024).contains(&self.threads) {
            return Err(format!(
                "copy kernel threads {} is not a multiple of 32 from 32 to 1024",
                self.threads
            ));
        }
        if !(1..=8).contains(&self.unroll) {
            return Err(format!("copy kernel unroll {} is not 1 to 8", self.unroll));
        }
        Ok(())
    }

    /// The shapes `gpu_bench --sweep` measures, with a short name each: the measured
    /// baseline first (run 2's shape, whatever the default is now), then mostly one change at
    /// a time (docs/perf/gpu.md says why each). Every `u8` shape uses plain loads, so its eight
    /// loads really are in flight.
    pub fn sweep() -> Vec<(&'static str, KernelShape)> {
        let d = BASE;
        let b = KernelShape {
            schedule: KernelSchedule::Balanced,
            ..d
        };
        let u8 = |s: KernelShape| KernelShape {
            unroll: 8,
            nc_loads: false,
            ..s
        };
        let big = |chunk_kib: u64, ctas_per_sm: u32, threads: u32| KernelShape {
            chunk: chunk_kib << 10,
            ctas_per_sm,
            threads,
            ..b
        };
        let per_chunk = KernelShape {
            schedule: KernelSchedule::PerChunk,
            ..d
        };
        vec![
            ("base", d),
            ("balanced", b),
            (
                "balanced-wb",
                KernelShape {
                    streaming_stores: false,
                    ..b
                },
            ),
            (
                "balanced-plain",
                KernelShape {
                    nc_loads: false,
                    ..b
                },
            ),
            ("balanced-u8", u8(b)),
            ("per-chunk", per_chunk),
            (
                "per-chunk-64k-u8",
                u8(KernelShape {
                    chunk: 64 << 10,
                    ..per_chunk
                }),
            ),
            ("bal-256k-4x512", big(256, 4, 512)),
            ("bal-256k-4x512-u8", u8(big(256, 4, 512))),
            ("bal-512k-2x1024", big(512, 2, 1024)),
            ("bal-512k-2x1024-u8", u8(big(512, 2, 1024))),
            ("bal-1m-2x512-u8", u8(big(1024, 2, 512))),
        ]
    }
}

const TEMPLATE: &str = r#"//
// nixl-rs scatter-gather copy: @TITLE@
// shape: @SHAPE@
//
.version 7.0
.target sm_70
.address_size 64

.visible .entry @NAME@(
	.param .u64 nixl_descs,
	.param .u64 nixl_count@PARAMS@
)
.maxntid @THREADS@, 1, 1
{
	.reg .pred 	%p<8>;
	.reg .b16 	%h<2>;
	.reg .b32 	%r<5>;
	.reg .b32 	%v<@VREGS@>;
	.reg .b64 	%rd<36>;
@EXTRA_REGS@	.reg .b64 	%la<@UNROLL@>;
	.reg .b64 	%sa<@UNROLL@>;

	ld.param.u64 	%rd1, [nixl_descs];
	ld.param.u64 	%rd2, [nixl_count];
	cvta.to.global.u64 	%rd1, %rd1;
@PROLOGUE@	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %nctaid.x;
	mov.u32 	%r3, %tid.x;
	mov.u32 	%r4, %ntid.x;
	cvt.u64.u32 	%rd3, %r1;
	cvt.u64.u32 	%rd4, %r2;
	cvt.u64.u32 	%rd5, %r3;
	cvt.u64.u32 	%rd6, %r4;
	// rd7 = tid*16; rd8 = ntid*16 (a round's stride between one thread's vectors);
	// rd9 = a round's bytes; rd10 = the offset of a round's last vector.
	shl.b64 	%rd7, %rd5, 4;
	shl.b64 	%rd8, %rd6, 4;
	mul.lo.u64 	%rd9, %rd8, @UNROLL@;
	mul.lo.u64 	%rd10, %rd8, @UNROLL_1@;

$L_item:
	// rd3 = descriptor index (ctaid, then += nctaid); stop at count.
	setp.ge.u64 	%p1, %rd3, %rd2;
	@%p1 bra 	$L_done;
@FETCH@	// rd12 = src, rd13 = dst, rd14 = len. Same alignment modulo 16, or bytes only.
	xor.b64 	%rd15, %rd12, %rd13;
	and.b64 	%rd15, %rd15, 15;
	setp.ne.u64 	%p2, %rd15, 0;
	@%p2 bra 	$L_bytes;

	// head = min((-src) & 15, len): thread t < head copies byte t.
	neg.s64 	%rd16, %rd12;
	and.b64 	%rd16, %rd16, 15;
	min.u64 	%rd16, %rd16, %rd14;
	setp.ge.u64 	%p3, %rd5, %rd16;
	@%p3 bra 	$L_body;
	add.u64 	%rd17, %rd12, %rd5;
	add.u64 	%rd18, %rd13, %rd5;
	ld.global.u8 	%h1, [%rd17];
	st.global.u8 	[%rd18], %h1;

$L_body:
	// rest = len - head; body = rest & ~15 from src+head / dst+head (both 16-byte aligned).
	sub.u64 	%rd19, %rd14, %rd16;
	and.b64 	%rd20, %rd19, -16;
	add.u64 	%rd21, %rd12, %rd16;
	add.u64 	%rd22, %rd13, %rd16;
	// rd23 = this thread's offset: tid*16, then += a round's bytes per round.
	mov.u64 	%rd23, %rd7;

$L_round:
	// A whole round fits when its last vector does.
	add.u64 	%rd24, %rd23, %rd10;
	setp.ge.u64 	%p4, %rd24, %rd20;
	@%p4 bra 	$L_vec1;
@ROUND@	add.u64 	%rd23, %rd23, %rd9;
	bra 	$L_round;

$L_vec1:
	// The remaining vectors of this thread, one at a time.
	setp.ge.u64 	%p5, %rd23, %rd20;
	@%p5 bra 	$L_tail;
	add.u64 	%la0, %rd21, %rd23;
	add.u64 	%sa0, %rd22, %rd23;
	@LOAD@ 	{%v0, %v1, %v2, %v3}, [%la0];
	@STORE@ 	[%sa0], {%v0, %v1, %v2, %v3};
	add.u64 	%rd23, %rd23, %rd8;
	bra 	$L_vec1;

$L_tail:
	// tail = rest - body (< 16): thread t < tail copies byte body + t.
	sub.u64 	%rd33, %rd19, %rd20;
	setp.ge.u64 	%p6, %rd5, %rd33;
	@%p6 bra 	$L_next;
	add.u64 	%rd34, %rd21, %rd20;
	add.u64 	%rd34, %rd34, %rd5;
	add.u64 	%rd35, %rd22, %rd20;
	add.u64 	%rd35, %rd35, %rd5;
	ld.global.u8 	%h1, [%rd34];
	st.global.u8 	[%rd35], %h1;
	bra 	$L_next;

$L_bytes:
	// Different alignments: byte t, t+ntid, ...
	mov.u64 	%rd23, %rd5;
$L_byte:
	setp.ge.u64 	%p7, %rd23, %rd14;
	@%p7 bra 	$L_next;
	add.u64 	%rd34, %rd12, %rd23;
	add.u64 	%rd35, %rd13, %rd23;
	ld.global.u8 	%h1, [%rd34];
	st.global.u8 	[%rd35], %h1;
	add.u64 	%rd23, %rd23, %rd6;
	bra 	$L_byte;

$L_next:
	add.u64 	%rd3, %rd3, %rd4;
	bra 	$L_item;

$L_done:
	ret;
}
"#;

/// What differs between the two kernels of a shape.
struct Parts {
    title: &'static str,
    name: &'static str,
    /// Parameters after the two every kernel has.
    params: &'static str,
    extra_regs: &'static str,
    prologue: &'static str,
    fetch: &'static str,
}

/// The segment kernel: item `rd3` is descriptor `rd3` of the array.
const SEGMENTS: Parts = Parts {
    title: "nixl_copy_segments(descs: *(src u64, dst u64, len u64), count u64)",
    name: "nixl_copy_segments",
    params: "",
    extra_regs: "",
    prologue: "",
    fetch: "\tmad.lo.u64 \t%rd11, %rd3, 24, %rd1;
\tld.global.nc.u64 \t%rd12, [%rd11];
\tld.global.nc.u64 \t%rd13, [%rd11+8];
\tld.global.nc.u64 \t%rd14, [%rd11+16];
",
};

/// The block kernel: item `rd3` is generated from a block table, piece `i % npieces` of
/// layer `i / npieces`, from `src base + src id * src stride + offset` to
/// `dst base + dst id * dst stride + offset`. Its parameters: the layers (`nixl_descs`, 32
/// bytes each: src base, src stride, dst base, dst stride), the items (`nixl_count`), the
/// pieces (`nixl_pieces`, 32 bytes each: src id, dst id, offset, len) and the pieces per
/// layer (`nixl_npieces`), so an item's two loads do not wait on a header.
const BLOCKS: Parts = Parts {
    title: "nixl_copy_blocks(layers: *(src, src stride, dst, dst stride), count u64, pieces: *(src id, dst id, offset, len), npieces u64)",
    name: "nixl_copy_blocks",
    params: ",
	.param .u64 nixl_pieces,
	.param .u64 nixl_npieces",
    extra_regs: "\t.reg .b64 \t%rb<10>;\n\t.reg .b32 \t%rq<3>;\n",
    prologue: "\tld.param.u64 \t%rb1, [nixl_pieces];
\tld.param.u64 \t%rb2, [nixl_npieces];
\tcvta.to.global.u64 \t%rb1, %rb1;
",
    fetch: "\t// layer rb3 = item / npieces, piece rb4 = item % npieces (32-bit: the host admits only
\t// tables of fewer than 2^32 items).
\tcvt.u32.u64 \t%rq0, %rd3;
\tcvt.u32.u64 \t%rq1, %rb2;
\tdiv.u32 \t%rq2, %rq0, %rq1;
\tcvt.u64.u32 \t%rb3, %rq2;
\tmul.lo.u64 \t%rb4, %rb3, %rb2;
\tsub.u64 \t%rb4, %rd3, %rb4;
\tshl.b64 \t%rb5, %rb3, 5;
\tadd.u64 \t%rb5, %rb5, %rd1;
\tshl.b64 \t%rb6, %rb4, 5;
\tadd.u64 \t%rb6, %rb6, %rb1;
\tld.global.nc.u64 \t%rd12, [%rb5];
\tld.global.nc.u64 \t%rb7, [%rb5+8];
\tld.global.nc.u64 \t%rd13, [%rb5+16];
\tld.global.nc.u64 \t%rb8, [%rb5+24];
\tld.global.nc.u64 \t%rb9, [%rb6];
\tmad.lo.u64 \t%rd12, %rb9, %rb7, %rd12;
\tld.global.nc.u64 \t%rb9, [%rb6+8];
\tmad.lo.u64 \t%rd13, %rb9, %rb8, %rd13;
\tld.global.nc.u64 \t%rb9, [%rb6+16];
\tadd.u64 \t%rd12, %rd12, %rb9;
\tadd.u64 \t%rd13, %rd13, %rb9;
\tld.global.nc.u64 \t%rd14, [%rb6+24];
",
};

/// Bytes per layer `(src base, src stride, dst base, dst stride)` and per piece
/// `(src id, dst id, offset, len)` in a block table (`u64` little-endian each).
pub(crate) const BLOCK_ENTRY_BYTES: usize = 32;

/// Where the parts of a block kernel's table lie, and how many items it makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockLayout {
    /// The table's bytes (layers, then pieces).
    pub bytes: usize,
    /// The kernel's items: layers x pieces.
    pub items: u64,
    /// Pieces per layer.
    pub npieces: u64,
    /// Byte offset of the pieces.
    pub pieces_at: usize,
}

/// The segment kernel's PTX for `shape`, NUL-terminated for `cuModuleLoadDataEx`. The thread
/// count only bounds the launch (`.maxntid`): the code reads `%ntid.x`.
pub(crate) fn ptx(shape: &KernelShape) -> String {
    ptx_of(shape, &SEGMENTS)
}

/// The block kernel's PTX for `shape`: the same copy code, each item's `(src, dst, len)`
/// generated from a block table instead of read from a descriptor.
pub(crate) fn ptx_blocks(shape: &KernelShape) -> String {
    ptx_of(shape, &BLOCKS)
}

fn ptx_of(shape: &KernelShape, parts: &Parts) -> String {
    let u = shape.unroll.max(1);
    let load = if shape.nc_loads {
        "ld.global.nc.v4.u32"
    } else {
        "ld.global.v4.u32"
    };
    let store = if shape.streaming_stores {
        "st.global.cs.v4.u32"
    } else {
        "st.global.v4.u32"
    };
    let v = |k: u32| {
        format!(
            "{{%v{}, %v{}, %v{}, %v{}}}",
            4 * k,
            4 * k + 1,
            4 * k + 2,
            4 * k + 3
        )
    };
    // One round: `u` vectors at tid*16 + k*ntid*16 from the round's start, all loaded, then
    // all stored.
    let mut round = String::new();
    for k in 0..u {
        round += &if k == 0 {
            "\tadd.u64 \t%la0, %rd21, %rd23;\n".to_owned()
        } else {
            format!("\tadd.u64 \t%la{k}, %la{}, %rd8;\n", k - 1)
        };
    }
    for k in 0..u {
        round += &format!("\t{load} \t{}, [%la{k}];\n", v(k));
    }
    for k in 0..u {
        round += &if k == 0 {
            "\tadd.u64 \t%sa0, %rd22, %rd23;\n".to_owned()
        } else {
            format!("\tadd.u64 \t%sa{k}, %sa{}, %rd8;\n", k - 1)
        };
    }
    for k in 0..u {
        round += &format!("\t{store} \t[%sa{k}], {};\n", v(k));
    }
    let mut s = TEMPLATE
        .replace("@TITLE@", parts.title)
        .replace("@NAME@", parts.name)
        .replace("@PARAMS@", parts.params)
        .replace("@EXTRA_REGS@", parts.extra_regs)
        .replace("@PROLOGUE@", parts.prologue)
        .replace("@FETCH@", parts.fetch)
        .replace("@SHAPE@", &shape.to_string())
        .replace("@THREADS@", &shape.threads.to_string())
        .replace("@VREGS@", &(4 * u).to_string())
        .replace("@UNROLL_1@", &(u - 1).to_string())
        .replace("@UNROLL@", &u.to_string())
        .replace("@ROUND@", &round)
        .replace("@LOAD@", load)
        .replace("@STORE@", store);
    s.push('\0');
    s
}

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
const GRID_CELLS_PER_COPY: u64 = 64;
const GRID_MIN_CELLS: u64 = 1 << 16;

/// Whether the non-empty copies are provably independent in linear time (plus a sort of the
/// groups' spans): with `L` the shortest copy, every length is a multiple of `L`; in each
/// destination group every destination lies at a multiple of `L` from the group's lowest, so
/// a copy covers whole cells of length `L` on one grid, and no cell is covered twice; and no
/// group's destination span `[lowest start, highest end)` meets another destination span or
/// any source span (so no destination overlaps another group's destination or any source,
/// its own included). `false` means "not proven" (the sort decides), never "dependent".
fn on_grids(copies: &[(u64, u64, u64)], groups: Option<&[(u32, u32)]>) -> bool {
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
    let mut base = Vec::with_capacity(dspan.len());
    let mut cells = 0u64;
    let most = GRID_MIN_CELLS.max((copies.len() as u64).saturating_mul(GRID_CELLS_PER_COPY));
    for &(lo, end) in &dspan {
        base.push(cells);
        if lo < end {
            cells = cells.saturating_add((end - lo).div_ceil(cell));
        }
        if cells > most {
            return false;
        }
    }
    let mut seen = vec![0u64; cells.div_ceil(64) as usize];
    for (i, &(d, _, l)) in copies.iter().enumerate() {
        if l == 0 {
            continue;
        }
        let g = group(i).0;
        let off = d - dspan[g].0;
        if !off.is_multiple_of(cell) {
            return false;
        }
        let first = base[g] + off / cell;
        for c in first..first + l / cell {
            let (w, bit) = ((c / 64) as usize, 1u64 << (c % 64));
            if seen[w] & bit != 0 {
                return false;
            }
            seen[w] |= bit;
        }
    }
    true
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
fn balanced(segments: &[Segment], chunk: u64, grid: u64) -> Option<Vec<Segment>> {
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

/// The loaded module (unloaded on drop) and its kernel, for one context.
pub(crate) struct CopyKernel {
    module: KernelModule,
    /// The block kernel (same shape), where it loaded.
    blocks: Option<KernelModule>,
    shape: KernelShape,
    /// CTAs of the shape resident on the whole GPU at once.
    resident: u32,
}

impl CopyKernel {
    /// JIT-compiles the PTX of `shape` (already validated) for GPU `ordinal` in `ctx`. The
    /// error says why, with the JIT log.
    pub fn load(ctx: Arc<CudaContext>, ordinal: usize, shape: KernelShape) -> Result<Self, String> {
        shape.validate()?;
        bind(&ctx).map_err(|e| e.to_string())?;
        let text = ptx(&shape);
        let text = CStr::from_bytes_with_nul(text.as_bytes())
            .map_err(|_| "the PTX is not one NUL-terminated string".to_owned())?;
        let module = KernelModule::load(ctx.clone(), text, NAME).map_err(|(e, log)| {
            if e.call == "cuModuleLoadDataEx" {
                format!("{e}: {log}")
            } else {
                e.to_string()
            }
        })?;
        let resident = occupancy(&module, ordinal, &shape).map_err(|e| e.to_string())?;
        // The block kernel is optional: without it block tables are written out as
        // descriptors for the segment kernel.
        let blocks_text = ptx_blocks(&shape);
        let blocks = CStr::from_bytes_with_nul(blocks_text.as_bytes())
            .map_err(|_| "the PTX is not one NUL-terminated string".to_owned())
            .and_then(|t| {
                KernelModule::load(ctx, t, BLOCKS_NAME).map_err(|(e, log)| format!("{e}: {log}"))
            })
            .inspect_err(|e| tracing::warn!(error = %e, "the block-table copy kernel did not load; block tables use the segment kernel"))
            .ok();
        Ok(CopyKernel {
            module,
            blocks,
            shape,
            resident,
        })
    }

    /// The shape it was compiled for.
    pub fn shape(&self) -> &KernelShape {
        &self.shape
    }

    /// The grid for `count` descriptors cut one by one (see [`grid`]).
    pub fn grid(&self, count: u64) -> u32 {
        grid(&self.shape, count, self.resident)
    }

    /// The descriptors and grid for `segments` (see [`plan`]).
    pub fn plan(&self, segments: &[Segment]) -> (Vec<Segment>, u32) {
        plan(segments, &self.shape, self.resident)
    }

    /// Whether the block kernel loaded.
    pub fn has_blocks(&self) -> bool {
        self.blocks.is_some()
    }

    /// Enqueues the block kernel over the block table at device address `table` laid out as
    /// `layout` on `stream`, `grid` CTAs of the shape's threads.
    ///
    /// Crate invariant (see `crate::sys`): `table` holds the table (stream-ordered before this
    /// launch), whose generated copies are device memory this context can reach, live until
    /// the launch completes, no two in [`conflict`].
    pub fn launch_blocks(
        &self,
        table: u64,
        layout: &BlockLayout,
        grid: u32,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        let Some(m) = &self.blocks else {
            return Err(CudaError {
                call: "cuLaunchKernel",
                code: sys::CUresult::CUDA_ERROR_NOT_FOUND as u32,
                name: "the block-table copy kernel is not loaded".to_owned(),
            });
        };
        if layout.items == 0 {
            return Ok(());
        }
        let args = [
            table,
            layout.items,
            table + layout.pieces_at as u64,
            layout.npieces,
        ];
        m.launch4(grid.max(1), self.shape.threads, stream, args)
    }

    /// Enqueues the kernel over `count` descriptors at device address `descs` on `stream`,
    /// `grid` CTAs of the shape's threads.
    ///
    /// Crate invariant (see `crate::sys`): `descs` holds `count` descriptors (stream-ordered
    /// before this launch) whose ranges are device memory this context can reach, live until
    /// the launch completes, with no destination overlapping another descriptor's source or
    /// destination (see [`conflict`]).
    pub fn launch(
        &self,
        descs: u64,
        count: u64,
        grid: u32,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        if count == 0 {
            return Ok(());
        }
        self.module
            .launch2(grid.max(1), self.shape.threads, stream, descs, count)
    }
}

fn occupancy(module: &KernelModule, ordinal: usize, shape: &KernelShape) -> Result<u32, CudaError> {
    let per_sm = module.blocks_per_sm(shape.threads)?;
    let sms = device_attribute(
        ordinal,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    )?;
    let per_sm = per_sm.clamp(1, shape.ctas_per_sm as i32);
    Ok(u32::try_from(sms.max(1) * per_sm).unwrap_or(1))
}

#[cfg(test)]
mod tests {
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
        let area =
            (v.iter().map(|c| c.0.max(c.1) + c.2).max().unwrap_or(0) + 64).next_multiple_of(64);
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
}
