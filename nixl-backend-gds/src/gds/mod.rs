//! `GDS`: GPUDirect Storage through cuFile (feature `gds`), loaded at run time.
//!
//! cuFile and CUDA are nixl-mem's layer (cudarc's run-time-loaded bindings,
//! [`nixl_mem::cufile`]). Opening the driver is guarded: libcufile 1.20's `cuFileDriverOpen`
//! spins forever when libcuda is absent, so the CUDA driver and a device are required first,
//! and only then is cuFile opened (its log moved out of the working directory through cuFile's
//! own parameter API when the environment has no `CUFILE_LOGFILE_PATH`; the environment is
//! never changed). Anything missing is [`Error::Unavailable`] naming what to install; see
//! [`nixl_mem::cufile`] for where libcufile is looked for. Where the `nvidia-fs` kernel module
//! is absent, cuFile runs in compatibility mode (POSIX I/O through its own bounce buffers);
//! the path report says which.
//!
//! Memory (DRAM or VRAM) is registered with `cuFileBufRegister`; files with
//! `cuFileHandleRegister` on a duplicate of the region's descriptor. Transfers of fewer than
//! [`GdsParams::batch_threshold`] segments run synchronously (`cuFileRead`/`cuFileWrite`) at
//! post; larger ones go through the batch API and are polled.
//!
//! **Fallback.** Where cuFile cannot take a file (on a VM's virtio disk `cuFileHandleRegister`
//! fails with cuFile error 5027, "cufio-fs: error getting volume attributes", even in
//! compatibility mode), [`GdsFallback::Bounce`] (the default) still registers the file, in
//! "bounce" mode: transfers touching it run on the POSIX engine (DRAM: `pread`/`pwrite` on a
//! thread pool; VRAM: pinned staging buffers + `cuMemcpyAsync`), configured by
//! [`GdsParams::fallback_engine`]. It is never silent: one `tracing::warn` per file, and the
//! request path and the path report name the fallback and the cuFile error.
//! [`GdsFallback::Refuse`] fails the registration instead.
//!
//! **Driver options are per process.** cuFile's driver is opened once per process, by the
//! first GDS backend created; its [`GdsParams::force_compat_mode`] wins, later backends share
//! that driver (a differing `force_compat_mode` is logged and shown in their path report).

mod xfer;

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nixl_core::backend::{
    downcast_md, Backend, BackendContext, BackendMd, BackendXfer, ParamMap, XferSpec,
};
use nixl_core::backend::{Capabilities, QueryResult};
use nixl_core::{Error, MemKind, Op, RegionDesc, Result};
use nixl_mem::cufile::{self, BufRegistration, Driver, FileHandle, Options};
use nixl_mem::Context;

use crate::posix::bounce::{vram_context, PoolEngine};
use crate::posix::pool::PoolXfer;
use crate::posix::{build_plan, LocalMem, PlanSeg, PosixParams};
use crate::storage::Storage;

/// The backend's type name.
pub const GDS: &str = "GDS";

/// GDS as the storage checks see it.
pub(crate) const STORAGE: Storage = Storage {
    name: GDS,
    targets: "files",
    local: &[MemKind::Dram, MemKind::Vram],
    remote: &[MemKind::File],
};

/// Parameters of the GDS backend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GdsParams {
    /// Transfers with at least this many segments use the batch API.
    pub batch_threshold: usize,
    /// Entries per batch (cuFile's `max_batch_io_size`, 128 by default in cufile.json).
    pub max_batch: usize,
    /// How long cancel waits for the batch to stop.
    pub cancel_timeout: Duration,
    /// Forces cuFile's compatibility mode (POSIX I/O inside cuFile) before the driver opens:
    /// `cuFileSetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE)` with libcufile 1.14+; with an
    /// older library only if the process started with `CUFILE_FORCE_COMPAT_MODE=true` in its
    /// environment (otherwise creation fails with `NotSupported`). Only the first GDS backend
    /// of a process opens the driver, so only its value counts.
    pub force_compat_mode: bool,
    /// What a FILE registration does when `cuFileHandleRegister` fails.
    pub fallback: GdsFallback,
    /// The engine of [`GdsFallback::Bounce`] transfers (pool threads, `bounce_chunk`,
    /// `bounce_buffers`, `direct_alignment`, `cancel_timeout`; the I/O engine field is
    /// ignored: the fallback always uses the thread pool).
    pub fallback_engine: PosixParams,
}

