//! The agent's notification queue.
//!
//! Backends push what they receive; `Agent::get_notifs` drains it. Messages from one peer stay
//! in the order they arrived.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Notifications drained from an agent: sender name to messages, in arrival order.
pub type Notifs = HashMap<String, Vec<Vec<u8>>>;

/// A thread-safe queue of received notifications, shared by an agent and its backends.
#[derive(Debug, Default)]
pub struct NotifQueue {
    inner: Mutex<Inner>,
    ready: Condvar,
}

#[derive(Debug, Default)]
struct Inner {
    pending: Notifs,
    count: usize,
    received: u64,
}

impl NotifQueue {
    /// A new empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means a panicking thread held it; the map is still consistent
        // because every mutation below is a single push or take.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a message from `sender`.
    pub fn push(&self, sender: &str, msg: Vec<u8>) {
        let mut g = self.lock();
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
    }

    /// Takes everything queued.
    pub fn drain(&self) -> Notifs {
        let mut g = self.lock();
        g.count = 0;
        std::mem::take(&mut g.pending)
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

    /// Blocks until something is queued or the deadline passes; returns whether something is.
    pub fn wait_nonempty(&self, deadline: Instant) -> bool {
        let mut g = self.lock();
        loop {
            if g.count > 0 {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = match self.ready.wait_timeout(g, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
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
}
