//! Same-host peers proven by the kernel: beside its TCP port, a listening agent serves its side
//! channel on a Unix socket (Linux's abstract namespace, named after the port), and a client
//! whose server is on a loopback address speaks over it. Either end then learns from the
//! kernel (`SO_PEERCRED`) which process and user is on the other end, so without a credential a
//! name can stay with the process that published it, only that process can invalidate it, and
//! another user's process is refused (`docs/security.md`, "One host").
//!
//! The abstract namespace lets any process bind any name, so the name alone proves nothing: a
//! server that cannot bind the name of its own TCP port does not start (the holder squats it),
//! and a client checks that the process serving the name owns the TCP port it asked for
//! ([`owns_tcp_port`]) before it believes anything that process says.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use crate::liveness::ProcessId;

/// The abstract Unix socket name of the side channel on TCP port `port`.
fn name(port: u16) -> String {
    format!("nixl-side-channel:{port}")
}

/// Binds the Unix side channel of the TCP side channel on `port` (non-blocking).
/// `AddrInUse` when another process holds the name: the listener then refuses to start (or
/// picks another ephemeral port), since same-host clients would reach that process instead.
pub(crate) fn bind(port: u16) -> std::io::Result<UnixListener> {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name(port))?;
    let l = UnixListener::bind_addr(&addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Connects to the Unix side channel of a server at `addr`, when `addr` is a loopback
/// address and the server has one: `Ok(None)` otherwise. Never blocks past `deadline` (a
/// listener whose queue is full is retried until then).
pub(crate) fn connect(addr: SocketAddr, deadline: Instant) -> std::io::Result<Option<UnixStream>> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    if !addr.ip().is_loopback() {
        return Ok(None);
    }
    let target = SocketAddrUnix::new_abstract_name(name(addr.port()).as_bytes())?;
    loop {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        match rustix::net::connect(&fd, &target) {
            Ok(()) => {
                let s = UnixStream::from(fd);
                s.set_nonblocking(false)?;
                return Ok(Some(s));
            }
            // No such socket: the server has no Unix side channel (TCP then).
            Err(rustix::io::Errno::CONNREFUSED | rustix::io::Errno::NOENT) => return Ok(None),
            // Its queue is full: retry until the deadline.
            Err(rustix::io::Errno::AGAIN) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(rustix::io::Errno::AGAIN) => return Err(std::io::ErrorKind::TimedOut.into()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The inodes of the TCP sockets listening on `addr`'s port in this network namespace
/// (`/proc/net/tcp` and `tcp6`: on `addr`'s IP or on the wildcard address).
///
/// The kernel lists a table's listening sockets first, then every other socket of the
/// namespace (on a busy host, tens of thousands, which it walks as the file is read: 5-10 ms
/// per table on the 2-core VM). The tables are read line by line and left at the first socket
/// that does not listen; only where that finds none (a kernel that orders them otherwise) are
/// the whole tables read.
fn listening_inodes(addr: SocketAddr) -> Vec<u64> {
    // The kernel's socket diagnostics answer for listening sockets alone, without walking
    // the others; `/proc` where netlink is not to be had.
    if let Some(found) = diag::listening_inodes(addr) {
        return found;
    }
    let out = listening_inodes_in(addr, true);
    if out.is_empty() {
        listening_inodes_in(addr, false)
    } else {
        out
    }
}

/// Listening TCP sockets from the kernel's socket diagnostics (`NETLINK_SOCK_DIAG`, a dump
/// asking for the LISTEN state only: the kernel then reads its listening tables alone).
mod diag {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    use rustix::net::{netlink, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_DUMP: u16 = 0x300;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const TCP_LISTEN: u32 = 10;
    /// Bytes of `nlmsghdr` and of `inet_diag_msg` up to and with its inode.
    const HDR: usize = 16;
    const MSG: usize = 72;

    /// The inodes of the sockets listening on `addr` (its IP or a wildcard, both families);
    /// `None` where the kernel does not answer (no netlink here).
    pub(super) fn listening_inodes(addr: SocketAddr) -> Option<Vec<u64>> {
        let mut out = Vec::new();
        for family in [libc_af(false), libc_af(true)] {
            dump(family, addr, &mut out)?;
        }
        Some(out)
    }

    fn libc_af(v6: bool) -> u8 {
        if v6 {
            10
        } else {
            2
        }
    }

    fn dump(family: u8, addr: SocketAddr, out: &mut Vec<u64>) -> Option<()> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            Some(netlink::SOCK_DIAG),
        )
        .ok()?;
        // A reply that never comes must not hold a fetch: the socket times out.
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(std::time::Duration::from_millis(200)),
        )
        .ok()?;
        let mut req = Vec::with_capacity(HDR + 56);
        req.extend_from_slice(&((HDR + 56) as u32).to_ne_bytes());
        req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        req.extend_from_slice(&1u32.to_ne_bytes()); // sequence
        req.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
        req.extend_from_slice(&[family, 6 /* TCP */, 0, 0]);
        req.extend_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
        req.extend_from_slice(&[0u8; 48]); // the socket id: any
        rustix::net::send(&fd, &req, SendFlags::empty()).ok()?;
        let mut buf = vec![0u8; 32 * 1024];
        // Bounded: a dump of the listening sockets ends; at most this many reads.
        for _ in 0..4096 {
            let (n, _) = rustix::net::recv(&fd, &mut buf[..], RecvFlags::empty()).ok()?;
            let mut msgs = buf.get(..n)?;
            while msgs.len() >= HDR {
                let len = u32::from_ne_bytes(msgs[0..4].try_into().ok()?) as usize;
                let kind = u16::from_ne_bytes(msgs[4..6].try_into().ok()?);
                if len < HDR || len > msgs.len() {
                    return None;
                }
                match kind {
                    NLMSG_DONE => return Some(()),
                    NLMSG_ERROR => return None,
                    SOCK_DIAG_BY_FAMILY if len >= HDR + MSG => {
                        if let Some(inode) = serves(&msgs[HDR..len], addr) {
                            out.push(inode);
                        }
                    }
                    _ => {}
                }
                // Messages are 4-byte aligned.
                msgs = msgs.get(len.next_multiple_of(4)..).unwrap_or(&[]);
            }
        }
        None
    }

    /// The inode of an `inet_diag_msg` whose socket listens on `addr`'s port and IP (or a
    /// wildcard).
    fn serves(m: &[u8], addr: SocketAddr) -> Option<u64> {
        let family = *m.first()?;
        let port = u16::from_be_bytes(m.get(4..6)?.try_into().ok()?);
        if port != addr.port() {
            return None;
        }
        let src = m.get(8..24)?;
        let bound = match family {
            2 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&src[..4]).ok()?)),
            10 => {
                let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(src).ok()?);
                v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
            }
            _ => return None,
        };
        if !(bound.is_unspecified() || bound == addr.ip()) {
            return None;
        }
        Some(u64::from(u32::from_ne_bytes(
            m.get(68..72)?.try_into().ok()?,
        )))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_kernel_names_a_listener_as_proc_does() {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let Some(found) = listening_inodes(addr) else {
                eprintln!("skipped: no NETLINK_SOCK_DIAG here");
                return;
            };
            assert_eq!(found, super::super::listening_inodes_in(addr, false));
            assert_eq!(found.len(), 1);
            drop(l);
            assert_eq!(listening_inodes(addr), Some(Vec::new()));
        }
    }
}

