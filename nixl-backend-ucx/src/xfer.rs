//! Transfers: a batch of `ucp_put_nbx`/`ucp_get_nbx` plus one `ucp_ep_flush_nbx`, and the
//! notification as an active message sent from the flush's completion callback — so it leaves
//! only after every byte of the batch is complete at the target, whether or not the initiator
//! keeps polling (the backend's progress thread completes the chain).

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nixl_core::backend::BackendXfer;
use nixl_core::{Error, Op, Result, XferOp, XferState};

use crate::endpoint::Peer;
use crate::error::status_error;
use crate::loader::Ucx;
use crate::sys;
use crate::worker::{WorkerGuard, AM_NOTIF};

const PENDING: u8 = 0;
const DONE: u8 = 1;
const FAILED: u8 = 2;

/// A notification: (header naming the sender, message).
pub(crate) type Notif = (Arc<[u8]>, Arc<[u8]>);

/// One post's completion state, shared with UCX callbacks.
pub(crate) struct PostState {
    phase: AtomicU8,
    status: AtomicI32,
    ucx: Arc<Ucx>,
    ep: sys::ucp_ep_h,
    /// (header, message) of the notification to send after the flush.
    notif: Option<Notif>,
}

// SAFETY: `ep` is only used inside UCX callbacks and `post`, both under the worker lock; the
// rest is atomics and immutable data.
unsafe impl Send for PostState {}
// SAFETY: as above.
unsafe impl Sync for PostState {}

impl PostState {
    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }

    fn finish(&self, status: sys::ucs_status_t) {
        self.status.store(status as i32, Ordering::Release);
        self.phase.store(
            if status == sys::UCS_OK { DONE } else { FAILED },
            Ordering::Release,
        );
    }

    /// After the data is complete: sends the notification, or finishes. Runs under the worker
    /// lock (from `post` or a callback inside progress).
    fn after_flush(self: &Arc<Self>) {
        let Some((header, msg)) = &self.notif else {
            self.finish(sys::UCS_OK);
            return;
        };
        // SAFETY: zeroed request params with a mask are the documented form.
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_CALLBACK
            | sys::UCP_OP_ATTR_FIELD_USER_DATA
            | sys::UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = crate::session::AM_FLAGS;
        p.cb.send = Some(am_done);
        let user = Arc::into_raw(self.clone());
        p.user_data = user as *mut c_void;
        // SAFETY: the endpoint is live (it is closed only under the worker lock, which the
        // caller holds, and a closed endpoint completes this state before); header and
        // message live in this state, which the callback keeps alive until completion.
        let r = unsafe {
            self.ucx.lib.ucp_am_send_nbx(
                self.ep,
                AM_NOTIF,
                header.as_ptr() as *const c_void,
                header.len(),
                msg.as_ptr() as *const c_void,
                msg.len(),
                &p,
            )
        };
        if !sys::ptr_is_ptr(r) {
            // Completed (or failed) immediately: the callback will not run.
            // SAFETY: reclaims the reference leaked above, once.
            drop(unsafe { Arc::from_raw(user) });
            self.finish(sys::ptr_status(r));
        }
    }
}

unsafe extern "C" fn flush_done(req: *mut c_void, status: sys::ucs_status_t, user: *mut c_void) {
    // SAFETY: user is the reference leaked for this request in `post`.
    let st = unsafe { Arc::from_raw(user as *const PostState) };
    // SAFETY: req is this callback's request, freed once.
    unsafe { st.ucx.lib.ucp_request_free(req) };
    if status == sys::UCS_OK {
        st.after_flush();
    } else {
        st.finish(status);
    }
}

unsafe extern "C" fn am_done(req: *mut c_void, status: sys::ucs_status_t, user: *mut c_void) {
    // SAFETY: user is the reference leaked for this request in `after_flush`.
    let st = unsafe { Arc::from_raw(user as *const PostState) };
    // SAFETY: req is this callback's request, freed once.
    unsafe { st.ucx.lib.ucp_request_free(req) };
    st.finish(status);
}

/// One merged segment: local address, remote address, length, local memory handle, rkey.
#[derive(Clone, Copy)]
pub(crate) struct Seg {
    pub local: u64,
    pub remote: u64,
    pub len: u64,
    pub memh: sys::ucp_mem_h,
    pub rkey: sys::ucp_rkey_h,
}

