//! A prepared transfer: its segments cut into RMA operations striped over rails, posted as the
//! queues allow, counted to completion on the rails' CQs, then followed by the notification.
//!
//! Ordering of notifications: the notification is sent only after every write of the post has
//! completed at the initiator. With `FI_DELIVERY_COMPLETE` (asked for first, and granted by the
//! tcp, shm and efa providers) a write's completion means the data is visible in the target's
//! memory, so the target can never see the notification before the data.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nixl_core::backend::{downcast_md, BackendXfer, MdTable, XferSpec};
use nixl_core::{Error, MemKind, Op, Result, XferOp, XferState};

use crate::backend::{Inner, LocalMd, Peer, RemoteMd};
use crate::rail::Track;

/// One RMA operation of a transfer.
#[derive(Debug, Clone, Copy)]
struct RmaOp {
    rail: usize,
    local: u64,
    len: u64,
    desc: usize,
    raddr: u64,
    key: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Data,
    Notif,
    Done,
}

/// The state of a transfer, shared between its request (which polls it) and the backend's
/// progress thread (which drives it while nobody polls: posts what did not fit in the queues
/// and sends the notification once the data is complete).
pub(crate) struct XferCore {
    inner: Arc<Inner>,
    peer: Arc<Peer>,
    write: bool,
    ops: Vec<RmaOp>,
    notif: Option<Vec<u8>>,
    track: Arc<Track>,
    next: usize,
    phase: Phase,
    /// A failure found by the progress thread, reported by the next check.
    failed: Option<Error>,
    /// When the latest post started.
    posted: Instant,
    /// Abandoned (`BackendXfer::abandon`): nothing more is posted, and the request drains
    /// until what is in flight completes; `true` once the rails it is stuck on were failed.
    abandoned: Option<bool>,
    /// Set by `BackendXfer::abandon` when another thread held the state: the next step (the
    /// progress thread's, or the agent's) applies it, so the abandoning caller never waits.
    abandon_asked: Arc<AtomicBool>,
    /// Over shm, once the peer's process was seen to have exited with operations in flight:
    /// each rail's progress passes then (see [`XferCore::orphaned`]).
    orphan: Option<Vec<u64>>,
    /// The metadata the operations' keys and descriptors come from.
    _mds: MdTable,
}

/// Frames a notification to `peer` (in the session its hello opened), refused when larger
/// than a receive slot.
fn frame_notif(inner: &Inner, peer: &Peer, msg: &[u8], op: Op) -> Result<Vec<u8>> {
    let me = inner.agent.as_str();
    let f = crate::wire::encode_notif(&peer.session, msg);
    if f.len() > inner.params.notif_size {
        return Err(Error::invalid(
            me,
            op,
            format!(
                "notification of {} bytes exceeds notif_size {}",
                f.len(),
                inner.params.notif_size
            ),
        ));
    }
    Ok(f)
}

/// A shared transfer state.
pub(crate) type SharedCore = Arc<Mutex<XferCore>>;

pub(crate) struct LfXfer {
    inner: Arc<Inner>,
    core: SharedCore,
    /// The core's `abandon_asked`.
    abandon_asked: Arc<AtomicBool>,
    write: bool,
    rail_bytes: Vec<u64>,
}

impl XferCore {
    /// Whether the progress thread should keep driving it.
    pub(crate) fn active(&self) -> bool {
        matches!(self.phase, Phase::Data | Phase::Notif) && self.failed.is_none()
    }

    /// Applies an abandon asked while another thread held the state: nothing more is
    /// posted, and what is in flight drains.
    fn take_abandon(&mut self) {
        if self.abandon_asked.swap(false, Ordering::AcqRel)
            && matches!(self.phase, Phase::Data | Phase::Notif)
        {
            self.next = self.ops.len();
            self.failed = None;
            self.abandoned = Some(false);
        }
    }

    /// One step from the progress thread: errors are kept for the next check.
    pub(crate) fn drive(&mut self) {
        if self.active() {
            if let Err(e) = self.step(Op::Progress, How::Drive) {
                self.failed = Some(e);
            }
        }
    }
}

/// How far one step of a post goes (see `XferCore::step`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    Poll,
    Drive,
    Look,
}

