//! Completion without polling: a request's completion as a [`Future`] and received
//! notifications as a [`Stream`](futures_core::Stream), for async Rust on any executor (tokio,
//! smol, a hand-written `block_on`); no runtime is required or started.
//!
//! A pending future registers its waker with the agent's [`Wake`](crate::backend::Wake) hub,
//! which backends signal from their own progress (UCX completion callbacks, CUDA events,
//! libfabric completion queues, INPROC at once): the future is woken when the request may have
//! finished, not on a timer. A backend that cannot signal ([`Backend::wakes`](crate::backend::Backend::wakes)
//! is false) has its futures re-checked on a short timer instead (50 us doubling to 1 ms). A
//! backend that needs progress calls is driven by the agent's progress thread, started for
//! the first async caller where the configuration did not start it. Every future has a
//! deadline (the request's timeout, or the agent's default): past it the request fails
//! `TimedOut`, as [`XferReq::wait`] does.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::agent::request::XferReq;
use crate::agent::Agent;
use crate::agent::Shared;
use crate::backend::XferState;
use crate::error::{Error, Op, Result};
use crate::lease::{next_expiry, state_of, LeaseId, LeaseState};
use crate::model::timer;

/// The shortest and longest re-check interval for backends that do not signal completions.
const RECHECK_MIN: Duration = Duration::from_micros(50);
const RECHECK_MAX: Duration = Duration::from_millis(1);

/// A request's completion, as a future: `Ok(())` once its data (and notification) is complete,
/// or its terminal error. Made by [`XferReq::completion`] (borrowing the request: dropping the
/// future leaves the request posted) or [`XferReq::into_completion`] (owning it: dropping the
/// future lets the request go without waiting: it is asked to stop, ends `Canceled`, sends no
/// notification, and the agent holds its memory until the backend lets go).
///
/// A poll never drives the backend: it reads the request's state (no progress call, no copy,
/// no wait for a lock held across one), so it returns in microseconds; the backend's own
/// threads or the agent's progress thread move the bytes.
#[must_use = "a future does nothing unless polled"]
#[derive(Debug)]
pub struct XferFuture<R: Borrow<XferReq>> {
    req: R,
    timeout: Duration,
    /// Set at the first poll: then plus `timeout`.
    deadline: Option<Instant>,
    /// The waker the deadline's timer entry wakes.
    timed: Option<Waker>,
    recheck: Duration,
    ended: bool,
    /// The future owns the request ([`XferReq::into_completion`]): its drop lets it go.
    owns: bool,
}

impl XferReq {
    /// This request's completion as a future, with the request's timeout (or the agent's
    /// default) as its deadline from the first poll. Post the request first; the future does
    /// not post. Dropping it leaves the request as it is.
    pub fn completion(&self) -> XferFuture<&XferReq> {
        XferFuture::new(self, None, false)
    }

    /// [`XferReq::completion`] with its own deadline: `timeout` from the first poll.
    pub fn completion_within(&self, timeout: Duration) -> XferFuture<&XferReq> {
        XferFuture::new(self, Some(timeout), false)
    }

    /// [`XferReq::completion`] owning the request: a future that is `'static` (for
    /// `tokio::spawn`), whose drop lets an unfinished request go without blocking (see
    /// [`XferFuture`]).
    pub fn into_completion(self) -> XferFuture<XferReq> {
        XferFuture::new(self, None, true)
    }

    /// [`XferReq::into_completion`] with its own deadline: `timeout` from the first poll
    /// (then `TimedOut`, the request let go as by the future's drop).
    pub fn into_completion_within(self, timeout: Duration) -> XferFuture<XferReq> {
        XferFuture::new(self, Some(timeout), true)
    }
}

impl<R: Borrow<XferReq>> XferFuture<R> {
    fn new(req: R, timeout: Option<Duration>, owns: bool) -> Self {
        let (shared, _) = req.borrow().parts();
        let timeout = timeout
            .or(req.borrow().timeout())
            .unwrap_or(shared.config.default_timeout);
        XferFuture {
            req,
            timeout,
            deadline: None,
            timed: None,
            recheck: RECHECK_MIN,
            ended: false,
            owns,
        }
    }

    /// The request (for its path, telemetry, a repost once complete).
    pub fn request(&self) -> &XferReq {
        self.req.borrow()
    }
}

/// A request's quiescence, as a future: `Ok(())` once nothing the request started may touch
/// its memory any more ([`XferReq::is_quiescent`]), `TimedOut` past its deadline, `NotAllowed`
/// for a request in flight. Made by [`XferReq::quiescence`]; polls never drive the backend.
#[must_use = "a future does nothing unless polled"]
#[derive(Debug)]
pub struct QuiescenceFuture<'a> {
    req: &'a XferReq,
    timeout: Duration,
    deadline: Option<Instant>,
    recheck: Duration,
}

