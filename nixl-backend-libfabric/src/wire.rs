//! The bytes this backend puts in agent metadata: connection info (provider + one endpoint
//! name per rail) and per-region public metadata (addressing mode + one key per rail), and the
//! framing of the notification path: a connection's hello, then notifications naming its
//! session (never the sender's name). Read and written with nixl-core's one byte reader
//! ([`nixl_core::backend::bytes`]): bounded, typed errors on anything malformed.
// Public for the `fuzzing` feature's re-exports; crate-private without it.
#![cfg_attr(not(feature = "fuzzing"), allow(unreachable_pub))]

use nixl_core::backend::bytes::{ByteReader, ByteWriter};
use nixl_core::backend::DecodeError;
use nixl_core::backend::{SessionId, SESSION_LEN};

const CONN_MAGIC: &[u8; 4] = b"LFB2";
const REGION_MAGIC: &[u8; 4] = b"LFR2";
const NOTIF_MAGIC: &[u8; 2] = b"N3";
const HELLO_MAGIC: &[u8; 2] = b"H3";
/// Upper bound on rails in metadata.
pub(crate) const MAX_RAILS: usize = 64;
/// Longest provider name or endpoint name.
const MAX_NAME: usize = 1024;

/// `LFB2`, provider, rail count, per rail: endpoint name.
pub fn encode_conn(provider: &str, names: &[Vec<u8>]) -> Vec<u8> {
    let mut w = ByteWriter::new();
    w.put(CONN_MAGIC).put_str(provider).put_len(names.len());
    for n in names {
        w.put_blob(n);
    }
    w.into_vec()
}

/// The provider and per-rail endpoint names.
pub fn decode_conn(b: &[u8]) -> Result<(String, Vec<Vec<u8>>), DecodeError> {
    let mut r = ByteReader::new(b);
    r.magic(CONN_MAGIC)?;
    let provider = r.str("provider", MAX_NAME)?.to_owned();
    let rails = r.count("rail count", MAX_RAILS, 5)?;
    if rails == 0 {
        return Err(DecodeError::Invalid { what: "rail count" });
    }
    let mut names = Vec::with_capacity(rails);
    for _ in 0..rails {
        let n = r.blob("endpoint name", MAX_NAME)?;
        if n.is_empty() {
            return Err(DecodeError::Invalid {
                what: "endpoint name",
            });
        }
        names.push(n.to_vec());
    }
    r.finish()?;
    Ok((provider, names))
}

/// `LFR2`, virtual-address flag, key count, keys.
pub fn encode_region(virt_addr: bool, keys: &[u64]) -> Vec<u8> {
    let mut w = ByteWriter::new();
    w.put(REGION_MAGIC).put_bool(virt_addr).put_len(keys.len());
    for &k in keys {
        w.put_u64(k);
    }
    w.into_vec()
}

/// The addressing mode and per-rail keys.
pub fn decode_region(b: &[u8]) -> Result<(bool, Vec<u64>), DecodeError> {
    let mut r = ByteReader::new(b);
    r.magic(REGION_MAGIC)?;
    let virt = r.bool("addressing mode")?;
    let n = r.count("key count", MAX_RAILS, 8)?;
    if n == 0 {
        return Err(DecodeError::Invalid { what: "key count" });
    }
    let keys = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
    r.finish()?;
    Ok((virt, keys))
}

/// A message on the notification path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// A connection's hello (`nixl_core::backend::hello`): who its later notifications are from.
    Hello(&'a [u8]),
    /// A notification in a session a hello opened.
    Notif(SessionId, &'a [u8]),
}

/// Frames a hello: `H3`, then the hello.
pub fn encode_hello(hello: &[u8]) -> Vec<u8> {
    let mut w = ByteWriter::with_capacity(2 + hello.len());
    w.put(HELLO_MAGIC).put(hello);
    w.into_vec()
}

/// Frames a notification: `N3`, the session id, then the payload (never the sender's name:
/// the receiver knows the sender from the session's hello).
pub fn encode_notif(session: &SessionId, msg: &[u8]) -> Vec<u8> {
    let mut w = ByteWriter::with_capacity(2 + SESSION_LEN + msg.len());
    w.put(NOTIF_MAGIC).put(session).put(msg);
    w.into_vec()
}

/// Parses a message of the notification path.
pub fn decode_message(b: &[u8]) -> Result<Message<'_>, DecodeError> {
    let mut r = ByteReader::new(b);
    match r.array::<2>()? {
        m if &m == HELLO_MAGIC => Ok(Message::Hello(r.rest())),
        m if &m == NOTIF_MAGIC => {
            let s = r.array::<SESSION_LEN>()?;
            Ok(Message::Notif(s, r.rest()))
        }
        _ => Err(DecodeError::BadMagic),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn message_framing_round_trips_and_rejects_garbage() {
        let f = encode_notif(&[3; SESSION_LEN], b"hello");
        assert_eq!(
            decode_message(&f),
            Ok(Message::Notif([3; SESSION_LEN], &b"hello"[..]))
        );
        let h = encode_hello(b"NXHELLO1...");
        assert_eq!(decode_message(&h), Ok(Message::Hello(&b"NXHELLO1..."[..])));
        assert!(decode_message(b"").is_err());
        assert!(decode_message(b"N3short").is_err());
        assert!(
            decode_message(b"N2\x07\x00\x00\x00agent-ahello").is_err(),
            "old named frame"
        );
    }

    #[test]
    fn round_trips() {
        let names = vec![vec![1u8, 2, 3], vec![4u8; 16]];
        let c = encode_conn("tcp;ofi_rxm", &names);
        assert_eq!(decode_conn(&c), Ok(("tcp;ofi_rxm".to_owned(), names)));
        let r = encode_region(true, &[7, 8]);
        assert_eq!(decode_region(&r), Ok((true, vec![7, 8])));
    }

    #[test]
    fn refuses_malformed() {
        assert!(decode_conn(b"").is_err());
        assert!(decode_conn(&encode_conn("tcp", &[])).is_err());
        assert!(decode_conn(&encode_conn("tcp", &[vec![]])).is_err());
        let mut c = encode_conn("tcp", &[vec![1]]);
        c.push(0);
        assert_eq!(decode_conn(&c), Err(DecodeError::Trailing(1)));
        assert!(decode_region(&encode_region(false, &[])).is_err());
        let mut r = encode_region(true, &[1]);
        r[4] = 2;
        assert!(decode_region(&r).is_err(), "addressing mode 2");
        let mut r = encode_region(true, &[1]);
        r.pop();
        assert!(decode_region(&r).is_err());
    }

    proptest! {
        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_message(&b);
            let _ = decode_conn(&b);
            let _ = decode_region(&b);
        }
    }
}
