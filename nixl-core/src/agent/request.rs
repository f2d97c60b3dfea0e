//! Prepared descriptor lists and transfer requests.

// Exception to the crate's `deny(unsafe_code)`: a WRITE's integrity frame hashes its local
// ranges, held by the request (`sys::host::hash_ranges`, SAFETY at the call).
#![allow(unsafe_code)]

use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::prep::Regions;
use crate::agent::remote::RemotePeer;
use crate::agent::{BackendHandle, BackendSlot, Shared};
use crate::backend::{BackendXfer, CostEstimate, XferState};
use crate::desc::XferOp;
use crate::error::{Error, Op, Result};
use crate::telemetry::XferTelemetry;

/// Whose memory a descriptor list names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XferTarget<'a> {
    /// The initiator's own memory (the local side of a transfer; NIXL's `NIXL_INIT_AGENT`).
    Initiator,
    /// An agent's memory: a loaded peer, or this agent's own name for loopback and storage.
    Agent(&'a str),
}

/// What an integrity-checked request hashes and tells the target (the user's message is the
/// request's current notification).
pub(crate) struct IntegrityPlan {
    pub local: Vec<(u64, u64)>,
    pub remote: Vec<(u64, u64, u64)>,
}

use crate::agent::spec::ReqSpec;

/// What [`XferReq::new`] assembles a request from.
pub(crate) struct ReqParts {
    /// The lease the request's posts need (see [`XferOptions::lease`]).
    pub lease: Option<crate::leases::LeaseId>,
    pub shared: Arc<Shared>,
    pub op: XferOp,
    pub backend: Arc<BackendSlot>,
    pub xfer: Box<dyn BackendXfer>,
    pub remote: Option<Arc<RemotePeer>>,
    pub spec: ReqSpec,
    pub integrity: Option<IntegrityPlan>,
    pub timeout: Option<Duration>,
    pub notif: Option<Vec<u8>>,
    /// The region tables of the local and remote lists.
    pub keep: [Regions; 2],
    /// How a block request reached the backend (for the path).
    pub note: Option<PathNote>,
}

/// What a request's [`XferReq::path`] adds after the backend's path: kept as the request was
/// made and written out only when asked (a request's make formats nothing).
pub(crate) enum PathNote {
    /// A block table the backend consumes as strides, described from the request's spec.
    Strided,
    /// Written when the request was made (a table materialized into segments).
    Text(String),
}

use crate::agent::options::UncertainXfer;

#[derive(Debug)]
enum Status {
    Ready,
    Posted {
        at: Instant,
        deadline: Option<Instant>,
    },
    Done,
    Failed(Error),
    Canceled,
}

struct ReqState {
    status: Status,
    /// The notification of the next posts (NIXL's per-post `notifMsg`).
    notif: Option<Vec<u8>>,
    /// The integrity frame of the current post, sent once the data is complete.
    frame: Option<Vec<u8>>,
    xfer: Box<dyn BackendXfer>,
    tel: XferTelemetry,
    /// Set when cancel could not make sure the backend stopped: the memory is then leaked.
    leaked: bool,
    /// Set when the request ended (deadline, peer gone) while the backend still owned it:
    /// its memory stays held until the backend's `check` stops reporting `InProgress`.
    draining: bool,
}

/// How a poll reaches the backend: driving it ([`BackendXfer::check`]: blocking calls, the
/// NIXL-style `check_xfer_state`), or only reading its state ([`BackendXfer::state`]: futures
/// and drops, which run on threads that must not copy or wait).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poll {
    Drive,
    Look,
}

impl ReqState {
    fn poll_backend(&mut self, how: Poll) -> Result<XferState> {
        match how {
            Poll::Drive => self.xfer.check(),
            Poll::Look => self.xfer.state(),
        }
    }

    /// Polls a draining request once; returns whether it is still draining.
    fn settle(&mut self, how: Poll) -> bool {
        if self.draining && !matches!(self.poll_backend(how), Ok(XferState::InProgress)) {
            self.draining = false;
        }
        self.draining
    }
}

/// A dropped request the backend has not released yet: its transfer and the memory it uses,
/// held by the agent until the backend confirms (see [`Agent::draining_requests`]).
pub(crate) struct Drained {
    xfer: Box<dyn BackendXfer>,
    _keep: Option<[Regions; 2]>,
}

