//! Waiting for connections without polling: every listener of the crate (the side channel,
//! NIXL's side channel, the TCPStore server) waits in poll(2) on its sockets, so a connection
//! is taken the moment it arrives and an idle listener wakes once a [`TICK`] to look at its
//! stop flag; the owner wakes it at once when it stops ([`wake`]).

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::time::Duration;

/// How long a listener waits for a connection before it looks at its stop flag again.
pub(crate) const TICK: Duration = Duration::from_millis(100);

/// Waits until one of `listeners` has a connection to accept, or [`TICK`] passed.
pub(crate) fn wait_readable(listeners: &[&dyn AsFd]) {
    let tick = Timespec {
        tv_sec: 0,
        tv_nsec: TICK.as_nanos() as _,
    };
    let mut fds: Vec<PollFd<'_>> = listeners
        .iter()
        .map(|l| PollFd::from_borrowed_fd(l.as_fd(), PollFlags::IN))
        .collect();
    if let Err(e) = poll(&mut fds, Some(&tick)) {
        if e != rustix::io::Errno::INTR {
            // Not expected on a listening socket; do not spin on it.
            tracing::warn!(error = %e, "poll on a listener failed");
            std::thread::sleep(TICK);
        }
    }
}

/// Wakes a listener of `addr` waiting in [`wait_readable`] (its owner set the stop flag
/// first): a connection it accepts and drops.
pub(crate) fn wake(addr: SocketAddr) {
    let _ = TcpStream::connect_timeout(&addr, Duration::from_millis(50));
}
