//! [`EtcdExchange`]: one agent's blocking handle on etcd.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::prefix_end;
use super::config::{EtcdConfig, Resolved, DEFAULT_LABEL};
use super::keepalive::{keep_alive, put_leased, LeaseState};
use super::pb;
use super::rpc::{block_on, Rpc};
use super::watch::{self, PeerTable};
use crate::agent::remote::MetadataSelection;
use crate::agent::Agent;
use crate::error::{Error, Op, Result};
use crate::exchange::published::{
    check_fetch, check_holder, check_label, check_own, full_metadata, partial_metadata,
};

/// How a read is served.
///
/// A serializable read is answered by whichever member the client reaches, without a
/// round of consensus, and may lag the leader. That is safe for a first read: a key missed
/// is caught by the watch that starts after the read's revision, and a key already deleted
/// has its deletion (a later revision) delivered by the peer watch. The re-check after a
/// race with the peer watch must see the latest state, so it is linearizable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    Serializable,
    Linearizable,
}

/// Keys per page of a range read.
const PAGE: i64 = 256;

/// Publishes one agent's metadata to etcd and loads peers' from it.
///
/// Keys are `{namespace}/{agent}/{label}`; full metadata uses [`DEFAULT_LABEL`]. Every key
/// is attached to the exchange's lease, kept alive in the background: when the process dies
/// its keys vanish after the lease TTL, and every exchange that loaded it invalidates it.
/// Dropping the exchange revokes the lease at once (keys vanish now).
///
/// Every call is blocking with a deadline: etcd that is down, frozen or answers garbage gives
/// a typed error ([`Error::Backend`] with the etcd error as `source`, [`Error::TimedOut`],
/// [`Error::Decode`]) after at most [`EtcdConfig::retries`] retries.
pub struct EtcdExchange {
    agent: Agent,
    cfg: Resolved,
    rpc: Rpc,
    lease: Arc<LeaseState>,
    peers: Arc<PeerTable>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for EtcdExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdExchange")
            .field("agent", &self.agent.name())
            .field("endpoints", &self.cfg.endpoints)
            .field("namespace", &self.cfg.layout.namespace())
            .field("lease", &self.lease.id())
            .finish()
    }
}

impl EtcdExchange {
    /// Connects `agent` to etcd: checks the server answers, grants the lease and starts the
    /// keep-alive and the peer watch. Endpoints and namespace not set in `config` come from
    /// [`ENV_ENDPOINTS`](super::ENV_ENDPOINTS) and [`ENV_NAMESPACE`](super::ENV_NAMESPACE).
    pub fn new(agent: &Agent, config: &EtcdConfig) -> Result<Self> {
        let cfg = config.resolve(agent.name(), |k| std::env::var(k).ok())?;
        let me = agent.name().to_owned();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nixl-etcd")
            .enable_all()
            .build()
            .map_err(|e| Error::io(&me, Op::Exchange, e))?;
        let lease = Arc::new(LeaseState::default());
        let (rpc, revision) = block_on(&me, &rt, async {
            let rpc = Rpc::connect(&me, &cfg.endpoints, cfg.request_timeout, cfg.retries)?;
            let deadline = rpc.default_deadline();
            let key = cfg.layout.all_prefix().into_bytes();
            let probe = pb::RangeRequest {
                range_end: prefix_end(&key),
                key,
                count_only: true,
                ..Default::default()
            };
            let probe = rpc
                .call("reading the namespace", deadline, |c| {
                    let req = probe.clone();
                    async move { c.range(req).await }
                })
                .await?;
            lease.ensure(&rpc, cfg.ttl_secs, deadline).await?;
            Ok((rpc, probe.header.map(|h| h.revision).unwrap_or(0)))
        })?;
        let peers = Arc::new(PeerTable::starting_after(revision));
        let tasks = vec![
            rt.spawn(keep_alive(rpc.clone(), lease.clone(), cfg.ttl_secs)),
            rt.spawn(watch::run(
                rpc.clone(),
                cfg.layout.clone(),
                me.clone(),
                Arc::downgrade(&agent.shared),
                peers.clone(),
                revision + 1,
            )),
        ];
        tracing::debug!(agent = %me, endpoints = ?cfg.endpoints, namespace = cfg.layout.namespace(), "etcd exchange connected");
        Ok(EtcdExchange {
            agent: agent.clone(),
            cfg,
            rpc,
            lease,
            peers,
            tasks,
            rt: Some(rt),
        })
    }

