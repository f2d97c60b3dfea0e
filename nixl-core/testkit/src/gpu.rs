//! GPU helpers (feature `gpu`).

pub use crate::{first_diff, hex, pattern, run_child, unhex};

/// The environment variable that tells a child GPU test process its role.
pub const ROLE: &str = "NIXL_MEM_TEST_ROLE";

/// Whether a CUDA GPU is usable here; reports the skip (see [`crate::skip`]) when not, and the
/// caller returns.
pub fn gpu(test: &str) -> bool {
    match nixl_mem::cuda::driver() {
        Ok(()) => true,
        Err(e) => {
            crate::skip(
                test,
                crate::Dep::Gpu,
                format!("no usable CUDA GPU here ({e})"),
            );
            false
        }
    }
}

/// Whether two CUDA GPUs are usable here; reports the skip (`gpu`, or `multi-gpu` with fewer
/// than two) when not, and the caller returns.
pub fn two_gpus(test: &str) -> bool {
    if !gpu(test) {
        return false;
    }
    match nixl_mem::cuda::device_count() {
        Ok(n) if n >= 2 => true,
        n => {
            crate::skip(
                test,
                crate::Dep::MultiGpu,
                format!("two GPUs needed, {n:?} visible"),
            );
            false
        }
    }
}
