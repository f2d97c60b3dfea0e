//! The backend-author API: what a transport or storage engine implements to plug into an
//! agent. Applications do not need this module (the crate root is their API); backend crates
//! do.
//!
//! A backend is a trait object ([`Backend`]) created from a params value ([`BackendParams`]) with
//! a [`BackendContext`] (the agent's name and notification queue). It reports its
//! [`Capabilities`], registers memory into backend-private metadata ([`BackendMd`]), and turns a
//! list of [`Segment`]s into a [`BackendXfer`] that the agent posts and polls. A transport that
//! reaches other agents also implements [`PeerBackend`] (connection info, connect and
//! disconnect, region keys, peers' regions, notifications) and returns it from
//! [`Backend::peers`]; a storage engine does not, and the agent treats it as local-only.

pub mod bytes;
pub mod hello;
mod hello_keys;
pub mod own;
pub(crate) mod params;
mod plugin_macro;
pub use crate::wake::Wake;

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::mem::{MemKind, RegionDesc};

pub use crate::desc::merge_contiguous;
pub use crate::error::{DecodeError, SharedError};
pub use crate::hello::{
    Hello, HelloKeys, PeerAuth, SessionId, Sessions, HELLO_KEY_LEN, SESSION_LEN,
};
pub use crate::limits::NOTIF_OVERHEAD;
pub use crate::liveness::{PeerProcess, ProcessId};
pub use crate::mem::{RawRegion, PAGE_SIZE};
pub use crate::model::cells::CellGrid;
/// Host memory reached by bounded copies: [`Span`](host::Span), the one copy helper every host
/// buffer type uses (nixl-core's `HostBuffer`, nixl-mem's `HostMemory` types).
pub mod host {
    pub use crate::sys::host::Span;
}
pub use crate::tiles::MAX_TILE_ROWS;

/// The bundled in-process backend: a pure-Rust transport between agents of one process, for
/// tests and single-process pipelines.
pub mod inproc {
    pub use crate::inproc::{Completion, InprocBackend, InprocParams, InprocPlugin, INPROC};
}

/// The bundled fault-injection backend: wraps any backend and fails, delays or corrupts its
/// requests by a deterministic plan, for users' own tests of their error handling.
pub mod fault {
    pub use crate::fault::{FaultEvent, FaultLog, FaultParams, FaultPlan};
}

#[doc(hidden)]
#[deprecated(
    since = "0.1.0",
    note = "moved to nixl_core::backend::inproc::InprocBackend"
)]
pub type InprocBackend = crate::inproc::InprocBackend;
pub use crate::model::telemetry::Counters;
pub use crate::notif::NotifQueue;
pub use crate::params::{parse_bool, ParamMap};
pub use crate::spec::{distinct_mds, downcast_md, BackendMd, MdList, MdTable, Segment, XferSpec};
pub use crate::strided::{BlockRun, BlockXferSpec, LayerPair, LayerSegments};

/// Wakes the futures whose deadline (or re-check time) has come, from the calling thread. A
/// backend's progress thread calls it between passes: a deadline is then served by whichever
/// of the process's busy threads runs first, not only by the timer thread, which a loaded
/// machine may keep off the CPU for milliseconds. Cheap when nothing is due (a `try_lock` and a
/// peek).
pub fn fire_due_timers() {
    crate::model::timer::fire_due();
}

/// What a backend can do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Memory kinds it registers.
    pub mem_kinds: Vec<MemKind>,
    /// Transfers to other agents.
    pub remote: bool,
    /// Transfers to the agent itself (loopback, storage).
    pub local: bool,
    /// Notifications.
    pub notifications: bool,
    /// Whether the agent's progress thread (or polling) must call [`Backend::progress`].
    pub needs_progress: bool,
}

crate::__setters!(Capabilities {
    mem_kinds: Vec<MemKind>,
    remote: bool,
    local: bool,
    notifications: bool,
    needs_progress: bool,
});

