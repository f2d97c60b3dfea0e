//! Intel Gaudi (Habana) device memory, feature `gaudi`: [`GaudiBuffer`], allocated and mapped
//! through the Habana user-space library `libhl-thunk.so`, loaded at run time, and exported as a
//! dma-buf ([`GaudiBuffer::dmabuf`]) — the way NICs (verbs `ibv_reg_dmabuf_mr`, libfabric
//! `FI_MR_DMABUF`) register Gaudi memory.
//!
//! Without the library or a device every entry point returns [`Error::Unavailable`] naming what
//! is missing. Gaudi memory is not host-addressable: data moves by the device's DMA engines
//! (Synapse) or by a NIC, so this type offers no host copies.
//!
//! Run here: the library-absent path (`Unavailable`). Not run: allocation, mapping and dma-buf
//! export on a Gaudi (none was available); the signatures follow `hlthunk.h` (habanalabs
//! hl-thunk), where `HLTHUNK_DEVICE_DONT_CARE` has been 4 in every published version.

use std::ffi::{c_char, c_int};
use std::fmt;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use nixl_core::{Error, MemoryRegion, Op, RegionDesc, Result};

use crate::DmaBuf;

const HLTHUNK_DEVICE_DONT_CARE: c_int = 4;
const LIB_NAMES: &[&str] = &["libhl-thunk.so", "libhl-thunk.so.1"];

type OpenFn = unsafe extern "C" fn(c_int, *const c_char) -> c_int;
type CloseFn = unsafe extern "C" fn(c_int) -> c_int;
type AllocFn = unsafe extern "C" fn(c_int, u64, u64, bool, bool) -> u64;
type MapFn = unsafe extern "C" fn(c_int, u64, u64) -> u64;
type UnmapFn = unsafe extern "C" fn(c_int, u64) -> c_int;
type FreeFn = unsafe extern "C" fn(c_int, u64) -> c_int;
type ExportFn = unsafe extern "C" fn(c_int, u64, u64, u64, u32) -> c_int;

/// The resolved `libhl-thunk` entry points (the library stays loaded for the process).
struct HlThunk {
    _lib: libloading::Library,
    open: OpenFn,
    close: CloseFn,
    alloc: AllocFn,
    map: MapFn,
    unmap: UnmapFn,
    free: FreeFn,
    export: Option<ExportFn>,
}

static LIB: OnceLock<std::result::Result<Arc<HlThunk>, String>> = OnceLock::new();

