//! The agent's side-channel jobs: sends, fetches and invalidations run off the caller's
//! thread, so the calls that start them return at once, as NIXL's do. Jobs to one
//! destination (a side-channel address, or etcd) run in the order they were started, on one
//! thread while that destination has jobs; destinations do not wait for each other, so a
//! silent or dead peer delays only its own jobs (NIXL's single comm thread makes every later
//! job wait for it). Each job is bounded by nixl-rs's deadlines (connect, frame, fetch wait);
//! at most [`MAX_DESTINATIONS`] destinations with jobs and [`MAX_QUEUED`] jobs in all, past
//! which a call is refused (typed) instead of queueing without bound. A job still running
//! when the agent is dropped keeps the nixl-rs agent it runs on until it ends (a fetch's wait,
//! 30 s at most).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{refuse, NixlError};

type Job = Box<dyn FnOnce() -> nixl::Result<()> + Send>;

/// Destinations with jobs at once (each has one thread while it has jobs).
const MAX_DESTINATIONS: usize = 64;
/// Jobs queued over all destinations.
const MAX_QUEUED: usize = 4096;

/// Where a job goes: its jobs run in order, one at a time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Dest {
    /// A NIXL side channel.
    Addr(std::net::SocketAddr),
    /// The etcd exchange.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Etcd,
}

#[derive(Default)]
struct Queues {
    pending: HashMap<Dest, VecDeque<Job>>,
    queued: usize,
}

pub(crate) struct Comm {
    queues: Arc<Mutex<Queues>>,
    failures: Arc<AtomicU64>,
}

impl Comm {
    pub(crate) fn new() -> Self {
        Comm {
            queues: Arc::new(Mutex::new(Queues::default())),
            failures: Arc::new(AtomicU64::new(0)),
        }
    }

    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Queues `job` for `dest` (`BackendError` past the bounds, or when no thread can be
    /// started).
    pub(crate) fn submit(
        &self,
        dest: Dest,
        job: impl FnOnce() -> nixl::Result<()> + Send + 'static,
    ) -> Result<(), NixlError> {
        let full = |what: String| {
            refuse(
                nixl::ErrorKind::LimitExceeded,
                what,
                NixlError::BackendError,
            )
        };
        let mut q = self.queues.lock();
        if q.queued >= MAX_QUEUED {
            return Err(full(format!(
                "{MAX_QUEUED} side-channel jobs are queued already"
            )));
        }
        if let Some(jobs) = q.pending.get_mut(&dest) {
            // That destination's thread is running: it takes this job after the earlier ones.
            jobs.push_back(Box::new(job));
            q.queued += 1;
            return Ok(());
        }
        if q.pending.len() >= MAX_DESTINATIONS {
            return Err(full(format!(
                "{MAX_DESTINATIONS} side-channel destinations have jobs already"
            )));
        }
        let (queues, failures, d) = (self.queues.clone(), self.failures.clone(), dest.clone());
        std::thread::Builder::new()
            .name("nixl-sys-comm".to_owned())
            .spawn(move || run(&queues, &failures, &d))
            .map_err(|e| {
                refuse(
                    nixl::ErrorKind::Io,
                    format!("cannot start a side-channel thread: {e}"),
                    NixlError::BackendError,
                )
            })?;
        q.pending
            .insert(dest, VecDeque::from([Box::new(job) as Job]));
        q.queued += 1;
        Ok(())
    }
}

/// Runs `dest`'s jobs in order until it has none, then forgets it.
fn run(queues: &Mutex<Queues>, failures: &AtomicU64, dest: &Dest) {
    loop {
        let job = {
            let mut q = queues.lock();
            let next = q.pending.get_mut(dest).and_then(VecDeque::pop_front);
            match next {
                Some(j) => {
                    q.queued -= 1;
                    j
                }
                None => {
                    q.pending.remove(dest);
                    return;
                }
            }
        };
        if let Err(e) = job() {
            failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(?dest, error = %e, "nixl-rs-sys: side-channel job failed");
        }
    }
}