impl Capabilities {
    /// A network transport's: DRAM (and VRAM where `vram`), transfers to other agents and to
    /// the agent itself, notifications; `needs_progress` where no thread of its own drives it.
    pub fn network(vram: bool, needs_progress: bool) -> Capabilities {
        let mut mem_kinds = vec![MemKind::Dram];
        if vram {
            mem_kinds.push(MemKind::Vram);
        }
        Capabilities::default()
            .mem_kinds(mem_kinds)
            .remote(true)
            .local(true)
            .notifications(true)
            .needs_progress(needs_progress)
    }

    /// A storage plugin's: `mem_kinds`, transfers between the agent's memory and its storage
    /// only, no notifications, nothing to progress.
    pub fn storage(mem_kinds: Vec<MemKind>) -> Capabilities {
        Capabilities::default()
            .mem_kinds(mem_kinds)
            .remote(false)
            .local(true)
            .notifications(false)
            .needs_progress(false)
    }

    /// Whether the kind is supported.
    pub fn supports(&self, kind: MemKind) -> bool {
        self.mem_kinds.contains(&kind)
    }
}

/// What an agent hands a backend it creates.
#[derive(Debug, Clone)]
pub struct BackendContext {
    /// The agent's name.
    pub agent: String,
    /// Where the backend delivers notifications it receives.
    pub notifs: Arc<NotifQueue>,
    /// Signs and checks connection hellos: how the backend learns which peer a notification
    /// comes from (see [`crate::hello`]).
    pub peers: PeerAuth,
    /// Wakes the agent's pending futures: call [`Wake::wake`] wherever a request may have
    /// completed (and say so in [`Backend::wakes`]).
    pub wake: Wake,
}

/// Progress of a transfer (NIXL's `NIXL_SUCCESS` / `NIXL_IN_PROG`); failures are errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XferState {
    /// All data is complete (and the notification, if any, sent).
    Done,
    /// Still moving.
    InProgress,
}

/// A backend's estimate of a transfer's duration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostEstimate {
    /// Expected duration.
    pub duration: Duration,
    /// Expected error margin.
    pub error_margin: Duration,
    /// How the estimate was made.
    pub method: CostMethod,
}

/// How a cost estimate was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CostMethod {
    /// From the transport library's own performance model (e.g. `ucp_ep_evaluate_perf`).
    Analytical,
    /// From measured throughput.
    Measured,
}

/// The device API a [`DeviceEvent`] belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceApi {
    /// A CUDA driver event (`CUevent`).
    Cuda,
}

/// What a GPU stream can wait on for a request's latest post ([`crate::XferReq::device_event`]):
/// the API, the device and the raw event handle, for an application's own CUDA code
/// (`cuStreamWaitEvent(stream, raw, 0)`, or torch's `torch.cuda.Event` from the handle), and
/// the backend's own object behind it (which keeps the handle alive while this value lives).
#[derive(Clone)]
pub struct DeviceEvent {
    api: DeviceApi,
    device: u32,
    raw: u64,
    owner: Arc<dyn Any + Send + Sync>,
}

impl DeviceEvent {
    /// A CUDA event: its device ordinal, its `CUevent` as an integer, and the object that
    /// owns it (kept alive with this value; the backend downcasts it with
    /// [`DeviceEvent::owner`]).
    pub fn cuda(device: u32, raw: u64, owner: Arc<dyn Any + Send + Sync>) -> DeviceEvent {
        DeviceEvent {
            api: DeviceApi::Cuda,
            device,
            raw,
            owner,
        }
    }

    /// The device API.
    pub fn api(&self) -> DeviceApi {
        self.api
    }

    /// The device ordinal.
    pub fn device(&self) -> u32 {
        self.device
    }

    /// The raw event handle (CUDA: the `CUevent`), valid while this value lives.
    pub fn raw(&self) -> u64 {
        self.raw
    }

    /// The backend's object behind the event, for the backend's own helpers to downcast.
    pub fn owner(&self) -> &(dyn Any + Send + Sync) {
        &*self.owner
    }
}

impl std::fmt::Debug for DeviceEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceEvent")
            .field("api", &self.api)
            .field("device", &self.device)
            .field("raw", &format_args!("{:#x}", self.raw))
            .finish()
    }
}

