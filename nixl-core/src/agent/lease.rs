//! Leases on published blocks: a target (prefill) publishes blocks to named readers for a
//! duration, readers acquire, renew and release, and the target learns per lease when every
//! reader has released or expired, so it can reuse the blocks.
//!
//! Everything travels as control messages over the connections notifications already use (no
//! extra socket), posted without waiting ([`crate::backend::PeerBackend::post_notif`]: never
//! behind in-flight data, never blocked by a peer that does not read); an agent consumes them
//! itself (they never reach `get_notifs`). A reader acquires with a secret of its own that
//! its RENEW and RELEASE carry and the owner's answers echo: a peer that knows a lease's id
//! but not the secret cannot end or extend another reader's hold, nor answer for the owner.
//! The owner answers nothing for leases it does not know or did not publish to the sender. Clocks are
//! never compared across hosts: the target keeps its deadline on its own clock (from when it
//! granted or renewed); a reader keeps a conservative one on its own (from when it *sent* the
//! request the grant answers, so it always ends before the target's). A request made with
//! [`XferOptions::lease`](crate::XferOptions::lease) is refused at post, typed
//! [`Error::LeaseExpired`] and nothing moved, once the reader's deadline has passed or the
//! lease was released. The target does not revoke memory on expiry: the lease tells it when
//! reuse is safe (every reader released, or its grant ran out).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::agent::Agent;
use crate::agent::Shared;
use crate::error::{Error, Op, Result};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::desc::Desc;
use crate::lease::{
    check_held as held_by, covers, grant, merged, message, parse, state_of, target_extend,
    target_release, Answer, Held, LeaseId, LeaseState, Parsed, Published, Reader, Reply, Secret,
    ACQUIRE, DENY, GRANT, MAX_HELD, MAX_LEASES, MAX_LEASE_BLOCKS, MAX_READERS, RELEASE, RENEW,
    RENEWED, SECRET_LEN,
};
use crate::notif::Control;

/// What the agent's notification queue hands lease messages to: queued for the lease thread,
/// started with the first.
pub(crate) fn control(weak: Weak<Shared>) -> Control {
    Control(Box::new(move |sender, msg| {
        let Some(s) = weak.upgrade() else {
            return false;
        };
        // An answer to this agent's own request is taken here, at once (a map update): a
        // queue full of a flood must not drop it.
        if let Some(
            p @ Parsed {
                kind: GRANT | RENEWED | DENY,
                ..
            },
        ) = parse(&msg)
        {
            take_answer(&s.leases, sender, p);
            return true;
        }
        let (kept, start) = s.leases.take(sender, msg);
        if start {
            let w = weak.clone();
            let spawned = std::thread::Builder::new()
                .name("nixl-leases".to_owned())
                .spawn(move || run(&w));
            if let Err(e) = spawned {
                s.leases.running.store(false, Ordering::SeqCst);
                tracing::error!(error = %e, "could not start the lease thread");
            }
        }
        kept
    }))
}

/// The lease thread: handles control messages until the agent is gone.
fn run(weak: &Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let next = {
            let l = &shared.leases;
            let mut q = l.queue.lock();
            if q.items.is_empty() {
                l.queued.wait_for(&mut q, Duration::from_millis(200));
            }
            q.pop()
        };
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        if let Some((sender, msg)) = next {
            handle(&Agent { shared }, &sender, &msg);
        }
    }
}

