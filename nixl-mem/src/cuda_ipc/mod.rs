//! `CUDA_IPC`: a native same-host GPU transfer backend.
//!
//! - **VRAM**: registration exports a CUDA IPC handle (`cuIpcGetMemHandle`) as the region's
//!   public metadata; a peer's `load_remote` maps it (`cuIpcOpenMemHandle`, one mapping per
//!   allocation, closed when the last loaded region using it is released).
//! - **DRAM**: registration page-locks the region (`cuMemHostRegister`) so copies run at full
//!   speed. Another process's DRAM is reachable only if it was allocated shareable — a
//!   [`SharedHostBuffer`](crate::SharedHostBuffer) (memfd) — which the peer maps and pins;
//!   other host memory is published as private and a transfer to it from another process is
//!   refused with `NotSupported` naming the reason (peers in the same process reach it
//!   directly).
//! - **Transfers**: each request owns a stream; `post` enqueues its copies and records an
//!   event; `check` queries the event; `cancel` waits (bounded) for the stream, since copies
//!   handed to the GPU cannot be recalled. The engine is chosen at prepare time:
//!   - VRAM<->VRAM with more than a few segments (`kernel_min_segments`), every segment's ends
//!     on this backend's GPU (local memory, or a peer's mapped through CUDA IPC on the same GPU)
//!     and sharing their alignment modulo 16: the scatter-gather **copy kernel** (hand-written
//!     PTX, JIT-compiled by the driver; see [`crate::cuda`]'s `kernel` module), one launch over
//!     descriptors uploaded once at prepare time from a reused pinned buffer (a block table
//!     goes to the block kernel, which generates its copies on the device from the layers and
//!     the ids);
//!   - otherwise one `cuMemcpyAsync` for one or two segments, or one `cuMemcpyBatchAsync` for
//!     more (CUDA 12.8+; one call per segment where refused), on the copy engines. DRAM<->VRAM
//!     always uses the copy engines (PCIe is the limit there).
//!
//!   A kernel that fails to load or launch falls back to the copy engines with a warning, and
//!   the request's path says so. The kernel's shape (chunk size, CTAs, threads, loads in
//!   flight, store hint, schedule) is [`CudaIpcParams::kernel_shape`].
//!
//!   Copies that depend on each other (a destination overlapping another segment's destination
//!   or source, or its own source) never go to the kernel or to `cuMemcpyBatchAsync`, which
//!   both run their copies in any order: they are enqueued as one `cuMemcpyAsync` each, in
//!   descriptor order, so a later segment's bytes win as in a sequential copy, and the path
//!   says `in order: segments i and j overlap`.
//! - **Notifications**: sent over a Unix socket (abstract namespace, named in the connection
//!   info) only after the request's event has completed, so the target sees a notification
//!   only after the data. A completion thread per backend sends them as soon as the data is
//!   complete, in per-peer post order, whether or not the initiator polls; `check` reports
//!   `Done` once the data is complete and the notification sent; a canceled request's
//!   notification is never sent.
//!
//! Peers on another host (a different `boot_id`) connect but every region of theirs is
//! unreachable; the path report says so.

mod blocks;
mod complete;
mod gpu;
mod md;
pub(crate) mod notif;
mod params;
mod staging;
mod table;
mod xfer;
pub(crate) use xfer::RequestEvent;

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use nixl_core::backend::Capabilities;
use nixl_core::backend::{
    downcast_md, Backend, BackendContext, BackendMd, BackendXfer, NotifQueue, Segment, XferSpec,
};
use nixl_core::{Error, MemKind, Op, RegionDesc, Result, XferOp};
use parking_lot::Mutex;

use crate::cuda;
use crate::cuda::kernel;
pub use crate::cuda::kernel::{KernelSchedule, KernelShape};
use crate::{IpcHandle, IpcMapping, SharedHostHandle, SharedHostMapping};
use complete::{Completer, Notif, NotifRoute};
pub(crate) use md::{ConnInfo, Public};
use md::{HostImport, HostPin, LocalMd, Target};
pub use notif::MAX_NOTIF;
use notif::{NotifSenders, NotifServer};
pub use params::{CudaIpcParams, CudaIpcPlugin};
use xfer::{CudaIpcXfer, Engine, KernelPlan, Work};