/// A prepared transfer inside a backend. Created by [`Backend::prepare_xfer`], owned by the
/// agent's request.
pub trait BackendXfer: Send {
    /// Starts (or restarts, after completion) the transfer.
    fn post(&mut self) -> Result<XferState>;
    /// Polls the transfer: its state, after driving it where the backend needs the caller's
    /// help (progressing its engine, taking a share of the copies).
    fn check(&mut self) -> Result<XferState>;
    /// The transfer's state without driving it: no progress, no copy, no wait for a lock held
    /// across one on the caller's thread (an async executor's thread polls this). A backend
    /// whose [`BackendXfer::check`] does such work and that is driven otherwise (its own
    /// threads, or the agent's progress thread calling [`Backend::progress`]) overrides it;
    /// the default is [`BackendXfer::check`].
    fn state(&mut self) -> Result<XferState> {
        self.check()
    }
    /// An `async` caller awaits the latest post: a backend that [wakes](Backend::wakes) the
    /// agent's futures but defers what that costs per post (CUDA_IPC: a host function on the
    /// stream, a driver call a blocking caller does not need) arms it here, so the agent's
    /// [`Wake`] fires once the post's work has completed. Called with the request held, after
    /// a post, by every poll of a future that finds the transfer in flight (arm once per
    /// post). The default does nothing: a backend that wakes on every post needs nothing more.
    fn arm_wake(&mut self) {}
    /// Stops the transfer. Returns `Ok` only once the backend will no longer touch the memory
    /// of the transfer; an `Err` means it could not be sure, and the agent then never frees
    /// that memory.
    fn cancel(&mut self) -> Result<()>;
    /// Starts stopping the transfer without blocking: its deadline passed or its peer is
    /// gone, and the request has already ended. The agent then polls [`BackendXfer::check`]
    /// until it stops reporting `InProgress` before releasing the transfer's memory. The
    /// default does nothing (the transfer runs to its end or fails).
    fn abandon(&mut self) {}
    /// Which transports carried this transfer (for path reports), if the backend knows.
    fn path(&self) -> Option<String> {
        None
    }
    /// The GPU event the application can make its streams wait on for the latest post
    /// (CUDA_IPC: the request's CUDA event); `None` by default.
    fn device_event(&self) -> Option<DeviceEvent> {
        None
    }
    /// How much each post adds to every layer's arrival counter, for a request made with
    /// counters (see [`crate::ArrivalCounters`]); `None` otherwise.
    fn arrival_per_post(&self) -> Option<u64> {
        None
    }
    /// Replaces the notification the following posts send after their data (`None`: none).
    /// Called only while the transfer is not in flight, and only on backends that declare
    /// notifications; the default refuses.
    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        let _ = msg;
        Err(crate::Error::not_supported(
            "",
            crate::Op::PostXfer,
            "this backend cannot change a prepared request's notification",
        ))
    }
}

