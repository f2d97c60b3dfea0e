//! Endpoints to peers: one per (peer, local worker), created from the peer's worker addresses
//! with UCX's peer error handling, so a dead peer fails its requests instead of hanging them.
//!
//! A peer on the same host also gets a notification endpoint (without peer error handling, the
//! condition under which UCX may carry active messages over shared memory): notifications then
//! cost a shared-memory write instead of a loopback TCP send (3 us instead of ~20 us from post
//! to the target seeing it on the dev VM). Data never uses it, and a notification is only sent
//! once the data endpoint's flush completed, so notifications still follow their data; a dead
//! peer is detected on the data endpoint, which closes both.
//!
//! Closing an endpoint early (a cancel that outlived its timeout, a peer forgotten with
//! `invalidate_remote_metadata`) never force-closes a tcp endpoint with operations in flight:
//! UCX 1.22's tcp transport crashes in its progress (SIGSEGV in `uct_tcp_iface_handle_events`)
//! when that happens. [`PeerEp::close_early`] drains the endpoint first (bounded); what does
//! not drain over tcp is fenced (no new operation can start on it) and closed in UCX's flush
//! mode from the worker's graveyard, so UCX finishes the operations and releases it when the
//! peer answers or fails.
//!
//! **Forgetting a peer.** Closing an endpoint to a peer that stays alive does not close UCX's
//! connection: the peer's worker keeps the endpoint UCX made for our connection request, and
//! each side keeps its half of the connection (a tcp socket, shared-memory mappings) until
//! that worker goes. A peer forgotten and loaded again and again (a decode instance that
//! reloads a prefill's metadata, a service that forgets idle peers) would cost a connection on
//! both sides each time. So a forgotten peer's endpoint that is healthy and has nothing in
//! flight is fenced and kept by its worker ([`crate::worker::Idle`], at most
//! [`crate::worker::MAX_IDLE`] per worker, the oldest closed past that), and the next peer
//! loaded at the same worker address gets it back, with a new hello (`crate::session`).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::{Error, Op, Result};

use crate::error::status_error;
use crate::sys;
use crate::worker::{Grave, Worker, WorkerGuard};

/// State the endpoint's error handler writes, and what the backend's requests on it share.
#[derive(Debug, Default)]
pub(crate) struct EpShared {
    failed: AtomicBool,
    status: AtomicI32,
    /// Set (under the worker lock) once the endpoint was closed or fenced early: nothing new
    /// may start on it, and callbacks of earlier operations must not send on it.
    closed: AtomicBool,
    /// Posts (and timed-out notifications) on this endpoint that UCX has not completed yet.
    inflight: AtomicUsize,
    /// Set when the peer replaced the connection this endpoint shares with it
    /// (`crate::links`): the peer drops what arrives on it, so nothing new may be sent.
    replaced: AtomicBool,
    /// Control messages posted ([`crate::notify::Posted`]) that UCX has not sent yet.
    pub(crate) posted: AtomicUsize,
}

impl EpShared {
    /// Whether the endpoint was closed or fenced early.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Marks the endpoint replaced by its peer (`crate::links`).
    pub(crate) fn replace(&self) {
        self.replaced.store(true, Ordering::Release);
    }

    /// Whether the peer replaced the connection (see [`EpShared::replace`]).
    pub(crate) fn is_replaced(&self) -> bool {
        self.replaced.load(Ordering::Acquire)
    }

    /// Opens a kept endpoint again for a new peer (`crate::worker::Idle`): it was fenced
    /// with nothing in flight, and nothing started on it since.
    fn reopen(&self) {
        self.closed.store(false, Ordering::Release);
    }

    /// One more operation in flight.
    pub(crate) fn begin_op(&self) {
        self.inflight.fetch_add(1, Ordering::AcqRel);
    }

    /// One operation fewer in flight.
    pub(crate) fn end_op(&self) {
        // Saturating: a count can never wrap into "many in flight".
        let _ = self
            .inflight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Operations in flight.
    pub(crate) fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Acquire)
    }

    pub(crate) fn failed(&self) -> Option<sys::ucs_status_t> {
        self.failed
            .load(Ordering::Acquire)
            .then(|| self.status.load(Ordering::Acquire) as sys::ucs_status_t)
    }

    pub(crate) fn fail(&self, status: sys::ucs_status_t) {
        self.status.store(status as i32, Ordering::Release);
        self.failed.store(true, Ordering::Release);
    }
}