impl XferReq {
    /// The async form of [`XferReq::wait_quiescent`]: resolves once the request is quiescent,
    /// at most `timeout` after its first poll. Woken by the backend's completions, and
    /// re-checked on a short timer (a backend's release of an abandoned transfer need not
    /// signal).
    pub fn quiescence(&self, timeout: Duration) -> QuiescenceFuture<'_> {
        QuiescenceFuture {
            req: self,
            timeout,
            deadline: None,
            recheck: RECHECK_MIN,
        }
    }
}

impl Future for QuiescenceFuture<'_> {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        let (shared, slot) = this.req.parts();
        let now = Instant::now();
        let deadline = *this.deadline.get_or_insert(now + this.timeout);
        if let Err(e) = ensure_progress(shared, slot.caps.needs_progress) {
            return Poll::Ready(Err(e));
        }
        let hub = &shared.wake;
        loop {
            let seen = hub.generation();
            match this.req.look_quiescent() {
                Some(Ok(true)) => return Poll::Ready(Ok(())),
                Some(Err(e)) => return Poll::Ready(Err(e)),
                Some(Ok(false)) | None => {}
            }
            if Instant::now() >= deadline {
                return Poll::Ready(Err(Error::TimedOut {
                    agent: shared.name.clone(),
                    op: Op::Wait,
                    elapsed: this.timeout,
                }));
            }
            hub.register(cx.waker());
            if hub.generation() == seen {
                break;
            }
        }
        let next = (Instant::now() + this.recheck).min(deadline);
        timer::wake_at(next, cx.waker());
        this.recheck = (this.recheck * 2).min(RECHECK_MAX);
        Poll::Pending
    }
}

/// Starts the agent's progress thread where `needs` says a backend needs progress calls and
/// nothing else makes them.
pub(super) fn ensure_progress(shared: &Arc<Shared>, needs: bool) -> Result<()> {
    if needs && !shared.progress_running() {
        crate::agent::start_progress_thread_soon(shared)?;
    }
    Ok(())
}

impl<R: Borrow<XferReq> + Unpin> Future for XferFuture<R> {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(Err(Error::not_allowed(
                &this.request().parts().0.name,
                Op::Wait,
                "the completion future was polled after it finished",
            )));
        }
        let req = this.req.borrow();
        let (shared, slot) = req.parts();
        let now = Instant::now();
        let deadline = *this.deadline.get_or_insert(now + this.timeout);
        if let Err(e) = ensure_progress(shared, slot.caps.needs_progress) {
            this.ended = true;
            return Poll::Ready(Err(e));
        }
        let hub = &shared.wake;
        let mut busy = false;
        loop {
            let seen = hub.generation();
            match req.poll_check() {
                Some(Ok(XferState::Done)) => {
                    this.ended = true;
                    return Poll::Ready(Ok(()));
                }
                Some(Err(e)) => {
                    this.ended = true;
                    return Poll::Ready(Err(e));
                }
                Some(Ok(XferState::InProgress)) => {}
                // Another thread holds the request (a blocking call on it): look again soon.
                None => busy = true,
            }
            if Instant::now() >= deadline {
                this.ended = true;
                return Poll::Ready(req.time_out(this.timeout));
            }
            hub.register(cx.waker());
            // A wake between the check and the registration bumped the generation: check
            // again rather than sleep through it.
            if hub.generation() == seen {
                break;
            }
        }
        if this.timed.as_ref().is_none_or(|w| !w.will_wake(cx.waker())) {
            timer::wake_at(deadline, cx.waker());
            this.timed = Some(cx.waker().clone());
        }
        if busy || !slot.backend.wakes() {
            timer::wake_at(Instant::now() + this.recheck, cx.waker());
            this.recheck = (this.recheck * 2).min(RECHECK_MAX);
        }
        Poll::Pending
    }
}

impl<R: Borrow<XferReq>> Drop for XferFuture<R> {
    fn drop(&mut self) {
        if self.owns && !self.ended {
            self.req.borrow().let_go();
        }
    }
}

/// One received notification: who sent it and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Notification {
    /// The sender's agent name.
    pub from: String,
    /// The message.
    pub message: Vec<u8>,
}

/// Received notifications as a stream of [`Notification`]s, in each sender's order; an item
/// is `Err` where [`Agent::get_notifs`] would fail (notifications dropped because the queue
/// was full: `LimitExceeded`, reported once, before what was kept). Woken by each arrival,
/// never by a timer. The stream does not end while the agent lives, unless it was made to:
/// [`NotifStream::idle_timeout`] ends it (`None`) after that long without a notification,
/// [`NotifStream::end_when_gone`] with its peer. Made by [`Agent::notif_stream`]; several
/// streams of one agent share its notifications (each is taken once). Its combinators
/// (`next`, `try_next`, `map`...) come from the `futures` crate's `StreamExt` and
/// `TryStreamExt` (or `tokio-stream`'s `StreamExt`): the stream implements
/// `futures_core::Stream`.
#[must_use = "a stream does nothing unless polled"]
pub struct NotifStream {
    agent: Agent,
    buf: VecDeque<Notification>,
    idle: Option<Duration>,
    /// The idle deadline in force and the waker its timer entry wakes.
    idle_until: Option<Instant>,
    timed: Option<Waker>,
    /// The peer whose end ends the stream ([`NotifStream::end_when_gone`]), and whether it
    /// was seen loaded.
    until_gone: Option<(String, bool)>,
    /// The stream has ended (its last item was the peer's end).
    over: bool,
}

