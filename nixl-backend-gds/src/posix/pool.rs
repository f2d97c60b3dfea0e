//! The fallback engine: a pool of threads doing `pread`/`pwrite`, used where io_uring is not
//! allowed (old kernels, seccomp profiles of container runtimes, `io_uring_disabled`).

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use nixl_core::backend::BackendXfer;
use nixl_core::{Error, Op, Result, XferOp, XferState};

use nixl_mem::CudaError;

use super::bounce::{self, VramSide};
use super::{Chunk, Plan};
use crate::sys::io;

/// The progress of one post of a request, shared with the workers running its chunks.
struct Progress {
    agent: String,
    backend: &'static str,
    /// The staging buffers and contexts of a VRAM request.
    vram: Option<Arc<VramSide>>,
    remaining: AtomicUsize,
    canceled: AtomicBool,
    /// Per chunk: whether it completed (for what a partial failure leaves).
    completed: Vec<AtomicBool>,
    error: Mutex<Option<Error>>,
    done: Condvar,
    done_lock: Mutex<()>,
    /// Keeps the plan's descriptors open while any chunk of this post is queued or running.
    _files: Vec<nixl_core::backend::BackendMd>,
}

impl Progress {
    fn finish_one(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _g = self.done_lock.lock();
            self.done.notify_all();
        }
    }
}

struct Job {
    index: usize,
    chunk: Chunk,
    op: XferOp,
    progress: Arc<Progress>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

/// A fixed set of worker threads.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts `n` workers.
    pub(crate) fn new(n: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
        });
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let s = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("nixl-posix-{i}"))
                    .spawn(move || worker(&s))?,
            );
        }
        Ok(Pool { shared, threads })
    }

    fn submit(&self, jobs: impl Iterator<Item = Job>) {
        let mut q = self.shared.queue.lock();
        q.jobs.extend(jobs);
        drop(q);
        self.shared.ready.notify_all();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.queue.lock().shutdown = true;
        self.shared.ready.notify_all();
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("POSIX: a pool worker panicked");
            }
        }
    }
}

fn worker(s: &Shared) {
    loop {
        let job = {
            let mut q = s.queue.lock();
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if q.shutdown {
                    return;
                }
                s.ready.wait(&mut q);
            }
        };
        let p = &job.progress;
        if !p.canceled.load(Ordering::Acquire) && p.error.lock().is_none() {
            let r = match (&p.vram, job.chunk.gpu) {
                (_, None) => run_chunk(job.op, job.chunk),
                (Some(v), Some(g)) => bounce::run_vram_chunk(job.op, job.chunk, v, g, &p.canceled),
                (None, Some(_)) => Err(ChunkError::Os(std::io::Error::from_raw_os_error(
                    libc::EINVAL,
                ))),
            };
            // A chunk canceled while waiting for a staging buffer is skipped like a queued one.
            match r {
                Ok(()) => p.completed[job.index].store(true, Ordering::Release),
                Err(ChunkError::Canceled) => {}
                Err(e) => {
                    let mut err = p.error.lock();
                    if err.is_none() {
                        *err = Some(e.into_error(&p.agent, p.backend, Op::CheckXfer));
                    }
                }
            }
        }
        p.finish_one();
    }
}

/// Why a chunk failed.
pub(crate) enum ChunkError {
    /// The OS refused the I/O.
    Os(std::io::Error),
    /// A read found the end of the file at this offset.
    Eof(u64),
    /// A CUDA copy to or from a staging buffer failed.
    Cuda(CudaError),
    /// The request was canceled before the chunk got a staging buffer.
    Canceled,
}

impl ChunkError {
    fn into_error(self, agent: &str, backend: &str, op: Op) -> Error {
        match self {
            ChunkError::Os(e) => Error::io(agent, op, e),
            ChunkError::Eof(off) => Error::backend(
                agent,
                backend,
                op,
                format!("end of file at offset {off} (the file shrank?)"),
            ),
            ChunkError::Cuda(e) => e.into_error(agent, backend, op),
            ChunkError::Canceled => Error::Canceled {
                agent: agent.to_owned(),
                op,
            },
        }
    }
}

fn run_chunk(op: XferOp, c: Chunk) -> std::result::Result<(), ChunkError> {
    // Crate invariant: the buffer lies in a DRAM registration the request keeps alive until
    // this chunk is finished (cancel waits for running chunks); `fd` is owned by the plan.
    file_io(op, c.fd, c.buf, c.off, c.len)
}

/// `pread`s or `pwrite`s `len` bytes between host memory at `buf` and offset `off` of `fd`,
/// retrying short transfers and `EINTR`. Crate invariant (`crate::sys`): `buf..buf+len` is host
/// memory that stays alive, and is not otherwise accessed, until this returns (READ writes
/// it); `fd` stays open.
pub(crate) fn file_io(
    op: XferOp,
    fd: std::os::fd::RawFd,
    buf: u64,
    off: u64,
    len: u64,
) -> std::result::Result<(), ChunkError> {
    let c = Chunk {
        fd,
        buf,
        off,
        len,
        gpu: None,
    };
    let mut done = 0u64;
    while done < c.len {
        let buf = c.buf + done;
        let len = (c.len - done) as usize;
        let off = libc::off_t::try_from(c.off + done)
            .map_err(|_| ChunkError::Os(std::io::Error::from_raw_os_error(libc::EOVERFLOW)))?;
        let n = match op {
            XferOp::Read => io::pread(c.fd, buf, len, off),
            XferOp::Write => io::pwrite(c.fd, buf, len, off),
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ChunkError::Os(e));
        }
        if n == 0 {
            return Err(ChunkError::Eof(c.off + done));
        }
        done += n as u64;
    }
    Ok(())
}

