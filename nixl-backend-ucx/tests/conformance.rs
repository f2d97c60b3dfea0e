//! The shared backend conformance suite, one test per case, on UCX over tcp and over shared
//! memory, in one process (the two-process scenarios are in `two_process.rs`). Cases a
//! capability excludes are reported as not applicable, naming it.

mod common;

use std::sync::Arc;

use nixl_core::conformance::Suite;
use nixl_core::AgentConfig;

fn suite(tls: &'static str, progress_thread: bool) -> Option<Suite> {
    if !common::ucx_or_skip("conformance") {
        return None;
    }
    let config = AgentConfig {
        progress_thread,
        ..AgentConfig::default()
    };
    let name = format!(
        "ucx-{}{}",
        tls.replace(',', "+"),
        if progress_thread { "-pt" } else { "" }
    );
    Some(Suite::new(
        &name,
        config,
        Arc::new(move |a| a.create_backend(common::params(tls))),
    ))
}

fn tcp() -> Option<Suite> {
    suite(common::TCP, false)
}

fn shm() -> Option<Suite> {
    suite(common::SHM, false)
}

fn tcp_with_agent_progress_thread() -> Option<Suite> {
    suite(common::TCP, true)
}

mod conformance_tcp {
    nixl_core::conformance_tests!(super::tcp);
}

mod conformance_shm {
    nixl_core::conformance_tests!(super::shm);
}

mod conformance_tcp_with_agent_progress_thread {
    nixl_core::conformance_tests!(super::tcp_with_agent_progress_thread);
}
