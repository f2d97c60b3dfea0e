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

pub mod cuda;
pub mod cuda_ipc;
#[cfg(feature = "gaudi")]
pub mod gaudi;
mod host;
#[cfg(feature = "rocm")]
pub mod rocm;
mod shared;
mod wire;

pub use cuda::device::DeviceBuffer;
pub use cuda::ipc::{DmaBuf, IpcHandle, IpcMapping};
pub use cuda::{device_count as cuda_device_count, is_available as cuda_is_available, CudaError};
pub use cuda_ipc::{
    CudaIpcBackend, CudaIpcParams, CudaIpcPlugin, KernelSchedule, KernelShape, CUDA_IPC,
};
pub use host::{CudaHostBuffer, HostMemory, MmapBuffer, Pages, Pinned, HUGE_PAGE_2M};
pub use nixl_core::HostBuffer;
pub use shared::{SharedHostBuffer, SharedHostHandle, SharedHostMapping};