fn listening_inodes_in(addr: SocketAddr, listeners_first: bool) -> Vec<u64> {
    use std::io::BufRead;
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(file) = std::fs::File::open(table) else {
            continue;
        };
        // Small reads: the kernel formats only as many sockets as a read asks for.
        for line in std::io::BufReader::with_capacity(512, file).lines().skip(1) {
            let Ok(line) = line else {
                break;
            };
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            if *state != "0A" {
                if listeners_first {
                    break;
                }
                continue;
            }
            let Some((ip, port)) = local.split_once(':') else {
                continue;
            };
            if u16::from_str_radix(port, 16).ok() != Some(addr.port()) {
                continue;
            }
            if !proc_ip_serves(ip, addr.ip()) {
                continue;
            }
            if let Ok(i) = inode.parse() {
                out.push(i);
            }
        }
    }
    out
}

/// Whether a listening socket bound to `hex` (a `/proc/net/tcp{,6}` address: 32-bit words in
/// the kernel's byte order) accepts connections to `ip`: the same address, or a wildcard.
fn proc_ip_serves(hex: &str, ip: std::net::IpAddr) -> bool {
    let words: Option<Vec<u32>> = (0..hex.len() / 8)
        .map(|i| {
            hex.get(i * 8..i * 8 + 8)
                .and_then(|w| u32::from_str_radix(w, 16).ok())
                .map(u32::from_be)
        })
        .collect();
    let Some(words) = words else {
        return false;
    };
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
    let bound = match bytes.len() {
        4 => std::net::IpAddr::from(<[u8; 4]>::try_from(bytes).unwrap_or_default()),
        16 => {
            let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap_or_default());
            v6.to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4)
        }
        _ => return false,
    };
    bound.is_unspecified() || bound == ip
}

