//! The POSIX backend's parameters: typed, and the string-map form.

#![allow(unused_imports)]
use super::*;

/// Chunk size for page-cache files and where a device's limits are unknown.
pub(super) const DEFAULT_CHUNK: u64 = 1 << 20;

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
#[non_exhaustive]
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
    /// Durable WRITEs: `fdatasync` every file a WRITE touched before reporting it `Done`, so
    /// `Done` means on the device. Off (the default): `Done` means the bytes reached the
    /// kernel (the page cache for buffered files; the device's volatile cache for O_DIRECT)
    /// and a power loss may lose them.
    pub durable: bool,
}

nixl_core::__setters!(PosixParams {
    engine: Engine,
    queue_depth: u32,
    pool_threads: usize,
    direct_alignment: u64,
    cancel_timeout: Duration,
    inline_max: u64,
    bounce_chunk: u64,
    durable: bool,
} some {
    chunk_size: u64,
    bounce_buffers: usize,
});

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
            durable: false,
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

/// Creates `POSIX` by name from string parameters: `engine` (`auto`, `io_uring`,
/// `threadpool`), `queue_depth`, `chunk_size` (bytes, or `auto`), `pool_threads`,
/// `direct_alignment`, `cancel_timeout_ms`, `inline_max`, `bounce_chunk`, `bounce_buffers` (a
/// number or `auto` = one per pool thread), `durable` (`true`/`false`).
#[derive(Debug, Clone, Copy, Default)]
pub struct PosixPlugin;

impl PosixParams {
    /// The string-map form of the defaults (the plugin's `default_params`).
    pub(crate) fn default_map() -> std::collections::BTreeMap<String, String> {
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
            ("durable".to_owned(), d.durable.to_string()),
        ])
    }

    /// Parses the string-map form (the plugin's `parse_params`).
    pub(crate) fn from_map(params: &std::collections::BTreeMap<String, String>) -> Result<Self> {
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
        if let Some(b) = m.bool("durable")? {
            p.durable = b;
        }
        m.finish()?;
        p.validate()?;
        Ok(p)
    }
}

nixl_core::__backend_plugin!(PosixPlugin, PosixParams, POSIX, |p, ctx| {
    super::PosixBackend::new(p, ctx)
});
