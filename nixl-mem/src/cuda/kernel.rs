//! A scatter-gather copy kernel: one launch copies every segment of a request, where
//! `cuMemcpyBatchAsync` issues one copy per segment.
//!
//! The kernel is hand-written PTX ([`PTX`], ISA 7.0 for `sm_70`, so the driver JIT-compiles it
//! for the GPU at hand; no CUDA toolkit is needed to build). It takes a device array of
//! descriptors `(src u64, dst u64, len u64)` and their count. Each CTA grid-strides over the
//! descriptors; in a descriptor whose source and destination share their alignment modulo 16,
//! threads `0..15` copy the head bytes up to the first 16-byte boundary, all threads copy the
//! body with 16-byte vector loads and stores (four in flight per thread), and threads `0..15`
//! copy the tail; other descriptors are copied byte by byte (correct but slow: the backend
//! routes such requests to the copy engines instead).
//!
//! [`pack`] cuts the segments into descriptors of at most [`CHUNK`] bytes so the work spreads
//! evenly over the CTAs; cuts fall on multiples of 16 bytes from a segment's start, which keeps
//! each piece's relative alignment. The grid is the number of CTAs that fit on the GPU at once
//! (`cuOccupancyMaxActiveBlocksPerMultiprocessor` x SMs), so the grid-stride split is even.

use std::ffi::CStr;
use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::stream::Stream;
use super::{bind, check, sys, CudaError};

/// Threads per CTA (the PTX declares `.maxntid 256`). At least 16: threads `0..15` copy heads
/// and tails.
pub(crate) const THREADS: u32 = 256;
/// The largest descriptor [`pack`] makes.
pub(crate) const CHUNK: u64 = 128 << 10;
/// Bytes per descriptor in the device array.
pub(crate) const DESC_BYTES: usize = 24;
/// At most this many CTAs per SM, whatever the occupancy calculator allows.
const MAX_CTAS_PER_SM: i32 = 8;

const NAME: &CStr = c"nixl_copy_segments";

