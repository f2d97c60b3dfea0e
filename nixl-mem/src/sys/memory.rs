//! Device and pinned host memory, and the copies between them.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::cu;
use super::result::{bind_raw, check, CudaError};
use super::stream::Stream;

/// `CUDA_ERROR_INVALID_VALUE` for an access outside what a type owns (the safe layer checks
/// ranges first, so this is a second line, never the message users see).
fn out_of_range(call: &'static str) -> CudaError {
    CudaError {
        call,
        code: cu::CUresult::CUDA_ERROR_INVALID_VALUE as u32,
        name: "range outside the allocation".to_owned(),
    }
}

fn inside(len: usize, offset: usize, n: usize) -> bool {
    offset.checked_add(n).is_some_and(|end| end <= len)
}

/// A `cuMemAlloc` allocation of one context, freed on drop.
pub(crate) struct DeviceAlloc {
    ctx: Arc<CudaContext>,
    ptr: cu::CUdeviceptr,
    len: usize,
}

impl DeviceAlloc {
    /// Allocates `len > 0` bytes (uninitialised) with `ctx` current.
    pub(crate) fn new(ctx: Arc<CudaContext>, len: usize) -> Result<Self, CudaError> {
        bind_raw(&ctx)?;
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: the context is current; `ptr` is a valid out pointer.
        check("cuMemAlloc", unsafe { cu::cuMemAlloc_v2(&mut ptr, len) })?;
        Ok(DeviceAlloc { ctx, ptr, len })
    }

    /// The device pointer.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The context it lives in.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Sets every byte (`cuMemsetD8`, synchronous for the host).
    pub(crate) fn memset(&self, byte: u8) -> Result<(), CudaError> {
        // SAFETY: the whole allocation belongs to self.
        check("cuMemsetD8", unsafe {
            cu::cuMemsetD8_v2(self.ptr, byte, self.len)
        })
    }

    /// Copies `src` in at `offset` (synchronous host-to-device copy).
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result<(), CudaError> {
        if !inside(self.len, offset, src.len()) {
            return Err(out_of_range("cuMemcpyHtoD"));
        }
        // SAFETY: the destination lies in the allocation (checked); `src` is a live slice and
        // the copy is synchronous with respect to it.
        check("cuMemcpyHtoD", unsafe {
            cu::cuMemcpyHtoD_v2(self.ptr + offset as u64, src.as_ptr().cast(), src.len())
        })
    }

    /// Copies bytes at `offset` into `dst` (synchronous device-to-host copy).
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), CudaError> {
        if !inside(self.len, offset, dst.len()) {
            return Err(out_of_range("cuMemcpyDtoH"));
        }
        // SAFETY: the source lies in the allocation (checked); `dst` is a live exclusive slice.
        check("cuMemcpyDtoH", unsafe {
            cu::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), self.ptr + offset as u64, dst.len())
        })
    }

    /// Copies `len` bytes of `src` at `src_offset` to `offset` (device to device, possibly
    /// across GPUs).
    pub(crate) fn copy_from(
        &self,
        offset: usize,
        src: &DeviceAlloc,
        src_offset: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        if !inside(self.len, offset, len) || !inside(src.len, src_offset, len) {
            return Err(out_of_range("cuMemcpyDtoD"));
        }
        // SAFETY: both ranges lie in live allocations (checked); unified addressing lets the
        // driver resolve either device.
        check("cuMemcpyDtoD", unsafe {
            cu::cuMemcpyDtoD_v2(self.ptr + offset as u64, src.ptr + src_offset as u64, len)
        })
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if let Err(e) = bind_raw(&self.ctx) {
            tracing::warn!(error = %e, "binding the context to free device memory failed");
        }
        // SAFETY: allocated by `new`, freed once. Owners keep the allocation while any request
        // may use it; cuMemFree waits for outstanding work on it.
        if let Err(e) = check("cuMemFree", unsafe { cu::cuMemFree_v2(self.ptr) }) {
            tracing::warn!(error = %e, "freeing device memory failed");
        }
    }
}

