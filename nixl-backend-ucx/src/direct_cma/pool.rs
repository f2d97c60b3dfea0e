//! The copy threads of large direct copies, and how a request is cut into pieces.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::sys::cma::{IoVec, IOV_MAX};

/// Requests up to this size are copied inside `post` (about 60-100 us at 10-16 GB/s, what
/// UCX's own cma copy of them costs the thread that progresses it); larger ones go to the copy
/// threads in pieces, which the application's `check` helps with. Cutting 1 MiB into pieces
/// made it slower on the GPU machine's host (threads woken from sleep start tens of
/// microseconds late: docs/perf/data/h200-2026-11-27/run2).
pub(crate) const INLINE_BYTES: u64 = 1 << 20;

/// The bytes of one piece of a large request (one system call; about 25 us at 10 GB/s): the
/// most a late thread can hold a request back by.
pub(crate) const MIN_PIECE: usize = 256 << 10;

/// The copies of one request, cut into `pieces` of about equal bytes (at least [`MIN_PIECE`]
/// each, at most `pieces`), each at most [`IOV_MAX`] ranges; a range longer than a piece is cut
/// too. Every byte of `ranges` is in exactly one piece, in order.
pub(crate) fn split(ranges: &[(IoVec, IoVec)], pieces: usize) -> Vec<(Vec<IoVec>, Vec<IoVec>)> {
    let total: usize = ranges.iter().map(|(l, _)| l.len).sum();
    let n = pieces.clamp(1, total.div_ceil(MIN_PIECE).max(1));
    let per = total.div_ceil(n).max(1);
    let mut out = Vec::with_capacity(n);
    let (mut l, mut r) = (Vec::new(), Vec::new());
    let mut room = per;
    for &(lv, rv) in ranges {
        let mut off = 0;
        while off < lv.len {
            if room == 0 || l.len() == IOV_MAX {
                out.push((std::mem::take(&mut l), std::mem::take(&mut r)));
                room = per;
            }
            let take = (lv.len - off).min(room);
            l.push(IoVec {
                base: lv.base + off,
                len: take,
            });
            r.push(IoVec {
                base: rv.base + off,
                len: take,
            });
            off += take;
            room -= take;
        }
    }
    if !l.is_empty() {
        out.push((l, r));
    }
    out
}

type Job = Box<dyn FnOnce() + Send>;

/// Threads that run the pieces of large direct copies, so a post returns at once and a large
/// request is copied by several cores ([`UcxParams::cma_threads`](crate::UcxParams::cma_threads)).
pub(crate) struct CopyPool {
    /// One queue per thread, so the pieces of one post wake their threads at the same time.
    tx: parking_lot::Mutex<Vec<std::sync::mpsc::Sender<Job>>>,
    threads: parking_lot::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Where the next post starts handing out pieces (spreads concurrent posts).
    next: AtomicUsize,
    /// How many threads run pieces.
    pub size: usize,
}

impl CopyPool {
    /// Starts `size` threads named after `agent`.
    pub(crate) fn start(agent: &str, size: usize) -> io::Result<Self> {
        let size = size.max(1);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let spin = if cores >= SPIN_MIN_CORES {
            SPIN
        } else {
            std::time::Duration::ZERO
        };
        let mut txs = Vec::with_capacity(size);
        let mut threads = Vec::with_capacity(size);
        for i in 0..size {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            txs.push(tx);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("nixl-cma-{i}"))
                    .spawn(move || {
                        // Until the pool closes the queue.
                        while let Some(job) = next_job(&rx, spin) {
                            job();
                        }
                    })?,
            );
        }
        tracing::debug!(agent, threads = size, "direct CMA copy threads started");
        Ok(CopyPool {
            tx: parking_lot::Mutex::new(txs),
            threads: parking_lot::Mutex::new(threads),
            next: AtomicUsize::new(0),
            size,
        })
    }

    /// Hands `jobs` to the threads in turn (one each, then around again); a job the pool can
    /// no longer run (it has stopped) is given back.
    pub(crate) fn run_all(&self, jobs: Vec<Job>) -> Vec<Job> {
        let tx = self.tx.lock();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut back = Vec::new();
        for (k, job) in jobs.into_iter().enumerate() {
            match tx.get((start + k) % self.size.max(1)) {
                Some(t) => {
                    if let Err(e) = t.send(job) {
                        back.push(e.0);
                    }
                }
                None => back.push(job),
            }
        }
        back
    }
}

/// How long a copy thread keeps polling its queue after a job before it sleeps, on machines
/// of [`SPIN_MIN_CORES`] or more: a thread woken from sleep starts tens of microseconds late on
/// a virtual machine, longer than a piece takes to copy, while back-to-back requests (a stream
/// of KV blocks) find it awake. On smaller machines it sleeps at once: polling would take a
/// core from the application and its peer.
const SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// The fewest cores on which copy threads poll ([`SPIN`]).
const SPIN_MIN_CORES: usize = 8;

/// The next job: polled for up to `spin`, then waited for; `None` once the pool closed.
fn next_job(rx: &std::sync::mpsc::Receiver<Job>, spin: std::time::Duration) -> Option<Job> {
    let start = std::time::Instant::now();
    let mut k = 0u32;
    loop {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => return None,
            Err(std::sync::mpsc::TryRecvError::Empty) => {}
        }
        k = k.wrapping_add(1);
        if k.is_multiple_of(64) && start.elapsed() >= spin {
            return rx.recv().ok();
        }
        std::hint::spin_loop();
    }
}

impl Drop for CopyPool {
    fn drop(&mut self) {
        // Closing the queues ends each thread after the jobs queued before.
        self.tx.lock().clear();
        for t in std::mem::take(&mut *self.threads.lock()) {
            if t.join().is_err() {
                tracing::error!("a direct CMA copy thread panicked");
            }
        }
    }
}
