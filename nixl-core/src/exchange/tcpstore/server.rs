//! [`TcpStoreServer`]: a c10d TCPStore server, for deployments without a PyTorch job to
//! host one (NIXL 1.5 agents and torch clients connect to it as to PyTorch's).

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::wire::{
    read_query, read_u8, Query, QueryError, QueryType, CHECK_NOT_READY, CHECK_READY, MAX_VALUE,
    VALIDATION_MAGIC, WAIT_CANCELED, WAIT_STOP,
};
use crate::bytes::ByteWriter;
use crate::error::{DecodeError, Error, Op, Result};
use crate::sidechannel::frame::Deadlined;

/// How often an idle connection looks at the stop flag.
const IDLE_TICK: Duration = Duration::from_millis(200);
/// How often a pending `WAIT` looks for a `CANCEL_WAIT` or its client gone.
const WAIT_TICK: Duration = Duration::from_millis(20);
/// Who the server's errors name.
const WHO: &str = "tcpstore-server";

/// Limits of a [`TcpStoreServer`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TcpStoreServerConfig {
    /// Most connections served at once; a connection over it is closed at once (default
    /// 1,024). Clients keep their connection for their life, so none is evicted.
    pub max_connections: usize,
    /// Largest value (default [`MAX_VALUE`], c10d's own bound: 8 MiB).
    pub max_value: usize,
    /// Most bytes of keys and values held (default 1 GiB); a query that would pass it closes
    /// its connection and changes nothing (c10d's protocol has no error answer).
    pub max_bytes: usize,
    /// How long a whole query may take to arrive once its first byte did (default 5 s).
    pub frame_timeout: Duration,
    /// Serve on an address other than loopback. c10d's protocol has no authentication:
    /// whoever reaches the port can read and replace every agent's metadata (default off).
    pub allow_remote: bool,
}

impl Default for TcpStoreServerConfig {
    fn default() -> Self {
        TcpStoreServerConfig {
            max_connections: 1024,
            max_value: MAX_VALUE,
            max_bytes: 1 << 30,
            frame_timeout: Duration::from_secs(5),
            allow_remote: false,
        }
    }
}

impl TcpStoreServerConfig {
    /// Sets [`TcpStoreServerConfig::max_connections`].
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets [`TcpStoreServerConfig::max_value`].
    pub fn max_value(mut self, n: usize) -> Self {
        self.max_value = n;
        self
    }

    /// Sets [`TcpStoreServerConfig::max_bytes`].
    pub fn max_bytes(mut self, n: usize) -> Self {
        self.max_bytes = n;
        self
    }

    /// Sets [`TcpStoreServerConfig::frame_timeout`].
    pub fn frame_timeout(mut self, d: Duration) -> Self {
        self.frame_timeout = d;
        self
    }

    /// Sets [`TcpStoreServerConfig::allow_remote`].
    pub fn allow_remote(mut self, yes: bool) -> Self {
        self.allow_remote = yes;
        self
    }
}

/// The keys and values, and a signal for waiters.
#[derive(Default)]
struct Store {
    inner: Mutex<Inner>,
    changed: Condvar,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Vec<u8>, Vec<u8>>,
    bytes: usize,
}

impl Inner {
    /// Puts `value` at `key` if the store stays within `max_bytes`.
    fn put(&mut self, key: &[u8], value: Vec<u8>, max_bytes: usize) -> bool {
        let old = self.map.get(key).map(|v| key.len() + v.len()).unwrap_or(0);
        let next = self.bytes - old + key.len() + value.len();
        if next > max_bytes {
            return false;
        }
        self.bytes = next;
        self.map.insert(key.to_vec(), value);
        true
    }

    fn has_all(&self, keys: &[Vec<u8>]) -> bool {
        keys.iter().all(|k| self.map.contains_key(k))
    }
}

