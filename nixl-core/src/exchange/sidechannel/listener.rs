//! The side-channel server: one thread accepts, one thread per connection serves.
//!
//! Every connection has one deadline for its whole request and answer
//! ([`ListenerLimits::request_timeout`](crate::ListenerLimits)), a bounded frame, and a share
//! of a bounded byte budget. At the connection limit, the oldest connection that has not yet
//! delivered a whole request is closed to make room, so idle or trickling clients delay
//! nobody. With [`crate::AgentConfig::auth`], every request must carry a valid MAC under an
//! accepted credential, a fresh timestamp and an unseen nonce.
//!
//! Beside the TCP port it serves the same requests on a Unix socket for same-host peers
//! ([`super::local`]), where the kernel names the requester. Without a credential:
//!
//! - a request over the Unix socket from another user's process is refused;
//! - a PUSH must carry metadata naming the very process that sends it, and a name stays with
//!   the process that published it until that process exits (the agent's load refuses a live
//!   impersonator; a restart, the old process gone, is accepted);
//! - an INVALIDATE is accepted from the named peer's own process only;
//! - a request over TCP, whose sender nobody can name, is refused unless the agent opted out
//!   ([`crate::AgentConfig::allow_unauthenticated_listener`]).

use parking_lot::Mutex;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::frame::{self, code, Budget, Deadlined, Dir, Kind};
use super::local::{LocalPeer, Stream};
use crate::agent::remote::Invalidator;
use crate::agent::{Agent, Shared};
use crate::auth::Stamp;
use crate::error::{Error, ErrorKind, Op, Result};
use crate::limits::ListenerLimits;

/// A connection being served.
struct Conn {
    id: u64,
    since: Instant,
    stream: Stream,
    /// Set once its whole request arrived (it is then never evicted).
    answered: Arc<AtomicBool>,
}

/// The listener's state shared by its threads.
struct Server {
    name: String,
    limits: ListenerLimits,
    conns: Mutex<Vec<Conn>>,
    budget: Budget,
    next: AtomicU64,
}

impl Server {
    /// Makes room for one more connection: false when every slot holds a request being
    /// answered.
    fn admit(&self) -> bool {
        let mut conns = self.conns.lock();
        if conns.len() < self.limits.max_connections {
            return true;
        }
        let victim = conns
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.answered.load(Ordering::Acquire))
            .min_by_key(|(_, c)| c.since)
            .map(|(i, _)| i);
        match victim {
            Some(i) => {
                let c = conns.swap_remove(i);
                c.stream.shutdown();
                tracing::debug!(agent = %self.name, "side channel full: closed the oldest idle connection");
                true
            }
            None => false,
        }
    }

    fn forget(&self, id: u64) {
        self.conns.lock().retain(|c| c.id != id);
    }
}

/// How many ephemeral ports a listener tries when another process holds the Unix name of the
/// one it got.
const PORT_TRIES: usize = 8;

/// Binds the TCP side channel on `at` and the Unix one of its port. Another process holding
/// that port's Unix name would receive this agent's same-host clients: with an ephemeral port
/// (`at` port 0) another is taken, with a fixed one the listener does not start
/// (`NotAllowed` naming the holder). Where Unix sockets are unavailable, TCP alone.
fn bind_both(
    name: &str,
    at: SocketAddr,
) -> Result<(TcpListener, SocketAddr, Option<UnixListener>)> {
    for _ in 0..PORT_TRIES {
        let listener = TcpListener::bind(at).map_err(|e| Error::io(name, Op::Exchange, e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io(name, Op::Exchange, e))?;
        match super::local::bind(addr.port()) {
            Ok(u) => return Ok((listener, addr, Some(u))),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if at.port() != 0 {
                    return Err(Error::not_allowed(
                        name,
                        Op::Exchange,
                        format!(
                            "another process holds the same-host (Unix) side channel name of \
                             port {}: same-host peers would reach it instead of this agent; \
                             refusing to listen (docs/security.md, \"One host\")",
                            addr.port()
                        ),
                    ));
                }
                tracing::warn!(agent = %name, port = addr.port(), "another process holds this port's Unix side channel name: taking another port");
            }
            Err(e) => {
                tracing::warn!(agent = %name, port = addr.port(), error = %e, "no same-host Unix side channel: same-host peers without a credential cannot reach this agent");
                return Ok((listener, addr, None));
            }
        }
    }
    Err(Error::not_allowed(
        name,
        Op::Exchange,
        format!(
            "the Unix side channel names of {PORT_TRIES} ephemeral ports in a row were held by \
             other processes: refusing to listen"
        ),
    ))
}

