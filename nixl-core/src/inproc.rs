//! `INPROC`: a pure-Rust backend that moves host memory between agents of one process and to
//! the agent itself.
//!
//! It is a real backend, not a mock: it registers memory, checks every region on every
//! transfer (a deregistered target region fails the transfer instead of being written), and
//! delivers notifications after the data. Use it to test code built on the agent without a
//! network, and wrap it in [`crate::FaultParams`] to inject faults deterministically.

mod blocks;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crate::agent::lock;
use crate::backend::{
    downcast_md, Backend, BackendContext, BackendMd, BackendParams, BackendPlugin, BackendXfer,
    BlockXferSpec, Capabilities, XferSpec, XferState,
};
use crate::desc::XferOp;
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

/// Parameters of the in-process backend.
#[derive(Debug, Clone, Default)]
pub struct InprocParams {}

/// The in-process backend.
pub struct InprocBackend {
    agent: String,
    ep: Arc<Endpoint>,
    peers: Mutex<HashMap<String, Weak<Endpoint>>>,
}

impl std::fmt::Debug for InprocBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InprocBackend")
            .field("agent", &self.agent)
            .field("endpoint", &self.ep.id)
            .finish()
    }
}

impl BackendParams for InprocParams {
    fn backend_name(&self) -> &str {
        INPROC
    }

    fn create(self: Box<Self>, ctx: BackendContext) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(InprocBackend::new(ctx)))
    }
}

/// Creates `INPROC` by name.
#[derive(Debug, Clone, Copy, Default)]
pub struct InprocPlugin;

impl BackendPlugin for InprocPlugin {
    fn name(&self) -> &str {
        INPROC
    }

    fn default_params(&self) -> std::collections::BTreeMap<String, String> {
        std::collections::BTreeMap::new()
    }

    fn parse_params(
        &self,
        params: &std::collections::BTreeMap<String, String>,
    ) -> Result<Box<dyn BackendParams>> {
        crate::params::ParamMap::new(INPROC, params).finish()?;
        Ok(Box::new(InprocParams::default()))
    }
}

const CONN_MAGIC: &[u8; 6] = b"INPROC";

impl InprocBackend {
    /// Creates the backend for an agent.
    pub fn new(ctx: BackendContext) -> Self {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let ep = Arc::new(Endpoint {
            id,
            notifs: ctx.notifs,
            regions: RwLock::new(HashMap::new()),
        });
        let mut eps = lock(&ENDPOINTS);
        eps.retain(|_, w| w.strong_count() > 0);
        eps.insert(id, Arc::downgrade(&ep));
        InprocBackend {
            agent: ctx.agent,
            ep,
            peers: Mutex::new(HashMap::new()),
        }
    }

    fn peer(&self, remote: &str, op: Op) -> Result<Arc<Endpoint>> {
        lock(&self.peers)
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
        let ep = lock(&ENDPOINTS)
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
        lock(&self.peers).insert(remote.to_owned(), ep);
        Ok(())
    }

