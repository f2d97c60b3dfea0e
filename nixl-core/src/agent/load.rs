//! Loading a peer's metadata: the plan (every check before anything changes), applying it,
//! and undoing a load that failed halfway.

#![allow(unused_imports)]
use super::remote::*;
use crate::agent::registration::{RegInner, Registration};
use crate::agent::{Agent, BackendSlot};
use crate::auth::Proof;
use crate::backend::BackendMd;
use crate::codec::{AgentMetadata, BackendEntry, RegionEntry};
use crate::desc::XferDescList;
use crate::error::{Error, Op, Result};
use crate::index::RegionIndex;
use crate::mem::{MemKind, RegionDesc};
use crate::nixl_wire::Wire;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A region's public bytes per local backend, while loading.
pub(super) type PerBackend<'a> = Vec<(Arc<BackendSlot>, &'a [u8])>;

/// What loading one blob will do, found before anything changes.
pub(super) struct LoadPlan<'a> {
    /// The blob's backends mapped onto ours (`None`: we have no such remote-capable backend).
    pub(super) slots: Vec<Option<Arc<BackendSlot>>>,
    /// The loaded incarnation of this peer, if any.
    pub(super) existing: Option<Arc<RemotePeer>>,
    /// Whether the blob is that same incarnation (an append).
    pub(super) same_gen: bool,
    /// Regions not loaded yet, grouped per region (one entry per backend that has it), with
    /// their labels.
    pub(super) new_regions: Vec<(RegionDesc, &'a str, PerBackend<'a>)>,
}

impl<'a> LoadPlan<'a> {
    /// Checks the blob against what is loaded, its authentication against the name's
    /// binding, and the agent's limits, without changing anything: O(regions).
    pub(super) fn validate(
        agent: &Agent,
        md: &'a AgentMetadata,
        wire: Wire,
        proof: Option<&Proof>,
    ) -> Result<Self> {
        let me = agent.name();
        let limits = &agent.shared.config.limits;
        let slots = map_slots(agent, md, wire)?;
        let (existing, loaded) = {
            let remotes = agent.shared.remotes.lock();
            (remotes.get(&md.name).cloned(), remotes.len())
        };
        let same = existing
            .as_ref()
            .filter(|p| p.generation == md.generation && p.wire == wire);
        check_owner(me, md, existing.as_deref())?;
        super::here::check(me, agent.shared.process.as_ref(), md)?;
        if same.is_none() {
            let holder_live = existing
                .as_ref()
                .and_then(|p| p.process.as_ref())
                .is_some_and(|w| !w.exited());
            agent.shared.successions.check(
                me,
                md,
                holder_live,
                agent.shared.config.limits.succession_hold,
            )?;
        }
        if let Some(proof) = proof {
            check_proof(agent, md, proof, same.map(|p| &**p))?;
        }
        if existing.is_none() && loaded >= limits.max_peers {
            return Err(Error::limit(
                me,
                Op::LoadMetadata,
                "loaded peers",
                limits.max_peers,
            ));
        }
        check_conn_unchanged(me, md, &slots, same.map(|p| &**p))?;
        check_hello_key_unchanged(me, md, same.map(|p| &**p))?;
        let new_regions = group_regions(me, md, &slots, same.map(|p| &**p))?;
        let have: usize = same.map_or(0, |p| p.regions.lock().len());
        if have.saturating_add(new_regions.len()) > limits.max_regions_per_peer {
            return Err(Error::limit(
                me,
                Op::LoadMetadata,
                format!(
                    "regions of {} ({have} loaded + {} new)",
                    md.name,
                    new_regions.len()
                ),
                limits.max_regions_per_peer,
            ));
        }
        Ok(LoadPlan {
            slots,
            same_gen: same.is_some(),
            existing,
            new_regions,
        })
    }

