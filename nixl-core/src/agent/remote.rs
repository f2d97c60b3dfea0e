//! Peers' metadata: producing ours, loading theirs, invalidating them.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::load::LoadPlan;
use crate::agent::registration::{RegInner, Registration};
use crate::agent::{Agent, BackendSlot};
use crate::auth::Proof;
use crate::backend::BackendMd;
use crate::codec::{AgentMetadata, BackendEntry, RegionRef};
use crate::desc::XferDescList;
use crate::error::{Error, Op, Result};
use crate::index::RegionIndex;
use crate::mem::{MemKind, RegionDesc};
use crate::nixl_wire::Wire;

/// A peer's region, loaded into some backends.
pub(crate) struct RemoteRegion {
    pub desc: RegionDesc,
    /// The label its owner registered it with (empty: none).
    pub label: String,
    pub mds: Vec<(Arc<BackendSlot>, BackendMd, Vec<u8>)>,
}

impl RemoteRegion {
    pub(crate) fn md_for(&self, slot_id: usize) -> Option<BackendMd> {
        self.mds
            .iter()
            .find(|(s, _, _)| s.id == slot_id)
            .map(|(_, m, _)| m.clone())
    }
}

impl Drop for RemoteRegion {
    fn drop(&mut self) {
        for (slot, md, _) in self.mds.drain(..) {
            if let Err(e) = slot.backend.unload(md) {
                tracing::warn!(backend = %slot.name, error = %e, "unloading a remote region failed");
            }
        }
    }
}

/// A loaded peer: one incarnation (generation) of a remote agent.
pub(crate) struct RemotePeer {
    pub name: String,
    pub generation: u64,
    /// The wire format the peer speaks.
    pub wire: Wire,
    /// False once invalidated or replaced by a newer generation.
    pub valid: AtomicBool,
    /// Backend slot id -> connection info.
    pub conn: Mutex<BTreeMap<usize, Vec<u8>>>,
    /// The peer's loaded regions.
    pub regions: Mutex<RegionIndex<Arc<RemoteRegion>>>,
    /// The owner commitment its authenticated metadata carried (who may invalidate it).
    pub owner_commit: Option<[u8; 32]>,
    /// Its process, when it runs on this host (tells its exit without a transport).
    pub process: Option<crate::liveness::PeerProcess>,
    /// Whether it verifies integrity frames (its metadata says so).
    pub verifies_integrity: bool,
    /// The key its hellos are signed with (its metadata says so; `None`: it announced none).
    pub hello_key: Option<[u8; 32]>,
}

impl crate::agent::Shared {
    /// Why peer `name` is gone, if it is: its incarnation was invalidated (`None` when it was
    /// never loaded: `loaded` says whether it was), its process exited (same host), or a
    /// transport it is connected over holds it for dead. `RemoteDisconnect`.
    pub(crate) fn peer_gone(&self, name: &str, loaded: bool) -> Option<Error> {
        let Some(p) = self.remotes.lock().get(name).cloned() else {
            return loaded.then(|| {
                Error::disconnected(
                    &self.name,
                    name,
                    Op::GetNotifs,
                    "its metadata was invalidated",
                )
            });
        };
        if let Err(e) = p.check_alive(&self.name, Op::GetNotifs) {
            return Some(e);
        }
        let slots: Vec<usize> = p.conn.lock().keys().copied().collect();
        self.backends()
            .iter()
            .filter(|b| slots.contains(&b.id))
            .find_map(|b| b.backend.peers()?.peer_failed(name))
            .map(|why| Error::disconnected(&self.name, name, Op::GetNotifs, why))
    }
}

impl RemotePeer {
    /// `RemoteDisconnect` when the peer's process is known to have exited.
    pub(crate) fn check_alive(&self, agent: &str, op: Op) -> Result<()> {
        self.check_alive_at(agent, op, std::time::Instant::now())
    }

    /// [`RemotePeer::check_alive`] with the caller's clock reading `now`.
    pub(crate) fn check_alive_at(
        &self,
        agent: &str,
        op: Op,
        now: std::time::Instant,
    ) -> Result<()> {
        if self
            .process
            .as_ref()
            .is_some_and(|p| p.watch().exited_lately(now))
        {
            return Err(Error::disconnected(
                agent,
                &self.name,
                op,
                "its process exited",
            ));
        }
        Ok(())
    }

    pub(crate) fn is_connected(&self, slot_id: usize) -> bool {
        self.conn.lock().contains_key(&slot_id)
    }

