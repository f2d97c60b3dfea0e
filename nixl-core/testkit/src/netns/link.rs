//! Faults and measurements on the links: cables pulled and plugged, segments slowed down,
//! interface counters, and waiting for carriers to come up.

use std::io;
use std::time::{Duration, Instant};

use super::cmd::{self, unsupported};
use super::{IfCounters, Net, CARRIER_TIMEOUT};

impl Net {
    pub(super) fn check_port(&self, segment: usize, host: usize) -> io::Result<()> {
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
    pub(super) fn wait_carrier(&self, host: usize, segment: Option<usize>) -> io::Result<()> {
        let ns = self.live_host(host)?;
        let want: Vec<String> = (0..self.spec.segments.len())
            .filter(|&s| segment.is_none_or(|x| x == s) && self.on_segment(s, host))
            .map(Self::ifname)
            .collect();
        let end = Instant::now() + CARRIER_TIMEOUT;
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
            if Instant::now() >= end {
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

    /// Pins, in `host`, the link addresses of every other host of its segments (permanent
    /// neighbour entries): a host whose cable is then pulled is silent, not unreachable
    /// (packets to it leave and vanish, as behind a router or a firewall that drops them,
    /// instead of failing at once for want of an ARP answer).
    pub fn pin_neighbors(&self, host: usize) -> io::Result<()> {
        let ns = self.live_host(host)?.to_owned();
        for (s, members) in self.spec.segments.iter().enumerate() {
            if !members.contains(&host) {
                continue;
            }
            let dev = Self::ifname(s);
            for &other in members.iter().filter(|&&h| h != host) {
                let other_ns = self.live_host(other)?;
                let out = self
                    .tools
                    .ip(&["-n", other_ns, "-br", "link", "show", &dev])?;
                let text = String::from_utf8_lossy(&out.stdout);
                let mac = text.split_whitespace().nth(2).ok_or_else(|| {
                    io::Error::other(format!("host {other}: no link address of {dev}: {text}"))
                })?;
                let ip = self.host_addr(s, other).to_string();
                self.tools.ip(&[
                    "-n",
                    &ns,
                    "neigh",
                    "replace",
                    &ip,
                    "lladdr",
                    mac,
                    "dev",
                    &dev,
                    "nud",
                    "permanent",
                ])?;
            }
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
}
