//! Leases on published blocks: the tables both roles keep, their control messages and the
//! rules (see `agent::lease` for the agent's API and the thread that answers peers).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Op, Result};

/// The first bytes of every lease control message: reserved. The receiving agent takes a
/// notification that starts with them as its own control message (it never reaches
/// `get_notifs`), so an application's notification may not start with them (`InvalidParam`
/// at `gen_notif`, at make with `XferOptions::notif`, at `XferReq::set_notif`).
pub const RESERVED_NOTIF_PREFIX: &[u8] = b"\0nixl-rs/lease\0";
pub(crate) const PREFIX: &[u8] = RESERVED_NOTIF_PREFIX;

/// `InvalidParam` for an application's notification that starts with
/// [`RESERVED_NOTIF_PREFIX`] (it would be taken for a lease control message and never
/// delivered).
pub(crate) fn check_user_notif(me: &str, op: Op, msg: &[u8]) -> Result<()> {
    if msg.starts_with(PREFIX) {
        return Err(Error::invalid(
            me,
            op,
            "a notification may not start with nixl-rs's reserved prefix \\0nixl-rs/lease\\0 \
             (RESERVED_NOTIF_PREFIX: the peer would take it for a lease control message)",
        ));
    }
    Ok(())
}
/// Control messages queued for the lease thread at most (a flood beyond is dropped).
pub(crate) const MAX_QUEUED: usize = 1 << 16;
/// Control messages of one sender queued at most: a flood from one peer leaves the queue to
/// the others.
pub(crate) const MAX_QUEUED_PER_SENDER: usize = 1 << 10;
/// Bytes of the secret a reader makes when it acquires a lease: its RENEW and RELEASE carry
/// it, and the owner's answers echo it, so a peer that knows the lease's id (a co-reader)
/// but not the secret can neither release or renew another reader's hold nor forge an answer.
pub(crate) const SECRET_LEN: usize = 16;
/// A reader's secret for one lease.
pub(crate) type Secret = [u8; SECRET_LEN];
/// Leases one agent publishes at most (live, and done but not yet forgotten: the done ones
/// are forgotten first when it is reached).
pub(crate) const MAX_LEASES: usize = 1 << 16;
/// Leases a reader tracks before it forgets the ones that ran out.
pub(crate) const MAX_HELD: usize = 1 << 12;
/// Readers per lease at most.
pub(crate) const MAX_READERS: usize = 1024;
/// Blocks (memory ranges) one lease names at most: its GRANT carries them (24 bytes each).
pub const MAX_LEASE_BLOCKS: usize = 4096;

/// The owner's memory ranges a lease covers (empty: the lease names none), sorted by device
/// and address, adjacent ranges merged.
pub(crate) type Blocks = std::sync::Arc<[crate::desc::Desc]>;

/// `blocks` sorted by (device, address) with touching or overlapping ranges merged.
pub(crate) fn merged(blocks: &[crate::desc::Desc]) -> Blocks {
    let mut v: Vec<crate::desc::Desc> = blocks.to_vec();
    v.sort_by_key(|d| (d.dev_id, d.addr));
    let mut out: Vec<crate::desc::Desc> = Vec::with_capacity(v.len());
    for d in v {
        match out.last_mut() {
            Some(p) if p.dev_id == d.dev_id && d.addr <= p.addr.saturating_add(p.len) => {
                let end = p
                    .addr
                    .saturating_add(p.len)
                    .max(d.addr.saturating_add(d.len));
                p.len = end - p.addr;
            }
            _ => out.push(d),
        }
    }
    out.into()
}

/// Whether `[addr, addr + len)` on `dev` lies inside one of `blocks` (as [`merged`] leaves them).
pub(crate) fn covers(blocks: &[crate::desc::Desc], dev: u64, addr: u64, len: u64) -> bool {
    let i = blocks.partition_point(|b| (b.dev_id, b.addr) <= (dev, addr));
    i > 0 && {
        let b = &blocks[i - 1];
        b.dev_id == dev
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= b.addr.saturating_add(b.len))
    }
}