    /// The loaded region covering `[addr, addr+len)`.
    pub(crate) fn find(
        &self,
        kind: MemKind,
        dev_id: u64,
        addr: u64,
        len: u64,
    ) -> Option<Arc<RemoteRegion>> {
        self.regions
            .lock()
            .find(kind, dev_id, addr, len, |r| {
                r.desc.covers(addr, len, dev_id)
            })
            .cloned()
    }
}

impl RemotePeer {
    /// As [`RemotePeer::find`], with the bound below which every covered range finds the same
    /// region (see [`RegionIndex::find_bounded`]).
    pub(crate) fn find_bounded(
        &self,
        kind: MemKind,
        dev_id: u64,
        addr: u64,
        len: u64,
    ) -> Option<(Arc<RemoteRegion>, u64)> {
        self.regions
            .lock()
            .find_bounded(kind, dev_id, addr, len, |r| {
                r.desc.covers(addr, len, dev_id)
            })
            .map(|(r, bound)| (r.clone(), bound))
    }
}

/// Who asks to invalidate a peer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Invalidator<'a> {
    /// This process (the application, or the etcd watcher acting for it).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Local,
    /// A peer over the side channel, with the owner token it revealed (if any).
    Peer(Option<&'a [u8]>),
}

/// Whom metadata is built for: which shared registrations ([`crate::access::Share`]) it may carry.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Audience<'a> {
    /// Whoever the bytes reach: no shared registration.
    Anyone,
    /// These proven peer names: the shares that list one of them.
    Peers(&'a [&'a str]),
}

impl<'a> Audience<'a> {
    fn names(&self) -> &'a [&'a str] {
        match self {
            Audience::Anyone => &[],
            Audience::Peers(n) => n,
        }
    }
}

/// What a partial metadata blob should carry.
#[derive(Debug, Clone, Default)]
pub struct MetadataSelection<'a> {
    /// Only these registrations (`None`: all live ones).
    pub registrations: Option<&'a [&'a Registration]>,
    /// Include the backends' connection info.
    pub include_conn: bool,
}

impl Agent {
    /// The agent's full metadata: every backend's connection info and every live registration.
    #[doc(alias = "getLocalMD")]
    pub fn local_metadata(&self) -> Result<Vec<u8>> {
        self.local_partial_metadata(&MetadataSelection {
            registrations: None,
            include_conn: true,
        })
    }

    /// Partial metadata: only some registrations and/or only connection info
    /// (`registrations: Some(&[])` with `include_conn: true`).
    ///
    /// Registrations whose label an [`AgentConfig::shares`](crate::AgentConfig::shares) entry
    /// names are left out (naming one in `sel` is `NotAllowed`): they go to listed peers only,
    /// through [`Agent::local_metadata_for`] or a FETCH.
    #[doc(alias = "getLocalPartialMD")]
    pub fn local_partial_metadata(&self, sel: &MetadataSelection<'_>) -> Result<Vec<u8>> {
        self.metadata_for(sel, Audience::Anyone)
    }

    /// The agent's full metadata as `peer` may have it: with the registrations the
    /// [`AgentConfig::shares`](crate::AgentConfig::shares) list it for, and those no share
    /// names. For an application's own exchange, when it knows the bytes go to `peer` only.
    pub fn local_metadata_for(&self, peer: &str) -> Result<Vec<u8>> {
        self.metadata_for(
            &MetadataSelection {
                registrations: None,
                include_conn: true,
            },
            Audience::Peers(&[peer]),
        )
    }

