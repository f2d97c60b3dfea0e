//! Prepared descriptor lists and transfer requests.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::agent::{lock, Agent, BackendHandle, BackendSlot, Shared};
use crate::backend::{BackendMd, BackendXfer, CostEstimate, Segment, XferSpec, XferState};
use crate::desc::{merge_contiguous, Desc, XferDescList, XferOp};
use crate::error::{Error, Op, Result};
use crate::mem::MemKind;
use crate::registration::RegUse;
use crate::remote::{RemotePeer, RemoteRegion};
use crate::telemetry::XferTelemetry;

/// Whose memory a descriptor list names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XferTarget<'a> {
    /// The initiator's own memory (the local side of a transfer; NIXL's `NIXL_INIT_AGENT`).
    Initiator,
    /// An agent's memory: a loaded peer, or this agent's own name for loopback and storage.
    Agent(&'a str),
}

/// What a prepared list or request holds so the memory it names stays valid.
pub(crate) enum Keep {
    Local { _held: RegUse },
    Remote { _held: Arc<RemoteRegion> },
}

struct PrepEntry {
    desc: Desc,
    /// Region identity (for merging across neighbours).
    region: u64,
    /// (backend slot id, md)
    mds: Vec<(usize, BackendMd)>,
    keep: Arc<Keep>,
}

struct CachedRegion {
    reg: u64,
    idx: usize,
    keep: Arc<Keep>,
    mds: Vec<(usize, BackendMd)>,
}

/// What an integrity-checked request hashes and tells the target (the user's message is the
/// request's current notification).
struct IntegrityPlan {
    local: Vec<(u64, u64)>,
    remote: Vec<(u64, u64, u64)>,
}

/// A request that ended in an uncertain state: its peer died or restarted, or its deadline
/// passed, while it was in flight, so whether the target received the data is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UncertainXfer {
    /// The request's id ([`XferReq::id`]).
    pub id: u64,
    /// The target agent.
    pub remote: String,
    /// READ or WRITE.
    pub op: XferOp,
    /// Bytes of the request.
    pub bytes: u64,
    /// The error's kind.
    pub error: crate::ErrorKind,
}

enum Side {
    Initiator,
    SelfTarget,
    Remote(Arc<RemotePeer>),
}

/// A descriptor list resolved once against registrations (NIXL's `nixlDlistH`).
#[must_use = "a prepared list is only useful to build requests from"]
pub struct PreparedList {
    shared: Arc<Shared>,
    side: Side,
    kind: MemKind,
    entries: Vec<PrepEntry>,
}

impl std::fmt::Debug for PreparedList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedList")
            .field("kind", &self.kind)
            .field("len", &self.entries.len())
            .finish()
    }
}

impl PreparedList {
    /// Number of descriptors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The memory kind.
    pub fn kind(&self) -> MemKind {
        self.kind
    }

    /// The name of the agent whose memory it names (`None` for the initiator side).
    pub fn target(&self) -> Option<&str> {
        match &self.side {
            Side::Initiator => None,
            Side::SelfTarget => Some(&self.shared.name),
            Side::Remote(p) => Some(&p.name),
        }
    }
}

/// Options of a transfer request.
#[derive(Debug, Clone, Default)]
pub struct XferOptions {
    /// A notification for the target, delivered only after the request's data is complete.
    pub notif: Option<Vec<u8>>,
    /// Backends to choose from, in preference order (empty: all, in creation order).
    pub backends: Vec<BackendHandle>,
    /// A deadline for each post: past it, `check` cancels and reports `TimedOut`.
    pub timeout: Option<Duration>,
    /// Do not merge contiguous descriptors.
    pub no_merge: bool,
    /// Checksum the payload and deliver the checksum with the notification; the target
    /// verifies it before handing the notification out (WRITE of DRAM only). The notification
    /// is then sent once the initiator sees the request complete.
    pub integrity: bool,
}

impl XferOptions {
    /// Options carrying a notification.
    pub fn with_notif(msg: Vec<u8>) -> Self {
        XferOptions {
            notif: Some(msg),
            ..Default::default()
        }
    }
}

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