pub(crate) const ACQUIRE: u8 = 1;
pub(crate) const GRANT: u8 = 2;
pub(crate) const DENY: u8 = 3;
pub(crate) const RENEW: u8 = 4;
pub(crate) const RENEWED: u8 = 5;
pub(crate) const RELEASE: u8 = 6;

/// A lease's id: the target makes it when it publishes and hands it to its readers with the
/// request's other details (the block ids, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A lease id parsed back from text: its [`Display`](fmt::Display) form (`0x` and hex
/// digits) or decimal digits, as applications pass ids between processes.
impl std::str::FromStr for LeaseId {
    type Err = crate::error::DecodeError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let bad = crate::error::DecodeError::Invalid { what: "lease id" };
        let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            Some(hex) if !hex.is_empty() && hex.len() <= 16 => u64::from_str_radix(hex, 16),
            Some(_) => return Err(bad),
            None => s.parse::<u64>(),
        };
        match v {
            Ok(v) if v != 0 => Ok(LeaseId(v)),
            _ => Err(bad),
        }
    }
}

/// Where a published lease stands on its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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

/// Where a lease's times come from (`AgentConfig::clock`): grants, renewals, expiries and a
/// reader's hold are counted on it; the waits for a peer's answer stay on real time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Now, on this clock.
    fn now(&self) -> Instant;
    /// Wakes `w` when the clock moves other than with real time (a [`ManualClock`]'s
    /// `advance`), so a lease's end that waits on it is seen; the system clock never does.
    fn wake_on_advance(&self, _w: &std::task::Waker) {}
    /// Whether the clock moves with real time (then a lease's end can be waited for on the
    /// agent's timer).
    fn is_real(&self) -> bool {
        true
    }
}

/// Real time ([`Instant::now`]): the default clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told ([`ManualClock::advance`]), for tests of lease times
/// that must not sleep through real durations: give it to every agent of the test
/// (`AgentConfig::clock`).
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    offset: Mutex<Duration>,
    wakers: Mutex<Vec<std::task::Waker>>,
}

impl ManualClock {
    /// A clock standing at the real now.
    pub fn new() -> std::sync::Arc<ManualClock> {
        std::sync::Arc::new(ManualClock {
            start: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
            wakers: Mutex::new(Vec::new()),
        })
    }

