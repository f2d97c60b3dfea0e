//! The CUDA context UCX's CUDA transports need.
//!
//! UCX's `cuda_copy`/`cuda_ipc` memory domains query pointer attributes and issue copies in the
//! calling thread's current CUDA context; with none current, registering VRAM fails
//! ("failed to insert region [0x0..0x0]"). As NIXL does, the first VRAM registration finds the
//! thread's current context (or retains the device's primary context and makes it current),
//! records it, and every thread that later takes a worker lock (posting, polling, the progress
//! threads) makes it current once. libcuda is loaded at run time; nothing here runs unless VRAM
//! is registered.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

type CuResult = i32;
type CuContext = *mut c_void;

struct Driver {
    _lib: libloading::Library,
    init: unsafe extern "C" fn(u32) -> CuResult,
    device_get: unsafe extern "C" fn(*mut i32, i32) -> CuResult,
    primary_retain: unsafe extern "C" fn(*mut CuContext, i32) -> CuResult,
    get_current: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    set_current: unsafe extern "C" fn(CuContext) -> CuResult,
}

// SAFETY: the driver's entry points are thread-safe C functions; the library handle is only
// kept alive.
unsafe impl Send for Driver {}
// SAFETY: as above.
unsafe impl Sync for Driver {}

static DRIVER: OnceLock<Option<Driver>> = OnceLock::new();
static CONTEXT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

thread_local! {
    static APPLIED: Cell<CuContext> = const { Cell::new(std::ptr::null_mut()) };
}

fn driver() -> Option<&'static Driver> {
    DRIVER
        .get_or_init(|| {
            // SAFETY: loading the NVIDIA driver library runs its initialisers, which have no
            // preconditions.
            let lib = unsafe { libloading::Library::new("libcuda.so.1") }.ok()?;
            // SAFETY: the symbols are the driver API's, with these C signatures (cuda.h); the
            // function pointers are used only while `_lib` (kept in the struct) is loaded.
            unsafe {
                Some(Driver {
                    init: *lib.get(b"cuInit\0").ok()?,
                    device_get: *lib.get(b"cuDeviceGet\0").ok()?,
                    primary_retain: *lib.get(b"cuDevicePrimaryCtxRetain\0").ok()?,
                    get_current: *lib.get(b"cuCtxGetCurrent\0").ok()?,
                    set_current: *lib.get(b"cuCtxSetCurrent\0").ok()?,
                    _lib: lib,
                })
            }
        })
        .as_ref()
}

/// Makes sure a CUDA context for `device` is current on this thread and recorded for the
/// worker threads. Called before registering VRAM.
pub(crate) fn ensure_context(device: u64) -> Result<(), String> {
    let d = driver().ok_or("libcuda.so.1 could not be loaded")?;
    let mut cur: CuContext = std::ptr::null_mut();
    // SAFETY: `cur` is a valid out-pointer.
    let r = unsafe { (d.get_current)(&mut cur) };
    if r != 0 || cur.is_null() {
        let ordinal = i32::try_from(device)
            .map_err(|_| format!("device id {device} is not a CUDA ordinal"))?;
        let mut dev = 0i32;
        // SAFETY: plain driver calls with valid out-pointers.
        let r = unsafe { (d.init)(0) };
        if r != 0 {
            return Err(format!("cuInit failed ({r})"));
        }
        // SAFETY: as above.
        let r = unsafe { (d.device_get)(&mut dev, ordinal) };
        if r != 0 {
            return Err(format!("cuDeviceGet({ordinal}) failed ({r})"));
        }
        // SAFETY: as above; the retained primary context lives for the process.
        let r = unsafe { (d.primary_retain)(&mut cur, dev) };
        if r != 0 || cur.is_null() {
            return Err(format!("cuDevicePrimaryCtxRetain({ordinal}) failed ({r})"));
        }
        // SAFETY: `cur` is a live context.
        let r = unsafe { (d.set_current)(cur) };
        if r != 0 {
            return Err(format!("cuCtxSetCurrent failed ({r})"));
        }
    }
    if CONTEXT
        .compare_exchange(
            std::ptr::null_mut(),
            cur,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
        && CONTEXT.load(Ordering::Acquire) != cur
    {
        tracing::warn!("VRAM of a second CUDA context registered; UCX's threads use the first (one agent per GPU)");
    }
    APPLIED.with(|a| a.set(cur));
    Ok(())
}

/// Makes the recorded context current on this thread, once (a no-op until VRAM is registered).
pub(crate) fn apply() {
    let ctx = CONTEXT.load(Ordering::Acquire);
    if ctx.is_null() || APPLIED.with(Cell::get) == ctx {
        return;
    }
    if let Some(d) = driver() {
        // SAFETY: `ctx` is a context retained for the life of the process.
        if unsafe { (d.set_current)(ctx) } == 0 {
            APPLIED.with(|a| a.set(ctx));
        }
    }
}
