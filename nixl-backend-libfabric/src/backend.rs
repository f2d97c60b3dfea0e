//! The `LIBFABRIC` backend: rails, peers, registrations, notifications and progress.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nixl_core::backend::Capabilities;
use nixl_core::backend::{
    downcast_md, Backend, BackendContext, BackendMd, BackendXfer, Hello, Sessions, XferSpec,
};
use nixl_core::{Error, MemKind, Op, RegionDesc, Result};

use crate::keys::KeySource;
use crate::params::{LibfabricParams, LibfabricStats, RailStats};
pub(crate) use crate::peer::Peer;
use crate::rail::{Inbox, Rail, RailConfig, Track};
use crate::result::{unavailable, FiError, LIBFABRIC};
use crate::sys;
use crate::sys::fabric::Mr;
use crate::wire;
use crate::xfer::XferCore;

/// A region registered on every rail.
pub(crate) struct LocalMd {
    pub addr: u64,
    pub len: u64,
    pub keys: Vec<u64>,
    pub descs: Vec<usize>,
    /// Dropped before `_rails`, so endpoint-bound registrations close before their endpoint.
    _mrs: Vec<Mr>,
    _rails: Vec<Arc<Rail>>,
}

/// A peer's (or our own, for loopback) region as a transfer target.
pub(crate) struct RemoteMd {
    pub base: u64,
    pub len: u64,
    pub virt_addr: bool,
    pub keys: Vec<u64>,
}

/// What the backend shares with its transfers and its progress thread.
pub(crate) struct Inner {
    pub agent: String,
    pub provider: String,
    pub rails: Vec<Arc<Rail>>,
    /// Received messages: notifications by session, hellos checked.
    pub inbox: Inbox,
    pub params: LibfabricParams,
    pub hmem: bool,
    pub delivery_complete: bool,
    pub virt_addr: bool,
    pub me: Arc<Peer>,
    peers: Mutex<HashMap<String, Arc<Peer>>>,
    keys: KeySource,
    /// Posted transfers the progress thread drives.
    active: Mutex<Vec<Weak<Mutex<XferCore>>>>,
    /// Wakes the agent's futures when a driven transfer ends.
    wake: nixl_core::backend::Wake,
    /// Frees posts spinning on a dead shm peer's region lock.
    pub(crate) watchdog: Arc<crate::dead_holder::Watchdog>,
    /// The rails' endpoints in the process's list of its own (`crate::own`).
    _own: nixl_core::backend::own::OwnGuard<crate::own::Endpoint>,
}

impl Inner {
    fn peers(&self) -> MutexGuard<'_, HashMap<String, Arc<Peer>>> {
        self.peers.lock()
    }

    /// Polls every rail once; returns how many completions were handled.
    pub(crate) fn poll(&self) -> usize {
        let mut n = 0;
        for r in &self.rails {
            match r.poll(&self.inbox) {
                Ok(k) => n += k,
                Err(e) => {
                    tracing::warn!(agent = %self.agent, rail = r.index, error = %e, "polling the completion queue failed")
                }
            }
        }
        n
    }

    /// Hands a posted transfer to the progress thread.
    pub(crate) fn activate(&self, core: Weak<Mutex<XferCore>>) {
        self.active.lock().push(core);
    }

    /// Polls, then drives the posted transfers nobody is polling. Returns the completions
    /// handled.
    pub(crate) fn progress_all(&self) -> usize {
        let n = self.poll();
        self.drive_active();
        n
    }

    /// Drives the posted transfers nobody is polling.
    pub(crate) fn drive_active(&self) {
        let cores: Vec<Arc<Mutex<XferCore>>> = {
            let mut g = self.active.lock();
            g.retain(|w| w.strong_count() > 0);
            g.iter().filter_map(Weak::upgrade).collect()
        };
        let mut done = Vec::new();
        for c in &cores {
            // A request being polled by its owner is driven there.
            if let Some(mut x) = c.try_lock() {
                x.drive();
                if !x.active() {
                    done.push(Arc::as_ptr(c));
                }
            }
        }
        if !done.is_empty() {
            self.active.lock().retain(|w| !done.contains(&w.as_ptr()));
            self.wake.wake();
        }
    }

    /// Waits (polling, bounded by `op_timeout`) until `track` has nothing in flight.
    pub(crate) fn drain(&self, track: &Track) -> bool {
        self.drain_until(|| track.state().0 == 0)
    }

    /// Polls (bounded by `op_timeout`) until `settled` says yes; whether it did.
    pub(crate) fn drain_until(&self, mut settled: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + self.params.op_timeout;
        let mut spins = 0u32;
        loop {
            if settled() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            if self.poll() == 0 {
                spins += 1;
                backoff(spins, self.params.idle_sleep);
            }
        }
    }

    /// A description of the rails and the notification guarantee.
    pub(crate) fn describe(&self) -> String {
        let domains: Vec<&str> = self.rails.iter().map(|r| r.domain_name.as_str()).collect();
        format!(
            "libfabric {} over {} rail(s) [{}]; notifications after {}",
            self.provider,
            self.rails.len(),
            domains.join(", "),
            if self.delivery_complete {
                "delivery-complete writes"
            } else {
                "transmit-complete writes + send-after-write order"
            }
        )
    }
}