/// The kernel's PTX, NUL-terminated for `cuModuleLoadDataEx`.
pub(crate) const PTX: &str = concat!(
    r#"//
// nixl-rs scatter-gather copy: nixl_copy_segments(descs: *(src u64, dst u64, len u64), count u64)
//
.version 7.0
.target sm_70
.address_size 64

.visible .entry nixl_copy_segments(
	.param .u64 nixl_descs,
	.param .u64 nixl_count
)
.maxntid 256, 1, 1
{
	.reg .pred 	%p<8>;
	.reg .b16 	%h<2>;
	.reg .b32 	%r<24>;
	.reg .b64 	%rd<40>;

	ld.param.u64 	%rd1, [nixl_descs];
	ld.param.u64 	%rd2, [nixl_count];
	cvta.to.global.u64 	%rd1, %rd1;
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %nctaid.x;
	mov.u32 	%r3, %tid.x;
	mov.u32 	%r4, %ntid.x;
	cvt.u64.u32 	%rd3, %r1;
	cvt.u64.u32 	%rd4, %r2;
	cvt.u64.u32 	%rd5, %r3;
	cvt.u64.u32 	%rd6, %r4;
	shl.b64 	%rd7, %rd5, 4;
	shl.b64 	%rd8, %rd6, 4;
	shl.b64 	%rd9, %rd6, 6;
	mul.lo.u64 	%rd10, %rd8, 3;

$L_item:
	// rd3 = descriptor index (ctaid, then += nctaid); stop at count.
	setp.ge.u64 	%p1, %rd3, %rd2;
	@%p1 bra 	$L_done;
	mad.lo.u64 	%rd11, %rd3, 24, %rd1;
	ld.global.nc.u64 	%rd12, [%rd11];
	ld.global.nc.u64 	%rd13, [%rd11+8];
	ld.global.nc.u64 	%rd14, [%rd11+16];
	// rd12 = src, rd13 = dst, rd14 = len. Same alignment modulo 16, or bytes only.
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
	// rd23 = this thread's offset: tid*16, then += 4*ntid*16 per round of four vectors.
	mov.u64 	%rd23, %rd7;

$L_vec4:
	add.u64 	%rd24, %rd23, %rd10;
	setp.ge.u64 	%p4, %rd24, %rd20;
	@%p4 bra 	$L_vec1;
	add.u64 	%rd25, %rd21, %rd23;
	add.u64 	%rd26, %rd25, %rd8;
	add.u64 	%rd27, %rd26, %rd8;
	add.u64 	%rd28, %rd27, %rd8;
	ld.global.nc.v4.u32 	{%r5, %r6, %r7, %r8}, [%rd25];
	ld.global.nc.v4.u32 	{%r9, %r10, %r11, %r12}, [%rd26];
	ld.global.nc.v4.u32 	{%r13, %r14, %r15, %r16}, [%rd27];
	ld.global.nc.v4.u32 	{%r17, %r18, %r19, %r20}, [%rd28];
	add.u64 	%rd29, %rd22, %rd23;
	add.u64 	%rd30, %rd29, %rd8;
	add.u64 	%rd31, %rd30, %rd8;
	add.u64 	%rd32, %rd31, %rd8;
	st.global.cs.v4.u32 	[%rd29], {%r5, %r6, %r7, %r8};
	st.global.cs.v4.u32 	[%rd30], {%r9, %r10, %r11, %r12};
	st.global.cs.v4.u32 	[%rd31], {%r13, %r14, %r15, %r16};
	st.global.cs.v4.u32 	[%rd32], {%r17, %r18, %r19, %r20};
	add.u64 	%rd23, %rd23, %rd9;
	bra 	$L_vec4;

$L_vec1:
	// The remaining vectors of this thread, one at a time.
	setp.ge.u64 	%p5, %rd23, %rd20;
	@%p5 bra 	$L_tail;
	add.u64 	%rd25, %rd21, %rd23;
	add.u64 	%rd29, %rd22, %rd23;
	ld.global.nc.v4.u32 	{%r5, %r6, %r7, %r8}, [%rd25];
	st.global.cs.v4.u32 	[%rd29], {%r5, %r6, %r7, %r8};
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
"#,
    "\0"
);

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

/// The device array's bytes: `(src, dst, len)` little-endian per descriptor (every CUDA GPU is
/// little-endian, as is every host this crate builds for).
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
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    func: sys::CUfunction,
    /// CTAs resident on the whole GPU at once.
    ctas: u32,
}

// SAFETY: module and function handles are context-wide and may be used from any thread that has
// the context current; every method binds it first, and cuLaunchKernel is thread-safe.
unsafe impl Send for CopyKernel {}
// SAFETY: as above; the handles are never mutated after `load`.
unsafe impl Sync for CopyKernel {}

impl CopyKernel {
    /// JIT-compiles [`PTX`] for GPU `ordinal` in `ctx`. The error says why, with the JIT log.
    pub fn load(ctx: Arc<CudaContext>, ordinal: usize) -> Result<Self, String> {
        bind(&ctx).map_err(|e| e.to_string())?;
        let mut log = vec![0u8; 8192];
        let mut opts = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut vals: [*mut std::ffi::c_void; 2] = [log.as_mut_ptr().cast(), log.len() as _];
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: the context is current; PTX is NUL-terminated; the two options point at a
        // live buffer of the stated size (the size option is passed by value in the pointer,
        // as the driver API specifies); `module` is a valid out pointer.
        let r = unsafe {
            sys::cuModuleLoadDataEx(
                &mut module,
                PTX.as_ptr().cast(),
                opts.len() as u32,
                opts.as_mut_ptr(),
                vals.as_mut_ptr(),
            )
        };
        if let Err(e) = check("cuModuleLoadDataEx", r) {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let log = String::from_utf8_lossy(&log[..end]);
            return Err(format!("{e}: {}", log.trim()));
        }
        let unload = |module| {
            // SAFETY: loaded just above, unloaded once on this error path.
            let _ = unsafe { sys::cuModuleUnload(module) };
        };
        let mut func: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is live; NAME is NUL-terminated; `func` is a valid out pointer.
        let r = unsafe { sys::cuModuleGetFunction(&mut func, module, NAME.as_ptr()) };
        if let Err(e) = check("cuModuleGetFunction", r) {
            unload(module);
            return Err(e.to_string());
        }
        let ctas = match occupancy(func, ordinal) {
            Ok(c) => c,
            Err(e) => {
                unload(module);
                return Err(e.to_string());
            }
        };
        Ok(CopyKernel {
            ctx,
            module,
            func,
            ctas,
        })
    }

