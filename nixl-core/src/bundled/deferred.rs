//! One thread that runs jobs at their due time: what makes INPROC's deferred completion and
//! the fault injector's delays really asynchronous (the data moves later, on another thread,
//! whether or not anyone polls).
//!
//! Jobs due at the same instant run in the order they were scheduled. A job that was canceled
//! meanwhile checks that itself (each job owns its shared state); the scheduler only runs
//! closures. Dropping the scheduler runs nothing more: jobs still queued are dropped (their
//! owners see them as never started) and the thread is joined.

use parking_lot::{Condvar, Mutex};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

type Job = Box<dyn FnOnce() + Send>;

struct Entry {
    due: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    // BinaryHeap is a max-heap: the earliest (due, seq) must compare greatest.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Entry>,
    next_seq: u64,
    stop: bool,
}

struct Inner {
    queue: Mutex<Queue>,
    cv: Condvar,
}

/// A thread running scheduled jobs (started on the first [`Scheduler::schedule`]).
pub(crate) struct Scheduler {
    name: String,
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Scheduler {
    /// A scheduler whose thread (once started) is called `name`.
    pub(crate) fn new(name: &str) -> Self {
        Scheduler {
            name: name.to_owned(),
            inner: Arc::new(Inner {
                queue: Mutex::new(Queue::default()),
                cv: Condvar::new(),
            }),
            thread: Mutex::new(None),
        }
    }

    /// Runs `job` on the scheduler's thread at `due` (at once if it is past). Fails only when
    /// the thread cannot be started.
    pub(crate) fn schedule(
        &self,
        due: Instant,
        job: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        {
            let mut t = self.thread.lock();
            if t.is_none() {
                let inner = self.inner.clone();
                *t = Some(
                    std::thread::Builder::new()
                        .name(self.name.clone())
                        .spawn(move || run(&inner))?,
                );
            }
        }
        let mut q = self.inner.queue.lock();
        let seq = q.next_seq;
        q.next_seq += 1;
        q.heap.push(Entry {
            due,
            seq,
            job: Box::new(job),
        });
        drop(q);
        self.inner.cv.notify_all();
        Ok(())
    }
}

fn run(inner: &Inner) {
    let mut q = inner.queue.lock();
    loop {
        if q.stop {
            return;
        }
        let now = Instant::now();
        match q.heap.peek().map(|e| e.due) {
            Some(due) if due <= now => {
                if let Some(e) = q.heap.pop() {
                    drop(q);
                    (e.job)();
                    q = inner.queue.lock();
                }
            }
            Some(due) => {
                inner.cv.wait_for(&mut q, due - now);
            }
            None => {
                inner.cv.wait(&mut q);
            }
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let jobs = {
            let mut q = self.inner.queue.lock();
            q.stop = true;
            std::mem::take(&mut q.heap)
        };
        self.inner.cv.notify_all();
        // Dropped outside the lock: a job's captures may own anything.
        drop(jobs);
        let handle = self.thread.lock().take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() && h.join().is_err() {
                tracing::error!(scheduler = %self.name, "a scheduled job panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn jobs_run_in_due_order_on_another_thread() {
        let s = Scheduler::new("test-sched");
        let (tx, rx) = std::sync::mpsc::channel();
        let now = Instant::now();
        let me = std::thread::current().id();
        for (k, ms) in [(0u32, 60u64), (1, 20), (2, 20), (3, 0)] {
            let tx = tx.clone();
            s.schedule(now + Duration::from_millis(ms), move || {
                let _ = tx.send((k, std::thread::current().id() != me, Instant::now()));
            })
            .unwrap();
        }
        let got: Vec<_> = (0..4)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [3, 1, 2, 0]);
        assert!(
            got.iter().all(|g| g.1),
            "jobs run on the scheduler's thread"
        );
        assert!(
            got[3].2 >= now + Duration::from_millis(60),
            "not before its due time"
        );
    }

    #[test]
    fn dropping_runs_nothing_more() {
        let s = Scheduler::new("test-sched-drop");
        let ran = Arc::new(Mutex::new(false));
        let r = ran.clone();
        s.schedule(Instant::now() + Duration::from_secs(3600), move || {
            *r.lock() = true;
        })
        .unwrap();
        drop(s);
        assert!(!*ran.lock());
        assert_eq!(Arc::strong_count(&ran), 1, "the queued job was dropped");
    }
}
