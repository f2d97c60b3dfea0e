//! GDS transfers: synchronous `cuFileRead`/`cuFileWrite` for short lists, the batch API
//! (submit, poll with a zero timeout, cancel) for long ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::backend::{BackendXfer, MdTable, XferSpec};
use nixl_core::{Error, Op, Result, XferOp, XferState};
use nixl_mem::cufile::{status, Batch, BatchEvent, BatchIo, Driver};

use super::{BufMd, FileMd, GdsParams, GDS, STORAGE};
use crate::sys::gpu;

/// One I/O: `len` bytes between `base + buf_off` and `file_off` of `file`.
#[derive(Clone)]
struct Io {
    base: u64,
    buf_off: u64,
    /// A file registered with cuFile (checked when the request is created).
    file: Arc<FileMd>,
    file_off: u64,
    len: u64,
}

/// A prepared GDS request.
pub(crate) struct GdsXfer {
    agent: String,
    op: XferOp,
    ios: Vec<Io>,
    mode: String,
    batch: Option<BatchState>,
    cancel_timeout: Duration,
    _keep: MdTable,
}

struct BatchState {
    batch: Batch,
    cap: usize,
    /// Next io to submit.
    next: usize,
    /// Submitted and not yet reported.
    inflight: usize,
    completed: usize,
    events: Vec<BatchEvent>,
    error: Option<Error>,
}

impl GdsXfer {
    /// Checks the segments, sets up a batch for long lists, and boxes the request.
    pub(super) fn create(
        agent: &str,
        drv: &Driver,
        p: &GdsParams,
        spec: &XferSpec,
        mode: String,
    ) -> Result<Box<dyn BackendXfer>> {
        STORAGE.check_request(agent, spec)?;
        let mut ios = Vec::with_capacity(spec.segments.len());
        for (i, s) in spec.segments.iter().enumerate() {
            let (_, b) =
                STORAGE.segment_md::<BufMd>(agent, (i, "local"), spec.md(s.local_md), "")?;
            let file = STORAGE.segment_arc::<FileMd>(
                agent,
                (i, "target"),
                spec.md(s.remote_md),
                "file",
            )?;
            if file.handle().is_none() {
                return Err(Error::invalid(
                    agent,
                    Op::MakeXfer,
                    format!("segment {i}: the file has no cuFile handle (fallback mode)"),
                ));
            }
            ios.push(Io {
                base: b.addr,
                buf_off: s.local_addr - b.addr,
                file,
                file_off: s.remote_addr,
                len: s.len,
            });
        }
        let keep = spec.mds.clone();
        let batch = if ios.len() >= p.batch_threshold.max(1) {
            let cap = ios.len().min(p.max_batch.max(1));
            let batch = Batch::new(drv, cap).map_err(|e| e.into_error(agent, GDS, Op::MakeXfer))?;
            Some(BatchState {
                batch,
                cap,
                next: 0,
                inflight: 0,
                completed: 0,
                events: Vec::with_capacity(cap),
                error: None,
            })
        } else {
            None
        };
        Ok(Box::new(GdsXfer {
            agent: agent.to_owned(),
            op: spec.op,
            ios,
            mode,
            batch,
            cancel_timeout: p.cancel_timeout,
            _keep: keep,
        }))
    }

    fn run_sync(&self) -> Result<()> {
        for io in &self.ios {
            let mut done = 0u64;
            while done < io.len {
                let len = (io.len - done) as usize;
                let (foff, boff) = (
                    (io.file_off + done) as libc::off_t,
                    (io.buf_off + done) as libc::off_t,
                );
                let Some(fh) = io.file.handle() else {
                    return Err(Error::invalid(
                        &self.agent,
                        Op::PostXfer,
                        "the file has no cuFile handle (fallback mode)",
                    ));
                };
                // Crate invariant: the buffer is a registration kept alive by the request; the
                // file handle is registered and held in `ios` and `_keep`.
                let n = gpu::file_io(fh, self.op == XferOp::Write, io.base, len, foff, boff);
                if n < 0 {
                    let why = if n == -1 {
                        std::io::Error::last_os_error().to_string()
                    } else {
                        format!("cuFile error {}", -n)
                    };
                    return Err(Error::backend(
                        &self.agent,
                        GDS,
                        Op::PostXfer,
                        format!("cuFile {:?} at file offset {foff}: {why}", self.op),
                    ));
                }
                if n == 0 {
                    return Err(Error::backend(
                        &self.agent,
                        GDS,
                        Op::PostXfer,
                        format!("end of file at offset {foff}"),
                    ));
                }
                done += n as u64;
            }
        }
        Ok(())
    }

