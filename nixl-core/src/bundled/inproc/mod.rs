//! `INPROC`: a pure-Rust backend that moves host memory between agents of one process and to
//! the agent itself.
//!
//! It is a real backend, not a mock: it registers memory, checks every region on every
//! transfer (a deregistered target region fails the transfer instead of being written), and
//! delivers notifications after the data. Use it to test code built on the agent without a
//! network, and wrap it in [`crate::FaultParams`] to inject faults deterministically.
//!
//! By default a transfer's copy happens inside `post`. With
//! [`Completion::Deferred`] it happens later, on the backend's completion thread: until then
//! the request is really in flight (`InProgress`, the destination unchanged, no notification
//! yet), so cancel, drop, deadlines and notification ordering can be tested where they can
//! fail.

mod xfer;

use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::deferred::Scheduler;
use xfer::{InprocXfer, Plan, Work};

use crate::backend::{
    downcast_md, Backend, BackendContext, BackendMd, BackendXfer, BlockXferSpec, Capabilities,
    XferSpec,
};
use crate::error::{Error, Op, Result};
use crate::mem::{MemKind, RegionDesc};
use crate::notif::NotifQueue;

/// The backend's type name.
pub const INPROC: &str = "INPROC";

static ENDPOINTS: Mutex<BTreeMap<u64, Weak<Endpoint>>> = Mutex::new(BTreeMap::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

struct Endpoint {
    id: u64,
    notifs: Arc<NotifQueue>,
    /// Registered regions: id -> (addr, len). Transfers hold the read lock while copying, so
    /// deregistration waits for them.
    regions: RwLock<HashMap<u64, (u64, u64)>>,
}

struct LocalMd {
    region: u64,
}

struct TargetMd {
    ep: Weak<Endpoint>,
    region: u64,
}

/// When INPROC's copies happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Completion {
    /// Inside `post`: a post returns `Done` (or a typed error).
    #[default]
    Immediate,
    /// On the backend's completion thread, this long after the post: `post` returns
    /// `InProgress`, the data and then the notification arrive later whether or not anyone
    /// polls, and a cancel before the copy starts leaves the destination untouched (a cancel
    /// during the copy waits for it).
    Deferred(Duration),
}

/// Parameters of the in-process backend.
///
/// ```
/// use std::time::Duration;
/// use nixl_core::{Completion, InprocParams};
/// // Copies land 50 ms after each post, on another thread.
/// let slow = InprocParams::default().completion(Completion::Deferred(Duration::from_millis(50)));
/// # let _ = slow;
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct InprocParams {
    /// When copies happen (default: inside `post`).
    pub completion: Completion,
}

crate::__setters!(InprocParams {
    completion: Completion,
});

/// The in-process backend.
pub struct InprocBackend {
    agent: String,
    ep: Arc<Endpoint>,
    peers: Mutex<HashMap<String, Weak<Endpoint>>>,
    completion: Completion,
    /// The completion thread of [`Completion::Deferred`] (shared with its requests).
    sched: Arc<Scheduler>,
    /// Wakes the agent's futures when a deferred copy ends.
    wake: crate::backend::Wake,
}

impl std::fmt::Debug for InprocBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InprocBackend")
            .field("agent", &self.agent)
            .field("endpoint", &self.ep.id)
            .finish()
    }
}

/// Creates `INPROC` by name.
#[derive(Debug, Clone, Copy, Default)]
pub struct InprocPlugin;

impl InprocParams {
    /// No defaults to list: `deferred_ms` is absent unless set.
    pub(crate) fn default_map() -> std::collections::BTreeMap<String, String> {
        std::collections::BTreeMap::new()
    }

    /// `deferred_ms`: copies complete this many milliseconds after each post, on another
    /// thread ([`Completion::Deferred`]); absent: inside `post`.
    pub(crate) fn from_map(params: &std::collections::BTreeMap<String, String>) -> Result<Self> {
        let mut m = crate::params::ParamMap::new(INPROC, params);
        let completion = match m.millis("deferred_ms")? {
            Some(d) => Completion::Deferred(d),
            None => Completion::Immediate,
        };
        m.finish()?;
        Ok(InprocParams { completion })
    }
}

crate::__backend_plugin!(InprocPlugin, InprocParams, INPROC, |p, ctx| Ok::<_, Error>(
    InprocBackend::with_params(ctx, p)
));

const CONN_MAGIC: &[u8; 6] = b"INPROC";

impl InprocBackend {
    /// Creates the backend for an agent (copies inside `post`).
    pub fn new(ctx: BackendContext) -> Self {
        Self::with_params(ctx, InprocParams::default())
    }