/// The backend's type name.
pub const CUDA_IPC: &str = "CUDA_IPC";

/// A peer's GPU allocation (its IPC handle's bytes) and the GPU whose context mapped it.
type VramKey = ([u8; 64], usize);

/// What a request is, apart from its copies (a segment list's or a block table's).
struct Ends<'a> {
    op: XferOp,
    kinds: (MemKind, MemKind),
    remote: &'a str,
    is_local: bool,
    notif: Option<&'a [u8]>,
    /// Per-layer arrival counters (this process's device address) the launch advances.
    arrival: Option<u64>,
}

/// The fields of a spec (a segment list's or a block table's) its [`Ends`] are made of.
macro_rules! ends_of {
    ($backend:expr, $spec:expr, $gpu:expr) => {
        $crate::cuda_ipc::Ends {
            op: $spec.op,
            kinds: ($spec.local_kind, $spec.remote_kind),
            remote: &$spec.remote,
            is_local: $spec.is_local,
            notif: $spec.notif.as_deref(),
            arrival: $backend.counters_on($spec.arrival, $gpu.ordinal)?,
        }
    };
}
use ends_of;

struct Peer {
    same_host: bool,
    pid: u32,
    server: Vec<u8>,
}

/// The `CUDA_IPC` backend (see the module docs).
pub struct CudaIpcBackend {
    agent: String,
    params: CudaIpcParams,
    /// The default GPU ([`CudaIpcParams::device`]).
    home: Arc<gpu::Gpu>,
    /// Every GPU this backend copies on, opened on first use (the default one included).
    gpus: Mutex<HashMap<usize, Arc<gpu::Gpu>>>,
    host_id: Vec<u8>,
    notifs: Arc<NotifQueue>,
    server: NotifServer,
    senders: Arc<NotifSenders>,
    /// Sends notifications once their data is complete; joined on drop.
    completer: Completer,
    peers: Mutex<HashMap<String, Arc<Peer>>>,
    /// Peers' GPU allocations, per (handle, GPU whose context mapped them).
    vram_imports: Mutex<HashMap<VramKey, Weak<IpcMapping>>>,
    host_imports: Mutex<HashMap<(u32, i32, u64), Weak<HostImport>>>,
    /// Wakes the agent's futures once a post's work has completed (a host function queued
    /// after it on the request's stream by the first poll of a future awaiting it).
    wake: nixl_core::backend::Wake,
}

impl std::fmt::Debug for CudaIpcBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaIpcBackend")
            .field("agent", &self.agent)
            .field("params", &self.params)
            .finish()
    }
}

fn host_id() -> Vec<u8> {
    std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_else(|_| b"unknown-boot-id".to_vec())
}

/// The memory layer's error as this backend's, naming its agent.
fn with_agent(e: crate::MemError, agent: &str) -> Error {
    e.at(agent)
}

impl CudaIpcBackend {
    /// Creates the backend: binds GPU `params.device`, starts the notification listener and
    /// the completion thread. `InvalidParam` for a kernel shape out of range (before anything
    /// else), `Unavailable` without the CUDA driver or device.
    pub fn new(ctx: BackendContext, params: CudaIpcParams) -> Result<Self> {
        params.kernel_shape.validate().map_err(|why| {
            Error::invalid(&ctx.agent, Op::CreateBackend, format!("CUDA_IPC {why}"))
        })?;
        let home = gpu::Gpu::open(params.device).map_err(|e| with_agent(e, &ctx.agent))?;
        let server = NotifServer::start(&ctx.agent, ctx.notifs.clone(), ctx.peers.clone())?;
        let completer = Completer::start(&ctx.agent, Some(home.ctx.clone()))?;
        Ok(CudaIpcBackend {
            agent: ctx.agent,
            params,
            gpus: Mutex::new(HashMap::from([(home.ordinal, home.clone())])),
            home,
            host_id: host_id(),
            notifs: ctx.notifs,
            server,
            senders: Arc::new(NotifSenders::new(ctx.peers.clone())),
            completer,
            peers: Mutex::new(HashMap::new()),
            vram_imports: Mutex::new(HashMap::new()),
            host_imports: Mutex::new(HashMap::new()),
            wake: ctx.wake,
        })
    }