impl Drained {
    /// Polls once; returns whether the backend still owns it.
    pub(crate) fn busy(&mut self) -> bool {
        matches!(self.xfer.check(), Ok(XferState::InProgress))
    }
}

/// Dropped requests whose agent is gone before their backends let go of them: one thread per
/// process polls them until they do, then releases them and their memory. Polls back off from
/// 1 ms to 100 ms while none ends; a request whose backend never lets go stays here, its
/// memory never freed under it (and its backend alive; the backend's own threads were
/// stopped with the agent, `Backend::shutdown`).
pub(crate) mod orphans {
    use std::sync::OnceLock;
    use std::time::Duration;

    use parking_lot::{Condvar, Mutex};

    use super::Drained;

    struct Orphans {
        list: Mutex<Vec<Drained>>,
        more: Condvar,
    }

    static ORPHANS: OnceLock<Orphans> = OnceLock::new();

    fn orphans() -> &'static Orphans {
        ORPHANS.get_or_init(|| {
            let started = std::thread::Builder::new()
                .name("nixl-orphans".into())
                .spawn(run);
            if let Err(e) = started {
                // Without the thread the requests stay held, as a leak: never freed early.
                tracing::error!(error = %e, "no thread to release dropped agents' requests");
            }
            Orphans {
                list: Mutex::new(Vec::new()),
                more: Condvar::new(),
            }
        })
    }

    /// Takes `reqs` (a dropping agent's requests its backends still own).
    pub(crate) fn adopt(reqs: Vec<Drained>) {
        if reqs.is_empty() {
            return;
        }
        let o = orphans();
        o.list.lock().extend(reqs);
        o.more.notify_one();
    }

    fn run() {
        let o = orphans();
        let mut pause = Duration::from_millis(1);
        loop {
            let mut taken = {
                let mut list = o.list.lock();
                while list.is_empty() {
                    o.more.wait(&mut list);
                    pause = Duration::from_millis(1);
                }
                std::mem::take(&mut *list)
            };
            // Polled outside the lock: an agent's drop adopting more never waits on a poll.
            let before = taken.len();
            taken.retain_mut(Drained::busy);
            pause = if taken.len() < before {
                Duration::from_millis(1)
            } else {
                (pause * 2).min(Duration::from_millis(100))
            };
            let left = taken.len();
            o.list.lock().append(&mut taken);
            if left > 0 {
                std::thread::sleep(pause);
            }
        }
    }
}

/// A transfer request (NIXL's `nixlXferReqH`): post it with [`Agent::post_xfer_req`](crate::Agent::post_xfer_req), poll
/// with [`Agent::check_xfer_state`](crate::Agent::check_xfer_state) or [`XferReq::wait`], repost once done (with another
/// notification: [`XferReq::set_notif`]). Dropping it while in flight cancels it first; if the
/// backend cannot confirm it stopped, the memory it uses is leaked rather than freed under the
/// hardware.
#[must_use = "dropping a request cancels it"]
pub struct XferReq {
    id: u64,
    shared: Arc<Shared>,
    integrity: Option<IntegrityPlan>,
    op: XferOp,
    backend: Arc<BackendSlot>,
    remote: Option<Arc<RemotePeer>>,
    spec: ReqSpec,
    /// Bytes and segments per post.
    bytes: u64,
    segments: usize,
    timeout: Option<Duration>,
    state: Mutex<ReqState>,
    /// Keeps the memory of both lists' regions valid (leaked if a cancel is unconfirmed).
    keep: Option<[Regions; 2]>,
    note: Option<PathNote>,
    /// The lease every post needs (checked before the backend sees it).
    lease: Option<crate::leases::LeaseId>,
}

impl std::fmt::Debug for XferReq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XferReq")
            .field("op", &self.op)
            .field("backend", &self.backend.name)
            .field("remote", &self.spec.remote())
            .field("segments", &self.segments)
            .finish()
    }
}

impl XferReq {
    /// The backend's estimate of this request's cost, where it can make one.
    pub(crate) fn estimate_cost(&self) -> Result<Option<CostEstimate>> {
        match &self.spec {
            ReqSpec::Segments(s) => self.backend.backend.estimate_cost(s),
            ReqSpec::Blocks(b) if b.rows.is_none() => {
                self.backend.backend.estimate_cost(&b.materialize())
            }
            ReqSpec::Blocks(_) => Ok(None),
        }
    }

