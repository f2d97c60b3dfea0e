//! UCP workers: each owned by one [`Worker`] with a mutex that serialises every call into it
//! (UCX's `UCS_THREAD_MODE_SERIALIZED`), an active-message handler that turns notifications
//! into entries of the agent's queue, and a graveyard of endpoints to close at the next
//! progress pass (so dropping an endpoint never blocks or re-enters UCX from a callback).

use parking_lot::{Mutex, MutexGuard};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::backend::{NotifQueue, PeerAuth, Sessions};
use nixl_core::{Op, Result};

use crate::context::Context;
use crate::error::status_error;
use crate::sys;

/// The active-message id of notifications.
pub(crate) const AM_NOTIF: u32 = 0x4e58;

/// What the notification and hello handlers need.
pub(crate) struct AmCtx {
    pub notifs: Arc<NotifQueue>,
    pub agent: String,
    pub peers: PeerAuth,
    sessions: Arc<Sessions>,
    links: Arc<crate::links::Links>,
}

/// An endpoint queued for closing.
pub(crate) struct Grave {
    pub ep: sys::Ep,
    pub force: bool,
}

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

/// The header and (eager) payload of an active message, or why it is dropped.
fn am_parts<'a>(msg: &sys::AmMsg<'a>) -> std::result::Result<(&'a [u8], &'a [u8]), &'static str> {
    if msg.rndv {
        return Err("a rendezvous message (senders use eager)");
    }
    match (msg.header, msg.data) {
        (Some(h), Some(d)) => Ok((h, d)),
        _ => Err("a malformed message"),
    }
}

impl sys::AmHandler for AmCtx {
    fn on_am(&self, id: u32, msg: sys::AmMsg<'_>) {
        match id {
            AM_NOTIF => self.on_notif(&msg),
            crate::session::AM_HELLO => self.on_hello(&msg),
            crate::nixl::AM_NIXL => crate::nixl::on_nixl_notif(self, &msg),
            _ => {}
        }
    }
}

impl AmCtx {
    fn on_notif(&self, m: &sys::AmMsg<'_>) {
        let (h, msg) = match am_parts(m) {
            Ok(p) => p,
            Err(why) => {
                tracing::warn!(agent = %self.agent, why, "dropping a notification");
                return;
            }
        };
        let session = match crate::wire::decode_notif_header(h) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(agent = %self.agent, error = %e, "dropping a notification with a malformed header");
                return;
            }
        };
        // The sender is the peer whose hello opened this connection, never a name in the
        // message.
        match m.reply_ep.and_then(|ep| self.sessions.sender(&session, ep)) {
            Some(sender) => {
                self.notifs.push(&sender, msg.to_vec());
            }
            None => {
                tracing::warn!(agent = %self.agent, "dropping a notification from a connection without an accepted hello");
            }
        }
    }

    fn on_hello(&self, m: &sys::AmMsg<'_>) {
        let Ok((h, d)) = am_parts(m) else {
            tracing::warn!(agent = %self.agent, "dropping a malformed hello");
            return;
        };
        let Some(ep) = m.reply_ep else {
            tracing::warn!(agent = %self.agent, "dropping a hello without its connection");
            return;
        };
        match self.peers.check_hello(h) {
            Ok(hello) => {
                tracing::debug!(agent = %self.agent, remote = %hello.sender, authenticated = hello.authenticated, "UCX connection introduced");
                if let Err(why) = self.sessions.accept(&hello, ep) {
                    tracing::warn!(agent = %self.agent, remote = %hello.sender, why, "refused a UCX hello");
                    return;
                }
                // The payload names the sender's worker (`crate::session::introduce`).
                let index = <[u8; 4]>::try_from(d).ok().map(u32::from_le_bytes);
                if let Some(old) = self.links.introduced(&hello.sender, index, ep) {
                    tracing::debug!(agent = %self.agent, remote = %hello.sender, old, "the peer replaced a UCX connection our endpoint shares; it fails until the peer is reloaded");
                }
            }
            Err(e) => {
                tracing::warn!(agent = %self.agent, error = %e, "refused a UCX connection's hello");
            }
        }
    }
}

impl Worker {
    /// Creates a worker with the notification and hello handlers.
    pub(crate) fn new(
        ctx: Arc<Context>,
        index: usize,
        agent: &str,
        notifs: Arc<NotifQueue>,
        peers: PeerAuth,
        sessions: Arc<Sessions>,
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
        });
        // Our notifications and hellos, and NIXL's notifications (id 0,
        // `nixl_core::nixl_wire::notif`).
        const HELLO: u32 = crate::session::AM_HELLO;
        const NIXL: u32 = crate::nixl::AM_NIXL;
        let set = "ucp_worker_set_am_recv_handler";
        raw.set_am_handler::<AmCtx, AM_NOTIF>(&am)
            .map_err(|st| fail(set, st))?;
        raw.set_am_handler::<AmCtx, HELLO>(&am)
            .map_err(|st| fail(set, st))?;
        raw.set_am_handler::<AmCtx, NIXL>(&am)
            .map_err(|st| fail(set, st))?;
        Ok(Arc::new(Worker {
            raw: Mutex::new(raw),
            ctx,
            index,
            efd,
            address,
            graves: Mutex::new(Vec::new()),
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
        crate::memory::apply_vram_context();
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
    /// endpoints, arms the wake-up, and sleeps on the event descriptor until something
    /// happens or `timeout` passes. Returns whether anything happened.
    pub(crate) fn progress_or_wait(&self, timeout: Duration) -> bool {
        let armed = {
            let mut g = self.lock();
            let n = g.progress_all();
            g.close_graves(Duration::ZERO);
            if n > 0 {
                return true;
            }
            g.g.arm() == sys::UCS_OK
        };
        if armed && self.efd >= 0 {
            let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
            // The descriptor belongs to the live worker (self).
            sys::worker::poll_in(self.efd, ms);
        }
        true
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
        let mut g = self.lock();
        g.close_graves(Duration::from_millis(500));
        g.progress_all();
        // The worker is destroyed when `raw` drops, right after: every endpoint holder kept
        // an Arc of this worker, so all endpoints are closed (buried ones just now).
    }
}