fn handle(agent: &Agent, sender: &str, msg: &[u8]) {
    let Some(parsed) = parse(msg) else {
        tracing::warn!(agent = %agent.name(), sender, "malformed lease message dropped");
        return;
    };
    let (kind, id, secret) = (parsed.kind, parsed.id, parsed.secret);
    let l = &agent.shared.leases;
    let reply = match kind {
        ACQUIRE | RENEW => match target_extend(l, sender, id, kind == RENEW, &secret) {
            Answer::Grant(ttl) if kind == RENEW => Some(message(RENEWED, id, ttl, &secret)),
            Answer::Grant(ttl) => {
                // The first grant carries the blocks the lease covers.
                let blocks = l.published.lock().get(&id).map(|p| p.blocks.clone());
                Some(grant(id, ttl, &secret, blocks.as_deref().unwrap_or(&[])))
            }
            Answer::Deny => Some(message(DENY, id, Duration::ZERO, &secret)),
            Answer::None => None,
        },
        RELEASE => {
            if target_release(l, sender, id, &secret) {
                l.wake_all();
            } else {
                tracing::debug!(agent = %agent.name(), sender, lease = id, "a RELEASE without the reader's secret changed nothing");
            }
            None
        }
        GRANT | RENEWED | DENY => {
            take_answer(l, sender, parsed);
            None
        }
        _ => {
            tracing::warn!(agent = %agent.name(), sender, kind, "unknown lease message dropped");
            None
        }
    };
    if let Some(r) = reply {
        // Posted: a reader that does not read costs this thread nothing.
        if let Err(e) = agent.post_control(sender, &r) {
            tracing::warn!(agent = %agent.name(), sender, error = %e, "lease answer not sent");
        }
    }
}

/// An owner's answer to this agent's ACQUIRE or RENEW: taken only where this agent asked, and
/// only echoing the secret it asked with; anything else is a peer's noise or a forgery.
fn take_answer(l: &crate::lease::Leases, sender: &str, p: Parsed) {
    let key = (sender.to_owned(), p.id);
    let mut a = l.answers.lock();
    if let Some(slot) = a.get_mut(&key) {
        if matches!(slot, Reply::Waiting(s) if *s == p.secret) {
            if p.kind == GRANT {
                // The blocks the lease covers, kept with the hold (none: it names none).
                l.held_blocks.lock().insert(key.clone(), merged(&p.blocks));
            }
            *slot = if p.kind == DENY {
                Reply::Denied
            } else {
                Reply::Granted(p.ttl)
            };
            l.answered.notify_all();
            drop(a);
            l.wake_all();
        }
    }
}

impl Agent {
    /// Publishes a lease to `readers` (agent names) for `ttl`: each may acquire it once
    /// within `ttl` of now and then read for `ttl` from each grant or renewal. This lease
    /// names no memory: hand the readers the blocks with the id, or use
    /// [`Agent::publish_lease_blocks`], whose grant carries them. `InvalidParam` for no
    /// readers, too many, a zero duration.
    pub fn publish_lease(&self, readers: &[&str], ttl: Duration) -> Result<LeaseId> {
        self.publish_lease_blocks(readers, ttl, &[])
    }