/// A prepared UCX transfer.
pub(crate) struct UcxXfer {
    pub agent: String,
    pub ucx: Arc<Ucx>,
    pub peer: Arc<Peer>,
    pub worker: usize,
    pub op: XferOp,
    pub mem_type: sys::ucs_memory_type_t,
    pub segs: Vec<Seg>,
    pub notif: Option<Notif>,
    /// This agent's notification header (for [`BackendXfer::set_notif`]).
    pub header: Arc<[u8]>,
    pub cancel_timeout: Duration,
    /// Keeps the segments' local and remote metadata (memory handles, rkeys) alive.
    pub _keep: Vec<nixl_core::backend::BackendMd>,
    pub cur: Option<Arc<PostState>>,
    pub path: OnceLock<String>,
}

// SAFETY: the raw handles in `segs` are owned by metadata kept alive in `_keep` and only used
// under the worker lock.
unsafe impl Send for UcxXfer {}

impl UcxXfer {
    fn disconnected(&self, op: Op, why: impl Into<String>) -> Error {
        Error::disconnected(&self.agent, &self.peer.name, op, why)
    }

    fn state_error(&self, op: Op, status: sys::ucs_status_t) -> Error {
        if let Some(st) = self.peer.eps[self.worker].shared.failed() {
            if st != sys::UCS_ERR_CANCELED {
                return self.disconnected(
                    op,
                    format!("UCX endpoint failed: {}", self.ucx.status_string(st)),
                );
            }
        }
        status_error(
            &self.ucx,
            &self.agent,
            Some(&self.peer.name),
            op,
            "transfer",
            status,
        )
    }

    fn outcome(&self, st: &PostState, op: Op) -> Result<XferState> {
        match st.phase() {
            DONE => Ok(XferState::Done),
            FAILED => {
                Err(self.state_error(op, st.status.load(Ordering::Acquire) as sys::ucs_status_t))
            }
            _ => Ok(XferState::InProgress),
        }
    }

    /// Issues one put/get; returns its status (`UCS_OK` or `UCS_INPROGRESS` are fine).
    fn issue(&self, ep: sys::ucp_ep_h, s: &Seg) -> sys::ucs_status_t {
        // SAFETY: zeroed request params with a mask are the documented form.
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_MEMORY_TYPE | sys::UCP_OP_ATTR_FIELD_MEMH;
        if self.segs.len() > 1 {
            // Many operations in flight: let UCX optimise for bandwidth (as NIXL does).
            p.op_attr_mask |= sys::UCP_OP_ATTR_FLAG_MULTI_SEND;
        }
        p.memory_type = self.mem_type;
        p.memh = s.memh;
        let lib = &self.ucx.lib;
        // SAFETY: the endpoint is live under the worker lock the caller holds; the local range
        // lies in a registration whose memory handle (and memory) the agent keeps alive while
        // the request exists; the remote range was checked by the agent against the peer's
        // region, whose rkey `_keep` holds.
        let r = unsafe {
            match self.op {
                XferOp::Write => lib.ucp_put_nbx(
                    ep,
                    s.local as *const c_void,
                    s.len as usize,
                    s.remote,
                    s.rkey,
                    &p,
                ),
                XferOp::Read => lib.ucp_get_nbx(
                    ep,
                    s.local as *mut c_void,
                    s.len as usize,
                    s.remote,
                    s.rkey,
                    &p,
                ),
            }
        };
        if sys::ptr_is_ptr(r) {
            // The following flush covers its completion; UCX releases it when done.
            // SAFETY: r is a live request, freed once, never used again.
            unsafe { lib.ucp_request_free(r) };
            sys::UCS_INPROGRESS
        } else {
            sys::ptr_status(r)
        }
    }

    /// After a put/get failed mid-batch: waits until UCX no longer touches the earlier
    /// segments' memory (flush, or force-close the endpoint).
    fn quiesce(&self, g: &mut WorkerGuard<'_>, ep: sys::ucp_ep_h) {
        // SAFETY: zeroed request params (no callback) make flush return a request to poll.
        let p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        // SAFETY: the endpoint is live under the held lock.
        let r = unsafe { self.ucx.lib.ucp_ep_flush_nbx(ep, &p) };
        if g.wait_request(r, Instant::now() + self.cancel_timeout)
            .is_none()
        {
            self.peer.eps[self.worker].force_close(g);
        }
    }

    fn progress_once(&self) {
        let mut g = self.peer.eps[self.worker].worker.lock();
        g.progress_all();
    }
}