impl LfXfer {
    pub(crate) fn prepare(inner: Arc<Inner>, peer: Arc<Peer>, spec: &XferSpec) -> Result<LfXfer> {
        let me = inner.agent.clone();
        let kinds_ok = |k: MemKind| k == MemKind::Dram || (k == MemKind::Vram && inner.hmem);
        if !kinds_ok(spec.local_kind) || !kinds_ok(spec.remote_kind) {
            return Err(Error::not_supported(
                &me,
                Op::MakeXfer,
                format!(
                    "LIBFABRIC ({}) cannot move {} -> {}",
                    inner.provider, spec.local_kind, spec.remote_kind
                ),
            ));
        }
        if spec.segments.is_empty() {
            return Err(Error::invalid(&me, Op::MakeXfer, "no segments"));
        }
        let notif = spec
            .notif
            .as_deref()
            .map(|n| frame_notif(&inner, &peer, n, Op::MakeXfer))
            .transpose()?;
        let (segs, nr) = resolve_segments(&me, spec, peer.addrs.len().min(inner.rails.len()))?;
        let mds = spec.mds.clone();
        // Only rails that still reach the peer (see peer.rs).
        let healthy = peer.healthy_rails(nr);
        if healthy.is_empty() {
            return Err(Error::disconnected(
                &me,
                &spec.remote,
                Op::MakeXfer,
                if nr == 0 {
                    "no rail reaches the peer"
                } else {
                    "every rail to the peer failed; reload its metadata once a link is repaired"
                },
            ));
        }
        let (ops, load) = stripe(&inner, &healthy, segs);
        let write = spec.op == XferOp::Write;
        let core = XferCore {
            inner: inner.clone(),
            peer,
            write,
            ops,
            notif,
            track: Arc::new(Track::default()),
            next: 0,
            phase: Phase::Idle,
            failed: None,
            posted: Instant::now(),
            abandoned: None,
            abandon_asked: Arc::new(AtomicBool::new(false)),
            orphan: None,
            _mds: mds,
        };
        Ok(LfXfer {
            inner,
            abandon_asked: core.abandon_asked.clone(),
            core: Arc::new(Mutex::new(core)),
            write,
            rail_bytes: load,
        })
    }
}

/// A segment resolved to its registrations: local address, remote address as the peer's
/// provider expects it (virtual, or an offset into the region), length, and the two sides'
/// metadata.
type Resolved<'a> = (u64, u64, u64, &'a LocalMd, &'a RemoteMd);

/// Resolves every segment against its registrations (each must lie inside both); returns them
/// and how many rails every segment's keys cover (at most `rails`).
fn resolve_segments<'a>(
    me: &str,
    spec: &'a XferSpec,
    rails: usize,
) -> Result<(Vec<Resolved<'a>>, usize)> {
    let mut nr = rails;
    let mut segs = Vec::with_capacity(spec.segments.len());
    for s in &spec.segments {
        let l = spec
            .md(s.local_md)
            .and_then(downcast_md::<LocalMd>)
            .ok_or_else(|| Error::invalid(me, Op::MakeXfer, "local metadata is not LIBFABRIC's"))?;
        let r = spec
            .md(s.remote_md)
            .and_then(downcast_md::<RemoteMd>)
            .ok_or_else(|| {
                Error::invalid(me, Op::MakeXfer, "remote metadata is not LIBFABRIC's")
            })?;
        let inside =
            |a: u64, base: u64, len: u64| a >= base && s.len <= len && a - base <= len - s.len;
        if !inside(s.local_addr, l.addr, l.len) || !inside(s.remote_addr, r.base, r.len) {
            return Err(Error::invalid(
                me,
                Op::MakeXfer,
                "segment outside its registration",
            ));
        }
        nr = nr.min(l.keys.len()).min(r.keys.len());
        let raddr = if r.virt_addr {
            s.remote_addr
        } else {
            s.remote_addr - r.base
        };
        segs.push((s.local_addr, raddr, s.len, l, r));
    }
    Ok((segs, nr))
}

