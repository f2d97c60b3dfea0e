//! Speaking NIXL's UCX wire ([`nixl_core::nixl_wire::NixlWire`]): the connection info is the
//! raw address of worker 0 (the worker a NIXL peer's notifications arrive on), a region's
//! public metadata is its raw packed rkey, and notifications are active message 0 with a
//! `nixlSerDes` payload and no header.
//!
//! Peer bytes are checked before UCX parses them, as far as UCX's formats allow:
//! - a worker address must be 2..=64 KiB with address version v1 or v2 (UCX aborts the
//!   process on any other version), and name the UCX minor version loaded here (v2: the
//!   header; v1: the release trailer UCX >= 1.16 appends); another minor version is
//!   [`UcxError::VersionMismatch`], naming both. The rest of an address is parsed by UCX
//!   without a length, as NIXL does: load metadata only from peers you trust.
//! - a packed rkey is walked (`u64 md_map ‖ u8 memory type ‖ per md {u8 size ‖ rkey} ‖
//!   [u8 sys_dev ‖ distances]`), its memory type must match the region's kind, and it is
//!   handed to UCX with trailing terminators, so UCX's unbounded read stops inside the copy.

use std::sync::Arc;

use nixl_core::backend::BackendMd;
use nixl_core::nixl_wire::NixlWire;
use nixl_core::{Error, MemKind, Op, RegionDesc, Result};

use crate::backend::UcxBackend;
use crate::endpoint::Peer;
use crate::error::{UcxError, UCX};
use crate::memory::RemoteMd;
use crate::sys;
use crate::worker::AmCtx;

/// The longest worker address accepted.
const MAX_ADDRESS: usize = 1 << 16;
/// `UCS_SYS_DEVICE_ID_UNKNOWN`: ends the distance list of a packed rkey.
const SYS_DEV_UNKNOWN: u8 = 0xff;
/// Bytes of one packed distance (sys_dev, latency, bandwidth).
const DISTANCE: usize = 3;
/// Terminators appended to a peer's rkey before UCX reads it.
const RKEY_PAD: usize = 16;

/// UCX's 4-bit release number of a worker address, as UCX >= 1.16 packs it; `Err` for bytes
/// UCX would abort on or cannot be a worker address.
pub(crate) fn address_release(addr: &[u8]) -> std::result::Result<Option<u8>, String> {
    if addr.len() < 2 || addr.len() > MAX_ADDRESS {
        return Err(format!("a worker address of {} bytes", addr.len()));
    }
    match addr[0] & 0x0f {
        // v2: the release number is the header's high nibble.
        1 => Ok(Some(addr[0] >> 4)),
        // v1: UCX >= 1.16 ends the device list with an empty pseudo-device whose md index
        // holds the release number (flag 0x80 = empty device), then a last-device byte 0x80.
        0 => {
            let n = addr.len();
            Ok((addr[n - 1] == 0x80 && addr[n - 2] & 0x80 != 0 && n >= 3)
                .then_some(addr[n - 2] & 0x0f))
        }
        v => Err(format!("UCX address version {v} (only v1 and v2 exist)")),
    }
}

/// The full minor version a 4-bit release number stands for: the one closest to ours, as UCX
/// itself unpacks it.
pub(crate) fn peer_minor(release: u8, local_minor: u32) -> u32 {
    let ours = local_minor % 16;
    let base = local_minor - ours;
    let cand = [base.saturating_sub(16), base, base + 16].map(|b| b + u32::from(release));
    cand.into_iter()
        .min_by_key(|c| c.abs_diff(local_minor))
        .unwrap_or(local_minor)
}

/// Walks a packed rkey; returns its memory type. `Err` says what is wrong.
pub(crate) fn check_rkey(packed: &[u8]) -> std::result::Result<u8, String> {
    let (map, rest) = packed
        .split_first_chunk::<8>()
        .ok_or("shorter than its md map")?;
    let md_map = u64::from_le_bytes(*map);
    let (&mem_type, mut rest) = rest.split_first().ok_or("no memory type")?;
    for _ in 0..md_map.count_ones() {
        let (&size, r) = rest.split_first().ok_or("truncated md entry")?;
        rest = r.get(usize::from(size)..).ok_or("truncated md rkey")?;
    }
    if md_map == 0 {
        return if rest.is_empty() {
            Ok(mem_type)
        } else {
            Err("bytes after an empty md map".into())
        };
    }
    let (&sys_dev, mut rest) = rest.split_first().ok_or("no system device byte")?;
    if sys_dev != SYS_DEV_UNKNOWN {
        while let Some((&d, _)) = rest.split_first() {
            if d == SYS_DEV_UNKNOWN {
                break;
            }
            rest = rest.get(DISTANCE..).ok_or("truncated distance")?;
        }
    }
    Ok(mem_type)
}

