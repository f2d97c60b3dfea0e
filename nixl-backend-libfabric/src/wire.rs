//! The bytes this backend puts in agent metadata: connection info (provider + one endpoint
//! name per rail) and per-region public metadata (addressing mode + one key per rail).
//! Decoders are bounded and return `None` on anything malformed.

const CONN_MAGIC: &[u8; 4] = b"LFB1";
const REGION_VERSION: u8 = 1;
/// Upper bound on rails in metadata.
pub(crate) const MAX_RAILS: usize = 64;
const MAX_NAME: usize = 1024;

/// `LFB1`, provider (u8 len + bytes), rails (u8), per rail: name (u16 LE len + bytes).
pub fn encode_conn(provider: &str, names: &[Vec<u8>]) -> Vec<u8> {
    let mut v = CONN_MAGIC.to_vec();
    let p = &provider.as_bytes()[..provider.len().min(255)];
    v.push(p.len() as u8);
    v.extend_from_slice(p);
    v.push(names.len().min(MAX_RAILS) as u8);
    for n in names.iter().take(MAX_RAILS) {
        let n = &n[..n.len().min(MAX_NAME)];
        v.extend_from_slice(&(n.len() as u16).to_le_bytes());
        v.extend_from_slice(n);
    }
    v
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    }
}

/// The provider and per-rail endpoint names.
pub fn decode_conn(b: &[u8]) -> Option<(String, Vec<Vec<u8>>)> {
    let mut r = Reader(b);
    if r.take(4)? != CONN_MAGIC {
        return None;
    }
    let plen = usize::from(r.u8()?);
    let provider = std::str::from_utf8(r.take(plen)?).ok()?.to_owned();
    let rails = usize::from(r.u8()?);
    if rails == 0 || rails > MAX_RAILS {
        return None;
    }
    let mut names = Vec::with_capacity(rails);
    for _ in 0..rails {
        let n = usize::from(r.u16()?);
        if n == 0 || n > MAX_NAME {
            return None;
        }
        names.push(r.take(n)?.to_vec());
    }
    r.0.is_empty().then_some((provider, names))
}

/// Version, virtual-address flag, rails (u8), keys (u64 LE each).
pub fn encode_region(virt_addr: bool, keys: &[u64]) -> Vec<u8> {
    let mut v = vec![
        REGION_VERSION,
        u8::from(virt_addr),
        keys.len().min(MAX_RAILS) as u8,
    ];
    for k in keys.iter().take(MAX_RAILS) {
        v.extend_from_slice(&k.to_le_bytes());
    }
    v
}

/// The addressing mode and per-rail keys.
pub fn decode_region(b: &[u8]) -> Option<(bool, Vec<u64>)> {
    let mut r = Reader(b);
    if r.u8()? != REGION_VERSION {
        return None;
    }
    let virt = match r.u8()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let n = usize::from(r.u8()?);
    if n == 0 || n > MAX_RAILS {
        return None;
    }
    let keys = (0..n).map(|_| r.u64()).collect::<Option<Vec<_>>>()?;
    r.0.is_empty().then_some((virt, keys))
}

/// Framing of notification messages: `N`, sender name length (u16 LE), name, payload. Agent
/// names are at most 256 bytes (nixl-core's `MAX_NAME`), so the length fits.
pub fn encode_notif(sender: &str, msg: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(3 + sender.len() + msg.len());
    v.push(b'N');
    v.extend_from_slice(&(sender.len() as u16).to_le_bytes());
    v.extend_from_slice(sender.as_bytes());
    v.extend_from_slice(msg);
    v
}

/// The sender and payload of a framed notification; `None` when malformed.
pub fn decode_notif(b: &[u8]) -> Option<(String, Vec<u8>)> {
    if b.len() < 3 || b[0] != b'N' {
        return None;
    }
    let n = usize::from(u16::from_le_bytes([b[1], b[2]]));
    let name = b.get(3..3 + n)?;
    Some((
        std::str::from_utf8(name).ok()?.to_owned(),
        b[3 + n..].to_vec(),
    ))
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
            Some(("agent-a".to_owned(), b"hello".to_vec()))
        );
        assert_eq!(decode_notif(b""), None);
        assert_eq!(decode_notif(b"X\x01\x00a"), None);
        assert_eq!(decode_notif(b"N\xff\x00a"), None);
        assert_eq!(
            decode_notif(&encode_notif("", b"")),
            Some((String::new(), Vec::new()))
        );
    }

    #[test]
    fn round_trips() {
        let names = vec![vec![1u8, 2, 3], vec![4u8; 16]];
        let c = encode_conn("tcp;ofi_rxm", &names);
        assert_eq!(decode_conn(&c), Some(("tcp;ofi_rxm".to_owned(), names)));
        let r = encode_region(true, &[7, 8]);
        assert_eq!(decode_region(&r), Some((true, vec![7, 8])));
    }

    #[test]
    fn refuses_malformed() {
        assert_eq!(decode_conn(b""), None);
        assert_eq!(decode_conn(b"LFB1\x03tcp\x00"), None);
        let mut c = encode_conn("tcp", &[vec![1]]);
        c.push(0);
        assert_eq!(decode_conn(&c), None);
        assert_eq!(decode_region(&[1, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(decode_region(&[1, 0, 0]), None);
        assert_eq!(decode_region(&[2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]), None);
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