impl sys::EpErrorHandler for EpShared {
    fn on_error(&self, status: sys::ucs_status_t) {
        tracing::debug!(status, "UCX endpoint error");
        self.fail(status);
    }
}

/// How [`PeerEp::close_early`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EarlyClose {
    /// It was already closed or fenced.
    AlreadyClosed,
    /// Nothing was in flight (or everything drained, or the endpoint had failed): closed now.
    Closed,
    /// Operations were still in flight over a transport that cannot be force-closed safely
    /// (tcp): fenced and left to UCX to close in flush mode once they finish.
    Fenced,
    /// Operations were still in flight over shared memory: force-closed (UCX completed them
    /// with an error; nothing touches their memory any more).
    Forced,
}

const TCP_UNKNOWN: u8 = 0;
const TCP_NO: u8 = 1;
const TCP_YES: u8 = 2;

/// One endpoint on one worker.
pub(crate) struct PeerEp {
    pub worker: Arc<Worker>,
    ep: sys::Ep,
    /// The same-host notification endpoint (shared memory), if any.
    notif_ep: Option<sys::Ep>,
    pub shared: Arc<EpShared>,
    /// Whether UCX detects this peer's failure (peer error handling mode).
    pub peer_failure: bool,
    /// Whether a lane of the endpoint is UCX's tcp transport (`TCP_*`, cached once known).
    tcp: AtomicU8,
    /// Whether a lane of the endpoint is UCX's cma transport (`TCP_*` values, cached).
    cma: AtomicU8,
    /// The latest direct CMA post copied in pieces on this endpoint (`crate::cma`): a later
    /// post's notification waits until its copies are complete and its notification sent, so
    /// notifications keep post order and each implies the data of the posts before it, as one
    /// UCX flush per post gives UCX's own copies.
    pub last_flight: parking_lot::Mutex<std::sync::Weak<crate::direct_cma::Flight>>,
    /// The peer worker address the endpoint was created from.
    address: Arc<[u8]>,
    /// Set when the endpoint was fenced to be kept for the next peer at its address: its
    /// drop hands it to the worker ([`Worker::park`]) instead of closing it.
    parked: AtomicBool,
}

impl PeerEp {
    /// The handle, if still open. Only call with the worker locked.
    pub(crate) fn raw(&self, _g: &WorkerGuard<'_>) -> Option<sys::Ep> {
        (!self.shared.is_closed()).then_some(self.ep)
    }

    /// Whether a lane of this endpoint uses UCX's tcp transport. Unknown (the endpoint was
    /// closed before anyone asked) counts as tcp, so nothing is force-closed on a guess.
    pub(crate) fn uses_tcp(&self, g: &WorkerGuard<'_>) -> bool {
        self.lane_is(g, &self.tcp, &["tcp/", "tcp_"], true)
    }

    /// Whether a lane of the endpoint names one of `names` (cached in `cache` once known);
    /// `closed` when the endpoint is closed.
    fn lane_is(&self, g: &WorkerGuard<'_>, cache: &AtomicU8, names: &[&str], closed: bool) -> bool {
        match cache.load(Ordering::Acquire) {
            TCP_NO => return false,
            TCP_YES => return true,
            _ => {}
        }
        let Some(ep) = self.raw(g) else {
            return closed;
        };
        let lanes = if self.worker.ctx.ucx.has_ep_transports() {
            query_transports(g, ep)
        } else {
            print_info(g, ep)
        };
        let yes = names.iter().any(|n| lanes.contains(n));
        cache.store(if yes { TCP_YES } else { TCP_NO }, Ordering::Release);
        yes
    }

    /// Whether UCX copies host memory to this peer with its cma transport (a lane of the
    /// endpoint is `cma/...`): where the backend may make those copies itself (`crate::cma`).
    /// Cached once known; `false` for a closed endpoint.
    pub(crate) fn uses_cma(&self, g: &WorkerGuard<'_>) -> bool {
        self.lane_is(g, &self.cma, &["cma/", "cma "], false)
    }

    /// The endpoint notifications go on (the shared-memory one where there is one), if still
    /// open. Only call with the worker locked.
    pub(crate) fn notif_raw(&self, _g: &WorkerGuard<'_>) -> Option<sys::Ep> {
        (!self.shared.is_closed()).then_some(self.notif_ep.unwrap_or(self.ep))
    }