nixl_core::__setters!(GdsParams {
    batch_threshold: usize,
    max_batch: usize,
    cancel_timeout: Duration,
    force_compat_mode: bool,
    fallback: GdsFallback,
    fallback_engine: PosixParams,
});

/// What the GDS backend does with a file cuFile refuses (`cuFileHandleRegister` fails).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GdsFallback {
    /// Register it anyway and move its data through the POSIX engine (pinned bounce buffers
    /// + `pread`/`pwrite`); warned once per file and named in every path report.
    #[default]
    Bounce,
    /// Fail the registration with the cuFile error.
    Refuse,
}

impl Default for GdsParams {
    fn default() -> Self {
        GdsParams {
            batch_threshold: 4,
            max_batch: 128,
            cancel_timeout: Duration::from_secs(10),
            force_compat_mode: false,
            fallback: GdsFallback::Bounce,
            fallback_engine: PosixParams::default(),
        }
    }
}

impl GdsParams {
    fn validate(&self, agent: &str) -> Result<()> {
        if self.max_batch == 0 || self.max_batch > 4096 {
            return Err(Error::invalid(
                agent,
                Op::CreateBackend,
                "GDS: max_batch must be in 1..=4096",
            ));
        }
        self.fallback_engine.validate().map_err(|e| match e {
            Error::InvalidParam { reason, op, .. } => Error::InvalidParam {
                agent: agent.to_owned(),
                op,
                reason: format!("GDS fallback_engine: {reason}"),
            },
            other => other,
        })
    }
}

/// Creates `GDS` by name: `batch_threshold`, `max_batch`, `force_compat_mode`
/// (`true`/`false`), `fallback` (`bounce`/`refuse`), `bounce_chunk`, `bounce_buffers`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GdsPlugin;

impl GdsParams {
    /// The string-map form of the defaults (the plugin's `default_params`).
    pub(crate) fn default_map() -> BTreeMap<String, String> {
        let d = GdsParams::default();
        BTreeMap::from([
            ("batch_threshold".to_owned(), d.batch_threshold.to_string()),
            ("max_batch".to_owned(), d.max_batch.to_string()),
            (
                "force_compat_mode".to_owned(),
                d.force_compat_mode.to_string(),
            ),
            ("fallback".to_owned(), "bounce".to_owned()),
            (
                "bounce_chunk".to_owned(),
                d.fallback_engine.bounce_chunk.to_string(),
            ),
            ("bounce_buffers".to_owned(), "auto".to_owned()),
        ])
    }

    /// Parses the string-map form (the plugin's `parse_params`).
    pub(crate) fn from_map(params: &BTreeMap<String, String>) -> Result<Self> {
        let mut m = ParamMap::new(GDS, params);
        let mut p = GdsParams::default();
        if let Some(n) = m.usize("batch_threshold")? {
            p.batch_threshold = n;
        }
        if let Some(n) = m.usize("max_batch")? {
            p.max_batch = n;
        }
        if let Some(b) = m.bool("force_compat_mode")? {
            p.force_compat_mode = b;
        }
        let fallbacks = [
            ("bounce", GdsFallback::Bounce),
            ("refuse", GdsFallback::Refuse),
        ];
        if let Some(f) = m.choice("fallback", &fallbacks)? {
            p.fallback = f;
        }
        if let Some(n) = m.u64("bounce_chunk")? {
            p.fallback_engine.bounce_chunk = n;
        }
        if let Some(n) = m.auto("bounce_buffers", "auto or a count")? {
            p.fallback_engine.bounce_buffers = n;
        }
        m.finish()?;
        p.validate("")?;
        Ok(p)
    }
}

