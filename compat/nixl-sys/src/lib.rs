//! # nixl-rs-sys: nixl-sys's API on nixl-rs
//!
//! The public Rust API of [`nixl-sys`](https://crates.io/crates/nixl-sys) 1.5.2 (the FFI crate
//! over NIXL's C++ library that Dynamo's KV block manager uses): the same paths, type and
//! function names, signatures, traits, error enum and status semantics, implemented natively
//! on nixl-rs. A program switches with one line of its `Cargo.toml`:
//!
//! ```toml
//! nixl-sys = { package = "nixl-rs-sys", version = "0.1" }
//! ```
//!
//! and needs no NIXL library, plugin directory or matching UCX build beside it (UCX itself is
//! still loaded at run time, as nixl-rs's UCX backend does). `docs/nixl-sys.md` in the
//! repository is the migration page: what behaves better, and what differs, item by item.
//!
//! What maps where:
//!
//! - plugins are nixl-rs backends by NIXL's names: `UCX`, `LIBFABRIC`, `POSIX`, `GDS`, `OBJ`
//!   (S3), and `CUDA_IPC` (which NIXL has not), per cargo feature;
//! - metadata is NIXL's wire format ([`Agent::get_local_md`]), so a stock NIXL agent loads it
//!   and this crate loads a stock NIXL agent's; the side channel (`send_local_md` with an
//!   address, the listener of [`AgentConfig::enable_listen_thread`]) and etcd (under
//!   `NIXL_ETCD_ENDPOINTS`, NIXL's keys) speak NIXL's protocols;
//! - every error is one of nixl-sys's [`NixlError`] variants, mapped as NIXL's C API maps its
//!   statuses (`INVALID_PARAM`, `NOT_FOUND`, the rest `BackendError`); [`last_error`] says
//!   what nixl-rs reported, with its typed kind. What nixl-rs cannot do (device-side memory
//!   views) is an error, never a panic or a silent no-op.
//!
//! One trust rule is nixl-sys's own and stays: [`Agent::register_memory`] takes any
//! [`NixlDescriptor`], whose pointer and size the agent trusts for as long as the registration
//! lives (nixl-sys's signature gives no other way). [`SystemStorage`] is owned by nixl-rs
//! instead: its bytes stay alive while any request uses them, even past the storage's drop.

// Library code returns its errors or says why a value is there; unit tests may unwrap (clippy.toml).
#![warn(clippy::unwrap_used, clippy::expect_used)]
// `unsafe` lives in `storage` alone (its header says why).
#![deny(unsafe_code)]
// nixl-sys's names: `Params::from`/`Params::clone` return `Result`, `len()` returns `Result`.
#![allow(clippy::should_implement_trait, clippy::len_without_is_empty)]

use std::cell::RefCell;
use std::collections::BTreeMap;

use thiserror::Error;

mod agent;
mod comm;
mod descriptors;
mod exchange;
mod notify;
mod storage;
mod utils;
mod xfer;

pub use agent::*;
pub use descriptors::*;
pub use notify::*;
pub use storage::*;
pub use utils::*;
pub use xfer::*;

/// nixl-sys's status codes (NIXL's C API), for code that compares them.
pub const NIXL_CAPI_SUCCESS: i32 = 0;
/// The operation is still in progress.
pub const NIXL_CAPI_IN_PROG: i32 = 1;
/// A parameter was invalid.
pub const NIXL_CAPI_ERROR_INVALID_PARAM: i32 = -1;
/// A backend failed.
pub const NIXL_CAPI_ERROR_BACKEND: i32 = -2;
/// Telemetry is off, or the transfer is not complete.
pub const NIXL_CAPI_ERROR_NO_TELEMETRY: i32 = -5;
/// Agent metadata not loaded, or no backend serves the request.
pub const NIXL_CAPI_ERROR_NOT_FOUND: i32 = -6;