    fn peer(&self, remote: &str, op: Op) -> Result<Arc<Peer>> {
        self.peers.lock().get(remote).cloned().ok_or_else(|| {
            Error::not_found(
                &self.agent,
                op,
                format!("{remote} is not connected to CUDA_IPC"),
            )
        })
    }

    fn import_host(&self, h: &SharedHostHandle) -> Result<Arc<HostImport>> {
        let key = (h.pid, h.fd, h.token);
        let mut cache = self.host_imports.lock();
        cache.retain(|_, w| w.strong_count() > 0);
        if let Some(m) = cache.get(&key).and_then(Weak::upgrade) {
            return Ok(m);
        }
        let map = SharedHostMapping::open(h).map_err(|e| with_agent(e, &self.agent))?;
        let pin = if self.params.pin_host {
            use crate::HostMemory;
            HostPin::new(&self.home.ctx, map.addr(), h.len)
                .map_err(|e| cuda::to_error(&self.agent, Op::LoadMetadata, e))?
        } else {
            None
        };
        let m = Arc::new(HostImport { _pin: pin, map });
        cache.insert(key, Arc::downgrade(&m));
        Ok(m)
    }

    fn target_for(
        &self,
        remote: &str,
        peer: &Peer,
        region: &RegionDesc,
        public: Public,
    ) -> Result<Target> {
        if !peer.same_host {
            return Ok(Target::Unreachable(format!(
                "{remote} is on another host; CUDA_IPC reaches one host only"
            )));
        }
        if peer.pid == std::process::id() {
            return Ok(Target::Identity);
        }
        Ok(match public {
            Public::Vram(h) => match self.import_vram(&h, self.params.device) {
                Ok(m) => Target::Vram(Arc::new(gpu::RemoteVram::new(h, m))),
                Err(e) => {
                    tracing::warn!(agent = %self.agent, %remote, error = %e, "cannot map a peer's GPU memory");
                    Target::Unreachable(format!("mapping {remote}'s GPU memory failed: {e}"))
                }
            },
            Public::Shared(h) => match self.import_host(&h) {
                Ok(m) => Target::Host(m),
                Err(e) => {
                    tracing::warn!(agent = %self.agent, %remote, error = %e, "cannot map a peer's shared host memory");
                    Target::Unreachable(format!("mapping {remote}'s shared host memory failed: {e}"))
                }
            },
            Public::Private => Target::Unreachable(format!(
                "{remote}'s DRAM at {:#x} is private to its process; allocate it as a SharedHostBuffer to make it reachable",
                region.addr
            )),
        })
    }
}