    /// Whether the agent whose state is `shared` made this request.
    pub(crate) fn belongs_to(&self, shared: &Arc<Shared>) -> bool {
        Arc::ptr_eq(&self.shared, shared)
    }
}

impl XferReq {
    pub(crate) fn new(p: ReqParts) -> Self {
        let (bytes, segments) = match &p.spec {
            ReqSpec::Segments(s) => (s.total_bytes(), s.segments.len()),
            ReqSpec::Blocks(b) => (b.total_bytes(), b.segment_count()),
        };
        XferReq {
            id: p.shared.next_id(),
            shared: p.shared,
            integrity: p.integrity,
            op: p.op,
            backend: p.backend,
            remote: p.remote,
            spec: p.spec,
            bytes,
            segments,
            timeout: p.timeout,
            state: Mutex::new(ReqState {
                status: Status::Ready,
                notif: p.notif,
                frame: None,
                xfer: p.xfer,
                tel: XferTelemetry::default(),
                leaked: false,
                draining: false,
            }),
            keep: Some(p.keep),
            note: p.note,
            lease: p.lease,
        }
    }

    /// A process-unique id of the request.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The operation.
    pub fn op(&self) -> XferOp {
        self.op
    }

    /// The backend carrying it.
    #[doc(alias = "queryXferBackend")]
    pub fn backend(&self) -> BackendHandle {
        self.backend.handle(self.shared.generation)
    }

    /// Sets the notification the following posts deliver after their data (`None`: none):
    /// NIXL's per-post `notifMsg`, so one prepared request serves many KV requests. Refused
    /// while the request is in flight ([`Error::RepostActive`]) and by backends without
    /// notifications ([`Error::NotSupported`]); nothing changes on error.
    #[doc(alias = "notifMsg")]
    pub fn set_notif(&self, msg: Option<Vec<u8>>) -> Result<()> {
        let mut st = self.state.lock();
        if let Status::Posted { .. } = st.status {
            return Err(Error::RepostActive {
                agent: self.shared.name.clone(),
                op: Op::PostXfer,
            });
        }
        if let Some(m) = &msg {
            crate::lease::check_user_notif(&self.shared.name, Op::PostXfer, m)?;
        }
        if msg.is_some() && !self.backend.caps.notifications {
            return Err(Error::not_supported(
                &self.shared.name,
                Op::PostXfer,
                format!("backend {} has no notifications", self.backend.name),
            ));
        }
        // With integrity checking the agent sends the notification itself (in the frame).
        if self.integrity.is_none() {
            st.xfer.set_notif(msg.as_deref()).map_err(|e| match e {
                Error::NotSupported { what, .. } => {
                    Error::not_supported(&self.shared.name, Op::PostXfer, what)
                }
                e => e,
            })?;
        }
        st.notif = msg;
        Ok(())
    }

    /// The target agent's name.
    pub fn remote(&self) -> &str {
        self.spec.remote()
    }

    /// Descriptors after merging (for a block request: the contiguous segments its blocks
    /// form, whether or not the backend materialized them).
    pub fn segment_count(&self) -> usize {
        self.segments
    }

    /// Total bytes per post.
    pub fn total_bytes(&self) -> u64 {
        self.bytes
    }

    /// The transports this request used (or the backend's path to its target); for a block
    /// request, also whether the backend consumed the strides or got materialized segments.
    pub fn path(&self) -> String {
        let st = self.state.lock();
        let p = st
            .xfer
            .path()
            .or_else(|| self.backend.backend.path_report(self.spec.remote()));
        let p = p.unwrap_or_else(|| "default".to_owned());
        let note = match (&self.note, &self.spec) {
            (Some(PathNote::Text(n)), _) => n.clone(),
            (Some(PathNote::Strided), ReqSpec::Blocks(b)) => {
                format!("{}, strided", b.summary())
            }
            _ => return format!("{}: {p}", self.backend.name),
        };
        format!("{}: {p} ({note})", self.backend.name)
    }

    /// Telemetry of the latest post.
    #[doc(alias = "getXferTelemetry")]
    pub fn telemetry(&self) -> XferTelemetry {
        self.state.lock().tel
    }