/// Whether process `pid` holds a socket listening on `addr`'s TCP port (one of its open files
/// is that socket): the check that the process serving a port's Unix side channel is the one
/// serving the port. Reads `/proc/<pid>/fd`, which needs the same user (the only servers a
/// client talks to over Unix); `false` when it cannot tell.
///
/// Walking a process's file table costs about 1 us per open file (a serving process holds
/// hundreds: sockets, devices, a GPU driver's), so where each socket sat is remembered per
/// process ([`SocketFds`]) and a later check reads the one link the hint names. A hint is
/// never believed: the kernel's answer for that link decides, and a miss walks the table.
pub(crate) fn owns_tcp_port(pid: u32, addr: SocketAddr) -> bool {
    owns_tcp_port_with(&SOCKET_FDS, pid, addr)
}

fn owns_tcp_port_with(seen: &SocketFds, pid: u32, addr: SocketAddr) -> bool {
    let inodes = listening_inodes(addr);
    if inodes.is_empty() {
        return false;
    }
    let hints: Vec<(u64, u32)> = {
        let seen = seen.0.lock();
        seen.get(&pid).map_or_else(Vec::new, |fds| {
            inodes
                .iter()
                .filter_map(|i| fds.get(i).map(|&fd| (*i, fd)))
                .collect()
        })
    };
    if hints
        .iter()
        .any(|&(inode, fd)| socket_inode(format!("/proc/{pid}/fd/{fd}")) == Some(inode))
    {
        return true;
    }
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let mut fds = HashMap::new();
    for e in dir.flatten() {
        let fd = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok());
        if let (Some(fd), Some(inode)) = (fd, socket_inode(e.path())) {
            if fds.len() < SocketFds::PER_PROCESS {
                fds.insert(inode, fd);
            }
            if inodes.contains(&inode) {
                seen.remember(pid, fds);
                return true;
            }
        }
    }
    seen.remember(pid, fds);
    false
}

/// The inode of the socket a `/proc/<pid>/fd/<n>` link names (`socket:[inode]`).
fn socket_inode(link: impl AsRef<std::path::Path>) -> Option<u64> {
    let t = std::fs::read_link(link).ok()?;
    t.to_str()?
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Where each process's sockets were last seen (pid -> socket inode -> fd): hints for
/// [`owns_tcp_port`], bounded (a process's first [`SocketFds::PER_PROCESS`] sockets, the last
/// [`SocketFds::PROCESSES`] processes walked; past that the map starts over).
struct SocketFds(parking_lot::Mutex<HashMap<u32, HashMap<u64, u32>>>);

static SOCKET_FDS: std::sync::LazyLock<SocketFds> =
    std::sync::LazyLock::new(|| SocketFds(parking_lot::Mutex::new(HashMap::new())));

impl SocketFds {
    const PER_PROCESS: usize = 1 << 16;
    const PROCESSES: usize = 1024;

    fn remember(&self, pid: u32, fds: HashMap<u64, u32>) {
        let mut seen = self.0.lock();
        if seen.len() >= Self::PROCESSES && !seen.contains_key(&pid) {
            seen.clear();
        }
        seen.insert(pid, fds);
    }
}

/// The process and user on the other end of a Unix connection, as the kernel tells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalPeer {
    /// Its process (start time read from `/proc` after the kernel named the pid).
    pub process: ProcessId,
    /// Its effective user id.
    pub uid: u32,
}

impl LocalPeer {
    /// The peer of `s`, or `None` when the kernel cannot name it (a process in a pid namespace
    /// this one cannot see, or one that already exited).
    pub(crate) fn of(s: &UnixStream) -> Option<LocalPeer> {
        let cred = rustix::net::sockopt::socket_peercred(s).ok()?;
        let pid = u32::try_from(cred.pid.as_raw_nonzero().get()).ok()?;
        let me = ProcessId::current()?;
        let process = ProcessId {
            pid,
            start_time: crate::liveness::start_time(&pid.to_string())?,
            ..me
        };
        Some(LocalPeer {
            process,
            uid: cred.uid.as_raw(),
        })
    }