impl Backend for CudaIpcBackend {
    fn name(&self) -> &str {
        CUDA_IPC
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
            .mem_kinds(vec![MemKind::Dram, MemKind::Vram])
            .remote(true)
            .local(true)
            .notifications(true)
            .needs_progress(false)
    }

    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        let md = match region.kind {
            MemKind::Vram => {
                let ordinal = usize::try_from(region.dev_id)
                    .map_err(|_| Error::invalid(&self.agent, Op::RegisterMem, "GPU ordinal"))?;
                let h = IpcHandle::export(ordinal, region.addr, region.len)
                    .map_err(|e| with_agent(e, &self.agent))?;
                LocalMd {
                    public: Public::Vram(h),
                    _pin: None,
                }
            }
            MemKind::Dram => {
                let pin = if self.params.pin_host {
                    match HostPin::new(&self.home.ctx, region.addr, region.len) {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::warn!(agent = %self.agent, error = %e, "could not pin a DRAM region; its copies will be staged");
                            None
                        }
                    }
                } else {
                    None
                };
                let public = match SharedHostHandle::find_local(region.addr, region.len) {
                    Some(h) => Public::Shared(h),
                    None => Public::Private,
                };
                LocalMd { public, _pin: pin }
            }
            k => {
                return Err(Error::not_supported(
                    &self.agent,
                    Op::RegisterMem,
                    format!("CUDA_IPC registers DRAM and VRAM, not {k}"),
                ))
            }
        };
        Ok(Arc::new(md))
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        downcast_md::<LocalMd>(&md).ok_or_else(|| {
            Error::invalid(&self.agent, Op::DeregisterMem, "not CUDA_IPC metadata")
        })?;
        drop(md);
        Ok(())
    }

    fn load_local(&self, _region: &RegionDesc, md: &BackendMd) -> Result<BackendMd> {
        downcast_md::<LocalMd>(md).ok_or_else(|| {
            Error::invalid(&self.agent, Op::PrepXferDlist, "not CUDA_IPC metadata")
        })?;
        Ok(Arc::new(Target::Identity))
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        for k in [spec.local_kind, spec.remote_kind] {
            if !matches!(k, MemKind::Dram | MemKind::Vram) {
                return Err(Error::not_supported(
                    &self.agent,
                    Op::MakeXfer,
                    format!("CUDA_IPC moves DRAM and VRAM, not {k}"),
                ));
            }
        }
        let device = self.copy_device(
            (spec.local_kind, spec.remote_kind),
            spec.segments.iter().map(|s| s.local_dev),
            spec.segments.first().map(|s| s.remote_dev),
        )?;
        let gpu = self.gpu(device, Op::MakeXfer)?;
        let mut copies = Vec::with_capacity(spec.segments.len());
        let mut how = "same process";
        // Whether every remote end is another process's memory, mapped here: its addresses
        // then meet no local one, so destinations the agent proved disjoint (in the peer's
        // addresses, which the mappings keep apart) meet no source either.
        let mut mapped = true;
        // Whether every segment's two ends are device memory the copying GPU's kernel reaches
        // and share their alignment modulo 16 (what the copy kernel needs); else why not.
        let mut kernel_ok: KernelOk =
            if spec.local_kind == MemKind::Vram && spec.remote_kind == MemKind::Vram {
                Ok(())
            } else {
                Err(NoKernel::Dram)
            };
        // Each region's metadata is checked, and each remote region's mapping looked up,
        // once per request (by metadata index), not once per segment.
        let mut local_checked = vec![false; spec.mds.len()];
        let mut reached: Vec<Option<Reached>> = vec![None; spec.mds.len()];
        for s in &spec.segments {
            if !local_checked.get(s.local_md).copied().unwrap_or(false) {
                spec.md(s.local_md)
                    .and_then(downcast_md::<LocalMd>)
                    .ok_or_else(|| {
                        Error::invalid(
                            &self.agent,
                            Op::MakeXfer,
                            "local metadata is not CUDA_IPC's",
                        )
                    })?;
                if let Some(c) = local_checked.get_mut(s.local_md) {
                    *c = true;
                }
            }
            if !matches!(reached.get(s.remote_md), Some(Some(_))) {
                // An index past the metadata fails here, before any slot is looked at.
                let t = self.remote_target(spec, s)?;
                how = match t {
                    Target::Vram(_) => "CUDA IPC mapping",
                    Target::Host(_) => "shared memfd mapping",
                    _ => {
                        mapped = false;
                        how
                    }
                };
                let r = self.reached(t, &gpu);
                if let Some(slot) = reached.get_mut(s.remote_md) {
                    *slot = Some(r);
                }
            }
            let Some(Some(r)) = reached.get(s.remote_md) else {
                return Err(Error::invalid(
                    &self.agent,
                    Op::MakeXfer,
                    "remote metadata index out of range",
                ));
            };
            let (remote, remote_gpu) = r
                .at(s.remote_addr, s.len, s.remote_dev)
                .map_err(|why| Error::not_supported(&self.agent, Op::MakeXfer, why))?;
            if kernel_ok.is_ok() {
                kernel_ok = self.kernel_reaches(&gpu, remote_gpu).and_then(|()| {
                    if kernel::co_aligned(s.local_addr, remote) {
                        Ok(())
                    } else {
                        Err(NoKernel::Layout("segments not 16-byte co-aligned"))
                    }
                });
            }
            copies.push(match spec.op {
                XferOp::Write => (remote, s.local_addr, s.len),
                XferOp::Read => (s.local_addr, remote, s.len),
            });
        }
        if copies.is_empty() {
            return Err(Error::invalid(&self.agent, Op::MakeXfer, "no segments"));
        }
        // Copies that depend on each other run one by one, in order (the kernel's CTAs and a
        // batch's copies run in any order). Independent where the agent proved the
        // destinations disjoint and none meets a source (another address space, or regions
        // apart in this one); else proven here from the addresses.
        let conflict = if spec.dst_disjoint && (mapped || spec.ends_apart) {
            None
        } else {
            kernel::conflict_in_groups(&copies, Some(&copy_groups(spec)))
        };
        let ends = ends_of!(self, spec, gpu);
        self.finish(&gpu, ends, Work::Copies(copies), how, kernel_ok, conflict)
    }

    fn supports_arrival(&self) -> bool {
        true
    }

    fn wakes(&self) -> bool {
        // A future awaiting a post queues a host function after its work that wakes the agent
        // (`BackendXfer::arm_wake`); its notification is sent by the completer thread, without
        // polling either.
        true
    }

    fn prepare_blocks(
        &self,
        spec: &nixl_core::backend::BlockXferSpec,
    ) -> Result<Option<Box<dyn BackendXfer>>> {
        self.prepare_table(spec).map(Some)
    }

    fn rearranges_rows(&self) -> bool {
        true
    }

    fn path_report(&self, remote: &str) -> Option<String> {
        let peer = self.peers.lock().get(remote).cloned()?;
        Some(if !peer.same_host {
            "cuda_ipc: unreachable (another host)".to_owned()
        } else if peer.pid == std::process::id() {
            format!(
                "cuda_ipc: same process; copies on the local memory's GPU (default GPU {})",
                self.params.device
            )
        } else {
            format!(
                "cuda_ipc: same host (pid {}), CUDA IPC; copies on the local memory's GPU (default GPU {})",
                peer.pid, self.params.device
            )
        })
    }

    fn peers(&self) -> Option<&dyn nixl_core::backend::PeerBackend> {
        Some(self)
    }
}