/// Errors that can occur when using NIXL (nixl-sys's enum, unchanged). [`last_error`] gives
/// nixl-rs's own report of the latest one on this thread.
#[derive(Error, Debug)]
pub enum NixlError {
    /// A parameter is invalid (NIXL `INVALID_PARAM`).
    #[error("Invalid parameter provided to NIXL")]
    InvalidParam,
    /// Anything else nixl-rs reported: a backend, a dead peer, a deadline (see [`last_error`]).
    #[error("Backend error occurred")]
    BackendError,
    /// A string has a NUL byte.
    #[error("Failed to create CString from input: {0}")]
    StringConversionError(#[from] std::ffi::NulError),
    /// An index is out of bounds.
    #[error("Index out of bounds")]
    IndexOutOfBounds,
    /// A data pointer is invalid.
    #[error("Invalid data pointer")]
    InvalidDataPointer,
    /// A transfer request could not be made (see [`last_error`]).
    #[error("Failed to create XferRequest")]
    FailedToCreateXferRequest,
    /// A registration list could not be made (or decoded).
    #[error("Failed to create registration descriptor list")]
    RegDescListCreationFailed,
    /// A registration descriptor could not be added.
    #[error("Failed to add registration descriptor")]
    RegDescAddFailed,
    /// A transfer list could not be made (or decoded).
    #[error("Failed to create XferDlistHandle")]
    FailedToCreateXferDlistHandle,
    /// A backend could not be made.
    #[error("Failed to create backend")]
    FailedToCreateBackend,
    /// Telemetry is off, or the transfer is still in flight.
    #[error("Telemetry is not enabled or transfer is not complete")]
    NoTelemetry,
    /// An agent or registration is not known (NIXL `NOT_FOUND`).
    #[error("Not found")]
    NotFound,
}

/// What nixl-rs reported for the latest error this crate returned on this thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastError {
    /// nixl-rs's typed kind (`RemoteDisconnect`, `TimedOut`, `NotSupported`, ...).
    pub kind: nixl::ErrorKind,
    /// Its message: agent, operation and reason.
    pub message: String,
}

impl std::fmt::Display for LastError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.as_str())
    }
}

thread_local! {
    static LAST: RefCell<Option<LastError>> = const { RefCell::new(None) };
}

/// nixl-rs's report of the latest error this crate returned on the calling thread (nixl-sys's
/// [`NixlError`] carries no detail: `BackendError` may be a dead peer, a deadline or a path
/// nixl-rs does not have).
pub fn last_error() -> Option<LastError> {
    LAST.with(|l| l.borrow().clone())
}

/// Maps a nixl-rs error as NIXL's C API maps its statuses, and keeps the report.
pub(crate) fn map_err(e: nixl::Error) -> NixlError {
    let kind = e.kind();
    tracing::debug!(error = %e, "nixl-rs-sys: call failed");
    LAST.with(|l| {
        *l.borrow_mut() = Some(LastError {
            kind,
            message: e.to_string(),
        })
    });
    match kind {
        nixl::ErrorKind::InvalidParam => NixlError::InvalidParam,
        nixl::ErrorKind::NotFound => NixlError::NotFound,
        _ => NixlError::BackendError,
    }
}

/// Records an error this crate decided itself (no nixl-rs call behind it).
pub(crate) fn refuse(kind: nixl::ErrorKind, message: String, err: NixlError) -> NixlError {
    tracing::debug!(%message, "nixl-rs-sys: refused");
    LAST.with(|l| *l.borrow_mut() = Some(LastError { kind, message }));
    err
}

/// The memory types a backend takes (nixl-sys's `MemList`).
#[derive(Debug, Clone, Default)]
pub struct MemList {
    kinds: Vec<MemType>,
}

impl MemList {
    pub(crate) fn from_kinds(kinds: impl IntoIterator<Item = nixl::MemKind>) -> Self {
        MemList {
            kinds: kinds.into_iter().map(MemType::from_kind).collect(),
        }
    }

    /// Returns true if the memory list is empty.
    pub fn is_empty(&self) -> Result<bool, NixlError> {
        Ok(self.kinds.is_empty())
    }

    /// Returns the number of memory types in the list.
    pub fn len(&self) -> Result<usize, NixlError> {
        Ok(self.kinds.len())
    }

    /// Returns the memory type at the given index (`InvalidParam` past the end).
    pub fn get(&self, index: usize) -> Result<MemType, NixlError> {
        self.kinds
            .get(index)
            .copied()
            .ok_or(NixlError::InvalidParam)
    }

