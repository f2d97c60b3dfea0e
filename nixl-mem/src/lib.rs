//! # nixl-mem
//!
//! Memory a nixl-rs backend registers, and the native same-host GPU backend.
//!
//! Every type here implements [`nixl_core::MemoryRegion`] (so it can be passed to
//! `Agent::register_mem` inside an `Arc`, which then keeps it alive under transfers):
//!
//! | type | kind | what |
//! |---|---|---|
//! | [`HostBuffer`] (nixl-core's) | DRAM | page-aligned heap memory |
//! | [`MmapBuffer`] | DRAM | anonymous mapping; reserved 2 MiB huge pages or transparent ones |
//! | [`Pinned`]`<M>` | DRAM | any [`HostMemory`] page-locked with `cuMemHostRegister` |
//! | [`CudaHostBuffer`] | DRAM | pinned memory from `cuMemHostAlloc` |
//! | [`SharedHostBuffer`] / [`SharedHostMapping`] | DRAM | a memfd another process can map |
//! | [`DeviceBuffer`] | VRAM | `cuMemAlloc`; `dev_id` = GPU ordinal, `addr` = device pointer |
//! | [`IpcMapping`] | VRAM | another process's allocation (`cuIpcOpenMemHandle`) |
//! | `HipBuffer` (feature `rocm`) | VRAM | `hipMalloc` |
//! | `GaudiBuffer` (feature `gaudi`) | VRAM | Habana device memory through `libhl-thunk` |
//!
//! GPU libraries are loaded at run time: the crate builds and its tests run on a machine with
//! no GPU, where every GPU entry point returns [`nixl_core::Error::Unavailable`].
//!
//! This crate is the workspace's one CUDA layer (cudarc's run-time-loaded bindings, see
//! [`cuda`]): the UCX backend registers VRAM in a GPU's primary [`Context`], and the storage
//! backends of nixl-backend-gds copy through its streams and [`CudaHostBuffer`]s and reach
//! GPUDirect Storage through `cufile` (feature `cufile`). All of the crate's calls into native
//! code, and so all of its `unsafe` blocks, are in one private `sys` module.
//!
//! The [`CudaIpcBackend`] (`CUDA_IPC`) moves VRAM<->VRAM and DRAM<->VRAM between processes of
//! one host with CUDA IPC handles, the GPUs' copy engines, and a scatter-gather copy kernel
//! (hand-written PTX, JIT-compiled by the driver) for VRAM requests of many blocks; see
//! [`cuda_ipc`].
//!
//! ```
//! use nixl_mem::{HostMemory, MmapBuffer, Pages};
//! # fn main() -> nixl_core::Result<()> {
//! let buf = MmapBuffer::huge_or_fallback(4 << 20)?; // huge pages when reserved
//! buf.fill(1);
//! assert_eq!(buf.to_vec()[4 << 19], 1);
//! match nixl_mem::DeviceBuffer::new(0, 1 << 20) {
//!     Ok(gpu) => assert_eq!(gpu.to_vec()?, vec![0u8; 1 << 20]),
//!     Err(e) => assert_eq!(e.kind().as_str(), "unavailable"), // no GPU here
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]
// Library code returns its errors or says why a value is there; unit tests may unwrap (clippy.toml).
#![warn(clippy::unwrap_used, clippy::expect_used)]
// `unsafe` lives in `sys`; a file elsewhere that needs it (a memory contract's `unsafe impl`)
// says why at its top. Anything else fails to compile.
#![deny(unsafe_code)]

pub mod cuda;
pub mod cuda_ipc;
#[cfg(feature = "cufile")]
pub mod cufile;
mod error;
#[cfg(feature = "gaudi")]
pub mod gaudi;
mod host;
#[cfg(feature = "rocm")]
pub mod rocm;
mod shared;
#[allow(unsafe_code)]
mod sys;
mod wire;

/// The decoders of bytes that come from peers, for the fuzz targets in `fuzz/` (feature
/// `fuzzing`; not a stable API). Each returns the re-encoding of what it decoded, so a target
/// can check that a decode is exact.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use crate::cuda_ipc::notif::FrameReader;
    use crate::cuda_ipc::{ConnInfo, Public};

    /// The longest first frame of a connection (the sender's hello).
    pub const MAX_HELLO: usize = crate::cuda_ipc::notif::MAX_HELLO;
    /// The longest notification.
    pub const MAX_NOTIF: usize = crate::cuda_ipc::notif::MAX_NOTIF;

    /// One frame of the notification stream.
    pub fn frame(b: &[u8]) -> Vec<u8> {
        crate::cuda_ipc::notif::frame(b)
    }

    /// A `CUDA_IPC` region's public metadata (VRAM IPC handle, shared host handle, private).
    pub fn region_md(b: &[u8]) -> Option<Vec<u8>> {
        Public::decode(b).ok().map(|p| p.encode())
    }

    /// A `CUDA_IPC` backend's connection info.
    pub fn conn_info(b: &[u8]) -> Option<Vec<u8>> {
        ConnInfo::decode(b).ok().map(|c| c.encode())
    }

    /// A CUDA IPC handle ([`crate::IpcHandle::from_bytes`]).
    pub fn ipc_handle(b: &[u8]) -> Option<Vec<u8>> {
        crate::IpcHandle::from_bytes(b).ok().map(|h| h.to_bytes())
    }

    /// A shared host buffer's handle ([`crate::SharedHostHandle::from_bytes`]).
    pub fn shared_handle(b: &[u8]) -> Option<Vec<u8>> {
        crate::SharedHostHandle::from_bytes(b)
            .ok()
            .map(|h| h.to_bytes())
    }

    /// The notification stream of one `CUDA_IPC` connection, fed in pieces.
    #[derive(Debug, Default)]
    pub struct Frames(FrameReader);

    impl Frames {
        /// Feeds bytes; the notifications they completed, or `None` when the peer broke the
        /// protocol. The first frame stands for the hello: any non-empty UTF-8 name is taken
        /// (the hello's own checks are fuzzed in nixl-core).
        pub fn feed(&mut self, bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
            let mut out = Vec::new();
            let name = |f: Vec<u8>| String::from_utf8(f).ok().filter(|s| !s.is_empty());
            self.0
                .feed(bytes, name, |s, m| out.push((s.to_owned(), m)))
                .then_some(out)
        }

        /// Bytes buffered and not yet part of a complete frame.
        pub fn buffered(&self) -> usize {
            self.0.buffered()
        }
    }
}

pub use cuda::device::DeviceBuffer;
pub use cuda::ipc::{DmaBuf, IpcHandle, IpcMapping};
/// The copy stream of the storage backends' bounce engine (nixl-backend-gds): not an
/// application type. The one CUDA stream type of the public API is cudarc's
/// (`cudarc::driver::CudaStream`, taken by [`cuda_ipc::gate_stream`]).
#[doc(hidden)]
pub use cuda::Stream;
pub use cuda::{
    device_count as cuda_device_count, is_available as cuda_is_available, Context, CudaError,
};
pub use cuda_ipc::{
    CudaIpcBackend, CudaIpcParams, CudaIpcPlugin, KernelSchedule, KernelShape, CUDA_IPC,
};
pub use error::{MemError, MemResult};
pub use host::{CudaHostBuffer, HostMemory, MmapBuffer, Pages, Pinned, HUGE_PAGE_2M};
pub use nixl_core::HostBuffer;
pub use shared::{SharedHostBuffer, SharedHostHandle, SharedHostMapping};