    /// The request's peer: `PeerRestarted` when the incarnation it was built against was
    /// replaced by a restart, `RemoteDisconnect` saying so when it was invalidated (no
    /// incarnation loaded any more), else `RemoteDisconnect` when its process
    /// exited. A fence is checked first: it is what the agent decided, whereas the exit of a
    /// fenced incarnation is only its consequence, seen first or not by the pidfd watch. `now`
    /// is the caller's clock reading.
    /// `op`: `PostXfer` at a post, `CheckXfer` while in flight (whoever checks).
    fn peer_check(&self, now: Instant, op: Op) -> Result<()> {
        if let Some(p) = &self.remote {
            if !p.valid.load(Ordering::SeqCst) {
                let current = self
                    .shared
                    .remotes
                    .lock()
                    .get(&p.name)
                    .map(|q| q.generation);
                let Some(current) = current else {
                    // Forgotten, not replaced: say so.
                    return Err(Error::disconnected(
                        &self.shared.name,
                        &p.name,
                        op,
                        "its metadata was invalidated while the request existed; load it again",
                    ));
                };
                return Err(Error::PeerRestarted {
                    agent: self.shared.name.clone(),
                    remote: p.name.clone(),
                    op,
                    built: p.generation,
                    current,
                });
            }
            p.check_alive_at(&self.shared.name, op, now)?;
        }
        Ok(())
    }

    /// Posts the request ([`Agent::post_xfer_req`] checks ownership first). Refused while in
    /// flight; allowed again once it is done, failed or canceled.
    pub(crate) fn post(&self) -> Result<XferState> {
        let mut st = self.state.lock();
        if let Status::Posted { .. } = st.status {
            return Err(Error::RepostActive {
                agent: self.shared.name.clone(),
                op: Op::PostXfer,
            });
        }
        if st.leaked {
            return Err(Error::not_allowed(
                &self.shared.name,
                Op::PostXfer,
                "an earlier cancel could not be confirmed",
            ));
        }
        if st.settle(Poll::Drive) {
            return Err(Error::not_allowed(
                &self.shared.name,
                Op::PostXfer,
                "the backend has not yet released the previous post (it ended by its deadline \
                 or its peer's failure while in flight)",
            ));
        }
        if let Some(id) = self.lease {
            crate::agent::lease::check_held(&self.shared, self.spec.remote(), id, Op::PostXfer)?;
        }
        let start = Instant::now();
        self.peer_check(start, Op::PostXfer)?;
        let notif = &st.notif;
        let frame = self.integrity.as_ref().map(|p| {
            // SAFETY: the local ranges lie in DRAM registrations this request keeps alive, and
            // the transfer has not started, so only the caller's own writes could race.
            let hash = unsafe { crate::integrity::hash_ranges(p.local.iter().copied()) };
            crate::integrity::Frame {
                hash,
                ranges: p.remote.clone(),
                msg: notif.clone().unwrap_or_default(),
            }
            .encode()
        });
        st.frame = frame;
        let r = st.xfer.post();
        let posted = Instant::now();
        st.tel = XferTelemetry {
            start: Some(start),
            post_duration: posted - start,
            xfer_duration: Duration::ZERO,
            bytes: self.bytes,
            desc_count: self.segments,
        };
        match r {
            Ok(XferState::Done) => {
                st.tel.xfer_duration = posted - start;
                self.complete(&mut st)
            }
            Ok(XferState::InProgress) => {
                st.status = Status::Posted {
                    at: start,
                    deadline: self.timeout.map(|t| start + t),
                };
                Ok(XferState::InProgress)
            }
            Err(e) => {
                // A refused post started nothing (and a backend's check is not for a post it
                // refused: POSIX would run the request).
                self.shared.counters.failed();
                st.status = Status::Failed(e.clone());
                Err(e)
            }
        }
    }

    /// Polls the request ([`Agent::check_xfer_state`]): `Done`, `InProgress`, or the terminal
    /// error.
    pub(crate) fn check(&self) -> Result<XferState> {
        let mut st = self.state.lock();
        self.check_locked(&mut st, Poll::Drive)
    }