    /// Returns an iterator over the memory types.
    pub fn iter(&self) -> MemListIterator<'_> {
        MemListIterator {
            list: self,
            index: 0,
        }
    }
}

/// An iterator over memory types in a [`MemList`].
#[derive(Debug)]
pub struct MemListIterator<'a> {
    list: &'a MemList,
    index: usize,
}

impl Iterator for MemListIterator<'_> {
    type Item = Result<MemType, NixlError>;

    fn next(&mut self) -> Option<Self::Item> {
        let v = self.list.kinds.get(self.index).copied()?;
        self.index += 1;
        Some(Ok(v))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining = self.list.kinds.len().saturating_sub(self.index);
        (remaining, Some(remaining))
    }
}

/// A registration: deregistered by [`RegistrationHandle::deregister`] or on drop.
#[derive(Debug)]
pub struct RegistrationHandle {
    agent: Option<Agent>,
    reg: Option<nixl::Registration>,
    ptr: usize,
    size: usize,
    dev_id: u64,
    mem_type: MemType,
}

impl RegistrationHandle {
    /// The name of the agent the memory is registered with (`None` once deregistered).
    pub fn agent_name(&self) -> Option<String> {
        self.agent.as_ref().map(Agent::name)
    }

    /// Deregisters the memory. Refused while a request still uses it (nixl-rs keeps such
    /// memory registered until the request is gone; nixl-sys ignored the failure): the error
    /// is `BackendError` and [`last_error`] says which request; the handle stays registered.
    pub fn deregister(&mut self) -> Result<(), NixlError> {
        if let (Some(agent), Some(reg)) = (&self.agent, &self.reg) {
            tracing::trace!(
                ptr = self.ptr,
                size = self.size,
                dev_id = self.dev_id,
                mem_type = ?self.mem_type,
                "Deregistering memory"
            );
            agent.inner.rs.deregister_mem(reg).map_err(map_err)?;
            agent.inner.forget_deregistered();
        }
        self.agent = None;
        self.reg = None;
        Ok(())
    }
}

impl Drop for RegistrationHandle {
    fn drop(&mut self) {
        if let Err(e) = self.deregister() {
            // The registration itself is dropped with the handle: nixl-rs deregisters once
            // the last request using it is gone.
            tracing::debug!(error = ?e, detail = ?last_error(), "Deferred deregistration");
        }
    }
}

/// A prepared device-side memory view (NIXL's device API). nixl-rs has no device-initiated
/// transfers: [`Agent::prep_mem_view_local`] and [`Agent::prep_mem_view_remote`] return an
/// error, so no value of this type is ever made.
#[derive(Debug)]
pub struct MemView {
    _agent: Agent,
}

impl MemView {
    /// The underlying `nixlMemViewH`.
    pub fn as_ptr(&self) -> *mut std::ffi::c_void {
        std::ptr::null_mut()
    }
}

/// A backend created on an agent (nixl-sys's handle).
#[derive(Clone)]
pub struct Backend {
    pub(crate) handle: nixl::core::BackendHandle,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.handle.name())
            .finish()
    }
}

impl Backend {
    /// The backend's plugin name (`UCX`, `POSIX`, ...). An addition to nixl-sys's API.
    pub fn name(&self) -> &str {
        self.handle.name()
    }
}

/// Transfer telemetry data wrapper.
#[derive(Debug)]
pub struct XferTelemetry {
    /// Start time in microseconds of the monotonic clock (NIXL's `steady_clock`).
    pub start_time_us: u64,
    /// Post operation duration in microseconds
    pub post_duration_us: u64,
    /// Transfer duration in microseconds
    pub xfer_duration_us: u64,
    /// Total bytes transferred
    pub total_bytes: u64,
    /// Number of descriptors
    pub desc_count: u64,
}

