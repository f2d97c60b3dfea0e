//! The c10d TCPStore wire (PyTorch's `torch.distributed.TCPStore`, which NIXL 1.5's
//! `nixlTcpStoreClient` speaks too): a query is one byte naming it, then its arguments; keys
//! and values are a `u64` length and the bytes. c10d writes integers in the host's byte
//! order; nixl-rs speaks little-endian, the order of every host NIXL and PyTorch run on.
//!
//! [`read_query`] is the server's parser of outside bytes: every length is checked against
//! its limit before anything is allocated, and a value grows with the bytes that arrive, not
//! with the length claimed.

use std::io::Read;

use crate::bytes::{ByteReader, ByteWriter};
use crate::error::DecodeError;

/// The number a client sends first (c10d's `validationMagicNumber`).
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
/// The longest key c10d's server accepts (its `MAX_STRING_LEN`).
pub const MAX_KEY: usize = 8 * 1024;
/// The largest value c10d's server accepts (its `MAX_PAYLOAD_LEN`), the default bound here.
pub const MAX_VALUE: usize = 8 * 1024 * 1024;
/// Most keys one query may name (c10d's `MAX_KEY_COUNT`).
pub const MAX_KEYS: usize = 128 * 1024;

/// `CHECK`'s answer: every key is set.
pub const CHECK_READY: u8 = 0;
/// `CHECK`'s answer: some key is not set.
pub const CHECK_NOT_READY: u8 = 1;
/// `WAIT`'s answer: every key is set.
pub const WAIT_STOP: u8 = 0;
/// `CANCEL_WAIT`'s answer.
pub const WAIT_CANCELED: u8 = 1;

/// c10d's query types (`c10d::detail::QueryType`), by their byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
#[non_exhaustive]
pub enum QueryType {
    /// The magic number; must come first on a connection.
    Validate = 0,
    /// Sets a key (no answer).
    Set = 1,
    /// Sets a key if it holds an expected value; answers the value it holds after.
    CompareSet = 2,
    /// Answers a key's value (empty when absent).
    Get = 3,
    /// Adds to a key holding a decimal integer; answers the sum.
    Add = 4,
    /// Answers whether every key named is set.
    Check = 5,
    /// Answers once every key named is set.
    Wait = 6,
    /// Answers how many keys the store holds.
    NumKeys = 7,
    /// Deletes a key; answers how many were deleted.
    DeleteKey = 8,
    /// Appends to a key's value (no answer).
    Append = 9,
    /// Answers the values of several keys.
    MultiGet = 10,
    /// Sets several keys (no answer).
    MultiSet = 11,
    /// Ends a pending `WAIT`.
    CancelWait = 12,
    /// Echoes a `u32`.
    Ping = 13,
}

impl QueryType {
    /// The query a byte names (`None` for one this server does not serve).
    pub fn from_byte(b: u8) -> Option<Self> {
        use QueryType::*;
        Some(match b {
            0 => Validate,
            1 => Set,
            2 => CompareSet,
            3 => Get,
            4 => Add,
            5 => Check,
            6 => Wait,
            7 => NumKeys,
            8 => DeleteKey,
            9 => Append,
            10 => MultiGet,
            11 => MultiSet,
            12 => CancelWait,
            13 => Ping,
            _ => return None,
        })
    }
}

/// A query as the server reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Query {
    /// `VALIDATE` with the number sent.
    Validate(u32),
    /// `SET key value`.
    Set(Vec<u8>, Vec<u8>),
    /// `COMPARE_SET key expected new`.
    CompareSet(Vec<u8>, Vec<u8>, Vec<u8>),
    /// `GET key`.
    Get(Vec<u8>),
    /// `ADD key delta`.
    Add(Vec<u8>, i64),
    /// `CHECK keys`.
    Check(Vec<Vec<u8>>),
    /// `WAIT keys`.
    Wait(Vec<Vec<u8>>),
    /// `GETNUMKEYS`.
    NumKeys,
    /// `DELETE_KEY key`.
    DeleteKey(Vec<u8>),
    /// `APPEND key value`.
    Append(Vec<u8>, Vec<u8>),
    /// `MULTI_GET keys`.
    MultiGet(Vec<Vec<u8>>),
    /// `MULTI_SET (key value)*`.
    MultiSet(Vec<(Vec<u8>, Vec<u8>)>),
    /// `CANCEL_WAIT`.
    CancelWait,
    /// `PING nonce`.
    Ping(u32),
}