    /// Moves the clock forward by `d` and wakes what waits on it.
    pub fn advance(&self, d: Duration) {
        *self.offset.lock() += d;
        for w in std::mem::take(&mut *self.wakers.lock()) {
            w.wake();
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + *self.offset.lock()
    }

    fn wake_on_advance(&self, w: &std::task::Waker) {
        let mut g = self.wakers.lock();
        if !g.iter().any(|x| x.will_wake(w)) {
            if g.len() >= MAX_WAKERS {
                for x in g.drain(..) {
                    x.wake();
                }
            }
            g.push(w.clone());
        }
    }

    fn is_real(&self) -> bool {
        false
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Reader {
    Pending,
    /// Acquired by the process that made `secret`.
    Held {
        until: Instant,
        secret: Secret,
    },
    Released,
}

pub(crate) struct Published {
    pub(crate) ttl: Duration,
    pub(crate) published: Instant,
    pub(crate) readers: HashMap<String, Reader>,
    /// The memory it covers (its GRANT carries it to each reader).
    pub(crate) blocks: Blocks,
}

/// A reader's view of a lease it holds (its own clock).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    pub(crate) until: Instant,
    pub(crate) released: bool,
    /// The secret it acquired with.
    pub(crate) secret: Secret,
}

/// An answer a reader waits for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reply {
    /// Asked with this secret: only an answer echoing it counts.
    Waiting(Secret),
    /// Granted or renewed for this long.
    Granted(Duration),
    Denied,
}

/// Both roles' tables, the control queue and its thread.
pub(crate) struct Leases {
    /// Where lease times come from.
    pub(crate) clock: std::sync::Arc<dyn Clock>,
    pub(crate) published: Mutex<HashMap<u64, Published>>,
    pub(crate) held: Mutex<HashMap<(String, u64), Held>>,
    /// The blocks each held lease covers, from its GRANT (absent or empty: it names none).
    pub(crate) held_blocks: Mutex<HashMap<(String, u64), Blocks>>,
    pub(crate) answers: Mutex<HashMap<(String, u64), Reply>>,
    pub(crate) answered: Condvar,
    pub(crate) queue: Mutex<Queue>,
    pub(crate) queued: Condvar,
    pub(crate) running: AtomicBool,
    /// Futures waiting for an answer or a lease's end: woken on every answer and release.
    pub(crate) wakers: Mutex<Vec<std::task::Waker>>,
}

/// Wakers a lease table keeps at most (past it, every one is woken and the list starts over:
/// a woken future that is not done registers again).
const MAX_WAKERS: usize = 1 << 12;

impl Leases {
    /// Empty tables on `clock`.
    pub(crate) fn new(clock: std::sync::Arc<dyn Clock>) -> Leases {
        Leases {
            clock,
            published: Mutex::default(),
            held: Mutex::default(),
            held_blocks: Mutex::default(),
            answers: Mutex::default(),
            answered: Condvar::new(),
            queue: Mutex::default(),
            queued: Condvar::new(),
            running: AtomicBool::new(false),
            wakers: Mutex::default(),
        }
    }

    /// Now, on the lease clock.
    pub(crate) fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Registers a future to wake at the next answer or release.
    pub(crate) fn register(&self, w: &std::task::Waker) {
        let mut g = self.wakers.lock();
        if g.iter().any(|x| x.will_wake(w)) {
            return;
        }
        if g.len() >= MAX_WAKERS {
            for x in g.drain(..) {
                x.wake();
            }
        }
        g.push(w.clone());
    }

    /// Wakes every registered future.
    pub(crate) fn wake_all(&self) {
        let ws = std::mem::take(&mut *self.wakers.lock());
        for w in ws {
            w.wake();
        }
    }
}

impl fmt::Debug for Leases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leases")
            .field("published", &self.published.lock().len())
            .field("held", &self.held.lock().len())
            .finish()
    }
}

/// The control messages waiting for the lease thread, and how many each sender has queued.
#[derive(Default)]
pub(crate) struct Queue {
    pub(crate) items: VecDeque<(String, Vec<u8>)>,
    pub(crate) per_sender: HashMap<String, usize>,
}

impl Queue {
    pub(crate) fn pop(&mut self) -> Option<(String, Vec<u8>)> {
        let (sender, msg) = self.items.pop_front()?;
        if let Some(n) = self.per_sender.get_mut(&sender) {
            *n -= 1;
            if *n == 0 {
                self.per_sender.remove(&sender);
            }
        }
        Some((sender, msg))
    }
}

/// A control message: kind, lease id, duration, and the reader's secret.
pub(crate) fn message(kind: u8, id: u64, ttl: Duration, secret: &Secret) -> Vec<u8> {
    let mut m = PREFIX.to_vec();
    m.push(kind);
    m.extend_from_slice(&id.to_le_bytes());
    m.extend_from_slice(
        &u64::try_from(ttl.as_micros())
            .unwrap_or(u64::MAX)
            .to_le_bytes(),
    );
    m.extend_from_slice(secret);
    m
}