/// Binds the agent's side channel and starts serving it.
pub(crate) fn start(agent: &Agent) -> Result<()> {
    let name = agent.name().to_owned();
    let cfg = &agent.shared.config;
    if !cfg.listen_addr.ip().is_loopback()
        && cfg.auth.is_none()
        && !cfg.allow_unauthenticated_listener
    {
        return Err(Error::not_allowed(
            &name,
            Op::Exchange,
            format!(
                "the side channel would listen on {} without authentication: set \
                 AgentConfig::auth (a cluster credential), listen on 127.0.0.1, or opt out with \
                 AgentConfig::allow_unauthenticated_listener",
                cfg.listen_addr
            ),
        ));
    }
    let (listener, addr, unix) = bind_both(&name, cfg.listen_addr)?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io(&name, Op::Exchange, e))?;
    *agent.shared.listen_addr.lock() = Some(addr);
    let server = Arc::new(Server {
        name: name.clone(),
        limits: cfg.limits.listener.clone(),
        conns: Mutex::new(Vec::new()),
        budget: Budget::default(),
        next: AtomicU64::new(0),
    });
    let weak = Arc::downgrade(&agent.shared);
    let stop = agent.shared.stop.clone();
    let handle = std::thread::Builder::new()
        .name(format!("nixl-listen-{name}"))
        .spawn(move || accept_loop(&listener, unix.as_ref(), addr, &server, &weak, &stop))
        .map_err(|e| Error::io(agent.name(), Op::Exchange, e))?;
    agent.shared.threads.lock().push(handle);
    Ok(())
}

