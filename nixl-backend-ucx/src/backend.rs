//! The `UCX` backend: the [`nixl_core::backend::Backend`] implementation over the safe layer.

use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nixl_core::backend::{
    downcast_md, Backend, BackendContext, BackendMd, BackendXfer, BlockXferSpec, PeerAuth,
    Sessions, XferSpec,
};
use nixl_core::backend::{Capabilities, CostEstimate, CostMethod};
use nixl_core::{Error, MemKind, Op, RegionDesc, Result};

use crate::context::Context;
use crate::endpoint::Peer;
use crate::error::UCX;
use crate::loader::{self, Ucx};
use crate::memory::{MemReg, RemoteMd};
use crate::params::UcxParams;
use crate::sys;
use crate::validate::Shapes;
use crate::wire;
use crate::work::Work;
use crate::worker::Worker;
use crate::xfer::{Notif, UcxXfer};

/// The UCX backend of one agent.
pub struct UcxBackend {
    pub(crate) agent: String,
    /// Wakes the agent's futures when a post finishes (from UCX callbacks).
    wake: nixl_core::backend::Wake,
    pub(crate) ucx: Arc<Ucx>,
    ctx: Arc<Context>,
    pub(crate) workers: Vec<Arc<Worker>>,
    pub(crate) peers: Mutex<HashMap<String, Arc<Peer>>>,
    self_peer: Mutex<Option<Arc<Peer>>>,
    /// Signs this agent's hellos and checks peers'.
    peer_auth: PeerAuth,
    /// Sessions peers opened with their hellos (who each notification is from).
    sessions: Arc<Sessions>,
    /// The shapes of this UCX's addresses and keys, for checking peers' (`crate::validate`).
    pub(crate) shapes: RwLock<Shapes>,
    pub(crate) next_worker: AtomicUsize,
    params: UcxParams,
    /// This process, as announced in the connection info (for peers' direct CMA).
    process: Option<nixl_core::backend::ProcessId>,
    /// Threads for large direct CMA copies, started at the first request that uses them.
    cma_pool: OnceLock<Option<Arc<crate::direct_cma::CopyPool>>>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// This backend's workers in the process's list of its own (`crate::conn::own`).
    _own: nixl_core::backend::own::OwnGuard<crate::validate::Entry>,
}

impl std::fmt::Debug for UcxBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UcxBackend")
            .field("agent", &self.agent)
            .field("ucx", &self.ucx)
            .field("workers", &self.workers.len())
            .finish()
    }
}

/// Creates `UCX` by name from a string map (see [`UcxParams::from_map`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct UcxPlugin;

impl UcxParams {
    /// The string-map form of the defaults (the plugin's `default_params`).
    pub(crate) fn default_map() -> BTreeMap<String, String> {
        UcxParams::default().to_map()
    }
}

nixl_core::__backend_plugin!(UcxPlugin, UcxParams, UCX, |p, ctx| UcxBackend::new(p, ctx));

/// Loads UCX as `params` would and returns its version (`"1.22.0"`) and path; for tests
/// and tools that skip when UCX is absent.
pub fn probe(params: &UcxParams) -> Result<(String, std::path::PathBuf)> {
    let u = loader::load(params.library_path.as_deref())?;
    Ok((u.version_string(), u.path.clone()))
}

/// What each active-message id means to this backend: our notifications and connection hellos
/// (`crate::session`), and the notifications of stock NIXL agents (`crate::nixl`, id 0 as in
/// `nixl_core::nixl_wire::notif`). Every worker installs this table.
/// The longest a worker's connection to itself may take at start-up (`crate::endpoint::warm_up`).
const WARM_UP_BUDGET: Duration = Duration::from_millis(200);

const AM_ROUTES: &[(u32, crate::worker::AmRoute)] = &[
    (crate::session::AM_NOTIF, crate::session::on_notif),
    (crate::session::AM_HELLO, crate::session::on_hello),
    (crate::session::AM_NIXL, crate::nixl::on_nixl_notif),
];

impl UcxBackend {
    /// A notification's send to `remote` that UCX ended with `st`.
    fn notif_failed(&self, remote: &str, st: sys::ucs_status_t) -> Error {
        let call = "ucp_am_send_nbx";
        crate::error::status_error(&self.ucx, &self.agent, Some(remote), Op::GenNotif, call, st)
    }

