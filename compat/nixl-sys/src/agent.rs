//! The agent (nixl-sys's `Agent`), on a nixl-rs agent.

use std::collections::{BTreeMap, HashSet};
use std::ffi::CString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::comm::Comm;
use crate::{
    map_err, refuse, Backend, MemList, NixlError, NotificationMap, OptArgs, ParamMap, Params,
    QueryResponseList, RegDescList, StringList, XferDescList, XferDlistHandle, XferOp, XferRequest,
};

/// nixl-rs's own backend, which NIXL has not: not listed among the plugins.
const HIDDEN_PLUGINS: &[&str] = &["INPROC"];

/// A NIXL agent that can create backends and manage memory: a cheap clonable handle.
#[derive(Debug, Clone)]
pub struct Agent {
    pub(crate) inner: Arc<AgentInner>,
}

/// A transfer's state.
#[derive(Debug, Clone, Copy, Eq, PartialEq)]
pub enum XferStatus {
    /// Every byte landed.
    Success,
    /// Still moving.
    InProgress,
}

impl XferStatus {
    /// Whether the transfer completed.
    pub fn is_success(&self) -> bool {
        *self == XferStatus::Success
    }
}

/// NIXL's thread-safety modes. nixl-rs agents are always safe to share between threads (the
/// strictest mode, without its global lock), so every mode behaves as `Strict`.
#[derive(Clone, Copy, Debug)]
pub enum ThreadSync {
    /// No locking in NIXL.
    None,
    /// One lock around every call in NIXL.
    Strict,
    /// Readers-writer locking in NIXL.
    Rw,
    /// NIXL's default.
    Default,
}

/// NIXL's default side-channel port.
pub const DEFAULT_COMM_PORT: i32 = 8888;

/// An agent's configuration (nixl-sys's `AgentConfig`).
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Run a progress thread (nixl-rs's `AgentConfig::progress_thread`).
    pub enable_prog_thread: bool,
    /// Serve NIXL's side channel on [`AgentConfig::listen_port`]: on 127.0.0.1, or on the
    /// address in `NIXL_RS_LISTEN_IP` (NIXL listens on every interface; the side channel has
    /// no authentication, so nixl-rs does so only when asked).
    pub enable_listen_thread: bool,
    /// The side channel's port (0 picks one).
    pub listen_port: i32,
    /// NIXL's locking mode (nixl-rs agents are always thread-safe).
    pub thread_sync: ThreadSync,
    /// Workers per backend in NIXL's C API (unused there too).
    pub num_workers: u32,
    /// The progress thread's delay between passes, in microseconds (0: nixl-rs's default).
    pub pthr_delay_us: u64,
    /// NIXL's listener poll delay; nixl-rs's listener is event-driven and has none.
    pub lthr_delay_us: u64,
    /// Capture per-request telemetry ([`XferRequest::get_telemetry`]); so does
    /// `NIXL_TELEMETRY_ENABLE=y`.
    pub capture_telemetry: bool,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            enable_prog_thread: true,
            enable_listen_thread: false,
            listen_port: DEFAULT_COMM_PORT,
            thread_sync: ThreadSync::None,
            num_workers: 1,
            pthr_delay_us: 0,
            lthr_delay_us: 100_000,
            capture_telemetry: false,
        }
    }
}

/// What one agent holds.
pub(crate) struct AgentInner {
    pub(crate) rs: nixl::Agent,
    pub(crate) telemetry: bool,
    /// Metadata in nixl-rs's own format instead of NIXL's (`NIXL_RS_METADATA=native`).
    pub(crate) native_md: bool,
    /// The parameters each backend was created with.
    pub(crate) params: Mutex<BTreeMap<String, ParamMap>>,
    /// Agents whose metadata this handle loaded or fetched (nixl-sys's `remotes`).
    pub(crate) remotes: Mutex<HashSet<String>>,
    /// Live registrations, for partial metadata.
    pub(crate) regs: Mutex<Vec<nixl::Registration>>,
    pub(crate) _listener: Option<nixl::nixl_wire::NixlListener>,
    pub(crate) comm: Comm,
    #[cfg(feature = "etcd")]
    pub(crate) etcd: Mutex<Option<Arc<nixl::core::etcd::EtcdExchange>>>,
}

impl std::fmt::Debug for AgentInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.rs.name())
            .finish_non_exhaustive()
    }
}