nixl_core::__backend_plugin!(GdsPlugin, GdsParams, GDS, |p, ctx| GdsBackend::new(p, ctx));

/// Opens (once per process) nixl-mem's cuFile driver with the backend's options.
fn driver(params: &GdsParams, agent: &str) -> Result<Arc<Driver>> {
    cufile::open(&Options::default().force_compat_mode(params.force_compat_mode))
        .inspect(|_| crate::posix::bounce::note_cuda_used())
        .map_err(|e| match e {
            Error::NotSupported { op, what, .. } => Error::NotSupported {
                agent: agent.to_owned(),
                op,
                what: format!("GDS: {what}"),
            },
            other => other,
        })
}

/// Whether GDS can be used here, and why not.
pub fn probe() -> std::result::Result<(), String> {
    driver(&GdsParams::default(), "-")
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A registered buffer (DRAM or VRAM).
pub(crate) struct BufMd {
    pub addr: u64,
    /// The cuFile registration, deregistered on drop (`None`: used unregistered).
    _registration: Option<BufRegistration>,
    /// The primary context of a VRAM buffer's GPU (for fallback transfers).
    pub ctx: Option<Context>,
}

/// A registered file: the cuFile handle (which owns a duplicate of the region's descriptor),
/// or (fallback) the duplicate alone and why cuFile refused the file.
pub(crate) struct FileMd {
    file: GdsFile,
    /// Set in bounce mode: "cuFileHandleRegister failed: cuFile error N (...)".
    pub fallback: Option<String>,
    pub direct: bool,
    pub path: Option<PathBuf>,
}

enum GdsFile {
    Registered(FileHandle),
    Bounce(OwnedFd),
}

impl FileMd {
    /// The cuFile handle, unless the file is in bounce mode.
    pub(crate) fn handle(&self) -> Option<&FileHandle> {
        match &self.file {
            GdsFile::Registered(h) => Some(h),
            GdsFile::Bounce(_) => None,
        }
    }

    /// The backend's descriptor of the file.
    pub(crate) fn raw_fd(&self) -> RawFd {
        match &self.file {
            GdsFile::Registered(h) => h.fd().as_raw_fd(),
            GdsFile::Bounce(fd) => fd.as_raw_fd(),
        }
    }
}

/// The GDS backend.
pub struct GdsBackend {
    agent: String,
    params: GdsParams,
    drv: Arc<Driver>,
    /// The fallback engine (pool and staging created on first fallback transfer).
    engine: PoolEngine,
    /// Files registered in bounce mode (count, first reason), for the path report.
    fallbacks: Mutex<(usize, Option<String>)>,
}

impl std::fmt::Debug for GdsBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GdsBackend")
            .field("agent", &self.agent)
            .field("nvidia_fs", &self.drv.nvidia_fs())
            .finish()
    }
}

impl GdsBackend {
    /// Opens cuFile (guarded) and creates the backend; [`Error::Unavailable`] without a GPU,
    /// libcuda or libcufile.
    pub fn new(params: GdsParams, ctx: BackendContext) -> Result<Self> {
        params.validate(&ctx.agent)?;
        let drv = driver(&params, &ctx.agent)?;
        if params.force_compat_mode != drv.forced_compat().is_some() {
            tracing::warn!(agent = %ctx.agent, requested = params.force_compat_mode, "GDS: force_compat_mode differs from the cuFile driver already opened in this process; the driver's setting stays");
        }
        let engine = PoolEngine::new(params.fallback_engine.clone());
        Ok(GdsBackend {
            agent: ctx.agent,
            params,
            drv,
            engine,
            fallbacks: Mutex::new((0, None)),
        })
    }

