//! A request's plan: its segments as file ranges and local memory, cut into chunks.

#![allow(unused_imports)]
use super::*;

/// One piece of I/O: `len` bytes between the buffer at `buf` and offset `off` of `fd`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chunk {
    pub fd: RawFd,
    pub buf: u64,
    pub off: u64,
    pub len: u64,
    /// For a VRAM chunk, the index of its context in the plan's [`VramSide::ctxs`]; `buf` is
    /// then a device address.
    pub gpu: Option<u32>,
}

/// The local side of a segment to plan.
pub(crate) enum LocalMem<'a> {
    /// Host memory.
    Dram,
    /// Device memory of the context's GPU.
    Vram(&'a Context),
}

/// One segment to plan, described by whichever backend registered it (POSIX, or GDS for its
/// fallback).
pub(crate) struct PlanSeg<'a> {
    pub local: LocalMem<'a>,
    pub local_addr: u64,
    pub fd: RawFd,
    pub direct: bool,
    pub path: Option<&'a PathBuf>,
    /// The device id the caller's descriptors name (its file descriptor number).
    pub remote_dev: u64,
    /// The file's metadata, kept by the plan so the descriptor stays open.
    pub file_md: &'a BackendMd,
    pub remote_addr: u64,
    pub len: u64,
    /// For an `O_DIRECT` file: its device's one-request limits (see [`limits`]).
    pub direct_chunk: Option<limits::DirectLimits>,
}

/// What a prepared POSIX transfer moves, shared by both engines.
#[derive(Clone)]
pub(crate) struct Plan {
    pub agent: String,
    /// The backend name used in errors.
    pub backend: &'static str,
    pub op: XferOp,
    pub chunks: Vec<Chunk>,
    /// Files read by the request, with the end of the furthest read (checked against the file
    /// size at each post).
    pub read_ends: Vec<(RawFd, u64, Option<PathBuf>)>,
    pub direct: bool,
    /// The largest chunk (bytes), for path reports.
    pub max_chunk: u64,
    /// When the chunks assume buffers registered with an io_uring: the chunk size for an
    /// engine that pins pages per I/O instead (see [`Plan::rechunk_unregistered`]).
    pub unregistered_chunk: Option<u64>,
    pub cancel_timeout: Duration,
    /// Keeps the duplicated descriptors open while the request lives.
    pub files: Vec<BackendMd>,
    /// How errors name each (duplicated) descriptor: the caller's device id and path.
    pub file_names: Vec<(RawFd, String)>,
    /// Staging buffers and contexts, for a VRAM request.
    pub vram: Option<Arc<VramSide>>,
}

impl Plan {
    /// Splits host-memory chunks to the size an engine that pins pages at each I/O should use
    /// (the thread pool, or io_uring when the buffers could not be registered); a no-op when
    /// the chunks did not assume registered buffers.
    pub(crate) fn rechunk_unregistered(&mut self) {
        let Some(limit) = self.unregistered_chunk.take() else {
            return;
        };
        let mut out = Vec::with_capacity(self.chunks.len());
        for c in self.chunks.drain(..) {
            if c.gpu.is_some() || c.len <= limit {
                out.push(c);
                continue;
            }
            let mut done = 0;
            while done < c.len {
                let len = (c.len - done).min(limit);
                out.push(Chunk {
                    buf: c.buf + done,
                    off: c.off + done,
                    len,
                    ..c
                });
                done += len;
            }
        }
        self.chunks = out;
        self.max_chunk = self.chunks.iter().map(|c| c.len).max().unwrap_or(0);
    }