/// A request run by the pool.
pub(crate) struct PoolXfer {
    plan: Plan,
    pool: Arc<Pool>,
    label: String,
    progress: Option<Arc<Progress>>,
    reported: bool,
}

impl PoolXfer {
    /// A request on the pool; `label` is its path report (without the O_DIRECT suffix).
    pub(crate) fn new(plan: Plan, pool: Arc<Pool>, label: String) -> Self {
        PoolXfer {
            plan,
            pool,
            label,
            progress: None,
            reported: false,
        }
    }

    fn state(&mut self) -> Result<XferState> {
        let Some(p) = &self.progress else {
            return Err(Error::not_allowed(
                &self.plan.agent,
                Op::CheckXfer,
                "not posted",
            ));
        };
        if p.remaining.load(Ordering::Acquire) > 0 {
            return Ok(XferState::InProgress);
        }
        if let Some(e) = p.error.lock().take() {
            self.reported = true;
            // Name what the request did complete: a partial failure leaves it there.
            return Err(self
                .plan
                .with_completed(e, |i| p.completed[i].load(Ordering::Acquire)));
        }
        if p.canceled.load(Ordering::Acquire)
            && !p.completed.iter().all(|c| c.load(Ordering::Acquire))
        {
            // Stopped (abandoned): skipped chunks mean it is not complete.
            self.reported = true;
            return Err(Error::Canceled {
                agent: self.plan.agent.clone(),
                op: Op::CheckXfer,
            });
        }
        if self.reported {
            return Err(Error::backend(
                &self.plan.agent,
                self.plan.backend,
                Op::CheckXfer,
                "request failed",
            ));
        }
        Ok(XferState::Done)
    }
}

impl BackendXfer for PoolXfer {
    fn post(&mut self) -> Result<XferState> {
        if self
            .progress
            .as_ref()
            .is_some_and(|p| p.remaining.load(Ordering::Acquire) > 0)
        {
            return Err(Error::RepostActive {
                agent: self.plan.agent.clone(),
                op: Op::PostXfer,
            });
        }
        self.plan.check_file_sizes()?;
        let p = Arc::new(Progress {
            agent: self.plan.agent.clone(),
            backend: self.plan.backend,
            vram: self.plan.vram.clone(),
            remaining: AtomicUsize::new(self.plan.chunks.len()),
            canceled: AtomicBool::new(false),
            completed: (0..self.plan.chunks.len())
                .map(|_| AtomicBool::new(false))
                .collect(),
            error: Mutex::new(None),
            done: Condvar::new(),
            done_lock: Mutex::new(()),
            _files: self.plan.files.clone(),
        });
        self.progress = Some(p.clone());
        self.reported = false;
        let op = self.plan.op;
        self.pool.submit(
            self.plan
                .chunks
                .iter()
                .enumerate()
                .map(|(index, &chunk)| Job {
                    index,
                    chunk,
                    op,
                    progress: p.clone(),
                }),
        );
        self.state()
    }

    fn check(&mut self) -> Result<XferState> {
        self.state()
    }

    fn abandon(&mut self) {
        // Its deadline passed: chunks still queued are skipped.
        if let Some(p) = &self.progress {
            p.canceled.store(true, Ordering::Release);
        }
    }

    fn cancel(&mut self) -> Result<()> {
        let Some(p) = &self.progress else {
            return Ok(());
        };
        p.canceled.store(true, Ordering::Release);
        let deadline = Instant::now() + self.plan.cancel_timeout;
        let mut g = p.done_lock.lock();
        while p.remaining.load(Ordering::Acquire) > 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::TimedOut {
                    agent: self.plan.agent.clone(),
                    op: Op::Cancel,
                    elapsed: self.plan.cancel_timeout,
                });
            }
            p.done.wait_for(&mut g, deadline - now);
        }
        Ok(())
    }

    fn path(&self) -> Option<String> {
        Some(self.plan.describe(&self.label))
    }
}

impl Drop for PoolXfer {
    fn drop(&mut self) {
        if self
            .progress
            .as_ref()
            .is_some_and(|p| p.remaining.load(Ordering::Acquire) > 0)
            && self.cancel().is_err()
        {
            tracing::error!(agent = %self.plan.agent, "POSIX: chunks still running on the pool after cancel");
        }
    }
}

/// A small page-cache request run synchronously inside `post`: a `pread`/`pwrite` of cached
/// pages is a memory copy, so handing it to another thread (io-wq or the pool) only adds
/// latency.
pub(crate) struct InlineXfer {
    plan: Plan,
}

impl InlineXfer {
    pub(crate) fn new(plan: Plan) -> Self {
        InlineXfer { plan }
    }
}

impl BackendXfer for InlineXfer {
    fn post(&mut self) -> Result<XferState> {
        self.plan.check_file_sizes()?;
        for (k, &c) in self.plan.chunks.iter().enumerate() {
            if let Err(e) = run_chunk(self.plan.op, c) {
                let e = e.into_error(&self.plan.agent, self.plan.backend, Op::PostXfer);
                return Err(self.plan.with_completed(e, |i| i < k));
            }
        }
        Ok(XferState::Done)
    }

    fn check(&mut self) -> Result<XferState> {
        Ok(XferState::Done)
    }

    fn cancel(&mut self) -> Result<()> {
        // Nothing is ever in flight outside `post`.
        Ok(())
    }

    fn path(&self) -> Option<String> {
        Some(self.plan.describe("inline pread/pwrite"))
    }
}
