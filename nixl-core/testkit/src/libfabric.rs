//! libfabric helpers (feature `libfabric`).

use nixl_backend_libfabric::{library_status, LibfabricParams};
use nixl_core::{Agent, AgentConfig, Error};

use crate::{skip, Dep};

/// True (after reporting the skip, see [`crate::skip`]) when libfabric or the provider is
/// missing here, so the caller returns. Run `scripts/deps/libfabric.sh` to install what the
/// tests need; `efa` and other hardware providers count as [`Dep::Efa`].
pub fn skip_without_provider(provider: &str) -> bool {
    let test = std::thread::current()
        .name()
        .unwrap_or("libfabric test")
        .to_owned();
    if let Err(e) = library_status() {
        skip(
            &test,
            Dep::Libfabric,
            format!("libfabric is not loadable ({e}); run scripts/deps/libfabric.sh"),
        );
        return true;
    }
    let a = Agent::new("probe", AgentConfig::default()).expect("creating a probe agent");
    match a.create_backend(LibfabricParams::with_provider(provider)) {
        Ok(_) => false,
        Err(e @ Error::Unavailable { .. }) => {
            // tcp, shm and sockets come with libfabric here; anything else is hardware (EFA,
            // verbs) this machine may not have.
            let dep = match provider {
                "tcp" | "shm" | "sockets" => Dep::Libfabric,
                _ => Dep::Efa,
            };
            skip(&test, dep, format!("provider {provider} unavailable: {e}"));
            true
        }
        Err(e) => panic!("creating a {provider} backend failed: {e}"),
    }
}