/// Stripes the segments over the `healthy` rails: big segments are cut across rails, every
/// piece goes to the least-loaded rail, and no piece exceeds its rail's largest message.
/// Returns the operations and the bytes per rail.
fn stripe(inner: &Inner, healthy: &[usize], segs: Vec<Resolved<'_>>) -> (Vec<RmaOp>, Vec<u64>) {
    let nr = healthy.len();
    let mut load = vec![0u64; inner.rails.len()];
    let mut ops = Vec::new();
    let stripe_min = inner.params.stripe_min;
    for (local, raddr, len, l, r) in segs {
        let piece = if nr > 1 && len >= 2 * stripe_min {
            len.div_ceil(nr as u64).max(stripe_min)
        } else {
            len
        };
        let mut off = 0;
        while off < len {
            let rail = healthy
                .iter()
                .copied()
                .min_by_key(|&i| load[i])
                .unwrap_or(healthy[0]);
            let max_msg = inner.rails[rail].max_msg;
            let n = piece.min(len - off).min(max_msg);
            ops.push(RmaOp {
                rail,
                local: local + off,
                len: n,
                desc: l.descs[rail],
                raddr: raddr + off,
                key: r.keys[rail],
            });
            load[rail] += n;
            off += n;
        }
    }
    (ops, load)
}

impl XferCore {
    fn err(&self, e: crate::result::FiError, op: Op) -> Error {
        e.into_error(&self.inner.agent, Some(&self.peer.name), op)
    }

    /// Posts operations until all are posted or a queue is full.
    fn pump(&mut self, op: Op) -> Result<()> {
        while let Some(o) = self.ops.get(self.next).copied() {
            if !self
                .peer
                .post_rma(
                    o.rail,
                    self.write,
                    o.local,
                    o.len,
                    o.desc,
                    o.raddr,
                    o.key,
                    &self.track,
                )
                .map_err(|e| self.err(e, op))?
            {
                break;
            }
            self.next += 1;
        }
        Ok(())
    }

    /// After a failure: stop posting and wait (bounded) for what is in flight, so the memory
    /// is no longer touched when the error is reported.
    fn fail(&mut self, e: Error) -> Error {
        self.next = self.ops.len();
        self.phase = Phase::Idle;
        if !self.settle() {
            // Still in flight: the transfer drains (its checks say `InProgress` until the
            // operations complete), so the agent keeps its memory meanwhile.
            tracing::error!(agent = %self.inner.agent, "operations of a failed transfer did not complete in time; its memory stays held");
            self.abandoned = Some(true);
        }
        e
    }

    /// An abandoned transfer (its deadline passed): in progress while operations are in flight,
    /// then `Canceled`. Once the post is older than `op_timeout` with operations still in
    /// flight, the rails they are stuck on are failed for this peer when another rail is left,
    /// so new requests avoid them (as a cancel's [`XferCore::settle`] does, without waiting);
    /// their connections are not torn down, so the stuck operations still complete if the link
    /// comes back, and the request's memory stays held until then (or until the peer is
    /// forgotten and dropped).
    fn step_abandoned(&mut self, op: Op, poll: bool) -> Result<XferState> {
        if poll {
            self.inner.poll();
        }
        if self.track.state().0 > 0 && !self.orphaned() {
            let stuck = self.posted.elapsed() >= self.inner.params.op_timeout;
            if stuck && self.abandoned == Some(false) && !Arc::ptr_eq(&self.peer, &self.inner.me) {
                self.abandoned = Some(true);
                let stuck = self.track.stuck_rails();
                let left = self
                    .peer
                    .healthy_rails(self.peer.addrs.len())
                    .into_iter()
                    .any(|r| !stuck.contains(&r));
                // Only where another rail is left to take new requests: a peer's only rail
                // stays in use, so a link that comes back serves new requests without a reload.
                if left {
                    self.peer.avoid_rails(&stuck);
                }
            }
            return Ok(XferState::InProgress);
        }
        self.abandoned = None;
        self.phase = Phase::Idle;
        Err(Error::Canceled {
            agent: self.inner.agent.clone(),
            op,
        })
    }

    /// Waits for what is in flight; if it does not complete in time, the rails it is stuck on
    /// are failed for this peer (their connections torn down, flushing what is queued; with
    /// no rail left the peer is unreachable) and it is waited for once more.
    fn settle(&mut self) -> bool {
        if self.drain() {
            return true;
        }
        if Arc::ptr_eq(&self.peer, &self.inner.me) {
            return false;
        }
        let stuck = self.track.stuck_rails();
        if stuck.is_empty() {
            self.peer.declare_unreachable();
        } else {
            self.peer.fail_rails(&stuck);
        }
        self.drain()
    }

