//! NIXL's agent metadata blob (`getLocalMD`, `getLocalPartialMD`, `loadRemoteMD`).
//!
//! ```text
//! "Agent" name | "Conns" u64 n | n × { "t" backend | "c" connection info }
//! "" "MemSection" | "nixlSecElms" u64 m
//! m × { "bknd" backend | "nixlDList" "nixlSDList" | "t" i32 nixl_mem_t | "n" u64 k
//!       k × { "" u64 addr ‖ u64 len ‖ u64 devId ‖ public metadata } }
//! ```
//!
//! There is no version, generation or checksum. Decoding is stricter than NIXL's reader: every
//! count is bounded by [`crate::codec`]'s limits and by the bytes left, every `'|'` is checked,
//! trailing bytes and empty sections (which NIXL also refuses) are errors.

use super::serdes::{Reader, Writer};
use crate::codec::{MAX_BACKENDS, MAX_BLOB, MAX_NAME, MAX_REGIONS};
use crate::error::DecodeError;
use crate::mem::MemKind;

/// One backend's connection info in a blob (UCX: one worker's raw address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NixlConn {
    /// Backend type name (`"UCX"`).
    pub backend: String,
    /// Connection info, non-empty.
    pub info: Vec<u8>,
}

/// One registered region in a section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NixlDesc {
    /// Absolute address (host or device virtual address).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Device id (0 for DRAM, the GPU ordinal for VRAM).
    pub dev_id: u64,
    /// The backend's public metadata (UCX: a raw packed rkey).
    pub public: Vec<u8>,
}

/// The regions one backend registered for one memory kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NixlSection {
    /// Backend type name.
    pub backend: String,
    /// Memory kind (`nixl_mem_t`: DRAM 0, VRAM 1, BLK 2, OBJ 3, FILE 4; the same numbering as
    /// [`MemKind`]).
    pub kind: MemKind,
    /// Regions, at least one.
    pub descs: Vec<NixlDesc>,
}

/// A decoded NIXL metadata blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NixlMetadata {
    /// The agent's name.
    pub name: String,
    /// Connection info per backend (empty in a partial blob without it).
    pub conns: Vec<NixlConn>,
    /// Registered regions per (backend, kind).
    pub sections: Vec<NixlSection>,
}

/// The smallest encoding of one connection entry (`"t"`, `"c"`, one byte of each).
const MIN_CONN: usize = 2 * (1 + 8 + 1 + 1);
/// The smallest encoding of one section (tags and fixed fields, one descriptor).
const MIN_SECTION: usize = (4 + 8 + 1 + 1) + (9 + 8 + 10 + 1) + (1 + 8 + 4 + 1) + (1 + 8 + 8 + 1);
/// The smallest encoding of one descriptor (empty tag, 24-byte prefix, `'|'`).
const MIN_DESC: usize = 8 + 24 + 1;

