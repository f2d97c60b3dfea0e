//! `GDS`: GPUDirect Storage through cuFile (feature `gds`), loaded at run time.
//!
//! Opening the driver is guarded: libcufile 1.20's `cuFileDriverOpen` spins forever when
//! libcuda is absent, so the backend first loads `libcuda.so.1`, runs `cuInit` and requires
//! a device, and only then opens cuFile (with `CUFILE_LOGFILE_PATH` set when the caller did
//! not set it). Anything missing is [`Error::Unavailable`] naming what to install. Where the
//! `nvidia-fs` kernel module is absent, cuFile runs in compatibility mode (POSIX I/O through
//! its own bounce buffers); the path report says which.
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
//! first GDS backend created; its [`GdsParams::cufile_path`] and
//! [`GdsParams::force_compat_mode`] win, later backends share that driver (a differing
//! `force_compat_mode` is logged and shown in their path report).

mod sys;
mod xfer;

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nixl_core::backend::{
    downcast_md, Backend, BackendContext, BackendMd, BackendParams, BackendPlugin, BackendXfer,
    ParamMap, XferSpec,
};
use nixl_core::{Capabilities, Error, MemKind, Op, QueryResult, RegionDesc, Result};

use crate::cuda::{self, Cuda, PrimaryCtx};
use crate::posix::bounce::{vram_context, PoolEngine};
use crate::posix::pool::PoolXfer;
use crate::posix::{build_plan, LocalMem, PlanSeg, PosixParams};

/// The backend's type name.
pub const GDS: &str = "GDS";

/// Parameters of the GDS backend.
#[derive(Debug, Clone)]
pub struct GdsParams {
    /// Where libcufile is (default: `NIXL_CUFILE_PATH`, then `libcufile.so.0` on the loader
    /// path, then `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`).
    pub cufile_path: Option<PathBuf>,
    /// Transfers with at least this many segments use the batch API.
    pub batch_threshold: usize,
    /// Entries per batch (cuFile's `max_batch_io_size`, 128 by default in cufile.json).
    pub max_batch: usize,
    /// How long cancel waits for the batch to stop.
    pub cancel_timeout: Duration,
    /// Forces cuFile's compatibility mode (POSIX I/O inside cuFile) before the driver opens:
    /// `cuFileSetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE)` with libcufile 1.14+, else the
    /// `CUFILE_FORCE_COMPAT_MODE=true` environment variable. Only the first GDS backend of a
    /// process opens the driver, so only its value counts.
    pub force_compat_mode: bool,
    /// What a FILE registration does when `cuFileHandleRegister` fails.
    pub fallback: GdsFallback,
    /// The engine of [`GdsFallback::Bounce`] transfers (pool threads, `bounce_chunk`,
    /// `bounce_buffers`, `direct_alignment`, `cancel_timeout`; the I/O engine field is
    /// ignored: the fallback always uses the thread pool).
    pub fallback_engine: PosixParams,
}

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
            cufile_path: None,
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

impl BackendParams for GdsParams {
    fn backend_name(&self) -> &str {
        GDS
    }

    fn create(self: Box<Self>, ctx: BackendContext) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(GdsBackend::new(*self, ctx)?))
    }
}

/// Creates `GDS` by name: `cufile_path`, `batch_threshold`, `max_batch`, `force_compat_mode`
/// (`true`/`false`), `fallback` (`bounce`/`refuse`), `bounce_chunk`, `bounce_buffers`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GdsPlugin;

impl BackendPlugin for GdsPlugin {
    fn name(&self) -> &str {
        GDS
    }

