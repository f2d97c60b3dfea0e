//! The agent's notification queue.
//!
//! Backends push what they receive; `Agent::get_notifs` drains it. Messages from one peer stay
//! in the order they arrived.
//!
//! The queue is bounded in bytes, overall and per sender ([`crate::Limits`]). Policy: a
//! notification that does not fit is **dropped and counted** (senders are not slowed: a
//! one-sided transport cannot push back on its peer); the receiver learns of it from
//! [`crate::Agent::wait_notifs`] (one `LimitExceeded` error per batch of drops) and
//! [`crate::Agent::dropped_notifs`] (the counts per sender).

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::HashMap;
use std::time::Instant;

use crate::limits::NOTIF_OVERHEAD;

/// Most senders whose drops are counted by name (others are counted under `"*"`).
const MAX_DROP_NAMES: usize = 1024;

/// Notifications drained from an agent: sender name to messages, in arrival order.
pub type Notifs = HashMap<String, Vec<Vec<u8>>>;

/// The function behind [`Control`].
pub(crate) type ControlFn = dyn Fn(&str, Vec<u8>) -> bool + Send + Sync;

/// Takes a control message `(sender, bytes)`; false where it was dropped.
pub(crate) struct Control(pub Box<ControlFn>);

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Control")
    }
}