    /// The grid for `count` descriptors: every resident CTA, or fewer when there is less work.
    pub fn grid(&self, count: u64) -> u32 {
        u32::try_from(count)
            .unwrap_or(u32::MAX)
            .min(self.ctas)
            .max(1)
    }

    /// Enqueues the kernel over `count` descriptors at device address `descs` on `stream`.
    ///
    /// # Safety
    /// `descs` must hold `count` descriptors (stream-ordered before this launch) whose ranges
    /// are device memory this context can reach, live until the launch completes, with no
    /// destination overlapping another descriptor's source or destination.
    pub unsafe fn launch(&self, descs: u64, count: u64, stream: &Stream) -> Result<(), CudaError> {
        if count == 0 {
            return Ok(());
        }
        let (mut a, mut n) = (descs, count);
        let mut params: [*mut std::ffi::c_void; 2] =
            [(&mut a as *mut u64).cast(), (&mut n as *mut u64).cast()];
        // SAFETY: the function belongs to this context and the stream too; `params` points at
        // two live u64 values matching the kernel's two .u64 parameters (the driver copies them
        // before returning); the memory contract is the caller's (see above).
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                self.func,
                self.grid(count),
                1,
                1,
                THREADS,
                1,
                1,
                0,
                stream.raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

fn occupancy(func: sys::CUfunction, ordinal: usize) -> Result<u32, CudaError> {
    let mut per_sm = 0;
    // SAFETY: `func` is a live function of the current context; valid out pointer.
    check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, func, THREADS as i32, 0)
    })?;
    let mut dev: sys::CUdevice = 0;
    // SAFETY: valid out pointer; the driver validates the ordinal.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal as i32)
    })?;
    let mut sms = 0;
    // SAFETY: valid out pointer for a 4-byte attribute of a valid device.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(
            &mut sms,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            dev,
        )
    })?;
    let per_sm = per_sm.clamp(1, MAX_CTAS_PER_SM);
    Ok(u32::try_from(sms.max(1) * per_sm).unwrap_or(1))
}

