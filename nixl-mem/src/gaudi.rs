//! Intel Gaudi (Habana) device memory, feature `gaudi`: [`GaudiBuffer`], allocated and mapped
//! through the Habana user-space library `libhl-thunk.so`, loaded at run time, and exported as a
//! dma-buf ([`GaudiBuffer::dmabuf`]) — the way NICs (verbs `ibv_reg_dmabuf_mr`, libfabric
//! `FI_MR_DMABUF`) register Gaudi memory.
//!
//! Without the library or a device every entry point returns an `Unavailable` [`MemError`] naming what
//! is missing. Gaudi memory is not host-addressable: data moves by the device's DMA engines
//! (Synapse) or by a NIC, so this type offers no host copies.
//!
//! Run here: the library-absent path (`Unavailable`). Not run: allocation, mapping and dma-buf
//! export on a Gaudi (none was available); the signatures follow `hlthunk.h` (habanalabs
//! hl-thunk), where `HLTHUNK_DEVICE_DONT_CARE` has been 4 in every published version.

// Exception to the crate's `deny(unsafe_code)`: the memory contracts this file's types
// promise (`unsafe impl`s of `MemoryRegion`, `HostMemory`, `Send`/`Sync`; SAFETY at each).
#![allow(unsafe_code)]

use std::fmt;
use std::sync::Arc;

use nixl_core::{MemoryRegion, Op, RegionDesc};

use crate::error::{MemError, MemResult as Result};

use crate::sys::hlthunk::{self as raw, Device, DeviceMemory};
use crate::DmaBuf;

/// Gaudi device memory (`hlthunk_device_memory_alloc` + `hlthunk_device_memory_map`), unmapped
/// and freed on drop; VRAM with `addr` = its device virtual address and `dev_id` 0 (the device
/// `hlthunk_open` chose).
pub struct GaudiBuffer {
    mem: DeviceMemory,
    len: u64,
}

impl GaudiBuffer {
    /// Allocates `len` bytes (rounded up to 4 KiB) of contiguous device memory on the first
    /// available Gaudi.
    pub fn new(len: u64) -> Result<Self> {
        if len == 0 {
            return Err(MemError::invalid(
                Op::RegisterMem,
                "a device buffer needs at least one byte",
            ));
        }
        let lib = raw::lib().map_err(|e| {
            MemError::unavailable(
                Op::RegisterMem,
                "the Habana user-space library (libhl-thunk.so)",
                format!("install the Gaudi software stack (habanalabs-thunk) and its driver: {e}"),
            )
        })?;
        let dev = Device::open(lib).map_err(|fd| {
            MemError::unavailable(
                Op::RegisterMem,
                "a Gaudi device",
                format!("hlthunk_open returned {fd}; check the habanalabs driver and /dev/accel"),
            )
        })?;
        let len = len
            .checked_next_multiple_of(4096)
            .ok_or_else(|| MemError::invalid(Op::RegisterMem, "length overflows"))?;
        let mem = DeviceMemory::new(Arc::new(dev), len).map_err(|call| {
            MemError::backend(
                "GAUDI",
                Op::RegisterMem,
                format!("{call} of {len} bytes failed"),
            )
        })?;
        Ok(GaudiBuffer { mem, len })
    }

    /// The device virtual address.
    pub fn addr(&self) -> u64 {
        self.mem.addr()
    }

    /// Length in bytes (a multiple of 4 KiB).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Exports the memory as a dma-buf for NIC registration
    /// (`hlthunk_device_mapped_memory_export_dmabuf_fd`); `NotSupported` on libraries without it.
    pub fn dmabuf(&self) -> Result<DmaBuf> {
        let fd = self
            .mem
            .export_dmabuf()
            .map_err(|fd| {
                MemError::backend(
                    "GAUDI",
                    Op::RegisterMem,
                    format!("dma-buf export failed ({fd})"),
                )
            })?
            .ok_or_else(|| {
                MemError::not_supported(Op::RegisterMem, "this libhl-thunk has no dma-buf export")
            })?;
        Ok(DmaBuf {
            fd,
            offset: 0,
            len: self.len,
        })
    }
}

impl fmt::Debug for GaudiBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GaudiBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the mapping lives until the value (and its `DeviceMemory`) is dropped; the
// description never changes. (Only devices and NICs can touch it; the agent never
// dereferences VRAM addresses.)
unsafe impl MemoryRegion for GaudiBuffer {
    fn desc(&self) -> RegionDesc {
        RegionDesc::vram(self.addr(), self.len, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_library_or_a_device_it_is_unavailable() {
        assert_eq!(
            GaudiBuffer::new(0).unwrap_err().kind().as_str(),
            "invalid_param"
        );
        match GaudiBuffer::new(1 << 20) {
            Ok(b) => {
                eprintln!("a Gaudi is present: {b:?}");
                assert_eq!(b.desc().kind, nixl_core::MemKind::Vram);
                let _ = b.dmabuf();
            }
            Err(e) => {
                eprintln!("no Gaudi here: {e}");
                assert!(
                    matches!(e.kind().as_str(), "unavailable" | "backend"),
                    "{e}"
                );
            }
        }
    }
}