fn kind_accepts(kind: MemKind, mem_type: u8) -> Option<sys::ucs_memory_type_t> {
    let t = sys::ucs_memory_type_t::from(mem_type);
    match kind {
        MemKind::Dram => (t == sys::UCS_MEMORY_TYPE_HOST).then_some(t),
        MemKind::Vram => [
            sys::UCS_MEMORY_TYPE_CUDA,
            sys::UCS_MEMORY_TYPE_CUDA_MANAGED,
            sys::UCS_MEMORY_TYPE_ROCM,
            sys::UCS_MEMORY_TYPE_ROCM_MANAGED,
        ]
        .contains(&t)
        .then_some(t),
        _ => None,
    }
}

/// Handles NIXL's notification active message (`crate::session::AM_NIXL`, routed by the backend's table).
pub(crate) fn on_nixl_notif(ctx: &AmCtx, m: &sys::AmMsg<'_>) {
    if ctx.peers.is_authenticated() {
        // NIXL's notifications name their sender in the payload, which nothing vouches for:
        // an agent that requires a credential takes none (it loads no NIXL peer either).
        tracing::warn!(agent = %ctx.agent, "dropping a NIXL-format notification (this agent requires authenticated peers)");
        return;
    }
    if m.rndv || m.header_len != 0 {
        tracing::warn!(agent = %ctx.agent, "dropping a NIXL notification that is not eager or has a header");
        return;
    }
    let Some(payload) = m.data.filter(|d| !d.is_empty()) else {
        tracing::warn!(agent = %ctx.agent, "dropping an empty NIXL notification");
        return;
    };
    match nixl_core::nixl_wire::notif::decode_notif_bytes(payload) {
        Ok((sender, msg)) => {
            // A full queue counts the drop itself.
            ctx.notifs.push(&sender, msg);
        }
        Err(e) => {
            tracing::warn!(agent = %ctx.agent, error = %e, "dropping a malformed NIXL notification");
        }
    }
}

impl UcxBackend {
    fn version_check(&self, remote: &str, addr: &[u8]) -> Result<()> {
        let bad = |why: String| {
            Error::invalid(
                &self.agent,
                Op::LoadMetadata,
                format!("UCX connection info from {remote}: {why}"),
            )
        };
        let local = self.ucx.version;
        let peer = match address_release(addr).map_err(bad)? {
            Some(r) => peer_minor(r, local.1),
            None => {
                return Err(mismatch(
                    &self.agent,
                    self.ucx.version_string(),
                    "older than 1.16 (its address carries no version)".into(),
                ))
            }
        };
        if peer != local.1 {
            return Err(mismatch(
                &self.agent,
                self.ucx.version_string(),
                format!("{}.{peer}", local.0),
            ));
        }
        Ok(())
    }
}

fn mismatch(agent: &str, local: String, peer: String) -> Error {
    let source = UcxError::VersionMismatch { local, peer };
    Error::Backend {
        agent: agent.to_owned(),
        backend: UCX.to_owned(),
        op: Op::LoadMetadata,
        message: source.to_string(),
        source: Some(Arc::new(source)),
    }
}

impl NixlWire for UcxBackend {
    fn nixl_connection_info(&self) -> Result<Vec<u8>> {
        let w = self
            .workers
            .first()
            .ok_or_else(|| Error::invalid(&self.agent, Op::LocalMetadata, "no UCX worker"))?;
        Ok(w.address().to_vec())
    }

    fn nixl_public_metadata(&self, md: &BackendMd) -> Result<Vec<u8>> {
        Ok(self.reg(md, Op::LocalMetadata)?.packed.clone())
    }