    /// Waits (polling, bounded by `op_timeout`) until nothing of the post is in flight or
    /// what is left is orphaned ([`XferCore::orphaned`]).
    fn drain(&mut self) -> bool {
        let inner = self.inner.clone();
        inner.drain_until(|| self.track.state().0 == 0 || self.orphaned())
    }

    /// Whether the operations still in flight can no longer touch the request's memory
    /// although they will never complete: libfabric's shm provider completes nothing to a
    /// peer whose process died. Its copies are made by the peer's process (CMA) or, for
    /// data staged through shared buffers, by this process's progress when the peer has
    /// moved a buffer; a dead peer moves none, so once the exit is seen (the process watch
    /// the agent bound) and two progress passes of every rail began after it, what the peer
    /// left staged was copied and nothing more is. The operations' contexts stay in the
    /// rail's table until the endpoint closes, so a late completion still finds its own.
    fn orphaned(&mut self) -> bool {
        let shm = self.inner.rails.first().is_some_and(|r| r.is_shm());
        if !shm || !self.peer.exited() {
            return false;
        }
        let now: Vec<u64> = self.inner.rails.iter().map(|r| r.passes()).collect();
        match &self.orphan {
            None => {
                self.orphan = Some(now);
                false
            }
            Some(seen) => {
                if !seen.iter().zip(&now).all(|(s, n)| *n >= s + 2) {
                    return false;
                }
                for r in self.track.stuck_rails() {
                    if let Some(rail) = self.inner.rails.get(r) {
                        rail.block_behind_dead_peer();
                    }
                }
                true
            }
        }
    }

    /// One step of the post, as `how` says: [`How::Poll`] reads the completion queues first,
    /// [`How::Drive`] only posts what is left, [`How::Look`] only reports what the driving
    /// thread recorded (no operation posted, no queue read: the poll of a future).
    fn step(&mut self, op: Op, how: How) -> Result<XferState> {
        let poll = how == How::Poll;
        self.take_abandon();
        if let Some(e) = self.failed.take() {
            self.phase = Phase::Idle;
            return Err(e);
        }
        if self.abandoned.is_some() {
            return self.step_abandoned(op, poll);
        }
        match self.phase {
            Phase::Done => return Ok(XferState::Done),
            Phase::Idle => {
                return Err(Error::not_allowed(
                    &self.inner.agent,
                    op,
                    "transfer is not posted",
                ))
            }
            Phase::Data | Phase::Notif => {}
        }
        if !self.peer.alive.load(std::sync::atomic::Ordering::SeqCst) {
            let e = Error::disconnected(
                &self.inner.agent,
                &self.peer.name,
                op,
                "peer was disconnected or declared unreachable",
            );
            return Err(self.fail(e));
        }
        if how == How::Look {
            if let (_, Some(e)) = self.track.state() {
                let e = self.err(e, op);
                return Err(self.fail(e));
            }
            // Done only once the driver recorded it (every operation and the notification
            // completed): a look never posts what is left.
            return Ok(XferState::InProgress);
        }
        if poll {
            self.inner.poll();
        }
        if self.phase == Phase::Data {
            if let Err(e) = self.pump(op) {
                return Err(self.fail(e));
            }
        }
        let (outstanding, error) = self.track.state();
        if let Some(e) = error {
            let e = self.err(e, op);
            return Err(self.fail(e));
        }
        if outstanding > 0 || self.next < self.ops.len() {
            return Ok(XferState::InProgress);
        }
        if self.phase == Phase::Data {
            if let Some(n) = &self.notif {
                let Some((r, _, _)) = self.peer.notif_rail() else {
                    let e = Error::disconnected(
                        &self.inner.agent,
                        &self.peer.name,
                        op,
                        "no rail left for the notification",
                    );
                    return Err(self.fail(e));
                };
                match self.peer.post_send(r, n, &self.track) {
                    Ok(true) => {
                        self.phase = Phase::Notif;
                        return Ok(XferState::InProgress);
                    }
                    Ok(false) => return Ok(XferState::InProgress),
                    Err(e) => {
                        let e = self.err(e, op);
                        return Err(self.fail(e));
                    }
                }
            }
        }
        self.phase = Phase::Done;
        Ok(XferState::Done)
    }
}