/// Spins, then yields, then sleeps up to `max` the longer nothing happened.
pub(crate) fn backoff(idle: u32, max: Duration) {
    if idle < 64 {
        std::hint::spin_loop();
    } else if idle < 256 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(max.min(Duration::from_micros(u64::from(idle - 255) * 5)));
    }
}

/// The libfabric backend. Create it through an agent with [`LibfabricParams`].
pub struct LibfabricBackend {
    inner: Arc<Inner>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// The body of rail `i`'s progress thread.
fn progress_loop(inner: &Inner, i: usize, stop: &AtomicBool) {
    let rail = &inner.rails[i];
    let mut idle = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let n = if rail.waitable && idle > 64 {
            rail.wait_poll(&inner.inbox, 1)
        } else {
            rail.poll(&inner.inbox)
        };
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(agent = %inner.agent, rail = i, error = %e, "progress failed");
                0
            }
        };
        if i == 0 {
            inner.drive_active();
            nixl_core::backend::fire_due_timers();
        }
        if n > 0 {
            idle = 0;
        } else {
            idle = idle.saturating_add(1);
            if !rail.waitable {
                backoff(idle, inner.params.idle_sleep);
            }
        }
    }
}

impl std::fmt::Debug for LibfabricBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibfabricBackend")
            .field("agent", &self.inner.agent)
            .field("provider", &self.inner.provider)
            .field("rails", &self.inner.rails.len())
            .finish()
    }
}

/// `Unavailable`, saying what was asked for and how to check it.
fn no_provider(params: &LibfabricParams) -> Error {
    Error::Unavailable {
        what: format!(
            "libfabric provider {}",
            params
                .provider
                .as_deref()
                .unwrap_or("(efa, tcp, shm or sockets)")
        ),
        hint: format!(
            "no RDM endpoint with RMA + messages{}{} (check `fi_info -t FI_EP_RDM -c 'FI_RMA|FI_MSG'`{})",
            if params.domains.is_empty() {
                String::new()
            } else {
                format!(" on domains {:?}", params.domains)
            },
            if params.hmem == crate::HmemMode::Require {
                " and FI_HMEM"
            } else {
                ""
            },
            if params.provider.as_deref() == Some("efa") {
                "; EFA needs an EFA-enabled instance and the EFA installer's libfabric"
            } else {
                ""
            }
        ),
    }
}

/// Opens one rail per selected domain; a provider whose raw memory keys exceed 8 bytes is
/// refused.
fn open_rails(
    lib: &'static sys::Lib,
    agent: &str,
    provider: &str,
    infos: Vec<crate::sys::info::Info>,
    cfg: RailConfig,
    keys: &KeySource,
) -> Result<Vec<Arc<Rail>>> {
    let mut rails = Vec::with_capacity(infos.len());
    for (i, info) in infos.into_iter().enumerate() {
        let rail = Rail::open(lib, info, i, cfg, keys)
            .map_err(|e| e.into_error(agent, None, Op::CreateBackend))?;
        if rail.key_size > 8 {
            return Err(Error::not_supported(
                agent,
                Op::CreateBackend,
                format!(
                    "provider {provider} uses {}-byte raw memory keys",
                    rail.key_size
                ),
            ));
        }
        rails.push(Arc::new(rail));
    }
    Ok(rails)
}

