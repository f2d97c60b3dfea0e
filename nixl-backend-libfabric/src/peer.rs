//! A connected peer: its address on each rail, and which rails still reach it.
//!
//! A rail whose operations to the peer did not complete in time (a failed link: the tcp
//! provider reports nothing, the operations just stop) is marked failed for that peer and its
//! address removed from the rail's AV, which tears that connection down (once no other peer
//! names the same endpoint, and over shm only once the peer has gone: see `Rail::remove_name`).
//! New transfers are
//! striped over the rails left, and notifications go over the first of them; when no rail is
//! left the peer is unreachable and requests fail at once. Fresh metadata (a reload after the
//! repair) connects every rail again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nixl_core::backend::PeerProcess;
use nixl_core::backend::SessionId;

use crate::dead_holder::ShmGuard;
use crate::rail::{Rail, Track};
use crate::result::FiError;
use crate::sys;

/// A connected peer (or this agent itself, for loopback).
pub(crate) struct Peer {
    pub name: String,
    pub conn: Vec<u8>,
    /// `(rail, fi_addr)` for rails both sides have.
    pub addrs: Vec<(Arc<Rail>, sys::fi_addr_t)>,
    /// The peer's endpoint name on each of those rails.
    names: Vec<Vec<u8>>,
    pub alive: AtomicBool,
    /// Per rail: whether it still reaches the peer.
    rail_ok: Vec<AtomicBool>,
    /// Per rail: set once the address was removed from the rail's AV.
    removed: Vec<AtomicBool>,
    /// The session this agent's hello opened at the peer: what its notifications carry.
    pub session: SessionId,
    /// The peer's process, where it runs on this host and the agent bound it: over shm its
    /// exit is what lets operations that will never complete go (`XferCore::orphaned`).
    process: Option<PeerProcess>,
    /// Per rail, over shm with the process bound: what every post to the peer goes through.
    guards: Vec<Option<Arc<ShmGuard>>>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        for r in 0..self.addrs.len() {
            self.remove(r);
        }
    }
}

impl Peer {
    pub(crate) fn connect(
        name: &str,
        conn: &[u8],
        rails: &[Arc<Rail>],
        names: &[Vec<u8>],
        session: SessionId,
        process: Option<PeerProcess>,
        guards: Vec<Option<Arc<ShmGuard>>>,
    ) -> Result<Peer, FiError> {
        let mut p = Peer {
            name: name.to_owned(),
            conn: conn.to_vec(),
            addrs: Vec::new(),
            names: Vec::new(),
            alive: AtomicBool::new(true),
            rail_ok: Vec::new(),
            removed: Vec::new(),
            session,
            process,
            guards,
        };
        for (rail, addr) in rails.iter().zip(names) {
            // On failure `p` is dropped and removes what was inserted so far.
            let a = rail.insert_name(addr)?;
            p.addrs.push((rail.clone(), a));
            p.names.push(addr.clone());
            p.rail_ok.push(AtomicBool::new(true));
            p.removed.push(AtomicBool::new(false));
        }
        Ok(p)
    }

    /// Whether the peer's process is known to have exited (on this host; `false` where it is
    /// not bound).
    pub(crate) fn exited(&self) -> bool {
        self.process.as_ref().is_some_and(PeerProcess::exited)
    }

