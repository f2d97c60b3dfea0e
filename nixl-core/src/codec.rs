//! The metadata codec: an agent's connection info and registered regions as bytes.
//!
//! Layout (little endian): magic `b"NIXLRSMD"`, `u16` version, name, `u64` generation, `u8`
//! flags, backend count then `(name, conn_info)` pairs, region count then
//! `(backend index, kind, addr, len, dev_id, meta, public)` records. Every length and count is
//! bounded before anything is allocated, so hostile bytes cost at most their own size.

use crate::error::DecodeError;
use crate::mem::{MemKind, RegionDesc};

/// Magic prefix of encoded metadata.
pub const MAGIC: &[u8; 8] = b"NIXLRSMD";
/// The version this build writes (and the only one it reads).
pub const VERSION: u16 = 1;
/// Longest agent or backend name.
pub const MAX_NAME: usize = 256;
/// Most backends in one metadata blob.
pub const MAX_BACKENDS: usize = 64;
/// Largest connection info or public region metadata.
pub const MAX_BLOB: usize = 1 << 20;
/// Most regions in one metadata blob.
pub const MAX_REGIONS: usize = 1 << 22;
/// Largest encoded metadata accepted.
pub const MAX_METADATA: usize = 256 << 20;

const FLAG_CONN: u8 = 1;

/// A backend's entry in metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendEntry {
    /// The backend's type name.
    pub name: String,
    /// Its connection info (empty when the blob carries no connection info).
    pub conn_info: Vec<u8>,
}

/// A region's entry in metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionEntry {
    /// Index into [`AgentMetadata::backends`].
    pub backend: usize,
    /// The region.
    pub desc: RegionDesc,
    /// The backend's public bytes for it (an rkey).
    pub public: Vec<u8>,
}

/// An agent's metadata, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentMetadata {
    /// The agent's name.
    pub name: String,
    /// The agent's generation (changes when the process restarts).
    pub generation: u64,
    /// Whether the backends' connection info is included.
    pub has_conn_info: bool,
    /// Backends.
    pub backends: Vec<BackendEntry>,
    /// Regions.
    pub regions: Vec<RegionEntry>,
}

impl AgentMetadata {
    /// Encodes to bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.regions.len() * 48);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        put_bytes(&mut out, self.name.as_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.push(if self.has_conn_info { FLAG_CONN } else { 0 });
        put_u32(&mut out, self.backends.len());
        for b in &self.backends {
            put_bytes(&mut out, b.name.as_bytes());
            put_bytes(&mut out, &b.conn_info);
        }
        put_u32(&mut out, self.regions.len());
        for r in &self.regions {
            put_u32(&mut out, r.backend);
            out.push(r.desc.kind.tag());
            out.extend_from_slice(&r.desc.addr.to_le_bytes());
            out.extend_from_slice(&r.desc.len.to_le_bytes());
            out.extend_from_slice(&r.desc.dev_id.to_le_bytes());
            put_bytes(&mut out, &r.desc.meta);
            put_bytes(&mut out, &r.public);
        }
        out
    }

    /// Decodes bytes, refusing anything malformed, oversized or with trailing bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() > MAX_METADATA {
            return Err(DecodeError::TooLarge {
                what: "metadata",
                value: bytes.len() as u64,
                limit: MAX_METADATA as u64,
            });
        }
        let mut r = Reader { buf: bytes, pos: 0 };
        if r.take(MAGIC.len())? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u16()?;
        if version != VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let name = r.string("agent name")?;
        if name.is_empty() {
            return Err(DecodeError::Invalid { what: "agent name" });
        }
        let generation = r.u64()?;
        let flags = r.u8()?;
        if flags & !FLAG_CONN != 0 {
            return Err(DecodeError::Invalid { what: "flags" });
        }
        let nb = r.count("backend count", MAX_BACKENDS, 8)?;
        let mut backends = Vec::with_capacity(nb);
        for _ in 0..nb {
            let bname = r.string("backend name")?;
            if bname.is_empty() || backends.iter().any(|b: &BackendEntry| b.name == bname) {
                return Err(DecodeError::Invalid {
                    what: "backend name",
                });
            }
            let conn_info = r.blob("connection info")?.to_vec();
            backends.push(BackendEntry {
                name: bname,
                conn_info,
            });
        }
        // A region record is at least 4 + 1 + 24 + 4 + 4 = 37 bytes.
        let nr = r.count("region count", MAX_REGIONS, 37)?;
        let mut regions = Vec::with_capacity(nr);
        for _ in 0..nr {
            let backend = r.u32()? as usize;
            if backend >= backends.len() {
                return Err(DecodeError::Invalid {
                    what: "region backend index",
                });
            }
            let kind = MemKind::from_tag(r.u8()?).ok_or(DecodeError::Invalid {
                what: "memory kind",
            })?;
            let addr = r.u64()?;
            let len = r.u64()?;
            let dev_id = r.u64()?;
            if len == 0 || addr.checked_add(len).is_none() {
                return Err(DecodeError::Invalid {
                    what: "region range",
                });
            }
            let meta = r.blob("region meta")?.to_vec();
            let public = r.blob("region public metadata")?.to_vec();
            regions.push(RegionEntry {
                backend,
                desc: RegionDesc {
                    kind,
                    addr,
                    len,
                    dev_id,
                    meta,
                },
                public,
            });
        }
        if r.pos != bytes.len() {
            return Err(DecodeError::Trailing(bytes.len() - r.pos));
        }
        Ok(AgentMetadata {
            name,
            generation,
            has_conn_info: flags & FLAG_CONN != 0,
            backends,
            regions,
        })
    }
}