    fn check_locked(&self, st: &mut ReqState, how: Poll) -> Result<XferState> {
        match &st.status {
            Status::Ready => Err(Error::not_allowed(
                &self.shared.name,
                Op::CheckXfer,
                "request was never posted",
            )),
            Status::Done => Ok(XferState::Done),
            Status::Failed(e) => {
                let e = e.clone();
                st.settle(how);
                Err(e)
            }
            Status::Canceled => Err(Error::Canceled {
                agent: self.shared.name.clone(),
                op: Op::CheckXfer,
            }),
            Status::Posted { at, deadline } => {
                let (at, deadline) = (*at, *deadline);
                // A peer invalidated or restarted mid-transfer: fence the request.
                let now = Instant::now();
                if let Err(e) = self.peer_check(now, Op::CheckXfer) {
                    self.abort_locked(st, e.clone(), how);
                    return Err(e);
                }
                match st.poll_backend(how) {
                    Ok(XferState::Done) => {
                        // This poll's clock reading (taken just before the backend's check):
                        // one reading per poll, not two.
                        st.tel.xfer_duration = now.saturating_duration_since(at);
                        self.complete(st)
                    }
                    Ok(XferState::InProgress) => match deadline {
                        Some(d) if now >= d => {
                            let e = Error::TimedOut {
                                agent: self.shared.name.clone(),
                                op: Op::CheckXfer,
                                elapsed: at.elapsed(),
                            };
                            self.abort_locked(st, e.clone(), how);
                            Err(e)
                        }
                        _ => Ok(XferState::InProgress),
                    },
                    Err(e) => {
                        self.shared.counters.failed();
                        self.note_uncertain(&e);
                        st.status = Status::Failed(e.clone());
                        // A backend may fail a post while parts of it are still in flight
                        // (libfabric's other rails after one failed): the request drains until
                        // its check no longer reports them.
                        st.draining = true;
                        st.settle(how);
                        Err(e)
                    }
                }
            }
        }
    }

    /// Ends the in-flight transfer with `terminal` now, without waiting for the backend: it
    /// is asked to stop ([`BackendXfer::abandon`]) and the request drains (its memory stays
    /// held) until the backend confirms.
    fn abort_locked(&self, st: &mut ReqState, terminal: Error, how: Poll) {
        st.xfer.abandon();
        st.draining = true;
        st.settle(how);
        self.shared.counters.failed();
        self.note_uncertain(&terminal);
        st.status = Status::Failed(terminal);
    }

    /// The data is complete: send the integrity frame, if any, and record the completion.
    fn complete(&self, st: &mut ReqState) -> Result<XferState> {
        if let Some(frame) = st.frame.take() {
            if let Err(e) = self
                .backend
                .gen_notif(&self.shared.name, self.spec.remote(), &frame)
            {
                self.shared.counters.failed();
                st.status = Status::Failed(e.clone());
                return Err(e);
            }
        }
        st.status = Status::Done;
        self.shared
            .counters
            .completed(self.op == XferOp::Write, &st.tel);
        Ok(XferState::Done)
    }

    fn note_uncertain(&self, e: &Error) {
        if e.is_uncertain() {
            let mut u = self.shared.uncertain.lock();
            if u.len() >= crate::agent::MAX_UNCERTAIN {
                u.pop_front();
            }
            u.push_back(UncertainXfer {
                id: self.id,
                remote: self.spec.remote().to_owned(),
                op: self.op,
                bytes: self.bytes,
                error: e.kind(),
            });
        }
    }

