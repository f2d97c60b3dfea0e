//! Structural checks of a peer's UCX bytes before UCX parses them: worker addresses (given to
//! `ucp_ep_create`) and packed remote keys (given to `ucp_ep_rkey_unpack`).
//!
//! Neither call takes a length: UCX walks the bytes by the lengths and flags inside them, so a
//! mutated address or key makes it read past the buffer, index its tables out of range or
//! abort on an assertion (issue 15: 34 of 400 mutated pushes crashed a peer). This module
//! parses them exactly as UCX's own unpackers do (`ucp_address_unpack` in
//! `src/ucp/wireup/address.c`, `ucp_ep_rkey_unpack_internal` in `src/ucp/core/ucp_rkey.c`,
//! both address formats v1 and v2, UCX 1.13 to 1.23, non-unified mode, which the backend
//! configures) and refuses anything UCX would read past the end of, any index past UCX's
//! tables, and any transport entry whose addresses do not have the shape this UCX gives its
//! own addresses for that transport (learned from the agent's own worker address and remote
//! key, so the check follows whichever UCX version is loaded).
//!
//! What it cannot see: the meaning of well-formed values (an IP address, a port, a shared
//! memory segment id). A peer that crafts valid bytes naming someone else's resources is a
//! peer to keep out with authentication (`docs/security.md`).
// Public for the `fuzzing` feature's re-exports; crate-private without it.
#![cfg_attr(not(feature = "fuzzing"), allow(unreachable_pub))]

use std::collections::{HashMap, HashSet};

use nixl_core::backend::bytes::ByteReader;
use nixl_core::backend::DecodeError;

/// `UCP_MAX_MDS` (64 since UCX 1.13).
pub(crate) const MAX_MDS: u32 = 64;
/// `UCP_MAX_RESOURCES`.
pub(crate) const MAX_RESOURCES: usize = 128;
/// `UCP_NULL_RESOURCE`.
const NULL_RESOURCE: u8 = 0xff;
/// `UCS_SYS_DEVICE_ID_UNKNOWN`.
const SYS_DEVICE_UNKNOWN: u8 = 0xff;

const FLAG_LAST: u8 = 0x80;
const FLAG_HAS_EP_ADDR: u8 = 0x40;
const FLAG_NUM_PATHS: u8 = 0x40;
const FLAG_SYS_DEVICE: u8 = 0x20;
const IFACE_LEN_MASK: u8 = 0x3f;
const DEVICE_LEN_MASK: u8 = 0x1f;
const MD_EMPTY_DEV: u8 = 0x80;
const MD_LEGACY_BITS: u8 = 0x60;

const HEADER_DEBUG_INFO: u8 = 1;
const HEADER_WORKER_UUID: u8 = 2;
const HEADER_CLIENT_ID: u8 = 4;
const HEADER_AM_ONLY: u8 = 8;
const HEADER_KNOWN: u8 = HEADER_DEBUG_INFO | HEADER_WORKER_UUID | HEADER_CLIENT_ID | HEADER_AM_ONLY;

/// `sizeof(ucp_address_packed_iface_attr_t)`: three floats and the flags word.
const ATTR_V1: usize = 16;
/// `sizeof(ucp_address_v2_packed_iface_attr_t)`.
const ATTR_V2: usize = 8;

/// `UCP_ADDR_IFACE_FLAG_*` bits of a v2 attribute word (up to `ATOMIC64`).
const V2_KNOWN_FLAGS: u16 = (1 << 10) - 1;
/// `UCP_ADDR_IFACE_FLAG_AM_SYNC | UCP_ADDR_IFACE_FLAG_CB_ASYNC`: the peer offers active
/// messages on this interface.
const V2_AM_FLAGS: u16 = (1 << 1) | (1 << 2);
/// Smallest receive segment (in units of 64 bytes) of an interface that offers active
/// messages: UCX asserts that a remote key fits in one (`ucp_ep_config_init`: `rkey_size <=
/// am.max_bcopy`), and legitimate transports offer kilobytes.
const V2_MIN_AM_SEG: u16 = 16;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// UCX's crc16 of a transport name (the `tl_name_csum` of address entries).
pub(crate) fn tl_csum(name: &str) -> u16 {
    let mut c: u16 = 0xffff;
    for &b in name.as_bytes() {
        c ^= u16::from(b);
        for _ in 0..8 {
            c = (c >> 1) ^ if c & 1 != 0 { 0x8408 } else { 0 };
        }
    }
    !c
}

