//! The crate's one error type.
//!
//! Every failure is a typed, terminal value that names the agent, the backend and the operation
//! it came from. Transfer progress is not an error: see [`crate::XferState`].

use std::fmt;
use std::sync::Arc;

/// A native error kept as an error's source: shared, so [`Error`] is `Clone`.
pub type SharedError = Arc<dyn std::error::Error + Send + Sync>;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An operation of the agent or a backend, named in errors and telemetry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Creating or configuring a backend.
    CreateBackend,
    /// Registering memory.
    RegisterMem,
    /// Deregistering memory.
    DeregisterMem,
    /// Querying memory (existence, size).
    QueryMem,
    /// Producing local metadata.
    LocalMetadata,
    /// Loading a peer's metadata.
    LoadMetadata,
    /// Invalidating a peer.
    Invalidate,
    /// Preparing a descriptor list.
    PrepXferDlist,
    /// Building a transfer request.
    MakeXfer,
    /// Posting a transfer request.
    PostXfer,
    /// Checking a transfer request.
    CheckXfer,
    /// Waiting for a transfer request.
    Wait,
    /// Canceling a transfer request.
    Cancel,
    /// Sending a notification.
    GenNotif,
    /// Draining notifications.
    GetNotifs,
    /// Estimating a transfer's cost.
    EstimateCost,
    /// Metadata exchange over the side channel or etcd.
    Exchange,
    /// Driving a backend's progress engine.
    Progress,
    /// Allocating or mapping memory (nixl-mem).
    Allocate,
    /// Publishing, acquiring, renewing or releasing a lease on published blocks.
    Lease,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Why metadata bytes were refused by the decoder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended before a complete value.
    #[error("truncated input: needed {needed} more bytes at offset {offset}")]
    Truncated {
        /// Where the value started.
        offset: usize,
        /// How many bytes were missing.
        needed: usize,
    },
    /// The magic bytes did not match.
    #[error("bad magic bytes (not this format)")]
    BadMagic,
    /// A version this build does not read.
    #[error("unsupported metadata version {0}")]
    UnsupportedVersion(u16),
    /// A length or count over the codec's bounds.
    #[error("{what} of {value} exceeds the limit of {limit}")]
    TooLarge {
        /// The field.
        what: &'static str,
        /// The value read.
        value: u64,
        /// The bound.
        limit: u64,
    },
    /// A field that is not valid (an unknown memory kind, bad UTF-8, overflow).
    #[error("invalid {what}")]
    Invalid {
        /// The field.
        what: &'static str,
    },
    /// Bytes left over after a complete value.
    #[error("{0} trailing bytes after the metadata")]
    Trailing(usize),
}

impl DecodeError {
    /// The crate's [`Error::Decode`] for bytes decoded outside any agent (a public decoder:
    /// its agent is empty).
    pub(crate) fn outside_agent(self, op: Op) -> Error {
        Error::Decode {
            agent: String::new(),
            op,
            source: self,
        }
    }
}