impl nixl_core::backend::PeerBackend for CudaIpcBackend {
    fn connection_info(&self) -> Result<Vec<u8>> {
        Ok(ConnInfo {
            host: self.host_id.clone(),
            pid: std::process::id(),
            server: self.server.name().to_vec(),
        }
        .encode())
    }

    fn connect(&self, remote: &str, info: &[u8]) -> Result<()> {
        self.connect_peer(remote, info, None)
    }

    /// A peer's connection info names the process its copies aim at: this very process means
    /// plain copies to the addresses its metadata names. So the process must be the one the
    /// agent bound for the peer (a peer of this process is then a live agent of it with its
    /// own registrations: nixl-core checks that), and never this process otherwise.
    fn connect_peer(
        &self,
        remote: &str,
        info: &[u8],
        process: Option<&nixl_core::backend::PeerProcess>,
    ) -> Result<()> {
        let ConnInfo { host, pid, server } =
            ConnInfo::decode(info).map_err(|source| Error::Decode {
                agent: self.agent.clone(),
                op: Op::LoadMetadata,
                source,
            })?;
        let bound = process.map(|p| p.pid());
        if host == self.host_id && bound.map_or(pid == std::process::id(), |b| b != pid) {
            return Err(Error::not_allowed(
                &self.agent,
                Op::LoadMetadata,
                format!(
                    "{remote}'s CUDA_IPC connection info names process {pid} of this host, which \
                     is not the process its metadata was bound to ({bound:?}): refused"
                ),
            ));
        }
        let peer = Peer {
            same_host: host == self.host_id,
            pid,
            server,
        };
        if let Some(old) = self.peers.lock().insert(remote.to_owned(), Arc::new(peer)) {
            self.senders.forget(&old.server);
        }
        Ok(())
    }

    fn disconnect(&self, remote: &str) -> Result<()> {
        if let Some(p) = self.peers.lock().remove(remote) {
            self.senders.forget(&p.server);
        }
        Ok(())
    }

    fn public_metadata(&self, md: &BackendMd) -> Result<Vec<u8>> {
        let m = downcast_md::<LocalMd>(md).ok_or_else(|| {
            Error::invalid(&self.agent, Op::LocalMetadata, "not CUDA_IPC metadata")
        })?;
        Ok(m.public.encode())
    }