/// One transport entry of a worker address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The peer's memory-domain index.
    pub md_index: u8,
    /// `tl_name_csum`.
    pub csum: u16,
    /// The device address.
    pub dev_addr: Vec<u8>,
    /// The interface address.
    pub iface_addr: Vec<u8>,
}

/// A worker address, parsed as UCX parses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// 0 for v1, 1 for v2.
    pub version: u8,
    /// The peer's UCX minor release as UCX infers it (0 when not packed).
    pub dst_version: u32,
    /// Transport entries.
    pub entries: Vec<Entry>,
}

fn invalid(what: &'static str) -> DecodeError {
    DecodeError::Invalid { what }
}

/// `ucp_address_unpack_release_version`, relative to the loaded UCX's minor version.
fn release_version(packed: u8, loaded_minor: u32) -> u32 {
    const RANGE: i64 = 16;
    let delta = i64::from(loaded_minor % 16) - i64::from(packed);
    let base = i64::from(loaded_minor) / RANGE + i64::from(delta >= RANGE / 2)
        - i64::from(delta <= -RANGE / 2);
    (i64::from(packed) + base.max(0) * RANGE) as u32
}

/// A byte that v2 extends into the next byte when its masked value is all ones.
fn extended(r: &mut ByteReader<'_>, first: u8, mask: u8, v2: bool) -> Result<u8, DecodeError> {
    let v = first & mask;
    if v2 && v == mask {
        r.u8()
    } else {
        Ok(v)
    }
}

/// `ucp_address_v2_packed_iface_attr_t`: fp8 overhead, bandwidth, latency, prio, `u16`
/// segment size (x64 bytes), `u16` flags.
fn v2_attr(a: &[u8]) -> Result<(), DecodeError> {
    let seg = u16::from_le_bytes([a[4], a[5]]);
    let flags = u16::from_le_bytes([a[6], a[7]]);
    if flags & !V2_KNOWN_FLAGS != 0 {
        return Err(invalid("UCX interface flags"));
    }
    if flags & V2_AM_FLAGS != 0 && seg < V2_MIN_AM_SEG {
        return Err(invalid("UCX interface segment size"));
    }
    Ok(())
}

fn finite_attr(a: &[u8]) -> Result<(), DecodeError> {
    let f = |i: usize| f32::from_le_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    let (overhead, bandwidth, lat) = (f(0), f(4), f(8));
    if !(overhead.is_finite() && bandwidth.is_finite() && lat.is_finite())
        || bandwidth == 0.0
        || overhead < 0.0
        || lat < 0.0
    {
        return Err(invalid("UCX interface attributes"));
    }
    Ok(())
}

/// Parses a worker address as UCX `1.loaded_minor` would for `ucp_ep_create`; the whole
/// buffer must be consumed.
pub fn parse_address(bytes: &[u8], loaded_minor: u32) -> Result<Address, DecodeError> {
    let mut r = ByteReader::new(bytes);
    let (version, mut dst_version) = read_header(&mut r, loaded_minor)?;
    let v2 = version == 1;
    let mut entries: Vec<Entry> = Vec::new();
    if bytes.get(r.position()) == Some(&NULL_RESOURCE) {
        r.u8()?;
    } else {
        loop {
            let (last_dev, release) = read_device(&mut r, v2, loaded_minor, &mut entries)?;
            if let Some(v) = release {
                dst_version = v;
            }
            if last_dev {
                break;
            }
        }
    }
    r.finish()?;
    if !entries.is_empty() && !v2 && loaded_minor >= 19 && dst_version <= 18 {
        // ucp_address_adjust_unpacked_md_index.
        for e in &mut entries {
            e.md_index &= !MD_LEGACY_BITS;
        }
    }
    if entries.iter().any(|e| u32::from(e.md_index) >= MAX_MDS) {
        return Err(invalid("UCX memory-domain index"));
    }
    Ok(Address {
        version,
        dst_version,
        entries,
    })
}

