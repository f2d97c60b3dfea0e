//! Watching peers: one watch over the whole namespace per exchange. When a key this agent
//! loaded metadata from is deleted (the peer invalidated itself, or its lease expired after a
//! crash) or is replaced by another incarnation's metadata, the peer is invalidated, so
//! requests to it fail with typed errors instead of writing into memory that may be gone.

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::client::prefix_end;
use super::config::KeyLayout;
use super::pb;
use super::rpc::Rpc;
use crate::agent::{Agent, Shared};

/// A peer loaded through etcd: the incarnation loaded and the labels it came from.
#[derive(Debug)]
struct Watched {
    generation: u64,
    labels: BTreeSet<String>,
}

#[derive(Debug, Default)]
struct State {
    peers: HashMap<String, Watched>,
    /// The highest revision whose events were handled.
    handled: i64,
}

/// The peers this exchange watches.
#[derive(Debug, Default)]
pub(crate) struct PeerTable {
    state: Mutex<State>,
}

impl PeerTable {
    /// A table whose watch starts after `revision` (everything up to it is reflected in
    /// reads made from now on).
    pub(super) fn starting_after(revision: i64) -> Self {
        PeerTable {
            state: Mutex::new(State {
                peers: HashMap::new(),
                handled: revision,
            }),
        }
    }

    /// Starts watching `label` of `peer` at `generation`, loaded from a read at `revision`.
    /// Returns true when events newer than that read were already handled (before this
    /// registration), so the caller must re-read the key to not miss a deletion.
    pub(super) fn track(&self, peer: &str, generation: u64, label: &str, revision: i64) -> bool {
        let mut st = self.state.lock();
        let w = st.peers.entry(peer.to_owned()).or_insert_with(|| Watched {
            generation,
            labels: BTreeSet::new(),
        });
        if w.generation != generation {
            *w = Watched {
                generation,
                labels: BTreeSet::new(),
            };
        }
        w.labels.insert(label.to_owned());
        st.handled > revision
    }

    /// Stops watching `peer` if it is still at `generation` (any generation for `None`).
    pub(super) fn untrack(&self, peer: &str, generation: Option<u64>) {
        let mut st = self.state.lock();
        if st
            .peers
            .get(peer)
            .is_some_and(|w| generation.is_none_or(|g| g == w.generation))
        {
            st.peers.remove(peer);
        }
    }

    /// Names of watched peers, sorted.
    pub(super) fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.state.lock().peers.keys().cloned().collect();
        v.sort();
        v
    }

    pub(super) fn handled(&self) -> i64 {
        self.state.lock().handled
    }

    /// Applies one watch response and returns the `(peer, generation)`s to invalidate.
    /// `put_keeps(value, peer, generation)` says whether a put leaves the peer loaded.
    fn apply(
        &self,
        layout: &KeyLayout,
        me: &str,
        resp: &pb::WatchResponse,
        put_keeps: &dyn Fn(&[u8], &str, u64) -> bool,
    ) -> Vec<(String, u64)> {
        let mut st = self.state.lock();
        let mut gone = Vec::new();
        for ev in &resp.events {
            let Some(kv) = &ev.kv else { continue };
            st.handled = st.handled.max(kv.mod_revision);
            let Some((agent, label)) = layout.parse(&kv.key) else {
                continue;
            };
            if agent == me {
                continue;
            }
            let Some(w) = st.peers.get(&agent) else {
                continue;
            };
            if !w.labels.contains(&label) {
                continue;
            }
            let generation = w.generation;
            let still_valid = match pb::EventType::try_from(ev.r#type) {
                // Republished: the same incarnation (new registrations) keeps the peer;
                // another incarnation or bytes that do not decode fence it.
                Ok(pb::EventType::Put) => put_keeps(&kv.value, &agent, generation),
                // A deletion (or an event type newer than this client) fences it.
                _ => false,
            };
            if !still_valid {
                st.peers.remove(&agent);
                gone.push((agent, generation));
            }
        }
        if resp.events.is_empty() && !resp.created && !resp.canceled {
            // A progress notification: every event up to the header's revision was sent.
            // (Not a creation answer: its header is the current revision, but catch-up
            // events from the start revision may still follow.)
            if let Some(h) = &resp.header {
                st.handled = st.handled.max(h.revision);
            }
        }
        gone
    }
}

/// Whether a put of `value` under `peer`'s key leaves its loaded incarnation `generation`
/// loaded: the same incarnation republished does; another incarnation does not. Without
/// authentication, bytes that do not decode fence the peer too; with it, bytes that do not
/// verify under the name's credential are ignored (write access to etcd alone cannot
/// replace a peer; it can still delete its key, which fences it).
pub(crate) fn put_keeps(shared: &Weak<Shared>, value: &[u8], peer: &str, generation: u64) -> bool {
    let Some(shared) = shared.upgrade() else {
        return true;
    };
    let auth = shared.config.auth.is_some();
    let agent = Agent { shared };
    match agent.authentic_identity(value) {
        Some((name, g)) => name == peer && g.is_none_or(|g| g == generation),
        None => auth,
    }
}

