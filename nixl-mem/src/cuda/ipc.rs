//! CUDA IPC: exporting an allocation to another process ([`IpcHandle`]), mapping one exported
//! by another process ([`IpcMapping`], closed on drop), and dma-buf export ([`DmaBuf`]).

// Exception to the crate's `deny(unsafe_code)`: the memory contracts this file's types
// promise (`unsafe impl`s of `MemoryRegion`, `HostMemory`, `Send`/`Sync`; SAFETY at each).
#![allow(unsafe_code)]

use std::fmt;
use std::os::fd::OwnedFd;

use nixl_core::backend::DecodeError;
use nixl_core::{MemoryRegion, Op, RegionDesc};

use crate::error::{MemError, MemResult as Result};

use super::{address_range, context, cu};
use crate::sys::cu as sys;
use crate::sys::driver::{device_attribute, has_symbol};
use crate::sys::ipc::{self as raw, IpcOpen};
use crate::wire::{Reader, Writer};

const MAGIC: &[u8; 4] = b"NXCI";

/// An exported CUDA allocation: the driver's 64-byte IPC handle plus where the exported range
/// lies inside the allocation. Plain bytes; send them to the peer with [`IpcHandle::to_bytes`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IpcHandle {
    handle: [u8; 64],
    /// The exporter's GPU ordinal.
    pub ordinal: u64,
    /// The allocation's base address in the exporter.
    pub alloc_base: u64,
    /// The allocation's size.
    pub alloc_size: u64,
    /// The exported range's start address in the exporter.
    pub addr: u64,
    /// The exported range's length.
    pub len: u64,
}

impl fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcHandle")
            .field("ordinal", &self.ordinal)
            .field("alloc_base", &format_args!("{:#x}", self.alloc_base))
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .finish()
    }
}

impl IpcHandle {
    /// Exports `[addr, addr+len)` of device memory on GPU `ordinal`. The handle names the whole
    /// allocation containing `addr` (that is what `cuIpcGetMemHandle` exports); `addr`/`len`
    /// record the range. Marks the allocation `SYNC_MEMOPS` so synchronous copies by either
    /// process are ordered with the other's.
    pub fn export(ordinal: usize, addr: u64, len: u64) -> Result<Self> {
        let _ctx = context(ordinal)?;
        match super::pointer_device(addr) {
            Some(o) if o == ordinal => {}
            Some(o) => {
                return Err(MemError::mismatch(
                    Op::RegisterMem,
                    format!("{addr:#x} is on GPU {o}, not {ordinal}"),
                ))
            }
            None => {
                return Err(MemError::invalid(
                    Op::RegisterMem,
                    format!("{addr:#x} is not CUDA device memory"),
                ))
            }
        }
        let (alloc_base, alloc_size) = address_range(Op::RegisterMem, addr)?;
        let inside = addr
            .checked_add(len)
            .is_some_and(|end| end <= alloc_base + alloc_size);
        if len == 0 || !inside {
            return Err(MemError::invalid(
                Op::RegisterMem,
                format!("{addr:#x}+{len} is not inside one CUDA allocation"),
            ));
        }
        let handle = cu(Op::RegisterMem, raw::export(alloc_base))?;
        Ok(IpcHandle {
            handle,
            ordinal: ordinal as u64,
            alloc_base,
            alloc_size,
            addr,
            len,
        })
    }

    /// The bytes to send to a peer.
    pub fn to_bytes(&self) -> Vec<u8> {
        Writer::new(MAGIC)
            .raw(&self.handle)
            .u64(self.ordinal)
            .u64(self.alloc_base)
            .u64(self.alloc_size)
            .u64(self.addr)
            .u64(self.len)
            .finish()
    }