/// The address header: version, flags, and the uuid, client id and debug string the flags
/// announce. Returns the version and the release version the header gives.
fn read_header(r: &mut ByteReader<'_>, loaded_minor: u32) -> Result<(u8, u32), DecodeError> {
    let h = r.u8()?;
    let version = h & 0x0f;
    let (flags, dst_version) = match version {
        0 => (h >> 4, 0),
        1 => (r.u8()?, release_version(h >> 4, loaded_minor)),
        _ => return Err(DecodeError::UnsupportedVersion(u16::from(version))),
    };
    let v2 = version == 1;
    if flags & !HEADER_KNOWN != 0 {
        return Err(invalid("UCX address flags"));
    }
    // UCX always reads the uuid of a v1 address (the default unpack flags ask for it).
    if !v2 || flags & HEADER_WORKER_UUID != 0 {
        r.take(8)?;
    }
    if flags & HEADER_CLIENT_ID != 0 {
        r.take(8)?;
    }
    if flags & HEADER_DEBUG_INFO != 0 {
        let n = r.u8()?;
        r.take(usize::from(n))?;
    }
    Ok((version, dst_version))
}

/// One device record and its transport entries (appended to `entries`). Returns whether it
/// was the last device, and the release version when it is v1's release-version pseudo
/// device.
fn read_device(
    r: &mut ByteReader<'_>,
    v2: bool,
    loaded_minor: u32,
    entries: &mut Vec<Entry>,
) -> Result<(bool, Option<u32>), DecodeError> {
    let mb = r.u8()?;
    let empty_dev = mb & MD_EMPTY_DEV != 0;
    let md_mask = if !v2 && loaded_minor < 19 { 0x1f } else { 0x7f };
    let md_index = extended(r, mb, md_mask, v2)?;
    let db = r.u8()?;
    let last_dev = db & FLAG_LAST != 0;
    let dev_len = extended(r, db, DEVICE_LEN_MASK, v2)?;
    if db & FLAG_NUM_PATHS != 0 && r.u8()? == 0 {
        return Err(invalid("UCX device path count"));
    }
    if db & FLAG_SYS_DEVICE != 0 {
        r.u8()?;
    }
    let dev_addr = r.take(usize::from(dev_len))?.to_vec();
    let release = (empty_dev && last_dev).then(|| release_version(md_index & 0x0f, loaded_minor));
    let mut last_tl = empty_dev;
    while !last_tl {
        if entries.len() >= MAX_RESOURCES {
            return Err(DecodeError::TooLarge {
                what: "UCX address entries",
                value: entries.len() as u64 + 1,
                limit: MAX_RESOURCES as u64,
            });
        }
        let (csum, iface_addr, last) = read_iface(r, v2)?;
        last_tl = last;
        entries.push(Entry {
            md_index,
            csum,
            dev_addr: dev_addr.clone(),
            iface_addr,
        });
    }
    Ok((last_dev, release))
}

/// One transport entry of a device: its name checksum, attributes (checked), interface
/// address, and whether it is the device's last.
fn read_iface(r: &mut ByteReader<'_>, v2: bool) -> Result<(u16, Vec<u8>, bool), DecodeError> {
    let csum = r.u16()?;
    let attr = r.take(if v2 { ATTR_V2 } else { ATTR_V1 })?;
    if v2 {
        v2_attr(attr)?;
    } else {
        finite_attr(attr)?;
    }
    let lb = r.u8()?;
    let iface_len = extended(r, lb, IFACE_LEN_MASK, v2)?;
    let iface_addr = r.take(usize::from(iface_len))?.to_vec();
    if lb & FLAG_HAS_EP_ADDR != 0 {
        // A worker address never carries endpoint addresses (UCX packs them only in wireup
        // messages).
        return Err(invalid("UCX endpoint address in a worker address"));
    }
    Ok((csum, iface_addr, lb & FLAG_LAST != 0))
}

/// A packed remote key, parsed as UCX parses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rkey {
    /// Memory domains (the peer's indices).
    pub md_map: u64,
    /// `ucs_memory_type_t`.
    pub mem_type: u8,
    /// `(md index, packed size)` in md order.
    pub sizes: Vec<(u8, u8)>,
}

