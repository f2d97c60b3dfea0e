//! The agent's side of the side channel: pushing its metadata to a peer, fetching a peer's, and asking peers to forget it.

use crate::agent::{Agent, FetchStatus};
use crate::auth::Stamp;
use crate::bytes::ByteWriter;
use crate::error::{Error, Op, Result};
use crate::sidechannel::frame::{code, Deadlined, Dir, Kind};
use crate::sidechannel::local::{LocalPeer, Stream};
use crate::sidechannel::{frame, local, Reply};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Agent {
    /// An exchange's I/O error: a socket timeout is the exchange's own `TimedOut`.
    pub(crate) fn exchange_io(&self, e: std::io::Error, timeout: Duration) -> Error {
        if matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        ) {
            Error::TimedOut {
                agent: self.name().to_owned(),
                op: Op::Exchange,
                elapsed: timeout,
            }
        } else {
            Error::io(self.name(), Op::Exchange, e)
        }
    }

    /// One request and its reply, all within `timeout`.
    fn exchange(
        &self,
        addr: SocketAddr,
        kind: Kind,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Reply> {
        let deadline = Instant::now() + timeout;
        let auth = self.shared.config.auth.as_ref();
        let stamp = auth.map(|a| Stamp::fresh(&a.credential)).transpose()?;
        let req = match (auth, &stamp) {
            (Some(a), Some(s)) => {
                frame::encode(kind, payload, Some((&a.credential, s, Dir::Request)))
            }
            _ => frame::encode(kind, payload, None),
        };
        let io = |e| self.exchange_io(e, timeout);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io(std::io::ErrorKind::TimedOut.into()));
        }
        let (stream, server) = self.connect(addr, auth.is_some(), deadline, left, &io)?;
        let mut s = Deadlined {
            stream: &stream,
            deadline,
        };
        std::io::Write::write_all(&mut s, &req).map_err(io)?;
        let (body, _) = frame::read_body(&mut s, frame::MAX_REPLY, None).map_err(io)?;
        let f = frame::decode(&body).map_err(|source| Error::Decode {
            agent: self.name().to_owned(),
            op: Op::Exchange,
            source,
        })?;
        if !f.kind.is_reply() {
            return Err(Error::invalid(
                self.name(),
                Op::Exchange,
                "the peer answered with a request",
            ));
        }
        if let (Some(auth), Some(stamp)) = (auth, &stamp) {
            self.check_signed(addr, &f, auth, stamp)?;
        }
        Ok(Reply {
            kind: f.kind,
            payload: f.payload.to_vec(),
            server,
        })
    }

    /// Connects to the side channel at `addr`: without a credential, a same-host server is
    /// reached over its Unix side channel, where the kernel names either end (and another
    /// user's server is refused); else, or where there is none, over TCP.
    fn connect(
        &self,
        addr: SocketAddr,
        authenticated: bool,
        deadline: Instant,
        left: Duration,
        io: &dyn Fn(std::io::Error) -> Error,
    ) -> Result<(Stream, Option<LocalPeer>)> {
        let unix = if authenticated {
            None
        } else {
            local::connect(addr, deadline).map_err(io)?
        };
        match unix {
            Some(u) => {
                let server = LocalPeer::of(&u);
                let Some(p) = server.filter(LocalPeer::same_user) else {
                    return Err(Error::not_allowed(
                        self.name(),
                        Op::Exchange,
                        format!(
                            "the side channel at {addr} is served by another user's process \
                             ({server:?}): refused"
                        ),
                    ));
                };
                // Any process can bind the Unix name of a port: only the one that also serves
                // the TCP port is the agent asked for.
                if !local::owns_tcp_port(p.process.pid, addr) {
                    return Err(Error::not_allowed(
                        self.name(),
                        Op::Exchange,
                        format!(
                            "the Unix side channel of {addr} is served by process {}, which \
                             does not serve that TCP port (a squatter): refused",
                            p.process.pid
                        ),
                    ));
                }
                Ok((Stream::Unix(u), server))
            }
            None => {
                let t = TcpStream::connect_timeout(&addr, left).map_err(io)?;
                t.set_nodelay(true).map_err(io)?;
                Ok((Stream::Tcp(t), None))
            }
        }
    }

    /// A refusal of our own request is readable without a MAC (the server may not know our
    /// credential); anything else must be the server's signed answer to this request.
    fn check_signed(
        &self,
        addr: SocketAddr,
        f: &frame::Frame<'_>,
        auth: &crate::auth::Auth,
        stamp: &Stamp,
    ) -> Result<()> {
        let signed = f.stamp.as_ref().is_some_and(|s| s.nonce == stamp.nonce)
            && f.verify(auth, Dir::Reply).is_ok();
        if signed || f.kind == Kind::Err {
            return Ok(());
        }
        Err(Error::not_allowed(
            self.name(),
            Op::Exchange,
            format!("the reply from {addr} is not authenticated for this request"),
        ))
    }

    /// The error an `Err` reply carries.
    fn remote_error(&self, op: Op, addr: SocketAddr, payload: &[u8]) -> Error {
        let (c, msg) = frame::decode_error(payload);
        let msg = format!("{addr} answered: {msg}");
        match c {
            code::NOT_ALLOWED => Error::not_allowed(self.name(), op, msg),
            code::NOT_FOUND => Error::not_found(self.name(), op, msg),
            code::LIMIT => Error::LimitExceeded {
                agent: self.name().to_owned(),
                op,
                what: msg,
                limit: 0,
            },
            code::MISMATCH => Error::mismatch(self.name(), op, msg),
            code::DECODE => Error::invalid(self.name(), op, msg),
            _ => Error::backend(self.name(), "side-channel", op, msg),
        }
    }

    fn unexpected(&self, k: Kind) -> Error {
        Error::invalid(self.name(), Op::Exchange, format!("unexpected reply {k:?}"))
    }

    /// Pushes this agent's full metadata to the agent listening at `addr` (NIXL's
    /// `sendLocalMD`), within the default timeout.
    #[doc(alias = "sendLocalMD")]
    pub fn send_local_metadata(&self, addr: SocketAddr) -> Result<()> {
        let md = self.local_metadata()?;
        self.send_metadata_bytes(addr, &md, self.shared.config.default_timeout)
    }

    /// Pushes given metadata bytes (e.g. from `local_partial_metadata`) to `addr`, all within
    /// `timeout`. The receiver's refusal comes back as its error kind (`NotAllowed`,
    /// `LimitExceeded`, `Mismatch`, ...).
    pub fn send_metadata_bytes(
        &self,
        addr: SocketAddr,
        md: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        let r = self.exchange(addr, Kind::Push, md, timeout)?;
        match r.kind {
            Kind::Ack => Ok(()),
            Kind::Err => Err(self.remote_error(Op::Exchange, addr, &r.payload)),
            k => Err(self.unexpected(k)),
        }
    }

    /// Fetches `remote`'s metadata from `addr` and loads it; the whole exchange ends within
    /// `timeout` (loading the answer comes after). Returns the loaded name.
    pub fn fetch_remote_metadata_blocking(
        &self,
        remote: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<String> {
        let mut w = ByteWriter::new();
        w.put_str(remote);
        let r = self.exchange(addr, Kind::Fetch, w.as_slice(), timeout)?;
        match r.kind {
            Kind::Metadata => {
                // The answer's name and process are checked before anything is loaded: a
                // lying server changes nothing here (before, the wrong answer was loaded,
                // then the name it gave was forgotten: possibly a peer loaded before).
                let md = self
                    .shared
                    .signer
                    .open(self.name(), &r.payload)
                    .and_then(|o| {
                        crate::codec::AgentMetadata::decode_bytes(o.blob).map_err(|source| {
                            Error::Decode {
                                agent: self.name().to_owned(),
                                op: Op::Exchange,
                                source,
                            }
                        })
                    })?;
                if !remote.is_empty() && md.name != remote {
                    return Err(Error::mismatch(
                        self.name(),
                        Op::Exchange,
                        format!("asked {addr} for {remote}, got {}", md.name),
                    ));
                }
                if let Some(server) = &r.server {
                    if !server.is(md.process.as_ref()) {
                        return Err(Error::not_allowed(
                            self.name(),
                            Op::Exchange,
                            format!(
                                "{addr} answered with metadata of another process than its own (pid {})",
                                server.process.pid
                            ),
                        ));
                    }
                }
                self.load_remote_metadata(&r.payload)
            }
            Kind::Err => Err(self.remote_error(Op::Exchange, addr, &r.payload)),
            k => Err(self.unexpected(k)),
        }
    }

    /// Starts fetching `remote`'s metadata from `addr` in the background (NIXL's
    /// `fetchRemoteMD`); poll with [`Agent::check_remote_metadata`] or
    /// [`Agent::fetch_status`].
    #[doc(alias = "fetchRemoteMD")]
    pub fn fetch_remote_metadata(&self, remote: &str, addr: SocketAddr) -> Result<()> {
        if remote.is_empty() {
            return Err(Error::invalid(
                self.name(),
                Op::Exchange,
                "empty agent name",
            ));
        }
        self.shared
            .fetches
            .lock()
            .insert(remote.to_owned(), FetchStatus::Pending);
        let agent = self.clone();
        let remote = remote.to_owned();
        let timeout = self.shared.config.default_timeout;
        std::thread::Builder::new()
            .name("nixl-fetch".into())
            .spawn(move || {
                let r = agent.fetch_remote_metadata_blocking(&remote, addr, timeout);
                let mut f = agent.shared.fetches.lock();
                match r {
                    Ok(_) => f.remove(&remote),
                    Err(e) => f.insert(remote, FetchStatus::Failed(e.to_string())),
                };
            })
            .map_err(|e| Error::io(self.name(), Op::Exchange, e))?;
        Ok(())
    }

    /// [`Agent::fetch_remote_metadata_blocking`] as a future that never blocks its caller:
    /// the exchange (bounded by `timeout`) and the load run on a thread of their own, started
    /// at the first poll; the future resolves with the loaded name or the error, woken when it
    /// ends. Dropped before, the fetch still finishes (and loads) on its thread.
    pub fn fetch_remote_metadata_async(
        &self,
        remote: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> FetchFuture {
        FetchFuture {
            agent: self.clone(),
            remote: remote.to_owned(),
            addr,
            timeout,
            slot: None,
        }
    }

    /// The state of a background fetch: `Ok(true)` loaded, `Ok(false)` still pending, or the
    /// error it failed with.
    pub fn fetch_status(&self, remote: &str) -> Result<bool> {
        match self.shared.fetches.lock().get(remote) {
            Some(FetchStatus::Pending) => Ok(false),
            Some(FetchStatus::Failed(m)) => Err(Error::not_found(
                self.name(),
                Op::Exchange,
                format!("fetching {remote}: {m}"),
            )),
            None => Ok(self.check_remote_metadata(remote, None)),
        }
    }

    /// Tells the agent at `addr` to forget this agent (NIXL's `invalidateLocalMD`). It proves
    /// it is the owner by revealing the secret its authenticated metadata committed to.
    #[doc(alias = "invalidateLocalMD")]
    pub fn invalidate_local_metadata(&self, addr: SocketAddr) -> Result<()> {
        let timeout = self.shared.config.default_timeout;
        let token: &[u8] = if self.shared.config.auth.is_some() {
            self.shared.signer.owner_token()
        } else {
            &[]
        };
        let payload = frame::encode_invalidate(self.name(), self.generation(), token);
        let r = self.exchange(addr, Kind::Invalidate, &payload, timeout)?;
        match r.kind {
            Kind::Ack => Ok(()),
            Kind::Err => Err(self.remote_error(Op::Invalidate, addr, &r.payload)),
            k => Err(self.unexpected(k)),
        }
    }
}

/// What a fetch's thread hands its future: the outcome, and the waker to call with it.
type FetchSlot = Arc<parking_lot::Mutex<(Option<Result<String>>, Option<std::task::Waker>)>>;

/// [`Agent::fetch_remote_metadata_async`]'s future.
#[must_use = "a future does nothing unless polled"]
pub struct FetchFuture {
    agent: Agent,
    remote: String,
    addr: SocketAddr,
    timeout: Duration,
    slot: Option<FetchSlot>,
}

impl std::fmt::Debug for FetchFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchFuture")
            .field("remote", &self.remote)
            .field("addr", &self.addr)
            .field("started", &self.slot.is_some())
            .finish()
    }
}

impl std::future::Future for FetchFuture {
    type Output = Result<String>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<String>> {
        let this = self.get_mut();
        let slot = match &this.slot {
            Some(s) => s.clone(),
            None => {
                let slot: FetchSlot = Arc::new(parking_lot::Mutex::new((None, None)));
                let (agent, remote, addr, timeout) = (
                    this.agent.clone(),
                    this.remote.clone(),
                    this.addr,
                    this.timeout,
                );
                let s = slot.clone();
                let spawned =
                    std::thread::Builder::new()
                        .name("nixl-fetch".into())
                        .spawn(move || {
                            let r = agent.fetch_remote_metadata_blocking(&remote, addr, timeout);
                            let waker = {
                                let mut g = s.lock();
                                g.0 = Some(r);
                                g.1.take()
                            };
                            if let Some(w) = waker {
                                w.wake();
                            }
                        });
                if let Err(e) = spawned {
                    return std::task::Poll::Ready(Err(Error::io(
                        this.agent.name(),
                        Op::Exchange,
                        e,
                    )));
                }
                this.slot = Some(slot.clone());
                slot
            }
        };
        let mut g = slot.lock();
        match g.0.take() {
            Some(r) => std::task::Poll::Ready(r),
            None => {
                g.1 = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}