/// Invalidates `(peer, generation)` on the agent, if it still exists.
pub(crate) fn invalidate(shared: &Weak<Shared>, peer: &str, generation: u64, why: &str) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let agent = Agent { shared };
    if agent
        .invalidate_remote_generation(peer, generation, crate::agent::remote::Invalidator::Local)
        .unwrap_or(false)
    {
        tracing::info!(agent = %agent.name(), remote = %peer, generation, why, "peer invalidated by etcd watch");
    }
}

/// Watches the namespace from `start_revision` until aborted, reconnecting after errors
/// from the last handled revision so no event is missed. When history was compacted past
/// that revision it re-reads every watched peer's keys instead.
pub(crate) async fn run(
    rpc: Rpc,
    layout: KeyLayout,
    me: String,
    shared: Weak<Shared>,
    table: Arc<PeerTable>,
    start_revision: i64,
) {
    let mut next = start_revision;
    let mut backoff = Duration::from_millis(100);
    loop {
        let key = layout.all_prefix().into_bytes();
        let create = pb::WatchCreateRequest {
            range_end: prefix_end(&key),
            key,
            start_revision: next,
            progress_notify: true,
        };
        let stream = tokio::time::timeout(rpc.request_timeout, rpc.client.watch(create)).await;
        let mut stream = match stream {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(agent = %me, error = %e, "etcd watch failed to start; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
            Err(_) => continue,
        };
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    backoff = Duration::from_millis(100);
                    if resp.compact_revision > 0 || resp.canceled {
                        tracing::warn!(agent = %me, compact = resp.compact_revision, reason = %resp.cancel_reason, "etcd watch canceled; re-reading watched peers");
                        match reconcile(&rpc, &layout, &shared, &table).await {
                            Some(resume) => next = resume,
                            None => {
                                tokio::time::sleep(backoff).await;
                                backoff = (backoff * 2).min(Duration::from_secs(2));
                            }
                        }
                        break;
                    }
                    let keeps = |v: &[u8], p: &str, g: u64| put_keeps(&shared, v, p, g);
                    for (peer, generation) in table.apply(&layout, &me, &resp, &keeps) {
                        invalidate(
                            &shared,
                            &peer,
                            generation,
                            "its metadata key was deleted or replaced",
                        );
                    }
                    next = table.handled() + 1;
                }
                Ok(None) | Err(_) => {
                    tracing::debug!(agent = %me, "etcd watch interrupted; resuming at revision {next}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    break;
                }
            }
        }
    }
}

/// Re-reads each watched peer's keys, invalidates peers whose keys are gone or changed
/// incarnation, and returns the revision to resume watching from.
async fn reconcile(
    rpc: &Rpc,
    layout: &KeyLayout,
    shared: &Weak<Shared>,
    table: &PeerTable,
) -> Option<i64> {
    let peers: Vec<(String, u64, Vec<String>)> = table
        .state
        .lock()
        .peers
        .iter()
        .map(|(n, w)| (n.clone(), w.generation, w.labels.iter().cloned().collect()))
        .collect();
    let mut revision = None;
    for (peer, generation, labels) in peers {
        for label in labels {
            let key = layout.key(&peer, &label);
            let resp = rpc
                .call("re-reading a watched key", rpc.default_deadline(), |c| {
                    let req = pb::RangeRequest {
                        key: key.clone().into_bytes(),
                        ..Default::default()
                    };
                    async move { c.range(req).await }
                })
                .await
                .ok()?;
            let rev = resp.header.as_ref().map(|h| h.revision).unwrap_or(0);
            revision = Some(revision.map_or(rev, |r: i64| r.min(rev)));
            let ok = resp
                .kvs
                .first()
                .is_some_and(|kv| put_keeps(shared, &kv.value, &peer, generation));
            if !ok {
                table.untrack(&peer, Some(generation));
                invalidate(
                    shared,
                    &peer,
                    generation,
                    "its metadata key vanished while the watch was down",
                );
                break;
            }
        }
    }
    let resume = match revision {
        Some(r) => r,
        None => rpc
            .call(
                "reading the revision",
                rpc.default_deadline(),
                |c| async move {
                    c.range(pb::RangeRequest {
                        key: vec![0],
                        ..Default::default()
                    })
                    .await
                },
            )
            .await
            .ok()?
            .header
            .map(|h| h.revision)?,
    };
    let mut st = table.state.lock();
    st.handled = st.handled.max(resume);
    Some(resume + 1)
}