impl ReqState {
    /// Polls a draining request once; returns whether it is still draining.
    fn settle(&mut self) -> bool {
        if self.draining && !matches!(self.xfer.check(), Ok(XferState::InProgress)) {
            self.draining = false;
        }
        self.draining
    }
}

/// A dropped request the backend has not released yet: its transfer and the memory it uses,
/// held by the agent until the backend confirms (see [`Agent::draining_requests`]).
pub(crate) struct Drained {
    xfer: Box<dyn BackendXfer>,
    _keep: Vec<Arc<Keep>>,
}

impl Drained {
    /// Polls once; returns whether the backend still owns it.
    pub(crate) fn busy(&mut self) -> bool {
        matches!(self.xfer.check(), Ok(XferState::InProgress))
    }
}

/// A transfer request (NIXL's `nixlXferReqH`): post it with [`Agent::post_xfer_req`], poll
/// with [`Agent::check_xfer_state`] or [`XferReq::wait`], repost once done (with another
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
    spec: XferSpec,
    timeout: Option<Duration>,
    state: Mutex<ReqState>,
    keep: Vec<Arc<Keep>>,
}

impl std::fmt::Debug for XferReq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XferReq")
            .field("op", &self.op)
            .field("backend", &self.backend.name)
            .field("remote", &self.spec.remote)
            .field("segments", &self.spec.segments.len())
            .finish()
    }
}

impl XferReq {
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
        let mut st = lock(&self.state);
        if let Status::Posted { .. } = st.status {
            return Err(Error::RepostActive {
                agent: self.shared.name.clone(),
                op: Op::PostXfer,
            });
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
        &self.spec.remote
    }

    /// Descriptors after merging.
    pub fn segment_count(&self) -> usize {
        self.spec.segments.len()
    }

    /// Total bytes per post.
    pub fn total_bytes(&self) -> u64 {
        self.spec.total_bytes()
    }

    /// The transports this request used (or the backend's path to its target).
    pub fn path(&self) -> String {
        let st = lock(&self.state);
        let p = st
            .xfer
            .path()
            .or_else(|| self.backend.backend.path_report(&self.spec.remote));
        format!(
            "{}: {}",
            self.backend.name,
            p.unwrap_or_else(|| "default".to_owned())
        )
    }

    /// Telemetry of the latest post.
    #[doc(alias = "getXferTelemetry")]
    pub fn telemetry(&self) -> XferTelemetry {
        lock(&self.state).tel
    }

    fn peer_check(&self) -> Result<()> {
        if let Some(p) = &self.remote {
            p.check_alive(&self.shared.name, Op::PostXfer)?;
            if !p.valid.load(Ordering::SeqCst) {
                let current = lock(&self.shared.remotes)
                    .get(&p.name)
                    .map(|q| q.generation)
                    .unwrap_or(0);
                return Err(Error::PeerRestarted {
                    agent: self.shared.name.clone(),
                    remote: p.name.clone(),
                    op: Op::PostXfer,
                    built: p.generation,
                    current,
                });
            }
        }
        Ok(())
    }