/// Parses a packed rkey of a peer whose address announced `dst_version`; the whole buffer
/// must be what UCX reads (no byte short, none left over).
pub fn parse_rkey(bytes: &[u8], dst_version: u32) -> Result<Rkey, DecodeError> {
    let mut r = ByteReader::new(bytes);
    let md_map = r.u64()?;
    let mem_type = r.u8()?;
    let mut sizes = Vec::new();
    for md in 0..64u8 {
        if md_map & (1u64 << md) == 0 {
            continue;
        }
        if u32::from(md) >= MAX_MDS {
            return Err(invalid("UCX rkey memory domain"));
        }
        let n = r.u8()?;
        r.take(usize::from(n))?;
        sizes.push((md, n));
    }
    if md_map != 0 && (r.remaining() > 0 || dst_version > 19) {
        let sys_dev = r.u8()?;
        if sys_dev != SYS_DEVICE_UNKNOWN && dst_version > 19 {
            // Lane distances, (sys_dev, latency, bandwidth) each, up to a terminator: UCX
            // reads them with no end but the terminator.
            loop {
                let d = r.u8()?;
                if d == SYS_DEVICE_UNKNOWN {
                    break;
                }
                r.take(2)?;
            }
        }
    }
    r.finish()?;
    Ok(Rkey {
        md_map,
        mem_type,
        sizes,
    })
}

/// The shapes this UCX gives its own addresses and keys, per transport.
#[derive(Debug, Clone, Default)]
pub(crate) struct Shapes {
    /// csum -> device-address lengths and interface-address lengths seen in own addresses.
    tls: HashMap<u16, (HashSet<usize>, HashSet<usize>)>,
    /// csum -> packed rkey size of its memory domain (from own keys).
    rkey_sizes: HashMap<u16, u8>,
    /// csum -> where the transport's interface address names a process of this host (cma,
    /// posix in procfs mode), for the transports whose own address showed this process there.
    pid_fields: HashMap<u16, PidField>,
    /// This process's pid namespace id (`None`: unknown).
    pid_ns: Option<u64>,
    loaded_minor: u32,
}

/// Where a same-host transport's interface address names the process UCX copies from or maps
/// memory of: a process a peer's address names there is one UCX reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PidField {
    /// cma: a 32-bit pid; bit 31 says the pid namespace's id follows (UCX uses cma to the pid
    /// where that namespace is its own; without the bit, where its own is the default one).
    Cma,
    /// posix (shared memory through `/proc/<pid>/fd/<fd>`): a 64-bit segment id whose bit 63
    /// says procfs and bit 60 that the pid namespace's id follows (the same rule as cma), the
    /// pid in its low 30 bits and the descriptor in the next 30.
    PosixProcfs,
}

/// The default pid namespace's id (`PROC_PID_INIT_INO`): the one UCX assumes for an address
/// that names none.
const DEFAULT_PID_NS: u64 = 0xEFFF_FFFC;

/// This process's pid namespace id (the inode of `/proc/self/ns/pid`), as UCX reads it.
fn own_pid_ns() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

impl PidField {
    /// The pid an interface address names in the pid namespace `own_ns` (this process's;
    /// `None`: unknown, then any namespace counts as ours), or `None` where it names none there
    /// (UCX does not reach a pid of another namespace).
    fn pid(self, iface: &[u8], own_ns: Option<u64>) -> Option<u32> {
        let (pid, flagged, tail) = match self {
            PidField::Cma => {
                let w = u32::from_le_bytes(iface.get(..4)?.try_into().ok()?);
                (w & !(1 << 31), w & (1 << 31) != 0, &iface[4..])
            }
            PidField::PosixProcfs => {
                let w = u64::from_le_bytes(iface.get(..8)?.try_into().ok()?);
                if w & (1 << 63) == 0 {
                    return None;
                }
                (
                    (w & ((1 << 30) - 1)) as u32,
                    w & (1 << 60) != 0,
                    &iface[8..],
                )
            }
        };
        let Some(own) = own_ns else {
            return Some(pid);
        };
        // The namespace id is a u32 from UCX 1.22 on (`ucs_sys_ns_t`), an unsigned long before.
        let same = match (flagged, tail.len()) {
            (false, _) => own == DEFAULT_PID_NS,
            (true, 4) => u64::from(u32::from_le_bytes(tail.try_into().ok()?)) == own & 0xffff_ffff,
            (true, 8) => u64::from_le_bytes(tail.try_into().ok()?) == own,
            (true, _) => return None,
        };
        same.then_some(pid)
    }
}