    fn mode(&self) -> String {
        let mut m = if self.drv.nvidia_fs() && self.drv.forced_compat().is_none() {
            "cuFile (GPUDirect, nvidia-fs)".to_owned()
        } else if let Some(how) = self.drv.forced_compat() {
            format!("cuFile compatibility mode (forced: {how})")
        } else {
            "cuFile compatibility mode (no nvidia-fs: POSIX I/O through bounce buffers)".to_owned()
        };
        if self.params.force_compat_mode != self.drv.forced_compat().is_some() {
            m.push_str(&format!(
                " [force_compat_mode={} ignored: the process's cuFile driver was opened before]",
                self.params.force_compat_mode
            ));
        }
        m
    }

    /// The path of fallback transfers.
    fn fallback_label(&self, why: &str, vram: bool) -> String {
        if vram {
            format!("GDS fallback ({why}): {}", self.engine.vram_label())
        } else {
            format!(
                "GDS fallback ({why}): pread/pwrite x{}",
                self.engine.params().pool_threads
            )
        }
    }

    /// Runs a request touching a bounce-mode file on the POSIX engine.
    fn prepare_fallback(&self, spec: &XferSpec, why: &str) -> Result<Box<dyn BackendXfer>> {
        let me = &self.agent;
        let mut segs = Vec::with_capacity(spec.segments.len());
        for (i, s) in spec.segments.iter().enumerate() {
            let (_, b) = STORAGE.segment_md::<BufMd>(me, (i, "local"), spec.md(s.local_md), "")?;
            let (fmd, f) =
                STORAGE.segment_md::<FileMd>(me, (i, "target"), spec.md(s.remote_md), "file")?;
            let local = match (spec.local_kind, &b.ctx) {
                (MemKind::Vram, Some(ctx)) => LocalMem::Vram(ctx),
                (MemKind::Vram, None) => {
                    return Err(Error::invalid(
                        me,
                        Op::MakeXfer,
                        format!("segment {i}: VRAM registration without a CUDA context"),
                    ))
                }
                _ => LocalMem::Dram,
            };
            segs.push(PlanSeg::new(
                local,
                s,
                fmd,
                f.raw_fd(),
                f.direct,
                f.path.as_ref(),
            ));
        }
        let mut plan = build_plan(&self.engine, me, GDS, spec.op, &segs)?;
        // The plan keeps the file metadata; the buffers' (and their contexts) too.
        plan.files.extend(spec.mds.iter().cloned());
        plan.files = nixl_core::backend::distinct_mds(&plan.files);
        let label = self.fallback_label(why, plan.vram.is_some());
        Ok(Box::new(PoolXfer::new(plan, self.engine.pool(me)?, label)))
    }

    fn register_buf(&self, region: &RegionDesc) -> Result<BackendMd> {
        let ctx = if region.kind == MemKind::Vram {
            let ctx = vram_context(&self.agent, GDS, region)?;
            // cuFile registers VRAM in the current context; it stays current on this thread
            // (as cuFileRead/Write on it expect).
            ctx.bind()
                .map_err(|e| e.into_error(&self.agent, GDS, Op::RegisterMem))?;
            Some(ctx)
        } else {
            None
        };
        let len = usize::try_from(region.len)
            .map_err(|_| Error::invalid(&self.agent, Op::RegisterMem, "region too large"))?;
        // Crate invariant: the region is memory the agent keeps alive while this registration
        // lives (MemoryRegion contract); the registration is dropped with this metadata.
        let registration = match crate::sys::gpu::register_buf(&self.drv, region.addr, len) {
            Ok(r) => Some(r),
            Err(e)
                if region.kind == MemKind::Vram && self.params.fallback == GdsFallback::Bounce =>
            {
                // cuFile reads and writes unregistered device memory too (through its own
                // staging), and fallback transfers never need the registration.
                tracing::warn!(
                    agent = %self.agent,
                    error = %e,
                    "GDS: cuFileBufRegister failed for VRAM; using the buffer unregistered (fallback = bounce)"
                );
                None
            }
            Err(e) if region.kind == MemKind::Dram => {
                // Host memory works unregistered (cuFile bounces it); registration only speeds it up.
                tracing::debug!(
                    error = %e,
                    "GDS: host buffer not registered with cuFile; using it unregistered"
                );
                None
            }
            Err(e) => return Err(e.into_error(&self.agent, GDS, Op::RegisterMem)),
        };
        Ok(Arc::new(BufMd {
            addr: region.addr,
            _registration: registration,
            ctx,
        }))
    }

