//! Metadata exchange over a TCP side channel.
//!
//! Each agent with `listen` on runs a listener thread. Frames are `u32` big-endian length,
//! one type byte, payload; frames are bounded, and a whole exchange has one deadline (each
//! read and write gets only the time left, so a peer that trickles bytes cannot stretch it).
//!
//! | type | payload | reply |
//! |---|---|---|
//! | `PUSH` | metadata | `ACK` (empty) or `ERR` (message) |
//! | `FETCH` | wanted agent name | `MD` (metadata) or `ERR` |
//! | `INVALIDATE` | name, generation | `ACK` |

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::{lock, Agent, FetchStatus};
use crate::error::{DecodeError, Error, Op, Result};

/// Largest frame accepted.
pub const MAX_FRAME: usize = crate::codec::MAX_METADATA + 1;

const PUSH: u8 = 1;
const FETCH: u8 = 2;
const INVALIDATE: u8 = 3;
const ACK: u8 = 10;
const MD: u8 = 11;
const ERR: u8 = 12;

/// A decoded side-channel frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The type byte.
    pub kind: u8,
    /// The payload.
    pub payload: Vec<u8>,
}

/// Reads one frame; refuses oversize lengths before allocating.
pub fn read_frame(r: &mut impl Read) -> std::io::Result<Frame> {
    let mut hdr = [0u8; 5];
    r.read_exact(&mut hdr)?;
    let len = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {MAX_FRAME}"),
        ));
    }
    let mut payload = Vec::new();
    r.take(len as u64).read_to_end(&mut payload)?;
    if payload.len() != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Frame {
        kind: hdr[4],
        payload,
    })
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut hdr = [0u8; 5];
    hdr[..4].copy_from_slice(&len.to_be_bytes());
    hdr[4] = kind;
    w.write_all(&hdr)?;
    w.write_all(payload)?;
    w.flush()
}

/// Parses an `INVALIDATE` payload: `u16` name length, name, `u64` generation (little endian).
pub fn parse_invalidate(p: &[u8]) -> std::result::Result<(String, u64), DecodeError> {
    let n = p
        .get(..2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
        .ok_or(DecodeError::Truncated {
            offset: 0,
            needed: 2,
        })?;
    let name = p.get(2..2 + n).ok_or(DecodeError::Truncated {
        offset: 2,
        needed: n,
    })?;
    let g = p.get(2 + n..2 + n + 8).ok_or(DecodeError::Truncated {
        offset: 2 + n,
        needed: 8,
    })?;
    if p.len() != 2 + n + 8 {
        return Err(DecodeError::Trailing(p.len() - (2 + n + 8)));
    }
    let name =
        std::str::from_utf8(name).map_err(|_| DecodeError::Invalid { what: "agent name" })?;
    let mut gb = [0u8; 8];
    gb.copy_from_slice(g);
    Ok((name.to_owned(), u64::from_le_bytes(gb)))
}

fn encode_invalidate(name: &str, generation: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(name.len() + 10);
    v.extend_from_slice(&(name.len().min(u16::MAX as usize) as u16).to_le_bytes());
    v.extend_from_slice(&name.as_bytes()[..name.len().min(u16::MAX as usize)]);
    v.extend_from_slice(&generation.to_le_bytes());
    v
}

/// The deadline of serving one connection (reading the request, writing the reply).
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A stream whose every read and write is bounded by what is left of one deadline.
struct Deadlined<'a> {
    s: &'a TcpStream,
    deadline: Instant,
}

impl Deadlined<'_> {
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(std::io::ErrorKind::TimedOut.into())
        } else {
            Ok(left)
        }
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.s.set_read_timeout(Some(self.left()?))?;
        self.s.read(buf)
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.s.set_write_timeout(Some(self.left()?))?;
        self.s.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.s.flush()
    }
}