impl BackendXfer for UcxXfer {
    fn post(&mut self) -> Result<XferState> {
        if self.cur.as_ref().is_some_and(|s| s.phase() == PENDING) {
            return Err(Error::RepostActive {
                agent: self.agent.clone(),
                op: Op::PostXfer,
            });
        }
        self.peer
            .check_alive(&self.agent, self.worker, Op::PostXfer)?;
        let pe = &self.peer.eps[self.worker];
        let mut g = pe.worker.lock();
        let ep = pe
            .raw(&g)
            .ok_or_else(|| self.disconnected(Op::PostXfer, "UCX endpoint was closed"))?;
        for (i, s) in self.segs.iter().enumerate() {
            let st = self.issue(ep, s);
            if st != sys::UCS_OK && st != sys::UCS_INPROGRESS {
                if i > 0 {
                    self.quiesce(&mut g, ep);
                }
                return Err(self.state_error(Op::PostXfer, st));
            }
        }
        let state = Arc::new(PostState {
            phase: AtomicU8::new(PENDING),
            status: AtomicI32::new(0),
            ucx: self.ucx.clone(),
            ep,
            notif: self.notif.clone(),
        });
        // SAFETY: zeroed request params with a mask are the documented form.
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.send = Some(flush_done);
        let user = Arc::into_raw(state.clone());
        p.user_data = user as *mut c_void;
        // SAFETY: the endpoint is live under the held lock; the callback reclaims `user`.
        let r = unsafe { self.ucx.lib.ucp_ep_flush_nbx(ep, &p) };
        if !sys::ptr_is_ptr(r) {
            // SAFETY: the callback will not run; reclaims the reference once.
            drop(unsafe { Arc::from_raw(user) });
            let st = sys::ptr_status(r);
            if st == sys::UCS_OK {
                state.after_flush();
            } else {
                state.finish(st);
            }
        }
        drop(g);
        self.cur = Some(state.clone());
        self.outcome(&state, Op::PostXfer)
    }

    fn check(&mut self) -> Result<XferState> {
        let Some(st) = self.cur.clone() else {
            return Err(Error::not_allowed(
                &self.agent,
                Op::CheckXfer,
                "never posted",
            ));
        };
        if st.phase() == PENDING {
            self.progress_once();
        }
        self.outcome(&st, Op::CheckXfer)
    }

    fn cancel(&mut self) -> Result<()> {
        let Some(st) = self.cur.clone() else {
            return Ok(());
        };
        // UCX cannot cancel RMA in flight: wait for it (bounded), then force-close the
        // endpoint, which completes every request on it.
        let deadline = Instant::now() + self.cancel_timeout;
        while st.phase() == PENDING && Instant::now() < deadline {
            self.progress_once();
            std::thread::yield_now();
        }
        if st.phase() == PENDING && self.peer.transports().contains("tcp/") {
            // Force-closing an endpoint whose tcp transport still has zero-copy operations in
            // flight crashes UCX's tcp progress (SIGSEGV in uct_tcp_iface_handle_events; see
            // docs/perf/failure.md). Report the cancel as unconfirmed instead: the agent then
            // keeps (leaks) the request's memory rather than freeing it under UCX.
            tracing::warn!(agent = %self.agent, remote = %self.peer.name, "cancel: UCX still owns the request; not force-closing a tcp endpoint");
            return Err(Error::backend(
                &self.agent,
                crate::UCX,
                Op::Cancel,
                "the transfer did not finish within cancel_timeout and a tcp endpoint cannot be force-closed safely; its memory stays allocated",
            ));
        }
        if st.phase() == PENDING {
            let pe = &self.peer.eps[self.worker];
            let mut g = pe.worker.lock();
            tracing::warn!(agent = %self.agent, remote = %self.peer.name, "cancel: force-closing the UCX endpoint");
            pe.force_close(&mut g);
            let end = Instant::now() + Duration::from_secs(2);
            while st.phase() == PENDING && Instant::now() < end {
                g.progress();
            }
        }
        if st.phase() == PENDING {
            return Err(Error::backend(
                &self.agent,
                crate::UCX,
                Op::Cancel,
                "UCX did not release the request",
            ));
        }
        Ok(())
    }

    fn path(&self) -> Option<String> {
        Some(self.path.get_or_init(|| self.peer.transports()).clone())
    }

    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        self.notif = msg.map(|m| (self.header.clone(), Arc::<[u8]>::from(m)));
        Ok(())
    }
}
