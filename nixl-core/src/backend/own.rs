//! This process's own endpoints, per transport backend: a peer whose connection info names
//! one of them is refused unless it is the agent of this process that owns it.
//!
//! A transfer "to a peer" through an endpoint of this very process moves bytes within it: UCX's
//! emulated puts and gets write wherever the message says, and a provider that checks keys
//! checks them against this process's own registrations. Metadata that names this process is
//! believed only of a live agent of it with its own registrations (nixl-core's load), so a
//! backend that lists its endpoints here ([`OwnEndpoints::add`]) and asks
//! [`OwnEndpoints::foreign_owner`] before connecting refuses every other peer naming them.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

struct Listed<E> {
    id: u64,
    agent: Arc<str>,
    endpoints: Vec<E>,
}

/// One backend type's endpoints of this process (a `static` per backend).
pub struct OwnEndpoints<E: 'static> {
    list: Mutex<Vec<Listed<E>>>,
    next: AtomicU64,
}

impl<E: 'static> std::fmt::Debug for OwnEndpoints<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnEndpoints")
            .field("backends", &self.list.lock().len())
            .finish()
    }
}

impl<E: 'static> Default for OwnEndpoints<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E: 'static> OwnEndpoints<E> {
    /// An empty list.
    pub const fn new() -> Self {
        OwnEndpoints {
            list: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
        }
    }

    /// Lists `agent`'s endpoints until the returned guard drops (keep it with the backend).
    pub fn add(&'static self, agent: &str, endpoints: Vec<E>) -> OwnGuard<E> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.list.lock().push(Listed {
            id,
            agent: Arc::from(agent),
            endpoints,
        });
        OwnGuard { list: self, id }
    }

    /// Whether peer `remote`, whose connection info names `peer` (its endpoints, as the
    /// backend parsed them), may be connected to as far as this process's endpoints go: each
    /// of `peer` that `reaches` one listed here must reach one of `remote`'s own, and `remote`
    /// must be an agent of this process (`here`: the agent bound its process, and nixl-core
    /// checked it is a live agent here). An endpoint several agents here share (a process's
    /// own, such as UCX's cma) then counts as `remote`'s too. Otherwise the agent owning the
    /// endpoint named (one, for the error).
    pub fn foreign_owner<P>(
        &self,
        peer: &[P],
        remote: &str,
        here: bool,
        reaches: impl Fn(&P, &E) -> bool,
    ) -> Option<Arc<str>> {
        let list = self.list.lock();
        for p in peer {
            let mut owners = list
                .iter()
                .filter(|l| l.endpoints.iter().any(|o| reaches(p, o)))
                .map(|l| &l.agent)
                .peekable();
            let Some(first) = owners.peek().map(|a| (*a).clone()) else {
                continue;
            };
            if !(here && owners.any(|a| **a == *remote)) {
                return Some(first);
            }
        }
        None
    }
}

/// Keeps a backend's endpoints listed (see [`OwnEndpoints::add`]).
pub struct OwnGuard<E: 'static> {
    list: &'static OwnEndpoints<E>,
    id: u64,
}

impl<E: 'static> std::fmt::Debug for OwnGuard<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnGuard").field("id", &self.id).finish()
    }
}

impl<E: 'static> Drop for OwnGuard<E> {
    fn drop(&mut self) {
        self.list.list.lock().retain(|l| l.id != self.id);
    }
}

/// Whether a socket address's IP reaches this host's loopback: a loopback or unspecified
/// address, IPv4-mapped ones too (`connect` to `0.0.0.0` reaches this host).
pub fn is_loopback_or_unspecified(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified(),
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| v4.is_loopback() || v4.is_unspecified())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static LIST: OwnEndpoints<u32> = OwnEndpoints::new();

    #[test]
    fn an_endpoint_here_is_only_its_owners_and_leaves_with_its_guard() {
        let eq = |p: &u32, o: &u32| p == o;
        let a = LIST.add("a", vec![1, 2]);
        let _b = LIST.add("b", vec![3, 9]);
        let _shared = LIST.add("c", vec![9]);
        let named = |s: &str| Some(Arc::<str>::from(s));
        // Not this process's endpoints: any peer.
        assert_eq!(LIST.foreign_owner(&[7, 8], "x", false, eq), None);
        // One of a's: only a, and only as an agent of this process.
        assert_eq!(LIST.foreign_owner(&[7, 2], "x", true, eq), named("a"));
        assert_eq!(LIST.foreign_owner(&[2], "a", false, eq), named("a"));
        assert_eq!(LIST.foreign_owner(&[1, 2], "a", true, eq), None);
        assert_eq!(LIST.foreign_owner(&[1, 3], "a", true, eq), named("b"));
        // Shared by b and c: either of them.
        assert_eq!(LIST.foreign_owner(&[9], "c", true, eq), None);
        assert_eq!(LIST.foreign_owner(&[9], "b", true, eq), None);
        drop(a);
        assert_eq!(LIST.foreign_owner(&[1, 2], "x", false, eq), None);
    }

    #[test]
    fn loopback_in_every_form() {
        for ip in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "::1",
            "::",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_loopback_or_unspecified(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["10.0.0.7", "::ffff:10.0.0.7", "fe80::1"] {
            assert!(!is_loopback_or_unspecified(ip.parse().unwrap()), "{ip}");
        }
    }
}