    /// The agent this exchange publishes.
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The key namespace in use.
    pub fn namespace(&self) -> &str {
        self.cfg.layout.namespace()
    }

    /// The key `agent`'s metadata under `label` lives at.
    pub fn key(&self, agent: &str, label: &str) -> String {
        self.cfg.layout.key(agent, label)
    }

    /// The current lease id (`None` after it was lost and before the next publish).
    pub fn lease_id(&self) -> Option<i64> {
        Some(self.lease.id()).filter(|&id| id != 0)
    }

    /// Peers loaded through this exchange and still watched, sorted.
    pub fn watched_peers(&self) -> Vec<String> {
        self.peers.names()
    }

    fn run<T>(&self, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        match &self.rt {
            Some(rt) => block_on(self.agent.name(), rt, fut),
            None => Err(Error::not_allowed(
                self.agent.name(),
                Op::Exchange,
                "the etcd exchange is closed",
            )),
        }
    }

    /// Publishes the agent's full metadata under [`DEFAULT_LABEL`] (NIXL's `sendLocalMD`).
    #[doc(alias = "sendLocalMD")]
    pub fn publish(&self) -> Result<()> {
        if self.cfg.nixl {
            // NIXL announces an agent with an empty value at its prefix, then the blob.
            let announce = self.cfg.layout.agent_prefix(self.agent.name());
            self.run(put_leased(
                &self.rpc,
                &self.lease,
                self.cfg.ttl_secs,
                announce,
                Vec::new(),
                self.rpc.default_deadline(),
            ))?;
        }
        self.publish_bytes(DEFAULT_LABEL, &full_metadata(&self.agent, self.cfg.nixl)?)
    }

    /// Publishes partial metadata under `label` (NIXL's `sendLocalPartialMD`).
    #[doc(alias = "sendLocalPartialMD")]
    pub fn publish_partial(&self, label: &str, selection: &MetadataSelection<'_>) -> Result<()> {
        check_label(self.agent.name(), label)?;
        self.publish_bytes(
            label,
            &partial_metadata(&self.agent, selection, self.cfg.nixl)?,
        )
    }

    /// Publishes metadata bytes under `label`. They must be this agent's own current
    /// metadata ([`Error::Decode`] / [`Error::Mismatch`] otherwise, nothing published).
    pub fn publish_bytes(&self, label: &str, metadata: &[u8]) -> Result<()> {
        let me = self.agent.name();
        check_label(me, label)?;
        check_own(&self.agent, metadata)?;
        let key = self.cfg.layout.key(me, label);
        self.run(put_leased(
            &self.rpc,
            &self.lease,
            self.cfg.ttl_secs,
            key,
            metadata.to_vec(),
            self.rpc.default_deadline(),
        ))
    }

    /// Fetches and loads `remote`'s full metadata (NIXL's `fetchRemoteMD`), waiting up to
    /// `wait` for it to be published. See [`EtcdExchange::fetch_label`].
    #[doc(alias = "fetchRemoteMD")]
    pub fn fetch(&self, remote: &str, wait: Duration) -> Result<String> {
        self.fetch_label(remote, DEFAULT_LABEL, wait)
    }

    /// Fetches `remote`'s metadata published under `label`, waiting up to `wait` for the key
    /// to appear (a watch, not polling), loads it and watches the key from then on. Returns
    /// the loaded agent's name.
    ///
    /// Errors: [`Error::NotFound`] when the key did not appear within `wait`;
    /// [`Error::Decode`] for bytes that are not metadata and [`Error::Mismatch`] for another
    /// agent's (nothing loaded either way); etcd errors as in [`EtcdExchange`].
    pub fn fetch_label(&self, remote: &str, label: &str, wait: Duration) -> Result<String> {
        check_fetch(&self.agent, remote, label)?;
        let key = self.cfg.layout.key(remote, label);
        let (value, revision) = self.run(self.read_or_wait(&key, wait, Read::Serializable))?;
        self.load_watched(remote, label, &value, revision)
    }

