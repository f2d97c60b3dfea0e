//! `POSIX`: DRAM <-> FILE transfers through io_uring, or a thread pool of `pread`/`pwrite`
//! where io_uring is unavailable.
//!
//! A FILE registration duplicates the region's descriptor (so the backend owns what it reads
//! and writes), notes whether it was opened with `O_DIRECT`, and becomes the transfer target of
//! the agent's local (loopback) requests. Preparing a transfer checks everything that would
//! otherwise fail later with `EINVAL`: memory kinds, `O_DIRECT` alignment of offsets, lengths
//! and buffers. Posting splits segments into chunks (for `O_DIRECT` files by default the largest
//! I/O the file's block device takes as one request, see [`PosixParams::chunk_size`]) and keeps
//! up to [`PosixParams::queue_depth`] of them in flight.
//!
//! VRAM <-> FILE (when GDS is absent) goes through pinned bounce buffers: VRAM registrations
//! load the CUDA driver on first use (`Unavailable` without one, so the agent leaves that
//! memory to other backends), and VRAM segments are split into chunks of
//! [`PosixParams::bounce_chunk`] that the pool's workers copy through
//! [`PosixParams::bounce_buffers`] page-aligned pinned buffers with `cuMemcpyAsync` on their
//! own non-blocking streams, then `pwrite` (or `pread` then copy). With `O_DIRECT` only the
//! file offsets and lengths of VRAM segments must be aligned (the staging is).

pub(crate) mod bounce;
mod limits;
pub(crate) mod pool;
mod uring;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::{
    downcast_md, Backend, BackendContext, BackendMd, BackendParams, BackendPlugin, BackendXfer,
    ParamMap, XferSpec,
};
use nixl_core::{Capabilities, Error, MemKind, Op, QueryResult, RegionDesc, Result, XferOp};

use nixl_mem::Context;

use crate::sys::fd as sysfd;
use bounce::{PoolEngine, VramMd, VramSide};

/// The backend's type name.
pub const POSIX: &str = "POSIX";

/// Chunk size for page-cache files and where a device's limits are unknown.
const DEFAULT_CHUNK: u64 = 1 << 20;

/// Which I/O engine the backend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// io_uring when the kernel allows it (probed at creation), else the thread pool.
    #[default]
    Auto,
    /// io_uring only: creation fails with [`Error::Unavailable`] where it is not allowed.
    IoUring,
    /// A pool of threads doing `pread`/`pwrite`.
    ThreadPool,
}

/// Parameters of the POSIX backend.
#[derive(Debug, Clone)]
pub struct PosixParams {
    /// The I/O engine.
    pub engine: Engine,
    /// Chunks in flight per request (io_uring queue depth).
    pub queue_depth: u32,
    /// Segments are split into chunks of at most this many bytes (a multiple of
    /// `direct_alignment`, at most 1 GiB). `None` (the default): for `O_DIRECT` files, the
    /// largest I/O the file's block device takes as one request, `min(max_sectors_kb,
    /// max_segments x page size)` from sysfs (a bigger direct I/O is split by the block layer,
    /// and under io_uring a split can bounce the chunk to a kernel worker thread); 1 MiB for
    /// page-cache files and where the device limits cannot be read.
    pub chunk_size: Option<u64>,
    /// Threads of the fallback pool.
    pub pool_threads: usize,
    /// Alignment `O_DIRECT` files require of offsets, lengths and buffer addresses.
    pub direct_alignment: u64,
    /// How long cancel waits for chunks already in the kernel.
    pub cancel_timeout: Duration,
    /// Page-cache (not `O_DIRECT`) requests of at most this many bytes run synchronously
    /// inside post (a cached `pread`/`pwrite` is a memory copy; a hop to another thread only
    /// adds latency). 0 disables it.
    pub inline_max: u64,
    /// VRAM segments are split into chunks of at most this many bytes, each copied through
    /// one pinned staging buffer of this size (a non-zero multiple of `direct_alignment`, at
    /// most 1 GiB).
    pub bounce_chunk: u64,
    /// How many pinned staging buffers (allocated once, at the first VRAM transfer); `None`
    /// = one per pool thread, which lets every worker copy at once.
    pub bounce_buffers: Option<usize>,
}