/// Errors of nixl-core and of every backend (backends wrap their native errors in
/// [`Error::Backend`]).
///
/// `Clone` (a request's terminal error is reported to every later `check`), with a
/// [`ErrorKind`] for matching without the fields.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A parameter is not valid for the operation.
    #[error("{agent}: {op}: invalid parameter: {reason}")]
    InvalidParam {
        /// The agent.
        agent: String,
        /// The operation.
        op: Op,
        /// What is wrong.
        reason: String,
    },
    /// A backend failed; `source` carries the native error.
    #[error("{agent}: {op}: backend {backend} failed: {message}")]
    Backend {
        /// The agent.
        agent: String,
        /// The backend.
        backend: String,
        /// The operation.
        op: Op,
        /// What the backend said.
        message: String,
        /// The native error, if any.
        #[source]
        source: Option<SharedError>,
    },
    /// Something named was not found: an agent, a backend, a registration, a region, a key.
    #[error("{agent}: {op}: not found: {what}")]
    NotFound {
        /// The agent.
        agent: String,
        /// The operation.
        op: Op,
        /// What was looked for.
        what: String,
    },
    /// Two things that must agree do not (lengths, memory kinds, descriptor counts, metadata).
    #[error("{agent}: {op}: mismatch: {what}")]
    Mismatch {
        /// The agent.
        agent: String,
        /// The operation.
        op: Op,
        /// What disagrees.
        what: String,
    },
    /// The operation is not allowed in the current state (memory in use, agent shut down).
    #[error("{agent}: {op}: not allowed: {reason}")]
    NotAllowed {
        /// The agent.
        agent: String,
        /// The operation.
        op: Op,
        /// Why.
        reason: String,
    },
    /// A request was posted again while still in flight.
    #[error("{agent}: {op}: request is still in flight")]
    RepostActive {
        /// The agent.
        agent: String,
        /// The operation.
        op: Op,
    },
    /// The backend or build does not support this.
    #[error("{agent}: {op}: not supported: {what}")]
    NotSupported {
        /// The agent.
        agent: String,
        /// The operation.
        op: Op,
        /// What is unsupported.
        what: String,
    },
    /// The peer went away (connection lost, process died, invalidated mid-transfer).
    #[error("{agent}: {op}: remote {remote} disconnected: {reason}")]
    RemoteDisconnect {
        /// The agent.
        agent: String,
        /// The peer.
        remote: String,
        /// The operation.
        op: Op,
        /// What was observed.
        reason: String,
    },
    /// The peer restarted (its generation changed) after the request was built.
    #[error("{agent}: {op}: remote {remote} restarted (generation {built} -> {current})")]
    PeerRestarted {
        /// The agent.
        agent: String,
        /// The peer.
        remote: String,
        /// The operation.
        op: Op,
        /// The generation the request was built against.
        built: u64,
        /// The generation now loaded (0 when the peer was invalidated).
        current: u64,
    },
    /// The request was canceled.
    #[error("{agent}: {op}: canceled")]
    Canceled {
        /// The agent.
        agent: String,
        /// The operation.
        op: Op,
    },
    /// A deadline passed.
    #[error("{agent}: {op}: timed out after {elapsed:?}")]
    TimedOut {
        /// The agent.
        agent: String,
        /// The operation.
        op: Op,
        /// How long it waited.
        elapsed: std::time::Duration,
    },
    /// A lease on a peer's published blocks expired (or was released, or was never granted)
    /// before the request: nothing of it moved.
    #[error("{agent}: {op}: lease {lease:#x} on {remote}'s blocks expired")]
    LeaseExpired {
        /// The agent.
        agent: String,
        /// The peer whose blocks the lease covered.
        remote: String,
        /// The operation.
        op: Op,
        /// The lease.
        lease: u64,
    },
    /// A memory or device call made outside any agent (allocating, mapping or exporting
    /// memory; a GPU driver): what the memory types of nixl-mem return through `?`. Its
    /// [`Error::kind`] is the failure's kind (`InvalidParam`, `NotSupported`, `Io`, ...), its
    /// source the memory layer's error.
    #[error("{message}")]
    Local {
        /// The operation.
        op: Op,
        /// The kind of failure.
        kind: ErrorKind,
        /// What went wrong.
        message: String,
        /// The memory layer's error.
        #[source]
        source: Option<SharedError>,
    },
    /// A library or device is not available on this machine.
    #[error("{what} is unavailable: {hint}")]
    Unavailable {
        /// The missing piece.
        what: String,
        /// What to install or set.
        hint: String,
    },
    /// Metadata bytes were refused by the decoder.
    #[error("{agent}: {op}: corrupt metadata: {source}")]
    Decode {
        /// The agent.
        agent: String,
        /// The operation.
        op: Op,
        /// Why.
        #[source]
        source: DecodeError,
    },
    /// A payload failed its integrity check.
    #[error("{agent}: {op}: payload from {remote} failed its integrity check")]
    Corrupt {
        /// The agent.
        agent: String,
        /// The peer.
        remote: String,
        /// The operation.
        op: Op,
    },
    /// A configured limit would be exceeded (peers, regions per peer, queued notifications,
    /// side-channel connections or bytes); nothing changed.
    #[error("{agent}: {op}: limit exceeded: {what} (limit {limit})")]
    LimitExceeded {
        /// The agent.
        agent: String,
        /// The operation.
        op: Op,
        /// What is limited.
        what: String,
        /// The limit.
        limit: u64,
    },
    /// An I/O error (side channel, files).
    #[error("{agent}: {op}: i/o error: {source}")]
    Io {
        /// The agent.
        agent: String,
        /// The operation.
        op: Op,
        /// The error.
        #[source]
        source: Arc<std::io::Error>,
    },
}