/// Why a query could not be read: the connection ends either way.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// The stream failed or ended (or its deadline passed).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The bytes are not a query this server serves, or exceed a limit.
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

fn fixed<const N: usize>(r: &mut impl Read) -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

/// A `u32`.
pub fn read_u32(r: &mut impl Read) -> Result<u32, QueryError> {
    Ok(ByteReader::new(&fixed::<4>(r)?).u32()?)
}

/// A `u64`.
pub fn read_u64(r: &mut impl Read) -> Result<u64, QueryError> {
    Ok(ByteReader::new(&fixed::<8>(r)?).u64()?)
}

/// An `i64`.
pub fn read_i64(r: &mut impl Read) -> Result<i64, QueryError> {
    Ok(read_u64(r)? as i64)
}

/// One byte.
pub fn read_u8(r: &mut impl Read) -> Result<u8, QueryError> {
    Ok(fixed::<1>(r)?[0])
}

/// A `u64` length and that many bytes, at most `limit`; the buffer grows with the bytes that
/// arrive.
pub fn read_bytes(
    r: &mut impl Read,
    what: &'static str,
    limit: usize,
) -> Result<Vec<u8>, QueryError> {
    let len = read_u64(r)?;
    if len > limit as u64 {
        return Err(DecodeError::TooLarge {
            what,
            value: len,
            limit: limit as u64,
        }
        .into());
    }
    let mut out = Vec::with_capacity((len as usize).min(64 << 10));
    r.take(len).read_to_end(&mut out)?;
    if out.len() as u64 != len {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    Ok(out)
}

/// A key count and that many items read by `item`, at most [`MAX_KEYS`]; the list grows as
/// the items arrive (each takes at least its 8-byte length).
fn read_list<T>(
    r: &mut impl Read,
    mut item: impl FnMut(&mut dyn Read) -> Result<T, QueryError>,
) -> Result<Vec<T>, QueryError> {
    let n = read_u64(r)?;
    if n > MAX_KEYS as u64 {
        return Err(DecodeError::TooLarge {
            what: "key count",
            value: n,
            limit: MAX_KEYS as u64,
        }
        .into());
    }
    let mut out = Vec::with_capacity((n as usize).min(1024));
    for _ in 0..n {
        out.push(item(r)?);
    }
    Ok(out)
}

fn read_keys(r: &mut impl Read) -> Result<Vec<Vec<u8>>, QueryError> {
    read_list(r, |mut r| read_bytes(&mut r, "key", MAX_KEY))
}

/// Reads one query whose type byte is `first`; values at most `max_value` bytes.
pub fn read_query(first: u8, r: &mut impl Read, max_value: usize) -> Result<Query, QueryError> {
    let key = |r: &mut _| read_bytes(r, "key", MAX_KEY);
    let value = |r: &mut _| read_bytes(r, "value", max_value);
    let Some(q) = QueryType::from_byte(first) else {
        return Err(DecodeError::Invalid { what: "query type" }.into());
    };
    Ok(match q {
        QueryType::Validate => Query::Validate(read_u32(r)?),
        QueryType::Set => Query::Set(key(r)?, value(r)?),
        QueryType::CompareSet => Query::CompareSet(key(r)?, value(r)?, value(r)?),
        QueryType::Get => Query::Get(key(r)?),
        QueryType::Add => Query::Add(key(r)?, read_i64(r)?),
        QueryType::Check => Query::Check(read_keys(r)?),
        QueryType::Wait => Query::Wait(read_keys(r)?),
        QueryType::NumKeys => Query::NumKeys,
        QueryType::DeleteKey => Query::DeleteKey(key(r)?),
        QueryType::Append => Query::Append(key(r)?, value(r)?),
        QueryType::MultiGet => Query::MultiGet(read_keys(r)?),
        QueryType::MultiSet => Query::MultiSet(read_list(r, |mut r| {
            Ok((
                read_bytes(&mut r, "key", MAX_KEY)?,
                read_bytes(&mut r, "value", max_value)?,
            ))
        })?),
        QueryType::CancelWait => Query::CancelWait,
        QueryType::Ping => Query::Ping(read_u32(r)?),
    })
}

/// A query's bytes, built as a client sends them.
#[derive(Debug)]
pub struct Request(ByteWriter);

impl Request {
    /// A query of type `q` with no arguments yet.
    pub fn new(q: QueryType) -> Self {
        let mut w = ByteWriter::new();
        w.put_u8(q as u8);
        Request(w)
    }

    /// Appends a `u32`.
    pub fn u32(mut self, v: u32) -> Self {
        self.0.put_u32(v);
        self
    }

    /// Appends a `u64` (a count).
    pub fn u64(mut self, v: u64) -> Self {
        self.0.put_u64(v);
        self
    }

    /// Appends a key or value: its `u64` length, then its bytes.
    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.0.put_u64(b.len() as u64).put(b);
        self
    }

    /// The bytes to send.
    pub fn into_vec(self) -> Vec<u8> {
        self.0.into_vec()
    }
}

