//! UCP workers: each owned by one [`Worker`] with a mutex that serialises every call into it
//! (UCX's `UCS_THREAD_MODE_SERIALIZED`), the active-message routes the backend registers
//! ([`AmRoute`]: notifications, connection hellos, NIXL's notifications), a graveyard of endpoints to close at the next
//! progress pass (so dropping an endpoint never blocks or re-enters UCX from a callback), and
//! the endpoints of forgotten peers kept open for the next peer at the same address ([`Idle`]).

use parking_lot::{Mutex, MutexGuard};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::backend::{NotifQueue, PeerAuth, Sessions};
use nixl_core::{Op, Result};

use crate::context::Context;
use crate::error::status_error;
use crate::sys;

/// A handler of one active-message id: what the message means to the backend.
pub(crate) type AmRoute = fn(&AmCtx, &sys::AmMsg<'_>);

/// What the active-message handlers need, and the backend's table of them.
pub(crate) struct AmCtx {
    pub notifs: Arc<NotifQueue>,
    pub agent: String,
    pub peers: PeerAuth,
    pub sessions: Arc<Sessions>,
    pub links: Arc<crate::links::Links>,
    routes: &'static [(u32, AmRoute)],
}

/// An endpoint queued for closing.
pub(crate) struct Grave {
    pub ep: sys::Ep,
    pub force: bool,
}

/// A forgotten peer's endpoint, healthy and with nothing in flight, kept open for the next
/// peer at the same worker address (`crate::endpoint`, "Forgetting a peer"): closing an
/// endpoint to a live peer leaves UCX's connection (a socket, shared-memory mappings) open on
/// both sides for the life of the peer's worker, so a peer loaded and forgotten again and
/// again would cost one each time.
pub(crate) struct Idle {
    /// The peer worker address the endpoint was created from.
    pub address: Arc<[u8]>,
    pub ep: sys::Ep,
    pub notif_ep: Option<sys::Ep>,
    pub shared: Arc<crate::endpoint::EpShared>,
    pub peer_failure: bool,
    /// The endpoint's cached transport answers (`PeerEp`'s `tcp` and `cma`).
    pub lanes: (u8, u8),
}

/// How many idle endpoints a worker keeps; past it the oldest is closed.
pub(crate) const MAX_IDLE: usize = 64;

/// An owned `ucp_worker_h`.
pub(crate) struct Worker {
    /// Declared first: the worker is destroyed (and its handlers' arguments released, which
    /// UCX may use until then, even for an endpoint whose close is still finishing) before
    /// the context is released.
    raw: Mutex<sys::WorkerH>,
    pub ctx: Arc<Context>,
    pub index: usize,
    efd: i32,
    address: Vec<u8>,
    graves: Mutex<Vec<Grave>>,
    /// Endpoints of forgotten peers, oldest first ([`Idle`]).
    idle: Mutex<std::collections::VecDeque<Idle>>,
    /// Our endpoints on this worker and the connections peers introduced (`crate::links`).
    links: Arc<crate::links::Links>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("index", &self.index)
            .field("address_len", &self.address.len())
            .finish()
    }
}

/// The worker, locked.
pub(crate) struct WorkerGuard<'a> {
    g: MutexGuard<'a, sys::WorkerH>,
    w: &'a Worker,
}

impl sys::AmHandler for AmCtx {
    fn on_am(&self, id: u32, msg: sys::AmMsg<'_>) {
        if let Some((_, route)) = self.routes.iter().find(|(i, _)| *i == id) {
            route(self, &msg);
        }
    }
}

