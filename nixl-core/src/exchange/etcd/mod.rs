//! Metadata exchange through etcd (feature `etcd`; pure Rust: building it needs no `protoc`).
//!
//! Large deployments publish agent metadata to etcd instead of dialling every peer's side
//! channel. Each agent opens an [`EtcdExchange`], which
//!
//! - publishes full metadata ([`EtcdExchange::publish`]) or partial metadata under a label
//!   ([`EtcdExchange::publish_partial`]) at `{namespace}/{agent}/{label}`, every key attached
//!   to a lease the exchange keeps alive: a crashed agent's keys vanish after
//!   [`EtcdConfig::lease_ttl`];
//! - fetches a peer by name and label ([`EtcdExchange::fetch_label`]), waiting with a watch
//!   up to a deadline for it to be published, and loads it into the agent;
//! - watches every peer it loaded: when the peer's key is deleted (it invalidated itself with
//!   [`EtcdExchange::invalidate_local`], closed, or its lease expired) or replaced by another
//!   incarnation, the peer is invalidated, and requests to it fail with
//!   [`Error::PeerRestarted`](crate::Error::PeerRestarted) (built ones) or
//!   [`Error::NotFound`](crate::Error::NotFound) (new ones).
//!
//! Endpoints and namespace come from [`EtcdConfig`], else from [`ENV_ENDPOINTS`] /
//! [`ENV_NAMESPACE`] (`NIXL_ETCD_ENDPOINTS`, `NIXL_ETCD_NAMESPACE`), and the namespace
//! defaults to [`DEFAULT_NAMESPACE`]. The etcd client is asynchronous; the exchange owns a
//! one-worker tokio runtime and offers a blocking API where every call has a deadline.
//!
//! ```
//! use std::time::Duration;
//! use nixl_core::etcd::{EtcdConfig, EtcdExchange, LocalEtcd};
//! use nixl_core::{Agent, AgentConfig, InprocParams};
//!
//! # fn main() -> nixl_core::Result<()> {
//! let etcd = match LocalEtcd::start() {
//!     Ok(e) => e,
//!     Err(nixl_core::Error::Unavailable { .. }) => return Ok(()), // no etcd binary here
//!     Err(e) => return Err(e),
//! };
//! let cfg = EtcdConfig::default().endpoints(vec![etcd.endpoint()]);
//! let (a, b) = (Agent::new("a", AgentConfig::default())?, Agent::new("b", AgentConfig::default())?);
//! a.create_backend(InprocParams::default())?;
//! b.create_backend(InprocParams::default())?;
//! let (xa, xb) = (EtcdExchange::new(&a, &cfg)?, EtcdExchange::new(&b, &cfg)?);
//! xb.publish()?;
//! assert_eq!(xa.fetch("b", Duration::from_secs(5))?, "b");
//! assert!(a.check_remote_metadata("b", None));
//! # Ok(()) }
//! ```

mod client;
mod config;
mod exchange;
mod keepalive;
mod local;
mod pb;
mod rpc;
mod watch;

pub use config::{
    EtcdConfig, DEFAULT_LABEL, DEFAULT_NAMESPACE, ENV_ENDPOINTS, ENV_NAMESPACE, MAX_LABEL,
    NIXL_NAMESPACE,
};
pub use exchange::EtcdExchange;
pub use local::{LocalEtcd, ENV_ETCD_BIN};
