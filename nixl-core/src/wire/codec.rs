//! The metadata codec: an agent's connection info and registered regions as bytes.
//!
//! Layout (little endian, [`crate::bytes`]): magic `b"NIXLRSMD"`, `u16` version, name, `u64`
//! generation, `u8` flags, with the process flag the agent's [`ProcessId`] (boot id, pid
//! namespace, pid, start time), backend count then `(name, conn_info)` pairs, region count then
//! `(backend index, kind, addr, len, dev_id, meta, public, label)` records (since version 6
//! integers and lengths as LEB128, each address as the zigzag step from the previous region's:
//! about 12 bytes plus the backend's key per region), and an xxh3-64 checksum
//! of everything before it. Every length and count is bounded before anything is allocated,
//! so hostile bytes cost at most their own size; a damaged byte anywhere is refused.

use crate::bytes::{ByteReader, ByteWriter};
use crate::error::DecodeError;
use crate::liveness::ProcessId;
use crate::mem::{MemKind, RegionDesc};

/// Magic prefix of encoded metadata.
pub const MAGIC: &[u8; 8] = b"NIXLRSMD";
/// The version this build writes: 4 added region labels, 5 the hello key, 6 compact region
/// records (LEB128 integers; each address as its distance from the previous region's).
pub const VERSION: u16 = 6;
/// The oldest version this build reads (3: no region labels).
pub const MIN_VERSION: u16 = 3;
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
const FLAG_PROCESS: u8 = 2;
const FLAG_INTEGRITY: u8 = 4;
const FLAG_HELLO_KEY: u8 = 8;
const FLAG_SUCCESSION: u8 = 16;

/// How an incarnation hands its name to the next one ([`AgentMetadata::succession`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Succession {
    /// The secret its predecessor left it (`None`: the first incarnation): its SHA-256 is the
    /// commitment the predecessor's metadata carried.
    pub reveal: Option<[u8; 32]>,
    /// The SHA-256 of the secret it left its successor.
    pub next: [u8; 32],
}

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
    /// The label its owner registered it with (`Agent::register_mem_labeled`); empty: none.
    pub label: String,
}

/// A region entry borrowed from where it lives ([`AgentMetadata::encode_with`]).
pub(crate) struct RegionRef<'a> {
    pub backend: usize,
    pub desc: &'a RegionDesc,
    pub public: &'a [u8],
    pub label: &'a str,
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
    /// The process the agent runs in (lets peers on the same host notice when it exits).
    pub process: Option<ProcessId>,
    /// Whether the agent verifies integrity frames (`AgentConfig::verify_integrity`): peers
    /// send it WRITEs with `XferOptions::integrity` only then.
    pub verifies_integrity: bool,
    /// The public key this incarnation signs its connection hellos with (Ed25519; version 5
    /// on): a receiver that loaded this metadata counts a hello under the name only when it
    /// verifies under this key (see `nixl_core::hello`).
    pub hello_key: Option<[u8; 32]>,
    /// With `AgentConfig::succession`: the secret this incarnation inherited and the
    /// commitment to its successor's (peers hold the name for the successor; see
    /// `docs/security.md`).
    pub succession: Option<Succession>,
    /// Backends.
    pub backends: Vec<BackendEntry>,
    /// Regions.
    pub regions: Vec<RegionEntry>,
}

