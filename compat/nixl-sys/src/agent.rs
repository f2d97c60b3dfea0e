//! The agent (nixl-sys's `Agent`), on a nixl-rs agent.

use std::collections::{BTreeMap, HashSet};
use std::ffi::CString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::comm::Comm;
use crate::{
    map_err, refuse, Backend, MemList, MemView, NixlDescriptor, NixlError, NotificationMap,
    OptArgs, ParamMap, Params, QueryResponseList, RegDescList, RegistrationHandle, RemoteDescList,
    StringList, XferDescList, XferDlistHandle, XferOp, XferRequest,
};

/// How long a side-channel or etcd fetch waits for the peer's metadata (NIXL's fetches wait
/// on its comm thread without a bound).
const FETCH_WAIT: Duration = Duration::from_secs(30);

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
    telemetry: bool,
    /// Metadata in nixl-rs's own format instead of NIXL's (`NIXL_RS_METADATA=native`).
    native_md: bool,
    /// The parameters each backend was created with.
    params: Mutex<BTreeMap<String, ParamMap>>,
    /// Agents whose metadata this handle loaded or fetched (nixl-sys's `remotes`).
    remotes: Mutex<HashSet<String>>,
    /// Live registrations, for partial metadata.
    regs: Mutex<Vec<nixl::Registration>>,
    _listener: Option<nixl::nixl_wire::NixlListener>,
    comm: Comm,
    #[cfg(feature = "etcd")]
    etcd: Mutex<Option<Arc<nixl::core::etcd::EtcdExchange>>>,
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
fn c_name(s: &str) -> Result<(), NixlError> {
    CString::new(s)?;
    Ok(())
}

