//! # nixl
//!
//! The facade of nixl-rs: re-exports [`nixl_core`]'s agent API, [`nixl_mem`]'s memory types
//! and, per cargo feature, the backend crates (`ucx`, `libfabric`, `posix`/`gds`/`s3`).

pub use nixl_core as core;
pub use nixl_core::{
    Agent, AgentConfig, Desc, Error, HostBuffer, MemKind, PreparedList, Registration, Result, XferDescList, XferOp,
    XferOptions, XferReq, XferState, XferTarget,
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

#[doc = include_str!("../docs/concepts.md")]
pub mod concepts {}
