//! ROCm (HIP) device memory, feature `rocm`: [`HipBuffer`] (`hipMalloc`), its IPC export
//! ([`HipIpcHandle`]) and import ([`HipIpcMapping`], closed on drop), and dma-buf export.
//!
//! Built with hip-sys 0.1.2, which links `libamdhip64` (Debian's `libamdhip64-dev`, build with
//! `HIP_PATH=/usr`; `scripts/deps/mem.sh --rocm` installs it). Without an AMD GPU every entry
//! point returns an `Unavailable` [`MemError`]. The dma-buf path (`hipMemGetHandleForAddressRange`,
//! ROCm >= 6.2) is looked up at run time and is `NotSupported` on older runtimes.
//!
//! Run here: build, and the no-device path (`Unavailable`) in CI. Not run: allocation, copies,
//! IPC and dma-buf on an AMD GPU (none was available).

// Exception to the crate's `deny(unsafe_code)`: the memory contracts this file's types
// promise (`unsafe impl`s of `MemoryRegion`, `HostMemory`, `Send`/`Sync`; SAFETY at each).
#![allow(unsafe_code)]

use std::fmt;

use nixl_core::{MemoryRegion, Op, RegionDesc};

use crate::error::{MemError, MemResult as Result};

use crate::sys::hip::{self as raw, HipAlloc, HipIpcOpen};
use crate::DmaBuf;

pub use crate::sys::hip::HipError;

fn to_error(op: Op, e: HipError) -> MemError {
    MemError::library(op, "HIP", e.to_string(), Some(std::sync::Arc::new(e)))
}

/// The number of visible AMD GPUs; `Unavailable` when there is none (or no driver).
pub fn device_count() -> Result<usize> {
    match raw::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(n) => Err(MemError::unavailable(
            Op::CreateBackend,
            "an AMD GPU (HIP)",
            format!("hipGetDeviceCount found {n} devices; check the amdgpu driver and /dev/kfd"),
        )),
        Err(e) => Err(MemError::unavailable(
            Op::CreateBackend,
            "an AMD GPU (HIP)",
            format!("{e}; check the amdgpu driver and /dev/kfd"),
        )),
    }
}

fn set_device(op: Op, device: usize) -> Result<()> {
    let n = device_count()?;
    if device >= n {
        return Err(MemError::invalid(
            op,
            format!("HIP device {device} does not exist ({n} visible)"),
        ));
    }
    raw::set_device(device).map_err(|e| to_error(op, e))
}

/// A zero-initialised `hipMalloc` allocation, freed on drop; VRAM with `dev_id` = the HIP
/// device ordinal and `addr` = the device pointer.
pub struct HipBuffer {
    mem: HipAlloc,
    len: usize,
    device: usize,
}

impl HipBuffer {
    /// Allocates `len` bytes on HIP device `device` and zeroes them.
    pub fn new(device: usize, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(MemError::invalid(
                Op::RegisterMem,
                "a device buffer needs at least one byte",
            ));
        }
        set_device(Op::RegisterMem, device)?;
        let mem = HipAlloc::new(device, len).map_err(|e| to_error(Op::RegisterMem, e))?;
        Ok(HipBuffer { mem, len, device })
    }

    /// The device pointer.
    pub fn addr(&self) -> u64 {
        self.mem.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn range(&self, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MemError::invalid(
                Op::PostXfer,
                format!("{offset}+{n} is outside the {}-byte buffer", self.len),
            )),
        }
    }

    /// Copies `src` in at `offset` (synchronous).
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.range(offset, src.len())?;
        set_device(Op::PostXfer, self.device)?;
        self.mem
            .write(offset, src)
            .map_err(|e| to_error(Op::PostXfer, e))
    }

    /// Copies out at `offset` into `dst` (synchronous).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.range(offset, dst.len())?;
        set_device(Op::PostXfer, self.device)?;
        self.mem
            .read(offset, dst)
            .map_err(|e| to_error(Op::PostXfer, e))
    }

    /// Exports the allocation for another process (`hipIpcGetMemHandle`).
    pub fn ipc_handle(&self) -> Result<HipIpcHandle> {
        set_device(Op::RegisterMem, self.device)?;
        let bytes = self
            .mem
            .ipc_handle()
            .map_err(|e| to_error(Op::RegisterMem, e))?;
        Ok(HipIpcHandle {
            bytes,
            len: self.len as u64,
        })
    }

    /// Exports the allocation as a dma-buf (for NIC registration) with
    /// `hipMemGetHandleForAddressRange`, looked up at run time (ROCm >= 6.2).
    pub fn dmabuf(&self) -> Result<DmaBuf> {
        set_device(Op::RegisterMem, self.device)?;
        let fd = self
            .mem
            .dmabuf()
            .map_err(|e| to_error(Op::RegisterMem, e))?
            .ok_or_else(|| {
                MemError::not_supported(
                    Op::RegisterMem,
                    "this HIP runtime has no hipMemGetHandleForAddressRange (ROCm >= 6.2)",
                )
            })?;
        Ok(DmaBuf {
            fd,
            offset: 0,
            len: self.len as u64,
        })
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

// SAFETY: the allocation lives until the value (and its `HipAlloc`) is dropped; the
// description never changes.
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
    mem: HipIpcOpen,
    len: u64,
    device: usize,
}

impl HipIpcMapping {
    /// Maps a handle exported by another process onto HIP device `device`.
    pub fn open(device: usize, handle: &HipIpcHandle) -> Result<Self> {
        set_device(Op::LoadMetadata, device)?;
        let mem =
            HipIpcOpen::open(device, &handle.bytes).map_err(|e| to_error(Op::LoadMetadata, e))?;
        Ok(HipIpcMapping {
            mem,
            len: handle.len,
            device,
        })
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

// SAFETY: the mapping lives until the value (and its `HipIpcOpen`) is dropped; the
// description never changes.
unsafe impl MemoryRegion for HipIpcMapping {
    fn desc(&self) -> RegionDesc {
        RegionDesc::vram(self.mem.addr(), self.len, self.device as u64)
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