/// A GRANT: [`message`] followed by the blocks the lease covers (`u32` count, then address,
/// length and device of each, little endian); without blocks it is [`message`] alone.
pub(crate) fn grant(
    id: u64,
    ttl: Duration,
    secret: &Secret,
    blocks: &[crate::desc::Desc],
) -> Vec<u8> {
    let mut m = message(GRANT, id, ttl, secret);
    if !blocks.is_empty() {
        m.reserve(4 + blocks.len() * 24);
        m.extend_from_slice(
            &u32::try_from(blocks.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        for b in blocks {
            m.extend_from_slice(&b.addr.to_le_bytes());
            m.extend_from_slice(&b.len.to_le_bytes());
            m.extend_from_slice(&b.dev_id.to_le_bytes());
        }
    }
    m
}

/// A control message, parsed.
pub(crate) struct Parsed {
    pub(crate) kind: u8,
    pub(crate) id: u64,
    pub(crate) ttl: Duration,
    pub(crate) secret: Secret,
    /// A GRANT's blocks (empty otherwise).
    pub(crate) blocks: Vec<crate::desc::Desc>,
}

/// A control message's fields, or `None` for malformed bytes (a GRANT may carry at most
/// [`MAX_LEASE_BLOCKS`] blocks, each non-empty and not wrapping; nothing else carries more).
pub(crate) fn parse(m: &[u8]) -> Option<Parsed> {
    let rest = m.strip_prefix(PREFIX)?;
    const HEAD: usize = 17 + SECRET_LEN;
    if rest.len() < HEAD {
        return None;
    }
    let id = u64::from_le_bytes(rest[1..9].try_into().ok()?);
    let us = u64::from_le_bytes(rest[9..17].try_into().ok()?);
    let secret = rest[17..HEAD].try_into().ok()?;
    let tail = &rest[HEAD..];
    let mut blocks = Vec::new();
    if !tail.is_empty() {
        if rest[0] != GRANT || tail.len() < 4 {
            return None;
        }
        let n = u32::from_le_bytes(tail[..4].try_into().ok()?) as usize;
        if n == 0 || n > MAX_LEASE_BLOCKS || tail.len() != 4 + n * 24 {
            return None;
        }
        for c in tail[4..].chunks_exact(24) {
            let word = |i: usize| c[i * 8..i * 8 + 8].try_into().ok().map(u64::from_le_bytes);
            let d = crate::desc::Desc {
                addr: word(0)?,
                len: word(1)?,
                dev_id: word(2)?,
            };
            if d.len == 0 || d.addr.checked_add(d.len).is_none() {
                return None;
            }
            blocks.push(d);
        }
    }
    Some(Parsed {
        kind: rest[0],
        id,
        ttl: Duration::from_micros(us),
        secret,
        blocks,
    })
}

impl Leases {
    /// Queues a control message from `sender` (from a backend's receive path: never blocks).
    /// Returns whether it was kept (false: the queue is full) and whether the caller must
    /// start the thread that handles the queue (the first message).
    pub(crate) fn take(&self, sender: &str, msg: Vec<u8>) -> (bool, bool) {
        let mut q = self.queue.lock();
        let mine = q.per_sender.get(sender).copied().unwrap_or(0);
        if q.items.len() >= MAX_QUEUED || mine >= MAX_QUEUED_PER_SENDER {
            tracing::warn!(sender, "lease control queue full: a message is dropped");
            return (false, false);
        }
        q.items.push_back((sender.to_owned(), msg));
        *q.per_sender.entry(sender.to_owned()).or_default() += 1;
        drop(q);
        self.queued.notify_one();
        (true, !self.running.swap(true, Ordering::SeqCst))
    }
}

/// What the owner answers a reader's ACQUIRE or RENEW.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Nothing: the lease is unknown, not published to this reader, or held under another
    /// secret (a forgery, or another process claiming the reader's name). An answer would
    /// only feed a flood.
    None,
    /// The reader may not read (any more).
    Deny,
    /// Granted or renewed for this long.
    Grant(Duration),
}

/// The target's side of an acquire (`renew` false) or renew with the reader's `secret`: the
/// reader's grant runs from now for the lease's duration, where it may still read.
pub(crate) fn target_extend(
    l: &Leases,
    reader: &str,
    id: u64,
    renew: bool,
    secret: &Secret,
) -> Answer {
    let now = l.now();
    let mut p = l.published.lock();
    let Some(lease) = p.get_mut(&id) else {
        return Answer::None;
    };
    let (ttl, published) = (lease.ttl, lease.published);
    let Some(r) = lease.readers.get_mut(reader) else {
        return Answer::None;
    };
    let live = match *r {
        Reader::Pending => !renew && now < published + ttl,
        Reader::Held { until, secret: s } if s == *secret => now < until,
        Reader::Held { .. } => return Answer::None,
        Reader::Released => false,
    };
    if !live {
        return Answer::Deny;
    }
    *r = Reader::Held {
        until: now + ttl,
        secret: *secret,
    };
    Answer::Grant(ttl)
}

/// The target's side of a RELEASE: only the secret the reader acquired with releases its
/// hold; anything else changes nothing.
pub(crate) fn target_release(l: &Leases, reader: &str, id: u64, secret: &Secret) -> bool {
    let mut p = l.published.lock();
    let Some(r) = p
        .get_mut(&id)
        .and_then(|lease| lease.readers.get_mut(reader))
    else {
        return false;
    };
    match *r {
        Reader::Held { secret: s, .. } if s == *secret => {
            *r = Reader::Released;
            true
        }
        _ => false,
    }
}

/// `Ok` while `leases` (of agent `me`) hold `owner`'s lease `id`: granted, not run out on
/// this agent's clock, not released; else `LeaseExpired`.
pub(crate) fn check_held(
    leases: &Leases,
    me: &str,
    owner: &str,
    id: LeaseId,
    op: Op,
) -> Result<()> {
    let held = leases.held.lock().get(&(owner.to_owned(), id.0)).copied();
    match held {
        Some(h) if !h.released && leases.now() < h.until => Ok(()),
        _ => Err(Error::LeaseExpired {
            agent: me.to_owned(),
            remote: owner.to_owned(),
            op,
            lease: id.0,
        }),
    }
}

/// When a lease's state next changes by the clock alone (a grant or the chance to acquire runs
/// out), if it is active.
pub(crate) fn next_expiry(l: &Published, now: Instant) -> Option<Instant> {
    l.readers
        .values()
        .filter_map(|r| match *r {
            Reader::Held { until, .. } if now < until => Some(until),
            Reader::Pending if now < l.published + l.ttl => Some(l.published + l.ttl),
            _ => None,
        })
        .min()
}

pub(crate) fn state_of(l: &Published, now: Instant) -> LeaseState {
    let (mut holding, mut pending, mut released, mut expired) = (0, 0, 0, 0);
    for r in l.readers.values() {
        match *r {
            Reader::Released => released += 1,
            Reader::Held { until, .. } if now < until => holding += 1,
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

    fn fields(p: Option<Parsed>) -> Option<(u8, u64, Duration, Secret, Vec<crate::desc::Desc>)> {
        p.map(|p| (p.kind, p.id, p.ttl, p.secret, p.blocks))
    }

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let m = message(GRANT, 0xfeed, Duration::from_millis(1500), &[7; SECRET_LEN]);
        assert_eq!(
            fields(parse(&m)),
            Some((
                GRANT,
                0xfeed,
                Duration::from_millis(1500),
                [7; SECRET_LEN],
                vec![]
            ))
        );
        for cut in 0..m.len() {
            assert!(parse(&m[..cut]).is_none());
        }
        let mut long = m.clone();
        long.push(0);
        assert!(parse(&long).is_none());
        assert!(parse(b"hello").is_none());
    }

    #[test]
    fn a_grant_carries_its_blocks_and_bad_block_lists_are_refused() {
        use crate::desc::Desc;
        let blocks = [Desc::on_device(0x1000, 64, 1), Desc::new(0x2000, 4096)];
        let m = grant(9, Duration::from_secs(2), &[3; SECRET_LEN], &blocks);
        let p = parse(&m).expect("a grant with blocks parses");
        assert_eq!((p.kind, p.id, p.blocks.as_slice()), (GRANT, 9, &blocks[..]));
        // Every cut of the block list, a wrong count, trailing bytes: refused.
        let head = message(GRANT, 9, Duration::from_secs(2), &[3; SECRET_LEN]).len();
        for cut in head + 1..m.len() {
            assert!(parse(&m[..cut]).is_none(), "cut at {cut}");
        }
        let mut count = m.clone();
        count[head] = 3;
        assert!(parse(&count).is_none());
        let mut long = m.clone();
        long.push(0);
        assert!(parse(&long).is_none());
        // Only a GRANT carries blocks; an empty or wrapping block is refused.
        let mut renewed = m.clone();
        renewed[PREFIX.len()] = RENEWED;
        assert!(parse(&renewed).is_none());
        for bad in [Desc::new(0x1000, 0), Desc::new(u64::MAX - 1, 4)] {
            assert!(parse(&grant(9, Duration::from_secs(2), &[3; SECRET_LEN], &[bad])).is_none());
        }
        let too_many = vec![Desc::new(0x1000, 1); MAX_LEASE_BLOCKS + 1];
        assert!(parse(&grant(
            9,
            Duration::from_secs(2),
            &[3; SECRET_LEN],
            &too_many
        ))
        .is_none());
    }

    proptest::proptest! {
        /// Any bytes after the prefix: refused, or fields within the bounds (never a panic).
        #[test]
        fn hostile_control_messages_parse_within_bounds(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        ) {
            if let Some(p) = parse(&[PREFIX, &bytes[..]].concat()) {
                proptest::prop_assert!(p.blocks.len() <= MAX_LEASE_BLOCKS);
                proptest::prop_assert!(p.blocks.is_empty() || p.kind == GRANT);
                for b in &p.blocks {
                    proptest::prop_assert!(b.len > 0 && b.addr.checked_add(b.len).is_some());
                }
            }
        }
    }

    #[test]
    fn merged_blocks_cover_exactly_their_ranges() {
        use crate::desc::Desc;
        let b = merged(&[
            Desc::new(0x3000, 0x1000),
            Desc::new(0x1000, 0x1000),
            Desc::new(0x2000, 0x800),
            Desc::on_device(0x1000, 0x100, 1),
        ]);
        assert_eq!(
            &b[..],
            [
                Desc::new(0x1000, 0x1800),
                Desc::new(0x3000, 0x1000),
                Desc::on_device(0x1000, 0x100, 1)
            ]
        );
        assert!(covers(&b, 0, 0x1000, 0x1800));
        assert!(covers(&b, 0, 0x3800, 0x800));
        assert!(!covers(&b, 0, 0x2000, 0x1000), "across the gap");
        assert!(!covers(&b, 0, 0x0fff, 2));
        assert!(!covers(&b, 1, 0x1000, 0x101));
        assert!(covers(&b, 1, 0x1000, 0x100));
        assert!(!covers(&b, 2, 0x1000, 1));
        assert!(!covers(&b, 0, u64::MAX, 2));
    }
}

#[cfg(test)]
mod id_tests {
    use super::LeaseId;

    #[test]
    fn a_lease_id_reads_back_from_its_text() {
        for v in [1u64, 0xdead_beef, u64::MAX] {
            let id = LeaseId(v);
            assert_eq!(id.to_string().parse::<LeaseId>(), Ok(id));
            assert_eq!(v.to_string().parse::<LeaseId>(), Ok(id));
        }
        for bad in [
            "",
            "0x",
            "0",
            "0x0",
            "-1",
            "0x1g",
            "0x10000000000000000",
            "lease",
        ] {
            assert!(bad.parse::<LeaseId>().is_err(), "{bad:?}");
        }
    }
}