    /// Marks a post to the peer over rail `r` as running (see `crate::dead_holder`): `Err`
    /// once the peer's process has exited (nothing is posted to it then).
    fn enter(
        &self,
        r: usize,
        call: &'static str,
    ) -> Result<Option<crate::dead_holder::Posting<'_>>, FiError> {
        match self.guards.get(r) {
            Some(Some(g)) => g.enter().map(Some).ok_or_else(|| {
                FiError::new(call, sys::FI_ECONNRESET).with_detail("the peer's process exited")
            }),
            _ => Ok(None),
        }
    }

    /// Whether the peer's shm region lock on rail `r` is held by its live process now (see
    /// [`ShmGuard::held_by_live_peer`]): a post would spin inside libfabric until it is
    /// released, so it is not made yet (`Ok(false)`: the caller retries, bounded).
    fn held_by_live_peer(&self, r: usize) -> bool {
        matches!(self.guards.get(r), Some(Some(g)) if g.held_by_live_peer())
    }

    /// Posts one RMA operation to the peer over rail `r` (see [`Rail::post_rma`]); `Ok(false)`
    /// where it cannot be posted now (a full queue, or the peer's region lock held).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post_rma(
        &self,
        r: usize,
        write: bool,
        local: u64,
        len: u64,
        desc: usize,
        raddr: u64,
        key: u64,
        track: &Arc<Track>,
    ) -> Result<bool, FiError> {
        let (rail, addr) = &self.addrs[r];
        if self.held_by_live_peer(r) {
            return Ok(false);
        }
        let _posting = self.enter(r, if write { "fi_write" } else { "fi_read" })?;
        rail.post_rma(write, local, len, desc, *addr, raddr, key, track)
    }

    /// Sends one framed message to the peer over rail `r` (see [`Rail::post_send`]).
    pub(crate) fn post_send(
        &self,
        r: usize,
        framed: &[u8],
        track: &Arc<Track>,
    ) -> Result<bool, FiError> {
        let (rail, addr) = &self.addrs[r];
        if self.held_by_live_peer(r) {
            return Ok(false);
        }
        let _posting = self.enter(r, "fi_send")?;
        rail.post_send(*addr, framed, track)
    }

    /// Removes rail `r`'s address from its AV (once).
    fn remove(&self, r: usize) {
        let (Some((rail, _)), Some(name), Some(removed)) =
            (self.addrs.get(r), self.names.get(r), self.removed.get(r))
        else {
            return;
        };
        if removed.swap(true, Ordering::SeqCst) {
            return;
        }
        rail.remove_name(name);
    }

    /// Whether rail `r` still reaches the peer.
    pub(crate) fn rail_ok(&self, r: usize) -> bool {
        self.alive.load(Ordering::SeqCst)
            && self
                .rail_ok
                .get(r)
                .is_some_and(|ok| ok.load(Ordering::SeqCst))
    }

    /// The rails (of the first `n`) that still reach the peer.
    pub(crate) fn healthy_rails(&self, n: usize) -> Vec<usize> {
        (0..n.min(self.addrs.len()))
            .filter(|&r| self.rail_ok(r))
            .collect()
    }

    /// Whether every rail reaches the peer.
    pub(crate) fn all_rails_ok(&self) -> bool {
        self.healthy_rails(self.addrs.len()).len() == self.addrs.len()
    }

    /// The rail notifications to the peer go over: the first healthy one.
    pub(crate) fn notif_rail(&self) -> Option<(usize, Arc<Rail>, sys::fi_addr_t)> {
        let r = *self.healthy_rails(self.addrs.len()).first()?;
        self.addrs.get(r).map(|(rail, a)| (r, rail.clone(), *a))
    }

    /// Marks `rails` failed (their operations did not complete in time): new transfers to
    /// the peer avoid them. Their connections stay, so what is stuck on them still completes
    /// if the link comes back (an abandoned transfer drains instead of being flushed).
    pub(crate) fn avoid_rails(&self, rails: &[usize]) {
        for &r in rails {
            if let Some(ok) = self.rail_ok.get(r) {
                if ok.swap(false, Ordering::SeqCst) {
                    let domain = self.addrs.get(r).map(|(x, _)| x.domain_name.as_str());
                    tracing::warn!(peer = %self.name, rail = r, ?domain, "operations did not complete in time; the rail no longer carries transfers to this peer");
                }
            }
        }
    }

    /// Marks `rails` failed (see [`Peer::avoid_rails`]) and tears their connections down;
    /// with no rail left the peer is unreachable.
    pub(crate) fn fail_rails(&self, rails: &[usize]) {
        self.avoid_rails(rails);
        for &r in rails {
            if self.rail_ok.get(r).is_some() {
                self.remove(r);
            }
        }
        if self.healthy_rails(self.addrs.len()).is_empty() {
            self.declare_unreachable();
        }
    }

    /// Declares the peer unreachable: removes its addresses, which makes the provider tear the
    /// connections down and flush what is queued on them, and fails later requests at once. A
    /// new `connect` (fresh metadata) revives it.
    pub(crate) fn declare_unreachable(&self) {
        if self.alive.swap(false, Ordering::SeqCst) {
            tracing::warn!(peer = %self.name, "operations did not complete in time; dropping the peer's connections");
        }
        for r in 0..self.addrs.len() {
            self.remove(r);
        }
    }
}
