//! # nixl-core
//!
//! The heart of nixl-rs: an [`Agent`] per process registers memory with pluggable
//! [`Backend`](backend::Backend)s, exchanges metadata with peers, and moves descriptor lists with one-sided
//! READ/WRITE and notifications — NIXL's model, with Rust's guarantees:
//!
//! - **Registrations keep memory alive.** [`Agent::register_mem`] takes the memory itself
//!   (anything implementing [`MemoryRegion`]) and returns a [`Registration`]; prepared lists
//!   and requests hold it, so memory cannot be freed under a transfer.
//! - **No hangs.** Every blocking call takes a deadline; requests end in typed terminal
//!   states ([`Error::TimedOut`], [`Error::RemoteDisconnect`], [`Error::PeerRestarted`],
//!   [`Error::Canceled`]).
//! - **Bad input changes nothing.** Descriptors outside registrations, mismatched lengths,
//!   unknown agents and hostile metadata bytes get typed errors.
//! - **Honest paths.** [`XferReq::path`] and [`Agent::path_report`] say which backend and
//!   transports carried a request.
//!
//! The flow (two agents in one process over the pure-Rust [`INPROC`] backend):
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use nixl_core::{Agent, AgentConfig, HostBuffer, InprocParams, MemKind, XferDescList, XferOp,
//!     XferOptions, XferTarget};
//!
//! # fn main() -> nixl_core::Result<()> {
//! let a = Agent::new("a", AgentConfig::default())?;
//! let b = Agent::new("b", AgentConfig::default())?;
//! a.create_backend(InprocParams::default())?;
//! b.create_backend(InprocParams::default())?;
//! let (src, dst) = (Arc::new(HostBuffer::new(4096).unwrap()), Arc::new(HostBuffer::new(4096).unwrap()));
//! src.fill(7);
//! let _r1 = a.register_mem(vec![src.clone()], &[])?;
//! let _r2 = b.register_mem(vec![dst.clone()], &[])?;
//! a.load_remote_metadata(&b.local_metadata()?)?;
//! let req = a.create_xfer_req(XferOp::Write,
//!     &XferDescList::blocks(MemKind::Dram, src.addr(), 4096, 1),
//!     &XferDescList::blocks(MemKind::Dram, dst.addr(), 4096, 1), "b",
//!     XferOptions::with_notif(b"done".to_vec()))?;
//! a.post_xfer_req(&req)?;
//! req.wait(Duration::from_secs(5))?;
//! assert_eq!(dst.to_vec(), vec![7u8; 4096]);
//! assert_eq!(b.get_notifs()?["a"], vec![b"done".to_vec()]);
//! # Ok(()) }
//! ```
//!
//! A registration cannot be outlived by the memory it names: the agent owns an `Arc` of it.
//!
//! ```compile_fail
//! use nixl_core::{Agent, AgentConfig, HostBuffer};
//! use std::sync::Arc;
//! let a = Agent::new("a", AgentConfig::default()).unwrap();
//! let buf = HostBuffer::new(4096).unwrap();
//! // A plain reference is not a region: only owned (`Arc`) memory can be registered.
//! let _r = a.register_mem(vec![&buf], &[]);
//! ```

#![warn(missing_docs)]
// Library code returns its errors or says why a value is there; unit tests may unwrap (clippy.toml).
#![warn(clippy::unwrap_used, clippy::expect_used)]
// Raw memory access lives in `sys`; the other files that need `unsafe` say why at their top
// (`#![allow(unsafe_code)]` with the contract that makes it sound): `model/mem.rs` (the
// `MemoryRegion` contract and the slice views it promises), the INPROC and fault-injection
// backends' copies and the integrity hash's callers (ranges inside registrations the request
// holds). Anything else fails to compile.
#![deny(unsafe_code)]

// One folder per concern: `agent` (the agent's operations), `model` (descriptors, memory,
// requests, errors), `backend` (the backend-author API), `wire` (the peers' byte formats),
// `exchange` (side channel, etcd, NIXL's wire, peer liveness), `bundled` (INPROC, fault
// injection).
mod agent;
pub mod backend;
mod bundled;
mod exchange;
mod model;
#[cfg(test)]
mod scale_tests;
#[allow(unsafe_code)]
mod sys;
/// The bytes peers exchange, for fuzzing and for tests that play a hostile peer: the metadata
/// codec, the side channel's frames, authentication seals and integrity frames. Not a stable
/// API.
#[doc(hidden)]
pub mod wire;

/// Observation hooks for the project's own tests (the `fuzzing` feature; not a stable API).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::model::timer::threads_started_here;
}
mod work;

