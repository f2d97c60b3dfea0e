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

mod sys;
mod xfer;

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nixl_core::{
    downcast_md, Backend, BackendContext, BackendMd, BackendParams, BackendPlugin, BackendXfer,
    Capabilities, Error, MemKind, Op, QueryResult, RegionDesc, Result, XferSpec,
};

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
}

impl Default for GdsParams {
    fn default() -> Self {
        GdsParams {
            cufile_path: None,
            batch_threshold: 4,
            max_batch: 128,
            cancel_timeout: Duration::from_secs(10),
        }
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

/// Creates `GDS` by name: `cufile_path`, `batch_threshold`, `max_batch`.
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
        ])
    }

    fn parse_params(&self, params: &BTreeMap<String, String>) -> Result<Box<dyn BackendParams>> {
        let mut p = GdsParams::default();
        let num = |k: &str, v: &str| {
            v.parse::<usize>().map_err(|_| {
                Error::invalid(
                    "",
                    Op::CreateBackend,
                    format!("GDS: {k}={v} is not a number"),
                )
            })
        };
        for (k, v) in params {
            match k.as_str() {
                "cufile_path" => p.cufile_path = Some(v.into()),
                "batch_threshold" => p.batch_threshold = num(k, v)?,
                "max_batch" => p.max_batch = num(k, v)?,
                _ => {
                    return Err(Error::invalid(
                        "",
                        Op::CreateBackend,
                        format!("GDS: unknown parameter {k}"),
                    ))
                }
            }
        }
        if p.max_batch == 0 || p.max_batch > 4096 {
            return Err(Error::invalid(
                "",
                Op::CreateBackend,
                "GDS: max_batch must be in 1..=4096",
            ));
        }
        Ok(Box::new(p))
    }
}

/// The loaded, opened cuFile driver (one per process; cuFile's driver state is global).
pub(crate) struct Driver {
    pub cuda: sys::CudaFns,
    pub cufile: sys::CufileFns,
    /// Whether the nvidia-fs kernel module is loaded (otherwise cuFile is in compat mode).
    pub nvidia_fs: bool,
    _libcuda: libloading::Library,
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
    let libcuda = open_lib(&["libcuda.so.1".into()]).map_err(|e| {
        unavailable(
            "libcuda.so.1 (the NVIDIA driver)",
            format!("install the NVIDIA driver: {e}"),
        )
    })?;
    let cuda = sys::cuda_fns(&libcuda)
        .map_err(|e| unavailable("libcuda.so.1", format!("missing symbol {e}")))?;
    // SAFETY: cuInit takes flags 0 and may be called any number of times.
    let rc = unsafe { (cuda.cuInit)(0) };
    if rc != 0 {
        return Err(unavailable(
            "a CUDA device",
            format!("cuInit failed with CUresult {rc}"),
        ));
    }
    let mut n = 0;
    // SAFETY: the pointer is valid for one int; the driver is initialised.
    let rc = unsafe { (cuda.cuDeviceGetCount)(&mut n) };
    if rc != 0 || n <= 0 {
        return Err(unavailable(
            "a CUDA device",
            format!("cuDeviceGetCount: CUresult {rc}, {n} devices"),
        ));
    }
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
        cuda,
        cufile,
        nvidia_fs,
        _libcuda: libcuda,
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

/// A registered file: the cuFile handle and the descriptor it was made from.
pub(crate) struct FileMd {
    drv: Arc<Driver>,
    pub handle: sys::CUfileHandle_t,
    _fd: OwnedFd,
}

// SAFETY: a cuFile handle is an opaque token cuFile allows using from any thread.
unsafe impl Send for FileMd {}
// SAFETY: as above; cuFile synchronises internally.
unsafe impl Sync for FileMd {}

impl Drop for FileMd {
    fn drop(&mut self) {
        // SAFETY: the handle was registered once and no request holds this metadata any more.
        unsafe { (self.drv.cufile.cuFileHandleDeregister)(self.handle) };
    }
}

/// The GDS backend.
pub struct GdsBackend {
    agent: String,
    params: GdsParams,
    drv: Arc<Driver>,
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
        let drv = driver(&params)?;
        Ok(GdsBackend {
            agent: ctx.agent,
            params,
            drv,
        })
    }

