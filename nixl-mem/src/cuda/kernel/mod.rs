//! A scatter-gather copy kernel: one launch copies every segment of a request, where
//! `cuMemcpyBatchAsync` issues one copy per segment.
//!
//! The kernel is hand-written PTX (ISA 7.0 for `sm_70`, so the driver JIT-compiles it for the
//! GPU at hand; no CUDA toolkit is needed to build), generated from a [`KernelShape`] by
//! [`ptx`]. It takes a device array of descriptors `(src u64, dst u64, len u64)` and their
//! count. Each CTA grid-strides over the descriptors; in a descriptor whose source and
//! destination share their alignment modulo 16, threads `0..15` copy the head bytes up to the
//! first 16-byte boundary, all threads copy the body with 16-byte vector loads and stores
//! (`unroll` loads in flight per thread, then their stores), and threads `0..15` copy the
//! tail; other descriptors are copied byte by byte (correct but slow: the backend routes such
//! requests to the copy engines instead). A zero-length descriptor touches no memory (the
//! balanced schedule pads with them).
//!
//! The block kernel ([`ptx_blocks`]) is the same copy code over items generated on the device
//! from a block table (per layer: source and destination base and stride; per piece of the
//! ids: source id, destination id, offset, length), so a block-table request uploads
//! O(layers + ids) bytes instead of a descriptor per layer and block. Its item `i` is the
//! segment kernel's descriptor `i` of the same request, so CTAs get the same work.
//!
//! [`plan`] cuts the segments into descriptors of at most `chunk` bytes and picks the grid
//! ([`KernelSchedule`]); cuts fall on multiples of 16 bytes from a segment's start, which keeps each
//! piece's relative alignment. CTAs share no data, and no two descriptors may conflict (one's
//! destination overlapping another's source or destination): the GPU runs CTAs in any order,
//! so such bytes would be whatever the last writer left. [`conflict`] finds such requests on
//! the host; the backend copies them with in-order `cuMemcpyAsync` calls instead.

use std::ffi::CStr;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::{bind, CudaError};
use crate::sys::cu as sys;
use crate::sys::driver::device_attribute;
use crate::sys::module::KernelModule;
use crate::sys::stream::Stream;

/// Bytes per descriptor in the device array.
pub(crate) const DESC_BYTES: usize = 24;
/// The largest `gridDim.x`.
pub(super) const MAX_GRID: u64 = (1 << 31) - 1;

pub(super) const NAME: &CStr = c"nixl_copy_segments";
pub(super) const BLOCKS_NAME: &CStr = c"nixl_copy_blocks";
pub(super) const TILES_NAME: &CStr = c"nixl_copy_tiles";

mod code;
mod launch;
mod plan;
mod shape;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tile_tests;

pub(crate) use code::*;
pub(crate) use launch::*;
pub(crate) use plan::*;
#[cfg(test)]
use shape::BASE;
pub use shape::{KernelSchedule, KernelShape};