    fn default_params(&self) -> BTreeMap<String, String> {
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

    fn parse_params(&self, params: &BTreeMap<String, String>) -> Result<Box<dyn BackendParams>> {
        let mut m = ParamMap::new(GDS, params);
        let mut p = GdsParams {
            cufile_path: m.string("cufile_path").map(Into::into),
            ..GdsParams::default()
        };
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
        Ok(Box::new(p))
    }
}

/// The loaded, opened cuFile driver (one per process; cuFile's driver state is global).
pub(crate) struct Driver {
    /// Keeps libcuda loaded under libcufile.
    _cuda: Arc<Cuda>,
    pub cufile: sys::CufileFns,
    /// Whether the nvidia-fs kernel module is loaded (otherwise cuFile is in compat mode).
    pub nvidia_fs: bool,
    /// How compatibility mode was forced at open, if it was.
    pub forced_compat: Option<&'static str>,
    _libcufile: libloading::Library,
}

static DRIVER: OnceLock<std::result::Result<Arc<Driver>, (String, String)>> = OnceLock::new();
/// Serialises first-time opening across agents.
static OPENING: Mutex<()> = Mutex::new(());

fn unavailable(what: &str, hint: impl Into<String>) -> (String, String) {
    (what.to_owned(), hint.into())
}

fn open_lib(candidates: &[PathBuf]) -> std::result::Result<libloading::Library, String> {
    let mut errs = Vec::new();
    for c in candidates {
        // SAFETY: loading libcuda/libcufile runs their initialisers, which have no
        // preconditions; the library is kept alive as long as the functions taken from it.
        match unsafe { libloading::Library::new(c) } {
            Ok(l) => return Ok(l),
            Err(e) => errs.push(format!("{}: {e}", c.display())),
        }
    }
    Err(errs.join("; "))
}

fn open_driver(params: &GdsParams) -> std::result::Result<Arc<Driver>, (String, String)> {
    // 1. The CUDA driver and a device, before cuFile (cuFileDriverOpen spins without them).
    let cuda = cuda::cuda().map_err(|e| match e {
        Error::Unavailable { what, hint } => (what, hint),
        other => unavailable("the CUDA driver", other.to_string()),
    })?;
    // 2. libcufile.
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = &params.cufile_path {
        candidates.push(p.clone());
    }
    if let Ok(p) = std::env::var("NIXL_CUFILE_PATH") {
        candidates.push(p.into());
    }
    candidates.push("libcufile.so.0".into());
    for home in [
        std::env::var("CUDA_HOME").ok(),
        Some("/usr/local/cuda".to_owned()),
    ]
    .into_iter()
    .flatten()
    {
        candidates.push(PathBuf::from(home).join("lib64/libcufile.so.0"));
    }
    let libcufile = open_lib(&candidates).map_err(|e| {
        unavailable(
            "libcufile (GPUDirect Storage)",
            format!("install the CUDA toolkit's cuFile or set NIXL_CUFILE_PATH: {e}"),
        )
    })?;
    let cufile = sys::cufile_fns(&libcufile).map_err(|e| {
        unavailable(
            "libcufile",
            format!("missing symbol {e} (libcufile 1.5+ needed)"),
        )
    })?;
    // 3. cuFile writes a log to the working directory unless told otherwise.
    if std::env::var_os("CUFILE_LOGFILE_PATH").is_none() {
        let log = std::env::temp_dir().join(format!("nixl-cufile-{}.log", std::process::id()));
        tracing::debug!(path = %log.display(), "GDS: setting CUFILE_LOGFILE_PATH");
        // Process-global; done once, under OPENING, before cuFile reads it. Callers that run
        // other threads reading the environment can set the variable themselves first.
        std::env::set_var("CUFILE_LOGFILE_PATH", log);
    }
    // 4. Compatibility mode, if forced: the parameter API of libcufile 1.14+, else the
    // environment variable cuFile reads at open.
    let mut forced_compat = None;
    if params.force_compat_mode {
        if let Some(set) = sys::set_parameter_bool(&libcufile) {
            // SAFETY: the driver is not open yet, which is when cuFile accepts parameters.
            let st = unsafe { set(sys::CUFILE_PARAM_FORCE_COMPAT_MODE, true) };
            if st.err == sys::CU_FILE_SUCCESS {
                forced_compat = Some("cuFileSetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE)");
            } else {
                tracing::warn!(err = st.err, "GDS: cuFileSetParameterBool(FORCE_COMPAT_MODE) failed; using CUFILE_FORCE_COMPAT_MODE");
            }
        }
        if forced_compat.is_none() {
            // Process-global, set under OPENING before cuFile reads it (as above).
            std::env::set_var("CUFILE_FORCE_COMPAT_MODE", "true");
            forced_compat = Some("CUFILE_FORCE_COMPAT_MODE=true");
        }
    }
    // SAFETY: the CUDA driver and a device are present (checked above), which is what
    // cuFileDriverOpen needs to return instead of spinning.
    let st = unsafe { (cufile.cuFileDriverOpen)() };
    if st.err != sys::CU_FILE_SUCCESS {
        return Err(unavailable(
            "the cuFile driver",
            format!(
                "cuFileDriverOpen failed: cuFile error {} (CUresult {})",
                st.err, st.cu_err
            ),
        ));
    }
    let nvidia_fs = std::path::Path::new("/proc/driver/nvidia-fs/stats").exists()
        || std::path::Path::new("/sys/module/nvidia_fs").exists();
    Ok(Arc::new(Driver {
        _cuda: cuda,
        cufile,
        nvidia_fs,
        forced_compat,
        _libcufile: libcufile,
    }))
}

/// Loads and opens cuFile once per process; later calls return the same driver or the same
/// reason it is unavailable.
pub(crate) fn driver(params: &GdsParams) -> Result<Arc<Driver>> {
    let _g = OPENING.lock().unwrap_or_else(|p| p.into_inner());
    DRIVER
        .get_or_init(|| open_driver(params))
        .clone()
        .map_err(|(what, hint)| Error::Unavailable { what, hint })
}

/// Whether GDS can be used here, and why not.
pub fn probe() -> std::result::Result<(), String> {
    driver(&GdsParams::default())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A registered buffer (DRAM or VRAM).
pub(crate) struct BufMd {
    drv: Arc<Driver>,
    pub addr: u64,
    registered: bool,
    /// The retained primary context of a VRAM buffer's GPU (for fallback transfers).
    pub ctx: Option<Arc<PrimaryCtx>>,
}

impl Drop for BufMd {
    fn drop(&mut self) {
        if self.registered {
            // SAFETY: `addr` was registered by cuFileBufRegister and is deregistered once.
            let st = unsafe { (self.drv.cufile.cuFileBufDeregister)(self.addr as *const c_void) };
            if st.err != sys::CU_FILE_SUCCESS {
                tracing::warn!(err = st.err, "GDS: cuFileBufDeregister failed");
            }
        }
    }
}

/// A registered file: the cuFile handle and the descriptor it was made from, or (fallback)
/// no handle and why cuFile refused the file.
pub(crate) struct FileMd {
    drv: Arc<Driver>,
    pub handle: Option<sys::CUfileHandle_t>,
    /// Set in bounce mode: "cuFileHandleRegister failed: cuFile error N (...)".
    pub fallback: Option<String>,
    pub fd: OwnedFd,
    pub direct: bool,
    pub path: Option<PathBuf>,
}

// SAFETY: a cuFile handle is an opaque token cuFile allows using from any thread.
unsafe impl Send for FileMd {}
// SAFETY: as above; cuFile synchronises internally.
unsafe impl Sync for FileMd {}

impl Drop for FileMd {
    fn drop(&mut self) {
        if let Some(h) = self.handle {
            // SAFETY: the handle was registered once and no request holds this metadata any
            // more.
            unsafe { (self.drv.cufile.cuFileHandleDeregister)(h) };
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
            .field("nvidia_fs", &self.drv.nvidia_fs)
            .finish()
    }
}

impl GdsBackend {
    /// Opens cuFile (guarded) and creates the backend; [`Error::Unavailable`] without a GPU,
    /// libcuda or libcufile.
    pub fn new(params: GdsParams, ctx: BackendContext) -> Result<Self> {
        params.validate(&ctx.agent)?;
        let drv = driver(&params)?;
        if params.force_compat_mode != drv.forced_compat.is_some() {
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
        let mut m = if self.drv.nvidia_fs && self.drv.forced_compat.is_none() {
            "cuFile (GPUDirect, nvidia-fs)".to_owned()
        } else if let Some(how) = self.drv.forced_compat {
            format!("cuFile compatibility mode (forced: {how})")
        } else {
            "cuFile compatibility mode (no nvidia-fs: POSIX I/O through bounce buffers)".to_owned()
        };
        if self.params.force_compat_mode != self.drv.forced_compat.is_some() {
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
            let b = spec
                .md(s.local_md)
                .and_then(downcast_md::<BufMd>)
                .ok_or_else(|| {
                    Error::invalid(
                        me,
                        Op::MakeXfer,
                        format!("segment {i}: local metadata is not GDS's"),
                    )
                })?;
            let fmd = spec.md(s.remote_md).ok_or_else(|| {
                Error::invalid(me, Op::MakeXfer, format!("segment {i} names no metadata"))
            })?;
            let f = downcast_md::<FileMd>(fmd).ok_or_else(|| {
                Error::invalid(
                    me,
                    Op::MakeXfer,
                    format!("segment {i}: target is not a GDS file"),
                )
            })?;
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
                f.fd.as_raw_fd(),
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
        // SAFETY: the region is memory the agent keeps alive while this registration lives
        // (MemoryRegion contract); cuFile only records and pins it.
        let st =
            unsafe { (self.drv.cufile.cuFileBufRegister)(region.addr as *const c_void, len, 0) };
        if st.err != sys::CU_FILE_SUCCESS {
            if region.kind == MemKind::Vram && self.params.fallback == GdsFallback::Bounce {
                // cuFile reads and writes unregistered device memory too (through its own
                // staging), and fallback transfers never need the registration.
                tracing::warn!(
                    agent = %self.agent,
                    err = st.err,
                    "GDS: cuFileBufRegister failed for VRAM; using the buffer unregistered (fallback = bounce)"
                );
                return Ok(Arc::new(BufMd {
                    drv: self.drv.clone(),
                    addr: region.addr,
                    registered: false,
                    ctx,
                }));
            }
            if region.kind == MemKind::Dram {
                // Host memory works unregistered (cuFile bounces it); registration only speeds it up.
                tracing::debug!(
                    err = st.err,
                    "GDS: host buffer not registered with cuFile; using it unregistered"
                );
                return Ok(Arc::new(BufMd {
                    drv: self.drv.clone(),
                    addr: region.addr,
                    registered: false,
                    ctx,
                }));
            }
            return Err(Error::backend(
                &self.agent,
                GDS,
                Op::RegisterMem,
                format!(
                    "cuFileBufRegister: cuFile error {} (CUresult {})",
                    st.err, st.cu_err
                ),
            ));
        }
        Ok(Arc::new(BufMd {
            drv: self.drv.clone(),
            addr: region.addr,
            registered: true,
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
        // SAFETY: F_DUPFD_CLOEXEC only creates a descriptor; an invalid one yields EBADF.
        let dup = unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(Error::invalid(
                &self.agent,
                Op::RegisterMem,
                format!("device id {raw} is not an open file descriptor"),
            ));
        }
        // SAFETY: `dup` is a new descriptor owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(dup) };
        let mut descr = sys::CUfileDescr_t {
            type_: sys::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            handle: sys::CUfileDescrHandle { fd: fd.as_raw_fd() },
            fs_ops: std::ptr::null(),
        };
        let mut handle = std::ptr::null_mut();
        // SAFETY: both pointers are valid for the call; the descriptor stays open as long as
        // the handle (both live in FileMd).
        let st = unsafe { (self.drv.cufile.cuFileHandleRegister)(&mut handle, &mut descr) };
        // SAFETY: F_GETFL only reads the status flags of a descriptor owned here.
        let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        let direct = fl >= 0 && fl & libc::O_DIRECT != 0;
        let path = (!region.meta.is_empty())
            .then(|| PathBuf::from(String::from_utf8_lossy(&region.meta).into_owned()));
        let (handle, fallback) = if st.err == sys::CU_FILE_SUCCESS {
            (Some(handle), None)
        } else {
            let why = format!(
                "cuFileHandleRegister failed: cuFile error {}{}",
                st.err,
                sys::error_hint(st.err)
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
            let mut fb = self.fallbacks.lock().unwrap_or_else(|p| p.into_inner());
            fb.0 += 1;
            fb.1.get_or_insert_with(|| why.clone());
            (None, Some(why))
        };
        Ok(Arc::new(FileMd {
            drv: self.drv.clone(),
            handle,
            fallback,
            fd,
            direct,
            path,
        }))
    }
}

impl Backend for GdsBackend {
    local_only_peer_methods!(GDS, "GDS files");

    fn name(&self) -> &str {
        GDS
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            mem_kinds: vec![MemKind::Dram, MemKind::Vram, MemKind::File],
            remote: false,
            local: true,
            notifications: false,
            needs_progress: false,
        }
    }

    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        match region.kind {
            MemKind::Dram | MemKind::Vram => self.register_buf(region),
            MemKind::File => self.register_file(region),
            k => Err(Error::not_supported(
                &self.agent,
                Op::RegisterMem,
                format!("GDS registers DRAM, VRAM and FILE, not {k}"),
            )),
        }
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        if downcast_md::<BufMd>(&md).is_none() && downcast_md::<FileMd>(&md).is_none() {
            return Err(Error::invalid(
                &self.agent,
                Op::DeregisterMem,
                "not GDS metadata",
            ));
        }
        Ok(())
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        let fallback = spec.segments.iter().find_map(|s| {
            spec.md(s.remote_md)
                .and_then(downcast_md::<FileMd>)
                .and_then(|f| f.fallback.clone())
        });
        if let Some(why) = fallback {
            xfer::check_spec(&self.agent, spec)?;
            return self.prepare_fallback(spec, &why);
        }
        xfer::GdsXfer::create(
            &self.agent,
            self.drv.clone(),
            &self.params,
            spec,
            self.mode(),
        )
    }

    fn path_report(&self, remote: &str) -> Option<String> {
        (remote == self.agent).then(|| {
            let fb = self.fallbacks.lock().unwrap_or_else(|p| p.into_inner());
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
