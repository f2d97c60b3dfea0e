//! Same-host peers proven by the kernel: beside its TCP port, a listening agent serves its side
//! channel on a Unix socket (Linux's abstract namespace, named after the port), and a client
//! whose server is on a loopback address speaks over it. Either end then learns from the
//! kernel (`SO_PEERCRED`) which process and user is on the other end, so without a credential a
//! name can stay with the process that published it, only that process can invalidate it, and
//! another user's process is refused (`docs/security.md`, "One host").

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

/// Binds the Unix side channel of the TCP side channel on `port` (non-blocking). `None` where
/// it cannot (another process holds the name; not Linux): same-host clients then fall back to
/// TCP, which a listener without a credential refuses (see `listener`).
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
