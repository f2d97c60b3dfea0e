//! Every call of this crate into native code, and the crate's only `unsafe` code blocks.
//!
//! - [`driver`], [`memory`], [`stream`], [`module`], [`ipc`]: the CUDA driver through cudarc's
//!   generated, run-time-loaded bindings (`cudarc::driver::sys`). Every status goes through
//!   [`result::check`], the one place a `CUresult` becomes a typed
//!   [`CudaError`](crate::CudaError).
//! - [`cufile`] (feature `cufile`): GPUDirect Storage through cudarc's `cufile` bindings.
//! - [`host`]: libc (anonymous and shared mappings, memfd, `poll`) and the byte copies of
//!   [`HostMemory`](crate::HostMemory).
//! - `hip` (feature `rocm`) and `hlthunk` (feature `gaudi`): the other GPU libraries.
//!
//! Nothing here is called before the library behind it was found: the CUDA functions only run
//! after [`crate::cuda::driver`] checked that libcuda loads, has every symbol this crate names
//! ([`driver::SYMBOLS`]) and has a device (cudarc panics on a missing library or symbol);
//! cuFile's only after the same for libcufile.
//!
//! Two kinds of item:
//! - **Owning types** (`Stream`, `Event`, `DeviceAlloc`, `HostAlloc`, `HostRegistration`,
//!   `KernelModule`, `IpcOpen`, `Mapping`, cuFile's handles): each owns exactly one native
//!   handle, releases it on drop, keeps its context alive, and bounds-checks every access to
//!   the memory it owns. Their methods are safe in the ordinary sense.
//! - **Operations on addresses the caller names** (`u64` device or host addresses: copies
//!   between registrations, kernel launches, pinning a registered host range). The public
//!   ones are `unsafe fn`s with a `# Safety` section. The crate-private ones are safe
//!   functions that rely on one crate invariant, which every caller upholds and says so at the
//!   call: *each address range names memory that stays alive (and, for a destination, is not
//!   otherwise accessed) until the operation completes*: a buffer of this crate owned by the
//!   caller, or a region registered with the agent whose registration the calling request
//!   holds (nixl-core's `MemoryRegion` contract), for asynchronous work until the stream or
//!   event that carries it has completed.

pub(crate) mod driver;
pub(crate) mod host;
pub(crate) mod ipc;
pub(crate) mod memory;
pub(crate) mod module;
pub(crate) mod result;
pub(crate) mod stream;

#[cfg(feature = "cufile")]
pub(crate) mod cufile;
#[cfg(feature = "rocm")]
pub(crate) mod hip;
#[cfg(feature = "gaudi")]
pub(crate) mod hlthunk;

pub(crate) use cudarc::driver::sys as cu;
