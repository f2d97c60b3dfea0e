//! Side-channel frames: bytes, authentication, and reading and writing under one deadline.
//!
//! A frame is a `u32` length, then a body ([`crate::bytes`], little endian):
//! magic `NXS2`, the kind, an auth flag, with authentication the stamp (credential id,
//! timestamp, nonce), the payload (length-prefixed), and with authentication an HMAC-SHA256
//! of everything in the body before it. A reply carries the nonce of the request it answers,
//! under a different MAC domain, so a request can be neither replayed nor reflected.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::local::Timed;
use crate::auth::{self, domain, Auth, Credential, Stamp, MAC_LEN, NONCE_LEN};
use crate::bytes::{ByteReader, ByteWriter};
use crate::error::DecodeError;

/// Magic at the start of every frame body (refuses other protocols and older versions).
pub const MAGIC: &[u8; 4] = b"NXS2";
/// Largest reply a client accepts (metadata plus framing).
pub const MAX_REPLY: usize = crate::codec::MAX_METADATA + 4096;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// Request: load this metadata (payload: a metadata blob, sealed when authenticated).
    Push,
    /// Request: send your metadata (payload: the wanted agent name, or empty).
    Fetch,
    /// Request: forget me (payload: name, generation, owner token).
    Invalidate,
    /// Reply: done (empty payload).
    Ack,
    /// Reply: metadata (payload: the blob).
    Metadata,
    /// Reply: refused (payload: an error code and a message).
    Err,
}

impl Kind {
    fn tag(self) -> u8 {
        match self {
            Kind::Push => 1,
            Kind::Fetch => 2,
            Kind::Invalidate => 3,
            Kind::Ack => 10,
            Kind::Metadata => 11,
            Kind::Err => 12,
        }
    }

    fn from_tag(t: u8) -> Option<Kind> {
        Some(match t {
            1 => Kind::Push,
            2 => Kind::Fetch,
            3 => Kind::Invalidate,
            10 => Kind::Ack,
            11 => Kind::Metadata,
            12 => Kind::Err,
            _ => return None,
        })
    }

    /// Whether this kind is a reply.
    pub fn is_reply(self) -> bool {
        matches!(self, Kind::Ack | Kind::Metadata | Kind::Err)
    }
}

/// A decoded frame body (nothing verified yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The kind.
    pub kind: Kind,
    /// The stamp of an authenticated frame.
    pub stamp: Option<StampView>,
    /// The payload.
    pub payload: &'a [u8],
    signed: &'a [u8],
    mac: Option<&'a [u8]>,
}

/// The authentication stamp of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StampView {
    /// Credential id.
    pub credential: String,
    /// Milliseconds since the Unix epoch when the request was made.
    pub ts_ms: u64,
    /// Random per request (a reply repeats its request's).
    pub nonce: [u8; NONCE_LEN],
}

/// The direction of a frame, which selects its MAC domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    Request,
    Reply,
}

impl Dir {
    fn domain(self) -> &'static [u8] {
        match self {
            Dir::Request => domain::REQUEST,
            Dir::Reply => domain::REPLY,
        }
    }
}

/// Encodes a frame (length prefix included); signed when `auth` is given.
pub(crate) fn encode(
    kind: Kind,
    payload: &[u8],
    auth: Option<(&Credential, &Stamp, Dir)>,
) -> Vec<u8> {
    let mut w = ByteWriter::with_capacity(payload.len() + 128);
    w.put(MAGIC).put_u8(kind.tag()).put_bool(auth.is_some());
    if let Some((_, stamp, _)) = auth {
        stamp.write(&mut w);
    }
    w.put_blob(payload);
    if let Some((cred, _, dir)) = auth {
        let tag = auth::mac(cred, dir.domain(), w.as_slice());
        w.put(&tag);
    }
    let body = w.into_vec();
    let mut out = ByteWriter::with_capacity(body.len() + 4);
    out.put_len(body.len()).put(&body);
    out.into_vec()
}

/// An unauthenticated frame (length prefix included), e.g. for tests and tools.
pub fn encode_plain(kind: Kind, payload: &[u8]) -> Vec<u8> {
    encode(kind, payload, None)
}