    /// Creates the backend: loads UCX, creates the context, workers and progress threads (and,
    /// with [`UcxParams::warm_up`], connects each worker with a temporary one first).
    pub fn new(params: UcxParams, bctx: BackendContext) -> Result<Self> {
        params.validate()?;
        let agent = bctx.agent;
        let wake = bctx.wake.clone();
        let ucx = loader::load(params.library_path.as_deref())?;
        if params.num_workers > 1 && ucx.version < (1, 23, 0) {
            // docs/reliability.md, "Known bugs": with several workers, UCX 1.22's tcp put
            // emulation dereferences a NULL receive buffer (uct_tcp_ep_progress_put_rx) in
            // 20-40% of runs of scenarios.rs::several_workers_spread_requests_tcp; the same test
            // passes every run on UCX 1.23.
            tracing::warn!(agent = %agent, version = %ucx.version_string(), num_workers = params.num_workers,
                "UCX before 1.23 can crash with several workers when peers are reached over its tcp transport; use num_workers = 1 there or UCX >= 1.23");
        }
        let ctx = Context::new(
            ucx.clone(),
            &agent,
            &params.ucx_config(ucx.version),
            params.nixl_compat,
            params.progress_thread,
        )?;
        let sessions = Arc::new(Sessions::default());
        let workers = (0..params.num_workers)
            .map(|i| {
                Worker::new(
                    ctx.clone(),
                    i,
                    &agent,
                    bctx.notifs.clone(),
                    bctx.peers.clone(),
                    sessions.clone(),
                    AM_ROUTES,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        if params.warm_up {
            for w in &workers {
                crate::endpoint::warm_up(&agent, w, WARM_UP_BUDGET);
            }
        }
        let shapes = own_shapes(&ctx, &agent, &workers)?;
        let own = {
            let addrs: Vec<&[u8]> = workers.iter().map(|w| w.address()).collect();
            crate::conn::own::add(&agent, &addrs, ctx.ucx.version.1)
        };
        let b = UcxBackend {
            agent,
            wake,
            ucx,
            ctx,
            workers,
            shapes: RwLock::new(shapes),
            peers: Mutex::new(HashMap::new()),
            self_peer: Mutex::new(None),
            peer_auth: bctx.peers,
            sessions,
            next_worker: AtomicUsize::new(0),
            params,
            process: nixl_core::backend::ProcessId::current(),
            cma_pool: OnceLock::new(),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
            _own: own,
        };
        if b.params.progress_thread {
            for w in &b.workers {
                let (w, stop, spin) = (w.clone(), b.stop.clone(), b.params.progress_spin);
                let h = std::thread::Builder::new()
                    .name(format!("nixl-ucx-{}", w.index))
                    .spawn(move || {
                        // Polling without sleeping until `spin` after the last event.
                        let mut awake_until = Instant::now();
                        while !stop.load(Ordering::Acquire) {
                            let spinning = !spin.is_zero() && Instant::now() < awake_until;
                            let wait = if spinning {
                                Duration::ZERO
                            } else {
                                Duration::from_millis(100)
                            };
                            if w.progress_or_wait(wait) {
                                if !spin.is_zero() {
                                    awake_until = Instant::now() + spin;
                                }
                            } else if spinning {
                                std::thread::yield_now();
                            }
                            nixl_core::backend::fire_due_timers();
                        }
                    })
                    .map_err(|e| Error::io(&b.agent, Op::CreateBackend, e))?;
                b.threads.lock().push(h);
            }
        }
        tracing::debug!(agent = %b.agent, ucx = %b.ucx.version_string(), workers = b.workers.len(), "UCX backend created");
        Ok(b)
    }

    /// The loaded UCX version (`"1.22.0"`).
    pub fn ucx_version(&self) -> String {
        self.ucx.version_string()
    }

    /// Notifications dropped because they came on a connection without an accepted hello
    /// (an unknown session, or a session used on another connection).
    pub fn unattributed_notifs(&self) -> u64 {
        self.sessions.unattributed()
    }

    /// Where UCX was loaded from.
    pub fn ucx_path(&self) -> &std::path::Path {
        &self.ucx.path
    }

    fn peer(&self, remote: &str, op: Op) -> Result<Arc<Peer>> {
        self.peers
            .lock()
            .get(remote)
            .cloned()
            .ok_or_else(|| Error::disconnected(&self.agent, remote, op, "not connected over UCX"))
    }

    fn self_peer(&self) -> Result<Arc<Peer>> {
        let mut g = self.self_peer.lock();
        if let Some(p) = g.as_ref() {
            return Ok(p.clone());
        }
        let addrs: Vec<Vec<u8>> = self.workers.iter().map(|w| w.address().to_vec()).collect();
        let mut p = Peer::connect(&self.agent, &self.agent, &self.workers, &addrs, false)?;
        p.address = {
            let shapes = self.shapes.read();
            addrs.first().and_then(|a| shapes.check_address(a).ok())
        };
        crate::session::introduce(&self.ucx, &self.peer_auth, &mut p)?;
        let p = Arc::new(p);
        *g = Some(p.clone());
        Ok(p)
    }

    pub(crate) fn agent(&self) -> &str {
        &self.agent
    }

    /// A prepared transfer over `work` on `worker`'s endpoint to `peer`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn xfer(
        &self,
        peer: Arc<Peer>,
        worker: usize,
        op: nixl_core::XferOp,
        (mem_type, remote_type): (
            Option<sys::ucs_memory_type_t>,
            Option<sys::ucs_memory_type_t>,
        ),
        work: Work,
        notif: Option<&[u8]>,
        keep: nixl_core::backend::MdTable,
    ) -> Result<UcxXfer> {
        let header = self.session_header(&peer, worker, Op::MakeXfer)?;
        let notif = notif.map(|m| crate::xfer::make_notif(&self.agent, &header, &peer, m));
        let bytes = work.bytes();
        let mem_type = mem_type.unwrap_or(sys::UCS_MEMORY_TYPE_HOST);
        // Host memory to host memory of a live process of this host that UCX reaches with
        // cma: the backend makes those copies itself (`crate::cma`). Never with device memory
        // on either side: the system calls reach a process's host address space only.
        let host_to_host =
            mem_type == sys::UCS_MEMORY_TYPE_HOST && remote_type == Some(sys::UCS_MEMORY_TYPE_HOST);
        let direct = match &peer.cma {
            Some(target) if host_to_host && !peer.nixl => {
                let pe = &peer.eps[worker];
                let g = pe.worker.lock();
                pe.uses_cma(&g)
                    .then(|| crate::direct_cma::Direct::new(target.clone(), &work))
            }
            _ => None,
        };
        let pool = match (&direct, self.params.cma_threads) {
            (Some(_), n) if n > 0 => self
                .cma_pool
                .get_or_init(|| match crate::direct_cma::CopyPool::start(&self.agent, n) {
                    Ok(p) => Some(Arc::new(p)),
                    Err(e) => {
                        tracing::warn!(agent = %self.agent, error = %e, "could not start direct CMA copy threads; copying inside post");
                        None
                    }
                })
                .clone(),
            _ => None,
        };
        Ok(UcxXfer {
            direct,
            pool,
            flight: None,
            bytes,
            agent: self.agent.clone(),
            ucx: self.ucx.clone(),
            wake: self.wake.clone(),
            peer,
            worker,
            op,
            mem_type,
            work,
            notif,
            header,
            cancel_timeout: self.params.cancel_timeout,
            _keep: keep,
            cur: None,
            path: OnceLock::new(),
        })
    }

    /// The notification header for `peer` on `worker`'s endpoint: the session its hello
    /// opened (nixl-rs peers), or none (stock NIXL peers, whose notifications name the sender
    /// in the payload).
    fn session_header(&self, peer: &Peer, worker: usize, op: Op) -> Result<Arc<[u8]>> {
        if peer.nixl {
            return Ok(Arc::from(&[][..]));
        }
        peer.headers
            .get(worker)
            .cloned()
            .ok_or_else(|| Error::invalid(&self.agent, op, "UCX endpoint without a session header"))
    }

    /// A notification to `peer` on `worker`'s endpoint, in the format the peer reads.
    fn notif_for(&self, peer: &Peer, worker: usize, msg: &[u8], op: Op) -> Result<Notif> {
        let header = self.session_header(peer, worker, op)?;
        Ok(crate::xfer::make_notif(&self.agent, &header, peer, msg))
    }

    pub(crate) fn reg<'a>(&self, md: &'a BackendMd, op: Op) -> Result<&'a MemReg> {
        downcast_md::<MemReg>(md)
            .ok_or_else(|| Error::invalid(&self.agent, op, "not UCX registration metadata"))
    }
}