impl Worker {
    /// Creates a worker whose active messages go to `routes` (the backend's table).
    pub(crate) fn new(
        ctx: Arc<Context>,
        index: usize,
        agent: &str,
        notifs: Arc<NotifQueue>,
        peers: PeerAuth,
        sessions: Arc<Sessions>,
        routes: &'static [(u32, AmRoute)],
    ) -> Result<Arc<Self>> {
        let ucx = &ctx.ucx;
        let fail = |call, st| status_error(ucx, agent, None, Op::CreateBackend, call, st);
        let mut raw =
            sys::WorkerH::create(ucx, ctx.raw()).map_err(|st| fail("ucp_worker_create", st))?;
        // The event descriptor exists only with wake-up (a progress thread sleeps on it).
        let efd = if ctx.wakeup {
            raw.efd().map_err(|st| fail("ucp_worker_get_efd", st))?
        } else {
            -1
        };
        let address = raw
            .address()
            .map_err(|st| fail("ucp_worker_get_address", st))?;
        let links = Arc::new(crate::links::Links::default());
        let am = Arc::new(AmCtx {
            notifs,
            agent: agent.to_owned(),
            peers,
            sessions,
            links: links.clone(),
            routes,
        });
        for (id, _) in routes {
            raw.set_am_handler(*id, &am)
                .map_err(|st| fail("ucp_worker_set_am_recv_handler", st))?;
        }
        Ok(Arc::new(Worker {
            raw: Mutex::new(raw),
            ctx,
            index,
            efd,
            address,
            graves: Mutex::new(Vec::new()),
            idle: Mutex::new(std::collections::VecDeque::new()),
            links,
        }))
    }

    /// The worker's address (connection info of one worker).
    pub(crate) fn address(&self) -> &[u8] {
        &self.address
    }

