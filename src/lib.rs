//! # nixl
//!
//! The facade of nixl-rs: re-exports [`nixl_core`]'s agent API, [`nixl_mem`]'s memory types
//! and, per cargo feature, the backend crates (`ucx`, `libfabric`, `posix`/`gds`/`s3`).

// Library code returns its errors or says why a value is there; unit tests may unwrap (clippy.toml).
#![warn(clippy::unwrap_used, clippy::expect_used)]

pub use nixl_core as core;
pub use nixl_core::access;
pub use nixl_core::completion;
pub use nixl_core::kv;
pub use nixl_core::leases;
pub use nixl_core::nixl_wire;
pub use nixl_core::telemetry;
pub use nixl_core::tiles;
pub use nixl_core::{
    Agent, AgentConfig, ArrivalCounters, Desc, Error, ErrorKind, HostBuffer, Limits, MemKind,
    MemoryRegion, Notifs, PreparedList, RegionDesc, Registration, Result, StridedDesc,
    StridedDescList, XferDescList, XferOp, XferOptions, XferReq, XferState, XferTarget,
};

/// Names that moved off this crate's root in 0.1.0 (kept for one release; each says where).
#[allow(missing_docs)]
mod moved {
    #[deprecated(since = "0.1.0", note = "moved to nixl::access::Auth")]
    #[doc(hidden)]
    pub type Auth = nixl_core::access::Auth;
    #[deprecated(since = "0.1.0", note = "moved to nixl::access::Credential")]
    #[doc(hidden)]
    pub type Credential = nixl_core::access::Credential;
    #[deprecated(since = "0.1.0", note = "moved to nixl::access::FetchPolicy")]
    #[doc(hidden)]
    pub type FetchPolicy = nixl_core::access::FetchPolicy;
    #[deprecated(since = "0.1.0", note = "moved to nixl::leases::LeaseId")]
    #[doc(hidden)]
    pub type LeaseId = nixl_core::leases::LeaseId;
    #[deprecated(since = "0.1.0", note = "moved to nixl::leases::LeaseState")]
    #[doc(hidden)]
    pub type LeaseState = nixl_core::leases::LeaseState;
    #[deprecated(since = "0.1.0", note = "moved to nixl::completion::FetchFuture")]
    #[doc(hidden)]
    pub type FetchFuture = nixl_core::completion::FetchFuture;
    #[deprecated(since = "0.1.0", note = "moved to nixl::completion::NotifStream")]
    #[doc(hidden)]
    pub type NotifStream = nixl_core::completion::NotifStream;
    #[deprecated(since = "0.1.0", note = "moved to nixl::completion::Notification")]
    #[doc(hidden)]
    pub type Notification = nixl_core::completion::Notification;
    #[deprecated(since = "0.1.0", note = "moved to nixl::completion::QuiescenceFuture")]
    #[doc(hidden)]
    pub type QuiescenceFuture<'a> = nixl_core::completion::QuiescenceFuture<'a>;
    #[deprecated(since = "0.1.0", note = "moved to nixl::completion::XferFuture")]
    #[doc(hidden)]
    pub type XferFuture<R> = nixl_core::completion::XferFuture<R>;
}
#[allow(deprecated)]
pub use moved::*;
pub use nixl_mem as mem;

/// The UCX backend (feature `ucx`).
#[cfg(feature = "ucx")]
pub use nixl_backend_ucx as ucx;

/// The libfabric backend (feature `libfabric`).
#[cfg(feature = "libfabric")]
pub use nixl_backend_libfabric as libfabric;

/// The storage backends: POSIX files, GPUDirect Storage, S3 (features `posix`, `gds`, `s3`).
#[cfg(any(feature = "posix", feature = "gds", feature = "s3"))]
pub use nixl_backend_gds as storage;

use std::sync::Arc;

use nixl_core::backend::BackendPlugin;

/// Every backend type compiled into this build (per cargo feature), for creating backends by
/// name (`Agent::create_backend_named`) and listing them (`Agent::available_backends`).
pub fn plugins() -> Vec<Arc<dyn BackendPlugin>> {
    #[allow(unused_mut)]
    let mut v: Vec<Arc<dyn BackendPlugin>> = vec![
        Arc::new(nixl_core::backend::inproc::InprocPlugin),
        Arc::new(nixl_mem::CudaIpcPlugin),
    ];
    #[cfg(feature = "ucx")]
    v.push(Arc::new(nixl_backend_ucx::UcxPlugin));
    #[cfg(feature = "libfabric")]
    v.push(Arc::new(nixl_backend_libfabric::LibfabricPlugin));
    #[cfg(feature = "posix")]
    v.push(Arc::new(nixl_backend_gds::PosixPlugin));
    #[cfg(feature = "s3")]
    v.push(Arc::new(nixl_backend_gds::S3Plugin));
    #[cfg(feature = "gds")]
    v.push(Arc::new(nixl_backend_gds::GdsPlugin));
    v
}

/// An [`AgentConfig`] whose plugin list is [`plugins()`]; the rest is the default.
pub fn agent_config() -> AgentConfig {
    AgentConfig::default().plugins(plugins())
}

#[doc = include_str!("../docs/concepts.md")]
pub mod concepts {}