impl NixlMetadata {
    /// Encodes exactly as NIXL 1.5 writes it.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.field(b"Agent", self.name.as_bytes())
            .u64(b"Conns", self.conns.len() as u64);
        for c in &self.conns {
            w.field(b"t", c.backend.as_bytes()).field(b"c", &c.info);
        }
        w.field(b"", b"MemSection")
            .u64(b"nixlSecElms", self.sections.len() as u64);
        let mut entry = Vec::new();
        for s in &self.sections {
            w.field(b"bknd", s.backend.as_bytes())
                .field(b"nixlDList", b"nixlSDList")
                .i32(b"t", i32::from(s.kind.tag()))
                .u64(b"n", s.descs.len() as u64);
            for d in &s.descs {
                entry.clear();
                entry.extend_from_slice(&d.addr.to_le_bytes());
                entry.extend_from_slice(&d.len.to_le_bytes());
                entry.extend_from_slice(&d.dev_id.to_le_bytes());
                entry.extend_from_slice(&d.public);
                w.field(b"", &entry);
            }
        }
        w.finish()
    }

    /// Decodes a blob, refusing anything malformed, oversized, empty or with trailing bytes:
    /// [`NixlMetadata::decode_bytes`] with the crate's [`Error::Decode`](crate::Error::Decode)
    /// (its agent is empty: the bytes are decoded outside any agent).
    pub fn decode(bytes: &[u8]) -> crate::Result<Self> {
        Self::decode_bytes(bytes).map_err(|e| e.outside_agent(crate::Op::LoadMetadata))
    }

    /// [`NixlMetadata::decode`] with the bare [`DecodeError`].
    pub fn decode_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() > crate::codec::MAX_METADATA {
            return Err(DecodeError::TooLarge {
                what: "NIXL metadata",
                value: bytes.len() as u64,
                limit: crate::codec::MAX_METADATA as u64,
            });
        }
        let mut r = Reader::new(bytes)?;
        let name = r.name(b"Agent", "agent name", MAX_NAME)?;
        let conns = read_conns(&mut r)?;
        if r.field(b"", "memory section marker", 16)? != b"MemSection" {
            return Err(DecodeError::Invalid {
                what: "memory section marker",
            });
        }
        let m = count(
            &mut r,
            b"nixlSecElms",
            "section count",
            MAX_BACKENDS * 8,
            MIN_SECTION,
        )?;
        let mut sections: Vec<NixlSection> = Vec::with_capacity(m);
        let mut total = 0usize;
        for _ in 0..m {
            let section = read_section(&mut r, &sections, &mut total)?;
            sections.push(section);
        }
        r.end()?;
        Ok(NixlMetadata {
            name,
            conns,
            sections,
        })
    }
}

/// The connection records: one non-empty connection info per backend name.
fn read_conns(r: &mut Reader<'_>) -> Result<Vec<NixlConn>, DecodeError> {
    let n = count(r, b"Conns", "connection count", MAX_BACKENDS, MIN_CONN)?;
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let backend = r.name(b"t", "backend name", MAX_NAME)?;
        let info = r.field(b"c", "connection info", MAX_BLOB)?;
        if info.is_empty() || conns.iter().any(|c: &NixlConn| c.backend == backend) {
            return Err(DecodeError::Invalid {
                what: "connection info",
            });
        }
        conns.push(NixlConn {
            backend,
            info: info.to_vec(),
        });
    }
    Ok(conns)
}

/// One memory section: a backend and memory type not seen in `earlier`, with at least one
/// descriptor; `total` counts the descriptors of every section against `MAX_REGIONS`.
fn read_section(
    r: &mut Reader<'_>,
    earlier: &[NixlSection],
    total: &mut usize,
) -> Result<NixlSection, DecodeError> {
    let backend = r.name(b"bknd", "section backend", MAX_NAME)?;
    if r.field(b"nixlDList", "descriptor list type", 16)? != b"nixlSDList" {
        return Err(DecodeError::Invalid {
            what: "descriptor list type",
        });
    }
    let t = r.i32(b"t", "memory type")?;
    let kind = u8::try_from(t)
        .ok()
        .and_then(MemKind::from_tag)
        .ok_or(DecodeError::Invalid {
            what: "memory type",
        })?;
    if earlier
        .iter()
        .any(|s| s.backend == backend && s.kind == kind)
    {
        return Err(DecodeError::Invalid {
            what: "duplicate section",
        });
    }
    let k = count(r, b"n", "descriptor count", MAX_REGIONS, MIN_DESC)?;
    if k == 0 {
        // NIXL refuses the whole blob with NIXL_ERR_NOT_FOUND for an empty section.
        return Err(DecodeError::Invalid {
            what: "empty section",
        });
    }
    *total += k;
    if *total > MAX_REGIONS {
        return Err(DecodeError::TooLarge {
            what: "regions",
            value: *total as u64,
            limit: MAX_REGIONS as u64,
        });
    }
    let descs = (0..k).map(|_| read_desc(r)).collect::<Result<_, _>>()?;
    Ok(NixlSection {
        backend,
        kind,
        descs,
    })
}