/// A request signed with `cred` (length prefix included) and its nonce: what a client
/// sends. Fails only when the kernel has no randomness.
pub fn encode_signed_request(
    kind: Kind,
    payload: &[u8],
    cred: &Credential,
) -> crate::Result<(Vec<u8>, [u8; NONCE_LEN])> {
    let stamp = Stamp::fresh(cred)?;
    Ok((
        encode(kind, payload, Some((cred, &stamp, Dir::Request))),
        stamp.nonce,
    ))
}

/// Decodes a frame body (after its length prefix).
pub fn decode(body: &[u8]) -> Result<Frame<'_>, DecodeError> {
    let mut r = ByteReader::new(body);
    r.magic(MAGIC)?;
    let kind = Kind::from_tag(r.u8()?).ok_or(DecodeError::Invalid { what: "frame kind" })?;
    let authed = r.bool("frame auth flag")?;
    let stamp = if authed {
        let s = Stamp::read(&mut r)?;
        Some(StampView {
            credential: s.credential,
            ts_ms: s.ts_ms,
            nonce: s.nonce,
        })
    } else {
        None
    };
    let payload = r.blob("frame payload", usize::MAX)?;
    let signed = &body[..r.position()];
    let mac = if authed { Some(r.take(MAC_LEN)?) } else { None };
    r.finish()?;
    Ok(Frame {
        kind,
        stamp,
        payload,
        signed,
        mac,
    })
}

impl Frame<'_> {
    /// Verifies the frame's MAC under the credential its stamp names, if `auth` accepts it.
    pub(crate) fn verify<'c>(
        &self,
        auth: &'c Auth,
        dir: Dir,
    ) -> Result<&'c Credential, &'static str> {
        let (Some(stamp), Some(mac)) = (&self.stamp, self.mac) else {
            return Err("authentication required");
        };
        let cred = auth.find(&stamp.credential).ok_or("unknown credential")?;
        if !auth::verify(cred, dir.domain(), self.signed, mac) {
            return Err("authentication failed");
        }
        Ok(cred)
    }
}

/// Error codes of `Err` replies (so a client can return the server's error kind).
pub(crate) mod code {
    pub(crate) const OTHER: u8 = 0;
    pub(crate) const NOT_ALLOWED: u8 = 1;
    pub(crate) const NOT_FOUND: u8 = 2;
    pub(crate) const LIMIT: u8 = 3;
    pub(crate) const DECODE: u8 = 4;
    pub(crate) const MISMATCH: u8 = 5;
}

/// The payload of an `Err` reply.
pub(crate) fn encode_error(code: u8, msg: &str) -> Vec<u8> {
    let mut w = ByteWriter::new();
    w.put_u8(code).put_str(msg);
    w.into_vec()
}

/// Code and message of an `Err` payload.
pub(crate) fn decode_error(p: &[u8]) -> (u8, String) {
    let mut r = ByteReader::new(p);
    match (r.u8(), r.str("error message", 1 << 16)) {
        (Ok(c), Ok(m)) => (c, m.to_owned()),
        _ => (code::OTHER, String::from_utf8_lossy(p).into_owned()),
    }
}

/// Bytes buffered by a server's connections, bounded.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    used: AtomicUsize,
}

impl Budget {
    /// Reserves `n` bytes if the total stays within `cap`.
    pub(crate) fn reserve(&self, n: usize, cap: usize) -> Option<Reservation<'_>> {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let next = cur.checked_add(n).filter(|&v| v <= cap)?;
            match self
                .used
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(Reservation { budget: self, n }),
                Err(c) => cur = c,
            }
        }
    }

    /// Bytes reserved now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// Bytes held from a [`Budget`] until dropped.
#[derive(Debug)]
pub(crate) struct Reservation<'a> {
    budget: &'a Budget,
    n: usize,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.n, Ordering::AcqRel);
    }
}

/// A stream read and written under one deadline for the whole exchange (not per call).
pub(crate) struct Deadlined<'a, S: Timed = TcpStream> {
    pub stream: &'a S,
    pub deadline: Instant,
}

impl<S: Timed> Deadlined<'_, S> {
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(std::io::ErrorKind::TimedOut.into())
        } else {
            Ok(left)
        }
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

impl<S: Timed> Read for Deadlined<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            self.stream.set_read_timeout(Some(self.left()?))?;
            match self.stream.read_some(buf) {
                Err(e) if timed_out(&e) || e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }
}

