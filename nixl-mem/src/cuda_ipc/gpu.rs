//! Every GPU the backend copies on: the right one for each request, and what each needs.
//!
//! A request's copies run on the GPU of its local memory (VRAM), else on the GPU of the remote
//! memory (DRAM to a peer's VRAM), else on [`CudaIpcParams::device`](super::CudaIpcParams):
//! a process whose pool is on GPU 1 copies from GPU 1's context, where the copy kernel reaches
//! its own memory and, through peer access, the peer's. One backend serves memory on every
//! GPU of the process: each GPU gets its context, copy kernel, descriptor staging and stream
//! pool when it first copies, and a peer's GPU memory is mapped into each GPU's context that
//! copies to it.
//!
//! A copy that could only run slower than the hardware allows (copy engines for a request
//! the copy kernel would take, because two GPUs have no peer access or the kernel does not
//! load) is refused with `NotSupported` naming the GPUs and the reason, unless the caller
//! allowed it by name ([`CudaIpcParams::allow_copy_engines`](super::CudaIpcParams)).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaContext;
use nixl_core::{Error, MemKind, Op, Result};

use super::staging::{LanePool, StagingPool};
use super::with_agent;
use super::CudaIpcBackend;
use crate::cuda;
use crate::cuda::kernel::CopyKernel;
use crate::{IpcHandle, IpcMapping};

/// What the backend keeps per GPU it copies on.
pub(crate) struct Gpu {
    pub ordinal: usize,
    pub ctx: Arc<CudaContext>,
    /// The copy kernel, loaded on first use; the reason where it cannot be.
    kernel: OnceLock<std::result::Result<Arc<CopyKernel>, String>>,
    /// The copy kernel's descriptor upload buffers, reused across requests.
    pub staging: Arc<StagingPool>,
    /// Streams and events of dropped requests, for the next ones.
    pub lanes: Arc<LanePool>,
    /// Per peer GPU: whether this GPU's kernels may access its memory (asked and enabled
    /// once).
    peers: Mutex<HashMap<usize, bool>>,
}

impl Gpu {
    /// GPU `ordinal`'s context and empty pools.
    pub(super) fn open(ordinal: usize) -> crate::MemResult<Arc<Gpu>> {
        let ctx = cuda::context(ordinal)?;
        Ok(Arc::new(Gpu {
            ordinal,
            staging: Arc::new(StagingPool::new(ctx.clone())),
            lanes: Arc::new(LanePool::new(ctx.clone())),
            ctx,
            kernel: OnceLock::new(),
            peers: Mutex::new(HashMap::new()),
        }))
    }

    /// This GPU's copy kernel, JIT-compiled on first use.
    pub(super) fn copy_kernel(
        &self,
        agent: &str,
        shape: crate::cuda::kernel::KernelShape,
    ) -> std::result::Result<Arc<CopyKernel>, String> {
        self.kernel
            .get_or_init(|| {
                CopyKernel::load(self.ctx.clone(), self.ordinal, shape)
                    .map(Arc::new)
                    .inspect_err(|e| {
                        tracing::warn!(agent, gpu = self.ordinal, error = %e, "the CUDA_IPC copy kernel did not load");
                    })
            })
            .clone()
    }
}

/// Another process's GPU memory: its handle, mapped into each GPU's context that copies to it
/// (the first mapping, into the backend's default GPU, when the peer was loaded).
pub(crate) struct RemoteVram {
    pub handle: IpcHandle,
    pub first: Arc<IpcMapping>,
    on: Mutex<HashMap<usize, Arc<IpcMapping>>>,
}

impl RemoteVram {
    pub(super) fn new(handle: IpcHandle, first: Arc<IpcMapping>) -> Self {
        RemoteVram {
            handle,
            first,
            on: Mutex::new(HashMap::new()),
        }
    }