impl Default for PosixParams {
    fn default() -> Self {
        PosixParams {
            engine: Engine::Auto,
            queue_depth: 64,
            chunk_size: None,
            pool_threads: 4,
            direct_alignment: 4096,
            cancel_timeout: Duration::from_secs(10),
            inline_max: 4 << 20,
            bounce_chunk: 8 << 20,
            bounce_buffers: None,
        }
    }
}

impl PosixParams {
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |r: &str| Err(Error::invalid("", Op::CreateBackend, format!("POSIX: {r}")));
        if self.queue_depth == 0 || self.queue_depth > 4096 {
            return bad("queue_depth must be in 1..=4096");
        }
        if !self.direct_alignment.is_power_of_two() || self.direct_alignment > 1 << 20 {
            return bad("direct_alignment must be a power of two of at most 1 MiB");
        }
        if self
            .chunk_size
            .is_some_and(|c| c == 0 || c > 1 << 30 || c % self.direct_alignment != 0)
        {
            return bad(
                "chunk_size must be a non-zero multiple of direct_alignment of at most 1 GiB",
            );
        }
        if self.pool_threads == 0 || self.pool_threads > 256 {
            return bad("pool_threads must be in 1..=256");
        }
        if self.bounce_chunk == 0
            || self.bounce_chunk > 1 << 30
            || !self.bounce_chunk.is_multiple_of(self.direct_alignment)
        {
            return bad(
                "bounce_chunk must be a non-zero multiple of direct_alignment of at most 1 GiB",
            );
        }
        if matches!(self.bounce_buffers, Some(n) if n == 0 || n > 256) {
            return bad("bounce_buffers must be in 1..=256");
        }
        Ok(())
    }
}

impl BackendParams for PosixParams {
    fn backend_name(&self) -> &str {
        POSIX
    }

    fn create(self: Box<Self>, ctx: BackendContext) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(PosixBackend::new(*self, ctx)?))
    }
}

/// Creates `POSIX` by name from string parameters: `engine` (`auto`, `io_uring`,
/// `threadpool`), `queue_depth`, `chunk_size` (bytes, or `auto`), `pool_threads`,
/// `direct_alignment`, `cancel_timeout_ms`, `inline_max`, `bounce_chunk`, `bounce_buffers` (a
/// number or `auto` = one per pool thread).
#[derive(Debug, Clone, Copy, Default)]
pub struct PosixPlugin;

impl BackendPlugin for PosixPlugin {
    fn name(&self) -> &str {
        POSIX
    }

    fn default_params(&self) -> BTreeMap<String, String> {
        let d = PosixParams::default();
        BTreeMap::from([
            ("engine".to_owned(), "auto".to_owned()),
            ("queue_depth".to_owned(), d.queue_depth.to_string()),
            (
                "chunk_size".to_owned(),
                d.chunk_size
                    .map_or_else(|| "auto".to_owned(), |c| c.to_string()),
            ),
            ("pool_threads".to_owned(), d.pool_threads.to_string()),
            (
                "direct_alignment".to_owned(),
                d.direct_alignment.to_string(),
            ),
            (
                "cancel_timeout_ms".to_owned(),
                d.cancel_timeout.as_millis().to_string(),
            ),
            ("inline_max".to_owned(), d.inline_max.to_string()),
            ("bounce_chunk".to_owned(), d.bounce_chunk.to_string()),
            ("bounce_buffers".to_owned(), "auto".to_owned()),
        ])
    }

