//! The backend's bytes on the wire: in agent metadata, connection info (the workers'
//! addresses and, optionally, the agent's process: how a peer on the same host copies with
//! CMA itself, `crate::cma`) and region metadata (a packed rkey), both framed, bounded and checksummed, so
//! truncated or corrupted bytes are refused with a typed error before UCX parses anything
//! (the structure UCX itself reads is checked in [`crate::validate`]); and the header of
//! notification active messages (magic + the session id of the connection's hello, never a
//! name). Read and written with nixl-core's one byte reader ([`nixl_core::backend::bytes`]).

// Public for the `fuzzing` feature's re-exports; crate-private without it.
#![cfg_attr(not(feature = "fuzzing"), allow(unreachable_pub))]

pub(crate) mod validate;

use nixl_core::backend::bytes::{ByteReader, ByteWriter};
use nixl_core::backend::{DecodeError, ProcessId};
use nixl_core::backend::{SessionId, SESSION_LEN};

/// Connection info magic.
const CONN_MAGIC: &[u8; 6] = b"NXUCX1";
/// Region metadata magic.
const RKEY_MAGIC: &[u8; 4] = b"NXRK";
/// The header prefix of a notification (the session id follows).
pub(crate) const NOTIF_MAGIC: &[u8; 4] = b"NXN2";
/// The most workers a peer may announce.
pub(crate) const MAX_WORKERS: usize = 64;
/// The most bytes of one worker address or rkey.
const MAX_BLOB: usize = 1 << 16;

/// FNV-1a, 64 bits.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn seal(mut v: Vec<u8>) -> Vec<u8> {
    let sum = fnv(&v);
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

fn unseal(bytes: &[u8]) -> Option<&[u8]> {
    let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
    (fnv(body).to_le_bytes() == sum).then_some(body)
}

/// The body of sealed bytes; damage is [`DecodeError::Invalid`] ("checksum").
fn unsealed(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    unseal(bytes).ok_or(DecodeError::Invalid { what: "checksum" })
}

/// The header of a notification sent in session `session`.
pub fn encode_notif_header(session: &SessionId) -> Vec<u8> {
    let mut w = ByteWriter::new();
    w.put(NOTIF_MAGIC).put(session);
    w.into_vec()
}

/// The session a notification header names (the receiver maps it to the sender).
pub fn decode_notif_header(h: &[u8]) -> Result<SessionId, DecodeError> {
    let mut r = ByteReader::new(h);
    r.magic(NOTIF_MAGIC)?;
    let s = r.array::<SESSION_LEN>()?;
    r.finish()?;
    Ok(s)
}

/// The tag of the optional process section after the worker addresses.
const PROCESS_TAG: u8 = 1;

/// Connection info: the workers' addresses, and the agent's process where it announces one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// One UCX worker address per worker.
    pub addresses: Vec<Vec<u8>>,
    /// The process the agent runs in (boot, pid namespace, pid, start time).
    pub process: Option<ProcessId>,
}

/// Encodes the workers' addresses (no process section).
#[cfg(any(test, feature = "fuzzing"))]
pub fn encode_conn(addresses: &[&[u8]]) -> Vec<u8> {
    encode_conn_with(addresses, None)
}

/// Encodes the workers' addresses and, if given, the agent's process.
pub fn encode_conn_with(addresses: &[&[u8]], process: Option<&ProcessId>) -> Vec<u8> {
    let mut w = ByteWriter::new();
    w.put(CONN_MAGIC).put_len(addresses.len());
    for a in addresses {
        w.put_blob(a);
    }
    if let Some(p) = process {
        w.put_u8(PROCESS_TAG)
            .put(&p.boot_id)
            .put_u64(p.pid_ns)
            .put_u32(p.pid)
            .put_u64(p.start_time);
    }
    seal(w.into_vec())
}

/// Decodes connection info into worker addresses (a process section is checked, not kept).
#[cfg(any(test, feature = "fuzzing"))]
pub fn decode_conn(bytes: &[u8]) -> Result<Vec<Vec<u8>>, DecodeError> {
    decode_conn_info(bytes).map(|c| c.addresses)
}

/// Decodes connection info.
pub fn decode_conn_info(bytes: &[u8]) -> Result<ConnInfo, DecodeError> {
    let mut r = ByteReader::new(unsealed(bytes)?);
    r.magic(CONN_MAGIC)?;
    let n = r.count("worker count", MAX_WORKERS, 5)?;
    if n == 0 {
        return Err(DecodeError::Invalid {
            what: "worker count",
        });
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let a = r.blob("worker address", MAX_BLOB)?;
        if a.is_empty() {
            return Err(DecodeError::Invalid {
                what: "worker address",
            });
        }
        out.push(a.to_vec());
    }
    let process = if r.remaining() == 0 {
        None
    } else {
        if r.u8()? != PROCESS_TAG {
            return Err(DecodeError::Invalid {
                what: "connection info section",
            });
        }
        Some(ProcessId {
            boot_id: r.array()?,
            pid_ns: r.u64()?,
            pid: r.u32()?,
            start_time: r.u64()?,
        })
    };
    r.finish()?;
    Ok(ConnInfo {
        addresses: out,
        process,
    })
}