    fn submit_more(&mut self) {
        let (agent, write) = (self.agent.as_str(), self.op == XferOp::Write);
        let Some(b) = &mut self.batch else { return };
        if b.error.is_some() || b.inflight > 0 || b.next >= self.ios.len() {
            return;
        }
        let end = (b.next + b.cap).min(self.ios.len());
        let mut entries = Vec::with_capacity(end - b.next);
        for (k, io) in self.ios[b.next..end].iter().enumerate() {
            let Some(file) = io.file.handle() else {
                b.error = Some(Error::invalid(
                    agent,
                    Op::PostXfer,
                    "the file has no cuFile handle (fallback mode)",
                ));
                return;
            };
            entries.push(BatchIo {
                file,
                base: io.base,
                buf_off: io.buf_off as i64,
                file_off: io.file_off as i64,
                len: io.len as usize,
                write,
                cookie: b.next + k,
            });
        }
        // Crate invariant: the entries name registrations the request keeps alive (`ios`,
        // `_keep`); the batch has none in flight and room for them.
        if let Err(e) = gpu::submit(&mut b.batch, &entries) {
            b.error = Some(e.into_error(agent, GDS, Op::PostXfer));
            return;
        }
        b.inflight = entries.len();
        b.next = end;
    }

    fn poll(&mut self) {
        let agent = self.agent.as_str();
        let Some(b) = &mut self.batch else { return };
        if b.inflight == 0 {
            return;
        }
        if let Err(e) = b.batch.poll(&mut b.events) {
            b.error
                .get_or_insert_with(|| e.into_error(agent, GDS, Op::CheckXfer));
            return;
        }
        for ev in &b.events {
            match ev.status {
                status::COMPLETE => {
                    b.inflight = b.inflight.saturating_sub(1);
                    b.completed += 1;
                }
                status::FAILED | status::CANCELED | status::INVALID | status::TIMEOUT => {
                    b.inflight = b.inflight.saturating_sub(1);
                    let idx = ev.cookie;
                    b.error.get_or_insert_with(|| {
                        Error::backend(
                            agent,
                            GDS,
                            Op::CheckXfer,
                            format!(
                                "batch entry {idx} ended with status {:#x} (ret {})",
                                ev.status, ev.ret
                            ),
                        )
                    });
                }
                _ => {}
            }
        }
    }

    fn batch_state(&mut self) -> Result<XferState> {
        self.poll();
        self.submit_more();
        let total = self.ios.len();
        let Some(b) = &mut self.batch else {
            return Ok(XferState::Done);
        };
        if b.inflight > 0 {
            return Ok(XferState::InProgress);
        }
        if let Some(e) = b.error.take() {
            return Err(e);
        }
        if b.completed >= total {
            Ok(XferState::Done)
        } else {
            Ok(XferState::InProgress)
        }
    }
}

impl BackendXfer for GdsXfer {
    fn post(&mut self) -> Result<XferState> {
        match &mut self.batch {
            None => self.run_sync().map(|()| XferState::Done),
            Some(b) => {
                if b.inflight > 0 {
                    return Err(Error::RepostActive {
                        agent: self.agent.clone(),
                        op: Op::PostXfer,
                    });
                }
                b.next = 0;
                b.completed = 0;
                b.error = None;
                self.submit_more();
                self.batch_state()
            }
        }
    }

    fn check(&mut self) -> Result<XferState> {
        self.batch_state()
    }

    fn cancel(&mut self) -> Result<()> {
        let Some(b) = &mut self.batch else {
            return Ok(());
        };
        if b.inflight == 0 {
            return Ok(());
        }
        b.next = self.ios.len();
        if let Err(e) = b.batch.cancel() {
            tracing::debug!(agent = %self.agent, error = %e, "GDS: cuFileBatchIOCancel failed; waiting for the entries");
        }
        let deadline = Instant::now() + self.cancel_timeout;
        loop {
            self.poll();
            let inflight = self.batch.as_ref().map_or(0, |b| b.inflight);
            if inflight == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::TimedOut {
                    agent: self.agent.clone(),
                    op: Op::Cancel,
                    elapsed: self.cancel_timeout,
                });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    fn path(&self) -> Option<String> {
        Some(format!(
            "{} ({})",
            self.mode,
            if self.batch.is_some() {
                "batch API"
            } else {
                "cuFileRead/Write"
            }
        ))
    }
}

impl Drop for GdsXfer {
    fn drop(&mut self) {
        if self.batch.as_ref().is_some_and(|b| b.inflight > 0) && self.cancel().is_err() {
            tracing::error!(agent = %self.agent, "GDS: batch entries still in flight; leaking the batch");
            // cuFile may still use the buffers and files: keep them registered, and the batch
            // undestroyed, for the life of the process.
            std::mem::forget(std::mem::take(&mut self._keep));
            std::mem::forget(std::mem::take(&mut self.ios));
            if let Some(b) = self.batch.take() {
                std::mem::forget(b.batch);
            }
        }
        // Otherwise nothing is in flight: the batch is destroyed with the request.
    }
}