    fn parse_params(&self, params: &BTreeMap<String, String>) -> Result<Box<dyn BackendParams>> {
        let mut m = ParamMap::new(POSIX, params);
        let mut p = PosixParams::default();
        let engines = [
            ("auto", Engine::Auto),
            ("io_uring", Engine::IoUring),
            ("uring", Engine::IoUring),
            ("threadpool", Engine::ThreadPool),
            ("posix", Engine::ThreadPool),
        ];
        if let Some(e) = m.choice("engine", &engines)? {
            p.engine = e;
        }
        if let Some(q) = m.parse("queue_depth", "a queue depth (u32)")? {
            p.queue_depth = q;
        }
        if let Some(c) = m.auto("chunk_size", "auto or a size in bytes")? {
            p.chunk_size = c;
        }
        if let Some(n) = m.usize("pool_threads")? {
            p.pool_threads = n;
        }
        if let Some(n) = m.u64("direct_alignment")? {
            p.direct_alignment = n;
        }
        if let Some(d) = m.millis("cancel_timeout_ms")? {
            p.cancel_timeout = d;
        }
        if let Some(n) = m.u64("inline_max")? {
            p.inline_max = n;
        }
        if let Some(n) = m.u64("bounce_chunk")? {
            p.bounce_chunk = n;
        }
        if let Some(n) = m.auto("bounce_buffers", "auto or a count")? {
            p.bounce_buffers = n;
        }
        m.finish()?;
        p.validate()?;
        Ok(Box::new(p))
    }
}

/// Backend metadata of a registered DRAM region.
struct DramMd;

/// Backend metadata of a registered file: the backend's own duplicate of its descriptor.
pub(crate) struct FileMd {
    fd: OwnedFd,
    direct: bool,
    /// For `O_DIRECT` files: the device's one-request limits (see [`limits`]).
    direct_chunk: Option<limits::DirectLimits>,
    path: Option<PathBuf>,
}

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
    /// Staging buffers and contexts, for a VRAM request.
    pub vram: Option<Arc<VramSide>>,
}

impl Plan {
    /// Splits host-memory chunks to the size an engine that pins pages at each I/O should use
    /// (the thread pool, or io_uring when the buffers could not be registered); a no-op when
    /// the chunks did not assume registered buffers.
    pub fn rechunk_unregistered(&mut self) {
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
    pub fn check_file_sizes(&self) -> Result<()> {
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

    /// The path string of a request.
    pub fn describe(&self, engine: &str) -> String {
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
            let mut checks = vec![("file offset", s.remote_addr), ("length", s.len)];
            if matches!(s.local, LocalMem::Dram) {
                checks.push(("buffer address", s.local_addr));
            }
            for (what, v) in checks {
                if v % align != 0 {
                    return Err(Error::invalid(agent, Op::MakeXfer, format!("segment {i}: {what} {v:#x} is not a multiple of {align} as O_DIRECT requires")));
                }
            }
        }
        // Neighbours usually share a file; `distinct_mds` below keeps the list linear.
        if !files.last().is_some_and(|m| Arc::ptr_eq(m, s.file_md)) {
            files.push(s.file_md.clone());
        }
        if op == XferOp::Read {
            match read_ends.iter_mut().find(|(d, _, _)| *d == s.fd) {
                Some(e) => e.1 = e.1.max(end),
                None => read_ends.push((s.fd, end, s.path.cloned())),
            }
        }
        let (step, gpu) = match s.local {
            LocalMem::Dram => (
                match (p.chunk_size, s.direct_chunk) {
                    (Some(c), _) => c,
                    (None, Some(l)) if s.direct => {
                        if l.paged < l.registered {
                            unregistered_chunk =
                                Some(unregistered_chunk.map_or(l.paged, |u| u.min(l.paged)));
                        }
                        l.registered
                    }
                    _ => DEFAULT_CHUNK,
                },
                None,
            ),
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
        let mut done = 0;
        while done < s.len {
            let len = (s.len - done).min(step);
            chunks.push(Chunk {
                fd: s.fd,
                buf: s.local_addr + done,
                off: s.remote_addr + done,
                len,
                gpu,
            });
            done += len;
        }
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
        direct,
        max_chunk,
        unregistered_chunk,
        cancel_timeout: p.cancel_timeout,
        files: nixl_core::backend::distinct_mds(&files),
        vram,
    })
}

impl<'a> PlanSeg<'a> {
    /// A segment of a spec whose target is the file `fd`.
    pub fn new(
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
            file_md,
            remote_addr: s.remote_addr,
            len: s.len,
            direct_chunk: None,
        }
    }

