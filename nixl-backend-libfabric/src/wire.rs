//! The bytes this backend puts in agent metadata: connection info (provider + one endpoint
//! name per rail) and per-region public metadata (addressing mode + one key per rail), and the
//! framing of notification messages. Read and written with nixl-core's one byte reader
//! ([`nixl_core::bytes`]): bounded, typed errors on anything malformed.

use nixl_core::bytes::{ByteReader, ByteWriter};
use nixl_core::DecodeError;

const CONN_MAGIC: &[u8; 4] = b"LFB2";
const REGION_MAGIC: &[u8; 4] = b"LFR2";
const NOTIF_MAGIC: &[u8; 2] = b"N2";
/// Upper bound on rails in metadata.
pub(crate) const MAX_RAILS: usize = 64;
/// Longest provider name or endpoint name.
const MAX_NAME: usize = 1024;
/// Longest sender name of a notification (nixl-core's agent-name bound).
const MAX_SENDER: usize = nixl_core::codec::MAX_NAME;

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

/// Framing of notification messages: `N2`, the sender's name, then the payload.
pub fn encode_notif(sender: &str, msg: &[u8]) -> Vec<u8> {
    let mut w = ByteWriter::with_capacity(6 + sender.len() + msg.len());
    w.put(NOTIF_MAGIC).put_str(sender).put(msg);
    w.into_vec()
}

/// The sender and payload of a framed notification.
pub fn decode_notif(b: &[u8]) -> Result<(String, Vec<u8>), DecodeError> {
    let mut r = ByteReader::new(b);
    r.magic(NOTIF_MAGIC)?;
    let sender = r.str("notification sender", MAX_SENDER)?.to_owned();
    Ok((sender, r.rest().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn notif_framing_round_trips_and_rejects_garbage() {
        let f = encode_notif("agent-a", b"hello");
        assert_eq!(
            decode_notif(&f),
            Ok(("agent-a".to_owned(), b"hello".to_vec()))
        );
        assert!(decode_notif(b"").is_err());
        assert!(decode_notif(b"X2\x01\x00\x00\x00a").is_err());
        assert!(decode_notif(b"N2\xff\x00\x00\x00a").is_err());
        assert_eq!(
            decode_notif(&encode_notif("", b"")),
            Ok((String::new(), Vec::new()))
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
            let _ = decode_notif(&b);
            let _ = decode_conn(&b);
            let _ = decode_region(&b);
        }
    }
}