#[cfg(feature = "etcd")]
pub use exchange::etcd;
pub use exchange::nixl_wire;
pub use exchange::tcpstore;

// Short internal paths (`crate::desc`, `crate::codec`, ...) of the modules in the folders.
use backend::{bytes, hello, params};
use bundled::{deferred, fault, inproc};
use exchange::{liveness, sidechannel};
use model::{arrival, desc, error, index, lease, limits, mem, notif, spec, strided, wake};
use wire::{auth, codec, integrity};

// The paved path: what an application names. Backend authors' types are in [`backend`] (the
// bundled INPROC and fault-injection backends in `backend::inproc`, `backend::fault`).
pub use agent::prep::PreparedList;
pub use agent::registration::Registration;
pub use agent::remote::MetadataSelection;
pub use agent::{Agent, AgentConfig, BackendHandle};
pub use arrival::ArrivalCounters;
pub use backend::XferState;
pub use codec::AgentMetadata;
pub use desc::{Desc, XferDescList, XferOp};
pub use error::{Error, ErrorKind, Op, Result};
pub use inproc::InprocParams;
/// KV-cache layouts and the requests planned from them: a rank's [`KvLayout`], the other
/// side's ranks as [`KvPeer`](kv::KvPeer)s, and [`KvLayout::plan`]'s
/// [`KvXferPlan`](kv::KvXferPlan) (pieces or tiles per peer, chosen by the layouts), which
/// [`Agent::make_kv_xfers`] turns into requests.
pub mod kv {
    pub use crate::model::kv::{
        KvLayout, KvMoves, KvOrder, KvPeer, KvPeerXfer, KvPlan, KvTensor, KvTilePlan, KvTileXfer,
        KvXfer, KvXferPlan,
    };
}
pub use limits::{Limits, ListenerLimits};
pub use mem::{HostBuffer, MemKind, MemoryRegion, RegionDesc};
pub use notif::Notifs;
pub use strided::{StridedDesc, StridedDescList};

/// Tiles: block-table transfers whose rows are rearranged on the way
/// ([`Agent::make_tile_xfer`]; a whole block is the identity tile).
pub mod tiles {
    pub use crate::model::tiles::{RowStrides, Tile, TileShape, MAX_TILE_ROWS};
}
pub use agent::options::{UncertainXfer, XferOptions};
pub use agent::request::{XferReq, XferTarget};

/// Who learns the keys to this agent's memory: [`FetchPolicy`](access::FetchPolicy) (who may
/// FETCH its metadata at all), [`Share`](access::Share) (which peers get a labeled
/// registration's keys), and the cluster credential that authenticates peers
/// ([`Auth`](access::Auth), [`Credential`](access::Credential)). See `docs/security.md`.
pub mod access {
    pub use crate::agent::{FetchPolicy, Share};
    pub use crate::auth::{Auth, Credential};
}

/// Completion without polling: a request's [`XferFuture`](completion::XferFuture) and
/// [`QuiescenceFuture`](completion::QuiescenceFuture), a metadata fetch's
/// [`FetchFuture`](completion::FetchFuture), and the [`NotifStream`](completion::NotifStream)
/// of [`Notification`](completion::Notification)s. Woken by the backends; any executor (or
/// none: `futures::executor::block_on`) drives them.
pub mod completion {
    pub use crate::agent::{FetchFuture, NotifStream, Notification, QuiescenceFuture, XferFuture};
}

