//! # nixl-backend-gds
//!
//! Storage tiers as nixl-rs transfer targets: POSIX files (feature `posix`, default; io_uring
//! with a `pread`/`pwrite` thread-pool fallback; VRAM through pinned bounce buffers, with the
//! CUDA driver loaded at run time on first VRAM use), GPUDirect Storage (feature `gds`;
//! cuFile, loaded at run time, with a bounce fallback for files cuFile refuses) and S3 objects
//! (feature `s3`; `object_store`). CUDA and cuFile are reached only through nixl-mem's layer
//! (cudarc's run-time-loaded bindings); this crate's own calls into native code (libc,
//! io_uring, and the raw-address operations of that layer) live in one `sys` module.
//!
//! As in NIXL, storage transfers are local ("loopback") requests: the remote side is the agent
//! itself. The initiator prepares its DRAM descriptors with [`nixl_core::XferTarget::Initiator`]
//! and the FILE or OBJ descriptors with `XferTarget::Agent(own_name)`; descriptors name offsets
//! inside a registered file or object. Register storage with the typed regions of this crate:
//! [`FileRegion`] owns its file descriptor and [`ObjectRegion`] names a key, so neither can be
//! closed or freed under a transfer.
//!
//! ```
//! # #[cfg(feature = "posix")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use nixl_backend_gds::{FileRegion, OpenFlags, PosixParams};
//! use nixl_core::{Agent, AgentConfig, HostBuffer, MemKind, XferDescList, XferOp, XferOptions};
//!
//! let agent = Agent::new("kv", AgentConfig::default())?;
//! agent.create_backend(PosixParams::default())?;
//! let dir = std::env::temp_dir().join(format!("nixl-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let file = Arc::new(FileRegion::open(dir.join("blocks"), 1 << 20, OpenFlags::direct())?);
//! let (src, dst) = (Arc::new(HostBuffer::new(1 << 20).unwrap()), Arc::new(HostBuffer::new(1 << 20).unwrap()));
//! src.fill_pattern(1);
//! let _regs = agent.register_mem(vec![src.clone(), dst.clone(), file.clone()], &[])?;
//! for (op, buf) in [(XferOp::Write, &src), (XferOp::Read, &dst)] {
//!     let req = agent.create_xfer_req(op, &XferDescList::blocks(MemKind::Dram, buf.addr(), 4096, 256),
//!         &file.blocks(0, 4096, 256), "kv", XferOptions::default())?;
//!     agent.post_xfer_req(&req)?;
//!     req.wait(Duration::from_secs(10))?;
//! }
//! assert_eq!(src.to_vec(), dst.to_vec());
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! # #[cfg(not(feature = "posix"))]
//! # fn main() {}
//! ```

#![warn(missing_docs)]
// Library code returns its errors or says why a value is there; unit tests may unwrap (clippy.toml).
#![warn(clippy::unwrap_used, clippy::expect_used)]
// `unsafe` lives in `sys`; a file elsewhere that needs it (a memory contract's `unsafe impl`)
// says why at its top. Anything else fails to compile.
#![deny(unsafe_code)]

#[cfg(feature = "gds")]
mod gds;
#[cfg(feature = "posix")]
mod posix;
mod region;
#[cfg(feature = "s3")]
mod s3;
#[cfg(any(feature = "posix", feature = "gds", feature = "s3"))]
mod storage;
#[allow(unsafe_code)]
mod sys;

#[cfg(feature = "gds")]
pub use gds::{probe as gds_probe, GdsBackend, GdsFallback, GdsParams, GdsPlugin, GDS};
#[cfg(feature = "posix")]
pub use posix::{Engine, PosixBackend, PosixParams, PosixPlugin, POSIX};
pub use region::{FileRegion, ObjectRegion, OpenFlags};
#[cfg(feature = "s3")]
pub use s3::{S3Backend, S3Params, S3Plugin, OBJ};