    /// Locks the worker.
    pub(crate) fn lock(&self) -> WorkerGuard<'_> {
        // UCX's CUDA transports run in the calling thread's CUDA context.
        crate::vram_context::apply_vram_context();
        WorkerGuard {
            g: self.raw.lock(),
            w: self,
        }
    }

    /// Our endpoints on this worker and their peers' connections (`crate::links`).
    pub(crate) fn links(&self) -> &crate::links::Links {
        &self.links
    }

    /// Queues an endpoint for closing at the next progress pass.
    pub(crate) fn bury(&self, grave: Grave) {
        self.links.remove_own(grave.ep.id());
        self.graves.lock().push(grave);
    }

    /// Keeps a forgotten peer's endpoint for the next peer at its address; past
    /// [`MAX_IDLE`] the oldest kept one is closed.
    pub(crate) fn park(&self, idle: Idle) {
        let evicted = {
            let mut q = self.idle.lock();
            q.push_back(idle);
            if q.len() > MAX_IDLE {
                q.pop_front()
            } else {
                None
            }
        };
        if let Some(old) = evicted {
            self.bury_idle(old);
        }
    }

    /// A kept endpoint to `address` that is still healthy, if any (failed or replaced ones
    /// found on the way are closed).
    pub(crate) fn take_idle(&self, address: &[u8]) -> Option<Idle> {
        loop {
            let found = {
                let mut q = self.idle.lock();
                let i = q.iter().position(|e| &*e.address == address)?;
                q.remove(i)?
            };
            if found.shared.failed().is_none() && !found.shared.is_replaced() {
                return Some(found);
            }
            self.bury_idle(found);
        }
    }

    fn bury_idle(&self, e: Idle) {
        if let Some(n) = e.notif_ep {
            self.bury(Grave {
                ep: n,
                force: false,
            });
        }
        self.bury(Grave {
            ep: e.ep,
            force: e.peer_failure && e.shared.failed().is_some(),
        });
    }

    /// Wakes a thread blocked in [`Worker::progress_or_wait`].
    pub(crate) fn signal(&self) {
        if !self.ctx.wakeup {
            return;
        }
        self.lock().g.signal();
    }

    /// Waits for a request to leave `UCS_INPROGRESS`, up to `deadline`, and frees it; `None`
    /// on timeout (the request is then handed back to UCX, which finishes it internally:
    /// buffers it uses must stay valid). The worker is locked only for each check and
    /// progress pass, never across the wait: a request to a peer that does not answer costs
    /// its own deadline, while every other request, wait and notification poll of the agent
    /// goes on (DESIGN.md, principle 10).
    pub(crate) fn wait_request(
        &self,
        mut req: sys::Request,
        deadline: Instant,
    ) -> Option<sys::ucs_status_t> {
        let start = Instant::now();
        loop {
            let mut g = self.lock();
            match g.g.poll_request(req) {
                Ok(st) => return Some(st),
                Err(r) => req = r,
            }
            if Instant::now() >= deadline {
                g.g.release(req);
                return None;
            }
            let n = g.progress();
            drop(g);
            if n > 0 {
                continue;
            }
            // Most of these requests finish within microseconds: yield first, then sleep a
            // little between checks.
            if start.elapsed() < Duration::from_millis(1) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Closes an endpoint (flushing unless `force`), waiting up to `timeout` without holding
    /// the worker ([`Worker::wait_request`]). Returns whether it is closed; if not, UCX
    /// finishes the close when the peer answers or fails.
    pub(crate) fn close_ep(&self, ep: sys::Ep, force: bool, timeout: Duration) -> bool {
        let req = self.lock().g.close_request(ep, force);
        let closed = self.wait_request(req, Instant::now() + timeout).is_some();
        if !closed {
            tracing::warn!(worker = self.index, "endpoint close still pending");
        }
        closed
    }

    /// One progress pass for the backend's progress thread: drains events, closes buried
    /// endpoints, and unless something happened or `timeout` is zero (the thread is
    /// spinning: [`UcxParams::progress_spin`](crate::UcxParams::progress_spin)), arms the
    /// wake-up and sleeps on the event descriptor until something happens or `timeout`
    /// passes. Returns whether the pass found events.
    pub(crate) fn progress_or_wait(&self, timeout: Duration) -> bool {
        let armed = {
            let mut g = self.lock();
            let n = g.progress_all();
            g.close_graves(Duration::ZERO);
            if n > 0 {
                return true;
            }
            if timeout.is_zero() {
                return false;
            }
            g.g.arm() == sys::UCS_OK
        };
        if armed && self.efd >= 0 {
            let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
            // The descriptor belongs to the live worker (self).
            sys::worker::poll_in(self.efd, ms);
        }
        false
    }
}

impl WorkerGuard<'_> {
    /// The locked worker handle (the proof the endpoint wrappers of `sys` take).
    pub(crate) fn h(&mut self) -> &mut sys::WorkerH {
        &mut self.g
    }

    /// The locked worker handle, shared.
    pub(crate) fn h_ref(&self) -> &sys::WorkerH {
        &self.g
    }

    /// The worker.
    pub(crate) fn worker(&self) -> &Worker {
        self.w
    }

    /// One `ucp_worker_progress`.
    pub(crate) fn progress(&mut self) -> u32 {
        self.g.progress()
    }

    /// Progresses until nothing happens (bounded); how many events UCX reported, saturating
    /// (the count is UCX's to report and is never trusted for arithmetic).
    pub(crate) fn progress_all(&mut self) -> u32 {
        let mut total = 0u32;
        for _ in 0..64 {
            let n = self.progress();
            if n == 0 {
                break;
            }
            total = total.saturating_add(n);
        }
        total
    }

    /// Closes an endpoint now (flushing unless `force`), waiting up to `timeout` before
    /// forcing, with the worker held: only for endpoints with nothing in flight (graves
    /// closed by progress passes, with a zero timeout) and at the worker's end.
    fn close_ep(&mut self, ep: sys::Ep, force: bool, timeout: Duration) -> bool {
        let req = self.g.close_request(ep, force);
        match self.g.wait(req, Instant::now() + timeout) {
            Some(_) => true,
            None => {
                // A flush-close that does not finish: leave the request to UCX (it completes
                // when the peer answers or fails) and report the endpoint as still closing.
                tracing::warn!(worker = self.w.index, "endpoint close still pending");
                false
            }
        }
    }

    /// Closes buried endpoints.
    pub(crate) fn close_graves(&mut self, timeout: Duration) {
        let graves = std::mem::take(&mut *self.w.graves.lock());
        for g in graves {
            self.close_ep(g.ep, g.force, timeout);
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let idle = std::mem::take(&mut *self.idle.lock());
        for e in idle {
            self.bury_idle(e);
        }
        let mut g = self.lock();
        g.close_graves(Duration::from_millis(500));
        g.progress_all();
        // The worker is destroyed when `raw` drops, right after: every endpoint holder kept
        // an Arc of this worker, so all endpoints are closed (buried ones just now).
    }
}
