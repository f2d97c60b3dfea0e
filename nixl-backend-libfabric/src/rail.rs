//! One rail: a fabric, domain, CQ, AV and RDM endpoint, with the operation contexts posted on
//! it, its notification buffers and its byte counters.
//!
//! Every operation posted on a rail carries a boxed context (`crate::sys::post`) whose address
//! is the libfabric operation context (it starts with an `fi_context2`, so providers that need
//! `FI_CONTEXT` / `FI_CONTEXT2` space get it). The box stays in the rail's in-flight table until its
//! completion (or error completion) is read, so nothing the provider may still touch is freed
//! early; the table lives inside the endpoint and is dropped only after the endpoint is closed.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use nixl_core::backend::{NotifQueue, PeerAuth, Sessions};

/// Where received messages go: notifications into the agent's queue, attributed by the
/// session a checked hello opened (never by a name in the message).
pub(crate) struct Inbox {
    pub notifs: Arc<NotifQueue>,
    pub peers: PeerAuth,
    pub sessions: Sessions,
}

impl Inbox {
    fn deliver(&self, rail: usize, bytes: &[u8]) -> bool {
        match crate::wire::decode_message(bytes) {
            Ok(crate::wire::Message::Hello(h)) => match self.peers.check_hello(h) {
                Ok(hello) => {
                    // RDM endpoints have no connection identity: the session id (random,
                    // from a checked hello) is what ties a notification to its sender.
                    if let Err(why) = self.sessions.accept(&hello, 0) {
                        tracing::warn!(remote = %hello.sender, why, "refused a libfabric hello");
                    }
                    false
                }
                Err(e) => {
                    tracing::warn!(rail, error = %e, "refused a libfabric peer's hello");
                    false
                }
            },
            Ok(crate::wire::Message::Notif(session, msg)) => {
                match self.peers.attribute(&self.sessions, &session, 0) {
                    Some(sender) => {
                        self.notifs.push(&sender, msg.to_vec());
                        true
                    }
                    None => {
                        tracing::warn!(rail, "dropping a notification of an unknown session");
                        false
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, rail, len = bytes.len(), "dropping a malformed notification message");
                false
            }
        }
    }
}

use crate::sys::fabric::{Av, Cq, Domain, Endpoint, Fabric, Mr};
use crate::sys::info::Info;
use crate::sys::post::{EpGuard, EpState, MsgPool, Rma};

/// The rail's endpoint, locked.
type Guard<'a> = EpGuard<'a, OpKind, SendFree>;
use crate::keys::KeySource;
use crate::result::FiError;
use crate::sys::{self, Lib};

/// Counters of one rail, shared with [`crate::LibfabricStats`].
#[derive(Debug, Default)]
pub(crate) struct RailCounters {
    pub(crate) bytes_written: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) ops: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) notifs_sent: AtomicU64,
    pub(crate) notifs_received: AtomicU64,
    pub(crate) dead_locks_released: AtomicU64,
    /// Set once an shm peer died with operations of this rail in flight: libfabric 1.17's
    /// shm endpoint answers its operations in post order, so none posted after them ever
    /// completes (see [`Rail::refuse_if_blocked`]).
    pub(crate) blocked: AtomicBool,
}

/// Completion accounting of one post of a transfer (or of one standalone notification).
#[derive(Debug, Default)]
pub(crate) struct Track {
    inner: Mutex<TrackInner>,
}

#[derive(Debug, Default)]
struct TrackInner {
    outstanding: usize,
    /// Operations in flight per rail (indexed by rail).
    per_rail: Vec<usize>,
    error: Option<FiError>,
}