    /// Blocks until the request completes, fails, or `timeout` passes; on timeout it ends
    /// `TimedOut` at once (the wait never outlasts `timeout` by more than one poll). The
    /// backend may still own the transfer then: the request drains ([`XferReq::is_draining`])
    /// and keeps its memory until the backend confirms it stopped.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            {
                let mut st = self.state.lock();
                match self.check_locked(&mut st, Poll::Drive)? {
                    XferState::Done => return Ok(()),
                    XferState::InProgress => {
                        if Instant::now() >= deadline {
                            let e = Error::TimedOut {
                                agent: self.shared.name.clone(),
                                op: Op::Wait,
                                elapsed: timeout,
                            };
                            self.abort_locked(&mut st, e.clone(), Poll::Drive);
                            return Err(e);
                        }
                    }
                }
            }
            if !self.shared.progress_running() && self.backend.caps.needs_progress {
                let _ = self.backend.backend.progress();
            }
            spins += 1;
            if spins > 1000 {
                std::thread::sleep(Duration::from_micros(20));
            } else if spins > 100 {
                std::thread::yield_now();
            }
        }
    }

    /// One check for a future: the request's state (its terminal error, once), read without
    /// driving the backend. `None` when another thread holds the request (a blocking call on
    /// it): the caller looks again later.
    pub(crate) fn poll_check(&self) -> Option<Result<XferState>> {
        let mut st = self.state.try_lock()?;
        let r = self.check_locked(&mut st, Poll::Look);
        if matches!(r, Ok(XferState::InProgress)) {
            // A future waits on it: the backend's wake must fire when it completes.
            st.xfer.arm_wake();
        }
        Some(r)
    }

    /// Ends a request an async caller stopped waiting for at its deadline: `TimedOut`, as
    /// [`XferReq::wait`] does (the request drains, its memory held, until the backend lets go);
    /// `Ok` where it completed meanwhile, its error where it failed.
    pub(crate) fn time_out(&self, waited: Duration) -> Result<()> {
        let mut st = self.state.lock();
        match self.check_locked(&mut st, Poll::Look)? {
            XferState::Done => return Ok(()),
            XferState::InProgress => {}
        }
        let e = Error::TimedOut {
            agent: self.shared.name.clone(),
            op: Op::Wait,
            elapsed: waited,
        };
        self.abort_locked(&mut st, e.clone(), Poll::Look);
        Err(e)
    }

    /// Lets go of an in-flight request without waiting (the drop of an owning future): the
    /// backend is asked to stop ([`BackendXfer::abandon`]: copies not started never start, no
    /// notification goes out), the request ends `Canceled`, and it drains, its memory held,
    /// until the backend confirms; the request's drop then hands it to the agent. Never
    /// blocks (beyond the request's own lock).
    pub(crate) fn let_go(&self) {
        let mut st = self.state.lock();
        if let Status::Posted { .. } = st.status {
            st.xfer.abandon();
            st.draining = true;
            st.settle(Poll::Look);
            st.status = Status::Canceled;
        }
    }

    /// The GPU event a stream can wait on for this request's latest post, where its backend
    /// has one (CUDA_IPC: its CUDA event, by device and raw handle;
    /// `nixl_mem::cuda_ipc::gate_stream` makes a cudarc stream wait on it). `None` for the
    /// other backends.
    pub fn device_event(&self) -> Option<crate::backend::DeviceEvent> {
        self.state.lock().xfer.device_event()
    }

    /// How much each post adds to every layer's arrival counter ([`XferOptions::arrival`](crate::XferOptions::arrival)):
    /// the request's items per layer. `None` without counters.
    pub fn arrival_per_post(&self) -> Option<u64> {
        self.state.lock().xfer.arrival_per_post()
    }

    /// The request's own timeout ([`XferOptions::timeout`]), if it has one.
    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The agent's state and the request's backend, for its futures.
    pub(crate) fn parts(&self) -> (&Arc<Shared>, &Arc<BackendSlot>) {
        (&self.shared, &self.backend)
    }

    /// Cancels the request. Returns once the backend no longer touches its memory; the request
    /// is then `Canceled` (nothing of it was delivered as a whole: no notification went out),
    /// or `Done` when the backend could not stop it and it completed, data and notification,
    /// before the cancel returned (a request not in flight is left as it is).
    pub fn cancel(&self) -> Result<()> {
        let r = self.cancel_now();
        // A future waiting on this request (another task) sees the new state.
        self.shared.wake.wake();
        r
    }

    fn cancel_now(&self) -> Result<()> {
        let mut st = self.state.lock();
        if let Status::Posted { .. } = st.status {
            if let Err(e) = st.xfer.cancel() {
                // The backend could not confirm it stopped: the memory is leaked on drop, and
                // the request drains (not quiescent) until the backend lets go.
                st.leaked = true;
                st.draining = true;
                st.status = Status::Failed(e.clone());
                return Err(e);
            }
            // `Canceled` means not delivered: a backend that could not stop the transfer
            // (UCX cannot cancel RMA: it waits for it) may have finished it, data and
            // notification, before the cancel returned. Then the request is `Done`.
            if let Ok(XferState::Done) = st.xfer.check() {
                let _ = self.complete(&mut st);
                return Ok(());
            }
            st.status = Status::Canceled;
        }
        Ok(())
    }

    /// Whether the request ended (by its deadline, or its peer's failure) while the backend
    /// still owned it, and the backend has not confirmed since that it stopped: until then
    /// the memory it names stays registered and alive, and it cannot be posted again. Polls
    /// the backend once. See `docs/reliability.md` for when this lasts.
    pub fn is_draining(&self) -> bool {
        self.state.lock().settle(Poll::Drive)
    }

    /// Whether nothing this request started may still touch its memory: it is not in flight
    /// and, where it ended (deadline, peer failure, an unconfirmed cancel) while the backend
    /// still owned a copy, the backend has since confirmed that copy stopped. `Done` and
    /// `Canceled` are quiescent when they are returned; an error may not be (see
    /// `docs/reliability.md`). Polls the backend once.
    pub fn is_quiescent(&self) -> bool {
        let mut st = self.state.lock();
        !matches!(st.status, Status::Posted { .. }) && !st.settle(Poll::Drive)
    }

    /// Blocks until the request is quiescent ([`XferReq::is_quiescent`]), at most `timeout`:
    /// after it returns `Ok`, no copy of this request reads or writes its local or remote
    /// ranges any more. Refused ([`Error::NotAllowed`]) while the request is in flight (wait
    /// for it or cancel it first); `TimedOut` where the backend still owns a copy at the end.
    pub fn wait_quiescent(&self, timeout: Duration) -> Result<()> {
        let end = Instant::now() + timeout;
        loop {
            {
                let mut st = self.state.lock();
                if let Status::Posted { .. } = st.status {
                    return Err(Error::not_allowed(
                        &self.shared.name,
                        Op::Wait,
                        "the request is in flight: wait for it or cancel it first",
                    ));
                }
                if !st.settle(Poll::Drive) {
                    return Ok(());
                }
            }
            if Instant::now() >= end {
                return Err(Error::TimedOut {
                    agent: self.shared.name.clone(),
                    op: Op::Wait,
                    elapsed: timeout,
                });
            }
            if !self.shared.progress_running() && self.backend.caps.needs_progress {
                let _ = self.backend.backend.progress();
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// For [`XferReq::quiescence`]: whether the request is quiescent, read without driving
    /// the backend; `None` while another thread holds the request; `NotAllowed` in flight.
    pub(crate) fn look_quiescent(&self) -> Option<Result<bool>> {
        let mut st = self.state.try_lock()?;
        if let Status::Posted { .. } = st.status {
            return Some(Err(Error::not_allowed(
                &self.shared.name,
                Op::Wait,
                "the request is in flight: wait for it or cancel it first",
            )));
        }
        let draining = st.settle(Poll::Look);
        if draining {
            // A future waits for the drain: the backend's wake must fire when it ends.
            st.xfer.arm_wake();
        }
        Some(Ok(!draining))
    }

    /// Whether the request is in flight.
    pub fn is_in_flight(&self) -> bool {
        matches!(self.state.lock().status, Status::Posted { .. })
    }
}

impl Drop for XferReq {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        if let Status::Posted { .. } = st.status {
            if let Err(e) = st.xfer.cancel() {
                tracing::error!(agent = %self.shared.name, error = %e, "cancel on drop failed; leaking the request's memory");
                st.leaked = true;
            }
        }
        if st.leaked {
            std::mem::forget(self.keep.take());
            return;
        }
        if st.settle(Poll::Look) {
            // The backend still owns the transfer: the agent keeps it and its memory until the
            // backend confirms (its progress reaps it).
            let placeholder: Box<dyn BackendXfer> = Box::new(Released);
            let xfer = std::mem::replace(&mut st.xfer, placeholder);
            self.shared.draining.lock().push(Drained {
                xfer,
                _keep: self.keep.take(),
            });
        }
    }
}

/// What a request holds after handing its transfer to the agent's drain list.
struct Released;

impl BackendXfer for Released {
    fn post(&mut self) -> Result<XferState> {
        Ok(XferState::Done)
    }
    fn check(&mut self) -> Result<XferState> {
        Ok(XferState::Done)
    }
    fn cancel(&mut self) -> Result<()> {
        Ok(())
    }
}