    /// [`Agent::publish_lease`] on `blocks`: ranges of this agent's registered DRAM or VRAM (up to
    /// [`MAX_LEASE_BLOCKS`](crate::leases::MAX_LEASE_BLOCKS)). Each reader's grant carries
    /// them ([`Lease::blocks`]), and a reader's request made with the lease
    /// ([`XferOptions::lease`](crate::XferOptions::lease)) is refused at make (`NotAllowed`)
    /// where a remote descriptor lies outside them. `InvalidParam` also for too many blocks,
    /// an empty or wrapping one, or one outside this agent's live registrations.
    pub fn publish_lease_blocks(
        &self,
        readers: &[&str],
        ttl: Duration,
        blocks: &[Desc],
    ) -> Result<LeaseId> {
        if blocks.len() > MAX_LEASE_BLOCKS {
            return Err(Error::invalid(
                self.name(),
                Op::Lease,
                format!(
                    "a lease covers at most {MAX_LEASE_BLOCKS} blocks, not {}",
                    blocks.len()
                ),
            ));
        }
        if let Some(b) = blocks.iter().find(|b| !self.registered(b)) {
            return Err(Error::invalid(
                self.name(),
                Op::Lease,
                format!(
                    "block {:#x}+{} on device {} is empty or not inside this agent's live registrations",
                    b.addr, b.len, b.dev_id
                ),
            ));
        }
        if readers.is_empty() || readers.len() > MAX_READERS || ttl.is_zero() {
            return Err(Error::invalid(
                self.name(),
                Op::Lease,
                format!(
                    "a lease needs 1 to {MAX_READERS} readers and a duration ({} readers, {ttl:?})",
                    readers.len()
                ),
            ));
        }
        let mut p = self.shared.leases.published.lock();
        if p.len() >= MAX_LEASES {
            // Forget leases that are done before refusing.
            let now = self.shared.leases.now();
            p.retain(|_, l| matches!(state_of(l, now), LeaseState::Active { .. }));
            if p.len() >= MAX_LEASES {
                return Err(Error::limit(
                    self.name(),
                    Op::Lease,
                    "live leases",
                    MAX_LEASES,
                ));
            }
        }
        let id = loop {
            let id = u64::from_le_bytes(crate::auth::random::<8>().map_err(|e| {
                Error::not_supported(self.name(), Op::Lease, format!("no randomness: {e}"))
            })?);
            if id != 0 && !p.contains_key(&id) {
                break id;
            }
        };
        p.insert(
            id,
            Published {
                ttl,
                published: self.shared.leases.now(),
                readers: readers
                    .iter()
                    .map(|r| ((*r).to_owned(), Reader::Pending))
                    .collect(),
                blocks: merged(blocks),
            },
        );
        Ok(LeaseId(id))
    }

    /// Where a lease this agent published stands (`NotFound` for an unknown or forgotten one).
    pub fn lease_state(&self, id: LeaseId) -> Result<LeaseState> {
        let p = self.shared.leases.published.lock();
        let l = p
            .get(&id.0)
            .ok_or_else(|| Error::not_found(self.name(), Op::Lease, format!("no lease {id}")))?;
        Ok(state_of(l, self.shared.leases.now()))
    }

    /// Forgets a lease this agent published (its readers' later messages are denied).
    pub fn forget_lease(&self, id: LeaseId) {
        self.shared.leases.published.lock().remove(&id.0);
    }

    /// Acquires lease `id` of `owner` (a loaded peer that published it to this agent): asks
    /// and waits up to `timeout` for the grant. The lease is then held for its duration from
    /// the moment the request was sent (this agent's clock). `LeaseExpired` where the owner
    /// denies it (unknown, not published to this agent, run out); `TimedOut` without answer.
    pub fn acquire_lease(&self, owner: &str, id: LeaseId, timeout: Duration) -> Result<()> {
        let secret: Secret = crate::auth::random::<SECRET_LEN>().map_err(|e| {
            Error::not_supported(self.name(), Op::Lease, format!("no randomness: {e}"))
        })?;
        self.ask(owner, id, ACQUIRE, secret, timeout)
    }

    /// Renews a held lease for its duration from now (this agent's clock, counted from the
    /// request). `LeaseExpired` where it already ran out or was released.
    pub fn renew_lease(&self, owner: &str, id: LeaseId, timeout: Duration) -> Result<()> {
        self.check_lease(owner, id, Op::Lease)?;
        let secret = self
            .held_secret(owner, id)
            .ok_or_else(|| Error::LeaseExpired {
                agent: self.name().to_owned(),
                remote: owner.to_owned(),
                op: Op::Lease,
                lease: id.0,
            })?;
        self.ask(owner, id, RENEW, secret, timeout)
    }

    /// The secret this agent acquired `owner`'s lease `id` with.
    fn held_secret(&self, owner: &str, id: LeaseId) -> Option<Secret> {
        self.shared
            .leases
            .held
            .lock()
            .get(&(owner.to_owned(), id.0))
            .map(|h| h.secret)
    }

