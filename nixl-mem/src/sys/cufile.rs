//! GPUDirect Storage through cudarc's run-time-loaded `cufile` bindings: presence and symbol
//! checks, parameters, opening the driver, and the owning types of registered buffers, file
//! handles and batches.
//!
//! cudarc panics on a missing library or symbol, so [`missing`] is checked before any call,
//! and the two parameter functions of libcufile 1.14+ are looked up before each use.

use std::ffi::{c_void, CStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;

use cudarc::cufile::sys as cf;

/// Every libcufile symbol the crate calls unconditionally.
const SYMBOLS: &[&str] = &[
    "cuFileDriverOpen",
    "cuFileHandleRegister",
    "cuFileHandleDeregister",
    "cuFileBufRegister",
    "cuFileBufDeregister",
    "cuFileRead",
    "cuFileWrite",
    "cuFileBatchIOSetUp",
    "cuFileBatchIOSubmit",
    "cuFileBatchIOGetStatus",
    "cuFileBatchIOCancel",
    "cuFileBatchIODestroy",
];

/// `CUfileStatus_t` values of a batch entry (read as numbers: cuFile writes them).
pub mod status {
    /// `CUFILE_WAITING`.
    pub const WAITING: u32 = 0x01;
    /// `CUFILE_PENDING`.
    pub const PENDING: u32 = 0x02;
    /// `CUFILE_INVALID`.
    pub const INVALID: u32 = 0x04;
    /// `CUFILE_CANCELED`.
    pub const CANCELED: u32 = 0x08;
    /// `CUFILE_COMPLETE`.
    pub const COMPLETE: u32 = 0x10;
    /// `CUFILE_TIMEOUT`.
    pub const TIMEOUT: u32 = 0x20;
    /// `CUFILE_FAILED`.
    pub const FAILED: u32 = 0x40;
}

/// Whether libcufile loads (tried once per process).
fn present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen cudarc's candidate library names; no symbol is called.
    *PRESENT.get_or_init(|| unsafe { cf::is_culib_present() })
}

/// `None` when libcufile loads and has every symbol of [`SYMBOLS`]; else what is missing (an
/// empty string: the library itself).
pub(crate) fn missing() -> Option<String> {
    if !present() {
        return Some(String::new());
    }
    SYMBOLS
        .iter()
        .find(|s| !has_symbol(s))
        .map(|s| (*s).to_owned())
}

/// Whether libcufile exports `name` (false when it does not load).
pub(crate) fn has_symbol(name: &str) -> bool {
    if !present() {
        return false;
    }
    // SAFETY: present (checked), so `culib` loads instead of panicking; a lookup calls nothing.
    unsafe { cf::culib().get::<*const ()>(name.as_bytes()) }.is_ok()
}

fn result(call: &'static str, st: cf::CUfileError_t) -> Result<(), CufileError> {
    if st.err == cf::CUfileOpError::CU_FILE_SUCCESS {
        return Ok(());
    }
    Err(CufileError::new(call, st.err as u32, st.cu_err as u32))
}

/// `cuFileSetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE, true)`; `Ok(false)` where the
/// library has no parameter API (libcufile < 1.14). Before the driver opens.
pub(crate) fn force_compat_mode() -> Result<bool, CufileError> {
    if !has_symbol("cuFileSetParameterBool") {
        return Ok(false);
    }
    // SAFETY: the symbol exists (checked); the driver is not open yet, which is when cuFile
    // takes parameters (it returns an error otherwise).
    let st = unsafe {
        cf::cuFileSetParameterBool(
            cf::CUFileBoolConfigParameter_t::CUFILE_PARAM_FORCE_COMPAT_MODE,
            true,
        )
    };
    result("cuFileSetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE)", st).map(|()| true)
}

/// `cuFileSetParameterString(CUFILE_PARAM_ENV_LOGFILE_PATH, path)` (what the
/// `CUFILE_LOGFILE_PATH` variable sets); `Ok(false)` where the library has no parameter API.
pub(crate) fn set_log_path(path: &CStr) -> Result<bool, CufileError> {
    if !has_symbol("cuFileSetParameterString") {
        return Ok(false);
    }
    // SAFETY: the symbol exists (checked); `path` is NUL-terminated and outlives the call
    // (cuFile copies it); the driver is not open yet.
    let st = unsafe {
        cf::cuFileSetParameterString(
            cf::CUFileStringConfigParameter_t::CUFILE_PARAM_ENV_LOGFILE_PATH,
            path.as_ptr(),
        )
    };
    result(
        "cuFileSetParameterString(CUFILE_PARAM_ENV_LOGFILE_PATH)",
        st,
    )
    .map(|()| true)
}

