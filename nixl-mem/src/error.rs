//! The memory layer's own error: what a memory type, a device driver or an IPC handle reports.
//! No agent is involved in allocating, mapping or exporting memory, so none is named: a backend
//! turns it into the workspace's [`Error`] at its boundary with [`MemError::at`] (its agent's
//! name), and `?` into [`nixl_core::Result`] converts it to [`Error::Local`].

use std::fmt;
use std::sync::Arc;

use nixl_core::backend::SharedError;
use nixl_core::{Error, ErrorKind, Op};

/// The result of the memory layer.
pub type MemResult<T> = std::result::Result<T, MemError>;

/// An error of the memory layer: an operation, the [`ErrorKind`] it has in the workspace's
/// [`Error`], and what went wrong (with the native error as the source where there is one).
#[derive(Debug, Clone)]
pub struct MemError {
    op: Op,
    kind: ErrorKind,
    /// The library that failed (`CUDA`, `HIP`, ...) for [`ErrorKind::Backend`].
    library: Option<&'static str>,
    message: String,
    /// What to install or set, for [`ErrorKind::Unavailable`].
    hint: Option<String>,
    source: Option<SharedError>,
}

impl MemError {
    fn new(op: Op, kind: ErrorKind, message: impl Into<String>) -> Self {
        MemError {
            op,
            kind,
            library: None,
            message: message.into(),
            hint: None,
            source: None,
        }
    }

    /// A bad argument ([`ErrorKind::InvalidParam`]).
    pub(crate) fn invalid(op: Op, reason: impl Into<String>) -> Self {
        MemError::new(op, ErrorKind::InvalidParam, reason)
    }

    /// Not offered here ([`ErrorKind::NotSupported`]).
    pub(crate) fn not_supported(op: Op, what: impl Into<String>) -> Self {
        MemError::new(op, ErrorKind::NotSupported, what)
    }

    /// Something named is not there ([`ErrorKind::NotFound`]).
    pub(crate) fn not_found(op: Op, what: impl Into<String>) -> Self {
        MemError::new(op, ErrorKind::NotFound, what)
    }

    /// Two things that must agree do not ([`ErrorKind::Mismatch`]).
    pub(crate) fn mismatch(op: Op, what: impl Into<String>) -> Self {
        MemError::new(op, ErrorKind::Mismatch, what)
    }

    /// A device library's call failed ([`ErrorKind::Backend`]), without a native error value.
    pub(crate) fn backend(library: &'static str, op: Op, message: impl Into<String>) -> Self {
        MemError::library(op, library, message, None)
    }

    /// An operating-system call failed ([`ErrorKind::Io`]).
    pub(crate) fn io(op: Op, e: std::io::Error) -> Self {
        MemError {
            source: Some(Arc::new(e)),
            ..MemError::new(op, ErrorKind::Io, "")
        }
    }

    /// A library or device missing on this machine ([`ErrorKind::Unavailable`]).
    pub(crate) fn unavailable(op: Op, what: impl Into<String>, hint: impl Into<String>) -> Self {
        MemError {
            hint: Some(hint.into()),
            ..MemError::new(op, ErrorKind::Unavailable, what)
        }
    }

    /// A device library's call failed ([`ErrorKind::Backend`]), its error as the source.
    pub(crate) fn library(
        op: Op,
        library: &'static str,
        message: impl Into<String>,
        source: Option<SharedError>,
    ) -> Self {
        MemError {
            library: Some(library),
            source,
            ..MemError::new(op, ErrorKind::Backend, message)
        }
    }

    /// What is missing and what to install, for an [`ErrorKind::Unavailable`] error.
    #[cfg_attr(not(feature = "cufile"), allow(dead_code))]
    pub(crate) fn into_unavailable(self) -> std::result::Result<(String, String), MemError> {
        match self.kind {
            ErrorKind::Unavailable => Ok((self.message, self.hint.unwrap_or_default())),
            _ => Err(self),
        }
    }

    /// The operation that failed.
    pub fn op(&self) -> Op {
        self.op
    }

    /// Its kind in the workspace's [`Error`].
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// [`MemError::at`] for a backend that reports a device library's failure under its own
    /// name (`POSIX`, `GDS`) rather than the library's (`CUDA`).
    pub fn at_backend(self, agent: &str, backend: &str) -> Error {
        match self.at(agent) {
            Error::Backend {
                agent,
                op,
                message,
                source,
                ..
            } => Error::Backend {
                agent,
                backend: backend.to_owned(),
                op,
                message,
                source,
            },
            other => other,
        }
    }