    /// Posts the request ([`Agent::post_xfer_req`] checks ownership first). Refused while in
    /// flight; allowed again once it is done, failed or canceled.
    pub(crate) fn post(&self) -> Result<XferState> {
        let mut st = lock(&self.state);
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
        if st.settle() {
            return Err(Error::not_allowed(
                &self.shared.name,
                Op::PostXfer,
                "the backend has not yet released the previous post (it ended by its deadline \
                 or its peer's failure while in flight)",
            ));
        }
        self.peer_check()?;
        let start = Instant::now();
        let msg = st.notif.clone().unwrap_or_default();
        st.frame = self.integrity.as_ref().map(|p| {
            // SAFETY: the local ranges lie in DRAM registrations this request keeps alive, and
            // the transfer has not started, so only the caller's own writes could race.
            let hash = unsafe { crate::integrity::hash_ranges(p.local.iter().copied()) };
            crate::integrity::Frame {
                hash,
                ranges: p.remote.clone(),
                msg,
            }
            .encode()
        });
        let r = st.xfer.post();
        let posted = Instant::now();
        st.tel = XferTelemetry {
            start: Some(start),
            post_duration: posted - start,
            xfer_duration: Duration::ZERO,
            bytes: self.spec.total_bytes(),
            desc_count: self.spec.segments.len(),
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
                self.shared.counters.failed();
                st.status = Status::Failed(e.clone());
                Err(e)
            }
        }
    }

    /// Polls the request ([`Agent::check_xfer_state`]): `Done`, `InProgress`, or the terminal
    /// error.
    pub(crate) fn check(&self) -> Result<XferState> {
        let mut st = lock(&self.state);
        self.check_locked(&mut st)
    }

    fn check_locked(&self, st: &mut ReqState) -> Result<XferState> {
        match &st.status {
            Status::Ready => Err(Error::not_allowed(
                &self.shared.name,
                Op::CheckXfer,
                "request was never posted",
            )),
            Status::Done => Ok(XferState::Done),
            Status::Failed(e) => {
                let e = e.clone();
                st.settle();
                Err(e)
            }
            Status::Canceled => Err(Error::Canceled {
                agent: self.shared.name.clone(),
                op: Op::CheckXfer,
            }),
            Status::Posted { at, deadline } => {
                let (at, deadline) = (*at, *deadline);
                // A peer invalidated or restarted mid-transfer: fence the request.
                if let Err(e) = self.peer_check() {
                    self.abort_locked(st, e.clone());
                    return Err(e);
                }
                match st.xfer.check() {
                    Ok(XferState::Done) => {
                        st.tel.xfer_duration = at.elapsed();
                        self.complete(st)
                    }
                    Ok(XferState::InProgress) => match deadline {
                        Some(d) if Instant::now() >= d => {
                            let e = Error::TimedOut {
                                agent: self.shared.name.clone(),
                                op: Op::CheckXfer,
                                elapsed: at.elapsed(),
                            };
                            self.abort_locked(st, e.clone());
                            Err(e)
                        }
                        _ => Ok(XferState::InProgress),
                    },
                    Err(e) => {
                        self.shared.counters.failed();
                        self.note_uncertain(&e);
                        st.status = Status::Failed(e.clone());
                        Err(e)
                    }
                }
            }
        }
    }

    /// Ends the in-flight transfer with `terminal` now, without waiting for the backend: it
    /// is asked to stop ([`BackendXfer::abandon`]) and the request drains (its memory stays
    /// held) until the backend confirms.
    fn abort_locked(&self, st: &mut ReqState, terminal: Error) {
        st.xfer.abandon();
        st.draining = true;
        st.settle();
        self.shared.counters.failed();
        self.note_uncertain(&terminal);
        st.status = Status::Failed(terminal);
    }

    /// The data is complete: send the integrity frame, if any, and record the completion.
    fn complete(&self, st: &mut ReqState) -> Result<XferState> {
        if let Some(frame) = st.frame.take() {
            if let Err(e) = self.backend.backend.gen_notif(&self.spec.remote, &frame) {
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
            let mut u = lock(&self.shared.uncertain);
            if u.len() >= crate::agent::MAX_UNCERTAIN {
                u.pop_front();
            }
            u.push_back(UncertainXfer {
                id: self.id,
                remote: self.spec.remote.clone(),
                op: self.op,
                bytes: self.spec.total_bytes(),
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
                let mut st = lock(&self.state);
                match self.check_locked(&mut st)? {
                    XferState::Done => return Ok(()),
                    XferState::InProgress => {
                        if Instant::now() >= deadline {
                            let e = Error::TimedOut {
                                agent: self.shared.name.clone(),
                                op: Op::Wait,
                                elapsed: timeout,
                            };
                            self.abort_locked(&mut st, e.clone());
                            return Err(e);
                        }
                    }
                }
            }
            if !self.shared.config.progress_thread && self.backend.caps.needs_progress {
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

    /// Cancels the request. Returns once the backend no longer touches its memory; the request
    /// is then `Canceled` (a request not in flight is left as it is).
    pub fn cancel(&self) -> Result<()> {
        let mut st = lock(&self.state);
        if let Status::Posted { .. } = st.status {
            if let Err(e) = st.xfer.cancel() {
                st.leaked = true;
                st.status = Status::Failed(e.clone());
                return Err(e);
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
        lock(&self.state).settle()
    }

    /// Whether the request is in flight.
    pub fn is_in_flight(&self) -> bool {
        matches!(lock(&self.state).status, Status::Posted { .. })
    }
}

impl Drop for XferReq {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Status::Posted { .. } = st.status {
            if let Err(e) = st.xfer.cancel() {
                tracing::error!(agent = %self.shared.name, error = %e, "cancel on drop failed; leaking the request's memory");
                st.leaked = true;
            }
        }
        if st.leaked {
            for k in std::mem::take(&mut self.keep) {
                std::mem::forget(k);
            }
            return;
        }
        if st.settle() {
            // The backend still owns the transfer: the agent keeps it and its memory until the
            // backend confirms (its progress reaps it).
            let placeholder: Box<dyn BackendXfer> = Box::new(Released);
            let xfer = std::mem::replace(&mut st.xfer, placeholder);
            lock(&self.shared.draining).push(Drained {
                xfer,
                _keep: std::mem::take(&mut self.keep),
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

impl Agent {
    /// Resolves descriptors once against registrations (NIXL's `prepXferDlist`).
    ///
    /// For [`XferTarget::Initiator`] and for the agent's own name they must lie inside this
    /// agent's registrations; for a peer, inside its loaded regions. `hints` narrows the
    /// backends considered.
    #[doc(alias = "prepXferDlist")]
    pub fn prep_xfer_dlist(
        &self,
        target: XferTarget<'_>,
        descs: &XferDescList,
        hints: &[BackendHandle],
    ) -> Result<PreparedList> {
        let me = self.name();
        let backends = self.select_backends(Op::PrepXferDlist, hints)?;
        let ids: Vec<usize> = backends.iter().map(|b| b.id).collect();
        let kind = descs.kind();
        let side = match target {
            XferTarget::Initiator => Side::Initiator,
            XferTarget::Agent(n) if n == me => Side::SelfTarget,
            XferTarget::Agent(n) => Side::Remote(self.remote_peer(n, Op::PrepXferDlist)?),
        };
        let mut entries = Vec::with_capacity(descs.len());
        // Registration regions already resolved in this call: (reg id, region idx) -> entry parts.
        let mut local_cache: Vec<CachedRegion> = Vec::new();
        for (i, d) in descs.descs().iter().enumerate() {
            if d.len == 0 || d.end().is_none() {
                return Err(Error::invalid(
                    me,
                    Op::PrepXferDlist,
                    format!("descriptor {i} is empty or overflows"),
                ));
            }
            let entry = match &side {
                Side::Remote(peer) => {
                    let r = peer.find(kind, d.dev_id, d.addr, d.len).ok_or_else(|| {
                        Error::not_found(
                            me,
                            Op::PrepXferDlist,
                            format!(
                                "descriptor {i} ({:#x}+{}) in {}'s loaded regions",
                                d.addr, d.len, peer.name
                            ),
                        )
                    })?;
                    let mds: Vec<(usize, BackendMd)> = ids
                        .iter()
                        .filter_map(|&id| r.md_for(id).map(|m| (id, m)))
                        .collect();
                    if mds.is_empty() {
                        return Err(Error::not_found(
                            me,
                            Op::PrepXferDlist,
                            format!("descriptor {i}: no selected backend loaded that region"),
                        ));
                    }
                    let region = Arc::as_ptr(&r) as u64;
                    PrepEntry {
                        desc: *d,
                        region,
                        mds,
                        keep: Arc::new(Keep::Remote { _held: r }),
                    }
                }
                Side::Initiator | Side::SelfTarget => {
                    let (reg, idx) = lock(&self.shared.regs)
                        .find(kind, d.dev_id, d.addr, d.len)
                        .ok_or_else(|| {
                            Error::not_found(
                                me,
                                Op::PrepXferDlist,
                                format!(
                                    "descriptor {i} ({kind} {:#x}+{} dev {}) in registered memory",
                                    d.addr, d.len, d.dev_id
                                ),
                            )
                        })?;
                    let cached = local_cache.iter().find(|c| c.reg == reg.id && c.idx == idx);
                    let (keep, mds) = match cached {
                        Some(c) => (c.keep.clone(), c.mds.clone()),
                        None => {
                            let region = &reg.regions[idx];
                            let mut mds = Vec::new();
                            for id in &ids {
                                if let Some(md) = region.md_for(*id) {
                                    let md = match side {
                                        Side::SelfTarget => {
                                            let Some(slot) = backends.iter().find(|b| b.id == *id)
                                            else {
                                                continue;
                                            };
                                            if !slot.caps.local {
                                                continue;
                                            }
                                            slot.backend.load_local(&region.desc, &md)?
                                        }
                                        _ => md,
                                    };
                                    mds.push((*id, md));
                                }
                            }
                            if mds.is_empty() {
                                return Err(Error::not_found(me, Op::PrepXferDlist, format!("descriptor {i}: no selected backend holds that registration")));
                            }
                            let keep = Arc::new(Keep::Local {
                                _held: RegUse::new(reg.clone()),
                            });
                            local_cache.push(CachedRegion {
                                reg: reg.id,
                                idx,
                                keep: keep.clone(),
                                mds: mds.clone(),
                            });
                            (keep, mds)
                        }
                    };
                    PrepEntry {
                        desc: *d,
                        region: reg.id << 16 ^ idx as u64,
                        mds,
                        keep,
                    }
                }
            };
            entries.push(entry);
        }
        Ok(PreparedList {
            shared: self.shared.clone(),
            side,
            kind,
            entries,
        })
    }

    /// Builds a request from prepared lists by block index (NIXL's `makeXferReq`); runs that
    /// are contiguous on both sides are merged.
    #[doc(alias = "makeXferReq")]
    pub fn make_prepped_xfer(
        &self,
        op: XferOp,
        local: &PreparedList,
        local_idx: &[usize],
        remote: &PreparedList,
        remote_idx: &[usize],
        opts: XferOptions,
    ) -> Result<XferReq> {
        let me = self.name();
        if !Arc::ptr_eq(&local.shared, &self.shared) || !Arc::ptr_eq(&remote.shared, &self.shared) {
            return Err(Error::mismatch(
                me,
                Op::MakeXfer,
                "prepared list belongs to another agent",
            ));
        }
        if !matches!(local.side, Side::Initiator) {
            return Err(Error::invalid(
                me,
                Op::MakeXfer,
                "local list must be prepared for XferTarget::Initiator",
            ));
        }
        let (remote_name, remote_peer, is_local) = match &remote.side {
            Side::Initiator => {
                return Err(Error::invalid(
                    me,
                    Op::MakeXfer,
                    "remote list must be prepared for an agent",
                ))
            }
            Side::SelfTarget => (self.shared.name.clone(), None, true),
            Side::Remote(p) => (p.name.clone(), Some(p.clone()), false),
        };
        if local_idx.len() != remote_idx.len() {
            return Err(Error::mismatch(
                me,
                Op::MakeXfer,
                format!(
                    "{} local and {} remote indices",
                    local_idx.len(),
                    remote_idx.len()
                ),
            ));
        }
        if local_idx.is_empty() {
            return Err(Error::invalid(me, Op::MakeXfer, "no descriptors"));
        }
        let mut pairs = Vec::with_capacity(local_idx.len());
        for (k, (&li, &ri)) in local_idx.iter().zip(remote_idx).enumerate() {
            let l = local.entries.get(li).ok_or_else(|| {
                Error::invalid(
                    me,
                    Op::MakeXfer,
                    format!("local index {li} out of range ({})", local.len()),
                )
            })?;
            let r = remote.entries.get(ri).ok_or_else(|| {
                Error::invalid(
                    me,
                    Op::MakeXfer,
                    format!("remote index {ri} out of range ({})", remote.len()),
                )
            })?;
            if l.desc.len != r.desc.len {
                return Err(Error::mismatch(
                    me,
                    Op::MakeXfer,
                    format!(
                        "pair {k}: local {} bytes, remote {} bytes",
                        l.desc.len, r.desc.len
                    ),
                ));
            }
            pairs.push((l, r));
        }
        if opts.integrity
            && (op != XferOp::Write || local.kind != MemKind::Dram || remote.kind != MemKind::Dram)
        {
            return Err(Error::not_supported(
                me,
                Op::MakeXfer,
                "integrity checking covers DRAM -> DRAM WRITE only",
            ));
        }
        let wants_notif = opts.notif.is_some() || opts.integrity;
        // Choose the first backend (in preference order) that holds every entry on both sides.
        let candidates = self.select_backends(Op::MakeXfer, &opts.backends)?;
        let eligible: Vec<Arc<BackendSlot>> = candidates
            .into_iter()
            .filter(|b| {
                if is_local {
                    b.caps.local
                } else {
                    b.caps.remote
                }
            })
            .filter(|b| !wants_notif || b.caps.notifications)
            .filter(|b| {
                pairs.iter().all(|(l, r)| {
                    l.mds.iter().any(|(id, _)| *id == b.id)
                        && r.mds.iter().any(|(id, _)| *id == b.id)
                })
            })
            .collect();
        let no_backend = || {
            Error::not_supported(
                me,
                Op::MakeXfer,
                format!(
                    "no backend can move {} -> {} to {remote_name}{}",
                    local.kind,
                    remote.kind,
                    if opts.notif.is_some() {
                        " with a notification"
                    } else {
                        ""
                    }
                ),
            )
        };
        // The segments are the same for every backend; only the metadata differs.
        let triples: Vec<(u64, u64, u64)> = pairs
            .iter()
            .map(|(l, r)| (l.desc.addr, r.desc.addr, l.desc.len))
            .collect();
        let merged: Vec<(u64, u64, u64, usize)> = if opts.no_merge {
            triples
                .iter()
                .enumerate()
                .map(|(i, &(a, b, c))| (a, b, c, i))
                .collect()
        } else {
            merge_contiguous(&triples, |a, b| {
                let (la, ra) = pairs[a];
                let (lb, rb) = pairs[b];
                la.region == lb.region
                    && ra.region == rb.region
                    && la.desc.dev_id == lb.desc.dev_id
                    && ra.desc.dev_id == rb.desc.dev_id
            })
        };
        // Try the eligible backends in preference order; one that cannot reach these regions
        // (NotSupported) yields to the next.
        let mut refusal = None;
        let mut chosen = None;
        for slot in eligible {
            let spec = self.build_spec(
                &slot,
                op,
                (local, remote),
                &pairs,
                &merged,
                &opts,
                is_local,
                &remote_name,
            )?;
            match slot.backend.prepare_xfer(spec.clone()) {
                Ok(x) => {
                    chosen = Some((slot, spec, x));
                    break;
                }
                Err(e @ Error::NotSupported { .. }) => {
                    tracing::debug!(agent = %me, backend = %slot.name, error = %e, "backend declined the transfer");
                    refusal = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        let Some((slot, spec, xfer)) = chosen else {
            return Err(refusal.unwrap_or_else(no_backend));
        };
        let integrity = opts.integrity.then(|| IntegrityPlan {
            local: spec
                .segments
                .iter()
                .map(|s| (s.local_addr, s.len))
                .collect(),
            remote: spec
                .segments
                .iter()
                .map(|s| (s.remote_dev, s.remote_addr, s.len))
                .collect(),
        });
        let mut keep: Vec<Arc<Keep>> = Vec::new();
        for (l, r) in &pairs {
            for k in [&l.keep, &r.keep] {
                if !keep.iter().any(|x| Arc::ptr_eq(x, k)) {
                    keep.push(k.clone());
                }
            }
        }
        Ok(XferReq {
            id: self.shared.next_id(),
            integrity,
            shared: self.shared.clone(),
            op,
            backend: slot,
            remote: remote_peer,
            spec,
            timeout: opts.timeout,
            state: Mutex::new(ReqState {
                status: Status::Ready,
                notif: opts.notif.clone(),
                frame: None,
                xfer,
                tel: XferTelemetry::default(),
                leaked: false,
                draining: false,
            }),
            keep,
        })
    }

    /// The backend-specific transfer description for one candidate backend.
    #[allow(clippy::too_many_arguments)]
    fn build_spec(
        &self,
        slot: &BackendSlot,
        op: XferOp,
        (local, remote): (&PreparedList, &PreparedList),
        pairs: &[(&PrepEntry, &PrepEntry)],
        merged: &[(u64, u64, u64, usize)],
        opts: &XferOptions,
        is_local: bool,
        remote_name: &str,
    ) -> Result<XferSpec> {
        let md = |e: &PrepEntry| {
            e.mds
                .iter()
                .find(|(id, _)| *id == slot.id)
                .map(|(_, m)| m.clone())
        };
        let mut segments = Vec::with_capacity(merged.len());
        for &(laddr, raddr, len, first) in merged {
            let (l, r) = pairs[first];
            let (Some(local_md), Some(remote_md)) = (md(l), md(r)) else {
                return Err(Error::not_found(
                    self.name(),
                    Op::MakeXfer,
                    "backend metadata vanished",
                ));
            };
            segments.push(Segment {
                local_addr: laddr,
                local_dev: l.desc.dev_id,
                local_md,
                remote_addr: raddr,
                remote_dev: r.desc.dev_id,
                remote_md,
                len,
            });
        }
        Ok(XferSpec {
            op,
            local_kind: local.kind,
            remote_kind: remote.kind,
            remote: remote_name.to_owned(),
            is_local,
            segments,
            notif: if opts.integrity {
                None
            } else {
                opts.notif.clone()
            },
        })
    }

    /// One-shot form: prepares both lists and builds a request over all their descriptors
    /// (NIXL's `createXferReq`).
    #[doc(alias = "createXferReq")]
    pub fn create_xfer_req(
        &self,
        op: XferOp,
        local: &XferDescList,
        remote: &XferDescList,
        remote_agent: &str,
        opts: XferOptions,
    ) -> Result<XferReq> {
        if local.len() != remote.len() {
            return Err(Error::mismatch(
                self.name(),
                Op::MakeXfer,
                format!(
                    "{} local and {} remote descriptors",
                    local.len(),
                    remote.len()
                ),
            ));
        }
        let l = self.prep_xfer_dlist(XferTarget::Initiator, local, &opts.backends)?;
        let r = self.prep_xfer_dlist(XferTarget::Agent(remote_agent), remote, &opts.backends)?;
        let idx: Vec<usize> = (0..local.len()).collect();
        self.make_prepped_xfer(op, &l, &idx, &r, &idx, opts)
    }

    /// Posts a request (NIXL's `postXferReq`): the one way to start (and restart, once done)
    /// a request. Returns `Done` when the backend completed it inside the call.
    #[doc(alias = "postXferReq")]
    pub fn post_xfer_req(&self, req: &XferReq) -> Result<XferState> {
        self.check_owner(req, Op::PostXfer)?;
        req.post()
    }

    /// Polls a request (NIXL's `getXferStatus`).
    #[doc(alias = "getXferStatus")]
    pub fn check_xfer_state(&self, req: &XferReq) -> Result<XferState> {
        self.check_owner(req, Op::CheckXfer)?;
        req.check()
    }

    /// The backend a request uses (NIXL's `queryXferBackend`).
    #[doc(alias = "queryXferBackend")]
    pub fn query_xfer_backend(&self, req: &XferReq) -> BackendHandle {
        req.backend()
    }

    /// The backend's estimate of a request's cost, where it can make one.
    #[doc(alias = "estimateXferCost")]
    pub fn estimate_xfer_cost(&self, req: &XferReq) -> Result<Option<CostEstimate>> {
        self.check_owner(req, Op::EstimateCost)?;
        req.backend.backend.estimate_cost(&req.spec)
    }

    fn check_owner(&self, req: &XferReq, op: Op) -> Result<()> {
        if Arc::ptr_eq(&req.shared, &self.shared) {
            Ok(())
        } else {
            Err(Error::mismatch(
                self.name(),
                op,
                "request belongs to another agent",
            ))
        }
    }
}
