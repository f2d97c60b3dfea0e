//! Every call of this crate into native code, and the crate's only `unsafe` code blocks:
//! libc on file descriptors ([`fd`]), `pread`/`pwrite` and copies between registered memory
//! and the crate's own buffers ([`io`]), io_uring buffer registration and submission
//! ([`uring`]), and the raw-address operations of nixl-mem's CUDA layer (the bounce copies,
//! cuFile I/O: [`gpu`]). CUDA and cuFile themselves are called only by nixl-mem.
//!
//! The functions that take memory addresses (`u64`) are safe to call under one crate
//! invariant, which every caller upholds and names at the call: *each address range lies in
//! memory that stays alive, and for a destination is not otherwise accessed, until the
//! operation completes*. It holds for
//! - the local side of a transfer: nixl-core validated the descriptors against regions
//!   registered with the agent (whose `MemoryRegion` implementations promise the memory lives
//!   while registered), and the request holds those registrations and this backend's metadata
//!   until every chunk, I/O or batch entry it started has completed (cancel and drop wait for
//!   them, or leak);
//! - the staging buffers of the bounce engine: owned by the engine, each used by one worker at
//!   a time (the slot it holds).

pub(crate) mod fd;
#[cfg(feature = "posix")]
pub(crate) mod gpu;
#[cfg(any(feature = "posix", feature = "s3"))]
pub(crate) mod io;
#[cfg(feature = "posix")]
pub(crate) mod uring;
