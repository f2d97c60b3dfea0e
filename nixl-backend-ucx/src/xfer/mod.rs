//! Transfers: a batch of `ucp_put_nbx`/`ucp_get_nbx` plus one `ucp_ep_flush_nbx`, and the
//! notification as an active message sent once every part of the post completed — so it
//! leaves only after every byte of the batch is complete at the target, whether or not the
//! initiator keeps polling (the backend's progress thread completes the chain).
//!
//! A post is `Done` only when every put/get reported success through its own completion
//! callback and the flush did too: UCX reports an operation's failure (its peer died, its
//! endpoint was closed) in that operation's status, while the flush may still complete with
//! `UCS_OK` (a READ from a killed peer over tcp did, with most of its bytes missing). The post
//! ends when its last part does, so a terminal post has nothing left in flight: it is
//! quiescent.

pub(crate) mod notify;
pub(crate) mod prepare;
pub(crate) mod work;

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nixl_core::backend::BackendXfer;
use nixl_core::{Error, Op, Result, XferOp, XferState};

use crate::endpoint::{EpShared, Peer};
use crate::error::status_error;
use crate::loader::Ucx;
use crate::sys;
use crate::work::{Seg, Work};

const PENDING: u8 = 0;
const DONE: u8 = 1;
const FAILED: u8 = 2;

/// Requests up to this size are progressed inside `post` until done (or until a pass finds
/// nothing to do): over shared-memory copy transports (cma, UCX's "scopy") a put/get only
/// queues its copy, which the worker's progress performs, so a small request is then complete
/// when `post` returns, without a `check` round trip. Larger ones return at once, leaving the
/// copy to `check` or the progress thread.
const INLINE_PROGRESS_BYTES: u64 = 256 << 10;

/// Most progress passes one `check` makes while the request stays in flight.
const CHECK_PASSES: usize = 64;

/// A notification: (active-message id, header naming the sender, message).
pub(crate) type Notif = (u32, Arc<[u8]>, Arc<[u8]>);

/// A notification from `agent` to `peer` in the format the peer reads: nixl-rs' (its own AM id,
/// `header` naming the sender) or NIXL's (AM 0, no header, a `nixlSerDes` payload).
pub(crate) fn make_notif(agent: &str, header: &Arc<[u8]>, peer: &Peer, msg: &[u8]) -> Notif {
    if peer.nixl {
        let payload = nixl_core::nixl_wire::notif::encode_notif(agent, msg);
        (crate::session::AM_NIXL, Arc::from(&[][..]), payload.into())
    } else {
        (crate::session::AM_NOTIF, header.clone(), msg.into())
    }
}

/// One post's completion state, shared with UCX callbacks.
pub(crate) struct PostState {
    phase: AtomicU8,
    status: AtomicI32,
    ucx: Arc<Ucx>,
    /// Wakes the agent's futures when the post finishes.
    wake: nixl_core::backend::Wake,
    /// The endpoint the notification goes on (the peer's shared-memory notification endpoint
    /// where it has one).
    ep: sys::Ep,
    /// The endpoint's shared state: its in-flight count (this post is one until it
    /// finishes) and whether it was closed or fenced.
    shared: Arc<EpShared>,
    /// (AM id, header, message) of the notification to send after the flush.
    notif: Option<Notif>,
    /// Parts of the post not complete yet: the issuer (until it has issued every put/get and
    /// the flush), each put/get whose callback is pending, and the flush. The last part to
    /// complete concludes the post. Changed only under the worker lock.
    pending: AtomicUsize,
    /// The first failure among the post's puts/gets, or of one that could not be issued
    /// (`UCS_OK`: none): the post ends with it, once every part completed, and sends no
    /// notification.
    op_error: AtomicI32,
    /// The flush's status.
    flush_status: AtomicI32,
    /// The agent let the request go ([`BackendXfer::abandon`]): once its data is complete it
    /// ends canceled, sending no notification.
    abandoned: AtomicBool,
}

