//! The agent's comm thread: side-channel sends, fetches and invalidations run there, as on
//! NIXL's, so the calls that start them return at once. One thread per agent, started at the
//! first such call; each job is bounded by nixl-rs's deadlines (connect, frame, fetch wait),
//! so a dead or silent peer delays only the jobs behind it. The thread ends when the agent is
//! dropped, after the job it is running (a fetch still waiting keeps the nixl-rs agent it
//! runs on until its wait ends, 30 s at most).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::{refuse, NixlError};

type Job = Box<dyn FnOnce() -> nixl::Result<()> + Send>;

pub(crate) struct Comm {
    tx: Mutex<Option<Sender<Job>>>,
    failures: Arc<AtomicU64>,
}

impl Comm {
    pub(crate) fn new() -> Self {
        Comm {
            tx: Mutex::new(None),
            failures: Arc::new(AtomicU64::new(0)),
        }
    }

    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Queues `job` (`BackendError` when the thread cannot be started).
    pub(crate) fn submit(
        &self,
        job: impl FnOnce() -> nixl::Result<()> + Send + 'static,
    ) -> Result<(), NixlError> {
        let mut tx = self.tx.lock();
        if tx.is_none() {
            let (s, r) = channel::<Job>();
            let failures = self.failures.clone();
            std::thread::Builder::new()
                .name("nixl-sys-comm".to_owned())
                .spawn(move || {
                    for job in r {
                        if let Err(e) = job() {
                            failures.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(error = %e, "nixl-rs-sys comm thread: side-channel job failed");
                        }
                    }
                })
                .map_err(|e| {
                    refuse(
                        nixl::ErrorKind::Io,
                        format!("cannot start the comm thread: {e}"),
                        NixlError::BackendError,
                    )
                })?;
            *tx = Some(s);
        }
        match tx.as_ref().map(|s| s.send(Box::new(job))) {
            Some(Ok(())) => Ok(()),
            _ => Err(NixlError::BackendError),
        }
    }
}