/// A value's answer: its `u64` length, then its bytes.
pub fn encode_value(out: &mut ByteWriter, v: &[u8]) {
    out.put_u64(v.len() as u64).put(v);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_reads_back_as_sent() {
        let bytes = Request::new(QueryType::Set)
            .bytes(b"/k")
            .bytes(b"value")
            .into_vec();
        let q = read_query(bytes[0], &mut &bytes[1..], MAX_VALUE).expect("reads");
        assert_eq!(q, Query::Set(b"/k".to_vec(), b"value".to_vec()));
        let bytes = Request::new(QueryType::Check)
            .u64(2)
            .bytes(b"/a")
            .bytes(b"/b")
            .into_vec();
        let q = read_query(bytes[0], &mut &bytes[1..], MAX_VALUE).expect("reads");
        assert_eq!(q, Query::Check(vec![b"/a".to_vec(), b"/b".to_vec()]));
    }

    #[test]
    fn hostile_lengths_are_refused_before_allocation() {
        // A value claiming 2^60 bytes, a key over c10d's limit, a key count over the limit.
        let huge = Request::new(QueryType::Set)
            .bytes(b"/k")
            .u64(1 << 60)
            .into_vec();
        assert!(matches!(
            read_query(huge[0], &mut &huge[1..], MAX_VALUE),
            Err(QueryError::Decode(DecodeError::TooLarge {
                what: "value",
                ..
            }))
        ));
        let long_key = Request::new(QueryType::Get)
            .bytes(&[b'k'; MAX_KEY + 1])
            .into_vec();
        assert!(matches!(
            read_query(long_key[0], &mut &long_key[1..], MAX_VALUE),
            Err(QueryError::Decode(DecodeError::TooLarge {
                what: "key",
                ..
            }))
        ));
        let many = Request::new(QueryType::MultiGet).u64(u64::MAX).into_vec();
        assert!(matches!(
            read_query(many[0], &mut &many[1..], MAX_VALUE),
            Err(QueryError::Decode(DecodeError::TooLarge {
                what: "key count",
                ..
            }))
        ));
        // A length larger than what follows: the stream ends, nothing is made up.
        let short = Request::new(QueryType::Get).u64(100).into_vec();
        assert!(matches!(
            read_query(short[0], &mut &short[1..], MAX_VALUE),
            Err(QueryError::Io(_))
        ));
        assert!(matches!(
            read_query(200, &mut &[][..], MAX_VALUE),
            Err(QueryError::Decode(DecodeError::Invalid { .. }))
        ));
    }
}
