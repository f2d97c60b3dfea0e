//! The notification channel of `CUDA_IPC`: a Unix stream socket in the abstract namespace
//! (named in the connection info), one connection per sending peer, length-prefixed frames.
//! The first frame on a connection is the sender's hello (`nixl_core::backend::hello`: signed with the
//! cluster credential when authentication is on); each later frame is one notification,
//! attributed to the hello's sender, never to a name inside it. Bounded: hellos up to
//! [`MAX_HELLO`] bytes, messages up to [`MAX_NOTIF`]; a peer that breaks the protocol or whose
//! hello is refused is disconnected.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nixl_core::backend::{NotifQueue, PeerAuth};
use nixl_core::{Error, Op, Result};

/// The largest notification accepted.
pub const MAX_NOTIF: usize = 16 << 20;
/// The longest first frame of a connection (the sender's hello).
pub(crate) const MAX_HELLO: usize = 1024;
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The receiving side: a listener thread feeding the agent's queue; stops on drop.
pub(crate) struct NotifServer {
    name: Vec<u8>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl NotifServer {
    pub(crate) fn start(agent: &str, notifs: Arc<NotifQueue>, peers: PeerAuth) -> Result<Self> {
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
    pub(crate) fn name(&self) -> &[u8] {
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
    frames: FrameReader,
}

/// The receiving state of one connection: bytes not yet framed, and the sender once its first
/// frame (a hello) was accepted. Pure (no I/O), so the decoder can be fuzzed.
#[derive(Debug, Default)]
pub(crate) struct FrameReader {
    buf: Vec<u8>,
    sender: Option<String>,
}

impl FrameReader {
    /// Appends `bytes` and hands every complete notification, with its sender, to `deliver`;
    /// the first frame goes to `first`, which names the sender (a checked hello) or refuses
    /// it. False when the peer broke the protocol (a frame over the limit, a refused first
    /// frame): the connection is then dropped. Buffers at most one frame (`4 + MAX_NOTIF`
    /// bytes) plus what one read returned.
    pub(crate) fn feed(
        &mut self,
        bytes: &[u8],
        mut first: impl FnMut(Vec<u8>) -> Option<String>,
        mut deliver: impl FnMut(&str, Vec<u8>),
    ) -> bool {
        self.buf.extend_from_slice(bytes);
        loop {
            if self.buf.len() < 4 {
                return true;
            }
            let n =
                u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
            let limit = if self.sender.is_none() {
                MAX_HELLO
            } else {
                MAX_NOTIF
            };
            if n > limit {
                return false;
            }
            if self.buf.len() < 4 + n {
                return true;
            }
            let frame: Vec<u8> = self.buf[4..4 + n].to_vec();
            self.buf.drain(..4 + n);
            match &self.sender {
                None => match first(frame) {
                    Some(s) => self.sender = Some(s),
                    None => return false,
                },
                Some(s) => deliver(s, frame),
            }
        }
    }

    /// Bytes received and not yet part of a complete frame.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }
}

/// One frame: the length (`u32` little-endian) and the bytes.
pub(crate) fn frame(b: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(4 + b.len());
    frame.extend_from_slice(&(b.len() as u32).to_le_bytes());
    frame.extend_from_slice(b);
    frame
}

fn serve(listener: UnixListener, stop: Arc<AtomicBool>, notifs: Arc<NotifQueue>, peers: PeerAuth) {
    let check = |hello: Vec<u8>| match peers.check_hello(&hello) {
        Ok(h) => Some(h.sender),
        Err(e) => {
            tracing::warn!(error = %e, "CUDA_IPC notification connection refused");
            None
        }
    };
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
        if !matches!(crate::sys::host::poll(&mut fds, 50), Ok(n) if n > 0) {
            continue;
        }
        if fds[0].revents != 0 {
            while let Ok((stream, _)) = listener.accept() {
                if stream.set_nonblocking(true).is_ok() {
                    conns.push(Conn {
                        stream,
                        frames: FrameReader::default(),
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
                        let deliver = |s: &str, m: Vec<u8>| {
                            notifs.push(s, m);
                        };
                        if !c.frames.feed(&chunk[..k], check, deliver) {
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
    pub(crate) fn new(peers: PeerAuth) -> Self {
        NotifSenders {
            peers,
            conns: Mutex::new(HashMap::new()),
        }
    }

    /// Sends `msg` as `agent` to the server named `name`; reconnects once if the cached
    /// connection broke.
    pub(crate) fn send(&self, agent: &str, remote: &str, name: &[u8], msg: &[u8]) -> Result<()> {
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
            .entry((agent.to_owned(), name.to_vec()))
            .or_default()
            .clone();
        let mut g = slot.lock();
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
    pub(crate) fn forget(&self, name: &[u8]) {
        self.conns.lock().retain(|(_, n), _| n != name);
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
    s.write_all(&frame(b))
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

    /// The first frame as a plain name (the fuzzing wrapper's stand-in for a hello).
    fn name(f: Vec<u8>) -> Option<String> {
        String::from_utf8(f).ok().filter(|s| !s.is_empty())
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
        // The server may already have dropped the connection (a loaded machine can run it
        // between the two writes): then this write fails, which is as good a refusal.
        let _ = write_frame(&mut named, b"forged");
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
    fn frames_split_anywhere_decode_the_same_and_breakers_are_refused() {
        let mut bytes = frame(b"sender");
        for m in [&b"one"[..], b"", b"three"] {
            bytes.extend_from_slice(&frame(m));
        }
        for step in [1, 2, 3, 5, 64] {
            let mut r = FrameReader::default();
            let mut got = Vec::new();
            for piece in bytes.chunks(step) {
                assert!(r.feed(piece, name, |s, m| got.push((s.to_owned(), m))));
            }
            assert_eq!(r.buffered(), 0);
            let want: Vec<(String, Vec<u8>)> = [&b"one"[..], b"", b"three"]
                .iter()
                .map(|m| ("sender".to_owned(), m.to_vec()))
                .collect();
            assert_eq!(got, want, "step {step}");
        }
        for bad in [
            frame(b""),
            frame(&[0xff, 0xfe]),
            frame(&[b'x'; MAX_HELLO + 1]),
            [frame(b"s"), (MAX_NOTIF as u32 + 1).to_le_bytes().to_vec()].concat(),
        ] {
            assert!(!FrameReader::default().feed(&bad, name, |_, _| panic!("delivered")));
        }
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