    /// Refuses a READ past the current end of a file (instead of a short read later).
    pub(crate) fn check_file_sizes(&self) -> Result<()> {
        for (fd, end, path) in &self.read_ends {
            let size = fd_size(*fd).map_err(|e| Error::io(&self.agent, Op::PostXfer, e))?;
            if *end > size {
                let name = path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| format!("fd {fd}"));
                return Err(Error::invalid(
                    &self.agent,
                    Op::PostXfer,
                    format!("READ up to offset {end} is past the end of {name} ({size} bytes)"),
                ));
            }
        }
        Ok(())
    }

    /// Which chunks a failed request completed, as file byte ranges per descriptor: what a
    /// partial failure left written (or read), for its error.
    pub(crate) fn completed_summary(&self, completed: impl Fn(usize) -> bool) -> String {
        let mut ranges: Vec<(RawFd, u64, u64)> = Vec::new();
        let mut n = 0;
        for (i, c) in self.chunks.iter().enumerate() {
            if !completed(i) {
                continue;
            }
            n += 1;
            match ranges.last_mut() {
                Some((fd, _, end)) if *fd == c.fd && *end == c.off => *end += c.len,
                _ => ranges.push((c.fd, c.off, c.off + c.len)),
            }
        }
        let verb = if self.op == XferOp::Write {
            "written"
        } else {
            "read"
        };
        if n == 0 {
            return format!("no chunk of {} was {verb}", self.chunks.len());
        }
        let list: Vec<String> = ranges
            .iter()
            .take(8)
            .map(|(fd, a, b)| format!("{} bytes [{a}, {b})", self.file_name(*fd)))
            .collect();
        let more = if ranges.len() > 8 {
            format!(" and {} more ranges", ranges.len() - 8)
        } else {
            String::new()
        };
        format!(
            "{n} of {} chunks were {verb} before it: {}{more}",
            self.chunks.len(),
            list.join(", ")
        )
    }

    /// How errors name a descriptor of the plan.
    fn file_name(&self, fd: RawFd) -> String {
        self.file_names
            .iter()
            .find(|(d, _)| *d == fd)
            .map_or_else(|| format!("fd {fd}"), |(_, n)| n.clone())
    }

    /// `e` with what the request completed before it failed.
    pub(crate) fn with_completed(&self, e: Error, completed: impl Fn(usize) -> bool) -> Error {
        let what = self.completed_summary(completed);
        match e {
            Error::Io { agent, op, source } => Error::Io {
                agent,
                op,
                source: Arc::new(std::io::Error::new(
                    source.kind(),
                    format!("{source}; {what}"),
                )),
            },
            Error::Backend {
                agent,
                backend,
                op,
                message,
                source,
            } => Error::Backend {
                agent,
                backend,
                op,
                message: format!("{message}; {what}"),
                source,
            },
            other => other,
        }
    }

    /// The path string of a request.
    pub(crate) fn describe(&self, engine: &str) -> String {
        format!(
            "{engine}, chunks up to {} KiB{}",
            self.max_chunk >> 10,
            if self.direct {
                " (O_DIRECT)"
            } else {
                " (page cache)"
            }
        )
    }
}

fn fd_size(fd: RawFd) -> std::io::Result<u64> {
    let st = sysfd::fstat(fd)?;
    if st.st_mode & libc::S_IFMT == libc::S_IFBLK {
        return sysfd::block_device_size(fd);
    }
    Ok(u64::try_from(st.st_size).unwrap_or(0))
}

