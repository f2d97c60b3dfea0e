//! Safe wrappers over a UCP worker: the owned handle (whose `&`/`&mut` access is the proof
//! that the owning mutex is held), progress and wake-up, requests, and the active-message
//! handlers (C trampolines in here, safe Rust handlers above).

use core::ffi::c_void;
use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use super::*;
use crate::loader::Ucx;

/// Something UCX keeps a pointer to until the worker is destroyed (a handler argument).
pub(crate) type Kept = Arc<dyn Any + Send + Sync>;

/// An owned, live `ucp_worker_h`, destroyed on drop after which the arguments of its
/// handlers are released. Every method takes `&self`/`&mut self`: the crate keeps it inside a
/// mutex, so holding a reference proves the serialisation `UCS_THREAD_MODE_SERIALIZED`
/// requires.
pub(crate) struct WorkerH {
    raw: ucp_worker_h,
    ucx: Arc<Ucx>,
    /// Handler arguments UCX may use until the worker is destroyed.
    kept: Vec<Kept>,
}

// SAFETY: the handle is a pointer UCX lets any one thread use at a time; the crate only
// reaches it through the owning worker's mutex.
unsafe impl Send for WorkerH {}

/// Proof that the worker's lock is held: obtained from the locked handle
/// ([`WorkerH::locked`]) or handed to completion callbacks (which run inside progress, under
/// the lock). Only this module tree creates it.
pub(crate) struct Locked<'a>(pub(super) PhantomData<&'a mut ()>);

/// A request UCX returned that may still be in flight (or the status it completed with).
#[must_use = "a request must be waited for"]
pub(crate) struct Request(*mut c_void);

impl Request {
    /// Wraps what a `*_nbx` call returned.
    pub(super) fn new(p: *mut c_void) -> Self {
        Request(p)
    }
}

impl WorkerH {
    /// Creates a worker in `UCS_THREAD_MODE_SERIALIZED` mode.
    pub(crate) fn create(ucx: &Arc<Ucx>, ctx: &ContextH) -> Result<Self, ucs_status_t> {
        // SAFETY: zeroed params with a field mask is the documented form.
        let mut params: ucp_worker_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64;
        params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
        let mut raw: ucp_worker_h = std::ptr::null_mut();
        // SAFETY: the context is live (borrowed); params and the out-pointer are valid.
        let st = unsafe { ucx.lib.ucp_worker_create(ctx.raw(), &params, &mut raw) };
        if st != UCS_OK {
            return Err(st);
        }
        Ok(WorkerH {
            raw,
            ucx: ucx.clone(),
            kept: Vec::new(),
        })
    }

    /// The event descriptor of the wake-up feature.
    pub(crate) fn efd(&self) -> Result<i32, ucs_status_t> {
        let mut efd = -1;
        // SAFETY: the worker is live; efd is a valid out-pointer.
        let st = unsafe { self.ucx.lib.ucp_worker_get_efd(self.raw, &mut efd) };
        if st == UCS_OK {
            Ok(efd)
        } else {
            Err(st)
        }
    }

    /// A copy of the worker's address.
    pub(crate) fn address(&self) -> Result<Vec<u8>, ucs_status_t> {
        let lib = &self.ucx.lib;
        let mut addr: *mut ucp_address_t = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: the worker is live; both out-pointers are valid.
        let st = unsafe { lib.ucp_worker_get_address(self.raw, &mut addr, &mut len) };
        if st != UCS_OK {
            return Err(st);
        }
        // SAFETY: UCX returned `len` readable bytes at addr.
        let v = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
        // SAFETY: addr came from ucp_worker_get_address on this worker, released once.
        unsafe { lib.ucp_worker_release_address(self.raw, addr) };
        Ok(v)
    }

