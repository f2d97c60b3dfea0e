//! Safe wrappers over endpoints and the requests posted on them. Every call takes the
//! worker's handle (`&WorkerH`/`&mut WorkerH`), which only the holder of the worker's lock can
//! reach. Handles ([`Ep`], [`Rkey`]) are created only here, from what UCX returned; their
//! owners above keep them alive while they are used (an endpoint is handed out only while not
//! closed, an rkey only while its metadata is kept).

use core::ffi::{c_char, c_void, CStr};
use std::sync::Arc;

use std::marker::PhantomData;

use super::worker::{Locked, Request, WorkerH};
use super::*;

/// A `ucp_ep_h` created by [`WorkerH::ep_create`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ep(ucp_ep_h);

/// A `ucp_rkey_h` unpacked by [`WorkerH::rkey_unpack`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rkey(ucp_rkey_h);

impl Ep {
    /// The handle's value: it names the connection, as [`crate::sys::AmMsg::reply_ep`] does on
    /// the receiving side (`crate::links`).
    pub(crate) fn id(self) -> u64 {
        self.0 as u64
    }
}

// SAFETY: endpoint and rkey handles are pointers UCX lets any thread use, one at a time: the
// wrappers below only use them with the worker's handle borrowed, i.e. under its lock.
unsafe impl Send for Ep {}
// SAFETY: as above.
unsafe impl Sync for Ep {}
// SAFETY: as above.
unsafe impl Send for Rkey {}
// SAFETY: as above.
unsafe impl Sync for Rkey {}

/// The receiver of an endpoint's error callback.
pub(crate) trait EpErrorHandler: Send + Sync + 'static {
    /// The endpoint failed with `status` (runs inside progress, under the worker lock).
    fn on_error(&self, status: ucs_status_t);
}

unsafe extern "C" fn ep_error<H: EpErrorHandler>(
    arg: *mut c_void,
    _ep: ucp_ep_h,
    status: ucs_status_t,
) {
    // SAFETY: arg is the `Arc<H>` registered with the endpoint, kept alive by the worker
    // until after it is destroyed.
    let h = unsafe { &*(arg as *const H) };
    h.on_error(status);
}

