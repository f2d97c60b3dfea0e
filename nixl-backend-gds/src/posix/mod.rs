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
mod durable;
mod limits;
mod params;
mod plan;
pub(crate) mod pool;
mod uring;

use params::DEFAULT_CHUNK;
pub use params::{Engine, PosixParams, PosixPlugin};
pub(crate) use plan::*;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::{
    downcast_md, Backend, BackendContext, BackendMd, BackendXfer, ParamMap, XferSpec,
};
use nixl_core::backend::{Capabilities, QueryResult};
use nixl_core::{Error, MemKind, Op, RegionDesc, Result, XferOp};

use nixl_mem::Context;

use crate::storage::Storage;
use crate::sys::fd as sysfd;
use bounce::{PoolEngine, VramMd, VramSide};

/// The backend's type name.
pub const POSIX: &str = "POSIX";

/// POSIX as the storage checks see it.
const STORAGE: Storage = Storage {
    name: POSIX,
    targets: "files",
    local: &[MemKind::Dram, MemKind::Vram],
    remote: &[MemKind::File, MemKind::Block],
};

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
        STORAGE.check_request(me, spec)?;
        let mut segs = Vec::with_capacity(spec.segments.len());
        for (i, s) in spec.segments.iter().enumerate() {
            let local_md = (i, "local");
            let local = match spec.local_kind {
                MemKind::Vram => LocalMem::Vram(
                    &STORAGE
                        .segment_md::<VramMd>(me, local_md, spec.md(s.local_md), "VRAM")?
                        .1
                        .ctx,
                ),
                _ => {
                    STORAGE.segment_md::<DramMd>(me, local_md, spec.md(s.local_md), "DRAM")?;
                    LocalMem::Dram
                }
            };
            let (fmd, f) =
                STORAGE.segment_md::<FileMd>(me, (i, "target"), spec.md(s.remote_md), "file")?;
            segs.push(
                PlanSeg::new(local, s, fmd, f.fd.as_raw_fd(), f.direct, f.path.as_ref())
                    .with_direct_chunk(f.direct_chunk),
            );
        }
        build_plan(&self.engine, me, POSIX, spec.op, &segs)
    }

    /// The engine that runs a planned request.
    fn prepare_plan(&self, spec: &XferSpec, plan: Plan) -> Result<Box<dyn BackendXfer>> {
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
}

impl Backend for PosixBackend {
    fn name(&self) -> &str {
        POSIX
    }

    fn capabilities(&self) -> Capabilities {
        STORAGE.capabilities()
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
            k => Err(STORAGE.refuse_region(&self.agent, k)),
        }
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        STORAGE.check_deregister(
            &self.agent,
            downcast_md::<DramMd>(&md).is_some()
                || downcast_md::<FileMd>(&md).is_some()
                || downcast_md::<VramMd>(&md).is_some(),
        )?;
        // Dropping the metadata closes the duplicate once no request holds it.
        drop(md);
        Ok(())
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        let plan = self.plan(spec)?;
        if self.params().durable && plan.op == XferOp::Write {
            let mut raw: Vec<RawFd> = plan.chunks.iter().map(|c| c.fd).collect();
            raw.sort_unstable();
            raw.dedup();
            let fds = raw
                .into_iter()
                .map(|fd| {
                    sysfd::dup_cloexec(fd).map_err(|e| {
                        Error::io(
                            &self.agent,
                            Op::MakeXfer,
                            std::io::Error::other(format!("duplicating fd {fd} for the sync: {e}")),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let inner = self.prepare_plan(spec, plan)?;
            return Ok(Box::new(durable::DurableXfer::new(inner, &self.agent, fds)));
        }
        self.prepare_plan(spec, plan)
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
            file_names: Vec::new(),
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
