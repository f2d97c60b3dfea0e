//! The endpoints of this process, as a peer's endpoint names could name them.
//!
//! A peer whose names are endpoints of this process (the agent's own, or another agent's
//! here) would turn this agent's transfers "to the peer" into writes and reads of this
//! process's memory: the provider checks the key against the registrations of the endpoint it
//! reaches, which are this process's. The backend refuses such names unless the peer is the
//! agent of this process that owns them (`LibfabricBackend::connect_peer`; nixl-core checks
//! that a peer claiming this process is a live agent of it, with its own registrations).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use nixl_core::backend::own::{is_loopback_or_unspecified, OwnEndpoints, OwnGuard};

/// A rail's endpoint: the provider and its name.
pub(crate) struct Endpoint {
    provider: String,
    name: Vec<u8>,
}

static OWN: OwnEndpoints<Endpoint> = OwnEndpoints::new();

/// Lists the endpoint names of `agent`'s rails (provider `provider`) until the guard drops.
pub(crate) fn add(agent: &str, provider: &str, names: Vec<Vec<u8>>) -> OwnGuard<Endpoint> {
    let endpoints = names
        .into_iter()
        .map(|name| Endpoint {
            provider: provider.to_owned(),
            name,
        })
        .collect();
    OWN.add(agent, endpoints)
}

/// The agent of this process whose endpoint one of `names` (provider `provider`) reaches,
/// where `remote` may not (see [`OwnEndpoints::foreign_owner`]).
pub(crate) fn foreign_owner(
    provider: &str,
    names: &[Vec<u8>],
    remote: &str,
    here: bool,
) -> Option<Arc<str>> {
    OWN.foreign_owner(names, remote, here, |n, o| {
        o.provider == provider && reaches(n, &o.name)
    })
}

/// Whether peer name `p` reaches own endpoint `o`: the same bytes, or, for socket addresses,
/// the same port on this host's loopback (any loopback or unspecified address, IPv4-mapped
/// too) or on the very address the endpoint has.
fn reaches(p: &[u8], o: &[u8]) -> bool {
    if p == o {
        return true;
    }
    let (Some((pip, pport)), Some((oip, oport))) = (sockaddr(p), sockaddr(o)) else {
        return false;
    };
    pport == oport && (pip == oip || is_loopback_or_unspecified(pip))
}

/// The IP address and port of a `sockaddr_in` or `sockaddr_in6` (native-endian family).
fn sockaddr(b: &[u8]) -> Option<(IpAddr, u16)> {
    let family = u16::from_ne_bytes([*b.first()?, *b.get(1)?]);
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    match family {
        2 => {
            let ip: [u8; 4] = b.get(4..8)?.try_into().ok()?;
            Some((Ipv4Addr::from(ip).into(), port))
        }
        10 => {
            let ip: [u8; 16] = b.get(8..24)?.try_into().ok()?;
            Some((Ipv6Addr::from(ip).into(), port))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(ip: [u8; 4], port: u16) -> Vec<u8> {
        let mut b = vec![0u8; 16];
        b[..2].copy_from_slice(&2u16.to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[4..8].copy_from_slice(&ip);
        b
    }

    fn v6(ip: [u8; 16], port: u16) -> Vec<u8> {
        let mut b = vec![0u8; 28];
        b[..2].copy_from_slice(&10u16.to_ne_bytes());
        b[2..4].copy_from_slice(&port.to_be_bytes());
        b[8..24].copy_from_slice(&ip);
        b
    }

    #[test]
    fn a_port_of_this_host_is_reached_in_every_form_of_its_address() {
        let own = v4([127, 0, 0, 1], 4000);
        let mut padded = own.clone();
        padded[12] = 7;
        let mut mapped = [0u8; 16];
        mapped[10..12].copy_from_slice(&[0xff, 0xff]);
        mapped[12..].copy_from_slice(&[127, 0, 0, 1]);
        let mut lo6 = [0u8; 16];
        lo6[15] = 1;
        for p in [
            own.clone(),
            padded,
            v4([127, 9, 9, 9], 4000),
            v4([0, 0, 0, 0], 4000),
            v6(mapped, 4000),
            v6(lo6, 4000),
        ] {
            assert!(reaches(&p, &own), "{p:?}");
        }
        assert!(!reaches(&v4([127, 0, 0, 1], 4001), &own));
        assert!(!reaches(&v4([10, 0, 0, 7], 4000), &own));
        let eth = v4([10, 0, 0, 7], 4000);
        assert!(reaches(&v4([10, 0, 0, 7], 4000), &eth));
        assert!(!reaches(&v4([10, 0, 0, 8], 4000), &eth));
        // shm names: the same string only.
        assert!(reaches(b"fi_shm://12:0:0\0", b"fi_shm://12:0:0\0"));
        assert!(!reaches(b"fi_shm://12:0:1\0", b"fi_shm://12:0:0\0"));
    }

    #[test]
    fn a_backend_leaves_the_list_when_its_guard_drops() {
        let name = v4([127, 0, 0, 1], 4999);
        let g = add("own-test-agent", "tcp;ofi_rxm", vec![name.clone()]);
        let names = [name];
        let named = Some(Arc::<str>::from("own-test-agent"));
        assert_eq!(foreign_owner("tcp;ofi_rxm", &names, "another", true), named);
        assert_eq!(
            foreign_owner("tcp;ofi_rxm", &names, "own-test-agent", false),
            named
        );
        assert_eq!(
            foreign_owner("tcp;ofi_rxm", &names, "own-test-agent", true),
            None
        );
        assert_eq!(foreign_owner("sockets", &names, "another", false), None);
        drop(g);
        assert_eq!(foreign_owner("tcp;ofi_rxm", &names, "another", false), None);
    }
}
