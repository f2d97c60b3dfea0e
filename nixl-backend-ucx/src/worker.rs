//! UCP workers: each owned by one [`Worker`] with a mutex that serialises every call into it
//! (UCX's `UCS_THREAD_MODE_SERIALIZED`), an active-message handler that turns notifications
//! into entries of the agent's queue, and a graveyard of endpoints to close at the next
//! progress pass (so dropping an endpoint never blocks or re-enters UCX from a callback).

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nixl_core::backend::{NotifQueue, PeerAuth, Sessions};
use nixl_core::{Op, Result};

use crate::context::Context;
use crate::error::check;
use crate::sys;

/// The active-message id of notifications.
pub(crate) const AM_NOTIF: u32 = 0x4e58;

struct RawWorker(sys::ucp_worker_h);
// SAFETY: the handle is only used while the owning Worker's mutex is held, which serialises
// every call into the worker as UCS_THREAD_MODE_SERIALIZED requires.
unsafe impl Send for RawWorker {}

/// What the notification and hello handlers need.
pub(crate) struct AmCtx {
    pub notifs: Arc<NotifQueue>,
    pub agent: String,
    pub peers: PeerAuth,
    sessions: Arc<Sessions>,
}

/// An endpoint queued for closing.
pub(crate) struct Grave {
    pub ep: sys::ucp_ep_h,
    pub force: bool,
}
// SAFETY: the endpoint is only touched under the owning worker's mutex.
unsafe impl Send for Grave {}

/// Keeps an endpoint's error-handler argument alive until the worker is destroyed (UCX may
/// call the handler until then, even for an endpoint whose close is still finishing).
pub(crate) type HandlerArg = Arc<dyn std::any::Any + Send + Sync>;

/// An owned `ucp_worker_h`.
pub(crate) struct Worker {
    pub ctx: Arc<Context>,
    pub index: usize,
    raw: Mutex<RawWorker>,
    efd: i32,
    address: Vec<u8>,
    am: *mut AmCtx,
    graves: Mutex<Vec<Grave>>,
    handler_args: Mutex<Vec<HandlerArg>>,
}

// SAFETY: all access to the raw worker goes through `raw`'s mutex; `am` is only read by the
// UCX callback (under that mutex) and freed in Drop after the worker is destroyed; `efd` is a
// plain descriptor.
unsafe impl Send for Worker {}
// SAFETY: as above.
unsafe impl Sync for Worker {}

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
    g: MutexGuard<'a, RawWorker>,
    w: &'a Worker,
}

/// The endpoint an active message came on (its sender's connection), when the sender asked
/// for replies (`UCP_AM_SEND_FLAG_REPLY`, which this backend always sets).
fn reply_ep(param: *const sys::ucp_am_recv_param_t) -> Option<u64> {
    // SAFETY: UCX passes a valid param struct (or NULL) for the duration of the callback.
    let p = unsafe { param.as_ref() }?;
    (p.recv_attr & sys::UCP_AM_RECV_ATTR_FIELD_REPLY_EP as u64 != 0 && !p.reply_ep.is_null())
        .then_some(p.reply_ep as u64)
}

/// The header and (eager) payload of an active message, or why it is dropped.
///
/// # Safety
///
/// The pointers and lengths are those UCX passed to an active-message callback that is
/// still running.
unsafe fn am_parts<'a>(
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> std::result::Result<(&'a [u8], &'a [u8]), &'static str> {
    // SAFETY: as the caller guarantees.
    let attr = unsafe { param.as_ref() }.map_or(0, |p| p.recv_attr);
    if attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV as u64 != 0 {
        return Err("a rendezvous message (senders use eager)");
    }
    if header.is_null() || (data.is_null() && length > 0) {
        return Err("a malformed message");
    }
    // SAFETY: UCX guarantees header/data point to header_length/length readable bytes for the
    // duration of the callback (checked non-null above).
    let h = unsafe { std::slice::from_raw_parts(header as *const u8, header_length) };
    let d = if length == 0 {
        &[][..]
    } else {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(data as *const u8, length) }
    };
    Ok((h, d))
}

