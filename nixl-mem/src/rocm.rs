//! ROCm (HIP) device memory, feature `rocm`: [`HipBuffer`] (`hipMalloc`), its IPC export
//! ([`HipIpcHandle`]) and import ([`HipIpcMapping`], closed on drop), and dma-buf export.
//!
//! Built with hip-sys 0.1.2, which links `libamdhip64` (Debian's `libamdhip64-dev`, build with
//! `HIP_PATH=/usr`; `scripts/deps/mem.sh --rocm` installs it). Without an AMD GPU every entry
//! point returns [`Error::Unavailable`]. The dma-buf path (`hipMemGetHandleForAddressRange`,
//! ROCm >= 6.2) is looked up at run time and is `NotSupported` on older runtimes.
//!
//! Run here: build, and the no-device path (`Unavailable`) in CI. Not run: allocation, copies,
//! IPC and dma-buf on an AMD GPU (none was available).

use std::ffi::{c_void, CStr};
use std::fmt;
use std::os::fd::{FromRawFd, OwnedFd};

use hip_sys::hiprt as sys;
use nixl_core::{Error, MemoryRegion, Op, RegionDesc, Result};

use crate::DmaBuf;

/// A failed HIP call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name} ({code})")]
pub struct HipError {
    /// The HIP function.
    pub call: &'static str,
    /// The `hipError_t` value.
    pub code: u32,
    /// HIP's name for it.
    pub name: String,
}

fn check(op: Op, call: &'static str, r: sys::hipError_t) -> Result<()> {
    if r == sys::hipError_t::hipSuccess {
        return Ok(());
    }
    // SAFETY: hipGetErrorName returns a static NUL-terminated string for any code.
    let name = unsafe { CStr::from_ptr(sys::hipGetErrorName(r)) }
        .to_string_lossy()
        .into_owned();
    let e = HipError {
        call,
        code: r as u32,
        name,
    };
    Err(Error::Backend {
        agent: "-".into(),
        backend: "HIP".into(),
        op,
        message: e.to_string(),
        source: Some(std::sync::Arc::new(e)),
    })
}

/// The number of visible AMD GPUs; `Unavailable` when there is none (or no driver).
pub fn device_count() -> Result<usize> {
    let mut n = 0;
    // SAFETY: valid out pointer; the runtime reports a missing driver or device as a code.
    let r = unsafe { sys::hipGetDeviceCount(&mut n) };
    if r != sys::hipError_t::hipSuccess || n <= 0 {
        return Err(Error::Unavailable {
            what: "an AMD GPU (HIP)".into(),
            hint: format!("hipGetDeviceCount returned {r:?} with {n} devices; check the amdgpu driver and /dev/kfd"),
        });
    }
    Ok(n as usize)
}

fn set_device(op: Op, device: usize) -> Result<()> {
    let n = device_count()?;
    if device >= n {
        return Err(Error::invalid(
            "-",
            op,
            format!("HIP device {device} does not exist ({n} visible)"),
        ));
    }
    // SAFETY: a valid ordinal (checked above).
    check(op, "hipSetDevice", unsafe {
        sys::hipSetDevice(device as i32)
    })
}

/// A zero-initialised `hipMalloc` allocation, freed on drop; VRAM with `dev_id` = the HIP
/// device ordinal and `addr` = the device pointer.
pub struct HipBuffer {
    ptr: *mut c_void,
    len: usize,
    device: usize,
}

// SAFETY: a device allocation owned by the value; HIP calls are thread-safe once the device is
// set on the calling thread (every method sets it).
unsafe impl Send for HipBuffer {}
// SAFETY: as above; host access is by copies only.
unsafe impl Sync for HipBuffer {}

