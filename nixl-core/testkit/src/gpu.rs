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
