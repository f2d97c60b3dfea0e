//! Registered memory (`ucp_mem_map`) and peers' remote keys (`ucp_ep_rkey_unpack`).

use std::sync::Arc;

use nixl_core::{Error, MemKind, Op, RegionDesc, Result};

use crate::context::Context;
use crate::endpoint::Peer;
use crate::error::{check, status_error};
use crate::sys;
use crate::validate::Shapes;
use crate::vram_context::{ensure_vram_context, NoContext};
use crate::wire;

/// Zero bytes after a remote key handed to UCX.
const RKEY_PAD: usize = 256;
/// The UCX memory type of a kind, if UCX can move it.
pub(crate) fn mem_type(kind: MemKind) -> Option<sys::ucs_memory_type_t> {
    match kind {
        MemKind::Dram => Some(sys::UCS_MEMORY_TYPE_HOST),
        MemKind::Vram => Some(sys::UCS_MEMORY_TYPE_CUDA),
        _ => None,
    }
}

/// A region mapped with `ucp_mem_map`; unmapped on drop.
pub(crate) struct MemReg {
    ctx: Arc<Context>,
    pub memh: sys::MemH,
    /// Set once [`MemReg::unmap`] unmapped it (Drop then does nothing).
    unmapped: bool,
    pub mem_type: sys::ucs_memory_type_t,
    /// The framed packed rkey (the region's public metadata).
    pub public: Vec<u8>,
    /// The raw packed rkey (what NIXL publishes).
    pub packed: Vec<u8>,
}

impl MemReg {
    /// Maps a region.
    pub(crate) fn map(ctx: &Arc<Context>, agent: &str, region: &RegionDesc) -> Result<Self> {
        let ucx = &ctx.ucx;
        let mt = mem_type(region.kind)
            .filter(|t| ctx.memory_types & (1u64 << *t) != 0)
            .ok_or_else(|| {
                Error::not_supported(
                    agent,
                    Op::RegisterMem,
                    format!(
                        "UCX {} cannot register {} memory",
                        ucx.version_string(),
                        region.kind
                    ),
                )
            })?;
        if region.len == 0 || region.addr == 0 || region.end().is_none() {
            return Err(Error::invalid(
                agent,
                Op::RegisterMem,
                "empty, null or overflowing region",
            ));
        }
        if region.kind == MemKind::Vram {
            ensure_vram_context(region.dev_id).map_err(|e| match e {
                NoContext::Unavailable(e) => Error::Unavailable {
                    what: format!("a CUDA context for GPU {}", region.dev_id),
                    hint: format!("UCX registers VRAM in the GPU's primary CUDA context: {e}"),
                },
                NoContext::SecondGpu { first, this } => Error::not_supported(
                    agent,
                    Op::RegisterMem,
                    format!(
                        "UCX in this process runs in GPU {first}'s CUDA context; VRAM of GPU {this} \
                         would be copied from it: use the CUDA_IPC backend for it (a hint), or a \
                         process per GPU"
                    ),
                ),
            })?;
        }
        // The region's memory is valid for its length for as long as the registration lives
        // (MemoryRegion's contract, upheld by the agent).
        let memh = ctx
            .raw()
            .mem_map(region.addr, region.len, mt)
            .map_err(|st| status_error(ucx, agent, None, Op::RegisterMem, "ucp_mem_map", st))?;
        let packed = match ctx.raw().rkey_pack(memh) {
            Ok(p) => p,
            Err(st) => {
                ctx.raw().mem_unmap(memh);
                return Err(status_error(
                    ucx,
                    agent,
                    None,
                    Op::RegisterMem,
                    "ucp_rkey_pack",
                    st,
                ));
            }
        };
        let public = wire::encode_rkey(mt as u8, &packed);
        Ok(MemReg {
            ctx: ctx.clone(),
            memh,
            unmapped: false,
            mem_type: mt,
            public,
            packed,
        })
    }

    /// Unmaps explicitly, reporting UCX's status.
    pub(crate) fn unmap(mut self, agent: &str) -> Result<()> {
        let st = self.ctx.raw().mem_unmap(self.memh);
        self.unmapped = true;
        check(&self.ctx.ucx, agent, Op::DeregisterMem, "ucp_mem_unmap", st)
    }
}

