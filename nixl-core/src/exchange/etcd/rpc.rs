//! The etcd client under a deadline: bounded retries, error mapping, and the blocking bridge
//! from the agent's synchronous API onto the exchange's own small tokio runtime.

use std::future::Future;
use std::time::{Duration, Instant};

use super::client::{Client, ConnectOptions, EtcdError};
use crate::error::{Error, Op, Result};

/// Longest pause between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// First pause between two attempts.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// Wraps an etcd error as [`Error::Backend`] with the native error as its source.
pub(crate) fn etcd_error(agent: &str, what: &str, e: EtcdError) -> Error {
    Error::Backend {
        agent: agent.to_owned(),
        backend: "etcd".to_owned(),
        op: Op::Exchange,
        message: format!("{what}: {e}"),
        source: Some(std::sync::Arc::new(e)),
    }
}

/// One etcd client with the request policy of one exchange.
#[derive(Clone)]
pub(crate) struct Rpc {
    pub agent: String,
    pub client: Client,
    pub request_timeout: Duration,
    pub retries: u32,
}

impl Rpc {
    /// Creates the client (connections are made lazily; a dead endpoint shows up as errors of
    /// the first requests). Must run inside the exchange's runtime.
    pub(super) fn connect(
        agent: &str,
        endpoints: &[String],
        request_timeout: Duration,
        retries: u32,
    ) -> Result<Self> {
        let opts = ConnectOptions {
            connect_timeout: request_timeout,
            // HTTP/2 pings find a server that stopped answering under a long-lived watch.
            keep_alive_interval: Duration::from_secs(2),
            keep_alive_timeout: request_timeout,
        };
        let client = Client::connect(endpoints, opts)
            .map_err(|e| etcd_error(agent, "connecting to etcd", e))?;
        Ok(Rpc {
            agent: agent.to_owned(),
            client,
            request_timeout,
            retries,
        })
    }

    /// Runs `f` with up to `retries` retries of transient failures, each attempt bounded by
    /// the request timeout and all of them by `deadline`. Returns the last error: a
    /// [`Error::TimedOut`] when the last attempt ran out of time, else the etcd error.
    pub(super) async fn call<T, F, Fut>(&self, what: &str, deadline: Instant, mut f: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, EtcdError>>,
    {
        let start = Instant::now();
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 0u32;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let budget = left.min(self.request_timeout);
            let err = match tokio::time::timeout(budget, f(self.client.clone())).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if e.is_transient() => etcd_error(&self.agent, what, e),
                Ok(Err(e)) => return Err(etcd_error(&self.agent, what, e)),
                Err(_) => Error::TimedOut {
                    agent: self.agent.clone(),
                    op: Op::Exchange,
                    elapsed: start.elapsed(),
                },
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if attempt >= self.retries || left <= backoff {
                return Err(err);
            }
            tracing::debug!(agent = %self.agent, attempt, error = %err, "etcd request failed; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            attempt += 1;
        }
    }

    /// The deadline of a call that may use every retry.
    pub(super) fn default_deadline(&self) -> Instant {
        let attempts = self.retries.saturating_add(1);
        let pauses = MAX_BACKOFF.saturating_mul(attempts);
        Instant::now() + self.request_timeout.saturating_mul(attempts) + pauses
    }
}

/// Runs a future to completion on `rt` from synchronous code. Refuses (rather than panics)
/// when called from inside an async runtime, where blocking would stall it.
pub(crate) fn block_on<T>(
    agent: &str,
    rt: &tokio::runtime::Runtime,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::not_allowed(
            agent,
            Op::Exchange,
            "blocking etcd call from inside an async runtime (use spawn_blocking)",
        ));
    }
    rt.block_on(fut)
}