impl PostState {
    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }

    /// Records the outcome, once (later calls change nothing).
    fn finish(&self, status: sys::ucs_status_t) {
        self.status.store(status as i32, Ordering::Release);
        let phase = if status == sys::UCS_OK { DONE } else { FAILED };
        if self
            .phase
            .compare_exchange(PENDING, phase, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.shared.end_op();
            self.wake.wake();
        }
    }

    /// One part of the post completed; the last one concludes it. Runs under the worker lock.
    fn part_done(self: &Arc<Self>, locked: &sys::Locked<'_>) {
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.conclude(locked);
        }
    }

    /// Every part completed: the first failure ends the post, else the data is complete.
    fn conclude(self: &Arc<Self>, locked: &sys::Locked<'_>) {
        for st in [&self.op_error, &self.flush_status] {
            let st = st.load(Ordering::Acquire) as sys::ucs_status_t;
            if st != sys::UCS_OK {
                self.finish(st);
                return;
            }
        }
        self.after_flush(locked);
    }

    /// Records a put/get's failure (the first one is kept).
    fn op_failed(&self, status: sys::ucs_status_t) {
        let _ = self.op_error.compare_exchange(
            sys::UCS_OK as i32,
            status as i32,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// After the data is complete: sends the notification, or finishes. Runs under the worker
    /// lock (from `post` or a callback inside progress).
    fn after_flush(self: &Arc<Self>, locked: &sys::Locked<'_>) {
        if self.abandoned.load(Ordering::Acquire) {
            self.finish(sys::UCS_ERR_CANCELED);
            return;
        }
        if self.notif.is_none() {
            self.finish(sys::UCS_OK);
            return;
        }
        if self.shared.is_closed() {
            // The endpoint was fenced or closed under this post (its peer was forgotten):
            // the data is complete but the notification cannot be sent on it.
            self.finish(sys::UCS_ERR_CANCELED);
            return;
        }
        // The endpoint is live: it is closed or fenced only under the worker lock, which the
        // caller holds, and a closed or fenced one was refused above.
        if let Some(st) = sys::am_send(locked, self.ep, self) {
            // Completed (or failed) immediately: the callback will not run.
            self.finish(st);
        }
    }
}

impl sys::Completion for PostState {
    fn lib(&self) -> &sys::UcxLib {
        &self.ucx.lib
    }

    fn flushed(self: Arc<Self>, status: sys::ucs_status_t, locked: &sys::Locked<'_>) {
        self.flush_status.store(status as i32, Ordering::Release);
        self.part_done(locked);
    }

    fn rma_done(self: Arc<Self>, status: sys::ucs_status_t, locked: &sys::Locked<'_>) {
        if status != sys::UCS_OK {
            self.op_failed(status);
        }
        self.part_done(locked);
    }

    fn sent(self: Arc<Self>, status: sys::ucs_status_t, _locked: &sys::Locked<'_>) {
        self.finish(status);
    }
}

impl sys::AmPayload for PostState {
    fn am_payload(&self) -> (u32, u32, &[u8], &[u8]) {
        match &self.notif {
            Some((id, header, msg)) => (*id, crate::session::am_flags(*id), header, msg),
            None => (0, 0, &[], &[]),
        }
    }
}

/// A prepared UCX transfer.
pub(crate) struct UcxXfer {
    pub agent: String,
    pub ucx: Arc<Ucx>,
    pub wake: nixl_core::backend::Wake,
    pub peer: Arc<Peer>,
    pub worker: usize,
    pub op: XferOp,
    pub mem_type: sys::ucs_memory_type_t,
    pub work: Work,
    pub notif: Option<Notif>,
    /// This agent's notification header (for [`BackendXfer::set_notif`]).
    pub header: Arc<[u8]>,
    pub cancel_timeout: Duration,
    /// Keeps the segments' local and remote metadata (memory handles, rkeys) alive.
    pub _keep: nixl_core::backend::MdTable,
    pub cur: Option<Arc<PostState>>,
    pub path: OnceLock<String>,
    /// Total bytes per post (for [`INLINE_PROGRESS_BYTES`]).
    pub bytes: u64,
    /// Copies made by the backend itself (same-host host memory where UCX would use CMA),
    /// instead of UCX puts and gets (`crate::cma`).
    pub direct: Option<crate::direct_cma::Direct>,
    /// Threads for the pieces of large direct copies (`None`: copied inside `post`).
    pub pool: Option<Arc<crate::direct_cma::CopyPool>>,
    /// The latest post's pieces, when it went to the pool.
    pub flight: Option<Arc<crate::direct_cma::Flight>>,
}

impl UcxXfer {
    /// Opens a post on `pe`'s endpoint (one more operation in flight on it) and returns the
    /// endpoint and the post's completion state, whose notification goes on the peer's
    /// notification endpoint where it has one. `g`: the worker, locked.
    fn open_post(
        &mut self,
        pe: &crate::endpoint::PeerEp,
        g: &crate::worker::WorkerGuard<'_>,
    ) -> Result<(sys::Ep, Arc<PostState>)> {
        let ep = pe
            .raw(g)
            .ok_or_else(|| self.disconnected(Op::PostXfer, "UCX endpoint was closed"))?;
        pe.shared.begin_op();
        let notif_ep = pe.notif_raw(g).unwrap_or(ep);
        let ucx = (&self.ucx, &self.wake);
        let state = fresh_state(&mut self.cur, ucx, &self.notif, notif_ep, &pe.shared);
        Ok((ep, state))
    }

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
                if let Some(e) = self.flight.as_ref().and_then(|f| f.error()) {
                    return Err(crate::direct_cma::error(
                        &self.agent,
                        &self.peer.name,
                        op,
                        &e,
                    ));
                }
                Err(self.state_error(op, st.status.load(Ordering::Acquire) as sys::ucs_status_t))
            }
            _ => Ok(XferState::InProgress),
        }
    }

    /// Issues one put/get whose completion `state` counts; returns its status (`UCS_OK` or
    /// `UCS_INPROGRESS`, the callback pending, are fine).
    fn issue(
        &self,
        w: &mut sys::WorkerH,
        ep: sys::Ep,
        s: &Seg,
        state: &Arc<PostState>,
    ) -> sys::ucs_status_t {
        // The local range lies in a registration whose memory handle (and memory) the agent
        // keeps alive while the request exists; the remote range was checked by the agent
        // against the peer's region, whose rkey `_keep` holds.
        w.rma(
            ep,
            &sys::Rma {
                write: self.op == XferOp::Write,
                local: s.local,
                remote: s.remote,
                len: s.len,
                memh: s.memh,
                rkey: s.rkey,
                mem_type: self.mem_type,
                // Many operations in flight: let UCX optimise for bandwidth (as NIXL does).
                multi: self.work.len() > 1,
            },
            state,
        )
    }

    fn progress_once(&self) {
        let mut g = self.peer.eps[self.worker].worker.lock();
        g.progress_all();
    }

    /// Progresses the worker until `st` leaves `PENDING` or a pass finds nothing to do
    /// (bounded): no idle pass after the one that completed it.
    fn progress_until(&self, st: &PostState) {
        let mut g = self.peer.eps[self.worker].worker.lock();
        for _ in 0..CHECK_PASSES {
            if g.progress() == 0 || st.phase() != PENDING {
                break;
            }
        }
    }
}