fn load() -> std::result::Result<Arc<HlThunk>, String> {
    let mut last = String::new();
    for name in LIB_NAMES {
        // SAFETY: loading the Habana user-space library runs its initialisers, which only set
        // up its own state.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => {
                let get = |s: &str| -> std::result::Result<*const (), String> {
                    // SAFETY: looks a symbol up as a plain pointer; nothing is called.
                    unsafe { lib.get::<*const ()>(s.as_bytes()) }
                        .map(|p| *p)
                        .map_err(|e| format!("{s}: {e}"))
                };
                let req = |s: &str| get(s);
                let (o, c, a, m, u, f) = (
                    req("hlthunk_open")?,
                    req("hlthunk_close")?,
                    req("hlthunk_device_memory_alloc")?,
                    req("hlthunk_device_memory_map")?,
                    req("hlthunk_memory_unmap")?,
                    req("hlthunk_device_memory_free")?,
                );
                let x = get("hlthunk_device_mapped_memory_export_dmabuf_fd").ok();
                // SAFETY: each pointer is the named function of hlthunk.h, whose C signature the
                // target type matches; the library is kept loaded by `_lib`.
                let t = unsafe {
                    HlThunk {
                        open: std::mem::transmute::<*const (), OpenFn>(o),
                        close: std::mem::transmute::<*const (), CloseFn>(c),
                        alloc: std::mem::transmute::<*const (), AllocFn>(a),
                        map: std::mem::transmute::<*const (), MapFn>(m),
                        unmap: std::mem::transmute::<*const (), UnmapFn>(u),
                        free: std::mem::transmute::<*const (), FreeFn>(f),
                        export: x.map(|p| std::mem::transmute::<*const (), ExportFn>(p)),
                        _lib: lib,
                    }
                };
                return Ok(Arc::new(t));
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

fn lib() -> Result<Arc<HlThunk>> {
    LIB.get_or_init(load)
        .clone()
        .map_err(|e| Error::Unavailable {
            what: "the Habana user-space library (libhl-thunk.so)".into(),
            hint: format!(
                "install the Gaudi software stack (habanalabs-thunk) and its driver: {e}"
            ),
        })
}

/// An open Gaudi device (`hlthunk_open`), closed on drop.
struct Device {
    lib: Arc<HlThunk>,
    fd: c_int,
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: `fd` came from hlthunk_open and is closed once.
        if unsafe { (self.lib.close)(self.fd) } != 0 {
            tracing::warn!("hlthunk_close failed");
        }
    }
}

/// Gaudi device memory (`hlthunk_device_memory_alloc` + `hlthunk_device_memory_map`), unmapped
/// and freed on drop; VRAM with `addr` = its device virtual address and `dev_id` 0 (the device
/// `hlthunk_open` chose).
pub struct GaudiBuffer {
    dev: Arc<Device>,
    handle: u64,
    addr: u64,
    len: u64,
}

impl GaudiBuffer {
    /// Allocates `len` bytes (rounded up to 4 KiB) of contiguous device memory on the first
    /// available Gaudi.
    pub fn new(len: u64) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid(
                "-",
                Op::RegisterMem,
                "a device buffer needs at least one byte",
            ));
        }
        let lib = lib()?;
        // SAFETY: a null busid means "any device"; the call returns an fd or a negative errno.
        let fd = unsafe { (lib.open)(HLTHUNK_DEVICE_DONT_CARE, std::ptr::null()) };
        if fd < 0 {
            return Err(Error::Unavailable {
                what: "a Gaudi device".into(),
                hint: format!(
                    "hlthunk_open returned {fd}; check the habanalabs driver and /dev/accel"
                ),
            });
        }
        let dev = Arc::new(Device { lib, fd });
        let len = len
            .checked_next_multiple_of(4096)
            .ok_or_else(|| Error::invalid("-", Op::RegisterMem, "length overflows"))?;
        // SAFETY: a live device fd; page size 0 = default, contiguous, not shared.
        let handle = unsafe { (dev.lib.alloc)(fd, len, 0, true, false) };
        if handle == 0 {
            return Err(Error::backend(
                "-",
                "GAUDI",
                Op::RegisterMem,
                format!("hlthunk_device_memory_alloc of {len} bytes failed"),
            ));
        }
        // SAFETY: maps the handle just allocated at an address of the driver's choosing.
        let addr = unsafe { (dev.lib.map)(fd, handle, 0) };
        if addr == 0 {
            // SAFETY: frees the handle just allocated, once.
            unsafe { (dev.lib.free)(fd, handle) };
            return Err(Error::backend(
                "-",
                "GAUDI",
                Op::RegisterMem,
                "hlthunk_device_memory_map failed",
            ));
        }
        Ok(GaudiBuffer {
            dev,
            handle,
            addr,
            len,
        })
    }

    /// The device virtual address.
    pub fn addr(&self) -> u64 {
        self.addr
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
        let f = self.dev.lib.export.ok_or_else(|| {
            Error::not_supported(
                "-",
                Op::RegisterMem,
                "this libhl-thunk has no dma-buf export",
            )
        })?;
        // SAFETY: exports the live mapping; flags O_RDWR | O_CLOEXEC as the driver expects.
        let fd = unsafe {
            f(
                self.dev.fd,
                self.addr,
                self.len,
                0,
                (libc::O_RDWR | libc::O_CLOEXEC) as u32,
            )
        };
        if fd < 0 {
            return Err(Error::backend(
                "-",
                "GAUDI",
                Op::RegisterMem,
                format!("dma-buf export failed ({fd})"),
            ));
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(DmaBuf {
            fd,
            offset: 0,
            len: self.len,
        })
    }
}

impl Drop for GaudiBuffer {
    fn drop(&mut self) {
        // SAFETY: unmaps and frees what `new` mapped and allocated, once each.
        unsafe {
            if (self.dev.lib.unmap)(self.dev.fd, self.addr) != 0 {
                tracing::warn!("hlthunk_memory_unmap failed");
            }
            if (self.dev.lib.free)(self.dev.fd, self.handle) != 0 {
                tracing::warn!("hlthunk_device_memory_free failed");
            }
        }
    }
}

impl fmt::Debug for GaudiBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GaudiBuffer")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the mapping lives until Drop; the description never changes. (Only devices and NICs
// can touch it; the agent never dereferences VRAM addresses.)
unsafe impl MemoryRegion for GaudiBuffer {
    fn desc(&self) -> RegionDesc {
        RegionDesc::vram(self.addr, self.len, 0)
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