impl Drop for CopyKernel {
    fn drop(&mut self) {
        if let Err(e) = bind(&self.ctx) {
            tracing::warn!(error = %e, "binding the context to unload the copy kernel failed");
        }
        // SAFETY: loaded in `load`, unloaded once; requests using the kernel hold an `Arc` of
        // it and wait for their streams before they drop it.
        if let Err(e) = check("cuModuleUnload", unsafe {
            sys::cuModuleUnload(self.module)
        }) {
            tracing::warn!(error = %e, "cuModuleUnload failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn alignment_classes() {
        assert!(co_aligned(0x10, 0x20));
        assert!(co_aligned(0x13, 0x23));
        assert!(!co_aligned(0x10, 0x28));
    }

    /// Executes the kernel's PTX text on the CPU over descriptors of every alignment class and
    /// many lengths; every destination byte must be the source's, and nothing else written.
    #[test]
    fn the_ptx_copies_every_byte_when_simulated() {
        use crate::cuda::ptx_sim::{run, Memory, Program};
        let prog = Program::parse(PTX);
        let base = 0x7f00_0000_0000u64;
        // (src offset, dst offset, len) into the source and destination areas.
        let cases: Vec<(u64, u64, u64)> = {
            let lens = [
                0u64, 1, 2, 15, 16, 17, 31, 33, 64, 65, 100, 4095, 4103, 20_001,
            ];
            let skews = [
                (0u64, 0u64),
                (3, 3),
                (13, 13),
                (15, 15),
                (1, 0),
                (0, 8),
                (5, 9),
                (16, 0),
            ];
            let (mut s, mut d) = (0u64, 0u64);
            let mut v = Vec::new();
            for &len in &lens {
                for &(ks, kd) in &skews {
                    v.push((s + ks, d + kd, len));
                    s = (s + ks + len + 64).next_multiple_of(64);
                    d = (d + kd + len + 64).next_multiple_of(64);
                }
            }
            v
        };
        // A multiple of 64, so equal skews are co-aligned.
        let area: u64 =
            (cases.iter().map(|c| c.0.max(c.1) + c.2).max().unwrap_or(0) + 64).next_multiple_of(64);
        let desc_area = 1 << 20;
        let (src0, dst0) = (base + desc_area, base + desc_area + area);
        let mut mem = Memory {
            base,
            bytes: vec![0u8; (desc_area + 2 * area) as usize],
        };
        for (i, b) in mem.bytes[desc_area as usize..(desc_area + area) as usize]
            .iter_mut()
            .enumerate()
        {
            *b = (i as u64).wrapping_mul(0x9E37_79B9).wrapping_shr(7) as u8 | 1;
        }
        let segs: Vec<Segment> = cases
            .iter()
            .map(|&(s, d, len)| seg(src0 + s, dst0 + d, len))
            .collect();
        // Both paths of the kernel, and heads of every length, are exercised.
        assert!(segs
            .iter()
            .any(|s| s.len > 64 && co_aligned(s.src, s.dst) && s.src % 16 == 0));
        assert!(segs
            .iter()
            .any(|s| s.len > 64 && co_aligned(s.src, s.dst) && s.src % 16 == 13));
        assert!(segs.iter().any(|s| s.len > 64 && !co_aligned(s.src, s.dst)));
        for (chunk, grid, ntid) in [
            (CHUNK, 7, THREADS),
            (4096, 3, THREADS),
            (1024, 64, 32),
            (64, 5, 16),
        ] {
            let descs = pack(&segs, chunk);
            let bytes = descriptor_bytes(&descs);
            assert!(bytes.len() as u64 <= desc_area);
            let mut m = Memory {
                base,
                bytes: mem.bytes.clone(),
            };
            m.bytes[..bytes.len()].copy_from_slice(&bytes);
            run(
                &prog,
                &mut m,
                &[("nixl_descs", base), ("nixl_count", descs.len() as u64)],
                grid,
                ntid,
            );
            let mut want = mem.bytes.clone();
            want[..bytes.len()].copy_from_slice(&bytes);
            for &(s, d, len) in &cases {
                let (s, d) = ((desc_area + s) as usize, (desc_area + area + d) as usize);
                let src = want[s..s + len as usize].to_vec();
                want[d..d + len as usize].copy_from_slice(&src);
            }
            if let Some(i) = (0..want.len()).find(|&i| want[i] != m.bytes[i]) {
                panic!(
                    "chunk {chunk} grid {grid} x {ntid}: byte {:#x} differs",
                    base + i as u64
                );
            }
        }
    }

    #[test]
    fn ptx_is_terminated_and_declares_what_the_launch_passes() {
        assert!(PTX.ends_with('\0'));
        assert_eq!(PTX.matches('\0').count(), 1);
        assert!(PTX.contains(".visible .entry nixl_copy_segments("));
        assert_eq!(PTX.matches(".param .u64").count(), 2);
        assert!(PTX.contains(&format!(".maxntid {THREADS}, 1, 1")));
        assert_eq!(NAME.to_str().unwrap(), "nixl_copy_segments");
        // Descriptor stride and field offsets match `descriptor_bytes`.
        assert!(PTX.contains(&format!("mad.lo.u64 \t%rd11, %rd3, {DESC_BYTES}, %rd1;")));
        assert!(PTX.contains("[%rd11+8]") && PTX.contains("[%rd11+16]"));
    }
}