    /// The workspace's error for `agent`'s call that ran into this one: the variant of
    /// [`MemError::kind`] with the agent's name (what a backend returns).
    pub fn at(self, agent: &str) -> Error {
        let MemError {
            op,
            kind,
            library,
            message,
            hint,
            source,
        } = self;
        match kind {
            ErrorKind::InvalidParam => Error::invalid(agent, op, message),
            ErrorKind::NotSupported => Error::not_supported(agent, op, message),
            ErrorKind::NotFound => Error::not_found(agent, op, message),
            ErrorKind::Mismatch => Error::mismatch(agent, op, message),
            ErrorKind::Unavailable => Error::Unavailable {
                what: message,
                hint: hint.unwrap_or_default(),
            },
            ErrorKind::Io => match source
                .as_ref()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
            {
                Some(io) => Error::io(agent, op, clone_io(io)),
                None => Error::io(agent, op, std::io::Error::other(message)),
            },
            _ => Error::Backend {
                agent: agent.to_owned(),
                backend: library.unwrap_or("memory").to_owned(),
                op,
                message,
                source,
            },
        }
    }
}

/// An `io::Error` with the same kind, OS code and text (`io::Error` is not `Clone`).
fn clone_io(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = self.op;
        match self.kind {
            ErrorKind::InvalidParam => write!(f, "{op}: invalid parameter: {}", self.message),
            ErrorKind::NotSupported => write!(f, "{op}: not supported: {}", self.message),
            ErrorKind::NotFound => write!(f, "{op}: not found: {}", self.message),
            ErrorKind::Mismatch => write!(f, "{op}: mismatch: {}", self.message),
            ErrorKind::Unavailable => write!(
                f,
                "{} is unavailable: {}",
                self.message,
                self.hint.as_deref().unwrap_or("")
            ),
            ErrorKind::Io => match &self.source {
                Some(s) => write!(f, "{op}: {s}"),
                None => write!(f, "{op}: {}", self.message),
            },
            _ => write!(
                f,
                "{op}: {} failed: {}",
                self.library.unwrap_or("memory"),
                self.message
            ),
        }
    }
}

impl std::error::Error for MemError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl From<MemError> for Error {
    /// Outside a backend (an application allocating memory): an [`Error::Local`] of the same
    /// kind, this error as its source ([`Error::Unavailable`] for a missing library, which
    /// names no agent anyway).
    fn from(e: MemError) -> Error {
        if e.kind == ErrorKind::Unavailable {
            // Names no agent in the workspace's error either.
            return Error::Unavailable {
                what: e.message,
                hint: e.hint.unwrap_or_default(),
            };
        }
        Error::Local {
            op: e.op,
            kind: e.kind,
            message: e.to_string(),
            source: Some(Arc::new(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_error_names_no_agent_until_a_backend_gives_it_one() {
        let e = crate::SharedHostBuffer::new(0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidParam);
        assert_eq!(e.op(), Op::RegisterMem);
        let text = e.to_string();
        assert!(text.starts_with("RegisterMem: invalid parameter"), "{text}");
        assert!(!text.contains("-:"), "{text}");
        match e.clone().at("decode-0") {
            Error::InvalidParam { agent, op, reason } => {
                assert_eq!((agent.as_str(), op), ("decode-0", Op::RegisterMem));
                assert!(!reason.is_empty());
            }
            other => panic!("{other:?}"),
        }
        // `?` in an application: the same kind, no agent, the memory error as the source.
        let app: Error = e.into();
        assert!(matches!(app, Error::Local { .. }), "{app:?}");
        assert_eq!(app.kind(), ErrorKind::InvalidParam);
        assert!(std::error::Error::source(&app).is_some());
        assert_eq!(app.to_string(), text);
    }

    #[test]
    fn each_kind_lands_on_its_variant() {
        let op = Op::RegisterMem;
        let cases = [
            (MemError::not_supported(op, "x"), ErrorKind::NotSupported),
            (MemError::not_found(op, "x"), ErrorKind::NotFound),
            (MemError::mismatch(op, "x"), ErrorKind::Mismatch),
            (
                MemError::io(op, std::io::Error::from_raw_os_error(12)),
                ErrorKind::Io,
            ),
            (
                MemError::backend("CUDA", op, "cuMemAlloc failed"),
                ErrorKind::Backend,
            ),
            (
                MemError::unavailable(op, "libcuda", "install it"),
                ErrorKind::Unavailable,
            ),
        ];
        for (e, kind) in cases {
            assert_eq!(e.kind(), kind);
            let at = e.clone().at("a");
            assert_eq!(at.kind(), kind, "{at:?}");
            if kind != ErrorKind::Unavailable {
                assert!(at.to_string().starts_with("a: RegisterMem"), "{at}");
            }
            assert_eq!(Error::from(e).kind(), kind);
        }
        // The OS error survives (io::Error is not Clone: rebuilt from its code).
        match MemError::io(op, std::io::Error::from_raw_os_error(12)).at("a") {
            Error::Io { source, .. } => assert_eq!(source.raw_os_error(), Some(12)),
            other => panic!("{other:?}"),
        }
        match MemError::backend("CUDA", op, "x").at_backend("a", "POSIX") {
            Error::Backend { backend, agent, .. } => {
                assert_eq!((backend.as_str(), agent.as_str()), ("POSIX", "a"))
            }
            other => panic!("{other:?}"),
        }
    }
}
