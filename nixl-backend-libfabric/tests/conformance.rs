//! The shared conformance suite, one test per case, on the tcp (one and two rails), shm and
//! sockets providers, in one process.

use std::sync::Arc;

use nixl_backend_libfabric::LibfabricParams;
use nixl_core::AgentConfig;
use nixl_testkit::conformance::Suite;

use nixl_testkit::libfabric as common;

fn suite(provider: &str, name: &str, params: LibfabricParams) -> Option<Suite> {
    if common::skip_without_provider(provider) {
        return None;
    }
    Some(Suite::new(
        name,
        AgentConfig::default(),
        Arc::new(move |a| a.create_backend(params.clone())),
    ))
}

fn tcp() -> Option<Suite> {
    suite("tcp", "lf-tcp", LibfabricParams::tcp_loopback(1))
}

fn tcp_two_rails() -> Option<Suite> {
    suite("tcp", "lf-tcp2", LibfabricParams::tcp_loopback(2))
}

fn shm() -> Option<Suite> {
    suite("shm", "lf-shm", LibfabricParams::with_provider("shm"))
}

fn sockets() -> Option<Suite> {
    suite(
        "sockets",
        "lf-sockets",
        (LibfabricParams::with_provider("sockets")).domains(vec!["lo".to_owned()]),
    )
}

mod conformance_tcp {
    nixl_testkit::conformance_tests!(super::tcp);
}

mod conformance_tcp_two_rails {
    nixl_testkit::conformance_tests!(super::tcp_two_rails);
}

mod conformance_shm {
    nixl_testkit::conformance_tests!(super::shm);
}

mod conformance_sockets {
    nixl_testkit::conformance_tests!(super::sockets);
}