    /// Creates the backend for an agent with `params`.
    pub fn with_params(ctx: BackendContext, params: InprocParams) -> Self {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let ep = Arc::new(Endpoint {
            id,
            notifs: ctx.notifs.clone(),
            regions: RwLock::new(HashMap::new()),
        });
        let mut eps = ENDPOINTS.lock();
        eps.retain(|_, w| w.strong_count() > 0);
        eps.insert(id, Arc::downgrade(&ep));
        InprocBackend {
            sched: Arc::new(Scheduler::new(&format!("nixl-inproc-{id}"))),
            agent: ctx.agent,
            ep,
            peers: Mutex::new(HashMap::new()),
            completion: params.completion,
            wake: ctx.wake,
        }
    }

    fn peer(&self, remote: &str, op: Op) -> Result<Arc<Endpoint>> {
        self.peers
            .lock()
            .get(remote)
            .and_then(Weak::upgrade)
            .ok_or_else(|| Error::disconnected(&self.agent, remote, op, "peer endpoint is gone"))
    }
}

impl Backend for InprocBackend {
    fn name(&self) -> &str {
        INPROC
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            mem_kinds: vec![MemKind::Dram],
            remote: true,
            local: true,
            notifications: true,
            needs_progress: false,
        }
    }

    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        if region.kind != MemKind::Dram {
            return Err(Error::not_supported(
                &self.agent,
                Op::RegisterMem,
                format!("INPROC registers DRAM, not {}", region.kind),
            ));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        self.ep
            .regions
            .write()
            .insert(id, (region.addr, region.len));
        Ok(Arc::new(LocalMd { region: id }))
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        let m = downcast_md::<LocalMd>(&md)
            .ok_or_else(|| Error::invalid(&self.agent, Op::DeregisterMem, "not INPROC metadata"))?;
        self.ep.regions.write().remove(&m.region);
        Ok(())
    }

    fn load_local(&self, _region: &RegionDesc, md: &BackendMd) -> Result<BackendMd> {
        let m = downcast_md::<LocalMd>(md)
            .ok_or_else(|| Error::invalid(&self.agent, Op::PrepXferDlist, "not INPROC metadata"))?;
        Ok(Arc::new(TargetMd {
            ep: Arc::downgrade(&self.ep),
            region: m.region,
        }))
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        self.dram_only(spec.local_kind, spec.remote_kind)?;
        crate::work::tick(spec.segments.len());
        let mut segs = Vec::with_capacity(spec.segments.len());
        let mut target: Option<Weak<Endpoint>> = None;
        for s in &spec.segments {
            let t = self.target_md(spec.md(s.local_md), spec.md(s.remote_md))?;
            target.get_or_insert_with(|| t.ep.clone());
            segs.push((s.local_addr, s.remote_addr, s.len, t.region));
        }
        let target =
            target.ok_or_else(|| Error::invalid(&self.agent, Op::MakeXfer, "no segments"))?;
        Ok(self.xfer(&spec.remote, spec.op, Work::Segs(segs), target, &spec.notif))
    }

    fn wakes(&self) -> bool {
        // Immediate copies end inside `post`; deferred ones wake from the completion thread.
        true
    }

    fn prepare_blocks(&self, spec: &BlockXferSpec) -> Result<Option<Box<dyn BackendXfer>>> {
        // One executor for every request: a block table (whole blocks or tiles) is copied,
        // completed and notified as a segment list is (immediately or deferred alike), its
        // layers and runs walked on each copy (O(layers + runs) here).
        self.dram_only(spec.local_kind, spec.remote_kind)?;
        crate::work::tick(spec.layers.len());
        let mut target: Option<Weak<Endpoint>> = None;
        let mut regions = Vec::with_capacity(spec.layers.len());
        for l in &spec.layers {
            let t = self.target_md(Some(&l.local_md), Some(&l.remote_md))?;
            target.get_or_insert_with(|| t.ep.clone());
            regions.push(t.region);
        }
        let target =
            target.ok_or_else(|| Error::invalid(&self.agent, Op::MakeXfer, "no layers"))?;
        let work = Work::Table {
            spec: spec.clone(),
            regions,
        };
        Ok(Some(self.xfer(
            &spec.remote,
            spec.op,
            work,
            target,
            &spec.notif,
        )))
    }

    fn rearranges_rows(&self) -> bool {
        true
    }

    fn path_report(&self, remote: &str) -> Option<String> {
        self.peers
            .lock()
            .contains_key(remote)
            .then(|| xfer::path(self.completion))
    }

    fn peers(&self) -> Option<&dyn crate::backend::PeerBackend> {
        Some(self)
    }
}

