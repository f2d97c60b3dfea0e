//! The shared conformance suite on the tcp and shm providers, in one process.

use std::sync::Arc;

use nixl_backend_libfabric::LibfabricParams;
use nixl_core::conformance::{assert_all, Suite};
use nixl_core::AgentConfig;

mod common;

fn suite(name: &str, params: LibfabricParams) -> Suite {
    Suite::new(
        name,
        AgentConfig::default(),
        Arc::new(move |a| a.create_backend(params.clone())),
    )
}

#[test]
fn conformance_tcp() {
    if common::skip_without_provider("tcp") {
        return;
    }
    assert_all(&suite("lf-tcp", LibfabricParams::tcp_loopback(1)));
}

#[test]
fn conformance_shm() {
    if common::skip_without_provider("shm") {
        return;
    }
    assert_all(&suite("lf-shm", LibfabricParams::with_provider("shm")));
}

#[test]
fn conformance_tcp_two_rails() {
    if common::skip_without_provider("tcp") {
        return;
    }
    assert_all(&suite("lf-tcp2", LibfabricParams::tcp_loopback(2)));
}

#[test]
fn conformance_sockets() {
    if common::skip_without_provider("sockets") {
        return;
    }
    assert_all(&suite(
        "lf-sockets",
        LibfabricParams {
            domains: vec!["lo".to_owned()],
            ..LibfabricParams::with_provider("sockets")
        },
    ));
}