/// A transport or storage engine.
///
/// All methods take `&self`: a backend is shared by every thread using the agent and does its
/// own fine-grained locking.
pub trait Backend: Send + Sync + 'static {
    /// The backend's type name ("UCX", "POSIX", "INPROC").
    fn name(&self) -> &str;
    /// What it can do.
    fn capabilities(&self) -> Capabilities;
    /// Registers a region.
    fn register(&self, region: &RegionDesc) -> Result<BackendMd>;
    /// Deregisters a region registered by this backend.
    fn deregister(&self, md: BackendMd) -> Result<()>;
    /// Loads one of the agent's own regions as a transfer target (loopback, storage).
    fn load_local(&self, region: &RegionDesc, md: &BackendMd) -> Result<BackendMd> {
        let _ = region;
        Ok(md.clone())
    }
    /// Releases what `load_remote` or `load_local` made.
    fn unload(&self, md: BackendMd) -> Result<()> {
        drop(md);
        Ok(())
    }
    /// Prepares a transfer. The spec is the agent's (it keeps it for the request's life):
    /// copy out what the transfer needs.
    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>>;
    /// Prepares a block-table transfer by its strides, where the backend can move it without
    /// one descriptor per block (a copy kernel that computes block addresses, a per-block
    /// loop over the layers and id runs, vectored I/O). `Ok(None)`, the default, means it
    /// cannot: the agent then materializes whole blocks into segments
    /// ([`BlockXferSpec::materialize`]) and calls [`Backend::prepare_xfer`] (tiles with rows
    /// rearranged are never materialized: the next backend is tried). The spec has
    /// [`BlockXferSpec::rows`] only where [`Backend::rearranges_rows`]. Errors mean the same
    /// as there (`NotSupported` lets the next backend try).
    fn prepare_blocks(&self, spec: &BlockXferSpec) -> Result<Option<Box<dyn BackendXfer>>> {
        let _ = spec;
        Ok(None)
    }
    /// Whether [`Backend::prepare_blocks`] lands each row of a tile where the destination
    /// wants it ([`BlockXferSpec::rows`]: a copy kernel, a CPU copy). Only such a backend is
    /// offered block tables with rows rearranged; for the others (the default: `false`) the
    /// agent tries the next backend and otherwise refuses the request with `NotSupported`
    /// naming the transform. Moving the tiles' bytes as they lie would be wrong, so there is
    /// no fallback.
    fn rearranges_rows(&self) -> bool {
        false
    }
    /// Whether the backend calls [`BackendContext::wake`]'s [`Wake::wake`] whenever one of
    /// its requests completes or fails, from its own progress (callbacks, completion queues,
    /// GPU events). An `async` caller of a request on a backend that does not is re-checked
    /// on a short timer instead (the default: `false`).
    fn wakes(&self) -> bool {
        false
    }
    /// Whether block and tile requests with arrival counters ([`BlockXferSpec::arrival`]) are
    /// advanced by this backend; the agent refuses them
    /// `NotSupported` on backends that are not (the default).
    fn supports_arrival(&self) -> bool {
        false
    }
    /// Drives the backend's progress engine; returns whether anything happened.
    fn progress(&self) -> Result<bool> {
        Ok(false)
    }
    /// Estimates a transfer's cost, where the backend can.
    fn estimate_cost(&self, spec: &XferSpec) -> Result<Option<CostEstimate>> {
        let _ = spec;
        Ok(None)
    }
    /// Which transports reach `remote` (so a silent fallback to a slow path is visible).
    fn path_report(&self, remote: &str) -> Option<String> {
        let _ = remote;
        None
    }
    /// Whether a region of the agent's own kind can be queried (storage: exists + size).
    fn query(&self, region: &RegionDesc) -> Result<Option<QueryResult>> {
        let _ = region;
        Ok(None)
    }
    /// The backend's NIXL wire, when it can reach stock NIXL agents of its type
    /// ([`crate::nixl_wire`]).
    fn nixl_wire(&self) -> Option<&dyn crate::nixl_wire::NixlWire> {
        None
    }
    /// Its peer-facing half, when it reaches other agents (a transport). `None`, the default,
    /// is a local-only backend (a storage engine): its metadata carries no connection info or
    /// region keys, peers listing it are not connected to, it loads no peer's regions
    /// (`NotSupported`) and sends no notifications (`NotSupported`).
    fn peers(&self) -> Option<&dyn PeerBackend> {
        None
    }
    /// The agent is gone: stop background work (progress threads, watchdogs) and wait for
    /// it. Called once, from the agent's drop, after the dropped requests the backend let go
    /// of were released. A request it still owns is kept then, with its memory and with this
    /// backend (neither is ever freed under a transfer that may still touch them), by the
    /// process's orphan thread, which checks it ([`BackendXfer::check`], backing off to every
    /// 100 ms) until the backend lets go; a backend whose threads kept polling for it would
    /// poll for nobody, and for good where the transfer never ends. What is left must work
    /// without those threads: `check` of such requests, and deregistering the regions of
    /// registrations that outlive the agent. The default does nothing (a backend's own drop
    /// stops what it started).
    fn shutdown(&self) {}
}

