//! The exchange's lease: every published key is attached to it, a background task keeps it
//! alive, and when it is lost (etcd was unreachable for longer than the TTL) the next publish
//! grants a new one.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::EtcdError;
use super::pb;
use super::rpc::Rpc;
use crate::error::Result;

/// The current lease id; 0 when there is none (lost or not granted yet).
#[derive(Debug, Default)]
pub(crate) struct LeaseState {
    id: AtomicI64,
    /// Serialises grants so concurrent publishers share one new lease.
    grant: tokio::sync::Mutex<()>,
}

impl LeaseState {
    pub(super) fn id(&self) -> i64 {
        self.id.load(Ordering::SeqCst)
    }

    /// Forgets `id` if it is still the current lease (a stale report cannot drop a new one).
    pub(super) fn lost(&self, id: i64) {
        if self
            .id
            .compare_exchange(id, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            tracing::warn!(
                lease = id,
                "etcd lease lost; published keys are gone until the next publish"
            );
        }
    }

    /// The current lease, granting one first when there is none.
    pub(super) async fn ensure(&self, rpc: &Rpc, ttl_secs: i64, deadline: Instant) -> Result<i64> {
        let _g = self.grant.lock().await;
        let id = self.id();
        if id != 0 {
            return Ok(id);
        }
        let resp = rpc
            .call("granting a lease", deadline, |c| async move {
                c.lease_grant(ttl_secs).await
            })
            .await?;
        self.id.store(resp.id, Ordering::SeqCst);
        tracing::debug!(agent = %rpc.agent, lease = resp.id, ttl = resp.ttl, "etcd lease granted");
        Ok(resp.id)
    }

    /// Takes the lease away for revoking; later publishes grant a new one.
    pub(super) fn take(&self) -> i64 {
        self.id.swap(0, Ordering::SeqCst)
    }
}

/// Puts `value` under `key` attached to the current lease, granting a new lease once when
/// the current one turns out to be gone.
pub(crate) async fn put_leased(
    rpc: &Rpc,
    lease: &LeaseState,
    ttl_secs: i64,
    key: String,
    value: Vec<u8>,
    deadline: Instant,
) -> Result<()> {
    let mut regranted = false;
    loop {
        let id = lease.ensure(rpc, ttl_secs, deadline).await?;
        let r = rpc
            .call("publishing metadata", deadline, |c| {
                let req = pb::PutRequest {
                    key: key.clone().into_bytes(),
                    value: value.clone(),
                    lease: id,
                };
                async move { c.put(req).await }
            })
            .await;
        match r {
            Err(crate::Error::Backend {
                source: Some(src), ..
            }) if !regranted
                && src
                    .downcast_ref::<EtcdError>()
                    .is_some_and(EtcdError::is_lease_gone) =>
            {
                lease.lost(id);
                regranted = true;
            }
            r => return r.map(|_| ()),
        }
    }
}

/// Keeps the current lease alive every third of its TTL until the task is aborted. A
/// keep-alive answered with TTL 0 means the lease expired: it is dropped and the next publish
/// grants a new one. Connection errors are retried with backoff.
pub(crate) async fn keep_alive(rpc: Rpc, lease: Arc<LeaseState>, ttl_secs: i64) {
    let ttl = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(1).max(1));
    let interval = ttl / 3;
    let mut backoff = Duration::from_millis(100);
    loop {
        let id = lease.id();
        if id == 0 {
            tokio::time::sleep(interval).await;
            continue;
        }
        let started =
            tokio::time::timeout(rpc.request_timeout, rpc.client.lease_keep_alive(id)).await;
        let mut keeper = match started {
            Ok(Ok(k)) => k,
            Ok(Err(e)) if e.is_lease_gone() => {
                lease.lost(id);
                continue;
            }
            Ok(Err(e)) => {
                tracing::debug!(agent = %rpc.agent, error = %e, "etcd keep-alive stream failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(interval.max(Duration::from_millis(100)));
                continue;
            }
            Err(_) => continue,
        };
        backoff = Duration::from_millis(100);
        // The stream's first answer was read by `lease_keep_alive`: the lease is fresh now.
        loop {
            tokio::time::sleep(interval).await;
            if lease.id() != id {
                break;
            }
            let answer = tokio::time::timeout(rpc.request_timeout, keeper.keep_alive()).await;
            match answer {
                Ok(Ok(ttl)) if ttl > 0 => {}
                Ok(Ok(_)) => {
                    lease.lost(id);
                    break;
                }
                Ok(Err(_)) | Err(_) => {
                    tracing::debug!(agent = %rpc.agent, lease = id, "etcd keep-alive interrupted; reconnecting");
                    break;
                }
            }
        }
    }
}