    /// Releases a held lease: the owner learns this agent is done with the blocks; requests
    /// made with it are refused from now on.
    pub fn release_lease(&self, owner: &str, id: LeaseId) -> Result<()> {
        // Forgotten: requests with it are refused from now on (an unknown lease is expired).
        let key = (owner.to_owned(), id.0);
        self.shared.leases.held_blocks.lock().remove(&key);
        let held = self.shared.leases.held.lock().remove(&key);
        match held {
            Some(h) => self.post_control(owner, &message(RELEASE, id.0, Duration::ZERO, &h.secret)),
            // Never acquired here (or already released): nothing to tell the owner.
            None => Ok(()),
        }
    }

    /// `Ok` while this agent holds `owner`'s lease `id` (granted, not run out on this
    /// agent's clock, not released); else `LeaseExpired`.
    pub(crate) fn check_lease(&self, owner: &str, id: LeaseId, op: Op) -> Result<()> {
        check_held(&self.shared, owner, id, op)
    }

    fn ask(
        &self,
        owner: &str,
        id: LeaseId,
        kind: u8,
        secret: Secret,
        timeout: Duration,
    ) -> Result<()> {
        let l = &self.shared.leases;
        let key = (owner.to_owned(), id.0);
        l.answers.lock().insert(key.clone(), Reply::Waiting(secret));
        // The deadline the owner's grant is counted from: when the request leaves (posted,
        // it waits for no data in flight), on the lease clock; the wait is on real time.
        let sent = l.now();
        let end = Instant::now() + timeout;
        if let Err(e) = self.post_control(owner, &message(kind, id.0, Duration::ZERO, &secret)) {
            l.answers.lock().remove(&key);
            return Err(e);
        }
        let mut a = l.answers.lock();
        let answer = loop {
            match a.get(&key) {
                Some(Reply::Granted(ttl)) => break Some(*ttl),
                Some(Reply::Denied) => break None,
                _ => {}
            }
            if Instant::now() >= end {
                a.remove(&key);
                return Err(Error::TimedOut {
                    agent: self.name().to_owned(),
                    op: Op::Lease,
                    elapsed: timeout,
                });
            }
            // Without a progress thread, drive the backends so the answer arrives.
            if !self.shared.progress_running() {
                parking_lot::MutexGuard::unlocked(&mut a, || self.shared.progress_all());
            }
            l.answered
                .wait_until(&mut a, end.min(Instant::now() + Duration::from_millis(1)));
        };
        a.remove(&key);
        drop(a);
        self.record_answer(owner, id, sent, secret, answer)
    }

    /// Records an owner's answer to a request sent at `sent`: a grant (or renewal) for `ttl`
    /// is held until `sent + ttl` (this agent's clock); a denial forgets the lease.
    fn record_answer(
        &self,
        owner: &str,
        id: LeaseId,
        sent: Instant,
        secret: Secret,
        answer: Option<Duration>,
    ) -> Result<()> {
        let l = &self.shared.leases;
        let key = (owner.to_owned(), id.0);
        match answer {
            Some(ttl) => {
                let mut held = l.held.lock();
                if held.len() >= MAX_HELD {
                    let now = l.now();
                    held.retain(|_, h| !h.released && now < h.until);
                    l.held_blocks
                        .lock()
                        .retain(|k, _| held.contains_key(k) || *k == key);
                }
                held.insert(
                    key,
                    Held {
                        until: sent + ttl,
                        released: false,
                        secret,
                    },
                );
                Ok(())
            }
            None => {
                l.held.lock().remove(&key);
                l.held_blocks.lock().remove(&key);
                Err(Error::LeaseExpired {
                    agent: self.name().to_owned(),
                    remote: owner.to_owned(),
                    op: Op::Lease,
                    lease: id.0,
                })
            }
        }
    }

    /// Acquires lease `id` of `owner` as a value that releases it when dropped (see
    /// [`Lease`]); blocks up to `timeout` for the owner's answer, as
    /// [`Agent::acquire_lease`]. An async caller uses [`Agent::lease_async`].
    pub fn lease(&self, owner: &str, id: LeaseId, timeout: Duration) -> Result<Lease> {
        self.acquire_lease(owner, id, timeout)?;
        Ok(Lease {
            agent: self.clone(),
            owner: owner.to_owned(),
            id,
            released: false,
        })
    }