impl XferTelemetry {
    /// The start time as a Duration of the monotonic clock.
    pub fn start_time(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.start_time_us)
    }

    /// The post operation's duration.
    pub fn post_duration(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.post_duration_us)
    }

    /// The transfer's duration.
    pub fn xfer_duration(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.xfer_duration_us)
    }

    /// The total duration (post + transfer).
    pub fn total_duration(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.post_duration_us + self.xfer_duration_us)
    }

    /// The transfer rate in bytes per second.
    pub fn transfer_rate_bps(&self) -> f64 {
        if self.xfer_duration_us == 0 {
            0.0
        } else {
            (self.total_bytes as f64) / (self.xfer_duration_us as f64 / 1_000_000.0)
        }
    }
}

/// Optional arguments of agent calls (nixl-sys's `OptArgs`: backends, notification, merge
/// policy, side-channel address).
#[derive(Debug, Clone, Default)]
pub struct OptArgs {
    pub(crate) backends: Vec<nixl::core::BackendHandle>,
    pub(crate) notif: Vec<u8>,
    pub(crate) has_notif: bool,
    pub(crate) skip_merge: bool,
    pub(crate) custom_param: Vec<u8>,
    pub(crate) ip_addr: Option<String>,
    pub(crate) port: Option<u16>,
}

impl OptArgs {
    /// Creates a new empty optional arguments struct.
    pub fn new() -> Result<Self, NixlError> {
        Ok(OptArgs::default())
    }

    /// Adds a backend to the optional arguments.
    pub fn add_backend(&mut self, backend: &Backend) -> Result<(), NixlError> {
        self.backends.push(backend.handle.clone());
        Ok(())
    }

    /// Sets the notification message.
    pub fn set_notification_message(&mut self, message: &[u8]) -> Result<(), NixlError> {
        self.notif = message.to_vec();
        Ok(())
    }

    /// The notification message.
    pub fn get_notification_message(&self) -> Result<Vec<u8>, NixlError> {
        Ok(self.notif.clone())
    }

    /// Opaque blob forwarded to the backend; its contents are backend-defined. No nixl-rs
    /// backend takes one: a transfer call given a non-empty one is refused (`InvalidParam`).
    pub fn set_custom_param(&mut self, param: &[u8]) -> Result<(), NixlError> {
        self.custom_param = param.to_vec();
        Ok(())
    }

    /// The custom parameter blob.
    pub fn get_custom_param(&self) -> Result<Vec<u8>, NixlError> {
        Ok(self.custom_param.clone())
    }

    /// Sets whether notification is enabled.
    pub fn set_has_notification(&mut self, has_notification: bool) -> Result<(), NixlError> {
        self.has_notif = has_notification;
        Ok(())
    }

    /// Whether notification is enabled.
    pub fn has_notification(&self) -> Result<bool, NixlError> {
        Ok(self.has_notif)
    }

    /// Sets whether to skip descriptor merging.
    pub fn set_skip_descriptor_merge(&mut self, skip_merge: bool) -> Result<(), NixlError> {
        self.skip_merge = skip_merge;
        Ok(())
    }

    /// Whether descriptor merging is skipped.
    pub fn skip_descriptor_merge(&self) -> Result<bool, NixlError> {
        Ok(self.skip_merge)
    }

    /// Sets the peer's IP address, for `send_local_md`, `fetch_remote_md`,
    /// `invalidate_local_md` and `send_local_partial_md` (nixl-sys panicked on a NUL byte;
    /// this returns `InvalidParam`).
    pub fn set_ip_addr(&mut self, ip_addr: &str) -> Result<(), NixlError> {
        if ip_addr.contains('\0') {
            return Err(NixlError::InvalidParam);
        }
        self.ip_addr = Some(ip_addr.to_owned());
        Ok(())
    }

    /// Sets the peer's port (NIXL's default 8888 without it).
    pub fn set_port(&mut self, port: u16) -> Result<(), NixlError> {
        self.port = Some(port);
        Ok(())
    }

    /// The notification a transfer carries: the message when `has_notification` is set.
    pub(crate) fn notif(&self) -> Option<Vec<u8>> {
        self.has_notif.then(|| self.notif.clone())
    }
}

/// Whether this is nixl-sys's stub build (functions resolved at run time): never, here.
pub fn is_stub() -> bool {
    false
}

/// String parameters, ordered (nixl-sys's params are NIXL's `nixl_b_params_t`).
pub(crate) type ParamMap = BTreeMap<String, String>;