/// Learns the shapes of this UCX's own worker addresses and host-memory keys; fails when
/// its format is not the one `crate::validate` knows (nothing a peer sends could be checked).
fn own_shapes(ctx: &Arc<Context>, agent: &str, workers: &[Arc<Worker>]) -> Result<Shapes> {
    let addrs: Vec<&[u8]> = workers.iter().map(|w| w.address()).collect();
    let minor = ctx.ucx.version.1;
    let mut shapes = Shapes::from_own(&addrs, minor).map_err(|e| Error::Unavailable {
        what: format!(
            "checking peers' UCX {} worker addresses",
            ctx.ucx.version_string()
        ),
        hint: format!(
            "this UCX packs its worker address in a form nixl-rs does not know ({e}); \
             unified mode (UCX_UNIFIED_MODE=y) is not supported"
        ),
    })?;
    // One page registered and unregistered at once: the packed size of each memory domain's
    // part of a host-memory key.
    let page = vec![0u8; 4096];
    let region = RegionDesc {
        kind: MemKind::Dram,
        addr: page.as_ptr() as u64,
        len: page.len() as u64,
        dev_id: 0,
        meta: Vec::new(),
    };
    let reg = MemReg::map(ctx, agent, &region)?;
    if let (Ok((_, packed)), Some(a)) = (wire::decode_rkey(&reg.public), addrs.first()) {
        shapes.learn_rkey(packed, a);
    }
    drop(reg);
    drop(page);
    Ok(shapes)
}