impl Track {
    fn lock(&self) -> MutexGuard<'_, TrackInner> {
        self.inner.lock()
    }

    fn add(&self, rail: usize) {
        let mut g = self.lock();
        g.outstanding += 1;
        if g.per_rail.len() <= rail {
            g.per_rail.resize(rail + 1, 0);
        }
        g.per_rail[rail] += 1;
    }

    fn complete(&self, rail: usize, err: Option<FiError>) {
        let mut g = self.lock();
        g.outstanding = g.outstanding.saturating_sub(1);
        if let Some(n) = g.per_rail.get_mut(rail) {
            *n = n.saturating_sub(1);
        }
        if g.error.is_none() {
            g.error = err;
        }
    }

    /// Operations still in flight, and the first error seen.
    pub(crate) fn state(&self) -> (usize, Option<FiError>) {
        let g = self.lock();
        (g.outstanding, g.error.clone())
    }

    /// The rails with operations still in flight.
    pub(crate) fn stuck_rails(&self) -> Vec<usize> {
        let g = self.lock();
        (0..g.per_rail.len())
            .filter(|&r| g.per_rail[r] > 0)
            .collect()
    }
}

enum OpKind {
    Rma {
        track: Arc<Track>,
        len: u64,
        write: bool,
        dest: sys::fi_addr_t,
    },
    Send {
        track: Arc<Track>,
        slot: usize,
        dest: sys::fi_addr_t,
    },
    Recv {
        slot: usize,
    },
}

/// What the provider may reference while the endpoint is open (in-flight contexts of
/// [`OpKind`], the notification pools) and the free send slots.
type RailState = EpState<OpKind, SendFree>;

/// The send slots no posted send owns.
struct SendFree(Vec<usize>);

/// Settings a rail is opened with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RailConfig {
    pub notif_size: usize,
    pub recv_slots: usize,
    pub send_slots: usize,
    /// The shm provider's rules for removing addresses (see [`Rail::remove_name`]).
    pub shm: bool,
}

/// The rail's AV: each endpoint name in it once, with its users and operations in flight.
#[derive(Default)]
struct AvTable {
    by_name: HashMap<Vec<u8>, sys::fi_addr_t>,
    entries: HashMap<sys::fi_addr_t, AvEntry>,
}

struct AvEntry {
    name: Vec<u8>,
    /// Peers (or this agent itself) using the address.
    users: usize,
    /// Operations to it posted and not yet completed.
    in_flight: usize,
}

/// One endpoint and everything it needs.
pub(crate) struct Rail {
    pub index: usize,
    pub domain_name: String,
    pub mr_mode: u64,
    pub max_msg: u64,
    pub key_size: usize,
    /// Whether the CQ has a wait object (the progress thread then blocks in `fi_cq_sread`,
    /// which also drives the provider's progress, instead of sleeping between polls).
    pub waitable: bool,
    pub addr: Vec<u8>,
    pub counters: Arc<RailCounters>,
    av: Arc<Av>,
    av_table: Mutex<AvTable>,
    shm: bool,
    pub domain: Arc<Domain>,
    cq: Arc<Cq>,
    /// Held from reading completions off the CQ until they are handled: without it, a thread
    /// that read an earlier completion in `fi_cq_sread` (outside the rail's lock) could handle
    /// it after another thread read and handled a later one, delivering a peer's first
    /// notification before its hello (dropped as an unknown session) or two notifications out
    /// of order.
    cq_order: Mutex<()>,
    /// Completed reads of the CQ, each of which drove the provider's progress once: an shm
    /// operation to a peer whose process exited can no longer move when two passes began
    /// after the exit was seen (see `XferCore::orphaned`).
    passes: AtomicU64,
    ep: Endpoint<Mutex<RailState>>,
    _info: Info,
}

/// Access flags of a registered region (a transfer's source or target).
pub(crate) fn mr_access() -> u64 {
    u64::from(sys::FI_READ)
        | u64::from(sys::FI_WRITE)
        | u64::from(sys::FI_REMOTE_READ)
        | u64::from(sys::FI_REMOTE_WRITE)
        | u64::from(sys::FI_SEND)
        | u64::from(sys::FI_RECV)
}

/// Access flags of the notification buffers: messages only, so a peer that learns their keys
/// cannot write into the notifications this agent receives (tcp;ofi_rxm still adds remote
/// read to every registration, for its rendezvous protocol: their keys being unpredictable,
/// `crate::keys`, is what keeps the notifications this agent sends out of reach there).
pub(crate) fn msg_access() -> u64 {
    u64::from(sys::FI_SEND) | u64::from(sys::FI_RECV)
}