impl Shapes {
    /// Learns from the agent's own worker addresses; fails when UCX's format is not the one
    /// this module knows (then nothing a peer sends can be checked).
    pub(crate) fn from_own(addresses: &[&[u8]], loaded_minor: u32) -> Result<Self, DecodeError> {
        let mut s = Shapes {
            loaded_minor,
            pid_ns: own_pid_ns(),
            ..Shapes::default()
        };
        let me = std::process::id();
        for a in addresses {
            for e in parse_address(a, loaded_minor)?.entries {
                let t = s.tls.entry(e.csum).or_default();
                t.0.insert(e.dev_addr.len());
                t.1.insert(e.iface_addr.len());
                // Only where this UCX's own address shows this process there: the check then
                // reads peers' addresses exactly as UCX packs its own.
                let field = if e.csum == tl_csum("cma") {
                    Some(PidField::Cma)
                } else if e.csum == tl_csum("posix") {
                    Some(PidField::PosixProcfs)
                } else {
                    None
                };
                if let Some(f) = field.filter(|f| f.pid(&e.iface_addr, s.pid_ns) == Some(me)) {
                    s.pid_fields.insert(e.csum, f);
                }
            }
        }
        Ok(s)
    }

    /// Learns the packed sizes of own memory domains from an own rkey and address.
    pub(crate) fn learn_rkey(&mut self, own_rkey: &[u8], own_address: &[u8]) {
        let (Ok(k), Ok(a)) = (
            parse_rkey(own_rkey, u32::MAX),
            parse_address(own_address, self.loaded_minor),
        ) else {
            return;
        };
        for (md, size) in k.sizes {
            for e in a.entries.iter().filter(|e| e.md_index == md) {
                self.rkey_sizes.insert(e.csum, size);
            }
        }
    }

    /// Checks a peer's worker address against this UCX's shapes.
    pub(crate) fn check_address(&self, bytes: &[u8]) -> Result<Address, String> {
        let a = parse_address(bytes, self.loaded_minor).map_err(|e| e.to_string())?;
        for e in &a.entries {
            let Some((dev, iface)) = self.tls.get(&e.csum) else {
                // A transport this UCX does not have: UCX never hands its bytes to a
                // transport.
                continue;
            };
            if e.csum == tl_csum("tcp") {
                check_tcp_device(&e.dev_addr)?;
            } else if !dev.contains(&e.dev_addr.len()) {
                return Err(format!(
                    "device address of {} bytes for transport {:#06x} (this UCX packs {:?})",
                    e.dev_addr.len(),
                    e.csum,
                    dev
                ));
            }
            if !iface.contains(&e.iface_addr.len()) {
                return Err(format!(
                    "interface address of {} bytes for transport {:#06x} (this UCX packs {:?})",
                    e.iface_addr.len(),
                    e.csum,
                    iface
                ));
            }
        }
        Ok(a)
    }

    /// The processes of this host a peer's (checked) address names for UCX to copy from or
    /// map memory of (cma, posix through procfs), with the transport's name.
    pub(crate) fn named_processes(&self, a: &Address) -> Vec<(&'static str, u32)> {
        a.entries
            .iter()
            .filter_map(|e| {
                let f = self.pid_fields.get(&e.csum)?;
                let name = match f {
                    PidField::Cma => "cma",
                    PidField::PosixProcfs => "posix",
                };
                Some((name, f.pid(&e.iface_addr, self.pid_ns)?))
            })
            .collect()
    }

    /// Checks a peer's packed rkey of memory type `mem_type` against its address.
    pub(crate) fn check_rkey(
        &self,
        bytes: &[u8],
        peer: &Address,
        mem_type: u8,
    ) -> Result<Rkey, String> {
        let k = parse_rkey(bytes, peer.dst_version).map_err(|e| e.to_string())?;
        if k.mem_type != mem_type {
            return Err(format!(
                "rkey of memory type {} for a region of memory type {mem_type}",
                k.mem_type
            ));
        }
        for &(md, size) in &k.sizes {
            for e in peer.entries.iter().filter(|e| e.md_index == md) {
                if let Some(&want) = self.rkey_sizes.get(&e.csum) {
                    if want != size {
                        return Err(format!(
                            "rkey part of {size} bytes for transport {:#06x} (this UCX packs {want})",
                            e.csum
                        ));
                    }
                }
            }
        }
        Ok(k)
    }
}