/// One descriptor: address, length and device id (a non-empty range that does not
/// overflow), then the backend's public bytes.
fn read_desc(r: &mut Reader<'_>) -> Result<NixlDesc, DecodeError> {
    let e = r.field(b"", "descriptor", 24 + MAX_BLOB)?;
    let (fixed, public) = e
        .split_at_checked(24)
        .ok_or(DecodeError::Invalid { what: "descriptor" })?;
    let mut f = crate::bytes::ByteReader::new(fixed);
    let (addr, len, dev_id) = (f.u64()?, f.u64()?, f.u64()?);
    if len == 0 || addr.checked_add(len).is_none() {
        return Err(DecodeError::Invalid {
            what: "region range",
        });
    }
    Ok(NixlDesc {
        addr,
        len,
        dev_id,
        public: public.to_vec(),
    })
}

/// A count field bounded by `limit` and by what the bytes left can hold.
fn count(
    r: &mut Reader<'_>,
    tag: &[u8],
    what: &'static str,
    limit: usize,
    min_size: usize,
) -> Result<usize, DecodeError> {
    let n = r.u64(tag, what)?;
    if n > limit as u64 {
        return Err(DecodeError::TooLarge {
            what,
            value: n,
            limit: limit as u64,
        });
    }
    let n = n as usize;
    let room = r.remaining() / min_size;
    if n > room {
        return Err(DecodeError::Truncated {
            offset: r.position(),
            needed: (n - room) * min_size,
        });
    }
    Ok(n)
}

