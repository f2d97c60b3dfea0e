//! Safe wrappers over loading `libucp` and the library-level calls.

use core::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};

use super::*;

/// Opens `libucp` at `path`.
pub(crate) fn load(path: &Path) -> Result<UcxLib, String> {
    // SAFETY: loading libucp runs UCX's library constructors, which only initialise UCX's
    // own global state; `--dynamic-link-require-all` makes this fail (instead of panicking
    // later) when any function of the 1.13 API is missing.
    unsafe { UcxLib::new(path.as_os_str()) }.map_err(|e| e.to_string())
}

/// `ucp_get_version`: (major, minor, release).
pub(crate) fn version(lib: &UcxLib) -> (u32, u32, u32) {
    let (mut major, mut minor, mut release) = (0u32, 0u32, 0u32);
    // SAFETY: the three out-pointers are valid for writes.
    unsafe { lib.ucp_get_version(&mut major, &mut minor, &mut release) };
    (major, minor, release)
}

/// The text of a status code.
pub(crate) fn status_string(lib: &UcxLib, status: ucs_status_t) -> String {
    // SAFETY: ucs_status_string accepts any status value and returns a pointer to a static
    // NUL-terminated string (or "unknown").
    let p = unsafe { lib.ucs_status_string(status) };
    if p.is_null() {
        return format!("UCS status {status}");
    }
    // SAFETY: p is a non-null static C string owned by UCX.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The file a loaded function lives in (`dladdr`).
pub(crate) fn file_of(f: *const c_void) -> Option<PathBuf> {
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads the address and writes the out-struct, which is valid.
    let ok = unsafe { dladdr(f, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the dynamic loader.
    let s = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    Some(PathBuf::from(s))
}