impl Drop for UcxBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for w in &self.workers {
            w.signal();
        }
        for t in std::mem::take(&mut *self.threads.lock()) {
            if t.join().is_err() {
                tracing::error!(agent = %self.agent, "UCX progress thread panicked");
            }
        }
    }
}

impl Backend for UcxBackend {
    fn wakes(&self) -> bool {
        // Every post ends in `PostState::finish` (a UCX callback, a direct copy's last piece
        // or `post` itself), which wakes the agent.
        true
    }

    fn name(&self) -> &str {
        UCX
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::network(self.ctx.cuda_aware(), !self.params.progress_thread)
    }

    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        let reg = MemReg::map(&self.ctx, &self.agent, region)?;
        if region.kind != MemKind::Dram {
            // Keys of other memory (VRAM) name memory domains a host page does not.
            if let (Ok((_, packed)), Some(w)) =
                (wire::decode_rkey(&reg.public), self.workers.first())
            {
                self.shapes.write().learn_rkey(packed, w.address());
            }
        }
        Ok(Arc::new(reg))
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        self.reg(&md, Op::DeregisterMem)?;
        match md.downcast::<MemReg>() {
            Ok(arc) => match Arc::try_unwrap(arc) {
                Ok(reg) => reg.unmap(&self.agent),
                // Still referenced by a prepared list or request: unmapped when the last goes.
                Err(_) => Ok(()),
            },
            Err(_) => Err(Error::invalid(
                &self.agent,
                Op::DeregisterMem,
                "not UCX registration metadata",
            )),
        }
    }

    fn load_local(&self, region: &RegionDesc, md: &BackendMd) -> Result<BackendMd> {
        let public = self.reg(md, Op::PrepXferDlist)?.public.clone();
        let peer = self.self_peer()?;
        let shapes = self.shapes.read();
        Ok(Arc::new(RemoteMd::unpack(
            &self.agent,
            &peer,
            region,
            &public,
            &shapes,
        )?))
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        Ok(Box::new(self.prepare_segments(spec)?))
    }

    fn prepare_blocks(&self, spec: &BlockXferSpec) -> Result<Option<Box<dyn BackendXfer>>> {
        Ok(Some(Box::new(self.prepare_block_table(spec)?)))
    }

    fn progress(&self) -> Result<bool> {
        let mut any = false;
        for w in &self.workers {
            let mut g = w.lock();
            any |= g.progress_all() > 0;
            g.close_graves(Duration::ZERO);
        }
        Ok(any)
    }

    fn estimate_cost(&self, spec: &XferSpec) -> Result<Option<CostEstimate>> {
        let Some(first) = spec.segments.first() else {
            return Ok(None);
        };
        let Some(r) = spec.md(first.remote_md).and_then(downcast_md::<RemoteMd>) else {
            return Ok(None);
        };
        let pe = &r.peer.eps[0];
        let g = pe.worker.lock();
        let Some(ep) = pe.raw(&g) else {
            return Ok(None);
        };
        let mut sizes: BTreeMap<u64, u64> = BTreeMap::new();
        for s in &spec.segments {
            *sizes.entry(s.len).or_default() += 1;
        }
        let mut secs = 0.0f64;
        for (len, count) in sizes {
            let t = match g.h_ref().ep_estimate(ep, len) {
                Ok(t) if t.is_finite() && t >= 0.0 => t,
                _ => return Ok(None),
            };
            secs += t * count as f64;
        }
        let duration = Duration::from_secs_f64(secs);
        Ok(Some(CostEstimate {
            duration,
            error_margin: duration / 2,
            method: CostMethod::Analytical,
        }))
    }

    fn nixl_wire(&self) -> Option<&dyn nixl_core::nixl_wire::NixlWire> {
        Some(self)
    }

    fn path_report(&self, remote: &str) -> Option<String> {
        let peer = if remote == self.agent {
            self.self_peer.lock().clone()
        } else {
            self.peers.lock().get(remote).cloned()
        };
        peer.map(|p| p.transports())
    }

    fn peers(&self) -> Option<&dyn nixl_core::backend::PeerBackend> {
        Some(self)
    }
}