pub(crate) fn start_listener(agent: &Agent) -> Result<()> {
    let name = agent.name().to_owned();
    let listener = TcpListener::bind(agent.shared.config.listen_addr)
        .map_err(|e| Error::io(&name, Op::Exchange, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io(&name, Op::Exchange, e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io(&name, Op::Exchange, e))?;
    *lock(&agent.shared.listen_addr) = Some(addr);
    let weak = Arc::downgrade(&agent.shared);
    let stop = agent.shared.stop.clone();
    let handle = std::thread::Builder::new()
        .name(format!("nixl-listen-{name}"))
        .spawn(move || {
            let mut idle = Duration::from_micros(200);
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        idle = Duration::from_micros(200);
                        let Some(shared) = weak.upgrade() else { break };
                        let agent = Agent { shared };
                        // Serve on the listener thread: requests are small and bounded by
                        // IO_TIMEOUT, so a slow client delays others by at most that.
                        if let Err(e) = serve(&agent, stream) {
                            tracing::debug!(agent = %agent.name(), error = %e, "side-channel connection ended with an error");
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(idle);
                        idle = (idle * 2).min(Duration::from_millis(5));
                    }
                    Err(e) => {
                        tracing::warn!(agent = %name, error = %e, "accept failed");
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        })
        .map_err(|e| Error::io(agent.name(), Op::Exchange, e))?;
    lock(&agent.shared.threads).push(handle);
    Ok(())
}

fn serve(agent: &Agent, stream: TcpStream) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    let mut s = Deadlined {
        s: &stream,
        deadline: Instant::now() + IO_TIMEOUT,
    };
    let f = read_frame(&mut s)?;
    match f.kind {
        PUSH => match agent.load_remote_metadata(&f.payload) {
            Ok(_) => write_frame(&mut s, ACK, &[]),
            Err(e) => write_frame(&mut s, ERR, e.to_string().as_bytes()),
        },
        FETCH => {
            let wanted = String::from_utf8_lossy(&f.payload);
            if !wanted.is_empty() && wanted != agent.name() {
                return write_frame(
                    &mut s,
                    ERR,
                    format!("this is agent {}, not {wanted}", agent.name()).as_bytes(),
                );
            }
            match agent.local_metadata() {
                Ok(md) => write_frame(&mut s, MD, &md),
                Err(e) => write_frame(&mut s, ERR, e.to_string().as_bytes()),
            }
        }
        INVALIDATE => match parse_invalidate(&f.payload) {
            Ok((name, generation)) => {
                agent.invalidate_remote_generation(&name, generation);
                write_frame(&mut s, ACK, &[])
            }
            Err(e) => write_frame(&mut s, ERR, e.to_string().as_bytes()),
        },
        other => write_frame(
            &mut s,
            ERR,
            format!("unknown frame type {other}").as_bytes(),
        ),
    }
}

fn connect(addr: SocketAddr, deadline: Instant) -> std::io::Result<TcpStream> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    let s = TcpStream::connect_timeout(&addr, left)?;
    s.set_nodelay(true)?;
    Ok(s)
}

fn exchange(
    addr: SocketAddr,
    kind: u8,
    payload: &[u8],
    deadline: Instant,
) -> std::io::Result<Frame> {
    let stream = connect(addr, deadline)?;
    let mut s = Deadlined {
        s: &stream,
        deadline,
    };
    write_frame(&mut s, kind, payload)?;
    read_frame(&mut s)
}

impl Agent {
    fn map_io(&self, e: std::io::Error, timeout: Duration) -> Error {
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

    /// Pushes this agent's full metadata to the agent listening at `addr` (NIXL's
    /// `sendLocalMD`), within the default timeout.
    #[doc(alias = "sendLocalMD")]
    pub fn send_local_metadata(&self, addr: SocketAddr) -> Result<()> {
        let md = self.local_metadata()?;
        self.send_metadata_bytes(addr, &md, self.shared.config.default_timeout)
    }

    /// Pushes given metadata bytes (e.g. from `local_partial_metadata`) to `addr`.
    pub fn send_metadata_bytes(
        &self,
        addr: SocketAddr,
        md: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        let f = exchange(addr, PUSH, md, Instant::now() + timeout)
            .map_err(|e| self.map_io(e, timeout))?;
        match f.kind {
            ACK => Ok(()),
            ERR => Err(Error::backend(
                self.name(),
                "side-channel",
                Op::Exchange,
                String::from_utf8_lossy(&f.payload),
            )),
            k => Err(Error::invalid(
                self.name(),
                Op::Exchange,
                format!("unexpected reply type {k}"),
            )),
        }
    }

    /// Fetches `remote`'s metadata from `addr` and loads it, blocking up to `timeout`. Returns
    /// the loaded name.
    pub fn fetch_remote_metadata_blocking(
        &self,
        remote: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<String> {
        let f = exchange(addr, FETCH, remote.as_bytes(), Instant::now() + timeout)
            .map_err(|e| self.map_io(e, timeout))?;
        match f.kind {
            MD => {
                let name = self.load_remote_metadata(&f.payload)?;
                if !remote.is_empty() && name != remote {
                    // Checked by the server too; a wrong answer must not stay loaded.
                    let _ = self.invalidate_remote_metadata(&name);
                    return Err(Error::mismatch(
                        self.name(),
                        Op::Exchange,
                        format!("asked for {remote}, got {name}"),
                    ));
                }
                Ok(name)
            }
            ERR => Err(Error::not_found(
                self.name(),
                Op::Exchange,
                String::from_utf8_lossy(&f.payload),
            )),
            k => Err(Error::invalid(
                self.name(),
                Op::Exchange,
                format!("unexpected reply type {k}"),
            )),
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
        lock(&self.shared.fetches).insert(remote.to_owned(), FetchStatus::Pending);
        let agent = self.clone();
        let remote = remote.to_owned();
        let timeout = self.shared.config.default_timeout;
        std::thread::Builder::new()
            .name("nixl-fetch".into())
            .spawn(move || {
                let r = agent.fetch_remote_metadata_blocking(&remote, addr, timeout);
                let mut f = lock(&agent.shared.fetches);
                match r {
                    Ok(_) => f.remove(&remote),
                    Err(e) => f.insert(remote, FetchStatus::Failed(e.to_string())),
                };
            })
            .map_err(|e| Error::io(self.name(), Op::Exchange, e))?;
        Ok(())
    }

    /// The state of a background fetch: `Ok(true)` loaded, `Ok(false)` still pending, or the
    /// error it failed with.
    pub fn fetch_status(&self, remote: &str) -> Result<bool> {
        match lock(&self.shared.fetches).get(remote) {
            Some(FetchStatus::Pending) => Ok(false),
            Some(FetchStatus::Failed(m)) => Err(Error::not_found(
                self.name(),
                Op::Exchange,
                format!("fetching {remote}: {m}"),
            )),
            None => Ok(self.check_remote_metadata(remote, None)),
        }
    }

    /// Tells the agent at `addr` to forget this agent (NIXL's `invalidateLocalMD`).
    #[doc(alias = "invalidateLocalMD")]
    pub fn invalidate_local_metadata(&self, addr: SocketAddr) -> Result<()> {
        let timeout = self.shared.config.default_timeout;
        let payload = encode_invalidate(self.name(), self.generation());
        let f = exchange(addr, INVALIDATE, &payload, Instant::now() + timeout)
            .map_err(|e| self.map_io(e, timeout))?;
        match f.kind {
            ACK => Ok(()),
            _ => Err(Error::backend(
                self.name(),
                "side-channel",
                Op::Exchange,
                String::from_utf8_lossy(&f.payload),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_roundtrip_and_bound() {
        let mut buf = Vec::new();
        write_frame(&mut buf, PUSH, b"hello").unwrap();
        assert_eq!(
            read_frame(&mut &buf[..]).unwrap(),
            Frame {
                kind: PUSH,
                payload: b"hello".to_vec()
            }
        );
        let mut huge = (u32::MAX).to_be_bytes().to_vec();
        huge.push(PUSH);
        assert!(read_frame(&mut &huge[..]).is_err());
        assert!(read_frame(&mut &buf[..7]).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_frames_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = read_frame(&mut &bytes[..]);
            let _ = parse_invalidate(&bytes);
        }

        #[test]
        fn invalidate_roundtrips(name in "[a-z]{0,40}", g in any::<u64>()) {
            prop_assert_eq!(parse_invalidate(&encode_invalidate(&name, g)), Ok((name, g)));
        }
    }
}