impl Error {
    /// Whether this error means the request's outcome on the remote side is unknown (the peer
    /// died or restarted while it was in flight).
    pub fn is_uncertain(&self) -> bool {
        matches!(
            self,
            Error::RemoteDisconnect { .. } | Error::PeerRestarted { .. } | Error::TimedOut { .. }
        )
    }

    /// The short stable name of the error's kind (`"timed_out"`).
    #[deprecated(since = "0.1.0", note = "use `e.kind().as_str()`")]
    pub fn kind_name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The variant, without its fields.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidParam { .. } => ErrorKind::InvalidParam,
            Error::Backend { .. } => ErrorKind::Backend,
            Error::NotFound { .. } => ErrorKind::NotFound,
            Error::Mismatch { .. } => ErrorKind::Mismatch,
            Error::NotAllowed { .. } => ErrorKind::NotAllowed,
            Error::RepostActive { .. } => ErrorKind::RepostActive,
            Error::NotSupported { .. } => ErrorKind::NotSupported,
            Error::RemoteDisconnect { .. } => ErrorKind::RemoteDisconnect,
            Error::PeerRestarted { .. } => ErrorKind::PeerRestarted,
            Error::Canceled { .. } => ErrorKind::Canceled,
            Error::TimedOut { .. } => ErrorKind::TimedOut,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Decode { .. } => ErrorKind::Decode,
            Error::Corrupt { .. } => ErrorKind::Corrupt,
            Error::LimitExceeded { .. } => ErrorKind::LimitExceeded,
            Error::Io { .. } => ErrorKind::Io,
            Error::LeaseExpired { .. } => ErrorKind::LeaseExpired,
            Error::Local { kind, .. } => *kind,
        }
    }

    /// The operation the failure is labelled with (`None` for [`Error::Unavailable`]). A
    /// transfer's failure found while it is in flight is labelled `CheckXfer` whichever call
    /// found it (a check, a wait, a future); one found at its post, `PostXfer`; the deadline of
    /// the caller's own wait or future, `Wait`.
    pub fn op(&self) -> Option<Op> {
        match self {
            Error::InvalidParam { op, .. }
            | Error::Backend { op, .. }
            | Error::NotFound { op, .. }
            | Error::Mismatch { op, .. }
            | Error::NotAllowed { op, .. }
            | Error::RepostActive { op, .. }
            | Error::NotSupported { op, .. }
            | Error::RemoteDisconnect { op, .. }
            | Error::PeerRestarted { op, .. }
            | Error::Canceled { op, .. }
            | Error::TimedOut { op, .. }
            | Error::Decode { op, .. }
            | Error::Corrupt { op, .. }
            | Error::LimitExceeded { op, .. }
            | Error::Io { op, .. }
            | Error::LeaseExpired { op, .. }
            | Error::Local { op, .. } => Some(*op),
            Error::Unavailable { .. } => None,
        }
    }

    /// Builds an [`Error::InvalidParam`].
    pub fn invalid(agent: &str, op: Op, reason: impl Into<String>) -> Self {
        Error::InvalidParam {
            agent: agent.to_owned(),
            op,
            reason: reason.into(),
        }
    }

    /// Builds an [`Error::NotFound`].
    pub fn not_found(agent: &str, op: Op, what: impl Into<String>) -> Self {
        Error::NotFound {
            agent: agent.to_owned(),
            op,
            what: what.into(),
        }
    }

    /// Builds an [`Error::Mismatch`].
    pub fn mismatch(agent: &str, op: Op, what: impl Into<String>) -> Self {
        Error::Mismatch {
            agent: agent.to_owned(),
            op,
            what: what.into(),
        }
    }

    /// Builds an [`Error::NotAllowed`].
    pub fn not_allowed(agent: &str, op: Op, reason: impl Into<String>) -> Self {
        Error::NotAllowed {
            agent: agent.to_owned(),
            op,
            reason: reason.into(),
        }
    }

    /// Builds an [`Error::NotSupported`].
    pub fn not_supported(agent: &str, op: Op, what: impl Into<String>) -> Self {
        Error::NotSupported {
            agent: agent.to_owned(),
            op,
            what: what.into(),
        }
    }

    /// Builds an [`Error::Backend`] with no native source.
    pub fn backend(agent: &str, backend: &str, op: Op, message: impl Into<String>) -> Self {
        Error::Backend {
            agent: agent.to_owned(),
            backend: backend.to_owned(),
            op,
            message: message.into(),
            source: None,
        }
    }

    /// Builds an [`Error::RemoteDisconnect`].
    pub fn disconnected(agent: &str, remote: &str, op: Op, reason: impl Into<String>) -> Self {
        Error::RemoteDisconnect {
            agent: agent.to_owned(),
            remote: remote.to_owned(),
            op,
            reason: reason.into(),
        }
    }

    /// Builds an [`Error::LimitExceeded`].
    pub fn limit(agent: &str, op: Op, what: impl Into<String>, limit: usize) -> Self {
        Error::LimitExceeded {
            agent: agent.to_owned(),
            op,
            what: what.into(),
            limit: limit as u64,
        }
    }

    /// Builds an [`Error::Io`].
    pub fn io(agent: &str, op: Op, source: std::io::Error) -> Self {
        Error::Io {
            agent: agent.to_owned(),
            op,
            source: Arc::new(source),
        }
    }

    /// Builds an [`Error::Backend`] carrying a native error as its source.
    pub fn backend_source(
        agent: &str,
        backend: &str,
        op: Op,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Backend {
            agent: agent.to_owned(),
            backend: backend.to_owned(),
            op,
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }
}