impl HipBuffer {
    /// Allocates `len` bytes on HIP device `device` and zeroes them.
    pub fn new(device: usize, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid(
                "-",
                Op::RegisterMem,
                "a device buffer needs at least one byte",
            ));
        }
        set_device(Op::RegisterMem, device)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointer; the device is set.
        check(Op::RegisterMem, "hipMalloc", unsafe {
            sys::hipMalloc(&mut ptr, len)
        })?;
        let b = HipBuffer { ptr, len, device };
        // SAFETY: the whole fresh allocation; hipMemset is synchronous for device memory.
        check(Op::RegisterMem, "hipMemset", unsafe {
            sys::hipMemset(ptr, 0, len)
        })?;
        Ok(b)
    }

    /// The device pointer.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn range(&self, offset: usize, n: usize) -> Result<*mut c_void> {
        match offset.checked_add(n) {
            // SAFETY: in bounds of the allocation (checked).
            Some(end) if end <= self.len => Ok(unsafe { self.ptr.cast::<u8>().add(offset) }.cast()),
            _ => Err(Error::invalid(
                "-",
                Op::PostXfer,
                format!("{offset}+{n} is outside the {}-byte buffer", self.len),
            )),
        }
    }

    /// Copies `src` in at `offset` (synchronous).
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.range(offset, src.len())?;
        set_device(Op::PostXfer, self.device)?;
        // SAFETY: `dst` range is inside the allocation; `src` is a live slice.
        check(Op::PostXfer, "hipMemcpy", unsafe {
            sys::hipMemcpy(
                dst,
                src.as_ptr().cast(),
                src.len(),
                sys::hipMemcpyKind::hipMemcpyHostToDevice,
            )
        })
    }

    /// Copies out at `offset` into `dst` (synchronous).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.range(offset, dst.len())?;
        set_device(Op::PostXfer, self.device)?;
        // SAFETY: `src` range is inside the allocation; `dst` is a live exclusive slice.
        check(Op::PostXfer, "hipMemcpy", unsafe {
            sys::hipMemcpy(
                dst.as_mut_ptr().cast(),
                src,
                dst.len(),
                sys::hipMemcpyKind::hipMemcpyDeviceToHost,
            )
        })
    }

    /// Exports the allocation for another process (`hipIpcGetMemHandle`).
    pub fn ipc_handle(&self) -> Result<HipIpcHandle> {
        set_device(Op::RegisterMem, self.device)?;
        let mut h = sys::hipIpcMemHandle_t { reserved: [0; 64] };
        // SAFETY: valid out pointer; the allocation is live.
        check(Op::RegisterMem, "hipIpcGetMemHandle", unsafe {
            sys::hipIpcGetMemHandle(&mut h, self.ptr)
        })?;
        let mut bytes = [0u8; 64];
        for (d, s) in bytes.iter_mut().zip(h.reserved.iter()) {
            *d = *s as u8;
        }
        Ok(HipIpcHandle {
            bytes,
            len: self.len as u64,
        })
    }

    /// Exports the allocation as a dma-buf (for NIC registration) with
    /// `hipMemGetHandleForAddressRange`, looked up at run time (ROCm >= 6.2).
    pub fn dmabuf(&self) -> Result<DmaBuf> {
        type F = unsafe extern "C" fn(*mut c_void, u64, usize, u32, u64) -> sys::hipError_t;
        set_device(Op::RegisterMem, self.device)?;
        let this = libloading::os::unix::Library::this();
        // SAFETY: the symbol, if present, has the C signature of hipMemGetHandleForAddressRange.
        let f = unsafe { this.get::<F>(b"hipMemGetHandleForAddressRange") }.map_err(|_| {
            Error::not_supported(
                "-",
                Op::RegisterMem,
                "this HIP runtime has no hipMemGetHandleForAddressRange (ROCm >= 6.2)",
            )
        })?;
        let mut fd: i32 = -1;
        const HIP_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: u32 = 1;
        // SAFETY: `fd` is a valid out pointer for the int handle; the range is the whole live
        // allocation (hipMalloc returns page-aligned memory).
        let r = unsafe {
            f(
                (&mut fd as *mut i32).cast(),
                self.addr(),
                self.len,
                HIP_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        check(Op::RegisterMem, "hipMemGetHandleForAddressRange", r)?;
        if fd < 0 {
            return Err(Error::backend(
                "-",
                "HIP",
                Op::RegisterMem,
                "no dma-buf fd returned",
            ));
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(DmaBuf {
            fd,
            offset: 0,
            len: self.len as u64,
        })
    }
}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        let _ = set_device(Op::DeregisterMem, self.device);
        // SAFETY: allocated by hipMalloc in `new`, freed once.
        if let Err(e) = check(Op::DeregisterMem, "hipFree", unsafe {
            sys::hipFree(self.ptr)
        }) {
            tracing::warn!(error = %e, "hipFree failed");
        }
    }
}