/// What an agent counted (`AgentConfig::telemetry`): [`TelemetrySnapshot`](telemetry::TelemetrySnapshot)
/// of the agent, [`XferTelemetry`](telemetry::XferTelemetry) of one request.
pub mod telemetry {
    pub(crate) use crate::model::telemetry::{env_enabled, Counters};
    pub use crate::model::telemetry::{TelemetrySnapshot, XferTelemetry};
}

/// Leases on published blocks (see [`Agent::publish_lease`]): the owner's [`LeaseId`] and
/// [`LeaseState`], and the reader's [`Lease`](leases::Lease), a value that releases on drop.
pub mod leases {
    pub use crate::agent::lease::{Lease, LeaseFuture, Renewal};
    pub use crate::agent::LeaseEnd;
    pub use crate::lease::{
        Clock, LeaseId, LeaseState, ManualClock, SystemClock, MAX_LEASE_BLOCKS,
        RESERVED_NOTIF_PREFIX,
    };
}

/// Names that moved off the crate root in 0.2 (kept for one release; each says where it went).
mod moved {
    #![allow(missing_docs)]
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::kv::KvLayout")]
    #[doc(hidden)]
    pub type KvLayout = crate::kv::KvLayout;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::kv::KvOrder")]
    #[doc(hidden)]
    pub type KvOrder = crate::kv::KvOrder;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::kv::KvPeerXfer")]
    #[doc(hidden)]
    pub type KvPeerXfer = crate::kv::KvPeerXfer;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::kv::KvPlan")]
    #[doc(hidden)]
    pub type KvPlan = crate::kv::KvPlan;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::kv::KvTensor")]
    #[doc(hidden)]
    pub type KvTensor = crate::kv::KvTensor;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::kv::KvTilePlan")]
    #[doc(hidden)]
    pub type KvTilePlan = crate::kv::KvTilePlan;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::kv::KvTileXfer")]
    #[doc(hidden)]
    pub type KvTileXfer = crate::kv::KvTileXfer;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::tiles::RowStrides")]
    #[doc(hidden)]
    pub type RowStrides = crate::tiles::RowStrides;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::tiles::Tile")]
    #[doc(hidden)]
    pub type Tile = crate::tiles::Tile;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::tiles::TileShape")]
    #[doc(hidden)]
    pub type TileShape = crate::tiles::TileShape;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::Capabilities")]
    #[doc(hidden)]
    pub type Capabilities = crate::backend::Capabilities;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::CostEstimate")]
    #[doc(hidden)]
    pub type CostEstimate = crate::backend::CostEstimate;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::CostMethod")]
    #[doc(hidden)]
    pub type CostMethod = crate::backend::CostMethod;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::QueryResult")]
    #[doc(hidden)]
    pub type QueryResult = crate::backend::QueryResult;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::DecodeError")]
    #[doc(hidden)]
    pub type DecodeError = crate::backend::DecodeError;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::PeerProcess")]
    #[doc(hidden)]
    pub type PeerProcess = crate::backend::PeerProcess;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::ProcessId")]
    #[doc(hidden)]
    pub type ProcessId = crate::backend::ProcessId;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::RawRegion")]
    #[doc(hidden)]
    pub type RawRegion = crate::backend::RawRegion;
    #[deprecated(
        since = "0.1.0",
        note = "moved to nixl_core::backend::inproc::Completion"
    )]
    #[doc(hidden)]
    pub type Completion = crate::backend::inproc::Completion;
    #[deprecated(
        since = "0.1.0",
        note = "moved to nixl_core::backend::inproc::InprocPlugin"
    )]
    #[doc(hidden)]
    pub type InprocPlugin = crate::backend::inproc::InprocPlugin;
    #[deprecated(
        since = "0.1.0",
        note = "moved to nixl_core::backend::fault::FaultEvent"
    )]
    #[doc(hidden)]
    pub type FaultEvent = crate::backend::fault::FaultEvent;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::fault::FaultLog")]
    #[doc(hidden)]
    pub type FaultLog = crate::backend::fault::FaultLog;
    #[deprecated(
        since = "0.1.0",
        note = "moved to nixl_core::backend::fault::FaultParams"
    )]
    #[doc(hidden)]
    pub type FaultParams = crate::backend::fault::FaultParams;
    #[deprecated(
        since = "0.1.0",
        note = "moved to nixl_core::backend::fault::FaultPlan"
    )]
    #[doc(hidden)]
    pub type FaultPlan = crate::backend::fault::FaultPlan;
    /// The unit value of the moved `InprocPlugin` type.
    #[deprecated(
        since = "0.1.0",
        note = "moved to nixl_core::backend::inproc::InprocPlugin"
    )]
    #[doc(hidden)]
    #[allow(non_upper_case_globals)]
    pub const InprocPlugin: crate::backend::inproc::InprocPlugin =
        crate::backend::inproc::InprocPlugin;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::SharedError")]
    #[doc(hidden)]
    pub type SharedError = crate::backend::SharedError;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::inproc::INPROC")]
    #[doc(hidden)]
    pub const INPROC: &str = crate::backend::inproc::INPROC;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::PAGE_SIZE")]
    #[doc(hidden)]
    pub const PAGE_SIZE: usize = crate::backend::PAGE_SIZE;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::backend::NOTIF_OVERHEAD")]
    #[doc(hidden)]
    pub const NOTIF_OVERHEAD: usize = crate::backend::NOTIF_OVERHEAD;
    #[deprecated(since = "0.1.0", note = "now nixl_core::access::Credential::ENV")]
    #[doc(hidden)]
    pub const ENV_CREDENTIAL: &str = crate::access::Credential::ENV;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::leases::LeaseId")]
    #[doc(hidden)]
    pub type LeaseId = crate::leases::LeaseId;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::leases::LeaseState")]
    #[doc(hidden)]
    pub type LeaseState = crate::leases::LeaseState;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::access::Auth")]
    #[doc(hidden)]
    pub type Auth = crate::access::Auth;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::access::Credential")]
    #[doc(hidden)]
    pub type Credential = crate::access::Credential;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::access::FetchPolicy")]
    #[doc(hidden)]
    pub type FetchPolicy = crate::access::FetchPolicy;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::completion::FetchFuture")]
    #[doc(hidden)]
    pub type FetchFuture = crate::completion::FetchFuture;
    #[deprecated(
        since = "0.1.0",
        note = "moved to nixl_core::completion::QuiescenceFuture"
    )]
    #[doc(hidden)]
    pub type QuiescenceFuture<'a> = crate::completion::QuiescenceFuture<'a>;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::completion::XferFuture")]
    #[doc(hidden)]
    pub type XferFuture<R> = crate::completion::XferFuture<R>;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::completion::NotifStream")]
    #[doc(hidden)]
    pub type NotifStream = crate::completion::NotifStream;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::completion::Notification")]
    #[doc(hidden)]
    pub type Notification = crate::completion::Notification;
    #[deprecated(
        since = "0.1.0",
        note = "moved to nixl_core::telemetry::TelemetrySnapshot"
    )]
    #[doc(hidden)]
    pub type TelemetrySnapshot = crate::telemetry::TelemetrySnapshot;
    #[deprecated(since = "0.1.0", note = "moved to nixl_core::telemetry::XferTelemetry")]
    #[doc(hidden)]
    pub type XferTelemetry = crate::telemetry::XferTelemetry;
}
#[allow(deprecated)]
pub use moved::*;