    /// Connects the backends and loads the regions. On error, everything this call did is
    /// undone (see [`LoadGuard`]) and the peer's loaded state is as before (or, for a new
    /// incarnation, not loaded).
    pub(super) fn apply(
        &self,
        agent: &Agent,
        md: &AgentMetadata,
        wire: Wire,
        proof: Option<&Proof>,
    ) -> Result<()> {
        let process = match (self.same_gen, &md.process) {
            (false, Some(id)) => watch_process(agent, md, id)?,
            _ => None,
        };
        let peer = match (&self.existing, self.same_gen) {
            (Some(p), true) => p.clone(),
            _ => Arc::new(RemotePeer {
                process,
                name: md.name.clone(),
                generation: md.generation,
                wire,
                valid: AtomicBool::new(true),
                conn: Mutex::new(BTreeMap::new()),
                regions: Mutex::new(RegionIndex::default()),
                owner_commit: proof.map(|p| p.owner_commit),
                verifies_integrity: md.verifies_integrity,
                hello_key: md.hello_key,
            }),
        };
        if let (Some(old), false) = (&self.existing, self.same_gen) {
            // A restarted peer: fence the old incarnation first so backends can reconnect.
            let mut remotes = agent.shared.remotes.lock();
            old.valid.store(false, Ordering::SeqCst);
            remotes.remove(&md.name);
            drop(remotes);
            agent.retire_peer(old);
        }
        let mut guard = LoadGuard {
            agent,
            peer: &peer,
            connected: Vec::new(),
        };
        if md.has_conn_info {
            self.connect(&mut guard, md, wire)?;
        }
        // Regions are loaded into a private index and published in one step, so transfers
        // to this peer never wait for a long load.
        let mut loaded = self.load_regions(agent, &peer, md, wire)?;
        peer.regions.lock().append(&mut loaded);
        if !self.same_gen {
            agent
                .shared
                .remotes
                .lock()
                .insert(md.name.clone(), peer.clone());
            agent
                .shared
                .successions
                .loaded(md, agent.shared.config.limits.max_known_names);
            // From now on hellos under the name count only when signed with its key.
            agent.shared.hello_keys.loaded(
                &md.name,
                md.hello_key,
                peer.process.as_ref().map(|w| *w.id()),
            );
        }
        if let Some(p) = proof {
            agent.shared.bindings.record(&md.name, p);
        }
        guard.connected.clear();
        Ok(())
    }

    /// Connects every backend of the blob the peer is not connected on yet, recording each
    /// in `guard` (undone if the load fails later).
    fn connect(&self, guard: &mut LoadGuard<'_>, md: &AgentMetadata, wire: Wire) -> Result<()> {
        let peer = guard.peer;
        for (e, slot) in md.backends.iter().zip(&self.slots) {
            let Some(slot) = slot else { continue };
            if peer.is_connected(slot.id) || (wire == Wire::Nixl && e.conn_info.is_empty()) {
                continue;
            }
            connect_slot(
                guard.agent.name(),
                slot,
                wire,
                &md.name,
                &e.conn_info,
                peer.process.as_ref(),
            )?;
            peer.conn.lock().insert(slot.id, e.conn_info.clone());
            guard.connected.push(slot.clone());
        }
        Ok(())
    }

    /// Loads the new regions into a private index, on every backend the peer is connected
    /// on.
    fn load_regions(
        &self,
        agent: &Agent,
        peer: &RemotePeer,
        md: &AgentMetadata,
        wire: Wire,
    ) -> Result<RegionIndex<Arc<RemoteRegion>>> {
        let mut loaded = RegionIndex::default();
        for (desc, label, per) in &self.new_regions {
            let mut mds = Vec::with_capacity(per.len());
            for (slot, public) in per {
                if !peer.is_connected(slot.id) {
                    continue;
                }
                let m = load_slot(agent.name(), slot, wire, &md.name, desc, public)?;
                mds.push((slot.clone(), m, public.to_vec()));
            }
            if mds.is_empty() {
                continue;
            }
            let key = (desc.kind, desc.dev_id, desc.addr, agent.shared.next_id());
            loaded.insert(
                key,
                desc.len,
                Arc::new(RemoteRegion {
                    desc: desc.clone(),
                    label: (*label).to_owned(),
                    mds,
                }),
            );
        }
        Ok(loaded)
    }
}

/// Binds the process a new incarnation's metadata names (a pidfd of a live thread-group
/// leader whose start time matches): gone is `RemoteDisconnect`, not a process `InvalidParam`.
fn watch_process(
    agent: &Agent,
    md: &AgentMetadata,
    id: &crate::liveness::ProcessId,
) -> Result<Option<crate::liveness::PeerProcess>> {
    match crate::liveness::ProcessWatch::open(id, agent.shared.process.as_ref()) {
        Ok(w) => Ok(w.map(crate::liveness::PeerProcess::from_watch)),
        Err(crate::liveness::Refused::Exited(why)) => Err(Error::disconnected(
            agent.name(),
            &md.name,
            Op::LoadMetadata,
            why,
        )),
        Err(crate::liveness::Refused::Invalid(why)) => Err(Error::invalid(
            agent.name(),
            Op::LoadMetadata,
            format!("metadata of {}: {why}", md.name),
        )),
    }
}

