//! Several hosts and a real network on one Linux machine, for tests and benches that must
//! cross a network path (and survive its failures) instead of the shared memory and CMA every
//! process of one kernel reaches.
//!
//! A [`Net`] is a set of **hosts** joined by **segments**:
//!
//! - a host is a network namespace; each process the harness starts in it
//!   ([`Net::spawn`], [`Net::spawn_test`]) also gets its own PID, mount, IPC and UTS
//!   namespace, a private `/dev/shm` and the hostname `nixl-h<host>`, so shared memory, SysV
//!   IPC and CMA (`process_vm_readv` needs the peer's pid) between hosts are impossible, and
//!   UCX sees two nodes;
//! - a segment is a wire: a Linux bridge in its own namespace with one veth port per host on
//!   it. Host `h` sees it as interface `eth<segment>` with address `10.A.B.(h+1)/24` (`A.B`
//!   random per net and segment). Two segments between the same two hosts are two rails.
//!
//! Faults are made on the wire side, like a pulled cable or a failed switch port: the host
//! keeps its interface, address and routes and sees only the carrier go
//! ([`Net::set_port`], [`Net::set_segment`]); [`Net::destroy_host`] kills a host outright.
//! [`Net::limit_rate`] shapes a segment (tc `tbf`) so transfers last long enough for a fault
//! to hit them; [`Net::counters`] reads a host interface's byte counters from
//! `/sys/class/net/<if>/statistics`.
//!
//! Everything is named `nixl-<pid>-<seq>-...` and removed on drop, also when the test fails
//! or panics; processes in hosts exit when their test closes their control channel, and a
//! lifetime bounds them even if it never does; [`sweep`] (run by every [`Net::create`])
//! removes what a killed test process left behind. Creating namespaces needs root and
//! iproute2 (`scripts/deps/netns.sh`); [`Net::for_test`] skips the test otherwise
//! ([`Dep::Netns`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use nixl_testkit::netns::{Net, NetSpec};
//!
//! # fn child_test() {}
//! fn two_hosts() {
//!     let Some(net) = Net::for_test("two_hosts", &NetSpec::pair(1)) else { return };
//!     let server = net.addr(0, 1).expect("host 1 is on segment 0");
//!     let mut p = net
//!         .spawn_test(1, "child_test", &[("SERVER", server.to_string())])
//!         .expect("spawn");
//!     assert_eq!(p.expect("ready", Duration::from_secs(10)).expect("ready"), "");
//!     net.set_port(0, 1, false).expect("cut the cable");
//! }
//! ```

mod cmd;
mod link;
mod process;

use std::io;
use std::net::Ipv4Addr;

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use cmd::sweep;
use cmd::{unsupported, Tools, PREFIX};
pub use process::{Control, HostProcess, CONTROL_PREFIX, ENV_HOST, EXIT_ORPHANED};

use super::{skip, Dep};

/// How long a process in a host lives at most, unless [`NetSpec::lifetime`] says otherwise.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// Most hosts in one net.
pub const MAX_HOSTS: usize = 64;
/// Most segments in one net.
pub const MAX_SEGMENTS: usize = 16;
/// How long [`Net::create`] and a plug ([`Net::set_port`]) wait for interfaces to come up.
pub const CARRIER_TIMEOUT: Duration = Duration::from_secs(10);

/// The shape of a net: how many hosts, and which hosts each segment joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetSpec {
    /// Number of hosts (1..=[`MAX_HOSTS`]).
    pub hosts: usize,
    /// Per segment, the hosts on it (each at most once).
    pub segments: Vec<Vec<usize>>,
    /// The longest a process started in a host may run before it is killed.
    pub lifetime: Duration,
}

impl NetSpec {
    /// Two hosts joined by `rails` segments (`eth0`, `eth1`, ... on both).
    pub fn pair(rails: usize) -> NetSpec {
        NetSpec {
            hosts: 2,
            segments: vec![vec![0, 1]; rails],
            lifetime: DEFAULT_LIFETIME,
        }
    }

    /// `hosts` hosts on one switch (segment 0, `eth0` everywhere).
    pub fn switched(hosts: usize) -> NetSpec {
        NetSpec {
            hosts,
            segments: vec![(0..hosts).collect()],
            lifetime: DEFAULT_LIFETIME,
        }
    }