/// `cuFileDriverOpen`. The caller checked [`missing`] and that the CUDA driver loads and has
/// a device: libcufile's open spins forever without them.
pub(crate) fn driver_open() -> Result<(), CufileError> {
    // SAFETY: the symbol exists; the CUDA driver and a device are present (caller), which is
    // what cuFileDriverOpen needs to return instead of spinning.
    result("cuFileDriverOpen", unsafe { cf::cuFileDriverOpen() })
}

/// Memory registered with `cuFileBufRegister`, deregistered on drop.
#[derive(Debug)]
pub struct BufRegistration {
    addr: u64,
}

impl BufRegistration {
    /// Registers `[addr, addr+len)` (DRAM or VRAM; VRAM in the current context).
    ///
    /// # Safety
    /// The range is memory that stays alive until the value is dropped.
    pub unsafe fn new(_driver: &Driver, addr: u64, len: usize) -> Result<Self, CufileError> {
        // SAFETY: the driver is open (a `Driver` exists); the caller keeps the range alive
        // until Drop deregisters it; cuFile only records and pins it.
        let st = unsafe { cf::cuFileBufRegister(addr as *const c_void, len, 0) };
        result("cuFileBufRegister", st)?;
        Ok(BufRegistration { addr })
    }

    /// The registered start address (the base cuFile's I/O takes).
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

impl Drop for BufRegistration {
    fn drop(&mut self) {
        // SAFETY: registered by `new`, deregistered once.
        let st = unsafe { cf::cuFileBufDeregister(self.addr as *const c_void) };
        if let Err(e) = result("cuFileBufDeregister", st) {
            tracing::warn!(error = %e, "cuFileBufDeregister failed");
        }
    }
}

/// A file registered with `cuFileHandleRegister`; owns the descriptor it was made from
/// (closed after the handle is deregistered, on drop).
pub struct FileHandle {
    handle: cf::CUfileHandle_t,
    fd: OwnedFd,
}

// SAFETY: a cuFile handle is an opaque token cuFile allows using from any thread ("all APIs
// are thread-safe"); the descriptor is owned.
unsafe impl Send for FileHandle {}
// SAFETY: as above.
unsafe impl Sync for FileHandle {}

impl std::fmt::Debug for FileHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileHandle").field("fd", &self.fd).finish()
    }
}

impl FileHandle {
    /// Registers `fd`; on failure the error and the descriptor back.
    pub fn register(_driver: &Driver, fd: OwnedFd) -> Result<Self, (CufileError, OwnedFd)> {
        let mut descr = cf::CUfileDescr_t {
            type_: cf::CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            handle: cf::CUfileDescr_t__bindgen_ty_1 { fd: fd.as_raw_fd() },
            fs_ops: std::ptr::null(),
        };
        let mut handle: cf::CUfileHandle_t = std::ptr::null_mut();
        // SAFETY: the driver is open; both pointers are valid for the call; the descriptor
        // stays open as long as the handle (both owned by the value).
        let st = unsafe { cf::cuFileHandleRegister(&mut handle, &mut descr) };
        match result("cuFileHandleRegister", st) {
            Ok(()) => Ok(FileHandle { handle, fd }),
            Err(e) => Err((e, fd)),
        }
    }

    /// The registered descriptor.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// `cuFileRead` of `len` bytes at `file_off` into `base + buf_off`: bytes read, -1 with
    /// `errno` set, or minus a cuFile error.
    ///
    /// # Safety
    /// `base` is a buffer (registered with cuFile, or any device or host memory cuFile
    /// accepts) alive and not otherwise accessed until this returns, with at least
    /// `buf_off + len` bytes; VRAM in the current context.
    pub unsafe fn read(&self, base: u64, len: usize, file_off: i64, buf_off: i64) -> isize {
        // SAFETY: the caller guarantees the buffer; the handle is registered.
        unsafe { cf::cuFileRead(self.handle, base as *mut c_void, len, file_off, buf_off) }
    }

    /// `cuFileWrite`, as [`FileHandle::read`] the other way.
    ///
    /// # Safety
    /// As [`FileHandle::read`]; cuFile only reads the buffer.
    pub unsafe fn write(&self, base: u64, len: usize, file_off: i64, buf_off: i64) -> isize {
        // SAFETY: the caller guarantees the buffer; the handle is registered.
        unsafe { cf::cuFileWrite(self.handle, base as *const c_void, len, file_off, buf_off) }
    }
}

