//! [`TcpStoreClient`]: a blocking c10d TCPStore client where every operation has a deadline.

use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::wire::{
    read_bytes, read_i64, read_u32, read_u8, QueryError, QueryType, Request, CHECK_READY, MAX_KEY,
    MAX_KEYS, MAX_VALUE, VALIDATION_MAGIC,
};
use crate::error::{Error, Op, Result};
use crate::sidechannel::frame::Deadlined;

/// A connection to a c10d TCPStore (PyTorch's, or a [`TcpStoreServer`](super::TcpStoreServer)).
///
/// Keys are given as torch users write them: the client puts c10d's `/` in front, as
/// torch's and NIXL's clients do, so all three share one key space. Each operation has one
/// deadline for its whole exchange (the `op_timeout` given), ends [`Error::TimedOut`] past
/// it, and closes the connection after any failure (a half-read answer would shift every
/// later one); the next operation connects again, within its own deadline. Answers are
/// bounded ([`TcpStoreClient::max_value`]) before anything is allocated.
#[derive(Debug)]
pub struct TcpStoreClient {
    endpoint: String,
    addrs: Vec<SocketAddr>,
    who: String,
    op_timeout: Duration,
    max_value: usize,
    stream: Option<TcpStream>,
}

impl TcpStoreClient {
    /// Connects to `endpoint` (`host:port`) and checks the server speaks c10d (`VALIDATE`,
    /// then a `PING` answered with its nonce), all within `op_timeout`. `who` names the
    /// caller in errors (an agent's name).
    pub fn connect(endpoint: &str, who: &str, op_timeout: Duration) -> Result<Self> {
        if op_timeout.is_zero() {
            return Err(Error::invalid(
                who,
                Op::Exchange,
                "op_timeout must be above zero",
            ));
        }
        let addrs: Vec<SocketAddr> = endpoint
            .to_socket_addrs()
            .map_err(|e| {
                Error::invalid(
                    who,
                    Op::Exchange,
                    format!("TCPStore endpoint {endpoint:?} is not host:port ({e})"),
                )
            })?
            .collect();
        if addrs.is_empty() {
            return Err(Error::not_found(
                who,
                Op::Exchange,
                format!("no address for TCPStore endpoint {endpoint}"),
            ));
        }
        let mut c = TcpStoreClient {
            endpoint: endpoint.to_owned(),
            addrs,
            who: who.to_owned(),
            op_timeout,
            max_value: MAX_VALUE,
            stream: None,
        };
        c.run("connecting", |_| Ok(()))?;
        Ok(c)
    }

    /// Sets the largest value this client sends or accepts (default 8 MiB, c10d's own bound;
    /// a larger one needs a server configured for it).
    pub fn max_value(mut self, n: usize) -> Self {
        self.max_value = n;
        self
    }

