//! The Habana user-space library `libhl-thunk.so`, feature `gaudi`, loaded at run time: its
//! entry points (signatures of `hlthunk.h`), an open device, and mapped device memory.

use std::ffi::{c_char, c_int};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

/// `HLTHUNK_DEVICE_DONT_CARE` (4 in every published `hlthunk.h`).
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
pub(crate) struct HlThunk {
    _lib: libloading::Library,
    open: OpenFn,
    close: CloseFn,
    alloc: AllocFn,
    map: MapFn,
    unmap: UnmapFn,
    free: FreeFn,
    export: Option<ExportFn>,
}

static LIB: OnceLock<Result<Arc<HlThunk>, String>> = OnceLock::new();

fn load() -> Result<Arc<HlThunk>, String> {
    let mut last = String::new();
    for name in LIB_NAMES {
        // SAFETY: loading the Habana user-space library runs its initialisers, which only set
        // up its own state.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => {
                let get = |s: &str| -> Result<*const (), String> {
                    // SAFETY: looks a symbol up as a plain pointer; nothing is called.
                    unsafe { lib.get::<*const ()>(s.as_bytes()) }
                        .map(|p| *p)
                        .map_err(|e| format!("{s}: {e}"))
                };
                let (o, c, a, m, u, f) = (
                    get("hlthunk_open")?,
                    get("hlthunk_close")?,
                    get("hlthunk_device_memory_alloc")?,
                    get("hlthunk_device_memory_map")?,
                    get("hlthunk_memory_unmap")?,
                    get("hlthunk_device_memory_free")?,
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

/// The library, loaded once per process, or why it did not load.
pub(crate) fn lib() -> Result<Arc<HlThunk>, String> {
    LIB.get_or_init(load).clone()
}

/// An open Gaudi device (`hlthunk_open`), closed on drop.
pub(crate) struct Device {
    lib: Arc<HlThunk>,
    fd: c_int,
}

impl Device {
    /// Opens the first available device; the negative return of `hlthunk_open` on failure.
    pub(crate) fn open(lib: Arc<HlThunk>) -> Result<Self, c_int> {
        // SAFETY: a null busid means "any device"; the call returns an fd or a negative errno.
        let fd = unsafe { (lib.open)(HLTHUNK_DEVICE_DONT_CARE, std::ptr::null()) };
        if fd < 0 {
            return Err(fd);
        }
        Ok(Device { lib, fd })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: `fd` came from hlthunk_open and is closed once.
        if unsafe { (self.lib.close)(self.fd) } != 0 {
            tracing::warn!("hlthunk_close failed");
        }
    }
}

/// Contiguous device memory, allocated and mapped; unmapped and freed on drop.
pub(crate) struct DeviceMemory {
    dev: Arc<Device>,
    handle: u64,
    addr: u64,
    len: u64,
}

impl DeviceMemory {
    /// Allocates `len` bytes (a multiple of 4 KiB) and maps them; which step failed.
    pub(crate) fn new(dev: Arc<Device>, len: u64) -> Result<Self, &'static str> {
        // SAFETY: a live device fd; page size 0 = default, contiguous, not shared.
        let handle = unsafe { (dev.lib.alloc)(dev.fd, len, 0, true, false) };
        if handle == 0 {
            return Err("hlthunk_device_memory_alloc");
        }
        // SAFETY: maps the handle just allocated at an address of the driver's choosing.
        let addr = unsafe { (dev.lib.map)(dev.fd, handle, 0) };
        if addr == 0 {
            // SAFETY: frees the handle just allocated, once.
            unsafe { (dev.lib.free)(dev.fd, handle) };
            return Err("hlthunk_device_memory_map");
        }
        Ok(DeviceMemory {
            dev,
            handle,
            addr,
            len,
        })
    }

    /// The device virtual address.
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    /// Exports the mapping as a dma-buf: `Ok(None)` on libraries without the export, the
    /// negative return on failure.
    pub(crate) fn export_dmabuf(&self) -> Result<Option<OwnedFd>, c_int> {
        let Some(f) = self.dev.lib.export else {
            return Ok(None);
        };
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
            return Err(fd);
        }
        // SAFETY: a fresh descriptor nothing else owns.
        Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

impl Drop for DeviceMemory {
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
