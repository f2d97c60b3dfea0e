//! GDS transfers: synchronous `cuFileRead`/`cuFileWrite` for short lists, the batch API
//! (submit, poll with a zero timeout, cancel) for long ones.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::backend::{downcast_md, BackendMd, BackendXfer, XferSpec};
use nixl_core::{Error, MemKind, Op, Result, XferOp, XferState};

use super::{sys, BufMd, Driver, FileMd, GdsParams, GDS};

/// One I/O: `len` bytes between `base + buf_off` and `file_off` of `fh`.
#[derive(Clone, Copy)]
struct Io {
    base: u64,
    buf_off: u64,
    fh: sys::CUfileHandle_t,
    file_off: u64,
    len: u64,
}

/// A prepared GDS request.
pub(crate) struct GdsXfer {
    agent: String,
    drv: Arc<Driver>,
    op: XferOp,
    ios: Vec<Io>,
    mode: String,
    batch: Option<Batch>,
    cancel_timeout: Duration,
    _keep: Vec<BackendMd>,
}

struct Batch {
    handle: sys::CUfileBatchHandle_t,
    cap: usize,
    /// Next io to submit.
    next: usize,
    /// Submitted and not yet reported.
    inflight: usize,
    completed: usize,
    params: Vec<sys::CUfileIOParams_t>,
    events: Vec<sys::CUfileIOEvents_t>,
    error: Option<Error>,
}

// SAFETY: the raw cuFile handles are opaque tokens usable from any thread; the buffers they
// name are kept alive by `_keep` and the agent's registrations.
unsafe impl Send for GdsXfer {}

fn cufile_err(agent: &str, op: Op, what: &str, st: sys::CUfileError_t) -> Error {
    Error::backend(
        agent,
        GDS,
        op,
        format!("{what}: cuFile error {} (CUresult {})", st.err, st.cu_err),
    )
}

/// Checks what GDS can move at all: local DRAM/VRAM <-> FILE, no notification.
pub(crate) fn check_spec(agent: &str, spec: &XferSpec) -> Result<()> {
    if !spec.is_local {
        return Err(Error::not_supported(
            agent,
            Op::MakeXfer,
            "GDS moves data between this agent's memory and its files only",
        ));
    }
    if !matches!(spec.local_kind, MemKind::Dram | MemKind::Vram)
        || spec.remote_kind != MemKind::File
    {
        return Err(Error::not_supported(
            agent,
            Op::MakeXfer,
            format!(
                "GDS moves DRAM/VRAM <-> FILE, not {} <-> {}",
                spec.local_kind, spec.remote_kind
            ),
        ));
    }
    if spec.notif.is_some() {
        return Err(Error::not_supported(
            agent,
            Op::MakeXfer,
            "GDS has no notifications",
        ));
    }
    Ok(())
}