/// Pinned host memory from `cuMemHostAlloc` (portable and mapped), freed on drop.
pub(crate) struct HostAlloc {
    ctx: Arc<CudaContext>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain pinned memory owned by the value; its bytes are only reached through raw
// pointers under the `HostMemory` rules (bounded copies), never through references.
unsafe impl Send for HostAlloc {}
// SAFETY: as above.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    /// Allocates `len > 0` bytes with `ctx` current.
    pub(crate) fn new(ctx: Arc<CudaContext>, len: usize) -> Result<Self, CudaError> {
        bind_raw(&ctx)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = cu::CU_MEMHOSTALLOC_PORTABLE | cu::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: valid out pointer; the context is current.
        check("cuMemHostAlloc", unsafe {
            cu::cuMemHostAlloc(&mut p, len, flags)
        })?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(CudaError {
            call: "cuMemHostAlloc",
            code: cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY as u32,
            name: "returned null".to_owned(),
        })?;
        Ok(HostAlloc { ctx, ptr, len })
    }

    /// The start pointer (valid for `len` bytes while `self` lives).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The bytes, for the CPU to fill (the copy kernel's staging buffer).
    ///
    /// Crate invariant: no device copy reads or writes the allocation while the slice lives
    /// (the staging pool hands a buffer out only after the work that used it completed).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is valid for `len` bytes while `self` lives; `&mut self` makes this
        // the only reference from the host, and by the crate invariant no device copy
        // touches the bytes meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Enqueues a copy of the first `n` bytes to the start of `dst` on `stream`
    /// (`cuMemcpyHtoDAsync` from pinned memory: truly asynchronous).
    ///
    /// Crate invariant: the caller neither writes these bytes nor frees `self` until the
    /// stream has passed the copy (an event recorded after it has completed).
    pub(crate) fn upload_async(
        &self,
        n: usize,
        dst: &DeviceAlloc,
        stream: &Stream,
    ) -> Result<(), CudaError> {
        if n > self.len || n > dst.len {
            return Err(out_of_range("cuMemcpyHtoDAsync"));
        }
        // SAFETY: both ranges lie in live allocations (checked); the source stays untouched
        // and alive until the stream has run the copy (crate invariant above).
        check("cuMemcpyHtoDAsync", unsafe {
            cu::cuMemcpyHtoDAsync_v2(dst.ptr, self.ptr.as_ptr().cast(), n, stream.raw())
        })
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        if let Err(e) = bind_raw(&self.ctx) {
            tracing::warn!(error = %e, "binding a context to free pinned memory failed");
        }
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once.
        if let Err(e) = check("cuMemFreeHost", unsafe {
            cu::cuMemFreeHost(self.ptr.as_ptr().cast())
        }) {
            tracing::warn!(error = %e, "freeing pinned host memory failed");
        }
    }
}

/// Host pages page-locked with `cuMemHostRegister` (portable), unregistered on drop.
pub(crate) struct HostRegistration {
    ctx: Arc<CudaContext>,
    addr: u64,
}

// SAFETY: holds an address only (never dereferenced here) and a context handle, which may be
// used from any thread.
unsafe impl Send for HostRegistration {}
// SAFETY: as above.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Pins `[addr, addr+len)` with `ctx` current. The caller keeps the memory alive until the
    /// value is dropped (crate invariant: owned memory, or a registered region whose
    /// registration owns this value).
    pub(crate) fn new(ctx: &Arc<CudaContext>, addr: u64, len: usize) -> Result<Self, CudaError> {
        bind_raw(ctx)?;
        // SAFETY: pinning reads no memory; the range stays alive until Drop unregisters it
        // (crate invariant above).
        check("cuMemHostRegister", unsafe {
            cu::cuMemHostRegister_v2(addr as *mut c_void, len, cu::CU_MEMHOSTREGISTER_PORTABLE)
        })?;
        Ok(HostRegistration {
            ctx: ctx.clone(),
            addr,
        })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if let Err(e) = bind_raw(&self.ctx) {
            tracing::warn!(error = %e, "binding a context to unpin failed");
        }
        // SAFETY: registered in `new`, unregistered once, while the memory is still alive.
        if let Err(e) = check("cuMemHostUnregister", unsafe {
            cu::cuMemHostUnregister(self.addr as *mut c_void)
        }) {
            tracing::warn!(error = %e, "unpinning host memory failed");
        }
    }
}

