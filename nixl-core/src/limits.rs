//! Bounds on what peers can make an agent hold: peers, regions per peer, queued notifications,
//! side-channel connections and bytes. Exceeding one is a typed
//! [`Error::LimitExceeded`](crate::Error::LimitExceeded) that changes nothing (or, for
//! notifications, a counted drop reported to the receiver).

use std::time::Duration;

/// What one queued notification costs beyond its bytes (its allocation and bookkeeping), in
/// the queue's accounting.
pub const NOTIF_OVERHEAD: usize = 64;

/// Limits of an agent ([`crate::AgentConfig::limits`]). The defaults suit a large deployment
/// (thousands of peers, a million regions per peer); lower them where peers are less trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most peers loaded at once.
    pub max_peers: usize,
    /// Most regions loaded per peer.
    pub max_regions_per_peer: usize,
    /// Most agent names remembered with their credential (names stay bound after their peer
    /// is invalidated, so a later incarnation must carry the same credential).
    pub max_known_names: usize,
    /// Most bytes of notifications queued and not yet taken, all senders together (each
    /// message counts its length plus [`NOTIF_OVERHEAD`]). Past it, new notifications are
    /// dropped, counted, and reported to the receiver (see `Agent::wait_notifs`).
    pub max_queued_notif_bytes: usize,
    /// Most bytes queued from one sender, so one peer cannot crowd out the others.
    pub max_queued_notif_bytes_per_sender: usize,
    /// Side-channel listener limits.
    pub listener: ListenerLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_peers: 4096,
            max_regions_per_peer: 1 << 22,
            max_known_names: 1 << 16,
            max_queued_notif_bytes: 256 << 20,
            max_queued_notif_bytes_per_sender: 64 << 20,
            listener: ListenerLimits::default(),
        }
    }
}

/// Limits of the side-channel listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections served at once. At the limit, the oldest connection that has not yet sent
    /// a whole request is closed to make room (idle and slow clients never lock others out).
    pub max_connections: usize,
    /// Time a connection has to deliver its whole request, and the server to answer it.
    pub request_timeout: Duration,
    /// Largest request (a PUSH of metadata is the largest).
    pub max_request_bytes: usize,
    /// Request bytes buffered across all connections at once; a request that would exceed it
    /// is refused.
    pub max_buffered_bytes: usize,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            max_connections: 256,
            request_timeout: Duration::from_secs(5),
            max_request_bytes: 64 << 20,
            max_buffered_bytes: 256 << 20,
        }
    }
}