impl AgentMetadata {
    /// Encodes to bytes (the body, then its checksum).
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(self.regions.iter().map(|r| RegionRef {
            backend: r.backend,
            desc: &r.desc,
            public: &r.public,
            label: &r.label,
        }))
    }

    /// [`AgentMetadata::encode`] with `regions` in place of [`AgentMetadata::regions`] (which
    /// is not read): an agent encodes its regions from where they live, without copying each
    /// into a [`RegionEntry`] first.
    pub(crate) fn encode_with<'a>(
        &self,
        regions: impl ExactSizeIterator<Item = RegionRef<'a>>,
    ) -> Vec<u8> {
        let mut w = ByteWriter::with_capacity(64 + regions.len() * 56);
        w.put(MAGIC).put_u16(VERSION);
        w.put_str(&self.name).put_u64(self.generation);
        let mut flags = if self.has_conn_info { FLAG_CONN } else { 0 };
        if self.process.is_some() {
            flags |= FLAG_PROCESS;
        }
        if self.verifies_integrity {
            flags |= FLAG_INTEGRITY;
        }
        if self.hello_key.is_some() {
            flags |= FLAG_HELLO_KEY;
        }
        if self.succession.is_some() {
            flags |= FLAG_SUCCESSION;
        }
        w.put_u8(flags);
        if let Some(p) = &self.process {
            write_process(&mut w, p);
        }
        if let Some(k) = &self.hello_key {
            w.put(k);
        }
        if let Some(s) = &self.succession {
            w.put_bool(s.reveal.is_some());
            if let Some(r) = &s.reveal {
                w.put(r);
            }
            w.put(&s.next);
        }
        w.put_len(self.backends.len());
        for b in &self.backends {
            w.put_str(&b.name).put_blob(&b.conn_info);
        }
        w.put_len(regions.len());
        let mut prev = 0u64;
        for r in regions {
            w.put_varint(r.backend as u64).put_u8(r.desc.kind.tag());
            w.put_varint(zigzag(r.desc.addr.wrapping_sub(prev)))
                .put_varint(r.desc.len)
                .put_varint(r.desc.dev_id);
            w.put_varint_blob(&r.desc.meta)
                .put_varint_blob(r.public)
                .put_varint_blob(r.label.as_bytes());
            prev = r.desc.addr;
        }
        let sum = checksum(w.as_slice());
        w.put_u64(sum);
        w.into_vec()
    }

    /// Decodes bytes, refusing anything malformed, oversized, damaged (checksum) or with
    /// trailing bytes: the crate's [`Error::Decode`](crate::Error::Decode) (its agent is empty:
    /// the bytes are decoded outside any agent); [`AgentMetadata::decode_bytes`] gives the
    /// bare [`DecodeError`].
    pub fn decode(bytes: &[u8]) -> crate::Result<Self> {
        Self::decode_bytes(bytes).map_err(|e| e.outside_agent(crate::Op::LoadMetadata))
    }

    /// [`AgentMetadata::decode`] with the bare [`DecodeError`].
    pub fn decode_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        let (body, version) = checked_body(bytes)?;
        let mut r = ByteReader::new(body);
        r.magic(MAGIC)?;
        r.u16()?;
        let name = r.str("agent name", MAX_NAME)?.to_owned();
        if name.is_empty() {
            return Err(DecodeError::Invalid { what: "agent name" });
        }
        let generation = r.u64()?;
        let flags = r.u8()?;
        let known = if version >= 5 {
            FLAG_CONN | FLAG_PROCESS | FLAG_INTEGRITY | FLAG_HELLO_KEY | FLAG_SUCCESSION
        } else {
            FLAG_CONN | FLAG_PROCESS | FLAG_INTEGRITY
        };
        if flags & !known != 0 {
            return Err(DecodeError::Invalid { what: "flags" });
        }
        let process = if flags & FLAG_PROCESS != 0 {
            Some(read_process(&mut r)?)
        } else {
            None
        };
        let hello_key = if flags & FLAG_HELLO_KEY != 0 {
            Some(r.array()?)
        } else {
            None
        };
        let succession = if flags & FLAG_SUCCESSION != 0 {
            let reveal = if r.bool("succession reveal flag")? {
                Some(r.array()?)
            } else {
                None
            };
            Some(Succession {
                reveal,
                next: r.array()?,
            })
        } else {
            None
        };
        let backends = read_backends(&mut r)?;
        let regions = read_regions(&mut r, backends.len(), version)?;
        r.finish()?;
        Ok(AgentMetadata {
            name,
            generation,
            has_conn_info: flags & FLAG_CONN != 0,
            process,
            verifies_integrity: flags & FLAG_INTEGRITY != 0,
            hello_key,
            succession,
            backends,
            regions,
        })
    }
}