impl GdsXfer {
    /// Checks the segments, sets up a batch for long lists, and boxes the request.
    pub fn create(
        agent: &str,
        drv: Arc<Driver>,
        p: &GdsParams,
        spec: &XferSpec,
        mode: String,
    ) -> Result<Box<dyn BackendXfer>> {
        check_spec(agent, spec)?;
        let mut ios = Vec::with_capacity(spec.segments.len());
        for (i, s) in spec.segments.iter().enumerate() {
            let b = spec
                .md(s.local_md)
                .and_then(downcast_md::<BufMd>)
                .ok_or_else(|| {
                    Error::invalid(
                        agent,
                        Op::MakeXfer,
                        format!("segment {i}: local metadata is not GDS's"),
                    )
                })?;
            let f = spec
                .md(s.remote_md)
                .and_then(downcast_md::<FileMd>)
                .ok_or_else(|| {
                    Error::invalid(
                        agent,
                        Op::MakeXfer,
                        format!("segment {i}: target is not a GDS file"),
                    )
                })?;
            let fh = f.handle.ok_or_else(|| {
                Error::invalid(
                    agent,
                    Op::MakeXfer,
                    format!("segment {i}: the file has no cuFile handle (fallback mode)"),
                )
            })?;
            ios.push(Io {
                base: b.addr,
                buf_off: s.local_addr - b.addr,
                fh,
                file_off: s.remote_addr,
                len: s.len,
            });
        }
        let keep = spec.mds.clone();
        let batch = if ios.len() >= p.batch_threshold.max(1) {
            let cap = ios.len().min(p.max_batch.max(1));
            let mut handle = std::ptr::null_mut();
            // SAFETY: the out-pointer is valid; `cap` is within cuFile's batch limit.
            let st = unsafe { (drv.cufile.cuFileBatchIOSetUp)(&mut handle, cap as u32) };
            if st.err != sys::CU_FILE_SUCCESS {
                return Err(cufile_err(agent, Op::MakeXfer, "cuFileBatchIOSetUp", st));
            }
            Some(Batch {
                handle,
                cap,
                next: 0,
                inflight: 0,
                completed: 0,
                params: Vec::with_capacity(cap),
                // SAFETY: CUfileIOEvents_t is plain data (a pointer and integers); all-zero is valid.
                events: vec![unsafe { std::mem::zeroed() }; cap],
                error: None,
            })
        } else {
            None
        };
        Ok(Box::new(GdsXfer {
            agent: agent.to_owned(),
            drv,
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
                let n = match self.op {
                    // SAFETY: the buffer is a registration kept alive by the request; the file
                    // handle is registered and held in `_keep`; cuFile writes `len` bytes at most.
                    XferOp::Read => unsafe {
                        (self.drv.cufile.cuFileRead)(io.fh, io.base as *mut c_void, len, foff, boff)
                    },
                    // SAFETY: as above; cuFileWrite only reads the buffer.
                    XferOp::Write => unsafe {
                        (self.drv.cufile.cuFileWrite)(
                            io.fh,
                            io.base as *const c_void,
                            len,
                            foff,
                            boff,
                        )
                    },
                };
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
        let (agent, op, drv) = (self.agent.clone(), self.op, self.drv.clone());
        let Some(b) = &mut self.batch else { return };
        if b.error.is_some() || b.inflight > 0 || b.next >= self.ios.len() {
            return;
        }
        let end = (b.next + b.cap).min(self.ios.len());
        b.params.clear();
        for (k, io) in self.ios[b.next..end].iter().enumerate() {
            b.params.push(sys::CUfileIOParams_t {
                mode: sys::CUFILE_BATCH,
                devPtr_base: io.base as *mut c_void,
                file_offset: io.file_off as libc::off_t,
                devPtr_offset: io.buf_off as libc::off_t,
                size: io.len as usize,
                fh: io.fh,
                opcode: if op == XferOp::Read {
                    sys::CUFILE_READ
                } else {
                    sys::CUFILE_WRITE
                },
                cookie: (b.next + k) as *mut c_void,
            });
        }
        let n = b.params.len() as u32;
        // SAFETY: `params` holds `n` entries naming live registrations; the batch handle was
        // set up for `cap >= n` entries and has none in flight.
        let st = unsafe { (drv.cufile.cuFileBatchIOSubmit)(b.handle, n, b.params.as_mut_ptr(), 0) };
        if st.err != sys::CU_FILE_SUCCESS {
            b.error = Some(cufile_err(&agent, Op::PostXfer, "cuFileBatchIOSubmit", st));
            return;
        }
        b.inflight = n as usize;
        b.next = end;
    }

    fn poll(&mut self) {
        let (agent, drv) = (self.agent.clone(), self.drv.clone());
        let Some(b) = &mut self.batch else { return };
        if b.inflight == 0 {
            return;
        }
        let mut nr = b.cap as u32;
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `events` has room for `cap` entries and `nr` says so; a zero timeout polls.
        let st = unsafe {
            (drv.cufile.cuFileBatchIOGetStatus)(
                b.handle,
                0,
                &mut nr,
                b.events.as_mut_ptr(),
                &mut ts,
            )
        };
        if st.err != sys::CU_FILE_SUCCESS {
            b.error.get_or_insert_with(|| {
                cufile_err(&agent, Op::CheckXfer, "cuFileBatchIOGetStatus", st)
            });
            return;
        }
        for ev in &b.events[..(nr as usize).min(b.cap)] {
            match ev.status {
                sys::CUFILE_COMPLETE => {
                    b.inflight = b.inflight.saturating_sub(1);
                    b.completed += 1;
                }
                sys::CUFILE_FAILED
                | sys::CUFILE_CANCELED
                | sys::CUFILE_INVALID
                | sys::CUFILE_TIMEOUT => {
                    b.inflight = b.inflight.saturating_sub(1);
                    let idx = ev.cookie as usize;
                    b.error.get_or_insert_with(|| {
                        Error::backend(
                            &agent,
                            GDS,
                            Op::CheckXfer,
                            format!(
                                "batch entry {idx} ended with status {:#x} (ret {})",
                                ev.status, ev.ret as isize
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
        let drv = self.drv.clone();
        let Some(b) = &mut self.batch else {
            return Ok(());
        };
        if b.inflight == 0 {
            return Ok(());
        }
        b.next = self.ios.len();
        // SAFETY: the handle is valid; cancel asks cuFile to stop the entries in flight.
        let _ = unsafe { (drv.cufile.cuFileBatchIOCancel)(b.handle) };
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
            std::mem::forget(std::mem::take(&mut self._keep));
            return;
        }
        if let Some(b) = &self.batch {
            // SAFETY: nothing is in flight on the handle, which is destroyed once.
            unsafe { (self.drv.cufile.cuFileBatchIODestroy)(b.handle) };
        }
    }
}
