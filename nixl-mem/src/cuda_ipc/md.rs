//! What `CUDA_IPC` keeps per registered and per loaded region, and the bytes it publishes.

use std::sync::Arc;

use cudarc::driver::CudaContext;
use nixl_core::backend::DecodeError;

use crate::cuda;
use crate::sys::cu as sys;
use crate::sys::memory::HostRegistration;
use crate::wire::{Reader, Writer};
use crate::{IpcHandle, SharedHostHandle, SharedHostMapping};

const CONN_MAGIC: &[u8; 4] = b"NXCU";
/// The longest host id a peer may send.
const MAX_HOST_ID: usize = 256;
/// The longest abstract socket name (`sun_path`).
const MAX_SOCKET_NAME: usize = 108;

/// A `CUDA_IPC` backend's connection info: which host it runs on, its process id, and the
/// abstract socket name of its notification listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnInfo {
    pub host: Vec<u8>,
    pub pid: u32,
    pub server: Vec<u8>,
}

impl ConnInfo {
    pub(crate) fn encode(&self) -> Vec<u8> {
        Writer::new(CONN_MAGIC)
            .bytes(&self.host)
            .u64(u64::from(self.pid))
            .bytes(&self.server)
            .finish()
    }

    pub(crate) fn decode(info: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(info, CONN_MAGIC)?;
        let host = r.bytes("CUDA_IPC host id", MAX_HOST_ID)?.to_vec();
        let pid = r.u64()?;
        let server = r.bytes("CUDA_IPC socket name", MAX_SOCKET_NAME)?.to_vec();
        r.finish()?;
        let pid = u32::try_from(pid).map_err(|_| DecodeError::Invalid { what: "pid" })?;
        Ok(ConnInfo { host, pid, server })
    }
}

const TAG_VRAM: u8 = b'V';
const TAG_SHARED: u8 = b'S';
const TAG_PRIVATE: u8 = b'P';

/// A region's public metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Public {
    /// GPU memory, reachable through its IPC handle.
    Vram(IpcHandle),
    /// Shareable host memory (a memfd).
    Shared(SharedHostHandle),
    /// Host memory only its own process can reach.
    Private,
}

impl Public {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let (tag, body) = match self {
            Public::Vram(h) => (TAG_VRAM, h.to_bytes()),
            Public::Shared(h) => (TAG_SHARED, h.to_bytes()),
            Public::Private => (TAG_PRIVATE, Vec::new()),
        };
        let mut v = vec![tag];
        v.extend_from_slice(&body);
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        match b.split_first() {
            Some((&TAG_VRAM, rest)) => IpcHandle::from_bytes(rest).map(Public::Vram),
            Some((&TAG_SHARED, rest)) => SharedHostHandle::from_bytes(rest).map(Public::Shared),
            Some((&TAG_PRIVATE, [])) => Ok(Public::Private),
            Some((&TAG_PRIVATE, rest)) => Err(DecodeError::Trailing(rest.len())),
            Some(_) => Err(DecodeError::Invalid {
                what: "CUDA_IPC region tag",
            }),
            None => Err(DecodeError::Truncated {
                offset: 0,
                needed: 1,
            }),
        }
    }
}

/// Host pages this backend page-locked at registration; unlocked on drop.
pub(crate) struct HostPin {
    _reg: HostRegistration,
}

impl HostPin {
    /// Pins `[addr, addr+len)`. `Ok(None)` when the pages are already pinned by their owner
    /// (a `Pinned`, a `CudaHostBuffer`): nothing to undo.
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        addr: u64,
        len: u64,
    ) -> Result<Option<Self>, cuda::CudaError> {
        // Crate invariant: the agent keeps the region's memory alive while it is registered;
        // the pin is dropped (unregistered) when the registration's metadata is released,
        // before that.
        match HostRegistration::new(ctx, addr, len as usize) {
            Ok(reg) => Ok(Some(HostPin { _reg: reg })),
            Err(e) if e.code == sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED as u32 => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// A registered local region.
pub(crate) struct LocalMd {
    pub public: Public,
    /// Held for the registration's lifetime.
    pub _pin: Option<HostPin>,
}

/// Another process's shared host buffer, mapped and pinned here.
pub(crate) struct HostImport {
    // Field order: the pin is dropped (unregistered) before the mapping is unmapped.
    pub _pin: Option<HostPin>,
    pub map: SharedHostMapping,
}

/// How a transfer reaches a target region.
pub(crate) enum Target {
    /// The address is valid in this process as it is (loopback, or a peer in this process).
    Identity,
    /// Another process's GPU memory, mapped into each GPU's context that copies to it.
    Vram(Arc<super::gpu::RemoteVram>),
    /// Another process's shared host memory, mapped here.
    Host(Arc<HostImport>),
    /// Not reachable from this process; the reason.
    Unreachable(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_metadata_round_trips_and_refuses_garbage() {
        let h = IpcHandle::from_bytes(&{
            let mut v = b"NXCI".to_vec();
            v.extend_from_slice(&[1; 64]);
            for x in [0u64, 0x1000, 0x2000, 0x1000, 0x100] {
                v.extend_from_slice(&x.to_le_bytes());
            }
            v
        })
        .unwrap();
        let s = SharedHostHandle {
            pid: 1,
            fd: 3,
            token: 9,
            addr: 0x1000,
            len: 10,
        };
        for p in [Public::Vram(h), Public::Shared(s), Public::Private] {
            let b = p.encode();
            assert_eq!(Public::decode(&b).unwrap(), p);
            for n in 0..b.len() {
                assert!(Public::decode(&b[..n]).is_err());
            }
        }
        assert!(Public::decode(b"X").is_err());
        assert!(Public::decode(b"Pjunk").is_err());
    }
}
