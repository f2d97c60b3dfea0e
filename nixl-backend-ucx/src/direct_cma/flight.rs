//! One post's pieces in flight: taken one at a time by the copy threads and the
//! application's own `check`, and chained per endpoint so notifications keep post order.

use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::sys::cma::IoVec;

use super::Target;

/// Pieces the application's `check` copies at most per call (about 1 MiB, 100 us at
/// 10 GB/s): it helps the copy threads without turning a poll into the whole copy.
pub(crate) const CHECK_PIECES: usize = 4;

/// One piece of a large direct copy (about [`MIN_PIECE`] bytes: one system call).
struct Piece {
    local: Vec<IoVec>,
    remote: Vec<IoVec>,
}

/// What runs once every piece of a post has finished (sends the notification, or fails the
/// post): given the flight, which tells whether a piece failed or the post was stopped.
pub(crate) type Finish = Box<dyn Fn(&Flight) + Send + Sync>;

/// One post's pieces, taken one at a time, in order, by every thread that works on the flight:
/// the copy threads and the application's own `check`. No thread owns more than the piece it
/// is copying, so a thread that starts late (woken from sleep, or preempted) delays the
/// request by one piece at most, and a caller that polls copies what nobody took yet.
///
/// Flights on one endpoint are chained: a flight's finisher (its notification) runs only
/// after the previous flight's has, whoever completes last, without anyone waiting: a post
/// whose notification must follow an earlier flight's data returns at once and its
/// notification goes out when that flight finishes.
pub(crate) struct Flight {
    target: Target,
    write: bool,
    pieces: Vec<Piece>,
    /// The next piece to take.
    next: AtomicUsize,
    /// Pieces finished.
    done: AtomicUsize,
    /// The first failure.
    error: Mutex<Option<io::Error>>,
    /// Set by cancel or abandon: pieces not started yet are not copied.
    stop: AtomicBool,
    finish: Finish,
    /// Events still to come before the finisher runs: the last piece, and the previous
    /// flight's finish when there is one.
    pending: AtomicUsize,
    /// Set once the finisher has run (under `then`'s lock).
    finished: AtomicBool,
    /// Flights chained after this one: each waits for this one's finish.
    then: Mutex<Vec<Arc<Flight>>>,
}

impl Flight {
    /// A flight copying `pieces` to or from `target`; `finish` runs after the last.
    #[cfg(test)]
    pub(crate) fn new(
        target: Target,
        write: bool,
        pieces: Vec<(Vec<IoVec>, Vec<IoVec>)>,
        finish: Finish,
    ) -> Arc<Self> {
        Self::after(None, target, write, pieces, finish)
    }

    /// [`Flight::new`], finishing only after `prev` (the previous flight on the endpoint) has.
    /// A flight without pieces (the notification of a post copied inline) finishes as soon
    /// as `prev` has, possibly inside this call.
    pub(crate) fn after(
        prev: Option<Arc<Flight>>,
        target: Target,
        write: bool,
        pieces: Vec<(Vec<IoVec>, Vec<IoVec>)>,
        finish: Finish,
    ) -> Arc<Self> {
        let empty = pieces.is_empty();
        let f = Arc::new(Flight {
            pending: AtomicUsize::new(1 + usize::from(prev.is_some())),
            finished: AtomicBool::new(false),
            then: Mutex::new(Vec::new()),
            target,
            write,
            pieces: pieces
                .into_iter()
                .map(|(local, remote)| Piece { local, remote })
                .collect(),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            error: Mutex::new(None),
            stop: AtomicBool::new(false),
            finish,
        });
        if let Some(p) = prev {
            p.chain(f.clone());
        }
        if empty {
            Flight::event(&f);
        }
        f
    }

    /// Runs `next`'s wait for this flight: at once if it has finished, else when it does.
    fn chain(&self, next: Arc<Flight>) {
        let mut g = self.then.lock();
        if self.finished.load(Ordering::Acquire) {
            drop(g);
            Flight::event(&next);
        } else {
            g.push(next);
        }
    }

    /// One of the events the finisher waits for; the last runs it, then those of the flights
    /// chained after (iteratively: a long chain never deepens the stack).
    fn event(f: &Arc<Flight>) {
        if f.pending.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let mut ready = vec![f.clone()];
        while let Some(f) = ready.pop() {
            (f.finish)(&f);
            let next = {
                let mut g = f.then.lock();
                f.finished.store(true, Ordering::Release);
                std::mem::take(&mut *g)
            };
            for n in next {
                if n.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                    ready.push(n);
                }
            }
        }
    }

    /// How many pieces.
    pub(crate) fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Takes pieces until none is left: copies each (or, once stopped, skips it); the thread
    /// finishing the last piece runs the finisher (once the previous flight has finished).
    ///
    /// Crate invariant (`copy`'s, the request's): every piece's local ranges lie in
    /// registrations the request keeps alive while the post is pending, unused by others.
    pub(crate) fn work(self: &Arc<Self>) {
        while self.work_one() {}
    }

    /// [`Flight::work`] for at most `n` pieces: a bounded slice of the copying.
    pub(crate) fn work_some(self: &Arc<Self>, n: usize) {
        for _ in 0..n {
            if !self.work_one() {
                return;
            }
        }
    }

    /// Takes one piece and copies it (or skips it once stopped); `false` when none was left.
    fn work_one(self: &Arc<Self>) -> bool {
        let i = self.next.fetch_add(1, Ordering::AcqRel);
        let Some(p) = self.pieces.get(i) else {
            return false;
        };
        if !self.stopped() {
            if let Err(e) = self.target.copy(self.write, &p.local, &p.remote) {
                self.fail(e);
            }
        }
        if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.pieces.len() {
            Flight::event(self);
        }
        true
    }

    /// Waits until the finisher has run, helping with one piece at a time, up to `deadline`;
    /// whether it had by then.
    pub(crate) fn wait_finished(self: &Arc<Self>, deadline: std::time::Instant) -> bool {
        while !self.is_finished() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            if !self.work_one() {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        true
    }

    /// Whether the finisher has run.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Pieces not started yet are not copied.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Whether [`Flight::stop`] was called.
    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Keeps the first failure.
    fn fail(&self, e: io::Error) {
        let mut g = self.error.lock();
        if g.is_none() {
            *g = Some(e);
        }
    }

    /// The failure, if a piece failed.
    pub(crate) fn error(&self) -> Option<io::Error> {
        let g = self.error.lock();
        g.as_ref().map(|e| match e.raw_os_error() {
            Some(n) => io::Error::from_raw_os_error(n),
            None => io::Error::new(e.kind(), e.to_string()),
        })
    }
}
