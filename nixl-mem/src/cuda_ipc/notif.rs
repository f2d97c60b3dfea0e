//! The notification channel of `CUDA_IPC`: a Unix stream socket in the abstract namespace
//! (named in the connection info), one connection per sending peer, length-prefixed frames.
//! The first frame on a connection is the sender's hello (`nixl_core::hello`: signed with the
//! cluster credential when authentication is on); each later frame is one notification,
//! attributed to the hello's sender, never to a name inside it. Bounded: hellos up to 1 KiB,
//! messages up to [`MAX_NOTIF`]; a peer that breaks the protocol or whose hello is refused is
//! disconnected.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nixl_core::backend::{NotifQueue, PeerAuth};
use nixl_core::{Error, Op, Result};

/// The largest notification accepted.
pub const MAX_NOTIF: usize = 16 << 20;
const MAX_HELLO: usize = 1024;
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The receiving side: a listener thread feeding the agent's queue; stops on drop.
pub(crate) struct NotifServer {
    name: Vec<u8>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl NotifServer {
    pub fn start(agent: &str, notifs: Arc<NotifQueue>, peers: PeerAuth) -> Result<Self> {
        let io = |e| Error::io(agent, Op::CreateBackend, e);
        let name = format!("nixl-cuda-ipc-{}-{:016x}", std::process::id(), unique()).into_bytes();
        let addr = SocketAddr::from_abstract_name(&name).map_err(io)?;
        let listener = UnixListener::bind_addr(&addr).map_err(io)?;
        listener.set_nonblocking(true).map_err(io)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nixl-cuda-ipc-notif-{agent}"))
            .spawn(move || serve(listener, s, notifs, peers))
            .map_err(io)?;
        Ok(NotifServer {
            name,
            stop,
            thread: Some(thread),
        })
    }

    /// The abstract socket name peers connect to.
    pub fn name(&self) -> &[u8] {
        &self.name
    }
}

impl Drop for NotifServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

fn unique() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    sender: Option<String>,
}

/// Parses complete frames out of `c.buf`; false when the peer broke the protocol.
fn drain_frames(c: &mut Conn, notifs: &NotifQueue, peers: &PeerAuth) -> bool {
    loop {
        if c.buf.len() < 4 {
            return true;
        }
        let n = u32::from_le_bytes([c.buf[0], c.buf[1], c.buf[2], c.buf[3]]) as usize;
        let limit = if c.sender.is_none() {
            MAX_HELLO
        } else {
            MAX_NOTIF
        };
        if n > limit {
            return false;
        }
        if c.buf.len() < 4 + n {
            return true;
        }
        let frame: Vec<u8> = c.buf[4..4 + n].to_vec();
        c.buf.drain(..4 + n);
        match &c.sender {
            None => match peers.check_hello(&frame) {
                Ok(h) => c.sender = Some(h.sender),
                Err(e) => {
                    tracing::warn!(error = %e, "CUDA_IPC notification connection refused");
                    return false;
                }
            },
            Some(s) => {
                notifs.push(s, frame);
            }
        }
    }
}

fn serve(listener: UnixListener, stop: Arc<AtomicBool>, notifs: Arc<NotifQueue>, peers: PeerAuth) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    while !stop.load(Ordering::Relaxed) {
        let mut fds: Vec<libc::pollfd> = std::iter::once(listener.as_raw_fd())
            .chain(conns.iter().map(|c| c.stream.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries for the whole call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        if n <= 0 {
            continue;
        }
        if fds[0].revents != 0 {
            while let Ok((stream, _)) = listener.accept() {
                if stream.set_nonblocking(true).is_ok() {
                    conns.push(Conn {
                        stream,
                        buf: Vec::new(),
                        sender: None,
                    });
                }
            }
        }
        let mut keep = vec![true; conns.len()];
        for (i, c) in conns.iter_mut().enumerate() {
            if fds.get(i + 1).is_none_or(|f| f.revents == 0) {
                continue;
            }
            loop {
                match c.stream.read(&mut chunk) {
                    Ok(0) => {
                        keep[i] = false;
                        break;
                    }
                    Ok(k) => {
                        c.buf.extend_from_slice(&chunk[..k]);
                        if !drain_frames(c, &notifs, &peers) {
                            tracing::warn!(
                                "CUDA_IPC notification peer broke the protocol; disconnecting it"
                            );
                            keep[i] = false;
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => {
                        keep[i] = false;
                        break;
                    }
                }
            }
        }
        let mut it = keep.into_iter();
        conns.retain(|_| it.next().unwrap_or(false));
    }
}

/// One sender's connection to one server, opened lazily.
type SenderSlot = Mutex<Option<UnixStream>>;
type SenderMap = HashMap<(String, Vec<u8>), Arc<SenderSlot>>;

/// The sending side: one lazily opened connection per peer.
pub(crate) struct NotifSenders {
    /// Signs the hello that opens each connection.
    peers: PeerAuth,
    /// (sending agent, server name) -> connection.
    conns: Mutex<SenderMap>,
}

impl NotifSenders {
    /// Senders introducing themselves with `peers`' hellos.
    pub fn new(peers: PeerAuth) -> Self {
        NotifSenders {
            peers,
            conns: Mutex::new(HashMap::new()),
        }
    }

    /// Sends `msg` as `agent` to the server named `name`; reconnects once if the cached
    /// connection broke.
    pub fn send(&self, agent: &str, remote: &str, name: &[u8], msg: &[u8]) -> Result<()> {
        if msg.len() > MAX_NOTIF {
            return Err(Error::invalid(
                agent,
                Op::GenNotif,
                format!("notification of {} bytes exceeds {MAX_NOTIF}", msg.len()),
            ));
        }
        let slot = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((agent.to_owned(), name.to_vec()))
            .or_default()
            .clone();
        let mut g = slot.lock().unwrap_or_else(|p| p.into_inner());
        let mut last_err = None;
        for _ in 0..2 {
            if g.is_none() {
                match connect(&self.peers, remote, name) {
                    Ok(s) => *g = Some(s),
                    Err(e) => {
                        last_err = Some(e);
                        break;
                    }
                }
            }
            if let Some(s) = g.as_mut() {
                match write_frame(s, msg) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        *g = None;
                        last_err = Some(e);
                    }
                }
            }
        }
        let why = last_err.map(|e| e.to_string()).unwrap_or_default();
        Err(Error::disconnected(
            agent,
            remote,
            Op::GenNotif,
            format!("notification channel: {why}"),
        ))
    }

    /// Forgets the connection to a server.
    pub fn forget(&self, name: &[u8]) {
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(_, n), _| n != name);
    }
}