/// Enqueues `cuMemcpyAsync(dst, src, len)` on `stream`. Crate invariant: both ranges stay alive
/// until the stream has run the copy (registrations the request holds).
pub(crate) fn memcpy_async(
    dst: u64,
    src: u64,
    len: usize,
    stream: &Stream,
) -> Result<(), CudaError> {
    // SAFETY: both ranges lie in memory the caller keeps alive until the copy ran (crate
    // invariant); unified addressing lets the driver route host and device pointers.
    check("cuMemcpyAsync", unsafe {
        cu::cuMemcpyAsync(dst, src, len, stream.raw())
    })
}

/// Enqueues every `(dst, src, len)` with one `cuMemcpyBatchAsync` (CUDA 12.8+), source order
/// of the stream; `CudaError` "symbol missing" on older drivers. Crate invariant as for
/// [`memcpy_async`].
pub(crate) fn memcpy_batch_async(
    copies: &[(u64, u64, u64)],
    stream: &Stream,
) -> Result<(), CudaError> {
    if !super::driver::has_symbol("cuMemcpyBatchAsync") {
        return Err(CudaError {
            call: "cuMemcpyBatchAsync",
            code: 0,
            name: "symbol missing".into(),
        });
    }
    let mut dsts: Vec<cu::CUdeviceptr> = copies.iter().map(|c| c.0).collect();
    let mut srcs: Vec<cu::CUdeviceptr> = copies.iter().map(|c| c.1).collect();
    let mut sizes: Vec<usize> = copies.iter().map(|c| c.2 as usize).collect();
    let loc = cu::CUmemLocation {
        type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: 0,
    };
    let mut attrs = [cu::CUmemcpyAttributes {
        srcAccessOrder: cu::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        srcLocHint: loc,
        dstLocHint: loc,
        flags: 0,
    }];
    let mut idx = [0usize];
    let mut fail_idx = usize::MAX;
    // SAFETY: the symbol exists (checked); the three arrays have `copies.len()` entries each
    // and live across the call; one attribute applies from index 0; every range is valid as
    // in `memcpy_async` (crate invariant).
    let r = unsafe {
        cu::cuMemcpyBatchAsync(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            dsts.len(),
            attrs.as_mut_ptr(),
            idx.as_mut_ptr(),
            1,
            &mut fail_idx,
            stream.raw(),
        )
    };
    check("cuMemcpyBatchAsync", r)
}

impl Stream {
    /// Copies `len` bytes of device memory at `src` to host memory at `dst` on this stream
    /// and waits for the copy (`cuMemcpyDtoHAsync` + `cuStreamSynchronize`). Binds the
    /// stream's context on the calling thread.
    ///
    /// # Safety
    /// `src..src+len` is device memory of the stream's device and `dst..dst+len` host memory
    /// (pinned for a truly asynchronous copy), both alive, and `dst` not accessed by anyone
    /// else, until this returns.
    pub unsafe fn copy_to_host_sync(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
    ) -> Result<(), CudaError> {
        bind_raw(self.context())?;
        // SAFETY: the caller guarantees both ranges; the context is current.
        check("cuMemcpyDtoHAsync", unsafe {
            cu::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, self.raw())
        })?;
        self.synchronize()
    }

    /// Copies `len` bytes of host memory at `src` to device memory at `dst` on this stream and
    /// waits for the copy (`cuMemcpyHtoDAsync` + `cuStreamSynchronize`). Binds the stream's
    /// context on the calling thread.
    ///
    /// # Safety
    /// As [`Stream::copy_to_host_sync`], with the directions swapped: `dst..dst+len` is device
    /// memory of the stream's device not accessed by anyone else until this returns.
    pub unsafe fn copy_from_host_sync(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> Result<(), CudaError> {
        bind_raw(self.context())?;
        // SAFETY: the caller guarantees both ranges; the context is current.
        check("cuMemcpyHtoDAsync", unsafe {
            cu::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, self.raw())
        })?;
        self.synchronize()
    }
}