impl std::fmt::Debug for NotifStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifStream")
            .field("agent", &self.agent.name())
            .field("buffered", &self.buf.len())
            .field("idle", &self.idle)
            .finish()
    }
}

impl Agent {
    /// Received notifications as a [`Stream`](futures_core::Stream) (see [`NotifStream`]).
    pub fn notif_stream(&self) -> NotifStream {
        NotifStream {
            agent: self.clone(),
            buf: VecDeque::new(),
            idle: None,
            idle_until: None,
            timed: None,
            until_gone: None,
            over: false,
        }
    }
}

/// How often a stream that ends with its peer looks whether the peer is gone (a peer's exit or
/// its transport's failure wakes nobody).
const GONE_EVERY: Duration = Duration::from_millis(20);

impl NotifStream {
    /// Ends the stream (`None`) once `d` passes with no notification: a `while let Some(n) =
    /// stream.try_next().await?` loop then leaves cleanly.
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle = Some(d);
        self
    }

    /// Ends the stream when `peer` is gone: its process exited (same host), a transport
    /// reported its connection failed, or its metadata was invalidated after it was loaded.
    /// Everything queued before is yielded first, then one `Err(RemoteDisconnect)` naming
    /// the peer, then `None`. Noticed within about 20 ms.
    pub fn end_when_gone(mut self, peer: &str) -> Self {
        self.until_gone = Some((peer.to_owned(), false));
        self
    }
}

impl futures_core::Stream for NotifStream {
    type Item = Result<Notification>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.over {
            return Poll::Ready(None);
        }
        let shared = this.agent.shared.clone();
        let needs = shared.backends().iter().any(|b| b.caps.needs_progress);
        if let Err(e) = ensure_progress(&shared, needs) {
            return Poll::Ready(Some(Err(e)));
        }
        let hub = shared.notifs.waker_hub();
        loop {
            if let Some(item) = this.buf.pop_front() {
                this.idle_until = None;
                this.timed = None;
                return Poll::Ready(Some(Ok(item)));
            }
            let seen = hub.generation();
            match this.agent.get_notifs() {
                Err(e) => return Poll::Ready(Some(Err(e))),
                Ok(n) => {
                    for (from, msgs) in n {
                        this.buf
                            .extend(msgs.into_iter().map(|message| Notification {
                                from: from.clone(),
                                message,
                            }));
                    }
                }
            }
            if !this.buf.is_empty() {
                continue;
            }
            // Nothing queued: the peer's end, if it came, is the last item.
            if let Some((peer, loaded)) = this.until_gone.as_mut() {
                *loaded |= shared.remotes.lock().contains_key(peer.as_str());
                if let Some(e) = shared.peer_gone(peer, *loaded) {
                    this.over = true;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            hub.register(cx.waker());
            if hub.generation() == seen {
                break;
            }
        }
        if this.until_gone.is_some() {
            timer::wake_at(Instant::now() + GONE_EVERY, cx.waker());
        }
        if let Some(d) = this.idle {
            let now = Instant::now();
            let until = *this.idle_until.get_or_insert(now + d);
            if now >= until {
                this.over = true;
                return Poll::Ready(None);
            }
            if this.timed.as_ref().is_none_or(|w| !w.will_wake(cx.waker())) {
                timer::wake_at(until, cx.waker());
                this.timed = Some(cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

/// [`Agent::lease_end`]'s future.
#[must_use = "a future does nothing unless polled"]
#[derive(Debug)]
pub struct LeaseEnd {
    pub(super) agent: Agent,
    pub(super) id: LeaseId,
}

impl Future for LeaseEnd {
    type Output = Result<LeaseState>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<LeaseState>> {
        let l = &self.agent.shared.leases;
        l.register(cx.waker());
        let p = l.published.lock();
        let Some(lease) = p.get(&self.id.0) else {
            return Poll::Ready(Err(Error::not_found(
                self.agent.name(),
                Op::Lease,
                format!("no lease {}", self.id),
            )));
        };
        let now = l.now();
        match state_of(lease, now) {
            s @ LeaseState::Done { .. } => Poll::Ready(Ok(s)),
            LeaseState::Active { .. } => {
                if l.clock.is_real() {
                    if let Some(at) = next_expiry(lease, now) {
                        timer::wake_at(at, cx.waker());
                    }
                } else {
                    // A clock that moves when told wakes this at each move.
                    l.clock.wake_on_advance(cx.waker());
                }
                Poll::Pending
            }
        }
    }
}
