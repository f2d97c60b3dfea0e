//! The agent: a cheap clonable handle to one process's transfer endpoint.

// One file per operation family; three rooms for the families with several files: `make`
// (building requests: by index, by block ids, by tiles), `nixl` (NIXL's wire: metadata, the
// side channel's commands, the view), `peers` (notifications, the side channel, succession).
mod config;
mod future;
mod here;
pub(crate) mod lease;
mod load;
pub(crate) mod make;
mod nixl;
pub(crate) mod options;
pub(crate) mod peers;
mod post;
pub(crate) mod prep;
pub(crate) mod registration;
pub(crate) mod remote;
pub(crate) mod request;
mod shared;
pub(crate) mod spec;

pub use future::{LeaseEnd, NotifStream, Notification, QuiescenceFuture, XferFuture};
pub use peers::sidechannel::FetchFuture;

pub use config::{AgentConfig, FetchPolicy, Share};
pub(crate) use shared::{start_progress_thread_soon, FetchStatus, Shared, MAX_UNCERTAIN};

use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::agent::options::UncertainXfer;
use crate::agent::registration::RegTable;
use crate::agent::remote::RemotePeer;
use crate::auth::{Auth, Bindings, Signer};
use crate::backend::{
    Backend, BackendContext, BackendParams, BackendPlugin, Capabilities, QueryResult,
};
use crate::error::{Error, Op, Result};
use crate::limits::Limits;
use crate::mem::RegionDesc;
use crate::notif::{NotifQueue, Notifs};
use crate::telemetry::{self, Counters, TelemetrySnapshot};

/// A backend created on an agent.
pub(crate) struct BackendSlot {
    pub id: usize,
    pub name: String,
    pub backend: Arc<dyn Backend>,
    pub caps: Capabilities,
}

/// The peer-facing calls the agent makes on a backend, with what they mean for a local-only
/// one (no [`crate::backend::Backend::peers`]: a storage engine).
impl BackendSlot {
    /// Connection info for the agent's metadata; none for a local-only backend.
    pub(crate) fn connection_info(&self) -> Result<Vec<u8>> {
        self.backend
            .peers()
            .map_or(Ok(Vec::new()), |p| p.connection_info())
    }

    /// The keys a peer needs for a registered region (none for a local-only backend),
    /// borrowed from the metadata where the backend keeps them there.
    pub(crate) fn public_metadata_cow<'a>(
        &self,
        md: &'a crate::backend::BackendMd,
    ) -> Result<std::borrow::Cow<'a, [u8]>> {
        let Some(p) = self.backend.peers() else {
            return Ok(std::borrow::Cow::Borrowed(&[]));
        };
        match p.public_metadata_ref(md) {
            Some(b) => Ok(std::borrow::Cow::Borrowed(b)),
            None => p.public_metadata(md).map(std::borrow::Cow::Owned),
        }
    }

    /// Connects to a peer; a local-only backend has nothing to connect to (a peer's metadata
    /// may list it).
    pub(crate) fn connect_peer(
        &self,
        remote: &str,
        info: &[u8],
        process: Option<&crate::liveness::PeerProcess>,
    ) -> Result<()> {
        match self.backend.peers() {
            Some(p) => p.connect_peer(remote, info, process),
            None => {
                tracing::trace!(remote, backend = %self.name, "local-only backend ignores peers");
                Ok(())
            }
        }
    }

    /// Forgets a peer (nothing to forget for a local-only backend).
    pub(crate) fn disconnect(&self, remote: &str) -> Result<()> {
        self.backend
            .peers()
            .map_or(Ok(()), |p| p.disconnect(remote))
    }

    /// Loads a peer's region; a local-only backend reaches no peer's regions.
    pub(crate) fn load_remote(
        &self,
        me: &str,
        remote: &str,
        region: &crate::RegionDesc,
        public: &[u8],
    ) -> Result<crate::backend::BackendMd> {
        match self.backend.peers() {
            Some(p) => p.load_remote(remote, region, public),
            None => Err(Error::not_supported(
                me,
                Op::LoadMetadata,
                format!(
                    "{}'s regions of {remote} are not reachable from here",
                    self.name
                ),
            )),
        }
    }

    /// Sends a standalone notification (`post`: a control message that waits for nothing,
    /// [`PeerBackend::post_notif`]); a local-only backend has none.
    pub(crate) fn gen_notif(&self, me: &str, remote: &str, msg: &[u8]) -> Result<()> {
        self.notify(me, remote, msg, false)
    }

    pub(crate) fn notify(&self, me: &str, remote: &str, msg: &[u8], post: bool) -> Result<()> {
        match self.backend.peers() {
            Some(p) if post => p.post_notif(remote, msg),
            Some(p) => p.gen_notif(remote, msg),
            None => Err(Error::not_supported(
                me,
                Op::GenNotif,
                format!("{} has no notifications (to {remote})", self.name),
            )),
        }
    }
}