    /// [`Agent::lease`] as a future that never blocks its caller: it posts the ACQUIRE at
    /// its first poll and is woken by the owner's answer (or its deadline, `timeout` from
    /// then: `TimedOut`). Dropped before it resolves, it forgets the request (a late grant
    /// is ignored).
    pub fn lease_async(&self, owner: &str, id: LeaseId, timeout: Duration) -> LeaseFuture {
        LeaseFuture {
            ask: Ask::new(self, owner, id, ACQUIRE, None, timeout),
        }
    }

    /// The end of a lease this agent published, as a future: resolves with its final
    /// [`LeaseState::Done`] once every reader released or ran out (the blocks may then be
    /// reused), woken by each release and at each expiry; `NotFound` for an unknown or
    /// forgotten lease.
    pub fn lease_end(&self, id: LeaseId) -> crate::agent::LeaseEnd {
        crate::agent::LeaseEnd {
            agent: self.clone(),
            id,
        }
    }
}

/// A lease this agent holds on blocks a peer published to it ([`Agent::lease`],
/// [`Agent::lease_async`]): requests made with its id
/// ([`XferOptions::lease`](crate::XferOptions::lease)) are accepted while it is
/// [`held`](Lease::held); [`Lease::renew`] extends it; it is released when dropped (or by
/// [`Lease::release`]), so the owner learns at once that the blocks are free, whatever path
/// the reader's code takes. The release is posted without waiting: a drop never blocks.
#[must_use = "dropping a lease releases it at once"]
#[derive(Debug)]
pub struct Lease {
    agent: Agent,
    owner: String,
    id: LeaseId,
    released: bool,
}

impl Lease {
    /// The lease's id (for [`XferOptions::lease`](crate::XferOptions::lease)).
    pub fn id(&self) -> LeaseId {
        self.id
    }

    /// The agent that published it.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The owner's memory the lease covers, as its grant said (sorted by device and address,
    /// touching ranges merged); empty for a lease that names none
    /// ([`Agent::publish_lease`]). Requests made with the lease reach only these.
    pub fn blocks(&self) -> Vec<Desc> {
        self.agent
            .shared
            .leases
            .held_blocks
            .lock()
            .get(&(self.owner.clone(), self.id.0))
            .map(|b| b.to_vec())
            .unwrap_or_default()
    }

    /// Whether it is still held: granted, not run out on this agent's clock (counted from when
    /// the request its grant answers was sent), not released.
    pub fn held(&self) -> bool {
        !self.released
            && self
                .agent
                .check_lease(&self.owner, self.id, Op::Lease)
                .is_ok()
    }

    /// How long it is still held on this agent's clock (`None`: not held).
    pub fn remaining(&self) -> Option<Duration> {
        let h = *self
            .agent
            .shared
            .leases
            .held
            .lock()
            .get(&(self.owner.clone(), self.id.0))?;
        let now = self.agent.shared.leases.now();
        (!self.released && !h.released && now < h.until).then(|| h.until - now)
    }

    /// Renews it for its duration from now, blocking up to `timeout` for the owner's answer
    /// (as [`Agent::renew_lease`]); [`Lease::renewal`] is the async form.
    pub fn renew(&self, timeout: Duration) -> Result<()> {
        self.agent.renew_lease(&self.owner, self.id, timeout)
    }

    /// [`Lease::renew`] as a future that never blocks its caller.
    pub fn renewal(&self, timeout: Duration) -> Renewal {
        let secret = self.agent.held_secret(&self.owner, self.id);
        Renewal {
            ask: Ask::new(&self.agent, &self.owner, self.id, RENEW, secret, timeout),
        }
    }