fn put_u32(out: &mut Vec<u8>, v: usize) {
    // Counts are bounded far below u32::MAX by the agent; saturate rather than wrap.
    out.extend_from_slice(&u32::try_from(v).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len());
    out.extend_from_slice(b);
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let rest = self.buf.len() - self.pos;
        if n > rest {
            return Err(DecodeError::Truncated {
                offset: self.pos,
                needed: n - rest,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count bounded by `limit` and by what the remaining bytes could hold at `min_size`
    /// bytes per element.
    fn count(
        &mut self,
        what: &'static str,
        limit: usize,
        min_size: usize,
    ) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        let room = (self.buf.len() - self.pos) / min_size.max(1);
        if n > limit {
            return Err(DecodeError::TooLarge {
                what,
                value: n as u64,
                limit: limit as u64,
            });
        }
        if n > room {
            return Err(DecodeError::Truncated {
                offset: self.pos,
                needed: (n - room) * min_size,
            });
        }
        Ok(n)
    }

    fn blob(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        if n > MAX_BLOB {
            return Err(DecodeError::TooLarge {
                what,
                value: n as u64,
                limit: MAX_BLOB as u64,
            });
        }
        self.take(n)
    }

    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let n = self.u32()? as usize;
        if n > MAX_NAME {
            return Err(DecodeError::TooLarge {
                what,
                value: n as u64,
                limit: MAX_NAME as u64,
            });
        }
        let b = self.take(n)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| DecodeError::Invalid { what })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = MemKind> {
        (0u8..5).prop_map(|t| MemKind::from_tag(t).unwrap_or(MemKind::Dram))
    }

    fn metadata() -> impl Strategy<Value = AgentMetadata> {
        let backends = proptest::collection::vec(
            ("[A-Z]{1,8}", proptest::collection::vec(any::<u8>(), 0..64)),
            1..4,
        );
        (("[a-z0-9-]{1,32}", any::<u64>(), any::<bool>()), backends).prop_flat_map(
            |((name, generation, conn), bes)| {
                let mut seen = std::collections::HashSet::new();
                let backends: Vec<BackendEntry> = bes
                    .into_iter()
                    .filter(|(n, _)| seen.insert(n.clone()))
                    .map(|(name, conn_info)| BackendEntry { name, conn_info })
                    .collect();
                let nb = backends.len();
                let region = (
                    0..nb,
                    kind(),
                    0u64..(1 << 40),
                    1u64..(1 << 30),
                    any::<u64>(),
                    proptest::collection::vec(any::<u8>(), 0..16),
                    proptest::collection::vec(any::<u8>(), 0..64),
                )
                    .prop_map(
                        |(backend, kind, addr, len, dev_id, meta, public)| RegionEntry {
                            backend,
                            desc: RegionDesc {
                                kind,
                                addr,
                                len,
                                dev_id,
                                meta,
                            },
                            public,
                        },
                    );
                proptest::collection::vec(region, 0..16).prop_map(move |regions| AgentMetadata {
                    name: name.clone(),
                    generation,
                    has_conn_info: conn,
                    backends: backends.clone(),
                    regions,
                })
            },
        )
    }

    proptest! {
        #[test]
        fn roundtrips(md in metadata()) {
            let bytes = md.encode();
            prop_assert_eq!(AgentMetadata::decode(&bytes), Ok(md));
        }

        /// Arbitrary bytes never panic and never decode into something that re-encodes
        /// differently.
        #[test]
        fn arbitrary_bytes_are_refused_or_canonical(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(md) = AgentMetadata::decode(&bytes) {
                prop_assert_eq!(md.encode(), bytes);
            }
        }

        /// Every truncation and every single-byte corruption of valid metadata is either
        /// refused or decodes to a canonical value; none panics.
        #[test]
        fn mutations_are_handled(md in metadata(), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), x in 1u8..) {
            let bytes = md.encode();
            let n = cut.index(bytes.len());
            prop_assert!(AgentMetadata::decode(&bytes[..n]).is_err());
            let mut m = bytes.clone();
            let i = flip.index(m.len());
            m[i] ^= x;
            if let Ok(d) = AgentMetadata::decode(&m) {
                prop_assert_eq!(d.encode(), m);
            }
        }
    }

    #[test]
    fn hostile_counts_do_not_allocate() {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        put_bytes(&mut b, b"x");
        b.extend_from_slice(&0u64.to_le_bytes());
        b.push(0);
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            AgentMetadata::decode(&b),
            Err(DecodeError::TooLarge { .. })
        ));
        let mut b2 = b.clone();
        let n = b2.len();
        b2[n - 4..].copy_from_slice(&60u32.to_le_bytes());
        assert!(matches!(
            AgentMetadata::decode(&b2),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn version_and_magic_are_checked() {
        let md = AgentMetadata {
            name: "a".into(),
            generation: 1,
            has_conn_info: true,
            backends: vec![],
            regions: vec![],
        };
        let mut b = md.encode();
        b[8] = 9;
        assert_eq!(
            AgentMetadata::decode(&b),
            Err(DecodeError::UnsupportedVersion(9))
        );
        b[0] = b'X';
        assert_eq!(AgentMetadata::decode(&b), Err(DecodeError::BadMagic));
        let mut t = md.encode();
        t.push(0);
        assert_eq!(AgentMetadata::decode(&t), Err(DecodeError::Trailing(1)));
    }
}