impl BackendXfer for LfXfer {
    fn post(&mut self) -> Result<XferState> {
        let mut c = self.core.lock();
        if matches!(c.phase, Phase::Data | Phase::Notif) {
            return Err(Error::RepostActive {
                agent: self.inner.agent.clone(),
                op: Op::PostXfer,
            });
        }
        // An abandon asked of an earlier post that had ended by then is not this post's.
        self.abandon_asked.store(false, Ordering::Release);
        // Striped over a rail that has failed since it was built: refused at once (building
        // the request again stripes it over the rails left).
        if let Some(r) = c.ops.iter().map(|o| o.rail).find(|&r| !c.peer.rail_ok(r)) {
            let domain = c.inner.rails.get(r).map(|x| x.domain_name.clone());
            return Err(Error::disconnected(
                &self.inner.agent,
                &c.peer.name,
                Op::PostXfer,
                format!(
                    "rail {r} ({}) to the peer failed; build the request again to use the rails left",
                    domain.unwrap_or_default()
                ),
            ));
        }
        // A fresh tracker: late completions of an earlier, canceled post cannot count here.
        c.track = Arc::new(Track::default());
        c.next = 0;
        c.failed = None;
        c.abandoned = None;
        c.orphan = None;
        c.posted = Instant::now();
        c.phase = Phase::Data;
        let r = c.step(Op::PostXfer, How::Poll);
        if c.active() {
            self.inner.activate(Arc::downgrade(&self.core));
        }
        r
    }

    fn check(&mut self) -> Result<XferState> {
        self.core.lock().step(Op::CheckXfer, How::Poll)
    }

    fn state(&mut self) -> Result<XferState> {
        // Without the rails' progress threads nothing else drives the post: the look drives.
        if !self.inner.params.progress_thread {
            return self.check();
        }
        // Read only: rail 0's progress thread drives posted requests (`drive_active`: pumps
        // operations, posts the notification); a poll never posts, copies or reads a
        // completion queue on the caller's thread. The request's lock is only tried: the
        // thread that drives it holds it for one step.
        match self.core.try_lock() {
            Some(mut c) => c.step(Op::CheckXfer, How::Look),
            None => Ok(XferState::InProgress),
        }
    }

    fn abandon(&mut self) {
        self.abandon_asked.store(true, Ordering::Release);
        if self.inner.params.progress_thread {
            // Rail 0's progress thread applies it at its next step (and fails the rails the
            // post is stuck on once it is older than op_timeout): the caller, often an async
            // poll or a future's drop, never waits for the lock that thread holds.
            if let Some(mut c) = self.core.try_lock() {
                c.take_abandon();
            }
            return;
        }
        // Nothing else drives the post: applied here, and the rails it is stuck on are failed
        // at once when it is already older than op_timeout.
        let mut c = self.core.lock();
        c.take_abandon();
        if c.abandoned.is_some() {
            let _ = c.step(Op::CheckXfer, How::Drive);
        }
    }

    fn cancel(&mut self) -> Result<()> {
        let mut c = self.core.lock();
        c.next = c.ops.len();
        c.phase = Phase::Idle;
        c.failed = None;
        c.abandoned = None;
        if c.settle() {
            Ok(())
        } else {
            Err(Error::TimedOut {
                agent: self.inner.agent.clone(),
                op: Op::Cancel,
                elapsed: self.inner.params.op_timeout,
            })
        }
    }

    fn path(&self) -> Option<String> {
        let split: Vec<String> = self
            .rail_bytes
            .iter()
            .enumerate()
            .map(|(i, b)| format!("rail{i} {}: {b} B", self.inner.rails[i].domain_name))
            .collect();
        Some(format!(
            "libfabric {} {}; {}",
            self.inner.provider,
            if self.write { "WRITE" } else { "READ" },
            split.join(", ")
        ))
    }
    fn set_notif(&mut self, msg: Option<&[u8]>) -> Result<()> {
        let mut core = self.core.lock();
        core.notif = msg
            .map(|m| frame_notif(&self.inner, &core.peer, m, Op::PostXfer))
            .transpose()?;
        Ok(())
    }
}
