//! [`TcpStoreExchange`]: one agent's metadata published to and fetched from a c10d TCPStore
//! under NIXL 1.5's keys.

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::client::TcpStoreClient;
use super::config::TcpStoreConfig;
use crate::agent::remote::MetadataSelection;
use crate::agent::{Agent, Shared};
use crate::error::{Error, Op, Result};
use crate::exchange::published::{
    check_fetch, check_holder, check_label, check_own, full_metadata, partial_metadata,
    DEFAULT_LABEL,
};

/// NIXL's key namespace in a TCPStore.
pub const NAMESPACE: &str = "nixl/agents";
/// The destination part of a key for metadata shared with every agent (NIXL's
/// `nixl_null_agent`).
pub const NULL_AGENT: &str = "NULL_AGENT";
/// Keys per `MULTI_GET` of the peer watch.
const WATCH_BATCH: usize = 256;

/// A loaded peer the watch looks at: its key and a digest of the value loaded.
#[derive(Debug, Clone)]
struct Watched {
    key: String,
    digest: u64,
}

fn digest(v: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(v)
}

/// Publishes one agent's metadata to a c10d TCPStore (PyTorch's, or a
/// [`TcpStoreServer`](super::TcpStoreServer)) and loads peers' from it, under the keys NIXL
/// 1.5 uses (`/nixl/agents/{label}/{agent}/NULL_AGENT`), so NIXL agents started with
/// `NIXL_TCPSTORE_ENDPOINT` and nixl-rs agents find each other.
///
/// Every call is blocking with a deadline ([`TcpStoreConfig::op_timeout`] per store
/// operation; `wait` bounds a fetch). A store has no watch: a fetch polls until the key
/// appears, and a background thread re-reads the keys of the peers loaded through this
/// exchange every [`TcpStoreConfig::watch_interval`]: a key deleted (the peer invalidated
/// itself) invalidates the peer here, and a key holding new bytes (the peer published again,
/// or restarted) is loaded in its place. NIXL's own TCPStore backend does neither; its
/// agents learn of a nixl-rs agent's invalidation only when they fetch again.
pub struct TcpStoreExchange {
    agent: Agent,
    cfg: TcpStoreConfig,
    client: Mutex<TcpStoreClient>,
    published: Mutex<BTreeSet<String>>,
    watched: Arc<Mutex<HashMap<String, Watched>>>,
    stop: Arc<AtomicBool>,
    watch: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TcpStoreExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStoreExchange")
            .field("agent", &self.agent.name())
            .field("endpoint", &self.client.lock().endpoint())
            .finish()
    }
}

impl TcpStoreExchange {
    /// Connects `agent` to the store named by [`TcpStoreConfig::endpoint`], else by
    /// [`ENV_ENDPOINT`](super::ENV_ENDPOINT) (`NIXL_TCPSTORE_ENDPOINT`, as NIXL reads it),
    /// checks it speaks c10d, and starts the peer watch.
    pub fn new(agent: &Agent, config: &TcpStoreConfig) -> Result<Self> {
        let me = agent.name();
        let endpoint = config.resolve_endpoint(me, |k| std::env::var(k).ok())?;
        let client =
            TcpStoreClient::connect(&endpoint, me, config.op_timeout)?.max_value(config.max_value);
        let stop = Arc::new(AtomicBool::new(false));
        let watched = Arc::new(Mutex::new(HashMap::new()));
        let watch = match config.watch_interval {
            Some(every) => {
                let c = TcpStoreClient::connect(&endpoint, me, config.op_timeout)?
                    .max_value(config.max_value);
                let (w, s, a) = (watched.clone(), stop.clone(), Arc::downgrade(&agent.shared));
                Some(
                    std::thread::Builder::new()
                        .name(format!("nixl-tcpstore-{me}"))
                        .spawn(move || watch_loop(c, a, w, s, every))
                        .map_err(|e| Error::io(me, Op::Exchange, e))?,
                )
            }
            None => None,
        };
        Ok(TcpStoreExchange {
            agent: agent.clone(),
            cfg: config.clone(),
            client: Mutex::new(client),
            published: Mutex::new(BTreeSet::new()),
            watched,
            stop,
            watch,
        })
    }