/// What a send's completion callback reaches: the library (to free the request) and what to
/// do with the status.
pub(crate) trait Completion: Send + Sync + Sized + 'static {
    /// The library the request belongs to.
    fn lib(&self) -> &UcxLib;
    /// A flush posted with [`WorkerH::flush`] completed (inside progress, under the lock).
    fn flushed(self: Arc<Self>, _status: ucs_status_t, _locked: &Locked<'_>) {}
    /// An active message posted with [`am_send`] completed (inside progress, under the
    /// lock).
    fn sent(self: Arc<Self>, _status: ucs_status_t, _locked: &Locked<'_>) {}
    /// A put or get issued with [`WorkerH::rma`] completed (inside progress, under the lock).
    fn rma_done(self: Arc<Self>, _status: ucs_status_t, _locked: &Locked<'_>) {}
}

/// The bytes of an active message that lives in its completion state until it completes.
pub(crate) trait AmPayload {
    /// (AM id, send flags, header, message).
    fn am_payload(&self) -> (u32, u32, &[u8], &[u8]);
}

unsafe extern "C" fn flush_cb<T: Completion>(
    req: *mut c_void,
    st: ucs_status_t,
    user: *mut c_void,
) {
    // SAFETY: user is the reference leaked for this request in `WorkerH::flush`.
    let t = unsafe { Arc::from_raw(user as *const T) };
    // SAFETY: req is this callback's request, freed once.
    unsafe { t.lib().ucp_request_free(req) };
    // Completion callbacks run inside ucp_worker_progress, under the worker lock.
    t.flushed(st, &Locked(PhantomData));
}

unsafe extern "C" fn rma_cb<T: Completion>(req: *mut c_void, st: ucs_status_t, user: *mut c_void) {
    // SAFETY: user is the reference leaked for this request in `WorkerH::rma`.
    let t = unsafe { Arc::from_raw(user as *const T) };
    // SAFETY: req is this callback's request, freed once.
    unsafe { t.lib().ucp_request_free(req) };
    // Completion callbacks run inside ucp_worker_progress, under the worker lock.
    t.rma_done(st, &Locked(PhantomData));
}

unsafe extern "C" fn sent_cb<T: Completion>(req: *mut c_void, st: ucs_status_t, user: *mut c_void) {
    // SAFETY: user is the reference leaked for this request in `WorkerH::am_send`.
    let t = unsafe { Arc::from_raw(user as *const T) };
    // SAFETY: req is this callback's request, freed once.
    unsafe { t.lib().ucp_request_free(req) };
    // Completion callbacks run inside ucp_worker_progress, under the worker lock.
    t.sent(st, &Locked(PhantomData));
}

/// Zeroed request parameters (the documented "no fields" form).
fn params() -> ucp_request_param_t {
    // SAFETY: ucp_request_param_t is a plain C struct; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// The error handling of [`WorkerH::ep_create`].
pub(crate) enum ErrMode<'a, H> {
    /// `UCP_ERR_HANDLING_MODE_PEER`, reporting to the handler (kept alive by the worker).
    Peer(&'a Arc<H>),
    /// `UCP_ERR_HANDLING_MODE_NONE`, set explicitly.
    None,
    /// No error-handling field (UCX's default).
    Unset,
}

/// One put or get of [`WorkerH::rma`].
pub(crate) struct Rma {
    /// Write (put) or read (get).
    pub write: bool,
    /// Local address.
    pub local: u64,
    /// Remote address.
    pub remote: u64,
    /// Length in bytes.
    pub len: u64,
    /// The local registration's memory handle.
    pub memh: MemH,
    /// The remote region's key.
    pub rkey: Rkey,
    /// The local memory type.
    pub mem_type: ucs_memory_type_t,
    /// Many operations in flight (`UCP_OP_ATTR_FLAG_MULTI_SEND`).
    pub multi: bool,
}

impl WorkerH {
    /// `ucp_ep_create` to the worker address `address` with error handling `mode`.
    ///
    /// `address` must be a worker address checked by `crate::validate` (or this UCX's own):
    /// UCX parses it.
    pub(crate) fn ep_create<H: EpErrorHandler>(
        &mut self,
        address: &[u8],
        mode: ErrMode<'_, H>,
    ) -> Result<Ep, ucs_status_t> {
        // SAFETY: zeroed params with a field mask is the documented form.
        let mut p: ucp_ep_params_t = unsafe { std::mem::zeroed() };
        p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS as u64;
        p.address = address.as_ptr() as *const ucp_address_t;
        match mode {
            ErrMode::Peer(h) => {
                self.keep(h.clone());
                p.field_mask |=
                    (UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64;
                p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
                p.err_handler.cb = Some(ep_error::<H>);
                p.err_handler.arg = Arc::as_ptr(h) as *mut c_void;
            }
            ErrMode::None => {
                p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE as u64;
                p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
            }
            ErrMode::Unset => {}
        }
        let mut ep: ucp_ep_h = std::ptr::null_mut();
        crate::reached::ep_create();
        // SAFETY: the worker is live and locked; the address bytes are a checked worker
        // address (this function's contract) and outlive the call (UCX copies what it keeps);
        // the handler argument is kept alive by the worker (above).
        let st = unsafe { self.lib().ucp_ep_create(self.raw(), &p, &mut ep) };
        if st == UCS_OK {
            Ok(Ep(ep))
        } else {
            Err(st)
        }
    }

    /// Issues one put/get whose completion calls `user.rma_done` with its own status (UCX
    /// reports each operation's failure there, not in a later flush). Returns `UCS_INPROGRESS`
    /// when the callback will run, else the status it completed with at once (no callback
    /// then).
    ///
    /// The local range must lie in the registration of `memh` and the remote one in the
    /// region of `rkey` (checked by the agent), both kept alive until the callback ran.
    pub(crate) fn rma<T: Completion>(&mut self, ep: Ep, op: &Rma, user: &Arc<T>) -> ucs_status_t {
        let mut p = params();
        p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE
            | UCP_OP_ATTR_FIELD_MEMH
            | UCP_OP_ATTR_FIELD_CALLBACK
            | UCP_OP_ATTR_FIELD_USER_DATA;
        if op.multi {
            p.op_attr_mask |= UCP_OP_ATTR_FLAG_MULTI_SEND;
        }
        p.memory_type = op.mem_type;
        p.memh = op.memh.0;
        p.cb.send = Some(rma_cb::<T>);
        let u = Arc::into_raw(user.clone());
        p.user_data = u as *mut c_void;
        let lib = self.lib();
        crate::reached::rma_post();
        // SAFETY: the endpoint is live under the worker lock (borrowed self); the local range
        // lies in a registration whose memory handle (and memory) the caller keeps alive
        // while the request exists; the remote range was checked against the region whose
        // rkey the caller keeps; the callback reclaims `u`.
        let r = unsafe {
            if op.write {
                lib.ucp_put_nbx(
                    ep.0,
                    op.local as *const c_void,
                    op.len as usize,
                    op.remote,
                    op.rkey.0,
                    &p,
                )
            } else {
                lib.ucp_get_nbx(
                    ep.0,
                    op.local as *mut c_void,
                    op.len as usize,
                    op.remote,
                    op.rkey.0,
                    &p,
                )
            }
        };
        if ptr_is_ptr(r) {
            return UCS_INPROGRESS;
        }
        // SAFETY: the callback will not run; reclaims the reference leaked above, once.
        drop(unsafe { Arc::from_raw(u) });
        ptr_status(r)
    }

    /// `ucp_ep_flush_nbx` whose completion calls `user.flushed`. Returns `None` when the
    /// callback will run, or the status it completed with at once (no callback then).
    pub(crate) fn flush<T: Completion>(&mut self, ep: Ep, user: &Arc<T>) -> Option<ucs_status_t> {
        let mut p = params();
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.send = Some(flush_cb::<T>);
        let u = Arc::into_raw(user.clone());
        p.user_data = u as *mut c_void;
        // SAFETY: the endpoint is live under the held lock; the callback reclaims `u`.
        let r = unsafe { self.lib().ucp_ep_flush_nbx(ep.0, &p) };
        if ptr_is_ptr(r) {
            return None;
        }
        // SAFETY: the callback will not run; reclaims the reference leaked above, once.
        drop(unsafe { Arc::from_raw(u) });
        Some(ptr_status(r))
    }

    /// Sends an active message: the request to wait for, and its buffers, which must stay
    /// valid until UCX released the request ([`AmSend::leak`] when it did not finish).
    pub(crate) fn am_send_request(
        &mut self,
        ep: Ep,
        (id, flags): (u32, u32),
        header: Arc<[u8]>,
        msg: Arc<[u8]>,
    ) -> AmSend {
        let mut p = params();
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = flags;
        // SAFETY: the endpoint is live under the held lock; header and message are owned by
        // the returned value, which the caller keeps until the request is released (or leaks).
        let r = unsafe { am_send_nbx(self.lib(), ep, id, (&header, &msg), &p) };
        AmSend {
            req: Request::new(r),
            bufs: AmBufs {
                _header: header,
                _msg: msg,
            },
        }
    }

    /// `ucp_ep_flush_nbx` without a callback: the request to wait for.
    pub(crate) fn flush_request(&mut self, ep: Ep) -> Request {
        let p = params();
        // SAFETY: the endpoint is live under the held worker lock; without a callback UCX
        // returns a request to poll.
        Request::new(unsafe { self.lib().ucp_ep_flush_nbx(ep.0, &p) })
    }

    /// `ucp_ep_close_nbx` (`UCP_EP_CLOSE_FLAG_FORCE` with `force`): the request to wait for.
    /// The endpoint must not be used afterwards.
    pub(crate) fn close_request(&mut self, ep: Ep, force: bool) -> Request {
        let mut p = params();
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = if force { UCP_EP_CLOSE_FLAG_FORCE } else { 0 };
        // SAFETY: ep is a live endpoint of this locked worker, closed once (its owner marks
        // it closed and never hands it out again).
        Request::new(unsafe { self.lib().ucp_ep_close_nbx(ep.0, &p) })
    }

    /// The transports of an endpoint as `tl/device, ...` (UCX >= 1.14 only: the caller
    /// checks the version).
    pub(crate) fn ep_transports(&self, ep: Ep) -> String {
        let mut entries = [TransportEntry {
            transport_name: std::ptr::null(),
            device_name: std::ptr::null(),
        }; 16];
        // SAFETY: a zeroed attribute struct is a valid "no fields" value.
        let mut attr: EpAttrV114 = unsafe { std::mem::zeroed() };
        attr.field_mask = UCP_EP_ATTR_FIELD_TRANSPORTS;
        attr.transports = Transports {
            entries: entries.as_mut_ptr(),
            num_entries: entries.len() as u32,
            entry_size: std::mem::size_of::<TransportEntry>(),
        };
        // SAFETY: the endpoint is live under the locked worker; UCX >= 1.14 (checked by the
        // caller) reads the 1.14 layout of ucp_ep_attr_t and writes at most num_entries
        // entries of entry_size bytes into the array, which outlives the call.
        let st = unsafe {
            self.lib()
                .ucp_ep_query(ep.0, &mut attr as *mut EpAttrV114 as *mut ucp_ep_attr_t)
        };
        if st != UCS_OK {
            return format!("ucp_ep_query failed ({st})");
        }
        let n = (attr.transports.num_entries as usize).min(entries.len());
        let s = |p: *const c_char| {
            if p.is_null() {
                "?".to_owned()
            } else {
                // SAFETY: UCX wrote NUL-terminated names valid while the endpoint lives.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        let mut parts: Vec<String> = entries[..n]
            .iter()
            .map(|e| format!("{}/{}", s(e.transport_name), s(e.device_name)))
            .collect();
        parts.dedup();
        parts.join(", ")
    }

    /// What `ucp_ep_print_info` prints for an endpoint (`None`: nothing was written), or an
    /// error when the stream could not be opened.
    pub(crate) fn ep_print_info(&self, ep: Ep) -> Result<Option<String>, &'static str> {
        let mut buf: *mut c_char = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: both out-pointers are valid; the stream is closed below.
        let f = unsafe { open_memstream(&mut buf, &mut size) };
        if f.is_null() {
            return Err("open_memstream failed");
        }
        // SAFETY: the endpoint is live under the locked worker; f is an open stream.
        unsafe { self.lib().ucp_ep_print_info(ep.0, f as *mut _) };
        // SAFETY: f is open; closing it finalises buf/size.
        unsafe { fclose(f) };
        if buf.is_null() {
            return Ok(None);
        }
        // SAFETY: buf holds `size` bytes written by the stream, NUL-terminated.
        let text = unsafe { CStr::from_ptr(buf) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: buf was allocated by open_memstream with malloc, freed once.
        unsafe { free(buf as *mut c_void) };
        Ok(Some(text))
    }

    /// UCX's estimate of the time to move `len` bytes on `ep`, in seconds.
    pub(crate) fn ep_estimate(&self, ep: Ep, len: u64) -> Result<f64, ucs_status_t> {
        // SAFETY: zeroed parameter structs with field masks are the documented form.
        let mut p: ucp_ep_evaluate_perf_param_t = unsafe { std::mem::zeroed() };
        p.field_mask = UCP_EP_PERF_PARAM_FIELD_MESSAGE_SIZE as u64;
        p.message_size = len as usize;
        // SAFETY: as above.
        let mut a: ucp_ep_evaluate_perf_attr_t = unsafe { std::mem::zeroed() };
        a.field_mask = UCP_EP_PERF_ATTR_FIELD_ESTIMATED_TIME as u64;
        // SAFETY: the endpoint is live under the held lock; both structs are valid.
        let st = unsafe { self.lib().ucp_ep_evaluate_perf(ep.0, &p, &mut a) };
        if st == UCS_OK {
            Ok(a.estimated_time)
        } else {
            Err(st)
        }
    }

    /// Unpacks a remote key on `ep`. `padded` must be a packed key checked by
    /// `crate::validate` (or structurally, from NIXL peers), followed by zero padding.
    pub(crate) fn rkey_unpack(&self, ep: Ep, padded: &[u8]) -> Result<Rkey, ucs_status_t> {
        let mut rkey: ucp_rkey_h = std::ptr::null_mut();
        crate::reached::rkey_unpack();
        // SAFETY: the endpoint is live under the locked worker; the packed bytes were checked
        // (this function's contract), are followed by zero padding, and outlive the call.
        let st = unsafe {
            self.lib()
                .ucp_ep_rkey_unpack(ep.0, padded.as_ptr() as *const c_void, &mut rkey)
        };
        if st == UCS_OK {
            Ok(Rkey(rkey))
        } else {
            Err(st)
        }
    }

    /// Destroys a remote key unpacked on an endpoint of this worker (never used again).
    pub(crate) fn rkey_destroy(&self, rkey: Rkey) {
        // SAFETY: rkey was unpacked on this worker's endpoint and its owner destroys it
        // once, under the worker lock, before the endpoint is released.
        unsafe { self.lib().ucp_rkey_destroy(rkey.0) };
    }
}

/// An active message in flight ([`WorkerH::am_send_request`]): the request, and the buffers
/// UCX reads until it is released.
#[must_use = "the request must be waited for"]
pub(crate) struct AmSend {
    pub req: Request,
    pub bufs: AmBufs,
}

/// The buffers of an active message in flight.
pub(crate) struct AmBufs {
    _header: Arc<[u8]>,
    _msg: Arc<[u8]>,
}

impl AmBufs {
    /// The request did not finish and was handed to UCX: the buffers stay allocated forever,
    /// as UCX may still read them.
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

/// `ucp_am_send_nbx` of `header` and `msg` on `ep` with `p`.
///
/// # Safety
/// `ep` is live and its worker locked; `header` and `msg` stay valid until UCX has released
/// the returned request (or at once, where it returns a status).
unsafe fn am_send_nbx(
    lib: &UcxLib,
    ep: Ep,
    id: u32,
    (header, msg): (&[u8], &[u8]),
    p: &ucp_request_param_t,
) -> ucs_status_ptr_t {
    // SAFETY: the caller's contract above.
    unsafe {
        lib.ucp_am_send_nbx(
            ep.0,
            id,
            header.as_ptr() as *const c_void,
            header.len(),
            msg.as_ptr() as *const c_void,
            msg.len(),
            p,
        )
    }
}

/// `ucp_am_send_nbx` of `user`'s payload (which lives in `user` until the completion,
/// which calls `user.sent`). Returns `None` when the callback will run, or the status it
/// completed with at once (no callback then).
pub(crate) fn am_send<T: Completion + AmPayload>(
    _locked: &Locked<'_>,
    ep: Ep,
    user: &Arc<T>,
) -> Option<ucs_status_t> {
    let (id, flags, header, msg) = user.am_payload();
    let mut p = params();
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = flags;
    p.cb.send = Some(sent_cb::<T>);
    let u = Arc::into_raw(user.clone());
    p.user_data = u as *mut c_void;
    // SAFETY: the endpoint is live under the held lock (`_locked`); header and message live in
    // `user`, which the leaked reference keeps alive until the callback.
    let r = unsafe { am_send_nbx(user.lib(), ep, id, (header, msg), &p) };
    if ptr_is_ptr(r) {
        return None;
    }
    // SAFETY: the callback will not run; reclaims the reference leaked above, once.
    drop(unsafe { Arc::from_raw(u) });
    Some(ptr_status(r))
}