impl std::fmt::Debug for BackendSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendSlot")
            .field("id", &self.id)
            .field("name", &self.name)
            .finish()
    }
}

/// A backend created on an agent (NIXL's `nixlBackendH*`): what
/// [`Agent::create_backend`] returns, and what every backend hint names (registration,
/// descriptor preparation, [`crate::XferOptions::backends`], notifications, queries).
///
/// Cheap to clone; equal when it names the same backend of the same agent. It does not keep
/// the backend alive; a handle of another agent is refused with [`Error::Mismatch`].
#[derive(Clone)]
pub struct BackendHandle {
    name: Arc<str>,
    slot: usize,
    agent: u64,
    caps: Arc<Capabilities>,
}

impl BackendHandle {
    /// The backend's type name (`"UCX"`, `"POSIX"`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the backend can do.
    #[doc(alias = "getBackendParams")]
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
}

impl PartialEq for BackendHandle {
    fn eq(&self, other: &Self) -> bool {
        self.slot == other.slot && self.agent == other.agent
    }
}

impl Eq for BackendHandle {}

impl std::hash::Hash for BackendHandle {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.slot, self.agent).hash(h);
    }
}

impl std::fmt::Debug for BackendHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BackendHandle({})", self.name)
    }
}

impl std::fmt::Display for BackendHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl BackendSlot {
    pub(crate) fn handle(&self, agent_generation: u64) -> BackendHandle {
        BackendHandle {
            name: Arc::from(self.name.as_str()),
            slot: self.id,
            agent: agent_generation,
            caps: Arc::new(self.caps.clone()),
        }
    }
}

/// A transfer agent: one per process (or per GPU). Cheap to clone, `Send + Sync`.
///
/// ```
/// use nixl_core::{Agent, AgentConfig, HostBuffer, InprocParams, MemKind, XferDescList, XferOp,
///     XferOptions, XferTarget};
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// # fn main() -> nixl_core::Result<()> {
/// let prefill = Agent::new("prefill", AgentConfig::default())?;
/// let decode = Agent::new("decode", AgentConfig::default())?;
/// prefill.create_backend(InprocParams::default())?;
/// decode.create_backend(InprocParams::default())?;
///
/// let src = Arc::new(HostBuffer::new(8192).expect("alloc"));
/// let dst = Arc::new(HostBuffer::new(8192).expect("alloc"));
/// src.fill_pattern(1);
/// let _src_reg = prefill.register_mem(vec![src.clone()], &[])?;
/// let _dst_reg = decode.register_mem(vec![dst.clone()], &[])?;
///
/// // Exchange metadata (here in memory; see `send_local_metadata` for the side channel).
/// let peer = prefill.load_remote_metadata(&decode.local_metadata()?)?;
///
/// let local = prefill.prep_xfer_dlist(XferTarget::Initiator,
///     &XferDescList::blocks(MemKind::Dram, src.addr(), 4096, 2), &[])?;
/// let remote = prefill.prep_xfer_dlist(XferTarget::Agent(&peer),
///     &XferDescList::blocks(MemKind::Dram, dst.addr(), 4096, 2), &[])?;
/// let req = prefill.make_prepped_xfer(XferOp::Write, &local, &[0, 1], &remote, &[0, 1],
///     XferOptions::with_notif(b"kv ready".to_vec()))?;
/// prefill.post_xfer_req(&req)?;
/// req.wait(Duration::from_secs(5))?;
///
/// let notifs = decode.get_notifs()?;
/// assert_eq!(notifs["prefill"], vec![b"kv ready".to_vec()]);
/// assert_eq!(src.to_vec(), dst.to_vec());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Agent {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.shared.name)
            .field("generation", &self.shared.generation)
            .finish()
    }
}

fn new_generation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish().max(1)
}

