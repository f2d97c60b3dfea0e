//! Finding and loading UCX at run time.
//!
//! Search order: the explicit path of [`crate::UcxParams::library_path`], then
//! `$NIXL_UCX_HOME`, then `$UCX_HOME`, then [`DEPS_HOME`] (where `scripts/deps/ucx.sh`
//! installs), then the system's `libucp.so.0`. A path may name a UCX prefix (holding `lib/libucp.so.0`), a `lib` directory,
//! or the `libucp` file itself. One process loads one UCX: the first successful load wins and a
//! later request for a different installation is refused (two UCX builds in one address space
//! would share sonames and mix modules).

use parking_lot::Mutex;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nixl_core::{Error, Result};

use crate::sys;

/// Where `scripts/deps/ucx.sh` installs UCX by default (searched after the environment).
pub const DEPS_HOME: &str = "/opt/nixl-deps/ucx/libucx";

/// The oldest UCX this crate supports (the headers the bindings come from).
pub const MIN_VERSION: (u32, u32) = (1, 13);

const INSTALL_HINT: &str =
    "install UCX >= 1.13: run scripts/deps/ucx.sh (the PyPI wheel libucx-cu13==1.22.0, \
     then set NIXL_UCX_HOME to the path it prints) or `apt-get install libucx0`, or point \
     UcxParams::library_path / UCX_HOME at a UCX installation";

/// A loaded UCX library.
pub(crate) struct Ucx {
    pub lib: sys::UcxLib,
    /// The `libucp` file that was opened.
    pub path: PathBuf,
    /// (major, minor, release).
    pub version: (u32, u32, u32),
}

impl std::fmt::Debug for Ucx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ucx")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

impl Ucx {
    /// `"1.22.0"`.
    pub(crate) fn version_string(&self) -> String {
        let (a, b, c) = self.version;
        format!("{a}.{b}.{c}")
    }

    /// Whether `ucp_ep_query` reports the transports of an endpoint (UCX >= 1.14).
    pub(crate) fn has_ep_transports(&self) -> bool {
        (self.version.0, self.version.1) >= (1, 14)
    }

    /// The text of a status code.
    pub(crate) fn status_string(&self, status: sys::ucs_status_t) -> String {
        sys::lib::status_string(&self.lib, status)
    }
}

static LOADED: Mutex<Option<Arc<Ucx>>> = Mutex::new(None);

fn candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut add_root = |p: &Path| {
        if p.is_file() {
            out.push(p.to_path_buf());
        } else {
            out.push(p.join("lib").join("libucp.so.0"));
            out.push(p.join("libucp.so.0"));
            out.push(p.join("libucx").join("lib").join("libucp.so.0"));
        }
    };
    if let Some(p) = explicit {
        add_root(p);
        return out;
    }
    for var in ["NIXL_UCX_HOME", "UCX_HOME"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            add_root(Path::new(&v));
        }
    }
    out.push(PathBuf::from(DEPS_HOME).join("lib").join("libucp.so.0"));
    out.push(PathBuf::from("libucp.so.0"));
    out
}

/// Loads UCX (once per process) from the first candidate that opens and is recent enough.
pub(crate) fn load(explicit: Option<&Path>) -> Result<Arc<Ucx>> {
    let mut slot = LOADED.lock();
    if let Some(u) = slot.as_ref() {
        if let Some(p) = explicit {
            let wanted: Vec<PathBuf> = candidates(Some(p))
                .into_iter()
                .filter_map(|c| c.canonicalize().ok())
                .collect();
            let have = u.path.canonicalize().unwrap_or_else(|_| u.path.clone());
            if !wanted.contains(&have) {
                return Err(Error::Unavailable {
                    what: format!("UCX from {}", p.display()),
                    hint: format!("this process already loaded UCX {} from {}; one process uses one UCX installation", u.version_string(), u.path.display()),
                });
            }
        }
        return Ok(u.clone());
    }
    let mut tried = Vec::new();
    for cand in candidates(explicit) {
        let is_bare = cand.parent().is_none_or(|p| p.as_os_str().is_empty());
        if !is_bare && !cand.exists() {
            tried.push(format!("{}: not found", cand.display()));
            continue;
        }
        match open(&cand) {
            Ok(u) => {
                tracing::info!(path = %u.path.display(), version = %u.version_string(), "UCX loaded");
                let u = Arc::new(u);
                *slot = Some(u.clone());
                return Ok(u);
            }
            Err(e) => tried.push(format!("{}: {e}", cand.display())),
        }
    }
    Err(Error::Unavailable {
        what: format!("UCX (tried {})", tried.join("; ")),
        hint: INSTALL_HINT.to_owned(),
    })
}

fn open(path: &Path) -> std::result::Result<Ucx, String> {
    let lib = sys::lib::load(path)?;
    let (major, minor, release) = sys::lib::version(&lib);
    if (major, minor) < MIN_VERSION {
        return Err(format!(
            "UCX {major}.{minor}.{release} is older than {}.{}",
            MIN_VERSION.0, MIN_VERSION.1
        ));
    }
    let path = resolved_path(&lib).unwrap_or_else(|| path.to_path_buf());
    check_not_mixed(&lib, &path)?;
    Ok(Ucx {
        lib,
        path,
        version: (major, minor, release),
    })
}

fn resolved_path(lib: &sys::UcxLib) -> Option<PathBuf> {
    sys::lib::file_of(lib.ucp_get_version as *const c_void)
}

/// Refuses a libucp whose libucs comes from another installation.
fn check_not_mixed(lib: &sys::UcxLib, ucp: &Path) -> std::result::Result<(), String> {
    let ucs = sys::lib::file_of(lib.ucs_status_string as *const c_void);
    if let (Some(ucs), Some(d1)) = (
        ucs,
        ucp.canonicalize()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf)),
    ) {
        let d2 = ucs
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        if d2.as_deref() != Some(d1.as_path()) {
            return Err(format!(
                "{} uses libucs from {} (mixed UCX installations)",
                ucp.display(),
                ucs.display()
            ));
        }
    }
    Ok(())
}
