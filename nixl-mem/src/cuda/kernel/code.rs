//! The kernels' PTX, generated from a shape.

#[allow(unused_imports)]
use super::*;

pub(super) const TEMPLATE: &str = r#"//
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
@ARRIVE@	add.u64 	%rd3, %rd3, %rd4;
	bra 	$L_item;

$L_done:
	ret;
}
"#;

/// What differs between the two kernels of a shape.
pub(super) struct Parts {
    title: &'static str,
    name: &'static str,
    /// Parameters after the two every kernel has.
    params: &'static str,
    extra_regs: &'static str,
    prologue: &'static str,
    fetch: &'static str,
}

/// The segment kernel: item `rd3` is descriptor `rd3` of the array.
pub(super) const SEGMENTS: Parts = Parts {
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
pub(super) const BLOCKS: Parts = Parts {
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

/// Fences an item's stores and counts the item on its layer's counter (`%ra0` the counters,
/// `@LAYER@` the layer): every thread's stores are made visible GPU-wide, the CTA meets, and
/// thread 0 adds one. A consumer that sees a layer's counter reach its items sees its bytes.
const ARRIVE: &str = "\t// Arrival: fence this thread's stores, meet, and thread 0 counts the item.
\tmembar.gl;
\tbar.sync \t0;
\tsetp.ne.u64 \t%pa, @TID@, 0;
\t@%pa bra \t$L_arrived;
\tshl.b64 \t%ra1, @LAYER@, 3;
\tadd.u64 \t%ra1, %ra1, %ra0;
\tatom.global.add.u64 \t%ra2, [%ra1], 1;
$L_arrived:
";

/// The arrival variant's extra parameter, registers and prologue.
const ARRIVE_PARAM: &str = ",
\t.param .u64 nixl_counters";
const ARRIVE_REGS: &str = "\t.reg .pred \t%pa;\n\t.reg .b64 \t%ra<4>;\n";
const ARRIVE_PROLOGUE: &str = "\tld.param.u64 \t%ra0, [nixl_counters];
\tcvta.to.global.u64 \t%ra0, %ra0;
";

/// The block kernel's PTX for `shape` with per-layer arrival counters: after each item, its
/// layer's `u64` counter (at `nixl_counters + 8 * layer`) is incremented once the item's
/// bytes are visible; each post adds the pieces per layer to every layer's counter.
pub(crate) fn ptx_blocks_arrival(shape: &KernelShape) -> String {
    ptx_with(shape, &BLOCKS, Some("%rb3"))
}

/// The segment kernel's PTX with one arrival counter for the request (at `nixl_counters`),
/// incremented once per descriptor after its bytes are visible; each post adds the
/// descriptor count.
pub(crate) fn ptx_segments_arrival(shape: &KernelShape) -> String {
    ptx_with(shape, &SEGMENTS, Some(ONE_COUNTER))
}

/// The register the segment kernel's arrival names as its "layer": always 0.
const ONE_COUNTER: &str = "%ra3";

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

pub(super) fn ptx_of(shape: &KernelShape, parts: &Parts) -> String {
    ptx_with(shape, parts, None)
}

/// The 16-byte load and store the shape asks for (non-coherent loads, streaming stores).
fn vector_ops(shape: &KernelShape) -> (&'static str, &'static str) {
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
    (load, store)
}

/// The four registers of vector `k` of a round.
fn v(k: u32) -> String {
    let r = 4 * k;
    format!("{{%v{r}, %v{}, %v{}, %v{}}}", r + 1, r + 2, r + 3)
}

/// [`ptx_of`], with arrival counters where `layer` names the register holding an item's
/// layer (the kernel is then `<name>_arrival`, with a fifth parameter `nixl_counters`).
fn ptx_with(shape: &KernelShape, parts: &Parts, layer: Option<&str>) -> String {
    let u = shape.unroll.max(1);
    let (load, store) = vector_ops(shape);
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
    let (name, params, regs, prologue, arrive) = match layer {
        None => (
            parts.name.to_owned(),
            parts.params.to_owned(),
            parts.extra_regs.to_owned(),
            parts.prologue.to_owned(),
            String::new(),
        ),
        Some(l) => (
            format!("{}_arrival", parts.name),
            format!("{}{ARRIVE_PARAM}", parts.params),
            format!("{}{ARRIVE_REGS}", parts.extra_regs),
            format!(
                "{}{ARRIVE_PROLOGUE}{}",
                parts.prologue,
                if l == ONE_COUNTER {
                    "\tmov.u64 \t%ra3, 0;\n"
                } else {
                    ""
                }
            ),
            ARRIVE.replace("@TID@", "%rd5").replace("@LAYER@", l),
        ),
    };
    let mut s = TEMPLATE
        .replace("@TITLE@", parts.title)
        .replace("@NAME@", &name)
        .replace("@PARAMS@", &params)
        .replace("@EXTRA_REGS@", &regs)
        .replace("@PROLOGUE@", &prologue)
        .replace("@FETCH@", parts.fetch)
        .replace("@ARRIVE@", &arrive)
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

/// The tile kernel: a block table's tiles copied with their rows rearranged (an HND <-> NHD
/// permute, heads gathered into or sliced out of a block) in one pass. Item `i` is tile
/// `i % ntiles` of layer `i / ntiles`; a CTA copies one item at a time (grid-striding), its
/// threads striding over the item's 16-byte vectors: vector `v` is vector `v % VR` of row
/// `v / VR`, row `(a, b)` = `(row / B, row % B)` at `a * outer + b * inner` from the tile's
/// start on each side. Parameters: the table (`nixl_descs`: a 64-byte header `A, B, VR, src
/// outer, src inner, dst outer, dst inner, vectors per tile`, then per layer 32 bytes `src
/// base, src stride, dst base, dst stride`), the items (`nixl_count`), the tiles
/// (`nixl_pieces`, 32 bytes each: `src id, dst id, src offset, dst offset`) and the tiles per
/// layer (`nixl_npieces`). Every address and stride is a multiple of 16 (the host checks);
/// 32-bit division (the host admits fewer than 2^32 items and vectors per tile).
pub(super) const TILES_TEMPLATE: &str = r#"//
// nixl-rs tile copy: nixl_copy_tiles(table: *(header, layers), count u64, tiles: *(src id, dst id, src off, dst off), ntiles u64)
// shape: @SHAPE@
//
.version 7.0
.target sm_70
.address_size 64

.visible .entry @NAME@(
	.param .u64 nixl_descs,
	.param .u64 nixl_count,
	.param .u64 nixl_pieces,
	.param .u64 nixl_npieces@ARRIVE_PARAM@
)
.maxntid @THREADS@, 1, 1
{
@ARRIVE_REGS@	.reg .pred 	%p<4>;
	.reg .b32 	%q<4>;
	.reg .b32 	%v<@VREGS@>;
	.reg .b64 	%rd<33>;
	.reg .b64 	%la<@UNROLL@>;
	.reg .b64 	%sa<@UNROLL@>;

	ld.param.u64 	%rd1, [nixl_descs];
	ld.param.u64 	%rd2, [nixl_count];
	ld.param.u64 	%rd3, [nixl_pieces];
	ld.param.u64 	%rd4, [nixl_npieces];
	cvta.to.global.u64 	%rd1, %rd1;
	cvta.to.global.u64 	%rd3, %rd3;
@ARRIVE_PROLOGUE@	// The header: rd6 = B, rd7 = VR, rd8/rd9 = src outer/inner, rd10/rd11 = dst
	// outer/inner, rd12 = vectors per tile.
	ld.global.nc.u64 	%rd6, [%rd1+8];
	ld.global.nc.u64 	%rd7, [%rd1+16];
	ld.global.nc.u64 	%rd8, [%rd1+24];
	ld.global.nc.u64 	%rd9, [%rd1+32];
	ld.global.nc.u64 	%rd10, [%rd1+40];
	ld.global.nc.u64 	%rd11, [%rd1+48];
	ld.global.nc.u64 	%rd12, [%rd1+56];
	mov.u32 	%q0, %ctaid.x;
	cvt.u64.u32 	%rd13, %q0;
	mov.u32 	%q0, %nctaid.x;
	cvt.u64.u32 	%rd14, %q0;
	mov.u32 	%q0, %tid.x;
	cvt.u64.u32 	%rd15, %q0;
	mov.u32 	%q0, %ntid.x;
	cvt.u64.u32 	%rd16, %q0;
	// rd17 = the offset of a round's last vector; rd18 = a round's vectors.
	mul.lo.u64 	%rd17, %rd16, @UNROLL_1@;
	mul.lo.u64 	%rd18, %rd16, @UNROLL@;
	// 32-bit divisors: q1 = tiles per layer, q2 = VR, q3 = B.
	cvt.u32.u64 	%q1, %rd4;
	cvt.u32.u64 	%q2, %rd7;
	cvt.u32.u64 	%q3, %rd6;

$L_item:
	setp.ge.u64 	%p1, %rd13, %rd2;
	@%p1 bra 	$L_done;
	// layer rd19 = item / ntiles, tile rd20 = item % ntiles.
	cvt.u32.u64 	%q0, %rd13;
	div.u32 	%q0, %q0, %q1;
	cvt.u64.u32 	%rd19, %q0;
@KEEP_LAYER@	mul.lo.u64 	%rd20, %rd19, %rd4;
	sub.u64 	%rd20, %rd13, %rd20;
	shl.b64 	%rd19, %rd19, 5;
	add.u64 	%rd19, %rd19, %rd1;
	shl.b64 	%rd20, %rd20, 5;
	add.u64 	%rd20, %rd20, %rd3;
	// rd21 = the source tile: src base + src id * src stride + src offset; rd23 the
	// destination's.
	ld.global.nc.u64 	%rd21, [%rd19+64];
	ld.global.nc.u64 	%rd22, [%rd19+72];
	ld.global.nc.u64 	%rd23, [%rd19+80];
	ld.global.nc.u64 	%rd24, [%rd19+88];
	ld.global.nc.u64 	%rd25, [%rd20];
	mad.lo.u64 	%rd21, %rd25, %rd22, %rd21;
	ld.global.nc.u64 	%rd25, [%rd20+8];
	mad.lo.u64 	%rd23, %rd25, %rd24, %rd23;
	ld.global.nc.u64 	%rd25, [%rd20+16];
	add.u64 	%rd21, %rd21, %rd25;
	ld.global.nc.u64 	%rd25, [%rd20+24];
	add.u64 	%rd23, %rd23, %rd25;
	// rd26 = this thread's vector: tid, then += a round's vectors.
	mov.u64 	%rd26, %rd15;

$L_round:
	add.u64 	%rd27, %rd26, %rd17;
	setp.ge.u64 	%p2, %rd27, %rd12;
	@%p2 bra 	$L_one;
@ROUND@	add.u64 	%rd26, %rd26, %rd18;
	bra 	$L_round;

$L_one:
	setp.ge.u64 	%p3, %rd26, %rd12;
	@%p3 bra 	$L_next;
	mov.u64 	%rd27, %rd26;
@ADDR0@	@LOAD@ 	{%v0, %v1, %v2, %v3}, [%la0];
	@STORE@ 	[%sa0], {%v0, %v1, %v2, %v3};
	add.u64 	%rd26, %rd26, %rd16;
	bra 	$L_one;

$L_next:
@ARRIVE@	add.u64 	%rd13, %rd13, %rd14;
	bra 	$L_item;

$L_done:
	ret;
}
"#;

/// The addresses of vector `%rd27` of the current tile into `%la{k}` (source) and `%sa{k}`
/// (destination).
fn tile_addr(k: u32) -> String {
    format!(
        "\t// vector rd27: row rd28 = v / VR, rd29 = (v % VR) * 16, a rd30 = row / B, b rd31 = row % B.
\tcvt.u32.u64 \t%q0, %rd27;
\tdiv.u32 \t%q0, %q0, %q2;
\tcvt.u64.u32 \t%rd28, %q0;
\tmul.lo.u64 \t%rd29, %rd28, %rd7;
\tsub.u64 \t%rd29, %rd27, %rd29;
\tshl.b64 \t%rd29, %rd29, 4;
\tdiv.u32 \t%q0, %q0, %q3;
\tcvt.u64.u32 \t%rd30, %q0;
\tmul.lo.u64 \t%rd31, %rd30, %rd6;
\tsub.u64 \t%rd31, %rd28, %rd31;
\tmad.lo.u64 \t%la{k}, %rd30, %rd8, %rd21;
\tmad.lo.u64 \t%la{k}, %rd31, %rd9, %la{k};
\tadd.u64 \t%la{k}, %la{k}, %rd29;
\tmad.lo.u64 \t%sa{k}, %rd30, %rd10, %rd23;
\tmad.lo.u64 \t%sa{k}, %rd31, %rd11, %sa{k};
\tadd.u64 \t%sa{k}, %sa{k}, %rd29;
"
    )
}

/// Loads in flight per thread in the tile kernel (a tile's rows are short: a few hundred
/// bytes, so a round of four covers a 16 KiB tile with 256 threads).
pub(super) const TILE_UNROLL: u32 = 4;

/// The tile kernel's PTX for `shape` (its threads, load and store hints; the chunk and
/// schedule do not apply: a CTA copies whole tiles), NUL-terminated.
pub(crate) fn ptx_tiles(shape: &KernelShape) -> String {
    tiles_of(shape, false)
}

/// The tile kernel's PTX with per-layer arrival counters (as [`ptx_blocks_arrival`]: each post
/// adds the tiles per layer to every layer's counter).
pub(crate) fn ptx_tiles_arrival(shape: &KernelShape) -> String {
    tiles_of(shape, true)
}

fn tiles_of(shape: &KernelShape, arrival: bool) -> String {
    let u = TILE_UNROLL;
    let (load, store) = vector_ops(shape);
    let mut round = String::new();
    for k in 0..u {
        round += &format!("\tmad.lo.u64 \t%rd27, %rd16, {k}, %rd26;\n");
        round += &tile_addr(k);
    }
    for k in 0..u {
        round += &format!("\t{load} \t{}, [%la{k}];\n", v(k));
    }
    for k in 0..u {
        round += &format!("\t{store} \t[%sa{k}], {};\n", v(k));
    }
    let pick = |on: &str| {
        if arrival {
            on.to_owned()
        } else {
            String::new()
        }
    };
    let mut s = TILES_TEMPLATE
        .replace(
            "@NAME@",
            if arrival {
                "nixl_copy_tiles_arrival"
            } else {
                "nixl_copy_tiles"
            },
        )
        .replace("@ARRIVE_PARAM@", &pick(ARRIVE_PARAM))
        .replace("@ARRIVE_REGS@", &pick(ARRIVE_REGS))
        .replace("@ARRIVE_PROLOGUE@", &pick(ARRIVE_PROLOGUE))
        .replace("@KEEP_LAYER@", &pick("\tmov.u64 \t%ra3, %rd19;\n"))
        .replace(
            "@ARRIVE@",
            &pick(&ARRIVE.replace("@TID@", "%rd15").replace("@LAYER@", "%ra3")),
        )
        .replace("@SHAPE@", &shape.to_string())
        .replace("@THREADS@", &shape.threads.to_string())
        .replace("@VREGS@", &(4 * u).to_string())
        .replace("@UNROLL_1@", &(u - 1).to_string())
        .replace("@UNROLL@", &u.to_string())
        .replace("@ROUND@", &round)
        .replace("@ADDR0@", &tile_addr(0))
        .replace("@LOAD@", load)
        .replace("@STORE@", store);
    s.push('\0');
    s
}

/// Bytes of the tile kernel's table header.
pub(crate) const TILE_HEADER_BYTES: usize = 64;

/// A tile launch's table: the rows' shape (in source and destination terms), the layers and
/// the tiles, as the tile kernel reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TileTable {
    /// `(A, B, row bytes)`.
    pub rows: (u64, u64, u64),
    /// Source `(outer, inner)` strides.
    pub src: (u64, u64),
    /// Destination `(outer, inner)` strides.
    pub dst: (u64, u64),
    /// Per layer `(src base, src stride, dst base, dst stride)`.
    pub layers: Vec<[u64; 4]>,
    /// Per tile `(src id, dst id, src offset, dst offset)`.
    pub tiles: Vec<[u64; 4]>,
}

impl TileTable {
    /// The kernel's items: layers x tiles.
    pub(crate) fn items(&self) -> u64 {
        self.layers.len() as u64 * self.tiles.len() as u64
    }

    /// Byte offset of the tiles in the table.
    pub(crate) fn tiles_at(&self) -> usize {
        TILE_HEADER_BYTES + self.layers.len() * BLOCK_ENTRY_BYTES
    }

    /// The table's bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.tiles_at() + self.tiles.len() * BLOCK_ENTRY_BYTES
    }

    /// Why the kernel cannot copy this table, if it cannot: rows or any address, stride or
    /// offset not a multiple of 16 (the kernel moves 16-byte vectors), too many items or
    /// vectors per tile for its 32-bit indices, no rows.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        let (a, b, row) = self.rows;
        if a == 0 || b == 0 || row == 0 || self.tiles.is_empty() || self.layers.is_empty() {
            return Some("no rows");
        }
        let aligned = [row, self.src.0, self.src.1, self.dst.0, self.dst.1]
            .into_iter()
            .chain(self.layers.iter().flatten().copied())
            .chain(self.tiles.iter().flat_map(|t| [t[2], t[3]]))
            .all(|x| x % 16 == 0);
        if !aligned {
            return Some("tile rows, strides or offsets not multiples of 16 bytes");
        }
        let vectors = a.saturating_mul(b).saturating_mul(row / 16);
        if vectors > u64::from(u32::MAX) || self.items() > u64::from(u32::MAX) {
            return Some("more than 2^32 tiles or vectors per tile");
        }
        None
    }

    /// Writes the table into `out` (at least [`TileTable::bytes`] long); `false` where it does
    /// not fit.
    pub(crate) fn write(&self, out: &mut [u8]) -> bool {
        if out.len() < self.bytes() {
            return false;
        }
        let (a, b, row) = self.rows;
        let header = [
            a,
            b,
            row / 16,
            self.src.0,
            self.src.1,
            self.dst.0,
            self.dst.1,
            a * b * (row / 16),
        ];
        let words = header
            .iter()
            .chain(self.layers.iter().flatten())
            .chain(self.tiles.iter().flatten());
        for (w, slot) in words.zip(out.chunks_exact_mut(8)) {
            slot.copy_from_slice(&w.to_le_bytes());
        }
        true
    }
}
