//! Durable WRITEs ([`PosixParams::durable`](super::PosixParams)): a request reports `Done`
//! only once every file it wrote was `fdatasync`ed after its chunks completed.
//!
//! The sync runs on its own thread, so `post`/`check` never block on a slow device: the
//! request stays `InProgress` until the sync returns, and its deadline still applies.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use nixl_core::backend::BackendXfer;
use nixl_core::{Error, Op, Result, XferState};
use std::sync::mpsc::{sync_channel, Receiver, TryRecvError};

use crate::sys::fd as sysfd;

/// Where the current post stands.
enum Sync {
    /// The engine still writes.
    Writing,
    /// The chunks are written; the sync thread reports here.
    Syncing(Receiver<std::result::Result<(), String>>),
    /// On the device.
    Synced,
}

/// An engine's WRITE, synced before it is done.
pub(crate) struct DurableXfer {
    inner: Box<dyn BackendXfer>,
    agent: String,
    /// Duplicates of every file the request writes, so a sync outliving the request
    /// cannot land on a reused descriptor.
    fds: Arc<Vec<OwnedFd>>,
    sync: Sync,
}

impl DurableXfer {
    pub(super) fn new(inner: Box<dyn BackendXfer>, agent: &str, fds: Vec<OwnedFd>) -> Self {
        DurableXfer {
            inner,
            agent: agent.to_owned(),
            fds: Arc::new(fds),
            sync: Sync::Writing,
        }
    }

    fn failed(&self, op: Op, why: String) -> Error {
        Error::io(
            &self.agent,
            op,
            std::io::Error::other(format!(
                "every chunk was written but fdatasync failed, so the data may not be durable: {why}"
            )),
        )
    }

    /// Advances the sync once the engine reports the chunks written.
    fn after(&mut self, s: XferState, op: Op) -> Result<XferState> {
        if s != XferState::Done {
            return Ok(s);
        }
        loop {
            match &self.sync {
                Sync::Synced => return Ok(XferState::Done),
                Sync::Writing => {
                    let (tx, rx) = sync_channel(1);
                    let fds = Arc::clone(&self.fds);
                    std::thread::Builder::new()
                        .name("nixl-posix-sync".into())
                        .spawn(move || {
                            let r = fds.iter().try_for_each(|fd| {
                                sysfd::fdatasync(fd.as_raw_fd())
                                    .map_err(|e| format!("fd {}: {e}", fd.as_raw_fd()))
                            });
                            let _ = tx.send(r);
                        })
                        .map_err(|e| self.failed(op, format!("no sync thread: {e}")))?;
                    self.sync = Sync::Syncing(rx);
                }
                Sync::Syncing(rx) => match rx.try_recv() {
                    Ok(Ok(())) => self.sync = Sync::Synced,
                    Ok(Err(why)) => {
                        self.sync = Sync::Writing;
                        return Err(self.failed(op, why));
                    }
                    Err(TryRecvError::Empty) => return Ok(XferState::InProgress),
                    Err(TryRecvError::Disconnected) => {
                        self.sync = Sync::Writing;
                        return Err(self.failed(op, "the sync thread ended".into()));
                    }
                },
            }
        }
    }
}

impl BackendXfer for DurableXfer {
    fn post(&mut self) -> Result<XferState> {
        self.sync = Sync::Writing;
        let s = self.inner.post()?;
        self.after(s, Op::PostXfer)
    }

    fn check(&mut self) -> Result<XferState> {
        if matches!(self.sync, Sync::Syncing(_)) {
            return self.after(XferState::Done, Op::CheckXfer);
        }
        let s = self.inner.check()?;
        self.after(s, Op::CheckXfer)
    }

    fn cancel(&mut self) -> Result<()> {
        // A sync in progress finishes on its own thread; the request is no longer waited on.
        self.sync = Sync::Writing;
        self.inner.cancel()
    }

    fn abandon(&mut self) {
        self.inner.abandon();
    }

    fn path(&self) -> Option<String> {
        self.inner
            .path()
            .map(|p| format!("{p}, durable (fdatasync before done)"))
    }
}