    /// Chunks DRAM segments of an `O_DIRECT` file at its device's one-request limit when
    /// [`PosixParams::chunk_size`] is `None`.
    pub fn with_direct_chunk(mut self, chunk: Option<limits::DirectLimits>) -> Self {
        self.direct_chunk = chunk;
        self
    }
}

/// The POSIX backend.
pub struct PosixBackend {
    agent: String,
    /// Why io_uring is not used, when it is not.
    uring_unavailable: Option<String>,
    engine: PoolEngine,
}

impl std::fmt::Debug for PosixBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PosixBackend")
            .field("agent", &self.agent)
            .field("engine", &self.engine_name())
            .finish()
    }
}

impl PosixBackend {
    /// Creates the backend, probing io_uring unless the thread pool was asked for. Nothing of
    /// CUDA is loaded here (only at the first VRAM registration).
    pub fn new(params: PosixParams, ctx: BackendContext) -> Result<Self> {
        params.validate().map_err(|e| match e {
            Error::InvalidParam { reason, op, .. } => Error::InvalidParam {
                agent: ctx.agent.clone(),
                op,
                reason,
            },
            other => other,
        })?;
        let uring_unavailable = match params.engine {
            Engine::ThreadPool => Some("the thread pool was requested".to_owned()),
            Engine::Auto | Engine::IoUring => uring::probe().err(),
        };
        if let (Engine::IoUring, Some(why)) = (params.engine, &uring_unavailable) {
            return Err(Error::Unavailable {
                what: "io_uring".to_owned(),
                hint: format!("{why}; use Engine::Auto or Engine::ThreadPool, or allow io_uring (sysctl kernel.io_uring_disabled=0, seccomp)"),
            });
        }
        if let Some(why) = &uring_unavailable {
            tracing::info!(agent = %ctx.agent, reason = %why, "POSIX: using the pread/pwrite thread pool");
        }
        Ok(PosixBackend {
            agent: ctx.agent,
            uring_unavailable,
            engine: PoolEngine::new(params),
        })
    }

    /// The engine in use: `"io_uring"` or `"thread-pool pread/pwrite"`.
    pub fn engine_name(&self) -> &'static str {
        if self.uring_unavailable.is_none() {
            "io_uring"
        } else {
            "thread-pool pread/pwrite"
        }
    }

    fn params(&self) -> &PosixParams {
        self.engine.params()
    }

    fn vram_label(&self) -> String {
        format!("{} (no GDS)", self.engine.vram_label())
    }

    fn plan(&self, spec: &XferSpec) -> Result<Plan> {
        let me = &self.agent;
        if !spec.is_local {
            return Err(Error::not_supported(
                me,
                Op::MakeXfer,
                "POSIX moves data between this agent's memory and its files only",
            ));
        }
        if !matches!(spec.local_kind, MemKind::Dram | MemKind::Vram) {
            return Err(Error::not_supported(
                me,
                Op::MakeXfer,
                format!(
                    "POSIX moves DRAM and VRAM to and from files, not {}",
                    spec.local_kind
                ),
            ));
        }
        if !matches!(spec.remote_kind, MemKind::File | MemKind::Block) {
            return Err(Error::not_supported(
                me,
                Op::MakeXfer,
                format!("POSIX targets FILE or BLOCK, not {}", spec.remote_kind),
            ));
        }
        if spec.notif.is_some() {
            return Err(Error::not_supported(
                me,
                Op::MakeXfer,
                "POSIX has no notifications",
            ));
        }
        let mut segs = Vec::with_capacity(spec.segments.len());
        for (i, s) in spec.segments.iter().enumerate() {
            let local = match spec.local_kind {
                MemKind::Vram => LocalMem::Vram(
                    &spec
                        .md(s.local_md)
                        .and_then(downcast_md::<VramMd>)
                        .ok_or_else(|| {
                            Error::invalid(
                                me,
                                Op::MakeXfer,
                                format!("segment {i}: local metadata is not POSIX VRAM"),
                            )
                        })?
                        .ctx,
                ),
                _ => {
                    spec.md(s.local_md)
                        .and_then(downcast_md::<DramMd>)
                        .ok_or_else(|| {
                            Error::invalid(
                                me,
                                Op::MakeXfer,
                                format!("segment {i}: local metadata is not POSIX DRAM"),
                            )
                        })?;
                    LocalMem::Dram
                }
            };
            let fmd = spec.md(s.remote_md).ok_or_else(|| {
                Error::invalid(me, Op::MakeXfer, format!("segment {i} names no metadata"))
            })?;
            let f = downcast_md::<FileMd>(fmd).ok_or_else(|| {
                Error::invalid(
                    me,
                    Op::MakeXfer,
                    format!("segment {i}: target metadata is not a POSIX file"),
                )
            })?;
            segs.push(
                PlanSeg::new(local, s, fmd, f.fd.as_raw_fd(), f.direct, f.path.as_ref())
                    .with_direct_chunk(f.direct_chunk),
            );
        }
        build_plan(&self.engine, me, POSIX, spec.op, &segs)
    }
}

