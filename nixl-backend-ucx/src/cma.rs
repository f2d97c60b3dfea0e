//! Direct CMA: same-host copies without UCX's per-operation layers.
//!
//! Between two processes of one host UCX moves host memory with its `cma` transport: one
//! `process_vm_writev` (or `process_vm_readv`) system call per put or get. Where UCX chose
//! that transport for a peer's endpoint (its lanes name `cma/`), the peer announced its
//! process in its connection info, and that process is alive on this host
//! ([`nixl_core::ProcessId::local_pid`]), the backend issues the same copies itself, up to
//! [`IOV_MAX`] segments per call: a request of 32 blocks of 4 KiB costs one system call
//! instead of 32. Nothing else changes: the copies are complete when the call returns, and the
//! notification then goes out on the peer's endpoint as before, so it still follows its data.
//! [`UcxParams::direct_cma`](crate::UcxParams::direct_cma) turns it off; the path report says
//! which was used (`direct CMA`).
//!
//! Trust: the target is the process the agent bound when it loaded the peer
//! ([`nixl_core::PeerProcess`]: a pidfd of the thread-group leader its metadata names, start
//! time checked, never this process unless the caller allows it), and the peer's UCX connection
//! info must name the same one. Every system call is preceded by a check of that pidfd: once the
//! process has exited, copies fail with `ESRCH` (`RemoteDisconnect`) whatever reuses its pid.
//! The remote ranges are the ones the agent checked against the peer's regions. A range the
//! peer does not have mapped is an error (`EFAULT`), never a fault here.

use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use nixl_core::{Error, Op};

use crate::sys::cma::{copy, IoVec, IOV_MAX};
use crate::xfer::Work;

/// The peer's process, bound: copies go to it only while it has not exited and the peer was
/// not forgotten. Shared by every request to the peer.
#[derive(Debug, Clone)]
pub(crate) struct Target(Arc<Gate>);

#[derive(Debug)]
struct Gate {
    process: nixl_core::PeerProcess,
    /// Set when the peer is forgotten (disconnect): no copy starts any more.
    revoked: AtomicBool,
    /// System calls to the process under way.
    active: AtomicUsize,
}

/// `ECANCELED`: the copy was not made because the peer was forgotten.
pub(crate) const REVOKED: i32 = 125;

impl Target {
    /// Copies go to `process`.
    pub fn new(process: nixl_core::PeerProcess) -> Self {
        Target(Arc::new(Gate {
            process,
            revoked: AtomicBool::new(false),
            active: AtomicUsize::new(0),
        }))
    }

    /// [`copy`] to the bound process: refused with `ESRCH` once it has exited (its pid may
    /// then name another process) and with `ECANCELED` once the peer was forgotten
    /// ([`Target::revoke`]).
    pub fn copy(&self, write: bool, local: &[IoVec], remote: &[IoVec]) -> io::Result<()> {
        let g = &self.0;
        // Counted before the check: `revoke` sets the flag, then waits for the count, so a
        // copy either sees the flag or is waited for (both SeqCst).
        g.active.fetch_add(1, Ordering::SeqCst);
        let r = if g.revoked.load(Ordering::SeqCst) {
            Err(io::Error::from_raw_os_error(REVOKED))
        } else if g.process.exited() {
            Err(io::Error::from_raw_os_error(3)) // ESRCH
        } else {
            copy(g.process.pid(), write, local, remote)
        };
        g.active.fetch_sub(1, Ordering::SeqCst);
        r
    }

    /// No copy starts from now on, and the ones under way have ended when this returns (each
    /// is one system call over at most a piece, or a request of up to [`INLINE_BYTES`]):
    /// once a forgotten peer's disconnect returns, no byte of its requests lands.
    pub fn revoke(&self) {
        let g = &self.0;
        g.revoked.store(true, Ordering::SeqCst);
        let start = std::time::Instant::now();
        while g.active.load(Ordering::SeqCst) > 0 {
            if start.elapsed() > std::time::Duration::from_secs(5) {
                tracing::error!("a direct CMA copy to a forgotten peer has not ended after 5 s");
                return;
            }
            std::thread::yield_now();
        }
    }
}

/// A request's direct copies: the peer's process and reused range lists.
pub(crate) struct Direct {
    target: Target,
    local: Vec<IoVec>,
    remote: Vec<IoVec>,
    /// System calls one post makes (for the path).
    pub calls: usize,
}

impl Direct {
    /// Direct copies to `target` for a request of `work`.
    pub fn new(target: Target, work: &Work) -> Self {
        let n = work.len().min(IOV_MAX);
        Direct {
            target,
            local: Vec::with_capacity(n),
            remote: Vec::with_capacity(n),
            calls: work.len().div_ceil(IOV_MAX).max(1),
        }
    }

