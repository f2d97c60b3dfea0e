//! Bounds on what peers can make an agent hold: peers, regions per peer, queued notifications,
//! side-channel connections and bytes. Exceeding one is a typed
//! [`Error::LimitExceeded`](crate::Error::LimitExceeded) that changes nothing (or, for
//! notifications, a counted drop reported to the receiver).

use std::time::Duration;

/// What one queued notification costs beyond its bytes (its allocation and bookkeeping), in
/// the queue's accounting.
pub const NOTIF_OVERHEAD: usize = 64;

/// Limits of an agent ([`crate::AgentConfig::limits`]). The defaults suit a large deployment
/// (thousands of peers, a million regions per peer) where the process may open enough files;
/// they are derived from its open-file limit (`RLIMIT_NOFILE`) so that a peer past what the
/// process can hold is refused with `LimitExceeded` before anything fails with `EMFILE`
/// ([`Limits::for_open_files`]). Lower them where peers are less trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// Most bytes one integrity frame may make the agent hash (`AgentConfig::verify_integrity`);
    /// a frame naming more is reported as `Corrupt`, unread.
    pub max_integrity_bytes: u64,
    /// Side-channel listener limits.
    pub listener: ListenerLimits,
    /// How long a name whose incarnation committed to a successor
    /// (`AgentConfig::succession`) stays held for that successor once the incarnation exited
    /// or was invalidated: metadata under the name that does not reveal the secret is refused
    /// until then.
    pub succession_hold: std::time::Duration,
}

crate::__setters!(Limits {
    max_peers: usize,
    max_regions_per_peer: usize,
    max_known_names: usize,
    max_queued_notif_bytes: usize,
    max_queued_notif_bytes_per_sender: usize,
    max_integrity_bytes: u64,
    listener: ListenerLimits,
    succession_hold: std::time::Duration,
});

impl Default for Limits {
    fn default() -> Self {
        Limits::for_open_files(open_file_limit())
    }
}

/// This process's soft open-file limit (`RLIMIT_NOFILE`); a large number where it is unlimited
/// or cannot be read.
fn open_file_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20)
}

impl Limits {
    /// File descriptors one loaded peer may hold in the agent's process (a transport endpoint
    /// or two, the pidfd that watches a same-host peer, a notification socket): what
    /// [`Limits::for_open_files`] budgets per peer.
    pub const FDS_PER_PEER: u64 = 4;

    /// File descriptors [`Limits::for_open_files`] leaves to the application and the agent's
    /// own threads, files and sockets.
    pub const RESERVED_FDS: u64 = 128;

    /// The default limits for a process that may open `nofile` files: side-channel
    /// connections at most an eighth of them (8..=256), and peers at most what the rest holds
    /// at [`Limits::FDS_PER_PEER`] each after [`Limits::RESERVED_FDS`] (16..=4096). With the
    /// usual 1,024 files: 128 connections and 192 peers.
    pub fn for_open_files(nofile: u64) -> Limits {
        let connections = (nofile / 8).clamp(8, 256);
        let peers = (nofile.saturating_sub(Self::RESERVED_FDS + connections) / Self::FDS_PER_PEER)
            .clamp(16, 4096);
        Limits {
            max_peers: usize::try_from(peers).unwrap_or(4096),
            max_regions_per_peer: 1 << 22,
            max_known_names: 1 << 16,
            max_queued_notif_bytes: 256 << 20,
            max_queued_notif_bytes_per_sender: 64 << 20,
            max_integrity_bytes: 1 << 32,
            succession_hold: Duration::from_secs(600),
            listener: ListenerLimits {
                max_connections: usize::try_from(connections).unwrap_or(256),
                ..ListenerLimits::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_follow_the_open_file_limit() {
        let l = Limits::for_open_files(1024);
        assert_eq!((l.max_peers, l.listener.max_connections), (192, 128));
        assert!(
            l.max_peers as u64 * Limits::FDS_PER_PEER
                + l.listener.max_connections as u64
                + Limits::RESERVED_FDS
                <= 1024
        );
        let big = Limits::for_open_files(1 << 20);
        assert_eq!((big.max_peers, big.listener.max_connections), (4096, 256));
        let tiny = Limits::for_open_files(64);
        assert_eq!((tiny.max_peers, tiny.listener.max_connections), (16, 8));
        assert!(open_file_limit() > 0);
    }
}

/// Limits of the side-channel listener.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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

crate::__setters!(ListenerLimits {
    max_connections: usize,
    request_timeout: Duration,
    max_request_bytes: usize,
    max_buffered_bytes: usize,
});

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
