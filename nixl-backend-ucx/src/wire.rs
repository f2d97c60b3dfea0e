//! The backend's bytes on the wire: in agent metadata, connection info (the workers'
//! addresses) and region metadata (a packed rkey), both framed, bounded and checksummed, so
//! truncated or corrupted bytes are refused with a typed error before UCX parses anything;
//! and the header of notification active messages (magic + the sender's name).

/// Connection info magic.
const CONN_MAGIC: &[u8; 6] = b"NXUCX1";
/// Region metadata magic.
const RKEY_MAGIC: &[u8; 4] = b"NXRK";
/// The header prefix of a notification (the sender's name follows).
pub(crate) const NOTIF_MAGIC: &[u8; 4] = b"NXN1";
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

fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (h, t) = b.split_at_checked(n)?;
    *b = t;
    Some(h)
}

fn take_u32(b: &mut &[u8]) -> Option<usize> {
    take(b, 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize)
}

/// The header of a notification from `sender`.
pub fn encode_notif_header(sender: &str) -> Vec<u8> {
    let mut h = NOTIF_MAGIC.to_vec();
    h.extend_from_slice(sender.as_bytes());
    h
}

/// The sender named by a notification header; `None` unless it carries the magic and a
/// non-empty UTF-8 name.
pub fn decode_notif_header(h: &[u8]) -> Option<&str> {
    let name = h.strip_prefix(NOTIF_MAGIC.as_slice())?;
    std::str::from_utf8(name).ok().filter(|s| !s.is_empty())
}

/// Encodes the workers' addresses.
pub fn encode_conn(addresses: &[&[u8]]) -> Vec<u8> {
    let mut v = CONN_MAGIC.to_vec();
    v.push(addresses.len() as u8);
    for a in addresses {
        v.extend_from_slice(&(a.len() as u32).to_le_bytes());
        v.extend_from_slice(a);
    }
    seal(v)
}

/// Decodes connection info into worker addresses; `None` when malformed.
pub fn decode_conn(bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut b = unseal(bytes)?;
    if take(&mut b, CONN_MAGIC.len())? != CONN_MAGIC {
        return None;
    }
    let n = usize::from(*take(&mut b, 1)?.first()?);
    if n == 0 || n > MAX_WORKERS {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = take_u32(&mut b)?;
        if len == 0 || len > MAX_BLOB {
            return None;
        }
        out.push(take(&mut b, len)?.to_vec());
    }
    b.is_empty().then_some(out)
}

/// Encodes a packed rkey with the region's memory type.
pub fn encode_rkey(mem_type: u8, packed: &[u8]) -> Vec<u8> {
    let mut v = RKEY_MAGIC.to_vec();
    v.push(mem_type);
    v.extend_from_slice(&(packed.len() as u32).to_le_bytes());
    v.extend_from_slice(packed);
    seal(v)
}

/// Decodes region metadata into (memory type, packed rkey); `None` when malformed.
pub fn decode_rkey(bytes: &[u8]) -> Option<(u8, &[u8])> {
    let mut b = unseal(bytes)?;
    if take(&mut b, RKEY_MAGIC.len())? != RKEY_MAGIC {
        return None;
    }
    let t = *take(&mut b, 1)?.first()?;
    let len = take_u32(&mut b)?;
    if len == 0 || len > MAX_BLOB {
        return None;
    }
    let packed = take(&mut b, len)?;
    b.is_empty().then_some((t, packed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_roundtrips_and_refuses_damage() {
        let e = encode_conn(&[b"abc", b"defg"]);
        assert_eq!(
            decode_conn(&e),
            Some(vec![b"abc".to_vec(), b"defg".to_vec()])
        );
        for i in 0..e.len() {
            assert_eq!(decode_conn(&e[..i]), None, "prefix {i}");
            let mut d = e.clone();
            d[i] ^= 0x40;
            assert_eq!(decode_conn(&d), None, "flip {i}");
        }
        assert_eq!(decode_conn(&encode_conn(&[])), None);
        assert_eq!(decode_conn(&encode_conn(&[b""])), None);
    }

    #[test]
    fn rkey_roundtrips_and_refuses_damage() {
        let e = encode_rkey(0, b"packed-rkey");
        assert_eq!(decode_rkey(&e), Some((0, &b"packed-rkey"[..])));
        for i in 0..e.len() {
            assert_eq!(decode_rkey(&e[..i]), None);
            let mut d = e.clone();
            d[i] ^= 1;
            assert_eq!(decode_rkey(&d), None);
        }
        let mut extra = encode_rkey(0, b"x");
        extra.insert(5, 0);
        assert_eq!(decode_rkey(&extra), None);
        assert_eq!(decode_rkey(&[]), None);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x = 0x1234_5678u64;
        for len in 0..200 {
            let v: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode_conn(&v);
            let _ = decode_rkey(&v);
            let _ = decode_notif_header(&v);
        }
    }

    #[test]
    fn notif_header_round_trips_and_refuses_damage() {
        let h = encode_notif_header("prefill-0");
        assert_eq!(decode_notif_header(&h), Some("prefill-0"));
        assert_eq!(decode_notif_header(b""), None);
        assert_eq!(decode_notif_header(b"NXN"), None);
        assert_eq!(decode_notif_header(b"NXN1"), None, "empty sender");
        assert_eq!(decode_notif_header(b"NXN2abc"), None);
        assert_eq!(decode_notif_header(b"NXN1\xff\xfe"), None, "not UTF-8");
    }
}