/// The blob's backends mapped onto ours (ones we do not have, or that cannot speak the
/// blob's wire, are ignored). Over NIXL's wire, connection info none of ours can use is
/// refused, as NIXL does (`NIXL_ERR_BACKEND`).
fn map_slots(
    agent: &Agent,
    md: &AgentMetadata,
    wire: Wire,
) -> Result<Vec<Option<Arc<BackendSlot>>>> {
    let backends = agent.shared.backends();
    let slots: Vec<Option<Arc<BackendSlot>>> = md
        .backends
        .iter()
        .map(|e| {
            backends
                .iter()
                .find(|b| {
                    b.name == e.name
                        && b.caps.remote
                        && (wire == Wire::Native || b.backend.nixl_wire().is_some())
                })
                .cloned()
        })
        .collect();
    let usable = md
        .backends
        .iter()
        .zip(&slots)
        .any(|(e, s)| s.is_some() && !e.conn_info.is_empty());
    if wire == Wire::Nixl && md.has_conn_info && !usable {
        return Err(Error::not_supported(
            agent.name(),
            Op::LoadMetadata,
            format!("none of {}'s backends speaks NIXL's wire here", md.name),
        ));
    }
    Ok(slots)
}

/// A name stays with the process that published it until that process exits: metadata
/// naming another process (or none) under the name of a live same-host peer is a live
/// impersonator, not a restart (a restart's old process is gone).
fn check_owner(me: &str, md: &AgentMetadata, existing: Option<&RemotePeer>) -> Result<()> {
    let Some(owner) = existing.and_then(|p| p.process.as_ref()) else {
        return Ok(());
    };
    let same_process = md
        .process
        .as_ref()
        .is_some_and(|c| c.pid == owner.id().pid && c.start_time == owner.id().start_time);
    if same_process || owner.exited() {
        return Ok(());
    }
    Err(Error::not_allowed(
        me,
        Op::LoadMetadata,
        format!(
            "{} belongs to process {} of this host, which is still running: a name stays with \
             its process until it exits",
            md.name,
            owner.pid()
        ),
    ))
}

/// The proof must match the name's binding; an append to the loaded generation must come
/// from its owner.
fn check_proof(
    agent: &Agent,
    md: &AgentMetadata,
    proof: &Proof,
    same: Option<&RemotePeer>,
) -> Result<()> {
    let me = agent.name();
    agent.shared.bindings.check(
        me,
        &md.name,
        proof,
        same.is_none(),
        agent.shared.config.limits.max_known_names,
    )?;
    match same {
        Some(peer) if peer.owner_commit != Some(proof.owner_commit) => Err(Error::not_allowed(
            me,
            Op::LoadMetadata,
            format!(
                "metadata of {} claims its loaded generation but another owner",
                md.name
            ),
        )),
        _ => Ok(()),
    }
}

/// An append to a loaded incarnation keeps its hello key (a key is the incarnation's: an
/// append naming another would hand the name to whoever holds that one).
fn check_hello_key_unchanged(
    me: &str,
    md: &AgentMetadata,
    same: Option<&RemotePeer>,
) -> Result<()> {
    match (same, &md.hello_key) {
        (Some(peer), Some(k)) if peer.hello_key.as_ref() != Some(k) => Err(Error::mismatch(
            me,
            Op::LoadMetadata,
            format!(
                "metadata of {} claims its loaded generation with another hello key",
                md.name
            ),
        )),
        _ => Ok(()),
    }
}