    /// The metadata `audience` may have.
    pub(crate) fn metadata_for(
        &self,
        sel: &MetadataSelection<'_>,
        audience: Audience<'_>,
    ) -> Result<Vec<u8>> {
        let backends = self.shared.backends();
        let mut backend_entries = Vec::with_capacity(backends.len());
        for b in &backends {
            let conn_info = if sel.include_conn {
                b.connection_info()?
            } else {
                Vec::new()
            };
            backend_entries.push(BackendEntry {
                name: b.name.clone(),
                conn_info,
            });
        }
        let regs = self.selected_registrations(sel, audience)?;
        // One entry per region and backend holding it (usually one backend), borrowed where
        // it lives: the metadata's `Arc` taken under the region's lock, its public bytes
        // borrowed from it where the backend keeps them there, each copied once, into the blob.
        let mut regions = Vec::with_capacity(regs.iter().map(|r| r.regions.len()).sum());
        for reg in &regs {
            let label = reg.label.as_deref().unwrap_or_default();
            for r in &reg.regions {
                for (slot, md) in r.mds.lock().iter() {
                    if !slot.caps.remote {
                        continue;
                    }
                    let Some(idx) = backends.iter().position(|b| b.id == slot.id) else {
                        continue;
                    };
                    regions.push((idx, &r.desc, md.clone(), label));
                }
            }
        }
        let publics = regions
            .iter()
            .map(|(idx, _, md, _)| backends[*idx].public_metadata_cow(md))
            .collect::<Result<Vec<_>>>()?;
        let entries = regions
            .iter()
            .zip(&publics)
            .map(|(&(backend, desc, _, label), public)| RegionRef {
                backend,
                desc,
                public,
                label,
            });
        let blob = AgentMetadata {
            name: self.shared.name.clone(),
            generation: self.shared.generation,
            has_conn_info: sel.include_conn,
            process: self.shared.process,
            verifies_integrity: self.shared.config.verify_integrity,
            hello_key: sel.include_conn.then(|| self.shared.hello_keys.public()),
            succession: self.shared.succession.filter(|_| sel.include_conn),
            backends: backend_entries,
            regions: Vec::new(),
        }
        .encode_with(entries);
        Ok(self.shared.signer.seal(blob))
    }

    /// The live registrations a selection names (all, when it names none) that `audience` may
    /// have: a registration a share names only for a listed peer (left out of an unnamed
    /// selection; `NotAllowed` where the selection names it).
    pub(crate) fn selected_registrations(
        &self,
        sel: &MetadataSelection<'_>,
        audience: Audience<'_>,
    ) -> Result<Vec<Arc<RegInner>>> {
        let shares = &self.shared.config.shares;
        let allowed = |r: &RegInner| {
            let share = r
                .label
                .as_deref()
                .and_then(|l| shares.iter().find(|s| s.label == l));
            share.is_none_or(|s| audience.names().iter().any(|p| s.lists(p)))
        };
        Ok(match sel.registrations {
            None => {
                let mut live = self.shared.regs.lock().live();
                live.retain(|r| allowed(r));
                live
            }
            Some(list) => {
                let mut v = Vec::with_capacity(list.len());
                for r in list {
                    self.check_live(r, Op::LocalMetadata)?;
                    if !allowed(&r.inner) {
                        return Err(Error::not_allowed(
                            self.name(),
                            Op::LocalMetadata,
                            format!(
                                "registration {:?} is shared with named peers only \
                                 (AgentConfig::shares): use local_metadata_for(peer)",
                                r.label().unwrap_or_default()
                            ),
                        ));
                    }
                    v.push(r.inner.clone());
                }
                v
            }
        })
    }

    /// Loads a peer's metadata and returns its name.
    ///
    /// Takes this crate's metadata or a stock NIXL agent's blob (see [`crate::nixl_wire`]).
    /// Loading is append-only for one incarnation of a peer: new regions are added, identical
    /// ones skipped, and changed connection info or changed region metadata is refused with
    /// [`Error::Mismatch`] (nothing changes). Metadata with a new generation replaces the old
    /// incarnation: requests built against it then fail with [`Error::PeerRestarted`]; if the
    /// new incarnation's metadata then fails to load, the peer is left not loaded (the old
    /// incarnation is gone either way: its process restarted).
    ///
    /// Costs are linear in the blob's regions, and only loads of the same peer wait for each
    /// other: transfers and loads of other peers go on while a large peer loads.
    ///
    /// With [`crate::AgentConfig::auth`], only metadata sealed under an accepted credential
    /// loads, a name stays with the credential that first loaded it, a new incarnation must be
    /// newer than every one accepted before (no replays), and [`crate::Limits`] bound peers and
    /// regions ([`Error::NotAllowed`] / [`Error::LimitExceeded`]; nothing changes).
    #[doc(alias = "loadRemoteMD")]
    pub fn load_remote_metadata(&self, bytes: &[u8]) -> Result<String> {
        let decode_err = |source| Error::Decode {
            agent: self.name().to_owned(),
            op: Op::LoadMetadata,
            source,
        };
        if crate::nixl_wire::is_nixl_blob(bytes) {
            if self.shared.signer.auth.is_some() {
                return Err(Error::not_allowed(
                    self.name(),
                    Op::LoadMetadata,
                    "a stock NIXL agent's metadata cannot be authenticated (this agent requires a \
                     credential)",
                ));
            }
            let n = crate::nixl_wire::NixlMetadata::decode_bytes(bytes).map_err(decode_err)?;
            self.refuse_own(&n.name)?;
            let peer_lock = self.shared.peer_lock(&n.name);
            let _serialised = peer_lock.lock();
            // A NIXL blob's incarnation depends on what is loaded: decided under the lock.
            let md = self.nixl_to_agent_metadata(n)?;
            return self.load_locked(md, Wire::Nixl, None);
        }
        let opened = self.shared.signer.open(self.name(), bytes)?;
        let proof = opened.proof;
        let md = AgentMetadata::decode_bytes(opened.blob).map_err(decode_err)?;
        self.refuse_own(&md.name)?;
        let peer_lock = self.shared.peer_lock(&md.name);
        let _serialised = peer_lock.lock();
        self.load_locked(md, Wire::Native, proof.as_ref())
    }