    fn nixl_connect(&self, remote: &str, info: &[u8]) -> Result<()> {
        self.version_check(remote, info)?;
        // Parsed as UCX parses it and checked against our own addresses' shapes before
        // ucp_ep_create (as for nixl-rs peers).
        let checked = self.shapes.read().check_address(info).map_err(|e| {
            Error::invalid(
                &self.agent,
                Op::LoadMetadata,
                format!("refused the UCX worker address of NIXL agent {remote}: {e}"),
            )
        })?;
        let mut peer = Peer::connect(&self.agent, remote, &self.workers, &[info.to_vec()], false)?;
        peer.nixl = true;
        peer.address = Some(checked);
        if let Some(old) = self.peers.lock().insert(remote.to_owned(), Arc::new(peer)) {
            tracing::debug!(agent = %self.agent, remote, "replaced UCX endpoints of {}", old.name);
        }
        Ok(())
    }

    fn nixl_load_remote(
        &self,
        remote: &str,
        region: &RegionDesc,
        public: &[u8],
    ) -> Result<BackendMd> {
        let peer = self.peers.lock().get(remote).cloned().ok_or_else(|| {
            Error::disconnected(
                &self.agent,
                remote,
                Op::LoadMetadata,
                "not connected over UCX",
            )
        })?;
        let bad = |why: String| {
            Error::invalid(
                &self.agent,
                Op::LoadMetadata,
                format!("UCX rkey from {remote}: {why}"),
            )
        };
        let t = check_rkey(public).map_err(bad)?;
        let mt = kind_accepts(region.kind, t).ok_or_else(|| {
            Error::mismatch(
                &self.agent,
                Op::LoadMetadata,
                format!(
                    "a {} region of {remote} carries UCX memory type {t}",
                    region.kind
                ),
            )
        })?;
        let mut padded = Vec::with_capacity(public.len() + RKEY_PAD);
        padded.extend_from_slice(public);
        padded.resize(public.len() + RKEY_PAD, SYS_DEV_UNKNOWN);
        Ok(Arc::new(RemoteMd::unpack_raw(
            &self.agent,
            &peer,
            mt,
            &padded,
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_from_real_addresses() {
        // Header of a UCX 1.22 v2 address; tail of a UCX 1.23 v1 address (NIXL 1.5.1 wheel).
        assert_eq!(address_release(&[0x61, 0x02, 0, 0]), Ok(Some(6)));
        assert_eq!(address_release(&[0x20, 0x30, 0x87, 0x80]), Ok(Some(7)));
        assert_eq!(address_release(&[0x20, 0x30, 0x07, 0x00]), Ok(None));
        assert!(
            address_release(&[0x22, 0]).is_err(),
            "version 2 would abort UCX"
        );
        assert!(address_release(&[1]).is_err());
        assert!(address_release(&vec![1; MAX_ADDRESS + 1]).is_err());
        assert_eq!(peer_minor(6, 22), 22);
        assert_eq!(peer_minor(7, 22), 23);
        assert_eq!(peer_minor(3, 19), 19);
        assert_eq!(peer_minor(15, 17), 15);
        assert_eq!(peer_minor(0, 15), 16);
    }

    #[test]
    fn rkeys_are_walked() {
        // NIXL 1.5.1 (UCX 1.23), DRAM: md_map 1, host, one empty md rkey, sys_dev unknown.
        let nixl = [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff];
        assert_eq!(check_rkey(&nixl), Ok(0));
        assert!(check_rkey(&nixl[..10]).is_err());
        assert!(check_rkey(&nixl[..8]).is_err());
        let two = [
            3, 0, 0, 0, 0, 0, 0, 0, 1, 2, 9, 9, 1, 7, 0x05, 4, 5, 6, 0xff,
        ];
        assert_eq!(check_rkey(&two), Ok(1));
        assert!(check_rkey(&two[..16]).is_err(), "truncated distance");
        assert!(check_rkey(&[3, 0, 0, 0, 0, 0, 0, 0, 1, 200, 1]).is_err());
        assert_eq!(check_rkey(&[0; 9]), Ok(0));
        assert!(check_rkey(&[0; 10]).is_err());
        assert_eq!(
            kind_accepts(MemKind::Dram, 0),
            Some(sys::UCS_MEMORY_TYPE_HOST)
        );
        assert_eq!(kind_accepts(MemKind::Dram, 1), None);
        assert_eq!(
            kind_accepts(MemKind::Vram, 1),
            Some(sys::UCS_MEMORY_TYPE_CUDA)
        );
        assert_eq!(kind_accepts(MemKind::File, 0), None);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        for v in crate::wire::noise(0x9e37_79b9_7f4a_7c15, 300) {
            let _ = check_rkey(&v);
            let _ = address_release(&v);
        }
    }
}
