//! The shared backend conformance suite, on UCX over tcp and over shared memory, in one
//! process. (The two-process scenarios are in `two_process.rs`.)

mod common;

use std::sync::Arc;

use nixl_core::conformance::{run_all, Suite};
use nixl_core::AgentConfig;

fn suite(tls: &'static str, progress_thread: bool) -> Suite {
    let config = AgentConfig {
        progress_thread,
        ..AgentConfig::default()
    };
    Suite::new(
        &format!("ucx-{}", tls.replace(',', "+")),
        config,
        Arc::new(move |a| a.create_backend(common::params(tls))),
    )
}

fn run(tls: &'static str, progress_thread: bool) {
    if !common::ucx_or_skip("conformance") {
        return;
    }
    let results = run_all(&suite(tls, progress_thread));
    let mut failed = Vec::new();
    for (name, r) in &results {
        match r {
            Ok(()) => eprintln!("  ok   {name}"),
            Err(e) => {
                eprintln!("  FAIL {name}: {e}");
                failed.push(format!("{name}: {e}"));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "UCX_TLS={tls}: {} of {} cases failed:\n{}",
        failed.len(),
        results.len(),
        failed.join("\n")
    );
}

#[test]
fn conformance_tcp() {
    run(common::TCP, false);
}

#[test]
fn conformance_shm() {
    run(common::SHM, false);
}

#[test]
fn conformance_tcp_with_agent_progress_thread() {
    run(common::TCP, true);
}