    fn refuse_own(&self, name: &str) -> Result<()> {
        if name == self.name() {
            return Err(Error::not_allowed(
                self.name(),
                Op::LoadMetadata,
                "an agent cannot load its own metadata",
            ));
        }
        Ok(())
    }

    /// Loads decoded metadata; the caller holds the peer's lock.
    fn load_locked(&self, md: AgentMetadata, wire: Wire, proof: Option<&Proof>) -> Result<String> {
        let plan = LoadPlan::validate(self, &md, wire, proof)?;
        plan.apply(self, &md, wire, proof)?;
        tracing::debug!(agent = %self.name(), remote = %md.name, generation = md.generation, ?wire, regions = plan.new_regions.len(), "metadata loaded");
        Ok(md.name)
    }

    pub(super) fn retire_peer(&self, peer: &Arc<RemotePeer>) {
        peer.valid.store(false, Ordering::SeqCst);
        let conns: Vec<usize> = std::mem::take(&mut *peer.conn.lock()).into_keys().collect();
        for slot in self
            .shared
            .backends()
            .iter()
            .filter(|b| conns.contains(&b.id))
        {
            if let Err(e) = slot.disconnect(&peer.name) {
                tracing::warn!(agent = %self.name(), remote = %peer.name, error = %e, "disconnect failed");
            }
        }
    }

    /// Forgets a peer's metadata: its requests fail from now on, and it must be loaded again
    /// to be used. (The counterpart on the peer's side is
    /// [`Agent::invalidate_local_metadata`], which asks peers to forget it.)
    #[doc(alias = "invalidateRemoteMD")]
    pub fn invalidate_remote_metadata(&self, remote: &str) -> Result<()> {
        let peer_lock = self.shared.peer_lock(remote);
        let _serialised = peer_lock.lock();
        let peer = self
            .shared
            .remotes
            .lock()
            .remove(remote)
            .inspect(|p| p.valid.store(false, Ordering::SeqCst))
            .ok_or_else(|| {
                Error::not_found(
                    self.name(),
                    Op::Invalidate,
                    format!("remote agent {remote}"),
                )
            })?;
        self.shared.hello_keys.forgotten(remote);
        self.shared.successions.gone(remote);
        self.retire_peer(&peer);
        Ok(())
    }

    /// Invalidates a peer only if the loaded incarnation has this generation (so a stale
    /// message cannot remove a restarted peer) and, when it was loaded from authenticated
    /// metadata, only for its owner (`owner_token` hashes to the commitment its metadata
    /// carried). Returns whether it did; [`Error::NotAllowed`] for a peer that is not the
    /// owner of the loaded incarnation.
    pub(crate) fn invalidate_remote_generation(
        &self,
        remote: &str,
        generation: u64,
        by: Invalidator<'_>,
    ) -> Result<bool> {
        let peer_lock = self.shared.peer_lock(remote);
        let _serialised = peer_lock.lock();
        let mut remotes = self.shared.remotes.lock();
        let allowed = |p: &RemotePeer| match (by, p.owner_commit) {
            (Invalidator::Local, _) | (Invalidator::Peer(_), None) => true,
            (Invalidator::Peer(token), Some(c)) => {
                token.is_some_and(|t| crate::auth::commit(t) == c)
            }
        };
        match remotes.get(remote) {
            Some(p) if p.generation == generation && allowed(p) => {
                let peer = remotes.remove(remote);
                // Invalid before anyone can see it gone: a request built against it and
                // posted once `check_remote_metadata` says so must fail.
                if let Some(p) = &peer {
                    p.valid.store(false, Ordering::SeqCst);
                }
                drop(remotes);
                self.shared.hello_keys.forgotten(remote);
                self.shared.successions.gone(remote);
                if let Some(p) = peer {
                    self.retire_peer(&p);
                }
                Ok(true)
            }
            Some(p) if p.generation == generation => Err(Error::not_allowed(
                self.name(),
                Op::Invalidate,
                format!("only {remote} itself (or this process) may invalidate it"),
            )),
            _ => Ok(false),
        }
    }