impl AgentInner {
    /// Drops deregistered registrations from the list partial metadata picks from (the
    /// same memory may be registered twice, each handle on its own).
    pub(crate) fn forget_deregistered(&self) {
        self.regs.lock().retain(|r| !r.is_deregistered());
    }
}

/// Whether an environment flag is on (NIXL's `y`, `yes`, `on`, `1`, `true`).
fn env_flag(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| {
        ["y", "yes", "on", "1", "true"]
            .iter()
            .any(|t| v.eq_ignore_ascii_case(t))
    })
}

/// `InvalidParam` (as a C string conversion would fail) for a name with a NUL byte.
pub(crate) fn c_name(s: &str) -> Result<(), NixlError> {
    CString::new(s)?;
    Ok(())
}

/// The memory kinds each plugin can take (what its backend declares where the hardware is
/// there; a backend made here reports the subset this machine has: UCX without a GPU, DRAM).
pub(crate) fn plugin_kinds(plugin: &str) -> Vec<nixl::MemKind> {
    use nixl::MemKind::*;
    match plugin {
        "UCX" | "LIBFABRIC" | "CUDA_IPC" => vec![Dram, Vram],
        "POSIX" => vec![Dram, Vram, Block, File],
        "GDS" => vec![Dram, Vram, File],
        "OBJ" => vec![Dram, Object],
        "INPROC" => vec![Dram],
        _ => Vec::new(),
    }
}

/// NIXL's parameter names for the UCX plugin, as nixl-rs's, and nixl-rs's defaults for a
/// NIXL program: UCX's context mirrors NIXL's (`nixl_compat`), so stock NIXL peers select the
/// same lanes. A NIXL key nixl-rs does not have is left in, and refused by the backend.
fn ucx_params(mut map: ParamMap) -> ParamMap {
    if let Some(v) = map.remove("ucx_devices") {
        map.entry("devices".to_owned()).or_insert(v);
    }
    // nixl-rs always handles peer failures as NIXL's "peer" mode does.
    if map.get("ucx_error_handling_mode").map(String::as_str) == Some("peer") {
        map.remove("ucx_error_handling_mode");
    }
    map.entry("nixl_compat".to_owned())
        .or_insert_with(|| "true".to_owned());
    map
}

pub(crate) fn hints(opt: Option<&OptArgs>) -> Vec<nixl::core::BackendHandle> {
    opt.map(|o| o.backends.clone()).unwrap_or_default()
}

/// `InvalidParam` for a transfer call given a custom parameter: no nixl-rs backend takes one.
fn no_custom_param(opt: Option<&OptArgs>) -> Result<(), NixlError> {
    match opt {
        Some(o) if !o.custom_param.is_empty() => Err(refuse(
            nixl::ErrorKind::NotSupported,
            "no nixl-rs backend takes a custom parameter blob (OptArgs::set_custom_param)"
                .to_owned(),
            NixlError::InvalidParam,
        )),
        _ => Ok(()),
    }
}

fn xfer_options(opt: Option<&OptArgs>) -> nixl::XferOptions {
    let o = nixl::XferOptions::default();
    match opt {
        None => o,
        Some(a) => o
            .notif(a.notif())
            .backends(a.backends.clone())
            .no_merge(a.skip_merge),
    }
}

impl Agent {
    /// Creates a new agent with the given name (NIXL's default configuration: a progress
    /// thread, no listener).
    pub fn new(name: &str) -> Result<Self, NixlError> {
        Self::new_configured(name, &AgentConfig::default())
    }