impl fmt::Debug for HipBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipBuffer")
            .field("device", &self.device)
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the allocation lives until Drop; the description never changes.
unsafe impl MemoryRegion for HipBuffer {
    fn desc(&self) -> RegionDesc {
        RegionDesc::vram(self.addr(), self.len as u64, self.device as u64)
    }
}

/// An exported HIP allocation (`hipIpcGetMemHandle`): 64 opaque bytes and the length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HipIpcHandle {
    /// The runtime's handle bytes.
    pub bytes: [u8; 64],
    /// The allocation's length.
    pub len: u64,
}

/// Another process's HIP allocation mapped here (`hipIpcOpenMemHandle`), closed on drop.
pub struct HipIpcMapping {
    ptr: *mut c_void,
    len: u64,
    device: usize,
}

// SAFETY: as for HipBuffer.
unsafe impl Send for HipIpcMapping {}
// SAFETY: as for HipBuffer.
unsafe impl Sync for HipIpcMapping {}

impl HipIpcMapping {
    /// Maps a handle exported by another process onto HIP device `device`.
    pub fn open(device: usize, handle: &HipIpcHandle) -> Result<Self> {
        set_device(Op::LoadMetadata, device)?;
        let mut h = sys::hipIpcMemHandle_t { reserved: [0; 64] };
        for (d, s) in h.reserved.iter_mut().zip(handle.bytes.iter()) {
            *d = *s as _;
        }
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointer; flag 1 = hipIpcMemLazyEnablePeerAccess.
        check(Op::LoadMetadata, "hipIpcOpenMemHandle", unsafe {
            sys::hipIpcOpenMemHandle(&mut ptr, h, 1)
        })?;
        Ok(HipIpcMapping {
            ptr,
            len: handle.len,
            device,
        })
    }
}

impl Drop for HipIpcMapping {
    fn drop(&mut self) {
        let _ = set_device(Op::Invalidate, self.device);
        // SAFETY: opened in `open`, closed once.
        if let Err(e) = check(Op::Invalidate, "hipIpcCloseMemHandle", unsafe {
            sys::hipIpcCloseMemHandle(self.ptr)
        }) {
            tracing::warn!(error = %e, "hipIpcCloseMemHandle failed");
        }
    }
}

impl fmt::Debug for HipIpcMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipIpcMapping")
            .field("device", &self.device)
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the mapping lives until Drop; the description never changes.
unsafe impl MemoryRegion for HipIpcMapping {
    fn desc(&self) -> RegionDesc {
        RegionDesc::vram(self.ptr as u64, self.len, self.device as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_amd_gpu_everything_is_unavailable() {
        assert_eq!(
            HipBuffer::new(0, 0).unwrap_err().kind().as_str(),
            "invalid_param"
        );
        match device_count() {
            Ok(n) => {
                eprintln!("{n} AMD GPU(s): exercising allocation and copies");
                let b = HipBuffer::new(0, 1 << 20).unwrap();
                b.copy_from_host(0, &[7u8; 4096]).unwrap();
                let mut out = [0u8; 4096];
                b.copy_to_host(0, &mut out).unwrap();
                assert_eq!(out, [7u8; 4096]);
                assert!(b.ipc_handle().is_ok());
            }
            Err(e) => {
                eprintln!("no AMD GPU here: {e}");
                assert_eq!(e.kind().as_str(), "unavailable");
                assert_eq!(
                    HipBuffer::new(0, 4096).unwrap_err().kind().as_str(),
                    "unavailable"
                );
            }
        }
    }
}