    /// The shared-memory transport notifications use, if they have their own endpoint.
    pub(crate) fn notif_transports(&self) -> Option<String> {
        let ep = self.notif_ep?;
        let g = self.worker.lock();
        if self.shared.is_closed() {
            return None;
        }
        let all = query_transports(&g, ep);
        let shm: Vec<&str> = all
            .split(", ")
            .filter(|t| SHM_AM_TRANSPORTS.iter().any(|s| t.starts_with(s)))
            .collect();
        Some(shm.join(", "))
    }

    /// Closes the endpoint now with `UCP_EP_CLOSE_FLAG_FORCE`: UCX completes every request
    /// on it (with an error) and no longer touches their memory. Waits for the close without
    /// holding the worker. Never call it on a tcp endpoint with operations in flight (see the
    /// module docs): [`PeerEp::close_early`] decides.
    pub(crate) fn force_close(&self) -> bool {
        {
            let _g = self.worker.lock();
            if self.shared.closed.swap(true, Ordering::AcqRel) {
                return true;
            }
        }
        for e in std::iter::once(self.ep).chain(self.notif_ep) {
            self.worker.links().remove_own(e.id());
        }
        if self.shared.failed().is_none() {
            self.shared.fail(sys::UCS_ERR_CANCELED);
        }
        if let Some(n) = self.notif_ep {
            // Shared memory: a flush-close completes at once unless a notification waits for
            // room in a dead peer's queue; that one is left to UCX.
            self.worker.close_ep(n, false, Duration::from_millis(200));
        }
        self.worker.close_ep(self.ep, true, Duration::from_secs(2))
    }

    /// Fences the endpoint of a forgotten peer to keep it for the next peer at the same
    /// address (see the module docs), if it is healthy and nothing is in flight on it: no
    /// post or notification starts on it again until it is handed out anew. Returns whether
    /// it was kept; if not, the caller closes it ([`PeerEp::close_early`]).
    pub(crate) fn park_if_idle(&self) -> bool {
        {
            let _g = self.worker.lock();
            let s = &self.shared;
            if s.is_closed()
                || s.failed().is_some()
                || s.is_replaced()
                || s.inflight() > 0
                || s.posted.load(Ordering::Acquire) > 0
            {
                return false;
            }
            s.closed.store(true, Ordering::Release);
            self.parked.store(true, Ordering::Release);
        }
        for e in std::iter::once(self.ep).chain(self.notif_ep) {
            self.worker.links().remove_own(e.id());
        }
        true
    }

    /// Closes the endpoint before its peer is dropped (the peer was forgotten), without ever
    /// force-closing a healthy tcp endpoint:
    ///
    /// 1. the endpoint failed (UCX completed its requests with an error): force-close now;
    /// 2. operations in flight: flush it for up to `drain` (they complete normally);
    /// 3. tcp: fence it (nothing new starts; callbacks of earlier operations do not send on
    ///    it) and queue it for a flush-mode close at the worker's next progress pass, so UCX
    ///    closes it once what is still in flight finishes or the peer fails;
    /// 4. shared memory: force-close, as a cancel does (UCX completes what is left with an
    ///    error and no longer touches its memory).
    ///
    /// Every wait is made without holding the worker ([`Worker::wait_request`]).
    pub(crate) fn close_early(&self, drain: Duration) -> EarlyClose {
        if self.shared.is_closed() {
            return EarlyClose::AlreadyClosed;
        }
        if self.shared.failed().is_none() && self.shared.inflight() > 0 {
            let r = {
                let mut g = self.worker.lock();
                let ep = self.raw(&g);
                ep.map(|ep| g.h().flush_request(ep))
            };
            if let Some(r) = r {
                self.worker.wait_request(r, Instant::now() + drain);
            }
            // Let completion callbacks of the drained operations run.
            self.worker.lock().progress_all();
        }
        if self.shared.failed().is_some() {
            self.force_close();
            return EarlyClose::Closed;
        }
        let pending = self.shared.inflight() > 0;
        let tcp = {
            let g = self.worker.lock();
            self.uses_tcp(&g)
        };
        if tcp {
            {
                let _g = self.worker.lock();
                if self.shared.closed.swap(true, Ordering::AcqRel) {
                    return EarlyClose::AlreadyClosed;
                }
            }
            if let Some(n) = self.notif_ep {
                self.worker.bury(Grave {
                    ep: n,
                    force: false,
                });
            }
            self.worker.bury(Grave {
                ep: self.ep,
                force: false,
            });
            return if pending {
                EarlyClose::Fenced
            } else {
                EarlyClose::Closed
            };
        }
        self.force_close();
        if pending {
            EarlyClose::Forced
        } else {
            EarlyClose::Closed
        }
    }
}

