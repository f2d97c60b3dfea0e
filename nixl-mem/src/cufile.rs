//! GPUDirect Storage (cuFile) through cudarc's run-time-loaded bindings, feature `cufile`: the
//! layer the `GDS` backend of nixl-backend-gds uses.
//!
//! [`open`] opens cuFile's driver once per process, guarded: libcufile's `cuFileDriverOpen`
//! spins forever when libcuda is absent, so the CUDA driver and a device are required first
//! ([`crate::cuda::driver`]), then libcufile and every symbol used (cudarc would panic on a
//! missing one). Anything missing is [`Error::Unavailable`] naming what to install.
//!
//! **Where libcufile is found.** cudarc loads it by name from the dynamic loader's path
//! (`LD_LIBRARY_PATH`, `ld.so.cache`): `libcufile.so`, then `libcufile.so.12`, `.so.11`,
//! `.so.10`, `.so.9`, `.so.1`. The CUDA toolkit's `lib64` has `libcufile.so` (package
//! `libcufile-dev`); where only the runtime's `libcufile.so.0` is installed (the
//! `nvidia/cuda` runtime images, the `nvidia-cufile` wheels), link `libcufile.so` to it in a
//! directory on `LD_LIBRARY_PATH`.
//!
//! **Options without touching the environment.** cuFile writes a log (`cufile.log`, in the
//! working directory by default). When the process environment has no `CUFILE_LOGFILE_PATH`,
//! [`Options::log_path`] is set with `cuFileSetParameterString(CUFILE_PARAM_ENV_LOGFILE_PATH)`;
//! [`Options::force_compat_mode`] with `cuFileSetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE)`.
//! Both need libcufile 1.14+ (CUDA 12.9); with an older library the log stays where cuFile's
//! defaults put it (set `CUFILE_LOGFILE_PATH` in the environment before starting the process to
//! move it), and `force_compat_mode` is honoured only if the environment already carries
//! `CUFILE_FORCE_COMPAT_MODE=true` (otherwise `NotSupported`). This crate never changes the
//! process environment.

use parking_lot::Mutex;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::Arc;

use nixl_core::{Error, Op, Result};

use crate::sys::cufile as sys;
pub use crate::sys::cufile::{
    hint, status, Batch, BatchEvent, BatchIo, BufRegistration, CufileError, Driver, FileHandle,
};

impl CufileError {
    /// Wraps the error into the workspace error of `backend` (`GDS`).
    pub fn into_error(self, agent: &str, backend: &str, op: Op) -> Error {
        Error::Backend {
            agent: agent.to_owned(),
            backend: backend.to_owned(),
            op,
            message: self.to_string(),
            source: Some(std::sync::Arc::new(self)),
        }
    }
}

/// How the process's cuFile driver is opened (only the first [`open`] of a process counts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Options {
    /// Where cuFile writes its log, when the environment has no `CUFILE_LOGFILE_PATH`
    /// (`None`: `$TMPDIR/nixl-cufile-<pid>.log`).
    pub log_path: Option<PathBuf>,
    /// Forces cuFile's compatibility mode (POSIX I/O inside cuFile).
    pub force_compat_mode: bool,
}

nixl_core::__setters!(Options {
    force_compat_mode: bool,
} some {
    log_path: PathBuf,
});

impl Driver {
    /// Whether the `nvidia-fs` kernel module is loaded (otherwise cuFile is in compatibility
    /// mode: POSIX I/O through its own bounce buffers).
    pub fn nvidia_fs(&self) -> bool {
        self.nvidia_fs
    }

    /// How compatibility mode was forced at open, if it was.
    pub fn forced_compat(&self) -> Option<&'static str> {
        self.forced_compat
    }

    /// The log path this crate set through cuFile's parameter API, if it set one.
    pub fn log_path(&self) -> Option<&PathBuf> {
        self.log.as_ref()
    }
}

type Opened = std::result::Result<Arc<Driver>, (String, String)>;

/// The process's driver once an open ran (successful or not: a missing library stays missing).
static DRIVER: Mutex<Option<Opened>> = Mutex::new(None);

fn unavailable(what: &str, hint: impl Into<String>) -> (String, String) {
    (what.to_owned(), hint.into())
}

/// Loads and opens cuFile once per process (see the module docs); later calls return the same
/// driver, or the same reason it is unavailable. `NotSupported` (not remembered) when
/// `force_compat_mode` cannot be honoured.
pub fn open(opts: &Options) -> Result<Arc<Driver>> {
    let mut g = DRIVER.lock();
    if let Some(r) = &*g {
        return r
            .clone()
            .map_err(|(what, hint)| Error::Unavailable { what, hint });
    }
    match try_open(opts) {
        Err(Refused::NotSupported(e)) => Err(e),
        Err(Refused::Unavailable(u)) => {
            *g = Some(Err(u.clone()));
            Err(Error::Unavailable {
                what: u.0,
                hint: u.1,
            })
        }
        Ok(d) => {
            *g = Some(Ok(d.clone()));
            Ok(d)
        }
    }
}