/// Writes a [`ProcessId`] (boot id, pid namespace, pid, start time), as metadata and hellos
/// carry it.
pub(crate) fn write_process(w: &mut ByteWriter, p: &ProcessId) {
    w.put(&p.boot_id)
        .put_u64(p.pid_ns)
        .put_u32(p.pid)
        .put_u64(p.start_time);
}

/// Reads what [`write_process`] wrote.
pub(crate) fn read_process(r: &mut ByteReader<'_>) -> Result<ProcessId, DecodeError> {
    Ok(ProcessId {
        boot_id: r.array()?,
        pid_ns: r.u64()?,
        pid: r.u32()?,
        start_time: r.u64()?,
    })
}

/// The blob without its checksum, once its size, magic, version and checksum are right. The
/// checksum covers everything before it: a damaged byte anywhere (a name, a generation, an
/// address) is refused before any field is believed.
fn checked_body(bytes: &[u8]) -> Result<(&[u8], u16), DecodeError> {
    if bytes.len() > MAX_METADATA {
        return Err(DecodeError::TooLarge {
            what: "metadata",
            value: bytes.len() as u64,
            limit: MAX_METADATA as u64,
        });
    }
    let mut r = ByteReader::new(bytes);
    r.magic(MAGIC)?;
    let version = r.u16()?;
    if !(MIN_VERSION..=VERSION).contains(&version) {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let Some(body_len) = bytes.len().checked_sub(8) else {
        return Err(DecodeError::Truncated {
            offset: r.position(),
            needed: 8,
        });
    };
    let (body, sum) = bytes.split_at(body_len);
    if body.len() < r.position() {
        return Err(DecodeError::Truncated {
            offset: body.len(),
            needed: r.position() - body.len(),
        });
    }
    let mut sb = [0u8; 8];
    sb.copy_from_slice(sum);
    if checksum(body) != u64::from_le_bytes(sb) {
        return Err(DecodeError::Invalid { what: "checksum" });
    }
    Ok((body, version))
}

/// The backend records: unique, non-empty names and their connection info.
fn read_backends(r: &mut ByteReader<'_>) -> Result<Vec<BackendEntry>, DecodeError> {
    // A backend record is at least two empty length-prefixed strings.
    let nb = r.count("backend count", MAX_BACKENDS, 8)?;
    let mut backends = Vec::with_capacity(nb);
    for _ in 0..nb {
        let bname = r.str("backend name", MAX_NAME)?.to_owned();
        if bname.is_empty() || backends.iter().any(|b: &BackendEntry| b.name == bname) {
            return Err(DecodeError::Invalid {
                what: "backend name",
            });
        }
        let conn_info = r.blob("connection info", MAX_BLOB)?.to_vec();
        backends.push(BackendEntry {
            name: bname,
            conn_info,
        });
    }
    Ok(backends)
}

/// The region records of a `version` blob: `(backend, kind, addr, len, dev_id, meta, public,
/// label)`, with fixed-size integers and `u32` lengths before version 6 (no label before 4),
/// LEB128 integers and lengths since, each address then the zigzag step from the previous
/// region's. Each region must be non-empty and not overflow.
fn read_regions<'a>(
    r: &mut ByteReader<'a>,
    backends: usize,
    version: u16,
) -> Result<Vec<RegionEntry>, DecodeError> {
    let compact = version >= 6;
    // The smallest record: 8 one-byte fields compact, 4 + 1 + 24 + 4 + 4 bytes before.
    let nr = r.count("region count", MAX_REGIONS, if compact { 8 } else { 37 })?;
    let int = |r: &mut ByteReader<'a>, what| if compact { r.varint(what) } else { r.u64() };
    let blob = |r: &mut ByteReader<'a>,
                what: &'static str,
                limit: usize|
     -> Result<&'a [u8], DecodeError> {
        if compact {
            r.varint_blob(what, limit)
        } else {
            r.blob(what, limit)
        }
    };
    let mut regions = Vec::with_capacity(nr);
    let mut prev = 0u64;
    for _ in 0..nr {
        let backend = if compact {
            r.varint("region backend index")?
        } else {
            u64::from(r.u32()?)
        };
        let backend = usize::try_from(backend).unwrap_or(usize::MAX);
        if backend >= backends {
            return Err(DecodeError::Invalid {
                what: "region backend index",
            });
        }
        let kind = MemKind::from_tag(r.u8()?).ok_or(DecodeError::Invalid {
            what: "memory kind",
        })?;
        let addr = int(r, "region address")?;
        let addr = if compact {
            prev.wrapping_add(unzigzag(addr))
        } else {
            addr
        };
        let len = int(r, "region length")?;
        let dev_id = int(r, "region device")?;
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(DecodeError::Invalid {
                what: "region range",
            });
        }
        let meta = blob(r, "region meta", MAX_BLOB)?.to_vec();
        let public = blob(r, "region public metadata", MAX_BLOB)?.to_vec();
        let label = if version >= 4 {
            std::str::from_utf8(blob(r, "region label", MAX_NAME)?)
                .map_err(|_| DecodeError::Invalid {
                    what: "region label",
                })?
                .to_owned()
        } else {
            String::new()
        };
        prev = addr;
        regions.push(RegionEntry {
            label,
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
    Ok(regions)
}

/// An address step as an unsigned integer, small for small steps either way.
fn zigzag(step: u64) -> u64 {
    (step << 1) ^ ((step as i64 >> 63) as u64)
}

fn unzigzag(v: u64) -> u64 {
    (v >> 1) ^ (v & 1).wrapping_neg()
}

/// The blob's checksum: xxh3-64 of the body. It catches damage, not forgery (anyone can
/// recompute it); authenticated metadata is the side channel's and etcd's job.
fn checksum(body: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(body)
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
        let process = proptest::option::of(
            (any::<[u8; 16]>(), any::<u64>(), any::<u32>(), any::<u64>()).prop_map(
                |(boot_id, pid_ns, pid, start_time)| ProcessId {
                    boot_id,
                    pid_ns,
                    pid,
                    start_time,
                },
            ),
        );
        (
            ("[a-z0-9-]{1,32}", any::<u64>(), any::<bool>(), process),
            backends,
        )
            .prop_flat_map(|((name, generation, conn, process), bes)| {
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
                    "[a-z0-9-]{0,12}",
                )
                    .prop_map(
                        |(backend, kind, addr, len, dev_id, meta, public, label)| RegionEntry {
                            label,
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
                    process,
                    verifies_integrity: conn,
                    hello_key: conn.then_some([generation as u8; 32]),
                    succession: conn.then_some(Succession {
                        reveal: (generation % 2 == 0).then_some([3; 32]),
                        next: [generation as u8 ^ 0x55; 32],
                    }),
                    backends: backends.clone(),
                    regions,
                })
            })
    }

    proptest! {
        #[test]
        fn roundtrips(md in metadata()) {
            let bytes = md.encode();
            prop_assert_eq!(AgentMetadata::decode_bytes(&bytes), Ok(md));
        }

        /// Arbitrary bytes never panic and never decode into something that re-encodes
        /// differently.
        #[test]
        fn arbitrary_bytes_are_refused_or_canonical(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(md) = AgentMetadata::decode_bytes(&bytes) {
                prop_assert_eq!(md.encode(), bytes);
            }
        }

        /// Every truncation and every single-byte corruption of valid metadata is either
        /// refused or decodes to a canonical value; none panics.
        #[test]
        fn mutations_are_handled(md in metadata(), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), x in 1u8..) {
            let bytes = md.encode();
            let n = cut.index(bytes.len());
            prop_assert!(AgentMetadata::decode_bytes(&bytes[..n]).is_err());
            let mut m = bytes.clone();
            let i = flip.index(m.len());
            m[i] ^= x;
            if let Ok(d) = AgentMetadata::decode_bytes(&m) {
                prop_assert_eq!(d.encode(), m);
            }
        }
    }

    /// Encodes a body as `encode` does (checksum appended), for hand-made hostile bodies.
    fn sealed(body: Vec<u8>) -> Vec<u8> {
        let sum = checksum(&body);
        let mut b = body;
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    #[test]
    fn hostile_counts_do_not_allocate() {
        let mut w = ByteWriter::new();
        w.put(MAGIC)
            .put_u16(VERSION)
            .put_str("x")
            .put_u64(0)
            .put_u8(0);
        w.put_u32(u32::MAX);
        assert!(matches!(
            AgentMetadata::decode_bytes(&sealed(w.clone().into_vec())),
            Err(DecodeError::TooLarge { .. })
        ));
        let mut b2 = w.into_vec();
        let n = b2.len();
        b2[n - 4..].copy_from_slice(&60u32.to_le_bytes());
        assert!(matches!(
            AgentMetadata::decode_bytes(&sealed(b2)),
            Err(DecodeError::Truncated { .. })
        ));
    }

    /// Every single-byte change of real metadata is refused (the checksum covers names,
    /// generation, addresses and lengths, not only backend parts).
    #[test]
    fn every_single_byte_corruption_is_refused() {
        let md = AgentMetadata {
            name: "decode-0".into(),
            generation: 0x1234_5678_9abc,
            has_conn_info: true,
            process: ProcessId::current(),
            verifies_integrity: false,
            hello_key: Some([0x5a; 32]),
            succession: Some(Succession {
                reveal: Some([0x11; 32]),
                next: [0x22; 32],
            }),
            backends: vec![BackendEntry {
                name: "UCX".into(),
                conn_info: vec![7; 40],
            }],
            regions: (0..4)
                .map(|i| RegionEntry {
                    label: format!("pool-{i}"),
                    backend: 0,
                    desc: RegionDesc {
                        kind: MemKind::Dram,
                        addr: 0x7f00_0000_0000 + i * 4096,
                        len: 4096,
                        dev_id: 0,
                        meta: vec![],
                    },
                    public: vec![9; 24],
                })
                .collect(),
        };
        let bytes = md.encode();
        for i in 0..bytes.len() {
            for x in [1u8, 0x80, 0xff] {
                let mut m = bytes.clone();
                m[i] ^= x;
                assert!(
                    AgentMetadata::decode_bytes(&m).is_err(),
                    "byte {i} ^ {x:#x} loaded"
                );
            }
        }
    }

    #[test]
    fn version_and_magic_are_checked() {
        let md = AgentMetadata {
            name: "a".into(),
            generation: 1,
            has_conn_info: true,
            process: None,
            verifies_integrity: false,
            hello_key: None,
            succession: None,
            backends: vec![],
            regions: vec![],
        };
        let mut b = md.encode();
        b[8] = 9;
        assert_eq!(
            AgentMetadata::decode_bytes(&b),
            Err(DecodeError::UnsupportedVersion(9))
        );
        b[8] = VERSION as u8;
        b[0] = b'X';
        assert_eq!(AgentMetadata::decode_bytes(&b), Err(DecodeError::BadMagic));
        let mut t = md.encode();
        t.push(0);
        assert_eq!(
            AgentMetadata::decode_bytes(&t),
            Err(DecodeError::Invalid { what: "checksum" })
        );
    }

    /// The start of an older version's metadata: magic, `version`, agent `name` (generation
    /// 7, with connection info) and one INPROC backend.
    fn older_header(version: u16, name: &str) -> ByteWriter {
        let mut w = ByteWriter::new();
        w.put(MAGIC).put_u16(version);
        w.put_str(name).put_u64(7).put_u8(FLAG_CONN);
        w.put_len(1).put_str("INPROC").put_blob(b"conn");
        w
    }

    /// Version 5 metadata (fixed-size region records) still decodes.
    #[test]
    fn version_5_fixed_records_still_decode() {
        let mut w = older_header(5, "v5-peer");
        w.put_len(2);
        for (addr, label) in [(0x20_0000u64, "kv"), (0x1000, "")] {
            w.put_len(0).put_u8(MemKind::Dram.tag());
            w.put_u64(addr).put_u64(4096).put_u64(3);
            w.put_blob(b"").put_blob(b"rkey").put_str(label);
        }
        let sum = checksum(w.as_slice());
        w.put_u64(sum);
        let md = AgentMetadata::decode_bytes(&w.into_vec()).unwrap();
        let got: Vec<(u64, u64, &str)> = md
            .regions
            .iter()
            .map(|r| (r.desc.addr, r.desc.dev_id, r.label.as_str()))
            .collect();
        assert_eq!(got, [(0x20_0000, 3, "kv"), (0x1000, 3, "")]);
    }

    /// Version 6's records: a KV pool's regions cost about 12 bytes each beside their keys
    /// (NIXL 1.5.1 sends 44 bytes a region for 1,280 UCX regions of 1 MiB with their keys;
    /// `benches/reference/nixl_registration.py`), addresses in any order round-trip, and
    /// LEB128's overlong and oversized forms are refused.
    #[test]
    fn compact_regions_are_small_and_exact() {
        let key = [7u8; 28];
        let mut addrs: Vec<u64> = (0..1280u64)
            .map(|i| 0x7f00_0000_0000 + i * 0x10_1000)
            .collect();
        addrs.swap(3, 900);
        addrs.push(u64::MAX - (2 << 20));
        addrs.push(0);
        let md = AgentMetadata {
            name: "pool".into(),
            generation: 1,
            has_conn_info: true,
            process: None,
            verifies_integrity: false,
            hello_key: None,
            succession: None,
            backends: vec![BackendEntry {
                name: "UCX".into(),
                conn_info: vec![1; 64],
            }],
            regions: addrs
                .iter()
                .map(|&addr| RegionEntry {
                    backend: 0,
                    desc: RegionDesc {
                        kind: MemKind::Dram,
                        addr,
                        len: 1 << 20,
                        dev_id: 0,
                        meta: Vec::new(),
                    },
                    public: key.to_vec(),
                    label: String::new(),
                })
                .collect(),
        };
        let bytes = md.encode();
        assert_eq!(AgentMetadata::decode_bytes(&bytes).unwrap(), md);
        let per_region = (bytes.len() - 64 - 100) / md.regions.len();
        assert!(
            per_region <= key.len() + 13,
            "{per_region} bytes a region with a {}-byte key",
            key.len()
        );
        for bad in [&[0x80u8, 0x00][..], &[0xff; 10][..], &[0x80; 11][..]] {
            assert!(ByteReader::new(bad).varint("v").is_err(), "{bad:?}");
        }
        let mut w = ByteWriter::new();
        w.put_varint(u64::MAX).put_varint(0).put_varint(300);
        let b = w.into_vec();
        let mut r = ByteReader::new(&b);
        assert_eq!(
            (
                r.varint("a").unwrap(),
                r.varint("b").unwrap(),
                r.varint("c").unwrap()
            ),
            (u64::MAX, 0, 300)
        );
    }

    /// Version 3 metadata (before region labels) still decodes, its regions unlabeled.
    #[test]
    fn version_3_without_labels_still_decodes() {
        let mut w = older_header(3, "old-peer");
        w.put_len(1).put_len(0).put_u8(MemKind::Dram.tag());
        w.put_u64(0x1000).put_u64(4096).put_u64(0);
        w.put_blob(b"").put_blob(b"rkey");
        let sum = checksum(w.as_slice());
        w.put_u64(sum);
        let md = AgentMetadata::decode_bytes(&w.into_vec()).unwrap();
        assert_eq!(md.name, "old-peer");
        assert_eq!(md.regions.len(), 1);
        assert_eq!(md.regions[0].label, "");
        assert_eq!(md.regions[0].public, b"rkey");
        // Version 2 and the one after this build's are refused.
        for v in [2u16, VERSION + 1] {
            let mut w = ByteWriter::new();
            w.put(MAGIC).put_u16(v).put_u64(0);
            assert!(matches!(
                AgentMetadata::decode_bytes(&w.into_vec()),
                Err(DecodeError::UnsupportedVersion(x)) if x == v
            ));
        }
    }
}