/// The memory kinds each plugin takes (as NIXL's `getPluginParams` lists them).
pub(crate) fn plugin_kinds(plugin: &str) -> Vec<nixl::MemKind> {
    use nixl::MemKind::*;
    match plugin {
        "UCX" | "LIBFABRIC" => vec![Dram, Vram],
        "POSIX" => vec![Dram, File],
        "GDS" => vec![Dram, Vram, File],
        "OBJ" => vec![Dram, Object],
        "CUDA_IPC" => vec![Vram],
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

/// The side-channel address in `opt` (NIXL's port 8888 without one); `None` without an IP.
fn peer_addr(opt: Option<&OptArgs>) -> Result<Option<SocketAddr>, NixlError> {
    let Some(o) = opt else { return Ok(None) };
    let Some(ip) = &o.ip_addr else {
        return Ok(None);
    };
    let port = o.port.unwrap_or(DEFAULT_COMM_PORT as u16);
    (ip.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(Some)
        .ok_or_else(|| {
            refuse(
                nixl::ErrorKind::InvalidParam,
                format!("{ip}:{port} is not an address"),
                NixlError::InvalidParam,
            )
        })
}

fn hints(opt: Option<&OptArgs>) -> Vec<nixl::core::BackendHandle> {
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

    /// Side-channel sends and fetches that failed on the agent's comm thread (they return at
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
        let handle = self
            .inner
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

    /// Registers a memory descriptor with the agent (with the backends in `opt_args`, or
    /// every backend that takes its type). [`crate::SystemStorage`] is kept alive by the agent;
    /// any other descriptor's pointer and size are trusted, as nixl-sys does, until the handle
    /// deregisters.
    pub fn register_memory(
        &self,
        descriptor: &impl NixlDescriptor,
        opt_args: Option<&OptArgs>,
    ) -> Result<RegistrationHandle, NixlError> {
        let mem_type = descriptor.mem_type();
        let kind = mem_type.require_kind()?;
        // SAFETY: only the address is read, as a number.
        let ptr = unsafe { descriptor.as_ptr() } as usize;
        let (size, dev_id) = (descriptor.size(), descriptor.device_id());
        let region: Arc<dyn nixl::MemoryRegion> = match descriptor.owned_region() {
            Some(r) => r,
            None => {
                let desc = nixl::RegionDesc {
                    kind,
                    addr: ptr as u64,
                    len: size as u64,
                    dev_id,
                    meta: Vec::new(),
                };
                // SAFETY: nixl-sys's contract for `register_memory`, which this signature
                // keeps: the descriptor's bytes stay valid while the registration lives (the
                // caller drops the handle, or the storage holding it, before freeing them).
                Arc::new(unsafe { nixl::core::backend::RawRegion::new(desc) })
            }
        };
        let reg = self
            .inner
            .rs
            .register_mem(vec![region], &hints(opt_args))
            .map_err(map_err)?;
        self.inner.regs.lock().push(reg.clone());
        Ok(RegistrationHandle {
            agent: Some(self.clone()),
            reg: Some(reg),
            ptr,
            size,
            dev_id,
            mem_type,
        })
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

    /// NIXL's device API (memory views for GPU-initiated transfers): nixl-rs has none, so
    /// this is `BackendError` ([`crate::last_error`]: `NotSupported`).
    ///
    /// # Safety
    ///
    /// nixl-sys's contract: the memory `descs` names outlives the view.
    pub unsafe fn prep_mem_view_local(
        &self,
        descs: &XferDescList,
        opt_args: Option<&OptArgs>,
    ) -> Result<MemView, NixlError> {
        let _ = (descs, opt_args);
        Err(refuse(
            nixl::ErrorKind::NotSupported,
            "device-side memory views (NIXL's device API) are not implemented by nixl-rs"
                .to_owned(),
            NixlError::BackendError,
        ))
    }

    /// NIXL's device API for remote memory: `NotFound` when no entry names a loaded agent,
    /// else `BackendError` (nixl-rs has no device API).
    ///
    /// # Safety
    ///
    /// nixl-sys's contract: the memory `descs` names outlives the view.
    pub unsafe fn prep_mem_view_remote(
        &self,
        descs: &RemoteDescList,
        opt_args: Option<&OptArgs>,
    ) -> Result<MemView, NixlError> {
        let _ = (opt_args, descs.mem_type);
        let loaded = self.inner.rs.remotes();
        let named: Vec<&String> = descs.descs.iter().filter_map(|d| d.3.as_ref()).collect();
        if named.is_empty() || named.iter().any(|n| !loaded.contains(n)) {
            return Err(refuse(
                nixl::ErrorKind::NotFound,
                "a remote memory view names no loaded agent".to_owned(),
                NixlError::NotFound,
            ));
        }
        Err(refuse(
            nixl::ErrorKind::NotSupported,
            "device-side memory views (NIXL's device API) are not implemented by nixl-rs"
                .to_owned(),
            NixlError::BackendError,
        ))
    }

    /// The agent's metadata, in NIXL's wire format (a stock NIXL agent loads it), or in
    /// nixl-rs's own with `NIXL_RS_METADATA=native`.
    pub fn get_local_md(&self) -> Result<Vec<u8>, NixlError> {
        let r = if self.inner.native_md {
            self.inner.rs.local_metadata()
        } else {
            self.inner.rs.nixl().local_metadata()
        };
        r.map_err(map_err)
    }

    /// The metadata of the registrations `descs` name (`NotFound` for a descriptor no live
    /// registration covers); connection info only, of every backend, for an empty list.
    pub fn get_local_partial_md(
        &self,
        descs: &RegDescList,
        opt_args: Option<&OptArgs>,
    ) -> Result<Vec<u8>, NixlError> {
        let _ = opt_args;
        let regions = descs.regions()?;
        let regs: Vec<nixl::Registration> = {
            let mut live = self.inner.regs.lock();
            live.retain(|r| !r.is_deregistered());
            let mut picked: Vec<nixl::Registration> = Vec::new();
            for want in &regions {
                let reg = live.iter().find(|r| {
                    r.regions()
                        .iter()
                        .any(|h| h.kind == want.kind && h.covers(want.addr, want.len, want.dev_id))
                });
                match reg {
                    Some(r) => picked.push(r.clone()),
                    None => {
                        return Err(refuse(
                            nixl::ErrorKind::NotFound,
                            format!(
                                "no registration covers {:#x}+{} on device {}",
                                want.addr, want.len, want.dev_id
                            ),
                            NixlError::NotFound,
                        ))
                    }
                }
            }
            picked
        };
        let refs: Vec<&nixl::Registration> = regs.iter().collect();
        let sel = nixl::core::MetadataSelection {
            registrations: Some(&refs),
            include_conn: refs.is_empty(),
        };
        let r = if self.inner.native_md {
            self.inner.rs.local_partial_metadata(&sel)
        } else {
            self.inner.rs.nixl().local_partial_metadata(&sel)
        };
        r.map_err(map_err)
    }

    /// Loads a peer's metadata (NIXL's blob or nixl-rs's); returns its name.
    pub fn load_remote_md(&self, metadata: &[u8]) -> Result<String, NixlError> {
        let name = self
            .inner
            .rs
            .load_remote_metadata(metadata)
            .map_err(map_err)?;
        self.inner.remotes.lock().insert(name.clone());
        Ok(name)
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

    /// Whether `remote_agent`'s metadata is loaded, and covers `descs` when given.
    pub fn check_remote_metadata(&self, remote_agent: &str, descs: Option<&XferDescList>) -> bool {
        if remote_agent.contains('\0') {
            return false;
        }
        let list = match descs.map(XferDescList::to_rs).transpose() {
            Ok(l) => l,
            Err(_) => return false,
        };
        self.inner
            .rs
            .check_remote_metadata(remote_agent, list.as_ref())
    }

    /// Forgets a peer this handle loaded (`InvalidParam` for one it did not).
    pub fn invalidate_remote_md(&self, remote_agent: &str) -> Result<(), NixlError> {
        if !self.inner.remotes.lock().contains(remote_agent) {
            return Err(NixlError::InvalidParam);
        }
        match self.inner.rs.invalidate_remote_metadata(remote_agent) {
            Ok(()) => {}
            Err(e) if e.kind() == nixl::ErrorKind::NotFound => {}
            Err(e) => return Err(map_err(e)),
        }
        self.inner.remotes.lock().remove(remote_agent);
        Ok(())
    }

    /// Forgets every peer this handle loaded.
    pub fn invalidate_all_remotes(&self) -> Result<(), NixlError> {
        let names: Vec<String> = self.inner.remotes.lock().iter().cloned().collect();
        for n in names {
            self.invalidate_remote_md(&n)?;
        }
        Ok(())
    }

    /// Publishes this agent's metadata: to the NIXL side channel at `opt_args`' address (sent
    /// on the agent's comm thread: this returns at once, as NIXL's does), else to etcd
    /// (`NIXL_ETCD_ENDPOINTS`, NIXL's keys).
    pub fn send_local_md(&self, opt_args: Option<&OptArgs>) -> Result<(), NixlError> {
        if let Some(addr) = peer_addr(opt_args)? {
            let rs = self.inner.rs.clone();
            return self
                .inner
                .comm
                .submit(move || rs.nixl().send_local_metadata(addr));
        }
        self.etcd(|x| x.publish())
    }

    /// Publishes the metadata of the registrations `descs` name to the NIXL side channel at
    /// `opt_args`' address. Through etcd NIXL needs a label nixl-sys cannot set:
    /// `InvalidParam`.
    pub fn send_local_partial_md(
        &self,
        descs: &RegDescList,
        opt_args: Option<&OptArgs>,
    ) -> Result<(), NixlError> {
        let md = self.get_local_partial_md(descs, opt_args)?;
        match peer_addr(opt_args)? {
            Some(addr) => {
                let rs = self.inner.rs.clone();
                self.inner
                    .comm
                    .submit(move || rs.nixl().send_metadata_bytes(addr, &md))
            }
            None => Err(refuse(
                nixl::ErrorKind::InvalidParam,
                "partial metadata through etcd needs a label, which nixl-sys's OptArgs cannot \
                 carry"
                    .to_owned(),
                NixlError::InvalidParam,
            )),
        }
    }

    /// Fetches and loads `remote_name`'s metadata: from the NIXL side channel at `opt_args`'
    /// address, else from etcd. It runs on the agent's comm thread (waiting up to 30 s for the
    /// peer to publish) and returns at once, as NIXL's does: poll
    /// [`Agent::check_remote_metadata`].
    pub fn fetch_remote_md(
        &self,
        remote_name: &str,
        opt_args: Option<&OptArgs>,
    ) -> Result<(), NixlError> {
        c_name(remote_name)?;
        let name = remote_name.to_owned();
        if let Some(addr) = peer_addr(opt_args)? {
            let rs = self.inner.rs.clone();
            self.inner.comm.submit(move || {
                rs.nixl()
                    .fetch_remote_metadata_blocking(&name, addr, FETCH_WAIT)
                    .map(|_| ())
            })?;
        } else {
            self.etcd_async(move |x| x.fetch(&name, FETCH_WAIT).map(|_| ()))?;
        }
        self.inner.remotes.lock().insert(remote_name.to_owned());
        Ok(())
    }

    /// Withdraws this agent's metadata: from the NIXL side channel at `opt_args`' address
    /// (on the comm thread), else from etcd.
    pub fn invalidate_local_md(&self, opt_args: Option<&OptArgs>) -> Result<(), NixlError> {
        if let Some(addr) = peer_addr(opt_args)? {
            let rs = self.inner.rs.clone();
            return self
                .inner
                .comm
                .submit(move || rs.nixl().invalidate_local_metadata(addr));
        }
        self.etcd(|x| x.invalidate_local())
    }

    /// Sends a notification to a loaded peer (through `backend` when given).
    pub fn send_notification(
        &self,
        remote_agent: &str,
        message: &[u8],
        backend: Option<&Backend>,
    ) -> Result<(), NixlError> {
        c_name(remote_agent)?;
        let hints: Vec<nixl::core::BackendHandle> = backend.map(|b| b.handle.clone()).into_iter().collect();
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
        match self.inner.rs.estimate_xfer_cost(&req.req).map_err(map_err)? {
            Some(c) => Ok((
                i64::try_from(c.duration.as_micros()).unwrap_or(i64::MAX),
                i64::try_from(c.error_margin.as_micros()).unwrap_or(i64::MAX),
                match c.method {
                    nixl::core::backend::CostMethod::Analytical => crate::CostMethod::AnalyticalBackend,
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
    pub fn post_xfer_req(&self, req: &XferRequest, opt_args: Option<&OptArgs>) -> Result<bool, NixlError> {
        no_custom_param(opt_args)?;
        if let Some(msg) = opt_args.and_then(OptArgs::notif) {
            req.req.set_notif(Some(msg)).map_err(map_err)?;
        }
        let st = self.inner.rs.post_xfer_req(&req.req);
        req.posted
            .store(true, std::sync::atomic::Ordering::Release);
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

    /// Runs `f` on the agent's etcd exchange, made at first use from `NIXL_ETCD_ENDPOINTS`.
    #[cfg(feature = "etcd")]
    fn etcd(
        &self,
        f: impl FnOnce(&nixl::core::etcd::EtcdExchange) -> nixl::Result<()>,
    ) -> Result<(), NixlError> {
        let x = self.etcd_exchange()?;
        f(&x).map_err(map_err)
    }

    #[cfg(feature = "etcd")]
    fn etcd_async(
        &self,
        f: impl FnOnce(&nixl::core::etcd::EtcdExchange) -> nixl::Result<()> + Send + 'static,
    ) -> Result<(), NixlError> {
        let x = self.etcd_exchange()?;
        self.inner.comm.submit(move || f(&x))
    }

    #[cfg(feature = "etcd")]
    fn etcd_exchange(&self) -> Result<Arc<nixl::core::etcd::EtcdExchange>, NixlError> {
        use nixl::core::etcd::{EtcdConfig, EtcdExchange, ENV_ENDPOINTS};
        let mut slot = self.inner.etcd.lock();
        if let Some(x) = &*slot {
            return Ok(x.clone());
        }
        if std::env::var_os(ENV_ENDPOINTS).is_none() {
            return Err(no_exchange());
        }
        let x = Arc::new(
            EtcdExchange::new(&self.inner.rs, &EtcdConfig::default().nixl_keys(true))
                .map_err(map_err)?,
        );
        *slot = Some(x.clone());
        Ok(x)
    }

    #[cfg(not(feature = "etcd"))]
    fn etcd<T>(&self, _f: T) -> Result<(), NixlError> {
        Err(no_exchange())
    }

    #[cfg(not(feature = "etcd"))]
    fn etcd_async<T>(&self, _f: T) -> Result<(), NixlError> {
        Err(no_exchange())
    }
}

/// No side-channel address and no etcd: NIXL's `NOT_SUPPORTED` (a `BackendError`).
fn no_exchange() -> NixlError {
    refuse(
        nixl::ErrorKind::NotSupported,
        "no peer address in OptArgs (set_ip_addr) and no etcd (NIXL_ETCD_ENDPOINTS, feature \
         `etcd`)"
            .to_owned(),
        NixlError::BackendError,
    )
}