    /// Releases it now (what its drop does), reporting a failure to tell the owner.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.agent.release_lease(&self.owner, self.id)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.released {
            if let Err(e) = self.agent.release_lease(&self.owner, self.id) {
                tracing::warn!(agent = %self.agent.name(), owner = %self.owner, lease = %self.id, error = %e, "a dropped lease's RELEASE was not sent (the owner reclaims it at expiry)");
            }
        }
    }
}

/// A request to a lease's owner in flight (ACQUIRE or RENEW), for the futures.
#[derive(Debug)]
struct Ask {
    agent: Agent,
    owner: String,
    id: LeaseId,
    kind: u8,
    /// The secret to ask with (`None` for a RENEW of a lease not held: `LeaseExpired`).
    secret: Option<Secret>,
    timeout: Duration,
    /// When the request left: on the lease clock (a grant's hold counts from it) and in real
    /// time (the wait for the answer does).
    sent: Option<(Instant, Instant)>,
    over: bool,
}

impl Ask {
    fn new(
        agent: &Agent,
        owner: &str,
        id: LeaseId,
        kind: u8,
        secret: Option<Secret>,
        timeout: Duration,
    ) -> Self {
        Ask {
            agent: agent.clone(),
            owner: owner.to_owned(),
            id,
            kind,
            secret,
            timeout,
            sent: None,
            over: false,
        }
    }

    fn expired(&self) -> Error {
        Error::LeaseExpired {
            agent: self.agent.name().to_owned(),
            remote: self.owner.clone(),
            op: Op::Lease,
            lease: self.id.0,
        }
    }

    /// Sends the request (the first poll): its secret, the waiting slot, the message.
    fn send(&mut self) -> Result<(Instant, Instant)> {
        let shared = self.agent.shared.clone();
        let l = &shared.leases;
        let secret = match (self.kind, self.secret) {
            (_, Some(s)) => s,
            (ACQUIRE, None) => crate::auth::random::<SECRET_LEN>()?,
            _ => return Err(self.expired()),
        };
        self.secret = Some(secret);
        if self.kind == RENEW {
            self.agent.check_lease(&self.owner, self.id, Op::Lease)?;
        }
        let key = (self.owner.clone(), self.id.0);
        l.answers.lock().insert(key.clone(), Reply::Waiting(secret));
        let now = (l.now(), Instant::now());
        self.sent = Some(now);
        let msg = message(self.kind, self.id.0, Duration::ZERO, &secret);
        let needs = shared.backends().iter().any(|b| b.caps.needs_progress);
        let started = super::future::ensure_progress(&shared, needs);
        if let Err(e) = started.and_then(|()| self.agent.post_control(&self.owner, &msg)) {
            l.answers.lock().remove(&key);
            return Err(e);
        }
        Ok(now)
    }

    /// The owner's answer, if it came: `Some(Some(ttl))` granted, `Some(None)` denied.
    fn answer(&self) -> Option<Option<Duration>> {
        let key = (self.owner.clone(), self.id.0);
        let mut a = self.agent.shared.leases.answers.lock();
        let got = match a.get(&key) {
            Some(Reply::Granted(ttl)) => Some(Some(*ttl)),
            Some(Reply::Denied) => Some(None),
            _ => None,
        };
        if got.is_some() {
            a.remove(&key);
        }
        got
    }

    fn poll_ask(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.over {
            return Poll::Ready(Err(Error::not_allowed(
                self.agent.name(),
                Op::Lease,
                "the lease future was polled after it finished",
            )));
        }
        let (sent, sent_real) = match self.sent {
            Some(t) => t,
            None => match self.send() {
                Ok(t) => t,
                Err(e) => {
                    self.over = true;
                    return Poll::Ready(Err(e));
                }
            },
        };
        // Registered before the look: an answer between the two wakes this task.
        self.agent.shared.leases.register(cx.waker());
        if let Some(answer) = self.answer() {
            self.over = true;
            let secret = self.secret.unwrap_or_default();
            return Poll::Ready(self.agent.record_answer(
                &self.owner,
                self.id,
                sent,
                secret,
                answer,
            ));
        }
        let deadline = sent_real + self.timeout;
        if Instant::now() >= deadline {
            self.agent
                .shared
                .leases
                .answers
                .lock()
                .remove(&(self.owner.clone(), self.id.0));
            self.over = true;
            return Poll::Ready(Err(Error::TimedOut {
                agent: self.agent.name().to_owned(),
                op: Op::Lease,
                elapsed: self.timeout,
            }));
        }
        crate::model::timer::wake_at(deadline, cx.waker());
        Poll::Pending
    }
}