impl InprocBackend {
    /// `NotSupported` unless both sides are DRAM.
    fn dram_only(&self, local: MemKind, remote: MemKind) -> Result<()> {
        if local != MemKind::Dram || remote != MemKind::Dram {
            return Err(Error::not_supported(
                &self.agent,
                Op::MakeXfer,
                "INPROC moves DRAM only",
            ));
        }
        Ok(())
    }

    /// The target's metadata of a pair, both INPROC's (else `InvalidParam`).
    fn target_md<'a>(
        &self,
        local: Option<&BackendMd>,
        remote: Option<&'a BackendMd>,
    ) -> Result<&'a TargetMd> {
        let t = remote.and_then(downcast_md::<TargetMd>).ok_or_else(|| {
            Error::invalid(&self.agent, Op::MakeXfer, "remote metadata is not INPROC's")
        })?;
        local.and_then(downcast_md::<LocalMd>).ok_or_else(|| {
            Error::invalid(&self.agent, Op::MakeXfer, "local metadata is not INPROC's")
        })?;
        Ok(t)
    }

    /// The transfer of `work` to `target`, completed as the backend's mode says.
    fn xfer(
        &self,
        remote: &str,
        op: crate::desc::XferOp,
        work: Work,
        target: Weak<Endpoint>,
        notif: &Option<Vec<u8>>,
    ) -> Box<dyn BackendXfer> {
        let plan = Plan {
            agent: self.agent.clone(),
            remote: remote.to_owned(),
            op,
            work,
            target,
        };
        Box::new(InprocXfer::new(
            plan,
            notif.clone(),
            self.completion,
            self.sched.clone(),
            self.wake.clone(),
        ))
    }
}

impl crate::backend::PeerBackend for InprocBackend {
    fn connection_info(&self) -> Result<Vec<u8>> {
        let mut v = CONN_MAGIC.to_vec();
        v.extend_from_slice(&std::process::id().to_le_bytes());
        v.extend_from_slice(&self.ep.id.to_le_bytes());
        Ok(v)
    }

    fn connect(&self, remote: &str, info: &[u8]) -> Result<()> {
        if info.len() != 18 || &info[..6] != CONN_MAGIC {
            return Err(Error::invalid(
                &self.agent,
                Op::LoadMetadata,
                "malformed INPROC connection info",
            ));
        }
        let mut pid = [0u8; 4];
        pid.copy_from_slice(&info[6..10]);
        if u32::from_le_bytes(pid) != std::process::id() {
            return Err(Error::not_supported(
                &self.agent,
                Op::LoadMetadata,
                format!("{remote} is in another process; INPROC connects agents of one process"),
            ));
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&info[10..18]);
        let id = u64::from_le_bytes(id);
        let ep = ENDPOINTS
            .lock()
            .get(&id)
            .cloned()
            .filter(|w| w.strong_count() > 0);
        let ep = ep.ok_or_else(|| {
            Error::disconnected(
                &self.agent,
                remote,
                Op::LoadMetadata,
                "endpoint no longer exists",
            )
        })?;
        self.peers.lock().insert(remote.to_owned(), ep);
        Ok(())
    }

    fn disconnect(&self, remote: &str) -> Result<()> {
        self.peers.lock().remove(remote);
        Ok(())
    }

    fn public_metadata(&self, md: &BackendMd) -> Result<Vec<u8>> {
        let m = downcast_md::<LocalMd>(md)
            .ok_or_else(|| Error::invalid(&self.agent, Op::LocalMetadata, "not INPROC metadata"))?;
        Ok(m.region.to_le_bytes().to_vec())
    }

    fn load_remote(&self, remote: &str, region: &RegionDesc, public: &[u8]) -> Result<BackendMd> {
        let id = <[u8; 8]>::try_from(public)
            .map(u64::from_le_bytes)
            .map_err(|_| {
                Error::invalid(
                    &self.agent,
                    Op::LoadMetadata,
                    "malformed INPROC region metadata",
                )
            })?;
        let ep = self.peer(remote, Op::LoadMetadata)?;
        let found = ep.regions.read().get(&id).copied();
        if found != Some((region.addr, region.len)) {
            return Err(Error::not_found(
                &self.agent,
                Op::LoadMetadata,
                format!("region {id} of {remote}"),
            ));
        }
        Ok(Arc::new(TargetMd {
            ep: Arc::downgrade(&ep),
            region: id,
        }))
    }

    fn gen_notif(&self, remote: &str, msg: &[u8]) -> Result<()> {
        self.peer(remote, Op::GenNotif)?
            .notifs
            .push(&self.agent, msg.to_vec());
        Ok(())
    }
}