impl Agent {
    /// Creates an agent. Fails on an empty or over-long name, or when the side channel cannot
    /// bind.
    pub fn new(name: &str, config: AgentConfig) -> Result<Self> {
        if name.is_empty() || name.len() > crate::codec::MAX_NAME {
            return Err(Error::invalid(
                name,
                Op::CreateBackend,
                "agent name must be 1..=256 bytes",
            ));
        }
        let signer = Signer::new(config.auth.clone()).map_err(|e| match e {
            Error::Io { source, .. } => Error::Io {
                agent: name.to_owned(),
                op: Op::CreateBackend,
                source,
            },
            e => e,
        })?;
        let process = crate::liveness::ProcessId::current();
        let hello_keys = Arc::new(
            crate::hello::HelloKeys::generate(process, config.limits.max_known_names).map_err(
                |e| match e {
                    Error::Io { source, .. } => Error::Io {
                        agent: name.to_owned(),
                        op: Op::CreateBackend,
                        source,
                    },
                    e => e,
                },
            )?,
        );
        hello_keys.set_loaded_only(config.loaded_senders_only);
        let succession = config
            .succession
            .as_deref()
            .map(|path| peers::succession::take(name, path))
            .transpose()?;
        let notifs = NotifQueue::with_limits(
            config.limits.max_queued_notif_bytes,
            config.limits.max_queued_notif_bytes_per_sender,
        );
        let clock = config
            .clock
            .clone()
            .unwrap_or_else(|| Arc::new(crate::lease::SystemClock));
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            generation: new_generation(),
            counters: Counters::new(config.telemetry || telemetry::env_enabled()),
            config,
            backends: RwLock::new(Vec::new()),
            regs: Mutex::new(RegTable::default()),
            remotes: Mutex::new(HashMap::new()),
            peer_locks: Mutex::new(HashMap::new()),
            notifs: Arc::new(notifs),
            leases: crate::lease::Leases::new(clock),
            wake: crate::backend::Wake::new(),
            progress_running: std::sync::atomic::AtomicBool::new(false),
            fetches: Mutex::new(HashMap::new()),
            stop: Arc::new(AtomicBool::new(false)),
            listen_addr: Mutex::new(None),
            threads: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            uncertain: Mutex::new(VecDeque::new()),
            corrupt: Mutex::new(Vec::new()),
            signer,
            bindings: Arc::new(Bindings::default()),
            process,
            hello_keys,
            succession,
            successions: peers::succession::Successions::default(),
            draining: Mutex::new(Vec::new()),
        });
        here::add(&shared);
        let agent = Agent { shared };
        // Lease control messages are the agent's own: taken off the notification path.
        agent.shared.notifs.set_control(
            crate::lease::PREFIX,
            lease::control(Arc::downgrade(&agent.shared)),
        );
        if agent.shared.config.listen {
            crate::sidechannel::start_listener(&agent)?;
        }
        if agent.shared.config.progress_thread {
            shared::start_progress_thread(&agent.shared)?;
        }
        // The process's timer thread starts with its first agent, not in a future's first
        // poll (which must return within microseconds).
        crate::model::timer::start();
        Ok(agent)
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The agent's generation: a random value fixed for this incarnation, carried in its
    /// metadata so peers can tell a restarted agent from the one they knew.
    pub fn generation(&self) -> u64 {
        self.shared.generation
    }

    /// The side channel's bound address, when listening.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        *self.shared.listen_addr.lock()
    }

    /// The agent's configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.shared.config
    }

    /// Backend types this agent can create by name.
    #[doc(alias = "getAvailPlugins")]
    pub fn available_backends(&self) -> Vec<String> {
        self.shared
            .config
            .plugins
            .iter()
            .map(|p| p.name().to_owned())
            .collect()
    }

    /// Default parameters of a backend type, as strings.
    #[doc(alias = "getPluginParams")]
    pub fn backend_params(&self, backend: &str) -> Result<BTreeMap<String, String>> {
        self.plugin(backend).map(|p| p.default_params())
    }

    fn plugin(&self, backend: &str) -> Result<&Arc<dyn BackendPlugin>> {
        self.shared
            .config
            .plugins
            .iter()
            .find(|p| p.name().eq_ignore_ascii_case(backend))
            .ok_or_else(|| {
                let known = self.available_backends().join(", ");
                Error::not_found(
                    self.name(),
                    Op::CreateBackend,
                    format!(
                        "backend type {backend} among this agent's plugins ({known}): build the \
                         config with `nixl::agent_config()` (the facade lists every backend \
                         compiled in) or add the backend crate's plugin (e.g. \
                         `nixl_backend_ucx::UcxPlugin`) to `AgentConfig::plugins`"
                    ),
                )
            })
    }

    /// Creates a backend from typed params (each backend crate's params struct) and returns
    /// its handle.
    #[doc(alias = "createBackend")]
    pub fn create_backend<P: BackendParams + 'static>(&self, params: P) -> Result<BackendHandle> {
        self.create_backend_boxed(Box::new(params))
    }

    /// Creates a backend by type name from a string map (parsed once by the backend's
    /// plugin). The type must be among [`AgentConfig::plugins`]: `AgentConfig::default()`
    /// knows only INPROC; the `nixl` facade's `agent_config()` knows every backend compiled in.
    pub fn create_backend_named(
        &self,
        backend: &str,
        params: &BTreeMap<String, String>,
    ) -> Result<BackendHandle> {
        let p = self.plugin(backend)?.parse_params(params)?;
        self.create_backend_boxed(p)
    }

    fn create_backend_boxed(&self, params: Box<dyn BackendParams>) -> Result<BackendHandle> {
        let wanted = params.backend_name().to_owned();
        if self.shared.backends().iter().any(|b| b.name == wanted) {
            return Err(Error::not_allowed(
                self.name(),
                Op::CreateBackend,
                format!("backend {wanted} already exists"),
            ));
        }
        let ctx = BackendContext {
            agent: self.shared.name.clone(),
            notifs: self.shared.notifs.clone(),
            peers: crate::hello::PeerAuth::new(
                &self.shared.name,
                self.shared.generation,
                self.shared.config.auth.clone(),
                self.shared.bindings.clone(),
                self.shared.signer.replay.clone(),
                self.shared.hello_keys.clone(),
            ),
            wake: self.shared.wake.clone(),
        };
        let backend = params.create(ctx)?;
        let caps = backend.capabilities();
        let name = backend.name().to_owned();
        let mut slots = self.shared.backends.write();
        if slots.iter().any(|b| b.name == name) {
            return Err(Error::not_allowed(
                self.name(),
                Op::CreateBackend,
                format!("backend {name} already exists"),
            ));
        }
        let id = slots.len();
        let slot = Arc::new(BackendSlot {
            id,
            name: name.clone(),
            backend,
            caps,
        });
        let handle = slot.handle(self.shared.generation);
        slots.push(slot);
        tracing::debug!(agent = %self.name(), backend = %name, "backend created");
        Ok(handle)
    }

    /// The backends created on this agent, in creation order.
    pub fn backends(&self) -> Vec<BackendHandle> {
        self.shared
            .backends()
            .iter()
            .map(|b| b.handle(self.shared.generation))
            .collect()
    }

    /// The backend of type `name` created on this agent, if any.
    pub fn backend(&self, name: &str) -> Option<BackendHandle> {
        self.shared
            .backends()
            .iter()
            .find(|b| b.name == name)
            .map(|b| b.handle(self.shared.generation))
    }

    /// The backends `hints` name (all, in creation order, when empty). A handle of another
    /// agent is [`Error::Mismatch`].
    pub(crate) fn select_backends(
        &self,
        op: Op,
        hints: &[BackendHandle],
    ) -> Result<Vec<Arc<BackendSlot>>> {
        let all = self.shared.backends();
        if hints.is_empty() {
            return Ok(all);
        }
        hints
            .iter()
            .map(|h| {
                if h.agent != self.shared.generation {
                    return Err(Error::mismatch(
                        self.name(),
                        op,
                        format!("backend handle {h} belongs to another agent"),
                    ));
                }
                all.get(h.slot)
                    .cloned()
                    .ok_or_else(|| Error::not_found(self.name(), op, format!("backend {h}")))
            })
            .collect()
    }

    /// Queries storage regions (existence and size) through backends that support their kind.
    #[doc(alias = "queryMem")]
    pub fn query_mem(
        &self,
        regions: &[RegionDesc],
        hints: &[BackendHandle],
    ) -> Result<Vec<Option<QueryResult>>> {
        let backends = self.select_backends(Op::QueryMem, hints)?;
        regions
            .iter()
            .map(|r| {
                for b in backends.iter().filter(|b| b.caps.supports(r.kind)) {
                    if let Some(q) = b.backend.query(r)? {
                        return Ok(Some(q));
                    }
                }
                Ok(None)
            })
            .collect()
    }

    /// Drives every backend's progress engine once (for callers that run no progress thread).
    pub fn progress(&self) {
        self.shared.progress_all();
    }

    /// The agent's telemetry counters.
    pub fn telemetry(&self) -> TelemetrySnapshot {
        self.shared.counters.snapshot()
    }

    /// Switches telemetry counting on or off.
    pub fn set_telemetry(&self, on: bool) {
        self.shared.counters.set_enabled(on);
    }

    /// Which transports each backend uses to reach `remote` (so a fallback is visible).
    /// For a peer speaking NIXL's wire, a last entry `("wire", ...)` says which guarantees do
    /// not cross to it ([`crate::nixl_wire::NIXL_PEER_NOTE`]).
    pub fn path_report(&self, remote: &str) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .shared
            .backends()
            .iter()
            .filter_map(|b| b.backend.path_report(remote).map(|p| (b.name.clone(), p)))
            .collect();
        if self.peer_wire(remote) == Some(crate::nixl_wire::Wire::Nixl) {
            v.push((
                "wire".to_owned(),
                crate::nixl_wire::NIXL_PEER_NOTE.to_owned(),
            ));
        }
        v
    }

    pub(crate) fn remote_peer(&self, remote: &str, op: Op) -> Result<Arc<RemotePeer>> {
        self.shared
            .remotes
            .lock()
            .get(remote)
            .cloned()
            .ok_or_else(|| Error::not_found(self.name(), op, format!("remote agent {remote}")))
    }
}