/// `uct_tcp_device_addr_t` then an IPv4/IPv6 address, or (loopback) a namespace id.
fn check_tcp_device(d: &[u8]) -> Result<(), String> {
    let (flags, family) = match d {
        [f, fam, ..] => (*f, *fam),
        _ => return Err("truncated tcp device address".into()),
    };
    let ok = match (flags, family) {
        (0, AF_INET) => d.len() == 2 + 4,
        (0, AF_INET6) => d.len() == 2 + 16,
        // uct_iface_local_addr_ns_t: a u64 id and the namespace, a u32 from UCX 1.22 on
        // (12 bytes), a u64 before (16 bytes: UCX 1.21, in NIXL 1.3's wheel).
        (1, AF_INET | AF_INET6) => d.len() == 2 + 12 || d.len() == 2 + 16,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tcp device address (flags {flags:#x}, family {family}, {} bytes)",
            d.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// UCX 1.22's worker address over tcp (eth0 and lo), address format v2.
    const TCP: &str = "6102312be180583fcc0f00060002c0000202cf190c015a0080008b0082e707008e01028f5ece5f03e1eba0f9ffffefcf190c015a0180008b0082d4e1";

    #[test]
    fn pids_are_read_as_ucx_packs_them() {
        let dflt = Some(DEFAULT_PID_NS);
        let ours = Some(0xf000_0abc_u64);
        let ns32 = |ns: u32| ns.to_le_bytes();
        let cma = |w: u32, tail: &[u8]| [&w.to_le_bytes()[..], tail].concat();
        // cma: the pid; bit 31 for a pid namespace, whose id follows: the pid is one of this
        // process's namespace where that id is this process's (it was taken for "another
        // namespace, not ours to check", so in a container every pid passed).
        assert_eq!(PidField::Cma.pid(&cma(0x3a18, &[]), dflt), Some(0x3a18));
        assert_eq!(PidField::Cma.pid(&cma(0x3a18, &[]), ours), None);
        let flagged = 0x3a18 | 1 << 31;
        assert_eq!(
            PidField::Cma.pid(&cma(flagged, &ns32(0xf000_0abc)), ours),
            Some(0x3a18)
        );
        assert_eq!(
            PidField::Cma.pid(&cma(flagged, &ns32(0xf000_0abd)), ours),
            None
        );
        // An unsigned-long namespace id (UCX before 1.22), and a flag naming the default one.
        let ns64 = 0xf000_0abc_u64.to_le_bytes();
        assert_eq!(PidField::Cma.pid(&cma(flagged, &ns64), ours), Some(0x3a18));
        let dns = (DEFAULT_PID_NS as u32).to_le_bytes();
        assert_eq!(PidField::Cma.pid(&cma(flagged, &dns), dflt), Some(0x3a18));
        // An unknown own namespace: every pid counts as this namespace's.
        assert_eq!(
            PidField::Cma.pid(&cma(flagged, &ns32(7)), None),
            Some(0x3a18)
        );
        // posix procfs: flags in bits 60-63, the descriptor above the pid's 30 bits.
        let seg = |flags: u64, fd: u64, pid: u64, tail: &[u8]| {
            [&(flags | fd << 30 | pid).to_le_bytes()[..], tail].concat()
        };
        let p = PidField::PosixProcfs;
        assert_eq!(p.pid(&seg(0xc << 60, 14, 0x42f2, &[]), dflt), Some(0x42f2));
        assert_eq!(p.pid(&seg(0xc << 60, 14, 0x42f2, &[]), ours), None);
        assert_eq!(p.pid(&seg(0x4 << 60, 14, 0x42f2, &[]), dflt), None);
        let nsd = ns32(0xf000_0abc);
        assert_eq!(p.pid(&seg(0x9 << 60, 14, 0x42f2, &nsd), ours), Some(0x42f2));
        assert_eq!(p.pid(&seg(0x9 << 60, 14, 0x42f2, &ns32(1)), ours), None);
        assert_eq!(p.pid(&[1, 2, 3], dflt), None);
    }

    /// In a pid namespace of its own (every container), this process's own address carries
    /// the namespace: the pid check must still learn where its pid is, and catch a peer's
    /// address naming it.
    #[test]
    fn a_pid_of_this_namespace_is_named_in_a_container_too() {
        let me = std::process::id();
        let ns: u32 = 0xf000_0abc;
        let own_cma = [&(me | 1 << 31).to_le_bytes()[..], &ns.to_le_bytes()].concat();
        let mut s = Shapes {
            pid_ns: Some(u64::from(ns)),
            ..Shapes::default()
        };
        let f = PidField::Cma;
        assert_eq!(f.pid(&own_cma, s.pid_ns), Some(me));
        s.pid_fields.insert(tl_csum("cma"), f);
        let peer = Address {
            version: 1,
            dst_version: 0,
            entries: vec![Entry {
                md_index: 0,
                csum: tl_csum("cma"),
                dev_addr: Vec::new(),
                iface_addr: own_cma,
            }],
        };
        assert_eq!(s.named_processes(&peer), vec![("cma", me)]);
    }

    #[test]
    fn tcp_device_addresses_of_ucx_1_21_to_1_23_are_taken_and_others_refused() {
        // Loopback (flag 1): the namespace is a u32 from UCX 1.22 on, a u64 in 1.21 (NIXL
        // 1.3's wheel; refused before, so no 1.3 peer over tcp loaded).
        for len in [12, 16] {
            let mut d = vec![1, AF_INET];
            d.resize(2 + len, 7);
            assert_eq!(check_tcp_device(&d), Ok(()), "{len}");
        }
        assert!(check_tcp_device(&[0, AF_INET, 10, 0, 0, 1]).is_ok());
        for bad in [
            vec![1, AF_INET, 0, 0],
            [vec![1, AF_INET], vec![0; 14]].concat(),
            [vec![1, AF_INET], vec![0; 20]].concat(),
            vec![0, AF_INET, 10, 0, 0],
            vec![2, AF_INET, 10, 0, 0, 1],
            vec![1],
        ] {
            assert!(check_tcp_device(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn csums_match_ucx() {
        assert_eq!(tl_csum("tcp"), 0x19cf);
    }

    #[test]
    fn parses_a_real_address_and_refuses_every_truncation() {
        let a = hex(TCP);
        let p = parse_address(&a, 22).unwrap();
        assert_eq!(p.version, 1);
        assert_eq!(p.dst_version, 22);
        assert_eq!(p.entries.len(), 2);
        assert!(p.entries.iter().all(|e| e.csum == 0x19cf));
        assert_eq!(p.entries[0].dev_addr, hex("0002c0000202"));
        for n in 0..a.len() {
            assert!(parse_address(&a[..n], 22).is_err(), "prefix {n}");
        }
        let mut long = a.clone();
        long.push(0);
        assert!(parse_address(&long, 22).is_err());
    }

    #[test]
    fn shapes_refuse_mutated_lengths_and_families() {
        let a = hex(TCP);
        let s = Shapes::from_own(&[&a], 22).unwrap();
        assert!(s.check_address(&a).is_ok());
        let mut m = a.clone();
        m[13] = 7; // family
        assert!(s.check_address(&m).is_err());
        let mut m = a.clone();
        m[0] = 0x62; // version 2
        assert!(s.check_address(&m).is_err());
        let mut m = a.clone();
        m[1] = 0x12; // unknown header flag
        assert!(s.check_address(&m).is_err());
        // The second entry's segment size (offsets 53-54) zeroed: UCX would abort
        // (`rkey_size <= am.max_bcopy`; found by the unpack_address fuzz target).
        let mut m = a.clone();
        m[53] ^= 0x80;
        assert!(s.check_address(&m).is_err());
        // An unknown interface flag.
        let mut m = a.clone();
        m[56] |= 0x80;
        assert!(s.check_address(&m).is_err());
    }

    #[test]
    fn rkeys_must_be_read_exactly() {
        assert!(parse_rkey(&hex("000000000000000000"), 22).is_ok());
        assert!(parse_rkey(&hex("01000000000000000000ff"), 22).is_ok());
        // md_map with sizes that run past the end (the all-0x41 key of issue 15).
        assert!(parse_rkey(&[0x41; 11], 22).is_err());
        // A sys_dev without its terminator.
        assert!(parse_rkey(&hex("0100000000000000000003"), 22).is_err());
        assert!(parse_rkey(&hex("0100000000000000000003010203ff"), 22).is_ok());
        assert!(parse_rkey(&hex("0100000000000000000003010203"), 22).is_err());
        // Trailing bytes.
        assert!(parse_rkey(&hex("000000000000000000ff"), 22).is_err());
    }
}
