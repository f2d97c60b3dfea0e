//! How a [`TcpStoreExchange`](super::TcpStoreExchange) reaches its store.

use std::time::Duration;

use super::wire::MAX_VALUE;
use crate::error::{Error, Op, Result};

/// The environment variable naming the store (`host:port`), read when
/// [`TcpStoreConfig::endpoint`] is `None` (NIXL 1.5 reads the same one).
pub const ENV_ENDPOINT: &str = "NIXL_TCPSTORE_ENDPOINT";

/// How a [`TcpStoreExchange`](super::TcpStoreExchange) reaches a c10d TCPStore.
///
/// ```
/// use std::time::Duration;
/// use nixl_core::tcpstore::TcpStoreConfig;
///
/// let cfg = TcpStoreConfig::default()
///     .endpoint("127.0.0.1:29500")
///     .nixl_blobs(true) // NIXL agents read the store too
///     .op_timeout(Duration::from_secs(2));
/// assert_eq!(cfg.watch_interval, Some(Duration::from_secs(1)));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TcpStoreConfig {
    /// `host:port` of the store; `None` reads [`ENV_ENDPOINT`].
    pub endpoint: Option<String>,
    /// The deadline of each store operation, connecting again included (default 5 s, NIXL's
    /// `NIXL_TCPSTORE_OP_TIMEOUT_MS` default).
    pub op_timeout: Duration,
    /// Publish NIXL's metadata format (for NIXL agents reading the store) instead of
    /// nixl-rs's (default false). Fetching loads either.
    pub nixl_blobs: bool,
    /// How often the peers loaded through the exchange have their keys read again (`None`:
    /// never; default 1 s).
    pub watch_interval: Option<Duration>,
    /// The longest pause between two reads of a key a fetch waits for (default 100 ms; the
    /// first pauses are shorter).
    pub poll_interval: Duration,
    /// Largest metadata published or accepted (default 8 MiB, c10d's own bound).
    pub max_value: usize,
}

impl Default for TcpStoreConfig {
    fn default() -> Self {
        TcpStoreConfig {
            endpoint: None,
            op_timeout: Duration::from_secs(5),
            nixl_blobs: false,
            watch_interval: Some(Duration::from_secs(1)),
            poll_interval: Duration::from_millis(100),
            max_value: MAX_VALUE,
        }
    }
}

impl TcpStoreConfig {
    /// Sets [`TcpStoreConfig::endpoint`].
    pub fn endpoint(mut self, e: impl Into<String>) -> Self {
        self.endpoint = Some(e.into());
        self
    }

    /// Sets [`TcpStoreConfig::op_timeout`].
    pub fn op_timeout(mut self, d: Duration) -> Self {
        self.op_timeout = d;
        self
    }

    /// Sets [`TcpStoreConfig::nixl_blobs`].
    pub fn nixl_blobs(mut self, yes: bool) -> Self {
        self.nixl_blobs = yes;
        self
    }

    /// Sets [`TcpStoreConfig::watch_interval`].
    pub fn watch_interval(mut self, d: Option<Duration>) -> Self {
        self.watch_interval = d;
        self
    }

    /// Sets [`TcpStoreConfig::poll_interval`].
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }

    /// Sets [`TcpStoreConfig::max_value`].
    pub fn max_value(mut self, n: usize) -> Self {
        self.max_value = n;
        self
    }

    /// The endpoint to use, from the config or `env`; checks the intervals.
    pub(crate) fn resolve_endpoint(
        &self,
        agent: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<String> {
        if self.poll_interval.is_zero() || self.watch_interval.is_some_and(|d| d.is_zero()) {
            return Err(Error::invalid(
                agent,
                Op::Exchange,
                "poll_interval and watch_interval must be above zero",
            ));
        }
        self.endpoint
            .clone()
            .or_else(|| env(ENV_ENDPOINT))
            .filter(|e| !e.is_empty())
            .ok_or_else(|| {
                Error::invalid(
                    agent,
                    Op::Exchange,
                    format!("no TCPStore endpoint: set TcpStoreConfig::endpoint or {ENV_ENDPOINT}"),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_comes_from_the_config_then_the_environment() {
        let env = |k: &str| (k == ENV_ENDPOINT).then(|| "10.0.0.1:1".to_owned());
        let none = |_: &str| None;
        let c = TcpStoreConfig::default();
        assert_eq!(c.resolve_endpoint("a", env).expect("env"), "10.0.0.1:1");
        assert!(matches!(
            c.resolve_endpoint("a", none),
            Err(Error::InvalidParam { .. })
        ));
        let c = c.endpoint("127.0.0.1:2");
        assert_eq!(c.resolve_endpoint("a", env).expect("config"), "127.0.0.1:2");
        let bad = TcpStoreConfig::default()
            .endpoint("127.0.0.1:2")
            .watch_interval(Some(Duration::ZERO));
        assert!(matches!(
            bad.resolve_endpoint("a", none),
            Err(Error::InvalidParam { .. })
        ));
    }
}
