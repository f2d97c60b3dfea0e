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

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::agent::shared::Shared;
use crate::agent::Agent;
use crate::error::{Error, Op, Result};

/// The first bytes of every lease control message.
pub(crate) const PREFIX: &[u8] = b"\0nixl-rs/lease\0";
/// Control messages queued for the lease thread at most (a flood beyond is dropped).
const MAX_QUEUED: usize = 1 << 16;
/// Leases one agent publishes at most (live and done but not yet forgotten).
const MAX_LEASES: usize = 1 << 20;
/// Readers per lease at most.
pub(crate) const MAX_READERS: usize = 1024;

const ACQUIRE: u8 = 1;
const GRANT: u8 = 2;
const DENY: u8 = 3;
const RENEW: u8 = 4;
const RENEWED: u8 = 5;
const RELEASE: u8 = 6;

/// A lease's id: the target makes it when it publishes and hands it to its readers with the
/// request's other details (the block ids, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Where a published lease stands on its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Some reader may still read: it holds a grant that has not run out, or it has not
    /// acquired yet and the lease's first duration has not passed.
    Active {
        /// Readers holding a live grant.
        holding: usize,
        /// Readers that have not acquired yet.
        pending: usize,
    },
    /// No reader can read any more: the blocks may be reused.
    Done {
        /// Readers that released.
        released: usize,
        /// Readers whose grant (or whose chance to acquire) ran out.
        expired: usize,
    },
}

#[derive(Debug, Clone, Copy)]
enum Reader {
    Pending,
    Held { until: Instant },
    Released,
}

struct Published {
    ttl: Duration,
    published: Instant,
    readers: HashMap<String, Reader>,
}

/// A reader's view of a lease it holds (its own clock).
#[derive(Debug, Clone, Copy)]
struct Held {
    until: Instant,
    released: bool,
}

/// An answer a reader waits for.
#[derive(Debug, Clone, Copy)]
enum Reply {
    Waiting,
    /// Granted or renewed for this long.
    Granted(Duration),
    Denied,
}

/// Both roles' tables, the control queue and its thread.
#[derive(Default)]
pub(crate) struct Leases {
    published: Mutex<HashMap<u64, Published>>,
    held: Mutex<HashMap<(String, u64), Held>>,
    answers: Mutex<HashMap<(String, u64), Reply>>,
    answered: Condvar,
    queue: Mutex<VecDeque<(String, Vec<u8>)>>,
    queued: Condvar,
    running: AtomicBool,
}

impl fmt::Debug for Leases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leases")
            .field("published", &self.published.lock().len())
            .field("held", &self.held.lock().len())
            .finish()
    }
}

fn message(kind: u8, id: u64, ttl: Duration) -> Vec<u8> {
    let mut m = PREFIX.to_vec();
    m.push(kind);
    m.extend_from_slice(&id.to_le_bytes());
    m.extend_from_slice(
        &u64::try_from(ttl.as_micros())
            .unwrap_or(u64::MAX)
            .to_le_bytes(),
    );
    m
}

/// `(kind, id, ttl)` of a control message, or `None` for malformed bytes.
fn parse(m: &[u8]) -> Option<(u8, u64, Duration)> {
    let rest = m.strip_prefix(PREFIX)?;
    if rest.len() != 17 {
        return None;
    }
    let id = u64::from_le_bytes(rest[1..9].try_into().ok()?);
    let us = u64::from_le_bytes(rest[9..17].try_into().ok()?);
    Some((rest[0], id, Duration::from_micros(us)))
}

impl Leases {
    /// Takes a control message from `sender` (from a backend's receive path: never blocks).
    /// Returns false where it was dropped (queue full).
    pub(crate) fn take(&self, shared: &Weak<Shared>, sender: &str, msg: Vec<u8>) -> bool {
        let mut q = self.queue.lock();
        if q.len() >= MAX_QUEUED {
            tracing::warn!(sender, "lease control queue full: a message is dropped");
            return false;
        }
        q.push_back((sender.to_owned(), msg));
        drop(q);
        self.queued.notify_one();
        if !self.running.swap(true, Ordering::SeqCst) {
            let weak = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("nixl-leases".to_owned())
                .spawn(move || run(&weak));
            if let Err(e) = spawned {
                self.running.store(false, Ordering::SeqCst);
                tracing::error!(error = %e, "could not start the lease thread");
            }
        }
        true
    }
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

/// The target's side of an acquire (`renew` false) or renew: the reader's grant runs from now
/// for the lease's duration, where it may still read; the duration granted, or `None`.
fn target_extend(l: &Leases, reader: &str, id: u64, renew: bool) -> Option<Duration> {
    let mut p = l.published.lock();
    let lease = p.get_mut(&id)?;
    let now = Instant::now();
    let (ttl, published) = (lease.ttl, lease.published);
    let r = lease.readers.get_mut(reader)?;
    let live = match *r {
        Reader::Pending => !renew && now < published + ttl,
        Reader::Held { until } => now < until,
        Reader::Released => false,
    };
    if !live {
        return None;
    }
    *r = Reader::Held { until: now + ttl };
    Some(ttl)
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
        if let Some(h) = self
            .shared
            .leases
            .held
            .lock()
            .get_mut(&(owner.to_owned(), id.0))
        {
            h.released = true;
        }
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
                l.held.lock().insert(
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
    let held = shared
        .leases
        .held
        .lock()
        .get(&(owner.to_owned(), id.0))
        .copied();
    match held {
        Some(h) if !h.released && Instant::now() < h.until => Ok(()),
        _ => Err(Error::LeaseExpired {
            agent: shared.name.clone(),
            remote: owner.to_owned(),
            op,
            lease: id.0,
        }),
    }
}

fn state_of(l: &Published, now: Instant) -> LeaseState {
    let (mut holding, mut pending, mut released, mut expired) = (0, 0, 0, 0);
    for r in l.readers.values() {
        match *r {
            Reader::Released => released += 1,
            Reader::Held { until } if now < until => holding += 1,
            Reader::Pending if now < l.published + l.ttl => pending += 1,
            _ => expired += 1,
        }
    }
    if holding + pending > 0 {
        LeaseState::Active { holding, pending }
    } else {
        LeaseState::Done { released, expired }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let m = message(GRANT, 0xfeed, Duration::from_millis(1500));
        assert_eq!(
            parse(&m),
            Some((GRANT, 0xfeed, Duration::from_millis(1500)))
        );
        for cut in 0..m.len() {
            assert_eq!(parse(&m[..cut]), None);
        }
        let mut long = m.clone();
        long.push(0);
        assert_eq!(parse(&long), None);
        assert_eq!(parse(b"hello"), None);
    }
}