/// The driver if an earlier [`open`] succeeded (never opens it).
pub fn opened() -> Option<Arc<Driver>> {
    DRIVER
        .lock()
        .as_ref()
        .and_then(|r| r.as_ref().ok().cloned())
}

enum Refused {
    Unavailable((String, String)),
    NotSupported(Error),
}

fn try_open(opts: &Options) -> std::result::Result<Arc<Driver>, Refused> {
    // 1. The CUDA driver and a device, before cuFile (cuFileDriverOpen spins without them).
    crate::cuda::driver().map_err(|e| {
        Refused::Unavailable(match e.into_unavailable() {
            Ok(parts) => parts,
            Err(other) => unavailable("the CUDA driver", other.to_string()),
        })
    })?;
    // 2. libcufile and its symbols.
    match sys::missing() {
        None => {}
        Some(s) if s.is_empty() => {
            return Err(Refused::Unavailable(unavailable(
                "libcufile (GPUDirect Storage)",
                "install the CUDA toolkit's cuFile (libcufile-dev has libcufile.so) and put its \
                 lib64 on LD_LIBRARY_PATH, or link libcufile.so to libcufile.so.0 in a directory \
                 on LD_LIBRARY_PATH (cudarc loads libcufile.so, .so.12, .so.11, .so.10, .so.9 or .so.1)",
            )))
        }
        Some(s) => {
            return Err(Refused::Unavailable(unavailable(
                "libcufile",
                format!("missing symbol {s} (libcufile 1.5+ needed)"),
            )))
        }
    }
    // 3. Compatibility mode, if forced: cuFile's parameter API, or the environment.
    let mut forced_compat = None;
    if opts.force_compat_mode {
        match sys::force_compat_mode() {
            Ok(true) => {
                forced_compat = Some("cuFileSetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE)")
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "cuFile: setting FORCE_COMPAT_MODE failed"),
        }
        if forced_compat.is_none() {
            let env = std::env::var("CUFILE_FORCE_COMPAT_MODE").unwrap_or_default();
            if env.eq_ignore_ascii_case("true") {
                forced_compat = Some("CUFILE_FORCE_COMPAT_MODE=true (environment)");
            } else {
                return Err(Refused::NotSupported(Error::not_supported(
                    "",
                    Op::CreateBackend,
                    "force_compat_mode needs libcufile >= 1.14 (cuFileSetParameterBool) or \
                     CUFILE_FORCE_COMPAT_MODE=true in the environment the process started with",
                )));
            }
        }
    }
    // 4. cuFile writes a log to the working directory unless told otherwise.
    let mut log = None;
    if std::env::var_os("CUFILE_LOGFILE_PATH").is_none() {
        let path = opts.log_path.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("nixl-cufile-{}.log", std::process::id()))
        });
        match CString::new(path.as_os_str().as_encoded_bytes()) {
            Ok(c) => match sys::set_log_path(&c) {
                Ok(true) => {
                    tracing::debug!(path = %path.display(), "cuFile: log path set");
                    log = Some(path);
                }
                Ok(false) => tracing::debug!(
                    "cuFile: libcufile < 1.14 has no parameter API; its log stays at its default \
                     (set CUFILE_LOGFILE_PATH before starting the process to move it)"
                ),
                Err(e) => tracing::warn!(error = %e, "cuFile: setting the log path failed"),
            },
            Err(_) => tracing::warn!(path = %path.display(), "cuFile: log path has a NUL byte"),
        }
    }
    // 5. Open.
    sys::driver_open()
        .map_err(|e| Refused::Unavailable(unavailable("the cuFile driver", e.to_string())))?;
    let nvidia_fs = std::path::Path::new("/proc/driver/nvidia-fs/stats").exists()
        || std::path::Path::new("/sys/module/nvidia_fs").exists();
    Ok(Arc::new(Driver {
        nvidia_fs,
        forced_compat,
        log,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_code_and_the_vm_disk_error() {
        let e = CufileError::new("cuFileHandleRegister", 5027, 0);
        assert!(e.hint().contains("CU_FILE_HANDLE_NOT_REGISTERED"));
        let s = e.to_string();
        assert!(
            s.contains("cuFileHandleRegister failed: cuFile error 5027"),
            "{s}"
        );
        assert!(hint(5020).contains("CU_FILE_DIO_NOT_SET"));
        assert_eq!(hint(0), "");
        assert_eq!(hint(1), "");
        let err = e.into_error("a", "GDS", Op::RegisterMem);
        assert_eq!(err.kind().as_str(), "backend");
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn without_cuda_or_cufile_open_is_unavailable_and_remembered() {
        let env_before = std::env::var_os("CUFILE_LOGFILE_PATH");
        if crate::cuda::is_available() {
            eprintln!("CUDA present: the GDS tests of nixl-backend-gds open cuFile");
            return;
        }
        for _ in 0..2 {
            match open(&Options::default()) {
                Err(Error::Unavailable { what, hint }) => {
                    assert!(!what.is_empty() && !hint.is_empty());
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
        }
        assert!(opened().is_none());
        // The environment is never changed by an open.
        assert_eq!(std::env::var_os("CUFILE_LOGFILE_PATH"), env_before);
    }
}
