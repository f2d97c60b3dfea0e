//! Leases on published blocks: a target (prefill) publishes blocks to named readers for a
//! duration, readers acquire, renew and release, and the target learns per lease when every
//! reader has released or expired, so it can reuse the blocks.
//!
//! Everything travels as control messages over the connections notifications already use (no
//! extra socket); an agent consumes them itself (they never reach `get_notifs`). Clocks are
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
    check_held as held_by, message, parse, state_of, target_extend, Held, LeaseId, LeaseState,
    Published, Reader, Reply, ACQUIRE, DENY, GRANT, MAX_HELD, MAX_LEASES, MAX_READERS, RELEASE,
    RENEW, RENEWED,
};
use crate::notif::Control;

/// What the agent's notification queue hands lease messages to: queued for the lease thread,
/// started with the first.
pub(crate) fn control(weak: Weak<Shared>) -> Control {
    Control(Box::new(move |sender, msg| {
        let Some(s) = weak.upgrade() else {
            return false;
        };
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
            if q.is_empty() {
                l.queued.wait_for(&mut q, Duration::from_millis(200));
            }
            q.pop_front()
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
    let Some((kind, id, ttl)) = parse(msg) else {
        tracing::warn!(agent = %agent.name(), sender, "malformed lease message dropped");
        return;
    };
    let l = &agent.shared.leases;
    let reply = match kind {
        ACQUIRE | RENEW => {
            let granted = target_extend(l, sender, id, kind == RENEW);
            Some(match granted {
                Some(ttl) => message(if kind == RENEW { RENEWED } else { GRANT }, id, ttl),
                None => message(DENY, id, Duration::ZERO),
            })
        }
        RELEASE => {
            if let Some(p) = l.published.lock().get_mut(&id) {
                if let Some(r) = p.readers.get_mut(sender) {
                    *r = Reader::Released;
                }
            }
            None
        }
        GRANT | RENEWED | DENY => {
            let key = (sender.to_owned(), id);
            let mut a = l.answers.lock();
            // Only answers this agent asked for; anything else is a peer's noise.
            if let Some(slot) = a.get_mut(&key) {
                *slot = if kind == DENY {
                    Reply::Denied
                } else {
                    Reply::Granted(ttl)
                };
                l.answered.notify_all();
            }
            None
        }
        _ => {
            tracing::warn!(agent = %agent.name(), sender, kind, "unknown lease message dropped");
            None
        }
    };
    if let Some(r) = reply {
        if let Err(e) = agent.gen_notif(sender, &r, &[]) {
            tracing::warn!(agent = %agent.name(), sender, error = %e, "lease answer not sent");
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
        self.ask(owner, id, ACQUIRE, timeout)
    }

    /// Renews a held lease for its duration from now (this agent's clock, counted from the
    /// request). `LeaseExpired` where it already ran out or was released.
    pub fn renew_lease(&self, owner: &str, id: LeaseId, timeout: Duration) -> Result<()> {
        self.check_lease(owner, id, Op::Lease)?;
        self.ask(owner, id, RENEW, timeout)
    }

    /// Releases a held lease: the owner learns this agent is done with the blocks; requests
    /// made with it are refused from now on.
    pub fn release_lease(&self, owner: &str, id: LeaseId) -> Result<()> {
        // Forgotten: requests with it are refused from now on (an unknown lease is expired).
        self.shared
            .leases
            .held
            .lock()
            .remove(&(owner.to_owned(), id.0));
        self.gen_notif(owner, &message(RELEASE, id.0, Duration::ZERO), &[])
    }

    /// `Ok` while this agent holds `owner`'s lease `id` (granted, not run out on this
    /// agent's clock, not released); else `LeaseExpired`.
    pub(crate) fn check_lease(&self, owner: &str, id: LeaseId, op: Op) -> Result<()> {
        check_held(&self.shared, owner, id, op)
    }

    fn ask(&self, owner: &str, id: LeaseId, kind: u8, timeout: Duration) -> Result<()> {
        let l = &self.shared.leases;
        let key = (owner.to_owned(), id.0);
        l.answers.lock().insert(key.clone(), Reply::Waiting);
        let sent = Instant::now();
        let end = sent + timeout;
        if let Err(e) = self.gen_notif(owner, &message(kind, id.0, Duration::ZERO), &[]) {
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