    /// Whether a peer's metadata is loaded and, given descriptors, whether they all lie inside
    /// its loaded regions.
    #[doc(alias = "checkRemoteMD")]
    pub fn check_remote_metadata(&self, remote: &str, descs: Option<&XferDescList>) -> bool {
        let Ok(peer) = self.remote_peer(remote, Op::LoadMetadata) else {
            return false;
        };
        match descs {
            None => true,
            Some(list) => list
                .descs()
                .iter()
                .all(|d| peer.find(list.kind(), d.dev_id, d.addr, d.len).is_some()),
        }
    }

    /// The regions a loaded peer registered (from its metadata), ordered by kind, device and
    /// address: where an initiator may read or write, without addresses passed out of band.
    /// [`Error::NotFound`] for a peer that is not loaded.
    pub fn remote_regions(&self, remote: &str) -> Result<Vec<RegionDesc>> {
        let peer = self.remote_peer(remote, Op::LoadMetadata)?;
        let regions = peer.regions.lock();
        Ok(regions.values().map(|r| r.desc.clone()).collect())
    }

    /// The loaded regions of `remote` its owner registered with `label`
    /// ([`Agent::register_mem_labeled`]): how a peer's KV pool is told from its other regions.
    /// Empty when none carries the label (regions of peers older than labels carry none);
    /// `NotFound` for a peer that is not loaded.
    pub fn remote_regions_labeled(&self, remote: &str, label: &str) -> Result<Vec<RegionDesc>> {
        let peer = self.remote_peer(remote, Op::LoadMetadata)?;
        let regions = peer.regions.lock();
        Ok(regions
            .values()
            .filter(|r| !label.is_empty() && r.label == label)
            .map(|r| r.desc.clone())
            .collect())
    }

    /// The name and generation of metadata bytes, when this agent would accept them as
    /// authentic: with authentication on, they verify under an accepted credential, that
    /// credential is the one the name is bound to (if bound), and another incarnation is newer
    /// than every one accepted before; with it off, they decode. Nothing is loaded.
    #[cfg(feature = "etcd")]
    pub(crate) fn authentic_identity(&self, bytes: &[u8]) -> Option<(String, Option<u64>)> {
        if crate::nixl_wire::is_nixl_blob(bytes) {
            // A stock NIXL agent's blob: never authentic under a credential; without one,
            // its name and (connection-derived) incarnation, as a load would see them.
            if self.shared.signer.auth.is_some() {
                return None;
            }
            return crate::nixl_wire::agent::metadata_identity(bytes).ok();
        }
        let opened = self.shared.signer.open(self.name(), bytes).ok()?;
        let md = AgentMetadata::decode_bytes(opened.blob).ok()?;
        if let Some(p) = &opened.proof {
            let loaded = self.remote_generation(&md.name);
            let new_incarnation = loaded != Some(md.generation);
            // What a load would refuse (another credential, a replayed older incarnation) is
            // not authentic news about the peer.
            self.shared
                .bindings
                .check(self.name(), &md.name, p, new_incarnation, usize::MAX)
                .ok()?;
        }
        Some((md.name, Some(md.generation)))
    }

    /// The process of a loaded peer as this agent watches it (`Some(None)`: loaded, but not a
    /// process of this host); `None` when not loaded.
    pub(crate) fn remote_process(
        &self,
        remote: &str,
    ) -> Option<Option<crate::liveness::ProcessId>> {
        self.shared
            .remotes
            .lock()
            .get(remote)
            .map(|p| p.process.as_ref().map(|w| *w.id()))
    }

    /// The generation of a loaded peer.
    pub fn remote_generation(&self, remote: &str) -> Option<u64> {
        self.shared.remotes.lock().get(remote).map(|p| p.generation)
    }

    /// Hellos refused, and notifications not attributed, because they were not signed with
    /// the key that holds their sender's name (without a credential: the key a loaded peer's
    /// metadata announced, or a name's first signed hello; see `docs/security.md`).
    pub fn refused_hellos(&self) -> u64 {
        self.shared.hello_keys.refused()
    }

    /// Names of loaded peers.
    pub fn remotes(&self) -> Vec<String> {
        let mut v: Vec<String> = self.shared.remotes.lock().keys().cloned().collect();
        v.sort();
        v
    }
}