/// An append keeps the connection info it was loaded with; a new incarnation must bring it.
fn check_conn_unchanged(
    me: &str,
    md: &AgentMetadata,
    slots: &[Option<Arc<BackendSlot>>],
    same: Option<&RemotePeer>,
) -> Result<()> {
    match same {
        Some(peer) if md.has_conn_info => {
            let conn = peer.conn.lock();
            for (e, slot) in md.backends.iter().zip(slots) {
                let old = slot.as_ref().and_then(|s| conn.get(&s.id));
                if old.is_some_and(|old| *old != e.conn_info) {
                    return Err(Error::mismatch(
                        me,
                        Op::LoadMetadata,
                        format!(
                            "connection info of {} for backend {} changed",
                            md.name, e.name
                        ),
                    ));
                }
            }
            Ok(())
        }
        None if !md.has_conn_info => Err(Error::not_found(
            me,
            Op::LoadMetadata,
            format!(
                "connection info of {} (load its full metadata first)",
                md.name
            ),
        )),
        _ => Ok(()),
    }
}

/// The blob's regions not loaded yet, grouped per region (one `RemoteRegion` holds every
/// backend's metadata); a loaded region whose metadata changed is refused.
fn group_regions<'a>(
    me: &str,
    md: &'a AgentMetadata,
    slots: &[Option<Arc<BackendSlot>>],
    same: Option<&RemotePeer>,
) -> Result<Vec<(RegionDesc, &'a str, PerBackend<'a>)>> {
    let mut new_regions: Vec<(RegionDesc, &'a str, PerBackend<'a>)> = Vec::new();
    let mut by_desc: HashMap<&RegionDesc, usize> = HashMap::new();
    for r in &md.regions {
        let Some(slot) = &slots[r.backend] else {
            continue;
        };
        let loaded = same
            .and_then(|peer| peer.find(r.desc.kind, r.desc.dev_id, r.desc.addr, r.desc.len))
            .filter(|old| old.desc == r.desc);
        if let Some(old) = loaded {
            let changed = old
                .mds
                .iter()
                .find(|(s, _, _)| s.id == slot.id)
                .is_some_and(|(_, _, public)| *public != r.public);
            if changed {
                return Err(Error::mismatch(
                    me,
                    Op::LoadMetadata,
                    format!("metadata of a region of {} changed", md.name),
                ));
            }
            continue;
        }
        match by_desc.get(&r.desc) {
            Some(&i) => new_regions[i].2.push((slot.clone(), &r.public)),
            None => {
                by_desc.insert(&r.desc, new_regions.len());
                new_regions.push((r.desc.clone(), &r.label, vec![(slot.clone(), &r.public)]));
            }
        }
    }
    Ok(new_regions)
}

/// Undoes a failed load's connections (regions not yet published are dropped with their
/// index, which unloads them).
pub(super) struct LoadGuard<'a> {
    agent: &'a Agent,
    peer: &'a Arc<RemotePeer>,
    connected: Vec<Arc<BackendSlot>>,
}

impl Drop for LoadGuard<'_> {
    fn drop(&mut self) {
        for slot in self.connected.drain(..) {
            self.peer.conn.lock().remove(&slot.id);
            if let Err(e) = slot.disconnect(&self.peer.name) {
                tracing::warn!(agent = %self.agent.name(), remote = %self.peer.name, error = %e, "rollback disconnect failed");
            }
        }
    }
}

pub(super) fn connect_slot(
    me: &str,
    slot: &BackendSlot,
    wire: Wire,
    remote: &str,
    info: &[u8],
    process: Option<&crate::liveness::PeerProcess>,
) -> Result<()> {
    match (wire, slot.backend.nixl_wire()) {
        (Wire::Native, _) => slot.connect_peer(remote, info, process),
        (Wire::Nixl, Some(n)) => n.nixl_connect(remote, info),
        (Wire::Nixl, None) => Err(Error::not_supported(
            me,
            Op::LoadMetadata,
            format!("backend {} does not speak NIXL's wire", slot.name),
        )),
    }
}

pub(super) fn load_slot(
    me: &str,
    slot: &BackendSlot,
    wire: Wire,
    remote: &str,
    desc: &RegionDesc,
    public: &[u8],
) -> Result<BackendMd> {
    match (wire, slot.backend.nixl_wire()) {
        (Wire::Native, _) => slot.load_remote(me, remote, desc, public),
        (Wire::Nixl, Some(n)) => n.nixl_load_remote(remote, desc, public),
        (Wire::Nixl, None) => Err(Error::not_supported(
            me,
            Op::LoadMetadata,
            format!("backend {} does not speak NIXL's wire", slot.name),
        )),
    }
}