impl Drop for PeerEp {
    fn drop(&mut self) {
        if self.parked.load(Ordering::Acquire) {
            self.worker.park(crate::worker::Idle {
                address: self.address.clone(),
                ep: self.ep,
                notif_ep: self.notif_ep,
                shared: self.shared.clone(),
                peer_failure: self.peer_failure,
                lanes: (
                    self.tcp.load(Ordering::Relaxed),
                    self.cma.load(Ordering::Relaxed),
                ),
            });
            return;
        }
        if !self.shared.is_closed() {
            let force = self.shared.failed().is_some();
            if let Some(n) = self.notif_ep {
                self.worker.bury(Grave {
                    ep: n,
                    force: false,
                });
            }
            self.worker.bury(Grave { ep: self.ep, force });
        }
    }
}

/// Transports that only reach processes on this host.
const LOCAL_TRANSPORTS: [&str; 5] = ["cma/", "posix/", "sysv/", "xpmem/", "knem/"];
/// Shared-memory transports that carry active messages.
const SHM_AM_TRANSPORTS: [&str; 3] = ["posix/", "sysv/", "xpmem/"];

/// For a peer this endpoint reaches over a same-host transport: a second endpoint without
/// peer error handling whose active messages go over shared memory, or `None` (another host,
/// UCX too old to report transports, or no shared-memory transport enabled).
fn shm_notif_ep(g: &mut WorkerGuard<'_>, ep: sys::Ep, address: &[u8]) -> Option<sys::Ep> {
    let w = g.worker();
    if !w.ctx.ucx.has_ep_transports() {
        return None;
    }
    let main = query_transports(g, ep);
    if !LOCAL_TRANSPORTS.iter().any(|t| main.contains(t)) {
        return None;
    }
    // The address is the one the data endpoint was created from (checked).
    let n = g
        .h()
        .ep_create::<EpShared>(address, sys::ErrMode::None)
        .ok()?;
    let w = g.worker();
    if SHM_AM_TRANSPORTS
        .iter()
        .any(|t| query_transports(g, n).contains(t))
    {
        return Some(n);
    }
    // No shared memory after all: one endpoint is enough.
    w.bury(Grave {
        ep: n,
        force: false,
    });
    None
}

/// A connected peer: its name and one endpoint per local worker.
pub(crate) struct Peer {
    pub name: String,
    pub eps: Vec<PeerEp>,
    /// Whether the peer is a stock NIXL agent (notifications in NIXL's format).
    pub nixl: bool,
    /// Per endpoint: the notification header of the session its hello opened
    /// (`crate::session::introduce`).
    pub headers: Vec<Arc<[u8]>>,
    /// The peer's worker address as checked by `crate::validate` (what its rkeys are
    /// checked against).
    pub address: Option<crate::validate::Address>,
    /// The peer's process, where the backend makes direct CMA copies to it (`crate::cma`):
    /// bound by the agent when it loaded the peer (a pidfd of the process its metadata names,
    /// never a thread, never this process unless [`crate::UcxParams::direct_cma_same_process`]),
    /// and named alike by the peer's UCX connection info. `None`: UCX makes the copies.
    pub cma: Option<crate::direct_cma::Target>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("name", &self.name)
            .field("eps", &self.eps.len())
            .finish()
    }
}