    /// The peer's process.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Copies every segment of `work` (local to remote for a WRITE, back for a READ), at most
    /// [`IOV_MAX`] per system call; complete when it returns.
    ///
    /// Crate invariant (the request's): every local range lies in a registration the request
    /// keeps alive, and for a READ nothing else uses it while the request is in flight (the
    /// agent's rule for every backend).
    pub fn run(&mut self, write: bool, work: &Work) -> io::Result<()> {
        self.local.clear();
        self.remote.clear();
        let mut failed = None;
        let target = &self.target;
        let (local, remote) = (&mut self.local, &mut self.remote);
        work.each(|s| {
            let (Ok(l), Ok(r), Ok(n)) = (
                usize::try_from(s.local),
                usize::try_from(s.remote),
                usize::try_from(s.len),
            ) else {
                failed = Some(io::Error::from(io::ErrorKind::InvalidInput));
                return false;
            };
            local.push(IoVec { base: l, len: n });
            remote.push(IoVec { base: r, len: n });
            if local.len() == IOV_MAX {
                if let Err(e) = target.copy(write, local, remote) {
                    failed = Some(e);
                    return false;
                }
                local.clear();
                remote.clear();
            }
            true
        });
        if let Some(e) = failed {
            return Err(e);
        }
        if !local.is_empty() {
            target.copy(write, local, remote)?;
        }
        Ok(())
    }
}

