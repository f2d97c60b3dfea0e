//! The result layer: every negative libfabric return code goes through [`check`] into a
//! [`FiError`], and every `FiError` through [`FiError::into_error`] into a `nixl_core::Error`.

use std::fmt;

use nixl_core::{Error, Op};

use crate::sys;

/// The backend's type name.
pub const LIBFABRIC: &str = "LIBFABRIC";

/// A libfabric call that failed: the call's name and libfabric's (positive) error number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiError {
    /// The call (`fi_write`, `fi_mr_reg`, a CQ error entry, ...).
    pub call: &'static str,
    /// The positive `FI_E*` / errno value.
    pub code: u32,
    /// libfabric's text for it (plus the provider's, for CQ errors).
    pub message: String,
}

impl FiError {
    /// An error from a call's negative return value or a CQ entry's `err`.
    pub fn new(call: &'static str, code: u32) -> Self {
        FiError {
            call,
            code,
            message: strerror(code),
        }
    }

    /// Adds the provider's own text.
    pub fn with_detail(mut self, detail: &str) -> Self {
        if !detail.is_empty() {
            self.message = format!("{} ({detail})", self.message);
        }
        self
    }

    /// Whether the call must simply be retried after progress (`-FI_EAGAIN`).
    pub fn is_again(&self) -> bool {
        self.code == sys::FI_EAGAIN
    }

    /// Whether the error says the peer cannot be reached (connection refused, reset, gone).
    pub fn is_disconnect(&self) -> bool {
        const CODES: [u32; 11] = [
            sys::FI_ECONNREFUSED,
            sys::FI_ECONNRESET,
            sys::FI_ECONNABORTED,
            sys::FI_ENOTCONN,
            sys::FI_EHOSTUNREACH,
            sys::FI_ENETUNREACH,
            sys::FI_EPIPE,
            sys::FI_ETIMEDOUT,
            sys::FI_ESHUTDOWN,
            sys::FI_EHOSTDOWN,
            sys::FI_ENETDOWN,
        ];
        CODES.contains(&self.code)
    }

    /// Converts into the crate-wide error, naming the agent and operation; connection errors
    /// become [`Error::RemoteDisconnect`] when the peer is known.
    pub fn into_error(self, agent: &str, remote: Option<&str>, op: Op) -> Error {
        match remote {
            Some(r) if self.is_disconnect() => Error::disconnected(agent, r, op, self.to_string()),
            _ => Error::Backend {
                agent: agent.to_owned(),
                backend: LIBFABRIC.to_owned(),
                op,
                message: self.to_string(),
                source: Some(std::sync::Arc::new(self)),
            },
        }
    }
}

impl fmt::Display for FiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (error {})", self.call, self.message, self.code)
    }
}

impl std::error::Error for FiError {}

/// libfabric's text for an error number.
fn strerror(code: u32) -> String {
    let Ok(lib) = sys::lib() else {
        return format!("error {code}");
    };
    let Ok(c) = i32::try_from(code) else {
        return format!("error {code}");
    };
    sys::strerror(lib, c).unwrap_or_else(|| format!("error {code}"))
}

/// Turns a libfabric return value into `Ok(value)` or the error it encodes.
pub(crate) fn check(call: &'static str, ret: isize) -> Result<usize, FiError> {
    if ret >= 0 {
        Ok(ret as usize)
    } else {
        Err(FiError::new(
            call,
            u32::try_from(ret.unsigned_abs()).unwrap_or(u32::MAX),
        ))
    }
}

/// The error for a missing libfabric.
pub(crate) fn unavailable(why: &str) -> Error {
    Error::Unavailable {
        what: "libfabric (libfabric.so.1)".to_owned(),
        hint: format!(
            "install libfabric >= 1.14 (Debian/Ubuntu: `apt-get install libfabric1`; AWS EFA: the EFA installer's /opt/amazon/efa), or point {} at libfabric.so.1 [{why}]",
            sys::PATH_ENV
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_returns_are_errors() {
        assert_eq!(check("x", 3), Ok(3));
        let e = check("fi_write", -(sys::FI_EAGAIN as isize)).unwrap_err();
        assert!(e.is_again());
        assert!(!e.is_disconnect());
        let e = FiError::new("cq", sys::FI_ECONNREFUSED);
        assert!(e.is_disconnect());
        assert!(matches!(
            e.clone().into_error("a", Some("b"), Op::PostXfer),
            Error::RemoteDisconnect { .. }
        ));
        assert!(matches!(
            e.into_error("a", None, Op::PostXfer),
            Error::Backend { .. }
        ));
    }
}