impl Drop for FileHandle {
    fn drop(&mut self) {
        // SAFETY: registered once by `register`; the owner drops it only when no I/O uses it.
        unsafe { cf::cuFileHandleDeregister(self.handle) };
    }
}

/// One entry of a batch submission.
#[derive(Debug, Clone, Copy)]
pub struct BatchIo<'a> {
    /// The registered file.
    pub file: &'a FileHandle,
    /// The buffer's registered base.
    pub base: u64,
    /// Offset of the I/O inside the buffer.
    pub buf_off: i64,
    /// Offset in the file.
    pub file_off: i64,
    /// Bytes.
    pub len: usize,
    /// WRITE (buffer to file) or READ.
    pub write: bool,
    /// Returned in the entry's event.
    pub cookie: usize,
}

/// A completed (or failed) batch entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEvent {
    /// The entry's cookie.
    pub cookie: usize,
    /// Its `CUfileStatus_t` (`COMPLETE` = 0x10, `FAILED` = 0x40, ...).
    pub status: u32,
    /// Bytes done, or a negative error.
    pub ret: isize,
}

/// A cuFile batch (`cuFileBatchIOSetUp`) of up to `cap` entries in flight, destroyed on drop.
pub struct Batch {
    handle: cf::CUfileBatchHandle_t,
    cap: usize,
    params: Vec<cf::CUfileIOParams_t>,
    events: Vec<MaybeUninit<cf::CUfileIOEvents_t>>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("cap", &self.cap)
            .finish_non_exhaustive()
    }
}

// SAFETY: the batch handle is an opaque token usable from any thread; the owner serialises
// its use (`&mut self` methods).
unsafe impl Send for Batch {}

impl Batch {
    /// Sets up a batch of `cap` entries (within cuFile's `max_batch_io_size`).
    pub fn new(_driver: &Driver, cap: usize) -> Result<Self, CufileError> {
        let mut handle: cf::CUfileBatchHandle_t = std::ptr::null_mut();
        let nr = u32::try_from(cap).unwrap_or(u32::MAX);
        // SAFETY: the driver is open; the out-pointer is valid.
        result("cuFileBatchIOSetUp", unsafe {
            cf::cuFileBatchIOSetUp(&mut handle, nr)
        })?;
        Ok(Batch {
            handle,
            cap,
            params: Vec::with_capacity(cap),
            events: (0..cap).map(|_| MaybeUninit::uninit()).collect(),
        })
    }