impl Drop for Ask {
    fn drop(&mut self) {
        if self.sent.is_some() && !self.over {
            let key = (self.owner.clone(), self.id.0);
            let mut a = self.agent.shared.leases.answers.lock();
            if matches!(a.get(&key), Some(Reply::Waiting(s)) if Some(*s) == self.secret) {
                a.remove(&key);
            }
        }
    }
}

/// [`Agent::lease_async`]'s future: the held [`Lease`], `LeaseExpired` where the owner
/// denies it, `TimedOut` without an answer.
#[must_use = "a future does nothing unless polled"]
#[derive(Debug)]
pub struct LeaseFuture {
    ask: Ask,
}

impl Future for LeaseFuture {
    type Output = Result<Lease>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Lease>> {
        let this = self.get_mut();
        this.ask.poll_ask(cx).map(|r| {
            r.map(|()| Lease {
                agent: this.ask.agent.clone(),
                owner: this.ask.owner.clone(),
                id: this.ask.id,
                released: false,
            })
        })
    }
}

/// [`Lease::renewal`]'s future: `Ok` once renewed, `LeaseExpired` where the lease ran out,
/// was released or the owner denies it, `TimedOut` without an answer.
#[must_use = "a future does nothing unless polled"]
#[derive(Debug)]
pub struct Renewal {
    ask: Ask,
}

impl Future for Renewal {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.get_mut().ask.poll_ask(cx)
    }
}

/// `Ok` where every remote range of `spec` (a request made with `owner`'s lease `id`) lies
/// inside the blocks the lease covers; a lease that names none covers what its owner let the
/// reader reach. Else `NotAllowed`, naming the first range outside.
pub(crate) fn check_blocks(
    shared: &Shared,
    owner: &str,
    id: LeaseId,
    spec: &crate::agent::spec::ReqSpec,
) -> Result<()> {
    let key = (owner.to_owned(), id.0);
    let Some(blocks) = shared.leases.held_blocks.lock().get(&key).cloned() else {
        return Ok(());
    };
    if blocks.is_empty() {
        return Ok(());
    }
    let mut outside = None;
    spec.for_each_segment(|(_, ra, dev, len)| {
        if outside.is_none() && !covers(&blocks, dev, ra, len) {
            outside = Some((ra, dev, len));
        }
    });
    match outside {
        None => Ok(()),
        Some((ra, dev, len)) => Err(Error::not_allowed(
            &shared.name,
            Op::MakeXfer,
            format!("remote range {ra:#x}+{len} on device {dev} lies outside the blocks lease {id} of {owner} covers"),
        )),
    }
}

impl Agent {
    /// Whether `b` is a non-empty range inside one live DRAM or VRAM registration of this agent.
    fn registered(&self, b: &Desc) -> bool {
        let regs = self.shared.regs.lock();
        b.len > 0
            && [crate::mem::MemKind::Dram, crate::mem::MemKind::Vram]
                .into_iter()
                .any(|k| regs.find(k, b.dev_id, b.addr, b.len).is_some())
    }
}

/// [`Agent::check_lease`] on the agent's state.
pub(crate) fn check_held(shared: &Arc<Shared>, owner: &str, id: LeaseId, op: Op) -> Result<()> {
    held_by(&shared.leases, &shared.name, owner, id, op)
}