/// What a query does to its connection.
enum Outcome {
    /// Send these bytes.
    Reply(Vec<u8>),
    /// Nothing to send.
    Silent,
    /// Answer once every key is set (or the wait is canceled).
    Wait(Vec<Vec<u8>>),
    /// Close the connection.
    Close(&'static str),
}

fn value_reply(v: &[u8]) -> Outcome {
    let mut w = ByteWriter::with_capacity(8 + v.len());
    w.put_u64(v.len() as u64).put(v);
    Outcome::Reply(w.into_vec())
}

fn i64_reply(v: i64) -> Outcome {
    let mut w = ByteWriter::new();
    w.put_u64(v as u64);
    Outcome::Reply(w.into_vec())
}

/// Applies one query (after `VALIDATE`) to the store, as c10d's server does.
fn apply(store: &Store, q: Query, cfg: &TcpStoreServerConfig) -> Outcome {
    let mut g = store.inner.lock();
    let out = match q {
        Query::Validate(_) => Outcome::Close("VALIDATE twice"),
        Query::Set(k, v) => {
            if !g.put(&k, v, cfg.max_bytes) {
                return Outcome::Close("the store is full");
            }
            Outcome::Silent
        }
        Query::CompareSet(k, expected, new) => {
            let now = match g.map.get(&k) {
                None if expected.is_empty() => {
                    if !g.put(&k, new.clone(), cfg.max_bytes) {
                        return Outcome::Close("the store is full");
                    }
                    new
                }
                // c10d answers the expected value for an absent key.
                None => expected,
                Some(cur) if *cur == expected => {
                    if !g.put(&k, new.clone(), cfg.max_bytes) {
                        return Outcome::Close("the store is full");
                    }
                    new
                }
                Some(cur) => cur.clone(),
            };
            value_reply(&now)
        }
        Query::Get(k) => value_reply(g.map.get(&k).map(|v| &v[..]).unwrap_or(&[])),
        Query::Add(k, delta) => {
            let cur = match g.map.get(&k) {
                None => 0,
                Some(v) => match std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                {
                    Some(n) => n,
                    None => return Outcome::Close("ADD to a value that is not an integer"),
                },
            };
            let Some(sum) = cur.checked_add(delta) else {
                return Outcome::Close("ADD overflows");
            };
            if !g.put(&k, sum.to_string().into_bytes(), cfg.max_bytes) {
                return Outcome::Close("the store is full");
            }
            i64_reply(sum)
        }
        Query::Check(keys) => Outcome::Reply(vec![if g.has_all(&keys) {
            CHECK_READY
        } else {
            CHECK_NOT_READY
        }]),
        Query::Wait(keys) => {
            if g.has_all(&keys) {
                Outcome::Reply(vec![WAIT_STOP])
            } else {
                Outcome::Wait(keys)
            }
        }
        Query::NumKeys => i64_reply(g.map.len() as i64),
        Query::DeleteKey(k) => {
            let n = match g.map.remove(&k) {
                Some(v) => {
                    g.bytes -= k.len() + v.len();
                    1
                }
                None => 0,
            };
            i64_reply(n)
        }
        Query::Append(k, v) => {
            let mut cur = g.map.get(&k).cloned().unwrap_or_default();
            if cur.len() + v.len() > cfg.max_value {
                return Outcome::Close("APPEND past the value limit");
            }
            cur.extend_from_slice(&v);
            if !g.put(&k, cur, cfg.max_bytes) {
                return Outcome::Close("the store is full");
            }
            Outcome::Silent
        }
        Query::MultiGet(keys) => {
            let mut w = ByteWriter::new();
            for k in &keys {
                let v = g.map.get(k).map(|v| &v[..]).unwrap_or(&[]);
                w.put_u64(v.len() as u64).put(v);
            }
            Outcome::Reply(w.into_vec())
        }
        Query::MultiSet(kvs) => {
            for (k, v) in kvs {
                if !g.put(&k, v, cfg.max_bytes) {
                    return Outcome::Close("the store is full");
                }
            }
            Outcome::Silent
        }
        // c10d answers a cancel even with no wait pending.
        Query::CancelWait => Outcome::Reply(vec![WAIT_CANCELED]),
        Query::Ping(n) => {
            let mut w = ByteWriter::new();
            w.put_u32(n);
            Outcome::Reply(w.into_vec())
        }
    };
    drop(g);
    store.changed.notify_all();
    out
}

/// Serves a byte string as one connection's queries on a fresh store and returns what the
/// server answered (stops at the first query that closes the connection or waits). For
/// fuzzing the server's parser; not a stable API.
#[doc(hidden)]
pub fn serve_bytes(input: &[u8]) -> Vec<u8> {
    let store = Store::default();
    let cfg = TcpStoreServerConfig::default().max_bytes(1 << 20);
    let mut r = input;
    let mut out = Vec::new();
    let mut validated = false;
    while let Ok(first) = read_u8(&mut r) {
        let Ok(q) = read_query(first, &mut r, cfg.max_value) else {
            break;
        };
        if !validated {
            if q != Query::Validate(VALIDATION_MAGIC) {
                break;
            }
            validated = true;
            continue;
        }
        match apply(&store, q, &cfg) {
            Outcome::Reply(b) => out.extend_from_slice(&b),
            Outcome::Silent => {}
            Outcome::Wait(_) | Outcome::Close(_) => break,
        }
    }
    out
}

/// A c10d TCPStore server: the store PyTorch's `torch.distributed.TCPStore(is_master=True)`
/// runs, for NIXL 1.5 agents (`NIXL_TCPSTORE_ENDPOINT`), torch clients and
/// [`TcpStoreExchange`](super::TcpStoreExchange). Stops when dropped (its keys are lost).
///
/// Serves every query c10d's server does up to `PING` (not the queue queries of newer
/// torch, which close the connection), with c10d's own limits (8 KiB keys, 8 MiB values,
/// 128 Ki keys per query) and more of its own: [`TcpStoreServerConfig`] bounds connections,
/// the bytes held and the time a query may take to arrive; a connection's first query must be
/// `VALIDATE` with c10d's number. A query over a limit, malformed or late closes its
/// connection and changes nothing.
pub struct TcpStoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<HashMap<u64, TcpStream>>>,
    store: Arc<Store>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TcpStoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStoreServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl TcpStoreServer {
    /// Binds `addr` (port 0 picks one) and starts serving. [`Error::NotAllowed`] for an
    /// address other than loopback unless [`TcpStoreServerConfig::allow_remote`].
    pub fn start(addr: SocketAddr, config: &TcpStoreServerConfig) -> Result<Self> {
        if !addr.ip().is_loopback() && !config.allow_remote {
            return Err(Error::not_allowed(
                WHO,
                Op::Exchange,
                format!(
                    "a TCPStore has no authentication: serving on {addr} would let anyone who \
                     reaches it replace agents' metadata; serve on 127.0.0.1, or opt out with \
                     TcpStoreServerConfig::allow_remote"
                ),
            ));
        }
        if config.max_connections == 0 || config.frame_timeout.is_zero() {
            return Err(Error::invalid(
                WHO,
                Op::Exchange,
                "max_connections and frame_timeout must be above zero",
            ));
        }
        let io = |e| Error::io(WHO, Op::Exchange, e);
        let listener = TcpListener::bind(addr).map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(HashMap::new()));
        let store = Arc::new(Store::default());
        let (st, cs, sto, cfg) = (stop.clone(), conns.clone(), store.clone(), config.clone());
        let thread = std::thread::Builder::new()
            .name("nixl-tcpstore".into())
            .spawn(move || accept_loop(listener, st, cs, sto, cfg))
            .map_err(io)?;
        Ok(TcpStoreServer {
            addr,
            stop,
            conns,
            store,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `host:port`, as `NIXL_TCPSTORE_ENDPOINT` takes it.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// How many keys the store holds.
    pub fn len(&self) -> usize {
        self.store.inner.lock().map.len()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many connections are being served.
    pub fn connections(&self) -> usize {
        self.conns.lock().len()
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        crate::exchange::accept::wake(self.addr);
        for s in self.conns.lock().values() {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.store.changed.notify_all();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("TCPStore accept thread panicked");
            }
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<HashMap<u64, TcpStream>>>,
    store: Arc<Store>,
    cfg: TcpStoreServerConfig,
) {
    let next = AtomicU64::new(0);
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!(error = %e, "TCPStore listener cannot poll; not serving");
        return;
    }
    while !stop.load(Ordering::SeqCst) {
        let s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                crate::exchange::accept::wait_readable(&[&listener]);
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "TCPStore accept failed");
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
        };
        // The owner's wake-up when it stops (`accept::wake`): serve nothing more.
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if s.set_nonblocking(false).is_err() {
            continue;
        }
        let id = next.fetch_add(1, Ordering::Relaxed);
        {
            let mut g = conns.lock();
            if g.len() >= cfg.max_connections {
                tracing::warn!(
                    max = cfg.max_connections,
                    "TCPStore full: closing a new connection"
                );
                continue;
            }
            let Ok(clone) = s.try_clone() else { continue };
            g.insert(id, clone);
        }
        let (stop, conns2, store, cfg) = (stop.clone(), conns.clone(), store.clone(), cfg.clone());
        let spawned = std::thread::Builder::new()
            .name("nixl-tcpstore-conn".into())
            .spawn(move || {
                if let Err(e) = serve(&s, &store, &cfg, &stop) {
                    tracing::debug!(error = %e, "TCPStore connection ended");
                }
                conns2.lock().remove(&id);
            });
        if spawned.is_err() {
            conns.lock().remove(&id);
        }
    }
}

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error("{0}")]
    Refused(&'static str),
}

impl From<std::io::Error> for ConnError {
    fn from(e: std::io::Error) -> Self {
        ConnError::Query(e.into())
    }
}

/// Serves one connection until its client closes it, a query is bad, late or over a limit,
/// or the server stops.
fn serve(
    s: &TcpStream,
    store: &Store,
    cfg: &TcpStoreServerConfig,
    stop: &AtomicBool,
) -> std::result::Result<(), ConnError> {
    s.set_nodelay(true)?;
    let mut validated = false;
    loop {
        // Wait for a query's first byte, looking at the stop flag every tick.
        s.set_read_timeout(Some(IDLE_TICK))?;
        match s.peek(&mut [0u8; 1]) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        let mut io = Deadlined {
            stream: s,
            deadline: Instant::now() + cfg.frame_timeout,
        };
        let first = read_u8(&mut io)?;
        let q = read_query(first, &mut io, cfg.max_value)?;
        if !validated {
            if q != Query::Validate(VALIDATION_MAGIC) {
                return Err(ConnError::Refused(
                    "the first query is not VALIDATE with c10d's number",
                ));
            }
            validated = true;
            continue;
        }
        match apply(store, q, cfg) {
            Outcome::Reply(b) => io.write_all(&b)?,
            Outcome::Silent => {}
            Outcome::Wait(keys) => wait_for(s, store, &keys, cfg, stop)?,
            Outcome::Close(why) => return Err(ConnError::Refused(why)),
        }
    }
}

/// A pending `WAIT`: answers once every key is set, or `CANCEL_WAIT` arrived.
fn wait_for(
    s: &TcpStream,
    store: &Store,
    keys: &[Vec<u8>],
    cfg: &TcpStoreServerConfig,
    stop: &AtomicBool,
) -> std::result::Result<(), ConnError> {
    loop {
        let ready = {
            let mut g = store.inner.lock();
            if !g.has_all(keys) {
                store.changed.wait_for(&mut g, WAIT_TICK);
            }
            g.has_all(keys)
        };
        let answer = |b: u8| {
            let mut io = Deadlined {
                stream: s,
                deadline: Instant::now() + cfg.frame_timeout,
            };
            io.write_all(&[b])
        };
        if ready {
            return Ok(answer(WAIT_STOP)?);
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        // While waiting, a client may only cancel (or go away).
        s.set_nonblocking(true)?;
        let mut b = [0u8; 1];
        let got = (&mut &*s).read(&mut b);
        s.set_nonblocking(false)?;
        match got {
            Ok(0) => return Ok(()),
            Ok(_) if b[0] == QueryType::CancelWait as u8 => return Ok(answer(WAIT_CANCELED)?),
            Ok(_) => {
                return Err(ConnError::Query(
                    DecodeError::Invalid {
                        what: "query during a WAIT",
                    }
                    .into(),
                ))
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
}