/// Whether `bytes` look like a NIXL blob (rather than this crate's own metadata).
pub fn is_nixl_blob(bytes: &[u8]) -> bool {
    bytes.starts_with(super::serdes::MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The worked example of docs/nixl-wire.md §3 (agent `rs0`, one UCX connection, one DRAM
    /// region with a 2-byte rkey): 234 bytes.
    const GOLDEN: &str = "6e69786c5365724465737c4167656e7403000000000000007273307c436f6e6e\
        73080000000000000001000000000000007c7403000000000000005543587c63\
        0300000000000000aabbcc7c0a000000000000004d656d53656374696f6e7c6e\
        69786c536563456c6d73080000000000000001000000000000007c626b6e6403\
        000000000000005543587c6e69786c444c6973740a000000000000006e69786c\
        53444c6973747c740400000000000000000000007c6e08000000000000000100\
        0000000000007c1a0000000000000000000000007f0000000010000000000000\
        0000000000000011227c";

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn example() -> NixlMetadata {
        NixlMetadata {
            name: "rs0".into(),
            conns: vec![NixlConn {
                backend: "UCX".into(),
                info: vec![0xaa, 0xbb, 0xcc],
            }],
            sections: vec![NixlSection {
                backend: "UCX".into(),
                kind: MemKind::Dram,
                descs: vec![NixlDesc {
                    addr: 0x7f00_0000_0000,
                    len: 1 << 20,
                    dev_id: 0,
                    public: vec![0x11, 0x22],
                }],
            }],
        }
    }

    #[test]
    fn golden_example_matches_the_spec() {
        let g = hex(GOLDEN);
        assert_eq!(g.len(), 234);
        assert_eq!(example().encode(), g);
        assert_eq!(NixlMetadata::decode_bytes(&g), Ok(example()));
    }

    #[test]
    fn partial_and_connection_only_blobs() {
        let mut conn_only = example();
        conn_only.sections.clear();
        let b = conn_only.encode();
        assert_eq!(NixlMetadata::decode_bytes(&b), Ok(conn_only));
        let mut regions_only = example();
        regions_only.conns.clear();
        assert_eq!(
            NixlMetadata::decode_bytes(&regions_only.encode()),
            Ok(regions_only)
        );
    }

    #[test]
    fn hostile_blobs_are_refused() {
        let mut empty_section = example();
        empty_section.sections[0].descs.clear();
        assert_eq!(
            NixlMetadata::decode_bytes(&empty_section.encode()),
            Err(DecodeError::Invalid {
                what: "empty section"
            })
        );
        let mut empty_conn = example();
        empty_conn.conns[0].info.clear();
        assert!(NixlMetadata::decode_bytes(&empty_conn.encode()).is_err());
        let mut wrap = example();
        wrap.sections[0].descs[0].addr = u64::MAX;
        assert!(NixlMetadata::decode_bytes(&wrap.encode()).is_err());
        let mut dup = example();
        dup.sections.push(dup.sections[0].clone());
        assert!(NixlMetadata::decode_bytes(&dup.encode()).is_err());
        let mut trailing = example().encode();
        trailing.push(0);
        assert_eq!(
            NixlMetadata::decode_bytes(&trailing),
            Err(DecodeError::Trailing(1))
        );
        // A huge count must not allocate: the "Conns" value is at bytes 33..41.
        let mut huge = example().encode();
        huge[41..49].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            NixlMetadata::decode_bytes(&huge),
            Err(DecodeError::TooLarge { .. })
        ));
        huge[41..49].copy_from_slice(&60u64.to_le_bytes());
        assert!(matches!(
            NixlMetadata::decode_bytes(&huge),
            Err(DecodeError::Truncated { .. })
        ));
        assert!(!is_nixl_blob(b"NIXLRSMD"));
        assert!(is_nixl_blob(&example().encode()));
    }

    fn kind() -> impl Strategy<Value = MemKind> {
        (0u8..5).prop_map(|t| MemKind::from_tag(t).unwrap_or(MemKind::Dram))
    }

    fn metadata() -> impl Strategy<Value = NixlMetadata> {
        let conn = ("[A-Z]{1,6}", proptest::collection::vec(any::<u8>(), 1..48))
            .prop_map(|(backend, info)| NixlConn { backend, info });
        let desc = (
            0u64..(1 << 48),
            1u64..(1 << 32),
            0u64..8,
            proptest::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(|(addr, len, dev_id, public)| NixlDesc {
                addr,
                len,
                dev_id,
                public,
            });
        let section = ("[A-Z]{1,6}", kind(), proptest::collection::vec(desc, 1..5)).prop_map(
            |(backend, kind, descs)| NixlSection {
                backend,
                kind,
                descs,
            },
        );
        (
            "[a-z0-9-]{1,24}",
            proptest::collection::vec(conn, 0..3),
            proptest::collection::vec(section, 0..4),
        )
            .prop_map(|(name, mut conns, mut sections)| {
                let mut seen = std::collections::HashSet::new();
                conns.retain(|c| seen.insert(c.backend.clone()));
                let mut seen = std::collections::HashSet::new();
                sections.retain(|s| seen.insert((s.backend.clone(), s.kind)));
                NixlMetadata {
                    name,
                    conns,
                    sections,
                }
            })
    }

    proptest! {
        #[test]
        fn roundtrips(md in metadata()) {
            prop_assert_eq!(NixlMetadata::decode_bytes(&md.encode()), Ok(md));
        }

        #[test]
        fn mutations_are_refused_or_canonical(md in metadata(), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), x in 1u8..) {
            let bytes = md.encode();
            prop_assert!(NixlMetadata::decode_bytes(&bytes[..cut.index(bytes.len())]).is_err());
            let mut m = bytes.clone();
            let i = flip.index(m.len());
            m[i] ^= x;
            if let Ok(d) = NixlMetadata::decode_bytes(&m) {
                prop_assert_eq!(d.encode(), m);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut b = super::super::serdes::MAGIC.to_vec();
            b.extend_from_slice(&tail);
            if let Ok(md) = NixlMetadata::decode_bytes(&b) {
                prop_assert_eq!(md.encode(), b);
            }
        }
    }
}