impl Backend for PosixBackend {
    local_only_peer_methods!(POSIX, "POSIX files");

    fn name(&self) -> &str {
        POSIX
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            mem_kinds: vec![MemKind::Dram, MemKind::Vram, MemKind::File, MemKind::Block],
            remote: false,
            local: true,
            notifications: false,
            needs_progress: false,
        }
    }

    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        match region.kind {
            MemKind::Dram => Ok(Arc::new(DramMd)),
            MemKind::Vram => bounce::register_vram(&self.agent, POSIX, region),
            MemKind::File | MemKind::Block => {
                let raw = RawFd::try_from(region.dev_id).map_err(|_| {
                    Error::invalid(
                        &self.agent,
                        Op::RegisterMem,
                        format!("device id {} is not a file descriptor", region.dev_id),
                    )
                })?;
                let fd = sysfd::dup_cloexec(raw).map_err(|e| {
                    Error::invalid(
                        &self.agent,
                        Op::RegisterMem,
                        format!("device id {raw} is not an open file descriptor: {e}"),
                    )
                })?;
                let path = (!region.meta.is_empty())
                    .then(|| PathBuf::from(String::from_utf8_lossy(&region.meta).into_owned()));
                let direct = sysfd::is_direct(fd.as_fd());
                let direct_chunk = direct
                    .then(|| {
                        limits::direct_limits(
                            fd.as_raw_fd(),
                            self.params().direct_alignment,
                            1 << 30,
                        )
                    })
                    .flatten();
                if let Some(l) = direct_chunk {
                    tracing::debug!(agent = %self.agent, registered_kib = l.registered >> 10, paged_kib = l.paged >> 10, "POSIX: O_DIRECT chunks from the device's limits");
                }
                Ok(Arc::new(FileMd {
                    direct,
                    direct_chunk,
                    fd,
                    path,
                }))
            }
            k => Err(Error::not_supported(
                &self.agent,
                Op::RegisterMem,
                format!("POSIX registers DRAM, VRAM, FILE and BLOCK, not {k}"),
            )),
        }
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        if downcast_md::<DramMd>(&md).is_none()
            && downcast_md::<FileMd>(&md).is_none()
            && downcast_md::<VramMd>(&md).is_none()
        {
            return Err(Error::invalid(
                &self.agent,
                Op::DeregisterMem,
                "not POSIX metadata",
            ));
        }
        // Dropping the metadata closes the duplicate once no request holds it.
        drop(md);
        Ok(())
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        let plan = self.plan(spec)?;
        if plan.vram.is_some() {
            let pool = self.engine.pool(&self.agent)?;
            return Ok(Box::new(pool::PoolXfer::new(plan, pool, self.vram_label())));
        }
        if !plan.direct && spec.total_bytes() <= self.params().inline_max {
            return Ok(Box::new(pool::InlineXfer::new(plan)));
        }
        let why = match &self.uring_unavailable {
            None => match uring::UringXfer::new(plan.clone(), self.params().queue_depth) {
                Ok(x) => return Ok(Box::new(x)),
                Err(e) => {
                    tracing::warn!(agent = %self.agent, error = %e, "POSIX: io_uring setup failed; this request uses the thread pool");
                    format!("io_uring setup failed: {e}")
                }
            },
            Some(why) => why.clone(),
        };
        let label = format!(
            "thread-pool pread/pwrite x{} ({why})",
            self.params().pool_threads
        );
        // pread/pwrite pin pages per call: chunks at the device's segment limit.
        let mut plan = plan;
        plan.rechunk_unregistered();
        Ok(Box::new(pool::PoolXfer::new(
            plan,
            self.engine.pool(&self.agent)?,
            label,
        )))
    }

    fn path_report(&self, remote: &str) -> Option<String> {
        (remote == self.agent).then(|| {
            let dram = match &self.uring_unavailable {
                None => format!("io_uring, queue depth {}", self.params().queue_depth),
                Some(why) => format!(
                    "thread-pool pread/pwrite x{} ({why})",
                    self.params().pool_threads
                ),
            };
            // The VRAM path is named once CUDA is loaded (by a VRAM registration).
            if bounce::cuda_used() {
                format!("{dram}; VRAM: {}", self.vram_label())
            } else {
                dram
            }
        })
    }

    fn query(&self, region: &RegionDesc) -> Result<Option<QueryResult>> {
        if !matches!(region.kind, MemKind::File | MemKind::Block) {
            return Ok(None);
        }
        if region.meta.is_empty() {
            return Err(Error::invalid(
                &self.agent,
                Op::QueryMem,
                "a FILE query names the file by path (RegionDesc::meta)",
            ));
        }
        let path = PathBuf::from(String::from_utf8_lossy(&region.meta).into_owned());
        match std::fs::metadata(&path) {
            Ok(m) => Ok(Some(QueryResult {
                exists: true,
                size: Some(m.len()),
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some(QueryResult {
                exists: false,
                size: None,
            })),
            Err(e) => Err(Error::io(&self.agent, Op::QueryMem, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(chunks: Vec<Chunk>, unregistered_chunk: Option<u64>) -> Plan {
        Plan {
            agent: "t".to_owned(),
            backend: POSIX,
            op: XferOp::Write,
            max_chunk: chunks.iter().map(|c| c.len).max().unwrap_or(0),
            chunks,
            read_ends: Vec::new(),
            direct: true,
            unregistered_chunk,
            cancel_timeout: Duration::from_secs(1),
            files: Vec::new(),
            vram: None,
        }
    }

    fn chunk(buf: u64, off: u64, len: u64) -> Chunk {
        Chunk {
            fd: 3,
            buf,
            off,
            len,
            gpu: None,
        }
    }

    #[test]
    fn rechunk_splits_to_the_unregistered_size_and_covers_the_same_bytes() {
        let mut p = plan(
            vec![chunk(0x10000, 0, 4 << 20), chunk(0x900000, 8 << 20, 4096)],
            Some(1016 << 10),
        );
        p.rechunk_unregistered();
        assert!(p.chunks.iter().all(|c| c.len <= 1016 << 10));
        assert_eq!(p.max_chunk, 1016 << 10);
        assert_eq!(p.unregistered_chunk, None, "applied once");
        let total: u64 = p.chunks.iter().map(|c| c.len).sum();
        assert_eq!(total, (4 << 20) + 4096);
        // Pieces are contiguous in memory and in the file, in order.
        let mut next = (0x10000u64, 0u64);
        for c in p.chunks.iter().take_while(|c| c.buf < 0x900000) {
            assert_eq!((c.buf, c.off), next);
            next = (c.buf + c.len, c.off + c.len);
        }
        assert_eq!(next, (0x10000 + (4 << 20), 4 << 20));
        // A second call changes nothing; a plan without the hint is left alone.
        let before = p.chunks.len();
        p.rechunk_unregistered();
        assert_eq!(p.chunks.len(), before);
        let mut q = plan(vec![chunk(0, 0, 4 << 20)], None);
        q.rechunk_unregistered();
        assert_eq!(q.chunks.len(), 1);
    }
}
