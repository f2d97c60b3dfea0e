//! Helpers shared by nixl-core's scenario tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nixl_core::{Agent, AgentConfig, HostBuffer, InprocParams, Registration};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A unique agent name for parallel tests.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// An agent with the INPROC backend.
pub fn agent(prefix: &str) -> Agent {
    agent_with(prefix, AgentConfig::default())
}

/// An agent with the INPROC backend and a given config.
pub fn agent_with(prefix: &str, config: AgentConfig) -> Agent {
    let a = Agent::new(&unique(prefix), config).expect("agent");
    a.create_backend(InprocParams::default()).expect("backend");
    a
}

/// A registered buffer.
pub fn registered(a: &Agent, len: usize) -> (Arc<HostBuffer>, Registration) {
    let b = Arc::new(HostBuffer::new(len).expect("alloc"));
    let r = a.register_mem(vec![b.clone()], &[]).expect("register");
    (b, r)
}

/// Everything observable about an agent's state, to check that a refused call changed nothing.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    md: Vec<u8>,
    remotes: Vec<String>,
    generations: Vec<Option<u64>>,
    registered: u64,
}

pub fn snapshot(a: &Agent) -> Snapshot {
    let remotes = a.remotes();
    Snapshot {
        md: a.local_metadata().expect("md"),
        generations: remotes.iter().map(|r| a.remote_generation(r)).collect(),
        remotes,
        registered: a.telemetry().agent_memory_registered,
    }
}