impl<S: Timed> Write for Deadlined<'_, S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            self.stream.set_write_timeout(Some(self.left()?))?;
            match self.stream.write_some(buf) {
                Err(e) if timed_out(&e) || e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads one frame's body: refuses a length over `max` before reading it, and reserves the
/// length from `budget` (when given) while the body is held.
pub(crate) fn read_body<'b>(
    r: &mut impl Read,
    max: usize,
    budget: Option<(&'b Budget, usize)>,
) -> std::io::Result<(Vec<u8>, Option<Reservation<'b>>)> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {max}"),
        ));
    }
    let held = match budget {
        Some((b, cap)) => Some(b.reserve(len, cap).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                "the listener's buffer budget is exhausted",
            )
        })?),
        None => None,
    };
    // Grows with the bytes that actually arrive, not with the claimed length.
    let mut body = Vec::with_capacity(len.min(64 << 10));
    r.take(len as u64).read_to_end(&mut body)?;
    if body.len() != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok((body, held))
}

/// Reads one frame from a byte source without deadline or budget (tools, fuzzing).
pub fn read_frame(r: &mut impl Read, max: usize) -> std::io::Result<Vec<u8>> {
    read_body(r, max, None).map(|(b, _)| b)
}

/// `name`, `generation`, owner token: the payload of an `Invalidate` request.
pub fn encode_invalidate(name: &str, generation: u64, owner_token: &[u8]) -> Vec<u8> {
    let mut w = ByteWriter::with_capacity(name.len() + 48);
    w.put_str(name).put_u64(generation).put_blob(owner_token);
    w.into_vec()
}

/// Parses an `Invalidate` payload.
pub fn parse_invalidate(p: &[u8]) -> Result<(String, u64, Vec<u8>), DecodeError> {
    let mut r = ByteReader::new(p);
    let name = r.str("agent name", crate::codec::MAX_NAME)?.to_owned();
    let generation = r.u64()?;
    let token = r.blob("owner token", 64)?.to_vec();
    r.finish()?;
    Ok((name, generation, token))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body(frame: &[u8]) -> &[u8] {
        &frame[4..]
    }

    #[test]
    fn plain_and_signed_frames_roundtrip() {
        let f = encode_plain(Kind::Fetch, b"agent");
        let d = decode(body(&f)).unwrap();
        assert_eq!(
            (d.kind, d.payload, d.stamp.is_none()),
            (Kind::Fetch, &b"agent"[..], true)
        );
        let cred = Credential::generate("c").unwrap();
        let auth = Auth::new(cred.clone());
        let (f, nonce) = encode_signed_request(Kind::Push, b"md", &cred).unwrap();
        let d = decode(body(&f)).unwrap();
        assert_eq!(d.stamp.as_ref().unwrap().nonce, nonce);
        assert!(d.verify(&auth, Dir::Request).is_ok());
        // Not as a reply (domain), not under another secret, not with any byte changed.
        assert!(d.verify(&auth, Dir::Reply).is_err());
        assert!(d
            .verify(&Auth::new(Credential::generate("c").unwrap()), Dir::Request)
            .is_err());
        for i in 4..f.len() {
            let mut m = f.clone();
            m[i] ^= 1;
            if let Ok(d) = decode(body(&m)) {
                assert!(d.verify(&auth, Dir::Request).is_err(), "byte {i}");
            }
        }
        // An unsigned frame does not verify.
        let plain = encode_plain(Kind::Push, b"md");
        let d = decode(body(&plain)).unwrap();
        assert_eq!(
            d.verify(&auth, Dir::Request).err(),
            Some("authentication required")
        );
    }

    #[test]
    fn lengths_are_bounded_before_reading() {
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(b"NXS2");
        assert!(read_frame(&mut &huge[..], 1 << 20).is_err());
        let f = encode_plain(Kind::Ack, b"");
        assert!(read_frame(&mut &f[..f.len() - 1], 1 << 20).is_err());
        let b = Budget::default();
        let r = b.reserve(10, 15).unwrap();
        assert!(b.reserve(10, 15).is_none());
        drop(r);
        assert_eq!(b.used(), 0);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
            let _ = read_frame(&mut &bytes[..], 1 << 16);
            let _ = parse_invalidate(&bytes);
            let _ = decode_error(&bytes);
        }

        #[test]
        fn invalidate_roundtrips(name in "[a-z]{0,40}", g in any::<u64>(), t in proptest::collection::vec(any::<u8>(), 0..33)) {
            prop_assert_eq!(parse_invalidate(&encode_invalidate(&name, g, &t)), Ok((name, g, t)));
        }
    }
}
