//! UCX helpers (feature `ucx`): the transport selections the tests run with, params with fast
//! peer-failure detection, the skip without a usable UCX, agents; [`target`] is the
//! two-process target of the failure-semantics and stress tests, [`hostile`] the victim of the
//! hostile-peer tests, [`nixl_peer`] a stock NIXL agent (the PyPI wheel's Python API) in a child
//! process.

pub mod hostile;
pub mod nixl_peer;
pub mod target;

use std::time::Duration;

use nixl_backend_ucx::{probe, UcxParams};
use nixl_core::{Agent, AgentConfig};

pub use crate::{host_buf as buf, unique};

/// TCP between processes.
pub const TCP: &str = "tcp";
/// Shared memory between processes (and `self` for loopback).
pub const SHM: &str = "shm,cma,self";

/// UCX params for a transport selection: peer-failure detection within half a second, cancel
/// bounded at 5 s.
pub fn params(tls: &str) -> UcxParams {
    UcxParams::default()
        .transports(tls.to_owned())
        .keepalive_interval(Duration::from_millis(500))
        .cancel_timeout(Duration::from_secs(5))
}

/// Whether UCX can be loaded; reports the skip (see [`crate::skip`]) when not, and the caller
/// returns.
pub fn ucx_or_skip(test: &str) -> bool {
    match probe(&UcxParams::default()) {
        Ok((v, p)) => {
            eprintln!("{test}: using UCX {v} from {}", p.display());
            true
        }
        Err(e) => {
            crate::skip(
                test,
                crate::Dep::Ucx,
                format!("no usable UCX (run scripts/deps/ucx.sh): {e}"),
            );
            false
        }
    }
}

/// Agent config: the side channel on 127.0.0.1 port 0 when `listen`, no agent progress thread
/// (UCX runs its own), a 20 s default deadline.
pub fn config(listen: bool) -> AgentConfig {
    AgentConfig::default()
        .listen(listen)
        .progress_thread(false)
        .default_timeout(Duration::from_secs(20))
}

/// An agent (unique name from `role`) with a UCX backend over `tls`.
pub fn agent(role: &str, tls: &str, listen: bool) -> nixl_core::Result<Agent> {
    let a = Agent::new(&unique(role), config(listen))?;
    a.create_backend(params(tls))?;
    Ok(a)
}
