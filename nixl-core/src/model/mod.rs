//! The data model: descriptors and descriptor lists, memory kinds and regions, strided block
//! tables, prepared lists and transfer requests, notifications, limits, telemetry and the
//! crate's error type. The crate root re-exports what applications use.

pub(crate) mod desc;
pub(crate) mod error;
pub(crate) mod index;
pub(crate) mod limits;
pub(crate) mod mem;
pub(crate) mod notif;
pub(crate) mod strided;
pub(crate) mod telemetry;
pub(crate) mod xfer;