    /// Parses [`IpcHandle::to_bytes`]; refuses truncated, trailing or inconsistent bytes.
    pub fn from_bytes(b: &[u8]) -> std::result::Result<Self, DecodeError> {
        let mut r = Reader::new(b, MAGIC)?;
        let mut handle = [0u8; 64];
        handle.copy_from_slice(r.raw(64)?);
        let h = IpcHandle {
            handle,
            ordinal: r.u64()?,
            alloc_base: r.u64()?,
            alloc_size: r.u64()?,
            addr: r.u64()?,
            len: r.u64()?,
        };
        r.finish()?;
        let end = h.alloc_base.checked_add(h.alloc_size);
        let rend = h.addr.checked_add(h.len);
        match (end, rend) {
            (Some(e), Some(re)) if h.addr >= h.alloc_base && re <= e && h.len > 0 => Ok(h),
            _ => Err(DecodeError::Invalid {
                what: "CUDA IPC range",
            }),
        }
    }

    /// The driver's handle bytes (names the allocation).
    pub fn raw(&self) -> &[u8; 64] {
        &self.handle
    }
}

/// Another process's CUDA allocation mapped into this one (`cuIpcOpenMemHandle`), unmapped on
/// drop (`cuIpcCloseMemHandle`). As a [`MemoryRegion`] it is the exported range, as VRAM of the
/// GPU it was opened on.
pub struct IpcMapping {
    mem: IpcOpen,
    ordinal: usize,
    /// The GPU whose memory it is, in this process's numbering, where the driver says.
    resident: Option<usize>,
    handle: IpcHandle,
}

impl IpcMapping {
    /// Maps `handle` into GPU `ordinal`'s context (peer access enabled lazily when the
    /// exporter is another GPU). Fails when the handle was exported by this very process
    /// (CUDA refuses that), when the exporter freed it, or without CUDA.
    pub fn open(ordinal: usize, handle: &IpcHandle) -> Result<Self> {
        let ctx = context(ordinal)?;
        let mem = cu(
            Op::LoadMetadata,
            IpcOpen::open(ctx, &handle.handle, handle.alloc_size),
        )?;
        let base = mem.base();
        Ok(IpcMapping {
            mem,
            ordinal,
            // With one visible GPU, device memory can only be on it.
            resident: super::pointer_device(base)
                .or_else(|| (super::device_count().ok() == Some(1)).then_some(0)),
            handle: handle.clone(),
        })
    }

    /// Where the exporter's address `remote` is mapped here, if it lies in the allocation.
    pub fn translate(&self, remote: u64, len: u64) -> Option<u64> {
        self.window().translate(remote, len)
    }

    /// The exporter's allocation and where it is mapped here.
    pub(crate) fn window(&self) -> crate::shared::Window {
        crate::shared::Window {
            remote: self.handle.alloc_base,
            len: self.handle.alloc_size,
            here: self.mem.base(),
        }
    }

    /// The mapped address of the exported range.
    pub fn addr(&self) -> u64 {
        self.mem.base() + self.offset()
    }

    /// The handle it was opened from.
    pub fn handle(&self) -> &IpcHandle {
        &self.handle
    }

    /// The GPU it is mapped on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The GPU whose memory this is (in this process's device numbering), if the driver
    /// reports it: the same as [`IpcMapping::ordinal`] when exporter and importer share a GPU.
    pub fn resident_ordinal(&self) -> Option<usize> {
        self.resident
    }

    /// Where the exported range starts inside the allocation.
    fn offset(&self) -> u64 {
        self.handle.addr - self.handle.alloc_base
    }

    fn range(&self, offset: usize, n: usize) -> Result<u64> {
        match (offset as u64).checked_add(n as u64) {
            Some(end) if end <= self.handle.len => Ok(self.offset() + offset as u64),
            _ => Err(MemError::invalid(
                Op::PostXfer,
                format!(
                    "{offset}+{n} is outside the {}-byte mapping",
                    self.handle.len
                ),
            )),
        }
    }