impl UcxXfer {
    /// A large direct copy: cut into pieces copied by the pool's threads; the last piece to
    /// finish sends the notification (or fails the post). Returns at once.
    fn post_pieces(
        &mut self,
        pool: &Arc<crate::direct_cma::CopyPool>,
        target: crate::direct_cma::Target,
    ) -> Result<XferState> {
        use crate::sys::cma::IoVec;
        let mut ranges = Vec::with_capacity(self.work.len());
        let mut bad = false;
        self.work.each(|s| {
            let (Ok(l), Ok(r), Ok(n)) = (
                usize::try_from(s.local),
                usize::try_from(s.remote),
                usize::try_from(s.len),
            ) else {
                bad = true;
                return false;
            };
            ranges.push((IoVec { base: l, len: n }, IoVec { base: r, len: n }));
            true
        });
        if bad {
            return Err(Error::invalid(
                &self.agent,
                Op::PostXfer,
                "an address beyond this machine's address space",
            ));
        }
        // Pieces of MIN_PIECE bytes, taken in turn by the copy threads and `check`.
        let pieces = crate::direct_cma::split(&ranges, usize::MAX);
        let peer = self.peer.clone();
        let pe = &peer.eps[self.worker];
        let (_, state) = self.open_post(pe, &pe.worker.lock())?;
        let (st, peer, worker) = (state.clone(), self.peer.clone(), self.worker);
        // Notifications keep post order on the endpoint: this flight finishes after the last.
        let mut last = pe.last_flight.lock();
        let prev = last.upgrade().filter(|f| !f.is_finished());
        let flight = crate::direct_cma::Flight::after(
            prev,
            target,
            self.op == XferOp::Write,
            pieces,
            Box::new(move |f| finish_pieces(f, &st, &peer, worker)),
        );
        *last = Arc::downgrade(&flight);
        drop(last);
        self.flight = Some(flight.clone());
        // Every copy thread works on the flight until no piece is left; the application's
        // `check` joins in.
        let jobs: Vec<Box<dyn FnOnce() + Send>> = (0..pool.size.min(flight.len()))
            .map(|_| {
                let f = flight.clone();
                // Crate invariant (`Flight::work`'s): the local ranges lie in registrations
                // `_keep` holds until this post is no longer pending (cancel waits for it).
                Box::new(move || f.work()) as Box<dyn FnOnce() + Send>
            })
            .collect();
        for job in pool.run_all(jobs) {
            // The pool has stopped (the backend is going away): copy here.
            job();
        }
        self.outcome(&state, Op::PostXfer)
    }