    fn load_remote(&self, remote: &str, region: &RegionDesc, public: &[u8]) -> Result<BackendMd> {
        let peer = self.peer(remote, Op::LoadMetadata)?;
        let p = Public::decode(public).map_err(|source| Error::Decode {
            agent: self.agent.clone(),
            op: Op::LoadMetadata,
            source,
        })?;
        let consistent = match &p {
            Public::Vram(h) => {
                region.kind == MemKind::Vram
                    && region.addr >= h.addr
                    && region.end().is_some_and(|e| e <= h.addr + h.len)
            }
            Public::Shared(h) => {
                region.kind == MemKind::Dram
                    && region.addr >= h.addr
                    && region.end().is_some_and(|e| e <= h.addr + h.len)
            }
            Public::Private => region.kind == MemKind::Dram,
        };
        if !consistent {
            return Err(Error::mismatch(
                &self.agent,
                Op::LoadMetadata,
                format!(
                    "CUDA_IPC metadata of {remote}'s region {:#x}+{} does not describe it",
                    region.addr, region.len
                ),
            ));
        }
        Ok(Arc::new(self.target_for(remote, &peer, region, p)?))
    }

    fn gen_notif(&self, remote: &str, msg: &[u8]) -> Result<()> {
        if remote == self.agent {
            self.notifs.push(&self.agent, msg.to_vec());
            return Ok(());
        }
        let peer = self.peer(remote, Op::GenNotif)?;
        self.senders.send(&self.agent, remote, &peer.server, msg)
    }
}

/// Why a request cannot take the copy kernel.
#[derive(Debug, Clone)]
pub(crate) enum NoKernel {
    /// An end is host memory (PCIe is the limit: the copy engines are right).
    Dram,
    /// The caller's layout (alignment): the copy engines are right, and the path says so.
    Layout(&'static str),
    /// The hardware or driver (no peer access between the GPUs, a GPU the driver does not
    /// name): refused unless [`CudaIpcParams::allow_copy_engines`].
    Hardware(String),
}

/// Why a VRAM request of many segments stays on the copy engines, for its path.
fn engine_note(
    conflict: Option<(usize, usize)>,
    kernel_ok: &KernelOk,
    kernel_wanted: bool,
) -> Option<String> {
    match (conflict, kernel_ok) {
        (Some((i, j)), _) if i == j => Some(format!("in order: segment {i} overlaps itself")),
        (Some((i, j)), _) => Some(format!("in order: segments {i} and {j} overlap")),
        (None, Err(NoKernel::Layout(why))) if kernel_wanted => Some(format!("copy engines: {why}")),
        (None, Err(NoKernel::Hardware(why))) if kernel_wanted => {
            Some(format!("copy engines (allowed): {why}"))
        }
        _ => None,
    }
}

/// A request with arrival counters that cannot have them: only the copy kernel advances them.
fn no_arrival(agent: &str, why: &str) -> Error {
    Error::not_supported(
        agent,
        Op::MakeXfer,
        format!("CUDA_IPC advances arrival counters only from its block and tile kernels: {why}"),
    )
}

/// Whether a request's segments can take the copy kernel.
pub(crate) type KernelOk = std::result::Result<(), NoKernel>;

impl CudaIpcBackend {
    /// Segment `s`'s remote metadata as this backend's.
    fn remote_target<'a>(&self, spec: &'a XferSpec, s: &Segment) -> Result<&'a Target> {
        spec.md(s.remote_md)
            .and_then(downcast_md::<Target>)
            .ok_or_else(|| {
                Error::invalid(
                    &self.agent,
                    Op::MakeXfer,
                    "remote metadata is not CUDA_IPC's",
                )
            })
    }

    /// How GPU `gpu`'s copies reach a target's addresses (a peer's GPU memory imported into
    /// that GPU's context on first use): the one lookup of both the segment and the block
    /// paths, once per request and region on the segment path, once per layer on the block
    /// path.
    pub(super) fn reached(&self, t: &Target, gpu: &gpu::Gpu) -> Reached {
        match t {
            Target::Vram(v) => match v.on(gpu.ordinal, |h| self.import_vram(h, gpu.ordinal)) {
                Ok(m) => Reached::Window(m.window(), m.resident_ordinal(), "mapped allocation"),
                Err(e) => Reached::Unreachable(format!(
                    "mapping the peer's GPU memory into GPU {}: {e}",
                    gpu.ordinal
                )),
            },
            Target::Host(h) => Reached::Window(h.map.window(), None, "shared buffer"),
            Target::Identity => Reached::Identity,
            Target::Unreachable(why) => Reached::Unreachable(why.clone()),
        }
    }

    /// Whether GPU `gpu`'s copy kernel reaches memory the driver says is on `remote_gpu`.
    fn kernel_reaches(&self, gpu: &gpu::Gpu, remote_gpu: Option<usize>) -> KernelOk {
        match remote_gpu {
            None => Err(NoKernel::Hardware(
                "the driver did not say which GPU the peer memory is on".to_owned(),
            )),
            Some(r) if r == gpu.ordinal || self.peer_access(gpu, r) => Ok(()),
            Some(r) => Err(NoKernel::Hardware(format!(
                "GPU {} has no peer access to GPU {r}",
                gpu.ordinal
            ))),
        }
    }
}

