//! What the GPU tests share beyond the test kit: skipping without a GPU, the child role variable.
// Each test file uses a part.
#![allow(dead_code, unused_imports)]

pub(crate) use nixl_testkit::{first_diff, hex, pattern, run_child, unhex};

/// Whether the test can run; prints why not.
pub(crate) fn gpu(test: &str) -> bool {
    match nixl_mem::cuda::driver() {
        Ok(()) => true,
        Err(e) => {
            nixl_testkit::skip(
                test,
                nixl_testkit::Dep::Gpu,
                format!("no usable CUDA GPU here ({e})"),
            );
            false
        }
    }
}

/// The environment variable that tells a child test process its role.
pub(crate) const ROLE: &str = "NIXL_MEM_TEST_ROLE";