    /// Entries it takes at once.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Submits `ios` (at most the capacity, with none in flight).
    ///
    /// # Safety
    /// Every buffer range is alive and (for a READ) not otherwise accessed until its entry
    /// has completed (a [`BatchEvent`] for it came back, or a cancel was waited for), and
    /// every file stays registered until then.
    pub unsafe fn submit(&mut self, ios: &[BatchIo<'_>]) -> Result<(), CufileError> {
        if ios.len() > self.cap {
            return Err(CufileError::new(
                "cuFileBatchIOSubmit",
                cf::CUfileOpError::CU_FILE_INVALID_VALUE as u32,
                0,
            ));
        }
        self.params.clear();
        for io in ios {
            self.params.push(cf::CUfileIOParams_t {
                mode: cf::CUfileBatchMode_t::CUFILE_BATCH,
                u: cf::CUfileIOParams__bindgen_ty_1 {
                    batch: cf::CUfileIOParams__bindgen_ty_1__bindgen_ty_1 {
                        devPtr_base: io.base as *mut c_void,
                        file_offset: io.file_off,
                        devPtr_offset: io.buf_off,
                        size: io.len,
                    },
                },
                fh: io.file.handle,
                opcode: if io.write {
                    cf::CUfileOpcode_t::CUFILE_WRITE
                } else {
                    cf::CUfileOpcode_t::CUFILE_READ
                },
                cookie: io.cookie as *mut c_void,
            });
        }
        let n = self.params.len() as u32;
        // SAFETY: `params` holds `n <= cap` entries naming buffers and files the caller keeps
        // alive until completion; the batch was set up for `cap` entries.
        result("cuFileBatchIOSubmit", unsafe {
            cf::cuFileBatchIOSubmit(self.handle, n, self.params.as_mut_ptr(), 0)
        })
    }

    /// Collects finished entries without waiting (zero timeout) into `out` (cleared first).
    pub fn poll(&mut self, out: &mut Vec<BatchEvent>) -> Result<(), CufileError> {
        out.clear();
        let mut nr = self.cap as u32;
        let mut ts = cf::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `events` has room for `cap` entries and `nr` says so; a zero timeout polls.
        result("cuFileBatchIOGetStatus", unsafe {
            cf::cuFileBatchIOGetStatus(
                self.handle,
                0,
                &mut nr,
                self.events.as_mut_ptr().cast(),
                &mut ts,
            )
        })?;
        for ev in &self.events[..(nr as usize).min(self.cap)] {
            let p = ev.as_ptr();
            // SAFETY: cuFile wrote the first `nr` events. Each field is read through a raw
            // pointer as plain data (the status as its 4-byte number, so a value outside
            // cudarc's enum is no invalid enum).
            let (cookie, status, ret) = unsafe {
                (
                    std::ptr::addr_of!((*p).cookie).read(),
                    std::ptr::addr_of!((*p).status).cast::<u32>().read(),
                    std::ptr::addr_of!((*p).ret).read(),
                )
            };
            out.push(BatchEvent {
                cookie: cookie as usize,
                status,
                ret: ret as isize,
            });
        }
        Ok(())
    }

    /// Asks cuFile to stop the entries in flight (they still report an event).
    pub fn cancel(&mut self) -> Result<(), CufileError> {
        // SAFETY: the handle is valid.
        result("cuFileBatchIOCancel", unsafe {
            cf::cuFileBatchIOCancel(self.handle)
        })
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: set up once by `new`; the owner drops it only with nothing in flight (it
        // leaks the batch otherwise).
        unsafe { cf::cuFileBatchIODestroy(self.handle) };
    }
}

/// A failed cuFile call: the function, the `CUfileOpError` and the `CUresult` behind it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: cuFile error {code}{} (CUresult {cu_code})", hint(*.code))]
pub struct CufileError {
    /// The cuFile function.
    pub call: &'static str,
    /// The `CUfileOpError` (0 success, 5000 + n the cuFile errors).
    pub code: u32,
    /// The `CUresult` when `code` is `CU_FILE_CUDA_DRIVER_ERROR` (5011).
    pub cu_code: u32,
}

impl CufileError {
    pub(crate) fn new(call: &'static str, code: u32, cu_code: u32) -> Self {
        CufileError {
            call,
            code,
            cu_code,
        }
    }

    /// `" (CU_FILE_X: text)"` for the code, or `""` when not listed.
    pub fn hint(&self) -> &'static str {
        hint(self.code)
    }
}

/// The name and text of a `CUfileOpError` (cufile.h's `CUFILE_OP` table), as
/// `" (CU_FILE_X: text)"`, or an empty string for a code not listed.
pub fn hint(code: u32) -> &'static str {
    match code.wrapping_sub(5000) {
        1 => " (CU_FILE_DRIVER_NOT_INITIALIZED: nvidia-fs driver is not loaded)",
        7 => " (CU_FILE_PLATFORM_NOT_SUPPORTED: GPUDirect Storage not supported on current platform)",
        8 => " (CU_FILE_IO_NOT_SUPPORTED: GPUDirect Storage not supported on current file)",
        9 => " (CU_FILE_DEVICE_NOT_SUPPORTED: GPUDirect Storage not supported on current GPU)",
        10 => " (CU_FILE_NVFS_DRIVER_ERROR: nvidia-fs driver ioctl error)",
        11 => " (CU_FILE_CUDA_DRIVER_ERROR: CUDA Driver API error)",
        18 => " (CU_FILE_INVALID_FILE_TYPE: unsupported file type)",
        19 => " (CU_FILE_INVALID_FILE_OPEN_FLAG: unsupported file open flags)",
        20 => " (CU_FILE_DIO_NOT_SET: fd direct IO not set)",
        22 => " (CU_FILE_INVALID_VALUE: invalid arguments)",
        25 => " (CU_FILE_PERMISSION_DENIED: driver or file access error)",
        27 => " (CU_FILE_HANDLE_NOT_REGISTERED: file descriptor is not registered; cufile.log may say more, e.g. cufio-fs: error getting volume attributes)",
        28 => " (CU_FILE_HANDLE_ALREADY_REGISTERED: file descriptor is already registered)",
        29 => " (CU_FILE_DEVICE_NOT_FOUND: GPU device not found)",
        30 => " (CU_FILE_INTERNAL_ERROR: internal error)",
        34 => " (CU_FILE_IO_DISABLED: GPUDirect Storage disabled by config on current file)",
        _ => "",
    }
}

/// The opened cuFile driver of the process (cuFile's driver state is process-global).
#[derive(Debug)]
pub struct Driver {
    pub(crate) nvidia_fs: bool,
    pub(crate) forced_compat: Option<&'static str>,
    pub(crate) log: Option<std::path::PathBuf>,
}