unsafe extern "C" fn am_recv(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the AmCtx registered with this handler; it lives until after the worker
    // is destroyed.
    let ctx = unsafe { &*(arg as *const AmCtx) };
    // SAFETY: the arguments are this callback's own.
    let (h, msg) = match unsafe { am_parts(header, header_length, data, length, param) } {
        Ok(p) => p,
        Err(why) => {
            tracing::warn!(agent = %ctx.agent, why, "dropping a notification");
            return sys::UCS_OK;
        }
    };
    let session = match crate::wire::decode_notif_header(h) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(agent = %ctx.agent, error = %e, "dropping a notification with a malformed header");
            return sys::UCS_OK;
        }
    };
    // The sender is the peer whose hello opened this connection, never a name in the message.
    match reply_ep(param).and_then(|ep| ctx.sessions.sender(&session, ep)) {
        Some(sender) => {
            ctx.notifs.push(&sender, msg.to_vec());
        }
        None => {
            tracing::warn!(agent = %ctx.agent, "dropping a notification from a connection without an accepted hello");
        }
    }
    sys::UCS_OK
}

unsafe extern "C" fn hello_recv(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the AmCtx registered with this handler; it lives until after the worker
    // is destroyed.
    let ctx = unsafe { &*(arg as *const AmCtx) };
    // SAFETY: the arguments are this callback's own.
    let Ok((h, _)) = (unsafe { am_parts(header, header_length, data, length, param) }) else {
        tracing::warn!(agent = %ctx.agent, "dropping a malformed hello");
        return sys::UCS_OK;
    };
    let Some(ep) = reply_ep(param) else {
        tracing::warn!(agent = %ctx.agent, "dropping a hello without its connection");
        return sys::UCS_OK;
    };
    match ctx.peers.check_hello(h) {
        Ok(hello) => {
            tracing::debug!(agent = %ctx.agent, remote = %hello.sender, authenticated = hello.authenticated, "UCX connection introduced");
            ctx.sessions.accept(&hello, ep);
        }
        Err(e) => {
            tracing::warn!(agent = %ctx.agent, error = %e, "refused a UCX connection's hello");
        }
    }
    sys::UCS_OK
}