/// One progress thread per rail: it blocks in fi_cq_sread where the CQ has a wait object
/// (waking on the provider's own events, so a passive target still acknowledges writes
/// promptly) and polls with a backoff otherwise. Rail 0's thread also drives posted requests
/// nobody polls. If one cannot start, those started are stopped.
fn start_progress(inner: &Arc<Inner>, stop: &Arc<AtomicBool>) -> Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    for i in 0..inner.rails.len() {
        let (inner2, stop2) = (inner.clone(), stop.clone());
        let h = std::thread::Builder::new()
            .name(format!("nixl-lf{i}-{}", inner.agent))
            .spawn(move || progress_loop(&inner2, i, &stop2))
            .map_err(|e| Error::io(&inner.agent, Op::CreateBackend, e));
        match h {
            Ok(h) => threads.push(h),
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                for t in threads {
                    let _ = t.join();
                }
                return Err(e);
            }
        }
    }
    Ok(threads)
}

impl LibfabricBackend {
    /// Opens the provider's rails for an agent.
    pub fn new(ctx: BackendContext, params: LibfabricParams) -> Result<Self> {
        let agent = ctx.agent.clone();
        params.validate(&agent)?;
        let lib = sys::lib().map_err(unavailable)?;
        let fail = |e: FiError| e.into_error(&agent, None, Op::CreateBackend);
        let sel = crate::select::select(lib, &params)
            .map_err(fail)?
            .ok_or_else(|| no_provider(&params))?;
        let cfg = RailConfig {
            notif_size: params.notif_size,
            recv_slots: params.notif_slots,
            send_slots: params.notif_slots,
            shm: crate::validate::is_shm(&sel.provider),
        };
        let keys = KeySource::default();
        let rails = open_rails(lib, &agent, &sel.provider, sel.infos, cfg, &keys)?;
        let names: Vec<Vec<u8>> = rails.iter().map(|r| r.addr.clone()).collect();
        let conn = wire::encode_conn(&sel.provider, &names);
        // Notifications to itself (loopback) need no hello: its own session is known.
        let session = ctx.peers.new_session()?;
        let me = Arc::new(
            Peer::connect(&agent, &conn, &rails, &names, session, None, Vec::new())
                .map_err(fail)?,
        );
        let inbox = Inbox {
            notifs: ctx.notifs,
            peers: ctx.peers,
            sessions: Sessions::default(),
        };
        // The empty table has room for this agent's own session (loopback notifications).
        let _ = inbox.sessions.accept(
            &Hello {
                sender: agent.clone(),
                generation: 0,
                session,
                authenticated: true,
                key: None,
            },
            0,
        );
        let virt_addr = rails
            .first()
            .is_some_and(|r| r.mr_mode & u64::from(sys::FI_MR_VIRT_ADDR) != 0);
        params.stats().attach(
            rails
                .iter()
                .map(|r| (r.domain_name.clone(), r.counters.clone()))
                .collect(),
        );
        let own = crate::own::add(
            &agent,
            &sel.provider,
            rails.iter().map(|r| r.addr.clone()).collect(),
        );
        let inner = Arc::new(Inner {
            _own: own,
            agent,
            provider: sel.provider,
            rails,
            inbox,
            hmem: sel.hmem,
            delivery_complete: sel.delivery_complete,
            virt_addr,
            me,
            peers: Mutex::new(HashMap::new()),
            keys,
            params,
            active: Mutex::new(Vec::new()),
            wake: ctx.wake.clone(),
            watchdog: Arc::default(),
        });
        tracing::info!(agent = %inner.agent, path = %inner.describe(), "libfabric backend created");
        let stop = Arc::new(AtomicBool::new(false));
        let threads = if inner.params.progress_thread {
            start_progress(&inner, &stop)?
        } else {
            Vec::new()
        };
        Ok(LibfabricBackend {
            inner,
            stop,
            threads: Mutex::new(threads),
        })
    }

    /// The provider in use (`"tcp;ofi_rxm"`, `"shm"`, `"efa"`, ...).
    pub fn provider(&self) -> &str {
        &self.inner.provider
    }

    /// Per-rail counters.
    pub fn stats(&self) -> Vec<RailStats> {
        let s = LibfabricStats::default();
        s.attach(
            self.inner
                .rails
                .iter()
                .map(|r| (r.domain_name.clone(), r.counters.clone()))
                .collect(),
        );
        s.rails()
    }