/// The peer-facing half of a transport backend: connection info, connecting to and forgetting
/// peers, the keys of its registered regions, loading a peer's regions, standalone
/// notifications. A backend that implements it returns itself from [`Backend::peers`]; a
/// storage engine implements none of it.
pub trait PeerBackend: Send + Sync {
    /// Connection info to put in the agent's metadata (a worker address), possibly empty.
    fn connection_info(&self) -> Result<Vec<u8>>;
    /// Connects to a peer from its connection info. Called again with new info after a peer
    /// restarted (after [`PeerBackend::disconnect`]).
    fn connect(&self, remote: &str, info: &[u8]) -> Result<()>;
    /// [`PeerBackend::connect`], given the peer's process when it runs on this host, as the agent
    /// bound it ([`crate::liveness::PeerProcess`]: the process the peer's metadata names, watched for its
    /// exit). A backend that aims at the peer's process itself uses this one and nothing its
    /// own connection info claims. Default: [`PeerBackend::connect`].
    fn connect_peer(
        &self,
        remote: &str,
        info: &[u8],
        process: Option<&crate::liveness::PeerProcess>,
    ) -> Result<()> {
        let _ = process;
        self.connect(remote, info)
    }
    /// Forgets a peer; requests still using it fail.
    fn disconnect(&self, remote: &str) -> Result<()>;
    /// The bytes a peer needs to reach a registered region (an rkey), possibly empty.
    fn public_metadata(&self, md: &BackendMd) -> Result<Vec<u8>>;
    /// The same bytes borrowed from the metadata, where the backend keeps them there: the
    /// agent's metadata then copies each region's straight into the blob instead of through
    /// a vector of its own. `None` (the default) sends the agent to
    /// [`PeerBackend::public_metadata`]; `Some` must hold what it would return.
    fn public_metadata_ref<'a>(&self, md: &'a BackendMd) -> Option<&'a [u8]> {
        let _ = md;
        None
    }
    /// Loads a peer's region from its public metadata.
    fn load_remote(&self, remote: &str, region: &RegionDesc, public: &[u8]) -> Result<BackendMd>;
    /// Sends a standalone notification.
    fn gen_notif(&self, remote: &str, msg: &[u8]) -> Result<()>;
    /// Sends a control message (a lease's) without waiting for it to leave and without
    /// ordering it after earlier posts' data: a peer that does not take it costs nothing to
    /// the caller, and it never waits behind in-flight copies. A backend bounds what it has
    /// posted and not yet seen leave per peer (`LimitExceeded` past that). Default:
    /// [`PeerBackend::gen_notif`].
    fn post_notif(&self, remote: &str, msg: &[u8]) -> Result<()> {
        self.gen_notif(remote, msg)
    }
    /// Why the transport holds the peer for dead (its connection failed or was reset), if it
    /// does; `None` while it looks alive or the backend cannot tell (the default).
    fn peer_failed(&self, remote: &str) -> Option<String> {
        let _ = remote;
        None
    }
}

/// What [`Backend::query`] found about a storage region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryResult {
    /// Whether it exists.
    pub exists: bool,
    /// Its size, if it exists.
    pub size: Option<u64>,
}

/// A typed parameter value that creates a backend: each backend crate exposes one (with
/// `Default`).
pub trait BackendParams: Send {
    /// The backend's type name.
    fn backend_name(&self) -> &str;
    /// Creates the backend.
    fn create(self: Box<Self>, ctx: BackendContext) -> Result<Arc<dyn Backend>>;
}

/// A backend type an agent can create by name from a string map (the boundary form; the
/// plugin parses the map once into its typed params).
pub trait BackendPlugin: Send + Sync {
    /// The backend's type name.
    fn name(&self) -> &str;
    /// Default parameters, as strings.
    fn default_params(&self) -> BTreeMap<String, String>;
    /// Parses the map and returns typed params.
    fn parse_params(&self, params: &BTreeMap<String, String>) -> Result<Box<dyn BackendParams>>;
}