    /// Creates a new agent with the given configuration.
    pub fn new_configured(name: &str, cfg: &AgentConfig) -> Result<Self, NixlError> {
        c_name(name)?;
        let telemetry = cfg.capture_telemetry || env_flag("NIXL_TELEMETRY_ENABLE");
        let listen_ip = match std::env::var("NIXL_RS_LISTEN_IP") {
            Ok(ip) => ip.parse::<IpAddr>().map_err(|_| {
                refuse(
                    nixl::ErrorKind::InvalidParam,
                    format!("NIXL_RS_LISTEN_IP={ip} is not an IP address"),
                    NixlError::InvalidParam,
                )
            })?,
            Err(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        let mut config = nixl::agent_config()
            .progress_thread(cfg.enable_prog_thread)
            .telemetry(telemetry)
            // Asked for by setting NIXL_RS_LISTEN_IP to a non-loopback address.
            .allow_unauthenticated_listener(!listen_ip.is_loopback());
        if cfg.pthr_delay_us > 0 {
            config = config.progress_delay(Duration::from_micros(cfg.pthr_delay_us));
        }
        let rs = nixl::Agent::new(name, config).map_err(map_err)?;
        let listener = if cfg.enable_listen_thread {
            let port = u16::try_from(cfg.listen_port).map_err(|_| {
                refuse(
                    nixl::ErrorKind::InvalidParam,
                    format!("listen_port {} is not a port", cfg.listen_port),
                    NixlError::InvalidParam,
                )
            })?;
            let l = nixl::nixl_wire::NixlListener::start(&rs, SocketAddr::new(listen_ip, port))
                .map_err(map_err)?;
            Some(l)
        } else {
            None
        };
        Ok(Agent {
            inner: Arc::new(AgentInner {
                rs,
                telemetry,
                native_md: std::env::var("NIXL_RS_METADATA").is_ok_and(|v| v == "native"),
                params: Mutex::new(BTreeMap::new()),
                remotes: Mutex::new(HashSet::new()),
                regs: Mutex::new(Vec::new()),
                _listener: listener,
                comm: Comm::new(),
                #[cfg(feature = "etcd")]
                etcd: Mutex::new(None),
            }),
        })
    }

    /// Gets the name of the agent.
    pub fn name(&self) -> String {
        self.inner.rs.name().to_owned()
    }

    /// The nixl-rs agent underneath, for what nixl-sys's API has no word for (futures, leases,
    /// KV plans). An addition to nixl-sys's API.
    pub fn as_nixl(&self) -> &nixl::Agent {
        &self.inner.rs
    }

    /// The address NIXL's side channel of this agent listens on
    /// ([`AgentConfig::enable_listen_thread`]). An addition to nixl-sys's API.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.inner._listener.as_ref().map(|l| l.local_addr())
    }

    /// Side-channel sends and fetches that failed off the caller's thread (they return at
    /// once, as NIXL's do; [`crate::last_error`] on that thread is not the caller's). An
    /// addition to nixl-sys's API.
    pub fn comm_failures(&self) -> u64 {
        self.inner.comm.failures()
    }

    /// The plugins this build has (`UCX`, `POSIX`, ... per cargo feature).
    pub fn get_available_plugins(&self) -> Result<StringList, NixlError> {
        let names = self
            .inner
            .rs
            .available_backends()
            .into_iter()
            .filter(|n| !HIDDEN_PLUGINS.contains(&n.as_str()))
            .collect();
        Ok(StringList::new(names))
    }

    /// The plugin's memory types and default parameters (`BackendError` for a plugin this
    /// build has not).
    pub fn get_plugin_params(&self, plugin_name: &str) -> Result<(MemList, Params), NixlError> {
        c_name(plugin_name)?;
        let mut map = self
            .inner
            .rs
            .backend_params(plugin_name)
            .map_err(map_err)
            .map_err(|_| NixlError::BackendError)?;
        if plugin_name == "UCX" {
            map = ucx_params(map);
        }
        Ok((
            MemList::from_kinds(plugin_kinds(plugin_name)),
            Params::from_map(map),
        ))
    }

    /// Creates a backend of `plugin` with `params` (nixl-rs's parameter names; NIXL's UCX
    /// names `ucx_devices` and `ucx_error_handling_mode=peer` are taken too). A parameter
    /// nixl-rs has not is `InvalidParam`, never ignored.
    pub fn create_backend(&self, plugin: &str, params: &Params) -> Result<Backend, NixlError> {
        if plugin.contains('\0') {
            return Err(NixlError::InvalidParam);
        }
        let mut map = params.map.clone();
        if plugin == "UCX" {
            map = ucx_params(map);
        }
        let handle =
            self.inner
                .rs
                .create_backend_named(plugin, &map)
                .map_err(|e| match map_err(e) {
                    NixlError::InvalidParam => NixlError::InvalidParam,
                    _ => NixlError::BackendError,
                })?;
        self.inner.params.lock().insert(plugin.to_owned(), map);
        Ok(Backend { handle })
    }

    /// The backend of `name` created on this agent.
    pub fn get_backend(&self, name: &str) -> Option<Backend> {
        self.inner.rs.backend(name).map(|handle| Backend { handle })
    }

    /// A backend's memory types and the parameters it was created with.
    pub fn get_backend_params(&self, backend: &Backend) -> Result<(MemList, Params), NixlError> {
        let name = backend.handle.name();
        let map = self
            .inner
            .params
            .lock()
            .get(name)
            .cloned()
            .ok_or(NixlError::BackendError)?;
        Ok((
            MemList::from_kinds(backend.handle.capabilities().mem_kinds.iter().copied()),
            Params::from_map(map),
        ))
    }

    /// Whether the storage `descs` name exists, and its size (`size`), per descriptor.
    pub fn query_mem(
        &self,
        descs: &RegDescList,
        opt_args: Option<&OptArgs>,
    ) -> Result<QueryResponseList, NixlError> {
        let regions = descs.regions()?;
        if regions.is_empty() {
            return Ok(QueryResponseList::default());
        }
        let answers = self
            .inner
            .rs
            .query_mem(&regions, &hints(opt_args))
            .map_err(map_err)?;
        let items = answers
            .into_iter()
            .map(|a| {
                a.filter(|q| q.exists).map(|q| {
                    let mut m = ParamMap::new();
                    if let Some(size) = q.size {
                        m.insert("size".to_owned(), size.to_string());
                    }
                    Params::from_map(m)
                })
            })
            .collect();
        Ok(QueryResponseList { items })
    }

    /// Connects to a loaded peer (nixl-rs connects when it loads one: this checks it is
    /// loaded, `NotFound` otherwise).
    pub fn make_connection(
        &self,
        remote_agent: &str,
        opt_args: Option<&OptArgs>,
    ) -> Result<(), NixlError> {
        c_name(remote_agent)?;
        let _ = opt_args;
        if self.inner.rs.remote_generation(remote_agent).is_none() {
            return Err(refuse(
                nixl::ErrorKind::NotFound,
                format!("remote agent {remote_agent} is not loaded"),
                NixlError::NotFound,
            ));
        }
        Ok(())
    }

    /// Prepares a descriptor list once: `""` for this agent's side of transfers (NIXL's
    /// `NIXL_INIT_AGENT`), a loaded agent's name (or this agent's, for loopback and storage)
    /// for the target side.
    pub fn prepare_xfer_dlist(
        &self,
        agent_name: &str,
        descs: &XferDescList,
        opt_args: Option<&OptArgs>,
    ) -> Result<XferDlistHandle, NixlError> {
        c_name(agent_name)?;
        let target = if agent_name.is_empty() {
            nixl::XferTarget::Initiator
        } else {
            nixl::XferTarget::Agent(agent_name)
        };
        let prepared = self
            .inner
            .rs
            .prep_xfer_dlist(target, &descs.to_rs()?, &hints(opt_args))
            .map_err(map_err)?;
        Ok(XferDlistHandle { prepared })
    }

    /// Builds a request from two prepared lists by index (`InvalidParam` for a negative or
    /// out-of-range index, or lists of different lengths).
    pub fn make_xfer_req(
        &self,
        operation: XferOp,
        local_descs: &XferDlistHandle,
        local_indices: &[i32],
        remote_descs: &XferDlistHandle,
        remote_indices: &[i32],
        opt_args: Option<&OptArgs>,
    ) -> Result<XferRequest, NixlError> {
        no_custom_param(opt_args)?;
        let idx = |v: &[i32]| {
            v.iter()
                .map(|&i| usize::try_from(i).map_err(|_| NixlError::InvalidParam))
                .collect::<Result<Vec<usize>, _>>()
        };
        let (l, r) = (idx(local_indices)?, idx(remote_indices)?);
        let req = self
            .inner
            .rs
            .make_prepped_xfer(
                operation.rs(),
                &local_descs.prepared,
                &l,
                &remote_descs.prepared,
                &r,
                xfer_options(opt_args),
            )
            .map_err(map_err)?;
        Ok(XferRequest::new(req, self.inner.telemetry))
    }

    /// Sends a notification to a loaded peer (through `backend` when given).
    pub fn send_notification(
        &self,
        remote_agent: &str,
        message: &[u8],
        backend: Option<&Backend>,
    ) -> Result<(), NixlError> {
        c_name(remote_agent)?;
        let hints: Vec<nixl::core::BackendHandle> =
            backend.map(|b| b.handle.clone()).into_iter().collect();
        self.inner
            .rs
            .gen_notif(remote_agent, message, &hints)
            .map_err(map_err)
    }

    /// Builds a request from two descriptor lists (`InvalidParam`, else
    /// `FailedToCreateXferRequest`, as nixl-sys maps them; [`crate::last_error`] says why).
    pub fn create_xfer_req(
        &self,
        operation: XferOp,
        local_descs: &XferDescList,
        remote_descs: &XferDescList,
        remote_agent: &str,
        opt_args: Option<&OptArgs>,
    ) -> Result<XferRequest, NixlError> {
        c_name(remote_agent)?;
        no_custom_param(opt_args)?;
        let req = self
            .inner
            .rs
            .create_xfer_req(
                operation.rs(),
                &local_descs.to_rs()?,
                &remote_descs.to_rs()?,
                remote_agent,
                xfer_options(opt_args),
            )
            .map_err(|e| match map_err(e) {
                NixlError::InvalidParam => NixlError::InvalidParam,
                _ => NixlError::FailedToCreateXferRequest,
            })?;
        Ok(XferRequest::new(req, self.inner.telemetry))
    }

    /// The backend's estimate of the request's duration and its margin, in microseconds
    /// (`BackendError` where the backend has no model).
    pub fn estimate_xfer_cost(
        &self,
        req: &XferRequest,
        opt_args: Option<&OptArgs>,
    ) -> Result<(i64, i64, crate::CostMethod), NixlError> {
        let _ = opt_args;
        match self
            .inner
            .rs
            .estimate_xfer_cost(&req.req)
            .map_err(map_err)?
        {
            Some(c) => Ok((
                i64::try_from(c.duration.as_micros()).unwrap_or(i64::MAX),
                i64::try_from(c.error_margin.as_micros()).unwrap_or(i64::MAX),
                match c.method {
                    nixl::core::backend::CostMethod::Analytical => {
                        crate::CostMethod::AnalyticalBackend
                    }
                    _ => crate::CostMethod::Unknown,
                },
            )),
            None => Err(refuse(
                nixl::ErrorKind::NotSupported,
                format!("backend {} has no cost model", req.req.backend().name()),
                NixlError::BackendError,
            )),
        }
    }

    /// Posts a request (a notification in `opt_args` replaces the request's). `Ok(true)` while
    /// in flight, `Ok(false)` when it completed at once.
    pub fn post_xfer_req(
        &self,
        req: &XferRequest,
        opt_args: Option<&OptArgs>,
    ) -> Result<bool, NixlError> {
        no_custom_param(opt_args)?;
        if let Some(msg) = opt_args.and_then(OptArgs::notif) {
            req.req.set_notif(Some(msg)).map_err(map_err)?;
        }
        let st = self.inner.rs.post_xfer_req(&req.req);
        req.posted.store(true, std::sync::atomic::Ordering::Release);
        match st.map_err(map_err)? {
            nixl::XferState::Done => Ok(false),
            nixl::XferState::InProgress => Ok(true),
        }
    }

    /// The request's state: an error (a dead peer, a deadline) is the typed nixl-rs error
    /// mapped as NIXL maps its statuses; [`crate::last_error`] has the kind.
    pub fn get_xfer_status(&self, req: &XferRequest) -> Result<XferStatus, NixlError> {
        match self.inner.rs.check_xfer_state(&req.req).map_err(map_err)? {
            nixl::XferState::Done => Ok(XferStatus::Success),
            nixl::XferState::InProgress => Ok(XferStatus::InProgress),
        }
    }

    /// The backend the request uses.
    pub fn query_xfer_backend(&self, req: &XferRequest) -> Result<Backend, NixlError> {
        Ok(Backend {
            handle: self.inner.rs.query_xfer_backend(&req.req),
        })
    }

    /// Appends the notifications received since the last call to `notifs`.
    pub fn get_notifications(
        &self,
        notifs: &mut NotificationMap,
        opt_args: Option<&OptArgs>,
    ) -> Result<(), NixlError> {
        let _ = opt_args;
        let got = self.inner.rs.get_notifs().map_err(map_err)?;
        notifs.extend(got);
        Ok(())
    }
}