impl nixl_core::backend::PeerBackend for UcxBackend {
    fn connection_info(&self) -> Result<Vec<u8>> {
        let addrs: Vec<&[u8]> = self.workers.iter().map(|w| w.address()).collect();
        Ok(wire::encode_conn_with(&addrs, self.process.as_ref()))
    }

    fn connect(&self, remote: &str, info: &[u8]) -> Result<()> {
        self.connect_peer(remote, info, None)
    }

    fn connect_peer(
        &self,
        remote: &str,
        info: &[u8],
        process: Option<&nixl_core::backend::PeerProcess>,
    ) -> Result<()> {
        let wire::ConnInfo {
            addresses: addrs,
            process: claimed,
        } = wire::decode_conn_info(info).map_err(|e| {
            Error::invalid(
                &self.agent,
                Op::LoadMetadata,
                format!("malformed UCX connection info from {remote}: {e}"),
            )
        })?;
        self.connect_to(remote, addrs, claimed, process)
    }

    fn disconnect(&self, remote: &str) -> Result<()> {
        let Some(peer) = self.peers.lock().remove(remote) else {
            return Ok(());
        };
        // Direct copies to it stop before this returns: no byte of its requests lands after.
        if let Some(t) = &peer.cma {
            t.revoke();
        }
        // Never force-closes a tcp endpoint with operations in flight (that crashes UCX
        // 1.22's tcp progress): each endpoint drains for up to `cancel_timeout`, and what is
        // still in flight over tcp is fenced and closed by UCX in flush mode later. Requests
        // still using the peer are fenced by the agent; their cancel keeps (leaks) the memory
        // of any operation UCX has not released.
        for pe in &peer.eps {
            if pe.park_if_idle() {
                tracing::debug!(agent = %self.agent, remote, worker = pe.worker.index, "UCX endpoint kept for the next peer at its address");
                continue;
            }
            let how = pe.close_early(self.params.cancel_timeout);
            tracing::debug!(agent = %self.agent, remote, worker = pe.worker.index, ?how, "UCX endpoint closed for disconnect");
        }
        Ok(())
    }

    fn public_metadata(&self, md: &BackendMd) -> Result<Vec<u8>> {
        Ok(self.reg(md, Op::LocalMetadata)?.public.clone())
    }