impl Rail {
    /// Opens a rail from one info entry.
    pub(crate) fn open(
        lib: &'static Lib,
        info: Info,
        index: usize,
        cfg: RailConfig,
        keys: &KeySource,
    ) -> Result<Rail, FiError> {
        let e = info.first();
        let a = e
            .attrs()
            .ok_or_else(|| FiError::new("fi_getinfo", sys::FI_ENODATA))?;
        let (dattr, eattr, txattr, rxattr) = (a.domain, a.ep, a.tx, a.rx);
        let domain_name = e.domain_name();
        let mr_mode = u64::try_from(dattr.mr_mode).unwrap_or(0);
        let max_msg = u64::try_from(eattr.max_msg_size).unwrap_or(u64::MAX).max(1);
        let key_size = dattr.mr_key_size;
        let fabric = Fabric::open(lib, &info)?;
        let domain = Domain::open(&fabric, &info)?;
        let cq_size = (txattr.size + rxattr.size).max(1024);
        let (cq, waitable) = match Cq::open(&domain, cq_size, true) {
            Ok(cq) => (cq, true),
            Err(e) => {
                tracing::debug!(error = %e, "no CQ wait object; the progress thread polls");
                (Cq::open(&domain, cq_size, false)?, false)
            }
        };
        let av = Av::open(&domain)?;
        let state = RailState::new(
            MsgPool::new(cfg.recv_slots, cfg.notif_size),
            MsgPool::new(cfg.send_slots, cfg.notif_size),
            SendFree((0..cfg.send_slots.max(1)).rev().collect()),
        );
        if cfg.shm {
            crate::dead_holder::reap_reused_pid_regions();
        }
        let ep = Endpoint::open(&domain, &info, &cq, &av, Mutex::new(state))?;
        let addr = ep.name()?;
        let rail = Rail {
            index,
            domain_name,
            mr_mode,
            max_msg,
            key_size,
            waitable,
            addr,
            counters: Arc::default(),
            av,
            av_table: Mutex::default(),
            shm: cfg.shm,
            domain,
            cq,
            cq_order: Mutex::new(()),
            passes: AtomicU64::new(0),
            ep,
            _info: info,
        };
        {
            let mut st = rail.lock();
            st.register_pools(
                &rail.domain,
                msg_access(),
                || keys.next(key_size),
                |mr| {
                    if mr_mode & u64::from(sys::FI_MR_ENDPOINT) != 0 {
                        mr.bind(&rail.ep)?;
                    }
                    Ok(())
                },
            )?;
            for slot in 0..cfg.recv_slots {
                if !rail.post_recv(&mut st, slot)? {
                    tracing::warn!(
                        rail = index,
                        posted = slot,
                        "receive queue full; fewer notification buffers posted"
                    );
                    break;
                }
            }
        }
        Ok(rail)
    }