/// Encodes a packed rkey with the region's memory type.
pub fn encode_rkey(mem_type: u8, packed: &[u8]) -> Vec<u8> {
    let mut w = ByteWriter::new();
    w.put(RKEY_MAGIC).put_u8(mem_type).put_blob(packed);
    seal(w.into_vec())
}

/// Decodes region metadata into (memory type, packed rkey).
pub fn decode_rkey(bytes: &[u8]) -> Result<(u8, &[u8]), DecodeError> {
    let mut r = ByteReader::new(unsealed(bytes)?);
    r.magic(RKEY_MAGIC)?;
    let t = r.u8()?;
    let packed = r.blob("packed rkey", MAX_BLOB)?;
    if packed.is_empty() {
        return Err(DecodeError::Invalid {
            what: "packed rkey",
        });
    }
    r.finish()?;
    Ok((t, packed))
}

/// Byte strings of every length below `lens`, from a xorshift generator seeded with `seed`:
/// what a decoder's never-panic tests feed it.
#[cfg(test)]
pub(crate) fn noise(seed: u64, lens: usize) -> impl Iterator<Item = Vec<u8>> {
    let mut x = seed;
    (0..lens).map(move |len| {
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_roundtrips_and_refuses_damage() {
        let e = encode_conn(&[b"abc", b"defg"]);
        assert_eq!(decode_conn(&e), Ok(vec![b"abc".to_vec(), b"defg".to_vec()]));
        for i in 0..e.len() {
            assert!(decode_conn(&e[..i]).is_err(), "prefix {i}");
            let mut d = e.clone();
            d[i] ^= 0x40;
            assert!(decode_conn(&d).is_err(), "flip {i}");
        }
        assert!(decode_conn(&encode_conn(&[])).is_err());
        assert!(decode_conn(&encode_conn(&[b""])).is_err());
    }

    #[test]
    fn conn_with_a_process_roundtrips_and_refuses_damage() {
        let p = ProcessId {
            boot_id: [7; 16],
            pid_ns: 4_026_531_836,
            pid: 4242,
            start_time: 123_456,
        };
        let e = encode_conn_with(&[b"abc"], Some(&p));
        let c = decode_conn_info(&e).unwrap();
        assert_eq!(c.addresses, vec![b"abc".to_vec()]);
        assert_eq!(c.process, Some(p));
        assert_eq!(decode_conn(&e), Ok(vec![b"abc".to_vec()]));
        assert_eq!(
            decode_conn_info(&encode_conn(&[b"abc"])).unwrap().process,
            None
        );
        for i in 0..e.len() {
            assert!(decode_conn_info(&e[..i]).is_err(), "prefix {i}");
            let mut d = e.clone();
            d[i] ^= 0x40;
            assert!(decode_conn_info(&d).is_err(), "flip {i}");
        }
        // Another section tag, or bytes after the section, are refused even when resealed.
        let body = &e[..e.len() - 8];
        let tag_at = body.len() - (1 + 16 + 8 + 4 + 8);
        let mut other = body.to_vec();
        other[tag_at] = 2;
        assert!(decode_conn_info(&seal(other)).is_err());
        let mut longer = body.to_vec();
        longer.push(0);
        assert!(decode_conn_info(&seal(longer)).is_err());
    }

    #[test]
    fn rkey_roundtrips_and_refuses_damage() {
        let e = encode_rkey(0, b"packed-rkey");
        assert_eq!(decode_rkey(&e), Ok((0, &b"packed-rkey"[..])));
        for i in 0..e.len() {
            assert!(decode_rkey(&e[..i]).is_err());
            let mut d = e.clone();
            d[i] ^= 1;
            assert!(decode_rkey(&d).is_err());
        }
        let mut extra = encode_rkey(0, b"x");
        extra.insert(5, 0);
        assert!(decode_rkey(&extra).is_err());
        assert!(decode_rkey(&[]).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        for v in noise(0x1234_5678, 200) {
            let _ = decode_conn(&v);
            let _ = decode_rkey(&v);
            let _ = decode_notif_header(&v);
        }
    }

    #[test]
    fn notif_header_round_trips_and_refuses_damage() {
        let h = encode_notif_header(&[5; SESSION_LEN]);
        assert_eq!(decode_notif_header(&h), Ok([5; SESSION_LEN]));
        assert!(decode_notif_header(b"").is_err());
        assert!(decode_notif_header(b"NXN").is_err());
        assert!(decode_notif_header(b"NXN2").is_err(), "no session");
        assert!(decode_notif_header(&h[..h.len() - 1]).is_err());
        let mut long = h.clone();
        long.push(0);
        assert!(decode_notif_header(&long).is_err());
        assert!(
            decode_notif_header(b"NXN1prefill-0").is_err(),
            "old name header"
        );
    }
}
