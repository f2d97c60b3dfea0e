//! The result layer: every UCX status goes through [`status_error`] into a typed
//! [`nixl_core::Error`], with the native status kept as the [`UcxError`] source.

use nixl_core::{Error, Op};

use crate::loader::Ucx;
use crate::sys;

/// The backend's type name.
pub const UCX: &str = "UCX";

/// A native UCX failure, carried as the `source` of [`nixl_core::Error::Backend`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UcxError {
    /// A UCX call returned an error status.
    #[error("{call}: {message} (ucs_status_t {status})")]
    Status {
        /// The UCX function.
        call: &'static str,
        /// The status code.
        status: i32,
        /// UCX's text for it.
        message: String,
    },
    /// A peer's worker address comes from another UCX minor version than the one loaded here:
    /// worker addresses and packed rkeys are UCX-internal formats, so both sides must load
    /// the same UCX minor version.
    #[error("the peer runs UCX {peer}, this agent UCX {local}; load the same UCX minor version on both sides (UcxParams::library_path can load a NIXL wheel's bundled libucp)")]
    VersionMismatch {
        /// The version loaded here (`"1.22.0"`).
        local: String,
        /// The peer's version, as its worker address tells it (`"1.23"`).
        peer: String,
    },
}

/// Whether a status means the peer is unreachable or gone.
pub(crate) fn is_disconnect(status: sys::ucs_status_t) -> bool {
    [
        sys::UCS_ERR_CONNECTION_RESET,
        sys::UCS_ERR_ENDPOINT_TIMEOUT,
        sys::UCS_ERR_UNREACHABLE,
        sys::UCS_ERR_NOT_CONNECTED,
        sys::UCS_ERR_REJECTED,
        sys::UCS_ERR_IO_ERROR,
        sys::UCS_ERR_TIMED_OUT,
    ]
    .contains(&status)
}

/// Converts a failed status into the crate's error.
pub(crate) fn status_error(
    ucx: &Ucx,
    agent: &str,
    remote: Option<&str>,
    op: Op,
    call: &'static str,
    status: sys::ucs_status_t,
) -> Error {
    let message = ucx.status_string(status);
    if let (Some(remote), true) = (remote, is_disconnect(status)) {
        return Error::disconnected(agent, remote, op, format!("{call}: {message}"));
    }
    match status {
        sys::UCS_ERR_UNSUPPORTED => {
            Error::not_supported(agent, op, format!("UCX {call}: {message}"))
        }
        sys::UCS_ERR_INVALID_PARAM | sys::UCS_ERR_INVALID_ADDR => {
            Error::invalid(agent, op, format!("UCX {call}: {message}"))
        }
        sys::UCS_ERR_CANCELED => Error::Canceled {
            agent: agent.to_owned(),
            op,
        },
        _ => Error::Backend {
            agent: agent.to_owned(),
            backend: UCX.to_owned(),
            op,
            message: format!("{call} failed: {message}"),
            source: Some(std::sync::Arc::new(UcxError::Status {
                call,
                status: status as i32,
                message,
            })),
        },
    }
}

/// `Ok(())` for `UCS_OK`, the converted error otherwise.
pub(crate) fn check(
    ucx: &Ucx,
    agent: &str,
    op: Op,
    call: &'static str,
    status: sys::ucs_status_t,
) -> nixl_core::Result<()> {
    if status == sys::UCS_OK {
        Ok(())
    } else {
        Err(status_error(ucx, agent, None, op, call, status))
    }
}
