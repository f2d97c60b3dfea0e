//! Helpers shared by the scenario tests.
#![allow(dead_code)]

use nixl_backend_libfabric::{library_status, LibfabricParams};
use nixl_core::{Agent, AgentConfig, Error};

/// True (after printing why) when libfabric or the provider is missing here, so the caller
/// skips. Run `scripts/deps/libfabric.sh` to install what the tests need.
pub fn skip_without_provider(provider: &str) -> bool {
    if let Err(e) = library_status() {
        eprintln!("skipping: libfabric is not loadable ({e}); run scripts/deps/libfabric.sh");
        return true;
    }
    let a = match Agent::new("probe", AgentConfig::default()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("skipping: {e}");
            return true;
        }
    };
    match a.create_backend(LibfabricParams::with_provider(provider)) {
        Ok(_) => false,
        Err(e @ Error::Unavailable { .. }) => {
            eprintln!("skipping: provider {provider} unavailable: {e}");
            true
        }
        Err(e) => panic!("creating a {provider} backend failed: {e}"),
    }
}