    fn md<'a, T: std::any::Any + Send + Sync>(&self, md: &'a BackendMd, op: Op) -> Result<&'a T> {
        downcast_md::<T>(md)
            .ok_or_else(|| Error::invalid(&self.inner.agent, op, "metadata is not LIBFABRIC's"))
    }

    fn peer(&self, remote: &str, op: Op) -> Result<Arc<Peer>> {
        self.inner.peers().get(remote).cloned().ok_or_else(|| {
            Error::disconnected(
                &self.inner.agent,
                remote,
                op,
                "not connected through LIBFABRIC",
            )
        })
    }
}

impl LibfabricBackend {
    /// Stops the progress threads and the shm watchdog and waits for them (once; later calls
    /// find none).
    fn stop_threads(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.inner.watchdog.stop();
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            if t.join().is_err() {
                tracing::error!(agent = %self.inner.agent, "libfabric progress thread panicked");
            }
        }
    }
}

impl Drop for LibfabricBackend {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

impl Backend for LibfabricBackend {
    fn wakes(&self) -> bool {
        // Posted transfers are driven by the progress threads (or the agent's, through
        // `progress`), which wake the agent when one ends.
        true
    }

    fn name(&self) -> &str {
        LIBFABRIC
    }

    fn shutdown(&self) {
        // The agent is gone; what is left is a leaked request's (its memory never freed),
        // which nothing polls again, or registrations outliving the agent.
        self.stop_threads();
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::network(self.inner.hmem, !self.inner.params.progress_thread)
    }

    fn register(&self, region: &RegionDesc) -> Result<BackendMd> {
        let me = &self.inner.agent;
        let hmem = match region.kind {
            MemKind::Dram => None,
            MemKind::Vram if self.inner.hmem => Some((
                sys::FI_HMEM_CUDA,
                i32::try_from(region.dev_id)
                    .map_err(|_| Error::invalid(me, Op::RegisterMem, "GPU ordinal out of range"))?,
            )),
            k => {
                return Err(Error::not_supported(
                    me,
                    Op::RegisterMem,
                    format!(
                        "LIBFABRIC ({}) registers {}, not {k}",
                        self.inner.provider,
                        if self.inner.hmem {
                            "DRAM and VRAM"
                        } else {
                            "DRAM"
                        }
                    ),
                ))
            }
        };
        if region.len == 0 || region.end().is_none() {
            return Err(Error::invalid(
                me,
                Op::RegisterMem,
                "empty or overflowing region",
            ));
        }
        let (mut keys, mut descs, mut mrs) = (Vec::new(), Vec::new(), Vec::new());
        for rail in &self.inner.rails {
            let key = self.inner.keys.next(rail.key_size);
            // The agent keeps the region's memory alive while this registration (and any
            // request using it) exists: `MemoryRegion`'s contract.
            let mr = rail
                .register(region.addr, region.len, key, hmem)
                .map_err(|e| e.into_error(me, None, Op::RegisterMem))?;
            keys.push(mr.key());
            descs.push(mr.desc());
            mrs.push(mr);
        }
        Ok(Arc::new(LocalMd {
            addr: region.addr,
            len: region.len,
            keys,
            descs,
            _mrs: mrs,
            _rails: self.inner.rails.clone(),
        }))
    }

    fn deregister(&self, md: BackendMd) -> Result<()> {
        self.md::<LocalMd>(&md, Op::DeregisterMem)?;
        drop(md);
        Ok(())
    }

    fn load_local(&self, _region: &RegionDesc, md: &BackendMd) -> Result<BackendMd> {
        let m = self.md::<LocalMd>(md, Op::PrepXferDlist)?;
        Ok(Arc::new(RemoteMd {
            base: m.addr,
            len: m.len,
            virt_addr: self.inner.virt_addr,
            keys: m.keys.clone(),
        }))
    }

    fn prepare_xfer(&self, spec: &XferSpec) -> Result<Box<dyn BackendXfer>> {
        let peer = if spec.is_local {
            self.inner.me.clone()
        } else {
            self.peer(&spec.remote, Op::MakeXfer)?
        };
        crate::xfer::LfXfer::prepare(self.inner.clone(), peer, spec)
            .map(|x| Box::new(x) as Box<dyn BackendXfer>)
    }

    fn progress(&self) -> Result<bool> {
        Ok(self.inner.progress_all() > 0)
    }