    fn public_metadata_ref<'a>(&self, md: &'a BackendMd) -> Option<&'a [u8]> {
        downcast_md::<MemReg>(md).map(|r| r.public.as_slice())
    }

    fn post_notif(&self, remote: &str, msg: &[u8]) -> Result<()> {
        let peer = self.peer(remote, Op::GenNotif)?;
        peer.check_alive(&self.agent, 0, Op::GenNotif)?;
        let pe = &peer.eps[0];
        let posted = pe.shared.posted.fetch_add(1, Ordering::AcqRel);
        if posted >= crate::notify::MAX_POSTED {
            pe.shared.posted.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::limit(
                &self.agent,
                Op::GenNotif,
                format!("control messages in flight to {remote}"),
                crate::notify::MAX_POSTED,
            ));
        }
        let (id, header, msg) = match self.notif_for(&peer, 0, msg, Op::GenNotif) {
            Ok(n) => n,
            Err(e) => {
                pe.shared.posted.fetch_sub(1, Ordering::AcqRel);
                return Err(e);
            }
        };
        let p = Arc::new(crate::notify::Posted {
            ucx: self.ucx.clone(),
            shared: pe.shared.clone(),
            id,
            header,
            msg,
        });
        let mut g = pe.worker.lock();
        let Some(ep) = pe.notif_raw(&g) else {
            pe.shared.posted.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::disconnected(
                &self.agent,
                remote,
                Op::GenNotif,
                "UCX endpoint was closed",
            ));
        };
        // Counted in flight, so closing the endpoint early drains it first.
        pe.shared.begin_op();
        // The endpoint is live under the held lock; the bytes live in `p` until the callback.
        if let Some(st) = sys::am_send(&g.h().locked(), ep, &p) {
            p.ended();
            if st != sys::UCS_OK {
                return Err(self.notif_failed(remote, st));
            }
        }
        Ok(())
    }

    fn peer_failed(&self, remote: &str) -> Option<String> {
        let peer = self.peers.lock().get(remote)?.clone();
        peer.eps.iter().find_map(|pe| {
            pe.shared
                .failed()
                .filter(|st| *st != sys::UCS_ERR_CANCELED)
                .map(|st| format!("UCX endpoint failed: {}", self.ucx.status_string(st)))
        })
    }

    fn load_remote(&self, remote: &str, region: &RegionDesc, public: &[u8]) -> Result<BackendMd> {
        let peer = self.peer(remote, Op::LoadMetadata)?;
        let shapes = self.shapes.read();
        Ok(Arc::new(RemoteMd::unpack(
            &self.agent,
            &peer,
            region,
            public,
            &shapes,
        )?))
    }

    fn gen_notif(&self, remote: &str, msg: &[u8]) -> Result<()> {
        let peer = if remote == self.agent {
            self.self_peer()?
        } else {
            self.peer(remote, Op::GenNotif)?
        };
        peer.check_alive(&self.agent, 0, Op::GenNotif)?;
        let pe = &peer.eps[0];
        let deadline = Instant::now() + self.params.cancel_timeout;
        // The notification follows the data of earlier posts: a direct CMA flight still
        // copying on this endpoint finishes first (helped along here), within this call's
        // deadline.
        let prev = pe.last_flight.lock().upgrade();
        if let Some(f) = prev {
            if !f.wait_finished(deadline) {
                return Err(Error::TimedOut {
                    agent: self.agent.clone(),
                    op: Op::GenNotif,
                    elapsed: self.params.cancel_timeout,
                });
            }
        }
        let (am_id, hdr, buf) = self.notif_for(&peer, 0, msg, Op::GenNotif)?;
        let flags = crate::session::am_flags(am_id);
        let sent = {
            let mut g = pe.worker.lock();
            let ep = pe.notif_raw(&g).ok_or_else(|| {
                Error::disconnected(&self.agent, remote, Op::GenNotif, "UCX endpoint was closed")
            })?;
            g.h().am_send_request(ep, (am_id, flags), hdr, buf)
        };
        // Waited for without holding the worker: a peer that does not take the message costs
        // this call its deadline and nobody else anything.
        match pe.worker.wait_request(sent.req, deadline) {
            Some(st) if st == sys::UCS_OK => Ok(()),
            Some(st) => Err(self.notif_failed(remote, st)),
            None => {
                // Still in flight inside UCX, which may read the buffers: they stay. Counted
                // (never uncounted) so closing the endpoint early drains it first.
                sent.bufs.leak();
                pe.shared.begin_op();
                Err(Error::TimedOut {
                    agent: self.agent.clone(),
                    op: Op::GenNotif,
                    elapsed: self.params.cancel_timeout,
                })
            }
        }
    }
}