impl Drop for MemReg {
    fn drop(&mut self) {
        if self.unmapped {
            return;
        }
        let st = self.ctx.raw().mem_unmap(self.memh);
        if st != sys::UCS_OK {
            tracing::warn!(status = %self.ctx.ucx.status_string(st), "ucp_mem_unmap failed");
        }
    }
}

/// A peer's region: one unpacked rkey per local worker's endpoint.
pub(crate) struct RemoteMd {
    pub peer: Arc<Peer>,
    pub rkeys: Vec<sys::Rkey>,
    pub mem_type: sys::ucs_memory_type_t,
}

impl RemoteMd {
    /// Unpacks framed region metadata on every endpoint of `peer`, after checking the
    /// packed key's structure against the peer's address (`crate::validate`).
    pub(crate) fn unpack(
        agent: &str,
        peer: &Arc<Peer>,
        region: &RegionDesc,
        public: &[u8],
        shapes: &Shapes,
    ) -> Result<Self> {
        let (t, packed) = wire::decode_rkey(public).map_err(|e| {
            Error::invalid(
                agent,
                Op::LoadMetadata,
                format!("malformed UCX region metadata from {}: {e}", peer.name),
            )
        })?;
        let address = peer.address.as_ref().ok_or_else(|| {
            Error::invalid(
                agent,
                Op::LoadMetadata,
                "UCX peer without a checked address",
            )
        })?;
        shapes.check_rkey(packed, address, t).map_err(|e| {
            Error::invalid(
                agent,
                Op::LoadMetadata,
                format!("refused a UCX remote key from {}: {e}", peer.name),
            )
        })?;
        let mt = t as sys::ucs_memory_type_t;
        if mem_type(region.kind) != Some(mt) {
            return Err(Error::mismatch(
                agent,
                Op::LoadMetadata,
                format!("region of kind {} carries UCX memory type {t}", region.kind),
            ));
        }
        Self::unpack_raw(agent, peer, mt, packed)
    }

    /// Unpacks a raw packed rkey on every endpoint of `peer` (zero-padded here). The caller
    /// vouches for the bytes (`validate::Shapes::check_rkey`, or `crate::nixl::check_rkey`).
    pub(crate) fn unpack_raw(
        agent: &str,
        peer: &Arc<Peer>,
        mt: sys::ucs_memory_type_t,
        packed: &[u8],
    ) -> Result<Self> {
        // Zero padding past the key: if UCX ever read further than this module's model of
        // it, it reads zeros, not someone else's memory.
        let mut padded = Vec::with_capacity(packed.len() + RKEY_PAD);
        padded.extend_from_slice(packed);
        padded.resize(packed.len() + RKEY_PAD, 0);
        let mut md = RemoteMd {
            peer: peer.clone(),
            rkeys: Vec::with_capacity(peer.eps.len()),
            mem_type: mt,
        };
        for pe in &peer.eps {
            let g = pe.worker.lock();
            let Some(ep) = pe.raw(&g) else {
                return Err(Error::disconnected(
                    agent,
                    &peer.name,
                    Op::LoadMetadata,
                    "endpoint closed",
                ));
            };
            // The packed bytes were checked by validate::Shapes::check_rkey (UCX reads
            // exactly them) or, from NIXL peers, structurally, and are followed by zero
            // padding.
            let r = g.h_ref().rkey_unpack(ep, &padded);
            drop(g);
            let rkey = r.map_err(|st| {
                status_error(
                    &pe.worker.ctx.ucx,
                    agent,
                    Some(&peer.name),
                    Op::LoadMetadata,
                    "ucp_ep_rkey_unpack",
                    st,
                )
            })?;
            md.rkeys.push(rkey);
        }
        Ok(md)
    }
}

impl Drop for RemoteMd {
    fn drop(&mut self) {
        for (pe, rkey) in self.peer.eps.iter().zip(self.rkeys.drain(..)) {
            // Destroyed once, under the worker lock; the endpoint is released only after (the
            // Peer outlives self).
            pe.worker.lock().h_ref().rkey_destroy(rkey);
        }
    }
}
