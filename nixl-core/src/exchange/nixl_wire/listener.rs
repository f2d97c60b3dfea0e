//! NIXL's `NIXLCOMM` side channel: a listener that serves NIXL agents (and nixl-rs agents
//! speaking NIXL's wire), and the client calls that reach a NIXL agent's listener.

use parking_lot::Mutex;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::comm::{encode_command, parse_body, read_frame, write_frame, Command};
use super::Wire;
use crate::agent::{Agent, Shared};
use crate::error::{Error, Op, Result};
use crate::sidechannel::frame::Deadlined;

/// Most connections served at once ([`NixlListener::MAX_CONNECTIONS`]).
const MAX_CONNECTIONS: usize = 64;
/// How long a whole frame may take to arrive once its first byte did (NIXL 1.5 uses 5 s):
/// one deadline for the frame, not per read, so a client that trickles bytes is cut off.
const FRAME_TIMEOUT: Duration = Duration::from_secs(5);
/// How often idle connections look at the stop flag.
const IDLE_TICK: Duration = Duration::from_millis(200);

/// Serves NIXL's side channel for an agent: `LOAD` loads the blob, `SEND` answers with the
/// agent's NIXL metadata on the same connection, `INVL` forgets a NIXL peer (never a nixl-rs
/// one: the command is unauthenticated). Connections stay open for many frames, as NIXL
/// reuses them. Stops when dropped.
///
/// Under the side channel's rules: NIXL's wire has no authentication, so the listener binds
/// a loopback address only, unless the agent opted out by name
/// ([`crate::AgentConfig::allow_unauthenticated_listener`]); each frame has one deadline from
/// its first byte (5 s); at [`NixlListener::MAX_CONNECTIONS`] the longest-idle connection is
/// evicted.
pub struct NixlListener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for NixlListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NixlListener")
            .field("addr", &self.addr)
            .finish()
    }
}

impl NixlListener {
    /// Most connections served at once: at the limit the connection idle the longest (waiting
    /// for its next frame) is closed to make room; when every one is mid-frame, the new one is.
    pub const MAX_CONNECTIONS: usize = MAX_CONNECTIONS;

    /// Binds `addr` (port 0 picks one; NIXL's default port is 8888) and starts serving.
    pub fn start(agent: &Agent, addr: SocketAddr) -> Result<Self> {
        let name = agent.name().to_owned();
        if !addr.ip().is_loopback() && !agent.shared.config.allow_unauthenticated_listener {
            return Err(Error::not_allowed(
                &name,
                Op::Exchange,
                format!(
                    "NIXL's side channel has no authentication: a NixlListener on {addr} would                      let anyone who reaches it load metadata into this agent; listen on                      127.0.0.1, or opt out with AgentConfig::allow_unauthenticated_listener"
                ),
            ));
        }
        let io = |e| Error::io(&name, Op::Exchange, e);
        let listener = TcpListener::bind(addr).map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        listener.set_nonblocking(true).map_err(io)?;
        let stop = Arc::new(AtomicBool::new(false));
        let weak = Arc::downgrade(&agent.shared);
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nixl-comm-{name}"))
            .spawn(move || accept_loop(listener, weak, st))
            .map_err(io)?;
        Ok(NixlListener {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for NixlListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        crate::exchange::accept::wake(self.addr);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("NIXLCOMM listener thread panicked");
            }
        }
    }
}

/// A connection being served: whether it is mid-frame, and since when it is idle.
struct Slot {
    id: u64,
    stream: TcpStream,
    busy: Arc<AtomicBool>,
    idle_since: Arc<Mutex<Instant>>,
}

/// The connections being served.
#[derive(Default)]
struct Slots {
    slots: Mutex<Vec<Slot>>,
    next: AtomicU64,
}

impl Slots {
    /// Makes room for one more connection: at the limit, closes the one idle the longest;
    /// false when every one is mid-frame.
    fn admit(&self) -> bool {
        let mut g = self.slots.lock();
        if g.len() < MAX_CONNECTIONS {
            return true;
        }
        let victim = g
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.busy.load(Ordering::Acquire))
            .min_by_key(|(_, c)| *c.idle_since.lock())
            .map(|(i, _)| i);
        match victim {
            Some(i) => {
                let c = g.swap_remove(i);
                let _ = c.stream.shutdown(std::net::Shutdown::Both);
                tracing::debug!("NIXLCOMM full: closed the connection idle the longest");
                true
            }
            None => false,
        }
    }

    fn forget(&self, id: u64) {
        self.slots.lock().retain(|c| c.id != id);
    }
}

