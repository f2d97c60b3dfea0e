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
//! use nixl_core::testing::netns::{Net, NetSpec};
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
mod process;

use std::io;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
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

    fn check_port(&self, segment: usize, host: usize) -> io::Result<()> {
        if self.on_segment(segment, host) {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("host {host} is not on segment {segment}"),
            ))
        }
    }

    /// Plugs (`up`) or pulls (`!up`) the cable of `host` on `segment`: the wire's port goes
    /// down, the host's interface loses its carrier and keeps its address and routes. A plug
    /// returns once the host's interface is up again.
    pub fn set_port(&self, segment: usize, host: usize, up: bool) -> io::Result<()> {
        self.check_port(segment, host)?;
        let port = format!("h{host}");
        let state = if up { "up" } else { "down" };
        self.tools
            .ip(&["-n", &self.wires[segment], "link", "set", &port, state])?;
        if up {
            self.wait_carrier(host, Some(segment))?;
        }
        Ok(())
    }

    /// Waits (up to [`CARRIER_TIMEOUT`]) until `host`'s interface on `segment` (or every
    /// interface of the host) is up with a carrier: the kernel reports carrier changes with a
    /// delay of up to a second, and a program that lists interfaces before then (libfabric's
    /// tcp provider does) would not see it.
    fn wait_carrier(&self, host: usize, segment: Option<usize>) -> io::Result<()> {
        let ns = self.live_host(host)?;
        let want: Vec<String> = (0..self.spec.segments.len())
            .filter(|&s| segment.is_none_or(|x| x == s) && self.on_segment(s, host))
            .map(Self::ifname)
            .collect();
        let end = std::time::Instant::now() + CARRIER_TIMEOUT;
        loop {
            let out = self.tools.ip(&["-n", ns, "-br", "link", "show"])?;
            let text = String::from_utf8_lossy(&out.stdout);
            let up = |name: &str| {
                text.lines().any(|l| {
                    let mut w = l.split_whitespace();
                    let n = w.next().unwrap_or("");
                    n.split('@').next() == Some(name) && w.next() == Some("UP")
                })
            };
            if want.iter().all(|n| up(n)) {
                return Ok(());
            }
            if std::time::Instant::now() >= end {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("host {host}: {want:?} not up after {CARRIER_TIMEOUT:?}: {text}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Pulls (or plugs) every cable of `segment`: the whole rail fails.
    pub fn set_segment(&self, segment: usize, up: bool) -> io::Result<()> {
        let members = self.spec.segments.get(segment).cloned().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("no segment {segment}"))
        })?;
        for h in members {
            self.set_port(segment, h, up)?;
        }
        Ok(())
    }

    /// Limits what `segment` delivers to each of its hosts to `bits_per_sec` (tc `tbf` on the
    /// wire's ports), or removes the limit (`None`). `Unsupported` without `tc` or `sch_tbf`.
    pub fn limit_rate(&self, segment: usize, bits_per_sec: Option<u64>) -> io::Result<()> {
        let tc = self
            .tools
            .tc
            .clone()
            .ok_or_else(|| unsupported("`tc` not found (install iproute2)"))?;
        let members = self.spec.segments.get(segment).cloned().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("no segment {segment}"))
        })?;
        let wire = &self.wires[segment];
        for h in members {
            let port = format!("h{h}");
            match bits_per_sec {
                Some(rate) if rate > 0 => {
                    // A burst of 10 ms of traffic (at least 64 KiB, so GSO packets pass), and
                    // a queue of 200 ms: TCP sees a slow link, not a lossy one.
                    let burst = (rate / 8 / 100).max(64 << 10);
                    cmd::run(
                        &tc,
                        &[
                            "-n",
                            wire,
                            "qdisc",
                            "replace",
                            "dev",
                            &port,
                            "root",
                            "tbf",
                            "rate",
                            &format!("{rate}bit"),
                            "burst",
                            &burst.to_string(),
                            "latency",
                            "200ms",
                        ],
                    )
                    .map_err(|e| unsupported(format!("tc tbf: {e}")))?;
                }
                _ => {
                    // No qdisc to delete is fine.
                    let _ = cmd::run(&tc, &["-n", wire, "qdisc", "del", "dev", &port, "root"]);
                }
            }
        }
        Ok(())
    }

    /// The byte counters of `host`'s interface on `segment`, read from
    /// `/sys/class/net/eth<segment>/statistics` inside the host.
    pub fn counters(&self, segment: usize, host: usize) -> io::Result<IfCounters> {
        self.check_port(segment, host)?;
        let dir = format!("/sys/class/net/{}/statistics", Self::ifname(segment));
        let out = self.tools.ip(&[
            "netns",
            "exec",
            &self.hosts[host],
            "cat",
            &format!("{dir}/rx_bytes"),
            &format!("{dir}/tx_bytes"),
        ])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut v = text.split_whitespace().map(str::parse::<u64>);
        match (v.next(), v.next()) {
            (Some(Ok(rx_bytes)), Some(Ok(tx_bytes))) => Ok(IfCounters { rx_bytes, tx_bytes }),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected counters {text:?}"),
            )),
        }
    }

    /// Starts `cmd` (program, arguments, environment and directory are taken from it) inside
    /// `host` with piped stdio; see [`HostProcess`] and [`Control`].
    pub fn spawn(&self, host: usize, label: &str, cmd: &Command) -> io::Result<HostProcess> {
        let ns = self.live_host(host)?;
        // Inside the new namespaces: a private /dev/shm, the host's name, then the program
        // under `timeout` (it is PID 1 there, so when it ends every process of the host ends).
        let script = "mount -t tmpfs -o mode=1777,size=256m nixl-shm /dev/shm \
                      && echo \"nixl-h$NIXL_NETNS_HOST\" > /proc/sys/kernel/hostname \
                      && exec \"$@\"";
        let mut c = Command::new(&self.tools.ip);
        c.args(["netns", "exec", ns])
            .arg(&self.tools.unshare)
            .args([
                "--pid",
                "--mount",
                "--uts",
                "--ipc",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--",
            ])
            .arg(&self.tools.sh)
            .args(["-c", script, "nixl-host"])
            .arg(&self.tools.timeout)
            .args([
                "-s",
                "KILL",
                &format!("{}s", self.spec.lifetime.as_secs().max(1)),
            ])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(d) = cmd.get_current_dir() {
            c.current_dir(d);
        }
        c.env(ENV_HOST, host.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = c.spawn()?;
        HostProcess::new(format!("h{host}:{label}"), child)
    }

    /// Starts this test binary again inside `host`, running only the (ignored) test `test`
    /// with `--nocapture`, with extra environment `env`: the usual child-process entry point
    /// of a test file.
    pub fn spawn_test(
        &self,
        host: usize,
        test: &str,
        env: &[(&str, String)],
    ) -> io::Result<HostProcess> {
        let exe = std::env::current_exe()?;
        let mut c = Command::new(exe);
        c.args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        for (k, v) in env {
            c.env(k, v);
        }
        self.spawn(host, test, &c)
    }

    fn live_host(&self, host: usize) -> io::Result<&str> {
        let ns = self.hosts.get(host).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("no host {host}"))
        })?;
        let destroyed = self
            .destroyed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(host)
            .copied()
            .unwrap_or(true);
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
        if let Some(d) = self
            .destroyed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(host)
        {
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
        let destroyed = self
            .destroyed
            .get_mut()
            .map(|d| d.clone())
            .unwrap_or_default();
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