    /// The agent this exchange publishes.
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The key (as torch users write it; the store holds it behind c10d's `/`) of
    /// `agent`'s metadata under `label`.
    pub fn key(&self, agent: &str, label: &str) -> String {
        format!("{NAMESPACE}/{label}/{agent}/{NULL_AGENT}")
    }

    /// Peers loaded through this exchange and still watched, sorted.
    pub fn watched_peers(&self) -> Vec<String> {
        let mut v: Vec<String> = self.watched.lock().keys().cloned().collect();
        v.sort();
        v
    }

    /// Publishes the agent's full metadata under [`DEFAULT_LABEL`] (NIXL's `sendLocalMD`).
    #[doc(alias = "sendLocalMD")]
    pub fn publish(&self) -> Result<()> {
        self.publish_bytes(
            DEFAULT_LABEL,
            &full_metadata(&self.agent, self.cfg.nixl_blobs)?,
        )
    }

    /// Publishes partial metadata under `label` (NIXL's `sendLocalPartialMD`).
    #[doc(alias = "sendLocalPartialMD")]
    pub fn publish_partial(&self, label: &str, selection: &MetadataSelection<'_>) -> Result<()> {
        check_label(self.agent.name(), label)?;
        let md = partial_metadata(&self.agent, selection, self.cfg.nixl_blobs)?;
        self.publish_bytes(label, &md)
    }

    /// Publishes metadata bytes under `label`. They must be this agent's own current
    /// metadata ([`Error::Decode`] / [`Error::Mismatch`] otherwise, nothing published);
    /// more than [`TcpStoreConfig::max_value`] bytes is [`Error::LimitExceeded`].
    pub fn publish_bytes(&self, label: &str, metadata: &[u8]) -> Result<()> {
        check_label(self.agent.name(), label)?;
        check_own(&self.agent, metadata)?;
        let key = self.key(self.agent.name(), label);
        self.client.lock().set(&key, metadata)?;
        self.published.lock().insert(key);
        Ok(())
    }

    /// Fetches and loads `remote`'s full metadata (NIXL's `fetchRemoteMD`), waiting up to
    /// `wait` for it to be published. See [`TcpStoreExchange::fetch_label`].
    #[doc(alias = "fetchRemoteMD")]
    pub fn fetch(&self, remote: &str, wait: Duration) -> Result<String> {
        self.fetch_label(remote, DEFAULT_LABEL, wait)
    }

    /// Fetches `remote`'s metadata published under `label`, polling the store until the key
    /// appears or `wait` passed, loads it and watches the key from then on. Returns the
    /// loaded agent's name.
    ///
    /// Errors: [`Error::NotFound`] when the key did not appear within `wait`;
    /// [`Error::Decode`] for bytes that are not metadata and [`Error::Mismatch`] for another
    /// agent's (nothing loaded either way); the store's errors as in [`TcpStoreClient`].
    pub fn fetch_label(&self, remote: &str, label: &str, wait: Duration) -> Result<String> {
        check_fetch(&self.agent, remote, label)?;
        let key = self.key(remote, label);
        let until = Instant::now() + wait;
        let mut pause = Duration::from_millis(2);
        let value = loop {
            if let Some(v) = self.client.lock().get(&key)? {
                break v;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::not_found(
                    self.agent.name(),
                    Op::Exchange,
                    format!("{key} (not published within {wait:?})"),
                ));
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(self.cfg.poll_interval);
        };
        check_holder(&self.agent, remote, &key, &value)?;
        let name = self.agent.load_remote_metadata(&value)?;
        self.watched.lock().insert(
            remote.to_owned(),
            Watched {
                key,
                digest: digest(&value),
            },
        );
        Ok(name)
    }

    /// Deletes every key this exchange published (NIXL's `invalidateLocalMD`): nixl-rs
    /// agents watching them invalidate this agent; NIXL agents no longer find it.
    #[doc(alias = "invalidateLocalMD")]
    pub fn invalidate_local(&self) -> Result<()> {
        let keys: Vec<String> = self.published.lock().iter().cloned().collect();
        let mut client = self.client.lock();
        for k in keys {
            client.delete(&k)?;
            self.published.lock().remove(&k);
        }
        Ok(())
    }

    /// Forgets a peer locally: invalidates it on the agent and stops watching it.
    pub fn forget(&self, remote: &str) -> Result<()> {
        self.watched.lock().remove(remote);
        self.agent.invalidate_remote_metadata(remote)
    }
}

impl Drop for TcpStoreExchange {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.watch.take() {
            if t.join().is_err() {
                tracing::error!(agent = %self.agent.name(), "TCPStore watch thread panicked");
            }
        }
    }
}

/// Re-reads the watched peers' keys every `every` until stopped or the agent is gone.
fn watch_loop(
    mut client: TcpStoreClient,
    agent: Weak<Shared>,
    watched: Arc<Mutex<HashMap<String, Watched>>>,
    stop: Arc<AtomicBool>,
    every: Duration,
) {
    let mut next = Instant::now() + every;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
            continue;
        }
        next = now + every;
        let Some(shared) = agent.upgrade() else {
            return;
        };
        let agent = Agent { shared };
        let peers: Vec<(String, Watched)> = watched
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for batch in peers.chunks(WATCH_BATCH) {
            let keys: Vec<&str> = batch.iter().map(|(_, w)| w.key.as_str()).collect();
            let values = match client.multi_get(&keys) {
                Ok(v) => v,
                Err(e) => {
                    // The store is unreachable: the peers stay as they are until it answers.
                    tracing::debug!(agent = %agent.name(), error = %e, "TCPStore watch read failed");
                    break;
                }
            };
            for ((remote, w), value) in batch.iter().zip(values) {
                reconcile(&agent, &watched, remote, w, &value);
            }
        }
    }
}

/// Applies what the store holds now for a watched peer.
fn reconcile(
    agent: &Agent,
    watched: &Mutex<HashMap<String, Watched>>,
    remote: &str,
    w: &Watched,
    value: &[u8],
) {
    if !value.is_empty() && digest(value) == w.digest {
        return;
    }
    let reloaded = (!value.is_empty())
        .then(|| {
            check_holder(agent, remote, &w.key, value)
                .and_then(|()| agent.load_remote_metadata(value))
        })
        .transpose();
    let mut g = watched.lock();
    // Forgotten, or fetched again, meanwhile: that state wins.
    if g.get(remote).is_none_or(|cur| cur.digest != w.digest) {
        return;
    }
    match reloaded {
        Ok(Some(_)) => {
            tracing::debug!(agent = %agent.name(), %remote, "TCPStore: peer published again; loaded");
            g.insert(
                remote.to_owned(),
                Watched {
                    key: w.key.clone(),
                    digest: digest(value),
                },
            );
        }
        Ok(None) | Err(_) => {
            g.remove(remote);
            drop(g);
            tracing::debug!(agent = %agent.name(), %remote, "TCPStore: peer's key deleted or unloadable; invalidating it");
            if let Err(e) = agent.invalidate_remote_metadata(remote) {
                tracing::debug!(agent = %agent.name(), %remote, error = %e, "TCPStore: invalidation");
            }
        }
    }
}
