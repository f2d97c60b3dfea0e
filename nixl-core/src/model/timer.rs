//! One timer thread for the process: wakes futures at their deadlines (and, for backends that
//! cannot signal completions, at their next check), sleeping until the earliest, and runs the
//! set-up jobs a poll must not do itself (starting an agent's progress thread). Started with
//! the first agent (or on first use); no async runtime is needed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::OnceLock;
use std::task::Waker;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// The most pending entries: beyond it the earliest are kept (a flood of futures cannot grow
/// the heap without bound; a dropped entry is a future woken late, by its next other wake).
const MAX_ENTRIES: usize = 1 << 20;

struct Entry {
    at: Instant,
    seq: u64,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// A job for the timer thread (see [`run_soon`]).
type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
    jobs: Vec<Job>,
}

#[derive(Default)]
struct Timer {
    queue: Mutex<Queue>,
    changed: Condvar,
}

static TIMER: OnceLock<Option<&'static Timer>> = OnceLock::new();

thread_local! {
    /// Threads the project started from this thread (the `fuzzing` feature reads it).
    static STARTED_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts a thread started by the calling thread.
pub(crate) fn note_thread_started() {
    STARTED_HERE.with(|c| c.set(c.get() + 1));
}

/// Threads (the timer thread, agents' progress threads) the calling thread started so far.
#[cfg(feature = "fuzzing")]
pub fn threads_started_here() -> u64 {
    STARTED_HERE.with(std::cell::Cell::get)
}

fn timer() -> Option<&'static Timer> {
    *TIMER.get_or_init(|| {
        note_thread_started();
        let t: &'static Timer = Box::leak(Box::default());
        std::thread::Builder::new()
            .name("nixl-timer".to_owned())
            .spawn(move || run(t))
            .map(|_| t)
            .inspect_err(|e| tracing::error!(error = %e, "could not start the timer thread"))
            .ok()
    })
}

/// Starts the timer thread if it is not running (an agent's creation calls it, so that no
/// future's poll pays for the thread's start). False where it could not be started.
pub(crate) fn start() -> bool {
    timer().is_some()
}

/// Runs `job` on the timer thread soon, off the caller's thread: set-up work a poll must not
/// do itself (a thread's start costs tens of microseconds). Returns the job where no timer
/// thread could be started, for the caller to run.
pub(crate) fn run_soon(job: Job) -> Result<(), Job> {
    let Some(t) = timer() else {
        return Err(job);
    };
    t.queue.lock().jobs.push(job);
    t.changed.notify_one();
    Ok(())
}

/// The timer thread's timer slack: the kernel may wake a sleeper this much after its time
/// (50 us by default, which made every deadline that late).
const SLACK_NS: u64 = 1_000;

fn run(t: &'static Timer) {
    if let Err(e) = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(SLACK_NS)) {
        tracing::debug!(error = %e, "could not set the timer thread's timer slack");
    }
    let mut g = t.queue.lock();
    loop {
        if !g.jobs.is_empty() {
            let jobs = std::mem::take(&mut g.jobs);
            drop(g);
            for job in jobs {
                job();
            }
            g = t.queue.lock();
            continue;
        }
        let now = Instant::now();
        let mut due = Vec::new();
        while g.heap.peek().is_some_and(|Reverse(e)| e.at <= now) {
            if let Some(Reverse(e)) = g.heap.pop() {
                due.push(e.waker);
            }
        }
        if !due.is_empty() {
            drop(g);
            for w in due {
                w.wake();
            }
            g = t.queue.lock();
            continue;
        }
        match g.heap.peek().map(|Reverse(e)| e.at) {
            Some(at) => {
                t.changed.wait_until(&mut g, at);
            }
            None => t.changed.wait(&mut g),
        }
    }
}

/// Wakes the futures whose time has come, from the calling thread (a backend's progress
/// thread between its passes): a deadline is then served by whichever of the process's busy
/// threads runs first, not only by the timer thread, which a loaded machine may hold off the
/// CPU for milliseconds. Cheap when nothing is due: one `try_lock` and a peek.
pub(crate) fn fire_due() {
    let Some(t) = TIMER.get().copied().flatten() else {
        return;
    };
    let now = Instant::now();
    let mut due = Vec::new();
    {
        let Some(mut g) = t.queue.try_lock() else {
            return;
        };
        while g.heap.peek().is_some_and(|Reverse(e)| e.at <= now) {
            if let Some(Reverse(e)) = g.heap.pop() {
                due.push(e.waker);
            }
        }
    }
    for w in due {
        w.wake();
    }
}

/// Wakes `w` at `at` (at once if it has passed). Returns false where no timer thread could be
/// started (the caller then cannot rely on a timed wake).
pub(crate) fn wake_at(at: Instant, w: &Waker) -> bool {
    let Some(t) = timer() else {
        return false;
    };
    let mut g = t.queue.lock();
    if g.heap.len() >= MAX_ENTRIES {
        tracing::warn!("timer full: a future's timed wake is dropped");
        return true;
    }
    g.seq += 1;
    let seq = g.seq;
    let earliest = g.heap.peek().is_none_or(|Reverse(e)| at < e.at);
    g.heap.push(Reverse(Entry {
        at,
        seq,
        waker: w.clone(),
    }));
    drop(g);
    if earliest {
        t.changed.notify_one();
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::Duration;

    struct Flag(AtomicBool, std::thread::Thread);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
            self.1.unpark();
        }
    }

    #[test]
    fn wakes_at_the_deadline_not_before() {
        let f = Arc::new(Flag(AtomicBool::new(false), std::thread::current()));
        let t0 = Instant::now();
        assert!(wake_at(
            t0 + Duration::from_millis(30),
            &Waker::from(f.clone())
        ));
        while !f.0.load(Ordering::SeqCst) {
            std::thread::park_timeout(Duration::from_secs(5));
            assert!(t0.elapsed() < Duration::from_secs(5), "never woken");
        }
        assert!(t0.elapsed() >= Duration::from_millis(30));
    }
}