/// Plans chunks of a transfer: checks `O_DIRECT` alignment (file offset and length; the buffer
/// address too for DRAM), splits DRAM segments into `chunk_size` chunks and VRAM segments into
/// `bounce_chunk` chunks, and allocates the engine's staging buffers for VRAM.
pub(crate) fn build_plan(
    engine: &PoolEngine,
    agent: &str,
    backend: &'static str,
    op: XferOp,
    segs: &[PlanSeg<'_>],
) -> Result<Plan> {
    let p = engine.params();
    let align = p.direct_alignment;
    let mut chunks = Vec::new();
    let mut files: Vec<BackendMd> = Vec::new();
    let mut read_ends: Vec<(RawFd, u64, Option<PathBuf>)> = Vec::new();
    let mut file_names: Vec<(RawFd, String)> = Vec::new();
    let mut ctxs: Vec<Context> = Vec::new();
    let mut direct = false;
    let mut max_chunk = 0;
    let mut unregistered_chunk: Option<u64> = None;
    for (i, s) in segs.iter().enumerate() {
        let end = s
            .remote_addr
            .checked_add(s.len)
            .ok_or_else(|| Error::invalid(agent, Op::MakeXfer, format!("segment {i} overflows")))?;
        if s.direct {
            direct = true;
            check_direct_alignment(agent, i, s, align)?;
        }
        // Neighbours usually share a file; `distinct_mds` below keeps the list linear.
        if !files.last().is_some_and(|m| Arc::ptr_eq(m, s.file_md)) {
            files.push(s.file_md.clone());
        }
        if file_names.last().is_none_or(|(fd, _)| *fd != s.fd) {
            file_names.push((s.fd, s.name()));
        }
        if op == XferOp::Read {
            note_read_end(&mut read_ends, s, end);
        }
        let (step, gpu) = match s.local {
            LocalMem::Dram => (dram_step(p, s, &mut unregistered_chunk), None),
            LocalMem::Vram(ctx) => {
                let idx = match ctxs.iter().position(|c| c.ordinal() == ctx.ordinal()) {
                    Some(k) => k,
                    None => {
                        ctxs.push((*ctx).clone());
                        ctxs.len() - 1
                    }
                };
                (p.bounce_chunk, Some(idx as u32))
            }
        };
        max_chunk = max_chunk.max(step.min(s.len));
        s.push_chunks(step, gpu, &mut chunks);
    }
    if chunks.is_empty() {
        return Err(Error::invalid(agent, Op::MakeXfer, "no segments"));
    }
    let vram = match ctxs.first() {
        None => None,
        Some(first) => Some(Arc::new(VramSide {
            staging: engine.staging(agent, first)?,
            ctxs,
        })),
    };
    Ok(Plan {
        agent: agent.to_owned(),
        backend,
        op,
        chunks,
        read_ends,
        file_names,
        direct,
        max_chunk,
        unregistered_chunk,
        cancel_timeout: p.cancel_timeout,
        files: nixl_core::backend::distinct_mds(&files),
        vram,
    })
}

/// `O_DIRECT` needs the file offset and the length (and a DRAM buffer's address) aligned.
fn check_direct_alignment(agent: &str, i: usize, s: &PlanSeg<'_>, align: u64) -> Result<()> {
    let mut checks = vec![("file offset", s.remote_addr), ("length", s.len)];
    if matches!(s.local, LocalMem::Dram) {
        checks.push(("buffer address", s.local_addr));
    }
    for (what, v) in checks {
        if v % align != 0 {
            return Err(Error::invalid(
                agent,
                Op::MakeXfer,
                format!(
                    "segment {i}: {what} {v:#x} is not a multiple of {align} as O_DIRECT requires"
                ),
            ));
        }
    }
    Ok(())
}

/// The chunk size of a DRAM segment: the configured one, else for `O_DIRECT` the device's
/// one-request limit for registered buffers (noting in `unregistered` the smaller limit an
/// engine that pins pages per I/O must use), else the default.
fn dram_step(p: &PosixParams, s: &PlanSeg<'_>, unregistered: &mut Option<u64>) -> u64 {
    match (p.chunk_size, s.direct_chunk) {
        (Some(c), _) => c,
        (None, Some(l)) if s.direct => {
            if l.paged < l.registered {
                *unregistered = Some(unregistered.map_or(l.paged, |u| u.min(l.paged)));
            }
            l.registered
        }
        _ => DEFAULT_CHUNK,
    }
}

/// Files read by a request, with the end of the furthest read (checked against the file size
/// at each post).
fn note_read_end(read_ends: &mut Vec<(RawFd, u64, Option<PathBuf>)>, s: &PlanSeg<'_>, end: u64) {
    match read_ends.iter_mut().find(|(d, _, _)| *d == s.fd) {
        Some(e) => e.1 = e.1.max(end),
        None => read_ends.push((s.fd, end, s.path.cloned())),
    }
}

impl<'a> PlanSeg<'a> {
    /// Cuts the segment into chunks of at most `step` bytes.
    fn push_chunks(&self, step: u64, gpu: Option<u32>, chunks: &mut Vec<Chunk>) {
        let mut done = 0;
        while done < self.len {
            let len = (self.len - done).min(step);
            chunks.push(Chunk {
                fd: self.fd,
                buf: self.local_addr + done,
                off: self.remote_addr + done,
                len,
                gpu,
            });
            done += len;
        }
    }

    /// How errors name the segment's file: the caller's device id, and its path if known.
    fn name(&self) -> String {
        match self.path {
            Some(p) => format!("device id {} ({})", self.remote_dev, p.display()),
            None => format!("device id {}", self.remote_dev),
        }
    }

    /// A segment of a spec whose target is the file `fd`.
    pub(crate) fn new(
        local: LocalMem<'a>,
        s: &nixl_core::backend::Segment,
        file_md: &'a BackendMd,
        fd: RawFd,
        direct: bool,
        path: Option<&'a PathBuf>,
    ) -> Self {
        PlanSeg {
            local,
            local_addr: s.local_addr,
            fd,
            direct,
            path,
            remote_dev: s.remote_dev,
            file_md,
            remote_addr: s.remote_addr,
            len: s.len,
            direct_chunk: None,
        }
    }

    /// Chunks DRAM segments of an `O_DIRECT` file at its device's one-request limit when
    /// [`PosixParams::chunk_size`] is `None`.
    pub(crate) fn with_direct_chunk(mut self, chunk: Option<limits::DirectLimits>) -> Self {
        self.direct_chunk = chunk;
        self
    }
}