    fn register_file(&self, region: &RegionDesc) -> Result<BackendMd> {
        let raw = RawFd::try_from(region.dev_id).map_err(|_| {
            Error::invalid(
                &self.agent,
                Op::RegisterMem,
                "device id is not a file descriptor",
            )
        })?;
        let fd = crate::sys::fd::dup_cloexec(raw).map_err(|_| {
            Error::invalid(
                &self.agent,
                Op::RegisterMem,
                format!("device id {raw} is not an open file descriptor"),
            )
        })?;
        let direct = crate::sys::fd::is_direct(fd.as_fd());
        let path = (!region.meta.is_empty())
            .then(|| PathBuf::from(String::from_utf8_lossy(&region.meta).into_owned()));
        let (file, fallback) = match FileHandle::register(&self.drv, fd) {
            Ok(h) => (GdsFile::Registered(h), None),
            Err((e, fd)) => {
                let why = format!(
                    "cuFileHandleRegister failed: cuFile error {}{}",
                    e.code,
                    e.hint()
                );
                if self.params.fallback == GdsFallback::Refuse {
                    return Err(Error::backend(
                        &self.agent,
                        GDS,
                        Op::RegisterMem,
                        format!("{why} (fallback = refuse)"),
                    ));
                }
                let name = path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| format!("fd {raw}"));
                tracing::warn!(agent = %self.agent, file = %name, reason = %why, "GDS: cuFile refused the file; its transfers use the POSIX bounce engine (fallback = bounce)");
                let mut fb = self.fallbacks.lock();
                fb.0 += 1;
                fb.1.get_or_insert_with(|| why.clone());
                (GdsFile::Bounce(fd), Some(why))
            }
        };
        Ok(Arc::new(FileMd {
            file,
            fallback,
            direct,
            path,
        }))
    }
}

impl Backend for GdsBackend {
    fn name(&self) -> &str {
        GDS
    }

    fn capabilities(&self) -> Capabilities {
        STORAGE.capabilities()
    }

    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        match region.kind {
            MemKind::Dram | MemKind::Vram => self.register_buf(region),
            MemKind::File => self.register_file(region),
            k => Err(STORAGE.refuse_region(&self.agent, k)),
        }
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        STORAGE.check_deregister(
            &self.agent,
            downcast_md::<BufMd>(&md).is_some() || downcast_md::<FileMd>(&md).is_some(),
        )
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        let fallback = spec.segments.iter().find_map(|s| {
            spec.md(s.remote_md)
                .and_then(downcast_md::<FileMd>)
                .and_then(|f| f.fallback.clone())
        });
        if let Some(why) = fallback {
            STORAGE.check_request(&self.agent, spec)?;
            return self.prepare_fallback(spec, &why);
        }
        xfer::GdsXfer::create(&self.agent, &self.drv, &self.params, spec, self.mode())
    }

    fn path_report(&self, remote: &str) -> Option<String> {
        (remote == self.agent).then(|| {
            let fb = self.fallbacks.lock();
            match &fb.1 {
                None => self.mode(),
                Some(why) => format!(
                    "{}; {} file(s) in {}",
                    self.mode(),
                    fb.0,
                    self.fallback_label(why, true)
                ),
            }
        })
    }

    fn query(&self, region: &RegionDesc) -> Result<Option<QueryResult>> {
        if region.kind != MemKind::File || region.meta.is_empty() {
            return Ok(None);
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