fn accept_loop(
    listener: &TcpListener,
    unix: Option<&UnixListener>,
    addr: SocketAddr,
    server: &Arc<Server>,
    weak: &Weak<Shared>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Relaxed) {
        let mut got = None;
        match listener.accept() {
            Ok((s, _)) => got = Some(Stream::Tcp(s)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                tracing::warn!(agent = %server.name, %addr, error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if got.is_none() {
            if let Some(u) = unix {
                match u.accept() {
                    Ok((s, _)) => got = Some(Stream::Unix(s)),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => {
                        tracing::warn!(agent = %server.name, error = %e, "accept (Unix) failed");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        }
        let Some(stream) = got else {
            match unix {
                Some(u) => crate::exchange::accept::wait_readable(&[listener, u]),
                None => crate::exchange::accept::wait_readable(&[listener]),
            }
            continue;
        };
        if weak.strong_count() == 0 {
            break;
        }
        if !server.admit() {
            tracing::warn!(agent = %server.name, "side channel busy: refused a connection");
            continue;
        }
        spawn_conn(server, weak, stream);
    }
    // Close whatever is still being read.
    for c in server.conns.lock().drain(..) {
        c.stream.shutdown();
    }
}

fn spawn_conn(server: &Arc<Server>, weak: &Weak<Shared>, stream: Stream) {
    let id = server.next.fetch_add(1, Ordering::Relaxed);
    let since = Instant::now();
    let answered = Arc::new(AtomicBool::new(false));
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    server.conns.lock().push(Conn {
        id,
        since,
        stream: clone,
        answered: answered.clone(),
    });
    let (server2, weak) = (server.clone(), weak.clone());
    let spawned = std::thread::Builder::new()
        .name("nixl-sc-conn".into())
        .spawn(move || {
            let deadline = since + server2.limits.request_timeout;
            if let Err(e) = serve(&server2, &weak, &stream, deadline, &answered) {
                tracing::debug!(agent = %server2.name, error = %e, "side-channel connection ended with an error");
            }
            stream.shutdown();
            server2.forget(id);
        });
    if spawned.is_err() {
        tracing::warn!(agent = %server.name, "could not start a side-channel connection thread");
        server.forget(id);
    }
}

fn err_code(e: &Error) -> u8 {
    match e.kind() {
        ErrorKind::NotAllowed => code::NOT_ALLOWED,
        ErrorKind::NotFound => code::NOT_FOUND,
        ErrorKind::LimitExceeded => code::LIMIT,
        ErrorKind::Decode => code::DECODE,
        ErrorKind::Mismatch => code::MISMATCH,
        _ => code::OTHER,
    }
}

fn serve(
    server: &Server,
    weak: &Weak<Shared>,
    stream: &Stream,
    deadline: Instant,
    answered: &AtomicBool,
) -> std::io::Result<()> {
    stream.prepare()?;
    let origin = match stream {
        Stream::Tcp(_) => Origin::Tcp,
        Stream::Unix(_) => Origin::Local(stream.local_peer()),
    };
    let mut io = Deadlined { stream, deadline };
    let limits = &server.limits;
    let (body, _held) = match frame::read_body(
        &mut io,
        limits.max_request_bytes,
        Some((&server.budget, limits.max_buffered_bytes)),
    ) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::OutOfMemory => {
            answered.store(true, Ordering::Release);
            let reply = frame::encode_plain(
                Kind::Err,
                &frame::encode_error(code::LIMIT, "side channel busy (buffered bytes); retry"),
            );
            return std::io::Write::write_all(&mut io, &reply);
        }
        Err(e) => return Err(e),
    };
    answered.store(true, Ordering::Release);
    let Some(shared) = weak.upgrade() else {
        return Ok(());
    };
    let agent = Agent { shared };
    let reply = answer(&agent, &body, origin);
    // The answer gets at least a moment even when the request used its whole deadline.
    io.deadline = deadline.max(Instant::now() + Duration::from_millis(200));
    std::io::Write::write_all(&mut io, &reply)
}

/// Where a request came from.
#[derive(Debug, Clone, Copy)]
enum Origin {
    /// TCP: nobody can tell who sent it (unless it is signed).
    Tcp,
    /// The same-host Unix socket, and the process and user the kernel names (`None` when it
    /// cannot).
    Local(Option<LocalPeer>),
}

/// Who the listener knows a request to come from.
#[derive(Debug, Clone, Copy)]
enum Requester<'a> {
    /// The holder of this accepted credential.
    Credential(&'a str),
    /// This process of this host, as the kernel named it.
    Local(LocalPeer),
    /// Nobody can tell (TCP without a credential, in an agent that opted out).
    Unknown,
}

/// Handles one request body and returns the reply frame.
fn answer(agent: &Agent, body: &[u8], origin: Origin) -> Vec<u8> {
    let auth = agent.shared.config.auth.as_ref();
    let f = match frame::decode(body) {
        Ok(f) if !f.kind.is_reply() => f,
        Ok(_) => return plain_err(code::DECODE, "a reply is not a request"),
        Err(e) => return plain_err(code::DECODE, &format!("malformed frame: {e}")),
    };
    let mut requester = None;
    if let Some(auth) = auth {
        let cred = match f.verify(auth, Dir::Request) {
            Ok(c) => c,
            Err(why) => {
                tracing::warn!(agent = %agent.name(), why, "side channel: refused an unauthenticated request");
                return plain_err(code::NOT_ALLOWED, why);
            }
        };
        let Some(stamp) = &f.stamp else {
            return plain_err(code::NOT_ALLOWED, "authentication required");
        };
        if let Err(why) =
            agent
                .shared
                .signer
                .replay
                .check(stamp.ts_ms, &stamp.nonce, auth.max_clock_skew)
        {
            tracing::warn!(agent = %agent.name(), why, "side channel: refused a stale or replayed request");
            return plain_err(code::NOT_ALLOWED, why);
        }
        requester = Some((cred.clone(), stamp.nonce));
    }
    let who = match (&requester, origin) {
        (Some((c, _)), _) => Requester::Credential(c.id()),
        (None, Origin::Local(Some(p))) => Requester::Local(p),
        (None, Origin::Local(None)) => {
            return plain_err(
                code::NOT_ALLOWED,
                "the kernel does not name this requester's process (another pid namespace?)",
            )
        }
        (None, Origin::Tcp) if !agent.shared.config.allow_unauthenticated_listener => {
            return plain_err(
                code::NOT_ALLOWED,
                "this agent has no credential: same-host agents speak over its Unix side channel, \
                 which tells who they are (a client connecting to a loopback address does), and \
                 agents of other hosts need a cluster credential",
            )
        }
        (None, Origin::Tcp) => Requester::Unknown,
    };
    if let Requester::Local(p) = who {
        if !p.same_user() {
            tracing::warn!(agent = %agent.name(), pid = p.process.pid, uid = p.uid, "side channel: refused another user's process");
            return plain_err(
                code::NOT_ALLOWED,
                &format!(
                    "the side channel serves processes of its own user only (pid {} runs as uid {})",
                    p.process.pid, p.uid
                ),
            );
        }
    }
    let (kind, payload) = match dispatch(agent, f.kind, f.payload, who) {
        Ok(r) => r,
        Err(e) => (Kind::Err, frame::encode_error(err_code(&e), &e.to_string())),
    };
    match (&requester, auth) {
        (Some((_, nonce)), Some(auth)) => {
            let stamp = Stamp {
                credential: auth.credential.id().to_owned(),
                ts_ms: crate::auth::now_ms(),
                nonce: *nonce,
            };
            frame::encode(kind, &payload, Some((&auth.credential, &stamp, Dir::Reply)))
        }
        _ => frame::encode(kind, &payload, None),
    }
}

fn plain_err(c: u8, msg: &str) -> Vec<u8> {
    frame::encode_plain(Kind::Err, &frame::encode_error(c, msg))
}

/// The loaded peers' names `requester` is proven to be: loaded from its process on this host,
/// or bound to its credential.
fn proven_names(agent: &Agent, requester: Requester<'_>) -> Vec<String> {
    let remotes: Vec<_> = agent.shared.remotes.lock().values().cloned().collect();
    remotes
        .iter()
        .filter(|r| match requester {
            Requester::Local(p) => r.process.as_ref().is_some_and(|q| p.is(Some(q.id()))),
            Requester::Credential(id) => {
                agent.shared.bindings.credential_of(&r.name).as_deref() == Some(id)
            }
            Requester::Unknown => false,
        })
        .map(|r| r.name.clone())
        .collect()
}

/// [`crate::access::FetchPolicy::LoadedPeers`]: a FETCH only from a loaded peer (its proven process on
/// this host, or the credential its name is bound to); [`crate::access::FetchPolicy::Named`]: and only
/// under a listed name.
fn check_fetcher(agent: &Agent, requester: Requester<'_>) -> Result<()> {
    let named: Option<&[String]> = match &agent.shared.config.fetch_policy {
        crate::access::FetchPolicy::Anyone => return Ok(()),
        crate::access::FetchPolicy::LoadedPeers => None,
        crate::access::FetchPolicy::Named(names) => Some(names),
    };
    let loaded = proven_names(agent, requester)
        .iter()
        .any(|name| named.is_none_or(|n| n.iter().any(|x| x == name)));
    if loaded {
        return Ok(());
    }
    Err(Error::not_allowed(
        agent.name(),
        Op::Exchange,
        match named {
            None => "this agent serves its metadata to the peers it loaded only (FetchPolicy::LoadedPeers)",
            Some(_) => "this agent serves its metadata to the loaded peers it names only (FetchPolicy::Named)",
        },
    ))
}

/// The metadata a FETCH from `requester` gets: with the shared registrations
/// (`AgentConfig::shares`) of the loaded peers it is proven to be (its process on this host,
/// or the credential their names are bound to).
fn metadata_for(agent: &Agent, requester: Requester<'_>) -> Result<Vec<u8>> {
    if agent.shared.config.shares.is_empty() {
        return agent.local_metadata();
    }
    let proven = proven_names(agent, requester);
    let names: Vec<&str> = proven.iter().map(String::as_str).collect();
    agent.metadata_for(
        &crate::MetadataSelection {
            registrations: None,
            include_conn: true,
        },
        crate::agent::remote::Audience::Peers(&names),
    )
}

fn dispatch(
    agent: &Agent,
    kind: Kind,
    payload: &[u8],
    requester: Requester<'_>,
) -> Result<(Kind, Vec<u8>)> {
    match kind {
        Kind::Push => {
            if let Requester::Local(p) = requester {
                check_pusher(agent, payload, &p)?;
            }
            agent.load_remote_metadata(payload)?;
            Ok((Kind::Ack, Vec::new()))
        }
        Kind::Fetch => {
            let wanted = crate::bytes::ByteReader::new(payload)
                .str("wanted agent name", crate::codec::MAX_NAME)
                .map(str::to_owned)
                .unwrap_or_default();
            if !wanted.is_empty() && wanted != agent.name() {
                return Err(Error::not_found(
                    agent.name(),
                    Op::Exchange,
                    format!("this is agent {}, not {wanted}", agent.name()),
                ));
            }
            check_fetcher(agent, requester)?;
            Ok((Kind::Metadata, metadata_for(agent, requester)?))
        }
        Kind::Invalidate => {
            let (name, generation, token) =
                frame::parse_invalidate(payload).map_err(|source| Error::Decode {
                    agent: agent.name().to_owned(),
                    op: Op::Invalidate,
                    source,
                })?;
            check_invalidator(agent, &name, requester)?;
            let token = (!token.is_empty()).then_some(token.as_slice());
            // Not loaded (or another generation): nothing to do, and not an error.
            agent.invalidate_remote_generation(&name, generation, Invalidator::Peer(token))?;
            Ok((Kind::Ack, Vec::new()))
        }
        _ => Err(Error::invalid(agent.name(), Op::Exchange, "not a request")),
    }
}

/// Pushed metadata must name the process that sends it: the load then keeps the name with
/// that process (a live impersonator is refused there).
fn check_pusher(agent: &Agent, payload: &[u8], p: &LocalPeer) -> Result<()> {
    let claimed = crate::auth::unsealed(payload)
        .ok()
        .and_then(|b| crate::codec::AgentMetadata::decode_bytes(b).ok())
        .map(|md| md.process);
    if claimed.is_some_and(|c| p.is(c.as_ref())) {
        return Ok(());
    }
    Err(Error::not_allowed(
        agent.name(),
        Op::LoadMetadata,
        format!(
            "pushed metadata must name the process that sends it (pid {})",
            p.process.pid
        ),
    ))
}

/// A name bound to a credential is forgotten only by that credential; a same-host peer only
/// by its own process.
fn check_invalidator(agent: &Agent, name: &str, requester: Requester<'_>) -> Result<()> {
    match requester {
        Requester::Credential(cred) => {
            if agent
                .shared
                .bindings
                .credential_of(name)
                .is_some_and(|c| c != cred)
            {
                return Err(Error::not_allowed(
                    agent.name(),
                    Op::Invalidate,
                    format!("{name} belongs to another credential"),
                ));
            }
        }
        Requester::Local(p) => {
            if let Some(owner) = agent.remote_process(name) {
                if !p.is(owner.as_ref()) {
                    return Err(Error::not_allowed(
                        agent.name(),
                        Op::Invalidate,
                        format!(
                            "only {name}'s own process may invalidate it (asked by pid {})",
                            p.process.pid
                        ),
                    ));
                }
            }
        }
        Requester::Unknown => {}
    }
    Ok(())
}