    /// After direct copies (complete): the notification, if any, goes out on the endpoint
    /// (it follows the data) and the post is done, or in flight until UCX has sent it. When
    /// a post copied in pieces before this one has not finished yet, this notification waits
    /// for it without anyone blocking: it is chained after that flight (a flight without
    /// pieces) and goes out when it finishes, so it follows that post's data too, as UCX's
    /// flush would have it; the post returns at once. A post without a notification waits
    /// for nothing.
    fn complete_direct(&mut self) -> Result<XferState> {
        let peer = self.peer.clone();
        let pe = &peer.eps[self.worker];
        let mut last = pe.last_flight.lock();
        let prev = last.upgrade().filter(|f| !f.is_finished());
        let (_, state) = self.open_post(pe, &pe.worker.lock())?;
        match (prev, &self.direct) {
            (Some(prev), Some(d)) if self.notif.is_some() => {
                let (st, peer, worker) = (state.clone(), self.peer.clone(), self.worker);
                let flight = crate::direct_cma::Flight::after(
                    Some(prev),
                    d.target().clone(),
                    self.op == XferOp::Write,
                    Vec::new(),
                    Box::new(move |f| finish_pieces(f, &st, &peer, worker)),
                );
                *last = Arc::downgrade(&flight);
                self.flight = Some(flight);
            }
            _ => {
                drop(last);
                let mut g = pe.worker.lock();
                state.after_flush(&g.h().locked());
            }
        }
        self.outcome(&state, Op::PostXfer)
    }
}

/// The last piece of a large direct copy finished: the post fails, is canceled, or sends its
/// notification (it follows the data) and is done.
fn finish_pieces(
    flight: &crate::direct_cma::Flight,
    state: &Arc<PostState>,
    peer: &Peer,
    worker: usize,
) {
    if flight.error().is_some() {
        state.finish(sys::UCS_ERR_IO_ERROR);
    } else if flight.stopped() {
        state.finish(sys::UCS_ERR_CANCELED);
    } else {
        let pe = &peer.eps[worker];
        let mut g = pe.worker.lock();
        state.after_flush(&g.h().locked());
    }
}

