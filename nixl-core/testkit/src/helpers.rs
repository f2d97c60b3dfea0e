//! The helpers every crate's tests share: agent names, agents and buffers, snapshots of what a
//! refused call must leave unchanged, byte patterns and child test processes.

use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_core::{Agent, AgentConfig, HostBuffer, InprocParams, Registration};

/// A process-unique agent name (`{prefix}-{pid}-{n}`), for tests that run in parallel and for
/// agents of several processes on one side channel or etcd.
pub fn unique(prefix: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// An agent with the INPROC backend and the default config.
pub fn inproc_agent(prefix: &str) -> Agent {
    inproc_agent_with(prefix, AgentConfig::default())
}

/// An agent with the INPROC backend and `config`.
pub fn inproc_agent_with(prefix: &str, config: AgentConfig) -> Agent {
    let a = Agent::new(&unique(prefix), config).expect("agent");
    a.create_backend(InprocParams::default())
        .expect("INPROC backend");
    a
}

/// A zeroed host buffer of `len` bytes.
pub fn host_buf(len: usize) -> Arc<HostBuffer> {
    Arc::new(HostBuffer::new(len).expect("alloc"))
}

/// A host buffer of `len` bytes registered with `a`.
pub fn registered(a: &Agent, len: usize) -> (Arc<HostBuffer>, Registration) {
    let b = host_buf(len);
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

/// `a`'s observable state now: its metadata, the peers it knows and their generations, the
/// bytes it has registered.
pub fn snapshot(a: &Agent) -> Snapshot {
    let remotes = a.remotes();
    Snapshot {
        md: a.nixl().local_metadata().expect("metadata"),
        generations: remotes.iter().map(|r| a.remote_generation(r)).collect(),
        remotes,
        registered: a.telemetry().agent_memory_registered,
    }
}

/// Polls `f` every 20 ms until it holds or `within` passed; whether it held (checked once
/// more at the end).
pub fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// A deterministic byte pattern (xorshift from `seed`): different seeds, different bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The first offset where `a` and `b` differ (the shorter length when only their lengths do),
/// for failures that say where.
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// `b` as lower-case hex (to pass bytes to a child process in its environment).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of a [`hex`] string; panics on anything else.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// Runs this test binary's `#[ignore]`d test `name` alone in a child process with extra
/// environment, killed (and the calling test failed) past `timeout`.
pub fn run_child(name: &str, env: &[(&str, String)], timeout: Duration) -> ExitStatus {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn child");
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("wait child") {
            return st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child {name} ran past {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_seed_and_diffs_point_at_the_byte() {
        let a = pattern(1, 1000);
        assert_eq!(a, pattern(1, 1000));
        assert_ne!(a, pattern(2, 1000));
        let mut b = a.clone();
        b[777] ^= 1;
        assert_eq!(first_diff(&a, &b), Some(777));
        assert_eq!(first_diff(&a, &a), None);
        assert_eq!(first_diff(&a, &a[..10]), Some(10));
        assert_eq!(unhex(&hex(&a)), a);
        assert_ne!(unique("x"), unique("x"));
    }
}