    /// Installs `handler` for active-message id `id` (the handler and the id are kept alive
    /// until the worker is destroyed, as UCX's callback argument).
    pub(crate) fn set_am_handler<H: AmHandler>(
        &mut self,
        id: u32,
        handler: &Arc<H>,
    ) -> Result<(), ucs_status_t> {
        let route = Arc::new(Route {
            id,
            handler: handler.clone(),
        });
        self.kept.push(route.clone());
        // SAFETY: zeroed params with a field mask is the documented form.
        let mut hp: ucp_am_handler_param_t = unsafe { std::mem::zeroed() };
        hp.field_mask = (UCP_AM_HANDLER_PARAM_FIELD_ID
            | UCP_AM_HANDLER_PARAM_FIELD_CB
            | UCP_AM_HANDLER_PARAM_FIELD_ARG) as u64;
        hp.id = id;
        hp.cb = Some(am_trampoline::<H>);
        hp.arg = Arc::as_ptr(&route) as *mut c_void;
        // SAFETY: the worker is live; the argument is kept in `kept`, released only after
        // the worker is destroyed.
        let st = unsafe { self.ucx.lib.ucp_worker_set_am_recv_handler(self.raw, &hp) };
        if st == UCS_OK {
            Ok(())
        } else {
            Err(st)
        }
    }

    /// Proof that this worker's lock is held, for calls that take no handle.
    pub(crate) fn locked(&mut self) -> Locked<'_> {
        Locked(PhantomData)
    }

    /// Keeps `arg` alive until the worker is destroyed.
    pub(super) fn keep(&mut self, arg: Kept) {
        self.kept.push(arg);
    }

    /// The raw handle, for the other wrappers of this module tree.
    pub(super) fn raw(&self) -> ucp_worker_h {
        self.raw
    }

    /// The loaded library.
    pub(super) fn lib(&self) -> &UcxLib {
        &self.ucx.lib
    }

    /// One `ucp_worker_progress`.
    pub(crate) fn progress(&mut self) -> u32 {
        crate::reached::progress();
        // SAFETY: the worker is live and exclusively borrowed (locked).
        unsafe { self.ucx.lib.ucp_worker_progress(self.raw) }
    }

    /// `ucp_worker_arm`.
    pub(crate) fn arm(&mut self) -> ucs_status_t {
        // SAFETY: the worker is live and exclusively borrowed (locked).
        unsafe { self.ucx.lib.ucp_worker_arm(self.raw) }
    }

    /// `ucp_worker_signal`.
    pub(crate) fn signal(&self) {
        // SAFETY: the worker is live and borrowed under its lock.
        unsafe { self.ucx.lib.ucp_worker_signal(self.raw) };
    }

    /// Checks a request without waiting: the status it completed with (the request freed), or
    /// the request back while it is still in flight.
    pub(crate) fn poll_request(&mut self, req: Request) -> Result<ucs_status_t, Request> {
        let p = req.0;
        if !ptr_is_ptr(p) {
            return Ok(ptr_status(p));
        }
        // SAFETY: p is a live request of this worker, not yet freed.
        let st = unsafe { self.ucx.lib.ucp_request_check_status(p) };
        if st == UCS_INPROGRESS {
            return Err(req);
        }
        // SAFETY: completed request, freed once (consumed).
        unsafe { self.ucx.lib.ucp_request_free(p) };
        Ok(st)
    }

    /// Hands a request still in flight back to UCX, which finishes and releases it
    /// internally: buffers it uses must stay valid.
    pub(crate) fn release(&mut self, req: Request) {
        if ptr_is_ptr(req.0) {
            // SAFETY: a live request of this worker, released once (consumed).
            unsafe { self.ucx.lib.ucp_request_free(req.0) };
        }
    }

    /// Waits for a request to leave `UCS_INPROGRESS` (progressing), up to `deadline`, and
    /// frees it. Returns its status, or `None` on timeout (the request is then handed back to
    /// UCX, which finishes it internally: buffers it uses must stay valid). Holds the worker
    /// throughout: for waits bounded by microseconds (a close of an endpoint that has
    /// nothing in flight); `crate::worker::Worker::wait_request` waits without holding it.
    pub(crate) fn wait(&mut self, mut req: Request, deadline: Instant) -> Option<ucs_status_t> {
        loop {
            match self.poll_request(req) {
                Ok(st) => return Some(st),
                Err(r) => req = r,
            }
            if Instant::now() >= deadline {
                self.release(req);
                return None;
            }
            if self.progress() == 0 {
                std::thread::yield_now();
            }
        }
    }
}

