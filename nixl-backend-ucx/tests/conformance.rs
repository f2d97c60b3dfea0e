//! The shared backend conformance suite, one test per case, on UCX over tcp and over shared
//! memory, in one process (the two-process scenarios are in `two_process.rs`). Cases a
//! capability excludes are reported as not applicable, naming it. Over shared memory host
//! copies are the backend's own direct CMA by default (in pieces on its copy threads, or
//! inside `post` without them); `shm_ucx_copies` runs the suite with UCX making them.

use nixl_testkit::ucx as common;

use std::sync::Arc;

use nixl_backend_ucx::UcxParams;
use nixl_core::AgentConfig;
use nixl_testkit::conformance::Suite;

fn suite(tls: &'static str, progress_thread: bool) -> Option<Suite> {
    // The suite's agents share one process: direct CMA between them needs the opt-in.
    suite_with(tls, progress_thread, "", |p| {
        p.direct_cma_same_process(true)
    })
}

fn suite_with(
    tls: &'static str,
    progress_thread: bool,
    tag: &str,
    tweak: fn(UcxParams) -> UcxParams,
) -> Option<Suite> {
    if !common::ucx_or_skip("conformance") {
        return None;
    }
    let config = AgentConfig::default().progress_thread(progress_thread);
    let name = format!(
        "ucx-{}{}{tag}",
        tls.replace(',', "+"),
        if progress_thread { "-pt" } else { "" }
    );
    Some(Suite::new(
        &name,
        config,
        Arc::new(move |a| a.create_backend(tweak(common::params(tls)))),
    ))
}

fn tcp() -> Option<Suite> {
    suite(common::TCP, false)
}

fn shm() -> Option<Suite> {
    suite(common::SHM, false)
}

fn shm_ucx_copies() -> Option<Suite> {
    suite_with(common::SHM, false, "-ucx-copies", |p| p.direct_cma(false))
}

fn shm_direct_inside_post() -> Option<Suite> {
    suite_with(common::SHM, false, "-direct-inline", |p| {
        p.direct_cma(true)
            .cma_threads(0)
            .direct_cma_same_process(true)
    })
}

fn tcp_with_agent_progress_thread() -> Option<Suite> {
    suite(common::TCP, true)
}

mod conformance_tcp {
    nixl_testkit::conformance_tests!(super::tcp);
}

mod conformance_shm {
    nixl_testkit::conformance_tests!(super::shm);
}

mod conformance_shm_ucx_copies {
    nixl_testkit::conformance_tests!(super::shm_ucx_copies);
}

mod conformance_shm_direct_inside_post {
    nixl_testkit::conformance_tests!(super::shm_direct_inside_post);
}

mod conformance_tcp_with_agent_progress_thread {
    nixl_testkit::conformance_tests!(super::tcp_with_agent_progress_thread);
}