impl Worker {
    /// Creates a worker with the notification and hello handlers.
    pub fn new(
        ctx: Arc<Context>,
        index: usize,
        agent: &str,
        notifs: Arc<NotifQueue>,
        peers: PeerAuth,
        sessions: Arc<Sessions>,
    ) -> Result<Arc<Self>> {
        let ucx = &ctx.ucx;
        // SAFETY: zeroed params with a field mask is the documented form.
        let mut params: sys::ucp_worker_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64;
        params.thread_mode = sys::UCS_THREAD_MODE_SERIALIZED;
        let mut raw: sys::ucp_worker_h = std::ptr::null_mut();
        // SAFETY: the context is live (held by ctx); params and the out-pointer are valid.
        let st = unsafe { ucx.lib.ucp_worker_create(ctx.raw(), &params, &mut raw) };
        check(ucx, agent, Op::CreateBackend, "ucp_worker_create", st)?;
        let destroy = |raw| {
            // SAFETY: raw is a live worker with no endpoints, destroyed once.
            unsafe { ucx.lib.ucp_worker_destroy(raw) }
        };
        // The event descriptor exists only with wake-up (a progress thread sleeps on it).
        let mut efd = -1;
        if ctx.wakeup {
            // SAFETY: raw is live; efd is a valid out-pointer.
            let st = unsafe { ucx.lib.ucp_worker_get_efd(raw, &mut efd) };
            if let Err(e) = check(ucx, agent, Op::CreateBackend, "ucp_worker_get_efd", st) {
                destroy(raw);
                return Err(e);
            }
        }
        let mut addr: *mut sys::ucp_address_t = std::ptr::null_mut();
        let mut addr_len = 0usize;
        // SAFETY: raw is live; both out-pointers are valid.
        let st = unsafe {
            ucx.lib
                .ucp_worker_get_address(raw, &mut addr, &mut addr_len)
        };
        if let Err(e) = check(ucx, agent, Op::CreateBackend, "ucp_worker_get_address", st) {
            destroy(raw);
            return Err(e);
        }
        // SAFETY: UCX returned addr_len readable bytes at addr.
        let address = unsafe { std::slice::from_raw_parts(addr as *const u8, addr_len) }.to_vec();
        // SAFETY: addr came from ucp_worker_get_address on this worker, released once.
        unsafe { ucx.lib.ucp_worker_release_address(raw, addr) };
        let am = Box::into_raw(Box::new(AmCtx {
            notifs,
            agent: agent.to_owned(),
            peers,
            sessions,
        }));
        // Our notifications and hellos, and NIXL's notifications (id 0,
        // `nixl_core::nixl_wire::notif`).
        let handlers: [(u32, sys::ucp_am_recv_callback_t); 3] = [
            (AM_NOTIF, Some(am_recv)),
            (crate::session::AM_HELLO, Some(hello_recv)),
            (crate::nixl::AM_NIXL, Some(crate::nixl::am_recv_nixl)),
        ];
        for (id, cb) in handlers {
            // SAFETY: zeroed params with a field mask is the documented form.
            let mut hp: sys::ucp_am_handler_param_t = unsafe { std::mem::zeroed() };
            hp.field_mask = (sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG) as u64;
            hp.id = id;
            hp.cb = cb;
            hp.arg = am as *mut c_void;
            // SAFETY: raw is live; the handler argument stays valid until after the worker is
            // destroyed (freed in Drop).
            let st = unsafe { ucx.lib.ucp_worker_set_am_recv_handler(raw, &hp) };
            if let Err(e) = check(
                ucx,
                agent,
                Op::CreateBackend,
                "ucp_worker_set_am_recv_handler",
                st,
            ) {
                destroy(raw);
                // SAFETY: allocated above, never shared (the worker is destroyed).
                drop(unsafe { Box::from_raw(am) });
                return Err(e);
            }
        }
        Ok(Arc::new(Worker {
            ctx,
            index,
            raw: Mutex::new(RawWorker(raw)),
            efd,
            address,
            am,
            graves: Mutex::new(Vec::new()),
            handler_args: Mutex::new(Vec::new()),
        }))
    }

    /// The worker's address (connection info of one worker).
    pub fn address(&self) -> &[u8] {
        &self.address
    }

    /// Locks the worker.
    pub fn lock(&self) -> WorkerGuard<'_> {
        // UCX's CUDA transports run in the calling thread's CUDA context.
        crate::memory::apply_vram_context();
        WorkerGuard {
            g: self.raw.lock().unwrap_or_else(|p| p.into_inner()),
            w: self,
        }
    }

    /// Keeps an error-handler argument alive for the worker's lifetime.
    pub fn keep_handler_arg(&self, arg: HandlerArg) {
        self.handler_args
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(arg);
    }

    /// Queues an endpoint for closing at the next progress pass.
    pub fn bury(&self, grave: Grave) {
        self.graves
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(grave);
    }

    /// Wakes a thread blocked in [`Worker::wait_event`].
    pub fn signal(&self) {
        if !self.ctx.wakeup {
            return;
        }
        let g = self.lock();
        // SAFETY: the worker is live and locked.
        unsafe { self.ctx.ucx.lib.ucp_worker_signal(g.raw()) };
    }

    /// One progress pass for the backend's progress thread: drains events, closes buried
    /// endpoints, arms the wake-up, and sleeps on the event descriptor until something
    /// happens or `timeout` passes. Returns whether anything happened.
    pub fn progress_or_wait(&self, timeout: Duration) -> bool {
        let armed = {
            let mut g = self.lock();
            let n = g.progress_all();
            g.close_graves(Duration::ZERO);
            if n > 0 {
                return true;
            }
            // SAFETY: the worker is live and locked.
            let st = unsafe { self.ctx.ucx.lib.ucp_worker_arm(g.raw()) };
            st == sys::UCS_OK
        };
        if armed && self.efd >= 0 {
            let mut fd = sys::PollFd {
                fd: self.efd,
                events: sys::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: fd is one valid pollfd; the descriptor belongs to the live worker.
            unsafe { sys::poll(&mut fd, 1, ms) };
        }
        true
    }
}

