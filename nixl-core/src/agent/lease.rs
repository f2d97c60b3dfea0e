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
use crate::lease::{
    check_held as held_by, message, parse, state_of, target_extend, target_release, Answer, Held,
    LeaseId, LeaseState, Published, Reader, Reply, Secret, ACQUIRE, DENY, GRANT, MAX_HELD,
    MAX_LEASES, MAX_READERS, RELEASE, RENEW, RENEWED, SECRET_LEN,
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
        if let Some((kind @ (GRANT | RENEWED | DENY), id, ttl, secret)) = parse(&msg) {
            take_answer(&s.leases, sender, kind, id, ttl, &secret);
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
    let Some((kind, id, ttl, secret)) = parse(msg) else {
        tracing::warn!(agent = %agent.name(), sender, "malformed lease message dropped");
        return;
    };
    let l = &agent.shared.leases;
    let reply = match kind {
        ACQUIRE | RENEW => match target_extend(l, sender, id, kind == RENEW, &secret) {
            Answer::Grant(ttl) => Some(message(
                if kind == RENEW { RENEWED } else { GRANT },
                id,
                ttl,
                &secret,
            )),
            Answer::Deny => Some(message(DENY, id, Duration::ZERO, &secret)),
            Answer::None => None,
        },
        RELEASE => {
            if !target_release(l, sender, id, &secret) {
                tracing::debug!(agent = %agent.name(), sender, lease = id, "a RELEASE without the reader's secret changed nothing");
            }
            None
        }
        GRANT | RENEWED | DENY => {
            take_answer(l, sender, kind, id, ttl, &secret);
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
fn take_answer(
    l: &crate::lease::Leases,
    sender: &str,
    kind: u8,
    id: u64,
    ttl: Duration,
    secret: &Secret,
) {
    let key = (sender.to_owned(), id);
    let mut a = l.answers.lock();
    if let Some(slot) = a.get_mut(&key) {
        if matches!(slot, Reply::Waiting(s) if s == secret) {
            *slot = if kind == DENY {
                Reply::Denied
            } else {
                Reply::Granted(ttl)
            };
            l.answered.notify_all();
        }
    }
}

impl Agent {
    /// Publishes a lease to `readers` (agent names) for `ttl`: each may acquire it once
    /// within `ttl` of now and then read for `ttl` from each grant or renewal. Hand the id to
    /// the readers with the blocks it covers (the lease names no memory: the blocks are the
    /// application's). `InvalidParam` for no readers, too many, a zero duration.
    pub fn publish_lease(&self, readers: &[&str], ttl: Duration) -> Result<LeaseId> {
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
            let now = Instant::now();
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
                published: Instant::now(),
                readers: readers
                    .iter()
                    .map(|r| ((*r).to_owned(), Reader::Pending))
                    .collect(),
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
        Ok(state_of(l, Instant::now()))
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
        let held = self
            .shared
            .leases
            .held
            .lock()
            .remove(&(owner.to_owned(), id.0));
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
        // it waits for no data in flight).
        let sent = Instant::now();
        let end = sent + timeout;
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
        match answer {
            Some(ttl) => {
                let mut held = l.held.lock();
                if held.len() >= MAX_HELD {
                    let now = Instant::now();
                    held.retain(|_, h| !h.released && now < h.until);
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
                Err(Error::LeaseExpired {
                    agent: self.name().to_owned(),
                    remote: owner.to_owned(),
                    op: Op::Lease,
                    lease: id.0,
                })
            }
        }
    }
}

/// [`Agent::check_lease`] on the agent's state.
pub(crate) fn check_held(shared: &Arc<Shared>, owner: &str, id: LeaseId, op: Op) -> Result<()> {
    held_by(&shared.leases, &shared.name, owner, id, op)
}