impl Peer {
    /// Creates endpoints from every local worker to the peer's workers (round robin).
    /// With `shm_notifs`, a same-host peer also gets a shared-memory notification endpoint
    /// (see the module documentation).
    pub(crate) fn connect(
        agent: &str,
        name: &str,
        workers: &[Arc<Worker>],
        addresses: &[Vec<u8>],
        shm_notifs: bool,
    ) -> Result<Self> {
        let mut eps = Vec::with_capacity(workers.len());
        for (i, w) in workers.iter().enumerate() {
            let addr = &addresses[i % addresses.len()];
            if let Some(idle) = w.take_idle(addr) {
                {
                    let _g = w.lock();
                    idle.shared.reopen();
                }
                for e in std::iter::once(idle.ep).chain(idle.notif_ep) {
                    w.links().add_own(e.id(), name, idle.shared.clone());
                }
                eps.push(PeerEp {
                    worker: w.clone(),
                    ep: idle.ep,
                    notif_ep: idle.notif_ep,
                    shared: idle.shared,
                    peer_failure: idle.peer_failure,
                    tcp: AtomicU8::new(idle.lanes.0),
                    cma: AtomicU8::new(idle.lanes.1),
                    last_flight: parking_lot::Mutex::new(std::sync::Weak::new()),
                    address: idle.address,
                    parked: AtomicBool::new(false),
                });
                continue;
            }
            let shared = Arc::new(EpShared::default());
            let mut g = w.lock();
            // The address bytes were framed by wire::decode_conn and checked by
            // validate::Shapes::check_address (UCX reads exactly them).
            let mut r = g.h().ep_create(addr, sys::ErrMode::Peer(&shared));
            let mut peer_failure = true;
            if r == Err(sys::UCS_ERR_UNREACHABLE) {
                // The selected transports cannot detect peer failure (shared memory in UCX
                // builds without it): connect without, and say so in the path report.
                r = g.h().ep_create::<EpShared>(addr, sys::ErrMode::Unset);
                peer_failure = false;
                tracing::warn!(
                    agent,
                    remote = name,
                    "UCX transports cannot detect peer failure; endpoint created without it"
                );
            }
            let notif_ep = match r {
                Ok(ep) if shm_notifs && peer_failure => shm_notif_ep(&mut g, ep, addr),
                _ => None,
            };
            drop(g);
            let ep = r.map_err(|st| {
                status_error(
                    &w.ctx.ucx,
                    agent,
                    Some(name),
                    Op::LoadMetadata,
                    "ucp_ep_create",
                    st,
                )
            })?;
            // Either may be the connection the peer's hellos come on (`crate::links`).
            for e in std::iter::once(ep).chain(notif_ep) {
                w.links().add_own(e.id(), name, shared.clone());
            }
            eps.push(PeerEp {
                worker: w.clone(),
                ep,
                notif_ep,
                shared,
                peer_failure,
                tcp: AtomicU8::new(TCP_UNKNOWN),
                cma: AtomicU8::new(TCP_UNKNOWN),
                last_flight: parking_lot::Mutex::new(std::sync::Weak::new()),
                address: Arc::from(addr.as_slice()),
                parked: AtomicBool::new(false),
            });
        }
        Ok(Peer {
            name: name.to_owned(),
            eps,
            nixl: false,
            headers: Vec::new(),
            address: None,
            cma: None,
        })
    }

    /// Fails unless the endpoint on `worker` is usable.
    pub(crate) fn check_alive(&self, agent: &str, worker: usize, op: Op) -> Result<()> {
        let ep = self
            .eps
            .get(worker)
            .ok_or_else(|| Error::invalid(agent, op, "worker index out of range"))?;
        match ep.shared.failed() {
            None if ep.shared.is_replaced() => Err(Error::disconnected(
                agent,
                &self.name,
                op,
                "the peer replaced this UCX connection (it connected again); reload its metadata",
            )),
            None => Ok(()),
            Some(st) => Err(Error::disconnected(
                agent,
                &self.name,
                op,
                format!(
                    "UCX endpoint failed ({})",
                    ep.worker.ctx.ucx.status_string(st)
                ),
            )),
        }
    }

    /// Which transports the first endpoint uses.
    pub(crate) fn transports(&self) -> String {
        self.transports_on(0)
    }

    /// Which transports the endpoint on local worker `worker` uses.
    pub(crate) fn transports_on(&self, worker: usize) -> String {
        let Some(pe) = self.eps.get(worker) else {
            return "no endpoint".to_owned();
        };
        let ucx = &pe.worker.ctx.ucx;
        let g = pe.worker.lock();
        let Some(ep) = pe.raw(&g) else {
            return "endpoint closed".to_owned();
        };
        let body = if ucx.has_ep_transports() {
            query_transports(&g, ep)
        } else {
            print_info(&g, ep)
        };
        let mut state = match pe.shared.failed() {
            Some(st) => format!(" [failed: {}]", ucx.status_string(st)),
            None => String::new(),
        };
        if !pe.peer_failure {
            state.push_str(" [no peer-failure detection]");
        }
        drop(g);
        if let Some(n) = pe.notif_transports() {
            state.push_str(&format!("; notifications over {n}"));
        }
        format!("UCX {}: {body}{state}", ucx.version_string())
    }
}

