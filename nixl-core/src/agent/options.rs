//! A request's options and what the agent lists about requests that ended uncertain.

use std::time::Duration;

use crate::agent::BackendHandle;
use crate::desc::XferOp;

/// A request that ended in an uncertain state: its peer died or restarted, or its deadline
/// passed, while it was in flight, so whether the target received the data is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UncertainXfer {
    /// The request's id ([`XferReq::id`](crate::XferReq::id)).
    pub id: u64,
    /// The target agent.
    pub remote: String,
    /// READ or WRITE.
    pub op: XferOp,
    /// Bytes of the request.
    pub bytes: u64,
    /// The error's kind.
    pub error: crate::ErrorKind,
}

/// Options of a transfer request, built from `default()` with one setter per field (an
/// `Option` field's setter takes the value or an `Option`):
///
/// ```
/// use std::time::Duration;
/// use nixl_core::XferOptions;
/// let o = XferOptions::default()
///     .notif(b"done".to_vec())
///     .timeout(Duration::from_secs(1))
///     .no_merge(true);
/// assert_eq!(o.notif.as_deref(), Some(&b"done"[..]));
/// assert_eq!(o.timeout, Some(Duration::from_secs(1)));
/// assert!(o.timeout(None).timeout.is_none());
/// ```
///
/// A struct literal does not compile outside nixl-core (`#[non_exhaustive]`), so a field added
/// in a later release cannot break a caller:
///
/// ```compile_fail,E0639
/// let o = nixl_core::XferOptions { notif: None, backends: Vec::new(), timeout: None,
///     no_merge: false, integrity: false, arrival: None, lease: None };
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct XferOptions {
    /// A notification for the target, delivered only after the request's data is complete.
    pub notif: Option<Vec<u8>>,
    /// Backends to choose from, in preference order (empty: all, in creation order).
    pub backends: Vec<BackendHandle>,
    /// A deadline for each post: past it, `check` cancels and reports `TimedOut`.
    pub timeout: Option<Duration>,
    /// Do not merge contiguous descriptors.
    pub no_merge: bool,
    /// Checksum the payload and deliver the checksum with the notification; the target
    /// verifies it before handing the notification out (WRITE of DRAM only). The notification
    /// is then sent once the initiator sees the request complete.
    pub integrity: bool,
    /// Per-layer counters the copy advances on the GPU as each layer lands (block and tile
    /// requests; see [`crate::ArrivalCounters`]).
    pub arrival: Option<crate::ArrivalCounters>,
    /// A lease this agent holds on the remote agent's blocks ([`Agent::acquire_lease`](crate::Agent::acquire_lease)):
    /// the request is refused, and every later post, with [`Error::LeaseExpired`](crate::Error::LeaseExpired) (nothing
    /// moved) once the lease has run out on this agent's clock or was released.
    pub lease: Option<crate::leases::LeaseId>,
}

crate::__setters!(XferOptions {
    backends: Vec<BackendHandle>,
    no_merge: bool,
    integrity: bool,
} some {
    notif: Vec<u8>,
    timeout: Duration,
    arrival: crate::ArrivalCounters,
    lease: crate::leases::LeaseId,
});

impl XferOptions {
    /// Options carrying a notification.
    pub fn with_notif(msg: Vec<u8>) -> Self {
        XferOptions {
            notif: Some(msg),
            ..Default::default()
        }
    }
}