impl CudaIpcBackend {
    /// The request around its prepared work: `(work, engine, note)` and its `(lane, route,
    /// notification)`.
    fn xfer(
        &self,
        gpu: &gpu::Gpu,
        spec: &Ends<'_>,
        how: &str,
        (work, engine, note): (Work, Engine, Option<String>),
        (lane, route, notif): (Arc<staging::Lane>, NotifRoute, Option<Arc<Notif>>),
    ) -> Box<dyn BackendXfer> {
        Box::new(CudaIpcXfer {
            agent: self.agent.clone(),
            work,
            lane,
            lanes: gpu.lanes.clone(),
            engine,
            notif,
            remote: spec.remote.to_owned(),
            route,
            ticket: None,
            completer: self.completer.shared(),
            wake: self.wake.clone(),
            wake_unarmed: false,
            cancel_timeout: self.params.cancel_timeout,
            device: gpu.ordinal,
            path_head: format!(
                "cuda_ipc {} {}->{} via {how}",
                spec.op, spec.kinds.0, spec.kinds.1
            ),
            note,
        })
    }

    /// Where a request's notifications go (kept for per-post messages), and its notification.
    fn route(&self, spec: &Ends<'_>) -> Result<(NotifRoute, Option<Arc<Notif>>)> {
        // Where this request's notifications go (kept for per-post messages).
        let route = if spec.is_local {
            NotifRoute::Local(self.notifs.clone())
        } else {
            let peer = self.peer(spec.remote, Op::MakeXfer)?;
            NotifRoute::Remote {
                senders: self.senders.clone(),
                server: peer.server.clone(),
            }
        };
        let notif = spec
            .notif
            .map(|msg| {
                Notif::new(
                    &self.agent,
                    spec.remote,
                    msg.to_vec(),
                    route.clone(),
                    Op::MakeXfer,
                )
            })
            .transpose()?;
        Ok((route, notif))
    }

    /// Builds the request around its copies: its notification route, stream and event, and
    /// the engine (the copy kernel where eligible, else the copy engines).
    fn finish(
        &self,
        gpu: &gpu::Gpu,
        spec: Ends<'_>,
        mut work: Work,
        how: &str,
        kernel_ok: KernelOk,
        conflict: Option<(usize, usize)>,
    ) -> Result<Box<dyn BackendXfer>> {
        let device = gpu.ordinal;
        let (route, notif) = self.route(&spec)?;
        let lane = gpu
            .lanes
            .take()
            .map_err(|e| cuda::to_error(&self.agent, Op::MakeXfer, e))?;
        let fallback = if conflict.is_none() && self.params.batch_copies && work.len() > 1 {
            Engine::Batch
        } else {
            Engine::Copies
        };
        let mut note = None;
        let many = work.len() >= self.params.kernel_min_segments.max(1);
        let counters = spec.arrival;
        let eligible =
            self.params.copy_kernel && conflict.is_none() && (many || counters.is_some());
        if counters.is_some() && !(eligible && kernel_ok.is_ok()) {
            return Err(no_arrival(
                &self.agent,
                "the request cannot take the copy kernel",
            ));
        }
        // A request the copy kernel would take, left to the copy engines only because of the
        // hardware (GPUs without peer access, a kernel that does not load): refused unless the
        // caller allowed it by name.
        let refuse = |why: &str| {
            Error::not_supported(
                &self.agent,
                Op::MakeXfer,
                format!(
                    "this {} request would run on GPU {device}'s copy engines instead of the copy kernel ({why}), much slower than the hardware allows; CudaIpcParams::allow_copy_engines accepts that",
                    spec.op
                ),
            )
        };
        if let (true, Err(NoKernel::Hardware(why))) = (eligible, &kernel_ok) {
            if !self.params.allow_copy_engines {
                return Err(refuse(why));
            }
        }
        let engine = if eligible && kernel_ok.is_ok() {
            // A load failure was warned about once, when it happened; a failure to prepare
            // this request's descriptors is warned about here. Either way the path says it.
            let plan = match gpu.copy_kernel(&self.agent, self.params.kernel_shape) {
                Err(why) if !self.params.allow_copy_engines => {
                    return Err(refuse(&format!("copy kernel unavailable: {why}")))
                }
                Err(why) => Err(format!("copy kernel unavailable: {why}")),
                Ok(k) => KernelPlan::new(k, &gpu.staging, &mut work, &lane).map_err(|why| {
                    tracing::warn!(agent = %self.agent, error = %why, "could not prepare the copy kernel's descriptors; using the copy engines");
                    format!("copy kernel not prepared: {why}")
                }),
            };
            match plan {
                Err(why) if counters.is_some() => return Err(no_arrival(&self.agent, &why)),
                Ok(plan) => {
                    let plan = match counters {
                        Some(c) => plan
                            .with_arrival(c)
                            .map_err(|w| no_arrival(&self.agent, &w))?,
                        None => plan,
                    };
                    // The first post's event record covers the upload (one driver call less
                    // per request); a plan dropped before any post records it then.
                    Engine::Kernel(plan)
                }
                Err(why) => {
                    note = Some(xfer::short_note(why));
                    fallback
                }
            }
        } else {
            note = engine_note(conflict, &kernel_ok, self.params.copy_kernel && many);
            fallback
        };
        Ok(self.xfer(gpu, &spec, how, (work, engine, note), (lane, route, notif)))
    }
}

