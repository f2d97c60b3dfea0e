//! The agent's configuration.

use super::*;

/// How an agent is set up: `AgentConfig::default()` and one setter per field to change.
///
/// ```
/// use std::time::Duration;
/// use nixl_core::AgentConfig;
/// let c = AgentConfig::default().listen(true).default_timeout(Duration::from_secs(5));
/// assert!(c.listen && c.auth.is_none());
/// ```
///
/// ```compile_fail,E0639
/// // `#[non_exhaustive]`: a struct literal, even with `..Default::default()`, does not compile.
/// let c = nixl_core::AgentConfig { listen: true, ..Default::default() };
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct AgentConfig {
    /// Run a thread that drives backends' progress engines (needed for UCX's emulated RMA
    /// when the application does not poll).
    pub progress_thread: bool,
    /// How long the progress thread sleeps when nothing happened.
    pub progress_delay: Duration,
    /// Serve the metadata side channel.
    pub listen: bool,
    /// Where the side channel listens (port 0 picks one; see [`Agent::listen_addr`]).
    pub listen_addr: SocketAddr,
    /// Count telemetry (also switched on by `NIXL_TELEMETRY_ENABLE`).
    pub telemetry: bool,
    /// The default deadline of blocking calls (side-channel exchange, `wait`).
    pub default_timeout: Duration,
    /// Backend types this agent can create by name.
    pub plugins: Vec<Arc<dyn BackendPlugin>>,
    /// Authenticate peers with a cluster credential (`None`: trust every peer that can reach
    /// the side channel, etcd or the transports; see `docs/security.md`).
    pub auth: Option<Auth>,
    /// Lets the side channel listen on a non-loopback address without [`AgentConfig::auth`]
    /// (refused otherwise): the explicit opt-out for a network where every host is trusted.
    pub allow_unauthenticated_listener: bool,
    /// Bounds on what peers can make this agent hold.
    pub limits: Limits,
    /// Who may FETCH this agent's metadata over its side channel, and so learn the keys to
    /// read and write every region it registered (see [`FetchPolicy`]).
    pub fetch_policy: FetchPolicy,
    /// Verify integrity frames (the checksum a peer's WRITE with `XferOptions::integrity`
    /// sends with its notification) against this agent's memory, and say so in its metadata:
    /// peers may ask for integrity only then. Off (the default): no frame is ever hashed here
    /// (one that arrives anyway is reported as `Corrupt`, unread), so a peer cannot make this
    /// agent hash its memory. Each frame is bounded by [`Limits::max_integrity_bytes`].
    pub verify_integrity: bool,
    /// A file that hands this agent's name to its next incarnation (a restart), so that no
    /// other process takes the name between the two (see `docs/security.md`): the agent reads
    /// the secret its predecessor left there (the file must be this user's, mode `0600`, 32
    /// bytes; absent: a first incarnation), reveals it in its metadata, and leaves a fresh one
    /// for its successor, whose SHA-256 its metadata commits to. Peers that loaded an
    /// incarnation refuse metadata under its name that does not reveal the committed secret
    /// for [`Limits::succession_hold`] after it exited or was invalidated. One file per agent
    /// name; `None` (the default): a name is free once its process exited.
    pub succession: Option<std::path::PathBuf>,
    /// Without a credential, count connection hellos (and so notifications and lease
    /// messages) only from peers this agent loaded, each from its own process (signed with
    /// the key its metadata announced); a hello under any other name is refused and counted
    /// ([`Agent::refused_hellos`]). Off (the default): a name this agent did not load is held
    /// by the first signed hello naming a live process of this host (a prefill that never
    /// loads its readers still hears them). See `docs/security.md`.
    pub loaded_senders_only: bool,
    /// Which peers learn the keys to a labeled registration ([`Share`]): a registration whose
    /// label a share names is in metadata built for a listed peer only (a FETCH from a loaded
    /// peer's proven process or credential, or [`Agent::local_metadata_for`]); every other
    /// metadata this agent builds leaves it out. Empty (the default): every registration is
    /// in all of it. See `docs/security.md`.
    pub shares: Vec<Share>,
    /// Where lease times come from (grants, renewals, expiries, a reader's hold): `None`
    /// (the default) is real time; a test gives its agents one
    /// [`ManualClock`](crate::leases::ManualClock) and advances it instead of sleeping
    /// through durations.
    pub clock: Option<Arc<dyn crate::leases::Clock>>,
}

