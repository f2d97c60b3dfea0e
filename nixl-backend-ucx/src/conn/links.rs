//! Which of our endpoints a peer's connection shares, and when the peer replaced it.
//!
//! UCX pairs the first endpoints two workers create to each other (its endpoint matching by
//! connection sequence number): our endpoint to a peer is then the same connection as the
//! peer's endpoint to us, and the peer's hello arrives with our own endpoint as its reply
//! endpoint. When that peer forgets us (`invalidate_remote_metadata`) and connects again, it
//! closes its side; UCX does not tell ours, and the notifications we keep sending on it carry
//! a reply endpoint the peer closed, so the peer's UCX drops them without a trace. The peer's
//! new hello (from the same worker of the peer, on another connection) is the sign: our
//! endpoint it replaced is marked so, and the next notification or post on it fails
//! `RemoteDisconnect`, so the caller reloads the peer's metadata instead of sending into the
//! void.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use crate::endpoint::EpShared;

/// How many peer workers' latest connections are remembered (older ones are forgotten: a
/// forgotten one only means a replacement goes unnoticed, as before).
const MAX_LATEST: usize = 1 << 14;

/// Per worker: our open endpoints and the connection of each peer worker's latest hello.
#[derive(Debug, Default)]
pub(crate) struct Links {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Our endpoints on this worker: handle -> (peer name, its shared state).
    own: HashMap<u64, (String, Arc<EpShared>)>,
    /// (sender, the sender's worker index) -> the connection its latest hello came on.
    latest: HashMap<(String, u32), u64>,
}

impl Links {
    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Our endpoint `ep` to `peer` is open.
    pub(crate) fn add_own(&self, ep: u64, peer: &str, shared: Arc<EpShared>) {
        self.lock().own.insert(ep, (peer.to_owned(), shared));
    }

    /// Our endpoint `ep` is closing (its handle may be reused by UCX afterwards).
    pub(crate) fn remove_own(&self, ep: u64) {
        self.lock().own.remove(&ep);
    }

    /// A checked hello from worker `index` of `sender` came on connection `conn`. If the same
    /// worker of the sender introduced itself before on one of our own open endpoints to it,
    /// the sender replaced that connection: the endpoint is marked replaced and its handle
    /// returned.
    pub(crate) fn introduced(&self, sender: &str, index: Option<u32>, conn: u64) -> Option<u64> {
        let index = index?;
        let mut g = self.lock();
        if g.latest.len() >= MAX_LATEST {
            if let Some(k) = g.latest.keys().next().cloned() {
                g.latest.remove(&k);
            }
        }
        let prev = g.latest.insert((sender.to_owned(), index), conn)?;
        if prev == conn {
            return None;
        }
        let (name, shared) = g.own.get(&prev)?;
        if name != sender || shared.is_closed() || shared.failed().is_some() {
            return None;
        }
        shared.replace();
        Some(prev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_hello_from_the_same_peer_worker_replaces_our_paired_endpoint() {
        let l = Links::default();
        let ours = Arc::new(EpShared::default());
        l.add_own(0x10, "p", ours.clone());
        // The peer's first hello came on our own endpoint (paired by UCX).
        assert_eq!(l.introduced("p", Some(0), 0x10), None);
        // Another worker of the peer, on another connection: not a replacement.
        assert_eq!(l.introduced("p", Some(1), 0x20), None);
        // Another peer's hello: not a replacement of ours either.
        assert_eq!(l.introduced("q", Some(0), 0x30), None);
        // Without the sender's worker index nothing is decided.
        assert_eq!(l.introduced("p", None, 0x40), None);
        assert!(!ours.is_replaced());
        // The same worker of the peer on a new connection: it replaced ours.
        assert_eq!(l.introduced("p", Some(0), 0x40), Some(0x10));
        assert!(ours.is_replaced());
        // Once only, and never for an endpoint we closed.
        assert_eq!(l.introduced("p", Some(0), 0x50), None);
        let closed = Arc::new(EpShared::default());
        l.add_own(0x60, "p", closed.clone());
        assert_eq!(l.introduced("p", Some(2), 0x60), None);
        l.remove_own(0x60);
        assert_eq!(l.introduced("p", Some(2), 0x70), None);
        assert!(!closed.is_replaced());
    }
}
