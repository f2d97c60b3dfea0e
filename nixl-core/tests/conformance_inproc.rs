//! The conformance suite against the in-process backend, with and without a progress thread.
#![cfg(feature = "conformance")]

use std::sync::Arc;

use nixl_core::conformance::{assert_all, Suite};
use nixl_core::{AgentConfig, InprocParams};

#[test]
fn inproc_passes_conformance() {
    assert_all(&Suite::new(
        "inproc",
        AgentConfig::default(),
        Arc::new(|a| a.create_backend(InprocParams::default())),
    ));
}

#[test]
fn inproc_passes_conformance_with_progress_thread() {
    let config = AgentConfig {
        progress_thread: true,
        ..AgentConfig::default()
    };
    assert_all(&Suite::new(
        "inproc-pt",
        config,
        Arc::new(|a| a.create_backend(InprocParams::default())),
    ));
}
