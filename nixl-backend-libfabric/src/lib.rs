//! # nixl-backend-libfabric
//!
//! The `LIBFABRIC` backend of nixl-rs: one-sided READ/WRITE of descriptor batches and
//! notifications over libfabric — AWS EFA in production, the `tcp`, `shm` and `sockets`
//! providers on one host.
//!
//! - **Loaded at run time.** libfabric is not linked: `libfabric.so.1` (the EFA installer's
//!   copy under `/opt/amazon/efa` first, or `NIXL_LIBFABRIC_PATH`) is opened when a backend is
//!   created, and its absence is [`nixl_core::Error::Unavailable`] naming what to install.
//!   Bindings are generated from the libfabric 1.17 headers; the header's `static inline`
//!   calls are made through the objects' ops tables from Rust (`src/sys/ops.rs`).
//! - **Provider selection** by name ([`LibfabricParams::provider`]) or capability (the first
//!   of efa, tcp, shm, sockets offering RDM endpoints with RMA and messages). Every
//!   memory-registration mode is honoured: local descriptors (`FI_MR_LOCAL`), virtual or
//!   offset addressing (`FI_MR_VIRT_ADDR`), provider keys (`FI_MR_PROV_KEY`), allocated memory
//!   (`FI_MR_ALLOCATED`), endpoint-bound registrations (`FI_MR_ENDPOINT`), and device memory
//!   through `FI_HMEM` where the provider offers it.
//! - **Rails.** [`LibfabricParams::rails`] endpoints (each on its own fabric/domain, e.g. one
//!   per EFA device); a batch is striped over them and the split is reported per request
//!   (`XferReq::path`), per peer (`Agent::path_report`) and in [`LibfabricStats`].
//! - **Notifications after data.** A request's notification is sent (`fi_send`) only once every
//!   write completed, with delivery-complete semantics where the provider grants them; the
//!   target drains posted receive buffers in its progress (a backend thread by default).
//! - **No hangs.** Every internal wait is bounded by [`LibfabricParams::op_timeout`];
//!   connection errors become [`nixl_core::Error::RemoteDisconnect`].
//!
//! ```no_run
//! use nixl_backend_libfabric::LibfabricParams;
//! use nixl_core::{Agent, AgentConfig};
//!
//! # fn main() -> nixl_core::Result<()> {
//! let agent = Agent::new("prefill", AgentConfig::default())?;
//! // EFA on a p5 instance: every EFA device a rail.
//! let params = LibfabricParams::default().provider("efa".to_string()).rails(4);
//! let stats = params.stats();
//! agent.create_backend(params)?;
//! println!("{:?}", stats.rails());
//! # Ok(()) }
//! ```

// Library code returns its errors or says why a value is there; unit tests may unwrap (clippy.toml).
#![warn(clippy::unwrap_used, clippy::expect_used)]
// `unsafe` lives in `sys`; a file elsewhere that needs it (a memory contract's `unsafe impl`)
// says why at its top. Anything else fails to compile.
#![deny(unsafe_code)]

mod backend;
mod dead_holder;
mod keys;
mod own;
mod params;
mod peer;
mod rail;
mod reached;
mod result;
mod select;
#[allow(unsafe_code)]
mod sys;
mod validate;
mod wire;
mod xfer;

/// The pure decoders of the backend's wire bytes, and counts of the native calls peers' bytes
/// reached, for fuzzing (feature `fuzzing`; not a stable API).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::reached::{av_inserts, drives_here, rma_posts};
    pub use crate::validate::check_name;
    pub use crate::wire::{
        decode_conn, decode_message, decode_region, encode_conn, encode_hello, encode_notif,
        encode_region, Message,
    };
}

pub use backend::LibfabricBackend;
pub use params::{
    HmemMode, LibfabricParams, LibfabricPlugin, LibfabricStats, RailStats, DEFAULT_PROVIDERS,
};
pub use result::{FiError, LIBFABRIC};

/// Whether libfabric can be loaded on this machine (and from where, or why not).
pub fn library_status() -> std::result::Result<String, String> {
    sys::lib().map(|l| l.path.clone()).map_err(str::to_owned)
}