/// Writes 32-byte entries (four `u64`, little-endian) one after another from the start of a
/// byte buffer the CPU fills once and a DMA engine then reads (the copy kernel's pinned
/// staging): on x86-64, with non-temporal stores where the buffer is 16-byte aligned, so each
/// line goes to memory without first being read into the cache (a buffer reused only after
/// the others in its pool is rarely still cached, and the read costs more than the write);
/// elsewhere with plain stores. The stores are fenced when the writer is dropped, before the
/// caller enqueues the upload that reads them.
pub(crate) struct EntryWriter<'a> {
    out: &'a mut [u8],
    at: usize,
    streamed: bool,
}

impl<'a> EntryWriter<'a> {
    /// A writer from the start of `out`.
    pub(crate) fn new(out: &'a mut [u8]) -> Self {
        let streamed = cfg!(target_arch = "x86_64") && (out.as_ptr() as usize).is_multiple_of(16);
        EntryWriter {
            out,
            at: 0,
            streamed,
        }
    }

    /// Whether the entries are written with non-temporal stores.
    #[cfg(test)]
    pub(crate) fn streamed(&self) -> bool {
        self.streamed
    }

    /// Bytes written so far.
    pub(crate) fn written(&self) -> usize {
        self.at
    }

    /// Appends `v`; `false` (nothing written) where the buffer has no room for it.
    #[inline]
    pub(crate) fn put(&mut self, v: [u64; 4]) -> bool {
        let Some(slot) = self.out.get_mut(self.at..self.at.saturating_add(32)) else {
            return false;
        };
        #[cfg(target_arch = "x86_64")]
        if self.streamed {
            use std::arch::x86_64::{__m128i, _mm_set_epi64x, _mm_stream_si128};
            let p = slot.as_mut_ptr().cast::<__m128i>();
            // SAFETY: `slot` is 32 bytes of `out`, borrowed mutably for the writer's life, so
            // both 16-byte stores land inside memory nothing else reads or writes meanwhile;
            // `out` starts 16-byte aligned (checked in `new`) and `at` is a multiple of 32, so
            // both are aligned as `_mm_stream_si128` requires; SSE2 is part of x86-64.
            unsafe {
                _mm_stream_si128(p, _mm_set_epi64x(v[1] as i64, v[0] as i64));
                _mm_stream_si128(p.add(1), _mm_set_epi64x(v[3] as i64, v[2] as i64));
            }
            self.at += 32;
            return true;
        }
        for (d, x) in slot.chunks_exact_mut(8).zip(v) {
            d.copy_from_slice(&x.to_le_bytes());
        }
        self.at += 32;
        true
    }
}

impl Drop for EntryWriter<'_> {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        if self.streamed {
            // Non-temporal stores are weakly ordered: a sequentially consistent fence (`mfence`
            // on x86-64, which orders them too) makes them visible before anything the caller
            // does next (the driver call that starts the DMA).
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod entry_tests {
    use super::EntryWriter;

    fn plain(entries: &[[u64; 4]]) -> Vec<u8> {
        entries
            .iter()
            .flat_map(|e| e.iter().flat_map(|x| x.to_le_bytes()))
            .collect()
    }

    #[test]
    fn streamed_entries_are_the_plain_bytes() {
        let entries: Vec<[u64; 4]> = (0..300u64)
            .map(|i| {
                [
                    i,
                    u64::MAX - i,
                    i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    1 << (i % 64),
                ]
            })
            .collect();
        // A 16-aligned start and one 8 bytes past it (plain stores).
        let mut store = vec![0u8; 300 * 32 + 32];
        let pad = (16 - store.as_ptr() as usize % 16) % 16;
        let bytes = &mut store[pad..];
        for off in [0usize, 8] {
            let out = &mut bytes[off..off + 300 * 32];
            out.fill(0);
            let mut w = EntryWriter::new(out);
            assert_eq!(w.streamed(), cfg!(target_arch = "x86_64") && off == 0);
            for e in &entries {
                assert!(w.put(*e));
            }
            // Full: the next entry is refused and nothing moves.
            assert!(!w.put([1, 2, 3, 4]));
            assert_eq!(w.written(), 300 * 32);
            drop(w);
            assert!(out == plain(&entries).as_slice(), "offset {off}");
        }
    }
}