    /// Whether it runs as the same user as this process.
    pub(crate) fn same_user(&self) -> bool {
        self.uid == rustix::process::geteuid().as_raw()
    }

    /// Whether `claimed` (a process a peer's metadata announces) is this peer's process.
    pub(crate) fn is(&self, claimed: Option<&ProcessId>) -> bool {
        claimed.is_some_and(|c| {
            c.pid == self.process.pid
                && c.start_time == self.process.start_time
                && c.boot_id == self.process.boot_id
                && c.pid_ns == self.process.pid_ns
        })
    }
}

/// A side-channel connection: TCP, or the same-host Unix socket.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// Blocking, without Nagle's delay (TCP).
    pub(crate) fn prepare(&self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_nonblocking(false)?;
                s.set_nodelay(true)
            }
            Stream::Unix(s) => s.set_nonblocking(false),
        }
    }

    /// The peer, when the kernel names it (Unix connections).
    pub(crate) fn local_peer(&self) -> Option<LocalPeer> {
        match self {
            Stream::Tcp(_) => None,
            Stream::Unix(s) => LocalPeer::of(s),
        }
    }
}

/// A stream whose reads and writes can time out.
pub(crate) trait Timed {
    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()>;
    fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()>;
    fn read_some(&self, buf: &mut [u8]) -> std::io::Result<usize>;
    fn write_some(&self, buf: &[u8]) -> std::io::Result<usize>;
}

impl Timed for TcpStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        TcpStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        TcpStream::set_write_timeout(self, d)
    }
    fn read_some(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&mut &*self).read(buf)
    }
    fn write_some(&self, buf: &[u8]) -> std::io::Result<usize> {
        (&mut &*self).write(buf)
    }
}

impl Timed for UnixStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        UnixStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        UnixStream::set_write_timeout(self, d)
    }
    fn read_some(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&mut &*self).read(buf)
    }
    fn write_some(&self, buf: &[u8]) -> std::io::Result<usize> {
        (&mut &*self).write(buf)
    }
}

impl Timed for Stream {
    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => Timed::set_read_timeout(s, d),
            Stream::Unix(s) => Timed::set_read_timeout(s, d),
        }
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => Timed::set_write_timeout(s, d),
            Stream::Unix(s) => Timed::set_write_timeout(s, d),
        }
    }
    fn read_some(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read_some(buf),
            Stream::Unix(s) => s.read_some(buf),
        }
    }
    fn write_some(&self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_some(buf),
            Stream::Unix(s) => s.write_some(buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_addresses_are_read_in_the_kernels_byte_order() {
        let lo = "127.0.0.1".parse().unwrap();
        assert!(proc_ip_serves("0100007F", lo));
        assert!(proc_ip_serves("00000000", lo));
        assert!(!proc_ip_serves("0200007F", lo));
        assert!(proc_ip_serves("0000000000000000FFFF00000100007F", lo));
        assert!(proc_ip_serves(
            "00000000000000000000000001000000",
            "::1".parse().unwrap()
        ));
        assert!(!proc_ip_serves("zz", lo));
    }

    #[test]
    fn this_process_owns_its_listening_port_and_no_other() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        assert!(owns_tcp_port(std::process::id(), addr));
        drop(l);
        assert!(!owns_tcp_port(std::process::id(), addr));
    }

    /// The per-process hints only save the walk: a hint that names another process's socket
    /// (or a link that no longer is that socket) is checked against the kernel and loses.
    #[test]
    fn a_hint_never_vouches_for_a_process() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let me = std::process::id();
        let seen = SocketFds(parking_lot::Mutex::new(HashMap::new()));
        assert!(owns_tcp_port_with(&seen, me, addr));
        let hinted = seen.0.lock().get(&me).cloned().unwrap();
        let inode = listening_inodes(addr)[0];
        assert!(
            hinted.contains_key(&inode),
            "the walk remembers the listener"
        );
        // Another process (no socket of ours) given our listener's fd as its hint.
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        seen.remember(other.id(), hinted.clone());
        assert!(!owns_tcp_port_with(&seen, other.id(), addr));
        // Our own hint pointing at the wrong fd: the walk finds the right one again.
        seen.remember(me, hinted.keys().map(|&i| (i, 0)).collect());
        assert!(owns_tcp_port_with(&seen, me, addr));
        assert_eq!(seen.0.lock()[&me].get(&inode), hinted.get(&inode));
        let _ = other.kill();
        let _ = other.wait();
    }
}
