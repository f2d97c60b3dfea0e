//! Wake-ups for completions: how a backend tells the agent's futures that a request may have
//! finished, so an `async` caller is woken by the backend's progress rather than a timer.
//!
//! Every backend gets a [`Wake`] in its [`BackendContext`](crate::backend::BackendContext)
//! and calls [`Wake::wake`] wherever one of its requests may have changed state (a completion
//! callback, a completion queue entry, a GPU event). The agent's pending futures re-check
//! their request on each wake; a spurious wake costs one check.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Waker;

use parking_lot::Mutex;

/// A backend's handle to wake the agent's pending futures. Cheap to clone.
#[derive(Clone, Default)]
pub struct Wake(Arc<Hub>);

#[derive(Default)]
struct Hub {
    /// Bumped by every [`Wake::wake`], before the wakers are taken: a future that registers
    /// and then sees the generation unchanged cannot have missed a wake.
    generation: AtomicU64,
    wakers: Mutex<Vec<Waker>>,
}

impl fmt::Debug for Wake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wake")
            .field("generation", &self.generation())
            .field("waiting", &self.0.wakers.lock().len())
            .finish()
    }
}

impl Wake {
    /// A new hub with nobody waiting.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes every future waiting on this agent's requests (each re-checks its own). Cheap
    /// when nobody waits; safe from any thread, including a driver's callback thread (it only
    /// hands wakers to their executors).
    pub fn wake(&self) {
        self.0.generation.fetch_add(1, Ordering::SeqCst);
        let wakers = std::mem::take(&mut *self.0.wakers.lock());
        for w in wakers {
            w.wake();
        }
    }

    /// How many wakes there were.
    pub(crate) fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::SeqCst)
    }

    /// Wakes `w` at the next [`Wake::wake`] (once).
    pub(crate) fn register(&self, w: &Waker) {
        let mut g = self.0.wakers.lock();
        if !g.iter().any(|x| x.will_wake(w)) {
            g.push(w.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake as StdWake;

    struct Count(AtomicUsize);
    impl StdWake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_registered_waker_is_woken_once_per_registration() {
        let hub = Wake::new();
        let c = Arc::new(Count(AtomicUsize::new(0)));
        let w = Waker::from(c.clone());
        let g0 = hub.generation();
        hub.register(&w);
        hub.register(&w);
        hub.wake();
        assert_eq!(c.0.load(Ordering::SeqCst), 1);
        assert_eq!(hub.generation(), g0 + 1);
        hub.wake();
        assert_eq!(c.0.load(Ordering::SeqCst), 1, "not registered again");
    }
}