    /// Fetches and loads every agent's metadata published under `label` in the namespace
    /// (except this agent's): one paged range read at a single revision instead of one
    /// read per peer. Returns each agent found with the outcome of loading it (a bad entry
    /// does not stop the others); the outer error is etcd's.
    pub fn fetch_all(&self, label: &str) -> Result<Vec<(String, Result<String>)>> {
        let me = self.agent.name();
        check_label(me, label)?;
        let (entries, revision) = self.run(self.read_all())?;
        Ok(entries
            .into_iter()
            .filter_map(|(key, value)| {
                let (agent, l) = self.cfg.layout.parse(&key)?;
                (l == label && agent != me).then(|| {
                    let r = self.load_watched(&agent, label, &value, revision);
                    (agent, r)
                })
            })
            .collect())
    }

    /// Reads every key of the namespace in pages of [`PAGE`] keys, all at one revision.
    async fn read_all(&self) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, i64)> {
        let prefix = self.cfg.layout.all_prefix();
        // The prefix ends with '/': its range ends just before '0', the next byte.
        let end = format!("{}0", &prefix[..prefix.len() - 1]);
        let mut from = prefix.into_bytes();
        let mut revision = 0;
        let mut out = Vec::new();
        loop {
            let resp = self
                .rpc
                .call(
                    "reading every agent's metadata",
                    self.rpc.default_deadline(),
                    |c| {
                        let req = pb::RangeRequest {
                            key: from.clone(),
                            range_end: end.clone().into_bytes(),
                            limit: PAGE,
                            revision,
                            ..Default::default()
                        };
                        async move { c.range(req).await }
                    },
                )
                .await?;
            if revision == 0 {
                revision = resp.header.as_ref().map(|h| h.revision).unwrap_or(0);
            }
            let more = resp.more;
            for kv in resp.kvs {
                out.push((kv.key, kv.value));
            }
            match out.last() {
                Some((last, _)) if more => {
                    from = last.clone();
                    from.push(0);
                }
                _ => return Ok((out, revision)),
            }
        }
    }

    /// Checks that `value` is `remote`'s metadata, loads it, and watches its key.
    fn load_watched(
        &self,
        remote: &str,
        label: &str,
        value: &[u8],
        revision: i64,
    ) -> Result<String> {
        let me = self.agent.name();
        let key = self.cfg.layout.key(remote, label);
        check_holder(&self.agent, remote, &key, value)?;
        let name = self.agent.load_remote_metadata(value)?;
        // The loaded incarnation (derived from connection info for a NIXL blob).
        let generation = self.agent.remote_generation(remote).unwrap_or(0);
        if self.peers.track(remote, generation, label, revision) {
            // The watch already went past our read: re-read so a deletion in between is seen.
            // When that read fails, the peer cannot be vouched for: fence it too.
            let check = self
                .run(self.read_or_wait(&key, Duration::ZERO, Read::Linearizable))
                .and_then(|(now, _)| match self.agent.authentic_identity(&now) {
                    Some((n, g)) if n == remote && g.is_none_or(|g| g == generation) => Ok(()),
                    _ => Err(Error::not_found(
                        me,
                        Op::Exchange,
                        format!("{key} changed while it was being loaded"),
                    )),
                });
            if let Err(e) = check {
                self.peers.untrack(remote, Some(generation));
                watch::invalidate(
                    &Arc::downgrade(&self.agent.shared),
                    remote,
                    generation,
                    "its key changed while it was loaded",
                );
                return Err(e);
            }
        }
        Ok(name)
    }

    /// Reads `key`; when absent, watches for it until `wait` passed. Returns the value and
    /// the revision it was read at.
    async fn read_or_wait(&self, key: &str, wait: Duration, read: Read) -> Result<(Vec<u8>, i64)> {
        let until = Instant::now() + wait;
        loop {
            let resp = self
                .rpc
                .call("reading metadata", self.rpc.default_deadline(), |c| {
                    let req = pb::RangeRequest {
                        key: key.as_bytes().to_vec(),
                        serializable: read == Read::Serializable,
                        ..Default::default()
                    };
                    async move { c.range(req).await }
                })
                .await?;
            let revision = resp.header.as_ref().map(|h| h.revision).unwrap_or(0);
            if let Some(kv) = resp.kvs.into_iter().next() {
                return Ok((kv.value, revision));
            }
            if Instant::now() >= until {
                return Err(Error::not_found(
                    self.agent.name(),
                    Op::Exchange,
                    format!("{key} (not published within {wait:?})"),
                ));
            }
            if let Some(found) = self.wait_for_put(key, revision + 1, until).await {
                return Ok(found);
            }
            // The watch broke early: pause, then read again (the loop ends at `until`).
            tokio::time::sleep(
                Duration::from_millis(50).min(until.saturating_duration_since(Instant::now())),
            )
            .await;
        }
    }

    /// Watches `key` from `revision` for a put until `until`.
    async fn wait_for_put(
        &self,
        key: &str,
        revision: i64,
        until: Instant,
    ) -> Option<(Vec<u8>, i64)> {
        let client = self.rpc.client.clone();
        let left = until.saturating_duration_since(Instant::now());
        let watch = async move {
            let mut stream = client
                .watch(pb::WatchCreateRequest {
                    key: key.as_bytes().to_vec(),
                    start_revision: revision,
                    ..Default::default()
                })
                .await
                .ok()?;
            loop {
                let resp = stream.message().await.ok()??;
                if resp.canceled {
                    return None;
                }
                for ev in resp.events {
                    if let (Ok(pb::EventType::Put), Some(kv)) =
                        (pb::EventType::try_from(ev.r#type), ev.kv)
                    {
                        return Some((kv.value, kv.mod_revision));
                    }
                }
            }
        };
        tokio::time::timeout(left, watch).await.ok().flatten()
    }

    /// Deletes every key of this agent (NIXL's `invalidateLocalMD`): peers that loaded it
    /// through etcd invalidate it. The lease stays; publish again to come back.
    #[doc(alias = "invalidateLocalMD")]
    pub fn invalidate_local(&self) -> Result<()> {
        let prefix = self.cfg.layout.agent_prefix(self.agent.name());
        self.run(
            self.rpc
                .call("deleting metadata", self.rpc.default_deadline(), |c| {
                    let req = pb::DeleteRangeRequest {
                        range_end: prefix_end(prefix.as_bytes()),
                        key: prefix.clone().into_bytes(),
                    };
                    async move { c.delete_range(req).await }
                }),
        )
        .map(|_| ())
    }

    /// Forgets a peer locally: invalidates it on the agent and stops watching it.
    pub fn forget(&self, remote: &str) -> Result<()> {
        self.peers.untrack(remote, None);
        self.agent.invalidate_remote_metadata(remote)
    }

    /// Revokes the lease (this agent's keys vanish at once), stops the background tasks and
    /// returns the revoke's error, if any. Dropping does the same and logs the error.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        let Some(rt) = self.rt.take() else {
            return Ok(());
        };
        let id = self.lease.take();
        let in_async = tokio::runtime::Handle::try_current().is_ok();
        let mut result = Ok(());
        if id != 0 && !in_async {
            let deadline = Instant::now() + self.cfg.request_timeout;
            result = rt
                .block_on(
                    self.rpc
                        .call("revoking the lease", deadline, |c| async move {
                            c.lease_revoke(id).await
                        }),
                )
                .map(|_| ());
        }
        if in_async {
            rt.shutdown_background();
        } else {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
        result
    }
}

impl Drop for EtcdExchange {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(agent = %self.agent.name(), error = %e, "revoking the etcd lease failed; keys vanish after the TTL");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn exchange_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<super::EtcdExchange>();
    }
}