    fn path_report(&self, remote: &str) -> Option<String> {
        let peer = if remote == self.inner.agent {
            Some(self.inner.me.clone())
        } else {
            self.inner.peers().get(remote).cloned()
        }?;
        let per_rail: Vec<String> = self
            .stats()
            .iter()
            .take(peer.addrs.len())
            .map(|s| {
                format!(
                    "rail{} {}: {} B written, {} B read{}",
                    s.rail,
                    s.domain,
                    s.bytes_written,
                    s.bytes_read,
                    if peer.rail_ok(s.rail) {
                        ""
                    } else {
                        " [failed]"
                    }
                )
            })
            .collect();
        Some(format!(
            "{}; {} rail(s) to {remote}: {}",
            self.inner.describe(),
            peer.addrs.len(),
            per_rail.join("; ")
        ))
    }

    fn peers(&self) -> Option<&dyn nixl_core::backend::PeerBackend> {
        Some(self)
    }
}

impl nixl_core::backend::PeerBackend for LibfabricBackend {
    fn connection_info(&self) -> Result<Vec<u8>> {
        Ok(self.inner.me.conn.clone())
    }

    fn connect(&self, remote: &str, info: &[u8]) -> Result<()> {
        self.connect_peer(remote, info, None)
    }

    fn connect_peer(
        &self,
        remote: &str,
        info: &[u8],
        process: Option<&nixl_core::backend::PeerProcess>,
    ) -> Result<()> {
        let me = &self.inner.agent;
        let (provider, names) = wire::decode_conn(info).map_err(|e| {
            Error::invalid(
                me,
                Op::LoadMetadata,
                format!("malformed LIBFABRIC connection info: {e}"),
            )
        })?;
        if provider != self.inner.provider {
            return Err(Error::mismatch(
                me,
                Op::LoadMetadata,
                format!(
                    "{remote} uses libfabric provider {provider}, this agent {}",
                    self.inner.provider
                ),
            ));
        }
        if let Some(p) = self.inner.peers().get(remote) {
            // The same incarnation with every rail working: nothing to do. A failed rail or
            // peer is connected again (a reload after a repair revives it).
            if p.conn == info && p.alive.load(Ordering::SeqCst) && p.all_rails_ok() {
                return Ok(());
            }
        }
        let n = names.len().min(self.inner.rails.len());
        let shm = crate::validate::is_shm(&self.inner.provider);
        for (i, name) in names[..n].iter().enumerate() {
            let own = self.inner.rails[i].addr.as_slice();
            crate::validate::check_name(&self.inner.provider, name, own)
                .and_then(|()| {
                    if shm {
                        crate::validate::check_shm_region(name)?;
                        // The endpoint must be the process the metadata names: its exit is
                        // what ends operations to it (`XferCore::orphaned`).
                        match (process, crate::validate::shm_name_pid(name)) {
                            (Some(p), Some(pid)) if p.pid() != pid => Err(format!(
                                "the shm endpoint belongs to process {pid}, the metadata names process {}",
                                p.pid()
                            )),
                            _ => Ok(()),
                        }
                    } else {
                        Ok(())
                    }
                })
                .map_err(|e| {
                    Error::invalid(
                        me,
                        Op::LoadMetadata,
                        format!("refused an endpoint name of {remote} (rail {i}): {e}"),
                    )
                })?;
        }
        let here = process.is_some_and(|p| p.is_this_process());
        if let Some(owner) =
            crate::own::foreign_owner(&self.inner.provider, &names[..n], remote, here)
        {
            return Err(Error::not_allowed(
                me,
                Op::LoadMetadata,
                format!(
                    "{remote}'s endpoint names name an endpoint of this process (agent \
                     {owner}'s): its transfers would move bytes within this process; refused"
                ),
            ));
        }
        let guards = crate::dead_holder::guards(&self.inner, remote, &names[..n], process)?;
        let session = self.inner.inbox.peers.new_session()?;
        let peer = Peer::connect(
            remote,
            info,
            &self.inner.rails[..n],
            &names[..n],
            session,
            process.cloned(),
            guards,
        )
        .map_err(|e| e.into_error(me, Some(remote), Op::LoadMetadata))?;
        let peer = Arc::new(peer);
        // The hello goes first on the notification rail (sends are ordered, FI_ORDER_SAS):
        // it tells the peer which session this agent's notifications carry.
        let hello = self.inner.inbox.peers.hello(remote, &session)?;
        self.send_framed(&peer, &wire::encode_hello(&hello), Op::LoadMetadata)?;
        if let Some(old) = self.inner.peers().insert(remote.to_owned(), peer) {
            old.alive.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    fn disconnect(&self, remote: &str) -> Result<()> {
        if let Some(p) = self.inner.peers().remove(remote) {
            p.alive.store(false, Ordering::SeqCst);
        }
        Ok(())
    }

    fn public_metadata(&self, md: &BackendMd) -> Result<Vec<u8>> {
        let m = self.md::<LocalMd>(md, Op::LocalMetadata)?;
        Ok(wire::encode_region(self.inner.virt_addr, &m.keys))
    }

    fn load_remote(&self, _remote: &str, region: &RegionDesc, public: &[u8]) -> Result<BackendMd> {
        let (virt_addr, keys) = wire::decode_region(public).map_err(|e| {
            Error::invalid(
                &self.inner.agent,
                Op::LoadMetadata,
                format!("malformed LIBFABRIC region metadata: {e}"),
            )
        })?;
        if virt_addr != self.inner.virt_addr {
            return Err(Error::mismatch(
                &self.inner.agent,
                Op::LoadMetadata,
                "peer's memory-registration addressing differs from this agent's",
            ));
        }
        Ok(Arc::new(RemoteMd {
            base: region.addr,
            len: region.len,
            virt_addr,
            keys,
        }))
    }

    fn peer_failed(&self, remote: &str) -> Option<String> {
        let peer = self.inner.peers().get(remote)?.clone();
        (!peer.alive.load(Ordering::SeqCst))
            .then(|| "its connections failed or it was declared unreachable".to_owned())
    }

    fn gen_notif(&self, remote: &str, msg: &[u8]) -> Result<()> {
        let me = &self.inner.agent;
        let peer = self.peer(remote, Op::GenNotif)?;
        if !peer.alive.load(Ordering::SeqCst) {
            return Err(Error::disconnected(me, remote, Op::GenNotif, "peer was declared unreachable (operations did not complete in time); reload its metadata to reconnect"));
        }
        let framed = wire::encode_notif(&peer.session, msg);
        if framed.len() > self.inner.params.notif_size {
            return Err(Error::invalid(
                me,
                Op::GenNotif,
                format!(
                    "notification of {} bytes exceeds notif_size {}",
                    framed.len(),
                    self.inner.params.notif_size
                ),
            ));
        }
        self.send_framed(&peer, &framed, Op::GenNotif)
    }
}

impl LibfabricBackend {
    /// Sends one framed message to `peer` over its notification rail (the first healthy one)
    /// and waits (up to `op_timeout`) for the provider to complete it.
    fn send_framed(&self, peer: &Arc<Peer>, framed: &[u8], op: Op) -> Result<()> {
        let me = &self.inner.agent;
        let remote = peer.name.as_str();
        let (r, _, _) = peer
            .notif_rail()
            .ok_or_else(|| Error::disconnected(me, remote, op, "no rail reaches the peer"))?;
        let track = Arc::new(Track::default());
        let deadline = Instant::now() + self.inner.params.op_timeout;
        let mut idle = 0u32;
        while !peer
            .post_send(r, framed, &track)
            .map_err(|e| e.into_error(me, Some(remote), op))?
        {
            if Instant::now() >= deadline {
                // The provider would not take the message for a whole op_timeout.
                peer.fail_rails(&[r]);
                return Err(Error::TimedOut {
                    agent: me.clone(),
                    op,
                    elapsed: self.inner.params.op_timeout,
                });
            }
            if self.inner.poll() == 0 {
                idle += 1;
                backoff(idle, self.inner.params.idle_sleep);
            }
        }
        if !self.inner.drain(&track) {
            // The send buffer belongs to the rail, so nothing of the caller's is at risk; the
            // connection is torn down so the send is flushed and later calls fail fast (or
            // take another rail).
            peer.fail_rails(&[r]);
            self.inner.drain(&track);
            return Err(Error::TimedOut {
                agent: me.clone(),
                op,
                elapsed: self.inner.params.op_timeout,
            });
        }
        match track.state().1 {
            Some(e) => Err(e.into_error(me, Some(remote), op)),
            None => Ok(()),
        }
    }
}