fn query_transports(g: &WorkerGuard<'_>, ep: sys::Ep) -> String {
    g.h_ref().ep_transports(ep)
}

fn print_info(g: &WorkerGuard<'_>, ep: sys::Ep) -> String {
    let text = match g.h_ref().ep_print_info(ep) {
        Err(why) => return format!("transports unknown ({why})"),
        Ok(None) => return "transports unknown".to_owned(),
        Ok(Some(t)) => t,
    };
    let mut lanes: Vec<String> = text
        .lines()
        .filter(|l| l.contains("lane["))
        .map(|l| l.trim().trim_start_matches('#').trim().to_owned())
        .collect();
    lanes.dedup();
    if lanes.is_empty() {
        text.trim().to_owned()
    } else {
        lanes.join("; ")
    }
}

/// Connects `worker` with a temporary worker of the same context, both ways, and waits (up
/// to `budget`) for the connections' wire-up, then closes them: UCX selects lanes and
/// protocols once per worker and endpoint configuration (an endpoint it creates and one it
/// accepts differ) and keeps them, and an endpoint to a real peer on the same transports
/// reuses them. Without this a worker's first connection paid the selection during a request
/// (over tcp about 140 interface queries, each reading sysfs and asking the driver for the
/// link speed: most of a 9-10 ms first contact on the 2-core VM; `docs/perf/scale.md`).
/// Failures only log: the first connection then pays as before.
pub(crate) fn warm_up(agent: &str, worker: &Worker, budget: Duration) {
    let deadline = Instant::now() + budget;
    let mut other = match sys::WorkerH::create(&worker.ctx.ucx, worker.ctx.raw()) {
        Ok(w) => w,
        Err(st) => {
            tracing::debug!(agent, status = st, "UCX warm-up: no second worker");
            return;
        }
    };
    let Ok(other_address) = other.address() else {
        return;
    };
    let (to, from) = (Arc::new(EpShared::default()), Arc::new(EpShared::default()));
    let mut g = worker.lock();
    let out = g.h().ep_create(&other_address, sys::ErrMode::Peer(&to));
    let back = other.ep_create(worker.address(), sys::ErrMode::Peer(&from));
    let mut mine = Vec::new();
    let mut theirs = Vec::new();
    if let Ok(ep) = out {
        mine.push(g.h().flush_request(ep));
    }
    if let Ok(ep) = back {
        theirs.push(other.flush_request(ep));
    }
    let wired = settle(g.h(), &mut other, mine, theirs, deadline);
    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
    // Closed in order (flushed, the peer told), both workers progressing, so nothing of the
    // warm-up is left for UCX to tear down while the first real connection is made.
    let force = !wired;
    if let Ok(ep) = out {
        mine.push(g.h().close_request(ep, force));
    }
    if let Ok(ep) = back {
        theirs.push(other.close_request(ep, force));
    }
    let closed = settle(g.h(), &mut other, mine, theirs, deadline + budget);
    if !(wired && closed) {
        tracing::debug!(agent, wired, closed, "UCX warm-up did not finish in time");
    }
}

/// Progresses both workers until every request of each is done (freed) or `deadline` passed
/// (the rest handed back to UCX); whether all finished.
fn settle(
    a: &mut sys::WorkerH,
    b: &mut sys::WorkerH,
    mut on_a: Vec<sys::Request>,
    mut on_b: Vec<sys::Request>,
    deadline: Instant,
) -> bool {
    loop {
        on_a = on_a
            .into_iter()
            .filter_map(|r| a.poll_request(r).err())
            .collect();
        on_b = on_b
            .into_iter()
            .filter_map(|r| b.poll_request(r).err())
            .collect();
        if on_a.is_empty() && on_b.is_empty() {
            return true;
        }
        if Instant::now() >= deadline {
            on_a.into_iter().for_each(|r| a.release(r));
            on_b.into_iter().for_each(|r| b.release(r));
            return false;
        }
        if a.progress() + b.progress() == 0 {
            std::thread::yield_now();
        }
    }
}