    /// Checks the shape: `InvalidInput` naming what is wrong.
    pub fn validate(&self) -> io::Result<()> {
        let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
        if self.hosts == 0 || self.hosts > MAX_HOSTS {
            return bad(format!("hosts must be 1..={MAX_HOSTS}, not {}", self.hosts));
        }
        if self.segments.len() > MAX_SEGMENTS {
            return bad(format!("at most {MAX_SEGMENTS} segments"));
        }
        for (s, hosts) in self.segments.iter().enumerate() {
            if hosts.is_empty() {
                return bad(format!("segment {s} joins no host"));
            }
            let mut seen = vec![false; self.hosts];
            for &h in hosts {
                match seen.get_mut(h) {
                    None => return bad(format!("segment {s}: no host {h}")),
                    Some(true) => return bad(format!("segment {s}: host {h} twice")),
                    Some(x) => *x = true,
                }
            }
        }
        if self.lifetime.is_zero() {
            return bad("lifetime must be positive".into());
        }
        Ok(())
    }
}

/// Byte and packet counters of one interface (`/sys/class/net/<if>/statistics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IfCounters {
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
}

/// A set of hosts and segments; removed, with every process inside, on drop.
#[derive(Debug)]
pub struct Net {
    tag: String,
    spec: NetSpec,
    tools: Tools,
    /// Namespace names of the hosts, then of the segments' wires, as created.
    hosts: Vec<String>,
    wires: Vec<String>,
    /// First three octets of each segment's /24.
    subnets: Vec<[u8; 3]>,
    destroyed: Mutex<Vec<bool>>,
}

fn random_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

impl Net {
    /// Creates the hosts and segments. `Unsupported` when this machine cannot (not root,
    /// iproute2 missing, namespaces or veth refused): callers skip; other errors are failures.
    pub fn create(spec: &NetSpec) -> io::Result<Net> {
        spec.validate()?;
        let tools = Tools::find()?;
        match cmd::euid() {
            Some(0) => {}
            uid => {
                return Err(unsupported(format!(
                    "network namespaces need root (this process runs as uid {uid:?})"
                )))
            }
        }
        sweep();
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tag = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let r = random_u64();
        // 10.A.B.0/24 with A in 16..=239 and B + segment below 256: private, and unlikely to
        // match a route of the machine (which the hosts never see anyway).
        let a = 16 + (r % 224) as u8;
        let b = ((r >> 8) % (256 - spec.segments.len() as u64)) as u8;
        let mut net = Net {
            tag,
            spec: spec.clone(),
            tools,
            hosts: Vec::new(),
            wires: Vec::new(),
            subnets: (0..spec.segments.len())
                .map(|s| [10, a, b + s as u8])
                .collect(),
            destroyed: Mutex::new(vec![false; spec.hosts]),
        };
        // On error `net` drops and removes whatever was made so far.
        net.build()?;
        for h in 0..spec.hosts {
            net.wait_carrier(h, None)?;
        }
        Ok(net)
    }

