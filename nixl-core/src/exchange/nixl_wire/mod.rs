//! Speaking NIXL's own wire, to join deployments of stock NIXL agents (NIXL 1.5, over UCX).
//!
//! Between nixl-rs agents the crate's own formats stay the default ([`crate::codec`], the
//! [`crate::sidechannel`] frames, etcd keys with leases): they carry generations, are
//! checksummed where it matters and are bounded. A NIXL agent speaks none of them, so an
//! agent can also:
//!
//! - produce NIXL's metadata blob ([`NixlView::local_metadata`],
//!   [`NixlView::local_partial_metadata`]) and load one: [`Agent::load_remote_metadata`]
//!   takes either format (a NIXL blob starts with `nixlSerDes|`);
//! - serve and use NIXL's `NIXLCOMM` TCP side channel ([`NixlListener`],
//!   [`NixlView::send_local_metadata`], [`NixlView::fetch_remote_metadata`],
//!   [`NixlView::invalidate_local_metadata`]);
//! - publish and fetch under NIXL's etcd keys (`crate::etcd::EtcdConfig::nixl_keys`, feature
//!   `etcd`);
//! - move data and notifications with a NIXL peer through backends that implement
//!   [`NixlWire`] (the UCX backend: one worker's raw address, raw packed rkeys, notifications
//!   as active message 0 with a `nixlSerDes` payload).
//!
//! The choice is per peer: the same agent talks to nixl-rs peers in its own format and to
//! NIXL peers in theirs. What does not cross to a NIXL peer ([`NIXL_PEER_NOTE`], also in
//! [`Agent::path_report`]): a NIXL blob has no generation (this crate derives one from the
//! peer's connection info, so a restarted NIXL peer, which has a new worker address, still
//! fences requests built against its old incarnation), no integrity check (requests to a NIXL
//! peer refuse `XferOptions::integrity`), and nothing on NIXL's channels is authenticated.
//! docs/nixl-wire.md is the byte-level specification; docs/interop.md says how to set up
//! both sides.

pub(crate) mod agent;
mod backend;
// NIXL's byte formats, for the UCX backend (notifications), fuzzing and tests that play a
// NIXL peer: not a stable API, and hidden from the docs (as `nixl_core::wire` is). What an
// application names is re-exported below.
#[doc(hidden)]
pub mod comm;
pub(crate) mod listener;
#[doc(hidden)]
pub mod metadata;
#[doc(hidden)]
pub mod notif;
#[doc(hidden)]
pub mod serdes;
mod view;

pub use backend::NixlWire;
pub use listener::NixlListener;
pub use metadata::{is_nixl_blob, NixlConn, NixlDesc, NixlMetadata, NixlSection};
pub use view::NixlView;

#[cfg(doc)]
use crate::Agent;

/// The wire format a peer was loaded with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Wire {
    /// nixl-rs' own formats.
    Native,
    /// NIXL's formats (a stock NIXL agent).
    Nixl,
}

/// What a path report says about a NIXL peer: the guarantees that do not cross to it.
pub const NIXL_PEER_NOTE: &str = "NIXL wire: generation derived from its connection info \
     (none on the wire), no integrity frames, no authentication";

/// The NIXL version this crate's NIXL wire was checked against.
pub const NIXL_VERSION: &str = "1.5.1";