    /// The mapping in GPU `device`'s context, opened by `open` on first use.
    pub(super) fn on(
        &self,
        device: usize,
        open: impl FnOnce(&IpcHandle) -> Result<Arc<IpcMapping>>,
    ) -> Result<Arc<IpcMapping>> {
        if self.first.ordinal() == device {
            return Ok(self.first.clone());
        }
        let mut g = self.on.lock();
        if let Some(m) = g.get(&device) {
            return Ok(m.clone());
        }
        let m = open(&self.handle)?;
        g.insert(device, m.clone());
        Ok(m)
    }
}

impl CudaIpcBackend {
    /// The state of GPU `ordinal`, opened on first use.
    pub(super) fn gpu(&self, ordinal: usize, op: Op) -> Result<Arc<Gpu>> {
        let mut g = self.gpus.lock();
        if let Some(x) = g.get(&ordinal) {
            return Ok(x.clone());
        }
        let x = Gpu::open(ordinal).map_err(|e| {
            let e = with_agent(e, &self.agent);
            match e {
                Error::Unavailable { .. } | Error::InvalidParam { .. } => e,
                other => Error::not_supported(
                    &self.agent,
                    op,
                    format!("GPU {ordinal} cannot copy here: {other}"),
                ),
            }
        })?;
        g.insert(ordinal, x.clone());
        Ok(x)
    }

    /// The GPU a request's copies run on: its local memory's (all local segments on one GPU),
    /// else its remote memory's, else the default.
    pub(super) fn copy_device(
        &self,
        kinds: (MemKind, MemKind),
        local_devs: impl Iterator<Item = u64>,
        remote_dev: Option<u64>,
    ) -> Result<usize> {
        let ordinal = |d: u64| usize::try_from(d).ok();
        if kinds.0 == MemKind::Vram {
            let mut devs = local_devs;
            let first = devs.next().and_then(ordinal);
            let Some(d) = first else {
                return Err(Error::invalid(&self.agent, Op::MakeXfer, "no segments"));
            };
            if let Some(other) = devs.find(|&o| ordinal(o) != Some(d)) {
                return Err(Error::not_supported(
                    &self.agent,
                    Op::MakeXfer,
                    format!(
                        "a request's local GPU memory is on GPU {d} and GPU {other}: post one request per GPU"
                    ),
                ));
            }
            return Ok(d);
        }
        if kinds.1 == MemKind::Vram {
            let count = cuda::device_count().unwrap_or(0);
            if let Some(d) = remote_dev.and_then(ordinal).filter(|&d| d < count) {
                return Ok(d);
            }
        }
        Ok(self.params.device)
    }

    /// Whether GPU `gpu`'s kernels may access GPU `peer`'s memory (asked once, and enabled).
    pub(super) fn peer_access(&self, gpu: &Gpu, peer: usize) -> bool {
        if gpu.ordinal == peer {
            return true;
        }
        let mut g = gpu.peers.lock();
        if let Some(&ok) = g.get(&peer) {
            return ok;
        }
        let ok = match (
            crate::sys::driver::can_access_peer(gpu.ordinal, peer),
            self.gpu(peer, Op::MakeXfer),
        ) {
            (Ok(true), Ok(p)) => match crate::sys::driver::enable_peer_access(&gpu.ctx, &p.ctx) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(agent = %self.agent, gpu = gpu.ordinal, peer, error = %e, "enabling peer access failed");
                    false
                }
            },
            _ => false,
        };
        g.insert(peer, ok);
        ok
    }

    /// A peer's GPU allocation mapped into GPU `device`'s context (one mapping per allocation
    /// and GPU, shared by every region in it).
    pub(super) fn import_vram(&self, h: &IpcHandle, device: usize) -> Result<Arc<IpcMapping>> {
        let mut cache = self.vram_imports.lock();
        cache.retain(|_, w| w.strong_count() > 0);
        let key = (*h.raw(), device);
        if let Some(m) = cache.get(&key).and_then(std::sync::Weak::upgrade) {
            return Ok(m);
        }
        let m = Arc::new(IpcMapping::open(device, h).map_err(|e| with_agent(e, &self.agent))?);
        cache.insert(key, Arc::downgrade(&m));
        Ok(m)
    }
}
