//! The bytes peers exchange (see the crate root's `wire` entry): not a stable API.

#[path = "auth.rs"]
pub mod auth;
#[path = "codec.rs"]
pub mod codec;
#[path = "integrity.rs"]
pub mod integrity;
#[path = "sidechannel/mod.rs"]
pub mod sidechannel;
