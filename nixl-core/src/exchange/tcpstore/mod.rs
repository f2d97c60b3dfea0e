//! Metadata exchange through a c10d TCPStore: the key-value store PyTorch's distributed jobs
//! already run (`torch.distributed.TCPStore`), which NIXL 1.5 uses as its third metadata
//! store (`NIXL_TCPSTORE_ENDPOINT`).
//!
//! - [`TcpStoreExchange`] publishes an agent's metadata under NIXL's keys
//!   (`nixl/agents/{label}/{agent}/NULL_AGENT`), fetches peers' (polling until published, up
//!   to a deadline), invalidates by deleting its keys, and watches the peers it loaded.
//! - [`TcpStoreClient`] is the c10d client underneath (every operation under a deadline,
//!   answers bounded before allocation; a `SET` is followed by a `PING` on its connection, so
//!   a publication that returns `Ok` is in the store). It needs a store that answers `PING`
//!   (c10d's query 13), as NIXL 1.5's client does.
//! - [`TcpStoreServer`] serves the store where no PyTorch job does (loopback by default: the
//!   protocol has no authentication).
//!
//! ```
//! use std::time::Duration;
//! use nixl_core::tcpstore::{TcpStoreConfig, TcpStoreExchange, TcpStoreServer, TcpStoreServerConfig};
//! use nixl_core::{Agent, AgentConfig, InprocParams};
//!
//! # fn main() -> nixl_core::Result<()> {
//! let store = TcpStoreServer::start("127.0.0.1:0".parse().unwrap(), &TcpStoreServerConfig::default())?;
//! let cfg = TcpStoreConfig::default().endpoint(store.endpoint());
//! let (a, b) = (Agent::new("a", AgentConfig::default())?, Agent::new("b", AgentConfig::default())?);
//! a.create_backend(InprocParams::default())?;
//! b.create_backend(InprocParams::default())?;
//! let (xa, xb) = (TcpStoreExchange::new(&a, &cfg)?, TcpStoreExchange::new(&b, &cfg)?);
//! xb.publish()?;
//! assert_eq!(xa.fetch("b", Duration::from_secs(5))?, "b");
//! assert!(a.check_remote_metadata("b", None));
//! # Ok(()) }
//! ```

mod client;
mod config;
mod exchange;
mod server;
#[doc(hidden)]
pub mod wire;

pub use crate::exchange::published::{DEFAULT_LABEL, MAX_LABEL};
pub use client::TcpStoreClient;
pub use config::{TcpStoreConfig, ENV_ENDPOINT};
pub use exchange::{TcpStoreExchange, NAMESPACE, NULL_AGENT};
#[doc(hidden)]
pub use server::serve_bytes;
pub use server::{TcpStoreServer, TcpStoreServerConfig};
