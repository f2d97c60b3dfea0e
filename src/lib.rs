//! # nixl
//!
//! The facade of nixl-rs: re-exports [`nixl_core`]'s agent API, [`nixl_mem`]'s memory types
//! and, per cargo feature, the backend crates (`ucx`, `libfabric`, `posix`/`gds`/`s3`).

// Library code returns its errors or says why a value is there; unit tests may unwrap (clippy.toml).
#![warn(clippy::unwrap_used, clippy::expect_used)]

pub use nixl_core as core;
pub use nixl_core::access;
pub use nixl_core::kv;
pub use nixl_core::leases;
pub use nixl_core::nixl_wire;
pub use nixl_core::tiles;
pub use nixl_core::{
    Agent, AgentConfig, ArrivalCounters, Auth, Credential, Desc, Error, ErrorKind, FetchFuture,
    FetchPolicy, HostBuffer, LeaseId, LeaseState, Limits, MemKind, MemoryRegion, NotifStream,
    Notification, Notifs, PreparedList, QuiescenceFuture, RegionDesc, Registration, Result,
    StridedDesc, StridedDescList, XferDescList, XferFuture, XferOp, XferOptions, XferReq,
    XferState, XferTarget,
};
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
    AgentConfig {
        plugins: plugins(),
        ..AgentConfig::default()
    }
}

#[doc = include_str!("../docs/concepts.md")]
pub mod concepts {}