/// A thread-safe queue of received notifications, shared by an agent and its backends.
#[derive(Debug)]
pub struct NotifQueue {
    inner: Mutex<Inner>,
    ready: Condvar,
    /// Wakes notification streams.
    wake: crate::wake::Wake,
    /// The agent's own control messages (a prefix and who takes them): never queued.
    control: parking_lot::RwLock<Option<(&'static [u8], Control)>>,
    max_bytes: usize,
    max_bytes_per_sender: usize,
}

impl Default for NotifQueue {
    fn default() -> Self {
        let l = crate::Limits::default();
        NotifQueue::with_limits(
            l.max_queued_notif_bytes,
            l.max_queued_notif_bytes_per_sender,
        )
    }
}

#[derive(Debug, Default)]
struct Inner {
    pending: Notifs,
    count: usize,
    received: u64,
    bytes: usize,
    sender_bytes: HashMap<String, usize>,
    /// Drops per sender since the agent last reported them.
    dropped_unreported: HashMap<String, u64>,
    /// Drops per sender since the queue was made.
    dropped: HashMap<String, u64>,
}

fn cost(msg: &[u8]) -> usize {
    msg.len().saturating_add(NOTIF_OVERHEAD)
}

fn count_drop(map: &mut HashMap<String, u64>, sender: &str) {
    if let Some(n) = map.get_mut(sender) {
        *n += 1;
    } else if map.len() < MAX_DROP_NAMES {
        map.insert(sender.to_owned(), 1);
    } else {
        *map.entry("*".to_owned()).or_default() += 1;
    }
}

impl NotifQueue {
    /// A new empty queue with the default limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new empty queue holding at most `max_bytes` (and `max_bytes_per_sender` from one
    /// sender), each message counted as its length plus [`NOTIF_OVERHEAD`].
    pub fn with_limits(max_bytes: usize, max_bytes_per_sender: usize) -> Self {
        NotifQueue {
            inner: Mutex::new(Inner::default()),
            ready: Condvar::new(),
            wake: crate::wake::Wake::new(),
            control: parking_lot::RwLock::new(None),
            max_bytes,
            max_bytes_per_sender,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Hands messages starting with `prefix` to `take` instead of queueing them (the agent's
    /// lease messages); `take` must not block.
    pub(crate) fn set_control(&self, prefix: &'static [u8], take: Control) {
        *self.control.write() = Some((prefix, take));
    }

    /// Adds a message from `sender`; returns false when it did not fit (dropped and counted).
    pub fn push(&self, sender: &str, msg: Vec<u8>) -> bool {
        if let Some((prefix, take)) = &*self.control.read() {
            if msg.starts_with(prefix) {
                return (take.0)(sender, msg);
            }
        }
        let c = cost(&msg);
        let mut g = self.lock();
        let mine = g.sender_bytes.get(sender).copied().unwrap_or(0);
        if g.bytes.saturating_add(c) > self.max_bytes
            || mine.saturating_add(c) > self.max_bytes_per_sender
        {
            count_drop(&mut g.dropped_unreported, sender);
            count_drop(&mut g.dropped, sender);
            drop(g);
            tracing::warn!(
                sender,
                bytes = msg.len(),
                "notification queue full: dropped a notification"
            );
            // Wake a waiter so the drop is reported without waiting for the next message.
            self.ready.notify_all();
            self.wake.wake();
            return false;
        }
        g.bytes += c;
        match g.sender_bytes.get_mut(sender) {
            Some(b) => *b += c,
            None => {
                g.sender_bytes.insert(sender.to_owned(), c);
            }
        }
        match g.pending.get_mut(sender) {
            Some(v) => v.push(msg),
            None => {
                g.pending.insert(sender.to_owned(), vec![msg]);
            }
        }
        g.count += 1;
        g.received += 1;
        drop(g);
        self.ready.notify_all();
        self.wake.wake();
        true
    }

    /// What wakes the queue's streams (every push, kept or dropped).
    pub(crate) fn waker_hub(&self) -> &crate::wake::Wake {
        &self.wake
    }

    /// Takes everything queued.
    pub fn drain(&self) -> Notifs {
        let mut g = self.lock();
        g.count = 0;
        g.bytes = 0;
        g.sender_bytes.clear();
        std::mem::take(&mut g.pending)
    }

    /// Drops per sender not yet reported, then forgets them (the next call returns only
    /// newer drops).
    pub fn take_unreported_drops(&self) -> HashMap<String, u64> {
        std::mem::take(&mut self.lock().dropped_unreported)
    }

    /// Drops per sender since the queue was made.
    pub fn dropped(&self) -> HashMap<String, u64> {
        self.lock().dropped.clone()
    }

    /// Bytes queued (messages plus [`NOTIF_OVERHEAD`] each).
    pub fn queued_bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Takes everything queued into `out` (appending per sender, keeping order).
    pub fn drain_into(&self, out: &mut Notifs) {
        for (k, mut v) in self.drain() {
            out.entry(k).or_default().append(&mut v);
        }
    }

    /// How many messages are queued.
    pub fn len(&self) -> usize {
        self.lock().count
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many messages were ever received.
    pub fn received(&self) -> u64 {
        self.lock().received
    }

    /// Blocks until something is queued (or a drop awaits its report) or the deadline
    /// passes; returns whether something is.
    pub fn wait_nonempty(&self, deadline: Instant) -> bool {
        let mut g = self.lock();
        loop {
            if g.count > 0 || !g.dropped_unreported.is_empty() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            self.ready.wait_for(&mut g, deadline - now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn keeps_per_sender_order_and_drains() {
        let q = NotifQueue::new();
        q.push("a", b"1".to_vec());
        q.push("b", b"x".to_vec());
        q.push("a", b"2".to_vec());
        assert_eq!(q.len(), 3);
        let d = q.drain();
        assert_eq!(d["a"], vec![b"1".to_vec(), b"2".to_vec()]);
        assert_eq!(d["b"], vec![b"x".to_vec()]);
        assert!(q.is_empty());
        assert_eq!(q.received(), 3);
        assert!(!q.wait_nonempty(Instant::now() + Duration::from_millis(5)));
    }

    #[test]
    fn bounded_per_sender_and_overall_with_counted_drops() {
        let per = 10 * (100 + NOTIF_OVERHEAD);
        let q = NotifQueue::with_limits(2 * per + 1, per);
        for _ in 0..15 {
            q.push("flood", vec![0; 100]);
        }
        // The flooder filled its share; another sender still gets in.
        assert!(q.push("quiet", vec![1; 100]));
        assert_eq!(q.len(), 11);
        assert_eq!(q.dropped()["flood"], 5);
        assert!(q.wait_nonempty(Instant::now()));
        assert_eq!(q.take_unreported_drops()["flood"], 5);
        assert!(q.take_unreported_drops().is_empty());
        // Overall bound: a message larger than everything is dropped.
        assert!(!q.push("quiet", vec![0; 3 * per]));
        // Draining frees the room.
        let d = q.drain();
        assert_eq!(d["flood"].len(), 10);
        assert_eq!(q.queued_bytes(), 0);
        assert!(q.push("flood", vec![0; 100]));
    }
}