    /// Copies `src` into the mapped range at `offset` (synchronous).
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        let at = self.range(offset, src.len())?;
        cu(Op::PostXfer, self.mem.write(at, src))
    }

    /// Copies the mapped range at `offset` into `dst` (synchronous).
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let at = self.range(offset, dst.len())?;
        cu(Op::PostXfer, self.mem.read(at, dst))
    }
}

impl fmt::Debug for IpcMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcMapping")
            .field("ordinal", &self.ordinal)
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.handle.len)
            .finish()
    }
}

// SAFETY: the mapping stays valid until Drop closes it, and the description never changes.
unsafe impl MemoryRegion for IpcMapping {
    fn desc(&self) -> RegionDesc {
        RegionDesc::vram(self.addr(), self.handle.len, self.ordinal as u64)
    }
}

/// A dma-buf file descriptor exporting device memory, for registering GPU memory with a NIC
/// (`ibv_reg_dmabuf_mr`, `fi_mr_regattr` with `FI_MR_DMABUF`). `offset` is where the requested
/// range starts inside the (page-aligned) exported range.
#[derive(Debug)]
pub struct DmaBuf {
    /// The file descriptor (closed on drop).
    pub fd: OwnedFd,
    /// Start of the requested range inside the dma-buf.
    pub offset: u64,
    /// Length of the dma-buf.
    pub len: u64,
}

impl DmaBuf {
    /// Exports CUDA memory with `cuMemGetHandleForAddressRange(DMA_BUF_FD)`. `NotSupported`
    /// when the device or driver offers no dma-buf (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`
    /// is 0, or the open kernel module is not in use).
    pub(crate) fn export_cuda(ordinal: usize, addr: u64, len: u64) -> Result<Self> {
        let _ctx = context(ordinal)?;
        let has = has_symbol("cuMemGetHandleForAddressRange");
        let supported = cu(
            Op::RegisterMem,
            device_attribute(
                ordinal,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
            ),
        )?;
        if !has || supported == 0 {
            return Err(MemError::not_supported(Op::RegisterMem, format!("GPU {ordinal} offers no dma-buf export (needs the open kernel module and CUDA >= 11.7)")));
        }
        let page = 4096u64;
        let start = addr & !(page - 1);
        let end = addr
            .checked_add(len)
            .and_then(|e| e.checked_add(page - 1))
            .map(|e| e & !(page - 1));
        let Some(end) = end else {
            return Err(MemError::invalid(
                Op::RegisterMem,
                "dma-buf range overflows",
            ));
        };
        let fd: OwnedFd = cu(
            Op::RegisterMem,
            raw::dmabuf_fd(start, (end - start) as usize),
        )?
        .ok_or_else(|| {
            MemError::backend(
                super::CUDA,
                Op::RegisterMem,
                "driver returned no dma-buf fd",
            )
        })?;
        Ok(DmaBuf {
            fd,
            offset: addr - start,
            len: end - start,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_bytes_round_trip_and_refuse_garbage() {
        let h = IpcHandle {
            handle: [5; 64],
            ordinal: 1,
            alloc_base: 0x1000,
            alloc_size: 0x4000,
            addr: 0x2000,
            len: 0x1000,
        };
        let b = h.to_bytes();
        assert_eq!(IpcHandle::from_bytes(&b).unwrap(), h);
        for n in 0..b.len() {
            assert!(IpcHandle::from_bytes(&b[..n]).is_err());
        }
        let mut extra = b.clone();
        extra.push(0);
        assert_eq!(IpcHandle::from_bytes(&extra), Err(DecodeError::Trailing(1)));
        let bad = IpcHandle {
            addr: 0x4800,
            ..h.clone()
        }
        .to_bytes();
        assert!(matches!(
            IpcHandle::from_bytes(&bad),
            Err(DecodeError::Invalid { .. })
        ));
        let overflow = IpcHandle {
            alloc_base: u64::MAX,
            ..h
        }
        .to_bytes();
        assert!(IpcHandle::from_bytes(&overflow).is_err());
    }
}