/// A post's completion state: the previous one (`cur`) reset when no UCX callback holds it any
/// more (no allocation per post), else a new one; `cur` is set to it.
fn fresh_state(
    cur: &mut Option<Arc<PostState>>,
    (ucx, wake): (&Arc<Ucx>, &nixl_core::backend::Wake),
    notif: &Option<Notif>,
    ep: sys::Ep,
    shared: &Arc<EpShared>,
) -> Arc<PostState> {
    if let Some(arc) = cur.as_mut() {
        if let Some(st) = Arc::get_mut(arc) {
            st.phase = AtomicU8::new(PENDING);
            st.status = AtomicI32::new(0);
            st.ep = ep;
            st.notif.clone_from(notif);
            if !Arc::ptr_eq(&st.shared, shared) {
                st.shared = shared.clone();
            }
            st.pending = AtomicUsize::new(1);
            st.op_error = AtomicI32::new(sys::UCS_OK as i32);
            st.flush_status = AtomicI32::new(sys::UCS_OK as i32);
            st.abandoned = AtomicBool::new(false);
            return arc.clone();
        }
    }
    let st = Arc::new(PostState {
        phase: AtomicU8::new(PENDING),
        status: AtomicI32::new(0),
        ucx: ucx.clone(),
        wake: wake.clone(),
        ep,
        shared: shared.clone(),
        notif: notif.clone(),
        pending: AtomicUsize::new(1),
        op_error: AtomicI32::new(sys::UCS_OK as i32),
        flush_status: AtomicI32::new(sys::UCS_OK as i32),
        abandoned: AtomicBool::new(false),
    });
    *cur = Some(st.clone());
    st
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
        if let Some(d) = self.direct.as_mut() {
            self.flight = None;
            if self.bytes > crate::direct_cma::INLINE_BYTES {
                if let Some(pool) = self.pool.clone() {
                    let target = d.target().clone();
                    return self.post_pieces(&pool, target);
                }
            }
            // Crate invariant (`Direct::run`'s): the segments' local ranges lie in
            // registrations `_keep` holds; the agent keeps them unused by others meanwhile.
            if let Err(e) = d.run(self.op == XferOp::Write, &self.work) {
                return Err(crate::direct_cma::error(
                    &self.agent,
                    &self.peer.name,
                    Op::PostXfer,
                    &e,
                ));
            }
            return self.complete_direct();
        }
        let peer = self.peer.clone();
        let pe = &peer.eps[self.worker];
        let mut g = pe.worker.lock();
        // The post's state first: each put/get's callback counts into it.
        let (ep, state) = self.open_post(pe, &g)?;
        let mut issued = 0usize;
        let mut failed_issue = None;
        self.work.each(|s| {
            state.pending.fetch_add(1, Ordering::AcqRel);
            let st = self.issue(g.h(), ep, s, &state);
            if st == sys::UCS_INPROGRESS {
                issued += 1;
                return true;
            }
            // Completed at once: no callback will count it.
            state.pending.fetch_sub(1, Ordering::AcqRel);
            if st == sys::UCS_OK {
                issued += 1;
                return true;
            }
            failed_issue = Some(st);
            false
        });
        if let Some(st) = failed_issue {
            if issued == 0 {
                state.finish(st);
                return Err(self.state_error(Op::PostXfer, st));
            }
            // Earlier segments may still be moving: the post ends with this error once they
            // and the flush below completed (a cancel meanwhile follows the usual rules;
            // nothing is force-closed here).
            state.op_failed(st);
        }
        // The endpoint is live under the held lock; the callback runs `flushed`.
        state.pending.fetch_add(1, Ordering::AcqRel);
        if let Some(st) = g.h().flush(ep, &state) {
            state.flush_status.store(st as i32, Ordering::Release);
            state.pending.fetch_sub(1, Ordering::AcqRel);
        }
        // The issuer's part: every put/get and the flush are issued.
        state.part_done(&g.h().locked());
        if state.phase() == PENDING && self.bytes <= INLINE_PROGRESS_BYTES {
            for _ in 0..CHECK_PASSES {
                if g.progress() == 0 || state.phase() != PENDING {
                    break;
                }
            }
        }
        drop(g);
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
            if let Some(f) = &self.flight {
                // Help with a bounded slice of the pieces no copy thread has taken yet: a
                // poll never turns into the whole copy.
                f.work_some(crate::direct_cma::CHECK_PIECES);
            }
            self.progress_until(&st);
        }
        self.outcome(&st, Op::CheckXfer)
    }

    fn state(&mut self) -> Result<XferState> {
        // Read only: the backend's progress threads (or the agent's) and the copy threads
        // drive the post.
        match &self.cur {
            Some(st) => self.outcome(st, Op::CheckXfer),
            None => Err(Error::not_allowed(
                &self.agent,
                Op::CheckXfer,
                "never posted",
            )),
        }
    }

    fn cancel(&mut self) -> Result<()> {
        let Some(st) = self.cur.clone() else {
            return Ok(());
        };
        if let Some(f) = &self.flight {
            // Direct copies: pieces not started are skipped; running ones end with their
            // system call (bounded by their size). Until then the memory stays in use.
            f.stop();
            // Pieces nobody took are skipped here at once.
            f.work();
            let deadline = Instant::now() + self.cancel_timeout;
            while st.phase() == PENDING && Instant::now() < deadline {
                self.progress_once();
                std::thread::sleep(Duration::from_micros(50));
            }
            if st.phase() == PENDING {
                return Err(Error::backend(
                    &self.agent,
                    crate::UCX,
                    Op::Cancel,
                    "direct CMA copies did not finish within cancel_timeout; their memory stays allocated",
                ));
            }
            return Ok(());
        }
        // UCX cannot cancel RMA in flight: wait for it (bounded), then force-close the
        // endpoint, which completes every request on it.
        let deadline = Instant::now() + self.cancel_timeout;
        while st.phase() == PENDING && Instant::now() < deadline {
            self.progress_once();
            std::thread::yield_now();
        }
        let tcp = {
            let pe = &self.peer.eps[self.worker];
            let g = pe.worker.lock();
            pe.uses_tcp(&g)
        };
        if st.phase() == PENDING && tcp {
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
            tracing::warn!(agent = %self.agent, remote = %self.peer.name, "cancel: force-closing the UCX endpoint");
            pe.force_close();
            let end = Instant::now() + Duration::from_secs(2);
            while st.phase() == PENDING && Instant::now() < end {
                self.progress_once();
                std::thread::yield_now();
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
        Some(
            self.path
                .get_or_init(|| {
                    let mut t = self.peer.transports_on(self.worker);
                    if self.peer.eps.len() > 1 {
                        t = format!("{t} [worker {}]", self.worker);
                    }
                    if let Some(d) = &self.direct {
                        let call = if self.op == XferOp::Write {
                            "process_vm_writev"
                        } else {
                            "process_vm_readv"
                        };
                        let n = self.work.len();
                        t = match &self.pool {
                            Some(p) if self.bytes > crate::direct_cma::INLINE_BYTES => format!(
                                "direct CMA ({call}, {n} segments in pieces on {} copy threads); {t}",
                                p.size
                            ),
                            _ => format!("direct CMA ({call} x{} per post, {n} segments); {t}", d.calls),
                        };
                    }
                    t
                })
                .clone(),
        )
    }

    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        self.notif = msg.map(|m| make_notif(&self.agent, &self.header, &self.peer, m));
        Ok(())
    }

    fn abandon(&mut self) {
        // Direct copies not started yet never start; UCX's own RMA cannot be stopped, but its
        // notification is not sent.
        if let Some(st) = &self.cur {
            st.abandoned.store(true, Ordering::Release);
        }
        if let Some(f) = &self.flight {
            f.stop();
        }
    }
}