    fn disconnect(&self, remote: &str) -> Result<()> {
        lock(&self.peers).remove(remote);
        Ok(())
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
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (region.addr, region.len));
        Ok(Arc::new(LocalMd { region: id }))
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        let m = downcast_md::<LocalMd>(&md)
            .ok_or_else(|| Error::invalid(&self.agent, Op::DeregisterMem, "not INPROC metadata"))?;
        self.ep
            .regions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&m.region);
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
        let found = ep
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .copied();
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

    fn load_local(&self, _region: &RegionDesc, md: &BackendMd) -> Result<BackendMd> {
        let m = downcast_md::<LocalMd>(md)
            .ok_or_else(|| Error::invalid(&self.agent, Op::PrepXferDlist, "not INPROC metadata"))?;
        Ok(Arc::new(TargetMd {
            ep: Arc::downgrade(&self.ep),
            region: m.region,
        }))
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        if spec.local_kind != MemKind::Dram || spec.remote_kind != MemKind::Dram {
            return Err(Error::not_supported(
                &self.agent,
                Op::MakeXfer,
                "INPROC moves DRAM only",
            ));
        }
        crate::work::tick(spec.segments.len());
        let mut segs = Vec::with_capacity(spec.segments.len());
        let mut target: Option<Weak<Endpoint>> = None;
        for s in &spec.segments {
            let t = spec
                .md(s.remote_md)
                .and_then(downcast_md::<TargetMd>)
                .ok_or_else(|| {
                    Error::invalid(&self.agent, Op::MakeXfer, "remote metadata is not INPROC's")
                })?;
            spec.md(s.local_md)
                .and_then(downcast_md::<LocalMd>)
                .ok_or_else(|| {
                    Error::invalid(&self.agent, Op::MakeXfer, "local metadata is not INPROC's")
                })?;
            target.get_or_insert_with(|| t.ep.clone());
            segs.push((s.local_addr, s.remote_addr, s.len, t.region));
        }
        let target =
            target.ok_or_else(|| Error::invalid(&self.agent, Op::MakeXfer, "no segments"))?;
        Ok(Box::new(InprocXfer {
            agent: self.agent.clone(),
            remote: spec.remote.clone(),
            op: spec.op,
            segs,
            target,
            notif: spec.notif.clone(),
        }))
    }

    fn prepare_blocks(&self, spec: &BlockXferSpec) -> Result<Option<Box<dyn BackendXfer>>> {
        Ok(Some(Box::new(blocks::prepare(self, spec)?)))
    }

    fn gen_notif(&self, remote: &str, msg: &[u8]) -> Result<()> {
        self.peer(remote, Op::GenNotif)?
            .notifs
            .push(&self.agent, msg.to_vec());
        Ok(())
    }

    fn path_report(&self, remote: &str) -> Option<String> {
        lock(&self.peers)
            .contains_key(remote)
            .then(|| "in-process memcpy".to_owned())
    }
}

struct InprocXfer {
    agent: String,
    remote: String,
    op: XferOp,
    /// (local addr, remote addr, len, remote region id)
    segs: Vec<(u64, u64, u64, u64)>,
    target: Weak<Endpoint>,
    notif: Option<Vec<u8>>,
}

impl BackendXfer for InprocXfer {
    fn post(&mut self) -> Result<XferState> {
        let ep = self.target.upgrade().ok_or_else(|| {
            Error::disconnected(
                &self.agent,
                &self.remote,
                Op::PostXfer,
                "peer endpoint is gone",
            )
        })?;
        let regions = ep.regions.read().unwrap_or_else(|p| p.into_inner());
        crate::work::tick(2 * self.segs.len());
        for &(_, raddr, len, region) in &self.segs {
            match regions.get(&region) {
                Some(&(a, l)) if raddr >= a && raddr + len <= a + l => {}
                _ => {
                    return Err(Error::disconnected(
                        &self.agent,
                        &self.remote,
                        Op::PostXfer,
                        "target region was deregistered",
                    ))
                }
            }
        }
        for &(laddr, raddr, len, _) in &self.segs {
            let (src, dst) = match self.op {
                XferOp::Write => (laddr, raddr),
                XferOp::Read => (raddr, laddr),
            };
            // SAFETY: the local range lies in a registration the request keeps alive; the
            // remote range lies in a region checked above as still registered, and the read
            // lock held here keeps it registered (its owner cannot deregister and free it)
            // until the copy ends. `copy` tolerates overlap for loopback transfers.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        }
        drop(regions);
        if let Some(n) = &self.notif {
            ep.notifs.push(&self.agent, n.clone());
        }
        Ok(XferState::Done)
    }

    fn check(&mut self) -> Result<XferState> {
        Ok(XferState::Done)
    }

    fn cancel(&mut self) -> Result<()> {
        // Copies finish inside `post`; nothing is ever in flight.
        Ok(())
    }

    fn path(&self) -> Option<String> {
        Some("in-process memcpy".to_owned())
    }

    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        self.notif = msg.map(<[u8]>::to_vec);
        Ok(())
    }
}