impl WorkerGuard<'_> {
    /// The raw handle (valid while the guard lives).
    pub fn raw(&self) -> sys::ucp_worker_h {
        self.g.0
    }

    /// The worker.
    pub fn worker(&self) -> &Worker {
        self.w
    }

    /// One `ucp_worker_progress`.
    pub fn progress(&mut self) -> u32 {
        // SAFETY: the worker is live and locked.
        unsafe { self.w.ctx.ucx.lib.ucp_worker_progress(self.g.0) }
    }

    /// Progresses until nothing happens (bounded); how many events UCX reported, saturating
    /// (the count is UCX's to report and is never trusted for arithmetic).
    pub fn progress_all(&mut self) -> u32 {
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

    /// Waits for a request to leave `UCS_INPROGRESS` (progressing), up to `deadline`, and
    /// frees it. Returns its status, or `None` on timeout (the request is then handed back to
    /// UCX, which finishes it internally: buffers it uses must stay valid).
    pub fn wait_request(
        &mut self,
        req: *mut c_void,
        deadline: Instant,
    ) -> Option<sys::ucs_status_t> {
        if !sys::ptr_is_ptr(req) {
            return Some(sys::ptr_status(req));
        }
        let lib = &self.w.ctx.ucx.lib;
        loop {
            // SAFETY: req is a live request of this worker, not yet freed.
            let st = unsafe { lib.ucp_request_check_status(req) };
            if st != sys::UCS_INPROGRESS {
                // SAFETY: completed request, freed once.
                unsafe { lib.ucp_request_free(req) };
                return Some(st);
            }
            if Instant::now() >= deadline {
                // SAFETY: req is live; UCX finishes and releases it internally.
                unsafe { lib.ucp_request_free(req) };
                return None;
            }
            if self.progress() == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// Closes an endpoint now (flushing unless `force`), waiting up to `timeout` before
    /// forcing. Returns whether it is closed.
    pub fn close_ep(&mut self, ep: sys::ucp_ep_h, force: bool, timeout: Duration) -> bool {
        let lib = &self.w.ctx.ucx.lib;
        // SAFETY: zeroed request params with a mask are the documented form.
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = if force {
            sys::UCP_EP_CLOSE_FLAG_FORCE
        } else {
            0
        };
        // SAFETY: ep is a live endpoint of this locked worker, closed once.
        let req = unsafe { lib.ucp_ep_close_nbx(ep, &p) };
        match self.wait_request(req, Instant::now() + timeout) {
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
    pub fn close_graves(&mut self, timeout: Duration) {
        let graves = std::mem::take(&mut *self.w.graves.lock().unwrap_or_else(|p| p.into_inner()));
        for g in graves {
            self.close_ep(g.ep, g.force, timeout);
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        {
            let mut g = self.lock();
            g.close_graves(Duration::from_millis(500));
            g.progress_all();
            // SAFETY: the last owner: every endpoint holder kept an Arc of this worker, so all
            // endpoints are closed (buried ones just now); destroyed once.
            unsafe { self.ctx.ucx.lib.ucp_worker_destroy(g.raw()) };
        }
        // SAFETY: the worker (the only user of the handler argument) is destroyed.
        drop(unsafe { Box::from_raw(self.am) });
        // Endpoint error-handler arguments are released after the worker, for the same reason.
        self.handler_args
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}
