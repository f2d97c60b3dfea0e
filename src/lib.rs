//! # nixl
//!
//! The facade of nixl-rs: re-exports [`nixl_core`]'s agent API and, per cargo feature, the
//! backend crates.

pub use nixl_core as core;
pub use nixl_core::{
    Agent, AgentConfig, Desc, Error, HostBuffer, MemKind, Registration, Result, XferDescList, XferOp, XferOptions,
    XferReq, XferState, XferTarget,
};
pub use nixl_mem as mem;