crate::__setters!(AgentConfig {
    progress_thread: bool,
    progress_delay: Duration,
    listen: bool,
    listen_addr: SocketAddr,
    telemetry: bool,
    default_timeout: Duration,
    plugins: Vec<Arc<dyn BackendPlugin>>,
    allow_unauthenticated_listener: bool,
    limits: Limits,
    fetch_policy: FetchPolicy,
    verify_integrity: bool,
    loaded_senders_only: bool,
    shares: Vec<Share>,
} some {
    auth: Auth,
    succession: std::path::PathBuf,
});

impl AgentConfig {
    /// Sets `clock` (see the field): lease times come from it.
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn crate::leases::Clock>) -> Self {
        self.clock = Some(clock);
        self
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            progress_thread: false,
            progress_delay: Duration::from_micros(100),
            listen: false,
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            telemetry: telemetry::env_enabled(),
            default_timeout: Duration::from_secs(30),
            plugins: vec![Arc::new(crate::inproc::InprocPlugin)],
            auth: None,
            allow_unauthenticated_listener: false,
            verify_integrity: false,
            fetch_policy: FetchPolicy::default(),
            limits: Limits::default(),
            succession: None,
            loaded_senders_only: false,
            shares: Vec::new(),
            clock: None,
        }
    }
}

/// Who may FETCH an agent's metadata over its side channel ([`AgentConfig::fetch_policy`]).
/// Metadata holds the keys to every registered region: whoever fetches it can READ and WRITE
/// them (the side channel is where that is decided; the transports do not ask again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FetchPolicy {
    /// Every requester the side channel accepts (the default): with a credential, every holder
    /// of an accepted credential; without, every process of this agent's user on this host.
    #[default]
    Anyone,
    /// Only peers this agent has loaded: a same-host requester must be the process a loaded
    /// peer's metadata was proven to come from; with a credential, a requester must hold the
    /// credential a loaded peer's name is bound to. For deployments where the processes of
    /// one user (or the members of one cluster) are not one trust domain: peers load each
    /// other's metadata by PUSH (or etcd) first.
    LoadedPeers,
    /// Only the loaded peers named here (as [`FetchPolicy::LoadedPeers`], and the loaded name
    /// must be listed): which peers may READ and WRITE this agent's registrations at all,
    /// for deployments where some loaded peers (a router, a monitor) must not reach the KV.
    Named(Vec<String>),
}

/// The peers that may READ and WRITE a labeled registration ([`AgentConfig::shares`]).
///
/// Metadata carries the keys to a registration; with a share, only metadata built for a
/// listed peer carries this label's. A requester counts as a peer only where its name is
/// proven: a same-host process this agent loaded (checked by the kernel over the Unix side
/// channel), or the credential the name is bound to (with one cluster credential, every
/// holder can claim every name: give each group its own credential to tell them apart).
/// Peers that already hold the keys keep them until the registration is deregistered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The registration label ([`Agent::register_mem_labeled`]).
    pub label: String,
    /// Peer names; an entry ending in `*` names every peer whose name starts with the rest
    /// (`"decode-*"`).
    pub peers: Vec<String>,
}

impl Share {
    /// A share of `label` with `peers`.
    pub fn new(label: &str, peers: &[&str]) -> Share {
        Share {
            label: label.to_owned(),
            peers: peers.iter().map(|p| (*p).to_owned()).collect(),
        }
    }

    /// Whether `peer` is one of the peers listed.
    pub fn lists(&self, peer: &str) -> bool {
        self.peers.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => peer.starts_with(prefix),
            None => p == peer,
        })
    }
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("progress_thread", &self.progress_thread)
            .field("progress_delay", &self.progress_delay)
            .field("listen", &self.listen)
            .field("listen_addr", &self.listen_addr)
            .field("telemetry", &self.telemetry)
            .field("default_timeout", &self.default_timeout)
            .field(
                "plugins",
                &self
                    .plugins
                    .iter()
                    .map(|p| p.name().to_owned())
                    .collect::<Vec<_>>(),
            )
            .field("auth", &self.auth)
            .field(
                "allow_unauthenticated_listener",
                &self.allow_unauthenticated_listener,
            )
            .field("fetch_policy", &self.fetch_policy)
            .field("limits", &self.limits)
            .field("succession", &self.succession)
            .field("loaded_senders_only", &self.loaded_senders_only)
            .field("shares", &self.shares)
            .field("clock", &self.clock)
            .finish()
    }
}