fn connect(peers: &PeerAuth, remote: &str, name: &[u8]) -> std::io::Result<UnixStream> {
    let hello = peers
        .new_session()
        .and_then(|session| peers.hello(remote, &session))
        .map_err(std::io::Error::other)?;
    let addr = SocketAddr::from_abstract_name(name)?;
    let mut s = UnixStream::connect_addr(&addr)?;
    s.set_write_timeout(Some(WRITE_TIMEOUT))?;
    write_frame(&mut s, &hello)?;
    Ok(s)
}

fn write_frame(s: &mut UnixStream, b: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(4 + b.len());
    frame.extend_from_slice(&(b.len() as u32).to_le_bytes());
    frame.extend_from_slice(b);
    s.write_all(&frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn wait_for(q: &NotifQueue, n: usize) -> nixl_core::Notifs {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut all = nixl_core::Notifs::new();
        while all.values().map(Vec::len).sum::<usize>() < n && Instant::now() < deadline {
            q.wait_nonempty(Instant::now() + Duration::from_millis(20));
            q.drain_into(&mut all);
        }
        all
    }

    fn server(q: &Arc<NotifQueue>) -> NotifServer {
        NotifServer::start("b", q.clone(), PeerAuth::unauthenticated("b")).unwrap()
    }

    fn senders(me: &str) -> NotifSenders {
        NotifSenders::new(PeerAuth::unauthenticated(me))
    }

    #[test]
    fn notifications_arrive_in_order_per_sender() {
        let q = Arc::new(NotifQueue::new());
        let server = server(&q);
        let a = senders("a");
        for i in 0..50u32 {
            a.send("a", "b", server.name(), &i.to_le_bytes()).unwrap();
        }
        senders("c").send("c", "b", server.name(), b"").unwrap();
        let got = wait_for(&q, 51);
        let a: Vec<Vec<u8>> = (0..50u32).map(|i| i.to_le_bytes().to_vec()).collect();
        assert_eq!(got["a"], a);
        assert_eq!(got["c"], vec![Vec::<u8>::new()]);
    }

    #[test]
    fn protocol_breakers_are_dropped_and_others_still_served() {
        let q = Arc::new(NotifQueue::new());
        let server = server(&q);
        let addr = SocketAddr::from_abstract_name(server.name()).unwrap();
        let mut bad = UnixStream::connect_addr(&addr).unwrap();
        bad.write_all(&(u32::MAX).to_le_bytes()).unwrap();
        // A bare name instead of a hello (the old protocol): refused.
        let mut named = UnixStream::connect_addr(&addr).unwrap();
        write_frame(&mut named, b"a").unwrap();
        write_frame(&mut named, b"forged").unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let senders = senders("a");
        senders.send("a", "b", server.name(), b"ok").unwrap();
        assert_eq!(wait_for(&q, 1)["a"], vec![b"ok".to_vec()]);
        std::thread::sleep(Duration::from_millis(200));
        assert!(q.is_empty(), "a frame after a bare name was delivered");
        assert!(senders
            .send("a", "b", server.name(), &vec![0u8; MAX_NOTIF + 1])
            .is_err());
    }

    #[test]
    fn a_gone_server_is_a_typed_disconnect() {
        let q = Arc::new(NotifQueue::new());
        let server = server(&q);
        let name = server.name().to_vec();
        drop(server);
        let e = senders("a").send("a", "b", &name, b"x").unwrap_err();
        assert_eq!(e.kind().as_str(), "remote_disconnect");
    }
}