    fn mode(&self) -> &'static str {
        if self.drv.nvidia_fs {
            "cuFile (GPUDirect, nvidia-fs)"
        } else {
            "cuFile compatibility mode (no nvidia-fs: POSIX I/O through bounce buffers)"
        }
    }

    fn register_buf(&self, region: &RegionDesc) -> Result<BackendMd> {
        if region.kind == MemKind::Vram {
            let ord = i32::try_from(region.dev_id)
                .map_err(|_| Error::invalid(&self.agent, Op::RegisterMem, "bad GPU ordinal"))?;
            let (mut dev, mut ctx) = (0, std::ptr::null_mut());
            // SAFETY: out-pointers are valid; the driver was initialised in `driver()`.
            let mut rc = unsafe { (self.drv.cuda.cuDeviceGet)(&mut dev, ord) };
            if rc == 0 {
                // SAFETY: out-pointer valid; `dev` came from cuDeviceGet. The primary context
                // is retained for the process's lifetime (cuFile needs it current to register).
                rc = unsafe { (self.drv.cuda.cuDevicePrimaryCtxRetain)(&mut ctx, dev) };
            }
            if rc == 0 {
                // SAFETY: `ctx` is a valid retained context.
                rc = unsafe { (self.drv.cuda.cuCtxSetCurrent)(ctx) };
            }
            if rc != 0 {
                return Err(Error::invalid(
                    &self.agent,
                    Op::RegisterMem,
                    format!("GPU {ord}: CUresult {rc}"),
                ));
            }
        }
        let len = usize::try_from(region.len)
            .map_err(|_| Error::invalid(&self.agent, Op::RegisterMem, "region too large"))?;
        // SAFETY: the region is memory the agent keeps alive while this registration lives
        // (MemoryRegion contract); cuFile only records and pins it.
        let st =
            unsafe { (self.drv.cufile.cuFileBufRegister)(region.addr as *const c_void, len, 0) };
        if st.err != sys::CU_FILE_SUCCESS {
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
        if st.err != sys::CU_FILE_SUCCESS {
            return Err(Error::backend(
                &self.agent,
                GDS,
                Op::RegisterMem,
                format!(
                    "cuFileHandleRegister: cuFile error {} (is the file opened with O_DIRECT?)",
                    st.err
                ),
            ));
        }
        Ok(Arc::new(FileMd {
            drv: self.drv.clone(),
            handle,
            _fd: fd,
        }))
    }
}

impl Backend for GdsBackend {
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

    fn connection_info(&self) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }

    fn connect(&self, _remote: &str, _info: &[u8]) -> Result<()> {
        Ok(())
    }

    fn disconnect(&self, _remote: &str) -> Result<()> {
        Ok(())
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

    fn public_metadata(&self, _md: &BackendMd) -> Result<Vec<u8>> {
        Ok(Vec::new())
    }

    fn load_remote(&self, remote: &str, _region: &RegionDesc, _public: &[u8]) -> Result<BackendMd> {
        Err(Error::not_supported(
            &self.agent,
            Op::LoadMetadata,
            format!("GDS files of {remote} are not reachable from here"),
        ))
    }

    fn prepare_xfer(&self, spec: XferSpec) -> Result<Box<dyn BackendXfer>> {
        xfer::GdsXfer::create(
            &self.agent,
            self.drv.clone(),
            &self.params,
            spec,
            self.mode(),
        )
    }

    fn gen_notif(&self, remote: &str, _msg: &[u8]) -> Result<()> {
        Err(Error::not_supported(
            &self.agent,
            Op::GenNotif,
            format!("GDS has no notifications (to {remote})"),
        ))
    }

    fn path_report(&self, remote: &str) -> Option<String> {
        (remote == self.agent).then(|| self.mode().to_owned())
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
