//! The bytes peers exchange (see the crate root's `wire` entry): not a stable API.

pub mod auth;
pub mod codec;
pub mod fuzz;
pub mod integrity;
pub use crate::exchange::sidechannel;