/// How a request's copies reach one remote region's addresses ([`CudaIpcBackend::reached`]).
#[derive(Clone)]
pub(super) enum Reached {
    /// Through a mapping: the exporter's range and where it lies here, the GPU the driver says
    /// it is on, and what the range is (for the error of an address outside it).
    Window(crate::shared::Window, Option<usize>, &'static str),
    /// As they are (memory of this process).
    Identity,
    /// Not from this process, and why.
    Unreachable(String),
}

impl Reached {
    /// The peer's `[addr, addr + len)` as this process's copies address it, and the GPU its
    /// memory is on as the kernel check sees it (`remote_dev` for memory of this process);
    /// why not, where it is out of reach.
    pub(super) fn at(
        &self,
        addr: u64,
        len: u64,
        remote_dev: u64,
    ) -> std::result::Result<(u64, Option<usize>), String> {
        match self {
            Reached::Window(w, resident, what) => w
                .translate(addr, len)
                .map(|a| (a, *resident))
                .ok_or_else(|| format!("{addr:#x}+{len} is outside the peer's {what}")),
            Reached::Identity => Ok((addr, usize::try_from(remote_dev).ok())),
            Reached::Unreachable(why) => Err(why.clone()),
        }
    }
}

/// Each copy's (destination, source) region, by metadata index: the independence proof's
/// groups.
fn copy_groups(spec: &XferSpec) -> Vec<(u32, u32)> {
    spec.segments
        .iter()
        .map(|s| {
            let (l, r) = (
                u32::try_from(s.local_md).unwrap_or(u32::MAX),
                u32::try_from(s.remote_md).unwrap_or(u32::MAX),
            );
            match spec.op {
                XferOp::Write => (r, l),
                XferOp::Read => (l, r),
            }
        })
        .collect()
}

/// Makes the work queued on `stream` after this call wait, on the GPU, for request `req`'s
/// latest post (a CUDA_IPC request: its copies, recorded in its event), so a kernel that
/// reads the data can be queued at once instead of after the CPU sees the request complete.
/// Call it after the post. `NotSupported` for a request of another backend.
pub fn gate_stream(
    req: &nixl_core::XferReq,
    stream: &cudarc::driver::CudaStream,
) -> nixl_core::Result<()> {
    let not = || {
        nixl_core::Error::not_supported(
            "",
            nixl_core::Op::Wait,
            "gate_stream takes CUDA_IPC requests (their CUDA event)",
        )
    };
    let ev = req.device_event().ok_or_else(not)?;
    let ev = ev.owner().downcast_ref::<RequestEvent>().ok_or_else(not)?;
    ev.0.gate(stream)
        .map_err(|e| crate::cuda::to_error("", nixl_core::Op::Wait, e))
}