fn accept_loop(listener: TcpListener, agent: Weak<Shared>, stop: Arc<AtomicBool>) {
    let slots = Arc::new(Slots::default());
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((s, peer)) => {
                // The owner's wake-up when it stops (`accept::wake`): serve nothing more.
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                if !slots.admit() {
                    tracing::warn!(%peer, "NIXLCOMM: every connection is mid-frame; closing this one");
                    continue;
                }
                let Ok(clone) = s.try_clone() else { continue };
                let id = slots.next.fetch_add(1, Ordering::Relaxed);
                let busy = Arc::new(AtomicBool::new(false));
                let idle_since = Arc::new(Mutex::new(Instant::now()));
                slots.slots.lock().push(Slot {
                    id,
                    stream: clone,
                    busy: busy.clone(),
                    idle_since: idle_since.clone(),
                });
                let (agent, stop, slots2) = (agent.clone(), stop.clone(), slots.clone());
                let spawned = std::thread::Builder::new()
                    .name("nixl-comm-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve(s, &agent, &stop, &busy, &idle_since) {
                            tracing::debug!(%peer, error = %e, "NIXLCOMM connection ended");
                        }
                        slots2.forget(id);
                    });
                if spawned.is_err() {
                    slots.forget(id);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                crate::exchange::accept::wait_readable(&[&listener])
            }
            Err(e) => {
                tracing::warn!(error = %e, "NIXLCOMM accept failed");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    for c in slots.slots.lock().drain(..) {
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Serves one connection until the peer closes it, a frame is bad or late, the connection is
/// evicted, or the listener stops.
fn serve(
    s: TcpStream,
    agent: &Weak<Shared>,
    stop: &AtomicBool,
    busy: &AtomicBool,
    idle_since: &Mutex<Instant>,
) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    loop {
        // Wait for the first byte of a frame, looking at the stop flag every tick.
        s.set_read_timeout(Some(IDLE_TICK))?;
        let mut first = [0u8; 1];
        match s.peek(&mut first) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if stop.load(Ordering::Relaxed) || agent.strong_count() == 0 {
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(e),
        }
        busy.store(true, Ordering::Release);
        // One deadline for the whole frame and its handling (answer included).
        let mut io = Deadlined {
            stream: &s,
            deadline: Instant::now() + FRAME_TIMEOUT,
        };
        let body = read_frame(&mut io)?;
        let Some(shared) = agent.upgrade() else {
            return Ok(());
        };
        let agent = Agent { shared };
        let cmds = parse_body(&body)
            .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e.to_string()))?;
        for c in cmds {
            match c {
                Command::Load(blob) => {
                    if let Err(e) = agent.load_remote_metadata(&blob) {
                        // NIXL's protocol has no answer for LOAD: log, as NIXL does.
                        tracing::warn!(agent = %agent.name(), error = %e, "NIXLCOMM LOAD refused");
                    }
                }
                Command::Send => {
                    let reply = agent
                        .nixl_full_metadata()
                        .ok()
                        .and_then(|md| encode_command(&Command::Load(md)));
                    match reply {
                        Some(r) => {
                            // The answer gets at least a moment past a late request.
                            io.deadline =
                                io.deadline.max(Instant::now() + Duration::from_millis(200));
                            write_frame(&mut io, &r)?
                        }
                        None => {
                            tracing::warn!(agent = %agent.name(), "NIXLCOMM SEND: metadata unavailable or holds the NIXLCOMM marker")
                        }
                    }
                }
                Command::Invalidate(name) => {
                    if agent.peer_wire(&name) == Some(Wire::Nixl) {
                        if let Err(e) = agent.invalidate_remote_metadata(&name) {
                            tracing::debug!(agent = %agent.name(), error = %e, "NIXLCOMM INVL");
                        }
                    } else {
                        tracing::debug!(agent = %agent.name(), remote = %name, "NIXLCOMM INVL ignored: not a NIXL peer loaded here");
                    }
                }
            }
        }
        *idle_since.lock() = Instant::now();
        busy.store(false, Ordering::Release);
    }
}

pub(crate) fn connect(addr: SocketAddr, deadline: Instant) -> std::io::Result<TcpStream> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ErrorKind::TimedOut.into());
    }
    let s = TcpStream::connect_timeout(&addr, left)?;
    s.set_nodelay(true)?;
    let io = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(io))?;
    s.set_write_timeout(Some(io))?;
    Ok(s)
}