impl UcxBackend {
    /// Connects to `remote`'s workers (its connection info decoded).
    fn connect_to(
        &self,
        remote: &str,
        addrs: Vec<Vec<u8>>,
        claimed: Option<nixl_core::backend::ProcessId>,
        process: Option<&nixl_core::backend::PeerProcess>,
    ) -> Result<()> {
        let mut checked = Vec::with_capacity(addrs.len());
        {
            let shapes = self.shapes.read();
            for a in &addrs {
                let c = shapes.check_address(a).map_err(|e| {
                    Error::invalid(
                        &self.agent,
                        Op::LoadMetadata,
                        format!("refused a UCX worker address of {remote}: {e}"),
                    )
                })?;
                self.check_named_processes(remote, &shapes.named_processes(&c), process)?;
                self.check_named_workers(remote, &c, process)?;
                checked.push(c);
            }
        }
        if let Some(p) = process {
            // The agent proved which process the peer is: connection info naming another is
            // a lie about where its memory is.
            if claimed.as_ref() != Some(p.id()) {
                return Err(Error::not_allowed(
                    &self.agent,
                    Op::LoadMetadata,
                    format!(
                        "{remote}'s UCX connection info names another process ({:?}) than the \
                         one its metadata was proven to come from (pid {}): refused",
                        claimed.map(|c| c.pid),
                        p.id().pid
                    ),
                ));
            }
        }
        let mut peer = Peer::connect(
            &self.agent,
            remote,
            &self.workers,
            &addrs,
            self.params.shm_notifications,
        )?;
        peer.address = checked.into_iter().next();
        if self.params.direct_cma {
            peer.cma = self.cma_target(claimed.as_ref(), process);
        }
        crate::session::introduce(&self.ucx, &self.peer_auth, &mut peer)?;
        if let Some(old) = self.peers.lock().insert(remote.to_owned(), Arc::new(peer)) {
            tracing::debug!(agent = %self.agent, remote, "replaced UCX endpoints of {}", old.name);
        }
        Ok(())
    }

    /// Refuses a peer whose worker address names, for UCX's same-host copies (cma, posix
    /// through procfs), a process other than its own: UCX would read and write that process's
    /// memory for requests to the peer. Where the agent proved the peer's process, that one
    /// only; where it could not (another host, a stock NIXL peer), never this process, which
    /// a real peer in it would have been proven to be.
    fn check_named_processes(
        &self,
        remote: &str,
        named: &[(&'static str, u32)],
        process: Option<&nixl_core::backend::PeerProcess>,
    ) -> Result<()> {
        for &(tl, pid) in named {
            let ok = match process {
                Some(p) => pid == p.id().pid,
                None => pid != std::process::id(),
            };
            if !ok {
                return Err(Error::not_allowed(
                    &self.agent,
                    Op::LoadMetadata,
                    format!(
                        "{remote}'s UCX worker address names process {pid} for {tl} copies, \
                         which is not {remote}'s own process: refused"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Refuses a peer whose worker address names a worker of this process (`crate::conn::own`)
    /// unless the peer is the agent here that owns it: UCX's emulated puts and gets through
    /// that worker would write and read this process's memory wherever the peer's metadata
    /// says. nixl-core loads metadata that names this process only from a live agent of it,
    /// with that agent's own registrations.
    fn check_named_workers(
        &self,
        remote: &str,
        address: &crate::validate::Address,
        process: Option<&nixl_core::backend::PeerProcess>,
    ) -> Result<()> {
        let here = process.is_some_and(|p| p.is_this_process());
        match crate::conn::own::foreign_owner(address, remote, here) {
            None => Ok(()),
            Some(owner) => Err(Error::not_allowed(
                &self.agent,
                Op::LoadMetadata,
                format!(
                    "{remote}'s UCX worker address names a worker of this process (agent \
                     {owner}'s): UCX would move its bytes within this process; refused"
                ),
            )),
        }
    }

    /// The process direct CMA copies to `remote` aim at: the one the agent bound when it
    /// loaded the peer (a pidfd of a thread-group leader whose start time matched), only when
    /// the peer's UCX connection info names the same process, and this very process only
    /// when the caller trusts its in-process peers (`direct_cma_same_process`). Otherwise
    /// `None`, and UCX makes the copies.
    fn cma_target(
        &self,
        claimed: Option<&nixl_core::backend::ProcessId>,
        process: Option<&nixl_core::backend::PeerProcess>,
    ) -> Option<crate::direct_cma::Target> {
        // `connect_to` refused connection info naming another process than `process`.
        let p = process?;
        if claimed != Some(p.id()) {
            return None;
        }
        if p.is_this_process() && !self.params.direct_cma_same_process {
            return None;
        }
        Some(crate::direct_cma::Target::new(p.clone()))
    }
}