    /// The endpoint connected to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn key(&self, key: &str) -> Result<Vec<u8>> {
        let wire = format!("/{key}").into_bytes();
        if wire.len() > MAX_KEY {
            return Err(Error::limit(
                &self.who,
                Op::Exchange,
                "TCPStore key",
                MAX_KEY - 1,
            ));
        }
        Ok(wire)
    }

    /// Runs one exchange under one deadline, connecting first when needed; any failure
    /// closes the connection.
    fn run<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Deadlined<'_>) -> std::result::Result<T, QueryError>,
    ) -> Result<T> {
        let started = Instant::now();
        let deadline = started + self.op_timeout;
        let r = (|| {
            if self.stream.is_none() {
                self.stream = Some(self.open(deadline)?);
            }
            let Some(s) = self.stream.as_ref() else {
                return Err(std::io::Error::from(std::io::ErrorKind::NotConnected).into());
            };
            f(&mut Deadlined {
                stream: s,
                deadline,
            })
        })();
        r.map_err(|e| {
            self.stream = None;
            self.error(what, e, started)
        })
    }

    /// A new connection, validated and pinged, by `deadline`.
    fn open(&self, deadline: Instant) -> std::result::Result<TcpStream, QueryError> {
        let mut last = std::io::Error::from(std::io::ErrorKind::TimedOut);
        for a in &self.addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(a, left) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    let nonce = std::process::id()
                        ^ std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.subsec_nanos())
                            .unwrap_or(0);
                    let hello = [
                        Request::new(QueryType::Validate)
                            .u32(VALIDATION_MAGIC)
                            .into_vec(),
                        Request::new(QueryType::Ping).u32(nonce).into_vec(),
                    ]
                    .concat();
                    let mut io = Deadlined {
                        stream: &s,
                        deadline,
                    };
                    io.write_all(&hello)?;
                    if read_u32(&mut io)? != nonce {
                        return Err(crate::error::DecodeError::Invalid {
                            what: "PING answer (not a c10d TCPStore?)",
                        }
                        .into());
                    }
                    return Ok(s);
                }
                Err(e) => last = e,
            }
        }
        Err(last.into())
    }

    fn error(&self, what: &str, e: QueryError, started: Instant) -> Error {
        match e {
            QueryError::Io(io)
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ) =>
            {
                Error::TimedOut {
                    agent: self.who.clone(),
                    op: Op::Exchange,
                    elapsed: started.elapsed(),
                }
            }
            QueryError::Io(io) => Error::io(
                &self.who,
                Op::Exchange,
                std::io::Error::new(
                    io.kind(),
                    format!("TCPStore {}: {what}: {io}", self.endpoint),
                ),
            ),
            QueryError::Decode(source) => Error::Decode {
                agent: self.who.clone(),
                op: Op::Exchange,
                source,
            },
        }
    }

    /// Sets `key` to `value` (c10d's `set`: last writer wins). c10d does not answer a `SET`;
    /// a `PING` sent after it on the same connection is, once the store has applied the `SET`
    /// (it serves a connection's queries in order), so `Ok` means the value is in the store,
    /// never only in a socket buffer on its way to a store that is gone or refused it.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        if value.len() > self.max_value {
            return Err(Error::limit(
                &self.who,
                Op::Exchange,
                "TCPStore value",
                self.max_value,
            ));
        }
        let nonce = (value.len() as u32) ^ 0x05e7_05e7;
        let q = [
            Request::new(QueryType::Set)
                .bytes(&self.key(key)?)
                .bytes(value)
                .into_vec(),
            Request::new(QueryType::Ping).u32(nonce).into_vec(),
        ]
        .concat();
        self.run("SET", |io| {
            io.write_all(&q)?;
            if read_u32(io)? != nonce {
                return Err(crate::error::DecodeError::Invalid {
                    what: "PING answer after SET",
                }
                .into());
            }
            Ok(())
        })
    }

    /// `key`'s value, or `None` when it is not set (a `CHECK`, then a `GET`: c10d's answer
    /// to a `GET` of an absent key is an empty value, which a set key may hold too).
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>> {
        let k = self.key(key)?;
        let check = Request::new(QueryType::Check).u64(1).bytes(&k).into_vec();
        let get = Request::new(QueryType::Get).bytes(&k).into_vec();
        let max = self.max_value;
        self.run("GET", |io| {
            io.write_all(&check)?;
            if read_u8(io)? != CHECK_READY {
                return Ok(None);
            }
            io.write_all(&get)?;
            Ok(Some(read_bytes(io, "TCPStore value", max)?))
        })
    }

    /// A query of type `q` naming `keys` (at most [`MAX_KEYS`]).
    fn keys_query(&self, q: QueryType, keys: &[&str]) -> Result<Vec<u8>> {
        if keys.len() > MAX_KEYS {
            return Err(Error::limit(
                &self.who,
                Op::Exchange,
                "keys per query",
                MAX_KEYS,
            ));
        }
        let mut q = Request::new(q).u64(keys.len() as u64);
        for k in keys {
            q = q.bytes(&self.key(k)?);
        }
        Ok(q.into_vec())
    }

    /// Whether every key is set.
    pub fn check(&mut self, keys: &[&str]) -> Result<bool> {
        let q = self.keys_query(QueryType::Check, keys)?;
        self.run("CHECK", |io| {
            io.write_all(&q)?;
            Ok(read_u8(io)? == CHECK_READY)
        })
    }

    /// The values of `keys`, an empty one for each key not set.
    pub fn multi_get(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        let q = self.keys_query(QueryType::MultiGet, keys)?;
        let (n, max) = (keys.len(), self.max_value);
        self.run("MULTI_GET", |io| {
            io.write_all(&q)?;
            (0..n)
                .map(|_| read_bytes(io, "TCPStore value", max))
                .collect()
        })
    }

    /// Deletes `key`; whether it was set.
    pub fn delete(&mut self, key: &str) -> Result<bool> {
        let q = Request::new(QueryType::DeleteKey)
            .bytes(&self.key(key)?)
            .into_vec();
        self.run("DELETE_KEY", |io| {
            io.write_all(&q)?;
            Ok(read_i64(io)? == 1)
        })
    }

    /// Adds `delta` to the integer at `key` (0 when not set); the sum.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let q = Request::new(QueryType::Add)
            .bytes(&self.key(key)?)
            .u64(delta as u64)
            .into_vec();
        self.run("ADD", |io| {
            io.write_all(&q)?;
            read_i64(io)
        })
    }

    /// How many keys the store holds (every client's, torch's own included).
    pub fn num_keys(&mut self) -> Result<i64> {
        let q = Request::new(QueryType::NumKeys).into_vec();
        self.run("GETNUMKEYS", |io| {
            io.write_all(&q)?;
            read_i64(io)
        })
    }
}
