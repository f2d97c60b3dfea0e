//! One timer thread for the process: wakes futures at their deadlines (and, for backends that
//! cannot signal completions, at their next check), sleeping until the earliest, and runs the
//! set-up jobs a poll must not do itself (starting an agent's progress thread). Started with
//! the first agent (or on first use); no async runtime is needed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Due wakes another thread took out of the heap ([`fire_due`]) and is delivering: the
    /// timer thread delivers them too, at once, so a thread descheduled between taking them
    /// and waking them (a busy copy thread, often) delays nobody.
    taken: Vec<Waker>,
}

#[derive(Default)]
struct Timer {
    queue: Mutex<Queue>,
    changed: Condvar,
}

static TIMER: OnceLock<Option<&'static Timer>> = OnceLock::new();

/// The heap's earliest time, in nanoseconds after [`base`] (`u64::MAX`: none): what
/// [`fire_due`] reads first, so a busy thread takes the queue's lock only when a wake is due
/// (one preempted while holding it would hold up the timer thread).
static EARLIEST: AtomicU64 = AtomicU64::new(u64::MAX);

/// The instant [`EARLIEST`] counts from.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// `at` as [`EARLIEST`] counts it.
fn nanos(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(base()).as_nanos()).unwrap_or(u64::MAX - 1)
}

/// Records the heap's earliest time after it changed (under the queue's lock).
fn note_earliest(q: &Queue) {
    let at = q.heap.peek().map_or(u64::MAX, |Reverse(e)| nanos(e.at));
    EARLIEST.store(at, Ordering::Release);
}

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
        if !g.taken.is_empty() {
            let taken = std::mem::take(&mut g.taken);
            drop(g);
            for w in taken {
                w.wake();
            }
            g = t.queue.lock();
            continue;
        }
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
            note_earliest(&g);
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
/// CPU for milliseconds. The timer thread is handed each wake taken here too, so one is late
/// only where both threads are held off (the caller may be descheduled between taking a wake
/// and delivering it). Cheap when nothing is due: one atomic load, no lock.
pub(crate) fn fire_due() {
    let Some(t) = TIMER.get().copied().flatten() else {
        return;
    };
    let now = Instant::now();
    if nanos(now) < EARLIEST.load(Ordering::Acquire) {
        return;
    }
    let due = match t.queue.try_lock() {
        Some(mut g) => g.take_due(now),
        None => return,
    };
    if due.is_empty() {
        return;
    }
    t.changed.notify_one();
    for w in due {
        w.wake();
    }
}

impl Queue {
    /// Takes the wakes due at `now` out of the heap for a thread other than the timer's to
    /// deliver, handing each to the timer thread as well (`taken`): whichever of the two
    /// runs first delivers it.
    fn take_due(&mut self, now: Instant) -> Vec<Waker> {
        let mut due = Vec::new();
        while self.heap.peek().is_some_and(|Reverse(e)| e.at <= now) {
            if let Some(Reverse(e)) = self.heap.pop() {
                due.push(e.waker);
            }
        }
        if !due.is_empty() {
            note_earliest(self);
            self.taken.extend(due.iter().cloned());
        }
        due
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
    if earliest {
        EARLIEST.store(nanos(at), Ordering::Release);
    }
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

    /// A wake another thread takes out of the heap is the timer thread's to deliver too: one
    /// descheduled between taking and delivering it holds up nobody.
    #[test]
    fn a_wake_taken_elsewhere_is_the_timer_threads_too() {
        let flag = |_| Arc::new(Flag(AtomicBool::new(false), std::thread::current()));
        let (due, later) = (flag(0), flag(1));
        let now = Instant::now();
        let mut q = Queue::default();
        for (i, (at, f)) in [(now, &due), (now + Duration::from_secs(60), &later)]
            .into_iter()
            .enumerate()
        {
            q.heap.push(Reverse(Entry {
                at,
                seq: i as u64,
                waker: Waker::from(f.clone()),
            }));
        }
        let taken = q.take_due(now);
        assert_eq!(taken.len(), 1, "only the due wake is taken");
        assert_eq!(q.taken.len(), 1, "and it is handed to the timer thread too");
        assert_eq!(q.heap.len(), 1, "the later one stays in the heap");
        // The taker never delivers (descheduled for good): the timer thread's copy does.
        drop(taken);
        for w in std::mem::take(&mut q.taken) {
            w.wake();
        }
        assert!(due.0.load(Ordering::SeqCst) && !later.0.load(Ordering::SeqCst));
    }
}