impl Drop for WorkerH {
    fn drop(&mut self) {
        // SAFETY: the owner drops the handle once, after closing its endpoints (every endpoint
        // holder keeps the worker alive); `kept` is released after, below.
        unsafe { self.ucx.lib.ucp_worker_destroy(self.raw) };
        self.kept.clear();
    }
}

/// Sleeps until `fd` is readable or `timeout_ms` passes (`poll(2)` on one descriptor).
pub(crate) fn poll_in(fd: i32, timeout_ms: i32) {
    let mut p = PollFd {
        fd,
        events: POLLIN,
        revents: 0,
    };
    // SAFETY: p is one valid pollfd for the call.
    unsafe { poll(&mut p, 1, timeout_ms) };
}

/// An active message as a handler sees it (valid during the handler only).
pub(crate) struct AmMsg<'a> {
    /// The header, `None` when UCX passed a NULL pointer.
    pub header: Option<&'a [u8]>,
    /// The header length UCX reported.
    pub header_len: usize,
    /// The eager payload: `None` for a NULL pointer with a non-zero length, or for a
    /// rendezvous message (whose data is a descriptor, not bytes).
    pub data: Option<&'a [u8]>,
    /// The message came in rendezvous mode.
    pub rndv: bool,
    /// The endpoint the message came on, when the sender asked for replies.
    pub reply_ep: Option<u64>,
}

/// The receiver of active messages.
pub(crate) trait AmHandler: Send + Sync + 'static {
    /// Handles one message of AM id `id` (runs inside progress, under the worker lock).
    fn on_am(&self, id: u32, msg: AmMsg<'_>);
}

/// The argument of one installed handler: its id and the handler.
struct Route<H> {
    id: u32,
    handler: Arc<H>,
}

unsafe extern "C" fn am_trampoline<H: AmHandler>(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const ucp_am_recv_param_t,
) -> ucs_status_t {
    // SAFETY: arg is the `Arc<Route<H>>` registered with this handler, kept alive by the
    // worker until after it is destroyed.
    let route = unsafe { &*(arg as *const Route<H>) };
    // SAFETY: UCX passes a valid param struct (or NULL) for the duration of the callback.
    let p = unsafe { param.as_ref() };
    let attr = p.map_or(0, |p| p.recv_attr);
    let rndv = attr & UCP_AM_RECV_ATTR_FLAG_RNDV as u64 != 0;
    let reply_ep = p.and_then(|p| {
        (p.recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP as u64 != 0 && !p.reply_ep.is_null())
            .then_some(p.reply_ep as u64)
    });
    let header = (!header.is_null())
        // SAFETY: UCX guarantees header points to header_length readable bytes for the
        // duration of the callback (non-null here).
        .then(|| unsafe { std::slice::from_raw_parts(header as *const u8, header_length) });
    let data = if rndv {
        None
    } else if length == 0 {
        Some(&[][..])
    } else if data.is_null() {
        None
    } else {
        // SAFETY: an eager message's data points to `length` readable bytes for the
        // duration of the callback (non-null here).
        Some(unsafe { std::slice::from_raw_parts(data as *const u8, length) })
    };
    route.handler.on_am(
        route.id,
        AmMsg {
            header,
            header_len: header_length,
            data,
            rndv,
            reply_ep,
        },
    );
    UCS_OK
}
