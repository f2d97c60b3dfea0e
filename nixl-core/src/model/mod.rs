//! The data model: descriptors and descriptor lists, memory kinds and regions, strided block
//! tables, notifications, limits, telemetry and the crate's error type (transfer requests,
//! bound to the agent's state, are in `agent::request`). The crate root re-exports what
//! applications use.

pub(crate) mod arrival;
pub(crate) mod cells;
pub(crate) mod desc;
pub(crate) mod error;
pub(crate) mod index;
pub(crate) mod kv;
pub(crate) mod lease;
pub(crate) mod limits;
pub(crate) mod mem;
pub(crate) mod notif;
pub(crate) mod setters;
pub(crate) mod spec;
pub(crate) mod strided;
pub(crate) mod telemetry;
pub(crate) mod tiles;
pub(crate) mod timer;
pub(crate) mod wake;