    /// [`Net::create`] for a test: `None` after reporting a skip ([`Dep::Netns`]) where this
    /// machine cannot make namespaces. Panics (failing the test) on other errors.
    pub fn for_test(test: &str, spec: &NetSpec) -> Option<Net> {
        match Net::create(spec) {
            Ok(n) => Some(n),
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                skip(test, Dep::Netns, e);
                None
            }
            Err(e) => panic!("{test}: creating the network namespaces failed: {e}"),
        }
    }

    fn build(&mut self) -> io::Result<()> {
        let t = self.tools.clone();
        let cannot = |e: io::Error| unsupported(format!("cannot build the network: {e}"));
        for h in 0..self.spec.hosts {
            let ns = format!("{}-h{h}", self.tag);
            t.ip(&["netns", "add", &ns]).map_err(cannot)?;
            self.hosts.push(ns.clone());
            // The first command inside a namespace: where `ip` cannot enter one (e.g. a
            // chroot whose root is not a mount point), namespaces are unusable here.
            t.ip(&["-n", &ns, "link", "set", "lo", "up"])
                .map_err(cannot)?;
        }
        for (s, members) in self.spec.segments.clone().iter().enumerate() {
            let wire = format!("{}-w{s}", self.tag);
            t.ip(&["netns", "add", &wire]).map_err(cannot)?;
            self.wires.push(wire.clone());
            t.ip(&["-n", &wire, "link", "add", "br0", "type", "bridge"])
                .map_err(cannot)?;
            t.ip(&["-n", &wire, "link", "set", "br0", "up"])?;
            let ifname = Self::ifname(s);
            for &h in members {
                let port = format!("h{h}");
                let host = &self.hosts[h];
                t.ip(&[
                    "link", "add", &port, "netns", &wire, "type", "veth", "peer", "name", &ifname,
                    "netns", host,
                ])
                .map_err(cannot)?;
                t.ip(&["-n", &wire, "link", "set", &port, "master", "br0", "up"])?;
                let addr = format!("{}/24", self.host_addr(s, h));
                t.ip(&["-n", host, "addr", "add", &addr, "dev", &ifname])?;
                t.ip(&["-n", host, "link", "set", &ifname, "up"])?;
            }
        }
        Ok(())
    }

    /// The tag every name of this net starts with (`nixl-<pid>-<seq>`).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The net's shape.
    pub fn spec(&self) -> &NetSpec {
        &self.spec
    }

    /// The network namespace of host `host` (for `ip netns exec`), if there is such a host.
    pub fn host_ns(&self, host: usize) -> Option<&str> {
        self.hosts.get(host).map(String::as_str)
    }

    /// The interface name segment `segment` has on every host it joins: `eth<segment>`.
    pub fn ifname(segment: usize) -> String {
        format!("eth{segment}")
    }

    fn host_addr(&self, segment: usize, host: usize) -> Ipv4Addr {
        let [a, b, c] = self.subnets[segment];
        Ipv4Addr::new(a, b, c, (host + 1) as u8)
    }

    fn on_segment(&self, segment: usize, host: usize) -> bool {
        self.spec
            .segments
            .get(segment)
            .is_some_and(|m| m.contains(&host))
    }

    /// The address of `host` on `segment` (`None`: the host is not on it).
    pub fn addr(&self, segment: usize, host: usize) -> Option<Ipv4Addr> {
        self.on_segment(segment, host)
            .then(|| self.host_addr(segment, host))
    }

    fn live_host(&self, host: usize) -> io::Result<&str> {
        let ns = self.hosts.get(host).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("no host {host}"))
        })?;
        let destroyed = self.destroyed.lock().get(host).copied().unwrap_or(true);
        if destroyed {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("host {host} was destroyed"),
            ));
        }
        Ok(ns)
    }

    /// Destroys `host` as a power cut would: its cables are pulled first (so nothing it
    /// sends while dying, such as the resets of its closing sockets, reaches anyone), then
    /// every process in it is killed and its namespace deleted, which removes its interfaces.
    /// Its peers see a host that vanished.
    pub fn destroy_host(&self, host: usize) -> io::Result<()> {
        let ns = self.live_host(host)?.to_owned();
        for s in 0..self.spec.segments.len() {
            if self.on_segment(s, host) {
                self.tools.ip(&[
                    "-n",
                    &self.wires[s],
                    "link",
                    "set",
                    &format!("h{host}"),
                    "down",
                ])?;
            }
        }
        self.tools.remove_ns(&ns);
        if let Some(d) = self.destroyed.lock().get_mut(host) {
            *d = true;
        }
        Ok(())
    }

    /// The names of this net's namespaces (hosts, then wires), destroyed hosts included.
    pub fn namespaces(&self) -> Vec<String> {
        self.hosts.iter().chain(&self.wires).cloned().collect()
    }
}

/// The harness namespaces (`nixl-...`) that exist now, of any process.
pub fn existing_namespaces() -> Vec<String> {
    Tools::find()
        .map(|t| t.list_ns())
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.starts_with(PREFIX))
        .collect()
}

impl Drop for Net {
    fn drop(&mut self) {
        let destroyed = self.destroyed.get_mut().clone();
        for (h, ns) in self.hosts.iter().enumerate() {
            if !destroyed.get(h).copied().unwrap_or(false) {
                self.tools.remove_ns(ns);
            }
        }
        for ns in &self.wires {
            self.tools.remove_ns(ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked() {
        assert!(NetSpec::pair(2).validate().is_ok());
        assert!(NetSpec::switched(4).validate().is_ok());
        let bad = |s: NetSpec| s.validate().map_err(|e| e.kind());
        let e = Err(io::ErrorKind::InvalidInput);
        assert_eq!(bad(NetSpec::switched(0)), e);
        assert_eq!(bad(NetSpec::switched(MAX_HOSTS + 1)), e);
        assert_eq!(bad(NetSpec::pair(MAX_SEGMENTS + 1)), e);
        let mut s = NetSpec::pair(1);
        s.segments[0] = vec![0, 0];
        assert_eq!(bad(s.clone()), e);
        s.segments[0] = vec![0, 2];
        assert_eq!(bad(s.clone()), e);
        s.segments[0] = vec![];
        assert_eq!(bad(s.clone()), e);
        s.segments[0] = vec![1];
        s.lifetime = Duration::ZERO;
        assert_eq!(bad(s), e);
    }
}
