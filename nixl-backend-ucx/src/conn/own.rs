//! The UCX workers of this process, as a peer's worker address could name them.
//!
//! UCX's tcp and shared-memory transports emulate puts and gets with messages, and the
//! receiving worker writes (and reads) at whatever address the message says, without a
//! registration to check it against. A peer's address that names a worker of this process (the
//! agent's own, or another agent's here) would make this agent's transfers "to the peer" go
//! through that worker: into this process's memory, at the addresses the peer's metadata chose.
//! The backend refuses such an address unless the peer is the agent of this process that owns
//! that worker (`UcxBackend::connect_to`; nixl-core checks that a peer claiming this process is
//! a live agent of it, and that its regions are that agent's registrations).

use std::sync::Arc;

use nixl_core::backend::own::{is_loopback_or_unspecified, OwnEndpoints, OwnGuard};

use crate::validate::{parse_address, tl_csum, Address, Entry};

static OWN: OwnEndpoints<Entry> = OwnEndpoints::new();

/// Lists the workers of `agent` (their addresses, as this UCX packs them) until the guard
/// drops.
pub(crate) fn add(agent: &str, addresses: &[&[u8]], loaded_minor: u32) -> OwnGuard<Entry> {
    let entries = addresses
        .iter()
        .filter_map(|a| parse_address(a, loaded_minor).ok())
        .flat_map(|a| a.entries)
        .collect();
    OWN.add(agent, entries)
}

/// The agent of this process whose worker a peer's (checked) address names, where `remote`
/// may not (see [`OwnEndpoints::foreign_owner`]).
pub(crate) fn foreign_owner(peer: &Address, remote: &str, here: bool) -> Option<Arc<str>> {
    OWN.foreign_owner(&peer.entries, remote, here, names)
}

/// Whether a peer's address entry `p` reaches the interface of own entry `o`.
fn names(p: &Entry, o: &Entry) -> bool {
    if p.csum != o.csum {
        return false;
    }
    if p.csum == tl_csum("tcp") {
        // The port, on a device this host's loopback or the address the interface has: the
        // same socket whichever form the device address takes.
        return p.iface_addr == o.iface_addr
            && (p.dev_addr == o.dev_addr
                || tcp_local(&p.dev_addr)
                || tcp_ip(&p.dev_addr).is_some_and(|ip| tcp_ip(&o.dev_addr) == Some(ip)));
    }
    if p.csum == tl_csum("sysv") {
        // The FIFO's segment id is a u64 of which `shmat` takes the int: the same segment
        // whatever the upper half says.
        return p.dev_addr == o.dev_addr
            && p.iface_addr.len() >= 4
            && p.iface_addr.get(..4) == o.iface_addr.get(..4);
    }
    // posix segments (through `/proc/<pid>/fd`: a pid of this process is refused already,
    // `Shapes::named_processes`), the self transport's id: by their exact bytes.
    p.dev_addr == o.dev_addr && p.iface_addr == o.iface_addr
}

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// The IP address of a tcp device address that names one (flags 0).
fn tcp_ip(d: &[u8]) -> Option<std::net::IpAddr> {
    match d {
        [0, AF_INET, ip @ ..] if ip.len() == 4 => {
            Some(std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]).into())
        }
        [0, AF_INET6, ip @ ..] if ip.len() == 16 => {
            let b: [u8; 16] = ip.try_into().ok()?;
            Some(std::net::Ipv6Addr::from(b).into())
        }
        _ => None,
    }
}

/// Whether a tcp device address names this host's loopback: the loopback form (flags 1, a
/// network namespace; one UCX cannot reach is one it does not connect to) or a loopback or
/// unspecified IP.
fn tcp_local(d: &[u8]) -> bool {
    d.first() == Some(&1) || tcp_ip(d).is_some_and(is_loopback_or_unspecified)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tl: &str, dev: &[u8], iface: &[u8]) -> Entry {
        Entry {
            md_index: 0,
            csum: tl_csum(tl),
            dev_addr: dev.to_vec(),
            iface_addr: iface.to_vec(),
        }
    }

    #[test]
    fn a_tcp_port_of_this_host_is_named_in_every_form_of_its_device() {
        let own = entry(
            "tcp",
            &[1, AF_INET, 9, 9, 9, 9, 9, 9, 9, 9, 1, 0, 0, 0],
            &[0x30, 0x39],
        );
        for dev in [
            vec![1, AF_INET, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0],
            vec![0, AF_INET, 127, 0, 0, 1],
            vec![0, AF_INET, 127, 1, 2, 3],
            vec![0, AF_INET, 0, 0, 0, 0],
            vec![0, AF_INET6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            vec![
                0, AF_INET6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1,
            ],
        ] {
            assert!(names(&entry("tcp", &dev, &[0x30, 0x39]), &own), "{dev:?}");
        }
        // Another port, another host's address, another transport: not this interface.
        assert!(!names(
            &entry("tcp", &[0, AF_INET, 127, 0, 0, 1], &[0x30, 0x3a]),
            &own
        ));
        assert!(!names(
            &entry("tcp", &[0, AF_INET, 10, 0, 0, 7], &[0x30, 0x39]),
            &own
        ));
        assert!(!names(&entry("sysv", &own.dev_addr, &own.iface_addr), &own));
        // An interface that listens on a host address is named by that address.
        let eth = entry("tcp", &[0, AF_INET, 10, 0, 0, 7], &[0x30, 0x39]);
        assert!(names(
            &entry("tcp", &[0, AF_INET, 10, 0, 0, 7], &[0x30, 0x39]),
            &eth
        ));
        assert!(!names(
            &entry("tcp", &[0, AF_INET, 10, 0, 0, 8], &[0x30, 0x39]),
            &eth
        ));
    }

    #[test]
    fn shared_memory_and_self_are_named_by_what_ucx_reads_of_them() {
        let own = entry(
            "sysv",
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &[4, 0, 0xa, 0, 0, 0, 0, 0],
        );
        assert!(names(&own.clone(), &own));
        // sysv's id is an int to `shmat`: another upper half is the same segment.
        assert!(names(
            &entry("sysv", &own.dev_addr, &[4, 0, 0xa, 0, 9, 9, 9, 9]),
            &own
        ));
        let posix = entry("posix", &own.dev_addr, &own.iface_addr);
        assert!(!names(
            &entry("posix", &own.dev_addr, &[4, 0, 0xa, 0, 9, 9, 9, 9]),
            &posix
        ));
        assert!(!names(
            &entry("sysv", &own.dev_addr, &[5, 0, 0xa, 0, 0, 0, 0, 0]),
            &own
        ));
        assert!(!names(
            &entry("sysv", &[1, 2, 3, 4, 5, 6, 7, 9], &own.iface_addr),
            &own
        ));
    }

    #[test]
    fn a_backend_leaves_the_list_when_its_guard_drops() {
        let addr = entry("self", &[], &[7, 7, 7, 7, 7, 7, 7, 7]);
        let guard = OWN.add("own-test-agent", vec![addr.clone()]);
        let peer = Address {
            version: 1,
            dst_version: 0,
            entries: vec![addr],
        };
        let named = Some(Arc::<str>::from("own-test-agent"));
        assert_eq!(foreign_owner(&peer, "another-name", true), named);
        assert_eq!(foreign_owner(&peer, "own-test-agent", false), named);
        assert_eq!(foreign_owner(&peer, "own-test-agent", true), None);
        drop(guard);
        assert_eq!(foreign_owner(&peer, "another-name", false), None);
    }
}