    fn lock(&self) -> Guard<'_> {
        self.ep.lock()
    }

    fn av_table(&self) -> MutexGuard<'_, AvTable> {
        self.av_table.lock()
    }

    /// The AV address of a peer's endpoint name (checked by `crate::validate`): inserted on
    /// first use, shared by every peer (or this agent itself) naming the same endpoint, and
    /// removed by [`Rail::remove_name`] once no one uses it. A name is never in the AV twice:
    /// libfabric 1.17's shm provider gives both entries one map slot and unmaps the peer's
    /// region when either is removed, so the other would write into unmapped memory.
    pub(crate) fn insert_name(&self, name: &[u8]) -> Result<sys::fi_addr_t, FiError> {
        // Held across the insert, so two peers naming one endpoint insert it once.
        let mut t = self.av_table();
        if let Some(addr) = t.by_name.get(name).copied() {
            if let Some(e) = t.entries.get_mut(&addr) {
                e.users += 1;
            }
            return Ok(addr);
        }
        if self.shm {
            // Addresses kept after their last user, of peers that have gone since.
            let gone: Vec<sys::fi_addr_t> = t
                .entries
                .iter()
                .filter(|(_, e)| e.users == 0 && self.removable(e))
                .map(|(a, _)| *a)
                .collect();
            for a in gone {
                self.retire(&mut t, a);
            }
        }
        crate::reached::av_insert();
        let addr = self.av.insert(name)?;
        t.by_name.insert(name.to_vec(), addr);
        t.entries.insert(
            addr,
            AvEntry {
                name: name.to_vec(),
                users: 1,
                in_flight: 0,
            },
        );
        Ok(addr)
    }

    /// Drops one use of a name [`Rail::insert_name`] returned. The last removes it from the
    /// AV, which tears the connection to that endpoint down.
    ///
    /// Not so on an shm rail, where removing an address unmaps the peer's region while the
    /// provider may still read it: when the answer to an operation in flight arrives (a
    /// delivery-complete send to a peer that was stopped, then woke up), and whenever the peer
    /// sends to this agent (its messages name the same map slot). Both crashed libfabric 1.17
    /// (SIGSEGV in `fi_cq_read`). An shm address is kept after its last user, and reused if the
    /// name comes back, until no operation to it is in flight and the peer's region is gone
    /// (the peer closed its endpoint, which unlinks it); names of this process's endpoints are
    /// kept for the rail's life. Peers killed before closing keep their slot (the provider has
    /// 256 per AV).
    pub(crate) fn remove_name(&self, name: &[u8]) {
        let mut t = self.av_table();
        let Some(addr) = t.by_name.get(name).copied() else {
            return;
        };
        let Some(e) = t.entries.get_mut(&addr) else {
            return;
        };
        e.users = e.users.saturating_sub(1);
        if e.users == 0 && self.removable(e) {
            self.retire(&mut t, addr);
        }
    }

    /// Whether an address no peer uses any more may leave the AV now.
    fn removable(&self, e: &AvEntry) -> bool {
        !self.shm || (e.in_flight == 0 && crate::validate::shm_peer_gone(&e.name))
    }

    /// Removes an address no one uses from the table and the AV.
    fn retire(&self, t: &mut AvTable, addr: sys::fi_addr_t) {
        if let Some(e) = t.entries.remove(&addr) {
            t.by_name.remove(&e.name);
        }
        if let Err(e) = self.av.remove(addr) {
            tracing::debug!(rail = self.index, error = %e, "removing a peer address failed");
        }
    }

    /// Counts an operation posted to `dest` (under the endpoint's lock, so before its
    /// completion can be read).
    fn op_posted(&self, dest: sys::fi_addr_t) {
        if let Some(e) = self.av_table().entries.get_mut(&dest) {
            e.in_flight += 1;
        }
    }

    /// Counts an operation to `dest` completed; removes the address if no one uses it and it
    /// may leave now.
    fn op_done(&self, dest: sys::fi_addr_t) {
        let mut t = self.av_table();
        let Some(e) = t.entries.get_mut(&dest) else {
            return;
        };
        e.in_flight = e.in_flight.saturating_sub(1);
        if e.users == 0 && self.removable(e) {
            self.retire(&mut t, dest);
        }
    }

    fn post_recv(&self, st: &mut Guard<'_>, slot: usize) -> Result<bool, FiError> {
        st.post_recv(slot, OpKind::Recv { slot })
    }

    /// Posts one RMA operation. `Ok(false)`: the queue is full, retry after progress.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post_rma(
        &self,
        write: bool,
        local: u64,
        len: u64,
        desc: usize,
        dest: sys::fi_addr_t,
        raddr: u64,
        key: u64,
        track: &Arc<Track>,
    ) -> Result<bool, FiError> {
        self.refuse_if_blocked(if write { "fi_write" } else { "fi_read" })?;
        let mut st = self.lock();
        let op = Rma {
            write,
            local,
            len,
            desc,
            dest,
            raddr,
            key,
        };
        let kind = OpKind::Rma {
            track: track.clone(),
            len,
            write,
            dest,
        };
        // The local range lies in a registration the transfer holds (desc is its
        // descriptor); the remote range was checked against the peer's region.
        crate::reached::rma_post();
        crate::reached::drive();
        let ok = st.post_rma(&op, kind)?;
        if ok {
            track.add(self.index);
            self.op_posted(dest);
        }
        Ok(ok)
    }

    /// Sends a framed notification. `Ok(false)`: no free buffer or the queue is full.
    pub(crate) fn post_send(
        &self,
        dest: sys::fi_addr_t,
        framed: &[u8],
        track: &Arc<Track>,
    ) -> Result<bool, FiError> {
        self.refuse_if_blocked("fi_send")?;
        let mut st = self.lock();
        if framed.len() > st.send_slot_size() {
            return Err(FiError::new("fi_send", sys::FI_EMSGSIZE));
        }
        let Some(slot) = st.0.pop() else {
            return Ok(false);
        };
        let kind = OpKind::Send {
            track: track.clone(),
            slot,
            dest,
        };
        match st.post_send(slot, framed, dest, kind) {
            Ok(true) => {
                track.add(self.index);
                self.op_posted(dest);
                Ok(true)
            }
            Ok(false) => {
                st.0.push(slot);
                Ok(false)
            }
            Err(e) => {
                st.0.push(slot);
                Err(e)
            }
        }
    }

    /// Reads completions (bounded), delivering received notifications into `notifs`.
    /// Returns how many completions were handled.
    /// Handles what the CQ holds, unless another thread is reading it (that thread handles
    /// it, in order): then 0.
    pub(crate) fn poll(&self, notifs: &Inbox) -> Result<usize, FiError> {
        // Counted as an attempt: whether the queue's lock was free is luck.
        crate::reached::drive();
        let Some(_order) = self.cq_order.try_lock() else {
            return Ok(0);
        };
        self.poll_ordered(notifs)
    }

    /// [`Rail::poll`] with `cq_order` held by the caller.
    fn poll_ordered(&self, notifs: &Inbox) -> Result<usize, FiError> {
        let mut st = self.lock();
        let mut entries = [sys::fi_cq_msg_entry {
            op_context: std::ptr::null_mut(),
            flags: 0,
            len: 0,
        }; 16];
        let mut handled = 0;
        for _ in 0..64 {
            match self.cq.read(&mut entries) {
                Ok(0) => break,
                Ok(n) => {
                    for e in &entries[..n] {
                        self.complete(&mut st, e.op_context, e.len, None, notifs)?;
                    }
                    handled += n;
                }
                Err(e) if e.code == sys::FI_EAVAIL => match self.cq.read_error()? {
                    Some((ctx, err)) => {
                        self.complete(&mut st, ctx, 0, Some(err), notifs)?;
                        handled += 1;
                    }
                    None => break,
                },
                Err(e) => return Err(e),
            }
        }
        self.passes.fetch_add(1, Ordering::SeqCst);
        Ok(handled)
    }

    /// Completed progress passes over the rail's CQ (each drove the provider once).
    pub(crate) fn passes(&self) -> u64 {
        self.passes.load(Ordering::SeqCst)
    }

    /// Marks the rail blocked by a dead shm peer's operations (see [`Rail::refuse_if_blocked`]).
    pub(crate) fn block_behind_dead_peer(&self) {
        if !self.counters.blocked.swap(true, Ordering::SeqCst) {
            tracing::error!(
                rail = self.index,
                "an shm peer died with operations of this rail in flight: the endpoint completes nothing posted after them; recreate the agent"
            );
        }
    }

    /// Refuses a post on a rail a dead shm peer blocked: libfabric 1.17's shm endpoint reads
    /// the answers to its operations from one queue in post order and stops at the first
    /// unanswered one, which a peer killed mid-operation never answers. A post there would
    /// never complete (and its memory never be let go); it is refused at once instead.
    fn refuse_if_blocked(&self, call: &'static str) -> Result<(), FiError> {
        if self.counters.blocked.load(Ordering::SeqCst) {
            return Err(FiError::new(call, sys::FI_EIO).with_detail(
                "libfabric's shm endpoint is blocked behind operations to a peer that died \
                 with them in flight; recreate the agent to use shm again",
            ));
        }
        Ok(())
    }

    /// Whether this rail runs libfabric's shm provider.
    pub(crate) fn is_shm(&self) -> bool {
        self.shm
    }

    /// Blocks up to `timeout_ms` in `fi_cq_sread` (without the rail's lock, so posting goes
    /// on meanwhile), handles what arrived, then polls. Only for waitable rails.
    pub(crate) fn wait_poll(&self, notifs: &Inbox, timeout_ms: i32) -> Result<usize, FiError> {
        let _order = self.cq_order.lock();
        let mut entries = [sys::fi_cq_msg_entry {
            op_context: std::ptr::null_mut(),
            flags: 0,
            len: 0,
        }; 16];
        let got = match self.cq.sread(&mut entries, timeout_ms) {
            Ok(n) => n,
            Err(e) if e.code == sys::FI_EAVAIL => 0,
            Err(e) => return Err(e),
        };
        if got > 0 {
            // Contexts are inserted under the lock in the same critical section as the post,
            // so every context read here is already in the table once the lock is taken.
            let mut st = self.lock();
            for e in &entries[..got] {
                self.complete(&mut st, e.op_context, e.len, None, notifs)?;
            }
        }
        Ok(got + self.poll_ordered(notifs)?)
    }

    fn complete(
        &self,
        st: &mut Guard<'_>,
        ctx: *mut c_void,
        len: usize,
        err: Option<FiError>,
        notifs: &Inbox,
    ) -> Result<(), FiError> {
        let Some(kind) = st.complete(ctx) else {
            tracing::warn!(
                rail = self.index,
                "completion for an unknown operation context"
            );
            return Ok(());
        };
        if let Some(e) = &err {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(rail = self.index, error = %e, "operation failed");
        }
        match kind {
            OpKind::Rma {
                track,
                len,
                write,
                dest,
            } => {
                if err.is_none() {
                    let c = if write {
                        &self.counters.bytes_written
                    } else {
                        &self.counters.bytes_read
                    };
                    c.fetch_add(len, Ordering::Relaxed);
                    self.counters.ops.fetch_add(1, Ordering::Relaxed);
                }
                track.complete(self.index, err);
                self.op_done(dest);
            }
            OpKind::Send { track, slot, dest } => {
                st.0.push(slot);
                if err.is_none() {
                    self.counters.notifs_sent.fetch_add(1, Ordering::Relaxed);
                }
                track.complete(self.index, err);
                self.op_done(dest);
            }
            OpKind::Recv { slot } => {
                match err {
                    None => {
                        let bytes = st.received(slot, len);
                        if notifs.deliver(self.index, bytes) {
                            self.counters
                                .notifs_received
                                .fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Some(e) if e.code == sys::FI_ECANCELED => return Ok(()),
                    Some(e) => {
                        tracing::warn!(rail = self.index, error = %e, "notification receive failed")
                    }
                }
                if !self.post_recv(st, slot)? {
                    tracing::warn!(rail = self.index, "could not repost a notification buffer");
                }
            }
        }
        Ok(())
    }
}

impl Rail {
    /// Registers memory on this rail's domain (binding it to the endpoint where the provider
    /// needs that). The memory must stay valid while the registration is used: the agent
    /// keeps a registered region's memory alive (`MemoryRegion`'s contract).
    pub(crate) fn register(
        &self,
        addr: u64,
        len: u64,
        key: u64,
        hmem: Option<(u32, i32)>,
    ) -> Result<Mr, FiError> {
        let mr = Mr::register(&self.domain, addr, len, mr_access(), key, hmem)?;
        if self.mr_mode & u64::from(sys::FI_MR_ENDPOINT) != 0 {
            mr.bind(&self.ep)?;
        }
        Ok(mr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn track_knows_which_rails_are_stuck() {
        let t = Track::default();
        t.add(0);
        t.add(1);
        t.add(1);
        t.complete(0, None);
        t.complete(1, None);
        assert_eq!(t.state().0, 1);
        assert_eq!(t.stuck_rails(), vec![1]);
        t.complete(1, Some(FiError::new("fi_write", sys::FI_EIO)));
        assert_eq!(t.state().0, 0);
        assert!(t.stuck_rails().is_empty());
        assert!(t.state().1.is_some(), "the first error is kept");
        // A completion for a rail never added to cannot underflow or panic.
        t.complete(7, None);
        assert_eq!(t.state().0, 0);
    }
}