/// The typed error for a failed direct copy to `remote`.
pub(crate) fn error(agent: &str, remote: &str, op: Op, e: &io::Error) -> Error {
    match e.raw_os_error() {
        // ESRCH: the peer's process is gone.
        Some(3) => Error::disconnected(agent, remote, op, "its process has exited (CMA: ESRCH)"),
        Some(REVOKED) => Error::disconnected(
            agent,
            remote,
            op,
            "the peer was forgotten (invalidated or reloaded): no more direct copies to it",
        ),
        // EPERM: no ptrace permission over the peer's process (another user, Yama).
        Some(1) => Error::backend(
            agent,
            crate::UCX,
            op,
            format!(
                "CMA to {remote} not permitted (EPERM: no ptrace permission over its process); \
                 UcxParams::direct_cma = false leaves the copies to UCX"
            ),
        ),
        Some(14) => Error::backend(
            agent,
            crate::UCX,
            op,
            format!("CMA: a range of {remote}'s region is not mapped in its process (EFAULT)"),
        ),
        _ => Error::backend(agent, crate::UCX, op, format!("CMA copy to {remote}: {e}")),
    }
}

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
    pub fn start(agent: &str, size: usize) -> io::Result<Self> {
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
    pub fn run_all(&self, jobs: Vec<Job>) -> Vec<Job> {
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
    pub fn new(
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
    pub fn after(
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
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Takes pieces until none is left: copies each (or, once stopped, skips it); the thread
    /// finishing the last piece runs the finisher (once the previous flight has finished).
    ///
    /// Crate invariant (`copy`'s, the request's): every piece's local ranges lie in
    /// registrations the request keeps alive while the post is pending, unused by others.
    pub fn work(self: &Arc<Self>) {
        while self.work_one() {}
    }

    /// [`Flight::work`] for at most `n` pieces: a bounded slice of the copying.
    pub fn work_some(self: &Arc<Self>, n: usize) {
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
    pub fn wait_finished(self: &Arc<Self>, deadline: std::time::Instant) -> bool {
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
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Pieces not started yet are not copied.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Whether [`Flight::stop`] was called.
    pub fn stopped(&self) -> bool {
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
    pub fn error(&self) -> Option<io::Error> {
        let g = self.error.lock();
        g.as_ref().map(|e| match e.raw_os_error() {
            Some(n) => io::Error::from_raw_os_error(n),
            None => io::Error::new(e.kind(), e.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process as a copy target (a process may attach to itself).
    fn this_process() -> Target {
        let id = nixl_core::ProcessId::current().expect("/proc");
        Target::new(
            nixl_core::PeerProcess::open(&id)
                .expect("alive")
                .expect("pidfds"),
        )
    }

    fn r(base: usize, len: usize) -> (IoVec, IoVec) {
        (
            IoVec { base, len },
            IoVec {
                base: base + (1 << 40),
                len,
            },
        )
    }

    /// Pieces cover every byte once, in order, remote offsets following local ones, with at
    /// most the asked number of pieces (fewer when small) and IOV_MAX ranges each.
    #[test]
    fn split_covers_every_byte_once() {
        let cases: Vec<(Vec<(IoVec, IoVec)>, usize)> = vec![
            (vec![r(0x1000, 64 << 20)], 4),
            (vec![r(0x1000, 4096)], 4),
            ((0..32).map(|i| r(i * (2 << 20), 1 << 20)).collect(), 4),
            ((0..3000).map(|i| r(i * 8192, 4096)).collect(), 3),
            (
                (0..5)
                    .map(|i| r(i * (8 << 20), (i + 1) * 777_777))
                    .collect(),
                7,
            ),
            (vec![r(0x1000, 3 << 20)], 1),
        ];
        for (ranges, n) in cases {
            let total: usize = ranges.iter().map(|(l, _)| l.len).sum();
            let pieces = split(&ranges, n);
            assert!(pieces.len() <= n.max(total.div_ceil(IOV_MAX * 4096)));
            if total < MIN_PIECE {
                assert_eq!(pieces.len(), 1);
            }
            let flat: Vec<(IoVec, IoVec)> = pieces
                .iter()
                .flat_map(|(l, r)| {
                    assert_eq!(l.len(), r.len());
                    assert!(l.len() <= IOV_MAX && !l.is_empty());
                    l.iter().copied().zip(r.iter().copied())
                })
                .collect();
            // Re-join consecutive cuts and compare with the input.
            let mut joined: Vec<(IoVec, IoVec)> = Vec::new();
            for (l, rr) in flat {
                assert_eq!(rr.base - l.base, 1 << 40);
                assert_eq!(l.len, rr.len);
                match joined.last_mut() {
                    Some((pl, pr)) if pl.base + pl.len == l.base => {
                        pl.len += l.len;
                        pr.len += rr.len;
                    }
                    _ => joined.push((l, rr)),
                }
            }
            let mut want: Vec<(IoVec, IoVec)> = Vec::new();
            for &(l, rr) in &ranges {
                match want.last_mut() {
                    Some((pl, pr)) if pl.base + pl.len == l.base => {
                        pl.len += l.len;
                        pr.len += rr.len;
                    }
                    _ => want.push((l, rr)),
                }
            }
            assert_eq!(joined, want);
        }
    }

    #[test]
    fn a_pool_runs_jobs_and_stops() {
        let pool = CopyPool::start("t", 3).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..10 {
            let tx = tx.clone();
            assert!(pool
                .run_all(vec![Box::new(move || tx.send(i).unwrap())])
                .is_empty());
        }
        let mut got: Vec<i32> = (0..10).map(|_| rx.recv().unwrap()).collect();
        got.sort();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        drop(pool);
    }

    /// Every piece is copied once, by whichever thread takes it; the finisher runs once,
    /// after the last; a failure is kept; a stopped flight copies nothing more.
    #[test]
    fn a_flight_copies_each_piece_once_and_finishes_once() {
        use std::sync::Arc;
        let me = this_process();
        let src: Vec<u8> = (0..(8 << 20)).map(|i: u32| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let ranges = [(
            IoVec {
                base: src.as_ptr() as usize,
                len: src.len(),
            },
            IoVec {
                base: dst.as_mut_ptr() as usize,
                len: dst.len(),
            },
        )];
        let finished = Arc::new(AtomicUsize::new(0));
        let f2 = finished.clone();
        let flight = Flight::new(
            me.clone(),
            true,
            split(&ranges, usize::MAX),
            Box::new(move |f| {
                assert!(f.error().is_none());
                f2.fetch_add(1, Ordering::SeqCst);
            }),
        );
        assert_eq!(flight.len(), 32, "pieces of MIN_PIECE");
        let pool = CopyPool::start("t", 2).unwrap();
        for _ in 0..2 {
            let f = flight.clone();
            assert!(pool.run_all(vec![Box::new(move || f.work())]).is_empty());
        }
        flight.work();
        drop(pool);
        assert_eq!(finished.load(Ordering::SeqCst), 1);
        assert_eq!(dst, src);
        // A failing piece is kept; a stopped flight copies nothing.
        let bad = [(
            IoVec {
                base: src.as_ptr() as usize,
                len: 4096,
            },
            IoVec { base: 8, len: 4096 },
        )];
        let f = Flight::new(
            me.clone(),
            true,
            split(&bad, 1),
            Box::new(|f| assert!(f.error().is_some())),
        );
        f.work();
        assert_eq!(f.error().and_then(|e| e.raw_os_error()), Some(14));
        let mut out = vec![0u8; 4096];
        let stopped = [(
            IoVec {
                base: src.as_ptr() as usize,
                len: 4096,
            },
            IoVec {
                base: out.as_mut_ptr() as usize,
                len: 4096,
            },
        )];
        let f = Flight::new(
            me,
            true,
            split(&stopped, 1),
            Box::new(|f| assert!(f.stopped())),
        );
        f.stop();
        f.work();
        assert_eq!(out, vec![0u8; 4096]);
    }
}
