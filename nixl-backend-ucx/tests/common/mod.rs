//! Helpers shared by the UCX scenario tests.
#![allow(dead_code, unused_imports)]

use std::time::Duration;

use nixl_backend_ucx::{probe, UcxParams};
use nixl_core::{Agent, AgentConfig};

/// The transport selections the tests run with.
pub(crate) const TCP: &str = "tcp";
/// Shared memory between processes (and `self` for loopback).
pub(crate) const SHM: &str = "shm,cma,self";

/// Params for a transport selection.
pub(crate) fn params(tls: &str) -> UcxParams {
    UcxParams {
        transports: Some(tls.to_owned()),
        keepalive_interval: Some(Duration::from_millis(500)),
        cancel_timeout: Duration::from_secs(5),
        ..UcxParams::default()
    }
}

/// Whether UCX can be loaded; prints why not (tests then skip).
pub(crate) fn ucx_or_skip(test: &str) -> bool {
    match probe(&UcxParams::default()) {
        Ok((v, p)) => {
            eprintln!("{test}: using UCX {v} from {}", p.display());
            true
        }
        Err(e) => {
            nixl_testkit::skip(
                test,
                nixl_testkit::Dep::Ucx,
                format!("no usable UCX (run scripts/deps/ucx.sh): {e}"),
            );
            false
        }
    }
}

/// A config with the side channel and a progress thread.
pub(crate) fn config(listen: bool) -> AgentConfig {
    AgentConfig {
        listen,
        progress_thread: false,
        default_timeout: Duration::from_secs(20),
        ..AgentConfig::default()
    }
}

pub(crate) use nixl_testkit::unique;

/// An agent with a UCX backend.
pub(crate) fn agent(role: &str, tls: &str, listen: bool) -> nixl_core::Result<Agent> {
    let a = Agent::new(&unique(role), config(listen))?;
    a.create_backend(params(tls))?;
    Ok(a)
}

pub(crate) use nixl_testkit::host_buf as buf;