/// The variants of [`Error`], without their fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::InvalidParam`].
    InvalidParam,
    /// [`Error::Backend`].
    Backend,
    /// [`Error::NotFound`].
    NotFound,
    /// [`Error::Mismatch`].
    Mismatch,
    /// [`Error::NotAllowed`].
    NotAllowed,
    /// [`Error::RepostActive`].
    RepostActive,
    /// [`Error::NotSupported`].
    NotSupported,
    /// [`Error::RemoteDisconnect`].
    RemoteDisconnect,
    /// [`Error::PeerRestarted`].
    PeerRestarted,
    /// [`Error::Canceled`].
    Canceled,
    /// [`Error::TimedOut`].
    TimedOut,
    /// [`Error::Unavailable`].
    Unavailable,
    /// [`Error::Decode`].
    Decode,
    /// [`Error::Corrupt`].
    Corrupt,
    /// [`Error::LimitExceeded`].
    LimitExceeded,
    /// [`Error::Io`].
    Io,
    /// [`Error::LeaseExpired`].
    LeaseExpired,
}

impl ErrorKind {
    /// A short stable name, used as a telemetry label (`"timed_out"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidParam => "invalid_param",
            ErrorKind::Backend => "backend",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Mismatch => "mismatch",
            ErrorKind::NotAllowed => "not_allowed",
            ErrorKind::RepostActive => "repost_active",
            ErrorKind::NotSupported => "not_supported",
            ErrorKind::RemoteDisconnect => "remote_disconnect",
            ErrorKind::PeerRestarted => "peer_restarted",
            ErrorKind::Canceled => "canceled",
            ErrorKind::TimedOut => "timed_out",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Decode => "decode",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::LimitExceeded => "limit_exceeded",
            ErrorKind::Io => "io",
            ErrorKind::LeaseExpired => "lease_expired",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_clone_with_their_source() {
        let e = Error::backend_source(
            "a",
            "UCX",
            Op::PostXfer,
            "put failed",
            std::io::Error::other("native"),
        );
        let c = e.clone();
        assert_eq!(c.kind(), ErrorKind::Backend);
        assert_eq!(
            std::error::Error::source(&c).map(|s| s.to_string()),
            Some("native".to_owned())
        );
        assert_eq!(c.to_string(), e.to_string());
        assert_eq!(
            Error::io("a", Op::Exchange, std::io::ErrorKind::TimedOut.into())
                .kind()
                .as_str(),
            "io"
        );
    }
}
